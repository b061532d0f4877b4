"""pytest plugin (entry point pytest11). Loading it imports no backend.

``pytest --gradsan`` fails every test whose JAX ``jit``/``grad``/``value_and_grad`` outputs or
PyTorch ``.backward()`` gradients go NaN/Inf, with gradsan's report as a ``gradsan`` section of
the failure (printed once, naming the way to allow it). The patches are installed lazily (an
import hook), so jax and torch are imported only if the tests import them. A test that means
its NaN/Inf is exempted by ``@pytest.mark.gradsan_allow_nonfinite`` (above or below absl's
``@parameterized`` decorators) or from the command line by ``--gradsan-allow=EXPR`` (a node
id or its tail, or a ``-k`` style keyword expression whose numbers match whole; the option may
be repeated). The session ends with
one line of what was checked. Test files collected from installed packages (``--pyargs``)
count as the user's code, so their own jit/grad functions are checked (not the package's).

The ``gradsan_check`` fixture works without ``--gradsan``::

    def test_step(gradsan_check):
        grads = gradsan_check(jax.grad(loss))(params)   # raises gradsan.NonFiniteError
        with gradsan_check():                            # or: check everything in a block
            loss_fn(model(x)).backward()
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

_HOOKS_KEY = "_gradsan_hooks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gradsan", "gradsan: gradient sanitizer")
    group.addoption(
        "--gradsan",
        action="store_true",
        default=False,
        help="fail tests whose JAX/PyTorch gradients go NaN or Inf, with gradsan's report",
    )
    group.addoption(
        "--gradsan-allow",
        action="append",
        default=[],
        metavar="EXPR",
        help="with --gradsan: do not check the tests that match EXPR, a node id "
        "(path.py::name, or its tail: Class::name) or a -k style keyword expression, "
        "numbers matched whole (test_x1 is not test_x10) (repeatable); for tests that "
        "feed NaN/Inf on purpose",
    )
    group.addoption(
        "--gradsan-trace",
        action="store_true",
        default=False,
        help="PyTorch: trace every backward so the report names the origin (slower)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # pytest marks an entry-point plugin's whole package for assertion rewriting: every gradsan
    # module imported in a test would be parsed and recompiled (seconds per session, each time
    # when bytecode is not cached). gradsan's modules hold no test asserts: import them as is.
    must = getattr(getattr(config.pluginmanager, "rewrite_hook", None), "_must_rewrite", None)
    if isinstance(must, set):
        must.discard("gradsan")
    config.addinivalue_line(
        "markers", "gradsan_allow_nonfinite: gradsan does not check this test (--gradsan)"
    )
    if not config.getoption("gradsan", False):
        return
    from ._plugin_extras import Allow, mark_absl_parameterized
    from ._run._hooks import Hooks

    hooks = Hooks(_raise, trace_from=1 if config.getoption("gradsan_trace", False) else None)
    hooks.enabled = False  # on only while a test runs
    hooks.allow = Allow(config.getoption("gradsan_allow", []) or [])  # type: ignore[attr-defined]
    mark_absl_parameterized(hooks)
    setattr(config, _HOOKS_KEY, hooks.install())  # before collection: module-level @jax.jit


def pytest_pycollect_makemodule(module_path: Any, parent: Any) -> None:
    """A test module inside an installed package (``--pyargs``) is the user's code here: its
    own jit/grad functions are checked (registered before the module is imported)."""
    hooks = getattr(parent.config, _HOOKS_KEY, None)
    if hooks is None:
        return
    from ._plugin_extras import register_test_file

    register_test_file(str(module_path), hooks)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    hooks = getattr(config, _HOOKS_KEY, None)
    if hooks is not None:
        from ._plugin_extras import summary_line

        terminalreporter.write_line(summary_line(hooks))


def pytest_unconfigure(config: pytest.Config) -> None:
    hooks = getattr(config, _HOOKS_KEY, None)
    if hooks is not None:
        hooks.uninstall()


def _error(failure: Any) -> Any:
    from ._errors import NonFiniteError
    from ._fix._hooks import verify_failure

    verify_failure(failure)  # gradsan._fix: run the printed fixes before the report is shown
    err = NonFiniteError(failure.report)
    err.gradsan_header = failure.header  # type: ignore[attr-defined]
    return err


def _raise(failure: Any) -> None:
    __tracebackhide__ = True
    raise _error(failure)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    hooks = getattr(item.config, _HOOKS_KEY, None)
    if hooks is None:
        yield
        return
    from ._plugin_extras import allowed

    if allowed(item, hooks):
        hooks.stats.allowed += 1
        yield
        return
    hooks.begin_test()
    try:
        yield
    finally:
        hooks.end_test()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or report.passed:
        return
    from ._errors import NonFiniteError
    from ._fix._hooks import pytest_section

    err = call.excinfo.value
    if isinstance(err, NonFiniteError) and hasattr(err, "gradsan_header"):
        from ._plugin_extras import failure_repr

        hooks = getattr(item.config, _HOOKS_KEY, None)
        if hooks is not None:
            longrepr, section = failure_repr(item, call.excinfo, err, hooks)
            report.longrepr = longrepr
            report.sections.append(("gradsan", section))
            report.sections += [s for s in [pytest_section(err.report)] if s]  # gradsan._fix


class _Check:
    """``gradsan_check(fn)(*args)`` or ``with gradsan_check(): ...``."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def __call__(self, fn: Any = None, **kwargs: Any) -> Any:
        if fn is None:
            return self._block()
        return _guard_any(fn, **kwargs)

    @contextlib.contextmanager
    def _block(self) -> Any:
        __tracebackhide__ = True
        from ._run._hooks import Hooks

        shared = getattr(self.config, _HOOKS_KEY, None)
        was = shared.enabled if shared is not None else False
        if shared is not None:
            shared.enabled = False  # this block's hooks do the checking
        hooks = Hooks(_raise).install()
        try:
            yield
        finally:
            hooks.uninstall()
            if shared is not None:
                shared.enabled = was


def _guard_any(fn: Any, **kwargs: Any) -> Any:
    """gradsan.jax.guard or gradsan.torch.guard, whichever backend ``fn``'s arguments use."""
    import functools
    import sys

    @functools.wraps(fn)
    def checked(*args: Any, **kw: Any) -> Any:
        __tracebackhide__ = True
        if "torch" in sys.modules and _uses_torch(fn, args, kw):
            import gradsan.torch as gst

            return gst.guard(fn, **kwargs)(*args, **kw)
        import gradsan.jax as gsj

        return gsj.guard(fn, **kwargs)(*args, **kw)

    return checked


def _uses_torch(fn: Any, args: tuple, kwargs: dict) -> bool:
    import torch

    vals = list(args) + list(kwargs.values())
    if any(isinstance(v, (torch.Tensor, torch.nn.Module)) for v in vals):
        return True
    return "jax" not in __import__("sys").modules


@pytest.fixture
def gradsan_check(request: pytest.FixtureRequest) -> _Check:
    """Check a function or a block for NaN/Inf gradients; raises gradsan.NonFiniteError with
    the report. ``gradsan_check(fn)(*args)`` guards one call (JAX or PyTorch, picked from the
    arguments); ``with gradsan_check(): ...`` checks every jit/grad call and backward inside."""
    return _Check(request.config)
