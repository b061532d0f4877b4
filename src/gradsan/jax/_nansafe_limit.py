"""nansafe's limit engine: the host decision for a numerical ``0 * inf`` left non-finite, eagerly
and inside a traced program (``jax.jit``, ``jax.vmap``, ``jax.jvp``).

Only a plain ``jax.grad(loss)`` is asked about: :func:`host_limit` sends it to
:func:`gradsan.jax.certify` when an output is non-finite; under a trace
:func:`limit_in_program` puts the same decision behind a ``jax.pure_callback`` taken only when
an output is non-finite.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _compat
from ._flags import finite_flag as _finite_flag
from ._source import exclude_gradsan

exclude_gradsan()


def _is_float_array(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)


def _plain_grad(fun: Callable, kwargs: dict) -> bool:
    """Whether ``fun`` is a plain ``jax.grad(loss)`` (not ``value_and_grad``; jitted or
    wrapped with ``functools.wraps`` counts) called without keywords: the only programs the
    limit engine is asked about."""
    info = _compat.grad_info(fun)
    return info is not None and info.kind == "grad" and not kwargs


def host_limit(fun: Callable, args: tuple, kwargs: dict, result: Any):
    """The host decision, one for both paths (an eager call, and the callback under jit):
    None when every float output is finite (nothing to decide) or when the limit engine has no
    certified number; else (certified gradient, finding) from :func:`_limit`."""
    if all(
        np.isfinite(np.asarray(x)).all()
        for x in jax.tree_util.tree_leaves(result)
        if _is_float_array(x)
    ):
        return None
    return _limit(fun, args, kwargs, result)


_CERTIFIERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _certifier(fun: Callable) -> Callable:
    """certify(fun), kept per gradient function: a second incident reuses the traces of the
    loss and of its vmapped form (most of a first certification's time)."""
    from .certify import certify

    try:
        c = _CERTIFIERS.get(fun)
        if c is None:
            c = _CERTIFIERS[fun] = certify(fun)
        return c
    except TypeError:  # not weakly referenceable
        return certify(fun)


def _limit(fun: Callable, args: tuple, kwargs: dict, result: Any):
    """A numerical 0 * inf left non-finite: ask the limit engine for the gradient of the loss
    (``fun`` must be ``jax.grad(loss)``). Returns (certified gradient, finding) or None when
    there is no certified number (singular, undecided) or ``fun`` is not a plain gradient."""
    if not _plain_grad(fun, kwargs):
        return None
    try:
        rep = _certifier(fun)(*args)
    except Exception:  # an unsupported program: keep the non-finite value, reported
        return None
    if rep.outputs is None or not rep.findings:
        return None
    f = rep.findings[0]
    label = f.detail.get("label")
    if label not in ("gradient", "clarke-subgradient"):
        return None
    grad = jax.tree_util.tree_map(
        lambda c, r: jnp.asarray(c, dtype=r.dtype).reshape(r.shape), rep.outputs, result
    )
    f.kind = "resolved"
    f.detail["rule"] = "limit engine (gradsan.jax.certify): " + (
        "the gradient" if label == "gradient" else "a Clarke subgradient"
    )
    return grad, f


# -- the limit engine inside a traced program (jax.jit, vmap, jvp) -------------------------------


def _callback_operand(x: Any) -> bool:
    """A leaf that travels to the host as a callback operand (an array or a tracer of a plain
    dtype); anything else (a Python scalar or flag) is closed over as it is."""
    if not isinstance(x, (jax.core.Tracer, jax.Array, np.ndarray, np.generic)):
        return False
    return not jnp.issubdtype(x.dtype, jax.dtypes.extended)


def limit_in_program(fun: Callable, flat: list, in_tree, outs: list, out_tree) -> list:
    """Under a trace (``jax.jit``): ``outs`` unchanged when every float output is finite, else
    the host decision (:func:`host_limit`, the one the eager path takes) on the concrete
    arguments and outputs, through ``jax.pure_callback``. Only for a plain ``jax.grad(loss)``;
    for any other program nothing is added.

    The callback sits in a loop that runs only when an output is non-finite (:func:`_guarded`),
    so a finite step never leaves the device, under ``vmap`` too. A ``custom_jvp`` passes the
    tangents of ``outs`` through, so differentiating the program never reaches the callback
    (pure callbacks have no JVP rule)."""
    kwargs = jax.tree_util.tree_unflatten(in_tree, list(flat))[1]
    checked = [i for i, o in enumerate(outs) if _is_float_array(o)]
    if not _plain_grad(fun, kwargs) or not checked:
        return outs
    if any(isinstance(x, jax.core.Tracer) and not _callback_operand(x) for x in flat):
        return outs  # a traced key (an extended dtype) cannot be sent to the host
    pos = [i for i, x in enumerate(flat) if _callback_operand(x)]
    static = [None if i in pos else x for i, x in enumerate(flat)]  # no tracer kept
    shapes = [jax.ShapeDtypeStruct(np.shape(o), jnp.result_type(o)) for o in outs]
    n = len(pos)

    def host(*vals):
        return _host_outputs(fun, in_tree, static, pos, out_tree, vals[:n], vals[n:])

    def to_host(ops, os):
        return list(jax.pure_callback(host, shapes, *ops, *os, vmap_method="sequential"))

    fixed = jax.custom_jvp(_guarded(to_host, checked))

    @fixed.defjvp
    def _fixed_jvp(primals, tangents):
        ops, os = primals
        return fixed(ops, os), list(tangents[1])

    return fixed([flat[i] for i in pos], list(outs))


def _guarded(to_host: Callable, checked: list) -> Callable:
    """``(ops, outs) -> outs``: ``outs`` unchanged when its float entries (``checked``) are
    all finite, else ``to_host(ops, outs)``. Under ``vmap`` the test would be batched (a
    select, or a loop over every element of every batch, each calling the host); the batching
    rule instead tests the whole batch once and, when something is non-finite, loops over the
    elements (``lax.map``) with this same test per element, so only the non-finite elements
    reach the host, each with its own arguments (recursively for nested vmaps)."""

    def finite(os):  # guard's test: one fused sum(x * 0) per output, no extra pass
        return _finite_flag([os[i] for i in checked])

    @jax.custom_batching.custom_vmap
    def fixed(ops, os):
        # a loop run at most once rather than a cond: a cond's identity branch copies every
        # output, a while loop's state keeps the outputs' buffers (the copy is in the body)
        return lax.while_loop(
            lambda s: ~s[0], lambda s: (True, to_host(ops, s[1])), (finite(os), list(os))
        )[1]

    @fixed.def_vmap
    def _batched(size, in_batched, ops, os):
        ops_b, os_b = in_batched
        os = [o if b else jnp.broadcast_to(o, (size, *np.shape(o))) for o, b in zip(os, os_b)]

        def each(ops, os):
            def one(sl):
                it = iter(sl[0])
                return fixed([next(it) if b else o for o, b in zip(ops, ops_b)], sl[1])

            return lax.map(one, ([o for o, b in zip(ops, ops_b) if b], os))

        return _guarded(each, checked)(ops, os), [True] * len(os)

    return fixed


def _host_outputs(fun: Callable, in_tree, static: list, pos: list, out_tree, ops, outs) -> tuple:
    """The callback of :func:`limit_in_program`, on the host: rebuild the arguments (the
    leaves at ``pos`` are the callback's operands ``ops``, the others ``static``), take the
    host decision and return the certified gradient in the outputs' dtypes and shapes, or the
    outputs unchanged when there is no certified number. Never raises (an exception inside a
    pure callback is undefined behaviour under jit): a failure keeps the outputs."""
    outs = [np.asarray(o) for o in outs]
    try:
        leaves = list(static)
        for i, v in zip(pos, ops):
            leaves[i] = v
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, leaves)
        limit = host_limit(fun, args, kwargs, jax.tree_util.tree_unflatten(out_tree, outs))
        if limit is None:
            return tuple(outs)
        got = jax.tree_util.tree_leaves(limit[0])
        if len(got) != len(outs):
            return tuple(outs)
        return tuple(np.asarray(g, dtype=o.dtype).reshape(o.shape) for g, o in zip(got, outs))
    except Exception:
        return tuple(outs)
