"""certify's linear rules: structural primitives, reductions by sums, concatenate, split,
stack, dot_general and conv_general_dilated."""

from __future__ import annotations

import math
import string
from collections.abc import Callable

import jax
import numpy as np

from ..._compat import bind as _bind
from ..._numpy import dot_subscripts, einsum2
from .. import _series as S
from .._registry import BWD, FWD, PLAIN, PURE
from .._series import OK, Series
from .._values import IntVal, as_series, const_eval

# -- structural (linear) ----------------------------------------------------------------------


def _lin_rule(fwd_np: Callable, bwd_np: Callable, reduce: bool = False):
    """A linear structural primitive: fwd_np(eqn, array) and bwd_np(eqn, cot array, in shape)."""

    def fwd(ctx, eqn, ins, act):
        x = ins[0]
        if isinstance(x, IntVal):
            return [
                IntVal(
                    fwd_np(eqn, x.x),
                    fwd_np(eqn, x.bad) if not reduce else fwd_np(eqn, x.bad, np.max),
                )
            ], None
        if reduce:
            out = S.apply_linear(
                x,
                lambda a: fwd_np(eqn, a),
                lambda h: fwd_np(eqn, h, np.min),
                lambda b: fwd_np(eqn, b, np.max),
            )
            if x.inf is not None:
                out = S.with_inf(out, S.sum_inf(x, lambda m, red: fwd_np(eqn, m, red)))
            return [out], None
        return [S.apply_linear(x, lambda a: fwd_np(eqn, a), finf=lambda c: fwd_np(eqn, c))], None

    def bwd(ctx, eqn, ins, outs, aux, cots, need):
        shape = ins[0].shape
        c = cots[0]
        if reduce:
            return [S.apply_linear(c, lambda a: bwd_np(eqn, a, shape))] + [None] * (len(ins) - 1)
        # a uniform horizon maps to itself (not for slice: its padding is an exact zero)
        hu = S.uniform_h(c) if eqn.primitive.name != "slice" else None
        fH = (
            (lambda h: np.full(shape, hu))
            if hu is not None
            else (lambda h: bwd_np(eqn, h, shape, fill=np.inf))
        )
        fbad = (
            (lambda b: np.zeros(shape, np.int8))
            if not np.count_nonzero(c.bad)
            else (lambda b: bwd_np(eqn, b, shape))
        )
        return [S.apply_linear(c, lambda a: bwd_np(eqn, a, shape), fH, fbad)] + [None] * (
            len(ins) - 1
        )

    return fwd, bwd


def _reshape_dims(eqn):
    """reshape's ``dimensions``: a transpose of the operand before the reshape (vmap makes it)."""
    return eqn.params.get("dimensions") if eqn.primitive.name == "reshape" else None


def _reshape_f(eqn, a, *_):
    dims = _reshape_dims(eqn)
    if dims is not None:
        a = np.transpose(a, dims)
    return (
        np.reshape(a, eqn.params["new_sizes"])
        if "new_sizes" in eqn.params
        else np.reshape(a, eqn.outvars[0].aval.shape)
    )


def _reshape_b(eqn, a, shape, fill=0.0):
    dims = _reshape_dims(eqn)
    if dims is not None:
        return np.transpose(np.reshape(a, [shape[d] for d in dims]), np.argsort(dims))
    return np.reshape(a, shape)


def _transpose_f(eqn, a, *_):
    return np.transpose(a, eqn.params["permutation"])


def _transpose_b(eqn, a, shape, fill=0.0):
    return np.transpose(a, np.argsort(eqn.params["permutation"]))


def _bcast_f(eqn, a, *_):
    shape = eqn.params["shape"]
    dims = eqn.params["broadcast_dimensions"]
    exp_shape = [1] * len(shape)
    for i, d in enumerate(dims):
        exp_shape[d] = np.shape(a)[i]
    r = np.reshape(a, exp_shape)
    return r if r.shape == tuple(shape) else np.broadcast_to(r, shape)


def _bcast_b(eqn, a, shape, fill=0.0):
    dims = eqn.params["broadcast_dimensions"]
    out_shape = np.shape(a)
    red = [d for d in range(len(out_shape)) if d not in dims]
    red += [d for i, d in enumerate(dims) if shape[i] == 1 and out_shape[d] != 1]
    # horizons: the minimum; status codes: the worst; coefficients: the sum
    fn = np.min if fill == np.inf else np.max if np.asarray(a).dtype == np.int8 else np.sum
    r = fn(a, axis=tuple(sorted(red))) if red else a
    return np.reshape(r, shape)


def _squeeze_f(eqn, a, *_):
    return np.reshape(a, eqn.outvars[0].aval.shape)


def _expand_f(eqn, a, *_):
    return np.reshape(a, eqn.outvars[0].aval.shape)


def _slice_f(eqn, a, *_):
    st = eqn.params["start_indices"]
    lim = eqn.params["limit_indices"]
    strides = eqn.params.get("strides") or (1,) * len(st)
    return a[tuple(slice(s, li, k) for s, li, k in zip(st, lim, strides))]


def _slice_b(eqn, a, shape, fill=0.0):
    st = eqn.params["start_indices"]
    lim = eqn.params["limit_indices"]
    strides = eqn.params.get("strides") or (1,) * len(st)
    out = np.full(shape, fill, dtype=np.asarray(a).dtype)
    out[tuple(slice(s, li, k) for s, li, k in zip(st, lim, strides))] = a
    return out


def _rev_f(eqn, a, *_):
    return np.flip(a, eqn.params["dimensions"]) if eqn.params["dimensions"] else a


def _rev_b(eqn, a, shape, fill=0.0):
    return _rev_f(eqn, a)


def _reduce_sum_f(eqn, a, red=np.sum):
    return red(a, axis=tuple(eqn.params["axes"]))


def _reduce_sum_b(eqn, a, shape, fill=0.0):
    axes = tuple(eqn.params["axes"])
    exp_shape = [1 if i in axes else n for i, n in enumerate(shape)]
    return np.broadcast_to(np.reshape(a, exp_shape), shape)


def _cumsum_f(eqn, a, *_):
    ax = eqn.params["axis"]
    if eqn.params.get("reverse"):
        return np.flip(np.cumsum(np.flip(a, ax), axis=ax), ax)
    return np.cumsum(a, axis=ax)


def _cumsum_b(eqn, a, shape, fill=0.0):
    ax = eqn.params["axis"]
    if eqn.params.get("reverse"):
        return np.cumsum(a, axis=ax)
    return np.flip(np.cumsum(np.flip(a, ax), axis=ax), ax)


for _n, _fw, _bw in (
    ("reshape", _reshape_f, _reshape_b),
    ("transpose", _transpose_f, _transpose_b),
    ("broadcast_in_dim", _bcast_f, _bcast_b),
    ("squeeze", _squeeze_f, _reshape_b),
    ("expand_dims", _expand_f, _reshape_b),
    ("slice", _slice_f, _slice_b),
    ("rev", _rev_f, _rev_b),
):
    FWD[_n], BWD[_n] = _lin_rule(_fw, _bw)

FWD["reduce_sum"], BWD["reduce_sum"] = _lin_rule(_reduce_sum_f, _reduce_sum_b, reduce=True)


def _cumsum_fwd(ctx, eqn, ins, act):
    x = ins[0]
    ax = eqn.params["axis"]
    rev = eqn.params.get("reverse", False)

    def acc(a, ufunc):
        if rev:
            return np.flip(ufunc.accumulate(np.flip(a, ax), axis=ax), ax)
        return ufunc.accumulate(a, axis=ax)

    return [
        S.apply_linear(
            x,
            lambda a: _cumsum_f(eqn, a),
            lambda h: acc(h, np.minimum),
            lambda b: acc(b, np.maximum),
        )
    ], None


def _cumsum_bwd(ctx, eqn, ins, outs, aux, cots, need):
    return [
        S.apply_linear(
            cots[0],
            lambda a: _cumsum_b(eqn, a, None),
            lambda h: np.full(h.shape, np.min(h) if h.size else np.inf),
            lambda b: np.full(b.shape, np.max(b) if b.size else 0),
        )
    ]


FWD["cumsum"] = _cumsum_fwd
BWD["cumsum"] = _cumsum_bwd


def _concat_fwd(ctx, eqn, ins, act):
    d = eqn.params["dimension"]
    if all(isinstance(x, IntVal) for x in ins):
        return [
            IntVal(np.concatenate([x.x for x in ins], d), np.concatenate([x.bad for x in ins], d))
        ], None
    ss = [Series.exact(x.x.astype(np.float64)) if isinstance(x, IntVal) else x for x in ins]
    keys = set().union(*(s.terms for s in ss))
    terms = {
        k: np.concatenate([np.broadcast_to(s.terms.get(k, 0.0), s.shape) for s in ss], d)
        for k in keys
    }
    H = np.concatenate([s.H for s in ss], d)
    bad = np.concatenate([s.bad for s in ss], d)
    out = S.mk(terms, H, bad, H.shape)
    if any(s.inf is not None for s in ss):
        out.inf = np.concatenate([S.inf_code(s) for s in ss], d)
    return [out], None


def _split_series(c: Series, sizes: list, axis: int) -> list:
    idx = np.cumsum(sizes)[:-1]
    parts = []
    for k in range(len(sizes)):
        lo = 0 if k == 0 else idx[k - 1]
        hi = lo + sizes[k]
        sl = [slice(None)] * len(c.shape)
        sl[axis] = slice(lo, hi)
        parts.append(
            S.apply_linear(c, lambda a, sl=tuple(sl): a[sl], finf=lambda a, sl=tuple(sl): a[sl])
        )
    return parts


def _concat_bwd(ctx, eqn, ins, outs, aux, cots, need):
    d = eqn.params["dimension"]
    return _split_series(cots[0], [x.shape[d] for x in ins], d)


FWD["concatenate"] = _concat_fwd
BWD["concatenate"] = _concat_bwd


def _split_fwd(ctx, eqn, ins, act):
    x = ins[0]
    sizes = list(eqn.params["sizes"])
    ax = eqn.params["axis"]
    if isinstance(x, IntVal):
        idx = np.cumsum(sizes)[:-1]
        return [
            IntVal(a, b) for a, b in zip(np.split(x.x, idx, ax), np.split(x.bad, idx, ax))
        ], None
    return _split_series(x, sizes, ax), None


def _split_bwd(ctx, eqn, ins, outs, aux, cots, need):
    ax = eqn.params["axis"]
    return [_concat_fwd(ctx, eqn.replace(params={"dimension": ax}), cots, None)[0][0]]


FWD["split"] = _split_fwd
BWD["split"] = _split_bwd


def _stack_fwd(ctx, eqn, ins, act):
    ax = eqn.params.get("axis", 0)
    if all(isinstance(x, IntVal) for x in ins):
        return [IntVal(np.stack([x.x for x in ins], ax), np.stack([x.bad for x in ins], ax))], None
    ss = [Series.exact(x.x.astype(np.float64)) if isinstance(x, IntVal) else x for x in ins]
    return [S.stack(ss, ax)], None


def _stack_bwd(ctx, eqn, ins, outs, aux, cots, need):
    ax = eqn.params.get("axis", 0)
    return [S.apply_linear(cots[0], lambda a, k=k: np.take(a, k, axis=ax)) for k in range(len(ins))]


FWD["stack"] = _stack_fwd
BWD["stack"] = _stack_bwd


# -- dot_general ------------------------------------------------------------------------------


def _contract_terms(spec: str, x: Series, y: Series, out_shape) -> tuple[dict, np.ndarray]:
    """The truncated product of two series contracted by einsum ``spec``: the terms below the
    cap, with cancellation judged against the operands' magnitudes (not the result's), and the
    horizon lowered wherever a dropped term is non-zero. Per term of y, one matmul with the
    terms of x (stacked on a leading axis). The magnitudes sum |x| |y| (a second matmul) are
    computed only where they can matter: where some result could have cancelled, i.e. is not
    above TOL times a bound of the magnitudes (contraction size times the largest operands)."""
    c_ = S.cap() - S.EPS
    acc: dict = {}
    H = np.full(out_shape, np.inf)
    kx, ky = list(x.terms.items()), list(y.terms.items())
    if not kx or not ky:
        return acc, H
    pairs = []
    ux, uy = set(), set()  # the terms of x and y that some kept pair uses
    for i, ((ea, ja), _) in enumerate(kx):
        for j, ((eb, jb), _) in enumerate(ky):
            e, jj = ea + eb, ja + jb
            drop = float(e) >= c_ or jj > S.D
            pairs.append((i, j, e, jj, drop))
            if not drop:
                ux.add(i)
                uy.add(j)
    sx, sy, so, specA = _specs(spec)
    P: dict = {}
    M: dict = {}
    if ux:
        ix = sorted(ux)
        X = np.array([kx[i][1] for i in ix]) if len(ix) > 1 else kx[ix[0]][1][None]
        px = {i: n for n, i in enumerate(ix)}
        # the number of products in each contracted sum
        K = math.prod(d for ch, d in zip(sx, np.shape(kx[0][1])) if ch not in so) or 1
        maxx = max(S.max_abs(x, kx[i][0]) for i in ix)
        kept: dict = {}
        for i, j, _e, _jj, drop in pairs:
            if not drop:
                kept.setdefault(j, []).append(i)
        for j in sorted(uy):  # one matmul per term of y, with the terms of x it is kept with
            need = kept[j]
            if len(need) == len(ix):
                Pj = einsum2(specA, X, ky[j][1])
                for i in need:
                    P[(i, j)] = Pj[px[i]]
            else:
                Xj = X[[px[i] for i in need]]
                Pj = einsum2(specA, Xj, ky[j][1])
                for n, i in enumerate(need):
                    P[(i, j)] = Pj[n]

    def mags(j):  # sum |x| |y| for y's term j, x's terms stacked (nonzero where a product is)
        if j not in M:
            M[j] = einsum2(specA, np.abs(X), np.abs(ky[j][1]))
        return M[j]

    bound: dict = {}  # per kept key: an upper bound of its magnitudes
    parts: dict = {}
    for i, j, e, jj, drop in pairs:
        if drop:
            if j in M and i in px:  # (magnitudes already at hand)
                nz = M[j][px[i]] != 0
            else:
                nz = _contract_nonzero(spec, sx, sy, so, kx[i][1], ky[j][1])
            H = (
                np.where(nz, np.minimum(H, float(e)), H)
                if nz is not True
                else np.minimum(H, float(e))
            )
            continue
        k = (e, jj)
        p = P[(i, j)]
        bj = K * maxx * S.max_abs(y, ky[j][0])
        if k in acc:
            acc[k] = acc[k] + p
            bound[k] += bj
            parts[k].append((i, j))
        else:
            acc[k], bound[k], parts[k] = p, bj, [(i, j)]
    for k in acc:
        c = acc[k]
        if c.size and np.min(np.abs(c)) > S.TOL * bound[k] * (1 + 1e-9):
            continue  # nothing summed to this key could have cancelled
        mag = None
        for i, j in parts[k]:
            m = mags(j)[px[i]]
            mag = m if mag is None else mag + m
        acc[k] = S._cancel(c, mag)
    return acc, H


_SPECS: dict = {}


def _specs(spec: str) -> tuple:
    """(x's indices, y's, the output's, the spec of the product with x's terms stacked on a
    leading index) of a two-operand einsum spec."""
    r = _SPECS.get(spec)
    if r is None:
        ins_, so = spec.split("->")
        sx, sy = ins_.split(",")
        A = [ch for ch in string.ascii_letters if ch not in spec][0]
        r = _SPECS[spec] = (sx, sy, so, f"{A}{sx},{sy}->{A}{so}")
    return r


def _contract_nonzero(spec, sx, sy, so, a, b):
    """Where the contraction of a and b by ``spec`` has a nonzero product term: True if
    everywhere (a and b have no zeros and something is contracted), else a boolean array."""
    if np.all(a) and np.all(b) and all(ch in sy for ch in sx if ch not in so):
        return True
    return einsum2(spec, np.abs(a), np.abs(b)) != 0


def _dot_series(eqn, a: Series, b: Series) -> Series:
    sa, sb, so = dot_subscripts(eqn, len(a.shape), len(b.shape))
    return _einsum_series(f"{sa},{sb}->{so}", a, b, tuple(eqn.outvars[0].aval.shape))


def _dot_fwd(ctx, eqn, ins, act):
    a, b = ins
    if isinstance(a, IntVal) and isinstance(b, IntVal):
        return const_eval(eqn, ins), None
    a = Series.exact(a.x.astype(np.float64)) if isinstance(a, IntVal) else a
    b = Series.exact(b.x.astype(np.float64)) if isinstance(b, IntVal) else b
    return [_dot_series(eqn, a, b)], None


def _dot_bwd(ctx, eqn, ins, outs, aux, cots, need):
    a, b = ins
    c = cots[0]
    sa, sb, so = dot_subscripts(eqn, len(a.shape), len(b.shape))
    res = [None, None]
    if need[0]:
        res[0] = _einsum_series(f"{so},{sb}->{sa}", c, b, a.shape)
    if need[1]:
        res[1] = _einsum_series(f"{so},{sa}->{sb}", c, a, b.shape)
    return res


def _einsum_series(spec: str, x: Series, y: Series, out_shape) -> Series:
    """x and y contracted by einsum ``spec`` (dot_general and its transposes). The horizon is
    bounded by min over the contraction of H_x + val_y and H_y + val_x (minimum of each part,
    conservative); flags are the worst over the contraction."""
    out_shape = tuple(out_shape)
    acc, H = _contract_terms(spec, x, y, out_shape)
    sx, sy, _out, _ = _specs(spec)
    Hx, Hy = S.uniform_h(x), S.uniform_h(y)
    vx, vy = S.uniform_veff(x), S.uniform_veff(y)
    Hx = _minplace(x.H, sx, _out, np.min) if Hx is None else Hx
    Hy = _minplace(y.H, sy, _out, np.min) if Hy is None else Hy
    vx = _minplace(S.veff(x), sx, _out, np.min) if vx is None else vx
    vy = _minplace(S.veff(y), sy, _out, np.min) if vy is None else vy
    Hb = np.minimum(Hx + vy, Hy + vx)
    if np.ndim(Hb):
        Hb = np.where(np.isnan(Hb), np.inf, Hb)
    elif Hb != Hb:  # nan
        Hb = np.inf
    H = np.minimum(H, Hb)
    if np.count_nonzero(x.bad) or np.count_nonzero(y.bad):
        bad = np.maximum(_minplace(x.bad, sx, _out, np.max), _minplace(y.bad, sy, _out, np.max))
    else:
        bad = np.int8(OK)
    return S.mk(acc, H, bad, out_shape)


def _minplace(x, sub: str, out: str, red):
    """Reduce x over the indices not in `out`, then arrange it in out's layout (size-1 where
    absent); a scalar where x is uniform."""
    x = np.asarray(x)
    if not x.size:
        return np.inf if red is np.min else OK
    lo = red(x)
    if lo == (np.max(x) if red is np.min else np.min(x)):
        return lo
    axes = tuple(i for i, ch in enumerate(sub) if ch not in out)
    y = red(x, axis=axes) if axes else x
    kept = [ch for ch in sub if ch in out]
    order = [ch for ch in out if ch in kept]
    y = np.transpose(y, [kept.index(ch) for ch in order]) if kept else y
    shape = [y.shape[order.index(ch)] if ch in order else 1 for ch in out]
    return np.reshape(y, shape)


FWD["dot_general"] = _dot_fwd
BWD["dot_general"] = _dot_bwd


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
        key: tuple = (tuple(sorted(params.items())), ls, rs)
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
        return const_eval(eqn, ins), None
    a, b = as_series(a), as_series(b)
    conv = _conv_fns(eqn, a.shape, b.shape)[0]
    return [_bilinear(_numpy_fn(conv), a, b, eqn.outvars[0].aval.shape)], None


def _conv_bwd(ctx, eqn, ins, outs, aux, cots, need):
    a, b = (as_series(x) for x in ins)
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


# pure: one evaluation per ray for a repeated equation; a convolution is smooth (no singular
# point of its own at x0)
PURE.update(
    {
        "reshape",
        "transpose",
        "broadcast_in_dim",
        "squeeze",
        "expand_dims",
        "slice",
        "rev",
        "reduce_sum",
        "cumsum",
        "concatenate",
        "dot_general",
        "conv_general_dilated",
    }
)
PLAIN.add("conv_general_dilated")
