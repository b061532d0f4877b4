"""The reproducer: ``gradsan-repro-<time>/`` with the report (text and HTML), the inputs
(``inputs.npz`` + ``structure.pkl`` for JAX, ``inputs.pt`` for PyTorch), ``meta.json`` and a
``repro.py`` that re-creates the NaN/Inf; and the loaders that repro.py calls."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from .._fix import _hooks
from ._failure import EXIT_NONFINITE, Failure, ordinal, say


def _target_ref(target: Any) -> dict:
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if module is None or qualname is None or "<locals>" in qualname or "<lambda>" in qualname:
        return {"importable": False, "module": module, "qualname": qualname}
    return {"importable": True, "module": module, "qualname": qualname}


def pickle_structure(failure: Failure) -> bytes | None:
    """The inputs' pytree structure, pickled while the script still runs (its classes are
    ``__main__``'s then); None when something in it cannot be pickled (optax's functions in a
    flax TrainState: the reproducer re-creates those from the script)."""
    import pickle

    import jax

    leaves, treedef = jax.tree_util.tree_flatten((failure.args, failure.kwargs))
    statics = {
        i: ("prng_key", None)
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        else ("value", x)
        for i, x in enumerate(leaves)
        if not isinstance(x, jax.Array) or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    }
    try:
        return pickle.dumps({"treedef": treedef, "statics": statics})
    except Exception:
        return None


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
        "environ": dict(failure.environ),
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
        if isinstance(x, jax.Array) and x.is_deleted():  # donated to the failing call: gone
            where = paths[i]  # "[0][1]..." of (args, kwargs): args[1]...
            where = ("args" if where.startswith("[0]") else "kwargs") + where[3:]
            meta.setdefault("deleted", []).append(where)
            continue
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
    from ._capture import array_spec

    meta.update(
        n_leaves=len(leaves),
        paths=paths,
        specs=[array_spec(x) for x in leaves],
        kind=failure.kind,
        opts=failure.opts,
        function=_target_ref(failure.target),
    )
    try:
        blob = failure.structure or pickle.dumps({"treedef": treedef, "statics": statics})
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

Reloads the arrays of that call (inputs.npz; their paths in meta.json) and re-creates the rest
from {script}: the script runs again (same arguments, same environment variables, gradsan's
checks off) up to the first call of the same function with inputs of those shapes, which is
not made; the saved arrays replace its inputs and gradsan explains the call. Exits with
status 3 when the NaN/Inf comes back. `python repro.py --check` only checks that it loads.
"""

import pathlib
import sys

from gradsan._run import jax_repro_main

sys.exit(jax_repro_main(pathlib.Path(__file__).resolve().parent, check="--check" in sys.argv))
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


def jax_repro_main(d: Any, check: bool = False) -> int:
    """Re-create the failing call (see _capture.py) and explain it; with ``check`` only say
    whether it loads (status 0) or not (2)."""
    import numpy as np

    from ._capture import recreate

    d = str(d)
    with open(os.path.join(d, "meta.json")) as fh:
        meta = json.load(fh)
    try:
        if "specs" not in meta:
            raise RuntimeError("this reproducer was written by an older gradsan")
        if meta.get("deleted"):
            raise RuntimeError(
                f"the step donated {', '.join(meta['deleted'])} to the failing call, which "
                "consumed them: they could not be saved"
            )
        with np.load(os.path.join(d, "inputs.npz")) as data:
            arrays = {k: data[k] for k in data.files}
        captured = recreate(meta, arrays)
    except RuntimeError as e:
        say(f"the reproducer does not load: {e}")
        return 2
    if check:
        say(f"the reproducer loads: {meta['label']} with the saved inputs of its call.")
        return 0
    say(f"re-running {meta['label']} on the saved inputs of its {ordinal(meta['call'])} call")
    w = captured.watched
    if hasattr(w, "explain_call"):  # equinox / NNX
        report = w.explain_call(captured.args, captured.kwargs)
    else:
        import gradsan.jax as gsj

        report = gsj.explain(w._inner)(*captured.args, **captured.kwargs)
    print(report)
    return 0 if report.ok else EXIT_NONFINITE


def check_repro(d: str, backend: str) -> str | None:
    """Load the reproducer in a fresh interpreter (``repro.py --check``): None when it loads,
    else why not."""
    import subprocess

    if backend != "jax":
        return None
    try:
        r = subprocess.run(
            [sys.executable, os.path.join(d, "repro.py"), "--check"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return "loading it took over 300 s"
    if r.returncode == 0:
        return None
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    return lines[-1].removeprefix("gradsan: ") if lines else f"exit status {r.returncode}"


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
