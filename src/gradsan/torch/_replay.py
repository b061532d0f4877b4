"""guard's replay without side effects.

To explain a failing step, guard runs its forward and backward again under the tracer. The
replay must not change training: it sees the batches the step pulled (recorded by a tap on
each iterator the step reaches, never pulled again), the parameters as the step saw them (an
earlier optimizer's update in the same step is undone for the replay and put back after), the
RNG state of the step's start; no optimizer steps, no scheduler runs, and the buffers, RNG
state and parameters are put back to what the step itself left.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import torch


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
        installed: list[tuple[Any, str, Tap]] = []
        for place, key, name in self.places:
            v = self._get(place, key)
            if _is_iterator(v):
                tap = Tap(v, name)
                self._set(place, key, tap)
                installed.append((place, key, tap))
        taps += [t for _, _, t in installed]
        self.last = installed
        try:
            yield
        finally:
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
        """Put back every tensor changed in place since (its version counter moved)."""
        with torch.no_grad():
            for t, s, v in zip(self.tensors, self.saved, self.versions):
                if t._version != v:
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
