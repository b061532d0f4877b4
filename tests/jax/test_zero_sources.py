"""The zero's side of a NaN gradient (JAX): for each kind of zero, the exact line of the
operation that made the zero factor of 0 * inf (or 0 / 0) exact, and its kind."""

import jax
import jax.numpy as jnp
import pytest

import gradsan.jax as gsj
from gradsan._events import ZeroKind
from tests.conftest import line_of

MASK3 = jnp.array([False, True, True])
PAIR_MASK = jnp.array([0.0, 1.0, 1.0])


def where_log(p):
    y = jnp.log(p)  # O:where_log
    return jnp.sum(jnp.where(MASK3, y, 0.0))  # Z:where_log


def where_sqrt(x):
    r = jnp.sqrt(x)  # O:where_sqrt
    return jnp.sum(jnp.where(x > 0, r, 0.0))  # Z:where_sqrt


def where_div(x):
    q = 1.0 / x  # O:where_div
    return jnp.sum(jnp.where(x != 0, q, 0.0))  # Z:where_div


def where_arctan2(v):
    a = jnp.arctan2(v[1], v[0])  # O:where_arctan2
    return jnp.where(jnp.sum(v * v) > 0, a, 0.0)  # Z:where_arctan2


def padding_log1p(x):
    y = jnp.log1p(-x)  # O:padding_log1p
    pad = x < 1.0
    return jnp.sum(jnp.where(pad, y, 0.0))  # Z:padding_log1p


def mask_product(x):
    d = jnp.sqrt(x)  # O:mask_product
    return jnp.sum(d * PAIR_MASK)  # Z:mask_product


def slice_rows(x):
    out = jnp.sqrt(x)  # O:slice_rows
    return jnp.sum(out[:2])  # Z:slice_rows


def slice_logits(x):
    logits = jnp.log(x)  # O:slice_logits
    return jnp.sum(logits[:, :-1])  # Z:slice_logits


def one_hot_labels(p):
    labels = jax.nn.one_hot(jnp.array([1, 2]), 3)  # Z:one_hot_labels
    return -jnp.sum(labels * jnp.log(p))  # O:one_hot_labels


def vanishing_square(x):
    return jnp.sum(jnp.sqrt(x**2))  # O:vanishing_square


def underflow_exp(x):
    w = jnp.exp(-x)  # Z:underflow_exp
    return jnp.sum(w * jnp.sqrt(x - 200.0))  # O:underflow_exp


def nan_to_num_log(x):
    y = jnp.log(x)  # O:nan_to_num_log
    return jnp.sum(jnp.nan_to_num(y))  # Z:nan_to_num_log


def input_zero(x, w):
    return jnp.sum(w * jnp.sqrt(x))  # O:input_zero


CASES = {
    # name: (function, args, kind, zero line marker, origin line marker)
    "where_log": (where_log, (jnp.array([0.0, 0.5, 0.25]),), ZeroKind.WHERE),
    "where_sqrt": (where_sqrt, (jnp.array([-1.0, 4.0]),), ZeroKind.WHERE),
    "where_div": (where_div, (jnp.array([0.0, 2.0]),), ZeroKind.WHERE),
    "where_arctan2": (where_arctan2, (jnp.array([0.0, 0.0]),), ZeroKind.WHERE),
    "padding_log1p": (padding_log1p, (jnp.array([1.0, 0.5]),), ZeroKind.WHERE),
    "mask_product": (mask_product, (jnp.array([0.0, 1.0, 4.0]),), ZeroKind.MASK),
    "slice_rows": (slice_rows, (jnp.array([1.0, 4.0, 0.0]),), ZeroKind.SLICE),
    "slice_logits": (slice_logits, (jnp.array([[1.0, 0.0], [2.0, 0.0]]),), ZeroKind.SLICE),
    "one_hot_labels": (
        one_hot_labels,
        (jnp.array([[0.0, 0.5, 0.5], [0.2, 0.0, 0.8]]),),
        ZeroKind.CONSTANT,
    ),
    "vanishing_square": (vanishing_square, (jnp.array([0.0, 1.0]),), ZeroKind.DERIVATIVE),
    "underflow_exp": (underflow_exp, (jnp.array([200.0, 300.0]),), ZeroKind.UNDERFLOW),
    "nan_to_num_log": (nan_to_num_log, (jnp.array([0.0, 1.0]),), ZeroKind.NAN_TO_NUM),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_zero_source_line_and_kind(name):
    fun, args, kind = CASES[name]
    report = gsj.explain(jax.grad(fun))(*args)
    assert not report.ok, name
    f = report.findings[0]
    assert f.where is not None and f.where.line == line_of(f"O:{name}"), str(report)
    try:
        zline = line_of(f"Z:{name}")
    except LookupError:  # the zero is made on the origin's own line
        zline = line_of(f"O:{name}")
    assert f.zero_from is not None and f.zero_from.line == zline, str(report)
    assert f.detail.get("zero_kind") == kind.value, str(report)


INLINED = {"padding_log1p": "(x < 1.0)"}
WHERE_TRAPS = ["where_log", "where_sqrt", "where_div", "where_arctan2", "padding_log1p"]


@pytest.mark.parametrize("name", WHERE_TRAPS)
def test_where_trap_is_its_own_explanation_with_the_double_where_first(name):
    fun, args, _ = CASES[name]
    report = gsj.explain(jax.grad(fun))(*args)
    f = report.findings[0]
    assert f.detail.get("zero_entry") == "where-trap"
    assert "unselected" in f.title and "zero cotangent" in f.explanation.replace("\n", " ")
    assert f.suggestions[0].startswith("Double where")
    code = f.zero_from.code
    cond = code[code.index("jnp.where(") + len("jnp.where(") :].split(",")[0]
    # a condition assigned after the op's line moves up as its definition (`pad` would not
    # exist yet there)
    cond = INLINED.get(name, cond)
    assert f"jnp.where({cond}, " in f.suggestions[0], f.suggestions[0]
    assert "# verified" in f.suggestions[0] or "# not verified" in f.suggestions[0]
    assert "did not select this branch" in str(report)


def test_a_zero_that_is_not_a_where_keeps_the_operations_explanation():
    fun, args, _ = CASES["mask_product"]
    f = gsj.explain(jax.grad(fun))(*args).findings[0]
    assert f.detail.get("zero_entry") is None and f.catalog_id == "sqrt-at-zero"
    assert "multiplies by a mask" in f.detail["met_text"]


def sqrt_of(x):
    return jnp.sum(jnp.sqrt(x))


def test_why_tells_a_real_negative_from_rounding():
    real = gsj.explain(jax.grad(sqrt_of))(jnp.array([-4.0, 1.0])).findings[0]
    tiny = gsj.explain(jax.grad(sqrt_of))(jnp.array([-1e-9, 1.0])).findings[0]
    assert real.catalog_id == tiny.catalog_id == "sqrt-of-negative"
    assert real.explanation.startswith("Here sqrt got -4.0: a real negative value")
    assert tiny.explanation.startswith("Here sqrt got -1e-09: a negative of rounding size")


def test_why_says_a_masked_zero_is_by_design_and_an_underflow_is_not():
    fun, args, _ = CASES["mask_product"]
    PAD = jnp.array([1.0, 0.0])

    def masked_log(p):
        return jnp.sum(jnp.log(p) * PAD)

    f = gsj.explain(jax.grad(masked_log))(jnp.array([0.5, 0.0])).findings[0]
    assert f.explanation.startswith("Here the 0 that reaches log is excluded by design (a mask)")
    fun, args, _ = CASES["underflow_exp"]
    f = gsj.explain(jax.grad(fun))(*args).findings[0]
    assert f.explanation.startswith("Here the zero factor is a value that underflowed")


def masked_by_argument(x, m):
    y = jnp.log(x)  # O:masked_by_argument
    return jnp.sum(y * m)  # Z:masked_by_argument


def squared_input(x, m):
    return jnp.sum(jnp.sqrt(x * x) * m)  # O:squared_input


def test_a_mask_passed_as_a_differentiated_argument_is_a_mask_not_a_derivative():
    x, m = jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0])
    report = gsj.explain(jax.grad(masked_by_argument, argnums=(0, 1)))(x, m)
    f = next(f for f in report.findings if f.form)
    assert f.where.line == line_of("O:masked_by_argument")
    assert f.zero_from.line == line_of("Z:masked_by_argument")
    assert f.detail["zero_kind"] == ZeroKind.INPUT_MASK.value
    assert f.detail["met_text"].startswith(
        "`y * m` multiplies by the input `m`, which is 0 here: a mask passed as an argument"
    )
    assert "the derivative of" not in f.detail["met_text"]


def test_a_constant_mask_and_a_vanishing_derivative_keep_their_kinds():
    # the same zero through an input the inf was computed from: the derivative of x * x
    x, m = jnp.array([0.0, 1.0]), jnp.array([1.0, 1.0])
    f = gsj.explain(jax.grad(squared_input, argnums=(0, 1)))(x, m).findings[0]
    assert f.detail["zero_kind"] == ZeroKind.DERIVATIVE.value, str(f)
    fun, args, _ = CASES["mask_product"]  # a captured constant: MASK
    f = gsj.explain(jax.grad(fun))(*args).findings[0]
    assert f.detail["zero_kind"] == ZeroKind.MASK.value
