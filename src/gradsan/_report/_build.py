"""Building findings from catalog entries: the one place where a backend's event becomes the
words a user reads. Backends call these; they never write explanation text themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _catalog
from ._records import Finding, Frame, OutputHit


def describe_values(op: str, got: str, count: int, size: int, index: Sequence[int] | None) -> str:
    """``sqrt got 0.0 in 2 of 4 elements, first at [0, 1]``."""
    s = f"{op} got {got}"
    if size > 1:
        s += f" in {count} of {size} elements"
        if index:
            s += f", first at [{', '.join(str(i) for i in index)}]"
    return s


def _call_parts(where: Frame | None) -> tuple[list[str], str | None]:
    """The operand texts of the expression under the caret (``A`` in ``jnp.sqrt(A)``, ``x`` and
    ``y`` in ``x / y``) and the variable the line assigns it to, if any."""
    import ast

    if where is None or where.column is None or where.end_column is None or not where.code:
        return [], None
    expr = where.code[where.column : where.end_column]
    try:
        node = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        return [], None
    src = expr.strip()
    if (
        isinstance(node, ast.Call)
        and node.args
        and not any(isinstance(a, ast.Starred) for a in node.args)
    ):
        operands = [ast.get_source_segment(src, a) or "" for a in node.args]
    elif isinstance(node, ast.BinOp):
        operands = [
            ast.get_source_segment(src, node.left) or "",
            ast.get_source_segment(src, node.right) or "",
        ]
    else:
        return [], None
    target = None
    line = where.code.strip()
    try:
        stmt = ast.parse(line).body[0]
    except (SyntaxError, IndexError):
        stmt = None
    if (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and (ast.get_source_segment(line, stmt.value) or "").strip() == src
    ):
        target = stmt.targets[0].id
    return [o for o in operands if o], target


def _atomic(text: str) -> bool:
    import ast

    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    return isinstance(node, (ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.Constant))


def adapt_fix(code: str, where: Frame | None) -> str:
    """The catalog's fix code written with the user's own names: its placeholder operands ``x``
    (and ``y`` for binary operations) become the operands at the caret, and the assigned name
    becomes the user's variable."""
    import re

    operands, target = _call_parts(where)
    if not operands:
        return code
    second = "p" if re.search(r"\bp\b", code) and not re.search(r"\by\b", code) else "y"
    names = ["x", second][: len(operands)]
    if len(operands) == 1 and re.search(r"\by\b", code) and not re.search(r"\bx\b", code):
        return code
    lines = code.splitlines()
    prefix = []
    for name, text in zip(names, operands):
        if name == text:
            continue
        simple = re.fullmatch(r"[A-Za-z_][\w.]*(\[[^\]]*\])?", text)
        uses = sum(len(re.findall(rf"\b{name}\b", ln)) for ln in lines)
        if simple or uses <= 1:
            wrapped = text if simple or _atomic(text) else f"({text})"
            lines = [re.sub(rf"\b{name}\b", lambda _m, t=wrapped: t, ln) for ln in lines]
        else:  # a compound operand used several times: bind it once
            prefix.append(f"{name} = {text}")
    if target is not None and lines:
        m = re.match(r"^(\w+) = ", lines[-1])
        if m and m.group(1) not in ("ok",):
            lines[-1] = f"{target} = " + lines[-1][m.end() :]
    return "\n".join(prefix + lines)


def suggestions(entry_id: str | None, backend: str, where: Frame | None = None) -> list[str]:
    if entry_id is None:
        return []
    try:
        entry = _catalog.get(entry_id)
    except KeyError:
        return []
    return [f"{fx.summary}\n{adapt_fix(fx.code(backend), where)}" for fx in entry.fixes]


def catalog_finding(
    *,
    backend: str,
    entry_id: str | None,
    kind: str = "nonfinite",
    phase: str,
    primitive: str,
    where: Frame | None,
    result: str = "nan",
    backend_op: str = "",
    got: str | None = None,
    count: int = 0,
    size: int = 0,
    index: Sequence[int] | None = None,
    library: str | None = None,
    zero_from: Frame | None = None,
    form: str | None = None,
    met_op: str | None = None,
    met_where: Frame | None = None,
    context: str = "",
    scope: str = "",
    outputs: Sequence[OutputHit] = (),
    detail: dict[str, Any] | None = None,
) -> Finding:
    """A Finding whose title, explanation and fixes come from catalog entry ``entry_id``."""
    entry = None
    if entry_id is not None:
        try:
            entry = _catalog.get(entry_id)
        except KeyError:
            entry = None
    detail = dict(detail or {})
    if got is not None:
        detail.setdefault("got", got)
    if entry is not None:
        detail.setdefault("derivative", entry.derivative)
    values = describe_values(primitive, got, count, size, index) if got is not None else ""
    return Finding(
        kind=kind,  # type: ignore[arg-type]
        catalog_id=entry_id,
        phase=phase,  # type: ignore[arg-type]
        primitive=primitive,
        where=where,
        result=result,
        backend_op=backend_op,
        library=library,
        zero_from=zero_from,
        form=form,
        met_op=met_op,
        met_where=met_where,
        values=values,
        count=count,
        size=size,
        index=tuple(index) if index is not None else None,
        context=context,
        scope=scope,
        outputs=list(outputs),
        title=entry.title if entry else "",
        explanation=entry.explanation if entry else "",
        suggestions=suggestions(entry_id, backend, where),
        detail=detail,
    )
