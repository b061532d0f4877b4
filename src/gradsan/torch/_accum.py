"""Gradient accumulation: which micro-batch of an optimizer step brought the NaN/Inf.

With accumulation, ``.grad`` sums several backward calls before one ``optimizer.step()``; the
report names the micro-batch whose backward made the gradients non-finite:

- guard: its replay of the step counts the step's backward calls and checks the gradients after
  each one (the replay is the slow path; the guarded step itself pays nothing);
- ``gradsan run`` checks after every backward already: it counts the backward calls since the
  last ``optimizer.step()`` / ``zero_grad()``, and how many the previous optimizer step had.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from ._mode import all_finite


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def micro_batch_note(k: int, total: int | None) -> str | None:
    """``k``: the 1-based backward call of the step whose gradients were first non-finite;
    ``total``: how many backward calls the step has (None: not known yet)."""
    if k <= 1 and (total is None or total <= 1):
        return None
    of = f" of {total}" if total else ""
    earlier = (
        f"; the gradients accumulated from micro-batch{'es' if k > 2 else ''} "
        f"{'1' if k == 2 else f'1-{k - 1}'} were finite"
        if k > 1
        else ""
    )
    return (
        f"gradient accumulation: the NaN/Inf came in with micro-batch {k}{of} of the optimizer "
        f"step (its {_ordinal(k)} backward call){earlier}"
    )


class _Counter:
    def __init__(self, watched: list[torch.Tensor]) -> None:
        self.watched = watched
        self.calls = 0
        self.first_bad: int | None = None
        self.depth = 0

    def after(self) -> None:
        self.calls += 1
        if self.first_bad is None:
            for p in self.watched:
                g = p.grad
                if g is not None and g.is_floating_point() and not all_finite(g):
                    self.first_bad = self.calls
                    break

    def note(self) -> str | None:
        if self.first_bad is None or self.calls <= 1:
            return None
        return micro_batch_note(self.first_bad, self.calls)


@contextlib.contextmanager
def counting(watched: list[torch.Tensor]) -> Iterator[_Counter]:
    """guard's replay: count the step's backward calls; after each, check ``watched``."""
    counter = _Counter(watched)
    orig = torch.Tensor.backward

    @functools.wraps(orig)  # the tracer's TorchFunctionMode recognizes it by name
    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        # a TorchFunctionMode calls Tensor.backward (this function) again from inside
        counter.depth += 1
        try:
            out = orig(self, *args, **kwargs)
        finally:
            counter.depth -= 1
        if counter.depth == 0:
            counter.after()
        return out

    torch.Tensor.backward = backward  # type: ignore[method-assign]
    try:
        yield counter
    finally:
        torch.Tensor.backward = orig  # type: ignore[method-assign]


class RunAccum:
    """`gradsan run`: backward calls since the optimizer step began (``zero_grad``, ``step``),
    and the previous step's count."""

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks
        self.start = 0  # hooks.torch_calls at the last boundary
        self.previous: int | None = None  # backward calls of the last complete step
        self.func_call = 0  # the last check of a torch.func result (nothing accumulates there)

    def not_accumulated(self) -> None:
        """The check that just counted was of gradients torch.func returned, not of ``.grad``."""
        self.func_call = self.start = self.hooks.torch_calls

    def boundary(self) -> None:
        n = self.hooks.torch_calls - self.start
        if n > 0:
            self.previous = n
        self.start = self.hooks.torch_calls

    def install(self) -> RunAccum:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        hooks = self.hooks
        handle = register_optimizer_step_post_hook(lambda *a: self.boundary())
        hooks.undo.append(handle.remove)
        for cls in (torch.optim.Optimizer, torch.nn.Module):
            orig = cls.zero_grad

            def zero_grad(obj: Any, *args: Any, _orig: Any = orig, **kwargs: Any) -> Any:
                self.boundary()
                return _orig(obj, *args, **kwargs)

            functools.update_wrapper(zero_grad, orig)
            hooks.set(cls, "zero_grad", zero_grad)
        hooks.annotate_failures(self.annotate)
        return self

    def annotate(self, f: Any) -> None:
        if f.backend != "torch" or f.report is None or f.call == self.func_call:
            return
        if getattr(f, "spawned", False):  # a spawned worker's call count, not this process's
            return
        note = micro_batch_note(f.call - self.start, self.previous)
        if note is not None:
            f.report.notes.append(note)
