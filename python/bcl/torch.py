"""`import bcl.torch` registers BCL as the torch.distributed backend "bcl" for cpu tensors.

Under torchrun, `dist.init_process_group("bcl")` needs nothing else: rank 0 makes a BCL
unique id and hands it to the others through the Store torch gives the backend.

The backend is C++ (`bcl._C.ProcessGroupBCL`, a c10d::Backend over the C ABI, as torch-ccl
and torch_ucc are): collectives are queued on the group's BCL host stream and return a Work at
once, so DDP's gradient buckets are reduced while the backward pass goes on; a completion
thread finishes them in order (copies into non-contiguous outputs, futures for DDP's
communication hooks). Calls of up to BCL_TORCH_SYNC_BYTES (64 KiB) run on the caller's thread.
Failures raise torch.distributed.DistBackendError with BCL's verdict (rank, host, cause).
"""
import torch  # noqa: F401  (bcl._C needs torch's libraries loaded first)
import torch.distributed as dist

from . import _lib

_lib.load()
from ._C import ProcessGroupBCL  # noqa: E402


def _create(opts, _backend_options):
    return ProcessGroupBCL(opts.store, opts.group_rank, opts.group_size, opts.timeout)


dist.Backend.register_backend("bcl", _create, extended_api=True, devices=["cpu"])
