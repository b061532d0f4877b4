"""The hooks `gradsan run` and the pytest plugin call: the patch written next to the
reproducer, and shown in the test report."""

from __future__ import annotations

import os
import sys
from typing import Any


def verify_failure(failure: Any) -> bool:
    """Verify the failure's report on its function and arguments (JAX: `gradsan run` and the
    pytest plugin hold both), once. False when gradsan's own check failed."""
    from . import verify_report

    report = failure.report
    if report is None or failure.backend != "jax" or failure.fun is None or _ran(report):
        return True
    try:
        verify_report(report, failure.fun, failure.args, failure.kwargs, "jax")
    except Exception:  # gradsan's own failure to verify: the report keeps its unverified fixes
        return False
    return True


def write_fix_patch(failure: Any, d: str) -> str | None:
    """Verify the failure's fixes and write ``fix.patch`` into the reproducer folder ``d``; tell
    the user how to apply it. Returns the patch's path, or None when no fix was verified."""
    report = failure.report
    if report is None:
        return None
    if not verify_failure(failure):
        _say("no fix.patch: gradsan could not run the fixes on this program")
        return None
    text = report.patch()
    if not text:
        if any(p.code for f in report.findings for p in f.fixes):
            why = (
                "a backward() call cannot be re-run with a fix"
                if failure.backend == "torch"
                else "no printed fix was verified on this program"
            )
            _say(f"no fix.patch: {why}")
        return None
    path = os.path.join(d, "fix.patch")
    with open(path, "w") as fh:
        fh.write(text)
    rel = os.path.relpath(path)
    _say(f"verified fixes written to {rel}; apply with `git apply {rel}` or `patch -p1 < {rel}`")
    return path


def _ran(report: Any) -> bool:
    return any(p.status in ("verified", "failed") for f in report.findings for p in f.fixes)


def _say(msg: str) -> None:
    print(f"gradsan: {msg}", file=sys.stderr, flush=True)


def pytest_section(report: Any) -> tuple[str, str] | None:
    """The ``gradsan fix.patch`` section of a failed test's report, when a fix was verified."""
    if report is None or not hasattr(report, "patch"):
        return None
    text = report.patch()
    if not text:
        return None
    return ("gradsan fix.patch", "apply with `git apply` or `patch -p1`:\n" + text)
