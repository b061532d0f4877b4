"""GradGuard in a plain loop (raise / skip, explained with a replay); the Lightning callback
when lightning is installed."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")

import gradsan  # noqa: E402
from gradsan.integrations.torch_hook import GradGuard  # noqa: E402


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt


def loss_fn(model, x):
    return torch.sqrt((model(x) * 0).sum())  # sqrt at zero


def test_check_raises_with_the_replayed_origin():
    model, opt = make()
    guard = GradGuard(model)
    x = torch.ones(2, 3)
    loss_fn(model, x).backward()
    with pytest.raises(gradsan.NonFiniteError) as e:
        guard.check(replay=lambda: loss_fn(model, x))
    assert "test_torch_hook.py" in str(e.value) and "sqrt" in str(e.value)


def test_skip_mode_in_the_optimizer_pre_hook_leaves_parameters_alone():
    model, opt = make()
    seen = []
    guard = GradGuard(model, opt, mode="skip", on_report=lambda r, s: seen.append((s, r)))
    before = [p.detach().clone() for p in model.parameters()]
    for step in range(3):
        opt.zero_grad()
        x = torch.ones(2, 3)
        loss = loss_fn(model, x) if step == 1 else model(x).pow(2).sum()
        loss.backward()
        opt.step()
        if step == 0:
            before = [p.detach().clone() for p in model.parameters()]
        if step == 1:
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert guard.skipped == 1 and [s for s, _ in seen] == [1]
    assert "model.weight" in str(seen[0][1])
    guard.remove()


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="'raise' or 'skip'"):
        GradGuard(torch.nn.Linear(1, 1), mode="warn")


@pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None
    and importlib.util.find_spec("pytorch_lightning") is None,
    reason="lightning is not installed",
)
def test_lightning_callback_is_a_callback():  # pragma: no cover - needs lightning
    from gradsan.integrations.lightning import GradsanCallback

    assert hasattr(GradsanCallback, "on_before_optimizer_step")


def test_lightning_module_imports_without_lightning():
    import gradsan.integrations.lightning as gl

    if (
        importlib.util.find_spec("lightning") is None
        and importlib.util.find_spec("pytorch_lightning") is None
    ):
        with pytest.raises(ImportError, match="pip install lightning"):
            gl.GradsanCallback  # noqa: B018
