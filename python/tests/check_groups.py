"""One rank of `torchrun --nproc-per-node 4 python/tests/check_groups.py`: subgroups of the
"bcl" backend: `new_group` of 2 of the 4 ranks (made by its members alone from the world's
communicator), and a 2 x 2 grid (rows and columns, as tensor- and data-parallel groups) with
collectives in both families in flight at once, checked. Prints "rank R OK"."""
import sys

import torch
import torch.distributed as dist

import bcl.torch  # noqa: F401

dist.init_process_group("bcl")
rank, n = dist.get_rank(), dist.get_world_size()
assert n == 4, "run with 4 ranks"
failures = []

pair = dist.new_group([1, 2], backend="bcl")
# Made by the members from the world's communicator (bclCommCreateGroup), not the store.
if rank in (1, 2):
    origin = pair._get_backend(torch.device("cpu")).origin
    if origin != "group":
        failures.append(f"the pair's communicator came from the {origin}")
if rank in (1, 2):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=pair)
    if t.item() != 3.0:
        failures.append(f"pair allreduce {t.item()}")

rows = [dist.new_group([0, 1], backend="bcl"), dist.new_group([2, 3], backend="bcl")]
cols = [dist.new_group([0, 2], backend="bcl"), dist.new_group([1, 3], backend="bcl")]
row, col = rows[rank // 2], cols[rank % 2]
for step in range(20):
    a = torch.full((1 << 16,), float(rank + step))
    b = torch.full((1 << 16,), float(10 * rank + step))
    wa = dist.all_reduce(a, group=row, async_op=True)
    wb = dist.all_reduce(b, group=col, async_op=True)
    wb.wait()
    wa.wait()
    r0 = (rank // 2) * 2
    want_a = float(r0 + step + r0 + 1 + step)
    c0 = rank % 2
    want_b = float(10 * c0 + step + 10 * (c0 + 2) + step)
    if not (torch.all(a == want_a) and torch.all(b == want_b)):
        failures.append(f"step {step}: row {a[0].item()} (want {want_a}), col {b[0].item()} (want {want_b})")
        break
g = [torch.zeros(1) for _ in range(2)]
dist.all_gather(g, torch.tensor([float(rank)]), group=col)
if [x.item() for x in g] != [float(rank % 2), float(rank % 2 + 2)]:
    failures.append(f"column allgather {[x.item() for x in g]}")

if failures:
    for f in failures:
        print(f"rank {rank}: {f}", file=sys.stderr)
    sys.exit(1)
dist.destroy_process_group()
print(f"rank {rank} OK")
