"""guard's replay: autograd Node hooks up to where a NaN is born, none on the Nodes after it.

The time to the report is what this is for. :class:`gradsan.torch._nodes.NodeHooks` runs a
Python hook on every Node of the backward; once a NaN is born at a Node (and that Node was run
again under the dispatch mode, which names the op, its form and where the zero came from), the
Nodes that only run after it receive that NaN: nothing new can be born where a NaN comes in,
and the hooks there would only pass it on. So those Nodes run without hooks (the engine's own
speed), and each leaf they write a non-finite gradient to is linked to the birth (or births)
that reach it, plus what traced Nodes sent it. ``skipped`` counts the Nodes after a birth (not
traced), for the report's note.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from . import _counts
from ._counts import memo_of, verdicts
from ._mode import Event, is_float, key
from ._nodes import NodeHooks, writes_grad


class UntilBorn(NodeHooks):
    """The hooks are registered as the backward goes: a Node's hook registers its next Nodes'
    (the engine runs a Node's post-hooks before it hands its outputs on), so the Nodes after a
    birth get none."""

    def __init__(self, tracer: Any, roots: list[torch.Tensor]) -> None:
        super().__init__(tracer, [])  # nothing registered up front
        self.reach: dict[int, list[Event]] = {}  # id(Node) after a birth -> the births before it
        self.hooked: set[int] = set()
        self.alive: list[Any] = []
        self.skipped = 0
        for t in roots:
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                self._hook(t.grad_fn)
        # the cyclic collector paused while the backward runs (until remove()): the hooks make
        # many small objects and its passes over the traced forward's cost time, not memory
        self._gc = gc.isenabled()
        gc.disable()

    def _hook(self, n: Any) -> None:
        if n is None or id(n) in self.hooked or id(n) in self.reach:
            return
        self.hooked.add(id(n))
        if writes_grad(n):  # AccumulateGrad: writes .grad
            self.handles.append(n.register_prehook(self._accumulating(n)))
        else:
            self.handles.append(n.register_hook(self._post(n)))

    def _post(self, node: Any) -> Any:
        traced = super()._post(node)
        nid = id(node)
        tr = self.tracer

        def hook(grad_inputs: tuple, grad_outputs: tuple) -> Any:
            if nid in self.reach:  # after a birth: the NaN only passes through here
                return None
            made = len(tr.events)
            out = traced(grad_inputs, grad_outputs)
            # a birth is an event this Node made (the traced hook only adds events)
            if out is not None or len(tr.events) != made:
                born = self._born(node, out if out is not None else grad_inputs)
                if born is not None:
                    self._after(node, born)
            for m, _ in node.next_functions:
                self._hook(m)
            return out

        return hook

    def _born(self, node: Any, outs: tuple) -> Event | None:
        """The event, inside ``node``, where a NaN was born from values without one."""
        events = self.tracer.events
        stack: list[Any] = [
            events.get(key(o)) for o in outs if isinstance(o, torch.Tensor) and is_float(o)
        ]
        seen: set[int] = set()
        while stack:
            ev = stack.pop()
            if not isinstance(ev, Event) or id(ev) in seen or ev.node is not node:
                continue
            seen.add(id(ev))
            if ev.nan and ev.nan_new:
                return ev
            stack.extend(p for _, p in ev.inputs)
        return None

    def _after(self, node: Any, born: Event) -> None:
        """Mark every Node the backward reaches from ``node`` (AccumulateGrads included)."""
        stack = [m for m, _ in node.next_functions if m is not None]
        seen: set[int] = set()
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            self.alive.append(n)  # ids are keys: the Node's Python object must stay the same
            acc = writes_grad(n)
            if id(n) not in self.reach and not acc:
                self.skipped += 1
            self.reach.setdefault(id(n), []).append(born)
            if not acc:
                stack.extend(m for m, _ in n.next_functions if m is not None)
            elif id(n) not in self.hooked:  # what it writes to .grad is linked to the birth
                self.hooked.add(id(n))
                self.handles.append(n.register_prehook(self._accumulating(n)))

    def remove(self) -> None:
        try:
            self._link()
        finally:
            if self._gc:
                self._gc = False
                gc.enable()

    def _link(self) -> None:
        tr = self.tracer
        events = tr.events
        todo: list[tuple[Any, torch.Tensor, list[Event], Any]] = []
        for node, g in self.accumulate:
            births = self.reach.get(id(node))
            if not births or not is_float(g):
                continue
            ev = events.get(key(g))
            if ev is not None:  # a sum of what traced Nodes sent: the births reach it too
                if ev.node is node:
                    ev.inputs += [
                        (b.out, b) for b in births if all(p is not b for _, p in ev.inputs)
                    ]
                continue
            grad = node.variable.grad
            todo.append((node, g, births, grad if grad is not g and _real(grad) else None))
        # what came in, and the .grad it was written to when that is another tensor: counted
        # together (the report reads the counts again), with no sums first: a birth reaches them.
        # A .grad that is AccumulateGrad's copy of what came in has its counts.
        memo = memo_of(tr)
        copies = {i for i, (node, g, _, grad) in enumerate(todo) if _copy_of(self, node, g, grad)}
        others = [gr for i, (*_, gr) in enumerate(todo) if gr is not None and i not in copies]
        flags = verdicts([g for _, g, _, _ in todo] + others, memo, screen=False)
        nf_in, nf_grad = iter(flags[: len(todo)]), iter(flags[len(todo) :])
        for i, (node, g, births, grad) in enumerate(todo):
            nf = next(nf_in)
            if grad is None:
                nfg = None
            elif i in copies:
                nfg = nf
                _counts.copy(memo, g, grad)
            else:
                nfg = next(nf_grad)
            if nf is None:
                continue
            sent = self.sent.get((id(node), 0), [])
            inputs = [(b.out, b) for b in births] + [(e.out, e) for e in sent]
            ev = events[key(g)] = Event("backward", "aten.add", None, node, g, inputs, nan=nf)
            if grad is not None and nfg is not None:
                events[key(grad)] = Event(
                    "backward", "aten.copy_", None, node, grad, [(g, ev)], nan=nfg
                )
            tr.leaves.setdefault(id(node.variable), node.variable)
        super().remove()
        tr.untraced_nodes = getattr(tr, "untraced_nodes", 0) + self.skipped  # type: ignore[attr-defined]
        self.skipped = 0


def _copy_of(hooks: UntilBorn, node: Any, g: torch.Tensor, grad: Any) -> bool:
    """``grad`` is the copy AccumulateGrad made of ``g``, so it holds the same values: the
    variable had no .grad before (so nothing was added to it), it has no post-accumulate hook
    (the one place torch runs code on a .grad inside the backward), same type, shape and
    dtype. (Its version counter says nothing: the copy is made by ``copy_``.)"""
    return (
        grad is not None
        and id(node) in hooks.fresh
        and type(grad) is torch.Tensor
        and type(g) is torch.Tensor
        and grad.shape == g.shape
        and grad.dtype == g.dtype
        and not getattr(node.variable, "_post_accumulate_grad_hooks", None)
    )


def _real(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and is_float(t)


def note(tracer: Any) -> str | None:
    """The report's line on the Nodes the replay did not trace (None if it traced them all)."""
    n = getattr(tracer, "untraced_nodes", 0)
    if not n:
        return None
    return (
        f"the replay traced the backward up to where the NaN was born, not the {n} autograd "
        f"Node{'s' if n != 1 else ''} after it (a NaN born there too would not be reported)"
    )
