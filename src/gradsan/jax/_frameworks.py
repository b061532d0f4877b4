"""What gradsan says about equinox and flax code: the public name of a library function an
origin ran inside (``eqx.nn.MLP.__call__``, ``nnx.LayerNorm.__call__``, not ``equinox
(call__)``), and equinox's ``error_if(..., on_error="nan")``, whose NaN is made on purpose: it is
named as the check that fired, at the user's call and with its condition, not as "a constant
holds nan".

Hooks (one line each, in files this module does not own): ``_source._place_of`` names library
functions with :func:`framework_name`; ``_explain.diagnose`` passes each origin's Finding
through :func:`finding`.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import sys
from collections.abc import Callable
from types import CodeType
from typing import Any

import numpy as np

from .._report import Finding, Frame

# package -> how people import it (the prefix of the names a report prints)
_ALIASES = (("equinox", "eqx"), ("flax.nnx", "nnx"), ("flax.linen", "flax.linen"))
_PACKAGES = ("equinox", "flax", "optax", "haiku")

# equinox's error_if: the jit its on_error="nan" branch runs in (equinox/_errors.py)
_ERROR_IF_JIT = "branched_error_if_impl"
_ERROR_IF_CALLS = ("error_if", "branched_error_if")

WHY_ERROR_IF = (
    "equinox's error_if with {on} returns NaN in place of its argument when its "
    "condition holds: this NaN is the check firing on purpose, not a numerical accident. "
    "The condition {cond}held for these inputs{msg}."
)
ADVICE_CAUSE = "Find why the condition {cond}holds for these inputs."
ADVICE_RAISE = (
    "To stop at the failing check with its message instead of a NaN, call error_if with "
    'on_error="raise" (or set EQX_ON_ERROR=raise).'
)


# -- library function names -----------------------------------------------------------------------


# the frameworks' own machinery between the user's call and the library function (linen's
# method wrappers, equinox's and NNX's transforms): never the function a report names
_PLUMBING = tuple(
    p.replace("/", os.sep)
    for p in (
        "/flax/linen/module.py",
        "/flax/linen/transforms.py",
        "/flax/core/",
        "/flax/nnx/transforms/",
        "/flax/nnx/graph.py",
        "/flax/nnx/extract.py",
        "/equinox/_jit.py",
        "/equinox/_ad.py",
        "/equinox/_vmap_pmap.py",
        "/equinox/_eval_shape.py",
        "/equinox/_make_jaxpr.py",
        "/equinox/_module/",
        "/equinox/_module.py",
    )
)


def framework_name(
    prefix: str, code: CodeType, inner: str | None, fallback: Callable[[str, str], str]
) -> str | None:
    """The name of the library function ``code`` belongs to: for a framework its public name
    (``eqx.nn.MLP.__call__``, ``optax.chain (update_fn)``), else ``fallback(prefix, name)``.
    ``inner``: the name from the library frame inside this one, kept when ``code`` is a
    framework's own wrapper (``nnx.jit``'s, linen's method wrappers), which is never named."""
    if prefix not in _PACKAGES:
        return fallback(prefix, code.co_name)
    if any(p in code.co_filename for p in _PLUMBING):
        return inner
    name = _public(code.co_filename, getattr(code, "co_qualname", code.co_name))
    return name or fallback(prefix, code.co_name)


@functools.lru_cache(maxsize=4096)
def _public(filename: str, qualname: str) -> str | None:
    parts = _module_parts(filename)
    if parts is None:
        return None
    outer, _, inner = qualname.partition(".<locals>.")
    head = outer.split(".")[0]
    defining = sys.modules.get(".".join(parts))
    obj = getattr(defining, head, None) if defining is not None else None
    module = ".".join(parts)
    if obj is not None:  # the shortest package that exports it: equinox.nn for MLP
        for i in range(1, len(parts) + 1):
            mod = sys.modules.get(".".join(parts[:i]))
            if mod is not None and getattr(mod, head, None) is obj:
                module = ".".join(parts[:i])
                break
    for package, alias in _ALIASES:
        if module == package or module.startswith(package + "."):
            module = alias + module[len(package) :]
            break
    name = f"{module}.{outer}"
    return f"{name} ({inner.split('.<locals>.')[-1]})" if inner else name


def _module_parts(filename: str) -> list[str] | None:
    """``['equinox', 'nn', '_mlp']`` for ``.../site-packages/equinox/nn/_mlp.py``."""
    sep = os.sep
    best = -1
    for pkg in _PACKAGES:
        i = filename.rfind(f"{sep}{pkg}{sep}")
        best = max(best, i)
    if best < 0:
        return None
    rel = filename[best + 1 :]
    if rel.endswith(".py"):
        rel = rel[:-3]
    parts = [p for p in rel.split(sep) if p]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return parts or None


def user_copy(filename: str) -> bool:
    """Whether ``filename``, whose path names a framework (``.../equinox/...``), is the user's
    code all the same: a test file of an installed package that pytest collected (``pytest
    --pyargs optax``: registered as the user's), or a file outside the installed package's
    directory (the tests of a checkout of equinox)."""
    if not any(f"{os.sep}{p}{os.sep}" in filename for p in _PACKAGES):
        return False
    from .. import _userfile

    path = os.path.abspath(filename)
    if path in _userfile._registered:
        return True
    return _userfile.is_user_file(filename) and not path.startswith(_package_dirs())


@functools.cache
def _package_dirs() -> tuple[str, ...]:
    """The installed frameworks' package directories (found without importing them)."""
    import importlib.util

    dirs: set[str] = set()
    for name in _PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            dirs.update(os.path.join(d, "") for d in spec.submodule_search_locations)
    return tuple(sorted(dirs))


# -- equinox's error_if -----------------------------------------------------------------------------


def finding(f: Finding, origin: Any, closed: Any) -> Finding:
    """``f``, or, when its origin is the NaN constant of an ``eqx.error_if(on_error="nan")``
    in ``closed`` (the traced program), the finding that names that check at the user's call."""
    if getattr(origin, "kind", None) != "const" or not origin.outs:
        return f
    try:
        site = _error_if_site(closed.jaxpr, np.asarray(origin.outs[0]))
    except Exception:  # a program gradsan cannot walk: keep the finding as it is
        return f
    if site is None:
        return f
    return _error_if_finding(f, site, origin)


def _bodies(eqn: Any) -> list:
    out = []
    for p in eqn.params.values():
        for sub in p if isinstance(p, (tuple, list)) else (p,):
            if hasattr(getattr(sub, "jaxpr", None), "eqns") or hasattr(sub, "eqns"):
                out.append(sub)
    return out


def _consts(closed: Any) -> list:
    """Every constant and literal of a closed jaxpr and of the jaxprs nested in it (a scalar
    NaN is a literal operand)."""
    from jax.extend import core as jcore

    found = list(getattr(closed, "consts", ()))
    jaxpr = getattr(closed, "jaxpr", closed)
    for eqn in jaxpr.eqns:
        found += [v.val for v in eqn.invars if isinstance(v, jcore.Literal)]
        for sub in _bodies(eqn):
            found += _consts(sub)
    found += [v.val for v in jaxpr.outvars if isinstance(v, jcore.Literal)]
    return found


def _sites(jaxpr: Any) -> list:
    """The ``branched_error_if_impl`` jit equations of ``jaxpr``, nested bodies too."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.params.get("name") == _ERROR_IF_JIT and "jaxpr" in eqn.params:
            found.append(eqn)
            continue
        for sub in _bodies(eqn):
            found += _sites(getattr(sub, "jaxpr", sub))
    return found


def _error_if_site(jaxpr: Any, value: np.ndarray) -> Any:
    """The error_if equation whose NaN constant ``value`` is: the one holding it (same memory),
    else the only one holding an all-NaN constant of its shape and dtype."""
    alike = []
    for eqn in _sites(jaxpr):
        for c in _consts(eqn.params["jaxpr"]):
            a = np.asarray(c)
            if a.shape != value.shape or a.dtype != value.dtype:
                continue
            if np.may_share_memory(a, value):
                return eqn
            if a.size and np.isnan(a).all() and np.isnan(value).all():
                alike.append(eqn)
                break
    return alike[0] if len(alike) == 1 else None


def _error_if_finding(f: Finding, site: Any, origin: Any) -> Finding:
    from .._report._build import catalog_finding
    from .._report._records import FixProposal
    from ._source import place

    where = place(site.source_info).user
    call = _call_at(where)
    cond = msg = ""
    default = False
    if call is not None and where is not None:
        cond = _segment(where, call, 1)
        msg_node = call.args[2] if len(call.args) > 2 else None
        if isinstance(msg_node, ast.Constant) and isinstance(msg_node.value, str):
            msg = msg_node.value
        default = not any(k.arg == "on_error" for k in call.keywords)
    cond_words = f"`{cond}` " if cond else ""
    msg_words = f' (its message: "{msg}")' if msg else ""
    a = np.asarray(origin.outs[0])
    note = (
        f"its condition `{cond}` held"
        if cond
        else ("called inside a library, its condition held" if call is None else "")
    )
    on = "EQX_ON_ERROR=nan" if default else 'on_error="nan"'
    g = catalog_finding(
        backend="jax",
        entry_id=None,
        phase="value",
        primitive=f"eqx.error_if ({on})",
        where=where,
        result=f.result,
        count=int(np.isnan(a).sum()),
        size=int(a.size),
        context=f.context,
        scope=f.scope,
        outputs=f.outputs,
        detail={"note": note, "origin_op": "error_if"},
    )
    g.title = f"eqx.error_if returned NaN ({on}): its check fired"
    g.values = (
        f"error_if returned NaN in place of its argument ({g.count} of {g.size} elements) "
        f"because its condition {cond_words}held"
    ).replace("  ", " ")
    g.explanation = WHY_ERROR_IF.format(on=on, cond=cond_words, msg=msg_words)
    g.fixes = [
        FixProposal(ADVICE_CAUSE.format(cond=cond_words), status="prose"),
        FixProposal(ADVICE_RAISE, status="prose"),
    ]
    g.suggestions = [p.text() for p in g.fixes]
    return g


def _call_at(where: Frame | None) -> ast.Call | None:
    """The ``error_if(...)`` call expression that starts at ``where`` (its line and column)."""
    if where is None:
        return None
    tree = _parsed(where.file)
    if tree is None:
        return None
    best = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node.lineno != where.line:
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name not in _ERROR_IF_CALLS:
            continue
        if where.column is None or node.col_offset == where.column:
            return node
        best = best or node
    return best


def _parsed(file: str) -> ast.Module | None:
    return _parse("".join(linecache.getlines(file)))


@functools.lru_cache(maxsize=64)
def _parse(text: str) -> ast.Module | None:
    if not text:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _segment(where: Frame, call: ast.Call, i: int) -> str:
    if len(call.args) <= i:
        return ""
    text = ast.get_source_segment("".join(linecache.getlines(where.file)), call.args[i])
    return " ".join((text or "").split())


# -- equinox's static fields ----------------------------------------------------------------------


def _is_eqx_module(x: Any) -> bool:
    eqx = sys.modules.get("equinox")
    module = getattr(eqx, "Module", None) if eqx is not None else None
    return module is not None and isinstance(x, module)


def module_scalars(tree: Any) -> list[bool] | None:
    """For each leaf of ``tree`` (in ``jax.tree_util.tree_leaves`` order), whether it is a Python
    number inside an equinox Module (``Dropout.p``, ``inference=False``): equinox's filtered
    transformations keep such a leaf static, so code branches on it in Python. None when the
    tree holds no equinox Module (nothing to keep static)."""
    import jax

    if "equinox" not in sys.modules:
        return None
    found = False

    def mark(node: Any) -> Any:
        nonlocal found
        if _is_eqx_module(node):
            found = True
            return jax.tree_util.tree_map(
                lambda leaf: isinstance(leaf, (bool, int, float, complex)), node
            )
        return False

    marked = jax.tree_util.tree_map(mark, tree, is_leaf=_is_eqx_module)
    if not found:
        return None
    return [bool(m) for m in jax.tree_util.tree_leaves(marked)]


def static_fields(keep: list[bool], tree: Any) -> list[bool]:
    """``keep`` (which leaves of ``tree`` are traced) with equinox's static Python numbers left
    out, as ``eqx.filter_jit`` leaves them out."""
    marks = module_scalars(tree)
    if marks is None or len(marks) != len(keep):
        return keep
    return [k and not m for k, m in zip(keep, marks)]


# -- NNX's in-place updates -----------------------------------------------------------------------


def graph_args(fun: Callable, args: tuple, kwargs: dict) -> list[str]:
    """The names of the NNX objects (modules, optimizers) passed as whole arguments: a call of
    ``nnx.jit`` / ``nnx.grad`` updates them in place, so their state after the call is an output
    of the call as much as what it returns. [] when flax.nnx is not imported or none is passed."""
    nnx = sys.modules.get("flax.nnx")
    base = (getattr(nnx, "Pytree", None) or getattr(nnx, "Object", None)) if nnx else None
    if base is None:
        return []
    import inspect

    try:
        target = getattr(fun, "__wrapped__", fun)
        names = [p.name for p in inspect.signature(target).parameters.values()]
    except (TypeError, ValueError):
        names = []
    found = [
        names[i] if i < len(names) else f"args[{i}]"
        for i, a in enumerate(args)
        if isinstance(a, base)
    ]
    return found + [k for k, v in kwargs.items() if isinstance(v, base)]


def with_graph_state(fun: Callable) -> Callable:
    """``fun`` returning ``(its outputs, [each NNX object argument after the call])``: traced on
    the copies gradsan makes of the arguments, the second part is the state ``fun`` wrote."""
    nnx = sys.modules["flax.nnx"]
    base = getattr(nnx, "Pytree", None) or nnx.Object

    @functools.wraps(fun)
    def with_state(*a: Any, **k: Any) -> Any:
        out = fun(*a, **k)
        return out, [v for v in (*a, *k.values()) if isinstance(v, base)]

    return with_state


def state_labels(names: list[str], state_shape: Any) -> list[tuple[str, str]]:
    """(path, kind) of each leaf of the NNX objects' state after the call: ``model.lin.kernel
    .value (after the call)``."""
    import jax

    tree = jax.tree_util
    labels = []
    for path, _ in tree.tree_flatten_with_path(state_shape)[0]:
        head, rest = path[0], path[1:]
        i = getattr(head, "idx", 0)
        name = names[i] if i < len(names) else f"args[{i}]"
        labels.append((f"{name}{tree.keystr(tuple(rest))} (after the call)", "output"))
    return labels


def nnx_objects(args: tuple, kwargs: dict) -> list[Any]:
    """The NNX objects (modules, optimizers) among the arguments: [] at once when flax.nnx is
    not imported (guard asks on every call)."""
    nnx = sys.modules.get("flax.nnx")
    if nnx is None:
        return []
    base = getattr(nnx, "Pytree", None) or getattr(nnx, "Object", None)
    if base is None:
        return []
    return [v for v in (*args, *kwargs.values()) if isinstance(v, base)]


def nnx_states(objs: list[Any]) -> list[Any]:
    """Each object's state, in new Variable containers holding the same arrays (no copy of
    the data: JAX arrays are immutable and NNX's in-place update swaps them, while the
    Variables of ``nnx.state`` are the object's own): what :func:`nnx_restore` puts back."""
    import jax

    nnx = sys.modules["flax.nnx"]
    return [jax.tree_util.tree_map(lambda x: x, nnx.state(o)) for o in objs]


def nnx_restore(objs: list[Any], states: list[Any]) -> None:
    nnx = sys.modules["flax.nnx"]
    for o, s in zip(objs, states):
        nnx.update(o, s)


@functools.lru_cache(maxsize=1)
def _all_finite() -> Callable:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def check(xs: list) -> Any:
        return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs]))

    return check


def nnx_finite(objs: list[Any]) -> bool:
    """Whether every float array of the objects' state is finite (one compiled reduction)."""
    import jax
    import jax.numpy as jnp

    leaves = [
        x
        for x in jax.tree_util.tree_leaves(nnx_states(objs))
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    return not leaves or bool(_all_finite()(leaves))
