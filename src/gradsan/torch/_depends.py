"""Whether a PyTorch gradient depends on a kink: sanitize's G2 both ways, the torch side.

The same decisions as :mod:`gradsan.jax._depends`, made on PyTorch's live autograd graph (a
``with`` block cannot be re-run, so everything is read while the step runs):

- at a kink operation's call (the forward pass), its operands' and its output's tangents along
  a few random directions of the leaves that require grad are computed by a double
  vector-Jacobian product on the graph built so far (``u -> J^T u`` differentiated in ``u``);
  from them ``delta``, the one-sided output tangent of the operation along ``±d`` minus the one
  PyTorch's rule gives (for a jump, the one-sided value minus PyTorch's value; for a
  ``torch.where`` on its comparison's boundary, the other branch's value and tangent minus the
  selected one's);
- a hook on the operation's output keeps the cotangent the backward pass brings there; the
  image of ``delta`` at the loss is their inner product. A kink is a finding when one image is
  non-zero; otherwise it is counted: the same function on both sides (``delta`` is 0: a
  ``torch.where`` whose branches meet C^1, a max of two equal functions), no effect on the loss
  (the positive and negative parts of the image cancel: a tie symmetric downstream), or no
  gradient reached it.

What cannot be decided so (an in-place kink, a graph without double backward, a condition
combined from several comparisons, indices of a tied sort that stay in use, a jump whose value
image vanishes, no backward run) stays a finding.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import weakref
from typing import Any

import numpy as np
import torch

from .._catalog.entries.kinks import activation_corners, activation_jumps
from ._compat import in_functorch
from ._rules import COMPARISONS, activation_params, clamp_bounds, is_inplace, to_numpy

DIRECTIONS = 2
_EPS = 64 * float(np.finfo(np.float32).eps)
CANCEL = 1e-4  # |L(d+) + L(d-)| below this share of |L(d+)| + |L(d-)|: cancelled to rounding
TINY = 1e-30

SAME = "same function"
NO_EFFECT = "no effect on the loss"
NO_GRADIENT = "no gradient reached it"

CHECKED_NOTE = (
    "{n} kink(s) or tie(s) checked and left out: the gradient does not depend on the choice "
    "there ({why})"
)

UNCHECKED_NOTE = (
    "{fn} differentiates a gradient (create_graph=True): its kinks are listed without checking "
    "whether its gradient depends on them"
)

INPLACE_NOTE = (
    "{n} in-place call(s) not checked for a kink: the call overwrote its input before "
    "gradsan could read it ({where}); call it out of place (inplace=False, or relu/clamp "
    "instead of relu_/clamp_) to check it"
)

_JUMPS: dict[str, Any] = {"floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc}
_CMP: dict[str, Any] = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}


@dataclasses.dataclass(eq=False)
class Check:
    """One kink evaluation: its ``delta``s (None: undecided) and the cotangents its output got."""

    deltas: list[tuple[np.ndarray, bool]] | None
    out: weakref.ref | None = None
    grads: list[torch.Tensor] = dataclasses.field(default_factory=list)
    indices: weakref.ref | None = None  # a tied sort's integer output whose order changed

    def verdict(self, backward_ran: bool) -> tuple[bool, str]:
        """(depends, reason left out)."""
        if self.deltas is None:
            return True, ""
        if not any(np.any(d != 0) for d, _ in self.deltas):
            return False, SAME
        if self.indices is not None and self.indices() is not None:
            return True, ""  # the tied order may be read through the indices
        if not backward_ran:
            return True, ""
        if not self.grads:
            return False, NO_GRADIENT
        for delta, jump in self.deltas:
            if not np.any(delta != 0):
                continue
            if jump:
                return True, ""  # a value jump times a vanishing factor is still a kink
            for g in self.grads:
                gn = _np(g)
                try:
                    gn = np.broadcast_to(gn, delta.shape)
                except ValueError:
                    return True, ""
                with np.errstate(all="ignore"):
                    lp = float(np.sum(gn * np.maximum(delta, 0.0)))
                    ln = float(np.sum(gn * np.minimum(delta, 0.0)))
                tot = abs(lp + ln)
                if not math.isfinite(tot) or (tot > TINY and tot > CANCEL * (abs(lp) + abs(ln))):
                    return True, ""
        return False, NO_EFFECT


def _keep(t: Any) -> Any:
    return t


def _np(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to(torch.float64).cpu().numpy()
    if t is None:
        return np.zeros(())
    return np.asarray(t, np.float64)


def _clean(delta: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``delta`` with the elements that are float32 rounding of ``a - b`` set to 0."""
    a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    d = np.broadcast_to(np.asarray(delta, np.float64), a.shape).copy()
    return np.where(np.abs(d) <= _EPS * (np.abs(a) + np.abs(b)), 0.0, d)


def _grad_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.requires_grad and v.dtype.is_floating_point


def _leaves(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The leaves requiring grad that ``tensors`` were computed from."""
    out: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    stack = []
    for t in tensors:
        if t.grad_fn is None:
            out[id(t)] = t
        else:
            stack.append(t.grad_fn)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        v = getattr(n, "variable", None)
        if isinstance(v, torch.Tensor):
            out.setdefault(id(v), v)
            continue
        stack.extend(m for m, _ in n.next_functions if m is not None)
    return list(out.values())


def unwrapped_grad(*args: Any, **kwargs: Any) -> Any:
    """``torch.autograd.grad`` itself, under any wrapper (``gradsan run`` counts and checks the
    user's backward calls through its own: these probes are none of them)."""
    return inspect.unwrap(torch.autograd.grad)(*args, **kwargs)


class Checker:
    """Records the checks of one sanitize session (see the module docstring)."""

    def __init__(self) -> None:
        self.dirs: dict[int, tuple[weakref.ref, list[torch.Tensor]]] = {}
        self.gen = torch.Generator().manual_seed(15)
        self.cmps: dict[int, tuple[weakref.ref, str, Any, Any]] = {}
        self.probing = False
        # an in-place kink call's operand, copied before the call (torch/_sanitize.py's
        # pre_call): id of the copy -> (the copy, its tangents read before the call)
        self.pinned: dict[int, tuple[torch.Tensor, list[np.ndarray]]] = {}

    # -- inputs --------------------------------------------------------------------------------
    def note_comparison(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """A comparison's operands, for a ``torch.where`` that selects on its output."""
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            return
        a = args[0] if args else kwargs.get("input")
        b = args[1] if len(args) > 1 else kwargs.get("other")
        if _grad_tensor(a) or _grad_tensor(b):
            self.cmps[id(out)] = (weakref.ref(out), COMPARISONS[name], a, b)

    def _directions(self, leaves: list[torch.Tensor], j: int) -> list[torch.Tensor]:
        got = []
        for leaf in leaves:
            hit = self.dirs.get(id(leaf))
            if hit is None or hit[0]() is not leaf:
                ds = [
                    torch.randn(leaf.shape, generator=self.gen, dtype=torch.float64).to(leaf.dtype)
                    for _ in range(DIRECTIONS)
                ]
                hit = (weakref.ref(leaf), ds)
                self.dirs[id(leaf)] = hit
            got.append(hit[1][j])
        return got

    def tangents(self, values: list[Any]) -> list[list[np.ndarray]] | None:
        """Per direction, the tangent (float64) of each of ``values`` (0 for a constant; a
        pinned copy's were read before an in-place call overwrote its original)."""
        pins = {id(v): self.pinned[id(v)][1] for v in values if id(v) in self.pinned}
        if pins:
            rest = [v for v in values if id(v) not in pins]
            if any(_grad_tensor(v) for v in rest):
                rows = self.tangents(rest)
            else:
                rows = [[np.zeros(np.shape(_np(v))) for v in rest] for _ in range(DIRECTIONS)]
            if rows is None:
                return None
            res = []
            for j, row in enumerate(rows):
                it = iter(row)
                res.append([pins[id(v)][j] if id(v) in pins else next(it) for v in values])
            return res
        live = [v for v in values if _grad_tensor(v)]
        if not live:
            return None
        leaves = _leaves(live)
        if not leaves:
            return None
        res = []
        self.probing = True
        try:
            # identity saved-tensor hooks: a non-reentrant checkpoint's own hooks would count
            # the probes' saved tensors as the region's (its recomputation then differs)
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
                # one J^T u pass (u -> J^T u is linear), differentiated once per direction
                us = [torch.zeros_like(v, requires_grad=True) for v in live]
                gs = unwrapped_grad(
                    live, leaves, grad_outputs=us, create_graph=True, allow_unused=True
                )
                for j in range(DIRECTIONS):
                    dirs = self._directions(leaves, j)
                    pairs = [(g, d) for g, d in zip(gs, dirs) if g is not None and g.requires_grad]
                    js: tuple[torch.Tensor | None, ...] = (None,) * len(us)
                    if pairs:
                        js = unwrapped_grad(
                            [g for g, _ in pairs],
                            us,
                            grad_outputs=[d for _, d in pairs],
                            retain_graph=j < DIRECTIONS - 1,
                            allow_unused=True,
                        )
                    by_id = {id(v): t for v, t in zip(live, js)}
                    row = []
                    for v in values:
                        if _grad_tensor(v):
                            t = by_id[id(v)]
                            row.append(np.zeros(tuple(v.shape)) if t is None else _np(t))
                        else:
                            row.append(np.zeros(np.shape(_np(v))))
                    res.append(row)
        finally:
            self.probing = False
        return res

    def pin(self, x: torch.Tensor) -> torch.Tensor | None:
        """A copy of ``x`` with its tangents, read now: before an in-place call overwrites
        it (None: no tangent to read)."""
        tans = self.tangents([x])
        if tans is None:
            return None
        copy = x.detach().clone().requires_grad_(True)
        self.pinned[id(copy)] = (copy, [row[0] for row in tans])
        return copy

    def watch(self, out: torch.Tensor, check: Check) -> None:
        """Keep the cotangents the backward pass brings to ``out``."""
        check.out = weakref.ref(out)

        def hook(g: torch.Tensor) -> None:
            if not self.probing:
                check.grads.append(g)  # no torch op here: the dispatch mode would see it

        out.register_hook(hook)

    # -- one kink --------------------------------------------------------------------------------
    def check(
        self, tracer: Any, name: str, op: str, args: tuple, kwargs: dict, out: Any
    ) -> Check | None:
        """The check of one kink call (None: no gradient leaves it)."""
        outs = out if isinstance(out, tuple) else (out,)
        fout = outs[0] if outs and isinstance(outs[0], torch.Tensor) else None
        if fout is None or not fout.dtype.is_floating_point or not fout.requires_grad:
            return None  # no gradient flows through it
        undecided = Check(None)
        inplace = name.endswith("_") or is_inplace(name, args, kwargs)
        if inplace and args and id(args[0]) in self.pinned:
            inplace = False  # its operand was read before the call
        if inplace or getattr(tracer, "_dmode_on", False) or in_functorch():
            return undecided  # in place, recomputed in backward, a transform's tensors
        try:
            with np.errstate(all="ignore"):
                deltas, idx = self._deltas(name, op, args, kwargs, outs)
        except Exception:  # a graph without double backward, an unread operand: undecided
            deltas, idx = None, None
        c = Check(deltas, indices=idx)
        if deltas is not None:
            self.watch(fout, c)
        return c

    def _deltas(self, name: str, op: str, args: tuple, kwargs: dict, outs: tuple) -> Any:
        a = list(args)
        out = outs[0]
        if op == "select_n":
            return self._where(a, kwargs, out), None
        if op in ("floor", "ceil", "round"):
            return self._jump(name, a, kwargs, out), None
        if op in ("abs", "relu"):
            x = a[0] if a else kwargs.get("input")
            tans = self.tangents([x, out])
            if tans is None:
                return None, None
            xn = _np(x)
            mask = xn == 0
            res = []
            for tx, tout in tans:
                for s in (1.0, -1.0):
                    os = np.abs(s * tx) if op == "abs" else np.maximum(s * tx, 0.0)
                    res.append(_delta(mask, os, s * tout))
            return res, None
        if op in ("max", "min") or (op in ("reduce_max", "reduce_min") and _elementwise(a, kwargs)):
            x = a[0] if a else kwargs.get("input")
            y = a[1] if len(a) > 1 else kwargs.get("other")
            tans = self.tangents([x, y, out])
            if tans is None:
                return None, None
            xn, yn = np.broadcast_arrays(_np(x), _np(y))
            mask = xn == yn
            use_min = op in ("min", "reduce_min")
            res = []
            for tx, ty, tout in tans:
                tx, ty = np.broadcast_arrays(tx, ty)
                for s in (1.0, -1.0):
                    os = np.minimum(s * tx, s * ty) if use_min else np.maximum(s * tx, s * ty)
                    res.append(_delta(mask, os, s * tout))
            return res, None
        if op == "clamp":
            return self._clamp(name, a, kwargs, out), None
        if op == "activation":
            return self._activation(name, a, kwargs, out), None
        if op in ("reduce_max", "reduce_min"):
            return self._reduce(op, a, kwargs, outs)
        if op in ("sort", "top_k"):
            return self._sort(op, a, kwargs, outs)
        return None, None

    def _where(self, a: list, kwargs: dict, out: torch.Tensor) -> list | None:
        cond = a[0] if a else kwargs.get("condition")
        x = a[1] if len(a) > 1 else kwargs.get("input")
        y = a[2] if len(a) > 2 else kwargs.get("other")
        hit = self.cmps.get(id(cond)) if isinstance(cond, torch.Tensor) else None
        if hit is None or hit[0]() is not cond:
            return None  # a condition combined from several comparisons: not decided here
        _, prim, lhs, rhs = hit
        tans = self.tangents([lhs, rhs, x, y])
        if tans is None:
            return None
        shape = tuple(out.shape)
        pred = np.broadcast_to(_np(cond).astype(bool), shape)
        ln, rn = (np.broadcast_to(_np(v), shape) for v in (lhs, rhs))
        with np.errstate(all="ignore"):
            mask = ln == rn
        v1, v0 = (np.broadcast_to(_np(v), shape) for v in (x, y))  # True selects x
        fn = _CMP.get(prim)
        res = []
        for tl, tr, tx, ty in tans:
            for s in (1.0, -1.0):
                dlt = np.broadcast_to(s * (tl - tr), shape)
                if fn is not None:
                    side = np.where(dlt != 0, fn(dlt, 0.0), ~pred)  # undecided: the other one
                else:  # == / !=: moving either way leaves the equality
                    side = np.broadcast_to(np.asarray(prim == "!="), shape)
                t1, t0 = (np.broadcast_to(s * t, shape) for t in (tx, ty))
                v_sel, v_side = np.where(pred, v1, v0), np.where(side, v1, v0)
                t_sel, t_side = np.where(pred, t1, t0), np.where(side, t1, t0)
                dv = _clean(np.where(mask, v_side - v_sel, 0.0), v_side, v_sel)
                dt = _clean(np.where(mask, t_side - t_sel, 0.0), t_side, t_sel)
                res.append((dv, True))
                res.append((dt, False))
        return res

    def _jump(self, name: str, a: list, kwargs: dict, out: torch.Tensor) -> list | None:
        """floor/ceil/round/trunc at a jump: the one-sided value minus PyTorch's (the tangent
        is 0 on both sides); both sides where a direction does not move the operand."""
        x = a[0] if a else kwargs.get("input")
        fn = _JUMPS.get(name.split(".")[-1].lstrip("_").rstrip("_"))
        if fn is None or not isinstance(x, torch.Tensor) or kwargs.get("decimals"):
            return None
        tans = self.tangents([x])
        if tans is None:
            return None
        xn = _np(x)
        eps = float(torch.finfo(x.dtype).eps)
        base = fn(xn)
        res = []
        for (tx,) in tans:
            tx = np.broadcast_to(tx, xn.shape)
            for s in (1.0, -1.0):
                step = np.sign(s * tx)
                step = np.where(step == 0, s, step)
                v = fn(xn + step * 4 * eps * np.maximum(np.abs(xn), 1.0))
                res.append((np.where(v != base, v - base, 0.0), True))
        return res

    def _clamp(self, name: str, a: list, kwargs: dict, out: torch.Tensor) -> list | None:
        x, lo, hi = clamp_bounds(name, a, kwargs)  # positional or by keyword
        tans = self.tangents([x, lo, hi, out])
        if tans is None:
            return None
        shape = tuple(out.shape)
        lob = None if lo is None else np.broadcast_to(_np(lo), shape)
        hib = None if hi is None else np.broadcast_to(_np(hi), shape)
        # at a bound in the operand's own dtype, as PyTorch compares (clamp(x, 0.1, 1) in
        # float32 sits on 0.1f, which is not the float64 0.1)
        xe = np.broadcast_to(np.asarray(to_numpy(x)), shape)
        at_lo = None if lob is None else xe == lob.astype(xe.dtype)
        at_hi = None if hib is None else xe == hib.astype(xe.dtype)
        mask = np.zeros(shape, bool)
        if at_lo is not None:
            mask |= at_lo
        if at_hi is not None:
            mask |= at_hi
        res = []
        for tx, tlo, thi, tout in tans:
            tx, tlo, thi = (np.broadcast_to(t, shape) for t in (tx, tlo, thi))
            for s in (1.0, -1.0):
                os = s * tx
                if at_lo is not None:
                    os = np.where(at_lo, np.maximum(os, s * tlo), os)
                if at_hi is not None:
                    os = np.where(at_hi, np.minimum(os, s * thi), os)
                res.append(_delta(mask, os, s * tout))
        return res

    def _activation(self, name: str, a: list, kwargs: dict, out: torch.Tensor) -> list | None:
        """A fused activation at a corner: the one-sided slope (the catalog's) times the
        operand's tangent, minus the output tangent PyTorch's rule gives (a slope PyTorch drew,
        rrelu's in training, is the one its rule gives: that side's delta is 0). At a jump
        (hardshrink, threshold): the one-sided limit minus PyTorch's value, as floor's."""
        x = a[0] if a else kwargs.get("input")
        params = activation_params(name, [x, *a[1:]], kwargs)
        corners = activation_corners(params["fn"], params)
        jumps = activation_jumps(params["fn"], params)
        tans = self.tangents([x, out])
        if tans is None:
            return None
        xn = _np(x)
        xe = np.asarray(to_numpy(x))  # compared with the corners in its own dtype (0.1f)
        outn = np.broadcast_to(_np(out), xn.shape)
        res = []
        for tx, tout in tans:
            tx = np.broadcast_to(tx, xn.shape)
            tout = np.broadcast_to(tout, xn.shape)
            for s in (1.0, -1.0):
                t = s * tx
                ad = s * tout
                mask = np.zeros(xn.shape, bool)
                os = np.zeros(xn.shape)
                for c, left, right in corners:
                    at = xe == c
                    mask |= at
                    lt = ad if left is None else np.asarray(left) * t
                    rt = ad if right is None else np.asarray(right) * t
                    os = np.where(at, np.where(t > 0, rt, lt), os)
                res.append(_delta(mask, os, ad))
                if jumps:
                    dv = np.zeros(xn.shape)
                    up = np.where(t == 0, s > 0, t > 0)  # no move: both sides, one per sign
                    for c, lim_left, lim_right in jumps:
                        lim = np.where(up, lim_right, lim_left)
                        dv = np.where(xe == c, lim - outn, dv)
                    res.append((np.where(dv != 0, dv, 0.0), True))
        return res

    def _reduce(self, op: str, a: list, kwargs: dict, outs: tuple) -> Any:
        """max/min/amax/amin over a dimension (or all): the one-sided tangent is the max (min)
        of the tied entries' tangents."""
        x = a[0] if a else kwargs.get("input")
        dim = kwargs.get("dim", a[1] if len(a) > 1 else None)
        out = outs[0]
        tans = self.tangents([x, out])
        if tans is None:
            return None, None
        xn = _np(x)
        axes = (
            tuple(range(xn.ndim))
            if dim is None
            else tuple(d % max(xn.ndim, 1) for d in ((dim,) if isinstance(dim, int) else dim))
        )
        use_min = op == "reduce_min"
        ext = (np.min if use_min else np.max)(xn, axis=axes, keepdims=True)
        tied = xn == ext
        res = []
        moved = False
        for tx, tout in tans:
            for s in (1.0, -1.0):
                t = s * tx
                if use_min:
                    os = np.min(np.where(tied, t, np.inf), axis=axes)
                else:
                    os = np.max(np.where(tied, t, -np.inf), axis=axes)
                os = os.reshape(np.shape(tout))
                d = _clean(os - s * tout, os, s * tout)
                moved = moved or bool(np.any(d != 0))
                res.append((d, False))
        idx = _int_out(outs) if moved else None
        return res, idx

    def _sort(self, op: str, a: list, kwargs: dict, outs: tuple) -> Any:
        """sort / topk: along a direction tied entries come out in the order of their tangents;
        the values output is the operand's tangent permuted so."""
        x = a[0] if a else kwargs.get("input")
        out = outs[0]
        if op == "top_k":
            k = int(kwargs.get("k", a[1] if len(a) > 1 else 1))
            dim = kwargs.get("dim", a[2] if len(a) > 2 else -1)
            desc = bool(kwargs.get("largest", a[3] if len(a) > 3 else True))
        else:
            dim = kwargs.get("dim", a[1] if len(a) > 1 and isinstance(a[1], int) else -1)
            desc = bool(kwargs.get("descending", a[2] if len(a) > 2 else False))
            k = None
        tans = self.tangents([x, out])
        if tans is None:
            return None, None
        xn = _np(x)
        if xn.ndim == 0:
            return [], None
        axis = int(dim) % xn.ndim
        xm = np.moveaxis(xn, axis, -1)
        sgn = -1.0 if desc else 1.0
        iota = np.broadcast_to(np.arange(xm.shape[-1]), xm.shape)
        res = []
        moved = False
        for tx, tout in tans:
            tm = np.moveaxis(np.broadcast_to(tx, xn.shape), axis, -1)
            for s in (1.0, -1.0):
                order = np.lexsort((iota, sgn * s * tm, sgn * xm), axis=-1)
                if k is not None:
                    order = order[..., :k]
                os = np.moveaxis(np.take_along_axis(s * tm, order, -1), -1, axis)
                ad = s * np.asarray(tout).reshape(os.shape)
                d = _clean(os - ad, os, ad)
                moved = moved or bool(np.any(d != 0))
                res.append((d, False))
        return res, (_int_out(outs) if moved else None)


def _delta(mask: np.ndarray, os: np.ndarray, ad: np.ndarray) -> tuple[np.ndarray, bool]:
    os = np.broadcast_to(os, np.shape(ad))
    m = np.broadcast_to(mask, os.shape)
    return _clean(np.where(m, os - ad, 0.0), os, ad), False


def _elementwise(a: list, kwargs: dict) -> bool:
    """torch.max(a, b) / torch.min(a, b): the elementwise form."""
    other = a[1] if len(a) > 1 else kwargs.get("other")
    return isinstance(other, torch.Tensor)


def _int_out(outs: tuple) -> weakref.ref | None:
    """The integer output of a (values, indices) result, while the user may still read it."""
    for o in outs[1:]:
        if isinstance(o, torch.Tensor) and not o.dtype.is_floating_point:
            return weakref.ref(o)
    return None


def note(counts: dict[str, int]) -> str | None:
    n = sum(counts.values())
    if not n:
        return None
    why = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    return CHECKED_NOTE.format(n=n, why=why)
