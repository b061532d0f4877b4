"""Every touch of PyTorch internals or version-dependent behaviour, in one place.

Private modules and functions (dispatch modes, the autograd node being run, the fused norm,
dynamo's switches) are reached only through this module, so a PyTorch upgrade that moves one
of them is a change here alone.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode  # private: no public alias

__all__ = [
    "TorchDispatchMode",
    "TorchFunctionMode",
    "compiling",
    "current_autograd_node",
    "disable_torch_function",
    "dynamo_loaded",
    "flatten_dense",
    "force_eager",
    "foreach_norm",
    "functorch_entry_points",
    "in_functorch",
    "optimizer_hook_slot",
    "recompute_in_backward",
    "without_function_mode",
]

# The autograd Node whose backward is running now (None in the forward pass).
current_autograd_node = torch._C._current_autograd_node

# One fused kernel for the norms of many tensors (what clip_grad_norm_ uses).
foreach_norm = torch._foreach_norm

# One flat copy of many dense tensors (what DDP's buckets use): one dispatch for all of them.
flatten_dense = torch._C._nn.flatten_dense_tensors

# Runs a block with the torch-function layer off (no mode sees the calls inside).
disable_torch_function = torch._C.DisableTorchFunction


def dynamo_loaded() -> bool:
    """Whether ``torch._dynamo`` was imported (nothing can have been compiled otherwise)."""
    return "torch._dynamo" in sys.modules


def compiling() -> bool:
    """Whether torch.compile is tracing now (AOTAutograd builds its joint graph through
    ``torch.autograd.grad`` on fake tensors: nothing to check there)."""
    return dynamo_loaded() and bool(torch.compiler.is_compiling())


def in_functorch() -> bool:
    """Whether a torch.func transform (grad, vmap, ...) is running now: its tensors are
    wrapped (a batched tensor has no values to read)."""
    return torch._C._functorch.maybe_current_level() is not None


@contextlib.contextmanager
def force_eager() -> Iterator[None]:
    """Run ``torch.compile``'d code eagerly, so every operation is seen."""
    if not dynamo_loaded():  # nothing was compiled: don't pay dynamo's import
        yield
        return
    set_stance: Any = getattr(torch.compiler, "set_stance", None)
    if set_stance is None:  # pragma: no cover - older torch
        with torch._dynamo.config.patch(disable=True):
            yield
        return
    with set_stance("force_eager"):
        yield


def optimizer_hook_slot() -> tuple[dict, int] | None:
    """torch's dict of global optimizer step pre-hooks and a key reserved in it (from torch's
    hook counter, as ``register_optimizer_step_pre_hook`` takes one): guard adds and removes
    its hook there on every step without making a handle. None where torch moved it."""
    from torch.optim import optimizer
    from torch.utils.hooks import RemovableHandle

    hooks = getattr(optimizer, "_global_optimizer_pre_hooks", None)
    if not isinstance(hooks, dict):  # pragma: no cover - another torch
        return None
    return hooks, RemovableHandle(hooks).id


@functools.cache
def functorch_entry_points() -> dict[str, tuple[Any, str]]:
    """The functions torch.func's transforms look up when they are called, as (module,
    attribute): ``grad``/``grad_and_value`` reach ``grad_and_value_impl``, ``vjp`` and
    ``jacrev`` reach ``_vjp_with_argnums``, ``vmap`` (also inside jacrev) reaches
    ``vmap_impl`` through ``torch._functorch.apis``."""
    from torch._functorch import apis, eager_transforms

    return {
        "grad": (eager_transforms, "grad_and_value_impl"),
        "vjp": (eager_transforms, "_vjp_with_argnums"),
        "vmap": (apis, "vmap_impl"),
    }


@contextlib.contextmanager
def without_function_mode(mode: Any) -> Iterator[None]:
    """Run a block with ``mode`` (a TorchFunctionMode on the stack) switched off."""
    if torch.overrides._get_current_function_mode() is mode:
        with torch.overrides._pop_mode_temporarily():
            yield
        return
    with torch._C.DisableTorchFunction():
        yield


@contextlib.contextmanager
def recompute_in_backward(mode: Any, around: Any) -> Iterator[None]:
    """While the block runs, the forward that reentrant ``torch.utils.checkpoint`` recomputes
    inside the backward runs under the TorchFunctionMode ``mode`` (a backward called from a
    mode's handler runs with the mode off, so the recomputed operations would not be seen).
    ``around()``: a context manager entered around each such backward."""
    from torch.utils import checkpoint

    cls = checkpoint.CheckpointFunction
    orig = cls.__dict__["backward"]
    backward = orig.__func__ if isinstance(orig, staticmethod) else orig

    def with_mode(ctx: Any, *args: Any) -> Any:
        with around():
            if torch.overrides._get_current_function_mode() is mode:
                return backward(ctx, *args)
            torch._C._push_on_torch_function_stack(mode)
            try:
                return backward(ctx, *args)
            finally:
                torch._C._pop_torch_function_stack()

    cls.backward = staticmethod(with_mode)  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.backward = orig  # type: ignore[method-assign]
