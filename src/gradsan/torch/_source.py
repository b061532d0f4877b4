"""The user's frame of a torch call: the first Python frame of the user's code (see
gradsan/_userfile.py: not torch, gradsan, the standard library or an installed package), with the
column range of the sub-expression from ``code.co_positions()`` (Python >= 3.11)."""

from __future__ import annotations

import sys
from types import CodeType, FrameType

from .._report import Frame
from .._report._frames import frame_at
from .._userfile import is_user_file

# id(code) -> (code, is it library code): keyed by identity, not by the code object, whose
# equality ignores the file name (a user's function and a library's with the same text at the
# same line are equal); the entry holds its code object, so the id is not reused while cached
# (and an identity-keyed lookup skips hashing the code object, which is not cached)
_library_code: dict[int, tuple[CodeType, bool]] = {}
_MAX_CODES = 1 << 16


def user_frame_object(depth: int = 1) -> FrameType | None:
    """The innermost frame of the user's code."""
    f: FrameType | None = sys._getframe(depth)
    lib_code = _library_code
    while f is not None:
        code = f.f_code
        got = lib_code.get(id(code))
        if got is not None and got[0] is code:
            lib = got[1]
        else:
            lib = not is_user_file(code.co_filename)
            if len(lib_code) >= _MAX_CODES:  # exec'd copies (fix verification) come and go
                lib_code.clear()
            lib_code[id(code)] = (code, lib)
        if not lib:
            return f
        f = f.f_back
    return None


def frame_of(f: FrameType) -> Frame:
    frame = frame_at(f.f_code, f.f_lasti, f.f_lineno)
    assert frame is not None  # f_lineno is always known
    return frame


def user_frame(depth: int = 2) -> Frame | None:
    f = user_frame_object(depth)
    return frame_of(f) if f is not None else None
