"""`gradsan run`'s PyTorch patch: after every ``Tensor.backward()`` and ``torch.autograd.grad``,
one fused check (``torch._foreach_norm``) of the gradients of the leaves the backward reached.
When a tracing session is open (``--trace``, a replay, ``--sanitize``'s first step) a failure
comes with the explanation; otherwise with the list of non-finite gradients.
"""

from __future__ import annotations

import functools
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._userfile import is_user_file
from ._failure import Failure, Stop, short_path

if TYPE_CHECKING:
    from ._hooks import Hooks


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


def _user_frame_text(depth: int = 2) -> str:
    f: FrameType | None = sys._getframe(depth)
    while f is not None and not is_user_file(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return ""
    return f"{short_path(f.f_code.co_filename)}:{f.f_lineno} ({f.f_code.co_name})"


def _user_frame() -> FrameType | None:
    f: FrameType | None = sys._getframe(2)
    while f is not None and not is_user_file(f.f_code.co_filename):
        f = f.f_back
    return f


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


def patch_torch(hooks: Hooks, torch: Any) -> None:
    """Check the gradients after every ``Tensor.backward`` and ``torch.autograd.grad`` (undone
    by hooks.uninstall)."""
    from ..torch._accum import RunAccum
    from ..torch._amp import RunWatch
    from ..torch._compat import compiling, in_functorch
    from ..torch._distributed import RunDist, real_leaves
    from ..torch._func import RunCheck
    from ..torch._guard import finite
    from ..torch._spawn import patch_spawn

    amp = RunWatch(hooks).install()  # gradsan.torch._amp: GradScaler steps decide their own
    RunDist(hooks).install()  # gradsan.torch._distributed: DDP ranks, checked before all-reduce
    accum = RunAccum(hooks).install()  # gradsan.torch._accum: names the micro-batch
    patch_spawn(hooks, torch)  # gradsan.torch._spawn: torch.multiprocessing.spawn's workers
    orig_backward = torch.Tensor.backward
    orig_grad = torch.autograd.grad
    # gradsan.torch._func: torch.func's results; installed before any session's own wrappers
    # (a session restores what it wrapped when it ends)
    funcs = RunCheck(lambda pairs, api: func_grads(pairs, api)).install(hooks.undo.append)
    if hooks.enabled:
        hooks.begin_session(1)

    def finish(
        call: int, frame: Any, leaves: list, grads: list, extra: list, api: str = ""
    ) -> None:
        from ..torch import sanitize as torch_sanitize

        bad = not finite(grads, extra)
        if bad and amp.deferred(call, leaves, extra):  # a GradScaler step: its scaler decides
            bad = False
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
            hooks.begin_session(call + 1)
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
                label=(f"at {where}" if where else "(unknown line)")
                + (f", in {api}" if api else ""),
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
        if not hooks.enabled or hooks.in_backward or compiling():  # re-entered, or compiling
            return orig_backward(self, gradient, retain_graph, create_graph, inputs)
        hooks.torch_calls += 1
        call = hooks.torch_calls
        checking = hooks.replay_step is None or call >= hooks.replay_step
        leaves = (
            (list(inputs) if isinstance(inputs, (list, tuple)) else [inputs])
            if inputs is not None
            else (_leaves_of([self]) if checking else [])
        )
        leaves = real_leaves(leaves)  # gradsan.torch._distributed: FSDP2's sharded parameters
        hooks.in_backward = True
        try:
            result = orig_backward(self, gradient, retain_graph, create_graph, inputs)
        finally:
            hooks.in_backward = False
        if not checking:
            hooks.begin_session(call + 1)
            return result
        grads = [p.grad for p in leaves if p.grad is not None and p.grad.is_floating_point()]
        loss = [self.detach()] if self.is_floating_point() and self.numel() <= 1 else []
        finish(call, sys._getframe(1), leaves, grads, loss)
        return result

    @functools.wraps(orig_grad)
    def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if not hooks.enabled or hooks.in_backward or compiling() or in_functorch() or funcs.depth:
            return orig_grad(outputs, inputs, *args, **kwargs)  # (torch.func's: checked there)
        hooks.in_backward = True
        try:
            result = orig_grad(outputs, inputs, *args, **kwargs)
        finally:
            hooks.in_backward = False
        hooks.torch_calls += 1
        call = hooks.torch_calls
        if hooks.replay_step is not None and call < hooks.replay_step:
            hooks.begin_session(call + 1)
            return result
        ins = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        grads = [g for g in result if g is not None and g.is_floating_point()]
        if not finite(grads) and hooks.session is None:
            for p, g in zip(ins, result):  # name them like .grad's in the summary
                p._gradsan_grad = g
        finish(call, sys._getframe(1), ins, grads, [])
        return result

    def func_grads(pairs: list, api: str) -> None:
        """torch.func's gradients (gradsan.torch._func.RunCheck), checked like ``.grad``."""
        __tracebackhide__ = True
        if not hooks.enabled or hooks.in_backward or compiling():
            return
        hooks.torch_calls += 1
        call = hooks.torch_calls
        accum.not_accumulated()
        if hooks.replay_step is not None and call < hooks.replay_step:
            hooks.begin_session(call + 1)
            return
        transforms = getattr(getattr(hooks.session, "tracer", None), "transforms", None)
        if transforms is not None:  # the open session's report names them after their argument
            seen = {id(g) for _, g, _ in transforms.grads}
            transforms.grads += [(a, g, api) for a, g in pairs if id(g) not in seen]
        grads = [g for _, g in pairs if g.is_floating_point()]
        leaves = []
        if not finite(grads):  # name them like .grad's in the summary
            for a, g in pairs:
                if not isinstance(a, torch.Tensor):  # vmap's outputs: no argument to name
                    a = g.new_zeros(()).expand(g.shape)
                a._gradsan_grad = g
                leaves.append(a)
        finish(call, _user_frame(), leaves, grads, [], api)

    orig_compile = torch.compile

    @functools.wraps(orig_compile)
    def compile(*args: Any, **kwargs: Any) -> Any:
        # a tracing session opened before the script imported torch._dynamo runs what is
        # compiled from now on as its eager twin (the tracer sees every operation)
        out = orig_compile(*args, **kwargs)
        session = hooks.session
        ensure = getattr(getattr(session, "tracer", None), "ensure_eager", None)
        if ensure is not None:
            ensure()
        return out

    hooks.set(torch.Tensor, "backward", backward)
    hooks.set(torch.autograd, "grad", grad)
    hooks.set(torch, "compile", compile)


def _torch_summary(leaves: list, grads: list, frame: Any) -> Any:
    from ..torch._explain import output_hit
    from ..torch._guard import failure_report
    from ..torch._mode import all_finite

    namer = _namer_for(frame)
    hits = []
    for p in leaves:
        g = p.grad if p.grad is not None else getattr(p, "_gradsan_grad", None)
        if g is not None and g.is_floating_point() and not all_finite(g):
            hits.append(output_hit(namer.name(p), g))
    return failure_report("backward", hits, [])


def _namer_for(frame: Any) -> Any:
    import torch

    from ..torch._explain import Namer

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
