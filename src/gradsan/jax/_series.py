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
  ``UNDEC`` (the rules could not decide; ``PUNDEC`` when only because a comparison or a branch
  met a POISON value) and ``DOMAIN`` (the ray leaves the real domain);
* optionally (``inf``, else None) the sign of a POISON element that is known to tend to
  +inf or -inf as t -> 0+ (``log`` of an identically zero value, ``cbrt(log t)``): no series
  describes it, but it decides comparisons with bounded values. Rules that do not know about
  ``inf`` drop it, leaving a plain POISON element (conservative).

Terms at or beyond the global cap (``cap()``, in units of t) are dropped and lower the horizon
where they were nonzero. Coefficients that cancel in a sum down to ``TOL`` times the magnitude
of what was summed are set to exactly zero: cancellation is judged relative to the operands,
never to the result (the float subtlety of theory.md 6.5).

The elementwise rules (power, log, exp, analytic Taylor composition, atan2) are the forward
rules of theory.md 6.5; local partials for the reverse sweep are built from the same operations
by the caller (``_certify``).

Exponents are interned fractions (:class:`Q`): equal to, and hashing like, the Fraction of their
value, with their hash, their float and their sums cached (this bookkeeping is a good part of
every operation). Series are immutable; their valuation, leading terms and uniform horizon are
cached on first use.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from fractions import Fraction

import numpy as np

D = 4  # highest power of log t kept
TOL = 1e-12  # relative cancellation threshold
EPS = 1e-9  # slack when comparing exponents (rationals) with float horizons
BEYOND = 1e9  # horizon of a value that vanishes beyond all orders (exp(-1/t))
NMAX = 24  # highest Taylor order used in a composition

# status codes, in increasing order of precedence (flags combine by maximum). PUNDEC: undecided
# because a comparison or branch met a POISON value (infinite or undefined all along the ray)
OK, POISON, PUNDEC, UNDEC, DOMAIN = 0, 1, 2, 3, 4


class Q(Fraction):
    """An interned rational exponent: equal to (and hashing like) the Fraction of its value,
    with the hash and the float cached, and sums / differences / products of two interned
    exponents memoized (the exponent bookkeeping of every series operation)."""

    __slots__ = ("_hash", "_float")

    def __hash__(self):
        return self._hash

    def __float__(self):
        return self._float

    def __eq__(self, other):
        return self is other or Fraction.__eq__(self, other)

    def __add__(self, other):
        return _memo(_ADD, Fraction.__add__, self, other)

    __radd__ = __add__

    def __sub__(self, other):
        return _memo(_SUB, Fraction.__sub__, self, other)

    def __rsub__(self, other):
        return q(Fraction.__rsub__(self, other))

    def __mul__(self, other):
        return q(Fraction.__mul__(self, other))

    __rmul__ = __mul__

    def __neg__(self):
        return q(Fraction.__neg__(self))

    def __repr__(self):
        return f"Fraction({self.numerator}, {self.denominator})"

    def __reduce__(self):
        return (q, (Fraction(self.numerator, self.denominator),))


_INTERN: dict = {}
_ADD: dict = {}
_SUB: dict = {}


def _memo(table: dict, op, a, b):
    """``q(op(a, b))``, remembered in ``table`` when both are interned exponents."""
    if type(b) is not Q:
        return q(op(a, b))
    r = table.get((a, b))
    if r is None:
        r = table[(a, b)] = q(op(a, b))
    return r


def q(x):
    """The interned exponent equal to x (a Fraction or an int); anything else is returned as
    is (NotImplemented, floats)."""
    if type(x) is Q:
        return x
    if isinstance(x, int):
        x = Fraction(x)
    elif not isinstance(x, Fraction):
        return x
    key = (x.numerator, x.denominator)
    r = _INTERN.get(key)
    if r is None:
        r = Fraction.__new__(Q, *key)
        r._hash = Fraction.__hash__(r)
        r._float = key[0] / key[1]
        _INTERN[key] = r
    return r


ZERO = q(0)
ONE = q(1)

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
    __slots__ = ("terms", "H", "bad", "inf", "_v", "_ez", "_ld", "_c", "_hu", "_vu", "_pz", "_ma")

    def __init__(self, terms: dict, H: np.ndarray, bad: np.ndarray, inf=None):
        self.terms = terms
        self.H = H
        self.bad = bad
        self.inf = inf
        self._v = self._ez = self._ld = None  # caches of val, exact_zero, lead (immutable)
        self._hu = self._vu = False  # caches of uniform_h, uniform_veff (False: not computed)
        self._c = False  # an exact constant (made by `exact` / `zeros`)
        self._ma = None  # max |coefficient| per term (see `max_abs`)
        self._pz = False  # a constant +0.0 (IEEE: 1 / +0.0 = +inf), see `exact`

    # -- constructors ---------------------------------------------------------------------------
    @staticmethod
    def exact(x) -> Series:
        x = np.asarray(x, np.float64)
        if not np.isfinite(x).all():  # a constant +-inf (a mask, a max's start) or NaN
            fin = np.isfinite(x)
            code = np.where(fin, 0, np.where(np.isnan(x), NAN, np.sign(np.nan_to_num(x)) * HARD))
            return with_inf(Series.exact(np.where(fin, x, 0.0)), code)
        terms = {(ZERO, 0): x} if np.count_nonzero(x) else {}
        s = Series(terms, np.full(x.shape, np.inf), np.zeros(x.shape, np.int8))
        s._c = True
        if not terms:  # a constant zero: its IEEE sign is known (x / 0.0 is sign(x) inf)
            s._pz = not np.signbit(x).any()
        return s

    @staticmethod
    def zeros(shape) -> Series:
        s = Series({}, np.full(shape, np.inf), np.zeros(shape, np.int8))
        s._c = True
        return s

    @staticmethod
    def ray(x0, v) -> Series:
        x0 = np.asarray(x0, np.float64)
        v = np.asarray(v, np.float64)
        if v.shape != x0.shape:
            v = np.broadcast_to(v, x0.shape)
        s = Series.exact(x0)
        if np.count_nonzero(v):
            s.terms[(ONE, 0)] = v
            s._c = False
        return s

    @property
    def shape(self) -> tuple:
        return self.H.shape

    def coef(self, e=ZERO, j: int = 0) -> np.ndarray:
        c = self.terms.get((q(Fraction(e)), j))
        return np.zeros(self.shape) if c is None else c

    def keys(self) -> list:
        return sorted(self.terms, key=_dom)

    def is_const(self) -> bool:
        """Exactly constant along the ray (no t dependence, no flags)."""
        return (
            all(k == (ZERO, 0) for k in self.terms)
            and bool(np.all(np.isinf(self.H)))
            and not np.count_nonzero(self.bad)
        )

    def __repr__(self) -> str:
        parts = [
            f"{_fmt_c(c)}{_mono(e, j)}" for (e, j), c in ((k, self.terms[k]) for k in self.keys())
        ]
        return f"Series({' + '.join(parts) or '0'}; H={self.H}, bad={self.bad})"


def _fmt_c(c) -> str:
    c = np.asarray(c)
    return f"{float(c):.6g}" if c.size == 1 else f"{c}"


def _mono(e: Fraction, j: int) -> str:
    s = ""
    if e != 0:
        s = (
            " t"
            if e == 1
            else f" t^{e}"
            if e.denominator == 1
            else f" t^({e})"
            if e.denominator <= 1000
            else f" t^{float(e):.10g}"
        )
    if j:
        s += " log t" if j == 1 else f" (log t)^{j}"
    return s


def monomial(c: float, e: Fraction, j: int) -> str:
    """``1.0 t^(1/2)``, for certificates."""
    return f"{c:.6g}{_mono(q(Fraction(e)), j)}" if (e or j) else f"{c:.6g}"


# -- normalization ----------------------------------------------------------------------------


def mk(terms: dict, H, bad, shape=None) -> Series:
    """Build a normalized Series: coefficients beyond each element's horizon or at bad elements
    are zeroed, terms at or beyond the cap (or with too many logs) are dropped, lowering the
    horizon where they were nonzero."""
    if shape is None:
        shape = np.shape(H)
    shape = tuple(shape)
    H = np.asarray(H, np.float64)
    if H.shape != shape:
        H = np.full(shape, H) if H.ndim == 0 else np.broadcast_to(H, shape)
    bad = np.asarray(bad, np.int8)
    if bad.shape != shape:
        bad = np.full(shape, bad, np.int8) if bad.ndim == 0 else np.broadcast_to(bad, shape)
    c_ = _CAP[0] - EPS
    good = (bad == OK) if np.count_nonzero(bad) else None
    out: dict = {}
    for (e, j), c in terms.items():
        if type(e) is not Q:
            e = q(e)
        c = np.asarray(c)
        if c.shape != shape:
            c = np.broadcast_to(c, shape)
        if good is not None:
            c = np.where(good, c, 0.0)
        if not np.count_nonzero(c):
            continue
        ef = e._float
        if ef >= c_ or j > D:
            H = np.where(c != 0, np.minimum(H, ef), H)
            continue
        out[(e, j)] = c
    if out and H.size:
        hmin = float(np.minimum.reduce(H, axis=None)) - EPS
        if hmin < np.inf:
            for k in list(out):
                ef = k[0]._float
                if ef < hmin:
                    continue  # below every element's horizon
                c = np.where(ef < H - EPS, out[k], 0.0)
                if np.count_nonzero(c):
                    out[k] = c
                else:
                    del out[k]
    return Series(out, H, bad)


def val(s: Series) -> np.ndarray:
    """Per element: the exponent of the leading known nonzero term (inf if none)."""
    v = s._v
    if v is None:
        items = sorted(s.terms.items(), key=lambda kc: -float(kc[0][0]))
        if items and np.count_nonzero(items[-1][1]) == items[-1][1].size:
            v = np.full(s.shape, float(items[-1][0][0]))  # the lowest term is nonzero everywhere
        else:
            v = np.full(s.shape, np.inf)
            for (e, _j), c in items:
                v = np.where(c != 0, float(e), v)  # the smallest exponent is written last
        s._v = v
    return v


def max_abs(s: Series, key) -> float:
    """max |c| over the elements of the term ``key`` (0 if absent), cached on the series."""
    ma = s._ma
    if ma is None:
        ma = s._ma = {}
    v = ma.get(key)
    if v is None:
        c = s.terms.get(key)
        v = ma[key] = float(np.max(np.abs(c))) if c is not None and c.size else 0.0
    return v


def veff(s: Series) -> np.ndarray:
    """A lower bound on each element's true valuation."""
    return np.minimum(val(s), s.H)


def _uniform(x: np.ndarray) -> float | None:
    if not x.size:
        return None
    lo = float(x.min())
    return lo if lo == float(x.max()) else None


def uniform_h(s: Series) -> float | None:
    """The horizon if it is the same for every element, else None."""
    if s._hu is False:
        s._hu = _uniform(s.H)
    return s._hu


def uniform_veff(s: Series) -> float | None:
    """veff if it is the same for every element, else None."""
    if s._vu is False:
        s._vu = _uniform(veff(s))
    return s._vu


def exact_zero(s: Series) -> np.ndarray:
    ez = s._ez
    if ez is None:
        if s.terms:
            ez = (val(s) == np.inf) & np.isinf(s.H) & (s.bad == OK)
        else:
            ez = np.isinf(s.H) & (s.bad == OK)
        s._ez = ez
    return ez


def lead(s: Series):
    """Per element: exponent (inf if none known), log power and coefficient of the dominant term."""
    ld = s._ld
    if ld is not None:
        return ld
    keys = s.keys()
    if len(keys) == 1:
        (e, j), c = keys[0], s.terms[keys[0]]
        nz = c != 0
        ld = (np.where(nz, float(e), np.inf), np.where(nz, j, 0), np.where(nz, c, 0.0))
    else:
        E = np.full(s.shape, np.inf)
        J = np.zeros(s.shape, np.int64)
        C = np.zeros(s.shape)
        found = np.zeros(s.shape, bool)
        for k in keys:
            c = s.terms[k]
            m = (~found) & (c != 0)
            if np.count_nonzero(m):
                E = np.where(m, float(k[0]), E)
                J = np.where(m, k[1], J)
                C = np.where(m, c, C)
                found |= m
        ld = (E, J, C)
    s._ld = ld
    return ld


def lead_exact(s: Series):
    """Like :func:`lead` but with exponents as Fractions (object array)."""
    E = np.full(s.shape, None, dtype=object)
    J = np.zeros(s.shape, np.int64)
    C = np.zeros(s.shape)
    found = np.zeros(s.shape, bool)
    for k in s.keys():
        c = s.terms[k]
        m = (~found) & (c != 0)
        if np.count_nonzero(m):
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


# -- signed infinities (POISON elements known to tend to +inf or -inf) ------------------------


# ``inf`` codes of POISON elements: +-SOFT tends to +-inf (cbrt(log t)), +-HARD is +-inf for every
# small t (log 0), ANYSOFT / ANYHARD the same with an unknown sign (x / 0: the sign of the zero);
# NAN is NaN for every small t whatever that sign (sin of an infinity)
SOFT, HARD, ANYSOFT, ANYHARD, NAN = 1, 3, 2, 4, 5


def inf_code(s: Series) -> np.ndarray:
    """Per element: the ``inf`` code where s is a POISON element that carries one, else 0."""
    if s.inf is None:
        return np.zeros(s.shape, np.int8)
    return np.where(s.bad == POISON, np.broadcast_to(s.inf, s.shape), 0).astype(np.int8)


def inf_parts(s: Series, shape=None):
    """(infinite, sign in {-1, 0 (unknown), 1}, hard) per element."""
    c = inf_code(s)
    if shape is not None:
        c = np.broadcast_to(c, shape)
    a = np.abs(c)
    return (
        (c != 0) & (c != NAN),
        np.where((a == SOFT) | (a == HARD), np.sign(c), 0),
        (a == HARD) | (c == ANYHARD),
    )


def nan_mask(s: Series) -> np.ndarray:
    """Elements that are NaN for every small t (see NAN)."""
    return inf_code(s) == NAN


def periodic_at_inf(out: Series, a: Series) -> Series:
    """sin, cos or tan of a (out): NaN for every small t where a is +-inf for every small t."""
    if a.inf is None:
        return out
    ia, _, hard = inf_parts(a)
    return with_inf(out, np.where(ia & hard, NAN, 0))


def inf_make(isinf, sgn, hard) -> np.ndarray:
    """The ``inf`` codes of :func:`inf_parts`' triple."""
    known = np.where(hard, HARD, SOFT) * np.sign(sgn)
    return np.where(isinf, np.where(sgn != 0, known, np.where(hard, ANYHARD, ANYSOFT)), 0).astype(
        np.int8
    )


def inf_sign(s: Series) -> np.ndarray:
    """Per element: +1 or -1 where s is known to tend to +inf or -inf, else 0."""
    return inf_parts(s)[1].astype(np.int8)


def with_inf(s: Series, code) -> Series:
    """s with the elements where ``code`` is nonzero replaced by POISON elements carrying it."""
    code = np.broadcast_to(np.asarray(code, np.int8), s.shape)
    m = code != 0
    if not np.count_nonzero(m):
        return s
    terms = {}
    for k, c in s.terms.items():
        c = np.where(m, 0.0, c)
        if np.count_nonzero(c):
            terms[k] = c
    return Series(
        terms,
        np.where(m, np.inf, s.H),
        np.where(m, POISON, s.bad).astype(np.int8),
        np.where(m, code, inf_code(s)).astype(np.int8),
    )


def set_exact(s: Series, mask, values) -> Series:
    """s with the elements in ``mask`` replaced by exact constants (flags cleared)."""
    mask = np.broadcast_to(np.asarray(mask, bool), s.shape)
    if not np.count_nonzero(mask):
        return s
    vals = np.broadcast_to(np.asarray(values, np.float64), s.shape)
    terms = {k: np.where(mask, 0.0, c) for k, c in s.terms.items()}
    c0 = np.where(mask, vals, terms.get((ZERO, 0), 0.0))
    terms[(ZERO, 0)] = c0
    out = mk(terms, np.where(mask, np.inf, s.H), np.where(mask, OK, s.bad), s.shape)
    out.inf = None if s.inf is None else np.where(mask, 0, s.inf).astype(np.int8)
    return out


def hard_limits(a: Series, lo, hi):
    """(mask, values): where a is +-inf for every small t (a hard infinity of known sign), the
    value ``hi`` (at +inf) or ``lo`` (at -inf) of a function saturating there, exactly as IEEE
    arithmetic gives it (tanh(+inf) = 1, exp(-inf) = 0)."""
    ia, sg, hard = inf_parts(a)
    m = ia & hard & (sg != 0)
    return m, np.where(sg > 0, hi, lo)


def _neg_code(c: np.ndarray) -> np.ndarray:
    return np.where((c == ANYSOFT) | (c == ANYHARD), c, -c).astype(np.int8)


def bounded(s: Series) -> np.ndarray:
    """Elements known to stay bounded as t -> 0+: no pole, no log at t^0, and a known limit."""
    return (s.bad == OK) & ~_pole_mask(s) & (s.H > EPS)


def far_sign(s: Series):
    """Per element: (the sign of s where it is known to stay away from zero as t -> 0+, i.e. a
    known leading term with exponent <= 0, else 0; the sign where it is known to be nonzero for
    all small t, i.e. any known leading term, else 0)."""
    E, J, C = lead(s)
    sg = np.sign(C) * np.where(J % 2 == 1, -1.0, 1.0)
    ok = s.bad == OK
    return (
        np.where(ok & (E <= EPS), sg, 0.0).astype(np.int8),
        np.where(ok & (E < np.inf), sg, 0.0).astype(np.int8),
    )


# -- arithmetic -------------------------------------------------------------------------------


def _bshape(*ss: Series) -> tuple:
    return np.broadcast_shapes(*(s.shape for s in ss))


def _cancel(c: np.ndarray, m) -> np.ndarray:
    """c with the coefficients that cancelled down to TOL times the magnitude m of what was
    summed set to exactly zero (never an infinite one)."""
    small = np.abs(c) <= TOL * m
    if np.count_nonzero(small):
        return np.where(small & np.isfinite(c), 0.0, c)
    return c


def _shape2(a: Series, b: Series) -> tuple:
    return a.shape if a.shape == b.shape else np.broadcast_shapes(a.shape, b.shape)


def add(a: Series, b: Series, sb: float = 1.0) -> Series:
    if a is b and sb == -1.0:  # the same function of t: a - a is exactly zero where defined
        out = Series({}, np.where(a.bad == OK, np.inf, a.H), a.bad)
        if a.inf is None:
            return out
        # inf - inf is NaN for each t (a hard infinity, or NaN), a soft one is finite: 0
        ia, _, hard = inf_parts(a)
        soft = ia & ~hard
        out = set_exact(out, soft, 0.0)
        return with_inf(out, np.where((ia & hard) | nan_mask(a), NAN, 0))
    shape = _shape2(a, b)
    if not b.terms and a.shape == shape and _is_exact(b, 0.0):  # a + 0 is a itself (kept for
        return a  # a - a and a / a)
    if sb == 1.0 and not a.terms and b.shape == shape and _is_exact(a, 0.0):
        return b
    terms = {}
    bt = b.terms
    for k, ca in a.terms.items():
        cb = bt.get(k)
        if cb is None:
            terms[k] = ca
            continue
        c = ca + cb if sb == 1.0 else ca - cb if sb == -1.0 else ca + sb * cb
        terms[k] = _cancel(c, np.abs(ca) + np.abs(cb))
    for k, cb in bt.items():
        if k not in terms:
            terms[k] = cb if sb == 1.0 else -cb if sb == -1.0 else sb * cb
    H = a.H if a.H is b.H else np.minimum(a.H, b.H)
    bad = a.bad if a.bad is b.bad else np.maximum(a.bad, b.bad)
    out = mk(terms, H, bad, shape)
    if a.inf is not None or b.inf is not None:
        out = with_inf(out, _add_inf(a, b, sb < 0, shape))
    return out


def sum_inf(x: Series, reduce: Callable) -> np.ndarray:
    """The ``inf`` codes of a sum of x's elements (``reduce(mask, np.any / np.all)`` reduces a
    boolean mask over the summed axes), by the rule of :func:`_add_inf`: infinities of one known
    sign, with every other term finite for each t (a hard one) or bounded (only soft ones)."""
    ia, sa, ha = inf_parts(x)
    pos, neg = reduce(ia & (sa > 0), np.any), reduce(ia & (sa < 0), np.any)
    unknown = reduce(ia & (sa == 0), np.any)
    hard = reduce(ia & ha, np.any)
    fin, bnd = reduce(ia | (x.bad == OK), np.all), reduce(ia | bounded(x), np.all)
    isinf = (pos ^ neg) & ~unknown & np.where(hard, fin, bnd)
    return inf_make(isinf, np.where(pos, 1, -1), hard)


def _add_inf(a: Series, b: Series, minus: bool, shape) -> np.ndarray:
    """inf + inf of the same sign; a hard inf plus anything finite for each t; a soft inf plus
    anything bounded."""
    ia, sa, ha = inf_parts(a, shape)
    ib, sb, hb = inf_parts(b, shape)
    if minus:
        sb = -sb
    fin_a, fin_b = np.broadcast_to(a.bad == OK, shape), np.broadcast_to(b.bad == OK, shape)
    bnd_a, bnd_b = np.broadcast_to(bounded(a), shape), np.broadcast_to(bounded(b), shape)
    both = ia & ib & (sa == sb) & (sa != 0)
    only_a = ia & ~ib & ((ha & fin_b) | (~ha & bnd_b))
    only_b = ib & ~ia & ((hb & fin_a) | (~hb & bnd_a))
    code = inf_make(
        both | only_a | only_b,
        np.where(only_b, sb, sa),
        np.where(both, ha | hb, np.where(only_b, hb, ha)),
    )
    # NaN for every t: a NaN operand, or +inf + -inf of two hard infinities
    nan = (
        np.broadcast_to(nan_mask(a), shape)
        | np.broadcast_to(nan_mask(b), shape)
        | (ha & hb & ia & ib & (sa * sb < 0))
    )
    return np.where(nan, NAN, code).astype(np.int8)


def sub(a: Series, b: Series) -> Series:
    return add(a, b, -1.0)


def neg(a: Series) -> Series:
    return Series(
        {k: -c for k, c in a.terms.items()}, a.H, a.bad, None if a.inf is None else _neg_code(a.inf)
    )


def add_const(a: Series, c) -> Series:
    return add(a, Series.exact(c))


def _is_exact(s: Series, value: float) -> bool:
    """Every element is the exact constant ``value`` (no flags, infinite horizon)."""
    if value == 0.0:
        if s.terms:
            return False
    elif len(s.terms) != 1 or (ZERO, 0) not in s.terms:
        return False
    if s.inf is not None or np.count_nonzero(s.bad) or not np.all(np.isinf(s.H)):
        return False
    return value == 0.0 or bool(np.all(s.terms[(ZERO, 0)] == value))


def mul(a: Series, b: Series, absorb: bool = False) -> Series:
    """a * b. With ``absorb`` (local partials of the reverse sweep), an identically zero factor
    absorbs an infinite (POISON) one: 0^y log 0 is the derivative of the zero function."""
    shape = _shape2(a, b)
    if b._c and a.shape == shape and _is_exact(b, 1.0):  # a * 1 is a itself
        return a
    if a._c and b.shape == shape and _is_exact(a, 1.0):
        return b
    if a._c and a.terms:
        return _mul_const(b, a.terms[(ZERO, 0)], a, absorb, shape)
    if b._c and b.terms:
        return _mul_const(a, b.terms[(ZERO, 0)], b, absorb, shape)
    va, vb = veff(a), veff(b)
    H = np.minimum(a.H + vb, b.H + va)
    bad = a.bad if a.bad is b.bad else np.maximum(a.bad, b.bad)
    if absorb and np.count_nonzero(bad):
        za, zb = exact_zero(a), exact_zero(b)
        bad = np.where((za & (b.bad == POISON)) | (zb & (a.bad == POISON)), OK, bad)
    c_ = _CAP[0] - EPS
    acc: dict = {}
    mag: dict = {}
    full: dict = {}  # per coefficient array: nonzero everywhere?
    for (ea, ja), ca in a.terms.items():
        for (eb, jb), cb in b.terms.items():
            e, j = ea + eb, ja + jb
            if float(e) >= c_ or j > D:  # dropped: lowers the horizon where the product is not 0
                fa = full.get(id(ca))
                if fa is None:
                    fa = full[id(ca)] = bool(ca.all())
                fb = full.get(id(cb))
                if fb is None:
                    fb = full[id(cb)] = bool(cb.all())
                if fa and fb:
                    H = np.minimum(H, float(e))
                else:
                    H = np.where((ca != 0) & (cb != 0), np.minimum(H, float(e)), H)
                continue
            p = ca * cb
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
            acc[k] = _cancel(acc[k], m)
    out = mk(acc, H, bad, shape)
    if not absorb and (a.inf is not None or b.inf is not None):
        out = with_inf(out, _mul_inf(a, b, shape))
    return out


def _mul_const(b: Series, c: np.ndarray, a: Series, absorb: bool, shape) -> Series:
    """b times the exact constant series a = c: every term scaled, no cancellation; the horizon
    is b's where c != 0 and infinite where c == 0 (an exact zero)."""
    terms = {k: c * cb for k, cb in b.terms.items()}
    if c.all():
        H, zero = b.H, None
    else:
        zero = c == 0
        H = np.where(zero, np.inf, b.H)
    bad = b.bad
    if absorb and zero is not None:
        bad = np.where(zero & (b.bad == POISON), OK, bad)
    out = mk(terms, H, bad, shape)
    if not absorb and b.inf is not None:
        out = with_inf(out, _mul_inf(a, b, shape))
    return out


def _mul_inf(a: Series, b: Series, shape) -> np.ndarray:
    """inf * inf; a hard inf times anything nonzero for each small t; a soft inf times anything
    that stays away from zero. The sign is the product's where both signs are known."""
    ia, sa, ha = inf_parts(a, shape)
    ib, sb, hb = inf_parts(b, shape)
    far_a, nz_a = (np.broadcast_to(x, shape) for x in far_sign(a))
    far_b, nz_b = (np.broadcast_to(x, shape) for x in far_sign(b))
    both = ia & ib
    only_a = ia & ~ib & ((ha & (nz_b != 0)) | (~ha & (far_b != 0)))
    only_b = ib & ~ia & ((hb & (nz_a != 0)) | (~hb & (far_a != 0)))
    sgn = np.where(both, sa * sb, np.where(only_a, sa * nz_b, sb * nz_a))
    code = inf_make(both | only_a | only_b, sgn, np.where(both, ha | hb, np.where(only_a, ha, hb)))
    nan = np.broadcast_to(nan_mask(a), shape) | np.broadcast_to(nan_mask(b), shape)
    return np.where(nan, NAN, code).astype(np.int8)


def rmul(cot: Series, partial: Series) -> Series:
    """A cotangent times a local partial in the reverse sweep: where the cotangent is identically
    zero along the ray (a structural zero), the product is exactly zero whatever the partial is
    (infinite, undecided or outside the domain): that path does not reach the output."""
    out = mul(cot, partial, absorb=True)
    if not np.count_nonzero(out.bad):
        return out
    zc = exact_zero(cot)
    if np.count_nonzero(zc):
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
    mask = np.asarray(mask)
    if mask.all() and a.shape == shape:
        return a
    if not np.count_nonzero(mask) and b.shape == shape:
        return b
    terms = {}
    for k in set(a.terms) | set(b.terms):
        ca = a.terms.get(k, 0.0)
        cb = b.terms.get(k, 0.0)
        terms[k] = np.where(mask, ca, cb)
    out = mk(terms, np.where(mask, a.H, b.H), np.where(mask, a.bad, b.bad), shape)
    if a.inf is not None or b.inf is not None:
        out.inf = np.where(mask, inf_code(a), inf_code(b)).astype(np.int8)
    return out


def restrict(a: Series, mask) -> Series:
    """a where mask, an exact zero elsewhere."""
    return select(mask, a, Series.zeros(a.shape))


def flag(a: Series, mask, code: int) -> Series:
    """Mark elements with a status code (keeps the worse one)."""
    mask = np.asarray(mask)
    if not np.count_nonzero(mask):
        return a
    bad = np.where(mask, np.maximum(a.bad, code), a.bad).astype(np.int8)
    out = mk(a.terms, a.H, bad, a.shape)
    out.inf = a.inf  # only read where bad == POISON, which flagging never lowers to
    return out


def flag_codes(a: Series, codes) -> Series:
    """Mark elements with per-element status codes (OK where nothing is to be marked)."""
    codes = np.broadcast_to(np.asarray(codes, np.int8), a.shape)
    if not np.count_nonzero(codes):
        return a
    out = mk(a.terms, a.H, np.maximum(a.bad, codes), a.shape)
    out.inf = a.inf
    return out


def drop_const(a: Series) -> Series:
    terms = {k: c for k, c in a.terms.items() if k != (ZERO, 0)}
    return Series(terms, a.H, a.bad)


def horizon_min(a: Series, H) -> Series:
    return mk(a.terms, np.minimum(a.H, H), a.bad, a.shape)


def _groups(E: np.ndarray, ok: np.ndarray) -> list:
    return sorted({e for e in E[ok].ravel()}) if np.count_nonzero(ok) else []


# -- compositions -----------------------------------------------------------------------------


def compose(delta: Series, coeffs: Callable[[int], list]) -> Series:
    """sum_k c_k delta**k for delta with positive valuation (c_k arrays). ``coeffs(N)`` returns
    c_0..c_N; the truncation lowers the horizon to (N+1) * val(delta) per element."""
    d = veff(delta)
    if np.count_nonzero(delta.bad):
        d = np.where(delta.bad != OK, np.inf, d)
    dmin = float(d.min()) if d.size else np.inf
    if dmin <= EPS:
        raise ValueError("compose needs a positive valuation")
    # (a cap at or below 0, relative to a shift the caller applies, keeps no term at all: the
    # constant term is then dropped by mk, lowering the horizon to 0)
    N = 0 if not np.isfinite(dmin) else max(0, min(NMAX, int(math.floor((cap() - EPS) / dmin))))
    cs = coeffs(N)
    res = Series.exact(cs[N])
    for k in range(N - 1, -1, -1):
        res = add(mul(res, delta), Series.exact(cs[k]))
    shape = _shape2(res, delta)
    return mk(res.terms, np.minimum(res.H, (N + 1) * d), np.maximum(res.bad, delta.bad), shape)


def _compose1(delta: Series, coeffs: Callable[[int], list]) -> Series | None:
    """`compose` where it stops at the linear term (N = 1) and delta has no flags and no t^0
    term: c0 + c1 delta has no cancellation, so it is built directly; None otherwise."""
    if (
        not delta.terms
        or delta.inf is not None
        or np.count_nonzero(delta.bad)
        or any(float(e) <= 0 for e, _j in delta.terms)
    ):
        return None
    d = veff(delta)
    dmin = float(np.minimum.reduce(d, axis=None)) if d.size else np.inf
    if (
        not dmin > EPS
        or not np.isfinite(dmin)
        or min(NMAX, int(math.floor((cap() - EPS) / dmin))) != 1
    ):
        return None
    c0, c1 = (np.asarray(c, np.float64) for c in coeffs(1))
    terms = {k: c1 * c for k, c in delta.terms.items()}
    terms[(ZERO, 0)] = c0
    H = delta.H if np.count_nonzero(c1) == c1.size else np.where(c1 != 0, delta.H, np.inf)
    return mk(
        terms,
        np.minimum(H, 2 * d),
        np.int8(OK),
        np.broadcast_shapes(np.shape(c0), np.shape(c1), delta.shape),
    )


def analytic(a: Series, taylor: Callable[[np.ndarray, int], list]) -> Series:
    """phi(a) for phi analytic at the limit a0 of every element (the caller checks). ``taylor(a0,
    N)`` returns phi^(k)(a0)/k! for k = 0..N. Elements with a pole or a log term at t^0 are
    marked UNDEC."""
    pole = _pole_mask(a) if _pole_keys(a) else None
    a0 = a.coef()
    delta = drop_const(a)
    if pole is not None and np.count_nonzero(pole):
        delta = restrict(delta, ~pole)
        a0 = np.where(pole, 0.0, a0)
    else:
        pole = None
    a0 = np.broadcast_to(a0, a.shape)
    unknown0 = None
    if a.H.size and float(a.H.min()) <= EPS:  # the limit itself is not known
        unknown0 = a.H <= EPS
        delta = restrict(delta, ~unknown0)
    cache: dict = {}

    def coeffs(N: int) -> list:
        if N not in cache:  # (inf and nan coefficients are flagged below)
            cache[N] = [np.asarray(c, np.float64) for c in taylor(a0, N)]
        return cache[N]

    out = _compose1(delta, coeffs) if pole is None and unknown0 is None else None
    if out is None:
        out = compose(delta, coeffs)
    cs = cache[max(cache)]
    undec = None
    if not all(np.isfinite(c).all() for c in cs):
        nonfin = np.zeros(a.shape, bool)
        for c in cs:
            nonfin |= ~np.isfinite(np.broadcast_to(c, a.shape))
        terms = {k: np.where(nonfin, 0.0, c) for k, c in out.terms.items()}
        out = Series(terms, out.H, out.bad)
        undec = nonfin
    for m in (pole, unknown0):
        if m is not None:
            undec = m if undec is None else undec | m
    if undec is not None:
        out = flag(out, undec, UNDEC)
    return _keep_bad(out, a)


def _keep_bad(out: Series, a: Series) -> Series:
    if not np.count_nonzero(a.bad):
        return out
    return mk(out.terms, out.H, np.maximum(out.bad, np.broadcast_to(a.bad, out.shape)), out.shape)


def _pole_keys(a: Series) -> bool:
    """Whether a has a term that could be a pole (a negative exponent, or a log at t^0)."""
    return any(float(e) < 0 or (j > 0 and float(e) == 0) for (e, j) in a.terms)


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


# -- singular elementwise rules ---------------------------------------------------------------


def rational(x: float, maxden: int = 1000, exact: bool = False) -> Fraction | None:
    """The rational of denominator at most ``maxden`` within rounding of x; failing that, with
    ``exact``, x itself as a (dyadic) fraction, else None."""
    if not np.isfinite(x):
        return None
    f = q(Fraction(float(x)).limit_denominator(maxden))
    if abs(float(f) - x) <= 1e-12 * max(1.0, abs(x)):
        return f
    return q(Fraction(float(x))) if exact else None


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


def power(b: Series, p: Fraction, odd_roots: bool = True) -> Series:
    """b**p for a rational p (sqrt, rsqrt, cbrt, 1/b, x**0.3). With ``odd_roots`` an odd
    denominator is a real root of a negative base (cbrt); without it (IEEE ``pow``, and so
    ``x ** (1/3)``) a negative base with a non-integer exponent is outside the domain."""
    p = q(Fraction(p))
    if p == 0:
        return _keep_bad(Series.exact(np.ones(b.shape)), b)
    if p.denominator == 1 and p > 0:
        return ipow(b, int(p))
    even = p.denominator % 2 == 0 or (not odd_roots and p.denominator != 1)
    Ef, J, C, found = lead_exact(b)
    ez = exact_zero(b)
    ok = found & (b.bad == OK)
    out = Series.zeros(b.shape)
    undec = (~found) & (~ez) & (b.bad == OK)
    Hout = np.full(b.shape, np.inf)
    if np.count_nonzero(undec) and p > 0 and not even:
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
        if even:
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
    # A leading log factor, c t^e (log t)^j: its sign decides the domain, and where |b|**p
    # grows without bound (|b| -> inf with p > 0, or |b| -> 0 with p < 0) the power is a signed
    # infinity (cbrt(log t) -> -inf). Otherwise ((log t)^(j p) -> 0) it stays undecided.
    odd_num = p.numerator % 2 == 1
    grow = np.zeros(b.shape, np.int8)
    if np.count_nonzero(logs):
        E = lead(b)[0]
        sgl = np.sign(C) * np.where(J % 2 == 1, -1.0, 1.0)
        if even:
            domain |= logs & (sgl < 0)
        g_ = logs & ~domain & (((E <= EPS) & (p > 0)) | ((E > EPS) & (p < 0)))
        grow = np.where(g_, np.where((sgl < 0) & odd_num, -SOFT, SOFT), grow).astype(np.int8)
        logs = logs & ~domain & ~g_
    if p > 0 and b.inf is not None:  # (+-inf)**p, of either kind
        ib, sg_, hard = inf_parts(b)
        if even:
            domain |= ib & (sg_ < 0)
        sg_ = np.where(sg_ < 0, -1 if odd_num else 1, np.where(sg_ > 0, 1, 0 if odd_num else 1))
        grow = np.where(ib & ~domain & ~(even & (sg_ == 0)), inf_make(ib, sg_, hard), grow)
    # 0**p, p < 0: +-inf, the sign of the zero deciding; +inf for the constant +0.0
    grow = np.where(poison, HARD if b._pz else ANYHARD, grow)
    out = mk(out.terms, np.minimum(out.H, Hout), np.maximum(out.bad, b.bad), b.shape)
    out = flag(out, poison, POISON)
    out = flag(out, undec | logs, UNDEC)
    out = with_inf(flag(out, domain, DOMAIN), grow)
    if p < 0 and b.inf is not None:  # (+-inf)**p = 0 for every t where b is +-inf for every t
        ib, _, hard = inf_parts(b)
        out = set_exact(out, ib & hard, 0.0)
    return out


def ipow(b: Series, n: int) -> Series:
    """b**n for an integer n (exact multiplication for n >= 0)."""
    if n < 0:
        return power(b, q(n))
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
    return power(b, q(-1))


def log(b: Series) -> Series:
    Ef, J, C, found = lead_exact(b)
    ez = exact_zero(b)
    ok = found & (b.bad == OK)
    undec = (~found) & (~ez) & (b.bad == OK)
    domain = ok & (J == 0) & (C < 0)
    use = ok & (J == 0) & (C > 0)
    # log 0 = -inf; a leading log factor c t^e (log t)^j: negative is outside the domain,
    # positive gives a signed infinity (|b| -> inf for e <= 0, b -> 0+ for e > 0); log(+inf) = +inf
    grow = np.where(ez, -HARD, 0).astype(np.int8)
    logs = ok & (J > 0)
    if np.count_nonzero(logs):
        E = lead(b)[0]
        sgl = np.sign(C) * np.where(J % 2 == 1, -1.0, 1.0)
        domain |= logs & (sgl < 0)
        grow = np.where(logs & (sgl > 0), np.where(E <= EPS, SOFT, -SOFT), grow).astype(np.int8)
    if b.inf is not None:
        ib, sg_, hard = inf_parts(b)
        domain |= ib & (sg_ < 0)
        grow = np.where(ib & (sg_ > 0), np.where(hard, HARD, SOFT), grow).astype(np.int8)
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
            lt = Series(
                {(ZERO, 1): np.where(m, float(e), 0.0)},
                np.full(b.shape, np.inf),
                np.zeros(b.shape, np.int8),
            )
            g = add(g, mk(lt.terms, lt.H, lt.bad))
        out = add(out, restrict(g, m))
    out = mk(out.terms, out.H, np.maximum(out.bad, b.bad), b.shape)
    out = flag(out, ez, POISON)
    out = flag(out, undec, UNDEC)
    return with_inf(flag(out, domain, DOMAIN), grow)


def exp(a: Series) -> Series:
    """exp: a k log t term becomes t^k; a negative pole vanishes beyond all orders."""
    pole = np.zeros(a.shape, bool)
    for (e, j), c in a.terms.items():
        if e < 0 or (e == 0 and j >= 2):
            pole |= c != 0
    out = Series.zeros(a.shape)
    undec = np.zeros(a.shape, bool)
    pos_pole = np.zeros(a.shape, bool)
    if np.count_nonzero(pole):
        pa = Series(
            {k: c for k, c in a.terms.items() if k[0] < 0 or (k[0] == 0 and k[1] >= 2)}, a.H, a.bad
        )
        sg, und = sign_of(pa)
        neg_pole = pole & (sg < 0) & ~und
        pos_pole = pole & (sg > 0) & ~und  # exp(+pole) tends to +inf
        undec |= pole & ~neg_pole & ~pos_pole
        out = mk({}, np.where(neg_pole, BEYOND, np.inf), np.zeros(a.shape, np.int8), a.shape)
    rest = ~pole
    L = a.coef(ZERO, 1)
    qs = np.full(a.shape, None, dtype=object)
    for idx in map(tuple, np.argwhere(rest & (L != 0))):
        r = rational(float(L[idx]), 64)
        if r is None:
            undec[idx] = True
        else:
            qs[idx] = r
    qs[rest & (L == 0)] = ZERO
    base = Series({k: c for k, c in a.terms.items() if k[0] > 0 or k == (ZERO, 0)}, a.H, a.bad)
    for r in sorted(set(qs[rest & ~undec].ravel())):
        m = rest & ~undec & (qs == r)
        with capped(cap() - float(r)):
            g = analytic(restrict(base, m), taylor_exp)
        g = restrict(shift(g, r), m)
        out = add(out, g)
    out = mk(out.terms, out.H, np.maximum(out.bad, a.bad), a.shape)
    out = flag(out, undec, UNDEC)
    if a.inf is not None:  # exp(+inf) = +inf
        ia, sg_, hard = inf_parts(a)
        out = with_inf(
            out, np.where(ia & (sg_ > 0) & (out.bad == POISON), np.where(hard, HARD, SOFT), 0)
        )
    out = with_inf(out, np.where(pos_pole & (out.bad == OK), SOFT, 0))
    if a.inf is not None:  # exp(-inf) = 0
        m, _ = hard_limits(a, 0.0, 0.0)
        out = set_exact(out, m & (inf_sign(a) < 0), 0.0)
    return out


def _limit_pm1(a: Series, lo: float, hi: float) -> Series | None:
    """tanh/logistic-like saturation at a pole: the limit is lo or hi beyond all orders."""
    if not _pole_keys(a):
        return None
    pole = _pole_mask(a)
    if not np.count_nonzero(pole):
        return None
    pa = Series(
        {k: c for k, c in a.terms.items() if k[0] < 0 or (k[0] == 0 and k[1] > 0)}, a.H, a.bad
    )
    sg, und = sign_of(pa)
    vals = np.where(sg > 0, hi, lo)
    s = Series.exact(np.where(pole, vals, 0.0))
    return flag(mk(s.terms, np.where(pole, BEYOND, np.inf), s.bad, a.shape), pole & und, UNDEC)


def _log_pole_mask(a: Series) -> np.ndarray:
    """Elements whose only divergent term is c log t (no negative power, no (log t)^2...)."""
    lp = np.zeros(a.shape, bool)
    other = np.zeros(a.shape, bool)
    for (e, j), c in a.terms.items():
        if e == 0 and j == 1:
            lp |= c != 0
        elif e < 0 or (e == 0 and j > 1):
            other |= c != 0
    return lp & ~other


def saturating(
    a: Series, taylor, lo: float, hi: float, via_exp: Callable[[Series], Series] | None = None
) -> Series:
    """A function saturating at lo and hi (tanh, logistic, erf): at a pole, the limit beyond all
    orders, except where the pole is c log t and ``via_exp`` (the function written with exp) is
    given: exp(c log t) = t^c is algebraic, not beyond all orders (logistic(log t) = t / (1 + t))."""
    sat = _limit_pm1(a, lo, hi)
    if sat is None:
        out = analytic(a, taylor)
    else:
        pole = _pole_mask(a)
        reg = analytic(restrict(a, ~pole), taylor)
        out = select(pole, sat, reg)
        if via_exp is not None:
            lp = _log_pole_mask(a)
            if np.count_nonzero(lp):
                out = select(lp, via_exp(restrict(a, lp)), out)
    if a.inf is not None:
        out = set_exact(out, *hard_limits(a, lo, hi))
    return out


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
    out = flag(out, undec, UNDEC)
    if y.inf is not None or x.inf is not None:
        m, vals = atan2_at_inf(y, x)
        out = set_exact(out, m, vals)
    return out


def atan2_at_inf(y: Series, x: Series):
    """(mask, values) where y or x is +-inf for every small t (a hard infinity of known sign)
    and atan2 is constant there as IEEE arithmetic gives it: atan2(y, +inf) = 0 for a finite y,
    atan2(y, -inf) = sign(y) pi (y known nonzero), atan2(+-inf, x) = +-pi/2 for a finite x,
    and +-pi/4 or +-3pi/4 for two infinities."""
    shape = _bshape(y, x)
    iy, sy, hy = inf_parts(y, shape)
    ix, sx, hx = inf_parts(x, shape)
    hy, hx = iy & hy & (sy != 0), ix & hx & (sx != 0)
    fy, fx = np.broadcast_to(y.bad == OK, shape), np.broadcast_to(x.bad == OK, shape)
    sg, und = sign_of(bcast(y, shape))
    m_x = hx & fy & ((sx > 0) | (~und & (sg != 0)))
    m_y = hy & fx
    m_xy = hx & hy
    vals = np.where(
        m_xy,
        sy * np.where(sx > 0, np.pi / 4, 3 * np.pi / 4),
        np.where(m_y, sy * np.pi / 2, np.where(sx > 0, 0.0, sg * np.pi)),
    )
    return m_x | m_y | m_xy, vals


def bcast(s: Series, shape) -> Series:
    if s.shape == tuple(shape):
        return s
    terms = {k: np.broadcast_to(c, shape) for k, c in s.terms.items()}
    return Series(
        terms,
        np.broadcast_to(s.H, shape),
        np.broadcast_to(s.bad, shape),
        None if s.inf is None else np.broadcast_to(s.inf, shape),
    )


def apply_linear(
    s: Series,
    f: Callable,
    fH: Callable | None = None,
    fbad: Callable | None = None,
    finf: Callable | None = None,
) -> Series:
    """A linear structural map applied termwise; fH/fbad map the horizon (min-like) and flags;
    ``finf`` (a pure rearrangement: reshape, broadcast, slice) carries signed infinities."""
    fH = fH or f
    fbad = fbad or f
    terms = {k: np.asarray(f(c), np.float64) for k, c in s.terms.items()}
    H = np.asarray(fH(s.H), np.float64)
    bad = np.asarray(fbad(s.bad)).astype(np.int8)
    out = mk(terms, H, bad, H.shape)
    if finf is not None and s.inf is not None:
        out.inf = np.asarray(finf(inf_code(s))).astype(np.int8)
    return out


def stack(ss: list, axis: int = 0) -> Series:
    keys = set()
    for s in ss:
        keys |= set(s.terms)
    terms = {
        k: np.stack([np.broadcast_to(s.terms.get(k, 0.0), s.shape) for s in ss], axis) for k in keys
    }
    H = np.stack([s.H for s in ss], axis)
    bad = np.stack([s.bad for s in ss], axis)
    out = mk(terms, H, bad, H.shape)
    if any(s.inf is not None for s in ss):
        out.inf = np.stack([inf_code(s) for s in ss], axis)
    return out
