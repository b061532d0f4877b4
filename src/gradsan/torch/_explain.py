"""`gradsan.torch.explain`: run forward and backward under the tracer and say where each
non-finite value was born, in the user's own lines."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .. import _catalog, _fix
from .._catalog import _classify
from .._errors import UsageError
from .._events import Note, Origin, Poison
from .._report import OutputHit, Report, _messages
from .._report._build import build
from . import _counts, _rules
from ._compat import dynamo_loaded, force_eager, in_functorch, recompute_in_backward
from ._func import Transforms
from ._mode import Event, External, Tag, Tracer, all_finite, tensors_in
from ._mode import key as _mode_key
from ._nodes import NodeHooks
from ._source import user_frame_object

BACKEND = "torch"


# ---- naming -------------------------------------------------------------------------------------


def check_modules(module: Any) -> list[tuple[torch.nn.Module, str]]:
    """Normalize the ``module=`` argument: a Module, a dict name -> Module, or a sequence."""
    if module is None:
        return []
    if isinstance(module, torch.nn.Module):
        return [(module, _name_in_caller(module) or "model")]
    if isinstance(module, dict) and all(isinstance(m, torch.nn.Module) for m in module.values()):
        return [(m, str(k)) for k, m in module.items()]
    if isinstance(module, (list, tuple)) and all(isinstance(m, torch.nn.Module) for m in module):
        return [(m, _name_in_caller(m) or f"model{i}") for i, m in enumerate(module)]
    raise UsageError(
        f"module= takes a torch.nn.Module, a dict of them (name -> module) or a list of them, "
        f"not {type(module).__name__}. For example: gradsan.torch.explain(module=model)"
    )


def _name_in_caller(obj: Any) -> str | None:
    f = user_frame_object(2)
    if f is None:
        return None
    for k, v in f.f_locals.items():
        if v is obj and not k.startswith("_"):
            return k
    return None


def _strip(name: str) -> str:
    """Hide torch.compile's wrapper from module paths."""
    return name.replace("_orig_mod.", "").replace("_orig_mod", "")


class Namer:
    """Names tensors for the report: module parameters by their nn.Module path, then the
    user's local variables and the function's arguments."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def add_modules(self, mods: list[tuple[Any, str]]) -> None:
        for m, prefix in mods:
            for n, p in m.named_parameters(remove_duplicate=False):
                self.names.setdefault(id(p), f"{prefix}.{_strip(n)}")
            for n, b in m.named_buffers(remove_duplicate=False):
                self.names.setdefault(id(b), f"{prefix}.{_strip(n)}")

    def add_locals(self, mapping: dict[str, Any], prefix: str = "") -> None:
        for k, v in mapping.items():
            if k.startswith("__"):
                continue
            if isinstance(v, torch.Tensor):
                self.names.setdefault(id(v), prefix + k)
            elif isinstance(v, (list, tuple)) and len(v) < 64:
                for i, x in enumerate(v):
                    if isinstance(x, torch.Tensor):
                        self.names.setdefault(id(x), f"{prefix}{k}[{i}]")
            elif isinstance(v, dict) and len(v) < 64:
                for kk, x in v.items():
                    if isinstance(x, torch.Tensor):
                        self.names.setdefault(id(x), f"{prefix}{k}[{kk!r}]")

    def name(self, t: torch.Tensor) -> str:
        n = self.names.get(id(t))
        if n is not None:
            return n
        return f"tensor of shape {tuple(t.shape)}"

    def module_paths(self, mods: list[tuple[Any, str]]) -> dict[int, str]:
        out: dict[int, str] = {}
        for m, prefix in mods:
            for n, sub in m.named_modules():
                n = _strip(n)
                out.setdefault(id(sub), f"{prefix}.{n}" if n else prefix)
        return out


# ---- findings -------------------------------------------------------------------------------------


def _hit(tag: Tag | None) -> _classify.Hit | None:
    if tag is None or tag.op is None or not tag.operands:
        return None
    op = tag.op
    params = dict(tag.params)
    if params.pop("integer_pow", False):
        op = "integer_pow"
    operands = [_rules.to_numpy(o) for o in tag.operands if o is not None]
    try:
        return _classify.classify(op, operands, None, params)
    except Exception:  # a predicate that cannot read these operands is not a finding
        return None


def _result(t: torch.Tensor) -> str:
    if bool(torch.isnan(t).any()):
        return "nan"
    if bool((t == float("inf")).any()):
        return "inf"
    return "-inf"


def _nonfinite_stats(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    bad = ~torch.isfinite(t)
    nz = bad.nonzero()
    idx = tuple(int(i) for i in nz[0]) if len(nz) else ()
    return int(bad.sum()), t.numel(), idx


def output_hit(path: str, t: torch.Tensor) -> OutputHit:
    if t.is_complex():
        count = int((~torch.isfinite(t)).sum())
        nan = int(torch.isnan(t).sum())
        inf = int(torch.isinf(t).sum())
    else:  # a real element is NaN, +-inf or finite: count = nan + inf
        nan = int(torch.isnan(t).sum())
        inf = int(torch.isinf(t).sum())
        count = nan + inf
    return OutputHit(path=path, count=count, size=t.numel(), nan=nan, inf=inf)


def _nonfinite_counts(
    ts: Sequence[torch.Tensor], memo: _counts.Memo | None = None
) -> list[tuple[int, int] | None]:
    """``(NaN count, Inf count)`` of each real float tensor, None where every element is finite
    (``output_hit``'s counts, ``all_finite``'s verdict), for many tensors (every leaf's
    gradient) with a few syncs per dtype and device rather than several per tensor
    (gradsan.torch._counts; ``memo``: what the replay's backward already counted)."""
    out: list[tuple[int, int] | None] = [None] * len(ts)
    plain: list[int] = []
    for i, t in enumerate(ts):
        if type(t) is not torch.Tensor:  # a subclass (FSDP2's DTensor shards): one at a time
            if not all_finite(t):
                h = output_hit("", t)
                out[i] = (h.nan, h.inf)
        elif t.numel():
            plain.append(i)
    for i, c in zip(plain, _counts.counts([ts[i] for i in plain], memo)):
        out[i] = c
    return out


def _held(t: torch.Tensor, counts: tuple[int, int]) -> str:
    """``_result(t)`` of a real tensor given its counts: NaN, else the sign of its infinities."""
    if counts[0]:
        return "nan"
    return "inf" if bool((t == float("inf")).any()) else "-inf"


def _scope(tag: Tag | None, paths: dict[int, str]) -> str:
    if tag is None or tag.module is None:
        return ""
    m = tag.module()
    return paths.get(id(m), type(m).__name__) if m is not None else ""


def _got_value(tag: Tag, hit: _classify.Hit) -> float | None:
    """The operand value behind ``hit.got`` (at its first index), as a number."""
    try:
        operands = [o for o in tag.operands if o is not None]
        a = np.asarray(_rules.to_numpy(operands[hit.operand]))
        v = np.broadcast_to(a, hit.mask.shape)[hit.first_index] if hit.mask.ndim else a
        return float(np.real(v))
    except (IndexError, ValueError, TypeError):
        return None


# the form of a poison -> how its operation combines its two operands (_report._build.form_text)
_OP_CLASS = {"0*inf": "mul", "0*nan": "mul", "0/0": "div", "inf/inf": "div", "inf-inf": "sum"}


def _op_class(poison: Event) -> str:
    base = poison.op.split(".")[-1].strip("_")
    if base.startswith(("div", "truediv", "true_divide")):
        return "div"
    if base.startswith("mul"):
        return "mul"
    return _OP_CLASS.get(poison.form or "", "")


def _zero_name(zsrc: Any, namer: Namer) -> str:
    """The name of the input a mask passed as an argument is (its parameter or argument)."""
    birth = getattr(zsrc, "birth", None)
    if zsrc is None or birth is None or birth.ref is None:
        return ""
    return namer.names.get(birth.ref, "")


def _first_value(t: torch.Tensor) -> str:
    """The first non-finite element of ``t`` ("inf", "-inf", "nan")."""
    with torch.no_grad():
        bad = t[~torch.isfinite(t)] if t.numel() else t
        if not bad.numel():
            return ""
        v = float(bad.flatten()[0].real) if bad.is_complex() else float(bad.flatten()[0])
    return "nan" if v != v else "inf" if v > 0 else "-inf"


def _overflow(tag: Tag | None, out: torch.Tensor) -> _classify.Hit | None:
    """float16/bfloat16 overflow (the catalog's ``float16-overflow``): a half-precision
    output that is inf from finite operands (an origin has no non-finite input) where float32
    would stay finite (autocast's matmuls, a product of halves)."""
    if out.dtype not in (torch.float16, torch.bfloat16) or tag is None:
        return None
    from .._catalog._overflow import classify_overflow

    operands = [_rules.to_numpy(o) for o in tag.operands if isinstance(o, torch.Tensor)]
    try:
        return classify_overflow(tag.op or "", operands, _rules.to_numpy(out), str(out.dtype))
    except (TypeError, ValueError):
        return None


def _reduction(tag: Tag | None, hit: _classify.Hit | None) -> tuple[int | None, float | None]:
    """(elements reduced over, correction) of a std/var call that hit the catalog."""
    if tag is None or hit is None or tag.op not in ("std", "var") or not tag.operands:
        return None, None
    x = tag.operands[0]
    if not isinstance(x, torch.Tensor):
        return None, None
    dim = tag.params.get("dim")
    dims = range(x.ndim) if dim is None else (dim,) if isinstance(dim, int) else dim
    n = 1
    for d in dims:
        n *= int(x.shape[d]) if x.ndim else 1
    return n, tag.params.get("correction")


def _value_form(tag: Tag | None, hit: _classify.Hit | None) -> str:
    """ "0/0" when a division's own operands are both 0 at the hit (its value is NaN there)."""
    if tag is None or hit is None or tag.op != "div" or len(tag.operands) < 2:
        return ""
    try:
        vals = [
            np.broadcast_to(np.asarray(_rules.to_numpy(o)), hit.mask.shape)[hit.first_index]
            for o in tag.operands[:2]
        ]
    except (IndexError, ValueError, TypeError):
        return ""
    return "0/0" if all(v == 0 for v in vals) else ""


def origin_event(
    root: Event | External,
    poison: Event | External | None,
    consumer: Event | None,
    phase: str,
    outputs: list[OutputHit],
    result: str,
    namer: Namer,
    paths: dict[int, str],
    *,
    unresolved: bool = False,
) -> Origin:
    """What the tracer saw at one origin, as a text-free event."""
    if isinstance(root, External):
        t = root.tensor
        count, size, idx = _nonfinite_stats(t)
        tag = consumer.tag if consumer is not None else None
        return Origin(
            backend=BACKEND,
            op="input",
            where=tag.frame if tag else None,
            phase=phase,
            result=result,
            entry_id="nonfinite-input",
            backend_op=tag.name if tag else "",
            count=count,
            size=size,
            index=idx,
            dtype=str(t.dtype),
            scope=_scope(tag, paths),
            outputs=tuple(outputs),
            input=namer.name(t if root.source is None or id(t) in namer.names else root.source),
            held=_result(t),
            unresolved=unresolved,
        )
    tag = root.tag
    hit = _hit(tag)
    if hit is None and isinstance(root, Event):
        hit = _overflow(tag, root.out) if root.phase == "forward" else root.overflow
    entry_id = hit.entry_id if hit else None
    library = tag.library if tag is not None and tag.library else None
    if entry_id is None and tag is not None:
        lib = _catalog.for_library(tag.library or tag.name)
        if lib is not None:
            entry_id = lib.id
    primitive = (tag.op or tag.name) if tag is not None else root.op
    if tag is not None and tag.op in ("reduce_max", "reduce_min", "select_n"):
        primitive = tag.name
    if root.phase == "backward":
        backend_op = root.op
    else:
        backend_op = tag.qualname if tag and tag.qualname else root.op
    got: str | None = None
    got_value = None
    if hit is not None and tag is not None:
        got, count, size, idx = hit.got or None, hit.count, int(hit.mask.size), hit.first_index
        got_value = _got_value(tag, hit)
    else:
        count, size, idx = _nonfinite_stats(root.out)
    # sqrt at 0: its derivative is inf; sqrt of a negative is a domain error (NaN), no note
    sqrt_note = hit is not None and got is not None and hit.entry_id == "sqrt-at-zero"
    p = None
    if isinstance(poison, Event) and poison.form:
        p = Poison(
            op=poison.op,
            where=poison.tag.frame if poison.form == "inf-inf" and poison.tag else None,
            form=poison.form,
            op_class=_op_class(poison),
            operands=poison.values,
            node=poison.node.name() if poison.node is not None else None,
            zero_from=poison.zero_from,
            index=poison.index,
            zero_kind=poison.zero_src.kind if poison.zero_src is not None else None,
            zero_text=_zero_name(poison.zero_src, namer),
            zero_op=poison.zero_src.step.op if poison.zero_src is not None else "",
            zero_value=poison.zero_src.step.value if poison.zero_src is not None else "",
        )
    reduced, ddof = _reduction(tag, hit)
    return Origin(
        backend=BACKEND,
        op=primitive,
        where=tag.frame if tag else None,
        phase=phase,
        result=result,
        reduced=reduced,
        ddof=ddof,
        produced=_first_value(root.out),
        value_form=_value_form(tag, hit),
        entry_id=entry_id,
        backend_op=backend_op,
        got=got,
        got_value=got_value,
        count=count,
        size=size,
        index=idx,
        dtype=str(root.out.dtype),
        library=library,
        scope=_scope(tag, paths),
        outputs=tuple(outputs),
        node=root.node.name() if root.node is not None else None,
        note=Note.DERIVATIVE_IS if sqrt_note else None,
        note_value="inf",
        poison=p,
        unresolved=unresolved,
    )


@dataclasses.dataclass(eq=False)
class _Group:
    """The outputs one origin reached, in one phase."""

    root: Event | External
    poison: Event | External | None
    consumer: Event | None
    phase: str
    result: str
    outputs: list[OutputHit] = dataclasses.field(default_factory=list)
    _paths: set[str] = dataclasses.field(default_factory=set, repr=False)

    def add(self, hit: OutputHit) -> None:
        if hit.path not in self._paths:  # the first hit of each path, in the order they came
            self._paths.add(hit.path)
            self.outputs.append(hit)


def build_report(tracer: Tracer, report: Report, **kw: Any) -> Report:
    """Blame every non-finite loss and gradient the tracer saw; one finding per origin (see
    ``_build_report``), with the cyclic collector paused while it runs."""
    with _counts.paused_gc():
        return _build_report(tracer, report, **kw)


def _build_report(
    tracer: Tracer,
    report: Report,
    *,
    modules: list[tuple[Any, str]],
    namer: Namer,
    extra_leaves: Sequence[torch.Tensor] = (),
    unresolved: bool = False,
) -> Report:
    """Blame every non-finite loss and gradient the tracer saw; one finding per origin.
    ``unresolved``: nansafe ran, so a non-finite gradient is one it left as it is."""
    mods = list(modules) + [(m, n) for m, n in tracer.roots if all(m is not x for x, _ in modules)]
    namer.add_modules(mods)
    paths = namer.module_paths(mods)
    groups: dict[tuple[int, str], _Group] = {}
    order: list[tuple[int, str]] = []

    def add(
        start: Event | External, phase: str, hit: OutputHit, result: str, found: Any = None
    ) -> None:
        for root, poison, consumer in origins_of(tracer, start) if found is None else found:
            k = (_root_key(root), phase)
            g = groups.get(k)
            if g is None:
                g = groups[k] = _Group(root, poison, consumer, phase, result)
                order.append(k)
            g.add(hit)
            if result == "nan":
                g.result = "nan"

    # value phase: the loss that backward was called on (or that fn returned)
    value_roots: set[int] = set()
    seen_loss: set[int] = set()
    for loss in tracer.losses:
        if id(loss) in seen_loss or not isinstance(loss, torch.Tensor):
            continue
        seen_loss.add(id(loss))
        if loss.is_floating_point() and not all_finite(loss):
            start = tracer.producer_of(loss) or External(loss)
            name = namer.names.get(id(loss), "loss")
            add(start, "value", output_hit(name, loss), _result(loss))
            value_roots.update(_root_key(r) for r, _, _ in origins_of(tracer, start))
    # gradient phase: every leaf the backward reached
    leaves: dict[int, torch.Tensor] = dict(tracer.leaves)
    for t in extra_leaves:
        leaves.setdefault(id(t), t)
    for m, _ in mods:
        for p in m.parameters():
            leaves.setdefault(id(p), p)
    unexplained: list[OutputHit] = []
    with_grad = [
        (t, t.grad) for t in leaves.values() if t.grad is not None and t.grad.is_floating_point()
    ]
    for t, grad in with_grad:  # backward adds into a .grad in place: a NaN it held is x.grad's
        if id(t) in namer.names:
            namer.names.setdefault(id(grad), f"{namer.names[id(t)]}.grad")
    for (t, grad), counts in zip(
        with_grad,
        _nonfinite_counts([g for _, g in with_grad], getattr(tracer, "counts_memo", None)),
    ):
        if counts is None:
            continue
        producer = tracer.producer_of(grad)
        nan, inf = counts
        hit = OutputHit(path=namer.name(t), count=nan + inf, size=grad.numel(), nan=nan, inf=inf)
        if producer is None:
            unexplained.append(hit)
            continue
        found = origins_of(tracer, producer)
        for root, _, _ in found:
            if _root_key(root) in value_roots:  # the same origin already explains the loss
                k = (_root_key(root), "value")
                if k in groups:
                    groups[k].add(hit)
                break
        else:
            add(producer, "gradient", hit, _held(grad, counts), found)
    for k in order:
        g = groups[k]
        own = g.poison is g.root and isinstance(g.root, Event) and not g.root.form
        if g.poison is None or own:  # a NaN that met a zero on its way (0 * nan: where trap)
            g.poison = tracer.meetings.get(id(g.root), g.poison)
        if g.poison is None and isinstance(g.root, Event) and g.root.form:
            # born where constant infinities (a -inf mask) met a zero: its own form
            g.poison = g.root
        ev = origin_event(
            g.root,
            g.poison,
            g.consumer,
            g.phase,
            g.outputs,
            g.result,
            namer,
            paths,
            unresolved=unresolved and g.phase == "gradient",
        )
        report.findings.append(build(ev))
    if unexplained:
        names = ", ".join(f"`{h.path}`" for h in unexplained[:5])
        report.notes.append(_messages.UNSEEN_GRADIENT_TORCH.format(names=names))
    return report


def _root_key(root: Event | External) -> int:
    """Events of one forward operation (its value and its backward) are one origin."""
    if isinstance(root, Event) and root.tag is not None:
        return id(root.tag)
    if isinstance(root, External):  # one input, however many records of it were made
        return hash(("external", _mode_key(root.tensor)))
    return id(root)


def origins_of(
    tracer: Tracer, start: Event | External
) -> list[tuple[Event | External, Event | External | None, Event | None]]:
    """(origin, poison, the first event that read an external origin) of a non-finite value."""
    return [(r, p, _consumer_of(tracer, start, r)) for r, p in tracer.origins(start)]


def _consumer_of(tracer: Tracer, start: Event | External, root: Event | External) -> Event | None:
    if not isinstance(root, External):
        return None
    # the first event (nearest the root) that read this external tensor
    stack: list[Any] = [start]
    seen: set[int] = set()
    while stack:
        ev = stack.pop()
        if id(ev) in seen or not isinstance(ev, Event):
            continue
        seen.add(id(ev))
        for _, prod in ev.inputs:
            if prod is root:
                return ev
            stack.append(prod)
    return None


# ---- public API -----------------------------------------------------------------------------------


class _EagerTracer(Tracer):
    """The tracer, with ``torch.compile``'d code run as its eager twin while it traces: dynamo
    cannot trace through the tracer's modes and hooks, and a compiled graph hides the user's
    lines. Whoever ends the trace (``__exit__``) ends the eager stance too."""

    _stance: contextlib.ExitStack | None = None

    def ensure_eager(self) -> None:
        """Enter the eager stance once torch._dynamo is imported (a session opened before the
        script called torch.compile enters it at the first module call, or from gradsan run's
        torch.compile patch)."""
        if self._stance is not None or not dynamo_loaded():
            return
        stack = contextlib.ExitStack()
        stack.enter_context(force_eager())
        # the eager twin of a compiled module runs the tracer's global module hooks
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=".*global hooks on modules.*")
        self._stance = stack

    def __enter__(self) -> Tracer:
        self.ensure_eager()
        self.transforms = Transforms(self)
        self._recompute = recompute_in_backward(self._fmode, self._recomputing)
        try:
            self.transforms.__enter__()
            self._recompute.__enter__()
            return super().__enter__()
        except BaseException:
            self._recompute.__exit__(None, None, None)
            self.transforms.__exit__(None, None, None)
            self._close_stance()
            raise

    @contextlib.contextmanager
    def _recomputing(self) -> Iterator[None]:
        """Checkpoint's recomputation: the detached copies of its inputs it makes are not the
        user's tensors (their gradients flow on to the real inputs)."""
        before = set(self.leaves)
        try:
            yield
        finally:
            for k in [k for k in self.leaves if k not in before]:
                if not isinstance(self.leaves[k], torch.nn.Parameter):
                    del self.leaves[k]

    def _pre_module(self, module: Any, args: Any) -> None:
        if self._stance is None:
            self.ensure_eager()
        super()._pre_module(module, args)

    node_level = False  # guard's replay: Node hooks, the dispatch mode only where NaN is born
    node_hooks: Any = NodeHooks  # guard's replay: gradsan.torch._untilborn.UntilBorn

    def run_backward(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if self.node_level and not self._dmode_on and not in_functorch():
            # (a transform's wrapped tensors have no storage to key: those get the full trace)
            roots = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
            self.on_backward_call(roots)
            cls = self.node_hooks if getattr(func, "__name__", "") != "grad" else NodeHooks
            hooks = cls(self, list(tensors_in(roots)))
            try:
                out = func(*args, **kwargs)
            finally:
                hooks.remove()
        else:
            out = super().run_backward(func, args, kwargs)
        if getattr(func, "__name__", "") == "grad":  # torch.autograd.grad: what it returned
            self.transforms.autograd_grad(args[1] if len(args) > 1 else kwargs.get("inputs"), out)
        return out

    def _close_stance(self) -> None:
        stack, self._stance = self._stance, None
        if stack is not None:
            stack.close()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._recompute.__exit__(None, None, None)
            self.transforms.__exit__(None, None, None)
            self._close_stance()


class _Session:
    """A context manager that traces a block and fills a Report at exit."""

    kinks = False
    function = "the with-block"
    unresolved = False  # nansafe: a non-finite gradient is one it left as it is

    def __init__(self, module: Any = None, *, _caller_depth: int = 3) -> None:
        self.modules = check_modules(module)
        self.report = Report(backend=BACKEND, function=self.function)
        self.tracer: Tracer | None = None
        self.namer = Namer()
        self.extra_leaves: list[torch.Tensor] = []
        self.old_grads: list[torch.Tensor] = []  # the .grads the call found (named x.grad)
        self.left: dict[str, Any] | None = None  # a with-block's variables at its end

    def __enter__(self) -> Report:
        self.tracer = _EagerTracer(kinks=self.kinks)
        self.tracer.__enter__()
        return self.report

    def close(self, exc_type: Any = None, exc: Any = None, tb: Any = None) -> Tracer:
        """Stop tracing; returns the tracer."""
        tracer = self.tracer
        assert tracer is not None
        self.tracer = None
        tracer.__exit__(exc_type, exc, tb)
        return tracer

    def __exit__(self, exc_type, exc, tb) -> None:
        tracer = self.close(exc_type, exc, tb)
        if exc_type is not None:
            return
        f = user_frame_object(2)
        if f is not None:
            self.left = dict(f.f_locals)
            self.namer.add_locals(self.left)
        self.finish(tracer)
        _fix.verify_block(self.report, f)  # fix: a with-block's fixes run on the block

    def finish(self, tracer: Tracer) -> None:
        notes = self.returned(tracer)
        build_report(
            tracer,
            self.report,
            modules=self.modules,
            namer=self.namer,
            extra_leaves=self.extra_leaves,
            unresolved=self.unresolved,
        )
        self.report.notes.extend(notes)

    def returned(self, tracer: Tracer) -> list[str]:
        """Make what the traced code returned outputs of the report: the gradients torch.func
        and torch.autograd.grad returned (blamed like ``.grad``, named after their argument),
        vmap's replayed batch elements, and, when no backward ran, the non-finite values the
        block left in its variables (or fn returned). Returns the notes to add."""
        transforms: Transforms | None = getattr(tracer, "transforms", None)
        notes: list[str] = list(transforms.notes) if transforms is not None else []
        names = self.namer.names
        grads: set[int] = set()
        if transforms is not None:
            for i, (arg, g, api) in enumerate(transforms.grads):
                grads.add(id(g))
                if not g.is_floating_point() or all_finite(g):
                    continue
                proxy = g.new_zeros(()).expand(g.shape)  # a leaf whose .grad is g
                proxy.grad = g
                names[id(proxy)] = self._arg_name(arg, transforms) or f"argument {i} of {api}"
                self.extra_leaves.append(proxy)
            for user_t, twin, b in transforms.values:
                if id(twin) in grads:
                    continue
                base = names.get(id(user_t), "the vmap output")
                names[id(twin)] = f"{base}[{b}]"
                tracer.losses.append(twin)
        if tracer.backward_calls or grads:
            return notes
        left = [t for t in tensors_in(self.report.outputs)] if self.left is None else []
        if self.left is not None:
            for v in self.left.values():
                left += [t for t in tensors_in(v)]
        seen: set[int] = set()
        found = False
        before = 0  # non-finite, but no operation of the block made them
        for t in left:
            if id(t) in seen or not t.is_floating_point():
                continue
            seen.add(id(t))
            if all_finite(t):
                continue
            if tracer.producer_of(t) is None:
                before += 1
                continue
            tracer.losses.append(t)
            found = True
        if not found and not tracer.losses:
            n = len(seen) - before
            what = f"{n} tensor{'s' if n != 1 else ''}"
            where = "it returned" if self.left is None else "left in its variables"
            came = f"; {before} were NaN/Inf before it began" if before else ""
            notes.append(
                f"no backward ran: gradsan checked the {what} {where} (finite{came}) "
                "and no gradient"
            )
        return notes

    def _arg_name(self, arg: Any, transforms: Transforms) -> str | None:
        names = self.namer.names
        if arg is None:
            return None
        if id(arg) in names:
            return names[id(arg)]
        src = transforms.sliced.get(id(arg))
        if src is not None and id(src[0]) in names:
            return f"{names[id(src[0])]}[{src[1]}]"
        return None


def run_functional(session: _Session, fn: Callable, args: tuple, kwargs: dict) -> Report:
    """Run ``fn(*args, **kwargs)`` under ``session``; backward the returned loss if fn did not."""
    try:
        sig = inspect.signature(fn)
        bound = sig.bind_partial(*args, **kwargs)
        session.namer.add_locals(dict(bound.arguments))
    except (TypeError, ValueError):
        session.namer.add_locals({f"args[{i}]": a for i, a in enumerate(args)})
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.nn.Module):
            session.modules.append((a, _arg_name(fn, a, args, kwargs)))
    session.extra_leaves = [t for t in tensors_in((args, kwargs)) if t.requires_grad and t.is_leaf]
    _name_old_grads(session)
    session.report.function = getattr(fn, "__name__", "function")
    report = session.__enter__()
    tracer = session.tracer
    assert tracer is not None
    ok = False
    try:
        out = fn(*args, **kwargs)
        loss = (
            out[0] if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor) else out
        )
        if isinstance(loss, torch.Tensor):
            if tracer.backward_calls == 0 and loss.requires_grad and loss.grad_fn is not None:
                if loss.numel() != 1:
                    raise UsageError(
                        f"{report.function} returned a loss of shape {tuple(loss.shape)}; "
                        "gradsan calls loss.backward() on what fn returns, which needs a scalar. "
                        "Return loss.sum() (or loss.mean()), or call backward inside fn."
                    )
                loss.backward()
            elif tracer.backward_calls == 0:
                tracer.losses.append(loss)
        report.outputs = out
        ok = True
    finally:
        session.close()
    if ok:
        session.finish(tracer)
    return report


def _name_old_grads(session: _Session) -> None:
    """Name the ``.grad`` each argument (and module parameter) holds before the call: backward
    adds into it, so a NaN it already held is blamed on ``x.grad``, not on the tensor ``x``.
    The session keeps them alive (an id is not reused while it names one)."""
    names = session.namer.names
    held = session.old_grads
    for t in session.extra_leaves:
        if t.grad is not None and id(t) in names:
            held.append(t.grad)
            names.setdefault(id(t.grad), f"{names[id(t)]}.grad")
    for m, prefix in session.modules:
        for n, p in m.named_parameters():
            if p.grad is not None:
                held.append(p.grad)
                names.setdefault(id(p.grad), f"{prefix}.{_strip(n)}.grad")


def _arg_name(fn: Callable, obj: Any, args: tuple, kwargs: dict) -> str:
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
        for k, v in bound.arguments.items():
            if v is obj:
                return k
    except (TypeError, ValueError):
        pass
    return "model"


def check_callable(fn: Any, api: str) -> None:
    if not callable(fn):
        raise UsageError(
            f"gradsan.torch.{api} takes a function that runs forward and backward (or returns a "
            f"scalar loss), not {type(fn).__name__}. Use it as "
            f"`gradsan.torch.{api}(step)(*args)` or as a context manager: "
            f"`with gradsan.torch.{api}() as report: ...`"
        )
    if isinstance(fn, torch.Tensor):
        raise UsageError(f"gradsan.torch.{api} takes a function, not a tensor.")


class explain(_Session):
    """Explain every NaN/Inf in the value or gradient: where it was born, why, what to do.

    Two forms:

    * context manager, around forward and backward::

        with gradsan.torch.explain() as report:
            loss = model(x)
            loss.backward()
        print(report)

    * functional: ``gradsan.torch.explain(fn)(*args) -> Report``. ``fn`` either runs forward
      and backward itself, or returns a scalar loss; **if fn called no backward, gradsan calls
      ``loss.backward()`` on the returned loss**, which fills ``.grad`` of every tensor that
      requires grad (parameters and arguments alike).

    **Arguments:**

    - ``fn``: the step (optional).
    - ``module``: an ``nn.Module`` (or a dict name -> module) whose parameters are named by
      their module path (``model.layers.3.attn.q_proj.weight``). Modules called inside the
      block are found on their own; this names them.

    **Returns:** a :class:`gradsan.Report`; ``report.ok`` is False when something is
    non-finite. Outputs and gradients are exactly those of the untraced run.
    """

    function = "the with-block"

    def __new__(cls, fn: Callable | None = None, *, module: Any = None):
        self = super().__new__(cls)
        if fn is not None:
            check_callable(fn, cls.__name__)
        return self

    def __init__(self, fn: Callable | None = None, *, module: Any = None) -> None:
        super().__init__(module)
        self.fn = fn
        if fn is not None:
            functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Report:
        if self.fn is None:
            raise UsageError(
                f"gradsan.torch.{type(self).__name__}() without a function is a context "
                f"manager: `with gradsan.torch.{type(self).__name__}() as report: ...`"
            )
        session = type(self)(None)
        session.modules = list(self.modules)
        return _fix.verified_before(
            lambda: run_functional(session, self.fn, args, kwargs), self.fn, args, kwargs, BACKEND
        )
