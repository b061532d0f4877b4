"""`gradsan.torch.guard`: one fused finiteness check per step; on failure, replay the step
eagerly under the tracer and raise NonFiniteError with the explanation."""

from __future__ import annotations

import cmath
import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .._errors import NonFiniteError, UsageError
from .._events import Origin
from .._report import Finding, Report
from .._report._build import build
from . import _accum, _amp, _compat, _distributed, _replay, _untilborn
from ._explain import BACKEND, Namer, _Session, check_callable, check_modules, output_hit
from ._func import GradCheck
from ._mode import all_finite, tensors_in


class _Abort(BaseException):
    """Raised from an optimizer's step pre-hook to stop a non-finite update."""


def _grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [g for p in params if (g := p.grad) is not None and g.is_floating_point()]


# The check on CPU. Gradients of at most _SMALL elements, when there are _FUSE_MIN or more of
# them (else one sum each): one call of the kernel GradScaler unscales with
# (``torch._amp_foreach_non_finite_check_and_unscale_``) over all of them, with an
# inverse scale of exactly 1: one dispatch for every tensor and an exact isfinite per element
# (no sum that can overflow). With a scale of 1 the kernel writes each value back unchanged
# (bit for bit: NaN payloads, -0.0, subnormals under flush-denormal; no version bump, no
# autograd history; tested), as GradScaler.unscale_ does with its own scale on every
# mixed-precision step. Larger gradients: a sum each (a read, no write back: on a large tensor
# cheaper than the kernel's read and write; a non-finite sum is confirmed exactly). What the
# kernel does not take (complex, a stride-0 expanded tensor) is summed too (_sums: small ones
# flattened together per dtype). On other devices one fused ``_foreach_norm`` per device and
# dtype and one sync per device.
_SMALL = 4096
_STACK = 1 << 20
# Measured cold (right after a backward, 2 threads, a quiet machine): the fused kernel costs
# ~85 us for up to ~32 small tensors, one sum and read each ~45 us plus ~4 us a tensor: the
# kernel pays from about a dozen small tensors on (64: 139 us against 348 us)
_FUSE_MIN = 12
_strided = torch.strided
_HALF = (torch.float16, torch.bfloat16)
_ONE = torch.ones(())  # the inverse scale: 1.0 (float32, as the kernel takes it)
_fused_check = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)


def _cpu_fused(grads: list[torch.Tensor]) -> bool | None:
    """True/False: whether every element of the dense real CPU ``grads`` is finite; None
    where the fused kernel refused them (the caller sums them instead)."""
    if _fused_check is None:  # pragma: no cover - another torch
        return None
    found = torch.zeros(())
    try:
        _fused_check(grads, found, _ONE)  # (below autograd: no graph, no version bump)
    except (RuntimeError, TypeError, NotImplementedError):
        return None
    return not found.item()


def _sums(
    grads: list[torch.Tensor],
) -> tuple[list[torch.Tensor], dict[Any, tuple[set, list[torch.Tensor]]]]:
    """The 0-d CPU partial sums, and per other device the dtypes and the 0-d tensors, one
    per group of ``grads``: each non-finite if an element of its group is (or if it
    overflowed). On CPU, gradients of at most _SMALL elements are flattened together per
    dtype (at most _STACK elements at a time), larger ones summed one by one."""
    cpu: list[torch.Tensor] = []
    small: dict[Any, list[torch.Tensor]] = {}
    rest: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        if g.layout != _strided:  # a sparse gradient (nn.Embedding(sparse=True)): its values
            g = _values(g)
        if type(g) is torch.Tensor and g.is_cpu:
            if g.numel() <= _SMALL:
                small.setdefault(g.dtype, []).append(g)
            else:
                cpu.append(g.sum(dtype=torch.float32) if g.dtype in _HALF else g.sum())
        else:
            rest.setdefault((g.device, g.dtype), []).append(g)
    for dt, group in small.items():
        acc = torch.float32 if dt in _HALF else None
        if len(group) < _FUSE_MIN:  # a few: one sum each is cheaper than a copy and a sum
            cpu += [g.sum(dtype=acc) for g in group]
            continue
        chunk: list[torch.Tensor] = []
        n = 0
        for g in group:
            k = g.numel()
            if chunk and n + k > _STACK:
                cpu.append(_compat.flatten_dense(chunk).sum(dtype=acc))
                chunk, n = [], 0
            chunk.append(g)
            n += k
        cpu.append(_compat.flatten_dense(chunk).sum(dtype=acc))
    out: dict[Any, tuple[set, list[torch.Tensor]]] = {}
    for (dev, dt), gs in rest.items():  # one fused kernel (on CPU it loops over the tensors)
        dts, ts = out.setdefault(dev, (set(), []))
        dts.add(dt)
        ts += _compat.foreach_norm(gs)
    return cpu, out


def _summed_finite(grads: list[torch.Tensor]) -> bool:
    """Whether the sums of ``grads`` are finite (False may be an overflow: confirm it)."""
    cpu, other = _sums(grads)
    for t in cpu:
        if not _finite_number(t.item()):
            return False
    for dts, ts in other.values():
        if len(dts) > 1:
            ts = [t.to(torch.complex128 if t.is_complex() else torch.float64) for t in ts]
        total = ts[0] if len(ts) == 1 else torch.stack(ts).sum()
        if not _finite_number(total.item()):
            return False
    return True


_REAL = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def finite(grads: list[torch.Tensor], extra: list[torch.Tensor] = ()) -> bool:  # type: ignore[assignment]
    """The fast path: whether every element of the gradients (and of the loss) is finite
    (see above: small dense real CPU gradients in one exact fused check, the others summed,
    a non-finite sum confirmed exactly since a sum of large finite values can overflow)."""
    ok = True
    if grads:
        small: list[torch.Tensor] = []
        others: list[torch.Tensor] = []
        for g in grads:
            if (
                type(g) is torch.Tensor
                and g.layout == _strided
                and g.is_cpu
                and g.dtype in _REAL
                and g.numel() <= _SMALL
            ):
                small.append(g)
            else:
                others.append(g)
        if len(small) >= _FUSE_MIN:
            verdict = _cpu_fused(small)
            if verdict is False:
                return False  # exact: nothing to confirm
            if verdict is None:
                others += small
        else:
            others += small
        if others:
            ok = _summed_finite(others)
    if ok:
        for e in extra:
            if e.numel() == 1:
                if not _finite_number(e.item()):
                    ok = False
                    break
            elif not all_finite(e.detach()):
                ok = False
                break
    if ok:
        return True
    # the sums can overflow on large finite values: confirm exactly before replaying
    return all(all_finite(_values(g)) for g in grads) and all(all_finite(e.detach()) for e in extra)


def _values(g: torch.Tensor) -> torch.Tensor:
    if g.layout == _strided:
        return g
    return g.coalesce().values() if g.layout == torch.sparse_coo else g.values()


def _finite_number(v: Any) -> bool:
    return cmath.isfinite(v) if isinstance(v, complex) else math.isfinite(v)


def _opt_params(opt: Any) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def _discover(fn: Any) -> tuple[list[tuple[torch.nn.Module, str]], list[Any]]:
    """Modules (with the name the step uses) and optimizers that ``fn`` reaches through its
    closure and the globals it names."""
    cands: list[tuple[str, Any]] = []
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            try:
                cands.append((name, cell.cell_contents))
            except ValueError:
                pass
        g = getattr(fn, "__globals__", {})
        cands += [(n, g[n]) for n in code.co_names if n in g]
    self_obj = getattr(fn, "__self__", None)
    if self_obj is not None and hasattr(self_obj, "__dict__"):
        cands += list(vars(self_obj).items())
    mods: list[tuple[torch.nn.Module, str]] = []
    opts: list[Any] = []
    for name, c in cands:
        if isinstance(c, torch.nn.Module) and all(c is not m for m, _ in mods):
            mods.append((c, name))
        elif isinstance(c, torch.optim.Optimizer):
            opts.append(c)
    return mods, opts


_eager = _compat.force_eager


class _StepCheck:
    """Checks gradients in every optimizer's step pre-hook, before the update. ``snapshot``:
    keep each passing optimizer's parameters before its update (a step with several
    optimizers: the replay undoes the earlier ones' updates)."""

    def __init__(self, replaying: bool = False, snapshot: bool = False, slot: Any = None) -> None:
        self.replaying = replaying
        self.snapshot = snapshot
        self.failed: Any = None
        self.checked = False
        self.handle: Any = None
        self.slot = slot  # (torch's dict of global pre-hooks, a key reserved in it) or None
        self.stepped: list[Any] = []  # optimizers whose update went through in this step
        self.before: list[tuple[torch.Tensor, torch.Tensor]] = []  # (param, value before)

    def __enter__(self) -> _StepCheck:
        slot = self.slot
        if slot is not None and slot[1] not in slot[0]:
            # what register_optimizer_step_pre_hook does (the hook added last), without
            # making a handle on every step
            slot[0][slot[1]] = self._hook
        else:
            self.slot = None
            self.handle = register_optimizer_step_pre_hook(self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.slot is not None:
            self.slot[0].pop(self.slot[1], None)
        else:
            self.handle.remove()

    def _hook(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.checked = True
        if self.replaying:  # an optimizer the replay did not know of: stop before its update
            self.failed = opt
            raise _Abort()
        if not finite(_grads(_opt_params(opt))):
            self.failed = opt
            raise _Abort()
        if self.snapshot:
            with torch.no_grad():
                self.before += [(p, p.detach().clone()) for p in _opt_params(opt)]
        self.stepped.append(opt)


def unlocated(hits: list) -> Finding:
    """The finding of non-finite gradients whose op gradsan could not locate (no replay)."""
    return Finding(
        kind="nonfinite",
        catalog_id=None,
        phase="gradient",
        primitive="?",
        where=None,
        result="nan",
        outputs=hits,
    )


def failure_report(function: str, hits: list, notes: list[str]) -> Report:
    report = Report(backend=BACKEND, function=function)
    report.findings.append(unlocated(hits))
    report.notes.extend(notes)
    return report


class guard:
    """Guard a training step: same outputs, one fused finiteness check, and on failure a
    :class:`gradsan.NonFiniteError` that says where the NaN/Inf was born.

    ``guarded = gradsan.torch.guard(step)``; ``step(*args)`` runs forward and backward (and may
    call ``optimizer.step()``). Each call pays one reduction over every ``.grad`` (plus the loss
    it returns). When an optimizer steps inside ``step``, the check runs in its step pre-hook,
    **before the update**, so parameters and optimizer state are never touched by a non-finite
    gradient. Gradients returned by ``torch.func`` transforms and ``torch.autograd.grad`` are
    checked where they are returned. On failure gradsan replays the step eagerly (also when the
    model is ``torch.compile``'d) under the tracer and raises. The replay calls the step
    function again, so **the step's Python runs a second time**; what would change training is
    replayed, skipped or put back: the step gets the batches it took from its iterators (never
    pulled again), the RNG state of its start and the parameters its forward saw; no optimizer
    or LR scheduler steps; buffers, RNG state and parameters are then put back to what the step
    left. The lists, dicts, sets and numbers the step names (closure, globals, a bound method's
    object) are compared after the replay and put back, and the report's note names what the
    replay changed; anything else (a print, logging, a file write) happens twice, and the note
    says so. When the replay cannot be done safely (an earlier optimizer's update in the step
    that gradsan kept no copy of, a replay asking an iterator for more), the error says so and
    names the non-finite gradients the step left.

    As a context manager (``with gradsan.torch.guard(model): ...``) it checks the same way but
    cannot replay a with-block: the error names the non-finite gradients; wrap the step in a
    function to get the origin.

    **Arguments:** ``step``; ``module``: modules whose parameters to check and to name (found
    on their own through the step's closure, its globals, its arguments and the optimizer);
    ``params``: extra tensors whose ``.grad`` to check.
    """

    def __init__(
        self,
        step: Callable | torch.nn.Module | None = None,
        *,
        module: Any = None,
        params: Iterable[torch.Tensor] | None = None,
    ) -> None:
        if isinstance(step, torch.nn.Module) and module is None and not _looks_like_step(step):
            module, step = step, None
        if step is not None:
            check_callable(step, "guard")
            functools.update_wrapper(self, step, updated=())
        self.step = step
        self.modules = check_modules(module)
        self.params = list(params or [])
        for p in self.params:
            if not isinstance(p, torch.Tensor):
                raise UsageError(f"params= takes tensors, got {type(p).__name__}")
        mods, self.opts = _discover(step) if step is not None else ([], [])
        self.modules += [(m, n) for m, n in mods if all(m is not x for x, _ in self.modules)]
        self._ctx: list[Any] = []
        self._bindings = _replay.Bindings(step) if step is not None else _replay.Bindings(None)
        # several optimizers step in one call: keep the earlier ones' parameters for the replay
        self._several = len(self.opts) >= 2
        self.notes: list[str] = []  # gradsan.torch._amp: steps a GradScaler skipped
        self._amp = self._watch = _amp.GuardWatch()
        self._dist_notes: list[str] = []  # gradsan.torch._distributed: DDP ranks
        _distributed.attach_in(self.modules)  # gradsan.torch._distributed: check before all-reduce
        self._func_check = GradCheck(_Abort)  # torch.func's gradients, checked when returned
        self._hook_slot = _compat.optimizer_hook_slot()  # the step check's pre-hook
        self._busy = False  # a call of this guard is running (a second one gets its own watch)
        self._opt_seen = False  # an optimizer stepped in a call (its pre-hook checks from now on)
        self._failed_backward = 0  # the backward (1, 2, ...) after which the check stopped it

    # -- the guarded step -----------------------------------------------------------------------
    def _watched(self, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        ps: dict[int, torch.Tensor] = {}
        for m, _ in self.modules:
            for p in m.parameters():
                ps.setdefault(id(p), p)
        for t in self.params:
            ps.setdefault(id(t), t)
        for o in self.opts:
            for t in _opt_params(o):
                ps.setdefault(id(t), t)
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.nn.Module):
                for p in a.parameters():
                    ps.setdefault(id(p), p)
            elif isinstance(a, torch.Tensor) and a.requires_grad and a.is_leaf:
                ps.setdefault(id(a), a)
        return list(ps.values())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.step is None:
            raise UsageError(
                "gradsan.torch.guard() without a step is a context manager: "
                "`with gradsan.torch.guard(model): ...`; or wrap a step: guard(step)(*args)"
            )
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        busy = self._busy  # called again from inside its own step: nothing shared
        check = _StepCheck(snapshot=self._several, slot=None if busy else self._hook_slot)
        func = GradCheck(_Abort) if busy else self._func_check
        func.failed = None
        func.backwards = 0
        self._failed_backward = 0
        # no optimizer known (none found, none seen stepping): the step may update the
        # parameters itself after its backward, so the gradients are checked right after it
        func.after_backward = (
            None if self.opts or self._opt_seen else self._after_backward(func, args, kwargs)
        )
        taps: list[_replay.Tap] = []
        if args or kwargs:
            args, kwargs = _replay.tap_args(args, kwargs, taps)
        out = None
        # gradsan.torch._amp: GradScaler steps (one watch per guard, its wrappers made once)
        self._amp = amp = _amp.GuardWatch() if busy else self._watch.reset()
        bindings = self._bindings
        start = _replay.StartState(bindings)  # the replay starts from the step's start
        self._busy = True
        try:
            with check, func, amp:
                installed = bindings.tap(taps)
                try:
                    out = self.step(*args, **kwargs)
                except _Abort:
                    pass
                finally:
                    bindings.untap(installed)
        finally:
            self._busy = busy
        if check.checked:
            self._opt_seen = True
        if len(check.stepped) + (check.failed is not None) >= 2:
            self._several = True  # from now on, keep earlier optimizers' parameters
        if check.failed is None and func.failed is None:
            losses = _returned_losses(out)
            grads = [] if check.checked else _grads(self._watched(args, kwargs))
            if finite(grads, losses):
                return out
            if amp.ignorable():  # gradsan.torch._amp: the GradScaler skipped this step
                self.notes = amp.notes()
                return out
        self._amp = amp  # (a call of this guard inside the step had its own)
        # gradsan.torch._distributed: a DDP rank that only received the NaN raises here
        plan = _distributed.guard_verdict(self.modules, self._watched(args, kwargs))
        self._dist_notes = plan.notes
        self._busy = True  # the replay runs the step again (and uses this guard's watch)
        try:
            self._replay(args, kwargs, rng, cuda_rng, check, plan, start)
        finally:
            self._busy = busy
        raise AssertionError("unreachable")  # pragma: no cover

    def _after_backward(self, func: GradCheck, args: tuple, kwargs: dict) -> Callable[[int], None]:
        """The check after each backward of a step with no optimizer guard knows of: a
        non-finite gradient stops the step there, before its own update of the parameters."""

        def check(n: int) -> None:
            if not finite(_grads(self._watched(args, kwargs))):
                func.failed = "backward"
                self._failed_backward = n
                raise _Abort()

        return check

    def _replay(
        self,
        args: tuple,
        kwargs: dict,
        rng: torch.Tensor,
        cuda_rng: Any,
        check: _StepCheck,
        plan: _distributed.GuardPlan | None = None,
        start: _replay.StartState | None = None,
    ) -> None:
        """Explain the failing step: call it again under the tracer, with the step's inputs,
        batches, parameters and RNG state (_replay.py says what runs twice and what not)."""
        watched = self._watched(args, kwargs)
        if check.stepped and not check.before:
            names = ", ".join(type(o).__name__ for o in check.stepped)
            raise NonFiniteError(
                self._from_record(
                    self._recorded(watched),
                    f"the step was not replayed: an optimizer ({names}) had already updated "
                    "the parameters in this step, before the NaN/Inf, and gradsan kept no copy "
                    "to undo it on the first call (it does from the next call on); the "
                    "gradients above are what the step computed",
                )
            )
        left = _replay.ModuleState([m for m, _ in self.modules], watched)
        after_rng = torch.get_rng_state()
        after_cuda = torch.cuda.get_rng_state_all() if cuda_rng is not None else None
        grads_left = [(p, p.grad) for p in watched]
        with torch.no_grad():
            for p, v in check.before:  # the parameters as the step's forward saw them
                p.copy_(v)
        for p in watched:
            p.grad = None
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        together = plan is not None and plan.together  # FSDP2: every rank replays, no DTensor
        session = _Session(None)  # is checked (that would be a collective)
        session.modules = [] if together else list(self.modules)
        session.report.function = getattr(self.step, "__name__", "step")
        session.extra_leaves = [] if together else [p for p in watched]
        if together:
            session.namer.add_modules(self.modules)
        session.namer.add_locals(_arg_names(self.step, args, kwargs))
        report = session.__enter__()
        tracer = session.tracer
        assert tracer is not None
        tracer.node_level = True  # type: ignore[attr-defined]  # see _nodes.py
        tracer.node_hooks = _untilborn.UntilBorn  # type: ignore[attr-defined]  # _untilborn.py
        out = None
        report.notes.extend(self._amp.report_notes())  # gradsan.torch._amp
        report.notes.extend(self._dist_notes)  # gradsan.torch._distributed
        problem: str | None = None
        args, kwargs = _replay.replay_args(args, kwargs)
        python = _replay.PythonState(self._bindings)  # the step's Python runs again
        if start is not None:
            start.rewind()  # from the numbers and small containers of the step's start
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(_eager())
                stack.enter_context(warnings.catch_warnings())
                stack.enter_context(self._amp.replaying())  # gradsan.torch._amp
                stack.enter_context(_distributed.local_replay())  # gradsan.torch._distributed
                accum = stack.enter_context(_accum.counting([] if together else watched))
                warnings.filterwarnings("ignore", message=".*global hooks on modules.*")
                stack.enter_context(_replay.no_updates(self._optimizers(check)))
                stop = stack.enter_context(_StepCheck(replaying=True))
                replay_func = GradCheck(_Abort)
                if self._failed_backward:  # the step stopped after that backward: so does this
                    replay_func.after_backward = _stop_after(self._failed_backward)
                stack.enter_context(replay_func)
                stack.enter_context(self._bindings.replaying())
                try:
                    out = self.step(*args, **kwargs)  # type: ignore[misc]  # checked in __call__
                except _Abort:
                    pass
                except _replay.Unsafe as e:
                    problem = str(e)
                if stop.failed is not None:
                    report.notes.append(
                        f"the replay stopped before {type(stop.failed).__name__}.step (an "
                        "optimizer gradsan had not seen in the step): it explains what ran "
                        "before it"
                    )
            if tracer.backward_calls == 0:
                tracer.losses.extend(_returned_losses(out))
            report.notes.extend(n for n in [accum.note()] if n)  # gradsan.torch._accum
        finally:
            tracer.__exit__(None, None, None)
            session.tracer = None
            ran_twice = _replay.ran_twice_note(python.restore(), start)
            left.restore()  # buffers, and parameters an earlier optimizer had updated
            for p, g in grads_left:
                if p.grad is None:
                    p.grad = g
            torch.set_rng_state(after_rng)
            if after_cuda is not None:
                torch.cuda.set_rng_state_all(after_cuda)
        if together:  # gradsan.torch._distributed: FSDP2's ranks replayed together
            if plan is not None and plan.remote is not None:
                raise NonFiniteError(plan.remote)  # this rank only received the NaN
            tracer.roots = []
            session.extra_leaves = _distributed.fsdp_outputs(tracer, self.modules, session.namer)
        if problem is not None:
            raise NonFiniteError(
                self._from_record(
                    self._recorded(watched, grads_left),
                    f"the step could not be replayed without side effects: {problem}",
                    ran_twice,
                )
            )
        session.finish(tracer)
        report.notes.extend(n for n in [_untilborn.note(tracer)] if n and not report.ok)
        report.notes.append(ran_twice)
        report.outputs = out
        if report.ok:
            stale = self._stale_grads(grads_left)
            if stale:
                report.findings += stale
            else:
                report.findings.append(unlocated(self._recorded(watched, grads_left)))
                report.notes.append(
                    "the eager replay of the step did not reproduce the non-finite value "
                    "(nondeterminism, or state the step changes between calls?)"
                )
        for p, g in grads_left:  # the gradients as the step left them (not the replay's)
            p.grad = g
        raise NonFiniteError(report)

    def _stale_grads(self, grads_left: list) -> list[Finding]:
        """After a replay that found nothing: the parameters whose ``.grad`` the step left NaN
        where the replay (which starts from ``.grad = None``) computed a finite value. A
        backward adds into ``.grad``, and a finite addend never makes a NaN: the NaN was in the
        ``.grad`` before the step (a step without ``zero_grad``)."""
        namer = Namer()
        namer.add_modules(self.modules)
        found: list[Finding] = []
        for p, g in grads_left:
            g = _distributed._local(g) if g is not None else None
            if g is None or not g.is_floating_point() or not bool(torch.isnan(g).any()):
                continue
            r = p.grad
            r = _distributed._local(r) if r is not None else None
            nan = torch.isnan(g)
            if r is not None:
                if r.shape != g.shape or not bool(torch.isfinite(r[nan]).all()):
                    continue
            name = namer.name(p)
            found.append(
                build(
                    Origin(
                        backend=BACKEND,
                        op="input",
                        where=None,
                        phase="gradient",
                        result="nan",
                        entry_id="nonfinite-input",
                        count=int(nan.sum()),
                        size=g.numel(),
                        index=tuple(int(i) for i in nan.nonzero()[0]),
                        outputs=(output_hit(name, g),),
                        input=f"{name}.grad",
                        held="nan",
                    )
                )
            )
        if found:
            found[0].explanation += (
                " Here it was in the .grad before the step: the step's backward added "
                "finite values into it (its replay, from .grad = None, computed them). "
                "Clear the gradients each step: optimizer.zero_grad() before the backward."
            )
        return found

    def _optimizers(self, check: _StepCheck) -> list[Any]:
        opts = list(self.opts)
        opts += [o for o in (*check.stepped, check.failed) if o is not None and o not in opts]
        return opts

    def _recorded(self, watched: list[torch.Tensor], grads: list | None = None) -> list:
        """The non-finite gradients the step left (named): ``grads`` (param, grad) pairs kept
        before the replay, else the ``.grad`` of ``watched``."""
        namer = Namer()
        namer.add_modules(self.modules)
        pairs = grads if grads is not None else [(p, p.grad) for p in watched]
        local = [(p, _distributed._local(g)) for p, g in pairs if g is not None]  # (DTensors)
        return [
            output_hit(namer.name(p), g)
            for p, g in local
            if g.is_floating_point() and not all_finite(g)
        ]

    def _from_record(self, hits: list, *notes: str) -> Report:
        return failure_report(getattr(self.step, "__name__", "step"), hits, list(notes))

    # -- context manager --------------------------------------------------------------------------
    def __enter__(self) -> guard:
        check = _StepCheck()
        check.__enter__()
        self._ctx.append(check)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        check = self._ctx.pop()
        check.__exit__(exc_type, exc, tb)
        if exc_type is not None and not issubclass(exc_type, _Abort):
            return False
        watched = self._watched((), {})
        if check.failed is not None:
            watched += [p for p in _opt_params(check.failed)]
        if exc_type is None and (check.checked or finite(_grads(watched))):
            return False
        namer = Namer()
        namer.add_modules(self.modules)
        hits = [
            output_hit(namer.name(p), p.grad)
            for p in watched
            if p.grad is not None and not all_finite(p.grad)
        ]
        report = failure_report(
            "the with-block",
            hits,
            [
                "a with-block cannot be replayed: wrap the step in a function, "
                "gradsan.torch.guard(step)(*args), or run it under gradsan.torch.explain() "
                "to find where the NaN/Inf was born"
            ],
        )
        raise NonFiniteError(report) from None


def _stop_after(k: int) -> Callable[[int], None]:
    def stop(n: int) -> None:
        if n >= k:
            raise _Abort()

    return stop


def _looks_like_step(m: torch.nn.Module) -> bool:
    return False


def _returned_losses(out: Any) -> list[torch.Tensor]:
    if type(out) is torch.Tensor:  # (the usual step: one loss; no generator)
        return [out] if out.is_floating_point() and out.numel() <= 1 else []
    return [t for t in tensors_in(out) if t.is_floating_point() and t.numel() <= 1]


def _arg_names(fn: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    import inspect

    try:
        return dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {f"args[{i}]": a for i, a in enumerate(args)}
