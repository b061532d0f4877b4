"""A Report as one self-contained HTML page (no scripts, no external files).

Each finding is drawn as a chain of boxes, origin -> where the inf met a zero -> the outputs it
reached, each with the user's source line and a caret under the expression, followed by the
explanation and the fixes as code.
"""

from __future__ import annotations

import html

from ._records import Finding, Frame, Report
from ._text import caret_span, headline

_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 24px; color: #1d2330; background: #fafbfc; }
h1 { font-size: 20px; margin: 0 0 4px; }
.sub { color: #5b6472; margin-bottom: 20px; }
.finding { background: #fff; border: 1px solid #d8dde6; border-radius: 8px; padding: 16px 20px;
           margin-bottom: 24px; }
.head { font-weight: 600; margin-bottom: 14px; }
.chain { display: flex; align-items: stretch; gap: 0; flex-wrap: wrap; margin: 8px 0 14px; }
.box { border: 2px solid #8a94a6; border-radius: 8px; padding: 8px 12px; min-width: 200px;
       max-width: 520px; background: #f4f6f9; }
.box.origin { border-color: #c62828; background: #fdecea; }
.box.met { border-color: #ef6c00; background: #fff3e0; }
.box.reached { border-color: #1565c0; background: #e3f2fd; }
.box .label { font-size: 12px; text-transform: uppercase; letter-spacing: .05em; color: #5b6472; }
.arrow { align-self: center; font-size: 28px; color: #8a94a6; padding: 0 8px; }
pre { background: #0f1720; color: #e6edf3; padding: 10px 12px; border-radius: 6px;
      overflow-x: auto; font: 13px/1.4 ui-monospace, monospace; margin: 6px 0; }
pre .caret { color: #ff6b6b; }
.loc { font: 13px ui-monospace, monospace; color: #37474f; }
.values { font-size: 13px; margin-top: 4px; }
.why { margin: 10px 0; }
.fix li { margin-bottom: 6px; }
.kind-kink .box.origin { border-color: #6a1b9a; background: #f3e5f5; }
.notes { color: #5b6472; font-size: 13px; }
"""


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _source(frame: Frame | None) -> str:
    if frame is None:
        return '<div class="loc">(no user frame)</div>'
    out = f'<div class="loc">{_e(frame)}</div>'
    stripped, span = caret_span(frame)
    if not stripped:
        return out
    body = _e(stripped)
    if span is not None:
        start, width = span
        body += "\n" + '<span class="caret">' + " " * start + "^" * width + "</span>"
    return out + f"<pre>{body}</pre>"


def _box(kind: str, label: str, inner: str) -> str:
    return f'<div class="box {kind}"><div class="label">{_e(label)}</div>{inner}</div>'


def _finding(f: Finding, number: int | None) -> str:
    parts = [f'<section class="finding kind-{_e(f.kind)}">']
    head = headline(f)
    num = f"[{number}] " if number else ""
    parts.append(f'<div class="head">{num}{_e(head)}</div>')
    boxes = []
    values = f.values
    if f.detail.get("derivative"):
        values = (values + "; " if values else "") + f.detail["derivative"]
    extra = "".join(
        f'<div class="values">{_e(v)}</div>'
        for v in [
            values,
            f"in {f.context}" if f.context else "",
            f"inside the library function {f.library}" if f.library else "",
        ]
        if v
    )
    boxes.append(
        _box("origin", "origin" if f.kind != "kink" else "kink at", _source(f.where) + extra)
    )
    if f.zero_from is not None or f.met_where is not None:
        met_text = f.detail.get("met_text") or (f"{f.form} = NaN in {f.met_op}" if f.form else "")
        boxes.append(
            _box(
                "met",
                "met a zero",
                _source(f.zero_from or f.met_where)
                + (f'<div class="values">{_e(met_text)}</div>' if met_text else ""),
            )
        )
    if f.outputs:
        items = "".join(f"<li>{_e(o)}</li>" for o in f.outputs[:12])
        more = f"<li>and {len(f.outputs) - 12} more</li>" if len(f.outputs) > 12 else ""
        boxes.append(_box("reached", "reached", f"<ul>{items}{more}</ul>"))
    parts.append('<div class="chain">' + '<div class="arrow">&rarr;</div>'.join(boxes) + "</div>")
    if f.explanation:
        parts.append(f'<p class="why"><b>Why:</b> {_e(" ".join(f.explanation.split()))}</p>')
    if f.suggestions:
        fixes = []
        for s in f.suggestions:
            first, *rest = s.splitlines()
            code = f"<pre>{_e(chr(10).join(rest))}</pre>" if rest else ""
            fixes.append(f"<li>{_e(first)}{code}</li>")
        parts.append('<div class="fix"><b>Fix:</b><ol>' + "".join(fixes) + "</ol></div>")
    if f.catalog_id:
        parts.append(
            f'<div class="notes">Details: <code>gradsan catalog {_e(f.catalog_id)}</code></div>'
        )
    parts.append("</section>")
    return "".join(parts)


def render_html(report: Report, title: str | None = None) -> str:
    """The report as a self-contained HTML document (a string)."""
    title = title or f"gradsan report: {report.function}"
    n = len(report.findings)
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<div class="sub">{_e(report.backend or "")} &middot; '
        f"{'ok' if report.ok else 'non-finite values found'} &middot; {n} finding(s)</div>",
    ]
    if not report.findings:
        body.append("<p>No findings: every output is finite.</p>")
    for i, f in enumerate(report.findings, 1):
        body.append(_finding(f, i if n > 1 else None))
    if report.notes:
        body.append(
            '<div class="notes">'
            + "".join(f"<p>note: {_e(x)}</p>" for x in report.notes)
            + "</div>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
