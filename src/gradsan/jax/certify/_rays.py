"""Per-ray certification and several rays in one sweep."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import jax
import numpy as np

from ..._errors import UsageError
from ..._report import Frame
from . import _series as S
from ._point import _at_point
from ._series import DOMAIN, OK, POISON, PUNDEC, Series, Undecided
from ._sweep import bwd_jaxpr, fwd_jaxpr
from ._values import Ctx, IntVal, lift

VERDICTS = ("DEFINED", "SINGULAR", "DISCONTINUOUS", "REMOVABLE", "DOMAIN", "UNDECIDED")


# -- per-ray certification ----------------------------------------------------------------------


@dataclasses.dataclass
class RayResult:
    verdict: str
    gradient: list | None = None  # per leaf: numpy array (t^0 coefficients)
    fprime: float | None = None  # f'(x0; v) (+-inf for infinite slopes)
    limit: float | None = None  # lim f(x0 + t v)
    certificate: str = ""
    notes: list = dataclasses.field(default_factory=list)
    cap: float = 0.0
    terms: int = 0

    def to_dict(self, i: int) -> dict:
        return {
            "direction": i,
            "verdict": self.verdict,
            "certificate": self.certificate,
            "fprime": self.fprime,
            "limit": self.limit,
            "gradient": None if self.gradient is None else _listed(self.gradient),
            "notes": list(self.notes),
            "horizon_cap": self.cap,
        }


_LISTED_MAX = 100_000  # gradients up to this many numbers are nested lists (JSON), else arrays


def _listed(grads: list) -> list:
    """A ray's gradient per leaf: nested lists where small (exact in the report's JSON), numpy
    arrays beyond _LISTED_MAX numbers (a list of a big model's gradient costs as much as a good
    part of the certification)."""
    if sum(np.size(g) for g in grads) > _LISTED_MAX:
        return [np.asarray(g) for g in grads]
    return [np.asarray(g).tolist() for g in grads]


def _worst_bad(bad) -> int:
    return int(np.max(bad)) if np.size(bad) else OK


def _bad_verdict(code: int, what: str) -> RayResult:
    if code == DOMAIN:
        return RayResult(
            "DOMAIN", certificate=f"the ray leaves the domain of the function ({what})"
        )
    if code == POISON:
        return RayResult(
            "UNDECIDED",
            notes=[
                f"{what} is infinite or undefined all along the ray "
                "(the ray runs inside a singular set)"
            ],
        )
    if code == PUNDEC:
        return RayResult(
            "UNDECIDED",
            notes=[
                f"{what}: a comparison or a branch depends on a value that is infinite or undefined "
                "all along the ray (such as x / 0 of an identically zero value, whose sign is that of "
                "a floating-point zero)"
            ],
        )
    return RayResult(
        "UNDECIDED",
        notes=[f"{what}: the series rules could not decide (horizon or an undecided branch)"],
    )


def _ray(ctx: Ctx, closed, x0s: list, vs: list, fx0: float) -> RayResult:
    ctx.memo = {}
    try:
        with np.errstate(all="ignore"):  # inf and nan are handled by the rules, quietly
            return _ray_sweeps(ctx, closed, x0s, vs, fx0)
    finally:
        ctx.memo = {}


def _ray_sweeps(ctx: Ctx, closed, x0s: list, vs: list, fx0: float) -> RayResult:
    jaxpr, consts = closed.jaxpr, list(closed.consts)
    args = [Series.ray(x, v) for x, v in zip(x0s, vs)]
    data = [lift(a, v.aval) for a, v in zip(ctx.data, jaxpr.invars[len(args) :])]
    try:
        outs, tape = fwd_jaxpr(
            ctx, jaxpr, consts, args + data, [True] * len(args) + [False] * len(data)
        )
    except Undecided as e:
        return RayResult("UNDECIDED", notes=[str(e)])
    y = outs[0]
    if isinstance(y, IntVal):
        raise UsageError("gradsan.jax.certify: the loss returned an integer value")
    done, lim, fprime, removable = _value_verdict(y, fx0)
    if done is not None:
        return done
    # reverse sweep
    try:
        with S.capped(ctx.bwd_cap or S.cap()):
            gs = bwd_jaxpr(ctx, tape, [Series.exact(1.0)])
    except Undecided as e:
        return RayResult("UNDECIDED", limit=lim, fprime=fprime, notes=[str(e)])
    return _gradient_verdict(gs, x0s, vs, lim, fprime, removable)


def _value_verdict(y: Series, fx0: float):
    """(a final RayResult or None, lim f(x0 + t v), f'(x0; v), removable) from the value series
    of a scalar loss along the ray."""
    isinf, inf_sign, hard = (bool(np.reshape(z, ())) for z in S.inf_parts(y))
    if isinf:  # +-inf for every small t, or tending to it
        what = "is" if hard else "->"
        if not inf_sign:
            return (
                RayResult(
                    "SINGULAR",
                    certificate=f"the value diverges along the ray: |f(x0 + t v)| {what} inf",
                ),
                None,
                None,
                False,
            )
        iy = int(np.reshape(S.inf_parts(y)[1], ()))
        return (
            RayResult(
                "SINGULAR",
                certificate="the value diverges along the ray: "
                f"f(x0 + t v) {what} {'+' if iy > 0 else '-'}inf",
                fprime=math.copysign(math.inf, iy),
            ),
            None,
            None,
            False,
        )
    if bool(np.reshape(S.nan_mask(y), ())):  # NaN for every small t, as IEEE computes it
        return (
            RayResult(
                "DOMAIN",
                certificate="f(x0 + t v) is NaN for every small t (the ray leaves the domain of f)",
            ),
            None,
            None,
            False,
        )
    if y.bad.any():
        return _bad_verdict(_worst_bad(y.bad), "the value"), None, None, False
    E, J, C = S.lead(y)
    j0, c0 = int(J.reshape(())), float(C.reshape(()))
    Hy = float(y.H.reshape(()))
    lead_key = _lead_key(y)
    if lead_key is not None and (lead_key[0] < 0 or (lead_key[0] == 0 and lead_key[1] > 0)):
        return (
            RayResult(
                "SINGULAR",
                certificate="the value diverges along the ray: "
                f"f(x0 + t v) ~ {S.monomial(c0, lead_key[0], j0)}",
                fprime=math.copysign(math.inf, c0 * (-1) ** j0),
            ),
            None,
            None,
            False,
        )
    if Hy <= S.EPS:
        return (
            RayResult(
                "UNDECIDED", notes=["the limit of f along the ray is beyond the precision horizon"]
            ),
            None,
            None,
            False,
        )
    lim = float(y.coef().reshape(()))
    removable = False
    if math.isnan(fx0):
        removable = True
    elif not math.isfinite(fx0) or abs(lim - fx0) > 1e-9 * (1 + abs(fx0)):
        return (
            RayResult(
                "DISCONTINUOUS",
                limit=lim,
                certificate=f"f(x0 + t v) -> {lim:.10g} as t -> 0+, but f(x0) = {fx0:.10g}",
            ),
            lim,
            None,
            False,
        )
    inc = S.drop_const(y)
    ik = _lead_key(inc)
    fprime: float
    if ik is not None and (ik[0] < 1 or (ik[0] == 1 and ik[1] > 0)):
        c = float(inc.terms[ik].reshape(()))
        sign = c * (-1) ** ik[1]
        return (
            RayResult(
                "SINGULAR",
                limit=lim,
                fprime=math.copysign(math.inf, sign),
                certificate=f"f(x0 + t v) - f(x0) ~ {S.monomial(c, ik[0], ik[1])} "
                f"(infinite one-sided slope {'+' if sign > 0 else '-'}inf: not "
                "differentiable and not locally Lipschitz at x0)",
            ),
            lim,
            None,
            False,
        )
    if ik is None and Hy <= 1 + S.EPS:
        return (
            RayResult(
                "UNDECIDED",
                limit=lim,
                notes=["the increment f(x0 + t v) - f(x0) is zero up to the precision horizon"],
            ),
            lim,
            None,
            False,
        )
    if ik is not None and ik == (Fraction(1), 0):
        fprime = float(inc.terms[ik].reshape(()))
    elif Hy <= 1 + S.EPS:
        return (
            RayResult("UNDECIDED", limit=lim, notes=["f'(x0; v) is beyond the horizon"]),
            lim,
            None,
            False,
        )
    else:
        fprime = 0.0
    return None, lim, fprime, removable


def _gradient_verdict(gs: list, x0s: list, vs: list, lim, fprime, removable) -> RayResult:
    """The ray's verdict from the gradient series of the parameters (the value was fine)."""
    grads = []
    for x0, g in zip(x0s, gs):
        if g is None:
            g = Series.zeros(np.shape(x0))
        g = S.bcast(g, np.shape(x0))
        if np.count_nonzero(g.bad):
            r = _one_parameter(x0s, vs, lim, fprime, removable)
            if r is not None:
                return r
            r = _bad_verdict(_worst_bad(g.bad), "the gradient")
            r.limit, r.fprime = lim, fprime
            return r
        for (e, j), c in g.terms.items():
            if (e < 0 or (e == 0 and j > 0)) and np.any(c != 0):
                idx = tuple(int(i) for i in np.argwhere(c != 0)[0])
                cc = float(c[idx])
                return RayResult(
                    "SINGULAR",
                    limit=lim,
                    fprime=fprime,
                    certificate=f"the gradient diverges along the ray: component {list(idx)} ~ "
                    f"{S.monomial(cc, min(k[0] for k in g.terms if np.any(g.terms[k] != 0)), j)} "
                    "(not locally Lipschitz near x0, so no Clarke subgradient exists)",
                )
        if g.H.size and float(np.minimum.reduce(g.H, axis=None)) <= S.EPS:
            r = _one_parameter(x0s, vs, lim, fprime, removable)
            return (
                r
                if r is not None
                else RayResult(
                    "UNDECIDED",
                    limit=lim,
                    fprime=fprime,
                    notes=["the gradient's limit is beyond the precision horizon"],
                )
            )
        grads.append(np.reshape(g.coef(), np.shape(x0)))
    gvs = np.concatenate([np.ravel(g) for g in grads] + [np.zeros(0)]) * np.concatenate(
        [np.ravel(v) for v in vs] + [np.zeros(0)]
    )
    gv = float(np.sum(gvs))
    scale = abs(fprime) + float(np.sum(np.abs(gvs))) + 1e-300
    if abs(gv - fprime) > 1e-7 * scale + 1e-12:
        return RayResult(
            "UNDECIDED",
            limit=lim,
            fprime=fprime,
            notes=[
                f"internal check failed: G(v) . v = {gv:.10g} but f'(x0; v) = {fprime:.10g} from the "
                "forward series (an internal error in gradsan; no number is returned)"
            ],
        )
    verdict = "REMOVABLE" if removable else "DEFINED"
    cert = (
        f"f(x0) is NaN but f(x0 + t v) -> {lim:.10g}; " if removable else ""
    ) + f"lim grad f(x0 + t v) exists; f'(x0; v) = {fprime:.10g}"
    return RayResult(verdict, gradient=grads, fprime=fprime, limit=lim, certificate=cert)


def _one_parameter(x0s: list, vs: list, lim, fprime, removable) -> RayResult | None:
    """With one scalar parameter, the gradient at x0 + t v is g'(t) / v for g(t) = f(x0 + t v),
    and the value's series (termwise differentiable) gives its limit: f'(x0; v) / v. Used where
    the reverse sweep met an infinite partial times a zero that only the forward series knows
    is identically zero (x + sqrt(x + |x|) sqrt(|x| - x): jax.grad NaN, the gradient 1)."""
    if fprime is None or not math.isfinite(fprime) or sum(np.size(x) for x in x0s) != 1:
        return None
    v = float(np.ravel(np.concatenate([np.ravel(v) for v in vs]))[0])
    if v == 0.0:
        return None
    grads = [np.full(np.shape(x0), fprime / v) for x0 in x0s]
    cert = (
        (f"f(x0) is NaN but f(x0 + t v) -> {lim:.10g}; " if removable else "")
        + f"lim grad f(x0 + t v) = f'(x0; v) / v = {fprime / v:.10g} (one parameter: from the "
        "value's series, the reverse sweep having met an infinite partial)"
    )
    return RayResult(
        "REMOVABLE" if removable else "DEFINED",
        gradient=grads,
        fprime=fprime,
        limit=lim,
        certificate=cert,
    )


def _frame_of(fun) -> Frame | None:
    import inspect

    try:
        f = inspect.unwrap(fun)
        code = f.__code__
        return Frame(
            file=code.co_filename,
            line=code.co_firstlineno,
            function=getattr(f, "__name__", "function"),
        )
    except Exception:
        return None


def _arg_name(fun) -> str:
    import inspect

    try:
        ps = [
            p.name
            for p in inspect.signature(fun).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        idx = getattr(fun, "__gradsan_argnums__", (0,))
        names = [ps[i] if i < len(ps) else f"args[{i}]" for i in idx]
        return names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    except (TypeError, ValueError):
        return "args[0]"


def _lead_key(s: Series):
    """(exponent, log power) of the dominant known term of a scalar series, or None."""
    for k in s.keys():
        if np.any(s.terms[k] != 0):
            return k
    return None


def _caps(terms: int, events: dict) -> list:
    """(cap, per-equation caps, reverse sweep's cap) tried along a ray, cheapest first.

    First 1.5, the t^0 and t^1 terms: all a smooth program needs for f'(x0; v), with the
    singular points found at x0 and everything feeding them at the cap of ``terms``; the reverse
    sweep keeps the cotangents' terms below t^1 (the limit of the gradient is their t^0 term;
    a partial like sqrt'(u^2) ~ 1 / t is paid back by the u it multiplies). Then, while the rules
    run out of terms (UNDECIDED), the cap of ``terms`` everywhere, doubled twice."""
    cap0 = max(1.5, 1 + terms / 2)
    first = [(1.5, {k: cap0 for k in events}, 1.0)] if cap0 > 1.5 else []
    return first + [(cap0, {}, None), (2 * cap0, {}, None), (4 * cap0, {}, None)]


def _final(res: RayResult) -> bool:
    """A verdict that more terms would not change."""
    return res.verdict != "UNDECIDED" or any(
        "not supported" in n or "internal check" in n or "complex" in n for n in res.notes
    )


def _certify_ray(
    ctx: Ctx, closed, x0s, vs, fx0, terms: int, events: dict, start: int = 0
) -> RayResult:
    res: RayResult | None = None
    for c, caps, bc in _caps(terms, events)[start:]:
        ctx.caps, ctx.bwd_cap = caps, bc
        try:
            with S.capped(c):
                res = _ray(ctx, closed, x0s, vs, fx0)
        finally:
            ctx.caps, ctx.bwd_cap = {}, None
        res.cap = c
        if _final(res):
            return res
    return res  # type: ignore[return-value]  # _caps gives at least one cap past `start`


# -- several rays in one sweep -----------------------------------------------------------------
#
# The rays differ only in v, so their series can be carried side by side: the loss vmapped over
# a leading axis of stacked parameters (x0 in every row, one direction per row, the data shared)
# is swept once along t. Nothing couples the rows but a few conservative global bounds, so each
# row is exactly its own ray (a flag that leaks from one row to another only makes it UNDECIDED,
# and an UNDECIDED row goes on alone with more terms). The cost is about that of one ray: the
# sweeps are dominated by the bookkeeping per equation, not by the size of the arrays.


def _batched(closed, n: int, R: int, traced: dict):
    """The jaxpr of the loss vmapped over R stacked copies of its n parameter leaves (the other
    inputs shared), cached per jaxpr; None where vmap does not apply."""
    key = ("vmap", id(closed.jaxpr), R)
    hit = traced.get(key)
    if hit is not None and hit[0] is closed.jaxpr:
        return hit[1]
    jaxpr, consts = closed.jaxpr, list(closed.consts)

    def f(*args):
        return jax.core.eval_jaxpr(jaxpr, consts, *args)

    avals = [v.aval for v in jaxpr.invars]
    specs = [jax.ShapeDtypeStruct((R,) + tuple(a.shape), a.dtype) for a in avals[:n]] + [
        jax.ShapeDtypeStruct(tuple(a.shape), a.dtype) for a in avals[n:]
    ]
    try:
        bj = jax.make_jaxpr(jax.vmap(f, in_axes=(0,) * n + (None,) * (len(avals) - n)))(*specs)
    except Exception:
        bj = None
    traced[key] = (closed.jaxpr, bj)
    return bj


def _take(s: Series, r: int) -> Series:
    """Row r of a series with stacked rays (views: the rows of a normalized series are)."""
    return Series(
        {k: c[r] for k, c in s.terms.items()},
        s.H[r],
        s.bad[r],
        None if s.inf is None else np.broadcast_to(s.inf, s.shape)[r],
    )


def _rays_batched(ctx: Ctx, bclosed, x0s: list, dirs: list, fx0: float) -> list:
    """One forward and one reverse sweep of the vmapped loss for all the rays; per ray its
    RayResult. Raises Undecided (or anything) where the rays have to go one by one."""
    jaxpr, consts = bclosed.jaxpr, list(bclosed.consts)
    n, R = len(x0s), len(dirs)
    args = [
        Series.ray(np.broadcast_to(x, (R,) + np.shape(x)), np.stack([d[i] for d in dirs]))
        for i, x in enumerate(x0s)
    ]
    data = [lift(a, v.aval) for a, v in zip(ctx.data, jaxpr.invars[n:])]
    outs, tape = fwd_jaxpr(ctx, jaxpr, consts, args + data, [True] * n + [False] * len(data))
    Y = outs[0]
    if isinstance(Y, IntVal):
        raise UsageError("gradsan.jax.certify: the loss returned an integer value")
    results: list = [None] * R
    pending = []
    for r in range(R):
        done, lim, fprime, removable = _value_verdict(_take(Y, r), fx0)
        if done is not None:
            results[r] = done
        else:
            pending.append((r, lim, fprime, removable))
    if pending:
        seed = np.zeros(R)
        seed[[p[0] for p in pending]] = 1.0  # the finished rows get an exactly zero cotangent
        with S.capped(ctx.bwd_cap or S.cap()):
            gs = bwd_jaxpr(ctx, tape, [Series.exact(seed)])
        for r, lim, fprime, removable in pending:
            g = [None if gi is None else _take(gi, r) for gi in gs[:n]]
            results[r] = _gradient_verdict(g, x0s, dirs[r], lim, fprime, removable)
    return results


def _certify_rays(ctx: Ctx, closed, x0s, dirs, terms: int, data: list, traced: dict):
    """(f(x0), per direction its RayResult): the first, cheapest attempt for every ray in one
    batched sweep where possible, then each undecided ray alone with more terms."""
    n, R = len(x0s), len(dirs)
    bclosed = _batched(closed, n, R, traced) if R > 1 else None
    if bclosed is None:
        fx0, events = _at_point(closed, x0s + data)
        return _confirm_jumps(
            ctx,
            closed,
            x0s,
            dirs,
            terms,
            data,
            fx0,
            [_certify_ray(ctx, closed, x0s, v, fx0, terms, events) for v in dirs],
        )
    fx0, bevents = _at_point(bclosed, [np.broadcast_to(x, (R,) + np.shape(x)) for x in x0s] + data)
    c, caps, bc = _caps(terms, bevents)[0]
    ctx.caps, ctx.bwd_cap, ctx.memo = caps, bc, {}
    try:
        with S.capped(c), np.errstate(all="ignore"):
            results = _rays_batched(ctx, bclosed, x0s, dirs, fx0)
    except UsageError:
        raise
    except Exception:  # Undecided, or a rule that needs one ray (a batched loop condition)
        results = [None] * R
    finally:
        ctx.caps, ctx.bwd_cap, ctx.memo = {}, None, {}
    events = None  # type: ignore[assignment]  # computed below for the first ray that needs it
    for r, res in enumerate(results):
        if res is not None:
            res.cap = c
            if _final(res):
                continue
        if events is None:
            events = _at_point(closed, x0s + data)[1]
        results[r] = _certify_ray(
            ctx, closed, x0s, dirs[r], fx0, terms, events, start=1 if res is not None else 0
        )
    return _confirm_jumps(ctx, closed, x0s, dirs, terms, data, fx0, results)


def _confirm_jumps(ctx: Ctx, closed, x0s, dirs, terms: int, data: list, fx0: float, results: list):
    """A DISCONTINUOUS ray compared its limit with f(x0) evaluated in floating point, where
    rounding at a singular point can be magnified (arccos(a.b / (|a| |b|)) at a = b is 2e-8,
    not 0). Evaluated by the series rules on the zero ray instead (exact where they snap a
    rounded tie or a rounded 1), f(x0) may agree with the limits: then the rays run again
    against that value. Costs a forward sweep, only where a jump was found."""
    if not any(r.verdict == "DISCONTINUOUS" for r in results):
        return fx0, results
    jaxpr, consts = closed.jaxpr, list(closed.consts)
    args = [Series.ray(x, np.zeros(np.shape(x))) for x in x0s]
    lifted = [lift(a, v.aval) for a, v in zip(data, jaxpr.invars[len(args) :])]
    ctx.memo = {}
    try:
        with np.errstate(all="ignore"):
            y = fwd_jaxpr(
                ctx, jaxpr, consts, args + lifted, [True] * len(args) + [False] * len(lifted)
            )[0][0]
    except Undecided:
        return fx0, results
    finally:
        ctx.memo = {}
    if not isinstance(y, Series) or not y.is_const():
        return fx0, results
    f_series = float(np.reshape(y.coef(), ()))
    if not (math.isfinite(fx0) and abs(f_series - fx0) <= 1e-6 * (1 + abs(fx0))):
        return fx0, results  # not a rounding difference: keep the floating-point value
    events = _at_point(closed, x0s + data)[1]
    return f_series, [
        r
        if r.verdict != "DISCONTINUOUS"
        else _certify_ray(ctx, closed, x0s, v, f_series, terms, events)
        for r, v in zip(results, dirs)
    ]
