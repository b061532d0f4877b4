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
    ap.add_argument("--repeat", type=int, default=7, help="paired rounds (median reported)")
    a = ap.parse_args()
    with jax.enable_x64(True):
        loss, params, x, y = make(a.layers, a.width, a.batch)
        g = jax.grad(loss)
        gj = jax.jit(g)
        t0 = time.perf_counter()
        jax.block_until_ready(gj(params, x, y))
        t_jit_first = time.perf_counter() - t0
        t_eager = timeit(lambda: jax.block_until_ready(g(params, x, y)), 3)
        plain = gj(params, x, y)
        nan = bool(np.isnan(np.asarray(plain["u"])).any())
    cert = gsj.certify(loss)
    t0 = time.perf_counter()
    r = cert(params, x, y)
    t_first = time.perf_counter() - t0

    def jitted_mean(n=30):
        with jax.enable_x64(True):
            t0 = time.perf_counter()
            for _ in range(n):
                jax.block_until_ready(gj(params, x, y))
            return (time.perf_counter() - t0) / n

    # paired rounds: one certification, then the mean of 30 jitted gradients right after, so
    # that both see the same load on this shared machine; the median ratio is reported
    rounds = []
    for _ in range(max(1, a.repeat)):
        t0 = time.perf_counter()
        cert(params, x, y)
        tc = time.perf_counter() - t0
        rounds.append((tc, jitted_mean()))
    ratios = sorted(tc / tg for tc, tg in rounds)
    t_cert, t_jit = sorted(rounds)[len(rounds) // 2]
    d = r.findings[0].detail
    print(f"MLP {a.layers} layers x {a.width} (batch {a.batch}), tanh, MSE, one singular layer")
    print(f"  plain jax.grad: NaN in d/du = {nan}")
    print(f"  certify: label={d['label']}, verdicts={[v['verdict'] for v in d['verdicts']]}")
    if r.outputs is not None:
        print(
            f"  certified d/du (min-norm Clarke element) norm = "
            f"{float(np.linalg.norm(r.outputs['u'])):.3g}"
        )
    print(
        f"  time: jitted grad {t_jit * 1e3:.2f} ms, eager grad {t_eager * 1e3:.1f} ms, "
        f"certify ({len(d['verdicts'])} rays) {t_cert * 1e3:.0f} ms (first call, with "
        f"tracing: {t_first * 1e3:.0f} ms)"
    )
    print(
        f"  certify cost = {ratios[len(ratios) // 2]:.0f} jitted gradients (median of "
        f"{len(ratios)} paired rounds; range {ratios[0]:.0f}-{ratios[-1]:.0f}) = "
        f"{t_cert / t_eager:.1f} eager gradients (target: <= 50 gradients)"
    )
    print(
        f"  first calls: certify {t_first * 1e3:.0f} ms (tracing the loss and its vmapped "
        f"form) against the jitted gradient's {t_jit_first * 1e3:.0f} ms (tracing and "
        f"compiling): {t_first / t_jit_first:.2f}x"
    )


def seeds() -> None:
    """The seed cases: one certification each, in jitted gradients of the same loss."""
    A0 = jnp.array([[1.0, 0.0], [0.0, 3.0]])
    cases = [
        ("Zygote seed, theta = 4", lambda th: jnp.sqrt(jnp.sum((jnp.sqrt(A0**th) - A0) ** 2)), 4.0),
        ("sqrt(x) * sqrt(x) at 0", lambda x: jnp.sqrt(x) * jnp.sqrt(x), 0.0),
        ("x * sqrt(x) at 0", lambda x: x * jnp.sqrt(x), 0.0),
        ("norm(x) at 0", lambda x: jnp.linalg.norm(x), jnp.zeros(3)),
        ("sqrt(norm(x)) at 0", lambda x: jnp.sqrt(jnp.linalg.norm(x)), jnp.zeros(3)),
    ]
    print("seed cases (one certification, two rays):")
    for name, f, x0 in cases:
        with jax.enable_x64(True):
            gj = jax.jit(jax.grad(f))
            jax.block_until_ready(gj(x0))
            t_jit = timeit(lambda: jax.block_until_ready(gj(x0)), 200)
            g = jax.grad(f)
            t_eager = timeit(lambda: jax.block_until_ready(g(x0)), 20)
        cert = gsj.certify(f)
        r = cert(x0)
        t = timeit(lambda: cert(x0), 5)
        d = r.findings[0].detail
        out = None if r.outputs is None else np.round(np.asarray(r.outputs), 4).tolist()
        print(
            f"  {name:24s} {d['label']:18s} {str(out):18s} {t * 1e3:6.1f} ms = "
            f"{t / t_eager:4.1f} eager gradients ({t_eager * 1e3:.1f} ms) = {t / t_jit:4.0f} "
            f"jitted ({t_jit * 1e6:.0f} us: dispatch)"
        )


if __name__ == "__main__":
    main()
    seeds()
