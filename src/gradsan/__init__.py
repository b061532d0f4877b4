"""gradsan: a gradient sanitizer for JAX and PyTorch.

``import gradsan`` is backend-free; the backends are ``gradsan.jax`` and ``gradsan.torch``::

    import gradsan.jax as gsj
    report = gsj.explain(jax.grad(loss))(theta)
    print(report)
"""

from . import _catalog as catalog
from ._errors import GradsanError as GradsanError
from ._errors import NonFiniteError as NonFiniteError
from ._errors import UsageError as UsageError
from ._report import Finding as Finding
from ._report import Frame as Frame
from ._report import OutputHit as OutputHit
from ._report import Report as Report

__version__ = "0.1.0"

__all__ = [
    "Finding",
    "Frame",
    "GradsanError",
    "NonFiniteError",
    "OutputHit",
    "Report",
    "UsageError",
    "catalog",
]


def __getattr__(name: str):
    # `gradsan.jax` / `gradsan.torch` load on first use, so `import gradsan` stays backend-free.
    if name in ("jax", "torch"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'gradsan' has no attribute {name!r}")
