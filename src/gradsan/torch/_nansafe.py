"""`gradsan.torch.nansafe`: Tier A structural-zero repair through autograd Node hooks.

A gradient that is zero *structurally* (the unselected branch of ``torch.where`` whose
comparison holds with a strict margin, a product with a constant zero, a detached factor) makes
its path contribute exactly 0: near the point, the function equals the program with that path
deleted. A ``0 * inf`` or ``0 / 0`` met there is therefore exactly 0, and gradsan sets it so.
Every other non-finite value is left as it is and reported as ``unresolved``: a zero that is
only numerical (``sqrt(x) * sqrt(x)`` at 0) is a true indeterminate form, and replacing it
would return a wrong finite gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from .._events import Repair, Rule
from .._report._build import build
from . import _rules
from ._explain import BACKEND, _hit, _scope, explain
from ._mode import Tag, Tracer

SZ = torch.Tensor | None  # a boolean mask (True: structurally zero) or None (nothing known)

_MULS = {"mul", "__mul__", "__rmul__", "multiply", "mul_", "__imul__"}


def _const(v: Any) -> bool:
    return not isinstance(v, torch.Tensor) or not v.requires_grad


def sz_edges(tracer: Tracer, name: str, args: tuple, kwargs: dict, out: torch.Tensor) -> dict:
    """Per next_functions edge: the elements whose gradient is structurally zero, as decided
    by this operation alone (before combining with what arrives from downstream)."""
    shape = out.shape
    if name == "where" and len(args) >= 3 and isinstance(args[0], torch.Tensor):
        cond = torch.broadcast_to(args[0], shape)
        strict = tracer.strict_of(args[0])
        if strict is None:
            return {}
        strict = torch.broadcast_to(strict, shape)
        return {0: ~cond & strict, 1: cond & strict}
    if name in _MULS and len(args) >= 2:
        a, b = args[0], args[1]
        edges = {}
        if _const(b) and not _const(a):
            edges[0] = torch.broadcast_to(torch.as_tensor(b) == 0, shape)
        elif _const(a) and not _const(b):
            # torch puts the tensor that requires grad on the edge of its position
            edges[1 if isinstance(a, torch.Tensor) else 0] = torch.broadcast_to(
                torch.as_tensor(a) == 0, shape
            )
        return edges
    return {}


def _reduce_to(mask: torch.Tensor, shape: torch.Size | None) -> SZ:
    """An element of the (broadcast) input is structurally zero only if every copy is."""
    if shape is None:
        return mask if mask.all() else None
    shape = torch.Size(shape)
    if mask.shape == shape:
        return mask
    try:
        extra = mask.dim() - len(shape)
        m = mask.all(dim=tuple(range(extra))) if extra > 0 else mask
        dims = tuple(i for i, (ms, s) in enumerate(zip(m.shape, shape)) if s == 1 and ms != 1)
        if dims:
            m = m.all(dim=dims, keepdim=True)
        return m.reshape(shape) if m.numel() == shape.numel() else None
    except RuntimeError:
        return None


def _and(a: SZ, b: SZ) -> SZ:
    if a is None or b is None:
        return None
    try:
        return a & b
    except RuntimeError:
        return None


def _out_shape(node: Any) -> torch.Size | None:
    try:
        md = node._input_metadata
        return torch.Size(md[0].shape) if len(md) == 1 else None
    except (AttributeError, RuntimeError, IndexError):
        return None


NO_REPAIR = (
    "nansafe made no repair: no non-finite gradient above is a 0 * inf (or 0 / 0) whose zero "
    "is structural (a value already non-finite in the forward pass stays as it is)"
)


class _Repairer:
    """Computes the structural-zero masks of a graph and hooks the Nodes that need them."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.handles: list[Any] = []
        self.repairs: list[tuple[Tag | None, Any, int, str]] = []

    def prepare(self, roots: list[torch.Tensor]) -> None:
        nodes: dict[int, Any] = {}
        consumers: dict[int, int] = {}
        stack = [t.grad_fn for t in roots if t.grad_fn is not None]
        for n in stack:
            nodes[id(n)] = n
        i = 0
        while i < len(stack):
            n = stack[i]
            i += 1
            for c, _ in n.next_functions:
                if c is None:
                    continue
                consumers[id(c)] = consumers.get(id(c), 0) + 1
                if id(c) not in nodes:
                    nodes[id(c)] = c
                    stack.append(c)
        sz: dict[int, SZ] = {}
        pending = dict(consumers)
        ready = [t.grad_fn for t in roots if t.grad_fn is not None and id(t.grad_fn) not in pending]
        for n in ready:
            sz[id(n)] = None
        while ready:
            n = ready.pop()
            s = sz.get(id(n))
            stem = _rules.node_stem(n.name())
            md: dict = n.metadata if hasattr(n, "metadata") else {}  # type: ignore[assignment]  # a dict; stubs say a method
            edges = md.get("gradsan_sz", {})
            masks: dict[int, torch.Tensor] = {}
            for k, (c, _) in enumerate(n.next_functions):
                if c is None:
                    continue
                contrib: SZ
                own = edges.get(k)
                if own is not None:
                    contrib = own if s is None else _or(own, s)
                elif stem in _rules.ELEMENTWISE_NODES:
                    contrib = s
                else:
                    contrib = s if (s is not None and bool(s.all())) else None
                if contrib is not None:
                    contrib = _reduce_to(contrib, _out_shape(c))
                if contrib is not None and bool(contrib.any()):
                    masks[k] = contrib
                key = id(c)
                sz[key] = contrib if key not in sz else _and(sz[key], contrib)
                pending[key] -= 1
                if pending[key] == 0:
                    ready.append(c)
            if masks:
                self.handles.append(n.register_hook(self._hook(n, masks)))

    def _hook(self, node: Any, masks: dict[int, torch.Tensor]):
        def hook(grad_inputs: tuple, grad_outputs: tuple) -> tuple:
            out = list(grad_inputs)
            repaired = 0
            for k, m in masks.items():
                g = out[k] if k < len(out) else None
                if g is None or not g.is_floating_point():
                    continue
                bad = ~torch.isfinite(g)
                if m.shape != g.shape:
                    continue
                fix = bad & m
                if bool(fix.any()):
                    repaired += int(fix.sum())
                    out[k] = torch.where(fix, torch.zeros((), dtype=g.dtype, device=g.device), g)
            if repaired:
                tag = node.metadata.get("gradsan")
                self.repairs.append((tag, node, repaired, node.name()))
            return tuple(out)

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def _or(a: torch.Tensor, b: torch.Tensor) -> SZ:
    try:
        return a | b
    except RuntimeError:
        return a


class nansafe(explain):
    """Evaluate the gradient with Tier A structural-zero repair.

    Inside ``with gradsan.torch.nansafe() as report:`` (or ``nansafe(fn)(*args)``), a
    ``0 * inf`` (or ``0 / 0``) whose zero is structural is set to exactly 0, which is the true
    gradient: the unselected branch of ``torch.where(x > 0, torch.sqrt(x), 0.)`` at ``x < 0``
    (the comparison must hold with a strict margin), a product with a constant 0, a detached
    factor. Each repair is reported (kind ``"resolved"``). **It never returns a wrong finite
    gradient**: a zero that is only numerical stays NaN and is reported as ``"unresolved"``.
    Values are unchanged; only gradients that would have been NaN/Inf can change.
    """

    nansafe = True
    unresolved = True

    def __enter__(self):
        report = super().__enter__()
        tracer = self.tracer
        assert tracer is not None
        tracer.sz = sz_edges  # type: ignore[attr-defined]
        self.repairer = _Repairer(tracer)
        tracer.before_backward = self.repairer.prepare  # type: ignore[attr-defined]
        return report

    def finish(self, tracer: Tracer) -> None:
        self.repairer.remove()
        super().finish(tracer)
        by_node: dict[int, list] = {}
        for tag, node, n, name in self.repairer.repairs:
            e = by_node.setdefault(id(node), [tag, node, 0, name])
            e[2] += n
        for tag, _node, n, name in by_node.values():
            hit = _hit(tag)
            ev = Repair(
                backend=BACKEND,
                rule=Rule.STRUCTURAL,
                op=(tag.op or tag.name) if tag else name,
                where=tag.frame if tag else None,
                backend_op=name,
                entry_id=hit.entry_id if hit else None,
                count=n,
                size=int(hit.mask.size) if hit else 0,
                scope=_scope(tag, {}),
                node=name,
            )
            self.report.findings.append(build(ev))
        if not by_node and any(f.kind in ("nonfinite", "unresolved") for f in self.report.findings):
            # the user asked for repairs: say that none was made, and why (one line)
            self.report.notes.append(NO_REPAIR)
