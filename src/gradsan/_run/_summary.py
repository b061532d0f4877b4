"""The one line `gradsan run` and the pytest plugin end with: what was checked (functions,
calls, backward passes) and what was not (transforms and frameworks gradsan does not wrap),
so that silence means clean and "not checked" never looks like "clean"."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._hooks import Hooks

# transforms whose eager calls gradsan does not check (inside a checked jit/grad they are
# traced, so checked with it)
UNWRAPPED_JAX = ("vmap", "pmap", "jacfwd", "jacrev", "hessian", "vjp", "jvp", "linearize")
# frameworks with their own transforms, not wrapped
UNWRAPPED_FRAMEWORKS = {"haiku": "haiku", "objax": "objax", "trax": "trax"}


class Stats:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()  # label -> checked calls
        self.unchecked: Counter[str] = Counter()  # "jax.vmap" -> eager calls not checked
        self.backward = 0  # torch backward calls checked
        self.tests = 0  # pytest: tests run with checks on
        self.allowed = 0  # pytest: tests allowed NaN/Inf (not checked)
        self.failures = 0  # pytest: tests failed with a report
        self.installed_files: set[str] = set()  # pytest: test files of installed packages
        self.installed_run: set[str] = set()  # ... whose tests ran

    def line(
        self, *, where: str = "the script", finite: str = "all finite", scope: str = ""
    ) -> str:
        n_fun, n_calls = len(self.calls), sum(self.calls.values())
        parts = []
        if n_fun:
            top = ", ".join(f"{lab} x{n}" for lab, n in self.calls.most_common(3))
            more = f" and {n_fun - 3} more" if n_fun > 3 else ""
            parts.append(
                f"{n_calls} call{'s' if n_calls != 1 else ''} of {n_fun} JAX "
                f"function{'s' if n_fun != 1 else ''} ({top}{more})"
            )
        if self.backward:
            parts.append(
                f"{self.backward} PyTorch backward pass{'es' if self.backward != 1 else ''}"
            )
        checked = " and ".join(parts) if parts else "nothing"
        if not parts:
            text = (
                f"gradsan: checked nothing{scope}: {where} made no jit/grad function in "
                f"{'its' if where == 'the script' else 'their'} own code (jax, equinox, "
                "flax NNX) and ran no PyTorch backward"
            )
        else:
            text = f"gradsan: checked {checked}{scope}" + (f": {finite}" if finite else "")
        skipped = [
            f"{n} eager call{'s' if n != 1 else ''} of {t}" for t, n in self.unchecked.items()
        ]
        skipped += [
            f"{name}'s transforms (imported, not wrapped)"
            for mod, name in UNWRAPPED_FRAMEWORKS.items()
            if mod in sys.modules
        ]
        if skipped:
            text += "; not checked: " + ", ".join(skipped)
        return text + "."


def count_calls(hooks: Hooks, cls: Any) -> None:
    """Count the checked calls of ``cls`` (a Watched class) in ``hooks.stats``: its
    ``__call__`` bumps ``self._calls`` for every call it checks."""
    orig = cls.__call__

    @functools.wraps(orig)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if hooks.capture is not None:  # a reproducer's re-run: stop at the failing call
            hooks.capture(self, args, kwargs)
        n = self._calls
        try:
            return orig(self, *args, **kwargs)
        finally:
            if self._calls != n:
                hooks.stats.calls[self.label] += self._calls - n

    hooks.set(cls, "__call__", __call__)


def count_unwrapped(hooks: Hooks, jax: Any) -> None:
    """Count eager calls of the transforms gradsan does not wrap, made in the user's code."""
    from ._patch_jax import _caller_is_user, _has_tracer

    for name in UNWRAPPED_JAX:
        original = getattr(jax, name, None)
        if original is None:
            continue
        direct = name in ("vjp", "jvp", "linearize")
        hooks.set(
            jax,
            name,
            _counted(hooks, f"jax.{name}", original, direct, _caller_is_user, _has_tracer),
        )


def _counted(
    hooks: Hooks,
    label: str,
    original: Callable,
    direct: bool,
    caller_is_user: Callable,
    has_tracer: Callable,
) -> Callable:
    @functools.wraps(original)
    def made(*args: Any, **kwargs: Any) -> Any:
        if direct:  # jax.vjp(f, x): the call itself
            if hooks.enabled and caller_is_user(2) and not has_tracer((args[1:], kwargs)):
                hooks.stats.unchecked[label] += 1
            return original(*args, **kwargs)
        fn = original(*args, **kwargs)
        if not caller_is_user(2) or not callable(fn):
            return fn

        @functools.wraps(fn)
        def call(*a: Any, **k: Any) -> Any:
            if hooks.enabled and not has_tracer((a, k)):
                hooks.stats.unchecked[label] += 1
            return fn(*a, **k)

        return call

    return made
