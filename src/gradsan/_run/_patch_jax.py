"""`gradsan run`'s JAX patch: functions made by ``jax.jit``, ``jax.grad`` and
``jax.value_and_grad`` in the user's code are wrapped; each eager call is checked with
gradsan.jax.guard's machinery (one fused finiteness flag, the replay through the
interpreter), calls made while tracing pass straight through.

When a jitted step's flag is read (``GRADSAN_JAX_FLAG_READ``):

- unset (the default): at once when the step has finished by the end of its dispatch (a cheap
  CPU step: no wait), otherwise one call late, after the next call is dispatched, so that
  checking forces no sync per step. The report is still the failing call's, with its own
  inputs, but the script's own code after the failing call runs before it (one line says so);
- ``late``: every flag one call late;
- ``now``: every flag at once, right after its call: the script stops at the failing call,
  and none of its code after that call runs, at the price of one sync per call (each step
  waits for the previous one to finish, as ``jax_debug_nans`` makes it).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

from .._userfile import is_user_file
from ._failure import Failure, ordinal, say

if TYPE_CHECKING:
    from ..jax._guard import Checker
    from ._hooks import Hooks


def _caller_is_user(depth: int = 2) -> bool:
    f: FrameType | None = sys._getframe(depth)
    while f is not None and f.f_code.co_filename == __file__:  # the decorator form's lambda
        f = f.f_back
    return f is not None and is_user_file(f.f_code.co_filename)


def _has_tracer(tree: Any) -> bool:
    import jax

    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


class Watched:
    """A jitted / grad function made in the user's code, each eager call checked by
    gradsan.jax.guard's :class:`~gradsan.jax._guard.Checker`."""

    def __init__(
        self, hooks: Hooks, inner: Callable, kind: str, target: Callable, opts: dict
    ) -> None:
        self._hooks = hooks
        self._inner = inner
        self._kind = kind
        self._target = target
        self._opts = opts
        self._calls = 0
        self._checker: Checker | None = None  # built at the first eager call
        self._pending: tuple | None = None  # a call whose flag is not read yet (defer_flags)
        self._defer = False
        self._adaptive = True  # read at once a flag ready right after its dispatch
        self._reads = [0, 0]  # fused calls whose flag was read at once / one call late
        self._donating = False
        self._fast: Callable | None = None  # the fused jit, once the first eager call settled it
        self._tracer: type = type(None)
        try:
            self.__wrapped__ = getattr(inner, "__wrapped__", target)
            for a in ("__name__", "__qualname__", "__doc__", "__module__"):
                v = getattr(inner, a, None) or getattr(target, a, None)
                if v is not None:
                    object.__setattr__(self, a, v)
        except (AttributeError, TypeError):  # pragma: no cover
            pass

    def __getattr__(self, name: str) -> Any:  # .lower, .trace, .eval_shape, _jit_info, ...
        return getattr(self._inner, name)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self, obj)

    @property
    def label(self) -> str:
        name = getattr(self._target, "__qualname__", None) or getattr(self._target, "__name__", "?")
        return f"`{name}` (jax.{self._kind})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hooks = self._hooks
        fast = self._fast
        if fast is not None and hooks.enabled:  # every call after the first: the fused jit
            before = self._pending
            if before is not None and (self._donating or _ready(before[0])):
                self._pending = None  # read it now, before this call is dispatched
                if not np.asarray(before[0]):
                    self._settle(before, late="before")
            out, flag = fast(*args, **kwargs)
            if isinstance(flag, self._tracer):  # a call made while tracing passes through
                return out
            self._calls += 1
            if self._defer:  # _defer_flag, inlined: this runs at every call
                if self._adaptive and _ready(flag):
                    # done within its dispatch (XLA:CPU runs a cheap program inline): reading
                    # the flag now waits for nothing, so no snapshot is kept and a failure is
                    # reported at its own call, with the script's live inputs
                    self._reads[0] += 1
                    pending = self._pending  # the previous call's, not ready before dispatch
                    if pending is not None:
                        self._pending = None
                        if not np.asarray(pending[0]):
                            self._settle(pending, late="after")
                    if not np.asarray(flag):
                        self._fail(args, kwargs, out, fast, self._calls)
                    return out
                self._reads[1] += 1
                if self._pending is None:
                    self._pending = (flag, _snapshot(args, kwargs), out, fast, self._calls)
                    if before is None:
                        _pending_of(hooks).add(self)
                else:  # the previous call was still running: read its flag after this one's
                    self._pending = (flag, _snapshot(args, kwargs), out, fast, self._calls)
                    if not np.asarray(before[0]):  # type: ignore[index]
                        self._settle(before, late="after")  # type: ignore[arg-type]
            elif not _read(flag):
                self._fail(args, kwargs, out, fast, self._calls)
            return out
        return self._first_calls(hooks, args, kwargs)

    def _defer_flag(self, flag: Any, args: tuple, kwargs: dict, out: Any, via: Any) -> None:
        """Keep this call's flag (and a snapshot of its inputs) to be read at the next call;
        read the previous call's flag now, after this call was dispatched."""
        before, self._pending = (
            self._pending,
            (flag, _snapshot(args, kwargs), out, via, self._calls),
        )
        _pending_of(self._hooks).add(self)
        if before is not None:
            self._settle(before, late="after")

    def _settle_first(self) -> None:
        """Before a call is dispatched, read the previous call's flag when it is ready (no
        wait: the step finished while the script ran) or when the step donates its inputs
        (the call would consume the buffers, the previous outputs, that the report reads)."""
        pending = self._pending
        if pending is not None and (self._donating or _ready(pending[0])):
            self._pending = None
            self._settle(pending, late="before")

    def _first_calls(self, hooks: Hooks, args: tuple, kwargs: dict) -> Any:
        """A call before the fused program is settled (its first eager call sizes it), and
        every call when there is none (a step with too many outputs to fuse the flag)."""
        if not hooks.enabled:
            return self._inner(*args, **kwargs)
        checker = self._checker
        if checker is None:
            from ..jax._guard import Checker

            # every call through the fused jit: the function is new, so one program compiles.
            # Donation is kept (as without gradsan); a failing step whose inputs it consumed
            # is reported by its bad outputs
            checker = self._checker = Checker(self._inner, background=False, keep_inputs=False)
            # under `gradsan run` the flag is read one call late (after the next call is
            # dispatched), so checking forces no sync per step, on the CPU as on accelerators:
            # a failure names the call it belongs to and replays that call's inputs (kept one
            # call longer); the script's own code after the failing call runs as it would,
            # and the next call is not let return. A flag not read when the script ends or
            # raises is read then (run_script). A donating step's flag is read when its next
            # call comes, before that call consumes the buffers the report reads.
            # A step that is done within its own dispatch (a cheap program XLA:CPU runs
            # inline, ~10 us) has its flag read at once instead: no wait, and no snapshot
            # of its inputs (which costs more than the read on such a step). The choice is
            # made per call, by the flag's readiness right after dispatch; _reads counts
            # both. GRADSAN_JAX_FLAG_READ=late reads every flag one call late.
            # GRADSAN_JAX_FLAG_READ=now reads every flag at once (a sync per call)
            mode = _flag_read_mode()
            defer = getattr(hooks, "defer_flags", False)
            if mode == "now" or defer == "now":
                defer = False
            self._defer = bool(defer)
            self._adaptive = defer != "late" and mode != "late"
            self._donating = checker.donating
            self._tracer = _tracer_type()
        if (checker.fused is None or not checker.state.get("sized")) and _has_tracer(
            (args, kwargs)
        ):  # a call made while tracing passes straight through
            return self._inner(*args, **kwargs)
        if self._defer:
            self._settle_first()
        out, flag, via = checker.start(args, kwargs)
        if isinstance(flag, _tracer_type()):  # a call made while tracing passes through
            return out
        self._calls += 1
        if self._defer and via is not None:
            self._defer_flag(flag, args, kwargs, out, via)
            ok = True
        else:
            if self._pending is not None:  # the previous call's (a step not fused from now on)
                pending, self._pending = self._pending, None
                self._settle(pending, late="after")
            ok = _decided()(flag)
        if hooks.sanitize and id(self) not in hooks.sanitized:
            hooks.sanitized.add(id(self))
            _sanitize_jax(hooks, self, args, kwargs)
        if not ok:
            self._fail(args, kwargs, out, via, self._calls)
        state = checker.state
        if checker.fused is not None and via is checker.fused and state.get("sized"):
            self._fast = checker.fused  # settled: later calls take the short path above
        return out

    def _settle(self, pending: tuple, late: str | None = None) -> None:
        """Read a deferred flag; report its call (with that call's inputs) when it was not
        finite. ``late``: read at the next call, "before" or "after" it was dispatched (it is
        not let run, or not let return), not at the end of the script."""
        flag, (leaves, tree), out, via, call = pending
        if not _read(flag):
            args, kwargs = _restore(leaves, tree)
            self._fail(args, kwargs, out, via, call, late=late)

    def flush(self) -> None:
        """Read the flag of the last call (the end of a script)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._settle(pending, late="end")

    def _fail(
        self, args: tuple, kwargs: dict, out: Any, via: Any, call: int, late: str | None = None
    ) -> None:
        if late == "end":
            say(
                f"the flag of the {ordinal(call)} call of {self.label} is read at the end of the "
                f"script (that call was still running when it returned): the script's own code "
                f"after the {ordinal(call)} call ran as it does without gradsan{_NOW}."
            )
        elif late:
            nxt = ordinal(call + 1)
            when = (
                f"before it was dispatched: the {nxt} call does not run"
                if late == "before"
                else f"after it was dispatched (the {ordinal(call)} call was still running): "
                f"the {nxt} call does not return (its result is not used)"
            )
            say(
                f"the flag of the {ordinal(call)} call of {self.label} is read one call late: "
                f"at the {nxt} call, {when}. The script's own code after the {ordinal(call)} "
                f"call ran as it does without gradsan{_NOW}."
            )
        report = self._replay(args, kwargs, out, via, call)
        __tracebackhide__ = True
        self._hooks.on_failure(
            Failure(
                backend="jax",
                report=report,
                call=call,
                label=self.label,
                fun=self._inner,
                args=args,
                kwargs=kwargs,
                kind=self._kind,
                target=self._target,
                opts=self._opts,
            )
        )

    def _replay(self, args: tuple, kwargs: dict, out: Any, via: Callable | None, call: int) -> Any:
        assert self._checker is not None
        n_eqns = _count_eqns(self._inner, args, kwargs)
        size = f" ({n_eqns} equations)" if n_eqns else ""
        say(
            f"the {ordinal(call)} call of {self.label} returned NaN/Inf; "
            f"replaying it through the interpreter{size}..."
        )
        t0 = time.perf_counter()
        report = self._checker.report(args, kwargs, out, via)
        say(f"replay done in {time.perf_counter() - t0:.1f} s.")
        return report


_NOW = " (set GRADSAN_JAX_FLAG_READ=now to stop at the failing call)"
_MODES = ("", "late", "now")
_WARNED: list = []


def _flag_read_mode() -> str:
    """``GRADSAN_JAX_FLAG_READ`` ("", "late" or "now"); another value is said once and
    ignored (the default read)."""
    mode = os.environ.get("GRADSAN_JAX_FLAG_READ", "").strip().lower()
    if mode in _MODES:
        return mode
    if not _WARNED:
        _WARNED.append(mode)
        say(
            f"GRADSAN_JAX_FLAG_READ={mode!r} is not 'now' or 'late': ignored (flags are read "
            "at once when ready, else one call late)."
        )
    return ""


_DECIDED: list = []


def _decided() -> Callable[[Any], bool]:
    """gradsan.jax._guard.decided, imported once (an import per call costs microseconds)."""
    if not _DECIDED:
        from ..jax._guard import decided

        _DECIDED.append(decided)
    return _DECIDED[0]


def _read(flag: Any) -> bool:
    """The host value of a fused program's flag (a device array; waits for it). numpy's
    read of a ready scalar costs half of ``Array.item()``'s checks."""
    return bool(np.asarray(flag))


def _ready(flag: Any) -> bool:
    """Whether a dispatched flag is computed (reading it would not wait); a flag already
    read (the first call's, a bool) is."""
    return type(flag) is bool or flag.is_ready()


def _snapshot(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """The call's inputs as they were (leaves and structure), kept until its flag is read:
    a container or numpy buffer the script changes before the next call does not change the
    inputs the report replays (jax arrays are immutable; numpy arrays are copied)."""
    if not _FLATTEN:
        import jax

        _FLATTEN.append(jax.tree_util.tree_flatten)
    leaves, tree = _FLATTEN[0]((args, kwargs))
    if np.ndarray in map(type, leaves):  # (a C loop: this runs at every call)
        leaves = [x.copy() if type(x) is np.ndarray else x for x in leaves]
    return leaves, tree


_FLATTEN: list = []


def _restore(leaves: list, tree: Any) -> tuple[tuple, dict]:
    import jax

    args, kwargs = jax.tree_util.tree_unflatten(tree, leaves)
    return args, kwargs


def _tracer_type() -> type:
    import jax

    return jax.core.Tracer


def _pending_of(hooks: Hooks) -> set:
    """The watched functions with a flag not read yet (``flush_pending`` reads them)."""
    got = getattr(hooks, "_jax_pending", None)
    if got is None:
        got = set()
        hooks._jax_pending = got  # type: ignore[attr-defined]
    return got


def flush_pending(hooks: Hooks) -> None:
    """Read every deferred flag (the script ended): its failure is reported as any other."""
    for w in list(_pending_of(hooks)):
        _pending_of(hooks).discard(w)
        w.flush()


def _count_eqns(fun: Callable, args: tuple, kwargs: dict) -> int:
    """The size of the program to replay, for the progress line (0 if unknown)."""
    try:
        import jax

        closed = jax.make_jaxpr(lambda *a, **k: fun(*a, **k))(*args, **kwargs)
    except Exception:
        return 0

    def count(jaxpr: Any) -> int:
        n = 0
        for e in jaxpr.eqns:
            n += 1
            for p in e.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    inner = getattr(sub, "jaxpr", None)
                    if inner is not None and hasattr(inner, "eqns"):
                        n += count(inner)
                    elif hasattr(sub, "eqns"):
                        n += count(sub)
        return n

    return count(closed.jaxpr)


def _sanitize_jax(hooks: Hooks, g: Watched, args: tuple, kwargs: dict) -> None:
    import gradsan.jax as gsj

    sanitize = getattr(gsj, "sanitize", None)
    if sanitize is None:
        say("--sanitize: gradsan.jax.sanitize is not available in this version; skipped.")
        return
    try:
        report = sanitize(g._inner)(*args, **kwargs)
    except Exception as e:  # never let the optional kink scan break the run
        say(f"--sanitize: could not scan {g.label} ({type(e).__name__}: {e}).")
        return
    report.findings = [f for f in report.findings if f.kind in ("kink", "convention")]
    if hooks.on_kinks is not None:
        hooks.on_kinks(report, f"first call of {g.label}")


def patch_jax(hooks: Hooks, jax: Any) -> None:
    """Wrap ``jax.jit``, ``jax.grad`` and ``jax.value_and_grad`` (undone by hooks.uninstall)."""
    orig = {n: getattr(jax, n) for n in ("jit", "grad", "value_and_grad")}

    def make(name: str) -> Callable:
        original = orig[name]

        @functools.wraps(original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            if not args and "fun" not in kwargs:  # @jax.jit(static_argnums=...) as a decorator
                return lambda f: patched(f, **kwargs)
            inner = original(*args, **kwargs)
            if not _caller_is_user(2):
                return inner
            target: Any = args[0] if args else kwargs.get("fun")
            if isinstance(target, Watched):  # jax.jit(jax.grad(f)): check the outer one
                target = target._inner
            opts = {k: v for k, v in kwargs.items() if _jsonable(v)}
            return Watched(hooks, inner, name, target, opts)

        return patched

    for n in orig:
        hooks.set(jax, n, make(n))


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False
