"""`gradsan.torch.sanitize`: explain, plus every kink, tie and discontinuity the gradient went
through, with the convention PyTorch chose there (and a flag when it is not admissible)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .. import _catalog
from .._catalog import _classify
from .._catalog._types import CONVENTION_KINDS, Admissible
from .._catalog.entries.kinks import activation_corners, activation_jumps, corner_interval
from .._events import Kink
from .._report import _messages
from .._report._build import build
from . import _conventions, _depends, _rules, _series
from ._compat import in_functorch
from ._explain import BACKEND, Namer, _EagerTracer, _scope, explain
from ._mode import Tag, Tracer


def kink_event(
    tracer: Tracer, tag: Tag, name: str, operands: list, params: dict, paths: dict[int, str]
) -> Kink | None:
    """The kink the tracer saw at one operation, as a text-free event (None: not on a kink)."""
    if not any(isinstance(o, torch.Tensor) and o.requires_grad for o in operands):
        return None  # no gradient flows through it
    if _rules.LIBRARY in params:
        return _library_event(tag, name, operands, params[_rules.LIBRARY], paths)
    op = tag.op
    assert op is not None
    if op == "select_n":
        cond = operands[0]
        if not isinstance(cond, torch.Tensor) or cond.dtype != torch.bool:
            return None
        strict = tracer.strict_of(cond)
        if strict is None:
            return None
        mask = ~_rules.to_numpy(strict).astype(bool)
        entry_id, got, got_value = _WHERE, _messages.WHERE_EQUALITY, None
    else:
        np_ops = [None if o is None else _rules.to_numpy(o) for o in operands]
        try:
            hit = _classify.classify(op, np_ops, None, params)
        except Exception:  # an unreadable operand is not a finding
            hit = None
        if hit is None or hit.entry_id not in _KINKISH:
            return None
        mask, entry_id, got = hit.mask, hit.entry_id, hit.got
        try:
            got_value = None if hit.value is None else float(hit.value)
        except (TypeError, ValueError):
            got_value = None
    mask = np.asarray(mask, bool)
    if not mask.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(mask)[0]) if mask.ndim else ()
    return Kink(
        backend=BACKEND,
        entry_id=entry_id,
        op=op,
        primitive=name,
        where=tag.frame,
        backend_op=tag.qualname,
        got=got,
        got_value=got_value,
        count=int(mask.sum()),
        size=int(mask.size),
        index=idx,
        scope=_scope(tag, paths),
        inadmissible_convention=BACKEND in _catalog.get(entry_id).inadmissible,
    )


def _library_event(
    tag: Tag, name: str, args: list, kwargs: dict, paths: dict[int, str]
) -> Kink | None:
    """A library call at a silent convention (norm at 0, std of a constant, tied quantile,
    repeated eigenvalue, singular det, ...), with PyTorch's value there and whether it lies in
    the entry's admissible set."""
    try:
        h = _conventions.hit(name, tuple(args), kwargs, None)
    except Exception:  # an unreadable operand is not a finding
        return None
    if h is None:
        return None
    mask = np.asarray(h.mask, bool)
    if not mask.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(mask)[0]) if mask.ndim else ()
    inadm = BACKEND in _catalog.get(h.entry_id).inadmissible
    return Kink(
        backend=BACKEND,
        entry_id=h.entry_id,
        op=h.op,
        primitive=name,
        where=tag.frame,
        backend_op=tag.qualname,
        got=h.got,
        count=int(mask.sum()),
        size=int(mask.size),
        index=idx,
        library=_conventions.display_name(name),
        scope=_scope(tag, paths),
        admissible=h.admissible,
        inadmissible_convention=inadm,
        facts=h.facts,
    )


# The entries sanitize reports: kinks, ties and jumps, and PyTorch's inadmissible conventions.
_KINKISH = {
    e.id for e in _catalog.ENTRIES if e.kind in CONVENTION_KINDS or BACKEND in e.inadmissible
}
_WHERE = _catalog.by_op("where")[0].id


# the kink ops whose dependence is checked (torch/_depends.py); the rest (atan2, det, argmax,
# the library conventions) are reported as the convention they are
_CHECKED_OPS = frozenset(
    {"abs", "relu", "max", "min", "reduce_max", "reduce_min", "clamp", "sort", "top_k"}
    | {"floor", "ceil", "round", "select_n", "activation"}
)


def _scalar_grads(
    fn: Any, values: list[float], dtype: torch.dtype = torch.float64
) -> list[float] | None:
    """PyTorch's partial derivatives of ``fn`` at scalar ``values`` (float64, or ``dtype``)."""
    try:
        with torch.enable_grad():
            ts = [torch.tensor(v, dtype=dtype, requires_grad=True) for v in values]
            gs = _depends.unwrapped_grad(fn(*ts), ts, allow_unused=True)
        return [0.0 if g is None else float(g) for g in gs]
    except (RuntimeError, TypeError, ValueError):
        return None


def _with_value(
    ev: Kink, op: str | None, name: str, operands: list, kwargs: dict, params: dict | None = None
) -> Kink:
    """The kink with PyTorch's derivative at its first hit and whether it lies in the entry's
    admissible set (abs, relu, maximum/minimum, clamp, and max/min/amax/amin reductions)."""
    if op in ("reduce_max", "reduce_min"):
        if name in ("max", "min", "amax", "amin"):
            return _reduce_value(ev, name, operands, kwargs)
        return ev
    idx = ev.index or ()
    try:
        vals = [
            None if o is None else float(np.broadcast_to(_rules.to_numpy(o), _shape(operands))[idx])
            for o in operands
        ]
    except (TypeError, ValueError, IndexError):
        return ev
    g: list[float] | None = None
    adm = _catalog.get(ev.entry_id).admissible
    if op in ("abs", "relu") and vals and vals[0] is not None:
        g = _scalar_grads(torch.abs if op == "abs" else torch.relu, [vals[0]])
    elif op in ("max", "min") and len(vals) >= 2 and None not in vals[:2]:
        g = _scalar_grads(torch.maximum if op == "max" else torch.minimum, vals[:2])  # type: ignore[arg-type]
    elif op == "clamp" and len(vals) == 3:
        lo, x, hi = vals
        if name.rstrip("_") == "hardtanh":  # its own rule: 0 at both bounds (clamp's is 1)
            g = _scalar_grads(lambda t: F.hardtanh(t, lo, hi), [x])  # type: ignore[arg-type,list-item]
        elif name.rstrip("_") == "relu6":
            g = _scalar_grads(F.relu6, [x])  # type: ignore[list-item]
        else:
            g = _scalar_grads(lambda t: torch.clamp(t, lo, hi), [x])  # type: ignore[list-item]
    elif op == "activation" and vals and vals[0] is not None:
        x0 = operands[0]
        dtype = x0.dtype if isinstance(x0, torch.Tensor) else torch.float64
        return _activation_value(ev, vals[0], params or {}, dtype)
    if g is None or adm is None:
        return ev
    value = _conventions._fmt(g if len(g) > 1 else g[0])
    return dataclasses.replace(
        ev, admissible=adm.contains(g, tol=1e-9), facts={**dict(ev.facts), "value": value}
    )


def _activation_value(ev: Kink, x: float, params: dict, dtype: torch.dtype) -> Kink:
    """A fused activation at a corner: PyTorch's derivative there, against the interval
    between the catalog's two one-sided slopes at that corner (``params`` as
    :func:`gradsan.torch._rules.activation_params` reads them); at a jump, PyTorch's
    derivative and the two limits (no value is admissible)."""
    fn = params.get("fn", "")
    idx = ev.index or ()
    call = _activation_fn(fn, params, idx)
    jumps, corners = activation_jumps(fn, params), activation_corners(fn, params)
    xd = x  # the operand's value, which equals the corner in the operand's dtype
    x = next((c[0] for c in (*jumps, *corners) if _same(c[0], x, dtype)), x)
    jump = next((j for j in jumps if j[0] == x), None)
    if jump is not None:
        g = None if call is None else _scalar_grads(call, [xd], dtype)
        facts = {
            **dict(ev.facts),
            "subdifferential": f"none: {fn} jumps from {jump[1]:g} to {jump[2]:g} at {x:g}",
        }
        if g is not None:
            facts["value"] = _conventions._fmt(g[0])
        return dataclasses.replace(ev, admissible=False if g is not None else None, facts=facts)
    at = corner_interval(corners, x, idx)
    if at is None:
        if fn == "rrelu" and params.get("training"):  # the slope PyTorch drew is not read
            lo, hi = params["lower"], params["upper"]
            words = f"[r, 1] (r: the slope rrelu drew in training, in [{lo:.6g}, {hi:.6g}])"
            return dataclasses.replace(ev, facts={**dict(ev.facts), "subdifferential": words})
        return ev
    g = None if call is None else _scalar_grads(call, [xd], dtype)
    if g is None:
        return ev
    lo, hi = at
    adm = Admissible.interval(lo, hi, f"[{lo:.6g}, {hi:.6g}]")
    facts = {
        **dict(ev.facts),
        "value": _conventions._fmt(g[0]),
        "subdifferential": f"[{lo:.6g}, {hi:.6g}] (the one-sided slopes of {fn} at {x:g})",
    }
    return dataclasses.replace(ev, admissible=adm.contains(g, tol=1e-9), facts=facts)


def _same(c: float, x: float, dtype: torch.dtype) -> bool:
    """Whether the operand's value ``x`` is the corner ``c`` in the operand's dtype."""
    try:
        return bool(torch.tensor(c, dtype=dtype) == torch.tensor(x, dtype=dtype))
    except (TypeError, RuntimeError):
        return c == x


def _activation_fn(fn: str, params: dict, idx: tuple) -> Any:
    """The activation as PyTorch computes it, of one scalar (prelu with its weight at
    ``idx``); None for rrelu in training (calling it would draw from the user's generator)."""
    p = params
    if fn == "prelu":
        w = p.get("negative_slope", 0.25)
        w = float(np.asarray(w)[idx] if np.ndim(w) else w)
        return lambda t: F.prelu(t, torch.tensor([w], dtype=t.dtype))
    if fn == "rrelu":
        if p.get("training"):
            return None
        return lambda t: F.rrelu(t, p["lower"], p["upper"], training=False)
    if fn in ("softshrink", "hardshrink"):
        return lambda t: getattr(F, fn)(t, p["lambd"])
    if fn == "threshold":
        return lambda t: F.threshold(t, p["threshold"], p["value"])
    extra = {k: p[k] for k in ("negative_slope", "alpha") if k in p}
    f = getattr(F, fn, None)
    return None if f is None else (lambda t: f(t, **extra))


def _shape(operands: list) -> tuple:
    shapes = [np.shape(_rules.to_numpy(o)) for o in operands if o is not None]
    return tuple(np.broadcast_shapes(*shapes)) if shapes else ()


def _reduce_value(ev: Kink, name: str, operands: list, kwargs: dict) -> Kink:
    """A tied max/min over a dimension: PyTorch's gradient over the first tied row, against
    the convex combinations of the tied entries."""
    x = operands[0] if operands else None
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() == 0:
        return ev
    dim = kwargs.get("dim", operands[1] if len(operands) > 1 else None)
    if dim is None:
        row = x.detach().reshape(-1)
    elif isinstance(dim, int):
        moved = x.detach().movedim(dim, -1)
        flat = moved.reshape(-1, moved.shape[-1])
        idx = ev.index or ()
        try:
            j = int(np.ravel_multi_index(idx, moved.shape[:-1])) if idx else 0
        except ValueError:
            j = 0
        row = flat[j]
    else:
        return ev
    fn = getattr(torch, name)
    by_dim = dim is not None and name in ("max", "min")  # (values, indices): the values

    def red(*ts: torch.Tensor) -> torch.Tensor:
        v = torch.stack(ts)
        return fn(v, 0).values if by_dim else fn(v)

    g = _scalar_grads(red, [float(v) for v in row])
    if g is None:
        return ev
    r = row.double().numpy()
    ext = r.max() if name in ("max", "amax") else r.min()
    tied = tuple(int(i) for i in np.flatnonzero(r == ext))
    words = _catalog.get(ev.entry_id).admissible
    adm = Admissible.simplex(tied, words.words if words else "").contains(g, tol=1e-9)
    return dataclasses.replace(
        ev, admissible=adm, facts={**dict(ev.facts), "value": _conventions._fmt(g)}
    )


def _keep(t: Any) -> Any:
    return t


def _series_at_backward(checker: _depends.Checker, func: Any, args: tuple, kwargs: dict) -> None:
    """The loss's one-sided tangents (kinks in series), read before the backward pass."""
    is_grad = getattr(func, "__name__", "") == "grad"
    roots = args[0] if args else kwargs.get("outputs" if is_grad else "tensors")
    gpos, gname = (2, "grad_outputs") if is_grad else (1, "grad_tensors")
    grads = args[gpos] if len(args) > gpos else kwargs.get(gname)
    roots = [roots] if isinstance(roots, torch.Tensor) else list(roots or ())
    if grads is None or isinstance(grads, torch.Tensor):
        grads = [grads] * len(roots) if grads is None else [grads]
    checker.probing = True
    try:
        with torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
            checker.series.at_backward(roots, list(grads))
    finally:
        checker.probing = False


def _undone(tracer: Any, recorded: list) -> bool:
    """Whether every kink of the session was propagated at its one-sided choice and the
    loss's one-sided derivatives along the probes are AD's: its kinks undo each other."""
    if not isinstance(tracer, _KinkTracer) or tracer.inplace or not tracer.checker.series.chain():
        return False
    for _, _, check in recorded:
        if check is None or check.deltas is None or check.indices is not None:
            return False
        moved = [(d, j) for d, j in check.deltas if np.any(d != 0)]
        if any(j for _, j in moved) or (moved and check.vid is None):
            return False
    return True


def _series_depends(tracer: Any, vid: int | None) -> bool:
    return isinstance(tracer, _KinkTracer) and tracer.checker.series.depends(vid)


class _KinkTracer(_EagerTracer):
    """The tracer, reading each kink while the graph that led to it is alive: the kink event
    (catalog masks) and whether the gradient depends on it (:mod:`gradsan.torch._depends`)."""

    def __init__(self, *, kinks: bool = True) -> None:
        super().__init__(kinks=kinks)
        self.checker = _depends.Checker()
        self.recorded: list[tuple[Tag, Kink, _depends.Check | None]] = []
        self.inplace: list[Tag] = []  # in-place kink calls whose input could not be read
        # the last in-place kink call's operand, read before the call: (name, the operand,
        # its pinned copy, or None where it was at no kink)
        self._pre: tuple[str, Any, torch.Tensor | None] | None = None

    higher_order = False  # a backward with create_graph=True ran (a gradient penalty)

    def run_backward(self, func: Any, args: tuple, kwargs: dict) -> Any:
        pos = 4 if getattr(func, "__name__", "") == "grad" else 3  # autograd.grad / backward
        if kwargs.get("create_graph") or (len(args) > pos and args[pos] is True):
            self.higher_order = True
        if self.checker.series.active() and not self._dmode_on:
            _series_at_backward(self.checker, func, args, kwargs)
        return super().run_backward(func, args, kwargs)

    def pre_call(self, name: str, args: tuple, kwargs: dict) -> None:
        """Before an in-place kink call (``relu_``, ``clamp_``, ``F.relu(x, inplace=True)``,
        ``nn.ReLU(inplace=True)``, ...) overwrites its operand: whether it sits on a kink, and
        if so a copy of it with its tangents (the graph before the call), which the kink check
        reads instead of the overwritten operand. Nothing is copied off the kinks."""
        op = _rules.canonical(name)
        if op not in _rules.KINK_OPS or not _rules.is_inplace(name, args, kwargs):
            return
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or self._dmode_on or in_functorch():
            return  # recomputed in backward, a transform's tensors: said unchecked
        at = False
        try:
            if torch.is_grad_enabled():  # else no gradient flows through the call
                operands, params = _rules.operands_for(name, args, kwargs)
                tag = Tag(name, op, None)
                at = kink_event(self, tag, name, list(operands), dict(params), {}) is not None
            with torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
                copy = self.checker.pin(x) if at else None
        except Exception:  # an operand or a graph it cannot read: said unchecked
            return
        # at a kink whose tangents could not be read (x needs none): said unchecked
        self._pre = None if at and copy is None else (name, x, copy)

    def _read_before(self, nm: str, args: tuple, kwargs: dict) -> tuple | None:
        """The operand an in-place kink call had before it ran: the arguments with its copy
        in place of the overwritten tensor; () where it was at no kink; None where it was
        not read."""
        pre, self._pre = self._pre, None
        x = args[0] if args else kwargs.get("input")
        if pre is None or pre[0] != nm or pre[1] is not x:
            return None
        if pre[2] is None:
            return ()
        return (pre[2], *args[1:]) if args else (pre[2],)

    def on_function(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        n = len(self.kink_hits)
        super().on_function(func, name, args, kwargs, out)
        if name in _rules.COMPARISONS:
            self.checker.note_comparison(name, args, kwargs, out)
        if len(self.kink_hits) <= n:
            self._pre = None
            return
        tag, nm, (operands, params) = self.kink_hits.pop()
        if _rules.is_inplace(nm, args, kwargs):
            before = self._read_before(nm, args, kwargs)
            if before is None:
                self.inplace.append(tag)  # the operand now holds the output: not readable
                return
            if not before:
                return  # read before the call: at no kink
            kw = {k: v for k, v in kwargs.items() if k != "input"}
            args = before
            operands, params = _rules.operands_for(nm, args, kw)
            try:
                self._record(tag, nm, operands, params, args, kw, out)
            finally:
                self.checker.pinned.pop(id(args[0]), None)
                self.checker.pinned_series.pop(id(args[0]), None)
            return
        self._record(tag, nm, operands, params, args, kwargs, out)

    def _record(
        self, tag: Tag, nm: str, operands: Any, params: Any, args: tuple, kwargs: dict, out: Any
    ) -> None:
        # identity saved-tensor hooks: a non-reentrant checkpoint's own hooks would count the
        # tensors sanitize's probes save as the region's (its recomputation then differs)
        with torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
            self._record_hooked(tag, nm, operands, params, args, kwargs, out)

    def _record_hooked(
        self, tag: Tag, nm: str, operands: Any, params: Any, args: tuple, kwargs: dict, out: Any
    ) -> None:
        outs = out if isinstance(out, tuple) else (out,)
        first = outs[0] if outs else None
        if isinstance(first, torch.Tensor) and first.dtype.is_floating_point:
            if not first.requires_grad:
                return  # no gradient flows out of it (no_grad, detached inputs)
        ev = kink_event(self, tag, nm, list(operands), dict(params), {})
        if ev is None:
            return
        if ev.library is None and ev.admissible is None:
            ev = _with_value(ev, tag.op, nm, list(operands), kwargs, dict(params))
        check = None
        if ev.library is None and tag.op in _CHECKED_OPS:
            check = self.checker.check(self, nm, tag.op, args, kwargs, out)
            if check is None:
                return
        self.recorded.append((tag, ev, check))


class sanitize(explain):
    """Like :func:`gradsan.torch.explain`, and also report every kink the computation sat on
    (kind ``"kink"``: abs/relu at 0, max/min/sort/topk ties, clamp at a bound, floor/round at a
    jump, ``torch.where`` on its boundary) and every PyTorch convention outside the admissible
    set (kind ``"convention"``: atan2's ``[0, 0]`` at the origin, det's gradient at a singular
    matrix). A kink is reported only when the gradient depends on it
    (:mod:`gradsan.torch._depends`): a ``torch.where`` whose branches meet C^1 at its boundary,
    a tie of the same function or one symmetric downstream, and a kink no gradient reached are
    counted in a note instead. If it reports nothing, plain autograd returned the true
    derivative.
    Same two forms: ``with gradsan.torch.sanitize() as report:`` or ``sanitize(fn)(*args)``.
    """

    kinks = True

    def __enter__(self) -> Any:
        self.tracer = _KinkTracer(kinks=True)
        self.tracer.__enter__()
        return self.report

    def finish(self, tracer: Tracer) -> None:
        super().finish(tracer)
        paths = Namer().module_paths(list(self.modules) + tracer.roots)
        recorded = tracer.recorded if isinstance(tracer, _KinkTracer) else []
        ran = tracer.backward_calls > 0
        unchecked = isinstance(tracer, _KinkTracer) and tracer.higher_order
        places: dict[tuple, list[tuple[Tag, Kink, bool, str]]] = {}
        undone = _undone(tracer, recorded) and not unchecked
        for tag, ev, check in recorded:
            dep, why = (True, "") if check is None or unchecked else check.verdict(ran)
            if not dep and check is not None and _series_depends(tracer, check.vid):
                dep, why = True, ""  # with the later kinks at their one-sided choice
            if dep and undone:
                dep, why = False, _series.CHAIN
            w = ev.where
            k = (ev.entry_id, w.file if w else None, w.line if w else None, w.column if w else None)
            places.setdefault(k, []).append((tag, ev, dep, why))
        counts: dict[str, int] = {}
        for evals in places.values():
            kept = [(tag, ev) for tag, ev, dep, _ in evals if dep]
            if not kept:
                why = evals[0][3]
                counts[why] = counts.get(why, 0) + 1
                continue
            tag, ev = kept[0]
            self.report.findings.append(build(dataclasses.replace(ev, scope=_scope(tag, paths))))
        text = _depends.note(counts)
        if text:
            self.report.notes.append(text)
        if unchecked and recorded:
            self.report.notes.append(_depends.UNCHECKED_NOTE.format(fn=self.report.function))
        over = tracer.checker.series.over if isinstance(tracer, _KinkTracer) else 0
        if over and not unchecked:
            self.report.notes.append(_series.OVER_NOTE.format(n=over, m=_series.MAX))
        skipped = tracer.inplace if isinstance(tracer, _KinkTracer) else []
        if skipped:
            where = ", ".join(dict.fromkeys(f"{t.name} at {t.frame}" for t in skipped))
            self.report.notes.append(_depends.INPLACE_NOTE.format(n=len(skipped), where=where))
