"""Data-parallel training: which rank's local gradients went non-finite before the reduction.

DDP averages the gradients of every rank in its backward pass, so a NaN born on one rank is on
every rank's ``.grad`` when backward returns. gradsan registers a DDP communication hook that
looks at each bucket *before* its all-reduce (one ``isfinite`` and one ``argmin`` per bucket,
no synchronisation; then the default all-reduce, or the hook the user registered through
``register_comm_hook`` after gradsan's). When a check fails, the ranks compare notes through
the process group's store, with a timeout (never a collective, so a rank that does not take
part cannot hang the others):

- the rank whose local gradients were non-finite replays its step alone, DDP's all-reduce
  left out, and reports the op, the line and the parameter;
- the other ranks say the NaN/Inf arrived through the all-reduce from rank k, and which
  parameter of rank k was hit, without a replay.

FSDP2 (``fully_shard``, under ``gradsan run``): each unit's reduce-scatter is wrapped the
same way (one ``isfinite`` over the unit's local gradients), and the check after backward
reads the sharded parameters' gradients (FSDP frees the unsharded parameters its autograd
graph ends at). guard on FSDP2 modules compares notes the same way but does not replay the
step (its all-gathers would wait for the other ranks, and a DTensor's finiteness check is a
collective): it says which rank made the NaN and points to ``gradsan run``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import weakref
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT_S = float(os.environ.get("GRADSAN_DIST_TIMEOUT", "20"))

_DDP: Any = torch.nn.parallel.DistributedDataParallel


@dataclasses.dataclass(eq=False)
class _State:
    """One DDP module's hook state: its local, pre-reduction check per bucket."""

    ddp: Any  # weakref to the DDP module
    ident: int  # attach order: the same on every rank
    group: Any
    inner: Any = None  # (hook, state) the user registered after gradsan's, else None
    backwards: int = 0  # backward passes seen (bucket 0 once each): lockstep across ranks
    # bucket index -> (parameters, element counts, ok-at-first tensor, first index tensor)
    buckets: dict[int, tuple] = dataclasses.field(default_factory=dict)

    def local_bad(self) -> list[torch.Tensor]:
        """The parameters whose local gradient was non-finite before the all-reduce (the first
        such parameter of each bucket)."""
        out = []
        for params, sizes, ok, first in self.buckets.values():
            if bool(ok.item()):
                continue
            i, pos = int(first.item()), 0
            for p, n in zip(params, sizes):
                if pos <= i < pos + n:
                    out.append(p)
                    break
                pos += n
        return out

    def local_bad_names(self, name: Callable[[torch.Tensor], str]) -> list[str]:
        return [name(p) for p in self.local_bad()]


_STATES: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()
_COUNT = [0]


def _check_hook(state: _State, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    if bucket.index() == 0:
        state.backwards += 1
        state.buckets.clear()
    if buf.numel() and (buf.is_floating_point() or buf.is_complex()):
        ok = torch.isfinite(buf)
        first = torch.argmin(ok.view(torch.uint8))  # the first non-finite element, 0 if none
        sizes = [g.numel() for g in bucket.gradients()]
        state.buckets[bucket.index()] = (bucket.parameters(), sizes, ok[first], first)
    if state.inner is not None:
        hook, hook_state = state.inner
        return hook(hook_state, bucket)
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook(state.group, bucket)


_check_hook.__annotations__ = {}  # DDP checks the annotations; these are strings here


def attach(ddp: Any) -> _State | None:
    """Register gradsan's check as ``ddp``'s comm hook (once). None when DDP already has a
    hook of its own (DDP takes one): then the local check is not possible."""
    st = _STATES.get(ddp)
    if st is not None:
        return st
    if getattr(ddp, "_comm_hooks", None) or getattr(ddp, "_gradsan_no_hook", False):
        return None
    _COUNT[0] += 1
    st = _State(weakref.ref(ddp), _COUNT[0], ddp.process_group)
    try:
        ddp.register_comm_hook(st, _check_hook)
    except RuntimeError:  # a built-in comm hook is registered already
        ddp._gradsan_no_hook = True
        return None
    _STATES[ddp] = st
    return st


def attach_in(modules: list[tuple[Any, str]]) -> None:
    """guard: attach to the DDP modules and the FSDP2 units among the step's modules."""
    for m, _ in modules:
        if isinstance(m, _DDP):
            attach(m)
        for g in _fsdp_groups(m):
            _watch_group(g)


def states_of(modules: list[tuple[Any, str]] | None = None) -> list[_State]:
    if modules is None:
        return [s for s in _STATES.values() if s.ddp() is not None]
    return [s for s in (_STATES.get(m) for m, _ in modules) if s is not None]


# ---- FSDP2 ---------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _FsdpState:
    """One FSDP2 parameter group (a ``fully_shard`` unit): its local, pre-reduce-scatter check."""

    group: Any  # weakref to the FSDPParamGroup
    ident: int
    backwards: int = 0  # reduce-scatters seen: lockstep across ranks
    ok: Any = None  # tensor: the last local input was finite

    def local_bad_names(self, name: Callable[[torch.Tensor], str]) -> list[str]:
        g = self.group()
        if g is None or self.ok is None or bool(self.ok.item()):
            return []
        out = []
        for fp in g.fsdp_params:
            n = name(fp.sharded_param)
            out.append(fp._param_fqn or n if n.startswith("tensor of shape") else n)
        return out


_FSDP: list[_FsdpState] = []


def _checked_reduce_scatter(inner: Any, st: _FsdpState) -> Any:
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    class Checked(ReduceScatter):
        """The group's reduce-scatter, after a look at this rank's local gradients."""

        def allocate(self, *args: Any, **kwargs: Any) -> Any:
            return inner.allocate(*args, **kwargs)

        def __call__(
            self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False
        ) -> Any:
            st.backwards += 1
            if input_tensor.is_floating_point() and input_tensor.numel():
                st.ok = torch.isfinite(input_tensor).all()
            return inner(output_tensor, input_tensor, group, op, async_op)

    return Checked()


def _fsdp_group_cls() -> Any:
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:  # pragma: no cover - another torch
        return None
    return FSDPParamGroup


def watch_fsdp(setter: Callable[[Any, str, Any], None]) -> None:
    """Wrap each new FSDP2 parameter group's reduce-scatter with the local check."""
    cls = _fsdp_group_cls()
    if cls is None:
        return
    orig_init = cls.__init__

    def __init__(group: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(group, *args, **kwargs)
        _watch_group(group)

    setter(cls, "__init__", __init__)


def _watch_group(group: Any) -> _FsdpState:
    st = getattr(group, "_gradsan_state", None)
    if st is None:
        st = _FsdpState(weakref.ref(group), len(_FSDP) + 1)
        group._reduce_scatter_comm = _checked_reduce_scatter(group._reduce_scatter_comm, st)
        group._gradsan_state = st
        _FSDP.append(st)
    return st


def _fsdp_groups(module: Any) -> list[Any]:
    """The FSDP2 parameter groups of ``module`` and its submodules."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - another torch
        return []
    out: list[Any] = []
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            state = sub._get_fsdp_state()
            out += [g for g in getattr(state, "_fsdp_param_groups", ()) if g not in out]
    return out


def real_leaves(leaves: list) -> list:
    """FSDP2's autograd graph ends at the unsharded parameters, which it frees after the
    reduce-scatter: check (and name) the sharded parameters that hold the gradients."""
    if not _FSDP:
        return leaves
    real: dict[int, Any] = {}
    for st in _FSDP:
        g = st.group()
        for fp in g.fsdp_params if g is not None else ():
            u = getattr(fp, "_unsharded_param", None)
            if u is not None:
                real[id(u)] = fp.sharded_param
    out, seen = [], set()
    for t in leaves:
        r = real.get(id(t), t)
        if id(r) not in seen:
            seen.add(id(r))
            out.append(r)
    return out


# ---- comparing notes across ranks -------------------------------------------------------------


@dataclasses.dataclass
class Verdict:
    """What the ranks said about one non-finite backward."""

    rank: int
    world: int
    mine: list[str]  # this rank's parameters with non-finite local gradients
    others: dict[int, list[str] | None]  # rank -> its list; None: no answer in time
    comm: str = "DDP's all-reduce"  # or "FSDP's reduce-scatter"
    # DDP names the first non-finite gradient of each bucket; FSDP the parameters of the unit
    which: str = "first"
    tag: str = ""  # the store keys' prefix of this exchange

    @property
    def local(self) -> bool:
        return bool(self.mine)

    @property
    def sources(self) -> list[int]:
        return sorted(k for k, v in self.others.items() if v)

    def notes(self) -> list[str]:
        who = f"rank {self.rank} of {self.world}"
        silent = sorted(k for k, v in self.others.items() if v is None)
        out = []
        if self.local:
            names = _names(self.mine)
            text = (
                f"{who}: this rank's own local gradients were non-finite before {self.comm} "
                f"({self.which} {names}), which carried them to every rank"
            )
            if self.sources:
                text += f"; rank(s) {', '.join(map(str, self.sources))} had non-finite ones too"
            out.append(text)
        elif self.sources:
            k = self.sources[0]
            out.append(
                f"{who}: this rank's own gradients were finite before {self.comm}; the NaN/Inf "
                f"arrived through it from rank {k} (its local gradients were non-finite, "
                f"{self.which} {_names(self.others[k] or [])}): rank {k}'s report says where it "
                "was born"
            )
        elif not silent:
            out.append(
                f"{who}: no rank's local gradients were non-finite before {self.comm}: the "
                "reduction itself (an overflow in the sum, or a comm hook) made the NaN/Inf"
            )
        if silent:
            out.append(
                f"rank(s) {', '.join(map(str, silent))} did not report within {TIMEOUT_S:g} s "
                "(no NaN there, or stopped elsewhere)"
            )
        return out

    def headline(self) -> str:
        """The op to name on a rank that only received the NaN."""
        op = "FSDP reduce-scatter" if self.comm.startswith("FSDP") else "DDP all-reduce"
        if self.sources:
            return f"{op} (from rank {self.sources[0]})"
        return op


def _names(names: list[str]) -> str:
    s = ", ".join(f"`{n}`" for n in names[:3])
    return s + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _store() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def exchange(states: list[Any], name: Callable[[torch.Tensor], str]) -> Verdict | None:
    """Tell the other ranks which local gradients of this rank were non-finite, and hear
    theirs (through the store, each wait bounded by ``TIMEOUT_S``). None when no DDP module
    with gradsan's hook ran a backward."""
    states = [s for s in states if s.backwards]
    if not states or not dist.is_initialized():
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [n for s in states for n in s.local_bad_names(name)]
    tag = "gradsan/" + "/".join(f"{s.ident}.{s.backwards}" for s in states)
    others: dict[int, list[str] | None] = {}
    try:
        store = _store()
        store.set(f"{tag}/{rank}", json.dumps(mine))
        for k in range(world):
            if k == rank:
                continue
            try:
                store.wait([f"{tag}/{k}"], timedelta(seconds=TIMEOUT_S))
                others[k] = json.loads(store.get(f"{tag}/{k}"))
            except (RuntimeError, ValueError, dist.DistError):
                others[k] = None
    except (RuntimeError, ValueError, dist.DistError):
        others = {k: None for k in range(world) if k != rank}
    if all(isinstance(s, _FsdpState) for s in states):
        return Verdict(rank, world, mine, others, "FSDP's reduce-scatter", "in", tag)
    return Verdict(rank, world, mine, others, tag=tag)


def remote_report(verdict: Verdict, hits: list, where: Any, function: str) -> Any:
    """The report of a rank that only received the NaN: the op is the all-reduce, at the
    user's backward line; no replay (this rank's own step was finite)."""
    from .._report import Finding, Report
    from ._explain import BACKEND

    report = Report(backend=BACKEND, function=function)
    report.findings.append(
        Finding(
            kind="nonfinite",
            catalog_id=None,
            phase="gradient",
            primitive=verdict.headline(),
            where=where,
            result="nan" if any(h.nan for h in hits) else "inf",
            outputs=hits,
        )
    )
    report.notes.extend(verdict.notes())
    return report


# ---- a rank replayed alone -------------------------------------------------------------------


@contextlib.contextmanager
def local_replay() -> Iterator[None]:
    """DDP's forward runs the wrapped module directly: no broadcast, no all-reduce (the other
    ranks are not replaying), so ``.grad`` holds this rank's local gradients."""
    orig = _DDP.forward

    def forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    _DDP.forward = forward
    try:
        yield
    finally:
        _DDP.forward = orig


# ---- gradsan run --------------------------------------------------------------------------------


class RunDist:
    """`gradsan run`'s DDP support. In the script: attach the check at each DDP module's
    first forward; on a failure, compare notes and name the rank. In the re-run child of one
    rank: a process group of one (the rank and world size the script asked for are what
    ``dist.get_rank()``/``get_world_size()`` say) and DDP's forward without its all-reduce."""

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks
        self.rank: int | None = None
        self.world: int | None = None

    def install(self) -> RunDist:
        hooks = self.hooks
        watch_fsdp(hooks.set)
        if hooks.replay_step is not None:
            self._install_child()
        else:
            orig_forward = _DDP.forward

            def forward(ddp: Any, *inputs: Any, **kwargs: Any) -> Any:
                if ddp not in _STATES and not getattr(ddp, "_gradsan_no_hook", False):
                    attach(ddp)
                return orig_forward(ddp, *inputs, **kwargs)

            forward.__wrapped__ = orig_forward  # type: ignore[attr-defined]
            hooks.set(_DDP, "forward", forward)
            orig_register = _DDP.register_comm_hook

            def register_comm_hook(ddp: Any, state: Any, hook: Any) -> None:
                st = _STATES.get(ddp)
                if st is None or st.inner is not None:
                    return orig_register(ddp, state, hook)
                ddp._check_comm_hook(hook)
                st.inner = (hook, state)  # gradsan's check runs first, then the user's hook
                return None

            hooks.set(_DDP, "register_comm_hook", register_comm_hook)
        hooks.annotate_failures(self.annotate)
        return self

    def _install_child(self) -> None:
        hooks = self.hooks
        orig_init = dist.init_process_group
        run = self

        def init_process_group(*args: Any, **kwargs: Any) -> None:
            run.rank = int(kwargs.get("rank", -1) if len(args) < 5 else args[4])
            run.world = int(kwargs.get("world_size", -1) if len(args) < 4 else args[3])
            if run.rank < 0:
                run.rank = int(os.environ.get("RANK", "0"))
            if run.world < 0:
                run.world = int(os.environ.get("WORLD_SIZE", "1"))
            backend = kwargs.get("backend", args[0] if args else None) or "gloo"
            orig_init(backend, store=dist.HashStore(), rank=0, world_size=1)

        def get_rank(group: Any = None) -> int:
            return run.rank if run.rank is not None and group is None else orig_rank(group)

        def get_world_size(group: Any = None) -> int:
            return run.world if run.world is not None and group is None else orig_world(group)

        orig_rank, orig_world = dist.get_rank, dist.get_world_size
        hooks.set(dist, "init_process_group", init_process_group)
        hooks.set(dist, "get_rank", get_rank)
        hooks.set(dist, "get_world_size", get_world_size)

        def forward(ddp: Any, *inputs: Any, **kwargs: Any) -> Any:
            return ddp.module(*inputs, **kwargs)

        hooks.set(_DDP, "forward", forward)

    def annotate(self, f: Any) -> None:
        """Name the rank; a rank that only received the NaN reports the all-reduce and skips
        the re-run."""
        if f.backend != "torch":
            return
        if self.hooks.replay_step is not None:  # the re-run child of one rank
            if self.rank is not None and f.report is not None:
                f.report.notes.append(
                    f"rank {self.rank} of {self.world}, re-run alone (a process group of one, "
                    "DDP's all-reduce left out): these are this rank's local gradients"
                )
            return
        states = states_of() + [st for st in _FSDP if st.group() is not None]
        if not states:
            return
        import sys

        from .._run._patch_torch import _namer_for
        from ._amp import _user_frame
        from ._source import frame_of

        frame = _user_frame(sys._getframe(1))
        namer = _namer_for(frame)
        verdict = exchange(states, namer.name)
        if verdict is None:
            return
        f.label = f"on rank {verdict.rank}, {f.label}"
        if verdict.local or f.report is None:
            if f.report is not None:
                f.report.notes.extend(verdict.notes())
            return
        hits = [h for fd in f.report.findings for h in fd.outputs]
        where = frame_of(frame) if frame is not None else None
        f.report = remote_report(verdict, hits, where, f.report.function)
        f.traced = True  # the report is complete: this rank's own step was finite


# ---- guard ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class GuardPlan:
    """What guard's replay does on this rank."""

    notes: list[str] = dataclasses.field(default_factory=list)
    # FSDP2: every rank replays the step together (its all-gathers and reduce-scatters need
    # them all), and gradsan checks only local shards (a DTensor's check is a collective)
    together: bool = False
    remote: Any = None  # a rank that only received the NaN: its report, raised after the replay


def guard_verdict(modules: list[tuple[Any, str]], watched: list[torch.Tensor]) -> GuardPlan:
    """guard, before it replays a failed step of a DDP or FSDP2 module: compare notes with the
    other ranks. DDP: a rank that only received the NaN raises its report here (no replay: a
    replay through DDP's all-reduce would wait for the other ranks); the rank that made it
    replays without DDP's all-reduce. FSDP2: when every rank failed at this step and they agree
    to, every rank replays it together; the rank that made the NaN reports the op and line,
    the others what arrived through the reduce-scatter."""
    groups = [g for m, _ in modules for g in _fsdp_groups(m)]
    fsdp = [g._gradsan_state for g in groups if getattr(g, "_gradsan_state", None) is not None]
    states = states_of(modules) + fsdp
    if not states:
        return GuardPlan()
    from .._errors import NonFiniteError
    from ._explain import Namer, output_hit
    from ._mode import all_finite
    from ._source import user_frame

    namer = Namer()
    namer.add_modules(modules)
    verdict = exchange(states, namer.name)
    if verdict is None:
        return GuardPlan()
    if verdict.local and not groups:
        return GuardPlan(
            [*verdict.notes(), "the replay ran without DDP's all-reduce (this rank alone)"]
        )
    hits = [
        output_hit(namer.name(p), g)
        for p, g in ((p, _local(p.grad)) for p in watched if p.grad is not None)
        if not all_finite(g)
    ]
    report = remote_report(verdict, hits, user_frame(3), "step")
    if not groups:
        raise NonFiniteError(report)
    if _agree(verdict, all(v is not None for v in verdict.others.values())):
        if not verdict.local:
            return GuardPlan(together=True, remote=report)
        return GuardPlan(
            [
                *verdict.notes(),
                f"every rank replayed this step together (FSDP2's all-gathers and "
                f"reduce-scatters need all {verdict.world}); gradsan checked this rank's local "
                "shards only",
            ],
            together=True,
        )
    if verdict.local:
        report.findings[0].primitive = f"this rank's backward (rank {verdict.rank}, not replayed)"
        report.notes.append(
            "guard did not replay this step of FSDP2-sharded modules: not every rank stopped at "
            "it (its all-gathers would wait for them); run the script under `gradsan run`, which "
            "re-runs this rank alone, for the operation and line"
        )
    raise NonFiniteError(report)


def _agree(verdict: Verdict, ok: bool) -> bool:
    """Every rank says whether it heard all the others; all replay only if all did."""
    key = f"{verdict.tag}/replay"
    try:
        store = _store()
        store.set(f"{key}/{verdict.rank}", "1" if ok else "0")
        for k in range(verdict.world):
            if k == verdict.rank:
                continue
            store.wait([f"{key}/{k}"], timedelta(seconds=TIMEOUT_S))
            if store.get(f"{key}/{k}") != b"1":
                return False
    except (RuntimeError, ValueError, dist.DistError):
        return False
    return ok


def fsdp_outputs(tracer: Any, modules: list[tuple[Any, str]], namer: Any) -> list[torch.Tensor]:
    """The source rank of a replay of FSDP2 modules: FSDP frees the gradients of the unsharded
    parameters the backward wrote; the non-finite local shards of the sharded gradients (what
    the reduce-scatter made of them), as leaves linked to the NaNs born in this backward."""
    from ._mode import Event, all_finite, key

    births: list[Any] = [e for e in tracer.events.values() if e.phase == "backward" and e.nan_new]
    if not births:  # born in the forward: the gradients came from the non-finite loss
        births = [tracer.producer_of(t) for t in tracer.losses if not all_finite(t.detach())]
        births = [b for b in births if b is not None]
    out = []
    for g in (g for m, _ in modules for g in _fsdp_groups(m)):
        for fp in g.fsdp_params:
            p = fp.sharded_param
            grad = _local(p.grad) if p.grad is not None else None
            if grad is None or not grad.is_floating_point() or all_finite(grad):
                continue
            proxy = grad.new_zeros(()).expand(grad.shape)  # a leaf whose .grad is the shard's
            proxy.grad = grad
            namer.names[id(proxy)] = namer.name(p)
            if births:
                nan = bool(torch.isnan(grad).any())
                tracer.events[key(grad)] = Event(
                    "backward", "aten.add", None, None, grad, [(b.out, b) for b in births], nan=nan
                )
            out.append(proxy)
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a check of the DTensor itself would be a collective)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t
