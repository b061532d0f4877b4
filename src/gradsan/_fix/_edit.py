"""Edits of the user's file: one expression of a statement replaced, the statement printed as the
user pastes it (a ``return`` stays a ``return``), and edits applied to a file's text."""

from __future__ import annotations

import ast
from collections.abc import Sequence

from .._report._records import FixProposal
from ._rewrite import Rewrite
from ._site import Site


def _char_col(line: str, byte_col: int) -> int:
    """ast columns are UTF-8 byte offsets; the text is indexed by characters."""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def _line_starts(lines: Sequence[str]) -> list[int]:
    out, pos = [], 0
    for ln in lines:
        out.append(pos)
        pos += len(ln)
    out.append(pos)
    return out


def offsets(site: Site, node: ast.expr | ast.stmt) -> tuple[int, int]:
    """(start, end) character offsets of ``node`` in the file's text."""
    starts = _line_starts(site.lines)
    assert node.end_lineno is not None and node.end_col_offset is not None
    a = starts[node.lineno - 1] + _char_col(site.lines[node.lineno - 1], node.col_offset)
    b = starts[node.end_lineno - 1] + _char_col(
        site.lines[node.end_lineno - 1], node.end_col_offset
    )
    return a, b


def proposal(
    site: Site, rw: Rewrite, summary: str, backend: str, names: set[str]
) -> FixProposal | None:
    """The FixProposal of one rewrite: None when the new statement is not valid Python or names
    something not in scope at that line (``gradsan`` excepted: the patch imports it)."""
    s0, s1 = offsets(site, site.stmt)
    t0, t1 = offsets(site, rw.target)
    src = site.source
    new_stmt = src[s0:t0] + rw.text + src[t1:s1]
    try:
        tree = ast.parse(new_stmt.strip() if "\n" not in new_stmt else _dedent(site, new_stmt))
    except SyntaxError:
        return None
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    missing = used - names - {"gradsan"}
    if missing:
        return None
    code = _dedent(site, new_stmt)
    mod = f"gradsan.{backend}"
    need = None
    if rw.uses_gradsan and not _imports(site.tree, mod):
        need = mod
        code = f"import {mod}  # at the top of {site.file.rsplit('/', 1)[-1]}\n" + code
    assert site.stmt.end_lineno is not None and site.stmt.end_col_offset is not None
    line0 = site.lines[site.stmt.lineno - 1]
    line1 = site.lines[site.stmt.end_lineno - 1]
    summary = summary.rstrip()
    if rw.value_note:
        summary = summary.rstrip(":.") + f" ({rw.value_note}):"
    return FixProposal(
        summary=summary,
        code=code,
        backend=backend,
        file=site.file,
        start_line=site.stmt.lineno,
        start_col=_char_col(line0, site.stmt.col_offset),
        end_line=site.stmt.end_lineno,
        end_col=_char_col(line1, site.stmt.end_col_offset),
        replacement=new_stmt,
        original=src[s0:s1],
        needs_import=need,
        value_change=rw.value_note,
    )


def _dedent(site: Site, text: str) -> str:
    """A multi-line statement's continuation lines lose the statement's indentation."""
    indent = site.stmt.col_offset
    out = [text.splitlines()[0]] if text else [""]
    for ln in text.splitlines()[1:]:
        lead = len(ln) - len(ln.lstrip(" "))
        out.append(ln[min(lead, indent) :])
    return "\n".join(out)


def _imports(tree: ast.Module, mod: str) -> bool:
    """Whether the module binds the name ``gradsan`` to the package with ``mod`` loaded."""
    for n in tree.body:
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.asname is None and (a.name == mod or a.name.startswith(mod + ".")):
                    return True
    return False


def span(text: str, e: FixProposal) -> tuple[int, int] | None:
    """The character span of ``e``'s statement in ``text``; None when the text there is no
    longer the statement the fix was written for (the file changed since)."""
    lines = text.splitlines(keepends=True)
    if e.end_line > len(lines):
        return None
    starts = _line_starts(lines)
    a = starts[e.start_line - 1] + e.start_col
    b = starts[e.end_line - 1] + e.end_col
    if e.original and text[a:b] != e.original:
        return None
    return a, b


def apply(text: str, edits: Sequence[FixProposal]) -> str:
    """``text`` with each edit's statement span replaced (edits must not overlap); an edit whose
    statement is no longer there raises ValueError."""
    spans = []
    for e in edits:
        got = span(text, e)
        if got is None:
            raise ValueError(f"{e.file}:{e.start_line} changed since the fix was written")
        spans.append((got[0], got[1], e.replacement))
    out = text
    for a, b, rep in sorted(spans, reverse=True):
        out = out[:a] + rep + out[b:]
    return out


def add_import(text: str, mod: str) -> str:
    """``import mod`` after the module's docstring, ``__future__`` imports and first imports."""
    tree = ast.parse(text)
    after = 0
    body = tree.body
    i = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        after = body[0].end_lineno or 0
        i = 1
    while i < len(body) and isinstance(body[i], (ast.Import, ast.ImportFrom)):
        after = body[i].end_lineno or after
        i += 1
    lines = text.splitlines(keepends=True)
    if after and lines and not lines[after - 1].endswith("\n"):
        lines[after - 1] += "\n"
    lines.insert(after, f"import {mod}\n")
    return "".join(lines)
