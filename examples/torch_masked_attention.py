"""Masked self-attention on variable-length sequences (PyTorch).

Each batch holds 4 sequences of up to 12 tokens with random lengths; padding keys are masked
with -inf before the softmax. At step 5 the batch contains an empty sequence (length 0): every
key of its rows is masked, softmax over a row of -inf is 0 / 0 = NaN, and the NaN reaches every
parameter through the backward pass. Run it under gradsan:

    gradsan run examples/torch_masked_attention.py
"""

import math
import sys

import torch
from torch import nn

T, D = 12, 16


class SelfAttention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)

    def forward(self, x, key_mask):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(x.shape[-1])
        scores = scores.masked_fill(~key_mask[:, None, :], float("-inf"))  # mask padding keys
        attn = torch.softmax(scores, dim=-1)  # attention weights
        return attn @ self.v(x)


def main(steps: int = 10) -> None:
    torch.manual_seed(0)
    model = SelfAttention(D)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    lengths_rng = torch.Generator().manual_seed(18)  # the first empty sequence is at step 5
    for step in range(steps):
        print(f"step {step}", flush=True)
        x = torch.randn(4, T, D)
        lengths = torch.randint(0, T + 1, (4,), generator=lengths_rng)
        key_mask = torch.arange(T)[None, :] < lengths[:, None]
        out = model(x, key_mask)
        loss = ((out - x) ** 2 * key_mask[..., None]).sum() / key_mask.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"  loss {loss.item():.4f}", flush=True)
    print("done")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
