"""Two workers started with torch.multiprocessing.spawn; worker rank 1 gets a batch at its 4th
step whose targets the model already predicts exactly, and the RMSE's sqrt(0) makes its
gradient NaN.

    gradsan run examples/torch_spawn_workers.py           # stops: rank 1's report (exit 3)
    gradsan run examples/torch_spawn_workers.py --clean   # every worker checked, exit 0
    gradsan run examples/torch_spawn_workers.py --join-false        # spawn(join=False), joined later
    gradsan run examples/torch_spawn_workers.py --start-processes   # mp.start_processes
"""

import sys

import torch
import torch.multiprocessing as mp


def worker(rank: int, clean: bool) -> None:
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        if rank == 1 and step == 3 and not clean:
            y = model(x).detach()  # the bad batch: zero error
        opt.zero_grad()
        loss = torch.sqrt((model(x) - y).pow(2).mean())  # the rmse
        loss.backward()  # the backward
        opt.step()


if __name__ == "__main__":
    clean = "--clean" in sys.argv
    if "--join-false" in sys.argv:
        context = mp.spawn(worker, args=(clean,), nprocs=2, join=False)
        print("started")
        while not context.join():  # the script joins the workers itself
            pass
    elif "--start-processes" in sys.argv:
        mp.start_processes(worker, args=(clean,), nprocs=2, start_method="spawn")
    else:
        mp.spawn(worker, args=(clean,), nprocs=2)
    print("done")
