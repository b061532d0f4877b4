"""The cost of gradsan's call path (issue 17), each measured against the plain call.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_call_cost.py [--part NAME] [--rounds N]
        [--layers 100,300,1000] [--report-only]

Parts:

- ``compile``: on a deep tanh MLP's jitted train step (NaN at the last layer): the compile
  time of the plain step and of the step with guard's fused flag (``fused``, what guard
  compiled before for any number of outputs; ``--report-only`` skips it), then guard's whole
  time to the report as `gradsan run` calls it (no first plain call). Above
  ``_flags.FUSE_LIMIT`` float outputs guard no longer fuses the flag.
- ``recreate``: under `gradsan run`'s patch, ``jax.jit(f)(x)`` re-created at every call of a
  loop, per call; against the same loop without gradsan.
- ``step``: under `gradsan run`'s patch, a jitted step of about 10 us called in a loop, per
  call; against the same loop without gradsan.

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


def deep_step(layers: int, width: int = 16) -> tuple[Callable, tuple]:
    keys = jax.random.split(jax.random.PRNGKey(0), layers)
    params = [(jax.random.normal(k, (width, width)) / width**0.5, jnp.zeros(width)) for k in keys]
    x = jax.random.normal(jax.random.PRNGKey(1), (4, width))

    def loss(params, x):
        h = x
        for w, b in params:
            h = jnp.tanh(h @ w + b)
        return jnp.sqrt(jnp.sum(h * 0.0))  # sqrt at an exact 0: the gradient is NaN

    def step(params, x):
        g = jax.grad(loss)(params, x)
        return [(w - 0.1 * gw, b - 0.1 * gb) for (w, b), (gw, gb) in zip(params, g)]

    return step, (params, x)


def part_compile(layer_counts: list[int], report_only: bool = False) -> None:
    """Compile time of the fused program (step + flag) against the plain step's, the flag
    per leaf (before) and over the concatenated leaves (after), fresh functions each time so
    nothing is cached; then guard's whole time to the report (compile + replay)."""
    import gradsan
    import gradsan.jax as gsj
    from gradsan.jax import _flags, _guard

    def compile_s(limit: int | None, n: int) -> float:
        step, args = deep_step(n)
        fun = jax.jit(step)
        if limit is not None:
            _flags.FUSE_LIMIT = limit
            _guard._FUSED.clear()
            fun = _guard._fused(fun, True)
        t0 = time.perf_counter()
        fun.lower(*args).compile()
        return time.perf_counter() - t0

    default = _flags.FUSE_LIMIT
    for n in layer_counts:
        got = {"plain": compile_s(None, n)}
        if not report_only:
            got["fused"] = compile_s(default, n)
        _flags.FUSE_LIMIT = default
        line = ", ".join(f"{k} {v:.2f} s" for k, v in got.items())
        print(f"  {n:5d} layers: compile {line}")
        for k, v in got.items():
            print(f"RESULT compile.layers{n}.{k}_s={v:.2f}")
        step, args = deep_step(n)
        t0 = time.perf_counter()
        g = gsj.guard(jax.jit(step))
        g._gradsan_state["use_jit"] = True  # as `gradsan run`: no first plain call
        try:
            g(*args)
            said = "no error"
        except gradsan.NonFiniteError as e:
            said = str(e).splitlines()[0][:60]
        total = time.perf_counter() - t0
        print(f"  {n:5d} layers: guard to the report {total:.2f} s [{said}]")
        print(f"RESULT compile.layers{n}.guard_report_s={total:.2f}")


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="all", choices=["all", "compile", "recreate", "step"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", default="100,300")
    ap.add_argument("--report-only", action="store_true", help="compile: guard's time only")
    a = ap.parse_args()
    if a.part in ("all", "recreate"):
        part_run("recreate", a.rounds, 50)
    if a.part in ("all", "step"):
        part_run("step", a.rounds, 2000)
    if a.part in ("all", "compile"):
        part_compile([int(v) for v in a.layers.split(",")], a.report_only)


if __name__ == "__main__":
    main()
