"""guard's per-step cost on a clean step: a plain step against the guarded step of the same
model, in one process.

    python benchmarks/bench_torch_step.py [--quick] [--threads N] [--blocks B] [--steps S]

Two measures:

1. **Paired alternating blocks.** B blocks of S steps each of the plain step and of the
   guarded step, the order alternating from one pair of blocks to the next. Per pair the
   ratio guarded/plain of the block's wall time and of its CPU time (time.process_time: every
   thread of the process). Printed: the median ratio, its interquartile range and a bootstrap
   95% interval of the median (pairs resampled).
2. **guard's own work, measured directly.** The guarded step is run with its inner step timed
   from inside (and guard's optimizer pre-hook timed on its own): guard's work is the call's
   time minus the inner step's, plus the pre-hook's check (which runs inside the step). Medians
   of wall and thread CPU time (time.thread_time) per step, in microseconds. The step size at
   which that cost is 5% of a step is printed: 1.05x holds for steps longer than that. The
   pre-hook's check is printed on its own too: every exact check pays it (it reads each
   gradient once, cold in the cache after the backward); the rest is guard's bookkeeping.

``--ab OTHER_SRC`` compares two trees of gradsan (before/after a change): measure 2 only, in
alternating processes (R rounds of one process with ``PYTHONPATH=OTHER_SRC``, then one with
this process's path), pooled medians and IQR per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

import gradsan.torch as gst
from gradsan.torch import _guard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch as _models  # noqa: E402  (its model builders: one definition)


def mlp(width: int, depth: int) -> torch.nn.Module:
    return _models.mlp(width, depth, torch.nn.Tanh)


def transformer(d_model: int = 128) -> torch.nn.Module:
    return _models.transformer(d_model)


make_step = _models.make_step  # the same SGD(lr=0) step as bench_torch's


def _q(xs: list[float]) -> tuple[float, float, float]:
    q1, med, q3 = statistics.quantiles(xs, n=4)
    return q1, statistics.median(xs), q3


def bootstrap_median(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    rnd = random.Random(seed)
    meds = sorted(statistics.median(rnd.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def blocks(plain: Callable, guarded: Callable, n_blocks: int, steps: int) -> dict[str, list[float]]:
    """Per pair of blocks: the ratio guarded/plain of wall and of CPU time, and the plain
    block's per-step wall time."""
    for _ in range(3):
        plain()
        guarded()
    out: dict[str, list[float]] = {"wall": [], "cpu": [], "plain_ms": []}
    for i in range(n_blocks):
        order = [("plain", plain), ("guard", guarded)]
        if i % 2:
            order.reverse()
        got: dict[str, tuple[float, float]] = {}
        for name, f in order:
            w, c = time.perf_counter(), time.process_time()
            for _ in range(steps):
                f()
            got[name] = (time.perf_counter() - w, time.process_time() - c)
        out["wall"].append(got["guard"][0] / got["plain"][0])
        out["cpu"].append(got["guard"][1] / max(got["plain"][1], 1e-9))
        out["plain_ms"].append(got["plain"][0] / steps * 1e3)
    return out


def own_work(step: Callable, n: int) -> dict[str, list[float]]:
    """guard's own per-step work, timed directly (see the module docstring)."""
    inner = {"w": 0.0, "c": 0.0}
    hook = {"w": 0.0, "c": 0.0}

    def timed_step() -> torch.Tensor:
        w, c = time.perf_counter(), time.thread_time()
        try:
            return step()
        finally:
            inner["w"] += time.perf_counter() - w
            inner["c"] += time.thread_time() - c

    orig_hook = _guard._StepCheck._hook

    def timed_hook(self: object, *a: object) -> None:
        w, c = time.perf_counter(), time.thread_time()
        try:
            orig_hook(self, *a)  # type: ignore[arg-type]
        finally:
            hook["w"] += time.perf_counter() - w
            hook["c"] += time.thread_time() - c

    timed_step.__wrapped__ = step  # type: ignore[attr-defined]  # guard finds the model
    guarded = gst.guard(timed_step)
    out: dict[str, list[float]] = {"wall_us": [], "cpu_us": [], "check_us": []}
    _guard._StepCheck._hook = timed_hook  # type: ignore[method-assign]
    try:
        for i in range(n + 5):
            for d in (inner, hook):
                d["w"] = d["c"] = 0.0
            w, c = time.perf_counter(), time.thread_time()
            guarded()
            w, c = time.perf_counter() - w, time.thread_time() - c
            if i >= 5:
                out["wall_us"].append((w - inner["w"] + hook["w"]) * 1e6)
                out["cpu_us"].append((c - inner["c"] + hook["c"]) * 1e6)
                out["check_us"].append(hook["c"] * 1e6)
    finally:
        _guard._StepCheck._hook = orig_hook  # type: ignore[method-assign]
    return out


def bench(name: str, model: torch.nn.Module, x: torch.Tensor, ns: argparse.Namespace) -> None:
    step = make_step(model, x)
    guarded = gst.guard(step)
    b = blocks(step, guarded, ns.blocks, ns.steps)
    own = own_work(step, ns.own)
    plain_ms = statistics.median(b["plain_ms"])
    print(f"{name}: plain step {plain_ms:.3f} ms (median over blocks)")
    for k, label in (("wall", "wall"), ("cpu", "CPU (process_time)")):
        q1, med, q3 = _q(b[k])
        lo, hi = bootstrap_median(b[k])
        print(
            f"  guarded/plain, {label:18s} {med:.4f}x  IQR {q1:.4f}-{q3:.4f}  "
            f"bootstrap 95% of the median {lo:.4f}-{hi:.4f}  ({ns.blocks} blocks x {ns.steps})"
        )
    for k, label in (("wall_us", "wall"), ("cpu_us", "CPU (thread_time)")):
        q1, med, q3 = _q(own[k])
        print(
            f"  guard's own work, {label:17s} {med:7.1f} us/step  IQR {q1:.1f}-{q3:.1f}  "
            f"= {1 + med / (plain_ms * 1e3):.4f}x of this step; 1.05x holds for steps "
            f">= {med / 0.05 / 1e3:.2f} ms"
        )
    q1, med, q3 = _q(own["check_us"])
    print(
        f"    of which the gradient check in the optimizer's pre-hook (CPU) {med:7.1f} us/step  "
        f"IQR {q1:.1f}-{q3:.1f}: an exact check reads every gradient once, after the "
        "backward; its own 5% needs steps >= "
        f"{med / 0.05 / 1e3:.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--own", type=int, default=None, help="steps for guard's own work")
    ap.add_argument("--only", default="", help="comma list: tiny,mlp4,mlp200,transformer")
    ap.add_argument("--ab", default="", help="another gradsan src tree: compare own work")
    ap.add_argument("--rounds", type=int, default=5, help="--ab: processes per tree")
    ap.add_argument("--own-json", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    ns.blocks = ns.blocks or (10 if ns.quick else 30)
    ns.own = ns.own or (100 if ns.quick else 400)
    torch.set_num_threads(ns.threads)
    torch.manual_seed(0)
    cases = {
        "tiny": ("tiny MLP (Linear 8->8, tanh, 8->1), batch 4", lambda: (mlp(8, 1), (4, 8))),
        "mlp4": ("MLP 4x256, batch 64", lambda: (mlp(256, 4), (64, 256))),
        "mlp200": ("MLP 200x64, batch 32", lambda: (mlp(64, 200), (32, 64))),
        "transformer": (
            "transformer 2 layers d128, batch 8x32",
            lambda: (transformer(), (8, 32, 128)),
        ),
    }
    only = [c for c in ns.only.split(",") if c] or list(cases)
    if ns.own_json:  # one process of --ab
        model, shape = cases[only[0]][1]()
        own = own_work(make_step(model, torch.randn(*shape)), ns.own)
        print(json.dumps(own["cpu_us"]))
        return
    print(f"torch {torch.__version__}, {ns.threads} thread(s); bar: guarded <= 1.05x plain")
    for key in only:
        label, make = cases[key]
        if ns.ab:
            ab(key, label, ns)
            continue
        model, shape = make()
        bench(label, model, torch.randn(*shape), ns)


def ab(key: str, label: str, ns: argparse.Namespace) -> None:
    """guard's own work (CPU) of two gradsan trees, in alternating processes."""
    here = os.environ.get("PYTHONPATH", "")
    got: dict[str, list[float]] = {"other": [], "this": []}
    for _ in range(ns.rounds):
        for tree, path in (("other", ns.ab), ("this", here)):
            env = dict(os.environ, PYTHONPATH=path)
            cmd = [sys.executable, __file__, "--own-json", "--only", key, "--own", str(ns.own)]
            cmd += ["--threads", str(ns.threads)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got[tree] += json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{label}: guard's own work, CPU (thread_time), {ns.rounds} alternating processes each")
    for tree, path in (("other", ns.ab), ("this", here)):
        q1, med, q3 = _q(got[tree])
        print(f"  {tree:5s} ({path}): {med:7.1f} us/step  IQR {q1:.1f}-{q3:.1f}")


if __name__ == "__main__":
    main()
