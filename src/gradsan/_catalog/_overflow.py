"""``float16-overflow``: an op whose float16/bfloat16 output is inf from finite inputs, where
float32 would have stayed finite. Numpy only; keyed by canonical op (a backend maps its own
names first: lax's ``add_any`` is ``add``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._classify import Hit

_HALF = ("float16", "bfloat16")

# Elementwise ops whose float32 result can be recomputed: an inf that float32 also gives is
# the op's own overflow (exp-overflow), not a float16 one.
FLOAT32_REFERENCE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "square": np.square,
    "exp": np.exp,
    "exp2": np.exp2,
    "expm1": np.expm1,
    "pow": np.power,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tan": np.tan,
}


def classify_overflow(op: str, operands: Sequence[Any], out: Any, dtype: Any = None) -> Hit | None:
    """A ``float16-overflow`` hit where ``out`` is +-inf although every operand is finite and
    the output dtype is float16 or bfloat16 (``dtype`` names it when ``out`` was already
    widened to float32, e.g. ``"torch.float16"``). Where ``op``'s float32 result can be
    recomputed and is inf too, that element is not a half-precision overflow."""
    if out is None:
        return None
    o = np.asarray(out)
    name = str(dtype if dtype is not None else o.dtype).rsplit(".", 1)[-1]
    if name not in _HALF:
        return None
    with np.errstate(all="ignore"):
        o32 = np.asarray(o, np.float32)
        xs = [_as_float32(x) for x in operands if x is not None]
        mask = np.isinf(o32)
        for x in xs:
            mask = mask & _finite_as(x, o32.shape)
        ref = FLOAT32_REFERENCE.get(op)
        if ref is not None and xs and len(xs) == getattr(ref, "nin", len(xs)):
            try:
                r = np.broadcast_to(ref(*xs), o32.shape)
            except ValueError:
                r = None
            if r is not None:
                mask = mask & np.isfinite(r)
    if not mask.any():
        return None
    value = None
    if xs:
        try:
            value = np.broadcast_to(xs[0], o32.shape)[mask].flat[0]
        except ValueError:
            value = np.max(np.abs(xs[0]))
    return Hit("float16-overflow", mask, 0, value)


def _as_float32(x: Any) -> np.ndarray:
    a = np.asarray(x)
    return np.asarray(a, np.float32) if a.dtype.kind in "fV" else a


def _finite_as(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | bool:
    """Elementwise finiteness in the output's shape, or one flag when shapes differ."""
    fin = np.isfinite(x) if x.dtype.kind in "fc" else np.ones(x.shape, bool)
    try:
        return np.broadcast_to(fin, shape)
    except ValueError:
        return bool(fin.all())
