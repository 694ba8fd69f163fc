"""`import bcl.torch` registers BCL as the torch.distributed backend "bcl" for cpu tensors,
and for cuda tensors where torch sees a GPU.

Under torchrun, `dist.init_process_group("bcl")` needs nothing else: rank 0 makes a BCL
unique id and hands it to the others through the Store torch gives the backend.

The backend is C++ (`bcl._C.ProcessGroupBCL`, a c10d::Backend over the C ABI, as torch-ccl
and torch_ucc are): collectives are queued on the group's BCL host stream and return a Work at
once, so DDP's gradient buckets are reduced while the backward pass goes on; a completion
thread finishes them in order (copies into non-contiguous outputs, futures for DDP's
communication hooks). Calls of up to BCL_TORCH_SYNC_BYTES (64 KiB) run on the caller's thread.
Subgroups (`new_group`) of a "bcl" world are made by their members from the world's
communicator (bclCommCreateGroup). CUDA tensors follow NCCL's semantics: a collective is
queued on torch's current stream and its Work's wait() makes the current stream wait for it;
calls BCL has for host memory only (per-rank counts, send and receive) go through host
copies. Failures raise torch.distributed.DistBackendError with BCL's verdict (rank, host,
cause).
"""
import zlib

import torch  # noqa: F401  (bcl._C needs torch's libraries loaded first)
import torch.distributed as dist

from . import _lib

_lib.load()
from ._C import ProcessGroupBCL  # noqa: E402


def _world():
    """The default group's "bcl" backend, if it has one (subgroups are made from it)."""
    if not dist.is_initialized():
        return None
    try:
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return backend if isinstance(backend, ProcessGroupBCL) else None


def _create(opts, _backend_options):
    # torch calls this on a new group's members only, so a subgroup of a "bcl" world is made
    # by its members alone from the world's communicator (bclCommCreateGroup), not through
    # the store; its tag comes from the group's name, the same on every member.
    world = _world()
    if opts.global_ranks_in_group and world is not None:
        tag = zlib.crc32(str(opts.group_id).encode()) & 0x7FFFFFFF
        return ProcessGroupBCL(world, list(opts.global_ranks_in_group), opts.group_rank, tag)
    return ProcessGroupBCL(opts.store, opts.group_rank, opts.group_size, opts.timeout)


# GPU tensors where torch sees a GPU: collectives go on torch's current stream through the
# group's communicator on that GPU, made at its first GPU collective (a libbcl built with the
# cuda feature; without it, that collective raises saying so).
_DEVICES = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
dist.Backend.register_backend("bcl", _create, extended_api=True, devices=_DEVICES)
