"""lax primitive -> canonical catalog op, and the forms an indeterminate product can take.

Backends only map names here; the mathematics is in gradsan._catalog.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from .. import _catalog
from .interpreter._core import _is_library_body, library_name

# lax primitive name -> canonical op name understood by gradsan._catalog._classify
PRIMITIVE_OPS: dict[str, str] = {
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "cbrt": "cbrt",
    "pow": "pow",
    "integer_pow": "integer_pow",
    "div": "div",
    "log": "log",
    "log1p": "log1p",
    "exp": "exp",
    "expm1": "expm1",
    "atan2": "atan2",
    "acos": "acos",
    "asin": "asin",
    "atanh": "atanh",
    "acosh": "acosh",
    "tan": "tan",
    "lgamma": "lgamma",
    "digamma": "digamma",
    "erf_inv": "erf_inv",
    "abs": "abs",
    "sign": "sign",
    "max": "max",
    "min": "min",
    "floor": "floor",
    "ceil": "ceil",
    "round": "round",
    "clamp": "clamp",
}

# -- sanitize: primitives with a kink, tie or jump ------------------------------------------

# lax primitive name -> canonical op of the kink masks in gradsan._catalog._classify
KINK_OPS: dict[str, str] = {
    "abs": "abs",
    "bessel_i0e": "i0e",
    "sign": "sign",
    "max": "max",
    "min": "min",
    "clamp": "clamp",
    "reduce_max": "reduce_max",
    "reduce_min": "reduce_min",
    "argmax": "argmax",
    "argmin": "argmin",
    "sort": "sort",
    "top_k": "top_k",
    "cummax": "cummax",
    "cummin": "cummin",
    "reduce_window_max": "reduce_window_max",
    "reduce_window_min": "reduce_window_min",
    "floor": "floor",
    "ceil": "ceil",
    "round": "round",
    "convert_element_type": "trunc",
    "eigh": "eigh",
    "svd": "svd",
    "atan2": "atan2",
}
# comparisons whose equality is a select_n's boundary
COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# Library functions summarized as one operation (their internals would report several kinks).
LIBRARY_OPS = {"clip-at-bound": "clamp", "hypot-at-origin": "hypot"}


def is_float(x: Any) -> bool:
    dt = getattr(x, "dtype", None)
    return dt is not None and jnp.issubdtype(dt, jnp.inexact)


def kink_op(eqn: Any, invals: list, deps: list) -> str | None:
    """The canonical op of a primitive that can sit on a kink, tie or jump at these operands
    (float -> int casts only; a sort only of a value that depends on the inputs), or None."""
    name = eqn.primitive.name
    op = KINK_OPS.get(name)
    if op is None:
        return None
    if name == "convert_element_type":
        if not is_float(invals[0]) or np.dtype(eqn.params["new_dtype"]).kind not in "iub":
            return None
    if name == "sort" and not deps[0]:
        return None
    return op


def kink_params(prim: str, params: dict) -> dict:
    """The params of a kink primitive that its mask reads."""
    p: dict[str, Any] = {}
    if prim in ("reduce_max", "reduce_min", "argmax", "argmin"):
        p["axes"] = tuple(params.get("axes", ()))
    elif prim == "sort":
        p["dimension"] = params.get("dimension", -1)
    elif prim == "top_k":
        p["k"] = params.get("k")
        ax = params.get("axis")
        p["axis"] = -1 if ax is None else ax
    elif prim in ("cummax", "cummin"):
        p["axis"] = params.get("axis", 0)
        p["reverse"] = params.get("reverse", False)
        p["_min"] = prim == "cummin"
    elif prim in ("reduce_window_max", "reduce_window_min"):
        p.update(
            {
                k: params.get(k)
                for k in (
                    "window_dimensions",
                    "window_strides",
                    "padding",
                    "base_dilation",
                    "window_dilation",
                )
            }
        )
        p["_min"] = prim == "reduce_window_min"
    elif prim == "convert_element_type":
        p["to_bool"] = np.dtype(params["new_dtype"]) == np.bool_
    return p


def is_boundary(eqn: Any, invals: list) -> bool:
    """Whether a comparison can sit on the boundary of a continuous function's pieces: integer
    comparisons are discrete, and a value compared with itself (``isnan`` is ``x != x``) is
    constant around every finite point."""
    if not (is_float(invals[0]) or is_float(invals[1])):
        return False
    a, b = eqn.invars[0], eqn.invars[1]
    return not (a is b and not isinstance(a, jcore.Literal))


def call_library(eqn: Any, jaxpr: Any) -> str | None:
    """The library function a jit's body implements (``jnp.clip``), as sanitize names it: only
    jit calls are named (a custom_jvp body stays unnamed), None for user code."""
    name = eqn.primitive.name
    if name not in ("pjit", "jit") or not _is_library_body(jaxpr):
        return None
    fname = str(eqn.params.get("name", name))
    lib = library_name(jaxpr, fname)
    if lib is None and fname in ("clip", "hypot"):
        lib = f"jnp.{fname}"
    return lib


def library_operands(library: str | None, eqn: Any, invals: list, deps: list) -> tuple | None:
    """(op, operands, deps) of a library call reported as one operation (jnp.clip, jnp.hypot),
    in the catalog's operand order; None for any other call."""
    if library is None or eqn.primitive.name not in ("pjit", "jit"):
        return None
    entry = _catalog.for_library(library)
    if entry is None or entry.id not in LIBRARY_OPS:
        return None
    op = LIBRARY_OPS[entry.id]
    if op == "clamp":
        if len(invals) != 3:
            return None
        # jnp.clip(x, lo, hi) -> clamp(lo, x, hi)
        return op, [invals[1], invals[0], invals[2]], (deps[1], deps[0], deps[2])
    if len(invals) != 2:
        return None
    return op, list(invals), tuple(deps)


# Primitives whose NaN from non-NaN inputs has a name.
PRODUCT_PRIMS = {"mul", "dot_general", "conv_general_dilated"}
SUM_PRIMS = {"add", "add_any", "sub", "reduce_sum", "cumsum"}


def canonical_op(prim_name: str) -> str | None:
    return PRIMITIVE_OPS.get(prim_name)


def params_for(prim_name: str, params: dict) -> dict:
    if prim_name == "integer_pow":
        return {"y": params.get("y")}
    return {}


# -- nansafe ---------------------------------------------------------------------------------
# the forward primitive a backward 0 * inf (or 0 / 0) comes from -> its catalog entry
NANSAFE_ENTRY: dict[str, str] = {
    "sqrt": "sqrt-at-zero",
    "rsqrt": "rsqrt-at-zero",
    "cbrt": "cbrt-at-zero",
    "pow": "pow-fractional-at-zero",
    "integer_pow": "integer-pow-negative-at-zero",
    "div": "div-by-zero",
    "log": "log-at-zero",
    "log1p": "log1p-at-minus-one",
    "acos": "acos-at-one",
    "asin": "asin-at-one",
    "atanh": "atanh-at-one",
    "acosh": "acosh-at-one",
    "tan": "tan-at-pole",
    "atan2": "atan2-at-origin",
    "lgamma": "lgamma-at-pole",
    "digamma": "digamma-at-pole",
    "erf_inv": "erf-inv-at-one",
}
