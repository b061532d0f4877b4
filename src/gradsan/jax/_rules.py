"""lax primitive -> canonical catalog op, and the forms an indeterminate product can take.

Backends only map names here; the mathematics is in gradsan._catalog.
"""

from __future__ import annotations

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
