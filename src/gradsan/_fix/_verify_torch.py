"""Verification of torch fixes: ``gradsan.torch.explain(fn)(*args)`` holds the step and its
arguments, so each code fix is run (patched function swapped in, see :mod:`._verify`) on copies
of the arguments (tensors cloned, modules deep-copied: the user's ``.grad`` and parameters are
not touched). The fixed step must give a finite loss equal to the original one, finite gradients
for every leaf, gradients that match central differences of the original step in float64 along
two directions, and the original outputs at two nearby points.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .._report._records import Finding, FixProposal, Report
from ._edit import apply
from ._site import locate, parsed
from ._verify import (
    MAX_FINDINGS,
    NO_GRADIENT_TORCH,
    _first_line,
    _show,
    convention,
    function_index,
    patched_code,
    swapped,
)

NO_LIMIT = "no limit"  # central()'s verdict where the original step has no gradient


def _copy(args: tuple, kwargs: dict, double: bool = False) -> tuple[tuple, dict]:
    import torch

    memo: dict[int, Any] = {}

    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            t = a.detach().clone()
            if double and t.is_floating_point():
                t = t.double()
            return t.requires_grad_(a.requires_grad)
        if isinstance(a, torch.nn.Module):
            m = copy.deepcopy(a, memo)
            for p in m.parameters():
                p.grad = None
            return m.double() if double else m
        if isinstance(a, (list, tuple)):
            return type(a)(one(x) for x in a)
        if isinstance(a, dict):
            return {k: one(v) for k, v in a.items()}
        return a

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _leaves(args: tuple, kwargs: dict) -> list:
    import torch

    out: list = []
    seen: set[int] = set()

    def walk(a: Any) -> None:
        if isinstance(a, torch.Tensor):
            if a.requires_grad and a.is_leaf and id(a) not in seen:
                seen.add(id(a))
                out.append(a)
        elif isinstance(a, torch.nn.Module):
            for p in a.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                walk(x)

    walk(args)
    walk(kwargs)
    return out


def reached(fn: Callable) -> tuple[list[tuple[str, Any]], list[Any], list[str]]:
    """(name, module) and the optimizers ``fn`` reaches through its closure, its ``self`` and
    the globals it names (as guard finds them), and the names of the iterators among them."""
    import torch

    cands: list[tuple[str, Any]] = []
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            try:
                cands.append((name, cell.cell_contents))
            except ValueError:  # an empty cell
                pass
        g = getattr(fn, "__globals__", {})
        cands += [(n, g[n]) for n in code.co_names if n in g]
    self_obj = getattr(fn, "__self__", None)
    if self_obj is not None and hasattr(self_obj, "__dict__"):
        cands += list(vars(self_obj).items())
    mods: list[tuple[str, Any]] = []
    opts: list[Any] = []
    iters: list[str] = []
    for name, c in cands:
        if isinstance(c, torch.nn.Module):
            if all(c is not m for _, m in mods):
                mods.append((name, c))
        elif isinstance(c, torch.optim.Optimizer):
            opts.append(c)
        elif hasattr(type(c), "__next__") and not isinstance(c, type):
            iters.append(name)
    return mods, opts, iters


class Saved:
    """The user's state a run of ``fn`` could change, as it is now: the parameters, buffers and
    ``.grad`` of the modules ``fn`` reaches and of those (and the tensors) among its arguments,
    its optimizers' state and the random number generators (torch's, numpy's and Python's);
    ``restore()`` puts it back."""

    def __init__(self, fn: Callable, args: tuple = (), kwargs: dict | None = None):
        import random

        import torch

        mods, opts, _ = reached(fn)
        tensors: list[Any] = []
        for _, m in mods:
            tensors += list(m.parameters()) + list(m.buffers())
        for o in opts:
            for group in o.param_groups:
                tensors += [p for p in group["params"] if isinstance(p, torch.Tensor)]

        def walk(a: Any) -> None:
            if isinstance(a, torch.Tensor):
                tensors.append(a)
            elif isinstance(a, torch.nn.Module):
                tensors.extend([*a.parameters(), *a.buffers()])
            elif isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)
            elif isinstance(a, dict):
                for x in a.values():
                    walk(x)

        walk(args)
        walk(kwargs or {})
        seen: set[int] = set()
        self.saved = []
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                g = t.grad if t.is_leaf else None
                self.saved.append(
                    (t, t.detach().clone(), None if g is None else g.detach().clone())
                )
        self.states = [(o, copy.deepcopy(o.state_dict())) for o in opts]
        self.rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())

    def restore(self) -> None:
        import random

        import torch

        with torch.no_grad():
            for t, v, g in self.saved:
                t.copy_(v)
                if t.is_leaf:
                    t.grad = None if g is None else g.clone()
        for o, st in self.states:
            o.load_state_dict(copy.deepcopy(st))
        torch.set_rng_state(self.rng[0])
        np.random.set_state(self.rng[1])
        random.setstate(self.rng[2])


@contextlib.contextmanager
def kept(fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
    """The user's state (:class:`Saved`) put back after the block."""
    saved = Saved(fn, args, kwargs)
    try:
        yield
    finally:
        saved.restore()


def _step(fn: Callable, args: tuple, kwargs: dict) -> tuple[float | None, list[np.ndarray] | None]:
    """(the loss fn returns, the gradient of every leaf among the arguments) of one run on these
    arguments; the state of the user's that the run could change is put back after it."""
    with kept(fn):
        return _run_step(fn, args, kwargs)


def _run_step(
    fn: Callable, args: tuple, kwargs: dict
) -> tuple[float | None, list[np.ndarray] | None]:
    import torch

    leaves = _leaves(args, kwargs)
    out = fn(*args, **kwargs)
    loss = out[0] if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor) else out
    value = None
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        value = float(loss.detach().reshape(()))
        # the step's own backward already ran where a leaf has a gradient (a second one would
        # go through a freed graph); with no leaf among the arguments there is none to take
        if leaves and all(t.grad is None for t in leaves) and loss.requires_grad:
            loss.backward()
    grads = [
        (t.grad if t.grad is not None else torch.zeros_like(t)).detach().double().cpu().numpy()
        for t in leaves
    ]
    return value, grads


def _moved(args: tuple, kwargs: dict, vs: list, h: float) -> None:
    import torch

    with torch.no_grad():
        for t, v in zip(_leaves(args, kwargs), vs):
            t.add_(h * torch.as_tensor(v, dtype=t.dtype))


class _TorchProgram:
    def __init__(self, fn: Callable, args: tuple, kwargs: dict):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.index: dict = {}
        self.original: Callable[[], contextlib.AbstractContextManager[None]] = (
            contextlib.nullcontext
        )
        a, k = _copy(args, kwargs)
        self.value, self.grads = _step(fn, a, k)
        self.shapes = [g.shape for g in self.grads or []]
        rng = np.random.default_rng(0)
        self.nearby = [[rng.standard_normal(s) * 1e-2 for s in self.shapes] for _ in range(2)]
        self.nearby_out = []
        for vs in self.nearby:
            try:
                a, k = _copy(args, kwargs)
                _moved(a, k, vs, 1.0)
                self.nearby_out.append(_step(fn, a, k))
            except Exception:
                self.nearby_out.append((None, None))

    def _value(self, vs: list, h: float) -> float | None:
        try:
            a, k = _copy(self.args, self.kwargs, double=True)
            _moved(a, k, vs, h)
            v, _ = _step(self.fn, a, k)
        except Exception:
            return None
        return v if v is not None and np.isfinite(v) else None

    def central(self, grads: list[np.ndarray]) -> str | bool | None:
        """Whether ``grads`` match differences of the original step (float64) along two random
        directions: central ones, or (at the edge of the domain, where one side is NaN) one-sided
        ones into the domain, extrapolated to h -> 0."""
        rng = np.random.default_rng(1)
        kind = "central differences"
        f0 = self._value([np.zeros(s) for s in self.shapes], 0.0)
        if f0 is None:
            return None
        for _ in range(2):
            vs = [rng.standard_normal(s) for s in self.shapes]
            h = 1e-6
            hi, lo = self._value(vs, h), self._value(vs, -h)
            if hi is not None and lo is not None:

                def quotient(h: float, vs: list = vs) -> float | None:
                    hi, lo = self._value(vs, h), self._value(vs, -h)
                    return None if hi is None or lo is None else (hi - lo) / (2 * h)

                fd: float | None = (hi - lo) / (2 * h)
            else:
                for u in ([np.abs(v) for v in vs], [-np.abs(v) for v in vs]):
                    a, b = self._value(u, h), self._value(u, h / 2)
                    if a is not None and b is not None:
                        vs, kind = u, "one-sided differences into the domain"

                        def quotient(h: float, vs: list = vs) -> float | None:
                            a, b = self._value(vs, h), self._value(vs, h / 2)
                            if a is None or b is None:
                                return None
                            return 2 * ((b - f0) / (h / 2)) - (a - f0) / h

                        fd = quotient(h)
                        break
                else:
                    return None
            assert fd is not None
            if self._agrees(grads, vs, fd):
                continue
            # a piece narrower than h (a clamp at eps = 1e-6): the quotient at h / 100
            fine = quotient(h / 100)
            if fine is None:
                return False
            if self._agrees(grads, vs, fine):
                continue
            if not self._settles(grads, vs, fd, fine):
                return NO_LIMIT  # a jump or an infinite slope: no gradient to compare with
            return False
        return kind

    @staticmethod
    def _settles(grads: list[np.ndarray], vs: list, q: float, fine: float) -> bool:
        """Whether the difference quotients at h and h / 100 agree: where they do not (one grows
        like 1 / h at a jump, like log h at x log x), the original step has no derivative."""
        scale = float(np.sqrt(sum(np.sum(g**2) for g in grads) * sum(np.sum(v**2) for v in vs)))
        return abs(q - fine) <= 5e-2 * (abs(q) + abs(fine)) + 1e-3 * scale + 1e-5

    @staticmethod
    def _agrees(grads: list[np.ndarray], vs: list, fd: float) -> bool:
        dot = float(sum(np.sum(g * v) for g, v in zip(grads, vs)))
        scale = float(np.sqrt(sum(np.sum(g**2) for g in grads) * sum(np.sum(v**2) for v in vs)))
        return abs(fd - dot) <= 1e-3 * (abs(fd) + scale) + 1e-5


class Ran(NamedTuple):
    """What the fixed step gave at the failing point: its loss and every leaf's gradient."""

    value: float
    grads: list[np.ndarray]


def run_fixed(
    prog: _TorchProgram, nonfinite: str = "the fixed gradient is still non-finite"
) -> Ran | tuple[str, str]:
    """The first checks every torch fix gets (with the patched function swapped in): run the
    step on copies of the arguments; its gradient finite (else ``("failed", nonfinite)``) and
    a scalar loss on both sides to compare. A (status, why) verdict where one fails."""
    try:
        a, k = _copy(prog.args, prog.kwargs)
        value, grads = _step(prog.fn, a, k)
    except Exception as e:
        return "failed", f"the fixed step raised {type(e).__name__}"
    if grads is None or not all(np.isfinite(g).all() for g in grads):
        return "failed", nonfinite
    if value is None or prog.value is None:
        return "unverified", "the step returns no scalar loss to compare"
    return Ran(value, grads)


def same_value(value: float, original: float) -> bool:
    """The fixed loss is the original one (float32 rounding of a rewritten expression)."""
    return bool(np.isclose(value, original, rtol=2e-4, atol=1e-6))


def _check(prog: _TorchProgram, p: FixProposal) -> tuple[str, str]:
    ran = run_fixed(prog)
    if not isinstance(ran, Ran):
        return ran
    value, grads = ran
    assert prog.value is not None  # run_fixed said so
    checked = []
    if not np.isfinite(value):
        return "failed", "the fixed loss is non-finite"
    if not np.isfinite(prog.value):
        if not p.value_change:
            return "unverified", (
                "the forward value is itself non-finite there, so there is no true gradient"
            )
        checked.append(f"value {prog.value:.6g} -> {value:.6g} as stated")
    elif not same_value(value, prog.value):
        if not p.value_change:
            return "failed", "the fix changes the forward value"
        checked.append(f"value changed: {prog.value:.6g} -> {value:.6g}")
    else:
        checked.append("same value")
    if not grads:  # no leaf among the arguments: nothing of the gradient to compare
        return loss_only(prog, checked)
    with prog.original():
        fd = prog.central(grads)
    if fd is False:
        return "failed", f"gradient {_show(grads)} disagrees with central differences"
    if fd is None:
        return "unverified", (
            f"the fixed gradient {_show(grads)} is finite, but gradsan could not difference "
            "the step to check it"
        )
    if fd != NO_LIMIT:
        checked.append(f"gradient {_show(grads)} matches {fd} (float64)")
    same = 0
    for vs, (ov, og) in zip(prog.nearby, prog.nearby_out):
        if ov is None or og is None or not np.isfinite(ov):
            continue
        if not all(np.isfinite(g).all() for g in og):
            continue  # the same singularity nearby: nothing to compare there
        try:
            a, k = _copy(prog.args, prog.kwargs)
            _moved(a, k, vs, 1.0)
            v, g = _step(prog.fn, a, k)
        except Exception:
            return "failed", "the fixed step fails near the failing point"
        if v is None or not np.isclose(v, ov, rtol=1e-3, atol=1e-6):
            return "failed", "the fix changes the loss near the failing point"
        if g is None or not all(np.allclose(x, y, rtol=1e-3, atol=1e-6) for x, y in zip(g, og)):
            return "failed", "the fix changes the gradient near the failing point"
        same += 1
    if same:
        checked.append(f"same outputs at {same} nearby point{'s' if same > 1 else ''}")
    if fd == NO_LIMIT:
        return "unverified", convention(
            NO_GRADIENT_TORCH, f"the fixed gradient {_show(grads)}", checked
        )
    return "verified", ", ".join(checked)


def loss_only(prog: _TorchProgram, checked: list[str]) -> tuple[str, str]:
    """The verdict where the step has no leaf among its arguments (its parameters live in its
    closure): the gradient was not compared, so the fix is not verified."""
    mods, _, _ = reached(prog.fn)
    where = f" ({', '.join(n for n, _ in mods)} in its closure or globals)" if mods else ""
    return "unverified", (
        f"the step's parameters are not among its arguments{where}, so gradsan compared its "
        f"loss only ({', '.join(checked)}), not its gradient"
    )


def verify_one(prog: _TorchProgram, f: Finding, p: FixProposal) -> tuple[str, str]:
    site = locate(f.where)
    if site is None or site.func is None or p.file is None:
        return "unverified", "the statement is not inside a function gradsan can re-run"
    if site.in_lambda:
        return "unverified", "the statement is inside a lambda or comprehension"
    got = parsed(p.file)
    if got is None:
        return "unverified", "the source file could not be read"
    fn = site.func
    funcs = prog.index.get((p.file, fn.name, _first_line(fn)), [])
    if not funcs:
        return "unverified", f"gradsan found no live function {fn.name} to run the fix in"
    old = funcs[0].__code__
    funcs = [g for g in funcs if g.__code__ is old]
    code = patched_code(p.file, apply(got[0], [p]), fn.name, fn.lineno, old.co_freevars)
    if code is None:
        return "unverified", "the patched function could not be compiled the same way"
    with swapped(funcs, code, "torch", False) as original:
        prog.original = original
        return _check(prog, p)


def verify_torch(report: Report, fn: Callable, args: tuple, kwargs: dict) -> None:
    from . import render_suggestions

    todo = [
        f
        for f in report.findings
        if f.kind in ("nonfinite", "unresolved") and any(p.code for p in f.fixes)
    ][:MAX_FINDINGS]
    if not todo:
        return
    iters = reached(fn)[2]
    if iters:  # a run would advance them: the user's next batch would be another one
        for f in todo:
            for p in f.fixes:
                if p.code is not None:
                    p.status, p.checked = (
                        "unverified",
                        (
                            f"the step reads from {', '.join(iters)}, which running it again would "
                            "advance, so gradsan did not run it"
                        ),
                    )
            f.suggestions = render_suggestions(f.fixes)
        return
    try:
        prog = _TorchProgram(fn, args, kwargs)
    except Exception as e:
        for f in todo:
            for p in f.fixes:
                if p.code is not None:
                    p.status, p.checked = "unverified", f"the step could not be re-run ({e})"
            f.suggestions = render_suggestions(f.fixes)
        return
    prog.index = function_index({p.file for f in todo for p in f.fixes if p.file})
    for f in todo:
        for p in f.fixes:
            if p.code is None:
                continue
            try:
                p.status, p.checked = verify_one(prog, f, p)  # type: ignore[assignment]
            except Exception as e:
                p.status, p.checked = "unverified", f"gradsan could not run it ({type(e).__name__})"
        rank = {"verified": 0, "unverified": 1, "prose": 2, "failed": 3}
        f.fixes.sort(key=lambda p: rank[p.status])
        f.suggestions = render_suggestions(f.fixes)
