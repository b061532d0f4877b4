"""The one rule for "is this file the user's code", used by both backends and `gradsan run`.

A report points at the user's line, never at gradsan's, a framework's or an installed
library's. A file is the user's unless it is:

- gradsan's own (except files registered with :func:`register_user_file`: the demo gallery
  is written as user code and reported as such),
- a pseudo-file of the import system or of torch's generated code (``<frozen ...>``,
  ``<torch...>``), or has no name,
- in the standard library or an installed package (``site-packages``, ``dist-packages``),
- inside jax, jaxlib, numpy, ml_dtypes or torch, wherever they are installed.

Other pseudo-files (``<string>``, ``<stdin>``, doctests, notebook cells) are the user's.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sysconfig

GRADSAN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

_PSEUDO = ("<frozen", "<torch")
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_FRAMEWORKS = ("jax", "jaxlib", "numpy", "ml_dtypes", "torch")
_registered: set[str] = set()


def register_user_file(filename: str) -> None:
    """Count ``filename`` (a file inside gradsan) as the user's code; call it before any of the
    file's code runs (the backends cache their answer per file)."""
    _registered.add(os.path.abspath(filename))
    is_user_file.cache_clear()


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """The standard library and the frameworks' package directories (found without importing
    them, so ``import gradsan`` still imports no backend)."""
    dirs = {
        os.path.abspath(p) + os.sep
        for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib"))
        if p
    }
    for name in _FRAMEWORKS:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            dirs.update(os.path.join(d, "") for d in spec.submodule_search_locations)
    return tuple(sorted(dirs))


def is_gradsan_file(filename: str) -> bool:
    """gradsan's own code (not a registered user file such as the demo gallery)."""
    if not filename.startswith(GRADSAN_DIR):
        return False
    return os.path.abspath(filename) not in _registered


@functools.lru_cache(maxsize=8192)
def is_user_file(filename: str) -> bool:
    """True when ``filename`` (a code object's ``co_filename``) is code the user wrote."""
    if not filename or filename.startswith(_PSEUDO):
        return False
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    if path in _registered:
        return True
    if path.startswith(GRADSAN_DIR) or any(p in path for p in _INSTALLED):
        return False
    return not path.startswith(_library_dirs())
