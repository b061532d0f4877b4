"""gradsan.jax.certify on max / min pooling (reduce_window_max, reduce_window_min): exact series
rules (no "unverified" fallback), checked against jax.grad at smooth points, against the
one-sided gradients at ties, and the window index against the primitive itself."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from gradsan.jax.certify._hull import min_norm_hull  # noqa: E402
from gradsan.jax.certify.rules.choice import window_index  # noqa: E402
from tests.jax._certify_util import WRAPS, assert_kink, ray_grads, run  # noqa: E402


def jgrad(f, x):
    with jax.enable_x64(True):
        return np.asarray(jax.jit(jax.grad(f))(jnp.asarray(x)))


def maxpool(x, window, strides, padding="VALID", base_dilation=None, window_dilation=None):
    """``lax.reduce_window(x, -inf, lax.max, ...)``: the primitive reduce_window_max."""
    return lax.reduce_window(
        x, -jnp.inf, lax.max, window, strides, padding, base_dilation, window_dilation
    )


def minpool(x, window, strides, padding="VALID", base_dilation=None, window_dilation=None):
    return lax.reduce_window(
        x, jnp.inf, lax.min, window, strides, padding, base_dilation, window_dilation
    )


def explicit_pads(shape, window, strides, padding, window_dilation=None):
    """A padding string as lax.reduce_window reads it (the operand's own shape, the dilated
    window)."""
    if not isinstance(padding, str):
        return tuple(tuple(p) for p in padding)
    wdl = window_dilation or (1,) * len(shape)
    eff = tuple((w - 1) * d + 1 for w, d in zip(window, wdl))
    return tuple(tuple(p) for p in lax.padtype_to_pads(shape, eff, strides, padding))


def pool_ref(
    x, window, strides, padding="VALID", base_dilation=None, window_dilation=None, big=True
):
    """The same pooling from lax.pad (padding and base-dilation holes hold the init value),
    strided slices (one per window element) and a max over them: independent of the rule's
    window index, and differentiable by jax.grad where the primitive's VJP is not (window
    dilation)."""
    nd = x.ndim
    bd = base_dilation or (1,) * nd
    wdl = window_dilation or (1,) * nd
    if isinstance(padding, str):
        padding = explicit_pads(x.shape, window, strides, padding, window_dilation)
    init = -jnp.inf if big else jnp.inf
    xp = lax.pad(
        x, jnp.asarray(init, x.dtype), [(lo, hi, b - 1) for (lo, hi), b in zip(padding, bd)]
    )
    m = [(n - (w - 1) * d - 1) // s + 1 for n, w, d, s in zip(xp.shape, window, wdl, strides)]
    if min(m) <= 0:
        return jnp.full([max(k, 0) for k in m], init, x.dtype)
    parts = []
    for k in np.ndindex(*window):
        start = [kk * d for kk, d in zip(k, wdl)]
        limit = [st + (mm - 1) * s + 1 for st, mm, s in zip(start, m, strides)]
        parts.append(lax.slice(xp, start, limit, strides))
    return (jnp.max if big else jnp.min)(jnp.stack(parts), axis=0)


def test_primitives_are_the_pooling_ones():
    jx = jax.make_jaxpr(lambda x: maxpool(x, (2,), (1,)) + minpool(x, (2,), (1,)))(jnp.ones(4))
    names = {e.primitive.name for e in jx.jaxpr.eqns}
    assert {"reduce_window_max", "reduce_window_min"} <= names


# -- the window index against the primitive ---------------------------------------------------


def _index_configs(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        nd = int(rng.integers(1, 4))
        shape = tuple(int(k) for k in rng.integers(1, 6, nd))
        wd = tuple(int(k) for k in rng.integers(1, 4, nd))
        st = tuple(int(k) for k in rng.integers(1, 4, nd))
        pad = tuple((int(a), int(b)) for a, b in rng.integers(0, 3, (nd, 2)))
        bd = tuple(int(k) for k in rng.integers(1, 3, nd))
        wdl = tuple(int(k) for k in rng.integers(1, 3, nd))
        out.append((shape, wd, st, pad, bd, wdl))
    return out


@pytest.mark.parametrize("cfg", _index_configs(16), ids=[f"cfg{k}" for k in range(16)])
def test_window_index_matches_the_primitive(cfg):
    shape, wd, st, pad, bd, wdl = cfg
    x = np.random.default_rng(hash(cfg) % 2**32).standard_normal(shape)
    idx = window_index(
        dict(
            window_dimensions=wd,
            window_strides=st,
            padding=pad,
            base_dilation=bd,
            window_dilation=wdl,
        ),
        shape,
    )
    g = x.reshape(-1)[np.maximum(idx, 0)]
    with jax.enable_x64(True):
        for pool, init, red in ((maxpool, -np.inf, np.max), (minpool, np.inf, np.min)):
            want = np.asarray(pool(x, wd, st, pad, bd, wdl))
            assert idx.shape[:-1] == want.shape
            np.testing.assert_array_equal(red(np.where(idx >= 0, g, init), axis=-1), want)
            np.testing.assert_array_equal(
                np.asarray(pool_ref(jnp.asarray(x), wd, st, pad, bd, wdl, big=pool is maxpool)),
                want,
            )
        # every covered element exactly once: the window sums agree too
        ws = np.asarray(lax.reduce_window(x, 0.0, lax.add, wd, st, pad, bd, wdl))
    np.testing.assert_allclose(np.where(idx >= 0, g, 0.0).sum(-1), ws, atol=1e-12)


def test_a_wrong_index_is_caught_by_the_primitive():
    from gradsan.jax.certify._series import Undecided
    from gradsan.jax.certify.rules.choice import _check_index

    params = dict(
        window_dimensions=(2,),
        window_strides=(1,),
        padding=((1, 0),),
        base_dilation=(1,),
        window_dilation=(1,),
    )
    jx = jax.make_jaxpr(lambda x: maxpool(x, (2,), (1,), ((1, 0),)))(jnp.ones(4))
    (eqn,) = jx.jaxpr.eqns
    assert eqn.primitive.name == "reduce_window_max"
    idx = window_index(params, (4,))
    np.testing.assert_array_equal(idx, [[-1, 0], [0, 1], [1, 2], [2, 3]])
    _check_index(eqn, dict(eqn.params), (4,), idx)
    bad = idx.copy()
    bad[1] = [1, 2]
    with pytest.raises(Undecided):
        _check_index(eqn, dict(eqn.params), (4,), bad)


# -- smooth points: jax.grad --------------------------------------------------------------------


@pytest.mark.parametrize("wrap", WRAPS)
def test_1d_strict_maxima_is_jax_grad(wrap):
    def loss(x):
        y = maxpool(x, (3,), (2,), "SAME")
        return jnp.sum(jnp.tanh(y) * jnp.arange(1.0, y.shape[0] + 1)) + jnp.sum(y**2)

    x0 = np.array([0.3, -1.2, 2.0, 0.7, 1.1, -0.4, 0.9])
    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, jgrad(loss, x0), rtol=1e-12, atol=1e-14)


CONFIGS_2D = [
    pytest.param(dict(window=(1, 2, 2, 1), strides=(1, 2, 2, 1)), id="2x2-s2"),
    pytest.param(dict(window=(1, 3, 3, 1), strides=(1, 1, 1, 1), padding="SAME"), id="3x3-same"),
    pytest.param(
        dict(
            window=(1, 2, 2, 1),
            strides=(1, 1, 2, 1),
            padding=((0, 0), (1, 1), (0, 1), (0, 0)),
            window_dilation=(1, 2, 1, 1),
        ),
        id="window-dilation",
    ),
    pytest.param(
        dict(
            window=(1, 3, 2, 1),
            strides=(1, 1, 1, 1),
            padding=((0, 0), (1, 1), (0, 0), (0, 0)),
            base_dilation=(1, 1, 2, 1),
        ),
        id="base-dilation",
    ),
]


@pytest.mark.parametrize("cfg", CONFIGS_2D)
@pytest.mark.parametrize("wrap", WRAPS)
def test_2d_nhwc_strict_maxima_is_jax_grad(wrap, cfg):
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((2, 4, 5, 3))

    def loss(x):
        y = maxpool(x, **cfg)
        return jnp.sum(jnp.sin(y) * y) + jnp.sum(y[:, :1] ** 3)

    def ref(x):
        y = pool_ref(x, **cfg)
        return jnp.sum(jnp.sin(y) * y) + jnp.sum(y[:, :1] ** 3)

    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    # (jax.grad has no VJP for max pooling with window dilation: the reference pooling there)
    want = jgrad(ref if cfg.get("window_dilation") else loss, x0)
    np.testing.assert_allclose(want, jgrad(ref, x0), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(r.outputs, want, rtol=1e-12, atol=1e-14)


# -- ties: one-sided gradients, a Clarke subgradient -----------------------------------------


@pytest.mark.parametrize("wrap", WRAPS)
def test_tie_in_a_window_is_a_clarke_subgradient(wrap):
    # windows (x0, x1), (x1, x2), (x2, x3) of (1, 3, 3, 0): the middle one ties. The ray v
    # (v1 > v2) keeps x1 there, -v takes x2: as jax.grad at the nearby points
    def loss(x):
        return jnp.sum(maxpool(x, (2,), (1,)) * jnp.array([1.0, 2.0, 3.0], x.dtype))

    x0 = np.array([1.0, 3.0, 3.0, 0.0])
    v = np.array([0.3, 0.5, -0.8, 0.1])
    r, d = run(wrap(loss), x0, [v, -v])
    assert [x["verdict"] for x in d["verdicts"]] == ["DEFINED", "DEFINED"]
    assert_kink(r, d, loss, x0, v, [0.0, 3.0, 3.0, 0.0], [0.0, 1.0, 5.0, 0.0])


@pytest.mark.parametrize("wrap", WRAPS)
def test_2d_tie_is_decided_per_ray(wrap):
    # a 2x2 window (stride 2) whose four entries tie at 2: each ray picks its own largest
    def loss(x):
        return jnp.sum(jnp.exp(maxpool(x, (2, 2), (2, 2))))

    x0 = np.array([[2.0, 2.0, 0.0, 1.0], [2.0, 2.0, -1.0, 0.5]])
    v = np.array([[0.1, -0.4, 0.3, 0.2], [0.7, -0.2, 0.0, 0.6]])
    r, d = run(wrap(loss), x0, [v, -v])
    g1, g2 = (g[0] for g in ray_grads(d))
    e2 = np.exp(2.0)
    np.testing.assert_allclose(g1, [[0, 0, 0, np.e], [e2, 0, 0, 0]], rtol=1e-14)
    np.testing.assert_allclose(g2, [[0, e2, 0, np.e], [0, 0, 0, 0]], rtol=1e-14)
    np.testing.assert_allclose(g1, jgrad(loss, x0 + 1e-6 * v), rtol=1e-5)
    np.testing.assert_allclose(g2, jgrad(loss, x0 - 1e-6 * v), rtol=1e-5)
    assert d["label"] == "clarke-subgradient"


@pytest.mark.parametrize("wrap", WRAPS)
def test_identical_entries_share_the_cotangent(wrap):
    # the same series twice in a window: an exact tie on every ray, shared equally (as
    # reduce_max does); the loss is differentiable
    def loss(x):
        return jnp.sum(maxpool(jnp.stack([x, x, 0.5 * x]), (2,), (1,)) ** 2)

    r, d = run(wrap(loss), 1.0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, 4.0, rtol=1e-15)


def test_tie_up_to_the_horizon_is_undecided():
    # sin(x)^2 + cos(x)^2 ties 1 in every known term: no silent pick
    def loss(x):
        t = jnp.sin(x) ** 2 + jnp.cos(x) ** 2
        return jnp.sum(maxpool(jnp.stack([jnp.ones(()), t, x]), (2,), (1,)))

    _, d = run(loss, 0.3)
    assert d["label"] == "undecided"


@pytest.mark.parametrize("wrap", WRAPS)
def test_norm_of_pooled_values_at_zero(wrap):
    # |maxpool(x)| at x = 0: every window ties. Per ray the gradient is jax.grad at the direction
    # itself (homogeneous of degree 1); u is chosen with the same argmax as v in each window and
    # the opposite maxima (-v gives a third, different limit): the hull of the limits of v and
    # u holds 0, the minimum-norm subgradient is 0
    def loss(x):
        return jnp.sqrt(jnp.sum(maxpool(x, (2,), (2,)) ** 2))

    v = np.array([1.0, 0.5, 0.2, 0.7])
    u = np.array([-1.0, -2.0, -1.4, -0.7])
    r, d = run(wrap(loss), np.zeros(4), [v, u])
    assert [x["verdict"] for x in d["verdicts"]] == ["DEFINED"] * 2
    g1, g2 = (g[0] for g in ray_grads(d))
    np.testing.assert_allclose(g1, np.array([1.0, 0.0, 0.0, 0.7]) / np.hypot(1.0, 0.7), rtol=1e-14)
    np.testing.assert_allclose(g2, -g1, rtol=1e-14)
    for g, w in ((g1, v), (g2, u)):
        np.testing.assert_allclose(g, jgrad(loss, w), rtol=1e-14)
    assert d["label"] == "clarke-subgradient"
    np.testing.assert_allclose(r.outputs, np.zeros(4), atol=1e-15)
    np.testing.assert_allclose(r.outputs, min_norm_hull([g1, g2]), atol=1e-15)
    # -v: the minima of the windows, a third limit
    _, d = run(wrap(loss), np.zeros(4), [v, -v])
    g1, g2 = (g[0] for g in ray_grads(d))
    np.testing.assert_allclose(g2, jgrad(loss, -v), rtol=1e-14)
    assert d["label"] == "clarke-subgradient"


# -- padding: the init value at the border ------------------------------------------------------


@pytest.mark.parametrize("wrap", WRAPS)
def test_same_padding_at_the_border_is_jax_grad(wrap):
    # 'SAME' pads with -inf: the border windows cover padding, which never wins
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal((1, 3, 3, 2)) - 3.0  # all negative: -inf still loses

    def loss(x):
        y = maxpool(x, (1, 2, 2, 1), (1, 1, 1, 1), "SAME")
        return jnp.sum(y**2)

    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, jgrad(loss, x0), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("wrap", WRAPS)
def test_flax_max_pool_same_padding(wrap):
    nn = pytest.importorskip("flax.linen")
    rng = np.random.default_rng(6)
    x0 = rng.standard_normal((1, 5, 4, 2))

    def loss(x):
        y = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        return jnp.sum(jnp.tanh(y) * y)

    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, jgrad(loss, x0), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("wrap", WRAPS)
def test_same_padding_tie_at_the_border(wrap):
    # windows (pad, x0, x1), (x0, x1, x2), (x1, x2, pad) of (2, 1, 2): x0 and x2 tie in the
    # middle window, the padding takes no part
    def loss(x):
        return jnp.sum(maxpool(x, (3,), (1,), "SAME") * jnp.array([1.0, 10.0, 100.0], x.dtype))

    x0 = np.array([2.0, 1.0, 2.0])
    v = np.array([0.5, 0.1, -0.3])
    r, d = run(wrap(loss), x0, [v, -v])
    assert_kink(r, d, loss, x0, v, [11.0, 0.0, 100.0], [1.0, 0.0, 110.0])


@pytest.mark.parametrize("wrap", WRAPS)
def test_windows_of_padding_only_are_exactly_minus_inf(wrap):
    # base dilation 2, window 1: every other output is a hole (-inf), masked out afterwards
    def loss(x):
        y = maxpool(x, (1,), (1,), base_dilation=(2,))
        return jnp.sum(jnp.where(jnp.isfinite(y), y, 0.0) ** 2)

    x0 = np.array([0.5, -1.5, 2.0])
    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, 2 * x0, rtol=1e-15)
    np.testing.assert_allclose(r.outputs, jgrad(loss, x0), rtol=1e-15)


# -- reduce_window_min --------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", WRAPS)
def test_min_pool_strict_is_jax_grad(wrap):
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal((3, 6))

    def loss(x):
        y = minpool(x, (2, 3), (1, 2), "SAME")
        return jnp.sum(jnp.exp(y)) + jnp.sum(y[0] ** 2)

    r, d = run(wrap(loss), x0)
    assert d["label"] == "gradient"
    np.testing.assert_allclose(r.outputs, jgrad(loss, x0), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("wrap", WRAPS)
def test_min_pool_tie_is_a_clarke_subgradient(wrap):
    def loss(x):
        return jnp.sum(minpool(x, (2,), (1,)) * jnp.array([1.0, 2.0], x.dtype))

    x0 = np.array([-1.0, -1.0, 0.0])
    v = np.array([0.2, -0.6, 0.1])
    r, d = run(wrap(loss), x0, [v, -v])
    assert_kink(r, d, loss, x0, v, [0.0, 3.0, 0.0], [1.0, 2.0, 0.0])


# -- fuzz: random configurations at random points -------------------------------------------


def _random_configs(n, seed=11):
    """n configurations (pooling, point, reduce_window arguments) whose every window covers an
    input element (else the loss is infinite), chosen with numpy only."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        nd = int(rng.integers(1, 4))
        shape = tuple(int(k) for k in rng.integers(2, 6, nd))
        wd = tuple(int(k) for k in rng.integers(1, 4, nd))
        st = tuple(int(k) for k in rng.integers(1, 3, nd))
        if rng.random() < 0.3:
            pad = "SAME" if rng.random() < 0.5 else "VALID"
        else:
            pad = tuple((int(a), int(b)) for a, b in rng.integers(0, 2, (nd, 2)))
        bd = tuple(int(k) for k in rng.integers(1, 3, nd)) if rng.random() < 0.4 else None
        wdl = tuple(int(k) for k in rng.integers(1, 3, nd)) if rng.random() < 0.4 else None
        big = bool(rng.random() < 0.7)
        x0 = rng.standard_normal(shape)
        idx = window_index(
            dict(
                window_dimensions=wd,
                window_strides=st,
                padding=explicit_pads(shape, wd, st, pad, wdl),
                base_dilation=bd,
                window_dilation=wdl,
            ),
            shape,
        )
        if idx.size == 0 or (idx < 0).all(axis=-1).any():
            continue
        out.append((big, x0, (wd, st, pad, bd, wdl)))
    return out


FUZZ = _random_configs(20)


@pytest.mark.parametrize("k", range(len(FUZZ)))
def test_random_config_is_jax_grad(k):
    big, x0, args = FUZZ[k]
    pool = maxpool if big else minpool
    # a constant of the output's shape (numpy: no extra primitives to evaluate)
    n_out = window_index(
        dict(
            window_dimensions=args[0],
            window_strides=args[1],
            padding=explicit_pads(x0.shape, args[0], args[1], args[2], args[4]),
            base_dilation=args[3],
            window_dilation=args[4],
        ),
        x0.shape,
    ).shape[:-1]
    c = np.cos(np.arange(int(np.prod(n_out)))).reshape(n_out)

    def loss(x):
        y = pool(x, *args)
        return jnp.sum(jnp.sin(y) + 0.5 * y**2 * c)

    def ref(x):
        y = pool_ref(x, *args, big=big)
        return jnp.sum(jnp.sin(y) + 0.5 * y**2 * c)

    f = loss if k % 2 == 0 else jax.grad(loss)
    r, d = run(f, x0)
    assert d["label"] == "gradient", (args, d["label"])
    # (jax.grad has no VJP for max pooling with window dilation: the reference pooling there)
    dilated = args[4] is not None and max(args[4]) > 1
    want = jgrad(ref if dilated else loss, x0)
    np.testing.assert_allclose(r.outputs, want, rtol=1e-9, atol=1e-9, err_msg=str(args))
