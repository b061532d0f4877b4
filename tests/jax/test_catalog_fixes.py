"""The catalog's fixes run and remove the NaN: each fix whose code is written in the
placeholders x (and y) is executed at its entry's singular point, inside jax.grad."""

import ast

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradsan
import gradsan.jax  # noqa: F401  (gradsan.jax.safe in the fixes' namespace)

# the singular point of each entry, in the names its fixes use: x (and y, p)
POINTS = {e.id: dict(e.point) for e in gradsan.catalog.ENTRIES if e.point is not None}
KNOWN = {"jnp", "jax", "gradsan", "np", "x", "y", "True", "False", "None"}


def _free_names(code: str) -> set[str]:
    tree = ast.parse(code)
    assigned = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - assigned - KNOWN - set(dir(__builtins__))


def _result_name(code: str) -> str:
    last = ast.parse(code).body[-1]
    assert isinstance(last, ast.Assign), code
    target = last.targets[0]
    assert isinstance(target, ast.Name), code
    return target.id


def _cases():
    for entry_id, point in POINTS.items():
        entry = gradsan.catalog.get(entry_id)
        for i, fix in enumerate(entry.fixes):
            if "still singular" in fix.summary:  # a note about another form, not a fix
                continue
            if not _free_names(fix.jax) - set(point):
                yield pytest.param(entry_id, fix.jax, point, id=f"{entry_id}-{i}")


@pytest.mark.parametrize("entry_id, code, point", list(_cases()))
def test_fix_runs_and_gives_a_finite_gradient(entry_id, code, point):
    x0, y0 = point["x"], point.get("y")
    extra = {k: v for k, v in point.items() if k not in ("x", "y")}
    target = _result_name(code)

    def f(x, y):
        ns = {
            "jnp": jnp,
            "jax": jax,
            "gradsan": gradsan,
            "np": np,
            "x": x,
            "y": y,
            **extra,
        }
        exec(code, ns)
        return jnp.sum(ns[target])

    x = jnp.asarray(x0, jnp.float32)
    y = jnp.asarray(y0 if y0 is not None else 1.0, jnp.float32)
    value = f(x, y)
    gx, gy = jax.grad(f, argnums=(0, 1))(x, y)
    assert np.all(np.isfinite(np.asarray(gx))), f"{entry_id}: {code!r} gives d/dx {gx}"
    if y0 is not None:
        assert np.all(np.isfinite(np.asarray(gy))), f"{entry_id}: {code!r} gives d/dy {gy}"
    assert not np.isnan(np.asarray(value)).any()


def test_most_entries_have_a_tested_fix():
    tested = {p.values[0] for p in _cases()}
    assert tested == set(POINTS), sorted(set(POINTS) - tested)
