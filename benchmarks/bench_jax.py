"""Benchmark gradsan.jax.guard against the tools JAX ships (jax_debug_nans, checkify).

    .venv/bin/python benchmarks/bench_jax.py [--quick] [--rounds N] [--skip-overhead] [--skip-nan]

One process, two parts:

1. Per-step overhead of a jitted optax (adam) train step, on an MLP (4 hidden layers x 512,
   batch 256, input 512) and a 2-layer transformer encoder (d_model 256, 4 heads, seq 64,
   batch 16, plain jax.numpy). Variants: the plain jitted step, gsj.guard(jitted step), a fresh
   jitted step run under jax_debug_nans, and checkify(step, errors=float_checks) jitted with
   err.throw() after every step. Timing is paired: each round calls every variant once, in a
   rotated order, blocking on the outputs; we report the median over rounds of each variant's
   time and of its ratio to the plain step *in the same round* (internals.md Q4: paired,
   alternating medians cancel most of the machine's noise).

2. Time from a NaN to the report on a 200-layer tanh MLP (width 64) whose layer 150 takes
   jnp.sqrt of an exact 0, so the gradient is NaN (sqrt'(0) = inf meets a 0). Each tool is run
   cold (fresh closures and jax.jit objects: tracing + compilation included) and warm (second
   call of the same objects), and we print what each one says.

The last block holds "RESULT name=value" lines for the README.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import checkify

import gradsan
import gradsan.jax as gsj

RESULTS: list[tuple[str, str]] = []


def result(name: str, value: Any) -> None:
    RESULTS.append((name, str(value)))


def block(tree: Any) -> Any:
    return jax.block_until_ready(tree)


# --------------------------------------------------------------------------------------------
# Part 1 models
# --------------------------------------------------------------------------------------------


def mlp_init(
    key: jax.Array, d_in: int = 512, width: int = 512, depth: int = 4, d_out: int = 1
) -> list[dict[str, jax.Array]]:
    sizes = [d_in] + [width] * depth + [d_out]
    params = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        key, k = jax.random.split(key)
        params.append(
            {
                "w": jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a),
                "b": jnp.zeros((b,), jnp.float32),
            }
        )
    return params


def mlp_loss(params: list, batch: tuple) -> jax.Array:
    x, y = batch
    h = x
    for layer in params[:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    out = h @ params[-1]["w"] + params[-1]["b"]
    return jnp.mean((out - y) ** 2)


def layer_norm(x: jax.Array, g: jax.Array, b: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * g + b


def tf_init(key: jax.Array, d: int = 256, layers: int = 2, d_ff: int = 1024) -> dict:
    def dense(k, a, b):
        return jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a)

    blocks = []
    for _ in range(layers):
        key, *ks = jax.random.split(key, 7)
        blocks.append(
            {
                "ln1_g": jnp.ones((d,)),
                "ln1_b": jnp.zeros((d,)),
                "wq": dense(ks[0], d, d),
                "wk": dense(ks[1], d, d),
                "wv": dense(ks[2], d, d),
                "wo": dense(ks[3], d, d),
                "ln2_g": jnp.ones((d,)),
                "ln2_b": jnp.zeros((d,)),
                "w1": dense(ks[4], d, d_ff),
                "b1": jnp.zeros((d_ff,)),
                "w2": dense(ks[5], d_ff, d),
                "b2": jnp.zeros((d,)),
            }
        )
    key, k = jax.random.split(key)
    return {
        "blocks": blocks,
        "lnf_g": jnp.ones((d,)),
        "lnf_b": jnp.zeros((d,)),
        "head": dense(k, d, d),
    }


def tf_loss(params: dict, batch: tuple, heads: int = 4) -> jax.Array:
    x, y = batch  # (B, S, D)
    B, S, D = x.shape
    hd = D // heads
    h = x
    for p in params["blocks"]:
        a = layer_norm(h, p["ln1_g"], p["ln1_b"])
        q = (a @ p["wq"]).reshape(B, S, heads, hd)
        k = (a @ p["wk"]).reshape(B, S, heads, hd)
        v = (a @ p["wv"]).reshape(B, S, heads, hd)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
        s = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", s, v).reshape(B, S, D)
        h = h + o @ p["wo"]
        f = layer_norm(h, p["ln2_g"], p["ln2_b"])
        f = jax.nn.gelu(f @ p["w1"] + p["b1"])
        h = h + f @ p["w2"] + p["b2"]
    h = layer_norm(h, params["lnf_g"], params["lnf_b"])
    out = h @ params["head"]
    return jnp.mean((out - y) ** 2)


def make_train_step(loss_fn: Callable, opt: optax.GradientTransformation) -> Callable:
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    return step


# --------------------------------------------------------------------------------------------
# Part 1: paired, alternating timing
# --------------------------------------------------------------------------------------------


class DebugNans:
    """Call ``fun`` with jax_debug_nans on; the flag is restored right after the call."""

    def __init__(self, fun: Callable) -> None:
        self.fun = fun

    def __call__(self, *args: Any) -> Any:
        old = jax.config.jax_debug_nans
        jax.config.update("jax_debug_nans", True)
        try:
            return block(self.fun(*args))
        finally:
            jax.config.update("jax_debug_nans", old)


def checkified_step(step: Callable) -> Callable:
    checked = jax.jit(checkify.checkify(step, errors=checkify.float_checks))

    def run(*args: Any) -> Any:
        err, out = checked(*args)
        err.throw()
        return out

    return run


def overhead(
    name: str,
    loss_fn: Callable,
    params: Any,
    batch: tuple,
    rounds: int,
    warmup: int,
    with_checkify: bool = True,
) -> None:
    opt = optax.adam(1e-3)
    opt_state = opt.init(params)

    # Every variant gets its own step closure and jit object: JAX caches traces per function
    # object, so a shared `step` would let later variants reuse the plain step's trace (the
    # debug_nans variant must be traced and compiled with the flag on to be fair).
    def fresh() -> Callable:
        return make_train_step(loss_fn, opt)

    variants: dict[str, Callable] = {
        "plain": jax.jit(fresh()),
        "guard": gsj.guard(jax.jit(fresh())),
        "debug_nans": DebugNans(jax.jit(fresh())),
    }
    if with_checkify:
        variants["checkify"] = checkified_step(fresh())
    args = (params, opt_state, batch)
    compile_s = {}
    for v, f in variants.items():
        t0 = time.perf_counter()
        block(f(*args))
        compile_s[v] = time.perf_counter() - t0
    for _ in range(warmup):
        for f in variants.values():
            block(f(*args))
    names = list(variants)
    times: dict[str, list[float]] = {v: [] for v in names}
    ratios: dict[str, list[float]] = {v: [] for v in names}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            got = {}
            for v in order:
                f = variants[v]
                t0 = time.perf_counter()
                block(f(*args))
                got[v] = time.perf_counter() - t0
            for v in names:
                times[v].append(got[v])
                ratios[v].append(got[v] / got["plain"])
    finally:
        if gc_was:
            gc.enable()
    floor_ms = read_floor_ms(variants["plain"](*args))
    print(f"\n{name}: {rounds} rounds (+{warmup} warm-up), paired alternating medians")
    print(
        f"  {'model':<12} {'variant':<11} {'median ms':>10} {'ratio':>7} "
        f"{'ratio IQR':>13} {'1st call s':>10}"
    )
    for v in names:
        q = np.percentile(ratios[v], [25, 75])
        med_ms = statistics.median(times[v]) * 1e3
        med_r = statistics.median(ratios[v])
        print(
            f"  {name:<12} {v:<11} {med_ms:>10.2f} {med_r:>6.3f}x "
            f"{q[0]:>6.3f}-{q[1]:<6.3f} {compile_s[v]:>10.2f}"
        )
        result(f"{name}.{v}.ms", f"{med_ms:.2f}")
        result(f"{name}.{v}.ratio", f"{med_r:.3f}")
        result(f"{name}.{v}.first_call_s", f"{compile_s[v]:.2f}")
    plain_ms = statistics.median(times["plain"]) * 1e3
    print(
        f"  one read of every output on the host (numpy, the fastest exact check we found): "
        f"{floor_ms:.2f} ms = {1 + floor_ms / plain_ms:.3f}x the plain step"
    )
    result(f"{name}.read_floor.ms", f"{floor_ms:.2f}")
    result(f"{name}.read_floor.ratio", f"{1 + floor_ms / plain_ms:.3f}")
    sys.stdout.flush()


def read_floor_ms(out: Any, reps: int = 50) -> float:
    """Median time to read every float output once and decide finiteness (a dot product with
    zeros: 0 * x is 0 for finite x and NaN otherwise). No exact check can read less."""
    leaves = [
        np.asarray(x).reshape(-1)
        for x in jax.tree_util.tree_leaves(block(out))
        if jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    zeros = [np.zeros_like(x) for x in leaves]
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ok = all(np.isfinite(np.dot(x, z)) for x, z in zip(leaves, zeros))
        ts.append(time.perf_counter() - t0)
    assert ok
    return statistics.median(ts) * 1e3


def part1(rounds: int | None, warmup: int, quick: bool) -> None:
    print("=" * 78)
    print("Part 1: per-step overhead of a jitted optax adam train step")
    print("=" * 78)
    key = jax.random.PRNGKey(0)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    params = mlp_init(k1)
    batch = (jax.random.normal(k2, (256, 512)), jax.random.normal(k3, (256, 1)))
    overhead("mlp4x512", mlp_loss, params, batch, rounds or (24 if quick else 60), warmup)

    params = tf_init(k4)
    kx, ky = jax.random.split(k4)
    batch = (jax.random.normal(kx, (16, 64, 256)), jax.random.normal(ky, (16, 64, 256)))
    if quick:
        print("\n(--quick: no checkify variant for the transformer; compiling it takes ~35 s)")
    overhead(
        "transformer",
        tf_loss,
        params,
        batch,
        rounds or (8 if quick else 30),
        warmup,
        with_checkify=not quick,
    )


# --------------------------------------------------------------------------------------------
# Part 2: time from a NaN to the report
# --------------------------------------------------------------------------------------------

DEPTH, WIDTH, BAD_LAYER = 200, 64, 150


def make_deep_grad_step() -> Callable:
    """A fresh closure each time, so nothing traced or compiled before is reused."""

    def loss(params, x, y, mask):
        h = x
        for i, (w, b) in enumerate(params):
            h = jnp.tanh(h @ w + b)
            if i == BAD_LAYER:
                h = jnp.sqrt(h * h * mask)  # BAD-SQRT: input is exactly 0, sqrt'(0) = inf
        return jnp.mean((h - y) ** 2)

    def grad_step(params, x, y, mask):
        return jax.grad(loss)(params, x, y, mask)

    return grad_step


def bad_sqrt_line() -> int:
    with open(__file__) as fh:
        for n, line in enumerate(fh, 1):
            if "# BAD-SQRT" in line and "jnp.sqrt" in line:
                return n
    raise RuntimeError("marker not found")


def deep_inputs() -> tuple:
    key = jax.random.PRNGKey(1)
    params = []
    for _ in range(DEPTH):
        key, k = jax.random.split(key)
        params.append((jax.random.normal(k, (WIDTH, WIDTH)) / np.sqrt(WIDTH), jnp.zeros((WIDTH,))))
    key, kx, ky = jax.random.split(key, 3)
    x = jax.random.normal(kx, (32, WIDTH))
    y = jax.random.normal(ky, (32, WIDTH))
    mask = jnp.zeros((WIDTH,))
    return params, x, y, mask


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def user_frame_from_tb(e: BaseException) -> str:
    """The deepest frame of this script in the exception's traceback (what a user would see).

    checkify attaches the failing operation's traceback as ``__cause__``, so that is read first.
    """
    for exc in (e.__cause__, e):
        if exc is None:
            continue
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if os.path.abspath(f.filename) == os.path.abspath(__file__)
        ]
        if frames:
            f = frames[-1]
            return f"{os.path.basename(f.filename)}:{f.lineno}"
    return "?"


def timed_raise(fun: Callable, args: tuple, exc: type) -> tuple[float, BaseException | None]:
    t0 = time.perf_counter()
    try:
        fun(*args)
    except exc as e:  # noqa: BLE001
        return time.perf_counter() - t0, e
    return time.perf_counter() - t0, None


def part2(quick: bool) -> None:
    print("\n" + "=" * 78)
    print(
        f"Part 2: time from a NaN to the report ({DEPTH}-layer tanh MLP, width {WIDTH}, "
        f"jnp.sqrt of an exact 0 at layer {BAD_LAYER})"
    )
    print("=" * 78)
    args = deep_inputs()
    want_line = bad_sqrt_line()
    print(f"the layer-{BAD_LAYER} sqrt is at {os.path.basename(__file__)}:{want_line}")

    # Sanity: the plain jitted gradient is NaN and the loss is finite.
    g = jax.jit(make_deep_grad_step())(*args)
    n_nan = sum(int(jnp.isnan(w).sum() + jnp.isnan(b).sum()) for w, b in g)
    n_all = sum(w.size + b.size for w, b in g)
    print(f"plain jitted grad: {n_nan} of {n_all} gradient elements are NaN")
    del g

    # (a) gradsan guard
    print("\n(a) gsj.guard(jax.jit(grad_step)) -> gradsan.NonFiniteError")
    step = gsj.guard(jax.jit(make_deep_grad_step()))
    cold, e = timed_raise(step, args, gradsan.NonFiniteError)
    warm, e2 = timed_raise(step, args, gradsan.NonFiniteError)
    print(f"    cold {cold:.2f} s   warm {warm:.2f} s")
    result("nan_to_report.gradsan_guard.cold_s", f"{cold:.2f}")
    result("nan_to_report.gradsan_guard.warm_s", f"{warm:.2f}")
    if e is None or e2 is None:
        print("    !! guard did not raise")
        result("nan_to_report.gradsan_guard.says", "did-not-raise")
    else:
        rep = e.report
        f0 = rep.findings[0] if rep.findings else None
        if f0 is None:
            print("    !! report has no findings; notes:", rep.notes)
        else:
            where = f"{os.path.basename(f0.where.file)}:{f0.where.line}" if f0.where else None
            zf = (
                f"{os.path.basename(f0.zero_from.file)}:{f0.zero_from.line}"
                if f0.zero_from
                else None
            )
            ok = (
                f0.where is not None
                and os.path.abspath(f0.where.file) == os.path.abspath(__file__)
                and f0.where.line == want_line
            )
            print(
                f"    findings: {len(rep.findings)}; first: primitive={f0.primitive} "
                f"where={where} zero_from={zf} outputs={len(f0.outputs)} "
                f"(catalog_id={f0.catalog_id}, form={f0.form}, met_op={f0.met_op})"
            )
            print(f"    where.code: {f0.where.code.strip() if f0.where else ''}")
            if f0.zero_from is not None:
                print(f"    zero_from.code: {f0.zero_from.code.strip()}")
            print(f"    reported line is the layer-{BAD_LAYER} sqrt line: {'YES' if ok else 'NO'}")
            msg = str(e).strip().splitlines()
            print(f"    message first line: {msg[0] if msg else ''}")
            result(
                "nan_to_report.gradsan_guard.says",
                f"primitive={f0.primitive} where={where} zero_from={zf} outputs={len(f0.outputs)}",
            )
            result("nan_to_report.gradsan_guard.line_is_bad_sqrt", ok)
    del step, e, e2
    sys.stdout.flush()

    # (b) jax_debug_nans
    print("\n(b) jax_debug_nans + jax.jit(grad_step) -> FloatingPointError")
    old = jax.config.jax_debug_nans
    jax.config.update("jax_debug_nans", True)
    try:
        step = jax.jit(make_deep_grad_step())
        cold, e = timed_raise(step, args, FloatingPointError)
        warm, e2 = timed_raise(step, args, FloatingPointError)
    finally:
        jax.config.update("jax_debug_nans", old)
    print(f"    cold {cold:.2f} s   warm {warm:.2f} s")
    result("nan_to_report.debug_nans.cold_s", f"{cold:.2f}")
    result("nan_to_report.debug_nans.warm_s", f"{warm:.2f}")
    if e is None:
        print("    !! debug_nans did not raise")
    else:
        uf = user_frame_from_tb(e)
        print(f"    says: {first_line(e)}")
        print(f"    deepest frame of this script in its traceback: {uf}")
        result("nan_to_report.debug_nans.says", first_line(e))
        result("nan_to_report.debug_nans.user_frame", uf)
    del step, e, e2
    sys.stdout.flush()

    # (c) checkify float_checks
    print("\n(c) jax.jit(checkify(grad_step, errors=float_checks)); err.throw()")
    if quick:
        print("    skipped in --quick: compiling it takes 60 s or more on a 2-core CPU")
        result("nan_to_report.checkify.cold_s", "skipped(--quick)")
        return

    def make_checked() -> Callable:
        checked = jax.jit(checkify.checkify(make_deep_grad_step(), errors=checkify.float_checks))

        def run(*a):
            err, out = checked(*a)
            err.throw()
            return out

        return run

    step = make_checked()
    cold, e = timed_raise(step, args, checkify.JaxRuntimeError)
    warm, e2 = timed_raise(step, args, checkify.JaxRuntimeError)
    print(f"    cold {cold:.2f} s   warm {warm:.2f} s")
    result("nan_to_report.checkify.cold_s", f"{cold:.2f}")
    result("nan_to_report.checkify.warm_s", f"{warm:.2f}")
    if e is None:
        print("    !! checkify did not raise")
    else:
        uf = user_frame_from_tb(e)
        print(f"    says: {first_line(e)}")
        print(f"    frame of this script in its (chained) traceback: {uf}")
        result("nan_to_report.checkify.says", first_line(e))
        result("nan_to_report.checkify.user_frame", uf)
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="fewer rounds, no checkify on the transformer nor the 200-layer net (~1-2 min)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="paired rounds per model (default 60 MLP / 30 transformer; --quick 24 / 8)",
    )
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-nan", action="store_true")
    a = ap.parse_args()
    warmup = 2 if a.quick else 4
    t0 = time.perf_counter()
    print(
        f"jax {jax.__version__}, optax {optax.__version__}, gradsan "
        f"{getattr(gradsan, '__version__', '?')}, backend {jax.default_backend()}, "
        f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}"
    )
    if not a.skip_overhead:
        part1(a.rounds, warmup, a.quick)
    if not a.skip_nan:
        part2(a.quick)
    total = time.perf_counter() - t0
    result("total_s", f"{total:.1f}")
    print("\n" + "=" * 78)
    for name, value in RESULTS:
        print(f"RESULT {name}={value}")


if __name__ == "__main__":
    main()
