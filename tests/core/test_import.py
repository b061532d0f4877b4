"""`import gradsan` stays backend-free (jaxtyping's test_no_jax_dependency, with its meta-test)."""

import subprocess
import sys

import pytest

# slow: five fresh interpreters (a clean sys.modules is the point)
pytestmark = pytest.mark.slow

PROBE = "import sys, {mod}; sys.exit(('jax' in sys.modules) or ('torch' in sys.modules))"


def _run(mod: str) -> int:
    return subprocess.run([sys.executable, "-c", PROBE.format(mod=mod)]).returncode


def test_import_gradsan_imports_no_backend():
    assert _run("gradsan") == 0


def test_catalog_and_cli_import_no_backend():
    assert _run("gradsan._cli") == 0
    assert _run("gradsan._pytest_plugin") == 0


def test_the_probe_can_fail():
    assert _run("gradsan.jax") == 1


def test_gradsan_jax_attribute_loads_lazily():
    code = "import gradsan; gradsan.jax; import sys; sys.exit('jax' not in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
