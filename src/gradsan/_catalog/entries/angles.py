"""Angles: atan2, the inverse trigonometric and hyperbolic functions, tan.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _masks as m
from .._classify import Hit, hit, predicate, real, rule
from .._types import Admissible, Fix, Singularity

ATAN2_AT_ORIGIN = Singularity(
    id="atan2-at-origin",
    op="atan2",
    kind="discontinuity",
    title="atan2 at the origin: the angle of the zero vector",
    singular_set="y == 0 and x == 0 in atan2(y, x)",
    derivative=(
        "d atan2(y, x) = (x dy - y dx) / (x**2 + y**2): 0 / 0 at the origin, where every angle "
        "in (-pi, pi] is a limit of atan2"
    ),
    conventions={
        "jax": "jnp.arctan2(0., 0.) = 0.; grad (nan, nan)",
        "torch": "torch.atan2(0., 0.) = 0.; Atan2Backward0 gives (0., -0.), a finite number "
        "that is no derivative of anything",
    },
    explanation=(
        "The angle of the zero vector is undefined: arbitrarily close to the origin atan2 takes "
        "every value in (-pi, pi], so it is not even continuous there and no gradient or "
        "subgradient exists. atan2(0, 0) = 0 is a convention. It is reached by the phase of a "
        "complex number that is 0, the heading of a zero velocity, or an angle between "
        "coincident points."
    ),
    fixes=(
        Fix(
            "Guard the origin with the double-where trick and choose the angle there:",
            "ok = (x != 0) | (y != 0)\n"
            "theta = jnp.where(ok, jnp.arctan2(jnp.where(ok, y, 0.0), jnp.where(ok, x, 1.0)), 0.0)",
            "ok = (x != 0) | (y != 0)\n"
            "theta = torch.where(ok, torch.atan2(torch.where(ok, y, 0.0), "
            "torch.where(ok, x, 1.0)), 0.0)",
        ),
        Fix(
            "Use gradsan's safe atan2 (the same guard, gradient 0 at the origin):",
            "theta = gradsan.jax.safe.atan2(y, x)",
            "theta = gradsan.torch.safe.atan2(y, x)",
            rewrite="safe",
        ),
    ),
    safe="atan2",
    point={"x": 0.0, "y": 0.0},
    inadmissible=("jax", "torch"),
    admissible=Admissible.none("none (discontinuous)"),
)

ACOS_AT_ONE = Singularity(
    id="acos-at-one",
    op="acos",
    kind="singular",
    title="acos at +-1: finite value, infinite slope",
    singular_set="x == 1 or x == -1 (|x| > 1 is outside the domain: NaN)",
    derivative="d/dx acos(x) = -1 / sqrt(1 - x**2), which is -inf at x = +-1 and NaN for |x| > 1",
    conventions={
        "jax": "grad(jnp.arccos)(1.) = -inf, also at -1.; jnp.arccos(2.) = nan with grad nan",
        "torch": "AcosBackward0 gives -inf at +-1; nan outside [-1, 1]",
    },
    explanation=(
        "acos is continuous on [-1, 1] with a vertical tangent at both ends. The angle between "
        "two vectors, acos(u . v / (|u| |v|)), reaches it whenever the vectors are parallel, and "
        "rounding can push the cosine one ulp past 1, which makes the value NaN too. acos(1 - "
        "x**2) is Lipschitz at x = 0 (it is about sqrt(2) |x|), yet AD gives 0 * inf = NaN."
    ),
    fixes=(
        Fix(
            "Clip the cosine strictly inside (-1, 1):",
            "theta = jnp.arccos(jnp.clip(x, -1.0 + 1e-6, 1.0 - 1e-6))",
            "theta = torch.acos(torch.clamp(x, -1.0 + 1e-6, 1.0 - 1e-6))",
        ),
        Fix(
            "Use gradsan's safe arccos (finite derivative at +-1):",
            "theta = gradsan.jax.safe.arccos(x)",
            "theta = gradsan.torch.safe.arccos(x)",
            rewrite="safe",
        ),
    ),
    safe="arccos",
    point={"x": 1.0},
)

ASIN_AT_ONE = Singularity(
    id="asin-at-one",
    op="asin",
    kind="singular",
    title="asin at +-1: finite value, infinite slope",
    singular_set="x == 1 or x == -1 (|x| > 1 is outside the domain: NaN)",
    derivative="d/dx asin(x) = 1 / sqrt(1 - x**2), which is +inf at x = +-1 and NaN for |x| > 1",
    conventions={
        "jax": "grad(jnp.arcsin)(1.) = inf, also at -1.; jnp.arcsin(2.) = nan with grad nan",
        "torch": "AsinBackward0 gives inf at +-1; nan outside [-1, 1]",
    },
    explanation=(
        "asin is continuous on [-1, 1] with a vertical tangent at both ends. Latitudes, "
        "haversine distances (2 asin(sqrt(h)) with h rounding to 1 for antipodal points) and "
        "angles recovered from a sine reach it, and rounding past 1 makes the value NaN as well."
    ),
    fixes=(
        Fix(
            "Clip the argument strictly inside (-1, 1):",
            "a = jnp.arcsin(jnp.clip(x, -1.0 + 1e-6, 1.0 - 1e-6))",
            "a = torch.asin(torch.clamp(x, -1.0 + 1e-6, 1.0 - 1e-6))",
        ),
        Fix(
            "Use gradsan's safe arcsin (finite derivative at +-1):",
            "a = gradsan.jax.safe.arcsin(x)",
            "a = gradsan.torch.safe.arcsin(x)",
            rewrite="safe",
        ),
    ),
    safe="arcsin",
    point={"x": 1.0},
)

ATANH_AT_ONE = Singularity(
    id="atanh-at-one",
    op="atanh",
    kind="pole",
    title="atanh at +-1: infinite value and slope",
    singular_set="x == 1 or x == -1 (|x| > 1 is outside the domain: NaN)",
    derivative="d/dx atanh(x) = 1 / (1 - x**2), which is +inf at x = +-1",
    conventions={
        "jax": "jnp.arctanh(1.) = inf, grad inf; jnp.arctanh(2.) = nan with a finite grad -1/3",
        "torch": "torch.atanh(1.) = inf; AtanhBackward0 gives inf; nan value outside [-1, 1]",
    },
    explanation=(
        "atanh maps (-1, 1) onto the real line, so its ends are poles. tanh-squashed policies "
        "that invert an action at the bound (log-probabilities in SAC), Fisher's z of a "
        "correlation of exactly 1, and Poincare-ball distances reach them; a float32 tanh "
        "already rounds to exactly 1.0 for inputs of about 10 and above."
    ),
    fixes=(
        Fix(
            "Clip the argument strictly inside (-1, 1):",
            "u = jnp.arctanh(jnp.clip(x, -1.0 + 1e-6, 1.0 - 1e-6))",
            "u = torch.atanh(torch.clamp(x, -1.0 + 1e-6, 1.0 - 1e-6))",
        ),
        Fix(
            "Use gradsan's safe arctanh where a +-1 is legitimate and masked later:",
            "u = gradsan.jax.safe.arctanh(x)",
            "u = gradsan.torch.safe.arctanh(x)",
            rewrite="safe",
        ),
    ),
    safe="arctanh",
    point={"x": 1.0},
)

ACOSH_AT_ONE = Singularity(
    id="acosh-at-one",
    op="acosh",
    kind="singular",
    title="acosh at 1: finite value, infinite slope",
    singular_set="x == 1 (x < 1 is outside the domain: NaN)",
    derivative="d/dx acosh(x) = 1 / sqrt(x**2 - 1), which is +inf at x = 1 and NaN for x < 1",
    conventions={
        "jax": "jnp.arccosh(1.) = 0., grad inf; jnp.arccosh(0.5) = nan with grad nan",
        "torch": "torch.acosh(1.) = 0.; AcoshBackward0 gives inf; nan below 1",
    },
    explanation=(
        "acosh starts at x = 1 with a vertical tangent, like sqrt at 0 (acosh(1 + t) is about "
        "sqrt(2 t)). Hyperbolic distances (the Lorentz model's acosh(-<u, v>)) reach it at "
        "distance 0, that is for a point and itself, and rounding can push the argument below 1."
    ),
    fixes=(
        Fix(
            "Keep the argument strictly above 1:",
            "d = jnp.arccosh(jnp.maximum(x, 1.0 + 1e-6))",
            "d = torch.acosh(torch.clamp(x, min=1.0 + 1e-6))",
        ),
        Fix(
            "Write acosh(1 + t) as log1p(t + sqrt(t (t + 2))) and use gradsan's safe sqrt:",
            "d = jnp.log1p(t + gradsan.jax.safe.sqrt(t * (t + 2.0)))",
            "d = torch.log1p(t + gradsan.torch.safe.sqrt(t * (t + 2.0)))",
        ),
    ),
    point={"x": 1.0},
)

TAN_AT_POLE = Singularity(
    id="tan-at-pole",
    op="tan",
    kind="pole",
    title="tan near pi/2 + k pi: an overflowing value and slope",
    singular_set=(
        "cos(x) == 0, x = pi/2 + k pi. No float is exactly there, so: |cos(x)| within a few "
        "ulps of 0, or a non-finite tan(x) from a finite x"
    ),
    derivative=(
        "d/dx tan(x) = 1 + tan(x)**2 = 1 / cos(x)**2, infinite at the pole; at the float nearest "
        "pi/2 it is 2.7e32 in float64, 5.2e14 in float32 and inf in float16"
    ),
    conventions={
        "jax": "jnp.tan(float32(pi/2)) = -2.29e7 with grad 5.23e14; in float16 tan = 2066. "
        "with grad inf",
        "torch": "the same: -2.29e7 and 5.23e14 in float32 (TanBackward0); grad inf in float16",
    },
    explanation=(
        "tan has poles where cos(x) = 0. In floating point an argument lands within an ulp of a "
        "pole rather than on it, so the value is huge but finite and the slope 1 + tan**2 is "
        "larger still: it overflows in float16, or a few operations later in float32. Angles "
        "that are free parameters (a learned slope angle, a field of view near 180 degrees) "
        "drift there."
    ),
    fixes=(
        Fix(
            "Bound the angle away from the pole:",
            "y = jnp.tan(jnp.clip(x, -1.5, 1.5))",
            "y = torch.tan(torch.clamp(x, -1.5, 1.5))",
        ),
        Fix(
            "Carry the ratio as a pair (sin, cos) and divide only where cos is safely nonzero:",
            "s, c = jnp.sin(x), jnp.cos(x)\n"
            "y = jnp.where(jnp.abs(c) > 1e-3, s / jnp.where(jnp.abs(c) > 1e-3, c, 1.0), 0.0)",
            "s, c = torch.sin(x), torch.cos(x)\n"
            "y = torch.where(c.abs() > 1e-3, s / torch.where(c.abs() > 1e-3, c, 1.0), 0.0)",
        ),
    ),
)


# ---- which entry an op hit, in priority order (sets from _masks) ---------------------------

rule("atan2", (ATAN2_AT_ORIGIN, m.origin))
rule("acos", (ACOS_AT_ONE, m.abs_ge_one))
rule("asin", (ASIN_AT_ONE, m.abs_ge_one))
rule("atanh", (ATANH_AT_ONE, m.abs_ge_one))
rule("acosh", (ACOSH_AT_ONE, m.le_one))


@predicate("tan", entries=[TAN_AT_POLE])
def _tan(operands: Any, out: Any, params: Any) -> Hit | None:
    """A pole of tan to float precision, or a non-finite ``out`` from a finite input."""
    x = operands[0]
    if not real(x):
        return None
    near = m.tan_pole(np, operands, params)
    over = m.nonfinite_from_finite(x, out)
    return hit(TAN_AT_POLE.id, near if over is None else near | over, operands)


ENTRIES: tuple[Singularity, ...] = (
    ATAN2_AT_ORIGIN,
    ACOS_AT_ONE,
    ASIN_AT_ONE,
    ATANH_AT_ONE,
    ACOSH_AT_ONE,
    TAN_AT_POLE,
)
