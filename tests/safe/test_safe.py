"""Values and derivatives at, near and away from each singular point, on both backends."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest


def tol(dtype) -> float:
    return 2e-5 if np.dtype(dtype) == np.float32 else 1e-12


inf, nan = math.inf, math.nan
M_NONE = np.array([[True, True], [False, False]])

# (id, f(safe, xp, *args), args, expected value, expected gradients w.r.t. every arg)
# At the singular point the docstring promises these exactly (0 is compared with atol=0).
SINGULAR = [
    ("sqrt@0", lambda s, xp, x: s.sqrt(x), [0.0], 0.0, [0.0]),
    ("sqrt@-1", lambda s, xp, x: s.sqrt(x), [-1.0], nan, [0.0]),
    ("sqrt*0@0", lambda s, xp, x: 0.0 * s.sqrt(x), [0.0], 0.0, [0.0]),
    ("rsqrt@0", lambda s, xp, x: s.rsqrt(x), [0.0], inf, [0.0]),
    ("cbrt@0", lambda s, xp, x: s.cbrt(x), [0.0], 0.0, [0.0]),
    ("log@0", lambda s, xp, x: s.log(x), [0.0], -inf, [0.0]),
    ("log-masked@0", lambda s, xp, x: xp.where(x > 0, s.log(x), 0.0), [0.0], 0.0, [0.0]),
    ("log@-1", lambda s, xp, x: s.log(x), [-1.0], nan, [0.0]),
    ("sinc@0", lambda s, xp, x: s.sinc(x), [0.0], 1.0, [0.0]),
    ("pow.5@0", lambda s, xp, x: s.pow(x, 0.5), [0.0], 0.0, [0.0]),
    ("pow1@0", lambda s, xp, x: s.pow(x, 1.0), [0.0], 0.0, [1.0]),
    ("pow2.5@0", lambda s, xp, x: s.pow(x, 2.5), [0.0], 0.0, [0.0]),
    ("pow0@0", lambda s, xp, x: s.pow(x, 0.0), [0.0], 1.0, [0.0]),
    ("pow-1@0", lambda s, xp, x: s.pow(x, -1.0), [0.0], inf, [0.0]),
    ("pow.5@-1", lambda s, xp, x: s.pow(x, 0.5), [-1.0], nan, [0.0]),
    ("pow3@-2", lambda s, xp, x: s.pow(x, 3), [-2.0], -8.0, [12.0]),
    ("pow(x,p)@0,.5", lambda s, xp, x, p: s.pow(x, p), [0.0, 0.5], 0.0, [0.0, 0.0]),
    ("pow(x,p)@2,.5", lambda s, xp, x, p: s.pow(x, p), [4.0, 0.5], 2.0, [0.25, 2 * math.log(4)]),
    ("xlogy@0,0", lambda s, xp, x, y: s.xlogy(x, y), [0.0, 0.0], 0.0, [0.0, 0.0]),
    ("xlogy@0,2", lambda s, xp, x, y: s.xlogy(x, y), [0.0, 2.0], 0.0, [math.log(2), 0.0]),
    ("xlogx@0", lambda s, xp, x: s.xlogx(x), [0.0], 0.0, [-inf]),
    ("xlogx@1", lambda s, xp, x: s.xlogx(x), [1.0], 0.0, [1.0]),
    ("div@1,0", lambda s, xp, x, y: s.div(x, y), [1.0, 0.0], 0.0, [0.0, 0.0]),
    ("div@0,0fill", lambda s, xp, x, y: s.div(x, y, fill=3.0), [0.0, 0.0], 3.0, [0.0, 0.0]),
    ("div@1,2", lambda s, xp, x, y: s.div(x, y), [1.0, 2.0], 0.5, [0.5, -0.25]),
    ("arccos@1", lambda s, xp, x: s.arccos(x), [1.0], 0.0, [0.0]),
    ("arccos@-1", lambda s, xp, x: s.arccos(x), [-1.0], math.pi, [0.0]),
    ("arccos@1.5", lambda s, xp, x: s.arccos(x), [1.5], 0.0, [0.0]),
    ("arcsin@1", lambda s, xp, x: s.arcsin(x), [1.0], math.pi / 2, [0.0]),
    ("arcsin@-2", lambda s, xp, x: s.arcsin(x), [-2.0], -math.pi / 2, [0.0]),
    ("arctanh@1", lambda s, xp, x: s.arctanh(x), [1.0], inf, [0.0]),
    ("arctanh@-1", lambda s, xp, x: s.arctanh(x), [-1.0], -inf, [0.0]),
    ("atan2@0,0", lambda s, xp, y, x: s.atan2(y, x), [0.0, 0.0], 0.0, [0.0, 0.0]),
    ("atan2@1,0", lambda s, xp, y, x: s.atan2(y, x), [1.0, 0.0], math.pi / 2, [0.0, -1.0]),
    ("hypot@0,0", lambda s, xp, x, y: s.hypot(x, y), [0.0, 0.0], 0.0, [0.0, 0.0]),
    ("hypot@3,4", lambda s, xp, x, y: s.hypot(x, y), [3.0, 4.0], 5.0, [0.6, 0.8]),
    ("abs@0", lambda s, xp, x: s.abs(x), [0.0], 0.0, [0.0]),
    ("maximum@tie", lambda s, xp, x, y: s.maximum(x, y), [1.0, 1.0], 1.0, [0.5, 0.5]),
    ("minimum@tie", lambda s, xp, x, y: s.minimum(x, y), [1.0, 1.0], 1.0, [0.5, 0.5]),
    ("clip@lo", lambda s, xp, x: s.clip(x, 0.0, 1.0), [0.0], 0.0, [0.5]),
    ("clip@hi", lambda s, xp, x: s.clip(x, 0.0, 1.0), [1.0], 1.0, [0.5]),
    ("clip@out", lambda s, xp, x: s.clip(x, 0.0, 1.0), [2.0], 1.0, [0.0]),
    ("clip@in", lambda s, xp, x: s.clip(x, 0.0, 1.0), [0.5], 0.5, [1.0]),
    ("norm@0", lambda s, xp, x: s.norm(x), [[0.0, 0.0, 0.0]], 0.0, [[0.0] * 3]),
    (
        "norm-inf@tie",
        lambda s, xp, x: s.norm(x, ord=inf),
        [[2.0, -2.0, 1.0]],
        2.0,
        [[0.5, -0.5, 0.0]],
    ),
    ("norm1@0", lambda s, xp, x: s.norm(x, ord=1), [[0.0, 1.0]], 1.0, [[0.0, 1.0]]),
    (
        "normalize@0",
        lambda s, xp, x: s.normalize(x, eps=0.5),
        [[0.0, 0.0]],
        [0.0, 0.0],
        [[2.0, 2.0]],
    ),
    (
        "normalize-eps0@0",
        lambda s, xp, x: s.normalize(x, eps=0.0),
        [[0.0, 0.0]],
        [0.0, 0.0],
        [[0.0, 0.0]],
    ),
    ("std@const", lambda s, xp, x: s.std(x), [[2.0, 2.0, 2.0]], 0.0, [[0.0] * 3]),
    ("std-ddof1@const", lambda s, xp, x: s.std(x, ddof=1), [[-3.0, -3.0]], 0.0, [[0.0] * 2]),
    ("var@const", lambda s, xp, x: s.var(x), [[2.0, 2.0, 2.0]], 0.0, [[0.0] * 3]),
    (
        "cosine@x1=0",
        lambda s, xp, a, b: s.cosine_similarity(a, b, eps=0.5),
        [[0.0, 0.0], [3.0, 4.0]],
        0.0,
        [[1.2, 1.6], [0.0, 0.0]],
    ),
    (
        "cosine@both0",
        lambda s, xp, a, b: s.cosine_similarity(a, b),
        [[0.0, 0.0], [0.0, 0.0]],
        0.0,
        [[0.0, 0.0], [0.0, 0.0]],
    ),
    (
        "pairwise@same",
        lambda s, xp, a, b: s.pairwise_distance(a, b),
        [[1.0, 2.0], [1.0, 2.0]],
        0.0,
        [[0.0, 0.0], [0.0, 0.0]],
    ),
    (
        "cdist@self",
        lambda s, xp, a: s.cdist(a, a),
        [[[0.0, 0.0], [3.0, 4.0]]],
        [[0.0, 5.0], [5.0, 0.0]],
        [[[-1.2, -1.6], [1.2, 1.6]]],
    ),
    (
        "lse@masked",
        lambda s, xp, x: s.logsumexp(x, axis=-1, where=M_NONE),
        [[[0.0, 0.0], [1.0, 2.0]]],
        [math.log(2), -inf],
        [[[0.5, 0.5], [0.0, 0.0]]],
    ),
    (
        "softmax@masked",
        lambda s, xp, x: (
            s.softmax(x, where=M_NONE) * xp.asarray([[1.0, 0.0], [1.0, 0.0]], dtype=x.dtype)
        ),
        [[[0.0, 0.0], [1.0, 2.0]]],
        [[0.5, 0.0], [0.0, 0.0]],
        [[[0.25, -0.25], [0.0, 0.0]]],
    ),
    (
        "log_softmax@masked",
        lambda s, xp, x: s.log_softmax(x, where=M_NONE)[..., 0],
        [[[0.0, 0.0], [1.0, 2.0]]],
        [-math.log(2), -inf],
        [[[0.5, -0.5], [0.0, 0.0]]],
    ),
    ("where-sqrt@0", lambda s, xp, x: s.where(x > 0, xp.sqrt, 0.0, x), [0.0], 0.0, [0.0]),
    ("where-sqrt@-1", lambda s, xp, x: s.where(x > 0, xp.sqrt, 0.0, x), [-1.0], 0.0, [0.0]),
    (
        "where-log@4",
        lambda s, xp, x: s.where(x > 0, xp.log, lambda x: x, x),
        [4.0],
        math.log(4),
        [0.25],
    ),
]


ELEMENTWISE = [c for c in SINGULAR if np.ndim(c[2][0]) == 0]


@pytest.mark.parametrize("case", ELEMENTWISE, ids=[c[0] for c in ELEMENTWISE])
@pytest.mark.slow
def test_singular_points_eager(eager_backend, case):
    """The same exact values and derivatives without jit (float64)."""
    test_singular_points(eager_backend, np.float64, case)


def _close(actual, expected, rtol):
    expected = np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


def _check(actual, expected, dtype):
    np.testing.assert_allclose(
        actual, np.asarray(expected, dtype=np.float64), rtol=tol(dtype), atol=0
    )


@pytest.mark.parametrize("case", SINGULAR, ids=[c[0] for c in SINGULAR])
def test_singular_points(backend, dtype, case):
    _, f, args, value, grads = case
    args = [np.asarray(a, dtype=dtype) for a in args]
    out = backend.value(f, *args)
    assert out.dtype == dtype
    _check(out, value, dtype)
    got = backend.grad(f, *args, argnums=range(len(args)))
    for g, e in zip(got, grads):
        assert g.dtype == dtype
        _check(g, e, dtype)


# Elementwise functions: name, naive value on each backend, exact derivative in mpmath,
# singular points, and sample points away from them.
mp = mpmath


def _naive(name):
    import jax.numpy as jnp
    import jax.scipy.special as jsp
    import torch
    from jax import lax

    return {
        "sqrt": (jnp.sqrt, torch.sqrt),
        "rsqrt": (lax.rsqrt, torch.rsqrt),
        "cbrt": (jnp.cbrt, lambda x: torch.sign(x) * torch.abs(x).pow(1.0 / 3.0)),
        "log": (jnp.log, torch.log),
        "sinc": (jnp.sinc, torch.sinc),
        "arccos": (jnp.arccos, torch.arccos),
        "arcsin": (jnp.arcsin, torch.arcsin),
        "arctanh": (jnp.arctanh, torch.arctanh),
        "xlogx": (lambda x: jsp.xlogy(x, x), lambda x: torch.xlogy(x, x)),
        "abs": (jnp.abs, torch.abs),
    }[name]


UNARY = {
    # name: (derivative in mpmath, singular points, one-sided directions to probe)
    "sqrt": (lambda x: 1 / (2 * mp.sqrt(x)), [(0.0, +1)]),
    "rsqrt": (lambda x: -mp.power(x, -1.5) / 2, [(0.0, +1)]),
    "cbrt": (lambda x: mp.power(abs(x), -mp.mpf(2) / 3) / 3, [(0.0, +1), (0.0, -1)]),
    "log": (lambda x: 1 / x, [(0.0, +1)]),
    "sinc": (
        lambda x: (
            (mp.cospi(x) - mp.sincpi(x)) / x
            if abs(x) > 1e-6
            else -(mp.pi**2) * x / 3 + mp.pi**4 * x**3 / 30
        ),
        [(0.0, +1), (0.0, -1)],
    ),
    "arccos": (lambda x: -1 / mp.sqrt(1 - x * x), [(1.0, -1), (-1.0, +1)]),
    "arcsin": (lambda x: 1 / mp.sqrt(1 - x * x), [(1.0, -1), (-1.0, +1)]),
    "arctanh": (lambda x: 1 / (1 - x * x), [(1.0, -1), (-1.0, +1)]),
    "xlogx": (lambda x: mp.log(x) + 1, [(0.0, +1)]),
    "abs": (lambda x: mp.sign(x), [(0.0, +1), (0.0, -1)]),
}
AWAY = [0.3, 0.75, 2.0, 17.0]


def _near(point, direction, dtype):
    """``point`` moved one ulp in ``direction``; a subnormal becomes the smallest normal
    (XLA on CPU flushes subnormals to zero, so they cannot be probed there)."""
    x = np.nextafter(dtype(point), dtype(direction * np.inf))
    if 0 < abs(x) < np.finfo(dtype).tiny:
        x = dtype(direction) * np.finfo(dtype).tiny
    return x


def _domain_points(name, dtype):
    pts = [_near(p, d, dtype) for p, d in UNARY[name][1]]
    for a in AWAY:
        for s in (1, -1):
            x = dtype(s * a)
            if name in ("sqrt", "rsqrt", "log", "xlogx") and x <= 0:
                continue
            if name in ("arccos", "arcsin", "arctanh") and abs(x) >= 1:
                continue
            pts.append(x)
    return np.array(pts, dtype=dtype)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_near_and_away(backend, dtype, name):
    """Bit-identical values and the analytic derivative, one ulp from and away from the
    singular points (float32 and float64)."""
    x = _domain_points(name, dtype)
    naive = _naive(name)[0 if backend.is_jax else 1]
    out = backend.value(lambda s, xp, a: getattr(s, name)(a), x)
    ref = backend.value(lambda s, xp, a: naive(a), x)
    if not (backend.jit or name == "cbrt"):
        np.testing.assert_array_equal(out, ref)
    else:  # XLA may fuse differently under jit; torch cbrt has no single kernel
        np.testing.assert_allclose(out, ref, rtol=4 * np.finfo(dtype).eps)
    (g,) = backend.grad(lambda s, xp, a: getattr(s, name)(a), x)
    deriv = UNARY[name][0]
    with mp.workdps(40), np.errstate(over="ignore"):
        exact = np.array([float(deriv(mp.mpf(float(v)))) for v in x]).astype(dtype)
    np.testing.assert_allclose(g, exact, rtol=10 * tol(dtype), atol=0)


@pytest.mark.parametrize(
    "name, point, claim",
    [
        ("sinc", 0.0, 0.0),  # true derivative
        ("xlogx", 0.0, -inf),  # true one-sided derivative
        ("sqrt", 0.0, 0.0),  # convention: the one-sided quotient diverges
        ("arccos", 1.0, 0.0),  # convention: the one-sided quotient diverges
    ],
)
def test_one_sided_truth(backend, name, point, claim):
    """mpmath one-sided difference quotients tell true derivatives from conventions."""
    f = {
        "sinc": mp.sincpi,
        "xlogx": lambda x: x * mp.log(x) if x else mp.mpf(0),
        "sqrt": mp.sqrt,
        "arccos": mp.acos,
    }[name]
    side = -1 if point == 1.0 else 1
    with mp.workdps(50):
        quots = [
            (f(point + side * h) - f(point)) / (side * h)
            for h in (mp.mpf(10) ** -k for k in (10, 20, 30))
        ]
    converges = abs(quots[-1] - quots[-2]) < 1e-6 * (1 + abs(quots[-1]))
    (g,) = backend.grad(lambda s, xp, a: getattr(s, name)(a), np.float64(point))
    assert g == claim
    if name == "sinc":
        assert converges and abs(float(quots[-1]) - claim) < 1e-9
    else:  # the quotient diverges: -inf is the truth for xlogx, 0 a convention for the rest
        assert not converges


def test_flux_normalise(backend, dtype):
    """Flux's ``(x - mean) / (std + eps)`` at constant data: the finite true derivative."""
    x = np.ones((3, 3), dtype=dtype)
    for axis in (0, 1, (0, 1)):
        f = lambda s, xp, a: xp.sin(s.standardize(a, axis=axis, form="std_eps"))
        (g,) = backend.grad(f, x)
        assert np.isfinite(g).all()
        # (I - 11^T/n) / eps applied to cos(0) = 1 is 0, up to the rounding of mean(1) / eps
        np.testing.assert_allclose(g, 0, atol=16 * np.finfo(dtype).eps / 1e-5)
        w = np.arange(9.0).reshape(3, 3).astype(dtype)
        (g,) = backend.grad(lambda s, xp, a: s.standardize(a, axis=axis, form="std_eps"), x, cot=w)
        expected = (w - w.mean(axis=axis, keepdims=True)) / 1e-5
        _close(g, expected, 1e-4 if dtype == np.float32 else 1e-10)
    # the sqrt(var + eps) form too, and layer_norm on top of it
    for form, scale in (("var_eps", 1 / math.sqrt(1e-5)), ("std_eps", 1 / 1e-5)):
        (g,) = backend.grad(lambda s, xp, a: s.layer_norm(a, form=form), x, cot=w)
        expected = (w - w.mean(axis=-1, keepdims=True)) * scale
        _close(g, expected, 1e-4 if dtype == np.float32 else 1e-10)


def test_standardize_values(backend, dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5)).astype(dtype)
    for form in ("var_eps", "std_eps"):
        out = backend.value(lambda s, xp, a: s.standardize(a, form=form, eps=1e-5), x)
        xm = x.astype(np.float64) - x.mean(-1, keepdims=True)
        den = (
            np.sqrt(x.var(-1, keepdims=True) + 1e-5)
            if form == "var_eps"
            else x.std(-1, keepdims=True) + 1e-5
        )
        np.testing.assert_allclose(out, xm / den, rtol=1e-5 if dtype == np.float32 else 1e-12)
    with pytest.raises(ValueError, match="form must be"):
        backend.value(lambda s, xp, a: s.standardize(a, form="bogus"), x)


def test_xlogy_at_the_origin_one_sided(backend):
    """safe.xlogy at (0, 0), against mpmath's one-sided quotients: its 0 in ``y`` is the true
    partial (xlogy(0, k) = 0), its 0 in ``x`` a convention (xlogy(h, 0) = -inf, no quotient),
    and on the diagonal xlogy(x, x) its 0 is not the slope of x log x (the quotient diverges
    to -inf: safe.xlogx gives that -inf)."""
    f = lambda x, y: x * mp.log(y) if x else mp.mpf(0)
    hs = [mp.mpf(10) ** -k for k in (10, 20, 30)]
    with mp.workdps(50):
        in_y = [(f(0, h) - f(0, 0)) / h for h in hs]
        along_x = [f(h, 0) for h in hs]
        diag = [(f(h, h) - f(0, 0)) / h for h in hs]
        at_2 = [(f(h, 2) - f(0, 2)) / h for h in hs]
    gx, gy = backend.grad(lambda s, xp, x, y: s.xlogy(x, y), 0.0, 0.0, argnums=(0, 1))
    assert all(q == 0 for q in in_y) and gy == 0  # the true partial
    assert all(v == -inf for v in along_x) and gx == 0  # no derivative: the convention
    (gd,) = backend.grad(lambda s, xp, x: s.xlogy(x, x), 0.0)
    assert diag[-1] < diag[-2] < diag[0] < -20 and gd == 0  # not the slope there
    (gl,) = backend.grad(lambda s, xp, x: s.xlogx(x), 0.0)
    assert gl == -inf
    gx2, gy2 = backend.grad(lambda s, xp, x, y: s.xlogy(x, y), 0.0, 2.0, argnums=(0, 1))
    assert abs(float(at_2[-1]) - math.log(2)) < 1e-12 and abs(gx2 - math.log(2)) < 1e-12
    assert gy2 == 0
