"""Predicates: given a canonical op and its operand values (numpy), which catalog entry was hit,
and at which elements. Both backends call this; it imports numpy (never jax or torch).

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
``classify_overflow`` is separate: any op, half-precision output.
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


def _registrar(table: dict) -> Callable[..., Callable]:
    """A decorator factory that files a function in ``table`` under each op name it is given."""

    def for_ops(*ops: str) -> Callable:
        def register(fn):
            for op in ops:
                table[op] = fn
            return fn

        return register

    return for_ops


predicate = _registrar(_PREDICATES)


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


# ---- helpers -------------------------------------------------------------------------------


def _real(x: np.ndarray) -> bool:
    return x.dtype.kind in "fiub"


def _lt(x: np.ndarray, v: float) -> np.ndarray:
    """x < v for real x; all False for complex x (no real-domain boundary there)."""
    return x < v if _real(x) else np.zeros(x.shape, bool)


def _abs_ge1(x: np.ndarray) -> np.ndarray:
    """|x| >= 1 for real x (the ends and the outside of [-1, 1]); NaN is not included."""
    return np.abs(x) >= 1 if _real(x) else np.zeros(x.shape, bool)


def _first(*hits: Hit | None) -> Hit | None:
    """The first hit in priority order."""
    return next((h for h in hits if h is not None), None)


def _eps(x: np.ndarray) -> float:
    return float(np.finfo(x.dtype).eps) if x.dtype.kind == "f" else float(np.finfo(np.float64).eps)


def _hit_at(entry_id: str, mask: np.ndarray, values: np.ndarray, operand: int = 0) -> Hit | None:
    """A hit whose mask already has the output's shape; ``values`` has the same shape."""
    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        return None
    return Hit(entry_id, mask, operand, format_value(np.asarray(values)[mask].flat[0]))


def _axes(x: np.ndarray, params: Mapping[str, Any], default: Any = None) -> tuple[int, ...]:
    """The reduced axes from params (``axes`` as lax spells it, ``axis``, or torch's ``dim``)."""
    ax = default
    for key in ("axes", "axis", "dim", "dimension"):
        if params.get(key) is not None:
            ax = params[key]
            break
    if ax is None:
        return tuple(range(x.ndim))
    if isinstance(ax, (int, np.integer)):
        ax = (ax,)
    return tuple(int(a) % max(x.ndim, 1) for a in ax)


def _keepdims(params: Mapping[str, Any]) -> bool:
    return bool(params.get("keepdims", params.get("keepdim", False)))


def _reduce(mask: np.ndarray, values: np.ndarray, x: np.ndarray, params, how=np.all, default=None):
    """Reduce an elementwise condition over the op's axes: (mask, values) in the output shape."""
    axes = _axes(x, params, default)
    keep = _keepdims(params)
    return how(mask, axis=axes, keepdims=keep), np.max(values, axis=axes, keepdims=keep)


# ---- square roots and powers ---------------------------------------------------------------


@predicate("sqrt")
def _sqrt(operands, out, params):
    x = operands[0]
    return _first(
        _hit("sqrt-at-zero", x == 0, operands),
        _hit("sqrt-of-negative", _lt(x, 0), operands),
    )


@predicate("rsqrt")
def _rsqrt(operands, out, params):
    x = operands[0]
    return _first(
        _hit("rsqrt-at-zero", x == 0, operands),
        _hit("sqrt-of-negative", _lt(x, 0), operands),
    )


@predicate("cbrt")
def _cbrt(operands, out, params):
    return _hit("cbrt-at-zero", operands[0] == 0, operands)


@predicate("pow")
def _pow(operands, out, params):
    """operands: (base, exponent). ``params["exponent_grad"]`` says the exponent is
    differentiated (only then is a 0 base with p >= 1 a hit: the frameworks' own d/dp is 0)."""
    x, p = np.broadcast_arrays(operands[0], operands[1])
    if not (_real(x) and _real(p)):
        return _hit("pow-negative-at-zero", (x == 0) & (np.real(p) < 0), operands)
    zero = x == 0
    non_integer = np.isfinite(p) & (p != np.floor(p))
    return _first(
        _hit("pow-negative-base", (x < 0) & non_integer, operands),
        _hit("pow-negative-at-zero", zero & (p < 0), operands),
        _hit("pow-fractional-at-zero", zero & (p >= 0) & (p < 1), operands),
        _hit("pow-exponent-grad-at-zero-base", zero & (p >= 1), operands)
        if params.get("exponent_grad")
        else None,
    )


@predicate("integer_pow")
def _integer_pow(operands, out, params):
    """operands: (x,); ``params["y"]`` is the integer exponent."""
    y = params.get("y")
    if y is None or int(y) >= 0:
        return None
    return _hit("integer-pow-negative-at-zero", operands[0] == 0, operands)


@predicate("div")
def _div(operands, out, params):
    return _hit("div-by-zero", np.asarray(operands[1]) == 0, operands, operand=1)


# ---- logarithms ----------------------------------------------------------------------------


@predicate("log")
def _log(operands, out, params):
    x = operands[0]
    return _first(
        _hit("log-at-zero", x == 0, operands),
        _hit("log-of-negative", _lt(x, 0), operands),
    )


@predicate("log1p")
def _log1p(operands, out, params):
    x = operands[0]
    return _first(
        _hit("log1p-at-minus-one", x == -1, operands),
        _hit("log-of-negative", _lt(x, -1), operands),
    )


@predicate("log2")
def _log2(operands, out, params):
    x = operands[0]
    return _first(
        _hit("log2-at-zero", x == 0, operands),
        _hit("log-of-negative", _lt(x, 0), operands),
    )


@predicate("log10")
def _log10(operands, out, params):
    x = operands[0]
    return _first(
        _hit("log10-at-zero", x == 0, operands),
        _hit("log-of-negative", _lt(x, 0), operands),
    )


@predicate("xlogy")
def _xlogy(operands, out, params):
    """operands: (x, y) of x * log(y)."""
    x, y = operands[0], operands[1]
    return _first(
        _hit("xlogy-at-zero", (x == 0) & (y == 0), operands),
        _hit("log-at-zero", (x != 0) & (y == 0), operands, operand=1),
        _hit("log-of-negative", (x != 0) & _lt(y, 0), operands, operand=1),
    )


# ---- angles --------------------------------------------------------------------------------


@predicate("atan2")
def _atan2(operands, out, params):
    return _hit("atan2-at-origin", _origin(np, operands, params), operands)


@predicate("acos")
def _acos(operands, out, params):
    return _hit("acos-at-one", _abs_ge1(operands[0]), operands)


@predicate("asin")
def _asin(operands, out, params):
    return _hit("asin-at-one", _abs_ge1(operands[0]), operands)


@predicate("atanh")
def _atanh(operands, out, params):
    return _hit("atanh-at-one", _abs_ge1(operands[0]), operands)


@predicate("acosh")
def _acosh(operands, out, params):
    x = operands[0]
    return _hit("acosh-at-one", x <= 1 if _real(x) else np.zeros(x.shape, bool), operands)


def _overflowed(x: np.ndarray, out: Any) -> np.ndarray | None:
    """Where the output is non-finite from a finite input, or None when ``out`` is unknown."""
    if out is None:
        return None
    o = np.asarray(out)
    if o.dtype.kind == "V":
        o = o.astype(np.float32)
    if o.dtype.kind not in "fc":
        return None
    try:
        return np.broadcast_to(
            ~np.isfinite(o) & np.isfinite(x), np.broadcast_shapes(o.shape, x.shape)
        )
    except ValueError:
        return None


@predicate("tan")
def _tan(operands, out, params):
    """A pole of tan to float precision: |cos(x)| within a few ulps of x, or a non-finite out."""
    x = operands[0]
    if not _real(x):
        return None
    near = np.abs(np.cos(x.astype(np.float64))) <= 2 * _eps(x) * np.maximum(np.abs(x), 1)
    over = _overflowed(x, out)
    return _hit("tan-at-pole", near if over is None else near | over, operands)


def _exp_overflow(entry_id: str, operands, out) -> Hit | None:
    x = operands[0]
    if not _real(x):
        return None
    over = _overflowed(x, out)
    if over is None:  # no output: the threshold log(max float) of the input's dtype
        dt = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
        over = np.isfinite(x) & (x > np.log(np.finfo(dt).max))
    return _hit(entry_id, over, operands)


@predicate("exp")
def _exp(operands, out, params):
    return _exp_overflow("exp-overflow", operands, out)


@predicate("expm1")
def _expm1(operands, out, params):
    return _exp_overflow("expm1-overflow", operands, out)


# ---- special functions ---------------------------------------------------------------------


def _nonpositive_integer(x: np.ndarray) -> np.ndarray:
    if not _real(x):
        return np.zeros(x.shape, bool)
    return (x <= 0) & (x == np.floor(x))


@predicate("lgamma")
def _lgamma(operands, out, params):
    return _hit("lgamma-at-pole", _nonpositive_integer(operands[0]), operands)


@predicate("digamma")
def _digamma(operands, out, params):
    return _hit("digamma-at-pole", _nonpositive_integer(operands[0]), operands)


@predicate("erf_inv")
def _erf_inv(operands, out, params):
    return _hit("erf-inv-at-one", _abs_ge1(operands[0]), operands)


# ---- library functions (one op in PyTorch; params: axes/axis/dim, keepdims, ddof) ----------


@predicate("norm")
def _norm(operands, out, params):
    x = operands[0]
    mask, vals = _reduce(x == 0, np.abs(x), x, params)
    return _hit_at("norm-at-zero", mask, vals)


def _constant(x: np.ndarray, params) -> tuple[np.ndarray, np.ndarray]:
    axes = _axes(x, params)
    keep = _keepdims(params)
    hi = np.max(x, axis=axes, keepdims=keep)
    return hi == np.min(x, axis=axes, keepdims=keep), hi


def _ddof(params) -> float:
    if params.get("ddof") is not None:
        return float(params["ddof"])
    if params.get("correction") is not None:
        return float(params["correction"])
    if params.get("unbiased") is not None:
        return 1.0 if params["unbiased"] else 0.0
    return 0.0


def _too_few(x: np.ndarray, params) -> bool:
    n = int(np.prod([x.shape[a] for a in _axes(x, params)], dtype=np.int64))
    return n - _ddof(params) <= 0


@predicate("std")
def _std(operands, out, params):
    x = operands[0]
    if x.size == 0 or not _real(x):
        return None
    const, vals = _constant(x, params)
    if _too_few(x, params):
        return _hit_at("var-of-constant", np.ones_like(const), vals)
    return _hit_at("std-of-constant", const, vals)


@predicate("var")
def _var(operands, out, params):
    x = operands[0]
    if x.size == 0 or not _real(x):
        return None
    const, vals = _constant(x, params)
    if _too_few(x, params):
        const = np.ones_like(const)
    return _hit_at("var-of-constant", const, vals)


@predicate("logsumexp")
def _logsumexp(operands, out, params):
    x = operands[0]
    mask, vals = _reduce(x == -np.inf, x, x, params)
    return _hit_at("logsumexp-all-neg-inf", mask, vals)


@predicate("softmax", "log_softmax")
def _softmax(operands, out, params):
    """The mask has the input's (= output's) shape: every element of an all -inf row."""
    x = operands[0]
    if x.ndim == 0:
        return _hit("softmax-all-neg-inf", x == -np.inf, operands)
    axes = _axes(x, params, default=-1)
    row = np.all(x == -np.inf, axis=axes, keepdims=True)
    return _hit("softmax-all-neg-inf", np.broadcast_to(row, x.shape), operands)


# ---- kinks, ties and jumps -----------------------------------------------------------------


# Where each kink, tie or jump sits, written once for any array module ``xp`` (numpy here,
# jax.numpy in gradsan.jax.sanitize's compiled screen): a boolean mask of the operands'
# broadcast shape, or, for reductions, of the reduced shape with the reduced axes kept.
Mask = Callable[[Any, Sequence[Any], Mapping[str, Any]], Any]
_MASKS: dict[str, Mask] = {}


mask = _registrar(_MASKS)


@mask("abs", "relu", "sign")
def _at_zero(xp, operands, params):
    return operands[0] == 0


@mask("max", "min", "where")
def _tie(xp, operands, params):
    return operands[0] == operands[1]


@mask("atan2", "hypot")
def _origin(xp, operands, params):
    return (operands[0] == 0) & (operands[1] == 0)


@mask("floor", "ceil")
def _integer(xp, operands, params):
    x = operands[0]
    return xp.isfinite(x) & (x == xp.floor(x))


@mask("round")
def _half_integer(xp, operands, params):
    x = operands[0]
    return x - xp.floor(x) == 0.5


@mask("trunc")
def _trunc_jump(xp, operands, params):
    """A float -> integer cast (truncation toward 0) jumps at the non-zero integers; a cast to
    bool (``params["to_bool"]``) at 0."""
    x = operands[0]
    if params.get("to_bool"):
        return x == 0
    return xp.isfinite(x) & (x == xp.trunc(x)) & (x != 0)


@mask("clamp")
def _at_bound(xp, operands, params):
    """operands in lax order: (lo, x, hi); a missing bound is None."""
    lo, x, hi = (list(operands) + [None, None, None])[:3]
    m = xp.zeros_like(x, dtype=bool)
    for b in (lo, hi):
        if not _missing(b):
            m = m | (x == b)
    return m


@mask("reduce_max", "argmax")
def _reduce_tie(xp, operands, params):
    """Reductions whose extreme is attained twice (the minimum with ``params["_min"]``); the
    reduced axes are kept."""
    x = operands[0]
    axes = _axes(x, params)
    ext = (xp.min if params.get("_min") else xp.max)(x, axis=axes, keepdims=True)
    return xp.sum(x == ext, axis=axes, keepdims=True) > 1


@mask("reduce_min", "argmin")
def _reduce_min_tie(xp, operands, params):
    return _reduce_tie(xp, operands, {**params, "_min": True})


def kink_mask(
    op: str, operands: Sequence[Any], params: Mapping[str, Any] | None = None, xp: Any = np
) -> Any | None:
    """The mask of ``op``'s non-smooth points at these operands, computed with ``xp``; None
    when ``op`` has no mask written for any array module (sort, cummax, pooling, eigh: use
    :func:`classify`)."""
    fn = _MASKS.get(op)
    if fn is None:
        return None
    return fn(xp, operands, params or {})


@predicate("abs")
def _abs(operands, out, params):
    return _hit("abs-at-zero", _at_zero(np, operands, params), operands)


@predicate("relu")
def _relu(operands, out, params):
    return _hit("relu-at-zero", _at_zero(np, operands, params), operands)


@predicate("sign")
def _sign(operands, out, params):
    return _hit("sign-at-zero", _at_zero(np, operands, params), operands)


@predicate("max", "min")
def _max(operands, out, params):
    """Binary maximum / minimum: operands (x, y)."""
    if len(operands) < 2:
        return None
    return _hit("max-tie", _tie(np, operands, params), operands)


@predicate("reduce_max", "argmax")
def _reduce_max(operands, out, params):
    """A reduction over ``axes`` (lax) / ``dim`` (torch); the mask has the reduced shape.

    ``params["elementwise"]`` (torch.max(a, b)) makes it the binary maximum."""
    if params.get("elementwise"):
        return _max(operands, out, params)
    x = operands[0]
    if x.size == 0 or x.ndim == 0:
        return None
    axes = _axes(x, params)
    use_min = params.get("_min", False)
    ext = np.min(x, axis=axes, keepdims=True) if use_min else np.max(x, axis=axes, keepdims=True)
    ties = _reduce_tie(np, operands, params)
    keep = _keepdims(params)
    if not keep:
        ties, ext = np.squeeze(ties, axis=axes), np.squeeze(ext, axis=axes)
    return _hit_at("max-tie", ties, ext)


@predicate("reduce_min", "argmin")
def _reduce_min(operands, out, params):
    if params.get("elementwise"):
        return _max(operands, out, params)
    return _reduce_max(operands, out, {**params, "_min": True})


@predicate("sort", "top_k")
def _sort(operands, out, params):
    """Sorting along ``axis``/``dim`` (default -1); the mask marks the input elements that tie
    with another along that axis (for top_k: only values that reach the top k)."""
    x = operands[0]
    if x.size == 0 or x.ndim == 0:
        return None
    axis = _axes(x, params, default=-1)[0]
    xm = np.moveaxis(x, axis, -1)
    order = np.argsort(xm, axis=-1, kind="stable")
    srt = np.take_along_axis(xm, order, axis=-1)
    eq = srt[..., 1:] == srt[..., :-1]
    dup = np.zeros(xm.shape, bool)
    dup[..., 1:] |= eq
    dup[..., :-1] |= eq
    ties = np.empty_like(dup)
    np.put_along_axis(ties, order, dup, axis=-1)
    k = params.get("k")
    if k is not None:
        largest = params.get("largest", True)
        kth = srt[..., -int(k), None] if largest else srt[..., int(k) - 1, None]
        ties &= (xm >= kth) if largest else (xm <= kth)
    return _hit_at("sort-tie", np.moveaxis(ties, -1, axis), x)


def _missing(o: np.ndarray | None) -> bool:
    return o is None or o.dtype == object


@predicate("clamp")
def _clamp(operands, out, params):
    """operands in lax order: (lo, x, hi); a missing bound is None."""
    lo, x, hi = (list(operands) + [None, None, None])[:3]
    if _missing(x):
        return None
    bounds = [b for b in (lo, hi) if not _missing(b)]
    shape = np.broadcast_shapes(x.shape, *(b.shape for b in bounds))
    at = np.broadcast_to(_at_bound(np, operands, params), shape)
    return _hit_at("clip-at-bound", at, np.broadcast_to(x, shape), operand=1)


@predicate("floor", "ceil")
def _floor(operands, out, params):
    x = operands[0]
    if not _real(x):
        return None
    return _hit("floor-round-at-jump", _integer(np, operands, params), operands)


@predicate("round")
def _round(operands, out, params):
    x = operands[0]
    if not _real(x):
        return None
    return _hit("floor-round-at-jump", _half_integer(np, operands, params), operands)


@predicate("where")
def _where(operands, out, params):
    """operands: the two sides (lhs, rhs) of the comparison that chose the branch."""
    if len(operands) < 2:
        return None
    return _hit("where-at-boundary", _tie(np, operands, params), operands)


@predicate("hypot")
def _hypot(operands, out, params):
    return _hit("hypot-at-origin", _origin(np, operands, params), operands)


def _spectrum(a: np.ndarray, hermitian: bool) -> np.ndarray | None:
    if a.ndim < 2 or a.shape[-1] == 0 or not np.all(np.isfinite(a)):
        return None
    try:
        if hermitian:
            return np.linalg.eigvalsh(a)
        return np.linalg.svd(a, compute_uv=False)
    except np.linalg.LinAlgError:
        return None


@predicate("eigh")
def _eigh(operands, out, params):
    """operands: (matrix,). The mask has the spectrum's shape (..., n): eigenvalues (singular
    values for svd) within 16 n eps max|w| of another, the tolerance of gradsan's safe eigh."""
    a = operands[0]
    w = _spectrum(a, hermitian=params.get("_op") != "svd")
    if w is None:
        return None
    n = w.shape[-1]
    tol = 16 * n * _eps(a) * np.max(np.abs(w), axis=-1, keepdims=True)
    close = np.abs(w[..., :, None] - w[..., None, :]) <= tol[..., None]
    repeated = np.sum(close, axis=-1) > 1
    return _hit_at("eigh-repeated-eigenvalues", repeated, w)


@predicate("svd")
def _svd(operands, out, params):
    return _eigh(operands, out, {**params, "_op": "svd"})


@predicate("det", "slogdet", "logdet")
def _det(operands, out, params):
    """operands: (matrix,). Singular to float precision: the smallest singular value is within
    n eps of the largest. The mask has the batch shape (det's output); "got" is det."""
    a = operands[0]
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        return None
    s = _spectrum(a, hermitian=False)
    if s is None:
        return None
    n = s.shape[-1]
    singular = s[..., -1] <= n * _eps(a) * s[..., 0]
    return _hit_at("det-at-singular", singular, np.linalg.det(a))


@predicate("cummax", "cummin")
def _cummax(operands, out, params):
    """A running maximum (minimum with ``params["_min"]``) along ``axis``; ``reverse`` runs it
    from the end. The mask has the output's shape: positions whose running extreme is attained
    by two or more elements so far."""
    x = operands[0]
    if x.size == 0 or x.ndim == 0:
        return None
    axis = _axes(x, params, default=0)[0]
    xm = np.moveaxis(x, axis, -1)
    if params.get("reverse"):
        xm = xm[..., ::-1]
    fn = np.minimum if params.get("_min") else np.maximum
    run = fn.accumulate(xm, axis=-1)
    count = np.ones(xm.shape, np.int64)  # elements j <= i equal to run[i]
    for i in range(1, xm.shape[-1]):
        same = run[..., i] == run[..., i - 1]
        count[..., i] = np.where(same, count[..., i - 1] + (xm[..., i] == run[..., i]), 1)
    ties = count > 1
    if params.get("reverse"):
        ties, run = ties[..., ::-1], run[..., ::-1]
    return _hit_at("max-tie", np.moveaxis(ties, -1, axis), np.moveaxis(run, -1, axis))


def _windows(x: np.ndarray, params, fill: float) -> np.ndarray:
    """The windows of lax.reduce_window as an array of shape (*out_shape, window_size)."""
    dims = tuple(params.get("window_dimensions", ()))
    strides = tuple(params.get("window_strides", (1,) * x.ndim))
    pad = tuple(params.get("padding", ((0, 0),) * x.ndim))
    wdil = tuple(params.get("window_dilation", (1,) * x.ndim))
    xp = np.pad(x.astype(np.float64), pad, constant_values=fill)
    eff = tuple((d - 1) * w + 1 for d, w in zip(dims, wdil))
    view = np.lib.stride_tricks.sliding_window_view(xp, eff)
    view = view[tuple(slice(None, None, s) for s in strides)]
    view = view[(Ellipsis,) + tuple(slice(None, None, w) for w in wdil)]
    return view.reshape(view.shape[: x.ndim] + (-1,))


@predicate("reduce_window_max", "reduce_window_min")
def _reduce_window_max(operands, out, params):
    """Max (min with ``params["_min"]``) pooling: windows whose extreme is attained by two or
    more elements. Params as lax.reduce_window_max: window_dimensions, window_strides, padding,
    window_dilation (base dilation 1). The mask has the output's shape."""
    x = operands[0]
    if x.size == 0 or any(b != 1 for b in params.get("base_dilation", ()) or ()):
        return None
    use_min = params.get("_min", False)
    w = _windows(x, params, np.inf if use_min else -np.inf)
    ext = w.min(axis=-1) if use_min else w.max(axis=-1)
    ties = np.isfinite(ext) & (np.sum(w == ext[..., None], axis=-1) > 1)
    return _hit_at("max-tie", ties, ext)


@predicate("trunc")
def _trunc(operands, out, params):
    """A float -> integer cast (truncation toward 0): jumps at the non-zero integers.
    ``params["to_bool"]`` (a cast to bool) jumps at 0 instead."""
    x = operands[0]
    if not _real(x) or x.dtype.kind not in "f":
        return None
    return _hit("floor-round-at-jump", _trunc_jump(np, operands, params), operands)


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
    if not arrays or _missing(arrays[0]) and op != "clamp":
        return None
    with np.errstate(all="ignore"):
        return fn(arrays, out, params or {})


def _as_array(o: Any) -> np.ndarray | None:
    if o is None:
        return None
    a = np.asarray(o)
    if a.dtype.kind == "V":  # ml_dtypes (bfloat16) arrays: compare in float32
        a = np.asarray(a, np.float32)
    return a


def known_ops() -> set[str]:
    return set(_PREDICATES)


# ---- overflow in half precision ------------------------------------------------------------

_HALF = ("float16", "bfloat16")

# Elementwise ops whose float32 result can be recomputed, by lax/torch name: an inf that
# float32 also gives is the op's own overflow (exp-overflow), not a float16 one.
_FLOAT32_REFERENCE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "add_any": np.add,
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
        ref = _FLOAT32_REFERENCE.get(op)
        if ref is not None and xs and len(xs) == getattr(ref, "nin", len(xs)):
            try:
                r = np.broadcast_to(ref(*xs), o32.shape)
            except ValueError:
                r = None
            if r is not None:
                mask = mask & np.isfinite(r)
    if not mask.any():
        return None
    got = ""
    if xs:
        try:
            got = format_value(np.broadcast_to(xs[0], o32.shape)[mask].flat[0])
        except ValueError:
            got = format_value(np.max(np.abs(xs[0])))
    return Hit("float16-overflow", mask, 0, got)


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
