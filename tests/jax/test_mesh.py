"""The shard_map/pmap tests need 8 devices, which XLA gives a CPU process only when asked before
JAX starts: they run in a child process with XLA_FLAGS set."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_on_8_simulated_devices():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    here = os.path.dirname(__file__)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            os.path.join(here, "mesh", "test_on_mesh.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]
