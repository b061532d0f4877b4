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
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import primitives as _primitives

from .. import _catalog
from .._catalog._ops import CAN_MAKE_NONFINITE as _SINGULAR
from .._catalog._ops import ZERO_TO_ZERO as _ZERO_TO_ZERO
from .._errors import UsageError
from .._events import Repair, Rule, Unresolved
from .._report import Frame, Report
from .._report._build import build, merged
from .._report._messages import REASON_UNSELECTED
from . import _compat, _nansafe_limit, _rules
from ._call import arg_labels, check_args, check_callable, flatten_call, trace_call
from ._compat import bind as _bind
from ._source import exclude_gradsan, place
from .interpreter import Scope
from .interpreter._restage import RESTAGE, Restaging, call_jit, call_remat, restage_cond

exclude_gradsan()

_MODES = ("structural", "strong_zero")

# operations whose output can be non-finite from finite inputs
# elementwise operations f with f(0) = 0 exactly, and one float operand: sz passes through
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
_jit_p = _primitives.jit_p
_remat_p = _primitives.remat_p


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


# -- positions, sites and flags ---------------------------------------------------------------


class _At(NamedTuple):
    """Where a first-order equation runs: its scope and its position key."""

    scope: Scope
    key: tuple


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


class _Emitter(Restaging):
    """The re-emission: structural-zero metadata as the sidecar (an ``M`` per value), the
    repair as the rule for backward products, control flow restaged (``RESTAGE``). ``acc``
    holds the report's counts: site key -> traced count (sum) or margin (min)."""

    def __init__(self, mode: str, report: bool):
        super().__init__()
        self.mode = mode
        self.report = report
        self.sites: dict[tuple, _Site] = {}
        self.key_prims: dict[Any, str] = {}  # source position -> first singular forward op
        self._jits: dict = {}

    # -- the sidecar: an M per value; its signature is static, its masks are the leaves --------
    def literal_side(self, value) -> M:
        return _const_meta(value)

    def const_side(self, value, label: str) -> M:
        return _const_meta(value)

    def side_sig(self, side: M) -> tuple:
        return _sig(side)

    def side_leaves(self, side: M, value, sig: tuple) -> list:
        """The masks a signature carries as arrays (static ones widened where it asks)."""
        shape = _shape(value)
        out = []
        if sig[0] == 2:
            out.append(_arr(side.sz, shape))
        if sig[1] == 2:
            out.append(_arr(side.lc, shape))
        return out

    def side_build(self, sig: tuple, leaves) -> M:
        return _meta_from_sig(sig, leaves)

    def side_join(self, a: tuple, b: tuple) -> tuple:
        return _join(a, b)

    def acc_init(self, key: tuple, aval):
        if key[-1] in _MIN_KINDS:
            return jnp.full(aval.shape, np.inf, aval.dtype)
        return jnp.zeros(aval.shape, aval.dtype)

    def acc_combine(self, key: tuple, old, new):
        return jnp.minimum(old, new) if key[-1] in _MIN_KINDS else old + new

    # -- sites ---------------------------------------------------------------------------------
    def _site(self, eqn, at: _At, kind: str, why=frozenset()) -> tuple:
        key = (*at.key, kind)
        if key not in self.sites:
            pl = place(eqn.source_info)
            where = pl.user if pl.user is not None else at.scope.frame
            lib = pl.library if pl.user is None or pl.library else at.scope.library
            lib = lib or at.scope.library
            prim = self.key_prims.get(pl.key) if pl.key is not None else None
            self.sites[key] = _Site(
                key, kind, eqn.primitive.name, prim or eqn.primitive.name, where, lib, why
            )
        else:
            self.sites[key].why = self.sites[key].why | why
        return key

    # -- scopes and calls ------------------------------------------------------------------------
    def sub_scope(self, eqn, scope: Scope, key: tuple, name: str, context=None) -> Scope:
        """The core's, except that the body of a call in a rematerialised forward computation
        is forward (as its equations are)."""
        sub = super().sub_scope(eqn, scope, key, name, context)
        sub.backward = _compat.is_backward(eqn, scope.backward)
        return sub

    def call(self, eqn, jaxpr, consts, invals, insides, scope: Scope, key: tuple):
        """A nested jit stays a jit and a checkpoint a checkpoint (:func:`call_jit`,
        :func:`call_remat`); any other call (custom_jvp/vjp, closed_call) is inlined: the
        program is already differentiated, so its custom rule has been applied."""
        name = str(eqn.params.get("name", eqn.primitive.name))
        sub = self.sub_scope(eqn, scope, key, f"{eqn.primitive.name}[{name}]")
        if eqn.primitive is _jit_p:
            return call_jit(
                self, eqn, jaxpr, consts, invals, insides, sub, self._jits, (key, scope.backward)
            )
        if eqn.primitive is _remat_p:
            return call_remat(self, eqn, jaxpr, consts, invals, insides, sub)
        csides = [self.const_side(c, "a constant") for c in consts]
        return self.run(jaxpr, consts, csides, invals, insides, sub)

    # -- first-order equations -------------------------------------------------------------------
    def first_order(self, eqn, invals, ms, scope: Scope, key: tuple):
        at = _At(scope, key)
        name = eqn.primitive.name
        bwd = _compat.is_backward(eqn, scope.backward)
        if not bwd and (name in _SINGULAR or name == "integer_pow" and eqn.params["y"] < 0):
            pl = place(eqn.source_info)
            if pl.key is not None:
                self.key_prims.setdefault(pl.key, name)
        if bwd and name == "mul" and any(m.taint for m in ms):
            outs = [self._mul(eqn, invals, ms, at)]
        elif bwd and name == "div":
            outs = [self._div(eqn, invals, ms, at)]
        elif bwd and name == "dot_general" and any(m.taint for m in ms):
            outs = _bind(eqn, self._dot_operands(eqn, invals, ms, at))
        else:
            outs = _bind(eqn, invals)
        return outs, self.metas(eqn, invals, ms, outs, bwd, at)

    def _zero_side(self, ms, vals, i: int, shape):
        """Mask of factor i's zeros that may be set to 0 against the other factor."""
        other = ms[1 - i]
        if self.mode == "strong_zero":
            return _Lazy(lambda: _arr(vals[i] == 0, shape)) if other.taint else False
        return ms[i].sz if other.taint else False

    def _mul(self, eqn, vals, ms, at: _At):
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
            self._report_repair(eqn, at, ms, bad, cond, meets, shape, [0, 1])
        return out

    def _div(self, eqn, vals, ms, at: _At):
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
            self._report_repair(eqn, at, ms, bad, cond, a == 0, shape, [0])
        return out

    def _report_repair(self, eqn, at, ms, bad, cond, meets, shape, zero_sides):
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
                self.accumulate(self._site(eqn, at, "struct", why), jnp.sum(s, dtype=jnp.int32))
            c = bad & _arr(cond, shape) if cond is not False else None
            if c is not None:
                if s is not None:
                    c = c & ~s
                self.accumulate(self._site(eqn, at, "conv"), jnp.sum(c, dtype=jnp.int32))
            rest = bad & meets & (~_arr(cond, shape) if cond is not False else True)
        else:
            if cond is not False:
                self.accumulate(
                    self._site(eqn, at, "struct", why),
                    jnp.sum(bad & _arr(cond, shape), dtype=jnp.int32),
                )
            rest = bad & meets
            if cond is not False:
                rest = rest & ~_arr(cond, shape)
        self.accumulate(self._site(eqn, at, "unres"), jnp.sum(rest, dtype=jnp.int32))

    def _dot_operands(self, eqn, vals, ms, at: _At):
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
                order = tuple(int(a) for a in np.argsort(to_x))
                red = jnp.transpose(red, order) if len(order) > 1 else red
                used = lax.broadcast_in_dim(red, _shape(x), tuple(sorted(to_x)))
            bad = _nonfinite(x)
            fix = bad & ~used
            out[i] = lax.select(fix, jnp.zeros_like(x), x)
            if self.report:
                kind = "conv" if self.mode == "strong_zero" else "struct"
                self.accumulate(self._site(eqn, at, kind, ms[j].why), jnp.sum(fix, dtype=jnp.int32))
        return out

    # -- metadata rules --------------------------------------------------------------------------
    def metas(self, eqn, invals, ms, outs, bwd: bool, at: _At) -> list[M]:
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
                m.sz, m.why = self._sz(eqn, name, invals, ms, o, shape, bwd, at)
            else:
                m.lc, m.lcsrc = self._lc(eqn, name, invals, ms, o, shape, at)
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

    def _sz(self, eqn, name, vals, ms, out, shape, bwd, at):
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
            return self._select_sz(eqn, vals, ms, shape, at)
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

    def _select_sz(self, eqn, vals, ms, shape, at):
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

    def _lc(self, eqn, name, vals, ms, out, shape, at):
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
            key = self._site(eqn, at, "margin")
            if self.report:
                d = jnp.abs(jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32))
                self.accumulate(key, jnp.min(jnp.where(d > 0, d, jnp.inf)))
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

    # -- the report --------------------------------------------------------------------------------
    def build_report(self, flags: dict, fun) -> Report:
        rep = Report(function=getattr(fun, "__name__", "function"), backend="jax")
        margins = {k[:-1]: float(v) for k, v in flags.items() if k[-1] == "margin"}
        events = [
            self.event(self.sites[k], int(v), margins)
            for k, v in flags.items()
            if k[-1] != "margin" and int(v) != 0
        ]
        # one operation at one place is one finding: counts are added on the events
        rep.findings.extend(build(ev) for ev in merged(events))
        if self.mode == "strong_zero":
            rep.notes.append(
                "mode='strong_zero': every 0 * inf (and 0 / 0) in the backward pass was set to 0. "
                "Where the zero was not structural this is a convention, not a proven gradient: "
                "it can be a wrong finite number (sqrt(x) * sqrt(x) at 0 gives 0, the truth is 1)."
            )
        return rep

    @staticmethod
    def event(site: _Site, n: int, margins: dict) -> Repair | Unresolved:
        """What nansafe decided at one site, as a text-free event."""
        entry = _rules.NANSAFE_ENTRY.get(site.primitive)
        if site.library is not None:
            lib_entry = _catalog.for_library(site.library)
            if lib_entry is not None:
                entry = lib_entry.id
        prim = site.primitive
        if site.library and prim == site.op:
            prim = site.library.rsplit(".", 1)[-1]
        common: dict[str, Any] = dict(
            backend="jax",
            op=prim,
            where=site.where,
            backend_op=site.op,
            met_op=site.op,
            entry_id=entry,
            count=n,
            library=site.library,
            form="0*inf" if site.op != "div" else "0/0",
            backward=True,
        )
        if site.kind not in ("struct", "conv"):
            return Unresolved(**common)
        reasons: list[str] = []
        marg: list[float | None] = []
        for w in sorted(site.why, key=repr):
            if isinstance(w, tuple) and w[0] == "select":
                reasons.append(REASON_UNSELECTED)
                marg.append(margins.get(w[1]))
            elif isinstance(w, str):
                reasons.append(w)
                marg.append(None)
        rule = Rule.STRUCTURAL if site.kind == "struct" else Rule.STRONG_ZERO
        return Repair(
            rule=rule,
            reasons=tuple(reasons),
            margins=tuple(marg),
            proven=rule is Rule.STRUCTURAL,
            **common,
        )


# -- static signatures of metadata for nested bodies -----------------------------------------------


def _meta_from_sig(sig: tuple, it) -> M:
    szk, lck, taint, const, disc, why, cv, lcsrc = sig
    sz = next(it) if szk == 2 else bool(szk)
    lc = next(it) if lck == 2 else bool(lck)
    cval = np.frombuffer(cv[1], dtype=np.dtype(cv[0])).reshape(()) if cv is not None else None
    return M(sz=sz, lc=lc, taint=taint, const=const, disc=disc, why=why, cval=cval, lcsrc=lcsrc)


def _restage_cond(interp: _Emitter, eqn, invals: list, insides: list, scope: Scope, key: tuple):
    """The restaged cond; its outputs can jump unless the index is locally constant."""
    outs, metas = restage_cond(interp, eqn, invals, insides, scope, key)
    if insides[0].lc is not True:
        for m in metas:
            m.disc = True
    return outs, metas


_Emitter.rules = {**RESTAGE, _compat.cond_p: _restage_cond}


# -- the public transformation -----------------------------------------------------------------

_IN_JIT = (
    "gradsan.jax.nansafe(..., report=True) cannot return a Report from inside "
    "jax.jit; wrap the jitted function instead: "
    "gradsan.jax.nansafe(jax.jit(fun), report=True)(*args)"
)


def _all_finite(tree: Any) -> bool:
    """Whether every float leaf of ``tree`` is finite (checked on the host)."""
    return all(
        bool(np.isfinite(np.asarray(x)).all())
        for x in jax.tree_util.tree_leaves(tree)
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)
    )


def _assemble(traced: Any, outs: list, plain: Any) -> Any:
    """The output pytree from the re-emitted array outputs: leaves JAX cannot carry come from
    the user's own call (or the trace), Python numbers keep their type."""
    leaves, tree = jax.tree_util.tree_flatten(traced.out_shape)
    mine = jax.tree_util.tree_leaves(plain) if plain is not None else leaves
    if len(mine) != len(leaves):
        mine = leaves
    it = iter(outs)
    full = []
    for k, orig in zip(traced.is_array, mine):
        if not k:
            full.append(orig)
            continue
        v = next(it)
        if type(orig) in (bool, int, float, complex) and not isinstance(v, jax.core.Tracer):
            v = type(orig)(np.asarray(v).item())
        full.append(v)
    return jax.tree_util.tree_unflatten(tree, full)


def _explain_left(rep: Report, fun: Callable, args: tuple, kwargs: dict, result: Any) -> None:
    """nansafe repaired nothing and an output is still non-finite (a NaN in the data, an
    overflow): the report says where it came from, as explain would, never "no findings"."""
    from ._explain import diagnose

    try:
        found = diagnose(fun, args, kwargs, who="nansafe", outputs=result)
    except UsageError as e:
        rep.notes.append(f"an output is non-finite and nansafe repaired nothing; {e}")
        return
    rep.findings.extend(found.findings)
    rep.notes.extend(found.notes)
    if not found.findings:
        rep.notes.append(
            "an output is non-finite and nansafe repaired nothing: no 0 * inf to repair, and "
            "the replay through the interpreter stayed finite."
        )


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
        call = flatten_call(fun, args, kwargs)
        labels, leaves = arg_labels(fun, call.dyn_args, call.dyn_kwargs)
        check_args(leaves, labels, "nansafe")
        flat = call.flat
        tracing = any(isinstance(x, jax.core.Tracer) for x in flat)
        if report and tracing:
            raise UsageError(_IN_JIT)
        plain = None
        if not tracing:
            # G0: the user's own program, run as the user runs it; nothing else when finite
            plain = fun(*args, **kwargs)
            if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(plain)):
                tracing = True  # it closes over a value traced outside: re-emit in that trace
                if report:
                    raise UsageError(_IN_JIT)
            elif _all_finite(plain):
                if not report:
                    return plain
                rep = Report(function=getattr(fun, "__name__", "function"), backend="jax")
                rep.outputs = plain
                return plain, rep
        key = (
            call.in_tree,
            call.statics,
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
            traced = trace_call(call, "nansafe", inside_ok=True)
            closed = traced.closed
            em = _Emitter(mode, report)
            jaxpr, consts = closed.jaxpr, list(closed.consts)
            in_metas = []
            for v in jaxpr.invars:
                fl = hasattr(v.aval, "dtype") and _is_float(v.aval)
                in_metas.append(M(sz=False, lc=not fl, const=not fl))

            def run(*fl):
                em.acc = {}
                outs, _ = em.run(
                    jaxpr, consts, [_const_meta(c) for c in consts], list(fl), in_metas, Scope()
                )
                return outs, (em.acc if report else {})

            entry = (em, run, traced)
            if not any(isinstance(c, jax.core.Tracer) for c in consts):
                cache[key] = entry
        em, run, traced = entry
        # eagerly the user's call already ran (plain): its side effects are not made again;
        # under a trace this re-emission is the user's run
        em.replay = plain is not None
        outs, flags = run(*flat)
        out_tree = jax.tree_util.tree_structure(traced.out_shape)
        limit = None
        if ask and tracing and all(traced.is_array):
            every, every_tree = jax.tree_util.tree_flatten((args, kwargs))
            outs = _nansafe_limit.limit_in_program(fun, every, every_tree, outs, out_tree)
        result = _assemble(traced, outs, plain)
        if ask and not tracing:
            limit = _nansafe_limit.host_limit(fun, args, kwargs, result)
            if limit is not None:
                result = limit[0]
        if not report:
            return result
        rep = em.build_report(flags, fun)
        if limit is not None:
            rep.findings = [f for f in rep.findings if f.kind != "unresolved"]
            rep.findings.append(limit[1])
        if not rep.findings and not _all_finite(result):
            _explain_left(rep, fun, args, kwargs, result)
        rep.outputs = result
        return result, rep

    return wrapped
