"""Safe functions: the numpy names, the same values, correct derivatives at singular points.

Each function returns exactly what the naive JAX expression returns (bit for bit) away from its
singular points. Under differentiation it returns the true derivative where one exists, else
the minimum-norm element of the Clarke subdifferential. Where the function is not Lipschitz
(sqrt at 0, arccos at 1, x**p at 0 for p < 1) no finite derivative is right, and we take 0,
as optax's ``safe_norm`` does: **that is a convention, not a derivative**; each docstring says
so. Derivatives are ``jax.custom_jvp`` rules (or plain ``jnp`` with the double-where trick),
so ``jit``, ``vmap``, ``grad``, ``jacfwd``, ``jacrev`` and second derivatives all work.

``gradsan.torch.safe`` has the same names, arguments (numpy spelling: ``axis``, ``keepdims``)
and derivatives; ``tests/safe`` holds both backends to the same values.
"""

from __future__ import annotations

import functools as ft
import math
from collections.abc import Callable, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax
from jax.typing import ArrayLike

__all__ = [
    "abs",
    "arccos",
    "arcsin",
    "arctan2",
    "arctanh",
    "atan2",
    "cbrt",
    "cdist",
    "clip",
    "cosine_similarity",
    "div",
    "eigh",
    "hypot",
    "layer_norm",
    "log",
    "log1p",
    "log_softmax",
    "logsumexp",
    "maximum",
    "minimum",
    "norm",
    "normalize",
    "pairwise_distance",
    "pow",
    "rsqrt",
    "sinc",
    "softmax",
    "sqrt",
    "standardize",
    "std",
    "var",
    "where",
    "xlogx",
    "xlogy",
]

Axis = int | Sequence[int] | None
_builtin_abs = abs


def _inexact(x: ArrayLike) -> jax.Array:
    """``x`` as an array; integers and bools become the default float dtype."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jax.dtypes.canonicalize_dtype(jnp.float64))
    return x


def _unary(value: Callable, coef: Callable, name: str, doc: str | None = None) -> Callable:
    """An elementwise ``custom_jvp`` function: ``value(x)`` with derivative ``coef(x, y)``.

    ``coef`` must mask its singular points with the double-where trick, so that the rule can
    itself be differentiated. The primal inside the rule is the safe function itself, so a
    second derivative never meets the naive rule.
    """

    @jax.custom_jvp
    def f(x):
        return value(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        y = f(x)
        return y, coef(x, y) * t

    def wrapper(x: ArrayLike) -> jax.Array:
        return f(_inexact(x))

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = doc
    return wrapper


def _mask(ok: jax.Array, x: jax.Array, fill: float = 1.0) -> jax.Array:
    """The inner where of the double-where trick: ``x`` where ``ok``, else a harmless ``fill``."""
    return jnp.where(ok, x, jnp.asarray(fill, x.dtype))


# ---------------------------------------------------------------------------------------------
# Elementwise roots, logs and powers.


def _sqrt_coef(x, y):
    pos = x > 0
    return jnp.where(pos, 0.5 / _mask(pos, y), 0)


sqrt = _unary(
    jnp.sqrt,
    _sqrt_coef,
    "sqrt",
    """Square root, with derivative 0 at 0.

    ``sqrt(x) = jnp.sqrt(x)``, bit for bit. Its derivative is ``1 / (2 sqrt(x))`` for
    ``x > 0``; except under differentiation, we take the derivative to be **0 at x = 0** (and
    0 for x < 0, where the value is NaN). The true one-sided derivative at 0 is +inf: sqrt is
    not Lipschitz there, so 0 is a convention (optax's ``safe_norm`` takes the same one), not
    the derivative. ``sqrt(x) * sqrt(x)`` still has derivative 0 at 0 with it, not 1.

    Why the naive version gives NaN: ``jax.grad`` multiplies the incoming gradient by
    ``1 / (2 sqrt(0)) = inf``; when that gradient is 0 (a masked or constant-zero entry),
    ``0 * inf = NaN`` reaches every parameter upstream.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> print(jax.grad(lambda x: 0.0 * safe.sqrt(x))(0.0))
        0.0
        >>> print(jax.grad(lambda x: 0.0 * jnp.sqrt(x))(0.0))
        nan
    """,
)


def _rsqrt_coef(x, y):
    pos = x > 0
    return jnp.where(pos, -0.5 * _mask(pos, y) / _mask(pos, x), 0)


rsqrt = _unary(
    lax.rsqrt,
    _rsqrt_coef,
    "rsqrt",
    """Reciprocal square root ``1 / sqrt(x)``, with derivative 0 where ``x <= 0``.

    ``rsqrt(x) = jax.lax.rsqrt(x)``, bit for bit (``inf`` at 0). The derivative is
    ``-x ** -1.5 / 2`` for ``x > 0``; except under differentiation, we take **0 for x <= 0**,
    a convention: at 0 the value is already infinite and the true derivative is -inf.

    Why the naive version gives NaN: the derivative at 0 is ``-inf``, and a zero gradient
    flowing back into it (a masked entry) gives ``0 * -inf = NaN``.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(lambda x: 0.0 * safe.rsqrt(x))(0.0))
        0.0
    """,
)


def _cbrt_coef(x, y):
    nz = x != 0
    ys = _mask(nz, y)
    return jnp.where(nz, (1.0 / 3.0) / (ys * ys), 0)


cbrt = _unary(
    jnp.cbrt,
    _cbrt_coef,
    "cbrt",
    """Real cube root, with derivative 0 at 0.

    ``cbrt(x) = jnp.cbrt(x)``, bit for bit. The derivative is ``x ** (-2/3) / 3`` for
    ``x != 0``; except under differentiation, we take **0 at x = 0**, a convention: the
    true derivative there is +inf from both sides (a vertical tangent).

    Why the naive version gives NaN: ``inf`` at 0 times a zero incoming gradient.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.cbrt)(0.0), jax.grad(safe.cbrt)(8.0))
        0.0 0.083333336
    """,
)


def _log_coef(x, y):
    pos = x > 0
    return jnp.where(pos, 1.0 / _mask(pos, x), 0)


log = _unary(
    jnp.log,
    _log_coef,
    "log",
    """Natural logarithm, with derivative 0 where ``x <= 0``.

    ``log(x) = jnp.log(x)``, bit for bit: ``-inf`` at 0 and NaN below. The derivative is
    ``1 / x`` for ``x > 0``; except under differentiation, we take **0 for x <= 0**. Use it
    where a 0 is legitimate and its ``-inf`` is masked out later (``where(x > 0, log(x), 0)``,
    a masked log-likelihood): then the masked entries get gradient exactly 0.

    Why the naive version gives NaN: ``jnp.where`` routes a zero gradient to the unselected
    ``log(0)``, whose derivative is ``1 / 0 = inf``, and ``0 * inf = NaN``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> f = lambda x: jnp.where(x > 0, safe.log(x), 0.0)
        >>> print(jax.grad(f)(0.0))
        0.0
    """,
)


def _log1p_coef(x, y):
    ok = x > -1
    return jnp.where(ok, 1.0 / _mask(ok, 1.0 + x), 0)


log1p = _unary(
    jnp.log1p,
    _log1p_coef,
    "log1p",
    """``log(1 + x)``, with derivative 0 where ``x <= -1``.

    ``log1p(x) = jnp.log1p(x)``, bit for bit: ``-inf`` at -1 and NaN below. The derivative is
    ``1 / (1 + x)`` for ``x > -1``; except under differentiation, we take **0 for x <= -1**,
    for a -1 that is legitimate and masked out later (the same choice as ``safe.log``).

    Why the naive version gives NaN: a zero gradient routed to the masked ``log1p(-1)`` meets
    its derivative ``1 / 0 = inf``, and ``0 * inf = NaN``.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(lambda x: 0.0 * safe.log1p(x))(-1.0))
        0.0
    """,
)


def _sinc_series(x):
    # d/dx sinc(x) = sum_{k>=1} (-1)^k pi^(2k) 2k x^(2k-1) / (2k+1)!, accurate for |x| <= 0.5.
    coefs = [
        (-1) ** k * math.pi ** (2 * k) * 2 * k / math.factorial(2 * k + 1) for k in range(1, 13)
    ]
    x2 = x * x
    acc = jnp.zeros_like(x) + coefs[-1]
    for c in reversed(coefs[:-1]):
        acc = acc * x2 + c
    return acc * x


def _sinc_coef(x, y):
    small = jnp.abs(x) <= 0.5
    xb = _mask(~small, x)
    pxb = math.pi * xb
    direct = (jnp.cos(pxb) - jnp.sin(pxb) / pxb) / xb
    return jnp.where(small, _sinc_series(jnp.where(small, x, 0)), direct)


sinc = _unary(
    jnp.sinc,
    _sinc_coef,
    "sinc",
    """Normalized sinc, ``sin(pi x) / (pi x)`` with value 1 at 0, and its true derivative.

    ``sinc(x) = jnp.sinc(x)``, bit for bit. The derivative is
    ``(cos(pi x) - sinc(x)) / x``, and its limit **0 at x = 0** is the true derivative (sinc
    is analytic). Near 0 we use the Taylor series instead of the formula, so the derivative
    has no cancellation error, and the second derivative at 0 is the true ``-pi**2 / 3``.

    Why the naive version fails: the quotient rule at 0 is ``0 / 0``. (``jnp.sinc`` already
    has a rule at 0; ``torch.sinc`` too; this one also matches them near 0 to full precision.)

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.sinc)(0.0) == 0, jax.grad(jax.grad(safe.sinc))(0.0))
        True -3.289868
    """,
)


def pow(x: ArrayLike, p: ArrayLike) -> jax.Array:
    """``x ** p`` with finite derivatives at ``x = 0``.

    ``pow(x, p) = jnp.power(x, p)``, bit for bit. The derivative in ``x`` is
    ``p * x ** (p - 1)``; except under differentiation, at ``x = 0`` we take it to be
    the true value (0) for ``p > 1``, 1 for ``p == 1``, and **0 for p < 1**, a convention
    (for ``0 < p < 1`` the true one-sided derivative is +inf; for ``p < 0`` the value is
    infinite). For ``x < 0`` and a non-integer ``p`` (value NaN) we take 0. The derivative in
    ``p`` (when ``p`` is an array) is ``x ** p * log(x)`` for ``x > 0``, and 0 for
    ``x <= 0``: the true limit at ``x = 0`` for ``p > 0``.

    A Python number ``p`` stays static, so ``pow(x, 2)`` is ``x * x`` exactly as in JAX.

    Why the naive version gives NaN: ``jnp.power(x, 0.5)`` has derivative ``0.5 * 0 ** -0.5 =
    inf`` at 0, times a zero gradient; and ``d/dp`` is ``0 ** p * log(0) = 0 * -inf``.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.pow)(0.0, 0.5), jax.grad(safe.pow)(0.0, 2.5))
        0.0 0.0
    """
    if isinstance(p, (int, float)) and not isinstance(p, bool):
        return _pow_static(_inexact(x), p)
    x, p = jnp.broadcast_arrays(*_common(x, p))
    return _pow_array(x, p)


def _pow_dx(x, p, is_int):
    bad = (x == 0) & (p < 1)
    if is_int is False:
        bad = bad | (x < 0)
    elif is_int is not True:
        bad = bad | ((x < 0) & ~is_int)
    xs = _mask(~bad, x)
    if isinstance(p, (int, float)):
        raw = p * jnp.power(xs, p - 1) if p != 0 else jnp.zeros_like(x)
    else:
        raw = p * jnp.power(xs, p - 1)
    return jnp.where(bad, 0, raw)


@ft.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _pow_static(x, p):
    return jnp.power(x, p)


@_pow_static.defjvp
def _pow_static_jvp(p, primals, tangents):
    (x,), (t,) = primals, tangents
    y = _pow_static(x, p)
    return y, _pow_dx(x, p, float(p).is_integer()) * t


@jax.custom_jvp
def _pow_array(x, p):
    return jnp.power(x, p)


@_pow_array.defjvp
def _pow_array_jvp(primals, tangents):
    (x, p), (tx, tp) = primals, tangents
    y = _pow_array(x, p)
    dx = _pow_dx(x, p, p == jnp.round(p))
    pos = x > 0
    dp = jnp.where(pos, y * jnp.log(_mask(pos, x)), 0)
    return y, dx * tx + dp * tp


def xlogy(x: ArrayLike, y: ArrayLike) -> jax.Array:
    """``x * log(y)``, 0 where ``x == 0``, with finite derivatives at ``y = 0``.

    ``xlogy(x, y) = jax.scipy.special.xlogy(x, y)``, bit for bit. The derivatives are
    ``log(y)`` in ``x`` and ``x / y`` in ``y`` for ``y > 0``, and **both are 0 where
    y <= 0**. At ``x = 0`` the one in ``y`` is the true partial derivative (``xlogy(0, y)``
    is 0 for every ``y``, so also at ``(0, 0)``); the one in ``x`` at ``y = 0`` is a
    convention (``xlogy(h, 0)`` is -inf for every ``h > 0``: there is no derivative). At
    ``x = 0, y > 0`` they are the true ``(log(y), 0)``.

    ``xlogy(x, x)`` at 0 therefore gets gradient 0, while ``x * log(x)`` has the one-sided
    derivative -inf there: fine where that element is masked out (its cotangent is 0), a
    silent wrong slope where it is not. For ``x * log(x)`` itself use :func:`xlogx`.

    Why the naive ``x * log(y)`` gives NaN: at ``(0, 0)`` the value ``0 * -inf`` is already
    NaN; ``jax.scipy.special.xlogy`` fixes the value, but its derivative in ``x`` is
    ``log(0) = -inf``, and a zero gradient times it is NaN.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.xlogy, (0, 1))(0.0, 0.0))
        (Array(0., dtype=float32, weak_type=True), Array(0., dtype=float32, weak_type=True))
    """
    return _xlogy(*_common(x, y))


@jax.custom_jvp
def _xlogy(x, y):
    return jsp.xlogy(x, y)


@_xlogy.defjvp
def _xlogy_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    out = _xlogy(x, y)
    pos = y > 0
    ys = _mask(pos, y)
    return out, jnp.where(pos, jnp.log(ys), 0) * tx + jnp.where(pos, x / ys, 0) * ty


def _xlogx_coef(x, y):
    pos = x > 0
    inner = jnp.log(_mask(pos, x)) + 1
    return jnp.where(pos, inner, jnp.where(x == 0, -jnp.inf, 0).astype(x.dtype))


xlogx = _unary(
    lambda x: jsp.xlogy(x, x),
    _xlogx_coef,
    "xlogx",
    """``x * log(x)``, 0 at 0, with its true derivative ``-inf`` at 0.

    ``xlogx(x) = jax.scipy.special.xlogy(x, x)``, bit for bit. The derivative is
    ``log(x) + 1`` for ``x > 0``; at ``x = 0`` we return **-inf, the true one-sided
    derivative** (the entropy term has a vertical tangent there; a finite number would be a
    silent wrong answer). For ``x < 0`` (value NaN) we take 0.

    **A -inf derivative still turns into NaN when it meets a zero gradient.** For entropies of
    a softmax, compute ``-sum(p * log_softmax(z))`` instead, which is smooth in ``z``.

    Why the naive ``xlogy(x, x)`` gives NaN: its derivative is ``log(y) + x / y`` evaluated
    at ``y = x = 0``: ``-inf + 0 / 0``.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.xlogx)(0.0), jax.grad(safe.xlogx)(1.0))
        -inf 1.0
    """,
)


def div(x: ArrayLike, y: ArrayLike, fill: ArrayLike = 0.0) -> jax.Array:
    """``x / y`` where ``y != 0``, and ``fill`` where ``y == 0``, with gradient 0 there.

    Away from ``y == 0`` the value is ``x / y`` bit for bit, with the usual derivatives;
    where ``y == 0`` the value is ``fill`` (default 0) and **the derivatives in x and y are
    0** (the gradient in ``fill`` is 1 there). Built with the double-where trick, so it is
    plain ``jnp`` and every transformation sees ordinary operations.

    Why the naive ``jnp.where(y != 0, x / y, 0)`` gives NaN: the unselected ``x / 0`` is still
    differentiated, its derivative ``-x / 0**2`` is inf or NaN, and ``0 * inf = NaN``.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.div, (0, 1))(1.0, 0.0))
        (Array(0., dtype=float32, weak_type=True), Array(0., dtype=float32, weak_type=True))
    """
    x, y = _common(x, y)
    nz = y != 0
    return jnp.where(nz, x / _mask(nz, y), fill)


# ---------------------------------------------------------------------------------------------
# Inverse trigonometric and two-argument functions.


def _clip_unit(x):
    return jnp.clip(x, -1, 1)


def _arc_coef(sign):
    def coef(x, y):
        inside = jnp.abs(x) < 1
        xs = _mask(inside, x, 0.0)
        return jnp.where(inside, sign * lax.rsqrt((1 - xs) * (1 + xs)), 0)

    return coef


_ARC_DOC = """{name}, clipped to the domain [-1, 1], with derivative 0 at and beyond +-1.

    Inside [-1, 1] the value is ``jnp.{name}(x)``, bit for bit; outside, it is the value at the
    nearest endpoint (``jnp.{name}`` gives NaN). The derivative is ``{deriv}`` for
    ``|x| < 1``, untouched (no epsilon shrinks the domain, so no gradient is lost inside it);
    except under differentiation, we take **0 for |x| >= 1**: the derivative of the clipped
    function outside, and at +-1 a convention, since the true one-sided derivative is
    infinite there (``{name}`` behaves like a square root at the endpoints).

    Why the naive version gives NaN: ``jnp.{name}(jnp.clip(x, -1, 1))`` keeps the value
    finite but at ``x = +-1`` its derivative is ``1 / sqrt(0) = inf``, and ``inf`` times a
    zero gradient, or times the clip's 0 outside, is NaN.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.{name})(1.0), safe.{name}(1.5) == safe.{name}(1.0))
        0.0 True
"""

arccos = _unary(
    lambda x: jnp.arccos(_clip_unit(x)),
    _arc_coef(-1.0),
    "arccos",
    _ARC_DOC.format(name="arccos", deriv="-1 / sqrt(1 - x**2)"),
)
arcsin = _unary(
    lambda x: jnp.arcsin(_clip_unit(x)),
    _arc_coef(1.0),
    "arcsin",
    _ARC_DOC.format(name="arcsin", deriv="1 / sqrt(1 - x**2)"),
)


def _arctanh_coef(x, y):
    inside = jnp.abs(x) < 1
    xs = _mask(inside, x, 0.0)
    return jnp.where(inside, 1 / ((1 - xs) * (1 + xs)), 0)


arctanh = _unary(
    lambda x: jnp.arctanh(_clip_unit(x)),
    _arctanh_coef,
    "arctanh",
    """Inverse hyperbolic tangent, clipped to [-1, 1], with derivative 0 at and beyond +-1.

    Inside [-1, 1] the value is ``jnp.arctanh(x)``, bit for bit (``+-inf`` at ``+-1``);
    outside it is ``+-inf`` instead of NaN. The derivative is ``1 / (1 - x**2)`` for
    ``|x| < 1``; except under differentiation, we take **0 for |x| >= 1**, a convention (the
    value there is already infinite, and the true derivative is +inf).

    Why the naive version gives NaN: its derivative at +-1 is ``1 / 0 = inf``, and a zero
    gradient (a masked entry) times inf is NaN.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(lambda x: 0.0 * safe.arctanh(x))(1.0))
        0.0
    """,
)


def _common(*args: ArrayLike) -> list[jax.Array]:
    """The arguments as arrays of one inexact dtype; Python numbers stay weakly typed."""
    dt = jnp.result_type(*args)
    if not jnp.issubdtype(dt, jnp.inexact):
        dt = jax.dtypes.canonicalize_dtype(jnp.float64)
    return [jnp.asarray(a, dt) for a in args]


def _binary(fn):
    def wrapper(a: ArrayLike, b: ArrayLike) -> jax.Array:
        return fn(*_common(a, b))

    return wrapper


@jax.custom_jvp
def _hypot(x, y):
    return jnp.hypot(x, y)


@_hypot.defjvp
def _hypot_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    h = _hypot(x, y)
    pos = h > 0
    hs = _mask(pos, h)
    return h, jnp.where(pos, x / hs, 0) * tx + jnp.where(pos, y / hs, 0) * ty


def hypot(x: ArrayLike, y: ArrayLike) -> jax.Array:
    """``sqrt(x**2 + y**2)`` without overflow, with gradient 0 at the origin.

    ``hypot(x, y) = jnp.hypot(x, y)``, bit for bit. The gradient is ``(x, y) / hypot(x, y)``
    away from the origin; except under differentiation, we take **(0, 0) at the origin**,
    the minimum-norm element of the Clarke subdifferential there (the unit disc).

    Why the naive version misbehaves: ``jnp.hypot``'s gradient at the origin is
    ``(0.5, 0.5)`` (inside the disc, but not minimal); ``torch.hypot``'s is NaN.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.hypot, (0, 1))(0.0, 0.0))
        (Array(0., dtype=float32, weak_type=True), Array(0., dtype=float32, weak_type=True))
    """
    return _binary(_hypot)(x, y)


@jax.custom_jvp
def _atan2(y, x):
    return jnp.arctan2(y, x)


def _pow2_scale(m: jax.Array) -> jax.Array:
    """A power of two ``k`` for ``m = |x| + |y|`` (``max(|x|, |y|)`` up to a factor 2): with
    it, ``(k x)**2 + (k y)**2`` and its reciprocal are normal numbers, and so is the square of
    a component down to ``eps`` times the other (its share of the sum). ``k = 1`` for moderate
    ``m`` (float32: ``2**-39 <= m <= 2**62``), one power above and one below, so the scaling
    is exact. For float32 and float64 (``_atan2_coefs`` computes smaller ones in float32)."""
    fi = jnp.finfo(m.dtype)  # the normal numbers are [2**minexp, 2**maxexp)
    lo = -(-(fi.minexp + 2 * fi.nmant) // 2)  # max >= 2**lo: (eps max)**2 is normal
    hi = (fi.maxexp - 1) // 2 - 1  # max <= 2**hi: 2 max**2 and its reciprocal are normal
    k_small, k_big = 2.0 ** (lo - fi.minexp), 2.0 ** (hi - fi.maxexp)
    k = jnp.where(m > 2.0**hi, k_big, jnp.where(m < 2.0 ** (lo + 1), k_small, 1.0))
    return k.astype(m.dtype)


def _atan2_coefs(y, x):
    """``(x, -y) / (x**2 + y**2)``, 0 at the origin (and for NaN), on ``(x, y)`` scaled by a
    power of two ``k`` so that the squares neither overflow nor underflow: ``x / (x**2 +
    y**2) = k (k x) / ((k x)**2 + (k y)**2)``, the factor ``k`` applied last. One division and
    one fused loop, as the naive rule; ``+0``, not ``-0``, at the origin."""
    if jnp.finfo(x.dtype).bits < 32:  # float32 holds their squares: no scaling needed there
        dy, dx = _atan2_coefs(y.astype(jnp.float32), x.astype(jnp.float32))
        return dy.astype(x.dtype), dx.astype(x.dtype)
    m = jnp.abs(x) + jnp.abs(y)  # cheaper than the max
    ok = m > 0
    k = _pow2_scale(m)
    xs, nys = jnp.where(ok, x * k, 0), jnp.where(ok, -y * k, 0)
    s = xs * xs + nys * nys
    pos = s > 0
    c = jnp.where(pos, 1 / _mask(pos, s), 0)
    return (xs * c) * k, (nys * c) * k


@_atan2.defjvp
def _atan2_jvp(primals, tangents):
    (y, x), (ty, tx) = primals, tangents
    dy, dx = _atan2_coefs(y, x)
    return _atan2(y, x), dy * ty + dx * tx


def atan2(y: ArrayLike, x: ArrayLike) -> jax.Array:
    """The angle of ``(x, y)``, ``jnp.arctan2(y, x)``, with gradient 0 at the origin.

    The value is ``jnp.arctan2(y, x)``, bit for bit. The gradient in ``(y, x)`` is
    ``(x, -y) / (x**2 + y**2)`` away from the origin; except under differentiation, we take
    **(0, 0) at the origin**. **This is a convention only: atan2 is discontinuous at the
    origin, so no gradient, and no subgradient, exists there.** (PyTorch returns the same
    ``[0, 0]``; JAX returns NaN.) Away from the origin the gradient is computed on ``(x, y)``
    scaled by a power of two, so it does not overflow or underflow where ``x**2 + y**2``
    would (at ``|(x, y)| ~ 1e-30`` or ``1e30`` in float32).

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.atan2, (0, 1))(0.0, 0.0))
        (Array(0., dtype=float32, weak_type=True), Array(0., dtype=float32, weak_type=True))
    """
    return _binary(_atan2)(y, x)


arctan2 = atan2


# ---------------------------------------------------------------------------------------------
# Kinks: abs, maximum, minimum, clip (minimum-norm Clarke conventions).


abs = _unary(
    jnp.abs,
    lambda x, y: jnp.sign(x),
    "abs",
    """Absolute value (real), with derivative 0 at 0.

    ``abs(x) = jnp.abs(x)``, bit for bit. The derivative is ``sign(x)``: except under
    differentiation, we take **0 at x = 0**, the minimum-norm element of the Clarke
    subdifferential ``[-1, 1]`` (PyTorch's choice; ``jax.grad(jnp.abs)(0.)`` is 1).

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.abs)(0.0))
        0.0
    """,
)


@jax.custom_jvp
def _maximum(x, y):
    return jnp.maximum(x, y)


@_maximum.defjvp
def _maximum_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    out = _maximum(x, y)
    w = jnp.where(x > y, 1.0, jnp.where(x == y, 0.5, 0.0)).astype(out.dtype)
    return out, w * tx + (1 - w) * ty


def maximum(x: ArrayLike, y: ArrayLike) -> jax.Array:
    """Elementwise maximum, splitting the derivative 0.5 / 0.5 on ties.

    ``maximum(x, y) = jnp.maximum(x, y)``, bit for bit. The derivative is 1 for the larger
    argument; except under differentiation, on a tie ``x == y`` we take **0.5 for each**,
    the minimum-norm element of the Clarke subdifferential ``conv{(1, 0), (0, 1)}`` (also
    JAX's and PyTorch's choice; this function pins it).

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.maximum, (0, 1))(1.0, 1.0))
        (Array(0.5, dtype=float32, weak_type=True), Array(0.5, dtype=float32, weak_type=True))
    """
    return _binary(_maximum)(x, y)


def minimum(x: ArrayLike, y: ArrayLike) -> jax.Array:
    """Elementwise minimum, splitting the derivative 0.5 / 0.5 on ties (see ``maximum``).

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.minimum)(1.0, 1.0))
        0.5
    """
    return _binary(_minimum)(x, y)


@jax.custom_jvp
def _minimum(x, y):
    return jnp.minimum(x, y)


@_minimum.defjvp
def _minimum_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    out = _minimum(x, y)
    w = jnp.where(x < y, 1.0, jnp.where(x == y, 0.5, 0.0)).astype(out.dtype)
    return out, w * tx + (1 - w) * ty


def clip(x: ArrayLike, min: ArrayLike | None = None, max: ArrayLike | None = None) -> jax.Array:
    """``minimum(maximum(x, min), max)``, with derivative 0.5 at a bound.

    The value is ``jnp.clip(x, min, max)``, bit for bit. The derivative in ``x`` is 1 inside,
    0 outside; except under differentiation, exactly at a bound we take **0.5 for x and 0.5
    for the bound**: the minimum-norm element of the Clarke subdifferential of the clip as a
    function of ``(x, bound)`` (it is ``maximum``'s tie rule). As a function of ``x`` alone
    the subdifferential is ``[0, 1]``; JAX also gives 0.5, PyTorch's ``clamp`` gives 1.

    Example:
        >>> import jax
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.clip)(0.0, 0.0, 1.0), jax.grad(safe.clip)(0.5, 0.0, 1.0))
        0.5 1.0
    """
    x = _inexact(x)
    if min is not None:
        x = maximum(x, jnp.asarray(min, x.dtype))
    if max is not None:
        x = minimum(x, jnp.asarray(max, x.dtype))
    return x


# ---------------------------------------------------------------------------------------------
# Norms and statistics.


def _axes(x: jax.Array, ord, axis: Axis) -> tuple[tuple[int, ...], bool]:
    """The reduced axes, and whether this is a matrix norm, following ``jnp.linalg.norm``."""
    if axis is None:
        if ord is None:
            return tuple(range(x.ndim)), False
        if x.ndim in (1, 2):
            return tuple(range(x.ndim)), x.ndim == 2
        raise ValueError(
            f"norm with ord={ord!r} and axis=None needs a 1-D or 2-D array, got {x.ndim}-D; "
            "pass axis= explicitly."
        )
    if isinstance(axis, int):
        return (axis % x.ndim,), False
    axis = tuple(a % x.ndim for a in axis)
    if len(axis) == 1:
        return axis, False
    if len(axis) == 2:
        return axis, True
    raise ValueError(f"norm: axis must be None, an int or a pair of ints, got {axis!r}.")


def _ties(hit: jax.Array, axes) -> jax.Array:
    """Equal weights on the ``hit`` entries along ``axes``: the minimum-norm convex weights."""
    hit = hit.astype(jnp.result_type(float))
    cnt = jnp.sum(hit, axis=axes, keepdims=True)
    return hit / jnp.maximum(cnt, 1)


def _norm_grad(x, n, ord, axes, matrix):
    """The minimum-norm Clarke subgradient of the norm ``n`` (keepdims) at ``x``."""
    if ord in (None, "fro") or (ord == 2 and not matrix):
        pos = n > 0
        return jnp.where(pos, x / _mask(pos, n), 0)
    if not matrix:
        if ord == 1:
            return jnp.sign(x)
        if ord in (jnp.inf, -jnp.inf):
            return jnp.sign(x) * _ties(jnp.abs(x) == n, axes).astype(x.dtype)
        if ord == 0:
            return jnp.zeros_like(x)
        ok = (x != 0) & (n > 0)
        r = jnp.abs(x) / _mask(ok, n)
        return jnp.where(ok, jnp.sign(x) * jnp.power(_mask(ok, r), ord - 1), 0)
    if ord in (1, -1, jnp.inf, -jnp.inf):
        inner, outer = (axes[0], axes[1]) if ord in (1, -1) else (axes[1], axes[0])
        s = jnp.sum(jnp.abs(x), axis=inner, keepdims=True)
        return jnp.sign(x) * _ties(s == n, outer).astype(x.dtype)
    if ord in (2, -2, "nuc"):
        xm = jnp.moveaxis(x, axes, (-2, -1))
        u, s, vh = jnp.linalg.svd(xm, full_matrices=False)
        if ord == "nuc":
            w = (s > 0).astype(x.dtype)
        else:
            target = jnp.moveaxis(n, axes, (-2, -1))[..., 0]
            w = _ties((s == target) & (target > 0), -1).astype(x.dtype)
        g = (u * w[..., None, :]) @ vh
        return jnp.moveaxis(g, (-2, -1), axes)
    raise ValueError(f"norm: unsupported ord={ord!r} for a matrix norm.")


@ft.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _norm_keep(x, ord, axis):
    return jnp.linalg.norm(x, ord=ord, axis=axis, keepdims=True)


@_norm_keep.defjvp
def _norm_keep_jvp(ord, axis, primals, tangents):
    (x,), (t,) = primals, tangents
    n = _norm_keep(x, ord, axis)
    axes, matrix = _axes(x, ord, axis)
    g = _norm_grad(x, n, ord, axes, matrix)
    return n, jnp.sum(g * t, axis=axes, keepdims=True)


def norm(
    x: ArrayLike,
    ord: int | float | str | None = None,
    axis: Axis = None,
    keepdims: bool = False,
) -> jax.Array:
    """Vector or matrix norm, ``jnp.linalg.norm``, with gradient 0 at the zero vector.

    The value is ``jnp.linalg.norm(x, ord, axis, keepdims)``, bit for bit, with the same
    rules for ``ord`` (None, 'fro', 'nuc', 1, 2, inf, -inf, 0, any p; 2-D ``axis`` means a
    matrix norm). The gradient is the usual one (``x / norm(x)`` for the 2-norm) where the
    norm is differentiable; except under differentiation, **at the zero vector we take 0**,
    the minimum-norm element of the subdifferential (the unit ball of the dual norm), and at
    ties (``ord=inf``: several entries with the largest ``|x_i|``; matrix ``ord=2``: a
    repeated top singular value) equal weights on the tied entries, again the minimum-norm
    subgradient. For ``ord=1`` it is ``sign(x)``. Second derivatives of the matrix norms
    ``2``, ``-2``, ``'nuc'`` are not supported (they go through the SVD).

    Why the naive version gives NaN: ``jnp.linalg.norm`` is ``sqrt(sum(x**2))``, so at 0 the
    chain rule gives ``inf * 0 = NaN`` (the ``inf`` from sqrt, the 0 from ``2 x``).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.norm)(jnp.zeros(3)))
        [0. 0. 0.]
        >>> print(jax.grad(jnp.linalg.norm)(jnp.zeros(3)))
        [nan nan nan]
    """
    x = _inexact(x)
    axis = axis if axis is None or isinstance(axis, int) else tuple(axis)
    axes, _ = _axes(x, ord, axis)
    n = _norm_keep(x, ord, axis)
    return n if keepdims else jnp.squeeze(n, axis=axes)


def normalize(x: ArrayLike, axis: Axis = -1, eps: float = 1e-12, ord: int | float = 2) -> jax.Array:
    """``x / max(norm(x), eps)`` along ``axis`` (``torch.nn.functional.normalize``).

    The value is ``x / jnp.maximum(jnp.linalg.norm(x, ord, axis, keepdims=True), eps)``, bit
    for bit. ``eps`` bounds the denominator away from 0: where ``norm(x) < eps`` the result is
    ``x / eps`` and its derivative is the finite ``I / eps`` (at ``x = 0`` too); a tie
    ``norm(x) == eps`` splits 0.5 / 0.5 (``maximum``). With ``eps=0`` the zero vector maps to
    0 with gradient 0, a convention (``x / |x|`` is discontinuous at 0).

    Why the naive version gives NaN: at ``x = 0`` the norm's own derivative is NaN (see
    ``norm``), and ``maximum`` passes 0 times it on.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> print(jax.jacobian(safe.normalize)(jnp.zeros(2), eps=0.5))
        [[2. 0.]
         [0. 2.]]
    """
    x = _inexact(x)
    return div(x, maximum(norm(x, ord=ord, axis=axis, keepdims=True), eps))


def var(x: ArrayLike, axis: Axis = None, ddof: int = 0, keepdims: bool = False) -> jax.Array:
    """Variance, ``jnp.var(x, axis, ddof=ddof, keepdims=keepdims)``.

    The value is ``jnp.var``'s, bit for bit. The variance is smooth, and so is its plain
    derivative ``2 (x - mean) / (n - ddof)``: it is here so that ``safe.var`` and
    ``safe.std`` can be used together, and to pin the numpy default ``ddof=0`` (PyTorch's
    default is 1; ``gradsan.torch.safe.var`` uses 0 too).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.var)(jnp.ones(3)))
        [0. 0. 0.]
    """
    return jnp.var(_inexact(x), axis=axis, ddof=ddof, keepdims=keepdims)


def std(x: ArrayLike, axis: Axis = None, ddof: int = 0, keepdims: bool = False) -> jax.Array:
    """Standard deviation, ``sqrt(var(x))``, with gradient 0 at constant data.

    The value is ``jnp.std(x, axis, ddof=ddof, keepdims=keepdims)``, bit for bit. The
    gradient is ``(x - mean) / ((n - ddof) std)`` where ``std > 0``; except under
    differentiation, **at constant data (std = 0) we take 0**: std is a seminorm of
    ``x - mean``, and 0 is the minimum-norm element of its subdifferential there.

    Why the naive version gives NaN: ``jnp.std`` is ``sqrt(var)``; at zero spread sqrt's
    derivative is ``inf`` and var's is ``0``: ``inf * 0 = NaN``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.std)(jnp.ones(3)))
        [0. 0. 0.]
    """
    return sqrt(var(x, axis=axis, ddof=ddof, keepdims=keepdims))


def standardize(
    x: ArrayLike,
    axis: Axis = -1,
    eps: float = 1e-5,
    ddof: int = 0,
    form: Literal["var_eps", "std_eps"] = "var_eps",
) -> jax.Array:
    """``(x - mean) / sqrt(var + eps)`` (``form="var_eps"``) or ``(x - mean) / (std + eps)``.

    - ``form="var_eps"`` (PyTorch, ``jax.nn.standardize``): the value is
      ``(x - mean) / jnp.sqrt(jnp.var(x, axis, ddof, keepdims=True) + eps)``, bit for bit.
      (``jax.nn.standardize`` multiplies by ``rsqrt`` instead, so it may differ in the last
      bit.) With ``eps > 0`` its plain gradient is already finite.
    - ``form="std_eps"`` (Flux's ``normalise``): ``(x - mean) / (jnp.std(x) + eps)``, bit for
      bit. At zero spread its true derivative is finite, ``(I - 1 1^T / n) / eps``; we return
      it, where plain AD returns NaN (``std``'s ``inf * 0``, see ``std``).

    With ``eps=0`` the result at zero spread is 0 with gradient 0, a convention (the function
    is discontinuous there).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> f = lambda x: jnp.sum(jnp.sin(safe.standardize(x, form="std_eps")))
        >>> print(jax.grad(f)(jnp.ones((2, 2))))
        [[0. 0.]
         [0. 0.]]
    """
    x = _inexact(x)
    centered = x - jnp.mean(x, axis=axis, keepdims=True)
    if form == "var_eps":
        den = sqrt(var(x, axis=axis, ddof=ddof, keepdims=True) + eps)
    elif form == "std_eps":
        den = std(x, axis=axis, ddof=ddof, keepdims=True) + eps
    else:
        raise ValueError(f"standardize: form must be 'var_eps' or 'std_eps', got {form!r}.")
    return div(centered, den)


def layer_norm(
    x: ArrayLike,
    weight: ArrayLike | None = None,
    bias: ArrayLike | None = None,
    axis: Axis = -1,
    eps: float = 1e-5,
    form: Literal["var_eps", "std_eps"] = "var_eps",
) -> jax.Array:
    """Layer normalization: ``standardize(x, axis, eps, form=form) * weight + bias``.

    The normalization and its derivative choices are ``standardize``'s: with
    ``form="std_eps"`` (``(x - mean) / (std + eps)``) the gradient at zero spread is the
    finite true one, where plain AD gives NaN. ``weight`` and ``bias`` broadcast against the
    normalized axes and are optional.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> y = safe.layer_norm(jnp.ones((2, 3)), jnp.full(3, 2.0), jnp.ones(3), form="std_eps")
        >>> print(y)
        [[1. 1. 1.]
         [1. 1. 1.]]
    """
    y = standardize(x, axis=axis, eps=eps, form=form)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def cosine_similarity(x1: ArrayLike, x2: ArrayLike, axis: int = -1, eps: float = 1e-8) -> jax.Array:
    """``sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps))`` along ``axis`` (PyTorch's formula).

    The value is that expression with ``jnp.linalg.norm``, bit for bit. ``eps`` clamps each
    norm separately, so where a vector is (nearly) zero the similarity is ~0 and **the
    gradient is finite**: at ``x1 = 0`` it is ``x2 / (eps * max(|x2|, eps))`` in ``x1`` and 0
    in ``x2``.

    Why the naive version gives NaN: the norm's derivative at the zero vector is NaN.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> g = jax.grad(safe.cosine_similarity, (0, 1))(jnp.zeros(2), jnp.ones(2))
        >>> print(bool(jnp.isfinite(g[0]).all()), g[1])
        True [0. 0.]
    """
    x1, x2 = _common(x1, x2)
    dot = jnp.sum(x1 * x2, axis=axis)
    n1 = maximum(norm(x1, axis=axis), eps)
    n2 = maximum(norm(x2, axis=axis), eps)
    return dot / (n1 * n2)


def pairwise_distance(
    x1: ArrayLike, x2: ArrayLike, ord: int | float = 2, axis: int = -1, keepdims: bool = False
) -> jax.Array:
    """``norm(x1 - x2, ord, axis)``, 0 on coincident points with gradient 0 there.

    The value is ``jnp.linalg.norm(x1 - x2, ord=ord, axis=axis)``, bit for bit. Unlike
    ``torch.nn.functional.pairwise_distance`` no ``eps`` is added to the difference. Where the
    points coincide we take **gradient 0**, the minimum-norm subgradient (see ``norm``).

    Why the naive version gives NaN: the 2-norm's derivative at the zero vector is NaN.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> print(jax.grad(safe.pairwise_distance)(jnp.ones(2), jnp.ones(2)))
        [0. 0.]
    """
    x1, x2 = _common(x1, x2)
    return norm(x1 - x2, ord=ord, axis=axis, keepdims=keepdims)


def cdist(x1: ArrayLike, x2: ArrayLike, p: int | float = 2) -> jax.Array:
    """All pairwise distances: ``out[..., i, j] = norm(x1[..., i, :] - x2[..., j, :], p)``.

    Shapes ``(..., n, d)`` and ``(..., m, d)`` give ``(..., n, m)``, as ``torch.cdist``. The
    value is the plain difference-then-norm, bit for bit (``torch.cdist`` may use a matmul
    expansion instead). Coincident points have distance 0 and **gradient 0** (see ``norm``).

    Why the naive version gives NaN: the distance of a point to itself is ``norm(0)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> x = jnp.array([[0.0, 0.0], [3.0, 4.0]])
        >>> print(safe.cdist(x, x))
        [[0. 5.]
         [5. 0.]]
        >>> print(jax.grad(lambda x: safe.cdist(x, x).sum())(x))
        [[-1.2 -1.6]
         [ 1.2  1.6]]
    """
    x1, x2 = _common(x1, x2)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    return norm(diff, ord=p, axis=-1)


# ---------------------------------------------------------------------------------------------
# Masked reductions.


def _reduce_axes(x, axis):
    if axis is None:
        return tuple(range(x.ndim))
    if isinstance(axis, int):
        return (axis % x.ndim,)
    return tuple(a % x.ndim for a in axis)


def _prep_mask(x: ArrayLike, where: ArrayLike | None) -> tuple[jax.Array, jax.Array, bool]:
    x = _inexact(x)
    if where is None:
        return x, jnp.ones(x.shape, bool), False
    return x, jnp.broadcast_to(jnp.asarray(where, bool), x.shape), True


def _lse_parts(x, mask, axes, masked):
    """``jax.nn.logsumexp(x, axes, keepdims=True, where=mask)``, op for op, and its ``exp(x -
    max)`` and sum, for the derivative to reuse. ``safe.log`` in place of ``jnp.log`` (the
    same values) keeps second derivatives finite on fully masked rows."""
    where = mask if masked else None
    a = jnp.where(mask, x, 0) if masked else x
    amax = jnp.max(a.real, axis=axes, keepdims=True, where=where, initial=-jnp.inf)
    amax = lax.stop_gradient(lax.select(jnp.isfinite(amax), amax, lax.full_like(amax, 0)))
    e = lax.exp(lax.sub(a, amax.astype(a.dtype)))
    s = jnp.sum(e, axis=axes, keepdims=True, where=where)
    sa = s if jnp.iscomplexobj(s) else jnp.abs(s)
    return lax.add(log(sa), amax.astype(sa.dtype)), e, s


@ft.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _lse_keep(x, mask, axes, masked):
    return _lse_parts(x, mask, axes, masked)[0]


@_lse_keep.defjvp
def _lse_keep_jvp(axes, masked, primals, tangents):
    (x, mask), (t, _) = primals, tangents
    out, e, s = _lse_parts(x, mask, axes, masked)
    # softmax = exp(x - max) / sum, from the forward pass's own exp; one select masks the
    # rows whose value is not finite (fully masked, +-inf) and the masked entries
    fin = jnp.isfinite(out)
    p = jnp.where(mask & fin if masked else fin, e / _mask(fin, s), 0)
    return out, jnp.sum(p * t, axis=axes, keepdims=True)


def logsumexp(
    x: ArrayLike, axis: Axis = None, where: ArrayLike | None = None, keepdims: bool = False
) -> jax.Array:
    """``log(sum(exp(x), where=where))`` along ``axis``, safe on fully masked rows.

    The value is ``jax.nn.logsumexp(x, axis, keepdims=keepdims, where=where)``, bit for bit;
    a row with no selected entry gives **-inf** (the log of an empty sum). The gradient is
    ``softmax(x)`` on the selected entries and 0 on masked ones; on a fully masked row (or
    one whose value is +-inf) we take **0**, with no NaN.

    Why the naive version gives NaN: the gradient ``exp(x - lse)`` is ``exp(-inf + inf)``
    on a fully masked row.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> mask = jnp.array([[True, True], [False, False]])
        >>> x = jnp.zeros((2, 2))
        >>> print(safe.logsumexp(x, axis=-1, where=mask))
        [0.6931472      -inf]
        >>> print(jax.grad(lambda x: safe.logsumexp(x, -1, mask)[0])(x))
        [[0.5 0.5]
         [0.  0. ]]
    """
    x, mask, masked = _prep_mask(x, where)
    axes = _reduce_axes(x, axis)
    out = _lse_keep(x, mask, axes, masked)
    return out if keepdims else jnp.squeeze(out, axis=axes)


@ft.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _softmax(x, mask, axis, masked):
    return jax.nn.softmax(x, axis=axis, where=mask if masked else None)


@_softmax.defjvp
def _softmax_jvp(axis, masked, primals, tangents):
    (x, mask), (t, _) = primals, tangents
    p = _softmax(x, mask, axis, masked)
    return p, p * (t - jnp.sum(p * t, axis=axis, keepdims=True))


def softmax(x: ArrayLike, axis: int = -1, where: ArrayLike | None = None) -> jax.Array:
    """``exp(x) / sum(exp(x))`` over the selected entries, 0 elsewhere; safe on empty rows.

    The value is ``jax.nn.softmax(x, axis, where=where)``, bit for bit: 0 on masked entries,
    and **a row of 0** where the whole row is masked. The Jacobian is the usual
    ``diag(p) - p p^T``; on masked entries and fully masked rows it is **0**, no NaN.

    Why a naive masked softmax gives NaN: filling masked entries with -inf makes a fully
    masked row ``exp(-inf - (-inf)) = exp(nan)``.

    Example:
        >>> import jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> print(safe.softmax(jnp.zeros((2, 2)), where=jnp.array([[True, True], [False, False]])))
        [[0.5 0.5]
         [0.  0. ]]
    """
    x, mask, masked = _prep_mask(x, where)
    if not masked:  # nothing masked: jax.nn.softmax's own derivative is this one
        return jax.nn.softmax(x, axis=axis)
    return _softmax(x, mask, axis % x.ndim, masked)


def _log_softmax_parts(x, mask, axis, masked):
    """``jax.nn.log_softmax(x, axis, where=mask)``, op for op, and its ``exp(x - max)`` and
    sum. On masked rows a row maximum of -inf (a fully masked row) is taken as 0 so that
    ``exp`` sees -inf and not NaN there (the values are -inf either way); ``safe.log`` keeps
    second derivatives finite on such rows."""
    where = mask if masked else None
    x_max = jnp.max(x, axis, where=where, initial=-jnp.inf, keepdims=True)
    if masked:
        x_max = jnp.where(x_max == -jnp.inf, 0, x_max)
    x_safe = jnp.where(mask, x, -jnp.inf) if masked else x
    shifted = x_safe - lax.stop_gradient(x_max)
    e = jnp.exp(shifted)
    s = jnp.sum(e, axis, where=where, keepdims=True)
    result = shifted - log(s)
    if masked:
        result = jnp.where(mask, result, -jnp.inf)
    return result, e, s


@ft.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _log_softmax(x, mask, axis, masked):
    return _log_softmax_parts(x, mask, axis, masked)[0]


@_log_softmax.defjvp
def _log_softmax_jvp(axis, masked, primals, tangents):
    (x, mask), (t, _) = primals, tangents
    out, e, s = _log_softmax_parts(x, mask, axis, masked)
    # softmax = e / s from the forward pass's own exp and sum; 0 on masked entries and
    # fully masked rows
    p = jnp.where(mask, e / _mask(s > 0, s), 0)
    return out, jnp.where(mask, t - jnp.sum(p * t, axis=axis, keepdims=True), 0)


def log_softmax(x: ArrayLike, axis: int = -1, where: ArrayLike | None = None) -> jax.Array:
    """``x - logsumexp(x)`` over the selected entries; -inf elsewhere; safe on empty rows.

    The value is ``jax.nn.log_softmax(x, axis, where=where)``, bit for bit: **-inf** on
    masked entries, so a fully masked row is all -inf. The derivative is the usual
    ``I - softmax(x) 1^T`` on selected entries and **0** on masked entries and fully masked
    rows, with no NaN.

    Example:
        >>> import jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> print(safe.log_softmax(jnp.zeros(2), where=jnp.array([False, False])))
        [-inf -inf]
    """
    x, mask, masked = _prep_mask(x, where)
    if not masked:  # nothing masked: jax.nn.log_softmax's own derivative is this one
        return jax.nn.log_softmax(x, axis=axis)
    return _log_softmax(x, mask, axis % x.ndim, masked)


# ---------------------------------------------------------------------------------------------
# where with callable branches, and eigh.


def where(
    cond: ArrayLike,
    f_true: Callable | ArrayLike,
    f_false: Callable | ArrayLike,
    *args: ArrayLike,
    fill: float | tuple[float, float] = 1.0,
) -> jax.Array:
    """``jnp.where(cond, f_true(*args), f_false(*args))`` with the double-where trick.

    Each branch is evaluated on inputs replaced by ``fill`` where it is not selected
    (``fill`` may be a pair: the substitutes for ``f_true`` and for ``f_false``), so an
    unselected branch is never evaluated at its singular point and contributes **exactly 0**
    to the gradient. On the selected entries the value is the naive one, bit for bit.
    A branch may also be a constant instead of a callable.

    **The branches must be elementwise** (each output entry depends only on the same input
    entries), or the substitution changes the selected values too. Pick ``fill`` inside
    both branches' domains (the default 1 suits sqrt, log, 1/x, ...).

    Why the naive version gives NaN: ``jnp.where`` sends a zero gradient to the unselected
    branch, and e.g. ``log(0)``'s derivative ``inf`` times 0 is NaN.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> f = lambda x: safe.where(x > 0, jnp.sqrt, 0.0, x)
        >>> print(jax.grad(f)(0.0), jax.grad(f)(4.0))
        0.0 0.25
    """
    cond = jnp.asarray(cond, bool)
    fill_t, fill_f = fill if isinstance(fill, tuple) else (fill, fill)
    arrays = [jnp.asarray(a) for a in args]

    def branch(fn, select, fill_value):
        if not callable(fn):
            return fn
        masked = [jnp.where(select, a, jnp.asarray(fill_value, a.dtype)) for a in arrays]
        return fn(*masked)

    return jnp.where(cond, branch(f_true, cond, fill_t), branch(f_false, ~cond, fill_f))


def _default_tol(w):
    n = w.shape[-1]
    scale = jnp.max(jnp.abs(w), axis=-1, keepdims=True)[..., None]
    return 16 * n * jnp.finfo(w.dtype).eps * scale


@ft.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _eigh(a, tol):
    w, v = jnp.linalg.eigh(a)
    return w, v


@_eigh.defjvp
def _eigh_jvp(tol, primals, tangents):
    (a,), (t,) = primals, tangents
    w, v = _eigh(a, tol)
    da = (t + jnp.conj(jnp.swapaxes(t, -1, -2))) / 2
    vh = jnp.conj(jnp.swapaxes(v, -1, -2))
    m = vh @ da @ v
    dw = jnp.real(jnp.diagonal(m, axis1=-2, axis2=-1))
    gap = w[..., None, :] - w[..., :, None]  # gap[i, j] = w_j - w_i
    thresh = _default_tol(w) if tol is None else tol
    keep = jnp.abs(gap) > thresh
    f = jnp.where(keep, 1 / jnp.where(keep, gap, 1), 0)
    dv = v @ (f.astype(m.dtype) * m)
    return (w, v), (dw.astype(w.dtype), dv)


def eigh(a: ArrayLike, tol: float | None = None) -> tuple[jax.Array, jax.Array]:
    """Eigenvalues and eigenvectors of a symmetric matrix, finite on repeated eigenvalues.

    The values are ``jnp.linalg.eigh(a)``'s (ascending ``w``, columns of ``v``), bit for bit;
    like it, ``a`` is symmetrized, and the derivative is taken w.r.t. the symmetric part.
    The eigenvector derivative is ``dv = v (F * (v^T da v))`` with
    ``F[i, j] = 1 / (w_j - w_i)``; except under differentiation, we **drop the terms with
    |w_i - w_j| <= tol** (default ``16 n eps max|w|``). Individual eigenvectors of a
    repeated eigenvalue are not functions of ``a`` at all (any rotation in the eigenspace
    is valid), so they have no derivative; the terms we drop are exactly the
    within-eigenspace rotations, and the result is the true derivative of every loss that
    depends on the eigenvectors only through the eigenspaces (projectors ``V_k V_k^T``,
    their traces, ...). ``dw = diag(v^T da v)``: exact for distinct eigenvalues and for
    symmetric functions of a repeated cluster.

    **A loss that depends on a particular eigenvector inside a degenerate eigenspace has no
    gradient; this gives a finite number for it, not a correct one.**

    Why the naive version gives NaN: ``1 / (w_j - w_i) = inf`` for a repeated eigenvalue,
    and ``inf * 0 = NaN``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from gradsan.jax import safe
        >>> g = jax.grad(lambda a: safe.eigh(a)[1][0, 0] ** 2)(jnp.eye(2))
        >>> print(bool(jnp.isfinite(g).all()))
        True
    """
    a = _inexact(a)
    return _eigh(a, tol)
