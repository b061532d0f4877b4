"""NaN and Inf counts of many tensors at once (guard's replay: the leaves' gradients), with a
memo so that the report does not count again what the replay's backward already counted.

``counts(ts, memo)`` gives, per tensor, ``None`` where every element is finite, else
``(NaN count, Inf count)``. A finite sum proves a tensor finite; only the others are counted,
NaNs first and Infs only where the NaNs do not fill the tensor. Each step is one stack and one
sync per dtype and device, not one per tensor. The memo remembers a tensor by identity and
version counter (an in-place change bumps it), holding the tensor so that its identity stays
its own.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

Counts = tuple[int, int] | None
Memo = dict[int, tuple[torch.Tensor, int, Counts]]


def countable(t: Any) -> bool:
    """A plain real float tensor with values (subclasses, complex, ZeroTensors, meta: not)."""
    return (
        type(t) is torch.Tensor
        and t.is_floating_point()
        and not (t._is_zerotensor() or t.is_meta)
        and t.numel() > 0
    )


def recall(memo: Memo | None, t: torch.Tensor) -> tuple[bool, Counts]:
    """(known, counts) of ``t`` from the memo."""
    if memo is None:
        return False, None
    got = memo.get(id(t))
    if got is None or got[0] is not t or got[1] != t._version:
        return False, None
    return True, got[2]


def counts(
    ts: Sequence[torch.Tensor], memo: Memo | None = None, screen: bool = True
) -> list[Counts]:
    """The counts of each tensor (``countable`` ones; the caller checks the others).
    ``screen=False``: tensors that are likely not finite are counted without the sums first."""
    out: list[Counts] = [None] * len(ts)
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, t in enumerate(ts):
        known, c = recall(memo, t)
        if known:
            out[i] = c
        else:
            groups.setdefault((t.dtype, t.device), []).append(i)
    for idx in groups.values():
        if screen:
            sums = torch.stack([ts[i].sum() for i in idx]).tolist()
            maybe = [i for i, v in zip(idx, sums) if not math.isfinite(v)]
        else:
            maybe = idx
        if maybe:
            nans = torch.stack([torch.isnan(ts[i]).sum() for i in maybe]).tolist()
            rest = [j for j, i in enumerate(maybe) if nans[j] < ts[i].numel()]
            infs = [0] * len(maybe)
            if rest:
                got = torch.stack([torch.isinf(ts[maybe[j]]).sum() for j in rest]).tolist()
                for j, v in zip(rest, got):
                    infs[j] = int(v)
            for j, i in enumerate(maybe):
                nan, inf = int(nans[j]), infs[j]
                out[i] = (nan, inf) if nan or inf else None  # (else the sum overflowed)
        if memo is not None:
            for i in idx:
                memo[id(ts[i])] = (ts[i], ts[i]._version, out[i])
    return out


def verdict(c: Counts) -> bool | None:
    """``nonfinite``'s answer from the counts: None if finite, else whether there is a NaN."""
    if c is None:
        return None
    return c[0] > 0


def verdicts(
    ts: Sequence[torch.Tensor], memo: Memo | None = None, screen: bool = True
) -> list[bool | None]:
    """``nonfinite`` of each tensor: the countable ones counted together (and remembered)."""
    from ._mode import nonfinite

    out: list[bool | None] = [None] * len(ts)
    idx = [i for i, t in enumerate(ts) if countable(t)]
    for i, c in zip(idx, counts([ts[i] for i in idx], memo, screen)):
        out[i] = verdict(c)
    done = set(idx)
    for i, t in enumerate(ts):
        if i not in done:
            out[i] = nonfinite(t)
    return out


def memo_of(tracer: Any) -> Memo:
    """The tracer's memo (made on first use)."""
    memo = getattr(tracer, "counts_memo", None)
    if memo is None:
        memo = tracer.counts_memo = {}
    return memo


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector off for a bounded piece of gradsan's own work (the report), which
    makes many small objects while the traced step's objects make each pass long."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def copy(memo: Memo, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst`` holds the values of ``src`` (a copy): it gets ``src``'s counts, if known."""
    known, c = recall(memo, src)
    if known:
        memo[id(dst)] = (dst, dst._version, c)
