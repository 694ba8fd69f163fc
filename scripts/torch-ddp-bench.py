"""DDP step time, "bcl" against "gloo" in the same job, and how much of the gradient
allreduce the backward pass hides. One rank of
`torchrun --nproc-per-node N scripts/torch-ddp-bench.py [STEPS]`.

Per backend, interleaved step by step: a DDP step (forward, backward with the bucketed
allreduce overlapping it, optimizer); the same step under `no_sync` (compute alone, optimizer included); and one
allreduce of all the gradients as a flat buffer (communication alone). Hidden fraction =
(compute + communication - step) / communication: 1 when the allreduce is entirely hidden,
0 when none of it is. Medians; the slowest rank's time per step."""
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import bcl.torch  # noqa: F401

dist.init_process_group("bcl")
rank, n = dist.get_rank(), dist.get_world_size()
groups = {"bcl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
WIDTH, DEPTH, BATCH = 1024, 12, 32


def net():
    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


models = {name: DDP(net(), process_group=g) for name, g in groups.items()}
opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in models.items()}
grad_bytes = sum(p.numel() * 4 for p in models["bcl"].parameters())
x = torch.randn(BATCH, WIDTH)


def slowest(seconds, g):
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
    return t.item()


times = {(b, k): [] for b in groups for k in ("step", "compute", "comm")}
flat = torch.zeros(grad_bytes // 4)
for step in range(steps + 1):
    for name, m in models.items():
        g = groups[name]
        dist.barrier(group=g)
        t0 = time.perf_counter()
        opts[name].zero_grad()
        m(x).sum().backward()
        opts[name].step()
        t_step = time.perf_counter() - t0
        dist.barrier(group=g)
        t0 = time.perf_counter()
        with m.no_sync():
            opts[name].zero_grad()
            m(x).sum().backward()
        opts[name].step()
        t_compute = time.perf_counter() - t0
        dist.barrier(group=g)
        t0 = time.perf_counter()
        dist.all_reduce(flat, group=g)
        t_comm = time.perf_counter() - t0
        if step > 0:  # the first step warms up
            for k, v in (("step", t_step), ("compute", t_compute), ("comm", t_comm)):
                times[(name, k)].append(slowest(v, g))
if rank == 0:
    print(f"# DDP, {n} ranks, {grad_bytes / 1e6:.0f} MB of fp32 gradients, {steps} steps, medians")
    print("| backend | step ms | compute alone ms | allreduce alone ms | hidden |")
    print("|---|---|---|---|---|")
    for name in groups:
        s, c, a = (statistics.median(times[(name, k)]) for k in ("step", "compute", "comm"))
        print(f"| {name} | {s * 1e3:.0f} | {c * 1e3:.0f} | {a * 1e3:.0f} | {(c + a - s) / a:.0%} |")
dist.destroy_process_group()
