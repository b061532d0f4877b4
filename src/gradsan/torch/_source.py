"""The user's frame of a torch call: the first Python frame of the user's code (see
gradsan/_userfile.py: not torch, gradsan, the standard library or an installed package), with the
column range of the sub-expression from ``code.co_positions()`` (Python >= 3.11)."""

from __future__ import annotations

import sys
from types import CodeType, FrameType

from .._report import Frame
from .._report._frames import frame_at
from .._userfile import is_user_file

_library_code: dict[CodeType, bool] = {}


def user_frame_object(depth: int = 1) -> FrameType | None:
    """The innermost frame of the user's code."""
    f: FrameType | None = sys._getframe(depth)
    lib_code = _library_code
    while f is not None:
        code = f.f_code
        lib = lib_code.get(code)
        if lib is None:
            lib = lib_code[code] = not is_user_file(code.co_filename)
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
