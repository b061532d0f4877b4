"""The forward and reverse sweeps of certify over a jaxpr.

The forward sweep runs on the interpreter core (:class:`Sweep`): per equation the rule of
:mod:`._registry` (``FWD`` by name, ``CONTROL`` for cond, scan and while, the core's call
hook for call-like primitives, or the fallback), a memo of repeated pure equations per ray and
the truncation caps per equation; each jaxpr evaluation keeps a :class:`Tape` (every value,
which of them depend on the ray, each equation's ``aux``). The sidecar of a value is whether
it depends on the ray parameter ("active"). The reverse sweep walks a tape backwards, as JAX's
own ``backward_pass`` does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from jax.extend import core as jcore

from .. import _compat
from ..interpreter import Interpreter, Scope
from . import _series as S
from ._registry import BWD, CONTROL, FWD, PURE
from ._series import Series
from ._values import Ctx, IntVal, Tape, _read, const_eval, lift
from .rules.fallback import _fallback_bwd, _fallback_fwd

# -- the forward sweep -------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class SweepScope(Scope):
    tape: Tape | None = None  # the tape of the jaxpr evaluation this scope runs


class Sweep(Interpreter):
    """certify's forward sweep: series values, "active" flags as the sidecar."""

    rules: ClassVar[dict[Any, Any]] = CONTROL

    def __init__(self, ctx: Ctx) -> None:
        super().__init__()
        self.ctx = ctx

    def literal_side(self, value: Any) -> bool:
        return False

    def const_side(self, value: Any, label: str) -> bool:
        return False

    def enter(
        self, jaxpr, consts: list, args: list, active_in: Sequence[bool], key: tuple = ()
    ) -> tuple[list, Tape]:
        """One evaluation of ``jaxpr``: its outputs and its tape."""
        env: dict = {}
        active: set = set()
        cs = []
        for v, c in zip(jaxpr.constvars, consts):
            c = c if isinstance(c, (Series, IntVal)) else lift(c, v.aval)
            env[v] = c
            cs.append(c)
        for v, a, a_in in zip(jaxpr.invars, args, active_in):
            env[v] = a
            if a_in:
                active.add(v)
        tape = Tape(jaxpr, env, active, {})
        outs, _ = self.run(
            jaxpr,
            cs,
            [False] * len(cs),
            list(args),
            [bool(a) for a in active_in],
            SweepScope(key=key, tape=tape),
        )
        outs = [
            lift(v.val, v.aval) if isinstance(v, jcore.Literal) else o
            for v, o in zip(jaxpr.outvars, outs)
        ]
        return outs, tape

    def equation(self, eqn, invals: list, insides: list, scope, key: tuple, rule):
        """One equation by ``rule(ctx, eqn, ins, act) -> (outs, aux)`` (None: the constant
        evaluation or the fallback), through the memo and under its cap; recorded on the
        tape."""
        ctx = self.ctx
        tape = scope.tape
        ins = [
            lift(v.val, v.aval) if isinstance(v, jcore.Literal) else x
            for v, x in zip(eqn.invars, invals)
        ]
        act = insides
        i = key[-1]
        mkey = _memo_key(eqn, ins) if eqn.primitive.name in PURE else None
        hit = ctx.memo.get(mkey) if mkey is not None else None
        c = ctx.caps.get((id(tape.jaxpr), i)) if ctx.caps else None
        if hit is not None:
            outs, a = hit[0], hit[1]
        elif c is not None:
            with S.capped(c):
                outs, a = _fwd_rule(ctx, rule, eqn, ins, act)
        else:
            outs, a = _fwd_rule(ctx, rule, eqn, ins, act)
        if mkey is not None and hit is None:
            ctx.memo[mkey] = (outs, a, ins)  # ins: keeps the objects whose ids are in the key
        tape.aux[i] = a
        any_act = any(act)
        env, active = tape.env, tape.active
        sides = []
        for v, o in zip(eqn.outvars, outs):
            s = any_act and isinstance(o, Series)
            sides.append(s)
            if isinstance(v, jcore.DropVar):
                continue
            env[v] = o
            if s:
                active.add(v)
        return outs, sides

    def first_order(self, eqn, invals: list, insides: list, scope: Scope, key: tuple):
        return self.equation(eqn, invals, insides, scope, key, FWD.get(eqn.primitive.name))

    def call(self, eqn, jaxpr, consts: list, invals: list, insides: list, scope: Scope, key):
        def body(ctx, eqn, ins, act):
            return self.enter(jaxpr, consts, ins, act, key)  # aux: the body's tape

        return self.equation(eqn, invals, insides, scope, key, body)


def fwd_jaxpr(ctx: Ctx, jaxpr, consts: list, args: list, active_in: Sequence[bool]):
    """(outputs, tape) of ``jaxpr`` along the ray: ``args`` are Series or IntVal, ``active_in``
    says which depend on the ray parameter."""
    return Sweep(ctx).enter(jaxpr, consts, args, active_in)


def _fwd_rule(ctx: Ctx, rule, eqn, ins, act):
    if rule is None and not any(act):
        return const_eval(eqn, ins), None
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
            rule = _call_bwd if _compat.call_body(eqn) is not None else _fallback_bwd
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


def _call_bwd(ctx, eqn, ins, outs, aux, cots, need):
    return bwd_jaxpr(ctx, aux, cots)  # aux: the body's tape


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
