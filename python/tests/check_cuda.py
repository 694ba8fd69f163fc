"""One rank of `torchrun --nproc-per-node 2 python/tests/check_cuda.py`, run by
scripts/device-check.sh on a GPU machine: the "bcl" backend on CUDA tensors.

- Every operation on GPU tensors against Gloo on host copies of the same inputs (exact, or
  within the float tolerance of check_ops.py): the collectives BCL runs on the GPU's stream
  and the ones that go through host copies (uneven splits, send and receive).
- NCCL's stream semantics: a collective starts after the work already on torch's current
  stream (a tensor filled behind a long GPU sleep is reduced with its new contents), later
  work on the stream sees its result without a host wait, a collective queued on a side
  stream is waited for by the default stream through `Work.wait()`, `get_future()` and
  `synchronize()`.
- DDP on the GPU ends with the same parameters as DDP over Gloo on the cpu.

BCL_CHECK_DEVICE=cpu runs the same checks on cpu tensors (the stream checks need a GPU and
are left out there), which is how the script itself is checked on a machine without a GPU.
Prints "rank R OK"."""
import copy
import os

import torch
import torch.distributed as dist

import bcl.torch  # noqa: F401  registers "bcl"
from against_gloo import data, finish, mismatch

DEV = torch.device(os.environ.get("BCL_CHECK_DEVICE", "cuda"))
GPU = DEV.type == "cuda"
if GPU:
    torch.cuda.set_device(0)  # every rank on the one GPU: BCL's ranks may share it
    DEV = torch.device("cuda", 0)
dist.init_process_group("bcl")
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
R = dist.ReduceOp
failures = []


def same(what, got, want, tol=None):
    if got.device != DEV:
        failures.append(f"{what}: the result is on {got.device}, not {DEV}")
    if (why := mismatch(what, got.cpu(), want, tol)) is not None:
        failures.append(why)


def tol_of(dtype):
    if not dtype.is_floating_point:
        return None
    return {torch.float16: 2e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-6)


for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool):
    for numel in (0, 7, 1000, 1 << 20):
        if numel == 1 << 20 and dtype not in (torch.float32, torch.bfloat16):
            continue
        tag = f"{dtype} x {numel}"
        ops = [R.SUM, R.MIN, R.MAX] + ([R.PRODUCT] if dtype != torch.bool and numel <= 1000 else [])
        for op in ops:
            x = data(rank * 7 + 1, numel, dtype)
            a, b = x.to(DEV, copy=True), x.clone()
            dist.all_reduce(a, op, async_op=True).wait()
            dist.all_reduce(b, op, group=gloo)
            same(f"all_reduce {op} {tag}", a, b, tol_of(dtype) if op == R.SUM else None)
        if dtype.is_floating_point:
            a, b = x.to(DEV, copy=True), x.clone()
            dist.all_reduce(a, R.AVG)
            dist.all_reduce(b, R.SUM, group=gloo)
            same(f"all_reduce AVG {tag}", a, (b.double() / n).to(dtype), tol_of(dtype))
        x = data(rank + 100, numel, dtype)
        for root in (0, n - 1):
            a, b = x.to(DEV, copy=True), x.clone()
            dist.broadcast(a, root)
            dist.broadcast(b, root, group=gloo)
            same(f"broadcast root {root} {tag}", a, b)
            if dtype != torch.bool:
                a, b = x.to(DEV, copy=True), x.clone()
                dist.reduce(a, root, R.SUM)
                dist.reduce(b, root, R.SUM, group=gloo)
                if rank == root:
                    same(f"reduce root {root} {tag}", a, b, tol_of(dtype))
            outs_a = [torch.zeros_like(x, device=DEV) for _ in range(n)] if rank == root else None
            outs_b = [torch.zeros_like(x) for _ in range(n)] if rank == root else None
            dist.gather(x.to(DEV, copy=True), outs_a, dst=root)
            dist.gather(x, outs_b, dst=root, group=gloo)
            if rank == root:
                for r in range(n):
                    same(f"gather root {root} block {r} {tag}", outs_a[r], outs_b[r])
            blocks = [data(root * 31 + r, numel, dtype) for r in range(n)] if rank == root else None
            a, b = torch.zeros_like(x, device=DEV), torch.zeros_like(x)
            dist.scatter(a, [t.to(DEV, copy=True) for t in blocks] if blocks else None, src=root)
            dist.scatter(b, blocks, src=root, group=gloo)
            same(f"scatter root {root} {tag}", a, b)
        la = [torch.zeros_like(x, device=DEV) for _ in range(n)]
        lb = [torch.zeros_like(x) for _ in range(n)]
        dist.all_gather(la, x.to(DEV, copy=True))
        dist.all_gather(lb, x, group=gloo)
        for r in range(n):
            same(f"all_gather block {r} {tag}", la[r], lb[r])
        ta = torch.zeros(n * numel, dtype=dtype, device=DEV)
        dist.all_gather_into_tensor(ta, x.to(DEV, copy=True))
        same(f"all_gather_into_tensor {tag}", ta, torch.cat(lb))
        if dtype != torch.bool:
            full = data(rank + 200, n * numel, dtype)
            oa = torch.zeros(numel, dtype=dtype, device=DEV)
            ob = torch.zeros(numel, dtype=dtype)
            chunks = list(full.chunk(n)) if numel else [torch.zeros(0, dtype=dtype)] * n
            dist.reduce_scatter_tensor(oa, full.to(DEV, copy=True))
            dist.reduce_scatter(ob, chunks, group=gloo)
            same(f"reduce_scatter_tensor {tag}", oa, ob, tol_of(dtype))
            oa2 = torch.zeros(numel, dtype=dtype, device=DEV)
            dist.reduce_scatter(oa2, [c.to(DEV, copy=True) for c in chunks])
            same(f"reduce_scatter {tag}", oa2, ob, tol_of(dtype))
        full = data(rank + 300, n * numel, dtype)
        aa, ab = torch.zeros_like(full, device=DEV), torch.zeros_like(full)
        dist.all_to_all_single(aa, full.to(DEV, copy=True))
        dist.all_to_all_single(ab, full, group=gloo)
        same(f"all_to_all_single {tag}", aa, ab)

# Through host copies: uneven all-to-all, all_gather and reduce_scatter.
for dtype in (torch.float32, torch.int64):
    ins = [(rank + p) % 3 for p in range(n)]
    outs = [(p + rank) % 3 for p in range(n)]
    src = data(rank + 400, sum(ins) * 5, dtype).reshape(-1, 5)
    a = torch.zeros(sum(outs), 5, dtype=dtype, device=DEV)
    b = torch.zeros(sum(outs), 5, dtype=dtype)
    dist.all_to_all_single(a, src.to(DEV, copy=True), outs, ins)
    dist.all_to_all_single(b, src, outs, ins, group=gloo)
    same(f"all_to_all_single uneven {dtype}", a, b)
    la = [torch.zeros(o * 5, dtype=dtype, device=DEV) for o in outs]
    chunks = [c.to(DEV, copy=True) for c in src.reshape(-1).split([i * 5 for i in ins])]
    dist.all_to_all(la, chunks)
    same(f"all_to_all uneven {dtype}", torch.cat(la), b.reshape(-1))
    mine = data(rank + 500, rank + 1, dtype)
    outs_l = [torch.zeros(p + 1, dtype=dtype, device=DEV) for p in range(n)]
    dist.all_gather(outs_l, mine.to(DEV, copy=True))
    for p in range(n):
        same(f"uneven all_gather {dtype} block {p}", outs_l[p], data(p + 500, p + 1, dtype))
    parts = [data(rank * 10 + p + 600, p + 1, dtype).to(DEV, copy=True) for p in range(n)]
    out = torch.zeros(rank + 1, dtype=dtype, device=DEV)
    dist.reduce_scatter(out, parts, op=R.SUM)
    want = sum(data(r * 10 + rank + 600, rank + 1, dtype).double() for r in range(n)).to(dtype)
    same(f"uneven reduce_scatter {dtype}", out, want)

# A non-contiguous view reduced in place; PREMUL_SUM; the coalesced form.
m = (torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank).to(DEV, copy=True)
col = m[:, 1].cpu()
dist.all_reduce(m[:, 1])
dist.all_reduce(col, group=gloo)
same("all_reduce of a non-contiguous view", m[:, 1].contiguous(), col)
op = dist._make_nccl_premul_sum(0.5)
x = data(rank + 900, 1000, torch.float32)
a, b = x.to(DEV, copy=True), x * 0.5
dist.all_reduce(a, op=op)
dist.all_reduce(b, group=gloo)
same("all_reduce PREMUL_SUM 0.5", a, b, 1e-6)
xs = [data(rank + 1000 + i, 10 * (i + 1), torch.float32) for i in range(3)]
a = [t.to(DEV, copy=True) for t in xs]
dist.group.WORLD.allreduce_coalesced(a, dist.AllreduceCoalescedOptions()).wait()
for i, t in enumerate(xs):
    b = t.clone()
    dist.all_reduce(b, group=gloo)
    same(f"allreduce_coalesced tensor {i}", a[i], b, 1e-6)

# all_gather_coalesced of an even and an uneven list: one Work, so on a GPU both go through
# host copies.
xs2 = [data(rank + 1200, 4, torch.float32), data(rank + 1300, rank + 1, torch.float32)]
lists = [[torch.zeros(4, device=DEV) for _ in range(n)],
         [torch.zeros(p + 1, device=DEV) for p in range(n)]]
dist.group.WORLD.allgather_coalesced(lists, [t.to(DEV, copy=True) for t in xs2]).wait()
for p in range(n):
    same(f"allgather_coalesced even block {p}", lists[0][p], data(p + 1200, 4, torch.float32))
    same(f"allgather_coalesced uneven block {p}", lists[1][p], data(p + 1300, p + 1, torch.float32))

# Point to point (through host copies): send/recv, irecv then send, batch_isend_irecv.
if n > 1 and rank < 2:
    peer = 1 - rank
    got = torch.zeros(1 << 20, device=DEV)
    w = dist.irecv(got, src=peer)
    dist.send(torch.full((1 << 20,), float(rank), device=DEV), dst=peer)
    w.wait()
    same("irecv then send", got, torch.full((1 << 20,), float(peer)))
got = torch.zeros(10, device=DEV)
ops = [dist.P2POp(dist.isend, torch.full((10,), float(rank), device=DEV), (rank + 1) % n),
       dist.P2POp(dist.irecv, got, (rank - 1) % n)]
for w in dist.batch_isend_irecv(ops):
    w.wait()
same("batch_isend_irecv", got, torch.full((10,), float((rank - 1) % n)))

if GPU:
    N = 1 << 20
    # The collective starts after the stream's earlier work: the fill runs behind a GPU sleep
    # of about 0.2 s, which a collective reading early would miss (it would reduce zeros).
    x = torch.zeros(N, device=DEV)
    torch.cuda._sleep(300_000_000)
    x.fill_(rank + 1.0)
    w = dist.all_reduce(x, async_op=True)
    # Later work on the stream sees the result, with no host wait in between.
    y = x * 2
    same("a collective after a GPU sleep and a fill", x, torch.full((N,), float(n * (n + 1) // 2)))
    same("work queued after the collective", y, torch.full((N,), float(n * (n + 1))))
    if not w.is_completed():
        failures.append("is_completed() false after the stream was synchronised by .cpu()")
    # On a side stream; the default stream waits for it through Work.wait().
    side = torch.cuda.Stream()
    t = torch.full((N,), float(rank + 1), device=DEV)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(300_000_000)
        w = dist.all_reduce(t, async_op=True)
    w.wait()  # the current (default) stream now waits for the side stream's collective
    r = t.clone()
    same("a side stream's collective waited by the default stream", r,
         torch.full((N,), float(n * (n + 1) // 2)))
    # get_future(): a value and a callback, stream-ordered.
    t = torch.ones(N, device=DEV)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 3)
    same("get_future().then", fut.wait(), torch.full((N,), 3.0 * n))
    # synchronize() blocks the host until the stream has passed the collective.
    t = torch.ones(N, device=DEV)
    torch.cuda._sleep(100_000_000)
    w = dist.all_reduce(t, async_op=True)
    w.synchronize()
    if not w.is_completed():
        failures.append("is_completed() false after synchronize()")

# DDP on DEV against DDP over Gloo on the cpu: the same parameters after a few steps.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model), process_group=gloo)
ddp = torch.nn.parallel.DistributedDataParallel(model.to(DEV),
                                                device_ids=[DEV.index] if GPU else None)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(5):
    g = torch.Generator().manual_seed(step * 100 + rank)
    xb, yb = torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)
    for net, o, xx, yy in ((ddp, opt, xb.to(DEV, copy=True), yb.to(DEV, copy=True)), (ref, opt_ref, xb, yb)):
        o.zero_grad()
        torch.nn.functional.mse_loss(net(xx), yy).backward()
        o.step()
for (name, p), q in zip(ddp.module.named_parameters(), ref.module.parameters()):
    same(f"DDP parameter {name}", p.detach(), q.detach(), 1e-5)

dist.barrier()
finish(rank, failures)
