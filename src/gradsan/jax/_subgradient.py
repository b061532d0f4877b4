"""gradsan.jax.subgradient: branch-locked backprop (Kakade & Lee 2018).

At every kink the program sat on, take the piece that is active along a random direction v
(the sign of the tangent of the switch argument), then differentiate the program with those
pieces locked. The result is lim_{t -> 0+} grad f(x0 + t v): an element of the Bouligand
subdifferential of f at x0, for about one JVP plus one VJP (and one evaluation that finds the
kinks). ``relu(x) - relu(-x)`` at 0 gets 1, where plain AD gets 0.

A tie that first-order information cannot break (the tangents of the tied candidates are equal
along v) is reported, not guessed: for a continuous kink (abs, max, clamp, sort, ...) every
piece then has the same gradient and the result is unaffected (the finding says so); for a
comparison or a jump (where, floor, sign, casts) the side is unknown and the finding has kind
``"unresolved"`` (``report.ok`` is False). eigh/svd ties and atan2 at the origin are left at
JAX's convention and reported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _catalog
from .._catalog._ops import CONTINUOUS_KINKS as CONTINUOUS
from .._catalog._ops import JUMPS as JUMP_OPS
from .._report import Finding, Report
from .._report._build import catalog_finding
from ._call import check_callable, leaf_owner
from ._compat import bind as _bind
from ._rules import is_float
from ._sanitize import CUSTOM_RULE_CALLS, DependenceEval, Kink, kink_tangents, scan_kinks
from .interpreter import Scope


class LockedEval(DependenceEval):
    """Run under ``jax.grad``: the evaluations in ``decisions`` are replaced by the branch
    active along the chosen direction; a call with a custom derivative rule (a safe function)
    keeps its rule unless a kink inside it is locked (``locked_calls``)."""

    def __init__(self, decisions: dict, locked_calls: set) -> None:
        super().__init__()
        self.decisions = decisions
        self.locked_calls = locked_calls

    def evaluate(self, eqn: Any, invals: list, key: tuple) -> list:
        lock = self.decisions.get(key)
        return lock(invals) if lock is not None else _bind(eqn, invals)

    def call(
        self,
        eqn: Any,
        jaxpr: Any,
        consts: list,
        invals: list,
        insides: list,
        scope: Scope,
        key: tuple,
    ) -> tuple[list, list]:
        if eqn.primitive.name in CUSTOM_RULE_CALLS and key not in self.locked_calls:
            outs = _bind(eqn, invals)
            return outs, [any(insides)] * len(outs)
        return super().call(eqn, jaxpr, consts, invals, insides, scope, key)


def _f(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def _lock(k: Kink, tans: list[np.ndarray]):
    """(locked evaluation: invals -> outs, unbroken mask in the kink's mask shape) or None."""
    op, ops, eqn = k.op, k.operands, k.eqn
    t = [_f(x) for x in tans]
    if op == "abs":
        x, tx = ops[0], t[0]
        at = x == 0
        pos = (x > 0) | (at & (tx > 0))
        unb = at & (tx == 0)
        pos = pos | unb  # JAX's convention there (abs'(0) = 1); the gradient is the same

        def fn(invals):
            v = invals[0]
            return [jnp.where(pos, v, -v)]

        return fn, unb
    if op == "i0e":  # i0e'(0) one-sided: i1e(0) - sigma i0e(0), where JAX takes sign(0) = 0
        x, tx = ops[0], t[0]
        at = x == 0
        sigma = np.where(at & (tx > 0), 1.0, np.where(at & (tx < 0), -1.0, 0.0))
        unb = at & (tx == 0)

        def fn(invals):
            v = invals[0]
            out = _bind(eqn, invals)[0]
            slope = jnp.asarray(-sigma, out.dtype) * out
            return [out + (v - jax.lax.stop_gradient(v)) * slope]

        return fn, unb
    if op in ("max", "min", "relu"):
        a, b = np.broadcast_arrays(ops[0], ops[1])
        ta, tb = np.broadcast_arrays(t[0], t[1])
        big = op != "min"
        tie = a == b
        choose_a = ((a > b) if big else (a < b)) | (tie & ((ta > tb) if big else (ta < tb)))
        unb = tie & (ta == tb)

        def fn(invals):
            orig = _bind(eqn, invals)[0]
            return [jnp.where(unb, orig, jnp.where(choose_a, invals[0], invals[1]))]

        return fn, unb
    if op == "clamp" and eqn.primitive.name == "clamp":
        lo, x, hi = ops
        tlo, tx, thi = t
        shape = np.broadcast_shapes(np.shape(lo), np.shape(x), np.shape(hi))
        lo, x, hi = (np.broadcast_to(v, shape) for v in (lo, x, hi))
        tlo, tx, thi = (np.broadcast_to(v, shape) for v in (tlo, tx, thi))
        below = (x < lo) | ((x == lo) & (tx < tlo))
        above = (x > hi) | ((x == hi) & (tx > thi))
        unb = ((x == lo) & (tx == tlo)) | ((x == hi) & (tx == thi))

        def fn(invals):
            orig = _bind(eqn, invals)[0]
            vlo, vx, vhi = invals
            return [jnp.where(unb, orig, jnp.where(below, vlo, jnp.where(above, vhi, vx)))]

        return fn, unb
    if op in JUMP_OPS:
        x, tx = ops[0], t[0]
        at = np.asarray(k.mask, bool) & np.broadcast_to(x == x, k.mask.shape)
        unb = at & (tx == 0)
        up, down = at & (tx > 0), at & (tx < 0)
        if op == "sign":
            off = up * 1.0 - down * 1.0
        elif op == "floor":
            off = -1.0 * down
        elif op == "ceil":
            off = 1.0 * up
        elif op == "round":
            with np.errstate(all="ignore"):
                r = np.round(x)  # to nearest even, as lax.round by default; fixed below
            target = np.where(up, x + 0.5, np.where(down, x - 0.5, r))
            off = np.where(at, target - _f(_bind(eqn, [jnp.asarray(x)])[0]), 0.0)
        else:  # trunc: a float -> int cast
            if k.params.get("to_bool"):
                flip = at & (tx != 0)

                def fn(invals):
                    return [jnp.where(flip, True, _bind(eqn, invals)[0])]

                return fn, unb
            off = np.where((x > 0) & down, -1, np.where((x < 0) & up, 1, 0))

        def fn(invals):
            out = _bind(eqn, invals)[0]
            return [out + jnp.asarray(off, out.dtype)]

        return fn, unb
    if op in ("reduce_max", "reduce_min", "argmax", "argmin"):
        x, tx = ops[0], t[0]
        axes = tuple(a % x.ndim for a in k.params.get("axes", ()))
        kept = [a for a in range(x.ndim) if a not in axes]
        perm = kept + list(axes)
        xm = np.transpose(x, perm).reshape([x.shape[a] for a in kept] + [-1])
        tm = np.transpose(tx, perm).reshape(xm.shape)
        use_min = op in ("reduce_min", "argmin")
        ext = (xm.min if use_min else xm.max)(axis=-1, keepdims=True)
        tied = xm == ext
        score = np.where(tied, -tm if use_min else tm, -np.inf)
        idx = np.argmax(score, axis=-1)
        best = np.take_along_axis(score, idx[..., None], -1)
        unb = np.sum(tied & (score == best), -1) > 1

        def fn(invals):
            if op in ("argmax", "argmin"):
                return [jnp.asarray(idx, eqn.params.get("index_dtype", jnp.int32))]
            v = jnp.transpose(invals[0], perm).reshape(xm.shape)
            return [jnp.take_along_axis(v, jnp.asarray(idx)[..., None], -1)[..., 0]]

        return fn, unb
    if op == "sort":
        axis = eqn.params.get("dimension", -1) % ops[0].ndim
        x = np.moveaxis(ops[0], axis, -1)
        tx = np.moveaxis(t[0], axis, -1)
        iota = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
        order = np.lexsort((iota, tx, x), axis=-1)
        srt = np.take_along_axis(x, order, -1)
        tsr = np.take_along_axis(tx, order, -1)
        same = (srt[..., 1:] == srt[..., :-1]) & (tsr[..., 1:] == tsr[..., :-1])
        unb_s = np.zeros(x.shape, bool)
        unb_s[..., 1:] |= same
        unb_s[..., :-1] |= same
        unb = np.empty_like(unb_s)
        np.put_along_axis(unb, order, unb_s, -1)
        unb = np.moveaxis(unb, -1, axis)
        order_ax = np.moveaxis(order, -1, axis)

        def fn(invals):
            o = jnp.asarray(order_ax)
            return [jnp.take_along_axis(v, o, axis) for v in invals]

        return fn, unb & np.broadcast_to(k.mask, unb.shape)
    if op == "top_k":
        kk = int(eqn.params["k"])
        axis = eqn.params.get("axis", -1)
        axis = -1 if axis is None else axis % ops[0].ndim
        x = np.moveaxis(ops[0], axis, -1)
        tx = np.moveaxis(t[0], axis, -1)
        iota = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
        order = np.lexsort((iota, -tx, -x), axis=-1)[..., :kk]
        unb = np.zeros(k.mask.shape, bool)  # ties inside the top k do not change the result

        def fn(invals):
            o = jnp.asarray(order)
            v = jnp.moveaxis(invals[0], axis, -1)
            vals = jnp.moveaxis(jnp.take_along_axis(v, o, -1), -1, axis)
            return [vals, jnp.moveaxis(o.astype(jnp.int32), -1, axis)]

        return fn, unb
    if op in ("cummax", "cummin"):
        axis = eqn.params.get("axis", 0) % ops[0].ndim
        rev = eqn.params.get("reverse", False)
        x = np.moveaxis(ops[0], axis, -1)
        tx = np.moveaxis(t[0], axis, -1)
        n = x.shape[-1]
        sgn = -1.0 if op == "cummin" else 1.0
        choice = np.zeros(x.shape, np.int64)
        unb = np.zeros(x.shape, bool)
        rng = list(range(n - 1, -1, -1)) if rev else list(range(n))
        bx: Any = None
        bt: Any = None
        bi = np.zeros(x.shape[:-1], np.int64)
        bu = np.zeros(x.shape[:-1], bool)
        for i in rng:
            xi, ti = sgn * x[..., i], sgn * tx[..., i]
            if bx is None:
                bx, bt, bi = xi, ti, np.full(x.shape[:-1], i)
            else:
                better = (xi > bx) | ((xi == bx) & (ti > bt))
                bu = np.where(better, False, bu | ((xi == bx) & (ti == bt)))
                bx, bt = np.where(better, xi, bx), np.where(better, ti, bt)
                bi = np.where(better, i, bi)
            choice[..., i] = bi
            unb[..., i] = bu
        ch = np.moveaxis(choice, -1, axis)

        def fn(invals):
            return [jnp.take_along_axis(invals[0], jnp.asarray(ch), axis)]

        return fn, np.moveaxis(unb, -1, axis)
    if op in ("reduce_window_max", "reduce_window_min"):
        return _lock_window(k, t[0])
    if op == "cmp":
        lhs, rhs = ops
        tl, tr = np.broadcast_arrays(t[0], t[1])
        eqm = np.asarray(k.mask, bool)
        d = np.broadcast_to(tl - tr, eqm.shape)
        name = eqn.primitive.name
        decided = {"gt": d > 0, "ge": d > 0, "lt": d < 0, "le": d < 0, "eq": d == 0, "ne": d != 0}[
            name
        ]
        unb = eqm & (d == 0)
        change = eqm & ~unb

        def fn(invals):
            orig = _bind(eqn, invals)[0]
            return [jnp.where(change, decided, orig)]

        return fn, unb
    return None


def _lock_window(k: Kink, tx: np.ndarray):
    x = k.operands[0]
    p = k.params
    use_min = k.op.endswith("min")
    fill = np.inf if use_min else -np.inf
    dims = tuple(p["window_dimensions"])
    strides = tuple(p.get("window_strides") or (1,) * x.ndim)
    pad = tuple(tuple(q) for q in (p.get("padding") or ((0, 0),) * x.ndim))
    wdil = tuple(p.get("window_dilation") or (1,) * x.ndim)
    xp = np.pad(x.astype(np.float64), pad, constant_values=fill)
    tp = np.pad(tx, pad, constant_values=0.0)
    ip = np.arange(xp.size).reshape(xp.shape)

    def win(a):
        eff = tuple((d - 1) * w + 1 for d, w in zip(dims, wdil))
        v = np.lib.stride_tricks.sliding_window_view(a, eff)
        v = v[tuple(slice(None, None, s) for s in strides)]
        v = v[(Ellipsis,) + tuple(slice(None, None, w) for w in wdil)]
        return v.reshape(v.shape[: a.ndim] + (-1,))

    w, wt, wi = win(xp), win(tp), win(ip)
    ext = w.min(-1) if use_min else w.max(-1)
    tied = w == ext[..., None]
    score = np.where(tied, -wt if use_min else wt, -np.inf)
    j = np.argmax(score, -1)
    best = np.take_along_axis(score, j[..., None], -1)
    unb = np.sum(tied & (score == best), -1) > 1
    flat = np.take_along_axis(wi, j[..., None], -1)[..., 0]

    def fn(invals):
        v = jnp.pad(invals[0], pad, constant_values=fill).reshape(-1)
        return [v[jnp.asarray(flat)]]

    return fn, unb & np.asarray(k.mask, bool)


def _finding(k: Kink, unb: np.ndarray | None, locked: bool, v_note: str) -> Finding:
    entry = _catalog.get(k.entry_id)
    n_unb = int(np.sum(unb)) if unb is not None else 0
    detail: dict[str, Any] = {"op": k.op, "subdifferential": entry.subdifferential}
    kind = "kink"
    if not locked:
        detail["branch"] = "not locked: JAX's convention is kept"
        if k.op == "atan2":
            kind = "unresolved"
            detail["note"] = "atan2 is discontinuous at the origin: no limit gradient exists"
        else:
            detail["note"] = (
                "the eigenvalue gradient is a Clarke subgradient, not necessarily "
                "the limit along the direction"
            )
    elif n_unb:
        detail["unbroken"] = n_unb
        if k.op in CONTINUOUS:
            detail["branch"] = (
                "first-order tie: the tied candidates have equal tangents, so "
                "every piece gives the same gradient here"
            )
        else:
            kind = "unresolved"
            detail["branch"] = (
                "first-order information cannot tell which side of the "
                "boundary is active: the gradient keeps JAX's convention there "
                "and may not be a limit gradient"
            )
    else:
        detail["branch"] = f"the piece active along {v_note}"
    fr = k.frame
    return catalog_finding(
        backend="jax",
        entry_id=k.entry_id,
        kind=kind,
        phase="gradient",
        primitive=k.prim if k.op != "where" else "select_n",
        where=fr,
        result="finite",
        backend_op=k.eqn.primitive.name,
        got=k.got,
        count=int(np.sum(k.mask)),
        size=int(np.size(k.mask)),
        index=k.index,
        library=k.scope.library,
        context=k.scope.context,
        detail=detail,
    )


def subgradient(
    fun: Callable, *, key: Any = None, argnums: int | Sequence[int] = 0
) -> Callable[..., tuple[Any, Report]]:
    """Branch-locked gradient of a scalar function: ``subgradient(f)(*args) -> (g, report)``.

    ``g`` has the structure of ``args[argnums]`` (a tuple of them when ``argnums`` is a
    tuple) and equals lim_{t -> 0+} grad f(x0 + t v) for a random direction v drawn from
    ``key`` (default ``jax.random.PRNGKey(0)``): the gradient of the piece active along v, an
    element of the Bouligand subdifferential for a piecewise-smooth f. Where f is
    differentiable it is the ordinary gradient. ``report`` lists every kink the program sat on
    and the branch taken; a tie that the direction's first-order information cannot break is
    reported as such (kind ``"unresolved"`` when it can change the result).

    Cost: one evaluation that finds the kinks, one JVP along v, one VJP; programs are
    evaluated equation by equation (eagerly), so use it on the step that needs it.

    Example::

        g, report = gradsan.jax.subgradient(lambda x: jax.nn.relu(x) - jax.nn.relu(-x))(0.0)
        # g == 1.0 (plain AD: 0.0)
    """
    check_callable(fun, "subgradient")
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    single = isinstance(argnums, int)

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> tuple[Any, Report]:
        closed, flat_args, ev = scan_kinks(fun, args, kwargs)
        owner = leaf_owner(args, kwargs)
        diff = [i for i, a in enumerate(flat_args) if owner[i] in nums and is_float(a)]
        rk = jax.random.PRNGKey(0) if key is None else key
        v: list = [None] * len(flat_args)
        for i in diff:
            rk, sub = jax.random.split(rk)
            a = flat_args[i]
            v[i] = jax.random.normal(sub, np.shape(a), jnp.float32).astype(jnp.result_type(a))
        lockable = [
            k
            for k in ev.kinks
            if k.op not in ("where",) and k.eqn.primitive.name not in ("pjit", "jit")
        ]
        lockable += ev.cmp_kinks
        want = {k.key for k in lockable}
        tans = kink_tangents(closed, flat_args, want, [v])[0] if want else {}
        decisions: dict = {}
        unbroken: dict = {}
        for k in lockable:
            tk = tans.get(k.key)
            if tk is None:
                continue
            res = _lock(k, tk)
            if res is None:
                continue
            fn, unb = res
            decisions[k.key] = fn
            unbroken[k.key] = unb

        def f_locked(*dyn):
            full = list(flat_args)
            for i, d in zip(diff, dyn):
                full[i] = d
            lev = LockedEval(decisions, ev.calls_with_kinks)
            outs, _ = lev.run_closed(closed, full, [False] * len(full))
            if len(outs) != 1 or np.shape(outs[0]) != ():
                raise TypeError(
                    "gradsan.jax.subgradient needs a function with one scalar "
                    f"output; got {len(outs)} outputs of shapes "
                    f"{[np.shape(o) for o in outs]}"
                )
            return outs[0]

        grads = jax.grad(f_locked, argnums=tuple(range(len(diff))))(*[flat_args[i] for i in diff])
        gmap = dict(zip(diff, grads))
        results = []
        for n in nums:
            leaves_idx = [i for i in range(len(flat_args)) if owner[i] == n]
            arg = args[n]
            leaves = [gmap.get(i, jnp.zeros_like(flat_args[i])) for i in leaves_idx]
            results.append(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(arg), leaves))
        g = results[0] if single else tuple(results)
        report = Report(outputs=g, function=getattr(fun, "__name__", "function"), backend="jax")
        seen: set = set()
        v_note = "a random direction v"
        for k in ev.kinks:
            if k.summarized and k.op != "where":
                continue
            fr = k.frame
            gk = (k.entry_id, (fr.file, fr.line, fr.column) if fr else id(k.eqn))
            if gk in seen:
                continue
            seen.add(gk)
            locked = k.key in decisions or k.op == "where" and k.key in decisions
            unb = unbroken.get(k.key)
            if k.eqn.primitive.name in ("pjit", "jit"):  # a library call: its pieces are locked
                inner = [
                    unbroken[c.key]
                    for c in lockable
                    if c.key[: len(k.key)] == k.key and c.key in unbroken
                ]
                locked = True
                unb = np.array([int(np.sum(u)) for u in inner]) if inner else None
            report.findings.append(_finding(k, unb, locked, v_note))
        where_keys = {k.key for k in ev.kinks if k.op == "where"}
        for k in ev.cmp_kinks:  # a comparison feeding something other than a where
            if k.key in where_keys or not np.any(unbroken.get(k.key, False)):
                continue
            report.findings.append(_finding(k, unbroken.get(k.key), True, v_note))
        return g, report

    return wrapped
