"""The wrong fixes of issue #13, each now right (or prose): fixes are written on the syntax tree
of the user's statement, keep its arguments, and name only what is in scope."""

import ast
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import gradsan.jax as gsj
import gradsan.torch as gst
from gradsan import Frame
from gradsan._fix import proposals, render_suggestions, route
from gradsan._fix._site import locate
from gradsan._report._records import FixProposal

HEAD = """\
import jax
import jax.numpy as jnp
import jax.scipy.special
import torch


def f(x, y, v, r, d, K, mu, p, k, a, b, z):
"""


def site_frame(tmp_path, stmt: str, expr: str, nth: int = 0) -> Frame:
    """A frame on ``expr`` (its ``nth`` occurrence) in ``stmt``, the body of f in a file."""
    path = tmp_path / "prog.py"
    body = textwrap.indent(textwrap.dedent(stmt).strip("\n"), "    ")
    path.write_text(HEAD + body + "\n")
    lines = path.read_text().splitlines()
    n = len(HEAD.splitlines())
    for i in range(n, len(lines)):
        col = -1
        for _ in range(nth + 1):
            col = lines[i].find(expr, col + 1)
        if col >= 0:
            return Frame(str(path), i + 1, col, "f", lines[i], col + len(expr))
    raise AssertionError(expr)


def codes(entry, backend, frame):
    out = []
    for p in proposals(entry, backend, frame):
        if p.code is not None:
            out.append(p.code.splitlines()[-1])
    return out


def valid_and_in_scope(entry, backend, frame):
    site = locate(frame)
    names = site.names_in_scope() | {"gradsan"}
    for p in proposals(entry, backend, frame):
        if p.code is None:
            assert p.status == "prose"
            continue
        tree = ast.parse(p.code)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert used <= names, (p.code, used - names)


def test_atan2_keeps_the_users_argument_order(tmp_path):
    fr = site_frame(tmp_path, "return jnp.arctan2(v[1], v[0])", "jnp.arctan2(v[1], v[0])")
    assert codes("atan2-at-origin", "jax", fr) == ["return gradsan.jax.safe.atan2(v[1], v[0])"]
    r = gsj.explain(jax.grad(lambda v: jnp.arctan2(v[1], v[0])))(jnp.zeros(2))
    assert r.patch() == ""  # no gradient exists there: nothing is verified, nothing patched


def test_float16_overflow_fix_is_advice_not_a_sum_of_squares(tmp_path):
    fr = site_frame(
        tmp_path,
        "y = jnp.exp(x.astype(jnp.float16) + 12.0)",
        "jnp.exp(x.astype(jnp.float16) + 12.0)",
    )
    assert codes("float16-overflow", "jax", fr) == []


@pytest.mark.parametrize(
    "entry, stmt, expr",
    [
        ("pow-fractional-at-zero", "y = 0.5 * x ** p", "x ** p"),
        ("integer-pow-negative-at-zero", "y = (-2) * x ** -2", "x ** -2"),
        ("relu-at-zero", "y = 0.0 + jax.nn.relu(x)", "jax.nn.relu(x)"),
        (
            "where-at-boundary",
            "y = jnp.where(jnp.abs(r) < d, 0.5 * r ** 2, d * (jnp.abs(r) - 0.5 * d))",
            "jnp.where(jnp.abs(r) < d, 0.5 * r ** 2, d * (jnp.abs(r) - 0.5 * d))",
        ),
        (
            "sqrt-at-zero",
            "return jnp.sqrt(jnp.sum((a - b) ** 2))",
            "jnp.sqrt(jnp.sum((a - b) ** 2))",
        ),
        ("log-at-zero", "logp = jnp.log(z)", "jnp.log(z)"),
        ("eigh-repeated-eigenvalues", "w, u = jnp.linalg.eigh(a)", "jnp.linalg.eigh(a)"),
        (
            "lgamma-at-pole",
            "lp = jax.scipy.stats.dirichlet.logpdf(x, a)",
            "jax.scipy.stats.dirichlet.logpdf(x, a)",
        ),
    ],
)
def test_every_code_fix_is_valid_python_with_names_in_scope(tmp_path, entry, stmt, expr):
    fr = site_frame(tmp_path, stmt, expr)
    valid_and_in_scope(entry, "jax", fr)
    for c in codes(entry, "jax", fr):
        target = stmt.split("=")[0].strip() if "=" in stmt.split("(")[0] else None
        if target:
            assert c.startswith(target + " ="), c
        assert not c.startswith(("0.5 =", "(-2) =", "0.0 =", "(0.5")), c


def test_huber_where_gets_no_code_that_assigns_to_an_expression(tmp_path):
    stmt = "return jnp.where(jnp.abs(r) < d, 0.5 * r ** 2, d * (jnp.abs(r) - 0.5 * d))"
    fr = site_frame(tmp_path, stmt, stmt.removeprefix("return "))
    assert codes("where-at-boundary", "jax", fr) == []


def test_placeholders_are_never_printed(tmp_path):
    fr = site_frame(tmp_path, "A = jnp.sqrt(A0)", "jnp.sqrt(A0)")
    text = "\n".join(p.code for p in proposals("sqrt-at-zero", "jax", fr) if p.code)
    assert "a ** (p / 2)" not in text and "y =" not in text
    fr = site_frame(tmp_path, "q = jnp.log(z)", "jnp.log(z)")
    text = "\n".join(p.code for p in proposals("log-at-zero", "jax", fr) if p.code)
    assert "log_sigmoid" not in text and "logp" not in text
    fr = site_frame(tmp_path, "w, u = jnp.linalg.eigh(a)", "jnp.linalg.eigh(a)")
    assert all(p.code is None for p in proposals("eigh-repeated-eigenvalues", "jax", fr))


def test_log_softmax_only_when_the_log_is_of_a_softmax(tmp_path):
    fr = site_frame(
        tmp_path, "q = jnp.log(jax.nn.softmax(z, axis=-1))", "jnp.log(jax.nn.softmax(z, axis=-1))"
    )
    assert "q = jax.nn.log_softmax(z, axis=-1)" in codes("log-at-zero", "jax", fr)
    fr = site_frame(tmp_path, "q = jnp.log(jax.nn.sigmoid(z))", "jnp.log(jax.nn.sigmoid(z))")
    assert "q = jax.nn.log_sigmoid(z)" in codes("log-at-zero", "jax", fr)


def test_fold_only_when_the_root_is_of_a_power(tmp_path):
    fr = site_frame(tmp_path, "s = jnp.sqrt(a ** 4)", "jnp.sqrt(a ** 4)")
    assert "s = a ** (4 / 2)" in codes("sqrt-at-zero", "jax", fr)


def test_std_keywords_are_kept(tmp_path):
    fr = site_frame(
        tmp_path, "s = jnp.std(x, axis=0, keepdims=True)", "jnp.std(x, axis=0, keepdims=True)"
    )
    assert (
        codes("std-of-constant", "jax", fr)[0]
        == "s = gradsan.jax.safe.std(x, axis=0, keepdims=True)"
    )
    fr = site_frame(tmp_path, "s = jnp.std(x, 0)", "jnp.std(x, 0)")
    assert codes("std-of-constant", "jax", fr)[0] == "s = gradsan.jax.safe.std(x, axis=0)"
    # a keyword the safe twin does not take: no code fix rather than one that drops it
    fr = site_frame(tmp_path, "s = jnp.std(x, axis=0, where=b)", "jnp.std(x, axis=0, where=b)")
    assert codes("std-of-constant", "jax", fr) == []


def test_torch_std_respects_the_unbiased_default(tmp_path):
    fr = site_frame(tmp_path, "s = torch.std(x, dim=0)", "torch.std(x, dim=0)")
    [c] = codes("std-of-constant", "torch", fr)
    assert c == "s = gradsan.torch.safe.std(x, axis=0, ddof=1)"
    import gradsan.torch.safe as ts

    x = torch.randn(5, 3, dtype=torch.float64)
    assert torch.allclose(ts.std(x, axis=0, ddof=1), torch.std(x, dim=0))
    fr = site_frame(tmp_path, "s = x.std(unbiased=False)", "x.std(unbiased=False)")
    assert codes("std-of-constant", "torch", fr) == ["s = gradsan.torch.safe.std(x, ddof=0)"]


def test_torch_method_calls_are_rewritten(tmp_path):
    fr = site_frame(tmp_path, "y = x.sqrt()", "x.sqrt()")
    assert codes("sqrt-at-zero", "torch", fr)[0] == "y = gradsan.torch.safe.sqrt(x)"
    fr = site_frame(tmp_path, "n = x.norm(dim=-1)", "x.norm(dim=-1)")
    assert codes("norm-at-zero", "torch", fr) == ["n = gradsan.torch.safe.norm(x, axis=-1)"]


def test_log2_is_not_off_by_ln2(tmp_path):
    fr = site_frame(tmp_path, "y = jnp.log2(x)", "jnp.log2(x)")
    [c] = [c for c in codes("log-at-zero", "jax", fr) if "safe" in c]
    ns = {
        "gradsan": __import__("gradsan.jax").jax and __import__("gradsan"),
        "x": jnp.array([0.5, 8.0]),
    }
    exec(c, ns)
    np.testing.assert_allclose(ns["y"], jnp.log2(ns["x"]), rtol=1e-6)


def test_xlogy_keeps_both_arguments(tmp_path):
    fr = site_frame(
        tmp_path, "h = jax.scipy.special.xlogy(K, mu)", "jax.scipy.special.xlogy(K, mu)"
    )
    assert codes("xlogy-at-zero", "jax", fr) == ["h = gradsan.jax.safe.xlogy(K, mu)"]


def test_minimum_and_reductions_get_no_maximum(tmp_path):
    fr = site_frame(tmp_path, "m = jnp.minimum(x, y)", "jnp.minimum(x, y)")
    assert not any("maximum" in c for c in codes("max-tie", "jax", fr))
    fr = site_frame(tmp_path, "m = jnp.max(x)", "jnp.max(x)")
    assert codes("max-tie", "jax", fr) == []


def test_return_statements_stay_returns(tmp_path):
    fr = site_frame(tmp_path, "return jnp.sum(jnp.sqrt(x) * 0.0)", "jnp.sqrt(x)")
    assert codes("sqrt-at-zero", "jax", fr)[0] == "return jnp.sum(gradsan.jax.safe.sqrt(x) * 0.0)"


def test_multi_line_statement(tmp_path):
    stmt = "y = jnp.sum(\n    jnp.sqrt(x) * 0.0\n)"
    fr = site_frame(tmp_path, stmt, "jnp.sqrt(x)")
    [p, *_] = [p for p in proposals("sqrt-at-zero", "jax", fr) if p.code]
    assert p.code.splitlines()[1:] == ["y = jnp.sum(", "    gradsan.jax.safe.sqrt(x) * 0.0", ")"]
    assert p.start_line == fr.line - 1 and p.end_line == fr.line + 1


def test_exp_of_p_log_a_is_a_power(tmp_path):
    fr = site_frame(tmp_path, "y = jnp.exp(p * jnp.log(a))", "jnp.log(a)")
    # its own entry (issue #13 item 5), whose first fix is the power
    assert route("log-at-zero", "jax", fr) == "exp-log-at-zero"
    assert codes("exp-log-at-zero", "jax", fr)[0] == "y = gradsan.jax.safe.pow(a, p)"
    fr = site_frame(tmp_path, "y = jnp.log2(x)", "jnp.log2(x)")
    assert route("log-at-zero", "jax", fr) == "log2-log10-at-zero"
    assert codes("log2-log10-at-zero", "jax", fr)[0] == (
        "y = gradsan.jax.safe.log(x) / 0.6931471805599453"
    )
    fr = site_frame(tmp_path, "y = jnp.log(x)", "jnp.log(x)")
    assert route("log-at-zero", "jax", fr) == "log-at-zero"


def test_failed_fixes_are_not_printed_and_json_has_the_verdicts():
    ps = [
        FixProposal("A.", "y = 1", status="failed", checked="changes the value"),
        FixProposal("B.", "y = 2", status="verified", checked="same value"),
        FixProposal("C.", status="prose"),
    ]
    assert render_suggestions(ps) == ["B.\ny = 2\n# verified: same value", "C."]

    def loss(x):
        return jnp.sum(jnp.sqrt(x) * 0.0)

    r = gsj.explain(jax.grad(loss))(jnp.array([0.0, 1.0]))
    d = json.loads(r.to_json())
    fixes = d["findings"][0]["fixes"]
    assert fixes[0]["status"] == "verified" and "certified" in fixes[0]["checked"]


def test_torch_with_block_says_it_could_not_verify():
    x = torch.zeros(2, requires_grad=True)
    with gst.explain() as report:
        (torch.sqrt(x) * 0.0).sum().backward()
    [f] = report.findings
    code = [p for p in f.fixes if p.code]
    assert code and all(p.status == "unverified" for p in code)
    assert "# not verified:" in f.suggestions[0]
    assert report.patch() == ""


def test_a_program_with_callbacks_is_not_run_again_to_verify_its_fixes():
    calls: list = []

    def loss(x):
        jax.debug.callback(lambda v: calls.append(1), x)
        return jnp.sum(jnp.sqrt(x))

    report = gsj.explain(jax.grad(loss))(jnp.array([0.0, 1.0]))
    assert len(calls) == 1  # explain's replay skips it; the verification never ran the program
    f = report.findings[0]
    codes = [p for p in f.fixes if p.code is not None]
    assert codes and all(p.status == "unverified" for p in codes)
    assert all("side effects (jax.debug callback)" in p.checked for p in codes)
    assert report.patch() == ""
