"""gradsan.jax.certify on conv_general_dilated, cumprod, reduce_prod, cummax/cummin and top_k:
exact series rules (no "unverified" fallback), checked against analytic limits, against
jax.grad at non-singular points, and against jax.grad at the point where it is smooth."""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from gradsan.jax.certify._hull import min_norm_hull  # noqa: E402
from tests.jax._certify_util import WRAPS, assert_kink, ray_grads, run  # noqa: E402


def jgrad(f, x):
    with jax.enable_x64(True):
        g = jax.jit(jax.grad(f))(jax.tree_util.tree_map(jnp.asarray, x))
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(g)]


def leaves(x):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(x)]


def assert_leaves(got, want, rtol=1e-12, atol=1e-12):
    got, want = leaves(got), leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def conv1(x, w, **kw):
    """A 1-D, one-channel convolution (cross-correlation) of two vectors."""
    return jax.lax.conv_general_dilated(x[None, None], w[None, None], (1,), "VALID", **kw)[0, 0]


# -- conv_general_dilated ---------------------------------------------------------------------

XD = np.array([1.0, 2.0, 3.0, 4.0])


def conv_norm(w):
    return jnp.sqrt(jnp.sum(conv1(jnp.asarray(XD, w.dtype), w) ** 2))


@pytest.mark.parametrize("wrap", WRAPS)
def test_conv_norm_at_zero_weights_is_a_kink(wrap):
    # |A w| at w = 0, A the convolution with XD: along w = t v the gradient is A^T A v / |A v|
    # (homogeneous of degree 0, so jax.grad at v itself), opposite on -v: a Clarke subgradient
    v = np.array([0.6, -0.8])
    _, d = run(wrap(conv_norm), np.zeros(2), [v, -v])
    assert [r["verdict"] for r in d["verdicts"]] == ["DEFINED", "DEFINED"]
    A = np.array([[XD[i + k] for k in range(2)] for i in range(3)])
    want = A.T @ (A @ v) / np.linalg.norm(A @ v)
    g1, g2 = ray_grads(d)
    np.testing.assert_allclose(g1[0], want, rtol=1e-12)
    np.testing.assert_allclose(g2[0], -want, rtol=1e-12)
    np.testing.assert_allclose(g1[0], jgrad(conv_norm, v)[0], rtol=1e-12)
    assert d["label"] == "clarke-subgradient"
    r, _ = run(wrap(conv_norm), np.zeros(2), [v, -v])
    np.testing.assert_allclose(r.outputs, 0.0, atol=1e-15)


@pytest.mark.parametrize("wrap", WRAPS)
def test_conv_smooth_is_jax_grad(wrap):
    rng = np.random.default_rng(0)
    p = (rng.standard_normal(9), rng.standard_normal(3))

    def loss(p):
        y = jax.lax.conv_general_dilated(p[0][None, None], p[1][None, None], (2,), [(2, 1)])
        return jnp.sum(y**2) + jnp.sum(y[..., :-1] * y[..., 1:])

    r, d = run(wrap(loss), p)
    assert d["label"] == "gradient"
    assert_leaves(r.outputs, jgrad(loss, p))


@pytest.mark.parametrize("wrap", WRAPS)
def test_conv_zero_output_finite_limit_where_jax_is_nan(wrap):
    # conv(x0, w) = 0 for x0 = ones and w = [1, -1]; s(x) = sum(conv^2) is O(t^2), so
    # sqrt(s)^3 is O(t^3): the gradient is that of sum(x) alone, but jax.grad is NaN (0 * inf)
    def loss(x):
        s = jnp.sum(conv1(x, jnp.array([1.0, -1.0], x.dtype)) ** 2)
        return jnp.sum(x) + s * jnp.sqrt(s)

    x0 = np.ones(5)
    assert np.isnan(jgrad(loss, x0)[0]).all()
    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, np.ones(5), rtol=0, atol=1e-15)


@pytest.mark.parametrize("wrap", WRAPS)
def test_convolve_norm_at_zero(wrap):
    # jnp.convolve (rev + a padded conv): |x * k| at x = 0, per ray the gradient at v itself
    def loss(x):
        return jnp.sqrt(jnp.sum(jnp.convolve(x, jnp.array([1.0, -2.0, 0.5], x.dtype)) ** 2))

    v = np.array([0.3, -0.5, 0.2, 0.7])
    _, d = run(wrap(loss), np.zeros(4), [v, -v])
    g1, g2 = ray_grads(d)
    np.testing.assert_allclose(g1[0], jgrad(loss, v)[0], rtol=1e-12)
    np.testing.assert_allclose(g2[0], jgrad(loss, -v)[0], rtol=1e-12)
    assert d["label"] == "clarke-subgradient"


def conv2d(x, w, **kw):
    return jax.lax.conv_general_dilated(
        x, w, kw.pop("strides", (1, 1)), kw.pop("padding", "VALID"), **kw
    )


CONV2D = [  # (lhs shape, rhs shape, conv keyword arguments)
    pytest.param(
        (2, 4, 6, 5),
        (6, 2, 3, 2),
        dict(strides=(2, 1), padding=[(1, 0), (0, 1)], feature_group_count=2, rhs_dilation=(1, 2)),
        id="NCHW-grouped-strided-padded-dilated",
    ),
    pytest.param(
        (2, 3, 5, 4),
        (2, 3, 2, 2),
        dict(padding=[(1, 1), (0, 1)], lhs_dilation=(2, 1)),
        id="NCHW-lhs-dilation",
    ),
    pytest.param(
        (4, 5, 5, 3),
        (2, 2, 3, 2),
        dict(dimension_numbers=("NHWC", "HWIO", "NHWC"), batch_group_count=2),
        id="NHWC-batch-groups",
    ),
]


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("ls,rs,kw", CONV2D)
def test_conv2d_smooth_is_jax_grad(wrap, ls, rs, kw):
    rng = np.random.default_rng(1)
    p = (rng.standard_normal(ls), rng.standard_normal(rs))

    def loss(p):
        return jnp.sum(jnp.tanh(conv2d(p[0], p[1], **dict(kw))))

    r, d = run(wrap(loss), p)
    assert d["label"] == "gradient"
    assert_leaves(r.outputs, jgrad(loss, p), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("ls,rs,kw", CONV2D[:1])
def test_conv2d_norm_at_zero_weights(ls, rs, kw):
    # |conv(x, w)| at w = 0 (x fixed data): per ray the gradient at v itself (degree 0)
    rng = np.random.default_rng(2)
    x = rng.standard_normal(ls)

    def loss(w):
        return jnp.sqrt(jnp.sum(conv2d(jnp.asarray(x, w.dtype), w, **dict(kw)) ** 2))

    v = rng.standard_normal(rs)
    _, d = run(loss, np.zeros(rs), [v, -v])
    g1, g2 = ray_grads(d)
    np.testing.assert_allclose(g1[0], jgrad(loss, v)[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g2[0], jgrad(loss, -v)[0], rtol=1e-10, atol=1e-12)
    assert d["label"] == "clarke-subgradient"


# -- cumprod and reduce_prod -------------------------------------------------------------------

X0 = np.array([0.0, 2.0, 3.0])


@pytest.mark.parametrize("wrap", WRAPS)
def test_cumprod_norm_with_a_zero_entry(wrap):
    # sqrt(sum(cumprod(x)^2)) = |x0| sqrt(1 + x1^2 + x1^2 x2^2): jax.grad is NaN at x0 = 0;
    # along x0 + t v the gradient tends to (sign(v0) sqrt(41), 0, 0)
    def loss(x):
        return jnp.sqrt(jnp.sum(jnp.cumprod(x) ** 2))

    assert np.isnan(jgrad(loss, X0)[0]).any()
    v = np.array([0.6, -0.48, 0.64])
    r, d = run(wrap(loss), X0, [v, -v])
    g1, g2 = ray_grads(d)
    want = np.array([math.sqrt(41.0), 0.0, 0.0])
    np.testing.assert_allclose(g1[0], want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(g2[0], -want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(g1[0], jgrad(loss, X0 + 1e-9 * v)[0], rtol=1e-7, atol=1e-7)
    assert d["label"] == "clarke-subgradient"
    np.testing.assert_allclose(r.outputs, 0.0, atol=1e-15)


@pytest.mark.parametrize("wrap", WRAPS)
def test_cumprod_fourth_power_has_a_zero_gradient(wrap):
    # sqrt(sum(cumprod(x)^4)) = x0^2 sqrt(...): differentiable with gradient 0 at x0 = 0
    def loss(x):
        return jnp.sqrt(jnp.sum(jnp.cumprod(x) ** 4))

    assert np.isnan(jgrad(loss, X0)[0]).any()
    r, d = run(wrap(loss), X0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, 0.0, atol=1e-15)


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("reverse", [False, True])
def test_cumprod_smooth_is_jax_grad(wrap, reverse):
    x0 = np.array([[0.0, 2.0, -1.5, 0.0], [1.5, 0.5, 3.0, -2.0]])
    c = np.arange(8.0).reshape(2, 4) - 3.0

    def loss(x):
        y = jax.lax.cumprod(x, axis=1, reverse=reverse)
        return jnp.sum(jnp.asarray(c, x.dtype) * y) + jnp.sum(jax.lax.cumprod(x, axis=0) ** 2)

    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    assert_leaves(r.outputs, jgrad(loss, x0))


@pytest.mark.parametrize("wrap", WRAPS)
def test_reduce_prod_norm_with_a_zero_entry(wrap):
    # sqrt(prod(x)^2 + x0^2) = |x0| sqrt(x1^2 x2^2 + 1): the limits are (+-sqrt(37), 0, 0)
    def loss(x):
        return jnp.sqrt(jnp.prod(x) ** 2 + x[0] ** 2)

    assert np.isnan(jgrad(loss, X0)[0]).any()
    v = np.array([-0.6, 0.48, 0.64])
    r, d = run(wrap(loss), X0, [v, -v])
    g1, g2 = ray_grads(d)
    want = np.array([-math.sqrt(37.0), 0.0, 0.0])
    np.testing.assert_allclose(g1[0], want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(g2[0], -want, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(g1[0], jgrad(loss, X0 + 1e-9 * v)[0], rtol=1e-7, atol=1e-7)
    assert d["label"] == "clarke-subgradient"


@pytest.mark.parametrize("wrap", WRAPS)
def test_reduce_prod_two_zeros_is_differentiable(wrap):
    # sqrt(prod(x)^2) = 3 |x0 x1| near (0, 0, 3): O(|x|^2), gradient 0; jax.grad is NaN
    def loss(x):
        return jnp.sqrt(jnp.prod(x) ** 2)

    x0 = np.array([0.0, 0.0, 3.0])
    assert np.isnan(jgrad(loss, x0)[0]).any()
    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, 0.0, atol=1e-15)


@pytest.mark.parametrize("wrap", WRAPS)
def test_reduce_prod_smooth_is_jax_grad(wrap):
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((3, 2, 4))
    x0[1, 0, 2] = 0.0
    x0[2, 1, 1] = 0.0
    x0[2, 1, 3] = 0.0

    def loss(x):
        return (
            jnp.sum(jnp.prod(x, axis=(0, 2)) ** 2)
            + jnp.sum(jnp.sin(jnp.prod(x, axis=1)))
            + jnp.prod(x[0])
        )

    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    assert_leaves(r.outputs, jgrad(loss, x0))


# -- cummax and cummin ---------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", WRAPS)
def test_cummax_strict_order_is_jax_grad(wrap):
    def loss(x):
        return jnp.sum(jax.lax.cummax(x, axis=0) ** 2)

    x0 = np.array([1.0, 3.0, 2.0])
    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, [2.0, 12.0, 0.0], rtol=1e-15)
    assert_leaves(r.outputs, jgrad(loss, x0))


@pytest.mark.parametrize("wrap", WRAPS)
def test_cummin_reverse_2d_is_jax_grad(wrap):
    x0 = np.array([[0.5, -1.0, 2.0, 0.0], [3.0, 1.0, 4.0, -2.0]])

    def loss(x):
        return jnp.sum(jnp.exp(jax.lax.cummin(x, axis=1, reverse=True)) * x)

    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    assert_leaves(r.outputs, jgrad(loss, x0))


@pytest.mark.parametrize("wrap", WRAPS)
def test_cummax_tie_is_a_clarke_subgradient(wrap):
    # cummax([1, 3, 3]): the last output is max(x1, x2), a kink. The ray v (v1 > v2) keeps x1,
    # -v takes x2: gradients (1, 2, 0) and (1, 1, 1), as jax.grad at the nearby points
    def loss(x):
        return jnp.sum(jax.lax.cummax(x, axis=0))

    x0 = np.array([1.0, 3.0, 3.0])
    v = np.array([0.3, 0.5, -0.8])
    r, d = run(wrap(loss), x0, [v, -v])
    assert_kink(r, d, loss, x0, v, [1.0, 2.0, 0.0], [1.0, 1.0, 1.0])


def test_cummax_tie_up_to_the_horizon_is_undecided():
    # sin(x)^2 + cos(x)^2 ties 1 in every known term: no silent pick
    def loss(x):
        return jnp.sum(
            jax.lax.cummax(jnp.stack([jnp.ones(()), jnp.sin(x) ** 2 + jnp.cos(x) ** 2, x]), axis=0)
        )

    _, d = run(loss, 0.3)
    assert d["label"] == "undecided"


def test_cummax_later_winner_is_decided_after_an_undecided_tie():
    # the tie above, then a clearly larger element: that output is decided again
    def loss(x):
        t = jnp.sin(x) ** 2 + jnp.cos(x) ** 2
        y = jax.lax.cummax(jnp.stack([jnp.ones(()), t, 2.0 + x]), axis=0)
        return y[2] * x

    r, d = run(loss, 0.3)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, 2.0 + 2 * 0.3, rtol=1e-15)


# -- top_k ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", WRAPS)
def test_top_k_distinct_is_jax_grad(wrap):
    def loss(x):
        vals, idx = jax.lax.top_k(x, 2)
        return jnp.sum(vals**2 * jnp.array([2.0, 1.0], x.dtype)) + jnp.sum(idx).astype(x.dtype)

    x0 = np.array([1.0, 3.0, 2.0, -1.0])
    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, [0.0, 12.0, 4.0, 0.0], rtol=1e-15)
    assert_leaves(r.outputs, jgrad(loss, x0))


@pytest.mark.parametrize("wrap", WRAPS)
def test_top_k_2d_axis(wrap):
    x0 = np.array([[0.5, -1.0, 2.0, 0.1], [3.0, 1.0, 4.0, -2.0], [0.0, 0.2, -0.3, 0.4]])

    def loss(x):
        return jnp.sum(jnp.tanh(jax.lax.top_k(x, 3)[0]) * jnp.arange(1.0, 4.0))

    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    assert_leaves(r.outputs, jgrad(loss, x0))


@pytest.mark.parametrize("wrap", WRAPS)
def test_top_k_norm_of_ties_at_zero(wrap):
    # every entry ties at x = 0; the ray orders them: |top2(x)| is homogeneous of degree 1,
    # so per ray the gradient is jax.grad at v itself
    def loss(x):
        return jnp.sqrt(jnp.sum(jax.lax.top_k(x, 2)[0] ** 2))

    v = np.array([0.1, 0.7, -0.3, 0.4])
    r, d = run(wrap(loss), np.zeros(4), [v, -v])
    g1, g2 = ray_grads(d)
    np.testing.assert_allclose(g1[0], np.array([0.0, 0.7, 0.0, 0.4]) / math.sqrt(0.65), rtol=1e-14)
    np.testing.assert_allclose(g2[0], np.array([-0.1, 0.0, 0.3, 0.0]) / math.sqrt(0.1), rtol=1e-14)
    np.testing.assert_allclose(g1[0], jgrad(loss, v)[0], rtol=1e-14)
    np.testing.assert_allclose(g2[0], jgrad(loss, -v)[0], rtol=1e-14)
    assert d["label"] == "clarke-subgradient"
    np.testing.assert_allclose(r.outputs, min_norm_hull([g1[0], g2[0]]), atol=1e-15)


@pytest.mark.parametrize("wrap", WRAPS)
def test_top_k_exact_ties_are_a_kink(wrap):
    # the sum of the 2 largest of (1, 1, 1): each ray picks its own two, as jax.grad does at
    # the nearby point; f'(v) + f'(-v) = v_max - v_min != 0
    def loss(x):
        return jnp.sum(jax.lax.top_k(x, 2)[0])

    x0 = np.ones(3)
    v = np.array([0.2, -0.6, 0.4])
    r, d = run(wrap(loss), x0, [v, -v])
    assert_kink(r, d, loss, x0, v, [1.0, 0.0, 1.0], [1.0, 1.0, 0.0])


def test_top_k_identical_values_route_like_sort():
    # x and x again: identical series tie exactly; any order gives the same values
    def loss(x):
        return jnp.sum(jax.lax.top_k(jnp.stack([x, x, 0.5 * x]), 2)[0] ** 2)

    r, d = run(loss, 1.0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, 4.0, rtol=1e-15)


def test_top_k_tie_up_to_the_horizon_is_undecided():
    def loss(x):
        t = jnp.sin(x) ** 2 + jnp.cos(x) ** 2
        return jnp.sum(jax.lax.top_k(jnp.stack([jnp.ones(()), t, x]), 1)[0])

    _, d = run(loss, 0.3)
    assert d["label"] == "undecided"
