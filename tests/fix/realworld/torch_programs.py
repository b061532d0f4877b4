"""Real-world PyTorch NaN-gradient programs, each rebuilt from a public report (see
jax_programs.py for the format; ``PROGRAMS[name]()`` returns ``(step, args)``, the step returns
a scalar loss)."""

import torch


# https://github.com/pytorch/pytorch/pull/2775: .pow(2).sum().sqrt() at 0 stays NaN
def manual_norm(x):
    return x.pow(2).sum().sqrt()


# https://github.com/pytorch/pytorch/issues/156212 (where does not protect the other branch)
def guarded_exp(x):
    return torch.where(x <= 10.0, torch.exp(x), torch.ones_like(x)).sum()


# a masked log with a constant mask (the where trap)
def masked_log(x):
    mask = torch.tensor([False, True])
    return torch.where(mask, torch.log(x), torch.zeros_like(x)).sum()


# https://github.com/pytorch/pytorch/issues/4320 (std of constant data)
def std_normalize(a):
    return ((a - a.mean(dim=0)) / (torch.std(a, dim=0) + 1e-5)).sum()


# the angle between a vector and itself
def self_angle(u):
    c = (u * u).sum() / (u * u).sum()
    return torch.acos(c) * 0.0 + u.sum()


# sqrt of a squared error at its minimum
def rmse_at_fit(w):
    y = torch.tensor([1.0, 2.0])
    return torch.sqrt(((w - y) ** 2).mean())


# a fractional power of a ReLU output that is 0
def relu_power(x):
    return (torch.relu(x) ** 0.5 * 0.0).sum() + x.sum()


# https://github.com/pytorch/pytorch/issues/152088 (log1p, then a boolean index drops the -1;
# here the mask is a constant, so the dropped element's true gradient is 0)
def masked_select_log1p(a):
    keep = torch.tensor([False, True, True])
    return torch.log1p(a)[keep].sum()


# https://github.com/huggingface/trl/issues/7221 (entropy of a softmax whose tail underflowed to
# 0, the 0 * log 0 term guarded by a where after the log)
def guarded_entropy(z):
    p = torch.softmax(z, dim=-1)
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum()


# F.normalize written out (x / clamp_min(||x||, eps)) on a zero row: the clamp's 0 meets
# sqrt's infinite slope (https://github.com/google-deepmind/optax/pull/1743 in PyTorch)
def manual_normalize(x):
    n = x.pow(2).sum(-1, keepdim=True).sqrt().clamp_min(1e-6)
    return (x / n).sum()


# https://github.com/jax-ml/jax/issues/17070 in PyTorch (masked entropy in bits, log2)
def masked_entropy_bits(z):
    mask = torch.tensor([True, True, False])
    p = torch.softmax(torch.where(mask, z, -torch.inf), dim=-1)
    return torch.where(mask, -p * torch.log2(p), torch.zeros_like(p)).sum()


PROGRAMS = {
    "manual_norm": lambda: (manual_norm, (torch.zeros(3, requires_grad=True),)),
    "guarded_exp": lambda: (guarded_exp, (torch.tensor([1.0, 1e10], requires_grad=True),)),
    "masked_log": lambda: (masked_log, (torch.tensor([0.0, 2.0], requires_grad=True),)),
    "std_normalize": lambda: (std_normalize, (torch.ones(4, 2, requires_grad=True),)),
    "self_angle": lambda: (self_angle, (torch.tensor([0.6, 0.8], requires_grad=True),)),
    "rmse_at_fit": lambda: (rmse_at_fit, (torch.tensor([1.0, 2.0], requires_grad=True),)),
    "relu_power": lambda: (relu_power, (torch.tensor([-1.0, 0.0, 4.0], requires_grad=True),)),
    "masked_select_log1p": lambda: (
        masked_select_log1p,
        (torch.tensor([-1.0, 0.5, 1.0], requires_grad=True),),
    ),
    "guarded_entropy": lambda: (
        guarded_entropy,
        (torch.tensor([0.0, -1000.0], requires_grad=True),),
    ),
    "manual_normalize": lambda: (
        manual_normalize,
        (torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True),),
    ),
    "masked_entropy_bits": lambda: (
        masked_entropy_bits,
        (torch.zeros(3, requires_grad=True),),
    ),
}
TRUTH = {
    "manual_norm": "ball",
    "guarded_exp": [[2.718281828, 0.0]],
    "masked_log": [[0.0, 0.5]],
    # the columns' deviations sum to 0 for every a, so the loss is 0 everywhere: gradient 0
    "std_normalize": [[[0.0, 0.0]] * 4],
    "self_angle": [[1.0, 1.0]],
    "rmse_at_fit": "ball",
    "relu_power": [[1.0, 1.0, 1.0]],
    "masked_select_log1p": [[0.0, 2.0 / 3.0, 0.5]],
    # p = [1, 0] for every z near the point (exp(-1000) underflows): the entropy is 0 there
    "guarded_entropy": [[0.0, 0.0]],
    # a zero row is x / eps nearby (1 / eps per element); the row [3, 4] has norm 5:
    # d/dx sum(x / |x|) = (1 - x (x1 + x2) / |x|^2) / |x| per component
    "manual_normalize": [[[1e6, 1e6], [0.032, -0.024]]],
    "masked_entropy_bits": [[0.0, 0.0, 0.0]],
}
COMPUTED: dict = {}
