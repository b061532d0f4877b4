"""gradsan's JAX backend.

import gradsan.jax as gsj
print(gsj.explain(jax.grad(loss))(params))     # where a NaN gradient was born, and why
step = gsj.guard(train_step)                    # raises gradsan.NonFiniteError, with the report
"""

from . import safe as safe
from ._explain import explain as explain
from ._guard import guard as guard
from ._nansafe import nansafe as nansafe
from ._sanitize import sanitize as sanitize
from ._subgradient import subgradient as subgradient
from .certify import certify as certify

__all__ = ["certify", "explain", "guard", "nansafe", "safe", "sanitize", "subgradient"]
