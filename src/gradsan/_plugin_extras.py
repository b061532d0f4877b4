"""The pytest plugin's pieces that need more than a hook: which tests are allowed their
NaN/Inf (the marker, absl's ``@parameterized`` above or below it, ``--gradsan-allow``), the
failure text (printed once, naming how to allow it), test files from installed packages, and
the session's last line."""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import pytest

MARKER = "gradsan_allow_nonfinite"


class Allow:
    """``--gradsan-allow`` values: node ids (``path.py::Class::name``, a path's tail, or a
    ``Class::name`` tail: matched whole, at ``/`` and ``::`` boundaries, also the tests under it
    and its ``[parameters]``) or ``-k`` style keyword expressions, whose words match parts of
    the test's names as ``-k`` does, except that a number is matched whole:
    ``test_optimization10`` is that test (and its ``[parameters]``), not
    ``test_optimization100``-``109`` (absl numbers its parameterized tests)."""

    def __init__(self, values: list[str]) -> None:
        from _pytest.mark.expression import Expression

        self.values = list(values)
        self.node_ids: list[str] = []
        self.exprs: list[Any] = []
        self.expr_values: list[str] = []
        self.used: set[str] = set()  # the values that matched a test of this session
        for v in self.values:
            v = v.strip()
            if "::" in v or v.endswith(".py") or os.sep in v or "/" in v:
                self.node_ids.append(v)
                continue
            try:
                self.exprs.append(Expression.compile(v))
                self.expr_values.append(v)
            except SyntaxError as e:
                raise pytest.UsageError(
                    f"--gradsan-allow={v!r}: not a keyword expression ({e})"
                ) from None

    def matches(self, item: pytest.Item) -> bool:
        """Whether a value allows ``item`` (every value is tried: :attr:`used` is exact)."""
        nid = item.nodeid
        path = str(item.path).replace(os.sep, "/")
        hit = False
        for value in self.node_ids:
            v = value.replace(os.sep, "/")
            # the node id, or a path's tail: `alias_test.py::AliasTest::test_x`; also for a
            # test file outside the rootdir (pytest --pyargs optax: node ids `::AliasTest::..`)
            file, _, rest = v.partition("::")
            here = _under(nid, v) or (
                file.endswith(".py")
                and (path == file or path.endswith("/" + file.lstrip("./")))
                and (not rest or _under(nid.partition("::")[2], rest, anchored=True))
            )
            if here:
                self.used.add(value)
                hit = True
        if self.exprs:
            from _pytest.mark import KeywordMatcher

            matcher = _WholeNumbers(KeywordMatcher.from_item(item))
            for value, e in zip(self.expr_values, self.exprs):
                if e.evaluate(matcher):
                    self.used.add(value)
                    hit = True
        return hit

    def unused(self) -> list[str]:
        """The values that matched none of the tests checked."""
        return [v for v in (x.strip() for x in self.values) if v not in self.used]


def _under(nid: str, v: str, anchored: bool = False) -> bool:
    """``nid`` is the test ``v`` names (``v`` whole, or unless ``anchored`` its tail after a
    ``/`` or ``::``), one of its parameters, or a test in class / file ``v``."""
    start = nid.find(v)
    while start >= 0 and not (anchored and start):
        end = start + len(v)
        left = start == 0 or nid[start - 1] == "/" or nid[:start].endswith("::")
        right = end == len(nid) or nid.startswith("::", end) or nid[end] == "["
        if left and right:
            return True
        start = nid.find(v, start + 1)
    return False


class _WholeNumbers:
    """pytest's ``-k`` matcher (a word matches a part of one of the test's names, in any
    case), except that a word's leading or trailing digits do not match part of a number."""

    def __init__(self, keywords: Any) -> None:
        self.names = [str(n).lower() for n in getattr(keywords, "_names", ())]
        self.keywords = keywords

    def __call__(self, subname: str, /, **kwargs: Any) -> bool:
        if kwargs or not self.names:
            return bool(self.keywords(subname, **kwargs))
        sub = subname.lower()
        return any(_whole_numbers_in(name, sub) for name in self.names)


def _whole_numbers_in(name: str, sub: str) -> bool:
    i = name.find(sub)
    while i >= 0:
        j = i + len(sub)
        before = i > 0 and sub[:1].isdigit() and name[i - 1].isdigit()
        after = j < len(name) and sub[-1:].isdigit() and name[j].isdigit()
        if not (before or after):
            return True
        i = name.find(sub, i + 1)
    return False


def allowed(item: pytest.Item, hooks: Any) -> bool:
    path = os.path.abspath(str(item.path))
    if path in hooks.stats.installed_files:
        hooks.stats.installed_run.add(path)  # a test of an installed package ran
    by_value = bool(hooks.allow.matches(item))  # first: its record of used values is exact
    return item.get_closest_marker(MARKER) is not None or by_value


def mark_absl_parameterized(hooks: Any) -> None:
    """``@pytest.mark.gradsan_allow_nonfinite`` above absl's ``@parameterized.parameters``
    marks the decorator's object, which absl drops when it makes one test per parameter: copy
    the marks onto each test it makes. (Below the decorator the marks are on the function,
    which absl's ``functools.wraps`` already copies.)"""
    if importlib.util.find_spec("absl") is None:
        return
    try:
        from absl.testing import parameterized
    except ImportError:  # pragma: no cover
        return
    cls = getattr(parameterized, "_ParameterizedTestIter", None)
    if cls is None or not hasattr(cls, "__iter__"):
        return
    orig = cls.__iter__

    @functools.wraps(orig)
    def __iter__(self: Any) -> Any:
        marks = list(getattr(self, "pytestmark", []))
        for fn in orig(self):
            if marks:
                try:
                    fn.pytestmark = [*getattr(fn, "pytestmark", []), *marks]
                except AttributeError:  # pragma: no cover
                    pass
            yield fn

    hooks.set(cls, "__iter__", __iter__)


def register_test_file(path: str, hooks: Any) -> None:
    from ._userfile import is_user_file, register_user_file

    if os.path.abspath(path) in hooks.stats.installed_files:
        return
    if not is_user_file(path):
        register_user_file(path)
        if os.path.basename(path) not in ("__init__.py", "conftest.py"):
            hooks.stats.installed_files.add(os.path.abspath(path))


def summary_line(hooks: Any) -> str:
    st = hooks.stats
    scope = f" in {st.tests} test{'s' if st.tests != 1 else ''}"
    text = st.line(where="the tests", finite="", scope=scope).rstrip(".")
    extra = []
    if st.failures:
        extra.append(f"{st.failures} failed with a gradsan report")
    if st.allowed:
        extra.append(
            f"{st.allowed} test{'s' if st.allowed != 1 else ''} allowed NaN/Inf "
            f"(@pytest.mark.{MARKER} or --gradsan-allow), not checked"
        )
    allow = getattr(hooks, "allow", None)
    unused = allow.unused() if isinstance(allow, Allow) else []
    if unused:
        extra.append(
            "--gradsan-allow "
            + ", ".join(repr(v) for v in unused)
            + " matched none of the tests run"
        )
    if st.installed_run:
        n = len(st.installed_run)
        extra.append(
            f"{n} test file{'s' if n != 1 else ''} from "
            "installed packages: only their own jit/grad functions checked, not the package's"
        )
    return text + ("; " + "; ".join(extra) if extra else "") + "."


def failure_repr(item: pytest.Item, excinfo: Any, err: Any, hooks: Any) -> tuple[Any, str]:
    """The failure, its report printed once: the test's own lines that led to the call, the
    header and how to allow the NaN/Inf if the test means it (the failure's text), and the
    report (its ``gradsan`` section)."""
    from _pytest._code.code import ReprFileLocation

    from ._userfile import is_gradsan_file, is_user_file

    lines: list[str] = []
    crash_path, crash_line = str(item.path), 0
    for entry in excinfo.traceback:
        fn = str(entry.path)
        if is_gradsan_file(fn) or not is_user_file(fn):
            continue
        rel = os.path.relpath(fn) if not os.path.relpath(fn).startswith("..") else fn
        src = entry.statement.lines[0].strip() if entry.statement.lines else ""
        lines.append(f"{rel}:{entry.lineno + 1}: in {entry.name}")
        if src:
            lines.append(f"    {src}")
        crash_path, crash_line = fn, entry.lineno + 1
    name = item.name.split("[")[0]
    allow = (
        f"gradsan: if this test means its NaN/Inf, mark it @pytest.mark.{MARKER} or run with "
        f'--gradsan-allow="{name}" (a -k expression or node id).'
    )
    head = f"gradsan: {err.gradsan_header} The report is in the gradsan section below."
    text = "\n".join([*lines, head, allow])
    first = str(err).strip().splitlines()[0] if str(err).strip() else head
    message = f"gradsan: {first} [allow: @pytest.mark.{MARKER} / --gradsan-allow]"
    hooks.stats.failures += 1
    section = f"gradsan: {err.gradsan_header}\n{str(err).rstrip()}"
    return _Repr(text, ReprFileLocation(crash_path, crash_line, message)), section


class _Repr:
    def __init__(self, text: str, crash: Any) -> None:
        self.text = text
        self.reprcrash = crash

    def toterminal(self, tw: Any) -> None:
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self.text
