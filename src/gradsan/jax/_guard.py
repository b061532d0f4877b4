"""gradsan.jax.guard: the same function, plus one finiteness flag of its outputs; on failure,
replay the interpreter on the same inputs and raise NonFiniteError with the report.

For a jitted function the flag is computed inside the same compiled program (one fused
reduction over the outputs), so a healthy step pays almost nothing. Donation is dropped from
that program so the inputs survive for the replay (``keep_inputs=False`` keeps it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import NonFiniteError
from .._report import OutputHit, Report
from ._explain import check_callable, diagnose


def _flag(out: Any) -> jax.Array:
    """True when every float leaf of ``out`` is finite.

    x * 0 is exactly 0 for finite x and NaN for inf or NaN, so one sum over all leaves decides
    it with no overflow false alarm. The leaves are concatenated into that one reduction: XLA
    fuses the concatenation, and one reduction compiles much faster than one per leaf.
    """
    parts = []
    for x in jax.tree_util.tree_leaves(out):
        if not (hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)):
            continue
        for part in ((jnp.real(x), jnp.imag(x)) if jnp.iscomplexobj(x) else (x,)):
            parts.append((part * 0).astype(jnp.float32).reshape(-1))
    if not parts:
        return jnp.array(True)
    return jnp.isfinite(jnp.sum(jnp.concatenate(parts)))


_separate_flag = jax.jit(_flag)


def _fused(fun: Callable, keep_inputs: bool) -> Callable | None:
    """The jitted ``fun`` recompiled to also return the flag, with the same static and
    donation options; None when ``fun`` is not a plain ``jax.jit`` function."""
    info = getattr(fun, "_jit_info", None)
    inner = getattr(fun, "__wrapped__", None)
    if info is None or inner is None or getattr(info, "user_specified_in_shardings", False):
        return None

    def with_flag(*args: Any, **kwargs: Any):
        out = inner(*args, **kwargs)
        return out, _flag(out)

    opts: dict[str, Any] = {
        "static_argnums": info.static_argnums,
        "static_argnames": info.static_argnames,
        "keep_unused": info.keep_unused,
    }
    if not keep_inputs:
        opts["donate_argnums"] = info.donate_argnums
        opts["donate_argnames"] = info.donate_argnames
    try:
        return jax.jit(functools.wraps(inner)(with_flag), **opts)
    except Exception:  # pragma: no cover - unusual jit options: fall back to a separate check
        return None


def _summary_report(fun: Callable, out: Any) -> Report:
    report = Report(outputs=out, function=getattr(fun, "__name__", "function"), backend="jax")
    bad = []
    for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact):
            n = int((~jnp.isfinite(x)).sum())
            if n:
                bad.append(str(OutputHit(jax.tree_util.keystr(path) or "output", n, int(x.size))))
    report.notes.append(
        "non-finite outputs: " + ", ".join(bad) + ". The inputs were donated to the step, so "
        "they could not be replayed: use gradsan.jax.guard(step) without keep_inputs=False, or "
        "run gradsan.jax.explain(step) on a copy of the inputs."
    )
    return report


def guard(fun: Callable, *, keep_inputs: bool = True) -> Callable:
    """A drop-in wrapper: the same signature and outputs, plus one finiteness check of the
    outputs. When an output is NaN or Inf, the same call is replayed through gradsan's
    interpreter and ``gradsan.NonFiniteError`` (a ``FloatingPointError``) is raised; its message
    is the report and ``err.report`` the :class:`gradsan.Report`.

    On a ``jax.jit`` function the check is fused into the same compiled program. Buffer
    donation is then turned off so the inputs survive for the replay; ``keep_inputs=False``
    keeps the donation (and gives up the replay: the error then lists the bad outputs only).

    Example::

        step = gradsan.jax.guard(jax.jit(train_step))
        params, opt_state, loss = step(params, opt_state, batch)
    """
    check_callable(fun, "guard")
    fused = _fused(fun, keep_inputs)
    donating = bool(getattr(getattr(fun, "_jit_info", None), "donate_argnums", ()))

    @functools.wraps(fun)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if fused is not None:
            out, ok = fused(*args, **kwargs)
        else:
            out = fun(*args, **kwargs)
            ok = _separate_flag(out)
        if bool(ok):
            return out
        if fused is not None and donating and not keep_inputs:
            raise NonFiniteError(_summary_report(fun, out))
        trace_fun = (lambda *a, **k: fused(*a, **k)[0]) if fused is not None else None
        report = diagnose(fun, args, kwargs, who="guard", outputs=out, trace_fun=trace_fun)
        if not report.findings:
            report.notes.append(
                "the compiled function returned a non-finite value, but the replay through "
                "the interpreter stayed finite (XLA fusion can change rounding): run "
                "gradsan.jax.explain on the un-jitted function."
            )
        raise NonFiniteError(report)

    guarded.__gradsan_guarded__ = True  # type: ignore[attr-defined]
    return guarded
