"""JAX programs with loops and transformations (lax.scan, fori_loop, vmap, remat, custom_vjp),
each re-expressed from a public NaN-gradient report (the URL above it) and made to NaN the way
the report says. ``make_*`` returns ``(fun, args)``: the failing call."""

import jax
import jax.numpy as jnp
import jax.scipy.special

# -- 1. HMM / CTC forward algorithm in log space (lax.scan) ---------------------------------------
# https://github.com/jax-ml/jax/issues/6811: logsumexp([-inf, -inf]) has a NaN gradient; the
# forward algorithm of CTC-like losses starts from log(0) = -inf states.


def hmm_forward(log_trans, log_emit):
    init = jnp.array([0.0, -jnp.inf, -jnp.inf])  # start in state 0 with probability 1

    def step(alpha, e):
        alpha = jax.nn.logsumexp(alpha[:, None] + log_trans, axis=0) + e  # L:hmm-lse
        return alpha, alpha

    alpha, _ = jax.lax.scan(step, init, log_emit)
    return jax.nn.logsumexp(alpha)


def make_hmm():
    # a left-to-right chain: state 2 cannot be reached from state 0 in one step
    log_trans = jnp.log(jnp.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]]))
    log_trans = jnp.where(jnp.isfinite(log_trans), log_trans, -jnp.inf)
    return jax.grad(hmm_forward, argnums=1), (log_trans, jnp.zeros((3, 3)))


# -- 2. logsumexp with `where` over a masked large value ------------------------------------------
# https://github.com/jax-ml/jax/issues/23842 (jax.grad(logsumexp)(a, where=mask) is [1, nan]).


def masked_lse(a):
    mask = jnp.array([True, False])
    return jax.scipy.special.logsumexp(a, where=mask)  # L:lse-where


def make_masked_lse():
    return jax.grad(masked_lse), (jnp.array([0.0, 100.0]),)


# -- 3. an RNN over a padded sequence (scan) whose padded steps divide by a length of 0 ---------
# https://github.com/jax-ml/jax/issues/1052 (where over a NaN branch in the unselected elements)
# in the shape of flax's examples/sst2 (a masked LSTM over padded batches).


def rnn_loss(w, xs, lengths):
    def cell(h, x):
        h = jnp.tanh(w * h + x)
        return h, h

    ts = jnp.arange(xs.shape[0])
    _, hs = jax.lax.scan(cell, jnp.zeros(lengths.shape), xs)
    mean_h = jnp.sum(hs * (ts[:, None] < lengths), axis=0) / lengths  # L:rnn-div
    return jnp.sum(jnp.where(lengths > 0, mean_h, 0.0))


def make_rnn():
    xs = jnp.ones((4, 3)) * 0.5
    return jax.grad(rnn_loss), (jnp.float32(0.3), xs, jnp.array([4.0, 2.0, 0.0]))


# -- 4. fori_loop fixed-point iteration with a sqrt that reaches 0 ---------------------------------
# https://github.com/patrick-kidger/diffrax/issues/280 (NaN gradients through a solver: "a sqrt or
# log of a negative number" in the vector field) - an explicit Euler integration of dy/dt =
# -k sqrt(y), a tank draining (Torricelli): y reaches 0 in finite time.


def drain(k, y0):
    dt = 0.1

    def body(i, y):
        return jnp.maximum(y - dt * k * jnp.sqrt(y), 0.0)  # L:drain-sqrt

    y = jax.lax.fori_loop(0, 20, body, y0)
    return y + k * 0.0


def make_drain():
    return jax.grad(drain), (jnp.float32(2.0), jnp.float32(1.0))


# -- 5. per-example gradients (vmap of grad) of a distance loss at a duplicate point ------------
# https://github.com/jax-ml/jax/issues/3058 (norm at 0 in a cloth model's pairwise distances),
# with the per-example vmap(grad) of https://github.com/google-deepmind/optax examples
# (differentially_private_sgd).


def spring_energy(x, anchor):
    return 0.5 * (jnp.linalg.norm(x - anchor) - 1.0) ** 2  # L:spring-norm


def make_per_example():
    xs = jnp.array([[1.0, 2.0], [0.0, 0.0], [3.0, 1.0]])
    anchors = jnp.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    return jax.vmap(jax.grad(spring_energy)), (xs, anchors)


# -- 6. rematerialised (jax.checkpoint) attention block with a fully masked query row ------------
# https://github.com/pytorch/pytorch/issues/41508 in JAX (softmax over a row that is all -inf is
# NaN); remat as in flax's examples/lm1b (nn.remat / jax.checkpoint of a decoder layer).


@jax.checkpoint
def attention(q, k, mask):
    logits = q @ k.T
    logits = jnp.where(mask, logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)  # L:attn-softmax


def attn_loss(q, k, mask):
    return jnp.sum(attention(q, k, mask) @ k)


def make_remat_attn():
    q = jnp.arange(6.0).reshape(3, 2) / 6.0
    mask = jnp.array([[True, False, False], [True, True, False], [False, False, False]])
    return jax.grad(attn_loss), (q, q + 0.5, mask)


# -- 7. a hand-written custom_vjp logsumexp (the thread's own workaround) at all -inf -----------
# https://github.com/jax-ml/jax/issues/6811 (kho's custom VJP logsumexp, comment 2021-12-05):
# the backward pass is g * exp(a - lse), and at a = [-inf, -inf], lse = -inf: exp(nan).


@jax.custom_vjp
def lse(a):
    return jax.nn.logsumexp(a)


def _lse_fwd(a):
    out = jax.nn.logsumexp(a)
    return out, (a, out)


def _lse_bwd(res, g):
    a, out = res
    return (g * jnp.exp(a - out),)  # L:lse-bwd


lse.defvjp(_lse_fwd, _lse_bwd)


def ctc_like(x):
    return lse(jnp.stack([-jnp.inf, -jnp.inf + x]))


def make_custom_vjp():
    return jax.grad(ctc_like), (jnp.float32(1.0),)


# -- 8. softplus written through log1p(exp) inside a vmapped Gaussian NLL -------------------------
# https://github.com/tracel-ai/burn/issues/5373 and https://github.com/jax-ml/jax/pull/1315
# (softplus's gradient stability): sigma = log1p(exp(s)) overflows for a large raw scale.


def gaussian_nll(s, mu, y):
    sigma = jnp.log1p(jnp.exp(s))  # L:nll-softplus
    return jnp.log(sigma) + 0.5 * ((y - mu) / sigma) ** 2


def make_nll():
    s = jnp.array([0.5, 120.0, -1.0])
    return jax.grad(lambda s: jnp.mean(jax.vmap(gaussian_nll)(s, jnp.zeros(3), jnp.ones(3)))), (s,)


# -- 9. arccos of a clipped cosine (an angular loss) at parallel vectors -------------------------
# https://github.com/pytorch/pytorch/issues/8069 and https://github.com/yuanming-hu/fc4/issues/33
# in JAX (acos's gradient at +-1 is infinite; clipping the cosine to [-1, 1] does not remove it).


def angular_loss(u, v):
    cos = jnp.dot(u, v) / (jnp.linalg.norm(u) * jnp.linalg.norm(v))
    cos = jnp.clip(cos, -1.0, 1.0)
    return jnp.arccos(cos)  # L:arccos


def make_arccos():
    u = jnp.array([1.0, 0.0])
    return jax.grad(angular_loss), (u, jnp.array([2.0, 0.0]))


# -- 10. a beta log-density at the boundary, (a - 1) * log(x) with x == 0 -------------------------
# https://github.com/pyro-ppl/numpyro/issues/2088 (Beta(1, 8).log_prob(0.) is nan; fixed with
# xlogy in numpyro#2089): (a - 1) log x + (b - 1) log1p(-x) at x == 0 with a == 1.


def beta_logpdf(ab, x):
    a, b = ab[0], ab[1]
    lognorm = (
        jax.scipy.special.gammaln(a + b)
        - jax.scipy.special.gammaln(a)
        - (jax.scipy.special.gammaln(b))
    )
    return jnp.sum((a - 1.0) * jnp.log(x) + (b - 1.0) * jnp.log1p(-x) + lognorm)  # L:beta


def make_beta():
    return jax.grad(beta_logpdf), (jnp.array([1.0, 2.0]), jnp.array([0.0, 0.5]))


# -- smooth programs: sanitize must stay quiet -----------------------------------------------------


def smooth_scan(w, xs):
    def step(h, x):
        h = jnp.tanh(w * h + x)
        return h, jax.nn.softplus(h)

    _, ys = jax.lax.scan(step, jnp.zeros(2), xs)
    return jnp.sum(ys)


def make_smooth_scan():
    return jax.grad(smooth_scan), (jnp.float32(0.5), jnp.ones((5, 2)))


def smooth_lse(a):
    return jax.nn.logsumexp(a) + jnp.sum(jax.nn.log_softmax(a))


def make_smooth_lse():
    return jax.grad(smooth_lse), (jnp.array([0.1, -2.0, 3.0]),)
