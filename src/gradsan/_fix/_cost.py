"""What the fix verification may spend: the program's size in equations run (a ``scan``'s body
counts once per iteration), the size up to which certify and nansafe (both walk every equation,
every iteration) give the reference gradient, and a CPU budget for a whole report's checks."""

from __future__ import annotations

import time
from typing import Any

# certify and nansafe interpret each equation in Python (about 1-4 ms each on a shared CPU):
# above this many equations run, the reference gradient comes from the compiled program only
REFERENCE_MAX_EQNS = 10_000
# the CPU seconds a report's fix checks may take in all; a fix not reached by then says so
BUDGET_S = 20.0


def subjaxprs(v: Any) -> list[Any]:
    if hasattr(v, "eqns"):
        return [v]
    inner = getattr(v, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        return [inner]
    if isinstance(v, (tuple, list)):
        return [j for x in v for j in subjaxprs(x)]
    return []


def all_eqns(jaxpr: Any) -> list[Any]:
    out = []
    for e in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        out.append(e)
        for v in e.params.values():
            for sub in subjaxprs(v):
                out += all_eqns(sub)
    return out


def equations(jaxpr: Any) -> int:
    """The equations one run of ``jaxpr`` executes: a ``scan`` counts its body ``length`` times,
    a ``cond`` its largest branch, a ``while`` its body once (its trip count is not known)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        params = eqn.params
        if eqn.primitive.name == "cond":
            n += max((equations(b) for b in params.get("branches", ())), default=0)
            continue
        times = int(params.get("length", 1)) if eqn.primitive.name == "scan" else 1
        for v in params.values():
            for sub in subjaxprs(v):
                n += times * equations(sub)
    return n


class Budget:
    """CPU time spent on a report's checks since it started."""

    def __init__(self, seconds: float | None = None):
        self.seconds = BUDGET_S if seconds is None else seconds
        self.start = time.process_time()

    def spent(self) -> float:
        return time.process_time() - self.start

    def exhausted(self) -> bool:
        return self.spent() > self.seconds


def too_large(size: int | None, checked: str = "") -> str:
    """The one-line reason of a fix gradsan did not compare with a reference gradient."""
    n = f" ({size:,} equations)" if size is not None else ""
    head = f"the program is too large to check quickly{n}"
    return f"{head}; {checked}" if checked else head
