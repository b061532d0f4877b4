"""Per-step overhead of gradsan.torch.guard against a plain step and
torch.autograd.detect_anomaly(check_nan=True), and time to the first report on a deep MLP.

    python benchmarks/bench_torch.py [--quick]

Ratios are medians (with their interquartile range) of paired runs in one process, the order
alternating from one repetition to the next (torch.set_num_threads(2); --threads N to change).
The time to the first report is the median over repetitions; the first (cold) call is shown too.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import gradsan
import gradsan.torch as gst


def mlp(width: int = 512, depth: int = 4, act: type = torch.nn.GELU) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), act()]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers)


def transformer(d_model: int = 256) -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(
        d_model, nhead=4, dim_feedforward=4 * d_model, batch_first=True, dropout=0.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return enc


def make_step(model: torch.nn.Module, x: torch.Tensor):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    return step


def paired(fns: dict[str, object], reps: int, warmup: int = 3) -> dict[str, float]:
    for f in fns.values():
        for _ in range(warmup):
            f()  # type: ignore[operator]
    times: dict[str, list[float]] = {k: [] for k in fns}
    items = list(fns.items())
    for i in range(reps):
        for k, f in items if i % 2 == 0 else items[::-1]:  # alternate the order
            t = time.perf_counter()
            f()  # type: ignore[operator]
            times[k].append(time.perf_counter() - t)
    base = times["plain"]
    out: dict[str, float] = {"plain_ms": statistics.median(base) * 1e3}
    for k, ts in times.items():
        if k != "plain":
            ratios = [a / b for a, b in zip(ts, base)]
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            out[k] = statistics.median(ratios)
            out[k + "_iqr"] = (q1, q3)  # type: ignore[assignment]
            # the paired difference: what the wrapper adds to a step, less sensitive to the
            # machine's load than the ratio of two noisy times
            diffs = [(a - b) * 1e3 for a, b in zip(ts, base)]
            d1, _, d3 = statistics.quantiles(diffs, n=4)
            out[k + "_diff_ms"] = statistics.median(diffs)
            out[k + "_diff_iqr"] = (d1, d3)  # type: ignore[assignment]
    return out


def _iqr(res: dict, k: str) -> str:
    q1, q3 = res[k + "_iqr"]
    return f"{res[k]:.3f}x (IQR {q1:.3f}-{q3:.3f})"


def anomaly(step):
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                return step()

    return run


def overhead(name: str, model: torch.nn.Module, x: torch.Tensor, reps: int) -> None:
    step = make_step(model, x)
    res = paired({"plain": step, "guard": gst.guard(step), "anomaly": anomaly(step)}, reps)
    d1, d3 = res["guard_diff_iqr"]
    print(
        f"{name:28s} plain {res['plain_ms']:7.2f} ms   guard {_iqr(res, 'guard')}   "
        f"detect_anomaly {_iqr(res, 'anomaly')}\n{'':28s} guard adds {res['guard_diff_ms']:.3f} ms"
        f" a step (paired difference, IQR {d1:.3f}-{d3:.3f}): "
        f"{1 + res['guard_diff_ms'] / res['plain_ms']:.3f}x of the median plain step"
    )


class Deep(torch.nn.Module):
    def __init__(self, depth: int = 200, width: int = 64, bad: int = 150):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(depth)])
        self.bad = bad

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            if i == self.bad:
                x = torch.sqrt(x * 0.0) + x
        return x.pow(2).mean()


def time_to_report(reps: int) -> dict[str, float]:
    """Paired alternating rounds: each round times guard's report and detect_anomaly's error
    on the same failing step, the order alternating; the ratio is taken per round."""
    torch.manual_seed(0)
    model = Deep()
    x = torch.randn(32, 64)

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(x)
        loss.backward()
        return loss

    guarded = gst.guard(step)
    msgs = {"guard": "", "anomaly": ""}

    def run_guard() -> None:
        try:
            guarded()
        except gradsan.NonFiniteError as e:
            msgs["guard"] = str(e).splitlines()[0]

    def run_anomaly() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with torch.autograd.detect_anomaly(check_nan=True):
                    step()
            except RuntimeError as e:
                msgs["anomaly"] = str(e).splitlines()[0]

    first: dict[str, float] = {}
    for name, f in (("guard", run_guard), ("anomaly", run_anomaly)):  # cold calls
        t = time.perf_counter()
        f()
        first[name] = time.perf_counter() - t
    times: dict[str, list[float]] = {"guard": [], "anomaly": []}
    cpu: dict[str, list[float]] = {"guard": [], "anomaly": []}  # this process's CPU time
    items = [("guard", run_guard), ("anomaly", run_anomaly)]
    for i in range(reps):
        for name, f in items if i % 2 == 0 else items[::-1]:
            t, c = time.perf_counter(), time.process_time()
            f()
            cpu[name].append(time.process_time() - c)
            times[name].append(time.perf_counter() - t)
    ratios = [g / a for g, a in zip(times["guard"], times["anomaly"])]
    cpu_ratios = [g / a for g, a in zip(cpu["guard"], cpu["anomaly"]) if a > 0]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    g, a, r = statistics.median(times["guard"]), statistics.median(times["anomaly"]), 0.0
    r = statistics.median(ratios)
    print(
        f"200-layer MLP, sqrt(0) at layer 150, {reps} paired rounds: guard -> report "
        f"{g * 1e3:.0f} ms, detect_anomaly -> error {a * 1e3:.0f} ms; ratio {r:.2f}x "
        f"(IQR {q[0]:.2f}-{q[2]:.2f}, range {min(ratios):.2f}-{max(ratios):.2f}; first call "
        f"{first['guard'] * 1e3:.0f} ms vs {first['anomaly'] * 1e3:.0f} ms)"
    )
    if len(cpu_ratios) >= 2:  # the same rounds by CPU time: less sensitive to a loaded machine
        cq = statistics.quantiles(cpu_ratios, n=4)
        print(
            f"  by CPU time: ratio {statistics.median(cpu_ratios):.2f}x (IQR {cq[0]:.2f}-"
            f"{cq[2]:.2f}); guard {statistics.median(cpu['guard']) * 1e3:.0f} ms, "
            f"detect_anomaly {statistics.median(cpu['anomaly']) * 1e3:.0f} ms"
        )
    print(f"  gradsan:        {msgs['guard'][:160]}")
    print(f"  detect_anomaly: {msgs['anomaly'][:160]}")
    print("bar: guard's time to the report <= 2x detect_anomaly's")
    return {"ratio": r, "q1": q[0], "q3": q[2]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report-only", action="store_true", help="only the time to the report")
    ap.add_argument("--overhead-only", action="store_true", help="only the per-step overhead")
    ns = ap.parse_args()
    torch.set_num_threads(ns.threads)
    reps = 10 if ns.quick else 40
    if ns.report_only:
        time_to_report(5 if ns.quick else 15)
        return
    torch.manual_seed(0)
    overhead("MLP 4x512, batch 256", mlp(), torch.randn(256, 512), reps)
    overhead("Transformer 2x d256, 8x64", transformer(), torch.randn(8, 64, 256), reps)
    print("bar: guard <= 1.05x a plain step")
    if not ns.overhead_only:
        time_to_report(5 if ns.quick else 15)


if __name__ == "__main__":
    main()
