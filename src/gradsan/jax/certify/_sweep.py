"""The forward and reverse sweeps of certify over a jaxpr: per equation, the rule registered
in :mod:`._registry` (or the fallback), a memo of repeated pure equations per ray and the
truncation caps per equation."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from jax.extend import core as jcore

from . import _series as S
from ._registry import BWD, FWD, PURE
from ._series import Series
from ._values import Ctx, IntVal, Tape, _const_eval, _lift, _read
from .rules.fallback import _fallback_bwd, _fallback_fwd

# -- the forward and reverse sweeps ------------------------------------------------------------


def fwd_jaxpr(ctx: Ctx, jaxpr, consts: list, args: list, active_in: Sequence[bool]):
    env: dict = {}
    active: set = set()
    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c if isinstance(c, (Series, IntVal)) else _lift(c, v.aval)
    for v, a, a_in in zip(jaxpr.invars, args, active_in):
        env[v] = a
        if a_in:
            active.add(v)
    aux: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        ins = [_read(env, v) for v in eqn.invars]
        act = [(not isinstance(v, jcore.Literal)) and v in active for v in eqn.invars]
        name = eqn.primitive.name
        key = _memo_key(eqn, ins) if name in PURE else None
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
    keys: list = []
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
