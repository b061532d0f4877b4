"""One first-order equation evaluated on concrete values through a compiled program cached per
equation: the program ``jax.core.Primitive.bind`` compiles (``dispatch.apply_primitive`` jits
the primitive with its parameters), called through jit's C++ dispatch instead of the Python
path of ``bind``, which costs a few hundred microseconds an equation. A replay of a
1000-layer network evaluates thousands of such equations (issue 17).

The same compiled program runs, so the values are bit-identical to ``bind``'s. Anything this
does not handle (tracers, effects, parameters holding jaxprs or unhashable values, an output
of another type than the equation's) returns None and the caller binds as before.

:func:`approximate` (guard's replay of a large program on the CPU): once ``after`` equations
have been dispatched to XLA one at a time, float equations with a numpy twin (matmul, tanh,
sums: IEEE like XLA, up to rounding in the last bits) are evaluated with numpy, which costs
microseconds where a synchronous XLA dispatch costs 0.1-2 ms on a loaded machine. The caller
checks that such a replay reproduced the step's non-finite outputs, and replays exactly when
it did not.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

__all__ = ["Approximation", "approximate", "evaluate"]

_BY_EQN: dict[int, tuple[Any, Callable | None]] = {}  # id(eqn) -> (eqn, its program or None)
_BY_PARAMS: dict[tuple, Callable] = {}  # (primitive, params) -> program (shared by equations)
_MAX = 20_000
_CONCRETE = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def _program(eqn: Any) -> Callable | None:
    prim = eqn.primitive
    if eqn.effects:
        return None
    params = eqn.params
    for v in params.values():
        if isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)):
            return None
    bind_params = prim.get_bind_params(params)
    if isinstance(bind_params, tuple):  # older jax: (subfuns, params)
        return None
    try:
        key = (prim, tuple(sorted(bind_params.items(), key=lambda kv: kv[0])))
        hash(key)
    except TypeError:  # a parameter that is not hashable
        return None
    fn = _BY_PARAMS.get(key)
    if fn is None:
        fn = jax.jit(lambda *args: prim.bind(*args, **bind_params))
        if len(_BY_PARAMS) > _MAX:
            _BY_PARAMS.clear()
        _BY_PARAMS[key] = fn
    return fn


class Approximation:
    """The state of one approximate replay: XLA dispatches made, numpy evaluations after."""

    def __init__(self, after: int) -> None:
        # on the CPU only: numpy reads a CPU array in place, an accelerator's is copied
        self.after: float = after if jax.default_backend() == "cpu" else float("inf")
        self.dispatched = 0
        self.approximated = 0


_APPROX: contextvars.ContextVar[Approximation | None] = contextvars.ContextVar(
    "gradsan_approximate", default=None
)


@contextlib.contextmanager
def approximate(after: int) -> Iterator[Approximation]:
    """Within: float equations with a numpy twin go through numpy once ``after`` equations
    were dispatched to XLA (see the module's text)."""
    state = Approximation(after)
    token = _APPROX.set(state)
    try:
        yield state
    finally:
        _APPROX.reset(token)


def _numpy_twin(eqn: Any, invals: list) -> list | None:
    from ._numpy import evaluate_float

    try:
        with np.errstate(all="ignore"):
            return evaluate_float(eqn, [np.asarray(v) for v in invals])
    except Exception:  # a layout the twin does not take: XLA evaluates it
        return None


def evaluate(eqn: Any, invals: list) -> list | None:
    """``eqn``'s outputs on concrete ``invals`` (a list), or None when the caller should bind."""
    state = _APPROX.get()
    if state is not None and state.dispatched >= state.after:
        got = _numpy_twin(eqn, invals)
        if got is not None:
            state.approximated += 1
            return got
    if state is not None:
        state.dispatched += 1
    hit = _BY_EQN.get(id(eqn))
    if hit is None or hit[0] is not eqn:
        if len(_BY_EQN) > _MAX:
            _BY_EQN.clear()
        hit = _BY_EQN[id(eqn)] = (eqn, _program(eqn))
    fn = hit[1]
    if fn is None:
        return None
    for v in invals:
        if isinstance(v, jax.core.Tracer) or not isinstance(v, _CONCRETE):
            return None
    try:
        out = fn(*invals)
    except Exception:  # the caller's bind raises the error JAX gives, if any
        return None
    outs = list(out) if eqn.primitive.multiple_results else [out]
    if len(outs) != len(eqn.outvars):
        return None
    for o, v in zip(outs, eqn.outvars):
        aval = v.aval
        if getattr(o, "dtype", None) != getattr(aval, "dtype", None) or np.shape(o) != tuple(
            getattr(aval, "shape", ())
        ):
            return None
    return outs
