"""The point itself: f(x0) and its singular points."""

from __future__ import annotations

import jax
import numpy as np
from jax.extend import core as jcore

from .._compat import bind as _bind
from .._compat import closed as _closed
from .._numpy import TWINS, evaluate_float
from . import _series as S
from ._registry import KINKY, PLAIN
from .rules.control import _call_param

# -- the point itself: f(x0) and its singular points -------------------------------------------
#
# One plain evaluation at x0, in numpy where the primitive has a numpy twin (JAX's own eager
# dispatch, per equation, costs as much as a good part of a ray) and by JAX otherwise. It gives
# f(x0) and the "events": the equations at a singular point (a zero under sqrt, log, a power or a
# division, a tie under max, min, abs or a comparison, a non-finite value). Only they and what
# feeds them need more than the t^0 and t^1 terms in the first, cheap pass along each ray.

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
KINKY.update(
    {
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
)
PLAIN.update(TWINS)
PLAIN.update({"integer_pow", "dot_general", "concatenate", "select_n", "iota", "broadcast_in_dim"})
PLAIN.update(_CALLS)


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
        return bool(np.any(np.abs(np.abs(fl[0]) - 1) <= S.NEAR))
    if name == "log1p":
        return bool(np.any(fl[0] == -1))
    if name in _TIES and len(fl) >= 2:
        if name == "clamp":
            return bool(np.any(fl[1] == fl[0]) or np.any(fl[1] == fl[2]))
        return bool(np.any(np.abs(fl[0] - fl[1]) <= S.NEAR * (np.abs(fl[0]) + np.abs(fl[1]))))
    if name in KINKY:
        return True  # ties or integer points: not worth a check here
    return name not in PLAIN


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
                got = evaluate_float(eqn, ins)
            except (ValueError, TypeError):  # an empty reduction, an odd shape: JAX decides
                got = None
            outs = got if got is not None else [np.asarray(o) for o in _bind(eqn, ins)]
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
            j = prod.get(v)
            if j is not None:
                marks[(id(jaxpr), j)] = True  # a call: its whole body at the higher cap
                stack += list(jaxpr.eqns[j].invars)
        reach = {k for k, v in enumerate(jaxpr.invars) if v in hot}
        if reach:
            marks[("reach", id(jaxpr))] = reach
    return [read(v) for v in jaxpr.outvars]
