"""gradsan.jax.sanitize: explain's findings plus every kink, with JAX's convention there."""

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradsan.jax as gsj
from tests.conftest import line_of


def kinks(report):
    return [f for f in report.findings if f.kind in ("kink", "convention")]


def one(report, entry_id):
    found = [f for f in kinks(report) if f.catalog_id == entry_id]
    assert len(found) == 1, [f.catalog_id for f in report.findings]
    return found[0]


def test_abs_at_zero(maybe_jit):
    def loss(x):
        return jnp.sum(jnp.abs(x))  # abs-line

    r = gsj.sanitize(maybe_jit(jax.grad(loss)))(jnp.array([1.0, 0.0, 0.0]))
    f = one(r, "abs-at-zero")
    assert f.where.line == line_of("abs-line")
    assert (f.count, f.size, f.index) == (2, 3, (1,))
    assert f.detail["value"] == "1.0" and f.detail["admissible"] is True
    assert f.detail["subdifferential"] == "[-1, 1]"
    np.testing.assert_array_equal(r.outputs, jax.grad(loss)(jnp.array([1.0, 0.0, 0.0])))


def test_relu_custom_jvp_and_maximum():
    r = gsj.sanitize(jax.grad(lambda x: jax.nn.relu(x)))(0.0)
    assert one(r, "relu-at-zero").detail["value"] == "0.0"
    r = gsj.sanitize(jax.grad(lambda x: jnp.maximum(x, 0.0)))(0.0)
    assert one(r, "relu-at-zero").detail["value"] == "0.5"


def test_max_tie_and_backward_selects_are_not_flagged():
    r = gsj.sanitize(jax.grad(lambda x: jnp.maximum(x, 1.0)))(1.0)
    assert [f.catalog_id for f in r.findings] == ["relu-at-zero"] or [
        f.catalog_id for f in r.findings
    ] == ["max-tie"]
    r = gsj.sanitize(jax.grad(lambda x, y: jnp.maximum(x, y)))(1.0, 1.0)
    f = one(r, "max-tie")
    assert f.detail["value"] == "(0.5, 0.5)" and f.detail["admissible"]
    assert f.detail["tie"] == "non-trivial"


def test_trivial_tie_is_counted_not_reported():
    # issue 15: tied candidates that are the same function leave the gradient exact: counted
    # in the summary note, no finding
    r = gsj.sanitize(jax.grad(lambda x: jnp.maximum(2 * x, x + x)))(1.5)
    assert kinks(r) == [] and any("1 same function" in n for n in r.notes), r.notes
    # identical max-pool patches: the same function of the weights
    w0 = jnp.array([0.5, -1.0])
    img = jnp.array([1.0, 2.0, 1.0, 2.0])

    def pool(w):
        feats = jnp.stack([w @ img[0:2], w @ img[2:4]])
        return jnp.max(feats)

    r = gsj.sanitize(jax.grad(pool), argnums=0)(w0)
    assert kinks(r) == [] and any("checked and left out" in n for n in r.notes), r.notes


def test_constant_tie_is_not_a_kink():
    r = gsj.sanitize(jax.grad(lambda x: jnp.max(jnp.ones(3)) * x + jnp.abs(jnp.zeros(2)).sum()))(
        2.0
    )
    assert kinks(r) == []


def test_clip_where_sort_reductions():
    cases = [
        (lambda x: jnp.clip(x, 0.0, 1.0), 0.0, "clip-at-bound"),
        (lambda x: jnp.where(x > 0, x, 2 * x), 0.0, "where-at-boundary"),
        (lambda x: jnp.sort(x)[-1], jnp.array([3.0, 1.0, 3.0]), "sort-tie"),
        (lambda x: jax.lax.top_k(x, 1)[0][0], jnp.array([3.0, 1.0, 3.0]), "sort-tie"),
        (lambda x: jnp.max(x), jnp.array([1.0, 1.0, 0.0]), "max-tie"),
        (lambda x: jnp.min(x), jnp.array([0.0, 1.0, 0.0]), "max-tie"),
        (lambda x: jax.lax.cummax(x)[-1], jnp.array([1.0, 1.0, 0.0]), "max-tie"),
        (lambda x: x[jnp.argmax(x)], jnp.array([1.0, 1.0, 0.0]), "max-tie"),
        (lambda x: jnp.hypot(x, x), 0.0, "hypot-at-origin"),
    ]
    for f, x, entry in cases:
        r = gsj.sanitize(jax.grad(f))(x)
        assert entry in {g.catalog_id for g in kinks(r)}, (entry, r.findings)
        for g in kinks(r):
            assert g.detail["admissible"] is True, (entry, g.detail)


def test_where_with_a_jump_is_inadmissible():
    r = gsj.sanitize(jax.grad(lambda x: jnp.where(x > 0, x + 1.0, x)))(0.0)
    f = one(r, "where-at-boundary")
    assert f.detail["admissible"] is False and f.detail["branches_agree"] is False


def test_jumps_are_blocked():
    for f, x in [
        (jnp.floor, 2.0),
        (jnp.ceil, 2.0),
        (jnp.round, 0.5),
        (jnp.sign, 0.0),
        (lambda x: x.astype(jnp.int32).astype(jnp.float32), 2.0),
    ]:
        r = gsj.sanitize(jax.grad(lambda x, f=f: f(x) * x))(x)
        (k,) = kinks(r)
        assert k.detail["blocked"] is True and k.detail["admissible"] is False


def test_atan2_origin_is_an_inadmissible_convention():
    r = gsj.sanitize(jax.grad(lambda x: jnp.arctan2(x, 2 * x)))(0.0)
    (f,) = [f for f in r.findings if f.kind == "convention"]
    assert f.catalog_id == "atan2-at-origin" and f.detail["admissible"] is False


def test_eigh_repeated():
    # the largest of a repeated eigenvalue, along any symmetric direction: depends on the choice
    r = gsj.sanitize(jax.grad(lambda a: jnp.linalg.eigvalsh(a)[-1]))(jnp.eye(3))
    assert one(r, "eigh-repeated-eigenvalues").detail["admissible"] is True
    # s * I moves all three eigenvalues alike (issue 15: counted, no flag)
    r = gsj.sanitize(jax.grad(lambda s: jnp.linalg.eigvalsh(s * jnp.eye(3))[-1]))(1.0)
    assert kinks(r) == [] and any("checked and left out" in n for n in r.notes), r.notes


def test_explain_findings_are_kept():
    # (sqrt(x) * abs(x) would hide the kink: its downstream is multiplied by sqrt(0) = 0)
    r = gsj.sanitize(jax.grad(lambda x: jnp.sqrt(x) + jnp.abs(x)))(0.0)
    ids = {f.catalog_id for f in r.findings}
    assert "abs-at-zero" in ids and any(f.kind == "nonfinite" for f in r.findings)


def test_ignore():
    r = gsj.sanitize(jax.grad(lambda x: jnp.abs(x)), ignore=("abs-at-zero",))(0.0)
    assert r.findings == []


# -- G2: no flags means exact --------------------------------------------------------------

UNARY = ["sin", "exp", "abs", "relu", "neg"]
BINARY = ["add", "mul", "maximum", "where"]


def _program(draw_ops):
    """A random expression over x0, x1, x2 (a list of ops applied to a growing value list)."""

    def jf(x):
        vals = [x[0], x[1], x[2]]
        for op, i, j in draw_ops:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            vals.append(
                {
                    "sin": lambda: jnp.sin(a),
                    "exp": lambda: jnp.exp(0.3 * a),
                    "abs": lambda: jnp.abs(a),
                    "relu": lambda: jax.nn.relu(a),
                    "neg": lambda: -a,
                    "add": lambda: a + b,
                    "mul": lambda: a * b,
                    "maximum": lambda: jnp.maximum(a, b),
                    "where": lambda: jnp.where(a > b, a * b, a + b),
                }[op]()
            )
        return vals[-1]

    def mf(x):
        vals = list(x)
        for op, i, j in draw_ops:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            vals.append(
                {
                    "sin": lambda: mpmath.sin(a),
                    "exp": lambda: mpmath.exp(0.3 * a),
                    "abs": lambda: abs(a),
                    "relu": lambda: max(a, 0),
                    "neg": lambda: -a,
                    "add": lambda: a + b,
                    "mul": lambda: a * b,
                    "maximum": lambda: max(a, b),
                    "where": lambda: a * b if a > b else a + b,
                }[op]()
            )
        return vals[-1]

    return jf, mf


ops_strategy = st.lists(
    st.tuples(st.sampled_from(UNARY + BINARY), st.integers(0, 10), st.integers(0, 10)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    ops=ops_strategy,
    x=st.lists(st.sampled_from([-1.5, -0.5, 0.0, 0.25, 1.0, 2.0]), min_size=3, max_size=3),
)
def test_g2_no_flags_means_exact(ops, x):
    jf, mf = _program(ops)
    with jax.enable_x64(True):
        x0 = jnp.asarray(x, jnp.float64)
        report = gsj.sanitize(jax.grad(jf))(x0)
        g = np.asarray(report.outputs)
    if report.findings:
        return
    mpmath.mp.dps = 50
    h = mpmath.mpf("1e-20")
    for i in range(3):
        xp = [mpmath.mpf(v) for v in x]
        xm = [mpmath.mpf(v) for v in x]
        xp[i] += h
        xm[i] -= h
        d = (mf(xp) - mf(xm)) / (2 * h)
        assert abs(float(d) - g[i]) <= 1e-9 * max(1.0, abs(float(d))), (ops, x, i, float(d), g)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=ops_strategy, x=st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=3, max_size=3))
def test_g2_kinks_are_flagged(ops, x):
    """Evaluate at a point where some kink primitive sits exactly at its kink: a flag is raised
    when the gradient depends on it (a one-sided mpmath quotient differs from AD's value), and
    none when every one-sided derivative is AD's (issue 15: G2 both ways)."""
    jf, mf = _program(ops)
    with jax.enable_x64(True):
        x0 = jnp.asarray(x, jnp.float64)
        report = gsj.sanitize(jax.grad(jf))(x0)
        g = np.asarray(report.outputs, np.float64)
    mpmath.mp.dps = 50
    vals = [mpmath.mpf(v) for v in x]
    at_kink = False
    for op, i, j in ops:
        a, b = vals[i % len(vals)], vals[j % len(vals)]
        # where(a > a, ...) compares a value with itself: constant, no boundary
        same = i % len(vals) == j % len(vals)
        if (
            op in ("abs", "relu")
            and a == 0
            or op == "maximum"
            and a == b
            or op == "where"
            and a == b
            and not same
        ):
            at_kink = True
        vals.append(
            {
                "sin": lambda: mpmath.sin(a),
                "exp": lambda: mpmath.exp(0.3 * a),
                "abs": lambda: abs(a),
                "relu": lambda: max(a, 0),
                "neg": lambda: -a,
                "add": lambda: a + b,
                "mul": lambda: a * b,
                "maximum": lambda: max(a, b),
                "where": lambda: a * b if a > b else a + b,
            }[op]()
        )
    if not at_kink:
        return
    h = mpmath.mpf("1e-25")
    f0 = mf([mpmath.mpf(v) for v in x])
    depends = False
    for d in ([1, 0, 0], [0, 1, 0], [0, 0, 1], [0.3, -0.7, 0.5]):
        ad = float(np.dot(g, d))
        for s in (1, -1):
            xs = [mpmath.mpf(v) + s * h * mpmath.mpf(di) for v, di in zip(x, d)]
            q = float(s * (mf(xs) - f0) / h)
            if abs(q - ad) > 1e-6 * max(1.0, abs(q)):
                depends = True
    if depends:
        assert kinks(report), (ops, x)
    else:
        assert not kinks(report), (ops, x, [f.catalog_id for f in report.findings])
