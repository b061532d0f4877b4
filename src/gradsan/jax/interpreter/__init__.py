"""The interpreter core shared by every gradsan transformation over jaxprs.

- :mod:`._core`: the loop, scopes and rule lookup (:class:`Interpreter`, :class:`Scope`).
- :mod:`._unroll`: higher-order rules that evaluate (``UNROLL``).
- :mod:`._restage`: higher-order rules that re-emit control flow with a carried sidecar.
"""

from ._core import Interpreter, Rule, Scope, library_name, to_numpy
from ._unroll import UNROLL

__all__ = ["UNROLL", "Interpreter", "Rule", "Scope", "library_name", "to_numpy"]
