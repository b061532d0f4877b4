"""One call of a user's function, as gradsan sees it: flattened to array leaves, its arguments
checked and named, its outputs named (a gradient after its argument, a value, an output)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import UsageError
from . import _compat, _frameworks

__all__ = [
    "FlatCall",
    "arg_labels",
    "check_args",
    "check_callable",
    "flatten_call",
    "leaf_owner",
    "output_labels",
    "random_directions",
    "read_tangents",
    "trace",
]


# -- one call, flattened ------------------------------------------------------------------------


class FlatCall(NamedTuple):
    """``fun(*args, **kwargs)`` as a function of its flat array leaves. A jitted ``fun``'s
    static arguments stay Python values, bound in ``fun`` (they flatten to no leaves); so do
    leaves JAX cannot trace (an equinox module's functions and static fields, a string in a
    dict), filtered as ``equinox.filter_jit`` does and passed to ``fun`` untouched. A typed
    PRNG key (``jax.random.key``) is a leaf of its raw key data, re-wrapped inside ``fun``."""

    flat: list  # the traced leaves only (key data for typed keys)
    in_tree: Any
    fun: Callable  # flat leaves -> outputs; a fresh closure per call (make_jaxpr caches per callable)
    dyn_args: tuple
    dyn_kwargs: dict
    statics: tuple  # the static values, hashable (a cache key together with in_tree)
    labels: list  # the name of each traced leaf: ``theta``, ``params['w']``, ``model.layers[0]``


def is_traced_leaf(x: Any) -> bool:
    """Whether JAX traces this pytree leaf (arrays, tracers, numpy values, Python numbers); any
    other leaf (a function, a string, an equinox static field) is passed through as it is."""
    return (
        isinstance(x, (jax.Array, jax.core.Tracer, np.ndarray, np.generic))
        or isinstance(x, (bool, int, float, complex))
        or hasattr(x, "__jax_array__")
        or (hasattr(x, "dtype") and hasattr(x, "shape"))
    )


def _key_impl(x: Any) -> Any:
    """The PRNG implementation of a typed key leaf, else None."""
    dt = getattr(x, "dtype", None)
    try:
        if dt is not None and jax.dtypes.issubdtype(dt, jax.dtypes.prng_key):
            return jax.random.key_impl(x)
    except TypeError:  # pragma: no cover - a dtype jax cannot compare
        return None
    return None


def _hashable(x: Any) -> Any:
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return x


def _path_labels(fun: Callable, tree: Any) -> list[str]:
    """Names of every leaf of ``tree`` = (args, kwargs), in ``tree_flatten`` order."""
    try:
        sig = inspect.signature(fun)
        names = [
            p.name
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        names = []
    tu = jax.tree_util
    labels = []
    for path, _ in tu.tree_flatten_with_path(tree)[0]:
        head, *rest = path
        if getattr(head, "idx", None) == 0:  # positional
            i = rest[0].idx  # type: ignore[attr-defined]
            base = names[i] if i < len(names) else f"args[{i}]"
            labels.append(base + tu.keystr(tuple(rest[1:])))
        else:
            labels.append(str(rest[0].key) + tu.keystr(tuple(rest[1:])))  # type: ignore[attr-defined]
    return labels


def flatten_call(
    fun: Callable, args: tuple, kwargs: dict, traced: Callable | None = None
) -> FlatCall:
    static_nums, static_names = _compat.jit_statics(fun)
    s_pos, s_names = set(static_nums), set(static_names)
    dyn_args = tuple(None if i in s_pos else a for i, a in enumerate(args))
    dyn_kwargs = {k: (None if k in s_names else v) for k, v in kwargs.items()}
    every, in_tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
    all_labels = _path_labels(fun, (dyn_args, dyn_kwargs))
    keep = [is_traced_leaf(x) for x in every]
    keep = _frameworks.static_fields(keep, (dyn_args, dyn_kwargs))  # equinox's static fields
    impls = [_key_impl(x) if k else None for x, k in zip(every, keep)]
    flat = [
        jax.random.key_data(x) if impl is not None else x
        for x, k, impl in zip(every, keep, impls)
        if k
    ]
    labels = [lbl for lbl, k in zip(all_labels, keep) if k]
    pos = {i: args[i] for i in s_pos if i < len(args)}
    names = {k: kwargs[k] for k in s_names if k in kwargs}
    target = traced or fun
    kept_impls = [impl for impl, k in zip(impls, keep) if k]
    fixed = list(every)

    def flat_fun(*leaves):
        it = iter(
            jax.random.wrap_key_data(x, impl=impl) if impl is not None else x
            for x, impl in zip(leaves, kept_impls)
        )
        full = [next(it) if k else x for x, k in zip(fixed, keep)]
        a, k = jax.tree_util.tree_unflatten(in_tree, full)
        a = tuple(pos[i] if i in pos else x for i, x in enumerate(a))
        k = {n: (names[n] if n in names else x) for n, x in k.items()}
        return target(*a, **k)

    passed = tuple(_hashable(x) for x, k in zip(every, keep) if not k)
    statics = (
        tuple(sorted(pos.items())),
        tuple(sorted(names.items())),
        passed,
        tuple(map(str, kept_impls)),
    )
    return FlatCall(flat, in_tree, flat_fun, dyn_args, dyn_kwargs, statics, labels)


# -- input checks -------------------------------------------------------------------------------


def check_callable(fun: Any, who: str) -> None:
    if not callable(fun):
        raise UsageError(
            f"gradsan.jax.{who} takes a function, got {type(fun).__name__} {fun!r:.60}. "
            f"Wrap the function, then call it: gradsan.jax.{who}(jax.grad(loss))(params)"
        )


def check_args(flat_args: list, labels: list[str], who: str) -> None:
    """A string passed as a whole argument is refused (JAX cannot trace it; bind it first).
    Any other leaf JAX cannot trace (an equinox module's functions and static fields, a name
    in a dict) is passed through untouched, as ``equinox.filter_jit`` does."""
    for a, label in zip(flat_args, labels):
        if isinstance(a, (str, bytes)) and "[" not in label and "." not in label:
            raise UsageError(
                f"gradsan.jax.{who}: argument `{label}` is a {type(a).__name__} ({a!r:.40}); "
                "JAX can only trace arrays and numbers. Bind non-array arguments first: "
                f"gradsan.jax.{who}(functools.partial(fun, {label}={a!r:.20}))(...)"
            )


def arg_labels(fun: Callable, args: tuple, kwargs: dict) -> tuple[list[str], list]:
    """Names for the flattened arguments: ``theta``, ``params['w']``."""
    try:
        sig = inspect.signature(fun)
        names = [
            p.name
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        names = []
    labels: list[str] = []
    leaves: list = []
    for i, a in enumerate(args):
        base = names[i] if i < len(names) and not names[i].startswith("*") else f"args[{i}]"
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            labels.append(base + jax.tree_util.keystr(path))
            leaves.append(leaf)
    for k, a in kwargs.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            labels.append(k + jax.tree_util.keystr(path))
            leaves.append(leaf)
    return labels, leaves


def _grad_kind(fun: Callable) -> tuple[str, Any, bool] | None:
    """(kind, argnums, has_aux) of ``jax.grad`` / ``jax.value_and_grad`` (read by
    :func:`_compat.grad_info`) or ``equinox.filter_grad`` / ``filter_value_and_grad`` (their
    wrapper classes; gradients with respect to the first argument); None for anything else."""
    info = _compat.grad_info(fun)
    if info is not None:
        return info.kind, info.argnums, info.has_aux
    cls = type(fun)
    if cls.__module__.startswith("equinox") and cls.__name__ in (
        "_GradWrapper",
        "_ValueAndGradWrapper",
    ):
        kind = "grad" if cls.__name__ == "_GradWrapper" else "value_and_grad"
        return kind, 0, bool(getattr(fun, "_has_aux", False))
    return None


def output_labels(
    fun: Callable, out_shape: Any, args: tuple, in_labels: list[str]
) -> list[tuple[str, str]]:
    """(path, kind) of each output leaf. Only the output of a gradient transformation (jax's
    or equinox's) is called a gradient: each leaf after its argument (kind "grad"), the value
    of value_and_grad "value", its ``has_aux`` part "aux"; anything else (a forward value, a
    jvp output, a train step's new parameters) is an "output" at its path."""
    tree = jax.tree_util
    with_path = tree.tree_flatten_with_path(out_shape)[0]
    paths = [tree.keystr(p) for p, _ in with_path]
    plain = [(("output" + p) if p else "output", "output") for p in paths]
    grad = _grad_kind(fun)
    if grad is None:
        return plain
    kind, argnums, has_aux = grad
    try:
        sig = inspect.signature(getattr(fun, "__wrapped__", fun))
        names = [p.name for p in sig.parameters.values()]
    except (TypeError, ValueError):
        names = []

    def arg_name(i: int) -> str:
        return names[i] if i < len(names) else f"args[{i}]"

    def label(path: tuple) -> tuple[str, str]:
        # path into the output: locate the gradient part, then the argument
        rest = list(path)
        if kind == "value_and_grad":
            if not rest or getattr(rest[0], "idx", None) is None:
                return ("output" + tree.keystr(tuple(rest)), "output")
            head = rest.pop(0).idx
            if head == 0:
                if has_aux and rest and getattr(rest[0], "idx", None) in (0, 1):
                    part = rest.pop(0).idx
                    return (("value" if part == 0 else "aux") + tree.keystr(tuple(rest)), "value")
                return ("value" + tree.keystr(tuple(rest)), "value")
        elif has_aux:
            if not rest or getattr(rest[0], "idx", None) not in (0, 1):
                return ("output" + tree.keystr(tuple(rest)), "output")
            if rest.pop(0).idx == 1:
                return ("aux" + tree.keystr(tuple(rest)), "value")
        if isinstance(argnums, int):
            return (arg_name(argnums) + tree.keystr(tuple(rest)), "grad")
        if rest and getattr(rest[0], "idx", None) is not None and rest[0].idx < len(argnums):
            i = argnums[rest.pop(0).idx]
            return (arg_name(i) + tree.keystr(tuple(rest)), "grad")
        return ("output" + tree.keystr(tuple(rest)), "output")

    try:
        return [label(tuple(p)) for p, _ in with_path]
    except (AttributeError, IndexError, TypeError):  # pragma: no cover - an unusual layout
        return plain


# -- tracing ------------------------------------------------------------------------------------


class Traced(NamedTuple):
    """A traced call: the jaxpr of its array outputs, and every output leaf's place."""

    closed: Any  # ClosedJaxpr over the flat arguments, returning the array output leaves only
    out_shape: Any  # the full output pytree: ShapeDtypeStructs, and non-array leaves as returned
    is_array: list[bool]  # per output leaf of out_shape: returned by the jaxpr


def _is_array_leaf(x: Any) -> bool:
    return isinstance(x, (jax.Array, jax.core.Tracer, np.ndarray, np.generic)) or (
        isinstance(x, (bool, int, float, complex))
    )


def _user_line(tb: Any) -> str | None:
    """``file:line (function): source`` of the innermost frame of the user's code."""
    import linecache

    from ._source import file_class

    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if file_class(code.co_filename) == "user":
            found = (code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    if found is None:
        return None
    file, line, func = found
    text = linecache.getline(file, line).strip()
    return f"{file}:{line} ({func})" + (f": `{text}`" if text else "")


def check_not_traced(flat_args: list, who: str) -> None:
    """gradsan interprets concrete values: it runs outside jit/vmap/grad, not inside them."""
    if any(isinstance(a, jax.core.Tracer) for a in flat_args):
        raise UsageError(
            f"gradsan.jax.{who} was called inside a JAX transformation (jit, vmap, grad, scan "
            "...): its arguments are tracers, not values. Call it outside, on the transformed "
            f"function: gradsan.jax.{who}(jax.jit(step))(params, batch)"
        )


_CLOSES = (
    "gradsan.jax.{who}: the function closes over a value traced by an enclosing "
    "transformation (it was created inside jit, vmap or grad). Call gradsan outside "
    "that transformation, passing the value as an argument."
)


def check_concrete_outputs(out: Any, who: str) -> None:
    """The user's call returned tracers from concrete arguments: it closes over a traced value."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out)):
        raise UsageError(_CLOSES.format(who=who))


VALUE_ERRORS = (
    jax.errors.TracerBoolConversionError,
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
)
"""What JAX raises when traced code needs a concrete value (``if x > 0:``, ``int(x)``)."""


def control_flow_error(e: BaseException, who: str) -> UsageError:
    """The clear error for :data:`VALUE_ERRORS`, naming the user's line."""
    where = _user_line(e.__traceback__)
    at = f" at {where}" if where else ""
    return UsageError(
        f"gradsan.jax.{who}: the function uses the value of a traced array in Python "
        f"control flow or a conversion{at}. gradsan traces the function once, as jax.jit "
        "does, so `if x > 0:`, `int(x)` or `float(x)` on an argument cannot be followed. "
        "Use jnp.where(x > 0, a, b) or jax.lax.cond for the branch, or bind the value as "
        "a static Python argument (functools.partial(fun, n=3))."
    )


def trace_call(call: FlatCall, who: str, inside_ok: bool = False) -> Traced:
    """Trace ``call`` to a jaxpr, with a clear error for what JAX cannot trace.

    Outputs JAX cannot carry (a string, a metrics dict holding names, a non-array ``has_aux``)
    are kept aside and come back in ``out_shape`` as they were returned. ``inside_ok``: the
    caller re-emits the program inside the enclosing trace (nansafe under jit), so tracer
    arguments and captured tracers are fine.
    """
    if not inside_ok:
        check_not_traced(call.flat, who)
    box: dict[str, Any] = {}

    def arrays_only(*leaves: Any) -> list:
        out = call.fun(*leaves)
        flat, tree = jax.tree_util.tree_flatten(out)
        keep = [_is_array_leaf(x) for x in flat]
        box["tree"], box["flat"], box["keep"] = tree, flat, keep
        return [x for x, k in zip(flat, keep) if k]

    try:
        closed, shapes = jax.make_jaxpr(arrays_only, return_shape=True)(*call.flat)
    except VALUE_ERRORS as e:
        raise control_flow_error(e, who) from e
    except TypeError as e:
        msg = str(e)
        if "grad requires real" in msg or "integer" in msg.lower() and "grad" in msg.lower():
            raise UsageError(
                f"gradsan.jax.{who}: {msg.splitlines()[0]} Differentiate with respect to float "
                "arrays: pass jnp.asarray(x, jnp.float32) instead of an integer."
            ) from e
        if "scalar-output" in msg:
            raise UsageError(
                f"gradsan.jax.{who}: {msg.splitlines()[0]} Reduce the loss to a scalar first "
                "(jax.grad(lambda p: jnp.mean(loss(p)))), or use jax.jacrev for a Jacobian."
            ) from e
        raise
    if not inside_ok and any(isinstance(c, jax.core.Tracer) for c in closed.consts):
        raise UsageError(_CLOSES.format(who=who))
    it = iter(shapes)
    full = [next(it) if k else x for x, k in zip(box["flat"], box["keep"])]
    return Traced(closed, jax.tree_util.tree_unflatten(box["tree"], full), list(box["keep"]))


def effects_notes(jaxpr: Any, skipped: int) -> list[str]:
    """What a replay of ``jaxpr`` did with the program's callbacks, in one line each: the
    ``io_callback`` whose results the program uses ran again (its side effect repeated)."""
    from ._source import place
    from .interpreter._core import rerun_callbacks

    notes = []
    for eqn in rerun_callbacks(jaxpr):
        frame = place(eqn.source_info).user
        at = f" at {frame.file}:{frame.line} ({frame.function})" if frame is not None else ""
        notes.append(
            f"the io_callback{at} returns values the program uses, so gradsan's replay ran it "
            "again: its side effect was repeated (callbacks that return nothing "
            f"({skipped} here) are not re-run)."
        )
    return notes


# -- sanitize's tracing, and tangents along directions -------------------------------------------


def trace(fun: Callable, args: tuple, kwargs: dict, who: str = "sanitize") -> tuple[Any, list, Any]:
    """(closed jaxpr of the array outputs, flat traced args, in_tree) of ``fun`` at ``args``;
    static arguments of a jit and non-array leaves stay bound (:func:`flatten_call`)."""
    call = flatten_call(fun, args, kwargs)
    flat_args = [
        jnp.asarray(a) if isinstance(a, (bool, int, float, complex)) else a for a in call.flat
    ]
    closed = trace_call(call._replace(flat=flat_args), who).closed
    return closed, flat_args, call.in_tree


def leaf_owner(args: tuple, kwargs: dict, fun: Callable | None = None) -> list[int | str]:
    """For each traced leaf of (args, kwargs) (:func:`flatten_call`'s ``flat``): its positional
    index or keyword name. With ``fun``, a jitted function's static arguments have none."""
    s_pos, s_names = _compat.jit_statics(fun) if fun is not None else ((), ())
    tree = (
        tuple(None if i in s_pos else a for i, a in enumerate(args)),
        {k: (None if k in s_names else v) for k, v in kwargs.items()},
    )
    owner: list[int | str] = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not is_traced_leaf(leaf):
            continue
        head, first = path[0], path[1]
        owner.append(first.idx if getattr(head, "idx", None) == 0 else first.key)  # type: ignore[attr-defined]
    return owner


def random_directions(
    flat_args: list, owner: list, argnums: Any, n: int, seed: int = 0
) -> list[list]:
    """``n`` random directions: per flat argument a normal tangent, or None for a non-float
    argument or one outside ``argnums``."""
    dirs = []
    for j in range(n):
        key = jax.random.PRNGKey(seed + 7919 * j)
        ts: list = []
        for i, a in enumerate(flat_args):
            dt = getattr(a, "dtype", None)
            if (
                dt is None
                or not jnp.issubdtype(dt, jnp.inexact)
                or (argnums is not None and owner[i] not in argnums)
            ):
                ts.append(None)
                continue
            key, sub = jax.random.split(key)
            ts.append(jax.random.normal(sub, np.shape(a), jnp.float32).astype(jnp.result_type(a)))
        dirs.append(ts)
    return dirs


def read_tangents(
    flat_args: list, directions: list[list], read: Callable[[list], dict]
) -> list[dict]:
    """For each direction (one tangent or None per flat argument): ``read(args)`` run under
    ``jax.jvp`` along it returns {key: [values met on the way]}; this returns {key: [their
    tangents]} (float64; zeros where a value has none)."""
    results = []
    for tangents in directions:
        idx = [i for i, t in enumerate(tangents) if t is not None]
        found: dict = {}

        def f(*dyn: Any, idx: list = idx, found: dict = found) -> jax.Array:
            full = list(flat_args)
            for i, d in zip(idx, dyn):
                full[i] = d
            found.update(read(full))
            return jnp.zeros(())

        jax.jvp(f, [flat_args[i] for i in idx], [tangents[i] for i in idx])
        results.append({k: [_tangent_of(v) for v in vals] for k, vals in found.items()})
    return results


def _tangent_of(v: Any) -> np.ndarray:
    t = getattr(v, "tangent", None)
    if t is None or type(t).__name__ in ("Zero", "SymbolicZero"):
        return np.zeros(np.shape(v), np.float64)
    a = np.asarray(t)
    if a.dtype.kind not in "fc":
        return np.zeros(np.shape(v), np.float64)
    return a.astype(np.float64)
