"""Forward+backward cost of gradsan's safe functions against the naive ones.

For each function: ``jit(grad(sum(f)))`` (JAX) and ``f(x).sum().backward()`` (PyTorch) on
1e6 float32 elements, timed in paired, alternating runs; prints the median of the per-pair
ratios safe / naive (target: at most 1.2x); for PyTorch (2 threads) the order alternates per
pair and the ratios' interquartile range is shown.
Run: ``python benchmarks/bench_safe.py [reps] [jax,torch]``.
"""

from __future__ import annotations

import math
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

N = 1_000_000
rng = np.random.default_rng(0)
POS = rng.uniform(0.1, 10.0, N).astype(np.float32)
UNIT = rng.uniform(-0.99, 0.99, N).astype(np.float32)
MAT = rng.normal(size=(1000, 1000)).astype(np.float32)
PTS = rng.normal(size=(1000, 1000)).astype(np.float32)  # 1000 vectors of length 1000

# name: (safe jax, naive jax, safe torch, naive torch, input)
CASES = {
    "sqrt": (js.sqrt, jnp.sqrt, ts.sqrt, torch.sqrt, POS),
    "rsqrt": (js.rsqrt, jax.lax.rsqrt, ts.rsqrt, torch.rsqrt, POS),
    "cbrt": (js.cbrt, jnp.cbrt, ts.cbrt, lambda x: torch.sign(x) * x.abs().pow(1 / 3), POS),
    "log": (js.log, jnp.log, ts.log, torch.log, POS),
    "sinc": (js.sinc, jnp.sinc, ts.sinc, torch.sinc, POS),
    "pow0.5": (lambda x: js.pow(x, 0.5), lambda x: x**0.5, lambda x: ts.pow(x, 0.5), lambda x: x**0.5, POS),
    "xlogx": (js.xlogx, lambda x: jsp.xlogy(x, x), ts.xlogx, lambda x: torch.xlogy(x, x), POS),
    "arccos": (js.arccos, jnp.arccos, ts.arccos, torch.arccos, UNIT),
    "arctanh": (js.arctanh, jnp.arctanh, ts.arctanh, torch.arctanh, UNIT),
    "abs": (js.abs, jnp.abs, ts.abs, torch.abs, UNIT),
    "clip": (lambda x: js.clip(x, -0.5, 0.5), lambda x: jnp.clip(x, -0.5, 0.5),
             lambda x: ts.clip(x, -0.5, 0.5), lambda x: torch.clamp(x, -0.5, 0.5), UNIT),
    "div": (lambda x: js.div(1.0, x), lambda x: 1.0 / x, lambda x: ts.div(1.0, x), lambda x: 1.0 / x, POS),
    "atan2": (lambda x: js.atan2(x, 1.0 - x), lambda x: jnp.arctan2(x, 1.0 - x),
              lambda x: ts.atan2(x, 1.0 - x), lambda x: torch.atan2(x, 1.0 - x), UNIT),
    "hypot": (lambda x: js.hypot(x, 1.0 - x), lambda x: jnp.hypot(x, 1.0 - x),
              lambda x: ts.hypot(x, 1.0 - x), lambda x: torch.hypot(x, 1.0 - x), UNIT),
    "norm(axis=-1)": (lambda x: js.norm(x, axis=-1), lambda x: jnp.linalg.norm(x, axis=-1),
                      lambda x: ts.norm(x, axis=-1), lambda x: torch.linalg.norm(x, dim=-1), PTS),
    "std(axis=-1)": (lambda x: js.std(x, axis=-1), lambda x: jnp.std(x, axis=-1),
                     lambda x: ts.std(x, axis=-1), lambda x: torch.std(x, dim=-1, correction=0), PTS),
    "standardize(std_eps)": (
        lambda x: js.standardize(x, form="std_eps"),
        lambda x: (x - x.mean(-1, keepdims=True)) / (jnp.std(x, -1, keepdims=True) + 1e-5),
        lambda x: ts.standardize(x, form="std_eps"),
        lambda x: (x - x.mean(-1, keepdim=True)) / (torch.std(x, -1, correction=0, keepdim=True) + 1e-5),
        PTS,
    ),
    "logsumexp(axis=-1)": (lambda x: js.logsumexp(x, axis=-1), lambda x: jax.nn.logsumexp(x, axis=-1),
                           lambda x: ts.logsumexp(x, axis=-1), lambda x: torch.logsumexp(x, dim=-1), PTS),
    "softmax": (js.softmax, jax.nn.softmax, ts.softmax, lambda x: torch.softmax(x, -1), PTS),
    "log_softmax": (js.log_softmax, jax.nn.log_softmax, ts.log_softmax,
                    lambda x: torch.log_softmax(x, -1), PTS),
    "cosine_similarity": (lambda x: js.cosine_similarity(x, x[::-1]),
                          lambda x: jnp.sum(x * x[::-1], -1) / (jnp.maximum(jnp.linalg.norm(x, axis=-1), 1e-8) * jnp.maximum(jnp.linalg.norm(x[::-1], axis=-1), 1e-8)),
                          lambda x: ts.cosine_similarity(x, x.flip(0)),
                          lambda x: torch.nn.functional.cosine_similarity(x, x.flip(0), dim=-1), PTS),
}


def _pair_ratio(run_safe, run_naive, reps):
    ratios, ts_, tn_ = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        run_safe()
        t1 = time.perf_counter()
        run_naive()
        t2 = time.perf_counter()
        ts_.append(t1 - t0)
        tn_.append(t2 - t1)
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ts_), statistics.median(tn_), statistics.median(ratios)


def _pair_ratio_alternating(run_safe, run_naive, reps):
    """As _pair_ratio, the order alternating per pair; also the ratios' interquartile range."""
    ratios, ts_, tn_ = [], [], []
    for i in range(reps):
        order = [(run_safe, ts_), (run_naive, tn_)]
        for run, acc in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            run()
            acc.append(time.perf_counter() - t0)
        ratios.append(ts_[-1] / tn_[-1])
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return statistics.median(ts_), statistics.median(tn_), statistics.median(ratios), q1, q3


def main(reps: int = 9, backends: str = "jax,torch") -> None:
    torch.set_num_threads(2)
    print(f"{'function':24s} {'jax safe ms':>11s} {'naive ms':>9s} {'ratio':>6s}   "
          f"{'torch safe ms':>13s} {'naive ms':>9s} {'ratio':>6s} {'(IQR)':>11s}")
    for name, (jsafe_f, jnaive_f, tsafe_f, tnaive_f, x) in CASES.items():
        j = (math.nan,) * 3
        if "jax" in backends:
            xj = jnp.asarray(x)
            gs = jax.jit(jax.grad(lambda a, f=jsafe_f: jnp.sum(f(a))))
            gn = jax.jit(jax.grad(lambda a, f=jnaive_f: jnp.sum(f(a))))
            gs(xj).block_until_ready()
            gn(xj).block_until_ready()
            j = _pair_ratio(lambda: gs(xj).block_until_ready(), lambda: gn(xj).block_until_ready(), reps)
        if "torch" not in backends:
            print(f"{name:24s} {j[0] * 1e3:11.2f} {j[1] * 1e3:9.2f} {j[2]:6.2f}", flush=True)
            continue

        def torch_step(f):
            xt = torch.from_numpy(x).requires_grad_(True)
            f(xt).sum().backward()

        torch_step(tsafe_f)
        torch_step(tnaive_f)
        t = _pair_ratio_alternating(lambda: torch_step(tsafe_f), lambda: torch_step(tnaive_f), reps)
        print(f"{name:24s} {j[0] * 1e3:11.2f} {j[1] * 1e3:9.2f} {j[2]:6.2f}   "
              f"{t[0] * 1e3:13.2f} {t[1] * 1e3:9.2f} {t[2]:6.2f} ({t[3]:.2f}-{t[4]:.2f})", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9, sys.argv[2] if len(sys.argv) > 2 else "jax,torch")
