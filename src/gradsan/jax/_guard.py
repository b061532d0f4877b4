"""gradsan.jax.guard: the same function, plus one finiteness flag of its outputs; on failure,
replay the interpreter on the same inputs and raise NonFiniteError with the report.

For a jitted function the flag is computed inside the same compiled program (one fused
reduction over the outputs), so a healthy step pays almost nothing. Donation is dropped from
that program so the inputs survive for the replay, and guard says so in one log line
(``keep_inputs=False`` keeps it: JAX donates as without gradsan, and a failing step whose
inputs were consumed is reported by its bad outputs).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import NonFiniteError, UsageError
from .._report import OutputHit, Report
from . import _evalcache, _frameworks
from ._call import check_callable
from ._explain import diagnose
from ._flags import (
    FUSE_LIMIT,
    _inexact,
    float_leaves,
)
from ._forward import (
    computed_flag,
    dynamic_labels,
    forwarded_note,
    forwarded_outputs,
    host_computed_flag,
    leave_out_forwarded,
)

_INSIDE = (
    "gradsan.jax.guard was called inside a JAX transformation (jit, vmap, grad, scan ...) or "
    "on a function closing over a value traced by one: its outputs are tracers, so there is "
    "no value to check. Guard the transformed function from outside: "
    "gradsan.jax.guard(jax.jit(step))(params, batch)"
)


def decided(ok: Any) -> bool:
    """The host value of a flag returned by :meth:`Checker.start` (waits for it)."""
    return _decided(ok)


def _decided(ok: Any) -> bool:
    """The host value of a flag; a clear error when it is a tracer (guard inside a trace)."""
    if isinstance(ok, jax.core.Tracer):
        raise UsageError(_INSIDE)
    if isinstance(ok, jax.Array):
        return bool(np.asarray(ok))  # numpy's read: a few us less than ok.item()
    return bool(ok)


def _identity(inner: Callable) -> tuple[tuple, tuple] | None:
    """(key, objects) naming what ``inner`` computes: its code, the objects its closure cells
    hold, its globals and defaults. Two functions with the same identity compute the same
    thing (a ``jax.jit(f)`` re-created per call, a lambda re-made in a loop over the same
    values); the objects are kept beside the key, so an id is never reused while cached."""
    code = getattr(inner, "__code__", None)
    if code is None:
        return ("obj", id(inner)), (inner,)
    try:
        cells = tuple(c.cell_contents for c in (inner.__closure__ or ()))
    except ValueError:  # an empty cell
        return None
    objs = (*cells, inner.__globals__, inner.__defaults__, inner.__kwdefaults__)
    objs += (getattr(inner, "__self__", None),)  # a bound method: its object (opt.update)
    return (code, tuple(id(o) for o in objs)), objs


_FUSED: collections.OrderedDict = collections.OrderedDict()
_FUSED_MAX = 256


def _fused(fun: Callable, keep_inputs: bool) -> Callable | None:
    """The jitted ``fun`` recompiled to also return the flag, with the same static and
    donation options; None when ``fun`` is not a plain ``jax.jit`` function. One fused
    program per (function identity, options): a jit re-created per call reuses it, and with
    it jax's cache of its traces and compiled executables."""
    info = getattr(fun, "_jit_info", None)
    inner = getattr(fun, "__wrapped__", None)
    if info is None or inner is None or getattr(info, "user_specified_in_shardings", False):
        return None
    if not hasattr(fun, "lower"):  # jax.grad(jax.jit(f)) copies _jit_info and __wrapped__ = f
        return None
    opts: dict[str, Any] = {
        "static_argnums": info.static_argnums,
        "static_argnames": info.static_argnames,
        "keep_unused": info.keep_unused,
    }
    if not keep_inputs:
        opts["donate_argnums"] = info.donate_argnums
        opts["donate_argnames"] = info.donate_argnames
    ident = _identity(inner)
    key = None
    if ident is not None:
        key = (ident[0], tuple(sorted((k, repr(v)) for k, v in opts.items())))
        hit = _FUSED.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[1], ident[1])):
            _FUSED.move_to_end(key)
            return hit[0]

    def with_flag(*args: Any, **kwargs: Any):
        # the jitted ``fun`` itself, not its Python function: its trace (cached by jax, also
        # from :meth:`Checker._too_many`'s abstract evaluation) becomes one call in this
        # program, so the step is traced once (a 1000-layer network: seconds), and XLA inlines
        # it; a nested jit's donation is ignored (jax donates only at the outermost call)
        out = fun(*args, **kwargs)
        return out, computed_flag(fun, args, kwargs, out)  # outputs passed through: left out

    try:
        fused = jax.jit(functools.wraps(inner)(with_flag), **opts)
    except Exception:  # pragma: no cover - unusual jit options: fall back to a separate check
        return None
    fused._gradsan_step = fun  # type: ignore[attr-defined]  # whose trace the fused one reuses
    if key is not None and ident is not None:
        _FUSED[key] = (fused, ident[1])
        if len(_FUSED) > _FUSED_MAX:
            _FUSED.popitem(last=False)
    return fused


def _bad_outputs(fun: Callable, out: Any, fwd: dict | None = None, ins: Any = None) -> Report:
    """A report that lists the non-finite outputs only (no replay); the outputs in ``fwd``
    (returned unchanged from the inputs, see :func:`forwarded_outputs`) are named apart, in
    one note, with ``ins`` the input leaves' names."""
    report = Report(outputs=out, function=getattr(fun, "__name__", "function"), backend="jax")
    fwd = fwd or {}
    bad = []
    for i, (path, x) in enumerate(jax.tree_util.tree_flatten_with_path(out)[0]):
        if i in fwd or not (_inexact(x) and bool((~jnp.isfinite(x)).any())):
            continue
        name = jax.tree_util.keystr(path) or "output"
        bad.append(str(OutputHit(name, int((~jnp.isfinite(x)).sum()), int(x.size))))
    report.notes.append("non-finite outputs: " + ", ".join(bad) + ".")
    if fwd:
        report.notes.append(forwarded_note(fwd, ins or []))
    return report


def _summary_report(fun: Callable, out: Any, fwd: dict | None = None, ins: Any = None) -> Report:
    report = _bad_outputs(fun, out, fwd, ins)
    report.notes[0] = report.notes[0][:-1] + (
        ". The inputs were donated to the step, so "
        "they could not be replayed: use gradsan.jax.guard(step) without keep_inputs=False, or "
        "run gradsan.jax.explain(step) on a copy of the inputs."
    )
    return report


APPROX_AFTER = 500
"""A replay that has dispatched this many equations to XLA one at a time evaluates the rest
of its float matmuls, tanh, sums ... with numpy (``_evalcache.approximate``): a 1000-layer
network's replay makes thousands of such dispatches, each 0.1-2 ms on a loaded CPU."""


def _failure_counts(out: Any) -> list[tuple[int, int]]:
    """(NaN count, Inf count) of each non-finite float leaf of ``out``, sorted."""
    got = []
    for x in float_leaves(out):
        a = np.asarray(x)  # the step's outputs, read on the host once each (no dispatch)
        nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
        if nan or inf:
            got.append((nan, inf))
    return sorted(got)


def _replayed_counts(report: Report) -> list[tuple[int, int]]:
    hits = {h.path: (h.nan, h.inf) for f in report.findings for h in f.outputs}
    return sorted(hits.values())


def _replay(fun: Callable, args: tuple, kwargs: dict, out: Any, trace_fun: Any) -> Report:
    """The interpreter's report of the failed call. A large program (past ``APPROX_AFTER``
    XLA dispatches) is replayed with numpy's float twins; that replay is kept only when it
    reproduced the step's non-finite outputs leaf for leaf (how many NaN, how many Inf), and
    says so in one line; otherwise the call is replayed again exactly."""
    with _evalcache.approximate(APPROX_AFTER) as state:
        report = diagnose(fun, args, kwargs, who="guard", outputs=out, trace_fun=trace_fun)
    if not state.approximated:
        return report
    if report.findings and _replayed_counts(report) == _failure_counts(out):
        report.notes.append(
            f"replayed with numpy for {state.approximated} of its float equations (matmuls, "
            f"tanh, sums ... after the first {state.dispatched} XLA evaluated one at a time): "
            "values can differ from XLA's in the last bits; the replay's NaN and Inf outputs "
            "are the step's, leaf for leaf."
        )
        return report
    return diagnose(fun, args, kwargs, who="guard", outputs=out, trace_fun=trace_fun)


def _abstract(tree: Any) -> Any:
    def spec(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=x.sharding, weak_type=getattr(x, "weak_type", False)
            )
        return x

    return jax.tree_util.tree_map(spec, tree)


class Checker:
    """``fun``'s calls with one finiteness flag of their outputs, and the report of a call that
    failed: guard's machinery, also used by `gradsan run` for the user's jit/grad functions.

    ``run(args, kwargs)`` returns ``(out, ok, via)``; ``via`` is the fused program that computed
    ``out`` (None when ``fun`` itself did). With ``background=True`` (guard) the first call runs
    ``fun`` as it is, checks on the host and compiles the fused program in a background thread;
    with ``background=False`` every call goes through the fused ``jit`` (`gradsan run`, whose
    functions are new, so that compiles one program, not two).
    """

    def __init__(self, fun: Callable, *, keep_inputs: bool = True, background: bool = True):
        self.fun = fun
        self.keep_inputs = keep_inputs
        self.fused = fused = _fused(fun, keep_inputs)
        info = getattr(fun, "_jit_info", None)
        self.donating = bool(getattr(info, "donate_argnums", ()))
        static = bool(getattr(info, "static_argnums", ()) or getattr(info, "static_argnames", ()))
        # until the fused program is ready: the function itself, without donation if needed
        self.plain = fun
        if background and fused is not None and self.donating and keep_inputs:
            self.plain = jax.jit(
                fun.__wrapped__,  # type: ignore[attr-defined]
                static_argnums=info.static_argnums,  # type: ignore[union-attr]
                static_argnames=info.static_argnames,  # type: ignore[union-attr]
                keep_unused=info.keep_unused,  # type: ignore[union-attr]
            )
        self.state: dict[str, Any] = {
            "compiled": None,
            "thread": None,
            # donating with keep_inputs=False: every call through the fused jit, so one
            # program donates and warns as jax does (not the step, then a background compile
            # warning again from its thread)
            "use_jit": static or not background or (self.donating and not keep_inputs),
        }

    def _compile_in_background(self, args: tuple, kwargs: dict) -> None:
        state, fused = self.state, self.fused
        assert fused is not None

        def work() -> None:
            try:
                state["compiled"] = fused.lower(*args, **kwargs).compile()  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover - AOT unsupported here: use the jit path
                state["use_jit"] = True

        t = threading.Thread(target=work, name="gradsan-guard-compile", daemon=True)
        state["thread"] = t
        t.start()

    def _too_many(self, args: tuple, kwargs: dict) -> bool:
        """Whether the step has more float outputs than a fused flag compiles well with (read
        from the step's abstract evaluation, whose trace the fused program's call reuses)."""
        try:
            # the step's own trace (cached by jax): the call that follows, fused or not,
            # reuses it, and a jit re-created per call pays none
            step: Any = getattr(self.fused, "_gradsan_step", self.fun)
            shape = step.eval_shape(*args, **kwargs)
        except Exception:  # arguments it cannot take abstractly: fuse as before
            return False
        return len(float_leaves(shape)) > FUSE_LIMIT

    def start(self, args: tuple, kwargs: dict) -> tuple[Any, Any, Callable | None]:
        """Like :meth:`run`, without waiting for the flag: ``(out, flag, via)`` where ``flag``
        is a device array still being computed (read it with :func:`decided`) when the fused
        program ran, else the bool :meth:`run` returns. The call is dispatched as JAX would
        dispatch it, asynchronously."""
        fused, state = self.fused, self.state
        if fused is not None and state["use_jit"] and state.get("sized"):
            out, ok = fused(*args, **kwargs)
            return out, ok, fused  # a tracer flag: called inside a trace (the caller decides)
        return self.run(args, kwargs)

    def run(self, args: tuple, kwargs: dict) -> tuple[Any, bool, Callable | None]:
        fused, state = self.fused, self.state
        if fused is not None and state["use_jit"] and not state.get("sized"):
            state["sized"] = True
            if self._too_many(args, kwargs):
                self.fused = fused = None
        if fused is None:
            out = self.fun(*args, **kwargs)
            if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out)):
                raise UsageError(_INSIDE)
            return out, host_computed_flag(self.fun, args, kwargs, out), None
        compiled = state["compiled"]
        if compiled is not None and not state["use_jit"]:
            try:
                out, ok = compiled(*args, **kwargs)
                return out, _decided(ok), fused
            except (TypeError, ValueError):  # other shapes: jit compiles per signature
                state["use_jit"] = True
        if state["use_jit"]:
            out, ok = fused(*args, **kwargs)
            return out, _decided(ok), fused
        out = self.plain(*args, **kwargs)
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out)):
            raise UsageError(_INSIDE)
        if state["thread"] is None and len(float_leaves(out)) > FUSE_LIMIT:
            state["sized"] = True  # too many outputs to fuse the flag: the step as it is
            self.fused = None
            return out, host_computed_flag(self.fun, args, kwargs, out), None
        if state["thread"] is None:
            self._compile_in_background(_abstract(args), _abstract(kwargs))
        return out, host_computed_flag(self.fun, args, kwargs, out), None

    def donation_note(self) -> str | None:
        """One line saying what happened to ``fun``'s buffer donation under this checker."""
        if not self.donating:
            return None
        info = getattr(self.fun, "_jit_info", None)
        nums = tuple(getattr(info, "donate_argnums", ()))
        name = getattr(self.fun, "__name__", "function")
        if self.keep_inputs:
            return (
                f"gradsan.jax.guard: `{name}` donates arguments {nums}; guard turned the "
                "donation off so that a failing step's inputs survive for the replay "
                "(guard(step, keep_inputs=False) keeps it and lists the bad outputs only)."
            )
        return None

    def report(self, args: tuple, kwargs: dict, out: Any, via: Callable | None) -> Report:
        """Replay the failed call through the interpreter: the report of where it went
        non-finite. Inputs consumed by buffer donation cannot be replayed: then the report
        lists the bad outputs and says why."""
        # outputs returned unchanged from the inputs: not the call's findings (a donated input
        # cannot be compared with a cond's output: only those always passed through count)
        fwd = forwarded_outputs(self.fun, args, kwargs, out)
        ins = dynamic_labels(self.fun, args, kwargs)
        if self.donating and any(
            isinstance(x, jax.Array) and x.is_deleted()
            for x in jax.tree_util.tree_leaves((args, kwargs))
        ):
            return _summary_report(self.fun, out, fwd, ins)
        trace_fun: Callable | None
        if via is not None:
            trace_fun = lambda *a, **k: via(*a, **k)[0]  # noqa: E731
        else:
            trace_fun = self.plain if self.plain is not self.fun else None
        try:
            report = _replay(self.fun, args, kwargs, out, trace_fun)
        except UsageError as e:  # a function the replay cannot trace: say why, keep the error
            report = _bad_outputs(self.fun, out, fwd, ins)
            report.notes.append(f"the call could not be replayed: {e}")
            return report
        report = leave_out_forwarded(report, self.fun, args, kwargs, out, fwd)
        if not report.findings:
            report.notes.append(
                "the compiled function returned a non-finite value, but the replay through "
                "the interpreter stayed finite (XLA fusion can change rounding): run "
                "gradsan.jax.explain on the un-jitted function."
            )
        return report


def _guarded_nnx(
    checker: Checker, note: str | None, objs: list[Any], args: tuple, kwargs: dict
) -> Any:
    """A call given flax NNX modules or optimizers: what it returns and the state it wrote
    into them are checked. On failure the objects get back their state from before the call
    (the update is undone), and the call is replayed from there, its in-place update checked
    as an output (``model.lin.kernel.value (after the call)``)."""
    before = _frameworks.nnx_states(objs)
    out, ok, via = checker.run(args, kwargs)
    if ok and _frameworks.nnx_finite(objs):
        return out
    _frameworks.nnx_restore(objs, before)
    try:
        report = diagnose(checker.fun, args, kwargs, who="guard", trace_fun=None)
    except UsageError as e:
        report = checker.report(args, kwargs, out, via)
        report.notes.append(f"the call could not be replayed with its NNX state: {e}")
    _frameworks.nnx_restore(objs, before)  # (whatever the replay did to them)
    names = ", ".join(f"`{type(o).__name__}`" for o in objs)
    report.notes.append(
        f"the call's in-place update of its NNX objects ({names}) was undone: they hold their "
        "state from before the call"
    )
    if note is not None:
        report.notes.append(note)
    raise NonFiniteError(report)


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
    checker = Checker(fun, keep_inputs=keep_inputs)
    run = checker.run
    note = checker.donation_note()
    if note is not None:  # never dropped silently: one line, once per guarded function
        logging.getLogger("gradsan").warning(note)

    @functools.wraps(fun)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        objs = _frameworks.nnx_objects(args, kwargs)
        if objs:  # NNX updates these in place: their state is an output of the call too
            return _guarded_nnx(checker, note, objs, args, kwargs)
        out, ok, via = run(args, kwargs)
        if ok:
            return out
        report = checker.report(args, kwargs, out, via)
        if note is not None:
            report.notes.append(note)
        raise NonFiniteError(report)

    guarded.__gradsan_guarded__ = True  # type: ignore[attr-defined]
    guarded._gradsan_state = checker.state  # type: ignore[attr-defined]
    return guarded
