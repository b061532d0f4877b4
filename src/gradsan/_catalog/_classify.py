"""Which catalog entry an op hit at these operand values, and at which elements. Both backends
call :func:`classify`; it imports numpy (never jax or torch) and formats no text.

Contract: ``classify(op, operands, out, params)`` returns a :class:`Hit` or None.
``operands`` are numpy arrays (already broadcast-compatible); ``out`` is the op's output
(numpy) when known; ``params`` holds op parameters such as ``{"y": -2}`` for integer_pow.
``Hit.mask`` has the output's shape and marks the elements at the singular set (for sort and
top_k, the input's shape).

Operands, in lax order: ``pow`` (base, exponent), ``div`` (x, y), ``xlogy`` (x, y), ``atan2``
(y, x), ``max``/``min``/``hypot`` (x, y), ``clamp`` (lo, x, hi) with None for a missing bound,
``where`` (lhs, rhs) of the comparison that chose the branch, ``eigh``/``svd``/``det`` (matrix,);
all others (x,). Params: ``integer_pow`` needs ``y``; ``pow`` takes ``exponent_grad`` (flag the
exponent's derivative at a 0 base); reductions and ``sort``/``top_k``/``softmax`` read ``axes``
(lax), ``axis`` or ``dim`` (torch), ``keepdims``/``keepdim``, ``k``, ``largest``; ``std``/``var``
read ``ddof``, ``correction`` or ``unbiased``. ``exp``, ``expm1`` and ``tan`` use ``out`` when
given (non-finite output from a finite input), else the input's dtype limits.
``gradsan._catalog._overflow.classify_overflow`` is separate: any op, half-precision output.

The predicates are registered next to their entries (``entries/<family>.py``): :func:`rule`
binds an elementwise op to its entries in priority order, each with its set from ``_masks``;
:func:`predicate` registers a numpy function for the ops whose set is not elementwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._masks import Mask, axes_of, keepdims_of, missing
from ._types import Singularity


@dataclasses.dataclass
class Hit:
    entry_id: str
    mask: np.ndarray
    operand: int = 0  # which operand the "got" value is read from
    value: Any = None  # that operand's value at the first hit (None: not known)

    @property
    def got(self) -> str:
        """The value seen, as reports quote it (``"0.0"``); "" when not known."""
        if self.value is None:
            return ""
        from .._report._format import format_value

        return format_value(self.value)

    @property
    def count(self) -> int:
        return int(self.mask.sum())

    @property
    def first_index(self) -> tuple[int, ...]:
        idx = np.argwhere(self.mask)
        return tuple(int(i) for i in idx[0]) if len(idx) else ()


Predicate = Callable[[Sequence[np.ndarray], Any, Mapping[str, Any]], "Hit | None"]
_PREDICATES: dict[str, Predicate] = {}
# op -> the entry ids its predicate can return, in priority order
_ENTRY_IDS: dict[str, tuple[str, ...]] = {}


def predicate(*ops: str, entries: Sequence[Singularity] = ()) -> Callable[[Predicate], Predicate]:
    """Register ``fn(operands, out, params) -> Hit | None`` for these canonical ops;
    ``entries`` are the entries it can return (for :func:`entry_ids`)."""

    def register(fn: Predicate) -> Predicate:
        for op in ops:
            _PREDICATES[op] = fn
            _ENTRY_IDS[op] = tuple(e.id for e in entries)
        return fn

    return register


def rule(op: str, *cases: tuple[Singularity, Mask] | tuple[Singularity, Mask, int]) -> None:
    """Bind an elementwise ``op`` to its entries: the first case whose set holds anywhere wins.
    A case is ``(entry, mask)`` or ``(entry, mask, operand)``, ``operand`` being the one whose
    value is quoted (default 0)."""
    steps = [(c[0].id, c[1], c[2] if len(c) > 2 else 0) for c in cases]  # type: ignore[misc]

    def fn(operands: Sequence[np.ndarray], out: Any, params: Mapping[str, Any]) -> Hit | None:
        for entry_id, m, operand in steps:
            h = hit(entry_id, m(np, operands, params), operands, operand)
            if h is not None:
                return h
        return None

    predicate(op, entries=[c[0] for c in cases])(fn)


# ---- helpers for the predicates ------------------------------------------------------------


def hit(entry_id: str, mask: Any, operands: Sequence[Any], operand: int = 0) -> Hit | None:
    """A hit whose mask broadcasts against the operands."""
    shape = np.broadcast_shapes(*(np.shape(o) for o in operands))
    m = np.broadcast_to(np.asarray(mask, dtype=bool), shape)
    if not m.any():
        return None
    vals = np.broadcast_to(np.asarray(operands[operand]), m.shape)[m]
    return Hit(entry_id, m, operand, vals.flat[0])


def hit_at(entry_id: str, mask: Any, values: Any, operand: int = 0) -> Hit | None:
    """A hit whose mask already has the output's shape; ``values`` has the same shape."""
    m = np.asarray(mask, dtype=bool)
    if not m.any():
        return None
    return Hit(entry_id, m, operand, np.asarray(values)[m].flat[0])


def first(*hits: Hit | None) -> Hit | None:
    """The first hit in priority order."""
    return next((h for h in hits if h is not None), None)


def real(x: np.ndarray) -> bool:
    return x.dtype.kind in "fiub"


def eps(x: np.ndarray) -> float:
    return float(np.finfo(x.dtype).eps) if x.dtype.kind == "f" else float(np.finfo(np.float64).eps)


def reduce(
    mask: np.ndarray,
    values: np.ndarray,
    x: np.ndarray,
    params: Mapping[str, Any],
    how: Callable[..., Any] = np.all,
    default: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Reduce an elementwise condition over the op's axes: (mask, values) in the output shape."""
    axes = axes_of(x, params, default)
    keep = keepdims_of(params)
    return how(mask, axis=axes, keepdims=keep), np.max(values, axis=axes, keepdims=keep)


# ---- classify ------------------------------------------------------------------------------


def classify(
    op: str,
    operands: Sequence[Any],
    out: Any = None,
    params: Mapping[str, Any] | None = None,
) -> Hit | None:
    """The catalog entry ``op`` hit at these operand values, or None."""
    fn = _PREDICATES.get(op)
    if fn is None:
        return None
    arrays = [_as_array(o) for o in operands]
    if not arrays or missing(arrays[0]) and op != "clamp":
        return None
    with np.errstate(all="ignore"):
        return fn(arrays, out, params or {})  # type: ignore[arg-type]


def _as_array(o: Any) -> np.ndarray | None:
    if o is None:
        return None
    a = np.asarray(o)
    if a.dtype.kind == "V":  # ml_dtypes (bfloat16) arrays: compare in float32
        a = np.asarray(a, np.float32)
    return a


def known_ops() -> set[str]:
    return set(_PREDICATES)


def entry_ids(op: str) -> tuple[str, ...]:
    """The entry ids ``classify(op, ...)`` can return, in priority order (() if none)."""
    return _ENTRY_IDS.get(op, ())
