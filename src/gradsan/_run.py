"""`gradsan run script.py [args...]`: run a script with gradsan's guard on every gradient.

The script runs as ``__main__`` (runpy) with ``sys.argv`` set. jax and torch are patched
lazily, by an import hook, only if the script imports them:

- **JAX**: functions made by ``jax.jit``, ``jax.grad`` and ``jax.value_and_grad`` *in the user's
  code* (not in libraries) are wrapped. Each eager call computes its outputs plus one fused
  finiteness flag (inside the same compiled program for ``jit``); calls made while tracing
  pass straight through. On the first non-finite output the same call is replayed through
  gradsan's interpreter (``gradsan.jax._explain.diagnose``).
- **PyTorch**: after every ``Tensor.backward()`` and ``torch.autograd.grad``, one fused check
  (``torch._foreach_norm``) of the ``.grad`` of the leaves the backward reached. The forward is
  gone by then, so by default gradsan **re-runs the script** in a child process with the checks
  off up to that backward call and the tracer on for that one step (the script must be
  deterministic: seed it). ``--trace`` instead traces every step from the start (slower, no
  re-run).

At the first non-finite gradient gradsan prints the report, writes ``gradsan-repro-<time>/``
(``inputs.npz`` or ``inputs.pt``, ``meta.json``, ``repro.py``) and exits with status 3.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.util
import json
import os
import runpy
import sys
import sysconfig
import time
from collections.abc import Callable
from typing import Any

EXIT_NONFINITE = 3

_GRADSAN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIB_DIRS = tuple(
    os.path.abspath(p) + os.sep
    for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    if p
)


def is_user_file(filename: str) -> bool:
    """Code the user wrote (a script, a test): not the standard library, not an installed
    package, not gradsan."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if path.startswith(_GRADSAN_DIR) or "site-packages" in path or "dist-packages" in path:
        return False
    return not path.startswith(_LIB_DIRS)


def _caller_is_user(depth: int = 2) -> bool:
    f = sys._getframe(depth)
    while f is not None and f.f_code.co_filename == __file__:  # the decorator form's lambda
        f = f.f_back
    return f is not None and is_user_file(f.f_code.co_filename)


def _user_frame_text(depth: int = 2) -> str:
    f = sys._getframe(depth)
    while f is not None and not is_user_file(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return ""
    return f"{os.path.relpath(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"


def _say(msg: str) -> None:
    print(f"gradsan: {msg}", file=sys.stderr, flush=True)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# -- what a failure carries ---------------------------------------------------------------------


@dataclasses.dataclass
class Failure:
    """The first non-finite gradient: the report plus what a reproducer needs."""

    backend: str
    report: Any
    call: int  # 1-based count of calls of this function (JAX) or of backward calls (torch)
    label: str  # "`train_step` (jax.jit)" / "loss.backward() at train.py:40 (main)"
    fun: Any = None  # JAX: the wrapped function, args, kwargs
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    kind: str = ""  # "jit", "grad", "value_and_grad"
    target: Any = None  # the function the user passed to jit/grad
    opts: dict = dataclasses.field(default_factory=dict)
    tensors: dict = dataclasses.field(default_factory=dict)  # torch: name -> (value, grad)
    traced: bool = True  # torch: False when the report only lists the non-finite gradients

    @property
    def header(self) -> str:
        if self.backend == "jax":
            return f"the {_ordinal(self.call)} call of {self.label} returned NaN/Inf."
        return f"the {_ordinal(self.call)} backward call, {self.label}, gave NaN/Inf gradients."


class Stop(BaseException):
    """Ends the script at the first non-finite gradient (a BaseException, like SystemExit,
    so the script's ``except Exception`` does not swallow it)."""

    def __init__(self, failure: Failure | None) -> None:
        super().__init__("gradsan stopped the script")
        self.failure = failure


# -- the hooks: lazy patches of jax and torch ---------------------------------------------------


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, after: Callable[[Any], None]) -> None:
        self.loader = loader
        self.after = after

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.after(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches jax / torch right after their first import, only if something imports them."""

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in ("jax", "torch") or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self.hooks.patch)
        return spec


class Hooks:
    """Installs the patches; ``on_failure(failure)`` decides what the first failure does
    (``gradsan run`` stops the script, the pytest plugin raises NonFiniteError)."""

    def __init__(
        self,
        on_failure: Callable[[Failure], None],
        *,
        trace_from: int | None = None,
        replay_step: int | None = None,
        sanitize: bool = False,
        on_kinks: Callable[[Any, str], None] | None = None,
    ) -> None:
        self.on_failure = on_failure
        self.enabled = True
        self.trace_from = trace_from  # torch: trace backward calls >= this one
        self.replay_step = replay_step  # torch: no checks before this call; stop after it
        self.sanitize = sanitize
        self.on_kinks = on_kinks
        self.finder = _Finder(self)
        self.undo: list[Callable[[], None]] = []
        self.patched: set[str] = set()
        self.torch_calls = 0
        self.in_backward = False
        self.session: Any = None
        self.sanitized: set[int] = set()

    def install(self) -> Hooks:
        sys.meta_path.insert(0, self.finder)
        for name in ("jax", "torch"):
            if name in sys.modules:
                self.patch(sys.modules[name])
        return self

    def uninstall(self) -> None:
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        self._end_session()
        while self.undo:
            self.undo.pop()()
        self.patched.clear()

    def patch(self, module: Any) -> None:
        name = module.__name__
        if name in self.patched:
            return
        self.patched.add(name)
        if name == "jax":
            _patch_jax(self, module)
        elif name == "torch":
            _patch_torch(self, module)

    def _set(self, obj: Any, attr: str, value: Any) -> None:
        old = getattr(obj, attr)
        setattr(obj, attr, value)
        self.undo.append(lambda: setattr(obj, attr, old))

    # -- torch tracing sessions (--trace, replays, --sanitize's first step) ---------------------
    def _wants_trace(self, call: int) -> bool:
        if self.sanitize and call == 1:
            return True
        return self.trace_from is not None and call >= self.trace_from

    def _begin_session(self, call: int) -> None:
        if self.session is not None or not self._wants_trace(call):
            return
        import gradsan.torch as gst

        kinks = self.sanitize and call == 1
        self.session = (gst.sanitize if kinks else gst.explain)()
        self.session.__enter__()

    def _end_session(self) -> Any:
        s, self.session = self.session, None
        if s is not None and s.tracer is not None:
            s.tracer.__exit__(None, None, None)
        return s


def _finish_session(session: Any, frame: Any) -> Any:
    """Name what the session saw after the module-level and the caller's variables."""
    import torch

    tracer, session.tracer = session.tracer, None
    tracer.__exit__(None, None, None)
    mods: list[tuple[Any, str]] = []
    scopes = [frame.f_locals] if frame is not None else []
    main = sys.modules.get("__main__")
    if main is not None:
        scopes.append(vars(main))
    for scope in scopes:
        for k, v in list(scope.items()):
            if isinstance(v, torch.nn.Module) and not k.startswith("_"):
                if all(v is not m for m, _ in mods):
                    mods.append((v, k))
        session.namer.add_locals(dict(scope))
    session.modules = mods + session.modules
    session.finish(tracer)
    return session.report


# -- JAX ----------------------------------------------------------------------------------------


def _has_tracer(tree: Any) -> bool:
    import jax

    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


class _GuardedJax:
    """A jitted / grad function that checks each eager call's outputs with one fused flag."""

    def __init__(
        self, hooks: Hooks, inner: Callable, kind: str, target: Callable, opts: dict
    ) -> None:
        self._hooks = hooks
        self._inner = inner
        self._kind = kind
        self._target = target
        self._opts = opts
        self._calls = 0
        self._fused: Any = False  # not built yet
        try:
            self.__wrapped__ = getattr(inner, "__wrapped__", target)
            for a in ("__name__", "__qualname__", "__doc__", "__module__"):
                v = getattr(inner, a, None) or getattr(target, a, None)
                if v is not None:
                    object.__setattr__(self, a, v)
        except (AttributeError, TypeError):  # pragma: no cover
            pass

    def __getattr__(self, name: str) -> Any:  # .lower, .trace, .eval_shape, _jit_info, ...
        return getattr(self._inner, name)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        import functools

        return functools.partial(self, obj)

    @property
    def label(self) -> str:
        name = getattr(self._target, "__qualname__", None) or getattr(self._target, "__name__", "?")
        return f"`{name}` (jax.{self._kind})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hooks = self._hooks
        if not hooks.enabled or _has_tracer((args, kwargs)):
            return self._inner(*args, **kwargs)
        from .jax._guard import _fused, _separate_flag

        self._calls += 1
        if self._fused is False:
            self._fused = _fused(self._inner, True) if self._kind == "jit" else None
        fused = self._fused
        if fused is not None:
            out, ok = fused(*args, **kwargs)
        else:
            out = self._inner(*args, **kwargs)
            ok = _separate_flag(out)
        if hooks.sanitize and id(self) not in hooks.sanitized:
            hooks.sanitized.add(id(self))
            _sanitize_jax(hooks, self, args, kwargs)
        if bool(ok):
            return out
        report = self._replay(args, kwargs, out, fused)
        __tracebackhide__ = True
        hooks.on_failure(
            Failure(
                backend="jax",
                report=report,
                call=self._calls,
                label=self.label,
                fun=self._inner,
                args=args,
                kwargs=kwargs,
                kind=self._kind,
                target=self._target,
                opts=self._opts,
            )
        )
        return out

    def _replay(self, args: tuple, kwargs: dict, out: Any, fused: Any) -> Any:
        from .jax._explain import diagnose

        n_eqns = _count_eqns(self._inner, args, kwargs)
        size = f" ({n_eqns} equations)" if n_eqns else ""
        _say(
            f"the {_ordinal(self._calls)} call of {self.label} returned NaN/Inf; "
            f"replaying it through the interpreter{size}..."
        )
        t0 = time.perf_counter()
        trace_fun = (lambda *a, **k: fused(*a, **k)[0]) if fused is not None else None
        report = diagnose(self._inner, args, kwargs, who="guard", outputs=out, trace_fun=trace_fun)
        _say(f"replay done in {time.perf_counter() - t0:.1f} s.")
        if not report.findings:
            report.notes.append(
                "the compiled function returned a non-finite value, but the replay through the "
                "interpreter stayed finite (XLA fusion can change rounding): run "
                "gradsan.jax.explain on the un-jitted function."
            )
        return report


def _count_eqns(fun: Callable, args: tuple, kwargs: dict) -> int:
    """The size of the program to replay, for the progress line (0 if unknown)."""
    try:
        import jax

        closed = jax.make_jaxpr(lambda *a, **k: fun(*a, **k))(*args, **kwargs)
    except Exception:
        return 0

    def count(jaxpr: Any) -> int:
        n = 0
        for e in jaxpr.eqns:
            n += 1
            for p in e.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    inner = getattr(sub, "jaxpr", None)
                    if inner is not None and hasattr(inner, "eqns"):
                        n += count(inner)
                    elif hasattr(sub, "eqns"):
                        n += count(sub)
        return n

    return count(closed.jaxpr)


def _sanitize_jax(hooks: Hooks, g: _GuardedJax, args: tuple, kwargs: dict) -> None:
    import gradsan.jax as gsj

    sanitize = getattr(gsj, "sanitize", None)
    if sanitize is None:
        _say("--sanitize: gradsan.jax.sanitize is not available in this version; skipped.")
        return
    try:
        report = sanitize(g._inner)(*args, **kwargs)
    except Exception as e:  # never let the optional kink scan break the run
        _say(f"--sanitize: could not scan {g.label} ({type(e).__name__}: {e}).")
        return
    report.findings = [f for f in report.findings if f.kind in ("kink", "convention")]
    if hooks.on_kinks is not None:
        hooks.on_kinks(report, f"first call of {g.label}")


def _patch_jax(hooks: Hooks, jax: Any) -> None:
    import functools

    orig = {n: getattr(jax, n) for n in ("jit", "grad", "value_and_grad")}

    def make(name: str) -> Callable:
        original = orig[name]

        @functools.wraps(original)
        def patched(*args: Any, **kwargs: Any) -> Any:
            if not args and "fun" not in kwargs:  # @jax.jit(static_argnums=...) as a decorator
                return lambda f: patched(f, **kwargs)
            inner = original(*args, **kwargs)
            if not _caller_is_user(2):
                return inner
            target = args[0] if args else kwargs.get("fun")
            if isinstance(target, _GuardedJax):  # jax.jit(jax.grad(f)): check the outer one
                target = target._inner
            opts = {k: v for k, v in kwargs.items() if _jsonable(v)}
            return _GuardedJax(hooks, inner, name, target, opts)

        return patched

    for n in orig:
        hooks._set(jax, n, make(n))


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


# -- PyTorch ------------------------------------------------------------------------------------


def _leaves_of(roots: list) -> list:
    """The leaf tensors (AccumulateGrad nodes) a backward from ``roots`` reaches."""
    seen: set[int] = set()
    stack = [t.grad_fn for t in roots if getattr(t, "grad_fn", None) is not None]
    leaves = [t for t in roots if getattr(t, "grad_fn", None) is None and t.requires_grad]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)
        if var is not None:
            leaves.append(var)
            continue
        stack.extend(f for f, _ in fn.next_functions)
    return leaves


def _patch_torch(hooks: Hooks, torch: Any) -> None:
    import functools

    from .torch._guard import _finite

    orig_backward = torch.Tensor.backward
    orig_grad = torch.autograd.grad
    if hooks.enabled:
        hooks._begin_session(1)

    def finish(call: int, frame: Any, leaves: list, grads: list, extra: list) -> None:
        from .torch import sanitize as torch_sanitize

        bad = not _finite(grads, extra)
        session, hooks.session = hooks.session, None
        report = None
        if session is not None:
            kinks_only = isinstance(session, torch_sanitize)
            if kinks_only or bad:
                report = _finish_session(session, frame)
                if kinks_only and not bad:
                    report.findings = [
                        f for f in report.findings if f.kind in ("kink", "convention")
                    ]
                    if hooks.on_kinks is not None:
                        hooks.on_kinks(report, "the first backward call")
                    report = None
            else:  # a healthy traced step: drop the trace
                session.tracer.__exit__(None, None, None)
                session.tracer = None
        if not bad:
            if hooks.replay_step is not None:
                raise Stop(None)  # the replayed step stayed finite
            hooks._begin_session(call + 1)
            return
        traced = report is not None and not report.ok
        if not traced:
            report = _torch_summary(leaves, grads, frame)
        __tracebackhide__ = True
        where = _user_frame_text(3)
        hooks.on_failure(
            Failure(
                backend="torch",
                report=report,
                call=call,
                label=f"at {where}" if where else "(unknown line)",
                tensors=_torch_tensors(leaves, frame),
                traced=traced,
            )
        )

    @functools.wraps(orig_backward)  # the tracer's TorchFunctionMode recognizes it by name
    def backward(
        self: Any,
        gradient: Any = None,
        retain_graph: Any = None,
        create_graph: bool = False,
        inputs: Any = None,
    ) -> None:
        __tracebackhide__ = True
        if not hooks.enabled or hooks.in_backward:  # re-entered through a TorchFunctionMode
            return orig_backward(self, gradient, retain_graph, create_graph, inputs)
        hooks.torch_calls += 1
        call = hooks.torch_calls
        checking = hooks.replay_step is None or call >= hooks.replay_step
        leaves = (
            (list(inputs) if isinstance(inputs, (list, tuple)) else [inputs])
            if inputs is not None
            else (_leaves_of([self]) if checking else [])
        )
        hooks.in_backward = True
        try:
            result = orig_backward(self, gradient, retain_graph, create_graph, inputs)
        finally:
            hooks.in_backward = False
        if not checking:
            hooks._begin_session(call + 1)
            return result
        grads = [p.grad for p in leaves if p.grad is not None and p.grad.is_floating_point()]
        loss = [self.detach()] if self.is_floating_point() and self.numel() <= 1 else []
        finish(call, sys._getframe(1), leaves, grads, loss)
        return result

    @functools.wraps(orig_grad)
    def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if not hooks.enabled or hooks.in_backward:
            return orig_grad(outputs, inputs, *args, **kwargs)
        hooks.in_backward = True
        try:
            result = orig_grad(outputs, inputs, *args, **kwargs)
        finally:
            hooks.in_backward = False
        hooks.torch_calls += 1
        call = hooks.torch_calls
        if hooks.replay_step is not None and call < hooks.replay_step:
            hooks._begin_session(call + 1)
            return result
        ins = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        grads = [g for g in result if g is not None and g.is_floating_point()]
        if not _finite(grads) and hooks.session is None:
            for p, g in zip(ins, result):  # name them like .grad's in the summary
                p._gradsan_grad = g
        finish(call, sys._getframe(1), ins, grads, [])
        return result

    hooks._set(torch.Tensor, "backward", backward)
    hooks._set(torch.autograd, "grad", grad)


def _torch_summary(leaves: list, grads: list, frame: Any) -> Any:
    from ._report import Finding, Report
    from .torch._explain import output_hit
    from .torch._mode import all_finite

    namer = _namer_for(frame)
    hits = []
    for p in leaves:
        g = p.grad if p.grad is not None else getattr(p, "_gradsan_grad", None)
        if g is not None and g.is_floating_point() and not all_finite(g):
            hits.append(output_hit(namer.name(p), g))
    report = Report(backend="torch", function="backward")
    report.findings.append(
        Finding(
            kind="nonfinite",
            catalog_id=None,
            phase="gradient",
            primitive="?",
            where=None,
            result="nan",
            outputs=hits,
        )
    )
    return report


def _namer_for(frame: Any) -> Any:
    import torch

    from .torch._explain import Namer

    namer = Namer()
    scopes = [frame.f_locals] if frame is not None else []
    main = sys.modules.get("__main__")
    if main is not None:
        scopes.append(vars(main))
    for scope in scopes:
        mods = [
            (v, k)
            for k, v in list(scope.items())
            if isinstance(v, torch.nn.Module) and not k.startswith("_")
        ]
        namer.add_modules(mods)
        namer.add_locals(dict(scope))
    return namer


def _torch_tensors(leaves: list, frame: Any) -> dict:
    namer = _namer_for(frame)
    out = {}
    for p in leaves:
        g = p.grad if p.grad is not None else getattr(p, "_gradsan_grad", None)
        out[namer.name(p)] = (p.detach().clone(), None if g is None else g.detach().clone())
    return out


# -- the reproducer -----------------------------------------------------------------------------


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
    from ._report._html import render_html

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
    arrays, statics = {}, {}
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
    obj = getattr(obj, "_inner", obj)  # a _GuardedJax (when run under gradsan run itself)
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

    with open(os.path.join(d, "structure.pkl"), "rb") as fh:
        structure = _Unpickler(fh).load()
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
        _say(str(e))
        return 2
    _say(f"re-running {meta['label']} on the saved inputs of its {_ordinal(meta['call'])} call")
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
    code = replay_torch(meta["script"], meta["argv"], meta["call"], result, cwd=meta.get("cwd"))
    failure = result.get("failure")
    if failure is None:
        _say("the re-run did not reproduce the non-finite gradient (is the script seeded?)")
        return 0 if code != EXIT_NONFINITE else code
    same = []
    for name, (v, _g) in failure.tensors.items():
        if name in saved:
            same.append(bool(torch.equal(saved[name]["value"], v)))
    if same:
        _say(f"{sum(same)} of {len(same)} saved tensors are bit-identical in the re-run.")
    print(failure.report)
    return EXIT_NONFINITE


# -- running a script ---------------------------------------------------------------------------


def _run_script(script: str, argv: list[str], hooks: Hooks) -> tuple[int, Failure | None]:
    old_argv, old_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    hooks.install()
    code = 0
    failure = None
    try:
        runpy.run_path(script, run_name="__main__")
    except Stop as s:
        failure = s.failure
        code = EXIT_NONFINITE if failure is not None else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    finally:
        hooks.uninstall()
        sys.argv = old_argv
        if sys.path and old_path0 is not None and sys.path[0] != old_path0:
            sys.path.pop(0)
    return code, failure


def replay_torch(
    script: str, argv: list[str], step: int, result: dict, cwd: str | None = None
) -> int:
    """Re-run ``script`` with checks off before backward call ``step`` and that call traced."""

    def on_failure(f: Failure) -> None:
        raise Stop(f)

    hooks = Hooks(on_failure, trace_from=step, replay_step=step)
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        code, failure = _run_script(script, argv, hooks)
    finally:
        os.chdir(old)
    result["failure"] = failure
    return code


def _replay_in_child(script: str, argv: list[str], step: int, workdir: str) -> Any:
    """The torch re-run, in a child process (a fresh interpreter: module state, RNG)."""
    import pickle
    import subprocess

    out = os.path.join(workdir, "replay.pkl")
    log = os.path.join(workdir, "replay.log")
    cmd = [
        sys.executable,
        "-m",
        "gradsan",
        "run",
        "--replay-step",
        str(step),
        "--replay-out",
        out,
        script,
        *argv,
    ]
    _say(
        f"re-running the script up to backward call {step} with the tracer on "
        "(the forward is gone after backward; --trace avoids the re-run)..."
    )
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
    _say(f"re-run done in {time.perf_counter() - t0:.1f} s.")
    try:
        with open(out, "rb") as fh:
            return pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def run(
    script: str,
    argv: list[str],
    *,
    trace: bool = False,
    sanitize: bool = False,
    json_path: str | None = None,
    repro_dir: str | None = None,
    replay_step: int | None = None,
    replay_out: str | None = None,
) -> int:
    """Run ``script`` under gradsan; the exit status is the script's, or 3 at a NaN/Inf."""
    if not os.path.isfile(script):
        _say(f"no such script: {script}")
        return 2
    reports: list[dict] = []

    def on_kinks(report: Any, where: str) -> None:
        if not report.findings:
            return
        _say(f"--sanitize: {len(report.findings)} kink(s) in {where}:")
        print(str(report), file=sys.stderr, flush=True)
        reports.append({"kind": "sanitize", "where": where, **json.loads(report.to_json())})

    def on_failure(f: Failure) -> None:
        raise Stop(f)

    if replay_step is not None:  # the child of a torch re-run
        hooks = Hooks(on_failure, trace_from=replay_step, replay_step=replay_step)
        code, failure = _run_script(script, argv, hooks)
        if replay_out:
            import pickle

            with open(replay_out, "wb") as fh:
                if failure is not None:
                    failure.report.outputs = None
                pickle.dump(failure and {"report": failure.report}, fh)
        return code

    hooks = Hooks(on_failure, trace_from=1 if trace else None, sanitize=sanitize, on_kinks=on_kinks)
    code, failure = _run_script(script, argv, hooks)
    if failure is not None:
        if failure.backend == "torch" and not failure.traced:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                got = _replay_in_child(script, argv, failure.call, tmp)
            if got and got.get("report") is not None:
                failure.report = got["report"]
            else:
                failure.report.notes.append(
                    "the re-run of the script did not reproduce the non-finite gradient (is it "
                    "seeded?); run it with `gradsan run --trace` to trace every step instead."
                )
        _say(failure.header)
        print(str(failure.report), file=sys.stderr, flush=True)
        d = write_repro(failure, script, argv, repro_dir)
        _say(f"reproducer written to {os.path.relpath(d)}/ (python {os.path.relpath(d)}/repro.py)")
        reports.append(
            {
                "kind": "nonfinite",
                "call": failure.call,
                "label": failure.label,
                "repro": d,
                **json.loads(failure.report.to_json()),
            }
        )
    if json_path:
        with open(json_path, "w") as fh:
            json.dump({"exit_code": code, "reports": reports}, fh, indent=2)
    return code


def add_run_parser(sub: Any) -> None:
    """The `gradsan run` subcommand (called from _cli.py)."""
    import argparse

    p = sub.add_parser(
        "run",
        help="run a Python script with gradsan's guard on every gradient",
        description="Run SCRIPT as __main__ with every JAX jit/grad and every PyTorch backward "
        "checked for NaN/Inf (one fused check per call). At the first non-finite gradient: "
        "print the explanation, write gradsan-repro-<time>/ and exit with status 3.",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="PyTorch: trace every step (slower) instead of re-running the script "
        "up to the failing step",
    )
    p.add_argument(
        "--sanitize",
        action="store_true",
        help="also report kinks (abs/relu at 0, ties) on the first call of each "
        "function, without stopping",
    )
    p.add_argument("--json", metavar="FILE", help="write the reports as JSON to FILE")
    p.add_argument(
        "--repro-dir",
        metavar="DIR",
        help="where to write the reproducer (default gradsan-repro-<time>/)",
    )
    p.add_argument("--replay-step", type=int, metavar="N", help=argparse.SUPPRESS)
    p.add_argument("--replay-out", metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(
        fn=lambda a: run(
            a.script,
            a.args,
            trace=a.trace,
            sanitize=a.sanitize,
            json_path=a.json,
            repro_dir=a.repro_dir,
            replay_step=a.replay_step,
            replay_out=a.replay_out,
        )
    )
