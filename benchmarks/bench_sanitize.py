"""Kink telemetry and the cost of gradsan.jax.sanitize.

1. relu'(0) hits per epoch while training an MLP on sklearn's digits (8x8 MNIST-like) with
   plain SGD, in float32 and float16 (compare Bertoin et al. 2021, theory.md section 4: exact
   zeros of pre-activations are common in 16 bits, rarer in 32). The count is the number of
   pre-activation elements exactly 0 in each epoch's training steps, counted in the training
   step itself (an independent count) and checked against sanitize's count on the first batch.
2. sanitize on a 200-layer MLP: a one-off run against the plain step's first call (tracing and
   compilation included, like sanitize's), and a repeated call (its compiled screen is cached
   per argument structure) against a warm jitted step.

3. ``--paired OTHER_SRC``: the clean step's cost against another gradsan tree (before/after):
   rounds alternate a child process per tree (``PYTHONPATH=OTHER_SRC`` and this tree), each
   timing sanitize's warm call on a clean step (no kink: the compiled screen alone) against
   the warm jitted step; it prints each tree's median ratio with its spread (min..max and
   interquartile range), the median of the paired differences with its IQR and a 95%
   bootstrap interval (rounds resampled), for the ratio and for sanitize's time itself.
   The baseline of issue #15 is main at 91f854f: ``git -C /work/main worktree add /tmp/base91
   91f854f`` and ``--paired /tmp/base91/src --rounds 15``.

    python benchmarks/bench_sanitize.py [--epochs 3] [--layers 200]
    python benchmarks/bench_sanitize.py --paired /work/main/src --rounds 7 --layers 50
    python benchmarks/bench_sanitize.py --paired /work/main/src --user-jit --rounds 7 --layers 50

(Without ``--user-jit`` the step sanitize wraps is ``jax.grad(loss)`` itself, which its G0 call
runs op by op: most of the measured time is that call, not the screen.)
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import gradsan.jax as gsj


def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[d.target]
    return x, y


def init(key, sizes, dtype):
    ks = jax.random.split(key, len(sizes))
    return [
        ((jax.random.normal(k, (a, b)) * np.sqrt(2.0 / a)).astype(dtype), jnp.zeros(b, dtype))
        for k, a, b in zip(ks, sizes[:-1], sizes[1:])
    ]


def loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    logits = (h @ w + b).astype(jnp.float32)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, -1))


def zeros_in_step(params, x):
    n = 0
    h = x
    for w, b in params[:-1]:
        z = h @ w + b
        n += jnp.sum(z == 0)
        h = jax.nn.relu(z)
    return n


def telemetry(epochs: int, width: int, batch: int) -> None:
    x, y = digits()
    print(f"digits: {x.shape[0]} samples; MLP 64-{width}-{width}-10, batch {batch}, SGD lr 0.1")
    for dtype in (jnp.float32, jnp.float16):
        params = init(jax.random.PRNGKey(0), [64, width, width, 10], dtype)
        xs, ys = jnp.asarray(x, dtype), jnp.asarray(y)

        @jax.jit
        def step(params, xb, yb):
            g = jax.grad(loss)(params, xb, yb)
            return jax.tree_util.tree_map(lambda p, gi: p - (0.1 * gi).astype(p.dtype), params, g)

        count = jax.jit(zeros_in_step)
        # sanitize agrees with the independent count on the first batch
        r = gsj.sanitize(jax.grad(loss), directions=0)(params, xs[:batch], ys[:batch])
        hits = sum(f.count for f in r.findings if f.catalog_id == "relu-at-zero")
        assert hits == int(count(params, xs[:batch])), (hits, int(count(params, xs[:batch])))
        evals = 2 * width * x.shape[0]
        for ep in range(epochs):
            perm = np.random.default_rng(ep).permutation(x.shape[0])
            n = 0
            for i in range(0, len(perm) - batch + 1, batch):
                idx = perm[i : i + batch]
                n += int(count(params, xs[idx]))
                params = step(params, xs[idx], ys[idx])
            print(
                f"  {jnp.dtype(dtype).name:8s} epoch {ep}: relu'(0) hit {n:6d} times "
                f"({n / evals:.2e} of {evals} relu evaluations)"
            )


def cost(layers: int, width: int) -> None:
    params = init(jax.random.PRNGKey(1), [32] + [width] * layers + [10], jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(2), (16, 32))
    y = jax.nn.one_hot(jnp.arange(16) % 10, 10)

    def step(params, x, y):
        return jax.grad(loss)(params, x, y)

    t0 = time.perf_counter()
    jax.block_until_ready(jax.jit(step)(params, x, y))
    first = time.perf_counter() - t0
    fast = jax.jit(step)
    jax.block_until_ready(fast(params, x, y))
    t0 = time.perf_counter()
    for _ in range(10):
        jax.block_until_ready(fast(params, x, y))
    warm = (time.perf_counter() - t0) / 10
    t0 = time.perf_counter()
    jax.make_jaxpr(lambda *a: step(*a))(params, x, y)
    trace = time.perf_counter() - t0
    print(
        f"{layers}-layer MLP: tracing the step to a jaxpr alone takes {trace:.2f} s = "
        f"{trace / warm:.0f}x a warm step (what any tool that reads the program pays once)"
    )
    san = gsj.sanitize(step)
    t0 = time.perf_counter()
    r = san(params, x, y)
    one_off = time.perf_counter() - t0
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        san(params, x, y)
        times.append(time.perf_counter() - t0)
    again = sorted(times)[len(times) // 2]
    print(
        f"{layers}-layer MLP (width {width}): plain jitted step: first call {first:.2f} s, warm "
        f"{warm * 1e3:.2f} ms; sanitize: one-off {one_off:.2f} s = {one_off / first:.2f}x the "
        f"plain first call, again {again * 1e3:.2f} ms = {again / warm:.1f}x a warm step "
        f"({len(r.findings)} findings)"
    )
    print(f"RESULT sanitize.one_off_vs_first_call={one_off / first:.2f}")
    print(f"RESULT sanitize.repeat_vs_warm_step={again / warm:.2f}")


def clean_ratio(layers: int, width: int, reps: int, user_jit: bool = False) -> None:
    """One child's measure: sanitize's warm call on a clean step over the warm jitted step.
    ``user_jit``: sanitize the jitted step (its G0 call of the user's function is then the
    compiled step, not the step run op by op)."""
    params = init(jax.random.PRNGKey(1), [32] + [width] * layers + [10], jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(2), (16, 32))
    y = jax.nn.one_hot(jnp.arange(16) % 10, 10)

    def step(params, x, y):
        return jax.grad(loss)(params, x, y)

    fast = jax.jit(step)
    san = gsj.sanitize(fast if user_jit else step)
    jax.block_until_ready(fast(params, x, y))
    r = san(params, x, y)
    assert not r.findings, "the clean step has findings"
    plain, sani = [], []
    for _ in range(reps):  # interleaved, so load changes hit both alike
        t0 = time.perf_counter()
        jax.block_until_ready(fast(params, x, y))
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        san(params, x, y)
        sani.append(time.perf_counter() - t0)
    print(f"RESULT clean.ratio={np.median(sani) / np.median(plain):.4f}")
    print(f"RESULT clean.sanitize_ms={np.median(sani) * 1e3:.4f}")


def paired(other: str, rounds: int, layers: int, reps: int, user_jit: bool = False) -> None:
    import os
    import re
    import subprocess
    import sys

    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    trees = {"other": other, "this": here}
    got: dict[str, list[float]] = {"other": [], "this": []}
    ms: dict[str, list[float]] = {"other": [], "this": []}
    for i in range(rounds):
        order = ["other", "this"] if i % 2 == 0 else ["this", "other"]
        for name in order:
            env = dict(os.environ, PYTHONPATH=trees[name])
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--layers", str(layers), "--reps", str(reps)]
                + (["--user-jit"] if user_jit else []),
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            got[name].append(float(re.search(r"clean.ratio=([\d.]+)", out).group(1)))
            ms[name].append(float(re.search(r"clean.sanitize_ms=([\d.]+)", out).group(1)))
    for name in ("other", "this"):
        a = np.array(got[name])
        q1, q3 = np.percentile(a, [25, 75])
        print(
            f"{name:5s} ({trees[name]}): sanitize / plain warm step, clean {layers}-layer MLP: "
            f"median {np.median(a):.3f} (min {a.min():.3f}, max {a.max():.3f}, IQR "
            f"{q1:.3f}..{q3:.3f}; {rounds} rounds); sanitize median {np.median(ms[name]):.3f} ms"
        )
    d = np.array(got["this"]) - np.array(got["other"])
    q1, q3 = np.percentile(d, [25, 75])
    lo, hi = bootstrap(d)
    dm = np.array(ms["this"]) - np.array(ms["other"])
    mlo, mhi = bootstrap(dm)
    print(
        f"paired difference of the ratio (this - other): median {np.median(d):+.3f} "
        f"(min {d.min():+.3f}, max {d.max():+.3f}, IQR {q1:+.3f}..{q3:+.3f}; 95% bootstrap "
        f"interval of the median {lo:+.3f}..{hi:+.3f})"
    )
    print(
        f"paired difference of sanitize's time (this - other): median {np.median(dm):+.3f} ms "
        f"(95% bootstrap interval of the median {mlo:+.3f}..{mhi:+.3f} ms)"
    )
    print(f"RESULT clean.paired_median_diff={np.median(d):+.4f}")
    print(f"RESULT clean.paired_diff_ci={lo:+.4f},{hi:+.4f}")


def bootstrap(d: np.ndarray, n: int = 10000, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the median of the paired differences ``d``
    (rounds resampled with replacement)."""
    rng = np.random.default_rng(seed)
    meds = np.median(d[rng.integers(0, len(d), (n, len(d)))], axis=1)
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--paired", default=None, help="another gradsan src tree to compare with")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--user-jit", action="store_true", help="--paired: sanitize the jitted step, not the step"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        clean_ratio(ns.layers, 32, ns.reps, ns.user_jit)
        return
    if ns.paired:
        paired(ns.paired, ns.rounds, ns.layers, ns.reps, ns.user_jit)
        return
    telemetry(ns.epochs, ns.width, ns.batch)
    cost(ns.layers, 32)


if __name__ == "__main__":
    main()
