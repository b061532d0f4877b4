"""Cost of gradsan.jax.certify on a 200-layer MLP (width 64, tanh, MSE loss) with one singular
layer (a weight-norm style gain ||u|| with u = 0, where plain AD returns NaN), in units of plain
gradient evaluations of the same loss (jitted and eager), measured in one process.

    python benchmarks/bench_certify.py [--layers 200] [--width 64] [--batch 16]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import gradsan.jax as gsj


def make(layers: int, width: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {
        "w": [rng.standard_normal((width, width)) / np.sqrt(width) for _ in range(layers)],
        "b": [0.1 * rng.standard_normal(width) for _ in range(layers)],
        "u": np.zeros(width),  # the singular layer's gain vector: ||u|| at u = 0
    }
    x = rng.standard_normal((batch, width))
    y = rng.standard_normal((batch, width))
    mid = layers // 2

    def loss(p, x, y):
        h = x
        for i, (w, b) in enumerate(zip(p["w"], p["b"])):
            h = jnp.tanh(h @ w + b)
            if i == mid:
                h = h * (1.0 + jnp.linalg.norm(p["u"]))  # singular layer
        return jnp.mean((h - y) ** 2)

    return loss, params, x, y


def timeit(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    with jax.enable_x64(True):
        loss, params, x, y = make(a.layers, a.width, a.batch)
        g = jax.grad(loss)
        gj = jax.jit(g)
        jax.block_until_ready(gj(params, x, y))
        t_jit = timeit(lambda: jax.block_until_ready(gj(params, x, y)), 10)
        t_eager = timeit(lambda: jax.block_until_ready(g(params, x, y)), 3)
        plain = gj(params, x, y)
        nan = bool(np.isnan(np.asarray(plain["u"])).any())
    cert = gsj.certify(loss)
    t0 = time.perf_counter()
    r = cert(params, x, y)
    t_cert = time.perf_counter() - t0
    if a.repeat > 1:
        t_cert = min(t_cert, timeit(lambda: cert(params, x, y), a.repeat - 1))
    d = r.findings[0].detail
    print(f"MLP {a.layers} layers x {a.width} (batch {a.batch}), tanh, MSE, one singular layer")
    print(f"  plain jax.grad: NaN in d/du = {nan}")
    print(f"  certify: label={d['label']}, verdicts={[v['verdict'] for v in d['verdicts']]}")
    if r.outputs is not None:
        print(f"  certified d/du (min-norm Clarke element) norm = "
              f"{float(np.linalg.norm(r.outputs['u'])):.3g}")
    print(f"  time: jitted grad {t_jit * 1e3:.2f} ms, eager grad {t_eager * 1e3:.1f} ms, "
          f"certify ({len(d['verdicts'])} rays) {t_cert * 1e3:.0f} ms")
    print(f"  certify cost = {t_cert / t_jit:.0f} jitted gradients = "
          f"{t_cert / t_eager:.1f} eager gradients (target: <= ~50 gradients)")


if __name__ == "__main__":
    main()
