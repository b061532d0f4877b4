"""certify's values along a ray: :class:`IntVal` (booleans and integers), the lifting of
constants, the per-certification context and tape, and small rearrangements of series."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from .._compat import bind as _bind
from . import _series as S
from ._series import DOMAIN, OK, POISON, PUNDEC, UNDEC, Series, Undecided

# -- values -----------------------------------------------------------------------------------


class IntVal:
    """A boolean or integer value: constant along the ray for small t (bad: undecided/flagged)."""

    __slots__ = ("x", "bad")

    def __init__(self, x, bad=None):
        self.x = np.asarray(x)
        self.bad = np.zeros(self.x.shape, np.int8) if bad is None else np.asarray(bad, np.int8)

    @property
    def shape(self):
        return self.x.shape


def is_float_aval(aval) -> bool:
    return np.issubdtype(np.dtype(aval.dtype), np.floating) or np.issubdtype(
        np.dtype(aval.dtype), np.complexfloating
    )


def lift(x, aval=None) -> Series | IntVal:
    a = np.asarray(x)
    dt = aval.dtype if aval is not None else a.dtype
    if np.issubdtype(np.dtype(dt), np.complexfloating):
        raise Undecided("complex values are not supported")
    if np.issubdtype(np.dtype(dt), np.floating) or str(dt) == "bfloat16":
        return Series.exact(a.astype(np.float64))
    return IntVal(a)


def const_value(v) -> np.ndarray | None:
    if isinstance(v, IntVal):
        return None if v.bad.any() else v.x
    if v.is_const():
        return v.coef()
    return None


@dataclasses.dataclass
class Ctx:
    unverified: set = dataclasses.field(default_factory=set)
    notes: list = dataclasses.field(default_factory=list)
    # per ray: equations already evaluated, by (primitive, params, identity of the inputs); a
    # repeated subexpression gets the very same value, so that a - a and min(a, a) are exact
    memo: dict = dataclasses.field(default_factory=dict)
    # per equation (id of its jaxpr, index): the truncation cap it runs under, where it differs
    # from the ambient one (the singular points at x0 and what feeds them: `_at_point`, `_caps`)
    caps: dict = dataclasses.field(default_factory=dict)
    bwd_cap: float | None = None  # the reverse sweep's cap, where it differs from the forward's
    data: list = dataclasses.field(default_factory=list)  # the jaxpr's inputs after the params


@dataclasses.dataclass
class Tape:
    jaxpr: Any
    env: dict
    active: set
    aux: dict


def _read(env, v):
    if isinstance(v, jcore.Literal):
        return lift(v.val, v.aval)
    return env[v]


def const_eval(eqn, ins) -> list:
    vals = []
    for x in ins:
        cv = const_value(x)
        if cv is None:
            raise Undecided(f"`{eqn.primitive.name}` got a value that is not constant on the ray")
        vals.append(cv)
    with jax.default_device(jax.devices("cpu")[0]):
        outs = _bind(eqn, [np.asarray(v) for v in vals])
    return [lift(np.asarray(o), v.aval) for o, v in zip(outs, eqn.outvars)]


def _bad_of(x) -> np.ndarray:
    return x.bad


# -- small helpers on series -------------------------------------------------------------------


def as_series(x) -> Series:
    """A float series for an operand (an integer / boolean one is an exact constant)."""
    if isinstance(x, IntVal):
        s = Series.exact(np.asarray(x.x, np.float64))
        return S.flag_codes(s, x.bad) if np.count_nonzero(x.bad) else s
    return x


def _lin(s: Series, f, fH=None, fbad=None) -> Series:
    """A rearrangement applied to every part of a series (signed infinities carried along)."""
    return S.apply_linear(s, f, fH, fbad, f)


def _last(s: Series, axis: int) -> Series:
    return s if axis == len(s.shape) - 1 else _lin(s, lambda a: np.moveaxis(a, axis, -1))


def _unlast(s: Series, axis: int) -> Series:
    return s if axis == len(s.shape) - 1 else _lin(s, lambda a: np.moveaxis(a, -1, axis))


def _sl(s: Series, sl: slice) -> Series:
    return _lin(s, lambda a: a[..., sl])


def _flip(s: Series) -> Series:
    return _lin(s, lambda a: np.flip(a, -1))


def _cat(ss: list) -> Series:
    """Series concatenated along the last axis."""
    ss = [s for s in ss if s.shape[-1]]
    if len(ss) == 1:
        return ss[0]
    keys = set().union(*(s.terms for s in ss))
    terms = {
        k: np.concatenate([np.broadcast_to(s.terms.get(k, 0.0), s.shape) for s in ss], -1)
        for k in keys
    }
    H = np.concatenate([s.H for s in ss], -1)
    bad = np.concatenate([s.bad for s in ss], -1)
    out = S.mk(terms, H, bad, H.shape)
    if any(s.inf is not None for s in ss):
        out.inf = np.concatenate([S.inf_code(s) for s in ss], -1)
    return out


def _ones(shape) -> Series:
    return Series.exact(np.ones(shape))


def _choice(worst: np.ndarray) -> np.ndarray:
    """The status of a choice among values whose worst status is ``worst`` (as a comparison
    gets it: DOMAIN stays, POISON makes it PUNDEC, anything else not OK makes it UNDEC)."""
    return np.where(
        worst == DOMAIN,
        DOMAIN,
        np.where((worst == POISON) | (worst == PUNDEC), PUNDEC, np.where(worst != OK, UNDEC, OK)),
    ).astype(np.int8)
