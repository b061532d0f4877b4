"""`gradsan run`'s patches for equinox and flax NNX: ``eqx.filter_jit``, ``eqx.filter_grad``,
``eqx.filter_value_and_grad``, ``nnx.jit``, ``nnx.grad`` and ``nnx.value_and_grad`` made in
the user's code are wrapped like ``jax.jit`` (see _patch_jax.py).

What differs from plain JAX:

- Their arguments and outputs are modules: pytrees with non-array leaves (functions, static
  fields). The flag covers the float array leaves; the replay runs on the array leaves only,
  the rest bound back in the way equinox itself does (``eqx.partition`` / ``eqx.combine``).
- ``eqx.filter_jit``'s flag is fused into the same compiled program (``eqx.filter_jit`` of the
  function plus its flag, with the same ``donate`` option).
- ``nnx.jit`` and friends update their module arguments in place: the flag also covers the
  modules' state after the call (a NaN written into the parameters is caught at the step that
  wrote it), and the arrays of the arguments before the call are kept (arrays are immutable,
  so this copies nothing) to replay the call on the state it started from.
- Donated arguments (``donate="all"``, ``donate_argnums``) stay donated; a failing call is
  then reported by its non-finite outputs only, with a note saying why.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._userfile import is_user_file
from ._failure import Failure
from ._patch_jax import Watched, _has_tracer, _jsonable

if TYPE_CHECKING:
    from ._hooks import Hooks

EQX_NAMES = ("filter_jit", "filter_grad", "filter_value_and_grad")
NNX_NAMES = ("jit", "grad", "value_and_grad")


def _inexact_only(tree: Any) -> Any:
    """``tree`` with every leaf that is not a float array replaced by None."""
    import jax
    import jax.numpy as jnp

    def keep(x: Any) -> Any:
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.inexact):
            return x
        return None

    return jax.tree_util.tree_map(keep, tree)


def _flag(tree: Any) -> bool:
    from ..jax._flags import host_flag

    return bool(host_flag(_inexact_only(tree)))


class FrameworkWatched(Watched):
    """An equinox / NNX transform's function made in the user's code, each eager call checked."""

    def __init__(
        self,
        hooks: Hooks,
        inner: Callable,
        kind: str,
        target: Callable,
        opts: dict,
        framework: str,
        make: Callable,
    ) -> None:
        super().__init__(hooks, inner, kind, target, opts)
        self._framework = framework  # "eqx" / "nnx"
        self._make = make  # the original transform, to build the fused program
        self._fused: Callable | None = None
        self._fused_failed = False

    @property
    def label(self) -> str:
        return f"`{_name(self._target)}` ({self._framework}.{self._kind})"

    # equal when the framework's own functions are (an equinox transform is a Module, equal by
    # its fields): ``eqx.filter_pmap(eqx.filter_grad(f))`` re-created hits equinox's cache, as
    # it does without gradsan (equinox's test_pmap_grad counts the traces)
    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if type(other) is not type(self):
            return NotImplemented
        try:
            return bool(self._inner == other._inner)  # type: ignore[attr-defined]
        except Exception:  # arrays in the fields: an array of comparisons
            return False

    def __hash__(self) -> int:
        try:
            return hash((type(self), self._inner))
        except TypeError:  # a Module with a dict field (filter_grad's options): by its pytree
            pass
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(self._inner)
        try:
            return hash((type(self), treedef, tuple(leaves)))
        except TypeError:  # array leaves
            return id(self)

    @property
    def donating(self) -> bool:
        o = self._opts
        if self._framework == "eqx":
            return o.get("donate", "none") != "none"
        return bool(o.get("donate_argnums") or o.get("donate_argnames"))

    # -- the checked call -------------------------------------------------------------------
    def _with_flag(self) -> Callable | None:
        """The jitted function plus its flag in one program (jit kinds only)."""
        if self._kind not in ("jit", "filter_jit") or self._fused_failed:
            return None
        if self._fused is None:
            key = _cache_key(self._make, self._target, self._opts)
            fused = _FUSED.get(key) if key is not None else None
            if fused is None:
                try:
                    fused = self._make(_flagged(self._target, self._framework), **self._opts)
                except Exception:  # unusual options: check the outputs separately
                    self._fused_failed = True
                    return None
                if key is not None:
                    if len(_FUSED) >= _FUSED_MAX:
                        _FUSED.pop(next(iter(_FUSED)))
                    _FUSED[key] = fused
            self._fused = fused
        return self._fused

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hooks = self._hooks
        if not hooks.enabled or _has_tracer((args, kwargs)):
            return self._inner(*args, **kwargs)
        import jax

        self._calls += 1
        before = None
        if self._framework == "nnx" and not self.donating:
            before = jax.tree_util.tree_flatten((args, kwargs))  # immutable arrays: no copy
        fused = self._with_flag()
        if fused is not None:
            out, flag = fused(*args, **kwargs)
            ok = bool(flag)
        else:
            out = self._inner(*args, **kwargs)
            watched = (out, _graph_nodes(args, kwargs)) if self._framework == "nnx" else out
            ok = _flag(watched)
        if ok:
            return out
        if before is not None:
            args, kwargs = jax.tree_util.tree_unflatten(before[1], before[0])
        report = self._replay(args, kwargs, out, None, self._calls)
        __tracebackhide__ = True
        hooks.on_failure(
            Failure(
                backend="jax",
                report=report,
                call=self._calls,
                label=self.label,
                fun=self._inner,
                args=args,
                kwargs=kwargs,
                kind=f"{self._framework}.{self._kind}",
                target=self._target,
                opts={k: v for k, v in self._opts.items() if _jsonable(v)},
            )
        )
        return out

    # -- the replay ---------------------------------------------------------------------------
    def pure(self, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict]:
        """``(fun, array_args, array_kwargs)``: the call as a function of its array leaves
        (the non-array leaves bound back in, as ``eqx.partition``/``eqx.combine`` do), returning
        its float outputs (and, for NNX, the modules' state after the call)."""
        return _pure(self._inner, self._target, self._framework, args, kwargs)

    def explain_call(self, args: tuple, kwargs: dict, out: Any = None) -> Any:
        """The report of one call (the reproducer uses this too)."""
        from ..jax._explain import diagnose

        if self.donating:
            return _donated_report(self, out)
        fun, a, k = self.pure(args, kwargs)
        return diagnose(fun, a, k, who="guard", outputs=None)

    def _replay(self, args: tuple, kwargs: dict, out: Any, via: Callable | None, call: int) -> Any:
        import time

        from ._failure import ordinal, say

        say(
            f"the {ordinal(call)} call of {self.label} returned NaN/Inf; "
            "replaying it through the interpreter..."
        )
        t0 = time.perf_counter()
        report = self.explain_call(args, kwargs, out)
        say(f"replay done in {time.perf_counter() - t0:.1f} s.")
        return report


# the fused programs by (transform, function, options): a jit of the same function re-created
# (``eqx.filter_jit(eqx.filter_grad(f))`` in a loop) reuses the framework's own trace cache,
# as it does without gradsan
_FUSED: dict = {}
_FUSED_MAX = 512


def _cache_key(make: Callable, target: Any, opts: dict) -> Any:
    try:
        key = (make, target, tuple(sorted(opts.items())))
        hash(key)
    except TypeError:  # an unhashable function or option: no cache
        return None
    return key


def _flagged(target: Callable, framework: str) -> Callable:
    """``target`` returning its outputs and one finiteness flag (for NNX also of the modules'
    state after the call)."""
    from ..jax._flags import finite_flag

    if framework == "eqx":
        return _eqx_flagged()(target)
    graph = framework == "nnx"

    @functools.wraps(target)
    def with_flag(*a: Any, **k: Any) -> Any:
        out = target(*a, **k)
        watched = (out, _graph_nodes(a, k)) if graph else out
        return out, finite_flag(_inexact_only(watched))

    return with_flag


_EQX_CLASS: list = []


def _eqx_flagged() -> type:
    """An equinox Module ``(target) -> (outputs, flag)``: a Module compares by its fields, so
    ``eqx.filter_jit`` of two equal ones hits equinox's trace cache, as the plain
    ``eqx.filter_jit(eqx.filter_grad(f))`` re-created in a loop does."""
    if not _EQX_CLASS:
        import equinox as eqx

        from ..jax._flags import finite_flag

        class WithFinitenessFlag(eqx.Module):
            target: Callable

            def __call__(self, *a: Any, **k: Any) -> Any:
                out = self.target(*a, **k)
                return out, finite_flag(_inexact_only(out))

        _EQX_CLASS.append(WithFinitenessFlag)
    return _EQX_CLASS[0]


def _name(target: Any) -> str:
    """The user's name for a transformed function (through partials and equinox wrappers)."""
    for _ in range(4):
        name = getattr(target, "__qualname__", None)
        if isinstance(name, str):
            return name
        inner = getattr(target, "func", None) or getattr(target, "__wrapped__", None)
        if inner is None or inner is target:
            break
        target = inner
    return type(target).__qualname__


def _graph_nodes(args: tuple, kwargs: dict) -> list:
    """The NNX objects (modules, optimizers) among the arguments: their state after a call."""
    from flax import nnx

    base = getattr(nnx, "Pytree", None) or nnx.Object
    return [v for v in (*args, *kwargs.values()) if isinstance(v, base)]


def _pure(
    inner: Callable, target: Callable, framework: str, args: tuple, kwargs: dict
) -> tuple[Callable, tuple, dict]:
    import jax

    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    static = {i: x for i, x in enumerate(leaves) if not isinstance(x, jax.Array)}
    dyn_a, dyn_k = jax.tree_util.tree_unflatten(
        treedef, [None if i in static else x for i, x in enumerate(leaves)]
    )

    @functools.wraps(target)  # the argument names, for the report
    def pure(*a: Any, **k: Any) -> Any:
        got = iter(jax.tree_util.tree_leaves((a, k)))  # the arrays, in order (None is no leaf)
        full_a, full_k = jax.tree_util.tree_unflatten(
            treedef, [static[i] if i in static else next(got) for i in range(len(leaves))]
        )
        out = inner(*full_a, **full_k)
        if framework == "nnx":
            out = (out, _graph_nodes(tuple(full_a), full_k))
        return _inexact_only(out)

    return pure, tuple(dyn_a), dict(dyn_k)


def _donated_report(w: FrameworkWatched, out: Any) -> Any:
    from .._report import Report
    from ..jax._flags import nonfinite_leaves

    report = Report(outputs=None, function=w.label, backend="jax")
    bad = [p or "output" for p, _ in nonfinite_leaves(_inexact_only(out))]
    report.notes.append(
        f"non-finite outputs: {', '.join(bad) or 'none (the NaN is in the updated state)'}. "
        "The function donates its inputs, so gradsan kept the donation and could not replay "
        "the call; run it without donation (donate='none') to get the origin."
    )
    return report


def _caller_is_user() -> bool:
    f = sys._getframe(2)  # the caller of `patched`, past the decorator form's lambda
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back  # type: ignore[assignment]
    return f is not None and is_user_file(f.f_code.co_filename)


def _wrap(hooks: Hooks, module: Any, name: str, framework: str) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        if not args and "fun" not in kwargs and "f" not in kwargs:  # decorator with options
            return lambda f: patched(f, **kwargs)
        inner = original(*args, **kwargs)
        if not _caller_is_user():
            return inner
        target: Any = args[0] if args else kwargs.get("fun", kwargs.get("f"))
        if isinstance(target, Watched):  # jit(grad(f)): check the outer one
            target = target._inner
        kind = name
        return FrameworkWatched(hooks, inner, kind, target, dict(kwargs), framework, original)

    hooks.set(module, name, patched)


def patch_equinox(hooks: Hooks, eqx: Any) -> None:
    for name in EQX_NAMES:
        if hasattr(eqx, name):
            _wrap(hooks, eqx, name, "eqx")
    # equinox warns when a Module field holds a jax.jit/jax.grad of a module (its parameters
    # would not be updated); it knows those by their type, and the user's are gradsan's
    # Watched (equinox's test_jax_transform_warn: DID NOT WARN under --gradsan)
    mod = sys.modules.get("equinox._module._module")
    types = getattr(mod, "_transform_types", None)
    if isinstance(types, set) and Watched not in types:
        hooks.set(mod, "_transform_types", types | {Watched})


def patch_nnx(hooks: Hooks, nnx: Any) -> None:
    for name in NNX_NAMES:
        if hasattr(nnx, name):
            _wrap(hooks, nnx, name, "nnx")
