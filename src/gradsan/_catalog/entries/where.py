"""The where trap: a branch that `where` does not select still poisons the gradient.

Not bound to an op's singular set: the builder picks it when the zero that met an inf (or a
NaN) was made by a where/select that did not select that branch (``Poison.zero_kind`` WHERE).
README.md (one level up) says what each field holds.
"""

from __future__ import annotations

from .._types import Fix, Singularity

WHERE_TRAP = Singularity(
    id="where-trap",
    op="where",
    kind="singular",
    title="the where trap: an unselected branch's inf still makes the gradient NaN",
    singular_set=(
        "where(c, f(x), y) with f(x) or its derivative non-finite at an element where c is "
        "False (log(0), sqrt of a negative, 1 / 0, arctan2(0, 0), log1p(-1) in padding)"
    ),
    derivative=(
        "d/dx where(c, f(x), y) = where(c, 1, 0) * f'(x): the unselected branch gets a zero "
        "cotangent, and 0 * inf (or 0 * nan) = NaN"
    ),
    conventions={
        "jax": "jnp.where's transpose sends 0 to the unselected branch; 0 * f'(x) = NaN there",
        "torch": "WhereBackward0 sends 0 to the unselected branch; 0 * f'(x) = NaN there",
    },
    explanation=(
        "where selects values, not derivatives: the branch it does not select is still "
        "computed on every element, and the chain rule multiplies that branch's derivative by "
        "the zero cotangent where sends it. Where the branch is non-finite (its derivative is "
        "inf, or it is NaN) the product 0 * inf or 0 * nan is NaN, so the masked-out element "
        "poisons the gradient although the value is right. Keep the unselected branch finite: "
        "feed it a safe input where the condition is False (the double where)."
    ),
    fixes=(
        Fix(
            "Double where: give the masked op a safe input where the condition is False, so "
            "neither branch is non-finite:",
            "x_safe = jnp.where(mask, x, 1.0)\ny = jnp.where(mask, jnp.log(x_safe), 0.0)",
            "x_safe = torch.where(mask, x, torch.ones_like(x))\n"
            "y = torch.where(mask, torch.log(x_safe), torch.zeros_like(x))",
        ),
        Fix(
            "Or use gradsan's safe where, which applies the function only where it is selected:",
            "y = gradsan.jax.safe.where(mask, jnp.log, 0.0, x)",
            "y = gradsan.torch.safe.where(mask, torch.log, 0.0, x)",
        ),
    ),
    point={"x": 0.0, "mask": False},
)

ENTRIES: tuple[Singularity, ...] = (WHERE_TRAP,)
