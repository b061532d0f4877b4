"""Verification of the fixes sanitize prints at a kink (abs at 0, relu at 0, a max tie, a clip
bound, hypot at the origin): the program is finite there, so there is no NaN to remove; what a
fix must do is keep the forward value and give a gradient in the Clarke set.

The catalog knows the op's Clarke set (``Singularity.admissible``, e.g. [-1, 1] for abs at 0).
Through the rest of the program that set becomes the set of the program's gradients spanned by
its limiting gradients: the gradients of the original program at ``x0 + t v`` and ``x0 - t v``
(``t`` small, two random directions ``v``), where the program is smooth. A fix is verified when,
with the fix swapped into the user's function (:mod:`._verify`),

- the outputs are finite and the forward value is unchanged,
- every component of the gradient at the kink lies between the smallest and largest of those
  one-sided gradients (for elementwise kinks that box is exactly the Clarke set's image), and
- the outputs at two nearby points (off the kink) are the original program's.

Printed as ``verified: same value, gradient 0 in the Clarke set [-1, 1] (...)``. Where the
catalog knows no set (a jump, an eigenvalue tie) or gradsan cannot differentiate the program
(no ``jax.grad`` / no scalar loss), the fix keeps a one-line reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _catalog
from .._report._records import Finding, FixProposal, Report

KINDS = ("kink", "convention")
# the one-sided points: x0 +- T * (1 + |x0|) * v
T = 1e-4
# slack on the box: the one-sided gradients are O(T) away from their limits
RTOL, ATOL = 1e-3, 1e-3


def _admissible(f: Finding) -> _catalog._types.Admissible | None:
    try:
        e = _catalog.get(f.catalog_id or "")
    except KeyError:
        return None
    a = e.admissible
    return a if a is not None and a.exists() else None


def _todo(report: Report) -> list[Finding]:
    return [
        f
        for f in report.findings
        if f.kind in KINDS and any(p.code is not None and p.status == "unverified" for p in f.fixes)
    ]


def _say(f: Finding, why: str) -> None:
    from . import render_suggestions

    for p in f.fixes:
        if p.code is not None and p.status == "unverified":
            p.checked = why
    f.suggestions = render_suggestions(f.fixes)


def _in_box(grad: list[np.ndarray], lo: list[np.ndarray], hi: list[np.ndarray]) -> bool:
    if len(grad) != len(lo):
        return False
    for g, a, b in zip(grad, lo, hi):
        if g.shape != a.shape:
            return False
        slack = RTOL * np.maximum(np.abs(a), np.abs(b)) + ATOL
        if not (np.all(g >= a - slack) and np.all(g <= b + slack)):
            return False
    return True


def _words(
    f: Finding,
    adm: Any,
    grad: list[np.ndarray],
    box: tuple[list[np.ndarray], list[np.ndarray]],
    show: Callable[[list[np.ndarray]], str],
) -> str:
    return (
        f"gradient {show(grad)} in the Clarke set ({f.primitive}'s {adm.words} through the "
        f"program: each component between the one-sided gradients {show(box[0])} and "
        f"{show(box[1])})"
    )


# ---- JAX ----------------------------------------------------------------------------------------


def _jax_box(prog: Any) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """(lowest, highest) of the original program's gradients at the one-sided points."""
    import jax

    from ._verify import _finite, _leaves, _run

    info = prog.info
    argnums = info.argnums
    idx = {argnums} if isinstance(argnums, int) else set(argnums)
    rng = np.random.default_rng(2)
    got: list[list[np.ndarray]] = []
    for _ in range(2):
        dirs = {}
        for i in idx:
            if 0 <= i < len(prog.args):
                dirs[i] = jax.tree_util.tree_map(
                    lambda a: rng.standard_normal(np.shape(a)), prog.args[i]
                )
        for sign in (1.0, -1.0):
            new = list(prog.args)
            for i, d in dirs.items():

                def move(leaf: Any, v: Any, sign: float = sign) -> Any:
                    a = np.asarray(leaf)
                    if a.dtype.kind != "f":
                        return leaf
                    m = a + sign * T * (1.0 + np.abs(a)) * v
                    if not hasattr(leaf, "dtype"):
                        return type(leaf)(m)
                    return jax.numpy.asarray(m.astype(a.dtype))

                new[i] = jax.tree_util.tree_map(move, new[i], d)
            out, err = _run(prog.fun, tuple(new), prog.kwargs)
            if err is not None:
                return None
            g = _leaves(prog.grad_part(out))
            if not _finite(g):
                return None
            got.append(g)
    lo = [np.min(np.stack(parts), axis=0) for parts in zip(*got)]
    hi = [np.max(np.stack(parts), axis=0) for parts in zip(*got)]
    return lo, hi


def _jax_check(f: Finding, box: tuple, adm: Any) -> Callable[..., tuple[str, str]]:
    def check(prog: Any, p: FixProposal, note: str | None) -> tuple[str, str]:
        from ._verify import _close, _finite, _leaves, _run, _show, same_nearby

        out, err = _run(prog.fun, prog.args, prog.kwargs)
        if err is not None:
            return "failed", f"the fixed program raised {err}"
        leaves = _leaves(out)
        if not _finite(leaves):
            return "failed", "the fixed program is not finite at the kink"
        v = prog.loss_value(prog.args)
        if v is None or prog.base_value is None or not _close(v, prog.base_value):
            return "failed", "the fix changes the forward value"
        grad = _leaves(prog.grad_part(out))
        if not _in_box(grad, *box):
            return "failed", (
                f"gradient {_show(grad)} is outside the one-sided gradients "
                f"{_show(box[0])} .. {_show(box[1])}"
            )
        checked = ["same value", _words(f, adm, grad, box, _show)]
        same = same_nearby(prog)
        if same is None:
            return "failed", "the fix changes the program's outputs near the kink"
        if same:
            checked.append(f"same outputs at {same} nearby point{'s' if same > 1 else ''}")
        return "verified", ", ".join(checked)

    return check


def _verify_jax(report: Report, todo: list[Finding], fun: Callable, args: tuple, kwargs: dict):  # type: ignore[no-untyped-def]
    from ._verify import (
        _leaves,
        _Program,
        _run,
        function_index,
        has_bodies,
        side_effects,
        size_of,
        trace,
        verify_set,
    )

    closed = trace(fun, args, kwargs)
    effects = side_effects(fun, args, kwargs, closed)
    if effects:
        for f in todo:
            _say(
                f,
                f"the function has side effects ({effects}) that running it again would repeat, "
                "so gradsan did not run it",
            )
        return
    prog = _Program(fun, args, kwargs, "jax")
    prog.size, prog.bodies = size_of(closed), has_bodies(closed)  # see _verify.verify
    if prog.info is None:
        for f in todo:
            _say(f, "sanitize was not given a jax.grad of a loss, so there is no gradient to check")
        return
    prog.base_value = prog.loss_value(args)
    box = _jax_box(prog)
    if box is None or prog.base_value is None:
        for f in todo:
            _say(f, "the program could not be differentiated next to the kink")
        return
    if any(_admissible(f) is None for f in todo):
        prog.reference()  # on the original program, before any fix is swapped in
    prog.index = function_index({p.file for f in todo for p in f.fixes if p.file})
    for pt in prog.nearby:
        o, e = _run(fun, pt, kwargs)
        prog.nearby_out.append(_leaves(o) if e is None else None)
    for f in todo:
        adm = _admissible(f)
        for p in f.fixes:
            if p.code is None or p.status != "unverified":
                continue
            # no Clarke set in the catalog: the program may still be smooth here (the kink
            # masked away); then the gradient is checked like any fix's (certify, nansafe)
            check = _jax_check(f, box, adm) if adm is not None else None

            def run_jax(q: FixProposal, check: Any = check) -> tuple[str, str]:
                return verify_set(prog, [q], None, check)

            status, p.checked = _one(prog, f, p, run_jax)
            p.status = status  # type: ignore[assignment]
        _finish(f)


def _one(
    prog: Any, f: Finding, p: FixProposal, run: Callable[[FixProposal], tuple[str, str]]
) -> tuple[str, str]:
    from ._site import locate

    site = locate(f.where)
    if site is None or site.func is None or p.file is None:
        return "unverified", "the statement is not inside a function gradsan can re-run"
    if site.in_lambda:
        return "unverified", "the statement is inside a lambda or comprehension"
    try:
        return run(p)
    except Exception as e:  # gradsan's own failure to check: say so, never crash
        return "unverified", f"gradsan could not run it ({type(e).__name__})"


def _finish(f: Finding) -> None:
    from . import render_suggestions
    from ._verify import _RANK

    f.fixes.sort(key=lambda p: _RANK[p.status])
    f.suggestions = render_suggestions(f.fixes)


# ---- torch --------------------------------------------------------------------------------------


def _torch_box(prog: Any) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    from ._verify_torch import _copy, _moved, _step

    rng = np.random.default_rng(2)
    got = []
    for _ in range(2):
        vs = [rng.standard_normal(s) for s in prog.shapes]
        for sign in (1.0, -1.0):
            a, k = _copy(prog.args, prog.kwargs, double=True)
            _moved(a, k, vs, sign * T)
            _, g = _step(prog.fn, a, k)
            if g is None or not all(np.isfinite(x).all() for x in g):
                return None
            got.append(g)
    lo = [np.min(np.stack(parts), axis=0) for parts in zip(*got)]
    hi = [np.max(np.stack(parts), axis=0) for parts in zip(*got)]
    return lo, hi


def _torch_check(prog: Any, f: Finding, p: FixProposal, box: tuple, adm: Any) -> tuple[str, str]:
    from ._verify import _show
    from ._verify_torch import Ran, _copy, _moved, _step, loss_only, run_fixed, same_value

    ran = run_fixed(prog, "the fixed gradient is not finite at the kink")
    if not isinstance(ran, Ran):
        return ran
    value, grads = ran
    if not same_value(value, prog.value):
        return "failed", "the fix changes the forward value"
    if not grads:  # no leaf among the arguments: an empty gradient is in any box
        return loss_only(prog, ["same value"])
    if not _in_box(grads, *box):
        return "failed", (
            f"gradient {_show(grads)} is outside the one-sided gradients "
            f"{_show(box[0])} .. {_show(box[1])}"
        )
    checked = ["same value", _words(f, adm, grads, box, _show)]
    same = 0
    for vs, (ov, og) in zip(prog.nearby, prog.nearby_out):
        if ov is None or og is None or not np.isfinite(ov):
            continue
        a, k = _copy(prog.args, prog.kwargs)
        _moved(a, k, vs, 1.0)
        v, g = _step(prog.fn, a, k)
        if v is None or not np.isclose(v, ov, rtol=1e-3, atol=1e-6):
            return "failed", "the fix changes the loss near the kink"
        if g is None or not all(np.allclose(x, y, rtol=1e-3, atol=1e-6) for x, y in zip(g, og)):
            return "failed", "the fix changes the gradient near the kink"
        same += 1
    if same:
        checked.append(f"same outputs at {same} nearby point{'s' if same > 1 else ''}")
    return "verified", ", ".join(checked)


def _verify_torch(report: Report, todo: list[Finding], fn: Callable, args: tuple, kwargs: dict):  # type: ignore[no-untyped-def]
    from ._edit import apply
    from ._site import locate, parsed
    from ._verify import _first_line, function_index, patched_code, swapped
    from ._verify_torch import _check as _plain_check
    from ._verify_torch import _TorchProgram

    try:
        prog = _TorchProgram(fn, args, kwargs)
        box = _torch_box(prog)
    except Exception as e:
        for f in todo:
            _say(f, f"the step could not be re-run ({type(e).__name__})")
        return
    if box is None:
        for f in todo:
            _say(f, "the step could not be differentiated next to the kink")
        return
    prog.index = function_index({p.file for f in todo for p in f.fixes if p.file})

    def run(p: FixProposal, f: Finding, adm: Any) -> tuple[str, str]:
        site = locate(f.where)
        got = parsed(p.file or "")
        if site is None or site.func is None or got is None:
            return "unverified", "the source file could not be read"
        fnode = site.func
        funcs = prog.index.get((p.file, fnode.name, _first_line(fnode)), [])
        if not funcs:
            return "unverified", f"gradsan found no live function {fnode.name} to run the fix in"
        old = funcs[0].__code__
        funcs = [g for g in funcs if g.__code__ is old]
        code = patched_code(
            p.file or "", apply(got[0], [p]), fnode.name, fnode.lineno, old.co_freevars
        )
        if code is None:
            return "unverified", "the patched function could not be compiled the same way"
        with swapped(funcs, code, "torch", False) as original:
            prog.original = original
            if adm is None:  # no Clarke set: checked like any fix (differences of the original)
                return _plain_check(prog, p)
            return _torch_check(prog, f, p, box, adm)

    for f in todo:
        adm = _admissible(f)
        for p in f.fixes:
            if p.code is None or p.status != "unverified":
                continue

            def run_torch(q: FixProposal, f: Finding = f, adm: Any = adm) -> tuple[str, str]:
                return run(q, f, adm)

            status, p.checked = _one(prog, f, p, run_torch)
            p.status = status  # type: ignore[assignment]
        _finish(f)


def verify_kinks(report: Report, fun: Callable, args: Any, kwargs: Any, backend: str) -> Report:
    """Verify the code fixes of the report's kink findings in place (see the module); returns
    ``report``. Never raises: gradsan's own failure leaves the fixes unverified with a reason."""
    todo = _todo(report)
    if not todo:
        return report
    try:
        if backend == "torch":
            _verify_torch(report, todo, fun, tuple(args), dict(kwargs or {}))
        else:
            _verify_jax(report, todo, fun, tuple(args), dict(kwargs or {}))
    except Exception as e:  # gradsan's own failure: the fixes keep a reason
        for f in todo:
            _say(f, f"gradsan could not run it ({type(e).__name__})")
    return report
