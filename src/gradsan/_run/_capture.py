"""What a JAX reproducer needs beyond the arrays, re-created from the script: the script is run
again (as ``__main__``, with the recorded arguments and environment, gradsan's checks off)
until the first call of the same function whose array inputs have the saved paths, shapes
and dtypes; that call is not made: its arrays are replaced by the saved ones, and the
function, the non-array parts of its inputs (modules, optax functions in a TrainState,
static fields) and the arrays are handed back. A notebook-style script (its loop at module
level) is therefore run up to that first call, not whole.

Also here: the record of the environment variables the script reads (``os.environ``
accesses made by the user's code).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._userfile import is_user_file

if TYPE_CHECKING:
    from ._hooks import Hooks


def leaf_specs(args: tuple, kwargs: dict) -> tuple[list[str], list[Any]]:
    """The paths (``jax.tree_util.keystr``) and leaves of a call's inputs."""
    import jax

    flat = jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
    return [jax.tree_util.keystr(p) for p, _ in flat], [x for _, x in flat]


def array_spec(x: Any) -> list | None:
    """``[shape, dtype]`` of an array leaf (a typed PRNG key: its key data's), None otherwise."""
    import jax

    if not isinstance(x, jax.Array):
        return None
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(x)
        return [list(data.shape), f"key<{jax.random.key_impl(x)}>:{data.dtype}"]
    return [list(x.shape), str(x.dtype)]


class Captured(BaseException):
    """Ends the re-run at the captured call (a BaseException: the script's ``except
    Exception`` does not swallow it)."""

    def __init__(self, watched: Any, args: tuple, kwargs: dict) -> None:
        super().__init__("gradsan captured the call")
        self.watched, self.args, self.kwargs = watched, args, kwargs


def capturer(meta: dict, arrays: Any) -> Callable[[Any, tuple, dict], None]:
    """The hook that stops the re-run at the first call matching ``meta`` and substitutes the
    saved arrays (``arrays[f"leaf{i}"]``)."""
    import jax
    import jax.numpy as jnp

    from ._patch_jax import _has_tracer

    want_paths, want_specs = meta["paths"], meta["specs"]

    def capture(watched: Any, args: tuple, kwargs: dict) -> None:
        if watched.label != meta["label"] or _has_tracer((args, kwargs)):
            return
        paths, leaves = leaf_specs(args, kwargs)
        if paths != want_paths or [array_spec(x) for x in leaves] != want_specs:
            return  # another signature of the same function: not the failing call's
        new = []
        for i, (x, spec) in enumerate(zip(leaves, want_specs)):
            if spec is None:
                new.append(x)  # re-created by the script
            elif spec[1].startswith("key<"):
                new.append(
                    jax.random.wrap_key_data(arrays[f"leaf{i}"], impl=jax.random.key_impl(x))
                )
            else:
                new.append(jnp.asarray(arrays[f"leaf{i}"], dtype=x.dtype))
        treedef = jax.tree_util.tree_structure((args, kwargs))
        a, k = jax.tree_util.tree_unflatten(treedef, new)
        raise Captured(watched, tuple(a), dict(k))

    return capture


def recreate(meta: dict, arrays: Any) -> Captured:
    """Re-run the script up to the first call matching ``meta``; raises RuntimeError (with the
    reason) when the script ends, or fails, before reaching one."""
    from ._hooks import Hooks, run_script

    def on_failure(f: Any) -> None:  # pragma: no cover - checks are off
        pass

    hooks = Hooks(on_failure)
    hooks.enabled = False  # no checks: only the capture
    hooks.capture = capturer(meta, arrays)  # type: ignore[attr-defined]
    env = meta.get("environ") or {}
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    old = os.getcwd()
    if meta.get("cwd") and os.path.isdir(meta["cwd"]):
        os.chdir(meta["cwd"])
    try:
        code, _ = run_script(meta["script"], meta["argv"], hooks)
    except Captured as c:
        return c
    finally:
        os.chdir(old)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    raise RuntimeError(
        f"the re-run of {meta['script']} ended (exit status {code}) before a call of "
        f"{meta['label']} with inputs of the saved shapes; inputs.npz holds the arrays "
        "(meta.json their paths)."
    )


# -- the environment the script reads ----------------------------------------------------------


class EnvRecorder:
    """Records the ``os.environ`` keys the user's code reads (``os.environ[k]``, ``.get``,
    ``os.getenv``, ``k in os.environ``), with the value it saw (None: not set)."""

    def __init__(self) -> None:
        self.read: dict[str, str | None] = {}

    def install(self, hooks: Hooks) -> None:
        cls = type(os.environ)
        orig = cls.__getitem__
        read = self.read
        skip = {os.__file__, getattr(sys.modules.get("_collections_abc"), "__file__", "")}

        def passing(filename: str) -> bool:  # os.getenv, Mapping.get / __contains__
            return filename in skip or filename.startswith(("<frozen os", "<frozen _collections"))

        def __getitem__(self: Any, key: Any) -> Any:
            try:
                value = orig(self, key)
            except KeyError:
                value = None
                raise
            finally:
                if self is os.environ and isinstance(key, str) and key not in read:
                    f = sys._getframe(1)
                    while f is not None and passing(f.f_code.co_filename):
                        f = f.f_back  # type: ignore[assignment]
                    if f is not None and is_user_file(f.f_code.co_filename):
                        read[key] = value
            return value

        hooks.set(cls, "__getitem__", __getitem__)
