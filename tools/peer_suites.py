"""Run a peer project's own test suite plain and under ``pytest --gradsan`` and compare the
outcomes test by test (issue #17: optax's and equinox's suites). Nothing is fetched: give it a
directory that holds the peer's tests (a checkout, or site-packages for ``--pyargs``).

Each run writes one line per finished test (``OUTCOME<TAB>NODEID``, subtests as
``NODEID [subtest ...]``) as it goes, so a run that is stopped early still counts the tests it
finished; ``compare`` lines the two files up by node id and prints every test whose outcome
differs, with the counts. Run from the gradsan checkout root, with the gradsan to test first
on PYTHONPATH::

    # equinox: its checkout (its pyproject's addopts need beartype/jaxtyping hooks: -o addopts=)
    PYTHONPATH=$PWD/src python tools/peer_suites.py both --cwd ~/equinox --out /tmp/eqx \\
        -- tests -o addopts= -p no:cacheprovider
    # optax: its tests ship inside the installed package; alias/schedule tests need scikit-learn
    PYTHONPATH=$PWD/src:/tmp/site python tools/peer_suites.py both --cwd /tmp/empty \\
        --out /tmp/optax -- --pyargs optax._src.alias_test -p no:cacheprovider
    # or one mode at a time (say, in two shells), then compare
    python tools/peer_suites.py run --mode gradsan --cwd DIR --out /tmp/x.gradsan -- ARGS...
    python tools/peer_suites.py compare /tmp/x.plain /tmp/x.gradsan

The tests that mean their NaN/Inf are allowed on the command line (session 14's lists, each
checked by reading the test): equinox's error_if(on_error="nan") tests
``--gradsan-allow=tests/test_errors.py::test_nan --gradsan-allow=tests/test_errors.py::test_nan_tracetime``;
optax's ``--gradsan-allow="test_apply_if_finite or test_statefull_inner or test_zero_nans or
SafeSoftmaxCrossEntropyTest"`` (they feed NaN/Inf on purpose) and
``--gradsan-allow=optax/_src/alias_test.py::AliasTest::test_optimization10`` (adadelta without
a learning rate on Rosenbrock: its state overflows to inf, and the test skips itself after the
run as numerically unstable) and
``--gradsan-allow=optax/_src/alias_test.py::LBFGSTest::test_against_plain_implementation9``
(the Zakharov objective overflows to inf in the line search, which the test tolerates).

Compared so far (plain vs --gradsan, by node id; sessions 13-15): equinox 475 of 475; optax:
every test of its 52 test modules has been run in both modes; no difference is left but the
allowed tests above. Session 15 ran the last 182 tests of session 13's chunk A (its 24
modules' tail: linear_algebra_test, whole here, then schedules _inject, transforms _masking,
contrib _schedule_free and _galore, perturbations _make_pert, tree_utils _random and _casting,
transforms _combining, combine_test, losses _ranking: 193 tests, 336 outcomes with subtests)
in both modes: 190 passed and 3 skipped in each, 0 differences, none allowed::

    MODS="optax._src.linear_algebra_test optax.schedules._inject_test ..."  # the 11 above
    PYTHONPATH=$PWD/src:/tmp/peers-site python tools/peer_suites.py both --cwd /tmp/empty \
        --out /tmp/tailA -- --pyargs $MODS -p no:cacheprovider -o addopts= Session 14's peers2 (optax linesearch_test 242,
13 small modules 111, contrib/_common_test 1422, assignment/_hungarian_algorithm_test 1528
outcomes, subtests included) needed no allow: its 4 differences (reduce_on_plateau's inf
sentinel in init state) were gradsan's and are fixed.

``both`` runs plain, then ``--gradsan`` (any ``--gradsan-allow=...`` among the pytest arguments
is kept for the gradsan run only), writing PREFIX.plain / PREFIX.gradsan and PREFIX.*.log, then
compares. ``compare`` exits 1 when a test's outcome differs, 0 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RANK = {"passed": 0, "skipped": 1, "xfailed": 2, "xpassed": 2, "failed": 3, "error": 4}


class Recorder:
    """pytest plugin: append each test's outcome to a file as soon as it is known."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed at session end)
        self.seen: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        key = report.nodeid
        if key.startswith("::"):  # a test file outside the rootdir (--pyargs): name its file
            path = str(report.location[0]).replace(os.sep, "/")
            key = path.rpartition("site-packages/")[2].lstrip("./") + key
        ctx = getattr(report, "context", None)  # pytest's subtests
        if ctx is not None:
            msg = getattr(ctx, "msg", None)
            kwargs = getattr(ctx, "kwargs", None) or {}
            key += f" [subtest {msg!r} {sorted(kwargs.items())!r}]"
        if report.passed:
            outcome = "xpassed" if hasattr(report, "wasxfail") else "passed"
        elif report.skipped:
            outcome = "xfailed" if hasattr(report, "wasxfail") else "skipped"
        else:
            outcome = "failed" if report.when == "call" else "error"
        if report.when == "call" or outcome != "passed":
            self.file.write(f"{outcome}\t{key}\n")
            self.file.flush()

    def pytest_sessionfinish(self) -> None:
        self.file.close()


def read(path: str) -> dict[str, str]:
    """Node id -> outcome; the worst phase wins (a teardown error after a pass is an error)."""
    out: dict[str, str] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        outcome, _, key = line.partition("\t")
        if key and RANK.get(outcome, 0) >= RANK.get(out.get(key, "passed"), 0):
            out[key] = outcome
    return out


def compare(plain_path: str, gradsan_path: str, stream: Any = sys.stdout) -> int:
    plain, gradsan = read(plain_path), read(gradsan_path)
    both = [k for k in plain if k in gradsan]
    diffs = [k for k in both if plain[k] != gradsan[k]]

    def counts(d: dict[str, str]) -> str:
        c = collections.Counter(d[k] for k in both)
        return ", ".join(f"{n} {o}" for o, n in sorted(c.items(), key=lambda x: (-x[1], x[0])))

    print(
        f"compared {len(both)} tests (plain ran {len(plain)}, --gradsan ran {len(gradsan)})",
        file=stream,
    )
    print(f"plain:     {counts(plain)}", file=stream)
    print(f"--gradsan: {counts(gradsan)}", file=stream)
    for k in diffs:
        print(f"DIFF {k}: {plain[k]} plain, {gradsan[k]} under --gradsan", file=stream)
    only = [k for k in plain if k not in gradsan] + [k for k in gradsan if k not in plain]
    if only:
        print(f"{len(only)} tests ran in one mode only (not compared)", file=stream)
    print(f"{len(diffs)} differences", file=stream)
    return 1 if diffs else 0


def run(mode: str, cwd: str, out: str, args: list[str], timeout: float | None = None) -> int:
    """One pytest run in a subprocess (its own interpreter, as a user's), outcomes to ``out``."""
    if mode == "plain":
        args = [a for a in args if not a.startswith("--gradsan")]
    else:
        args = ["--gradsan", *args]
    Path(out).write_text("", encoding="utf-8")
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), here] if p)
    cmd = [sys.executable, __file__, "_pytest", str(Path(out).resolve()), *args]
    with open(out + ".log", "w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(
                cmd,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            print(
                f"{mode}: stopped after {timeout} s; the tests it finished are compared",
                file=sys.stderr,
            )
            return 124
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_pytest"]:  # inside the subprocess
        import pytest

        return int(pytest.main(argv[2:], plugins=[Recorder(argv[1])]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one mode")
    r.add_argument("--mode", choices=["plain", "gradsan"], required=True)
    b = sub.add_parser("both", help="plain, then --gradsan, then compare")
    for q in (r, b):
        q.add_argument("--cwd", default=".", help="directory pytest runs in")
        q.add_argument("--out", required=True, help="outcome file (run) or prefix (both)")
        q.add_argument("--timeout", type=float, default=None, help="seconds per run")
        q.add_argument("pytest_args", nargs=argparse.REMAINDER)
    c = sub.add_parser("compare", help="two outcome files")
    c.add_argument("plain")
    c.add_argument("gradsan")
    ns = p.parse_args(argv)
    if ns.cmd == "compare":
        for f in (ns.plain, ns.gradsan):
            if not Path(f).is_file():
                p.error(f"no outcome file {f}")
        return compare(ns.plain, ns.gradsan)
    if not Path(ns.cwd).is_dir():
        p.error(f"no directory {ns.cwd}")
    args = [a for a in ns.pytest_args if a != "--"]
    if ns.cmd == "run":
        return run(ns.mode, ns.cwd, ns.out, args, ns.timeout)
    for mode in ("plain", "gradsan"):
        run(mode, ns.cwd, f"{ns.out}.{mode}", args, ns.timeout)
    return compare(f"{ns.out}.plain", f"{ns.out}.gradsan")


if __name__ == "__main__":
    sys.exit(main())
