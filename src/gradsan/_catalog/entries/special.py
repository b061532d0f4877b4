"""Special functions: lgamma, digamma, erf_inv.

README.md (one level up) says what each field holds and where a new entry goes.
"""

from __future__ import annotations

from .. import _masks as m
from .._classify import rule
from .._types import Fix, Singularity

LGAMMA_AT_POLE = Singularity(
    id="lgamma-at-pole",
    op="lgamma",
    kind="pole",
    title="lgamma at 0, -1, -2, ...: infinite value",
    singular_set="x a non-positive integer (0, -1, -2, ...), where Gamma has its poles",
    derivative="d/dx lgamma(x) = digamma(x), which has poles at the same points",
    conventions={
        "jax": "lax.lgamma(0.) = inf; grad nan (JAX's digamma(0.) is nan), also at -1., -2.",
        "torch": "torch.lgamma(0.) = inf; LgammaBackward0 gives -inf at 0 and nan at -1., -2.",
    },
    explanation=(
        "log|Gamma(x)| is +inf where Gamma has poles. Gamma, Beta, Dirichlet and "
        "negative-binomial likelihoods reach x = 0 when a concentration or count parameter that "
        "must be positive is produced by an unconstrained parameter or a ReLU."
    ),
    fixes=(
        Fix(
            "Keep the parameter positive with softplus and a floor:",
            "alpha = jax.nn.softplus(raw) + 1e-6",
            "alpha = torch.nn.functional.softplus(raw) + 1e-6",
        ),
    ),
)

DIGAMMA_AT_POLE = Singularity(
    id="digamma-at-pole",
    op="digamma",
    kind="pole",
    title="digamma at 0, -1, -2, ...: infinite value",
    singular_set="x a non-positive integer (0, -1, -2, ...)",
    derivative="d/dx digamma(x) = polygamma(1, x), which is +inf at the poles",
    conventions={
        "jax": "lax.digamma(0.) = nan (not inf), grad inf; digamma(-1.) = nan, grad inf",
        "torch": "torch.digamma(0.) = -inf, DigammaBackward0 inf; digamma(-1.) = nan with a "
        "huge finite grad (6.6e32 in float64)",
    },
    explanation=(
        "digamma, the derivative of lgamma, has poles at the non-positive integers. It appears "
        "in the gradient of every Gamma/Beta/Dirichlet log-likelihood and in their KL "
        "divergences, and is reached when a concentration parameter that must be positive "
        "hits 0."
    ),
    fixes=(
        Fix(
            "Keep the parameter positive with softplus and a floor:",
            "alpha = jax.nn.softplus(raw) + 1e-6",
            "alpha = torch.nn.functional.softplus(raw) + 1e-6",
        ),
    ),
)

ERF_INV_AT_ONE = Singularity(
    id="erf-inv-at-one",
    op="erf_inv",
    kind="pole",
    title="erf_inv at +-1: infinite value and slope",
    singular_set="x == 1 or x == -1 (|x| > 1 is outside the domain: NaN)",
    derivative=("d/dx erfinv(x) = sqrt(pi) / 2 * exp(erfinv(x)**2), which is +inf at x = +-1"),
    conventions={
        "jax": "lax.erf_inv(1.) = inf, grad inf; erf_inv(2.) = nan with grad nan",
        "torch": "torch.erfinv(1.) = inf; ErfinvBackward0 gives inf; nan outside [-1, 1]",
    },
    explanation=(
        "erfinv maps (-1, 1) onto the real line. The Gaussian quantile "
        "sqrt(2) erfinv(2 u - 1) reaches the poles for u = 0 or 1: a uniform sample rounded to "
        "an endpoint, or a probit link at a saturated probability."
    ),
    fixes=(
        Fix(
            "Clip the argument strictly inside (-1, 1):",
            "z = jax.lax.erf_inv(jnp.clip(x, -1.0 + 1e-6, 1.0 - 1e-6))",
            "z = torch.erfinv(torch.clamp(x, -1.0 + 1e-6, 1.0 - 1e-6))",
        ),
    ),
    point={"x": 1.0},
)


# ---- which entry an op hit, in priority order (sets from _masks) ---------------------------

rule("lgamma", (LGAMMA_AT_POLE, m.nonpositive_integer))
rule("digamma", (DIGAMMA_AT_POLE, m.nonpositive_integer))
rule("erf_inv", (ERF_INV_AT_ONE, m.abs_ge_one))


ENTRIES: tuple[Singularity, ...] = (
    LGAMMA_AT_POLE,
    DIGAMMA_AT_POLE,
    ERF_INV_AT_ONE,
)
