"""`gradsan.torch.sanitize`: explain, plus every kink, tie and discontinuity the gradient went
through, with the convention PyTorch chose there (and a flag when it is not admissible)."""

from __future__ import annotations

import numpy as np
import torch

from .. import _catalog
from .._catalog import _classify
from .._catalog._types import CONVENTION_KINDS
from .._events import Kink
from .._report import _messages
from .._report._build import build
from . import _conventions, _rules
from ._explain import BACKEND, Namer, _scope, explain
from ._mode import Tag, Tracer


def kink_event(
    tracer: Tracer, tag: Tag, name: str, operands: list, params: dict, paths: dict[int, str]
) -> Kink | None:
    """The kink the tracer saw at one operation, as a text-free event (None: not on a kink)."""
    if not any(isinstance(o, torch.Tensor) and o.requires_grad for o in operands):
        return None  # no gradient flows through it
    if _rules.LIBRARY in params:
        return _library_event(tag, name, operands, params[_rules.LIBRARY], paths)
    op = tag.op
    assert op is not None
    if op == "select_n":
        cond = operands[0]
        if not isinstance(cond, torch.Tensor) or cond.dtype != torch.bool:
            return None
        strict = tracer.strict_of(cond)
        if strict is None:
            return None
        mask = ~_rules.to_numpy(strict).astype(bool)
        entry_id, got, got_value = _WHERE, _messages.WHERE_EQUALITY, None
    else:
        np_ops = [None if o is None else _rules.to_numpy(o) for o in operands]
        try:
            hit = _classify.classify(op, np_ops, None, params)
        except Exception:  # an unreadable operand is not a finding
            hit = None
        if hit is None or hit.entry_id not in _KINKISH:
            return None
        mask, entry_id, got = hit.mask, hit.entry_id, hit.got
        try:
            got_value = None if hit.value is None else float(hit.value)
        except (TypeError, ValueError):
            got_value = None
    mask = np.asarray(mask, bool)
    if not mask.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(mask)[0]) if mask.ndim else ()
    return Kink(
        backend=BACKEND,
        entry_id=entry_id,
        op=op,
        primitive=name,
        where=tag.frame,
        backend_op=tag.qualname,
        got=got,
        got_value=got_value,
        count=int(mask.sum()),
        size=int(mask.size),
        index=idx,
        scope=_scope(tag, paths),
        inadmissible_convention=BACKEND in _catalog.get(entry_id).inadmissible,
    )


def _library_event(
    tag: Tag, name: str, args: list, kwargs: dict, paths: dict[int, str]
) -> Kink | None:
    """A library call at a silent convention (norm at 0, std of a constant, tied quantile,
    repeated eigenvalue, singular det, ...), with PyTorch's value there and whether it lies in
    the entry's admissible set."""
    try:
        h = _conventions.hit(name, tuple(args), kwargs, None)
    except Exception:  # an unreadable operand is not a finding
        return None
    if h is None:
        return None
    mask = np.asarray(h.mask, bool)
    if not mask.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(mask)[0]) if mask.ndim else ()
    inadm = BACKEND in _catalog.get(h.entry_id).inadmissible
    return Kink(
        backend=BACKEND,
        entry_id=h.entry_id,
        op=h.op,
        primitive=name,
        where=tag.frame,
        backend_op=tag.qualname,
        got=h.got,
        count=int(mask.sum()),
        size=int(mask.size),
        index=idx,
        library=_conventions.display_name(name),
        scope=_scope(tag, paths),
        admissible=h.admissible,
        inadmissible_convention=inadm,
        facts=h.facts,
    )


# The entries sanitize reports: kinks, ties and jumps, and PyTorch's inadmissible conventions.
_KINKISH = {
    e.id for e in _catalog.ENTRIES if e.kind in CONVENTION_KINDS or BACKEND in e.inadmissible
}
_WHERE = _catalog.by_op("where")[0].id


class sanitize(explain):
    """Like :func:`gradsan.torch.explain`, and also report every kink the computation sat on
    (kind ``"kink"``: abs/relu at 0, max/min/sort/topk ties, clamp at a bound, floor/round at a
    jump, ``torch.where`` on its boundary) and every PyTorch convention outside the admissible
    set (kind ``"convention"``: atan2's ``[0, 0]`` at the origin, det's gradient at a singular
    matrix). If it reports nothing, plain autograd returned the true derivative.
    Same two forms: ``with gradsan.torch.sanitize() as report:`` or ``sanitize(fn)(*args)``.
    """

    kinks = True

    def finish(self, tracer: Tracer) -> None:
        super().finish(tracer)
        paths = Namer().module_paths(list(self.modules) + tracer.roots)
        seen: set[tuple] = set()
        for tag, name, (operands, params) in tracer.kink_hits:
            ev = kink_event(tracer, tag, name, list(operands), dict(params), paths)
            if ev is None:
                continue
            f = build(ev)
            k = (
                f.catalog_id,
                f.where.file if f.where else None,
                f.where.line if f.where else None,
                f.where.column if f.where else None,
            )
            if k in seen:
                continue
            seen.add(k)
            self.report.findings.append(f)
