"""The one loop over jaxpr equations that every gradsan transformation runs on.

A transformation is an :class:`Interpreter` subclass: what it carries beside each value (its
*sidecar*: provenance for explain, dependence on the inputs for sanitize, structural-zero
masks for nansafe, ...) and a table of rules keyed by ``Primitive`` objects, with
:meth:`Interpreter.first_order` as the default rule. Higher-order primitives are rules too,
in one of two strategies: :mod:`._unroll` evaluates the taken branch and each loop iteration;
:mod:`._restage` re-emits the control flow with the sidecar carried through its body.
Call-like primitives (pjit, closed_call, checkpoint, custom_jvp_call, ...) are recognised by
their parameters (:func:`gradsan.jax._compat.call_body`) and go to :meth:`Interpreter.call`.

This mirrors ``jax.core.eval_jaxpr`` (literals, dropped variables, freeing each value after
its last use) and checkify's ``error_checks`` dict of rules.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import numpy as np
from jax.extend import core as jcore

from ..._report import Frame
from .. import _compat
from .._source import place

__all__ = ["Interpreter", "Rule", "Scope", "library_name", "rerun_callbacks", "to_numpy"]


@dataclasses.dataclass(eq=False)
class Scope:
    """Where a (nested) jaxpr runs.

    ``key`` is the position of the scope's evaluation (equation indices and loop iterations),
    so every pass over the same program at the same point agrees on keys; ``path`` names the
    nesting (``pjit[f]/scan[3]``); ``frame`` is the innermost user frame that called into it;
    ``library`` the library function it runs inside; ``context`` the loop iterations and
    branches, as words; ``backward`` whether it runs in the backward pass; ``shard`` the device
    a shard_map body runs on. Transformations
    subclass it to carry more; :meth:`Interpreter.sub_scope` copies every field.
    """

    key: tuple = ()
    path: str = ""
    frame: Frame | None = None
    library: str | None = None
    context: str = ""
    backward: bool = False
    id: int = 0
    shard: Any = None  # inside a shard_map body: the device's Shard (interpreter._devices)


Rule = Callable[..., tuple[list, list]]
"""``rule(interp, eqn, invals, insides, scope, key) -> (outvals, outsides)``."""


_LAST_USE: dict[int, list] = {}

_EFFECTS = frozenset({"debug_callback", "io_callback", "debug_print"})
"""Callback primitives run for their side effects (skipped by a replay when they return
nothing; a replay still runs one whose results the program uses)."""


def rerun_callbacks(jaxpr: Any) -> list:
    """The ``io_callback`` equations of ``jaxpr`` (nested bodies too) whose results the program
    uses: a replay has to run them again, repeating their side effects."""
    found: list = []

    def walk(j: Any) -> None:
        for eqn in j.eqns:
            if eqn.primitive.name == "io_callback" and eqn.outvars:
                found.append(eqn)
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr)
    return found


def _last_use(jaxpr: Any) -> list[list]:
    """Per equation, the variables read for the last time there (freed afterwards)."""
    key = id(jaxpr)
    cached = _LAST_USE.get(key)
    if cached is not None and cached[0] is jaxpr:
        return cached[1]
    last: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, jcore.Literal):
                last[v] = i
    for v in jaxpr.outvars:
        if not isinstance(v, jcore.Literal):
            last[v] = len(jaxpr.eqns)
    free: list[list] = [[] for _ in jaxpr.eqns]
    for v, i in last.items():
        if i < len(jaxpr.eqns):
            free[i].append(v)
    _LAST_USE[key] = [jaxpr, free]
    return free


def to_numpy(x: Any) -> np.ndarray:
    """A host copy for classification and reports (bfloat16 and other extended dtypes as
    float32)."""
    a = np.asarray(x)
    if a.dtype.kind == "V" or str(a.dtype) == "bfloat16":
        a = a.astype(np.float32)
    return a


def _is_library_body(jaxpr: Any) -> bool:
    """True when no equation of the body has a user frame (a jnp library jit)."""
    for eqn in jaxpr.eqns[:8]:
        pl = place(eqn.source_info)
        if pl.user is not None:
            return False
        if pl.key is None and ("jaxpr" in eqn.params or "call_jaxpr" in eqn.params):
            return False  # a call with no frames at all: gradsan's own wrapper (guard's fused
            # program calling the user's jitted step), not a library function
    return bool(jaxpr.eqns)


def library_name(jaxpr: Any, name: str) -> str | None:
    """``jnp.linalg.norm`` for the body of a library jit named ``norm``, or None when the body
    has user code (a user's own jit) or names no library."""
    if not _is_library_body(jaxpr):
        return None
    for eqn in jaxpr.eqns:
        lib = place(eqn.source_info).library
        if lib is not None:
            prefix = lib.rsplit(".", 1)[0] if "." in lib else lib
            return f"{prefix}.{name.lstrip('_')}"
    return None


class Interpreter:
    """Evaluates a jaxpr equation by equation with a sidecar per value.

    Subclasses set :attr:`rules` and override :meth:`first_order`; the hooks below have
    defaults that suit evaluating transformations.
    """

    rules: ClassVar[dict[Any, Rule]] = {}
    free_dead: ClassVar[bool] = True  # free each value after its last use
    # a replay of a call that already ran: callbacks with no results (``jax.debug.print``,
    # an ``io_callback`` that logs) are side effects the user's call made once; they are not
    # made again. A transformation that *is* the user's run (nansafe) sets this False.
    replay: bool = True

    def __init__(self) -> None:
        self._scope_ids = itertools.count(1)
        self.effects_skipped = 0  # side-effect callbacks not re-run by this replay

    # -- what a transformation provides ------------------------------------------------------
    def first_order(
        self, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> tuple[list, list]:
        raise NotImplementedError

    def literal_side(self, value: Any) -> Any:
        """The sidecar of a literal operand."""
        return None

    def const_side(self, value: Any, label: str) -> Any:
        """The sidecar of a constant closed over by a (nested) jaxpr."""
        return None

    # -- the loop ----------------------------------------------------------------------------
    def run_closed(
        self, closed: Any, args: list, arg_sides: list, scope: Scope | None = None
    ) -> tuple[list, list]:
        consts = list(closed.consts)
        csides = [self.const_side(c, "a constant captured by the function") for c in consts]
        return self.run(closed.jaxpr, consts, csides, list(args), list(arg_sides), scope or Scope())

    def run(
        self,
        jaxpr: Any,
        consts: list,
        const_sides: list,
        args: list,
        arg_sides: list,
        scope: Scope,
    ) -> tuple[list, list]:
        env: dict = {}
        side: dict = {}
        for v, c, s in zip(jaxpr.constvars, consts, const_sides):
            env[v] = c
            side[v] = s
        for v, a, s in zip(jaxpr.invars, args, arg_sides):
            env[v] = a
            side[v] = s
        free = _last_use(jaxpr) if self.free_dead else None
        rules = self.rules
        literal_side = self.literal_side

        def read(vs: list) -> tuple[list, list]:
            vals, sides = [], []
            for v in vs:
                if isinstance(v, jcore.Literal):
                    vals.append(v.val)
                    sides.append(literal_side(v.val))
                else:
                    vals.append(env[v])
                    sides.append(side[v])
            return vals, sides

        base = scope.key
        replay = self.replay
        for i, eqn in enumerate(jaxpr.eqns):
            if replay and not eqn.outvars and eqn.primitive.name in _EFFECTS:
                self.effects_skipped = getattr(self, "effects_skipped", 0) + 1
                continue
            invals, insides = read(eqn.invars)
            key = (*base, i)
            rule = rules.get(eqn.primitive)
            if rule is not None:
                outvals, outsides = rule(self, eqn, invals, insides, scope, key)
            else:
                outvals, outsides = self.dispatch(eqn, invals, insides, scope, key)
            for v, val, s in zip(eqn.outvars, outvals, outsides):
                if not isinstance(v, jcore.DropVar):
                    env[v] = val
                    side[v] = s
            if free is not None:
                for v in free[i]:
                    env.pop(v, None)
                    side.pop(v, None)
        return read(jaxpr.outvars)

    def dispatch(
        self, eqn: Any, invals: list, insides: list, scope: Scope, key: tuple
    ) -> tuple[list, list]:
        """An equation with no rule of its own: a call-like body, else the first-order rule."""
        body = _compat.call_body(eqn)
        if body is not None:
            return self.call(eqn, body[0], body[1], invals, insides, scope, key)
        return self.first_order(eqn, invals, insides, scope, key)

    # -- call-like primitives ----------------------------------------------------------------
    def call(
        self,
        eqn: Any,
        jaxpr: Any,
        consts: list,
        invals: list,
        insides: list,
        scope: Scope,
        key: tuple,
    ) -> tuple[list, list]:
        """Enter a call-like equation's body (pjit, closed_call, checkpoint, custom_jvp_call,
        custom_vjp_call): the body runs on the equation's operands in a sub-scope, named after
        the library function it implements when it has no user code."""
        name = str(eqn.params.get("name", eqn.primitive.name))
        sub = self.sub_scope(eqn, scope, key, f"{eqn.primitive.name}[{name}]")
        if sub.library is None:
            sub.library = library_name(jaxpr, name)
        csides = [self.const_side(c, "a constant") for c in consts]
        return self.run(jaxpr, consts, csides, invals, insides, sub)

    # -- scopes ------------------------------------------------------------------------------
    def sub_scope(
        self, eqn: Any, scope: Scope, key: tuple, name: str, context: str | None = None
    ) -> Scope:
        """The scope of a body of ``eqn``: user frame and library inherited, name appended."""
        pl = place(eqn.source_info)
        return dataclasses.replace(
            scope,
            key=key,
            path=f"{scope.path}/{name}" if scope.path else name,
            frame=pl.user if pl.user is not None else scope.frame,
            library=scope.library or (pl.library if pl.user is None else None),
            context=scope.context if context is None else context,
            backward=_compat.sub_backward(eqn, scope.backward),
            id=next(self._scope_ids),
        )

    @staticmethod
    def in_context(scope: Scope, what: str) -> str:
        """``scope``'s context with ``what`` appended (``scan iteration 3 (of 10), cond ...``)."""
        return f"{scope.context}, {what}" if scope.context else what

    def collective_side(
        self,
        eqn: Any,
        ins_by_device: list,
        outvals: list,
        all_insides: list,
        scope: Scope,
        key: tuple,
    ) -> list:
        """The sidecars of one device's outputs of a collective (``psum`` ...), whose inputs
        are every device's: ``ins_by_device`` is (invals, insides) per device, and
        ``all_insides`` their sidecars in one list."""
        return [None] * len(outvals)

    # -- hooks of the unroll strategy --------------------------------------------------------
    def stack(self, values: list, aval: Any) -> Any:
        """A scan's stacked output from its per-iteration values (none when length is 0)."""
        if not values:
            return jax.numpy.zeros(aval.shape, aval.dtype)
        return jax.numpy.stack(values)

    def stack_side(self, sides: list, scope: Scope) -> Any:
        """The sidecar of a stacked scan output from the per-iteration sidecars."""
        return None

    def carry_side(self, old: Any, new: Any) -> Any:
        """A while loop's carry sidecar after one more iteration."""
        return new

    def index(self, v: Any) -> int:
        return int(np.asarray(v))

    def truthy(self, v: Any) -> bool:
        return bool(np.asarray(v))
