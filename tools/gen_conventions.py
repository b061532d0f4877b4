"""Generate docs/conventions.md: what JAX and PyTorch return at each operation's kink, and the
admissible set (the Clarke subdifferential, the catalog's ``Admissible``), measured by running
both frameworks (float64, CPU). The output depends only on the installed JAX and PyTorch.

    python tools/gen_conventions.py           # rewrite docs/conventions.md
    python tools/gen_conventions.py --check   # exit 1 if the committed table is out of date

A second table lists every catalog entry sanitize reports (kinks, jumps, conventions outside
the admissible set) with its subdifferential, admissible set and both conventions, as the
catalog writes them. tests/jax/test_conventions_table.py checks that the committed file matches
the installed versions and this tree's catalog.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "conventions.md")
sys.path.insert(0, os.path.join(ROOT, "src"))  # this tree's catalog, whatever is installed

from gradsan import _catalog  # noqa: E402
from gradsan._catalog._types import Admissible  # noqa: E402


def _of(entry_id: str) -> Admissible:
    """The entry's admissible set, as the catalog writes it."""
    adm = _catalog.get(entry_id).admissible
    assert adm is not None, entry_id
    return adm


@dataclasses.dataclass
class Case:
    name: str  # the operation, as a user writes it
    point: str
    jax: Callable[[], Any]  # returns the gradient (numpy-convertible)
    torch: Callable[[], Any]
    admissible: Admissible  # the set (the catalog's type), with its words


def cases() -> list[Case]:
    import jax
    import jax.numpy as jnp
    import torch

    def jg(f, *xs):
        with jax.enable_x64(True):
            args = [jnp.asarray(x, jnp.float64) for x in xs]
            g = jax.grad(f, argnums=tuple(range(len(args))))(*args)
            return np.stack([np.asarray(a) for a in g]) if len(args) > 1 else np.asarray(g[0])

    def tg(f, *xs):
        ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
        f(*ts).backward()
        g = [t.grad if t.grad is not None else torch.zeros_like(t) for t in ts]
        return np.stack([a.numpy() for a in g]) if len(ts) > 1 else g[0].numpy()

    z = 0.0
    v110 = [1.0, 1.0, 0.0]
    v3132 = [3.0, 1.0, 3.0, 2.0]
    eye2 = [[1.0, 0.0], [0.0, 1.0]]
    return [
        Case(
            "abs(x)",
            "x = 0",
            lambda: jg(jnp.abs, z),
            lambda: tg(torch.abs, z),
            _of("abs-at-zero"),
        ),
        Case(
            "relu(x)",
            "x = 0",
            lambda: jg(jax.nn.relu, z),
            lambda: tg(torch.relu, z),
            _of("relu-at-zero"),
        ),
        Case(
            "maximum(x, 0)",
            "x = 0",
            lambda: jg(lambda x: jnp.maximum(x, 0.0), z),
            lambda: tg(lambda x: torch.maximum(x, torch.zeros_like(x)), z),
            Admissible.interval(0, 1),
        ),
        Case(
            "clip(x, 0, 1)",
            "x = 0",
            lambda: jg(lambda x: jnp.clip(x, 0.0, 1.0), z),
            lambda: tg(lambda x: torch.clamp(x, 0.0, 1.0), z),
            Admissible.interval(0, 1),
        ),
        Case(
            "clip(x, 0, 1)",
            "x = 1",
            lambda: jg(lambda x: jnp.clip(x, 0.0, 1.0), 1.0),
            lambda: tg(lambda x: torch.clamp(x, 0.0, 1.0), 1.0),
            Admissible.interval(0, 1),
        ),
        Case(
            "lax.clamp(0, x, 1) / torch.clamp(x, 0, 1)",
            "x = 0",
            lambda: jg(lambda x: jax.lax.clamp(0.0, x, 1.0), z),
            lambda: tg(lambda x: torch.clamp(x, 0.0, 1.0), z),
            Admissible.interval(0, 1),
        ),
        Case(
            "maximum(x, y)",
            "x = y = 1",
            lambda: jg(jnp.maximum, 1.0, 1.0),
            lambda: tg(torch.maximum, 1.0, 1.0),
            Admissible.simplex([0, 1], "{(t, 1 - t) : t in [0, 1]}"),
        ),
        Case(
            "minimum(x, y)",
            "x = y = 1",
            lambda: jg(jnp.minimum, 1.0, 1.0),
            lambda: tg(torch.minimum, 1.0, 1.0),
            Admissible.simplex([0, 1], "{(t, 1 - t) : t in [0, 1]}"),
        ),
        Case(
            "max(x) (reduction)",
            "x = [1, 1, 0]",
            lambda: jg(jnp.max, v110),
            lambda: tg(torch.amax, v110),
            Admissible.simplex([0, 1], "convex combinations of e0, e1"),
        ),
        Case(
            "max(x, dim=0) / x[argmax(x)]",
            "x = [1, 1, 0]",
            lambda: jg(lambda x: x[jnp.argmax(x)], v110),
            lambda: tg(lambda x: torch.max(x, dim=0).values, v110),
            Admissible.simplex([0, 1], "convex combinations of e0, e1"),
        ),
        Case(
            "sort(x)[-1]",
            "x = [3, 1, 3, 2]",
            lambda: jg(lambda x: jnp.sort(x)[-1], v3132),
            lambda: tg(lambda x: torch.sort(x).values[-1], v3132),
            Admissible.simplex([0, 2], "convex combinations of e0, e2"),
        ),
        Case(
            "top_k(x, 1)",
            "x = [3, 1, 3, 2]",
            lambda: jg(lambda x: jax.lax.top_k(x, 1)[0][0], v3132),
            lambda: tg(lambda x: torch.topk(x, 1).values[0], v3132),
            Admissible.simplex([0, 2], "convex combinations of e0, e2"),
        ),
        Case(
            "where(x > 0, x, 0)",
            "x = 0",
            lambda: jg(lambda x: jnp.where(x > 0, x, 0.0), z),
            lambda: tg(lambda x: torch.where(x > 0, x, torch.zeros_like(x)), z),
            Admissible.interval(0, 1),
        ),
        Case(
            "norm(x)",
            "x = [0, 0]",
            lambda: jg(jnp.linalg.norm, [0.0, 0.0]),
            lambda: tg(torch.linalg.norm, [0.0, 0.0]),
            _of("norm-at-zero"),
        ),
        Case(
            "hypot(x, y)",
            "x = y = 0",
            lambda: jg(jnp.hypot, z, z),
            lambda: tg(torch.hypot, z, z),
            _of("hypot-at-origin"),
        ),
        Case(
            "eigvalsh(A)[-1]",
            "A = I (2x2)",
            lambda: jg(lambda a: jnp.linalg.eigvalsh(a)[-1], eye2),
            lambda: tg(lambda a: torch.linalg.eigvalsh(a)[-1], eye2),
            _of("eigh-repeated-eigenvalues"),
        ),
        Case(
            "sign(x)",
            "x = 0",
            lambda: jg(jnp.sign, z),
            lambda: tg(torch.sign, z),
            _of("sign-at-zero"),
        ),
        Case(
            "floor(x)",
            "x = 2",
            lambda: jg(jnp.floor, 2.0),
            lambda: tg(torch.floor, 2.0),
            _of("floor-round-at-jump"),
        ),
        Case(
            "round(x)",
            "x = 0.5",
            lambda: jg(jnp.round, 0.5),
            lambda: tg(torch.round, 0.5),
            _of("floor-round-at-jump"),
        ),
        Case(
            "atan2(y, x)",
            "x = y = 0",
            lambda: jg(jnp.arctan2, z, z),
            lambda: tg(torch.atan2, z, z),
            _of("atan2-at-origin"),
        ),
        Case(
            "norm(x, ord=1)",
            "x = [0, 0]",
            lambda: jg(lambda x: jnp.linalg.norm(x, ord=1), [0.0, 0.0]),
            lambda: tg(lambda x: torch.linalg.vector_norm(x, ord=1), [0.0, 0.0]),
            _of("abs-at-zero"),
        ),
        Case(
            "norm(x, ord=inf)",
            "x = [1, 1, 0.5]",
            lambda: jg(lambda x: jnp.linalg.norm(x, ord=jnp.inf), [1.0, 1.0, 0.5]),
            lambda: tg(lambda x: torch.linalg.vector_norm(x, ord=float("inf")), [1.0, 1.0, 0.5]),
            Admissible.simplex([0, 1], "convex combinations of e0, e1"),
        ),
        Case(
            "norm(x - y) / cdist(x, y)",
            "x = y = [1, 2]",
            lambda: jg(lambda x: jnp.linalg.norm(x - jnp.array([1.0, 2.0])), [1.0, 2.0]),
            lambda: tg(
                lambda x: torch.cdist(x[None], torch.tensor([[1.0, 2.0]], dtype=x.dtype)).sum(),
                [1.0, 2.0],
            ),
            _of("norm-at-zero"),
        ),
        Case(
            "std(x)",
            "x = [1, 1, 1]",
            lambda: jg(lambda x: jnp.std(x, ddof=1), [1.0, 1.0, 1.0]),
            lambda: tg(torch.std, [1.0, 1.0, 1.0]),
            Admissible.ball(_catalog.get("std-of-constant").subdifferential or ""),
        ),
        Case(
            "median(x)",
            "x = [1, 1, 3]",
            lambda: jg(jnp.median, [1.0, 1.0, 3.0]),
            lambda: tg(torch.median, [1.0, 1.0, 3.0]),
            Admissible.simplex([0, 1], "convex combinations of e0, e1"),
        ),
        Case(
            "bessel_i0e(x) / special.i0e(x)",
            "x = 0",
            lambda: jg(jax.lax.bessel_i0e, z),
            lambda: tg(torch.special.i0e, z),
            _of("i0e-at-zero"),
        ),
        Case(
            "scipy.special.i0(x) / special.i0(x)  (smooth)",
            "x = 0",
            lambda: jg(jax.scipy.special.i0, z),
            lambda: tg(torch.special.i0, z),
            Admissible.interval(0, 0, "{0} (differentiable)"),
        ),
        Case(
            "relu(x) - relu(-x)  (= x)",
            "x = 0",
            lambda: jg(lambda x: jax.nn.relu(x) - jax.nn.relu(-x), z),
            lambda: tg(lambda x: torch.relu(x) - torch.relu(-x), z),
            Admissible.interval(1, 1, "{1} (differentiable)"),
        ),
    ]


def _fmt(g: Any) -> str:
    a = np.asarray(g, np.float64)

    def one(v: float) -> str:
        if np.isnan(v):
            return "nan"
        if np.isinf(v):
            return "inf" if v > 0 else "-inf"
        v = round(float(v), 4) + 0.0
        return repr(v)

    if a.ndim == 0:
        return one(float(a))
    if a.ndim == 1:
        return "[" + ", ".join(one(v) for v in a) + "]"
    return "[" + ", ".join(_fmt(r) for r in a) + "]"


def _verdict(admissible: Admissible, g: Any) -> str:
    if not admissible.exists():
        return "no (none exists)"
    return "yes" if admissible.contains(g) else "**no**"


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ").strip() or "-"


def catalog_entries() -> list:
    """The entries sanitize reports: kinks, jumps and discontinuities, and any convention
    outside the admissible set."""
    from gradsan._catalog._types import CONVENTION_KINDS

    return [e for e in _catalog.ENTRIES if e.kind in CONVENTION_KINDS or e.inadmissible]


def catalog_rows() -> list[str]:
    rows = []
    for e in catalog_entries():
        adm = e.admissible.words if e.admissible is not None else "-"
        rows.append(
            f"| `{e.id}` | {e.op} | {_cell(e.subdifferential)} | {_cell(adm)} | "
            f"{_cell(e.conventions.get('jax'))} | {_cell(e.conventions.get('torch'))} |"
        )
    return rows


def render() -> str:
    import jax
    import torch

    rows = []
    for c in cases():
        gj, gt = c.jax(), c.torch()
        rows.append(
            f"| `{c.name}` | {c.point} | {_fmt(gj)} | {_fmt(gt)} | {_cell(c.admissible.words)} | "
            f"{_verdict(c.admissible, gj)} | {_verdict(c.admissible, gt)} |"
        )
    torch_version = torch.__version__.split("+")[0]
    lines = [
        "# Conventions at kinks: JAX vs PyTorch",
        "",
        "<!-- generated by tools/gen_conventions.py; do not edit by hand -->",
        "",
        f"Measured with JAX {jax.__version__} and PyTorch {torch_version} on CPU, float64. "
        "Each row is the gradient the framework returns at a point where the operation is not "
        "differentiable, next to the admissible set (the Clarke subdifferential; *none* where "
        "the function jumps, so that no value is right). `gradsan.jax.sanitize` and "
        "`gradsan.torch.sanitize` report each of these evaluations, with the value and whether "
        "it is admissible; `gradsan.jax.subgradient` returns the limit gradient along a random "
        "direction instead.",
        "",
        "| operation | point | JAX | PyTorch | admissible set | JAX admissible | PyTorch admissible |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "## The catalog's kinks, ties and jumps",
        "",
        "Every catalog entry that sanitize reports as a kink or a convention, with its "
        "subdifferential, its admissible set and each framework's convention, as the catalog "
        "writes them (`gradsan catalog <id>` prints the whole entry).",
        "",
        "| entry | op | subdifferential | admissible set | JAX | PyTorch |",
        "|---|---|---|---|---|---|",
        *catalog_rows(),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed table")
    ns = ap.parse_args(argv)
    text = render()
    if ns.check:
        try:
            with open(OUT, encoding="utf-8") as fh:
                old = fh.read()
        except FileNotFoundError:
            old = ""
        if old != text:
            print(f"{OUT} is out of date: run python tools/gen_conventions.py", file=sys.stderr)
            return 1
        return 0
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
