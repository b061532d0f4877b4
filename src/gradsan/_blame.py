"""The one dataflow blame: from a non-finite output back to where its non-finite values were born.

Both backends record, for each non-finite value, the operation that produced it and its
non-finite inputs. :class:`Blame` walks that graph back from an output and returns the
*origins* (values with no non-finite input: an input, a constant, or an operation that made a
NaN or an Inf from finite inputs), each with its *poison*: the first operation on the way from
the origin to the output that made a NaN although none of its inputs held a NaN (where the inf
met a zero). Results are memoised per value, so blaming every gradient of a model walks the
non-finite subgraph once.

The intentional-inf rule: an infinity the user wrote on purpose (``masked_fill(mask, -inf)``, a
``-inf`` constant) is not the problem by itself. When a poison reads an origin that is
intentional, the NaN was born at the poison: the poison itself becomes the origin (with no
poison of its own).

The node protocol (:class:`Graph`): a backend passes an object with five methods over its value
handles ``V`` (any objects; ``torch/_mode.py`` uses its ``Event``/``External`` records, the JAX
explain interpreter can use ``(node, output index)`` pairs):

- ``key(v) -> Hashable``: the memo key of the value (``id(event)``; ``(id(node), k)``).
- ``children(v) -> Sequence[V]``: the non-finite inputs to follow, in the order their origins
  are to be listed (empty for an origin).
- ``is_poison(v) -> bool``: ``v`` made a NaN although no input it is blamed through held one.
  Also asked of an origin: a root that is a poison is its own poison (torch's new NaN from
  finite inputs); return False there to report origins without one (JAX's convention).
- ``is_intentional(r) -> bool``: the origin record ``r`` is an intentional infinity (the rule
  above).
- ``record(v) -> R``: what the report names as origin or poison (``v`` itself, or the node of
  an ``(node, k)`` pair). Two handles with the same record are one origin.

``Blame(graph).origins(v)`` returns ``[(origin, poison or None), ...]`` as records, in the order
a depth-first walk from ``v`` meets them. A cycle (which a dataflow graph cannot have) is cut.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, Protocol, TypeVar

from ._events import ZeroKind
from ._report._records import Frame

V = TypeVar("V")
R = TypeVar("R")
H = TypeVar("H")


class Graph(Protocol[V, R]):
    """The node protocol the blame walks; see the module docstring."""

    def key(self, v: V, /) -> Hashable: ...

    def children(self, v: V, /) -> Sequence[V]: ...

    def is_poison(self, v: V, /) -> bool: ...

    def is_intentional(self, r: R, /) -> bool: ...

    def record(self, v: V, /) -> R: ...


class Blame(Generic[V, R]):
    """Origins and poisons of non-finite values, memoised per value (see the module docstring)."""

    def __init__(self, graph: Graph[V, R]) -> None:
        self.graph = graph
        self.memo: dict[Hashable, dict[int, tuple[R, R | None]]] = {}

    def clear(self) -> None:
        """Forget every result (the graph grew)."""
        self.memo = {}

    def _combine(self, v: V, children: Sequence[V]) -> dict[int, tuple[R, R | None]]:
        g = self.graph
        rec = g.record(v)
        poison = g.is_poison(v)
        if not children:
            return {id(rec): (rec, rec if poison else None)}
        own = rec if poison else None
        res: dict[int, tuple[R, R | None]] = {}
        for c in children:
            sub = self.memo.get(g.key(c))
            if sub is None:  # a cut cycle
                continue
            for rk, (r, p) in sub.items():
                if own is not None and g.is_intentional(r):
                    res.setdefault(id(rec), (rec, None))  # born here, from intentional infs
                    continue
                res.setdefault(rk, (r, p if p is not None else own))
        return res

    def origins(self, start: V) -> list[tuple[R, R | None]]:
        g = self.graph
        memo = self.memo
        open_: set[Hashable] = set()
        # (value, its children once expanded: combine them when popped again)
        stack: list[tuple[V, Sequence[V] | None]] = [(start, None)]
        while stack:
            v, expanded = stack.pop()
            k = g.key(v)
            if k in memo:
                continue
            if expanded is not None:
                open_.discard(k)
                memo[k] = self._combine(v, expanded)
                continue
            children = g.children(v)
            if not children:
                memo[k] = self._combine(v, children)
                continue
            if k in open_:
                continue
            open_.add(k)
            stack.append((v, children))
            for c in reversed(children):
                if g.key(c) not in memo:
                    stack.append((c, None))
        return list(memo[g.key(start)].values())


# -- the zero's side ------------------------------------------------------------------------------
#
# A NaN made by ``0 * inf`` (or ``0 / 0``) has two ends: where the inf was born (the origin,
# above) and what made the other factor exactly zero. Both backends describe the zero factor's
# way back, from the poison's operand to the operation where the zero was born, as a list of
# text-free :class:`ZeroStep`s (a backend knows its own operations); :func:`classify_zero`
# reads that path and names the kind of zero and the step whose line the report shows. One
# rule for both backends.

# the roles a step plays on the zero's way back
PASS = "pass"  # carries the zero through (broadcast, reshape, sum, a cotangent product)
SELECT = "select"  # a where/select whose chosen branch carried the zero
DROP = "drop"  # the transpose of a slice, gather or indexing: dropped elements get 0
MUL = "mul"  # a product whose zero factor is followed
DERIVATIVE = "derivative"  # a derivative rule's coefficient (2 * x for x ** 2)
VALUE = "value"  # a forward operation whose value is 0 because an input is (0 ** theta)
# births (the last step of a path)
LITERAL = "literal"  # a literal 0 of the program, or zeros it builds (jnp.zeros_like)
INPUT = "input"  # an input of the function holds the zero
CONST = "const"  # a constant captured by the function holds it
BOOL = "bool"  # a float made from booleans or integers (a mask, one-hot labels)
UNDERFLOW = "underflow"  # a result that rounded to 0 from operands that were not 0
BY_DESIGN = "by-design"  # exp(-inf) = 0
CANCEL = "cancel"  # x - x


@dataclasses.dataclass(frozen=True)
class ZeroStep:
    """One operation on the zero factor's way back to where it was born."""

    role: str
    frame: Frame | None = None  # the user's line of the operation (None inside a library)
    op: str = ""  # the backend operation
    library: str | None = None  # the library function it ran inside
    backward: bool = False
    text: str = ""  # INPUT/CONST: the value's name
    value: str = ""  # UNDERFLOW/BY_DESIGN: the operand that made it, formatted
    # INPUT: the input is not among what the other (non-finite) factor was computed from: a
    # mask passed as an argument, not a factor of the singular expression (z * z)
    independent: bool = False
    ref: int | None = None  # INPUT (torch): id() of the leaf tensor, named at report time


@dataclasses.dataclass(frozen=True)
class ZeroSource:
    kind: ZeroKind
    frame: Frame | None
    step: ZeroStep
    birth: ZeroStep | None = None  # the path's last step: where the zero was born


def follow_zero(
    start: H, step: Callable[[H], tuple[ZeroStep, H | None]], limit: int = 256
) -> list[ZeroStep]:
    """The zero's way back from ``start``: ``step(h)`` describes ``h`` and names the handle the
    zero came through (None at its birth). Cut after ``limit`` steps."""
    path: list[ZeroStep] = []
    h: H | None = start
    while h is not None and len(path) < limit:
        s, h = step(h)
        path.append(s)
    return path


_POW_OPS = ("pow", "integer_pow", "aten.pow", "pow_", "__pow__", "__rpow__")


def classify_zero(path: Sequence[ZeroStep]) -> ZeroSource | None:
    """What kind of zero the path ends in, and the step whose line names it (see above)."""
    if not path:
        return None
    birth = path[-1]
    # the steps nearest the birth decide: the where that chose a literal zero, the slice that
    # dropped the element, the product with a mask
    rest = list(reversed(path[:-1]))

    def nearest(*roles: str) -> ZeroStep | None:
        return next((s for s in rest if s.role in roles), None)

    def framed(s: ZeroStep) -> Frame | None:
        """The step's line, or the nearest line on the way to the poison (library code)."""
        if s.frame is not None:
            return s.frame
        i = len(path) - 1 - path[::-1].index(s)
        for t in reversed(path[:i]):
            if t.frame is not None:
                return t.frame
        for t in path[i + 1 :]:
            if t.frame is not None:
                return t.frame
        return None

    def result(kind: ZeroKind, s: ZeroStep) -> ZeroSource:
        return ZeroSource(kind, framed(s), s, birth)

    if birth.role == DERIVATIVE or (birth.role == VALUE and birth.op in _POW_OPS):
        return result(ZeroKind.DERIVATIVE, birth)
    if birth.role in (UNDERFLOW, BY_DESIGN, CANCEL):
        kind = {
            UNDERFLOW: ZeroKind.UNDERFLOW,
            BY_DESIGN: ZeroKind.BY_DESIGN,
            CANCEL: ZeroKind.CANCEL,
        }[birth.role]
        return result(kind, birth)
    if birth.role == LITERAL:
        s = nearest(SELECT, DROP, MUL)
        if s is not None and s.role == SELECT:
            lib = " ".join(t.library or "" for t in path if t.role in (SELECT, PASS, LITERAL))
            nan_to_num = "nan_to_num" in (s.library or "") or "nan_to_num" in lib
            return result(ZeroKind.NAN_TO_NUM if nan_to_num else ZeroKind.WHERE, s)
        if s is not None and s.role == DROP:
            return result(ZeroKind.SLICE, s)
        if s is not None and s.role == MUL:
            return result(ZeroKind.MASK, s)
        if birth.backward or any(t.backward for t in rest):
            return result(ZeroKind.STOP, birth)
        return result(ZeroKind.CONSTANT, birth)
    s = nearest(DERIVATIVE, VALUE, MUL, DROP, SELECT)
    if s is not None and s.role == DERIVATIVE:
        return result(ZeroKind.DERIVATIVE, s)
    if s is not None and s.role == VALUE and s.op in _POW_OPS:
        return result(ZeroKind.DERIVATIVE, s)
    if s is not None and s.role == DROP:
        return result(ZeroKind.SLICE, s)
    if birth.role == BOOL:  # a mask or one-hot labels built from booleans or integers
        if birth.frame is None:
            m = nearest(MUL)
            if m is not None:
                return result(ZeroKind.MASK, m)
        return result(ZeroKind.CONSTANT, birth)
    if birth.role == INPUT and birth.independent:
        # a product with an input the non-finite factor does not depend on: a mask passed as
        # an argument (x * m with m == 0), differentiated or not
        m = nearest(MUL)
        if m is not None:
            return result(ZeroKind.INPUT_MASK, m)
    if birth.role == INPUT:
        # the cotangent times a forward value that is 0 because the input is: the derivative
        # of that product vanishes there (d(z * z)/dz = 2 z at z = 0)
        m = next((t for t in rest if t.role == MUL and t.backward), None)
        if m is not None:
            return result(ZeroKind.DERIVATIVE, m)
    if s is not None and s.role == MUL and birth.role in (INPUT, CONST):
        return result(ZeroKind.MASK, s)
    if birth.role == CONST:
        return result(ZeroKind.CONSTANT, birth)
    if birth.role == INPUT:
        return result(ZeroKind.INPUT, s if s is not None else birth)
    return result(ZeroKind.VALUE, birth)
