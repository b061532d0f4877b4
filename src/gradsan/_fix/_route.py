"""Which catalog entry a finding belongs to when the user's statement says more than the op:
``jnp.log2(x)`` / ``torch.log10(x)`` (log(x) / log(base)) and ``exp(p * log(a))`` (a power
written through a log) meet 0 in ``log``, whose entry is log-at-zero; their own entries
(``log2-log10-at-zero``, ``exp-log-at-zero``) explain them and carry their fixes.

The route reads the expression under the frame's caret (its column range), by the names the
file imports (``jnp`` is ``jax.numpy``): the call that made the ``log`` is the call there.
Without a located statement the finding keeps the op's entry.
"""

from __future__ import annotations

from .._report._records import Frame
from . import _rewrite as R
from ._site import locate

LOG2_LOG10 = "log2-log10-at-zero"
EXP_LOG = "exp-log-at-zero"


def route(entry_id: str | None, backend: str, where: Frame | None) -> str | None:
    """``entry_id``, or the entry of the statement's own form of the op (see the module)."""
    if entry_id != "log-at-zero" or where is None:
        return entry_id
    try:
        site = locate(where)
    except Exception:  # an unreadable file: the op's entry stands
        return entry_id
    if site is None:
        return entry_id
    call = R.read_call(site, site.node, backend)
    if call is not None and call.canon in ("log2", "log10"):
        return LOG2_LOG10
    if R.rewrite_exp_log(site, backend) is not None:
        return EXP_LOG
    return entry_id
