"""One jaxpr interpreter: evaluates equation by equation, recording where non-finite values are
born and how they flow, and recursing into jit, custom_jvp/vjp, remat, scan, while and cond.

Every value in the environment carries a ``Src``: the ``Node`` (one equation evaluation) that
produced it and the output index. Nodes keep references to their inputs' Srcs, never arrays, so
the dataflow can be walked back after the fact while dead arrays are freed as in
``jax.core.eval_jaxpr``. Arrays are kept only at the rare nodes where a non-finite value was
born (origins) or where an inf became a NaN (poisons).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from .._catalog._classify import classify
from .._report import Frame
from . import _numpy, _rules
from ._source import Place, place

FINITE, INF, NAN = 0, 1, 2


@dataclasses.dataclass(eq=False)
class Scope:
    """Where a nested jaxpr runs: its path, the enclosing user frame, and loop context."""

    path: str = ""
    frame: Frame | None = None
    library: str | None = None
    context: str = ""
    backward: bool = False
    id: int = 0


@dataclasses.dataclass(eq=False)
class Node:
    """One evaluation of one equation (or an input, a constant, a stacked scan output)."""

    kind: str  # "eqn", "input", "const", "stack"
    eqn: Any = None
    scope: Scope | None = None
    ins: tuple = ()  # Src per input (None for finite literals)
    status: tuple = ()  # per output: FINITE / INF / NAN
    seq: int = 0
    place: Place | None = None
    hit: Any = None  # catalog Hit summary when this primal op ran at a singular point
    operands: list | None = None  # numpy operands, kept at origins and poisons only
    outs: list | None = None  # numpy outputs, same
    first_bad: tuple | None = None  # per output 0: first non-finite index
    label: str = ""  # input path / constant description

    @property
    def prim(self) -> str:
        return self.eqn.primitive.name if self.eqn is not None else self.kind

    @property
    def user_frame(self) -> Frame | None:
        if self.place is not None and self.place.user is not None:
            return self.place.user
        return self.scope.frame if self.scope is not None else None

    @property
    def library(self) -> str | None:
        lib = self.place.library if self.place is not None else None
        return (self.scope.library if self.scope is not None else None) or lib


Src = tuple  # (Node, output index)


@dataclasses.dataclass
class HitSummary:
    entry_id: str
    count: int
    size: int
    index: tuple
    got: str


def _status(x: Any) -> int:
    dt = getattr(x, "dtype", None)
    if dt is None or not jax.numpy.issubdtype(dt, jax.numpy.inexact):
        return FINITE
    a = np.asarray(x)
    if a.dtype.kind not in "fc":
        a = a.astype(np.float32)
    with np.errstate(all="ignore"):
        if np.isfinite(a).all():
            return FINITE
        return NAN if np.isnan(a).any() else INF


def _first_bad(x: Any) -> tuple:
    a = np.asarray(x)
    if a.dtype.kind not in "fc":
        a = a.astype(np.float32)
    idx = np.argwhere(~np.isfinite(a))
    return tuple(int(i) for i in idx[0]) if len(idx) else ()


def bind_eqn(eqn, invals: list, params: dict | None = None) -> list:
    """Evaluate one equation on concrete (or traced) values; always a list of outputs.
    Shared by every gradsan pass over a jaxpr."""
    p = params if params is not None else eqn.primitive.get_bind_params(eqn.params)
    if isinstance(p, tuple):  # older jax: (subfuns, params)
        subfuns, p = p
        out = eqn.primitive.bind(*subfuns, *invals, **p)
    else:
        out = eqn.primitive.bind(*invals, **p)
    return list(out) if eqn.primitive.multiple_results else [out]


def _np(x: Any) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind == "V" or str(a.dtype) == "bfloat16":
        a = a.astype(np.float32)
    return a


_LAST_USE: dict[int, list] = {}


def _last_use(jaxpr: jcore.Jaxpr) -> list[list]:
    key = id(jaxpr)
    cached = _LAST_USE.get(key)
    if cached is not None and cached[0] is jaxpr:
        return cached[1]
    last: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, jcore.Literal):
                last[v] = i
    for v in jaxpr.outvars:
        if not isinstance(v, jcore.Literal):
            last[v] = len(jaxpr.eqns)
    free: list[list] = [[] for _ in jaxpr.eqns]
    for v, i in last.items():
        if i < len(jaxpr.eqns):
            free[i].append(v)
    _LAST_USE[key] = [jaxpr, free]
    return free


def group_key(scope: Scope, pl: Place) -> tuple:
    """Equations of one primal operation and of its derivative rule share this key, also across
    the forward and transposed copies of a jit, scan iteration or cond branch."""
    f = scope.frame
    return (scope.path, (f.file, f.line, f.column) if f is not None else None, pl.key)


class Interpreter:
    """Evaluates a ClosedJaxpr and records the dataflow of non-finite values."""

    def __init__(self, check_hits: bool = True, fast: bool = True):
        self.check_hits = check_hits
        self.fast = fast  # exactly rounded primitives through numpy (same bits, no dispatch)
        self._seq = itertools.count()
        self._scope_ids = itertools.count(1)
        # (scope id, place key) -> nodes of primal ops that hit a catalog singular set
        self.hits_by_key: dict[tuple, list[Node]] = {}
        # group key -> seq of its first equation: the primal op comes before its derivative's
        self.group_first: dict[tuple, int] = {}
        self._last_key: tuple | None = None
        self._run = 0

    # -- entry point -------------------------------------------------------------------------
    def run_closed(self, closed: jcore.ClosedJaxpr, args: list, arg_labels: list[str]):
        top = Scope(id=0)
        in_srcs = []
        for a, label in zip(args, arg_labels):
            st = _status(a)
            if st != FINITE:
                n = Node("input", scope=top, status=(st,), seq=next(self._seq), label=label)
                n.outs = [_np(a)]
                n.first_bad = _first_bad(a)
                in_srcs.append((n, 0))
            else:
                in_srcs.append(None)
        const_srcs = [
            self._const_src(c, "a constant captured by the function") for c in closed.consts
        ]
        return self.run(closed.jaxpr, list(closed.consts), const_srcs, list(args), in_srcs, top)

    def _const_src(self, value: Any, label: str) -> Src | None:
        st = _status(value)
        if st == FINITE:
            return None
        n = Node("const", status=(st,), seq=next(self._seq), label=label)
        n.outs = [_np(value)]
        n.first_bad = _first_bad(value)
        return (n, 0)

    # -- the loop ----------------------------------------------------------------------------
    def run(self, jaxpr, consts, const_srcs, args, arg_srcs, scope: Scope):
        env: dict = {}
        srcs: dict = {}
        for v, c, s in zip(jaxpr.constvars, consts, const_srcs):
            env[v] = c
            srcs[v] = s
        for v, a, s in zip(jaxpr.invars, args, arg_srcs):
            env[v] = a
            srcs[v] = s
        free = _last_use(jaxpr)
        self._last_key = None

        def read(vs) -> tuple[list, list]:
            vals = [v.val if isinstance(v, jcore.Literal) else env[v] for v in vs]
            vsrcs = [
                self._const_src(v.val, f"the literal {v.val}")
                if isinstance(v, jcore.Literal)
                else srcs.get(v)
                for v in vs
            ]
            return vals, vsrcs

        for i, eqn in enumerate(jaxpr.eqns):
            outvals, outsrcs = self.eqn(eqn, *read(eqn.invars), scope)
            for v, val, s in zip(eqn.outvars, outvals, outsrcs):
                if isinstance(v, jcore.DropVar):
                    continue
                env[v] = val
                srcs[v] = s
            for v in free[i]:
                env.pop(v, None)
                srcs.pop(v, None)
        return read(jaxpr.outvars)

    # -- one equation ------------------------------------------------------------------------
    def eqn(self, eqn, invals, insrcs, scope: Scope):
        rule = _HIGHER_ORDER.get(eqn.primitive.name)
        if rule is not None:
            return rule(self, eqn, invals, insrcs, scope)
        return self.first_order(eqn, invals, insrcs, scope)

    def first_order(self, eqn, invals, insrcs, scope: Scope, outvals=None):
        if outvals is None:
            outvals = _numpy.evaluate(eqn, invals) if self.fast else None
            if outvals is None:
                outvals = bind_eqn(eqn, invals)
        status = tuple(_status(o) for o in outvals)
        pl = place(eqn.source_info)
        node = Node(
            "eqn",
            eqn=eqn,
            scope=scope,
            ins=tuple(insrcs),
            status=status,
            seq=next(self._seq),
            place=pl,
        )
        name_stack = str(eqn.source_info.name_stack)
        backward = scope.backward or "transpose" in name_stack
        if "rematted_computation" in name_stack:
            backward = False
        node.backward = backward  # type: ignore[attr-defined]
        gk = group_key(scope, pl)
        self.group_first.setdefault(gk, node.seq)
        # a run: consecutive equations at one source position (a primal op, then its jvp rule)
        if gk != self._last_key:
            self._run = next(self._seq)
            self._last_key = gk
        node.run = self._run  # type: ignore[attr-defined]
        if any(status):
            in_bad = [s is not None and s[0].status[s[1]] != FINITE for s in insrcs]
            in_nan = [s is not None and s[0].status[s[1]] == NAN for s in insrcs]
            node.first_bad = _first_bad(outvals[status.index(max(status))])
            if not any(in_bad) or (NAN in status and not any(in_nan)):
                node.operands = [_np(v) for v in invals]
                node.outs = [_np(o) for o in outvals]
        if self.check_hits and not backward:
            op = _rules.canonical_op(eqn.primitive.name)
            if op is not None:
                hit = classify(
                    op,
                    [_np(v) for v in invals],
                    None,
                    _rules.params_for(eqn.primitive.name, eqn.params),
                )
                if hit is not None:
                    node.hit = HitSummary(
                        hit.entry_id, hit.count, int(hit.mask.size), hit.first_index, hit.got
                    )
                    self.hits_by_key.setdefault(group_key(scope, pl), []).append(node)
        return outvals, [(node, i) for i in range(len(outvals))]

    # -- helpers for higher-order rules ------------------------------------------------------
    def sub_scope(self, eqn, scope: Scope, what: str, context: str | None = None) -> Scope:
        pl = place(eqn.source_info)
        frame = pl.user if pl.user is not None else scope.frame
        name_stack = str(eqn.source_info.name_stack)
        return Scope(
            path=f"{scope.path}/{what}" if scope.path else what,
            frame=frame,
            library=scope.library or (pl.library if pl.user is None else None),
            context=context if context is not None else scope.context,
            backward=scope.backward or "transpose" in name_stack,
            id=next(self._scope_ids),
        )


# -- higher-order primitives ------------------------------------------------------------------

_HIGHER_ORDER: dict = {}


def _closed(j):
    if isinstance(j, jcore.ClosedJaxpr):
        return j.jaxpr, list(j.consts)
    return j, []


def _call_rule(param: str):
    def rule(interp: Interpreter, eqn, invals, insrcs, scope):
        jaxpr, consts = _closed(eqn.params[param])
        name = eqn.params.get("name", eqn.primitive.name)
        sub = interp.sub_scope(eqn, scope, f"{eqn.primitive.name}[{name}]")
        if sub.library is None and _is_library_body(jaxpr):
            sub.library = _library_name(jaxpr, name)
        csrcs = [interp._const_src(c, "a constant") for c in consts]
        return interp.run(jaxpr, consts, csrcs, invals, insrcs, sub)

    return rule


def _is_library_body(jaxpr) -> bool:
    """True when no equation of the body has a user frame (a jnp library jit)."""
    for eqn in jaxpr.eqns[:8]:
        if place(eqn.source_info).user is not None:
            return False
    return bool(jaxpr.eqns)


def _library_name(jaxpr, name: str) -> str | None:
    for eqn in jaxpr.eqns:
        lib = place(eqn.source_info).library
        if lib is not None:
            prefix = lib.rsplit(".", 1)[0] if "." in lib else lib
            return f"{prefix}.{name.lstrip('_')}"
    return None


for _p, _param in (
    ("pjit", "jaxpr"),
    ("jit", "jaxpr"),
    ("closed_call", "call_jaxpr"),
    ("core_call", "call_jaxpr"),
    ("remat2", "jaxpr"),
    ("checkpoint", "jaxpr"),
    ("custom_jvp_call", "call_jaxpr"),
    ("custom_vjp_call", "call_jaxpr"),
    ("custom_vjp_call_jaxpr", "fun_jaxpr"),
    ("custom_lin", None),
):
    if _param is not None:
        _HIGHER_ORDER[_p] = _call_rule(_param)


def _cond_rule(interp: Interpreter, eqn, invals, insrcs, scope):
    branches = eqn.params["branches"]
    idx = int(np.clip(int(np.asarray(invals[0])), 0, len(branches) - 1))
    jaxpr, consts = _closed(branches[idx])
    ctx = f"cond branch {idx}"
    if scope.context:
        ctx = f"{scope.context}, {ctx}"
    sub = interp.sub_scope(eqn, scope, f"cond[{idx}]", ctx)
    csrcs = [interp._const_src(c, "a constant") for c in consts]
    return interp.run(jaxpr, consts, csrcs, invals[1:], insrcs[1:], sub)


_HIGHER_ORDER["cond"] = _cond_rule


def _stack_src(interp: Interpreter, srcs: list, scope: Scope) -> Src | None:
    if all(s is None for s in srcs):
        return None
    st = (max((s[0].status[s[1]] if s is not None else FINITE) for s in srcs),)
    n = Node("stack", scope=scope, ins=tuple(srcs), status=st, seq=next(interp._seq))
    return (n, 0)


def _scan_rule(interp: Interpreter, eqn, invals, insrcs, scope):
    p = eqn.params
    jaxpr, jconsts = _closed(p["jaxpr"])
    n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
    reverse = p.get("reverse", False)
    consts, carry, xs = (
        invals[:n_consts],
        invals[n_consts : n_consts + n_carry],
        invals[n_consts + n_carry :],
    )
    c_srcs, carry_srcs, xs_srcs = (
        insrcs[:n_consts],
        insrcs[n_consts : n_consts + n_carry],
        insrcs[n_consts + n_carry :],
    )
    jcsrcs = [interp._const_src(c, "a constant") for c in jconsts]
    ys_vals: list[list] = []
    ys_srcs: list[list] = []
    carry = list(carry)
    carry_srcs = list(carry_srcs)
    for k in range(length):
        i = length - 1 - k if reverse else k
        ctx = f"scan iteration {i} (of {length})"
        if scope.context:
            ctx = f"{scope.context}, {ctx}"
        sub = interp.sub_scope(eqn, scope, f"scan[{i}]", ctx)
        x_i = [x[i] for x in xs]
        outs, osrcs = interp.run(
            jaxpr, jconsts, jcsrcs, [*consts, *carry, *x_i], [*c_srcs, *carry_srcs, *xs_srcs], sub
        )
        carry, carry_srcs = list(outs[:n_carry]), list(osrcs[:n_carry])
        ys_vals.append(outs[n_carry:])
        ys_srcs.append(osrcs[n_carry:])
    n_ys = len(jaxpr.outvars) - n_carry
    if reverse:
        ys_vals.reverse()
        ys_srcs.reverse()
    ys = []
    y_srcs = []
    for j in range(n_ys):
        aval = eqn.outvars[n_carry + j].aval
        if length:
            ys.append(jax.numpy.stack([y[j] for y in ys_vals]))
        else:
            ys.append(jax.numpy.zeros(aval.shape, aval.dtype))
        y_srcs.append(_stack_src(interp, [y[j] for y in ys_srcs], scope))
    return [*carry, *ys], [*carry_srcs, *y_srcs]


_HIGHER_ORDER["scan"] = _scan_rule


def _while_rule(interp: Interpreter, eqn, invals, insrcs, scope):
    p = eqn.params
    cj, cconsts_j = _closed(p["cond_jaxpr"])
    bj, bconsts_j = _closed(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = invals[:nc], invals[nc : nc + nb], list(invals[nc + nb :])
    csrc, bsrc, carry_srcs = insrcs[:nc], insrcs[nc : nc + nb], list(insrcs[nc + nb :])
    none_c = [None] * len(cconsts_j)
    none_b = [None] * len(bconsts_j)
    k = 0
    while True:
        sub = interp.sub_scope(eqn, scope, f"while[{k}]", "")
        pred, _ = interp.run(cj, cconsts_j, none_c, [*cconsts, *carry], [*csrc, *carry_srcs], sub)
        if not bool(np.asarray(pred[0])):
            break
        ctx = f"while iteration {k}"
        if scope.context:
            ctx = f"{scope.context}, {ctx}"
        sub = interp.sub_scope(eqn, scope, f"while[{k}]", ctx)
        carry, carry_srcs = interp.run(
            bj, bconsts_j, none_b, [*bconsts, *carry], [*bsrc, *carry_srcs], sub
        )
        k += 1
    return carry, carry_srcs


_HIGHER_ORDER["while"] = _while_rule


def _opaque_rule(interp: Interpreter, eqn, invals, insrcs, scope):
    """shard_map and friends: run as one operation, attributed to the body's first user line."""
    outvals, outsrcs = interp.first_order(eqn, invals, insrcs, scope)
    node = outsrcs[0][0] if outsrcs else None
    body = eqn.params.get("jaxpr")
    if node is not None and body is not None:
        # the body's first user line, preferring one whose operation is in the catalog
        jaxpr = body.jaxpr if isinstance(body, jcore.ClosedJaxpr) else body
        first = None
        for e in jaxpr.eqns:
            pl = place(e.source_info)
            if pl.user is None:
                continue
            first = first or (pl.user, e.primitive.name)
            if _rules.canonical_op(e.primitive.name) is not None:
                first = (pl.user, e.primitive.name)
                break
        if first is not None:
            node.body_frame, node.body_prim = first  # type: ignore[attr-defined]
    return outvals, outsrcs


_HIGHER_ORDER["shard_map"] = _opaque_rule
