"""Data-parallel training: each rank checks its local gradients before DDP's all-reduce; the
rank that made the NaN reports the op, the line and the parameter, the others say it arrived
from that rank, and no rank hangs (every launch has a timeout)."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gradsan.torch import _distributed
from tests.conftest import line_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_ddp_bad_batch.py"
TIMEOUT = 90  # seconds per launch: a hang fails the test instead of the suite


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(cmd: list[str], cwd: Path, world: int = 2) -> list[subprocess.CompletedProcess]:
    """Run ``cmd`` as ``world`` ranks (RANK/WORLD_SIZE/MASTER_* set, like torchrun does)."""
    port = _port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GRADSAN_DIST_TIMEOUT": "20",
        }
        procs.append(
            subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    out = []
    try:
        for p in procs:
            so, se = p.communicate(timeout=TIMEOUT)
            out.append(subprocess.CompletedProcess(cmd, p.returncode, so, se))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


# ---- in one process: a group of one ------------------------------------------------------------


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_comm_hook_names_the_local_parameter_before_the_all_reduce(group_of_one):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = torch.nn.parallel.DistributedDataParallel(net)
    st = _distributed.attach(model)
    assert st is not None and _distributed.attach(model) is st  # once
    model(torch.rand(3, 4)).sum().backward()
    assert st.backwards == 1 and st.local_bad() == []
    net.zero_grad()
    x = torch.rand(3, 4)
    x[0, 0] = float("nan")
    model(x).sum().backward()
    assert st.backwards == 2
    bad = st.local_bad()
    assert bad and all(any(b is p for p in net.parameters()) for b in bad)
    assert bad[0] is net[2].weight  # the last layer comes first; its bias gradient (1) is finite
    v = _distributed.exchange([st], lambda p: "net.2.bias")
    assert v is not None and v.rank == 0 and v.world == 1 and v.mine == ["net.2.bias"]
    assert v.local and "rank 0 of 1" in v.notes()[0] and "`net.2.bias`" in v.notes()[0]


def test_a_module_with_its_own_comm_hook_is_left_alone(group_of_one):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    model.register_comm_hook(None, allreduce_hook)
    assert _distributed.attach(model) is None


def test_verdict_words():
    v = _distributed.Verdict(0, 2, [], {1: ["model.module.0.weight"]})
    (note,) = v.notes()
    assert "rank 0 of 2" in note and "arrived through it from rank 1" in note
    assert "`model.module.0.weight`" in note and v.headline() == "DDP all-reduce (from rank 1)"
    v = _distributed.Verdict(0, 2, [], {1: None})
    assert any("rank(s) 1 did not report" in n for n in v.notes())
    v = _distributed.Verdict(1, 2, [], {0: []})
    assert "the reduction itself" in v.notes()[0]


# ---- two ranks ----------------------------------------------------------------------------------


GUARD_WORKER = """
import json, os, sys
import torch, torch.distributed as dist
import gradsan, gradsan.torch as gst
from torch.nn.parallel import DistributedDataParallel

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
model = DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05)

def step(x):
    opt.zero_grad()
    h = torch.log(x)  # L:log
    loss = model(h).pow(2).mean()
    loss.backward()
    opt.step()
    return loss

guarded = gst.guard(step, module=model)
gen = torch.Generator().manual_seed(rank)
out = {"rank": rank}
try:
    for i in range(5):
        x = torch.rand(8, 4, generator=gen) + 0.1
        if rank == 1 and i == 2:
            x[0, 0] = -1.0
        guarded(x)
        out["steps"] = i + 1
except gradsan.NonFiniteError as e:
    f = e.report.findings[0]
    out.update(step=i, text=str(e), primitive=f.primitive, line=f.where.line if f.where else None,
               notes=e.report.notes, outputs=[o.path for o in f.outputs])
json.dump(out, open(f"out{rank}.json", "w"))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_guard_names_rank_1_and_rank_0_does_not_hang(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(GUARD_WORKER))
    runs = _launch([sys.executable, str(script)], tmp_path)
    for r in runs:
        assert r.returncode == 0, r.stderr
    r0, r1 = (json.loads((tmp_path / f"out{k}.json").read_text()) for k in (0, 1))
    assert r0["step"] == 2 and r1["step"] == 2
    log_line = line_of(script, "L:log")
    # rank 1 made the NaN: its replay (without the all-reduce) finds the log and its line
    assert r1["primitive"] == "log" and r1["line"] == log_line
    assert any("rank 1 of 2" in n and "before DDP's all-reduce" in n for n in r1["notes"])
    # rank 0 only received it: the all-reduce from rank 1, with rank 1's parameter
    assert r0["primitive"] == "DDP all-reduce (from rank 1)"
    (note,) = r0["notes"]
    assert "from rank 1" in note and "`model.module.2.bias`" in note
    assert "model.module.0.weight" in r0["outputs"]


@pytest.mark.slow
def test_gradsan_run_ddp_example_names_rank_1_and_rank_0_does_not_hang(tmp_path):
    runs = _launch([sys.executable, "-m", "gradsan", "run", str(EXAMPLE)], tmp_path)
    r0, r1 = runs
    assert r0.returncode == 3 and r1.returncode == 3, (r0.stderr, r1.stderr)
    sqrt_line = line_of(EXAMPLE, "preprocessing: sqrt of the raw features")
    err1 = r1.stderr.replace(os.path.relpath(EXAMPLE, tmp_path), str(EXAMPLE))
    assert "the 3rd backward call, on rank 1, at" in err1
    assert f"sqrt at {EXAMPLE}:{sqrt_line} (batch)" in err1
    assert "rank 1 of 2, re-run alone" in err1 and "`net.0.weight`" in err1
    err0 = r0.stderr
    assert "the 3rd backward call, on rank 0, at" in err0
    assert "DDP all-reduce (from rank 1)" in err0 and "re-running the script" not in err0
    assert "arrived through it from rank 1" in err0 and "`net.2.bias`" in err0
    assert "? at None" not in err0 + err1 and "did not reproduce" not in err0 + err1
    assert r0.stdout.splitlines()[-1] == "rank 0 step 1 loss 0.0535"  # stopped before the update


FSDP_SCRIPT = """
import os
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
fully_shard(net[0])
fully_shard(net)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(rank)
for step in range(4):
    x = torch.rand(4, 8, generator=gen)
    if rank == 1 and step == 2:
        x[0, 0] = -1.0
    x = torch.sqrt(x)  # L:sqrt
    opt.zero_grad()
    loss = net(x).pow(2).mean()
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_gradsan_run_fsdp2_names_rank_1_and_rank_0_does_not_hang(tmp_path):
    script = tmp_path / "fsdp.py"
    script.write_text(textwrap.dedent(FSDP_SCRIPT))
    r0, r1 = _launch([sys.executable, "-m", "gradsan", "run", str(script)], tmp_path)
    assert r0.returncode == 3 and r1.returncode == 3, (r0.stderr, r1.stderr)
    assert "the 3rd backward call, on rank 1, at" in r1.stderr
    assert f"sqrt at {script.name}:{line_of(script, 'L:sqrt')} (<module>)" in r1.stderr
    assert "the 3rd backward call, on rank 0, at" in r0.stderr
    assert "FSDP reduce-scatter (from rank 1)" in r0.stderr
    assert "finite before FSDP's reduce-scatter" in r0.stderr and "`net.0.weight`" in r0.stderr
    assert "? at None" not in r0.stderr + r1.stderr
    assert r0.stdout.splitlines()[-1] == "rank 0 step 1"


GUARD_FSDP_WORKER = """
import json, os
import torch, torch.distributed as dist
import gradsan, gradsan.torch as gst
from torch.distributed.fsdp import fully_shard

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
fully_shard(net[0])
fully_shard(net)
opt = torch.optim.SGD(net.parameters(), lr=0.01)

def step(x):
    opt.zero_grad()
    loss = net(torch.log(x)).pow(2).mean()  # L:log
    loss.backward()
    opt.step()

guarded = gst.guard(step, module=net)
gen = torch.Generator().manual_seed(rank)
out = {"rank": rank}
try:
    for i in range(4):
        x = torch.rand(4, 8, generator=gen) + 0.1
        if rank == 1 and i == 2:
            x[0, 0] = -1.0
        guarded(x)
except gradsan.NonFiniteError as e:
    f = e.report.findings[0]
    out.update(step=i, primitive=f.primitive, notes=e.report.notes,
               line=f.where.line if f.where else None, outputs=[o.path for o in f.outputs])
json.dump(out, open(f"out{rank}.json", "w"))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_guard_fsdp2_names_rank_1_the_op_and_the_line_and_does_not_hang(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(GUARD_FSDP_WORKER))
    for r in _launch([sys.executable, str(script)], tmp_path):
        assert r.returncode == 0, r.stderr
    r0, r1 = (json.loads((tmp_path / f"out{k}.json").read_text()) for k in (0, 1))
    assert r0["step"] == 2 and r1["step"] == 2
    assert r0["primitive"] == "FSDP reduce-scatter (from rank 1)"
    assert "finite before FSDP's reduce-scatter" in r0["notes"][0]
    # rank 1 replayed the step together with rank 0 (FSDP2's collectives need both)
    assert r1["primitive"] == "log" and r1["line"] == line_of(script, "L:log")
    assert "rank 1 of 2" in r1["notes"][0] and "`net.0.weight`" in r1["notes"][0]
    assert any("every rank replayed this step together" in n for n in r1["notes"])
    assert r1["outputs"] == ["loss", "net.0.weight", "net.0.bias"]  # its local shards
