"""float16 / bfloat16 overflow in the backward pass: an aten op of a Node whose half-precision
output is inf from finite operands where float32 would stay finite (``2 * y * g`` of a square
whose gradient passes 65504). The forward pass has its own check (torch/_explain.py's
``_overflow``, on the call's operands); the backward's operands live only while the op runs,
so the hit is taken there, when the op's output is non-finite (never on the per-op path).
JAX's report calls it float16-overflow at the forward op's line; so does this."""

from __future__ import annotations

import torch

from .._catalog._classify import Hit
from .._catalog._overflow import classify_overflow
from . import _rules

_HALF = (torch.float16, torch.bfloat16)


def backward_overflow(aten_name: str, args: tuple, out: torch.Tensor) -> Hit | None:
    """The catalog's float16-overflow hit of a backward op (``"aten.mul"``) or None."""
    if out.dtype not in _HALF:
        return None
    op = aten_name.rsplit(".", 1)[-1].rstrip("_")
    operands = [
        _rules.to_numpy(a) if isinstance(a, torch.Tensor) else a
        for a in args
        if isinstance(a, (torch.Tensor, int, float)) and not isinstance(a, bool)
    ]
    try:
        return classify_overflow(op, operands, _rules.to_numpy(out), str(out.dtype))
    except (TypeError, ValueError):
        return None
