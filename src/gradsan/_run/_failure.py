"""What `gradsan run` and the pytest plugin carry from the first non-finite gradient to the
reader: the failure record, the exception that stops the script, the console line."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

EXIT_NONFINITE = 3


def say(msg: str) -> None:
    print(f"gradsan: {msg}", file=sys.stderr, flush=True)


def short_path(filename: str) -> str:
    """The path style of the reports: relative to the working directory when the file is
    under it, absolute otherwise (as gradsan.Location.short_file)."""
    import os

    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return os.path.abspath(filename) if rel.startswith("..") else rel


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclasses.dataclass
class Failure:
    """The first non-finite gradient: the report plus what a reproducer needs."""

    backend: str
    report: Any
    call: int  # 1-based count of calls of this function (JAX) or of backward calls (torch)
    label: str  # "`train_step` (jax.jit)" / "loss.backward() at train.py:40 (main)"
    fun: Any = None  # JAX: the wrapped function, args, kwargs
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    kind: str = ""  # "jit", "grad", "value_and_grad"
    target: Any = None  # the function the user passed to jit/grad
    opts: dict = dataclasses.field(default_factory=dict)
    tensors: dict = dataclasses.field(default_factory=dict)  # torch: name -> (value, grad)
    traced: bool = True  # torch: False when the report only lists the non-finite gradients
    structure: bytes | None = None  # JAX: the inputs' pytree structure, pickled in the run
    environ: dict = dataclasses.field(default_factory=dict)  # the env variables the script read

    @property
    def header(self) -> str:
        if self.backend == "jax":
            return f"the {ordinal(self.call)} call of {self.label} returned NaN/Inf."
        return f"the {ordinal(self.call)} backward call, {self.label}, gave NaN/Inf gradients."


class Stop(BaseException):
    """Ends the script at the first non-finite gradient (a BaseException, like SystemExit,
    so the script's ``except Exception`` does not swallow it)."""

    def __init__(self, failure: Failure | None) -> None:
        super().__init__("gradsan stopped the script")
        self.failure = failure
