"""How `gradsan run` ends: one line of what it checked (so silence means clean), the script's
traceback without gradsan's or runpy's frames (exit 1), an error inside gradsan said to be one
(exit 4), and one path style in headers and bodies (relative under the working directory,
absolute elsewhere)."""

import pytest

from tests.conftest import line_of
from tests.integration.test_run import gradsan, write

pytestmark = pytest.mark.slow

SCRIPT = """
    import sys
    import jax, jax.numpy as jnp

    if sys.argv[1] == "internal":
        import gradsan.jax._guard as g
        g.diagnose = None  # breaks gradsan's own replay

    @jax.jit
    def step(x):
        return jnp.log(x)  # the log

    def main():
        step(jnp.ones(2))
        jax.vmap(jnp.sin)(jnp.ones(2))  # an eager vmap: not checked
        if sys.argv[1] == "user":
            raise ValueError("bad config")  # the user's raise
        if sys.argv[1] != "clean":
            step(jnp.zeros(2) - 1)

    main()
"""


def test_a_clean_run_says_what_it_checked_and_what_not(tmp_path):
    s = write(tmp_path, "s.py", SCRIPT)
    r = gradsan("run", s, "clean", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (last,) = r.stderr.splitlines()
    assert last == (
        "gradsan: checked 1 call of 1 JAX function (`step` (jax.jit) x1): all "
        "finite; not checked: 1 eager call of jax.vmap."
    )


def test_a_script_without_jit_or_grad_says_nothing_was_checked(tmp_path):
    s = write(tmp_path, "plain.py", "import jax.numpy as jnp\nprint(jnp.log(0.0))\n")
    r = gradsan("run", s, cwd=tmp_path)
    assert r.returncode == 0
    assert r.stderr.startswith("gradsan: checked nothing: the script made no jit/grad function")


def test_the_scripts_error_shows_its_own_frames_only(tmp_path):
    s = write(tmp_path, "s.py", SCRIPT)
    r = gradsan("run", s, "user", cwd=tmp_path)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1] == f'  File "{s}", line {len(SCRIPT.strip().splitlines()) + 1}, in <module>'
    raise_line = line_of(s, "the user's raise")
    assert f'  File "{s}", line {raise_line}, in main' in lines
    assert "ValueError: bad config" in lines
    assert "gradsan/" not in r.stderr.split("ValueError")[0] and "runpy" not in r.stderr
    assert "all finite up to the script's exit" in lines[-1]


def test_an_error_inside_gradsan_says_so_and_exits_4(tmp_path):
    s = write(tmp_path, "s.py", SCRIPT)
    r = gradsan("run", s, "internal", cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    assert "gradsan: internal error in gradsan, not in your script (TypeError:" in r.stderr
    assert "gradsan/jax/_guard.py" in r.stderr  # gradsan's frames are shown: it is our bug
    assert "checked" not in r.stderr.splitlines()[-1]


def test_torch_header_and_body_use_the_same_path_style(tmp_path):
    s = write(
        tmp_path,
        "t.py",
        """
        import torch
        x = torch.zeros(3, requires_grad=True)
        torch.sqrt(x).sum().backward()  # the backward
    """,
    )
    (tmp_path / "elsewhere").mkdir()
    for cwd, shown in ((tmp_path, "t.py"), (tmp_path / "elsewhere", str(s))):  # under cwd: relative
        r = gradsan("run", "--trace", s, cwd=cwd)
        assert r.returncode == 3, r.stderr
        where = f"{shown}:{line_of(s, 'the backward')}"
        assert f"backward call, at {where} (<module>)" in r.stderr  # the header
        assert f"origin   {where} (<module>)" in r.stderr  # the body
        assert "../" not in r.stderr
