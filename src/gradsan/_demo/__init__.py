"""`gradsan demo`: diagnose each case of the gallery, show the fix and nansafe's gradient next
to the true one, then one summary line per case."""

from __future__ import annotations

import os
import sys

from .._userfile import register_user_file

# the gallery is written as user code, and its reports point at its lines
register_user_file(os.path.join(os.path.dirname(__file__), "case.py"))


def _fmt(tree) -> str:
    import jax
    import numpy as np

    leaves = jax.tree_util.tree_leaves(tree)
    parts = [
        np.array2string(
            np.asarray(x, dtype=np.float64).round(5), separator=", ", max_line_width=200
        )
        for x in leaves
    ]
    return "; ".join(p.replace("\n", "") for p in parts)


def main(selected: list[str] | None = None) -> int:
    try:
        import jax  # noqa: F401
    except ImportError:
        print("gradsan demo needs JAX: pip install 'gradsan[jax]'", file=sys.stderr)
        return 2
    from ..jax import explain, nansafe
    from . import case as gallery

    names = selected or list(gallery.CASES)
    unknown = [n for n in names if n not in gallery.CASES]
    if unknown:
        print(
            f"gradsan demo: no case {', '.join(unknown)}; the cases are: "
            f"{', '.join(gallery.CASES)}",
            file=sys.stderr,
        )
        return 2
    summary = []
    for name in names:
        make = gallery.CASES[name]
        case = make()
        bar = "=" * 100
        print(f"{bar}\n{name}: {(make.__doc__ or '').strip()}\n{bar}")
        report = explain(case.grad)(*case.args)
        print(report)
        print()
        fixed = case.fixed(*case.args)
        ns, ns_report = nansafe(case.grad, report=True)(*case.args)
        resolved = len(ns_report.by_kind("resolved"))
        unresolved = len(ns_report.by_kind("unresolved"))
        print(f"  plain gradient      {_fmt(report.outputs)}")
        print(f"  with the fix        {_fmt(fixed)}")
        limit = [
            f
            for f in ns_report.by_kind("resolved")
            if f.detail.get("rule", "").startswith("limit engine")
        ]
        ns_note = (
            f"  ({limit[0].detail['rule'].split(': ', 1)[1]}, certified by the limit engine)"
            if limit
            else f"  ({resolved} structural zero(s) repaired, proven)"
            if resolved and not unresolved
            else f"  (left non-finite: {unresolved} numerical 0 * inf; needs the limit engine)"
            if unresolved
            else ""
        )
        print(f"  gradsan.jax.nansafe {_fmt(ns)}{ns_note}")
        truth = case.truth
        print(
            f"  true gradient       {truth if isinstance(truth, str) else _fmt(truth(*case.args))}"
        )
        print()
        if report.findings:
            f = report.findings[0]
            extra = f" (+{len(report.findings) - 1} more)" if len(report.findings) > 1 else ""
            where = str(f.where) if f.where else "input"
            summary.append(
                f"  {name:<18} {f.result:>4} in {f.phase:<8}  {f.catalog_id or '?':<24}"
                f" {f.primitive:<6} at {where}{extra}"
            )
        else:
            summary.append(f"  {name:<18} finite: no findings")
    print("Summary")
    print("\n".join(summary))
    return 0
