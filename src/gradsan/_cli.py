"""The `gradsan` command: gradsan demo | catalog [ID] | run SCRIPT."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _catalog(args: argparse.Namespace) -> int:
    from . import _catalog as catalog

    if args.id:
        try:
            print(catalog.get(args.id).render())
        except KeyError as e:
            print(f"gradsan: {e.args[0]}", file=sys.stderr)
            return 2
        return 0
    width = max(len(entry.id) for entry in catalog.ENTRIES)
    for entry in catalog.ENTRIES:
        print(f"{entry.id:<{width}}  {entry.kind:<13} {entry.title}")
    print(f"\n{len(catalog.ENTRIES)} entries. `gradsan catalog ID` prints one.")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import main as demo_main

    return demo_main(args.cases)


def _add_run_parser(sub: Any) -> None:
    """The `gradsan run` subcommand (the work is in gradsan/_run/)."""
    p = sub.add_parser(
        "run",
        help="run a Python script with gradsan's guard on every gradient",
        description="Run SCRIPT as __main__ with every JAX jit/grad and every PyTorch backward "
        "checked for NaN/Inf (one fused check per call). At the first non-finite gradient: "
        "print the explanation, write gradsan-repro-<time>/ and exit with status 3.",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="PyTorch: trace every step (slower) instead of re-running the script "
        "up to the failing step",
    )
    p.add_argument(
        "--sanitize",
        action="store_true",
        help="also report kinks (abs/relu at 0, ties) on the first call of each "
        "function, without stopping",
    )
    p.add_argument("--json", metavar="FILE", help="write the reports as JSON to FILE")
    p.add_argument(
        "--repro-dir",
        metavar="DIR",
        help="where to write the reproducer (default gradsan-repro-<time>/)",
    )
    p.add_argument("--replay-step", type=int, metavar="N", help=argparse.SUPPRESS)
    p.add_argument("--replay-out", metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(fn=_run)


def _run(a: argparse.Namespace) -> int:
    from ._run import run
    from ._run._traceback import report_script_error

    try:
        return _run_checked(a, run)
    except Exception as e:  # outside the script: writing the reproducer, the torch re-run
        return report_script_error(e)


def _run_checked(a: argparse.Namespace, run: Any) -> int:
    return run(
        a.script,
        a.args,
        trace=a.trace,
        sanitize=a.sanitize,
        json_path=a.json,
        repro_dir=a.repro_dir,
        replay_step=a.replay_step,
        replay_out=a.replay_out,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gradsan", description="A gradient sanitizer for JAX and PyTorch."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "catalog", help="list the catalog of singular operations, or print one entry"
    )
    p.add_argument("id", nargs="?", help="an entry id, e.g. sqrt-at-zero")
    p.set_defaults(fn=_catalog)
    p = sub.add_parser("demo", help="a gallery of classic NaN-gradient cases, diagnosed")
    p.add_argument("cases", nargs="*", help="run only these cases (by name)")
    p.set_defaults(fn=_demo)
    _add_run_parser(sub)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
