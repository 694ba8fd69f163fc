"""How long `dist.new_group` takes on a "bcl" world: made by the members from the world's
communicator (bclCommCreateGroup, the default) against a fresh communicator through torch's
store (what a backend without it does). One rank of
`torchrun --nproc-per-node 4 scripts/torch-group-bench.py [REPEATS=10]`; rank 0 prints the
median over REPEATS of the slowest rank's time per group of 2 and of 4, interleaved."""
import statistics
import sys
import time

import torch
import torch.distributed as dist

import bcl.torch

dist.init_process_group("bcl")
rank, n = dist.get_rank(), dist.get_world_size()
repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 10
world_of = bcl.torch._world
times = {}
for _ in range(repeats):
    for how in ("group", "store"):
        bcl.torch._world = world_of if how == "group" else (lambda: None)
        for members in ([0, 1], list(range(n))):
            dist.barrier()
            t0 = time.perf_counter()
            g = dist.new_group(members, backend="bcl")
            if rank in members:
                dist.all_reduce(torch.ones(1), group=g)  # the group works before it counts
            took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            times.setdefault((how, len(members)), []).append(took.item())
bcl.torch._world = world_of
if rank == 0:
    print(f"# new_group on a 'bcl' world of {n}, median of {repeats}, slowest rank, ms")
    print("| members | from the world's communicator | through the store |")
    print("|---|---|---|")
    for k in (2, n):
        g, s = (statistics.median(times[(h, k)]) * 1e3 for h in ("group", "store"))
        print(f"| {k} | {g:.1f} | {s:.1f} |")
dist.destroy_process_group()
