"""gradsan on 8 simulated CPU devices, against jax_debug_nans and checkify, in one process.

    .venv/bin/python benchmarks/bench_mesh.py [--rounds N]

1. Time to the report: a data-parallel shard_map loss (pmean of per-device row norms) whose
   row 10 of 16 is all zeros, so sqrt'(0) = inf meets the zero of d(x*x) and the gradient is
   NaN on device 5. Each tool runs cold (fresh jit objects: trace and compile included), and
   we print what it says.
2. Per-step cost on an 8-device data-parallel step (jit over a NamedSharding batch, an MLP):
   the plain jitted step, gsj.guard(step), the step under jax_debug_nans, and checkify's
   float checks. Paired rounds in rotated order; medians of each variant's ratio to the plain
   step in the same round, with the spread (min-max).
3. Time to the report on a 10,000-step scan whose step 7000 takes sqrt of an exact 0.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import checkify  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import gradsan  # noqa: E402
import gradsan.jax as gsj  # noqa: E402


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:110]


def time_to_report() -> None:
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    x = jnp.ones((16, 3)).at[10].set(0.0)

    def make():
        def loss(x):
            return jax.lax.pmean(jnp.sum(jnp.sqrt(jnp.sum(x * x, axis=1))), "data")

        return jax.jit(jax.grad(jax.shard_map(loss, mesh=mesh, in_specs=P("data"), out_specs=P())))

    print("1. time to the report: NaN gradient born in a shard_map on device 5 of 8")
    t = time.perf_counter()
    r = gsj.explain(make())(x)
    dt = time.perf_counter() - t
    f = r.findings[0]
    print(f"   gradsan.explain   {dt:6.2f} s  {f.primitive} at line {f.where.line}, {f.context}")
    t = time.perf_counter()
    try:
        jax.config.update("jax_debug_nans", True)
        jax.block_until_ready(make()(x))
        said = "nothing"
    except FloatingPointError as e:
        said = _first_line(e)
    finally:
        jax.config.update("jax_debug_nans", False)
    print(f"   jax_debug_nans    {time.perf_counter() - t:6.2f} s  {said}")
    t = time.perf_counter()
    try:
        err, _ = jax.jit(checkify.checkify(make(), errors=checkify.float_checks))(x)
        err.throw()
        said = "nothing"
    except Exception as e:  # checkify's JaxRuntimeError
        said = _first_line(e)
    print(f"   checkify          {time.perf_counter() - t:6.2f} s  {said}")


def step_cost(rounds: int) -> None:
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.normal(size=s) * 0.1, jnp.float32) for s in ((256, 256),) * 4]
    batch = jax.device_put(
        jnp.asarray(rng.normal(size=(512, 256)), jnp.float32), NamedSharding(mesh, P("data"))
    )

    def loss(ps, xb):
        h = xb
        for w in ps:
            h = jnp.tanh(h @ w)
        return jnp.mean(h * h)

    def train(ps, xb):
        g = jax.grad(loss)(ps, xb)
        return [p - 0.01 * gi for p, gi in zip(ps, g)]

    plain = jax.jit(train)
    guarded = gsj.guard(jax.jit(train))
    checked = jax.jit(checkify.checkify(train, errors=checkify.float_checks))

    def debug_nans(ps, xb):
        jax.config.update("jax_debug_nans", True)
        try:
            return jax.block_until_ready(debug_jit(ps, xb))
        finally:
            jax.config.update("jax_debug_nans", False)

    debug_jit = jax.jit(train)

    def run_checkify(ps, xb):
        err, out = checked(ps, xb)
        err.throw()
        return out

    variants = {
        "plain": plain,
        "guard": guarded,
        "debug_nans": debug_nans,
        "checkify": run_checkify,
    }
    for fn in variants.values():  # compile, and guard's background compile
        for _ in range(3):
            jax.block_until_ready(fn(params, batch))
    time.sleep(1.0)
    ratios: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        times = {}
        for name in order:
            t = time.perf_counter()
            jax.block_until_ready(variants[name](params, batch))
            times[name] = time.perf_counter() - t
        for name in names:
            ratios[name].append(times[name] / times["plain"])
    print("2. per-step cost, 8-device data-parallel MLP step (ratio to the plain step, paired)")
    for name in names[1:]:
        rs = ratios[name]
        print(
            f"   {name:11s} median {statistics.median(rs):5.2f}x  (min {min(rs):.2f}, "
            f"max {max(rs):.2f}, {len(rs)} rounds)"
        )


def long_scan() -> None:
    n = 10_000

    def loss(w, xs):
        def step(h, x):
            h = jnp.tanh(h * w + x)
            return h, jnp.sqrt(jnp.abs(h - 0.5))

        h, ys = jax.lax.scan(step, jnp.zeros(4), xs)
        return jnp.sum(ys) + jnp.sum(h)

    xs = (jnp.ones((n, 4)) * 0.01).at[7000].set(jnp.arctanh(0.5))
    t = time.perf_counter()
    r = gsj.explain(jax.jit(jax.grad(loss)))(jnp.zeros(4), xs)
    f = r.findings[0]
    print("3. time to the report: 10,000-step scan, sqrt of 0 at step 7000")
    print(f"   gradsan.explain   {time.perf_counter() - t:6.2f} s  {f.primitive}, {f.context}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    print(
        f"gradsan {gradsan.__version__ if hasattr(gradsan, '__version__') else ''}, "
        f"jax {jax.__version__}, {len(jax.devices())} devices"
    )
    time_to_report()
    step_cost(args.rounds)
    long_scan()


if __name__ == "__main__":
    main()
