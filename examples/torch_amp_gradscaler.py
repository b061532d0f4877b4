"""Mixed-precision training with a GradScaler (PyTorch, float16 autocast on the CPU).

The GradScaler multiplies the loss by 2**16 before backward; the first steps overflow float16
*by design*, the scaler skips them and halves its scale until the gradients fit. gradsan
counts those skipped steps in a note and lets training run to the end:

    gradsan run examples/torch_amp_gradscaler.py            # exit 0, a note on skipped steps

With ``--nan-from K`` the loss takes the log of a negative number from step K on: a loss that
is NaN before the scaler multiplies it is no overflow a skip can fix, so gradsan stops at step
K with the origin of the NaN:

    gradsan run examples/torch_amp_gradscaler.py --nan-from 12   # exit 3

With ``--inf-grad-from K`` the loss stays finite but its gradient is infinite at every scale
(a square root at 0): every step is skipped, the scale collapses below 1 and gradsan stops with
the origin:

    gradsan run examples/torch_amp_gradscaler.py --inf-grad-from 12   # exit 3
"""

import argparse

import torch
from torch import nn


def main(steps: int = 30, nan_from: int | None = None, inf_grad_from: int | None = None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(steps):
        x = torch.randn(64, 16) * 4
        y = torch.randn(64, 1)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            pred = model(x).float()
            if nan_from is not None and step >= nan_from:
                pred = torch.log(pred - 100.0)  # the bug: log of a negative number
            if inf_grad_from is not None and step >= inf_grad_from:
                pred = pred + torch.sqrt(pred - pred.detach())  # the bug: sqrt at 0, inf slope
            loss = (pred - y).pow(2).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print(f"step {step} loss {loss.item():.3f} scale {scaler.get_scale():g}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--nan-from", type=int, default=None)
    ap.add_argument("--inf-grad-from", type=int, default=None)
    a = ap.parse_args()
    main(a.steps, a.nan_from, a.inf_grad_from)
