"""`gradsan run script.py [args...]`: run a script with gradsan's guard on every gradient.

The script runs as ``__main__`` (runpy) with ``sys.argv`` set. jax and torch are patched
lazily, by an import hook, only if the script imports them:

- **JAX**: functions made by ``jax.jit``, ``jax.grad`` and ``jax.value_and_grad`` *in the user's
  code* (not in libraries) are wrapped. Each eager call computes its outputs plus one fused
  finiteness flag (inside the same compiled program for ``jit``); calls made while tracing
  pass straight through. On the first non-finite output the same call is replayed through
  gradsan's interpreter (gradsan.jax.guard's machinery).
- **PyTorch**: after every ``Tensor.backward()`` and ``torch.autograd.grad``, one fused check
  (``torch._foreach_norm``) of the ``.grad`` of the leaves the backward reached. The forward is
  gone by then, so by default gradsan **re-runs the script** in a child process with the checks
  off up to that backward call and the tracer on for that one step (the script must be
  deterministic: seed it). ``--trace`` instead traces every step from the start (slower, no
  re-run).

At the first non-finite gradient gradsan prints the report, writes ``gradsan-repro-<time>/``
(``inputs.npz`` or ``inputs.pt``, ``meta.json``, ``repro.py``; announced only once it loads)
and exits with status 3. Otherwise the run ends with one line of what was checked and what
was not (_summary.py). The script's own error prints its traceback without gradsan's frames
(exit 1); an error inside gradsan says so (exit 4, _traceback.py).

The pieces: _hooks.py (the import hook and the check session, shared with the pytest plugin),
_patch_jax.py and _patch_torch.py (the patches), _repro.py (the reproducer), _replay.py (the
torch re-run in a child process); the command line is in gradsan/_cli.py.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from .._fix._hooks import verify_failure
from ._capture import EnvRecorder
from ._failure import EXIT_NONFINITE as EXIT_NONFINITE
from ._failure import Failure, Stop, say, short_path
from ._hooks import Hooks, run_script
from ._replay import replay_child, replay_in_child
from ._repro import check_repro, pickle_structure, write_repro
from ._repro import jax_repro_main as jax_repro_main  # the repro.py files import these two
from ._repro import torch_repro_main as torch_repro_main
from ._traceback import EXIT_INTERNAL


def run(
    script: str,
    argv: list[str],
    *,
    trace: bool = False,
    sanitize: bool = False,
    json_path: str | None = None,
    repro_dir: str | None = None,
    replay_step: int | None = None,
    replay_out: str | None = None,
) -> int:
    """Run ``script`` under gradsan; the exit status is the script's, or 3 at a NaN/Inf."""
    if not os.path.isfile(script):
        say(f"no such script: {script}")
        return 2
    reports: list[dict] = []

    def on_kinks(report: Any, where: str) -> None:
        if not report.findings:
            return
        say(f"--sanitize: {len(report.findings)} kink(s) in {where}:")
        print(str(report), file=sys.stderr, flush=True)
        reports.append({"kind": "sanitize", "where": where, **json.loads(report.to_json())})

    env = EnvRecorder()

    def on_failure(f: Failure) -> None:
        f.environ = dict(env.read)
        if f.backend == "jax":
            f.structure = pickle_structure(f)  # now, while the script's classes are __main__'s
        raise Stop(f)

    if replay_step is not None:  # the child of a torch re-run
        return replay_child(script, argv, replay_step, replay_out)

    hooks = Hooks(on_failure, trace_from=1 if trace else None, sanitize=sanitize, on_kinks=on_kinks)
    env.install(hooks)
    code, failure = run_script(script, argv, hooks)
    if failure is not None:
        if failure.backend == "torch" and not failure.traced:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                got = replay_in_child(script, argv, failure.call, tmp)
            if got and got.get("report") is not None:
                failure.report = got["report"]
            else:
                failure.report.notes.append(
                    "the re-run of the script did not reproduce the non-finite gradient (is it "
                    "seeded?); run it with `gradsan run --trace` to trace every step instead."
                )
        verify_failure(failure)  # gradsan._fix: run the printed fixes before the report is shown
        say(failure.header)
        print(str(failure.report), file=sys.stderr, flush=True)
        d = write_repro(failure, script, argv, repro_dir)
        shown = short_path(d)
        why_not = check_repro(d, failure.backend)
        if why_not is None:
            say(f"reproducer written to {shown}/ (python {shown}/repro.py)")
        else:  # never announce one that cannot load
            say(f"the inputs are saved in {shown}/, but its repro.py does not load ({why_not}).")
        reports.append(
            {
                "kind": "nonfinite",
                "call": failure.call,
                "label": failure.label,
                "repro": d,
                **json.loads(failure.report.to_json()),
            }
        )
    hooks.stats.backward += hooks.torch_calls
    if failure is None and code != EXIT_INTERNAL:
        finite = "all finite" if code == 0 else "all finite up to the script's exit"
        say(hooks.stats.line(finite=finite)[len("gradsan: ") :])
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"exit_code": code, "reports": reports}, fh, indent=2)
    return code
