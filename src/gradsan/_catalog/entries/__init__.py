"""The entries, by family; ``ENTRIES`` is the families concatenated in the catalog's order.

Each family module holds its constants and its own ``ENTRIES``; README.md (one level up) says
what each field holds and where a new entry goes.
"""

from __future__ import annotations

from .._types import Singularity
from . import angles, inputs, kinks, library, logs, logs_extra, overflow, roots, special, where

ENTRIES: tuple[Singularity, ...] = (
    *roots.ENTRIES,
    *logs.ENTRIES,
    *logs_extra.ENTRIES,
    *angles.ENTRIES,
    *overflow.ENTRIES,
    *special.ENTRIES,
    *library.ENTRIES,
    *kinks.ENTRIES,
    *where.ENTRIES,
    *inputs.ENTRIES,
)
