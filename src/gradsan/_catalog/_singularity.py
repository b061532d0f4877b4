"""The catalog's record types. Pure Python: no numpy, no backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# What kind of point an entry describes.
#   singular:      the derivative is infinite or undefined while the value is finite (sqrt at 0)
#   pole:          the value itself is infinite there (log at 0, 1/x at 0)
#   kink:          Lipschitz, not differentiable (abs at 0); AD returns a convention
#   discontinuity: the function jumps (floor, atan2 at the origin)
#   overflow:      a finite result too large for the dtype (exp, float16)
#   input:         the value was already non-finite when it came in
KINDS = ("singular", "pole", "kink", "discontinuity", "overflow", "input", "domain")


@dataclasses.dataclass(frozen=True)
class Fix:
    """One suggested fix: a one-line summary and runnable code (JAX flavour, torch twin)."""

    summary: str
    jax: str
    torch: str | None = None

    def code(self, backend: str = "jax") -> str:
        if backend == "torch" and self.torch:
            return self.torch
        return self.jax


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
                    lines.append("     PyTorch:")
                    lines += ["       " + ln for ln in fix.torch.splitlines()]
        return "\n".join(lines)


def _wrap(text: str, width: int = 92) -> list[str]:
    import textwrap

    out: list[str] = []
    for para in text.strip().split("\n\n"):
        out += textwrap.wrap(" ".join(para.split()), width) or [""]
        out.append("")
    return out[:-1]
