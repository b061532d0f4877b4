"""Exact series rules of gradsan.jax.certify for convolutions, products and running choices.

Registered into ``_certify.FWD`` / ``BWD`` by the import at the bottom of ``_certify``:

* ``conv_general_dilated``: bilinear. Each pair of terms (a t^e of the lhs, b t^f of the rhs)
  gives conv(a, b) t^(e+f) by binding the primitive itself (padding, strides, dilations and
  feature / batch groups are the primitive's business, never re-implemented here); the
  reverse rule is the primitive's transpose (its VJP) with respect to one operand at the
  other's term coefficients. Truncation at the cap lowers the horizon where a dropped pair has
  a nonzero product, cancellation is judged against the magnitudes conv(|a|, |b|), and the
  horizon bound min(H_x + veff_y, H_y + veff_x) and the status codes are taken over the
  pairs that actually meet in an output element (by convolving indicator masks);
* ``cumprod`` and ``reduce_prod``: series products (``S.mul``) in a log-depth scan or tree; the
  reverse rules are exact products of the others (prefix and suffix products), never a
  division by a series that may vanish;
* ``cummax`` / ``cummin``: the running max decided per prefix by the leading terms, as the
  tournament of ``reduce_max`` decides it; a tie the rules cannot resolve (equal up to a
  horizon) leaves the element UNDEC, never a silent pick. Exact ties (identical series) split
  the cotangent equally, as ``reduce_max`` does;
* ``top_k``: the order of the leading terms, like ``sort``; positions whose element ties
  another one up to a horizon are UNDEC; identical series keep the stable order (lower index
  first, as ``lax.top_k``) and route the cotangent through it, as ``sort`` does.
"""

from __future__ import annotations

import jax
import numpy as np

from . import _certify as C
from . import _series as S
from ._certify import BWD, FWD, IntVal, _const_eval, _dense_rank, _signed_terms, _tied_to_horizon
from ._compat import bind as _bind
from ._series import DOMAIN, OK, POISON, PUNDEC, UNDEC, Series

# -- small helpers on series -------------------------------------------------------------------


def _series(x) -> Series:
    """A float series for an operand (an integer / boolean one is an exact constant)."""
    if isinstance(x, IntVal):
        s = Series.exact(np.asarray(x.x, np.float64))
        return S.flag_codes(s, x.bad) if np.count_nonzero(x.bad) else s
    return x


def _lin(s: Series, f, fH=None, fbad=None) -> Series:
    """A rearrangement applied to every part of a series (signed infinities carried along)."""
    return S.apply_linear(s, f, fH, fbad, f)


def _last(s: Series, axis: int) -> Series:
    return s if axis == len(s.shape) - 1 else _lin(s, lambda a: np.moveaxis(a, axis, -1))


def _unlast(s: Series, axis: int) -> Series:
    return s if axis == len(s.shape) - 1 else _lin(s, lambda a: np.moveaxis(a, -1, axis))


def _sl(s: Series, sl: slice) -> Series:
    return _lin(s, lambda a: a[..., sl])


def _flip(s: Series) -> Series:
    return _lin(s, lambda a: np.flip(a, -1))


def _cat(ss: list) -> Series:
    """Series concatenated along the last axis."""
    ss = [s for s in ss if s.shape[-1]]
    if len(ss) == 1:
        return ss[0]
    keys = set().union(*(s.terms for s in ss))
    terms = {
        k: np.concatenate([np.broadcast_to(s.terms.get(k, 0.0), s.shape) for s in ss], -1)
        for k in keys
    }
    H = np.concatenate([s.H for s in ss], -1)
    bad = np.concatenate([s.bad for s in ss], -1)
    out = S.mk(terms, H, bad, H.shape)
    if any(s.inf is not None for s in ss):
        out.inf = np.concatenate([S.inf_code(s) for s in ss], -1)
    return out


def _ones(shape) -> Series:
    return Series.exact(np.ones(shape))


def _choice(worst: np.ndarray) -> np.ndarray:
    """The status of a choice among values whose worst status is ``worst`` (as a comparison
    gets it: DOMAIN stays, POISON makes it PUNDEC, anything else not OK makes it UNDEC)."""
    return np.where(
        worst == DOMAIN,
        DOMAIN,
        np.where((worst == POISON) | (worst == PUNDEC), PUNDEC, np.where(worst != OK, UNDEC, OK)),
    ).astype(np.int8)


# -- conv_general_dilated ------------------------------------------------------------------------

_CONV: dict = {}


def _conv_fns(eqn, ls: tuple, rs: tuple):
    """(conv, its transpose to the lhs, its transpose to the rhs): functions of two float64
    arrays (the convolution bound as is, the transposes jitted), cached per parameters and
    shapes."""
    params = dict(eqn.params)
    if "preferred_element_type" in params:
        params["preferred_element_type"] = None  # float64 in, float64 out
    try:
        key = (tuple(sorted(params.items())), ls, rs)
        hash(key)
    except TypeError:
        key = (id(eqn), ls, rs)
    hit = _CONV.get(key)
    if hit is not None and (not isinstance(key[0], int) or hit[0] is eqn):
        return hit[1]

    def conv(a, b):
        return _bind(eqn, [a, b], params)[0]

    # (the transposes of a linear map: any point will do; zeros made inside the trace, not
    # embedded as constants)
    def t_lhs(c, b):
        return jax.vjp(lambda a: conv(a, b), jax.numpy.zeros(ls, c.dtype))[1](c)[0]

    def t_rhs(c, a):
        return jax.vjp(lambda b: conv(a, b), jax.numpy.zeros(rs, c.dtype))[1](c)[0]

    # the forward as a plain bind: it shares JAX's compiled primitive with the evaluation at x0
    fns = (conv, jax.jit(t_lhs), jax.jit(t_rhs))
    if len(_CONV) > 1000:
        _CONV.clear()
    _CONV[key] = (eqn, fns)
    return fns


def _numpy_fn(fn):
    cpu = jax.devices("cpu")[0]

    def f(a, b):
        with jax.default_device(cpu):
            return np.asarray(fn(np.asarray(a, np.float64), np.asarray(b, np.float64)), np.float64)

    return f


def _levels(a: np.ndarray, limit: int = 6):
    """The distinct finite values of a (ascending), or None where there are more than limit."""
    fin = a[np.isfinite(a)]
    if not fin.size:
        return []
    lv = np.unique(fin)
    return None if lv.size > limit else [float(x) for x in lv]


def _bound_side(B, out_shape, Hx: np.ndarray, vy: np.ndarray, swap: bool) -> np.ndarray:
    """Per output element: min over the pairs (i of x, j of y) meeting in it of H_x[i] +
    veff_y[j], through indicator masks (B of nonnegative arrays is positive exactly where some
    pair meets)."""
    H = np.full(out_shape, np.inf)
    lx, ly = _levels(Hx), _levels(vy)
    if lx == [] or ly == []:
        return H
    if lx is None or ly is None or len(lx) * len(ly) > 12:  # too many levels: the global bound
        mx, my = np.isfinite(Hx), np.isfinite(vy)
        reach = (B(my, mx) if swap else B(mx, my)) > 0
        return np.where(reach, float(Hx[mx].min()) + float(vy[my].min()), H)
    for a in lx:
        mx = (Hx == a).astype(np.float64)
        for b in ly:
            my = (vy == b).astype(np.float64)
            reach = (B(my, mx) if swap else B(mx, my)) > 0
            H = np.where(reach, np.minimum(H, a + b), H)
    return H


def _bad_side(B, out_shape, bx: np.ndarray, ones_y: np.ndarray, swap: bool) -> np.ndarray:
    bad = np.zeros(out_shape, np.int8)
    for code in np.unique(bx):
        if code == OK:
            continue
        m = (bx == code).astype(np.float64)
        reach = (B(ones_y, m) if swap else B(m, ones_y)) > 0
        bad = np.where(reach, np.maximum(bad, code), bad).astype(np.int8)
    return bad


def _bilinear(B, x: Series, y: Series, out_shape) -> Series:
    """B(x, y) for a bilinear map B of numpy arrays with nonnegative structure (a sum of
    products: B(|a|, |b|) bounds |B(a, b)| and is nonzero exactly where a pair of nonzeros
    meets): termwise, truncated at the cap (lowering the horizon where a dropped pair meets),
    cancellation judged against B(|a|, |b|), the horizon bounded by H_x + veff_y and
    H_y + veff_x over the pairs that meet, the status codes the worst of the operands'
    elements that reach the output element."""
    out_shape = tuple(out_shape)
    c_ = S.cap() - S.EPS
    acc: dict = {}
    mag: dict = {}
    H = np.full(out_shape, np.inf)
    absx = {k: np.abs(c) for k, c in x.terms.items()}
    absy = {k: np.abs(c) for k, c in y.terms.items()}
    for kx, cx in x.terms.items():
        for ky, cy in y.terms.items():
            e, j = kx[0] + ky[0], kx[1] + ky[1]
            m = B(absx[kx], absy[ky])
            if float(e) >= c_ or j > S.D:
                H = np.where(m != 0, np.minimum(H, float(e)), H)
                continue
            p = B(cx, cy)
            k = (e, j)
            if k in acc:
                acc[k] = acc[k] + p
                mag[k] = mag[k] + m
            else:
                acc[k], mag[k] = p, m
    for k in acc:
        acc[k] = S._cancel(acc[k], mag[k])
    vx, vy = S.veff(x), S.veff(y)
    if np.isfinite(x.H).any():
        H = np.minimum(H, _bound_side(B, out_shape, x.H, vy, False))
    if np.isfinite(y.H).any():
        H = np.minimum(H, _bound_side(B, out_shape, y.H, vx, True))
    bad = np.zeros(out_shape, np.int8)
    if np.count_nonzero(x.bad):
        bad = np.maximum(bad, _bad_side(B, out_shape, x.bad, np.ones(y.shape), False))
    if np.count_nonzero(y.bad):
        bad = np.maximum(bad, _bad_side(B, out_shape, y.bad, np.ones(x.shape), True))
    return S.mk(acc, H, bad, out_shape)


def _conv_fwd(ctx, eqn, ins, act):
    a, b = ins
    if isinstance(a, IntVal) and isinstance(b, IntVal):
        return _const_eval(eqn, ins), None
    a, b = _series(a), _series(b)
    conv = _conv_fns(eqn, a.shape, b.shape)[0]
    return [_bilinear(_numpy_fn(conv), a, b, eqn.outvars[0].aval.shape)], None


def _conv_bwd(ctx, eqn, ins, outs, aux, cots, need):
    a, b = (_series(x) for x in ins)
    c = cots[0]
    _, t_lhs, t_rhs = _conv_fns(eqn, a.shape, b.shape)
    res = [None, None]
    if need[0]:
        res[0] = _bilinear(_numpy_fn(t_lhs), c, b, a.shape)
    if need[1]:
        res[1] = _bilinear(_numpy_fn(t_rhs), c, a, b.shape)
    return res


FWD["conv_general_dilated"] = _conv_fwd
BWD["conv_general_dilated"] = _conv_bwd


# -- products: cumprod, reduce_prod ------------------------------------------------------------


def _scan_prod(s: Series) -> Series:
    """Inclusive products along the last axis (a log-depth scan of series products)."""
    n = s.shape[-1]
    d = 1
    while d < n:
        s = _cat([_sl(s, slice(0, d)), S.mul(_sl(s, slice(d, n)), _sl(s, slice(0, n - d)))])
        d *= 2
    return s


def _exclusive(s: Series) -> Series:
    """Products of the elements strictly before each one along the last axis (1 first)."""
    n = s.shape[-1]
    one = _ones(s.shape[:-1] + (1,))
    if n <= 1:
        return _ones(s.shape)
    return _cat([one, _scan_prod(_sl(s, slice(0, n - 1)))])


def _tree_prod(s: Series) -> Series:
    """The product over the last axis (a tree of series products); shape without it."""
    n = s.shape[-1]
    if n == 0:
        return _ones(s.shape[:-1])
    while n > 1:
        if n % 2:
            s = _cat([s, _ones(s.shape[:-1] + (1,))])
            n += 1
        s = S.mul(_sl(s, slice(0, n, 2)), _sl(s, slice(1, n, 2)))
        n //= 2
    return _lin(s, lambda a: a[..., 0])


def _cumprod_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return _const_eval(eqn, ins), None
    ax = eqn.params["axis"] % max(1, len(x.shape))
    xl = _last(x, ax)
    if eqn.params.get("reverse"):
        y = _flip(_scan_prod(_flip(xl)))
    else:
        y = _scan_prod(xl)
    return [_unlast(y, ax)], None


def _cumprod_grad(xl: Series, cl: Series) -> Series:
    """The cotangent of x for y = cumprod(x) along the last axis: x_k's is P_k z_k with P_k the
    product of the elements before k and z_k = c_k + x_(k+1) z_(k+1) (an affine recurrence,
    solved by a log-depth scan of exact series products)."""
    n = xl.shape[-1]
    if n == 0:
        return cl
    A = cl
    B = _cat([_sl(xl, slice(1, n)), Series.zeros(xl.shape[:-1] + (1,))])
    d = 1
    while d < n:
        A_head = S.add(
            _sl(A, slice(0, n - d)), S.rmul(_sl(A, slice(d, n)), _sl(B, slice(0, n - d)))
        )
        B_head = S.mul(_sl(B, slice(0, n - d)), _sl(B, slice(d, n)))
        A = _cat([A_head, _sl(A, slice(n - d, n))])
        B = _cat([B_head, _sl(B, slice(n - d, n))])
        d *= 2
    return S.rmul(A, _exclusive(xl))


def _cumprod_bwd(ctx, eqn, ins, outs, aux, cots, need):
    x = ins[0]
    ax = eqn.params["axis"] % max(1, len(x.shape))
    xl, cl = _last(x, ax), _last(cots[0], ax)
    if eqn.params.get("reverse"):
        g = _flip(_cumprod_grad(_flip(xl), _flip(cl)))
    else:
        g = _cumprod_grad(xl, cl)
    return [_unlast(g, ax)]


FWD["cumprod"] = _cumprod_fwd
BWD["cumprod"] = _cumprod_bwd


def _prod_layout(shape: tuple, axes: tuple):
    """(to, back): the reduced axes moved last and flattened into one, and the inverse."""
    nd = len(shape)
    axes = tuple(sorted(a % nd for a in axes))
    keep = [i for i in range(nd) if i not in axes]
    perm = keep + list(axes)
    rest = tuple(shape[i] for i in keep)
    n = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    mid = rest + tuple(shape[a] for a in axes)
    inv = np.argsort(perm)

    def to(a):
        return np.reshape(np.transpose(a, perm), rest + (n,))

    def back(a):
        return np.transpose(np.reshape(a, mid), inv)

    return to, back, rest, n


def _reduce_prod_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return _const_eval(eqn, ins), None
    to, _, _, _ = _prod_layout(x.shape, tuple(eqn.params["axes"]))
    return [_tree_prod(_lin(x, to))], None


def _reduce_prod_bwd(ctx, eqn, ins, outs, aux, cots, need):
    x = ins[0]
    to, back, rest, n = _prod_layout(x.shape, tuple(eqn.params["axes"]))
    xl = _lin(x, to)
    others = S.mul(_exclusive(xl), _flip(_exclusive(_flip(xl))))  # no division
    c = _lin(cots[0], lambda a: np.broadcast_to(np.reshape(a, rest + (1,)), rest + (n,)))
    return [_lin(S.rmul(c, others), back)]


FWD["reduce_prod"] = _reduce_prod_fwd
BWD["reduce_prod"] = _reduce_prod_bwd


# -- running choices: cummax, cummin -----------------------------------------------------------


def _segments(R: np.ndarray):
    """(start index, segment id) per element of the runs of equal values along the last axis."""
    n = R.shape[-1]
    new = np.ones(R.shape, bool)
    new[..., 1:] = R[..., 1:] != R[..., :-1]
    idx = np.broadcast_to(np.arange(n), R.shape)
    start = np.maximum.accumulate(np.where(new, idx, 0), axis=-1)
    return start, np.cumsum(new, axis=-1)


def _seg_count(ind: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Per element: how many elements of its run, up to itself, are in ``ind`` (exact ints)."""
    ind = ind.astype(np.int64)
    cs = np.cumsum(ind, axis=-1)
    base = np.take_along_axis(cs - ind, start, axis=-1)
    return cs - base


def _running_choice(xl: Series, big: bool):
    """The running max (big) or min along the last axis, decided per prefix by the leading
    terms as ``_tournament`` decides a max: (source index of each output (a candidate),
    candidate mask (j is a candidate of its own prefix), count of candidates per prefix,
    segment ids, undecided mask)."""
    shape = xl.shape
    sgn = 1.0 if big else -1.0
    st = [(e, sgn * np.broadcast_to(c, shape)) for e, c in _signed_terms(xl)]
    exps = sorted({e for e, _ in st} | {0.0})
    H = xl.H
    undec = np.zeros(shape, bool)
    rank = np.zeros(shape, np.int64)
    R = rank
    for e in exps:
        start, _ = _segments(R)
        ind = rank == R
        cnt = _seg_count(ind, start)
        beyond = _seg_count(ind & (H <= e + S.EPS), start)
        undec |= (beyond > 0) & (cnt > 1)
        rank = _dense_rank([c for ee, c in st if ee <= e], shape)
        R = np.maximum.accumulate(rank, axis=-1)
    start, segid = _segments(R)
    ind = rank == R
    cnt = _seg_count(ind, start)
    undec |= (_seg_count(ind & np.isfinite(H), start) > 0) & (cnt > 1)
    return start, ind, cnt, segid, undec


def _seg_rscan(a: np.ndarray, segid: np.ndarray, op) -> np.ndarray:
    """Reverse inclusive scan with ``op`` within the runs of equal segid (last axis)."""
    a = np.array(a, copy=True)
    n = a.shape[-1]
    d = 1
    while d < n:
        same = segid[..., d:] == segid[..., :-d]
        a[..., :-d] = np.where(same, op(a[..., :-d], a[..., d:]), a[..., :-d])
        d *= 2
    return a


def _cummax_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return _const_eval(eqn, ins), None
    big = eqn.primitive.name == "cummax"
    ax = eqn.params["axis"] % max(1, len(x.shape))
    rev = bool(eqn.params.get("reverse"))
    xl = _last(x, ax)
    if rev:
        xl = _flip(xl)
    if xl.shape[-1] == 0:
        return [x], None
    start, ind, cnt, segid, undec = _running_choice(xl, big)

    def take(a):
        return np.take_along_axis(np.broadcast_to(a, xl.shape), start, axis=-1)

    y = _lin(xl, take)
    worst = np.maximum.accumulate(xl.bad, axis=-1)
    y = S.flag_codes(S.flag_codes(y, _choice(worst)), np.where(undec, UNDEC, OK))
    if rev:
        y = _flip(y)
    return [_unlast(y, ax)], (ind, cnt, segid, undec)


def _cummax_bwd(ctx, eqn, ins, outs, aux, cots, need):
    x = ins[0]
    ax = eqn.params["axis"] % max(1, len(x.shape))
    rev = bool(eqn.params.get("reverse"))
    cl = _last(cots[0], ax)
    if rev:
        cl = _flip(cl)
    if aux is None:
        return [cots[0]]
    ind, cnt, segid, undec = aux
    c = S.scale(cl, 1.0 / cnt)  # an exact tie of identical series: shared equally
    terms, mags = {}, {}
    for k, a in c.terms.items():
        terms[k] = np.where(ind, _seg_rscan(a, segid, np.add), 0.0)
        mags[k] = np.where(ind, _seg_rscan(np.abs(a), segid, np.add), 0.0)
        terms[k] = S._cancel(terms[k], mags[k])
    H = np.where(ind, _seg_rscan(np.broadcast_to(c.H, cl.shape), segid, np.minimum), np.inf)
    bad = np.where(ind, _seg_rscan(np.broadcast_to(c.bad, cl.shape), segid, np.maximum), OK)
    # an undecided choice at i: its cotangent could go to any element up to i
    und = undec & ~np.broadcast_to(S.exact_zero(cl), cl.shape)
    und = np.flip(np.logical_or.accumulate(np.flip(und, -1), axis=-1), -1)
    g = S.flag(S.mk(terms, H, bad, cl.shape), und, UNDEC)
    if rev:
        g = _flip(g)
    return [_unlast(g, ax)]


for _n in ("cummax", "cummin"):
    FWD[_n] = _cummax_fwd
    BWD[_n] = _cummax_bwd


# -- top_k -----------------------------------------------------------------------------------


def _top_k_axis(eqn, ndim: int) -> int:
    ax = eqn.params.get("axis", -1)
    return (ax if ax is not None else -1) % max(1, ndim)


def _top_k_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return _const_eval(eqn, ins), None
    k = int(eqn.params["k"])
    ax = _top_k_axis(eqn, len(x.shape))
    xl = _last(x, ax)
    shape = xl.shape
    keys = [(e, -np.broadcast_to(c, shape)) for e, c in _signed_terms(xl)]  # descending
    if keys:
        order = np.lexsort([c for _, c in keys][::-1], axis=-1)  # stable: lower index first
    else:
        order = np.broadcast_to(np.arange(shape[-1]), shape)
    perm = order[..., :k]
    und = _tied_to_horizon(xl, keys)
    worst = np.max(xl.bad, axis=-1, keepdims=True) if shape[-1] else np.zeros(shape[:-1] + (1,))
    codes = np.maximum(
        _choice(np.broadcast_to(worst, perm.shape)),
        np.where(np.take_along_axis(und, perm, axis=-1), UNDEC, OK),
    ).astype(np.int8)

    def take(a):
        return np.take_along_axis(np.broadcast_to(a, shape), perm, axis=-1)

    vals = S.flag_codes(_lin(xl, take), codes)
    idx_dt = np.dtype(eqn.outvars[1].aval.dtype)
    idx = IntVal(np.moveaxis(perm.astype(idx_dt), -1, ax), np.moveaxis(codes, -1, ax))
    return [_unlast(vals, ax), idx], (perm, codes)


def _top_k_bwd(ctx, eqn, ins, outs, aux, cots, need):
    x = ins[0]
    c = cots[0]
    if not need[0] or c is None:
        return [None]
    perm, codes = aux
    ax = _top_k_axis(eqn, len(x.shape))
    shape = _last(x, ax).shape
    cl = _last(c, ax)

    def scatter(fill):
        def f(a):
            out = np.full(shape, fill, dtype=np.asarray(a).dtype)
            np.put_along_axis(out, perm, np.broadcast_to(a, perm.shape), axis=-1)
            return out

        return f

    g = S.apply_linear(cl, scatter(0.0), scatter(np.inf), scatter(0))
    und = np.where(np.broadcast_to(S.exact_zero(cl), perm.shape), OK, codes).astype(np.int8)
    g = S.flag_codes(g, scatter(0)(und))
    return [_unlast(g, ax)]


FWD["top_k"] = _top_k_fwd
BWD["top_k"] = _top_k_bwd


# -- bookkeeping in _certify: pure primitives (one evaluation per ray for a repeated equation)
# and the evaluation at x0 (products and convolutions are smooth: no singular point of their
# own; cummax / cummin / top_k are kinks where they tie)

C._PURE.update({"conv_general_dilated", "cumprod", "reduce_prod", "cummax", "cummin", "top_k"})
C._PLAIN.update({"conv_general_dilated", "cumprod", "reduce_prod"})
C._KINKY.add("top_k")
from . import _certify_pool  # noqa: E402,F401
