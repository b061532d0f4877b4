"""certify's elementwise rules: unary and binary primitives, comparisons, select."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from ..._compat import bind as _bind
from ..._numpy import TWINS
from .. import _series as S
from .. import _singular, _taylor
from .._registry import BWD, FWD, PURE
from .._series import DOMAIN, OK, POISON, PUNDEC, UNDEC, ZERO, Series
from .._values import IntVal, const_eval, const_value

# -- elementwise unary ------------------------------------------------------------------------

R = Fraction


def _a0(u: Series) -> np.ndarray:
    return np.broadcast_to(u.coef(), u.shape)


def _log1p(u):
    if np.all(1.0 + _a0(u) > 0.5) and not S._pole_mask(u).any():
        return S.analytic(u, _taylor.taylor_log1p)
    return _singular.log(S.add_const(u, 1.0))


def _expm1(u):
    if S._pole_mask(u).any() or np.any(u.coef(ZERO, 1) != 0):
        return S.add_const(_singular.exp(u), -1.0)
    return S.analytic(u, _taylor.taylor_expm1)


def _atanh(u):
    if np.all(np.abs(_a0(u)) < 0.5) and not S._pole_mask(u).any():
        return S.analytic(u, _taylor.taylor_atanh)
    return S.scale(
        S.sub(_singular.log(S.add_const(u, 1.0)), _singular.log(S.sub(S.Series.exact(1.0), u))), 0.5
    )


def _acos(u):
    a0 = _a0(u)
    # within rounding of +-1 (cos of an angle computed as a / (|a| |b|)), 1 -+ u cancels to 0
    if np.all(np.abs(a0) < 1 - S.NEAR) and not S._pole_mask(u).any():
        return S.analytic(u, _taylor.taylor_acos)
    one = Series.exact(np.ones(u.shape))
    return S.scale(
        _singular.atan2(
            _singular.power(S.sub(one, u), R(1, 2)), _singular.power(S.add(one, u), R(1, 2))
        ),
        2.0,
    )


def _asin(u):
    a0 = _a0(u)
    if np.all(np.abs(a0) < 1 - S.NEAR) and not S._pole_mask(u).any():
        return S.analytic(u, _taylor.taylor_asin)
    return S.sub(Series.exact(np.full(u.shape, np.pi / 2)), _acos(u))


def _atan(u):
    """atan; at a pole, atan(u) = sign(u) pi / 2 - atan(1 / u) with 1 / u of positive valuation."""
    pole = S._pole_mask(u)
    if not pole.any():
        out = S.analytic(u, _taylor.taylor_atan)
        return out if u.inf is None else S.set_exact(out, *S.hard_limits(u, -np.pi / 2, np.pi / 2))
    sg, und = S.sign_of(u)
    one = Series.exact(np.ones(u.shape))
    w = S.analytic(_singular.inv(S.select(pole, u, one)), _taylor.taylor_atan)
    at_pole = S.sub(Series.exact(np.where(sg < 0, -np.pi / 2, np.pi / 2)), w)
    regular = S.analytic(S.select(pole, Series.zeros(u.shape), u), _taylor.taylor_atan)
    return S.flag(S.select(pole, at_pole, regular), pole & und, UNDEC)


def _sq(u):
    return S.mul(u, u)


def _tanh_exp(u):
    """tanh u = 1 - 2 / (exp(2 u) + 1)."""
    return S.sub(
        Series.exact(np.ones(u.shape)),
        S.scale(_singular.inv(S.add_const(_singular.exp(S.scale(u, 2.0)), 1.0)), 2.0),
    )


def _logistic_exp(u):
    """logistic u = 1 / (1 + exp(-u))."""
    return _singular.inv(S.add_const(_singular.exp(S.neg(u)), 1.0))


def _one_minus_sq(u):
    return S.sub(Series.exact(np.ones(u.shape)), _sq(u))


def _abs_sign(u):
    """(sign, undecided mask) where u is otherwise fine; flagged elements keep their status."""
    sg, und = S.sign_of(u)
    return sg, und & (u.bad == OK)


def _abs(u):
    sg, und = _abs_sign(u)
    if not und.any() and not (sg < 0).any() and u.inf is None:
        return u  # the identity (kept as the same value for a - a and a / a)
    iu, _, hard = S.inf_parts(u)  # |+-inf| = +inf
    # zero up to the horizon (no known term): so is |u|, whatever the sign (only the partial
    # of the reverse sweep needs it)
    unknown = und & (S.val(u) == np.inf)
    out = S.flag(S.scale(u, np.where(sg < 0, -1.0, 1.0)), und & ~iu & ~unknown, UNDEC)
    return S.with_inf(out, S.inf_make(iu, np.ones(u.shape), hard))


def _abs_partial(u, out):
    sg, und = _abs_sign(u)
    return S.flag(S._keep_bad(Series.exact(np.where(sg < 0, -1.0, 1.0)), u), und, UNDEC)


def _sign(u):
    sg, und = _abs_sign(u)
    return S.flag(S._keep_bad(Series.exact(sg), u), und, UNDEC)


def _sign_partial(u, out):
    sg, und = _abs_sign(u)
    return S.flag(S._keep_bad(Series.zeros(u.shape), u), und, UNDEC)


_SQRT_PI = 2.0 / math.sqrt(math.pi)

UNARY: dict[str, tuple[Callable, Callable]] = {
    "neg": (S.neg, lambda u, o: Series.exact(np.full(u.shape, -1.0))),
    "sqrt": (
        lambda u: _singular.power(u, R(1, 2)),
        lambda u, o: S.scale(_singular.power(u, R(-1, 2)), 0.5),
    ),
    "rsqrt": (
        lambda u: _singular.power(u, R(-1, 2)),
        lambda u, o: S.scale(_singular.power(u, R(-3, 2)), -0.5),
    ),
    "cbrt": (
        lambda u: _singular.power(u, R(1, 3)),
        lambda u, o: S.scale(_singular.power(u, R(-2, 3)), 1 / 3),
    ),
    "log": (_singular.log, lambda u, o: _singular.inv(u)),
    "log1p": (_log1p, lambda u, o: _singular.inv(S.add_const(u, 1.0))),
    "exp": (_singular.exp, lambda u, o: o),
    "exp2": (
        lambda u: _singular.exp(S.scale(u, math.log(2))),
        lambda u, o: S.scale(o, math.log(2)),
    ),
    "expm1": (_expm1, lambda u, o: S.add_const(o, 1.0)),
    "tanh": (
        lambda u: _singular.saturating(u, _taylor.taylor_tanh, -1.0, 1.0, _tanh_exp),
        lambda u, o: S.sub(Series.exact(np.ones(u.shape)), _sq(o)),
    ),
    "logistic": (
        lambda u: _singular.saturating(u, _taylor.taylor_logistic, 0.0, 1.0, _logistic_exp),
        lambda u, o: S.sub(o, _sq(o)),
    ),
    "erf": (
        lambda u: _singular.saturating(u, _taylor.taylor_erf, -1.0, 1.0),
        lambda u, o: S.scale(_singular.exp(S.neg(_sq(u))), _SQRT_PI),
    ),
    "erfc": (
        lambda u: S.sub(
            Series.exact(np.ones(u.shape)), _singular.saturating(u, _taylor.taylor_erf, -1.0, 1.0)
        ),
        lambda u, o: S.scale(_singular.exp(S.neg(_sq(u))), -_SQRT_PI),
    ),
    "sin": (
        lambda u: S.periodic_at_inf(S.analytic(u, _taylor.taylor_sin), u),
        lambda u, o: S.analytic(u, _taylor.taylor_cos),
    ),
    "cos": (
        lambda u: S.periodic_at_inf(S.analytic(u, _taylor.taylor_cos), u),
        lambda u, o: S.neg(S.analytic(u, _taylor.taylor_sin)),
    ),
    "tan": (
        lambda u: S.periodic_at_inf(S.analytic(u, _taylor.taylor_tan), u),
        lambda u, o: S.add_const(_sq(o), 1.0),
    ),
    "atan": (lambda u: _atan(u), lambda u, o: _singular.inv(S.add_const(_sq(u), 1.0))),
    "atanh": (_atanh, lambda u, o: _singular.inv(_one_minus_sq(u))),
    "asin": (_asin, lambda u, o: _singular.power(_one_minus_sq(u), R(-1, 2))),
    "acos": (_acos, lambda u, o: S.neg(_singular.power(_one_minus_sq(u), R(-1, 2)))),
    "sinh": (
        lambda u: S.scale(S.sub(_singular.exp(u), _singular.exp(S.neg(u))), 0.5),
        lambda u, o: S.scale(S.add(_singular.exp(u), _singular.exp(S.neg(u))), 0.5),
    ),
    "cosh": (
        lambda u: S.scale(S.add(_singular.exp(u), _singular.exp(S.neg(u))), 0.5),
        lambda u, o: S.scale(S.sub(_singular.exp(u), _singular.exp(S.neg(u))), 0.5),
    ),
    "asinh": (
        lambda u: _singular.log(S.add(u, _singular.power(S.add_const(_sq(u), 1.0), R(1, 2)))),
        lambda u, o: _singular.power(S.add_const(_sq(u), 1.0), R(-1, 2)),
    ),
    "acosh": (
        lambda u: _singular.log(S.add(u, _singular.power(S.add_const(_sq(u), -1.0), R(1, 2)))),
        lambda u, o: _singular.power(S.add_const(_sq(u), -1.0), R(-1, 2)),
    ),
    "square": (_sq, lambda u, o: S.scale(u, 2.0)),
    "abs": (_abs, _abs_partial),
    "sign": (_sign, _sign_partial),
}


def _at_hard_inf(name: str, u: Series, out: Series):
    """(out, mask): where u is +-inf for every small t (a hard infinity of known sign), f of it
    is f(+-inf) for every t, as IEEE arithmetic gives it (atanh(inf) = nan, tanh(inf) = 1,
    sqrt(inf) = inf): a constant, an infinity or a NaN, whatever the rule made of it."""
    if u.inf is None or name not in TWINS:
        return out, None
    iu, sg, hard = S.inf_parts(u)
    m = iu & hard & (sg != 0)
    if not m.any():
        return out, None
    with np.errstate(all="ignore"):
        v = np.asarray(
            TWINS[name].fn(None, [np.where(sg > 0, np.inf, -np.inf)], np.float64), np.float64
        )
    fin = m & np.isfinite(v)
    out = S.set_exact(out, fin, np.where(fin, v, 0.0))
    code = np.where(m & np.isnan(v), S.NAN, np.where(m & np.isinf(v), np.sign(v) * S.HARD, 0))
    return S.with_inf(out, code), m


def _unary_fwd(fn):
    def rule(ctx, eqn, ins, act):
        out, m = _at_hard_inf(eqn.primitive.name, ins[0], fn(ins[0]))
        return [out], m

    return rule


def _unary_bwd(partial):
    def rule(ctx, eqn, ins, outs, aux, cots, need):
        c = cots[0] if aux is None else S.restrict(cots[0], ~aux)  # constant where +-inf
        return [S.rmul(c, partial(ins[0], outs[0]))]

    return rule


for _n, (_f, _p) in UNARY.items():
    FWD[_n] = _unary_fwd(_f)
    BWD[_n] = _unary_bwd(_p)


def _ipow_fwd(ctx, eqn, ins, act):
    return [_singular.ipow(ins[0], int(eqn.params["y"]))], None


def _ipow_bwd(ctx, eqn, ins, outs, aux, cots, need):
    n = int(eqn.params["y"])
    return [S.rmul(cots[0], S.scale(_singular.ipow(ins[0], n - 1), float(n)))]


FWD["integer_pow"] = _ipow_fwd
BWD["integer_pow"] = _ipow_bwd


def _identity_fwd(ctx, eqn, ins, act):
    return [ins[0]], None


def _identity_bwd(ctx, eqn, ins, outs, aux, cots, need):
    return [cots[0]]


for _n in ("copy", "copy_p", "optimization_barrier", "reduce_precision", "real"):
    FWD[_n] = _identity_fwd
    BWD[_n] = _identity_bwd


def _step_fwd(ctx, eqn, ins, act):
    """floor, ceil and round: constant for small t. Where the limit u0 is a jump point (an
    integer for floor and ceil, a half-integer for round) the side is the sign of the leading
    term of u - u0 (floor(1 - t) = 0, not floor(1)); undecided where that sign is, or where u0
    is within rounding of a jump point without being one."""
    u = ins[0]
    if isinstance(u, IntVal):
        return const_eval(eqn, ins), None
    name = eqn.primitive.name
    a0 = np.broadcast_to(u.coef(), u.shape)
    if name == "floor":
        at, here = np.floor(a0), np.floor(a0)
        jump, below, above = a0 == at, a0 - 1.0, a0
    elif name == "ceil":
        at, here = np.ceil(a0), np.ceil(a0)
        jump, below, above = a0 == at, a0, a0 + 1.0
    else:  # round: rounding_method 0 is half away from zero, 1 half to even
        away = int(eqn.params.get("rounding_method", 0)) == 0
        fl = np.floor(a0)
        here = np.where(a0 >= 0, np.floor(a0 + 0.5), np.ceil(a0 - 0.5)) if away else np.round(a0)
        at = fl + 0.5
        jump, below, above = a0 == at, fl, fl + 1.0
    d = S.drop_const(u)
    sg, und = S.sign_of(d)
    ez = S.exact_zero(d)
    val = np.where(jump & ~ez, np.where(sg > 0, above, below), here)
    near = ~jump & (np.abs(a0 - at) <= S.NEAR * np.maximum(1.0, np.abs(a0)))
    pole = S._pole_mask(u)
    sgu, undu = S.sign_of(u)
    grows = pole & ~undu & (sgu != 0) & (u.bad == OK)  # floor(-1/t), floor(log t): -> -+inf
    undec = ((jump & ~ez & und) | near | pole | (u.H <= S.EPS)) & ~grows
    out = S.flag(S._keep_bad(Series.exact(np.where(undec | grows, 0.0, val)), u), undec, UNDEC)
    out = S.with_inf(out, np.where(grows, S.SOFT * np.sign(sgu), 0))
    if u.inf is not None:  # floor(+-inf) = +-inf, floor(nan) = nan
        out = S.with_inf(out, S.inf_code(u))
    return [out], undec | grows


def _step_bwd(ctx, eqn, ins, outs, aux, cots, need):
    c = cots[0]  # a constant function of t: no cotangent, where decided
    und = np.broadcast_to(aux, c.shape) & ~S.exact_zero(c)
    return [S.flag(Series.zeros(c.shape), und, UNDEC)]


for _n in ("floor", "ceil", "round"):
    FWD[_n], BWD[_n] = _step_fwd, _step_bwd


def _stop_fwd(ctx, eqn, ins, act):
    return [ins[0]], None


FWD["stop_gradient"] = _stop_fwd
BWD["stop_gradient"] = lambda ctx, eqn, ins, outs, aux, cots, need: [None]


def _convert_fwd(ctx, eqn, ins, act):
    x = ins[0]
    new = (
        np.dtype(eqn.params["new_dtype"])
        if str(eqn.params["new_dtype"]) != "bfloat16"
        else np.dtype(np.float32)
    )
    to_float = np.issubdtype(new, np.floating)
    if isinstance(x, IntVal):
        if to_float:
            s = Series.exact(x.x.astype(np.float64))
            return [S.flag(s, x.bad != OK, x.bad.max() if x.bad.any() else OK)], None
        return [IntVal(x.x.astype(new), x.bad)], None
    if to_float:
        return [x], None
    # float -> int/bool: piecewise constant
    c0 = _a0(x)
    rest = S.drop_const(x)
    sg, und = S.sign_of(rest)
    undec = (x.H <= S.EPS) | (x.bad != OK)
    dom = x.bad == DOMAIN
    if new == np.bool_:
        vals = np.where(c0 != 0, True, sg != 0)
        undec = undec | ((c0 == 0) & und)
    else:
        integral = np.floor(c0) == c0
        base = np.trunc(c0)
        # at an integer c0 the sign of the rest decides the side (truncation toward zero)
        step = np.where(integral & (sg < 0) & (c0 > 0), -1, 0) + np.where(
            integral & (sg > 0) & (c0 < 0), 1, 0
        )
        vals = base + step
        undec = undec | (integral & und)
    return [
        IntVal(
            np.asarray(vals).astype(new),
            np.where(
                dom,
                DOMAIN,
                np.where(undec, np.where(x.bad == POISON, PUNDEC, np.maximum(x.bad, UNDEC)), OK),
            ),
        )
    ], None


FWD["convert_element_type"] = _convert_fwd
BWD["convert_element_type"] = lambda ctx, eqn, ins, outs, aux, cots, need: [
    cots[0] if isinstance(ins[0], Series) and isinstance(outs[0], Series) else None
]


# -- elementwise binary -----------------------------------------------------------------------


def _add_fwd(ctx, eqn, ins, act):
    a, b = ins
    if isinstance(a, IntVal):
        return const_eval(eqn, ins), None
    return [S.add(a, b, -1.0 if eqn.primitive.name == "sub" else 1.0)], None


def _add_bwd(ctx, eqn, ins, outs, aux, cots, need):
    c = cots[0]
    if eqn.primitive.name != "sub":
        return [c, c]
    res = [c, S.neg(c)]
    return _constant_of_itself(res, ins[0].bad == OK) if ins[0] is ins[1] else res


def _constant_of_itself(cots: list, where) -> list:
    """The cotangents of ``a - a`` or ``a / a``: a constant function of x (0, 1) wherever
    ``where`` holds, so exact zeros there whatever the cotangent (even an infinite one, as
    arccos'(1) in arccos(x / x)); the two usual halves, which cancel, elsewhere."""
    return [None if c is None else S.restrict(c, ~np.broadcast_to(where, c.shape)) for c in cots]


for _n in ("add", "sub", "add_any"):
    FWD[_n] = _add_fwd
    BWD[_n] = _add_bwd


def _mul_fwd(ctx, eqn, ins, act):
    a, b = ins
    if isinstance(a, IntVal):
        return const_eval(eqn, ins), None
    return [S.mul(a, b)], None


def _mul_bwd(ctx, eqn, ins, outs, aux, cots, need):
    a, b = ins
    c = cots[0]
    return [S.rmul(c, b) if need[0] else None, S.rmul(c, a) if need[1] else None]


FWD["mul"] = _mul_fwd
BWD["mul"] = _mul_bwd


def _div_fwd(ctx, eqn, ins, act):
    a, b = ins
    if isinstance(a, IntVal):
        return const_eval(eqn, ins), None
    out = S.mul(a, _singular.inv(b))
    if a is b:  # a / a = 1 exactly wherever a is known to be nonzero for small t
        nz = S.lead_exact(a)[3] & (a.bad == OK)
        out = S.select(nz, Series.exact(np.ones(a.shape)), out)
    # 0 / 0 of identically zero values is undefined everywhere on the ray (NaN)
    return [S.flag(out, S.exact_zero(a) & S.exact_zero(b), DOMAIN)], None


def _div_bwd(ctx, eqn, ins, outs, aux, cots, need):
    a, b = ins
    c = cots[0]
    if a is b:  # a / a = 1 where a is known to be nonzero for small t (see _div_fwd)
        nz = S.lead_exact(a)[3] & (a.bad == OK)
        if nz.all():
            return [Series.zeros(a.shape), Series.zeros(a.shape)]
    ib = _singular.inv(b)
    ca = S.rmul(c, ib) if need[0] else None
    cb = S.neg(S.rmul(c, S.mul(outs[0], ib))) if need[1] else None
    return _constant_of_itself([ca, cb], nz) if a is b else [ca, cb]


FWD["div"] = _div_fwd
BWD["div"] = _div_bwd


def _pow_exponents(y: Series) -> np.ndarray | None:
    """Rational exponents per element when y is an exact constant, else None."""
    cv = const_value(y)
    if cv is None:
        return None
    cv = np.asarray(cv)
    out = np.empty(cv.shape, dtype=object)
    for idx in np.ndindex(cv.shape):
        q = _singular.rational(float(cv[idx]), exact=True)  # x ** 0.4636...: its exact dyadic value
        if q is None:
            return None
        out[idx] = q
    return out


def _pow_const(x: Series, P: np.ndarray, shift: int = 0) -> Series | None:
    shape = np.broadcast_shapes(x.shape, P.shape)
    x = S.bcast(x, shape)
    P = np.broadcast_to(P, shape)
    out = None
    for p in sorted(set(P.ravel())):
        m = P == p
        r = _singular.power(x, p + shift, odd_roots=False)  # IEEE pow: (-8) ** (1/3) is NaN
        if shift:
            r = S.scale(r, float(p))
        out = r if out is None else S.select(m, r, out)
        if out is r and len(set(P.ravel())) == 1:
            return r
        out = S.select(m, r, out)
    return out


def _pow_fwd(ctx, eqn, ins, act):
    x, y = ins
    if isinstance(y, IntVal):
        y = Series.exact(y.x.astype(np.float64))
    P = _pow_exponents(y)
    if P is not None:
        return [_pow_const(x, P)], None
    shape = np.broadcast_shapes(x.shape, y.shape)
    x, y = S.bcast(x, shape), S.bcast(y, shape)
    zx = S.exact_zero(x) & (x.bad == OK)
    gen = _singular.exp(S.mul(y, _singular.log(x)))
    if zx.any():  # 0 ** y(t) for each small t: 0 where y > 0, 1 where y = 0, inf where y < 0
        sg, und = S.sign_of(y)
        ok = zx & ~und & (y.bad == OK)
        ez = S.exact_zero(y)
        gen = S.select(ok & (sg > 0), Series.zeros(shape), S.flag(gen, zx & ~ok, UNDEC))
        gen = S.set_exact(gen, ok & ez, 1.0)
        pinf = S.HARD if x._pz else S.ANYHARD  # (-0.0) ** -1 is -inf, (+0.0) ** y is +inf
        gen = S.with_inf(gen, np.where(ok & (sg < 0) & ~ez, pinf, 0))
    return [gen], None


def _pow_bwd(ctx, eqn, ins, outs, aux, cots, need):
    x, y = ins
    if isinstance(y, IntVal):
        y = Series.exact(y.x.astype(np.float64))
    c = cots[0]
    P = _pow_exponents(y)
    cx = cy = None
    if need[0]:
        if P is not None:
            cx = S.rmul(c, _pow_const(x, P, shift=-1))
        else:
            cx = S.rmul(c, S.mul(y, _singular.exp(S.mul(S.add_const(y, -1.0), _singular.log(x)))))
    if need[1]:
        cy = S.rmul(c, S.mul(_singular.log(x), outs[0], absorb=True))
    return [cx, cy]


FWD["pow"] = _pow_fwd
BWD["pow"] = _pow_bwd


def _atan2_fwd(ctx, eqn, ins, act):
    return [_singular.atan2(ins[0], ins[1])], None


def _atan2_bwd(ctx, eqn, ins, outs, aux, cots, need):
    y, x = ins
    r = _singular.inv(S.add(_sq(x), _sq(y)))
    c = cots[0]
    if y.inf is not None or x.inf is not None:  # constant where an argument is infinite
        c = S.restrict(c, ~_singular.atan2_at_inf(y, x)[0])
    return [
        S.rmul(c, S.mul(x, r)) if need[0] else None,
        S.neg(S.rmul(c, S.mul(y, r))) if need[1] else None,
    ]


FWD["atan2"] = _atan2_fwd
BWD["atan2"] = _atan2_bwd


def _cmp_sign(a, b):
    """(sign of a - b as t -> 0+, undecided mask, exact-tie mask, status codes: DOMAIN where an
    operand is outside the domain, else PUNDEC / UNDEC where undecided, else OK).

    A signed infinity (:func:`S.inf_sign`) compares against a bounded value or against the
    opposite infinity; where either side is outside the domain, so is the comparison."""
    d = S.sub(a, b)
    sg, und = S.sign_of(d)
    shape = d.shape
    if a.inf is not None or b.inf is not None:
        _, sa, ha = S.inf_parts(a, shape)
        _, sb, hb = S.inf_parts(b, shape)
        # a finite value (for each t) loses to a hard infinity, a bounded one to any infinity
        fa, fb = np.broadcast_to(a.bad == OK, shape), np.broadcast_to(b.bad == OK, shape)
        ba, bb = np.broadcast_to(S.bounded(a), shape), np.broadcast_to(S.bounded(b), shape)
        dec = ((sa != 0) & (((sb != 0) & (sb != sa)) | bb | (ha & fb))) | (
            (sb != 0) & (ba | (hb & fa))
        )
        sg = np.where(dec, np.where(sa != 0, sa, -sb), sg).astype(np.float64)
        und = und & ~dec
    worst = np.maximum(np.broadcast_to(a.bad, shape), np.broadcast_to(b.bad, shape))
    codes = np.where(
        worst == DOMAIN,
        DOMAIN,
        np.where(und, np.where((worst == POISON) | (worst == PUNDEC), PUNDEC, UNDEC), OK),
    ).astype(np.int8)
    return sg, und, (sg == 0) & ~und, codes


def _maxmin(a: Series, b: Series, big: bool):
    shape = np.broadcast_shapes(a.shape, b.shape)
    a, b = S.bcast(a, shape), S.bcast(b, shape)
    sg, und, tie, codes = _cmp_sign(a, b)
    pick_a = (sg > 0) if big else (sg < 0)
    out = S.flag_codes(S.select(pick_a | tie, a, b), codes)
    und = np.where(und, codes, OK)
    wa = np.where(tie, 0.5, np.where(pick_a, 1.0, 0.0))
    return out, (wa, 1.0 - wa, und)


def _max_fwd(ctx, eqn, ins, act):
    a, b = ins
    if isinstance(a, IntVal):
        return const_eval(eqn, ins), None
    out, aux = _maxmin(a, b, eqn.primitive.name == "max")
    return [out], aux


def _weighted(c: Series, w, und) -> Series:
    """A cotangent times a branch weight; an undecided branch (``und``: its status codes, OK
    where decided) matters only where the cotangent is not identically zero."""
    out = S.rmul(c, Series.exact(np.asarray(w, np.float64)))
    und = np.broadcast_to(und, out.shape)
    if und.any():
        und = np.where(np.broadcast_to(S.exact_zero(c), out.shape), OK, und)
    return S.flag_codes(out, und)


def _max_bwd(ctx, eqn, ins, outs, aux, cots, need):
    wa, wb, und = aux
    c = cots[0]
    return [_weighted(c, wa, und) if need[0] else None, _weighted(c, wb, und) if need[1] else None]


for _n in ("max", "min"):
    FWD[_n] = _max_fwd
    BWD[_n] = _max_bwd


def _clamp_fwd(ctx, eqn, ins, act):
    lo, x, hi = ins
    if isinstance(x, IntVal):
        return const_eval(eqn, ins), None
    m1, (w_x1, w_lo, u1) = _maxmin(x, lo, True)
    m2, (w_m1, w_hi, u2) = _maxmin(m1, hi, False)
    return [m2], (w_x1, w_lo, u1, w_m1, w_hi, u2)


def _clamp_bwd(ctx, eqn, ins, outs, aux, cots, need):
    w_x1, w_lo, u1, w_m1, w_hi, u2 = aux
    c = cots[0]
    c_m1 = _weighted(c, w_m1, u2)
    return [
        _weighted(c_m1, w_lo, u1) if need[0] else None,
        _weighted(c_m1, w_x1, u1) if need[1] else None,
        _weighted(c, w_hi, u2) if need[2] else None,
    ]


FWD["clamp"] = _clamp_fwd
BWD["clamp"] = _clamp_bwd

_CMP = {
    "gt": lambda s: s > 0,
    "ge": lambda s: s >= 0,
    "lt": lambda s: s < 0,
    "le": lambda s: s <= 0,
    "eq": lambda s: s == 0,
    "ne": lambda s: s != 0,
}
# total-order comparisons (lax.lt_to, ...): the same on numbers and infinities; a NaN, which the
# total order places, is undecided here
_CMP.update({"lt_to": _CMP["lt"], "le_to": _CMP["le"], "eq_to": _CMP["eq"]})


def _cmp_fwd(ctx, eqn, ins, act):
    a, b = ins
    if isinstance(a, IntVal) or isinstance(b, IntVal):
        return const_eval(eqn, ins), None
    name = eqn.primitive.name
    if a is b:  # x compared with itself (isnan is x != x): equal wherever x is a number or
        code = S.inf_code(a)  # an infinity for each t, unordered where it is NaN (outside the
        nan = S.nan_mask(a) | (a.bad == DOMAIN)  # domain is NaN for every small t)
        known = ((a.bad == OK) | ((code != 0) & ~nan)) & ~(nan & name.endswith("_to"))
        res = np.where(nan, name == "ne", _CMP[name](np.zeros(a.shape)))
        codes = np.where(
            known | (nan & ~name.endswith("_to")), OK, _choice_codes(a.bad, a.shape)
        ).astype(np.int8)
        return [IntVal(res, codes)], None
    sg, und, _, codes = _cmp_sign(a, b)
    res = _CMP[name](sg)
    if a.inf is not None or b.inf is not None:
        # a NaN for every small t: unordered, as IEEE compares it (only `ne` holds)
        nan = np.broadcast_to(S.nan_mask(a), res.shape) | np.broadcast_to(S.nan_mask(b), res.shape)
        if nan.any():
            res = np.where(nan, eqn.primitive.name == "ne", res)
            codes = np.where(nan, OK, codes).astype(np.int8)
    return [IntVal(res, codes)], None


for _n in _CMP:
    FWD[_n] = _cmp_fwd


def _select_fwd(ctx, eqn, ins, act):
    pred, *cases = ins
    if all(isinstance(c, IntVal) for c in cases):
        if pred.bad.any() or any(c.bad.any() for c in cases):
            bad = np.maximum.reduce([np.broadcast_to(x.bad, cases[0].shape) for x in ins])
            out = _bind(eqn, [pred.x] + [c.x for c in cases])[0]
            return [IntVal(np.asarray(out), bad)], None
        return const_eval(eqn, ins), None
    cases = [Series.exact(c.x.astype(np.float64)) if isinstance(c, IntVal) else c for c in cases]
    shape = cases[0].shape
    p = np.broadcast_to(pred.x.astype(np.int64), shape)
    out = cases[-1]
    for k in range(len(cases) - 2, -1, -1):
        out = S.select(p == k, cases[k], out)
    codes = _choice_codes(pred.bad, shape)
    und = (codes != OK) & (codes != DOMAIN)
    if und.any():
        # an undecided choice: the status of whichever case the placeholder picked says nothing
        # (it is outside the domain for sure only where every case is)
        every = np.logical_and.reduce([np.broadcast_to(c.bad == DOMAIN, shape) for c in cases])
        out = S.mk(out.terms, out.H, np.where(und & ~every, codes, out.bad), shape)
    return [S.flag_codes(out, codes)], None


def _choice_codes(bad, shape) -> np.ndarray:
    """The status of a value chosen by an index or predicate with status ``bad``."""
    b = np.broadcast_to(bad, shape)
    return np.where(b == POISON, PUNDEC, np.where(b == OK, OK, np.maximum(b, PUNDEC))).astype(
        np.int8
    )


def _select_bwd(ctx, eqn, ins, outs, aux, cots, need):
    pred = ins[0]
    c = cots[0]
    p = np.broadcast_to(pred.x.astype(np.int64), c.shape)
    und = _choice_codes(pred.bad, c.shape)
    if und.any():  # an undecided choice matters only where the cotangent is not exactly zero
        und = np.where(S.exact_zero(c), OK, und)
    res: list = [None]
    for k in range(len(ins) - 1):
        if need[k + 1]:
            res.append(S.flag_codes(S.restrict(c, p == k), und))
        else:
            res.append(None)
    return res


def _is_finite_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return const_eval(eqn, ins), None
    # finite for each small t where OK; not where +-inf or NaN for each t (POISON, with or
    # without an inf code, or outside the domain); unknown where undecided
    known = (x.bad == OK) | (x.bad == DOMAIN) | (x.bad == POISON)
    return [IntVal(x.bad == OK, np.where(known, OK, UNDEC))], None


FWD["is_finite"] = _is_finite_fwd
FWD["select_n"] = _select_fwd
BWD["select_n"] = _select_bwd


# pure: one evaluation per ray for a repeated equation
PURE.update(UNARY)
PURE.update(_CMP)
PURE.update(
    {
        "integer_pow",
        "convert_element_type",
        "add",
        "sub",
        "add_any",
        "mul",
        "div",
        "pow",
        "atan2",
        "max",
        "min",
        "clamp",
        "select_n",
        "is_finite",
        "copy",
        "copy_p",
    }
)
