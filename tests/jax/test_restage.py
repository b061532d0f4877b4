"""interpreter/_restage.py: cond, scan, while, jit and checkpoint re-emitted with a sidecar that
has a static signature and traced leaves, and accumulators threaded out of their bodies.

The toy transformation marks the elements that went through ``abs`` (a static True/False, or a
boolean mask once a ``select_n`` mixes marked and unmarked elements) and counts the negative
outputs of every ``sin``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import primitives as P

from gradsan.jax import _compat
from gradsan.jax.interpreter import Scope
from gradsan.jax.interpreter._restage import RESTAGE, Restaging, call_jit, call_remat


def _arr(side, shape):
    if side is True or side is False:
        return jnp.full(shape, side)
    return jnp.broadcast_to(side, shape)


class Marks(Restaging):
    rules = dict(RESTAGE)

    def __init__(self):
        super().__init__()
        self.jits: dict = {}

    def literal_side(self, value):
        return False

    def const_side(self, value, label):
        return False

    def side_sig(self, side):
        return side if side is True or side is False else 2

    def side_leaves(self, side, value, sig):
        return [_arr(side, np.shape(value))] if sig == 2 else []

    def side_build(self, sig, leaves):
        return next(leaves) if sig == 2 else sig

    def side_join(self, a, b):
        return a if a == b else 2

    def call(self, eqn, jaxpr, consts, invals, insides, scope, key):
        sub = self.sub_scope(eqn, scope, key, eqn.primitive.name)
        if eqn.primitive is P.jit_p:
            return call_jit(self, eqn, jaxpr, consts, invals, insides, sub, self.jits, key)
        if eqn.primitive is P.remat_p:
            return call_remat(self, eqn, jaxpr, consts, invals, insides, sub)
        return super().call(eqn, jaxpr, consts, invals, insides, scope, key)

    def first_order(self, eqn, invals, insides, scope, key):
        outs = _compat.bind(eqn, invals)
        name = eqn.primitive.name
        shape = np.shape(outs[0])
        if name == "abs":
            side = True
        elif name == "select_n":
            cases = insides[1:]
            if all(s is cases[0] for s in cases) and cases[0] in (True, False):
                side = cases[0]
            else:
                side = lax.select_n(invals[0], *[_arr(s, shape) for s in cases])
        elif any(np.shape(v) not in ((), shape) for v in invals):  # not elementwise
            side = False
        elif any(s is True for s in insides):  # elementwise: marked if an operand is
            side = True
        elif all(s is False for s in insides):
            side = False
        else:
            side = jnp.any(jnp.stack([_arr(s, shape) for s in insides]), 0)
        if name == "sin":
            self.accumulate(("neg", key), jnp.sum(outs[0] < 0, dtype=jnp.int32))
        return outs, [side] * len(outs)


def restaged(f, *args):
    """``run(*args) -> (outputs, marks, count)``: ``f``'s program re-emitted by ``Marks``."""
    closed = jax.make_jaxpr(f)(*args)
    m = Marks()

    def run(*a):
        m.acc = {}
        outs, sides = m.run_closed(closed, list(a), [False] * len(a), Scope())
        sides = [_arr(s, np.shape(o)) for s, o in zip(sides, outs)]
        return outs, sides, sum(m.acc.values(), jnp.int32(0))

    return run


def marks(f, *args):
    """Eagerly and under jit."""
    run = restaged(f, *args)
    return run(*args), jax.jit(run)(*args)


X = jnp.asarray([-2.0, 0.5, 3.0])


def _same(got, want_outs, want_marks, want_count):
    outs, sides, count = got
    for o, w in zip(outs, want_outs):
        np.testing.assert_array_equal(np.asarray(o), np.asarray(w))
    for s, w in zip(sides, want_marks):
        np.testing.assert_array_equal(np.asarray(s), np.asarray(w))
    assert int(count) == want_count


def test_cond_joins_the_branches_and_counts_the_taken_one():
    def f(x, p):
        return lax.cond(p, lambda y: jnp.sin(jnp.abs(y)), lambda y: jnp.sin(y), x)

    for p, marked, count in ((True, [True] * 3, 0), (False, [False] * 3, 1)):
        eager, jitted = marks(f, X, p)
        want = f(X, p)
        _same(eager, [want], [marked], count)
        _same(jitted, [want], [marked], count)


def test_scan_carry_reaches_its_fixpoint():
    def f(x):
        def body(c, xi):
            c = jnp.where(xi > 0, jnp.abs(c), c)  # unmarked, then a mask: needs the fixpoint
            return jnp.sin(c + xi), jnp.sin(xi)

        return lax.scan(body, jnp.asarray([-1.0, -1.0, -1.0]), x)

    xs = jnp.stack([X, -X, X])
    c, ys = f(xs)
    eager, jitted = marks(f, xs)
    for got in (eager, jitted):
        np.testing.assert_array_equal(np.asarray(got[0][0]), np.asarray(c))
        np.testing.assert_array_equal(np.asarray(got[0][1]), np.asarray(ys))
        # marked where some row was positive (abs applied), the ys never
        np.testing.assert_array_equal(np.asarray(got[1][0]), np.asarray((xs > 0).any(0)))
        assert not np.asarray(got[1][1]).any()
    assert int(eager[2]) == int(jitted[2])


def test_scan_count_matches_an_unrolled_reference():
    xs = jnp.asarray([0.5, -2.0, 4.0, -0.1])

    def f(x):
        return lax.scan(lambda c, xi: (jnp.sin(c * xi), jnp.sin(xi)), 1.0, x)

    want = 0
    c = jnp.asarray(1.0)
    for xi in xs:
        c = jnp.sin(c * xi)
        want += int(c < 0) + int(jnp.sin(xi) < 0)
    eager, jitted = marks(f, xs)
    assert int(eager[2]) == int(jitted[2]) == want


@pytest.mark.parametrize("n", [0, 1, 4])
def test_while_counts_the_body_and_every_test(n):
    def f(x):
        def cond(s):
            i, v = s
            return jnp.sin(v[0]) + i < n  # a sin in the test: run once more per iteration

        def body(s):
            i, v = s
            return i + 1, jnp.abs(jnp.sin(v))

        return lax.while_loop(cond, body, (0.0, x))

    i, v = f(X)
    want, vv, k = 0, X, 0
    while True:
        want += int(jnp.sum(jnp.sin(vv[0]) < 0))
        if not jnp.sin(vv[0]) + k < n:
            break
        want += int(jnp.sum(jnp.sin(vv) < 0))
        vv, k = jnp.abs(jnp.sin(vv)), k + 1
    eager, jitted = marks(f, X)
    for got in (eager, jitted):
        np.testing.assert_array_equal(np.asarray(got[0][1]), np.asarray(v))
        assert int(got[2]) == want
        assert np.asarray(got[1][1]).all() == (int(i) > 0)


def test_jit_and_checkpoint_stay_and_count_their_bodies():
    g = jax.jit(lambda y: jnp.sin(jnp.abs(y) - 1.0))

    def f(x):
        return g(x) + g(-x), jax.checkpoint(lambda y: jnp.sin(y))(x)

    want = int(jnp.sum(jnp.sin(jnp.abs(X) - 1.0) < 0)) * 2 + int(jnp.sum(jnp.sin(X) < 0))
    eager, jitted = marks(f, X)
    for got in (eager, jitted):
        a, b = f(X)
        np.testing.assert_array_equal(np.asarray(got[0][0]), np.asarray(a))
        np.testing.assert_array_equal(np.asarray(got[0][1]), np.asarray(b))
        assert np.asarray(got[1][0]).all() and not np.asarray(got[1][1]).any()
        assert int(got[2]) == want
    emitted = str(jax.make_jaxpr(restaged(f, X))(X))
    assert "remat" in emitted and emitted.count("pjit") + emitted.count("jit[") >= 1
