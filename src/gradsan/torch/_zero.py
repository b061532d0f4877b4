"""The zero's side of a PyTorch NaN: what made the zero factor of ``0 * inf`` exactly zero.

The tracer keeps, for every tensor with an exact zero that an observed operation produced
(forward: a torch function; backward: an aten op inside an autograd Node), a small record: the
operation, its Tag (the user's frame) and the keys of its tensor inputs that hold zeros. From
the poison's zero operand :func:`zero_source` walks those records back to where the zero was
born, describing each operation as a :class:`gradsan._blame.ZeroStep`; the classification is
:func:`gradsan._blame.classify_zero`, shared with JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from .. import _blame as B
from .._blame import ZeroSource, ZeroStep

# autograd Nodes whose gradient is 0 where their forward did not read or select an element
_SELECTS = ("WhereBackward", "MaskedFillBackward", "MaskedScatterBackward", "NanToNumBackward")
_DROPS = (
    "SliceBackward",
    "SelectBackward",
    "IndexBackward",
    "GatherBackward",
    "NarrowBackward",
    "AsStridedBackward",
    "SplitBackward",
    "SplitWithSizesBackward",
    "UnbindBackward",
    "IndexSelectBackward",
    "TakeBackward",
    "MaskedSelectBackward",
    "DiagonalBackward",
    "TrilBackward",
    "TriuBackward",
)
# Nodes whose backward multiplies the gradient by a forward operand (a quotient's gradient
# for its denominator reads the numerator): the zero is followed into that operand
_PRODUCTS = (
    "MulBackward",
    "MmBackward",
    "BmmBackward",
    "MatmulBackward",
    "AddmmBackward",
    "DivBackward",
)
_PASS_NODES = (
    "ExpandBackward",
    "ViewBackward",
    "ReshapeAliasBackward",
    "UnsafeViewBackward",
    "SumBackward",
    "MeanBackward",
    "PermuteBackward",
    "TransposeBackward",
    "TBackward",
    "SqueezeBackward",
    "UnsqueezeBackward",
    "CloneBackward",
    "ToCopyBackward",
    "AddBackward",
    "SubBackward",
    "NegBackward",
    "CatBackward",
    "StackBackward",
)
_CREATE = {
    "zeros",
    "zeros_like",
    "new_zeros",
    "full",
    "full_like",
    "new_full",
    "tensor",
    "as_tensor",
    "from_numpy",
    "scalar_tensor",
    "empty",
    "empty_like",
    "fill_",
    "zero_",
    "fill",
    "masked_fill",
    "eye",
    "ones",
    "ones_like",
    "arange",
    "linspace",
    "tril",
    "triu",
}
_MULS = ("mul", "__mul__", "__rmul__", "multiply")
# products and quotients whose zero result from nonzero finite operands is a rounding to 0
_ROUNDS = (
    "mul",
    "__mul__",
    "__rmul__",
    "multiply",
    "div",
    "__truediv__",
    "true_divide",
    "divide",
    "pow",
    "__pow__",
)
_EXP = {"exp", "exp2", "sigmoid", "softmax", "expm1", "aten.exp", "aten.sigmoid"}


def has_zero(t: Any) -> bool:
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return False
    if t._is_zerotensor():  # an exact zero with no storage to read (a double backward's)
        return True
    if t.is_meta:  # a shape, no values
        return False
    if t.layout == torch.strided and t.device.type in ("cpu", "cuda"):
        try:  # one kernel and no mask: the tracer asks this of every op's output
            return int(torch.count_nonzero(t)) < t.numel()
        except (RuntimeError, TypeError, NotImplementedError):
            pass
    if t.dtype == torch.bool:
        return bool((~t).any())
    try:
        return bool((t == 0).any())
    except (RuntimeError, TypeError):
        return False


_REAL = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def screen(t: torch.Tensor) -> tuple[bool, bool | None]:
    """``(is_float(t) and has_zero(t), nonfinite(t) if is_float(t) else None)`` of an op's
    output (the tracer asks both of every op), with the type checks made once: on a plain real
    float tensor on CPU/CUDA, one count_nonzero and one sum."""
    from ._mode import is_float, nonfinite

    if (
        type(t) is torch.Tensor
        and t.dtype in _REAL
        and t.layout == torch.strided
        and t.device.type in ("cpu", "cuda")
        and not t._is_zerotensor()
    ):
        n = t.numel()
        if n == 0:
            return False, None
        try:
            zero = int(torch.count_nonzero(t)) < n
        except (RuntimeError, TypeError, NotImplementedError):
            zero = has_zero(t)
        s = t.sum().item()
        return zero, (None if math.isfinite(s) else nonfinite(t))
    if not is_float(t):
        return False, None
    return has_zero(t), nonfinite(t)


@dataclasses.dataclass(eq=False)
class ZeroRec:
    """An observed operation whose output holds an exact zero."""

    op: str  # torch function (forward) or aten op (backward) name
    tag: Any  # the Tag of the autograd Node (backward) or of the torch function (forward)
    node: str  # the Node's name (backward), "" forward
    zero_inputs: list  # keys of its tensor inputs that hold a zero
    from_bool: bool = False  # a float made from a boolean or integer tensor
    nonfinite_in: bool = False  # an input held an inf (exp(-inf) = 0)
    backward: bool = False
    # a Python number 0 (or a 0-d wrapped number) among the operands: `y * 0.0`, whose zero
    # is a constant the program wrote, not a rounding
    literal_zero: bool = False


def _frame(rec: ZeroRec) -> Any:
    return rec.tag.frame if rec.tag is not None else None


def _library(rec: ZeroRec) -> str | None:
    tag = rec.tag
    if tag is None:
        return None
    return tag.library or tag.qualname or tag.name


_LITERAL: Any = object()  # the zeros an autograd Node writes itself
_NUMBER: Any = object()  # a Python number 0 an operation read (`y * 0.0`)


class _Walk:
    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.leaf: Any = None  # the leaf tensor the zero's way ended at

    def __call__(self, k: Any) -> tuple[ZeroStep, Any]:
        tr = self.tracer
        if k is _LITERAL:
            return ZeroStep(B.LITERAL, op="literal", backward=True), None
        if k is _NUMBER:
            return ZeroStep(B.LITERAL, op="literal"), None
        rec: ZeroRec | None = tr.zero_bwd.get(k)
        if rec is None:
            rec = tr.zero_fwd.get(k)
        if rec is None:  # a tensor no observed operation made: an input, or a constant (a mask)
            if k in tr.leaf_keys():
                self.leaf = next(
                    (v for v in tr.leaves.values() if isinstance(v, torch.Tensor) and _key(v) == k),
                    None,
                )
                ref = id(self.leaf) if self.leaf is not None else None
                return ZeroStep(B.INPUT, op="input", text="", ref=ref), None
            return ZeroStep(B.CONST, op="constant"), None
        step = dict(frame=_frame(rec), op=rec.op, library=_library(rec), backward=rec.backward)
        nxt = rec.zero_inputs[0] if rec.zero_inputs else None
        if rec.backward:
            node = rec.node
            # the zeros a where or a slice's backward writes where it did not select or read
            if node.startswith(_SELECTS):
                return ZeroStep(B.SELECT, **step), _LITERAL
            if node.startswith(_DROPS):
                return ZeroStep(B.DROP, **step), _LITERAL
            if nxt is None:
                return self._born(rec, step)
            fwd = nxt not in tr.zero_bwd
            if fwd and not node.startswith(_PRODUCTS) and not node.startswith(_PASS_NODES):
                frec = tr.zero_fwd.get(nxt)
                if frec is not None and frec.op in _EXP and not frec.zero_inputs:
                    # exp's derivative is its value, which underflowed (or is exp(-inf))
                    fstep = dict(frame=_frame(frec), op=frec.op, library=_library(frec))
                    return self._birth(frec, fstep), None
                # a derivative formula that reads a forward value that is 0 (2 * x for x ** 2)
                return ZeroStep(B.DERIVATIVE, **step), None
            if node.startswith(_PRODUCTS):
                return ZeroStep(B.MUL, **step), nxt
            return ZeroStep(B.PASS, **step), nxt
        # forward
        name = rec.op
        if name == "where":
            return ZeroStep(B.SELECT, **step), nxt
        if nxt is None:
            return self._born(rec, step)
        if name in ("mul", "__mul__", "__rmul__", "multiply", "mm", "matmul", "__matmul__"):
            return ZeroStep(B.MUL, **step), nxt
        if name in ("pow", "__pow__", "__rpow__", "float_power"):
            return ZeroStep(B.VALUE, **step), None
        return ZeroStep(B.PASS, **step), nxt

    def _born(self, rec: ZeroRec, step: dict) -> tuple[ZeroStep, Any]:
        """The step where the zero was born; a product with a number 0 is followed to it."""
        s = self._birth(rec, step)
        return s, (_NUMBER if s.role == B.MUL else None)

    @staticmethod
    def _birth(rec: ZeroRec, step: dict) -> ZeroStep:
        name = rec.op.split(".")[-1] if rec.backward else rec.op
        if rec.from_bool:
            return ZeroStep(B.BOOL, **step)
        if rec.op in _EXP or name in _EXP:
            if rec.nonfinite_in:
                return ZeroStep(B.BY_DESIGN, value="-inf", **step)
            return ZeroStep(B.UNDERFLOW, **step)
        if name in _CREATE or name.rstrip("_") in _CREATE:
            return ZeroStep(B.LITERAL, **step)
        if name in _ROUNDS:
            if rec.literal_zero:  # a number 0 of the program among the operands: no rounding
                return ZeroStep(B.MUL if name in _MULS else B.VALUE, **step)
            if rec.nonfinite_in:  # x / inf, inf ** -1: exactly 0 from an infinite operand
                return ZeroStep(B.VALUE, **step)
            # every operand nonzero and finite, the result 0: it rounded to 0
            return ZeroStep(B.UNDERFLOW, **step)
        if name in ("sub", "__sub__", "__rsub__", "add", "__add__", "rsub"):
            return ZeroStep(B.CANCEL, **step)
        if rec.backward:
            return ZeroStep(B.LITERAL, **step)
        return ZeroStep(B.VALUE, **step)


def zero_source(
    tracer: Any, zero_key: Any, poison_node: Any, forward_tag: Any = None, other: Any = None
) -> ZeroSource | None:
    """What made the tensor ``zero_key`` (the poison's zero operand) exactly zero. The poison
    is a backward aten op in ``poison_node``, or a forward product with ``forward_tag`` whose
    other (non-finite) operand is the tensor ``other``."""
    from ._mode import _tag_of

    walk = _Walk(tracer)
    path = B.follow_zero(zero_key, walk)
    if path and path[-1].role == B.INPUT and walk.leaf is not None:
        # a leaf the non-finite side was not computed from: a mask passed as an argument
        start = poison_node if poison_node is not None else getattr(other, "grad_fn", None)
        if (other is not None or poison_node is not None) and not _reaches(start, walk.leaf):
            path[-1] = dataclasses.replace(path[-1], independent=True)
    if forward_tag is not None:
        first = ZeroStep(B.MUL, frame=forward_tag.frame, op=forward_tag.name)
        path = [first, *path]
    if poison_node is not None:
        tag = _tag_of(poison_node)
        nm = poison_node.name()
        if nm.startswith(_PRODUCTS) or "Backward" in nm:
            first = ZeroStep(
                B.MUL if nm.startswith(_PRODUCTS) else B.PASS,
                frame=tag.frame if tag is not None else None,
                op=nm,
                backward=True,
            )
            path = [first, *path]
    return B.classify_zero(path)


def _key(t: Any) -> Any:
    from ._mode import key

    return key(t)


def _reaches(node: Any, leaf: Any, limit: int = 20000) -> bool:
    """Whether the autograd graph from ``node`` reaches the leaf tensor ``leaf`` (the forward
    value was computed from it). A walk cut after ``limit`` Nodes answers True."""
    stack = [node] if node is not None else []
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if len(seen) > limit:
            return True
        if getattr(n, "variable", None) is leaf:
            return True
        stack.extend(m for m, _ in n.next_functions if m is not None)
    return False


def zero_literal(forward_tag: Any) -> ZeroSource | None:
    """A Python number 0 that a forward product on the user's line multiplies by."""
    frame = forward_tag.frame if forward_tag is not None else None
    op = forward_tag.name if forward_tag is not None else ""
    return B.classify_zero([ZeroStep(B.MUL, frame=frame, op=op), ZeroStep(B.LITERAL, op="literal")])


def record_forward(tracer: Any, name: str, tag: Any, args: tuple, kwargs: dict, outs: list) -> None:
    """Keep a ZeroRec for each float output of a torch function that holds an exact zero."""
    from ._mode import is_float, key, nonfinite, tensors_in

    ins = [a for a in list(tensors_in(args)) + list(tensors_in(kwargs))]
    for t in outs:
        if not is_float(t) or not has_zero(t):
            continue
        from_bool = any(not is_float(a) for a in ins) and not any(is_float(a) for a in ins)
        # made from booleans or integers (one-hot labels, a mask): the zero is born here; an
        # exp-like op's zero is never its input's (exp(0) = 1): it underflowed, or exp(-inf)
        zin = (
            [] if from_bool or name in _EXP else [key(a) for a in ins if a is not t and has_zero(a)]
        )
        inf_in = any(is_float(a) and nonfinite(a) is not None for a in ins)
        tracer.zero_fwd[key(t)] = ZeroRec(
            name, tag, "", zin, from_bool, inf_in, False, _number_zero(args, kwargs)
        )


def record_backward(tracer: Any, name: str, node: Any, args: tuple, kwargs: dict, o: Any) -> None:
    """Keep a ZeroRec for a backward aten op's output that holds an exact zero."""
    from ._mode import _tag_of, is_float, key, tensors_in

    if not has_zero(o):
        return
    ins = [a for a in tensors_in(args) if a is not o]
    if not name.endswith("_") and any(key(a) == key(o) for a in ins):
        return  # a view with its input's very layout (a saved tensor's detach): no new zero
    zin = [key(a) for a in ins if has_zero(a)]
    from_bool = bool(ins) and not any(is_float(a) for a in ins)
    inf_in = any(is_float(a) and bool(torch.isinf(a).any()) for a in ins if a.numel() < 1 << 22)
    nm = node.name() if node is not None else ""
    lit = _number_zero(args, kwargs)
    tracer.zero_bwd[key(o)] = ZeroRec(name, _tag_of(node), nm, zin, from_bool, inf_in, True, lit)


def _number_zero(args: tuple, kwargs: dict) -> bool:
    """A Python number 0 among an operation's arguments (`y * 0.0`; the scalar a MulBackward
    multiplies the incoming gradient by), or a 0-d tensor torch wrapped one in."""
    for a in (*args, *kwargs.values()):
        if type(a) in (int, float) and a == 0:
            return True
        if isinstance(a, torch.Tensor) and a.dim() == 0 and _wrapped(a) and a.item() == 0:
            return True
    return False


def _wrapped(t: torch.Tensor) -> bool:
    """A 0-d tensor torch made from a Python number (aten.mul.Tensor(x, 0.0) in a backward)."""
    try:
        return bool(torch._C._is_wrapped_number(t))  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return False
