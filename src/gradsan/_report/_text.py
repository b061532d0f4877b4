"""Text rendering of a Report. Renderers only render: every fact comes from the Finding."""

from __future__ import annotations

from ._records import Finding, Frame, Report

_LABEL_W = 9


def _result_word(r: str) -> str:
    return {"nan": "NaN", "inf": "Inf", "-inf": "-Inf"}.get(r, r)


def caret_span(frame: Frame) -> tuple[str, tuple[int, int] | None]:
    """The frame's code line without its indentation, and the (start, width) of the caret under
    the expression in it, or None when the column range is unknown or does not fit the line.
    Shared by the text and HTML renderers."""
    code = frame.code.rstrip()
    stripped = code.lstrip()
    lead = len(code) - len(stripped)
    if frame.column is not None and frame.end_column and frame.end_column > frame.column:
        start = frame.column - lead
        width = frame.end_column - frame.column
        if 0 <= start and start + width <= len(stripped):
            return stripped, (start, width)
    return stripped, None


def _source(frame: Frame | None, indent: str) -> list[str]:
    """`file:line (function)   code` plus a caret line under the column range when known."""
    if frame is None:
        return []
    loc = str(frame)
    stripped, span = caret_span(frame)
    if not stripped:
        return [loc]
    head = f"{loc}   "
    lines = [head + stripped]
    if span is not None and span[1] < len(stripped):  # a caret under the whole line says nothing
        start, width = span
        lines.append(indent + " " * (len(head) + start) + "^" * width)
    return lines


def _row(label: str, body: list[str], indent: str = "  ") -> list[str]:
    if not body:
        return []
    pad = indent + " " * (_LABEL_W)
    first = indent + f"{label:<{_LABEL_W}}" + body[0]
    return [first] + [pad + b if not b.startswith(indent + " ") else b for b in body[1:]]


def _names(outs: list) -> str:
    names = [f"`{o.path}`" for o in outs[:3]]
    more = f" and {len(outs) - 3} more" if len(outs) > 3 else ""
    return ", ".join(names) + more


def _target(f: Finding) -> str:
    """What went non-finite, in words: "the gradient for `theta`", "the value", "output `[1]`"."""
    grads = [o for o in f.outputs if o.kind == "grad" or (not o.kind and f.phase == "gradient")]
    values = [o for o in f.outputs if o.kind == "value"]
    named = {id(o) for o in grads + values}  # by identity: comparing fields is O(n^2)
    others = [o for o in f.outputs if id(o) not in named]
    parts = []
    if values:
        parts.append(
            "the value"
            if len(values) == 1 and values[0].path == "value"
            else f"the value {_names(values)}"
        )
    if grads:
        parts.append(f"the gradient for {_names(grads)}")
    if others:
        parts.append(f"{'output' if len(others) == 1 else 'outputs'} {_names(others)}")
    return " and ".join(parts) or "the output"


def headline(f: Finding) -> str:
    if f.kind == "resolved":
        return f"resolved: {f.title or f.catalog_id} at {f.where} ({f.detail.get('rule', '')})"
    if f.kind == "kink":
        return f"kink: {f.primitive} at {f.where}: {f.values or f.title}"
    what = _result_word(f.result)
    target = _target(f)
    if f.catalog_id == "nonfinite-input":
        return f"{what} in {target}: it was already in the input: {f.values}."
    if f.where is None and f.primitive == "?":  # guard's gradients, not located by a replay
        return f"{what} in {target}: gradsan did not locate the operation that made it."
    lib = f" (inside {f.library})" if f.library else ""
    got = f.detail.get("got")
    s = f"{what} in {target}: {f.primitive}{lib} at {f.where}"
    if got is not None:
        s += f" got {got}"
    if f.phase == "value" and any(o.kind == "grad" for o in f.outputs):
        s += " in the forward pass"
    if f.detail.get("note"):
        s += f" ({f.detail['note']})"
    if f.detail.get("met_clause"):  # built from the values seen (_report/_build.py)
        s += f.detail["met_clause"]
    elif f.zero_from is not None and f.form:
        s += f", and that {f.detail.get('met_value', 'inf')} met a zero at {f.zero_from}"
    return s + "."


def _render_certified(f: Finding, number: int | None) -> str:
    """certify's verdict: the label, the verdict per direction, the certificate."""
    import textwrap

    label = f.detail.get("label", "")
    names = _names(f.outputs) if f.outputs else "the output"
    head = f"certified: {label} for {names}"
    if f.where is not None:
        head += f" at {f.where}"
    if number is not None:
        head = f"[{number}] " + head
    lines = [head, ""]
    for v in f.detail.get("verdicts", []):
        lines.append(
            f"  direction {v.get('direction')}: {v.get('verdict')}  {v.get('certificate', '')}"
        )
    if f.detail.get("certificate"):
        lines.append("")
        lines += textwrap.wrap("Why: " + str(f.detail["certificate"]), 96)
    return "\n".join(lines)


def render_finding(f: Finding, number: int | None = None) -> str:
    if f.kind == "certified":
        return _render_certified(f, number)
    lines: list[str] = []
    head = headline(f)
    if number is not None:
        head = f"[{number}] " + head
    lines.append(head)
    lines.append("")
    ind = "  "
    src_indent = ind + " " * _LABEL_W
    if f.kind in ("nonfinite", "unresolved", "kink", "resolved"):
        origin = _source(f.where, src_indent)
        if origin:
            lines += _row("origin" if f.kind != "kink" else "at", origin)
            detail = [f.values] if f.values else []
            if f.detail.get("derivative"):
                detail = [(f.values + "; " if f.values else "") + f.detail["derivative"]]
            if f.context:
                detail.append(f"in {f.context}")
            if f.library:
                detail.append(f"inside the library function {f.library}")
            lines += [src_indent + d for d in detail]
        if f.zero_from is not None or f.met_where is not None:
            met = _source(f.zero_from or f.met_where, src_indent)
            lines += _row("met", met)
            if f.form:
                lines.append(src_indent + f.detail.get("met_text", f"{f.form} = NaN in {f.met_op}"))
        if f.outputs:
            lines += _row("reached", [", ".join(str(o) for o in f.outputs[:6])])
            if len(f.outputs) > 6:
                lines.append(src_indent + f"and {len(f.outputs) - 6} more outputs")
    if f.explanation:
        import textwrap

        lines.append("")
        lines += textwrap.wrap("Why: " + " ".join(f.explanation.split()), 96)
    if f.suggestions:
        lines.append("")
        lines.append("Fix:")
        for i, s in enumerate(f.suggestions, 1):
            sl = s.splitlines()
            lines.append(f"  {i}. {sl[0]}")
            lines += ["     " + x for x in sl[1:]]
    if f.catalog_id:
        lines.append(f"Details: gradsan catalog {f.catalog_id}")
    return "\n".join(lines)


def render(report: Report) -> str:
    if not report.findings:
        if report.notes:
            return f"gradsan: {report.function}: " + "\n".join(report.notes)
        return f"gradsan: no findings for {report.function}: every output is finite."
    parts = []
    n = len(report.findings)
    for i, f in enumerate(report.findings, 1):
        parts.append(render_finding(f, i if n > 1 else None))
    text = "\n\n".join(parts)
    if report.notes:
        text += "\n\n" + "\n".join("note: " + x for x in report.notes)
    return text
