"""Kinks in series, the torch side: whether an earlier kink changes the gradient given the
one-sided choice at a later one.

:mod:`gradsan.torch._depends` decides each kink with the others at PyTorch's choice (the
cotangent the backward pass brings to it). A kink that feeds a later one can change the
gradient for another admissible choice there: ``torch.abs(torch.relu(x))`` at 0 returns 0
(abs's sign(0) = 0 blocks relu's choice) yet with abs on the side relu moves to, relu's choice
is the gradient, and abs's 0 is not that side's slope either. So, along each probe ``±d``, the
tangents are propagated through every kink at its one-sided choice (forward, while the step
runs): at each kink the tangents of its operands are read with the earlier kinks' corrections
``delta`` injected at their outputs (``u -> J^T u`` taken also at those outputs), giving its
own one-sided ``delta``; at the backward call the loss's tangent along ``±d`` is read so:
``L`` (every kink one-sided: the one-sided directional derivative) and, for each kink ``k``
with a non-zero ``delta``, ``L_k`` (``k`` at PyTorch's choice, the kinks after it one-sided
given that). ``k`` changes the gradient when ``L_k != L`` along one probe: a finding. A kink
whose output reaches the loss only through zero-slope sides of the later ones gives
``L_k = L`` and is counted. At most ``MAX`` kinks are given their own variant (each costs
4 more double-backward passes at every later kink); later ones are said in one line.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from ._depends import Checker

MAX = 8
AD = -1  # the variant with every kink at PyTorch's choice (no correction)
CHAIN = "one-sided derivatives equal to AD's"
REL = 1e-4  # |L - L_k| above this share of |L| + |L_k| (and TINY): k changes the gradient
TINY = 1e-30

OVER_NOTE = (
    "{n} kink(s) after the first {m} in series were checked with the later kinks at "
    "PyTorch's choice only (each one more costs a double-backward pass per direction at every "
    "later kink)"
)


@dataclasses.dataclass(eq=False)
class Link:
    """One kink's output and its one-sided corrections, per variant and column."""

    out: torch.Tensor
    corr: dict[int, list[np.ndarray | None]]  # variant -> per column (j, sign)
    vid: int | None  # the variant in which this kink is at PyTorch's choice


class Series:
    """The one-sided propagation of one sanitize session."""

    def __init__(self, checker: Checker, directions: int) -> None:
        self.checker = checker
        self.cols = [(j, s) for j in range(directions) for s in (1.0, -1.0)]
        self.links: list[Link] = []
        self.nvar = 1  # variant 0: every kink one-sided
        self.over = 0
        self.losses: list[dict[int, list[float]]] = []  # per backward call
        self.variant: int | None = None  # while a kink's operands are read for one variant

    # -- the tangents ------------------------------------------------------------------------
    def active(self) -> bool:
        return bool(self.links)

    def variants(self) -> list[int]:
        """Every kink one-sided (0), and each linked kink's own."""
        return [0] + [lk.vid for lk in self.links if lk.vid is not None]

    def _corr(self, link: Link, v: int) -> list[np.ndarray | None]:
        if v == link.vid or v == AD:
            return [None] * len(self.cols)
        return link.corr.get(v, link.corr[0])

    def rows(
        self, live: list[torch.Tensor], leaves: list[torch.Tensor], v: int
    ) -> list[dict[int, torch.Tensor | None]]:
        """Per column: {id(value): its tangent along that column's ``±d`` with the kinks'
        corrections of variant ``v`` injected}."""
        from ._depends import unwrapped_grad

        c = self.checker
        links = [lk for lk in self.links if lk.out.requires_grad]
        srcs = leaves + [lk.out for lk in links]
        us = [torch.zeros_like(x, requires_grad=True) for x in live]
        gs = unwrapped_grad(live, srcs, grad_outputs=us, create_graph=True, allow_unused=True)
        out = []
        for n, (j, s) in enumerate(self.cols):
            dirs = [s * d for d in c._directions(leaves, j)]
            for lk in links:
                cv = self._corr(lk, v)[n]
                dirs.append(
                    torch.zeros_like(lk.out)
                    if cv is None
                    else torch.from_numpy(np.array(cv, np.float64)).to(lk.out).reshape(lk.out.shape)
                )
            pairs = [(g, d) for g, d in zip(gs, dirs) if g is not None and g.requires_grad]
            js: tuple[torch.Tensor | None, ...] = (None,) * len(us)
            if pairs:
                js = unwrapped_grad(
                    [g for g, _ in pairs],
                    us,
                    grad_outputs=[d for _, d in pairs],
                    retain_graph=True,
                    allow_unused=True,
                )
            out.append({id(x): t for x, t in zip(live, js)})
        return out

    # -- one kink ----------------------------------------------------------------------------
    def at_kink(self, deltas_of: Any, fout: torch.Tensor) -> int | None:
        """Its one-sided corrections in every variant (``deltas_of()`` runs the kink's delta
        computation; its tangents come from :meth:`rows`); its own variant id, or None."""
        variants = self.variants()
        corr: dict[int, list[np.ndarray | None]] = {}
        for v in variants:
            self.variant = v
            try:
                res = deltas_of()
            finally:
                self.variant = None
            if res is None:
                return None
            corr[v] = _corrections(res, len(self.cols), len(self.cols), tuple(fout.shape))
        return self.link(fout, corr)

    def link(self, fout: torch.Tensor, corr: dict[int, list[np.ndarray | None]]) -> int | None:
        """Keep a kink's corrections for the kinks after it; its variant id (None: none)."""
        if not any(x is not None for cv in corr.values() for x in cv):
            return None  # its choice is AD's along every probe: nothing to propagate
        vid: int | None = None
        if sum(1 for lk in self.links if lk.vid is not None) < MAX:
            vid = self.nvar
            self.nvar += 1
        else:
            self.over += 1
        self.links.append(Link(fout, corr, vid))
        return vid

    # -- the loss ----------------------------------------------------------------------------
    def at_backward(self, roots: list[torch.Tensor], grads: list[Any]) -> None:
        """The loss's one-sided tangents, every variant, before the backward pass runs."""
        live = [r for r in roots if isinstance(r, torch.Tensor) and r.requires_grad]
        if not live or not self.links:
            return
        from ._depends import _leaves

        leaves = _leaves(live)
        if not leaves:
            return
        gmap = {id(r): g for r, g in zip(roots, grads)}
        got: dict[int, list[float]] = {}
        variants = [AD] + self.variants()
        try:
            with torch.enable_grad():
                for v in variants:
                    vals = []
                    for row in self.rows(live, leaves, v):
                        tot = 0.0
                        for r in live:
                            t = row.get(id(r))
                            if t is None:
                                continue
                            g = gmap.get(id(r))
                            w = torch.ones_like(t) if g is None else torch.as_tensor(g).to(t)
                            tot += float((t.detach().double() * w.detach().double()).sum())
                        vals.append(tot)
                    got[v] = vals
        except Exception:  # a graph without double backward: not decided so
            return
        self.losses.append(got)

    def chain(self) -> bool:
        """Whether the loss's one-sided derivative along every probe is AD's (the kinks undo
        each other: ``torch.minimum(torch.relu(x), 0)`` is 0 on both sides)."""
        if not self.losses or self.over:
            return False
        for got in self.losses:
            base, ad = got.get(0), got.get(AD)
            if base is None or ad is None:
                return False
            for a, b in zip(base, ad):
                diff = abs(a - b)
                if not math.isfinite(diff) or (diff > TINY and diff > REL * (abs(a) + abs(b))):
                    return False
        return True

    def depends(self, vid: int | None) -> bool:
        """Whether the kink with variant ``vid`` changes the loss's one-sided tangent."""
        if vid is None:
            return False
        for got in self.losses:
            base, mine = got.get(0), got.get(vid)
            if base is None or mine is None:
                continue
            for a, b in zip(base, mine):
                diff = abs(a - b)
                if not math.isfinite(diff) or (diff > TINY and diff > REL * (abs(a) + abs(b))):
                    return True
        return False


def _corrections(res: list, nrows: int, ncols: int, shape: tuple) -> list[np.ndarray | None]:
    """Per column (direction j, sign s), the tangent correction at the kink's output from
    ``_deltas``' list: ``nrows`` rows, each with its entries for s = +1, then s = -1. One row
    per direction (``nrows * 2 == ncols``), or one per column with its sign in the row (then
    its s = +1 entries are the column's)."""
    if not res or len(res) % (2 * nrows):
        return [None] * ncols
    per_row = len(res) // nrows
    half = per_row // 2
    out: list[np.ndarray | None] = []
    for n in range(ncols):
        if nrows == ncols:
            start = n * per_row
        else:
            start = (n // 2) * per_row + (n % 2) * half
        block = res[start : start + half]
        tot = None
        for delta, jump in block:
            if jump or not np.any(delta != 0):
                continue
            d = np.broadcast_to(np.asarray(delta, np.float64), shape)
            tot = d if tot is None else tot + d
        out.append(tot)
    return out
