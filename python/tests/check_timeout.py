"""One rank of `torchrun --nproc-per-node 2 python/tests/check_timeout.py`: the group's
timeout (3 s here) bounds a collective: rank 1 joins its all_reduce 8 s late, and rank 0's
call raises, naming rank 1 as the rank it waited for, instead of waiting. Prints "rank R OK"."""
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import bcl.torch  # noqa: F401

dist.init_process_group("bcl", timeout=timedelta(seconds=3))
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
if rank == 1:
    time.sleep(8)
    sys.exit(0)  # rank 0 has given up on this communicator; nothing more to check here
t0 = time.time()
try:
    dist.all_reduce(t)
except Exception as e:
    took = time.time() - t0
    text = str(e)
    print(f"rank 0 raised after {took:.1f} s: {text[:300]}")
    if "rank 1" not in text:
        sys.exit(f"the error does not name rank 1: {text}")
    print("rank 0 OK")
    import os
    os._exit(0)  # the communicator is poisoned; skip the orderly shutdown with rank 1 asleep
sys.exit("all_reduce returned without rank 1")
