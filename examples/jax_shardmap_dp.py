"""Data-parallel training on 8 (simulated) devices with `jax.shard_map` and `jax.lax.pmean`, the
pattern of the JAX sharding tutorial (https://docs.jax.dev/en/latest/sharded-computation.html)
and of jax-ml/jax's examples/spmd_mlp; the loss is an RMSE, `sqrt(mean((pred - y) ** 2))`, per
device.

The data loader pads the last batch with zero rows whose targets are zero too: the device that
receives only padding predicts 0 for them (zero inputs, no bias), its squared error is exactly 0,
and d sqrt / dx = inf at 0 meets that zero: NaN, which `pmean` spreads to every device's
gradients (https://github.com/jax-ml/jax/issues/4177 and #2630: sqrt at 0 in a loss). Run it
under gradsan:

    gradsan run examples/jax_shardmap_dp.py            # stops at the padded batch (exit 3)
    gradsan run examples/jax_shardmap_dp.py --no-pad   # trains to the end, unchanged
"""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

MESH = Mesh(np.array(jax.devices()[:8]), ("data",))


def rmse(w, x, y):
    pred = jnp.tanh(x @ w)
    return jnp.sqrt(jnp.mean((pred - y) ** 2))  # per-device RMSE


def device_grads(w, x, y):
    loss, g = jax.value_and_grad(rmse)(w, x, y)
    return jax.lax.pmean(loss, "data"), jax.lax.pmean(g, "data")


@jax.jit
def train_step(w, x, y):
    loss, g = jax.shard_map(
        device_grads, mesh=MESH, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P())
    )(w, x, y)
    return w - 0.1 * g, loss


def batches(n: int, pad: bool):
    rng = np.random.default_rng(0)
    for i in range(n):
        x = rng.normal(size=(16, 3)).astype(np.float32)
        y = np.tanh(x.sum(-1, keepdims=True)).astype(np.float32)
        if pad and i == n - 1:
            x[14:] = 0.0  # the last device's two rows are padding
            y[14:] = 0.0
        sharding = NamedSharding(MESH, P("data"))
        yield jax.device_put(x, sharding), jax.device_put(y, sharding)


def main(pad: bool) -> None:
    w = jnp.full((3, 1), 0.1)
    for step, (x, y) in enumerate(batches(4, pad)):
        print(f"step {step}", flush=True)
        w, loss = train_step(w, x, y)
        print(f"  loss {float(loss):.4f}", flush=True)
    print("done")


if __name__ == "__main__":
    main(pad="--no-pad" not in sys.argv[1:])
