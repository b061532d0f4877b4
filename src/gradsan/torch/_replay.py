"""guard's replay of a failing step, and what it re-runs.

To explain a failing step, guard calls the step function again under the tracer: **the step's
Python runs a second time**. What would change training is taken care of: the replay sees the
batches the step pulled (recorded by a tap on each iterator the step reaches, never pulled
again), the parameters as the step saw them (an earlier optimizer's update in the same step is
undone for the replay and put back after), the RNG state of the step's start; no optimizer
steps, no scheduler runs, and the buffers, RNG state and parameters are put back to what the
step itself left. The step's own Python state that is cheap to compare (:class:`PythonState`:
the lists, dicts, sets, deques, numbers and strings the step names through its closure, its
globals and a bound method's object) is compared after the replay and put back; what changed
is named in the report's note. Anything else the step's Python does (a print, logging, a
file write, an object it reaches deeper) happens a second time, and the note says so.
"""

from __future__ import annotations

import collections
import contextlib
import io
from collections.abc import Iterator
from typing import Any

import torch

from ._nodes import _same_bits as same_bits


class Unsafe(Exception):
    """The replay would have a side effect (a reason, in words)."""


def _is_iterator(v: Any) -> bool:
    """A data iterator the step may pull from (not a file or other context manager, which a
    stand-in could not replace)."""
    t = type(v)
    return (
        hasattr(t, "__next__")
        and not hasattr(t, "__enter__")
        and not isinstance(v, (torch.Tensor, torch.nn.Module, str, bytes, io.IOBase, Tap))
    )


class Tap:
    """Stands for one of the user's iterators during a step: passes each item through and keeps
    it (for this step only); in the replay, hands the same items out again."""

    def __init__(self, it: Any, name: str) -> None:
        self.it = it
        self.name = name
        self.items: list[Any] = []
        self.replay: list[Any] | None = None

    def __iter__(self) -> Tap:
        return self

    def __next__(self) -> Any:
        if self.replay is not None:
            if not self.replay:
                raise Unsafe(
                    f"the replay asked `{self.name}` for more items than the step took from it"
                )
            return self.replay.pop(0)
        v = next(self.it)
        self.items.append(v)
        return v

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.it, attr)

    def __len__(self) -> int:
        return len(self.it)


class Bindings:
    """Where the step finds its iterators (closure cells, globals, a bound method's object)."""

    def __init__(self, fn: Any) -> None:
        self.places: list[tuple[Any, str, str]] = []  # (cell or dict, key, name)
        fn = getattr(fn, "__wrapped__", fn)
        code = getattr(fn, "__code__", None)
        if code is None and callable(fn):  # a callable object: its __call__
            fn = type(fn).__call__
            code = getattr(fn, "__code__", None)
        if code is not None:
            for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
                self.places.append((cell, "", name))
            g = getattr(fn, "__globals__", {})
            self.places += [(g, n, n) for n in code.co_names if n in g]
        obj = getattr(fn, "__self__", None)
        if obj is not None and hasattr(obj, "__dict__"):
            self.places += [(vars(obj), k, f"self.{k}") for k in list(vars(obj))]

    @staticmethod
    def _get(place: Any, key: str) -> Any:
        if key == "":
            try:
                return place.cell_contents
            except ValueError:
                return None
        return place.get(key)

    @staticmethod
    def _set(place: Any, key: str, v: Any) -> None:
        if key == "":
            place.cell_contents = v
        else:
            place[key] = v

    @contextlib.contextmanager
    def tapped(self, taps: list[Tap]) -> Iterator[None]:
        """Put a Tap in place of each iterator the step reaches, for the block (appended to
        ``taps``)."""
        installed = self.tap(taps)
        try:
            yield
        finally:
            self.untap(installed)

    def tap(self, taps: list[Tap]) -> list[tuple[Any, str, Tap]]:
        """Put a Tap in place of each iterator the step reaches (appended to ``taps``); what
        ``untap`` takes back out. (guard, on every step: no allocation when there is none.)"""
        installed: list[tuple[Any, str, Tap]] = _NONE
        for place, key, name in self.places:
            if key == "":
                try:
                    v = place.cell_contents
                except ValueError:
                    continue
            else:
                v = place.get(key)
            if hasattr(type(v), "__next__") and _is_iterator(v):
                tap = Tap(v, name)
                self._set(place, key, tap)
                if installed is _NONE:
                    installed = []
                installed.append((place, key, tap))
                taps.append(tap)
        self.last = installed
        return installed

    def untap(self, installed: list[tuple[Any, str, Tap]]) -> None:
        if installed:
            self._undo(installed)

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        """Put the last step's taps back in place, handing out the items the step took."""
        installed = list(self.last)
        for place, key, tap in installed:
            tap.replay = list(tap.items)
            self._set(place, key, tap)
        try:
            yield
        finally:
            self._undo(installed)

    def _undo(self, installed: list[tuple[Any, str, Tap]]) -> None:
        for place, key, tap in installed:
            if self._get(place, key) is tap:  # unless the step rebound the name itself
                self._set(place, key, tap.it)

    last: list[tuple[Any, str, Tap]] = []


_NONE: list[Any] = []  # (never appended to: a step that reached no iterator)


def tap_args(args: tuple, kwargs: dict, taps: list[Tap]) -> tuple[tuple, dict]:
    """The step's arguments with a Tap for each iterator among them."""
    if not any(_is_iterator(a) for a in (*args, *kwargs.values())):
        return args, kwargs

    def tap(v: Any, name: str) -> Any:
        if _is_iterator(v):
            t = Tap(v, name)
            taps.append(t)
            return t
        return v

    return (
        tuple(tap(a, f"args[{i}]") for i, a in enumerate(args)),
        {k: tap(v, k) for k, v in kwargs.items()},
    )


@contextlib.contextmanager
def no_updates(optimizers: list[Any]) -> Iterator[list[Any]]:
    """Optimizers' ``step`` and every LR scheduler's ``step`` do nothing in the block (the
    instances' attribute shadows the method; schedulers by their classes). Yields the list of
    the objects whose step was skipped."""
    skipped: list[Any] = []
    undo: list[Any] = []

    def noop_for(obj: Any) -> Any:
        def step(*a: Any, **k: Any) -> None:
            skipped.append(obj)

        return step

    for opt in optimizers:
        if "step" in vars(opt):
            continue
        opt.step = noop_for(opt)
        undo.append(lambda o=opt: delattr(o, "step"))
    import torch.optim.lr_scheduler as sched

    for cls in vars(sched).values():
        if isinstance(cls, type) and "step" in vars(cls) and hasattr(cls, "get_last_lr"):
            orig = vars(cls)["step"]

            def step(self: Any, *a: Any, **k: Any) -> None:
                skipped.append(self)

            _set_step(cls, step)
            undo.append(lambda c=cls, o=orig: _set_step(c, o))
    try:
        yield skipped
    finally:
        for u in reversed(undo):
            u()


def _set_step(obj: Any, fn: Any) -> None:
    name = "step"
    setattr(obj, name, fn)


class ModuleState:
    """Parameters and buffers: what the step left, to put back after the replay."""

    def __init__(self, modules: list[torch.nn.Module], params: list[torch.Tensor]) -> None:
        seen: dict[int, torch.Tensor] = {}
        for m in modules:
            for t in m.parameters():
                seen.setdefault(id(t), t)
        for p in params:
            seen.setdefault(id(p), p)
        self.tensors = list(seen.values())
        # buffers are put back whatever their version says (batch_norm's kernel updates the
        # running statistics without counting a version)
        self.buffers = list({id(b): b for m in modules for b in m.buffers()}.values())
        with torch.no_grad():
            self.buffers_saved = [b.detach().clone() for b in self.buffers]
        with torch.no_grad():
            self.saved = [t.detach().clone() for t in self.tensors]
        self.versions = [t._version for t in self.tensors]

    def restore(self) -> None:
        """Put back every tensor changed in place since: its version counter moved, or its
        bits differ (a write through ``p.data`` does not count a version)."""
        with torch.no_grad():
            for t, s, v in zip(self.tensors, self.saved, self.versions):
                if t._version != v or not same_bits(t.detach(), s):
                    t.copy_(s)
            for b, s in zip(self.buffers, self.buffers_saved):
                b.copy_(s)


def replay_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The step's arguments for the replay: each Tap hands out what the step took."""

    def again(v: Any) -> Any:
        if isinstance(v, Tap):
            v.replay = list(v.items)
        return v

    return tuple(again(a) for a in args), {k: again(v) for k, v in kwargs.items()}


_CONTAINERS = (list, dict, set, collections.deque, bytearray)
_SCALARS = (int, float, complex, str, bytes, type(None))  # (bool is an int)


def _same(a: Any, b: Any) -> bool:
    """Whether a container holds the same items (by identity: no tensor ``__eq__``)."""
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and b[k] is v for k, v in a.items())
    if isinstance(a, set):
        return a == b
    if isinstance(a, bytearray):
        return a == b
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 30 else r[:27] + "..."


class PythonState:
    """The step's Python state that is cheap to compare, kept before the replay: each list,
    dict, set, deque and bytearray (a shallow copy) and each number or string the step names
    (its closure cells, the globals its code names, a bound method's object's attributes)."""

    def __init__(self, bindings: Bindings) -> None:
        self.kept: list[tuple[Any, str, str, Any, Any]] = []  # (place, key, name, value, copy)
        seen: set[tuple[int, str]] = set()
        for place, key, name in bindings.places:
            if (id(place), key) in seen:
                continue
            seen.add((id(place), key))
            v = Bindings._get(place, key)
            if type(v) in _CONTAINERS:
                self.kept.append((place, key, name, v, type(v)(v)))
            elif isinstance(v, _SCALARS) and not isinstance(v, Tap):
                self.kept.append((place, key, name, v, None))

    def restore(self) -> list[str]:
        """Put back what the replay changed; each change in words ("`log` (a list: 3 -> 4
        items)")."""
        changed: list[str] = []
        for place, key, name, v, saved in self.kept:
            now = Bindings._get(place, key)
            if saved is None:  # a number or a string: was the name rebound?
                if now is not v and now != v:
                    changed.append(f"`{name}` ({_short(v)} -> {_short(now)})")
                    Bindings._set(place, key, v)
                continue
            if now is not v:  # rebound to another object
                changed.append(f"`{name}` (rebound to another {type(now).__name__})")
                Bindings._set(place, key, v)
            if _same(saved, v):
                continue
            kind = type(v).__name__
            if len(v) != len(saved):
                changed.append(f"`{name}` (a {kind}: {len(saved)} -> {len(v)} items)")
            else:
                changed.append(f"`{name}` (a {kind}: its items changed)")
            _refill(v, saved)
        return changed


_REWIND_MAX = 256  # a container with more items is not copied on every step (a growing log)


class StartState:
    """What the step's named numbers, strings and small containers held when the step began
    (guard keeps it on every call: the replay starts from it, not from what the step left,
    so a step that advances a counter at its top replays its own batch). A container is
    copied shallowly; one of more than _REWIND_MAX items is not copied (``skipped``)."""

    __slots__ = ("kept", "skipped")

    def __init__(self, bindings: Bindings) -> None:
        kept: list[tuple[Any, str, Any, Any]] = []  # (place, key, value, copy or _SCALAR)
        skipped: list[str] = []
        for place, key, name in bindings.places:
            if key == "":
                try:
                    v = place.cell_contents
                except ValueError:
                    continue
            else:
                v = place.get(key)
            t = type(v)
            if t in _SCALAR_TYPES:
                kept.append((place, key, v, _SCALAR))
            elif t in _CONTAINER_TYPES:
                if len(v) <= _REWIND_MAX:
                    kept.append((place, key, v, t(v)))
                else:
                    skipped.append(name)
        self.kept = kept
        self.skipped = skipped

    def rewind(self) -> None:
        """Put each kept name back to its value at the step's start (containers in place)."""
        for place, key, v, saved in self.kept:
            if Bindings._get(place, key) is not v:
                Bindings._set(place, key, v)
            if saved is _SCALAR:
                continue
            _refill(v, saved)


_SCALAR = object()
_CONTAINER_TYPES = frozenset(_CONTAINERS)
_SCALAR_TYPES = frozenset((int, float, complex, str, bytes, bool, type(None)))


def _refill(v: Any, saved: Any) -> None:
    if isinstance(v, (list, bytearray)):
        v[:] = saved
    elif isinstance(v, collections.deque):
        v.clear()
        v.extend(saved)
    else:
        v.clear()
        v.update(saved)


def ran_twice_note(changed: list[str], start: StartState | None = None) -> str:
    """The report's note on the replay: the step's Python ran a second time."""
    head = (
        "the replay ran the step's Python a second time (the batches it took, optimizer and "
        "LR scheduler steps, RNG and module state were replayed, skipped or put back"
    )
    if start is not None and start.kept:
        head += (
            "; it started from the numbers, strings and small lists and dicts the step names "
            "as they were when the step began"
        )
    if start is not None and start.skipped:
        names = ", ".join(f"`{n}`" for n in start.skipped[:3])
        head += f" ({names}: too large to copy on every step, as the step left it)"
    head += ")"
    if changed:
        return (
            f"{head}; in the replay it changed {', '.join(changed)}: put back as the step "
            "left it; anything else it does (a print, logging, a file write) happened twice"
        )
    same = (
        "ended as the step had left them"
        if start is not None and start.kept
        else "were unchanged by it"
    )
    return (
        f"{head}; the lists, dicts, sets and numbers it names {same}; anything else it does "
        "(a print, logging, a file write) happened twice"
    )
