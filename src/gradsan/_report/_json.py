"""JSON rendering: the same content as the text report, machine-readable.

Every number a consumer needs is a JSON number: counts, sizes and first indices of each finding
and output, ``got_value`` (the operand value the catalog entry saw, next to its formatted
``detail["got"]``), the typed details' counts, and numpy values anywhere (``float32``, arrays),
which become numbers and lists instead of strings.
"""

from __future__ import annotations

import json
from typing import Any

from ._records import Report


def _plain(o: Any) -> Any:
    """A numpy scalar or array as a JSON number or list; anything else as its text."""
    tolist = getattr(o, "tolist", None)
    if callable(tolist):
        try:
            return tolist()
        except (TypeError, ValueError):
            pass
    return str(o)


def to_dict(report: Report) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "function": report.function,
        "backend": report.backend,
        "findings": [f.to_dict() for f in report.findings],
        "notes": list(report.notes),
    }


def to_json(report: Report, **kwargs: Any) -> str:
    kwargs.setdefault("indent", 2)
    kwargs.setdefault("default", _plain)
    return json.dumps(to_dict(report), **kwargs)
