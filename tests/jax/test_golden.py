"""Golden messages: the demo gallery's reports, word for word. GRADSAN_UPDATE_GOLDEN=1 rewrites
them; review the diff like code.

The reports are rendered from normalised Frames (the gallery's path replaced by
``demo_cases.py`` before rendering), so the carets under each source line are checked too."""

import dataclasses
import os
import pathlib

import pytest

import gradsan.jax as gsj
from gradsan._demo import case as demo_cases

GOLDEN = pathlib.Path(__file__).parent.parent / "golden"


def _normalize(text: str) -> str:
    """Paths written inside a sentence (not a Frame): replaced in the rendered text."""
    path = os.path.relpath(demo_cases.__file__)
    return text.replace(demo_cases.__file__, "demo_cases.py").replace(path, "demo_cases.py")


def _normalised(report):
    """The report with every Frame in the gallery's file renamed ``demo_cases.py``."""
    for f in report.findings:
        for name in ("where", "zero_from", "met_where"):
            frame = getattr(f, name)
            if frame is not None and frame.file == demo_cases.__file__:
                setattr(f, name, dataclasses.replace(frame, file="demo_cases.py"))
    return report


@pytest.mark.parametrize("case", sorted(demo_cases.CASES))
def test_golden_report(case):
    c = demo_cases.CASES[case]()
    fun, args = c.grad, c.args
    text = _normalize(str(_normalised(gsj.explain(fun)(*args)))) + "\n"
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("GRADSAN_UPDATE_GOLDEN") == "1" or not path.exists():
        if os.environ.get("CI") and not path.exists():
            pytest.fail(f"missing golden file {path}; run with GRADSAN_UPDATE_GOLDEN=1")
        path.write_text(text)
    assert text == path.read_text()
