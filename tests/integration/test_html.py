"""The HTML report: self-contained, escapes code, draws the chain; rendered by headless Chromium
when it is installed."""

import shutil
import subprocess

import pytest

from gradsan import Finding, Frame, OutputHit, Report
from gradsan._report._html import render_html


def sample_report() -> Report:
    code = "    dist = jnp.sqrt(jnp.sum(d**2, axis=-1)) if a < b else x"
    where = Frame("loss.py", 7, column=11, end_column=43, function="loss", code=code)
    f = Finding(
        kind="nonfinite",
        catalog_id="sqrt-at-zero",
        phase="gradient",
        primitive="sqrt",
        where=where,
        zero_from=Frame("loss.py", 8, function="loss", code="return d * 0"),
        form="0*inf",
        met_op="mul",
        values="sqrt got 0.0 in 2 of 4 elements",
        outputs=[OutputHit("theta", 1, 1, 1, 0, "grad")],
        explanation="sqrt is continuous at 0 but its slope there is infinite.",
        suggestions=["Use gradsan's safe sqrt:\ny = gradsan.jax.safe.sqrt(x)"],
        detail={"met_text": "0.0 * inf = nan in `mul`"},
    )
    return Report(findings=[f], function="loss", backend="jax", notes=["<b>not bold</b>"])


def test_render_html_has_chain_source_caret_fix_and_escapes():
    page = render_html(sample_report())
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page
    assert "loss.py:7 (loss)" in page and "loss.py:8 (loss)" in page
    assert "if a &lt; b" in page and "&lt;b&gt;not bold&lt;/b&gt;" in page
    assert '<span class="caret">' + " " * 7 + "^" * 32 + "</span>" in page
    assert "y = gradsan.jax.safe.sqrt(x)" in page and "gradsan catalog sqrt-at-zero" in page
    for box in ("box origin", "box met", "box reached"):
        assert box in page


def test_render_html_of_an_ok_report():
    assert "No findings" in render_html(Report(function="f", backend="torch"))


def test_chromium_renders_the_report(tmp_path):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); HTML not rendered")
    page = tmp_path / "report.html"
    page.write_text(render_html(sample_report()))
    png = tmp_path / "out.png"
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--screenshot={png}",
        "--window-size=1200,900",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        page.as_uri(),
    ]
    try:
        subprocess.run(cmd, capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.skip("chromium did not finish within 60 s")
    assert png.exists(), "chromium wrote no screenshot"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    try:
        import numpy as np
        from PIL import Image
    except ImportError:
        return
    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape[:2] == (900, 1200)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 20  # text and colored boxes, not blank
