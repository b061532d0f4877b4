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

from collections.abc import Hashable, Sequence
from typing import Generic, Protocol, TypeVar

V = TypeVar("V")
R = TypeVar("R")


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
