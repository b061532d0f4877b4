"""A small real-world set for sanitize (issue 15), both backends: clean controls whose gradient
is exact (zero findings expected), kinks and silent PyTorch conventions (a finding with that
catalog id at the marked line expected), NaN cases (a non-finite finding at the marked line).

Each program names where it comes from: a public report (GitHub issue) or the library code it
runs (flax, optax, equinox as installed). Run it against any gradsan tree to compare:

    PYTHONPATH=/work/main/src python benchmarks/sanitize_realworld.py      # before
    PYTHONPATH=src python benchmarks/sanitize_realworld.py                 # after

It prints one line per program and the totals: false flags on clean programs, kinks and
conventions caught at their line, NaN cases located.
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

HERE = __file__


def line(marker: str) -> int:
    with open(HERE) as fh:
        for i, text in enumerate(fh, 1):
            if text.rstrip().endswith(f"# L:{marker}"):
                return i
    raise KeyError(marker)


@dataclass
class Program:
    name: str
    backend: str
    kind: str  # clean, kink, convention, nan
    source: str
    run: Callable  # -> Report
    entry: str | None = None  # expected catalog id (kink / convention / nan)
    marker: str | None = None


PROGRAMS: list[Program] = []


def program(name, backend, kind, source, entry=None, marker=None):
    def deco(fn):
        PROGRAMS.append(Program(name, backend, kind, source, fn, entry, marker))
        return fn

    return deco


# ---- JAX ------------------------------------------------------------------------------------


def _jax():
    import jax
    import jax.numpy as jnp

    import gradsan.jax as gsj

    return jax, jnp, gsj


@program("softplus at 0", "jax", "clean", "jax-ml/jax#2107")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(jax.nn.softplus(x))))(jnp.zeros(4))


@program("log_sigmoid at 0", "jax", "clean", "jax-ml/jax#2140")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(jax.nn.log_sigmoid(x))))(jnp.zeros(3))


@program("logaddexp tie", "jax", "clean", "jax-ml/jax#2107 (logaddexp's max and abs)")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda x, y: jnp.sum(jnp.logaddexp(x, y))))(
        jnp.ones(3), jnp.ones(3)
    )


@program("optax log_cosh at 0", "jax", "clean", "optax.losses.log_cosh")
def _():
    jax, jnp, gsj = _jax()
    import optax

    return gsj.sanitize(jax.grad(lambda p: jnp.mean(optax.losses.log_cosh(p, jnp.zeros(3)))))(
        jnp.zeros(3)
    )


@program("optax huber at delta", "jax", "clean", "optax.losses.huber_loss")
def _():
    jax, jnp, gsj = _jax()
    import optax

    f = lambda p: jnp.mean(optax.losses.huber_loss(p, jnp.zeros(3), delta=1.0))  # noqa: E731
    return gsj.sanitize(jax.grad(f))(jnp.array([1.0, -1.0, 0.25]))


@program("ELU alpha=1 at 0", "jax", "clean", "jax.nn.elu")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(jax.nn.elu(x, alpha=1.0))))(jnp.zeros(3))


@program("sparse_plus at -1, 1", "jax", "clean", "jax.nn.sparse_plus")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(jax.nn.sparse_plus(x))))(
        jnp.array([-1.0, 1.0, 0.0])
    )


@program("projection_simplex tie", "jax", "clean", "optax.projections.projection_simplex")
def _():
    jax, jnp, gsj = _jax()
    import optax

    f = lambda x: jnp.sum(optax.projections.projection_simplex(x) ** 2 * jnp.arange(3.0))  # noqa: E731
    return gsj.sanitize(jax.grad(f))(jnp.array([0.5, 0.5, 0.5]))


@program("flax LayerNorm zero row", "jax", "clean", "flax.linen.LayerNorm")
def _():
    jax, jnp, gsj = _jax()
    import flax.linen as nn

    ln = nn.LayerNorm()
    p = ln.init(jax.random.PRNGKey(0), jnp.zeros((2, 4)))
    x = jnp.zeros((2, 4)).at[0].set(jnp.arange(4.0))
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(ln.apply(p, x) ** 2)))(x)


@program("flax attention, masked row", "jax", "clean", "flax.linen.MultiHeadDotProductAttention")
def _():
    jax, jnp, gsj = _jax()
    import flax.linen as nn

    att = nn.MultiHeadDotProductAttention(num_heads=1, qkv_features=4)
    x = jax.random.normal(jax.random.PRNGKey(1), (1, 3, 4))
    mask = jnp.array([[[[True, True, False], [True, True, False], [False, False, False]]]])
    p = att.init(jax.random.PRNGKey(0), x, x, mask=mask)
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(att.apply(p, x, x, mask=mask)[:, :2])))(x)


@program("softmax where= and entropy", "jax", "clean", "jax-ml/jax#17070")
def _():
    jax, jnp, gsj = _jax()

    def f(logits):
        where = jnp.array([True, True, False])
        a = jax.nn.softmax(logits, where=where)
        return jnp.sum(a * logits, where=where)

    return gsj.sanitize(jax.grad(f))(jnp.array([1.0, 1.0, 0.0]))


@program("lax.switch traced index", "jax", "clean", "jax.lax.switch (index clamp)")
def _():
    jax, jnp, gsj = _jax()
    f = lambda i, x: jax.lax.switch(i, [lambda v: 2 * v, lambda v: v**2], x)  # noqa: E731
    return gsj.sanitize(jax.grad(f, argnums=1))(1, 3.0)


@program("equinox LayerNorm zero input", "jax", "clean", "equinox.nn.LayerNorm")
def _():
    jax, jnp, gsj = _jax()
    import equinox as eqx

    ln = eqx.nn.LayerNorm(4)
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(ln(x) ** 2)))(jnp.zeros(4))


@program("straight-through floor", "jax", "clean", "quantization STE (stop_gradient)")
def _():
    jax, jnp, gsj = _jax()
    f = lambda x: jnp.sum((x + jax.lax.stop_gradient(jnp.floor(x) - x)) ** 2)  # noqa: E731
    return gsj.sanitize(jax.grad(f))(jnp.array([1.0, 2.0]))


def _l1(p, y):
    import jax.numpy as jnp

    return jnp.mean(jnp.abs(p - y))  # L:jax-l1


@program("L1 loss at a perfect fit", "jax", "kink", "abs at 0", "abs-at-zero", "jax-l1")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_l1))(jnp.ones(3), jnp.ones(3))


def _mlp(w, x):
    import jax
    import jax.numpy as jnp

    h = jax.nn.relu(x @ w)  # L:jax-relu
    return jnp.sum(h)


@program("MLP relu at 0", "jax", "kink", "relu at 0 (zero input)", "relu-at-zero", "jax-relu")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_mlp))(jnp.ones((2, 3)), jnp.array([[1.0, -1.0]]))


def _leaky(x):
    import jax.numpy as jnp

    return jnp.sum(jnp.where(x > 0, x, 0.1 * x))  # L:jax-leaky


@program("leaky relu by where", "jax", "kink", "where kink", "where-at-boundary", "jax-leaky")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_leaky))(jnp.zeros(2))


def _pool(x):
    import jax.numpy as jnp

    return jnp.max(x * jnp.array([1.0, 2.0]))  # L:jax-max


@program("max over tied features", "jax", "kink", "max tie", "max-tie", "jax-max")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_pool))(jnp.array([2.0, 1.0]))


def _i0(t):
    import jax

    return jax.scipy.special.i0(2 * t - 1)  # L:jax-i0


@program("i0 at 0", "jax", "kink", "jax-ml/jax#40628", "abs-at-zero", "jax-i0")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_i0))(0.5)


def _quant(x):
    import jax.numpy as jnp

    return jnp.sum(jnp.round(x) * x)  # L:jax-round


@program("round in the loss", "jax", "kink", "round at a jump", "floor-round-at-jump", "jax-round")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_quant))(jnp.array([0.5, 1.0]))


def _sortw(x):
    import jax.numpy as jnp

    return jnp.sum(jnp.sort(x) * jnp.arange(3.0))  # L:jax-sort


@program("sort tie, weighted", "jax", "kink", "sort tie", "sort-tie", "jax-sort")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_sortw))(jnp.array([1.0, 1.0, 2.0]))


def _norm(x):
    import jax.numpy as jnp

    return jnp.linalg.norm(x)  # L:jax-norm


@program("norm at 0", "jax", "nan", "jax-ml/jax#3058-like: norm of a zero update", None, "jax-norm")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_norm))(jnp.zeros(3))


# -- added in session 13 (issue 15's named gaps): more public reports and library controls ---


def _argmax_pick(x):
    return x[x.argmax()]  # L:jax-argmax


@program("x[x.argmax()] at a tie", "jax", "kink", "jax-ml/jax#13600", "max-tie", "jax-argmax")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_argmax_pick))(jnp.ones(2))


def _top_eigvec(m):
    import jax.numpy as jnp

    return jnp.linalg.eigh(m)[1][0, 2]  # L:jax-eigvec


@program("eigenvector of a simple eigenvalue", "jax", "nan", "jax-ml/jax#4646", None, "jax-eigvec")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_top_eigvec))(jnp.diag(jnp.array([1.0, 1.0, 4.0])))


@program("nuclear norm, equal singular values", "jax", "clean", "jax-ml/jax#8732")
def _():
    jax, jnp, gsj = _jax()
    f = lambda a: jnp.sum(jnp.linalg.svd(a, compute_uv=False))  # noqa: E731
    return gsj.sanitize(jax.grad(f))(2.0 * jnp.eye(2))


@program("logsumexp by hand, tied max", "jax", "clean", "tensorflow/tensorflow#51681 (max tie)")
def _():
    jax, jnp, gsj = _jax()

    def lse(x):
        m = jnp.max(x)
        return m + jnp.log(jnp.sum(jnp.exp(x - m)))

    return gsj.sanitize(jax.grad(lse))(jnp.array([1.0, 1.0, 0.0]))


@program("celu alpha=1 at 0", "jax", "clean", "jax.nn.celu")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(jax.nn.celu(x))))(jnp.zeros(3))


@program("softmax cross-entropy, tied logits", "jax", "clean", "optax.losses.softmax_cross_entropy")
def _():
    jax, jnp, gsj = _jax()
    import optax

    y = jnp.array([[0.0, 1.0, 0.0]])
    f = lambda z: jnp.sum(optax.losses.softmax_cross_entropy(z, y))  # noqa: E731
    return gsj.sanitize(jax.grad(f))(jnp.ones((1, 3)))


@program("flax RMSNorm zero row", "jax", "clean", "flax.linen.RMSNorm")
def _():
    jax, jnp, gsj = _jax()
    import flax.linen as nn

    ln = nn.RMSNorm()
    x = jnp.zeros((2, 4)).at[1].set(jnp.arange(4.0))
    p = ln.init(jax.random.PRNGKey(0), x)
    return gsj.sanitize(jax.grad(lambda x: jnp.sum(ln.apply(p, x) ** 2)))(x)


@program("Huber by masks at delta", "jax", "clean", "marlbenchmark/on-policy#47")
def _():
    jax, jnp, gsj = _jax()

    def huber(e, d=1.0):
        a = (jnp.abs(e) <= d).astype(e.dtype)
        b = (jnp.abs(e) > d).astype(e.dtype)
        return jnp.sum(a * e**2 / 2 + b * d * (jnp.abs(e) - d / 2))

    return gsj.sanitize(jax.grad(huber))(jnp.array([1.0, -1.0, 0.5]))


def _selu(x):
    import jax
    import jax.numpy as jnp

    return jnp.sum(jax.nn.selu(x))  # L:jax-selu


@program(
    "selu at 0",
    "jax",
    "kink",
    "jax.nn.selu (slopes 1.05 and 1.76)",
    "activation-corner",
    "jax-selu",
)
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_selu))(jnp.zeros(2))


def _ranks(x, w):
    import jax.numpy as jnp

    return jnp.sum(w[jnp.argsort(x)] * x)  # L:jax-argsort


@program(
    "argsort-weighted loss at a tie",
    "jax",
    "kink",
    "elixir-nx/nx#450 (argsort grad)",
    "sort-tie",
    "jax-argsort",
)
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_ranks))(jnp.array([1.0, 1.0, 2.0]), jnp.arange(3.0))


# ---- JAX, session 14: jax.nn's activations at their corners, programs that differentiate a
# gradient, tie kinds whose indices or eigenvectors are used downstream ----------------------


def _flax_leaky(params, x):
    import flax.linen as nn

    dense = nn.Dense(3)
    h = dense.apply(params, x)
    return (nn.leaky_relu(h, 0.2) * jax_w3()).sum()  # L:jax-flax-leaky


def jax_w3():
    import jax.numpy as jnp

    return jnp.array([1.0, 2.0, 3.0])


@program(
    "flax Dense + leaky_relu, zero bias",
    "jax",
    "kink",
    "chainer/chainer#5876 (leaky_relu at 0); flax.linen.leaky_relu",
    "activation-corner",
    "jax-flax-leaky",
)
def _():
    import flax.linen as nn

    jax, jnp, gsj = _jax()
    x = jnp.zeros((1, 4))  # a padded zero row: every pre-activation is the zero bias
    params = nn.Dense(3).init(jax.random.PRNGKey(0), x)
    return gsj.sanitize(jax.grad(_flax_leaky))(params, x)


def _hswish_block(x, w):
    import jax

    return (jax.nn.hard_swish(x @ w) * jax_w3()[:2]).sum()  # L:jax-hswish


@program(
    "MobileNetV3 hard_swish at -3, jit",
    "jax",
    "kink",
    "MobileNetV3 (Howard et al. 2019) block; jax.nn.hard_swish",
    "activation-corner",
    "jax-hswish",
)
def _():
    jax, jnp, gsj = _jax()
    w = jnp.array([[1.0, 0.5], [2.0, -1.0]])
    x = jnp.array([[-1.0, -1.0]])  # x @ w = [-3, 0.5]: the lower corner
    return gsj.sanitize(jax.jit(jax.grad(_hswish_block, argnums=1)))(x, w)


def _relu6_cap(x):
    import jax

    return (jax.nn.relu6(x) * jax_w3()).sum()  # L:jax-relu6


@program(
    "relu6 at its cap 6",
    "jax",
    "kink",
    "MobileNetV2 ReLU6; jax.nn.relu6",
    "activation-corner",
    "jax-relu6",
)
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_relu6_cap))(jnp.array([6.0, 1.0, 7.0]))


@program("hard_swish off its corners", "jax", "clean", "jax.nn.hard_swish")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda x: jax.nn.hard_swish(x).sum()))(jnp.array([-2.9, 0.0]))


def _relu_net(x):
    import jax
    import jax.numpy as jnp

    return jnp.sum(jax.nn.relu(x) * jax_w3())  # L:jax-hess-relu


@program(
    "hessian of relu at 0",
    "jax",
    "kink",
    "patrick-kidger/equinox#801, Theano/Theano#3210 (relu'' at 0)",
    "relu-at-zero",
    "jax-hess-relu",
)
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.hessian(_relu_net))(jnp.array([0.0, 1.0, -1.0]))


@program("hessian of a softplus loss", "jax", "clean", "Newton step on a softplus (logistic) loss")
def _():
    jax, jnp, gsj = _jax()

    def loss(w):
        return jnp.sum(jax.nn.softplus(w * jnp.array([1.0, -2.0, 0.5])))

    return gsj.sanitize(jax.hessian(loss))(jnp.array([0.0, 1.0, 0.0]))


def _penalty(x):
    import jax
    import jax.numpy as jnp

    return jnp.sum(jax.grad(_relu_net)(x) ** 2)


@program(
    "gradient penalty through relu",
    "jax",
    "kink",
    "WGAN-GP gradient penalty (Gulrajani et al. 2017), inner jax.grad",
    "relu-at-zero",
    "jax-hess-relu",
)
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_penalty))(jnp.array([0.0, 1.0, -1.0]))


@program("gradient penalty, smooth critic", "jax", "clean", "WGAN-GP with a softplus critic")
def _():
    jax, jnp, gsj = _jax()

    def critic(x):
        return jnp.sum(jax.nn.softplus(x) * jnp.array([1.0, 2.0, 3.0]))

    def penalty(x):
        return (jnp.linalg.norm(jax.grad(critic)(x)) - 1.0) ** 2

    return gsj.sanitize(jax.grad(penalty))(jnp.array([0.0, 1.0, -1.0]))


@program(
    "straight-through argmax at a tie",
    "jax",
    "clean",
    "straight-through Gumbel-softmax (Jang et al. 2017): one_hot(argmax) + p - sg(p)",
)
def _():
    jax, jnp, gsj = _jax()

    def loss(logits):
        p = jax.nn.softmax(logits)
        hard = jax.nn.one_hot(jnp.argmax(logits), 3)
        y = hard + p - jax.lax.stop_gradient(p)
        return jnp.sum(y * jnp.array([1.0, 2.0, 3.0]))

    return gsj.sanitize(jax.grad(loss))(jnp.array([1.0, 1.0, 0.0]))


def _round_index(x, table):
    import jax.numpy as jnp

    return table[jnp.round(x).astype(jnp.int32)] * x  # L:jax-round-idx


@program(
    "round into a table index at .5",
    "jax",
    "kink",
    "quantized lookup (round to the nearest bin), jnp.round then gather",
    "floor-round-at-jump",
    "jax-round-idx",
)
def _():
    jax, jnp, gsj = _jax()
    table = jnp.array([1.0, 2.0, 4.0])
    return gsj.sanitize(jax.grad(_round_index))(jnp.float32(0.5), table)


@program("eigvalsh of the identity, summed", "jax", "clean", "trace as the sum of eigenvalues")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda a: jnp.linalg.eigvalsh(a).sum()))(jnp.eye(3))


@program("top_k keeping every tied score", "jax", "clean", "top-k pooling (sum of the k best)")
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(lambda x: jax.lax.top_k(x, 3)[0].sum()))(
        jnp.array([1.0, 1.0, 1.0, 0.0])
    )


def _topk_part(x):
    import jax

    return jax.lax.top_k(x, 2)[0].sum()  # L:jax-topk-part


@program(
    "top_k splitting tied scores",
    "jax",
    "kink",
    "top-k pooling, k inside a tie (which tied ones win depends on the direction)",
    "sort-tie",
    "jax-topk-part",
)
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_topk_part))(jnp.array([1.0, 1.0, 1.0, 0.0]))


def _atan2_angle(v):
    import jax.numpy as jnp

    return jnp.arctan2(v[1], v[0])  # L:jax-atan2


@program(
    "angle of a zero vector",
    "jax",
    "convention",
    "jax-ml/jax#2164-style heading angle of a zero velocity",
    "atan2-at-origin",
    "jax-atan2",
)
def _():
    jax, jnp, gsj = _jax()
    return gsj.sanitize(jax.grad(_atan2_angle))(jnp.zeros(2))


# ---- PyTorch --------------------------------------------------------------------------------


def _t():
    import torch

    import gradsan.torch as gst

    return torch, gst


def _tsan(fn):
    _, gst = _t()
    with gst.sanitize() as report:
        fn().backward()
    return report


def _R(v):
    torch, _ = _t()
    return torch.tensor(v, requires_grad=True)


@program("softplus at 0", "torch", "clean", "F.softplus")
def _():
    import torch.nn.functional as F

    return _tsan(lambda: F.softplus(_R([0.0, 1.0])).sum())


@program("logaddexp tie", "torch", "clean", "torch.logaddexp")
def _():
    torch, _ = _t()
    return _tsan(lambda: torch.logaddexp(_R([1.0]), _R([1.0])).sum())


@program("LayerNorm zero row", "torch", "clean", "torch.nn.LayerNorm")
def _():
    torch, _ = _t()
    ln = torch.nn.LayerNorm(3)
    return _tsan(lambda: ln(_R([[0.0, 0.0, 0.0]])).pow(2).sum())


@program("Huber at delta", "torch", "clean", "F.huber_loss")
def _():
    torch, _ = _t()
    import torch.nn.functional as F

    return _tsan(lambda: F.huber_loss(_R([1.0, -1.0]), torch.zeros(2), delta=1.0))


@program("ELU alpha=1 at 0", "torch", "clean", "F.elu")
def _():
    import torch.nn.functional as F

    return _tsan(lambda: F.elu(_R([0.0]), alpha=1.0).sum())


@program("masked attention (SDPA)", "torch", "clean", "pytorch/pytorch#41508 (SDPA path)")
def _():
    torch, _ = _t()
    import torch.nn.functional as F

    def f():
        q = _R([[[1.0, 0.0], [0.0, 1.0]]])
        m = torch.tensor([[[True, True], [True, False]]])
        return F.scaled_dot_product_attention(q, q, q, attn_mask=m).sum()

    return _tsan(f)


@program("accuracy on integer labels", "torch", "clean", "torch.where(labels == k, ...)")
def _():
    torch, _ = _t()
    import torch.nn.functional as F

    def f():
        logits = _R([[1.0, 2.0], [0.5, 0.1]])
        labels = torch.tensor([1, 1])
        picked = torch.where(labels[:, None] == 1, logits, torch.zeros(2, 2))
        return F.cross_entropy(logits, labels) + 0.0 * picked.sum()

    return _tsan(f)


def _tact_mlp(act):
    torch, _ = _t()
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 4)
    with torch.no_grad():
        lin.bias.zero_()
    net = torch.nn.Sequential(lin, act, torch.nn.Linear(4, 1))
    return _tsan(lambda: net(torch.zeros(2, 3)).sum())  # L:torch-act


@program(
    "LeakyReLU MLP at 0",
    "torch",
    "kink",
    "nn.LeakyReLU on a zero input, zero bias (slopes 0.01 and 1)",
    "activation-corner",
    "torch-act",
)
def _():
    torch, _ = _t()
    return _tact_mlp(torch.nn.LeakyReLU())


@program(
    "SELU MLP at 0", "torch", "kink", "nn.SELU (slopes 1.05 and 1.76)", "activation-corner",
    "torch-act",
)  # fmt: skip
def _():
    torch, _ = _t()
    return _tact_mlp(torch.nn.SELU())


@program("ELU(1) MLP at 0", "torch", "clean", "nn.ELU() is C^1 at 0")
def _():
    torch, _ = _t()
    return _tact_mlp(torch.nn.ELU())


@program("MobileNetV3 block", "torch", "clean", "nn.Hardswish, nn.Hardsigmoid, F.relu6 off corners")
def _():
    torch, _ = _t()
    import torch.nn.functional as F

    def f():
        x = _R([[-2.5, -0.5, 1.0, 4.0]])
        return (F.hardswish(x) * torch.nn.Hardsigmoid()(x) + F.relu6(2 * x)).sum()

    return _tsan(f)


@program("frozen relu (no grad)", "torch", "clean", "requires_grad=False input")
def _():
    torch, _ = _t()
    w = torch.zeros(3)
    return _tsan(lambda: (torch.relu(w) * _R([1.0, 2.0, 3.0])).sum())


def _tconv():
    torch, _ = _t()
    import torch.nn.functional as F

    R = _R
    out = {}
    out["abs"] = lambda: torch.abs(R([0.0, 1.0])).sum()  # L:t-abs
    out["relu"] = lambda: torch.relu(R([0.0, 1.0])).sum()  # L:t-relu
    out["maximum"] = lambda: torch.maximum(R([1.0]), R([1.0])).sum()  # L:t-maximum
    out["clamp"] = lambda: torch.clamp(R([0.0, 0.5]), 0, 1).sum()  # L:t-clamp
    w3 = torch.arange(3.0)
    out["sort"] = lambda: (torch.sort(R([1.0, 1.0, 2.0])).values * w3).sum()  # L:t-sort
    out["topk"] = lambda: torch.topk(R([2.0, 2.0, 1.0]), 1).values.sum()  # L:t-topk
    out["floor"] = lambda: (lambda x: (torch.floor(x) * x).sum())(R([2.0]))  # L:t-floor
    out["where"] = lambda: (lambda x: torch.where(x > 0, x, 2 * x).sum())(R([0.0]))  # L:t-where
    out["atan2"] = lambda: (lambda p: torch.atan2(p[0], p[1]))(R([0.0, 0.0]))  # L:t-atan2
    out["linalg.norm"] = lambda: torch.linalg.norm(R([0.0, 0.0]))  # L:t-linalg.norm
    out["std"] = lambda: torch.std(R([1.0, 1.0]))  # L:t-std
    out["pdist"] = lambda: torch.pdist(R([[1.0, 2.0], [1.0, 2.0]])).sum()  # L:t-pdist
    out["cdist"] = lambda: torch.cdist(R([[1.0, 2.0]]), R([[1.0, 2.0]])).sum()  # L:t-cdist
    inf = float("inf")
    out["inf-norm"] = lambda: torch.linalg.vector_norm(R([1.0, -1.0, 0.5]), ord=inf)  # L:t-inf-norm
    out["quantile"] = lambda: torch.quantile(R([1.0, 1.0, 3.0, 4.0]), 0.4)  # L:t-quantile
    eye = torch.eye(3)
    out["eigvalsh"] = lambda: torch.linalg.eigvalsh(R(1.0) * eye)[-1]  # L:t-eigvalsh
    nz = [0.0, 1.0, 2.0]
    out["normalize"] = lambda: (F.normalize(R(nz), p=1, dim=0) * w3).sum()  # L:t-normalize
    out["det"] = lambda: torch.linalg.det(R([[1.0, 2.0], [2.0, 4.0]]))  # L:t-det
    return out


_TCONV = {
    "abs": "abs-at-zero",
    "relu": "relu-at-zero",
    "maximum": "max-tie",
    "clamp": "clip-at-bound",
    "sort": "sort-tie",
    "topk": "sort-tie",
    "floor": "floor-round-at-jump",
    "where": "where-at-boundary",
    "atan2": "atan2-at-origin",
    "linalg.norm": "norm-at-zero",
    "std": "std-of-constant",
    "pdist": "norm-at-zero",
    "cdist": "norm-at-zero",
    "inf-norm": "max-tie",
    "quantile": "sort-tie",
    "eigvalsh": "eigh-repeated-eigenvalues",
    "normalize": "abs-at-zero",
    "det": "det-at-singular",
}
for _name, _entry in _TCONV.items():
    PROGRAMS.append(
        Program(
            _name,
            "torch",
            "convention",
            "torch silent convention",
            (lambda n=_name: _tsan(_tconv()[n])),
            _entry,
            f"t-{_name}",
        )
    )


@program("sqrt at 0", "torch", "nan", "torch.sqrt of a zero distance", None, "t-sqrt")
def _():
    torch, _ = _t()
    c = torch.tensor([1.0, 2.0])
    return _tsan(lambda: torch.sqrt((_R([1.0, 2.0]) - c) ** 2).sum())  # L:t-sqrt


# -- added in session 13 ----------------------------------------------------------------------


@program("Huber by torch.where at delta", "torch", "clean", "bghira/SimpleTuner#1583 (huber)")
def _():
    torch, _ = _t()

    def huber(r, d=1.0):
        return torch.where(r.abs() < d, 0.5 * r**2, d * (r.abs() - 0.5 * d)).sum()

    return _tsan(lambda: huber(_R([1.0, -1.0, 0.3])))


@program("Huber by masks at delta", "torch", "clean", "marlbenchmark/on-policy#47")
def _():
    torch, _ = _t()

    def huber(e, d=1.0):
        a = (e.abs() <= d).float()
        b = (e.abs() > d).float()
        return (a * e**2 / 2 + b * d * (e.abs() - d / 2)).sum()

    return _tsan(lambda: huber(_R([1.0, -1.0, 0.5])))


@program("ELU by torch.where, alpha=1", "torch", "clean", "hand-written ELU")
def _():
    torch, _ = _t()
    return _tsan(lambda: (lambda x: torch.where(x > 0, x, torch.exp(x) - 1).sum())(_R([0.0, 1.0])))


@program("logsumexp by hand, tied max", "torch", "clean", "tensorflow/tensorflow#51681 (max tie)")
def _():
    torch, _ = _t()

    def lse(x):
        m = x.max(dim=-1, keepdim=True).values
        return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).sum()

    return _tsan(lambda: lse(_R([[1.0, 1.0, 0.0]])))


@program("max over broadcast copies", "torch", "clean", "rusty1s/pytorch_scatter#399 (max vs amax)")
def _():
    torch, _ = _t()
    return _tsan(lambda: _R([1.0, 2.0]).unsqueeze(0).expand(2, -1).max(0).values.sum())


@program("sort of a sum (symmetric)", "torch", "clean", "torch.sort ties, symmetric loss")
def _():
    torch, _ = _t()
    return _tsan(lambda: torch.sort(_R([1.0, 1.0, 2.0])).values.sum())


@program("cross_entropy, tied logits", "torch", "clean", "F.cross_entropy")
def _():
    torch, _ = _t()
    import torch.nn.functional as F

    return _tsan(lambda: F.cross_entropy(_R([[1.0, 1.0, 0.0]]), torch.tensor([1])))


@program("MultiheadAttention, padded keys", "torch", "clean", "torch.nn.MultiheadAttention")
def _():
    torch, _ = _t()
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(4, 1, batch_first=True)
    x = torch.randn(1, 3, 4, requires_grad=True)
    pad = torch.tensor([[False, False, True]])
    return _tsan(lambda: mha(x, x, x, key_padding_mask=pad)[0].sum())


@program("smooth_l1 at beta", "torch", "clean", "F.smooth_l1_loss")
def _():
    torch, _ = _t()
    import torch.nn.functional as F

    return _tsan(lambda: F.smooth_l1_loss(_R([1.0, -1.0]), torch.zeros(2), beta=1.0))


def _targmax(x):
    return x[x.argmax()]  # L:t-argmax


@program(
    "x[x.argmax()] at a tie", "torch", "kink", "jax-ml/jax#13600 in torch", "max-tie", "t-argmax"
)
def _():
    return _tsan(lambda: _targmax(_R([1.0, 1.0, 0.0])))


def _tleaky(x):
    import torch

    return torch.where(x > 0, x, 0.01 * x).sum()  # L:t-leaky


@program("leaky relu by where at 0", "torch", "kink", "where kink", "where-at-boundary", "t-leaky")
def _():
    return _tsan(lambda: _tleaky(_R([0.0, 1.0])))


def _tmaxdiff(x):
    import torch

    return torch.maximum(x, x**2).sum()  # L:t-maxdiff


@program(
    "max of two functions at a tie",
    "torch",
    "kink",
    "pytorch/pytorch#56734",
    "max-tie",
    "t-maxdiff",
)
def _():
    return _tsan(lambda: _tmaxdiff(_R([1.0])))


def _tsqrtnorm(x):
    import torch

    return torch.sqrt((x**2).sum())  # L:t-sqrtnorm


@program("norm by sqrt at 0", "torch", "nan", "norm of a zero update, by hand", None, "t-sqrtnorm")
def _():
    return _tsan(lambda: _tsqrtnorm(_R([0.0, 0.0])))


# ---- PyTorch: piecewise activations, in-place kink calls (session 14, torch) ----------------


class _BasicBlock:
    """torchvision.models.resnet.BasicBlock as written there (conv3x3 without bias, BatchNorm2d,
    one nn.ReLU(inplace=True) used twice, the identity added before the second)."""

    def __init__(self, c):
        torch, _ = _t()
        nn = torch.nn
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def __call__(self, x):
        identity = x
        # at 0 too: its choice reaches the loss through the second relu, whose PyTorch's 0
        # blocks it; with the second relu on the side it moves to (slope 1) it is the
        # gradient: flagged since session 15 (counted before)
        out = self.relu(self.bn1(self.conv1(x)))  # L:t-basicblock-1
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)  # L:t-basicblock


def _tblock(x):
    torch, _ = _t()
    torch.manual_seed(0)
    block = _BasicBlock(2)
    target = torch.randn(2, 2, 4, 4)
    return _tsan(lambda: ((block(x) - target) ** 2).mean())


@program(
    "ResNet BasicBlock, blank image",
    "torch",
    "kink",
    "torchvision resnet BasicBlock (ReLU(inplace=True)) in training on an all-zero batch: "
    "BatchNorm of a constant is its bias, 0",
    "relu-at-zero",
    "t-basicblock",
)
def _():
    torch, _ = _t()
    return _tblock(torch.zeros(2, 2, 4, 4, requires_grad=True))


@program(
    "ResNet BasicBlock, random image",
    "torch",
    "clean",
    "torchvision resnet BasicBlock (ReLU(inplace=True)) on a random batch",
)
def _():
    torch, _ = _t()
    torch.manual_seed(1)
    return _tblock(torch.randn(2, 2, 4, 4, requires_grad=True))


def _tfsrcnn(x):
    """yjn870/FSRCNN-pytorch models.py, small: first_part Conv2d(1, d, 5) + nn.PReLU(d), a
    shrink/map layer with its PReLU, the ConvTranspose2d last part; biases zero-initialized as
    its _initialize_weights does."""
    torch, _ = _t()
    nn = torch.nn
    torch.manual_seed(0)
    first = nn.Sequential(nn.Conv2d(1, 4, 5, padding=2), nn.PReLU(4))
    mid = nn.Sequential(nn.Conv2d(4, 2, 1), nn.PReLU(2))
    last = nn.ConvTranspose2d(2, 1, 9, stride=2, padding=4, output_padding=1)
    for m in (first[0], mid[0], last):
        nn.init.zeros_(m.bias)
    target = torch.rand(1, 1, 12, 12)

    def f():
        h = first(x)  # L:t-fsrcnn
        return ((last(mid(h)) - target) ** 2).mean()

    return _tsan(f)


@program(
    "FSRCNN, black patch",
    "torch",
    "kink",
    "yjn870/FSRCNN-pytorch (nn.PReLU(d) after a zero-bias conv) on a black patch",
    "activation-corner",
    "t-fsrcnn",
)
def _():
    torch, _ = _t()
    return _tfsrcnn(torch.zeros(1, 1, 6, 6))


@program("FSRCNN, random patch", "torch", "clean", "yjn870/FSRCNN-pytorch on a random patch")
def _():
    torch, _ = _t()
    torch.manual_seed(2)
    return _tfsrcnn(torch.rand(1, 1, 6, 6))


def _tlista(x):
    """AbhyudayPuri/learnable-ISTA lista.py: Z = soft_thresh(B + S Z), three passes, with
    nn.Softshrink(lambd=0.01); W and S initialized from ISTA (W = A^T / L, S = I - A^T A / L)
    for A = I, L = 2."""
    torch, _ = _t()
    n = x.shape[0]
    w = torch.nn.Parameter(torch.eye(n) / 2)
    s = torch.nn.Parameter(torch.eye(n) / 2)
    soft = torch.nn.Softshrink(lambd=0.01)

    def f():
        b = w @ x
        z = soft(b)  # at lambd: reaches the loss only through the next passes (counted)
        for _ in range(3):
            z = soft(b + s @ z)  # L:t-lista
        return ((z - 0.5 * x) ** 2).sum()

    return _tsan(f)


@program(
    "LISTA, measurement at lambd",
    "torch",
    "kink",
    "AbhyudayPuri/learnable-ISTA (nn.Softshrink(0.01)), W x = 0.01 for a measurement of 0.02",
    "activation-corner",
    "t-lista",
)
def _():
    torch, _ = _t()
    return _tlista(torch.tensor([0.02, 0.5, -0.3]))


@program("LISTA, random measurement", "torch", "clean", "AbhyudayPuri/learnable-ISTA")
def _():
    torch, _ = _t()
    torch.manual_seed(3)
    return _tlista(torch.randn(3))


def _thard(coef):
    torch, _ = _t()
    shrink = torch.nn.Hardshrink(0.5)
    return _tsan(lambda: (shrink(_R(coef)) ** 2).sum())  # L:t-hardshrink


@program(
    "hard thresholding at lambd",
    "torch",
    "kink",
    "hard-threshold denoising (torch7 nn.HardShrink / nn.Hardshrink) of quantized "
    "coefficients, one exactly at lambd",
    "activation-jump",
    "t-hardshrink",
)
def _():
    return _thard([0.5, 0.75, -0.25])


@program("hard thresholding off lambd", "torch", "clean", "nn.Hardshrink(0.5)")
def _():
    return _thard([0.625, 0.75, -0.25])


@program(
    "nn.Threshold(0.1, 20) at 0.1",
    "torch",
    "kink",
    "PyTorch's nn.Threshold docs example (threshold 0.1, value 20)",
    "activation-jump",
    "t-threshold",
)
def _():
    torch, _ = _t()
    m = torch.nn.Threshold(0.1, 20.0)
    return _tsan(lambda: m(_R([0.1, 0.7, -1.0])).sum())  # L:t-threshold


@program(
    "RReLU (eval) MLP at 0", "torch", "kink", "PyTorch's nn.RReLU(0.1, 0.3) docs example, eval "
    "mode (slope 0.2)", "activation-corner", "torch-act",
)  # fmt: skip
def _():
    torch, _ = _t()
    return _tact_mlp(torch.nn.RReLU(0.1, 0.3).eval())


@program(
    "DCGAN LeakyReLU(0.2, inplace) at 0",
    "torch",
    "kink",
    "pytorch/examples dcgan Discriminator's nn.LeakyReLU(0.2, inplace=True)",
    "activation-corner",
    "torch-act",
)
def _():
    torch, _ = _t()
    return _tact_mlp(torch.nn.LeakyReLU(0.2, inplace=True))


@program("PReLU(init=1) MLP at 0", "torch", "clean", "nn.PReLU with slope 1 is the identity")
def _():
    torch, _ = _t()
    return _tact_mlp(torch.nn.PReLU(init=1.0))


@program(
    "SR output clamp_(0, 1) beyond the range",
    "torch",
    "clean",
    "super-resolution training clipping its prediction in place, values outside [0, 1]",
)
def _():
    torch, _ = _t()
    w = _R([2.0, -0.5, 0.25])
    return _tsan(lambda: ((w * 1.0).clamp_(0.0, 1.0) - 0.5).pow(2).sum())


@program(
    "ResNet BasicBlock, blank image: first relu",
    "torch",
    "kink",
    "torchvision resnet BasicBlock: the first ReLU(inplace=True), in series with the second",
    "relu-at-zero",
    "t-basicblock-1",
)
def _():
    torch, _ = _t()
    return _tblock(torch.zeros(2, 2, 4, 4, requires_grad=True))


# ---- session 15: kinks in series, equinox's differentiation wrappers ------------------------


def _tvgg(x):
    """torchvision.models.vgg's features block: Conv2d(padding=1), ReLU(inplace=True),
    MaxPool2d(2, 2), then the classifier's Linear."""
    torch, _ = _t()
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(1, 2, 3, padding=1)
    torch.nn.init.zeros_(conv.bias)  # as torchvision's VGG init (constant_(m.bias, 0))
    relu = torch.nn.ReLU(inplace=True)
    pool = torch.nn.MaxPool2d(2, 2)
    fc = torch.nn.Linear(8, 1)

    def loss():
        h = relu(conv(x))  # L:t-vgg
        return fc(pool(h).flatten()).sum()

    return _tsan(loss)


@program(
    "VGG conv-ReLU-MaxPool, blank image",
    "torch",
    "kink",
    "torchvision.models.vgg features (ReLU(inplace=True) then MaxPool2d): every window ties at "
    "0; the relu's choice reaches the loss through the pool's chosen element (caught on main "
    "too: a guard)",
    "relu-at-zero",
    "t-vgg",
)
def _():
    torch, _ = _t()
    return _tvgg(torch.zeros(1, 1, 4, 4))


@program(
    "VGG conv-ReLU-MaxPool, random image",
    "torch",
    "clean",
    "torchvision.models.vgg features on a random image",
)
def _():
    torch, _ = _t()
    torch.manual_seed(3)
    return _tvgg(torch.randn(1, 1, 4, 4))


def _tmlp_blank(x):
    torch, _ = _t()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 4) for _ in range(3)]
    for m in layers:
        torch.nn.init.zeros_(m.bias)
    h = torch.relu(layers[0](x))  # L:t-mlp-blank
    h = torch.relu(layers[1](h))
    return torch.relu(layers[2](h)).sum()


@program(
    "MLP with zero biases, all-zero rows",
    "torch",
    "kink",
    "a padded (all-zero) batch row through nn.Linear layers with zero-initialized biases "
    "(the nn.init.zeros_ bias init of many examples): every layer's relu at 0, in series; the "
    "first layer's (marked) was counted on main, blocked by the next one's 0",
    "relu-at-zero",
    "t-mlp-blank",
)
def _():
    torch, _ = _t()
    x = torch.zeros(2, 4, requires_grad=True)
    return _tsan(lambda: _tmlp_blank(x))


def _jvgg(params, x):
    import flax.linen as nn

    h = nn.Conv(2, (3, 3), padding="SAME").apply(params, x)
    h = nn.relu(h)  # L:jax-vgg
    h = nn.max_pool(h, (2, 2), strides=(2, 2))
    return (h.reshape(-1) * jax_w8()).sum()


def jax_w8():
    import jax.numpy as jnp

    return jnp.linspace(0.5, 2.0, 8)


@program(
    "flax conv-relu-max_pool, blank image",
    "jax",
    "kink",
    "flax.linen Conv (zero bias init), nn.relu, nn.max_pool as in VGG-style flax CNNs: every "
    "window ties at 0 (caught on main too: a guard)",
    "relu-at-zero",
    "jax-vgg",
)
def _():
    import flax.linen as nn

    jax, jnp, gsj = _jax()
    x = jnp.zeros((1, 4, 4, 1))
    params = nn.Conv(2, (3, 3), padding="SAME").init(jax.random.PRNGKey(0), x)
    return gsj.sanitize(jax.grad(_jvgg))(params, x)


@program("flax conv-relu-max_pool, random image", "jax", "clean", "the same CNN, random image")
def _():
    import flax.linen as nn

    jax, jnp, gsj = _jax()
    x = jax.random.normal(jax.random.PRNGKey(4), (1, 4, 4, 1))
    params = nn.Conv(2, (3, 3), padding="SAME").init(jax.random.PRNGKey(0), x)
    return gsj.sanitize(jax.grad(_jvgg))(params, x)


def _jmlp_blank(params, x):
    import jax

    (w1, b1), (w2, b2), (w3, b3) = params
    h = jax.nn.relu(x @ w1 + b1)  # L:jax-mlp-blank
    h = jax.nn.relu(h @ w2 + b2)
    return jax.nn.relu(h @ w3 + b3).sum()


@program(
    "MLP with zero biases, all-zero rows",
    "jax",
    "kink",
    "a padded (all-zero) batch row through dense layers with zero biases (flax/haiku's default "
    "zeros bias init): every relu at 0, in series; the first layer's (marked) was counted on "
    "main, blocked by the next one's 0",
    "relu-at-zero",
    "jax-mlp-blank",
)
def _():
    jax, jnp, gsj = _jax()
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [(jax.random.normal(k, (4, 4)) * 0.5, jnp.zeros(4)) for k in ks]
    return gsj.sanitize(jax.grad(_jmlp_blank))(params, jnp.zeros((2, 4)))


def _eqx_mlp(act):
    import equinox as eqx
    import jax

    return eqx.nn.MLP(
        3, 1, 8, 2, activation=act, use_bias=False, use_final_bias=False, key=jax.random.PRNGKey(0)
    )


def _eqx_loss(model, x):
    import jax

    return jax.vmap(model)(x).sum()  # L:jax-eqx-mlp


@program(
    "eqx.filter_grad of a softplus MLP, zero input",
    "jax",
    "clean",
    "equinox docs (eqx.nn.MLP without biases, eqx.filter_grad): every pre-activation 0, "
    "softplus's inner max and abs at 0 were listed unchecked on main",
)
def _():
    import equinox as eqx

    jax, jnp, gsj = _jax()
    model = _eqx_mlp(jax.nn.softplus)
    return gsj.sanitize(eqx.filter_grad(_eqx_loss))(model, jnp.zeros((2, 3)))


@program(
    "eqx.filter_hessian of a softplus loss at 0",
    "jax",
    "clean",
    "equinox eqx.filter_hessian (the Hessian of a smooth loss exists)",
)
def _():
    import equinox as eqx

    jax, jnp, gsj = _jax()
    return gsj.sanitize(eqx.filter_hessian(lambda x: jnp.sum(jax.nn.softplus(x))))(jnp.zeros(3))


def _eqx_relu(x):
    import jax
    import jax.numpy as jnp

    return jnp.sum(jax.nn.relu(x) ** 2) + jnp.sum(jax.nn.relu(x))  # L:jax-eqx-hess


@program(
    "eqx.filter_hessian of a relu loss at 0",
    "jax",
    "kink",
    "equinox eqx.filter_hessian: relu' jumps at 0, no Hessian there",
    "relu-at-zero",
    "jax-eqx-hess",
)
def _():
    import equinox as eqx

    jax, jnp, gsj = _jax()
    return gsj.sanitize(eqx.filter_hessian(_eqx_relu))(jnp.zeros(3))


# ---- the run --------------------------------------------------------------------------------


def judge(p: Program, report) -> tuple[bool, str]:
    kinks = [f for f in report.findings if f.kind in ("kink", "convention")]
    if p.kind == "clean":
        ok = not kinks
        return ok, "clean" if ok else "FALSE FLAG " + ",".join(f.catalog_id for f in kinks)
    want = line(p.marker) if p.marker else None
    if p.kind == "nan":
        hits = [f for f in report.findings if f.kind == "nonfinite"]
        ok = any(f.where is not None and f.where.line == want for f in hits)
        return ok, "located" if ok else f"NOT located {[(f.catalog_id, f.where) for f in hits]}"
    ok = any(
        f.catalog_id == p.entry and f.where is not None and f.where.line == want for f in kinks
    )
    got = [(f.catalog_id, f.where.line if f.where else None) for f in kinks]
    return ok, "caught" if ok else f"MISSED (got {got})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="a regular expression on the program names")
    ns = ap.parse_args(argv)
    tally: dict[tuple[str, str], list[int]] = {}
    for p in PROGRAMS:
        if ns.only and not re.search(ns.only, p.name):
            continue
        try:
            ok, what = judge(p, p.run())
        except Exception as e:  # noqa: BLE001 - a crash is a result here
            ok, what = False, f"ERROR {type(e).__name__}: {e}"
            traceback.print_exc(limit=1, file=sys.stderr)
        t = tally.setdefault((p.backend, p.kind), [0, 0])
        t[0] += int(ok)
        t[1] += 1
        print(f"{p.backend:5s} {p.kind:10s} {p.name:32s} {what}   [{p.source}]")
    print()
    for (be, kind), (good, n) in sorted(tally.items()):
        label = {
            "clean": "clean programs without a false flag",
            "kink": "kinks flagged at their line",
            "convention": "silent conventions flagged at their line",
            "nan": "NaN cases located",
        }[kind]
        print(f"{be:5s} {label}: {good} of {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
