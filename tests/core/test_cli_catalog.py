"""`gradsan catalog`, through the real executable."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

from gradsan import _catalog
from gradsan._cli import main


def _gradsan() -> str:
    exe = pathlib.Path(sys.executable).with_name("gradsan")
    found = str(exe) if exe.exists() else shutil.which("gradsan")
    if found is None:
        pytest.skip("the gradsan executable is not installed (pip install -e .)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_gradsan(), *args], capture_output=True, text=True, timeout=120)


def test_catalog_lists_every_entry():
    r = _run("catalog")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    listed = [ln.split()[0] for ln in lines if ln and not ln[0].isspace()][: len(_catalog.ENTRIES)]
    assert listed == _catalog.ids()
    for e in _catalog.ENTRIES:
        assert any(ln.startswith(e.id + " ") and e.title in ln for ln in lines), e.id
    assert f"{len(_catalog.ENTRIES)} entries." in r.stdout


def test_catalog_prints_one_entry():
    r = _run("catalog", "sqrt-at-zero")
    assert r.returncode == 0, r.stderr
    assert r.stdout == _catalog.get("sqrt-at-zero").render() + "\n"
    assert "sqrt-at-zero: sqrt at 0" in r.stdout and "Fixes:" in r.stdout


def test_catalog_bad_id_exits_2_with_a_hint():
    r = _run("catalog", "sqrt-at-zer")
    assert r.returncode == 2
    assert r.stdout == ""
    assert "no catalog entry 'sqrt-at-zer'" in r.stderr
    assert "Did you mean sqrt-at-zero" in r.stderr
    assert "`gradsan catalog` lists all" in r.stderr


@pytest.mark.parametrize("entry_id", _catalog.ids())
def test_every_entry_prints(entry_id, capsys):
    assert main(["catalog", entry_id]) == 0
    assert capsys.readouterr().out == _catalog.get(entry_id).render() + "\n"
