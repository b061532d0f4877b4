"""Verification: each code fix run by gradsan on the user's program before it is printed.

The fix is applied to a patched copy of the enclosing function's source, compiled with the same
free variables, and its code object is swapped into the function objects that own the original
code (found through the garbage collector) for the duration of the check; the originals are
restored in ``finally`` and JAX's caches are cleared on both sides, so the user's live state is
left as it was. The program is then run forward and backward at the failing point, at two
nearby points and (JAX) under ``jax.jit``. A fix is kept only if

- every output is finite at the failing point,
- the forward value is unchanged to rounding (or the change is the one the fix states), and
- the gradient equals a reference: certify's certified gradient, nansafe's proven repair, or
  (where neither is known) central differences of the original function along two directions.

Fixes that fail are marked ``failed`` (never printed); those gradsan cannot run say why.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._report._records import Finding, FixProposal, Report
from ._copies import Uncopyable, copied
from ._cost import REFERENCE_MAX_EQNS, Budget, all_eqns, equations, subjaxprs, too_large
from ._edit import apply
from ._site import locate, parsed

MAX_FINDINGS = 5
NO_GRADIENT = "certify finds no gradient at this point (the function jumps or leaves its domain)"
# torch's reference: difference quotients of the original step that grow without settling
NO_GRADIENT_TORCH = (
    "the original step's difference quotients do not settle at this point: it has no gradient "
    "there (the function jumps or leaves its domain)"
)
TOO_LARGE = "too large"  # the reference's name when certify and nansafe would cost too much
RTOL = 2e-4
ATOL = 1e-6


# ---- the patched function ------------------------------------------------------------------------


def _first_line(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return min([fn.lineno, *(d.lineno for d in fn.decorator_list)])


def function_index(files: set[str]) -> dict[tuple[str, str, int], list[types.FunctionType]]:
    """The live function objects of ``files`` by (file, name, first line): one pass over the
    garbage collector's objects for a whole report."""
    out: dict[tuple[str, str, int], list[types.FunctionType]] = {}
    for o in gc.get_objects():
        if type(o) is types.FunctionType:
            c = o.__code__
            if c.co_filename in files:
                out.setdefault((c.co_filename, c.co_name, c.co_firstlineno), []).append(o)
    return out


def _strip(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    """What a def evaluates when it runs (decorators, defaults, annotations) is not part of its
    code object: removed, so that compiling the copy evaluates nothing of the user's."""
    fn.decorator_list = []
    fn.returns = None
    a = fn.args
    a.defaults = []
    a.kw_defaults = [None] * len(a.kwonlyargs)
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
        if arg is not None:
            arg.annotation = None


def patched_code(
    file: str, text: str, name: str, lineno: int, freevars: tuple[str, ...]
) -> types.CodeType | None:
    """The code object of the def ``name`` at ``lineno`` in ``text`` (the patched file), compiled
    with ``freevars`` as its free variables; None when it cannot be built the same way."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    fn = next(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name == name
            and n.lineno == lineno
        ),
        None,
    )
    if fn is None:
        return None
    _strip(fn)
    outer_body: list[ast.stmt] = [
        ast.Assign(targets=[ast.Name(v, ast.Store())], value=ast.Constant(None)) for v in freevars
    ]
    outer_body += [fn, ast.Return(ast.Name(fn.name, ast.Load()))]
    outer = ast.FunctionDef(
        name="__gradsan_fix__",
        args=ast.arguments([], [], None, [], [], None, []),
        body=outer_body,
        decorator_list=[],
        returns=None,
    )
    mod = ast.Module(body=[outer], type_ignores=[])
    ast.fix_missing_locations(mod)
    try:
        code = compile(mod, file, "exec")
    except (SyntaxError, ValueError):
        return None
    ns: dict[str, Any] = {}
    exec(code, ns)  # defines __gradsan_fix__ only: the user's function is not run
    inner = ns["__gradsan_fix__"]()
    new = inner.__code__
    if new.co_freevars != freevars:
        return None
    return new


def _jitted_around(funcs: list[types.FunctionType], skip: object) -> bool:
    """Whether a ``jax.jit`` object (other than ``skip``) holds one of ``funcs``, directly or
    through closures and wrappers: its trace cache would hand back the unpatched program."""
    seen = {id(f) for f in funcs}
    frontier: list[object] = list(funcs)
    for _ in range(5):
        nxt: list[object] = []
        for o in frontier:
            for r in gc.get_referrers(o):
                if id(r) in seen or r is frontier or r is funcs:
                    continue
                seen.add(id(r))
                name = type(r).__name__
                if name == "PjitFunction" and r is not skip:
                    return True
                if isinstance(r, (types.CellType, types.FunctionType, types.MethodType)) or (
                    name in ("partial", "PjitFunction")
                ):
                    nxt.append(r)
        frontier = nxt
    return False


@contextlib.contextmanager
def swapped(
    funcs: list[types.FunctionType], code: types.CodeType, backend: str, clear: bool
) -> Iterator[Callable[[], contextlib.AbstractContextManager[None]]]:
    """The functions run ``code`` (with ``gradsan`` importable as a global) inside the block;
    with ``clear``, JAX's trace caches are emptied on entry and on exit. The block gets a
    context manager factory that runs the original code inside it (for references)."""
    import gradsan

    __import__(f"gradsan.{backend}")
    old = [f.__code__ for f in funcs]
    added = []

    def put(codes: list[types.CodeType]) -> None:
        for f, c in zip(funcs, codes):
            f.__code__ = c
        if clear:
            _clear(backend)

    @contextlib.contextmanager
    def original() -> Iterator[None]:
        put(old)
        try:
            yield
        finally:
            put([code] * len(funcs))

    try:
        for f in funcs:
            g = f.__globals__
            if "gradsan" not in g:
                g["gradsan"] = gradsan
                added.append(g)
        put([code] * len(funcs))
        yield original
    finally:
        put(old)
        for g in added:
            g.pop("gradsan", None)


def _clear(backend: str) -> None:
    if backend == "jax":
        import jax

        jax.clear_caches()


# ---- numbers --------------------------------------------------------------------------------------


def _leaves(x: Any) -> list[np.ndarray]:
    import jax

    out = []
    for leaf in jax.tree_util.tree_leaves(x):
        try:
            a = np.asarray(leaf)
        except Exception:
            continue
        if a.dtype.kind in "fc":
            out.append(a.astype(np.float64) if a.dtype.kind == "f" else a)
    return out


def _finite(leaves: list[np.ndarray]) -> bool:
    return all(np.isfinite(a).all() for a in leaves)


def _close(a: list[np.ndarray], b: list[np.ndarray], rtol: float = RTOL) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False
        if not np.allclose(x, y, rtol=rtol, atol=ATOL, equal_nan=True):
            return False
    return True


def _show(leaves: list[np.ndarray]) -> str:
    flat = np.concatenate([np.ravel(a) for a in leaves]) if leaves else np.zeros(0)
    if flat.size == 1:
        return f"{float(flat[0]):.6g}"
    head = ", ".join(f"{float(v):.6g}" for v in flat[:3])
    return f"[{head}{', ...' if flat.size > 3 else ''}]"


# ---- the checks ------------------------------------------------------------------------------------


class _Program:
    """The failing call and what gradsan knows about it: the loss (when ``fun`` is a JAX
    gradient), the reference gradient, nearby points."""

    def __init__(self, fun: Callable, args: tuple, kwargs: dict, backend: str):
        self.outer: object = None
        if backend == "jax" and type(fun).__name__ == "PjitFunction":
            # a jitted program is run through the function it wraps (its trace cache would
            # return the unpatched program) and jitted afresh for the jit check
            self.outer, fun = fun, getattr(fun, "__wrapped__", fun)
        self.fun, self.args, self.kwargs, self.backend = fun, args, kwargs, backend
        self.info = None
        if backend == "jax":
            from ..jax import _compat

            self.info = _compat.grad_info(fun)
        self._ref: tuple[list[np.ndarray] | None, str] | None = None
        self.size: int | None = None  # equations one run executes (None: not traced)
        # whether the program has scan / while / cond / remat / custom-rule bodies: JAX caches
        # their traces by the Python function, so a swapped-in code needs its caches cleared
        self.bodies = False
        self.budget = Budget()
        self.base_value: list[np.ndarray] | None = None
        self.nearby = self._nearby()
        self.nearby_out: list[list[np.ndarray] | None] = []
        self.index: dict[tuple[str, str, int], list[types.FunctionType]] = {}
        self.want_jit = True
        self.original: Callable[[], contextlib.AbstractContextManager[None]] = (
            contextlib.nullcontext
        )

    # the differentiated arguments' float leaves, moved a little
    def _nearby(self) -> list[tuple]:
        import jax

        rng = np.random.default_rng(0)
        argnums: Any = self.info.argnums if self.info is not None else range(len(self.args))
        idx = {argnums} if isinstance(argnums, int) else set(argnums)
        points = []
        for _ in range(2):
            new = list(self.args)
            for i in idx:
                if not 0 <= i < len(new):
                    continue

                def move(leaf: Any) -> Any:
                    if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
                        return leaf  # a typed PRNG key (jax.random.key) is no float to move
                    a = np.asarray(leaf)
                    if a.dtype.kind != "f":
                        return leaf
                    d = rng.standard_normal(a.shape) * 1e-2 * (1.0 + np.abs(a))
                    if not hasattr(leaf, "dtype"):  # a Python number stays one
                        return type(leaf)(a + d)
                    return jax.numpy.asarray((a + d).astype(a.dtype))

                new[i] = jax.tree_util.tree_map(move, new[i])
            points.append(tuple(new))
        return points

    def grad_part(self, out: Any) -> Any:
        if self.info is not None and self.info.kind == "value_and_grad":
            return out[1]
        return out

    def loss_value(self, args: tuple) -> list[np.ndarray] | None:
        if self.info is None:
            return None
        try:
            args, kwargs = copied(args, self.kwargs)
            v = self.info.fun(*args, **kwargs)
        except Exception:
            return None
        if self.info.has_aux:
            v = v[0]
        return _leaves(v)

    def reference(self) -> tuple[list[np.ndarray] | None, str]:
        """The reference gradient at the failing point and its name, computed once (on the
        original program: call it outside the swap, or inside ``self.original()``)."""
        if self._ref is None:
            if self.size is not None and self.size > REFERENCE_MAX_EQNS:
                self._ref = None, TOO_LARGE  # certify and nansafe walk every equation
            else:
                self._ref = self._reference()
        return self._ref

    def original_reference(self) -> tuple[list[np.ndarray] | None, str]:
        """``reference()`` from inside the swap: the original code is put back for it (only
        the first time; it is cached)."""
        if self._ref is None:
            with self.original():
                return self.reference()
        return self._ref

    def _reference(self) -> tuple[list[np.ndarray] | None, str]:
        """certify's gradient; where certify cannot decide, nansafe's proven repair. Where
        certify finds no gradient (a jump, a point outside the domain), there is none: the name
        says so and the reference is None."""
        from ..jax import certify, nansafe

        try:
            if self.info is None:
                raise LookupError  # certify needs the loss: only nansafe can help
            args, kwargs = copied(self.args, self.kwargs)
            rep = certify(self.fun)(*args, **kwargs)
            label = next((f.detail.get("label") for f in rep.findings), None)
            outs = rep.outputs  # certify's outputs are the gradient (also for value_and_grad)
            if self.info.kind == "value_and_grad" and isinstance(outs, tuple) and len(outs) == 2:
                outs = outs[1]
            leaves = _leaves(outs) if outs is not None else []
            if label == "gradient" and leaves and _finite(leaves):
                return leaves, "the certified limit"
            if label == "clarke-subgradient" and leaves and _finite(leaves):
                return leaves, "certify's Clarke subgradient"
            if label == "singular":
                return None, NO_GRADIENT
        except Exception:  # noqa: S110  (no certificate: try nansafe)
            pass
        try:
            args, kwargs = copied(self.args, self.kwargs)
            out, rep = nansafe(self.fun, report=True)(*args, **kwargs)
            proven = all(f.detail.get("proven") is True for f in rep.by_kind("resolved"))
            leaves = _leaves(self.grad_part(out))
            if rep.by_kind("resolved") and not rep.by_kind("unresolved") and proven:
                if _finite(leaves):
                    return leaves, "nansafe's proven repair"
        except Exception:
            pass
        return None, ""

    def central_differences(self, grad: list[np.ndarray]) -> bool | None:
        """Whether ``grad`` matches central differences of the original loss along two random
        directions; None when there is no loss to differentiate."""
        import jax

        if self.info is None:
            return None
        argnums = self.info.argnums
        idx = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        base = [self.args[i] for i in idx]
        flat, tree = jax.tree_util.tree_flatten(base)
        if len(flat) != len(grad) or any(np.asarray(a).dtype.kind != "f" for a in flat):
            return None
        rng = np.random.default_rng(1)
        for _ in range(2):
            # each element moves in proportion to its own size (a -1000 logit next to a 0 one)
            vs = [rng.standard_normal(np.shape(a)) * (1.0 + np.abs(np.asarray(a))) for a in flat]
            h = 1e-3

            def at(sign: float, vs: list = vs, h: float = h) -> float | None:
                moved = [
                    type(a)(np.asarray(a) + sign * h * v)
                    if not hasattr(a, "dtype")
                    else jax.numpy.asarray((np.asarray(a) + sign * h * v).astype(a.dtype))
                    for a, v in zip(flat, vs)
                ]
                parts = jax.tree_util.tree_unflatten(tree, moved)
                args = list(self.args)
                for i, p in zip(idx, parts):
                    args[i] = p
                v = self.loss_value(tuple(args))
                if v is None or len(v) != 1 or v[0].size != 1 or not _finite(v):
                    return None
                return float(v[0].ravel()[0])

            hi, lo = at(1.0), at(-1.0)
            if hi is None or lo is None:
                return None
            fd = (hi - lo) / (2 * h)
            dot = float(sum(np.sum(g * v) for g, v in zip(grad, vs)))
            norm = float(np.sqrt(sum(np.sum(g**2) * np.sum(v**2) for g, v in zip(grad, vs))))
            if abs(fd - dot) > 2e-2 * (abs(fd) + norm) + 1e-3:
                return False
        return True


def _run(fun: Callable, args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    """``fun`` run on its own copy of the arguments (a step may update them in place)."""
    args, kwargs = copied(args, kwargs)
    try:
        return fun(*args, **kwargs), None
    except Exception as e:  # the fixed program fails: its error is the verdict
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _check(prog: _Program, p: FixProposal, note: str | None) -> tuple[str, str]:
    """(status, what was checked) of running the program with the fix in place."""
    import jax

    out, err = _run(prog.fun, prog.args, prog.kwargs)
    if err is not None:
        return "failed", f"the fixed program raised {err}"
    leaves = _leaves(out)
    if not _finite(leaves):
        return "failed", "the fixed program is still non-finite at the failing point"
    checked = []
    # the forward value
    if prog.info is not None:
        v = prog.loss_value(prog.args)
        if prog.base_value is None or v is None:
            return "unverified", "the forward value could not be compared"
        if _finite(prog.base_value):
            if not _close(v, prog.base_value):
                if not note:
                    return "failed", "the fix changes the forward value"
                checked.append(f"value changed: {_show(prog.base_value)} -> {_show(v)}")
            else:
                checked.append("same value")
        elif not note:
            return "unverified", (
                "the forward value is itself non-finite there, so there is no true gradient to "
                "compare the fixed one with"
            )
        else:
            checked.append(f"value {_show(prog.base_value)} -> {_show(v)} as stated")
    grad = _leaves(prog.grad_part(out))
    ref, ref_name = prog.original_reference()
    large = ""  # what stopped the gradient's comparison on a program too large to certify
    conv = ""  # no true gradient here: the fixed one is a convention (the rest still checked)
    if ref_name == TOO_LARGE:
        fd = None
        if not note:
            with prog.original():
                fd = prog.central_differences(grad)
        if fd:
            checked.append(f"gradient {_show(grad)} matches central differences")
        elif fd is False:
            return "failed", f"gradient {_show(grad)} disagrees with central differences"
        else:
            large = f"the fixed gradient {_show(grad)} is finite"
    elif ref is not None:
        if not _close(grad, ref, rtol=1e-3):
            return "failed", f"gradient {_show(grad)} differs from {ref_name} {_show(ref)}"
        checked.append(f"gradient {_show(grad)} = {ref_name}")
    elif ref_name == NO_GRADIENT:
        conv = f"the fixed gradient {_show(grad)}"  # the rest is checked, then said
    else:
        fd = None
        if not note:
            with prog.original():
                fd = prog.central_differences(grad)
        if fd is False:
            return "failed", f"gradient {_show(grad)} disagrees with central differences"
        if fd is None:
            return "unverified", (
                f"the fixed gradient {_show(grad)} is finite, but gradsan has no reference "
                "gradient to compare it with"
            )
        checked.append(f"gradient {_show(grad)} matches central differences")
    # nearby points: the same outputs as the original program
    same = same_nearby(prog)
    if same is None:
        return "failed", "the fix changes the program's outputs near the failing point"
    if same:
        checked.append(f"same outputs at {same} nearby point{'s' if same > 1 else ''}")
    if prog.backend == "jax" and prog.want_jit:  # the first fix of a finding that gets here
        prog.want_jit = False
        fresh = prog.fun

        def again(*a: Any, **k: Any) -> Any:  # a new function: a trace cache of its own
            return fresh(*a, **k)

        o, e = _run(jax.jit(again), prog.args, prog.kwargs)
        if e is not None or not _close(_leaves(o), leaves, rtol=1e-3):
            return "failed", "the fix behaves differently under jax.jit"
        checked.append("under jit too")
    if conv:
        return "unverified", convention(NO_GRADIENT, conv, checked)
    if large:
        return "unverified", too_large(prog.size, ", ".join([large, *checked]))
    return "verified", ", ".join(checked)


def convention(found: str, gradient: str, checked: list[str]) -> str:
    """Why a fix that ran is not verified where the original program has no gradient at the
    failing point (a jump, the edge of its domain): the fixed gradient is a convention there;
    what was checked of the run is said (both backends)."""
    text = f"{found}; {gradient} is a convention"
    return f"{text}; checked: {', '.join(checked)}" if checked else text


def _enclosing(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best = None
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if n.lineno <= line <= (n.end_lineno or n.lineno):
                if best is None or n.lineno > best.lineno:
                    best = n
    return best


Check = Callable[[_Program, FixProposal, "str | None"], tuple[str, str]]


def verify_set(
    prog: _Program, props: list[FixProposal], note: str | None, check: Check | None = None
) -> tuple[str, str]:
    """Run the program with every fix of ``props`` in place at once (one per finding: a fix is
    checked with the other findings' fixes applied, since each of them poisons the outputs too);
    ``check`` judges the run (default: against the reference gradient)."""
    by_file: dict[str, list[FixProposal]] = {}
    for p in props:
        if p.file is None:
            return "unverified", "the fix names no file"
        by_file.setdefault(p.file, []).append(p)
    swaps = []
    for file, edits in by_file.items():
        got = parsed(file)
        if got is None:
            return "unverified", "the source file could not be read"
        text = apply(got[0], edits)
        fns = {}
        for e in edits:
            fn = _enclosing(got[1], e.start_line)
            if fn is None:
                return "unverified", "the statement is not inside a function gradsan can re-run"
            fns[(fn.name, fn.lineno)] = fn
        for (name, lineno), fn in fns.items():
            funcs = prog.index.get((file, name, _first_line(fn)), [])
            if not funcs:
                return "unverified", f"gradsan found no live function {name} to run the fix in"
            old = funcs[0].__code__
            funcs = [g for g in funcs if g.__code__ is old]
            code = patched_code(file, text, name, lineno, old.co_freevars)
            if code is None:
                return "unverified", "the patched function could not be compiled the same way"
            g = funcs[0].__globals__.get("gradsan")
            if g is not None and g is not sys.modules.get("gradsan"):
                return "unverified", "the name gradsan is taken in this module"
            swaps.append((funcs, code))
    with contextlib.ExitStack() as stack:
        originals = [
            stack.enter_context(
                swapped(funcs, code, "jax", prog.bodies or _jitted_around(funcs, prog.outer))
            )
            for funcs, code in swaps
        ]

        @contextlib.contextmanager
        def all_original() -> Iterator[None]:
            with contextlib.ExitStack() as inner:
                for o in reversed(originals):
                    inner.enter_context(o())
                yield

        prog.original = all_original
        return (check or _check)(prog, props[0], note)


def verify_one(
    prog: _Program, f: Finding, p: FixProposal, others: list[FixProposal]
) -> tuple[str, str]:
    site = locate(f.where)
    if site is None or site.func is None or p.file is None:
        return "unverified", "the statement is not inside a function gradsan can re-run"
    if site.in_lambda:
        return "unverified", "the statement is inside a lambda or comprehension"
    keep = [p]
    for o in others:  # one edit per statement: a fix on the same lines as a kept one is left out
        if not any(
            o.file == k.file and not (o.end_line < k.start_line or o.start_line > k.end_line)
            for k in keep
        ):
            keep.append(o)
    return verify_set(prog, keep, p.value_change)


def verify_together(prog: _Program, report: Report) -> None:
    """The fixes ``Report.patch()`` would apply, run together: when they do not pass as a whole,
    only the first finding's stays verified (the others say so)."""
    from ._patch import chosen

    picks = chosen(report)
    if len(picks) < 2:
        return
    prog.want_jit = True
    status, why = verify_set(prog, picks, None)
    if status == "verified":
        return
    first = picks[0]
    for f in report.findings:
        if first in f.fixes:
            continue
        for p in f.fixes:  # every fix of the other findings: the patch applies the first only
            if p.status == "verified":
                p.status = "unverified"
                p.checked = (
                    f"verified alone, but not together with the fix at {first.file}:"
                    f"{first.start_line} ({why})"
                )


def trace(fun: Callable, args: tuple, kwargs: dict) -> Any:
    """The program's closed jaxpr, or None when it cannot be traced here."""
    import jax

    try:
        args, kwargs = copied(args, kwargs)
        return jax.make_jaxpr(fun)(*args, **kwargs)
    except Exception:  # the verification's own run says what is wrong
        return None


def size_of(closed: Any) -> int | None:
    try:
        return equations(closed) if closed is not None else None
    except Exception:  # an equation gradsan cannot size: no limit from it
        return None


def _library_body(jaxpr: Any) -> bool:
    """Whether a traced body is JAX's own (a ``custom_jvp`` of ``jax.nn``, ...): its trace
    cache is keyed by a function the swap does not touch."""
    import os

    import jax

    info = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None)
    root = os.path.dirname(jax.__file__) + os.sep
    return isinstance(info, str) and f" at {root}" in info


def has_bodies(closed: Any) -> bool:
    """Whether the program holds a traced body (scan, while, cond, remat, custom rules) other
    than a ``jit``'s or JAX's own: JAX caches its trace by the Python function, so a fix swapped
    into it (or into a function it calls) needs the caches cleared. True when unknown."""
    if closed is None:
        return True
    try:
        return any(
            not _library_body(sub)
            for e in all_eqns(closed.jaxpr)
            if e.primitive.name not in ("pjit", "jit")
            for v in e.params.values()
            for sub in subjaxprs(v)
        )
    except Exception:
        return True


def side_effects(fun: Callable, args: tuple, kwargs: dict, closed: Any = None) -> str:
    """The kinds of side effect the program makes when it runs (callbacks: ``io_callback``,
    ``jax.debug.callback`` and ``print``), or "" (also when it cannot be traced here)."""
    if closed is None:
        closed = trace(fun, args, kwargs)
    if closed is None:
        return ""

    def word(e: Any) -> str:
        name = type(e).__name__
        if "IO" in name:
            return "io_callback"
        if "Debug" in name:
            return "jax.debug callback"
        return name

    names = sorted({word(e) for e in closed.effects})
    return ", ".join(names)


def verify(report: Report, fun: Callable, args: tuple, kwargs: dict, backend: str) -> None:
    """Verify the code fixes of the report's findings in place: verified fixes first, each with
    what was checked; failed ones kept (for the JSON) but not printed."""
    from . import render_suggestions
    from ._kinks import verify_kinks

    verify_kinks(report, fun, args, kwargs, backend)  # torch sanitize's kinks (JAX: sanitize's)
    todo = [
        f
        for f in report.findings
        if f.kind in ("nonfinite", "unresolved") and any(p.code for p in f.fixes)
    ][:MAX_FINDINGS]
    if not todo:
        return
    if backend == "torch":
        from ._verify_torch import verify_torch

        verify_torch(report, fun, args, kwargs)
        return
    try:
        copied(args, kwargs)
    except Uncopyable as why:  # a run could change it in place: the program is not run again
        for f in todo:
            for p in f.fixes:
                if p.code is not None and p.status == "unverified":
                    p.checked = (
                        f"gradsan cannot copy {why} and running the program again could "
                        "change it in place, so gradsan did not run it"
                    )
            f.suggestions = render_suggestions(f.fixes)
        return
    closed = trace(fun, args, kwargs)
    effects = side_effects(fun, args, kwargs, closed)
    if effects:  # running the program again would repeat them: the fixes stay unverified
        for f in todo:
            for p in f.fixes:
                if p.code is not None and p.status == "unverified":
                    p.checked = (
                        f"the function has side effects ({effects}) that running it again "
                        "would repeat, so gradsan did not run it"
                    )
            f.suggestions = render_suggestions(f.fixes)
        return
    prog = _Program(fun, args, kwargs, backend)
    prog.size, prog.bodies = size_of(closed), has_bodies(closed)
    prog.base_value = prog.loss_value(args)
    prog.index = function_index({p.file for f in todo for p in f.fixes if p.file})
    for pt in prog.nearby:
        o, e = _run(fun, pt, kwargs)
        prog.nearby_out.append(_leaves(o) if e is None else None)
    # each finding's fix is run with the first code fix of every other finding in place
    firsts = {id(f): next(p for p in f.fixes if p.code) for f in todo}
    for f in todo:
        prog.want_jit = True
        others = [firsts[id(g)] for g in todo if g is not f]
        for p in f.fixes:
            if p.code is None:
                continue
            if prog.budget.exhausted():  # the checks so far took the report's budget
                p.status, p.checked = (
                    "unverified",
                    too_large(
                        prog.size, f"gradsan stopped checking after {prog.budget.spent():.0f} CPU-s"
                    ),
                )
                continue
            try:
                p.status, p.checked = verify_one(prog, f, p, others)  # type: ignore[assignment]
            except Exception as e:  # gradsan's own failure to check: say so, never crash
                p.status, p.checked = "unverified", f"gradsan could not run it ({type(e).__name__})"
        f.fixes.sort(key=lambda p: _RANK[p.status])
    try:
        if not prog.budget.exhausted():
            verify_together(prog, report)
    except Exception:  # gradsan's own failure: the fixes keep their single verdicts
        pass
    for f in todo:
        f.fixes.sort(key=lambda p: _RANK[p.status])
        f.suggestions = render_suggestions(f.fixes)


_RANK = {"verified": 0, "unverified": 1, "prose": 2, "failed": 3}


def same_nearby(prog: Any) -> int | None:
    """How many of the nearby points where the original program was finite give its outputs
    with the fix swapped in; None when one of them does not."""
    same = 0
    for pt, orig in zip(prog.nearby, prog.nearby_out):
        if orig is None or not _finite(orig):
            continue
        o, e = _run(prog.fun, pt, prog.kwargs)
        if e is not None or not _close(_leaves(o), orig, rtol=1e-3):
            return None
        same += 1
    return same
