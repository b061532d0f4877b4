"""Every catalog entry that can make a value or gradient non-finite in JAX has a trigger
program here: explain must name that entry and the exact user line, eagerly and under jit."""

import jax
import jax.numpy as jnp
import pytest

import gradsan
import gradsan.jax as gsj
from tests.conftest import line_of

jax.config.update("jax_enable_x64", False)


def t_sqrt(x):
    return jnp.sqrt(x) * 0.0  # L:sqrt-at-zero


def t_sqrt_neg(x):
    return jnp.sqrt(x - 1.0)  # L:sqrt-of-negative


def t_rsqrt(x):
    return jax.lax.rsqrt(x)  # L:rsqrt-at-zero


def t_cbrt(x):
    return jnp.cbrt(x) * 0.0  # L:cbrt-at-zero


def t_pow_frac(x):
    return (x**0.5) * 0.0  # L:pow-fractional-at-zero


def t_pow_neg(x):
    return x**-0.5  # L:pow-negative-at-zero


def t_pow_negbase(x):
    return (x - 2.0) ** 1.5  # L:pow-negative-base


def t_int_pow(x):
    return x**-2  # L:integer-pow-negative-at-zero


def t_div(x):
    return 1.0 / x  # L:div-by-zero


def t_log(x):
    return jnp.log(x)  # L:log-at-zero


def t_log_neg(x):
    return jnp.log(x - 1.0)  # L:log-of-negative


def t_log1p(x):
    return jnp.log1p(x - 1.0)  # L:log1p-at-minus-one


def t_xlogy(x):
    return jax.scipy.special.xlogy(x, x)  # L:xlogy-at-zero


def t_atan2(x):
    return jnp.arctan2(x, x)  # L:atan2-at-origin


def t_acos(x):
    return jnp.arccos(x + 1.0)  # L:acos-at-one


def t_asin(x):
    return jnp.arcsin(x + 1.0)  # L:asin-at-one


def t_atanh(x):
    return jnp.arctanh(x + 1.0)  # L:atanh-at-one


def t_acosh(x):
    return jnp.arccosh(x + 1.0)  # L:acosh-at-one


def t_exp(x):
    return jnp.exp(x + 100.0)  # L:exp-overflow


def t_expm1(x):
    return jnp.expm1(x + 100.0)  # L:expm1-overflow


def t_lgamma(x):
    return jax.lax.lgamma(x)  # L:lgamma-at-pole


def t_digamma(x):
    return jax.lax.digamma(x)  # L:digamma-at-pole


def t_erfinv(x):
    return jax.lax.erf_inv(x + 1.0)  # L:erf-inv-at-one


def t_norm(x):
    return jnp.linalg.norm(jnp.stack([x, x]))  # L:norm-at-zero


def t_std(x):
    return jnp.std(jnp.stack([x, x]))  # L:std-of-constant


def t_logsumexp(x):
    return jax.nn.logsumexp(jnp.where(jnp.array([False, False]), x, -jnp.inf))  # L:logsumexp-all-neg-inf


def t_f16(x):
    return jnp.exp(x.astype(jnp.float16) + 12.0)  # L:float16-overflow


def t_log2(x):
    return jnp.log2(x)  # L:log2-log10-at-zero


def t_exp_log(x):
    return jnp.exp(2.0 * jnp.log(x))  # L:exp-log-at-zero


TRIGGERS = {
    "sqrt-at-zero": (t_sqrt, "gradient"),
    "sqrt-of-negative": (t_sqrt_neg, "value"),
    "rsqrt-at-zero": (t_rsqrt, "value"),
    "cbrt-at-zero": (t_cbrt, "gradient"),
    "pow-fractional-at-zero": (t_pow_frac, "gradient"),
    "pow-negative-at-zero": (t_pow_neg, "value"),
    "pow-negative-base": (t_pow_negbase, "value"),
    "integer-pow-negative-at-zero": (t_int_pow, "value"),
    "div-by-zero": (t_div, "value"),
    "log-at-zero": (t_log, "value"),
    "log2-log10-at-zero": (t_log2, "value"),
    "exp-log-at-zero": (t_exp_log, "gradient"),
    "log-of-negative": (t_log_neg, "value"),
    "log1p-at-minus-one": (t_log1p, "value"),
    "xlogy-at-zero": (t_xlogy, "gradient"),
    "atan2-at-origin": (t_atan2, "gradient"),
    "acos-at-one": (t_acos, "gradient"),
    "asin-at-one": (t_asin, "gradient"),
    "atanh-at-one": (t_atanh, "value"),
    "acosh-at-one": (t_acosh, "gradient"),
    "exp-overflow": (t_exp, "value"),
    "expm1-overflow": (t_expm1, "value"),
    "lgamma-at-pole": (t_lgamma, "value"),
    "digamma-at-pole": (t_digamma, "value"),
    "erf-inv-at-one": (t_erfinv, "value"),
    "norm-at-zero": (t_norm, "gradient"),
    "std-of-constant": (t_std, "gradient"),
    "logsumexp-all-neg-inf": (t_logsumexp, "value"),
    "float16-overflow": (t_f16, "value"),
}


@pytest.mark.parametrize("entry_id", sorted(TRIGGERS))
def test_trigger(entry_id, maybe_jit):
    fun, phase = TRIGGERS[entry_id]
    prog = maybe_jit(jax.value_and_grad(fun))
    report = gsj.explain(prog)(jnp.float32(0.0))
    assert not report.ok, f"{entry_id}: nothing found"
    ids = [f.catalog_id for f in report.findings]
    assert entry_id in ids, f"{entry_id}: got {ids}"
    f = report.findings[ids.index(entry_id)]
    assert f.where is not None and f.where.line == line_of(f"L:{entry_id}"), str(report)
    assert any(x.phase == phase for x in report.findings if x.catalog_id == entry_id)


def test_every_nonfinite_entry_has_a_trigger():
    kinds_needing_trigger = {"singular", "pole", "domain", "overflow"}
    missing = [
        e.id for e in gradsan.catalog.ENTRIES
        if e.kind in kinds_needing_trigger and e.id not in TRIGGERS
        and e.id not in {"pow-exponent-grad-at-zero-base", "tan-at-pole", "var-of-constant",
                         "softmax-all-neg-inf", "det-at-singular",
                         "where-trap"}  # picked from the zero's kind: tests/jax/test_zero_sources.py
    ]
    assert missing == []


# jnp.log2/log10 are log(x) / log(base): the op that meets 0 is log itself, and the finding is
# routed to their own entry (whose fix divides the safe log by ln 2 / ln 10), issue #13 item 5.
def t_log10(x):
    return jnp.log10(x)


@pytest.mark.parametrize("fn", [t_log2, t_log10], ids=["log2", "log10"])
def test_log2_log10_have_their_own_entry(fn):
    [f] = gsj.explain(jax.grad(fn))(0.0).findings
    assert f.catalog_id == "log2-log10-at-zero" and f.primitive == "log"


def test_a_log_of_a_log2_call_argument_stays_log_at_zero():
    [f] = gsj.explain(jax.grad(lambda x: jnp.log2(1.0 + jnp.log(x))))(0.0).findings[:1]
    assert f.catalog_id == "log-at-zero"
