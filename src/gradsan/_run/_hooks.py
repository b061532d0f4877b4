"""The import hook that patches jax and torch after their first import, and the check
session around a script: shared by `gradsan run`, its replays and the pytest plugin.

The patches themselves are in _patch_jax.py and _patch_torch.py; ``on_failure(failure)``
decides what the first failure does (`gradsan run` stops the script, the plugin raises
NonFiniteError).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

from ._failure import EXIT_NONFINITE, Failure, Stop
from ._summary import Stats

# the modules patched right after their first import
PATCHED = ("jax", "torch", "equinox", "flax.nnx")


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, after: Callable[[Any], None]) -> None:
        self.loader = loader
        self.after = after

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.after(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches jax / torch right after their first import, only if something imports them."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in PATCHED or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self.hooks.patch)
        return spec


class Hooks:
    """Installs the patches; ``on_failure(failure)`` decides what the first failure does
    (``gradsan run`` stops the script, the pytest plugin raises NonFiniteError)."""

    def __init__(
        self,
        on_failure: Callable[[Failure], None],
        *,
        trace_from: int | None = None,
        replay_step: int | None = None,
        sanitize: bool = False,
        on_kinks: Callable[[Any, str], None] | None = None,
    ) -> None:
        self.on_failure = on_failure
        self.enabled = True
        self.trace_from = trace_from  # torch: trace backward calls >= this one
        self.replay_step = replay_step  # torch: no checks before this call; stop after it
        self.sanitize = sanitize
        self.on_kinks = on_kinks
        self.finder = _Finder(self)
        self.undo: list[Callable[[], None]] = []
        self.patched: set[str] = set()
        self.torch_calls = 0
        self.in_backward = False
        self.session: Any = None
        self.sanitized: set[int] = set()
        self.stats = Stats()
        self.capture: Callable[[Any, tuple, dict], None] | None = None  # reproducer re-runs

    def install(self) -> Hooks:
        sys.meta_path.insert(0, self.finder)
        for name in PATCHED:
            if name in sys.modules:
                self.patch(sys.modules[name])
        return self

    def uninstall(self) -> None:
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        self.end_session()
        while self.undo:
            self.undo.pop()()
        self.patched.clear()

    def patch(self, module: Any) -> None:
        name = module.__name__
        if name in self.patched:
            return
        self.patched.add(name)
        if name == "jax":
            from ._patch_jax import Watched, patch_jax
            from ._summary import count_calls, count_unwrapped

            patch_jax(self, module)
            count_calls(self, Watched)
            count_unwrapped(self, module)
        elif name in ("equinox", "flax.nnx"):
            from ._patch_frameworks import FrameworkWatched, patch_equinox, patch_nnx
            from ._summary import count_calls

            (patch_equinox if name == "equinox" else patch_nnx)(self, module)
            if "FrameworkWatched" not in self.patched:
                self.patched.add("FrameworkWatched")
                count_calls(self, FrameworkWatched)
        elif name == "torch":
            from ._patch_torch import patch_torch

            patch_torch(self, module)

    def set(self, obj: Any, attr: str, value: Any) -> None:
        """``setattr(obj, attr, value)``, undone by ``uninstall``."""
        old = getattr(obj, attr)
        setattr(obj, attr, value)
        self.undo.append(lambda: setattr(obj, attr, old))

    def annotate_failures(self, annotate: Callable[[Failure], None]) -> None:
        """Run ``annotate(failure)`` (it adds notes to the failure's report) before the failure
        goes on to what ``on_failure`` did so far; undone by ``uninstall``."""
        on_failure = self.on_failure

        def annotated(f: Failure) -> None:
            __tracebackhide__ = True
            annotate(f)
            on_failure(f)

        self.set(self, "on_failure", annotated)

    def begin_test(self) -> None:
        """Check from now on, counting backward calls from 1 (the pytest plugin: a test starts)."""
        self.enabled = True
        self.torch_calls = 0
        self.stats.tests += 1
        self.begin_session(1)

    def end_test(self) -> None:
        """Stop checking (a test ended)."""
        self.enabled = False
        self.stats.backward += self.torch_calls
        self.torch_calls = 0
        self.end_session()

    # -- torch tracing sessions (--trace, replays, --sanitize's first step) ---------------------
    def _wants_trace(self, call: int) -> bool:
        if self.sanitize and call == 1:
            return True
        return self.trace_from is not None and call >= self.trace_from

    def begin_session(self, call: int) -> None:
        """Start tracing before backward call ``call`` when it is to be traced."""
        if self.session is not None or not self._wants_trace(call):
            return
        import gradsan.torch as gst

        kinks = self.sanitize and call == 1
        self.session = (gst.sanitize if kinks else gst.explain)()
        self.session.__enter__()

    def end_session(self) -> Any:
        """Stop tracing; the session that was open (None if none)."""
        s, self.session = self.session, None
        if s is not None and s.tracer is not None:
            s.tracer.__exit__(None, None, None)
        return s


def _flush_jax(hooks: Hooks) -> None:
    from ._patch_jax import flush_pending

    flush_pending(hooks)


def run_script(script: str, argv: list[str], hooks: Hooks) -> tuple[int, Failure | None]:
    """Run ``script`` as ``__main__`` under ``hooks``: its exit status, and the failure that
    stopped it (None if none)."""
    old_argv, old_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    hooks.install()
    hooks.defer_flags = True  # type: ignore[attr-defined]  # jax flags: at once if ready, else one call late
    code = 0
    failure = None
    try:
        try:
            runpy.run_path(os.path.abspath(script), run_name="__main__")  # one path style
        except BaseException as e:  # a step's flag not read yet comes first (raises Stop)
            if not isinstance(e, Stop):
                _flush_jax(hooks)
            raise
        _flush_jax(hooks)  # the last call's flag
    except Stop as s:
        failure = s.failure
        code = EXIT_NONFINITE if failure is not None else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except Exception as e:  # the script's error (or gradsan's own): Python's way, less our frames
        from ._traceback import report_script_error

        code = report_script_error(e)
    finally:
        hooks.uninstall()
        sys.argv = old_argv
        if sys.path and old_path0 is not None and sys.path[0] != old_path0:
            sys.path.pop(0)
    return code, failure
