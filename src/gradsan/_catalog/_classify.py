"""Predicates: given a canonical op and its operand values (numpy), which catalog entry was hit,
and at which elements. Both backends call this; it imports numpy (never jax or torch).

Contract: ``classify(op, operands, out, params)`` returns a :class:`Hit` or None.
``operands`` are numpy arrays (already broadcast-compatible); ``out`` is the op's output
(numpy) when known; ``params`` holds op parameters such as ``{"y": 0.5}`` for integer_pow/pow
exponents. ``Hit.mask`` has the output's shape and marks the elements at the singular set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass
class Hit:
    entry_id: str
    mask: np.ndarray
    operand: int = 0  # which operand the "got" values are read from
    got: str = ""  # the value seen, e.g. "0.0"

    @property
    def count(self) -> int:
        return int(self.mask.sum())

    @property
    def first_index(self) -> tuple[int, ...]:
        idx = np.argwhere(self.mask)
        return tuple(int(i) for i in idx[0]) if len(idx) else ()


Predicate = Callable[[Sequence[np.ndarray], Any, Mapping[str, Any]], "Hit | None"]
_PREDICATES: dict[str, Predicate] = {}


def predicate(*ops: str) -> Callable[[Predicate], Predicate]:
    def register(fn: Predicate) -> Predicate:
        for op in ops:
            _PREDICATES[op] = fn
        return fn

    return register


def _bcast(mask: np.ndarray, operands: Sequence[np.ndarray]) -> np.ndarray:
    shape = np.broadcast_shapes(*(np.shape(o) for o in operands))
    return np.broadcast_to(mask, shape)


def _hit(entry_id: str, mask: np.ndarray, operands, operand: int = 0) -> Hit | None:
    mask = _bcast(np.asarray(mask, dtype=bool), operands)
    if not mask.any():
        return None
    vals = np.broadcast_to(np.asarray(operands[operand]), mask.shape)[mask]
    return Hit(entry_id, mask, operand, format_value(vals.flat[0]))


def format_value(v: Any) -> str:
    v = np.asarray(v)
    if v.dtype.kind == "f" or v.dtype.kind == "V":
        f = float(v)
        if np.isnan(f):
            return "nan"
        if np.isinf(f):
            return "inf" if f > 0 else "-inf"
        return repr(f) if abs(f) < 1e6 and (f == 0 or abs(f) >= 1e-4) else f"{f:.6g}"
    return str(v.item() if v.ndim == 0 else v)


@predicate("sqrt")
def _sqrt(operands, out, params):
    x = np.asarray(operands[0])
    return _hit("sqrt-at-zero", x == 0, operands)


@predicate("div")
def _div(operands, out, params):
    return _hit("div-by-zero", np.asarray(operands[1]) == 0, operands, operand=1)


@predicate("log")
def _log(operands, out, params):
    return _hit("log-at-zero", np.asarray(operands[0]) == 0, operands)


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
    operands = [np.asarray(o) for o in operands]
    with np.errstate(all="ignore"):
        return fn(operands, out, params or {})


def known_ops() -> set[str]:
    return set(_PREDICATES)
