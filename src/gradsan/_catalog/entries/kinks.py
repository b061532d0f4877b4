"""Kinks, ties and jumps: finite gradients that are conventions.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _masks as m
from .._classify import Hit, eps, hit, hit_at, predicate, real
from .._types import Admissible, Fix, Singularity

ABS_AT_ZERO = Singularity(
    id="abs-at-zero",
    op="abs",
    kind="kink",
    title="abs at 0: a corner; the gradient is a convention",
    singular_set="x == 0",
    derivative="d/dx |x| = sign(x): -1 left of 0, +1 right of 0; no derivative at 0",
    subdifferential="[-1, 1]",
    conventions={
        "jax": "grad(jnp.abs)(0.) = 1.0",
        "torch": "AbsBackward0 gives sign(0.) = 0.0",
    },
    explanation=(
        "|x| is Lipschitz with a corner at 0, where every value in [-1, 1] is a valid "
        "subgradient. The two frameworks pick different ones, so the same model trains "
        "differently wherever an |x| sits exactly at 0: L1 penalties on weights initialized or "
        "pruned to 0, |a - b| losses at a perfect fit. The same function written as sqrt(x**2) "
        "gives NaN instead (0 * inf)."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe abs for one documented subgradient in both frameworks:",
            "y = gradsan.jax.safe.abs(x)",
            "y = gradsan.torch.safe.abs(x)",
            rewrite="safe",
        ),
        Fix(
            "Where a derivative at 0 matters, smooth the corner (pseudo-Huber):",
            "y = jnp.sqrt(x ** 2 + 1e-12) - 1e-6",
            "y = torch.sqrt(x ** 2 + 1e-12) - 1e-6",
        ),
    ),
    safe="abs",
    admissible=Admissible.interval(-1, 1),
)

RELU_AT_ZERO = Singularity(
    id="relu-at-zero",
    op="relu",
    kind="kink",
    title="relu at 0: a corner; the gradient is a convention",
    singular_set="x == 0",
    derivative="d/dx max(x, 0) = 0 for x < 0, 1 for x > 0; no derivative at 0",
    subdifferential="[0, 1]",
    conventions={
        "jax": "grad(jax.nn.relu)(0.) = 0.0 (a custom_jvp); jnp.maximum(x, 0.) gives 0.5 at 0",
        "torch": "ReluBackward0 gives 0.0; torch.clamp(x, min=0.) gives 1.0; "
        "torch.maximum(x, zeros) gives 0.5",
    },
    explanation=(
        "relu is Lipschitz with a corner at 0, where every value in [0, 1] is a valid "
        "subgradient. Both frameworks choose 0 for relu itself, but equivalent spellings choose "
        "differently (0.5 for maximum, 1 for clamp), and relu(x) - relu(-x) = x gets derivative "
        "0 at 0 instead of 1. Exact zeros are common: zero-initialized biases, quantized or "
        "integer-valued inputs."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe maximum for one documented tie rule in both frameworks:",
            "y = gradsan.jax.safe.maximum(x, 0.0)",
            "y = gradsan.torch.safe.maximum(x, 0.0)",
            rewrite="safe",
        ),
    ),
    safe="maximum",
    library=("jax.nn.relu", "torch.relu", "torch.nn.functional.relu"),
    admissible=Admissible.interval(0, 1),
)

MAX_TIE = Singularity(
    id="max-tie",
    op="max",
    kind="kink",
    title="max/min at a tie: the gradient is split by convention",
    singular_set=(
        "maximum(x, y) or minimum(x, y) with x == y; max, min, argmax or argmin with two or "
        "more equal extreme elements (sort and top_k: sort-tie)"
    ),
    derivative=(
        "d/dx max(x, y) = 1 if x > y, 0 if x < y; none at x == y. A reduction's gradient is the "
        "indicator of the maximal element, undefined when it is not unique"
    ),
    subdifferential=(
        "the convex hull of the tied pieces: {(t, 1 - t) : t in [0, 1]} for maximum(x, y); "
        "any convex combination over the tied elements for a reduction"
    ),
    conventions={
        "jax": "jnp.maximum(1., 1.) gives (0.5, 0.5); jnp.max([1., 1., 0.]) gives "
        "[0.5, 0.5, 0.]; argmax picks the first index",
        "torch": "MaximumBackward0 gives (0.5, 0.5); torch.max(x) and torch.amax give "
        "[0.5, 0.5, 0.]; torch.max(x, dim=0) gives [1., 0., 0.] (the index it returns)",
    },
    explanation=(
        "max is Lipschitz, with a kink wherever two candidates tie. Every convex combination of "
        "the tied elements' gradients is a valid subgradient; the frameworks split evenly for "
        "max/amax and give everything to one index for max(dim=...), sort and argmax-based "
        "gathers. Ties are common with ReLU outputs (many exact zeros), max-pooling over a flat "
        "region, quantized values and padding."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe maximum for one documented tie rule in both frameworks:",
            "z = gradsan.jax.safe.maximum(x, y)",
            "z = gradsan.torch.safe.maximum(x, y)",
            rewrite="safe",
        ),
        Fix(
            "Where ties are expected and a smooth gradient helps, use a soft maximum "
            "(temperature t):",
            "z = t * jax.nn.logsumexp(jnp.stack([x, y]) / t, axis=0)",
            "z = t * torch.logsumexp(torch.stack([x, y]) / t, dim=0)",
        ),
    ),
    safe="maximum",
    library=(
        "jax.numpy.max",
        "jax.numpy.amax",
        "jax.numpy.min",
        "jax.numpy.amin",
        "jax.numpy.argmax",
        "jax.numpy.argmin",
        "torch.max",
        "torch.amax",
        "torch.min",
        "torch.amin",
    ),
    admissible=Admissible.simplex((), "convex combinations of the tied elements"),
)

SORT_TIE = Singularity(
    id="sort-tie",
    op="sort",
    kind="kink",
    title="sort/top_k with tied values: the gradient goes to one index by convention",
    singular_set="two or more equal values along the sorted axis (for top_k, among the top k)",
    derivative=(
        "each sorted output is one input's value, so its gradient is the indicator of that "
        "input; with a tie, which input is a convention"
    ),
    subdifferential=(
        "for each order statistic: the convex hull of the indicators of the tied inputs"
    ),
    conventions={
        "jax": "jnp.sort([3., 1., 3., 2.])[-1] sends the gradient to index 2 (the later 3.); "
        "lax.top_k(x, 1) to index 0",
        "torch": "torch.sort gives index 2 as well; torch.topk(x, 1) index 0",
    },
    explanation=(
        "Sorting is Lipschitz: each order statistic is piecewise one of the inputs, with kinks "
        "where two inputs tie. Every convex combination of the tied inputs' indicators is a "
        "valid subgradient; sort and top_k give the whole gradient to the index they returned, "
        "so which of the tied inputs learns depends on the sorting algorithm. Ranking losses, "
        "trimmed means and top-k routing over quantized or saturated scores hit it."
    ),
    fixes=(
        Fix(
            "If only the extreme value matters, use max, which splits the gradient over ties:",
            "m = jnp.max(x, axis=-1)",
            "m = torch.amax(x, dim=-1)",
        ),
    ),
    library=("jax.numpy.sort", "jax.lax.top_k", "torch.sort", "torch.topk"),
    admissible=Admissible.simplex((), "convex combinations of the tied inputs"),
)

CLIP_AT_BOUND = Singularity(
    id="clip-at-bound",
    op="clamp",
    kind="kink",
    title="clip at a bound: a corner; the gradient is a convention",
    singular_set="x == lo or x == hi in clip(x, lo, hi)",
    derivative="d/dx clip(x, lo, hi) = 1 strictly inside (lo, hi), 0 outside; none at a bound",
    subdifferential="[0, 1] for x (the bound that is hit gets the rest, 1 - t)",
    conventions={
        "jax": "grad(lambda x: jnp.clip(x, 0., 1.)) at 0. and at 1. = 0.5 (clip is max then "
        "min: a tie split); lax.clamp gives 0.0 at both bounds",
        "torch": "ClampBackward1 gives 1.0 at both bounds (the bound counts as inside)",
    },
    explanation=(
        "clip is Lipschitz with corners at both bounds, where every value in [0, 1] is a valid "
        "subgradient. JAX's clip splits the tie (0.5), its clamp gives 0 and PyTorch's clamp "
        "gives 1, so a value sitting exactly on a bound (a probability clipped to [0, 1] that is 0.0, "
        "a clipped action at its limit) gets a different gradient in each."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe clip for one documented rule in both frameworks:",
            "y = gradsan.jax.safe.clip(x, lo, hi)",
            "y = gradsan.torch.safe.clip(x, lo, hi)",
            rewrite="safe",
        ),
    ),
    safe="clip",
    library=("jax.numpy.clip", "torch.clamp", "torch.clip"),
    admissible=Admissible.interval(0, 1, "[0, 1] for x"),
)

SIGN_AT_ZERO = Singularity(
    id="sign-at-zero",
    op="sign",
    kind="discontinuity",
    title="sign at 0: a jump; the gradient is 0 by convention",
    singular_set="x == 0",
    derivative="0 for x != 0; sign jumps from -1 to 1 at 0 and has no derivative there",
    conventions={
        "jax": "grad(jnp.sign)(0.) = 0.0, and 0.0 everywhere else",
        "torch": "SignBackward0 gives 0.0 everywhere, including 0",
    },
    explanation=(
        "AD differentiates sign as 0 everywhere, including at the jump, where 0 is no "
        "subgradient of anything: the function is discontinuous. A loss that depends on x only "
        "through sign(x) therefore gets no gradient at all, and at x = 0 the value sign(0) = 0 "
        "is a third convention. Straight-through estimators replace the derivative on purpose."
    ),
    fixes=(
        Fix(
            "For a surrogate gradient, use a straight-through estimator:",
            "y = x + jax.lax.stop_gradient(jnp.sign(x) - x)",
            "y = x + (torch.sign(x) - x).detach()",
        ),
        Fix(
            "For a smooth sign, use tanh with a temperature t:",
            "y = jnp.tanh(x / t)",
            "y = torch.tanh(x / t)",
        ),
    ),
    admissible=Admissible.none("none (a jump)"),
)

FLOOR_ROUND_AT_JUMP = Singularity(
    id="floor-round-at-jump",
    op="floor",
    kind="discontinuity",
    title="floor/ceil/round at a jump: a step; the gradient is 0 by convention",
    singular_set="x an integer for floor and ceil; x a half-integer (k + 0.5) for round",
    derivative="0 between the jumps; no derivative at a jump",
    conventions={
        "jax": "grad of jnp.floor, jnp.ceil and jnp.round = 0.0 everywhere, including the jumps",
        "torch": "FloorBackward0, CeilBackward0 and RoundBackward0 give 0.0 everywhere",
    },
    explanation=(
        "A step function is flat between its jumps, so AD gives 0 everywhere; at a jump the "
        "function is discontinuous and that 0 is a convention, not a subgradient. Quantization, "
        "binning and index computations from floats land on the jumps exactly (x = 2.0), and "
        "the parameters before them silently stop learning."
    ),
    fixes=(
        Fix(
            "For quantization, use a straight-through estimator:",
            "y = x + jax.lax.stop_gradient(jnp.round(x) - x)",
            "y = x + (torch.round(x) - x).detach()",
        ),
    ),
    admissible=Admissible.none("none (a jump)"),
)

WHERE_AT_BOUNDARY = Singularity(
    id="where-at-boundary",
    op="where",
    kind="discontinuity",
    title="where on its boundary: the comparison holds with equality",
    singular_set=(
        "the comparison that chose the branch holds with equality (x == 0 in where(x > 0, a, b))"
    ),
    derivative=(
        "the derivative of the selected branch; at the boundary the other branch's is just as "
        "valid, and if the branches differ in value there the function jumps and has none"
    ),
    subdifferential=(
        "when the branches agree in value on the boundary: the convex hull of the two "
        "branches' gradients; when they differ: none"
    ),
    conventions={
        "jax": "the branch the comparison selected: grad(lambda x: jnp.where(x > 0, x, 0.))(0.) "
        "= 0.0; the unselected branch still receives a zero gradient, so "
        "where(x > 0, sqrt(x), 0.) gives nan at 0",
        "torch": "the same: 0.0, and WhereBackward0 sends 0 into the unselected branch, so "
        "torch.where(x > 0, torch.sqrt(x), 0.) gives nan at 0",
    },
    explanation=(
        "A piecewise function (Huber, piecewise linear, a guarded log) is evaluated by a "
        "comparison; with equality, only the selected piece's gradient is returned. If the "
        "pieces meet continuously this is a kink and the result is one valid subgradient; if "
        "they do not, the function jumps and no gradient is right. Separately, the unselected "
        "branch is still differentiated: 0 times its infinite slope is NaN (the where trap)."
    ),
    fixes=(
        Fix(
            "Make the unselected branch finite with the double-where trick:",
            "ok = x > 0\ny = jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0)",
            "ok = x > 0\ny = torch.where(ok, torch.sqrt(torch.where(ok, x, 1.0)), 0.0)",
        ),
        Fix(
            "Use gradsan's safe where, which does that and documents the boundary rule:",
            "y = gradsan.jax.safe.where(x > 0, jnp.sqrt, 0.0, x)",
            "y = gradsan.torch.safe.where(x > 0, torch.sqrt, 0.0, x)",
        ),
    ),
    safe="where",
    library=("jax.numpy.where", "torch.where"),
)

HYPOT_AT_ORIGIN = Singularity(
    id="hypot-at-origin",
    op="hypot",
    kind="kink",
    title="hypot at the origin: a cone; the frameworks disagree",
    singular_set="x == 0 and y == 0 in hypot(x, y)",
    derivative="d hypot(x, y) = (x, y) / hypot(x, y): 0 / 0 at the origin",
    subdifferential="the unit disk {g : |g| <= 1}",
    conventions={
        "jax": "grad of jnp.hypot at (0., 0.) = (0.5, 0.5), inside the disk: a valid subgradient",
        "torch": "HypotBackward0 gives (nan, nan): x / hypot = 0 / 0",
    },
    explanation=(
        "hypot(x, y) is the 2-norm of (x, y), Lipschitz with a cone point at the origin where "
        "every vector of the unit disk is a subgradient. JAX returns one of them; PyTorch "
        "divides 0 by 0. The length of a zero 2-D vector (a velocity, a gradient of an image) "
        "reaches it."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe hypot: the same values, gradient (0, 0) at the origin:",
            "r = gradsan.jax.safe.hypot(x, y)",
            "r = gradsan.torch.safe.hypot(x, y)",
            rewrite="safe",
        ),
    ),
    safe="hypot",
    library=("jax.numpy.hypot", "torch.hypot"),
    point={"x": 0.0, "y": 0.0},
    admissible=Admissible.ball("the unit disk"),
)

EIGH_REPEATED_EIGENVALUES = Singularity(
    id="eigh-repeated-eigenvalues",
    op="eigh",
    kind="kink",
    title="eigh/svd with repeated eigenvalues: eigenvectors are not determined",
    singular_set=(
        "two or more equal eigenvalues of a symmetric matrix (equal singular values for svd)"
    ),
    derivative=(
        "d v_i contains 1 / (w_j - w_i) for j != i, infinite when w_j == w_i; each eigenvalue's "
        "gradient v_i v_i^T is finite but depends on which basis of the eigenspace was returned"
    ),
    subdifferential=(
        "for the k-th sorted eigenvalue: the convex hull of v v^T over unit vectors v in the "
        "repeated eigenspace; the eigenvectors themselves are not continuous there and have none"
    ),
    conventions={
        "jax": "grad of sum(eigh(eye(2))[0]) = eye(2) (finite); any use of the eigenvectors "
        "gives nan (1 / (w_j - w_i) = 1 / 0)",
        "torch": "the same: LinalgEighBackward0 is finite for the eigenvalues and nan through "
        "the eigenvectors",
    },
    explanation=(
        "Sorted eigenvalues are Lipschitz functions of a symmetric matrix, with kinks where two "
        "cross; at a crossing the eigenvectors of the repeated eigenvalue can be any "
        "orthonormal basis of its eigenspace, so they are not even continuous and their "
        "derivative divides by the gap w_j - w_i = 0. Identity-initialized or symmetric "
        "matrices, graph Laplacians of symmetric graphs and low-rank matrices (repeated 0) hit "
        "it exactly."
    ),
    fixes=(
        Fix(
            "Differentiate only spectral functions (trace, logdet, eigenvalues), which stay "
            "well defined:",
            "w = jnp.linalg.eigvalsh(a)",
            "w = torch.linalg.eigvalsh(a)",
        ),
        Fix(
            "Use gradsan's safe eigh, which drops the 1 / 0 terms inside a repeated eigenspace:",
            "w, v = gradsan.jax.safe.eigh(a)",
            "w, v = gradsan.torch.safe.eigh(a)",
        ),
    ),
    safe="eigh",
    library=(
        "jax.numpy.linalg.eigh",
        "jax.numpy.linalg.svd",
        "torch.linalg.eigh",
        "torch.linalg.svd",
    ),
    admissible=Admissible.psd_trace1(),
)

DET_AT_SINGULAR = Singularity(
    id="det-at-singular",
    op="det",
    kind="pole",
    title="det/slogdet of a singular matrix: log|det| = -inf; PyTorch's det gradient is 0",
    singular_set="det(A) == 0: a rank-deficient square matrix",
    derivative=(
        "d det(A) = adj(A)^T, finite everywhere (det is a polynomial); d log|det A| = A^-T, "
        "infinite at det == 0"
    ),
    conventions={
        "jax": "grad(jnp.linalg.det) at [[1, 2], [2, 4]] = adj^T = [[4, -2], [-2, 1]], right; "
        "slogdet's log|det| gradient there is +-inf or nan",
        "torch": "LinalgDetBackward0 returns [[0, 0], [0, 0]] at [[1, 2], [2, 4]], a wrong "
        "finite gradient (adj^T is [[4, -2], [-2, 1]]); LinalgSlogdetBackward0 gives +-inf or nan",
    },
    explanation=(
        "det is a polynomial in the entries, so its gradient adj(A)^T exists everywhere, also "
        "at a singular matrix; PyTorch computes it through the inverse and returns 0 when the "
        "matrix is exactly singular, which is not the derivative. log|det A| is a pole there: "
        "Gaussian log-densities, normalizing flows and volume terms reach it when a covariance "
        "or Jacobian loses rank."
    ),
    fixes=(
        Fix(
            "Add jitter so the matrix stays positive definite, and use slogdet:",
            "sign, logdet = jnp.linalg.slogdet(a + 1e-6 * jnp.eye(a.shape[-1]))",
            "sign, logdet = torch.linalg.slogdet(a + 1e-6 * torch.eye(a.shape[-1]))",
        ),
        Fix(
            "Parameterize a covariance by a Cholesky factor with a positive diagonal:",
            "logdet = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))",
            "logdet = 2.0 * torch.log(torch.diagonal(chol)).sum()",
        ),
    ),
    library=(
        "jax.numpy.linalg.det",
        "jax.numpy.linalg.slogdet",
        "torch.det",
        "torch.linalg.det",
        "torch.linalg.slogdet",
        "torch.logdet",
    ),
    inadmissible=("torch",),
)


I0E_AT_ZERO = Singularity(
    id="i0e-at-zero",
    op="i0e",
    kind="kink",
    title="bessel_i0e at 0: a corner; the gradient is a convention",
    singular_set="x == 0",
    derivative=(
        "d/dx i0e(x) = i1e(x) - sign(x) i0e(x): +1 left of 0, -1 right of 0; no derivative at 0"
    ),
    subdifferential="[-1, 1]",
    conventions={
        "jax": "grad(lax.bessel_i0e)(0.) = 0.0; jax.scipy.special.i0 = exp(|x|) i0e(x) then "
        "gets grad(i0)(0.) = 1.0 from abs's 1.0 (the true derivative of i0 at 0 is 0)",
        "torch": "torch.special.i0e gives 0.0 at 0; torch.special.i0 gives 0.0 (exact)",
    },
    explanation=(
        "i0e(x) = exp(-|x|) I0(x) keeps abs's corner at 0. JAX's i0 multiplies it by "
        "exp(|x|): the two corners cancel in the function (I0 is smooth) but not in AD, "
        "whose conventions at 0 (1 for |x|, 0 for i0e) do not match, so JAX's gradient of i0 "
        "at 0 is 1.0 where the derivative is 0."
    ),
    fixes=(
        Fix(
            "Compute I0 with a rule that is smooth at 0 (its derivative is I1):",
            "y = jnp.i0(x)",
            "y = torch.special.i0(x)",
        ),
    ),
    admissible=Admissible.interval(-1, 1),
)

# One-sided slopes at the corners of the fused activations: fn -> (params -> corners), each
# corner (x, slope left of x, slope right of x). Only corners whose slopes differ are kinks
# (elu with alpha == 1 meets C^1 at 0; celu always does). A slope may be an array broadcast
# to the operand (prelu's learned weight, one per channel: a corner only where it is not 1)
# or None: the slope PyTorch drew itself (rrelu in training: a random slope per element).
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _differ(left: Any, right: Any) -> Any:
    """Where the two one-sided slopes differ (None: drawn by PyTorch, never 1 but by chance)."""
    if left is None or right is None:
        return True
    return np.asarray(left) != np.asarray(right)


def activation_corners(fn: str, params: Any) -> tuple[tuple[float, Any, Any], ...]:
    """The corners of the activation ``fn`` (``leaky_relu``, ``prelu``, ``rrelu``, ``elu``,
    ``selu``, ``hardswish``, ``hardsigmoid``, ``softshrink``, ``threshold``, ``relu6``,
    ``hardtanh``) with its
    parameters (``negative_slope``, ``alpha``, ``lambd``, ``threshold``/``value``,
    ``lower``/``upper``/``training``, ``min_val``/``max_val``): (x, left, right) for every corner where the one-sided
    slopes differ (anywhere, for an array slope)."""
    got: tuple[tuple[float, Any, Any], ...]
    if fn in ("leaky_relu", "prelu"):  # prelu: its weight broadcast to the operand
        got = ((0.0, params.get("negative_slope", 0.01), 1.0),)
    elif fn == "rrelu":  # eval: leaky_relu with the mean slope; training: the drawn one
        lower, upper = float(params.get("lower", 1 / 8)), float(params.get("upper", 1 / 3))
        drawn = params.get("training", False) and lower != upper
        got = ((0.0, None if drawn else (lower + upper) / 2, 1.0),)
    elif fn == "elu":
        got = ((0.0, float(params.get("alpha", 1.0)), 1.0),)
    elif fn == "selu":
        got = ((0.0, SELU_SCALE * SELU_ALPHA, SELU_SCALE),)
    elif fn == "hardswish":  # x relu6(x + 3) / 6
        got = ((-3.0, 0.0, -0.5), (3.0, 1.5, 1.0))
    elif fn == "hardsigmoid":  # relu6(x + 3) / 6
        got = ((-3.0, 0.0, 1 / 6), (3.0, 1 / 6, 0.0))
    elif fn == "softshrink":  # x + lambd below -lambd, 0 between, x - lambd above lambd
        lam = float(params.get("lambd", 0.5))
        got = ((-lam, 1.0, 0.0), (lam, 0.0, 1.0)) if lam > 0 else ()
    elif fn == "threshold":  # x above the threshold, value at and below it
        th, value = float(params.get("threshold", 0.0)), float(params.get("value", 0.0))
        got = ((th, 0.0, 1.0),) if value == th else ()  # else a jump: activation_jumps
    elif fn == "relu6":  # min(max(x, 0), 6) (JAX's jax.nn.relu6; PyTorch's is clip-at-bound)
        got = ((0.0, 0.0, 1.0), (6.0, 1.0, 0.0))
    elif fn == "hardtanh":  # clip(x, min_val, max_val) (JAX's jax.nn.hard_tanh: -1, 1)
        lo, hi = float(params.get("min_val", -1.0)), float(params.get("max_val", 1.0))
        got = ((lo, 0.0, 1.0), (hi, 1.0, 0.0))
    else:
        return ()
    return tuple(c for c in got if np.any(_differ(c[1], c[2])))


def activation_jumps(fn: str, params: Any) -> tuple[tuple[float, float, float], ...]:
    """The jumps of the activation ``fn`` (``hardshrink``, ``threshold`` with value !=
    threshold): (x, limit from the left, limit from the right) where they differ."""
    got: tuple[tuple[float, float, float], ...]
    if fn == "hardshrink":  # x where |x| > lambd, else 0
        lam = float(params.get("lambd", 0.5))
        got = ((-lam, -lam, 0.0), (lam, 0.0, lam))
    elif fn == "threshold":
        th, value = float(params.get("threshold", 0.0)), float(params.get("value", 0.0))
        got = ((th, value, th),)
    else:
        return ()
    return tuple(j for j in got if j[1] != j[2])


def corner_interval(corners: Any, x: float, idx: tuple = ()) -> tuple[float, float] | None:
    """The Clarke subdifferential [min, max] of the one-sided slopes at the corner ``x`` (an
    array slope read at ``idx``; None for a slope PyTorch drew)."""
    for at, left, right in corners:
        if at == x:
            if left is None or right is None:
                return None
            lo, hi = (float(np.asarray(v)[idx] if np.ndim(v) else v) for v in (left, right))
            if lo == hi:
                return None
            return (min(lo, hi), max(lo, hi))
    return None


ACTIVATION_CORNER = Singularity(
    id="activation-corner",
    op="activation",
    kind="kink",
    title="a piecewise activation at its corner: the gradient is a convention",
    singular_set=(
        "leaky_relu, prelu (weight != 1), rrelu, elu (alpha != 1) and selu at x == 0; "
        "hardswish and hardsigmoid at x == -3 and x == 3; softshrink at x == -lambd and "
        "x == lambd (lambd > 0); threshold at x == threshold when value == threshold; JAX's "
        "relu6 at 0 and 6 and hard_tanh at -1 and 1 (PyTorch's relu6 and hardtanh are "
        "clip-at-bound)"
    ),
    derivative=(
        "one slope on each side of the corner: leaky_relu negative_slope | 1, prelu weight | 1 "
        "(d/dweight is x below 0: 0 on both sides of the corner), rrelu (lower + upper) / 2 | 1 "
        "in eval mode and its drawn slope | 1 in training, elu alpha | 1, selu scale * alpha | "
        "scale at 0; hardswish 0 | -1/2 at -3 and 3/2 | 1 at 3; hardsigmoid 0 | 1/6 at -3 and "
        "1/6 | 0 at 3; softshrink 1 | 0 at -lambd and 0 | 1 at lambd; threshold 0 | 1; no "
        "derivative at the corner"
    ),
    subdifferential="the interval between the two one-sided slopes",
    conventions={
        "jax": "grad(jax.nn.leaky_relu)(0.) = 1.0 (the right slope), "
        "grad(lambda x: jax.nn.elu(x, 0.5))(0.) = 0.5 and selu scale * alpha (the left one); "
        "hard_tanh 1.0 at -1 and 1; relu6 (a custom_jvp) 0.0 at 0 and 6, so hard_swish 0.0 "
        "at -3 and 1.0 at 3, hard_sigmoid 0.0 at both",
        "torch": "F.leaky_relu(x, 0.1) gives 0.1 at 0, F.prelu its weight, F.rrelu (lower + "
        "upper) / 2 in eval mode and the drawn slope in training, F.elu(x, 0.5) 0.5, F.selu "
        "1.7581 (scale * alpha); F.hardswish 0.0 at -3 and 1.0 at 3; F.hardsigmoid 0.0 at "
        "both; F.softshrink 0.0 at both corners; F.threshold(x, t, t) 0.0 at t",
    },
    explanation=(
        "The fused activations are piecewise: leaky_relu and elu/selu change slope at 0, "
        "hardswish and hardsigmoid at -3 and 3. Each is Lipschitz there and every value "
        "between the two one-sided slopes is a valid subgradient; the kernel returns one of "
        "them (PyTorch takes the left slope at 0; JAX the right one for leaky_relu, the "
        "left one for elu and selu), so an input sitting exactly on a corner "
        "(zero-initialized biases, quantized inputs, a padded zero) gets a gradient that "
        "depends on the framework."
    ),
    fixes=(
        Fix(
            "Where a derivative at the corner matters, use a smooth activation:",
            "y = jax.nn.gelu(x)",
            "y = torch.nn.functional.gelu(x)",
        ),
        Fix(
            "For elu, alpha = 1 meets C^1 at 0 (or use celu, which is C^1 for every alpha):",
            "y = jax.nn.celu(x, alpha)",
            "y = torch.nn.functional.celu(x, alpha)",
        ),
    ),
    admissible=Admissible.interval(
        -0.5, SELU_SCALE * SELU_ALPHA, "[min, max] of the two one-sided slopes"
    ),
)

ACTIVATION_JUMP = Singularity(
    id="activation-jump",
    op="activation",
    kind="discontinuity",
    title="a piecewise activation at its jump: the gradient is a convention",
    singular_set=(
        "hardshrink at x == -lambd and x == lambd (lambd > 0); threshold at x == threshold "
        "when value != threshold"
    ),
    derivative=(
        "hardshrink jumps from -lambd to 0 at -lambd and from 0 to lambd at lambd; threshold "
        "jumps from value to threshold at threshold; the slope is 0 | 1 (1 | 0) beside the "
        "jump; no derivative at the jump"
    ),
    conventions={
        "jax": "no fused hardshrink or threshold in jax.nn: written as jnp.where, they are "
        "where-at-boundary",
        "torch": "F.hardshrink(x, 0.5) gives 0.0 at both -0.5 and 0.5 (the value there is 0); "
        "F.threshold(x, t, v) gives 0.0 at t (the value there is v)",
    },
    explanation=(
        "hardshrink and threshold keep x on one side of a cut and replace it by a constant on "
        "the other, so where the constant differs from x at the cut the function jumps: no "
        "value is a derivative there, and the kernel's 0 hides that the loss changes by a "
        "finite step when x crosses it. Inputs land on the cut exactly when they are "
        "quantized or initialized to it (a sparse code at its threshold)."
    ),
    fixes=(
        Fix(
            "Where a derivative at the cut matters, use the continuous shrinkage:",
            "y = jnp.sign(x) * jnp.maximum(jnp.abs(x) - lambd, 0.0)",
            "y = torch.nn.functional.softshrink(x, lambd)",
        ),
    ),
    admissible=Admissible.none("none (a jump)"),
)


# ---- which entry an op hit (sets from _masks) -----------------------------------------

# Sort, top_k, cummax, pooling, eigh/svd and det are numpy only (see _masks).


@predicate("abs", entries=[ABS_AT_ZERO])
def _abs(operands: Any, out: Any, params: Any) -> Hit | None:
    return hit(ABS_AT_ZERO.id, m.at_zero(np, operands, params), operands)


@predicate("relu", entries=[RELU_AT_ZERO])
def _relu(operands: Any, out: Any, params: Any) -> Hit | None:
    return hit(RELU_AT_ZERO.id, m.at_zero(np, operands, params), operands)


@predicate("activation", entries=[ACTIVATION_JUMP, ACTIVATION_CORNER])
def _activation(operands: Any, out: Any, params: Any) -> Hit | None:
    """A fused activation (``params["fn"]``, with its parameters) at one of its jumps, else
    at one of its corners; operands: (x,)."""
    x = operands[0]
    if not real(x):
        return None
    fn = params.get("fn", "")
    at = np.zeros(np.shape(x), bool)
    for c, _, _ in activation_jumps(fn, params):
        at |= x == c
    if at.any():
        return hit(ACTIVATION_JUMP.id, at, operands)
    for c, left, right in activation_corners(fn, params):
        at |= (x == c) & _differ(left, right)
    return hit(ACTIVATION_CORNER.id, at, operands)


@predicate("i0e", entries=[I0E_AT_ZERO])
def _i0e(operands: Any, out: Any, params: Any) -> Hit | None:
    return hit(I0E_AT_ZERO.id, m.at_zero(np, operands, params), operands)


@predicate("sign", entries=[SIGN_AT_ZERO])
def _sign(operands: Any, out: Any, params: Any) -> Hit | None:
    return hit(SIGN_AT_ZERO.id, m.at_zero(np, operands, params), operands)


@predicate("max", "min", entries=[MAX_TIE])
def _max(operands: Any, out: Any, params: Any) -> Hit | None:
    """Binary maximum / minimum: operands (x, y)."""
    if len(operands) < 2:
        return None
    return hit(MAX_TIE.id, m.tie(np, operands, params), operands)


@predicate("reduce_max", "argmax", entries=[MAX_TIE])
def _reduce_max(operands: Any, out: Any, params: Any) -> Hit | None:
    """A reduction over ``axes`` (lax) / ``dim`` (torch); the mask has the reduced shape.

    ``params["elementwise"]`` (torch.max(a, b)) makes it the binary maximum."""
    if params.get("elementwise"):
        return _max(operands, out, params)
    x = operands[0]
    if x.size == 0 or x.ndim == 0:
        return None
    axes = m.axes_of(x, params)
    use_min = params.get("_min", False)
    ext = np.min(x, axis=axes, keepdims=True) if use_min else np.max(x, axis=axes, keepdims=True)
    ties = m.reduce_tie(np, operands, params)
    if not m.keepdims_of(params):
        ties, ext = np.squeeze(ties, axis=axes), np.squeeze(ext, axis=axes)
    return hit_at(MAX_TIE.id, ties, ext)


@predicate("reduce_min", "argmin", entries=[MAX_TIE])
def _reduce_min(operands: Any, out: Any, params: Any) -> Hit | None:
    if params.get("elementwise"):
        return _max(operands, out, params)
    return _reduce_max(operands, out, {**params, "_min": True})


@predicate("sort", "top_k", entries=[SORT_TIE])
def _sort(operands: Any, out: Any, params: Any) -> Hit | None:
    """Sorting along ``axis``/``dim`` (default -1); the mask marks the input elements that tie
    with another along that axis (for top_k: only values that reach the top k)."""
    x = operands[0]
    if x.size == 0 or x.ndim == 0:
        return None
    axis = m.axes_of(x, params, default=-1)[0]
    xm = np.moveaxis(x, axis, -1)
    order = np.argsort(xm, axis=-1, kind="stable")
    srt = np.take_along_axis(xm, order, axis=-1)
    eq = srt[..., 1:] == srt[..., :-1]
    dup = np.zeros(xm.shape, bool)
    dup[..., 1:] |= eq
    dup[..., :-1] |= eq
    ties = np.empty_like(dup)
    np.put_along_axis(ties, order, dup, axis=-1)
    k = params.get("k")
    if k is not None:
        largest = params.get("largest", True)
        kth = srt[..., -int(k), None] if largest else srt[..., int(k) - 1, None]
        ties &= (xm >= kth) if largest else (xm <= kth)
    return hit_at(SORT_TIE.id, np.moveaxis(ties, -1, axis), x)


@predicate("clamp", entries=[CLIP_AT_BOUND])
def _clamp(operands: Any, out: Any, params: Any) -> Hit | None:
    """operands in lax order: (lo, x, hi); a missing bound is None."""
    lo, x, hi = (list(operands) + [None, None, None])[:3]
    if m.missing(x):
        return None
    bounds = [b for b in (lo, hi) if not m.missing(b)]
    shape = np.broadcast_shapes(x.shape, *(b.shape for b in bounds))
    at = np.broadcast_to(m.at_bound(np, operands, params), shape)
    return hit_at(CLIP_AT_BOUND.id, at, np.broadcast_to(x, shape), operand=1)


@predicate("floor", "ceil", entries=[FLOOR_ROUND_AT_JUMP])
def _floor(operands: Any, out: Any, params: Any) -> Hit | None:
    if not real(operands[0]):
        return None
    return hit(FLOOR_ROUND_AT_JUMP.id, m.integer(np, operands, params), operands)


@predicate("round", entries=[FLOOR_ROUND_AT_JUMP])
def _round(operands: Any, out: Any, params: Any) -> Hit | None:
    if not real(operands[0]):
        return None
    return hit(FLOOR_ROUND_AT_JUMP.id, m.half_integer(np, operands, params), operands)


@predicate("trunc", entries=[FLOOR_ROUND_AT_JUMP])
def _trunc(operands: Any, out: Any, params: Any) -> Hit | None:
    """A float -> integer cast (truncation toward 0): jumps at the non-zero integers.
    ``params["to_bool"]`` (a cast to bool) jumps at 0 instead."""
    x = operands[0]
    if not real(x) or x.dtype.kind not in "f":
        return None
    return hit(FLOOR_ROUND_AT_JUMP.id, m.trunc_jump(np, operands, params), operands)


@predicate("where", entries=[WHERE_AT_BOUNDARY])
def _where(operands: Any, out: Any, params: Any) -> Hit | None:
    """operands: the two sides (lhs, rhs) of the comparison that chose the branch."""
    if len(operands) < 2:
        return None
    return hit(WHERE_AT_BOUNDARY.id, m.tie(np, operands, params), operands)


@predicate("hypot", entries=[HYPOT_AT_ORIGIN])
def _hypot(operands: Any, out: Any, params: Any) -> Hit | None:
    return hit(HYPOT_AT_ORIGIN.id, m.origin(np, operands, params), operands)


def _spectrum(a: np.ndarray, hermitian: bool) -> np.ndarray | None:
    if a.ndim < 2 or a.shape[-1] == 0 or not np.all(np.isfinite(a)):
        return None
    try:
        if hermitian:
            return np.linalg.eigvalsh(a)
        return np.linalg.svd(a, compute_uv=False)
    except np.linalg.LinAlgError:
        return None


@predicate("eigh", entries=[EIGH_REPEATED_EIGENVALUES])
def _eigh(operands: Any, out: Any, params: Any) -> Hit | None:
    """operands: (matrix,). The mask has the spectrum's shape (..., n): eigenvalues (singular
    values for svd) within 16 n eps max|w| of another, the tolerance of gradsan's safe eigh."""
    a = operands[0]
    w = _spectrum(a, hermitian=params.get("_op") != "svd")
    if w is None:
        return None
    n = w.shape[-1]
    tol = 16 * n * eps(a) * np.max(np.abs(w), axis=-1, keepdims=True)
    close = np.abs(w[..., :, None] - w[..., None, :]) <= tol[..., None]
    repeated = np.sum(close, axis=-1) > 1
    return hit_at(EIGH_REPEATED_EIGENVALUES.id, repeated, w)


@predicate("svd", entries=[EIGH_REPEATED_EIGENVALUES])
def _svd(operands: Any, out: Any, params: Any) -> Hit | None:
    return _eigh(operands, out, {**params, "_op": "svd"})


@predicate("det", "slogdet", "logdet", entries=[DET_AT_SINGULAR])
def _det(operands: Any, out: Any, params: Any) -> Hit | None:
    """operands: (matrix,). Singular to float precision: the smallest singular value is within
    n eps of the largest. The mask has the batch shape (det's output); "got" is det."""
    a = operands[0]
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        return None
    s = _spectrum(a, hermitian=False)
    if s is None:
        return None
    n = s.shape[-1]
    singular = s[..., -1] <= n * eps(a) * s[..., 0]
    return hit_at(DET_AT_SINGULAR.id, singular, np.linalg.det(a))


@predicate("cummax", "cummin", entries=[MAX_TIE])
def _cummax(operands: Any, out: Any, params: Any) -> Hit | None:
    """A running maximum (minimum with ``params["_min"]``) along ``axis``; ``reverse`` runs it
    from the end. The mask has the output's shape: positions whose running extreme is attained
    by two or more elements so far."""
    x = operands[0]
    if x.size == 0 or x.ndim == 0:
        return None
    axis = m.axes_of(x, params, default=0)[0]
    xm = np.moveaxis(x, axis, -1)
    if params.get("reverse"):
        xm = xm[..., ::-1]
    fn = np.minimum if params.get("_min") else np.maximum
    run = fn.accumulate(xm, axis=-1)
    count = np.ones(xm.shape, np.int64)  # elements j <= i equal to run[i]
    for i in range(1, xm.shape[-1]):
        same = run[..., i] == run[..., i - 1]
        count[..., i] = np.where(same, count[..., i - 1] + (xm[..., i] == run[..., i]), 1)
    ties = count > 1
    if params.get("reverse"):
        ties, run = ties[..., ::-1], run[..., ::-1]
    return hit_at(MAX_TIE.id, np.moveaxis(ties, -1, axis), np.moveaxis(run, -1, axis))


@predicate("reduce_window_max", "reduce_window_min", entries=[MAX_TIE])
def _reduce_window_max(operands: Any, out: Any, params: Any) -> Hit | None:
    """Max (min with ``params["_min"]``) pooling: windows whose extreme is attained by two or
    more elements. Params as lax.reduce_window_max: window_dimensions, window_strides, padding,
    window_dilation (base dilation 1). The mask has the output's shape."""
    x = operands[0]
    if x.size == 0 or any(b != 1 for b in params.get("base_dilation", ()) or ()):
        return None
    use_min = params.get("_min", False)
    w = m.windows(x, params, np.inf if use_min else -np.inf)
    ext = w.min(axis=-1) if use_min else w.max(axis=-1)
    ties = np.isfinite(ext) & (np.sum(w == ext[..., None], axis=-1) > 1)
    return hit_at(MAX_TIE.id, ties, ext)


ENTRIES: tuple[Singularity, ...] = (
    ABS_AT_ZERO,
    RELU_AT_ZERO,
    MAX_TIE,
    SORT_TIE,
    CLIP_AT_BOUND,
    SIGN_AT_ZERO,
    FLOOR_ROUND_AT_JUMP,
    WHERE_AT_BOUNDARY,
    HYPOT_AT_ORIGIN,
    EIGH_REPEATED_EIGENVALUES,
    DET_AT_SINGULAR,
    I0E_AT_ZERO,
    ACTIVATION_CORNER,
    ACTIVATION_JUMP,
)
