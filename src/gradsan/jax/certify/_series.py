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

The elementwise rules (analytic Taylor composition here, with the coefficients of
:mod:`._taylor`; power, log, exp, atan2 in :mod:`._singular`) are the forward rules of theory.md
6.5; local partials for the reverse sweep are built from the same operations by the caller (the
rules of ``certify``).

Exponents are interned fractions (:class:`Q`): equal to, and hashing like, the Fraction of their
value, with their hash, their float and their sums cached (this bookkeeping is a good part of
every operation). Series are immutable; their valuation, leading terms and uniform horizon are
cached on first use.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Literal

import numpy as np

D = 4  # highest power of log t kept
TOL = 1e-12  # relative cancellation threshold
NEAR = 4 * TOL  # relative distance within which two values may be equal up to rounding
EPS = 1e-9  # slack when comparing exponents (rationals) with float horizons
BEYOND = 1e9  # horizon of a value that vanishes beyond all orders (exp(-1/t))
NMAX = 24  # highest Taylor order used in a composition

# status codes, in increasing order of precedence (flags combine by maximum). PUNDEC: undecided
# because a comparison or branch met a POISON value (infinite or undefined all along the ray)


class Status(enum.IntEnum):
    """The status code of a series element (``Series.bad``)."""

    OK = 0
    POISON = 1
    PUNDEC = 2
    UNDEC = 3
    DOMAIN = 4


# the codes as plain ints: numpy takes an IntEnum member for a strong int64 (an int8 array
# compared or combined with it would be widened) and is several times slower with it
OK, POISON, PUNDEC, UNDEC, DOMAIN = (int(s) for s in Status)


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
        # caches of val, exact_zero, lead (immutable)
        self._v: np.ndarray | None = None
        self._ez: np.ndarray | None = None
        self._ld: tuple | None = None
        # caches of uniform_h, uniform_veff (False: not computed)
        self._hu: float | None | Literal[False] = False
        self._vu: float | None | Literal[False] = False
        self._c = False  # an exact constant (made by `exact` / `zeros`)
        self._ma: dict | None = None  # max |coefficient| per term (see `max_abs`)
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
