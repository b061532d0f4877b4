"""gradsan.jax.nansafe: evaluate a gradient program with Tier A structural-zero repair.

The program of ``fun`` (usually ``jax.grad(loss)`` or a whole train step) is traced once per
input structure with ``jax.make_jaxpr`` and re-emitted equation by equation: inside the caller's
trace under ``jax.jit`` (one compiled program), op by op when called eagerly (nested jits stay
jits, as in ``fun``). Alongside every value the re-emission
carries a little metadata (theory.md 6.5, Tier A):

- ``sz``: the elements that are *structurally* zero, i.e. zero on a whole neighbourhood of the
  inputs (the unselected branch of a ``where`` whose comparison holds with a strict margin, a
  constant zero, an integer/bool path), as a static ``False``/``True`` or a boolean array;
- ``lc``: for booleans and integers, the elements that are locally constant (``x > 0`` with
  ``x != 0``);
- ``taint``: whether the value can be non-finite at all (it depends on a singular operation:
  ``div``, ``log``, ``sqrt``, ``pow``, ...), a static flag;
- ``const``: whether it depends on the inputs at all.

Only backward ``mul``/``div``/``dot_general`` equations whose other factor is tainted and whose
zero side is not statically "never structural" are rewritten, so a finite program is re-emitted
unchanged. A rewritten product is ``where(SZ & ~isfinite(p), 0, p)``: only non-finite products
change, and only where the zero is structural; the result is then the true gradient (G3). A
``0 * inf`` whose zero is only numerical stays non-finite and is reported as "unresolved" (G6);
``mode="strong_zero"`` applies ``0 * inf := 0`` everywhere instead and labels each place as a
convention.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from .. import _catalog
from .._errors import UsageError
from .._report import Frame, Report
from .._report._build import catalog_finding
from ._call import arg_labels, check_args, check_callable
from ._compat import bind as _bind
from ._compat import closed as _closed
from ._guard import _flag as _finite_flag
from ._source import exclude_gradsan, place

exclude_gradsan()

_MODES = ("structural", "strong_zero")

# operations whose output can be non-finite from finite inputs
_SINGULAR = {
    "div",
    "log",
    "log1p",
    "sqrt",
    "rsqrt",
    "cbrt",
    "pow",
    "atan2",
    "acos",
    "asin",
    "atanh",
    "acosh",
    "tan",
    "lgamma",
    "digamma",
    "erf_inv",
    "exp",
    "exp2",
    "expm1",
    "rem",
    "igamma",
    "igammac",
    "polygamma",
    "zeta",
    "bessel_i0e",
    "bessel_i1e",
    "regularized_incomplete_beta",
    "random_gamma_grad",
    "logistic",
}
# elementwise operations f with f(0) = 0 exactly, and one float operand: sz passes through
_ZERO_TO_ZERO = {
    "neg",
    "convert_element_type",
    "reduce_precision",
    "copy",
    "copy_p",
    "real",
    "imag",
    "conj",
    "sin",
    "tan",
    "tanh",
    "sinh",
    "asin",
    "atan",
    "asinh",
    "atanh",
    "expm1",
    "log1p",
    "abs",
    "sign",
    "sqrt",
    "cbrt",
    "erf",
    "erf_inv",
    "optimization_barrier",
}
# operations that move elements around: apply the same primitive to the mask (operand 0)
_SHAPE = {
    "reshape",
    "squeeze",
    "expand_dims",
    "broadcast_in_dim",
    "transpose",
    "rev",
    "slice",
    "dynamic_slice",
    "gather",
}
_ADDITIVE = {"add", "add_any", "sub", "max", "min"}
_REDUCE = {"reduce_sum", "reduce_max", "reduce_min"}
_CUMULATIVE = {"cumsum", "cummax", "cummin"}
_COMPARE = {"eq", "ne", "gt", "ge", "lt", "le"}
_DISC = {
    "floor",
    "ceil",
    "round",
    "sign",
    "rem",
    "nextafter",
    "is_finite",
    "argmax",
    "argmin",
    "population_count",
    "clz",
}
# elementwise primitives that give the same result on 0-d operands (uniform constants)
_SCALAR_OK = {
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "convert_element_type",
    "max",
    "min",
    "integer_pow",
    "sqrt",
    "rsqrt",
    "cbrt",
    "exp",
    "exp2",
    "log",
    "log1p",
    "expm1",
    "pow",
    "abs",
    "sign",
    "eq",
    "ne",
    "gt",
    "ge",
    "lt",
    "le",
    "and",
    "or",
    "not",
    "xor",
    "select_n",
    "tanh",
    "logistic",
    "square",
    "sin",
    "cos",
    "tan",
    "atan2",
    "floor",
    "ceil",
    "round",
    "rem",
    "is_finite",
    "reduce_precision",
    "real",
    "imag",
    "nextafter",
    "clamp",
}
_BILINEAR = {"dot_general", "conv_general_dilated"}
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}
# forward primitive -> the catalog entry for the singular point a 0 * inf comes from
_ENTRY = {
    "sqrt": "sqrt-at-zero",
    "rsqrt": "rsqrt-at-zero",
    "cbrt": "cbrt-at-zero",
    "pow": "pow-fractional-at-zero",
    "integer_pow": "integer-pow-negative-at-zero",
    "div": "div-by-zero",
    "log": "log-at-zero",
    "log1p": "log1p-at-minus-one",
    "acos": "acos-at-one",
    "asin": "asin-at-one",
    "atanh": "atanh-at-one",
    "acosh": "acosh-at-one",
    "tan": "tan-at-pole",
    "atan2": "atan2-at-origin",
    "lgamma": "lgamma-at-pole",
    "digamma": "digamma-at-pole",
    "erf_inv": "erf-inv-at-one",
}


# -- masks: static False / True, a boolean array, or a lazily computed one -----------------------


class _Lazy:
    __slots__ = ("fn", "val")

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn
        self.val = None

    def get(self):
        if self.val is None:
            self.val = self.fn()
            self.fn = None
        return self.val


def _is_static(m) -> bool:
    return m is True or m is False


def _arr(m, shape) -> jax.Array:
    """The mask as a boolean array of ``shape``."""
    if m is True or m is False:
        return jnp.full(shape, m, dtype=bool)
    a = m.get() if isinstance(m, _Lazy) else m
    if a.shape != tuple(shape):
        a = jnp.broadcast_to(a, shape)
    return a


def _and(ms: list, shape) -> Any:
    if any(m is False for m in ms):
        return False
    rest = [m for m in ms if m is not True]
    if not rest:
        return True
    if len(rest) == 1:
        return rest[0]

    def f():
        out = _arr(rest[0], shape)
        for m in rest[1:]:
            out = out & _arr(m, shape)
        return out

    return _Lazy(f)


def _or(ms: list, shape) -> Any:
    if any(m is True for m in ms):
        return True
    rest = [m for m in ms if m is not False]
    if not rest:
        return False

    def f():
        out = _arr(rest[0], shape)
        for m in rest[1:]:
            out = out | _arr(m, shape)
        return out

    return _Lazy(f)


def _kind(m) -> int:
    return 0 if m is False else 1 if m is True else 2


@dataclasses.dataclass
class M:
    """What is known about one value."""

    sz: Any = False  # float: structurally-zero elements
    lc: Any = False  # bool/int: locally constant elements
    taint: bool = False  # can be non-finite
    const: bool = False  # independent of the inputs
    disc: bool = False  # can be discontinuous
    why: frozenset = frozenset()  # where its structural zeros come from (site keys / words)
    margin: Any = None  # comparison results: lazy |lhs - rhs|, for the report
    cval: Any = None  # a constant's concrete value (a 0-d array: the same in every element)
    lcsrc: frozenset = frozenset()  # the comparisons a boolean comes from (for the report)


def _is_float(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


def _sig(m: M) -> tuple:
    cv = None
    if m.cval is not None and np.ndim(m.cval) == 0:
        a = np.asarray(m.cval)
        cv = (a.dtype.str, a.tobytes())
    return (_kind(m.sz), _kind(m.lc), m.taint, m.const, m.disc, m.why, cv, m.lcsrc)


def _join(a: tuple, b: tuple) -> tuple:
    def k(x, y):
        return x if x == y else 2

    return (
        k(a[0], b[0]),
        k(a[1], b[1]),
        a[2] or b[2],
        a[3] and b[3],
        a[4] or b[4],
        a[5] | b[5],
        a[6] if a[6] == b[6] else None,
        a[7] | b[7],
    )


def _sz_of_cval(cv) -> Any:
    z = np.asarray(cv == 0)
    if z.all():
        return True
    if not z.any():
        return False
    return z


def _cmeta(cv, fl: bool) -> M:
    if not fl:
        return M(sz=False, lc=True, const=True, cval=cv)
    taint = not bool(np.isfinite(cv).all())
    return M(
        sz=_sz_of_cval(cv),
        lc=True,
        taint=taint,
        const=True,
        cval=cv,
        why=frozenset({"constant zero"}),
    )


def _const_meta(val, aval=None) -> M:
    """A constant or literal: zeros are structural, booleans/integers locally constant."""
    if aval is None:
        aval = jax.ShapeDtypeStruct(np.shape(val), jnp.result_type(val))
    taint = True
    if not isinstance(val, jax.core.Tracer):
        try:
            a = np.asarray(val, dtype=aval.dtype)
            if a.size == 1:
                a = a.reshape(())
            return _cmeta(a, _is_float(aval))
        except Exception:  # pragma: no cover - exotic dtypes
            taint = True
    if _is_float(aval):
        return M(
            sz=_Lazy(lambda: jnp.asarray(val) == 0),
            lc=True,
            taint=taint,
            const=True,
            why=frozenset({"constant zero"}),
        )
    return M(sz=False, lc=True, const=True)


# -- contexts, sites and flags ---------------------------------------------------------------


@dataclasses.dataclass
class _Ctx:
    backward: bool
    frame: Frame | None
    path: tuple
    library: str | None
    flags: dict  # site key -> traced count (sum) or margin (min)


@dataclasses.dataclass
class _Site:
    key: tuple
    kind: str  # "struct", "conv", "unres", "margin"
    op: str  # the equation's primitive (mul, div, dot_general, select_n)
    primitive: str  # the forward operation it belongs to (sqrt)
    where: Frame | None
    library: str | None
    why: frozenset = frozenset()


_MIN_KINDS = ("margin",)


def _zero_where_structural(p, cond, shape):
    """``p`` with its non-finite entries set to 0 where ``cond`` (the structural-zero mask, or
    a static True/False) holds: the Tier A repair of a product or quotient."""
    if cond is False:
        return p
    bad = _nonfinite(p)
    fix = bad if cond is True else bad & _arr(cond, shape)
    return lax.select(fix, jnp.zeros_like(p), p)


def _shape(v) -> tuple:
    return tuple(np.shape(v))


def _nonfinite(x):
    return ~lax.is_finite(x) if jnp.issubdtype(x.dtype, jnp.floating) else ~jnp.isfinite(x)


class _Emitter:
    def __init__(self, mode: str, report: bool):
        self.mode = mode
        self.report = report
        self.sites: dict[tuple, _Site] = {}
        self.key_prims: dict[Any, str] = {}  # source position -> first singular forward op
        self._jits: dict = {}

    # -- flags ---------------------------------------------------------------------------------
    def _flag(self, ctx: _Ctx, key: tuple, value) -> None:
        if key[-1] in _MIN_KINDS:
            prev = ctx.flags.get(key)
            ctx.flags[key] = value if prev is None else jnp.minimum(prev, value)
        else:
            prev = ctx.flags.get(key)
            ctx.flags[key] = value if prev is None else prev + value

    def _site(self, eqn, ctx: _Ctx, kind: str, why=frozenset()) -> tuple:
        key = (*ctx.path, id(eqn), kind)
        if key not in self.sites:
            pl = place(eqn.source_info)
            where = pl.user if pl.user is not None else ctx.frame
            lib = pl.library if pl.user is None or pl.library else ctx.library
            lib = lib or ctx.library
            prim = self.key_prims.get(pl.key) if pl.key is not None else None
            self.sites[key] = _Site(
                key, kind, eqn.primitive.name, prim or eqn.primitive.name, where, lib, why
            )
        else:
            self.sites[key].why = self.sites[key].why | why
        return key

    # -- the loop --------------------------------------------------------------------------------
    def run(self, jaxpr, consts, const_metas, args, arg_metas, ctx: _Ctx):
        env: dict = {}
        menv: dict = {}
        for v, c, m in zip(jaxpr.constvars, consts, const_metas):
            env[v], menv[v] = c, m
        for v, a, m in zip(jaxpr.invars, args, arg_metas):
            env[v], menv[v] = a, m

        def read(vs) -> tuple[list, list]:
            vals = [v.val if isinstance(v, jcore.Literal) else env[v] for v in vs]
            metas = [
                _const_meta(v.val, v.aval) if isinstance(v, jcore.Literal) else menv[v] for v in vs
            ]
            return vals, metas

        for eqn in jaxpr.eqns:
            outs, ometas = self.eqn(eqn, *read(eqn.invars), ctx)
            for v, o, m in zip(eqn.outvars, outs, ometas):
                if not isinstance(v, jcore.DropVar):
                    env[v], menv[v] = o, m
        return read(jaxpr.outvars)

    def _backward(self, eqn, ctx: _Ctx) -> bool:
        ns = str(eqn.source_info.name_stack)
        if "rematted_computation" in ns:
            return False
        return ctx.backward or "transpose" in ns

    def _sub_ctx(self, eqn, ctx: _Ctx, flags: dict | None = None) -> _Ctx:
        pl = place(eqn.source_info)
        return _Ctx(
            backward=self._backward(eqn, ctx),
            frame=pl.user if pl.user is not None else ctx.frame,
            path=(*ctx.path, id(eqn)),
            library=ctx.library or (pl.library if pl.user is None else None),
            flags=ctx.flags if flags is None else flags,
        )

    def eqn(self, eqn, invals, inmetas, ctx: _Ctx):
        name = eqn.primitive.name
        if name in ("jit", "pjit"):
            return self._jit(eqn, invals, inmetas, ctx)
        if name in _CALLS:
            jaxpr, consts = _closed(eqn.params[_CALLS[name]])
            sub = self._sub_ctx(eqn, ctx)
            if name.startswith("custom_vjp") and not jaxpr.constvars:
                consts = []
            return self.run(
                jaxpr, consts, [_const_meta(c, None) for c in consts], invals, inmetas, sub
            )
        if name in ("remat2", "checkpoint"):
            return self._remat(eqn, invals, inmetas, ctx)
        if name == "scan":
            return self._scan(eqn, invals, inmetas, ctx)
        if name == "while":
            return self._while(eqn, invals, inmetas, ctx)
        if name == "cond":
            return self._cond(eqn, invals, inmetas, ctx)
        return self.first_order(eqn, invals, inmetas, ctx)

    # -- first-order equations -------------------------------------------------------------------
    def first_order(self, eqn, invals, ms, ctx: _Ctx):
        name = eqn.primitive.name
        bwd = self._backward(eqn, ctx)
        if not bwd and (name in _SINGULAR or name == "integer_pow" and eqn.params["y"] < 0):
            pl = place(eqn.source_info)
            if pl.key is not None:
                self.key_prims.setdefault(pl.key, name)
        if bwd and name == "mul" and any(m.taint for m in ms):
            outs = [self._mul(eqn, invals, ms, ctx)]
        elif bwd and name == "div":
            outs = [self._div(eqn, invals, ms, ctx)]
        elif bwd and name == "dot_general" and any(m.taint for m in ms):
            outs = _bind(eqn, self._dot_operands(eqn, invals, ms, ctx))
        else:
            outs = _bind(eqn, invals)
        return outs, self.metas(eqn, invals, ms, outs, bwd, ctx)

    def _zero_side(self, ms, vals, i: int, shape):
        """Mask of factor i's zeros that may be set to 0 against the other factor."""
        other = ms[1 - i]
        if self.mode == "strong_zero":
            return _Lazy(lambda: _arr(vals[i] == 0, shape)) if other.taint else False
        return ms[i].sz if other.taint else False

    def _mul(self, eqn, vals, ms, ctx: _Ctx):
        (p,) = _bind(eqn, vals)
        shape = _shape(p)
        cond = _or(
            [self._zero_side(ms, vals, 0, shape), self._zero_side(ms, vals, 1, shape)], shape
        )
        out = _zero_where_structural(p, cond, shape)
        if self.report:
            bad = _nonfinite(p)
            a, b = (jnp.broadcast_to(v, shape) for v in vals)
            meets = ((a == 0) & _nonfinite(b)) | ((b == 0) & _nonfinite(a))
            self._report_repair(eqn, ctx, ms, bad, cond, meets, shape, [0, 1])
        return out

    def _div(self, eqn, vals, ms, ctx: _Ctx):
        (p,) = _bind(eqn, vals)
        shape = _shape(p)
        if self.mode == "strong_zero":
            cond = _Lazy(lambda: _arr(vals[0] == 0, shape))
        else:
            cond = ms[0].sz
        out = _zero_where_structural(p, cond, shape)
        if self.report:
            bad = _nonfinite(p)
            a = jnp.broadcast_to(vals[0], shape)
            self._report_repair(eqn, ctx, ms, bad, cond, a == 0, shape, [0])
        return out

    def _report_repair(self, eqn, ctx, ms, bad, cond, meets, shape, zero_sides):
        why = frozenset().union(*(ms[i].why for i in zero_sides if ms[i].sz is not False))
        if self.mode == "strong_zero":
            struct = _or(
                [
                    ms[i].sz
                    if (len(ms) == 1 or ms[1 - i].taint or eqn.primitive.name == "div")
                    else False
                    for i in zero_sides
                ],
                shape,
            )
            s = bad & _arr(struct, shape) if struct is not False else None
            if s is not None:
                self._flag(ctx, self._site(eqn, ctx, "struct", why), jnp.sum(s, dtype=jnp.int32))
            c = bad & _arr(cond, shape) if cond is not False else None
            if c is not None:
                if s is not None:
                    c = c & ~s
                self._flag(ctx, self._site(eqn, ctx, "conv"), jnp.sum(c, dtype=jnp.int32))
            rest = bad & meets & (~_arr(cond, shape) if cond is not False else True)
        else:
            if cond is not False:
                self._flag(
                    ctx,
                    self._site(eqn, ctx, "struct", why),
                    jnp.sum(bad & _arr(cond, shape), dtype=jnp.int32),
                )
            rest = bad & meets
            if cond is not False:
                rest = rest & ~_arr(cond, shape)
        self._flag(ctx, self._site(eqn, ctx, "unres"), jnp.sum(rest, dtype=jnp.int32))

    def _dot_operands(self, eqn, vals, ms, ctx: _Ctx):
        """Zero the non-finite entries of a factor that meet only (structural) zeros."""
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        out = list(vals)
        for i in (0, 1):
            j = 1 - i
            if not ms[i].taint:
                continue
            x, y = vals[i], vals[j]
            if self.mode == "strong_zero":
                live = y != 0
            elif ms[j].sz is False:
                continue
            elif ms[j].sz is True:
                live = False
            else:
                live = ~_arr(ms[j].sz, _shape(y))
            xc, xb = (lc, lb) if i == 0 else (rc, rb)
            yc, yb = (rc, rb) if i == 0 else (lc, lb)
            if live is False:
                used = jnp.zeros(_shape(x), bool)
            else:
                free = tuple(a for a in range(np.ndim(y)) if a not in yc and a not in yb)
                red = jnp.any(live, axis=free) if free else live
                # remaining y axes in increasing order -> the matching x axes
                kept = [a for a in range(np.ndim(y)) if a not in free]
                to_x = [xb[list(yb).index(a)] if a in yb else xc[list(yc).index(a)] for a in kept]
                order = np.argsort(to_x)
                red = jnp.transpose(red, order) if len(order) > 1 else red
                used = lax.broadcast_in_dim(red, _shape(x), tuple(sorted(to_x)))
            bad = _nonfinite(x)
            fix = bad & ~used
            out[i] = lax.select(fix, jnp.zeros_like(x), x)
            if self.report:
                kind = "conv" if self.mode == "strong_zero" else "struct"
                self._flag(
                    ctx, self._site(eqn, ctx, kind, ms[j].why), jnp.sum(fix, dtype=jnp.int32)
                )
        return out

    # -- metadata rules --------------------------------------------------------------------------
    def metas(self, eqn, invals, ms, outs, bwd: bool, ctx: _Ctx) -> list[M]:
        name = eqn.primitive.name
        const = all(m.const for m in ms)
        taint = (
            any(m.taint for m in ms)
            or name in _SINGULAR
            or (name == "integer_pow" and eqn.params["y"] < 0)
        )
        res = []
        for k, (v, o) in enumerate(zip(eqn.outvars, outs)):
            aval = v.aval
            if not hasattr(aval, "dtype"):
                res.append(M(const=const))
                continue
            shape = _shape(o)
            fl = _is_float(aval)
            if const:
                cvs = self._cval(eqn, ms, outs)
                if cvs is not None:
                    res.append(_cmeta(cvs[k], fl))
                    continue
                if fl:
                    res.append(
                        M(
                            sz=_Lazy(functools.partial(lambda x: x == 0, o)),
                            lc=True,
                            taint=taint,
                            const=True,
                            why=frozenset({"constant zero"}),
                        )
                    )
                else:
                    res.append(M(sz=False, lc=True, const=True))
                continue
            disc = any(m.disc for m in ms) or name in _DISC
            if name == "select_n" and ms[0].lc is not True:
                disc = True
            if name == "convert_element_type" and not _is_float(eqn.invars[0].aval) and fl:
                disc = disc or ms[0].lc is not True
            m = M(taint=taint and fl, disc=disc)
            if fl:
                m.sz, m.why = self._sz(eqn, name, invals, ms, o, shape, bwd, ctx)
            else:
                m.lc, m.lcsrc = self._lc(eqn, name, invals, ms, o, shape, ctx)
                m.taint = False
            res.append(m)
        return res

    def _cval(self, eqn, ms, outs):
        """Concrete values of a constant equation's outputs, or None (then masks are lazy)."""
        cvs = [m.cval for m in ms]
        if any(c is None for c in cvs) or eqn.primitive.multiple_results:
            return None
        name = eqn.primitive.name
        out_aval = eqn.outvars[0].aval
        if not hasattr(out_aval, "dtype"):
            return None
        if all(np.ndim(c) == 0 for c in cvs):
            if name in _SHAPE or name in ("reduce_max", "reduce_min", "copy", "copy_p"):
                return [cvs[0]]
            if name == "reduce_sum":
                return [
                    np.asarray(
                        cvs[0]
                        * max(
                            1,
                            int(np.prod([eqn.invars[0].aval.shape[a] for a in eqn.params["axes"]])),
                        ),
                        dtype=out_aval.dtype,
                    )
                ]
            if name in _SCALAR_OK:
                try:
                    with jax.ensure_compile_time_eval():
                        r = _bind(eqn, [np.asarray(c) for c in cvs])[0]
                    return [np.asarray(r).reshape(())]
                except Exception:  # pragma: no cover - a rule that wants full shapes
                    return None
        if int(np.prod(out_aval.shape)) > 65536:
            return None
        try:
            ins = [
                np.broadcast_to(c, v.aval.shape)
                if np.ndim(c) == 0 and hasattr(v.aval, "shape")
                else c
                for c, v in zip(cvs, eqn.invars)
            ]
            with jax.ensure_compile_time_eval():
                r = _bind(eqn, ins)[0]
            return [np.asarray(r)]
        except Exception:  # pragma: no cover
            return None

    def _sz(self, eqn, name, vals, ms, out, shape, bwd, ctx):
        why = frozenset().union(*(m.why for m in ms))
        if name in _ZERO_TO_ZERO or (name == "integer_pow" and eqn.params["y"] > 0):
            return ms[0].sz, ms[0].why
        if name in _SHAPE:
            m = ms[0].sz
            if _is_static(m):
                return m, ms[0].why
            return _Lazy(lambda: _bind(eqn, [_arr(m, _shape(vals[0])), *vals[1:]])[0]), ms[0].why
        if name in _ADDITIVE:
            return _and([m.sz for m in ms], shape), why
        if name == "mul":
            a, b = ms
            if bwd:
                return _or([a.sz, b.sz], shape), why
            parts = []
            for x, other, ov in ((a, b, vals[1]), (b, a, vals[0])):
                if x.sz is False:
                    continue
                if other.taint:
                    parts.append(
                        _and(
                            [
                                x.sz,
                                _Lazy(lambda ov=ov: _arr(lax.is_finite(jnp.asarray(ov)), shape)),
                            ],
                            shape,
                        )
                    )
                else:
                    parts.append(x.sz)
            return _or(parts, shape), why
        if name == "div":
            a, b = ms
            if a.sz is False or bwd:
                return a.sz if a.sz is False else _and([a.sz], shape), a.why
            ok = _Lazy(lambda: _arr((vals[1] != 0) & jnp.isfinite(vals[1]), shape))
            return _and([a.sz, ok], shape), a.why
        if name == "pow":
            a, b = ms
            if a.sz is False or b.disc:
                return False, frozenset()
            return _and([a.sz, _Lazy(lambda: _arr(vals[1] > 0, shape))], shape), a.why
        if name == "select_n":
            return self._select_sz(eqn, vals, ms, shape, ctx)
        if name in _REDUCE:
            m = ms[0].sz
            if _is_static(m):
                return m, ms[0].why
            axes = tuple(eqn.params["axes"])
            return _Lazy(lambda: jnp.all(_arr(m, _shape(vals[0])), axis=axes)), ms[0].why
        if name in _CUMULATIVE:
            m = ms[0].sz
            if _is_static(m):
                return m, ms[0].why
            ax, rev = eqn.params["axis"], eqn.params.get("reverse", False)
            return _Lazy(lambda: lax.cumsum((~_arr(m, shape)).astype(jnp.int32), ax, rev) == 0), ms[
                0
            ].why
        if name == "concatenate":
            if all(m.sz is False for m in ms):
                return False, frozenset()
            if all(m.sz is True for m in ms):
                return True, why
            return _Lazy(
                lambda: _bind(eqn, [_arr(m.sz, _shape(v)) for m, v in zip(ms, vals)])[0]
            ), why
        if name == "pad":
            if ms[0].sz is False and ms[1].sz is False:
                return False, frozenset()
            return _Lazy(
                lambda: _bind(eqn, [_arr(ms[0].sz, _shape(vals[0])), _arr(ms[1].sz, ())])[0]
            ), why
        if name == "dynamic_update_slice":
            if ms[0].sz is False and ms[1].sz is False:
                return False, frozenset()
            return _Lazy(
                lambda: _bind(
                    eqn,
                    [_arr(ms[0].sz, _shape(vals[0])), _arr(ms[1].sz, _shape(vals[1])), *vals[2:]],
                )[0]
            ), why
        if name in _BILINEAR:
            a, b = ms
            if a.sz is True or b.sz is True:
                return True, why
            if a.sz is False and b.sz is False:
                return False, frozenset()
            if not bwd and (a.taint or b.taint):
                return False, frozenset()
            params = dict(eqn.params)
            params["preferred_element_type"] = jnp.float32

            def contract():
                la = (~_arr(a.sz, _shape(vals[0]))).astype(jnp.float32)
                lb = (~_arr(b.sz, _shape(vals[1]))).astype(jnp.float32)
                return _bind(eqn, [la, lb], params)[0] == 0

            return _Lazy(contract), why
        return False, frozenset()

    def _select_sz(self, eqn, vals, ms, shape, ctx):
        pred, cases = ms[0], ms[1:]
        if pred.cval is not None and np.ndim(pred.cval) == 0:
            c = cases[int(pred.cval)]
            return c.sz, c.why
        why = frozenset().union(*(m.why for m in cases))
        all_sz = _and([m.sz for m in cases], shape)
        if pred.lc is False or all(m.sz is False for m in cases):
            return all_sz, why
        if all(m.sz is True for m in cases):
            return True, why
        # a branch that is zero and unselected with a strict margin contributes nothing
        srcs = pred.lcsrc or frozenset({None})
        sel_why = (why - {"constant zero"}) | {("select", k) for k in srcs}

        def f():
            sel = _bind(eqn, [vals[0], *[_arr(m.sz, shape) for m in cases]])[0]
            out = _arr(pred.lc, shape) & sel
            return out | _arr(all_sz, shape) if all_sz is not False else out

        return _Lazy(f), sel_why

    def _lc(self, eqn, name, vals, ms, out, shape, ctx):
        src = frozenset().union(*(m.lcsrc for m in ms))
        if name in _COMPARE:
            a, b = ms
            fl = _is_float(eqn.invars[0].aval)
            if not fl:
                return _and([a.lc, b.lc], shape), src
            if a.disc or b.disc:
                return False, src
            x, y = vals
            lc = _Lazy(lambda: _arr(x != y, shape))
            key = self._site(eqn, ctx, "margin")
            if self.report:
                d = jnp.abs(jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32))
                self._flag(ctx, key, jnp.min(jnp.where(d > 0, d, jnp.inf)))
            return lc, frozenset({key[:-1]})
        if any(_is_float(v.aval) for v in eqn.invars if hasattr(v.aval, "dtype")):
            return False, src
        if name in _SHAPE:
            m = ms[0].lc
            if _is_static(m):
                return m, src
            return _Lazy(lambda: _bind(eqn, [_arr(m, _shape(vals[0])), *vals[1:]])[0]), src
        lcs = [m.lc for m in ms]
        if all(m is True for m in lcs):
            return True, src
        if all(_shape(v) in ((), shape) for v in vals) and name in (
            "and",
            "or",
            "not",
            "xor",
            "convert_element_type",
            "add",
            "sub",
            "mul",
            "neg",
            "select_n",
            "max",
            "min",
            "copy",
            "copy_p",
        ):
            return _and(lcs, shape), src
        return False, src

    # -- higher-order equations ----------------------------------------------------------------
    def _body(self, jaxpr, consts, in_sigs, ctx: _Ctx, n_flag_in: list | None = None):
        """A traceable function for a nested jaxpr.

        fn(vals, dyn_masks, flags) -> (vals, dyn_masks, flags); ``info`` receives the static
        signature of the outputs and the flag keys once it has been traced.
        """
        info: dict = {}
        const_metas = [_const_meta(c, None) for c in consts]

        def fn(vals, dyn, flags):
            it = iter(dyn)
            metas = [_meta_from_sig(s, it) for s in in_sigs]
            sub = dataclasses.replace(ctx, flags={})
            outs, om = self.run(jaxpr, consts, const_metas, list(vals), metas, sub)
            sigs = [_sig(m) for m in om]
            info["sigs"] = sigs
            info["keys"] = sorted(sub.flags, key=repr)
            new_flags = dict(flags)
            for k, v in sub.flags.items():
                if k in new_flags:
                    new_flags[k] = (
                        jnp.minimum(new_flags[k], v) if k[-1] in _MIN_KINDS else new_flags[k] + v
                    )
                else:
                    new_flags[k] = v
            return list(outs), _dyn_of(om, outs), new_flags

        return fn, info

    def _jit(self, eqn, invals, ms, ctx: _Ctx):
        """A nested jit stays a jit (same compiled units as ``fun``, so the same rounding)."""
        jaxpr, consts = _closed(eqn.params["jaxpr"])
        sigs = tuple(_sig(m) for m in ms)
        key = (ctx.path, id(eqn), sigs, ctx.backward)
        ent = self._jits.get(key)
        if ent is None:
            fn, info = self._body(jaxpr, consts, list(sigs), self._sub_ctx(eqn, ctx))

            def body(vals, dyn):
                return fn(vals, dyn, {})

            body.__name__ = str(eqn.params.get("name", "jit"))
            ent = self._jits[key] = (jax.jit(body, inline=bool(eqn.params.get("inline"))), info)
        jf, info = ent
        outs, odyn, flags = jf(list(invals), _dyn_of(ms, invals))
        for k, v in flags.items():
            self._flag(ctx, k, v)
        return list(outs), _metas_from(info["sigs"], odyn)

    def _remat(self, eqn, invals, ms, ctx: _Ctx):
        jaxpr, consts = _closed(eqn.params["jaxpr"])
        sub = self._sub_ctx(eqn, ctx)
        sigs = [_sig(m) for m in ms]
        fn, info = self._body(jaxpr, consts, sigs, sub)
        dyn = _dyn_of(ms, invals)

        def wrapped(vals, dyn):
            return fn(vals, dyn, {})

        ck = jax.checkpoint(
            wrapped,
            prevent_cse=eqn.params.get("prevent_cse", True),
            policy=eqn.params.get("policy"),
        )
        outs, odyn, flags = ck(list(invals), dyn)
        for k, v in flags.items():
            self._flag(ctx, k, v)
        return outs, _metas_from(info["sigs"], odyn)

    def _scan(self, eqn, invals, ms, ctx: _Ctx):
        p = eqn.params
        jaxpr, jconsts = _closed(p["jaxpr"])
        nc, nk = p["num_consts"], p["num_carry"]
        sub = self._sub_ctx(eqn, ctx)
        c_sig = [_sig(m) for m in ms[:nc]]
        k_sig = [_sig(m) for m in ms[nc : nc + nk]]
        x_sig = [_slice_sig(_sig(m)) for m in ms[nc + nk :]]
        xs_avals = [v.aval for v in eqn.invars[nc + nk :]]
        for _ in range(6):  # fixpoint of the carry's static metadata
            fn, info = self._body(jaxpr, jconsts, [*c_sig, *k_sig, *x_sig], sub)
            args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars[: nc + nk]]
            args += [jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in xs_avals]
            dyn_avals = _dyn_avals([*c_sig, *k_sig, *x_sig], args)
            jax.eval_shape(lambda a, d, _fn=fn: _fn(a, d, {}), args, dyn_avals)
            new_k = [_join(a, b) for a, b in zip(k_sig, info["sigs"][:nk])]
            if new_k == k_sig:
                break
            k_sig = new_k
        else:  # pragma: no cover - the lattice is finite and shallow
            raise RuntimeError("gradsan.jax.nansafe: scan metadata did not converge")
        keys = info["keys"]
        init_flags = {k: _flag_init(k) for k in keys}
        consts_v = invals[:nc]
        c_dyn = _dyn_of(ms[:nc], consts_v)
        carry_v = list(invals[nc : nc + nk])
        k_dyn = _dyn_of(ms[nc : nc + nk], carry_v, k_sig)
        xs_v = list(invals[nc + nk :])
        x_dyn = _dyn_of(ms[nc + nk :], xs_v)
        n_kdyn = len(k_dyn)
        want_k = k_sig

        def body(carry, x):
            cv, cd, fl = carry
            xv, xd = x
            outs, odyn, nfl = fn([*consts_v, *cv, *xv], [*c_dyn, *cd, *xd], fl)
            om = _metas_from(info["sigs"], odyn)
            kd = _dyn_of(om[:nk], outs[:nk], want_k)
            assert len(kd) == n_kdyn
            ys_m = om[nk:]
            info["ys_sigs"] = [_sig(m) for m in ys_m]
            return (outs[:nk], kd, {k: nfl.get(k, fl[k]) for k in keys}), (
                outs[nk:],
                _dyn_of(ys_m, outs[nk:]),
            )

        (cv, cd, fl), (ys, yd) = lax.scan(
            body,
            (carry_v, k_dyn, init_flags),
            (xs_v, x_dyn),
            length=p["length"],
            reverse=p["reverse"],
            unroll=p["unroll"],
        )
        for k, v in fl.items():
            self._flag(ctx, k, v)
        carry_m = _metas_from(k_sig, cd)
        ys_m = _metas_from([_stack_sig(s) for s in info["ys_sigs"]], yd)
        return [*cv, *ys], [*carry_m, *ys_m]

    def _while(self, eqn, invals, ms, ctx: _Ctx):
        p = eqn.params
        cj, cconsts = _closed(p["cond_jaxpr"])
        bj, bconsts = _closed(p["body_jaxpr"])
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        sub = self._sub_ctx(eqn, ctx)
        cv, bv, kv = invals[:nc], invals[nc : nc + nb], list(invals[nc + nb :])
        b_sig = [_sig(m) for m in ms[nc : nc + nb]]
        k_sig = [_sig(m) for m in ms[nc + nb :]]
        for _ in range(6):
            fn, info = self._body(bj, bconsts, [*b_sig, *k_sig], sub)
            args = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars[nc:]]
            jax.eval_shape(
                lambda a, d, _fn=fn: _fn(a, d, {}), args, _dyn_avals([*b_sig, *k_sig], args)
            )
            new_k = [_join(a, b) for a, b in zip(k_sig, info["sigs"])]
            if new_k == k_sig:
                break
            k_sig = new_k
        else:  # pragma: no cover
            raise RuntimeError("gradsan.jax.nansafe: while metadata did not converge")
        keys = info["keys"]
        b_dyn = _dyn_of(ms[nc : nc + nb], bv)
        k_dyn = _dyn_of(ms[nc + nb :], kv, k_sig)

        def cond_fun(carry):
            vals, _, _ = carry
            return jax.core.eval_jaxpr(cj, cconsts, *cv, *vals)[0]

        def body_fun(carry):
            vals, kd, fl = carry
            outs, odyn, nfl = fn([*bv, *vals], [*b_dyn, *kd], fl)
            om = _metas_from(info["sigs"], odyn)
            return outs, _dyn_of(om, outs, k_sig), {k: nfl.get(k, fl[k]) for k in keys}

        vals, kd, fl = lax.while_loop(
            cond_fun, body_fun, (kv, k_dyn, {k: _flag_init(k) for k in keys})
        )
        for k, v in fl.items():
            self._flag(ctx, k, v)
        return list(vals), _metas_from(k_sig, kd)

    def _cond(self, eqn, invals, ms, ctx: _Ctx):
        branches = eqn.params["branches"]
        sub = self._sub_ctx(eqn, ctx)
        idx, ops, oms = invals[0], list(invals[1:]), ms[1:]
        sigs = [_sig(m) for m in oms]
        dyn = _dyn_of(oms, ops)
        args = [jax.ShapeDtypeStruct(np.shape(o), jnp.result_type(o)) for o in ops]
        fns = []
        out_sig = None
        keys: set = set()
        for br in branches:
            j, c = _closed(br)
            fn, info = self._body(j, c, sigs, sub)
            jax.eval_shape(lambda a, d, _fn=fn: _fn(a, d, {}), args, _dyn_avals(sigs, args))
            out_sig = (
                info["sigs"]
                if out_sig is None
                else [_join(a, b) for a, b in zip(out_sig, info["sigs"])]
            )
            keys |= set(info["keys"])
            fns.append((fn, info))
        keys_l = sorted(keys, key=repr)

        def make(fn, info):
            def branch(ops, dyn):
                outs, odyn, fl = fn(ops, dyn, {})
                om = _metas_from(info["sigs"], odyn)
                return (
                    outs,
                    _dyn_of(om, outs, out_sig),
                    {k: fl.get(k, _flag_init(k)) for k in keys_l},
                )

            return branch

        outs, odyn, fl = lax.switch(idx, [make(f, i) for f, i in fns], ops, dyn)
        for k, v in fl.items():
            self._flag(ctx, k, v)
        metas = _metas_from(out_sig, odyn)
        if ms[0].lc is not True:
            for m in metas:
                m.disc = True
        return list(outs), metas

    # -- the report --------------------------------------------------------------------------------
    def build_report(self, flags: dict, fun) -> Report:
        rep = Report(function=getattr(fun, "__name__", "function"), backend="jax")
        margins = {}
        merged: dict = {}
        for k, v in flags.items():
            if k[-1] == "margin":
                margins[k[:-1]] = float(v)
        for k, v in flags.items():
            if k[-1] == "margin":
                continue
            n = int(v)
            if n == 0:
                continue
            site = self.sites[k]
            f = self._finding(site, n, margins)
            same = (f.kind, f.where, f.primitive, f.detail.get("rule"))
            prev = merged.get(same)
            if prev is None:
                merged[same] = f
                rep.findings.append(f)
            else:
                prev.count += n
                prev.detail["repaired" if f.kind == "resolved" else "count"] = prev.count
                prev.values = prev.values.replace(
                    f"{prev.count - n} element", f"{prev.count} element", 1
                )
        if self.mode == "strong_zero":
            rep.notes.append(
                "mode='strong_zero': every 0 * inf (and 0 / 0) in the backward pass was set to 0. "
                "Where the zero was not structural this is a convention, not a proven gradient: "
                "it can be a wrong finite number (sqrt(x) * sqrt(x) at 0 gives 0, the truth is 1)."
            )
        return rep

    def _finding(self, site: _Site, n: int, margins: dict):
        entry = _ENTRY.get(site.primitive)
        if site.library is not None:
            lib_entry = _catalog.for_library(site.library)
            if lib_entry is not None:
                entry = lib_entry.id
        prim = site.primitive
        if site.library and prim == site.op:
            prim = site.library.rsplit(".", 1)[-1]
        if site.kind == "struct":
            reasons = []
            for w in sorted(site.why, key=repr):
                if isinstance(w, tuple) and w[0] == "select":
                    m = margins.get(w[1])
                    reasons.append(
                        "unselected where branch"
                        + (f", margin {m:.6g}" if m is not None and np.isfinite(m) else "")
                    )
                elif isinstance(w, str):
                    reasons.append(w)
            rule = "structural zero: " + ("; ".join(dict.fromkeys(reasons)) or "zero path")
            detail = {"rule": rule, "repaired": n, "proven": True}
            kind = "resolved"
            how = (
                f"{n} element(s) of `{site.op}` computed 0 * inf (or 0 / 0) with a "
                "structurally zero factor; set to exactly 0, the true gradient (G3)"
            )
        elif site.kind == "conv":
            detail = {
                "rule": "strong-zero convention",
                "repaired": n,
                "proven": False,
                "note": "0 * inf := 0 applied where the zero is not known to be "
                "structural: a convention, NOT a proven gradient",
            }
            kind = "resolved"
            how = (
                f"{n} element(s) of `{site.op}` set to 0 by the strong-zero convention "
                "(not proven: can be a wrong finite value)"
            )
        else:
            detail = {
                "rule": "none: the zero is numerical",
                "why_unresolved": "the zero that met the inf is not structural (it "
                "vanishes only at this point), so 0 * inf has no single value here; "
                "nansafe leaves it non-finite",
                "note": "deciding it needs the limit engine, gradsan.jax.certify (a later feature)",
            }
            kind = "unresolved"
            how = f"{n} element(s) of `{site.op}` computed 0 * inf (or 0 / 0) and stayed NaN"
        f = catalog_finding(
            backend="jax",
            entry_id=entry,
            kind=kind,
            phase="gradient",
            primitive=prim,
            where=site.where,
            result="finite" if kind == "resolved" else "nan",
            backend_op=f"{site.op} (backward)",
            count=n,
            size=0,
            library=site.library,
            form="0*inf" if site.op != "div" else "0/0",
            met_op=site.op,
            met_where=site.where,
            detail=detail,
        )
        f.values = how
        return f


# -- static signatures of metadata for nested bodies -----------------------------------------------


def _meta_from_sig(sig: tuple, it) -> M:
    szk, lck, taint, const, disc, why, cv, lcsrc = sig
    sz = next(it) if szk == 2 else bool(szk)
    lc = next(it) if lck == 2 else bool(lck)
    cval = np.frombuffer(cv[1], dtype=np.dtype(cv[0])).reshape(()) if cv is not None else None
    return M(sz=sz, lc=lc, taint=taint, const=const, disc=disc, why=why, cval=cval, lcsrc=lcsrc)


def _metas_from(sigs, dyn) -> list[M]:
    it = iter(dyn)
    return [_meta_from_sig(s, it) for s in sigs]


def _dyn_of(metas, vals, sigs=None) -> list:
    """The masks that a signature carries as arrays (static ones widened where it asks)."""
    out = []
    sigs = sigs if sigs is not None else [_sig(m) for m in metas]
    for m, v, s in zip(metas, vals, sigs):
        shape = _shape(v)
        if s[0] == 2:
            out.append(_arr(m.sz, shape))
        if s[1] == 2:
            out.append(_arr(m.lc, shape))
    return out


def _dyn_avals(sigs, args) -> list:
    out = []
    for s, a in zip(sigs, args):
        if s[0] == 2:
            out.append(jax.ShapeDtypeStruct(a.shape, jnp.bool_))
        if s[1] == 2:
            out.append(jax.ShapeDtypeStruct(a.shape, jnp.bool_))
    return out


def _slice_sig(sig: tuple) -> tuple:
    return sig


def _stack_sig(sig: tuple) -> tuple:
    return sig


def _flag_init(key: tuple):
    if key[-1] in _MIN_KINDS:
        return jnp.array(np.inf, jnp.float32)
    return jnp.array(0, jnp.int32)


# -- the public transformation -----------------------------------------------------------------

_counter = itertools.count()


def nansafe(
    fun: Callable, *, mode: str = "structural", report: bool = False, limit: bool = True
) -> Callable:
    """Evaluate ``fun`` (a gradient, a train step) with ``0 * inf`` repaired where it is proven.

    Outputs are bit-identical to ``fun`` wherever everything is finite. Where a ``0 * inf`` (or
    ``0 / 0``) arises in the backward pass and the zero is *structural* (the unselected branch
    of a ``where`` whose comparison holds with a strict margin, a constant zero, an integer
    path), the product is set to exactly 0, which is the true gradient::

        g = gradsan.jax.nansafe(jax.grad(lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.)))
        g(-1.0)   # 0.0 (plain jax.grad: nan)

    A zero that vanishes only at this point (``sqrt(x) * sqrt(x)`` at 0) is never silently set
    to 0: the value stays non-finite and, with ``report=True``, is reported as "unresolved".
    ``mode="strong_zero"`` applies ``0 * inf := 0`` everywhere in the backward pass and labels
    each place as a convention (not proven). ``report=True`` returns ``(outputs, Report)``.

    On ``jax.grad(loss)`` (mode ``"structural"``), a numerical ``0 * inf`` left non-finite is
    sent to the limit engine (:func:`gradsan.jax.certify`): when it certifies the gradient (or
    a Clarke subgradient, labelled so in the report) that is returned; otherwise the value
    stays non-finite. Under ``jax.jit`` the same host decision runs through a
    ``jax.pure_callback`` taken only when an output is non-finite: a step whose outputs are all
    finite never calls the host (its device cost is one fused finiteness check); under
    ``jax.vmap`` only the non-finite elements go to the host, each with its own arguments. The
    report (``report=True``) cannot be returned from inside ``jax.jit``. For any other
    ``fun`` (a train step, ``strong_zero``) nothing is added. ``limit=False`` never asks the
    limit engine (under ``jit``: no finiteness check and no callback in the program, about 3%
    of a small MLP's gradient step on CPU): such a value stays non-finite, "unresolved".

    ``nansafe(fun)`` can be jitted (do so for speed); called eagerly it runs op by op like an
    eager ``fun``, and ``nansafe(jax.jit(fun))`` runs ``fun``'s body as one compiled program.
    """
    check_callable(fun, "nansafe")
    if mode not in _MODES:
        raise UsageError(f"gradsan.jax.nansafe: mode must be one of {_MODES}, got {mode!r}")
    if not isinstance(limit, bool):
        raise UsageError(f"gradsan.jax.nansafe: limit must be True or False, got {limit!r}")
    ask = limit and mode == "structural"  # the limit engine, for numerical zeros
    cache: dict = {}

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any):
        labels, leaves = arg_labels(fun, args, kwargs)
        check_args(leaves, labels, "nansafe")
        flat, in_tree = jax.tree_util.tree_flatten((args, kwargs))
        tracing = any(isinstance(x, jax.core.Tracer) for x in flat)
        if report and tracing:
            raise UsageError(
                "gradsan.jax.nansafe(..., report=True) cannot return a Report from inside "
                "jax.jit; wrap the jitted function instead: "
                "gradsan.jax.nansafe(jax.jit(fun), report=True)(*args)"
            )
        key = (
            in_tree,
            tuple(
                (
                    np.shape(x),
                    jnp.result_type(x),
                    getattr(x, "weak_type", None)
                    if not isinstance(x, (int, float, complex, bool))
                    else type(x),
                )
                for x in flat
            ),
        )
        entry = cache.get(key)
        if entry is None:

            def flat_fun(*fl):  # a fresh closure per trace: make_jaxpr caches per callable (P7)
                a, k = jax.tree_util.tree_unflatten(in_tree, list(fl))
                return fun(*a, **k)

            closed, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(*flat)
            em = _Emitter(mode, report)
            jaxpr, consts = closed.jaxpr, list(closed.consts)
            in_metas = []
            for v in jaxpr.invars:
                fl = hasattr(v.aval, "dtype") and _is_float(v.aval)
                in_metas.append(M(sz=False, lc=not fl, const=not fl))

            def run(*fl):
                ctx = _Ctx(backward=False, frame=None, path=(), library=None, flags={})
                outs, _ = em.run(
                    jaxpr, consts, [_const_meta(c, None) for c in consts], list(fl), in_metas, ctx
                )
                return outs, (ctx.flags if report else {})

            out_tree = jax.tree_util.tree_structure(out_shape)
            entry = (em, run, jax.jit(run), out_tree, out_shape)
            if not any(isinstance(c, jax.core.Tracer) for c in consts):
                cache[key] = entry
        em, run, jitted, out_tree, out_shape = entry
        outs, flags = run(*flat)
        limit = None
        if ask and tracing:
            outs = _limit_in_program(fun, flat, in_tree, outs, out_tree)
        result = jax.tree_util.tree_unflatten(out_tree, outs)
        if ask and not tracing:
            limit = _host_limit(fun, args, kwargs, result)
            if limit is not None:
                result = limit[0]
        if not report:
            return result
        rep = em.build_report(flags, fun)
        if limit is not None:
            rep.findings = [f for f in rep.findings if f.kind != "unresolved"]
            rep.findings.append(limit[1])
        rep.outputs = result
        return result, rep

    return wrapped


def _is_float_array(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)


def _plain_grad(fun: Callable, kwargs: dict) -> bool:
    """Whether ``fun`` is a plain ``jax.grad(loss)`` called without keywords: the only
    programs the limit engine is asked about."""
    doc = getattr(fun, "__doc__", None) or ""
    return doc.startswith("Gradient of") and hasattr(fun, "__wrapped__") and not kwargs


def _host_limit(fun: Callable, args: tuple, kwargs: dict, result: Any):
    """The host decision, one for both paths (an eager call, and the callback under jit):
    None when every float output is finite (nothing to decide) or when the limit engine has no
    certified number; else (certified gradient, finding) from :func:`_limit`."""
    if all(
        np.isfinite(np.asarray(x)).all()
        for x in jax.tree_util.tree_leaves(result)
        if _is_float_array(x)
    ):
        return None
    return _limit(fun, args, kwargs, result)


_CERTIFIERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _certifier(fun: Callable) -> Callable:
    """certify(fun), kept per gradient function: a second incident reuses the traces of the
    loss and of its vmapped form (most of a first certification's time)."""
    from .certify import certify

    try:
        c = _CERTIFIERS.get(fun)
        if c is None:
            c = _CERTIFIERS[fun] = certify(fun)
        return c
    except TypeError:  # not weakly referenceable
        return certify(fun)


def _limit(fun: Callable, args: tuple, kwargs: dict, result: Any):
    """A numerical 0 * inf left non-finite: ask the limit engine for the gradient of the loss
    (``fun`` must be ``jax.grad(loss)``). Returns (certified gradient, finding) or None when
    there is no certified number (singular, undecided) or ``fun`` is not a plain gradient."""
    if not _plain_grad(fun, kwargs):
        return None
    try:
        rep = _certifier(fun)(*args)
    except Exception:  # an unsupported program: keep the non-finite value, reported
        return None
    if rep.outputs is None or not rep.findings:
        return None
    f = rep.findings[0]
    label = f.detail.get("label")
    if label not in ("gradient", "clarke-subgradient"):
        return None
    grad = jax.tree_util.tree_map(
        lambda c, r: jnp.asarray(c, dtype=r.dtype).reshape(r.shape), rep.outputs, result
    )
    f.kind = "resolved"
    f.detail["rule"] = "limit engine (gradsan.jax.certify): " + (
        "the gradient" if label == "gradient" else "a Clarke subgradient"
    )
    return grad, f


# -- the limit engine inside a traced program (jax.jit, vmap, jvp) -------------------------------


def _callback_operand(x: Any) -> bool:
    """A leaf that travels to the host as a callback operand (an array or a tracer of a plain
    dtype); anything else (a Python scalar or flag) is closed over as it is."""
    if not isinstance(x, (jax.core.Tracer, jax.Array, np.ndarray, np.generic)):
        return False
    return not jnp.issubdtype(x.dtype, jax.dtypes.extended)


def _limit_in_program(fun: Callable, flat: list, in_tree, outs: list, out_tree) -> list:
    """Under a trace (``jax.jit``): ``outs`` unchanged when every float output is finite, else
    the host decision (:func:`_host_limit`, the one the eager path takes) on the concrete
    arguments and outputs, through ``jax.pure_callback``. Only for a plain ``jax.grad(loss)``;
    for any other program nothing is added.

    The callback sits in a loop that runs only when an output is non-finite (:func:`_guarded`),
    so a finite step never leaves the device, under ``vmap`` too. A ``custom_jvp`` passes the
    tangents of ``outs`` through, so differentiating the program never reaches the callback
    (pure callbacks have no JVP rule)."""
    kwargs = jax.tree_util.tree_unflatten(in_tree, list(flat))[1]
    checked = [i for i, o in enumerate(outs) if _is_float_array(o)]
    if not _plain_grad(fun, kwargs) or not checked:
        return outs
    if any(isinstance(x, jax.core.Tracer) and not _callback_operand(x) for x in flat):
        return outs  # a traced key (an extended dtype) cannot be sent to the host
    pos = [i for i, x in enumerate(flat) if _callback_operand(x)]
    static = [None if i in pos else x for i, x in enumerate(flat)]  # no tracer kept
    shapes = [jax.ShapeDtypeStruct(np.shape(o), jnp.result_type(o)) for o in outs]
    n = len(pos)

    def host(*vals):
        return _host_outputs(fun, in_tree, static, pos, out_tree, vals[:n], vals[n:])

    def to_host(ops, os):
        return list(jax.pure_callback(host, shapes, *ops, *os, vmap_method="sequential"))

    fixed = jax.custom_jvp(_guarded(to_host, checked))

    @fixed.defjvp
    def _fixed_jvp(primals, tangents):
        ops, os = primals
        return fixed(ops, os), list(tangents[1])

    return fixed([flat[i] for i in pos], list(outs))


def _guarded(to_host: Callable, checked: list) -> Callable:
    """``(ops, outs) -> outs``: ``outs`` unchanged when its float entries (``checked``) are
    all finite, else ``to_host(ops, outs)``. Under ``vmap`` the test would be batched (a
    select, or a loop over every element of every batch, each calling the host); the batching
    rule instead tests the whole batch once and, when something is non-finite, loops over the
    elements (``lax.map``) with this same test per element, so only the non-finite elements
    reach the host, each with its own arguments (recursively for nested vmaps)."""

    def finite(os):  # guard's test: one fused sum(x * 0) per output, no extra pass
        return _finite_flag([os[i] for i in checked])

    @jax.custom_batching.custom_vmap
    def fixed(ops, os):
        # a loop run at most once rather than a cond: a cond's identity branch copies every
        # output, a while loop's state keeps the outputs' buffers (the copy is in the body)
        return lax.while_loop(
            lambda s: ~s[0], lambda s: (True, to_host(ops, s[1])), (finite(os), list(os))
        )[1]

    @fixed.def_vmap
    def _batched(size, in_batched, ops, os):
        ops_b, os_b = in_batched
        os = [o if b else jnp.broadcast_to(o, (size, *np.shape(o))) for o, b in zip(os, os_b)]

        def each(ops, os):
            def one(sl):
                it = iter(sl[0])
                return fixed([next(it) if b else o for o, b in zip(ops, ops_b)], sl[1])

            return lax.map(one, ([o for o, b in zip(ops, ops_b) if b], os))

        return _guarded(each, checked)(ops, os), [True] * len(os)

    return fixed


def _host_outputs(fun: Callable, in_tree, static: list, pos: list, out_tree, ops, outs) -> tuple:
    """The callback of :func:`_limit_in_program`, on the host: rebuild the arguments (the
    leaves at ``pos`` are the callback's operands ``ops``, the others ``static``), take the
    host decision and return the certified gradient in the outputs' dtypes and shapes, or the
    outputs unchanged when there is no certified number. Never raises (an exception inside a
    pure callback is undefined behaviour under jit): a failure keeps the outputs."""
    outs = [np.asarray(o) for o in outs]
    try:
        leaves = list(static)
        for i, v in zip(pos, ops):
            leaves[i] = v
        args, kwargs = jax.tree_util.tree_unflatten(in_tree, leaves)
        limit = _host_limit(fun, args, kwargs, jax.tree_util.tree_unflatten(out_tree, outs))
        if limit is None:
            return tuple(outs)
        got = jax.tree_util.tree_leaves(limit[0])
        if len(got) != len(outs):
            return tuple(outs)
        return tuple(np.asarray(g, dtype=o.dtype).reshape(o.shape) for g, o in zip(got, outs))
    except Exception:
        return tuple(outs)
