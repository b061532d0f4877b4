"""The compiled screen of gradsan.jax.sanitize: the program traced once under ``jax.jit`` with
one int32 beside its outputs, the number of elements that sat on a kink, tie or jump. A clean
step (no kink, finite outputs) costs about one plain step and needs no interpreter.

The screen is a restaging interpreter on the shared core: the same kink decisions as
sanitize's :class:`~gradsan.jax._sanitize.KinkEval` (:mod:`gradsan.jax._rules`, the catalog's
masks), with cond, scan and while re-emitted by ``interpreter._restage`` and the count carried
out of them as an accumulator; calls stay jitted calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._catalog._classify import classify
from .._catalog._masks import kink_mask
from . import _compat
from ._call import arg_labels, check_args, flatten_call
from ._compat import bind as _bind
from ._flags import host_flag
from ._rules import (
    COMPARISONS,
    call_library,
    is_boundary,
    is_float,
    kink_op,
    kink_params,
    library_operands,
)
from .interpreter import Scope
from .interpreter import to_numpy as _np
from .interpreter._restage import RESTAGE, Restaging, call_jit

# The sidecar of a value: (depends on the function's inputs, the equality mask when it is the
# result of a comparison that can sit on a boundary, else None). Its signature is
# (depends, has a mask); the mask is its one leaf.
Side = tuple[bool, Any]
_KINKS = "kinks"  # the accumulator


def _host_count(op: str, params: dict, *operands: Any) -> np.int32:
    hit = classify(op, [_np(o) for o in operands], None, params)
    return np.int32(0 if hit is None else hit.count)


class _Screen(Restaging):
    """KinkEval's decisions traced under ``jax.jit``: instead of recording kinks, it adds up
    how many elements sat on a kink, tie or jump (or a select's comparison held with equality)
    into one int32 that the compiled program returns beside the outputs. The decision is the
    same as KinkEval's (the masks are the catalog's, computed with jax.numpy; sorts,
    cumulative extremes, pooling and eigensolvers call the catalog's numpy predicate on the
    host), and where it differs it counts more (a loop's carry depends on the inputs if any
    iteration's does), so it never says 0 where KinkEval would record something."""

    rules = {**RESTAGE}

    def __init__(self) -> None:
        super().__init__()
        self.acc: dict[Hashable, Any] = {}
        self._fns: dict = {}

    @property
    def count(self) -> Any:
        return self.acc.get(_KINKS, jnp.int32(0))

    def _add(self, n: Any) -> None:
        self.accumulate(_KINKS, jnp.asarray(n, jnp.int32))

    # -- the sidecar -------------------------------------------------------------------------
    def literal_side(self, value: Any) -> Side:
        return (False, None)

    def const_side(self, value: Any, label: str) -> Side:
        return (False, None)

    def side_sig(self, side: Side) -> tuple[bool, bool]:
        return (bool(side[0]), side[1] is not None)

    def side_leaves(self, side: Side, value: Any, sig: Any) -> list:
        if not sig[1]:
            return []
        return [side[1] if side[1] is not None else jnp.zeros(np.shape(value), bool)]

    def side_build(self, sig: Any, leaves: Iterator) -> Side:
        return (sig[0], next(leaves) if sig[1] else None)

    def side_join(self, a: Any, b: Any) -> tuple[bool, bool]:
        return (a[0] or b[0], a[1] or b[1])

    # -- rules -------------------------------------------------------------------------------
    def first_order(
        self, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> tuple[list, list]:
        outs = _bind(eqn, invals)
        deps = [d for d, _ in insides]
        dep = any(deps)
        if eqn.primitive.name == "stop_gradient":  # no gradient flows through it
            return outs, [(False, None)] * len(outs)
        osides: list[Side] = [(dep, None)] * len(outs)
        if dep and not _compat.is_backward(eqn, scope.backward):
            name = eqn.primitive.name
            if name in COMPARISONS:  # a boundary only once a select with live cases uses it
                if is_boundary(eqn, invals):
                    osides[0] = (dep, jnp.asarray(invals[0]) == jnp.asarray(invals[1]))
            elif name == "select_n":
                mask = insides[0][1]
                if mask is not None and any(deps[1:]):
                    self._add(jnp.sum(mask))
            else:
                self._count(eqn, invals, deps)
        return outs, osides

    def _count(self, eqn: Any, invals: list, deps: list) -> None:
        op = kink_op(eqn, invals, deps)
        if op is None or not any(d and is_float(v) for d, v in zip(deps, invals)):
            return  # an integer path carries no gradient
        params = kink_params(eqn.primitive.name, eqn.params)
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
        if not sub.backward and any(d for d, _ in insides):
            found = library_operands(sub.library, eqn, invals, [d for d, _ in insides])
            if found is not None:  # jnp.clip, jnp.hypot: the call is the operation
                op, operands, _ = found
                m = kink_mask(op, [jnp.asarray(o) for o in operands], {}, xp=jnp)
                assert m is not None  # clamp and hypot have masks
                self._add(jnp.sum(m))
        return call_jit(
            self, eqn, jaxpr, consts, invals, insides, sub, self._fns, (id(jaxpr), sub.backward)
        )


class Screener:
    """One compiled screen per argument structure: ``(outputs, kinks, nonfinite)`` (and
    :meth:`count`, the count alone, what sanitize calls) where
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
        bad = not host_flag(outs)
        return jax.tree_util.tree_unflatten(out_tree[0], outs), int(kinks), bad

    def count(self, args: tuple, kwargs: dict) -> int:
        """The kink count alone, from a screen that returns nothing else. sanitize's outputs
        are the user's own call (G0), so the screen's outputs are not needed: without them
        XLA drops everything the count does not read (a train step's backward pass, whose
        equations sanitize never records), and a warm screen costs about the forward pass
        instead of a second whole step."""
        leaves, tree = _plain_leaves(self.fun, args, kwargs)
        if leaves is not None:  # arrays only, no static arguments: the tree is the key
            key: tuple = ("plain", tree)
            entry = self.cache.get(key)
        else:
            entry = None
        if entry is None:
            call = flatten_call(self.fun, args, kwargs)
            full = ("count", call.in_tree, call.statics)
            entry = self.cache.get(full)
            if entry is None:
                entry = self.cache[full] = self._build(call.fun, outputs=False)
            if leaves is not None:
                self.cache[key] = entry
            leaves = call.flat
        jitted, _ = entry
        flat = [
            jnp.asarray(a) if isinstance(a, (bool, int, float, complex)) else a
            for a in leaves or ()
        ]
        return int(jitted(*flat))

    @staticmethod
    def _build(flat_fun: Callable, outputs: bool = True):
        out_tree: list = [None]

        def screened(*flat):
            closed, shape = jax.make_jaxpr(flat_fun, return_shape=True)(*flat)
            out_tree[0] = jax.tree_util.tree_structure(shape)
            ev = _Screen()
            sides = [(is_float(a) or jnp.asarray(a).dtype.kind in "iub", None) for a in flat]
            outs, _ = ev.run_closed(closed, list(flat), sides)
            return (outs, ev.count) if outputs else ev.count

        return jax.jit(screened), out_tree


_PLAIN = (jax.Array, np.ndarray)


def _plain_leaves(fun: Callable, args: tuple, kwargs: dict) -> tuple[list | None, Any]:
    """The leaves and tree of ``(args, kwargs)`` when ``fun`` has no static arguments and every
    leaf is an array of a numpy dtype (no PRNG key, no Python object): then they are exactly
    what ``flatten_call`` traces, without its labels (a name per leaf, a cost per call that
    grows with the parameter tree). (None, None) otherwise."""
    if _compat.jit_statics(fun) != ((), ()):
        return None, None
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    for x in leaves:
        if not isinstance(x, _PLAIN) or not isinstance(x.dtype, np.dtype):
            return None, None
    return leaves, tree


def screen_ok(fun: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether the arguments can go to the compiled screen as they are (bad ones go to the
    full evaluation, which explains what is wrong with them)."""
    if _plain_leaves(fun, args, kwargs)[0] is not None:
        return True  # arrays only: nothing to refuse, nothing to name
    call = flatten_call(fun, args, kwargs)
    labels, leaves = arg_labels(fun, call.dyn_args, call.dyn_kwargs)
    check_args(leaves, labels, "sanitize")
    return all(
        isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex))
        for x in leaves
    )
