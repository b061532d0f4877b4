"""gradsan.jax.guard: the same function, plus one finiteness check of its outputs; on failure,
replay the interpreter on the same inputs and raise NonFiniteError with the report."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import NonFiniteError
from ._explain import check_callable, diagnose


@jax.jit
def _all_finite(leaves: list) -> jax.Array:
    # x * 0 is exactly 0 for finite x and NaN for inf or NaN, so one fused sum decides it with
    # no overflow false alarm; on XLA:CPU it is cheaper than isfinite(x).all() per leaf.
    total = sum(jnp.sum(x * 0, dtype=jnp.float32) for x in leaves)
    return jnp.isfinite(total)


def _float_leaves(tree: Any) -> list:
    return [x for x in jax.tree_util.tree_leaves(tree)
            if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]


def _donates(fun: Callable, args: tuple, kwargs: dict) -> bool:
    """Does ``fun`` (a jitted function) donate any of its argument buffers?"""
    try:
        closed = jax.make_jaxpr(fun)(*args, **kwargs)
    except Exception:
        return False
    for eqn in closed.jaxpr.eqns:
        if any(eqn.params.get("donated_invars", ()) or ()):
            return True
    return False


def _copy(tree: Any) -> Any:
    return jax.tree_util.tree_map(
        lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x, tree)


def guard(fun: Callable) -> Callable:
    """A drop-in wrapper: the same signature and bit-identical outputs, plus one fused
    finiteness check of the outputs. When an output is NaN or Inf, the same call is replayed
    through gradsan's interpreter and ``gradsan.NonFiniteError`` (a ``FloatingPointError``) is
    raised; its message is the report and ``err.report`` the :class:`gradsan.Report`.

    Works on jitted functions, including ones that donate their input buffers (the inputs are
    then copied before each call so the replay sees them unchanged).

    Example::

        step = gradsan.jax.guard(jax.jit(train_step))
        params, opt_state, loss = step(params, opt_state, batch)
    """
    check_callable(fun, "guard")
    state: dict[str, Any] = {"donates": None}

    @functools.wraps(fun)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if state["donates"] is None:
            state["donates"] = _donates(fun, args, kwargs)
        kept = _copy((args, kwargs)) if state["donates"] else (args, kwargs)
        out = fun(*args, **kwargs)
        leaves = _float_leaves(out)
        if leaves and not bool(_all_finite(leaves)):
            report = diagnose(fun, kept[0], kept[1], who="guard", outputs=out)
            if not report.findings:
                report.notes.append(
                    "the compiled function returned a non-finite value, but the replay through "
                    "the interpreter stayed finite (XLA fusion can change rounding): run "
                    "gradsan.jax.explain on the un-jitted function."
                )
            raise NonFiniteError(report)
        return out

    guarded.__gradsan_guarded__ = True  # type: ignore[attr-defined]
    return guarded
