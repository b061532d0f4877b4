"""What running equinox's own test suite under `pytest --gradsan` found, as one `gradsan run`
script (one subprocess for the file): a patched ``jax.jit`` called first eagerly, then inside
``jax.vmap`` passes the traced call through (equinox's test_vprim: it raised gradsan's
"called inside a JAX transformation" error); ``eqx.filter_pmap(eqx.filter_grad(f))`` made twice
traces ``f`` as often as without gradsan (test_pmap_grad: the checked wrapper compared unequal);
equinox warns about a ``jax.jit`` of a module stored as a field (test_jax_transform_warn);
equinox's error_if inside a test file of a checkout of equinox (a path with ``/equinox/`` in it)
is located at the test's line, which is the user's code."""

import pytest

from tests.conftest import line_of
from tests.integration.test_run import gradsan, write

pytestmark = pytest.mark.slow  # one `gradsan run` subprocess

SCRIPT = """
import jax, jax.numpy as jnp
import equinox as eqx

jax.config.update("jax_num_cpu_devices", 1)

bind = jax.numpy.sin
y2 = jnp.ones((3, 2))
print("eager", float(jax.jit(bind)(y2).sum()))
print("vmap", float(jax.vmap(jax.jit(bind))(y2).sum()))  # a new jit, first called in vmap

traces = 0

def f(x):
    global traces
    traces += 1
    return x + 1

eqx.filter_pmap(eqx.filter_grad(f))(jnp.array([1.0]))
eqx.filter_pmap(eqx.filter_grad(f))(jnp.array([2.0]))
print("pmap traces", traces)

import warnings

class A(eqx.Module):
    linear: object

with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    A(jax.jit(eqx.nn.Linear(2, 2, key=jax.random.key(0))))  # equinox warns: not a pytree
print("warned", any("JAX-transformed callable" in str(w.message) for w in seen))
"""

CHECKOUT_TEST = """
import jax
import equinox as eqx

@jax.jit
def f(x, pred):
    return eqx.error_if(x, pred, "hi", on_error="nan")  # the check

print(f(1.0, True))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("peer")
    tests = d / "checkout" / "equinox" / "tests"  # a path naming equinox, not the installed one
    tests.mkdir(parents=True)
    copy = write(tests, "test_copy.py", CHECKOUT_TEST)
    main = write(d, "main.py", SCRIPT + f"\nimport runpy\nrunpy.run_path({str(copy)!r})\n")
    return main, copy, gradsan("run", main, cwd=d, timeout=240)


def test_patched_jit_inside_vmap_and_filter_pmap_traces(runs):
    _, _, r = runs
    out = r.stdout.splitlines()
    assert out[0].startswith("eager ") and out[1] == "vmap " + out[0].split()[1], r.stderr
    assert out[2] == "pmap traces 2"  # eval_shape + pmap, the second call cached (as plain)
    assert out[3] == "warned True"  # equinox's warning for a jax.jit'd module as a field


def test_error_if_in_a_checkout_of_equinox_is_at_the_users_line(runs):
    _, copy, r = runs
    assert r.returncode == 3, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("NaN in")]
    assert lines and lines[0].startswith(
        'NaN in output `output`: eqx.error_if (on_error="nan") at '
    )
    assert f"test_copy.py:{line_of(copy, 'the check')} (f)" in lines[0]
    assert "its condition `pred` held" in lines[0]
    assert "already in the input" not in r.stderr
