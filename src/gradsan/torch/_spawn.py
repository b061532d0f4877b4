"""`gradsan run` and ``torch.multiprocessing``'s workers: each worker is checked in its own
process, the report names the rank and the user's line.

``start_processes`` (which ``spawn`` calls, with ``join=True`` or ``join=False``) gets a
picklable :class:`Worker` around the user's function, and the ``ProcessContext`` it starts
gets a checking ``join`` (``spawn``'s own loop calls it; with ``join=False`` the script does,
later). In a fresh child (the ``spawn``/``forkserver`` start methods) the worker installs the
same checks as `gradsan run` (a forked child inherits them); the first non-finite gradient
stops that worker: it saves its report (named after its rank) and exits with status 3, and
the context's ``join`` stops the others. The parent then locates the op the way `gradsan run`
does for a script: the forward is gone after backward, so it **re-runs the workers** (same
function, same arguments) with that rank's failing backward call traced and the other ranks
unchecked, and stops the run with the located report. A re-run is not made where it would not
be safe: arguments shared with the parent (tensors, modules, multiprocessing queues, pipes,
locks, values) which a re-run would write to or take from; then one line says so and the
report is the worker's record (its non-finite gradients). A re-run that does not reproduce the
NaN, or does not end in time, says so too. Each worker also saves how many backward calls it
checked, for the run's last line. A context the script never joins is not checked.
"""

from __future__ import annotations

import glob
import os
import pickle
import shutil
import sys
import tempfile
import time
from typing import Any

EXIT_NONFINITE = 3

# the `gradsan run` hooks of this process (a forked worker inherits them)
_RUN_HOOKS: Any = None


class Worker:
    """The user's worker function, checked (pickled to the children by reference).
    ``replay=(rank, call)``: a re-run to locate ``rank``'s backward call ``call``: that rank
    traces that call and stops after it, the other ranks run unchecked."""

    exit = staticmethod(os._exit)

    def __init__(
        self,
        fn: Any,
        outdir: str,
        *,
        trace: bool,
        fresh: bool,
        replay: tuple[int, int] | None = None,
    ) -> None:
        self.fn = fn
        self.outdir = outdir
        self.trace = trace
        self.fresh = fresh
        self.replay = replay

    def __call__(self, rank: int, *args: Any) -> Any:
        from .._run._failure import Failure, Stop
        from .._run._hooks import Hooks

        def on_failure(f: Failure) -> None:
            raise Stop(f)

        replay = self.replay
        if replay is not None and rank != replay[0]:  # a re-run: only the failing rank checks
            if not self.fresh and _RUN_HOOKS is not None:
                _RUN_HOOKS.enabled = False
            return self.fn(rank, *args)
        hooks = None
        if self.fresh:  # a spawned interpreter: nothing is patched yet
            if replay is not None:
                hooks = Hooks(on_failure, trace_from=replay[1], replay_step=replay[1])
            else:
                hooks = Hooks(on_failure, trace_from=1 if self.trace else None)
            hooks.install()
        elif replay is not None and _RUN_HOOKS is not None:  # forked: the run's hooks
            _RUN_HOOKS.trace_from = _RUN_HOOKS.replay_step = replay[1]
            _RUN_HOOKS.end_session()
            _RUN_HOOKS.begin_session(_RUN_HOOKS.torch_calls + 1)
        calls = 0
        try:
            return self.fn(rank, *args)
        except Stop as s:
            f = s.failure
            if f is not None:
                f.report.outputs = None
                _save(self.outdir, rank, "failure", (f.call, f.label, f.report, f.traced))
            if f is not None or replay is not None:  # (a re-run's step that stayed finite)
                sys.stderr.flush()
                self.exit(EXIT_NONFINITE)  # spawn's wrapper would turn an exception into exit 1
            raise
        finally:
            if hooks is not None:
                calls = hooks.torch_calls
                hooks.uninstall()
            if replay is None:
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


def unsafe_args(args: Any) -> str | None:
    """Why re-running the workers with these arguments would not be safe (None if it is):
    what they share with the parent, which a re-run would write to or take from."""
    import torch

    todo, depth = [args], 0
    while todo and depth < 3:
        nxt: list[Any] = []
        for v in todo:
            if isinstance(v, torch.nn.Module):
                return (
                    "its arguments include a module, whose parameters the workers share with "
                    "the parent (a re-run would update them)"
                )
            if isinstance(v, torch.Tensor):
                return (
                    "its arguments include a tensor, which the workers share with the parent "
                    "(a re-run could write to it)"
                )
            mod = type(v).__module__ or ""
            if mod.split(".")[0] == "multiprocessing":
                return (
                    f"its arguments include a multiprocessing {type(v).__name__}, shared with "
                    "the parent (a re-run would send to or take from it)"
                )
            if isinstance(v, (list, tuple, set, frozenset)):
                nxt += list(v)
            elif isinstance(v, dict):
                nxt += list(v.values())
        todo, depth = nxt, depth + 1
    return None


class _Started:
    """One ``start_processes`` call under `gradsan run`: the context's checking ``join``."""

    def __init__(
        self,
        hooks: Any,
        orig: Any,
        fn: Any,
        args: tuple,
        nprocs: int,
        daemon: bool,
        start_method: str,
    ) -> None:
        self.hooks, self.orig, self.fn, self.args = hooks, orig, fn, args
        self.nprocs, self.daemon, self.start_method = nprocs, daemon, start_method
        self.fresh = start_method != "fork"
        self.outdir = tempfile.mkdtemp(prefix="gradsan-spawn-")
        self.done = False
        worker = Worker(fn, self.outdir, trace=hooks.trace_from is not None, fresh=self.fresh)
        self.t0 = time.monotonic()
        try:
            self.context = orig(worker, args, nprocs, False, daemon, start_method)
        except BaseException:
            shutil.rmtree(self.outdir, ignore_errors=True)
            raise
        orig_join = self.context.join

        def join(*a: Any, **k: Any) -> Any:
            __tracebackhide__ = True
            try:
                finished = orig_join(*a, **k)
            except Exception:
                self.failed()  # stops the run (the pytest plugin: raises) if a worker stopped
                raise
            if finished:
                self.end()
            return finished

        self.context.join = join  # the instance's attribute shadows ProcessContext.join

    def end(self) -> None:
        if self.done:
            return
        self.done = True
        n = sum(_load(p) or 0 for p in glob.glob(os.path.join(self.outdir, "rank*.calls")))
        self.hooks.stats.backward += n
        shutil.rmtree(self.outdir, ignore_errors=True)

    def failed(self) -> None:
        from .._run._failure import Failure

        __tracebackhide__ = True
        if self.done:
            return
        elapsed = time.monotonic() - self.t0
        failures = _failures(self.outdir)
        self.end()
        if not failures:
            return
        rank, (call, label, report, traced) = failures[0]
        if len(failures) > 1:
            others = ", ".join(str(r) for r, _ in failures[1:])
            report.notes.append(f"spawned worker rank(s) {others} stopped at a NaN/Inf too")
        if not traced:
            report = self.relocate(rank, call, report, elapsed)
        failure = Failure(
            backend="torch",
            report=report,
            call=call,
            label=f"{label}, in spawned worker rank {rank} of {self.nprocs}",
            tensors={},
            traced=True,  # the parent cannot re-run the script for a worker's step
        )
        failure.spawned = True  # type: ignore[attr-defined]  # (a worker's call count)
        self.hooks.on_failure(failure)  # gradsan run stops; the pytest plugin raises

    def relocate(self, rank: int, call: int, report: Any, elapsed: float) -> Any:
        """Re-run the workers with ``rank``'s backward call ``call`` traced: its located
        report, or ``report`` (the worker's record) with a note saying why not."""
        from .._run._failure import ordinal, say

        why = unsafe_args(self.args)
        if why is not None:
            report.notes.append(
                f"spawned worker rank {rank} was not re-run to locate the op: {why}; "
                "`gradsan run --trace` traces every step of every worker"
            )
            return report
        say(
            f"re-running the spawned workers up to rank {rank}'s backward call {call} with the "
            "tracer on (the forward is gone after backward; --trace avoids the re-run)..."
        )
        outdir = tempfile.mkdtemp(prefix="gradsan-spawn-")
        worker = Worker(self.fn, outdir, trace=False, fresh=self.fresh, replay=(rank, call))
        limit = max(60.0, 3 * elapsed + 30)
        t0 = time.monotonic()
        timed_out = False
        try:
            ctx = self.orig(worker, self.args, self.nprocs, False, self.daemon, self.start_method)
            try:
                while True:
                    left = limit - (time.monotonic() - t0)
                    if left <= 0:
                        timed_out = True
                        break
                    if ctx.join(min(left, 1.0)):
                        break
            except Exception:
                pass  # the traced rank stopped: join ended the others
            finally:
                _kill(ctx)
            got = _load(os.path.join(outdir, f"rank{rank}.failure"))
        finally:
            shutil.rmtree(outdir, ignore_errors=True)
        say(f"re-run done in {time.monotonic() - t0:.1f} s.")
        if got is not None and got[3]:
            located = got[2]
            located.notes.extend(report.notes)
            located.notes.append(
                f"located by re-running the spawned workers: rank {rank}'s {ordinal(call)} "
                "backward call traced, the other ranks unchecked"
            )
            return located
        why_not = (
            f"did not end within {limit:.0f} s"
            if timed_out
            else "did not reproduce the non-finite gradient (are the workers seeded?)"
        )
        report.notes.append(
            f"the re-run of the spawned workers {why_not}: the gradients above are what worker "
            f"rank {rank} recorded; `gradsan run --trace` traces every step of every worker"
        )
        return report


def _kill(ctx: Any) -> None:
    for p in getattr(ctx, "processes", []):
        if p.is_alive():
            p.terminate()
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


def patch_spawn(hooks: Any, torch: Any) -> None:
    """Wrap ``torch.multiprocessing.start_processes`` (``spawn`` calls it) under `gradsan run`."""
    global _RUN_HOOKS

    mod = sys.modules.get("torch.multiprocessing.spawn")
    if mod is None or not hasattr(mod, "start_processes"):
        return
    orig = mod.start_processes
    _RUN_HOOKS = hooks

    def start_processes(
        fn: Any,
        args: tuple = (),
        nprocs: int = 1,
        join: bool = True,
        daemon: bool = False,
        start_method: str = "spawn",
    ) -> Any:
        if not hooks.enabled:
            return orig(fn, args, nprocs, join, daemon, start_method)
        context = _Started(hooks, orig, fn, args, nprocs, daemon, start_method).context
        if not join:
            return context  # the script joins it: the checking join reports then
        while not context.join():
            pass
        return None

    def undo() -> None:
        global _RUN_HOOKS
        mod.start_processes = orig  # type: ignore[attr-defined]
        _RUN_HOOKS = None

    mod.start_processes = start_processes  # type: ignore[attr-defined]
    hooks.undo.append(undo)
    if getattr(torch.multiprocessing, "start_processes", None) is orig:
        hooks.set(torch.multiprocessing, "start_processes", start_processes)


def _failures(outdir: str) -> list[tuple[int, Any]]:
    out = []
    for p in glob.glob(os.path.join(outdir, "rank*.failure")):
        got = _load(p)
        if got is not None:
            out.append((int(os.path.basename(p)[4:].split(".")[0]), got))
    return sorted(out, key=lambda x: x[0])
