"""Tier C: directions, and the minimum-norm element of the hull of the limits."""

from __future__ import annotations

import math

import jax
import numpy as np

from ..._errors import UsageError

# -- Tier C: combining directions -----------------------------------------------------------


def min_norm_hull(points: list[np.ndarray]) -> np.ndarray:
    """The minimum-norm element of the convex hull of the points: exact, from the k x k Gram
    matrix (the weights minimize w' G w on the simplex)."""
    if len(points) == 1:
        return np.ravel(points[0])
    if len(points) == 2:
        a, b = (np.ravel(p) for p in points)
        d = a - b
        dd = float(d @ d)
        lam = 0.0 if dd == 0 else float(np.clip(-(b @ d) / dd, 0.0, 1.0))
        return b + lam * d
    P = np.stack([np.ravel(p) for p in points])
    return _simplex_weights(P @ P.T) @ P


def _simplex_weights(G: np.ndarray) -> np.ndarray:
    """argmin w' G w over the probability simplex. Up to 12 points, exactly: the optimum is
    the affine minimum-norm point of some support S (Caratheodory: an affinely independent one),
    where [G_S 1; 1' 0] [w; m] = [0; 1]; every support is tried and the best feasible one kept.
    Beyond, projected gradient steps on the simplex."""
    k = len(G)
    best, wbest = np.inf, None
    if k <= 12:
        for mask in range(1, 1 << k):
            S = [i for i in range(k) if mask >> i & 1]
            A = np.zeros((len(S) + 1, len(S) + 1))
            A[:-1, :-1] = G[np.ix_(S, S)]
            A[:-1, -1] = A[-1, :-1] = 1.0
            rhs = np.zeros(len(S) + 1)
            rhs[-1] = 1.0
            try:
                sol = np.linalg.solve(A, rhs)
            except np.linalg.LinAlgError:
                continue
            w = sol[:-1]
            if not np.all(np.isfinite(w)) or np.any(w < -1e-12):
                continue
            w = np.clip(w, 0.0, None)
            w /= w.sum()
            full = np.zeros(k)
            full[S] = w
            val = float(full @ G @ full)
            if val < best - 1e-15 * (1 + abs(best)):
                best, wbest = val, full
        if wbest is not None:
            return wbest
    w = np.full(k, 1.0 / k)
    step = 1.0 / (2 * max(float(np.max(np.abs(np.linalg.eigvalsh(G)))), 1e-300))
    for _ in range(20000):
        w = _project_simplex(w - step * 2 * (G @ w))
    return w


def _project_simplex(v: np.ndarray) -> np.ndarray:
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    r = np.nonzero(u - css / np.arange(1, len(v) + 1) > 0)[0][-1]
    return np.maximum(v - css[r] / (r + 1), 0.0)


def _seed(key) -> int:
    if key is None:
        return 0
    try:
        return int(np.asarray(jax.random.key_data(key)).ravel().sum())
    except Exception:
        return int(np.asarray(key).ravel().sum())


def _directions(leaves: list[np.ndarray], directions, num: int, key) -> list[list[np.ndarray]]:
    if directions is not None:
        out = []
        for d in directions:
            dl = jax.tree_util.tree_leaves(d)
            if len(dl) != len(leaves):
                raise UsageError(
                    "gradsan.jax.certify: each direction must have the structure of "
                    "the first argument (one array per parameter leaf)"
                )
            out.append(
                [
                    np.broadcast_to(np.asarray(x, np.float64), np.shape(l0)).copy()
                    for x, l0 in zip(dl, leaves)
                ]
            )
        return out
    rng = np.random.default_rng(_seed(key))
    num = max(1, int(num))
    sizes = [int(np.size(x0)) for x0 in leaves]
    cuts = np.cumsum(sizes)[:-1]
    dirs: list = []
    while len(dirs) < num:
        # one draw for every leaf (the same numbers as one draw per leaf, in leaf order)
        flat = rng.standard_normal(sum(sizes))
        flat /= math.sqrt(float(flat @ flat)) or 1.0
        dirs.append([a.reshape(np.shape(x0)) for a, x0 in zip(np.split(flat, cuts), leaves)])
        if len(dirs) < num:
            neg = -flat
            dirs.append([a.reshape(np.shape(x0)) for a, x0 in zip(np.split(neg, cuts), leaves)])
    return dirs


def _same(g1: list, g2: list) -> bool:
    return all(np.allclose(a, b, rtol=1e-7, atol=1e-9) for a, b in zip(g1, g2))


def _opposite(d1: list, d2: list) -> bool:
    return all(np.array_equal(a, -b) for a, b in zip(d1, d2))


def _min_norm_leaves(grads: list[list]) -> list:
    """The minimum-norm element of the hull of several gradients (lists of leaves). Leaves on
    which every gradient agrees add the same constant to w' G w and are that leaf in the
    result; the weights come from the Gram matrix of the others only."""
    differ = [
        k
        for k in range(len(grads[0]))
        if not all(np.array_equal(g[k], grads[0][k]) for g in grads[1:])
    ]
    out = [np.asarray(g, np.float64) for g in grads[0]]
    if not differ:
        return out
    parts = [np.concatenate([np.ravel(g[k]) for k in differ]) for g in grads]
    x = min_norm_hull(parts)
    off = 0
    for k in differ:
        n = out[k].size
        out[k] = x[off : off + n].reshape(out[k].shape)
        off += n
    return out
