"""gradsan.jax.sanitize: everything ``explain`` reports, plus every kink, tie and jump the
computation sat on, with the convention JAX chose there and whether it is admissible.

The program is evaluated by :class:`KinkEval`, a small jaxpr evaluator that tracks which values
depend on the function's inputs and records every primal-phase evaluation of a non-smooth
primitive at its non-smooth point (abs/sign/relu at 0, max/min/clamp ties and bounds,
reductions, sort, top_k, cummax and max-pool ties, a ``select_n`` whose comparison holds with
equality, floor/ceil/round/int casts at a jump, eigh/svd with repeated values, atan2 at the
origin). The same evaluator, run under ``jax.jvp``, reads the tangents of the recorded operands
(trivial-tie test), and under ``jax.grad`` evaluates the branch-locked gradient
(``gradsan.jax.subgradient``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from .. import _catalog
from .._catalog._classify import classify
from .._catalog._masks import kink_mask
from .._report import Finding, Frame, Report
from .._report._build import catalog_finding
from .._report._format import format_value
from ._call import arg_labels, check_args, check_callable, flatten_call
from ._compat import bind as _bind
from ._compat import closed as _closed
from ._explain import diagnose
from ._flags import host_flag as _host_flag
from ._source import exclude_gradsan, place
from .interpreter._core import _is_library_body
from .interpreter._core import library_name as _library_name
from .interpreter._core import to_numpy as _np

exclude_gradsan()

# lax primitive -> canonical op of gradsan._catalog._classify
KINK_OPS: dict[str, str] = {
    "abs": "abs",
    "sign": "sign",
    "max": "max",
    "min": "min",
    "clamp": "clamp",
    "reduce_max": "reduce_max",
    "reduce_min": "reduce_min",
    "argmax": "argmax",
    "argmin": "argmin",
    "sort": "sort",
    "top_k": "top_k",
    "cummax": "cummax",
    "cummin": "cummin",
    "reduce_window_max": "reduce_window_max",
    "reduce_window_min": "reduce_window_min",
    "floor": "floor",
    "ceil": "ceil",
    "round": "round",
    "convert_element_type": "trunc",
    "eigh": "eigh",
    "svd": "svd",
    "atan2": "atan2",
}
COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# Library functions summarized as one operation (their internals would report several kinks).
LIBRARY_OPS = {"clip-at-bound": "clamp", "hypot-at-origin": "hypot"}
JUMPS = {"sign", "floor", "ceil", "round", "trunc"}
TIES = {
    "max",
    "min",
    "reduce_max",
    "reduce_min",
    "argmax",
    "argmin",
    "sort",
    "top_k",
    "cummax",
    "cummin",
    "reduce_window_max",
    "reduce_window_min",
    "where",
    "clamp",
    "relu",
    "abs",
    "hypot",
} | JUMPS

_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}
_CUSTOM = {"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"}


class _Done(Exception):
    """Raised once every wanted tap was read (the rest of the program is not needed)."""


@dataclasses.dataclass
class Scope:
    path: tuple = ()
    frame: Frame | None = None
    library: str | None = None
    context: str = ""
    backward: bool = False
    custom: Any = None  # (eqn, invals) of the innermost custom_jvp/vjp call
    summarized: bool = False  # inside a library call reported as one operation


@dataclasses.dataclass
class Kink:
    """One primal-phase evaluation of a non-smooth primitive at its non-smooth point."""

    key: tuple  # the evaluation whose operands are the tap (the comparison, for where)
    op: str  # canonical op ("relu" for max(x, 0), "where" for select_n)
    prim: str
    eqn: Any
    scope: Scope
    operands: list  # numpy
    deps: tuple
    params: dict
    entry_id: str
    mask: np.ndarray
    got: str
    cases: list | None = None  # where: the select's cases (numpy) and predicate
    pred: Any = None
    invals: list | None = None  # the operand arrays, for the convention
    summarized: bool = False

    @property
    def index(self) -> tuple:
        idx = np.argwhere(self.mask)
        return tuple(int(i) for i in idx[0]) if len(idx) else ()

    @property
    def frame(self) -> Frame | None:
        pl = place(self.eqn.source_info)
        return pl.user or self.scope.frame


def _is_float(x: Any) -> bool:
    dt = getattr(x, "dtype", None)
    return dt is not None and jnp.issubdtype(dt, jnp.inexact)


def _params(prim: str, params: dict, invals: list) -> dict:
    p: dict[str, Any] = {}
    if prim in ("reduce_max", "reduce_min", "argmax", "argmin"):
        p["axes"] = tuple(params.get("axes", ()))
    elif prim == "sort":
        p["dimension"] = params.get("dimension", -1)
    elif prim == "top_k":
        p["k"] = params.get("k")
        ax = params.get("axis")
        p["axis"] = -1 if ax is None else ax
    elif prim in ("cummax", "cummin"):
        p["axis"] = params.get("axis", 0)
        p["reverse"] = params.get("reverse", False)
        p["_min"] = prim == "cummin"
    elif prim in ("reduce_window_max", "reduce_window_min"):
        p.update(
            {
                k: params.get(k)
                for k in (
                    "window_dimensions",
                    "window_strides",
                    "padding",
                    "base_dilation",
                    "window_dilation",
                )
            }
        )
        p["_min"] = prim == "reduce_window_min"
    elif prim == "convert_element_type":
        p["to_bool"] = np.dtype(params["new_dtype"]) == np.bool_
    return p


def _is_boundary(eqn, invals: list) -> bool:
    """Whether a comparison can sit on the boundary of a continuous function's pieces: integer
    comparisons are discrete, and a value compared with itself (``isnan`` is ``x != x``) is
    constant around every finite point."""
    if not (_is_float(invals[0]) or _is_float(invals[1])):
        return False
    a, b = eqn.invars[0], eqn.invars[1]
    return not (a is b and not isinstance(a, jcore.Literal))


# -- the evaluator --------------------------------------------------------------------------


class KinkEval:
    """Evaluates a ClosedJaxpr equation by equation.

    ``mode="scan"``: concrete values; records :class:`Kink` s and comparisons with equality.
    ``mode="taps"``: run under ``jax.jvp``; keeps the operands of the evaluations in ``want``.
    ``mode="lock"``: run under ``jax.grad``; the evaluations in ``decisions`` are replaced by
    the branch active along the chosen direction (see :mod:`gradsan.jax._subgradient`).
    Evaluations are keyed by their position (equation indices and loop iterations), so the
    three modes agree on keys at the same primal point.
    """

    def __init__(
        self,
        mode: str = "scan",
        want: set | None = None,
        decisions: dict | None = None,
        locked_calls: set | None = None,
    ):
        self.mode = mode
        self.want = want or set()
        self.decisions = decisions or {}
        self.locked_calls = locked_calls or set()
        self.kinks: list[Kink] = []
        self.cmps: dict[int, tuple] = {}  # id(bool output) -> (output, key, lhs, rhs, eq mask)
        self.cmp_kinks: list[Kink] = []  # every comparison with equality (for subgradient)
        self.taps: dict[tuple, list] = {}
        self.calls_with_kinks: set[tuple] = set()
        self._open_calls: list[tuple] = []

    def run_closed(self, closed, args: list, deps: list):
        top = Scope()
        return self.run(
            closed.jaxpr,
            list(closed.consts),
            [False] * len(closed.consts),
            list(args),
            list(deps),
            top,
        )

    def run(self, jaxpr, consts, cdeps, args, adeps, scope: Scope):
        env: dict = {}
        dep: dict = {}
        for v, c, d in zip(jaxpr.constvars, consts, cdeps):
            env[v], dep[v] = c, d
        for v, a, d in zip(jaxpr.invars, args, adeps):
            env[v], dep[v] = a, d
        for i, eqn in enumerate(jaxpr.eqns):
            invals, indeps = [], []
            for v in eqn.invars:
                if isinstance(v, jcore.Literal):
                    invals.append(v.val)
                    indeps.append(False)
                else:
                    invals.append(env[v])
                    indeps.append(dep[v])
            key = (*scope.path, i)
            outs, odeps = self.eqn(eqn, key, invals, indeps, scope)
            for v, val, d in zip(eqn.outvars, outs, odeps):
                if not isinstance(v, jcore.DropVar):
                    env[v], dep[v] = val, d
        outs, odeps = [], []
        for v in jaxpr.outvars:
            if isinstance(v, jcore.Literal):
                outs.append(v.val)
                odeps.append(False)
            else:
                outs.append(env[v])
                odeps.append(dep[v])
        return outs, odeps

    # -- scopes ------------------------------------------------------------------------------
    def _sub(self, eqn, scope: Scope, key: tuple, context: str | None = None) -> Scope:
        pl = place(eqn.source_info)
        name_stack = str(eqn.source_info.name_stack)
        return Scope(
            path=key,
            frame=pl.user if pl.user is not None else scope.frame,
            library=scope.library or (pl.library if pl.user is None else None),
            context=scope.context if context is None else context,
            backward=scope.backward or "transpose" in name_stack,
            custom=scope.custom,
            summarized=scope.summarized,
        )

    def _ctx(self, scope: Scope, what: str) -> str:
        return f"{scope.context}, {what}" if scope.context else what

    # -- one equation ------------------------------------------------------------------------
    def eqn(self, eqn, key, invals, deps, scope: Scope):
        name = eqn.primitive.name
        if self.mode == "taps" and key in self.want:
            self.taps[key] = list(invals)
            if len(self.taps) >= len(self.want):
                raise _Done
        if name in _CALLS:
            return self._call(eqn, key, invals, deps, scope)
        if name == "cond":
            idx = int(np.clip(int(invals[0]), 0, len(eqn.params["branches"]) - 1))
            jaxpr, consts = _closed(eqn.params["branches"][idx])
            sub = self._sub(eqn, scope, (*key, idx), self._ctx(scope, f"cond branch {idx}"))
            return self.run(jaxpr, consts, [False] * len(consts), invals[1:], deps[1:], sub)
        if name == "scan":
            return self._scan(eqn, key, invals, deps, scope)
        if name == "while":
            return self._while(eqn, key, invals, deps, scope)
        return self.first_order(eqn, key, invals, deps, scope)

    def _call(self, eqn, key, invals, deps, scope):
        name = eqn.primitive.name
        if self.mode == "lock" and name in _CUSTOM and key not in self.locked_calls:
            # keep the custom derivative rule (safe functions) unless a kink inside is locked
            outs = _bind(eqn, invals)
            return outs, [any(deps)] * len(outs)
        jaxpr, consts, sub = self._enter_call(eqn, key, invals, deps, scope)
        if name in _CUSTOM or sub.summarized:
            self._open_calls.append(key)
        try:
            return self.run(jaxpr, consts, [False] * len(consts), invals, deps, sub)
        finally:
            if name in _CUSTOM or sub.summarized:
                self._open_calls.pop()

    def _enter_call(self, eqn, key, invals, deps, scope):
        """The body of a call equation and its scope (library name, summarized library kink)."""
        name = eqn.primitive.name
        jaxpr, consts = _closed(eqn.params[_CALLS[name]])
        sub = self._sub(eqn, scope, key)
        if name in _CUSTOM:
            sub.custom = (eqn, invals, deps)
        if sub.library is None and name in ("pjit", "jit") and _is_library_body(jaxpr):
            fname = str(eqn.params.get("name", name))
            sub.library = _library_name(jaxpr, fname)
            if sub.library is None and fname in ("clip", "hypot"):
                sub.library = f"jnp.{fname}"
        if (
            self.mode in ("scan", "screen")
            and not sub.backward
            and not scope.summarized
            and any(deps)
        ):
            self._library_kink(eqn, key, invals, deps, sub)
        return jaxpr, consts, sub

    @staticmethod
    def _library_operands(eqn, invals, deps, sub: Scope) -> tuple | None:
        """(op, operands, deps) of a library call reported as one operation (jnp.clip,
        jnp.hypot), in the catalog's operand order; None for any other call."""
        lib = sub.library
        if lib is None or eqn.primitive.name not in ("pjit", "jit"):
            return None
        entry = _catalog.for_library(lib)
        if entry is None or entry.id not in LIBRARY_OPS:
            return None
        op = LIBRARY_OPS[entry.id]
        if op == "clamp":
            if len(invals) != 3:
                return None
            # jnp.clip(x, lo, hi) -> clamp(lo, x, hi)
            return op, [invals[1], invals[0], invals[2]], (deps[1], deps[0], deps[2])
        if len(invals) != 2:
            return None
        return op, list(invals), tuple(deps)

    def _library_kink(self, eqn, key, invals, deps, sub: Scope) -> None:
        found = self._library_operands(eqn, invals, deps, sub)
        if found is None:
            return
        op, operands, kdeps = found
        operands = [_np(v) for v in operands]
        sub.summarized = True
        hit = classify(op, operands, None, {})
        if hit is None:
            return
        self.kinks.append(
            Kink(
                key,
                op,
                sub.library,
                eqn,
                sub,
                operands,
                tuple(kdeps),
                {},
                hit.entry_id,
                np.asarray(hit.mask, bool),
                hit.got,
                invals=list(invals),
            )
        )
        self.calls_with_kinks.update(self._open_calls)
        self.calls_with_kinks.add(key)

    def _scan(self, eqn, key, invals, deps, scope):
        p = eqn.params
        jaxpr, jconsts = _closed(p["jaxpr"])
        nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
        consts, carry, xs = invals[:nc], list(invals[nc : nc + nk]), invals[nc + nk :]
        cd, kd, xd = deps[:nc], list(deps[nc : nc + nk]), deps[nc + nk :]
        ys: list[list] = []
        yd = [False] * (len(jaxpr.outvars) - nk)
        for k in range(length):
            i = length - 1 - k if p.get("reverse", False) else k
            sub = self._sub(
                eqn, scope, (*key, i), self._ctx(scope, f"scan iteration {i} (of {length})")
            )
            outs, od = self.run(
                jaxpr,
                jconsts,
                [False] * len(jconsts),
                [*consts, *carry, *[x[i] for x in xs]],
                [*cd, *kd, *xd],
                sub,
            )
            carry, kd = list(outs[:nk]), list(od[:nk])
            ys.append(outs[nk:])
            yd = [a or b for a, b in zip(yd, od[nk:])]
        if p.get("reverse", False):
            ys.reverse()
        stacked = []
        for j in range(len(yd)):
            aval = eqn.outvars[nk + j].aval
            stacked.append(
                jnp.stack([y[j] for y in ys]) if length else jnp.zeros(aval.shape, aval.dtype)
            )
        return [*carry, *stacked], [*kd, *yd]

    def _while(self, eqn, key, invals, deps, scope):
        p = eqn.params
        cj, cc = _closed(p["cond_jaxpr"])
        bj, bc = _closed(p["body_jaxpr"])
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, carry = invals[:nc], invals[nc : nc + nb], list(invals[nc + nb :])
        cdeps, bdeps, kd = deps[:nc], deps[nc : nc + nb], list(deps[nc + nb :])
        k = 0
        while True:
            sub = self._sub(eqn, scope, (*key, "c", k))
            pred, _ = self.run(cj, cc, [False] * len(cc), [*cconsts, *carry], [*cdeps, *kd], sub)
            if not bool(pred[0]):
                break
            sub = self._sub(eqn, scope, (*key, "b", k), self._ctx(scope, f"while iteration {k}"))
            carry, od = self.run(bj, bc, [False] * len(bc), [*bconsts, *carry], [*bdeps, *kd], sub)
            kd = [a or b for a, b in zip(kd, od)]
            k += 1
        return carry, kd

    def first_order(self, eqn, key, invals, deps, scope: Scope):
        if self.mode == "lock" and key in self.decisions:
            outs = self.decisions[key](invals)
        else:
            outs = _bind(eqn, invals)
        odeps = [any(deps)] * len(outs)
        if self.mode in ("scan", "screen") and any(deps):
            name_stack = str(eqn.source_info.name_stack)
            backward = scope.backward or "transpose" in name_stack
            if "rematted_computation" in name_stack:
                backward = False
            if not backward:
                self._classify(eqn, key, invals, deps, outs, scope)
        return outs, odeps

    # -- classification (scan mode) ----------------------------------------------------------
    def _classify(self, eqn, key, invals, deps, outs, scope: Scope) -> None:
        name = eqn.primitive.name
        if name in COMPARISONS:
            if not _is_boundary(eqn, invals):
                return
            lhs, rhs = _np(invals[0]), _np(invals[1])
            with np.errstate(all="ignore"):
                eqm = np.broadcast_to(lhs == rhs, np.shape(outs[0]))
            if eqm.any():
                self.cmps[id(outs[0])] = (outs[0], key, lhs, rhs, eqm, tuple(deps), eqn, scope)
                self.cmp_kinks.append(
                    Kink(
                        key,
                        "cmp",
                        name,
                        eqn,
                        scope,
                        [lhs, rhs],
                        tuple(deps),
                        {},
                        "where-at-boundary",
                        eqm,
                        "",
                        summarized=scope.summarized,
                    )
                )
                self.calls_with_kinks.update(self._open_calls)
            return
        if name == "select_n":
            c = self.cmps.get(id(invals[0]))
            if c is None or c[0] is not invals[0] or not any(deps[1:]):
                return
            _, ckey, lhs, rhs, eqm, cdeps, ceqn, cscope = c
            mask = np.broadcast_to(eqm, np.shape(outs[0]))
            got = format_value(np.broadcast_to(lhs, eqm.shape)[eqm].flat[0])
            cases = [_np(v) for v in invals[1:]]
            self.kinks.append(
                Kink(
                    ckey,
                    "where",
                    COMPARISONS[ceqn.primitive.name],
                    eqn,
                    scope,
                    [lhs, rhs],
                    cdeps,
                    {},
                    "where-at-boundary",
                    mask,
                    got,
                    cases=cases,
                    pred=_np(invals[0]),
                    summarized=scope.summarized,
                )
            )
            return
        op = KINK_OPS.get(name)
        if op is None:
            return
        if name == "convert_element_type":
            new = np.dtype(eqn.params["new_dtype"])
            if not _is_float(invals[0]) or new.kind not in "iub":
                return
        if name in ("sort",) and not deps[0]:
            return
        operands = [_np(v) for v in invals]
        params = _params(name, eqn.params, invals)
        if name == "clamp":
            hit = classify("clamp", operands, None, params)
        else:
            hit = classify(op, operands, None, params)
        if hit is None:
            return
        entry_id, kop = hit.entry_id, op
        if name == "max" and not (deps[0] and deps[1]):
            const = operands[1] if deps[0] else operands[0]
            if np.all(const == 0):
                entry_id, kop = "relu-at-zero", "relu"
        self.kinks.append(
            Kink(
                key,
                kop,
                name,
                eqn,
                scope,
                operands,
                tuple(deps),
                params,
                entry_id,
                np.asarray(hit.mask, bool),
                hit.got,
                invals=list(invals),
                summarized=scope.summarized,
            )
        )
        self.calls_with_kinks.update(self._open_calls)


# -- the compiled screen ---------------------------------------------------------------------


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


def _host_count(op: str, params: dict, *operands: Any) -> np.ndarray:
    hit = classify(op, [_np(o) for o in operands], None, params)
    return np.int32(0 if hit is None else hit.count)


class _Screen(KinkEval):
    """KinkEval traced under ``jax.jit``: instead of recording kinks, it adds up how many
    elements sat on a kink, tie or jump (or a select's comparison held with equality) into one
    int32 that the compiled program returns beside the outputs. The decision is the same as
    KinkEval's (the masks are the catalog's, computed with jax.numpy; sorts, cumulative
    extremes, pooling and eigensolvers call the catalog's numpy predicate on the host), and
    where it differs it counts more (dependence is over-approximated across calls and loops),
    so it never says 0 where KinkEval would record something. Loops and conds are re-emitted
    with the count carried."""

    def __init__(self):
        super().__init__("screen")
        self.count = jnp.int32(0)
        self._fns: dict = {}

    def _add(self, n) -> None:
        self.count = self.count + jnp.asarray(n, jnp.int32)

    def _nested(self, fn: Callable, *a):
        """Run ``fn`` with a fresh count (a loop or branch body); returns (result, count)."""
        saved, self.count = self.count, jnp.int32(0)
        try:
            out = fn(*a)
            return out, self.count
        finally:
            self.count = saved

    def eqn(self, eqn, key, invals, deps, scope: Scope):
        name = eqn.primitive.name
        if name == "cond":
            return self._screen_cond(eqn, key, invals, deps, scope)
        if name == "scan":
            return self._screen_scan(eqn, key, invals, deps, scope)
        if name == "while":
            return self._screen_while(eqn, key, invals, deps, scope)
        return super().eqn(eqn, key, invals, deps, scope)

    def _call(self, eqn, key, invals, deps, scope):
        """A call stays a call: one jitted screen per (body, dependence, phase), so the 200
        identical layer calls of a deep net compile once, as in the plain program. Comparison
        results passed in keep their equality masks (jnp.where compares outside its call)."""
        jaxpr, consts, sub = self._enter_call(eqn, key, invals, deps, scope)
        pos, masks = self._cmp_inputs(invals)
        sig = (id(jaxpr), tuple(deps), sub.backward, sub.summarized, pos)
        cached = self._fns.get(sig)
        if cached is None or cached[1] is not jaxpr:

            def body(ops, masks, jaxpr=jaxpr, consts=consts, sub=sub, deps=tuple(deps), pos=pos):
                (outs, _), n = self._nested(
                    self._run_with, jaxpr, consts, list(ops), list(deps), sub, pos, masks
                )
                return list(outs), n

            cached = self._fns[sig] = (jax.jit(body), jaxpr)
        outs, n = cached[0](list(invals), masks)
        self._add(n)
        return outs, _deps_of(jaxpr, list(deps))

    def _cmp_inputs(self, vals: list) -> tuple[tuple, list]:
        """Positions of ``vals`` that are comparison results, and their equality masks."""
        pos, masks = [], []
        for i, v in enumerate(vals):
            c = self.cmps.get(id(v))
            if c is not None and c[0] is v:
                pos.append(i)
                masks.append(c[1])
        return tuple(pos), masks

    def _run_with(self, jaxpr, consts, args, deps, sub, pos, masks):
        """``run`` on a body whose inputs at ``pos`` are comparison results (new tracers)."""
        for i, m in zip(pos, masks):
            self.cmps[id(args[i])] = (args[i], m)
        return self.run(jaxpr, consts, [False] * len(consts), args, deps, sub)

    def _library_kink(self, eqn, key, invals, deps, sub: Scope) -> None:
        found = self._library_operands(eqn, invals, deps, sub)
        if found is not None:
            op, operands, _ = found
            self._add(jnp.sum(kink_mask(op, [jnp.asarray(o) for o in operands], {}, xp=jnp)))

    def _classify(self, eqn, key, invals, deps, outs, scope: Scope) -> None:
        name = eqn.primitive.name
        if name in COMPARISONS:  # a boundary only once a select with live cases uses it
            if _is_boundary(eqn, invals):
                self.cmps[id(outs[0])] = (outs[0], jnp.asarray(invals[0]) == jnp.asarray(invals[1]))
            return
        if name == "select_n":
            c = self.cmps.get(id(invals[0]))
            if c is not None and c[0] is invals[0] and any(deps[1:]):
                self._add(jnp.sum(c[1]))
            return
        op = KINK_OPS.get(name)
        if op is None:
            return
        if name == "convert_element_type":
            if not _is_float(invals[0]) or np.dtype(eqn.params["new_dtype"]).kind not in "iub":
                return
        if name == "sort" and not deps[0]:
            return
        params = _params(name, eqn.params, invals)
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

    def _screen_cond(self, eqn, key, invals, deps, scope):
        odeps: list = [False] * len(eqn.outvars)
        pos, masks = self._cmp_inputs(invals[1:])

        def branch(i: int):
            jaxpr, consts = _closed(eqn.params["branches"][i])
            sub = self._sub(eqn, scope, (*key, i))

            def run(ops, masks):
                (outs, od), n = self._nested(
                    self._run_with, jaxpr, consts, list(ops), list(deps[1:]), sub, pos, masks
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
        self._add(n)
        return outs, odeps

    def _screen_scan(self, eqn, key, invals, deps, scope):
        p = eqn.params
        jaxpr, jconsts = _closed(p["jaxpr"])
        nc, nk = p["num_consts"], p["num_carry"]
        consts, carry, xs = invals[:nc], list(invals[nc : nc + nk]), list(invals[nc + nk :])
        cd, xd = list(deps[:nc]), list(deps[nc + nk :])
        kd = _carry_fixpoint(jaxpr, cd, list(deps[nc : nc + nk]), xd)
        sub = self._sub(eqn, scope, (*key, "i"))
        yd: list = [False] * (len(jaxpr.outvars) - nk)

        def body(c, x):
            carry, n = c
            (outs, od), m = self._nested(
                self.run,
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
        self._add(n)
        return [*carry, *ys], [*kd, *yd]

    def _screen_while(self, eqn, key, invals, deps, scope):
        p = eqn.params
        cj, cc = _closed(p["cond_jaxpr"])
        bj, bc = _closed(p["body_jaxpr"])
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, carry = invals[:nc], invals[nc : nc + nb], list(invals[nc + nb :])
        cdeps, bdeps = list(deps[:nc]), list(deps[nc : nc + nb])
        kd = _carry_fixpoint(bj, bdeps, list(deps[nc + nb :]), [])
        csub = self._sub(eqn, scope, (*key, "c"))
        bsub = self._sub(eqn, scope, (*key, "b"))

        def test(carry):
            (pred, _), n = self._nested(
                self.run, cj, cc, [False] * len(cc), [*cconsts, *carry], [*cdeps, *kd], csub
            )
            return pred[0], n

        def body(c):
            carry, n = c
            _, m_test = test(carry)  # the test that let this iteration run
            (outs, _), m = self._nested(
                self.run, bj, bc, [False] * len(bc), [*bconsts, *carry], [*bdeps, *kd], bsub
            )
            return list(outs), n + m_test + m

        carry, n = jax.lax.while_loop(lambda c: test(c[0])[0], body, (carry, jnp.int32(0)))
        self._add(n + test(carry)[1])  # the final test, which ended the loop
        return carry, kd


class _Screener:
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
            deps = [_is_float(a) or jnp.asarray(a).dtype.kind in "iub" for a in flat]
            outs, _ = ev.run_closed(closed, list(flat), deps)
            return outs, ev.count

        return jax.jit(screened), out_tree


# -- tracing helpers ------------------------------------------------------------------------


def trace(fun: Callable, args: tuple, kwargs: dict):
    """(closed jaxpr, flat args) of ``fun`` at ``args``; static arguments of a jit stay bound."""
    call = flatten_call(fun, args, kwargs)
    flat_args = [
        jnp.asarray(a) if isinstance(a, (bool, int, float, complex)) else a for a in call.flat
    ]
    closed = jax.make_jaxpr(call.fun)(*flat_args)
    return closed, flat_args, call.in_tree


def _leaf_owner(args: tuple, kwargs: dict) -> list[int | str]:
    """For each flat leaf of (args, kwargs): its positional index or keyword name."""
    owner: list[int | str] = []
    for i, a in enumerate(args):
        owner += [i] * len(jax.tree_util.tree_leaves(a))
    for k, v in kwargs.items():
        owner += [k] * len(jax.tree_util.tree_leaves(v))
    return owner


def read_tangents(closed, flat_args: list, want: set, directions: list[list]) -> list[dict]:
    """For each direction (one tangent or None per flat arg): {key: [operand tangents]}."""
    results = []
    if not want:
        return [{} for _ in directions]
    for tangents in directions:
        idx = [i for i, t in enumerate(tangents) if t is not None]
        ev = KinkEval("taps", want=set(want))

        def f(*dyn, ev=ev, idx=idx):
            full = list(flat_args)
            for i, d in zip(idx, dyn):
                full[i] = d
            ev.run_closed(closed, full, [False] * len(full))
            return jnp.zeros(())

        try:
            jax.jvp(f, [flat_args[i] for i in idx], [tangents[i] for i in idx])
        except _Done:
            pass
        out = {}
        for k, vals in ev.taps.items():
            out[k] = [_tangent_of(v) for v in vals]
        results.append(out)
    return results


def _tangent_of(v: Any) -> np.ndarray:
    t = getattr(v, "tangent", None)
    if t is None or type(t).__name__ in ("Zero", "SymbolicZero"):
        return np.zeros(np.shape(v), np.float64)
    a = np.asarray(t)
    if a.dtype.kind not in "fc":
        return np.zeros(np.shape(v), np.float64)
    return a.astype(np.float64)


def random_directions(flat_args: list, owner: list, argnums, n: int, seed: int = 0) -> list[list]:
    dirs = []
    for j in range(n):
        key = jax.random.PRNGKey(seed + 7919 * j)
        ts = []
        for i, a in enumerate(flat_args):
            if not _is_float(a) or (argnums is not None and owner[i] not in argnums):
                ts.append(None)
                continue
            key, sub = jax.random.split(key)
            ts.append(jax.random.normal(sub, np.shape(a), jnp.float32).astype(jnp.result_type(a)))
        dirs.append(ts)
    return dirs


# -- switch tangents: how the tied candidates move along a direction -----------------------


def _scale(*arrs) -> np.ndarray:
    return sum(np.abs(a) for a in arrs) + 0.0


def switch_spread(k: Kink, tans: list[np.ndarray]) -> np.ndarray:
    """Per hit element, how far apart the tied candidates' tangents are (0: they agree),
    relative to their size, in the kink's mask shape."""
    ops = k.operands
    t = [np.asarray(x, np.float64) for x in tans]
    eps = 64 * np.finfo(np.float32).eps

    def rel(a, b):
        a, b = np.broadcast_arrays(a, b)
        return np.abs(a - b) / np.maximum(eps * (np.abs(a) + np.abs(b)), 1e-300)

    op = k.op
    if op in ("abs", "sign", "floor", "ceil", "round", "trunc"):
        return np.broadcast_to(np.where(t[0] == 0, 0.0, np.inf), k.mask.shape)
    if op in ("relu", "max", "min", "where", "cmp", "hypot", "atan2"):
        if op in ("hypot", "atan2"):
            return np.broadcast_to(np.where((t[0] == 0) & (t[1] == 0), 0.0, np.inf), k.mask.shape)
        return np.broadcast_to(rel(t[0], t[1]), k.mask.shape)
    if op == "clamp":
        lo, x, hi = ops
        tlo, tx, thi = t
        out = np.zeros(k.mask.shape)
        if lo is not None and lo.dtype != object:
            out = np.where(np.broadcast_to(x == lo, out.shape), rel(tx, tlo), out)
        if hi is not None and hi.dtype != object:
            out = np.where(np.broadcast_to(x == hi, out.shape), rel(tx, thi), out)
        return out
    if op in ("reduce_max", "reduce_min", "argmax", "argmin"):
        x, tx = ops[0], t[0]
        axes = tuple(a % x.ndim for a in k.params.get("axes", ()))
        ext = (np.min if op in ("reduce_min", "argmin") else np.max)(x, axis=axes, keepdims=True)
        tied = x == ext
        tmax = np.max(np.where(tied, tx, -np.inf), axis=axes)
        tmin = np.min(np.where(tied, tx, np.inf), axis=axes)
        return rel(tmax, tmin)
    if op in ("sort", "top_k"):
        axis = k.params.get("dimension", k.params.get("axis", -1))
        x = np.moveaxis(ops[0], axis, -1)
        tx = np.moveaxis(t[0], axis, -1)
        same = x[..., :, None] == x[..., None, :]
        d = np.where(same, rel(tx[..., :, None], tx[..., None, :]), 0.0).max(axis=-1)
        return np.moveaxis(d, -1, axis)
    if op in ("cummax", "cummin", "reduce_window_max", "reduce_window_min"):
        return _window_spread(k, t[0])
    return np.full(k.mask.shape, np.nan)  # eigh, svd: not decided here


def _window_spread(k: Kink, tx: np.ndarray) -> np.ndarray:
    x = k.operands[0]
    eps = 64 * np.finfo(np.float32).eps
    if k.op.startswith("cum"):
        axis = k.params.get("axis", 0)
        xm, tm = np.moveaxis(x, axis, -1), np.moveaxis(tx, axis, -1)
        if k.params.get("reverse"):
            xm, tm = xm[..., ::-1], tm[..., ::-1]
        fn = np.minimum if k.op == "cummin" else np.maximum
        run = fn.accumulate(xm, axis=-1)
        n = xm.shape[-1]
        lower = np.arange(n)[None, :] <= np.arange(n)[:, None]
        tied = (xm[..., None, :] == run[..., :, None]) & lower
        tmax = np.where(tied, tm[..., None, :], -np.inf).max(-1)
        tmin = np.where(tied, tm[..., None, :], np.inf).min(-1)
        d = np.abs(tmax - tmin) / np.maximum(eps * (np.abs(tmax) + np.abs(tmin)), 1e-300)
        if k.params.get("reverse"):
            d = d[..., ::-1]
        return np.moveaxis(d, -1, axis)
    from .._catalog._masks import windows as _windows

    use_min = k.op.endswith("min")
    w = _windows(x, k.params, np.inf if use_min else -np.inf)
    wt = _windows(tx, k.params, 0.0)
    ext = w.min(-1) if use_min else w.max(-1)
    tied = w == ext[..., None]
    tmax = np.where(tied, wt, -np.inf).max(-1)
    tmin = np.where(tied, wt, np.inf).min(-1)
    return np.abs(tmax - tmin) / np.maximum(eps * (np.abs(tmax) + np.abs(tmin)), 1e-300)


def trivial_mask(k: Kink, per_dir: list[list[np.ndarray]]) -> np.ndarray | None:
    """True at the hit elements where the tied candidates' tangents agree along every
    direction (the candidates are the same function of the inputs to first order)."""
    if k.op in ("eigh", "svd") or not per_dir:
        return None
    ok = np.ones(k.mask.shape, bool)
    for tans in per_dir:
        try:
            spread = switch_spread(k, tans)
        except (ValueError, IndexError):
            return None
        ok &= np.broadcast_to(spread <= 1.0, k.mask.shape)
    return ok & k.mask


# -- conventions: what JAX's derivative rule returns at the kink -----------------------------


def _at(a: Any, idx: tuple, shape: tuple) -> Any:
    a = np.asarray(a)
    if a.shape != shape:
        try:
            a = np.broadcast_to(a, shape)
        except ValueError:
            return a.flat[0]
    return a[idx] if len(idx) == a.ndim else a.flat[0]


def _jvp_wrt(eqn, invals: list, i: int) -> list[np.ndarray]:
    """Output tangents of one primitive when operand ``i`` moves by ones."""
    ts = [None] * len(invals)
    ts[i] = jnp.ones_like(invals[i])

    def f(x):
        full = list(invals)
        full[i] = x
        return _bind(eqn, full)

    _, tout = jax.jvp(f, (jnp.asarray(invals[i]),), (ts[i],))
    return [
        _np(t)
        if np.asarray(t).dtype.kind in "fc" or str(np.asarray(t).dtype) == "bfloat16"
        else np.zeros(np.shape(t))
        for t in tout
    ]


def _vjp_onehot(eqn, invals: list, out_i: int, idx: tuple) -> np.ndarray:
    """Gradient w.r.t. operand 0 of output ``out_i`` at position ``idx``."""

    def f(x):
        full = list(invals)
        full[0] = x
        return _bind(eqn, full)[out_i]

    x0 = jnp.asarray(invals[0])
    out, pull = jax.vjp(f, x0)
    ct = np.zeros(np.shape(out), np.asarray(out).dtype)
    ct[idx] = 1
    (g,) = pull(jnp.asarray(ct))
    return _np(g).astype(np.float64)


def _fmt(v: Any) -> str:
    return format_value(np.asarray(v, np.float64))


def convention(k: Kink) -> dict[str, Any]:
    """The value JAX's rule returned at the first hit, whether it is admissible, and notes."""
    idx = k.index
    shape = k.mask.shape
    op = k.op
    d: dict[str, Any] = {}
    try:
        if op in ("abs", "relu", "sign", "floor", "ceil", "round", "trunc"):
            i = 0 if op != "relu" else (0 if k.deps[0] else 1)
            custom = k.scope.custom
            if (
                op == "relu"
                and custom is not None
                and len(custom[1]) == 1
                and np.shape(custom[1][0]) == np.shape(k.invals[i])
            ):
                val = _at(_jvp_wrt(custom[0], list(custom[1]), 0)[0], idx, shape)
                d["rule"] = "the custom_jvp rule of the enclosing function (jax.nn.relu)"
            elif op == "trunc":
                val = 0.0
            else:
                val = _at(_jvp_wrt(k.eqn, k.invals, i)[0], idx, shape)
            d["value"] = _fmt(val)
            if op == "abs":
                d["admissible"] = bool(-1 <= val <= 1)
            elif op == "relu":
                d["admissible"] = bool(0 <= val <= 1)
            else:
                d["admissible"] = False
                d["blocked"] = True
                d["note"] = (
                    "the function jumps here: the gradient through it is blocked (0), "
                    "which is no subgradient"
                )
        elif op in ("max", "min"):
            vals = [float(_at(_jvp_wrt(k.eqn, k.invals, i)[0], idx, shape)) for i in (0, 1)]
            d["value"] = "(" + ", ".join(_fmt(v) for v in vals) + ")"
            if k.deps[0] and k.deps[1]:
                d["admissible"] = bool(min(vals) >= 0 and abs(sum(vals) - 1) <= 1e-3)
            else:
                v = vals[0] if k.deps[0] else vals[1]
                d["admissible"] = bool(0 <= v <= 1)
        elif op == "clamp":
            if k.invals is not None and len(k.invals) == 3 and k.eqn.primitive.name == "clamp":
                val = float(_at(_jvp_wrt(k.eqn, k.invals, 1)[0], idx, shape))
            else:  # jnp.clip(x, lo, hi): the library call, x is its first operand
                val = float(_at(_jvp_wrt(k.eqn, k.invals, 0)[0], idx, shape))
            d["value"] = f"d/dx = {_fmt(val)}"
            d["admissible"] = bool(0 <= val <= 1)
        elif op == "hypot":
            g = [float(_at(_jvp_wrt(k.eqn, k.invals, i)[0], idx, shape)) for i in (0, 1)]
            d["value"] = f"({_fmt(g[0])}, {_fmt(g[1])})"
            d["admissible"] = bool(np.hypot(*g) <= 1 + 1e-6)
        elif op == "atan2":
            g = [float(_at(_jvp_wrt(k.eqn, k.invals, i)[0], idx, shape)) for i in (0, 1)]
            d["value"] = f"({_fmt(g[0])}, {_fmt(g[1])})"
            d["admissible"] = False
            d["note"] = "atan2 is discontinuous at the origin: no value is a subgradient"
        elif op in (
            "reduce_max",
            "reduce_min",
            "reduce_window_max",
            "reduce_window_min",
            "cummax",
            "cummin",
        ):
            g = _vjp_onehot(k.eqn, k.invals, 0, idx)
            tied = _tied_inputs(k, idx)
            w = g[tied]
            d["value"] = "[" + ", ".join(_fmt(v) for v in w[:8]) + "] on the tied elements"
            d["admissible"] = bool(
                np.all(w >= -1e-6) and abs(w.sum() - 1) <= 1e-3 and np.all(np.abs(g[~tied]) <= 1e-6)
            )
        elif op in ("argmax", "argmin"):
            out = _np(_bind(k.eqn, k.invals)[0])
            d["value"] = f"index {int(_at(out, idx, shape))} (the first of the tied elements)"
            d["admissible"] = True
            d["note"] = (
                "an index carries no gradient; gathering at it sends the whole gradient "
                "to one tied element, a vertex of the subdifferential"
            )
        elif op in ("sort", "top_k"):
            d.update(_sort_convention(k, idx))
        elif op == "where":
            pred = _at(k.pred, idx, shape)
            sel = int(pred)
            cases = [_at(c, idx, shape) for c in k.cases]
            d["value"] = f"the derivative of the branch the comparison selected (case {sel})"
            agree = bool(np.all([c == cases[0] for c in cases]))
            d["admissible"] = agree
            d["branches_agree"] = agree
            if not agree:
                d["note"] = (
                    "the branches differ in value on the boundary: the function jumps "
                    "there and no gradient is right"
                )
        elif op in ("eigh", "svd"):
            d["value"] = (
                "a finite gradient for the eigenvalues (v v^T for the basis returned); "
                "nan through the eigenvectors"
            )
            d["admissible"] = True
            d["note"] = "admissible for the eigenvalues only; the eigenvectors have none"
    except Exception as e:  # a convention we cannot evaluate is not a reason to fail
        d["value_error"] = f"{type(e).__name__}: {e}"
    return d


def _tied_inputs(k: Kink, idx: tuple) -> np.ndarray:
    x = k.operands[0]
    op = k.op
    if op in ("reduce_max", "reduce_min"):
        axes = tuple(a % x.ndim for a in k.params.get("axes", ()))
        ext = (np.min if op == "reduce_min" else np.max)(x, axis=axes, keepdims=True)
        tied = x == ext
        sel = np.zeros(x.shape, bool)
        full = [slice(None)] * x.ndim
        kept = [a for a in range(x.ndim) if a not in axes]
        for a, i in zip(kept, idx):
            full[a] = slice(i, i + 1)
        sel[tuple(full)] = True
        return tied & sel
    if op.startswith("cum"):
        axis = k.params.get("axis", 0) % x.ndim
        pos = idx[axis]
        other = list(idx)
        sel = np.zeros(x.shape, bool)
        rng = range(pos, x.shape[axis]) if k.params.get("reverse") else range(0, pos + 1)
        for j in rng:
            other[axis] = j
            sel[tuple(other)] = True
        ext = x[idx]
        return sel & (x == ext)
    # reduce_window: the elements of window idx equal to its extreme
    dims = tuple(k.params["window_dimensions"])
    strides = tuple(k.params.get("window_strides") or (1,) * x.ndim)
    pad = tuple(k.params.get("padding") or ((0, 0),) * x.ndim)
    wdil = tuple(k.params.get("window_dilation") or (1,) * x.ndim)
    sel = np.zeros(x.shape, bool)
    coords = [
        [idx[a] * strides[a] - pad[a][0] + j * wdil[a] for j in range(dims[a])]
        for a in range(x.ndim)
    ]
    for c in np.ndindex(*dims):
        pos = tuple(coords[a][c[a]] for a in range(x.ndim))
        if all(0 <= p < s for p, s in zip(pos, x.shape)):
            sel[pos] = True
    vals = np.where(sel, x, np.inf if k.op.endswith("min") else -np.inf)
    ext = vals.min() if k.op.endswith("min") else vals.max()
    return sel & (x == ext)


def _sort_convention(k: Kink, idx: tuple) -> dict[str, Any]:
    x = k.operands[0]
    axis = k.params.get("dimension", k.params.get("axis", -1)) % x.ndim
    v = x[idx]
    outs = [_np(o) for o in _bind(k.eqn, k.invals)]
    vals = outs[0]
    # the first output position along the axis holding the tied value
    line = [slice(None) if a == axis else i for a, i in enumerate(idx)]
    pos = np.nonzero(vals[tuple(line)] == v)[0]
    if len(pos) == 0:
        return {"value": "n/a", "admissible": True}
    oidx = tuple(int(pos[0]) if a == axis else i for a, i in enumerate(idx))
    g = _vjp_onehot(k.eqn, k.invals, 0, oidx)
    tied = np.zeros(x.shape, bool)
    lsel = tuple(slice(None) if a == axis else slice(i, i + 1) for a, i in enumerate(idx))
    tied[lsel] = True
    tied &= x == v
    got = [int(i[axis]) for i in np.argwhere(np.abs(g) > 0)]
    w = g[tied]
    return {
        "value": f"the whole gradient to index {got} of the tied "
        f"{[int(i[axis]) for i in np.argwhere(tied)]}",
        "admissible": bool(
            np.all(w >= -1e-6) and abs(w.sum() - 1) <= 1e-3 and np.all(np.abs(g[~tied]) <= 1e-6)
        ),
    }


# -- findings -------------------------------------------------------------------------------


def kink_finding(k: Kink, count: int, size: int, trivial: np.ndarray | None) -> Finding:
    entry = _catalog.get(k.entry_id)
    detail: dict[str, Any] = {"op": k.op}
    conv = entry.conventions.get("jax")
    if conv:
        detail["convention"] = conv
    detail["subdifferential"] = entry.subdifferential or (
        "none: the function jumps here" if entry.kind == "discontinuity" else None
    )
    detail.update(convention(k))
    if k.op == "where":
        detail["comparison"] = f"lhs {k.prim} rhs with lhs == rhs"
    if trivial is not None and k.op in TIES:
        n_triv = int(trivial.sum())
        n_hit = int(k.mask.sum())
        detail["trivial_count"] = n_triv
        detail["tie"] = "trivial" if n_triv == n_hit else "non-trivial"
        if detail["tie"] == "trivial":
            detail["tie_note"] = (
                "the tied candidates are the same function of the inputs "
                "(equal tangents along random directions): the gradient is exact"
            )
    kind = "convention" if k.entry_id == "atan2-at-origin" else "kink"
    prim = k.prim if k.op != "where" else "select_n"
    f = catalog_finding(
        backend="jax",
        entry_id=k.entry_id,
        kind=kind,
        phase="gradient",
        primitive=prim if k.op not in ("clamp", "hypot") or k.prim == "clamp" else k.prim,
        where=k.frame,
        result="finite",
        backend_op=k.eqn.primitive.name,
        got=k.got,
        count=count,
        size=size,
        index=k.index,
        library=k.scope.library,
        context=k.scope.context,
        scope="/".join(str(p) for p in k.scope.path),
        detail=detail,
    )
    return f


def kink_findings(ev: KinkEval, per_dir: list[dict], ignore: Sequence[str] = ()) -> list[Finding]:
    groups: dict[tuple, list[Kink]] = {}
    order: list[tuple] = []
    for k in ev.kinks:
        if k.summarized or k.entry_id in ignore or k.op in ignore or k.prim in ignore:
            continue
        fr = k.frame
        # one finding per entry and user position (loop iterations, the pieces of one call)
        gk = (k.entry_id, None if fr else id(k.eqn), (fr.file, fr.line, fr.column) if fr else None)
        if gk not in groups:
            groups[gk] = []
            order.append(gk)
        groups[gk].append(k)
    # a select_n boundary at the same place as another kink is that kink's derivative rule
    frames_other = {g[2] for g in order if g[0] != "where-at-boundary" and g[2] is not None}
    out = []
    seen_where: set = set()
    for gk in order:
        if gk[0] == "where-at-boundary" and gk[2] in frames_other:
            continue
        if gk[0] == "where-at-boundary":
            if (gk[0], gk[2]) in seen_where:
                continue
            seen_where.add((gk[0], gk[2]))
        ks = groups[gk]
        first = ks[0]
        count = sum(int(k.mask.sum()) for k in ks)
        size = sum(int(k.mask.size) for k in ks)
        triv = None
        tans = [d.get(first.key) for d in per_dir]
        if tans and all(t is not None for t in tans):
            triv = trivial_mask(first, tans)
        out.append(kink_finding(first, count, size, triv))
    return out


# -- the transformation ---------------------------------------------------------------------


def scan_kinks(fun: Callable, args: tuple, kwargs: dict):
    closed, flat_args, _ = trace(fun, args, kwargs)
    ev = KinkEval("scan")
    deps = [_is_float(a) or np.asarray(a).dtype.kind in "iub" for a in flat_args]
    ev.run_closed(closed, flat_args, deps)
    return closed, flat_args, ev


def _screen_ok(fun: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether the arguments can go to the compiled screen as they are (bad ones go to the
    full evaluation, which explains what is wrong with them)."""
    call = flatten_call(fun, args, kwargs)
    labels, leaves = arg_labels(fun, call.dyn_args, call.dyn_kwargs)
    check_args(leaves, labels, "sanitize")
    return all(
        isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex))
        for x in leaves
    )


def sanitize(
    fun: Callable,
    *,
    ignore: Sequence[str] = (),
    argnums: Sequence[int] | int | None = None,
    directions: int = 2,
) -> Callable[..., Report]:
    """Wrap ``fun`` so that calling it returns a :class:`gradsan.Report`: everything
    :func:`gradsan.jax.explain` reports, plus a finding of kind ``"kink"`` for every primal
    evaluation of a non-smooth primitive at its non-smooth point whose operands depend on the
    inputs (``"convention"`` where JAX's value is no subgradient, as atan2 at the origin).

    Each kink finding carries ``where`` (the user's line), ``count`` and ``index`` (the first
    element), and in ``detail``: ``subdifferential`` (from the catalog), ``value`` (what JAX's
    derivative rule returned there, e.g. ``1.0`` for abs at 0), ``admissible`` (whether that
    value lies in the Clarke subdifferential), ``convention`` (the catalog's description), and
    for ties ``tie``: ``"trivial"`` when the tied candidates are the same function of the inputs
    (equal tangents along ``directions`` random directions: the gradient is exact) or
    ``"non-trivial"``. Jumps (sign, floor, ceil, round, float -> int casts) say
    ``blocked: True``.

    ``ignore``: catalog ids or primitive names to leave out. ``argnums``: the positional
    arguments the random directions perturb (default: every float argument).

    G2: when the report has no findings, plain AD returned the true derivative.
    """
    check_callable(fun, "sanitize")
    nums = (
        (argnums,)
        if isinstance(argnums, int)
        else (tuple(argnums) if argnums is not None else None)
    )

    screener = _Screener(fun)

    @functools.wraps(fun)
    def sanitized(*args: Any, **kwargs: Any) -> Report:
        outputs = kinks = bad = None
        if _screen_ok(fun, args, kwargs):
            try:
                outputs, kinks, bad = screener(args, kwargs)
            except Exception:  # anything the screen cannot trace: the full evaluation says why
                outputs = None
        if outputs is not None and not bad:
            report = Report(
                outputs=outputs, function=getattr(fun, "__name__", "function"), backend="jax"
            )
            if not kinks:
                return report
        else:
            report = diagnose(
                fun,
                args,
                kwargs,
                who="sanitize",
                **({} if outputs is None else {"outputs": outputs}),
            )
        ign = set(ignore)
        report.findings = [
            f for f in report.findings if f.catalog_id not in ign and f.primitive not in ign
        ]
        if kinks == 0:  # the screen counted nothing: no kink walk needed
            return report
        closed, flat_args, ev = scan_kinks(fun, args, kwargs)
        want = {k.key for k in ev.kinks if not k.summarized and k.op in TIES}
        per_dir: list[dict] = []
        if want and directions > 0:
            owner = _leaf_owner(args, kwargs)
            dirs = random_directions(flat_args, owner, nums, directions)
            per_dir = read_tangents(closed, flat_args, want, dirs)
        report.findings.extend(kink_findings(ev, per_dir, tuple(ign)))
        return report

    return sanitized
