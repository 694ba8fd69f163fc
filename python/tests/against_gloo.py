"""What check_ops.py and check_cuda.py share: the inputs every rank can regenerate, and the
comparison of a "bcl" result with Gloo's, the end of a check."""
import sys

import torch
import torch.distributed as dist


def data(seed, numel, dtype):
    """Small exact values (quarters for floats), the same for a seed on every rank."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    if dtype.is_floating_point:
        return torch.randint(-8, 9, (numel,), generator=g).to(dtype) / 4
    return torch.randint(0, 5, (numel,), generator=g).to(dtype)


def mismatch(what, got, want, tol=None):
    """Why `got` (bcl's) is not `want` (Gloo's): shape, the first differing element (exact),
    or the largest difference beyond `tol`; None when they agree."""
    if got.shape != want.shape:
        return f"{what}: shape {tuple(got.shape)} vs gloo {tuple(want.shape)}"
    if tol is None:
        if not torch.equal(got, want):
            i = (got != want).nonzero()[0].tolist()
            return f"{what}: {got[tuple(i)]} vs gloo {want[tuple(i)]} at {i}"
    elif not torch.allclose(got.double(), want.double(), rtol=tol, atol=tol):
        return f"{what}: beyond {tol}: max diff {(got.double() - want.double()).abs().max()}"
    return None


def finish(rank, failures):
    """The end of a check: the failures on stderr and exit 1, or "rank R OK"."""
    if failures:
        print(f"rank {rank}: {len(failures)} failures", file=sys.stderr)
        for f in failures[:30]:
            print(f"rank {rank}: {f}", file=sys.stderr)
        sys.exit(1)
    dist.destroy_process_group()
    print(f"rank {rank} OK")
