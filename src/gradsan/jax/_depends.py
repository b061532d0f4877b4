"""Whether the gradient depends on a kink: sanitize's G2 both ways.

A kink, tie or jump that a program sat on changes the gradient only when the derivative's
one-sided values there differ from JAX's, and the difference reaches the output. For every
recorded kink and a few random input directions ``d`` (both signs) this computes, on the host,
``delta``: the one-sided output tangent of the kink's operation along ``±d`` minus the tangent
JAX's rule gives (for a jump, the one-sided value minus JAX's value; for a ``where`` on its
boundary, the other branch's value and tangent minus the selected one's). One more pass of the
program, linearized in a vector ``eps`` injected as ``out + eps_c * delta_c`` at the kink's
output, gives the image of every ``delta`` at the function's outputs. A kink is a finding when
one image is non-zero; zero images are counted (same function, symmetric downstream, no
gradient through it).

Each ``delta`` is split into its positive and negative parts, and an image counts as zero when
the two parts cancel to rounding (a sort tie whose tied outputs are symmetric downstream), so
a small kink among large smooth terms is never lost to a relative tolerance.

Calls with a custom derivative rule (``custom_jvp`` / ``custom_vjp``: relu, logaddexp,
projection_simplex) are evaluated with their rule, as AD does: the kinks of their primal are
no kinks of the gradient. The rule itself is checked at the point, by its tangents at ``x`` and
at ``x ± h t``; where they differ (relu at 0) the call is the kink, with that difference as its
``delta``.

This runs only at a detected tie (the compiled screen counted one), never on a clean step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from .._catalog._masks import windows as _windows
from . import _activations
from ._compat import bind as _bind
from ._rules import is_float
from .interpreter import to_numpy as _np

if TYPE_CHECKING:
    from ._sanitize import Kink

_EPS = 64 * float(np.finfo(np.float32).eps)
SUB = "substitute"  # a probe item that replaces an integer output (an index, a cast) instead
CANCEL = 1e-4  # |L(d+) + L(d-)| below this share of |L(d+)| + |L(d-)|: cancelled to rounding


@dataclasses.dataclass(eq=False)
class Probe:
    """One injected perturbation: ``delta`` added at output ``out`` of the evaluation at
    ``key`` (a first-order equation, a library call or a custom-rule call)."""

    cand: int  # index of the candidate it tests
    combo: int  # 2 * direction + (0 for +d, 1 for -d)
    key: tuple
    out: int
    delta: np.ndarray
    jump: bool = False  # a difference of values (the function jumps), not of slopes


@dataclasses.dataclass
class Verdict:
    """For one candidate: whether the gradient depends on it, and why not when it does not."""

    depends: bool
    reason: str = ""  # "same function", "no effect on the output", "undecided"


# -- one-sided tangents of the kink operations ---------------------------------------------


def _f(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64)


def _clean(delta: np.ndarray, a: Any, b: Any) -> np.ndarray:
    """``delta`` with the elements that are rounding of ``a - b`` set to 0."""
    a, b = np.broadcast_arrays(_f(a), _f(b))
    d = np.broadcast_to(_f(delta), a.shape).copy()
    return np.where(np.abs(d) <= _EPS * (np.abs(a) + np.abs(b)), 0.0, d)


def float_args(invals: list) -> list[int]:
    return [i for i, v in enumerate(invals) if is_float(v)]


def rule_jvp(eqn: Any, invals: list, tans: list) -> list[np.ndarray | None]:
    """Output tangents of one equation (its own derivative rule) for operand tangents
    ``tans`` (None: no tangent); None for an output with no tangent (integers)."""
    fi = [i for i in float_args(invals) if tans[i] is not None]
    vals = [jnp.asarray(v) for v in invals]

    def f(*xs: Any) -> list:
        full = list(vals)
        for i, x in zip(fi, xs):
            full[i] = x
        outs = _bind(eqn, full)
        return [o if is_float(o) else jnp.zeros((), jnp.float32) for o in outs]

    prim = [vals[i] for i in fi]
    tng = [jnp.asarray(tans[i], vals[i].dtype) for i in fi]
    try:
        _, touts = jax.jvp(f, prim, tng)
    except TypeError:  # custom_vjp: no forward mode; the Jacobian by reverse mode
        outs = f(*prim)
        touts = []
        for j, o in enumerate(outs):
            jac = jax.jacrev(lambda *xs, j=j: f(*xs)[j], argnums=tuple(range(len(fi))))(*prim)
            t = np.zeros(np.shape(o))
            for jj, tv in zip(jac, tng):
                jj = _np(jj).reshape(np.size(o), -1)
                t = t + (jj @ _np(tv).reshape(-1)).reshape(np.shape(o))
            touts.append(t)
    outs0 = _bind(eqn, vals)
    return [_f(t) if is_float(o) else None for t, o in zip(touts, outs0)]


def _ad(k: Kink, tans: list) -> list[np.ndarray | None]:
    return rule_jvp(k.eqn, list(k.invals or []), tans)


def one_sided(k: Kink, tans: list[np.ndarray], sel_tans: list | None) -> list | None:
    """[(output index, delta)] for the direction whose operand tangents are ``tans``: the
    one-sided output tangent (value, for a jump) minus JAX's; None when the kink cannot be
    decided this way (the finding stays)."""
    op = k.op
    mask = np.asarray(k.mask, bool)
    ops = k.operands
    t = [_f(x) for x in tans]
    if op == "where":
        return _where(k, t, sel_tans)
    if op in ("argmax", "argmin"):
        return _argext(k, t)
    if op == "trunc":  # a float -> int cast at an integer: the one-sided cast replaces it
        res = _jump(k, t)
        return None if res is None else [(j, _f(v), SUB) for j, v, _ in res]
    if op == "atan2":
        return _atan2(k, t)
    if op == "eigh":
        return _eigh(k, t)
    if op == "svd":
        return _svd(k, t)
    if k.eqn.primitive.name in ("pjit", "jit"):  # a library call: clamp, hypot
        return _library(k, t)
    if op in ("floor", "ceil", "round", "sign"):
        return _jump(k, t)
    ad = _ad(k, list(tans))
    if ad[0] is None:
        return None
    if op == "abs":
        os = np.abs(t[0])
    elif op == "i0e":  # i0e'(x) = i1e(x) - sign(x) i0e(x); at 0 (i0e = 1, i1e = 0): -|t|
        os = -np.abs(t[0])
    elif op in ("relu", "max", "min"):
        a, b = np.broadcast_arrays(t[0], t[1])
        os = np.maximum(a, b) if op != "min" else np.minimum(a, b)
    elif op == "clamp":
        lo, x, hi = ops
        tlo, tx, thi = np.broadcast_arrays(t[0], t[1], t[2])
        shape = tx.shape
        lo, x, hi = (np.broadcast_to(v, shape) for v in (lo, x, hi))
        os = np.where(x == lo, np.maximum(tx, tlo), tx)
        os = np.where(x == hi, np.minimum(os, thi), os)
    elif op in ("reduce_max", "reduce_min"):
        x = ops[0]
        axes = tuple(a % x.ndim for a in k.params.get("axes", ()))
        use_min = op == "reduce_min"
        ext = (np.min if use_min else np.max)(x, axis=axes, keepdims=True)
        tied = x == ext
        if use_min:
            os = np.min(np.where(tied, t[0], np.inf), axis=axes)
        else:
            os = np.max(np.where(tied, t[0], -np.inf), axis=axes)
    elif op in ("cummax", "cummin"):
        os = _cum(k, t[0])
    elif op in ("reduce_window_max", "reduce_window_min"):
        use_min = op.endswith("min")
        w = _windows(ops[0], k.params, np.inf if use_min else -np.inf)
        wt = _windows(t[0], k.params, 0.0)
        ext = w.min(-1) if use_min else w.max(-1)
        tied = w == ext[..., None]
        os = np.where(tied, wt, np.inf).min(-1) if use_min else np.where(tied, wt, -np.inf).max(-1)
    elif op in ("sort", "top_k"):
        return _sort(k, t, ad)
    else:
        return None
    os = np.broadcast_to(os, np.shape(ad[0]))
    d = np.where(np.broadcast_to(mask, os.shape), os - ad[0], 0.0)
    return [(0, _clean(d, os, ad[0]))]


def _cum(k: Kink, tx: np.ndarray) -> np.ndarray:
    x = k.operands[0]
    axis = k.params.get("axis", 0) % x.ndim
    xm, tm = np.moveaxis(x, axis, -1), np.moveaxis(tx, axis, -1)
    rev = bool(k.params.get("reverse"))
    if rev:
        xm, tm = xm[..., ::-1], tm[..., ::-1]
    use_min = k.op == "cummin"
    run = (np.minimum if use_min else np.maximum).accumulate(xm, axis=-1)
    n = xm.shape[-1]
    lower = np.arange(n)[None, :] <= np.arange(n)[:, None]
    tied = (xm[..., None, :] == run[..., :, None]) & lower
    if use_min:
        os = np.where(tied, tm[..., None, :], np.inf).min(-1)
    else:
        os = np.where(tied, tm[..., None, :], -np.inf).max(-1)
    if rev:
        os = os[..., ::-1]
    return np.moveaxis(os, -1, axis)


def _sort(k: Kink, t: list[np.ndarray], ad: list) -> list | None:
    """sort / top_k: along the direction, tied entries come out in the order of their
    tangents (stable); every output is its operand permuted so."""
    eqn = k.eqn
    x0 = k.operands[0]
    if k.op == "top_k":
        axis = eqn.params.get("axis", -1)
        axis = -1 % x0.ndim if axis is None else axis % x0.ndim
        kk = int(eqn.params["k"])
        x = np.moveaxis(x0, axis, -1)
        tx = np.moveaxis(t[0], axis, -1)
        iota = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
        order = np.lexsort((iota, -tx, -x), axis=-1)[..., :kk]
        base = np.lexsort((iota, -x), axis=-1)[..., :kk]
        os = np.moveaxis(np.take_along_axis(tx, order, -1), -1, axis)
        d = _clean(os - ad[0], os, ad[0])
        res: list = [(0, d)]
        if np.any(order != base) and len(eqn.outvars) > 1 and not _dropped(eqn.outvars[1]):
            res.append((1, np.moveaxis(order, -1, axis).astype(np.int64), SUB))  # the indices
        return res
    if int(eqn.params.get("num_keys", 1)) != 1:
        return None
    axis = eqn.params.get("dimension", -1) % x0.ndim
    x = np.moveaxis(x0, axis, -1)
    tx = np.moveaxis(t[0], axis, -1)
    iota = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    order = np.lexsort((iota, tx, x), axis=-1)
    base = np.lexsort((iota, x), axis=-1)
    out: list = []
    for j, (tj, adj) in enumerate(zip(t, ad)):
        if adj is None:
            if np.any(order != base) and not _dropped(eqn.outvars[j]):
                xj = np.moveaxis(np.broadcast_to(k.operands[j], x0.shape), axis, -1)
                alt = np.moveaxis(np.take_along_axis(xj, order, -1), -1, axis)
                out.append((j, alt, SUB))  # argsort: the permuted integer operand
            continue
        tm = np.moveaxis(tj, axis, -1)
        os = np.moveaxis(np.take_along_axis(tm, order, -1), -1, axis)
        out.append((j, _clean(os - adj, os, adj)))
    return out


def _dropped(v: Any) -> bool:
    return type(v).__name__ == "DropVar"


def _jump(k: Kink, t: list[np.ndarray]) -> list | None:
    """floor, ceil, round, sign at a jump: the one-sided value minus JAX's (the tangent is 0
    on both sides). Where the direction does not move the operand, both sides are tried. (For
    a float -> int cast the caller substitutes the one-sided value: ``base + delta``.)"""
    x = k.operands[0]
    if not is_float(x):
        return None
    mask = np.asarray(k.mask, bool)
    tx = np.broadcast_to(t[0], x.shape)
    base = _f(_bind(k.eqn, [jnp.asarray(x)])[0])
    eps = float(np.finfo(x.dtype).eps)
    out = []
    for s in (np.sign(tx),) if np.all(tx[mask] != 0) else (np.ones_like(tx), -np.ones_like(tx)):
        nudge = x + (s * 4 * eps * np.maximum(np.abs(x), 1)).astype(x.dtype)
        v = _f(_bind(k.eqn, [jnp.asarray(nudge)])[0])
        if k.op == "trunc":
            alt = np.where(mask, v, base)
            if not np.array_equal(alt, base):
                out.append((0, alt, True))
        else:
            out.append((0, np.where(mask, v - base, 0.0), True))
    return out


def _argext(k: Kink, t: list[np.ndarray]) -> list | None:
    """argmax / argmin at a tie: along the direction the tied entry whose tangent is largest
    (smallest) wins (the first of equal ones, as JAX's); that index is substituted."""
    x = k.operands[0]
    axes = tuple(a % x.ndim for a in k.eqn.params.get("axes", ()))
    if len(axes) != 1 or not is_float(x):
        return None
    ax = axes[0]
    use_min = k.op == "argmin"
    ext = (np.min if use_min else np.max)(x, axis=ax, keepdims=True)
    tied = x == ext
    tx = np.broadcast_to(t[0], x.shape)
    if use_min:
        alt = np.argmin(np.where(tied, tx, np.inf), axis=ax)
    else:
        alt = np.argmax(np.where(tied, tx, -np.inf), axis=ax)
    base = np.argmax(tied, axis=ax)  # JAX's: the first tied entry
    if np.array_equal(alt, base):
        return []  # the tied entries move alike: the same choice
    return [(0, alt.astype(np.int64), SUB)]


def _atan2(k: Kink, t: list[np.ndarray]) -> list | None:
    """atan2 at the origin: along a ray the angle is constant, atan2(t_y, t_x); the one-sided
    value minus JAX's is a jump, and the tangent along the ray (0) minus JAX's a kink."""
    y, x = k.operands[:2]
    mask = np.asarray(k.mask, bool)
    ty, tx = np.broadcast_arrays(t[0], t[1])
    shape = np.shape(mask)
    ty, tx = np.broadcast_to(ty, shape), np.broadcast_to(tx, shape)
    moved = (ty != 0) | (tx != 0)
    base = np.broadcast_to(_f(_bind(k.eqn, [jnp.asarray(v) for v in k.invals or [y, x]])[0]), shape)
    side = np.arctan2(ty, tx)
    dv = np.where(mask & moved, side - base, 0.0)
    ad = _ad(k, list(t))
    res: list = [(0, _clean(dv, side, base), True)]
    if ad[0] is not None:
        adt = np.broadcast_to(ad[0], shape)
        res.append((0, np.where(mask & np.isfinite(adt), -adt, 0.0)))
    return res


def _clusters(w: np.ndarray, tol: float) -> list[list[int]]:
    """Runs of (sorted) values within ``tol`` of their neighbour, of length > 1."""
    order = np.argsort(w)
    out: list[list[int]] = []
    cur = [int(order[0])]
    for a, b in zip(order[:-1], order[1:]):
        if abs(float(w[b]) - float(w[a])) <= tol:
            cur.append(int(b))
        else:
            if len(cur) > 1:
                out.append(cur)
            cur = [int(b)]
    if len(cur) > 1:
        out.append(cur)
    return out


def _rotation(n: int, seed: int) -> np.ndarray:
    """A random rotation of n dimensions (fixed seed)."""
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def _times(rot: np.ndarray, left: bool = False) -> Callable[[Any], Any]:
    """``v -> v @ rot`` (``rot^T @ v`` for ``left``): the other basis of a degenerate
    eigenspace, applied to the traced output so its tangent turns with it."""
    r = jnp.asarray(rot)

    def f(v: Any) -> Any:
        rr = r.astype(v.dtype)
        return jnp.swapaxes(rr, -1, -2) @ v if left else v @ rr

    return f


def _eigh(k: Kink, t: list[np.ndarray]) -> list | None:
    """eigh at a repeated eigenvalue. The eigenvalues of a cluster ``S`` move along ``dA`` as
    the sorted eigenvalues of ``V_S^T dA V_S`` (JAX's rule: its diagonal); the eigenvectors of
    ``S`` are any rotation of ``V_S``: an infinitesimal one, ``V_S A`` (A antisymmetric), is
    their probe (no effect on the output: the output does not depend on the choice)."""
    a = _f(k.operands[0])
    if a.ndim < 2 or a.shape[-1] != a.shape[-2] or len(k.eqn.outvars) != 2:
        return None
    outs = _bind(k.eqn, [jnp.asarray(v) for v in (k.invals or [a])])
    v, w = _f(outs[0]), _f(outs[1])
    ad = _ad(k, list(t))
    if ad[1] is None:
        return None
    ta = np.broadcast_to(t[0], a.shape)
    ta = 0.5 * (ta + np.swapaxes(ta, -1, -2))
    n = a.shape[-1]
    dw = np.zeros(w.shape)
    rot = np.broadcast_to(np.eye(n), a.shape).copy()
    for b in np.ndindex(*a.shape[:-2]):
        wb, vb = w[b], v[b]
        tol = 16 * n * float(np.finfo(np.float32).eps) * max(float(np.max(np.abs(wb))), 1e-30)
        for c in _clusters(wb, tol):
            srt = np.sort(np.asarray(c))
            vs = vb[:, srt]
            p = vs.T @ ta[b] @ vs
            dw[b + (srt,)] = np.linalg.eigvalsh(p) - _f(ad[1])[b + (srt,)]
            rot[b + np.ix_(srt, srt)] = _rotation(len(c), 15 + len(c))
    res: list = [(1, _clean(dw, dw, 0.0))]
    if not _dropped(k.eqn.outvars[0]):
        res.append((0, _times(rot), SUB))
    return res


def _svd(k: Kink, t: list[np.ndarray]) -> list | None:
    """svd at a repeated non-zero singular value: the cluster moves along ``dA`` as the sorted
    (descending) eigenvalues of sym(``U_S^T dA V_S``) (JAX's rule: its diagonal); the singular
    vectors by a rotation, probed on ``U`` and on ``V^T`` each. A repeated zero singular value
    is not decided here (the finding stays)."""
    a = _f(k.operands[0])
    if a.ndim < 2:
        return None
    outs = _bind(k.eqn, [jnp.asarray(x) for x in (k.invals or [a])])
    s = _f(outs[0])
    uv = len(outs) >= 3 and bool(k.eqn.params.get("compute_uv", True))
    if uv:
        u, vt = _f(outs[1]), _f(outs[2])
    else:
        full = np.linalg.svd(a, full_matrices=False)
        u, vt = full[0], full[2]
    ad = _ad(k, list(t))
    if ad[0] is None:
        return None
    ta = np.broadcast_to(t[0], a.shape)
    n = s.shape[-1]
    ds = np.zeros(s.shape)
    k_ = s.shape[-1]
    rot = np.broadcast_to(np.eye(k_), s.shape[:-1] + (k_, k_)).copy()
    for b in np.ndindex(*a.shape[:-2]):
        sb = s[b]
        tol = 16 * n * float(np.finfo(np.float32).eps) * max(float(np.max(np.abs(sb))), 1e-30)
        for c in _clusters(sb, tol):
            if float(np.min(np.abs(sb[c]))) <= tol:
                return None  # a repeated zero singular value
            srt = np.sort(np.asarray(c))
            us, vs = u[b][:, srt], vt[b][srt, :].T
            p = us.T @ ta[b] @ vs
            ds[b + (srt,)] = (
                np.sort(np.linalg.eigvalsh(0.5 * (p + p.T)))[::-1] - _f(ad[0])[b + (srt,)]
            )
            rot[b + np.ix_(srt, srt)] = _rotation(len(c), 15 + len(c))
    res: list = [(0, _clean(ds, ds, 0.0))]
    if uv:  # U -> U R and V^T -> R^T V^T on the cluster's columns (rows)
        ku, kv = u.shape[-1], vt.shape[-2]
        ru = np.broadcast_to(np.eye(ku), u.shape[:-2] + (ku, ku)).copy()
        rv = np.broadcast_to(np.eye(kv), vt.shape[:-2] + (kv, kv)).copy()
        ru[..., :k_, :k_] = rot
        rv[..., :k_, :k_] = rot
        res += [(1, _times(ru), SUB), (2, _times(rv, left=True), SUB)]
    return res


def _library(k: Kink, t: list[np.ndarray]) -> list | None:
    """jnp.clip (clamp in lax order), jnp.hypot and jax.nn's piecewise activations, reported
    as the call."""
    ad = rule_jvp(k.eqn, list(k.invals or []), list(t))
    if ad[0] is None:
        return None
    mask = np.asarray(k.mask, bool)
    if k.op == "clamp":  # call operands (x, lo, hi); k.operands in lax order (lo, x, hi)
        lo, x, hi = k.operands
        tx, tlo, thi = np.broadcast_arrays(t[0], t[1], t[2])
        shape = tx.shape
        lo, x, hi = (np.broadcast_to(v, shape) for v in (lo, x, hi))
        os = np.where(x == lo, np.maximum(tx, tlo), tx)
        os = np.where(x == hi, np.minimum(os, thi), os)
    elif k.op == "hypot":
        a, b = np.broadcast_arrays(t[0], t[1])
        os = np.hypot(a, b)
    elif k.op == "activation":  # jax.nn.leaky_relu, elu, ...: the slope of the side moved to
        os = _activations.one_sided(k, t[0])
    else:
        return None
    os = np.broadcast_to(os, np.shape(ad[0]))
    d = np.where(np.broadcast_to(mask, os.shape), os - ad[0], 0.0)
    return [(0, _clean(d, os, ad[0]))]


def _where(k: Kink, t: list[np.ndarray], sel_tans: list | None) -> list | None:
    """A select on its comparison's boundary: the side the direction moves to, from the
    comparison's operand tangents ``t``; the other branch's value and tangent there minus the
    selected one's (values: a jump; tangents: a kink)."""
    if sel_tans is None or k.cases is None or k.pred is None or len(k.cases) != 2:
        return None
    mask = np.asarray(k.mask, bool)
    shape = mask.shape
    dlt = np.broadcast_to(t[0] - t[1], shape)
    cmp = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}
    fn = cmp.get(k.prim)
    pred = np.broadcast_to(np.asarray(k.pred).astype(bool), shape)
    if fn is not None:
        side = np.where(dlt != 0, fn(dlt, 0.0), ~pred)  # undecided: the other branch
    else:  # == / !=: moving either way leaves the equality
        side = np.broadcast_to(np.asarray(k.prim == "!="), shape)
    v0, v1 = (np.broadcast_to(_f(c), shape) for c in k.cases)
    t0, t1 = (np.broadcast_to(_f(x), shape) for x in sel_tans[1:3])
    v_sel, v_side = np.where(pred, v1, v0), np.where(side, v1, v0)
    t_sel, t_side = np.where(pred, t1, t0), np.where(side, t1, t0)
    dv = _clean(np.where(mask, v_side - v_sel, 0.0), v_side, v_sel)
    dt = _clean(np.where(mask, t_side - t_sel, 0.0), t_side, t_sel)
    return [(0, dv, True), (0, dt)]


def custom_delta(eqn: Any, invals: list, tans: list[np.ndarray]) -> list | None:
    """A call with a custom derivative rule: the limit of its rule's output tangent at
    ``x + h t`` (h -> 0+) minus its tangent at ``x``, per output. Two steps tell a jump of the
    rule (the difference stays) from its curvature (the difference shrinks with h); all zero
    where the rule is smooth at the point."""
    fi = float_args(invals)
    if not fi:
        return []
    xs = [_f(invals[i]) for i in fi]
    ts = [_f(tans[i]) for i in fi]
    tmax = max(float(np.max(np.abs(x))) if np.size(x) else 0.0 for x in ts)
    if tmax == 0.0:
        return []
    scale = max(1.0, max(float(np.max(np.abs(x))) if np.size(x) else 0.0 for x in xs))
    t0 = rule_jvp(eqn, invals, list(tans))
    steps = []
    for h in (1e-2 * scale / tmax, 1e-3 * scale / tmax):
        moved = list(invals)
        for i, x, tv in zip(fi, xs, ts):
            moved[i] = jnp.asarray(x + h * tv, jnp.asarray(invals[i]).dtype)
        steps.append(rule_jvp(eqn, moved, list(tans)))
    out = []
    for j, b in enumerate(t0):
        a1, a2 = steps[0][j], steps[1][j]
        if a1 is None or a2 is None or b is None:
            continue
        d1, d2 = a1 - b, a2 - b
        ref = float(np.max(np.abs(b))) if np.size(b) else 0.0
        noise = _EPS * (np.abs(a2) + np.abs(b)) + 1e-6 * ref
        jump = (np.abs(d2) > 0.5 * np.abs(d1)) & (np.abs(d2) > noise)
        out.append((j, np.where(jump, d2, 0.0)))
    return out


def _of_directed(closed: Any, flat_args: list, fi: list[int]) -> tuple[Callable[..., Any], list]:
    """The user's function of the arguments at ``fi`` (the others held at ``flat_args``): its
    float outputs raveled into one float32 vector; and the arguments as arrays."""
    base = [jnp.asarray(a) for a in flat_args]

    def f(*xs: Any) -> Any:
        full = list(base)
        for i, x in zip(fi, xs):
            full[i] = x
        outs = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *full)
        flat = [jnp.ravel(o).astype(jnp.float32) for o in outs if is_float(o)]
        return jnp.concatenate(flat) if flat else jnp.zeros((0,), jnp.float32)

    return f, base


def stepped(
    closed: Any, flat_args: list, dirs: list[list]
) -> list[tuple[float, float, float]] | None:
    """The user's function, differentiated by AD just off the point: for each direction ``d``
    and sign ``s``, ``|jvp(x + s h d; s d) - s jvp(x; d)|`` at two steps h (the one-sided
    derivative minus AD's value, and its curvature part) and the size of the derivative. For a
    piecewise smooth function the first tends to the difference between the one-sided
    derivative and AD's as h -> 0+. None when the function cannot be differentiated so."""
    fi = [i for i in range(len(flat_args)) if dirs and dirs[0][i] is not None]
    if not fi:
        return None
    f, base = _of_directed(closed, flat_args, fi)

    jvp = jax.jit(lambda p, t: jax.jvp(f, p, t)[1])
    xs = [base[i] for i in fi]
    xmax = max(1.0, max(float(jnp.max(jnp.abs(x))) if x.size else 0.0 for x in xs))
    res = []
    try:
        for d in dirs:
            ts = [jnp.asarray(d[i], base[i].dtype) for i in fi]
            dmax = max(float(jnp.max(jnp.abs(t))) if t.size else 0.0 for t in ts)
            if dmax == 0.0:
                res += [(0.0, 0.0, 0.0)] * 2
                continue
            a = np.asarray(jvp(xs, ts), np.float64)
            for s in (1.0, -1.0):
                es = []
                mag = float(np.max(np.abs(a))) if a.size else 0.0
                for h in (1e-3 * xmax / dmax, 1e-4 * xmax / dmax):
                    moved = [x + (s * h) * t for x, t in zip(xs, ts)]
                    b = np.asarray(jvp(moved, [s * t for t in ts]), np.float64)
                    es.append(float(np.max(np.abs(b - s * a))) if a.size else 0.0)
                    mag = max(mag, float(np.max(np.abs(b))) if b.size else 0.0)
                res.append((es[1], es[0], mag))
    except Exception:  # a function AD cannot take off the point: not decided so
        return None
    return res


# -- the injection pass -----------------------------------------------------------------------


def images(
    closed: Any,
    flat_args: list,
    probes: list[Probe],
    interp: Callable[[dict, Any], Any],
) -> np.ndarray:
    """(2, n_probes): the size of the image at the function's outputs of each probe's
    positive and negative part."""
    m = len(probes)
    inject: dict[tuple, list] = {}
    for c, p in enumerate(probes):
        pos, neg = np.maximum(p.delta, 0.0), np.minimum(p.delta, 0.0)
        inject.setdefault(p.key, []).append((p.out, 2 * c, pos))
        inject.setdefault(p.key, []).append((p.out, 2 * c + 1, neg))

    def g(eps: Any) -> Any:
        outs = interp(inject, eps)
        flat = [jnp.ravel(o).astype(jnp.float32) for o in outs if is_float(o)]
        return jnp.concatenate(flat) if flat else jnp.zeros((0,), jnp.float32)

    eps0 = jnp.zeros((2 * m,), jnp.float32)
    try:
        out0 = g(eps0)
        if out0.size <= 2 * m:
            jac = jax.jacrev(g)(eps0)
        else:
            jac = jax.jacfwd(g)(eps0)
    except TypeError:  # forward mode through a custom_vjp
        jac = jax.jacrev(g)(eps0)
    j = np.asarray(jac, np.float64).reshape(-1, 2 * m)
    return j


def verdicts(jac: np.ndarray, probes: list[Probe], n: int, undecided: set) -> list[Verdict]:
    """Per candidate: depends when one probe's image is non-zero and not a cancellation."""
    out = []
    for c in range(n):
        if c in undecided:
            out.append(Verdict(True, "undecided"))
            continue
        mine = [i for i, p in enumerate(probes) if p.cand == c]
        if not any(np.any(probes[i].delta != 0) for i in mine):
            out.append(Verdict(False, "same function"))
            continue
        dep = False
        for i in mine:
            lp, ln = jac[:, 2 * i], jac[:, 2 * i + 1]
            tot = np.max(np.abs(lp + ln)) if lp.size else 0.0
            parts = (np.max(np.abs(lp)) + np.max(np.abs(ln))) if lp.size else 0.0
            if not np.isfinite(tot) or (tot > 0 and tot > CANCEL * parts):
                dep = True
                break
        out.append(Verdict(dep, "" if dep else "no effect on the output"))
    return out


def coupled(
    jac: np.ndarray, probes: list[Probe], verdict: list[Verdict], steps: list | None
) -> bool:
    """Whether the kinks the injection found are undone together: each was seen to change the
    output by ``|L(delta)|`` along some direction, yet the user's function differentiated just
    off the point along that direction agrees with AD's value to well below that (ELU's two
    selects, one inside the other's untaken branch). Needs every such effect clearly above
    float32 rounding of the derivative, so a small kink among large smooth terms stays."""
    if not steps:
        return False
    eff: dict[int, float] = {}
    for i, p in enumerate(probes):
        if not verdict[p.cand].depends or verdict[p.cand].reason == "undecided":
            continue
        v = float(np.max(np.abs(jac[:, 2 * i] + jac[:, 2 * i + 1]))) if jac.size else 0.0
        if p.jump and v > 0:
            return False  # the function jumps: no derivative off the point undoes that
        eff[p.combo] = max(eff.get(p.combo, 0.0), v)
    if not any(v > 0 for v in eff.values()):
        return False
    for combo, j in eff.items():
        if j == 0.0:
            continue
        if combo >= len(steps):
            return False
        e_small, e_big, mag = steps[combo]
        if not (j >= 1e3 * _EPS * mag and e_small <= 0.1 * j and e_small <= 0.5 * e_big + 0.1 * j):
            return False
    return True


def disagrees(steps: list | None) -> bool:
    """Whether the function's derivative just off the point differs from AD's value there by
    more than its curvature and rounding explain: a one-sided derivative that is not AD's."""
    if not steps:
        return False
    for e_small, e_big, mag in steps:
        if e_small > 1e3 * _EPS * mag and e_small > 0.5 * e_big:
            return True
    return False


def inject(outs: list, key: tuple, table: dict, eps: Any) -> list:
    """``outs`` with the table's perturbations at ``key`` added."""
    for out_i, col, delta in table.get(key, ()):
        o = outs[out_i]
        outs[out_i] = o + (eps[col] * jnp.asarray(delta, jnp.float32)).astype(o.dtype)
    return outs


def inner_smooth(closed: Any, flat_args: list, dirs: list[list]) -> str | None:
    """For a function that runs a backward pass of its own and whose derivative the caller
    takes (``jax.hessian(f)``: the inner gradient ``jax.jacrev(f)``): whether it is
    differentiable at the point along ``dirs`` (both signs), numerically. ``"jump"`` when its
    value moves by more than rounding as the step shrinks tenfold (a jump: no derivative there),
    ``"kink"`` when AD's derivative just off the point differs from AD's value at it by more
    than curvature explains (a one-sided derivative that is not AD's), ``"smooth"`` when
    neither; None when it cannot be evaluated so."""
    fi = [i for i in range(len(flat_args)) if dirs and dirs[0][i] is not None]
    if not fi:
        return None
    f, base = _of_directed(closed, flat_args, fi)

    value = jax.jit(f)
    xs = [base[i] for i in fi]
    xmax = max(1.0, max(float(jnp.max(jnp.abs(x))) if x.size else 0.0 for x in xs))
    try:
        v0 = np.asarray(value(*xs), np.float64)
        mag = max(1.0, float(np.max(np.abs(v0)))) if v0.size else 1.0
        for d in dirs:
            ts = [jnp.asarray(d[i], base[i].dtype) for i in fi]
            dmax = max(float(jnp.max(jnp.abs(t))) if t.size else 0.0 for t in ts)
            if dmax == 0.0:
                continue
            for s in (1.0, -1.0):
                moves = []
                for h in (1e-3 * xmax / dmax, 1e-4 * xmax / dmax):
                    v = np.asarray(value(*[x + (s * h) * t for x, t in zip(xs, ts)]), np.float64)
                    moves.append(float(np.max(np.abs(v - v0))) if v0.size else 0.0)
                if moves[1] > 1e3 * _EPS * mag and moves[1] > 0.5 * moves[0]:
                    return "jump"
        if disagrees(stepped(closed, flat_args, dirs)):
            return "kink"
    except Exception:  # a function that cannot be evaluated off the point: not decided
        return None
    return "smooth"
