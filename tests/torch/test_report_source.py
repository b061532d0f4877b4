"""The user's frame is told by the file, never by code-object equality (which ignores the file
name): a user's function and an installed library's with the same text at the same line are
equal code objects, and the report names the user's file:line, not the library's or the
caller's."""

import importlib.util

import torch

import gradsan.torch as gst
from gradsan.torch import _source

SOURCE = "import torch\n\n\ndef f(x):\n    return torch.log(x).sum()\n"


def _load(path, name):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_identical_code_in_a_library_and_a_user_file_is_told_apart(tmp_path):
    lib = _load(tmp_path / "site-packages" / "fakelib" / "same.py", "_gradsan_fakelib_same")
    user = _load(tmp_path / "project" / "same.py", "_gradsan_user_same")
    assert lib.f.__code__ == user.f.__code__  # Python's equality: the file name is ignored
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    # the library's copy first (its frame is skipped: the caller's line is the user's)
    with gst.explain() as r_lib:
        lib.f(x).backward()
    x.grad = None
    with gst.explain() as r_user:
        user.f(x).backward()
    f_lib, f_user = r_lib.findings[0], r_user.findings[0]
    assert f_lib.where.file == __file__, str(r_lib)
    assert f_user.where.file == str(tmp_path / "project" / "same.py"), str(r_user)
    assert f_user.where.line == 5 and f_user.where.code == "    return torch.log(x).sum()"


def test_the_user_file_first_then_the_library_copy(tmp_path):
    user = _load(tmp_path / "project" / "same2.py", "_gradsan_user_same2")
    lib = _load(tmp_path / "site-packages" / "fakelib" / "same2.py", "_gradsan_fakelib_same2")
    assert lib.f.__code__ == user.f.__code__
    x = torch.tensor([0.0, 1.0], requires_grad=True)
    with gst.explain() as r_user:
        user.f(x).backward()
    x.grad = None
    with gst.explain() as r_lib:
        lib.f(x).backward()
    assert r_user.findings[0].where.file == str(tmp_path / "project" / "same2.py")
    assert r_lib.findings[0].where.file == __file__, str(r_lib)


def test_the_cache_holds_each_code_object_it_answered_for():
    def probe():
        return _source.user_frame_object(1)

    assert probe() is not None
    got = _source._library_code.get(id(probe.__code__))
    assert got is not None and got[0] is probe.__code__ and got[1] is False
