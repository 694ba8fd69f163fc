"""One rank of a 4-process run, written only against libbcl.so through ctypes.

Random arrays of every dtype numpy has of BCL's (all but bfloat16), allreduce with every op,
compared with numpy's own reduction of all ranks' arrays (each rank regenerates the others'
from their seeds): exactly for integers (wrapping), within (n-1)*u*sum|x| twice for floats.
"""
import ctypes
import os
import sys

import numpy as np

lib = ctypes.CDLL(os.environ["BCL_LIBRARY"])
lib.bclGetLastError.restype = ctypes.c_char_p
lib.bclGetErrorString.restype = ctypes.c_char_p


def check(code, what):
    if code != 0:
        sys.exit(f"{what}: {lib.bclGetErrorString(code).decode()}: {lib.bclGetLastError(None).decode()}")


comm = ctypes.c_void_p()
check(lib.bclCommInitFromEnv(ctypes.byref(comm)), "bclCommInitFromEnv")
rank, world = ctypes.c_int(), ctypes.c_int()
check(lib.bclCommUserRank(comm, ctypes.byref(rank)), "rank")
check(lib.bclCommCount(comm, ctypes.byref(world)), "count")
rank, world = rank.value, world.value

TYPES = {np.int8: 0, np.uint8: 1, np.int32: 2, np.uint32: 3, np.int64: 4, np.uint64: 5,
         np.float16: 6, np.float32: 7, np.float64: 8}
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
COUNT = 4099


def data(r, dtype, op):
    rng = np.random.default_rng(1000 * r + TYPES[dtype] * 10 + OPS[op])
    if np.issubdtype(dtype, np.floating):
        lo, hi = (0.5, 1.5) if op == "prod" else (-1.0, 1.0)
        return rng.uniform(lo, hi, COUNT).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, COUNT, dtype=dtype, endpoint=True)


for dtype, code in TYPES.items():
    for op, opcode in OPS.items():
        if op == "avg" and not np.issubdtype(dtype, np.floating):
            continue  # integer avg truncates toward zero; covered by the Rust suites
        mine = data(rank, dtype, op)
        out = np.zeros_like(mine)
        check(lib.bclAllReduce(mine.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                               ctypes.c_size_t(COUNT), code, opcode, comm, None), f"allreduce {dtype.__name__} {op}")
        everyone = np.stack([data(r, dtype, op) for r in range(world)])
        with np.errstate(over="ignore"):
            if op in ("sum", "avg"):
                want = np.add.reduce(everyone, axis=0, dtype=dtype)
            elif op == "prod":
                want = np.multiply.reduce(everyone, axis=0, dtype=dtype)
            elif op == "max":
                want = everyone.max(axis=0)
            else:
                want = everyone.min(axis=0)
        if op == "avg":
            want = (want.astype(np.float64) / world).astype(dtype)
        if np.issubdtype(dtype, np.floating):
            u = np.finfo(dtype).eps / 2
            mags = np.abs(everyone.astype(np.float64))
            bound = 2 * (world - 1) * u * (np.prod(mags, axis=0) * world if op == "prod" else mags.sum(axis=0))
            bound = bound + (u * np.abs(want.astype(np.float64)) if op == "avg" else 0)
            err = np.abs(out.astype(np.float64) - want.astype(np.float64))
            if not np.all(err <= bound + np.finfo(np.float64).tiny):
                i = int(np.argmax(err - bound))
                sys.exit(f"{dtype.__name__} {op}: element {i}: {out[i]} vs numpy {want[i]} (bound {bound[i]})")
        elif not np.array_equal(out, want):
            i = int(np.argmax(out != want))
            sys.exit(f"{dtype.__name__} {op}: element {i}: {out[i]} vs numpy {want[i]}")

check(lib.bclCommDestroy(comm), "destroy")
print(f"rank {rank} OK")
