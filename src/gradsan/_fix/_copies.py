"""Copies of the user's arguments for the fix verifier's runs (JAX).

A train step can update what it is given in place: an NNX module and optimizer (``nnx.jit``
writes their new state back), a dict or list of arrays, any object holding them. The verifier
runs the original and the patched program several times, so each run gets its own copy of the
arguments as they were before the user's call, and the user's objects are left exactly as the
user's call left them. JAX arrays are immutable: a copy shares them.
"""

from __future__ import annotations

import copy
from typing import Any


class Uncopyable(Exception):
    """An argument gradsan cannot copy: running the program again could change it."""


_ATOMS = (int, float, complex, bool, str, bytes, type(None))


def _immutable(x: Any) -> bool:
    import jax

    if isinstance(x, (*_ATOMS, jax.Array)):
        return True
    if type(x) is tuple:
        return all(_immutable(v) for v in x)
    return False


def _memo(args: tuple, kwargs: dict) -> dict[int, Any]:
    """JAX arrays among the arguments' pytree leaves, mapped to themselves: a copy shares them."""
    import jax

    try:
        leaves = jax.tree_util.tree_leaves((args, kwargs))
    except Exception:  # an argument JAX cannot flatten: deepcopy copies what it holds
        leaves = []
    return {id(a): a for a in leaves if isinstance(a, jax.Array)}


def copied(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with every argument that could be changed in place deep-copied (once
    for all of them: an optimizer holding the module passed beside it still holds the copy);
    raises :class:`Uncopyable` naming the argument gradsan cannot copy."""
    if all(_immutable(a) for a in args) and all(_immutable(v) for v in kwargs.values()):
        return args, kwargs
    memo = _memo(args, kwargs)
    try:
        return copy.deepcopy((args, kwargs), memo)
    except Exception:
        pass
    for i, a in enumerate(args):  # the one that cannot be copied, for the message
        try:
            copy.deepcopy(a, dict(memo))
        except Exception as e:
            raise Uncopyable(f"argument {i} ({type(a).__name__})") from e
    for k, v in kwargs.items():
        try:
            copy.deepcopy(v, dict(memo))
        except Exception as e:
            raise Uncopyable(f"argument {k} ({type(v).__name__})") from e
    raise Uncopyable("the arguments")
