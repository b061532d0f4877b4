"""What JAX's derivative rule returns at a kink, and whether it is admissible: the value of the
rule at the first hit element (jvp/vjp probes of the one primitive), and whether the tied
candidates move together along a direction (a trivial tie: the gradient is exact)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from .._catalog._masks import windows as _windows
from .._report._format import format_value
from ._activations import corner_facts
from ._compat import bind as _bind
from .interpreter import to_numpy as _np

if TYPE_CHECKING:
    from ._sanitize import Kink


# -- switch tangents: how the tied candidates move along a direction -----------------------


def switch_spread(k: Kink, tans: list[np.ndarray]) -> np.ndarray:
    """Per hit element, how far apart the tied candidates' tangents are (0: they agree),
    relative to their size, in the kink's mask shape."""
    ops = k.operands
    t = [np.asarray(x, np.float64) for x in tans]
    eps = 64 * np.finfo(np.float32).eps

    def rel(a, b):
        a, b = np.broadcast_arrays(a, b)
        return np.abs(a - b) / np.maximum(eps * (np.abs(a) + np.abs(b)), 1e-300)

    op = k.op
    if op in ("abs", "i0e", "sign", "floor", "ceil", "round", "trunc"):
        return np.broadcast_to(np.where(t[0] == 0, 0.0, np.inf), k.mask.shape)
    if op in ("relu", "max", "min", "where", "cmp", "hypot", "atan2"):
        if op in ("hypot", "atan2"):
            return np.broadcast_to(np.where((t[0] == 0) & (t[1] == 0), 0.0, np.inf), k.mask.shape)
        return np.broadcast_to(rel(t[0], t[1]), k.mask.shape)
    if op == "clamp":
        lo, x, hi = ops
        tlo, tx, thi = t
        out = np.zeros(k.mask.shape)
        if lo is not None and lo.dtype != object:
            out = np.where(np.broadcast_to(x == lo, out.shape), rel(tx, tlo), out)
        if hi is not None and hi.dtype != object:
            out = np.where(np.broadcast_to(x == hi, out.shape), rel(tx, thi), out)
        return out
    if op in ("reduce_max", "reduce_min", "argmax", "argmin"):
        x, tx = ops[0], t[0]
        axes = tuple(a % x.ndim for a in k.params.get("axes", ()))
        ext = (np.min if op in ("reduce_min", "argmin") else np.max)(x, axis=axes, keepdims=True)
        tied = x == ext
        tmax = np.max(np.where(tied, tx, -np.inf), axis=axes)
        tmin = np.min(np.where(tied, tx, np.inf), axis=axes)
        return rel(tmax, tmin)
    if op in ("sort", "top_k"):
        axis = k.params.get("dimension", k.params.get("axis", -1))
        x = np.moveaxis(ops[0], axis, -1)
        tx = np.moveaxis(t[0], axis, -1)
        same = x[..., :, None] == x[..., None, :]
        d = np.where(same, rel(tx[..., :, None], tx[..., None, :]), 0.0).max(axis=-1)
        return np.moveaxis(d, -1, axis)
    if op in ("cummax", "cummin", "reduce_window_max", "reduce_window_min"):
        return _window_spread(k, t[0])
    return np.full(k.mask.shape, np.nan)  # eigh, svd: not decided here


def _window_spread(k: Kink, tx: np.ndarray) -> np.ndarray:
    x = k.operands[0]
    eps = 64 * np.finfo(np.float32).eps
    if k.op.startswith("cum"):
        axis = k.params.get("axis", 0)
        xm, tm = np.moveaxis(x, axis, -1), np.moveaxis(tx, axis, -1)
        if k.params.get("reverse"):
            xm, tm = xm[..., ::-1], tm[..., ::-1]
        fn = np.minimum if k.op == "cummin" else np.maximum
        run = fn.accumulate(xm, axis=-1)
        n = xm.shape[-1]
        lower = np.arange(n)[None, :] <= np.arange(n)[:, None]
        tied = (xm[..., None, :] == run[..., :, None]) & lower
        tmax = np.where(tied, tm[..., None, :], -np.inf).max(-1)
        tmin = np.where(tied, tm[..., None, :], np.inf).min(-1)
        d = np.abs(tmax - tmin) / np.maximum(eps * (np.abs(tmax) + np.abs(tmin)), 1e-300)
        if k.params.get("reverse"):
            d = d[..., ::-1]
        return np.moveaxis(d, -1, axis)
    use_min = k.op.endswith("min")
    w = _windows(x, k.params, np.inf if use_min else -np.inf)
    wt = _windows(tx, k.params, 0.0)
    ext = w.min(-1) if use_min else w.max(-1)
    tied = w == ext[..., None]
    tmax = np.where(tied, wt, -np.inf).max(-1)
    tmin = np.where(tied, wt, np.inf).min(-1)
    return np.abs(tmax - tmin) / np.maximum(eps * (np.abs(tmax) + np.abs(tmin)), 1e-300)


def trivial_mask(k: Kink, per_dir: list[list[np.ndarray]]) -> np.ndarray | None:
    """True at the hit elements where the tied candidates' tangents agree along every
    direction (the candidates are the same function of the inputs to first order)."""
    if k.op in ("eigh", "svd") or not per_dir:
        return None
    ok = np.ones(k.mask.shape, bool)
    for tans in per_dir:
        try:
            spread = switch_spread(k, tans)
        except (ValueError, IndexError):
            return None
        ok &= np.broadcast_to(spread <= 1.0, k.mask.shape)
    return ok & k.mask


# -- conventions: what JAX's derivative rule returns at the kink -----------------------------


def _at(a: Any, idx: tuple, shape: tuple) -> Any:
    a = np.asarray(a)
    if a.shape != shape:
        try:
            a = np.broadcast_to(a, shape)
        except ValueError:
            return a.flat[0]
    return a[idx] if len(idx) == a.ndim else a.flat[0]


def _jvp_wrt(eqn, invals: list, i: int) -> list[np.ndarray]:
    """Output tangents of one primitive when operand ``i`` moves by ones."""
    ts: list[Any] = [None] * len(invals)
    ts[i] = jnp.ones_like(invals[i])

    def f(x):
        full = list(invals)
        full[i] = x
        return _bind(eqn, full)

    _, tout = jax.jvp(f, (jnp.asarray(invals[i]),), (ts[i],))
    return [
        _np(t)
        if np.asarray(t).dtype.kind in "fc" or str(np.asarray(t).dtype) == "bfloat16"
        else np.zeros(np.shape(t))
        for t in tout
    ]


def _vjp_onehot(eqn, invals: list, out_i: int, idx: tuple) -> np.ndarray:
    """Gradient w.r.t. operand 0 of output ``out_i`` at position ``idx``."""

    def f(x):
        full = list(invals)
        full[0] = x
        return _bind(eqn, full)[out_i]

    x0 = jnp.asarray(invals[0])
    out, pull = jax.vjp(f, x0)
    ct = np.zeros(np.shape(out), np.asarray(out).dtype)
    ct[idx] = 1
    (g,) = pull(jnp.asarray(ct))
    return _np(g).astype(np.float64)


def _fmt(v: Any) -> str:
    return format_value(np.asarray(v, np.float64))


def _custom_one(k: Kink, shape: tuple) -> bool:
    """A binary max/min with one operand moving, inside a custom_jvp call of one input of the
    kink's shape (relu6 = min(max(x, 0), 6) under its own rule)."""
    custom = k.scope.custom
    return (
        custom is not None
        and custom[0].primitive.name == "custom_jvp_call"
        and sum(bool(d) for d in k.deps[:2]) == 1
        and len(custom[1]) == 1
        and np.shape(custom[1][0]) == tuple(shape)
    )


def convention(k: Kink) -> dict[str, Any]:
    """The value JAX's rule returned at the first hit, whether it is admissible, and notes."""
    invals = cast(list, k.invals)  # None only for a where, which does not read it
    idx = k.index
    shape = k.mask.shape
    op = k.op
    d: dict[str, Any] = {}
    try:
        if op in ("abs", "i0e", "relu", "sign", "floor", "ceil", "round", "trunc"):
            i = 0 if op != "relu" else (0 if k.deps[0] else 1)
            custom = k.scope.custom
            if (
                op == "relu"
                and custom is not None
                and len(custom[1]) == 1
                and np.shape(custom[1][0]) == np.shape(invals[i])
            ):
                val = _at(_jvp_wrt(custom[0], list(custom[1]), 0)[0], idx, shape)
                d["rule"] = "the custom_jvp rule of the enclosing function (jax.nn.relu)"
            elif op == "trunc":
                val = 0.0
            else:
                val = _at(_jvp_wrt(k.eqn, invals, i)[0], idx, shape)
            d["value"] = _fmt(val)
            if op in ("abs", "i0e"):
                d["admissible"] = bool(-1 <= val <= 1)
            elif op == "relu":
                d["admissible"] = bool(0 <= val <= 1)
            else:
                d["admissible"] = False
                d["blocked"] = True
                d["note"] = (
                    "the function jumps here: the gradient through it is blocked (0), "
                    "which is no subgradient"
                )
        elif op in ("max", "min") and _custom_one(k, shape):
            # a max/min with a constant inside a custom_jvp (jax.nn.relu6, hard_swish): JAX's
            # gradient is the rule's, not the primitive's tie split
            custom = k.scope.custom
            val = float(_at(_jvp_wrt(custom[0], list(custom[1]), 0)[0], idx, shape))
            call = custom[0].params.get("call_jaxpr")
            info = getattr(getattr(call, "jaxpr", None), "debug_info", None)
            name = getattr(info, "func_name", "") or ""
            d["value"] = _fmt(val)
            d["rule"] = f"the custom_jvp rule of the enclosing function ({name or 'custom_jvp'})"
            d["admissible"] = bool(0 <= val <= 1)
        elif op in ("max", "min"):
            vals = [float(_at(_jvp_wrt(k.eqn, invals, i)[0], idx, shape)) for i in (0, 1)]
            d["value"] = "(" + ", ".join(_fmt(v) for v in vals) + ")"
            if k.deps[0] and k.deps[1]:
                d["admissible"] = bool(min(vals) >= 0 and abs(sum(vals) - 1) <= 1e-3)
            else:
                v = vals[0] if k.deps[0] else vals[1]
                d["admissible"] = bool(0 <= v <= 1)
        elif op == "activation":
            # JAX's derivative of the call (relu6's custom_jvp rule when it is relu6 itself)
            x = float(_at(k.operands[0], idx, shape))
            custom = k.scope.custom
            if (
                custom is not None
                and custom[0].primitive.name == "custom_jvp_call"
                and len(custom[1]) == 1
                and np.shape(custom[1][0]) == np.shape(invals[0])
            ):
                val = float(_at(_jvp_wrt(custom[0], list(custom[1]), 0)[0], idx, shape))
                name = k.params.get("library", "custom_jvp")
                d["rule"] = f"the custom_jvp rule of the enclosing function ({name})"
            else:
                val = float(_at(_jvp_wrt(k.eqn, invals, 0)[0], idx, shape))
            d["value"] = _fmt(val)
            d.update(corner_facts(k, x, val))
        elif op == "clamp":
            if invals is not None and len(invals) == 3 and k.eqn.primitive.name == "clamp":
                val = float(_at(_jvp_wrt(k.eqn, invals, 1)[0], idx, shape))
            else:  # jnp.clip(x, lo, hi): the library call, x is its first operand
                val = float(_at(_jvp_wrt(k.eqn, invals, 0)[0], idx, shape))
            d["value"] = f"d/dx = {_fmt(val)}"
            d["admissible"] = bool(0 <= val <= 1)
        elif op == "hypot":
            gs = [float(_at(_jvp_wrt(k.eqn, invals, i)[0], idx, shape)) for i in (0, 1)]
            d["value"] = f"({_fmt(gs[0])}, {_fmt(gs[1])})"
            d["admissible"] = bool(np.hypot(gs[0], gs[1]) <= 1 + 1e-6)
        elif op == "atan2":
            gs = [float(_at(_jvp_wrt(k.eqn, invals, i)[0], idx, shape)) for i in (0, 1)]
            d["value"] = f"({_fmt(gs[0])}, {_fmt(gs[1])})"
            d["admissible"] = False
            d["note"] = "atan2 is discontinuous at the origin: no value is a subgradient"
        elif op in (
            "reduce_max",
            "reduce_min",
            "reduce_window_max",
            "reduce_window_min",
            "cummax",
            "cummin",
        ):
            g = _vjp_onehot(k.eqn, invals, 0, idx)
            tied = _tied_inputs(k, idx)
            w = g[tied]
            d["value"] = "[" + ", ".join(_fmt(v) for v in w[:8]) + "] on the tied elements"
            d["admissible"] = bool(
                np.all(w >= -1e-6) and abs(w.sum() - 1) <= 1e-3 and np.all(np.abs(g[~tied]) <= 1e-6)
            )
        elif op in ("argmax", "argmin"):
            out = _np(_bind(k.eqn, invals)[0])
            d["value"] = f"index {int(_at(out, idx, shape))} (the first of the tied elements)"
            d["admissible"] = True
            d["note"] = (
                "an index carries no gradient; gathering at it sends the whole gradient "
                "to one tied element, a vertex of the subdifferential"
            )
        elif op in ("sort", "top_k"):
            d.update(_sort_convention(k, idx))
        elif op == "where":
            pred = _at(k.pred, idx, shape)
            sel = int(pred)
            cases = [_at(c, idx, shape) for c in cast(list, k.cases)]
            d["value"] = f"the derivative of the branch the comparison selected (case {sel})"
            agree = bool(np.all([c == cases[0] for c in cases]))
            d["admissible"] = agree
            d["branches_agree"] = agree
            if not agree:
                d["note"] = (
                    "the branches differ in value on the boundary: the function jumps "
                    "there and no gradient is right"
                )
        elif op in ("eigh", "svd"):
            d["value"] = (
                "a finite gradient for the eigenvalues (v v^T for the basis returned); "
                "nan through the eigenvectors"
            )
            d["admissible"] = True
            d["note"] = "admissible for the eigenvalues only; the eigenvectors have none"
    except Exception as e:  # a convention we cannot evaluate is not a reason to fail
        d["value_error"] = f"{type(e).__name__}: {e}"
    return d


def _tied_inputs(k: Kink, idx: tuple) -> np.ndarray:
    x = k.operands[0]
    op = k.op
    if op in ("reduce_max", "reduce_min"):
        axes = tuple(a % x.ndim for a in k.params.get("axes", ()))
        ext = (np.min if op == "reduce_min" else np.max)(x, axis=axes, keepdims=True)
        tied = x == ext
        sel = np.zeros(x.shape, bool)
        full = [slice(None)] * x.ndim
        kept = [a for a in range(x.ndim) if a not in axes]
        for a, i in zip(kept, idx):
            full[a] = slice(i, i + 1)
        sel[tuple(full)] = True
        return tied & sel
    if op.startswith("cum"):
        axis = k.params.get("axis", 0) % x.ndim
        pos = idx[axis]
        other = list(idx)
        sel = np.zeros(x.shape, bool)
        rng = range(pos, x.shape[axis]) if k.params.get("reverse") else range(0, pos + 1)
        for j in rng:
            other[axis] = j
            sel[tuple(other)] = True
        ext = x[idx]
        return sel & (x == ext)
    # reduce_window: the elements of window idx equal to its extreme
    dims = tuple(k.params["window_dimensions"])
    strides = tuple(k.params.get("window_strides") or (1,) * x.ndim)
    pad = tuple(k.params.get("padding") or ((0, 0),) * x.ndim)
    wdil = tuple(k.params.get("window_dilation") or (1,) * x.ndim)
    sel = np.zeros(x.shape, bool)
    coords = [
        [idx[a] * strides[a] - pad[a][0] + j * wdil[a] for j in range(dims[a])]
        for a in range(x.ndim)
    ]
    for c in np.ndindex(*dims):
        pos = tuple(coords[a][c[a]] for a in range(x.ndim))
        if all(0 <= p < s for p, s in zip(pos, x.shape)):
            sel[pos] = True
    vals = np.where(sel, x, np.inf if k.op.endswith("min") else -np.inf)
    ext = vals.min() if k.op.endswith("min") else vals.max()
    return sel & (x == ext)


def _sort_convention(k: Kink, idx: tuple) -> dict[str, Any]:
    x = k.operands[0]
    invals = cast(list, k.invals)
    axis = k.params.get("dimension", k.params.get("axis", -1)) % x.ndim
    v = x[idx]
    outs = [_np(o) for o in _bind(k.eqn, invals)]
    vals = outs[0]
    # the first output position along the axis holding the tied value
    line = [slice(None) if a == axis else i for a, i in enumerate(idx)]
    pos = np.nonzero(vals[tuple(line)] == v)[0]
    if len(pos) == 0:
        return {"value": "n/a", "admissible": True}
    oidx = tuple(int(pos[0]) if a == axis else i for a, i in enumerate(idx))
    g = _vjp_onehot(k.eqn, invals, 0, oidx)
    tied = np.zeros(x.shape, bool)
    lsel = tuple(slice(None) if a == axis else slice(i, i + 1) for a, i in enumerate(idx))
    tied[lsel] = True
    tied &= x == v
    got = [int(i[axis]) for i in np.argwhere(np.abs(g) > 0)]
    w = g[tied]
    return {
        "value": f"the whole gradient to index {got} of the tied "
        f"{[int(i[axis]) for i in np.argwhere(tied)]}",
        "admissible": bool(
            np.all(w >= -1e-6) and abs(w.sum() - 1) <= 1e-3 and np.all(np.abs(g[~tied]) <= 1e-6)
        ),
    }
