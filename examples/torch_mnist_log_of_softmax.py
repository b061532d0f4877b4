"""pytorch/examples mnist/main.py, shrunk (Net, Adadelta, StepLR, a DataLoader), with the two
things that make its NaN in the threads: the forward ends in log(softmax(x)) instead of
log_softmax, and one batch holds an image whose pixels a broken preprocessing step scaled by
1e4, so the softmax underflows to 0 and log(0) = -inf
(https://github.com/pytorch/pytorch/issues/1620 asks for log_softmax for this reason).

    gradsan run examples/torch_mnist_log_of_softmax.py     # exit 3: stops at step 3
"""

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.fc1 = nn.Linear(4 * 3 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        return torch.log(F.softmax(self.fc1(x), dim=1))  # the log of a softmax


def dataset(n: int = 6, bad: int = 3) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(n * 4, 1, 8, 8, generator=g)
    ys = torch.randint(0, 10, (n * 4,), generator=g)
    xs[bad * 4] *= 1e4  # the broken image
    return torch.utils.data.TensorDataset(xs, ys)


def main() -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=4, shuffle=False)
    model.train()
    for step, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
