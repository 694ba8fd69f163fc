"""All-reduce through torch.distributed, "bcl" against "gloo" in the same job, interleaved
round by round (this VM changes speed every 10-60 s). One rank of
`torchrun --nproc-per-node N scripts/torch-bench.py [ROUNDS]` (scripts/torch-bench.sh runs
2 and 4 ranks). Rank 0 prints, per size: the median time of a call (a barrier, then ITERS
back-to-back calls, the slowest rank's mean) and the bus bandwidth 2(n-1)/n * bytes / time,
for both backends, and their ratio."""
import statistics
import sys
import time

import torch
import torch.distributed as dist

import bcl.torch  # noqa: F401

dist.init_process_group("bcl")
rank, n = dist.get_rank(), dist.get_world_size()
groups = {"bcl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
sizes = [8, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
got = {(b, s): [] for b in groups for s in sizes}
for _ in range(rounds):
    for size in sizes:
        iters = 200 if size <= 64 << 10 else max(3, (64 << 20) // size)
        x = torch.ones(size // 4, dtype=torch.float32)
        for name, g in groups.items():
            dist.all_reduce(x, group=g)  # warm
            dist.barrier(group=g)
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x, group=g)
            dt = torch.tensor([(time.perf_counter() - t0) / iters])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=groups["gloo"])
            got[(name, size)].append(dt.item())
if rank == 0:
    print(f"# all_reduce float32, {n} ranks, {rounds} interleaved rounds, median per size")
    print("| bytes | bcl us | gloo us | bcl busbw GB/s | gloo busbw GB/s | bcl/gloo speed |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        b = statistics.median(got[("bcl", size)])
        g = statistics.median(got[("gloo", size)])
        bw = lambda t: 2 * (n - 1) / n * size / t / 1e9
        print(f"| {size} | {b * 1e6:.1f} | {g * 1e6:.1f} | {bw(b):.2f} | {bw(g):.2f} | {g / b:.2f}x |")
dist.destroy_process_group()
