"""gradsan.jax.guard: the same function, plus one finiteness flag of its outputs; on failure,
replay the interpreter on the same inputs and raise NonFiniteError with the report.

For a jitted function the flag is computed inside the same compiled program (one fused
reduction over the outputs), so a healthy step pays almost nothing. Donation is dropped from
that program so the inputs survive for the replay (``keep_inputs=False`` keeps it).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import NonFiniteError
from .._report import OutputHit, Report
from ._call import check_callable
from ._explain import diagnose


def _flag(out: Any) -> jax.Array:
    """True when every float leaf of ``out`` is finite.

    x * 0 is exactly 0 for finite x and NaN for inf or NaN, so a sum of such terms decides it
    with no overflow false alarm. One reduction per leaf lets XLA fuse each into the
    computation that produces the leaf, so no extra pass over memory is made.
    """
    total = None
    for x in jax.tree_util.tree_leaves(out):
        if not (hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)):
            continue
        for part in (jnp.real(x), jnp.imag(x)) if jnp.iscomplexobj(x) else (x,):
            term = jnp.sum(part * 0, dtype=jnp.float32)
            total = term if total is None else total + term
    return jnp.array(True) if total is None else jnp.isfinite(total)


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


def _host_flag(out: Any) -> bool:
    """The same check without compiling anything: numpy on host-resident (CPU) outputs, one
    small jitted reduction otherwise. Used until the fused program is compiled."""
    leaves = [
        x
        for x in jax.tree_util.tree_leaves(out)
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    if all(
        isinstance(x, jax.Array) and all(d.platform == "cpu" for d in x.devices()) for x in leaves
    ):
        return all(bool(np.isfinite(np.asarray(x)).all()) for x in leaves)
    return bool(_separate_flag(out))


def _abstract(tree: Any) -> Any:
    def spec(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=x.sharding, weak_type=getattr(x, "weak_type", False)
            )
        return x

    return jax.tree_util.tree_map(spec, tree)


def guard(fun: Callable, *, keep_inputs: bool = True) -> Callable:
    """A drop-in wrapper: the same signature and outputs, plus one finiteness check of the
    outputs. When an output is NaN or Inf, the same call is replayed through gradsan's
    interpreter and ``gradsan.NonFiniteError`` (a ``FloatingPointError``) is raised; its message
    is the report and ``err.report`` the :class:`gradsan.Report`.

    On a ``jax.jit`` function the check is fused into the same compiled program. That program
    is compiled in a background thread after the first call, which runs the function as it is
    and checks its outputs on the host: a NaN at the first step is reported with no extra
    compilation. Buffer donation is turned off so the inputs survive for the replay;
    ``keep_inputs=False`` keeps the donation (and gives up the replay: the error then lists
    the bad outputs only).

    Example::

        step = gradsan.jax.guard(jax.jit(train_step))
        params, opt_state, loss = step(params, opt_state, batch)
    """
    check_callable(fun, "guard")
    fused = _fused(fun, keep_inputs)
    info = getattr(fun, "_jit_info", None)
    donating = bool(getattr(info, "donate_argnums", ()))
    static = bool(getattr(info, "static_argnums", ()) or getattr(info, "static_argnames", ()))
    # until the fused program is ready: the function itself, without donation if needed
    plain = fun
    if fused is not None and donating and keep_inputs:
        plain = jax.jit(
            fun.__wrapped__,
            static_argnums=info.static_argnums,
            static_argnames=info.static_argnames,
            keep_unused=info.keep_unused,
        )
    state: dict[str, Any] = {"compiled": None, "thread": None, "use_jit": static}

    def compile_in_background(args: tuple, kwargs: dict) -> None:
        def work() -> None:
            try:
                state["compiled"] = fused.lower(*args, **kwargs).compile()
            except Exception:  # pragma: no cover - AOT unsupported here: use the jit path
                state["use_jit"] = True

        t = threading.Thread(target=work, name="gradsan-guard-compile", daemon=True)
        state["thread"] = t
        t.start()

    def run(args: tuple, kwargs: dict) -> tuple[Any, bool, Callable | None]:
        if fused is None:
            out = fun(*args, **kwargs)
            return out, bool(_separate_flag(out)), None
        compiled = state["compiled"]
        if compiled is not None and not state["use_jit"]:
            try:
                out, ok = compiled(*args, **kwargs)
                return out, bool(ok), fused
            except (TypeError, ValueError):  # other shapes: jit compiles per signature
                state["use_jit"] = True
        if state["use_jit"]:
            out, ok = fused(*args, **kwargs)
            return out, bool(ok), fused
        out = plain(*args, **kwargs)
        if state["thread"] is None:
            compile_in_background(_abstract(args), _abstract(kwargs))
        return out, _host_flag(out), None

    @functools.wraps(fun)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        out, ok, via = run(args, kwargs)
        if ok:
            return out
        if donating and not keep_inputs:
            raise NonFiniteError(_summary_report(fun, out))
        if via is not None:
            trace_fun = lambda *a, **k: via(*a, **k)[0]  # noqa: E731
        else:
            trace_fun = plain if plain is not fun else None
        report = diagnose(fun, args, kwargs, who="guard", outputs=out, trace_fun=trace_fun)
        if not report.findings:
            report.notes.append(
                "the compiled function returned a non-finite value, but the replay through "
                "the interpreter stayed finite (XLA fusion can change rounding): run "
                "gradsan.jax.explain on the un-jitted function."
            )
        raise NonFiniteError(report)

    guarded.__gradsan_guarded__ = True  # type: ignore[attr-defined]
    guarded._gradsan_state = state  # type: ignore[attr-defined]
    return guarded
