"""Two files holding the same function, line for line: Python's code objects compare equal
(code equality ignores ``co_filename``), so a cache keyed on the code object alone gave the
second file's report the first file's place. Each report must name its own file:line."""

import importlib.util
import sys

import pytest

SOURCE = """\
import {mod}


def loss(x):
    return {sqrt}(x).sum()
"""


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _two(tmp_path, mod, sqrt):
    mods = []
    for name in ("same_code_one", "same_code_two"):
        path = tmp_path / f"{name}.py"
        path.write_text(SOURCE.format(mod=mod, sqrt=sqrt))
        mods.append((path, _load(path, name)))
    assert mods[0][1].loss.__code__ == mods[1][1].loss.__code__  # the premise
    return mods


def _origin(report):
    found = [f for f in report.findings if f.kind == "nonfinite"]
    assert found, str(report)
    return found[0].where


def test_jax_each_report_names_its_own_file(tmp_path):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import gradsan.jax as gj

    x = jnp.array([0.0, 1.0])
    for path, mod in _two(tmp_path, "jax.numpy as jnp", "jnp.sqrt"):
        report = gj.explain(jax.grad(mod.loss))(x)
        where = _origin(report)
        assert (where.file, where.line) == (str(path), 5), str(report)
        assert f"{path}:5 (loss)" in str(report)
        assert f"at the top of {path.name}" in str(report)


def test_torch_each_report_names_its_own_file(tmp_path):
    torch = pytest.importorskip("torch")

    import gradsan.torch as gt

    for path, mod in _two(tmp_path, "torch", "torch.sqrt"):
        x = torch.tensor([0.0, 1.0], requires_grad=True)

        def step(x, loss=mod.loss):
            loss(x).backward()

        report = gt.explain(step)(x)
        where = _origin(report)
        assert (where.file, where.line) == (str(path), 5), str(report)
        assert f"{path}:5 (loss)" in str(report)


def teardown_module():
    for name in ("same_code_one", "same_code_two"):
        sys.modules.pop(name, None)
