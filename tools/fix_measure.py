"""Measure gradsan's printed fixes the way issue #13 did: every printed code fix is pasted into a
copy of its program and run, and counted for valid syntax, names in scope, a finite gradient and
the true gradient; and (where the gradsan measured has it) ``Report.patch()`` is applied with GNU
patch to a copy and run.

Programs: the demo gallery (src/gradsan/_demo/case.py of the gradsan measured), the catalog's
trigger programs (tests/jax/test_catalog_triggers.py), the conformance suite's triggers (one per
catalog entry and backend, tests/fix/conformance_*.py; kinks under sanitize) and the real-world
programs of tests/fix/realworld/ (rebuilt from public NaN-gradient reports).

    PYTHONPATH=<the src to measure> python tools/fix_measure.py [--json OUT] [--only SET]

Run it from the repository root; "before" is the same command with PYTHONPATH=/path/to/main/src.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
warnings.filterwarnings("ignore")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gradsan  # noqa: E402
import gradsan.jax as gsj  # noqa: E402

_count = itertools.count()
_KEEP: list = []


# ---- the programs --------------------------------------------------------------------------------

TRIGGER_TRUTH = {  # value_and_grad at 0.0: the true gradient where there is one
    "sqrt-at-zero": [0.0],
    "cbrt-at-zero": [0.0],
    "pow-fractional-at-zero": [0.0],
    "norm-at-zero": ("interval", -math.sqrt(2), math.sqrt(2)),  # sqrt(2) |x|: a kink
    "std-of-constant": [0.0],  # std of [x, x] is 0 for every x
}


def programs() -> list[dict]:
    out = []
    demo = os.path.join(os.path.dirname(gradsan.__file__), "_demo", "case.py")
    from gradsan._demo import case as demo_mod

    for name in sorted(demo_mod.CASES):
        out.append(dict(set="demo", name=name, backend="jax", src=demo, key=name, kind="demo"))
    trig = os.path.join(ROOT, "tests", "jax", "test_catalog_triggers.py")
    from tests.jax import test_catalog_triggers as T

    for entry, (fn, _phase) in sorted(T.TRIGGERS.items()):
        out.append(
            dict(set="triggers", name=entry, backend="jax", src=trig, key=fn.__name__, kind="trig")
        )
    # the conformance suite's trigger programs, one per catalog entry and backend (kinks run
    # under sanitize)
    from tests.fix import conformance_jax as CJ
    from tests.fix import conformance_torch as CT

    for backend, cmod in (("jax", CJ), ("torch", CT)):
        for entry in sorted(cmod.TRIGGERS):
            fn, _pt, _truth, tool = cmod.TRIGGERS[entry]
            out.append(
                dict(
                    set=f"conformance-{backend}",
                    name=entry,
                    backend=backend,
                    src=cmod.__file__,
                    key=entry,
                    kind="conf",
                    tool=tool,
                )
            )
    rw = os.path.join(ROOT, "tests", "fix", "realworld")
    from tests.fix.realworld import jax_programs as RJ
    from tests.fix.realworld import torch_programs as RT

    for name in sorted(RJ.PROGRAMS):
        out.append(
            dict(
                set="realworld-jax",
                name=name,
                backend="jax",
                src=os.path.join(rw, "jax_programs.py"),
                key=name,
                kind="rw",
            )
        )
    for name in sorted(RT.PROGRAMS):
        out.append(
            dict(
                set="realworld-torch",
                name=name,
                backend="torch",
                src=os.path.join(rw, "torch_programs.py"),
                key=name,
                kind="rw",
            )
        )
    return out


def load(path: str):
    name = f"_measured{next(_count)}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    _KEEP.append(mod)
    return mod


def make(p: dict, mod) -> tuple:
    """(program, args, truth) of program ``p`` in module copy ``mod``."""
    if p["kind"] == "demo":
        c = mod.CASES[p["key"]]()
        truth = c.truth
        if callable(truth):
            truth = [np.asarray(t) for t in jax.tree_util.tree_leaves(truth(*c.args))]
        elif isinstance(truth, str):
            truth = "ball" if "unit ball" in truth else None
        return c.grad, c.args, truth
    if p["kind"] == "trig":
        fn = getattr(mod, p["key"])
        truth = TRIGGER_TRUTH.get(p["name"])
        return jax.value_and_grad(fn), (jnp.float32(0.0),), truth
    if p["kind"] == "conf":
        fn, point, truth, _tool = mod.TRIGGERS[p["key"]]
        if truth == "clarke":
            truth = ("admissible", p["key"])
        elif truth is not None:
            truth = [np.asarray(truth, dtype=np.float64)]
        if p["backend"] == "torch":
            import torch

            return fn, (torch.tensor(point, requires_grad=True),), truth
        return jax.value_and_grad(fn), (jnp.array(point),), truth
    fun, args = mod.PROGRAMS[p["key"]]()
    truth = mod.TRUTH[p["key"]]
    if isinstance(truth, str) and truth in mod.COMPUTED:
        truth = mod.COMPUTED[truth]()
    if isinstance(truth, list):
        truth = [np.asarray(t, dtype=np.float64) for t in truth]
    return fun, args, truth


def gradient(p: dict, mod) -> tuple[list[np.ndarray] | None, float | None, object]:
    """(the gradient's leaves, the loss value, the truth) of the program in ``mod``."""
    fun, args, truth = make(p, mod)
    if p["backend"] == "torch":
        import torch

        loss = fun(*args)
        loss.backward()
        grads = [
            a.grad.detach().double().numpy() if a.grad is not None else np.zeros(a.shape)
            for a in args
            if isinstance(a, torch.Tensor) and a.requires_grad
        ]
        return grads, float(loss.detach()), truth
    out = fun(*args)
    value = None
    from gradsan.jax import _compat

    info = _compat.grad_info(fun)
    if p["kind"] in ("trig", "conf"):
        value, out = float(out[0]), out[1]
    elif info is not None:
        try:
            v = info.fun(*args)
            value = float(np.asarray(v[0] if info.has_aux else v).sum())
        except Exception:
            value = None
    return [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(out)], value, truth


def is_true(grads: list[np.ndarray], truth: object) -> bool:
    if truth is None or grads is None:
        return False
    if not all(np.isfinite(g).all() for g in grads):
        return False
    if truth == "ball":
        return all(
            (np.linalg.norm(g, axis=-1) <= 1 + 1e-5).all() if g.ndim else abs(g) <= 1 + 1e-5
            for g in grads
        )
    if isinstance(truth, tuple) and truth[0] == "admissible":  # the entry's Clarke set
        adm = gradsan.catalog.get(truth[1]).admissible
        return adm is not None and all(adm.contains(g, tol=1e-5, sum_tol=1e-5) for g in grads)
    if isinstance(truth, tuple) and truth[0] == "interval":
        return all(((g >= truth[1] - 1e-5) & (g <= truth[2] + 1e-5)).all() for g in grads)
    ts = list(truth)  # type: ignore[call-overload]
    if len(ts) != len(grads):
        return False
    return all(
        np.shape(g) == np.shape(t) and np.allclose(g, t, rtol=1e-4, atol=1e-5)
        for g, t in zip(grads, ts)
    )


# ---- pasting one printed fix ----------------------------------------------------------------------


def _scope(tree: ast.Module, line: int) -> set[str]:
    names = set(dir(builtins))

    def bound(nodes) -> set[str]:
        out = set()
        for n in nodes:
            for m in ast.walk(n):
                if isinstance(m, ast.Name) and isinstance(m.ctx, ast.Store):
                    out.add(m.id)
                elif isinstance(m, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                    out.add(m.name)
                elif isinstance(m, (ast.Import, ast.ImportFrom)):
                    out |= {(a.asname or a.name).split(".")[0] for a in m.names}
                elif isinstance(m, ast.arg):
                    out.add(m.arg)
        return out

    names |= bound(tree.body)
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if n.lineno <= line <= (n.end_lineno or n.lineno):
                names |= bound([n])
    return names


def _statement(tree: ast.Module, line: int) -> ast.stmt | None:
    best = None
    for n in ast.walk(tree):
        if isinstance(n, ast.stmt) and not isinstance(
            n,
            (
                ast.FunctionDef,
                ast.AsyncFunctionDef,
                ast.ClassDef,
                ast.If,
                ast.For,
                ast.While,
                ast.With,
                ast.Try,
            ),
        ):
            if n.lineno <= line <= (n.end_lineno or n.lineno):
                if best is None or (n.end_lineno - n.lineno) < (best.end_lineno - best.lineno):
                    best = n
    return best


def code_of(suggestion: str) -> str | None:
    lines = suggestion.splitlines()[1:]
    return "\n".join(lines) if lines else None


def pasted(text: str, line: int, code: str) -> str | None:
    tree = ast.parse(text)
    st = _statement(tree, line)
    if st is None:
        return None
    lines = text.splitlines(keepends=True)
    indent = " " * st.col_offset
    new = [indent + ln + "\n" if ln.strip() else "\n" for ln in code.splitlines()]
    # gradsan importable as the printed code names it, for every version measured alike
    tail = ["\nimport gradsan.jax  # noqa\n", "import gradsan.torch  # noqa\n"]
    return "".join(lines[: st.lineno - 1] + new + lines[st.end_lineno :] + tail)


def copy_text(src: str) -> str:
    n = next(_count)  # other line numbers per copy: JAX reuses jit traces for equal code
    with open(src) as fh:
        return "\n" * n + fh.read()


def measure_program(p: dict, tmp: str) -> dict:
    text = copy_text(p["src"])
    path = os.path.join(tmp, f"prog{next(_count)}.py")
    with open(path, "w") as fh:
        fh.write(text)
    mod = load(path)
    fun, args, truth = make(p, mod)
    sanitize = p.get("tool") == "sanitize"
    if p["backend"] == "torch":
        import gradsan.torch as gst

        report = (gst.sanitize if sanitize else gst.explain)(fun)(*args)
    else:
        report = (gsj.sanitize if sanitize else gsj.explain)(fun)(*args)
    base, base_value, _ = gradient(p, load(path))
    nan_case = base is not None and not all(np.isfinite(g).all() for g in base)
    row: dict = dict(
        set=p["set"],
        name=p["name"],
        nan_case=nan_case,
        truth_known=truth is not None,
        fixes=[],
    )
    tree = ast.parse(text)
    for f in report.findings:
        if f.kind not in ("nonfinite", "unresolved", "kink", "convention") or f.where is None:
            continue
        if os.path.abspath(f.where.file) != os.path.abspath(path):
            continue
        for s in f.suggestions:
            code = code_of(s)
            if code is None:
                continue
            rec = dict(code=code, syntax=False, names=False, finite=False, true=False)
            row["fixes"].append(rec)
            try:
                ctree = ast.parse(code)
            except SyntaxError:
                continue
            new = pasted(text, f.where.line, code)
            if new is None:
                continue
            try:
                ast.parse(new)
            except SyntaxError:
                continue
            rec["syntax"] = True
            assigned = {
                n.id
                for n in ast.walk(ctree)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
            }
            used = {
                n.id
                for n in ast.walk(ctree)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            }
            rec["names"] = used <= _scope(tree, f.where.line) | assigned | {"gradsan"}
            fpath = os.path.join(tmp, f"fix{next(_count)}.py")
            with open(fpath, "w") as fh:
                fh.write(new)
            try:
                g, _v, _t = gradient(p, load(fpath))
            except BaseException:
                continue
            rec["finite"] = all(np.isfinite(x).all() for x in g)
            rec["true"] = is_true(g, truth)
    if hasattr(report, "patch"):
        row["patch"] = patch_result(report, p, text, tmp, truth, base_value)
    return row


def patch_result(report, p: dict, text: str, tmp: str, truth, base_value) -> dict:
    diff = report.patch()
    if not diff:
        return dict(applied=False)
    d = tempfile.mkdtemp(dir=tmp)
    res = dict(applied=False, true=False, wrong_finite=False, value_changed=False)
    files = set()
    for ln in diff.splitlines():
        if ln.startswith("--- a/"):
            files.add(ln[6:])
    for rel in files:
        os.makedirs(os.path.dirname(os.path.join(d, rel)) or d, exist_ok=True)
        with open(rel) as fh, open(os.path.join(d, rel), "w") as out:
            out.write(fh.read())
    with open(os.path.join(d, "fix.patch"), "w") as fh:
        fh.write(diff)
    r = subprocess.run(["patch", "-p1", "-i", "fix.patch"], cwd=d, capture_output=True, text=True)
    if r.returncode != 0:
        return res
    res["applied"] = True
    (rel,) = files
    try:
        g, v, _ = gradient(p, load(os.path.join(d, rel)))
    except BaseException:
        return res
    res["true"] = is_true(g, truth)
    finite = all(np.isfinite(x).all() for x in g)
    res["wrong_finite"] = bool(finite and truth is not None and not res["true"])
    if v is not None and base_value is not None and math.isfinite(base_value):
        res["value_changed"] = not math.isclose(v, base_value, rel_tol=1e-5, abs_tol=1e-6)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--only")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            for p in programs():
                if a.only and p["set"] != a.only:
                    continue
                try:
                    rows.append(measure_program(p, tmp))
                except Exception as e:  # a program gradsan fails on: recorded, not fatal
                    rows.append(dict(set=p["set"], name=p["name"], error=repr(e)[:200], fixes=[]))
        finally:
            os.chdir(cwd)
    summary = summarize(rows)
    print(textwrap.indent(json.dumps(summary, indent=1), ""))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(summary=summary, rows=rows), fh, indent=1, default=str)


def summarize(rows: list[dict]) -> dict:
    out: dict = {}
    for name in ["all", *sorted({r["set"] for r in rows})]:
        rs = [r for r in rows if name == "all" or r["set"] == name]
        fx = [f for r in rs for f in r["fixes"]]
        known = [f for r in rs if r.get("truth_known") for f in r["fixes"]]
        n = len(fx)
        s: dict = dict(
            programs=len(rs),
            printed_code_fixes=n,
            syntax=sum(f["syntax"] for f in fx),
            names=sum(f["names"] for f in fx),
            finite=sum(f["finite"] for f in fx),
            true=sum(f["true"] for f in fx),
            fixes_where_truth_known=len(known),
            true_where_known=sum(f["true"] for f in known),
            errors=sum(1 for r in rs if "error" in r),
        )
        nan_known = [r for r in rs if r.get("nan_case") and r.get("truth_known")]
        if any("patch" in r for r in rs):
            s["nan_cases_with_truth"] = len(nan_known)
            s["patch_true"] = sum(1 for r in nan_known if r.get("patch", {}).get("true"))
            s["patch_wrong_finite"] = sum(1 for r in rs if r.get("patch", {}).get("wrong_finite"))
            s["patch_value_changed"] = sum(1 for r in rs if r.get("patch", {}).get("value_changed"))
            s["patches"] = sum(1 for r in rs if r.get("patch", {}).get("applied"))
        out[name] = s
    return out


if __name__ == "__main__":
    main()
