"""nansafe on finite programs against the plain jitted gradient: paired, alternating medians.

    python benchmarks/bench_nansafe.py

Models: an MLP 4 x 512 at batch 256, and a 200-layer tanh MLP with a layer norm per layer.
Prints the per-call median of each, their ratio (nansafe / plain) and the first-call times.
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import gradsan.jax as gsj


def mlp(sizes, key):
    keys = jax.random.split(key, len(sizes))
    return [
        {"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.zeros(b)}
        for k, a, b in zip(keys, sizes[:-1], sizes[1:])
    ]


def loss_mlp(params, x, y):
    h = x
    for p in params[:-1]:
        h = jax.nn.relu(h @ p["w"] + p["b"])
    o = h @ params[-1]["w"] + params[-1]["b"]
    return jnp.mean((o - y) ** 2)


def loss_deep(params, x, y):
    h = x
    for p in params[:-1]:
        h = jnp.tanh(h @ p["w"] + p["b"])
        m = jnp.mean(h, -1, keepdims=True)
        v = jnp.var(h, -1, keepdims=True)
        h = (h - m) / jnp.sqrt(v + 1e-5)
    o = h @ params[-1]["w"] + params[-1]["b"]
    return jnp.mean((o - y) ** 2)


def block(out):
    jax.tree_util.tree_map(lambda a: a.block_until_ready(), out)


def paired(f, g, args, reps):
    tf, tg = [], []
    for i in range(reps):
        for fn, acc in ((f, tf), (g, tg)) if i % 2 == 0 else ((g, tg), (f, tf)):
            t0 = time.perf_counter()
            block(fn(*args))
            acc.append(time.perf_counter() - t0)
    return statistics.median(tf), statistics.median(tg)


def first_call(fn, args):
    t0 = time.perf_counter()
    block(fn(*args))
    return time.perf_counter() - t0


def bench(name, loss, params, x, y, reps):
    plain = jax.jit(jax.grad(loss))
    safe = jax.jit(gsj.nansafe(jax.grad(loss)))
    c_plain = first_call(plain, (params, x, y))
    c_safe = first_call(safe, (params, x, y))
    same = all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(
            jax.tree_util.tree_leaves(plain(params, x, y)),
            jax.tree_util.tree_leaves(safe(params, x, y)),
        )
    )
    tp, ts = paired(plain, safe, (params, x, y), reps)
    print(
        f"{name:32s} plain {tp * 1e3:8.2f} ms  nansafe {ts * 1e3:8.2f} ms  ratio {ts / tp:5.3f}  "
        f"first call {c_plain:5.2f} s / {c_safe:5.2f} s  bit-identical {same}"
    )
    return ts / tp


def main(argv):
    quick = "--quick" in argv
    key = jax.random.PRNGKey(0)
    reps = 10 if quick else 40
    p = mlp([512] * 5, key)
    x = jax.random.normal(key, (256, 512))
    y = jnp.zeros((256, 512))
    bench("MLP 4x512, batch 256", loss_mlp, p, x, y, reps)
    depth, width, batch = (50, 64, 32) if quick else (200, 128, 64)
    p = mlp([width] * (depth + 1), key)
    x = jax.random.normal(key, (batch, width))
    y = jnp.zeros((batch, width))
    bench(f"{depth}-layer tanh+layernorm W={width}", loss_deep, p, x, y, reps)


if __name__ == "__main__":
    main(sys.argv[1:])
