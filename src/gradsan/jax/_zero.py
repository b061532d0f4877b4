"""The zero's side of a JAX NaN: what made the zero factor of ``0 * inf`` exactly zero.

explain's Provenance keeps, at every equation whose output holds exact zeros, the zero masks of
its outputs and inputs (and select_n's chosen case): :func:`record_zeros`. From the poison's
zero operand, :func:`zero_source` walks back along the dataflow, one element at a time, to the
operation where that zero was born, describing each operation as a
:class:`gradsan._blame.ZeroStep`; :func:`gradsan._blame.classify_zero` (shared with torch)
names the kind of zero and the line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import _blame as B
from .._blame import ZeroSource, ZeroStep
from .._report._format import format_value

# a mask larger than this is not kept: the zero is followed without its position
_MAX_MASK = 1 << 24

# operations that carry a zero through without making one
_PLUMBING = {
    "broadcast_in_dim",
    "reshape",
    "squeeze",
    "expand_dims",
    "transpose",
    "convert_element_type",
    "copy",
    "copy_p",
    "neg",
    "reduce_sum",
    "reduce_max",
    "reduce_min",
    "concatenate",
    "slice",
    "dynamic_slice",
    "gather",
    "rev",
    "add_any",
    "add",
    "sub",
    "real",
    "imag",
    "reduce_precision",
    "cumsum",
    "select_and_gather_add",
    "pjit",
    "jit",
}
# the transposes of slicing and indexing: elements that were not read get 0
_DROPS = {
    "pad",
    "scatter-add",
    "scatter_add",
    "scatter",
    "dynamic_update_slice",
    "select_and_scatter_add",
}
_EXP_LIKE = {"exp", "exp2", "logistic", "expm1"}
_PRODUCTS = {"mul", "dot_general", "conv_general_dilated"}
_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin"}


def zero_mask(x: Any) -> np.ndarray | None:
    """Where ``x`` is exactly zero (False for a boolean: a False is a zero of a mask), or None
    when it holds no zero. A huge value gives a scalar True: zeros, position not kept."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        if isinstance(x, (int, float, complex, bool, np.number)):
            return np.asarray(x == 0) if x == 0 else None
        return None
    try:
        a = np.asarray(x)
    except Exception:  # a value numpy cannot read (a key, a token)
        return None
    if _kind(a.dtype) not in ("f", "c", "i", "u", "b"):
        return None
    with np.errstate(all="ignore"):
        m = ~a if a.dtype.kind == "b" else a == 0
    if not m.any():
        return None
    if m.size > _MAX_MASK:
        return np.asarray(True)
    return m


def record_zeros(node: Any, invals: list, outvals: list) -> None:
    """Keep the zero masks of ``node`` when one of its float outputs holds an exact zero, and
    its inputs' when an output is non-finite (a NaN that met a zero: ``0 * nan``)."""
    if any(node.status) and node.prim in _PRODUCTS:
        node.zin = tuple(zero_mask(v) for v in invals)
    zs: list[np.ndarray | None] = []
    any_zero = False
    for o in outvals:
        if _kind(getattr(o, "dtype", None)) not in ("f", "c"):
            zs.append(None)
            continue
        z = zero_mask(o)
        any_zero = any_zero or z is not None
        zs.append(z)
    if not any_zero:
        return
    node.zout = tuple(zs)
    node.zin = tuple(zero_mask(v) for v in invals)
    if node.prim == "select_n" and invals:
        c = np.asarray(invals[0])
        node.choice = c.astype(np.int32) if c.size <= _MAX_MASK else None


def _kind(dt: Any) -> str:
    """numpy's kind letter of a dtype, "" for None or a dtype numpy cannot read (PRNG keys)."""
    if dt is None:
        return ""
    try:
        return np.dtype(dt).kind
    except TypeError:
        return ""


def _shape(m: np.ndarray | None) -> tuple | None:
    return None if m is None else tuple(np.shape(m))


def _at(mask: np.ndarray | None, idx: tuple | None) -> bool:
    """Whether ``mask`` is zero at ``idx`` (anywhere, when the position is unknown)."""
    if mask is None:
        return False
    if idx is None or mask.ndim != len(idx):
        return bool(np.any(mask))
    try:
        return bool(mask[idx])
    except IndexError:
        return bool(np.any(mask))


def _in_index(node: Any, k: int, j: int, idx: tuple | None) -> tuple | None:
    """The element of input ``j`` that output ``k``'s element ``idx`` was computed from, where
    the operation says it (elementwise, broadcast, reshape, transpose, reductions)."""
    if idx is None or node.zout is None or node.zin is None:
        return None
    out_shape = _shape(node.zout[k])
    in_mask = node.zin[j] if j < len(node.zin) else None
    in_shape = _shape(in_mask)
    if in_shape is None:
        # no zero in that input: its shape does not matter, the element is not a zero
        return idx
    if out_shape is None or len(idx) != len(out_shape):
        return None
    if in_shape == out_shape:
        return idx
    if in_shape == ():
        return ()
    prim = node.prim
    params = node.eqn.params if node.eqn is not None else {}
    try:
        if prim == "broadcast_in_dim":
            dims = params["broadcast_dimensions"]
            return tuple(0 if in_shape[i] == 1 else idx[d] for i, d in enumerate(dims))
        if prim in ("reshape", "squeeze", "expand_dims"):
            flat = np.ravel_multi_index(idx, out_shape)
            return tuple(int(i) for i in np.unravel_index(flat, in_shape))
        if prim == "transpose":
            perm = params["permutation"]
            r = [0] * len(perm)
            for i, p in enumerate(perm):
                r[p] = idx[i]
            return tuple(r)
        if prim in _REDUCTIONS and in_mask is not None:
            axes = tuple(params.get("axes", ()))
            free = iter(idx)
            sel: list[Any] = [
                slice(None) if d in axes else next(free) for d in range(len(in_shape))
            ]
            sub = np.asarray(in_mask)[tuple(sel)]
            hits = np.argwhere(sub)
            if not len(hits):
                return None
            first = iter(int(i) for i in hits[0])
            return tuple(next(first) if d in axes else sel[d] for d in range(len(in_shape)))
    except (KeyError, ValueError, IndexError, StopIteration, TypeError):
        return None
    return None


def _pad_index(node: Any, idx: tuple | None) -> tuple | None:
    """pad: the operand's element at ``idx``, or None when ``idx`` is padding."""
    if idx is None or node.zin is None:
        return None
    cfg = node.eqn.params.get("padding_config", ())
    in_shape = _shape(node.zin[0])
    if in_shape is None or len(cfg) != len(idx) or len(in_shape) != len(idx):
        return None
    r = []
    for (lo, _hi, interior), i, n in zip(cfg, idx, in_shape):
        p = i - lo
        if p < 0 or p % (interior + 1):
            return None
        p //= interior + 1
        if p >= n:
            return None
        r.append(p)
    return tuple(r)


class _Walk:
    """One step of the zero's way back: a Src and an element index -> a ZeroStep and the next."""

    def __init__(self, is_rule_eqn: Any) -> None:
        self.is_rule_eqn = is_rule_eqn  # node -> bool: a derivative rule's equation
        self.input: Any = None  # the input node the zero's way ended at

    def __call__(self, h: tuple) -> tuple[ZeroStep, tuple | None]:
        src, idx = h
        if src is None:  # a value with no history: a constant of the program
            return ZeroStep(B.LITERAL), None
        node, k = src
        if node.kind == "input":
            self.input = node
            return ZeroStep(B.INPUT, op="input", text=node.label), None
        if node.kind == "const":
            return ZeroStep(B.CONST, op="constant", text=node.label), None
        if node.kind == "literal":
            return ZeroStep(B.LITERAL, op="literal"), None
        if node.kind == "stack":
            ins = [s for s in node.ins if s is not None]
            nxt = ins[0] if ins else None
            return ZeroStep(B.PASS, op="stack"), (nxt, idx[1:] if idx else None) if nxt else None
        prim = node.prim
        step = dict(frame=node.user_frame, op=prim, library=node.library, backward=node.backward)
        zin = node.zin or ()

        def follow(j: int, i: tuple | None) -> tuple | None:
            return (node.ins[j], i) if j < len(node.ins) else None

        def zero_inputs() -> list[tuple[int, tuple | None]]:
            out = []
            for j, m in enumerate(zin):
                i = _in_index(node, k, j, idx)
                if _at(m, i):
                    out.append((j, i))
            return out

        if prim == "select_n":
            c = None
            if node.choice is not None and idx is not None:
                try:
                    ch = np.broadcast_to(node.choice, _shape(node.zout[k]) or ())
                    c = int(ch[idx])
                except (ValueError, IndexError, TypeError):
                    c = None
            if c is None:
                cases = [j for j, _ in zero_inputs() if j > 0]
                j = cases[0] if cases else 1
            else:
                j = 1 + c
            state = ""
            if c is not None and node.choice is not None and len(zin) == 3:
                state = "True" if c else "False"
            return ZeroStep(B.SELECT, value=state, **step), follow(j, _in_index(node, k, j, idx))
        if prim == "pad":
            inner = _pad_index(node, idx)
            if inner is None:
                return ZeroStep(B.DROP, **step), follow(1, ())
            return ZeroStep(B.PASS, **step), follow(0, inner)
        if prim in _DROPS:
            drops = zero_inputs()
            j, i = drops[0] if drops else (0, idx)
            return ZeroStep(B.DROP, **step), follow(j, i if j == 0 else None)
        zs = zero_inputs()
        if prim in _EXP_LIKE and not zs:
            from ._explain import FINITE

            s0 = node.ins[0] if node.ins else None
            design = s0 is not None and s0[0].status[s0[1]] != FINITE
            role = B.BY_DESIGN if design else B.UNDERFLOW
            return ZeroStep(role, value="-inf" if design else "", **step), None
        if prim == "convert_element_type" and zin and zs:
            dt = None
            if node.eqn is not None:
                dt = getattr(node.eqn.invars[0].aval, "dtype", None)
            if _kind(dt) in ("b", "i", "u"):
                return ZeroStep(B.BOOL, **step), None
        if not zs:
            if _constant(src):  # made from constants only (1 - eye): a mask of the program
                return ZeroStep(
                    B.CONST, op=prim, **{k: v for k, v in step.items() if k != "op"}
                ), None
            if prim in _PRODUCTS or prim in ("div", "integer_pow", "pow", "sqrt", "square"):
                return ZeroStep(B.UNDERFLOW, **step), None
            if prim in ("sub", "add", "add_any"):
                return ZeroStep(B.CANCEL, **step), None
            if node.eqn is not None and all(_is_literal(v) for v in node.eqn.invars):
                return ZeroStep(B.LITERAL, **step), None
            return ZeroStep(B.VALUE, **step), None
        if len(zs) > 1:
            # both factors are 0: the cotangent's zero (a where, a slice upstream) comes first
            zs.sort(key=lambda z: not _is_backward(node.ins[z[0]]))
        j, i = zs[0]
        if prim in _PRODUCTS or prim == "div":
            if prim == "div" and j != 0:
                return ZeroStep(B.UNDERFLOW, **step), None
            if self.is_rule_eqn(node):  # a derivative's coefficient that is 0: it vanishes
                return ZeroStep(B.DERIVATIVE, **step), None
            return ZeroStep(B.MUL, **step), follow(j, i)
        if prim in _PLUMBING or node.user_frame is None or node.backward:
            return ZeroStep(B.PASS, **step), follow(j, i)
        # a forward value at the user's line that is 0: a derivative that vanishes (2 * x), or
        # the value itself (0 ** theta, consumed by its own derivative)
        if self.is_rule_eqn(node):
            return ZeroStep(B.DERIVATIVE, **step), None
        return ZeroStep(B.VALUE, **step), None


def _constant(src: Any, depth: int = 0) -> bool:
    """``src`` is computed from constants of the program only (literals, captured constants,
    iota): it does not depend on the function's inputs."""
    if src is None:
        return True
    node = src[0]
    if node.kind in ("const", "literal"):
        return True
    if node.kind != "eqn" or depth > 32 or node.backward:
        return False
    return all(_constant(s, depth + 1) for s in node.ins)


def _is_backward(src: Any) -> bool:
    return src is not None and src[0].kind == "eqn" and bool(src[0].backward)


def _is_literal(v: Any) -> bool:
    return type(v).__name__ == "Literal"


def zero_source(
    node: Any, zero: int, idx: tuple | None, is_rule_eqn: Any
) -> tuple[ZeroSource | None, list[ZeroStep]]:
    """What made operand ``zero`` of the poison ``node`` exactly zero at its element ``idx``."""
    src = node.ins[zero] if zero < len(node.ins) else None
    i: tuple | None = idx
    if idx is not None and node.operands is not None and zero < len(node.operands):
        if np.ndim(node.operands[zero]) == 0:
            i = ()
        elif np.ndim(node.operands[zero]) != len(idx):
            i = None
    if src is None:
        path = [ZeroStep(B.LITERAL, frame=node.user_frame, op=node.prim, backward=node.backward)]
    else:
        walk = _Walk(is_rule_eqn)
        path = B.follow_zero((src, i), walk)
        if path and path[-1].role == B.INPUT and walk.input is not None:
            # an input the other factor was not computed from: a mask passed as an argument
            others = [s for j, s in enumerate(node.ins) if j != zero and s is not None]
            if others and not any(_depends(s, walk.input) for s in others):
                path[-1] = dataclasses.replace(path[-1], independent=True)
        if node.prim in _PRODUCTS:
            # the poison is a product too: the step before the zero's way back
            first = ZeroStep(
                B.MUL,
                frame=node.user_frame,
                op=node.prim,
                library=node.library,
                backward=node.backward,
            )
            path = [first, *path]
    return B.classify_zero(path), path


def _depends(src: Any, target: Any, limit: int = 20000) -> bool:
    """Whether the value ``src`` was computed from the node ``target`` (its dataflow reaches
    it). A walk cut after ``limit`` nodes answers True: dependent unless shown otherwise."""
    stack = [src[0]]
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if n is target:
            return True
        if id(n) in seen:
            continue
        seen.add(id(n))
        if len(seen) > limit:
            return True
        stack.extend(s[0] for s in n.ins if s is not None)
    return False


def underflow_value(node: Any) -> str:
    """The operand of an exp that underflowed, formatted (empty when it was not kept)."""
    ops = getattr(node, "operands", None)
    if not ops:
        return ""
    return format_value(np.min(np.asarray(ops[0])))


def nan_meeting(start: Any, origin: Any, nan: int) -> tuple[Any, int] | None:
    """The product nearest ``origin`` on a way from ``start`` (an output's Src) back to it where
    the NaN was multiplied by an exact zero (``0 * nan = nan``: a where that did not select the
    branch, a mask): ``(node, the zero operand)``."""
    path: list = []
    seen: set = set()
    stack: list = [(start, 0)]
    found = False
    while stack:
        src, depth = stack.pop()
        del path[depth:]
        node, k = src
        path.append(node)
        if node is origin:
            found = True
            break
        if id(src[0]) in seen:
            continue
        seen.add(id(src[0]))
        for s in node.ins:
            if s is not None and s[0].status[s[1]] == nan:
                stack.append((s, depth + 1))
    if not found:
        return None
    for node in reversed(path[:-1]):
        if node.prim not in _PRODUCTS or node.zin is None or len(node.ins) != 2:
            continue
        # dot_general sums products: the element of the operand is not the output's
        idx = node.first_bad if node.prim == "mul" else None
        for j in (0, 1):
            other = node.ins[1 - j]
            if other is None or other[0].status[other[1]] != nan:
                continue
            m = node.zin[j]
            i = idx if (m is not None and idx is not None and m.ndim == len(idx)) else None
            if m is not None and m.ndim == 0:
                i = ()
            if _at(m, i):
                return node, j
    return None
