"""The catalog's record types: Singularity, Fix, Admissible, Kind. Pure Python: no backend
(numpy is imported only by :meth:`Admissible.contains`)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, Literal


# What kind of point an entry describes.
#   singular:      the derivative is infinite or undefined while the value is finite (sqrt at 0)
#   pole:          the value itself is infinite there (log at 0, 1/x at 0)
#   kink:          Lipschitz, not differentiable (abs at 0); AD returns a convention
#   discontinuity: the function jumps (floor, atan2 at the origin)
#   overflow:      a finite result too large for the dtype (exp, float16)
#   input:         the value was already non-finite when it came in
#   domain:        outside the real domain (sqrt or log of a negative number): NaN
class Kind(enum.StrEnum):
    SINGULAR = "singular"
    POLE = "pole"
    KINK = "kink"
    DISCONTINUITY = "discontinuity"
    OVERFLOW = "overflow"
    INPUT = "input"
    DOMAIN = "domain"


KINDS = tuple(k.value for k in Kind)

# The kinds whose gradient is finite and a convention (a kink, a tie, a jump).
CONVENTION_KINDS = (Kind.KINK.value, Kind.DISCONTINUITY.value)


@dataclasses.dataclass(frozen=True)
class Fix:
    """One suggested fix: a one-line summary and runnable code (JAX flavour, torch twin).

    ``jax`` and ``torch`` are the fix written in placeholder names (``x``, ``y``, ``p``), for
    ``gradsan catalog`` and the docs. ``rewrite`` names how gradsan writes it on the user's own
    statement (a rewriter of :mod:`gradsan._fix`): ``"safe"`` (the call rewritten to the entry's
    safe twin with the same arguments), ``"double_where"``, ``"clamp_safe"``, ``"fold_pow"``,
    ``"log_prob"``; None when it is advice that cannot be written from the program (a report
    prints its summary only). ``torch_summary`` is the summary torch reports print, where the
    torch twin is different advice (None: ``summary`` serves both)."""

    summary: str
    jax: str
    torch: str | None = None
    rewrite: str | None = None
    torch_summary: str | None = None

    def code(self, backend: str = "jax") -> str:
        if backend == "torch" and self.torch:
            return self.torch
        return self.jax

    def summary_for(self, backend: str = "jax") -> str:
        if backend == "torch" and self.torch_summary:
            return self.torch_summary
        return self.summary


@dataclasses.dataclass(frozen=True)
class Singularity:
    """One singular or non-smooth operation, the one place its mathematics is written down.

    ``op`` is the canonical operation name both backends map onto (``"sqrt"``, ``"div"``,
    ``"norm"``). ``safe`` names the function in ``gradsan.<backend>.safe`` that fixes it.
    """

    id: str
    op: str
    kind: str
    title: str
    singular_set: str
    derivative: str
    explanation: str
    fixes: tuple[Fix, ...] = ()
    subdifferential: str | None = None
    conventions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    safe: str | None = None
    # Library functions whose internals hit this entry: a finding inside them is reported as
    # this entry (``jnp.linalg.norm`` hitting sqrt at 0 is ``norm-at-zero``).
    library: tuple[str, ...] = ()
    # The singular point in the names the fixes use (``{"x": 1.0, "y": 0.0}`` for div-by-zero;
    # ``p`` is pow's exponent): tests/jax/test_catalog_fixes.py runs each fix there.
    point: Mapping[str, Any] | None = None
    # Backends whose convention here is a finite value outside the admissible set (no
    # derivative of anything): their sanitize reports it as kind "convention", not "kink".
    inadmissible: tuple[str, ...] = ()
    # The admissible set of gradients there (kinks, ties, jumps); None where it is no fixed
    # form (a where on its boundary, std of a constant). A simplex's support is the tie's.
    admissible: Admissible | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.id}: kind {self.kind!r} is not one of {KINDS}")

    def render(self) -> str:
        """The full text ``gradsan catalog ID`` prints."""
        lines = [f"{self.id}: {self.title}", ""]
        lines.append(f"  where:      {self.singular_set}")
        lines.append(f"  derivative: {self.derivative}")
        if self.subdifferential:
            lines.append(f"  subdifferential: {self.subdifferential}")
        for backend, conv in self.conventions.items():
            lines.append(f"  {backend + ':':11} {conv}")
        lines += ["", "Why:"]
        lines += ["  " + ln for ln in _wrap(self.explanation)]
        if self.fixes:
            lines += ["", "Fixes:"]
            for i, fix in enumerate(self.fixes, 1):
                lines.append(f"  {i}. {fix.summary}")
                lines += ["       " + ln for ln in fix.jax.splitlines()]
                if fix.torch:
                    lines.append(
                        "     PyTorch:" + (f" {fix.torch_summary}" if fix.torch_summary else "")
                    )
                    lines += ["       " + ln for ln in fix.torch.splitlines()]
        return "\n".join(lines)


def _wrap(text: str, width: int = 92) -> list[str]:
    import textwrap

    out: list[str] = []
    for para in text.strip().split("\n\n"):
        out += textwrap.wrap(" ".join(para.split()), width) or [""]
        out.append("")
    return out[:-1]


AdmissibleForm = Literal["interval", "simplex", "ball", "psd_trace1", "none"]


@dataclasses.dataclass(frozen=True)
class Admissible:
    """The admissible set of gradients at a kink (its Clarke subdifferential), as a type.

    ``interval``: every component in [lo, hi]. ``simplex``: the convex combinations of the unit
    vectors at ``support`` (a tie among those elements; the others get 0). ``ball``: the unit
    ball (norm, hypot at the origin). ``psd_trace1``: the symmetric positive semidefinite
    matrices of trace 1 (an eigenvalue gradient at a repeated eigenvalue). ``none``: the
    function jumps there, so no value is admissible. ``words`` is the set as docs print it.
    """

    form: AdmissibleForm
    words: str
    lo: float = 0.0
    hi: float = 0.0
    support: tuple[int, ...] = ()

    @classmethod
    def interval(cls, lo: float, hi: float, words: str | None = None) -> Admissible:
        return cls("interval", words or f"[{lo:g}, {hi:g}]", lo=lo, hi=hi)

    @classmethod
    def simplex(cls, support: Sequence[int], words: str) -> Admissible:
        return cls("simplex", words, support=tuple(support))

    @classmethod
    def ball(cls, words: str = "the unit ball") -> Admissible:
        return cls("ball", words)

    @classmethod
    def psd_trace1(cls, words: str = "symmetric PSD matrices of trace 1") -> Admissible:
        return cls("psd_trace1", words)

    @classmethod
    def none(cls, words: str = "none (a jump)") -> Admissible:
        return cls("none", words)

    def exists(self) -> bool:
        """Whether any value is admissible (False where the function jumps)."""
        return self.form != "none"

    def contains(self, g: Any, tol: float = 1e-12, sum_tol: float = 1e-9) -> bool:
        """Whether the gradient ``g`` (array-like) lies in the set, up to rounding: ``tol`` on
        the bounds, ``sum_tol`` on a simplex's sum and a PSD matrix's trace. A simplex with no
        support takes every element as tied."""
        import numpy as np

        a = np.asarray(g, np.float64)
        if self.form == "none" or not np.all(np.isfinite(a)):
            return False
        if self.form == "interval":
            return bool(np.all((a >= self.lo - tol) & (a <= self.hi + tol)))
        if self.form == "simplex":
            flat = np.ravel(a)
            sup = list(self.support) or list(range(flat.size))
            others = [i for i in range(flat.size) if i not in sup]
            return bool(
                np.all(flat[sup] >= -tol)
                and abs(flat[sup].sum() - 1) <= sum_tol
                and np.all(flat[others] == 0)
            )
        if self.form == "ball":
            return bool(np.linalg.norm(np.ravel(a)) <= 1 + tol)
        s = (a + a.T) / 2  # psd_trace1
        return bool(abs(np.trace(s) - 1) <= sum_tol and np.linalg.eigvalsh(s).min() >= -sum_tol)
