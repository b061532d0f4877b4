"""`gradsan demo`: diagnose each case of the gallery, then one summary line per case."""

from __future__ import annotations

import sys


def main(selected: list[str] | None = None) -> int:
    try:
        import jax  # noqa: F401
    except ImportError:
        print("gradsan demo needs JAX: pip install 'gradsan[jax]'", file=sys.stderr)
        return 2
    from . import demo_cases
    from .jax import explain

    names = selected or list(demo_cases.CASES)
    unknown = [n for n in names if n not in demo_cases.CASES]
    if unknown:
        print(f"gradsan demo: no case {', '.join(unknown)}; the cases are: "
              f"{', '.join(demo_cases.CASES)}", file=sys.stderr)
        return 2
    summary = []
    for name in names:
        make = demo_cases.CASES[name]
        fun, args = make()
        bar = "=" * 100
        print(f"{bar}\n{name}: {make.__doc__.strip()}\n{bar}")
        report = explain(fun)(*args)
        print(report)
        print()
        if report.findings:
            f = report.findings[0]
            extra = f" (+{len(report.findings) - 1} more)" if len(report.findings) > 1 else ""
            where = str(f.where) if f.where else "input"
            summary.append(f"  {name:<18} {f.result:>4} in {f.phase:<8}  {f.catalog_id or '?':<24}"
                           f" {f.primitive:<6} at {where}{extra}")
        else:
            summary.append(f"  {name:<18} finite: no findings")
    print("Summary")
    print("\n".join(summary))
    return 0
