"""certify's rule registries, keyed by primitive name. The rule modules (``rules/``) register
into them when the package imports them, in the order of ``certify/__init__.py``.

* ``FWD[name](ctx, eqn, ins, act) -> (outs, aux)``: the series of the outputs along the ray,
  and what the reverse rule needs (``aux``), for first-order primitives;
* ``CONTROL[primitive]``: the forward sweep's rules for cond, scan and while, keyed by
  ``Primitive`` as the interpreter core's tables are (they replace the core's ``UNROLL``: a
  body's evaluation keeps a tape for the reverse sweep); call-like primitives are the core's
  (``Interpreter.call``), in either sweep;
* ``BWD[name](ctx, eqn, ins, outs, aux, cots, need) -> cotangents of the inputs``;
* ``PURE``: primitives whose value depends only on their inputs and params: a repeated equation
  is evaluated once per ray (see ``Ctx.memo``);
* ``PLAIN`` and ``KINKY``, read by the evaluation at x0 (``_point``): primitives that are never
  a singular point of their own, and those counted as one wherever they are met (ties or
  integer points: not worth a check).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FWD: dict[str, Callable] = {}
BWD: dict[str, Callable] = {}
CONTROL: dict[Any, Callable] = {}
PURE: set[str] = set()
PLAIN: set[str] = set()
KINKY: set[str] = set()
