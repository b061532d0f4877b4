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
from .._catalog._classify import classify, format_value
from .._report import Finding, Frame, Report
from .._report._build import catalog_finding
from ._call import check_callable, flatten_call
from ._compat import bind as _bind
from ._compat import closed as _closed
from ._conventions import convention, trivial_mask
from ._explain import diagnose
from ._rules import COMPARISONS, is_boundary, is_float, kink_op, kink_params, library_operands
from ._source import exclude_gradsan, place
from .interpreter._core import _is_library_body
from .interpreter._core import library_name as _library_name
from .interpreter._core import to_numpy as _np

exclude_gradsan()

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

    def _library_kink(self, eqn, key, invals, deps, sub: Scope) -> None:
        found = library_operands(sub.library, eqn, invals, deps)
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
            if not is_boundary(eqn, invals):
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
        op = kink_op(eqn, invals, deps)
        if op is None:
            return
        operands = [_np(v) for v in invals]
        params = kink_params(name, eqn.params)
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
            if not is_float(a) or (argnums is not None and owner[i] not in argnums):
                ts.append(None)
                continue
            key, sub = jax.random.split(key)
            ts.append(jax.random.normal(sub, np.shape(a), jnp.float32).astype(jnp.result_type(a)))
        dirs.append(ts)
    return dirs


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
    deps = [is_float(a) or np.asarray(a).dtype.kind in "iub" for a in flat_args]
    ev.run_closed(closed, flat_args, deps)
    return closed, flat_args, ev


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


# the compiled screen is a KinkEval traced under jit: it imports this module
from ._screen import _screen_ok, _Screener  # noqa: E402
