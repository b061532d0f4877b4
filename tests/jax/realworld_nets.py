"""Training programs people write with flax (linen, NNX), equinox and optax, each made to NaN
the way a public report says such code does (the URL above each program).

Every ``make_*`` returns ``(fun, args)``: a gradient or a whole train step and the arguments
at which it returns a NaN. ``CLEAN[name]`` is the same call at healthy arguments. The tests in
test_realworld_nets.py run gradsan on them as a user would."""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

# -- 1. flax linen MNIST classifier with dropout and a typed key; log(softmax) -------------------
# https://github.com/google/flax/tree/main/examples/mnist (train.py) made to NaN as
# https://github.com/pytorch/pytorch/issues/31829 and jax-ml/jax#6811 describe: a log of a
# softmax that underflowed to 0 for a confident logit.


class MnistMLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(32)(x)
        x = nn.relu(x)
        x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(10)(x)


def mnist_loss(params, x, y, key):
    logits = MnistMLP().apply({"params": params}, x, train=True, rngs={"dropout": key})
    logp = jnp.log(nn.softmax(logits))  # L:mnist-log
    return -jnp.mean(jnp.sum(jax.nn.one_hot(y, 10) * logp, axis=-1))


MNIST_TX = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 2, 10)),
)


@jax.jit
def mnist_step(params, opt_state, x, y, key):
    loss, grads = jax.value_and_grad(mnist_loss)(params, x, y, key)
    updates, opt_state = MNIST_TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def _mnist_data():
    key = jax.random.key(0)
    x = jax.random.normal(key, (4, 8))
    params = MnistMLP().init({"params": key}, x, train=False)["params"]
    return key, x, jnp.array([1, 2, 3, 4]), params


def make_mnist_grad(bad=True):
    key, x, y, params = _mnist_data()
    if bad:
        x = x.at[0].set(1e4)  # an unnormalised image: one logit dominates by thousands
    return jax.grad(mnist_loss), (params, x, y, jax.random.key(1))


def make_mnist_step(bad=True):
    key, x, y, params = _mnist_data()
    if bad:
        x = x.at[0].set(1e4)
    return mnist_step, (params, MNIST_TX.init(params), x, y, jax.random.key(1))


# -- 2. flax VAE (examples/vae) with a hand-written binary cross-entropy ------------------------
# https://github.com/google/flax/tree/main/examples/vae (train.py: binary_cross_entropy_with_logits,
# kl_divergence); written with log(sigmoid) as https://github.com/rushter/MLAlgorithms/pull/30 and
# https://github.com/tracel-ai/burn/issues/5373 describe, a saturated sigmoid gives log(0).


class VAE(nn.Module):
    latents: int = 4

    @nn.compact
    def __call__(self, x, z_rng):
        h = nn.relu(nn.Dense(16, name="enc")(x))
        mean = nn.Dense(self.latents, name="mean")(h)
        logvar = nn.Dense(self.latents, name="logvar")(h)
        std = jnp.exp(0.5 * logvar)
        z = mean + std * jax.random.normal(z_rng, logvar.shape)
        logits = nn.Dense(x.shape[-1], name="dec")(z)
        return logits, mean, logvar


def vae_loss(params, x, z_rng):
    logits, mean, logvar = VAE().apply({"params": params}, x, z_rng)
    recon = nn.sigmoid(logits)
    bce = -jnp.sum(x * jnp.log(recon) + (1.0 - x) * jnp.log(1.0 - recon))  # L:vae-bce
    kld = -0.5 * jnp.sum(1 + logvar - jnp.square(mean) - jnp.exp(logvar))
    return bce + kld


def make_vae_grad(bad=True):
    key = jax.random.key(0)
    x = (jax.random.uniform(key, (2, 6)) > 0.5).astype(jnp.float32)
    params = VAE().init(key, x, key)["params"]
    if bad:  # a decoder bias that has run away: sigmoid(60) rounds to 1.0 in float32
        params = {**params, "dec": {**params["dec"], "bias": jnp.full((6,), 60.0)}}
    return jax.grad(vae_loss), (params, x, jax.random.key(3))


# -- 3. flax NNX contrastive (SimCLR-style) loss: cosine similarity of a zero embedding ---------
# https://github.com/jax-ml/jax/issues/3058 and jax-ml/jax#4177: the gradient of norm at a zero
# vector; https://github.com/google-deepmind/optax/pull/1743 (cosine_similarity's epsilon).


class Encoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.lin = nnx.Linear(4, 8, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x):
        return self.drop(nnx.gelu(self.lin(x)))


def nnx_contrastive_loss(model, a, b):
    za, zb = model(a), model(b)
    na = jnp.linalg.norm(za, axis=-1)  # L:nnx-norm
    nb = jnp.linalg.norm(zb, axis=-1)
    cos = jnp.sum(za * zb, axis=-1) / (na * nb + 1e-8)
    return jnp.mean(1.0 - cos)


@nnx.jit
def nnx_step(model, optimizer, a, b):
    loss, grads = nnx.value_and_grad(nnx_contrastive_loss)(model, a, b)
    optimizer.update(model, grads)
    return loss


def new_nnx_model():
    model = Encoder(nnx.Rngs(0))
    model.lin.bias[...] = jnp.zeros(8)
    return model


def _nnx_batch(bad):
    a = jnp.ones((3, 4)) * jnp.array([1.0, 2.0, 3.0])[:, None]
    if bad:
        a = a.at[1].set(0.0)  # an all-zero (padding) row: gelu(W 0 + 0) = 0, norm 0
    return a, a * 0.5 + 0.1


def make_nnx_grad(bad=True):
    model = new_nnx_model()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_of_params(params, a, b):
        return nnx_contrastive_loss(nnx.merge(graphdef, params, rest), a, b)

    return jax.grad(loss_of_params), (params, *_nnx_batch(bad))


def make_nnx_step(bad=True):
    model = new_nnx_model()
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    return nnx_step, (model, optimizer, *_nnx_batch(bad))


# -- 4. equinox MLP with a soft-margin loss written as log(1 + exp(.)) ----------------------------
# https://github.com/tracel-ai/burn/issues/5373 (softplus through exp overflows, NaN gradient;
# SoftMarginLoss inherits it) and https://github.com/rushter/MLAlgorithms/pull/30, in the shape
# of https://github.com/patrick-kidger/equinox/tree/main/examples (train_rnn / mnist).


class SoftMarginNet(eqx.Module):
    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(3, "scalar", width_size=8, depth=2, activation=jax.nn.tanh, key=key)

    def __call__(self, x):
        return self.mlp(x)


@eqx.filter_grad
def eqx_soft_margin_grad(model, x, y):
    pred = jax.vmap(model)(x)
    return jnp.mean(jnp.log(1.0 + jnp.exp(-y * pred)))  # L:eqx-softplus


def make_eqx_grad(bad=True):
    model = SoftMarginNet(jax.random.key(0))
    x = jnp.array([[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]])
    if bad:  # a confidently wrong prediction: -y * pred > 88.7, exp overflows in float32
        model = eqx.tree_at(lambda m: m.mlp.layers[-1].bias, model, jnp.array(200.0))
    return eqx_soft_margin_grad, (model, x, jnp.array([-1.0, 1.0]))


# -- 5. equinox + optax train step: a hand-written LayerNorm with std (eqx.filter_jit) ------------
# https://github.com/patrick-kidger/equinox/pull/314 (LayerNorm NaN from rsqrt of variance),
# https://github.com/FluxML/Flux.jl/issues/2096 (the gradient of std at a constant row is NaN
# although eps protects the forward value).


class NormMLP(eqx.Module):
    lin1: eqx.nn.Linear
    lin2: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.lin1 = eqx.nn.Linear(4, 6, use_bias=False, key=k1)
        self.lin2 = eqx.nn.Linear(6, 1, key=k2)

    def __call__(self, x):
        h = self.lin1(x)
        h = (h - jnp.mean(h)) / (jnp.std(h) + 1e-5)  # L:eqx-std
        return self.lin2(h)[0]


EQX_OPT = optax.adamw(1e-3)


@eqx.filter_jit
def eqx_step(model, opt_state, x, y):
    def loss(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    updates, opt_state = EQX_OPT.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, value


def make_eqx_step(bad=True):
    model = NormMLP(jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (3, 4))
    if bad:  # a padding row of zeros: lin1(0) = 0 (no bias) is a constant row, std 0
        x = x.at[2].set(0.0)
    opt_state = EQX_OPT.init(eqx.filter(model, eqx.is_array))
    return eqx_step, (model, opt_state, x, jnp.array([0.1, 0.2, 0.3]))


# -- 6. lm1b/wmt weighted cross-entropy over an all-padding batch ---------------------------------
# https://github.com/google/flax/blob/main/examples/wmt/train.py (compute_weighted_cross_entropy:
# the loss is divided by the sum of the weights); a batch of padding only has weight 0: 0 / 0.


def weighted_xent(logits, targets, weights):
    soft = jax.nn.one_hot(targets, logits.shape[-1])
    loss = -jnp.sum(soft * jax.nn.log_softmax(logits), axis=-1)
    loss = loss * weights
    return loss.sum() / weights.sum()  # L:wmt-div


class TinyLM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        h = nn.Embed(11, 8)(tokens)
        return nn.Dense(11)(h)


def wmt_loss(params, tokens, targets):
    logits = TinyLM().apply({"params": params}, tokens)
    weights = jnp.where(targets > 0, 1.0, 0.0)
    return weighted_xent(logits, targets, weights)


def make_wmt_grad(bad=True):
    tokens = jnp.array([[1, 2, 3, 0], [4, 5, 0, 0]])
    params = TinyLM().init(jax.random.key(0), tokens)["params"]
    targets = jnp.zeros_like(tokens) if bad else jnp.array([[2, 3, 4, 0], [5, 6, 0, 0]])
    return jax.value_and_grad(wmt_loss), (params, tokens, targets)


# -- 7. gradient-norm logging inside a train step (optax.tree.norm of a zero gradient) ----------
# https://github.com/google-deepmind/optax/issues/594 (scale by the gradient norm: g / |g|) and
# jax-ml/jax#4177: the norm of an all-zero gradient tree.


def normalized_gd_loss(w, x):
    g = jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)
    gnorm = optax.tree.norm(g)
    return jnp.sum(w * g) / gnorm  # L:ngd-div


def make_ngd_grad(bad=True):
    w = jnp.zeros(3) if bad else jnp.ones(3)
    return jax.grad(normalized_gd_loss), (w, jnp.eye(3))


# -- smooth library code: sanitize must stay quiet ------------------------------------------------


def linen_smooth_loss(params, x):
    logits = MnistMLP().apply({"params": params}, x, train=False)
    return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.array([1, 2, 3, 4])).mean()


def make_linen_smooth():
    _, x, _, params = _mnist_data()
    return jax.grad(linen_smooth_loss), (params, x)


class Attn(eqx.Module):
    mha: eqx.nn.MultiheadAttention
    ln: eqx.nn.LayerNorm

    def __init__(self, key):
        self.mha = eqx.nn.MultiheadAttention(2, 8, key=key)
        self.ln = eqx.nn.LayerNorm(8)

    def __call__(self, x, mask):
        return jax.vmap(self.ln)(self.mha(x, x, x, mask=mask))


def eqx_attn_loss(model, x, mask):
    return jnp.sum(jnp.tanh(model(x, mask)))


def make_eqx_attn():
    model = Attn(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, 8))
    mask = jnp.tril(jnp.ones((4, 4), bool))
    return eqx.filter_grad(eqx_attn_loss), (model, x, mask)
