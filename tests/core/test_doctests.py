"""The `>>>` examples in the docstrings of the public safe modules, one test per docstring, with
the option `pytest --doctest-modules` uses (ELLIPSIS). They run here, in the suite's workers
and with its compilation cache, instead of in a second pytest process after the suite
(`make doctest` still runs them that way)."""

import doctest
import importlib
import io
import pathlib

import pytest

MODULES = ("gradsan.jax.safe", "gradsan.torch.safe")  # the Makefile's DOCTESTED


def _docstrings(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, name) if t.examples]


CASES = [pytest.param(t, id=t.name) for name in MODULES for t in _docstrings(name)]


@pytest.mark.parametrize("test", CASES)
def test_docstring_examples(test):
    out = io.StringIO()
    result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, out=out.write)
    assert result.attempted == len(test.examples)
    assert result.failed == 0, out.getvalue()


@pytest.mark.parametrize("name", MODULES)
def test_each_module_has_examples(name):
    assert sum(len(t.examples) for t in _docstrings(name)) >= 10


def test_the_makefiles_doctested_files_are_these_modules():
    makefile = pathlib.Path(__file__).resolve().parents[2] / "Makefile"
    (line,) = [ln for ln in makefile.read_text().splitlines() if ln.startswith("DOCTESTED :=")]
    paths = line.split(":=", 1)[1].split()
    assert [p.removeprefix("src/").removesuffix(".py").replace("/", ".") for p in paths] == list(
        MODULES
    )
