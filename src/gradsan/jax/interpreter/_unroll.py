"""Higher-order rules that evaluate: the taken branch of a cond, each iteration of a scan or a
while loop, in order. For transformations that see concrete values (explain, sanitize,
subgradient, certify's pass at x0)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat
from ._core import Interpreter, Rule, Scope

__all__ = [
    "UNROLL",
    "cond_rule",
    "scan_bad_iterations",
    "scan_carry_at",
    "scan_rule",
    "while_rule",
]


def cond_rule(
    interp: Interpreter, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    branches = eqn.params["branches"]
    idx = int(np.clip(interp.index(invals[0]), 0, len(branches) - 1))
    jaxpr, consts = _compat.closed(branches[idx])
    sub = interp.sub_scope(
        eqn, scope, (*key, idx), f"cond[{idx}]", interp.in_context(scope, f"cond branch {idx}")
    )
    csides = [interp.const_side(c, "a constant") for c in consts]
    return interp.run(jaxpr, consts, csides, invals[1:], insides[1:], sub)


def scan_rule(
    interp: Interpreter, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    p = eqn.params
    jaxpr, jconsts = _compat.closed(p["jaxpr"])
    nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
    reverse = p.get("reverse", False)
    consts, carry, xs = invals[:nc], list(invals[nc : nc + nk]), invals[nc + nk :]
    c_sides, k_sides, x_sides = insides[:nc], list(insides[nc : nc + nk]), insides[nc + nk :]
    jc_sides = [interp.const_side(c, "a constant") for c in jconsts]
    ys: list[list] = []
    y_sides: list[list] = []
    for step in range(length):
        i = length - 1 - step if reverse else step
        sub = interp.sub_scope(
            eqn,
            scope,
            (*key, i),
            f"scan[{i}]",
            interp.in_context(scope, f"scan iteration {i} (of {length})"),
        )
        outs, osides = interp.run(
            jaxpr,
            jconsts,
            jc_sides,
            [*consts, *carry, *[x[i] for x in xs]],
            [*c_sides, *k_sides, *x_sides],
            sub,
        )
        carry, k_sides = list(outs[:nk]), list(osides[:nk])
        ys.append(outs[nk:])
        y_sides.append(osides[nk:])
    if reverse:
        ys.reverse()
        y_sides.reverse()
    stacked, stacked_sides = [], []
    for j in range(len(jaxpr.outvars) - nk):
        stacked.append(interp.stack([y[j] for y in ys], eqn.outvars[nk + j].aval))
        stacked_sides.append(interp.stack_side([s[j] for s in y_sides], scope))
    return [*carry, *stacked], [*k_sides, *stacked_sides]


def while_rule(
    interp: Interpreter, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    p = eqn.params
    cj, cc = _compat.closed(p["cond_jaxpr"])
    bj, bc = _compat.closed(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = invals[:nc], invals[nc : nc + nb], list(invals[nc + nb :])
    c_sides, b_sides, k_sides = insides[:nc], insides[nc : nc + nb], list(insides[nc + nb :])
    cc_sides = [interp.const_side(c, "a constant") for c in cc]
    bc_sides = [interp.const_side(c, "a constant") for c in bc]
    k = 0
    while True:
        sub = interp.sub_scope(eqn, scope, (*key, "c", k), f"while[{k}]")
        pred, _ = interp.run(cj, cc, cc_sides, [*cconsts, *carry], [*c_sides, *k_sides], sub)
        if not interp.truthy(pred[0]):
            break
        sub = interp.sub_scope(
            eqn,
            scope,
            (*key, "b", k),
            f"while[{k}]",
            interp.in_context(scope, f"while iteration {k}"),
        )
        carry, new_sides = interp.run(
            bj, bc, bc_sides, [*bconsts, *carry], [*b_sides, *k_sides], sub
        )
        k_sides = [interp.carry_side(o, n) for o, n in zip(k_sides, new_sides)]
        k += 1
    return carry, k_sides


UNROLL: dict[Any, Rule] = {
    _compat.cond_p: cond_rule,
    _compat.scan_p: scan_rule,
    _compat.while_p: while_rule,
}


# -- long scans: compiled prefixes instead of every iteration -------------------------------------


def _split_scan(eqn: Any, invals: list) -> tuple[list, list, list]:
    nc, nk = eqn.params["num_consts"], eqn.params["num_carry"]
    return list(invals[:nc]), list(invals[nc : nc + nk]), list(invals[nc + nk :])


def scan_carry_at(eqn: Any, invals: list, i: int) -> list:
    """The carry entering iteration ``i`` of a scan, computed by the compiled scan of the
    iterations before it (in execution order: ``reverse`` scans run from the end)."""
    p = eqn.params
    length, reverse = p["length"], p.get("reverse", False)
    consts, carry, xs = _split_scan(eqn, invals)
    steps = length - 1 - i if reverse else i
    if steps == 0:
        return carry
    part = [np.asarray(x)[length - steps :] if reverse else np.asarray(x)[:steps] for x in xs]
    params = eqn.primitive.get_bind_params({**p, "length": steps})
    return _compat.bind(eqn, [*consts, *carry, *part], params)[: p["num_carry"]]


def scan_bad_iterations(eqn: Any, invals: list) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration, whether any value the body returns there is non-finite, and whether any
    is NaN: one compiled scan of the body with the two flags as extra outputs."""
    p = eqn.params
    closed = p["jaxpr"]
    nk = p["num_carry"]
    consts, carry, xs = _split_scan(eqn, invals)

    def flagged(consts: list, carry: list, xs: list) -> Any:
        def body(c: list, x: list) -> tuple[list, Any]:
            outs = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *consts, *c, *x)
            ok, no_nan = jnp.array(True), jnp.array(True)
            for o in outs:
                if jnp.issubdtype(jnp.result_type(o), jnp.inexact):
                    ok = ok & jnp.all(jnp.isfinite(o))
                    no_nan = no_nan & ~jnp.any(jnp.isnan(o))
            return list(outs[:nk]), (ok, no_nan)

        return lax.scan(body, carry, xs, length=p["length"], reverse=p.get("reverse", False))[1]

    ok, no_nan = jax.jit(flagged)(consts, carry, xs)
    return ~np.asarray(ok), ~np.asarray(no_nan)
