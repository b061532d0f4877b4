"""``GradsanCallback``: gradsan's check for PyTorch Lightning (defined only when ``lightning``
or ``pytorch_lightning`` is importable; the class is created on first access).

In ``on_before_optimizer_step`` it runs one fused check of the module's gradients; on NaN/Inf
it replays the batch's ``training_step`` under ``gradsan.torch.explain`` and raises
:class:`gradsan.NonFiniteError` (``mode="raise"``) or drops the gradients and counts the step
(``mode="skip"``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["GradsanCallback"]  # noqa: F822 - created on first access (module __getattr__)


def _lightning() -> Any:
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("gradsan.integrations.lightning needs lightning: pip install lightning")


def _make() -> type:
    pl = _lightning()

    from .torch_hook import GradGuard

    Callback: Any = pl.Callback  # a module found at run time: its classes are not known here

    class GradsanCallback(Callback):
        def __init__(self, mode: str = "raise") -> None:
            self.mode = mode
            self.guard: GradGuard | None = None
            self._batch: Any = None

        def on_train_batch_start(
            self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
        ) -> None:
            self._batch = (batch, batch_idx)

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            if self.guard is None:
                self.guard = GradGuard(pl_module, mode=self.mode)  # type: ignore[arg-type]
            batch = self._batch

            def replay() -> Any:
                out = pl_module.training_step(*batch)
                return out["loss"] if isinstance(out, dict) else out

            self.guard.check(replay=replay if batch is not None else None)

    return GradsanCallback


_cache: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name == "GradsanCallback":
        if name not in _cache:
            _cache[name] = _make()
        return _cache[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
