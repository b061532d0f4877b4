"""certify's rules for products: cumprod and reduce_prod."""

from __future__ import annotations

import numpy as np

from .. import _series as S
from .._registry import BWD, FWD, PLAIN, PURE
from .._series import Series
from .._values import IntVal, _cat, _flip, _last, _lin, _ones, _sl, _unlast, const_eval

# -- products: cumprod, reduce_prod ------------------------------------------------------------


def _scan_prod(s: Series) -> Series:
    """Inclusive products along the last axis (a log-depth scan of series products)."""
    n = s.shape[-1]
    d = 1
    while d < n:
        s = _cat([_sl(s, slice(0, d)), S.mul(_sl(s, slice(d, n)), _sl(s, slice(0, n - d)))])
        d *= 2
    return s


def _exclusive(s: Series) -> Series:
    """Products of the elements strictly before each one along the last axis (1 first)."""
    n = s.shape[-1]
    one = _ones(s.shape[:-1] + (1,))
    if n <= 1:
        return _ones(s.shape)
    return _cat([one, _scan_prod(_sl(s, slice(0, n - 1)))])


def _tree_prod(s: Series) -> Series:
    """The product over the last axis (a tree of series products); shape without it."""
    n = s.shape[-1]
    if n == 0:
        return _ones(s.shape[:-1])
    while n > 1:
        if n % 2:
            s = _cat([s, _ones(s.shape[:-1] + (1,))])
            n += 1
        s = S.mul(_sl(s, slice(0, n, 2)), _sl(s, slice(1, n, 2)))
        n //= 2
    return _lin(s, lambda a: a[..., 0])


def _cumprod_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return const_eval(eqn, ins), None
    ax = eqn.params["axis"] % max(1, len(x.shape))
    xl = _last(x, ax)
    if eqn.params.get("reverse"):
        y = _flip(_scan_prod(_flip(xl)))
    else:
        y = _scan_prod(xl)
    return [_unlast(y, ax)], None


def _cumprod_grad(xl: Series, cl: Series) -> Series:
    """The cotangent of x for y = cumprod(x) along the last axis: x_k's is P_k z_k with P_k the
    product of the elements before k and z_k = c_k + x_(k+1) z_(k+1) (an affine recurrence,
    solved by a log-depth scan of exact series products)."""
    n = xl.shape[-1]
    if n == 0:
        return cl
    A = cl
    B = _cat([_sl(xl, slice(1, n)), Series.zeros(xl.shape[:-1] + (1,))])
    d = 1
    while d < n:
        A_head = S.add(
            _sl(A, slice(0, n - d)), S.rmul(_sl(A, slice(d, n)), _sl(B, slice(0, n - d)))
        )
        B_head = S.mul(_sl(B, slice(0, n - d)), _sl(B, slice(d, n)))
        A = _cat([A_head, _sl(A, slice(n - d, n))])
        B = _cat([B_head, _sl(B, slice(n - d, n))])
        d *= 2
    return S.rmul(A, _exclusive(xl))


def _cumprod_bwd(ctx, eqn, ins, outs, aux, cots, need):
    x = ins[0]
    ax = eqn.params["axis"] % max(1, len(x.shape))
    xl, cl = _last(x, ax), _last(cots[0], ax)
    if eqn.params.get("reverse"):
        g = _flip(_cumprod_grad(_flip(xl), _flip(cl)))
    else:
        g = _cumprod_grad(xl, cl)
    return [_unlast(g, ax)]


FWD["cumprod"] = _cumprod_fwd
BWD["cumprod"] = _cumprod_bwd


def _prod_layout(shape: tuple, axes: tuple):
    """(to, back): the reduced axes moved last and flattened into one, and the inverse."""
    nd = len(shape)
    axes = tuple(sorted(a % nd for a in axes))
    keep = [i for i in range(nd) if i not in axes]
    perm = keep + list(axes)
    rest = tuple(shape[i] for i in keep)
    n = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    mid = rest + tuple(shape[a] for a in axes)
    inv = np.argsort(perm)

    def to(a):
        return np.reshape(np.transpose(a, perm), rest + (n,))

    def back(a):
        return np.transpose(np.reshape(a, mid), inv)

    return to, back, rest, n


def _reduce_prod_fwd(ctx, eqn, ins, act):
    x = ins[0]
    if isinstance(x, IntVal):
        return const_eval(eqn, ins), None
    to, _, _, _ = _prod_layout(x.shape, tuple(eqn.params["axes"]))
    return [_tree_prod(_lin(x, to))], None


def _reduce_prod_bwd(ctx, eqn, ins, outs, aux, cots, need):
    x = ins[0]
    to, back, rest, n = _prod_layout(x.shape, tuple(eqn.params["axes"]))
    xl = _lin(x, to)
    others = S.mul(_exclusive(xl), _flip(_exclusive(_flip(xl))))  # no division
    c = _lin(cots[0], lambda a: np.broadcast_to(np.reshape(a, rest + (1,)), rest + (n,)))
    return [_lin(S.rmul(c, others), back)]


FWD["reduce_prod"] = _reduce_prod_fwd
BWD["reduce_prod"] = _reduce_prod_bwd


# pure (one evaluation per ray for a repeated equation), and smooth: no singular point of their
# own at x0
PURE.update({"cumprod", "reduce_prod"})
PLAIN.update({"cumprod", "reduce_prod"})
