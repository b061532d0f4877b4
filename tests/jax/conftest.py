import pytest

jax = pytest.importorskip("jax")


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    return jax.jit if request.param else (lambda f: f)
