"""What a backend emits: text-free records of what it saw.

A backend (``gradsan.torch``, ``gradsan.jax``) records facts only: numbers, first indices,
Frames, catalog entry ids, operation names, dtypes and counts. It writes no sentence. The one
builder, :mod:`gradsan._report._build`, turns each record into a :class:`gradsan.Finding`,
attaching the catalog entry's words and the fixed sentences of :mod:`gradsan._report._messages`;
the renderers (text, JSON, HTML) only render Findings.

The records:

- :class:`Origin`: a non-finite value born at one operation (or already in an input), with the
  :class:`Poison` where an inf met a zero on its way to the outputs.
- :class:`Kink`: a kink, tie or jump the gradient went through, with the backend's value there.
- :class:`Repair`: nansafe set non-finite gradient elements to a finite value, and why.
- :class:`Unresolved`: nansafe left non-finite gradient elements as they are, and why.
- :class:`Certificate`: certify's verdict: the label, the per-direction verdicts, the reason.

How the JAX backends map onto them (tests/report/test_build.py builds each one and checks it
against the Finding the backend writes itself today, so a port can be checked the same way):

- jax/_explain.py ``_origin_finding`` -> :class:`Origin` (``_poison_details`` -> :class:`Poison`:
  ``op_class``, the operand values at the first NaN, which operand held the zero); the shard_map,
  constant-infs and not-in-catalog explanations -> ``Origin.because``; ``Blame`` -> gradsan/_blame.py
  with the adapter in tests/report/test_blame.py (``JaxGraph``, checked against ``Blame``).
- jax/_sanitize.py ``kink_finding`` and jax/_subgradient.py ``_finding`` -> :class:`Kink`
  (``convention(k)``'s value and admissibility -> ``Kink.facts``; their sentences are in
  ``_messages``: ``CONVENTION_*``, ``VALUE_*``, ``BRANCH_*``).
- jax/_nansafe.py ``_Emitter._finding`` -> :class:`Repair` / :class:`Unresolved`; the merge in
  ``build_report`` (which patches the count into rendered text with ``str.replace``) ->
  ``_report._build.merged`` on the events, before any text is written.
- jax/certify/_api.py ``_combine`` -> :class:`Certificate` (its label, certificate text and title
  come from ``Verdict`` and the slots).

Where one fact has several fixed wordings (a note on the headline, the reason for a repair),
the record names it with a member of a small enum (:class:`Note`, :class:`Because`,
:class:`Rule`, :class:`Verdict`) and the values that fill its slots; the words live in
``_report/_messages.py``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from ._report._records import Frame, OutputHit

Index = tuple[int, ...]


class Note(enum.Enum):
    """The clause an origin's headline adds in parentheses."""

    DERIVATIVE_IS = "derivative-is"  # the derivative of the forward op is `note_value` there
    DERIVATIVE_RULE_NAN = "derivative-rule-nan"  # the derivative rule gave nan there
    RETURNED = "returned"  # the operation returned `note_value`
    CUSTOM_VJP_RULE = "custom-vjp-rule"  # born in a custom_vjp backward rule called at a Frame


class Because(enum.Enum):
    """Why an origin has no catalog explanation of its own (the builder writes one)."""

    SHARD_MAP = "shard-map"  # born inside a shard_map body, which is not interpreted yet
    CONSTANT_INFS = "constant-infs"  # a NaN made from infinite constants (a -inf mask)
    NOT_IN_CATALOG = "not-in-catalog"  # an operation the catalog does not know


class ZeroKind(enum.Enum):
    """What made the zero factor of an indeterminate product (0 * inf, 0 / 0) exactly zero."""

    WHERE = "where"  # an unselected where/select branch: its gradient (or value) is 0
    NAN_TO_NUM = "nan-to-num"  # nan_to_num replaced the value; the replaced element's gradient is 0
    MASK = "mask"  # a product with a constant mask (a constant holding zeros)
    # a product with an input of the function that holds zeros (a mask passed as an argument,
    # differentiated like any other): not one of the factors the non-finite value came from
    INPUT_MASK = "input-mask"
    SLICE = "slice"  # a slice, gather or indexing dropped the element: its gradient is 0
    CONSTANT = "constant"  # a constant of the program (a literal 0, one-hot labels, a mask)
    INPUT = "input"  # the zero is in an input of the function
    DERIVATIVE = "derivative"  # a derivative that vanishes there (d(x**2)/dx at 0, 0 ** theta)
    UNDERFLOW = "underflow"  # a finite result rounded to exactly 0 (exp(-200) in float32)
    BY_DESIGN = "by-design"  # exactly 0 by design: exp(-inf) (the weight of a -inf mask)
    CANCEL = "cancel"  # a difference of equal values (x - x)
    STOP = "stop"  # no gradient flows along this path (an integer or stop_gradient)
    VALUE = "value"  # an operation whose value is 0 there (floor(0.5), relu of a negative)


class Rule(enum.Enum):
    """How nansafe decided a value."""

    STRUCTURAL = "structural"  # a structurally zero path: 0 * inf := 0 is exact
    STRONG_ZERO = "strong-zero"  # mode="strong_zero": 0 * inf := 0 as a convention
    NUMERICAL = "numerical"  # the zero is numerical: left non-finite
    LIMIT = "limit"  # the limit engine (certify) gave the gradient


@dataclasses.dataclass(frozen=True)
class Poison:
    """The operation where an infinity met a zero (or another infinity) and made a NaN."""

    op: str  # the backend operation ("aten.mul", "mul")
    where: Frame | None
    form: str | None  # "0*inf", "0/0", "inf-inf", "inf/inf"
    node: str | None = None  # torch: the autograd Node the op ran in
    backward: bool = False  # jax: the op is in the backward pass
    # how the op combines its operands, which picks the form's wording: "mul", "div", "sum"
    # (add, sub, reductions by sum), "product" (dot_general and other sums of products), ""
    op_class: str = ""
    operands: tuple[Any, ...] | None = None  # operand values at the first NaN (None: unread)
    zero_operand: int | None = None  # which operand held the zero
    zero_from: Frame | None = None  # where that zero was computed
    zero_constant: bool = False  # the zero is a constant of the program
    # what made the zero exact (the operation at ``zero_from``), followed back along the dataflow
    zero_kind: ZeroKind | None = None
    zero_op: str = ""  # the backend operation that made it ("select_n", "aten.where")
    zero_text: str = ""  # WHERE: the condition's source text; INPUT/CONSTANT: the value's name
    zero_value: str = ""  # UNDERFLOW/BY_DESIGN: the operand that made it (formatted)
    index: Index | None = None  # the first NaN


@dataclasses.dataclass(frozen=True)
class Origin:
    """A non-finite value born at one operation, or already present in an input."""

    backend: str
    op: str  # the operation as the report names it ("sqrt", "input", "constant")
    where: Frame | None
    phase: str  # "value" | "gradient"
    result: str  # what reached the outputs: "nan" | "inf" | "-inf" (jax: a formatted value)
    produced: str = ""  # what the operation itself produced, when it differs ("inf")
    entry_id: str | None = None
    backend_op: str = ""  # the backend operation that produced it ("aten.div in SqrtBackward0")
    got: str | None = None  # the operand value the entry's predicate saw, formatted
    got_value: float | None = None  # the same value as a number
    count: int = 0
    size: int = 0
    index: Index | None = None
    dtype: str | None = None
    library: str | None = None
    context: str = ""
    scope: str = ""
    outputs: tuple[OutputHit, ...] = ()
    input: str | None = None  # a non-finite input (entry nonfinite-input): its name
    held: str = ""  # what that input holds: "nan" (torch), the first non-finite value (jax)
    constant: bool = False  # that input is a constant of the program
    origin_op: str | None = None  # jax: the primitive that produced it
    node: str | None = None  # torch: the autograd Node that produced it
    backward: bool = False  # jax: the producing equation is in the backward pass
    note: Note | None = None
    note_value: str = ""  # the slot of DERIVATIVE_IS and RETURNED
    # the forward operation's own value is an indeterminate form of finite operands at the
    # first hit ("0/0": x / y with x == y == 0), whatever the origin node is (a derivative's
    # coefficient): the value is NaN there, no inf was born from the user's point of view
    value_form: str = ""
    # a std/var: how many elements it reduced over, and its ddof (torch: correction), when seen
    reduced: int | None = None
    ddof: float | None = None
    custom_vjp_call: Frame | None = None  # the slot of CUSTOM_VJP_RULE
    poison: Poison | None = None
    because: Because | None = None
    body_op: str = ""  # SHARD_MAP: the body's first operation
    unresolved: bool = False  # nansafe looked at it and left it non-finite (the zero is numerical)
    device: int | None = None  # jax: the device it was born on (shard_map, sharded jit)
    mesh_coordinate: Mapping[str, int] | None = None  # that device's place in its mesh
    global_index: Index | None = None  # the element's index in the global (unsharded) value


@dataclasses.dataclass(frozen=True)
class Kink:
    """A kink, tie or jump the gradient went through, and the backend's value there."""

    backend: str
    entry_id: str
    op: str  # the canonical op ("abs", "max", "where")
    primitive: str  # the operation as the report names it
    where: Frame | None
    backend_op: str = ""
    got: str | None = None  # the operand value at the first hit, formatted
    got_value: float | None = None
    count: int = 0
    size: int = 0
    index: Index | None = None
    library: str | None = None
    context: str = ""
    scope: str = ""
    comparison: str | None = None  # where: the comparison primitive that holds with equality
    trivial: int | None = None  # ties whose candidates are the same function (None: not checked)
    tied: int | None = None  # the ties ``trivial`` was counted among (None: all ``count``)
    admissible: bool | None = None  # the backend's value lies in the subdifferential
    inadmissible_convention: bool = False  # the backend's value is never admissible here
    # facts about the backend's value at the first hit (value, blocked, branches_agree,
    # unbroken, ...): the keys of KinkDetails
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    unresolved: bool = False  # subgradient could not lock a branch


@dataclasses.dataclass(frozen=True)
class Repair:
    """nansafe set ``count`` non-finite gradient elements to a finite value."""

    backend: str
    rule: Rule
    op: str  # the operation as the report names it
    where: Frame | None
    backend_op: str = ""  # the operation whose gradient was repaired
    met_op: str = ""  # the operation that computed 0 * inf
    entry_id: str | None = None
    count: int = 0
    size: int = 0
    library: str | None = None
    scope: str = ""
    form: str | None = None
    reasons: tuple[str, ...] = ()  # STRUCTURAL: why the path is zero ("unselected where branch")
    margins: tuple[float | None, ...] = ()  # per reason: the comparison's margin, if known
    proven: bool = True
    node: str | None = None  # torch: the autograd Node whose gradient was repaired
    backward: bool = False  # jax: the repaired equation is in the backward pass


@dataclasses.dataclass(frozen=True)
class Unresolved:
    """nansafe left ``count`` non-finite gradient elements as they are."""

    backend: str
    op: str
    where: Frame | None
    backend_op: str = ""
    met_op: str = ""
    entry_id: str | None = None
    count: int = 0
    library: str | None = None
    form: str | None = None
    backward: bool = False


class Verdict(enum.Enum):
    """certify's overall reason, which picks the certificate's wording."""

    GRADIENT = "gradient"
    CLARKE_TWO_LIMITS = "clarke-two-limits"  # two different limits of the gradient
    CLARKE_KINK = "clarke-kink"  # f'(x0; v) + f'(x0; -v) != 0
    SINGULAR = "singular"  # a ray was singular or discontinuous
    DISCONTINUOUS = "discontinuous"  # f(x0) is NaN and rays tend to different values
    UNDECIDED = "undecided"
    DOMAIN = "domain"  # every ray leaves the domain


@dataclasses.dataclass(frozen=True)
class Certificate:
    """certify's verdict on the gradient of a loss at a point."""

    verdict: Verdict
    where: Frame | None
    output: str  # the argument whose gradient was certified
    size: int  # its number of elements
    verdicts: Sequence[Mapping[str, Any]] = ()  # per direction, with numbers
    differentiable: bool | None = None
    fx0: Any = None
    terms: int = 0
    unverified: tuple[str, ...] = ()
    # the slots of the verdict's wording
    ray_verdict: str = ""  # SINGULAR: the first singular ray's verdict
    ray_certificate: str = ""  # SINGULAR: its certificate
    ray_notes: tuple[str, ...] = ()  # UNDECIDED: the first undecided ray's notes
    limits: tuple[float, float] = (0.0, 0.0)  # DISCONTINUOUS: the two limits
    directions: tuple[int, int] = (0, 0)  # DISCONTINUOUS: their directions
    domain_rays: int = 0  # GRADIENT: rays that left the domain (one-sided)
    removable: bool = False  # GRADIENT: f(x0) is NaN but the singularity is removable


Event = Origin | Kink | Repair | Unresolved | Certificate
