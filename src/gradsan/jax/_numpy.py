"""numpy twins of lax primitives: one table, ``TWINS``, for the interpreter and for certify.

A twin computes an equation's output with numpy, skipping JAX's per-primitive dispatch (and
compilation). Twins flagged ``exact`` are exactly rounded: their IEEE result is unique
(arithmetic +, -, *, /, sqrt, comparisons, selects, shape changes), so numpy and XLA give the
same bits, exact zeros and infinities included; the interpreter (explain) uses only them
(:func:`evaluate`). The others (transcendental functions, reductions, contractions) agree with
XLA up to rounding: certify's evaluation at x0, in float64, uses every twin
(:func:`evaluate_float`).
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Callable
from typing import Any

import numpy as np

# (the equation, its inputs as numpy arrays, its output dtype) -> the output, or None where
# the twin does not apply (then JAX evaluates the equation)
TwinFn = Callable[[Any, list, Any], Any]


@dataclasses.dataclass(frozen=True)
class Twin:
    fn: TwinFn
    exact: bool  # the same bits as XLA, on explain's fast path


_OK_DTYPES = {
    np.dtype(t)
    for t in (
        np.float32,
        np.float64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint32,
        np.uint64,
        np.bool_,
    )
}


def _arith(fn: Callable) -> TwinFn:
    def impl(eqn, invals, dtype):
        return fn(*[np.asarray(v, dtype=dtype) for v in invals])

    return impl


def _cmp(fn: Callable) -> TwinFn:
    def impl(eqn, invals, dtype):
        a, b = (np.asarray(v) for v in invals)
        common = np.result_type(a.dtype, b.dtype)
        return fn(a.astype(common, copy=False), b.astype(common, copy=False))

    return impl


def _unary(fn: Callable) -> TwinFn:
    def impl(eqn, invals, dtype):
        return fn(invals[0])

    return impl


def _binary(fn: Callable) -> TwinFn:
    def impl(eqn, invals, dtype):
        return fn(invals[0], invals[1]) if len(invals) == 2 else None

    return impl


def _broadcast_in_dim(eqn, invals, dtype):
    x = np.asarray(invals[0])
    shape = tuple(eqn.params["shape"])
    dims = tuple(eqn.params["broadcast_dimensions"])
    expanded = [1] * len(shape)
    for src, dst in enumerate(dims):
        expanded[dst] = x.shape[src]
    return np.broadcast_to(x.reshape(expanded), shape)


def _reshape(eqn, invals, dtype):
    if eqn.params.get("dimensions") is not None:
        return None
    return np.reshape(np.asarray(invals[0]), tuple(eqn.params["new_sizes"]))


def _transpose(eqn, invals, dtype):
    return np.transpose(np.asarray(invals[0]), tuple(eqn.params["permutation"]))


def _squeeze(eqn, invals, dtype):
    return np.squeeze(np.asarray(invals[0]), axis=tuple(eqn.params["dimensions"]))


def _expand_dims(eqn, invals, dtype):
    return np.expand_dims(np.asarray(invals[0]), tuple(eqn.params["dimensions"]))


def _select_n(eqn, invals, dtype):
    pred, *cases = (np.asarray(v) for v in invals)
    cases = [c.astype(dtype, copy=False) for c in cases]
    if pred.dtype == np.bool_ and len(cases) == 2:
        return np.where(pred, cases[1], cases[0])
    return np.choose(pred.astype(np.int64), cases)


def _convert(eqn, invals, dtype):
    x = np.asarray(invals[0])
    if x.dtype.kind == "f" and np.dtype(dtype).kind in "iub":
        return None  # float -> int conversion rules differ (NaN, overflow): let XLA decide
    return x.astype(dtype)


def _integer_pow(eqn, invals, dtype):
    if eqn.params.get("y") != 2:
        return None
    x = np.asarray(invals[0], dtype=dtype)
    return x * x


def _div(eqn, invals, dtype):
    if np.dtype(dtype).kind != "f":
        return None  # integer division rounds differently
    a, b = (np.asarray(v, dtype=dtype) for v in invals)
    return np.divide(a, b)


# -- twins good up to rounding (certify's float64 evaluation at x0) -----------------------------


def _integer_pow_float(eqn, invals, dtype):
    return np.power(invals[0], float(eqn.params["y"]))


def _convert_float(eqn, invals, dtype):
    return invals[0] if dtype in _FLOATS else None


def _slice(eqn, invals, dtype):
    st = eqn.params["start_indices"]
    lim = eqn.params["limit_indices"]
    strides = eqn.params.get("strides") or (1,) * len(st)
    return invals[0][tuple(slice(s, li, k) for s, li, k in zip(st, lim, strides))]


def _rev(eqn, invals, dtype):
    dims = eqn.params["dimensions"]
    return np.flip(invals[0], dims) if dims else invals[0]


def _reduce(fn: Callable) -> TwinFn:
    def impl(eqn, invals, dtype):
        return fn(invals[0], axis=tuple(eqn.params["axes"]))

    return impl


_DOT_SUBS: dict = {}


def dot_subscripts(eqn, ra: int, rb: int) -> tuple[str, str, str]:
    """einsum subscripts (lhs, rhs, out) of a dot_general of operands of ranks ra and rb."""
    dn = eqn.params["dimension_numbers"]
    key = (repr(dn), ra, rb)
    r = _DOT_SUBS.get(key)
    if r is None:
        r = _DOT_SUBS[key] = _dot_subscripts_of(dn, ra, rb)
    return r


def _dot_subscripts_of(dn, ra: int, rb: int) -> tuple[str, str, str]:
    (lc, rc), (lb, rb_) = dn
    letters = iter(string.ascii_letters)
    la: list = [None] * ra
    lb_: list = [None] * rb
    for i, j in zip(lb, rb_):
        la[i] = lb_[j] = next(letters)
    for i, j in zip(lc, rc):
        la[i] = lb_[j] = next(letters)
    for i in range(ra):
        if la[i] is None:
            la[i] = next(letters)
    for j in range(rb):
        if lb_[j] is None:
            lb_[j] = next(letters)
    out = (
        [la[i] for i in lb]
        + [la[i] for i in range(ra) if i not in lb and i not in lc]
        + [lb_[j] for j in range(rb) if j not in rb_ and j not in rc]
    )
    return "".join(la), "".join(lb_), "".join(out)


_PLANS: dict = {}


def _plan2(spec: str, sa: tuple, sb: tuple):
    """A two-operand einsum as one (batched) matmul: (perm a, shape a, perm b, shape b, shape
    of the product, perm of the result), or None where the spec does not fit (an index summed
    within one operand, a repeated index)."""
    ins, so = spec.split("->")
    ia, ib = ins.split(",")
    if len(set(ia)) != len(ia) or len(set(ib)) != len(ib) or len(set(so)) != len(so):
        return None
    dims: dict = {}
    for idx, shp in ((ia, sa), (ib, sb)):
        for ch, n in zip(idx, shp):
            if dims.setdefault(ch, n) != n:
                return None
    batch = [c for c in so if c in ia and c in ib]
    contr = [c for c in ia if c in ib and c not in so]
    fa = [c for c in ia if c not in ib]
    fb = [c for c in ib if c not in ia]
    if any(c not in so for c in fa + fb) or any(c not in ia and c not in ib for c in so):
        return None
    bshape = [dims[c] for c in batch]
    na = int(np.prod([dims[c] for c in fa], dtype=np.int64))
    nb = int(np.prod([dims[c] for c in fb], dtype=np.int64))
    nc = int(np.prod([dims[c] for c in contr], dtype=np.int64))
    pa = [ia.index(c) for c in batch + fa + contr]
    pb = [ib.index(c) for c in batch + contr + fb]
    prod_idx = batch + fa + fb
    return (
        pa,
        tuple(bshape + [na, nc]),
        pb,
        tuple(bshape + [nc, nb]),
        tuple(bshape + [dims[c] for c in fa] + [dims[c] for c in fb]),
        [prod_idx.index(c) for c in so],
    )


def einsum2(spec: str, a, b) -> np.ndarray:
    """np.einsum(spec, a, b) for two operands, through one BLAS matmul where the spec allows."""
    a, b = np.asarray(a), np.asarray(b)
    key = (spec, a.shape, b.shape)
    plan = _PLANS.get(key, False)
    if plan is False:
        plan = _PLANS[key] = _plan2(spec, a.shape, b.shape)
    if plan is None:
        return np.einsum(spec, a, b)
    pa, sha, pb, shb, shr, pr = plan
    r = np.matmul(np.transpose(a, pa).reshape(sha), np.transpose(b, pb).reshape(shb))
    return np.transpose(r.reshape(shr), pr)


def _dot_general(eqn, invals, dtype):
    sa, sb, so = dot_subscripts(eqn, np.ndim(invals[0]), np.ndim(invals[1]))
    return einsum2(f"{sa},{sb}->{so}", invals[0], invals[1])


def _concatenate(eqn, invals, dtype):
    return np.concatenate(invals, eqn.params["dimension"])


def _clamp(eqn, invals, dtype):
    return np.minimum(np.maximum(invals[1], invals[0]), invals[2])


def _identity(eqn, invals, dtype):
    return invals[0]


# the table: the exactly rounded twins first, then those good up to rounding (a name appears
# once; where the exact twin declines, None, the equation goes to JAX)
TWINS: dict[str, Twin] = {
    **{
        name: Twin(fn, True)
        for name, fn in {
            "add": _arith(np.add),
            "add_any": _arith(np.add),
            "sub": _arith(np.subtract),
            "mul": _arith(np.multiply),
            "div": _div,
            "neg": _arith(np.negative),
            "max": _arith(np.maximum),
            "min": _arith(np.minimum),
            "abs": _arith(np.abs),
            "sqrt": _arith(np.sqrt),
            "eq": _cmp(np.equal),
            "ne": _cmp(np.not_equal),
            "lt": _cmp(np.less),
            "le": _cmp(np.less_equal),
            "gt": _cmp(np.greater),
            "ge": _cmp(np.greater_equal),
            "broadcast_in_dim": _broadcast_in_dim,
            "reshape": _reshape,
            "transpose": _transpose,
            "squeeze": _squeeze,
            "expand_dims": _expand_dims,
            "select_n": _select_n,
            "convert_element_type": _convert,
            "integer_pow": _integer_pow,
            "copy": _arith(lambda x: x),
            "copy_p": _arith(lambda x: x),
        }.items()
    },
    **{
        name: Twin(fn, False)
        for name, fn in {
            "exp": _unary(np.exp),
            "exp2": _unary(np.exp2),
            "log": _unary(np.log),
            "log1p": _unary(np.log1p),
            "expm1": _unary(np.expm1),
            "tanh": _unary(np.tanh),
            "sin": _unary(np.sin),
            "cos": _unary(np.cos),
            "tan": _unary(np.tan),
            "rsqrt": _unary(lambda x: 1.0 / np.sqrt(x)),
            "cbrt": _unary(np.cbrt),
            "sign": _unary(np.sign),
            "atan": _unary(np.arctan),
            "asin": _unary(np.arcsin),
            "acos": _unary(np.arccos),
            "atanh": _unary(np.arctanh),
            "asinh": _unary(np.arcsinh),
            "acosh": _unary(np.arccosh),
            "sinh": _unary(np.sinh),
            "cosh": _unary(np.cosh),
            "square": _unary(np.square),
            "logistic": _unary(lambda x: 1.0 / (1.0 + np.exp(-x))),
            "floor": _unary(np.floor),
            "ceil": _unary(np.ceil),
            "real": _identity,
            "pow": _binary(np.power),
            "atan2": _binary(np.arctan2),
            "slice": _slice,
            "rev": _rev,
            "reduce_sum": _reduce(np.sum),
            "reduce_max": _reduce(np.max),
            "reduce_min": _reduce(np.min),
            "dot_general": _dot_general,
            "concatenate": _concatenate,
            "clamp": _clamp,
        }.items()
    },
}
# certify's float64 pass, where its twin differs from the exact one (which declines these
# cases: integer_pow beyond y = 2, reshape with dimensions, float -> bool)
_FLOAT_ONLY: dict[str, TwinFn] = {
    "integer_pow": _integer_pow_float,
    "convert_element_type": _convert_float,
}


def evaluate(eqn, invals: list) -> list | None:
    """The outputs of ``eqn`` computed with numpy, or None when numpy is not exact for it."""
    twin = TWINS.get(eqn.primitive.name)
    if twin is None or not twin.exact or eqn.primitive.multiple_results:
        return None
    aval = eqn.outvars[0].aval
    dtype = getattr(aval, "dtype", None)
    if dtype is None or dtype not in _OK_DTYPES:  # extended dtypes (typed keys) never are
        return None
    for v in invals:
        d = getattr(v, "dtype", None)
        if d is not None and d not in _OK_DTYPES:
            return None
        if (
            getattr(v, "sharding", None) is not None
            and len(getattr(v, "devices", lambda: [0])()) > 1
        ):
            return None
    with np.errstate(all="ignore"):
        out = twin.fn(eqn, invals, dtype)
    if out is None:
        return None
    out = np.asarray(out)
    if out.dtype != dtype:
        out = out.astype(dtype)
    if out.shape != tuple(aval.shape):
        return None
    return [out]


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_OUT: dict = {}  # id(eqn) -> (eqn, its single output's dtype and shape, or None)


def _out_of(eqn):
    hit = _OUT.get(id(eqn))
    if hit is None or hit[0] is not eqn:
        o = None
        if len(eqn.outvars) == 1:
            aval = eqn.outvars[0].aval
            o = (np.dtype(aval.dtype), tuple(aval.shape))
        if len(_OUT) > 100_000:
            _OUT.clear()
        hit = _OUT[id(eqn)] = (eqn, o)
    return hit[1]


def evaluate_float(eqn, ins: list) -> list | None:
    """The equation evaluated with numpy on float32/float64 inputs (IEEE like XLA, up to
    rounding), by any twin; None if it has no twin here (then JAX evaluates it)."""
    o = _out_of(eqn)
    if o is None:
        return None
    out_dt, out_shape = o
    if any(x.dtype not in _FLOATS for x in ins) or (out_dt not in _FLOATS and out_dt != np.bool_):
        return None
    name = eqn.primitive.name
    fn = _FLOAT_ONLY.get(name)
    if fn is None:
        twin = TWINS.get(name)
        if twin is None:
            return None
        fn = twin.fn
    r = fn(eqn, ins, out_dt)
    if r is None:
        return None
    return [np.asarray(r).astype(out_dt, copy=False).reshape(out_shape)]
