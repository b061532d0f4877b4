"""The tracer: one TorchFunctionMode (forward: tag each autograd Node with the user's frame) and
one TorchDispatchMode (backward: see each aten op and the Node it belongs to), and the graph of
non-finite values they saw, which gradsan/_blame.py walks.

Only non-finite tensors are kept alive. Tensors are keyed by identity
``(data_ptr, shape, stride, dtype)``, which survives the ``detach`` that AccumulateGrad does.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch

from .._blame import Blame
from .._report import Frame
from .._userfile import is_user_file
from . import _compat, _rules
from ._born import born_of_masks
from ._compat import TorchDispatchMode, TorchFunctionMode
from ._half import backward_overflow
from ._source import frame_of, user_frame, user_frame_object
from ._zero import (
    has_zero,
    record_backward,
    record_forward,
    screen,
    zero_literal,
    zero_source,
)

Key = tuple
_FUNCTION_PY = os.path.join("torch", "autograd", "function.py")
_NO_DEST: Any = object()
# torch's AccumulateGrad Node type (the other C++ Nodes are named "...Backward0" and such)
ACCUMULATE: Any = getattr(getattr(torch._C, "_functions", None), "AccumulateGrad", None)
_OVERWRITE = {"copy_", "fill_", "zero_", "resize_", "set_", "normal_", "uniform_", "random_"}


def key(t: torch.Tensor) -> Key:
    """The identity of a tensor's values: survives ``detach`` and re-wrapping. A tensor without
    storage (a torch.func wrapper) is identified by the object itself."""
    try:
        ptr = t.data_ptr()
    except RuntimeError:
        return ("object", id(t))
    return (ptr, t.shape, t.stride(), t.dtype, t.device)


def is_float(t: torch.Tensor) -> bool:
    """A float tensor whose values can be read: not a ZeroTensor (the storage-less exact zero
    a double backward makes, e.g. abs's second derivative; reading it in a dispatch mode
    crashes torch), nor a meta tensor (torch's shape arithmetic for such zeros)."""
    return (t.is_floating_point() or t.is_complex()) and not (t._is_zerotensor() or t.is_meta)


def tensors_in(x: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)) and depth < 2:
        for v in x:
            yield from tensors_in(v, depth + 1)
    elif isinstance(x, dict) and depth < 2:
        for v in x.values():
            yield from tensors_in(v, depth + 1)


def nonfinite(t: torch.Tensor) -> bool | None:
    """None if every element of ``t`` is finite; else whether ``t`` holds a NaN.

    One reduction is the fast path: a finite sum proves every element finite (an Inf or a NaN
    anywhere makes the sum non-finite). Only when the sum is not finite (a NaN/Inf, or a sum
    that overflowed) does the exact check run: a sum of +-inf rules out NaNs, a NaN sum asks
    ``isnan`` first.
    """
    if t.is_complex():
        if t.numel() == 0 or bool(torch.isfinite(t.sum())):
            return None
        if bool(torch.isnan(t).any()):
            return True
        return False if bool(torch.isinf(t).any()) else None
    if not t.is_floating_point() or t.numel() == 0 or t._is_zerotensor() or t.is_meta:
        return None
    s = t.sum().item()
    if math.isfinite(s):
        return None
    if s == s and not bool(torch.isinf(t).any()):  # +-inf sum: no NaN; overflow if no inf
        return None
    if s != s:
        if bool(torch.isnan(t).any()):
            return True
        if not bool(torch.isinf(t).any()):  # the sum overflowed to inf - inf
            return None
    return False


def all_finite(t: torch.Tensor) -> bool:
    return nonfinite(t) is None


@dataclasses.dataclass(eq=False)
class Tag:
    """What gradsan knows about an autograd Node from the forward pass."""

    name: str  # torch function name ("sqrt", "__truediv__") or Node name for inner nodes
    op: str | None  # canonical catalog op
    frame: Frame | None
    library: str | None = None
    operands: tuple = ()
    params: dict = dataclasses.field(default_factory=dict)
    module: Any = None  # weakref to the innermost nn.Module running
    qualname: str = ""  # "torch.nn.functional.normalize"


@dataclasses.dataclass(eq=False)
class External:
    """A non-finite tensor that no observed operation produced: an input of the function."""

    tensor: torch.Tensor
    source: Any = None  # the tensor ``tensor`` is a copy of (an in-place op's destination)


@dataclasses.dataclass(eq=False)
class Event:
    """An operation whose output is non-finite."""

    phase: str  # "forward" | "backward"
    op: str  # "aten.div" (backward) or torch function name (forward)
    tag: Tag | None
    node: Any  # the autograd Node (backward) or None
    out: torch.Tensor
    inputs: list  # [(tensor, producer)] for the non-finite inputs; producer: Event | External
    nan_new: bool = False  # produced a NaN although no input held a NaN
    nan: bool = True  # ``out`` holds a NaN (else only +-inf)
    form: str | None = None
    zero_from: Frame | None = None
    index: tuple | None = None
    # an inf the user wrote on purpose (masked_fill(mask, -inf)): not the problem by itself;
    # the NaN is born where two such infinities meet (softmax of a fully masked row)
    intentional: bool = False
    # born here from intentional infs only: singular there by the catalog (torch/_born.py)
    born: bool = False
    overflow: Any = None  # a backward op's float16-overflow hit (torch/_half.py)
    zero_src: Any = None  # what made the zero exact (gradsan._blame.ZeroSource)
    values: tuple | None = None  # a poison's two operand values at its first NaN


def _std_params(args: tuple, kwargs: dict) -> dict:
    """dim and correction of a torch.std/var call (``std(x, dim, unbiased, keepdim)``,
    ``std(x, unbiased)``, ``std(x, dim, correction=, keepdim=)``), in the catalog's keys."""
    a = list(args[1:])
    dim = kwargs.get("dim")
    unbiased = kwargs.get("unbiased")
    keepdim = kwargs.get("keepdim", False)
    if a and isinstance(a[0], bool):
        unbiased = a.pop(0)
    elif a:
        dim = a.pop(0)
        if a and isinstance(a[0], bool):
            unbiased = a.pop(0)
        if a and isinstance(a[0], bool):
            keepdim = a.pop(0)
    correction = kwargs.get("correction")
    if correction is None:
        correction = 0 if unbiased is False else 1
    if isinstance(dim, list):
        dim = tuple(dim)
    return {"dim": dim, "correction": float(correction), "keepdims": bool(keepdim)}


def _values_at(args: tuple, shape: Any, idx: tuple) -> tuple | None:
    """The two tensor operands' values at ``idx`` (None unless there are exactly two, and
    unless they are a zero and a non-finite value: a contraction's (bmm's) operands at the
    output's index are not the pair that met)."""
    ops = [a for a in args if isinstance(a, torch.Tensor) and is_float(a)]
    if len(ops) != 2:
        return None
    try:
        vals = tuple(
            torch.broadcast_to(a, shape)[idx].item() if idx else a.flatten()[0].item() for a in ops
        )
    except (RuntimeError, ValueError, IndexError):
        return None
    if not (0.0 in vals and any(math.isinf(v) or math.isnan(v) for v in vals)):
        return None
    return vals


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    nz = mask.nonzero()
    return tuple(int(i) for i in nz[0]) if len(nz) else ()


_PRODUCTS = {
    "mul",
    "mm",
    "bmm",
    "addmm",
    "mv",
    "matmul",
    "dot",
    "baddbmm",
    "addcmul",
    "einsum",
    "linear",
    "addmv",
    "_foreach_mul",
    "prod",
    "conv",
    "convolution",
}
_SUMS = {"add", "sub", "sum", "rsub", "cumsum", "mean", "addcdiv", "lerp"}


class Tracer:
    """Records events in forward and backward; see explain/sanitize/nansafe."""

    # called before each function call (None: nothing to read first); torch/_sanitize.py's
    # tracer reads an in-place kink call's operand before the call overwrites it
    pre_call: Any = None

    def __init__(self, *, kinks: bool = False) -> None:
        self.kinks = kinks
        self.events: dict[Key, Event] = {}
        self.fwd: dict[Key, Event] = {}
        self.owner: dict[Key, Any] = {}  # backward output -> Node that computed it
        self.leaves: dict[int, torch.Tensor] = {}
        self.roots: list[tuple[Any, str]] = []  # observed root modules (module, name)
        self.module_stack: list[Any] = []
        self.losses: list[torch.Tensor] = []
        self.kink_hits: list[tuple[Tag, str, Any]] = []
        self.bool_strict: dict[Key, tuple[weakref.ref, torch.Tensor | None]] = {}
        self.backward_calls = 0
        self.sz: Any = None  # nansafe: (tracer, name, args, kwargs, out) -> {edge: mask}
        self.before_backward: Any = None  # nansafe: called with the roots of each backward
        self.caller = None
        probe = torch.zeros(1, requires_grad=True) * 1.0
        self.seq0 = probe.grad_fn._sequence_nr() if probe.grad_fn is not None else 0
        self._fmode = _FunctionMode(self)
        self._dmode_on = False
        self._hooks: list[Any] = []
        self._blame: Blame[Event | External, Event | External] = Blame(_Dataflow())
        # the zero's side (torch/_zero.py): tensors with exact zeros that observed ops made
        self.zero_fwd: dict[Key, Any] = {}
        self.external_keys: set[Key] = set()  # non-finite tensors that came in from outside
        self.meetings: dict[int, Event] = {}  # origin id -> where its NaN met a zero (0 * nan)
        self.zero_bwd: dict[Key, Any] = {}
        # custom autograd.Functions: the user's line of each ``apply`` (see _note_apply_site)
        self.apply_sites: dict[int, tuple[weakref.ref, Frame]] = {}
        self.apply_sites_by_cls: dict[Any, Frame] = {}
        self._blame_stamp: tuple[int, int] = (-1, -1)

    # -- lifetime -----------------------------------------------------------------------------
    def __enter__(self) -> Tracer:
        import torch.nn.modules.module as mm

        self._hooks = [
            mm.register_module_forward_pre_hook(self._pre_module),
            mm.register_module_forward_hook(self._post_module),
        ]
        self._fmode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._fmode.__exit__(*exc)
        finally:
            for h in self._hooks:
                h.remove()
            self._hooks = []

    def run_backward(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run a ``backward``/``autograd.grad`` call under the dispatch mode. The mode is on
        only here: the forward pass has no autograd Node to attribute ops to, and a dispatch
        mode would cost a Python call per forward op."""
        self.on_backward_call(args[0] if args else kwargs.get("tensors"))
        if self._dmode_on:
            return func(*args, **kwargs)
        self._dmode_on = True
        try:
            with dispatch_mode(self):  # chosen now: torch._dynamo may have been imported
                return func(*args, **kwargs)
        finally:
            self._dmode_on = False

    def leaf_keys(self) -> set[Key]:
        """The keys of the leaves (parameters, inputs that require grad) seen so far."""
        return {key(v) for v in self.leaves.values() if isinstance(v, torch.Tensor)}

    # -- modules --------------------------------------------------------------------------------
    def _pre_module(self, module: Any, args: Any) -> None:
        if not self.module_stack and all(m is not module for m, _ in self.roots):
            name = "model"
            f = user_frame_object(2)
            if f is not None:
                for k, v in f.f_locals.items():
                    if v is module and not k.startswith("_"):
                        name = k
                        break
            self.roots.append((module, name))
        self.module_stack.append(module)

    def _post_module(self, module: Any, args: Any, out: Any) -> None:
        if self.module_stack and self.module_stack[-1] is module:
            self.module_stack.pop()

    # -- forward --------------------------------------------------------------------------------
    def on_function(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        outs = [out] if type(out) is torch.Tensor else [t for t in tensors_in(out)]
        if not outs:
            return
        if not torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args
        ):  # perhaps inside a custom autograd.Function's forward: where was it applied?
            self._note_apply_site()
        op = _rules.canonical(name)
        tag: Tag | None = None
        for t in outs:
            gf = t.grad_fn
            if gf is not None:
                md: dict = gf.metadata  # type: ignore[assignment]  # a dict; stubs say a method
                if "gradsan" not in md:
                    if tag is None:
                        tag = self._make_tag(func, name, op, args, kwargs)
                    md["gradsan"] = tag
                    if self.sz is not None:
                        edges = self.sz(self, name, args, kwargs, t)
                        if edges:
                            md["gradsan_sz"] = edges
                    self._tag_inner(gf, tag)
        if self.kinks and _rules.is_kink_call(name, op):
            if tag is None:
                tag = self._make_tag(func, name, op, args, kwargs)
            self.kink_hits.append((tag, name, _rules.operands_for(name, args, kwargs)))
        if name in _rules.COMPARISONS or name in _rules.BOOL_COMBINE:
            self._record_bool(name, args, outs)
        screens = [screen(t) for t in outs]  # (has a zero, nonfinite) of each output
        if any(z for z, _ in screens):
            if tag is None:
                tag = self._make_tag(func, name, op, args, kwargs)
            record_forward(self, name, tag, args, kwargs, outs)
        for t, (_, nan) in zip(outs, screens):
            if nan is not None:
                if tag is None:
                    tag = self._make_tag(func, name, op, args, kwargs)
                self._forward_event(name, tag, t, nan, args, kwargs)

    def _note_apply_site(self) -> None:
        """Inside a custom autograd.Function's forward (its ``apply`` is on the stack): keep
        the user's line that called ``apply``, by the ctx (which becomes the output's Node)
        and by the Function class. Dispatch modes do not see ``apply`` itself."""
        f: FrameType | None = sys._getframe(2)
        child: FrameType | None = None
        for _ in range(40):
            if f is None:
                return
            code = f.f_code
            if code.co_name == "apply" and code.co_filename.endswith(_FUNCTION_PY):
                break
            child, f = f, f.f_back
        else:
            return
        if f is None:
            return
        cls = f.f_locals.get("cls")
        caller = f.f_back
        while caller is not None and not is_user_file(caller.f_code.co_filename):
            caller = caller.f_back
        if caller is None or cls is None:
            return
        site = frame_of(caller)
        self.apply_sites_by_cls[cls] = site
        if child is not None and child.f_code.co_argcount:
            ctx = child.f_locals.get(child.f_code.co_varnames[0])
            if ctx is not None and not isinstance(ctx, torch.Tensor):
                self.apply_sites[id(ctx)] = (weakref.ref(ctx), site)

    def apply_site(self, node: Any, fcls: Any) -> Frame | None:
        """The user's line that applied the custom Function whose backward Node is ``node``."""
        got = self.apply_sites.get(id(node))
        if got is not None and got[0]() is node:
            return got[1]
        return self.apply_sites_by_cls.get(fcls)

    def _make_tag(self, func: Any, name: str, op: str | None, args: tuple, kwargs: dict) -> Tag:
        operands: tuple = ()
        params: dict = {}
        if op is not None:
            ops, params = _rules.operands_for(name, args, kwargs)
            operands = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in ops)
            if name.endswith("_") and not name.endswith("__"):  # in-place: values are gone
                operands = ()
            if op in ("std", "var"):  # the reduced dims and torch's correction (default 1)
                params = {**params, **_std_params(args, kwargs)}
        mod = weakref.ref(self.module_stack[-1]) if self.module_stack else None
        return Tag(name, op, user_frame(3), None, operands, params, mod, _qualname(func, name))

    def _tag_inner(self, gf: Any, outer: Tag) -> None:
        """Tag the Nodes a library function created inside itself with the caller's frame."""
        stack = [n for n, _ in gf.next_functions if n is not None]
        lib: str | None = None  # the library's name, made when a Node needs it
        while stack:
            n = stack.pop()
            cls = type(n)
            if cls is ACCUMULATE or (
                (cls.__module__ != "builtins" or ACCUMULATE is None)
                and n.name().endswith("AccumulateGrad")
            ):
                v = n.variable
                self.leaves.setdefault(id(v), v)
                continue
            md = n.metadata
            if "gradsan" in md:
                continue
            nm = n.name()
            try:
                if n._sequence_nr() < self.seq0:
                    continue
            except (AttributeError, RuntimeError):
                pass
            op, operands, params = _rules.node_operands(n)
            fcls = getattr(n, "_forward_cls", None)
            if fcls is not None:  # a custom autograd.Function: named by its class, at apply
                md["gradsan"] = Tag(
                    f"{fcls.__name__} (custom autograd.Function)",
                    None,
                    self.apply_site(n, fcls) or outer.frame,
                    None,
                    (),
                    {},
                    outer.module,
                    fcls.__qualname__,
                )
            else:
                if lib is None:
                    lib = _library_name(outer)
                md["gradsan"] = Tag(nm, op, outer.frame, lib, tuple(operands), params, outer.module)
            stack.extend(m for m, _ in n.next_functions if m is not None)

    def _forward_event(
        self, name: str, tag: Tag, t: torch.Tensor, nan: bool, args: tuple, kwargs: dict
    ) -> None:
        inputs = []
        nan_in = False
        for a in list(tensors_in(args)) + list(tensors_in(kwargs)):
            if not is_float(a):
                continue
            a_nan = nonfinite(a)
            if a_nan is not None:
                ka = key(a)
                prod = self.fwd.get(ka)
                if prod is None:
                    self.external_keys.add(ka)
                inputs.append((a, prod or External(a)))
                nan_in = nan_in or a_nan
        ev = Event("forward", name, tag, None, t, inputs, nan=nan)
        if not nan_in:
            ev.nan_new = nan
            if nan and inputs:
                self._indeterminate_forward(ev, name, args, kwargs)
        if (
            not inputs
            and not nan
            and any(_inf_literal(v) for v in list(args) + list(kwargs.values()))
        ):
            ev.intentional = True
        elif inputs and not nan and all(_constant_mask(a, p) for a, p in inputs):
            # -inf from a constant tensor built before the step (torch.tensor(numpy_array),
            # torch.full, a saved mask): an intentional mask, not the problem by itself
            ev.born = born_of_masks(tag)  # unless this op is singular there (logsumexp)
            ev.intentional = not ev.born
        self.fwd[key(t)] = ev

    def _record_bool(self, name: str, args: tuple, outs: list) -> None:
        """For `where`: which elements of a comparison hold with a strict margin."""
        t = outs[0]
        if t.dtype != torch.bool:
            return
        strict: torch.Tensor | None
        if name in _rules.COMPARISONS:
            a = args[0] if args else None
            b = args[1] if len(args) > 1 else None
            try:
                strict = torch.as_tensor(a) != torch.as_tensor(b)
                strict = torch.broadcast_to(strict, t.shape)
            except (RuntimeError, TypeError):
                strict = None
            if not any(is_float(v) and v.requires_grad for v in tensors_in((a, b))):
                # integer labels, constants: no boundary that a gradient sees (sanitize)
                strict = torch.ones(t.shape, dtype=torch.bool)
        else:
            strict = torch.ones(t.shape, dtype=torch.bool)
            for a in tensors_in(args):
                if a.dtype == torch.bool:
                    s = self.strict_of(a)
                    strict = strict & (torch.broadcast_to(s, t.shape) if s is not None else False)
        self.bool_strict[key(t)] = (weakref.ref(t), strict)

    def strict_of(self, cond: torch.Tensor) -> torch.Tensor | None:
        """Elements where `cond` holds with a strict margin; all of them for a boolean that no
        observed comparison produced (a constant mask)."""
        hit = self.bool_strict.get(key(cond))
        if hit is None or hit[0]() is not cond:
            return torch.ones(cond.shape, dtype=torch.bool)
        return hit[1]

    def on_backward_call(self, tensors: Any) -> None:
        self.backward_calls += 1
        roots = list(tensors_in(tensors))
        self.losses.extend(roots)
        if self.before_backward is not None:
            self.before_backward(roots)

    # -- backward -------------------------------------------------------------------------------
    def on_aten(
        self, func: Any, node: Any, args: tuple, kwargs: dict, out: Any, dest: Any = _NO_DEST
    ) -> None:
        """``dest``: for an in-place op, the destination's (clone, producer, has NaN) before the
        op, or None when the op overwrites it without reading it (copy_, fill_)."""
        if type(out) is torch.Tensor or isinstance(out, torch.Tensor):
            if not is_float(out):
                return
            outs: Any = (out,)
        else:
            outs = [t for t in tensors_in(out) if is_float(t)]
        events = self.events
        owner = self.owner
        for o in outs:
            k = (o.data_ptr(), o.shape, o.stride(), o.dtype, o.device)
            owner[k] = node
            nan = nonfinite(o)
            if nan is None:
                if events:
                    events.pop(k, None)  # an in-place op may have made it finite
                record_backward(self, _aten_name(func), node, args, kwargs, o)
                continue
            inputs = []
            has_nan_in = False
            srcs = [a for a in args if isinstance(a, torch.Tensor)]
            if len(srcs) != len(args):
                srcs = list(tensors_in(args))
            if kwargs:
                srcs += tensors_in({n: v for n, v in kwargs.items() if n != "out"})
            if dest is not _NO_DEST and srcs:
                srcs = srcs[1:]
                if dest is not None:
                    inputs.append(dest[:2])
                    has_nan_in = dest[2]
            for a in srcs:
                if not is_float(a):
                    continue
                ka = (a.data_ptr(), a.shape, a.stride(), a.dtype, a.device)
                prod = events.get(ka)
                if prod is not None:  # a non-finite output of an earlier op: no need to look
                    inputs.append((a, prod))
                    has_nan_in = has_nan_in or prod.nan
                    continue
                a_nan = nonfinite(a)
                if a_nan is None:
                    continue
                inputs.append(
                    (
                        a,
                        self.fwd.get(ka)
                        or _cast_source(self, a, node)
                        or self._saved(a, ka, a_nan, node),
                    )
                )
                has_nan_in = has_nan_in or a_nan
            name = _aten_name(func)
            ev = Event("backward", name, _tag_of(node), node, o, inputs, nan=nan)
            if not inputs and not nan:  # inf from finite operands: a half-precision overflow?
                ev.overflow = backward_overflow(name, args, o)
            if nan and not has_nan_in:
                ev.nan_new = True
                self._indeterminate(ev, name, args, node)
            elif nan:
                self._nan_meets_zero(ev, args, node)
            events[k] = ev

    def _nan_meets_zero(self, ev: Event, args: tuple, node: Any) -> None:
        """A NaN that an exact zero did not stop (``0 * nan``: the gradient a where or a slice
        sent to a NaN branch): kept for the NaN's origin, once, as its poison."""
        nan_in = [p for _, p in ev.inputs if isinstance(p, Event) and p.nan]
        if not nan_in:
            return
        idx = _first_index(torch.isnan(ev.out))
        for a in args:
            if not isinstance(a, torch.Tensor) or not is_float(a) or not has_zero(a):
                continue
            try:
                v = torch.broadcast_to(a, ev.out.shape)[idx].item() if idx else a.flatten()[0]
            except (RuntimeError, ValueError, IndexError):
                continue
            if v != 0:
                continue
            zsrc = zero_source(self, key(a), None)
            if zsrc is None or zsrc.kind.value not in (
                "where",
                "slice",
                "mask",
                "input-mask",
                "nan-to-num",
            ):
                continue
            for root, _ in self.origins(nan_in[0]):
                if isinstance(root, Event) and id(root) not in self.meetings:
                    meet = Event("backward", ev.op, ev.tag, node, ev.out, [], form="0*nan")
                    meet.zero_src, meet.zero_from, meet.index = zsrc, zsrc.frame, idx
                    meet.values = _values_at(args, ev.out.shape, idx)
                    self.meetings[id(root)] = meet
            return

    def _indeterminate_forward(self, ev: Event, name: str, args: tuple, kwargs: dict) -> None:
        """A forward op that made a NaN from an inf and a zero (``labels * log(p)``): its form
        and what made the zero."""
        base = name.strip("_").removeprefix("r")
        # the two operands, a Python number among them (``torch.log(p) * 0.0``)
        ops = [
            a
            for a in args[:2]
            if (isinstance(a, torch.Tensor) and is_float(a))
            or (isinstance(a, (int, float)) and not isinstance(a, bool))
        ]
        if len(ops) != 2 or not any(isinstance(a, torch.Tensor) for a in ops):
            return
        nan = torch.isnan(ev.out)
        idx = _first_index(nan)
        ev.index = idx
        zero_i = None
        try:
            vals = [
                torch.broadcast_to(a, ev.out.shape)[idx].item()
                if isinstance(a, torch.Tensor)
                else float(a)
                for a in ops
            ]
        except (RuntimeError, ValueError, IndexError):
            return
        if base in ("mul", "multiply", "matmul", "mm", "bmm", "einsum", "dot") or base.startswith(
            "mul"
        ):
            ev.form = "0*inf"
            zero_i = next((i for i, v in enumerate(vals) if v == 0), None)
            if base.startswith("mul") and zero_i is not None:
                ev.values = tuple(vals)
        elif base.startswith(("div", "truediv", "true_divide")):
            if vals[0] == 0 and vals[1] == 0:
                ev.form, zero_i = "0/0", 0
                ev.values = tuple(vals)
        elif base.startswith(("add", "sub")) and all(math.isinf(v) for v in vals):
            ev.form, ev.values = "inf-inf", tuple(vals)
        if zero_i is not None and not isinstance(ops[zero_i], torch.Tensor):
            # a Python number of the user's line: a constant of the program
            ev.zero_src = zero_literal(ev.tag)
            ev.zero_from = ev.tag.frame if ev.tag is not None else None
        elif zero_i is not None:
            zt = ops[zero_i]
            assert isinstance(zt, torch.Tensor)
            ev.zero_src = zero_source(self, key(zt), None, ev.tag, other=ops[1 - zero_i])
            if ev.zero_src is not None:
                ev.zero_from = ev.zero_src.frame

    def _saved(self, a: torch.Tensor, ka: Key, nan: bool, node: Any) -> Event | External:
        """A non-finite tensor a backward Node read that no observed function returned: an
        input of the function, or a value made inside a library function (the reciprocal in
        ``1.0 / x``), which was born at the forward op of the Node that saved it."""
        tag = _tag_of(node)
        if a.grad_fn is not None:  # an intermediate a library made: born at its own op
            tag = _tag_of(a.grad_fn) or tag
        elif a.requires_grad:  # a leaf: an input or a parameter
            return External(a)
        if ka in self.external_keys or tag is None:
            return External(a)
        if any(key(v) == ka for v in self.leaves.values() if isinstance(v, torch.Tensor)):
            return External(a)
        ev = Event("forward", tag.name, tag, None, a, [], nan=nan, nan_new=nan)
        self.fwd[ka] = ev
        return ev

    def _indeterminate(self, ev: Event, name: str, args: tuple, node: Any) -> None:
        """Name the indeterminate form of a new NaN and where its zero came from."""
        base = name.split(".")[-1].lstrip("_")
        nan = torch.isnan(ev.out)
        idx = _first_index(nan)
        ev.index = idx
        ops = [a for a in args if isinstance(a, torch.Tensor) and is_float(a)]
        vals: list[float | None] = []
        for a in ops:
            try:
                vals.append(torch.broadcast_to(a, ev.out.shape)[idx].item() if idx else a.item())
            except (RuntimeError, ValueError):
                vals.append(None)
        zero_i = None
        num, den = (vals + [None, None])[:2]
        pair = len(vals) == 2 and num is not None and den is not None
        if base.startswith("div") and num is not None and den is not None:
            if num == 0 and den == 0:
                ev.form, zero_i = "0/0", 0
                ev.values = (num, den) if pair else None
            elif math.isinf(num) and math.isinf(den):
                ev.form = "inf/inf"
                ev.values = (num, den) if pair else None
            else:
                ev.form = "0*inf"
                zero_i = 0 if num == 0 else None
        elif any(base.startswith(p) for p in _PRODUCTS):
            ev.form = "0*inf"
            for i, v in enumerate(vals):
                if v == 0:
                    zero_i = i
                    break
            if base.startswith("mul") and pair and zero_i is not None:
                ev.values = (num, den)
        elif any(base.startswith(p) for p in _SUMS):
            ev.form = "inf-inf"
        if zero_i is not None and zero_i < len(ops):
            ev.zero_src = zero_source(self, key(ops[zero_i]), node)
            src = self.owner.get(key(ops[zero_i]))
            if src is not None and src is not node:
                tag = _tag_of(src)
                ev.zero_from = tag.frame if tag else None
            elif src is None:
                # the zero was saved in the forward pass: the node's own op used it
                tag = _tag_of(node)
                ev.zero_from = tag.frame if tag else None
            if ev.zero_src is not None and ev.zero_src.frame is not None:
                ev.zero_from = ev.zero_src.frame

    # -- blame ------------------------------------------------------------------------------------
    def producer_of(self, t: torch.Tensor) -> Event | External | None:
        k = key(t)
        return self.events.get(k) or self.fwd.get(k)

    def origins(
        self, start: Event | External
    ) -> list[tuple[Event | External, Event | External | None]]:
        """(origin, poison) pairs of a non-finite value: see gradsan/_blame.py. The memo is
        kept until the tracer records another event."""
        stamp = (len(self.events), len(self.fwd))
        if self._blame_stamp != stamp:
            self._blame.clear()
            self._blame_stamp = stamp
        return self._blame.origins(start)


class _Dataflow:
    """The tracer's events as the node protocol of gradsan/_blame.py."""

    @staticmethod
    def key(v: Event | External) -> int:
        return id(v)

    @staticmethod
    def children(v: Event | External) -> list[Event | External]:
        # the last input first, as a depth-first walk from the output meets them; a NaN that
        # came in (not made here) is followed along its NaN inputs only, like JAX's blame: an
        # inf it also read (a -inf mask) did not make it
        if isinstance(v, External):
            return []
        ins = [p for _, p in reversed(v.inputs)]
        if v.nan and not v.nan_new:
            nan_ins = [p for p in ins if _holds_nan(p)]
            return nan_ins or ins
        return ins

    @staticmethod
    def is_poison(v: Event | External) -> bool:
        return isinstance(v, Event) and (v.nan_new or v.born)

    @staticmethod
    def is_intentional(r: Event | External) -> bool:
        if isinstance(r, External):  # a constant -inf mask built before the step
            return _constant_mask(r.tensor, None)
        return r.intentional

    @staticmethod
    def record(v: Event | External) -> Event | External:
        return v


def _inf_literal(v: Any, depth: int = 0) -> bool:
    """``v`` is an infinite Python float, or a (nested) list or tuple holding one: the -inf
    of ``torch.tensor([[0.0, float("-inf")]])``, a mask the user wrote out."""
    if isinstance(v, float):
        return math.isinf(v)
    if isinstance(v, (list, tuple)) and depth < 8:
        return any(_inf_literal(x, depth + 1) for x in v)
    return False


def _holds_nan(p: Event | External) -> bool:
    if isinstance(p, Event):
        return p.nan
    t = p.tensor
    return is_float(t) and bool(torch.isnan(t).any())


def _constant_mask(t: torch.Tensor, producer: Any) -> bool:
    """``t`` is an intentional -inf mask: a constant tensor (no gradient, made by no observed
    operation, or by an intentional one) whose non-finite entries are all -inf."""
    if isinstance(producer, Event):
        return producer.intentional
    if t.requires_grad or not t.is_floating_point():
        return False
    bad = ~torch.isfinite(t)
    return bool(bad.any()) and bool((t[bad] == float("-inf")).all())


def _library_name(outer: Tag) -> str:
    """What names the Nodes a library function made inside itself."""
    mod = outer.module() if outer.module is not None else None
    if mod is not None and type(mod).__module__.startswith("torch.nn."):
        # inside a torch.nn module's forward: named by the module the user called
        return f"nn.{type(mod).__name__}"
    return outer.qualname or outer.name


def _tag_of(node: Any) -> Tag | None:
    try:
        return node.metadata.get("gradsan")
    except (AttributeError, RuntimeError):
        return None


_ATEN_NAMES: dict[Any, str] = {}


def _aten_name(func: Any) -> str:
    name = _ATEN_NAMES.get(func)
    if name is None:
        s = str(func)  # "aten.div.Tensor"
        parts = s.split(".")
        name = _ATEN_NAMES[func] = ".".join(parts[:2]) if len(parts) >= 2 else s
    return name


_QUALNAMES: dict[tuple[Any, str], str] = {}


def _qualname(func: Any, name: str) -> str:
    try:
        got = _QUALNAMES.get((func, name))
    except TypeError:  # an unhashable callable
        return _qualname_of(func, name)
    if got is None:
        got = _qualname_of(func, name)
        if len(_QUALNAMES) < 4096:  # torch's functions, a bounded set
            _QUALNAMES[(func, name)] = got
    return got


def _qualname_of(func: Any, name: str) -> str:
    mod = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", name)
    if qual.startswith(("TensorBase.", "_TensorBase.")):
        return "Tensor." + name
    if mod.startswith("torch") and "." not in qual:
        return f"{mod.replace('torch._C._VariableFunctions', 'torch')}.{qual}"
    if qual.startswith("_VariableFunctionsClass."):
        return "torch." + name
    return f"{mod}.{qual}" if mod else qual


_PASS = {
    "__get__",
    "__set__",
    "__repr__",
    "__format__",
    "__str__",
    "size",
    "dim",
    "numel",
    "__len__",
    "item",
    "tolist",
    "__bool__",
    "__index__",
    "__int__",
    "__float__",
    "data_ptr",
    "stride",
    "is_floating_point",
    "element_size",
    "__hash__",
    "register_hook",
    "requires_grad_",
    "retain_grad",
    "storage_offset",
    "is_contiguous",
    "numpy",
    "__iter__",
    "untyped_storage",
    "_is_view",
    "__reduce_ex__",
    "__deepcopy__",
    "__setstate__",
}
_BACKWARD = {"backward", "grad"}


class _FunctionMode(TorchFunctionMode):
    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _rules.func_name(func)
        if name in _PASS:
            return func(*args, **kwargs)
        if name in _BACKWARD and getattr(func, "__module__", "") in (
            "torch._tensor",
            "torch.autograd",
            "torch.autograd.__init__",
        ):
            return self.tracer.run_backward(func, args, kwargs)
        pre = self.tracer.pre_call  # sanitize: an in-place kink call's operand, before it
        if pre is not None:
            pre(name, args, kwargs)
        out = func(*args, **kwargs)
        self.tracer.on_function(func, name, args, kwargs, out)
        return out


_INPLACE: dict[Any, int] = {}  # aten op -> 0 functional, 1 overwrites args[0], 2 updates it


def _inplace_kind(func: Any) -> int:
    kind = _INPLACE.get(func)
    if kind is None:
        base = func.__name__.split(".")[0] if hasattr(func, "__name__") else ""
        kind = 0 if not base.endswith("_") else 1 if base in _OVERWRITE else 2
        _INPLACE[func] = kind
    return kind


class _DispatchMode(TorchDispatchMode):
    """Sees every aten op of the backward pass and the Node running it."""

    def __init__(self, tracer: Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        node = _current_node()
        if node is None:
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        dest: Any = _NO_DEST
        kind = _INPLACE.get(func)
        if kind is None:
            kind = _inplace_kind(func)
        if kind and args and isinstance(args[0], torch.Tensor):
            dest = None
            if kind == 2:
                with _compat.disable_torch_function():
                    d = args[0]
                    nan = nonfinite(d) if is_float(d) else None
                    if nan is not None:
                        dest = (
                            d.clone(),
                            self.tracer.producer_of(d) or External(d.clone(), d),
                            nan,
                        )
        out = func(*args, **kwargs)
        with _compat.disable_torch_function():
            self.tracer.on_aten(func, node, args, kwargs, out, dest)
        return out


class _DispatchModeNoDynamo(_DispatchMode):
    """The same mode without torch's per-call ``torch._dynamo.disable`` wrapper (whose first
    call imports torch._dynamo: seconds). Used while torch._dynamo is not imported, when
    nothing can be compiled anyway."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    __torch_dispatch__ = _DispatchMode.__dict__["__torch_dispatch__"].__wrapped__  # type: ignore[attr-defined]


def dispatch_mode(tracer: Tracer) -> _DispatchMode:

    if _compat.dynamo_loaded():
        return _DispatchMode(tracer)
    return _DispatchModeNoDynamo(tracer)


_current_node = _compat.current_autograd_node


def _cast_source(tracer: Tracer, a: torch.Tensor, node: Any) -> Any:
    """autocast's casts, which the tracer does not see: gradsan.torch._amp."""
    from ._amp import cast_source

    return cast_source(tracer, a, node)
