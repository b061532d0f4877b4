"""Issue 15: the dependence check for argmax/argmin, sort/argsort and top_k indices, float ->
int casts, eigh/svd at repeated values and atan2 at the origin. A flag only when the gradient
depends on the choice; counted in the note otherwise."""

import jax
import jax.numpy as jnp
import pytest

import gradsan.jax as gsj
from tests.conftest import line_of


def kinks(report):
    return [
        (f.catalog_id, f.where.line if f.where else None)
        for f in report.findings
        if f.kind in ("kink", "convention")
    ]


def left_out(report):
    return any("checked and left out" in n for n in report.notes)


def dep_argmax(x):
    return x[jnp.argmax(x)] * jnp.arange(1.0, 4.0)[jnp.argmax(x)]  # d-argmax


def dep_argmin(x):
    return jnp.sum(x * jax.nn.one_hot(jnp.argmin(x), 3) * jnp.arange(3.0))  # d-argmin


def dep_argsort(x):
    return jnp.sum(x[jnp.argsort(x)] * jnp.arange(3.0))  # d-argsort


def dep_topk(x):
    return jnp.sum(x[jax.lax.top_k(x, 1)[1]] * jnp.arange(1.0, 2.0))  # d-topk


def dep_cast(x):
    return jnp.sum(jnp.array([1.0, 2.0, 3.0, 4.0])[x.astype(jnp.int32)] * x)  # d-cast


def dep_eigh(a):
    return jnp.linalg.eigvalsh(a)[-1]  # d-eigh


def dep_eigvec(a):
    return jnp.sum(jnp.linalg.eigh(a)[1][:, 0] ** 3)  # d-eigvec


def dep_svd(a):
    return jnp.linalg.svd(a, compute_uv=False)[0]  # d-svd


def dep_atan2(p):
    return jnp.arctan2(p[0], p[1])  # d-atan2


DEPENDS = [
    (dep_argmax, jnp.array([1.0, 1.0, 0.0]), "max-tie", "d-argmax"),
    (dep_argmin, jnp.array([0.0, 0.0, 1.0]), "max-tie", "d-argmin"),
    (dep_argsort, jnp.array([1.0, 1.0, 2.0]), "sort-tie", "d-argsort"),
    (dep_topk, jnp.array([2.0, 2.0, 1.0]), "sort-tie", "d-topk"),
    (dep_cast, jnp.array([1.0, 2.0]), "floor-round-at-jump", "d-cast"),
    (dep_eigh, jnp.eye(3), "eigh-repeated-eigenvalues", "d-eigh"),
    (dep_eigvec, jnp.eye(2), "eigh-repeated-eigenvalues", "d-eigvec"),
    (dep_svd, 2 * jnp.eye(2), "eigh-repeated-eigenvalues", "d-svd"),
    (dep_atan2, jnp.zeros(2), "atan2-at-origin", "d-atan2"),
]


FAST = {
    "d-argmax",
    "d-cast",
    "d-atan2",
    "argsort-sum",
    "cast-straight-through",
    "argmax-onehot-sum",
    "argmax-straight-through",
}


def _params(items, ids):
    return [
        pytest.param(*it, id=i, marks=() if i in FAST else pytest.mark.slow)
        for it, i in zip(items, ids)
    ]


@pytest.mark.parametrize("fun,x,entry,marker", _params(DEPENDS, [d[3] for d in DEPENDS]))
def test_choice_the_gradient_depends_on_is_flagged(fun, x, entry, marker):
    r = gsj.sanitize(jax.grad(fun))(x)
    assert (entry, line_of(marker)) in kinks(r), (kinks(r), r.notes)


CLEAN = {
    # the tied entries are the same function: argmax picks the same value either way
    "argmax-same": (lambda x: jnp.take(2 * x, jnp.argmax(jnp.stack([x[0], x[0]]))), jnp.ones(2)),
    # symmetric downstream: a sum over the one-hot of the choice, or over the sorted values
    "argmax-onehot-sum": (
        lambda x: jnp.sum(jax.nn.one_hot(jnp.argmax(x), 3)) * jnp.sum(x),
        jnp.array([1.0, 1.0, 0.0]),
    ),
    "argsort-sum": (lambda x: jnp.sum(x[jnp.argsort(x)]), jnp.array([1.0, 1.0, 2.0])),
    "topk-both": (lambda x: jnp.sum(x[jax.lax.top_k(x, 2)[1]]), jnp.array([2.0, 2.0, 1.0])),
    # a straight-through argmax: its one-hot changes the value, but no gradient flows
    # through an integer (the gradient is the softmax's either way)
    "argmax-straight-through": (
        lambda x: jnp.sum(
            (
                jax.nn.one_hot(jnp.argmax(x), 3)
                + jax.nn.softmax(x)
                - jax.lax.stop_gradient(jax.nn.softmax(x))
            )
            * jnp.arange(1.0, 4.0)
        ),
        jnp.array([1.0, 1.0, 0.0]),
    ),
    # a straight-through cast: the integer reaches the loss only through stop_gradient
    "cast-straight-through": (
        lambda x: jnp.sum((x + jax.lax.stop_gradient(x.astype(jnp.int32) - x)) ** 2),
        jnp.array([1.0, 2.0]),
    ),
    # the trace of a repeated spectrum, and s * I moving all eigenvalues alike
    "eigvalsh-sum": (lambda a: jnp.sum(jnp.linalg.eigvalsh(a)), jnp.eye(3)),
    "eigvalsh-scaled-identity": (lambda s: jnp.linalg.eigvalsh(s * jnp.eye(3))[-1], 1.0),
    "svd-nuclear-norm": (lambda a: jnp.sum(jnp.linalg.svd(a, compute_uv=False)), 2 * jnp.eye(2)),
    # the angle at the origin times a factor that is 0 there, with no gradient through it
    "atan2-times-stopped-zero": (
        lambda p: jnp.arctan2(p[0], p[1]) * jax.lax.stop_gradient(p[0]) + p[1],
        jnp.zeros(2),
    ),
}


@pytest.mark.parametrize("name", _params([(n,) for n in sorted(CLEAN)], sorted(CLEAN)))
def test_choice_without_effect_is_counted(name):
    fun, x = CLEAN[name]
    r = gsj.sanitize(jax.grad(fun))(x)
    assert kinks(r) == [], (kinks(r), r.notes)
    assert left_out(r), r.notes
