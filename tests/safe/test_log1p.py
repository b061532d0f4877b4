"""safe.log1p in both backends: the value of log1p, derivative 1/(1+x), and 0 at and below -1."""

import numpy as np
import pytest


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_log1p_value_and_derivative(backend):
    xs = [-2.0, -1.0, -0.5, 0.0, 3.0]
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        from gradsan.jax import safe

        vals = [float(safe.log1p(jnp.float32(x))) for x in xs]
        grads = [float(jax.grad(lambda t: 0.0 + safe.log1p(t))(jnp.float32(x))) for x in xs]
        zero_ct = float(jax.grad(lambda t: 0.0 * safe.log1p(t))(jnp.float32(-1.0)))
    else:
        import torch

        from gradsan.torch import safe

        vals, grads = [], []
        for x in xs:
            t = torch.tensor(x, requires_grad=True)
            y = safe.log1p(t)
            y.backward()
            vals.append(float(y.detach()))
            grads.append(float(t.grad))
        t = torch.tensor(-1.0, requires_grad=True)
        (0.0 * safe.log1p(t)).backward()
        zero_ct = float(t.grad)
    with np.errstate(divide="ignore", invalid="ignore"):  # log1p(-1) = -inf, below: nan
        want = np.log1p(np.array(xs, np.float32))
    np.testing.assert_array_equal(np.array(vals, np.float32), want)
    assert grads == [0.0, 0.0, 2.0, 1.0, 0.25]
    assert zero_ct == 0.0
