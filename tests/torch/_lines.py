"""Line numbers from the test source itself, so asserts never drift."""

from __future__ import annotations

import inspect


def line_of(marker: str) -> int:
    """The line of the calling file that ends with the comment ``# <marker>``."""
    filename = inspect.stack()[1].filename
    with open(filename) as fh:
        for i, line in enumerate(fh, 1):
            if line.rstrip().endswith(f"# {marker}"):
                return i
    raise LookupError(marker)


def col_of(marker: str, snippet: str) -> tuple[int, int]:
    """(column, end_column) of ``snippet`` on the line marked ``marker`` in the caller's file."""
    filename = inspect.stack()[1].filename
    with open(filename) as fh:
        for line in fh:
            if line.rstrip().endswith(f"# {marker}"):
                c = line.index(snippet)
                return c, c + len(snippet)
    raise LookupError(marker)
