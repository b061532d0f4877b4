"""Where an intentional -inf mask becomes a finding: an op that reads only intentional
infinities (a ``torch.where(mask, x, -inf)``, a ``masked_fill``) and is singular at those values
by the catalog (logsumexp of a fully masked row: log(0) = -inf, gradient exp(-inf - (-inf))) is
where the problem is born, as in JAX, whose report names logsumexp there. The mask that brought
the -inf stays intentional: not the problem by itself.

A kink or tie at those values (max of an all -inf row ties every element) is not: the value
is the mask's own -inf passed on."""

from __future__ import annotations

from typing import Any

from .._catalog import _classify
from .._catalog._types import CONVENTION_KINDS
from . import _rules


def born_of_masks(tag: Any) -> bool:
    """``tag``'s op, reading intentional infinities only, is singular there by the catalog."""
    if tag is None or tag.op is None or not tag.operands:
        return False
    try:
        operands = [_rules.to_numpy(o) for o in tag.operands if o is not None]
        hit = _classify.classify(tag.op, operands, None, dict(tag.params))
    except Exception:  # a predicate that cannot read these operands: the mask passed on
        return False
    if hit is None:
        return False
    from .. import _catalog

    return _catalog.get(hit.entry_id).kind not in CONVENTION_KINDS
