"""How `gradsan run` ends when the script raises: the user's traceback without gradsan's and
runpy's frames (exit 1, as Python would), or, when the error was raised inside gradsan itself,
a line saying so and gradsan's own exit status."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from types import TracebackType

from .._errors import GradsanError
from .._userfile import is_gradsan_file, is_user_file

EXIT_SCRIPT_ERROR = 1  # what `python script.py` exits with
EXIT_INTERNAL = 4  # an error inside gradsan (a bug in gradsan, not in the script)

_RUNPY = os.path.abspath(runpy.__file__)


def _frames(tb: TracebackType | None) -> list[str]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return out


def is_internal(exc: BaseException) -> bool:
    """True when ``exc`` was raised by gradsan's own code: the innermost frame that is the
    user's or gradsan's is gradsan's (library frames below it do not count). gradsan's errors
    for the user (UsageError, NonFiniteError) are not internal."""
    if isinstance(exc, GradsanError):
        return False
    for filename in reversed(_frames(exc.__traceback__)):
        if is_gradsan_file(filename):
            return True
        if is_user_file(filename):
            return False
    return False


def _hidden(filename: str, internal: bool) -> bool:
    if filename.startswith("<frozen runpy") or os.path.abspath(filename) == _RUNPY:
        return True
    return not internal and is_gradsan_file(filename)


def _strip(te: traceback.TracebackException, internal: bool, seen: set[int]) -> None:
    if id(te) in seen:
        return
    seen.add(id(te))
    kept = [f for f in te.stack if not _hidden(f.filename, internal)]
    te.stack = traceback.StackSummary.from_list(kept)
    for nxt in (te.__cause__, te.__context__):
        if nxt is not None:
            _strip(nxt, internal, seen)


def format_script_error(exc: BaseException, internal: bool) -> str:
    te = traceback.TracebackException.from_exception(exc)
    _strip(te, internal, set())
    return "".join(te.format())


def report_script_error(exc: BaseException) -> int:
    """Print the traceback of ``exc`` (raised while the script ran); the exit status."""
    from ._failure import say

    internal = is_internal(exc)
    if internal:
        say(
            f"internal error in gradsan, not in your script ({type(exc).__name__}: {exc}). "
            "This is a bug in gradsan; please report it with the traceback below. Run the "
            "script without gradsan to continue."
        )
    sys.stderr.write(format_script_error(exc, internal))
    sys.stderr.flush()
    return EXIT_INTERNAL if internal else EXIT_SCRIPT_ERROR
