"""G0: with every output finite, sanitize, nansafe and guard return exactly what the plain call
returns (the same bits and the same Python types), eagerly and under jit (issue 17)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan.jax as gsj


def same(a, b) -> bool:
    """The same pytree, leaf types and bits (numpy views, so -0.0 != 0.0 and NaN == NaN)."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb or len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if type(x) is not type(y):
            return False
        if isinstance(x, (str, bytes)) or callable(x):
            if x != y:
                return False
            continue
        ax, ay = np.atleast_1d(np.asarray(x)), np.atleast_1d(np.asarray(y))
        if ax.dtype != ay.dtype or ax.shape != ay.shape:
            return False
        if not np.array_equal(ax.view(np.uint8), ay.view(np.uint8)):
            return False
    return True


def mlp(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jnp.tanh(h @ w + b)
    w, b = params[-1]
    o = h @ w + b
    return jnp.mean((o - y) ** 2) + 1e-3 * sum(jnp.sum(w * w) for w, _ in params)


def mlp_params(sizes=(7, 33, 17, 3), seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(sizes))
    return [
        (jax.random.normal(k, (a, b)) / np.sqrt(a), jnp.full((b,), 0.01))
        for k, a, b in zip(keys, sizes[:-1], sizes[1:])
    ]


@pytest.fixture(scope="module")
def data():
    x = jax.random.normal(jax.random.PRNGKey(1), (9, 7))
    y = jax.random.normal(jax.random.PRNGKey(2), (9, 3))
    return mlp_params(), x, y


def nansafe_out(f, *a, **k):
    return gsj.nansafe(f)(*a, **k)


def sanitize_out(f, *a, **k):
    return gsj.sanitize(f)(*a, **k).outputs


def guard_out(f, *a, **k):
    return gsj.guard(f)(*a, **k)


def explain_out(f, *a, **k):
    return gsj.explain(f)(*a, **k).outputs


WRAPPERS = [nansafe_out, sanitize_out, guard_out, explain_out]
IDS = ["nansafe", "sanitize", "guard", "explain"]


@pytest.mark.parametrize("wrap", WRAPPERS, ids=IDS)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_mlp_value_and_grad(wrap, jit, data):
    params, x, y = data
    g = jax.value_and_grad(mlp)
    g = jax.jit(g) if jit else g
    assert same(wrap(g, params, x, y), g(params, x, y))


@pytest.mark.parametrize("wrap", WRAPPERS, ids=IDS)
def test_hessian(wrap):
    def f(x):
        return jnp.sum(jnp.sin(x) * jnp.exp(0.3 * x) / (1.0 + x * x))

    x = jnp.linspace(-1.3, 2.1, 5)
    h = jax.hessian(f)
    assert same(wrap(h, x), h(x))


@pytest.mark.parametrize("wrap", WRAPPERS, ids=IDS)
def test_keyword_arguments(wrap, data):
    params, x, y = data

    def loss(params, *, x, y, scale=1.0):
        return scale * mlp(params, x, y)

    g = jax.grad(loss)
    assert same(wrap(g, params, y=y, x=x, scale=0.5), g(params, x=x, y=y, scale=0.5))


@pytest.mark.parametrize("wrap", [nansafe_out, sanitize_out, guard_out], ids=IDS[:3])
def test_optax_train_step(wrap, data):
    optax = pytest.importorskip("optax")
    params, x, y = data
    opt = optax.adamw(1e-2)
    state = opt.init(params)

    def step(params, state, x, y):
        loss, g = jax.value_and_grad(mlp)(params, x, y)
        upd, state = opt.update(g, state, params)
        return optax.apply_updates(params, upd), state, loss

    for f in (step, jax.jit(step)):
        assert same(wrap(f, params, state, x, y), f(params, state, x, y))


@pytest.mark.parametrize("wrap", WRAPPERS, ids=IDS)
def test_flax_dropout_train_step(wrap):
    nn = pytest.importorskip("flax.linen")

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Dense(16)(x)
            x = nn.Dropout(0.3, deterministic=not train)(x)
            return nn.Dense(2)(jnp.tanh(x))

    net = Net()
    x = jax.random.normal(jax.random.PRNGKey(3), (4, 5))
    params = net.init(jax.random.PRNGKey(0), x, train=False)

    def loss(params, x, key):
        out = net.apply(params, x, train=True, rngs={"dropout": key})
        return jnp.mean(out**2)

    g = jax.value_and_grad(loss)
    for key in (jax.random.key(7), jax.random.PRNGKey(7)):
        assert same(wrap(g, params, x, key), g(params, x, key))


@pytest.mark.parametrize("wrap", WRAPPERS, ids=IDS)
def test_python_scalars_and_strings_keep_their_types(wrap):
    def f(x, n):
        return {"loss": jnp.sum(x * x), "lr": 0.1, "step": n, "name": "run"}

    x = jnp.arange(3.0)
    out = wrap(f, x, 3)
    assert same(out, f(x, 3))
    assert type(out["lr"]) is float and type(out["step"]) is int


def test_nansafe_of_jit_is_jit_bit_for_bit(data):
    params, x, y = data

    def attention(q, k):
        s = q @ k.T / jnp.sqrt(q.shape[-1])
        return jnp.sum(jax.nn.softmax(s, -1) * jnp.log1p(jnp.exp(s)))

    q = jax.random.normal(jax.random.PRNGKey(4), (6, 8))
    progs = [
        (jax.jit(jax.grad(mlp)), (params, x, y)),
        (jax.jit(jax.value_and_grad(attention, argnums=(0, 1))), (q, q[::-1] * 0.7)),
    ]
    for f, args in progs:
        assert same(gsj.nansafe(f)(*args), f(*args))


def test_nansafe_honours_static_argnums():
    f = jax.jit(lambda x, n: jnp.sqrt(x) * n if n > 1 else x, static_argnums=(1,))
    x = jnp.arange(1.0, 4.0)
    assert same(gsj.nansafe(f)(x, 3), f(x, 3))
    assert same(gsj.nansafe(f)(x, 1), f(x, 1))
    # the repaired path too: a where-guarded sqrt at 0 with a static multiplier
    g = jax.jit(
        jax.grad(lambda x, n: jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0)) * n),
        static_argnums=(1,),
    )
    z = jnp.array([-1.0, 4.0])
    np.testing.assert_array_equal(np.asarray(gsj.nansafe(g)(z, 2)), [0.0, 0.5])


def test_nansafe_python_float_stays_a_float():
    def f(x):
        return x * 2.0, 1.5

    out = gsj.nansafe(f)(jnp.float32(1.0))
    assert type(out[1]) is float and same(out, f(jnp.float32(1.0)))


# -- side effects: a replay does not make them again --------------------------------------------


@pytest.mark.parametrize("api", ["explain", "sanitize"])
def test_replay_does_not_repeat_side_effects(api):
    from jax.experimental import io_callback

    log: list = []

    def f(x):
        io_callback(lambda v: log.append("io"), None, x, ordered=True)
        jax.debug.callback(lambda v: log.append("debug"), x)
        return jnp.log(x)

    x = jnp.array([0.0, 1.0])
    r = getattr(gsj, api)(f)(x)
    assert log == ["io", "debug"] and r.findings[0].primitive == "log"
    assert not r.notes


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_io_callback_with_results_keeps_the_users_outputs_and_says_so(jit):
    from jax.experimental import io_callback

    count = [0]

    def bump(v):
        count[0] += 1
        return np.asarray(count[0], np.float32)

    def f(x):
        n = io_callback(bump, jax.ShapeDtypeStruct((), jnp.float32), x, ordered=True)
        return jnp.log(x) + n

    f = jax.jit(f) if jit else f
    x = jnp.array([0.0, 1.0])
    r = gsj.explain(f)(x)
    assert np.asarray(r.outputs)[1] == 1.0  # the user's call: the first callback's value
    [note] = r.notes
    assert "io_callback at" in note and "test_g0.py" in note and "repeated" in note
