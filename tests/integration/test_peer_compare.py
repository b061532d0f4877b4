"""tools/peer_suites.py, the plain-vs-``--gradsan`` comparison of a peer's own suite (#17), on a
small suite written here: one `both` run (one subprocess; it runs pytest twice). A test that
feeds NaN on purpose is allowed by node id, one by the marker above absl's @parameterized; a
test whose jitted output goes -inf without being allowed is the one difference printed; pytest's
subtests and skips are counted by node id. The full optax/equinox comparison is the tool run by
hand (its docstring), not a CI test."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytestmark = pytest.mark.slow  # one subprocess (the tool runs pytest twice)

pytest.importorskip("absl")

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "peer_suites.py"

PEER = """
import jax, jax.numpy as jnp
import pytest
from absl.testing import absltest, parameterized


@jax.jit
def safe_log(x):
    return jnp.log(x)


def test_clean():
    assert float(jax.grad(lambda x: jnp.sin(x) * x)(1.0)) != 0.0


def test_intentional():  # allowed on the command line by node id
    assert float(safe_log(0.0)) == -float("inf")


def test_unmarked():  # the same -inf, not allowed: the one difference
    assert float(safe_log(0.0)) == -float("inf")


@pytest.mark.skip(reason="skipped in both modes")
def test_skipped():
    pass


def test_subtests(subtests):
    for i in range(2):
        with subtests.test(i=i):
            assert float(safe_log(1.0 + i)) >= 0.0


class Inf(parameterized.TestCase):
    @pytest.mark.gradsan_allow_nonfinite
    @parameterized.parameters(0.0, -0.0)
    def test_log_at_zero(self, x):
        self.assertEqual(float(safe_log(x)), -float("inf"))
"""


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    d = tmp_path_factory.mktemp("peer")
    (d / "test_peer.py").write_text(PEER)
    out = d / "res"
    args = ["-p", "no:cacheprovider", "-q", "--gradsan-allow=test_peer.py::test_intentional"]
    r = subprocess.run(
        [sys.executable, str(TOOL), "both", "--cwd", str(d), "--out", str(out), "--", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    return r, out


def test_the_one_difference_is_the_unallowed_nan(compared):
    r, _ = compared
    diffs = [x for x in r.stdout.splitlines() if x.startswith("DIFF")]
    assert diffs == ["DIFF test_peer.py::test_unmarked: passed plain, failed under --gradsan"], (
        r.stdout + r.stderr
    )
    assert r.stdout.rstrip().endswith("1 differences")
    assert r.returncode == 1


def test_counts_are_by_node_id_with_subtests_and_skips(compared):
    r, out = compared
    # 7 tests (2 from absl's parameters) + the 2 subtests of one of them
    assert r.stdout.startswith("compared 9 tests (plain ran 9, --gradsan ran 9)"), r.stdout
    assert "plain:     8 passed, 1 skipped" in r.stdout
    assert "--gradsan: 7 passed, 1 failed, 1 skipped" in r.stdout
    plain = Path(f"{out}.plain").read_text().splitlines()
    assert "passed\ttest_peer.py::test_subtests [subtest None [('i', '1')]]" in plain
    log = Path(f"{out}.gradsan.log").read_text()
    assert "allowed NaN/Inf" in log  # the allowed tests ran unchecked, and the line says so


def test_compare_needs_its_files(tmp_path):
    r = subprocess.run(
        [sys.executable, str(TOOL), "compare", str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no outcome file" in r.stderr and "Traceback" not in r.stderr
