"""A ``with gradsan.torch.explain():`` block at a script's top level (its locals are the module's
globals): the modules it reads are not arguments to copy, so its fixes are run there too (they
said "the block reads `torch`, which gradsan cannot copy")."""

import runpy

SCRIPT = """\
import torch
import gradsan.torch as gst

x = torch.tensor([0.0, 4.0], requires_grad=True)
with gst.explain() as report:
    h = torch.sqrt(x) * 0.0
    loss = h.sum() + x.sum()
    loss.backward()
"""


def test_a_top_level_block_fix_is_run(tmp_path):
    path = tmp_path / "toplevel_script.py"
    path.write_text(SCRIPT)
    report = runpy.run_path(str(path), run_name="__main__")["report"]
    (f,) = report.findings
    assert f.where.file == str(path) and f.where.line == 6, str(report)
    (first,) = [p for p in f.fixes if p.code is not None][:1]
    assert "safe.sqrt(x)" in first.replacement
    assert first.status == "verified", (first.status, first.checked)
    # the true gradient: 0 * d sqrt + 1 = 1 at both elements
    assert "gradient [1, 1]" in first.checked and "same value" in first.checked
    assert "cannot copy" not in "\n".join(f.suggestions)
