"""Building findings from catalog entries: the one place where a backend's event becomes the
words a user reads. Backends call these; they never write explanation text themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _catalog
from ._records import Finding, Frame, OutputHit


def describe_values(op: str, got: str, count: int, size: int, index: Sequence[int] | None) -> str:
    """``sqrt got 0.0 in 2 of 4 elements, first at [0, 1]``."""
    s = f"{op} got {got}"
    if size > 1:
        s += f" in {count} of {size} elements"
        if index:
            s += f", first at [{', '.join(str(i) for i in index)}]"
    return s


def suggestions(entry_id: str | None, backend: str) -> list[str]:
    if entry_id is None:
        return []
    try:
        entry = _catalog.get(entry_id)
    except KeyError:
        return []
    return [f"{fx.summary}\n{fx.code(backend)}" for fx in entry.fixes]


def catalog_finding(
    *,
    backend: str,
    entry_id: str | None,
    kind: str = "nonfinite",
    phase: str,
    primitive: str,
    where: Frame | None,
    result: str = "nan",
    backend_op: str = "",
    got: str | None = None,
    count: int = 0,
    size: int = 0,
    index: Sequence[int] | None = None,
    library: str | None = None,
    zero_from: Frame | None = None,
    form: str | None = None,
    met_op: str | None = None,
    met_where: Frame | None = None,
    context: str = "",
    scope: str = "",
    outputs: Sequence[OutputHit] = (),
    detail: dict[str, Any] | None = None,
) -> Finding:
    """A Finding whose title, explanation and fixes come from catalog entry ``entry_id``."""
    entry = None
    if entry_id is not None:
        try:
            entry = _catalog.get(entry_id)
        except KeyError:
            entry = None
    detail = dict(detail or {})
    if got is not None:
        detail.setdefault("got", got)
    if entry is not None:
        detail.setdefault("derivative", entry.derivative)
    values = describe_values(primitive, got, count, size, index) if got is not None else ""
    return Finding(
        kind=kind,  # type: ignore[arg-type]
        catalog_id=entry_id,
        phase=phase,  # type: ignore[arg-type]
        primitive=primitive,
        where=where,
        result=result,
        backend_op=backend_op,
        library=library,
        zero_from=zero_from,
        form=form,
        met_op=met_op,
        met_where=met_where,
        values=values,
        count=count,
        size=size,
        index=tuple(index) if index is not None else None,
        context=context,
        scope=scope,
        outputs=list(outputs),
        title=entry.title if entry else "",
        explanation=entry.explanation if entry else "",
        suggestions=suggestions(entry_id, backend),
        detail=detail,
    )
