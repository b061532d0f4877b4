"""The records every backend produces and every renderer reads: Frame, Finding, Report."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal

Kind = Literal["nonfinite", "resolved", "kink", "convention", "unresolved"]
Phase = Literal["value", "gradient"]


@dataclasses.dataclass(frozen=True)
class Frame:
    """A place in the user's source: ``file:line (function)``, with the column range if known."""

    file: str
    line: int
    column: int | None = None
    function: str = "<module>"
    code: str = ""
    end_column: int | None = None

    @property
    def short_file(self) -> str:
        try:
            rel = os.path.relpath(self.file)
        except ValueError:
            return self.file
        return self.file if rel.startswith("..") else rel

    def __str__(self) -> str:
        return f"{self.short_file}:{self.line} ({self.function})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OutputHit:
    """One output (a pytree path such as ``['params']['dense_3']['kernel']``) that went non-finite."""

    path: str
    count: int
    size: int
    nan: int = 0
    inf: int = 0
    kind: str = ""  # "grad" (a gradient w.r.t. `path`), "value", "output", or "" if unknown

    def __str__(self) -> str:
        name = f"d/d{self.path}" if self.kind == "grad" and self.path.isidentifier() else self.path
        return f"{name} ({self.count} of {self.size} elements)"


@dataclasses.dataclass
class Finding:
    """One thing gradsan found: where a non-finite value was born, a repair, or a kink.

    ``where`` is always a frame of the user's code; ``library`` names the library function
    (``jnp.linalg.norm``) when the operation ran inside one.
    """

    kind: Kind
    catalog_id: str | None
    phase: Phase
    primitive: str
    where: Frame | None
    result: str = "nan"  # what the operation produced: "nan", "inf", "-inf"
    backend_op: str = ""  # the operation that actually produced it (the backward `div`)
    library: str | None = None
    zero_from: Frame | None = None
    form: str | None = None  # "0*inf", "inf-inf", "0/0", "inf/inf"
    met_op: str | None = None  # the operation where the inf met the zero
    met_where: Frame | None = None
    values: str = ""  # "sqrt got 0.0 in 2 of 4 elements, first at [0, 1]"
    count: int = 0
    size: int = 0
    index: tuple[int, ...] | None = None
    context: str = ""  # "scan iteration 2", "cond branch 1"
    scope: str = ""  # named scope / module path
    outputs: list[OutputHit] = dataclasses.field(default_factory=list)
    title: str = ""
    explanation: str = ""
    suggestions: list[str] = dataclasses.field(default_factory=list)
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["index"] = list(self.index) if self.index is not None else None
        return d


@dataclasses.dataclass
class Report:
    """What a gradsan transformation found. ``outputs`` holds what the function returned."""

    findings: list[Finding] = dataclasses.field(default_factory=list)
    outputs: Any = None
    function: str = "function"
    backend: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no finding says something is non-finite (repairs and kinks don't count)."""
        return not any(f.kind in ("nonfinite", "unresolved") for f in self.findings)

    def by_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def __str__(self) -> str:
        from ._text import render

        return render(self)

    def to_json(self, **kwargs: Any) -> str:
        from ._json import to_json

        return to_json(self, **kwargs)

    def __repr__(self) -> str:
        ids = ", ".join(sorted({f.catalog_id or f.kind for f in self.findings}))
        return f"Report(ok={self.ok}, findings=[{ids}])"
