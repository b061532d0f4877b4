"""The zero's sentence: what made the zero factor of an indeterminate product exactly zero.

From a Poison's ``zero_kind`` and the Frame of the operation that made the zero, the words of
the report's ``met`` row: "`jnp.where(mask, ...)` did not select this branch (`mask` is False
here), so its gradient is 0, and 0.0 / 0.0 = nan in the backward `div`". The expression and
the condition are read from the user's source line under the Frame's columns (never run).
"""

from __future__ import annotations

import ast

from .._events import Poison, ZeroKind
from . import _messages as M
from ._records import Frame

_MAX_EXPR = 48


def _node_at(frame: Frame | None) -> tuple[ast.AST, str] | None:
    """The expression under the frame's caret, parsed, and its source text."""
    if frame is None or not frame.code:
        return None
    code = frame.code
    text = code.strip()
    if frame.column is not None and frame.end_column and frame.end_column > frame.column:
        lead = len(code) - len(code.lstrip())
        start = frame.column - lead
        end = frame.end_column - lead
        if 0 <= start < end <= len(code.lstrip()):
            text = code.lstrip()[start:end]
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return None
    return tree.body, text.strip()


def expression(frame: Frame | None) -> str:
    """The operation's source text, shortened: ``jnp.where(mask, ...)``, ``d * PAIR_MASK``."""
    got = _node_at(frame)
    if got is None:
        return ""
    node, text = got
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        if node.args:
            first = ast.unparse(node.args[0])
            more = ", ..." if len(node.args) > 1 or node.keywords else ""
            return f"{func}({first}{more})"
        return f"{func}(...)" if node.keywords else f"{func}()"
    if len(text) > _MAX_EXPR:
        return text[: _MAX_EXPR - 3] + "..."
    return text


def condition(frame: Frame | None) -> str:
    """A where call's condition text (its first argument), or ``""``."""
    got = _node_at(frame)
    if got is None or not isinstance(got[0], ast.Call):
        return ""
    call = got[0]
    if call.args:
        return ast.unparse(call.args[0])
    for kw in call.keywords:
        if kw.arg in ("condition", "cond", "mask"):
            return ast.unparse(kw.value)
    return ""


def sentence(p: Poison, zero_from: Frame | None) -> str:
    """The zero's clause for the met row (empty when the kind is unknown)."""
    k = p.zero_kind
    if k is None:
        return ""
    expr = expression(zero_from)
    code = f"`{expr}`" if expr else M.ZERO_THIS_OPERATION
    if k is ZeroKind.WHERE:
        cond = condition(zero_from)
        state = M.ZERO_WHERE_STATE.format(cond=cond, value=p.zero_value) if cond else ""
        if cond and not p.zero_value:
            state = M.ZERO_WHERE_COND.format(cond=cond)
        return M.ZERO_WHERE.format(code=code, state=state)
    if k is ZeroKind.MASK:
        name = f" `{p.zero_text}`" if p.zero_text and not p.zero_text.startswith("a ") else ""
        return M.ZERO_MASK.format(code=code, name=name)
    if k is ZeroKind.INPUT_MASK:
        name = (
            M.ZERO_INPUT_MASK_NAME.format(name=p.zero_text)
            if p.zero_text
            else M.ZERO_INPUT_MASK_ANY
        )
        return M.ZERO_INPUT_MASK.format(code=code, name=name)
    if k is ZeroKind.INPUT:
        return M.ZERO_INPUT.format(name=p.zero_text or "an input")
    if k is ZeroKind.UNDERFLOW:
        return M.ZERO_UNDERFLOW.format(code=code)
    text = {
        ZeroKind.NAN_TO_NUM: M.ZERO_NAN_TO_NUM,
        ZeroKind.SLICE: M.ZERO_SLICE,
        ZeroKind.CONSTANT: M.ZERO_CONSTANT,
        ZeroKind.DERIVATIVE: M.ZERO_DERIVATIVE,
        ZeroKind.BY_DESIGN: M.ZERO_BY_DESIGN,
        ZeroKind.CANCEL: M.ZERO_CANCEL,
        ZeroKind.STOP: M.ZERO_STOP,
        ZeroKind.VALUE: M.ZERO_VALUE,
    }[k]
    return text.format(code=code)
