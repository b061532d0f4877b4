"""The compiled screen of gradsan.jax.sanitize: the program traced once under ``jax.jit`` with
one int32 beside its outputs, the number of elements that sat on a kink, tie or jump. A clean
step (no kink, finite outputs) costs about one plain step and needs no interpreter.

The screen runs on the interpreter core with the same kink decisions as sanitize's
:class:`~gradsan.jax._sanitize.KinkEval` (:mod:`gradsan.jax._rules`, the catalog's masks); its
rules for cond, scan and while re-emit the control flow with the count carried.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from .._catalog._classify import classify, kink_mask
from . import _compat
from ._call import arg_labels, check_args, flatten_call
from ._compat import bind as _bind
from ._compat import closed as _closed
from ._guard import _host_flag
from ._rules import (
    COMPARISONS,
    call_library,
    is_boundary,
    is_float,
    kink_op,
    kink_params,
    library_operands,
)
from .interpreter import Interpreter, Rule, Scope
from .interpreter import to_numpy as _np


def _deps_of(jaxpr, in_deps: list) -> list:
    """Which outputs of ``jaxpr`` depend on the inputs marked in ``in_deps`` (any input of an
    equation taints all its outputs: an over-approximation of KinkEval's own tracking)."""
    dep: dict = dict(zip(jaxpr.invars, in_deps))
    for eqn in jaxpr.eqns:
        d = any(dep.get(v, False) for v in eqn.invars if not isinstance(v, jcore.Literal))
        for v in eqn.outvars:
            dep[v] = d
    return [False if isinstance(v, jcore.Literal) else dep.get(v, False) for v in jaxpr.outvars]


def _carry_fixpoint(jaxpr, fixed: list, carry: list, rest: list, n_out_carry_at: int = 0) -> list:
    """Dependence of a loop's carries: the initial one, joined with what the body makes of it
    until nothing changes."""
    kd = list(carry)
    while True:
        od = _deps_of(jaxpr, [*fixed, *kd, *rest])
        new = [a or b for a, b in zip(kd, od[n_out_carry_at : n_out_carry_at + len(kd)])]
        if new == kd:
            return kd
        kd = new


def _host_count(op: str, params: dict, *operands: Any) -> np.int32:
    hit = classify(op, [_np(o) for o in operands], None, params)
    return np.int32(0 if hit is None else hit.count)


class _Screen(Interpreter):
    """KinkEval's decisions traced under ``jax.jit``: instead of recording kinks, it adds up
    how many elements sat on a kink, tie or jump (or a select's comparison held with equality)
    into one int32 that the compiled program returns beside the outputs. The decision is the
    same as KinkEval's (the masks are the catalog's, computed with jax.numpy; sorts,
    cumulative extremes, pooling and eigensolvers call the catalog's numpy predicate on the
    host), and where it differs it counts more (dependence is over-approximated across calls
    and loops), so it never says 0 where KinkEval would record something. The sidecar is
    whether a value depends on the inputs."""

    rules: ClassVar[dict[Any, Rule]] = {}  # filled below: cond, scan and while re-emitted

    def __init__(self) -> None:
        super().__init__()
        self.count = jnp.int32(0)
        self.cmps: dict[int, tuple] = {}  # id(bool output) -> (output, equality mask)
        self._fns: dict = {}

    def literal_side(self, value: Any) -> bool:
        return False

    def const_side(self, value: Any, label: str) -> bool:
        return False

    def _add(self, n: Any) -> None:
        self.count = self.count + jnp.asarray(n, jnp.int32)

    def nested(self, fn: Callable, *a: Any) -> tuple[Any, Any]:
        """Run ``fn`` with a fresh count (a loop or branch body); returns (result, count)."""
        saved, self.count = self.count, jnp.int32(0)
        try:
            out = fn(*a)
            return out, self.count
        finally:
            self.count = saved

    def first_order(
        self, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> tuple[list, list]:
        outs = _bind(eqn, invals)
        if any(insides) and not _compat.is_backward(eqn, scope.backward):
            self._classify(eqn, invals, insides, outs)
        return outs, [any(insides)] * len(outs)

    def call(
        self,
        eqn: Any,
        jaxpr: Any,
        consts: list,
        invals: list,
        insides: list,
        scope: Scope,
        key: tuple,
    ) -> tuple[list, list]:
        """A call stays a call: one jitted screen per (body, dependence, phase), so the 200
        identical layer calls of a deep net compile once, as in the plain program. Comparison
        results passed in keep their equality masks (jnp.where compares outside its call)."""
        name = str(eqn.params.get("name", eqn.primitive.name))
        sub = self.sub_scope(eqn, scope, key, f"{eqn.primitive.name}[{name}]")
        if sub.library is None:
            sub.library = call_library(eqn, jaxpr)
        if not sub.backward and any(insides):
            found = library_operands(sub.library, eqn, invals, insides)
            if found is not None:  # jnp.clip, jnp.hypot: the call is the operation
                op, operands, _ = found
                m = kink_mask(op, [jnp.asarray(o) for o in operands], {}, xp=jnp)
                assert m is not None  # clamp and hypot have masks
                self._add(jnp.sum(m))
        pos, masks = self.cmp_inputs(invals)
        sig = (id(jaxpr), tuple(insides), sub.backward, pos)
        cached = self._fns.get(sig)
        if cached is None or cached[1] is not jaxpr:

            def body(ops, masks, jaxpr=jaxpr, consts=consts, sub=sub, deps=tuple(insides)):
                (outs, _), n = self.nested(
                    self.run_with, jaxpr, consts, list(ops), list(deps), sub, pos, masks
                )
                return list(outs), n

            cached = self._fns[sig] = (jax.jit(body), jaxpr)
        outs, n = cached[0](list(invals), masks)
        self._add(n)
        return outs, _deps_of(jaxpr, list(insides))

    def cmp_inputs(self, vals: list) -> tuple[tuple, list]:
        """Positions of ``vals`` that are comparison results, and their equality masks."""
        pos, masks = [], []
        for i, v in enumerate(vals):
            c = self.cmps.get(id(v))
            if c is not None and c[0] is v:
                pos.append(i)
                masks.append(c[1])
        return tuple(pos), masks

    def run_with(
        self, jaxpr: Any, consts: list, args: list, deps: list, sub: Scope, pos: tuple, masks: list
    ) -> tuple[list, list]:
        """``run`` on a body whose inputs at ``pos`` are comparison results (new tracers)."""
        for i, m in zip(pos, masks):
            self.cmps[id(args[i])] = (args[i], m)
        return self.run(jaxpr, consts, [False] * len(consts), args, deps, sub)

    def _classify(self, eqn: Any, invals: list, deps: list, outs: list) -> None:
        name = eqn.primitive.name
        if name in COMPARISONS:  # a boundary only once a select with live cases uses it
            if is_boundary(eqn, invals):
                self.cmps[id(outs[0])] = (outs[0], jnp.asarray(invals[0]) == jnp.asarray(invals[1]))
            return
        if name == "select_n":
            c = self.cmps.get(id(invals[0]))
            if c is not None and c[0] is invals[0] and any(deps[1:]):
                self._add(jnp.sum(c[1]))
            return
        op = kink_op(eqn, invals, deps)
        if op is None:
            return
        params = kink_params(name, eqn.params)
        operands = [jnp.asarray(v) for v in invals]
        m = kink_mask(op, operands, params, xp=jnp)
        if m is not None:
            self._add(jnp.sum(m))
        else:
            self._add(
                jax.pure_callback(
                    functools.partial(_host_count, op, params),
                    jax.ShapeDtypeStruct((), jnp.int32),
                    *operands,
                )
            )


# -- cond, scan and while, re-emitted with the count carried ----------------------------------


def _cond_rule(
    sc: _Screen, eqn: Any, invals: list, deps: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    odeps: list = [False] * len(eqn.outvars)
    pos, masks = sc.cmp_inputs(invals[1:])

    def branch(i: int) -> Callable:
        jaxpr, consts = _closed(eqn.params["branches"][i])
        sub = sc.sub_scope(eqn, scope, (*key, i), f"cond[{i}]")

        def run(ops, masks):
            (outs, od), n = sc.nested(
                sc.run_with, jaxpr, consts, list(ops), list(deps[1:]), sub, pos, masks
            )
            odeps[:] = [a or b for a, b in zip(odeps, od)]
            return list(outs), n

        return run

    outs, n = jax.lax.switch(
        invals[0],
        [branch(i) for i in range(len(eqn.params["branches"]))],
        list(invals[1:]),
        masks,
    )
    sc._add(n)
    return outs, odeps


def _scan_rule(
    sc: _Screen, eqn: Any, invals: list, deps: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    p = eqn.params
    jaxpr, jconsts = _closed(p["jaxpr"])
    nc, nk = p["num_consts"], p["num_carry"]
    consts, carry, xs = invals[:nc], list(invals[nc : nc + nk]), list(invals[nc + nk :])
    cd, xd = list(deps[:nc]), list(deps[nc + nk :])
    kd = _carry_fixpoint(jaxpr, cd, list(deps[nc : nc + nk]), xd)
    sub = sc.sub_scope(eqn, scope, (*key, "i"), "scan")
    yd: list = [False] * (len(jaxpr.outvars) - nk)

    def body(c, x):
        carry, n = c
        (outs, od), m = sc.nested(
            sc.run,
            jaxpr,
            jconsts,
            [False] * len(jconsts),
            [*consts, *carry, *x],
            [*cd, *kd, *xd],
            sub,
        )
        yd[:] = [a or b for a, b in zip(yd, od[nk:])]
        return (list(outs[:nk]), n + m), list(outs[nk:])

    (carry, n), ys = jax.lax.scan(
        body, (carry, jnp.int32(0)), xs, length=p["length"], reverse=p.get("reverse", False)
    )
    sc._add(n)
    return [*carry, *ys], [*kd, *yd]


def _while_rule(
    sc: _Screen, eqn: Any, invals: list, deps: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    p = eqn.params
    cj, cc = _closed(p["cond_jaxpr"])
    bj, bc = _closed(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = invals[:nc], invals[nc : nc + nb], list(invals[nc + nb :])
    cdeps, bdeps = list(deps[:nc]), list(deps[nc : nc + nb])
    kd = _carry_fixpoint(bj, bdeps, list(deps[nc + nb :]), [])
    csub = sc.sub_scope(eqn, scope, (*key, "c"), "while")
    bsub = sc.sub_scope(eqn, scope, (*key, "b"), "while")

    def test(carry):
        (pred, _), n = sc.nested(
            sc.run, cj, cc, [False] * len(cc), [*cconsts, *carry], [*cdeps, *kd], csub
        )
        return pred[0], n

    def body(c):
        carry, n = c
        _, m_test = test(carry)  # the test that let this iteration run
        (outs, _), m = sc.nested(
            sc.run, bj, bc, [False] * len(bc), [*bconsts, *carry], [*bdeps, *kd], bsub
        )
        return list(outs), n + m_test + m

    carry, n = jax.lax.while_loop(lambda c: test(c[0])[0], body, (carry, jnp.int32(0)))
    sc._add(n + test(carry)[1])  # the final test, which ended the loop
    return carry, kd


_Screen.rules = {
    _compat.cond_p: _cond_rule,
    _compat.scan_p: _scan_rule,
    _compat.while_p: _while_rule,
}


class Screener:
    """One compiled screen per argument structure: ``(outputs, kinks, nonfinite)`` where
    ``kinks`` counts the elements KinkEval could record and ``nonfinite`` says whether an
    output is NaN or Inf. A healthy program (both zero) needs nothing else: no interpreter,
    no eager re-run, and a warm call costs about one plain step."""

    def __init__(self, fun: Callable):
        self.fun = fun
        self.cache: dict = {}

    def __call__(self, args: tuple, kwargs: dict):
        call = flatten_call(self.fun, args, kwargs)
        key = (call.in_tree, call.statics)
        entry = self.cache.get(key)
        if entry is None:
            entry = self.cache[key] = self._build(call.fun)
        jitted, out_tree = entry
        flat = [
            jnp.asarray(a) if isinstance(a, (bool, int, float, complex)) else a for a in call.flat
        ]
        outs, kinks = jitted(*flat)
        # finiteness on the host: a reduction per leaf in the program would triple its compile
        # time on a net with hundreds of parameter arrays. Only the outputs: explain blames
        # non-finite outputs (a NaN input that a where masks out is no finding)
        bad = not _host_flag(outs)
        return jax.tree_util.tree_unflatten(out_tree[0], outs), int(kinks), bad

    @staticmethod
    def _build(flat_fun: Callable):
        out_tree: list = [None]

        def screened(*flat):
            closed, shape = jax.make_jaxpr(flat_fun, return_shape=True)(*flat)
            out_tree[0] = jax.tree_util.tree_structure(shape)
            ev = _Screen()
            deps = [is_float(a) or jnp.asarray(a).dtype.kind in "iub" for a in flat]
            outs, _ = ev.run_closed(closed, list(flat), deps)
            return outs, ev.count

        return jax.jit(screened), out_tree


def screen_ok(fun: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether the arguments can go to the compiled screen as they are (bad ones go to the
    full evaluation, which explains what is wrong with them)."""
    call = flatten_call(fun, args, kwargs)
    labels, leaves = arg_labels(fun, call.dyn_args, call.dyn_kwargs)
    check_args(leaves, labels, "sanitize")
    return all(
        isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex))
        for x in leaves
    )
