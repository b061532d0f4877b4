"""A second set, written after the code and measured once without tuning (see measure.py)."""

import jax
import jax.numpy as jnp

CASES = {}


def case(name, source, *args):
    def deco(fun):
        CASES[name] = (fun, args, source)
        return fun

    return deco


@case("jit_where_log", "jax-ml/jax#347", jnp.array([0.0, 2.0]))
@jax.jit
def jit_where_log(x):
    lx = jnp.log(x)  # O:jit_where_log
    return jnp.sum(jnp.where(x > 0, x * lx, 0.0))  # Z:jit_where_log


@case("cosine_similarity_zero", "pytorch/pytorch#2421", jnp.zeros(3), jnp.ones(3))
def cosine_similarity_zero(a, b):
    na = jnp.sqrt(jnp.sum(a * a))  # O:cosine_similarity_zero
    return jnp.dot(a, b) / (na * jnp.linalg.norm(b) + 1e-8)


@case("kl_masked_targets", "snipsco/ntm-lasagne#5", jnp.array([0.5, 0.5, 0.0]))
def kl_masked_targets(q):
    p = jnp.array([0.6, 0.4, 0.0])
    logq = jnp.log(q)  # O:kl_masked_targets
    return jnp.sum(p * (jnp.log(jnp.where(p > 0, p, 1.0)) - logq))


@case("vmap_pairwise", "jax-ml/jax#654", jnp.array([[0.0, 0.0], [1.0, 1.0]]))
def vmap_pairwise(x):
    def dist(a, b):
        return jnp.sqrt(jnp.sum((a - b) ** 2))  # O:vmap_pairwise

    d = jax.vmap(lambda a: jax.vmap(lambda b: dist(a, b))(x))(x)
    return jnp.sum(d * (1.0 - jnp.eye(2)))  # Z:vmap_pairwise


@case("scan_masked_log", "jax-ml/jax#347", jnp.array([0.0, 1.0, 2.0]))
def scan_masked_log(xs):
    def body(c, x):
        lx = jnp.log(x)  # O:scan_masked_log
        return c + jnp.where(x > 0, lx, 0.0), None  # Z:scan_masked_log

    out, _ = jax.lax.scan(body, 0.0, xs)
    return out


@case("last_token_loss", "pytorch/pytorch#41508", jnp.array([[0.1, 0.9], [0.0, 1.0]]))
def last_token_loss(p):
    lp = jnp.log(p)  # O:last_token_loss
    return -jnp.sum(lp[-1:, 1])  # Z:last_token_loss


@case("softplus_inverse", "jax-ml/jax#1538", jnp.array([0.0, 1.0]))
def softplus_inverse(y):
    inv = jnp.log(jnp.expm1(y))  # O:softplus_inverse
    return jnp.sum(jnp.where(y > 0, inv, 0.0))  # Z:softplus_inverse


@case("weighted_by_gaussian", "snipsco/ntm-lasagne#5", jnp.array([30.0, 0.5]))
def weighted_by_gaussian(x):
    # (label fixed after the one measurement: the underflowed weight (x = 30) and the
    # infinite slope (x = 0.5) are different elements, so no zero meets the inf: no Z line)
    w = jnp.exp(-0.5 * x**2)
    return jnp.sum(w * jnp.sqrt(jnp.abs(x) - 0.5))  # O:weighted_by_gaussian


@case("clean_safe_norm", "jax-ml/jax#4177", jnp.zeros(3))
def clean_safe_norm(x):
    sq = jnp.sum(x**2)
    ok = sq > 0
    return jnp.where(ok, jnp.sqrt(jnp.where(ok, sq, 1.0)), 0.0)


@case("clean_layer_norm", "control", jnp.array([[1.0, 2.0, 3.0]]))
def clean_layer_norm(x):
    m = jnp.mean(x, -1, keepdims=True)
    v = jnp.var(x, -1, keepdims=True)
    return jnp.sum((x - m) / jnp.sqrt(v + 1e-5))
