"""jax.nn's piecewise activations reported as one operation: the catalog's
``activation-corner`` entry, with the activation's one-sided slopes at the corner.

``jax.nn.leaky_relu``, ``elu``, ``selu`` and ``hard_tanh`` are ``jnp.where`` selections and
``relu6``, ``hard_sigmoid`` and ``hard_swish`` (``hard_silu``) go through relu6's max/min: read
primitive by primitive they would be reported as where-at-boundary, relu-at-zero or max-tie.
Each is a library jit named after the function (``call_library`` names it ``jax.nn.elu``), so
the call is the operation: its input at a corner is the kink, its slopes are the catalog's
(:func:`gradsan._catalog.entries.kinks.activation_corners`). A call away from its corners, or
where the two slopes agree (elu with alpha = 1; celu is not mapped, it is C^1), is read
primitive by primitive as before. A ``jnp.where`` the user wrote is not a library call and
keeps the where words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .._catalog.entries.kinks import activation_corners, corner_interval
from ._rules import is_float
from .interpreter import to_numpy as _np

if TYPE_CHECKING:
    from ._sanitize import Kink

# jax.nn function -> (the catalog's activation name, (parameter, operand index, default))
JAX_ACTIVATIONS: dict[str, tuple[str, tuple[str, int, float] | None]] = {
    "leaky_relu": ("leaky_relu", ("negative_slope", 1, 0.01)),
    "elu": ("elu", ("alpha", 1, 1.0)),
    "selu": ("selu", None),
    "hard_silu": ("hardswish", None),
    "hard_swish": ("hardswish", None),
    "hard_sigmoid": ("hardsigmoid", None),
    "relu6": ("relu6", None),
    "hard_tanh": ("hardtanh", None),
}


def activation_call(library: str | None, eqn: Any, invals: list, deps: list) -> tuple | None:
    """(``"activation"``, [x], (x's dependence,), params) of a jax.nn activation call, with
    ``params["fn"]`` the catalog's name and the call's parameter (a scalar) read from its
    operand; None for any other call (or a parameter that is not one number)."""
    if library is None or not library.startswith("jax.nn.") or not invals:
        return None
    if eqn.primitive.name not in ("pjit", "jit"):
        return None
    found = JAX_ACTIVATIONS.get(library.rsplit(".", 1)[-1])
    if found is None or not is_float(invals[0]) or not deps[0]:
        return None
    fn, param = found
    params: dict[str, Any] = {"fn": fn, "library": library}
    if param is not None:
        name, i, default = param
        if len(invals) > i:
            v = _np(invals[i])
            if np.size(v) != 1 or deps[i]:
                return None  # an array of slopes, or a learned one: read piece by piece
            params[name] = float(np.asarray(v, np.float64).reshape(()))
        else:
            params[name] = default
    return "activation", [invals[0]], (deps[0],), params


def one_sided(k: Kink, tx: np.ndarray) -> np.ndarray:
    """The activation's one-sided output tangent along the operand tangent ``tx`` at the hit
    elements: the right slope times ``tx`` where it moves up, the left one where it moves
    down, 0 where it does not move (0 elsewhere)."""
    x = np.asarray(k.operands[0], np.float64)
    t = np.broadcast_to(np.asarray(tx, np.float64), x.shape)
    os = np.zeros(x.shape)
    for c, left, right in activation_corners(k.params.get("fn", ""), k.params):
        os = np.where(x == c, np.where(t > 0, right * t, left * t), os)
    return os


def corner_facts(k: Kink, x: float, value: float) -> dict[str, Any]:
    """The facts of a finding at the corner ``x``: JAX's derivative ``value`` against the
    interval between the activation's one-sided slopes there."""
    corners = activation_corners(k.params.get("fn", ""), k.params)
    at = corner_interval(corners, x)
    if at is None:
        return {}
    lo, hi = at
    left, right = next((lft, rgt) for c, lft, rgt in corners if c == x)
    name = k.params.get("library", k.params.get("fn", "the activation"))
    return {
        "subdifferential": f"[{lo:.6g}, {hi:.6g}] (the one-sided slopes of {name} at {x:g}: "
        f"{left:.6g} on the left, {right:.6g} on the right)",
        "derivative": f"{name}: slope {left:.6g} left of {x:g}, {right:.6g} right of {x:g}; "
        f"no derivative at the corner, every value in [{lo:.6g}, {hi:.6g}] is a subgradient "
        f"(JAX's is {value:.6g})",
        "slopes": (left, right),
        "corner": x,
        "admissible": bool(lo - 1e-6 <= value <= hi + 1e-6),
    }
