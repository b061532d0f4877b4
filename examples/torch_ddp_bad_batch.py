"""Data-parallel training (DDP, gloo, CPU) where rank 1 gets a bad batch at step 2.

The bad batch holds a negative number that the preprocessing takes the square root of; DDP's
all-reduce then carries rank 1's NaN gradients to rank 0. gradsan checks each rank's local
gradients before the all-reduce: rank 1 reports the sqrt and its line, rank 0 says the NaN
arrived from rank 1, and neither hangs. Two processes, each under gradsan:

    torchrun --nproc-per-node 2 -m gradsan run examples/torch_ddp_bad_batch.py

or without torchrun (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set for each process):

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 gradsan run examples/torch_ddp_bad_batch.py &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 gradsan run examples/torch_ddp_bad_batch.py
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def batch(rank: int, step: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.rand(8, 4, generator=gen)
    if rank == 1 and step == 2:
        x[3, 1] = -0.5  # the bad sample
    return torch.sqrt(x)  # preprocessing: sqrt of the raw features


def main(steps: int = 5) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = batch(rank, step, gen)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
