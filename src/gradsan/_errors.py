"""gradsan's exceptions. They live under the name ``gradsan`` in tracebacks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._report._records import Report


class GradsanError(Exception):
    """Base class of gradsan's own errors."""


class NonFiniteError(GradsanError, FloatingPointError):
    """A guarded function produced NaN or Inf. ``str(err)`` is the rendered report; ``.report``
    is the :class:`gradsan.Report`."""

    def __init__(self, report: Report):
        self.report = report
        super().__init__(str(report))


class UsageError(GradsanError, TypeError):
    """gradsan was called the wrong way; the message says what to do instead."""


for _cls in (GradsanError, NonFiniteError, UsageError):
    _cls.__module__ = "gradsan"
