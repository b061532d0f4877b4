"""gradsan's PyTorch backend: ``import gradsan.torch as gst``.

- ``gst.explain()``: where a NaN/Inf in the loss or a ``.grad`` was born, why, and what to do.
- ``gst.guard(step)``: one fused finiteness check per step; on failure, replay and raise
  :class:`gradsan.NonFiniteError` with the explanation.
- ``gst.sanitize()``: also flag kinks (abs/relu at 0, ties, clamp bounds) and PyTorch
  conventions outside the admissible set.
- ``gst.nansafe()``: repair 0 * inf whose zero is structural; never a wrong finite gradient.
"""

from ._explain import explain as explain
from ._guard import guard as guard
from ._nansafe import nansafe as nansafe
from ._sanitize import sanitize as sanitize

try:
    from . import safe as safe
except ImportError:  # safe.py is optional (or still being written)
    pass

__all__ = ["explain", "guard", "nansafe", "sanitize"]
