"""`gradsan run` and torch.multiprocessing.spawn / start_processes (join=True and join=False):
each worker is checked in its own process; the report names the rank, and the parent re-runs
the workers to locate the op at the user's line (or says why not). The worker wrapper and the
parent's join in-process (the processes stood in for by a runner that calls the workers in
turn); one `gradsan run` subprocess (slow)."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gradsan._run._failure import Failure, Stop
from gradsan._run._hooks import Hooks
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
    # located by re-running the workers: the op at the user's line
    assert f"sqrt at {EXAMPLE}:{line_of(EXAMPLE, 'the rmse')} (worker)" in r.stderr
    assert "located by re-running the spawned workers: rank 1's 4th backward call" in r.stderr
    assert "done" not in r.stdout


def test_a_rerun_traces_the_failing_ranks_call_and_leaves_the_others_unchecked(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(_spawn.Worker, "exit", staticmethod(_exit))
    fn = _example()
    rerun = _spawn.Worker(fn, str(tmp_path), trace=False, fresh=True, replay=(1, 4))
    assert rerun(0, False) is None  # rank 0: unchecked, runs to its end
    assert not list(tmp_path.iterdir()) and torch.Tensor.backward.__module__ == "torch._tensor"
    with pytest.raises(SystemExit) as e:
        rerun(1, False)
    assert e.value.code == 3
    call, _, report, traced = pickle.loads((tmp_path / "rank1.failure").read_bytes())
    assert call == 4 and traced and report.findings[0].catalog_id == "sqrt-at-zero"
    assert report.findings[0].where.line == line_of(EXAMPLE, "the rmse")


def test_unsafe_arguments_are_named():
    assert _spawn.unsafe_args((False, 3, "x", {"lr": 0.1})) is None
    assert "a tensor" in _spawn.unsafe_args((False, [torch.zeros(2)]))
    assert "a module" in _spawn.unsafe_args(({"m": torch.nn.Linear(1, 1)},))
    import multiprocessing

    q = multiprocessing.get_context("spawn").SimpleQueue()
    assert "a multiprocessing SimpleQueue" in _spawn.unsafe_args((q,))


class _Context:
    """What start_processes returns, for workers already run (their exit codes)."""

    def __init__(self, codes):
        self.codes = codes
        self.processes = []

    def join(self, timeout=None, grace_period=None):
        from torch.multiprocessing.spawn import ProcessExitedException

        for rank, code in enumerate(self.codes):
            if code:
                raise ProcessExitedException(f"process {rank} exited", rank, 0, code)
        return True


def _in_turn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """start_processes without processes: each worker called in turn in this process."""
    codes = []
    for rank in range(nprocs):
        try:
            fn(rank, *args)
            codes.append(0)
        except SystemExit as e:
            codes.append(e.code)
    ctx = _Context(codes)
    if not join:
        return ctx
    while not ctx.join():
        pass


@pytest.fixture
def run_hooks(monkeypatch):
    """The parent's start_processes patched as under `gradsan run` (over _in_turn)."""
    import torch.multiprocessing as mp

    mps = sys.modules["torch.multiprocessing.spawn"]

    monkeypatch.setattr(_spawn.Worker, "exit", staticmethod(_exit))
    monkeypatch.setattr(mps, "start_processes", _in_turn)
    monkeypatch.setattr(mp, "start_processes", _in_turn)

    def on_failure(f: Failure) -> None:
        raise Stop(f)

    hooks = Hooks(on_failure)
    _spawn.patch_spawn(hooks, torch)
    yield hooks
    hooks.uninstall()


def _located(failure):
    assert failure.call == 4 and "in spawned worker rank 1 of 2" in failure.label
    where = f"torch_spawn_workers.py:{line_of(EXAMPLE, 'the backward')} (worker), in spawned"
    assert where in failure.label
    f = failure.report.findings[0]
    assert f.catalog_id == "sqrt-at-zero" and f.where.line == line_of(EXAMPLE, "the rmse")
    assert any("located by re-running the spawned workers" in n for n in failure.report.notes)


def test_spawn_join_false_is_checked_when_the_script_joins(run_hooks):
    import torch.multiprocessing as mp

    ctx = mp.spawn(_example(), args=(False,), nprocs=2, join=False)
    with pytest.raises(Stop) as e:
        while not ctx.join():
            pass
    _located(e.value.failure)


def test_start_processes_is_checked_and_located(run_hooks):
    import torch.multiprocessing as mp

    with pytest.raises(Stop) as e:
        mp.start_processes(_example(), args=(False,), nprocs=2, start_method="spawn")
    _located(e.value.failure)


def test_a_clean_join_counts_the_workers_checks(run_hooks):
    import torch.multiprocessing as mp

    ctx = mp.spawn(_example(), args=(True,), nprocs=2, join=False)
    assert ctx.join() is True and ctx.join() is True
    assert run_hooks.stats.backward == 12


def _with_a_tensor(rank, clean, extra):
    return _example()(rank, clean)


def test_a_worker_given_a_tensor_is_not_rerun_and_says_why(run_hooks):
    import torch.multiprocessing as mp

    with pytest.raises(Stop) as e:
        mp.spawn(_with_a_tensor, args=(False, torch.zeros(2)), nprocs=2)
    f = e.value.failure
    assert f.report.findings[0].catalog_id is None  # the worker's record: the gradients
    assert sorted(o.path for o in f.report.findings[0].outputs) == ["model.bias", "model.weight"]
    (note,) = [n for n in f.report.notes if "not re-run" in n]
    assert "spawned worker rank 1 was not re-run to locate the op" in note and "a tensor" in note


RUNS: list = []


def _bad_once(rank, clean):
    RUNS.append(rank)
    return _example()(rank, clean or RUNS.count(rank) > 1)


def test_a_rerun_that_does_not_reproduce_says_so(run_hooks):
    import torch.multiprocessing as mp

    RUNS.clear()
    with pytest.raises(Stop) as e:
        mp.spawn(_bad_once, args=(False,), nprocs=2)
    notes = e.value.failure.report.notes
    assert any("did not reproduce the non-finite gradient" in n for n in notes)
    assert RUNS == [0, 1, 0, 1]  # the workers ran twice: the run and the re-run
