"""Exact series rules of gradsan.jax.certify for max / min pooling.

Registered into ``_certify.FWD`` / ``BWD`` by the import at the bottom of ``_certify_ops``:

* ``reduce_window_max`` / ``reduce_window_min`` (``flax.linen.max_pool``, ``hk.max_pool``,
  ``lax.reduce_window(x, -inf, lax.max, ...)``): each output element is the max (min) of the
  input elements its window covers. An integer index array (output shape + (W,), W the window
  size) gives for each output element the flat input index of each window element, or -1
  where the window covers padding or a hole of the base dilation (both hold the primitive's
  init value: -inf for the max, +inf for the min, a hard signed infinity here). It is built
  once per parameters and input shape from the primitive's parameters (window_dimensions,
  window_strides, padding, base_dilation, window_dilation) and checked against the primitive
  itself (bound on index encodings: the largest and the smallest index of every window).
  The input series is gathered along a new last axis and the max over that axis is decided
  by ``reduce_max``'s own rule (``_tournament``: leading terms in dominance order, exact ties
  share the cotangent equally, ties known only up to a horizon are UNDEC, a hard -inf drops
  out where the window has a finite element). The reverse rule is ``reduce_max``'s, then a
  scatter-add of the gathered cotangent back to the input positions (horizons by minimum,
  status codes by maximum over the contributions, cancellation judged against the summed
  magnitudes).

Not covered: the generic ``reduce_window`` primitive (a custom reducer or an init value other
than the identity, e.g. ``reduce_window(x, 0., lax.max, ...)``), and the reverse-mode program
of pooling (``select_and_gather_add``, ``select_and_scatter_add``), which only appears when the
certified program itself calls ``jax.grad`` inside; ``certify(jax.grad(loss))`` is unwrapped to
``loss`` and never meets them.
"""

from __future__ import annotations

import types

import jax
import numpy as np

from . import _certify as C
from . import _series as S
from ._certify import BWD, FWD, IntVal, _const_eval
from ._compat import bind as _bind
from ._series import Series, Undecided

_NAMES = ("reduce_window_max", "reduce_window_min")

# -- the window index ----------------------------------------------------------------------------


def window_index(params: dict, in_shape: tuple) -> np.ndarray:
    """For a ``reduce_window_*`` primitive with ``params`` on an input of ``in_shape``: the flat
    (C-order) input index of each window element of each output element, shape
    out_shape + (prod(window_dimensions),), -1 where the element is padding or a hole of the
    base dilation (the window elements in C order of the window dimensions)."""
    in_shape = tuple(int(n) for n in in_shape)
    nd = len(in_shape)
    wdims = tuple(int(w) for w in params["window_dimensions"])
    strides = tuple(int(s) for s in params.get("window_strides") or (1,) * nd)
    pads = tuple((int(lo), int(hi)) for lo, hi in (params.get("padding") or ((0, 0),) * nd))
    bdil = tuple(int(b) for b in params.get("base_dilation") or (1,) * nd)
    wdil = tuple(int(d) for d in params.get("window_dilation") or (1,) * nd)
    if not (len(wdims) == len(strides) == len(pads) == len(bdil) == len(wdil) == nd):
        raise Undecided("`reduce_window` parameters do not match the operand's rank")
    elem_strides = [int(np.prod(in_shape[i + 1 :], dtype=np.int64)) for i in range(nd)]
    out_shape = []
    flat = np.zeros((1,) * (2 * nd), np.int64)
    valid = np.ones((1,) * (2 * nd), bool)
    for i in range(nd):
        n, w, s, (lo, hi), b, d = in_shape[i], wdims[i], strides[i], pads[i], bdil[i], wdil[i]
        dil = (n - 1) * b + 1 if n > 0 else 0  # the base-dilated extent
        padded = lo + dil + hi
        eff = (w - 1) * d + 1 if w > 0 else 0  # the dilated window's extent
        m = (padded - eff) // s + 1 if padded >= eff else 0
        out_shape.append(m)
        p = np.arange(m)[:, None] * s + np.arange(w)[None, :] * d - lo  # base-dilated position
        ok = (p >= 0) & (p < dil) & (p % b == 0)
        src = np.where(ok, p // b, 0)
        shp = [1] * (2 * nd)
        shp[i], shp[nd + i] = m, w
        flat = flat + (src * elem_strides[i]).reshape(shp)
        valid = valid & ok.reshape(shp)
    full = tuple(out_shape) + wdims
    idx = np.where(np.broadcast_to(valid, full), np.broadcast_to(flat, full), -1)
    W = int(np.prod(wdims, dtype=np.int64))
    return np.ascontiguousarray(idx.reshape(tuple(out_shape) + (W,)))


def _check_index(eqn, params: dict, in_shape: tuple, idx: np.ndarray) -> None:
    """The index against the primitive itself: bound (once, on a leading batch axis that the
    windows do not reduce) on the index encodings 1..n and their negatives, each window's max
    and min must be its largest and smallest covered index (a window that covers nothing gets
    the init value, outside 1..n)."""
    n = int(np.prod(in_shape, dtype=np.int64))
    if n >= 2**31 - 1:
        return
    enc = (np.arange(n, dtype=np.int32) + 1).reshape(in_shape)
    batched = dict(params)
    for k, one in (
        ("window_dimensions", 1),
        ("window_strides", 1),
        ("padding", (0, 0)),
        ("base_dilation", 1),
        ("window_dilation", 1),
    ):
        if k in batched:
            batched[k] = (one,) + tuple(batched[k])
    with jax.default_device(jax.devices("cpu")[0]):
        r = np.asarray(_bind(eqn, [np.stack([enc, -enc])], batched)[0]).astype(np.int64)
    a, b = r[0], -r[1]
    if eqn.primitive.name == "reduce_window_min":
        a, b = b, a  # the min of the encodings is the smallest index
    hi, lo = a, b  # largest and smallest covered index + 1, or outside 1..n where none
    covered = idx >= 0
    if idx.shape[-1]:
        want_hi = np.max(np.where(covered, idx, -1), axis=-1) + 1
        want_lo = np.min(np.where(covered, idx, n), axis=-1) + 1
    else:
        want_hi = want_lo = np.zeros(idx.shape[:-1], np.int64)
    none = want_hi == 0
    if hi.shape != want_hi.shape or not (
        np.array_equal(none, (hi < 1) | (hi > n))
        and np.array_equal(np.where(none, 0, hi), np.where(none, 0, want_hi))
        and np.array_equal(np.where(none, 0, lo), np.where(none, 0, want_lo))
    ):
        raise Undecided(
            f"`{eqn.primitive.name}`: internal error, the window index does not match the primitive"
        )


_INDEX: dict = {}


def _index_of(eqn, in_shape: tuple) -> np.ndarray:
    """The window index of an equation (cached per primitive, parameters and input shape)."""
    params = dict(eqn.params)
    try:
        key = (eqn.primitive.name, tuple(sorted(params.items())), tuple(in_shape))
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _INDEX:
        return _INDEX[key]
    idx = window_index(params, in_shape)
    out_shape = tuple(eqn.outvars[0].aval.shape)
    if idx.shape[:-1] != out_shape:
        raise Undecided(
            f"`{eqn.primitive.name}`: internal error, window index of shape "
            f"{idx.shape[:-1]} for an output of shape {out_shape}"
        )
    _check_index(eqn, params, tuple(in_shape), idx)
    idx.setflags(write=False)
    if key is not None:
        if len(_INDEX) > 1000:
            _INDEX.clear()
        _INDEX[key] = idx
    return idx


# -- gather and scatter ---------------------------------------------------------------------------


def _gather(x: Series, idx: np.ndarray, big: bool) -> Series:
    """x gathered along a new last axis by the window index; padding holds the init value (a
    hard -inf for the max, +inf for the min)."""
    pad = idx < 0
    src = np.where(pad, 0, idx)

    def take(fill):
        def f(a):
            a = np.broadcast_to(a, x.shape).reshape(-1)
            out = a[src] if a.size else np.zeros(src.shape, a.dtype)
            return np.where(pad, fill, out) if pad.any() else out

        return f

    g = S.apply_linear(x, take(0.0), take(np.inf), take(0), take(0))
    if pad.any():
        g = S.with_inf(g, np.where(pad, -S.HARD if big else S.HARD, 0))
    return g


def _scatter(c: Series, idx: np.ndarray, in_shape: tuple) -> Series:
    """The cotangent of the gathered series (out_shape + (W,)) summed back onto the input
    positions (padding dropped): coefficients summed (cancellation judged against the summed
    magnitudes), horizons by minimum, status codes by maximum over the contributions."""
    n = int(np.prod(in_shape, dtype=np.int64))
    flat = idx.reshape(-1)
    keep = flat >= 0
    tgt = flat[keep]

    def pick(a, dtype=np.float64):
        return np.broadcast_to(a, c.shape).reshape(-1)[keep].astype(dtype, copy=False)

    terms = {}
    for k, a in c.terms.items():
        a = pick(a)
        if not np.count_nonzero(a):
            continue
        s = np.bincount(tgt, weights=a, minlength=n)
        m = np.bincount(tgt, weights=np.abs(a), minlength=n)
        terms[k] = S._cancel(s, m).reshape(in_shape)
    H = np.full(n, np.inf)
    hc = pick(c.H)
    if not np.isinf(hc).all():
        np.minimum.at(H, tgt, hc)
    bad = np.zeros(n, np.int8)
    bc = pick(c.bad, np.int8)
    if np.count_nonzero(bc):
        np.maximum.at(bad, tgt, bc)
    return S.mk(terms, H.reshape(in_shape), bad.reshape(in_shape), in_shape)


# -- the rules ------------------------------------------------------------------------------------


def _as_reduce(big: bool, axis: int):
    """A stand-in for a ``reduce_max`` / ``reduce_min`` equation over ``axis`` (all that
    ``_reduce_max_fwd`` / ``_reduce_max_bwd`` read of an equation)."""
    return types.SimpleNamespace(
        primitive=types.SimpleNamespace(name="reduce_max" if big else "reduce_min"),
        params={"axes": (axis,)},
    )


def _pool_fwd(ctx, eqn, ins, act):
    if len(ins) != 1:
        raise Undecided(f"`{eqn.primitive.name}` with {len(ins)} operands is not supported")
    x = ins[0]
    if isinstance(x, IntVal):
        return _const_eval(eqn, ins), None
    shape = tuple(eqn.invars[0].aval.shape)
    if x.shape != shape:
        x = S.bcast(x, shape)
    big = eqn.primitive.name == "reduce_window_max"
    idx = _index_of(eqn, x.shape)
    g = _gather(x, idx, big)
    red = _as_reduce(big, idx.ndim - 1)
    (out,), (w, und) = C._reduce_max_fwd(ctx, red, [g], act)
    empty = (idx < 0).all(axis=-1)  # windows that cover only padding: the init value, exactly
    if empty.any():
        init = S.with_inf(Series.zeros(out.shape), np.full(out.shape, -S.HARD if big else S.HARD))
        out = S.select(empty, init, out)
        und = und & ~empty
        w = np.where(empty[..., None], 0.0, w)
    return [out], (idx, g, w, und)


def _pool_bwd(ctx, eqn, ins, outs, aux, cots, need):
    if not need[0] or cots[0] is None or aux is None:
        return [None]
    idx, g, w, und = aux
    big = eqn.primitive.name == "reduce_window_max"
    (cg,) = C._reduce_max_bwd(ctx, _as_reduce(big, idx.ndim - 1), [g], outs, (w, und), cots, [True])
    return [_scatter(cg, idx, tuple(eqn.invars[0].aval.shape))]


for _n in _NAMES:
    FWD[_n] = _pool_fwd
    BWD[_n] = _pool_bwd

# bookkeeping in _certify: pure (one evaluation per ray for a repeated equation), and a kink at
# x0 where a window ties (the evaluation at x0 itself is JAX's)
C._PURE.update(_NAMES)
C._KINKY.update(_NAMES)
