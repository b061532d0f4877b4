"""certify's rules for higher-order primitives: cond, scan and while (the forward rules in
the sweep's table keyed by Primitive, the reverse rules by name; call-like primitives are the
sweep's ``call``)."""

from __future__ import annotations

import functools

import numpy as np
from jax.extend import core as jcore

from ... import _compat
from .. import _series as S
from .._registry import BWD, CONTROL
from .._series import Series, Undecided
from .._sweep import bwd_jaxpr
from .._values import IntVal, const_value, lift

# -- higher-order primitives -----------------------------------------------------------------


def _control(fwd):
    """A rule of the sweep's table (keyed by Primitive) from ``fwd(interp, key, ctx, eqn, ins,
    act) -> (outs, aux)``: the equation goes through the sweep's memo, caps and tape."""

    def rule(interp, eqn, invals, insides, scope, key):
        return interp.equation(
            eqn, invals, insides, scope, key, functools.partial(fwd, interp, key)
        )

    return rule


def _index_of(x, what: str) -> int:
    if isinstance(x, IntVal):
        if x.bad.any():
            raise Undecided(f"the {what} is undecided along the ray")
        return int(np.asarray(x.x).reshape(()))
    cv = const_value(x)
    if cv is None:
        raise Undecided(f"the {what} depends on t")
    return int(np.asarray(cv).reshape(()))


def _cond_fwd(interp, key, ctx, eqn, ins, act):
    branches = eqn.params["branches"]
    idx = int(np.clip(_index_of(ins[0], "cond index"), 0, len(branches) - 1))
    jaxpr, consts = _compat.closed(branches[idx])
    outs, tape = interp.enter(jaxpr, consts, ins[1:], act[1:], (*key, idx))
    return outs, tape


def _cond_bwd(ctx, eqn, ins, outs, aux, cots, need):
    return [None] + bwd_jaxpr(ctx, aux, cots)


CONTROL[_compat.cond_p] = _control(_cond_fwd)
BWD["cond"] = _cond_bwd


def _slice0(x, i):
    if isinstance(x, IntVal):
        return IntVal(x.x[i], x.bad[i])
    return S.apply_linear(x, lambda a: a[i])


def _scan_fwd(interp, key, ctx, eqn, ins, act):
    p = eqn.params
    jaxpr, jconsts = _compat.closed(p["jaxpr"])
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
        outs, tape = interp.enter(
            jaxpr, jconsts, [*consts, *carry, *x_i], [*a_c, *a_car, *a_xs], (*key, i)
        )
        tapes.append((i, tape))
        carry = list(outs[:ncar])
        ys_per.append((i, outs[ncar:]))
    ys_per.sort(key=lambda t: t[0])
    ys = []
    for j, v in enumerate(jaxpr.outvars[ncar:]):
        vals = [y[j] for _, y in ys_per]
        aval = eqn.outvars[ncar + j].aval
        if not vals:
            ys.append(lift(np.zeros(aval.shape, aval.dtype), aval))
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


CONTROL[_compat.scan_p] = _control(_scan_fwd)
BWD["scan"] = _scan_bwd


def _while_fwd(interp, key, ctx, eqn, ins, act):
    p = eqn.params
    cj, cc = _compat.closed(p["cond_jaxpr"])
    bj, bc = _compat.closed(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = ins[:nc], ins[nc : nc + nb], list(ins[nc + nb :])
    a_b, a_car = act[nc : nc + nb], [a or any(act) for a in act[nc + nb :]]
    tapes = []
    for k in range(100000):
        pred, _t = interp.enter(
            cj, cc, [*cconsts, *carry], [False] * (nc + len(carry)), (*key, "c", k)
        )
        if not _index_of(pred[0], "while condition"):
            break
        outs, tape = interp.enter(bj, bc, [*bconsts, *carry], [*a_b, *a_car], (*key, "b", k))
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


CONTROL[_compat.while_p] = _control(_while_fwd)
BWD["while"] = _while_bwd
