"""Per-parameter gradients with torch.func: a distance whose gradient is NaN at zero distance.

    gradsan run examples/torch_func_grad.py           # stops at the NaN gradient (exit 3)
    gradsan run examples/torch_func_grad.py --clean   # the same loop, finite: runs to the end

``torch.func.grad`` returns the gradient to the script (no ``.backward()``, no ``.grad``):
`gradsan run` checks what it returns and locates the op that made the NaN.
"""

import sys

import torch
from torch.func import grad, jacrev, vmap


def distance(w, x, target):
    d = w * x - target
    return torch.sqrt(d.pow(2).sum())  # the bug: sqrt


def main(clean: bool) -> None:
    torch.manual_seed(0)
    w = torch.randn(8)
    xs = torch.randn(20, 8)
    for step in range(20):
        x = xs[step]
        # step 12's target is exactly where w * x already is: zero distance
        target = w * x if step == 12 and not clean else torch.zeros(8)
        g = grad(distance)(w, x, target)  # the grad call
        w = w - 0.01 * g
    per_sample = vmap(grad(distance), in_dims=(None, 0, None))(w, xs, torch.zeros(8))
    jac = jacrev(distance)(w, xs[0], torch.zeros(8))
    print(f"done: |w| = {w.norm():.4f}, per-sample {tuple(per_sample.shape)}, {jac.shape}")


if __name__ == "__main__":
    main("--clean" in sys.argv)
