"""Real-world JAX NaN-gradient programs, re-expressed small from public reports.

Each case: a function, its arguments, the report it comes from, and two line markers: ``# O:<name>``
the true origin (where the inf or NaN is born) and ``# Z:<name>`` the operation that makes the
zero factor exact (absent: the zero is made on the origin's line, or there is none). Cases named
``clean_*`` are controls whose gradient is finite: no report is expected.
"""

import jax
import jax.numpy as jnp

CASES = {}


def case(name, source, *args):
    def deco(fun):
        CASES[name] = (fun, args, source)
        return fun

    return deco


@case("where_after_sqrt", "jax-ml/jax#347", jnp.array([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]]))
def where_after_sqrt(x):
    x = jnp.sqrt(jnp.sum(x**2, axis=1))  # O:where_after_sqrt
    ones = jnp.ones_like(x)
    x = jnp.where(x > 0.5, x, ones)  # Z:where_after_sqrt
    return jnp.sum(x)


@case("where_arctan2", "jax-ml/jax#1052", jnp.array([3.0, 0.0, -5.0]))
def where_arctan2(a):
    b = jnp.arctan2(a, a)  # O:where_arctan2
    temp = jnp.array([0.0, 1.0, 0.0])
    c = jnp.where(temp > 0.5, 0.0, b)  # Z:where_arctan2
    return jnp.sum(c)


@case("elu_overflow", "jax-ml/jax#1538", jnp.array([100.0, -1.0]))
def elu_overflow(x):
    neg = 1.0 * jnp.expm1(x)  # O:elu_overflow
    return jnp.sum(jnp.where(x > 0, x, neg))  # Z:elu_overflow


@case("where_branch_sqrt_product", "tinygrad/tinygrad#12409", jnp.array([0.0, 4.0]))
def where_branch_sqrt_product(x):
    r = x * jnp.sqrt(x)  # O:where_branch_sqrt_product
    return jnp.sum(jnp.where(x == 0, 0.0, r))  # Z:where_branch_sqrt_product


@case("where_sqrt_negative", "HIPS/autograd#802", jnp.array([1.0, -4.0]))
def where_sqrt_negative(x):
    s = jnp.sqrt(-x)  # O:where_sqrt_negative
    return jnp.sum(jnp.where(x >= 0, x, s))  # Z:where_sqrt_negative


@case("squared_norm_zero", "jax-ml/jax#4177", jnp.zeros(2))
def squared_norm_zero(x):
    return jnp.linalg.norm(x) ** 2  # O:squared_norm_zero


@case("gaussian_distance", "open-mmlab/mmrotate#205", jnp.array([1.0, 2.0]), jnp.array([1.0, 2.0]))
def gaussian_distance(mu1, mu2):
    d2 = jnp.sum((mu1 - mu2) ** 2)  # Z:gaussian_distance
    return jnp.sqrt(d2)  # O:gaussian_distance


@case(
    "one_hot_cross_entropy", "snipsco/ntm-lasagne#5", jnp.array([[0.0, 0.3, 0.7], [0.5, 0.5, 0.0]])
)
def one_hot_cross_entropy(p):
    labels = jax.nn.one_hot(jnp.array([2, 0]), 3)  # Z:one_hot_cross_entropy
    logp = jnp.log(p)  # O:one_hot_cross_entropy
    return -jnp.sum(labels * logp)


PAD = jnp.array([1.0, 1.0, 0.0])


@case("padding_mask_loss", "seung-lab/znn-release#54", jnp.array([0.5, 0.25, 0.0]))
def padding_mask_loss(probs):
    per_tok = -jnp.log(probs)  # O:padding_mask_loss
    return jnp.sum(per_tok * PAD) / jnp.sum(PAD)  # Z:padding_mask_loss


@case("causal_shift", "pytorch/pytorch#41508", jnp.array([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]]))
def causal_shift(p):
    logits = jnp.log(p)  # O:causal_shift
    return -jnp.sum(logits[:, :-1])  # Z:causal_shift


@case("masked_row_sliced", "pytorch/pytorch#196170", jnp.ones((2, 2)), jnp.ones((2, 2)))
def masked_row_sliced(q, v):
    mask = jnp.array([[True, True], [False, False]])
    scores = jnp.where(mask, q @ q.T, -jnp.inf)
    attn = jax.nn.softmax(scores, axis=-1)  # O:masked_row_sliced
    out = attn @ v
    return jnp.sum(out[:1])  # Z:masked_row_sliced


@case("entropy_masked", "lucidrains/memory-compressed-attention#2", jnp.array([1.0, 2.0, 3.0]))
def entropy_masked(s):
    scores = jnp.where(jnp.array([True, True, False]), s, -jnp.inf)
    lse = jax.nn.logsumexp(scores)
    # exp(-inf) = 0 by design meets the -inf weight in exp's own derivative
    p = jnp.exp(scores - lse)  # O:entropy_masked
    return -jnp.sum(p * (scores - lse))


@case("underflowed_weight", "snipsco/ntm-lasagne#5", jnp.array([20.0, 0.0]), jnp.array([0.0, 1.0]))
def underflowed_weight(x, y):
    w = jnp.exp(-(x**2))  # Z:underflowed_weight
    ly = jnp.log(y)  # O:underflowed_weight
    return jnp.sum(w * ly)


@case("nan_to_num_log", "jax-ml/jax#347", jnp.array([0.0, 2.0]))
def nan_to_num_log(x):
    y = jnp.log(x)  # O:nan_to_num_log
    return jnp.sum(jnp.nan_to_num(y))  # Z:nan_to_num_log


@case("rmse_perfect_fit", "pytorch/pytorch#2421", jnp.array([1.0, 2.0]), jnp.array([1.0, 2.0]))
def rmse_perfect_fit(pred, target):
    err = (pred - target) ** 2  # Z:rmse_perfect_fit
    return jnp.sqrt(jnp.mean(err))  # O:rmse_perfect_fit


@case("embedding_gather", "jax-ml/jax#347", jnp.array([[0.5, 0.5], [0.0, 1.0]]))
def embedding_gather(table):
    emb = jnp.log(table)  # O:embedding_gather
    ids = jnp.array([0, 0])
    return jnp.sum(emb[ids])  # Z:embedding_gather


@case("guarded_inverse", "jax-ml/jax#654", jnp.array([0.0, 2.0]))
def guarded_inverse(d):
    inv = 1.0 / d  # O:guarded_inverse
    return jnp.sum(jnp.where(d > 0, inv, 0.0))  # Z:guarded_inverse


PAIR_MASK = 1.0 - jnp.eye(2)


@case("pairwise_mask", "jax-ml/jax#654", jnp.array([[0.0, 1.0], [1.0, 0.0]]))
def pairwise_mask(x):
    diff = x[:, None, :] - x[None, :, :]
    d = jnp.sqrt(jnp.sum(diff**2, axis=-1))  # O:pairwise_mask
    return jnp.sum(d * PAIR_MASK)  # Z:pairwise_mask


@case("polar_angle", "jax-ml/jax#1052", jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0]))
def polar_angle(x, y):
    theta = jnp.arctan2(y, x)  # O:polar_angle
    r = x * x + y * y
    return jnp.sum(jnp.where(r > 0, theta, 0.0))  # Z:polar_angle


@case("log1p_padding", "HIPS/autograd#802", jnp.array([1.0, 0.5]))
def log1p_padding(p):
    lq = jnp.log1p(-p)  # O:log1p_padding
    valid = jnp.array([False, True])
    return jnp.sum(jnp.where(valid, lq, 0.0))  # Z:log1p_padding


@case("pow_zero_base", "jax-ml/jax#21723", jnp.array([0.0, 1.0]))
def pow_zero_base(x):
    y = x**0.5  # O:pow_zero_base
    return jnp.sum(jnp.where(x > 0, y, 0.0))  # Z:pow_zero_base


# ---- added in session 13 (marks set from the programs before the first measurement) -----------

LOGIT_MASK = jnp.array([0.0, -jnp.inf, 0.0])


@case("entropy_masked_logits", "huggingface/trl#7221", jnp.array([1.0, 2.0, 3.0]))
def entropy_masked_logits(z):
    # (marks fixed after the one measurement, which had O on the product's line: jax.grad
    # returns no value, so the forward 0 * -inf is no output; the gradient's NaN is born in
    # exp's derivative, d(-p log p)/dp = inf times exp(-inf) = 0, on the exp's own line)
    logp = jax.nn.log_softmax(z + LOGIT_MASK)
    p = jnp.exp(logp)  # O:entropy_masked_logits
    return -jnp.sum(p * logp)


@case("entropy_nan_to_num", "huggingface/trl#7252", jnp.array([1.0, 2.0, 3.0]))
def entropy_nan_to_num(z):
    logp = jax.nn.log_softmax(z + LOGIT_MASK)
    terms = jnp.exp(logp) * logp  # O:entropy_nan_to_num
    return -jnp.sum(jnp.nan_to_num(terms, nan=0.0))  # Z:entropy_nan_to_num


DIVISOR = jnp.array([0.0, 1.0])


@case("divide_then_slice", "pytorch/pytorch#4132", jnp.array([1.0, 1.0]))
def divide_then_slice(x):
    y = x / DIVISOR  # O:divide_then_slice
    return jnp.sum(y[1:])  # Z:divide_then_slice


@case("acos_of_cosine", "pytorch/pytorch#61810", jnp.array([1.0, 0.0]), jnp.array([1.0, 0.0]))
def acos_of_cosine(a, b):
    c = jnp.sum(a * b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b))  # Z:acos_of_cosine
    return jnp.arccos(c)  # O:acos_of_cosine


@case("softmax_underflow_entropy", "deeplearning4j/deeplearning4j#785", jnp.array([0.0, -200.0]))
def softmax_underflow_entropy(z):
    p = jax.nn.softmax(z)  # Z:softmax_underflow_entropy
    return -jnp.sum(p * jnp.log(p))  # O:softmax_underflow_entropy


# ---- clean controls: finite gradients, no report expected -------------------------------------


@case("clean_double_where", "jax-ml/jax#347", jnp.array([[1.0, 2.0], [0.0, 0.0]]))
def clean_double_where(x):
    s = jnp.sum(x**2, axis=1)
    ok = s > 0.5
    return jnp.sum(jnp.where(ok, jnp.sqrt(jnp.where(ok, s, 1.0)), 1.0))


@case("clean_log_softmax_ce", "snipsco/ntm-lasagne#5", jnp.array([[1.0, -50.0, 3.0]]))
def clean_log_softmax_ce(z):
    labels = jax.nn.one_hot(jnp.array([2]), 3)
    return -jnp.sum(labels * jax.nn.log_softmax(z))


@case("clean_masked_attention", "pytorch/pytorch#41508", jnp.ones((2, 2)), jnp.ones((2, 2)))
def clean_masked_attention(q, v):
    mask = jnp.array([[True, False], [True, True]])
    scores = jnp.where(mask, q @ q.T, -1e9)
    return jnp.sum(jax.nn.softmax(scores, axis=-1) @ v)


@case("clean_squared_norm", "jax-ml/jax#4177", jnp.zeros(2))
def clean_squared_norm(x):
    return jnp.sum(x**2)


@case("clean_pad_mask", "seung-lab/znn-release#54", jnp.array([0.5, 0.25, 0.1]))
def clean_pad_mask(probs):
    return jnp.sum(-jnp.log(probs) * PAD)


@case("clean_relu_mlp", "control", jnp.array([[1.0, -1.0], [0.5, 2.0]]), jnp.array([0.3, -0.2]))
def clean_relu_mlp(w, x):
    return jnp.sum(jax.nn.relu(w @ x) ** 2)


@case("clean_log_softmax_entropy", "huggingface/trl#7221", jnp.array([0.0, -200.0]))
def clean_log_softmax_entropy(z):
    logp = jax.nn.log_softmax(z)  # exp(-200) underflows to 0, but 0 * -200 is 0
    return -jnp.sum(jnp.exp(logp) * logp)
