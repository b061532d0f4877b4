"""Finiteness flags of a pytree of outputs, and the list of its non-finite leaves.

``finite_flag`` is traced into the caller's program (guard fuses it into the step it checks,
optax's ``guard_finite`` into the update); ``host_flag`` decides without compiling anything
when it can; ``nonfinite_leaves`` names the leaves that went NaN/Inf.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _inexact(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)


FUSE_LIMIT = 128
"""Up to this many float leaves, one reduction per leaf (each fuses into the computation that
produces its leaf); beyond it one reduction over all of them, raveled and concatenated: XLA's
compile time grows superlinearly with the number of separate reductions (issue 17: a
1000-layer MLP's guarded step did not compile in 300 s)."""


def finite_flag(out: Any) -> jax.Array:
    """True when every float leaf of ``out`` is finite.

    x * 0 is exactly 0 for finite x and NaN for inf or NaN, so a sum of such terms decides it
    with no overflow false alarm. With few leaves, one reduction per leaf lets XLA fuse each
    into the computation that produces the leaf, so no extra pass over memory is made; with
    many (more than ``FUSE_LIMIT``), one reduction over their concatenation keeps the compile
    time linear in the number of leaves.
    """
    parts: list = []
    for x in jax.tree_util.tree_leaves(out):
        if not _inexact(x):
            continue
        parts.extend((jnp.real(x), jnp.imag(x)) if jnp.iscomplexobj(x) else (x,))
    if not parts:
        return jnp.array(True)
    if len(parts) > FUSE_LIMIT:
        flat = [jnp.ravel(p * 0).astype(jnp.float32) for p in parts]
        return jnp.isfinite(jnp.sum(jnp.concatenate(flat)))
    total = jnp.sum(parts[0] * 0, dtype=jnp.float32)
    for part in parts[1:]:
        total = total + jnp.sum(part * 0, dtype=jnp.float32)
    return jnp.isfinite(total)


def float_leaves(out: Any) -> list:
    """The float array leaves of ``out`` (strings, Python metrics and functions left out)."""
    return [x for x in jax.tree_util.tree_leaves(out) if _inexact(x)]


separate_flag = jax.jit(finite_flag)
"""``finite_flag`` as its own small program, for outputs already computed."""


def host_flag(out: Any) -> bool:
    """The same check without compiling anything: numpy on host-resident (CPU) outputs, one
    small jitted reduction otherwise. Used until the fused program is compiled."""
    leaves = [x for x in jax.tree_util.tree_leaves(out) if _inexact(x)]
    if all(
        isinstance(x, jax.Array) and all(d.platform == "cpu" for d in x.devices()) for x in leaves
    ):
        return all(bool(np.isfinite(np.asarray(x)).all()) for x in leaves)
    return bool(separate_flag(leaves))


def nonfinite_leaves(tree: Any) -> list[tuple[str, Any]]:
    """``(path, leaf)`` of every float leaf of ``tree`` with a NaN or Inf, in tree order; the
    path is ``jax.tree_util.keystr`` ("" for a bare array)."""
    bad = []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if _inexact(x) and bool((~jnp.isfinite(x)).any()):
            bad.append((jax.tree_util.keystr(path), x))
    return bad
