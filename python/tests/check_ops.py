"""One rank of `torchrun --nproc-per-node N python/tests/check_ops.py`: every operation of
the "bcl" backend against Gloo in the same job (torch_ucc's method), on the same inputs:
sizes 0, 1, 7, 1000 and 2^20 elements, uneven all-to-all splits and uneven all_gather / reduce_scatter, dtypes float32, float64, float16, bfloat16, int8,
uint8, int32, int64 and bool, every reduce op (PREMUL_SUM against Gloo's sum of scaled
inputs), the coalesced forms, contiguous and non-contiguous tensors, sync and async. Exact comparison, except float sums whose rounding depends on the reduction
order (bounded by (n-1) ulps of the sum of magnitudes). Prints "rank R OK"."""
import os
import time

import torch
import torch.distributed as dist

import bcl.torch  # noqa: F401  registers "bcl"
from against_gloo import data, finish, mismatch

dist.init_process_group("bcl")
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
# The operations below go through the C++ backend, not a Python stand-in.
backend = dist.group.WORLD._get_backend(torch.device("cpu"))
assert type(backend).__name__ == "ProcessGroupBCL", f"the bcl group's backend is {type(backend)}"
R = dist.ReduceOp
failures = []

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
SIZES = [0, 1, 7, 1000, 1 << 20]


def same(what, got, want, tol=None):
    if (why := mismatch(what, got, want, tol)) is not None:
        failures.append(why)


def tol_of(dtype, op):
    if not dtype.is_floating_point:
        return None
    if op in (R.SUM, R.AVG) or op is None:
        return {torch.float16: 2e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-6)
    return None


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.MIN, R.MAX]
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    if dtype.is_floating_point:
        ops.append(R.AVG)
    return ops


def both(fn):
    """Run `fn(group, async_op)` for bcl (async, then waited) and gloo (sync)."""
    w = fn(None, True)
    if w is not None:
        w.wait()
    fn(gloo, False)


for dtype in DTYPES:
    for numel in SIZES:
        if numel == 1 << 20 and dtype not in (torch.float32, torch.bfloat16, torch.int32):
            continue
        tag = f"{dtype} x {numel}"
        for op in ops_for(dtype):
            if op == R.AVG and dtype in (torch.float16, torch.bfloat16) and False:
                continue
            if op == R.PRODUCT and numel > 1000:
                continue
            x = data(rank * 7 + 1, numel, dtype)
            a, b = x.clone(), x.clone()
            # Gloo has no AVG: compare with its SUM divided by n.
            dist.all_reduce(a, op, async_op=True).wait()
            if op == R.AVG:
                dist.all_reduce(b, R.SUM, group=gloo)
                b = (b.double() / n).to(dtype)
            else:
                dist.all_reduce(b, op, group=gloo)
            same(f"all_reduce {op} {tag}", a, b, tol_of(dtype, op))
        if numel > 1000 and dtype != torch.float32:
            continue
        x = data(rank + 100, numel, dtype)
        for root in {0, n - 1}:
            a, b = x.clone(), x.clone()
            dist.broadcast(a, root)
            dist.broadcast(b, root, group=gloo)
            same(f"broadcast root {root} {tag}", a, b)
            if dtype != torch.bool:
                a, b = x.clone(), x.clone()
                dist.reduce(a, root, R.SUM)
                dist.reduce(b, root, R.SUM, group=gloo)
                if rank == root:
                    same(f"reduce root {root} {tag}", a, b, tol_of(dtype, R.SUM))
            # gather / scatter
            outs_a = [torch.zeros_like(x) for _ in range(n)] if rank == root else None
            outs_b = [torch.zeros_like(x) for _ in range(n)] if rank == root else None
            dist.gather(x, outs_a, dst=root)
            dist.gather(x, outs_b, dst=root, group=gloo)
            if rank == root:
                for r in range(n):
                    same(f"gather root {root} block {r} {tag}", outs_a[r], outs_b[r])
            blocks = [data(root * 31 + r, numel, dtype) for r in range(n)] if rank == root else None
            a, b = torch.zeros_like(x), torch.zeros_like(x)
            dist.scatter(a, blocks, src=root)
            dist.scatter(b, blocks, src=root, group=gloo)
            same(f"scatter root {root} {tag}", a, b)
        # all_gather (list and tensor), reduce_scatter (list and tensor), all_to_all
        la, lb = [torch.zeros_like(x) for _ in range(n)], [torch.zeros_like(x) for _ in range(n)]
        dist.all_gather(la, x)
        dist.all_gather(lb, x, group=gloo)
        for r in range(n):
            same(f"all_gather block {r} {tag}", la[r], lb[r])
        ta = torch.zeros(n * numel, dtype=dtype)
        dist.all_gather_into_tensor(ta, x)
        same(f"all_gather_into_tensor {tag}", ta, torch.cat(lb))
        if dtype != torch.bool:
            full = data(rank + 200, n * numel, dtype)
            oa, ob = torch.zeros(numel, dtype=dtype), torch.zeros(numel, dtype=dtype)
            dist.reduce_scatter_tensor(oa, full)
            dist.reduce_scatter(ob, list(full.chunk(n)) if numel else [torch.zeros(0, dtype=dtype)] * n,
                                group=gloo)
            same(f"reduce_scatter_tensor {tag}", oa, ob, tol_of(dtype, R.SUM))
            oa2 = torch.zeros(numel, dtype=dtype)
            dist.reduce_scatter(oa2, list(full.chunk(n)) if numel else [torch.zeros(0, dtype=dtype)] * n)
            same(f"reduce_scatter {tag}", oa2, ob, tol_of(dtype, R.SUM))
        full = data(rank + 300, n * numel, dtype)
        aa, ab = torch.zeros_like(full), torch.zeros_like(full)
        dist.all_to_all_single(aa, full)
        dist.all_to_all_single(ab, full, group=gloo)
        same(f"all_to_all_single {tag}", aa, ab)

# Uneven all-to-all: rank r sends (r + p) % 3 rows of 5 to rank p (some of them none).
for dtype in (torch.float32, torch.int64, torch.bfloat16):
    ins = [(rank + p) % 3 for p in range(n)]
    outs = [(p + rank) % 3 for p in range(n)]
    src = data(rank + 400, sum(ins) * 5, dtype).reshape(-1, 5)
    a, b = torch.zeros(sum(outs), 5, dtype=dtype), torch.zeros(sum(outs), 5, dtype=dtype)
    dist.all_to_all_single(a, src, outs, ins)
    dist.all_to_all_single(b, src, outs, ins, group=gloo)
    same(f"all_to_all_single uneven {dtype}", a, b)
    # Gloo's list all_to_all takes equal sizes only: compare with its all_to_all_single.
    la = [torch.zeros(o * 5, dtype=dtype) for o in outs]
    chunks = list(src.reshape(-1).split([i * 5 for i in ins]))
    dist.all_to_all(la, chunks)
    same(f"all_to_all uneven {dtype}", torch.cat(la), b.reshape(-1))

# Uneven all_gather and reduce_scatter: rank p contributes (and receives) p + 1 elements.
# Gloo takes equal sizes only: checked against the inputs every rank can regenerate.
for dtype in (torch.float32, torch.int32):
    mine = data(rank + 500, rank + 1, dtype)
    outs = [torch.zeros(p + 1, dtype=dtype) for p in range(n)]
    dist.all_gather(outs, mine)
    for p in range(n):
        same(f"uneven all_gather {dtype} block {p}", outs[p], data(p + 500, p + 1, dtype))
    ins = [data(rank * 10 + p + 600, p + 1, dtype) for p in range(n)]
    out = torch.zeros(rank + 1, dtype=dtype)
    dist.reduce_scatter(out, ins, op=R.SUM)
    want = sum(data(r * 10 + rank + 600, rank + 1, dtype).double() for r in range(n)).to(dtype)
    same(f"uneven reduce_scatter {dtype}", out, want)

# Non-contiguous tensors: a column of a matrix, reduced in place.
m = torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank
col_a, col_b = m[:, 1].clone(), m[:, 1].clone()
view = m[:, 1]
dist.all_reduce(view)
dist.all_reduce(col_b, group=gloo)
same("all_reduce of a non-contiguous view", view.contiguous(), col_b)
# Non-contiguous outputs of all_gather_into_tensor and reduce_scatter_tensor (every other
# element of a larger tensor).
x = data(rank + 700, 6, torch.float32)
big_a, big_b = torch.zeros(2 * n * 6), torch.zeros(n * 6)
dist.all_gather_into_tensor(big_a[::2], x)
dist.all_gather_into_tensor(big_b, x, group=gloo)
same("all_gather_into_tensor into a strided view", big_a[::2].contiguous(), big_b)
full = data(rank + 800, n * 6, torch.float32)
oa, ob = torch.zeros(12), torch.zeros(6)
dist.reduce_scatter_tensor(oa[1::2], full)
dist.reduce_scatter_tensor(ob, full, group=gloo)
same("reduce_scatter_tensor into a strided view", oa[1::2].contiguous(), ob)
same("reduce_scatter_tensor leaves the rest", oa[0::2], torch.zeros(6))

# PREMUL_SUM (a factor applied before the sum, as NCCL's): against Gloo's sum of the scaled
# inputs; the factor as a number and as a tensor.
for factor in (0.5, torch.tensor([0.25])):
    op = dist._make_nccl_premul_sum(factor)
    f = float(factor)
    x = data(rank + 900, 1000, torch.float32)
    a, b = x.clone(), x * f
    dist.all_reduce(a, op=op)
    dist.all_reduce(b, group=gloo)
    same(f"all_reduce PREMUL_SUM {f}", a, b, 1e-6)
    full = data(rank + 950, n * 10, torch.float32)
    oa, ob = torch.zeros(10), torch.zeros(10)
    dist.reduce_scatter_tensor(oa, full, op=op)
    dist.reduce_scatter_tensor(ob, full * f, group=gloo)
    same(f"reduce_scatter_tensor PREMUL_SUM {f}", oa, ob, 1e-6)

# The coalesced forms, as FSDP and DDP's helpers call them on the group itself.
pg_bcl, pg_gloo = dist.group.WORLD, gloo
xs = [data(rank + 1000 + i, 10 * (i + 1), torch.float32) for i in range(3)]
a, b = [x.clone() for x in xs], [x.clone() for x in xs]
pg_bcl.allreduce_coalesced(a, dist.AllreduceCoalescedOptions()).wait()
for t in b:
    dist.all_reduce(t, group=gloo)
for i in range(3):
    same(f"allreduce_coalesced tensor {i}", a[i], b[i], 1e-6)
outs_a = [torch.zeros(n * x.numel()) for x in xs]
pg_bcl.allgather_into_tensor_coalesced(outs_a, xs).wait()
for i, x in enumerate(xs):
    want = torch.zeros(n * x.numel())
    dist.all_gather_into_tensor(want, x, group=gloo)
    same(f"allgather_into_tensor_coalesced tensor {i}", outs_a[i], want)
fulls = [data(rank + 1100 + i, n * 4 * (i + 1), torch.float32) for i in range(3)]
outs_a = [torch.zeros(4 * (i + 1)) for i in range(3)]
opts = dist.ReduceScatterOptions()
pg_bcl.reduce_scatter_tensor_coalesced(outs_a, fulls, opts).wait()
for i in range(3):
    want = torch.zeros(4 * (i + 1))
    dist.reduce_scatter_tensor(want, fulls[i], group=gloo)
    same(f"reduce_scatter_tensor_coalesced tensor {i}", outs_a[i], want, 1e-6)
lists_a = [[torch.zeros(x.numel()) for _ in range(n)] for x in xs]
pg_bcl.allgather_coalesced(lists_a, xs).wait()
for i, x in enumerate(xs):
    want = [torch.zeros(x.numel()) for _ in range(n)]
    dist.all_gather(want, x, group=gloo)
    for r in range(n):
        same(f"allgather_coalesced tensor {i} block {r}", lists_a[i][r], want[r])

# Several operations in flight at once, waited in reverse order.
xs = [torch.full((1000,), float(rank + i)) for i in range(5)]
works = [dist.all_reduce(t, async_op=True) for t in xs]
for w in reversed(works):
    w.wait()
for i, t in enumerate(xs):
    want = float(sum(r + i for r in range(n)))
    if not torch.all(t == want):
        failures.append(f"async all_reduce {i}: {t[0]} vs {want}")
# get_future: the future completes with the work (what DDP's communication hooks use).
t = torch.ones(10)
fut = dist.all_reduce(t, async_op=True).get_future()
fut.wait()
if not torch.all(t == n):
    failures.append(f"future: {t[0]}")
# A future callback that waits on its own work again (queued: 1 MiB) returns, not deadlocks.
t = torch.ones(1 << 18)
w = dist.all_reduce(t, async_op=True)
chained = w.get_future().then(lambda f: w.wait())
chained.wait()
if not torch.all(t == n):
    failures.append(f"a work waited on from its own callback: {t[0]}")
# Point to point, and a barrier.
if n > 1:
    if rank == 0:
        dist.send(torch.arange(5, dtype=torch.int64), dst=n - 1)
    elif rank == n - 1:
        got = torch.zeros(5, dtype=torch.int64)
        dist.recv(got, src=0)
        same("send/recv", got, torch.arange(5, dtype=torch.int64))
# irecv, then send, on both sides of a pair (a pipeline's exchange): the receive waits for its
# data when waited on, so neither send is held up behind it. Two receives from one peer,
# waited in reverse order, still match the sends in order.
if n > 1 and rank < 2:
    peer = 1 - rank
    got = torch.zeros(1 << 20)
    w = dist.irecv(got, src=peer)
    dist.send(torch.full((1 << 20,), float(rank)), dst=peer)
    w.wait()
    same("irecv then send", got, torch.full((1 << 20,), float(peer)))
    a, b = torch.zeros(3), torch.zeros(3)
    wa, wb = dist.irecv(a, src=peer), dist.irecv(b, src=peer)
    dist.isend(torch.full((3,), 10.0 + rank), dst=peer).wait()
    dist.isend(torch.full((3,), 20.0 + rank), dst=peer).wait()
    wb.wait()
    if not wa.is_completed():
        failures.append("the earlier irecv did not complete before the later one")
    wa.wait()
    same("first of two irecvs", a, torch.full((3,), 10.0 + peer))
    same("second of two irecvs", b, torch.full((3,), 20.0 + peer))
    fut = dist.irecv(a, src=peer).get_future()
    dist.send(torch.full((3,), 30.0 + rank), dst=peer)
    dist.send(torch.full((3,), 40.0 + rank), dst=peer)
    dist.irecv(b, src=peer).wait()  # runs the earlier receive first, completing its future
    if not fut.done():
        failures.append("an irecv's future did not complete when a later receive ran")
    same("an irecv waited through its future", fut.wait()[0], torch.full((3,), 30.0 + peer))
    same("the receive after it", b, torch.full((3,), 40.0 + peer))
# isend returns at once, queued behind the collective before it: rank 1 joins the all_reduce
# only once rank 0's isend after it has returned (told through torch's store), or after 10 s
# (an isend that waited for the all_reduce would be waiting for rank 1: the check fails, and
# rank 1 then joins, so nothing hangs).
if n > 1:
    store = dist.distributed_c10d._get_default_store()
    big = torch.ones(1 << 20)
    if rank == 1:
        deadline = time.time() + 10
        while not store.check(["isend-returned"]) and time.time() < deadline:
            time.sleep(0.01)
        if not store.check(["isend-returned"]):
            failures.append("rank 0's isend waited for the all_reduce queued before it")
    w = dist.all_reduce(big, async_op=True)
    if rank == 0:
        s = dist.isend(torch.full((1 << 20,), 5.0), dst=1)
        store.set("isend-returned", "1")
        s.wait()
    elif rank == 1:
        got = torch.zeros(1 << 20)
        dist.recv(got, src=0)
        same("isend behind a queued all_reduce", got, torch.full((1 << 20,), 5.0))
    w.wait()
    same("the all_reduce an isend followed", big, torch.full((1 << 20,), float(n)))
# batch_isend_irecv: a ring exchange of 16 MiB each way (a BCL group: no order deadlocks).
for numel in (10, 1 << 22):
    out = torch.full((numel,), float(rank))
    got = torch.zeros(numel)
    ops = [dist.P2POp(dist.isend, out, (rank + 1) % n), dist.P2POp(dist.irecv, got, (rank - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if not torch.all(got == float((rank - 1) % n)):
        failures.append(f"batch_isend_irecv of {numel}: {got[0]}")
dist.barrier()

finish(rank, failures)
