"""Measure gradsan's blame on the real-world cases: origin line, zero-source line, controls.

    PYTHONPATH=<gradsan src> python tests/zero/realworld/measure.py [jax|torch|both] [-v] [--heldout]

Prints, per backend: the origin right (of the cases with a report expected), the zero's source
right (of the cases whose zero is made on another line than the origin), and the reports on the
clean controls. The true lines are the ``# O:`` / ``# Z:`` markers in jax_cases.py and
torch_cases.py.
"""

from __future__ import annotations

import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))


def _marks(path: str) -> dict[str, int]:
    out = {}
    with open(path) as fh:
        for i, line in enumerate(fh, 1):
            if "# O:" in line or "# Z:" in line:
                tag = line.rstrip().rsplit("# ", 1)[1]
                out[tag] = i
    return out


def _run_jax(fun, args):
    """explain's blame (gradsan.jax.explain without the verification of its fixes, which the
    measure does not read and which re-runs every program three times and under jit)."""
    import jax

    from gradsan.jax._explain import diagnose

    grad = jax.grad(fun, argnums=tuple(range(len(args))))
    return diagnose(grad, tuple(args), {}, run_outputs=False)  # the outputs are not read


def _run_torch(fun, args):
    import torch

    import gradsan.torch as gst

    ts = [torch.tensor(a, requires_grad=True) for a in args]
    with gst.explain() as report:
        fun(*ts).backward()
    return report


def measure(backend: str, verbose: bool = False, prefix: str = "") -> dict:
    """``prefix``: "" for the first set, "heldout_" for the second."""
    mod = importlib.import_module(f"tests.zero.realworld.{prefix}{backend}_cases")
    marks = _marks(mod.__file__)
    run = _run_jax if backend == "jax" else _run_torch
    origin_ok = origin_n = zero_ok = zero_n = clean_reports = clean_n = 0
    texts = []
    for name, (fun, args, _source) in mod.CASES.items():
        try:
            report = run(fun, args)
        except Exception as e:  # a crash counts as a miss
            report, err = None, e
        if report is not None:
            texts.append(str(report))
        if name.startswith("clean_"):
            clean_n += 1
            bad = report is None or not report.ok
            clean_reports += bad
            if verbose and bad:
                print(f"  {backend} {name}: REPORT on a clean control")
            continue
        o, z = marks[f"O:{name}"], marks.get(f"Z:{name}")
        f = report.findings[0] if report is not None and report.findings else None
        got_o = f.where.line if f is not None and f.where is not None else None
        got_z = f.zero_from.line if f is not None and f.zero_from is not None else None
        origin_n += 1
        origin_ok += got_o == o
        if z is not None and z != o:
            zero_n += 1
            zero_ok += got_z == z
        if verbose:
            kind = f.detail.get("zero_kind") if f is not None else None
            flag = "" if got_o == o and (z is None or got_z == z) else "  <-- MISS"
            print(f"  {backend} {name:28s} origin {got_o}/{o} zero {got_z}/{z} {kind}{flag}")
            if report is None:
                print(f"    crashed: {err!r}")
    return dict(
        origin=(origin_ok, origin_n),
        zero=(zero_ok, zero_n),
        clean=(clean_reports, clean_n),
        texts=texts,
    )


def main() -> None:
    which = [a for a in sys.argv[1:] if not a.startswith("-")] or ["both"]
    verbose = "-v" in sys.argv
    prefix = "heldout_" if "--heldout" in sys.argv else ""
    backends = ["jax", "torch"] if which[0] == "both" else which
    for b in backends:
        r = measure(b, verbose, prefix)
        (oo, on), (zo, zn), (cr, cn) = r["origin"], r["zero"], r["clean"]
        print(
            f"{b}: origin right {oo}/{on} ({100 * oo / max(on, 1):.0f}%), "
            f"zero source right {zo}/{zn} ({100 * zo / max(zn, 1):.0f}%), "
            f"reports on clean controls {cr}/{cn}"
        )


if __name__ == "__main__":
    main()
