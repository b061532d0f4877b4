"""A code object and instruction offset -> the user's Frame, with the column range of the
sub-expression from ``code.co_positions()`` (Python >= 3.11). Shared by both backends."""

from __future__ import annotations

import itertools
import linecache
from types import CodeType

from ._records import Frame

_frames: dict[tuple[CodeType, str, int], Frame | None] = {}


def frame_at(code: CodeType, lasti: int, lineno: int | None = None) -> Frame | None:
    """The Frame of the instruction at byte offset ``lasti`` of ``code`` (cached)."""
    key = (code, code.co_filename, lasti)  # code equality ignores the file name
    if key in _frames:
        return _frames[key]
    line = col = end = None
    try:
        pos = next(itertools.islice(code.co_positions(), lasti // 2, None), None)
    except AttributeError:  # Python < 3.11: no columns
        pos = None
    if pos is not None:
        line, end_line, col, end = pos
        if end_line != line:
            end = None
    line = line if line is not None else lineno
    frame = None
    if line is not None:
        text = linecache.getline(code.co_filename, line).rstrip("\n")
        frame = Frame(
            file=code.co_filename,
            line=line,
            column=col,
            function=code.co_name,
            code=text,
            end_column=end,
        )
    _frames[key] = frame
    return frame
