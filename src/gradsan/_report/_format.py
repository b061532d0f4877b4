"""How reports quote a value: ``format_value(0.0) == "0.0"``, ``"inf"``, ``"1e-08"``."""

from __future__ import annotations

from typing import Any

import numpy as np


def format_value(v: Any) -> str:
    """One value as a report quotes it: a float's repr when it is short, else 6 significant
    digits; ``nan``, ``inf`` and ``-inf`` as such; anything else as ``str``."""
    v = np.asarray(v)
    if v.dtype.kind == "f" or v.dtype.kind == "V":
        f = float(v)
        if np.isnan(f):
            return "nan"
        if np.isinf(f):
            return "inf" if f > 0 else "-inf"
        return repr(f) if abs(f) < 1e6 and (f == 0 or abs(f) >= 1e-4) else f"{f:.6g}"
    return str(v.item() if v.ndim == 0 else v)
