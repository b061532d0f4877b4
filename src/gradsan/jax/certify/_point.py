"""The point itself: f(x0) and its singular points."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.extend import core as jcore

from .. import _compat
from .._compat import bind as _bind
from .._numpy import TWINS, evaluate_float
from ..interpreter import UNROLL, Interpreter, Scope
from . import _series as S
from ._registry import KINKY, PLAIN

# -- the point itself: f(x0) and its singular points -------------------------------------------
#
# One plain evaluation at x0, in numpy where the primitive has a numpy twin (JAX's own eager
# dispatch, per equation, costs as much as a good part of a ray) and by JAX otherwise. It gives
# f(x0) and the "events": the equations at a singular point (a zero under sqrt, log, a power or a
# division, a tie under max, min, abs or a comparison, a non-finite value). Only they and what
# feeds them need more than the t^0 and t^1 terms in the first, cheap pass along each ray.

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
    point = Point()
    with np.errstate(all="ignore"), jax.default_device(jax.devices("cpu")[0]):
        outs, _ = point.run_closed(closed, list(x0s), [None] * len(x0s), PointScope())
    return float(np.ravel(outs[0])[0]), {k: v for k, v in point.marks.items() if k[0] != "reach"}


@dataclasses.dataclass(eq=False)
class PointScope(Scope):
    # the events of this jaxpr evaluation: equation indices, and ("reach", index, positions)
    # for a body whose events reach those inputs of its equation
    events: list = dataclasses.field(default_factory=list)


class Point(Interpreter):
    """The evaluation at the point: numpy values, no sidecar. ``marks`` gets the events and
    their ancestors, {(id(jaxpr), eqn index): True}, and under ("reach", id(jaxpr)) the invar
    positions of a (nested) jaxpr that its events reach."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict = {}

    def run(self, jaxpr, consts, const_sides, args, arg_sides, scope):
        consts = [np.asarray(c) for c in consts]
        args = [np.asarray(a) for a in args]
        events = scope.events
        for v, x in zip([*jaxpr.constvars, *jaxpr.invars], [*consts, *args]):
            if (
                x.dtype.kind == "f" and not np.isfinite(x).all()
            ):  # a non-finite input: its consumers
                events += [i for i, e in enumerate(jaxpr.eqns) if v in e.invars]
        outs, sides = super().run(jaxpr, consts, const_sides, args, arg_sides, scope)
        if events:
            self._mark(jaxpr, events)
        return outs, sides

    def first_order(self, eqn, invals, insides, scope, key):
        ins = [np.asarray(x) for x in invals]
        try:
            got = evaluate_float(eqn, ins)
        except (ValueError, TypeError):  # an empty reduction, an odd shape: JAX decides
            got = None
        outs = got if got is not None else [np.asarray(o) for o in _bind(eqn, ins)]
        if _is_event(eqn, ins, outs):
            scope.events.append(key[-1])
        return outs, [None] * len(outs)

    def call(self, eqn, jaxpr, consts, invals, insides, scope, key):
        return self.body(jaxpr, consts, invals, scope, key, key, 0)

    def body(self, jaxpr, consts, invals, scope, key, sub_key, offset: int):
        """A body run on ``invals`` (the equation's inputs from ``offset``): where its events
        reach its inputs, they reach the equation's."""
        outs, _ = self.run(
            jaxpr, consts, [None] * len(consts), invals, [None] * len(invals), PointScope(sub_key)
        )
        reach = {k + offset for k in self.marks.pop(("reach", id(jaxpr)), set())}
        if reach:
            scope.events.append(("reach", key[-1], reach))
        return outs, [None] * len(outs)

    def _mark(self, jaxpr, events: list) -> None:
        """Mark the events and their ancestors in this jaxpr, backwards."""
        marks = self.marks
        hot: set = set()  # variables some event depends on
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


def _point_cond(interp: Point, eqn, invals, insides, scope, key):
    branches = eqn.params["branches"]
    idx = int(np.clip(int(np.asarray(invals[0]).reshape(())), 0, len(branches) - 1))
    body, consts = _compat.closed(branches[idx])
    return interp.body(body, consts, invals[1:], scope, key, (*key, idx), 1)


def _point_bound(interp: Point, eqn, invals, insides, scope, key):
    """scan and while: evaluated by JAX as one equation, an event of their own (never unrolled
    here: the whole loop then runs at the higher cap along the rays)."""
    return interp.first_order(eqn, invals, insides, scope, key)


Point.rules = {
    **UNROLL,
    _compat.cond_p: _point_cond,
    _compat.scan_p: _point_bound,
    _compat.while_p: _point_bound,
}
