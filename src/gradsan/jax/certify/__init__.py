"""gradsan.jax.certify: ray-Puiseux AD (theory.md section 6.5, Tiers B and C).

Along random rays x0 + t v, t -> 0+, every intermediate of the loss's jaxpr is propagated as a
truncated generalized power series (:mod:`._series`), then a reverse sweep with series-valued
local partials and cotangents gives each input a gradient series G(t). Per ray the verdict is

* DEFINED: G has no divergent term; its t^0 coefficient is lim_{t->0+} grad f(x0 + t v);
* SINGULAR: the value diverges, the increment's leading exponent is < 1 (or 1 with a log), or
  G diverges; the certificate is the leading term;
* DISCONTINUOUS: the limit of f along the ray differs from f(x0);
* REMOVABLE: f(x0) is NaN but the limit (and a gradient limit) exists;
* DOMAIN: the ray leaves the real domain;
* UNDECIDED: horizon, cancellation or an unsupported primitive stopped the rules.

Several rays (v and -v first) certify "not differentiable" (different limits, or
f'(x; v) + f'(x; -v) != 0) and give the minimum-norm element of the hull of the limits, labelled
as a Clarke subgradient. The result is checked against itself: G(v) . v must equal the forward
series' f'(x0; v), or the ray is reported UNDECIDED with an internal-error note.

Cost. One plain (numpy) evaluation at x0 gives f(x0) and the singular points ("events": a zero
under sqrt or a division, a tie under max, ...). The first pass along the rays keeps the t^0 and
t^1 terms (all that f'(x0; v) and the limit of the gradient need), with the events and what feeds
them at the cap of ``terms``, and the reverse sweep keeps the cotangents' terms below t^1; only a
ray left UNDECIDED is run again with ``terms`` everywhere, then doubled twice. The rays of that
first pass go through one sweep of the loss vmapped over stacked parameters. Repeated
subexpressions are evaluated once per ray, so that they tie exactly (a - a, min(a, a), a / a).

The package, one concept per module: ``_series`` (the series and their arithmetic), ``_taylor``
and ``_singular`` (Taylor coefficients; the singular elementwise rules), ``_values`` (integer
values, lifting, the context), ``_registry`` (the rule tables), ``_sweep`` (the forward and
reverse sweeps), ``rules/`` (the rules by family), ``_point`` (f(x0) and its singular points),
``_rays`` (per-ray verdicts, batched rays), ``_hull`` (directions, the minimum-norm hull) and
``_api`` (arguments, trace cache, the report).
"""

# the rules register into the tables of ._registry, in this order (each family's module holds
# its rules and their bookkeeping: pure, plain or kinky at x0)
from ._api import certify as certify
from .rules import choice as choice
from .rules import control as control
from .rules import elementwise as elementwise
from .rules import fallback as fallback
from .rules import linear as linear
from .rules import products as products

__all__ = ["certify"]
