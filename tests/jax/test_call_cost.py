"""The cost parts of the call path (issue 17), checked by what runs, never by wall-clock time:
a jit re-created per call is traced once, deferred flags report the call they belong to, and
the many-leaf flag decides as the per-leaf one does. Timings: benchmarks/bench_call_cost.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradsan._run import _patch_jax
from gradsan._run._hooks import Hooks
from gradsan.jax import _flags


class Failed(Exception):
    pass


@pytest.fixture
def hooks():
    got: list = []

    def on_failure(f):
        got.append(f)
        raise Failed(f.call)

    h = Hooks(on_failure)
    _patch_jax.patch_jax(h, jax)
    h.failures = got
    yield h
    h.uninstall()


def test_jit_recreated_per_call_is_traced_once(hooks):
    traces = []

    def f(x):
        traces.append(1)  # runs only while JAX traces f
        return jnp.tanh(x) * 2.0

    x = jnp.ones(4)
    for _ in range(6):
        x = jax.jit(f)(x)
    assert isinstance(jax.jit(f), _patch_jax.Watched)  # the patch did wrap it
    assert len(traces) == 1


def test_a_lambda_remade_over_the_same_values_reuses_the_program(hooks):
    traces = []
    scale = jnp.float32(3.0)

    def make():
        def g(x):
            traces.append(1)
            return x * scale

        return g

    for _ in range(4):
        jax.jit(make())(jnp.ones(2))
    assert len(traces) == 1


def test_deferred_flags_report_the_call_they_belong_to(hooks):
    hooks.defer_flags = "late"  # every flag one call late (the adaptive read: below)
    step = jax.jit(lambda x, k: jnp.log(x - k))
    x = jnp.ones(3) * 5.0
    step(x, 1.0)
    step(x, 2.0)
    step(x, 5.0)  # the 3rd call goes -inf; its flag is read during the 4th
    with pytest.raises(Failed) as e:
        step(x, 1.0)
    assert e.value.args == (3,) and hooks.failures[0].call == 3
    assert hooks.failures[0].report.findings[0].primitive == "log"


def test_deferred_flag_of_the_last_call_is_read_at_the_flush(hooks):
    hooks.defer_flags = "late"
    step = jax.jit(lambda x: jnp.sqrt(x))
    step(jnp.ones(2))
    step(-jnp.ones(2))  # the last call: nothing reads its flag but the flush
    with pytest.raises(Failed) as e:
        _patch_jax.flush_pending(hooks)
    assert e.value.args == (2,)


class _Running:
    """A dispatched flag whose step is still running: not ready, read by waiting."""

    def __init__(self, flag):
        self.flag = flag

    def is_ready(self):
        return False

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.flag, dtype)


@pytest.mark.parametrize("slow", [False, True], ids=["fast", "slow"])
def test_a_step_done_within_its_dispatch_is_read_at_once_a_slow_one_late(hooks, slow):
    """`gradsan run`'s read (defer_flags=True): a cheap step that XLA:CPU runs within its
    dispatch has its flag read at once (no snapshot of its inputs) and a NaN is reported at
    its own call; a step still running when the dispatch returns (large matmuls) has its
    flag read one call late. Either way the report names the failing call, with its inputs."""
    hooks.defer_flags = True
    n = 400 if slow else 4
    w = jnp.full((n, n), 1.0 / n)
    if slow:
        step = jax.jit(lambda x: jnp.log(((x @ w) @ w) @ w))
    else:
        step = jax.jit(lambda x: jnp.log(x * 0.5))
    x = jnp.ones((n, n))
    step(x)  # the first call: traced, its flag read at once; the fused program from here on
    # Whether a real step is done when its dispatch returns depends on the machine's load
    # (benchmarks/bench_call_cost.py counts it); here it is fixed, to test what follows from it.
    fused = step._fast

    def dispatched(*args, **kwargs):
        out, flag = fused(*args, **kwargs)
        if isinstance(flag, jax.core.Tracer):  # a call made while tracing
            return out, flag
        return out, (_Running(flag) if slow else flag.block_until_ready())

    step._fast = dispatched
    for _ in range(3):
        step(x)
    now, late = step._reads  # the fused calls after the first
    assert (now, late) == ((0, 3) if slow else (3, 0))
    bad = x.at[1].set(-1.0)  # a row of negatives: its log is NaN
    if slow:
        step(bad)  # the 5th call: its flag is still being computed, read at the 6th
        assert not hooks.failures
        with pytest.raises(Failed) as e:
            step(x)
    else:
        with pytest.raises(Failed) as e:
            step(bad)
    (f,) = hooks.failures
    assert e.value.args == (5,) and f.call == 5
    assert np.array_equal(np.asarray(f.args[0]), np.asarray(bad))
    assert f.report.findings[0].primitive == "log"


@pytest.mark.parametrize("n", [3, _flags.CHUNK * 2 + 5])
def test_chunked_flag_decides_as_the_fused_one(n):
    leaves = [jnp.full((i % 3 + 1,), float(i), jnp.float32) for i in range(n)]
    leaves.append(jnp.ones(2, jnp.float16))
    leaves.append(jnp.array([1 + 2j], jnp.complex64))
    fused = jax.jit(_flags.finite_flag)

    def flag(out):
        a, b = bool(fused(out)), bool(_flags.chunked_flag(out))
        assert a == b
        return a

    assert flag(leaves)
    for bad in (np.nan, np.inf, -np.inf):
        for where in (0, n // 2, n + 1):
            broken = list(leaves)
            broken[where] = broken[where].at[0].set(bad)
            assert not flag(broken), (bad, where)
    big = list(leaves)
    big[1] = jnp.full((2,), 3e38, jnp.float32)  # finite, and sums overflow: no false alarm
    assert flag(big)


@pytest.mark.parametrize("background", [True, False], ids=["guard", "run"])
def test_many_outputs_are_not_fused_and_still_reported(background):
    from gradsan.jax._guard import Checker

    n = _flags.FUSE_LIMIT + 1

    @jax.jit
    def step(x):
        return [jnp.log(x - i * 0.0) for i in range(n)]

    c = Checker(step, background=background)
    out, ok, via = c.run((jnp.ones(2),), {})
    assert ok and via is None and c.fused is None  # the step as it is, the flag apart
    out, ok, via = c.run((jnp.zeros(2),), {})
    assert not ok
    rep = c.report((jnp.zeros(2),), {}, out, via)
    assert rep.findings and rep.findings[0].primitive == "log"


def test_many_outputs_trace_the_step_once():
    from gradsan.jax._guard import Checker

    traces = []
    n = _flags.FUSE_LIMIT + 1

    @jax.jit
    def step(x):
        traces.append(1)
        return [x * i for i in range(n)]

    c = Checker(step, background=False)
    c.run((jnp.ones(2),), {})
    c.run((jnp.ones(2),), {})
    assert c.fused is None and len(traces) == 1  # sizing's abstract trace is the call's


def test_the_fused_program_reuses_the_steps_trace():
    from gradsan.jax._guard import Checker

    traces = []

    @jax.jit
    def step(x):
        traces.append(1)
        return jnp.sin(x), x + 1

    c = Checker(step, background=False)
    out, ok, via = c.run((jnp.ones(2),), {})
    assert ok and via is not None and len(traces) == 1
    assert all(np.array_equal(a, b) for a, b in zip(out, step(jnp.ones(2))))
    assert len(traces) == 1


def _primitives_program(x, w):
    h = jnp.tanh(x @ w + 0.5)
    return jnp.sum(jnp.exp(h) * jnp.log1p(h * h)) + jnp.max(h)


def test_cached_programs_give_binds_bits(monkeypatch):
    from gradsan.jax import _evalcache

    monkeypatch.setattr(_evalcache, "CACHED_AFTER", 0)  # every XLA evaluation: cached programs

    x = jax.random.normal(jax.random.PRNGKey(0), (4, 8))
    w = jax.random.normal(jax.random.PRNGKey(1), (8, 8))
    jaxpr = jax.make_jaxpr(jax.grad(_primitives_program))(x, w)
    env = dict(zip(jaxpr.jaxpr.invars, [x, w]))
    fast = 0
    for eqn in jaxpr.eqns:
        ins = [v.val if hasattr(v, "val") else env[v] for v in eqn.invars]
        ref = eqn.primitive.bind(*ins, **eqn.params)
        ref = list(ref) if eqn.primitive.multiple_results else [ref]
        with _evalcache.approximate(10**9):  # (numpy twins never: exact programs only)
            got = _evalcache.evaluate(eqn, ins)
        assert _evalcache.evaluate(eqn, ins) is None  # outside guard's replay: bind
        if got is not None:
            fast += 1
            for a, b in zip(got, ref):
                assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
        for v, r in zip(eqn.outvars, ref):
            env[v] = r
    assert fast >= len(jaxpr.eqns) // 2  # the fast path did run


def _deep(n):
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    params = [(jax.random.normal(k, (8, 8)) / 8**0.5, jnp.zeros(8)) for k in keys]

    def loss(params, x):
        h = x
        for w, b in params:
            h = jnp.tanh(h @ w + b)
        return jnp.sqrt(jnp.sum(h * 0.0))  # the gradient is NaN: sqrt's slope at 0

    return jax.jit(jax.grad(loss)), params, jnp.ones((2, 8))


def test_large_replay_goes_through_numpy_and_says_so(monkeypatch):
    from gradsan.jax import _guard

    fun, params, x = _deep(6)
    out = fun(params, x)
    exact = _guard.Checker(fun).report((params, x), {}, out, None)
    assert not any("replayed with numpy" in n for n in exact.notes)
    monkeypatch.setattr(_guard, "APPROX_AFTER", 2)
    approx = _guard.Checker(fun).report((params, x), {}, out, None)
    assert any("replayed with numpy" in n for n in approx.notes)
    # the same finding: origin, its place and the outputs it reached
    a, e = approx.findings[0], exact.findings[0]
    assert (a.primitive, a.where.line, a.outputs) == (e.primitive, e.where.line, e.outputs)


def test_an_approximate_replay_that_differs_is_replayed_exactly(monkeypatch):
    from gradsan.jax import _guard

    fun, params, x = _deep(4)
    out = fun(params, x)
    monkeypatch.setattr(_guard, "APPROX_AFTER", 2)
    monkeypatch.setattr(_guard, "_failure_counts", lambda out: [(-1, -1)])  # never matches
    calls = []
    real = _guard.diagnose
    monkeypatch.setattr(_guard, "diagnose", lambda *a, **k: calls.append(1) or real(*a, **k))
    rep = _guard.Checker(fun).report((params, x), {}, out, None)
    assert len(calls) == 2 and rep.findings[0].primitive == "sqrt"
    assert not any("replayed with numpy" in n for n in rep.notes)


def test_a_flag_not_read_when_the_script_raises_is_reported_first(tmp_path, monkeypatch):
    """Flags read one call late (`gradsan run`, CPU too): a script that checks its loss itself and raises after
    the NaN step still stops with gradsan's report of that step (exit 3), not its own error."""
    from gradsan._run._failure import EXIT_NONFINITE, Stop
    from gradsan._run._hooks import run_script

    monkeypatch.setenv("GRADSAN_JAX_FLAG_READ", "late")  # (a cheap step is read at once)
    script = tmp_path / "train.py"
    script.write_text(
        "import jax, jax.numpy as jnp\n"
        "step = jax.jit(lambda x: jnp.log(x))\n"
        "step(jnp.ones(2))\n"
        "loss = step(-jnp.ones(2))\n"
        "if jnp.isnan(loss).any():\n"
        "    raise ValueError('loss is nan')\n"
    )
    got = []

    def on_failure(f):
        got.append(f)
        raise Stop(f)

    code, failure = run_script(str(script), [], Hooks(on_failure))
    assert code == EXIT_NONFINITE and failure is not None and failure.call == 2
    assert failure.report.findings[0].primitive == "log"


@pytest.mark.parametrize("outputs", [1, _flags.FUSE_LIMIT + 1], ids=["fused", "many"])
def test_a_watched_jit_called_while_tracing_passes_through(hooks, outputs):
    step = jax.jit(lambda x: [jnp.log(x) * i for i in range(outputs)])
    x = jnp.ones(3)
    assert isinstance(step, _patch_jax.Watched)
    # first inside another jit and a vmap (no value to check), then eagerly: checked
    inner = jax.jit(lambda x: step(x)[0])(x)
    batched = jax.vmap(lambda x: step(x)[0])(x)
    assert np.array_equal(inner, batched) and step._calls == 0
    step(x)
    assert step._calls == 1
    with pytest.raises(Failed):
        step(-x)
    assert hooks.failures[0].call == 2
