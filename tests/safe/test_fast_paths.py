"""The cheaper derivative rules (bench_safe's 1.2x bar) keep the values and derivatives.

logsumexp / log_softmax reuse their forward pass's ``exp`` and sum; atan2 scales by a power
of two instead of going through hypot; torch's clip uses hardtanh's kernel, torch's abs is
``torch.abs``. Each is checked against the naive function and against its slow path."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import gradsan.jax.safe as jsafe
import gradsan.torch.safe as tsafe

DTYPES = [np.float32, np.float64]


def _data(dtype, shape=(5, 7), seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=shape) * 3).astype(dtype)
    mask = rng.random(shape) > 0.3
    mask[0] = False  # a fully masked row
    mask[1] = True  # a full row
    return x, mask


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_lse_and_log_softmax_values_are_jax_nn_bit_for_bit(dtype, jit):
    x, mask = _data(dtype)
    wrap = jax.jit if jit else (lambda f: f)
    cases = [
        (
            lambda a, m: jsafe.logsumexp(a, axis=-1, where=m),
            lambda a, m: jax.nn.logsumexp(a, -1, where=m),
        ),
        (
            lambda a, m: jsafe.logsumexp(a, axis=(0, 1), where=m, keepdims=True),
            lambda a, m: jax.nn.logsumexp(a, (0, 1), where=m, keepdims=True),
        ),
        (lambda a, m: jsafe.logsumexp(a, axis=0), lambda a, m: jax.nn.logsumexp(a, 0)),
        (lambda a, m: jsafe.log_softmax(a, where=m), lambda a, m: jax.nn.log_softmax(a, where=m)),
        (lambda a, m: jsafe.log_softmax(a, axis=0), lambda a, m: jax.nn.log_softmax(a, axis=0)),
        (lambda a, m: jsafe.softmax(a, where=m), lambda a, m: jax.nn.softmax(a, where=m)),
    ]
    for safe_f, naive_f in cases:
        out = np.asarray(wrap(safe_f)(x, mask))
        # eagerly, a custom_jvp function runs as one compiled computation: the naive one's
        # values are those under jit (op by op, a reduction may round differently)
        naive = np.asarray(jax.jit(naive_f)(x, mask))
        np.testing.assert_array_equal(out, naive)
        if jit:
            # under differentiation the value comes from the derivative rule, which shares the
            # forward pass's exp. XLA may round a reduction of a stored exp differently from
            # one of a fused exp (the naive function's own value under jvp differs from its
            # value by an ulp too): equal to the rounding, and -inf exactly where it is
            primal = jax.jit(
                lambda a: jax.jvp(lambda b: safe_f(b, mask), (a,), (jnp.ones_like(a),))
            )
            got = np.asarray(primal(x)[0])
            np.testing.assert_array_equal(np.isinf(got), np.isinf(naive))
            np.testing.assert_allclose(got, naive, rtol=4 * np.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_lse_and_log_softmax_gradients(dtype):
    x, mask = _data(dtype)
    cot = np.random.default_rng(1).normal(size=x.shape).astype(dtype)
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    live = mask.any(-1)

    g = jax.jit(jax.grad(lambda a: jnp.sum(jsafe.logsumexp(a, -1, mask) * cot[:, 0])))(x)
    g0 = jax.grad(lambda a: jnp.sum(jax.nn.logsumexp(a, -1, where=mask) * cot[:, 0]))(x)
    np.testing.assert_allclose(np.asarray(g)[live], np.asarray(g0)[live], rtol=rtol, atol=rtol)
    assert (np.asarray(g)[~mask] == 0).all()

    g = jax.jit(
        jax.grad(lambda a: jnp.sum(jnp.where(mask, jsafe.log_softmax(a, where=mask), 0) * cot))
    )(x)
    p = np.where(mask, np.exp(x - x.max(-1, keepdims=True, where=mask, initial=-np.inf)), 0)
    p = p / np.where(live[:, None], p.sum(-1, keepdims=True), 1)
    cm = np.where(mask, cot, 0)
    expected = np.where(mask, cm - p * cm.sum(-1, keepdims=True), 0)
    np.testing.assert_allclose(np.asarray(g), expected, rtol=100 * rtol, atol=100 * rtol)
    assert (np.asarray(g)[~mask] == 0).all()

    # unmasked log_softmax / softmax are jax.nn's own: the same gradients
    for f, f0 in ((jsafe.log_softmax, jax.nn.log_softmax), (jsafe.softmax, jax.nn.softmax)):
        g = jax.grad(lambda a: jnp.sum(f(a) * cot))(x)
        np.testing.assert_array_equal(
            np.asarray(g), np.asarray(jax.grad(lambda a: jnp.sum(f0(a) * cot))(x))
        )


def test_lse_gradient_is_zero_on_infinite_rows():
    x = jnp.array([[0.0, jnp.inf, 1.0], [-jnp.inf, -jnp.inf, -jnp.inf], [0.0, 0.0, 0.0]])
    out = jsafe.logsumexp(x, axis=-1)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.nn.logsumexp(x, axis=-1)))
    g = jax.jit(jax.grad(lambda a: jnp.sum(jsafe.logsumexp(a, axis=-1))))(x)
    np.testing.assert_array_equal(np.asarray(g), [[0, 0, 0], [0, 0, 0], [1 / 3, 1 / 3, 1 / 3]])


def test_second_derivatives_finite_on_fully_masked_rows():
    x, mask = _data(np.float64, shape=(3, 4))
    for f in (
        lambda a: jnp.sum(jnp.where(mask.any(-1), jsafe.logsumexp(a, -1, mask), 0)),
        lambda a: jnp.sum(jnp.where(mask, jsafe.log_softmax(a, where=mask), 0) ** 2),
    ):
        h = np.asarray(jax.jit(jax.hessian(f))(x))
        assert np.isfinite(h).all()
        assert (h.reshape(12, 12)[:4] == 0).all()  # row 0 is fully masked
    # and the true Hessian of logsumexp on the full row: diag(p) - p p^T
    h = np.asarray(jax.hessian(lambda a: jsafe.logsumexp(a, -1, mask)[1])(x))[1, :, 1, :]
    p = np.exp(x[1] - np.log(np.exp(x[1]).sum()))
    np.testing.assert_allclose(h, np.diag(p) - np.outer(p, p), rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------ atan2 at extreme scales


@pytest.mark.parametrize(
    "dtype, scales",
    [
        (np.float32, [1e-37, 1e-30, 1e-19, 1e-10, 1.0, 1e10, 1e19, 1e30, 1e37]),
        (np.float64, [1e-306, 1e-300, 1e-154, 1e-100, 1.0, 1e100, 1e154, 1e300, 1e306]),
    ],
    ids=["float32", "float64"],
)
def test_atan2_gradient_does_not_overflow_or_underflow(dtype, scales):
    """(y, x) = (3 s, 4 s): the gradient (x, -y) / (x**2 + y**2) = (4, -3) / (25 s), where
    x**2 + y**2 itself underflows or overflows."""
    for s in scales:
        y, x = dtype(3 * s), dtype(4 * s)
        expected = np.array([4 / (25 * s), -3 / (25 * s)])
        gj = jax.jit(jax.grad(jsafe.atan2, (0, 1)))(y, x)
        np.testing.assert_allclose(
            np.array(gj, dtype=np.float64), expected, rtol=4e-7 if dtype == np.float32 else 1e-15
        )
        ty, tx = (torch.tensor(v, requires_grad=True) for v in (y, x))
        tsafe.atan2(ty, tx).backward()
        np.testing.assert_allclose(
            [ty.grad.item(), tx.grad.item()], expected, rtol=4e-7 if dtype == np.float32 else 1e-15
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_atan2_gradient_across_the_exponent_range(dtype):
    """Every binade, both branches of the scaling and the unscaled middle: (3, 4) and
    (1, -1e-3) times 2**e, against the exact gradient (computed on the unscaled pair)."""
    info = np.finfo(dtype)
    e = np.arange(info.minexp + 2, info.maxexp - 3)
    sc = np.ldexp(np.ones(e.size), e).astype(dtype)
    g = jax.jit(jax.vmap(jax.grad(jsafe.atan2, (0, 1))))
    for y0, x0 in ((3.0, 4.0), (1.0, -1e-3), (-1e-3, 1.0)):
        y, x = (dtype(y0) * sc).astype(dtype), (dtype(x0) * sc).astype(dtype)
        h = np.float64(x0) ** 2 + np.float64(y0) ** 2  # the gradient at (y0, x0) / sc
        want = [
            np.float64(x0) / h / sc.astype(np.float64),
            -np.float64(y0) / h / sc.astype(np.float64),
        ]
        for got, w in zip(g(y, x), want):
            # XLA:CPU flushes subnormal inputs and results to zero
            ok = (np.abs(w) > info.tiny) & (np.abs(x) >= info.tiny) & (np.abs(y) >= info.tiny)
            np.testing.assert_allclose(np.asarray(got, np.float64)[ok], w[ok], rtol=8 * info.eps)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_atan2_gradient_half_precision(dtype):
    y = jnp.array([3.0, 1e-3, -2.0, 0.0, 6e4 if dtype == jnp.float16 else 3e38], dtype)
    x = jnp.array([4.0, 2e-3, 0.5, 0.0, 1.0], dtype)
    gy, gx = jax.jit(jax.vmap(jax.grad(jsafe.atan2, (0, 1))))(y, x)
    assert gy.dtype == dtype and gx.dtype == dtype
    y64, x64 = np.asarray(y, np.float64), np.asarray(x, np.float64)
    h = np.where(x64**2 + y64**2 > 0, x64**2 + y64**2, 1)
    tiny = float(jnp.finfo(dtype).tiny)  # results below it underflow in the dtype
    np.testing.assert_allclose(np.asarray(gy, np.float64), x64 / h, rtol=1e-2, atol=tiny)
    np.testing.assert_allclose(np.asarray(gx, np.float64), -y64 / h, rtol=1e-2, atol=tiny)


def test_atan2_gradient_at_the_origin_and_nan():
    g = jax.grad(jsafe.atan2, (0, 1))(0.0, 0.0)
    assert [float(v) for v in g] == [0.0, 0.0] and not any(np.signbit(np.asarray(v)) for v in g)
    g = jax.jit(jax.grad(jsafe.atan2, (0, 1)))(jnp.nan, 1.0)
    assert [float(v) for v in g] == [0.0, 0.0]  # as the double-where rule gives for NaN


# ------------------------------------------------------------------ torch clip and abs

CLIP_X = [-2.0, -0.5, -0.25, 0.0, 0.5, 0.75, 3.0, -math.inf, math.inf]


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str
)
@pytest.mark.parametrize("extra", [[], [math.nan]], ids=["finite", "nan"])
def test_torch_clip_fast_backward_matches_general(dtype, extra):
    x0 = torch.tensor(CLIP_X + extra, dtype=dtype)
    g = torch.linspace(-3, 3, x0.numel(), dtype=dtype)
    expected = torch.tensor([0, 0.5, 1, 1, 0.5, 0, 0, 0, 0] + [0] * len(extra), dtype=dtype) * g
    x = x0.clone().requires_grad_(True)
    (fast,) = torch.autograd.grad(tsafe.clip(x, -0.5, 0.5), x, g)
    x = x0.clone().requires_grad_(True)
    (slow,) = torch.autograd.grad(tsafe.clip(x, -0.5, 0.5), x, g, create_graph=True)
    assert torch.equal(fast, expected) and torch.equal(slow.detach(), expected)
    torch.testing.assert_close(
        tsafe.clip(x0, -0.5, 0.5), torch.clamp(x0, -0.5, 0.5), rtol=0, atol=0, equal_nan=True
    )


def test_torch_clip_bounds_on_dtype_grid():
    """Bounds are rounded to x's dtype first; the neighbours are taken in that dtype."""
    x = torch.tensor([0.1, 0.2, 0.30000001192092896, 0.3], dtype=torch.float32, requires_grad=True)
    tsafe.clip(x, 0.1, 0.3).sum().backward()
    assert x.grad.tolist() == [0.5, 1.0, 0.5, 0.5]


def test_torch_abs_is_torch_abs():
    x = torch.tensor([-2.0, 0.0, 3.0], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(tsafe.abs(x).sum(), x, create_graph=True)
    assert g.tolist() == [-1.0, 0.0, 1.0]
    (h,) = torch.autograd.grad(g.sum(), x, allow_unused=True)
    assert h is None or h.abs().sum() == 0
    assert tsafe.abs(3).item() == 3.0
