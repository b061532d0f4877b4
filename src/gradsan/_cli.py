"""The `gradsan` command: gradsan demo | catalog [ID] | run SCRIPT."""

from __future__ import annotations

import argparse
import sys


def _catalog(args: argparse.Namespace) -> int:
    from . import _catalog as catalog

    if args.id:
        try:
            print(catalog.get(args.id).render())
        except KeyError as e:
            print(f"gradsan: {e.args[0]}", file=sys.stderr)
            return 2
        return 0
    width = max(len(e.id) for e in catalog.ENTRIES)
    for e in catalog.ENTRIES:
        print(f"{e.id:<{width}}  {e.kind:<13} {e.title}")
    print(f"\n{len(catalog.ENTRIES)} entries. `gradsan catalog ID` prints one.")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import main as demo_main

    return demo_main(args.cases)


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
    from ._run import add_run_parser

    add_run_parser(sub)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
