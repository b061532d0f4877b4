"""gradsan.jax.guard: bit-identical outputs when finite, NonFiniteError with the report when not."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan
import gradsan.jax as gsj
from tests.conftest import line_of


def loss(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sqrt(jnp.sum(h * h))  # L:guard


def make_step(donate: bool):
    def step(w, x):
        g = jax.grad(loss)(w, x)
        return w - 0.1 * g, g

    return jax.jit(step, donate_argnums=(0,) if donate else ())


@pytest.mark.parametrize("donate", [False, True], ids=["plain", "donated"])
def test_guard_is_bit_identical_on_finite_steps(donate):
    key = jax.random.PRNGKey(0)
    w = jax.random.normal(key, (8, 4))
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 8))
    plain = make_step(donate)
    guarded = gsj.guard(make_step(donate))
    w1, w2 = jnp.array(w), jnp.array(w)
    for _ in range(3):
        w1, g1 = plain(w1, x)
        w2, g2 = guarded(w2, x)
        np.testing.assert_array_equal(
            np.asarray(w1).view(np.uint32), np.asarray(w2).view(np.uint32)
        )
        np.testing.assert_array_equal(
            np.asarray(g1).view(np.uint32), np.asarray(g2).view(np.uint32)
        )


@pytest.mark.parametrize("donate", [False, True], ids=["plain", "donated"])
def test_guard_raises_with_report(donate):
    w = jnp.zeros((8, 4))
    x = jnp.ones((16, 8))
    step = gsj.guard(make_step(donate))
    with pytest.raises(gradsan.NonFiniteError) as info:
        step(w, x)
    err = info.value
    assert isinstance(err, FloatingPointError)
    [f] = err.report.findings
    assert f.primitive == "sqrt" and f.where.line == line_of("L:guard")
    assert f.catalog_id == "sqrt-at-zero"
    assert "sqrt at" in str(err) and "gradsan.jax.safe.sqrt" in str(err)
    # the report's outputs are what the step returned
    assert np.isnan(np.asarray(err.report.outputs[1])).all()


def test_guard_keeps_signature_and_name():
    def my_step(a, b=2.0):
        return a * b

    g = gsj.guard(my_step)
    assert g.__name__ == "my_step" and g(1.0, b=3.0) == 3.0


def test_guard_rejects_non_callable():
    with pytest.raises(gradsan.UsageError, match="takes a function"):
        gsj.guard(None)


def test_guard_on_value_overflow_float16():
    def f(x):
        return jnp.exp(x) * 2  # L:f16

    step = gsj.guard(jax.jit(f))
    with pytest.raises(gradsan.NonFiniteError) as info:
        step(jnp.array([1.0, 12.0], dtype=jnp.float16))
    [fd] = info.value.report.findings
    assert fd.where.line == line_of("L:f16") and fd.primitive == "exp"
    assert fd.phase == "value"


def test_guard_fuses_into_a_jitted_function_with_static_args():
    @jax.jit
    def plain(x):
        return jnp.sqrt(x)

    f = jax.jit(lambda x, n: jnp.sqrt(x) * n, static_argnums=(1,))
    g = gsj.guard(f)
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(np.asarray(g(x, 3)), np.asarray(f(x, 3)))
    with pytest.raises(gradsan.NonFiniteError):
        g(x - 1.0, 2)


def test_guard_keep_inputs_false_keeps_donation_and_lists_bad_outputs():
    step = gsj.guard(make_step(True), keep_inputs=False)
    w = jnp.zeros((8, 4))
    with pytest.raises(gradsan.NonFiniteError) as info:
        step(w, jnp.ones((16, 8)))
    assert w.is_deleted()
    assert "could not be replayed" in str(info.value)
    assert "[1] (32 of 32 elements)" in str(info.value)


def test_guard_keeps_donated_inputs_alive_for_the_replay():
    w = jnp.zeros((8, 4))
    step = gsj.guard(make_step(True))
    with pytest.raises(gradsan.NonFiniteError):
        step(w, jnp.ones((16, 8)))
    assert not w.is_deleted()


def test_guard_bit_identical_on_an_adam_attention_step():
    optax = pytest.importorskip("optax")
    opt = optax.adam(1e-2)
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    params = {
        "q": jax.random.normal(k[0], (16, 16)),
        "k": jax.random.normal(k[1], (16, 16)),
        "v": jax.random.normal(k[2], (16, 16)),
    }
    x = jax.random.normal(k[3], (4, 8, 16))

    def loss(p, x):
        q, kk, v = x @ p["q"], x @ p["k"], x @ p["v"]
        a = jax.nn.softmax(q @ kk.swapaxes(-1, -2) / 4.0, axis=-1)
        h = a @ v
        h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
        return jnp.mean(h**2)

    def step(p, s, x):
        lv, g = jax.value_and_grad(loss)(p, x)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, lv

    plain, guarded = jax.jit(step), gsj.guard(jax.jit(step))
    p1 = p2 = params
    s1 = s2 = opt.init(params)
    for _ in range(3):
        p1, s1, l1 = plain(p1, s1, x)
        p2, s2, l2 = guarded(p2, s2, x)
    for a, b in zip(
        jax.tree_util.tree_leaves((p1, s1, l1)), jax.tree_util.tree_leaves((p2, s2, l2))
    ):
        np.testing.assert_array_equal(
            np.atleast_1d(np.asarray(a)).view(np.uint8), np.atleast_1d(np.asarray(b)).view(np.uint8)
        )


def test_guard_switches_to_the_fused_program_after_the_background_compile():
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 8))
    w = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
    plain = make_step(False)
    g = gsj.guard(make_step(False))
    g(w, x)  # the first call runs the function itself and starts the compile
    g._gradsan_state["thread"].join(timeout=120)
    assert g._gradsan_state["compiled"] is not None
    for a, b in zip(g(w, x), plain(w, x)):  # now through the fused program
        np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
    with pytest.raises(gradsan.NonFiniteError) as info:
        g(jnp.zeros((8, 4)), jnp.ones((16, 8)))
    assert info.value.report.findings[0].where.line == line_of("L:guard")
    g(jnp.zeros((3, 8, 4)).sum(0) + w, x)  # same shapes: compiled path
    g(jnp.ones((8, 2)), jnp.ones((5, 8)))  # other shapes: the jit path
    assert g._gradsan_state["use_jit"]


def test_guard_of_grad_of_jit_returns_the_gradient():
    # jax.grad(jax.jit(f)) copies the jitted function's _jit_info and __wrapped__ (= f): it is
    # not a jit, and fusing the flag into jit(f) would return f's value instead of its gradient
    g = gsj.guard(jax.grad(jax.jit(lambda x: jnp.sum(x**2))))
    x = jnp.array([1.0, 2.0])
    for _ in range(3):
        np.testing.assert_array_equal(
            np.asarray(g(x)), np.array([2.0, 4.0], np.float32), strict=True
        )
        thread = g._gradsan_state["thread"]
        if thread is not None:
            thread.join()


# -- donation: kept, or turned off with one line; never silently dropped (issue 17) -------------


def test_guard_says_in_one_line_that_it_turned_donation_off(caplog):
    with caplog.at_level("WARNING", logger="gradsan"):
        g = gsj.guard(make_step(True))
    [rec] = caplog.records
    assert "donates arguments (0,)" in rec.getMessage() and "keep_inputs=False" in rec.getMessage()
    assert "\n" not in rec.getMessage()
    w = jnp.zeros((8, 4))
    with pytest.raises(gradsan.NonFiniteError) as info:
        g(w, jnp.ones((16, 8)))
    assert "turned the donation off" in str(info.value) and not w.is_deleted()


def test_guard_without_donation_says_nothing(caplog):
    with caplog.at_level("WARNING", logger="gradsan"):
        gsj.guard(make_step(False))
    assert not caplog.records


def test_keep_inputs_false_donates_and_warns_as_jax_does():
    import warnings

    def f(x):
        return jnp.sum(x)  # a scalar cannot reuse the donated buffer: JAX warns

    got = {}
    for label, wrap in (
        ("plain", lambda g: g),
        ("guard", lambda g: gsj.guard(g, keep_inputs=False)),
    ):
        g = wrap(jax.jit(f, donate_argnums=0))
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            for _ in range(3):
                g(jnp.ones(3))
        got[label] = [str(r.message).splitlines()[0] for r in rec]
    assert got["guard"] == got["plain"] and got["plain"]
    g = gsj.guard(jax.jit(lambda x: x * 2, donate_argnums=0), keep_inputs=False)
    x = jnp.ones(3)
    g(x)
    assert x.is_deleted()


def test_run_mode_checker_keeps_donation_and_reports_consumed_inputs():
    from gradsan.jax._guard import Checker

    c = Checker(
        jax.jit(lambda x: jnp.log(x - 1), donate_argnums=0), background=False, keep_inputs=False
    )
    x = jnp.ones(3)
    out, ok, via = c.run((x,), {})
    assert x.is_deleted() and not ok
    rep = c.report((x,), {}, out, via)
    assert not rep.findings and "could not be replayed" in " ".join(rep.notes)
    # inputs that survived (no donation) are replayed
    c = Checker(jax.jit(lambda x: jnp.log(x - 1)), background=False, keep_inputs=False)
    y = jnp.ones(3)
    out, ok, via = c.run((y,), {})
    assert c.report((y,), {}, out, via).findings[0].primitive == "log"


# -- the call path (issue 17): callbacks, calls inside transformations ---------------------------


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_guard_replay_does_not_repeat_callbacks(jit):
    from jax.experimental import io_callback

    log: list = []

    def f(x):
        io_callback(lambda v: log.append("io"), None, x, ordered=True)
        jax.debug.callback(lambda v: log.append("debug"), x)
        return jnp.log(x)

    g = gsj.guard(jax.jit(f) if jit else f)
    with pytest.raises(gradsan.NonFiniteError) as e:
        g(jnp.array([0.0, 1.0]))
    jax.effects_barrier()
    assert sorted(log) == ["debug", "io"]  # the user's call only; the replay skipped them
    assert e.value.report.findings[0].primitive == "log"


def test_guard_inside_jit_is_a_clear_error_also_for_many_outputs():
    from gradsan.jax import _flags

    n = _flags.FUSE_LIMIT + 1
    step = jax.jit(lambda x: [x * i for i in range(n)])
    with pytest.raises(gradsan.UsageError, match="inside a JAX transformation"):
        jax.jit(lambda x: gsj.guard(step)(x)[0])(jnp.ones(2))
