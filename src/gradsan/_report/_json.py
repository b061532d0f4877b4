"""JSON rendering: the same content as the text report, machine-readable."""

from __future__ import annotations

import json
from typing import Any

from ._records import Report


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
    return json.dumps(to_dict(report), default=str, **kwargs)
