"""One suite, both backends: ``backend`` runs each test on JAX (eager and jit) and PyTorch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import gradsan.jax.safe as jsafe
import gradsan.torch.safe as tsafe


@pytest.fixture(autouse=True)
def _x64():
    """float64 for these tests only (a global switch at import would also flip every other
    test collected in the same process, and make the suite differ from a single file)."""
    with jax.enable_x64(True):
        yield


DTYPES = [np.float32, np.float64]


class Backend:
    """Calls ``f(safe, xp, *arrays)`` on one backend and returns numpy results.

    ``safe`` is the backend's safe module and ``xp`` its array namespace (``jnp`` or
    ``torch``), so a test writes its function once for both backends.
    """

    def __init__(self, name: str, jit: bool = False):
        self.name, self.jit = name, jit
        self.is_jax = name == "jax"
        self.safe = jsafe if self.is_jax else tsafe
        self.xp = jnp if self.is_jax else torch

    def __repr__(self):
        return f"{self.name}{'-jit' if self.jit else ''}"

    def arr(self, x):
        x = np.asarray(x)
        return jnp.asarray(x) if self.is_jax else torch.from_numpy(x.copy())

    def value(self, f, *args):
        if self.is_jax:
            g = lambda *a: f(jsafe, jnp, *a)
            g = jax.jit(g) if self.jit else g
            return _np(g(*[self.arr(a) for a in args]))
        return _np(f(tsafe, torch, *[self.arr(a) for a in args]))

    def grad(self, f, *args, argnums=(0,), cot=None):
        """Gradients of ``sum(cot * f(...))`` with respect to ``args[i]`` for i in argnums."""
        if self.is_jax:

            def loss(*a):
                out = f(jsafe, jnp, *a)
                return jnp.sum(out if cot is None else out * jnp.asarray(cot))

            g = jax.grad(loss, argnums=tuple(argnums))
            g = jax.jit(g) if self.jit else g
            return tuple(_np(v) for v in g(*[self.arr(a) for a in args]))
        ts = [self.arr(a) for a in args]
        for i in argnums:
            ts[i].requires_grad_(True)
        out = f(tsafe, torch, *ts)
        loss = (out if cot is None else out * torch.as_tensor(cot)).sum()
        grads = torch.autograd.grad(loss, [ts[i] for i in argnums], allow_unused=True)
        return tuple(
            np.zeros_like(np.asarray(args[i])) if g is None else _np(g)
            for i, g in zip(argnums, grads)
        )

    def jacobian(self, f, x):
        if self.is_jax:
            j = jax.jacfwd(lambda a: f(jsafe, jnp, a))
            j = jax.jit(j) if self.jit else j
            return _np(j(self.arr(x)))
        return _np(torch.autograd.functional.jacobian(lambda a: f(tsafe, torch, a), self.arr(x)))


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x)


# JAX runs under jit in the full matrix (op-by-op eager JAX re-traces every custom_jvp and is
# ~10x slower); ``eager_backend`` repeats the elementwise cases without jit.
BACKENDS = [Backend("jax", jit=True), Backend("torch")]
EAGER = [Backend("jax"), Backend("torch")]


@pytest.fixture(params=BACKENDS, ids=repr)
def backend(request) -> Backend:
    return request.param


@pytest.fixture(params=EAGER, ids=repr)
def eager_backend(request) -> Backend:
    return request.param


@pytest.fixture(params=DTYPES, ids=lambda d: np.dtype(d).name)
def dtype(request):
    return request.param


def tol(dtype) -> float:
    return 2e-5 if np.dtype(dtype) == np.float32 else 1e-12
