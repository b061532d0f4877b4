"""``Report.patch()``: the first verified fix of each finding, as a unified diff of the user's
files (``--- a/PATH`` / ``+++ b/PATH``, paths relative to the working directory as the frames
show them), with ``import gradsan.jax`` / ``import gradsan.torch`` added where a file lacks it.
``git apply`` and ``patch -p1`` accept it."""

from __future__ import annotations

import difflib
import os

from .._report._records import FixProposal, Report
from ._edit import add_import, apply, span
from ._site import parsed


def chosen(report: Report) -> list[FixProposal]:
    """The first verified fix of each finding, one per statement (the first finding wins)."""
    out: list[FixProposal] = []
    taken: set[tuple[str, int, int]] = set()
    for f in report.findings:
        p = next((p for p in f.fixes if p.status == "verified" and p.file), None)
        if p is None or p.file is None:
            continue
        span = (p.file, p.start_line, p.end_line)
        if any(s[0] == p.file and not (p.end_line < s[1] or p.start_line > s[2]) for s in taken):
            continue
        taken.add(span)
        out.append(p)
    return out


def _path(file: str) -> str:
    try:
        rel = os.path.relpath(file)
    except ValueError:
        return file
    return file if rel.startswith("..") else rel


def patched_files(report: Report) -> dict[str, tuple[str, str]]:
    """file -> (its text, its text with the chosen fixes and imports)."""
    by_file: dict[str, list[FixProposal]] = {}
    for p in chosen(report):
        assert p.file is not None
        by_file.setdefault(p.file, []).append(p)
    out = {}
    for file, edits in by_file.items():
        got = parsed(file)
        if got is None:
            continue
        text = got[0]
        edits = [e for e in edits if span(text, e) is not None]  # the file changed there: skip
        if not edits:
            continue
        new = apply(text, edits)
        for mod in sorted({p.needs_import for p in edits if p.needs_import}):
            new = add_import(new, mod)
        out[file] = (text, new)
    return out


def patch(report: Report) -> str:
    parts = []
    for file, (old, new) in patched_files(report).items():
        path = _path(file).replace(os.sep, "/")
        a = old.splitlines(keepends=True)
        b = new.splitlines(keepends=True)
        diff = difflib.unified_diff(a, b, fromfile=f"a/{path}", tofile=f"b/{path}", n=3)
        for line in diff:
            parts.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(parts)
