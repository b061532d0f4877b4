"""Inputs that were already non-finite.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from .._types import Fix, Singularity

NONFINITE_INPUT = Singularity(
    id="nonfinite-input",
    op="input",
    kind="input",
    title="an input was already NaN or Inf",
    singular_set="an argument of the function holds NaN or +-inf",
    derivative="not applicable: the value was non-finite before any operation ran",
    conventions={
        "jax": "NaN and +-inf propagate through every operation (nan * 0. = nan); nothing is "
        "raised unless jax_debug_nans is on",
        "torch": "the same IEEE propagation; anomaly mode names the first backward function "
        "that returned NaN, not the input",
    },
    explanation=(
        "The NaN or Inf came in with the arguments: no operation of the function created it. "
        "Look at where the data or parameters were produced (a previous update step, a data "
        "loader, an uninitialized buffer)."
    ),
    fixes=(
        Fix(
            "Check the inputs before the step, or find the step that first produced them:",
            "assert all(jnp.isfinite(x).all() for x in jax.tree_util.tree_leaves(inputs))",
            "assert all(torch.isfinite(t).all() for t in tensors)",
        ),
    ),
)

ENTRIES: tuple[Singularity, ...] = (NONFINITE_INPUT,)
