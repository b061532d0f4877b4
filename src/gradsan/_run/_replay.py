"""The PyTorch re-run: the forward is gone after backward, so the failing step is reached
again by re-running the script with the checks off up to that backward call and the tracer on
for it, in a child process (a fresh interpreter: module state, RNG)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ._failure import Failure, Stop, say
from ._hooks import Hooks, run_script


def replay_torch(
    script: str, argv: list[str], step: int, result: dict, cwd: str | None = None
) -> int:
    """Re-run ``script`` with checks off before backward call ``step`` and that call traced."""

    def on_failure(f: Failure) -> None:
        raise Stop(f)

    hooks = Hooks(on_failure, trace_from=step, replay_step=step)
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        code, failure = run_script(script, argv, hooks)
    finally:
        os.chdir(old)
    result["failure"] = failure
    return code


def replay_in_child(script: str, argv: list[str], step: int, workdir: str) -> Any:
    """The torch re-run, in a child process (a fresh interpreter: module state, RNG)."""
    import pickle
    import subprocess

    out = os.path.join(workdir, "replay.pkl")
    log = os.path.join(workdir, "replay.log")
    cmd = [
        sys.executable,
        "-m",
        "gradsan",
        "run",
        "--replay-step",
        str(step),
        "--replay-out",
        out,
        script,
        *argv,
    ]
    say(
        f"re-running the script up to backward call {step} with the tracer on "
        "(the forward is gone after backward; --trace avoids the re-run)..."
    )
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
    say(f"re-run done in {time.perf_counter() - t0:.1f} s.")
    try:
        with open(out, "rb") as fh:
            return pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def replay_child(script: str, argv: list[str], step: int, out: str | None) -> int:
    """The child of a torch re-run (``gradsan run --replay-step N --replay-out FILE``): run up
    to backward call ``step``, trace it, pickle its report to ``out``."""

    def on_failure(f: Failure) -> None:
        raise Stop(f)

    hooks = Hooks(on_failure, trace_from=step, replay_step=step)
    code, failure = run_script(script, argv, hooks)
    if out:
        import pickle

        with open(out, "wb") as fh:
            if failure is not None:
                failure.report.outputs = None
            pickle.dump(failure and {"report": failure.report}, fh)
    return code
