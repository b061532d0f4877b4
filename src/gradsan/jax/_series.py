"""Kinks in series: whether an earlier kink changes the gradient given a choice at a later one.

:func:`gradsan.jax._sanitize.depending_kinks` decides each kink with the others at JAX's choice
(the gradient JAX returns). A kink that feeds a later one can change the gradient for another
admissible choice there: ``abs(relu(x))`` at 0 returns 0 (abs's 0 blocks relu's choice), yet
with abs's slope 1 on the side relu moves to, relu's choice is the gradient. This checks the
kinks again along each probe direction ``±d`` with every kink at its one-sided choice along
``±d`` (the piece the function takes just off the point, an admissible choice):

1. the operands of every kink just off the point, at ``x ± h d`` (a plain pass);
2. the program's tangents along ``±d`` at ``x`` with each kink's derivative taken on that piece
   (its rule at the moved operands, its value at ``x``): the one-sided tangents reaching every
   kink, through the earlier kinks' one-sided choices;
3. from them each kink's ``delta`` (one-sided minus JAX's), and its image at the outputs through
   the later kinks' one-sided pieces (one linear pass in the injected ``eps``).

A kink with a non-zero image is a finding: its choice changes the gradient with the later ones
at their one-sided choice (``relu`` in ``abs(relu(x))``), or the tangent the earlier ones send
it meets its own kink (``abs``). One whose every image is zero (its output reaches the outputs
only through a zero-slope side of the later kinks) is not. The smooth parts are differentiated
at ``x`` itself, so no curvature enters; the pieces are exact for the piecewise linear kinks
(relu, abs, max/min, clamp, max-pool, sort, where) and to ``O(h)`` for a corner between smooth
pieces (elu). Runs only at a detected tie with one kink downstream of another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _depends
from ._compat import bind as _bind
from ._rules import is_float
from ._sanitize import Injector, TapReader, unit_deltas

STEP = 1e-4  # the move off the point, relative to the largest argument over the direction's
# kinks whose derivative off the point is a piece of theirs (not a jump, not ill-conditioned)
PIECES = frozenset(
    {
        "relu",
        "abs",
        "max",
        "min",
        "clamp",
        "reduce_max",
        "reduce_min",
        "reduce_window_max",
        "reduce_window_min",
        "cummax",
        "cummin",
        "sort",
        "top_k",
        "where",
        "activation",
        "hypot",
    }
)


def in_series(units: list, inputs: dict, keys: Callable[[Any, Any], list]) -> bool:
    """Whether some kink's operands are reached by another kink's output."""
    for c, (kind, obj, _) in enumerate(units):
        for key in keys(kind, obj):
            if inputs.get(key, frozenset()) - {c}:
                return True
    return False


def on_piece(eqn: Any, invals: list, moved: list) -> list:
    """The outputs of ``eqn`` at ``invals`` whose derivative is the one at ``moved``: value
    ``f(x)``, tangent ``f'(moved) dx`` (``moved + (x - sg(x))`` carries x's tangent)."""
    outs = _bind(eqn, invals)
    shifted = []
    for v, m in zip(invals, moved):
        if not is_float(v):  # a select's predicate: the side just off the point
            shifted.append(v if m is None else m)
        elif isinstance(v, jax.core.Tracer) and m is not None and np.shape(m) == np.shape(v):
            shifted.append(jnp.asarray(m, v.dtype) + _tangent_part(v))
        else:  # a constant operand: not moved
            shifted.append(v)
    piece = _bind(eqn, shifted)
    res = []
    for o, p in zip(outs, piece):
        if is_float(o):
            res.append(jax.lax.stop_gradient(o) + _tangent_part(p).astype(o.dtype))
        else:
            res.append(o)
    return res


def _tangent_part(v: Any) -> Any:
    """``v - sg(v)``: value 0, v's tangent (0 where v is not finite)."""
    fixed = jax.lax.stop_gradient(v)
    return jnp.where(jnp.isfinite(fixed), v - fixed, jnp.zeros_like(v))


class _OnPieces:
    """A walk whose kinks at ``pieces`` are differentiated on their piece."""

    pieces: dict

    def evaluate(self, eqn: Any, invals: list, key: tuple) -> list:
        if key in self.pieces:
            return on_piece(eqn, invals, self.pieces[key])
        return super().evaluate(eqn, invals, key)  # type: ignore[misc]


class PieceReader(_OnPieces, TapReader):
    """:class:`TapReader` with the kinks at ``pieces`` differentiated on their piece."""

    def __init__(self, want: set, pieces: dict) -> None:
        super().__init__(want)
        self.pieces = pieces

    def call(
        self,
        eqn: Any,
        jaxpr: Any,
        consts: list,
        invals: list,
        insides: list,
        scope: Any,
        key: tuple,
    ) -> tuple[list, list]:
        if key in self.pieces:
            self._tap(key, invals)
            outs = on_piece(eqn, invals, self.pieces[key])
            return outs, [any(insides)] * len(outs)
        return super().call(eqn, jaxpr, consts, invals, insides, scope, key)


class PieceInjector(_OnPieces, Injector):
    """:class:`Injector` with the kinks at ``pieces`` differentiated on their piece."""

    def __init__(self, table: dict, eps: Any, marks: dict, pieces: dict) -> None:
        super().__init__(table, eps, marks)
        self.pieces = pieces

    def call(
        self,
        eqn: Any,
        jaxpr: Any,
        consts: list,
        invals: list,
        insides: list,
        scope: Any,
        key: tuple,
    ) -> tuple[list, list]:
        if key in self.pieces:
            outs = on_piece(eqn, invals, self.pieces[key])
            sides = self._flow(invals, insides, outs)
            outs = _depends.inject(list(outs), key, self.table, self.eps)
            return outs, self._mark(key, list(sides))
        return super().call(eqn, jaxpr, consts, invals, insides, scope, key)


def piece_key(kind: str, obj: Any) -> tuple | None:
    """The evaluation whose derivative is taken on its piece (None: JAX's rule there)."""
    if kind == "custom":
        return obj[0]
    if obj.op == "where":
        return obj.skey
    return obj.key if obj.op in PIECES else None


def _moved(flat_args: list, d: list, s: float) -> list:
    xs = [np.asarray(a) for a, t in zip(flat_args, d) if t is not None]
    ts = [np.asarray(t) for t in d if t is not None]
    xmax = max([1.0] + [float(np.max(np.abs(x))) for x in xs if x.size])
    dmax = max([0.0] + [float(np.max(np.abs(t))) for t in ts if t.size])
    if dmax == 0.0:
        return list(flat_args)
    h = STEP * xmax / dmax
    return [
        a
        if t is None
        else jnp.asarray(np.asarray(a) + (s * h) * np.asarray(t), jnp.asarray(a).dtype)
        for a, t in zip(flat_args, d)
    ]


def probes(
    closed: Any,
    flat_args: list,
    units: list,
    undecided: set,
    dirs: list[list],
    want: set,
    marks: dict,
) -> tuple[list[_depends.Probe], np.ndarray]:
    """The probes of every kink along each ``±d`` with the others at their one-sided choice,
    and their images at the outputs (columns as :func:`gradsan.jax._depends.images`')."""
    sides: list[frozenset] = [frozenset()] * len(flat_args)
    out_p: list[_depends.Probe] = []
    cols: list[np.ndarray] = []
    rows = 0
    for j, d in enumerate(dirs):
        for s in (1.0, -1.0):
            combo = 2 * j + (0 if s > 0 else 1)
            moved = TapReader(set(want)).read(closed, _moved(flat_args, d, s))
            pieces: dict = {}
            for kind, obj, _ in units:
                pk = piece_key(kind, obj)
                if pk is not None and pk in moved:
                    pieces[pk] = list(moved[pk])
            sd = [None if t is None else s * jnp.asarray(t) for t in d]
            taps = _depends_taps(closed, flat_args, want, pieces, sd)
            found: list[_depends.Probe] = []
            for c, (kind, obj, _) in enumerate(units):
                if c in undecided:
                    continue
                key, res = unit_deltas(kind, obj, taps, 1.0)
                for item in res or ():
                    if len(item) > 2 and item[2] == _depends.SUB:
                        continue  # a substituted index: decided by the substitution check
                    delta = np.asarray(item[1], np.float64)
                    if np.any(delta != 0):
                        jump = len(item) > 2 and bool(item[2])
                        found.append(_depends.Probe(c, combo, key, item[0], delta, jump))
            if not found:
                continue

            def run(table: dict, eps: Any, pieces: dict = pieces) -> Any:
                outs, _ = PieceInjector(table, eps, marks, pieces).run_closed(
                    closed, flat_args, sides
                )
                return outs

            jac = _depends.images(closed, flat_args, found, run)
            rows = jac.shape[0]
            out_p.extend(found)
            cols.append(jac)
    if not out_p:
        return [], np.zeros((0, 0))
    return out_p, np.concatenate([c.reshape(rows, -1) for c in cols], axis=1)


def _depends_taps(closed: Any, flat_args: list, want: set, pieces: dict, d: list) -> dict:
    from ._call import read_tangents

    got = read_tangents(flat_args, [d], lambda full: PieceReader(want, pieces).read(closed, full))
    return got[0]
