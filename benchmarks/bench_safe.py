"""Forward+backward cost of gradsan's safe functions against the naive ones (ratios, one process).

For each function: ``jit(grad(sum(f)))`` (JAX) and ``f(x).sum().backward()`` (PyTorch) on
``--n`` float32 elements (default 4e6: a flat vector for the elementwise functions, a square
matrix reduced along its last axis for the rest), so that one run takes several ms. Each
case is warmed up, then timed in ``reps`` pairs whose order alternates (safe first, then
naive first, ...); runs shorter than ``--min-ms`` are repeated inside one timing. Prints the
medians of the run times, the median of the per-pair ratios safe / naive (target: at most
1.2x) and the ratios' interquartile range; ``*`` marks a median above 1.2.

By default both backends run on one thread (``--threads``) and a run's cost is the CPU time
of the process (``--clock cpu``): on a shared machine the wall clock of a run mostly measures
the other jobs (its same-vs-same ratios spread over 0.5-2x there; CPU time over 0.97-1.03).
``--clock wall --threads 2`` gives the wall-clock view.

Run: ``python benchmarks/bench_safe.py [reps] [backends] [--only NAMES] [--n N]``, e.g.
``python benchmarks/bench_safe.py 41 jax,torch --only abs,atan2``. ``reps`` is the number of
timed pairs per case (default 41), not the array size: that is ``--n``.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import torch

import gradsan.jax.safe as js
import gradsan.torch.safe as ts


def _cases(n: int) -> dict:
    rng = np.random.default_rng(0)
    side = max(2, math.isqrt(n))
    pos = rng.uniform(0.1, 10.0, n).astype(np.float32)
    unit = rng.uniform(-0.99, 0.99, n).astype(np.float32)
    pts = rng.normal(size=(side, side)).astype(np.float32)  # `side` vectors of length `side`
    # name: (safe jax, naive jax, safe torch, naive torch, input)
    return {
        "sqrt": (js.sqrt, jnp.sqrt, ts.sqrt, torch.sqrt, pos),
        "rsqrt": (js.rsqrt, jax.lax.rsqrt, ts.rsqrt, torch.rsqrt, pos),
        "cbrt": (js.cbrt, jnp.cbrt, ts.cbrt, lambda x: torch.sign(x) * x.abs().pow(1 / 3), pos),
        "log": (js.log, jnp.log, ts.log, torch.log, pos),
        "log1p": (js.log1p, jnp.log1p, ts.log1p, torch.log1p, pos),
        "sinc": (js.sinc, jnp.sinc, ts.sinc, torch.sinc, pos),
        "pow0.5": (
            lambda x: js.pow(x, 0.5),
            lambda x: x**0.5,
            lambda x: ts.pow(x, 0.5),
            lambda x: x**0.5,
            pos,
        ),
        "xlogx": (js.xlogx, lambda x: jsp.xlogy(x, x), ts.xlogx, lambda x: torch.xlogy(x, x), pos),
        "arccos": (js.arccos, jnp.arccos, ts.arccos, torch.arccos, unit),
        "arctanh": (js.arctanh, jnp.arctanh, ts.arctanh, torch.arctanh, unit),
        "abs": (js.abs, jnp.abs, ts.abs, torch.abs, unit),
        "clip": (
            lambda x: js.clip(x, -0.5, 0.5),
            lambda x: jnp.clip(x, -0.5, 0.5),
            lambda x: ts.clip(x, -0.5, 0.5),
            lambda x: torch.clamp(x, -0.5, 0.5),
            unit,
        ),
        "div": (
            lambda x: js.div(1.0, x),
            lambda x: 1.0 / x,
            lambda x: ts.div(1.0, x),
            lambda x: 1.0 / x,
            pos,
        ),
        "atan2": (
            lambda x: js.atan2(x, 1.0 - x),
            lambda x: jnp.arctan2(x, 1.0 - x),
            lambda x: ts.atan2(x, 1.0 - x),
            lambda x: torch.atan2(x, 1.0 - x),
            unit,
        ),
        "hypot": (
            lambda x: js.hypot(x, 1.0 - x),
            lambda x: jnp.hypot(x, 1.0 - x),
            lambda x: ts.hypot(x, 1.0 - x),
            lambda x: torch.hypot(x, 1.0 - x),
            unit,
        ),
        "norm(axis=-1)": (
            lambda x: js.norm(x, axis=-1),
            lambda x: jnp.linalg.norm(x, axis=-1),
            lambda x: ts.norm(x, axis=-1),
            lambda x: torch.linalg.norm(x, dim=-1),
            pts,
        ),
        "std(axis=-1)": (
            lambda x: js.std(x, axis=-1),
            lambda x: jnp.std(x, axis=-1),
            lambda x: ts.std(x, axis=-1),
            lambda x: torch.std(x, dim=-1, correction=0),
            pts,
        ),
        "standardize(std_eps)": (
            lambda x: js.standardize(x, form="std_eps"),
            lambda x: (x - x.mean(-1, keepdims=True)) / (jnp.std(x, -1, keepdims=True) + 1e-5),
            lambda x: ts.standardize(x, form="std_eps"),
            lambda x: (
                (x - x.mean(-1, keepdim=True))
                / (torch.std(x, -1, correction=0, keepdim=True) + 1e-5)
            ),
            pts,
        ),
        "logsumexp(axis=-1)": (
            lambda x: js.logsumexp(x, axis=-1),
            lambda x: jax.nn.logsumexp(x, axis=-1),
            lambda x: ts.logsumexp(x, axis=-1),
            lambda x: torch.logsumexp(x, dim=-1),
            pts,
        ),
        "softmax": (js.softmax, jax.nn.softmax, ts.softmax, lambda x: torch.softmax(x, -1), pts),
        "log_softmax": (
            js.log_softmax,
            jax.nn.log_softmax,
            ts.log_softmax,
            lambda x: torch.log_softmax(x, -1),
            pts,
        ),
        "cosine_similarity": (
            lambda x: js.cosine_similarity(x, x[::-1]),
            lambda x: (
                jnp.sum(x * x[::-1], -1)
                / (
                    jnp.maximum(jnp.linalg.norm(x, axis=-1), 1e-8)
                    * jnp.maximum(jnp.linalg.norm(x[::-1], axis=-1), 1e-8)
                )
            ),
            lambda x: ts.cosine_similarity(x, x.flip(0)),
            lambda x: torch.nn.functional.cosine_similarity(x, x.flip(0), dim=-1),
            pts,
        ),
    }


def _inner_count(run_safe, run_naive, min_s: float, clock) -> int:
    """How many calls one timing needs so that it lasts at least ``min_s`` (the faster one)."""
    t = []
    for run in (run_safe, run_naive):
        t0 = clock()
        run()
        t.append(clock() - t0)
    return max(1, math.ceil(min_s / max(min(t), 1e-9)))


def paired_ratio(
    run_safe, run_naive, reps: int, warmup: int, min_s: float, clock=time.process_time
):
    """Median times (s), median of the per-pair ratios safe / naive, and its quartiles.

    ``warmup`` untimed calls of each first; then ``reps`` pairs, the order alternating per pair
    (so that neither side always runs on a cache or a frequency state left by the other)."""
    for _ in range(warmup):
        run_safe()
        run_naive()
    inner = _inner_count(run_safe, run_naive, min_s, clock)

    def timed(run):
        t0 = clock()
        for _ in range(inner):
            run()
        return (clock() - t0) / inner

    ts_, tn_, ratios = [], [], []
    gc.collect()
    gc.disable()
    try:
        for i in range(reps):
            if i % 2 == 0:
                s = timed(run_safe)
                n = timed(run_naive)
            else:
                n = timed(run_naive)
                s = timed(run_safe)
            ts_.append(s)
            tn_.append(n)
            ratios.append(s / n)
    finally:
        gc.enable()
    q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ts_), statistics.median(tn_), statistics.median(ratios), q1, q3


def _jax_runs(safe_f, naive_f, x):
    xj = jnp.asarray(x)
    gs = jax.jit(jax.grad(lambda a: jnp.sum(safe_f(a))))
    gn = jax.jit(jax.grad(lambda a: jnp.sum(naive_f(a))))
    return (lambda: gs(xj).block_until_ready()), (lambda: gn(xj).block_until_ready())


def _torch_runs(safe_f, naive_f, x):
    def step(f):
        xt = torch.from_numpy(x).requires_grad_(True)
        f(xt).sum().backward()

    return (lambda: step(safe_f)), (lambda: step(naive_f))


def _fmt(r) -> str:
    if r is None:
        return f"{'':>9s} {'':>9s} {'':>6s} {'':>11s}"
    mark = "*" if r[2] > 1.2 else " "
    return f"{r[0] * 1e3:9.2f} {r[1] * 1e3:9.2f} {r[2]:5.2f}{mark} ({r[3]:.2f}-{r[4]:.2f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "reps",
        nargs="?",
        type=int,
        default=41,
        help="timed pairs per case and backend (default 41)",
    )
    ap.add_argument(
        "backends",
        nargs="?",
        default="jax,torch",
        help="comma-separated: jax, torch (default both)",
    )
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated case names (or their prefix before '('), e.g. abs,norm",
    )
    ap.add_argument("--n", type=int, default=4_000_000, help="elements per input (default 4e6)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls of each (default 5)")
    ap.add_argument(
        "--min-ms",
        type=float,
        default=5.0,
        help="repeat a call inside one timing until it lasts this long (default 5)",
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="threads of XLA:CPU and of torch (default 1)"
    )
    ap.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: CPU time of the process (default); wall: perf_counter",
    )
    args = ap.parse_args(argv)
    if not 3 <= args.reps <= 10_000:
        ap.error(f"reps={args.reps}: the number of timed pairs, 3 to 10000 (the array size is --n)")
    backends = {b.strip() for b in args.backends.split(",") if b.strip()}
    if not backends or backends - {"jax", "torch"}:
        ap.error(f"backends must be jax, torch or jax,torch; got {args.backends!r}")

    cases = _cases(args.n)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if not any(k == w or k.split("(")[0] == w for k in cases)]
        if unknown:
            ap.error(f"--only: unknown {unknown}; known: {', '.join(cases)}")
        cases = {k: v for k, v in cases.items() if k in wanted or k.split("(")[0] in wanted}

    # before the first JAX computation, which reads XLA_FLAGS
    flags = (
        f"--xla_cpu_multi_thread_eigen={str(args.threads > 1).lower()} "
        f"intra_op_parallelism_threads={args.threads}"
    )
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(
        f"n={args.n} float32, reps={args.reps} pairs, warmup={args.warmup}, "
        f"min {args.min_ms} ms per timing, {args.threads} thread(s), {args.clock} time, "
        f"jax {jax.__version__} {jax.devices()[0].platform}, torch {torch.__version__}",
        flush=True,
    )
    print(
        f"{'function':22s} {'jax safe':>9s} {'naive':>9s} {'ratio':>6s} {'(IQR)':>11s}   "
        f"{'torch safe':>10s} {'naive':>9s} {'ratio':>6s} {'(IQR)':>11s}",
        flush=True,
    )
    for name, (jsafe_f, jnaive_f, tsafe_f, tnaive_f, x) in cases.items():
        measured = {}
        for backend, make in (("jax", _jax_runs), ("torch", _torch_runs)):
            if backend in backends:
                safe_f, naive_f = (jsafe_f, jnaive_f) if backend == "jax" else (tsafe_f, tnaive_f)
                run_safe, run_naive = make(safe_f, naive_f, x)
                measured[backend] = paired_ratio(
                    run_safe, run_naive, args.reps, args.warmup, args.min_ms / 1e3, clock
                )
        print(
            f"{name:22s} {_fmt(measured.get('jax'))}    {_fmt(measured.get('torch'))}", flush=True
        )


if __name__ == "__main__":
    main(sys.argv[1:])
