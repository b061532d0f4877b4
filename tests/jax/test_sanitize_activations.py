"""Issue 15: jax.nn's piecewise activations at their corners, under sanitize.

They are jnp.where selections (leaky_relu, elu, selu, hard_tanh) or relu6 = min(max(x, 0), 6)
inside a custom_jvp (relu6, hard_sigmoid, hard_swish): the call is reported as the catalog's
activation-corner at the user's line (eager and under jit), with the activation's one-sided
slopes at the corner and JAX's value in the interval between them; nothing away from the
corners, and nothing where the two one-sided slopes agree (elu with alpha = 1, celu). A where
the user wrote is reported as a where."""

import jax
import jax.numpy as jnp
import pytest

import gradsan.jax as gsj
from tests.conftest import line_of

W = jnp.array([1.0, 2.0, 3.0])

SELU_SCALE, SELU_ALPHA = 1.0507009873554805, 1.6732632423543772

# name, activation, input with a corner at element 0, the library name, the one-sided slopes
CORNERS = [
    ("leaky_relu", lambda x: jax.nn.leaky_relu(x, 0.1), [0.0, 1.0, -1.0], "leaky_relu", (0.1, 1)),
    ("elu 0.5", lambda x: jax.nn.elu(x, 0.5), [0.0, 1.0, -1.0], "elu", (0.5, 1)),
    ("selu", jax.nn.selu, [0.0, 1.0, -1.0], "selu", (SELU_SCALE * SELU_ALPHA, SELU_SCALE)),
    ("hard_tanh", jax.nn.hard_tanh, [-1.0, 0.0, 2.0], "hard_tanh", (0, 1)),
    ("relu6 0", jax.nn.relu6, [0.0, 1.0, 2.0], "relu6", (0, 1)),
    ("relu6 6", jax.nn.relu6, [6.0, 1.0, 2.0], "relu6", (1, 0)),
    ("hard_swish -3", jax.nn.hard_swish, [-3.0, 1.0, 2.0], "hard_silu", (0, -0.5)),
    ("hard_swish 3", jax.nn.hard_swish, [3.0, 1.0, 2.0], "hard_silu", (1.5, 1)),
    ("hard_sigmoid -3", jax.nn.hard_sigmoid, [-3.0, 1.0, 2.0], "hard_sigmoid", (0, 1 / 6)),
]


def _sanitize(act, x0, jit=False):
    step = jax.grad(lambda x: jnp.sum(act(x) * W))  # the step
    return gsj.sanitize(jax.jit(step) if jit else step)(jnp.array(x0))


def _check_corner(report, act, x0, lib, slopes):
    (f,) = [f for f in report.findings if f.kind == "kink"]
    assert f.catalog_id == "activation-corner"
    assert f.primitive == f"jax.nn.{lib}"
    # the user's line: the lambda that calls the activation, else the step that calls it
    lam = getattr(act, "__name__", "") == "<lambda>"
    assert f.where.line == (act.__code__.co_firstlineno if lam else line_of("the step"))
    assert f.where.file == __file__
    assert f.index == (0,) and f.count == 1
    assert f.detail["corner"] == x0[0]
    assert f.detail["slopes"] == pytest.approx(slopes)
    lo, hi = min(slopes), max(slopes)
    assert f.detail["subdifferential"].startswith(f"[{lo:.6g}, {hi:.6g}] (the one-sided slopes")
    assert f"jax.nn.{lib}" in f.detail["subdifferential"]
    left, right = slopes
    assert f"slope {left:.6g} left of {x0[0]:g}, {right:.6g} right" in f.detail["derivative"]
    # JAX's value is the gradient jax.grad returns there, and it lies between the slopes
    g = float(jax.grad(lambda x: jnp.sum(act(x) * W))(jnp.array(x0))[0]) / float(W[0])
    assert float(f.detail["value"]) == pytest.approx(g, abs=1e-6)
    assert f.detail["admissible"] is True and lo - 1e-6 <= g <= hi + 1e-6


@pytest.mark.parametrize("case", CORNERS, ids=[c[0] for c in CORNERS])
def test_activation_at_its_corner_is_flagged(case):
    _, act, x0, lib, slopes = case
    _check_corner(_sanitize(act, x0), act, x0, lib, slopes)


JIT_CORNERS = [c for c in CORNERS if c[0] in ("leaky_relu", "selu", "hard_swish 3")]


@pytest.mark.parametrize("case", JIT_CORNERS, ids=[c[0] for c in JIT_CORNERS])
def test_activation_corner_under_jit(case):
    _, act, x0, lib, slopes = case
    _check_corner(_sanitize(act, x0, jit=True), act, x0, lib, slopes)


def test_user_written_where_keeps_the_where_words():
    """A leaky relu the user wrote with jnp.where is no library activation: the where at its
    boundary is what it is (its branches meet with different slopes)."""
    report = _sanitize(lambda x: jnp.where(x > 0, x, 0.01 * x), [0.0, 1.0, -1.0])  # user where
    (f,) = report.findings
    assert f.catalog_id == "where-at-boundary" and f.primitive == "select_n"
    assert f.where.line == line_of("user where")


OFF_CORNER = [
    ("leaky_relu", lambda x: jax.nn.leaky_relu(x, 0.1), [0.5, 1.0, -1.0]),
    ("elu 0.5", lambda x: jax.nn.elu(x, 0.5), [0.5, 1.0, -1.0]),
    ("selu", jax.nn.selu, [0.5, 1.0, -1.0]),
    ("relu6", jax.nn.relu6, [5.9, 0.1, -1.0]),
    ("hard_swish", jax.nn.hard_swish, [-2.9, 2.9, 0.0]),
]


@pytest.mark.parametrize("case", OFF_CORNER, ids=[c[0] for c in OFF_CORNER])
def test_no_finding_away_from_a_corner(case):
    _, act, x0 = case
    assert _sanitize(act, x0).findings == []


@pytest.mark.parametrize(
    "act", [jax.nn.elu, lambda x: jax.nn.celu(x, 0.5)], ids=["elu alpha=1", "celu 0.5"]
)
def test_slopes_that_agree_at_the_corner_are_counted_not_flagged(act):
    report = _sanitize(act, [0.0, 1.0, -1.0])
    assert report.findings == []
    (note,) = report.notes
    assert "checked and left out" in note


@pytest.mark.parametrize("x0", [0.0, 6.0], ids=["at 0", "at 6"])
def test_relu6_value_is_its_custom_rules(x0):
    """relu6 = min(max(x, 0), 6) under a custom_jvp: the value reported is JAX's gradient
    (the rule's: 0.0 at both corners), not the inner max/min's tie split (0.5)."""
    report = _sanitize(jax.nn.relu6, [x0, 1.0, 2.0])
    (f,) = report.findings
    assert float(f.detail["value"]) == float(jax.grad(jax.nn.relu6)(x0)) == 0.0
    assert "custom_jvp rule" in f.detail["rule"]
