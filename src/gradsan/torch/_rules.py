"""torch function / autograd Node -> canonical catalog op, and the operand values to classify.

Backends only map names here; the mathematics (explanations, fixes, the singular and kink
sets, which conventions are admissible) is in gradsan._catalog.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _catalog
from .._catalog import _ops
from ._conventions import LIBRARY_FUNCS

# torch function name (``func.__name__`` as a TorchFunctionMode sees it) -> canonical op.
FUNC_OPS: dict[str, str] = {
    "sqrt": "sqrt",
    "sqrt_": "sqrt",
    "rsqrt": "rsqrt",
    "rsqrt_": "rsqrt",
    "div": "div",
    "div_": "div",
    "divide": "div",
    "true_divide": "div",
    "__truediv__": "div",
    "__itruediv__": "div",
    "__rtruediv__": "div",
    "__rdiv__": "div",
    "reciprocal": "div",
    "reciprocal_": "div",
    "log": "log",
    "log_": "log",
    "log2": "log",
    "log10": "log",
    "log1p": "log1p",
    "exp": "exp",
    "exp2": "exp",
    "expm1": "expm1",
    "pow": "pow",
    "pow_": "pow",
    "__pow__": "pow",
    "__ipow__": "pow",
    "__rpow__": "pow",
    "float_power": "pow",
    "atan2": "atan2",
    "arctan2": "atan2",
    "acos": "acos",
    "arccos": "acos",
    "asin": "asin",
    "arcsin": "asin",
    "atanh": "atanh",
    "arctanh": "atanh",
    "acosh": "acosh",
    "arccosh": "acosh",
    "tan": "tan",
    "lgamma": "lgamma",
    "digamma": "digamma",
    "erfinv": "erf_inv",
    # kinks
    "abs": "abs",
    "absolute": "abs",
    "__abs__": "abs",
    "relu": "relu",
    "relu_": "relu",
    "sign": "sign",
    "maximum": "max",
    "minimum": "min",
    "fmax": "max",
    "fmin": "min",
    "max": "reduce_max",
    "min": "reduce_min",
    "amax": "reduce_max",
    "amin": "reduce_min",
    "clamp": "clamp",
    "clip": "clamp",
    "clamp_": "clamp",
    "clamp_min": "clamp",
    "clamp_max": "clamp",
    "clamp_min_": "clamp",
    "clamp_max_": "clamp",
    "hardtanh": "clamp",
    "hardtanh_": "clamp",
    "relu6": "clamp",
    # the fused piecewise activations (their corners: _catalog.entries.kinks)
    "leaky_relu": "activation",
    "leaky_relu_": "activation",
    "elu": "activation",
    "elu_": "activation",
    "selu": "activation",
    "selu_": "activation",
    "hardswish": "activation",
    "hardswish_": "activation",
    "hardsigmoid": "activation",
    "hardsigmoid_": "activation",
    "prelu": "activation",
    "rrelu": "activation",
    "rrelu_": "activation",
    "softshrink": "activation",
    "hardshrink": "activation",  # jumps
    "threshold": "activation",  # a jump where value != threshold, else a corner
    "threshold_": "activation",
    "_threshold": "activation",  # F.threshold, nn.Threshold
    "floor": "floor",
    "ceil": "ceil",
    "round": "round",
    "trunc": "floor",
    "sort": "sort",
    "topk": "top_k",
    "argmax": "argmax",
    "where": "select_n",
    "det": "det",
    # library functions (reported with library=...)
    "logsumexp": "logsumexp",
    "norm": "norm",
    "vector_norm": "norm",
    "std": "std",
    "var": "var",
}

# Node name stem (``SqrtBackward0`` -> ``Sqrt``) -> canonical op, for nodes created inside a
# library function (no torch function call of their own was seen).
NODE_OPS: dict[str, str] = {
    "Sqrt": "sqrt",
    "Rsqrt": "rsqrt",
    "Div": "div",
    "Reciprocal": "div",
    "Log": "log",
    "Log2": "log",
    "Log10": "log",
    "Log1P": "log1p",
    "Pow": "pow",
    "Atan2": "atan2",
    "Acos": "acos",
    "Asin": "asin",
    "Atanh": "atanh",
    "Exp": "exp",
    "LinalgVectorNorm": "norm",
    "Norm": "norm",
    "Std": "std",
    "Var": "var",
    "Abs": "abs",
}

# The canonical ops sanitize records for kinks: the catalog's kinks that torch maps, the ops
# where PyTorch's convention is inadmissible (det), and select_n (torch.where, whose kink is
# at the boundary of the comparison it selects on).
KINK_OPS: frozenset[str] = frozenset(
    op
    for op in set(FUNC_OPS.values())
    if op in _ops.KINKS or any("torch" in e.inadmissible for e in _catalog.by_op(op))
) | {"select_n"}

# Library functions whose gradient at a cone point, tie or singular matrix is a silent
# convention (read in torch/_conventions.py with the catalog's masks).
LIBRARY_KINKS: frozenset[str] = frozenset(LIBRARY_FUNCS)


def is_kink_call(name: str, op: str | None) -> bool:
    """Whether sanitize records this torch call: a kink op, or a library convention."""
    return op in KINK_OPS or name in LIBRARY_KINKS


# Comparisons whose boolean output a `where` may select on.
COMPARISONS = {
    "gt": ">",
    "__gt__": ">",
    "greater": ">",
    "lt": "<",
    "__lt__": "<",
    "less": "<",
    "ge": ">=",
    "__ge__": ">=",
    "greater_equal": ">=",
    "le": "<=",
    "__le__": "<=",
    "less_equal": "<=",
    "eq": "==",
    "__eq__": "==",
    "ne": "!=",
    "__ne__": "!=",
}
BOOL_COMBINE = {
    "logical_and",
    "logical_or",
    "logical_not",
    "__and__",
    "__or__",
    "__invert__",
    "__xor__",
    "logical_xor",
    "__rand__",
    "__ror__",
}

# Backward nodes whose input gradient at an element depends only on the output gradient at
# the same element (up to broadcasting): a structural zero passes through them elementwise.
ELEMENTWISE_NODES = {
    "Sqrt",
    "Rsqrt",
    "Div",
    "Mul",
    "Add",
    "Sub",
    "Neg",
    "Pow",
    "Log",
    "Log2",
    "Log10",
    "Log1P",
    "Exp",
    "Exp2",
    "Expm1",
    "Reciprocal",
    "Where",
    "Atan2",
    "Acos",
    "Asin",
    "Atan",
    "Atanh",
    "Tanh",
    "Sigmoid",
    "Sin",
    "Cos",
    "Tan",
    "Abs",
    "Clamp",
    "ClampMin",
    "ClampMax",
    "Relu",
    "Square",
    "Maximum",
    "Minimum",
    "Sinh",
    "Cosh",
    "Erf",
    "Erfinv",
    "Lgamma",
    "Digamma",
    "Softplus",
    "Gelu",
    "Silu",
    "Hardtanh",
    "Threshold",
    "Clone",
    "ToCopy",
    "Sign",
    "Floor",
    "Ceil",
    "Round",
    "Trunc",
    "Lerp",
    "Addcmul",
    "Addcdiv",
}

_NODE_RE = re.compile(r"^(?:torch::autograd::)?(\w+?)Backward\d*$")


def node_stem(name: str) -> str:
    m = _NODE_RE.match(name)
    return m.group(1) if m else name


def func_name(func: Any) -> str:
    return getattr(func, "__name__", "") or ""


def canonical(name: str) -> str | None:
    return FUNC_OPS.get(name)


LIBRARY = "__library__"  # the params key that carries a library call's keyword arguments


def operands_for(name: str, args: Sequence[Any], kwargs: dict) -> tuple[list[Any], dict]:
    """The operands the catalog predicate for ``canonical(name)`` reads, and its params."""
    a = list(args)
    op = FUNC_OPS.get(name)
    if name in LIBRARY_FUNCS:  # read whole by torch/_conventions.py
        return a, {LIBRARY: dict(kwargs)}
    if not a and "input" in kwargs:  # torch.clamp(input=x, min=0), torch.div(input=x, other=y)
        a = [kwargs["input"]]
        kwargs = {k: v for k, v in kwargs.items() if k != "input"}
    if name in ("__rtruediv__", "__rdiv__", "__rpow__") and len(a) >= 2:
        a = [a[1], a[0]]
    if name.startswith("reciprocal"):
        return [1.0, a[0]], {}
    if op == "pow":
        if "exponent" in kwargs:
            a = [a[0], kwargs["exponent"]]
        if len(a) >= 2 and isinstance(a[1], int) and not isinstance(a[1], bool):
            return [a[0]], {"y": a[1], "integer_pow": True}
        return a[:2], {}
    if op in ("div", "atan2", "max", "min"):
        if len(a) == 1 and "other" in kwargs:
            a.append(kwargs["other"])
        return a[:2], {"rounding_mode": kwargs.get("rounding_mode")} if op == "div" else {}
    if op == "clamp":
        x, lo, hi = clamp_bounds(name, a, kwargs)
        return [_in_dtype(lo, x), x, _in_dtype(hi, x)], {}
    if op == "activation":
        return a[:1], activation_params(name, a, kwargs)
    if op == "logsumexp":  # torch.logsumexp(input, dim, keepdim=False)
        dim = kwargs.get("dim", a[1] if len(a) > 1 else None)
        return a[:1], {"dim": dim, "keepdim": kwargs.get("keepdim", a[2] if len(a) > 2 else False)}
    if op in ("reduce_max", "reduce_min", "sort", "top_k", "argmax"):
        params = {}
        dim = kwargs.get("dim", a[1] if len(a) > 1 and isinstance(a[1], int) else None)
        params["dim"] = dim
        if op == "top_k":
            params["k"] = kwargs.get("k", a[1] if len(a) > 1 else 1)
            params["dim"] = kwargs.get("dim", a[2] if len(a) > 2 else -1)
            params["largest"] = kwargs.get("largest", a[3] if len(a) > 3 else True)
        if op == "sort":
            params["dim"] = kwargs.get("dim", a[1] if len(a) > 1 else -1)
        if op in ("reduce_max", "reduce_min") and len(a) >= 2 and not isinstance(a[1], int):
            # torch.max(a, b) is the elementwise maximum
            return a[:2], {"elementwise": True}
        return a[:1], params
    if op == "select_n":
        return a[:3], {}
    return a[:1], {}


def clamp_bounds(name: str, a: Sequence[Any], kwargs: dict) -> tuple[Any, Any, Any]:
    """``(x, lo, hi)`` of a clamp-like call, positional or by keyword (None: no bound):
    clamp/clip(x, min, max), clamp_min(x, min), clamp_max(x, max), their in-place forms and
    Tensor methods, hardtanh(x, min_val, max_val), relu6."""
    x = a[0] if a else kwargs.get("input")
    base = name.rstrip("_")  # hardtanh_, clamp_min_, ...
    if base == "hardtanh":
        lo = kwargs.get("min_val", a[1] if len(a) > 1 else -1.0)
        hi = kwargs.get("max_val", a[2] if len(a) > 2 else 1.0)
    elif base == "relu6":
        lo, hi = 0.0, 6.0
    elif base == "clamp_max":
        lo, hi = None, kwargs.get("max", a[1] if len(a) > 1 else None)
    elif base == "clamp_min":
        lo, hi = kwargs.get("min", a[1] if len(a) > 1 else None), None
    else:
        lo = kwargs.get("min", a[1] if len(a) > 1 else None)
        hi = kwargs.get("max", a[2] if len(a) > 2 else None)
    return x, lo, hi


def _in_dtype(bound: Any, x: Any) -> Any:
    """A Python number bound of clamp in the operand's float dtype, as PyTorch compares it
    (clamp(x, 0.1, 1) in float32 sits on 0.1f, not on the float64 0.1)."""
    if isinstance(bound, (int, float)) and not isinstance(bound, bool):
        dt = _NP_FLOATS.get(str(getattr(x, "dtype", "")))
        if dt is not None:
            return np.asarray(bound, dt)
    return bound


_NP_FLOATS = {"torch.float32": np.float32, "torch.float64": np.float64, "torch.float16": np.float16}


# positional index of the ``inplace`` flag, and the parameters (name, index, default)
_ACTIVATIONS: dict[str, tuple[int, tuple[tuple[str, int, Any], ...]]] = {
    "leaky_relu": (2, (("negative_slope", 1, 0.01),)),
    "elu": (2, (("alpha", 1, 1.0),)),
    "selu": (1, ()),
    "hardswish": (1, ()),
    "hardsigmoid": (1, ()),
    "relu6": (1, ()),
    "hardtanh": (3, ()),
    "relu": (1, ()),  # F.relu(input, inplace)
    "rrelu": (4, (("lower", 1, 1 / 8), ("upper", 2, 1 / 3), ("training", 3, False))),
    "softshrink": (99, (("lambd", 1, 0.5),)),
    "hardshrink": (99, (("lambd", 1, 0.5),)),
    "threshold": (3, (("threshold", 1, 0.0), ("value", 2, 0.0))),
    "prelu": (99, ()),
}


def activation_params(name: str, a: Sequence[Any], kwargs: dict) -> dict:
    """A fused activation's params for the catalog: ``fn`` (its name without ``_``s), its
    parameters, and ``inplace``. prelu's weight is ``negative_slope``, a float for one
    parameter, else broadcast along the channel dimension (1, or 0 for a 1-D input)."""
    fn = name.strip("_")
    pos, specs = _ACTIVATIONS.get(fn, (len(a), ()))
    params: dict = {"fn": fn, "inplace": name.endswith("_") or is_inplace(name, a, kwargs)}
    for key, i, default in specs:
        v = kwargs.get(key, a[i] if len(a) > i else default)
        params[key] = bool(v) if isinstance(default, bool) else float(v)
    if fn == "prelu":
        params["negative_slope"] = _prelu_slope(a[0] if a else kwargs.get("input"), a, kwargs)
    return params


def _prelu_slope(x: Any, a: Sequence[Any], kwargs: dict) -> Any:
    w = np.asarray(to_numpy(kwargs.get("weight", a[1] if len(a) > 1 else 0.25)), np.float64)
    w = w.reshape(-1)
    if w.size == 1:
        return float(w[0])
    shape = list(np.shape(to_numpy(x)))
    dims = [1] * len(shape)
    dims[1 if len(shape) >= 2 else 0] = w.size
    return np.broadcast_to(w.reshape(dims), shape)


def is_inplace(name: str, a: Sequence[Any], kwargs: dict) -> bool:
    """Whether a kink call writes its input: PyTorch's in-place spelling (``relu_``,
    ``clamp_``, ``clamp_min_``, ``elu_``) or ``inplace=True`` (``F.relu``, ``nn.ReLU``,
    the fused activations)."""
    if name.endswith("_") and not name.endswith("__"):
        return True
    got = _ACTIVATIONS.get(name.strip("_"))
    if got is None:
        return bool(kwargs.get("inplace", False))
    return bool(kwargs.get("inplace", a[got[0]] if len(a) > got[0] else False))


def node_operands(node: Any) -> tuple[str | None, list[Any], dict]:
    """For a Node created inside a library function: canonical op and saved operand values."""
    stem = node_stem(node.name())
    op = NODE_OPS.get(stem)
    if op is None:
        return None, [], {}
    try:
        if op in ("div", "pow", "atan2"):
            if stem == "Reciprocal":  # saves 1 / y only: y is 1 / result (0 where it is inf)
                return op, [1.0, 1.0 / node._saved_result.detach()], {}
            other = getattr(node, "_saved_other", None)
            if other is None:
                other = getattr(node, "_saved_exponent", None)
            if other is None:
                return op, [], {}
            return op, [node._saved_self, other], {}
        if op == "sqrt":
            return op, [node._saved_result], {}
        x = getattr(node, "_saved_self", None)
        if x is None:
            x = getattr(node, "_saved_result", None)
        return op, ([x] if x is not None else []), {}
    except RuntimeError:  # saved tensors already freed
        return op, [], {}


def to_numpy(v: Any) -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return np.asarray(v)
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        if t.is_complex():
            return t.cpu().resolve_conj().numpy()
        return t.cpu().numpy()
    return np.asarray(v)
