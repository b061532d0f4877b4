"""Verification of the fixes of a ``with gradsan.torch.explain() as report:`` block.

The block is the program: its statements are compiled (once as written, once with the fix) into
a step function of the names the block reads, run on copies of those names' values as the frame
holds them at the block's end (tensors cloned without their ``.grad``). The step returns the
tensor the block called ``.backward()`` on, and is checked like ``explain(fn)(*args)``'s
(:mod:`._verify_torch`: same loss, gradients equal to float64 differences of the original block,
same outputs nearby).

gradsan runs it only when that cannot touch the user's state or give a wrong answer: every name
the block reads from outside is a tensor, a number or a string (copied), or a module, function
or class of the file's globals (no model, optimizer or other object with state), no such name is
assigned in the block before it is read (its value at the end would not be the one the block
started from), and the block calls ``.backward()`` on one name. Otherwise the fix keeps a one-line
reason. The step runs in a copy of the file's globals, never in the live module.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

from .._report._records import Finding, Report
from ._edit import apply
from ._site import parsed

KINKS_NOT_RUN = (
    "gradsan checks a kink's fix against its Clarke set when it holds the step: "
    "gradsan.torch.sanitize(fn)(*args) does, a with-block does not"
)
NOT_COPYABLE = "the block reads `{name}`, which gradsan cannot copy to re-run it safely"


def _with_node(tree: ast.Module, line: int) -> ast.With | None:
    """The innermost ``with`` statement at ``line`` (the line __exit__ reports)."""
    best = None
    for n in ast.walk(tree):
        if isinstance(n, ast.With) and n.lineno <= line <= (n.end_lineno or n.lineno):
            if n.lineno == line or best is None or n.lineno > best.lineno:
                best = n
    return best if best is not None and best.lineno == line else None


def _reads(body: list[ast.stmt]) -> tuple[list[str], str | None]:
    """(the names the block reads before it assigns them, in order; a name read after being
    assigned first is not an input) and the name it calls ``.backward()`` on; ``"="`` instead of
    that name when the block assigns one of its inputs."""
    stores: set[str] = set()
    inputs: list[str] = []
    loss = None
    for stmt in body:
        # a statement reads its right-hand side before it binds its targets
        loads = [n for n in ast.walk(stmt) if isinstance(n, ast.Name)]
        for n in loads:
            if isinstance(n.ctx, ast.Load) and n.id not in stores and n.id not in inputs:
                inputs.append(n.id)
        for n in loads:
            if isinstance(n.ctx, ast.Store):
                stores.add(n.id)
        for c in ast.walk(stmt):
            if (
                isinstance(c, ast.Call)
                and isinstance(c.func, ast.Attribute)
                and c.func.attr == "backward"
                and isinstance(c.func.value, ast.Name)
            ):
                loss = c.func.value.id
    return [n for n in inputs if n not in stores], loss if not set(inputs) & stores else "="


def _plain(v: Any) -> bool:
    import torch

    if isinstance(v, (torch.Tensor, int, float, bool, str, type(None))):
        return True
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(_plain(x) for x in v.values())
    return False


def _stateless(v: Any) -> bool:
    return (
        isinstance(v, types.ModuleType)
        or inspect.isfunction(v)
        or inspect.isbuiltin(v)
        or (isinstance(v, type))
    )


def _step(with_node: ast.With, names: list[str], loss: str, file: str, g: dict) -> Any:
    fn = ast.FunctionDef(
        name="__gradsan_block__",
        args=ast.arguments([], [ast.arg(n) for n in names], None, [], [], None, []),
        body=[*with_node.body, ast.Return(ast.Name(loss, ast.Load()))],
        decorator_list=[],
        returns=None,
    )
    mod = ast.Module(body=[fn], type_ignores=[])
    ast.fix_missing_locations(mod)
    ns = dict(g)
    exec(compile(mod, file, "exec"), ns)  # defines the step only: nothing of the user's runs
    return ns["__gradsan_block__"]


def _todo(report: Report) -> list[Finding]:
    return [
        f
        for f in report.findings
        if f.kind in ("nonfinite", "unresolved")
        and any(p.code is not None and p.status == "unverified" for p in f.fixes)
    ]


def _say(f: Finding, why: str) -> None:
    for p in f.fixes:
        if p.code is not None and p.status == "unverified":
            p.checked = why


def verify_block(report: Report, frame: types.FrameType | None) -> None:
    """Verify the with-block's fixes in place (see the module). Never raises."""
    from . import render_suggestions

    for f in report.findings:  # a kink's fix is checked against its Clarke set (_kinks.py)
        if f.kind in ("kink", "convention"):
            _say(f, KINKS_NOT_RUN)
            f.suggestions = render_suggestions(f.fixes)
    todo = _todo(report)
    if not todo or frame is None:
        return
    try:
        why = _verify(todo, frame)
    except Exception as e:  # gradsan's own failure: the fixes keep a reason
        why = f"gradsan could not re-run the block ({type(e).__name__})"
    for f in todo:
        if why:
            _say(f, why)
        rank = {"verified": 0, "unverified": 1, "prose": 2, "failed": 3}
        f.fixes.sort(key=lambda p: rank[p.status])
        f.suggestions = render_suggestions(f.fixes)


def _verify(todo: list[Finding], frame: types.FrameType) -> str | None:
    """Run each fix; returns the reason when none could be run, else None."""
    import gradsan

    from ._verify_torch import _check, _TorchProgram

    file = frame.f_code.co_filename
    got = parsed(file)
    if got is None:
        return "the source file of the block could not be read"
    text, tree = got
    node = _with_node(tree, frame.f_lineno)
    if node is None:
        return "gradsan could not find the with-block in the source"
    names, loss = _reads(node.body)
    if loss == "=":
        return (
            "the block assigns a name it reads, so its value at the start of the block is not "
            "known to re-run it"
        )
    if loss is None:
        return "the block calls no `.backward()` on a name, so there is no loss to compare"
    local = dict(frame.f_locals)
    glob = frame.f_globals
    args = []
    inputs = []
    for n in names:
        if n in local and not (n in glob and local[n] is glob[n] and _stateless(local[n])):
            if not _plain(local[n]):
                return NOT_COPYABLE.format(name=n)
            inputs.append(n)
            args.append(local[n])
        elif n in glob:
            if not _stateless(glob[n]) and not _plain(glob[n]):
                return NOT_COPYABLE.format(name=n)
        elif not hasattr(builtins, n):
            return NOT_COPYABLE.format(name=n)
    if any(p.file != file for f in todo for p in f.fixes if p.code is not None):
        return "the fix is in another file than the block"
    g = {**glob, "gradsan": gradsan}
    __import__("gradsan.torch")
    original = _step(node, inputs, loss, file, g)
    prog = _TorchProgram(original, tuple(args), {})
    ran = False
    for f in todo:
        for p in f.fixes:
            if p.code is None or p.status != "unverified":
                continue
            if not (node.lineno < p.start_line and p.end_line <= (node.end_lineno or 0)):
                p.checked = "the fix is outside the with-block"
                continue
            ptree = ast.parse(apply(text, [p]))
            pnode = _with_node(ptree, node.lineno)
            if pnode is None:
                p.checked = "the patched block could not be compiled"
                continue
            fixed = _step(pnode, inputs, loss, file, g)

            @contextlib.contextmanager
            def use_original(fixed: Any = fixed) -> Iterator[None]:
                prog.fn = original
                try:
                    yield
                finally:
                    prog.fn = fixed

            prog.fn, prog.original = fixed, use_original
            try:
                status, p.checked = _check(prog, p)
            finally:
                prog.fn = original
            p.status = status  # type: ignore[assignment]
            ran = True
    return None if ran else "no fix of this block could be run"
