"""Events -> Findings: the one place where what a backend saw becomes the words a user reads.

Backends emit the text-free records of :mod:`gradsan._events`; :func:`build` attaches the
catalog entry's title, explanation, derivative and fixes, and the fixed sentences of
``_messages.py``. :func:`catalog_finding` is the lower layer (a Finding from a catalog id and
its common fields), which the JAX backends still call directly until they emit events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import _catalog, _fix
from .._events import (
    Because,
    Certificate,
    Event,
    Kink,
    Note,
    Origin,
    Poison,
    Repair,
    Rule,
    Unresolved,
    Verdict,
    ZeroKind,
)
from . import _messages as M
from . import _zero
from ._format import format_value
from ._records import (
    CertificateDetails,
    Details,
    Finding,
    FixProposal,
    Frame,
    KinkDetails,
    OriginDetails,
    OutputHit,
    RepairDetails,
    details_from,
)


def describe_values(op: str, got: str, count: int, size: int, index: Sequence[int] | None) -> str:
    """``sqrt got 0.0 in 2 of 4 elements, first at [0, 1]``."""
    s = f"{op} got {got}"
    if size > 1:
        s += f" in {count} of {size} elements"
        if index:
            s += f", first at [{', '.join(str(i) for i in index)}]"
    return s


def suggestions(entry_id: str | None, backend: str, where: Frame | None = None) -> list[str]:
    """The printed text of the fixes of ``entry_id`` at ``where`` (see :func:`fix_proposals`)."""
    return _fix.render_suggestions(fix_proposals(entry_id, backend, where))


def fix_proposals(entry_id: str | None, backend: str, where: Frame | None) -> list[FixProposal]:
    """The catalog entry's fixes written on the user's statement (gradsan._fix), not yet run:
    each code fix says so until the entry point that holds the program verifies it."""
    out = _fix.proposals(entry_id, backend, where)
    for p in out:
        if p.code is not None and p.status == "unverified" and not p.checked:
            p.checked = _fix.NOT_RUN
    return out


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
    detail: Mapping[str, Any] | None = None,
    got_value: float | None = None,
) -> Finding:
    """A Finding whose title, explanation and fixes come from catalog entry ``entry_id``.

    ``detail``: typed details (or a plain mapping of their keys, converted)."""
    entry = None
    entry_id = _fix.route(entry_id, backend, where)  # log2/log10, exp(p * log a): own entries
    if entry_id is not None:
        try:
            entry = _catalog.get(entry_id)
        except KeyError:
            entry = None
    details: Details = details_from(kind, detail)
    if got is not None:
        details.setdefault("got", got)
    if entry is not None:
        details.setdefault("derivative", entry.derivative)
    values = describe_values(primitive, got, count, size, index) if got is not None else ""
    fixes = fix_proposals(entry_id, backend, where)
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
        suggestions=_fix.render_suggestions(fixes),
        fixes=fixes,
        detail=details,
        got_value=got_value,
    )


# ---- events -> findings -------------------------------------------------------------------------


def _format(v: Any) -> str:
    return format_value(v)


def _index_list(index: Sequence[int]) -> str:
    return ", ".join(str(i) for i in index)


def _note(ev: Origin) -> str | None:
    form = M.VALUE_FORMS.get(ev.value_form)
    if form is not None:  # the values seen: 0.0 / 0.0, whatever node the origin is
        if ev.phase == "value" or ev.note in (None, Note.RETURNED):
            return M.NOTE_VALUE_FORM.format(form=form)
        return M.NOTE_VALUE_FORM_TOO.format(form=form)
    if ev.note is None and _no_dof(ev):
        return M.NOTE_ONE_ELEMENT.format(ddof=_number(ev.ddof if ev.ddof is not None else 1))
    if ev.note is Note.DERIVATIVE_IS:
        return M.NOTE_DERIVATIVE_IS.format(value=ev.note_value)
    if ev.note is Note.DERIVATIVE_RULE_NAN:
        return M.NOTE_DERIVATIVE_RULE_NAN
    if ev.note is Note.RETURNED:
        return M.NOTE_RETURNED.format(value=ev.note_value)
    if ev.note is Note.CUSTOM_VJP_RULE:
        return M.NOTE_CUSTOM_VJP_RULE.format(call=ev.custom_vjp_call)
    return None


def form_text(p: Poison) -> str:
    """The indeterminate form in numbers: ``0.0 * inf = nan``."""
    vals = p.operands
    pair = vals is not None and len(vals) == 2 and all(v is not None for v in vals)
    if p.op_class == "mul":
        if pair and p.form in ("0*inf", "0*nan"):
            assert vals is not None
            return M.FORM_PRODUCT.format(a=_format(vals[0]), b=_format(vals[1]))
        return ""
    if p.op_class == "div":
        if pair and p.form == "0/0":
            return M.FORM_ZERO_OVER_ZERO
        if pair and p.form in ("inf/inf", "0*nan"):
            assert vals is not None
            return M.FORM_QUOTIENT.format(a=_format(vals[0]), b=_format(vals[1]))
        return ""
    if p.op_class == "sum":
        return M.FORM_SUM
    if p.op_class == "product":
        return M.FORM_INSIDE.format(op=p.op)
    return M.FORM_OF_INFINITE.format(op=p.op)


def _zero_sentence(ev: Origin, p: Poison, zero_from: Frame | None) -> str:
    """The zero's clause; when the origin's own value is 0 / 0 and the zero is made on its
    line, the zero is its own operand (the derivative of x / y reads x == 0), said as such."""
    if ev.value_form == "0/0" and zero_from is not None and zero_from == ev.where:
        expr = _zero.expression(zero_from)
        return M.ZERO_OWN_FORM.format(code=f"`{expr}`" if expr else M.ZERO_THIS_OPERATION)
    return _zero.sentence(p, zero_from)


def met_clause(ev: Origin, zero_from: Frame | None, met_where: Frame | None) -> str | None:
    """The headline's words for where the non-finite value met a zero, from the values seen:
    the value that met the zero (inf, -inf, nan), a 0 / 0, or an opposite infinity."""
    p = ev.poison
    if p is None or not p.form:
        return None
    if p.form == "0/0":
        return M.HEAD_ZERO_OVER_ZERO.format(zero=zero_from) if zero_from is not None else None
    if p.form in ("0*inf", "0*nan") and zero_from is not None:
        text = form_text(p)
        if ev.value_form and text:  # no inf was born from the user's view: the value is 0 / 0
            return M.HEAD_IN_DERIVATIVE.format(form=text, zero=zero_from)
        value = "nan" if p.form == "0*nan" else _met_value(ev, p)
        return M.HEAD_MET_ZERO.format(value=value, zero=zero_from)
    if p.form == "inf-inf" and met_where is not None:
        return M.HEAD_OPPOSITE_INF.format(value=_met_value(ev, p), where=met_where)
    return None


def _met_value(ev: Origin, p: Poison) -> str:
    """The non-finite value the origin produced (what met the zero), as seen; for a NaN made
    from constant infinities (its own form), the infinite operand."""
    ops = p.operands
    if ev.because is Because.CONSTANT_INFS and ops is not None and p.zero_operand in (0, 1):
        other = ops[1 - p.zero_operand] if len(ops) == 2 else None
        if other is not None:
            return format_value(other)
    v = ev.produced or ev.result
    if v in ("inf", "-inf", "nan"):
        return v
    try:
        f = float(v)
    except ValueError:
        return "inf"
    return format_value(f) if f != f or f in (float("inf"), float("-inf")) else "inf"


def _met(ev: Origin, detail: OriginDetails) -> tuple[Frame | None, Frame | None, str | None]:
    """(zero_from, met_where, met_op) of an origin's poison; fills the met_* details."""
    p = ev.poison
    if p is None:
        return None, None, None
    if p.zero_kind is not None:
        detail.zero_kind = p.zero_kind.value
    if ev.backend == "torch":
        if not p.form:
            return None, None, None
        met_op = M.MET_OP_IN_NODE.format(op=p.op, node=p.node) if p.node is not None else p.op
        text = form_text(p) if p.operands is not None else ""
        if text:  # the values seen, in JAX's words: 0.0 * -inf = nan
            detail.met_text = M.MET_TORCH_VALUES.format(text=text, met_op=met_op)
        else:
            detail.met_text = M.MET_TORCH.format(form=p.form, met_op=met_op)
        if p.form in ("0*inf", "0*nan"):
            detail.met_value = "nan" if p.form == "0*nan" else _met_value(ev, p)
        zero = _zero_sentence(ev, p, p.zero_from)
        if zero:
            detail.met_text = M.ZERO_AND.format(zero=zero, form=detail.met_text)
        return p.zero_from, p.where if p.form == "inf-inf" else None, met_op
    text = form_text(p)
    phase = M.MET_JAX_BACKWARD if p.backward else ""
    met_text = M.MET_JAX.format(text=text, phase=phase, op=p.op) if text else ""
    detail.met_value = ev.produced or ev.result
    if p.form == "0/0":  # g / x with g == 0 and x == 0: a zero met a zero divisor
        detail.met_value = "0.0"
    zero_from = None
    if p.zero_operand is not None:
        zero_from = p.zero_from
        zero = _zero_sentence(ev, p, zero_from)
        if zero and met_text:
            met_text = M.ZERO_AND.format(zero=zero, form=met_text)
        elif p.zero_constant:
            met_text += M.MET_ZERO_CONSTANT
        else:
            met_text = M.MET_ZERO_HERE + met_text
    detail.met_text = met_text
    if p.form == "inf-inf":
        zero_from = None
    return zero_from, p.where, p.op


def _input_values(ev: Origin) -> str:
    n = ev.count
    if ev.backend == "torch":
        first = M.INPUT_FIRST_TORCH.format(index=_index_list(ev.index or ())) if ev.size > 1 else ""
        return M.INPUT_VALUES_TORCH.format(
            name=ev.input, result=ev.held, count=n, size=ev.size, first=first
        )
    label = ev.input if ev.constant else f"`{ev.input}`"
    first = M.INPUT_FIRST_JAX.format(index=list(ev.index)) if ev.index else ""
    return M.INPUT_VALUES_JAX.format(label=label, got=ev.held, count=n, size=ev.size, first=first)


def origin(ev: Origin) -> Finding:
    """The Finding of a non-finite origin."""
    detail = OriginDetails(
        input=ev.input,
        origin_op=ev.origin_op,
        node=ev.node,
        device=ev.device,
        mesh_coordinate=dict(ev.mesh_coordinate) if ev.mesh_coordinate is not None else None,
        global_index=ev.global_index,
    )
    if ev.custom_vjp_call is not None:
        detail.custom_vjp_call = str(ev.custom_vjp_call)
    detail.note = _note(ev)
    if ev.unresolved:
        detail.why_unresolved = M.WHY_UNRESOLVED_TORCH
    backend_op = ev.backend_op
    if ev.node is not None:
        backend_op = M.MET_OP_IN_NODE.format(op=ev.backend_op, node=ev.node)
    if ev.backward:
        backend_op += " (backward)"
    # a NaN made from constant infinities: the poison is the origin's own form, met nowhere
    # else; where a zero made it (0 * -inf: exp(-inf) = 0 times the mask), that zero is named
    own = ev.because is Because.CONSTANT_INFS and (
        ev.poison is None or ev.poison.zero_operand is None
    )
    zero_from, met_where, met_op = (None, None, None) if own else _met(ev, detail)
    if not own:
        detail.met_clause = met_clause(ev, zero_from, met_where)
    f = catalog_finding(
        backend=ev.backend,
        entry_id=ev.entry_id,
        kind="unresolved" if ev.unresolved else "nonfinite",
        phase=ev.phase,
        primitive=ev.op,
        where=ev.where,
        result=ev.result,
        backend_op=backend_op,
        got=ev.got,
        count=ev.count,
        size=ev.size,
        index=ev.index,
        library=ev.library,
        zero_from=zero_from,
        form=ev.poison.form if ev.poison is not None else None,
        met_op=met_op,
        met_where=met_where,
        context=ev.context,
        scope=ev.scope,
        outputs=ev.outputs,
        detail=detail,
        got_value=ev.got_value,
    )
    if ev.input is not None:
        f.values = _input_values(ev)
    if ev.reduced == 1 and ev.because is None:
        _one_element(f, ev)
    elif ev.poison is not None and ev.poison.zero_kind is ZeroKind.WHERE and ev.because is None:
        _where_trap(f, ev, zero_from)
    elif ev.because is None and f.explanation:
        observed = _observed_why(ev, zero_from)
        if observed:
            f.explanation = observed + " " + f.explanation
    if ev.because is Because.SHARD_MAP:
        f.primitive = ev.body_op or "shard_map"
        f.library = "shard_map"
        f.explanation = M.SHARD_MAP.format(op=f.primitive)
    elif ev.because is Because.CONSTANT_INFS:
        p = ev.poison
        f.explanation = M.CONSTANT_INFS.format(
            op=ev.origin_op or ev.op, text=(form_text(p) if p else "") or M.CONSTANT_INFS_NAN
        )
    elif ev.because is Because.NOT_IN_CATALOG:
        f.explanation = M.NOT_IN_CATALOG.format(op=ev.origin_op or ev.op, result=ev.result)
    return f


_NEGATIVE_ENTRIES = ("sqrt-of-negative", "log-of-negative", "pow-negative-base")
_BY_DESIGN = {
    ZeroKind.MASK: "a mask",
    ZeroKind.INPUT_MASK: "a mask passed as an argument",
    ZeroKind.SLICE: "a slice or index drops it",
    ZeroKind.CONSTANT: "a constant of the program",
    ZeroKind.NAN_TO_NUM: "nan_to_num replaced it",
    ZeroKind.BY_DESIGN: "exp(-inf) = 0",
}


def _observed_why(ev: Origin, zero_from: Frame | None) -> str:
    """A sentence from the values this report saw, put before the entry's generic words."""
    if ev.value_form == "0/0":
        return M.WHY_ZERO_OVER_ZERO.format(op=ev.op)
    if ev.entry_id in _NEGATIVE_ENTRIES and ev.got is not None:
        try:
            v = float(ev.got) if ev.got_value is None else ev.got_value
        except ValueError:
            return ""
        if v < 0:
            tmpl = M.WHY_REAL_NEGATIVE if v <= -1e-4 else M.WHY_ROUNDING_NEGATIVE
            return tmpl.format(op=ev.op, got=ev.got)
    p = ev.poison
    if p is None or p.zero_kind is None:
        return ""
    if ev.entry_id == "log-at-zero" and p.zero_kind in _BY_DESIGN:
        return M.WHY_ZERO_BY_DESIGN.format(op=ev.op, what=_BY_DESIGN[p.zero_kind])
    if p.zero_kind is ZeroKind.UNDERFLOW:
        what = f"`{_zero.expression(zero_from)}`" if _zero.expression(zero_from) else "exp"
        return M.WHY_ZERO_UNDERFLOW.format(what=what)
    return ""


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _no_dof(ev: Origin) -> bool:
    """A std/var over one element with ddof >= 1: n - ddof <= 0, the value is 0 / 0."""
    return ev.reduced == 1 and (ev.value_form == "0/0" or (ev.ddof is not None and ev.ddof >= 1))


def _one_element(f: Finding, ev: Origin) -> None:
    """A std/var over a single element: n - ddof = 0 (0 / 0 in the value), or the derivative
    of sqrt(0) (ddof = 0); its own case, not the constant data of the entry's words."""
    op = ev.library or (f"torch.{ev.op}" if ev.backend == "torch" else ev.op)
    if _no_dof(ev):
        ddof = _number(ev.ddof if ev.ddof is not None else 1)
        f.explanation = M.WHY_ONE_ELEMENT_NO_DOF.format(op=op, ddof=ddof)
        what = M.TITLE_ONE_ELEMENT_NO_DOF
    else:
        f.explanation = M.WHY_ONE_ELEMENT_SQRT.format(op=op)
        what = M.TITLE_ONE_ELEMENT_SQRT
    f.title = M.TITLE_ONE_ELEMENT.format(op=op, what=what)
    f.detail["reduced"] = 1


WHERE_TRAP = "where-trap"


def _where_trap(f: Finding, ev: Origin, zero_from: Frame | None) -> None:
    """The where trap: the where that did not select the branch explains the NaN. Its entry's
    title and explanation lead, and its double-where fix comes first, in the user's names."""
    try:
        entry = _catalog.get(WHERE_TRAP)
    except KeyError:
        return
    f.title = entry.title
    f.explanation = entry.explanation
    first = _fix.where_trap_proposals(entry.fixes[0].summary, ev.where, zero_from, ev.backend)
    for p in first:
        if not p.checked:
            p.checked = _fix.NOT_RUN
    same = {p.replacement for p in first}
    f.fixes = first + [p for p in f.fixes if p.code is None or p.replacement not in same]
    f.suggestions = _fix.render_suggestions(f.fixes)
    f.detail["zero_entry"] = WHERE_TRAP


def kink(ev: Kink) -> Finding:
    """The Finding of a kink (or of a convention outside the admissible set)."""
    detail = KinkDetails(op=ev.op if ev.backend == "jax" else None)
    try:
        entry = _catalog.get(ev.entry_id)
    except KeyError:
        detail.missing_catalog_entry = ev.entry_id
    else:
        conv = entry.conventions.get(ev.backend)
        if conv:
            detail.convention = conv
        detail.subdifferential = entry.subdifferential
        if ev.backend == "jax" and entry.kind == "discontinuity" and not entry.subdifferential:
            detail.subdifferential = M.SUBDIFFERENTIAL_JUMP
    for k, v in ev.facts.items():
        detail[k] = v
    if ev.comparison is not None:
        detail.comparison = M.WHERE_COMPARISON.format(op=ev.comparison)
    if ev.trivial is not None:
        detail.trivial_count = ev.trivial
        tied = ev.tied if ev.tied is not None else ev.count
        detail.tie = "trivial" if ev.trivial == tied else "non-trivial"
        if detail.tie == "trivial":
            detail.tie_note = M.TIE_TRIVIAL
    if ev.admissible is not None:
        detail.admissible = ev.admissible
    if ev.inadmissible_convention:
        detail.admissible = False
    return catalog_finding(
        backend=ev.backend,
        entry_id=ev.entry_id,
        kind="unresolved"
        if ev.unresolved
        else "convention"
        if ev.inadmissible_convention
        else "kink",
        phase="gradient",
        primitive=ev.primitive,
        where=ev.where,
        result="finite",
        backend_op=ev.backend_op,
        got=ev.got,
        count=ev.count,
        size=ev.size,
        index=ev.index,
        library=ev.library,
        context=ev.context,
        scope=ev.scope,
        detail=detail,
        got_value=ev.got_value,
    )


def _rule_text(ev: Repair) -> str:
    if ev.rule is Rule.STRONG_ZERO:
        return M.RULE_STRONG_ZERO
    if ev.backend == "torch":
        return M.RULE_STRUCTURAL_TORCH
    reasons = []
    for reason, margin in zip(ev.reasons, ev.margins or (None,) * len(ev.reasons)):
        if reason == M.REASON_UNSELECTED and margin is not None and margin == margin:
            if abs(margin) != float("inf"):
                reason += M.REASON_MARGIN.format(margin=margin)
        reasons.append(reason)
    return M.RULE_STRUCTURAL.format(
        reasons="; ".join(dict.fromkeys(reasons)) or M.RULE_STRUCTURAL_ANY
    )


def repair(ev: Repair) -> Finding:
    """The Finding of a nansafe repair."""
    detail = RepairDetails(rule=_rule_text(ev), repaired=ev.count)
    if ev.backend != "torch":
        detail.proven = ev.proven
    if ev.rule is Rule.STRONG_ZERO:
        detail.note = M.NOTE_STRONG_ZERO
    f = catalog_finding(
        backend=ev.backend,
        entry_id=ev.entry_id,
        kind="resolved",
        phase="gradient",
        primitive=ev.op,
        where=ev.where,
        result="finite",
        backend_op=ev.backend_op + (" (backward)" if ev.backward else ""),
        count=ev.count,
        size=ev.size,
        library=ev.library,
        form=ev.form,
        met_op=ev.met_op or None,
        met_where=ev.where if ev.met_op else None,
        scope=ev.scope,
        detail=detail,
    )
    if ev.backend == "torch":
        f.values = M.REPAIRED_TORCH.format(count=ev.count, node=ev.node or ev.backend_op)
    elif ev.rule is Rule.STRONG_ZERO:
        f.values = M.REPAIRED_STRONG_ZERO.format(count=ev.count, op=ev.met_op)
    else:
        f.values = M.REPAIRED_STRUCTURAL.format(count=ev.count, op=ev.met_op)
    return f


def unresolved(ev: Unresolved) -> Finding:
    """The Finding of a value nansafe left non-finite."""
    detail = RepairDetails(
        rule=M.RULE_NUMERICAL,
        count=ev.count,
        why_unresolved=M.WHY_UNRESOLVED_JAX,
        note=M.NOTE_NUMERICAL,
    )
    f = catalog_finding(
        backend=ev.backend,
        entry_id=ev.entry_id,
        kind="unresolved",
        phase="gradient",
        primitive=ev.op,
        where=ev.where,
        result="nan",
        backend_op=ev.backend_op + (" (backward)" if ev.backward else ""),
        count=ev.count,
        size=0,
        library=ev.library,
        form=ev.form,
        met_op=ev.met_op or None,
        met_where=ev.where if ev.met_op else None,
        detail=detail,
    )
    f.values = M.STAYED_NAN.format(count=ev.count, op=ev.met_op)
    return f


def merged(events: Iterable[Event]) -> list[Event]:
    """Repairs (and unresolved values) of one operation at one place as one event whose count
    is the sum: counts are added before the words are written, never in rendered text."""
    out: list[Event] = []
    at: dict[tuple, int] = {}
    for ev in events:
        if isinstance(ev, (Repair, Unresolved)):
            rule = _rule_text(ev) if isinstance(ev, Repair) else None
            k = (type(ev), ev.where, ev.op, rule)
            i = at.get(k)
            if i is not None:
                prev = out[i]
                assert isinstance(prev, (Repair, Unresolved))
                out[i] = dataclasses.replace(prev, count=prev.count + ev.count)
                continue
            at[k] = len(out)
        out.append(ev)
    return out


def certificate_text(ev: Certificate) -> str:
    """The certificate, in words, of certify's verdict."""
    v = ev.verdict
    if v is Verdict.DISCONTINUOUS:
        lo, hi = ev.limits
        i, k = ev.directions
        cert = M.CERT_RAY.format(
            verdict="DISCONTINUOUS", certificate=M.CERT_DISCONTINUOUS.format(lo=lo, i=i, hi=hi, k=k)
        )
    elif v is Verdict.SINGULAR:
        cert = M.CERT_RAY.format(verdict=ev.ray_verdict, certificate=ev.ray_certificate)
    elif v is Verdict.UNDECIDED:
        return M.CERT_UNDECIDED.format(notes="; ".join(ev.ray_notes or (M.CERT_UNDECIDED_DEFAULT,)))
    elif v is Verdict.DOMAIN:
        return M.CERT_DOMAIN
    elif v is Verdict.GRADIENT:
        cert = M.CERT_GRADIENT
        if ev.domain_rays:
            cert += M.CERT_ONE_SIDED.format(domain=ev.domain_rays, total=len(ev.verdicts))
        if ev.removable:
            cert += M.CERT_REMOVABLE
        return cert
    else:
        why = M.CERT_TWO_LIMITS if v is Verdict.CLARKE_TWO_LIMITS else M.CERT_KINK
        return M.CERT_CLARKE.format(why=why)
    if ev.differentiable is False:
        cert += M.CERT_NOT_DIFFERENTIABLE
    return cert


_LABELS = {
    Verdict.GRADIENT: "gradient",
    Verdict.CLARKE_TWO_LIMITS: "clarke-subgradient",
    Verdict.CLARKE_KINK: "clarke-subgradient",
    Verdict.SINGULAR: "singular",
    Verdict.DISCONTINUOUS: "singular",
    Verdict.DOMAIN: "singular",
    Verdict.UNDECIDED: "undecided",
}


def certificate(ev: Certificate) -> Finding:
    """The Finding (kind ``certified``) of certify's verdict."""
    label = _LABELS[ev.verdict]
    cert = certificate_text(ev)
    title = M.CERTIFIED_TITLES[label]
    lines = [cert]
    for d in ev.verdicts:
        line = M.CERT_DIRECTION.format(direction=d["direction"], verdict=d["verdict"])
        if d.get("certificate"):
            line += M.CERT_DIRECTION_CERTIFICATE.format(certificate=d["certificate"])
        if d.get("notes"):
            line += M.CERT_DIRECTION_NOTES.format(notes="; ".join(d["notes"]))
        lines.append(line)
    detail = CertificateDetails(
        label=label,
        verdicts=list(ev.verdicts),  # type: ignore[arg-type]
        certificate=cert,
        differentiable=ev.differentiable,
        fx0=ev.fx0,
        terms=ev.terms,
        unverified=sorted(ev.unverified),
    )
    return Finding(
        kind="certified",
        catalog_id=None,
        phase="gradient",
        primitive="gradsan.jax.certify",
        where=ev.where,
        result=title,
        title=title,
        explanation="\n".join(lines),
        detail=detail,
        outputs=[OutputHit(path=ev.output, count=ev.size, size=ev.size, kind="grad")],
    )


def certificate_notes(ev: Certificate) -> list[str]:
    """The report notes of certify's verdict."""
    if not ev.unverified:
        return []
    return [M.UNVERIFIED.format(ops=", ".join(sorted(ev.unverified)))]


def build(ev: Event) -> Finding:
    """The Finding of any event."""
    if isinstance(ev, Origin):
        return origin(ev)
    if isinstance(ev, Kink):
        return kink(ev)
    if isinstance(ev, Repair):
        return repair(ev)
    if isinstance(ev, Unresolved):
        return unresolved(ev)
    return certificate(ev)
