"""Mixed precision: what a ``torch.amp.GradScaler`` step means for gradsan's checks.

A GradScaler multiplies the loss by a large scale before backward, so that small float16
gradients do not flush to zero; the first steps (and any step after the scale grew) overflow
*by design*: ``scaler.step(opt)`` finds the inf/NaN gradients, skips ``opt.step()`` and
``scaler.update()`` halves the scale. Such a step is a note (counted), never an error. Two
things are errors:

- a non-finite gradient that survives unscaling on a step the scaler does **not** skip (an
  optimizer stepping on it, or a gradient outside the optimizers the scaler checked);
- a scale that collapses: skipped steps halved it below 1 (torch's own warning: "if the scale
  falls below 1 ... something is likely wrong"), or to 0 / a non-finite value. Scaling cannot
  explain a gradient that overflows even when the loss is multiplied by less than 1.

:class:`Watch` patches ``GradScaler.scale`` / ``step`` / ``update`` while it is active (guard:
one step; ``gradsan run``: the whole script) and records per-scaler statistics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._mode import all_finite

_Scaler: Any = torch.amp.GradScaler


def _fmt_scale(s: float) -> str:
    if s > 0 and math.isfinite(s):
        e = math.log2(s)
        if e == int(e) and abs(e) >= 4:
            return f"2**{int(e)}"
    return f"{s:g}"


@dataclasses.dataclass
class Stats:
    """One GradScaler's history, as gradsan saw it."""

    steps: int = 0  # update() calls
    skipped: int = 0  # steps the scaler skipped (inf/NaN gradients)
    skipped_at: list[int] = dataclasses.field(default_factory=list)  # 1-based, first few
    nonfinite_loss: int = 0  # skipped steps whose (scaled) loss itself was non-finite
    consecutive: int = 0  # skipped in a row, up to the last update
    first_scale: float | None = None
    last_scale: float | None = None
    step_skipped: bool = False  # the current step (since the last update)
    step_loss_bad: bool = False

    def summary(self) -> str:
        if not self.skipped:
            return ""
        at = ", ".join(str(i) for i in self.skipped_at)
        if self.skipped > len(self.skipped_at):
            at += ", ..."
        scales = ""
        if self.first_scale is not None and self.last_scale is not None:
            scales = f"; scale {_fmt_scale(self.first_scale)} -> {_fmt_scale(self.last_scale)}"
        loss = ""
        if self.nonfinite_loss:
            loss = (
                f"; on {self.nonfinite_loss} of them the loss itself was non-finite "
                "(the forward pass, not the scaling)"
            )
        return (
            f"GradScaler skipped {self.skipped} of {self.steps} step(s) on inf/NaN gradients "
            f"(step {at}{scales}{loss}): the scaler's design, not an error; gradsan reports a "
            "scale that collapses below 1 and a non-finite gradient the scaler does not skip"
        )


_STATS: weakref.WeakKeyDictionary[Any, Stats] = weakref.WeakKeyDictionary()


def stats_of(scaler: Any) -> Stats:
    st = _STATS.get(scaler)
    if st is None:
        st = _STATS[scaler] = Stats()
    return st


def _found_inf(scaler: Any, opt: Any) -> bool:
    state = scaler._per_optimizer_states.get(id(opt))
    if not state:
        return False
    return any(float(v.item()) != 0.0 for v in state["found_inf_per_device"].values())


def _scale_value(scaler: Any) -> float | None:
    s = getattr(scaler, "_scale", None)
    return None if s is None else float(s.item())


def collapsed(scale: float | None) -> bool:
    return scale is not None and (not math.isfinite(scale) or scale < 1.0)


class Watch:
    """While active, GradScaler's ``scale``, ``step`` and ``update`` report to this object.

    Subclasses react: ``on_unskipped(scaler, opt)`` after a step the scaler did not skip,
    ``on_collapse(scaler, stats)`` after an update that left the scale collapsed.
    """

    def __init__(self) -> None:
        self.scaled: dict[int, tuple[weakref.ref, Any]] = {}  # data_ptr -> (loss, scaler)
        # data_ptr of a scaled loss -> the loss as the step gave it to scale(), until update()
        self.unscaled_of: dict[int, torch.Tensor] = {}
        self.scalers: list[Any] = []
        self.skipped = False  # a step this watch saw was skipped by its scaler
        self.collapse: tuple[Any, Stats] | None = None
        self._undo: list[tuple[str, Any]] = []  # (method name, the original to put back)
        self._built: tuple[tuple, list] | None = None  # (the originals, their wrappers)
        self.enabled = True

    # -- patching ------------------------------------------------------------------------------
    def patch(self, setter: Callable[[Any, str, Any], None] | None = None) -> Watch:
        """Patch GradScaler; ``setter(obj, attr, value)`` records the undo itself (gradsan
        run's Hooks.set), else ``unpatch`` undoes it."""
        orig_scale, orig_step, orig_update = _Scaler.scale, _Scaler.step, _Scaler.update
        built = self._built
        if (
            setter is None
            and built is not None
            and built[0]
            == (
                orig_scale,
                orig_step,
                orig_update,
            )
        ):  # guard patches on every step: the wrappers of these originals, made once
            for name, fn, orig in built[1]:
                setattr(_Scaler, name, fn)
                self._undo.append((name, orig))
            return self
        watch = self

        def scale(scaler: Any, outputs: Any) -> Any:
            out = orig_scale(scaler, outputs)
            if watch.enabled and scaler._enabled:
                watch._mark(scaler, out, outputs)
            return out

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not (watch.enabled and scaler._enabled):
                return orig_step(scaler, optimizer, *args, **kwargs)
            ret = watch.before_step(scaler, optimizer, args, kwargs)
            if ret is not _RUN:
                return ret
            ret = orig_step(scaler, optimizer, *args, **kwargs)
            watch._after_step(scaler, optimizer)
            return ret

        def update(scaler: Any, new_scale: Any = None) -> None:
            if not (watch.enabled and scaler._enabled) or new_scale is not None:
                return orig_update(scaler, new_scale)
            if not watch.before_update(scaler):
                return None
            orig_update(scaler, None)
            watch._after_update(scaler)
            return None

        pairs: list[tuple[str, Any, Any]] = [
            ("scale", scale, orig_scale),
            ("step", step, orig_step),
            ("update", update, orig_update),
        ]
        for name, fn, orig in pairs:
            fn.__wrapped__ = orig
            fn.__name__ = name
            fn.__qualname__ = f"GradScaler.{name}"
            if setter is not None:
                setter(_Scaler, name, fn)
            else:
                setattr(_Scaler, name, fn)
                self._undo.append((name, orig))
        if setter is None:
            self._built = ((orig_scale, orig_step, orig_update), pairs)
        return self

    def unpatch(self) -> None:
        while self._undo:
            name, orig = self._undo.pop()
            setattr(_Scaler, name, orig)

    def __enter__(self) -> Watch:
        return self.patch()

    def __exit__(self, *exc: Any) -> None:
        self.unpatch()

    # -- events ----------------------------------------------------------------------------------
    def _mark(self, scaler: Any, out: Any, unscaled: Any = None) -> None:
        if all(s is not scaler for s in self.scalers):
            self.scalers.append(scaler)
        st = stats_of(scaler)
        if st.first_scale is None:
            st.first_scale = _scale_value(scaler)
        for t in _tensors(out):
            self.scaled[t.data_ptr()] = (weakref.ref(t), scaler)
        if unscaled is not None:  # the loss as the step gave it (kept until the update)
            for t, u in zip(_tensors(out), _tensors(unscaled)):
                self.unscaled_of[t.data_ptr()] = u

    def scaler_of(self, t: torch.Tensor) -> Any:
        """The GradScaler whose ``scale()`` made ``t`` (or a detached view of it), else None."""
        hit = self.scaled.get(t.data_ptr())
        if hit is None:
            return None
        ref, scaler = hit
        orig = ref()
        if orig is None or orig.shape != t.shape or orig.dtype != t.dtype:
            return None
        return scaler

    def before_step(self, scaler: Any, opt: Any, args: tuple, kwargs: dict) -> Any:
        return _RUN

    def before_update(self, scaler: Any) -> bool:
        return True

    def _after_step(self, scaler: Any, opt: Any) -> None:
        st = stats_of(scaler)
        if _found_inf(scaler, opt):
            st.step_skipped = True
            self.skipped = True
        else:
            self.on_unskipped(scaler, opt)

    def _after_update(self, scaler: Any) -> None:
        st = stats_of(scaler)
        st.steps += 1
        skipped, st.step_skipped = st.step_skipped, False
        loss_bad, st.step_loss_bad = st.step_loss_bad, False
        if not skipped:
            st.consecutive = 0
            self.scaled.clear()
            self.unscaled_of.clear()
            return
        st.skipped += 1
        st.consecutive += 1
        st.nonfinite_loss += loss_bad
        if len(st.skipped_at) < 8:
            st.skipped_at.append(st.steps)
        st.last_scale = _scale_value(scaler)
        self.scaled.clear()
        self.unscaled_of.clear()
        if collapsed(st.last_scale):
            self.collapse = (scaler, st)
            self.on_collapse(scaler, st)

    def on_unskipped(self, scaler: Any, opt: Any) -> None:
        pass

    def on_collapse(self, scaler: Any, st: Stats) -> None:
        pass

    # -- words -------------------------------------------------------------------------------------
    def notes(self) -> list[str]:
        return [s for s in (stats_of(sc).summary() for sc in self.scalers) if s]

    def collapse_note(self, scaler: Any, st: Stats) -> str:
        return collapse_note(st)


_RUN: Any = object()


def collapse_note(st: Stats) -> str:
    first = _fmt_scale(st.first_scale) if st.first_scale is not None else "?"
    last = _fmt_scale(st.last_scale) if st.last_scale is not None else "?"
    return (
        f"the GradScaler skipped {st.consecutive} step(s) in a row and its scale collapsed "
        f"({first} -> {last}): the gradients overflow even with the loss multiplied by less "
        "than 1, so the scaling does not explain them; the origin above is a real NaN/Inf "
        "(training makes no progress while every step is skipped)"
    )


LOSS_BAD_NOTE = (
    "the loss was already non-finite when the step gave it to GradScaler.scale (the forward "
    "pass made it, not the scaling): the scaler skips such a step, but no scale can fix it, "
    "so gradsan reports it at once"
)


def unscaled_bad(watch: Watch, scaled: list) -> bool:
    """Whether a loss ``scale()`` was given, of the scaled tensors ``scaled``, was already
    non-finite (read only when asked: on a step whose gradients are non-finite)."""
    for t in scaled:
        u = watch.unscaled_of.get(t.data_ptr()) if isinstance(t, torch.Tensor) else None
        if u is not None and not all_finite(u.detach()):
            return True
    return False


def scaled_note(scaler: Any) -> str:
    st = stats_of(scaler)
    s = _scale_value(scaler)
    text = f"this backward was of a loss scaled by a GradScaler (scale {_fmt_scale(s or 0.0)})"
    if st.consecutive:
        first = _fmt_scale(st.first_scale) if st.first_scale is not None else "?"
        text += (
            f"; the scaler had skipped the {st.consecutive} step(s) before it and its scale fell "
            f"from {first}: not an overflow the scaling causes"
        )
    return text


# ---- guard ---------------------------------------------------------------------------------------


def _snapshot(scaler: Any) -> tuple:
    states = {k: dict(v) for k, v in scaler._per_optimizer_states.items()}
    scale = scaler._scale.clone() if scaler._scale is not None else None
    tracker = scaler._growth_tracker.clone() if scaler._growth_tracker is not None else None
    return scale, tracker, states


def _restore(scaler: Any, snap: tuple) -> None:
    from collections import defaultdict

    from torch.amp.grad_scaler import _refresh_per_optimizer_state

    scale, tracker, states = snap
    if scale is not None and scaler._scale is not None:
        scaler._scale.copy_(scale)
    if tracker is not None and scaler._growth_tracker is not None:
        scaler._growth_tracker.copy_(tracker)
    scaler._per_optimizer_states = defaultdict(
        _refresh_per_optimizer_state, {k: dict(v) for k, v in states.items()}
    )


class GuardWatch(Watch):
    """One guarded step: remembers each scaler's state at its first ``scale()`` so that the
    replay runs with the same scale and leaves the scaler as the step left it."""

    def __init__(self) -> None:
        super().__init__()
        self.before: dict[int, tuple] = {}
        self.replay = False
        self.unscaled: list[torch.Tensor] = []  # the losses the step gave scale() (unread)
        self.loss_bad = False  # one was non-finite before scaling (read on a skipped step)

    def reset(self) -> GuardWatch:
        """Ready for the next step (guard keeps one watch, and its wrappers, per guard)."""
        if self.scalers or self.scaled or self.before or self.skipped or self.collapse:
            self.scaled = {}
            self.scalers = []
            self.before = {}
            self.skipped = False
            self.collapse = None
            self.unscaled_of = {}
            self.unscaled = []
            self.loss_bad = False
        self.enabled = True
        self.replay = False
        return self

    def _mark(self, scaler: Any, out: Any, unscaled: Any = None) -> None:
        if id(scaler) not in self.before and not self.replay:
            self.before[id(scaler)] = _snapshot(scaler)
        if not self.replay:  # (kept past update(): guard reads them after the step)
            self.unscaled += [t for t in _tensors(unscaled) if t.is_floating_point()]
        super()._mark(scaler, out, None if self.replay else unscaled)

    def before_step(self, scaler: Any, opt: Any, args: tuple, kwargs: dict) -> Any:
        # the replay explains the gradients: no unscaling, no update
        return None if self.replay else _RUN

    def before_update(self, scaler: Any) -> bool:
        return not self.replay

    def ignorable(self) -> bool:
        """The step's non-finite gradients are ones its GradScaler skipped: a note. Not when
        a loss was already non-finite before scale() (the forward pass made it: skipping
        the step and lowering the scale cannot fix that); read only on a skipped step."""
        if not (self.skipped and self.collapse is None):
            return False
        self.loss_bad = not all(all_finite(t.detach()) for t in self.unscaled)
        return not self.loss_bad

    def report_notes(self) -> list[str]:
        if self.collapse is not None:
            return [collapse_note(self.collapse[1])]
        if self.loss_bad:
            return [LOSS_BAD_NOTE]
        if self.scalers:
            return [
                "the step used a GradScaler, which did not skip it: the non-finite gradient "
                "survived unscaling and reached the optimizer"
            ]
        return []

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        """Around guard's replay of the step: the scale the step ran with, no scaler
        ``step``/``update``, and the scaler left as the step left it."""
        if not self.scalers:
            yield
            return
        after = [(sc, _snapshot(sc)) for sc in self.scalers]
        for sc in self.scalers:
            if id(sc) in self.before:
                _restore(sc, self.before[id(sc)])
        self.replay = True
        self.patch()
        try:
            yield
        finally:
            self.unpatch()
            self.replay = False
            for sc, snap in after:
                _restore(sc, snap)


def _tensors(x: Any) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def mark_loss_bad(watch: Watch, t: torch.Tensor) -> None:
    """A scaled loss that is itself non-finite: counted apart in the note."""
    scaler = watch.scaler_of(t)
    if scaler is not None and not bool(torch.isfinite(t.detach()).all()):
        stats_of(scaler).step_loss_bad = True


# ---- gradsan run ----------------------------------------------------------------------------------


@dataclasses.dataclass
class _Pending:
    """A scaled backward whose gradients were non-finite: its GradScaler decides."""

    call: int
    label: str
    leaves: list
    frame: Any
    scaler: Any


class RunWatch(Watch):
    """`gradsan run`'s GradScaler watch, for the whole script: a scaled backward with
    non-finite gradients is deferred to its scaler (``deferred``); a step the scaler does not
    skip with them still there, or a collapsed scale, is a failure of that backward call."""

    def __init__(self, hooks: Any) -> None:
        super().__init__()
        self.hooks = hooks
        self.pending: _Pending | None = None
        self.replayed: Any = None  # the replay child: the scaler of the traced backward
        self.failed = False
        self.loss_bad = False  # a deferred-looking backward's loss was non-finite unscaled

    def install(self) -> RunWatch:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        hooks = self.hooks
        self.patch(hooks.set)
        handle = register_optimizer_step_pre_hook(self._pre_step)
        hooks.undo.append(handle.remove)
        hooks.undo.append(self._summary)
        hooks.annotate_failures(self._failed)
        return self

    @property
    def checking(self) -> bool:
        return self.hooks.enabled and self.hooks.replay_step is None

    def deferred(self, call: int, leaves: list, extra: list) -> bool:
        """Backward call ``call`` gave non-finite gradients: True if its loss was scaled by a
        GradScaler, whose ``step`` decides (skip: a note; no skip: a failure)."""
        scaler = next((s for s in map(self.scaler_of, extra) if s is not None), None)
        if scaler is None:
            return False
        if unscaled_bad(self, extra):  # the forward made it: no skip can fix it, report now
            self.loss_bad = True
            if not self.checking:
                self.replayed = scaler
            return False
        if not self.checking:
            self.replayed = scaler  # the replay child traces it: say it was scaled
            return False
        for t in extra:
            mark_loss_bad(self, t)
        if self.pending is None:
            from .._run._patch_torch import _user_frame_text

            frame = _user_frame(sys._getframe(1))
            where = _user_frame_text(2)
            self.pending = _Pending(
                call, f"at {where}" if where else "(unknown line)", list(leaves), frame, scaler
            )
        return True

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        __tracebackhide__ = True
        p = self.pending
        if p is None or not self.checking:
            return
        from ._guard import _grads, _opt_params, finite

        if not finite(_grads(_opt_params(opt))):
            self._fail(
                p,
                "the optimizer stepped on gradients of a GradScaler-scaled loss that are "
                "non-finite (called without scaler.step, which would have skipped it?)",
            )

    def on_unskipped(self, scaler: Any, opt: Any) -> None:
        __tracebackhide__ = True
        p = self.pending
        if p is None or not self.checking:
            return
        from ._guard import _grads, finite

        if not finite(_grads(p.leaves)):
            self._fail(
                p,
                "the GradScaler did not skip this step (the optimizer's gradients were finite "
                "after unscaling), but these gradients outside it stayed non-finite",
            )

    def _after_update(self, scaler: Any) -> None:
        __tracebackhide__ = True
        super()._after_update(scaler)
        if self.pending is not None and self.pending.scaler is scaler and self.collapse is None:
            self.pending = None

    def on_collapse(self, scaler: Any, st: Stats) -> None:
        __tracebackhide__ = True
        p = self.pending
        if p is None or not self.checking:
            return
        self._fail(p, collapse_note(st))

    def _fail(self, p: _Pending, note: str) -> None:
        __tracebackhide__ = True
        from .._run._failure import Failure
        from .._run._patch_torch import _torch_summary, _torch_tensors

        self.pending = None
        grads = _grads_of(p.leaves)
        report = _torch_summary(p.leaves, grads, p.frame)
        report.notes.append(note)
        self.hooks.on_failure(
            Failure(
                backend="torch",
                report=report,
                call=p.call,
                label=p.label,
                tensors=_torch_tensors(p.leaves, p.frame),
                traced=False,
            )
        )

    def _failed(self, f: Any) -> None:
        self.failed = True
        self.annotate(f)

    def annotate(self, f: Any) -> None:
        """The replay child's traced report of a scaled backward says so."""
        if self.replayed is not None and f.report is not None:
            f.report.notes.append(scaled_note(self.replayed))
            if self.loss_bad:
                f.report.notes.append(LOSS_BAD_NOTE)

    def _summary(self) -> None:
        if not self.checking or self.failed:
            return
        from .._run._failure import say

        for n in self.notes():
            say(n)


def _grads_of(leaves: list) -> list:
    return [p.grad for p in leaves if p.grad is not None and p.grad.is_floating_point()]


def _user_frame(f: Any) -> Any:
    from .._userfile import is_user_file

    while f is not None and not is_user_file(f.f_code.co_filename):
        f = f.f_back
    return f


# ---- autocast ----------------------------------------------------------------------------------

_HALF = (torch.float16, torch.bfloat16)


def cast_source(tracer: Any, a: torch.Tensor, node: Any) -> Any:
    """A non-finite float16/bfloat16 tensor that a backward op read and that no traced op
    produced: under autocast it is the cast autocast made of an operand, inside the op (below
    the torch-function layer the tracer sees). The cast as an event: from the traced float32
    tensor it copies when that one was non-finite already (the NaN/Inf is that op's, not "in
    the input"), else the cast's own overflow into the autocast dtype. None when ``a`` is not
    such a cast."""
    if a.dtype not in _HALF:
        return None
    from ._mode import Event, Tag, _tag_of, is_float, nonfinite

    consumer = _tag_of(node)
    if consumer is None:
        return None  # an op the forward did not see: not under the user's autocast block
    nan = nonfinite(a)
    if nan is None:
        return None
    src = None
    bad = ~torch.isfinite(a)
    for ev in list(tracer.fwd.values()):
        o = ev.out
        if o.shape != a.shape or o.dtype == a.dtype or not is_float(o):
            continue
        with torch.no_grad():
            if torch.equal(~torch.isfinite(o), bad) and torch.equal(
                torch.nan_to_num(o.to(a.dtype)), torch.nan_to_num(a)
            ):
                src = ev
                break
    name = f"autocast cast to {str(a.dtype).replace('torch.', '')}"
    tag = Tag(name, None, consumer.frame, None, (), {}, consumer.module, "torch.autocast")
    if src is not None:
        return Event("forward", name, tag, None, a, [(src.out, src)], nan=bool(nan))
    ev = Event("forward", name, tag, None, a, [], nan=bool(nan))
    ev.nan_new = bool(nan)
    return ev
