"""gradsan.jax.sanitize: everything ``explain`` reports, plus every kink, tie and jump the
computation sat on, with the convention JAX chose there and whether it is admissible.

A step goes first to the compiled screen (:mod:`gradsan.jax._screen`), which counts kink hits
beside the outputs; only a step with hits is evaluated by :class:`KinkEval`, an interpreter on
the shared core whose sidecar is whether a value depends on the function's inputs, and which
records every primal-phase evaluation of a non-smooth primitive at its non-smooth point
(abs/sign/relu at 0, max/min/clamp ties and bounds, reductions, sort, top_k, cummax and
max-pool ties, a ``select_n`` whose comparison holds with equality, floor/ceil/round/int casts
at a jump, eigh/svd with repeated values, atan2 at the origin). :class:`TapReader`, run under
``jax.jvp``, reads the tangents of the recorded operands (trivial-tie test), and
``gradsan.jax.subgradient``'s locked evaluation runs on the same :class:`DependenceEval`.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _catalog, _fix
from .._catalog._classify import classify
from .._catalog._ops import TIES
from .._events import Kink as KinkEvent
from .._report import Finding, Frame, Report
from .._report._build import build
from .._report._format import format_value
from . import _compat, _depends
from ._activations import activation_call
from ._call import (
    check_callable,
    check_concrete_outputs,
    check_not_traced,
    leaf_owner,
    random_directions,
    read_tangents,
    trace,
)
from ._compat import bind as _bind
from ._conventions import convention, trivial_mask
from ._explain import diagnose
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
from ._screen import Screener, screen_ok
from ._source import exclude_gradsan, place
from .interpreter import UNROLL, Interpreter, Scope
from .interpreter import to_numpy as _np

exclude_gradsan()


# call-likes whose derivative is their own rule (a safe function's custom_jvp): subgradient
# keeps them, and a relu's convention is read from its rule
CUSTOM_RULE_CALLS = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


class _Done(Exception):
    """Raised once every wanted tap was read (the rest of the program is not needed)."""


@dataclasses.dataclass(eq=False)
class KinkScope(Scope):
    custom: Any = None  # (eqn, invals, deps) of the innermost custom_jvp/vjp call
    custom_outer: Any = None  # (key, eqn, invals) of the outermost custom_jvp/vjp call
    summarized: bool = False  # inside a library call reported as one operation


@dataclasses.dataclass
class Kink:
    """One primal-phase evaluation of a non-smooth primitive at its non-smooth point."""

    key: tuple  # the evaluation whose operands are the tap (the comparison, for where)
    op: str  # canonical op ("relu" for max(x, 0), "where" for select_n)
    prim: str
    eqn: Any
    scope: KinkScope
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
    skey: tuple | None = None  # where: the key of the select_n (its cases' tangents)

    @property
    def index(self) -> tuple:
        idx = np.argwhere(self.mask)
        return tuple(int(i) for i in idx[0]) if len(idx) else ()

    @property
    def frame(self) -> Frame | None:
        pl = place(self.eqn.source_info)
        return pl.user or self.scope.frame


# -- the evaluators -------------------------------------------------------------------------


class DependenceEval(Interpreter):
    """The program evaluated equation by equation, each value with whether it depends on the
    function's inputs (the sidecar), cond/scan/while unrolled. Evaluations are keyed by their
    position (equation indices and loop iterations), so the passes over one primal point
    (:class:`KinkEval`, :class:`TapReader`, subgradient's locked gradient) agree on keys."""

    rules = {**UNROLL}

    def run_closed(
        self, closed: Any, args: list, arg_sides: list, scope: Scope | None = None
    ) -> tuple[list, list]:
        return super().run_closed(closed, args, arg_sides, scope or KinkScope())

    def literal_side(self, value: Any) -> bool:
        return False

    def const_side(self, value: Any, label: str) -> bool:
        return False

    def stack_side(self, sides: list, scope: Scope) -> bool:
        return any(sides)

    def carry_side(self, old: Any, new: Any) -> Any:
        return old or new

    def index(self, v: Any) -> int:
        return int(v)  # a tracer under jax.jvp / jax.grad: no numpy conversion

    def truthy(self, v: Any) -> bool:
        return bool(v)

    def first_order(
        self, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> tuple[list, list]:
        outs = self.evaluate(eqn, invals, key)
        if eqn.primitive.name == "stop_gradient":  # no gradient flows through it
            return outs, [False] * len(outs)
        return outs, [any(insides)] * len(outs)

    def evaluate(self, eqn: Any, invals: list, key: tuple) -> list:
        """The outputs of one first-order equation."""
        return _bind(eqn, invals)

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
        sub = self.call_scope(eqn, jaxpr, invals, insides, scope, key)
        return self.run(jaxpr, consts, [False] * len(consts), invals, insides, sub)

    def call_scope(
        self, eqn: Any, jaxpr: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> KinkScope:
        """The scope of a call's body: the custom rule it runs under, the library it is."""
        name = str(eqn.params.get("name", eqn.primitive.name))
        sub = self.sub_scope(eqn, scope, key, f"{eqn.primitive.name}[{name}]")
        assert isinstance(sub, KinkScope)
        if eqn.primitive.name in CUSTOM_RULE_CALLS:
            sub.custom = (eqn, invals, insides)
            if sub.custom_outer is None:
                sub.custom_outer = (key, eqn, list(invals))
        if sub.library is None:
            sub.library = call_library(eqn, jaxpr)
        return sub


class TapReader(DependenceEval):
    """Run under ``jax.jvp``: keeps the operands of the evaluations in ``want`` (their tangents
    are read afterwards) and stops once every one was met."""

    def __init__(self, want: set) -> None:
        super().__init__()
        self.want = set(want)
        self.taps: dict[tuple, list] = {}

    def read(self, closed: Any, args: list) -> dict[tuple, list]:
        try:
            self.run_closed(closed, args, [False] * len(args))
        except _Done:
            pass
        return self.taps

    def _tap(self, key: tuple, invals: list) -> None:
        if key in self.want:
            self.taps[key] = list(invals)
            if len(self.taps) >= len(self.want):
                raise _Done

    def first_order(
        self, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> tuple[list, list]:
        self._tap(key, invals)
        return super().first_order(eqn, invals, insides, scope, key)

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
        self._tap(key, invals)  # a library call reported as one operation
        if eqn.primitive.name == "custom_jvp_call" and not any(
            w[: len(key)] == key for w in self.want if len(w) > len(key)
        ):  # tangents through the call as AD computes them: by its rule
            outs = _bind(eqn, invals)
            return outs, [any(insides)] * len(outs)
        return super().call(eqn, jaxpr, consts, invals, insides, scope, key)


def kink_tangents(closed: Any, flat_args: list, want: set, directions: list[list]) -> list[dict]:
    """For each direction: {key: [tangents of the operands of the evaluation at key]}."""
    return read_tangents(flat_args, directions, lambda full: TapReader(want).read(closed, full))


class KinkEval(DependenceEval):
    """Records every primal-phase evaluation of a non-smooth primitive at its non-smooth point
    (:class:`Kink`), and every comparison that held with equality."""

    def __init__(self) -> None:
        super().__init__()
        self.kinks: list[Kink] = []
        self.cmps: dict[int, tuple] = {}  # id(bool output) -> (output, key, lhs, rhs, eq mask)
        self.cmp_kinks: list[Kink] = []  # every comparison with equality (for subgradient)
        self.calls_with_kinks: set[tuple] = set()
        self._open_calls: list[tuple] = []
        self.series_unchecked = False  # the kinks-in-series pass failed (jax/_series.py)

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
        assert isinstance(scope, KinkScope)
        sub = self.call_scope(eqn, jaxpr, invals, insides, scope, key)
        if not sub.backward and not scope.summarized and any(insides):
            self._library_kink(eqn, key, invals, insides, sub)
        track = eqn.primitive.name in CUSTOM_RULE_CALLS or sub.summarized
        if track:
            self._open_calls.append(key)
        try:
            return self.run(jaxpr, consts, [False] * len(consts), invals, insides, sub)
        finally:
            if track:
                self._open_calls.pop()

    def _library_kink(self, eqn: Any, key: tuple, invals: list, deps: list, sub: KinkScope) -> None:
        params: dict = {}
        found = library_operands(sub.library, eqn, invals, deps)
        if found is not None:
            op, operands, kdeps = found
            operands = [_np(v) for v in operands]
            sub.summarized = True
        else:  # a jax.nn activation: the call is the operation only at one of its corners
            act = activation_call(sub.library, eqn, invals, deps)
            if act is None:
                return
            op, operands, kdeps, params = act
            operands = [_np(v) for v in operands]
        hit = classify(op, operands, None, params)
        if hit is None:
            return
        sub.summarized = True
        self.kinks.append(
            Kink(
                key,
                op,
                str(sub.library),
                eqn,
                sub,
                operands,
                tuple(kdeps),
                params,
                hit.entry_id,
                np.asarray(hit.mask, bool),
                hit.got,
                invals=list(invals),
            )
        )
        self.calls_with_kinks.update(self._open_calls)
        self.calls_with_kinks.add(key)

    def first_order(
        self, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> tuple[list, list]:
        outs, odeps = super().first_order(eqn, invals, insides, scope, key)
        if any(insides) and not _compat.is_backward(eqn, scope.backward):
            assert isinstance(scope, KinkScope)
            self._classify(eqn, key, invals, insides, outs, scope)
        return outs, odeps

    def _classify(
        self, eqn: Any, key: tuple, invals: list, deps: list, outs: list, scope: KinkScope
    ) -> None:
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
            skey = key
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
                    skey=skey,
                )
            )
            return
        op = kink_op(eqn, invals, deps)
        if op is None or not any(d and is_float(v) for d, v in zip(deps, invals)):
            return  # an integer path (lax.switch's index clamp) carries no gradient
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


# -- findings -------------------------------------------------------------------------------


def kink_event(k: Kink, count: int, size: int, trivial: np.ndarray | None) -> KinkEvent:
    """One kink (all its evaluations at one place), as a text-free event: JAX's value there
    (:func:`convention`) and the tie count are facts; the catalog's words are the builder's."""
    checked = trivial is not None and k.op in TIES
    prim = k.prim if k.op != "where" else "select_n"
    return KinkEvent(
        backend="jax",
        entry_id=k.entry_id,
        op=k.op,
        primitive=prim if k.op not in ("clamp", "hypot") or k.prim == "clamp" else k.prim,
        where=k.frame,
        backend_op=k.eqn.primitive.name,
        got=k.got,
        count=count,
        size=size,
        index=k.index,
        library=k.scope.library,
        context=k.scope.context,
        scope="/".join(str(p) for p in k.scope.key),
        comparison=k.prim if k.op == "where" else None,
        trivial=int(trivial.sum()) if checked and trivial is not None else None,
        tied=int(k.mask.sum()) if checked else None,
        inadmissible_convention="jax" in _catalog.get(k.entry_id).inadmissible,
        facts=convention(k),
    )


def kink_finding(k: Kink, count: int, size: int, trivial: np.ndarray | None) -> Finding:
    return build(kink_event(k, count, size, trivial))


def kink_findings(
    ev: KinkEval, per_dir: list[dict], ignore: Sequence[str] = (), decided: bool = False
) -> list[Finding]:
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
        tans = [d[first.key] for d in per_dir if first.key in d]
        if tans and len(tans) == len(per_dir):
            triv = trivial_mask(first, tans)
        if decided:  # the gradient depends on it: no tied candidate is the same function
            triv = np.zeros(first.mask.shape, bool)
        out.append(kink_finding(first, count, size, triv))
    return out


# -- whether the gradient depends on the kinks ----------------------------------------------


class Injector(DependenceEval):
    """The program with perturbations ``eps[c] * delta`` added at the recorded evaluations
    (see :mod:`gradsan.jax._depends`); calls with a custom rule are bound, so AD uses it. The
    sidecar is the set of candidates (``marks``: key -> candidate ids) whose evaluation reaches
    the value along a path a gradient can take (stop_gradient cuts it)."""

    def __init__(
        self,
        table: dict,
        eps: Any,
        marks: dict | None = None,
        replace: dict | None = None,
        gradient_only: bool = False,
    ) -> None:
        super().__init__()
        self.table = table
        self.eps = eps
        self.marks = marks or {}
        self.replace = replace or {}  # key -> [(output, value)]: an index or cast substituted
        self.gradient_only = gradient_only  # sides cut where no gradient flows (integers)
        self.watch: set = set()  # keys whose inputs' sides are kept (kinks in series)
        self.inputs: dict[tuple, frozenset] = {}

    def _replaced(self, outs: list, key: tuple) -> list:
        for i, v in self.replace.get(key, ()):
            outs[i] = v(outs[i]) if callable(v) else jnp.asarray(v, outs[i].dtype)
        return outs

    def literal_side(self, value: Any) -> Any:
        return frozenset()

    def const_side(self, value: Any, label: str) -> Any:
        return frozenset()

    def stack_side(self, sides: list, scope: Scope) -> Any:
        return frozenset().union(*sides)

    def carry_side(self, old: Any, new: Any) -> Any:
        return old | new

    def _mark(self, key: tuple, sides: list) -> list:
        m = self.marks.get(key)
        return [x | m for x in sides] if m else sides

    def first_order(
        self, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> tuple[list, list]:
        if key in self.watch:
            self.inputs[key] = frozenset().union(*insides)
        outs = self.evaluate(eqn, invals, key)
        if eqn.primitive.name == "stop_gradient":
            sides: list[frozenset] = [frozenset()] * len(outs)
        else:
            sides = self._flow(invals, insides, outs)
        outs = _depends.inject(self._replaced(list(outs), key), key, self.table, self.eps)
        return outs, self._mark(key, sides)

    def _flow(self, invals: list, insides: list, outs: list) -> list[frozenset]:
        """The sides of an equation's outputs: every input's; with ``gradient_only`` a float
        output takes only its float inputs' (no gradient flows through an integer:
        ``one_hot(argmax(x))`` carries no gradient to x; its value jumps, its tangent does
        not), an integer or boolean output every input's (an index computed from an index)."""
        every = frozenset().union(*insides)
        if not self.gradient_only:
            return [every] * len(outs)
        floats = frozenset().union(*[x for v, x in zip(invals, insides) if is_float(v)])
        return [floats if is_float(o) else every for o in outs]

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
        if key in self.watch:
            self.inputs[key] = frozenset().union(*insides)
        if eqn.primitive.name in CUSTOM_RULE_CALLS:
            outs = _bind(eqn, invals)
            sides = self._flow(invals, insides, outs)
        else:
            outs, sides = self.run(
                jaxpr,
                consts,
                [frozenset()] * len(consts),
                invals,
                insides,
                self.call_scope(eqn, jaxpr, invals, insides, scope, key),
            )
        outs = _depends.inject(self._replaced(list(outs), key), key, self.table, self.eps)
        return outs, self._mark(key, list(sides))


_JAC_CODES: set | None = None


def jacobian_of(fun: Any) -> tuple[Callable, Any] | None:
    """(g, argnums) when ``fun`` is ``jax.jacfwd(g)`` / ``jax.jacrev(g)`` (so ``jax.hessian(f)``
    gives ``jax.jacrev(f)``), looked up through ``__wrapped__`` (a jit of it); recognised by
    the code object of JAX's wrapper (never by name), None otherwise or with ``has_aux``."""
    global _JAC_CODES
    if _JAC_CODES is None:
        try:
            _JAC_CODES = {jax.jacfwd(abs).__code__, jax.jacrev(abs).__code__}
        except Exception:  # a JAX whose wrappers differ: recognise nothing
            _JAC_CODES = set()
    _compat.grad_info(abs)  # JAX's grad wrappers' codes, read once
    grads = _compat._CODES or {}
    seen = 0
    while callable(fun) and seen < 8:
        if getattr(_compat._unboundary(fun), "__code__", None) in grads:
            return None  # jax.grad(...) comes first: grad_info's case
        if getattr(fun, "__code__", None) in _JAC_CODES:
            try:
                g, argnums, aux = (_compat._cell(fun, n) for n in ("fun", "argnums", "has_aux"))
            except LookupError:
                return None
            return None if aux or not callable(g) else (g, argnums)
        nxt = getattr(fun, "__wrapped__", None)
        if nxt is None or nxt is fun:
            return None
        fun, seen = nxt, seen + 1
    return None


def equinox_of(fun: Any) -> tuple[str, Callable, bool] | None:
    """(kind, g, has_aux) when ``fun`` is equinox's ``filter_grad(g)`` /
    ``filter_value_and_grad(g)`` (kind "grad") or ``filter_jacfwd(g)`` / ``filter_jacrev(g)``
    (kind "jac"; ``filter_hessian(f)`` is ``filter_jacfwd(filter_jacrev(f))``), looked up
    through ``__wrapped__`` (``eqx.filter_jit``); recognised by equinox's wrapper classes
    (only when equinox is imported), None otherwise. Each differentiates its first argument."""
    ad = sys.modules.get("equinox._ad")
    if ad is None:
        return None
    kinds = {
        getattr(ad, "_GradWrapper", None): "grad",
        getattr(ad, "_ValueAndGradWrapper", None): "value_and_grad",
        getattr(ad, "_Jac", None): "jac",
    }
    kinds.pop(None, None)
    seen = 0
    while callable(fun) and seen < 8:
        kind = kinds.get(type(fun))
        try:
            if kind == "grad":
                return "grad", fun._fun_value_and_grad._fun, bool(fun._has_aux)
            if kind == "value_and_grad":
                return "grad", fun._fun, bool(fun._has_aux)
            if kind == "jac":
                return "jac", fun.fun, bool(fun.has_aux)
        except AttributeError:  # an equinox whose wrappers differ: recognise nothing
            return None
        nxt = getattr(fun, "__wrapped__", None)
        if nxt is None or nxt is fun:
            return None
        fun, seen = nxt, seen + 1
    return None


def jacobian_name(target: Any) -> str | None:
    """ "the Jacobian of f" when ``target`` is ``jax.jacrev(f)`` / ``eqx.filter_jacrev(f)``."""
    if getattr(target, "__code__", None) in (_JAC_CODES or ()):
        return f"the Jacobian of {getattr(target, '__name__', 'function')}"
    eqx = equinox_of(target)
    if eqx is not None and eqx[0] == "jac":
        return f"the Jacobian of {getattr(eqx[1], '__name__', 'function')}"
    return None


def differentiated(fun: Callable, nums: tuple | None) -> tuple[Callable, tuple | None]:
    """The function whose gradient a kink can change, and the arguments it is taken with
    respect to: ``f`` for ``jax.grad(f)`` / ``jax.value_and_grad(f)`` (its first output with
    ``has_aux``), ``g`` for ``jax.jacfwd(g)`` / ``jax.jacrev(g)`` (``jax.jacrev(f)`` for
    ``jax.hessian(f)``), the same for equinox's filter_grad / filter_value_and_grad /
    filter_jacfwd / filter_jacrev / filter_hessian (their first argument), else ``fun``."""
    eqx = equinox_of(fun)
    if eqx is not None:
        kind, g, aux = eqx
        if kind == "jac" and aux:
            return fun, nums  # the Jacobian of a function with aux: not unpicked here
        if aux:
            return (lambda *a, **kw: g(*a, **kw)[0]), (0,)
        return g, (0,)
    jac = jacobian_of(fun)  # before grad_info, which looks through jacfwd(jax.grad(f))
    if jac is not None:
        g, argnums = jac
        return g, ((argnums,) if isinstance(argnums, int) else tuple(argnums))
    info = _compat.grad_info(fun)
    if info is None:
        return fun, nums
    f = info.fun
    argnums = info.argnums
    anums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if info.has_aux:

        def first(*a: Any, **kw: Any) -> Any:
            return f(*a, **kw)[0]

        return first, anums
    return f, anums


def has_backward(closed: Any) -> bool:
    """Whether a traced program runs a backward pass of its own (a train step that calls
    ``jax.grad`` inside)."""
    seen: set[int] = set()

    def walk(jaxpr: Any) -> bool:
        if id(jaxpr) in seen:
            return False
        seen.add(id(jaxpr))
        for eqn in jaxpr.eqns:
            if _compat.is_backward(eqn, False):
                return True
            body = _compat.call_body(eqn)
            if body is not None and walk(getattr(body[0], "jaxpr", body[0])):
                return True
            for br in eqn.params.get("branches", ()) or ():
                if walk(getattr(br, "jaxpr", br)):
                    return True
            for nm in ("jaxpr", "body_jaxpr", "cond_jaxpr"):
                sub = eqn.params.get(nm)
                if sub is not None and hasattr(getattr(sub, "jaxpr", sub), "eqns"):
                    if walk(getattr(sub, "jaxpr", sub)):
                        return True
        return False

    return walk(closed.jaxpr)


CHAIN = "one-sided derivatives equal to AD's"
INNER_SMOOTH_NOTE = (
    "{n} kink(s) or tie(s) checked and left out: {fn} (it runs its own backward pass) is "
    "differentiable at the point along {k} random directions, both signs (its value moves "
    "continuously and AD's derivative just off the point agrees with AD's value at it, "
    "numerically), so the derivative taken of it is AD's"
)
INNER_NONSMOOTH_NOTE = {
    "jump": "{fn} (it runs its own backward pass) jumps at the point along a random direction: "
    "the derivative taken of it does not exist there, and AD's value is a convention",
    "kink": "{fn} (it runs its own backward pass) has one-sided derivatives at the point that "
    "differ from AD's along a random direction: the derivative taken of it is a convention",
}
SERIES_NOTE = (
    "kinks in series were checked with the others at JAX's choice only: the pass with every "
    "kink at its one-sided choice could not run on this program"
)
UNCHECKED_NOTE = (
    "{fn} runs its own backward pass: its kinks are listed without checking whether its "
    "gradient depends on them (its outputs may be a derivative of a gradient that jumps, as "
    "the Hessian of relu at 0, which is 0 along every direction: a check of the outputs "
    "cannot tell. Sanitize the loss, jax.grad of it, or the jax.hessian / jax.jacfwd / "
    "jax.jacrev of it, to check)"
)
CHECKED_NOTE = (
    "{n} kink(s) or tie(s) checked and left out: the gradient does not depend on the choice "
    "there ({why})"
)


def kink_report(
    fun: Callable,
    args: tuple,
    kwargs: dict,
    nums: tuple | None,
    directions: int,
    ignore: tuple,
) -> tuple[list[Finding], list[str]]:
    """The kink findings of one step at a detected tie, and the summary notes: a kink is a
    finding only when the gradient depends on it (:mod:`gradsan.jax._depends`)."""
    target, tnums = differentiated(fun, nums)
    closed, flat_args, ev = scan_kinks(target, args, kwargs)
    owner = leaf_owner(args, kwargs, fun)
    fname = getattr(fun, "__name__", "function")
    if has_backward(closed) or directions <= 0:
        want = {k.key for k in ev.kinks if not k.summarized and k.op in TIES}
        per_dir: list[dict] = []
        if want and directions > 0:
            dirs = random_directions(flat_args, owner, tnums, directions)
            per_dir = kink_tangents(closed, flat_args, want, dirs)
        notes = [UNCHECKED_NOTE.format(fn=fname)] if ev.kinks and directions > 0 else []
        found = kink_findings(ev, per_dir, ignore)
        if found and directions > 0 and target is not fun:
            # the function differentiated runs a backward pass (jax.hessian(f) differentiates
            # jax.jacrev(f)): its derivative is AD's where it is differentiable at the point
            tname = jacobian_name(target) or getattr(target, "__name__", "function")
            dirs = random_directions(flat_args, owner, tnums, directions)
            verdict = _depends.inner_smooth(closed, flat_args, dirs)
            if verdict == "smooth":
                n = len(found)
                return [], [INNER_SMOOTH_NOTE.format(n=n, fn=tname, k=directions)]
            if verdict in ("jump", "kink"):
                notes = [INNER_NONSMOOTH_NOTE[verdict].format(fn=tname)]
        return found, notes
    keep, counts = depending_kinks(closed, flat_args, ev, owner, tnums, directions, ignore)
    ev.kinks = keep
    found = kink_findings(ev, [], ignore, decided=True)
    notes = []
    n = sum(counts.values())
    if n:
        why = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        notes.append(CHECKED_NOTE.format(n=n, why=why))
    if ev.series_unchecked:
        notes.append(SERIES_NOTE)
    return found, notes


def _custom_of(k: Kink) -> tuple | None:
    return k.scope.custom_outer


def _tap_keys(kind: str, obj: Any) -> list:
    if kind == "custom":
        return [obj[0]]
    return [obj.key] + ([obj.skey] if obj.skey is not None else [])


def unit_deltas(kind: str, obj: Any, taps: dict, s: float) -> tuple[Any, list | None]:
    """(the key its probes are injected at, its one-sided deltas along ``s`` times the
    direction whose operand tangents are ``taps``); None deltas: not decided so."""
    if kind == "custom":
        key, ceqn, cin = obj
        t = taps.get(key)
        if t is None:
            return key, None
        try:
            return key, _depends.custom_delta(ceqn, [_np(v) for v in cin], [s * x for x in t])
        except Exception:  # a rule we cannot evaluate: the finding stays
            return key, None
    key = obj.key if obj.op != "where" else obj.skey
    t = taps.get(obj.key)
    st = taps.get(obj.skey) if obj.skey is not None else None
    if t is None or key is None:
        return key, None
    try:
        return key, _depends.one_sided(
            obj, [s * x for x in t], None if st is None else [s * x for x in st]
        )
    except Exception:  # an operand we cannot read: the finding stays
        return key, None


def depending_kinks(
    closed: Any,
    flat_args: list,
    ev: KinkEval,
    owner: list,
    nums: tuple | None,
    directions: int,
    ignore: tuple,
) -> tuple[list[Kink], dict[str, int]]:
    """The recorded kinks the gradient depends on, and how many places were left out, by
    reason."""
    cands = [
        k for k in ev.kinks if not k.summarized and k.entry_id not in ignore and k.op not in ignore
    ]
    if not cands:
        return [], {}
    # one candidate per evaluation; the kinks inside a custom rule's primal share their call
    units: list[tuple] = []  # (kind, key, kinks)
    index: dict[tuple, int] = {}
    for k in cands:
        co = _custom_of(k)
        uk = ("custom", co[0]) if co is not None else ("kink", k.key, id(k))
        if uk not in index:
            index[uk] = len(units)
            units.append((uk[0], co if co is not None else k, []))
        units[index[uk]][2].append(k)
    want: set = set()
    for kind, obj, _ in units:
        if kind == "custom":
            want.add(obj[0])
        else:
            want.add(obj.key)
            if obj.skey is not None:
                want.add(obj.skey)
    dirs = random_directions(flat_args, owner, nums, directions)
    per_dir = kink_tangents(closed, flat_args, want, dirs)
    probes: list[_depends.Probe] = []
    subs: dict[tuple[int, int], list] = {}  # (candidate, combo) -> [(key, output, value)]
    undecided: set[int] = set()
    for c, (kind, obj, _) in enumerate(units):
        for j, taps in enumerate(per_dir):
            for s in (1.0, -1.0):
                combo = 2 * j + (0 if s > 0 else 1)
                key, res = unit_deltas(kind, obj, taps, s)
                if res is None:
                    undecided.add(c)
                    continue
                for item in res:
                    if len(item) > 2 and item[2] == _depends.SUB:
                        subs.setdefault((c, combo), []).append((key, item[0], item[1]))
                        continue
                    out_i, delta = item[0], np.asarray(item[1], np.float64)
                    jump = len(item) > 2 and bool(item[2])
                    probes.append(_depends.Probe(c, combo, key, out_i, delta, jump))
    live = [p for p in probes if p.cand not in undecided and np.any(p.delta != 0)]
    live_ids = {id(p) for p in live}
    sides: list[frozenset] = [frozenset()] * len(flat_args)
    marks: dict[tuple, frozenset] = {}
    for p in probes:
        marks[p.key] = marks.get(p.key, frozenset()) | {p.cand}
    for (c, _), items in subs.items():
        for key, _, _ in items:
            marks[key] = marks.get(key, frozenset()) | {c}
    reach: list[frozenset] = []
    seen: list[dict] = []  # key -> the candidates reaching its operands

    def run(table: dict, eps: Any) -> Any:
        inj = Injector(table, eps, marks)
        inj.watch = want
        outs, osides = inj.run_closed(closed, flat_args, sides)
        if not reach:
            reach.append(frozenset().union(*[x for o, x in zip(outs, osides) if is_float(o)]))
            seen.append(inj.inputs)
        return outs

    jac = _depends.images(closed, flat_args, live, run) if live else np.zeros((0, 0))
    allp = live + [p for p in probes if id(p) not in live_ids]
    full = np.zeros((jac.shape[0], 2 * len(allp)))
    full[:, : jac.shape[1]] = jac
    if len(units) > 1 and dirs:  # kinks in series: again with the others at one-sided choices
        from . import _series

        if not reach:
            run({}, jnp.zeros((0,), jnp.float32))
        if _series.in_series(units, seen[0] if seen else {}, _tap_keys):
            try:
                sp, sj = _series.probes(closed, flat_args, units, undecided, dirs, want, marks)
            except Exception:  # a program the one-sided pass cannot take: said in one line
                sp, sj = [], np.zeros((0, 0))
                ev.series_unchecked = True
            if sp:
                if full.shape[0] != sj.shape[0]:
                    full = np.zeros((sj.shape[0], full.shape[1]))
                full = np.concatenate([full, sj], axis=1)
                allp = allp + sp
    verdicts = _depends.verdicts(full, allp, len(units), undecided)
    # a jump times a value that vanishes at the point (sign(x) * x) is a kink its value image
    # does not show; kinks undone together (ELU's two selects) show in no one-sided derivative
    jumps = {p.cand for p in allp if p.jump and np.any(p.delta != 0)}
    silent = [c for c, v in enumerate(verdicts) if not v.depends and v.reason != "same function"]
    decided = [c for c, v in enumerate(verdicts) if v.depends and v.reason != "undecided"]
    if decided or jumps & set(silent):
        steps = _depends.stepped(closed, flat_args, dirs)
        if decided and _depends.coupled(full, allp, verdicts, steps):
            for c in decided:
                verdicts[c] = _depends.Verdict(False, CHAIN)
        elif _depends.disagrees(steps):
            if not reach:  # nothing was injected: the paths, from one plain pass
                run({}, jnp.zeros((0,), jnp.float32))
            gone = set(silent) - set(reach[0] if reach else ())  # no gradient path to an output
            back = [c for c in silent if c in jumps and c not in gone] or (
                [] if decided else [c for c in silent if c not in gone]
            )
            for c in back:
                verdicts[c] = _depends.Verdict(True, "one-sided derivative differs")
    if subs:
        if not reach:  # the paths to the outputs, from one plain pass
            run({}, jnp.zeros((0,), jnp.float32))
        # the value of a substituted index matters only along a path a gradient takes
        flows, fsides = Injector({}, None, marks, gradient_only=True).run_closed(
            closed, flat_args, sides
        )
        greach = frozenset().union(*[x for o, x in zip(flows, fsides) if is_float(o)])
        moved = substituted(
            closed, flat_args, dirs, subs, marks, reach[0] if reach else None, greach
        )
        for c in {c for c, _ in subs} - undecided:
            if c in moved:
                verdicts[c] = _depends.Verdict(True)
            elif verdicts[c].reason == "same function" and not any(
                p.cand == c and np.any(p.delta != 0) for p in allp
            ):
                verdicts[c] = _depends.Verdict(False, "no effect on the output")
    keep: list[Kink] = []
    counts: dict[str, int] = {}
    for (_, _, ks), v in zip(units, verdicts):
        if v.depends:
            keep.extend(ks)
        else:
            counts[v.reason] = counts.get(v.reason, 0) + 1
    return keep, counts


def substituted(
    closed: Any,
    flat_args: list,
    dirs: list[list],
    subs: dict,
    marks: dict,
    reach: Any,
    greach: Any = None,
) -> set[int]:
    """The candidates whose integer output (an argmax, a tied sort's indices, a float -> int
    cast at a jump), replaced by its one-sided value, changes the outputs' tangent along that
    direction, or their value along a path a gradient takes."""
    sides: list[frozenset] = [frozenset()] * len(flat_args)

    def along(j: int, sign: float, replace: dict) -> tuple[np.ndarray, np.ndarray]:
        idx = [i for i, t in enumerate(dirs[j]) if t is not None]

        def f(*dyn: Any) -> Any:
            full = list(flat_args)
            for i, d in zip(idx, dyn):
                full[i] = d
            outs, _ = Injector({}, None, marks, replace).run_closed(closed, full, sides)
            flat = [jnp.ravel(o).astype(jnp.float32) for o in outs if is_float(o)]
            return jnp.concatenate(flat) if flat else jnp.zeros((0,), jnp.float32)

        prim = [flat_args[i] for i in idx]
        tans = [sign * jnp.asarray(dirs[j][i]) for i in idx]
        v, t = jax.jvp(f, prim, tans)
        return np.asarray(v, np.float64), np.asarray(t, np.float64)

    base: dict[tuple[int, float], tuple] = {}
    moved: set[int] = set()
    for (c, combo), items in subs.items():
        if c in moved:
            continue
        j, sign = combo // 2, (1.0 if combo % 2 == 0 else -1.0)
        if (j, sign) not in base:
            base[(j, sign)] = along(j, sign, {})
        v0, t0 = base[(j, sign)]
        replace: dict = {}
        for key, out_i, val in items:
            replace.setdefault(key, []).append((out_i, val))
        try:
            v1, t1 = along(j, sign, replace)
        except Exception:  # a substitute the program cannot take: the finding stays
            moved.add(c)
            continue
        scale = float(np.max(np.abs(t0))) if t0.size else 0.0
        dt = float(np.max(np.abs(t1 - t0))) if t0.size else 0.0
        dv = float(np.max(np.abs(v1 - v0))) if v0.size else 0.0
        vscale = float(np.max(np.abs(v0))) if v0.size else 0.0
        if reach is not None and c not in reach:
            continue  # no path to an output but through stop_gradient (a straight-through cast)
        if not np.isfinite(dt) or dt > 1e3 * _depends._EPS * max(scale, 1e-30):
            moved.add(c)  # the gradient itself changes with the choice
        elif greach is not None and c not in greach:
            continue  # its value reaches the outputs only through integers (no gradient flows)
        elif dv > 1e3 * _depends._EPS * max(vscale, 1.0):
            moved.add(c)
    return moved


# -- the transformation ---------------------------------------------------------------------


def scan_kinks(fun: Callable, args: tuple, kwargs: dict):
    closed, flat_args, _ = trace(fun, args, kwargs)
    ev = KinkEval()
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

    screener = Screener(fun)

    @functools.wraps(fun)
    def sanitized(*args: Any, **kwargs: Any) -> Report:
        check_not_traced(jax.tree_util.tree_leaves((args, kwargs)), "sanitize")
        # G0: the outputs are the user's own call; the screen only counts kinks
        outputs = fun(*args, **kwargs)
        check_concrete_outputs(outputs, "sanitize")
        kinks = None
        if screen_ok(fun, args, kwargs):
            try:
                kinks = screener.count(args, kwargs)
            except Exception:  # anything the screen cannot trace: the full evaluation says why
                kinks = None
        if kinks is not None and host_flag(outputs):
            report = Report(
                outputs=outputs, function=getattr(fun, "__name__", "function"), backend="jax"
            )
            if not kinks:
                return report
        else:
            report = diagnose(fun, args, kwargs, who="sanitize", outputs=outputs)
        ign = set(ignore)
        report.findings = [
            f for f in report.findings if f.catalog_id not in ign and f.primitive not in ign
        ]
        if kinks == 0:  # the screen counted nothing: no kink walk needed
            return report
        found, notes = kink_report(fun, args, kwargs, nums, directions, tuple(ign))
        report.findings.extend(found)
        report.notes.extend(notes)
        return _fix.verify_kinks(report, fun, args, kwargs, "jax")  # fix: Clarke-set check

    return sanitized
