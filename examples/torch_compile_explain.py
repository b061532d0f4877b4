"""explain around a torch.compile'd model: the NaN is located at the user's own line.

    python examples/torch_compile_explain.py

The model is compiled (and run compiled once); inside ``gradsan.torch.explain()`` it runs as
its eager twin, so the tracer sees every operation and names the line in ``forward``.
"""

import torch

import gradsan.torch as gst


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        d = torch.sqrt(((h - h.detach()) ** 2).sum(-1))  # the sqrt: its gradient at 0 is NaN
        return self.head(h).mean() + d.mean()


def main():
    torch.manual_seed(0)
    model = torch.compile(Model())
    model(torch.randn(2, 4))  # compiled, outside gradsan
    with gst.explain() as report:
        loss = model(torch.randn(3, 4))
        loss.backward()
    print(report)
    return report


if __name__ == "__main__":
    main()
