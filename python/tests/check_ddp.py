"""One rank of `torchrun --nproc-per-node N python/tests/check_ddp.py`: DistributedDataParallel
over the "bcl" backend trains a small model on this rank's shard of each global batch; every
rank also trains a copy of the model alone on the whole batch. After the steps, the DDP
model's parameters must equal the single-process ones (PyTorch's own DDP test idea), with
DDP's default allreduce and with a communication hook built on `Work.get_future` (the
default hooks' `allreduce_hook`), and under bf16 autocast within bf16's tolerance. Prints
"rank R OK"."""
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import bcl.torch  # noqa: F401

dist.init_process_group("bcl")
rank, n = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
PER_RANK, STEPS = 8, 12


def model(dtype):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 4)).to(dtype)


failures = []
# (hook, autocast): float64 and exact but for the order of the gradient sums; then fp32
# weights under bf16 autocast, where the shard and the whole batch round differently
# (bf16 keeps 8 bits), so the tolerance is bf16's.
for hook, autocast in ((None, False), (default_hooks.allreduce_hook, False), (None, True)):
    dtype, tol = (torch.float32, 1e-2) if autocast else (torch.float64, 1e-9)
    alone, shared = model(dtype), model(dtype)
    ddp = DDP(shared, bucket_cap_mb=0.01)  # several buckets: overlap with the backward pass
    if hook is not None:
        ddp.register_comm_hook(dist.group.WORLD, hook)
    opt_alone = torch.optim.SGD(alone.parameters(), lr=0.1)
    opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(42)
    for step in range(STEPS):
        x = torch.randn(n * PER_RANK, 32, generator=g, dtype=dtype)
        y = torch.randn(n * PER_RANK, 4, generator=g, dtype=dtype)
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss_alone = torch.nn.functional.mse_loss(alone(x).float(), y.float())
            loss_ddp = torch.nn.functional.mse_loss(ddp(x[mine]).float(), y[mine].float())
        opt_alone.zero_grad()
        loss_alone.backward()
        opt_alone.step()
        opt_ddp.zero_grad()
        loss_ddp.backward()
        opt_ddp.step()
    for (name, a), b in zip(alone.named_parameters(), ddp.module.parameters()):
        err = ((a - b).abs().max() / a.abs().max()).item()
        if not err < tol:
            failures.append(f"hook {hook and hook.__name__}, autocast {autocast}: {name} differs "
                            f"by {err:.3g} (relative)")

if failures:
    for f in failures:
        print(f"rank {rank}: {f}", file=sys.stderr)
    sys.exit(1)
dist.destroy_process_group()
print(f"rank {rank} OK")
