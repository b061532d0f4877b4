"""Equation -> the user's Frame, and the library function it ran inside.

Tracebacks come from ``Traceback.raw_frames()`` (innermost first) and ``co_positions`` for
columns: public API only. Frames in jax, jaxlib, gradsan and known libraries are not the user's.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys

from .._report import Frame
from .._report._frames import frame_at
from .._userfile import GRADSAN_DIR, is_gradsan_file, is_user_file
from ._frameworks import framework_name, user_copy

_SEP = os.sep

# Libraries: frames inside them are never "the user's line"; their functions can be named.
_LIBRARIES = {
    f"jax{_SEP}_src{_SEP}numpy{_SEP}linalg.py": "jnp.linalg",
    f"jax{_SEP}_src{_SEP}numpy{_SEP}reductions.py": "jnp",
    f"jax{_SEP}_src{_SEP}numpy{_SEP}lax_numpy.py": "jnp",
    f"jax{_SEP}_src{_SEP}numpy{_SEP}tensor_contractions.py": "jnp",
    f"jax{_SEP}_src{_SEP}nn{_SEP}functions.py": "jax.nn",
    f"jax{_SEP}_src{_SEP}ops{_SEP}special.py": "jax.scipy.special",
    f"jax{_SEP}_src{_SEP}scipy{_SEP}special.py": "jax.scipy.special",
    f"jax{_SEP}_src{_SEP}lax{_SEP}linalg.py": "jax.lax.linalg",
    f"{_SEP}flax{_SEP}": "flax",
    f"{_SEP}optax{_SEP}": "optax",
    f"{_SEP}equinox{_SEP}": "equinox",
    f"{_SEP}haiku{_SEP}": "haiku",
}
# Plumbing: jax's own machinery, never a key frame or a library name.
_PLUMBING = (
    f"jax{_SEP}_src{_SEP}lax{_SEP}lax.py",
    f"jax{_SEP}_src{_SEP}lax{_SEP}special.py",
    f"jax{_SEP}_src{_SEP}lax{_SEP}control_flow",
    f"jax{_SEP}_src{_SEP}pjit.py",
    f"jax{_SEP}_src{_SEP}core.py",
    f"jax{_SEP}_src{_SEP}interpreters{_SEP}",
    f"jax{_SEP}_src{_SEP}numpy{_SEP}ufunc_api.py",
    f"jax{_SEP}_src{_SEP}numpy{_SEP}array_methods.py",
    f"jax{_SEP}_src{_SEP}numpy{_SEP}ufuncs.py",
    f"jax{_SEP}_src{_SEP}numpy{_SEP}util.py",
    f"jax{_SEP}_src{_SEP}source_info_util.py",
    f"jax{_SEP}_src{_SEP}api.py",
    f"jax{_SEP}_src{_SEP}api_util.py",
    f"jax{_SEP}_src{_SEP}linear_util.py",
    f"jax{_SEP}_src{_SEP}traceback_util.py",
    f"jax{_SEP}_src{_SEP}custom_derivatives.py",
    f"jax{_SEP}_src{_SEP}ad_checkpoint.py",
    f"jax{_SEP}_src{_SEP}util.py",
    f"jax{_SEP}_src{_SEP}dtypes.py",
    f"jax{_SEP}_src{_SEP}lax{_SEP}slicing.py",
    f"jax{_SEP}_src{_SEP}numpy{_SEP}indexing.py",
    f"jax{_SEP}_src{_SEP}tree_util.py",
    f"jax{_SEP}_src{_SEP}shard_map.py",
)


@functools.lru_cache(maxsize=4096)
def file_class(filename: str) -> str:
    """'user', 'library:<prefix>', 'plumbing' or 'internal' (gradsan/_userfile.py decides
    what is the user's; this adds jax's own machinery and the libraries that can be named)."""
    if is_gradsan_file(filename):
        return "plumbing"
    for pat in _PLUMBING:
        if pat in filename:
            return "plumbing"
    if user_copy(filename):  # a checkout's tests, an installed package's collected tests
        return "user"
    for pat, prefix in _LIBRARIES.items():
        if pat in filename:
            return "library:" + prefix
    return "user" if is_user_file(filename) else "internal"


@dataclasses.dataclass(frozen=True)
class Place:
    """Where an equation came from. ``user`` is None inside a library jit's body."""

    user: Frame | None
    key: tuple | None  # the innermost non-plumbing position: groups a primal op with its jvp
    library: str | None  # "jnp.linalg.norm"
    custom_vjp: bool = False  # traced by a custom_vjp: backward ops carry the call site (P3)


_EMPTY = Place(None, None, None)


def _position(code, lasti: int):
    try:
        pos = list(code.co_positions())[lasti // 2]
    except (IndexError, ValueError, AttributeError):
        return None
    return pos  # (line, end_line, col, end_col)


def _frame(code, lasti: int) -> Frame | None:
    return frame_at(code, lasti)


def _libname(prefix: str, func: str) -> str:
    import re

    func = func.split(".")[-1].lstrip("_") or func
    func = re.sub(r"_(jvp|vjp|fwd|bwd|impl|rule|transpose)$", "", func)
    if prefix in ("flax", "optax", "equinox", "haiku"):
        return f"{prefix} ({func})"
    return f"{prefix}.{func}"


def place(source_info) -> Place:
    tb = getattr(source_info, "traceback", None)
    if tb is None:
        return _EMPTY
    return _place_of(tb)


@functools.lru_cache(maxsize=65536)
def _place_of(tb) -> Place:
    try:
        codes, lastis = tb.raw_frames()
    except Exception:  # pragma: no cover - jaxlib without raw_frames
        return _EMPTY
    key = None
    library = None
    cvjp = any(c.co_name == "process_custom_vjp_call" for c in codes)
    for code, lasti in zip(codes, lastis):
        cls = file_class(code.co_filename)
        if cls == "plumbing" or cls == "internal":
            continue
        if key is None:
            pos = _position(code, lasti)
            key = (code.co_filename, pos)
        if cls.startswith("library:"):
            library = framework_name(cls[8:], code, library, _libname)
            continue
        # the first user frame
        return Place(_frame(code, lasti), key, library, cvjp)
    return Place(None, key, library, cvjp)


def exclude_gradsan() -> None:
    """Keep gradsan's own frames out of jax's tracebacks (as Equinox does)."""
    try:
        from jax.extend import source_info_util as siu

        siu.register_exclusion(GRADSAN_DIR.rstrip(os.sep))
    except Exception:  # pragma: no cover
        pass


_OP_TEXT = {
    "div": ("/",),
    "log": ("log",),
    "sqrt": ("sqrt",),
    "rsqrt": ("rsqrt",),
    "pow": ("**", "pow"),
    "integer_pow": ("**",),
    "mul": ("*",),
    "sub": (" - ", "subtract"),
    "add": (" + ", "add"),
    "exp": ("exp",),
    "atan2": ("arctan2", "atan2"),
    "acos": ("arccos", "acos"),
    "asin": ("arcsin", "asin"),
    "log1p": ("log1p",),
}


def custom_vjp_rule_frame(call_site: Frame, prim: str) -> Frame | None:
    """The line of the custom_vjp backward rule called at ``call_site`` that computes ``prim``.

    JAX traces a custom_vjp's bwd under the call site's traceback (its equations carry no line
    of their own), so the rule is found from the call: the callee's name in the call's source
    text, looked up in the caller's module, then the rule's first line that spells the
    operation (``/`` for div), else its ``def`` line.
    """
    import inspect
    import re

    if call_site.column is None or call_site.end_column is None:
        return None
    text = call_site.code[call_site.column : call_site.end_column]
    m = re.match(r"\s*([A-Za-z_][\w.]*)\s*\(", text)
    if not m:
        return None
    module = next(
        (
            mod
            for mod in list(sys.modules.values())
            if getattr(mod, "__file__", None) == call_site.file
        ),
        None,
    )
    obj: object = module
    for part in m.group(1).split("."):
        obj = getattr(obj, part, None)
    bwd = getattr(obj, "bwd", None)
    code = getattr(bwd, "__code__", None)
    if bwd is None or code is None:
        return None
    try:
        lines, first = inspect.getsourcelines(bwd)
    except (OSError, TypeError):
        return None
    needles = _OP_TEXT.get(prim, (prim,))
    for i, line in enumerate(lines[1:], first + 1):
        body = line.split("#")[0]
        if any(n in body for n in needles):
            return Frame(code.co_filename, i, None, code.co_name, line.rstrip("\n"), None)
    return Frame(code.co_filename, first, None, code.co_name, lines[0].rstrip("\n"), None)
