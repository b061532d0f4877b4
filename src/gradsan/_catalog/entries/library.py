"""Library functions that are one op in PyTorch: norm, std, var, logsumexp, softmax.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _masks as m
from .._classify import Hit, hit, hit_at, predicate, real, reduce
from .._types import Admissible, Fix, Singularity

NORM_AT_ZERO = Singularity(
    id="norm-at-zero",
    op="norm",
    kind="kink",
    title="norm at the zero vector: a cone, no gradient",
    singular_set="x == 0 (every element) in norm(x) = sqrt(sum(x**2))",
    derivative=(
        "d/dx |x| = x / |x|: 0 / 0 at x = 0. Inside, AD forms sqrt'(0) = inf times "
        "d(sum(x**2)) = 2 x = 0"
    ),
    subdifferential="the unit ball {g : |g| <= 1}; 0 is its minimum-norm element",
    conventions={
        "jax": "grad(jnp.linalg.norm)(zeros(2)) = [nan, nan] (vector_norm and matrix norms too)",
        "torch": "torch.linalg.norm and torch.norm give [0., 0.] at 0 "
        "(LinalgVectorNormBackward0 masks it); F.normalize(zeros) gives 1e12 (1 / eps)",
    },
    explanation=(
        "The Euclidean norm is Lipschitz everywhere, with a cone point at 0 where every vector "
        "of the unit ball is a subgradient. JAX differentiates it as sqrt(sum(x**2)) and meets "
        "0 * inf = NaN; PyTorch returns the subgradient 0. Distances between identical points, "
        "the norm of a zero update or embedding, and normalize(x) = x / |x| reach it."
    ),
    fixes=(
        Fix(
            "Use gradsan's safe norm: the same values, gradient 0 at 0 (a valid subgradient):",
            "r = gradsan.jax.safe.norm(x)",
            "r = gradsan.torch.safe.norm(x)",
            rewrite="safe",
        ),
        Fix(
            "Normalize with gradsan's safe normalize (0 maps to 0 with a finite gradient):",
            "u = gradsan.jax.safe.normalize(x)",
            "u = gradsan.torch.safe.normalize(x)",
        ),
        Fix(
            "Guard the sum of squares with the double-where trick:",
            "sq = jnp.sum(x ** 2)\nok = sq > 0\nr = jnp.where(ok, jnp.sqrt(jnp.where(ok, sq, 1.0)), 0.0)",
            "sq = (x ** 2).sum()\nok = sq > 0\nr = torch.where(ok, torch.sqrt(torch.where(ok, sq, 1.0)), 0.0)",
        ),
    ),
    safe="norm",
    library=(
        "jax.numpy.linalg.norm",
        "jax.numpy.linalg.vector_norm",
        "jax.numpy.linalg.matrix_norm",
        "torch.linalg.norm",
        "torch.linalg.vector_norm",
        "torch.norm",
    ),
    point={"x": [0.0, 0.0]},
    admissible=Admissible.ball("the unit ball"),
)

STD_OF_CONSTANT = Singularity(
    id="std-of-constant",
    op="std",
    kind="kink",
    title="std of a constant: a cone at 0, NaN gradient in JAX",
    singular_set="all elements equal along the reduced axes (std == 0)",
    derivative=(
        "d/dx std(x) = (x - mean) / ((n - ddof) std): 0 / 0 when std == 0. Inside, AD forms "
        "sqrt'(0) = inf times d var = 2 (x - mean) / (n - ddof) = 0"
    ),
    subdifferential=(
        "{P g / sqrt(n - ddof) : |g| <= 1} with P = I - 1 1^T / n (centering); 0 is its "
        "minimum-norm element"
    ),
    conventions={
        "jax": "grad(jnp.std)(ones(3)) = [nan, nan, nan]; (x - mean) / (std + eps) gives NaN too",
        "torch": "StdBackward0 returns 0 where std == 0: grad [0., 0., 0.], and "
        "(x - mean) / (std + eps) gets 0",
    },
    explanation=(
        "std(x) = |x - mean| / sqrt(n - ddof) is Lipschitz with a cone point where all elements "
        "are equal, like a norm at 0. Normalizing by (std + eps), as in the Flux thread, has a "
        "finite true derivative there (the numerator is 0 too and eps keeps the denominator "
        "away from 0), yet the gradient of std written as sqrt(var) is 0 * inf = NaN and it reaches every input. "
        "Constant features, padded rows, a batch of one repeated sample, or a dead channel "
        "hit it."
    ),
    fixes=(
        Fix(
            "Normalize with sqrt(var + eps), as layer and batch norms do (smooth at var == 0):",
            "y = (x - jnp.mean(x)) / jnp.sqrt(jnp.var(x) + 1e-5)",
            "y = (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-5)",
        ),
        Fix(
            "Use gradsan's safe std: the same values, gradient 0 where std == 0:",
            "s = gradsan.jax.safe.std(x)",
            "s = gradsan.torch.safe.std(x)",
            rewrite="safe",
        ),
    ),
    safe="std",
    library=("jax.numpy.std", "jax.numpy.nanstd", "torch.std", "torch.std_mean"),
    point={"x": [1.0, 1.0, 1.0]},
)

VAR_OF_CONSTANT = Singularity(
    id="var-of-constant",
    op="var",
    kind="singular",
    title="var of a constant (or of too few samples): a 0 fed to sqrt or a division",
    singular_set=(
        "all elements equal along the reduced axes (var == 0) where sqrt(var) or 1 / var "
        "follows; or n - ddof <= 0 (one sample with ddof=1, PyTorch's default)"
    ),
    derivative=(
        "d/dx var(x) = 2 (x - mean) / (n - ddof): 0 at a constant x (var itself is smooth), "
        "0 / 0 when n - ddof == 0"
    ),
    conventions={
        "jax": "grad(jnp.var)(ones(3)) = [0., 0., 0.]; jnp.var(x, ddof=1) of one element = nan, "
        "grad nan",
        "torch": "VarBackward0 gives [0., 0., 0.]; torch.var of one element (unbiased by "
        "default) = nan with a warning, grad nan",
    },
    explanation=(
        "var is a quadratic, smooth everywhere, and its gradient at a constant input is simply "
        "0. The NaN comes from what follows it: sqrt(var) (see std-of-constant), rsqrt(var) or "
        "1 / var without an eps, all singular at 0. Separately, the unbiased estimator divides "
        "by n - ddof, which is 0 / 0 for a single sample."
    ),
    fixes=(
        Fix(
            "Add eps inside the root before dividing:",
            "y = (x - jnp.mean(x)) * jax.lax.rsqrt(jnp.var(x) + 1e-5)",
            "y = (x - x.mean()) * torch.rsqrt(x.var(unbiased=False) + 1e-5)",
        ),
        Fix(
            "For a single sample use the population variance (ddof=0):",
            "v = jnp.var(x)  # ddof=0",
            "v = x.var(unbiased=False)",
        ),
        Fix(
            "Use gradsan's safe var:",
            "v = gradsan.jax.safe.var(x)",
            "v = gradsan.torch.safe.var(x)",
            rewrite="safe",
        ),
    ),
    safe="var",
    library=("jax.numpy.var", "jax.numpy.nanvar", "torch.var", "torch.var_mean"),
    point={"x": [1.0, 1.0, 1.0]},
)

LOGSUMEXP_ALL_NEG_INF = Singularity(
    id="logsumexp-all-neg-inf",
    op="logsumexp",
    kind="pole",
    title="logsumexp of an all -inf row: -inf value, NaN gradient",
    singular_set="every element along the reduced axes is -inf (a fully masked row)",
    derivative=(
        "d/dx_i logsumexp(x) = exp(x_i - logsumexp(x)) = softmax(x)_i: exp(-inf - (-inf)) = "
        "exp(nan) on an all -inf row"
    ),
    conventions={
        "jax": "jax.nn.logsumexp([-inf, -inf]) = -inf; grad [nan, nan] (jax.scipy too)",
        "torch": "torch.logsumexp([-inf, -inf]) = -inf; LogsumexpBackward0 gives [nan, nan]",
    },
    explanation=(
        "Masking with -inf is exact as long as one element per row survives. A row with every "
        "element masked (a padded query in attention, an impossible path in a CTC or CRF "
        "lattice, a mixture with every weight -inf) has logsumexp = log(0) = -inf and its "
        "gradient is the softmax of the row, -inf - (-inf) = NaN."
    ),
    fixes=(
        Fix(
            "Mask with the most negative finite number instead of -inf:",
            "z = jnp.where(mask, z, jnp.finfo(z.dtype).min)",
            "z = z.masked_fill(~mask, torch.finfo(z.dtype).min)",
        ),
        Fix(
            "Pass the mask to gradsan's safe logsumexp: -inf on a fully masked row, gradient 0:",
            "lse = gradsan.jax.safe.logsumexp(z, axis=-1, where=mask)",
            "lse = gradsan.torch.safe.logsumexp(z, axis=-1, where=mask)",
        ),
    ),
    safe="logsumexp",
    library=("jax.nn.logsumexp", "jax.scipy.special.logsumexp", "torch.logsumexp"),
)

SOFTMAX_ALL_NEG_INF = Singularity(
    id="softmax-all-neg-inf",
    op="softmax",
    kind="domain",
    title="softmax of an all -inf row: NaN value and gradient",
    singular_set="every element along the softmax axis is -inf (a fully masked row)",
    derivative=(
        "softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x): with max x = -inf every term "
        "is exp(nan); softmax has no value there, so there is nothing to differentiate"
    ),
    conventions={
        "jax": "jax.nn.softmax([-inf, -inf]) = [nan, nan], grad nan (log_softmax too); "
        "softmax(z, where=mask) with nothing selected gives 0. and grad 0.",
        "torch": "torch.softmax and torch.log_softmax of [-inf, -inf] = [nan, nan]; "
        "SoftmaxBackward0 and LogSoftmaxBackward0 give nan",
    },
    explanation=(
        "softmax normalizes by the sum of the row, which is 0 when every logit is -inf: 0 / 0. "
        "It happens in attention when a query has every key masked (padding, a causal mask "
        "shifted by one), and the NaN then spreads through the whole batch in the backward pass."
    ),
    fixes=(
        Fix(
            "Pass the mask to softmax (JAX), or mask with the most negative finite number:",
            "p = jax.nn.softmax(z, where=mask)",
            "p = torch.softmax(z.masked_fill(~mask, torch.finfo(z.dtype).min), dim=-1)",
            torch_summary="Mask with the most negative finite number, not -inf (masked_fill "
            "with torch.finfo(z.dtype).min):",
        ),
        Fix(
            "Pass the mask to gradsan's safe softmax / log_softmax: a fully masked row gets "
            "gradient 0, no NaN:",
            "p = gradsan.jax.safe.softmax(z, where=mask)\n"
            "logp = gradsan.jax.safe.log_softmax(z, where=mask)",
            "p = gradsan.torch.safe.softmax(z, where=mask)\n"
            "logp = gradsan.torch.safe.log_softmax(z, where=mask)",
        ),
    ),
    safe="softmax",
    library=(
        "jax.nn.softmax",
        "jax.nn.log_softmax",
        "torch.softmax",
        "torch.log_softmax",
        "torch.nn.functional.softmax",
        "torch.nn.functional.log_softmax",
    ),
)


# ---- which entry an op hit, in priority order (sets from _masks) ---------------------------

# One op in PyTorch; params: axes/axis/dim, keepdims, ddof.


@predicate("norm", entries=[NORM_AT_ZERO])
def _norm(operands: Any, out: Any, params: Any) -> Hit | None:
    x = operands[0]
    mask, vals = reduce(m.at_zero(np, operands, params), np.abs(x), x, params)
    return hit_at(NORM_AT_ZERO.id, mask, vals)


def _constant(x: np.ndarray, params: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    axes = m.axes_of(x, params)
    keep = m.keepdims_of(params)
    hi = np.max(x, axis=axes, keepdims=keep)
    return hi == np.min(x, axis=axes, keepdims=keep), hi


def _ddof(params: Mapping[str, Any]) -> float:
    if params.get("ddof") is not None:
        return float(params["ddof"])
    if params.get("correction") is not None:
        return float(params["correction"])
    if params.get("unbiased") is not None:
        return 1.0 if params["unbiased"] else 0.0
    return 0.0


def _too_few(x: np.ndarray, params: Mapping[str, Any]) -> bool:
    n = int(np.prod([x.shape[a] for a in m.axes_of(x, params)], dtype=np.int64))
    return n - _ddof(params) <= 0


@predicate("std", entries=[VAR_OF_CONSTANT, STD_OF_CONSTANT])
def _std(operands: Any, out: Any, params: Any) -> Hit | None:
    x = operands[0]
    if x.size == 0 or not real(x):
        return None
    const, vals = _constant(x, params)
    if _too_few(x, params):
        return hit_at(VAR_OF_CONSTANT.id, np.ones_like(const), vals)
    return hit_at(STD_OF_CONSTANT.id, const, vals)


@predicate("var", entries=[VAR_OF_CONSTANT])
def _var(operands: Any, out: Any, params: Any) -> Hit | None:
    x = operands[0]
    if x.size == 0 or not real(x):
        return None
    const, vals = _constant(x, params)
    if _too_few(x, params):
        const = np.ones_like(const)
    return hit_at(VAR_OF_CONSTANT.id, const, vals)


@predicate("logsumexp", entries=[LOGSUMEXP_ALL_NEG_INF])
def _logsumexp(operands: Any, out: Any, params: Any) -> Hit | None:
    x = operands[0]
    mask, vals = reduce(x == -np.inf, x, x, params)
    return hit_at(LOGSUMEXP_ALL_NEG_INF.id, mask, vals)


@predicate("softmax", "log_softmax", entries=[SOFTMAX_ALL_NEG_INF])
def _softmax(operands: Any, out: Any, params: Any) -> Hit | None:
    """The mask has the input's (= output's) shape: every element of an all -inf row."""
    x = operands[0]
    if x.ndim == 0:
        return hit(SOFTMAX_ALL_NEG_INF.id, x == -np.inf, operands)
    axes = m.axes_of(x, params, default=-1)
    row = np.all(x == -np.inf, axis=axes, keepdims=True)
    return hit(SOFTMAX_ALL_NEG_INF.id, np.broadcast_to(row, x.shape), operands)


ENTRIES: tuple[Singularity, ...] = (
    NORM_AT_ZERO,
    STD_OF_CONSTANT,
    VAR_OF_CONSTANT,
    LOGSUMEXP_ALL_NEG_INF,
    SOFTMAX_ALL_NEG_INF,
)
