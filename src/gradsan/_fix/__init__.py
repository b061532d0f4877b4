"""Fixes that work: built on the syntax tree of the user's statement, run by gradsan before they
are printed, and written as a patch.

- :func:`proposals` (called by ``_report/_build.py``): the catalog entry's fixes written on the
  statement under the frame's caret (:mod:`._rewrite`), each a
  :class:`~gradsan._report._records.FixProposal`; a fix that cannot be built is prose.
- :func:`verify_report` (called by the entry points that hold the function and its failing
  arguments): each code fix applied to a patched copy of the enclosing function and run
  forward and backward at the failing point and nearby (:mod:`._verify`); verified fixes first,
  failed ones dropped.
- :func:`report_patch`: ``Report.patch()``, the unified diff of the first verified fix of each
  finding (:mod:`._patch`).
"""

from __future__ import annotations

from .. import _catalog
from .._report._records import FixProposal, Frame
from . import _rewrite as R
from ._edit import proposal
from ._route import route
from ._site import Site, locate

__all__ = [
    "NOT_RUN",
    "where_trap_proposals",
    "proposals",
    "route",
    "verified",
    "verify_report",
    "verify_kinks",
    "verify_block",
    "report_patch",
    "render_suggestions",
]

# most code fixes offered (and run) for one finding
MAX_CANDIDATES = 3
# why an unverified code fix was not run, when nothing more specific is known
NOT_RUN = "gradsan did not re-run your program with it (explain(fn)(*args) does)"


def _prose(summary: str) -> str:
    s = summary.rstrip()
    return s[:-1] + "." if s.endswith(":") else s


def _code_for(site: Site, fx: _catalog.Fix, entry: _catalog.Singularity, backend: str):  # type: ignore[no-untyped-def]
    kind = fx.rewrite
    if kind == "safe":
        twin = entry.safe
        if twin is None:
            return None
        if entry.id == "integer-pow-negative-at-zero":
            twin = "pow"
        return R.rewrite_safe(site, backend, twin, entry.op)
    fn = R.REWRITERS.get(kind or "")
    return fn(site, backend) if fn is not None else None


def proposals(entry_id: str | None, backend: str, where: Frame | None) -> list[FixProposal]:
    """The fixes of catalog entry ``entry_id`` at ``where``, written on the user's statement:
    code fixes (unverified until :func:`verify_report` runs them), then prose advice."""
    if entry_id is None:
        return []
    try:
        entry = _catalog.get(entry_id)
    except KeyError:
        return []
    site = locate(where)
    code: list[FixProposal] = []
    prose: list[FixProposal] = []
    names = site.names_in_scope() if site is not None else set()
    seen: set[str] = set()

    def add(summary: str, rw: R.Rewrite | None) -> bool:
        if site is None or rw is None:
            return False
        p = proposal(site, rw, summary, backend, names)
        if p is None or p.replacement in seen:
            return False
        seen.add(p.replacement)
        code.append(p)
        return True

    if site is not None:
        for shape in (R.rewrite_where_guard,):
            got = shape(site, backend)
            if got is not None:
                add(got[0], got[1])
    for fx in entry.fixes:
        summary = fx.summary_for(backend)
        if "still singular" in summary:
            continue
        rw = _code_for(site, fx, entry, backend) if site is not None else None
        if not add(summary, rw):
            prose.append(FixProposal(summary=_prose(summary), backend=backend, status="prose"))
    for p in code:
        if site is not None and site.in_lambda:
            p.checked = p.checked or "inside a lambda or comprehension"
    return code[:MAX_CANDIDATES] + prose


def where_trap_proposals(
    summary: str, where: Frame | None, zero_from: Frame | None, backend: str
) -> list[FixProposal]:
    """The where trap's double-where fix on the user's statement at ``where`` (the op), with the
    condition of the ``where`` at ``zero_from`` that did not select it; [] when it cannot be
    built (the same statement: the op's own rewrite does it)."""
    site, wsite = locate(where), locate(zero_from)
    if site is None or wsite is None:
        return []
    if wsite.stmt is site.stmt or (
        wsite.file == site.file and wsite.stmt.lineno == site.stmt.lineno
    ):
        got = R.rewrite_where_guard(site, backend)
        rw = got[1] if got is not None else None
    else:
        rw = R.rewrite_where_from(site, wsite, backend)
    if rw is None:
        return []
    p = proposal(site, rw, summary, backend, site.names_in_scope())
    if p is None:
        return []
    if site.in_lambda:
        p.checked = p.checked or "inside a lambda or comprehension"
    return [p]


def render_suggestions(fixes: list[FixProposal]) -> list[str]:
    """The text of each fix a report prints (a failed fix is not printed): verified code with what
    was checked, unverified code with why, then prose."""
    out = []
    for p in fixes:
        if p.status == "failed":
            continue
        text = p.text()
        if p.status == "verified":
            text += f"\n# verified: {p.checked}"
        elif p.status == "unverified" and p.code is not None and p.checked:
            text += f"\n# not verified: {p.checked}"
        out.append(text)
    return out


def verify_report(report, fun, args, kwargs, backend: str) -> None:  # type: ignore[no-untyped-def]
    """Run each finding's code fixes (see :mod:`._verify`); reorders and annotates in place."""
    from ._verify import verify

    verify(report, fun, tuple(args), dict(kwargs or {}), backend)


def verified(report, fun, args, kwargs, backend: str):  # type: ignore[no-untyped-def]
    """``report`` with its fixes verified on ``fun(*args, **kwargs)`` (the entry points' hook)."""
    verify_report(report, fun, args, kwargs, backend)
    return report


def verified_before(run, fun, args, kwargs, backend: str):  # type: ignore[no-untyped-def]
    """The report ``run()`` makes (it calls the user's program), with its fixes verified at the
    arguments as they were before that call: a step updates its NNX module and optimizer (or a
    dict of arrays) in place, and the failing point is the state it started from. Each of the
    verifier's runs gets a copy of that state, so the user's objects stay as ``run()`` left
    them. Where the arguments cannot be copied, the verifier is given them as they are and
    runs nothing (it says so)."""
    if backend == "torch":  # the step's modules, optimizers and RNGs as they were, then back
        from ._verify_torch import Saved

        before = Saved(fun, tuple(args), dict(kwargs or {}))
        report = run()
        after = Saved(fun, tuple(args), dict(kwargs or {}))
        before.restore()
        try:
            verify_report(report, fun, args, kwargs, backend)
        finally:
            after.restore()
        return report
    from ._copies import Uncopyable, copied

    try:
        args, kwargs = copied(tuple(args), dict(kwargs or {}))
    except Uncopyable:
        pass  # verify() finds the same and leaves the fixes unverified, saying why
    report = run()
    verify_report(report, fun, args, kwargs, backend)
    return report


def verify_kinks(report, fun, args, kwargs, backend: str):  # type: ignore[no-untyped-def]
    """``report`` with its kink findings' fixes verified against the Clarke set (:mod:`._kinks`):
    the hook sanitize's report path calls."""
    from ._kinks import verify_kinks as run

    return run(report, fun, args, kwargs, backend)


def verify_block(report, frame) -> None:  # type: ignore[no-untyped-def]
    """The fixes of a ``with gradsan.torch.explain():`` block run on the block (:mod:`._block`):
    the hook the torch session's exit calls with the user's frame."""
    from ._block import verify_block as run

    run(report, frame)


def report_patch(report) -> str:  # type: ignore[no-untyped-def]
    from ._patch import patch

    return patch(report)
