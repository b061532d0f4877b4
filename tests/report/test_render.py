"""The renderers only render: the text and HTML carets come from one function, JSON keeps
numbers as numbers."""

import json

import numpy as np

from gradsan import Finding, Frame, OutputHit, Report
from gradsan._report._html import render_html
from gradsan._report._text import caret_span, render

CODE = "    dist = jnp.sqrt(jnp.sum(d**2, axis=-1))"


def _report(frame):
    f = Finding(
        kind="nonfinite",
        catalog_id="sqrt-at-zero",
        phase="gradient",
        primitive="sqrt",
        where=frame,
        outputs=[OutputHit("x", 1, 2, 1, 0, "grad")],
        detail={"got": "0.0"},
        got_value=np.float32(0.0),
        count=np.int64(1),
    )
    return Report(findings=[f], function="loss", backend="jax")


def test_caret_span_is_the_expression_in_the_stripped_line():
    frame = Frame("loss.py", 7, CODE.index("jnp.sqrt"), "loss", CODE, len(CODE))
    stripped, span = caret_span(frame)
    assert stripped == CODE.strip() and span == (7, len(CODE.strip()) - 7)
    assert caret_span(Frame("loss.py", 7, None, "loss", CODE))[1] is None
    assert caret_span(Frame("loss.py", 7, 2, "loss", CODE, 3))[1] is None  # inside the indent


def test_text_and_html_draw_the_same_caret():
    frame = Frame("loss.py", 7, CODE.index("jnp.sqrt"), "loss", CODE, len(CODE))
    text = render(_report(frame))
    line, caret = text.splitlines()[2:4]
    start = caret.index("^")
    assert line[start : start + caret.count("^")] == "jnp.sqrt(jnp.sum(d**2, axis=-1))"
    html = render_html(_report(frame))
    assert '<span class="caret">' + " " * 7 + "^" * 32 + "</span>" in html


def test_a_caret_under_the_whole_line_is_drawn_in_html_only():
    code = "jnp.sqrt(x)"
    frame = Frame("loss.py", 7, 0, "loss", code, len(code))
    assert "^" not in render(_report(frame))
    assert "^" * len(code) in render_html(_report(frame))


def test_json_writes_numpy_numbers_as_numbers():
    d = json.loads(_report(None).to_json())
    f = d["findings"][0]
    assert f["got_value"] == 0.0 and f["count"] == 1 and f["index"] is None
    assert f["detail"] == {"got": "0.0"}
    assert f["outputs"][0]["nan"] == 1
