"""The singular elementwise series rules (theory.md 6.5): rational powers, log, exp,
the saturating functions and atan2, on :class:`._series.Series`."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np

from ._series import (
    ANYHARD,
    BEYOND,
    DOMAIN,
    EPS,
    HARD,
    OK,
    POISON,
    SOFT,
    UNDEC,
    ZERO,
    Series,
    _bshape,
    _groups,
    _keep_bad,
    _pole_keys,
    _pole_mask,
    add,
    analytic,
    bcast,
    cap,
    capped,
    compose,
    exact_zero,
    flag,
    hard_limits,
    inf_make,
    inf_parts,
    inf_sign,
    lead,
    lead_exact,
    mk,
    mul,
    q,
    restrict,
    scale,
    select,
    set_exact,
    shift,
    sign_of,
    sub,
    with_inf,
)
from ._taylor import taylor_atan, taylor_exp, taylor_log1_plus

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
