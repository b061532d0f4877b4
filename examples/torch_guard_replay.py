"""guard on a training loop that pulls its batches from a DataLoader: one bad batch.

    python examples/torch_guard_replay.py

guard stops the bad step before its update and explains it by replaying the step, with the
batch the step took (never a new one from the loader), no optimizer or scheduler step, and the
model's parameters, BatchNorm statistics and RNG state put back as the step left them. The loop
skips that batch and trains to the end: every batch was seen once, and the parameters after the
failing step are the ones before it.
"""

import torch

import gradsan
import gradsan.torch as gst


class Batches(torch.utils.data.Dataset):
    """The batches, counting how often the loader asks for one."""

    def __init__(self) -> None:
        self.items = data()
        self.asked: list[int] = []

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.asked.append(i)
        return self.items[i]


def data(n: int = 12, bad: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
        if i == bad:
            x[:, 0] = 0.0  # a dead feature: every weighted error is 0, sqrt(0) below
        out.append((x, y))
    return out


def main() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    dataset = Batches()
    loader = torch.utils.data.DataLoader(dataset, batch_size=None)
    it = iter(loader)

    def step():
        x, y = next(it)
        opt.zero_grad()
        weighted = (model(x) - y) * x[:, :1]  # errors weighted by the first feature
        loss = torch.sqrt(weighted.pow(2).mean())  # the sqrt
        loss.backward()
        opt.step()
        sched.step()
        return loss

    guarded = gst.guard(step)
    failed, unchanged = [], True
    for i in range(len(loader)):
        before = [p.detach().clone() for p in model.parameters()]
        try:
            guarded()
        except gradsan.NonFiniteError as e:
            print(e.report)
            failed.append(i)
            unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
            print(f"step {i}: stopped before its update (parameters unchanged: {unchanged})")
    print(f"the loader gave {len(dataset.asked)} batches of {len(loader)}; stopped at {failed}")
    return {
        "asked": dataset.asked,
        "failed": failed,
        "unchanged": unchanged,
        "lr": sched.get_last_lr(),
    }


if __name__ == "__main__":
    main()
