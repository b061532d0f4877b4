"""Real-world JAX NaN-gradient programs, each rebuilt from a public report (the URL above it).

``PROGRAMS[name]()`` returns ``(gradient program, args)``; ``TRUTH[name]`` is the true gradient
(a list per argument), ``"ball"`` where the point is a cone of a norm (any gradient whose rows
have norm <= 1 is in the Clarke set), or None where no gradient exists (a NaN or infinite
value, a jump). tools/fix_measure.py runs every printed fix and ``Report.patch()`` on them."""

import jax
import jax.numpy as jnp
import jax.scipy.special


# https://github.com/jax-ml/jax/issues/4177 (squared norm at a zero vector)
def squared_norm(x):
    return jnp.linalg.norm(x) ** 2


# https://github.com/jax-ml/jax/issues/21723 (the same on a scalar)
def squared_norm_scalar(x):
    return jnp.linalg.norm(x) ** 2


# https://github.com/HIPS/autograd/issues/183 (exp(-|x|^2) at 0)
def gaussian_bump(x):
    return jnp.exp(-1.0 * jnp.linalg.norm(x) ** 2)


# https://github.com/jax-ml/jax/issues/347 (sqrt, then a where that does not protect it)
def where_after_sqrt(x):
    r = jnp.sqrt(jnp.sum(x**2, axis=1))
    r = jnp.where(r > 0.5, r, jnp.ones_like(r))
    return jnp.sum(r)


# https://github.com/jax-ml/jax/issues/1052 (arctan2 in the unselected branch)
def masked_arctan2(a):
    b = jnp.arctan2(a, a)
    c = jnp.where(jnp.array([0.0, 1.0, 0.0]) > 0.5, 0.0, b)
    return jnp.sum(c)


# https://github.com/jax-ml/jax/issues/2630 (where(x <= 0, 0, sqrt(x)))
def guarded_sqrt(x):
    return jnp.sum(jnp.where(x <= 0, 0.0, jnp.sqrt(x)))


# https://github.com/HIPS/autograd/issues/617 (norm(x, axis=-1) ** 2 with a zero row)
def rowwise_squared_norm(x):
    return jnp.sum(jnp.linalg.norm(x, axis=-1) ** 2)


# https://github.com/pytorch/pytorch/issues/4320 in JAX (std of a constant feature)
def std_of_constant(a):
    return jnp.mean(jnp.std(a, axis=0))


# masked log-likelihood (https://github.com/lenstronomy/JAXtronomy/issues/66: a NaN in the
# discarded branch of a where)
def masked_loglik(p):
    mask = jnp.array([False, True, True])
    return jnp.sum(jnp.where(mask, jnp.log(p), 0.0))


# masked division (https://github.com/Ciela-Institute/caustics/pull/83, the same trap)
def masked_inverse(r):
    inside = jnp.array([True, False])
    return jnp.sum(jnp.where(inside, 1.0 / r, 0.0))


# the angle between a vector and itself: arccos(1) (a frequent report around cosine losses)
def self_angle(u):
    c = jnp.dot(u, u) / jnp.dot(u, u)
    return jnp.arccos(c) * 0.0 + jnp.sum(u)


# pairwise distances with the diagonal (https://github.com/jax-ml/jax/issues/3058's cloth model)
def pairwise_energy(x):
    d = x[:, None, :] - x[None, :, :]
    dist = jnp.sqrt(jnp.sum(d**2, axis=-1))
    return jnp.sum(dist)


# a power written through exp and log at a zero base
def power_via_log(a):
    return jnp.sum(jnp.exp(2.0 * jnp.log(a)))


# entropy of a softmax that underflowed (xlogy(p, p) at p == 0)
def softmax_entropy(z):
    p = jax.nn.softmax(z)
    return -jnp.sum(jax.scipy.special.xlogy(p, p))


# log-sigmoid written as log(sigmoid): -inf value (no true gradient in the program as written)
def log_of_sigmoid(z):
    return jnp.sum(jnp.log(jax.nn.sigmoid(z)))


# a distance to a target that is reached exactly (norm at 0 inside a loss)
def distance_to_target(w):
    target = jnp.array([1.0, 2.0])
    return jnp.linalg.norm(w - target)


# rms of a gradient-clipping norm on a zero update (optax-style, written by hand)
def clipped_update_norm(g):
    n = jnp.sqrt(jnp.sum(g**2))
    return jnp.sum(g * jnp.minimum(1.0, 1.0 / jnp.maximum(n, 1e-6))) + n * 0.0


# https://github.com/jax-ml/jax/issues/17070 (a masked softmax's entropy in bits: log2 of the
# masked-out 0 in the unselected branch)
def masked_entropy_bits(logits):
    mask = jnp.array([True, True, False])
    attn = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf))
    return jnp.sum(jnp.where(mask, attn * -jnp.log2(attn), 0.0))


# https://github.com/pytorch/pytorch/issues/152088 in JAX (log1p of a -1 that a constant mask
# drops)
def masked_log1p(a):
    keep = jnp.array([False, True, True])
    return jnp.sum(jnp.where(keep, jnp.log1p(a), 0.0))


# https://github.com/google-deepmind/optax/pull/1743 and torch.nn.CosineSimilarity's eps: a
# cosine similarity with the norms' product floored at eps, at a zero vector
def cosine_with_eps(a):
    b = jnp.array([1.0, 2.0])
    den = jnp.maximum(jnp.linalg.norm(a) * jnp.linalg.norm(b), 1e-6)
    return jnp.dot(a, b) / den


# https://github.com/nishnik/poincare_embeddings/issues/4 (the Poincare distance arccosh(1 + ...)
# between a point and itself: arccosh at 1)
def poincare_self_distance(u):
    v = jnp.array([0.1, 0.2])
    sq = jnp.sum((u - v) ** 2)
    den = (1.0 - jnp.sum(u**2)) * (1.0 - jnp.sum(v**2))
    return jnp.arccosh(1.0 + 2.0 * sq / den)


def _pairwise_truth():
    x = jnp.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])

    def smooth(x):
        d = x[:, None, :] - x[None, :, :]
        off = ~jnp.eye(3, dtype=bool)
        sq = jnp.where(off, jnp.sum(d**2, axis=-1), 1.0)
        return jnp.sum(jnp.where(off, jnp.sqrt(sq), 0.0))

    return [jax.grad(smooth)(x).tolist()]


def _entropy_truth():
    z = jnp.array([0.0, -1000.0, 1.0])

    def smooth(z):
        return -jnp.sum(jax.nn.softmax(z) * jax.nn.log_softmax(z))

    return [jax.grad(smooth)(z).tolist()]


PROGRAMS = {
    "squared_norm": lambda: (jax.grad(squared_norm), (jnp.zeros(2),)),
    "squared_norm_scalar": lambda: (jax.grad(squared_norm_scalar), (jnp.float32(0.0),)),
    "gaussian_bump": lambda: (jax.grad(gaussian_bump), (jnp.zeros((2, 1)),)),
    "where_after_sqrt": lambda: (
        jax.grad(where_after_sqrt),
        (jnp.array([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]]),),
    ),
    "masked_arctan2": lambda: (jax.grad(masked_arctan2), (jnp.array([3.0, 0.0, -5.0]),)),
    "guarded_sqrt": lambda: (jax.grad(guarded_sqrt), (jnp.array([-1.0, 4.0]),)),
    "rowwise_squared_norm": lambda: (
        jax.grad(rowwise_squared_norm),
        (jnp.array([[0.0, 0.0], [1.0, 2.0]]),),
    ),
    "std_of_constant": lambda: (jax.grad(std_of_constant), (jnp.ones((4, 3)),)),
    "masked_loglik": lambda: (jax.grad(masked_loglik), (jnp.array([0.0, 0.5, 0.25]),)),
    "masked_inverse": lambda: (jax.grad(masked_inverse), (jnp.array([2.0, 0.0]),)),
    "self_angle": lambda: (jax.grad(self_angle), (jnp.array([0.6, 0.8]),)),
    "pairwise_energy": lambda: (
        jax.grad(pairwise_energy),
        (jnp.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]]),),
    ),
    "power_via_log": lambda: (jax.grad(power_via_log), (jnp.array([0.0, 1.5]),)),
    "softmax_entropy": lambda: (jax.grad(softmax_entropy), (jnp.array([0.0, -1000.0, 1.0]),)),
    "log_of_sigmoid": lambda: (jax.grad(log_of_sigmoid), (jnp.array([-200.0, 1.0]),)),
    "distance_to_target": lambda: (jax.grad(distance_to_target), (jnp.array([1.0, 2.0]),)),
    "clipped_update_norm": lambda: (jax.grad(clipped_update_norm), (jnp.zeros(3),)),
    "masked_entropy_bits": lambda: (jax.grad(masked_entropy_bits), (jnp.zeros(3),)),
    "masked_log1p": lambda: (jax.grad(masked_log1p), (jnp.array([-1.0, 0.5, 1.0]),)),
    "cosine_with_eps": lambda: (jax.grad(cosine_with_eps), (jnp.zeros(2),)),
    "poincare_self_distance": lambda: (
        jax.grad(poincare_self_distance),
        (jnp.array([0.1, 0.2]),),
    ),
}
TRUTH = {
    "squared_norm": [[0.0, 0.0]],
    "squared_norm_scalar": [0.0],
    "gaussian_bump": [[[0.0], [0.0]]],
    "where_after_sqrt": [[[0.4472136, 0.8944272], [0.6, 0.8], [0.0, 0.0]]],
    "masked_arctan2": [[0.0, 0.0, 0.0]],
    "guarded_sqrt": [[0.0, 0.25]],
    "rowwise_squared_norm": [[[0.0, 0.0], [2.0, 4.0]]],
    "std_of_constant": "ball",  # std is a cone at a constant column: 0 is in its Clarke set
    "masked_loglik": [[0.0, 2.0, 4.0]],
    "masked_inverse": [[-0.25, 0.0]],
    "self_angle": [[1.0, 1.0]],
    "pairwise_energy": "pairwise",
    "power_via_log": [[0.0, 3.0]],
    "softmax_entropy": "entropy",
    "log_of_sigmoid": None,
    "distance_to_target": "ball",
    "clipped_update_norm": [[1.0, 1.0, 1.0]],
    # two equal logits: the entropy (1 bit) is at its maximum, its gradient 0
    "masked_entropy_bits": [[0.0, 0.0, 0.0]],
    "masked_log1p": [[0.0, 2.0 / 3.0, 0.5]],
    # |a| |b| < eps near 0: the loss is a . b / eps there
    "cosine_with_eps": [[1e6, 2e6]],
    # the distance is a cone at u == v (c |u - v| to first order): 0 is in its Clarke set
    "poincare_self_distance": "ball",
}
COMPUTED = {"pairwise": _pairwise_truth, "entropy": _entropy_truth}
