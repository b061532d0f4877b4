"""certify's rules for reductions with a choice: reduce_max/min, argmax/argmin, sort,
cummax/cummin, top_k and max/min pooling."""

from __future__ import annotations

import functools
import types

import jax
import numpy as np

from ..._compat import bind as _bind
from .. import _series as S
from .._registry import BWD, FWD, KINKY, PURE
from .._series import OK, POISON, UNDEC, Series, Undecided
from .._values import IntVal, _choice, _flip, _last, _lin, _unlast, const_eval

# -- reductions with a choice: reduce_max/min, argmax/argmin, sort -----------------------------


def _signed_terms(x: Series):
    """[(exponent, signed coefficient array)] in dominance order: lexicographic order of these
    is the order of the values as t -> 0+."""
    return [(float(k[0]), x.terms[k] * (-1.0 if k[1] % 2 else 1.0)) for k in x.keys()]


def _tournament(x: Series, axes: tuple, big: bool):
    """Candidates (bool, x's shape) for the max (big) or min over axes, undecided mask (reduced
    shape, keepdims), and the ``inf`` codes of the result (reduced shape, or None).

    A signed infinity takes part as in :func:`_cmp_sign`: one of the winning sign (+inf for the
    max) wins, whatever else is there but an undefined element; one of the losing sign drops
    out when the group has an element finite for each t (for a hard infinity: ``-inf`` masks) or
    a bounded one (for a soft one)."""
    shape = x.shape
    red = functools.partial(np.any, axis=axes, keepdims=True)
    cand = np.ones(shape, bool)
    inf_out = None
    if x.inf is not None:
        ia, sg, hard = S.inf_parts(x)
        win = ia & (sg > 0 if big else sg < 0)
        lose = ia & (sg < 0 if big else sg > 0)
        fin, bnd = red(x.bad == OK), red(S.bounded(x))
        lose &= np.where(hard, np.broadcast_to(fin, shape), np.broadcast_to(bnd, shape))
        has_win = np.broadcast_to(red(win), shape)
        cand = np.where(has_win, win, ~lose)
        nan = S.nan_mask(x) | ((x.bad != OK) & (x.bad != POISON))
        undec = np.broadcast_to(red(np.where(has_win, nan, cand & (x.bad != OK))), shape).copy()
        wred = np.any(win, axis=axes)
        if wred.any():
            inf_out = S.inf_make(wred, 1 if big else -1, np.any(win & hard, axis=axes))
        if has_win.all():
            return cand, np.any(undec, axis=axes), inf_out
    else:
        undec = np.broadcast_to(red(x.bad != OK), shape).copy()
    keys = _signed_terms(x)
    exps = sorted({e for e, _ in keys} | {0.0})
    byexp: dict = {}
    for e, c in keys:
        byexp.setdefault(e, []).append(c)
    for e in exps:
        count = np.sum(cand, axis=axes, keepdims=True)
        beyond = np.any(cand & (x.H <= e + S.EPS), axis=axes, keepdims=True)
        undec |= np.broadcast_to(beyond & (count > 1), shape)
        for c in byexp.get(e, []):
            c = np.broadcast_to(c, shape)
            masked = np.where(cand, c, -np.inf if big else np.inf)
            best = (np.max if big else np.min)(masked, axis=axes, keepdims=True)
            cand &= c == best
    count = np.sum(cand, axis=axes, keepdims=True)
    inexact = np.any(cand & np.isfinite(x.H), axis=axes, keepdims=True)
    undec |= np.broadcast_to(inexact & (count > 1), shape)
    return cand, np.any(undec, axis=axes), inf_out


def _reduce_max_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return const_eval(eqn, ins), None
    axes = tuple(eqn.params["axes"])
    big = eqn.primitive.name == "reduce_max"
    if any(x.shape[a] == 0 for a in axes):  # the max of nothing is -inf (the min, +inf)
        shape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
        out = S.with_inf(Series.zeros(shape), np.full(shape, -S.HARD if big else S.HARD))
        return [out], (np.zeros(x.shape), np.zeros(shape, bool))
    cand, und, inf = _tournament(x, axes, big)
    w = cand / np.sum(cand, axis=axes, keepdims=True)
    out = S.apply_linear(
        S.scale(S.restrict(x, cand) if x.inf is not None else x, w),
        lambda a: np.sum(a, axis=axes),
        lambda h: np.min(np.where(cand, h, np.inf), axis=axes),
        lambda b: np.max(b, axis=axes),
    )
    if inf is not None:
        out = S.with_inf(out, inf)
    return [S.flag(out, und, UNDEC)], (w, und)


def _reduce_max_bwd(ctx, eqn, ins, outs, aux, cots, need):
    w, und = aux
    axes = tuple(eqn.params["axes"])
    shape = ins[0].shape
    exp_shape = [1 if i in axes else n for i, n in enumerate(shape)]
    c = S.apply_linear(cots[0], lambda a: np.broadcast_to(np.reshape(a, exp_shape), shape))
    c = S.flag(S.scale(c, w), np.broadcast_to(np.reshape(und, exp_shape), shape), UNDEC)
    return [c]


for _n in ("reduce_max", "reduce_min"):
    FWD[_n] = _reduce_max_fwd
    BWD[_n] = _reduce_max_bwd


def _argmax_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return const_eval(eqn, ins), None
    axes = tuple(eqn.params["axes"])
    cand, und, _ = _tournament(x, axes, eqn.primitive.name == "argmax")
    idx = np.argmax(cand, axis=axes[0])
    return [IntVal(idx.astype(np.dtype(eqn.params["index_dtype"])), np.where(und, UNDEC, OK))], None


for _n in ("argmax", "argmin"):
    FWD[_n] = _argmax_fwd


def _dense_rank(keys: list, shape: tuple) -> np.ndarray:
    """Per row (last axis): the dense rank of each element in the lexicographic order of
    ``keys`` (most significant first); equal tuples get equal ranks."""
    n = shape[-1]
    if not keys or n == 0:
        return np.zeros(shape, np.int64)
    flat = [np.broadcast_to(k, shape).reshape(-1, n) for k in keys]
    order = np.lexsort(flat[::-1], axis=-1)
    new = np.zeros(flat[0].shape, bool)
    for k in flat:
        sk = np.take_along_axis(k, order, axis=-1)
        new[:, 1:] |= sk[:, 1:] != sk[:, :-1]
    rk = np.cumsum(new, axis=-1)
    rank = np.empty_like(rk)
    np.put_along_axis(rank, order, rk, axis=-1)
    return rank.reshape(shape)


_LEVELS_MAX = 8


def _tied_to_horizon(xl: Series, keys: list) -> np.ndarray:
    """Elements whose order against some other element is undecided: equal in every known term
    below the smaller of their horizons (a finite one). ``keys``: [(exponent, coefficients)]
    in dominance order."""
    shape = xl.shape
    H = np.broadcast_to(xl.H, shape)
    und = np.zeros(shape, bool)
    fin = np.isfinite(H)
    if not fin.any() or shape[-1] < 2:
        return und
    lv = np.unique(H[fin])
    if lv.size > _LEVELS_MAX:  # conservative: everything tied at the lowest horizon
        plan = [(float(lv[0]), fin)]
    else:
        plan = [(float(h), H <= h + S.EPS) for h in lv]
    n = shape[-1]
    for h, short in plan:
        rank = _dense_rank([c for e, c in keys if e < h - S.EPS], shape).reshape(-1, n)
        rows = np.arange(rank.shape[0])[:, None] * n
        gid = (rows + rank).ravel()
        count = np.bincount(gid, minlength=rank.size)
        has = np.bincount(gid, weights=short.reshape(-1).astype(np.float64), minlength=rank.size)
        und |= ((count[gid] >= 2) & (has[gid] > 0)).reshape(shape)
    return und


def _sort_fwd(ctx, eqn, ins, act):
    dim = eqn.params["dimension"]
    nk = eqn.params.get("num_keys", 1)
    keys = ins[:nk]
    lex = []  # least significant first for np.lexsort
    horizon = np.full(ins[0].shape, np.inf)
    badk = np.zeros(ins[0].shape, bool)
    for kx in keys:
        if isinstance(kx, IntVal):
            lex.append([kx.x.astype(np.float64)])
            badk |= kx.bad != OK
        else:
            st = _signed_terms(kx)
            lex.append([np.broadcast_to(c, kx.shape) for _, c in st] or [np.zeros(kx.shape)])
            horizon = np.minimum(horizon, kx.H)
            badk |= kx.bad != OK
    flat = [c for group in lex for c in group]
    perm = np.lexsort(flat[::-1], axis=dim)

    def take(a):
        return np.take_along_axis(np.asarray(a), perm, axis=dim)

    sorted_keys = [take(c) for c in flat]
    hs = take(horizon)
    und = take(badk)
    # adjacent ties in every known term that are not exact
    if ins[0].shape[dim] > 1:
        eq = np.ones(np.shape(sorted_keys[0]), bool)
        for c in sorted_keys:
            d = np.diff(c, axis=dim) == 0
            eq = (
                eq[tuple(slice(None) if i != dim else slice(0, -1) for i in range(eq.ndim))]
                if eq.shape[dim] != d.shape[dim]
                else eq
            )
            eq = eq & d
        lo = tuple(slice(None) if i != dim else slice(0, -1) for i in range(hs.ndim))
        hi = tuple(slice(None) if i != dim else slice(1, None) for i in range(hs.ndim))
        tie = eq & (np.isfinite(hs[lo]) | np.isfinite(hs[hi]))
        und = und.copy()
        und[lo] |= tie
        und[hi] |= tie
        # and any two that agree below the smaller horizon (1 + O(t) against 1 + t): the
        # whole block of elements sharing that prefix has an undecided order
        for kx in keys:
            if isinstance(kx, Series) and np.isfinite(kx.H).any():
                xl = S.apply_linear(S.bcast(kx, kx.shape), lambda a: np.moveaxis(take(a), dim, -1))
                t = _tied_to_horizon(xl, _signed_terms(xl))
                und |= np.moveaxis(t, -1, dim)
    outs = []
    for x in ins:
        if isinstance(x, IntVal):
            outs.append(IntVal(take(x.x), np.maximum(take(x.bad), np.where(und, UNDEC, OK))))
        else:
            s = S.apply_linear(x, take)
            outs.append(S.flag(s, und, UNDEC))
    return outs, perm


def _sort_bwd(ctx, eqn, ins, outs, aux, cots, need):
    perm = aux
    dim = eqn.params["dimension"]
    inv = np.argsort(perm, axis=dim)
    res = []
    for x, c, n in zip(ins, cots, need):
        if n and c is not None and isinstance(x, Series):
            res.append(
                S.apply_linear(
                    c, lambda a: np.take_along_axis(np.broadcast_to(a, inv.shape), inv, axis=dim)
                )
            )
        else:
            res.append(None)
    return res


FWD["sort"] = _sort_fwd
BWD["sort"] = _sort_bwd


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
        return const_eval(eqn, ins), None
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
        return const_eval(eqn, ins), None
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

# pure: one evaluation per ray for a repeated equation; cummax / cummin / top_k are kinks at x0
# where they tie
PURE.update({"reduce_max", "reduce_min", "argmax", "argmin", "cummax", "cummin", "top_k"})
KINKY.add("top_k")


_NAMES = ("reduce_window_max", "reduce_window_min")

# -- the window index ----------------------------------------------------------------------------


def window_index(params: dict, in_shape: tuple) -> np.ndarray:
    """For a ``reduce_window_*`` primitive with ``params`` on an input of ``in_shape``: the flat
    (C-order) input index of each window element of each output element, shape
    out_shape + (prod(window_dimensions),), -1 where the element is padding or a hole of the
    base dilation (the window elements in C order of the window dimensions)."""
    in_shape = tuple(int(n) for n in in_shape)
    nd = len(in_shape)
    wdims = tuple(int(w) for w in params["window_dimensions"])
    strides = tuple(int(s) for s in params.get("window_strides") or (1,) * nd)
    pads = tuple((int(lo), int(hi)) for lo, hi in (params.get("padding") or ((0, 0),) * nd))
    bdil = tuple(int(b) for b in params.get("base_dilation") or (1,) * nd)
    wdil = tuple(int(d) for d in params.get("window_dilation") or (1,) * nd)
    if not (len(wdims) == len(strides) == len(pads) == len(bdil) == len(wdil) == nd):
        raise Undecided("`reduce_window` parameters do not match the operand's rank")
    elem_strides = [int(np.prod(in_shape[i + 1 :], dtype=np.int64)) for i in range(nd)]
    out_shape = []
    flat = np.zeros((1,) * (2 * nd), np.int64)
    valid = np.ones((1,) * (2 * nd), bool)
    for i in range(nd):
        n, w, s, (lo, hi), b, d = in_shape[i], wdims[i], strides[i], pads[i], bdil[i], wdil[i]
        dil = (n - 1) * b + 1 if n > 0 else 0  # the base-dilated extent
        padded = lo + dil + hi
        eff = (w - 1) * d + 1 if w > 0 else 0  # the dilated window's extent
        m = (padded - eff) // s + 1 if padded >= eff else 0
        out_shape.append(m)
        p = np.arange(m)[:, None] * s + np.arange(w)[None, :] * d - lo  # base-dilated position
        ok = (p >= 0) & (p < dil) & (p % b == 0)
        src = np.where(ok, p // b, 0)
        shp = [1] * (2 * nd)
        shp[i], shp[nd + i] = m, w
        flat = flat + (src * elem_strides[i]).reshape(shp)
        valid = valid & ok.reshape(shp)
    full = tuple(out_shape) + wdims
    idx = np.where(np.broadcast_to(valid, full), np.broadcast_to(flat, full), -1)
    W = int(np.prod(wdims, dtype=np.int64))
    return np.ascontiguousarray(idx.reshape(tuple(out_shape) + (W,)))


def _check_index(eqn, params: dict, in_shape: tuple, idx: np.ndarray) -> None:
    """The index against the primitive itself: bound (once, on a leading batch axis that the
    windows do not reduce) on the index encodings 1..n and their negatives, each window's max
    and min must be its largest and smallest covered index (a window that covers nothing gets
    the init value, outside 1..n)."""
    n = int(np.prod(in_shape, dtype=np.int64))
    if n >= 2**31 - 1:
        return
    enc = (np.arange(n, dtype=np.int32) + 1).reshape(in_shape)
    batched = dict(params)
    for k, one in (
        ("window_dimensions", 1),
        ("window_strides", 1),
        ("padding", (0, 0)),
        ("base_dilation", 1),
        ("window_dilation", 1),
    ):
        if k in batched:
            batched[k] = (one,) + tuple(batched[k])
    with jax.default_device(jax.devices("cpu")[0]):
        r = np.asarray(_bind(eqn, [np.stack([enc, -enc])], batched)[0]).astype(np.int64)
    a, b = r[0], -r[1]
    if eqn.primitive.name == "reduce_window_min":
        a, b = b, a  # the min of the encodings is the smallest index
    hi, lo = a, b  # largest and smallest covered index + 1, or outside 1..n where none
    covered = idx >= 0
    if idx.shape[-1]:
        want_hi = np.max(np.where(covered, idx, -1), axis=-1) + 1
        want_lo = np.min(np.where(covered, idx, n), axis=-1) + 1
    else:
        want_hi = want_lo = np.zeros(idx.shape[:-1], np.int64)
    none = want_hi == 0
    if hi.shape != want_hi.shape or not (
        np.array_equal(none, (hi < 1) | (hi > n))
        and np.array_equal(np.where(none, 0, hi), np.where(none, 0, want_hi))
        and np.array_equal(np.where(none, 0, lo), np.where(none, 0, want_lo))
    ):
        raise Undecided(
            f"`{eqn.primitive.name}`: internal error, the window index does not match the primitive"
        )


_INDEX: dict = {}


def _index_of(eqn, in_shape: tuple) -> np.ndarray:
    """The window index of an equation (cached per primitive, parameters and input shape)."""
    params = dict(eqn.params)
    try:
        key = (eqn.primitive.name, tuple(sorted(params.items())), tuple(in_shape))
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _INDEX:
        return _INDEX[key]
    idx = window_index(params, in_shape)
    out_shape = tuple(eqn.outvars[0].aval.shape)
    if idx.shape[:-1] != out_shape:
        raise Undecided(
            f"`{eqn.primitive.name}`: internal error, window index of shape "
            f"{idx.shape[:-1]} for an output of shape {out_shape}"
        )
    _check_index(eqn, params, tuple(in_shape), idx)
    idx.setflags(write=False)
    if key is not None:
        if len(_INDEX) > 1000:
            _INDEX.clear()
        _INDEX[key] = idx
    return idx


# -- gather and scatter ---------------------------------------------------------------------------


def _gather(x: Series, idx: np.ndarray, big: bool) -> Series:
    """x gathered along a new last axis by the window index; padding holds the init value (a
    hard -inf for the max, +inf for the min)."""
    pad = idx < 0
    src = np.where(pad, 0, idx)

    def take(fill):
        def f(a):
            a = np.broadcast_to(a, x.shape).reshape(-1)
            out = a[src] if a.size else np.zeros(src.shape, a.dtype)
            return np.where(pad, fill, out) if pad.any() else out

        return f

    g = S.apply_linear(x, take(0.0), take(np.inf), take(0), take(0))
    if pad.any():
        g = S.with_inf(g, np.where(pad, -S.HARD if big else S.HARD, 0))
    return g


def _scatter(c: Series, idx: np.ndarray, in_shape: tuple) -> Series:
    """The cotangent of the gathered series (out_shape + (W,)) summed back onto the input
    positions (padding dropped): coefficients summed (cancellation judged against the summed
    magnitudes), horizons by minimum, status codes by maximum over the contributions."""
    n = int(np.prod(in_shape, dtype=np.int64))
    flat = idx.reshape(-1)
    keep = flat >= 0
    tgt = flat[keep]

    def pick(a, dtype=np.float64):
        return np.broadcast_to(a, c.shape).reshape(-1)[keep].astype(dtype, copy=False)

    terms = {}
    for k, a in c.terms.items():
        a = pick(a)
        if not np.count_nonzero(a):
            continue
        s = np.bincount(tgt, weights=a, minlength=n)
        m = np.bincount(tgt, weights=np.abs(a), minlength=n)
        terms[k] = S._cancel(s, m).reshape(in_shape)
    H = np.full(n, np.inf)
    hc = pick(c.H)
    if not np.isinf(hc).all():
        np.minimum.at(H, tgt, hc)
    bad = np.zeros(n, np.int8)
    bc = pick(c.bad, np.int8)
    if np.count_nonzero(bc):
        np.maximum.at(bad, tgt, bc)
    return S.mk(terms, H.reshape(in_shape), bad.reshape(in_shape), in_shape)


# -- the rules ------------------------------------------------------------------------------------


def _as_reduce(big: bool, axis: int):
    """A stand-in for a ``reduce_max`` / ``reduce_min`` equation over ``axis`` (all that
    ``_reduce_max_fwd`` / ``_reduce_max_bwd`` read of an equation)."""
    return types.SimpleNamespace(
        primitive=types.SimpleNamespace(name="reduce_max" if big else "reduce_min"),
        params={"axes": (axis,)},
    )


def _pool_fwd(ctx, eqn, ins, act):
    if len(ins) != 1:
        raise Undecided(f"`{eqn.primitive.name}` with {len(ins)} operands is not supported")
    x = ins[0]
    if isinstance(x, IntVal):
        return const_eval(eqn, ins), None
    shape = tuple(eqn.invars[0].aval.shape)
    if x.shape != shape:
        x = S.bcast(x, shape)
    big = eqn.primitive.name == "reduce_window_max"
    idx = _index_of(eqn, x.shape)
    g = _gather(x, idx, big)
    red = _as_reduce(big, idx.ndim - 1)
    (out,), (w, und) = _reduce_max_fwd(ctx, red, [g], act)
    empty = (idx < 0).all(axis=-1)  # windows that cover only padding: the init value, exactly
    if empty.any():
        init = S.with_inf(Series.zeros(out.shape), np.full(out.shape, -S.HARD if big else S.HARD))
        out = S.select(empty, init, out)
        und = und & ~empty
        w = np.where(empty[..., None], 0.0, w)
    return [out], (idx, g, w, und)


def _pool_bwd(ctx, eqn, ins, outs, aux, cots, need):
    if not need[0] or cots[0] is None or aux is None:
        return [None]
    idx, g, w, und = aux
    big = eqn.primitive.name == "reduce_window_max"
    (cg,) = _reduce_max_bwd(ctx, _as_reduce(big, idx.ndim - 1), [g], outs, (w, und), cots, [True])
    return [_scatter(cg, idx, tuple(eqn.invars[0].aval.shape))]


for _n in _NAMES:
    FWD[_n] = _pool_fwd
    BWD[_n] = _pool_bwd

# pure (one evaluation per ray for a repeated equation), and a kink at
# x0 where a window ties (the evaluation at x0 itself is JAX's)
PURE.update(_NAMES)
KINKY.update(_NAMES)
