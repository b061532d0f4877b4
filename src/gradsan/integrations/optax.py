"""``guard_finite``: an optax transformation that guards *and explains* non-finite gradients.

``optax.apply_if_finite`` skips a bad step silently. ``guard_finite`` either raises
:class:`gradsan.NonFiniteError` with the explanation (``mode="raise"``) or skips the update
and counts it in its state, printing the explanation of every skipped step (``mode="skip"``)::

    tx = guard_finite(optax.adam(1e-3), explain_fn=jax.grad(loss), mode="skip")
    updates, state = tx.update(grads, state, params, batch=batch)   # explain_fn(params, batch=batch)

``explain_fn`` is the function that produced the gradients; it is called as
``explain_fn(params, **extra_args)`` (the keyword arguments given to ``update``), and only on a
non-finite step, through a host callback when ``update`` runs under ``jit``. Without it the
report lists the non-finite gradient leaves only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from .._errors import NonFiniteError
from .._report import Finding, OutputHit, Report
from ..jax._flags import finite_flag, nonfinite_leaves


class GuardFiniteState(NamedTuple):
    inner_state: Any
    notfinite_count: jax.Array  # consecutive skipped steps
    total_notfinite: jax.Array  # all skipped steps
    step: jax.Array  # update calls so far


def _summary(grads: Any) -> Report:
    hits = [
        OutputHit(
            path or "grads",
            int((~jnp.isfinite(g)).sum()),
            int(g.size),
            int(jnp.isnan(g).sum()),
            int(jnp.isinf(g).sum()),
            "grad",
        )
        for path, g in nonfinite_leaves(jax.tree_util.tree_map(jnp.asarray, grads))
    ]
    report = Report(function="optax update", backend="jax")
    report.findings.append(
        Finding(
            kind="nonfinite",
            catalog_id=None,
            phase="gradient",
            primitive="?",
            where=None,
            outputs=hits,
        )
    )
    report.notes.append(
        "pass explain_fn=jax.grad(loss) to guard_finite (and the loss's other "
        "arguments as keywords to update) to see where the NaN/Inf was born"
    )
    return report


def guard_finite(
    inner: optax.GradientTransformation | None = None,
    *,
    explain_fn: Callable | None = None,
    mode: Literal["raise", "skip"] = "raise",
    on_report: Callable[[Report, int], None] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Guard ``inner`` (identity if None) against NaN/Inf gradients, with an explanation.

    **Arguments:** ``inner``: the optimizer to guard; ``explain_fn``: the gradient function,
    called as ``explain_fn(params, **extra_args)`` on a bad step; ``mode``: ``"raise"`` raises
    :class:`gradsan.NonFiniteError` (under ``jit`` it surfaces from the host callback, as a
    JAX runtime error whose message holds the report), ``"skip"`` returns zero updates, leaves
    ``inner``'s state untouched and counts the step; ``on_report(report, step)`` receives each
    report (default: print it to stderr).

    **Returns:** an ``optax.GradientTransformationExtraArgs`` with state :class:`GuardFiniteState`.
    """
    if mode not in ("raise", "skip"):
        raise ValueError(f"guard_finite: mode must be 'raise' or 'skip', not {mode!r}")
    inner = optax.with_extra_args_support(inner or optax.identity())

    def report_for(grads: Any, params: Any, extra: dict) -> Report:
        if explain_fn is None or params is None:
            return _summary(grads)
        import gradsan.jax as gsj

        report = gsj.explain(explain_fn)(params, **extra)
        return report if report.findings else _summary(grads)

    def host(step: Any, grads: Any, params: Any, extra: dict) -> None:
        report = report_for(grads, params, extra)
        step = int(step)
        if mode == "raise":
            raise NonFiniteError(report)
        if on_report is not None:
            on_report(report, step)
        else:
            print(
                f"gradsan: skipped the update of step {step}: non-finite gradients.\n{report}",
                file=sys.stderr,
                flush=True,
            )

    def init(params: Any) -> GuardFiniteState:
        z = jnp.zeros([], jnp.int32)
        return GuardFiniteState(inner.init(params), z, z, z)

    def update(updates: Any, state: GuardFiniteState, params: Any = None, **extra: Any):
        ok = finite_flag([jnp.asarray(x) for x in jax.tree_util.tree_leaves(updates)])
        eager = not isinstance(ok, jax.core.Tracer)
        if eager and not bool(ok):
            host(state.step, updates, params, extra)
        elif not eager:
            jax.lax.cond(
                ok,
                lambda *a: None,
                lambda *a: jax.debug.callback(host, *a[:3], a[3]),
                state.step,
                updates,
                params,
                extra,
            )
        new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra)
        if mode == "skip":
            new_updates = jax.tree_util.tree_map(
                lambda n, u: jnp.where(ok, n, jnp.zeros_like(u)), new_updates, updates
            )
            new_inner = jax.tree_util.tree_map(
                lambda n, o: jnp.where(ok, n, o), new_inner, state.inner_state
            )
        bad = (~ok).astype(jnp.int32)
        return new_updates, GuardFiniteState(
            new_inner,
            jnp.where(ok, 0, state.notfinite_count + 1),
            state.total_notfinite + bad,
            state.step + 1,
        )

    return optax.GradientTransformationExtraArgs(init, update)
