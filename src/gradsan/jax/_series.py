"""Truncated generalized power series along a ray x0 + t v, t -> 0+ (theory.md section 6.5).

A :class:`Series` is an array-valued function of t,

    a(t) = sum over (e, j) of C[e, j] * t**e * (log t)**j,

with rational exponents ``e`` (``fractions.Fraction``), log powers ``0 <= j <= D`` and one numpy
float64 coefficient array per term, vectorized over the array's shape. Each element carries

* a precision horizon ``H``: every term with exponent ``< H`` is known (up to float rounding of
  its coefficient); nothing is known at or beyond ``H``. ``H = inf`` means the element is exact
  (a polynomial in t, or identically zero);
* a status code ``bad``: ``OK``, ``POISON`` (undefined for every t > 0, e.g. ``1/0`` of an
  identically zero value: absorbed by an identically-zero factor, like a structural zero),
  ``UNDEC`` (the rules could not decide) and ``DOMAIN`` (the ray leaves the real domain).

Terms at or beyond the global cap (``cap()``, in units of t) are dropped and lower the horizon
where they were nonzero. Coefficients that cancel in a sum down to ``TOL`` times the magnitude
of what was summed are set to exactly zero: cancellation is judged relative to the operands,
never to the result (the float subtlety of theory.md 6.5).

The elementwise rules (power, log, exp, analytic Taylor composition, atan2) are the forward
rules of theory.md 6.5; local partials for the reverse sweep are built from the same operations
by the caller (``_certify``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from fractions import Fraction

import numpy as np

D = 2  # highest power of log t kept
TOL = 1e-12  # relative cancellation threshold
EPS = 1e-9  # slack when comparing exponents (rationals) with float horizons
BEYOND = 1e9  # horizon of a value that vanishes beyond all orders (exp(-1/t))
NMAX = 24  # highest Taylor order used in a composition

OK, POISON, UNDEC, DOMAIN = 0, 1, 2, 3
ZERO = Fraction(0)
ONE = Fraction(1)

_CAP = [2.0]


def cap() -> float:
    return _CAP[0]


@contextlib.contextmanager
def capped(value: float) -> Iterator[None]:
    old = _CAP[0]
    _CAP[0] = float(value)
    try:
        yield
    finally:
        _CAP[0] = old


class Undecided(Exception):
    """Raised when a rule cannot go on at all (unsupported primitive, undecided control flow)."""


def _dom(k: tuple) -> tuple:
    """Dominance order as t -> 0+: lower exponent first, then higher log power."""
    return (k[0], -k[1])


class Series:
    __slots__ = ("terms", "H", "bad")

    def __init__(self, terms: dict, H: np.ndarray, bad: np.ndarray):
        self.terms = terms
        self.H = H
        self.bad = bad

    # -- constructors ---------------------------------------------------------------------------
    @staticmethod
    def exact(x) -> Series:
        x = np.asarray(x, np.float64)
        terms = {(ZERO, 0): x} if np.any(x != 0) else {}
        return Series(terms, np.full(x.shape, np.inf), np.zeros(x.shape, np.int8))

    @staticmethod
    def zeros(shape) -> Series:
        return Series({}, np.full(shape, np.inf), np.zeros(shape, np.int8))

    @staticmethod
    def ray(x0, v) -> Series:
        x0 = np.asarray(x0, np.float64)
        v = np.broadcast_to(np.asarray(v, np.float64), x0.shape)
        s = Series.exact(x0)
        if np.any(v != 0):
            s.terms[(ONE, 0)] = v
        return s

    @property
    def shape(self) -> tuple:
        return self.H.shape

    def coef(self, e=ZERO, j: int = 0) -> np.ndarray:
        c = self.terms.get((Fraction(e), j))
        return np.zeros(self.shape) if c is None else c

    def keys(self) -> list:
        return sorted(self.terms, key=_dom)

    def is_const(self) -> bool:
        """Exactly constant along the ray (no t dependence, no flags)."""
        return (all(k == (ZERO, 0) for k in self.terms) and bool(np.all(np.isinf(self.H)))
                and not self.bad.any())

    def __repr__(self) -> str:
        parts = [f"{_fmt_c(c)}{_mono(e, j)}" for (e, j), c in
                 ((k, self.terms[k]) for k in self.keys())]
        return f"Series({' + '.join(parts) or '0'}; H={self.H}, bad={self.bad})"


def _fmt_c(c) -> str:
    c = np.asarray(c)
    return f"{float(c):.6g}" if c.size == 1 else f"{c}"


def _mono(e: Fraction, j: int) -> str:
    s = ""
    if e != 0:
        s = " t" if e == 1 else f" t^({e})" if e.denominator != 1 else f" t^{e}"
    if j:
        s += " log t" if j == 1 else f" (log t)^{j}"
    return s


def monomial(c: float, e: Fraction, j: int) -> str:
    """``1.0 t^(1/2)``, for certificates."""
    return f"{c:.6g}{_mono(Fraction(e), j)}" if (e or j) else f"{c:.6g}"


# -- normalization ----------------------------------------------------------------------------


def mk(terms: dict, H, bad, shape=None) -> Series:
    """Build a normalized Series: coefficients beyond each element's horizon or at bad elements
    are zeroed, terms at or beyond the cap (or with too many logs) are dropped, lowering the
    horizon where they were nonzero."""
    if shape is None:
        shape = np.shape(H)
    H = np.broadcast_to(np.asarray(H, np.float64), shape)
    bad = np.broadcast_to(np.asarray(bad, np.int8), shape)
    c_ = cap()
    anybad = bool(bad.any())
    out: dict = {}
    changed = False
    for (e, j), c in terms.items():
        c = np.broadcast_to(c, shape)
        if anybad:
            c = np.where(bad > 0, 0.0, c)
        nz = c != 0
        if not nz.any():
            continue
        ef = float(e)
        if ef >= c_ - EPS or j > D:
            H = np.where(nz, np.minimum(H, ef), H)
            changed = True
            continue
        out[(e, j)] = c
    finite = bool(np.isfinite(H).any()) if (changed or out) else False
    if finite:
        for k in list(out):
            c = np.where(float(k[0]) < H - EPS, out[k], 0.0)
            if np.any(c != 0):
                out[k] = c
            else:
                del out[k]
    return Series(out, H, bad)


def val(s: Series) -> np.ndarray:
    """Per element: the exponent of the leading known nonzero term (inf if none)."""
    v = np.full(s.shape, np.inf)
    for (e, _j), c in s.terms.items():
        v = np.where(c != 0, np.minimum(v, float(e)), v)
    return v


def veff(s: Series) -> np.ndarray:
    """A lower bound on each element's true valuation."""
    return np.minimum(val(s), s.H)


def exact_zero(s: Series) -> np.ndarray:
    return (val(s) == np.inf) & np.isinf(s.H) & (s.bad == OK)


def lead(s: Series):
    """Per element: exponent (inf if none known), log power and coefficient of the dominant term."""
    E = np.full(s.shape, np.inf)
    J = np.zeros(s.shape, np.int64)
    C = np.zeros(s.shape)
    found = np.zeros(s.shape, bool)
    for k in s.keys():
        c = s.terms[k]
        m = (~found) & (c != 0)
        if m.any():
            E = np.where(m, float(k[0]), E)
            J = np.where(m, k[1], J)
            C = np.where(m, c, C)
            found |= m
    return E, J, C


def lead_exact(s: Series):
    """Like :func:`lead` but with exponents as Fractions (object array)."""
    E = np.full(s.shape, None, dtype=object)
    J = np.zeros(s.shape, np.int64)
    C = np.zeros(s.shape)
    found = np.zeros(s.shape, bool)
    for k in s.keys():
        c = s.terms[k]
        m = (~found) & (c != 0)
        if m.any():
            E[m] = k[0]
            J = np.where(m, k[1], J)
            C = np.where(m, c, C)
            found |= m
    return E, J, C, found


def sign_of(s: Series):
    """Per element: (sign as t -> 0+ in {-1, 0, 1}, undecided mask). 0 means identically zero."""
    E, J, C = lead(s)
    sg = np.sign(C) * np.where(J % 2 == 1, -1.0, 1.0)
    undec = (E == np.inf) & np.isfinite(s.H) | (s.bad != OK)
    return np.where(undec, 0.0, sg), undec


# -- arithmetic -------------------------------------------------------------------------------


def _bshape(*ss: Series) -> tuple:
    return np.broadcast_shapes(*(s.shape for s in ss))


def add(a: Series, b: Series, sb: float = 1.0) -> Series:
    shape = _bshape(a, b)
    terms = {}
    for k in set(a.terms) | set(b.terms):
        ca = a.terms.get(k)
        cb = b.terms.get(k)
        if ca is None:
            terms[k] = sb * cb
        elif cb is None:
            terms[k] = ca
        else:
            c = ca + sb * cb
            m = np.abs(ca) + np.abs(cb)
            with np.errstate(invalid="ignore"):
                terms[k] = np.where((np.abs(c) <= TOL * m) & np.isfinite(c), 0.0, c)
    return mk(terms, np.minimum(a.H, b.H), np.maximum(a.bad, b.bad), shape)


def sub(a: Series, b: Series) -> Series:
    return add(a, b, -1.0)


def neg(a: Series) -> Series:
    return Series({k: -c for k, c in a.terms.items()}, a.H, a.bad)


def add_const(a: Series, c) -> Series:
    return add(a, Series.exact(c))


def mul(a: Series, b: Series, absorb: bool = False) -> Series:
    """a * b. With ``absorb`` (local partials of the reverse sweep), an identically zero factor
    absorbs an infinite (POISON) one: 0^y log 0 is the derivative of the zero function."""
    shape = _bshape(a, b)
    va, vb = veff(a), veff(b)
    with np.errstate(invalid="ignore"):
        H = np.minimum(a.H + vb, b.H + va)
    H = np.where(np.isnan(H), np.inf, H)
    za, zb = exact_zero(a), exact_zero(b)
    bad = np.maximum(a.bad, b.bad)
    if absorb:
        bad = np.where((za & (b.bad == POISON)) | (zb & (a.bad == POISON)), OK, bad)
    c_ = cap()
    acc: dict = {}
    mag: dict = {}
    for (ea, ja), ca in a.terms.items():
        for (eb, jb), cb in b.terms.items():
            e, j = ea + eb, ja + jb
            p = ca * cb
            if float(e) >= c_ - EPS or j > D:
                H = np.where(p != 0, np.minimum(H, float(e)), H)
                continue
            k = (e, j)
            if k in acc:
                prev = acc[k]
                mag[k] = (np.abs(prev) if mag[k] is None else mag[k]) + np.abs(p)
                acc[k] = prev + p
            else:
                acc[k] = p
                mag[k] = None
    for k, m in mag.items():
        if m is not None:
            c = acc[k]
            acc[k] = np.where((np.abs(c) <= TOL * m) & np.isfinite(c), 0.0, c)
    return mk(acc, H, bad, shape)


def rmul(cot: Series, partial: Series) -> Series:
    """A cotangent times a local partial in the reverse sweep: where the cotangent is identically
    zero along the ray (a structural zero), the product is exactly zero whatever the partial is
    (infinite, undecided or outside the domain): that path does not reach the output."""
    out = mul(cot, partial, absorb=True)
    zc = exact_zero(cot)
    if zc.any() and (out.bad != OK).any():
        zc = np.broadcast_to(zc, out.shape)
        terms = {k: np.where(zc, 0.0, c) for k, c in out.terms.items()}
        out = mk(terms, np.where(zc, np.inf, out.H), np.where(zc, OK, out.bad), out.shape)
    return out


def scale(a: Series, k) -> Series:
    """Multiply by an exact constant (array or float)."""
    return mul(a, Series.exact(k))


def shift(a: Series, d: Fraction, j: int = 0) -> Series:
    """Multiply by t**d (log t)**j."""
    terms = {(e + d, jj + j): c for (e, jj), c in a.terms.items()}
    return mk(terms, a.H + float(d), a.bad, a.shape)


def select(mask, a: Series, b: Series) -> Series:
    """Per element: a where mask else b."""
    shape = np.broadcast_shapes(np.shape(mask), a.shape, b.shape)
    terms = {}
    for k in set(a.terms) | set(b.terms):
        ca = a.terms.get(k, 0.0)
        cb = b.terms.get(k, 0.0)
        terms[k] = np.where(mask, ca, cb)
    return mk(terms, np.where(mask, a.H, b.H), np.where(mask, a.bad, b.bad), shape)


def restrict(a: Series, mask) -> Series:
    """a where mask, an exact zero elsewhere."""
    return select(mask, a, Series.zeros(a.shape))


def flag(a: Series, mask, code: int) -> Series:
    """Mark elements with a status code (keeps the worse one)."""
    bad = np.where(mask, np.maximum(a.bad, code), a.bad).astype(np.int8)
    return mk(a.terms, a.H, bad, a.shape)


def drop_const(a: Series) -> Series:
    terms = {k: c for k, c in a.terms.items() if k != (ZERO, 0)}
    return Series(terms, a.H, a.bad)


def horizon_min(a: Series, H) -> Series:
    return mk(a.terms, np.minimum(a.H, H), a.bad, a.shape)


def _groups(E: np.ndarray, ok: np.ndarray) -> list:
    return sorted({e for e in E[ok].ravel()}) if ok.any() else []


# -- compositions -----------------------------------------------------------------------------


def compose(delta: Series, coeffs: Callable[[int], list]) -> Series:
    """sum_k c_k delta**k for delta with positive valuation (c_k arrays). ``coeffs(N)`` returns
    c_0..c_N; the truncation lowers the horizon to (N+1) * val(delta) per element."""
    d = np.where(delta.bad != OK, np.inf, veff(delta))
    if np.any(d <= EPS):
        raise ValueError("compose needs a positive valuation")
    fin = np.isfinite(d)
    dmin = float(d[fin].min()) if fin.any() else np.inf
    N = 0 if not np.isfinite(dmin) else min(NMAX, int(math.floor((cap() - EPS) / dmin)))
    cs = coeffs(N)
    res = Series.exact(cs[N])
    for k in range(N - 1, -1, -1):
        res = add(mul(res, delta), Series.exact(cs[k]))
    res = horizon_min(res, (N + 1) * d)
    shape = _bshape(res, delta)
    return mk(res.terms, np.broadcast_to(res.H, shape), np.maximum(res.bad, delta.bad), shape)


def analytic(a: Series, taylor: Callable[[np.ndarray, int], list]) -> Series:
    """phi(a) for phi analytic at the limit a0 of every element (the caller checks). ``taylor(a0,
    N)`` returns phi^(k)(a0)/k! for k = 0..N. Elements with a pole or a log term at t^0 are
    marked UNDEC."""
    pole = _pole_mask(a)
    a0 = a.coef()
    delta = drop_const(a)
    if pole.any():
        delta = restrict(delta, ~pole)
        a0 = np.where(pole, 0.0, a0)
    a0 = np.broadcast_to(a0, a.shape)
    unknown0 = a.H <= EPS  # the limit itself is not known
    if unknown0.any():
        delta = restrict(delta, ~unknown0)
    cache: dict = {}

    def coeffs(N: int) -> list:
        if N not in cache:
            with np.errstate(all="ignore"):
                cache[N] = [np.asarray(c, np.float64) for c in taylor(a0, N)]
        return cache[N]

    out = compose(delta, coeffs)
    cs = cache[max(cache)]
    nonfin = np.zeros(a.shape, bool)
    for c in cs:
        nonfin |= ~np.isfinite(np.broadcast_to(c, a.shape))
    if nonfin.any():
        terms = {k: np.where(nonfin, 0.0, c) for k, c in out.terms.items()}
        out = Series(terms, out.H, out.bad)
    out = flag(out, pole | unknown0 | nonfin, UNDEC)
    return _keep_bad(out, a)


def _keep_bad(out: Series, a: Series) -> Series:
    return mk(out.terms, out.H, np.maximum(out.bad, np.broadcast_to(a.bad, out.shape)), out.shape)


def _pole_mask(a: Series) -> np.ndarray:
    """Elements whose series has a term with a negative exponent or a log at t^0."""
    m = np.zeros(a.shape, bool)
    for (e, j), c in a.terms.items():
        if e < 0 or (e == 0 and j > 0):
            m |= c != 0
    return m


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


def _sincos_cycle(a0, n, start: int):
    """Derivatives of sin cycle sin, cos, -sin, -cos (exactly, no sin(a0 + k pi/2) rounding)."""
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
        sq = sum(y[i] * y[k - i] for i in range(k + 1))
        y.append(((c0 if k == 0 else 0.0) + c1 * y[k] + c2 * sq) / (k + 1))
    return y


def taylor_tanh(a0, n):
    return _ode_quadratic(np.tanh(a0), n, 1.0, 0.0, -1.0)


def taylor_logistic(a0, n):
    return _ode_quadratic(1.0 / (1.0 + np.exp(-a0)), n, 0.0, 1.0, -1.0)


def taylor_tan(a0, n):
    return _ode_quadratic(np.tan(a0), n, 1.0, 0.0, 1.0)


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
    return [np.log1p(a0)] + [(-1.0) ** (k + 1) / k * u ** k for k in range(1, n + 1)]


def taylor_log1_plus(a0, n):
    """log(1 + s) at s = 0 (used with a0 = 0 only)."""
    z = np.zeros_like(a0)
    return [z] + [z + (-1.0) ** (k + 1) / k for k in range(1, n + 1)]


# -- singular elementwise rules ---------------------------------------------------------------


def rational(x: float, maxden: int = 1000) -> Fraction | None:
    if not np.isfinite(x):
        return None
    f = Fraction(float(x)).limit_denominator(maxden)
    return f if abs(float(f) - x) <= 1e-12 * max(1.0, abs(x)) else None


def _binomial(p: Fraction, n: int) -> list:
    out = [1.0]
    c = Fraction(1)
    for k in range(1, n + 1):
        c = c * (p - k + 1) / k
        out.append(float(c))
    return out


def _normalize(b: Series, m: np.ndarray, e: Fraction, C: np.ndarray) -> Series:
    """For the elements in m, whose leading term is C t^e: r = b / (C t^e) - 1 (else 0)."""
    bm = restrict(b, m)
    cm = np.where(m, C, 1.0)
    terms = {(k[0] - e, k[1]): c / cm for k, c in bm.terms.items()}
    r = mk(terms, bm.H - float(e), bm.bad, b.shape)
    return sub(r, Series.exact(m.astype(np.float64)))


def power(b: Series, p: Fraction) -> Series:
    """b**p for a rational p (sqrt, rsqrt, cbrt, 1/b, x**0.3)."""
    p = Fraction(p)
    if p == 0:
        return _keep_bad(Series.exact(np.ones(b.shape)), b)
    if p.denominator == 1 and p > 0:
        return ipow(b, int(p))
    Ef, J, C, found = lead_exact(b)
    ez = exact_zero(b)
    ok = found & (b.bad == OK)
    out = Series.zeros(b.shape)
    undec = (~found) & (~ez) & (b.bad == OK)
    Hout = np.full(b.shape, np.inf)
    if undec.any() and p > 0 and p.denominator % 2 == 1:
        # zero up to the horizon H (sign unknown, but an odd root is defined either way): the
        # power is zero up to H * p. An even root of an unknown sign stays undecided (domain).
        Hout = np.where(undec, b.H * float(p), Hout)
        undec = undec & (b.H <= EPS)
    poison = ez & (p < 0)
    logs = ok & (J > 0)
    domain = np.zeros(b.shape, bool)
    for e in _groups(Ef, ok & ~logs):
        m = ok & ~logs & (Ef == e)
        Cm = np.where(m, C, 1.0)
        neg_c = m & (Cm < 0)
        if p.denominator % 2 == 0:
            domain |= neg_c
        r = _normalize(b, m, e, C)
        shift_e = e * p
        rel_cap = cap() - float(shift_e)
        with capped(rel_cap):
            if exact_zero(r).all():
                g = Series.exact(m.astype(np.float64))
            else:
                g = compose(r, lambda N: _binomial(p, N))
        absC = np.abs(Cm) ** float(p)
        sgn = np.where(neg_c & (p.numerator % 2 == 1), -1.0, 1.0)
        g = shift(scale(g, np.where(m, sgn * absC, 0.0)), shift_e)
        g = restrict(g, m)
        out = add(out, g)
    out = mk(out.terms, np.minimum(out.H, Hout), np.maximum(out.bad, b.bad), b.shape)
    out = flag(out, poison, POISON)
    out = flag(out, undec | logs, UNDEC)
    return flag(out, domain, DOMAIN)


def ipow(b: Series, n: int) -> Series:
    """b**n for an integer n (exact multiplication for n >= 0)."""
    if n < 0:
        return power(b, Fraction(n))
    res = None
    base = b
    while n:
        if n & 1:
            res = base if res is None else mul(res, base)
        n >>= 1
        if n:
            base = mul(base, base)
    return res if res is not None else _keep_bad(Series.exact(np.ones(b.shape)), b)


def inv(b: Series) -> Series:
    return power(b, Fraction(-1))


def log(b: Series) -> Series:
    Ef, J, C, found = lead_exact(b)
    ez = exact_zero(b)
    ok = found & (b.bad == OK)
    undec = ((~found) & (~ez) & (b.bad == OK)) | (ok & (J > 0))
    domain = ok & (J == 0) & (C < 0)
    use = ok & (J == 0) & (C > 0)
    out = Series.zeros(b.shape)
    for e in _groups(Ef, use):
        m = use & (Ef == e)
        r = _normalize(b, m, e, C)
        if exact_zero(r).all():
            g = Series.zeros(b.shape)
        else:
            g = compose(r, lambda N: taylor_log1_plus(np.zeros(b.shape), N))
        g = add(g, Series.exact(np.where(m, np.log(np.where(m, C, 1.0)), 0.0)))
        if e != 0:
            lt = Series({(ZERO, 1): np.where(m, float(e), 0.0)}, np.full(b.shape, np.inf),
                        np.zeros(b.shape, np.int8))
            g = add(g, mk(lt.terms, lt.H, lt.bad))
        out = add(out, restrict(g, m))
    out = mk(out.terms, out.H, np.maximum(out.bad, b.bad), b.shape)
    out = flag(out, ez, POISON)
    out = flag(out, undec, UNDEC)
    return flag(out, domain, DOMAIN)


def exp(a: Series) -> Series:
    """exp: a k log t term becomes t^k; a negative pole vanishes beyond all orders."""
    pole = np.zeros(a.shape, bool)
    for (e, j), c in a.terms.items():
        if e < 0 or (e == 0 and j >= 2):
            pole |= c != 0
    out = Series.zeros(a.shape)
    undec = np.zeros(a.shape, bool)
    if pole.any():
        pa = Series({k: c for k, c in a.terms.items() if k[0] < 0 or (k[0] == 0 and k[1] >= 2)},
                    a.H, a.bad)
        sg, und = sign_of(pa)
        neg_pole = pole & (sg < 0) & ~und
        undec |= pole & ~neg_pole
        out = mk({}, np.where(neg_pole, BEYOND, np.inf), np.zeros(a.shape, np.int8), a.shape)
    rest = ~pole
    L = a.coef(ZERO, 1)
    qs = np.full(a.shape, None, dtype=object)
    for idx in map(tuple, np.argwhere(rest & (L != 0))):
        q = rational(float(L[idx]), 64)
        if q is None:
            undec[idx] = True
        else:
            qs[idx] = q
    qs[rest & (L == 0)] = ZERO
    base = Series({k: c for k, c in a.terms.items() if k[0] > 0 or k == (ZERO, 0)}, a.H, a.bad)
    for q in sorted({q for q in qs[rest & ~undec].ravel()}):
        m = rest & ~undec & (qs == q)
        with capped(cap() - float(q)):
            g = analytic(restrict(base, m), taylor_exp)
        g = restrict(shift(g, q), m)
        out = add(out, g)
    out = mk(out.terms, out.H, np.maximum(out.bad, a.bad), a.shape)
    return flag(out, undec, UNDEC)


def _limit_pm1(a: Series, lo: float, hi: float) -> Series | None:
    """tanh/logistic-like saturation at a pole: the limit is lo or hi beyond all orders."""
    pole = _pole_mask(a)
    if not pole.any():
        return None
    pa = Series({k: c for k, c in a.terms.items() if k[0] < 0 or (k[0] == 0 and k[1] > 0)},
                a.H, a.bad)
    sg, und = sign_of(pa)
    vals = np.where(sg > 0, hi, lo)
    s = Series.exact(np.where(pole, vals, 0.0))
    return flag(mk(s.terms, np.where(pole, BEYOND, np.inf), s.bad, a.shape), pole & und, UNDEC)


def saturating(a: Series, taylor, lo: float, hi: float) -> Series:
    sat = _limit_pm1(a, lo, hi)
    if sat is None:
        return analytic(a, taylor)
    pole = _pole_mask(a)
    reg = analytic(restrict(a, ~pole), taylor)
    return select(pole, sat, reg)


def atan2(y: Series, x: Series) -> Series:
    shape = _bshape(y, x)
    y = bcast(y, shape)
    x = bcast(x, shape)
    Ey, Jy, Cy, fy = lead_exact(y)
    Ex, Jx, Cx, fx = lead_exact(x)
    zy, zx = exact_zero(y), exact_zero(x)
    both0 = zy & zx
    ok = (fy | zy) & (fx | zx) & ~both0 & (y.bad == OK) & (x.bad == OK)
    undec = ~ok & ~both0 & (y.bad == OK) & (x.bad == OK)
    M = np.full(shape, None, dtype=object)
    for idx in map(tuple, np.argwhere(ok)):
        cands = [e for e in (Ey[idx], Ex[idx]) if e is not None]
        M[idx] = min(cands)
    logs = ok & (((Ey == M) & (Jy > 0)) | ((Ex == M) & (Jx > 0)))
    undec |= logs
    ok &= ~logs
    out = Series.zeros(shape)
    for m_ in sorted({m for m in M[ok].ravel()}):
        m = ok & (M == m_)
        yh = shift(restrict(y, m), -m_)
        xh = shift(restrict(x, m), -m_)
        x0 = xh.coef()
        y0 = yh.coef()
        ones = Series.exact(np.ones(shape))
        xs = select(m & (x0 != 0), xh, ones)
        ys = select(m & (y0 != 0), yh, ones)
        a_div = analytic(mul(yh, inv(xs)), taylor_atan)  # atan(y/x) where x0 != 0
        b_div = analytic(mul(xh, inv(ys)), taylor_atan)  # atan(x/y) where y0 != 0
        sy, _ = sign_of(yh)
        s_pi = np.where(sy < 0, -np.pi, np.pi)
        caseA = m & (x0 > 0)
        caseB = m & (x0 < 0)
        caseC = m & (x0 == 0)
        resB = add(a_div, Series.exact(np.where(caseB, s_pi, 0.0)))
        resC = sub(Series.exact(np.where(caseC, np.sign(y0) * np.pi / 2, 0.0)), b_div)
        g = select(caseA, a_div, select(caseB, resB, restrict(resC, caseC)))
        out = add(out, restrict(g, m))
    out = mk(out.terms, out.H, np.maximum(out.bad, np.maximum(y.bad, x.bad)), shape)
    return flag(out, undec, UNDEC)


def bcast(s: Series, shape) -> Series:
    if s.shape == tuple(shape):
        return s
    terms = {k: np.broadcast_to(c, shape) for k, c in s.terms.items()}
    return Series(terms, np.broadcast_to(s.H, shape), np.broadcast_to(s.bad, shape))


def apply_linear(s: Series, f: Callable, fH: Callable | None = None,
                 fbad: Callable | None = None) -> Series:
    """A linear structural map applied termwise; fH/fbad map the horizon (min-like) and flags."""
    fH = fH or f
    fbad = fbad or f
    terms = {k: np.asarray(f(c), np.float64) for k, c in s.terms.items()}
    H = np.asarray(fH(s.H), np.float64)
    bad = np.asarray(fbad(s.bad)).astype(np.int8)
    return mk(terms, H, bad, H.shape)


def stack(ss: list, axis: int = 0) -> Series:
    keys = set()
    for s in ss:
        keys |= set(s.terms)
    terms = {k: np.stack([np.broadcast_to(s.terms.get(k, 0.0), s.shape) for s in ss], axis)
             for k in keys}
    H = np.stack([s.H for s in ss], axis)
    bad = np.stack([s.bad for s in ss], axis)
    return mk(terms, H, bad, H.shape)
