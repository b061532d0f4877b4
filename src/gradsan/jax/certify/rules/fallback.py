"""certify's fallbacks: generic linear primitives, elementwise primitives by repeated
JVPs, and nested-JVP Taylor expansions for decompositions."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import jax
import numpy as np

from ..._compat import bind as _bind
from .. import _series as S
from .._series import UNDEC, Series, Undecided
from .._values import IntVal, is_float_aval

# -- fallbacks ----------------------------------------------------------------------------------

_GENERIC_LINEAR = {
    "pad",
    "gather",
    "dynamic_slice",
    "dynamic_update_slice",
    "scatter-add",
    "scatter_add",
    "reduce_window_sum",
    "select_and_gather_add",
    "rev",
    "squeeze",
    "expand_dims",
    "reduce_sum",
    "transpose",
    "reshape",
    "conj",
    "real",
    "imag",
    "cumsum",
}
_NOT_ELEMENTWISE = {
    "cumprod",
    "cummax",
    "cummin",
    "cumlogsumexp",
    "reduce_prod",
    "fft",
    "top_k",
    "eigh",
    "svd",
    "qr",
    "cholesky",
    "triangular_solve",
    "lu",
    "reduce_and",
    "reduce_or",
    "reduce_xor",
    "while",
    "scan",
    "cond",
    "custom_linear_solve",
    "rng_bit_generator",
    "random_bits",
    "random_seed",
    "random_wrap",
    "random_unwrap",
    "sharding_constraint",
    "psum",
    "all_gather",
}


def _float_positions(ins) -> list[int]:
    return [i for i, x in enumerate(ins) if isinstance(x, Series)]


def _generic_linear_fwd(ctx, eqn, ins, act):
    fl = _float_positions(ins)
    keys = set().union(*(ins[i].terms for i in fl)) if fl else set()
    out_aval = eqn.outvars[0].aval
    terms = {}
    for k in keys:
        vals = [
            np.asarray(ins[i].terms.get(k, np.zeros(ins[i].shape))) if i in fl else np.asarray(x.x)
            for i, x in enumerate(ins)
        ]
        with jax.default_device(jax.devices("cpu")[0]):
            terms[k] = np.asarray(_bind(eqn, vals)[0], np.float64)
    H = min((float(np.min(ins[i].H)) if ins[i].H.size else np.inf) for i in fl) if fl else np.inf
    bad = max((int(np.max(ins[i].bad)) if ins[i].bad.size else 0) for i in fl) if fl else 0
    for x in ins:
        if isinstance(x, IntVal) and x.bad.any():
            bad = max(bad, UNDEC)
    shape = tuple(out_aval.shape)
    return [S.mk(terms, np.full(shape, H), np.full(shape, bad, np.int8), shape)], None


def _generic_linear_bwd(ctx, eqn, ins, outs, aux, cots, need):
    fl = _float_positions(ins)
    c = cots[0]
    zeros = [np.zeros(ins[i].shape) if i in fl else np.asarray(ins[i].x) for i in range(len(ins))]

    def f(*fvals):
        vals = list(zeros)
        for i, v in zip(fl, fvals):
            vals[i] = v
        return _bind(eqn, vals)[0]

    with jax.default_device(jax.devices("cpu")[0]):
        _, vjp = jax.vjp(f, *[zeros[i] for i in fl])
        res: list = [None] * len(ins)
        per = {i: {} for i in fl}
        for k, ck in c.terms.items():
            gs = vjp(np.asarray(ck))
            for i, g in zip(fl, gs):
                per[i][k] = np.asarray(g, np.float64)
    Hc = float(np.min(c.H)) if c.H.size else np.inf
    badc = int(np.max(c.bad)) if c.bad.size else 0
    for i in fl:
        if need[i]:
            shape = ins[i].shape
            res[i] = S.mk(per[i], np.full(shape, Hc), np.full(shape, badc, np.int8), shape)
    return res


def _fallback_fwd(ctx, eqn, ins, act):
    name = eqn.primitive.name
    if name in _GENERIC_LINEAR:
        return _generic_linear_fwd(ctx, eqn, ins, act)
    fl = _float_positions(ins)
    outs = eqn.outvars
    if (
        len(ins) == 1
        and len(fl) == 1
        and len(outs) == 1
        and name not in _NOT_ELEMENTWISE
        and tuple(outs[0].aval.shape) == ins[0].shape
        and not eqn.params.get("axes")
        and is_float_aval(outs[0].aval)
    ):
        ctx.unverified.add(name)
        taylor = _jvp_taylor(eqn)
        u = ins[0]
        return [S.analytic(u, taylor)], taylor
    if name in _ANALYTIC_MULTI:
        ctx.unverified.add(name)
        return _multi_fwd(eqn, ins), "multi"
    raise Undecided(f"primitive `{name}` is not supported by certify")


def _fallback_bwd(ctx, eqn, ins, outs, aux, cots, need):
    name = eqn.primitive.name
    if name in _GENERIC_LINEAR:
        return _generic_linear_bwd(ctx, eqn, ins, outs, aux, cots, need)
    if aux is None:
        raise Undecided(f"primitive `{name}` has no reverse rule in certify")
    if aux == "multi":
        return _multi_bwd(eqn, ins, cots, need)
    taylor = aux

    def dtaylor(a0, n):
        cs = taylor(a0, n + 1)
        return [(k + 1) * cs[k + 1] for k in range(n + 1)]

    return [S.rmul(cots[0], S.analytic(ins[0], dtaylor))]


# Analytic where their result is non-degenerate (distinct eigenvalues and singular values, a
# nonsingular or positive definite matrix, pivots without ties): along the ray they are
# composed with the inputs' polynomials and expanded by nested JVPs in t, labelled "unverified"
# (a degenerate point shows as a non-finite coefficient, undecided; a pivot tie does not).
_ANALYTIC_MULTI = {
    "lu",
    "cholesky",
    "eigh",
    "svd",
    "qr",
    "triangular_solve",
    "custom_linear_solve",
    "householder_product",
    "tridiagonal_solve",
    "schur",
    "eig",
    "igamma",
    "igammac",
    "polygamma",
    "zeta",
    "bessel_i0e",
    "bessel_i1e",
    "random_gamma_grad",
    "regularized_incomplete_beta",
}


def _poly_coefs(x: Series, N: int, what: str) -> list:
    """The coefficients of t^0..t^N of a series that is a plain power series in t (integer
    exponents, no log, no flag), else Undecided."""
    if np.count_nonzero(x.bad) or (x.inf is not None and np.count_nonzero(x.inf)):
        raise Undecided(f"{what}: an input is infinite or undecided")
    for e, j in x.terms:
        if j or e.denominator != 1 or e < 0:
            raise Undecided(
                f"{what}: an input is not a power series in t (a fractional power, "
                "a log or a pole), where an analytic expansion says nothing"
            )
    return [np.broadcast_to(x.coef(k), x.shape) for k in range(N + 1)]


def _taylor_in_t(F: Callable, N: int) -> list:
    """[F(0), F'(0), F''(0) / 2, ...] up to order N, for F of a scalar t returning a list of
    float arrays, by nested JVPs."""
    fs = [F]
    for _ in range(N):
        prev = fs[-1]
        fs.append(lambda t, prev=prev: jax.jvp(prev, (t,), (jax.numpy.ones_like(t),))[1])
    t0 = np.float64(0.0)
    with jax.default_device(jax.devices("cpu")[0]):
        return [
            [np.asarray(o, np.float64) / math.factorial(k) for o in f(t0)] for k, f in enumerate(fs)
        ]


def _order() -> int:
    return max(0, int(math.floor(S.cap() - S.EPS)))


def _multi_series(cs: list, shape, H: float) -> Series:
    """A series from Taylor coefficients per order; non-finite ones undecided."""
    nonfin = np.zeros(shape, bool)
    for c in cs:
        nonfin |= ~np.isfinite(c)
    terms = {(S.q(Fraction(k)), 0): np.where(nonfin, 0.0, c) for k, c in enumerate(cs)}
    return S.flag(S.mk(terms, np.full(shape, H), np.zeros(shape, np.int8), shape), nonfin, UNDEC)


def _poly_at(coefs: list, t):
    return sum(c * t**k for k, c in enumerate(coefs))


def _multi_setup(eqn, ins):
    """(order N, the float inputs' polynomial coefficients by position, the float outputs'
    positions, the inputs at t) of a primitive expanded along the ray."""
    name = eqn.primitive.name
    N = _order()
    polys = {i: _poly_coefs(ins[i], N, f"`{name}`") for i in _float_positions(ins)}
    fouts = [k for k, v in enumerate(eqn.outvars) if is_float_aval(v.aval)]
    for k, v in enumerate(eqn.outvars):
        if k not in fouts and (name != "lu" or not np.issubdtype(v.aval.dtype, np.integer)):
            raise Undecided(f"`{name}` has a {v.aval.dtype} output (not supported by certify)")

    def vals_at(t):
        return [_poly_at(polys[i], t) if i in polys else ins[i].x for i in range(len(ins))]

    return N, polys, fouts, vals_at


def _multi_fwd(eqn, ins) -> list:
    name = eqn.primitive.name
    N, polys, fouts, vals_at = _multi_setup(eqn, ins)
    H = min([float(np.min(ins[i].H)) if ins[i].H.size else np.inf for i in polys] + [N + 1.0])

    def F(t):
        outs = _bind(eqn, vals_at(t))
        return [outs[k] for k in fouts]

    with jax.default_device(jax.devices("cpu")[0]):
        at0 = [np.asarray(o) for o in _bind(eqn, vals_at(np.float64(0.0)))]
    _check_nondegenerate(name, at0, eqn)
    coefs = _taylor_in_t(F, N)
    res: list = []
    for k, v in enumerate(eqn.outvars):
        if k in fouts:
            j = fouts.index(k)
            res.append(_multi_series([c[j] for c in coefs], tuple(v.aval.shape), H))
        else:  # pivots, permutations: their value at x0, taken as constant (unverified)
            res.append(IntVal(np.asarray(at0[k])))
    return res


_GAP = 1e-9  # relative: eigenvalues (singular values) closer than this count as repeated


def _check_nondegenerate(name: str, at0: list, eqn) -> None:
    """Undecided where the decomposition is not analytic at x0: repeated eigenvalues (eigh: the
    eigenvalues are a kink there, their first-order terms along a ray are the eigenvalues of a
    block, which a Taylor expansion in a fixed basis does not give), repeated or zero singular
    values (svd: |sigma| is abs-like at 0), a rank-deficient R (qr)."""

    def rel_close(w, axis):
        w = np.sort(w, axis=axis)
        scale = np.max(np.abs(w), axis=axis, keepdims=True) + 1e-300
        return bool(np.any(np.diff(w, axis=axis) <= _GAP * scale))

    if name == "eigh":
        w = at0[1]
        if w.shape[-1] > 1 and rel_close(w, -1):
            raise Undecided(
                "eigh at repeated eigenvalues: not analytic there (a kink of the "
                "eigenvalues, undefined eigenvectors); certify does not decide it"
            )
    elif name == "svd":
        sv = at0[0]
        scale = np.max(sv, axis=-1, keepdims=True) + 1e-300
        if np.any(sv <= _GAP * scale) or (sv.shape[-1] > 1 and rel_close(sv, -1)):
            raise Undecided(
                "svd at a repeated or zero singular value: not analytic there "
                "(|sigma| is abs-like at 0); certify does not decide it"
            )
    elif name == "qr":
        r = at0[1]
        d = np.abs(np.diagonal(r, axis1=-2, axis2=-1))
        if d.size and np.any(d <= _GAP * (np.max(d, axis=-1, keepdims=True) + 1e-300)):
            raise Undecided(
                "qr of a rank-deficient matrix: not analytic there; certify does not decide it"
            )


def _multi_bwd(eqn, ins, cots, need) -> list:
    name = eqn.primitive.name
    N, polys, fouts, vals_at = _multi_setup(eqn, ins)
    fl = list(polys)
    cpolys = {}
    for k in fouts:
        c = cots[k]
        if c is not None:
            cpolys[k] = _poly_coefs(c, N, f"the reverse rule of `{name}`")
    Hs = [float(np.min(x.H)) for x in [ins[i] for i in fl] + [cots[k] for k in cpolys] if x.H.size]
    H = min(Hs + [N + 1.0])
    want = [i for i in fl if need[i]]

    def G(t):
        vals = vals_at(t)

        def f(*xs):
            v = list(vals)
            for i, x in zip(want, xs):
                v[i] = x
            outs = _bind(eqn, v)
            return [outs[k] for k in fouts]

        outs, vjp = jax.vjp(f, *[vals[i] for i in want])
        ct = [
            _poly_at(cpolys[k], t) if k in cpolys else jax.numpy.zeros_like(o)
            for k, o in zip(fouts, outs)
        ]
        return list(vjp(ct))

    coefs = _taylor_in_t(G, N) if want else []
    res: list = [None] * len(ins)
    for n, i in enumerate(want):
        res[i] = _multi_series([c[n] for c in coefs], ins[i].shape, H)
    return res


def _jvp_taylor(eqn):
    """Taylor coefficients of an unknown elementwise primitive by nested JVPs (order <= 6)."""

    def f(x):
        return _bind(eqn, [x])[0]

    def taylor(a0, n):
        n_eff = min(n, 6)
        a0 = np.asarray(a0, np.float64)
        cs = [c[0] for c in _taylor_in_t(lambda t: [f(a0 + t)], n_eff)]  # f(a0 + t) in t
        if n > n_eff:
            cs += [np.full(a0.shape, np.nan)] * (n - n_eff)
        return cs

    return taylor
