"""`gradsan run` and torch.multiprocessing.spawn: each worker is checked in its own process,
the report names the rank. The worker wrapper in-process; one `gradsan run` subprocess (slow)."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gradsan.torch import _spawn
from tests.conftest import line_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_spawn_workers.py"


def _example():
    ns: dict = {"__name__": "spawn_example"}
    exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"), ns)
    return ns["worker"]


def _exit(code):
    raise SystemExit(code)


def test_a_worker_checks_its_gradients_and_saves_its_report(tmp_path, monkeypatch):
    monkeypatch.setattr(_spawn.Worker, "exit", staticmethod(_exit))
    worker = _spawn.Worker(_example(), str(tmp_path), trace=False, fresh=True)
    with pytest.raises(SystemExit) as e:
        worker(1, False)
    assert e.value.code == 3
    call, label, report, traced = pickle.loads((tmp_path / "rank1.failure").read_bytes())
    assert call == 4 and not traced
    assert label.endswith(f"torch_spawn_workers.py:{line_of(EXAMPLE, 'the backward')} (worker)")
    (f,) = report.findings
    assert sorted(o.path for o in f.outputs) == ["model.bias", "model.weight"]
    assert pickle.loads((tmp_path / "rank1.calls").read_bytes()) == 4
    assert torch.Tensor.backward.__module__ == "torch._tensor"  # the worker's patches undone


def test_a_clean_worker_runs_to_the_end_and_counts_its_checks(tmp_path):
    worker = _spawn.Worker(_example(), str(tmp_path), trace=False, fresh=True)
    assert worker(1, True) is None
    assert not (tmp_path / "rank1.failure").exists()
    assert pickle.loads((tmp_path / "rank1.calls").read_bytes()) == 6


def test_a_traced_worker_locates_the_op(tmp_path, monkeypatch):
    monkeypatch.setattr(_spawn.Worker, "exit", staticmethod(_exit))
    worker = _spawn.Worker(_example(), str(tmp_path), trace=True, fresh=True)
    with pytest.raises(SystemExit):
        worker(1, False)
    _, _, report, traced = pickle.loads((tmp_path / "rank1.failure").read_bytes())
    f = report.findings[0]
    assert traced and f.catalog_id == "sqrt-at-zero"
    assert f.where.line == line_of(EXAMPLE, "the rmse") and f.where.function == "worker"


@pytest.mark.slow
def test_gradsan_run_names_the_spawned_rank(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "gradsan", "run", str(EXAMPLE)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 3, r.stderr
    where = f"{EXAMPLE}:{line_of(EXAMPLE, 'the backward')} (worker)"
    assert f"the 4th backward call, at {where}, in spawned worker rank 1 of 2" in r.stderr
    assert "reached  model.weight (4 of 4 elements), model.bias (1 of 1 elements)" in r.stderr
    assert "done" not in r.stdout
