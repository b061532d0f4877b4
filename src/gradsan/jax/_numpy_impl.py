"""Exactly rounded lax primitives evaluated with numpy in the interpreter.

Only operations whose IEEE result is unique (arithmetic +, -, *, /, sqrt, comparisons, selects,
shape changes) are here: numpy and XLA give the same bits, so exact zeros and infinities are
reproduced, and the interpreter skips jax's per-primitive dispatch and compilation. Everything
else (reductions, contractions, transcendental functions) is bound through jax as compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_OK_DTYPES = {
    np.dtype(t)
    for t in (
        np.float32,
        np.float64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint32,
        np.uint64,
        np.bool_,
    )
}


def _arith(fn: Callable) -> Callable:
    def impl(invals, params, dtype):
        return fn(*[np.asarray(v, dtype=dtype) for v in invals])

    return impl


def _cmp(fn: Callable) -> Callable:
    def impl(invals, params, dtype):
        a, b = (np.asarray(v) for v in invals)
        common = np.result_type(a.dtype, b.dtype)
        return fn(a.astype(common, copy=False), b.astype(common, copy=False))

    return impl


def _broadcast_in_dim(invals, params, dtype):
    x = np.asarray(invals[0])
    shape = tuple(params["shape"])
    dims = tuple(params["broadcast_dimensions"])
    expanded = [1] * len(shape)
    for src, dst in enumerate(dims):
        expanded[dst] = x.shape[src]
    return np.broadcast_to(x.reshape(expanded), shape)


def _reshape(invals, params, dtype):
    if params.get("dimensions") is not None:
        return None
    return np.reshape(np.asarray(invals[0]), tuple(params["new_sizes"]))


def _transpose(invals, params, dtype):
    return np.transpose(np.asarray(invals[0]), tuple(params["permutation"]))


def _squeeze(invals, params, dtype):
    return np.squeeze(np.asarray(invals[0]), axis=tuple(params["dimensions"]))


def _expand_dims(invals, params, dtype):
    return np.expand_dims(np.asarray(invals[0]), tuple(params["dimensions"]))


def _select_n(invals, params, dtype):
    pred, *cases = (np.asarray(v) for v in invals)
    cases = [c.astype(dtype, copy=False) for c in cases]
    if pred.dtype == np.bool_ and len(cases) == 2:
        return np.where(pred, cases[1], cases[0])
    return np.choose(pred.astype(np.int64), cases)


def _convert(invals, params, dtype):
    x = np.asarray(invals[0])
    if x.dtype.kind == "f" and np.dtype(dtype).kind in "iub":
        return None  # float -> int conversion rules differ (NaN, overflow): let XLA decide
    return x.astype(dtype)


def _integer_pow(invals, params, dtype):
    if params.get("y") != 2:
        return None
    x = np.asarray(invals[0], dtype=dtype)
    return x * x


IMPLS: dict[str, Callable[[list, dict, Any], Any]] = {
    "add": _arith(np.add),
    "add_any": _arith(np.add),
    "sub": _arith(np.subtract),
    "mul": _arith(np.multiply),
    "div": None,  # set below: integer division rounds differently
    "neg": _arith(np.negative),
    "max": _arith(np.maximum),
    "min": _arith(np.minimum),
    "abs": _arith(np.abs),
    "sqrt": _arith(np.sqrt),
    "eq": _cmp(np.equal),
    "ne": _cmp(np.not_equal),
    "lt": _cmp(np.less),
    "le": _cmp(np.less_equal),
    "gt": _cmp(np.greater),
    "ge": _cmp(np.greater_equal),
    "and": _arith(np.logical_and),
    "or": _arith(np.logical_or),
    "not": _arith(np.logical_not),
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "expand_dims": _expand_dims,
    "select_n": _select_n,
    "convert_element_type": _convert,
    "integer_pow": _integer_pow,
    "copy": _arith(lambda x: x),
    "copy_p": _arith(lambda x: x),
}


def _div(invals, params, dtype):
    if np.dtype(dtype).kind != "f":
        return None
    a, b = (np.asarray(v, dtype=dtype) for v in invals)
    return np.divide(a, b)


IMPLS["div"] = _div
IMPLS["and"] = None  # bitwise on ints in lax
IMPLS["or"] = None
IMPLS["not"] = None


def evaluate(eqn, invals: list) -> list | None:
    """The outputs of ``eqn`` computed with numpy, or None when numpy is not exact for it."""
    impl = IMPLS.get(eqn.primitive.name)
    if impl is None or eqn.primitive.multiple_results:
        return None
    aval = eqn.outvars[0].aval
    dtype = getattr(aval, "dtype", None)
    if dtype is None or dtype not in _OK_DTYPES:  # extended dtypes (typed keys) never are
        return None
    for v in invals:
        d = getattr(v, "dtype", None)
        if d is not None and d not in _OK_DTYPES:
            return None
        if (
            getattr(v, "sharding", None) is not None
            and len(getattr(v, "devices", lambda: [0])()) > 1
        ):
            return None
    with np.errstate(all="ignore"):
        out = impl(invals, eqn.params, dtype)
    if out is None:
        return None
    out = np.asarray(out)
    if out.dtype != dtype:
        out = out.astype(dtype)
    if out.shape != tuple(aval.shape):
        return None
    return [out]
