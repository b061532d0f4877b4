"""The reproducer: ``gradsan-repro-<time>/`` with the report (text and HTML), the inputs
(``inputs.npz`` + ``structure.pkl`` for JAX, ``inputs.pt`` for PyTorch), ``meta.json`` and a
``repro.py`` that re-creates the NaN/Inf; and the loaders that repro.py calls."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .._fix import _hooks
from ._failure import EXIT_NONFINITE, Failure, ordinal, say


def _target_ref(target: Any) -> dict:
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if module is None or qualname is None or "<locals>" in qualname or "<lambda>" in qualname:
        return {"importable": False, "module": module, "qualname": qualname}
    return {"importable": True, "module": module, "qualname": qualname}


def write_repro(failure: Failure, script: str, argv: list[str], out_dir: str | None = None) -> str:
    """Write ``gradsan-repro-<time>/`` and return its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = out_dir or os.path.join(os.getcwd(), f"gradsan-repro-{stamp}")
    d = base
    i = 1
    while os.path.exists(d):
        d = f"{base}-{i}"
        i += 1
    os.makedirs(d)
    _hooks.write_fix_patch(failure, d)  # gradsan._fix: verify the fixes, write fix.patch
    meta: dict[str, Any] = {
        "backend": failure.backend,
        "script": os.path.abspath(script),
        "argv": list(argv),
        "call": failure.call,
        "label": failure.label,
        "cwd": os.getcwd(),
    }
    with open(os.path.join(d, "report.txt"), "w") as fh:
        fh.write(str(failure.report) + "\n")
    from .._report._html import render_html

    with open(os.path.join(d, "report.html"), "w") as fh:
        fh.write(render_html(failure.report, title=f"gradsan: {failure.header}"))
    if failure.backend == "jax":
        _write_jax_inputs(failure, d, meta)
        code = _JAX_REPRO
    else:
        _write_torch_inputs(failure, d, meta)
        code = _TORCH_REPRO
    with open(os.path.join(d, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=2, default=str)
    with open(os.path.join(d, "repro.py"), "w") as fh:
        fh.write(code.format(header=failure.header, script=os.path.basename(script)))
    return d


def _write_jax_inputs(failure: Failure, d: str, meta: dict) -> None:
    import pickle

    import jax
    import numpy as np

    leaves, treedef = jax.tree_util.tree_flatten((failure.args, failure.kwargs))
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path((failure.args, failure.kwargs))[0]
    ]
    arrays: dict[str, Any] = {}
    statics: dict[int, tuple[str, Any]] = {}
    for i, x in enumerate(leaves):
        if hasattr(x, "dtype") and hasattr(x, "shape"):
            try:
                arrays[f"leaf{i}"] = np.asarray(x)
                continue
            except Exception:  # typed PRNG keys
                arrays[f"leaf{i}"] = np.asarray(jax.random.key_data(x))
                statics[i] = ("prng_key", None)
                continue
        statics[i] = ("value", x)
    np.savez(os.path.join(d, "inputs.npz"), **arrays)
    meta.update(
        n_leaves=len(leaves),
        paths=paths,
        kind=failure.kind,
        opts=failure.opts,
        function=_target_ref(failure.target),
    )
    try:
        blob = pickle.dumps({"treedef": treedef, "statics": statics})
        with open(os.path.join(d, "structure.pkl"), "wb") as fh:
            fh.write(blob)
        meta["structure"] = "structure.pkl"
    except Exception as e:  # a treedef with functions in it (flax TrainState.apply_fn)
        meta["structure"] = None
        meta["structure_error"] = f"{type(e).__name__}: {e}"
    try:
        text = str(
            jax.make_jaxpr(lambda *a, **k: failure.fun(*a, **k))(*failure.args, **failure.kwargs)
        )
        with open(os.path.join(d, "jaxpr.txt"), "w") as fh:
            fh.write(text + "\n")
    except Exception:  # pragma: no cover
        pass


def _write_torch_inputs(failure: Failure, d: str, meta: dict) -> None:
    import torch

    torch.save(
        {name: {"value": v, "grad": g} for name, (v, g) in failure.tensors.items()},
        os.path.join(d, "inputs.pt"),
    )
    meta["tensors"] = sorted(failure.tensors)


_JAX_REPRO = '''"""gradsan reproducer: {header}

Reloads the inputs of that call (inputs.npz, with their pytree structure in structure.pkl),
imports the same function from {script} (without running its `if __name__ == "__main__":`
block) and runs gradsan.jax.explain on it. Exits with status 3 when the NaN/Inf comes back.
"""

import pathlib
import sys

from gradsan._run import jax_repro_main

sys.exit(jax_repro_main(pathlib.Path(__file__).resolve().parent))
'''

_TORCH_REPRO = '''"""gradsan reproducer: {header}

PyTorch's forward is gone once backward has run, so this re-runs {script} (with the same
arguments) with gradsan's checks off up to that backward call and the tracer on for that one
step, then compares the tensors with those saved in inputs.pt (values and gradients at the
failing step) and prints the explanation. Exits with status 3 when the NaN/Inf comes back.
The script must be deterministic (seeded) for the re-run to reach the same state.
"""

import pathlib
import sys

from gradsan._run import torch_repro_main

sys.exit(torch_repro_main(pathlib.Path(__file__).resolve().parent))
'''


def _load_script_module(path: str, argv: list[str]) -> Any:
    """Import the script as a module (its `__main__` block does not run)."""
    import types

    name = "__gradsan_script__"
    mod = types.ModuleType(name)
    mod.__file__ = path
    sys.modules[name] = mod
    old = sys.argv
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    try:
        with open(path) as fh:
            code = compile(fh.read(), path, "exec")
        exec(code, vars(mod))
    finally:
        sys.argv = old
    return mod


def load_jax_repro(d: Any) -> tuple[Callable, tuple, dict, dict]:
    """(function, args, kwargs, meta) of a JAX reproducer directory."""
    import pickle

    import jax
    import numpy as np

    d = str(d)
    with open(os.path.join(d, "meta.json")) as fh:
        meta = json.load(fh)
    ref = meta["function"]
    if not ref.get("importable"):
        raise RuntimeError(
            f"the function `{ref.get('qualname')}` is defined inside another function (or is a "
            "lambda), so the reproducer cannot import it; its program is in jaxpr.txt. Move it "
            "to module level (or behind `if __name__ == '__main__':`) to get a runnable repro."
        )
    mod = (
        _load_script_module(meta["script"], meta["argv"])
        if ref["module"] == "__main__"
        else importlib.import_module(ref["module"])
    )
    obj: Any = mod
    for part in ref["qualname"].split("."):
        obj = getattr(obj, part)
    obj = getattr(obj, "_inner", obj)  # a _patch_jax.Watched (under gradsan run itself)
    kind, opts = meta["kind"], meta.get("opts", {})
    if kind == "jit":
        fun = obj if hasattr(obj, "_jit_info") else jax.jit(obj, **opts)
    else:
        base = getattr(obj, "__wrapped__", obj) if hasattr(obj, "_jit_info") else obj
        fun = getattr(jax, kind)(base, **opts) if kind in ("grad", "value_and_grad") else obj
    if meta.get("structure") is None:
        raise RuntimeError(
            f"the inputs' pytree structure could not be saved "
            f"({meta.get('structure_error')}); inputs.npz holds the leaves."
        )

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if module == "__main__":
                return getattr(mod, name)
            return super().find_class(module, name)

    with open(os.path.join(d, "structure.pkl"), "rb") as blob:
        structure = _Unpickler(blob).load()
    data = np.load(os.path.join(d, "inputs.npz"))
    leaves = []
    for i in range(meta["n_leaves"]):
        kind_i, value = structure["statics"].get(i, (None, None))
        if kind_i == "value":
            leaves.append(value)
        elif kind_i == "prng_key":
            leaves.append(jax.random.wrap_key_data(data[f"leaf{i}"]))
        else:
            leaves.append(jax.numpy.asarray(data[f"leaf{i}"]))
    args, kwargs = jax.tree_util.tree_unflatten(structure["treedef"], leaves)
    return fun, tuple(args), dict(kwargs), meta


def jax_repro_main(d: Any) -> int:
    import gradsan.jax as gsj

    try:
        fun, args, kwargs, meta = load_jax_repro(d)
    except RuntimeError as e:
        say(str(e))
        return 2
    say(f"re-running {meta['label']} on the saved inputs of its {ordinal(meta['call'])} call")
    report = gsj.explain(fun)(*args, **kwargs)
    print(report)
    return 0 if report.ok else EXIT_NONFINITE


def torch_repro_main(d: Any) -> int:
    import torch

    d = str(d)
    with open(os.path.join(d, "meta.json")) as fh:
        meta = json.load(fh)
    saved = torch.load(os.path.join(d, "inputs.pt"))
    result: dict[str, Any] = {}
    from ._replay import replay_torch

    code = replay_torch(meta["script"], meta["argv"], meta["call"], result, cwd=meta.get("cwd"))
    failure = result.get("failure")
    if failure is None:
        say("the re-run did not reproduce the non-finite gradient (is the script seeded?)")
        return 0 if code != EXIT_NONFINITE else code
    same = []
    for name, (v, _g) in failure.tensors.items():
        if name in saved:
            same.append(bool(torch.equal(saved[name]["value"], v)))
    if same:
        say(f"{sum(same)} of {len(same)} saved tensors are bit-identical in the re-run.")
    print(failure.report)
    return EXIT_NONFINITE
