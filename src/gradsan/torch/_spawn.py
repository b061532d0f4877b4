"""`gradsan run` and ``torch.multiprocessing.spawn``: each worker is checked in its own process.

The parent's ``start_processes`` (which ``spawn`` calls) gets a picklable :class:`Worker`
around the user's function. In a fresh child (the ``spawn``/``forkserver`` start methods) the
worker installs the same checks as `gradsan run` (a forked child inherits them); the first
non-finite gradient stops that worker: it saves its report (named after its rank) and exits
with status 3, and ``spawn`` stops the others. The parent then stops the run with that report.
Each worker also saves how many backward calls it checked, for the run's last line.
"""

from __future__ import annotations

import glob
import os
import pickle
import shutil
import sys
import tempfile
from typing import Any

EXIT_NONFINITE = 3


class Worker:
    """The user's worker function, checked (pickled to the children by reference)."""

    exit = staticmethod(os._exit)

    def __init__(self, fn: Any, outdir: str, *, trace: bool, fresh: bool) -> None:
        self.fn = fn
        self.outdir = outdir
        self.trace = trace
        self.fresh = fresh

    def __call__(self, rank: int, *args: Any) -> Any:
        from .._run._failure import Failure, Stop
        from .._run._hooks import Hooks

        def on_failure(f: Failure) -> None:
            raise Stop(f)

        hooks = None
        if self.fresh:  # a spawned interpreter: nothing is patched yet
            hooks = Hooks(on_failure, trace_from=1 if self.trace else None).install()
        calls = 0
        try:
            return self.fn(rank, *args)
        except Stop as s:
            f = s.failure
            if f is not None:
                _save(self.outdir, rank, "failure", (f.call, f.label, f.report, f.traced))
                sys.stderr.flush()
                self.exit(EXIT_NONFINITE)  # spawn's wrapper would turn an exception into exit 1
            raise
        finally:
            if hooks is not None:
                calls = hooks.torch_calls
                hooks.uninstall()
            _save(self.outdir, rank, "calls", calls)


def _save(outdir: str, rank: int, what: str, value: Any) -> None:
    with open(os.path.join(outdir, f"rank{rank}.{what}"), "wb") as fh:
        pickle.dump(value, fh)


def _load(path: str) -> Any:
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def patch_spawn(hooks: Any, torch: Any) -> None:
    """Wrap ``torch.multiprocessing.start_processes`` (``spawn`` calls it) under `gradsan run`."""
    from .._run._failure import Failure, say

    mod = sys.modules.get("torch.multiprocessing.spawn")
    if mod is None or not hasattr(mod, "start_processes"):
        return
    orig = mod.start_processes

    def start_processes(
        fn: Any,
        args: tuple = (),
        nprocs: int = 1,
        join: bool = True,
        daemon: bool = False,
        start_method: str = "spawn",
    ) -> Any:
        if not hooks.enabled or not join:  # join=False: the script joins; not checked
            if hooks.enabled:
                say(
                    "torch.multiprocessing workers started with join=False are not checked "
                    "(their gradients are not looked at)"
                )
            return orig(fn, args, nprocs, join, daemon, start_method)
        outdir = tempfile.mkdtemp(prefix="gradsan-spawn-")
        worker = Worker(
            fn, outdir, trace=hooks.trace_from is not None, fresh=start_method != "fork"
        )
        try:
            try:
                return orig(worker, args, nprocs, join, daemon, start_method)
            except Exception:
                failures = _failures(outdir)
                if not failures:
                    raise
                rank, (call, label, report, traced) = failures[0]
                if len(failures) > 1:
                    others = ", ".join(str(r) for r, _ in failures[1:])
                    report.notes.append(f"spawned worker rank(s) {others} stopped at a NaN/Inf too")
                if not traced:
                    report.notes.append(
                        "a spawned worker is not re-run to locate the op: `gradsan run --trace` "
                        "traces every step of every worker"
                    )
                failure = Failure(
                    backend="torch",
                    report=report,
                    call=call,
                    label=f"{label}, in spawned worker rank {rank} of {nprocs}",
                    tensors={},
                    traced=True,  # the parent cannot re-run a worker's step
                )
                failure.spawned = True  # type: ignore[attr-defined]  # (a worker's call count)
                hooks.on_failure(failure)  # gradsan run stops; the pytest plugin raises
                raise
            finally:
                n = sum(_load(p) or 0 for p in glob.glob(os.path.join(outdir, "rank*.calls")))
                hooks.stats.backward += n
        finally:
            shutil.rmtree(outdir, ignore_errors=True)

    mod.start_processes = start_processes  # type: ignore[attr-defined]
    hooks.undo.append(lambda: setattr(mod, "start_processes", orig))
    if getattr(torch.multiprocessing, "start_processes", None) is orig:
        hooks.set(torch.multiprocessing, "start_processes", start_processes)


def _failures(outdir: str) -> list[tuple[int, Any]]:
    out = []
    for p in glob.glob(os.path.join(outdir, "rank*.failure")):
        got = _load(p)
        if got is not None:
            out.append((int(os.path.basename(p)[4:].split(".")[0]), got))
    return sorted(out, key=lambda x: x[0])
