"""The cost of gradsan's call path (issue 17), each measured against the plain call.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_call_cost.py [--part NAME] [--rounds N]
        [--layers 100,300,1000] [--variants plain,guard,run]

Parts:

- ``compile``: ``jax.jit(jax.grad(loss))`` of a deep tanh MLP (NaN in every gradient leaf):
  seconds from the fresh function to its result (``plain``: trace, compile, run) and to
  guard's report (``guard``: guard's default; ``run``: through the fused program, as
  `gradsan run` calls it), and each minus plain in the same round. ``--rounds`` applies.
- ``recreate``: under `gradsan run`'s patch, ``jax.jit(f)(x)`` re-created at every call of a
  loop, per call; against the same loop without gradsan.
- ``step``: under `gradsan run`'s patch, a jitted step of about 10 us called in a loop, per
  call; against the same loop without gradsan.
- ``steps``: steps of about 20 us, 200 us, 1 ms and 2 ms (``--sizes``): plain, `gradsan run`
  with the flag read at each call (``run_now``), ``run_late`` (what `gradsan run` does: one
  call late, except a flag already computed right after its dispatch, which is read at once;
  the line "read N flags at once, M one call late" says which), ``run_always_late`` (every
  flag one call late, with the inputs' snapshot: session 14's first version), and
  ``gradsan.jax.guard``; the overhead per call in
  microseconds and the ratio, each against plain in the same round.
- ``flatten``: ``jax/_call.py``'s ``flatten_call`` (every wrapper's first step: sanitize's
  screen, nansafe, explain, guard's report) on parameter trees of 10, 100 and 1000 leaves
  (``--leaves``), per call in microseconds, its labels not read (as a healthy call uses it)
  and read (as a report does); with ``--before FILE`` (an older ``_call.py``, e.g. from
  ``git show REV:src/gradsan/jax/_call.py``), that file's ``flatten_call`` too, paired in
  the same process, and the labels of both compared (they must be equal).

Timing is paired: every round runs each variant once in alternating order; we print the
median and the interquartile range over rounds. The "RESULT name=value" lines are for the
README.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def stats(xs: list[float]) -> str:
    q = np.percentile(xs, [25, 75])
    return f"median {statistics.median(xs):.4g} (IQR {q[0]:.4g}-{q[1]:.4g}, n={len(xs)})"


def paired(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            got[k].append(variants[k]())
    return got


# -- compile: guard on a deep MLP -------------------------------------------------------------


def deep_loss(layers: int, width: int = 16) -> tuple[Callable, tuple]:
    keys = jax.random.split(jax.random.PRNGKey(0), layers)
    params = [(jax.random.normal(k, (width, width)) / width**0.5, jnp.zeros(width)) for k in keys]
    x = jax.random.normal(jax.random.PRNGKey(1), (4, width))

    def loss(params, x):
        h = x
        for w, b in params:
            h = jnp.tanh(h @ w + b)
        return jnp.sqrt(jnp.sum(h * 0.0))  # sqrt at an exact 0: the gradient is NaN

    return loss, (params, x)


def _one_compile(n: int, variant: str) -> float:
    """Seconds from a fresh ``jax.jit(jax.grad(loss))`` to its result (``plain``: trace,
    compile, run) or to guard's report (``guard``: its default, the first call as it is and
    the check on the host; ``run``: as `gradsan run` calls it, through the fused program)."""
    import gradsan
    import gradsan.jax as gsj

    loss, args = deep_loss(n)
    t0, c0 = time.perf_counter(), time.process_time()
    fun = jax.jit(jax.grad(loss))
    if variant == "plain":
        jax.block_until_ready(fun(*args))
        CPU_S.setdefault(variant, []).append(time.process_time() - c0)
        return time.perf_counter() - t0
    g = gsj.guard(fun)
    if variant == "run":
        g._gradsan_state["use_jit"] = True  # as `gradsan run`: no first plain call
    try:
        g(*args)
    except gradsan.NonFiniteError as e:
        assert "sqrt" in str(e).splitlines()[0], str(e)[:200]
    else:  # pragma: no cover
        raise AssertionError("guard did not report")
    CPU_S.setdefault(variant, []).append(time.process_time() - c0)
    return time.perf_counter() - t0


CPU_S: dict[str, list[float]] = {}
"""The process's CPU seconds (all threads) of each timed run: on a machine shared with other
work, wall-clock seconds mostly measure the queue for a core; CPU seconds the work done."""


def part_compile(
    layer_counts: list[int], rounds: int = 1, variants: str = "plain,guard,run"
) -> None:
    """Fresh functions each time (nothing cached), the variants alternated round by round."""
    names = variants.split(",")
    for n in layer_counts:
        CPU_S.clear()
        got = paired({v: (lambda v=v: _one_compile(n, v)) for v in names}, rounds)
        for v in names:
            print(f"  {n:5d} layers: {v:6s} cpu {stats(CPU_S[v])} s")
            print(f"RESULT compile.layers{n}.{v}_cpu_s={statistics.median(CPU_S[v]):.2f}")
            if v != "plain" and "plain" in CPU_S:
                extra = [a - b for a, b in zip(CPU_S[v], CPU_S["plain"])]
                print(f"  {n:5d} layers: {v} - plain cpu {stats(extra)} s")
        for v in names:
            print(f"  {n:5d} layers: {v:6s} {stats(got[v])} s")
            print(f"RESULT compile.layers{n}.{v}_s={statistics.median(got[v]):.2f}")
        for v in names:
            if v != "plain" and "plain" in got:
                extra = [a - b for a, b in zip(got[v], got["plain"])]
                print(f"  {n:5d} layers: {v} - plain {stats(extra)} s")
                print(f"RESULT compile.layers{n}.{v}_over_plain_s={statistics.median(extra):.2f}")


# -- under gradsan run's patch ----------------------------------------------------------------


def _installed_hooks():
    from gradsan._run._hooks import Hooks

    def on_failure(f):  # pragma: no cover - the benchmark's programs stay finite
        raise RuntimeError("unexpected failure")

    hooks = Hooks(on_failure)
    from gradsan._run._patch_jax import patch_jax

    patch_jax(hooks, jax)
    return hooks


def _user_code(src: str) -> dict:
    """Compile ``src`` as if it were a user's script (a file outside gradsan and site-packages)
    so that the patch wraps what it makes."""
    import os
    import tempfile

    d = tempfile.mkdtemp()
    path = os.path.join(d, "user_loop.py")
    with open(path, "w") as fh:
        fh.write(src)
    ns: dict = {"__name__": "user_loop", "__file__": path}
    exec(compile(src, path, "exec"), ns)
    return ns


LOOPS = """
import jax, jax.numpy as jnp
jit = jax.jit  # bound when the file runs: gradsan's patched jit, or jax's own
def f(x):
    return jnp.tanh(x * 1.0001 + 0.5)
def recreate(x, n):
    for _ in range(n):
        x = jit(f)(x)
    return jax.block_until_ready(x)
step = jit(f)
def steps(x, n):
    for _ in range(n):
        x = step(x)
    return jax.block_until_ready(x)
"""


def part_run(name: str, rounds: int, n: int) -> None:
    x = jnp.ones(16)
    plain = _user_code(LOOPS)
    hooks = _installed_hooks()
    try:
        patched = _user_code(LOOPS)
        fn = {"recreate": "recreate", "step": "steps"}[name]
        plain_f, patched_f = plain[fn], patched[fn]
        plain_f(x, 3)
        patched_f(x, 3)  # warm: first traces and compiles

        def timed(f: Callable) -> Callable[[], float]:
            def run() -> float:
                t0 = time.perf_counter()
                f(x, n)
                return (time.perf_counter() - t0) / n * 1e6

            return run

        got = paired({"plain": timed(plain_f), "gradsan": timed(patched_f)}, rounds)
    finally:
        hooks.uninstall()
    ratio = [g / p for g, p in zip(got["gradsan"], got["plain"])]
    print(f"  {name}: plain   {stats(got['plain'])} us/call")
    print(f"  {name}: gradsan {stats(got['gradsan'])} us/call")
    print(f"  {name}: ratio   {stats(ratio)}")
    print(f"RESULT {name}.plain_us={statistics.median(got['plain']):.1f}")
    print(f"RESULT {name}.gradsan_us={statistics.median(got['gradsan']):.1f}")
    print(f"RESULT {name}.ratio={statistics.median(ratio):.2f}")


STEP = """
import jax, jax.numpy as jnp
jit = jax.jit
N = {n}
w = jnp.full((N, N), 1.0 / N) if N > 1 else None
def f(x):
    if N > 1:
        return jnp.tanh(x @ w + 0.5)
    return jnp.tanh(x * 1.0001 + 0.5)
step = jit(f)
def steps(x, n):
    for _ in range(n):
        x = step(x)
    return jax.block_until_ready(x)
"""

SIZES = {"20us": (1, 2000), "200us": (128, 300), "1ms": (300, 100), "2ms": (288, 40)}
"""step size -> (matrix side, 1 for 16 elementwise floats; calls per round), on this CPU."""


def part_steps(rounds: int, sizes: list[str]) -> None:
    """Per-call cost of a jitted ``x = step(x)`` loop: plain; under `gradsan run`'s patch with
    the flag read at each call (``run_now``) and one call late (``run_late``); under
    ``gradsan.jax.guard``. Overhead = variant - plain in the same round, in microseconds."""
    import gradsan.jax as gsj
    from gradsan._run import _patch_jax

    for size in sizes:
        side, calls = SIZES[size]
        src = STEP.format(n=side)
        x = jnp.ones((side, side) if side > 1 else (16,))
        plain = _user_code(src)
        hooks = _installed_hooks()
        accelerated = getattr(_patch_jax, "_accelerated", None)
        try:
            hooks.defer_flags = False  # type: ignore[attr-defined]
            now = _user_code(src)
            now["steps"](x, 3)
            hooks.defer_flags = True  # type: ignore[attr-defined]
            # (versions before session 14 read one call late only on accelerators)
            _patch_jax._accelerated = lambda: True  # type: ignore[attr-defined]
            late = _user_code(src)
            late["steps"](x, 3)
            # (session 14, before the adaptive read: every flag one call late, snapshot kept)
            hooks.defer_flags = "late"  # type: ignore[attr-defined]
            always = _user_code(src)
            always["steps"](x, 3)
        finally:
            if accelerated is not None:
                _patch_jax._accelerated = accelerated  # type: ignore[attr-defined]
            else:
                del _patch_jax._accelerated  # type: ignore[attr-defined]
        guarded = gsj.guard(plain["step"])
        g = {"x": x}

        def guard_loop(x: jax.Array, n: int) -> jax.Array:
            for _ in range(n):
                x = guarded(x)
            return jax.block_until_ready(x)

        guard_loop(x, 3)
        thread = guarded._gradsan_state["thread"]  # type: ignore[attr-defined]
        if thread is not None:
            thread.join()  # the fused program compiled: what every later call runs
        guard_loop(x, 3)
        plain["steps"](x, 3)
        loops = {
            "plain": plain["steps"],
            "run_now": now["steps"],
            "run_late": late["steps"],
            "run_always_late": always["steps"],
            "guard": guard_loop,
        }

        def timed(f: Callable) -> Callable[[], float]:
            def run() -> float:
                t0 = time.perf_counter()
                f(g["x"], calls)
                return (time.perf_counter() - t0) / calls * 1e6

            return run

        try:
            got = paired({k: timed(f) for k, f in loops.items()}, rounds)
        finally:
            _patch_jax.flush_pending(hooks)
            hooks.uninstall()
        now_n, late_n = getattr(late["step"], "_reads", ("?", "?"))
        print(f"  step {size}: run_late read {now_n} flags at once, {late_n} one call late")
        print(f"  step {size}: plain {stats(got['plain'])} us/call")
        print(f"RESULT steps.{size}.plain_us={statistics.median(got['plain']):.1f}")
        for k in loops:
            if k == "plain":
                continue
            extra = [a - b for a, b in zip(got[k], got["plain"])]
            ratio = [a / b for a, b in zip(got[k], got["plain"])]
            print(f"  step {size}: {k:8s} {stats(got[k])} us/call")
            print(f"  step {size}: {k:8s} overhead {stats(extra)} us; ratio {stats(ratio)}")
            print(f"RESULT steps.{size}.{k}_overhead_us={statistics.median(extra):.1f}")
            print(f"RESULT steps.{size}.{k}_ratio={statistics.median(ratio):.2f}")


# -- flatten_call ---------------------------------------------------------------------------


def _load_call_module(path: str):
    """An older ``_call.py`` as a module of the current package (its relative imports)."""
    import importlib.util

    import gradsan.jax

    spec = importlib.util.spec_from_file_location("gradsan.jax._call_before", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = gradsan.jax.__name__
    spec.loader.exec_module(mod)
    return mod


def part_flatten(rounds: int, leaf_counts: list[int], before: str | None) -> None:
    from gradsan.jax import _call

    impls = {"after": _call.flatten_call}
    if before:
        impls["before"] = _load_call_module(before).flatten_call
    for n in leaf_counts:
        params = {f"layer{i}": {"w": jnp.ones((2, 2)), "b": jnp.ones(2)} for i in range(n // 2)}
        if n % 2:
            params["extra"] = {"w": jnp.ones(1)}
        step = jax.jit(lambda params, x, lr: x)
        args, kwargs = (params, jnp.ones(2)), {"lr": 0.1}
        calls = max(3, 3000 // n)
        labels = {k: f(step, args, kwargs).labels for k, f in impls.items()}
        assert len({tuple(v) for v in labels.values()}) == 1, "labels differ"

        def timed(f: Callable, read: bool) -> Callable[[], float]:
            def run() -> float:
                t0 = time.perf_counter()
                for _ in range(calls):
                    c = f(step, args, kwargs)
                    if read:
                        c.labels  # noqa: B018
                return (time.perf_counter() - t0) / calls * 1e6

            return run

        variants = {
            f"{k}{'_labels' if read else ''}": timed(f, read)
            for k, f in impls.items()
            for read in (False, True)
        }
        got = paired(variants, rounds)
        for k in variants:
            print(f"  flatten {n:5d} leaves: {k:13s} {stats(got[k])} us/call")
            print(f"RESULT flatten.leaves{n}.{k}_us={statistics.median(got[k]):.1f}")
        if before:
            for read in ("", "_labels"):
                ratio = [a / b for a, b in zip(got["after" + read], got["before" + read])]
                print(f"  flatten {n:5d} leaves: after/before{read} ratio {stats(ratio)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--part",
        default="all",
        choices=["all", "compile", "recreate", "step", "steps", "flatten"],
    )
    ap.add_argument("--leaves", default="10,100,1000", help="flatten: tree sizes")
    ap.add_argument("--before", default=None, help="flatten: an older _call.py to pair with")
    ap.add_argument("--sizes", default="20us,200us,2ms", help="steps: step sizes")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", default="100,300")
    ap.add_argument("--variants", default="plain,guard,run", help="compile: which to time")
    a = ap.parse_args()
    if a.part in ("all", "recreate"):
        part_run("recreate", a.rounds, 50)
    if a.part in ("all", "step"):
        part_run("step", a.rounds, 2000)
    if a.part in ("all", "steps"):
        part_steps(a.rounds, a.sizes.split(","))
    if a.part in ("all", "flatten"):
        part_flatten(a.rounds, [int(v) for v in a.leaves.split(",")], a.before)
    if a.part in ("all", "compile"):
        part_compile([int(v) for v in a.layers.split(",")], a.rounds, a.variants)


if __name__ == "__main__":
    main()
