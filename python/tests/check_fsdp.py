"""One rank of `torchrun --nproc-per-node 4 python/tests/check_fsdp.py`: FSDP2 (`fully_shard`)
of a small transformer on the "bcl" backend and, in the same job, the same model on a Gloo
device mesh; the loss curves over the steps must match within tolerance (they see the same
data; only the reduction order may differ). Prints "rank R OK"."""
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import bcl.torch  # noqa: F401

dist.init_process_group("bcl")
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
STEPS = 8


def transformer():
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
        torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
        torch.nn.Linear(32, 8))


def train(group):
    mesh = DeviceMesh.from_group(group, "cpu")
    m = transformer()
    for layer in m:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(4, 6, 32, generator=g)
        y = torch.randn(4, 6, 8, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t, group=gloo)
        losses.append(t.item() / n)
    return losses


bcl_losses = train(dist.group.WORLD)
gloo_losses = train(gloo)
bad = [(i, a, b) for i, (a, b) in enumerate(zip(bcl_losses, gloo_losses))
       if abs(a - b) > 1e-4 * max(1.0, abs(b))]
if bad or not bcl_losses[-1] < bcl_losses[0]:
    print(f"rank {rank}: loss curves differ at {bad}, bcl {bcl_losses}, gloo {gloo_losses}",
          file=sys.stderr)
    sys.exit(1)
dist.destroy_process_group()
print(f"rank {rank} OK")
