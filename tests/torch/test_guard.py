import copy

import pytest
import torch

import gradsan
import gradsan.torch as gst
from tests.conftest import line_of


def make(seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(dropout), torch.nn.Linear(16, 1)
    )


def test_finite_steps_are_bit_identical():
    plain = make(dropout=0.1)
    guarded_model = copy.deepcopy(plain)
    opt_a = torch.optim.Adam(plain.parameters(), lr=1e-2)
    opt_b = torch.optim.Adam(guarded_model.parameters(), lr=1e-2)

    def step_a(x, y):
        opt_a.zero_grad()
        loss = (plain(x) - y).pow(2).mean()
        loss.backward()
        opt_a.step()
        return loss

    def step_b(x, y):
        opt_b.zero_grad()
        loss = (guarded_model(x) - y).pow(2).mean()
        loss.backward()
        opt_b.step()
        return loss

    g = gst.guard(step_b)
    torch.manual_seed(1)
    data = [(torch.randn(8, 6), torch.randn(8, 1)) for _ in range(3)]
    torch.manual_seed(2)
    la = [step_a(x, y) for x, y in data]
    torch.manual_seed(2)
    lb = [g(x, y) for x, y in data]
    assert all(torch.equal(a, b) for a, b in zip(la, lb))
    for p, q in zip(plain.parameters(), guarded_model.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(p.grad, q.grad)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        h = self.enc(x)
        d = torch.sqrt(((h - h.detach()) ** 2).sum(-1))  # distance
        return self.head(h).mean() + d.mean()


def test_failure_replays_and_raises_before_the_update():
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(x):
        opt.zero_grad()
        loss = model(x)
        loss.backward()
        opt.step()
        return loss

    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(train_step)(torch.randn(3, 4))
    report = ei.value.report
    f = report.findings[0]
    assert f.catalog_id == "sqrt-at-zero"
    assert f.where.line == line_of("distance") and f.where.function == "forward"
    assert "model.enc.weight" in {o.path for o in f.outputs}
    assert f.scope == "model"
    # the optimizer never applied the NaN
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert "test_guard.py" in str(ei.value)


def test_replay_restores_the_rng_state():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)

    def step(x):
        h = torch.nn.functional.dropout(lin(x), 0.5)
        mask = (h == 0).float()
        loss = torch.sqrt(mask * 0.0 + h * 0.0).sum()  # rng
        loss.backward()
        return loss

    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)(torch.randn(2, 4))
    assert ei.value.report.findings[0].where.line == line_of("rng")


def test_returned_nonfinite_loss_without_grads():
    def step(x):
        return torch.log(x).sum()  # loss-only

    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)(torch.tensor([0.0, 1.0]))
    f = ei.value.report.findings[0]
    assert f.phase == "value" and f.catalog_id == "log-at-zero"
    assert f.where.line == line_of("loss-only")


def test_context_manager():
    torch.manual_seed(0)
    model = Model()
    with gst.guard(model.head):
        model.head(torch.randn(2, 4)).sum().backward()
    with pytest.raises(gradsan.NonFiniteError, match="with-block"):
        with gst.guard(model):
            model(torch.randn(2, 4)).backward()


@pytest.mark.slow
def test_compiled_model_is_replayed_eagerly():
    torch.manual_seed(0)
    model = Model()
    try:
        cmodel = torch.compile(model)
        cmodel(torch.randn(2, 4))
    except Exception as e:  # pragma: no cover - depends on the toolchain
        pytest.skip(f"torch.compile is unusable here: {e}")

    def step(x):
        loss = cmodel(x)
        loss.backward()
        return loss

    with pytest.raises(gradsan.NonFiniteError) as ei:
        gst.guard(step)(torch.randn(3, 4))
    f = ei.value.report.findings[0]
    assert f.catalog_id == "sqrt-at-zero"
    assert f.where.line == line_of("distance")
    assert "cmodel.enc.weight" in {o.path for o in f.outputs}


@pytest.mark.parametrize(
    "bad",
    [None, ("small", 20, float("nan")), ("large", -1, float("inf")), ("half", -1, -float("inf"))],
)
def test_the_fused_check_finds_any_nonfinite_element(bad):
    """guard's one-sum check on CPU (the small gradients flattened together per dtype, large
    ones and sparse ones summed on their own) says non-finite exactly when an element is."""
    from gradsan.torch._guard import finite

    torch.manual_seed(0)
    many = 40
    gs = {
        "small": [torch.randn(4, 4) for _ in range(many)] + [torch.randn(3)],
        "large": [torch.randn(300, 300)],
        "half": [torch.randn(8).half() * 1000 for _ in range(3)],  # sums past float16's range
        "f64": [torch.randn(2, 2, dtype=torch.float64)],
        "sparse": [torch.randn(4, 4).to_sparse()],
    }
    if bad is not None:
        gs[bad[0]][bad[1]].view(-1)[1] = bad[2]
    flat = [g for v in gs.values() for g in v]
    assert finite(flat) is (bad is None)
    assert finite(flat[-6:]) is (bad is None or bad[0] == "small")  # few
    big = [torch.full((4,), 3e38) for _ in range(many + 1)]  # the sum overflows, values finite
    assert finite(big)
    large = [torch.full((5000,), 3e38), torch.full((5000,), -3e38)]  # summed one by one
    assert finite(large)


@pytest.mark.parametrize("at", [0, 5, 13])
def test_the_fused_check_flattens_in_chunks_and_reads_every_one(monkeypatch, at):
    """Where the fused kernel is not there (or refuses a tensor), small CPU gradients are
    flattened at most _STACK elements at a time: a NaN in the first, a middle or the last
    chunk is found; complex and mixed dtypes are read too."""
    from gradsan.torch import _guard

    monkeypatch.setattr(_guard, "_STACK", 40)
    monkeypatch.setattr(_guard, "_fused_check", None)  # the path where the kernel refuses
    gs = [torch.randn(3, 5) for _ in range(14)]  # 15 elements: chunks of 2
    mixed = [torch.randn(3, dtype=torch.complex64), torch.randn(2, dtype=torch.float64)]
    assert _guard.finite(gs + mixed)
    gs[at][1, 2] = float("nan")
    assert not _guard.finite(gs + mixed)
    gs[at][1, 2] = 0.0
    mixed[0][1] = complex(0, float("inf"))
    assert not _guard.finite(gs + mixed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_fused_check_leaves_every_gradient_bit_for_bit(dtype):
    """The small CPU gradients go through GradScaler's check-and-unscale kernel with a scale
    of 1: it finds a NaN, +inf or -inf in any of them, and the gradients keep every bit (NaN
    payloads, -0.0, subnormals also under flush-denormal), their version counter and their
    autograd history (a create_graph gradient stays differentiable)."""
    from gradsan.torch import _guard

    tiny = torch.finfo(dtype).tiny / 4  # a subnormal
    leaf = torch.ones(3, dtype=dtype, requires_grad=True)
    n = _guard._FUSE_MIN  # enough small gradients for the fused kernel
    gs = [torch.tensor([1.5, -0.0, tiny, 2.0], dtype=dtype) for _ in range(n)]
    gs.append(leaf * 2)  # a gradient with history (create_graph=True)
    bits = [g.detach().view(torch.uint8).clone() for g in gs]
    versions = [g._version for g in gs]
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        try:
            assert _guard.finite(gs)
        finally:
            torch.set_flush_denormal(False)
    assert all(torch.equal(g.detach().view(torch.uint8), b) for g, b in zip(gs, bits))
    assert [g._version for g in gs] == versions
    gs[-1].sum().backward()
    assert torch.equal(leaf.grad, torch.full((3,), 2.0, dtype=dtype))
    for bad in (float("nan"), float("inf"), -float("inf")):
        for i in (0, n // 2, n - 1):
            gs[i].view(-1)[2] = bad
            assert not _guard.finite(gs)
            gs[i].view(-1)[2] = tiny
    payload = torch.tensor([0x7FC00123], dtype=torch.int32).view(torch.float32)
    pair = [payload.clone()] + [torch.zeros(2) for _ in range(n)]
    assert not _guard.finite(pair)
    assert pair[0].view(torch.int32).item() == 0x7FC00123  # the NaN's payload kept


def test_the_fused_check_runs_from_a_dozen_small_gradients(monkeypatch):
    """Fewer than _FUSE_MIN small gradients are summed one by one (cheaper, measured); from
    _FUSE_MIN on the fused kernel takes them in one call."""
    from gradsan.torch import _guard

    calls = []
    real = _guard._cpu_fused
    monkeypatch.setattr(_guard, "_cpu_fused", lambda gs: calls.append(len(gs)) or real(gs))
    few = [torch.randn(8) for _ in range(_guard._FUSE_MIN - 1)]
    assert _guard.finite(few) and calls == []
    few[3][0] = float("nan")
    assert not _guard.finite(few) and calls == []
    many = [torch.randn(8) for _ in range(_guard._FUSE_MIN)] + [torch.randn(5000)]
    assert _guard.finite(many) and calls == [_guard._FUSE_MIN]
    many[-1][7] = float("inf")  # the large one, summed
    assert not _guard.finite(many)


def test_the_fused_check_hands_what_the_kernel_refuses_to_the_sums():
    """A stride-0 expanded gradient and a complex one are refused by the kernel: they are
    summed instead, and a NaN in either is still found."""
    from gradsan.torch import _guard

    pad = [torch.randn(4) for _ in range(_guard._FUSE_MIN)]  # enough for the kernel
    gs = pad + [torch.randn(1).expand(6), torch.randn(3, dtype=torch.complex64)]
    assert _guard.finite(gs)
    gs[-2] = torch.tensor([float("nan")]).expand(6)
    assert not _guard.finite(gs)
    gs[-2] = torch.randn(1).expand(6)
    gs[-1][0] = complex(float("nan"), 0)
    assert not _guard.finite(gs)
    assert _guard._cpu_fused(pad + [torch.randn(1).expand(6)]) is None  # refused


def test_each_step_puts_every_patch_back_and_keeps_the_hook_order():
    """guard patches on every call (its optimizer pre-hook, torch.func's entry points,
    torch.autograd.grad, GradScaler's methods, the iterator the step reaches) and puts each
    back after it. Its pre-hook is added last: a global pre-hook the user registered before
    the call runs before guard's check (here it zeroes the NaN: the step passes), one
    registered inside the step runs after it (guard stops the update first)."""
    from torch._functorch import apis, eager_transforms
    from torch.optim import optimizer as optim_mod

    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter([torch.randn(4, 6) for _ in range(6)])
    poison = {"on": False}

    def step():
        opt.zero_grad()
        loss = model(next(batches)).pow(2).mean()
        loss.backward()
        if poison["on"]:
            model[0].weight.grad[0, 0] = float("nan")
        opt.step()
        return loss

    before = {
        "hooks": dict(optim_mod._global_optimizer_pre_hooks),
        "grad": torch.autograd.grad,
        "impl": eager_transforms.grad_and_value_impl,
        "vjp": eager_transforms._vjp_with_argnums,
        "vmap": apis.vmap_impl,
        "scale": torch.amp.GradScaler.scale,
        "update": torch.amp.GradScaler.update,
    }
    g = gst.guard(step)
    order = []

    def clean(o, a, k):
        order.append("user")
        model[0].weight.grad.nan_to_num_(0.0)

    sanitize = optim_mod.register_optimizer_step_pre_hook(clean)
    try:
        for _ in range(2):
            poison["on"] = True
            g()  # the user's hook, registered first, cleaned the gradient
            assert torch.isfinite(model[0].weight).all()
            assert type(batches).__name__ == "list_iterator"  # the tap was taken out
            after = {
                "hooks": dict(optim_mod._global_optimizer_pre_hooks),
                "grad": torch.autograd.grad,
                "impl": eager_transforms.grad_and_value_impl,
                "vjp": eager_transforms._vjp_with_argnums,
                "vmap": apis.vmap_impl,
                "scale": torch.amp.GradScaler.scale,
                "update": torch.amp.GradScaler.update,
            }
            assert after["hooks"].keys() == before["hooks"].keys() | {sanitize.id}
            assert all(after[k] is before[k] for k in before if k != "hooks")
        assert order == ["user", "user"]
    finally:
        sanitize.remove()

    late = []
    from torch.optim import optimizer as optim_mod

    def step_with_late_hook():
        h = optim_mod.register_optimizer_step_pre_hook(lambda o, a, k: late.append(1))
        try:
            return step()
        finally:
            h.remove()

    w = model[0].weight.detach().clone()
    with pytest.raises(gradsan.NonFiniteError):
        gst.guard(step_with_late_hook)()
    assert late == [] and torch.equal(model[0].weight, w)  # guard's check stopped it first
    assert dict(optim_mod._global_optimizer_pre_hooks).keys() == before["hooks"].keys()


def test_a_guard_called_inside_its_own_step_checks_both():
    """A step that calls the same guard again (nested): each call is checked, the inner
    one's NaN raises with its origin, and the outer call is clean afterwards."""
    model = make()
    x = torch.randn(4, 6)
    depth = {"n": 0, "bad": False}

    def step():
        depth["n"] += 1
        try:
            model.zero_grad()
            h = model(x)
            if depth["bad"] and depth["n"] == 2:
                h = h * torch.log(-torch.ones(()))  # NaN at the inner call
            loss = h.pow(2).mean()
            loss.backward()
            if depth["n"] == 1:
                g()  # the same guard, inside its own step
            return loss
        finally:
            depth["n"] -= 1

    grad = torch.autograd.grad
    g = gst.guard(step)
    g()
    assert torch.autograd.grad is grad  # each call put its patch back
    depth["bad"] = True
    with pytest.raises(gradsan.NonFiniteError) as e:
        g()
    assert any(f.primitive == "log" for f in e.value.report.findings), e.value.report
    depth["bad"] = False
    g()
    assert torch.autograd.grad is grad
