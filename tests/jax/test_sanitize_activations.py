"""Issue 15: jax.nn's piecewise activations at their corners, under sanitize.

They are jnp.where selections (leaky_relu, elu, selu, hard_tanh) or relu6 = min(max(x, 0), 6)
inside a custom_jvp (relu6, hard_sigmoid, hard_swish): flagged at the user's line when the
gradient goes through a corner, with JAX's value in the admissible set; nothing away from the
corners, and nothing where the two one-sided slopes agree (elu with alpha = 1, celu)."""

import jax
import jax.numpy as jnp
import pytest

import gradsan.jax as gsj
from tests.conftest import line_of

W = jnp.array([1.0, 2.0, 3.0])

# name, activation, input with a corner at element 0, expected entry
CORNERS = [
    ("leaky_relu", lambda x: jax.nn.leaky_relu(x, 0.1), [0.0, 1.0, -1.0], "where-at-boundary"),
    ("elu 0.5", lambda x: jax.nn.elu(x, 0.5), [0.0, 1.0, -1.0], "where-at-boundary"),
    ("selu", jax.nn.selu, [0.0, 1.0, -1.0], "where-at-boundary"),
    ("hard_tanh", jax.nn.hard_tanh, [-1.0, 0.0, 2.0], "where-at-boundary"),
    ("relu6 0", jax.nn.relu6, [0.0, 1.0, 2.0], "relu-at-zero"),
    ("relu6 6", jax.nn.relu6, [6.0, 1.0, 2.0], "max-tie"),
    ("hard_swish -3", jax.nn.hard_swish, [-3.0, 1.0, 2.0], "relu-at-zero"),
    ("hard_swish 3", jax.nn.hard_swish, [3.0, 1.0, 2.0], "max-tie"),
    ("hard_sigmoid -3", jax.nn.hard_sigmoid, [-3.0, 1.0, 2.0], "relu-at-zero"),
]


def _sanitize(act, x0):
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(act(x) * W)))(jnp.array(x0))  # the step


@pytest.mark.parametrize("case", CORNERS, ids=[c[0] for c in CORNERS])
def test_activation_at_its_corner_is_flagged(case):
    _, act, x0, entry = case
    report = _sanitize(act, x0)
    (f,) = [f for f in report.findings if f.kind == "kink"]
    assert f.catalog_id == entry
    # the user's line: the lambda that calls the activation, else the step that calls it
    lam = getattr(act, "__name__", "") == "<lambda>"
    assert f.where.line == (act.__code__.co_firstlineno if lam else line_of("the step"))
    assert f.index == (0,) and f.count >= 1  # elu/selu: the inner double-where counts too
    assert f.detail["admissible"] is True and f.detail["subdifferential"]


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
