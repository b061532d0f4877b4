"""The user's frame of a torch call: the first Python frame outside torch and gradsan, with the
column range of the sub-expression from ``code.co_positions()`` (Python >= 3.11)."""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType

from .._report import Frame
from .._report._frames import frame_at

_SKIP_DIRS: tuple[str, ...] = ()


def _init_skip() -> tuple[str, ...]:
    import contextlib

    import torch

    import gradsan

    dirs = [
        os.path.dirname(torch.__file__) + os.sep,
        os.path.dirname(gradsan.__file__) + os.sep,
        os.path.dirname(contextlib.__file__) + os.sep + "contextlib.py",
    ]
    return tuple(dirs)


def is_library_file(filename: str) -> bool:
    global _SKIP_DIRS
    if not _SKIP_DIRS:
        _SKIP_DIRS = _init_skip()
    if filename.startswith("<frozen") or filename.startswith("<torch"):
        return True
    return filename.startswith(_SKIP_DIRS)


_library_code: dict[CodeType, bool] = {}


def user_frame_object(depth: int = 1) -> FrameType | None:
    """The innermost frame that is not torch's, gradsan's or contextlib's."""
    f: FrameType | None = sys._getframe(depth)
    lib_code = _library_code
    while f is not None:
        code = f.f_code
        lib = lib_code.get(code)
        if lib is None:
            lib = lib_code[code] = is_library_file(code.co_filename)
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
