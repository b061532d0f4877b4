"""The user scripts of #16's "Done when" that run in-process: guard's replay on a DataLoader
loop (examples/torch_guard_replay.py) and explain around a compiled model
(examples/torch_compile_explain.py, slow: torch.compile)."""

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import line_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_guard_replay_example_pulls_no_extra_batch_and_applies_no_update(capsys):
    ex = _load("torch_guard_replay")
    got = ex.main()
    out = capsys.readouterr().out
    assert got["failed"] == [5] and got["unchanged"]
    # the loader gave every batch once, in order: the replay took none from it
    assert got["asked"] == list(range(12))
    script = EXAMPLES / "torch_guard_replay.py"
    assert f"torch_guard_replay.py:{line_of(script, 'the sqrt')} (step)" in out
    assert "sqrt at " in out
    # 11 scheduler steps (the failing step's update and scheduler step never ran)
    assert got["lr"] == [0.1 * 0.5 ** (11 // 4)]


@pytest.mark.slow
def test_compile_explain_example_locates_the_users_line(capsys):
    ex = _load("torch_compile_explain")
    try:
        report = ex.main()
    except Exception as e:  # pragma: no cover - depends on the toolchain
        pytest.skip(f"torch.compile is unusable here: {e}")
    script = EXAMPLES / "torch_compile_explain.py"
    (f,) = report.findings
    assert f.catalog_id == "sqrt-at-zero"
    assert (f.where.file, f.where.line) == (
        str(script),
        line_of(script, "the sqrt: its gradient at 0 is NaN"),
    )
    assert {o.path for o in f.outputs} == {"model.enc.weight", "model.enc.bias"}
