"""gradsan.jax.explain: interpret the program, blame along the dataflow, build the Report."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .. import _catalog, _fix
from .._blame import Blame
from .._catalog._classify import classify
from .._events import Because, Note, Origin, Poison, ZeroKind
from .._report import Finding, Frame, OutputHit, Report
from .._report._build import build
from .._report._format import format_value
from . import _compat, _frameworks, _numpy, _rules
from ._call import (
    arg_labels,
    check_args,
    check_callable,
    effects_notes,
    flatten_call,
    output_labels,
    trace_call,
)
from ._source import Place, custom_vjp_rule_frame, exclude_gradsan, place
from ._zero import nan_meeting, record_zeros, zero_mask, zero_source
from .interpreter import UNROLL, Interpreter, Scope, to_numpy
from .interpreter._devices import enter_shard_map, holder
from .interpreter._unroll import scan_bad_iterations, scan_carry_at, scan_rule

exclude_gradsan()


# -- the provenance sidecar -----------------------------------------------------------------------
#
# Every value carries a ``Src``: the ``Node`` (one equation evaluation) that produced it and the
# output index, or None for a finite value with no history worth keeping. Nodes keep references
# to their inputs' Srcs, never arrays, so the dataflow can be walked back after the fact while
# dead arrays are freed. Arrays are kept only at the rare nodes where a non-finite value was
# born (origins) or where an inf became a NaN (poisons).

FINITE, INF, NAN = 0, 1, 2


@dataclasses.dataclass(eq=False)
class Node:
    """One evaluation of one equation (or an input, a constant, a stacked scan output)."""

    kind: str  # "eqn", "input", "const", "stack"
    eqn: Any = None
    scope: Scope | None = None
    ins: tuple = ()  # Src per input (None for finite values)
    status: tuple = ()  # per output: FINITE / INF / NAN
    seq: int = 0
    place: Place | None = None
    hit: Any = None  # catalog Hit summary when this primal op ran at a singular point
    operands: list | None = None  # numpy operands, kept at origins and poisons only
    outs: list | None = None  # numpy outputs, same
    first_bad: tuple | None = None  # per output 0: first non-finite index
    label: str = ""  # input path / constant description
    backward: bool = False
    run: int = 0  # consecutive equations at one source position share it
    body_frame: Frame | None = None  # shard_map: the body's first user line
    body_prim: str = ""
    # the zero's side (jax/_zero.py): where an output holds exact zeros, the zero masks of the
    # outputs and inputs, and select_n's chosen case
    zout: tuple | None = None
    zin: tuple | None = None
    choice: Any = None

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
    shape: tuple = ()


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


def group_key(scope: Scope, pl: Place) -> tuple:
    """Equations of one primal operation and of its derivative rule share this key, also across
    the forward and transposed copies of a jit, scan iteration or cond branch."""
    f = scope.frame
    return (scope.path, (f.file, f.line, f.column) if f is not None else None, pl.key)


def _shard_map_rule(
    interp: Provenance, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    """shard_map (and pmap): the body per device where it can be entered; else one operation,
    attributed to the body's first user line."""
    entered = enter_shard_map(interp, eqn, invals, insides, scope, key)
    if entered is not None:
        return entered
    outvals, outsides = interp.first_order(eqn, invals, insides, scope, key)
    node = outsides[0][0] if outsides else None
    body = eqn.params.get("jaxpr")
    if node is not None and body is not None:
        # the body's first user line, preferring one whose operation is in the catalog
        jaxpr, _ = _compat.closed(body)
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
            node.body_frame, node.body_prim = first
    return outvals, outsides


# A scan longer than this whose inputs are finite is not interpreted iteration by iteration:
# it runs compiled, and only its first iteration that makes a non-finite value is interpreted.
LAZY_SCAN = 64
LAZY_SPAN = 512  # at most this many iterations interpreted from the first non-finite one


def _scan_rule(
    interp: Provenance, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
) -> tuple[list, list]:
    """A long scan over finite inputs: run compiled; when an output is non-finite, find the
    first iteration that made one and the first that made a NaN (a compiled per-iteration
    flag), rebuild the carry from the compiled prefix and interpret those iterations only (at
    most :data:`LAZY_SPAN`). A finite scan is remembered, so the same iterations of it can be
    replayed when a later scan in the same scope (its transpose in the backward pass) needs to
    know which forward operation hit a singular point."""
    p = eqn.params
    length, reverse = p["length"], p.get("reverse", False)
    nc, nk = p["num_consts"], p["num_carry"]
    # only the scanned-over inputs may be non-finite (a stacked residual of the forward scan)
    if length <= LAZY_SCAN or any(_stat(s) != FINITE for s in insides[: nc + nk]):
        return scan_rule(interp, eqn, invals, insides, scope, key)
    outs = _compat.bind(eqn, invals)
    if all(_status(o) == FINITE for o in outs) and all(_stat(s) == FINITE for s in insides):
        interp.finite_scans.setdefault(scope.path, []).append((eqn, list(invals), scope, key))
        return outs, [None] * len(outs)
    bad, nan = (np.flatnonzero(f) for f in scan_bad_iterations(eqn, invals))
    if not bad.size:  # non-finite only through rounding differences of the compiled flag
        return scan_rule(interp, eqn, invals, insides, scope, key)
    # iterations in execution order (reverse scans run from the end)
    first = int(bad.max() if reverse else bad.min())
    # up to the last NaN: where the NaN is made, interpreted, may differ from the compiled flag
    later_nan = nan[nan <= first] if reverse else nan[nan >= first]
    last = first
    if later_nan.size:
        last = int(later_nan.min() if reverse else later_nan.max())
    step = -1 if reverse else 1
    span = list(range(first, last + step, step))[:LAZY_SPAN]
    for f_eqn, f_invals, f_scope, f_key in interp.finite_scans.get(scope.path, []):
        if f_eqn.params["length"] == length:
            interp.scan_iterations(f_eqn, f_invals, None, f_scope, f_key, span, None)
    want_nan = [_status(o) == NAN for o in outs] if later_nan.size else None
    osides = interp.scan_iterations(eqn, invals, insides, scope, key, span, want_nan)
    return outs, osides


class Provenance(Interpreter):
    """Evaluates a ClosedJaxpr and records the dataflow of non-finite values."""

    rules = {**UNROLL, _compat.scan_p: _scan_rule}
    if _compat.shard_map_p is not None:
        rules[_compat.shard_map_p] = _shard_map_rule

    def __init__(self, check_hits: bool = True, fast: bool = True):
        super().__init__()
        self.check_hits = check_hits
        self.fast = fast  # exactly rounded primitives through numpy (same bits, no dispatch)
        self._seq = itertools.count()
        # (scope id, place key) -> nodes of primal ops that hit a catalog singular set
        self.hits_by_key: dict[tuple, list[Node]] = {}
        # group key -> seq of its first equation: the primal op comes before its derivative's
        self.group_first: dict[tuple, int] = {}
        self.arguments: list = []  # the flat arguments (their shardings name devices)
        # scope path -> long scans that ran compiled and stayed finite (see _scan_rule)
        self.finite_scans: dict[str, list] = {}
        # per scope: the group key of its last equation, and the run it belongs to (scopes of
        # the devices of a shard_map interleave, so runs are tracked per scope)
        self._last: dict[int, tuple[tuple, int]] = {}

    def explain_closed(self, closed: Any, args: list, arg_labels: list[str]) -> tuple[list, list]:
        self.arguments = list(args)
        top = Scope()
        in_srcs: list[Src | None] = []
        for a, label in zip(args, arg_labels):
            st = _status(a)
            if st != FINITE:
                n = Node("input", scope=top, status=(st,), seq=next(self._seq), label=label)
                n.outs = [to_numpy(a)]
                n.first_bad = _first_bad(a)
                in_srcs.append((n, 0))
            else:  # a finite input: a node all the same, so a zero can be traced to it
                n = Node("input", scope=top, status=(st,), seq=next(self._seq), label=label)
                n.zout = (zero_mask(a),)
                in_srcs.append((n, 0))
        return self.run_closed(closed, args, in_srcs, top)

    def scan_iterations(
        self,
        eqn: Any,
        invals: list,
        insides: list | None,
        scope: Scope,
        key: tuple,
        span: list,
        want_nan: list[bool] | None,
    ) -> list:
        """Interpret the iterations ``span`` (consecutive, in execution order) of a scan alone,
        the carry entering the first from the compiled prefix; with ``want_nan`` (per output,
        whether the compiled result holds a NaN), stopping once every such output's sidecar
        has met its NaN. The sidecars of the scan's outputs (the last
        carry, each stacked output from these iterations)."""
        p = eqn.params
        jaxpr, jconsts = _compat.closed(p["jaxpr"])
        nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
        carry = scan_carry_at(eqn, invals, span[0])
        c_sides = list(insides[:nc]) if insides is not None else [None] * nc
        x_sides = (
            list(insides[nc + nk :]) if insides is not None else [None] * len(invals[nc + nk :])
        )
        k_sides: list = [None] * nk
        csides = [self.const_side(c, "a constant") for c in jconsts]
        per_iter: dict[int, list] = {}
        for i in span:
            sub = self.sub_scope(
                eqn,
                scope,
                (*key, i),
                f"scan[{i}]",
                self.in_context(scope, f"scan iteration {i} (of {length})"),
            )
            xs = [np.asarray(x)[i] for x in invals[nc + nk :]]
            outs, osides = self.run(
                jaxpr,
                jconsts,
                csides,
                [*invals[:nc], *carry, *xs],
                [*c_sides, *k_sides, *x_sides],
                sub,
            )
            carry, k_sides = list(outs[:nk]), list(osides[:nk])
            per_iter[i] = osides[nk:]
            if want_nan is not None:
                nan_ys = [
                    any(_stat(o[j]) == NAN for o in per_iter.values())
                    for j in range(len(osides) - nk)
                ]
                seen = [_stat(o) == NAN for o in k_sides] + nan_ys
                if all(s or not w for s, w in zip(seen, want_nan)):
                    break
        order = sorted(per_iter)
        ys = [
            self.stack_side([per_iter[i][j] for i in order], scope)
            for j in range(len(jaxpr.outvars) - nk)
        ]
        return [*k_sides, *ys]

    def const_side(self, value: Any, label: str) -> Src | None:
        st = _status(value)
        if st == FINITE:
            z = zero_mask(value)
            if z is None:
                return None
            # a finite constant holding zeros (a mask): a node, so a zero can be traced to it
            n = Node("const", status=(st,), seq=next(self._seq), label=label, zout=(z,))
            return (n, 0)
        n = Node("const", status=(st,), seq=next(self._seq), label=label)
        n.outs = [to_numpy(value)]
        n.first_bad = _first_bad(value)
        return (n, 0)

    def literal_side(self, value: Any) -> Src | None:
        side = self.const_side(value, f"the literal {value}")
        if side is not None and side[0].status == (FINITE,):
            side[0].kind = "literal"
        return side

    def run(self, jaxpr, consts, const_sides, args, arg_sides, scope):  # type: ignore[override]
        self._last.pop(scope.id, None)
        return super().run(jaxpr, consts, const_sides, args, arg_sides, scope)

    def stack_side(self, sides: list, scope: Scope) -> Src | None:
        if all(s is None for s in sides):
            return None
        st = (max((s[0].status[s[1]] if s is not None else FINITE) for s in sides),)
        n = Node("stack", scope=scope, ins=tuple(sides), status=st, seq=next(self._seq))
        return (n, 0)

    def first_order(self, eqn, invals, insides, scope, key):
        outvals = _numpy.evaluate(eqn, invals) if self.fast else None
        if outvals is None:
            outvals = _compat.bind(eqn, invals)
        return self._record(eqn, invals, outvals, insides, scope)

    def collective_side(self, eqn, ins_by_device, outvals, all_insides, scope, key):
        # one device's result of a psum/all_gather/...: its inputs are every device's operands
        invals = [v for vals, _ in ins_by_device for v in vals]
        return self._record(eqn, invals, outvals, all_insides, scope)[1]

    def _record(self, eqn, invals, outvals, insides, scope):
        status = tuple(_status(o) for o in outvals)
        pl = place(eqn.source_info)
        node = Node(
            "eqn",
            eqn=eqn,
            scope=scope,
            ins=tuple(insides),
            status=status,
            seq=next(self._seq),
            place=pl,
            backward=_compat.is_backward(eqn, scope.backward),
        )
        gk = group_key(scope, pl)
        self.group_first.setdefault(gk, node.seq)
        # a run: consecutive equations at one source position (a primal op, then its jvp rule)
        last = self._last.get(scope.id)
        if last is None or last[0] != gk:
            last = self._last[scope.id] = (gk, next(self._seq))
        node.run = last[1]
        if any(status):
            in_bad = [s is not None and s[0].status[s[1]] != FINITE for s in insides]
            in_nan = [s is not None and s[0].status[s[1]] == NAN for s in insides]
            node.first_bad = _first_bad(outvals[status.index(max(status))])
            if not any(in_bad) or (NAN in status and not any(in_nan)):
                node.operands = [to_numpy(v) for v in invals]
                node.outs = [to_numpy(o) for o in outvals]
        record_zeros(node, invals, outvals)
        if self.check_hits and not node.backward:
            op = _rules.canonical_op(eqn.primitive.name)
            if op is not None:
                hit = classify(
                    op,
                    [to_numpy(v) for v in invals],
                    None,
                    _rules.params_for(eqn.primitive.name, eqn.params),
                )
                if hit is not None:
                    node.hit = HitSummary(
                        hit.entry_id,
                        hit.count,
                        int(hit.mask.size),
                        hit.first_index,
                        hit.got,
                        tuple(np.shape(hit.mask)),
                    )
                    self.hits_by_key.setdefault(gk, []).append(node)
        return outvals, [(node, i) for i in range(len(outvals))]


# -- blame --------------------------------------------------------------------------------------


def _stat(src) -> int:
    return FINITE if src is None else src[0].status[src[1]]


class _Dataflow:
    """Provenance Srcs as the graph :class:`gradsan._blame.Blame` walks: handles are
    ``(Node, output index)`` pairs, records are Nodes. An intentional inf is a constant (a -inf
    mask): a NaN made from it was born where it met the other infinity."""

    @staticmethod
    def key(v: Src) -> tuple[int, int]:
        return (id(v[0]), v[1])

    @staticmethod
    def children(v: Src) -> list:
        node, k = v
        if node.kind in ("input", "const"):
            return []
        bad = [s for s in node.ins if _stat(s) != FINITE]
        if node.kind == "stack":
            return bad[:1]
        if node.status[k] == NAN:
            return [s for s in bad if _stat(s) == NAN] or bad
        return bad

    @staticmethod
    def is_poison(v: Src) -> bool:
        node, k = v
        bad = [s for s in node.ins if _stat(s) != FINITE]
        return (
            node.kind == "eqn"
            and node.status[k] == NAN
            and bool(bad)
            and not any(_stat(s) == NAN for s in bad)
        )

    @staticmethod
    def is_intentional(r: Node) -> bool:
        return r.kind == "const"

    @staticmethod
    def record(v: Src) -> Node:
        return v[0]


def _origins(blame: Blame, src: Src) -> list[tuple[Node, Node | Poison | None]]:
    """The origins of ``src`` and their poisons; a non-finite constant is named only when
    nothing else made the value non-finite. An origin of a NaN without a poison: where that
    NaN was multiplied by an exact zero on its way (``0 * nan``, the where trap), if it was."""
    found = blame.origins(src)
    real = [f for f in found if f[0].kind != "const"]
    out: list[tuple[Node, Node | Poison | None]] = []
    for origin, poison in real or found:
        # a NaN may meet a zero on its way (0 * nan: a where, a slice); one that constant
        # infinities made by meeting a zero (0 * -inf) names that zero as its own form
        if (
            poison is None
            and origin.kind == "eqn"
            and NAN in origin.status
            and not _own_zero(origin)
        ):
            meet = nan_meeting(src, origin, NAN)
            if meet is not None:
                out.append((origin, _meeting(*meet)))
                continue
        out.append((origin, poison))
    return out


def _own_zero(origin: Node) -> bool:
    """The origin made its NaN from infinite inputs and an exact zero (0 * -inf)."""
    if not any(_stat(s) != FINITE for s in origin.ins):
        return False
    return _poison(origin, zero_from_frames=False).zero_operand is not None


def _meeting(node: Node, zero: int) -> Poison:
    """The product where a NaN met an exact zero (``0 * nan``) and stayed NaN, as a Poison."""
    idx = tuple(node.first_bad) if node.first_bad else ()
    zsrc, _ = zero_source(node, zero, idx, _is_rule_eqn)
    vals = (0.0, float("nan")) if zero == 0 else (float("nan"), 0.0)
    return Poison(
        op=node.prim,
        where=node.user_frame,
        form="0*nan",
        backward=node.backward,
        op_class="mul",
        operands=vals,
        zero_operand=zero,
        zero_from=(zsrc.frame if zsrc is not None else None) or node.user_frame,
        zero_constant=zsrc is None,
        index=idx or None,
        zero_kind=zsrc.kind if zsrc is not None else None,
        zero_op=zsrc.step.op if zsrc is not None else "",
        zero_text=_zero_text(zsrc),
        zero_value=zsrc.step.value if zsrc is not None else "",
    )


def _forward_node(interp: Provenance, origin: Node) -> Node | None:
    """The primal operation the origin belongs to: sqrt for sqrt's jvp coefficient.

    Operations at the same source position in the same scope form a group (the primal op and
    the equations of its derivative rule). The primal op is the group's hit that does not
    itself consume another group member's output (the coefficient ``0.5 / sqrt(x)`` does).
    """
    cands = (
        interp.hits_by_key.get(group_key(origin.scope, origin.place))
        if origin.place is not None and origin.scope is not None
        else None
    )
    if cands:
        # a kink (a max tie among -inf logits) does not make a non-finite value
        cands = [c for c in cands if _entry_kind(c.hit.entry_id) != "kink"]
    if cands:
        before = [c for c in cands if c.seq <= origin.seq] or cands
        latest = before[-1]
        # the first hit of the latest run: the primal op precedes its jvp rule's equations
        return next(c for c in before if c.run == latest.run)
    if origin.hit is not None and _entry_kind(origin.hit.entry_id) != "kink":
        return origin
    # a few hops back along the inputs (the coefficient of acos is rsqrt(1 - x*x))
    frontier = [s[0] for s in origin.ins if s is not None]
    for _ in range(3):
        nxt = []
        for n in frontier:
            if n.hit is not None and _entry_kind(n.hit.entry_id) != "kink":
                return n
            nxt += [s[0] for s in n.ins if s is not None]
        frontier = nxt
    return None


def _entry_kind(entry_id: str) -> str:
    try:
        return _catalog.get(entry_id).kind
    except KeyError:
        return ""


def _result_word(node: Node) -> str:
    if node.outs is not None and node.first_bad is not None:
        for o in node.outs:
            a = np.asarray(o)
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                v = a[node.first_bad] if a.ndim == len(node.first_bad) else a.flat[0]
                return format_value(v)
    return {NAN: "nan", INF: "inf"}.get(max(node.status), "nan")


def _at(arr: np.ndarray, idx: tuple, shape: tuple) -> Any:
    a = np.broadcast_to(arr, shape) if np.shape(arr) != shape else arr
    return a[idx] if len(idx) == a.ndim else a.flat[0]


def _first_nan(node: Node) -> tuple | None:
    """The first NaN of the node's first output (a poison's output may hold infs before it)."""
    if not node.outs:
        return None
    a = np.asarray(node.outs[0])
    if a.dtype.kind not in "fc":
        return None
    hits = np.argwhere(np.isnan(a))
    return tuple(int(i) for i in hits[0]) if len(hits) else None


def _poison(node: Node, zero_from_frames: bool = True) -> Poison:
    """The indeterminate form at ``node`` (where an inf met a zero), as an event: its operand
    values at the first NaN, and which operand held the zero and where that zero was made."""
    prim = node.prim
    ops = node.operands or []
    idx = _first_nan(node) or node.first_bad or ()
    out_shape = np.shape(node.outs[0]) if node.outs else ()
    vals: list = []
    for o in ops:
        try:
            vals.append(_at(o, idx, out_shape))
        except (ValueError, IndexError):
            vals.append(None)
    pair = len(vals) == 2 and all(v is not None for v in vals)
    form = zero = None
    op_class = ""
    if prim == "mul" and pair:
        op_class = "mul"
        a, b = (float(np.real(v)) for v in vals)
        if a == 0 and np.isinf(b):
            form, zero = "0*inf", 0
        elif b == 0 and np.isinf(a):
            form, zero = "0*inf", 1
    elif prim == "div" and pair:
        op_class = "div"
        a, b = (float(np.real(v)) for v in vals)
        if a == 0 and b == 0:
            form, zero = "0/0", 0
        elif np.isinf(a) and np.isinf(b):
            form = "inf/inf"
    elif prim in _rules.SUM_PRIMS:
        op_class, form = "sum", "inf-inf"
    elif prim in _rules.PRODUCT_PRIMS:
        op_class = "product"
        form = "0*inf" if any(np.any(np.asarray(o) == 0) for o in ops) else "inf-inf"
    zero_from, constant = None, False
    zsrc: Any = None
    if zero is not None and zero_from_frames:
        # follow the zero back to the operation that made it exact
        zsrc, _ = zero_source(node, zero, tuple(idx) if idx else (), _is_rule_eqn)
        if zsrc is not None:
            zero_from = zsrc.frame
            constant = zsrc.kind in (ZeroKind.CONSTANT, ZeroKind.STOP) and zsrc.step.op in (
                "literal",
                "",
            )
        if zero_from is None:
            zero_from, constant = node.user_frame, zsrc is None
    where = node.user_frame
    if node.backward and node.place is not None and node.place.custom_vjp and where is not None:
        # met in a custom_vjp backward rule, whose equations carry the call site (P3)
        where = custom_vjp_rule_frame(where, prim) or where
    return Poison(
        op=prim,
        where=where,
        form=form,
        backward=node.backward,
        op_class=op_class,
        operands=tuple(vals) if pair else None,
        zero_operand=zero,
        zero_from=zero_from,
        zero_constant=constant,
        index=tuple(idx) if idx else None,
        zero_kind=zsrc.kind if zsrc is not None else None,
        zero_op=zsrc.step.op if zsrc is not None else "",
        zero_text=_zero_text(zsrc),
        zero_value=zsrc.step.value if zsrc is not None else "",
    )


def _zero_text(zsrc: Any) -> str:
    """The zero's name for its sentence: the input of a mask passed as an argument."""
    if zsrc is None:
        return ""
    if zsrc.kind is ZeroKind.INPUT_MASK and zsrc.birth is not None:
        return zsrc.birth.text
    return zsrc.step.text


def _is_rule_eqn(node: Node) -> bool:
    """An equation of a derivative rule: not the first at its source position (the primal op
    is), in the forward pass."""
    return not node.backward and node.kind == "eqn" and node.run != node.seq + 1


def _device_facts(
    interp: Provenance, origin: Node, fwd: Node | None, index: tuple | None
) -> tuple[int | None, dict | None, tuple | None, str]:
    """(device, mesh coordinate, global index, words for the context) of an origin inside a
    shard_map body, or of an element of a jit argument sharded over a mesh."""
    shard = origin.scope.shard if origin.scope is not None else None
    if shard is not None:
        g = None
        if fwd is not None and fwd.hit is not None and index:
            g = shard.global_index(fwd.hit.shape, index)
        elif origin.first_bad and origin.outs:
            g = shard.global_index(np.shape(origin.outs[0]), origin.first_bad)
        words = f"element {list(g)} of the global array" if g is not None else ""
        return shard.device, dict(zip(shard.layout.names, shard.coord)), g, words
    if fwd is not None and fwd.hit is not None and index:
        holding = holder(interp.arguments, fwd.hit.shape, index)
        if holding is not None:
            at = ", ".join(f"{k}={v}" for k, v in holding[1].items())
            return holding[0], holding[1], None, f"held by device {holding[0]} ({at})"
    return None, None, None, ""


def _origin_event(
    interp: Provenance, origin: Node, poison: Node | Poison | None, hits: list[OutputHit]
) -> Origin:
    """What explain knows about one origin, as a text-free event."""
    if origin.kind in ("input", "const"):
        a = origin.outs[0] if origin.outs else np.array(np.nan)
        bad = ~np.isfinite(a)
        held = format_value(a[origin.first_bad] if origin.first_bad else a.flat[0])
        return Origin(
            backend="jax",
            op="input" if origin.kind == "input" else "constant",
            where=None,
            phase="value",
            result=held,
            entry_id="nonfinite-input",
            count=int(bad.sum()),
            size=int(a.size),
            index=origin.first_bad,
            outputs=tuple(hits),
            input=origin.label,
            held=held,
            constant=origin.kind == "const",
        )
    fwd = _forward_node(interp, origin)
    result = _result_word(origin)
    lib: str | None = origin.library or (fwd.library if fwd is not None else None)
    entry_id: str | None = None
    got = None
    count: int | None = None
    size: int | None = None
    index: tuple | None = None
    primitive = origin.prim
    if fwd is not None:
        h = fwd.hit
        entry_id, got, count, size, index = h.entry_id, h.got, h.count, h.size, h.index
        primitive = fwd.prim
    else:
        op = _rules.canonical_op(origin.prim)
        hit = _overflow_hit(origin)
        if hit is None and op is not None:
            hit = classify(
                op,
                origin.operands or [],
                origin.outs[0] if origin.outs else None,
                _rules.params_for(origin.prim, origin.eqn.params),
            )
        if hit is not None:
            entry_id, got, count, size, index = (
                hit.entry_id,
                hit.got,
                hit.count,
                int(hit.mask.size),
                hit.first_index,
            )
    overflow = _overflow_hit(origin) if fwd is None or fwd is origin else None
    if overflow is not None:  # float16/bfloat16: the same value fits in float32
        entry_id, got, count, size, index = (
            overflow.entry_id,
            overflow.got,
            overflow.count,
            int(overflow.mask.size),
            overflow.first_index,
        )
    if lib is not None:
        lib_entry = _catalog.for_library(lib)
        if lib_entry is not None and (entry_id is None or lib_entry.op != "input"):
            entry_id = lib_entry.id
    # a value, not a gradient, when the origin is a primal operation: not transposed, and the
    # first equation at its source position (a derivative rule's equations come after it)
    first = (
        interp.group_first.get(group_key(origin.scope, origin.place))
        if origin.place is not None and origin.scope is not None
        else None
    )
    value_phase = not origin.backward and (fwd is origin or (fwd is None and first == origin.seq))
    where = (fwd or origin).user_frame
    call_site = None
    if (
        fwd is None
        and origin.backward
        and origin.place is not None
        and origin.place.custom_vjp
        and where is not None
    ):
        # born in a custom_vjp backward rule, whose equations carry the call site (P3)
        rule = custom_vjp_rule_frame(where, origin.prim)
        if rule is not None:
            call_site, where, lib = where, rule, None
    if call_site is not None:
        note, note_value = Note.CUSTOM_VJP_RULE, ""
    elif fwd is not None and fwd is not origin:
        note, note_value = (
            (Note.DERIVATIVE_IS, result) if result != "nan" else (Note.DERIVATIVE_RULE_NAN, "")
        )
    else:
        note, note_value = Note.RETURNED, result
    ctx = origin.scope.context if origin.scope else ""
    if isinstance(poison, Node) and poison.scope is not None and poison.scope.context and not ctx:
        ctx = poison.scope.context
    device, coord, global_index, words = _device_facts(interp, origin, fwd, index)
    if words:
        ctx = f"{ctx}, {words}" if ctx else words
    because = None
    body_op = ""
    own_poison = None
    if origin.prim == "shard_map":  # a body gradsan could not enter
        because, body_op = Because.SHARD_MAP, origin.body_prim
        where = origin.body_frame or where
    elif (
        entry_id is None
        and poison is None
        and origin.status
        and max(origin.status) == NAN
        and any(_stat(s) != FINITE for s in origin.ins)
    ):
        because, own_poison = Because.CONSTANT_INFS, _poison(origin)
    elif entry_id is None:
        because = Because.NOT_IN_CATALOG
    if (
        poison is None
        and own_poison is None
        and origin.prim == "div"
        and origin.backward
        and origin.status
        and max(origin.status) == NAN
    ):
        # 0 / 0 from finite operands (log's cotangent g / x with g == 0): its own poison
        p = _poison(origin)
        if p.form == "0/0":
            own_poison = p
    value_form = _value_form(fwd, index)
    reduced = _reduced(fwd or origin) if _STD_LIBS.intersection((lib or "").split()) else None
    return Origin(
        backend="jax",
        op=primitive,
        value_form=value_form,
        reduced=reduced,
        ddof=float(reduced) if reduced is not None and value_form == "0/0" else None,
        where=where,
        phase="value" if value_phase else "gradient",
        result="nan" if any(h.nan for h in hits) else result,
        produced=result,
        entry_id=entry_id,
        backend_op=origin.prim,
        backward=origin.backward,
        got=got,
        count=count or 0,
        size=size or 0,
        index=index,
        library=lib,
        context=ctx,
        scope=origin.scope.path if origin.scope else "",
        outputs=tuple(hits),
        origin_op=origin.prim,
        note=note,
        note_value=note_value,
        custom_vjp_call=call_site,
        poison=(
            poison
            if isinstance(poison, Poison)
            else _poison(poison)
            if poison is not None
            else own_poison
        ),
        because=because,
        body_op=body_op,
        device=device,
        mesh_coordinate=coord,
        global_index=global_index,
    )


_STD_LIBS = {"jnp.std", "jnp.var", "jnp.nanstd", "jnp.nanvar"}


def _reduced(node: Node) -> int | None:
    """How many elements the std/var that ``node`` belongs to reduced over: the sum of squared
    deviations nearest it on the way back (at most a few operations back, same library)."""
    frontier, seen = [node], set()
    for _ in range(8):
        nxt = []
        for n in frontier:
            if id(n) in seen or n.kind != "eqn":
                continue
            seen.add(id(n))
            if n.prim == "reduce_sum" and n.library == node.library:
                shape = getattr(n.eqn.invars[0].aval, "shape", ())
                axes = n.eqn.params.get("axes", ())
                return int(np.prod([shape[a] for a in axes], dtype=np.int64))
            nxt += [s[0] for s in n.ins if s is not None]
        frontier = nxt
    return None


def _value_form(fwd: Node | None, index: tuple | None) -> str:
    """ "0/0" when the forward division's own value is 0 / 0 at the hit (finite operands)."""
    if fwd is None or fwd.prim != "div" or not fwd.operands or not fwd.outs or index is None:
        return ""
    shape = np.shape(fwd.outs[0])
    try:
        a, b = (_at(np.asarray(o), tuple(index), shape) for o in fwd.operands[:2])
    except (ValueError, IndexError):
        return ""
    return "0/0" if a == 0 and b == 0 else ""


def _origin_finding(
    interp: Provenance, origin: Node, poison: Node | Poison | None, hits: list[OutputHit]
) -> Finding:
    return build(_origin_event(interp, origin, poison, hits))


def _overflow_hit(origin: Node):
    try:
        from .._catalog._overflow import classify_overflow
    except ImportError:
        return None
    if not origin.outs or origin.operands is None:
        return None
    op = "add" if origin.prim == "add_any" else origin.prim  # canonical op for the float32 check
    return classify_overflow(op, origin.operands, origin.outs[0])


# -- the transformation -------------------------------------------------------------------------


def diagnose(
    fun: Callable,
    args: tuple,
    kwargs: dict,
    *,
    who: str = "explain",
    outputs: Any = None,
    run_outputs: bool = True,
    trace_fun: Callable | None = None,
) -> Report:
    """Interpret ``fun(*args, **kwargs)`` and blame every non-finite output.

    ``trace_fun`` computes the same outputs and is what gets traced (guard passes its already
    compiled twin, whose trace jax has cached).
    """
    # an NNX step updates its module and optimizer arguments in place: their state after the
    # call is checked as an output too (a step returning a finite loss can write NaN weights)
    graph = _frameworks.graph_args(fun, args, kwargs) if trace_fun is None else []
    if graph:
        trace_fun = _frameworks.with_graph_state(fun)
    call = flatten_call(fun, args, kwargs, trace_fun)
    labels, leaves = arg_labels(fun, call.dyn_args, call.dyn_kwargs)
    check_args(leaves, labels, who)
    labels, flat_args = call.labels, call.flat

    traced = trace_call(call, who)
    if outputs is None and run_outputs:
        outputs = fun(*args, **kwargs)  # the user's call, first: the replay repeats no effect
    interp = Provenance()
    with _compat.mesh_context(flat_args):
        outs, out_srcs = interp.explain_closed(traced.closed, flat_args, labels)
    if graph:
        every_label = output_labels(fun, traced.out_shape[0], args, labels)
        every_label += _frameworks.state_labels(graph, traced.out_shape[1])
    else:
        every_label = output_labels(fun, traced.out_shape, args, labels)
    out_labels = [lbl for lbl, k in zip(every_label, traced.is_array) if k]
    report = Report(outputs=outputs, function=getattr(fun, "__name__", "function"), backend="jax")
    report.notes.extend(effects_notes(traced.closed.jaxpr, interp.effects_skipped))
    blame: Blame = Blame(_Dataflow())
    groups: dict[int, tuple[Node, Node | Poison | None, list[OutputHit]]] = {}
    order: list[int] = []
    seen: set[tuple] = set()
    for val, src, (label, kind) in zip(outs, out_srcs, out_labels):
        if src is None or _stat(src) == FINITE:
            continue
        a = np.asarray(val)
        if a.dtype.kind not in "fc":
            a = a.astype(np.float32)
        nan = int(np.isnan(a).sum())
        inf = int(np.isinf(a).sum())
        hit = OutputHit(label, nan + inf, int(a.size), nan, inf, kind)
        for origin, poison in _origins(blame, src):
            # the same equation in many loop iterations is one finding, at its first iteration
            key = id(origin.eqn) if origin.eqn is not None else id(origin)
            if key not in groups:
                groups[key] = (origin, poison, [])
                order.append(key)
            elif origin.seq < groups[key][0].seq:
                groups[key] = (origin, poison or groups[key][1], groups[key][2])
            if (key, hit) not in seen:  # a set: thousands of outputs, not a list scan each
                seen.add((key, hit))
                groups[key][2].append(hit)
    order.sort(key=lambda k: groups[k][0].seq)
    merged: dict[tuple, Finding] = {}
    for key in order:
        origin, poison, hits = groups[key]
        f = _origin_finding(interp, origin, poison, hits)
        f = _frameworks.finding(f, origin, traced.closed)  # eqx.error_if(on_error="nan")
        w = f.where
        same = (
            f.kind,
            f.catalog_id,
            f.primitive,
            f.phase,
            (w.file, w.line, w.column) if w is not None else None,
            f.detail.get("input"),
        )
        if same in merged:  # one forward op, several derivative equations (atan2's dx and dy)
            have = merged[same]
            have.outputs += [h for h in f.outputs if h not in have.outputs]
            continue
        merged[same] = f
        report.findings.append(f)
    return report


def explain(fun: Callable) -> Callable[..., Report]:
    """Wrap ``fun`` so that calling it returns a :class:`gradsan.Report` on its outputs.

    ``fun`` is anything JAX can trace: ``jax.grad(loss)``, ``jax.value_and_grad(loss)``, a
    jitted train step. The program is interpreted equation by equation; every non-finite output
    is followed back along the dataflow to the operation where the NaN or Inf was born, and to
    the place where an inf met the zero that made it a NaN.

    Example::

        report = gradsan.jax.explain(jax.grad(loss))(theta)
        print(report)            # origin, where it met a zero, why, and a fix
        report.outputs           # what jax.grad(loss)(theta) returned
    """
    check_callable(fun, "explain")

    @functools.wraps(fun)
    def explained(*args: Any, **kwargs: Any) -> Report:
        return _fix.verified_before(lambda: diagnose(fun, args, kwargs), fun, args, kwargs, "jax")

    return explained
