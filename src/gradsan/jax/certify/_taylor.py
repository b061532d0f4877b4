"""Taylor coefficients at a point, vectorized, for the analytic compositions of
:mod:`._series` (``analytic``): integer power series and the elementary functions' Taylor
generators."""

from __future__ import annotations

import math

import numpy as np

# -- integer power series (Taylor coefficients at a point, vectorized) ------------------------


def _ips_mul(x: list, y: list, n: int) -> list:
    return [sum(x[i] * y[k - i] for i in range(k + 1)) for k in range(n + 1)]


def _ips_exp(g: list, n: int) -> list:
    z = [np.exp(g[0])]
    for k in range(1, n + 1):
        z.append(sum(i * g[i] * z[k - i] for i in range(1, k + 1)) / k)
    return z


def _ips_pow(q: list, p: float, n: int) -> list:
    z = [q[0] ** p]
    for k in range(1, n + 1):
        z.append(sum(((p + 1) * i - k) * q[i] * z[k - i] for i in range(1, k + 1)) / (k * q[0]))
    return z


def _integrate(c0, dz: list, n: int) -> list:
    return [c0] + [dz[k - 1] / k for k in range(1, n + 1)]


def _poly(a0, n: int, c2: float, c0: float = 1.0) -> list:
    """Coefficients of c0 + c2 * (a0 + s)**2 in s."""
    q = [c0 + c2 * a0 * a0, 2 * c2 * a0, c2 + 0 * a0]
    return q + [0 * a0] * max(0, n - 2)


def taylor_exp(a0, n):
    e = np.exp(a0)
    return [e / math.factorial(k) for k in range(n + 1)]


def taylor_expm1(a0, n):
    e = np.exp(a0)
    return [np.expm1(a0)] + [e / math.factorial(k) for k in range(1, n + 1)]


# Beyond this argument, the rounding error of a computed limit a0 (relative 1e-16 and more, as
# in exp(exp(x))) is above about 1e-8 in sin(a0), cos(a0), tan(a0): their coefficients (and any
# sign decided from them) are not trusted, and the elements are left undecided (NaN
# coefficients, see `analytic`).
PERIODIC_MAX = 2.0**24


def _periodic_arg(a0):
    a0 = np.asarray(a0, np.float64)
    return np.where(np.abs(a0) > PERIODIC_MAX, np.nan, a0)


def _sincos_cycle(a0, n, start: int):
    """Derivatives of sin cycle sin, cos, -sin, -cos (exactly, no sin(a0 + k pi/2) rounding)."""
    a0 = _periodic_arg(a0)
    s, c = np.sin(a0), np.cos(a0)
    cyc = [s, c, -s, -c]
    return [cyc[(start + k) % 4] / math.factorial(k) for k in range(n + 1)]


def taylor_sin(a0, n):
    return _sincos_cycle(a0, n, 0)


def taylor_cos(a0, n):
    return _sincos_cycle(a0, n, 1)


def _ode_quadratic(y0, n, c0, c1, c2):
    """y' = c0 + c1 y + c2 y^2 along s."""
    y = [y0]
    for k in range(n):
        sq = y[0] * y[k]
        for i in range(1, k + 1):
            sq = sq + y[i] * y[k - i]
        r = c2 * sq
        if c1:
            r = r + c1 * y[k]
        if k == 0 and c0:
            r = r + c0
        y.append(r / (k + 1) if k else r)
    return y


def taylor_tanh(a0, n):
    return _ode_quadratic(np.tanh(a0), n, 1.0, 0.0, -1.0)


def taylor_logistic(a0, n):
    return _ode_quadratic(1.0 / (1.0 + np.exp(-a0)), n, 0.0, 1.0, -1.0)


def taylor_tan(a0, n):
    return _ode_quadratic(np.tan(_periodic_arg(a0)), n, 1.0, 0.0, 1.0)


def taylor_atan(a0, n):
    return _integrate(np.arctan(a0), _ips_pow(_poly(a0, n, 1.0), -1.0, n), n)


def taylor_atanh(a0, n):
    return _integrate(np.arctanh(a0), _ips_pow(_poly(a0, n, -1.0), -1.0, n), n)


def taylor_asin(a0, n):
    return _integrate(np.arcsin(a0), _ips_pow(_poly(a0, n, -1.0), -0.5, n), n)


def taylor_acos(a0, n):
    d = _ips_pow(_poly(a0, n, -1.0), -0.5, n)
    return _integrate(np.arccos(a0), [-x for x in d], n)


def _erf(x):
    try:
        from scipy.special import erf

        return erf(x)
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float64])(x)


def taylor_erf(a0, n):
    g = [-(a0 * a0), -2 * a0, -1.0 + 0 * a0] + [0 * a0] * max(0, n - 2)
    e = _ips_exp(g, n)
    return _integrate(_erf(a0), [2 / math.sqrt(math.pi) * x for x in e], n)


def taylor_log1p(a0, n):
    u = 1.0 / (1.0 + a0)
    return [np.log1p(a0)] + [(-1.0) ** (k + 1) / k * u**k for k in range(1, n + 1)]


def taylor_log1_plus(a0, n):
    """log(1 + s) at s = 0 (used with a0 = 0 only)."""
    z = np.zeros_like(a0)
    return [z] + [z + (-1.0) ** (k + 1) / k for k in range(1, n + 1)]
