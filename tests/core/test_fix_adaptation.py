"""Suggested fixes are written on the user's own statement (its syntax tree, not a template)."""

import textwrap

from gradsan import Frame
from gradsan._fix import proposals


def frame(tmp_path, source: str, line_marker: str, expr: str) -> Frame:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(source))
    lines = path.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if line_marker in ln)
    col = lines[i].index(expr)
    return Frame(str(path), i + 1, col, "loss", lines[i], col + len(expr))


def codes(entry, backend, f):
    return [p.code.splitlines()[-1] for p in proposals(entry, backend, f) if p.code]


SRC = """\
import jax
import jax.numpy as jnp


def loss(A, num, den, A0):
    A = jnp.sqrt(A)  # L1
    r = num / den  # L2
    return jnp.sqrt(jnp.sum((A - A0) ** 2))  # L3
"""


def test_unary_operand_and_target(tmp_path):
    f = frame(tmp_path, SRC, "L1", "jnp.sqrt(A)")
    got = codes("sqrt-at-zero", "jax", f)
    assert got[0] == "A = gradsan.jax.safe.sqrt(A)"
    assert got[1] == "A = jnp.where(A > 0, jnp.sqrt(jnp.where(A > 0, A, 1.0)), 0.0)"


def test_binary_operator(tmp_path):
    f = frame(tmp_path, SRC, "L2", "num / den")
    assert codes("div-by-zero", "jax", f)[0] == "r = gradsan.jax.safe.div(num, den)"


def test_return_statement_stays_a_return(tmp_path):
    f = frame(tmp_path, SRC, "L3", "jnp.sqrt(jnp.sum((A - A0) ** 2))")
    got = codes("sqrt-at-zero", "jax", f)
    assert got == ["return gradsan.jax.safe.sqrt(jnp.sum((A - A0) ** 2))"]


def test_import_is_named_when_the_file_lacks_it(tmp_path):
    f = frame(tmp_path, SRC, "L1", "jnp.sqrt(A)")
    [p, *_] = [p for p in proposals("sqrt-at-zero", "jax", f) if p.code]
    assert p.needs_import == "gradsan.jax"
    assert p.code.splitlines()[0].startswith("import gradsan.jax")


def test_fold_only_when_the_argument_is_a_power(tmp_path):
    # sqrt(A) of a name: no exponent to fold into, so the fold is prose, never `y = a ** (p / 2)`
    f = frame(tmp_path, SRC, "L1", "jnp.sqrt(A)")
    ps = proposals("sqrt-at-zero", "jax", f)
    fold = [p for p in ps if "fold" in p.summary]
    assert fold and fold[0].code is None
    src = SRC.replace("jnp.sqrt(A)  # L1", "jnp.sqrt(A ** 4)  # L1")
    f = frame(tmp_path, src, "L1", "jnp.sqrt(A ** 4)")
    assert "A = A ** (4 / 2)" in codes("sqrt-at-zero", "jax", f)


def test_no_frame_no_code():
    assert all(p.code is None for p in proposals("sqrt-at-zero", "jax", None))
