"""gradsan.jax.certify: ray-Puiseux AD (theory.md section 6.5, Tiers B and C).

Along random rays x0 + t v, t -> 0+, every intermediate of the loss's jaxpr is propagated as a
truncated generalized power series (:mod:`._series`), then a reverse sweep with series-valued
local partials and cotangents gives each input a gradient series G(t). Per ray the verdict is

* DEFINED: G has no divergent term; its t^0 coefficient is lim_{t->0+} grad f(x0 + t v);
* SINGULAR: the value diverges, the increment's leading exponent is < 1 (or 1 with a log), or
  G diverges; the certificate is the leading term;
* DISCONTINUOUS: the limit of f along the ray differs from f(x0);
* REMOVABLE: f(x0) is NaN but the limit (and a gradient limit) exists;
* DOMAIN: the ray leaves the real domain;
* UNDECIDED: horizon, cancellation or an unsupported primitive stopped the rules.

Several rays (v and -v first) certify "not differentiable" (different limits, or
f'(x; v) + f'(x; -v) != 0) and give the minimum-norm element of the hull of the limits, labelled
as a Clarke subgradient. The result is checked against itself: G(v) . v must equal the forward
series' f'(x0; v), or the ray is reported UNDECIDED with an internal-error note.

Cost. One plain (numpy) evaluation at x0 gives f(x0) and the singular points ("events": a zero
under sqrt or a division, a tie under max, ...). The first pass along the rays keeps the t^0 and
t^1 terms (all that f'(x0; v) and the limit of the gradient need), with the events and what feeds
them at the cap of ``terms``, and the reverse sweep keeps the cotangents' terms below t^1; only a
ray left UNDECIDED is run again with ``terms`` everywhere, then doubled twice. The rays of that
first pass go through one sweep of the loss vmapped over stacked parameters. Repeated
subexpressions are evaluated once per ray, so that they tie exactly (a - a, min(a, a), a / a).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import string
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from .._errors import UsageError
from .._report import Finding, Frame, Report
from .._report._records import OutputHit
from . import _series as S
from ._compat import bind as _bind
from ._compat import closed as _closed
from ._series import DOMAIN, OK, POISON, PUNDEC, UNDEC, ZERO, Series, Undecided

__all__ = ["certify"]

VERDICTS = ("DEFINED", "SINGULAR", "DISCONTINUOUS", "REMOVABLE", "DOMAIN", "UNDECIDED")


# -- values -----------------------------------------------------------------------------------


class IntVal:
    """A boolean or integer value: constant along the ray for small t (bad: undecided/flagged)."""

    __slots__ = ("x", "bad")

    def __init__(self, x, bad=None):
        self.x = np.asarray(x)
        self.bad = np.zeros(self.x.shape, np.int8) if bad is None else np.asarray(bad, np.int8)

    @property
    def shape(self):
        return self.x.shape


def _is_float_aval(aval) -> bool:
    return np.issubdtype(np.dtype(aval.dtype), np.floating) or np.issubdtype(
        np.dtype(aval.dtype), np.complexfloating
    )


def _lift(x, aval=None) -> Series | IntVal:
    a = np.asarray(x)
    dt = aval.dtype if aval is not None else a.dtype
    if np.issubdtype(np.dtype(dt), np.complexfloating):
        raise Undecided("complex values are not supported")
    if np.issubdtype(np.dtype(dt), np.floating) or str(dt) == "bfloat16":
        return Series.exact(a.astype(np.float64))
    return IntVal(a)


def _const_value(v) -> np.ndarray | None:
    if isinstance(v, IntVal):
        return None if v.bad.any() else v.x
    if v.is_const():
        return v.coef()
    return None


@dataclasses.dataclass
class Ctx:
    unverified: set = dataclasses.field(default_factory=set)
    notes: list = dataclasses.field(default_factory=list)
    # per ray: equations already evaluated, by (primitive, params, identity of the inputs); a
    # repeated subexpression gets the very same value, so that a - a and min(a, a) are exact
    memo: dict = dataclasses.field(default_factory=dict)
    # per equation (id of its jaxpr, index): the truncation cap it runs under, where it differs
    # from the ambient one (the singular points at x0 and what feeds them: `_at_point`, `_caps`)
    caps: dict = dataclasses.field(default_factory=dict)
    bwd_cap: float | None = None  # the reverse sweep's cap, where it differs from the forward's
    data: list = dataclasses.field(default_factory=list)  # the jaxpr's inputs after the params


@dataclasses.dataclass
class Tape:
    jaxpr: Any
    env: dict
    active: set
    aux: dict


def _read(env, v):
    if isinstance(v, jcore.Literal):
        return _lift(v.val, v.aval)
    return env[v]


# -- the forward and reverse sweeps ------------------------------------------------------------


def fwd_jaxpr(ctx: Ctx, jaxpr, consts: list, args: list, active_in: Sequence[bool]):
    env: dict = {}
    active: set = set()
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c if isinstance(c, (Series, IntVal)) else _lift(c, v.aval)
    for v, a, act in zip(jaxpr.invars, args, active_in):
        env[v] = a
        if act:
            active.add(v)
    aux: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        ins = [_read(env, v) for v in eqn.invars]
        act = [(not isinstance(v, jcore.Literal)) and v in active for v in eqn.invars]
        name = eqn.primitive.name
        key = _memo_key(eqn, ins) if name in _PURE else None
        hit = ctx.memo.get(key) if key is not None else None
        rule = FWD.get(name)
        c = ctx.caps.get((id(jaxpr), i)) if ctx.caps else None
        if hit is not None:
            outs, a = hit[0], hit[1]
        elif c is not None:
            with S.capped(c):
                outs, a = _fwd_rule(ctx, rule, eqn, ins, act)
        else:
            outs, a = _fwd_rule(ctx, rule, eqn, ins, act)
        if key is not None and hit is None:
            ctx.memo[key] = (outs, a, ins)  # ins: keeps the objects whose ids are in the key
        aux[i] = a
        any_act = any(act)
        for v, o in zip(eqn.outvars, outs):
            if isinstance(v, jcore.DropVar):
                continue
            env[v] = o
            if any_act and isinstance(o, Series):
                active.add(v)
    outs = [_read(env, v) for v in jaxpr.outvars]
    return outs, Tape(jaxpr, env, active, aux)


def _fwd_rule(ctx: Ctx, rule, eqn, ins, act):
    if rule is None and not any(act):
        return _const_eval(eqn, ins), None
    if rule is None:
        return _fallback_fwd(ctx, eqn, ins, act)
    return rule(ctx, eqn, ins, act)


_PARAMS: dict = {}  # id(eqn) -> (eqn, its params as a hashable key or None)


def _memo_key(eqn, ins) -> tuple | None:
    """(primitive, params, inputs): inputs by identity, literals by value; None if unhashable."""
    hit = _PARAMS.get(id(eqn))
    if hit is None or hit[0] is not eqn:
        try:
            params = tuple(sorted(eqn.params.items()))
            hash(params)
        except TypeError:
            params = None
        if len(_PARAMS) > 100_000:
            _PARAMS.clear()
        hit = _PARAMS[id(eqn)] = (eqn, params)
    params = hit[1]
    if params is None:
        return None
    keys = []
    for v, x in zip(eqn.invars, ins):
        if isinstance(v, jcore.Literal):
            a = np.asarray(v.val)
            keys.append(("lit", a.dtype.str, a.shape, a.tobytes()))
        else:
            keys.append(id(x))
    return (eqn.primitive.name, params, tuple(keys))


def bwd_jaxpr(ctx: Ctx, tape: Tape, out_cots: list) -> list:
    """Cotangents (Series or None) for the jaxpr's invars, given those of its outvars."""
    jaxpr = tape.jaxpr
    cot: dict = {}

    def acc(v, c):
        if c is None or isinstance(v, jcore.Literal) or v not in tape.active:
            return
        old = cot.get(v)
        cot[v] = c if old is None else S.add(old, c)

    for v, c in zip(jaxpr.outvars, out_cots):
        acc(v, c)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        couts = [None if isinstance(v, jcore.DropVar) else cot.pop(v, None) for v in eqn.outvars]
        if all(c is None for c in couts):
            continue
        need = [(not isinstance(v, jcore.Literal)) and v in tape.active for v in eqn.invars]
        if not any(need):
            continue
        ins = [_read(tape.env, v) for v in eqn.invars]
        outs = [tape.env.get(v) if not isinstance(v, jcore.DropVar) else None for v in eqn.outvars]
        for k, (c, o) in enumerate(zip(couts, outs)):
            if c is None and isinstance(o, Series):
                couts[k] = Series.zeros(o.shape)
        rule = BWD.get(eqn.primitive.name)
        if rule is None:
            rule = _fallback_bwd
        c = ctx.caps.get((id(jaxpr), i)) if ctx.caps else None
        if c is not None:
            with S.capped(c):
                cins = rule(ctx, eqn, ins, outs, tape.aux.get(i), couts, need)
        else:
            cins = rule(ctx, eqn, ins, outs, tape.aux.get(i), couts, need)
        for v, c, n in zip(eqn.invars, cins, need):
            if n and c is not None:
                acc(v, _fit(c, _read(tape.env, v).shape))
    return [cot.get(v) for v in jaxpr.invars]


def _fit(c: Series, shape) -> Series:
    """Sum a cotangent over broadcast dimensions down to the operand's shape."""
    shape = tuple(shape)
    if c.shape == shape:
        return c
    if not shape:
        axes = tuple(range(len(c.shape)))
        return S.apply_linear(
            c,
            lambda a: np.sum(a, axis=axes),
            lambda h: np.min(h, axis=axes),
            lambda b: np.max(b, axis=axes),
        )
    lead_n = len(c.shape) - len(shape)
    axes = tuple(range(lead_n)) + tuple(
        lead_n + i for i, n in enumerate(shape) if n == 1 and c.shape[lead_n + i] != 1
    )

    def f(a, red=np.sum):
        return np.reshape(red(a, axis=axes), shape) if axes else np.reshape(a, shape)

    hu = S.uniform_h(c)  # uniform horizon, no flags: no reductions for them
    fH = (lambda h: np.full(shape, hu)) if hu is not None else functools.partial(f, red=np.min)
    fbad = (
        (lambda b: np.zeros(shape, np.int8))
        if not np.count_nonzero(c.bad)
        else functools.partial(f, red=np.max)
    )
    return S.apply_linear(c, f, fH, fbad)


# -- rule registries ---------------------------------------------------------------------------

FWD: dict[str, Callable] = {}
BWD: dict[str, Callable] = {}


def _const_eval(eqn, ins) -> list:
    vals = []
    for x in ins:
        cv = _const_value(x)
        if cv is None:
            raise Undecided(f"`{eqn.primitive.name}` got a value that is not constant on the ray")
        vals.append(cv)
    with jax.default_device(jax.devices("cpu")[0]):
        outs = _bind(eqn, [np.asarray(v) for v in vals])
    return [_lift(np.asarray(o), v.aval) for o, v in zip(outs, eqn.outvars)]


def _bad_of(x) -> np.ndarray:
    return x.bad


# -- elementwise unary ------------------------------------------------------------------------

R = Fraction


def _a0(u: Series) -> np.ndarray:
    return np.broadcast_to(u.coef(), u.shape)


def _log1p(u):
    if np.all(1.0 + _a0(u) > 0.5) and not S._pole_mask(u).any():
        return S.analytic(u, S.taylor_log1p)
    return S.log(S.add_const(u, 1.0))


def _expm1(u):
    if S._pole_mask(u).any() or np.any(u.coef(ZERO, 1) != 0):
        return S.add_const(S.exp(u), -1.0)
    return S.analytic(u, S.taylor_expm1)


def _atanh(u):
    if np.all(np.abs(_a0(u)) < 0.5) and not S._pole_mask(u).any():
        return S.analytic(u, S.taylor_atanh)
    return S.scale(S.sub(S.log(S.add_const(u, 1.0)), S.log(S.sub(S.Series.exact(1.0), u))), 0.5)


def _acos(u):
    a0 = _a0(u)
    # within rounding of +-1 (cos of an angle computed as a / (|a| |b|)), 1 -+ u cancels to 0
    if np.all(np.abs(a0) < 1 - _NEAR) and not S._pole_mask(u).any():
        return S.analytic(u, S.taylor_acos)
    one = Series.exact(np.ones(u.shape))
    return S.scale(S.atan2(S.power(S.sub(one, u), R(1, 2)), S.power(S.add(one, u), R(1, 2))), 2.0)


def _asin(u):
    a0 = _a0(u)
    if np.all(np.abs(a0) < 1 - _NEAR) and not S._pole_mask(u).any():
        return S.analytic(u, S.taylor_asin)
    return S.sub(Series.exact(np.full(u.shape, np.pi / 2)), _acos(u))


def _atan(u):
    """atan; at a pole, atan(u) = sign(u) pi / 2 - atan(1 / u) with 1 / u of positive valuation."""
    pole = S._pole_mask(u)
    if not pole.any():
        out = S.analytic(u, S.taylor_atan)
        return out if u.inf is None else S.set_exact(out, *S.hard_limits(u, -np.pi / 2, np.pi / 2))
    sg, und = S.sign_of(u)
    one = Series.exact(np.ones(u.shape))
    w = S.analytic(S.inv(S.select(pole, u, one)), S.taylor_atan)
    at_pole = S.sub(Series.exact(np.where(sg < 0, -np.pi / 2, np.pi / 2)), w)
    regular = S.analytic(S.select(pole, Series.zeros(u.shape), u), S.taylor_atan)
    return S.flag(S.select(pole, at_pole, regular), pole & und, UNDEC)


def _sq(u):
    return S.mul(u, u)


def _tanh_exp(u):
    """tanh u = 1 - 2 / (exp(2 u) + 1)."""
    return S.sub(
        Series.exact(np.ones(u.shape)),
        S.scale(S.inv(S.add_const(S.exp(S.scale(u, 2.0)), 1.0)), 2.0),
    )


def _logistic_exp(u):
    """logistic u = 1 / (1 + exp(-u))."""
    return S.inv(S.add_const(S.exp(S.neg(u)), 1.0))


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
    "sqrt": (lambda u: S.power(u, R(1, 2)), lambda u, o: S.scale(S.power(u, R(-1, 2)), 0.5)),
    "rsqrt": (lambda u: S.power(u, R(-1, 2)), lambda u, o: S.scale(S.power(u, R(-3, 2)), -0.5)),
    "cbrt": (lambda u: S.power(u, R(1, 3)), lambda u, o: S.scale(S.power(u, R(-2, 3)), 1 / 3)),
    "log": (S.log, lambda u, o: S.inv(u)),
    "log1p": (_log1p, lambda u, o: S.inv(S.add_const(u, 1.0))),
    "exp": (S.exp, lambda u, o: o),
    "exp2": (lambda u: S.exp(S.scale(u, math.log(2))), lambda u, o: S.scale(o, math.log(2))),
    "expm1": (_expm1, lambda u, o: S.add_const(o, 1.0)),
    "tanh": (
        lambda u: S.saturating(u, S.taylor_tanh, -1.0, 1.0, _tanh_exp),
        lambda u, o: S.sub(Series.exact(np.ones(u.shape)), _sq(o)),
    ),
    "logistic": (
        lambda u: S.saturating(u, S.taylor_logistic, 0.0, 1.0, _logistic_exp),
        lambda u, o: S.sub(o, _sq(o)),
    ),
    "erf": (
        lambda u: S.saturating(u, S.taylor_erf, -1.0, 1.0),
        lambda u, o: S.scale(S.exp(S.neg(_sq(u))), _SQRT_PI),
    ),
    "erfc": (
        lambda u: S.sub(Series.exact(np.ones(u.shape)), S.saturating(u, S.taylor_erf, -1.0, 1.0)),
        lambda u, o: S.scale(S.exp(S.neg(_sq(u))), -_SQRT_PI),
    ),
    "sin": (
        lambda u: S.periodic_at_inf(S.analytic(u, S.taylor_sin), u),
        lambda u, o: S.analytic(u, S.taylor_cos),
    ),
    "cos": (
        lambda u: S.periodic_at_inf(S.analytic(u, S.taylor_cos), u),
        lambda u, o: S.neg(S.analytic(u, S.taylor_sin)),
    ),
    "tan": (
        lambda u: S.periodic_at_inf(S.analytic(u, S.taylor_tan), u),
        lambda u, o: S.add_const(_sq(o), 1.0),
    ),
    "atan": (lambda u: _atan(u), lambda u, o: S.inv(S.add_const(_sq(u), 1.0))),
    "atanh": (_atanh, lambda u, o: S.inv(_one_minus_sq(u))),
    "asin": (_asin, lambda u, o: S.power(_one_minus_sq(u), R(-1, 2))),
    "acos": (_acos, lambda u, o: S.neg(S.power(_one_minus_sq(u), R(-1, 2)))),
    "sinh": (
        lambda u: S.scale(S.sub(S.exp(u), S.exp(S.neg(u))), 0.5),
        lambda u, o: S.scale(S.add(S.exp(u), S.exp(S.neg(u))), 0.5),
    ),
    "cosh": (
        lambda u: S.scale(S.add(S.exp(u), S.exp(S.neg(u))), 0.5),
        lambda u, o: S.scale(S.sub(S.exp(u), S.exp(S.neg(u))), 0.5),
    ),
    "asinh": (
        lambda u: S.log(S.add(u, S.power(S.add_const(_sq(u), 1.0), R(1, 2)))),
        lambda u, o: S.power(S.add_const(_sq(u), 1.0), R(-1, 2)),
    ),
    "acosh": (
        lambda u: S.log(S.add(u, S.power(S.add_const(_sq(u), -1.0), R(1, 2)))),
        lambda u, o: S.power(S.add_const(_sq(u), -1.0), R(-1, 2)),
    ),
    "square": (_sq, lambda u, o: S.scale(u, 2.0)),
    "abs": (_abs, _abs_partial),
    "sign": (_sign, _sign_partial),
}


def _at_hard_inf(name: str, u: Series, out: Series):
    """(out, mask): where u is +-inf for every small t (a hard infinity of known sign), f of it
    is f(+-inf) for every t, as IEEE arithmetic gives it (atanh(inf) = nan, tanh(inf) = 1,
    sqrt(inf) = inf): a constant, an infinity or a NaN, whatever the rule made of it."""
    if u.inf is None or name not in _NP_UNARY:
        return out, None
    iu, sg, hard = S.inf_parts(u)
    m = iu & hard & (sg != 0)
    if not m.any():
        return out, None
    with np.errstate(all="ignore"):
        v = np.asarray(_NP_UNARY[name](np.where(sg > 0, np.inf, -np.inf)), np.float64)
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
    return [S.ipow(ins[0], int(eqn.params["y"]))], None


def _ipow_bwd(ctx, eqn, ins, outs, aux, cots, need):
    n = int(eqn.params["y"])
    return [S.rmul(cots[0], S.scale(S.ipow(ins[0], n - 1), float(n)))]


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
        return _const_eval(eqn, ins), None
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
    near = ~jump & (np.abs(a0 - at) <= _NEAR * np.maximum(1.0, np.abs(a0)))
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
        return _const_eval(eqn, ins), None
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
        return _const_eval(eqn, ins), None
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
        return _const_eval(eqn, ins), None
    out = S.mul(a, S.inv(b))
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
    ib = S.inv(b)
    ca = S.rmul(c, ib) if need[0] else None
    cb = S.neg(S.rmul(c, S.mul(outs[0], ib))) if need[1] else None
    return _constant_of_itself([ca, cb], nz) if a is b else [ca, cb]


FWD["div"] = _div_fwd
BWD["div"] = _div_bwd


def _pow_exponents(y: Series) -> np.ndarray | None:
    """Rational exponents per element when y is an exact constant, else None."""
    cv = _const_value(y)
    if cv is None:
        return None
    cv = np.asarray(cv)
    out = np.empty(cv.shape, dtype=object)
    for idx in np.ndindex(cv.shape):
        q = S.rational(float(cv[idx]), exact=True)  # x ** 0.4636...: its exact dyadic value
        if q is None:
            return None
        out[idx] = q
    return out


def _pow_const(x: Series, P: np.ndarray, shift: int = 0) -> Series:
    shape = np.broadcast_shapes(x.shape, P.shape)
    x = S.bcast(x, shape)
    P = np.broadcast_to(P, shape)
    out = None
    for p in sorted(set(P.ravel())):
        m = P == p
        r = S.power(x, p + shift, odd_roots=False)  # IEEE pow: (-8) ** (1/3) is NaN
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
    gen = S.exp(S.mul(y, S.log(x)))
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
            cx = S.rmul(c, S.mul(y, S.exp(S.mul(S.add_const(y, -1.0), S.log(x)))))
    if need[1]:
        cy = S.rmul(c, S.mul(S.log(x), outs[0], absorb=True))
    return [cx, cy]


FWD["pow"] = _pow_fwd
BWD["pow"] = _pow_bwd


def _atan2_fwd(ctx, eqn, ins, act):
    return [S.atan2(ins[0], ins[1])], None


def _atan2_bwd(ctx, eqn, ins, outs, aux, cots, need):
    y, x = ins
    r = S.inv(S.add(_sq(x), _sq(y)))
    c = cots[0]
    if y.inf is not None or x.inf is not None:  # constant where an argument is infinite
        c = S.restrict(c, ~S.atan2_at_inf(y, x)[0])
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
        return _const_eval(eqn, ins), None
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
        return _const_eval(eqn, ins), None
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
        return _const_eval(eqn, ins), None
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
        return _const_eval(eqn, ins), None
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
        return _const_eval(eqn, ins), None
    # finite for each small t where OK; not where +-inf or NaN for each t (POISON, with or
    # without an inf code, or outside the domain); unknown where undecided
    known = (x.bad == OK) | (x.bad == DOMAIN) | (x.bad == POISON)
    return [IntVal(x.bad == OK, np.where(known, OK, UNDEC))], None


FWD["is_finite"] = _is_finite_fwd
FWD["select_n"] = _select_fwd
BWD["select_n"] = _select_bwd


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


_DOT_SUBS: dict = {}


def _dot_subscripts(eqn, ra: int, rb: int):
    dn = eqn.params["dimension_numbers"]
    key = (repr(dn), ra, rb)
    r = _DOT_SUBS.get(key)
    if r is None:
        r = _DOT_SUBS[key] = _dot_subscripts_of(dn, ra, rb)
    return r


def _dot_subscripts_of(dn, ra: int, rb: int):
    (lc, rc), (lb, rb_) = dn
    letters = iter(string.ascii_letters)
    la = [None] * ra
    lb_ = [None] * rb
    for i, j in zip(lb, rb_):
        la[i] = lb_[j] = next(letters)
    for i, j in zip(lc, rc):
        la[i] = lb_[j] = next(letters)
    for i in range(ra):
        if la[i] is None:
            la[i] = next(letters)
    for j in range(rb):
        if lb_[j] is None:
            lb_[j] = next(letters)
    out = (
        [la[i] for i in lb]
        + [la[i] for i in range(ra) if i not in lb and i not in lc]
        + [lb_[j] for j in range(rb) if j not in rb_ and j not in rc]
    )
    return "".join(la), "".join(lb_), "".join(out)


_PLANS: dict = {}


def _plan2(spec: str, sa: tuple, sb: tuple):
    """A two-operand einsum as one (batched) matmul: (perm a, shape a, perm b, shape b, shape
    of the product, perm of the result), or None where the spec does not fit (an index summed
    within one operand, a repeated index)."""
    ins, so = spec.split("->")
    ia, ib = ins.split(",")
    if len(set(ia)) != len(ia) or len(set(ib)) != len(ib) or len(set(so)) != len(so):
        return None
    dims = {}
    for idx, shp in ((ia, sa), (ib, sb)):
        for ch, n in zip(idx, shp):
            if dims.setdefault(ch, n) != n:
                return None
    batch = [c for c in so if c in ia and c in ib]
    contr = [c for c in ia if c in ib and c not in so]
    fa = [c for c in ia if c not in ib]
    fb = [c for c in ib if c not in ia]
    if any(c not in so for c in fa + fb) or any(c not in ia and c not in ib for c in so):
        return None
    bshape = [dims[c] for c in batch]
    na = int(np.prod([dims[c] for c in fa], dtype=np.int64))
    nb = int(np.prod([dims[c] for c in fb], dtype=np.int64))
    nc = int(np.prod([dims[c] for c in contr], dtype=np.int64))
    pa = [ia.index(c) for c in batch + fa + contr]
    pb = [ib.index(c) for c in batch + contr + fb]
    prod_idx = batch + fa + fb
    return (
        pa,
        tuple(bshape + [na, nc]),
        pb,
        tuple(bshape + [nc, nb]),
        tuple(bshape + [dims[c] for c in fa] + [dims[c] for c in fb]),
        [prod_idx.index(c) for c in so],
    )


def _einsum2(spec: str, a, b) -> np.ndarray:
    """np.einsum(spec, a, b) for two operands, through one BLAS matmul where the spec allows."""
    a, b = np.asarray(a), np.asarray(b)
    key = (spec, a.shape, b.shape)
    plan = _PLANS.get(key, False)
    if plan is False:
        plan = _PLANS[key] = _plan2(spec, a.shape, b.shape)
    if plan is None:
        return np.einsum(spec, a, b)
    pa, sha, pb, shb, shr, pr = plan
    r = np.matmul(np.transpose(a, pa).reshape(sha), np.transpose(b, pb).reshape(shb))
    return np.transpose(r.reshape(shr), pr)


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
        kept = {}
        for i, j, _e, _jj, drop in pairs:
            if not drop:
                kept.setdefault(j, []).append(i)
        for j in sorted(uy):  # one matmul per term of y, with the terms of x it is kept with
            need = kept[j]
            if len(need) == len(ix):
                Pj = _einsum2(specA, X, ky[j][1])
                for i in need:
                    P[(i, j)] = Pj[px[i]]
            else:
                Xj = X[[px[i] for i in need]]
                Pj = _einsum2(specA, Xj, ky[j][1])
                for n, i in enumerate(need):
                    P[(i, j)] = Pj[n]

    def mags(j):  # sum |x| |y| for y's term j, x's terms stacked (nonzero where a product is)
        if j not in M:
            M[j] = _einsum2(specA, np.abs(X), np.abs(ky[j][1]))
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
    return _einsum2(spec, np.abs(a), np.abs(b)) != 0


def _dot_series(eqn, a: Series, b: Series) -> Series:
    sa, sb, so = _dot_subscripts(eqn, len(a.shape), len(b.shape))
    return _einsum_series(f"{sa},{sb}->{so}", a, b, tuple(eqn.outvars[0].aval.shape))


def _dot_fwd(ctx, eqn, ins, act):
    a, b = ins
    if isinstance(a, IntVal) and isinstance(b, IntVal):
        return _const_eval(eqn, ins), None
    a = Series.exact(a.x.astype(np.float64)) if isinstance(a, IntVal) else a
    b = Series.exact(b.x.astype(np.float64)) if isinstance(b, IntVal) else b
    return [_dot_series(eqn, a, b)], None


def _dot_bwd(ctx, eqn, ins, outs, aux, cots, need):
    a, b = ins
    c = cots[0]
    sa, sb, so = _dot_subscripts(eqn, len(a.shape), len(b.shape))
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
        return _const_eval(eqn, ins), None
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
        return _const_eval(eqn, ins), None
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


# primitives whose value depends only on their inputs and params: a repeated equation is
# evaluated once per ray (see Ctx.memo)
_PURE = (
    set(UNARY)
    | set(_CMP)
    | {
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
        "reduce_max",
        "reduce_min",
        "argmax",
        "argmin",
        "copy",
        "copy_p",
    }
)


# -- higher-order primitives -----------------------------------------------------------------


def _call_param(eqn):
    for p in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if p in eqn.params:
            return eqn.params[p]
    raise Undecided(f"`{eqn.primitive.name}` has no body to analyse")


def _call_fwd(ctx, eqn, ins, act):
    jaxpr, consts = _closed(_call_param(eqn))
    outs, tape = fwd_jaxpr(ctx, jaxpr, consts, ins, act)
    return outs, tape


def _call_bwd(ctx, eqn, ins, outs, aux, cots, need):
    return bwd_jaxpr(ctx, aux, cots)


for _n in (
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "remat2",
    "checkpoint",
    "remat",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "named_call",
):
    FWD[_n] = _call_fwd
    BWD[_n] = _call_bwd


def _index_of(x, what: str) -> int:
    if isinstance(x, IntVal):
        if x.bad.any():
            raise Undecided(f"the {what} is undecided along the ray")
        return int(np.asarray(x.x).reshape(()))
    cv = _const_value(x)
    if cv is None:
        raise Undecided(f"the {what} depends on t")
    return int(np.asarray(cv).reshape(()))


def _cond_fwd(ctx, eqn, ins, act):
    branches = eqn.params["branches"]
    idx = int(np.clip(_index_of(ins[0], "cond index"), 0, len(branches) - 1))
    jaxpr, consts = _closed(branches[idx])
    outs, tape = fwd_jaxpr(ctx, jaxpr, consts, ins[1:], act[1:])
    return outs, tape


def _cond_bwd(ctx, eqn, ins, outs, aux, cots, need):
    return [None] + bwd_jaxpr(ctx, aux, cots)


FWD["cond"] = _cond_fwd
BWD["cond"] = _cond_bwd


def _slice0(x, i):
    if isinstance(x, IntVal):
        return IntVal(x.x[i], x.bad[i])
    return S.apply_linear(x, lambda a: a[i])


def _scan_fwd(ctx, eqn, ins, act):
    p = eqn.params
    jaxpr, jconsts = _closed(p["jaxpr"])
    nc, ncar, length = p["num_consts"], p["num_carry"], p["length"]
    rev = p.get("reverse", False)
    consts, carry, xs = ins[:nc], list(ins[nc : nc + ncar]), ins[nc + ncar :]
    a_c, a_car, a_xs = act[:nc], list(act[nc : nc + ncar]), act[nc + ncar :]
    tapes = []
    ys_per: list = []
    # a carry becomes active once anything feeding it is: iterate to a fixed point cheaply
    a_car = [a or any(act) for a in a_car]
    for k in range(length):
        i = length - 1 - k if rev else k
        x_i = [_slice0(x, i) for x in xs]
        outs, tape = fwd_jaxpr(ctx, jaxpr, jconsts, [*consts, *carry, *x_i], [*a_c, *a_car, *a_xs])
        tapes.append((i, tape))
        carry = list(outs[:ncar])
        ys_per.append((i, outs[ncar:]))
    ys_per.sort(key=lambda t: t[0])
    ys = []
    for j, v in enumerate(jaxpr.outvars[ncar:]):
        vals = [y[j] for _, y in ys_per]
        aval = eqn.outvars[ncar + j].aval
        if not vals:
            ys.append(_lift(np.zeros(aval.shape, aval.dtype), aval))
        elif isinstance(vals[0], IntVal):
            ys.append(IntVal(np.stack([v.x for v in vals]), np.stack([v.bad for v in vals])))
        else:
            ys.append(S.stack(vals, 0))
    return [*carry, *ys], tapes


def _scan_bwd(ctx, eqn, ins, outs, aux, cots, need):
    p = eqn.params
    nc, ncar = p["num_consts"], p["num_carry"]
    tapes = aux
    c_carry = list(cots[:ncar])
    c_ys = cots[ncar:]
    c_consts: list = [None] * nc
    xs_cots: dict = {}
    for i, tape in reversed(tapes):
        yc = [None if c is None else _slice0(c, i) for c in c_ys]
        outc = [*c_carry, *yc]
        outc = [
            c
            if c is not None or not isinstance(tape.env.get(v), Series)
            else Series.zeros(tape.env[v].shape)
            if not isinstance(v, jcore.Literal)
            else None
            for c, v in zip(outc, tape.jaxpr.outvars)
        ]
        inc = bwd_jaxpr(ctx, tape, outc)
        for k in range(nc):
            if inc[k] is not None:
                c_consts[k] = inc[k] if c_consts[k] is None else S.add(c_consts[k], inc[k])
        c_carry = list(inc[nc : nc + ncar])
        xs_cots[i] = inc[nc + ncar :]
    res = [*c_consts, *c_carry]
    xs = ins[nc + ncar :]
    for j, x in enumerate(xs):
        if not isinstance(x, Series) or not tapes:
            res.append(None)
            continue
        parts = []
        for i in range(len(tapes)):
            c = xs_cots.get(i, [None] * len(xs))[j]
            parts.append(c if c is not None else Series.zeros(x.shape[1:]))
        res.append(S.stack(parts, 0))
    return res


FWD["scan"] = _scan_fwd
BWD["scan"] = _scan_bwd


def _while_fwd(ctx, eqn, ins, act):
    p = eqn.params
    cj, cc = _closed(p["cond_jaxpr"])
    bj, bc = _closed(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = ins[:nc], ins[nc : nc + nb], list(ins[nc + nb :])
    a_b, a_car = act[nc : nc + nb], [a or any(act) for a in act[nc + nb :]]
    tapes = []
    for _ in range(100000):
        pred, _t = fwd_jaxpr(ctx, cj, cc, [*cconsts, *carry], [False] * (nc + len(carry)))
        if not _index_of(pred[0], "while condition"):
            break
        outs, tape = fwd_jaxpr(ctx, bj, bc, [*bconsts, *carry], [*a_b, *a_car])
        tapes.append(tape)
        carry = list(outs)
    return carry, tapes


def _while_bwd(ctx, eqn, ins, outs, aux, cots, need):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    c_b: list = [None] * nb
    c_carry = list(cots)
    for tape in reversed(aux):
        outc = [
            c
            if c is not None or not isinstance(tape.env.get(v), Series)
            else Series.zeros(tape.env[v].shape)
            for c, v in zip(c_carry, tape.jaxpr.outvars)
        ]
        inc = bwd_jaxpr(ctx, tape, outc)
        for k in range(nb):
            if inc[k] is not None:
                c_b[k] = inc[k] if c_b[k] is None else S.add(c_b[k], inc[k])
        c_carry = list(inc[nb:])
    return [None] * nc + c_b + c_carry


FWD["while"] = _while_fwd
BWD["while"] = _while_bwd


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
        and _is_float_aval(outs[0].aval)
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
    fouts = [k for k, v in enumerate(eqn.outvars) if _is_float_aval(v.aval)]
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


# -- the point itself: f(x0) and its singular points -------------------------------------------
#
# One plain evaluation at x0, in numpy where the primitive has a numpy twin (JAX's own eager
# dispatch, per equation, costs as much as a good part of a ray) and by JAX otherwise. It gives
# f(x0) and the "events": the equations at a singular point (a zero under sqrt, log, a power or a
# division, a tie under max, min, abs or a comparison, a non-finite value). Only they and what
# feeds them need more than the t^0 and t^1 terms in the first, cheap pass along each ray.

_NP_UNARY: dict[str, Callable] = {
    "neg": np.negative,
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "cbrt": np.cbrt,
    "abs": np.abs,
    "sign": np.sign,
    "atan": np.arctan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atanh": np.arctanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "square": np.square,
    "logistic": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "floor": np.floor,
    "ceil": np.ceil,
    "copy": lambda x: x,
    "copy_p": lambda x: x,
    "real": lambda x: x,
}
_NP_BINARY: dict[str, Callable] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
    "atan2": np.arctan2,
    "gt": np.greater,
    "ge": np.greater_equal,
    "lt": np.less,
    "le": np.less_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "add_any": np.add,
}
_NP_STRUCT: dict[str, Callable] = {
    "reshape": _reshape_f,
    "transpose": _transpose_f,
    "broadcast_in_dim": _bcast_f,
    "squeeze": _squeeze_f,
    "expand_dims": _expand_f,
    "slice": _slice_f,
    "rev": _rev_f,
    "reduce_sum": _reduce_sum_f,
    "reduce_max": lambda eqn, a: np.max(a, axis=tuple(eqn.params["axes"])),
    "reduce_min": lambda eqn, a: np.min(a, axis=tuple(eqn.params["axes"])),
}
_CALLS = {
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "remat2",
    "checkpoint",
    "remat",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "named_call",
}
# singular where an input is 0 (the first input only for div: its denominator is the second)
_AT_ZERO = {"sqrt", "rsqrt", "cbrt", "log", "pow", "atan2", "abs", "sign", "integer_pow"}
_AT_ONE = {"acos", "asin", "atanh", "acosh"}  # singular where |x| = 1
_TIES = {"max", "min", "gt", "ge", "lt", "le", "eq", "ne", "clamp"}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


_OUT: dict = {}  # id(eqn) -> (eqn, its single output's dtype and shape, or None)


def _out_of(eqn):
    hit = _OUT.get(id(eqn))
    if hit is None or hit[0] is not eqn:
        o = None
        if len(eqn.outvars) == 1:
            aval = eqn.outvars[0].aval
            o = (np.dtype(aval.dtype), tuple(aval.shape))
        if len(_OUT) > 100_000:
            _OUT.clear()
        hit = _OUT[id(eqn)] = (eqn, o)
    return hit[1]


def _np_eqn(eqn, ins: list) -> list | None:
    """The equation evaluated with numpy (IEEE like XLA, up to rounding), None if it has no
    numpy twin here (then JAX evaluates it)."""
    name = eqn.primitive.name
    o = _out_of(eqn)
    if o is None:
        return None
    out_dt, out_shape = o
    if any(x.dtype not in _FLOATS for x in ins) or (out_dt not in _FLOATS and out_dt != np.bool_):
        return None
    if name in _NP_UNARY:
        r = _NP_UNARY[name](ins[0])
    elif name in _NP_BINARY and len(ins) == 2:
        r = _NP_BINARY[name](ins[0], ins[1])
    elif name in _NP_STRUCT:
        r = _NP_STRUCT[name](eqn, ins[0])
    elif name == "integer_pow":
        r = np.power(ins[0], float(eqn.params["y"]))
    elif name == "dot_general":
        sa, sb, so = _dot_subscripts(eqn, np.ndim(ins[0]), np.ndim(ins[1]))
        r = _einsum2(f"{sa},{sb}->{so}", ins[0], ins[1])
    elif name == "convert_element_type" and out_dt in _FLOATS:
        r = ins[0]
    elif name == "concatenate":
        r = np.concatenate(ins, eqn.params["dimension"])
    elif name == "clamp":
        r = np.minimum(np.maximum(ins[1], ins[0]), ins[2])
    else:
        return None
    return [np.asarray(r).astype(out_dt, copy=False).reshape(out_shape)]


_KINKY = {
    "reduce_max",
    "reduce_min",
    "argmax",
    "argmin",
    "sort",
    "cummax",
    "cummin",
    "floor",
    "ceil",
    "round",
    "convert_element_type",
    "select_and_scatter_add",
    "reduce_precision",
}
_PLAIN = (
    set(_NP_UNARY)
    | set(_NP_BINARY)
    | set(_NP_STRUCT)
    | {"integer_pow", "dot_general", "concatenate", "select_n", "iota", "broadcast_in_dim"}
    | _CALLS
)


_NEAR = 4 * S.TOL  # relative distance within which two values may be equal up to rounding


def _is_event(eqn, ins: list, outs: list) -> bool:
    """Whether the equation is at a singular point at x0 (its inputs were checked as outputs)."""
    name = eqn.primitive.name
    for o in outs:
        if o.dtype.kind == "f" and not np.isfinite(o).all():
            return True
    fl = [x for x in ins if x.dtype.kind == "f"]
    if not fl:
        return False
    if name in _AT_ZERO:
        return not fl[0].all()
    if name == "div":
        return len(ins) == 2 and not ins[1].all()
    if name in _AT_ONE:  # within rounding of +-1 counts (the series rules snap it to +-1)
        return bool(np.any(np.abs(np.abs(fl[0]) - 1) <= _NEAR))
    if name == "log1p":
        return bool(np.any(fl[0] == -1))
    if name in _TIES and len(fl) >= 2:
        if name == "clamp":
            return bool(np.any(fl[1] == fl[0]) or np.any(fl[1] == fl[2]))
        return bool(np.any(np.abs(fl[0] - fl[1]) <= _NEAR * (np.abs(fl[0]) + np.abs(fl[1]))))
    if name in _KINKY:
        return True  # ties or integer points: not worth a check here
    return name not in _PLAIN


def _producers(jaxpr) -> dict:
    return {
        v: i
        for i, e in enumerate(jaxpr.eqns)
        for v in e.outvars
        if not isinstance(v, jcore.DropVar)
    }


def _at_point(closed, x0s: list) -> tuple[float, dict]:
    """(f(x0), {(id(jaxpr), eqn index): True} for the events and every equation feeding them)."""
    marks: dict = {}
    with np.errstate(all="ignore"), jax.default_device(jax.devices("cpu")[0]):
        outs = _np_eval(closed.jaxpr, list(closed.consts), list(x0s), marks)
    return float(np.ravel(outs[0])[0]), {k: v for k, v in marks.items() if k[0] != "reach"}


def _np_eval(jaxpr, consts: list, args: list, marks: dict) -> list:
    """Evaluate at the point; mark the events and their ancestors. Returns the outputs; marks
    also gets, under the key jaxpr itself, the invar positions the events reach."""
    env: dict = {}
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = np.asarray(c)
    for v, a in zip(jaxpr.invars, args):
        env[v] = np.asarray(a)

    def read(v):
        return np.asarray(v.val) if isinstance(v, jcore.Literal) else env[v]

    hot: set = set()  # variables some event depends on
    events: list = []
    for v in list(jaxpr.constvars) + list(jaxpr.invars):  # a non-finite input: its consumers
        x = env[v]
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            events += [i for i, e in enumerate(jaxpr.eqns) if v in e.invars]
    for i, eqn in enumerate(jaxpr.eqns):
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        sub_reach = None
        if name in _CALLS:
            body, bconsts = _closed(_call_param(eqn))
            outs = _np_eval(body, bconsts, ins, marks)
            sub_reach = marks.pop(("reach", id(body)), set())
        elif name == "cond":
            branches = eqn.params["branches"]
            idx = int(np.clip(int(np.asarray(ins[0]).reshape(())), 0, len(branches) - 1))
            body, bconsts = _closed(branches[idx])
            outs = _np_eval(body, bconsts, ins[1:], marks)
            sub_reach = {k + 1 for k in marks.pop(("reach", id(body)), set())}
        else:
            try:
                outs = _np_eqn(eqn, ins)
            except (ValueError, TypeError):  # an empty reduction, an odd shape: JAX decides
                outs = None
            if outs is None:
                outs = [np.asarray(o) for o in _bind(eqn, ins)]
            if _is_event(eqn, ins, outs):
                events.append(i)
        if sub_reach:
            events.append(("reach", i, sub_reach))
        for v, o in zip(eqn.outvars, outs):
            if not isinstance(v, jcore.DropVar):
                env[v] = o
    if events:  # mark the events and their ancestors in this jaxpr, backwards
        prod = _producers(jaxpr)
        stack = []
        for ev in events:
            if isinstance(ev, tuple):  # an event inside a call body reaches these inputs
                e = jaxpr.eqns[ev[1]]
                stack += [e.invars[k] for k in ev[2] if k < len(e.invars)]
            else:
                marks[(id(jaxpr), ev)] = True
                stack += list(jaxpr.eqns[ev].invars)
        while stack:
            v = stack.pop()
            if isinstance(v, jcore.Literal) or v in hot:
                continue
            hot.add(v)
            i = prod.get(v)
            if i is not None:
                marks[(id(jaxpr), i)] = True  # a call: its whole body at the higher cap
                stack += list(jaxpr.eqns[i].invars)
        reach = {k for k, v in enumerate(jaxpr.invars) if v in hot}
        if reach:
            marks[("reach", id(jaxpr))] = reach
    return [read(v) for v in jaxpr.outvars]


# -- per-ray certification ----------------------------------------------------------------------


@dataclasses.dataclass
class RayResult:
    verdict: str
    gradient: list | None = None  # per leaf: numpy array (t^0 coefficients)
    fprime: float | None = None  # f'(x0; v) (+-inf for infinite slopes)
    limit: float | None = None  # lim f(x0 + t v)
    certificate: str = ""
    notes: list = dataclasses.field(default_factory=list)
    cap: float = 0.0
    terms: int = 0

    def to_dict(self, i: int) -> dict:
        return {
            "direction": i,
            "verdict": self.verdict,
            "certificate": self.certificate,
            "fprime": self.fprime,
            "limit": self.limit,
            "gradient": None if self.gradient is None else _listed(self.gradient),
            "notes": list(self.notes),
            "horizon_cap": self.cap,
        }


_LISTED_MAX = 100_000  # gradients up to this many numbers are nested lists (JSON), else arrays


def _listed(grads: list) -> list:
    """A ray's gradient per leaf: nested lists where small (exact in the report's JSON), numpy
    arrays beyond _LISTED_MAX numbers (a list of a big model's gradient costs as much as a good
    part of the certification)."""
    if sum(np.size(g) for g in grads) > _LISTED_MAX:
        return [np.asarray(g) for g in grads]
    return [np.asarray(g).tolist() for g in grads]


def _worst_bad(bad) -> int:
    return int(np.max(bad)) if np.size(bad) else OK


def _bad_verdict(code: int, what: str) -> RayResult:
    if code == DOMAIN:
        return RayResult(
            "DOMAIN", certificate=f"the ray leaves the domain of the function ({what})"
        )
    if code == POISON:
        return RayResult(
            "UNDECIDED",
            notes=[
                f"{what} is infinite or undefined all along the ray "
                "(the ray runs inside a singular set)"
            ],
        )
    if code == PUNDEC:
        return RayResult(
            "UNDECIDED",
            notes=[
                f"{what}: a comparison or a branch depends on a value that is infinite or undefined "
                "all along the ray (such as x / 0 of an identically zero value, whose sign is that of "
                "a floating-point zero)"
            ],
        )
    return RayResult(
        "UNDECIDED",
        notes=[f"{what}: the series rules could not decide (horizon or an undecided branch)"],
    )


def _ray(ctx: Ctx, closed, x0s: list, vs: list, fx0: float) -> RayResult:
    ctx.memo = {}
    try:
        with np.errstate(all="ignore"):  # inf and nan are handled by the rules, quietly
            return _ray_sweeps(ctx, closed, x0s, vs, fx0)
    finally:
        ctx.memo = {}


def _ray_sweeps(ctx: Ctx, closed, x0s: list, vs: list, fx0: float) -> RayResult:
    jaxpr, consts = closed.jaxpr, list(closed.consts)
    args = [Series.ray(x, v) for x, v in zip(x0s, vs)]
    data = [_lift(a, v.aval) for a, v in zip(ctx.data, jaxpr.invars[len(args) :])]
    try:
        outs, tape = fwd_jaxpr(
            ctx, jaxpr, consts, args + data, [True] * len(args) + [False] * len(data)
        )
    except Undecided as e:
        return RayResult("UNDECIDED", notes=[str(e)])
    y = outs[0]
    if isinstance(y, IntVal):
        raise UsageError("gradsan.jax.certify: the loss returned an integer value")
    done, lim, fprime, removable = _value_verdict(y, fx0)
    if done is not None:
        return done
    # reverse sweep
    try:
        with S.capped(ctx.bwd_cap or S.cap()):
            gs = bwd_jaxpr(ctx, tape, [Series.exact(1.0)])
    except Undecided as e:
        return RayResult("UNDECIDED", limit=lim, fprime=fprime, notes=[str(e)])
    return _gradient_verdict(gs, x0s, vs, lim, fprime, removable)


def _value_verdict(y: Series, fx0: float):
    """(a final RayResult or None, lim f(x0 + t v), f'(x0; v), removable) from the value series
    of a scalar loss along the ray."""
    isinf, iy, hard = (bool(np.reshape(z, ())) for z in S.inf_parts(y))
    if isinf:  # +-inf for every small t, or tending to it
        what = "is" if hard else "->"
        if not iy:
            return (
                RayResult(
                    "SINGULAR",
                    certificate=f"the value diverges along the ray: |f(x0 + t v)| {what} inf",
                ),
                None,
                None,
                False,
            )
        iy = int(np.reshape(S.inf_parts(y)[1], ()))
        return (
            RayResult(
                "SINGULAR",
                certificate="the value diverges along the ray: "
                f"f(x0 + t v) {what} {'+' if iy > 0 else '-'}inf",
                fprime=math.copysign(math.inf, iy),
            ),
            None,
            None,
            False,
        )
    if bool(np.reshape(S.nan_mask(y), ())):  # NaN for every small t, as IEEE computes it
        return (
            RayResult(
                "DOMAIN",
                certificate="f(x0 + t v) is NaN for every small t (the ray leaves the domain of f)",
            ),
            None,
            None,
            False,
        )
    if y.bad.any():
        return _bad_verdict(_worst_bad(y.bad), "the value"), None, None, False
    E, J, C = S.lead(y)
    j0, c0 = int(J.reshape(())), float(C.reshape(()))
    Hy = float(y.H.reshape(()))
    lead_key = _lead_key(y)
    if lead_key is not None and (lead_key[0] < 0 or (lead_key[0] == 0 and lead_key[1] > 0)):
        return (
            RayResult(
                "SINGULAR",
                certificate="the value diverges along the ray: "
                f"f(x0 + t v) ~ {S.monomial(c0, lead_key[0], j0)}",
                fprime=math.copysign(math.inf, c0 * (-1) ** j0),
            ),
            None,
            None,
            False,
        )
    if Hy <= S.EPS:
        return (
            RayResult(
                "UNDECIDED", notes=["the limit of f along the ray is beyond the precision horizon"]
            ),
            None,
            None,
            False,
        )
    lim = float(y.coef().reshape(()))
    removable = False
    if math.isnan(fx0):
        removable = True
    elif not math.isfinite(fx0) or abs(lim - fx0) > 1e-9 * (1 + abs(fx0)):
        return (
            RayResult(
                "DISCONTINUOUS",
                limit=lim,
                certificate=f"f(x0 + t v) -> {lim:.10g} as t -> 0+, but f(x0) = {fx0:.10g}",
            ),
            lim,
            None,
            False,
        )
    inc = S.drop_const(y)
    ik = _lead_key(inc)
    fprime: float
    if ik is not None and (ik[0] < 1 or (ik[0] == 1 and ik[1] > 0)):
        c = float(inc.terms[ik].reshape(()))
        sign = c * (-1) ** ik[1]
        return (
            RayResult(
                "SINGULAR",
                limit=lim,
                fprime=math.copysign(math.inf, sign),
                certificate=f"f(x0 + t v) - f(x0) ~ {S.monomial(c, ik[0], ik[1])} "
                f"(infinite one-sided slope {'+' if sign > 0 else '-'}inf: not "
                "differentiable and not locally Lipschitz at x0)",
            ),
            lim,
            None,
            False,
        )
    if ik is None and Hy <= 1 + S.EPS:
        return (
            RayResult(
                "UNDECIDED",
                limit=lim,
                notes=["the increment f(x0 + t v) - f(x0) is zero up to the precision horizon"],
            ),
            lim,
            None,
            False,
        )
    if ik is not None and ik == (Fraction(1), 0):
        fprime = float(inc.terms[ik].reshape(()))
    elif Hy <= 1 + S.EPS:
        return (
            RayResult("UNDECIDED", limit=lim, notes=["f'(x0; v) is beyond the horizon"]),
            lim,
            None,
            False,
        )
    else:
        fprime = 0.0
    return None, lim, fprime, removable


def _gradient_verdict(gs: list, x0s: list, vs: list, lim, fprime, removable) -> RayResult:
    """The ray's verdict from the gradient series of the parameters (the value was fine)."""
    grads = []
    for x0, g in zip(x0s, gs):
        if g is None:
            g = Series.zeros(np.shape(x0))
        g = S.bcast(g, np.shape(x0))
        if np.count_nonzero(g.bad):
            r = _one_parameter(x0s, vs, lim, fprime, removable)
            if r is not None:
                return r
            r = _bad_verdict(_worst_bad(g.bad), "the gradient")
            r.limit, r.fprime = lim, fprime
            return r
        for (e, j), c in g.terms.items():
            if (e < 0 or (e == 0 and j > 0)) and np.any(c != 0):
                idx = tuple(int(i) for i in np.argwhere(c != 0)[0])
                cc = float(c[idx])
                return RayResult(
                    "SINGULAR",
                    limit=lim,
                    fprime=fprime,
                    certificate=f"the gradient diverges along the ray: component {list(idx)} ~ "
                    f"{S.monomial(cc, min(k[0] for k in g.terms if np.any(g.terms[k] != 0)), j)} "
                    "(not locally Lipschitz near x0, so no Clarke subgradient exists)",
                )
        if g.H.size and float(np.minimum.reduce(g.H, axis=None)) <= S.EPS:
            r = _one_parameter(x0s, vs, lim, fprime, removable)
            return (
                r
                if r is not None
                else RayResult(
                    "UNDECIDED",
                    limit=lim,
                    fprime=fprime,
                    notes=["the gradient's limit is beyond the precision horizon"],
                )
            )
        grads.append(np.reshape(g.coef(), np.shape(x0)))
    gvs = np.concatenate([np.ravel(g) for g in grads] + [np.zeros(0)]) * np.concatenate(
        [np.ravel(v) for v in vs] + [np.zeros(0)]
    )
    gv = float(np.sum(gvs))
    scale = abs(fprime) + float(np.sum(np.abs(gvs))) + 1e-300
    if abs(gv - fprime) > 1e-7 * scale + 1e-12:
        return RayResult(
            "UNDECIDED",
            limit=lim,
            fprime=fprime,
            notes=[
                f"internal check failed: G(v) . v = {gv:.10g} but f'(x0; v) = {fprime:.10g} from the "
                "forward series (an internal error in gradsan; no number is returned)"
            ],
        )
    verdict = "REMOVABLE" if removable else "DEFINED"
    cert = (
        f"f(x0) is NaN but f(x0 + t v) -> {lim:.10g}; " if removable else ""
    ) + f"lim grad f(x0 + t v) exists; f'(x0; v) = {fprime:.10g}"
    return RayResult(verdict, gradient=grads, fprime=fprime, limit=lim, certificate=cert)


def _one_parameter(x0s: list, vs: list, lim, fprime, removable) -> RayResult | None:
    """With one scalar parameter, the gradient at x0 + t v is g'(t) / v for g(t) = f(x0 + t v),
    and the value's series (termwise differentiable) gives its limit: f'(x0; v) / v. Used where
    the reverse sweep met an infinite partial times a zero that only the forward series knows
    is identically zero (x + sqrt(x + |x|) sqrt(|x| - x): jax.grad NaN, the gradient 1)."""
    if fprime is None or not math.isfinite(fprime) or sum(np.size(x) for x in x0s) != 1:
        return None
    v = float(np.ravel(np.concatenate([np.ravel(v) for v in vs]))[0])
    if v == 0.0:
        return None
    grads = [np.full(np.shape(x0), fprime / v) for x0 in x0s]
    cert = (
        (f"f(x0) is NaN but f(x0 + t v) -> {lim:.10g}; " if removable else "")
        + f"lim grad f(x0 + t v) = f'(x0; v) / v = {fprime / v:.10g} (one parameter: from the "
        "value's series, the reverse sweep having met an infinite partial)"
    )
    return RayResult(
        "REMOVABLE" if removable else "DEFINED",
        gradient=grads,
        fprime=fprime,
        limit=lim,
        certificate=cert,
    )


def _frame_of(fun) -> Frame | None:
    import inspect

    try:
        f = inspect.unwrap(fun)
        code = f.__code__
        return Frame(
            file=code.co_filename,
            line=code.co_firstlineno,
            function=getattr(f, "__name__", "function"),
        )
    except Exception:
        return None


def _arg_name(fun) -> str:
    import inspect

    try:
        ps = [
            p.name
            for p in inspect.signature(fun).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        idx = getattr(fun, "__gradsan_argnums__", (0,))
        names = [ps[i] if i < len(ps) else f"args[{i}]" for i in idx]
        return names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    except (TypeError, ValueError):
        return "args[0]"


def _lead_key(s: Series):
    """(exponent, log power) of the dominant known term of a scalar series, or None."""
    for k in s.keys():
        if np.any(s.terms[k] != 0):
            return k
    return None


def _caps(terms: int, events: dict) -> list:
    """(cap, per-equation caps, reverse sweep's cap) tried along a ray, cheapest first.

    First 1.5, the t^0 and t^1 terms: all a smooth program needs for f'(x0; v), with the
    singular points found at x0 and everything feeding them at the cap of ``terms``; the reverse
    sweep keeps the cotangents' terms below t^1 (the limit of the gradient is their t^0 term;
    a partial like sqrt'(u^2) ~ 1 / t is paid back by the u it multiplies). Then, while the rules
    run out of terms (UNDECIDED), the cap of ``terms`` everywhere, doubled twice."""
    cap0 = max(1.5, 1 + terms / 2)
    first = [(1.5, {k: cap0 for k in events}, 1.0)] if cap0 > 1.5 else []
    return first + [(cap0, {}, None), (2 * cap0, {}, None), (4 * cap0, {}, None)]


def _final(res: RayResult) -> bool:
    """A verdict that more terms would not change."""
    return res.verdict != "UNDECIDED" or any(
        "not supported" in n or "internal check" in n or "complex" in n for n in res.notes
    )


def _certify_ray(
    ctx: Ctx, closed, x0s, vs, fx0, terms: int, events: dict, start: int = 0
) -> RayResult:
    res = None
    for c, caps, bc in _caps(terms, events)[start:]:
        ctx.caps, ctx.bwd_cap = caps, bc
        try:
            with S.capped(c):
                res = _ray(ctx, closed, x0s, vs, fx0)
        finally:
            ctx.caps, ctx.bwd_cap = {}, None
        res.cap = c
        if _final(res):
            return res
    return res


# -- several rays in one sweep -----------------------------------------------------------------
#
# The rays differ only in v, so their series can be carried side by side: the loss vmapped over
# a leading axis of stacked parameters (x0 in every row, one direction per row, the data shared)
# is swept once along t. Nothing couples the rows but a few conservative global bounds, so each
# row is exactly its own ray (a flag that leaks from one row to another only makes it UNDECIDED,
# and an UNDECIDED row goes on alone with more terms). The cost is about that of one ray: the
# sweeps are dominated by the bookkeeping per equation, not by the size of the arrays.


def _batched(closed, n: int, R: int, traced: dict):
    """The jaxpr of the loss vmapped over R stacked copies of its n parameter leaves (the other
    inputs shared), cached per jaxpr; None where vmap does not apply."""
    key = ("vmap", id(closed.jaxpr), R)
    hit = traced.get(key)
    if hit is not None and hit[0] is closed.jaxpr:
        return hit[1]
    jaxpr, consts = closed.jaxpr, list(closed.consts)

    def f(*args):
        return jax.core.eval_jaxpr(jaxpr, consts, *args)

    avals = [v.aval for v in jaxpr.invars]
    specs = [jax.ShapeDtypeStruct((R,) + tuple(a.shape), a.dtype) for a in avals[:n]] + [
        jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in avals[n:]
    ]
    try:
        bj = jax.make_jaxpr(jax.vmap(f, in_axes=(0,) * n + (None,) * (len(avals) - n)))(*specs)
    except Exception:
        bj = None
    traced[key] = (closed.jaxpr, bj)
    return bj


def _take(s: Series, r: int) -> Series:
    """Row r of a series with stacked rays (views: the rows of a normalized series are)."""
    return Series(
        {k: c[r] for k, c in s.terms.items()},
        s.H[r],
        s.bad[r],
        None if s.inf is None else np.broadcast_to(s.inf, s.shape)[r],
    )


def _rays_batched(ctx: Ctx, bclosed, x0s: list, dirs: list, fx0: float) -> list:
    """One forward and one reverse sweep of the vmapped loss for all the rays; per ray its
    RayResult. Raises Undecided (or anything) where the rays have to go one by one."""
    jaxpr, consts = bclosed.jaxpr, list(bclosed.consts)
    n, R = len(x0s), len(dirs)
    args = [
        Series.ray(np.broadcast_to(x, (R,) + np.shape(x)), np.stack([d[i] for d in dirs]))
        for i, x in enumerate(x0s)
    ]
    data = [_lift(a, v.aval) for a, v in zip(ctx.data, jaxpr.invars[n:])]
    outs, tape = fwd_jaxpr(ctx, jaxpr, consts, args + data, [True] * n + [False] * len(data))
    Y = outs[0]
    if isinstance(Y, IntVal):
        raise UsageError("gradsan.jax.certify: the loss returned an integer value")
    results: list = [None] * R
    pending = []
    for r in range(R):
        done, lim, fprime, removable = _value_verdict(_take(Y, r), fx0)
        if done is not None:
            results[r] = done
        else:
            pending.append((r, lim, fprime, removable))
    if pending:
        seed = np.zeros(R)
        seed[[p[0] for p in pending]] = 1.0  # the finished rows get an exactly zero cotangent
        with S.capped(ctx.bwd_cap or S.cap()):
            gs = bwd_jaxpr(ctx, tape, [Series.exact(seed)])
        for r, lim, fprime, removable in pending:
            g = [None if gi is None else _take(gi, r) for gi in gs[:n]]
            results[r] = _gradient_verdict(g, x0s, dirs[r], lim, fprime, removable)
    return results


def _certify_rays(ctx: Ctx, closed, x0s, dirs, terms: int, data: list, traced: dict):
    """(f(x0), per direction its RayResult): the first, cheapest attempt for every ray in one
    batched sweep where possible, then each undecided ray alone with more terms."""
    n, R = len(x0s), len(dirs)
    bclosed = _batched(closed, n, R, traced) if R > 1 else None
    if bclosed is None:
        fx0, events = _at_point(closed, x0s + data)
        return _confirm_jumps(
            ctx,
            closed,
            x0s,
            dirs,
            terms,
            data,
            fx0,
            [_certify_ray(ctx, closed, x0s, v, fx0, terms, events) for v in dirs],
        )
    fx0, bevents = _at_point(bclosed, [np.broadcast_to(x, (R,) + np.shape(x)) for x in x0s] + data)
    c, caps, bc = _caps(terms, bevents)[0]
    ctx.caps, ctx.bwd_cap, ctx.memo = caps, bc, {}
    try:
        with S.capped(c), np.errstate(all="ignore"):
            results = _rays_batched(ctx, bclosed, x0s, dirs, fx0)
    except UsageError:
        raise
    except Exception:  # Undecided, or a rule that needs one ray (a batched loop condition)
        results = [None] * R
    finally:
        ctx.caps, ctx.bwd_cap, ctx.memo = {}, None, {}
    events = None
    for r, res in enumerate(results):
        if res is not None:
            res.cap = c
            if _final(res):
                continue
        if events is None:
            events = _at_point(closed, x0s + data)[1]
        results[r] = _certify_ray(
            ctx, closed, x0s, dirs[r], fx0, terms, events, start=1 if res is not None else 0
        )
    return _confirm_jumps(ctx, closed, x0s, dirs, terms, data, fx0, results)


def _confirm_jumps(ctx: Ctx, closed, x0s, dirs, terms: int, data: list, fx0: float, results: list):
    """A DISCONTINUOUS ray compared its limit with f(x0) evaluated in floating point, where
    rounding at a singular point can be magnified (arccos(a.b / (|a| |b|)) at a = b is 2e-8,
    not 0). Evaluated by the series rules on the zero ray instead (exact where they snap a
    rounded tie or a rounded 1), f(x0) may agree with the limits: then the rays run again
    against that value. Costs a forward sweep, only where a jump was found."""
    if not any(r.verdict == "DISCONTINUOUS" for r in results):
        return fx0, results
    jaxpr, consts = closed.jaxpr, list(closed.consts)
    args = [Series.ray(x, np.zeros(np.shape(x))) for x in x0s]
    lifted = [_lift(a, v.aval) for a, v in zip(data, jaxpr.invars[len(args) :])]
    ctx.memo = {}
    try:
        with np.errstate(all="ignore"):
            y = fwd_jaxpr(
                ctx, jaxpr, consts, args + lifted, [True] * len(args) + [False] * len(lifted)
            )[0][0]
    except Undecided:
        return fx0, results
    finally:
        ctx.memo = {}
    if not isinstance(y, Series) or not y.is_const():
        return fx0, results
    f_series = float(np.reshape(y.coef(), ()))
    if not (math.isfinite(fx0) and abs(f_series - fx0) <= 1e-6 * (1 + abs(fx0))):
        return fx0, results  # not a rounding difference: keep the floating-point value
    events = _at_point(closed, x0s + data)[1]
    return f_series, [
        r
        if r.verdict != "DISCONTINUOUS"
        else _certify_ray(ctx, closed, x0s, v, f_series, terms, events)
        for r, v in zip(results, dirs)
    ]


# -- Tier C: combining directions -----------------------------------------------------------


def min_norm_hull(points: list[np.ndarray]) -> np.ndarray:
    """The minimum-norm element of the convex hull of the points: exact, from the k x k Gram
    matrix (the weights minimize w' G w on the simplex)."""
    if len(points) == 1:
        return np.ravel(points[0])
    if len(points) == 2:
        a, b = (np.ravel(p) for p in points)
        d = a - b
        dd = float(d @ d)
        lam = 0.0 if dd == 0 else float(np.clip(-(b @ d) / dd, 0.0, 1.0))
        return b + lam * d
    P = np.stack([np.ravel(p) for p in points])
    return _simplex_weights(P @ P.T) @ P


def _simplex_weights(G: np.ndarray) -> np.ndarray:
    """argmin w' G w over the probability simplex. Up to 12 points, exactly: the optimum is
    the affine minimum-norm point of some support S (Caratheodory: an affinely independent one),
    where [G_S 1; 1' 0] [w; m] = [0; 1]; every support is tried and the best feasible one kept.
    Beyond, projected gradient steps on the simplex."""
    k = len(G)
    best, wbest = np.inf, None
    if k <= 12:
        for mask in range(1, 1 << k):
            S = [i for i in range(k) if mask >> i & 1]
            A = np.zeros((len(S) + 1, len(S) + 1))
            A[:-1, :-1] = G[np.ix_(S, S)]
            A[:-1, -1] = A[-1, :-1] = 1.0
            rhs = np.zeros(len(S) + 1)
            rhs[-1] = 1.0
            try:
                sol = np.linalg.solve(A, rhs)
            except np.linalg.LinAlgError:
                continue
            w = sol[:-1]
            if not np.all(np.isfinite(w)) or np.any(w < -1e-12):
                continue
            w = np.clip(w, 0.0, None)
            w /= w.sum()
            full = np.zeros(k)
            full[S] = w
            val = float(full @ G @ full)
            if val < best - 1e-15 * (1 + abs(best)):
                best, wbest = val, full
        if wbest is not None:
            return wbest
    w = np.full(k, 1.0 / k)
    step = 1.0 / (2 * max(float(np.max(np.abs(np.linalg.eigvalsh(G)))), 1e-300))
    for _ in range(20000):
        w = _project_simplex(w - step * 2 * (G @ w))
    return w


def _project_simplex(v: np.ndarray) -> np.ndarray:
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    r = np.nonzero(u - css / np.arange(1, len(v) + 1) > 0)[0][-1]
    return np.maximum(v - css[r] / (r + 1), 0.0)


def _seed(key) -> int:
    if key is None:
        return 0
    try:
        return int(np.asarray(jax.random.key_data(key)).ravel().sum())
    except Exception:
        return int(np.asarray(key).ravel().sum())


def _directions(leaves: list[np.ndarray], directions, num: int, key) -> list[list[np.ndarray]]:
    if directions is not None:
        out = []
        for d in directions:
            dl = jax.tree_util.tree_leaves(d)
            if len(dl) != len(leaves):
                raise UsageError(
                    "gradsan.jax.certify: each direction must have the structure of "
                    "the first argument (one array per parameter leaf)"
                )
            out.append(
                [
                    np.broadcast_to(np.asarray(x, np.float64), np.shape(l0)).copy()
                    for x, l0 in zip(dl, leaves)
                ]
            )
        return out
    rng = np.random.default_rng(_seed(key))
    num = max(1, int(num))
    sizes = [int(np.size(x0)) for x0 in leaves]
    cuts = np.cumsum(sizes)[:-1]
    dirs: list = []
    while len(dirs) < num:
        # one draw for every leaf (the same numbers as one draw per leaf, in leaf order)
        flat = rng.standard_normal(sum(sizes))
        flat /= math.sqrt(float(flat @ flat)) or 1.0
        dirs.append([a.reshape(np.shape(x0)) for a, x0 in zip(np.split(flat, cuts), leaves)])
        if len(dirs) < num:
            neg = -flat
            dirs.append([a.reshape(np.shape(x0)) for a, x0 in zip(np.split(neg, cuts), leaves)])
    return dirs


def _same(g1: list, g2: list) -> bool:
    return all(np.allclose(a, b, rtol=1e-7, atol=1e-9) for a, b in zip(g1, g2))


def _opposite(d1: list, d2: list) -> bool:
    return all(np.array_equal(a, -b) for a, b in zip(d1, d2))


def _min_norm_leaves(grads: list[list]) -> list:
    """The minimum-norm element of the hull of several gradients (lists of leaves). Leaves on
    which every gradient agrees add the same constant to w' G w and are that leaf in the
    result; the weights come from the Gram matrix of the others only."""
    differ = [
        k
        for k in range(len(grads[0]))
        if not all(np.array_equal(g[k], grads[0][k]) for g in grads[1:])
    ]
    out = [np.asarray(g, np.float64) for g in grads[0]]
    if not differ:
        return out
    parts = [np.concatenate([np.ravel(g[k]) for k in differ]) for g in grads]
    x = min_norm_hull(parts)
    off = 0
    for k in differ:
        n = out[k].size
        out[k] = x[off : off + n].reshape(out[k].shape)
        off += n
    return out


_ARGNUMS = re.compile(r"with respect to positional argument\(s\) (-?\d+|\([-\d, ]*\))\.")


def _resolve(fun: Callable) -> tuple[Callable, str, int | tuple[int, ...]]:
    """(the loss, "grad" or "loss", argnums): ``jax.grad(loss, argnums=...)`` is recognised by
    its docstring and unwrapped; any other function is the loss itself (argnums 0)."""
    doc = getattr(fun, "__doc__", None) or ""
    wrapped = getattr(fun, "__wrapped__", None)
    if wrapped is not None and (
        doc.startswith("Gradient of") or doc.startswith("Value and gradient of")
    ):
        m = _ARGNUMS.search(doc)
        if m is None:
            raise UsageError(
                "gradsan.jax.certify: could not read which arguments this gradient is taken "
                "with respect to; pass the loss itself, with the parameters first: "
                "gradsan.jax.certify(loss)(params, *data)"
            )
        argnums = eval(m.group(1), {"__builtins__": {}})  # an int or a tuple of ints
        if isinstance(argnums, tuple) and not argnums:
            raise UsageError(
                "gradsan.jax.certify: jax.grad(..., argnums=()) has no argument to differentiate"
            )
        return wrapped, "grad", argnums
    return fun, "loss", 0


def _mover(loss: Callable, argnums, n: int) -> Callable:
    """The loss as a function of its differentiated arguments first (one pytree: the argument,
    or a tuple of them for a tuple ``argnums``), then the others in order, for ``n`` positional
    arguments."""
    idx = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    bad = [i for i in idx if not -n <= i < n]
    if bad:
        raise UsageError(
            f"gradsan.jax.certify: argnums {argnums} but the function was called "
            f"with {n} positional argument(s)"
        )
    idx = tuple(i % n for i in idx)
    rest_pos = [i for i in range(n) if i not in idx]

    @functools.wraps(loss)
    def moved(p, *rest, **kwargs):
        full: list = [None] * n
        for i, r in zip(rest_pos, rest):
            full[i] = r
        for i, v in zip(idx, (p,) if isinstance(argnums, int) else p):
            full[i] = v
        return loss(*full, **kwargs)

    def select(args: tuple) -> tuple:
        p = args[idx[0]] if isinstance(argnums, int) else tuple(args[i] for i in idx)
        return (p, *(args[i] for i in rest_pos))

    moved.__gradsan_argnums__ = idx  # type: ignore[attr-defined]
    moved.select = select  # type: ignore[attr-defined]
    return moved


def certify(
    fun: Callable,
    *,
    directions: Sequence | None = None,
    num_directions: int = 2,
    terms: int = 4,
    key: Any = None,
) -> Callable[..., Report]:
    """Certified limits of the gradient of a scalar loss at a point (theory.md 6.5, Tier B/C).

    ``fun`` is a scalar loss (its gradient with respect to the first argument is certified) or
    ``jax.grad(loss)``. Returns a function of the arguments that returns a :class:`Report`:
    ``report.outputs`` is the certified gradient (same pytree as the first argument) or None;
    the one finding (kind ``"certified"``) carries ``detail["label"]`` ("gradient",
    "clarke-subgradient", "singular" or "undecided"), ``detail["verdicts"]`` per direction (a
    ray's gradient is a list per parameter leaf: nested lists, or numpy arrays beyond 100,000
    numbers) and the certificate text. Calling the returned function again with arrays of the
    same shapes reuses the trace of the loss.
    """
    if not callable(fun):
        raise UsageError(
            f"gradsan.jax.certify takes a function, got {type(fun).__name__}. "
            "Wrap the loss, then call it: gradsan.jax.certify(loss)(params)"
        )
    loss, how, argnums = _resolve(fun)
    name = getattr(loss, "__name__", "function")
    traced: dict = {}  # jitted flat losses by argument structure: jit caches their traces
    moved_by_n: dict = {}  # the loss with its differentiated arguments moved first, per len(args)

    def run(*args, **kwargs) -> Report:
        if not args:
            raise UsageError("gradsan.jax.certify: call with the parameters as first argument")
        f = loss
        if argnums != 0:
            f = moved_by_n.get(len(args))
            if f is None:
                f = moved_by_n[len(args)] = _mover(loss, argnums, len(args))
            args = f.select(args)
        with jax.enable_x64(True):
            return _run(f, how, name, args, kwargs, directions, num_directions, terms, key, traced)

    return run


def _trace(loss, traced: dict, treedef, x0s: list, rest: tuple, kwargs: dict):
    """(closed jaxpr, data): the loss as a jaxpr of the parameter leaves followed by the array
    leaves of the other arguments (``data``, passed as values), through a jitted function kept
    per argument structure, so that calling certify again with arrays of the same shapes reuses
    jit's trace. Where an argument is not an array (a Python flag, a key), the other arguments
    are closed over instead (``data`` empty), as constants of a fresh trace."""
    rl, rtree = jax.tree_util.tree_flatten((rest, kwargs))
    # float data in float64, like the parameters: f(x0) must not carry float32 rounding (which
    # an arccos near 1 magnifies 10^4 times) into the comparison with the limits
    rl = [
        np.asarray(a, np.float64)
        if isinstance(a, (np.ndarray, np.generic, jax.Array))
        and np.issubdtype(a.dtype, np.floating)
        else a
        for a in rl
    ]
    rest, kwargs = jax.tree_util.tree_unflatten(rtree, rl)
    arrays = all(
        isinstance(a, (np.ndarray, np.generic, jax.Array))
        and (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_)
        for a in rl
    )
    if arrays:
        n = len(x0s)
        k = (treedef, rtree, n)
        jf = traced.get(k)
        if jf is None:

            def flat(*ls):
                r, kw = jax.tree_util.tree_unflatten(rtree, list(ls[n:]))
                return loss(jax.tree_util.tree_unflatten(treedef, list(ls[:n])), *r, **kw)

            jf = traced[k] = jax.jit(flat)
        if jf is not False:
            try:
                return jf.trace(*x0s, *rl).jaxpr, [np.asarray(a) for a in rl]
            except Exception:
                traced[k] = False  # not traceable with its data as inputs: use constants

    def flat_loss(*ls):
        return loss(jax.tree_util.tree_unflatten(treedef, list(ls)), *rest, **kwargs)

    try:
        return jax.make_jaxpr(flat_loss)(*x0s), []
    except TypeError as e:
        raise UsageError(f"gradsan.jax.certify could not trace the function: {e}") from e


def _run(
    loss, how, name, args, kwargs, directions, num_directions, terms, key, traced: dict
) -> Report:
    params, rest = args[0], args[1:]
    leaves, treedef = jax.tree_util.tree_flatten(params)
    for x in leaves:
        if isinstance(x, (str, bytes)) or not np.issubdtype(np.asarray(x).dtype, np.number):
            raise UsageError(
                "gradsan.jax.certify: the first argument must be an array or a "
                "pytree of float arrays"
            )
        if not np.issubdtype(np.asarray(x).dtype, np.floating):
            raise UsageError(
                "gradsan.jax.certify: the first argument has integer leaves; "
                "gradients need float parameters (jnp.asarray(x, float))"
            )
    x0s = [np.asarray(x, np.float64) for x in leaves]
    closed, data = _trace(loss, traced, treedef, x0s, rest, kwargs)
    out_avals = closed.out_avals
    if len(out_avals) != 1 or tuple(out_avals[0].shape) != () or not _is_float_aval(out_avals[0]):
        what = (
            "a gradient program that is not jax.grad(loss)"
            if how == "loss"
            and len(out_avals) != 1
            or (out_avals and tuple(out_avals[0].shape) != ())
            else "a non-scalar"
        )
        raise UsageError(
            f"gradsan.jax.certify needs a scalar loss or jax.grad(loss); {name} returns "
            f"{len(out_avals)} output(s) of shape {[tuple(a.shape) for a in out_avals]} "
            f"({what}). For a training step, certify the loss it differentiates: "
            "gradsan.jax.certify(loss)(params, batch)"
        )
    if directions is None:  # random ones: the same for the same shapes and key, kept
        dk = ("directions", tuple(np.shape(x) for x in x0s), num_directions, _seed(key))
        dirs = traced.get(dk)
        if dirs is None:
            dirs = traced[dk] = _directions(x0s, None, num_directions, key)
    else:
        dirs = _directions(x0s, directions, num_directions, key)
    ctx = Ctx(data=data)
    fx0, results = _certify_rays(ctx, closed, x0s, dirs, terms, data, traced)
    return _combine(loss, name, treedef, x0s, dirs, results, ctx, fx0, terms)


def _combine(
    loss, name, treedef, x0s, dirs, results: list[RayResult], ctx: Ctx, fx0, terms
) -> Report:
    verdicts = [r.to_dict(i) for i, r in enumerate(results)]
    notes: list = []
    differentiable: bool | None = None
    outputs = None
    defined = [r for r in results if r.verdict in ("DEFINED", "REMOVABLE")]
    singular = [r for r in results if r.verdict in ("SINGULAR", "DISCONTINUOUS")]
    undecided = [r for r in results if r.verdict == "UNDECIDED"]
    domain = [r for r in results if r.verdict == "DOMAIN"]
    lims = [r.limit for r in defined if r.verdict == "REMOVABLE" and r.limit is not None]
    if not singular and lims and max(lims) - min(lims) > 1e-9 * (1 + max(map(abs, lims))):
        # f(x0) is NaN and the rays tend to different values: a jump, not a removable point
        i = next(i for i, r in enumerate(results) if r.limit == min(lims))
        k = next(i for i, r in enumerate(results) if r.limit == max(lims))
        singular = [
            RayResult(
                "DISCONTINUOUS",
                certificate=(
                    f"f(x0) is NaN and f(x0 + t v) tends to {min(lims):.10g} along direction {i} but "
                    f"to {max(lims):.10g} along direction {k}: no limit at x0"
                ),
            )
        ]
    if singular:
        label = "singular"
        r = singular[0]
        differentiable = (
            False
            if (
                r.verdict == "DISCONTINUOUS"
                or r.fprime is not None
                and math.isinf(r.fprime)
                or "value diverges" in r.certificate
            )
            else None
        )
        cert = f"{r.verdict}: {r.certificate}"
        if differentiable is False:
            cert += "; f is not differentiable at x0"
    elif undecided:
        label = "undecided"
        cert = "UNDECIDED: " + "; ".join(undecided[0].notes or ["the rules could not decide"])
    elif not defined:
        label = "singular"
        cert = "DOMAIN: every ray tried leaves the domain of f"
        differentiable = False
    else:
        grads = [r.gradient for r in defined]
        all_same = all(_same(grads[0], g) for g in grads[1:])
        opposite = []
        for i, di in enumerate(dirs):
            for k, dk in enumerate(dirs):
                if k > i and _opposite(di, dk):
                    ri, rk = results[i], results[k]
                    if (
                        ri.fprime is not None
                        and rk.fprime is not None
                        and ri.verdict in ("DEFINED", "REMOVABLE")
                        and rk.verdict in ("DEFINED", "REMOVABLE")
                    ):
                        opposite.append(ri.fprime + rk.fprime)
        kink = any(abs(s) > 1e-9 * (1 + max(abs(r.fprime or 0) for r in defined)) for s in opposite)
        if all_same and not kink:
            label = "gradient"
            outputs_flat = grads[0]
            differentiable = None if domain else True
            cert = (
                "the limit of the gradient along every ray tried is the same: "
                "lim_{t->0+} grad f(x0 + t v)"
            )
            if domain:
                cert += (
                    f" (one-sided: {len(domain)} of {len(results)} rays leave the domain, "
                    "x0 is on the boundary of the domain)"
                )
            if any(r.verdict == "REMOVABLE" for r in defined):
                cert += "; f(x0) is NaN but the singularity is removable"
        else:
            label = "clarke-subgradient"
            differentiable = False
            outputs_flat = _min_norm_leaves(grads)
            why = (
                "two different limits of the gradient"
                if not all_same
                else "f'(x0; v) + f'(x0; -v) != 0"
            )
            cert = (
                f"not differentiable at x0 ({why}); the minimum-norm element of the convex "
                "hull of the limits is a Clarke subgradient (when f is locally Lipschitz "
                "near x0)"
            )
        outputs = jax.tree_util.tree_unflatten(treedef, [np.asarray(g) for g in outputs_flat])
    if ctx.unverified:
        notes.append(
            "unverified: primitives treated as analytic via repeated JVPs: "
            + ", ".join(sorted(ctx.unverified))
        )
    detail = {
        "label": label,
        "verdicts": verdicts,
        "certificate": cert,
        "differentiable": differentiable,
        "f(x0)": fx0,
        "terms": terms,
        "unverified": sorted(ctx.unverified),
    }
    title = {
        "gradient": "certified gradient (ray limit)",
        "clarke-subgradient": "not differentiable: a Clarke subgradient",
        "singular": "no gradient: singular",
        "undecided": "undecided",
    }[label]
    expl_lines = [cert] + [
        f"  direction {v['direction']}: {v['verdict']}"
        + (f" -- {v['certificate']}" if v["certificate"] else "")
        + (f" [{'; '.join(v['notes'])}]" if v["notes"] else "")
        for v in verdicts
    ]
    finding = Finding(
        kind="certified",
        catalog_id=None,
        phase="gradient",  # type: ignore[arg-type]
        primitive="gradsan.jax.certify",
        where=_frame_of(loss),
        result=title,
        title=title,
        explanation="\n".join(expl_lines),
        detail=detail,
        outputs=[
            OutputHit(
                path=_arg_name(loss),
                count=sum(x.size for x in x0s),
                size=sum(x.size for x in x0s),
                kind="grad",
            )
        ],
    )
    return Report(findings=[finding], outputs=outputs, function=name, backend="jax", notes=notes)


from . import _certify_ops  # noqa: E402,F401
