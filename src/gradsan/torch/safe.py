"""Safe functions for PyTorch: the numpy names, the same values, correct derivatives.

The twin of ``gradsan.jax.safe``: the same names, the same arguments (numpy spelling:
``axis``, ``keepdims``, ``ddof``, ``where``), the same values and the same derivatives at
every singular point; ``tests/safe`` holds the two backends to each other. Values equal the
naive PyTorch expression bit for bit away from the singular points. Derivatives come from
``torch.autograd.Function`` (their backward passes are plain differentiable torch code, so
double backward works), or from plain torch with the double-where trick.

See ``gradsan.jax.safe`` for the mathematics; every docstring here states the choice made at
the singular point in one line, with an example.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch

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
Tensor = torch.Tensor


def _inexact(x) -> Tensor:
    """``x`` as a tensor; integers and bools become the default float dtype."""
    if not isinstance(x, Tensor):
        x = torch.as_tensor(x)
    if not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.get_default_dtype())
    return x


def _pair(a, b) -> tuple[Tensor, Tensor]:
    """Both as tensors of one inexact dtype; Python numbers do not promote (as in torch)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        dt = torch.result_type(a, b)
    else:
        dt = torch.result_type(torch.as_tensor(a), b)
    if not (dt.is_floating_point or dt.is_complex):
        dt = torch.get_default_dtype()
    return torch.as_tensor(a, dtype=dt), torch.as_tensor(b, dtype=dt)


def _mask(ok: Tensor, x: Tensor, fill: float = 1.0) -> Tensor:
    """The inner where of the double-where trick: ``x`` where ``ok``, else ``fill``."""
    return torch.where(ok, x, fill)


def _sum_to(g: Tensor, shape) -> Tensor:
    return g if g.shape == shape else g.sum_to_size(shape)


def _fast() -> bool:
    """Whether a backward pass may take its fast path: in-place kernels on fresh tensors and a
    data-dependent check for the singular points. Not when the backward itself is recorded
    (``create_graph=True`` turns grad mode on inside backward) and not under torch.compile,
    which trace the plain differentiable formulas instead. Both give the same values."""
    return not torch.is_grad_enabled() and not torch.compiler.is_compiling()


def _min_gt(t: Tensor, bound: float) -> bool:
    """``t.min() > bound`` (False for an empty, complex or NaN-holding ``t``): one reduction."""
    if t.numel() == 0 or t.is_complex():
        return False
    return bool(t.amin().item() > bound)


def _min_ge(t: Tensor, bound: float) -> bool:
    if t.numel() == 0 or t.is_complex():
        return False
    return bool(t.amin().item() >= bound)


def _all_nonzero(t: Tensor) -> bool:
    return t.numel() > 0 and int(torch.count_nonzero(t)) == t.numel()


def _unary(
    value: Callable,
    coef: Callable,
    name: str,
    doc: str,
    fast: Callable | None = None,
    fast_value: Callable | None = None,
) -> Callable:
    """An elementwise ``autograd.Function``: ``value(x)``, derivative ``coef(x, y)``.

    ``fast(x, y, g)`` computes ``g * coef(x, y)`` with fewer kernels when no singular point is
    present, or returns None; ``fast_value(x)`` likewise for the value."""

    def forward(ctx, x):
        y = fast_value(x) if fast_value is not None else None
        if y is None:
            y = value(x)
        ctx.save_for_backward(x, y)
        return y

    def backward(ctx, g):
        x, y = ctx.saved_tensors
        if fast is not None and _fast():
            out = fast(x, y, g)
            if out is not None:
                return out
        return g * coef(x, y)

    fn: type[torch.autograd.Function] = type(
        f"_{name.capitalize()}",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )

    def wrapper(x) -> Tensor:
        return fn.apply(_inexact(x))

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__doc__ = doc
    return wrapper


# ---------------------------------------------------------------------------------------------
# Elementwise roots, logs and powers.


def _sqrt_coef(x, y):
    pos = x > 0
    return torch.where(pos, 0.5 / _mask(pos, y), 0.0)


def _sqrt_fast(x, y, g):
    if not _min_gt(y, 0.0):
        return None
    return torch.div(g, y).mul_(0.5)  # torch's own g / (2 y), one fresh tensor


sqrt = _unary(
    torch.sqrt,
    _sqrt_coef,
    "sqrt",
    """``torch.sqrt(x)``, with derivative 0 for ``x <= 0`` (a convention at 0, where the true
    one-sided derivative is +inf). Naive: ``inf * 0 = NaN`` when a zero gradient reaches 0.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> (0.0 * safe.sqrt(x)).backward(); print(x.grad)
        tensor(0.)
    """,
    _sqrt_fast,
)


def _rsqrt_coef(x, y):
    pos = x > 0
    return torch.where(pos, -0.5 * _mask(pos, y) / _mask(pos, x), 0.0)


def _rsqrt_fast(x, y, g):
    if not _min_gt(x, 0.0):
        return None
    return torch.mul(y, -0.5).div_(x).mul_(g)


rsqrt = _unary(
    torch.rsqrt,
    _rsqrt_coef,
    "rsqrt",
    """``torch.rsqrt(x)``, with derivative 0 for ``x <= 0`` (a convention; -inf is true at 0).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> (0.0 * safe.rsqrt(x)).backward(); print(x.grad)
        tensor(0.)
    """,
    _rsqrt_fast,
)


def _cbrt_value(x):
    return torch.sign(x) * torch.abs(x).pow(1.0 / 3.0)


def _cbrt_coef(x, y):
    nz = x != 0
    ys = _mask(nz, y)
    return torch.where(nz, (1.0 / 3.0) / (ys * ys), 0.0)


def _cbrt_fast(x, y, g):
    if not _all_nonzero(x):
        return None
    return torch.mul(y, y).reciprocal_().mul_(1.0 / 3.0).mul_(g)


cbrt = _unary(
    _cbrt_value,
    _cbrt_coef,
    "cbrt",
    """Real cube root ``sign(x) * |x| ** (1/3)`` (torch has no ``cbrt``), with derivative 0 at
    0 (a convention: the true derivative is +inf from both sides).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.cbrt(x).backward(); print(x.grad)
        tensor(0.)
    """,
    _cbrt_fast,
)


def _log_coef(x, y):
    pos = x > 0
    return torch.where(pos, 1.0 / _mask(pos, x), 0.0)


def _log_fast(x, y, g):
    if not _min_gt(x, 0.0):
        return None
    return torch.div(g, x)  # torch's own formula


log = _unary(
    torch.log,
    _log_coef,
    "log",
    """``torch.log(x)`` (``-inf`` at 0), with derivative ``1 / x`` for ``x > 0`` and 0 for
    ``x <= 0``, so a masked-out ``log(0)`` contributes exactly 0 to the gradient.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> torch.where(x > 0, safe.log(x), 0.0).backward(); print(x.grad)
        tensor(0.)
    """,
    _log_fast,
)


def _log1p_coef(x, y):
    ok = x > -1
    return torch.where(ok, 1.0 / _mask(ok, 1.0 + x), 0.0)


def _log1p_fast(x, y, g):
    if not _min_gt(x, -1.0):
        return None
    return torch.div(g, 1.0 + x)  # torch's own formula


log1p = _unary(
    torch.log1p,
    _log1p_coef,
    "log1p",
    """``torch.log1p(x)`` (``-inf`` at -1), with derivative ``1 / (1 + x)`` for ``x > -1`` and 0
    for ``x <= -1``, so a masked-out ``log1p(-1)`` contributes exactly 0 to the gradient.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(-1.0, requires_grad=True)
        >>> (0.0 * safe.log1p(x)).backward(); print(x.grad)
        tensor(0.)
    """,
    _log1p_fast,
)

_SINC_COEFS = [
    (-1) ** k * math.pi ** (2 * k) * 2 * k / math.factorial(2 * k + 1) for k in range(1, 13)
]


def _sinc_coef(x, y):
    small = torch.abs(x) <= 0.5
    xs = torch.where(small, x, 0.0)
    x2 = xs * xs
    acc = torch.zeros_like(x) + _SINC_COEFS[-1]
    for c in reversed(_SINC_COEFS[:-1]):
        acc = acc * x2 + c
    xb = _mask(~small, x)
    pxb = math.pi * xb
    direct = (torch.cos(pxb) - torch.sin(pxb) / pxb) / xb
    return torch.where(small, acc * xs, direct)


def _sinc_fast(x, y, g):
    """The same two formulas, each only where it is used: the direct one in place on all of
    ``x``, the series on the entries with ``|x| <= 0.5`` only."""
    if x.is_complex():
        return None
    small = torch.abs(x) <= 0.5
    px = torch.mul(x, math.pi)
    direct = torch.cos(px)
    direct.sub_(torch.sin(px).div_(px)).div_(x)
    xs = x[small]
    if xs.numel():
        x2 = xs * xs
        acc = torch.full_like(xs, _SINC_COEFS[-1])
        for c in reversed(_SINC_COEFS[:-1]):
            acc.mul_(x2).add_(c)
        direct.masked_scatter_(small, acc.mul_(xs))
    return direct.mul_(g)


sinc = _unary(
    torch.sinc,
    _sinc_coef,
    "sinc",
    """``torch.sinc(x)`` with its true derivative, 0 at 0 (series near 0, no cancellation).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.sinc(x).backward(); print(x.grad.abs())
        tensor(0.)
    """,
    _sinc_fast,
)


def _pow_dx(x, p, is_int):
    bad = (x == 0) & (p < 1)
    if is_int is False:
        bad = bad | (x < 0)
    elif is_int is not True:
        bad = bad | ((x < 0) & ~is_int)
    xs = _mask(~bad, x)
    if isinstance(p, (int, float)) and p == 0:
        return torch.zeros_like(x)
    return torch.where(bad, 0.0, p * torch.pow(xs, p - 1))


class _PowStatic(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        y = torch.pow(x, p)
        ctx.save_for_backward(x)
        ctx.p = p
        return y

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        p = ctx.p
        is_int = float(p).is_integer()
        if p != 0 and _fast():
            # no singular point: torch's own formula g * (p * x ** (p - 1)), in place
            if p >= 1:
                ok = is_int or _min_ge(x, 0.0)
            else:
                ok = _all_nonzero(x) if is_int else _min_gt(x, 0.0)
            if ok:
                return torch.pow(x, p - 1).mul_(p).mul_(g), None
        return g * _pow_dx(x, p, is_int), None


class _PowTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        y = torch.pow(x, p)
        ctx.save_for_backward(x, p, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, p, y = ctx.saved_tensors
        dx = _pow_dx(x, p, p == torch.round(p))
        pos = x > 0
        dp = torch.where(pos, y * torch.log(_mask(pos, x)), 0.0)
        return _sum_to(g * dx, x.shape), _sum_to(g * dp, p.shape)


def pow(x, p) -> Tensor:
    """``torch.pow(x, p)``; derivative in x at 0: true for ``p >= 1``, 0 for ``p < 1`` (a
    convention); 0 for ``x < 0`` with non-integer ``p``; in p: ``x**p log x`` for ``x > 0``, else 0.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.pow(x, 0.5).backward(); print(x.grad)
        tensor(0.)
    """
    x = _inexact(x)
    if isinstance(p, (int, float)) and not isinstance(p, bool):
        return _PowStatic.apply(x, p)
    x, p = _pair(x, p)
    return _PowTensor.apply(x, p)


class _Xlogy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        out = torch.xlogy(x, y)
        ctx.save_for_backward(x, y)
        return out

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        pos = y > 0
        ys = _mask(pos, y)
        gx = g * torch.where(pos, torch.log(ys), 0.0)
        gy = g * torch.where(pos, x / ys, 0.0)
        return _sum_to(gx, x.shape), _sum_to(gy, y.shape)


def xlogy(x, y) -> Tensor:
    """``torch.xlogy(x, y)`` (0 where ``x == 0``); derivatives ``(log y, x / y)`` for ``y > 0``
    and ``(0, 0)`` where ``y <= 0``, so the gradient at ``(0, 0)`` is 0 instead of NaN: in ``y``
    the true partial derivative (``xlogy(0, y)`` is 0 for every ``y``), in ``x`` a convention
    (``xlogy(h, 0)`` is -inf for ``h > 0``). ``xlogy(x, x)`` at 0 thus gets 0 where
    ``x * log(x)`` has the one-sided derivative -inf: right under a mask, a wrong slope
    otherwise; for ``x * log(x)`` use :func:`xlogx`.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.xlogy(x, 0.0).backward(); print(x.grad)
        tensor(0.)
    """
    return _Xlogy.apply(*_pair(x, y))


def _xlogx_coef(x, y):
    pos = x > 0
    edge = torch.where(x == 0, -math.inf, 0.0).to(x.dtype)
    return torch.where(pos, torch.log(_mask(pos, x)) + 1, edge)


def _xlogx_fast(x, y, g):
    if not _min_gt(x, 0.0):
        return None
    return torch.log(x).add_(1).mul_(g)


xlogx = _unary(
    lambda x: torch.xlogy(x, x),
    _xlogx_coef,
    "xlogx",
    """``torch.xlogy(x, x)`` (0 at 0), with the true derivative ``log(x) + 1``: **-inf at 0**
    (a vertical tangent; we do not invent a finite slope); 0 for ``x < 0``.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.xlogx(x).backward(); print(x.grad)
        tensor(-inf)
    """,
    _xlogx_fast,
)


def div(x, y, fill=0.0) -> Tensor:
    """``x / y`` where ``y != 0`` and ``fill`` where ``y == 0``, with gradient 0 there
    (double-where trick: plain torch).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> y = torch.tensor(0.0, requires_grad=True)
        >>> safe.div(1.0, y).backward(); print(y.grad)
        tensor(0.)
    """
    x, y = _pair(x, y)
    if not isinstance(fill, Tensor) or (fill.ndim == 0 and not fill.requires_grad):
        return _Div.apply(x, y, fill)
    nz = y != 0
    return torch.where(nz, x / _mask(nz, y), fill)


class _Div(torch.autograd.Function):
    """``where(y != 0, x / y, fill)`` with the double-where trick's derivatives (0 where
    ``y == 0``); a plain ``x / y`` when ``y`` has no zero."""

    @staticmethod
    def forward(ctx, x, y, fill):
        if _all_nonzero(y):
            out = x / y
            ctx.nz = None
        else:
            nz = y != 0
            fill_t = fill if isinstance(fill, Tensor) else torch.as_tensor(fill, dtype=x.dtype)
            out = torch.where(nz, x / _mask(nz, y), fill_t.to(x.device))
            ctx.nz = nz
        ctx.save_for_backward(x, y)
        return out

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        nz = ctx.nz
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gx = gy = None
        if nz is None and _fast():
            if need_x:
                gx = _sum_to(torch.div(g, y), x.shape)
            if need_y:
                gy = _sum_to(torch.div(x, y).div_(y).mul_(g).neg_(), y.shape)
            return gx, gy, None
        # torch's formulas for x / y behind the double where: 0 where y == 0
        if nz is not None:
            g = torch.where(nz, g, 0.0)
            y = _mask(nz, y)
        if need_x:
            gx = _sum_to(g / y, x.shape)
        if need_y:
            gy = -g * ((x / y) / y)
            if nz is not None:
                gy = torch.where(nz, gy, 0.0)
            gy = _sum_to(gy, y.shape)
        return gx, gy, None


# ---------------------------------------------------------------------------------------------
# Inverse trigonometric and two-argument functions.


def _arc_coef(sign):
    def coef(x, y):
        inside = torch.abs(x) < 1
        xs = _mask(inside, x, 0.0)
        return torch.where(inside, sign * torch.rsqrt((1 - xs) * (1 + xs)), 0.0)

    return coef


def _inside(x: Tensor) -> bool:
    """Every entry strictly inside (-1, 1): one reduction (False for NaN)."""
    if x.numel() == 0 or x.is_complex():
        return False
    lo, hi = torch.aminmax(x)
    return bool(lo.item() > -1 and hi.item() < 1)


def _clamped(f):
    """``f(clamp(x, -1, 1))``; the clamp is skipped when it changes nothing."""

    def value(x):
        if x.numel() and not x.is_complex():
            lo, hi = torch.aminmax(x)
            if lo.item() >= -1 and hi.item() <= 1:
                return f(x)
        return f(torch.clamp(x, -1, 1))

    return value


def _arc_fast(sign):
    def fast(x, y, g):
        if not _inside(x):
            return None
        t = torch.rsub(x, 1).mul_(torch.add(x, 1)).rsqrt_()  # rsqrt((1 - x) (1 + x))
        return (t.neg_() if sign < 0 else t).mul_(g)

    return fast


def _arctanh_fast(x, y, g):
    if not _inside(x):
        return None
    return torch.rsub(x, 1).mul_(torch.add(x, 1)).reciprocal_().mul_(g)


arccos = _unary(
    _clamped(torch.arccos),
    _arc_coef(-1.0),
    "arccos",
    """``torch.arccos`` clipped to [-1, 1] (value at the nearest endpoint outside), with
    the true derivative inside and 0 for ``|x| >= 1`` (a convention at +-1, where it is -inf).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(1.0, requires_grad=True)
        >>> safe.arccos(x).backward(); print(x.grad)
        tensor(0.)
    """,
    _arc_fast(-1.0),
)

arcsin = _unary(
    _clamped(torch.arcsin),
    _arc_coef(1.0),
    "arcsin",
    """``torch.arcsin`` clipped to [-1, 1], with the true derivative inside and 0 for
    ``|x| >= 1`` (a convention at +-1, where it is +inf).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(-1.0, requires_grad=True)
        >>> safe.arcsin(x).backward(); print(x.grad)
        tensor(0.)
    """,
    _arc_fast(1.0),
)


def _arctanh_coef(x, y):
    inside = torch.abs(x) < 1
    xs = _mask(inside, x, 0.0)
    return torch.where(inside, 1 / ((1 - xs) * (1 + xs)), 0.0)


arctanh = _unary(
    _clamped(torch.arctanh),
    _arctanh_coef,
    "arctanh",
    """``torch.arctanh`` clipped to [-1, 1] (+-inf beyond), with the true derivative inside
    and 0 for ``|x| >= 1`` (a convention; the value there is infinite).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(1.0, requires_grad=True)
        >>> (0.0 * safe.arctanh(x)).backward(); print(x.grad)
        tensor(0.)
    """,
    _arctanh_fast,
)


class _Hypot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        h = torch.hypot(x, y)
        ctx.save_for_backward(x, y, h)
        return h

    @staticmethod
    def backward(ctx, g):
        x, y, h = ctx.saved_tensors
        need_x, need_y = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if _fast() and _min_gt(h, 0.0):
            gx = _sum_to(torch.div(x, h).mul_(g), x.shape) if need_x else None
            gy = _sum_to(torch.div(y, h).mul_(g), y.shape) if need_y else None
            return gx, gy
        pos = h > 0
        hs = _mask(pos, h)
        gx = g * torch.where(pos, x / hs, 0.0)
        gy = g * torch.where(pos, y / hs, 0.0)
        return _sum_to(gx, x.shape), _sum_to(gy, y.shape)


def hypot(x, y) -> Tensor:
    """``torch.hypot(x, y)``, gradient ``(x, y) / hypot`` and **(0, 0) at the origin** (the
    minimum-norm element of the unit disc; ``torch.hypot`` gives NaN there).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.hypot(x, 0.0).backward(); print(x.grad)
        tensor(0.)
    """
    return _Hypot.apply(*_pair(x, y))


class _Atan2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, x):
        out = torch.atan2(y, x)
        ctx.save_for_backward(y, x)
        return out

    @staticmethod
    def backward(ctx, g):
        y, x = ctx.saved_tensors
        h = torch.hypot(x, y)
        need_y, need_x = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if _fast() and _min_gt(h, 0.0):
            gy = _sum_to(torch.div(x, h).div_(h).mul_(g), y.shape) if need_y else None
            gx = _sum_to(torch.div(y, h).neg_().div_(h).mul_(g), x.shape) if need_x else None
            return gy, gx
        pos = h > 0
        hs = _mask(pos, h)
        gy = g * torch.where(pos, (x / hs) / hs, 0.0)
        gx = g * torch.where(pos, -(y / hs) / hs, 0.0)
        return _sum_to(gy, y.shape), _sum_to(gx, x.shape)


def atan2(y, x) -> Tensor:
    """``torch.atan2(y, x)``, gradient ``(x, -y) / (x**2 + y**2)``, and **(0, 0) at the
    origin: a convention only, atan2 is discontinuous there** (no subgradient exists).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> y = torch.tensor(0.0, requires_grad=True)
        >>> safe.atan2(y, 0.0).backward(); print(y.grad)
        tensor(0.)
    """
    return _Atan2.apply(*_pair(y, x))


arctan2 = atan2


# ---------------------------------------------------------------------------------------------
# Kinks.


def abs(x) -> Tensor:
    """``torch.abs(x)``, derivative ``sign(x)``: **0 at 0**, the minimum-norm element of
    ``[-1, 1]``. This is ``torch.abs``'s own derivative (``grad * sgn(x)``), so it is
    ``torch.abs`` itself: no ``autograd.Function`` and no extra pass.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.abs(x).backward(); print(x.grad)
        tensor(0.)
    """
    return torch.abs(_inexact(x))


class _MinMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, is_max):
        out = torch.maximum(x, y) if is_max else torch.minimum(x, y)
        ctx.save_for_backward(x, y)
        ctx.is_max = is_max
        return out

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        win = x > y if ctx.is_max else x < y
        w = torch.where(win, 1.0, torch.where(x == y, 0.5, 0.0)).to(g.dtype)
        gx = _sum_to(g * w, x.shape) if ctx.needs_input_grad[0] else None
        gy = _sum_to(g * (1 - w), y.shape) if ctx.needs_input_grad[1] else None
        return gx, gy, None


class _Clip(torch.autograd.Function):
    """``minimum(maximum(x, lo), hi)`` for finite bounds ``lo < hi`` that need no gradient: one
    clamp, and the same derivative: 1 inside, 0.5 at a bound, 0 outside (and for NaN)."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        out = torch.clamp(x, lo, hi)
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = lo, hi
        return out

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        lo, hi = ctx.lo, ctx.hi
        if _fast() and x.numel() and not math.isnan(x.amin().item()):
            # hardtanh's derivative is 1 on the open interval (lo, hi); on (lo-, hi+), the
            # neighbours of the bounds in x's dtype, it is 1 on the closed [lo, hi]. Their
            # mean is 1 inside, 1/2 on a bound, 0 outside: float kernels only, where torch's
            # comparisons make slow bool temporaries. hardtanh_backward passes g on at NaN,
            # hence the check; g / 2 + g / 2 == g for every g but an odd subnormal.
            lo_, hi_ = _neighbours(lo, hi, x.dtype)
            out = torch.ops.aten.hardtanh_backward(g, x, lo, hi).mul_(0.5)
            closed = torch.ops.aten.hardtanh_backward(g, x, lo_, hi_)
            return out.add_(closed, alpha=0.5), None, None
        inside = (x > lo) & (x < hi)
        w = torch.where(inside, 1.0, torch.where((x == lo) | (x == hi), 0.5, 0.0)).to(g.dtype)
        return g * w, None, None


def _neighbours(lo: float, hi: float, dtype: torch.dtype) -> tuple[float, float]:
    """The floats of ``dtype`` just below ``lo`` and just above ``hi``."""
    t = torch.tensor([lo, hi], dtype=dtype)
    out = torch.nextafter(t, torch.tensor([-math.inf, math.inf], dtype=dtype))
    return out[0].item(), out[1].item()


def maximum(x, y) -> Tensor:
    """``torch.maximum(x, y)``; on a tie the derivative is **0.5 for each** (minimum-norm
    element of ``conv{(1, 0), (0, 1)}``).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(1.0, requires_grad=True)
        >>> safe.maximum(x, 1.0).backward(); print(x.grad)
        tensor(0.5000)
    """
    return _MinMax.apply(*_pair(x, y), True)


def minimum(x, y) -> Tensor:
    """``torch.minimum(x, y)``; on a tie the derivative is 0.5 for each.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(1.0, requires_grad=True)
        >>> safe.minimum(x, 1.0).backward(); print(x.grad)
        tensor(0.5000)
    """
    return _MinMax.apply(*_pair(x, y), False)


def clip(x, min=None, max=None) -> Tensor:
    """``torch.clamp(x, min, max)`` as ``minimum(maximum(x, min), max)``: derivative 1 inside,
    0 outside and **0.5 at a bound** (torch's ``clamp`` gives 1 there).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.clip(x, 0.0, 1.0).backward(); print(x.grad)
        tensor(0.5000)
    """
    x = _inexact(x)
    if _plain_bound(min) and _plain_bound(max) and not x.is_complex():
        lo = torch.as_tensor(min, dtype=x.dtype).item()  # rounded to x's dtype, as below
        hi = torch.as_tensor(max, dtype=x.dtype).item()
        if lo < hi and math.isfinite(lo) and math.isfinite(hi):
            return _Clip.apply(x, lo, hi)
    if min is not None:
        x = maximum(x, torch.as_tensor(min, dtype=x.dtype))
    if max is not None:
        x = minimum(x, torch.as_tensor(max, dtype=x.dtype))
    return x


def _plain_bound(b) -> bool:
    """A bound given as a number (or a 0-d tensor without gradient)."""
    if isinstance(b, Tensor):
        return b.ndim == 0 and not b.requires_grad and not b.is_complex()
    return isinstance(b, (int, float)) and not isinstance(b, bool)


# ---------------------------------------------------------------------------------------------
# Norms and statistics.


def _axes(x: Tensor, ord, axis) -> tuple[tuple[int, ...], bool]:
    """The reduced axes, and whether this is a matrix norm, following numpy's ``norm``."""
    if axis is None:
        if ord is None:
            return tuple(range(x.ndim)), False
        if x.ndim in (1, 2):
            return tuple(range(x.ndim)), x.ndim == 2
        raise ValueError(
            f"norm with ord={ord!r} and axis=None needs a 1-D or 2-D tensor, got {x.ndim}-D; "
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


def _ties(hit: Tensor, axes, dtype) -> Tensor:
    hit = hit.to(dtype)
    return hit / torch.clamp_min(hit.sum(dim=axes, keepdim=True), 1)


def _norm_grad(x, n, ord, axes, matrix):
    """The minimum-norm Clarke subgradient of the norm ``n`` (keepdim) at ``x``."""
    if ord in (None, "fro") or (ord == 2 and not matrix):
        pos = n > 0
        return torch.where(pos, x / _mask(pos, n), 0.0)
    if not matrix:
        if ord == 1:
            return torch.sign(x)
        if ord in (math.inf, -math.inf):
            return torch.sign(x) * _ties(torch.abs(x) == n, axes, x.dtype)
        if ord == 0:
            return torch.zeros_like(x)
        ok = (x != 0) & (n > 0)
        r = torch.abs(x) / _mask(ok, n)
        return torch.where(ok, torch.sign(x) * torch.pow(_mask(ok, r), ord - 1), 0.0)
    if ord in (1, -1, math.inf, -math.inf):
        inner, outer = (axes[0], axes[1]) if ord in (1, -1) else (axes[1], axes[0])
        s = torch.abs(x).sum(dim=inner, keepdim=True)
        return torch.sign(x) * _ties(s == n, (outer,), x.dtype)
    if ord in (2, -2, "nuc"):
        xm = torch.movedim(x, axes, (-2, -1))
        u, s, vh = torch.linalg.svd(xm, full_matrices=False)
        if ord == "nuc":
            w = (s > 0).to(x.dtype)
        else:
            target = torch.movedim(n, axes, (-2, -1))[..., 0]
            w = _ties((s == target) & (target > 0), (-1,), x.dtype)
        g = (u * w[..., None, :]) @ vh
        return torch.movedim(g, (-2, -1), axes)
    raise ValueError(f"norm: unsupported ord={ord!r} for a matrix norm.")


class _NormKeep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ord, axis):
        n = torch.linalg.norm(x, ord=ord, dim=axis, keepdim=True)
        ctx.save_for_backward(x, n)
        ctx.ord, ctx.axis = ord, axis
        return n

    @staticmethod
    def backward(ctx, g):
        x, n = ctx.saved_tensors
        axes, matrix = _axes(x, ctx.ord, ctx.axis)
        euclid = ctx.ord in (None, "fro") or (ctx.ord == 2 and not matrix)
        if euclid and _fast() and _min_gt(n, 0.0):
            return torch.div(x, n).mul_(g), None, None  # x / n, in place
        return g * _norm_grad(x, n, ctx.ord, axes, matrix), None, None


def norm(x, ord=None, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """``torch.linalg.norm(x, ord, axis, keepdims)`` (numpy rules), with **gradient 0 at the
    zero vector** and equal weights on ties (ord=inf, repeated top singular value): the
    minimum-norm subgradients. Second derivatives of matrix ord 2, -2, 'nuc' are unsupported.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.zeros(3, requires_grad=True)
        >>> safe.norm(x, ord=torch.inf).backward(); print(x.grad)
        tensor([0., 0., 0.])
    """
    x = _inexact(x)
    axis = axis if axis is None or isinstance(axis, int) else tuple(axis)
    axes, _ = _axes(x, ord, axis)
    n = _NormKeep.apply(x, ord, axis)
    return n if keepdims else n.squeeze(axes)


def normalize(x, axis: Axis = -1, eps: float = 1e-12, ord=2) -> Tensor:
    """``x / max(norm(x), eps)`` (``torch.nn.functional.normalize``'s value); derivative
    ``I / eps`` where ``norm(x) < eps`` (finite at 0); 0 at 0 if ``eps == 0`` (a convention).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.zeros(2, requires_grad=True)
        >>> safe.normalize(x, eps=0.5).sum().backward(); print(x.grad)
        tensor([2., 2.])
    """
    x = _inexact(x)
    return div(x, maximum(norm(x, ord=ord, axis=axis, keepdims=True), eps))


def _dims(x: Tensor, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    if isinstance(axis, int):
        return (axis % x.ndim,)
    return tuple(a % x.ndim for a in axis)


def var(x, axis: Axis = None, ddof: int = 0, keepdims: bool = False) -> Tensor:
    """``torch.var(x, axis, correction=ddof, keepdim=keepdims)`` with numpy's default
    ``ddof=0`` (torch's is 1). Smooth; its plain derivative is already right.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> print(safe.var(torch.tensor([1.0, 3.0])))
        tensor(1.)
    """
    x = _inexact(x)
    return torch.var(x, dim=_dims(x, axis), correction=ddof, keepdim=keepdims)


class _StdKeep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dims, ddof):
        s = torch.std(x, dim=dims, correction=ddof, keepdim=True)
        ctx.save_for_backward(x, s)
        ctx.dims, ctx.ddof = dims, ddof
        return s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        count = math.prod(x.shape[d] for d in ctx.dims)
        centered = x - x.mean(dim=ctx.dims, keepdim=True)
        if _fast() and _min_gt(s, 0.0):
            return centered.div_((count - ctx.ddof) * s).mul_(g), None, None
        pos = s > 0
        coef = torch.where(pos, centered / ((count - ctx.ddof) * _mask(pos, s)), 0.0)
        return g * coef, None, None


def std(x, axis: Axis = None, ddof: int = 0, keepdims: bool = False) -> Tensor:
    """``torch.std(x, axis, correction=ddof, keepdim=keepdims)``; gradient
    ``(x - mean) / ((n - ddof) std)`` and **0 at constant data** (minimum-norm subgradient).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.ones(3, requires_grad=True)
        >>> safe.std(x).backward(); print(x.grad)
        tensor([0., 0., 0.])
    """
    x = _inexact(x)
    dims = _dims(x, axis)
    s = _StdKeep.apply(x, dims, ddof)
    return s if keepdims else s.squeeze(dims)


def standardize(
    x,
    axis: Axis = -1,
    eps: float = 1e-5,
    ddof: int = 0,
    form: Literal["var_eps", "std_eps"] = "var_eps",
) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` (``form="var_eps"``) or ``(x - mean) / (std + eps)``
    (``form="std_eps"``, Flux's ``normalise``), with the finite true derivative
    ``(I - 1 1^T / n) / eps`` at zero spread for "std_eps". See ``gradsan.jax.safe.standardize``.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.ones(3, 3, requires_grad=True)
        >>> torch.sin(safe.standardize(x, form="std_eps")).sum().backward()
        >>> print(x.grad.abs().max())
        tensor(0.)
    """
    x = _inexact(x)
    dims = _dims(x, axis)
    centered = x - x.mean(dim=dims, keepdim=True)
    if form == "var_eps":
        den = sqrt(var(x, axis=dims, ddof=ddof, keepdims=True) + eps)
    elif form == "std_eps":
        den = std(x, axis=dims, ddof=ddof, keepdims=True) + eps
    else:
        raise ValueError(f"standardize: form must be 'var_eps' or 'std_eps', got {form!r}.")
    return div(centered, den)


def layer_norm(
    x,
    weight=None,
    bias=None,
    axis: Axis = -1,
    eps: float = 1e-5,
    form: Literal["var_eps", "std_eps"] = "var_eps",
) -> Tensor:
    """``standardize(x, axis, eps, form=form) * weight + bias``; see ``standardize``.
    (``torch.nn.functional.layer_norm`` fuses the same math, so may differ in the last bit.)

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> print(safe.layer_norm(torch.ones(1, 2), torch.ones(2), torch.ones(2), form="std_eps"))
        tensor([[1., 1.]])
    """
    y = standardize(x, axis=axis, eps=eps, form=form)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def cosine_similarity(x1, x2, axis: int = -1, eps: float = 1e-8) -> Tensor:
    """``sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps))``; finite gradient when a vector is
    zero (``x2 / (eps * max(|x2|, eps))`` in ``x1`` at ``x1 = 0``).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.zeros(2, requires_grad=True)
        >>> safe.cosine_similarity(x, torch.ones(2)).backward(); print(x.grad.isfinite().all())
        tensor(True)
    """
    x1, x2 = _pair(x1, x2)
    dot = (x1 * x2).sum(dim=axis)
    n1 = maximum(norm(x1, axis=axis), eps)
    n2 = maximum(norm(x2, axis=axis), eps)
    return dot / (n1 * n2)


def pairwise_distance(x1, x2, ord=2, axis: int = -1, keepdims: bool = False) -> Tensor:
    """``norm(x1 - x2, ord, axis)`` (no eps added, unlike ``F.pairwise_distance``); 0 with
    gradient 0 on coincident points.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.ones(2, requires_grad=True)
        >>> safe.pairwise_distance(x, torch.ones(2)).backward(); print(x.grad)
        tensor([0., 0.])
    """
    x1, x2 = _pair(x1, x2)
    return norm(x1 - x2, ord=ord, axis=axis, keepdims=keepdims)


def cdist(x1, x2, p=2) -> Tensor:
    """``out[..., i, j] = norm(x1[..., i, :] - x2[..., j, :], p)``, difference-then-norm (not
    ``torch.cdist``'s matmul expansion); 0 with gradient 0 on coincident points.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor([[0.0, 0.0], [3.0, 4.0]])
        >>> print(safe.cdist(x, x))
        tensor([[0., 5.],
                [5., 0.]])
    """
    x1, x2 = _pair(x1, x2)
    return norm(x1[..., :, None, :] - x2[..., None, :, :], ord=p, axis=-1)


# ---------------------------------------------------------------------------------------------
# Masked reductions.


def _prep_mask(x, where):
    x = _inexact(x)
    if where is None:
        return x, None
    mask = torch.as_tensor(where, dtype=torch.bool, device=x.device)
    return x, mask.expand(x.shape)


class _LseKeep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, dims):
        xm = x if mask is None else x.masked_fill(~mask, -math.inf)
        out = torch.logsumexp(xm, dim=dims, keepdim=True)
        ctx.save_for_backward(xm, out)
        ctx.dims = dims
        return out

    @staticmethod
    def backward(ctx, g):
        xm, out = ctx.saved_tensors
        fin = torch.isfinite(out)
        if _fast() and bool(fin.all()):
            return torch.sub(xm, out).exp_().mul_(g), None, None  # softmax, in place
        p = torch.where(fin & (xm > -math.inf), torch.exp(xm - _mask(fin, out, 0.0)), 0.0)
        return g * p, None, None


def logsumexp(x, axis: Axis = None, where=None, keepdims: bool = False) -> Tensor:
    """``torch.logsumexp`` over the entries selected by ``where``; **-inf** on a fully masked
    row, with gradient softmax on selected entries and **0** on masked entries and empty rows.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.zeros(2, requires_grad=True)
        >>> y = safe.logsumexp(x, where=torch.tensor([False, False])); y.backward()
        >>> print(y.item(), x.grad)
        -inf tensor([0., 0.])
    """
    x, mask = _prep_mask(x, where)
    dims = _dims(x, axis)
    out = _LseKeep.apply(x, mask, dims)
    return out if keepdims else out.squeeze(dims)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, dim):
        if mask is None:
            p = torch.softmax(x, dim)
        else:
            p = torch.where(mask, torch.softmax(x.masked_fill(~mask, -math.inf), dim), 0.0)
        ctx.save_for_backward(p)
        ctx.dim = dim
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return p * (g - (p * g).sum(dim=ctx.dim, keepdim=True)), None, None


def softmax(x, axis: int = -1, where=None) -> Tensor:
    """Softmax over the selected entries; 0 on masked entries and **a row of 0** on a fully
    masked row, with Jacobian 0 there (no NaN).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> print(safe.softmax(torch.zeros(2), where=torch.tensor([False, False])))
        tensor([0., 0.])
    """
    x, mask = _prep_mask(x, where)
    if mask is None:  # nothing masked: torch's own softmax has these derivatives
        return torch.softmax(x, axis % x.ndim)
    return _Softmax.apply(x, mask, axis % x.ndim)


class _LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, dim):
        if mask is None:
            out = torch.log_softmax(x, dim)
            m = torch.ones_like(x, dtype=torch.bool)
        else:
            out = torch.log_softmax(x.masked_fill(~mask, -math.inf), dim)
            out = torch.where(mask, out, -math.inf)
            m = mask
        ctx.save_for_backward(out, m)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, g):
        out, m = ctx.saved_tensors
        p = torch.where(m, torch.exp(out), 0.0)
        gm = torch.where(m, g, 0.0)
        return torch.where(m, gm - p * gm.sum(dim=ctx.dim, keepdim=True), 0.0), None, None


def log_softmax(x, axis: int = -1, where=None) -> Tensor:
    """Log-softmax over the selected entries; **-inf** on masked entries (so a fully masked row
    is all -inf), with derivative 0 there (no NaN).

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> print(safe.log_softmax(torch.zeros(2), where=torch.tensor([False, False])))
        tensor([-inf, -inf])
    """
    x, mask = _prep_mask(x, where)
    if mask is None:  # nothing masked: torch's own log_softmax has these derivatives
        return torch.log_softmax(x, axis % x.ndim)
    return _LogSoftmax.apply(x, mask, axis % x.ndim)


# ---------------------------------------------------------------------------------------------
# where with callable branches, and eigh.


def where(cond, f_true, f_false, *args, fill: float | tuple[float, float] = 1.0) -> Tensor:
    """``torch.where(cond, f_true(*args), f_false(*args))`` with the double-where trick: each
    branch sees ``fill`` where it is unselected, so it contributes exactly 0 to the gradient.
    **The branches must be elementwise.** A branch may be a constant.

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> x = torch.tensor(0.0, requires_grad=True)
        >>> safe.where(x > 0, torch.sqrt, 0.0, x).backward(); print(x.grad)
        tensor(0.)
    """
    cond = torch.as_tensor(cond, dtype=torch.bool)
    fill_t, fill_f = fill if isinstance(fill, tuple) else (fill, fill)
    tensors = [_inexact(a) for a in args]

    def branch(fn, select, fill_value):
        if not callable(fn):
            return fn
        return fn(*[torch.where(select, a, fill_value) for a in tensors])

    a = branch(f_true, cond, fill_t)
    b = branch(f_false, ~cond, fill_f)
    dtype = next((t.dtype for t in (a, b) if isinstance(t, Tensor)), torch.get_default_dtype())
    a = a if isinstance(a, Tensor) else torch.as_tensor(a, dtype=dtype)
    b = b if isinstance(b, Tensor) else torch.as_tensor(b, dtype=dtype)
    return torch.where(cond, a, b)


class _Eigh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, tol):
        w, v = torch.linalg.eigh((a + a.mH) / 2)
        ctx.save_for_backward(w, v)
        ctx.tol = tol
        return w, v

    @staticmethod
    def backward(ctx, gw, gv):
        w, v = ctx.saved_tensors
        n = w.shape[-1]
        gap = w[..., None, :] - w[..., :, None]  # gap[i, j] = w_j - w_i
        if ctx.tol is None:
            scale = w.abs().amax(dim=-1, keepdim=True)[..., None]
            thresh = 16 * n * torch.finfo(w.dtype).eps * scale
        else:
            thresh = ctx.tol
        keep = gap.abs() > thresh
        f = torch.where(keep, 1 / torch.where(keep, gap, 1.0), 0.0).to(v.dtype)
        vh = v.mH
        inner = f * (vh @ gv) + torch.diag_embed(gw.to(v.dtype))
        ga = v @ inner @ vh
        return (ga + ga.mH) / 2, None


def eigh(a, tol: float | None = None) -> tuple[Tensor, Tensor]:
    """``torch.linalg.eigh`` of the symmetric part of ``a``; the eigenvector gradient drops the
    ``1 / (w_i - w_j)`` terms with ``|w_i - w_j| <= tol`` (default ``16 n eps max|w|``): exact for
    losses that depend on eigenspaces (projectors), finite always. **A loss that depends on one
    eigenvector inside a repeated eigenspace has no gradient; this returns a finite one.**

    Example:
        >>> import torch
        >>> from gradsan.torch import safe
        >>> a = torch.eye(2, requires_grad=True)
        >>> safe.eigh(a)[1][0, 0].backward(); print(a.grad.isfinite().all())
        tensor(True)
    """
    a = _inexact(a)
    return _Eigh.apply(a, tol)
