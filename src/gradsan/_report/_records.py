"""The records every backend produces and every renderer reads: Frame, Finding, Report.

A Finding's facts that belong to one kind of finding live in a typed ``Details`` record
(:class:`OriginDetails` for a non-finite origin, :class:`RepairDetails` for a repair or a
value left unresolved, :class:`KinkDetails` for a kink or a convention, and
:class:`CertificateDetails` for certify's verdict). ``Finding.detail`` is that record; it is also
a mapping over the facts it holds (the keys of the former untyped ``detail`` dict), so code that
reads ``f.detail["rule"]`` or ``f.detail.get("note")`` keeps working. A fact that is None is
absent from the mapping.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, ClassVar, Literal

Kind = Literal["nonfinite", "resolved", "kink", "convention", "unresolved", "certified"]
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


# ---- typed details ------------------------------------------------------------------------------

_FIELD_NAMES: dict[type, frozenset[str]] = {}


@dataclasses.dataclass(eq=False, repr=False)
class Details(MutableMapping[str, Any]):
    """The facts of one finding beyond the common fields, as a mapping over those that are set.

    Subclasses add the facts of one kind of finding. ``extra`` holds a key no subclass declares
    (written by a backend that has not moved onto the event layer yet); it stays empty for
    findings built from events.
    """

    got: str | None = None  # the operand value the catalog entry saw, formatted ("0.0")
    derivative: str | None = None  # the catalog entry's derivative formula
    note: str | None = None  # one clause the headline or the row adds
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    # a key of the mapping that is not a Python name: key -> field
    ALIASES: ClassVar[Mapping[str, str]] = {}
    # fields that are part of the mapping even when None
    KEEP_NONE: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def keys_declared(cls) -> tuple[str, ...]:
        back = {v: k for k, v in cls.ALIASES.items()}
        return tuple(back.get(f.name, f.name) for f in dataclasses.fields(cls) if f.name != "extra")

    def _field(self, key: str) -> str | None:
        name = self.ALIASES.get(key, key)
        if name == "extra" or name not in self._names():
            return None
        return name

    @classmethod
    def _names(cls) -> frozenset[str]:
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        return names

    def __getitem__(self, key: str) -> Any:
        name = self._field(key)
        if name is None:
            return self.extra[key]
        v = getattr(self, name)
        if v is None and name not in self.KEEP_NONE:
            raise KeyError(key)
        return v

    def __setitem__(self, key: str, value: Any) -> None:
        name = self._field(key)
        if name is None:
            self.extra[key] = value
        else:
            setattr(self, name, value)

    def __delitem__(self, key: str) -> None:
        name = self._field(key)
        if name is None:
            del self.extra[key]
        elif getattr(self, name) is None and name not in self.KEEP_NONE:
            raise KeyError(key)
        else:
            setattr(self, name, None)

    def __iter__(self) -> Iterator[str]:
        for key in self.keys_declared():
            name = self.ALIASES.get(key, key)
            if getattr(self, name) is not None or name in self.KEEP_NONE:
                yield key
        yield from self.extra

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.items())


@dataclasses.dataclass(eq=False, repr=False)
class OriginDetails(Details):
    """Where a non-finite value was born (kinds ``nonfinite`` and ``unresolved``)."""

    input: str | None = None  # a non-finite input or constant: its name
    origin_op: str | None = None  # the backend operation that produced it
    node: str | None = None  # torch: the autograd Node that produced it
    custom_vjp_call: str | None = None  # jax: the call site of the custom_vjp rule it was born in
    met_text: str | None = None  # the indeterminate form at the place the inf met a zero
    met_value: str | None = None  # what met the zero ("inf", "nan")
    met_clause: str | None = None  # the headline's words for the meeting (built from values)
    zero_kind: str | None = None  # what made that zero exact (events.ZeroKind's value)
    zero_entry: str | None = None  # the catalog entry that explains it ("where-trap")
    why_unresolved: str | None = None  # nansafe: why the value was left non-finite
    device: int | None = None  # jax: the device it was born on
    mesh_coordinate: dict[str, int] | None = None  # that device's coordinate in its mesh
    global_index: tuple[int, ...] | None = None  # the element's index in the global value


@dataclasses.dataclass(eq=False, repr=False)
class RepairDetails(Details):
    """A value nansafe repaired (kind ``resolved``) or left non-finite (``unresolved``)."""

    rule: str | None = None  # the rule that decided it ("structural zero: ...")
    repaired: int | None = None  # elements set to a finite value
    count: int | None = None  # elements left non-finite
    proven: bool | None = None  # whether the repaired value is the true gradient
    why_unresolved: str | None = None


@dataclasses.dataclass(eq=False, repr=False)
class KinkDetails(Details):
    """A kink, tie or jump the gradient went through (kinds ``kink`` and ``convention``), or a
    branch subgradient could not lock (``unresolved``)."""

    op: str | None = None  # the canonical op
    convention: str | None = None  # the backend's documented convention there
    subdifferential: str | None = None
    value: str | None = None  # the value the backend's rule returned at the first hit
    admissible: bool | None = None  # whether it lies in the subdifferential
    blocked: bool | None = None  # a jump: the gradient through it is blocked (0)
    branches_agree: bool | None = None  # where: the branches agree in value on the boundary
    value_error: str | None = None  # the convention could not be evaluated
    rule: str | None = None  # the rule that gave the value (a custom_jvp rule)
    comparison: str | None = None  # where: the comparison that holds with equality
    trivial_count: int | None = None  # ties whose candidates are the same function
    tie: str | None = None  # "trivial" | "non-trivial"
    tie_note: str | None = None
    missing_catalog_entry: str | None = None
    branch: str | None = None  # subgradient: which piece was locked
    unbroken: int | None = None  # subgradient: ties first-order information cannot break


@dataclasses.dataclass(eq=False, repr=False)
class CertificateDetails(Details):
    """certify's verdict (kind ``certified``; ``resolved`` when nansafe used it as a repair)."""

    label: str | None = None  # "gradient", "clarke-subgradient", "singular", "undecided"
    verdicts: list[dict[str, Any]] | None = None  # per direction, numbers included
    certificate: str | None = None
    differentiable: bool | None = None
    fx0: Any = None  # f(x0)
    terms: int | None = None
    unverified: list[str] | None = None
    rule: str | None = None  # set when nansafe takes the certified gradient as its repair

    ALIASES: ClassVar[Mapping[str, str]] = {"f(x0)": "fx0"}
    KEEP_NONE: ClassVar[frozenset[str]] = frozenset({"differentiable"})


DETAILS_FOR_KIND: dict[str, type[Details]] = {
    "nonfinite": OriginDetails,
    "unresolved": OriginDetails,
    "resolved": RepairDetails,
    "kink": KinkDetails,
    "convention": KinkDetails,
    "certified": CertificateDetails,
}
_ALL_DETAILS: tuple[type[Details], ...] = (
    OriginDetails,
    RepairDetails,
    KinkDetails,
    CertificateDetails,
)


def details_from(kind: str, mapping: Mapping[str, Any] | None) -> Details:
    """Typed details from an untyped mapping (the former ``detail`` dict): the class of
    ``kind`` when it declares every key, else the first class that does, else the class of
    ``kind`` with the undeclared keys in ``extra``."""
    if isinstance(mapping, Details) and type(mapping) is not Details:
        return mapping
    items = dict(mapping or {})
    first = DETAILS_FOR_KIND.get(kind, OriginDetails)
    cls = first
    if not set(items) <= set(first.keys_declared()):
        cls = next((c for c in _ALL_DETAILS if set(items) <= set(c.keys_declared())), first)
    d = cls()
    for k, v in items.items():
        d[k] = v
    return d


# ---- fixes --------------------------------------------------------------------------------------

FixStatus = Literal["verified", "failed", "unverified", "prose"]


@dataclasses.dataclass
class FixProposal:
    """One fix for a finding, built on the syntax tree of the user's statement.

    ``code`` is the rewritten statement as the user pastes it (None for prose advice); the edit
    replaces ``file`` from (``start_line``, ``start_col``) to (``end_line``, ``end_col``) (lines
    1-based, columns 0-based characters) with ``replacement``. ``status`` says whether gradsan
    ran it: ``verified`` (``checked`` says what was compared), ``failed`` (``checked`` says why;
    never printed), ``unverified`` (``checked`` says why gradsan could not run it), ``prose``."""

    summary: str
    code: str | None = None
    backend: str = "jax"
    file: str | None = None
    start_line: int = 0
    start_col: int = 0
    end_line: int = 0
    end_col: int = 0
    replacement: str = ""
    original: str = ""  # the statement's text the edit replaces (a changed file is not patched)
    needs_import: str | None = None  # "gradsan.jax" when the code names gradsan.jax.safe
    value_change: str | None = None  # the change of the forward value the fix states
    status: FixStatus = "unverified"
    checked: str = ""
    gradient: list[float] | None = None  # the fixed gradient at the failing point (flattened)

    def text(self) -> str:
        """The summary and the code, as a report prints them."""
        if self.code is None:
            return self.summary
        return f"{self.summary}\n{self.code}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---- the finding --------------------------------------------------------------------------------


@dataclasses.dataclass
class Finding:
    """One thing gradsan found: where a non-finite value was born, a repair, or a kink.

    ``where`` is always a frame of the user's code; ``library`` names the library function
    (``jnp.linalg.norm``) when the operation ran inside one. ``detail`` holds the typed facts
    of this kind of finding (a plain mapping given here is converted).
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
    # the printed fixes and their records: what gradsan ran after the finding was built, so two
    # findings of the same event compare equal whether or not their fixes were verified yet
    suggestions: list[str] = dataclasses.field(default_factory=list, compare=False)
    # always a Details once built; a plain dict is accepted (and converted) from callers that
    # still write the former untyped ``detail``
    detail: Details | dict[str, Any] = dataclasses.field(default_factory=Details)
    got_value: float | None = None  # the operand value behind ``detail["got"]``, as a number
    # the fixes built on the user's statement, verified first (``suggestions`` is their text)
    fixes: list[FixProposal] = dataclasses.field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.detail, Details) or type(self.detail) is Details:
            self.detail = details_from(self.kind, self.detail)

    @property
    def details(self) -> Details:
        """``detail`` with its type: the typed details of this kind of finding."""
        d = self.detail
        if not isinstance(d, Details):  # a dict assigned after construction
            d = self.detail = details_from(self.kind, d)
        return d

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "detail":
                d["detail"] = dict(v)
            elif f.name == "outputs":
                d["outputs"] = [dataclasses.asdict(o) for o in v]
            elif f.name == "fixes":
                d["fixes"] = [p.to_dict() for p in v]
            elif isinstance(v, Frame):
                d[f.name] = v.to_dict()
            elif isinstance(v, list):
                d[f.name] = list(v)
            else:
                d[f.name] = v
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

    def patch(self) -> str:
        """A unified diff of the user's source files with the first verified fix of each
        finding applied (and ``import gradsan.jax`` / ``import gradsan.torch`` added where the
        file lacks it), for ``git apply`` or ``patch -p1``; "" when no fix was verified."""
        from .._fix import report_patch

        return report_patch(self)

    def to_json(self, **kwargs: Any) -> str:
        from ._json import to_json

        return to_json(self, **kwargs)

    def __repr__(self) -> str:
        ids = ", ".join(sorted({f.catalog_id or f.kind for f in self.findings}))
        return f"Report(ok={self.ok}, findings=[{ids}])"
