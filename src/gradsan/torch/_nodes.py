"""The backward at the level of autograd Nodes: one hook per Node instead of a dispatch mode on
every aten op (guard's replay, where the time to the report counts).

Each Node's post-hook sees what came in (its grad_outputs) and what it computed (its
grad_inputs). A Node that only passes NaN/Inf on becomes one event per non-finite output,
linked to the events of its inputs, which is all the blame needs. Only a Node where a
non-finite value is born (finite inputs, or a NaN from inputs without one) is run again, inside
its own post-hook (its saved tensors are still alive there), under the tracer's dispatch mode:
its aten ops give the op, the indeterminate form and where the zero came from, exactly as a
fully traced backward would; its recomputed outputs, made what the engine makes of a Node's
(summed to each input's shape, cast to its dtype), replace the originals only when they hold the
very same bits, so the Nodes after it read the tensors the events name and the user's backward
computes what it computes without gradsan. A Node's record of an exact zero it made lists the
forward values it saved that hold zeros, as its aten ops would (torch/_zero.py walks them).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from . import _compat
from ._counts import memo_of, verdicts
from ._mode import (
    ACCUMULATE,
    Event,
    External,
    Tracer,
    dispatch_mode,
    is_float,
    key,
    nonfinite,
)
from ._zero import _DROPS, _PASS_NODES, _PRODUCTS, _SELECTS, has_zero, record_backward


def _classify(t: torch.Tensor, total: float, nan_in: bool = False) -> bool | None:
    """``nonfinite(t)`` given ``t.sum()``: one more reduction only when the sum is not finite.
    ``nan_in``: the Node read a NaN, so a NaN sum is taken for a NaN (nothing can be born
    there; the flag only says what it passes on)."""
    if math.isfinite(total):
        return None
    if total != total:  # NaN, or inf - inf
        if nan_in or bool(torch.isnan(t).any()):
            return True
        return False if bool(torch.isinf(t).any()) else None
    return False if bool(torch.isinf(t).any()) else None  # +-inf, or an overflow


def _nonfinite_all(ts: list[torch.Tensor], nan_in: bool = False) -> list[bool | None]:
    """``nonfinite`` of each tensor, with one fused sum (one sync) for all of them."""
    if not ts:
        return []
    if all(t.is_floating_point() and t.numel() for t in ts):
        dt, dev = ts[0].dtype, ts[0].device
        if all(t.dtype == dt and t.device == dev for t in ts):
            sums = (torch.stack([t.sum() for t in ts]) if len(ts) > 1 else ts[0].sum()).tolist()
            sums = sums if isinstance(sums, list) else [sums]
            bad = [i for i, v in enumerate(sums) if not math.isfinite(v)]
            if len(bad) > 1:
                return _classify_all(ts, sums, bad, nan_in)
            return [_classify(t, v, nan_in) for t, v in zip(ts, sums)]
    return [nonfinite(t) for t in ts]


def _classify_all(
    ts: list[torch.Tensor], sums: list[float], bad: list[int], nan_in: bool
) -> list[bool | None]:
    """``_classify`` of each tensor, the exact checks of the non-finite sums in one stack (one
    sync): a NaN sum asks ``isnan`` (unless ``nan_in``), a +-inf sum ``isinf``."""
    out: list[bool | None] = [None] * len(ts)
    ask_nan = [i for i in bad if sums[i] != sums[i] and not nan_in]
    ask_inf = [i for i in bad if sums[i] == sums[i]]
    checks = [torch.isnan(ts[i]).any() for i in ask_nan] + [
        torch.isinf(ts[i]).any() for i in ask_inf
    ]
    flags = torch.stack(checks).tolist() if checks else []
    has_nan = dict(zip(ask_nan, flags[: len(ask_nan)]))
    has_inf = dict(zip(ask_inf, flags[len(ask_nan) :]))
    for i in bad:
        if i in has_inf:  # +-inf, or an overflow
            out[i] = False if has_inf[i] else None
        elif nan_in or has_nan[i]:  # NaN, or inf - inf
            out[i] = True
        else:
            out[i] = False if bool(torch.isinf(ts[i]).any()) else None
    return out


_FINITE_KEPT = 16


def _as_engine(a: Any, o: Any) -> Any:
    """``a``, a Node's raw output, as the engine hands it on where it handed on ``o``: reduced
    to ``o``'s shape (torch's ``validate_outputs``: ``at::sum_to``, which ``sum_to_size``
    runs), cast to ``o``'s dtype and device. None where the engine sent None."""
    if not isinstance(o, torch.Tensor) or not isinstance(a, torch.Tensor):
        return None if o is None else a
    if a.shape != o.shape:
        a = a.sum_to_size(o.shape)
    if a.dtype != o.dtype:
        a = a.to(o.dtype)
    if a.device != o.device:
        a = a.to(o.device)
    return a


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: Any, o: Any) -> bool:
    """``a`` holds exactly ``o``'s values, bit for bit (a NaN's payload and the sign of a zero
    too), or both are None."""
    if a is None or o is None:
        return a is None and o is None
    if not isinstance(a, torch.Tensor) or not isinstance(o, torch.Tensor):
        return False
    if a.shape != o.shape or a.dtype != o.dtype or a.device != o.device:
        return False
    if a is o or not a.numel():
        return True
    if not (is_float(a) and is_float(o)):
        return bool(torch.equal(a, o)) if not (a.is_meta or o.is_meta) else False
    if a.is_complex():
        a, o = torch.view_as_real(a), torch.view_as_real(o)
    bits = _BITS.get(a.element_size())
    if bits is None:
        return False
    try:
        return bool(torch.equal(a.contiguous().view(bits), o.contiguous().view(bits)))
    except RuntimeError:  # a layout without a bit view (sparse): not checkable, not the same
        return False


_SAVED: dict[type, tuple[str, ...]] = {}  # a Node type -> the names of what it saves


def _saved_zeros(node: Any, o: torch.Tensor) -> list[torch.Tensor]:
    """The forward values ``node`` saved that hold an exact zero and can be the zero factor of
    its output ``o`` (one whose zeros ``o`` does not all share is not): what the aten ops of
    the Node read, so the zero's record of a Node not traced op by op ends where a fully
    traced backward's does (``x / y``'s gradient for ``y`` reads ``x``; ``x ** 2``'s, ``x``;
    relu's, its result)."""
    names = _SAVED.get(type(node))
    if names is None:
        nm = node.name()
        # a where's, a slice's, a view's or a sum's zeros are the grad's or its own: the walk
        # reads no forward value there (torch/_zero.py)
        passes = nm.startswith(_SELECTS + _DROPS + _PASS_NODES) and not nm.startswith(_PRODUCTS)
        names = () if passes else tuple(n for n in dir(node) if n.startswith("_saved_"))
        _SAVED[type(node)] = names
    out: list[torch.Tensor] = []
    if not names:
        return out
    with _compat.disable_torch_function():  # gradsan's own reads: not the user's ops
        for name in names:
            try:
                v = getattr(node, name)
            except RuntimeError:  # freed (a Node that ran before), or not a tensor to unpack
                continue
            if not isinstance(v, torch.Tensor) or not is_float(v) or not has_zero(v):
                continue
            if v.shape == o.shape and bool(((v == 0) & (o != 0)).any()):
                continue
            out.append(v)
    return out


def writes_grad(n: Any) -> bool:
    """``n`` is an AccumulateGrad (it has ``.variable``; torch's other C++ Nodes do not, so
    only Python-defined Nodes are asked)."""
    t = type(n)
    if t is ACCUMULATE:
        return True
    if t.__module__ == "builtins" and ACCUMULATE is not None:
        return False
    return hasattr(n, "variable")


def _tag_of(node: Any) -> Any:
    try:
        return node.metadata.get("gradsan")
    except (AttributeError, RuntimeError):
        return None


class NodeHooks:
    """Hooks on every Node a backward from ``roots`` runs; ``remove()`` after it."""

    def __init__(self, tracer: Tracer, roots: list[torch.Tensor]) -> None:
        self.tracer = tracer
        self.handles: list[Any] = []
        self.accumulate: list[tuple[Any, torch.Tensor]] = []  # (AccumulateGrad, incoming)
        # (id(Node), input slot) -> the events of the non-finite values sent there: the engine
        # sums what several Nodes send to one slot out of any Node's sight
        self.sent: dict[tuple[int, int], list[Event]] = {}
        # id -> (tensor, version): outputs a Node found finite, for the Node that receives them
        self.finite: dict[int, tuple[torch.Tensor, int]] = {}
        self.fresh: set[int] = set()  # id(AccumulateGrad) whose variable had no .grad before
        seen: set[int] = set()
        stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while stack:
            n = stack.pop()
            if n is None or id(n) in seen:
                continue
            seen.add(id(n))
            if writes_grad(n):  # AccumulateGrad: writes .grad
                self.handles.append(n.register_prehook(self._accumulating(n)))
                continue
            self.handles.append(n.register_hook(self._post(n)))
            stack.extend(m for m, _ in n.next_functions if m is not None)

    def _accumulating(self, node: Any) -> Any:
        def prehook(grad_outputs: tuple) -> None:
            if node.variable.grad is None:  # what it writes is then a copy of what came in
                self.fresh.add(id(node))
            sent = self.sent.get((id(node), 0))  # the events traced Nodes sent here
            for g in grad_outputs:
                if isinstance(g, torch.Tensor):
                    self.accumulate.append((node, g))
                    if sent and is_float(g):
                        kg = key(g)
                        if kg not in self.tracer.events and nonfinite(g) is not None:
                            self.tracer.events[kg] = self._sum(node, g, sent)

        return prehook

    def _post(self, node: Any) -> Any:
        tr = self.tracer

        def hook(grad_inputs: tuple, grad_outputs: tuple) -> Any:
            ins: list[tuple[torch.Tensor, Any]] = []
            nan_in = False
            unknown: list[tuple[int, torch.Tensor, Any]] = []
            passed: set[Any] = set()
            for slot, g in enumerate(grad_outputs):
                if not isinstance(g, torch.Tensor):
                    continue
                kg = key(g)
                passed.add(kg)
                if not is_float(g):
                    continue
                prod = tr.events.get(kg)
                if prod is not None:
                    ins.append((g, prod))
                    nan_in = nan_in or prod.nan
                elif not self._known_finite(g):
                    unknown.append((slot, g, kg))
            for (slot, g, kg), nf in zip(unknown, _nonfinite_all([g for _, g, _ in unknown])):
                if nf is None:
                    continue
                sent = self.sent.get((id(node), slot))
                if sent:  # a sum the engine formed: its summands' events
                    ev = tr.events[kg] = self._sum(node, g, sent)
                    ins.append((g, ev))
                else:
                    ins.append((g, tr.fwd.get(kg) or External(g)))
                nan_in = nan_in or nf
            floats: list[tuple[torch.Tensor, Any]] = [
                (o, key(o)) for o in grad_inputs if isinstance(o, torch.Tensor) and is_float(o)
            ]
            for o, k in floats:
                if k not in passed:  # a gradient passed on as it is keeps its owner
                    tr.owner[k] = node
                    if k not in tr.zero_bwd:  # where an exact zero was made (the zero's end)
                        zin = (*grad_outputs, *_saved_zeros(node, o)) if has_zero(o) else ()
                        record_backward(tr, node.name(), node, zin, {}, o)
            # an output an inner trace already explains (a backward the Node ran inside itself,
            # as reentrant checkpoint does) keeps its event
            floats = [(o, k) for o, k in floats if k not in tr.events]
            flags = _nonfinite_all([o for o, _ in floats], nan_in)
            outs = [(o, nf) for (o, _), nf in zip(floats, flags) if nf is not None]
            if not outs:
                for o, _ in floats:  # finite: the Node that receives it need not check it again
                    self._finite(o)
                self._send(node, grad_inputs)  # (an output may pass an input on as it is)
                return None
            born = not ins or any(nf and not nan_in for _, nf in outs)
            if born and all(isinstance(g, torch.Tensor) for g in grad_outputs):
                again = self._again(node, grad_inputs, grad_outputs)
                if again is not None:
                    self._send(node, again)
                    return again
            tag = _tag_of(node)
            name = node.name()
            for o, nf in outs:
                ev = Event("backward", name, tag, node, o, list(ins), nan=nf)
                ev.nan_new = nf and not nan_in
                tr.events[key(o)] = ev
            self._send(node, grad_inputs)
            return None

        return hook

    def _again(self, node: Any, grad_inputs: tuple, grad_outputs: tuple) -> tuple | None:
        """``node`` run again under the dispatch mode, its outputs made what the engine made of
        the Node's own: a Node called from Python returns its raw outputs, the engine then
        reduces a broadcast gradient to its input's shape (``sum_to_size``: a Linear's bias,
        an add that broadcast) and casts it to its dtype and device. Those steps run under the
        mode too (a NaN can be born in that sum: ``inf + -inf``). None unless every output has
        the very bits of the engine's (the re-run is for observation only: what the user's
        backward computes never changes); then the events the re-run made are dropped."""
        tr = self.tracer
        made = set(tr.events)
        again: Any = None
        try:
            with dispatch_mode(tr):  # the Node again, its aten ops seen one by one
                raw = node(*grad_outputs)
                raw = raw if isinstance(raw, tuple) else (raw,)
                if len(raw) == len(grad_inputs):
                    again = tuple(_as_engine(a, o) for a, o in zip(raw, grad_inputs))
        except Exception:  # a Node Python cannot call (a custom Function's), a shape not
            again = None  # reducible to the engine's
        if again is not None and all(_same_bits(a, o) for a, o in zip(again, grad_inputs)):
            return again
        for k in [k for k in tr.events if k not in made]:
            del tr.events[k]
        return None

    def _known_finite(self, g: torch.Tensor) -> bool:
        """``g`` is a tensor a Node just sent on and found finite, unchanged since (the same
        tensor, the same version: an engine that adds into it in place bumps the version)."""
        got = self.finite.get(id(g))
        return got is not None and got[0] is g and got[1] == g._version

    def _finite(self, o: torch.Tensor) -> None:
        finite = self.finite
        finite[id(o)] = (o, o._version)
        if len(finite) > _FINITE_KEPT:  # the oldest out: a few tensors kept alive at most
            del finite[next(iter(finite))]

    def _send(self, node: Any, outs: tuple) -> None:
        """Remember which events went to which Node's input slot."""
        events = self.tracer.events
        for (nxt, slot), o in zip(node.next_functions, outs):
            if nxt is None or not isinstance(o, torch.Tensor) or not is_float(o):
                continue
            ev = events.get(key(o))
            if ev is not None:
                self.sent.setdefault((id(nxt), slot), []).append(ev)

    def _sum(self, node: Any, g: torch.Tensor, sent: list[Event]) -> Event:
        nan = bool(torch.isnan(g).any())
        inputs = [(e.out, e) for e in sent]
        ev = Event("backward", "aten.add", None, node, g, inputs, nan=nan)
        ev.nan_new = nan and not any(e.nan for e in sent)
        return ev

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        tr = self.tracer
        # the .grad an AccumulateGrad wrote (a copy of what came in, or the same tensor)
        todo = []
        for node, g in self.accumulate:
            grad = node.variable.grad
            if grad is None or not is_float(grad):
                continue
            kgrad = key(grad)
            if kgrad not in tr.events:
                todo.append((node, g, grad, kgrad))
        flags = verdicts([grad for _, _, grad, _ in todo], memo_of(tr))  # one check for all
        for (node, g, grad, kgrad), nf in zip(todo, flags):
            var = node.variable
            if nf is None or kgrad in tr.events:
                continue
            kg = key(g)
            prod = tr.events.get(kg) or tr.fwd.get(kg)
            if prod is None:
                continue
            tr.events[kgrad] = Event(
                "backward", "aten.copy_", None, node, grad, [(g, prod)], nan=nf
            )
            tr.leaves.setdefault(id(var), var)
        self.accumulate = []
