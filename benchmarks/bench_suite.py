"""A pytest suite's time under ``--gradsan`` against plain (issue 17: "a suite under --gradsan
within 1.2x of plain"), in pairs run alternately.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_suite.py [--pairs 5]
        [--optax DIR] [--equinox DIR] [--suite 'ARGS' ...]

Each pair runs every suite twice, once plain and once with ``--gradsan`` (the order swapped
every other pair, so a drift in the machine's load falls on both), each run in a fresh
``python -m pytest -q -p no:cacheprovider`` process. Printed per pair: the wall-clock and the
CPU seconds (user + system of the child, all its threads) of both runs and their ratios; then
the median and the spread (min-max and IQR) of the ratios over the pairs. On a shared machine
wall-clock seconds mostly measure the wait for a core; CPU seconds measure the work done.

The default suites are a fixed subset of optax's and equinox's own tests, from checkouts of
optax 0.2.8 (``--optax``: the repository's ``optax`` folder, whose ``*_test.py`` files run
against the installed optax) and equinox v0.13.8 (``--equinox``: its ``tests`` folder); each
runs in its own process (equinox's conftest changes JAX's dtype promotion for the whole
session). Without them, this repository's tests/jax subset is used. ``--suite`` replaces the
defaults with pytest arguments of your own (one string per suite).
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OPTAX_FILES = ["_src/update_test.py", "losses/_regression_test.py"]
EQUINOX_FILES = ["test_module.py", "test_jit.py"]
OWN_FILES = ["tests/jax/test_g0.py", "tests/jax/test_call_inputs.py"]


def default_suites(optax: str | None, equinox: str | None) -> list[tuple[str, list[str], str]]:
    """(name, pytest arguments, working directory) of each suite."""
    suites = []
    if optax and Path(optax).is_dir():
        suites.append(("optax", [str(Path(optax) / f) for f in OPTAX_FILES], str(optax)))
    if equinox and Path(equinox).is_dir():
        suites.append(("equinox", [str(Path(equinox) / f) for f in EQUINOX_FILES], str(equinox)))
    if not suites:
        suites.append(("gradsan tests/jax", [str(ROOT / f) for f in OWN_FILES], str(ROOT)))
    return suites


def run_once(args: list[str], cwd: str, gradsan: bool) -> tuple[float, float, int, str]:
    """(wall s, child CPU s, exit status, pytest's last line) of one pytest process."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    if gradsan:
        cmd.append("--gradsan")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=os.environ.copy())
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    last = lines[-1] if lines else r.stderr[-200:]
    said = [x for x in lines if x.startswith("gradsan:")]  # the plugin's line of what it checked
    return wall, cpu, r.returncode, last + (f"; {said[-1][:160]}" if said else "")


def spread(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return (
        f"median {statistics.median(xs):.3f} (min {min(xs):.3f}, max {max(xs):.3f}, "
        f"IQR {q[0]:.3f}-{q[2]:.3f}, n={len(xs)})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--optax", default=os.environ.get("GRADSAN_BENCH_OPTAX"))
    ap.add_argument("--equinox", default=os.environ.get("GRADSAN_BENCH_EQUINOX"))
    ap.add_argument("--suite", action="append", help="pytest arguments of one suite")
    a = ap.parse_args()
    if a.pairs < 1:
        raise SystemExit("--pairs must be at least 1")
    if a.suite:
        suites = [(s, shlex.split(s), os.getcwd()) for s in a.suite]
    else:
        suites = default_suites(a.optax, a.equinox)
    for name, args, _ in suites:
        print(f"suite {name}: pytest {' '.join(args)}")
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    for p in range(a.pairs):
        order = [False, True] if p % 2 == 0 else [True, False]
        tot = {False: [0.0, 0.0], True: [0.0, 0.0]}
        for gradsan in order:
            for name, args, cwd in suites:
                wall, cpu, code, last = run_once(args, cwd, gradsan)
                tot[gradsan][0] += wall
                tot[gradsan][1] += cpu
                tag = "--gradsan" if gradsan else "plain    "
                print(
                    f"  pair {p + 1} {tag} {name}: {wall:7.1f} s wall {cpu:7.1f} s cpu "
                    f"(exit {code}: {last})",
                    flush=True,
                )
        rw = tot[True][0] / tot[False][0]
        rc = tot[True][1] / tot[False][1]
        ratios["wall"].append(rw)
        ratios["cpu"].append(rc)
        print(
            f"pair {p + 1}: plain {tot[False][0]:.1f} s wall / {tot[False][1]:.1f} s cpu, "
            f"--gradsan {tot[True][0]:.1f} s / {tot[True][1]:.1f} s: "
            f"ratio wall {rw:.3f}, cpu {rc:.3f}",
            flush=True,
        )
    for k in ("wall", "cpu"):
        print(f"ratio {k}: {spread(ratios[k])}")
        print(f"RESULT suite.ratio_{k}={statistics.median(ratios[k]):.3f}")


if __name__ == "__main__":
    main()
