"""A ``with gradsan.torch.explain():`` block's fixes are run on the block itself (issue #13):
verified when the block reads only copyable values, with a one-line reason otherwise."""

import os
import shutil
import subprocess

import torch

from tests.conftest import line_of
from tests.fix import block_programs as B


def _code_fixes(report):
    return [p for f in report.findings for p in f.fixes if p.code is not None]


def test_a_plain_block_fix_is_verified_and_patched(tmp_path, monkeypatch):
    report = B.plain_block(torch.tensor([0.0, 1.0], requires_grad=True))
    [f] = report.findings
    assert f.where.line == line_of(B.__file__, "L:block-sqrt")
    first = _code_fixes(report)[0]
    assert first.status == "verified", str(report)
    assert "same value" in first.checked
    assert f.suggestions[0].endswith("# verified: " + first.checked)
    # the patch applies to a copy of the file and the fixed block gives the true gradient
    shutil.copy(B.__file__, tmp_path / "block_programs.py")
    monkeypatch.chdir(os.path.dirname(B.__file__))
    text = report.patch()
    assert text.startswith("--- a/block_programs.py\n"), text
    (tmp_path / "fix.patch").write_text(text)
    r = subprocess.run(
        ["patch", "-p1", "-i", str(tmp_path / "fix.patch"), "-o", str(tmp_path / "fixed.py"),
         str(tmp_path / "block_programs.py")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    fixed = (tmp_path / "fixed.py").read_text()
    assert "gradsan.torch.safe.sqrt(x)" in fixed
    ns: dict = {"__name__": "fixed_block"}
    exec(compile(fixed, str(tmp_path / "fixed.py"), "exec"), ns)
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    ns["plain_block"](x)
    assert x.grad.tolist() == [1.0, 1.0]


def test_a_block_reading_a_model_keeps_its_reason():
    report = B.block_with_model(torch.tensor([0.0, 1.0], requires_grad=True))
    p = _code_fixes(report)[0]
    assert p.status == "unverified" and "`MODEL`" in p.checked


def test_a_block_reassigning_its_input_keeps_its_reason():
    report = B.block_reassigning_its_input(torch.tensor([0.0, 1.0], requires_grad=True))
    p = _code_fixes(report)[0]
    assert p.status == "unverified" and "assigns a name it reads" in p.checked


def test_a_kink_fix_in_a_sanitize_block_says_where_it_is_checked():
    report = B.sanitize_block(torch.tensor([0.0, 1.0], requires_grad=True))
    [f] = [f for f in report.findings if f.kind == "kink"]
    p = next(p for p in f.fixes if p.code is not None)
    assert p.status == "unverified" and "sanitize(fn)(*args) does" in p.checked
    assert f.suggestions[0].endswith("# not verified: " + p.checked)
