"""Every touch of JAX internals or version-dependent behaviour, in one place.

When JAX renames a primitive, a parameter, or changes how a transformation wraps a function,
this is the module to change. Nothing else in gradsan reads ``eqn.params`` layouts of
higher-order primitives, name stacks, or the closures of ``jax.grad``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax import lax
from jax.extend import core as jcore

from ._evalcache import evaluate as _eval_concrete

__all__ = [
    "GradInfo",
    "OPAQUE",
    "cond_p",
    "scan_p",
    "shard_map_p",
    "while_p",
    "bind",
    "call_body",
    "closed",
    "collective_primitive",
    "grad_info",
    "is_backward",
    "is_jitted",
    "mesh_context",
    "jit_statics",
    "sub_backward",
]

# -- primitives that gradsan's rule tables are keyed by ------------------------------------------

cond_p = lax.cond_p
scan_p = lax.scan_p
while_p = lax.while_p
shard_map_p: Any
try:
    from jax._src.shard_map import shard_map_p  # private: the primitive is not exported
except ImportError:  # pragma: no cover - another JAX layout
    shard_map_p = None


def collective_primitive(name: str) -> Any:
    """The Primitive of a collective (``psum``, ``all_gather``, ``pvary`` ...), or None."""
    from jax._src import core as _core  # private: collectives are not exported
    from jax._src.lax import parallel as _parallel

    return getattr(_parallel, f"{name}_p", None) or getattr(_core, f"{name}_p", None)


# Higher-order primitives whose body runs per device (per-block shapes, named axes): they are
# never entered as a plain call. Their own rules (if any) live with each transformation.
OPAQUE = frozenset({"shard_map", "xla_pmap"})


def closed(j: Any) -> tuple[Any, list]:
    """(jaxpr, consts) of a Jaxpr or ClosedJaxpr parameter."""
    if isinstance(j, jcore.ClosedJaxpr):
        return j.jaxpr, list(j.consts)
    return j, []


def bind(eqn: Any, invals: list, params: dict | None = None) -> list:
    """Evaluate one equation on concrete (or traced) values; always a list of outputs."""
    if params is None and (fast := _eval_concrete(eqn, invals)) is not None:  # cached program
        return fast
    p = params if params is not None else eqn.primitive.get_bind_params(eqn.params)
    if isinstance(p, tuple):  # older jax: (subfuns, params)
        subfuns, p = p
        out = eqn.primitive.bind(*subfuns, *invals, **p)
    else:
        out = eqn.primitive.bind(*invals, **p)
    return list(out) if eqn.primitive.multiple_results else [out]


def _avals_match(vars_a: Sequence, vars_b: Sequence) -> bool:
    if len(vars_a) != len(vars_b):
        return False
    for a, b in zip(vars_a, vars_b):
        x, y = getattr(a, "aval", None), getattr(b, "aval", None)
        if getattr(x, "shape", None) != getattr(y, "shape", None):
            return False
    return True


_CALL_PARAM: dict[Any, str | None] = {}


def call_body(eqn: Any) -> tuple[Any, list] | None:
    """(body jaxpr, consts) when ``eqn`` is call-like: a primitive with one jaxpr parameter
    whose inputs and outputs are the equation's own (pjit, closed_call, checkpoint,
    custom_jvp_call, custom_vjp_call, ...). Found by looking at the parameters, as
    equinox's ``_finalise_jaxpr`` does, so no table of call primitives is kept. scan and
    while have bodies of other shapes and are never call-like; per-device bodies
    (:data:`OPAQUE`) are excluded."""
    prim = eqn.primitive
    try:
        name = _CALL_PARAM[prim]
    except KeyError:
        name = None
        if prim.name not in OPAQUE:
            for k, v in eqn.params.items():
                if isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)):
                    j = v.jaxpr if isinstance(v, jcore.ClosedJaxpr) else v
                    if _avals_match(j.invars, eqn.invars) and _avals_match(j.outvars, eqn.outvars):
                        name = k
                        break
        _CALL_PARAM[prim] = name
    if name is None:
        return None
    return closed(eqn.params[name])


def _name_stack(eqn: Any) -> str:
    return str(eqn.source_info.name_stack)


def sub_backward(eqn: Any, outer: bool) -> bool:
    """Whether the body of a higher-order equation runs in the backward pass."""
    return outer or "transpose" in _name_stack(eqn)


def is_backward(eqn: Any, outer: bool) -> bool:
    """Whether a first-order equation belongs to the backward pass. A rematerialised forward
    computation inside the backward pass recomputes primal values, so it counts as forward."""
    ns = _name_stack(eqn)
    if "rematted_computation" in ns:
        return False
    return outer or "transpose" in ns


# -- meshes -------------------------------------------------------------------------------------


@contextlib.contextmanager
def mesh_context(values: Sequence) -> Iterator[None]:
    """The mesh of arrays sharded over explicit mesh axes, set while gradsan evaluates their
    program equation by equation (JAX binds such equations only inside ``jax.set_mesh``)."""
    mesh = None
    for v in values:
        m = getattr(getattr(v, "sharding", None), "mesh", None)
        types = getattr(m, "axis_types", ()) or ()
        if any(str(t).endswith("Explicit") for t in types):
            mesh = m
            break
    set_mesh = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)
    if mesh is None or set_mesh is None:
        yield
        return
    with set_mesh(mesh):
        yield


# -- jax.jit -------------------------------------------------------------------------------------


def is_jitted(fun: Any) -> bool:
    """Whether ``fun`` is a ``jax.jit`` function object."""
    return getattr(fun, "_jit_info", None) is not None


def jit_statics(fun: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(static_argnums, static_argnames) of a ``jax.jit`` function; empty for anything else."""
    info = getattr(fun, "_jit_info", None)  # private: jit's options, read-only here
    return (
        tuple(getattr(info, "static_argnums", ()) or ()),
        tuple(getattr(info, "static_argnames", ()) or ()),
    )


# -- jax.grad and jax.value_and_grad, recognised without reading docstrings ----------------------


@dataclasses.dataclass(frozen=True)
class GradInfo:
    """What ``jax.grad`` / ``jax.value_and_grad`` were called with."""

    kind: str  # "grad" or "value_and_grad"
    fun: Callable  # the differentiated function
    argnums: int | tuple[int, ...]
    has_aux: bool


def _cell(fn: Any, name: str) -> Any:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None)
    if code is None or cells is None or name not in code.co_freevars:
        raise LookupError(name)
    return cells[code.co_freevars.index(name)].cell_contents


def _reference_codes() -> dict[Any, str]:
    def f(x):
        return x

    codes = {}
    for kind, made in (
        ("grad", jax.grad(f)),
        ("grad_aux", jax.grad(f, has_aux=True)),
        ("value_and_grad", jax.value_and_grad(f)),
    ):
        codes[_unboundary(made).__code__] = kind
    return codes


def _other_codes() -> set[Any]:
    """The code objects of transformations whose result is another function than the one they
    wrap (a batch of gradients, a Jacobian): grad_info never looks through them."""

    def f(x):
        return x

    boundary = getattr(jax.grad(f), "__code__", None)  # jax's traceback wrapper, shared
    codes = set()
    for made in (jax.vmap(f), jax.jacfwd(f), jax.jacrev(f), jax.hessian(f)):
        for code in (getattr(made, "__code__", None), _unboundary(made).__code__):
            if code is not None and code not in (f.__code__, boundary):
                codes.add(code)
    return codes


def _unboundary(fn: Any) -> Any:
    """The function inside jax's traceback-filtering wrapper (``api_boundary``)."""
    try:
        inner = _cell(fn, "fun")
    except LookupError:
        return fn
    return inner if callable(inner) else fn


_CODES: dict[Any, str] | None = None
_OTHER: set[Any] | None = None


def grad_info(fun: Any) -> GradInfo | None:
    """The arguments of ``jax.grad`` / ``jax.value_and_grad`` that made ``fun``, or None for any
    other function. Read from the closures of JAX's wrappers, compared by code object (never by
    docstring); None when this JAX lays them out differently."""
    global _CODES, _OTHER
    if not callable(fun) or not hasattr(fun, "__wrapped__"):
        return None
    if _CODES is None:
        try:
            _CODES = _reference_codes()
        except Exception:  # a JAX whose wrappers differ: recognise nothing
            _CODES = {}
    if _OTHER is None:
        try:
            _OTHER = _other_codes()
        except Exception:  # pragma: no cover - a JAX whose wrappers differ
            _OTHER = set()
    inner = _unboundary(fun)
    if {getattr(inner, "__code__", None), getattr(fun, "__code__", None)} & _OTHER:
        return None  # vmap(jax.grad(f)), jacfwd(jax.grad(f)): not jax.grad(f)
    kind = _CODES.get(getattr(inner, "__code__", None))
    if kind is None:
        # jax.jit(jax.grad(f)) and functools.wraps wrappers: look through ``__wrapped__``
        nxt = getattr(fun, "__wrapped__", None)
        return grad_info(nxt) if nxt is not None and nxt is not fun else None
    try:
        vg = inner if kind == "value_and_grad" else _unboundary(_cell(inner, "value_and_grad_f"))
        argnums = _cell(vg, "argnums")
        has_aux = bool(_cell(vg, "has_aux"))
        wrapped = _cell(vg, "fun")
    except LookupError:
        return None
    if isinstance(argnums, list):
        argnums = tuple(argnums)
    return GradInfo(
        "value_and_grad" if kind == "value_and_grad" else "grad", wrapped, argnums, has_aux
    )
