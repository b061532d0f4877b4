"""Every singular and non-smooth set, written once, for any array module ``xp``.

A mask is ``fn(xp, operands, params) -> boolean array``: numpy, jax.numpy and torch all work
(``xp`` is the module: ``np``, ``jnp`` or ``torch``). Elementwise masks have the operands'
broadcast shape; the reduction masks keep the reduced axes. Operands come in lax order (see
``_classify``'s docstring). NaN is never in a set (that is ``nonfinite-input``), and a complex
operand has no real-domain boundary (its ``x < 0`` is empty).

Two registries read them:

* the entries bind each op to its entries in priority order, each with one of these sets
  (``entries/<family>.py``, through :func:`gradsan._catalog._classify.rule`);
* :func:`kink_mask` looks up the kink, tie and jump sets by canonical op: the compiled screen
  (``gradsan.jax.sanitize``) evaluates them with ``jax.numpy``.

Sort, top_k, cummax, pooling, eigh/svd and det have no mask here: their sets need a sort, a
running count, windows or a spectrum, which ``xp`` has no common spelling for. Their numpy
predicates are in ``entries/kinks.py`` (the screen sends them to the host).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

Mask = Callable[[Any, Sequence[Any], Mapping[str, Any]], Any]


# ---- helpers for any xp --------------------------------------------------------------------


def is_real(x: Any) -> bool:
    """Whether ``x`` (numpy, jax or torch array) has a real (or integer, or bool) dtype."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return not isinstance(x, complex)
    is_complex = getattr(dt, "is_complex", None)  # a torch dtype
    if isinstance(is_complex, bool):
        return not is_complex
    return np.dtype(dt).kind in "fiub"


def _none(xp: Any, x: Any) -> Any:
    return xp.zeros_like(x, dtype=bool)


def _is_torch(xp: Any) -> bool:
    return getattr(xp, "__name__", "") == "torch"


def axes_of(x: Any, params: Mapping[str, Any], default: Any = None) -> tuple[int, ...]:
    """The reduced axes from params (``axes`` as lax spells it, ``axis``, or torch's ``dim``)."""
    ax = default
    for key in ("axes", "axis", "dim", "dimension"):
        if params.get(key) is not None:
            ax = params[key]
            break
    ndim = x.ndim
    if ax is None:
        return tuple(range(ndim))
    if isinstance(ax, (int, np.integer)):
        ax = (ax,)
    return tuple(int(a) % max(ndim, 1) for a in ax)


def keepdims_of(params: Mapping[str, Any]) -> bool:
    return bool(params.get("keepdims", params.get("keepdim", False)))


def _extreme(xp: Any, x: Any, axes: tuple[int, ...], use_min: bool) -> Any:
    if _is_torch(xp):
        fn = xp.amin if use_min else xp.amax
        return fn(x, dim=axes, keepdim=True)
    return (xp.min if use_min else xp.max)(x, axis=axes, keepdims=True)


def _count(xp: Any, m: Any, axes: tuple[int, ...]) -> Any:
    if _is_torch(xp):
        return xp.sum(m, dim=axes, keepdim=True)
    return xp.sum(m, axis=axes, keepdims=True)


def missing(o: Any) -> bool:
    """An absent operand: None, or a numpy object array of None (a missing clamp bound)."""
    return o is None or isinstance(o, np.ndarray) and o.dtype.kind == "O"


# ---- singular sets (elementwise) -----------------------------------------------------------


def at_zero(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x == 0 (the first operand)."""
    return operands[0] == 0


def second_at_zero(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """y == 0: a zero denominator of div (x, y)."""
    return operands[1] == 0


def negative(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x < 0, outside a real root's or logarithm's domain."""
    x = operands[0]
    return x < 0 if is_real(x) else _none(xp, x)


def at_minus_one(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x == -1: log1p's pole."""
    return operands[0] == -1


def below_minus_one(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x < -1, outside log1p's domain."""
    x = operands[0]
    return x < -1 if is_real(x) else _none(xp, x)


def abs_ge_one(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """|x| >= 1: the ends and the outside of [-1, 1] (acos, asin, atanh, erf_inv)."""
    x = operands[0]
    return xp.abs(x) >= 1 if is_real(x) else _none(xp, x)


def le_one(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x <= 1: acosh's end and the outside of its domain."""
    x = operands[0]
    return x <= 1 if is_real(x) else _none(xp, x)


def nonpositive_integer(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x in {0, -1, -2, ...}: the poles of lgamma and digamma."""
    x = operands[0]
    if not is_real(x):
        return _none(xp, x)
    return (x <= 0) & (x == xp.floor(x))


def origin(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """Both operands 0: atan2 (y, x) and hypot (x, y) at the origin."""
    return (operands[0] == 0) & (operands[1] == 0)


def xlogy_at_zero(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x == 0 and y == 0 in x * log(y)."""
    return (operands[0] == 0) & (operands[1] == 0)


def xlogy_log_at_zero(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x != 0 and y == 0 in x * log(y): log's own pole."""
    return (operands[0] != 0) & (operands[1] == 0)


def xlogy_log_of_negative(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x != 0 and y < 0 in x * log(y)."""
    y = operands[1]
    return (operands[0] != 0) & (y < 0 if is_real(y) else _none(xp, y))


# pow (base, exponent). A complex base or exponent: only 0 ** (Re p < 0) is singular.


def _pow_real(operands: Sequence[Any]) -> bool:
    return is_real(operands[0]) and is_real(operands[1])


def pow_negative_base(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x < 0 with a finite non-integer p: NaN."""
    x, p = operands[0], operands[1]
    if not _pow_real(operands):
        return _none(xp, (x == 0) & (p == p))
    return (x < 0) & xp.isfinite(p) & (p != xp.floor(p))


def pow_negative_at_zero(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x == 0 with p < 0: a pole."""
    x, p = operands[0], operands[1]
    if not _pow_real(operands):
        return (x == 0) & (xp.real(p) < 0)
    return (x == 0) & (p < 0)


def pow_fractional_at_zero(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x == 0 with 0 <= p < 1: finite value, infinite slope."""
    x, p = operands[0], operands[1]
    if not _pow_real(operands):
        return _none(xp, (x == 0) & (p == p))
    return (x == 0) & (p >= 0) & (p < 1)


def pow_exponent_grad_at_zero_base(
    xp: Any, operands: Sequence[Any], params: Mapping[str, Any]
) -> Any:
    """x == 0 with p >= 1, when the exponent is differentiated (d/dp x**p = x**p log x)."""
    x, p = operands[0], operands[1]
    if not _pow_real(operands):
        return _none(xp, (x == 0) & (p == p))
    return (x == 0) & (p >= 1)


def negative_integer_power_at_zero(
    xp: Any, operands: Sequence[Any], params: Mapping[str, Any]
) -> Any:
    """x == 0 in x ** y for an integer y < 0 (``params["y"]``)."""
    x = operands[0]
    y = params.get("y")
    if y is None or int(y) >= 0:
        return _none(xp, x)
    return x == 0


def tan_pole(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """A pole of tan to float precision: |cos x| within 2 eps max(|x|, 1) of 0 (cos taken in
    float64 for numpy operands)."""
    x = operands[0]
    if not is_real(x):
        return _none(xp, x)
    eps = float(xp.finfo(x.dtype).eps) if _is_float(x) else float(np.finfo(np.float64).eps)
    wide = x.astype(np.float64) if isinstance(x, np.ndarray) else x
    return xp.abs(xp.cos(wide)) <= 2 * eps * xp.maximum(xp.abs(x), 1)


def _is_float(x: Any) -> bool:
    dt = getattr(x, "dtype", None)
    if dt is None:
        return False
    is_fp = getattr(dt, "is_floating_point", None)  # a torch dtype
    if isinstance(is_fp, bool):
        return is_fp
    return np.dtype(dt).kind == "f"


def nonfinite_from_finite(x: np.ndarray, out: Any) -> np.ndarray | None:
    """Where ``out`` is non-finite from a finite input, or None when ``out`` is unknown
    (numpy: exp, expm1 and tan read their output)."""
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


def exp_threshold(x: np.ndarray) -> np.ndarray:
    """x > log(max float) of x's dtype: exp overflows (numpy, when the output is unknown)."""
    dt = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    return np.isfinite(x) & (x > np.log(np.finfo(dt).max))


# ---- kinks, ties and jumps, by canonical op ------------------------------------------------

_KINKS: dict[str, Mask] = {}


def _kink(*ops: str) -> Callable[[Mask], Mask]:
    def register(fn: Mask) -> Mask:
        for op in ops:
            _KINKS[op] = fn
        return fn

    return register


_kink("abs", "relu", "sign", "i0e")(at_zero)
_kink("atan2", "hypot")(origin)


@_kink("max", "min", "where")
def tie(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x == y: maximum/minimum at a tie; for where, the two sides of its comparison."""
    return operands[0] == operands[1]


@_kink("floor", "ceil")
def integer(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x an integer: floor and ceil jump there."""
    x = operands[0]
    return xp.isfinite(x) & (x == xp.floor(x))


@_kink("round")
def half_integer(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """x - floor(x) == 0.5: round jumps there."""
    x = operands[0]
    return x - xp.floor(x) == 0.5


@_kink("trunc")
def trunc_jump(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """A float -> integer cast (truncation toward 0) jumps at the non-zero integers; a cast to
    bool (``params["to_bool"]``) at 0."""
    x = operands[0]
    if params.get("to_bool"):
        return x == 0
    return xp.isfinite(x) & (x == xp.trunc(x)) & (x != 0)


@_kink("clamp")
def at_bound(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """operands in lax order: (lo, x, hi); a missing bound is None."""
    lo, x, hi = (list(operands) + [None, None, None])[:3]
    m = xp.zeros_like(x, dtype=bool)
    for b in (lo, hi):
        if not missing(b):
            m = m | (x == b)
    return m


@_kink("reduce_max", "argmax")
def reduce_tie(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """Reductions whose extreme is attained twice (the minimum with ``params["_min"]``); the
    reduced axes are kept."""
    x = operands[0]
    axes = axes_of(x, params)
    ext = _extreme(xp, x, axes, bool(params.get("_min")))
    return _count(xp, x == ext, axes) > 1


@_kink("reduce_min", "argmin")
def reduce_min_tie(xp: Any, operands: Sequence[Any], params: Mapping[str, Any]) -> Any:
    return reduce_tie(xp, operands, {**params, "_min": True})


def kink_mask(
    op: str, operands: Sequence[Any], params: Mapping[str, Any] | None = None, xp: Any = np
) -> Any | None:
    """The mask of ``op``'s non-smooth points at these operands, computed with ``xp``; None
    when ``op`` has no mask written for any array module (sort, cummax, pooling, eigh: use
    :func:`gradsan._catalog._classify.classify`)."""
    fn = _KINKS.get(op)
    if fn is None:
        return None
    return fn(xp, operands, params or {})


def kink_ops() -> set[str]:
    """The canonical ops :func:`kink_mask` knows."""
    return set(_KINKS)


def windows(x: np.ndarray, params: Mapping[str, Any], fill: float) -> np.ndarray:
    """The windows of lax.reduce_window as an array of shape (*out_shape, window_size)
    (numpy only: pooling's tie set is read off these windows)."""
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
