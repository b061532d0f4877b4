"""The generalized power series type of gradsan.jax.certify (theory.md 6.5)."""

from fractions import Fraction as Fr

import numpy as np
import pytest

pytest.importorskip("jax")

from gradsan.jax.certify import _series as S  # noqa: E402
from gradsan.jax.certify import _singular, _taylor  # noqa: E402
from gradsan.jax.certify._series import DOMAIN, OK, POISON, Series  # noqa: E402

T = Series.ray(0.0, 1.0)  # t


def terms(s):
    return {k: float(np.asarray(c)) for k, c in s.terms.items()}


def test_ray_and_add_cancel_exactly():
    x = Series.ray(0.2, 1.0)
    y = S.sub(S.add_const(S.add_const(x, 0.1), -0.1), x)  # 0.2 + 0.1 - 0.1 - 0.2 in floats
    assert y.terms == {}
    assert np.isinf(y.H) and S.exact_zero(y)


def test_sqrt_of_t_is_exact_monomial():
    r = _singular.power(T, Fr(1, 2))
    assert terms(r) == {(Fr(1, 2), 0): 1.0}
    assert np.isinf(r.H)
    assert terms(S.mul(r, r)) == {(Fr(1), 0): 1.0}


def test_power_binomial_series_and_horizon():
    with S.capped(3):
        r = _singular.power(S.add_const(T, 1.0), Fr(1, 2))  # sqrt(1 + t) = 1 + t/2 - t^2/8 + ...
    tm = terms(r)
    assert tm[(Fr(0), 0)] == 1.0 and tm[(Fr(1), 0)] == 0.5 and tm[(Fr(2), 0)] == -0.125
    assert float(r.H) == 3.0


def test_domain_and_poison():
    assert _singular.power(S.neg(T), Fr(1, 2)).bad == DOMAIN
    assert _singular.power(S.neg(T), Fr(1, 3)).bad == OK  # odd root of a negative number
    assert terms(_singular.power(S.neg(T), Fr(1, 3))) == {(Fr(1, 3), 0): -1.0}
    z = Series.exact(0.0)
    assert _singular.power(z, Fr(-1, 2)).bad == POISON
    assert _singular.log(z).bad == POISON
    # in a local partial, an identically zero factor absorbs an infinite one; not in a value
    assert S.mul(z, _singular.power(z, Fr(-1, 2)), absorb=True).bad == OK
    assert S.mul(z, _singular.power(z, Fr(-1, 2))).bad == POISON
    assert S.rmul(z, _singular.power(S.neg(T), Fr(1, 2))).bad == OK  # a structurally zero cotangent


def test_log_creates_a_log_term_and_exp_turns_it_into_a_power():
    lg = _singular.log(S.scale(T, 2.0))
    tm = terms(lg)
    assert tm[(Fr(0), 1)] == 1.0 and abs(tm[(Fr(0), 0)] - np.log(2)) < 1e-15
    e = _singular.exp(S.scale(_singular.log(T), 2.0))  # exp(2 log t) = t^2
    assert terms(e) == {(Fr(2), 0): 1.0} or float(e.H) <= 2


def test_exp_of_negative_pole_vanishes_beyond_all_orders():
    e = _singular.exp(S.neg(_singular.inv(T)))  # exp(-1/t)
    assert e.terms == {} and float(e.H) >= 1e6 and e.bad == OK


def test_sign_of_leading_coefficient_decides():
    with S.capped(4):
        s = S.sub(S.mul(T, T), S.scale(T, 0.0))
    sg, und = S.sign_of(s)
    assert sg == 1 and not und
    sg, und = S.sign_of(_singular.log(T))  # log t < 0
    assert sg == -1 and not und
    zero_to_h = S.mk({}, np.asarray(2.0), np.asarray(0, np.int8))
    sg, und = S.sign_of(zero_to_h)
    assert und


@pytest.mark.parametrize(
    "name,fn,ref",
    [
        ("tanh", _taylor.taylor_tanh, np.tanh),
        ("logistic", _taylor.taylor_logistic, lambda x: 1 / (1 + np.exp(-x))),
        ("sin", _taylor.taylor_sin, np.sin),
        ("atan", _taylor.taylor_atan, np.arctan),
        ("asin", _taylor.taylor_asin, np.arcsin),
        ("erf", _taylor.taylor_erf, None),
    ],
)
def test_taylor_coefficients_against_finite_differences(name, fn, ref):
    mpmath = pytest.importorskip("mpmath")
    a0 = 0.3
    cs = fn(np.asarray(a0), 4)
    mp_f = {
        "tanh": mpmath.tanh,
        "logistic": lambda x: 1 / (1 + mpmath.exp(-x)),
        "sin": mpmath.sin,
        "atan": mpmath.atan,
        "asin": mpmath.asin,
        "erf": mpmath.erf,
    }[name]
    mpmath.mp.dps = 30
    for k in range(5):
        d = mpmath.diff(mp_f, mpmath.mpf(a0), k) / mpmath.factorial(k)
        assert abs(float(cs[k]) - float(d)) < 1e-12 * (1 + abs(float(d)))


def test_atan2_limit_angle_along_a_ray():
    y = S.scale(T, 1.0)
    x = S.scale(T, -1.0)
    a = _singular.atan2(y, x)
    assert abs(float(a.coef()) - 3 * np.pi / 4) < 1e-15


def test_vectorized_per_element_valuations():
    x = Series.ray(np.array([0.0, 4.0]), np.array([1.0, 1.0]))
    with S.capped(3):
        r = _singular.power(x, Fr(1, 2))
    assert float(r.coef(Fr(1, 2))[0]) == 1.0 and float(r.coef(Fr(1, 2))[1]) == 0.0
    assert float(r.coef()[1]) == 2.0 and float(r.coef(Fr(1))[1]) == 0.25
    assert np.isinf(r.H[0]) and r.H[1] == 3.0


def test_interned_exponents_hash_and_compare_like_fractions():
    a, b = S.q(Fr(1, 2)), S.q(Fr(2, 4))
    assert a is b and a == Fr(1, 2) and hash(a) == hash(Fr(1, 2)) and float(a) == 0.5
    s = a + S.q(Fr(1, 3))
    assert type(s) is S.Q and s == Fr(5, 6) and s is S.q(Fr(5, 6))
    assert type(a - 1) is S.Q and type(1 - a) is S.Q and type(-a) is S.Q and type(2 * a) is S.Q
    assert {(Fr(1, 2), 0): 1}[(a, 0)] == 1  # keys made of plain fractions still match


def test_a_minus_a_is_exactly_zero_whatever_its_horizon():
    with S.capped(1.5):
        a = S.analytic(S.add_const(T, 0.3), _taylor.taylor_tanh)  # truncated: H = 2
    assert np.isfinite(a.H) and S.exact_zero(S.sub(a, a))
    assert not S.exact_zero(S.sub(a, S.analytic(S.add_const(T, 0.3), _taylor.taylor_tanh)))


def test_signed_infinities():
    z = Series.zeros(())
    lz = _singular.log(z)  # log 0 = -inf for every t
    assert lz.bad == POISON and S.inf_code(lz) == -S.HARD
    assert S.inf_code(S.add(lz, S.Series.exact(3.0))) == -S.HARD  # -inf + finite
    assert S.inf_code(S.mul(lz, S.Series.exact(-2.0))) == S.HARD  # -inf * -2
    assert S.inf_code(S.mul(lz, z)) == 0 and S.mul(lz, z).bad == POISON  # inf * 0: NaN
    assert S.inf_code(_singular.power(z, Fr(-1))) == S.ANYHARD  # 1 / 0: the sign is the zero's
    inv = _singular.power(lz, Fr(-1))  # 1 / -inf = 0 for every t
    assert inv.bad == OK and S.exact_zero(inv)
    assert S.exact_zero(_singular.exp(lz))  # exp(-inf) = 0
    assert S.inf_code(_singular.log(S.neg(lz))) == S.HARD  # log(+inf) = +inf
    assert _singular.log(lz).bad == DOMAIN  # log(-inf)


def test_a_leading_log_decides_sign_and_domain():
    lt = _singular.log(T)  # log t < 0
    assert _singular.power(lt, Fr(1, 2)).bad == DOMAIN
    assert _singular.log(lt).bad == DOMAIN
    assert S.inf_code(_singular.power(lt, Fr(1, 3))) == -S.SOFT  # cbrt(log t) -> -inf, slowly
    assert S.inf_code(_singular.log(S.neg(lt))) == S.SOFT  # log(-log t) -> +inf


def test_linear_composition_shortcut_matches_the_horner_loop():
    rng = np.random.default_rng(1)
    x = S.mk(
        {(S.ZERO, 0): rng.standard_normal(6), (S.ONE, 0): rng.standard_normal(6)},
        np.full(6, 2.0),
        np.zeros(6, np.int8),
    )
    with S.capped(1.5):
        delta = S.drop_const(x)
        cs = _taylor.taylor_tanh(x.coef(), 1)
        fast = S._compose1(delta, lambda n: cs)
        slow = S.compose(delta, lambda n: cs)
    assert fast is not None and fast.terms.keys() == slow.terms.keys()
    for k in fast.terms:
        np.testing.assert_array_equal(fast.terms[k], slow.terms[k])
    np.testing.assert_array_equal(fast.H, slow.H)
