"""``GradGuard``: gradsan's check for a plain PyTorch training loop.

::

    guard = GradGuard(model, optimizer)        # checks in the optimizer's step pre-hook
    for batch in data:
        loss = loss_fn(model(batch)); loss.backward()
        guard.check(replay=lambda: loss_fn(model(batch)))   # optional explicit check
        optimizer.step()

One fused check (``torch._foreach_norm``) of every parameter's ``.grad`` per step. On NaN/Inf:
``mode="raise"`` raises :class:`gradsan.NonFiniteError`; ``mode="skip"`` drops the gradients
(``p.grad = None``, so ``optimizer.step()`` leaves the parameters alone), counts the step in
``guard.skipped`` and prints the report. The report explains the origin when ``check`` gets a
``replay`` (a function that recomputes the loss or runs forward and backward); the forward is
gone after backward, so without one it lists the non-finite gradients.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal

import torch

from .._errors import NonFiniteError
from .._report import Report
from ..torch._explain import Namer, output_hit
from ..torch._guard import failure_report, finite
from ..torch._mode import all_finite


class GradGuard:
    """Guard a model's gradients in a plain loop (and optionally an optimizer's step)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        mode: Literal["raise", "skip"] = "raise",
        on_report: Callable[[Report, int], None] | None = None,
    ) -> None:
        if mode not in ("raise", "skip"):
            raise ValueError(f"GradGuard: mode must be 'raise' or 'skip', not {mode!r}")
        self.model = model
        self.mode = mode
        self.on_report = on_report
        self.steps = 0
        self.skipped = 0
        self.reports: list[Report] = []
        self._handle = None
        self._checked = False
        if optimizer is not None:
            self._handle = optimizer.register_step_pre_hook(self._pre_step)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _params(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if self._checked:  # check() already ran for this step
            self._checked = False
            return
        self.check()
        self._checked = False

    def check(self, replay: Callable[[], Any] | None = None) -> bool:
        """True when every gradient is finite; else raise or skip (see the class docstring)."""
        __tracebackhide__ = True
        self.steps += 1
        self._checked = True
        params = self._params()
        grads = [p.grad for p in params if p.grad is not None and p.grad.is_floating_point()]
        if finite(grads):
            return True
        report = self._explain(replay) if replay is not None else None
        if report is None or report.ok:
            namer = Namer()
            namer.add_modules([(self.model, "model")])
            hits = [
                output_hit(namer.name(p), p.grad)
                for p in params
                if p.grad is not None and not all_finite(p.grad)
            ]
            report = failure_report(
                "the training step",
                hits,
                ["pass check(replay=lambda: loss_fn(model(batch))) to see where it was born"],
            )
        self.reports.append(report)
        step = self.steps - 1
        if self.mode == "raise":
            raise NonFiniteError(report)
        self.skipped += 1
        for p in params:
            p.grad = None
        if self.on_report is not None:
            self.on_report(report, step)
        else:
            print(
                f"gradsan: skipped step {step}: non-finite gradients.\n{report}",
                file=sys.stderr,
                flush=True,
            )
        return False

    def _explain(self, replay: Callable[[], Any]) -> Report:
        import gradsan.torch as gst

        saved = {id(p): p.grad for p in self._params()}
        for p in self._params():
            p.grad = None
        try:
            return gst.explain(replay, module=self.model)()
        finally:
            for p in self._params():
                p.grad = saved[id(p)]
