"""The catalog: one entry per singular or non-smooth operation. Backend-free.

Messages, the CLI, docs and tests all read the mathematics from here; backends only map their
operations onto the canonical op names used by the entries.
"""

from ._types import Fix as Fix
from ._types import Singularity as Singularity
from .entries import ENTRIES as ENTRIES

_BY_ID = {e.id: e for e in ENTRIES}
if len(_BY_ID) != len(ENTRIES):  # pragma: no cover - guards the table itself
    raise RuntimeError("duplicate catalog ids")


def get(entry_id: str) -> Singularity:
    """The entry with this id. Raises KeyError listing the valid ids."""
    try:
        return _BY_ID[entry_id]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(entry_id, list(_BY_ID), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(
            f"no catalog entry {entry_id!r}.{hint} `gradsan catalog` lists all "
            f"{len(_BY_ID)} entries."
        ) from None


def ids() -> list[str]:
    return list(_BY_ID)


def by_op(op: str) -> list[Singularity]:
    """The entries for one canonical operation, in catalog order."""
    return [e for e in ENTRIES if e.op == op]


def for_library(name: str) -> Singularity | None:
    """The entry a library function (``norm``, ``std``) maps to, or None."""
    short = name.rsplit(".", 1)[-1].lstrip("_")
    for e in ENTRIES:
        if any(short == lib.rsplit(".", 1)[-1] for lib in e.library):
            return e
    return None
