"""`pytest --gradsan`: each failure printed once and naming how to allow it; the marker works
above and below absl's @parameterized; --gradsan-allow by keyword or node id; a test that
a test that catches the error passes (it may mean it); tests inside an installed package (--pyargs) are checked;
the session ends with one line of what was checked."""

import pytest

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.slow  # pytest runs pytest in a subprocess

TESTS = """
import jax, jax.numpy as jnp
import pytest
from absl.testing import parameterized

def loss(x):
    return jnp.sqrt(jnp.sum(x ** 2))

def test_nan_gradient():
    jax.grad(loss)(jnp.zeros(3))

def test_caught():
    try:
        jax.grad(loss)(jnp.zeros(3))
    except Exception:
        pass

def test_apply_if_finite_feeds_nan():
    jax.grad(loss)(jnp.zeros(2))

def test_healthy():
    jax.grad(loss)(jnp.ones(2))

class T(parameterized.TestCase):
    @pytest.mark.gradsan_allow_nonfinite
    @parameterized.parameters(1, 2)
    def test_above(self, n):
        jax.grad(loss)(jnp.zeros(n))

    @parameterized.parameters(1, 2)
    @pytest.mark.gradsan_allow_nonfinite
    def test_below(self, n):
        jax.grad(loss)(jnp.zeros(n))
"""


def test_each_failure_once_with_the_way_to_allow_it(pytester):
    pytester.makepyfile(test_p=TESTS)
    r = pytester.runpytest_subprocess("--gradsan", "-p", "no:cacheprovider", "-rf")
    r.assert_outcomes(passed=6, failed=2)
    out = r.stdout.str()
    # one report per failure: its origin line appears once in each failure's text
    assert out.count("sqrt got 0.0; d/dx sqrt(x)") == 2
    assert out.count("mark it @pytest.mark.gradsan_allow_nonfinite or run with") == 2
    r.stdout.fnmatch_lines(['*--gradsan-allow="test_nan_gradient"*'])
    r.stdout.fnmatch_lines(["FAILED test_p.py::test_nan_gradient - gradsan: NaN in the gradient*"])
    r.stdout.fnmatch_lines(
        [
            "gradsan: checked 4 calls of 1 JAX function (`loss` (jax.grad) x4) in 4 tests; 2 failed "
            "with a gradsan report; 4 tests allowed NaN/Inf (*"
        ]
    )


def test_allow_on_the_command_line_by_keyword_or_node_id(pytester):
    pytester.makepyfile(test_p=TESTS)
    r = pytester.runpytest_subprocess(
        "--gradsan",
        "-p",
        "no:cacheprovider",
        "--gradsan-allow",
        "apply_if_finite or caught",
        "--gradsan-allow=test_p.py::test_nan_gradient",
    )
    r.assert_outcomes(passed=8)
    r.stdout.fnmatch_lines(["*; 7 tests allowed NaN/Inf*"])


def test_a_bad_allow_expression_is_a_usage_error(pytester):
    pytester.makepyfile(test_p="def test_x():\n    pass\n")
    r = pytester.runpytest_subprocess(
        "--gradsan", "--gradsan-allow", "a and (", "-p", "no:cacheprovider"
    )
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*--gradsan-allow='a and (': not a keyword expression*"])


def test_tests_in_an_installed_package_are_checked(pytester):
    # mypkg, and a package gradsan names as a library (haiku: like `pytest --pyargs optax`,
    # whose test files sit in site-packages/optax/): the collected test files are the user's
    site = pytester.mkdir("site-packages")
    for name in ("mypkg", "haiku"):
        pkg = site / name
        (pkg / "tests").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "tests" / "__init__.py").write_text("")
        # haiku's copy two lines lower: code objects that differ only in their file compare
        # equal, and gradsan's trace cache would give both the first file's lines
        head = "" if name == "mypkg" else "# haiku's copy\n\n"
        (pkg / "tests" / "test_inst.py").write_text(head + TESTS.split("class T")[0])
    r = pytester.runpytest_subprocess(
        "--gradsan",
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "mypkg",
        "haiku",
        "--rootdir",
        str(site),
        "-o",
        f"pythonpath={site}",
    )
    r.assert_outcomes(passed=4, failed=4)
    r.stdout.fnmatch_lines(
        [
            "*2 test files from installed packages: only their own jit/grad "
            "functions checked, not the package's*"
        ]
    )
    line = TESTS.splitlines().index("    return jnp.sqrt(jnp.sum(x ** 2))") + 1
    for name, at in (("mypkg", line), ("haiku", line + 2)):  # at the test file's own line
        r.stdout.fnmatch_lines([f"*: sqrt at *{name}/tests/test_inst.py:{at} (loss)*"])


def test_gradsan_modules_are_not_assertion_rewritten(pytester):
    # pytest would parse and recompile every gradsan module imported in a test (an entry-point
    # plugin's package is marked for rewriting): seconds per session under --gradsan
    pytester.makepyfile(
        test_r="""
        import jax, jax.numpy as jnp

        def test_loader():
            jax.jit(jnp.sin)(1.0)  # the check imports gradsan.jax
            import sys
            loader = type(sys.modules["gradsan.jax._guard"].__loader__).__name__
            assert loader != "AssertionRewritingHook", loader
    """
    )
    r = pytester.runpytest_subprocess("--gradsan", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1)


def test_allow_by_node_id_of_a_test_file_outside_the_rootdir(pytester):
    # pytest --pyargs optax from elsewhere: the node ids are `::Class::test` (no file); the
    # file's path tail names them (optax alias_test's adadelta-without-learning-rate run)
    site = pytester.mkdir("site-packages")
    (site / "mypkg").mkdir()
    (site / "mypkg" / "__init__.py").write_text("")
    (site / "mypkg" / "test_inst.py").write_text(TESTS.split("class T")[0])
    run = pytester.mkdir("elsewhere")
    r = pytester.runpytest_subprocess(
        "--gradsan",
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "mypkg.test_inst",
        f"--rootdir={run}",
        "-o",
        f"pythonpath={site}",
        "--gradsan-allow=mypkg/test_inst.py::test_nan_gradient",
        "--gradsan-allow=test_inst.py::test_apply_if_finite_feeds_nan",
    )
    r.assert_outcomes(passed=4)
    r.stdout.fnmatch_lines(["*; 2 tests allowed NaN/Inf*"])
