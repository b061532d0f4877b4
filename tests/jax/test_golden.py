"""Golden messages: the demo gallery's reports, word for word. GRADSAN_UPDATE_GOLDEN=1 rewrites
them; review the diff like code."""

import os
import pathlib

import pytest

import gradsan.jax as gsj
from gradsan._demo import case as demo_cases

GOLDEN = pathlib.Path(__file__).parent.parent / "golden"


def _normalize(text: str) -> str:
    path = os.path.relpath(demo_cases.__file__)
    return text.replace(demo_cases.__file__, "demo_cases.py").replace(path, "demo_cases.py")


@pytest.mark.parametrize("case", sorted(demo_cases.CASES))
def test_golden_report(case):
    c = demo_cases.CASES[case]()
    fun, args = c.grad, c.args
    text = _normalize(str(gsj.explain(fun)(*args))) + "\n"
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("GRADSAN_UPDATE_GOLDEN") == "1" or not path.exists():
        if os.environ.get("CI") and not path.exists():
            pytest.fail(f"missing golden file {path}; run with GRADSAN_UPDATE_GOLDEN=1")
        path.write_text(text)
    assert text == path.read_text()
