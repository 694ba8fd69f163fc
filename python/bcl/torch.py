"""`import bcl.torch` registers BCL as the torch.distributed backend "bcl" for cpu tensors.

Under torchrun, `dist.init_process_group("bcl")` needs nothing else: rank 0 makes a BCL
unique id and hands it to the others through the Store torch gives the backend.

Design: a Python `ProcessGroup` over the C ABI (ctypes). Every collective is queued on the
group's BCL host stream (`bclStreamCreate`) and returns at once, so DDP's gradient buckets
are reduced while the backward pass goes on; a BCL event recorded after each one tells its
`Work` when it is done, and a completion thread finishes the works in order (copying results
into non-contiguous outputs, completing their futures, which DDP's communication hooks
chain on). `Work.wait` on the caller's thread takes the event itself rather than waiting
for that thread, so a blocking call costs no extra hand-over.
"""
import ctypes
import os
import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.futures import Future

from . import _lib
from ._lib import BclError, UniqueId, check, lib

_SYNC_BYTES = int(os.environ.get("BCL_TORCH_SYNC_BYTES", 64 << 10))

_DTYPES = {
    torch.int8: _lib.INT8,
    torch.uint8: _lib.UINT8,
    torch.int32: _lib.INT32,
    torch.int64: _lib.INT64,
    torch.float16: _lib.FLOAT16,
    torch.float32: _lib.FLOAT32,
    torch.float64: _lib.FLOAT64,
    torch.bfloat16: _lib.BFLOAT16,
    torch.bool: _lib.UINT8,
}


def _dtype(t):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise TypeError(f"bcl: tensors of {t.dtype} are not supported") from None


# torch's ReduceOp.RedOpType numbers -> BCL's ops.
_RED_OPS = {
    int(dist.ReduceOp.SUM): _lib.SUM,
    int(dist.ReduceOp.AVG): _lib.AVG,
    int(dist.ReduceOp.PRODUCT): _lib.PROD,
    int(dist.ReduceOp.MIN): _lib.MIN,
    int(dist.ReduceOp.MAX): _lib.MAX,
}


def _op(op, t):
    """BCL's op for torch's, on tensor `t` (bool: sum is or, product is and)."""
    kind = getattr(op, "op", op)
    v = _RED_OPS.get(int(kind))
    if v is None:
        raise ValueError(f"bcl: reduce op {kind} is not supported (SUM, PRODUCT, MIN, MAX, AVG are)")
    if t.dtype == torch.bool:
        return {_lib.SUM: _lib.MAX, _lib.PROD: _lib.MIN}.get(v, v)
    return v


def _cpu(*tensors):
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError(f"bcl: only cpu tensors are supported here, got one on {t.device}")


class _Op:
    """One queued operation: its event, what must stay alive, what to do once it is done."""

    def __init__(self, event, keep, after, result):
        self.event = event
        self.keep = keep
        self.after = after
        self.result = result
        self.future = Future()
        self.lock = threading.Lock()
        self.done = False
        self.error = None

    def finish(self):
        """Wait for the operation (any thread, any number of times); its error or None."""
        if not self.done:
            code = lib.bclEventSynchronize(self.event)
            err = _lib.error(code) if code != _lib.SUCCESS else None
            with self.lock:
                if not self.done:
                    self.error = err
                    if err is None and self.after is not None:
                        self.after()
                    lib.bclEventDestroy(self.event)
                    self.keep = None
                    self.done = True
                    if err is None:
                        self.future.set_result(self.result)
                    else:
                        self.future.set_exception(err)
        return self.error


class _Work(dist.Work):
    def __init__(self, op):
        super().__init__()
        self._op = op

    def wait(self, timeout=timedelta(0)):
        err = self._op.finish()
        if err is not None:
            raise err
        return True

    def is_completed(self):
        return self._op.done

    def is_success(self):
        return self._op.done and self._op.error is None

    def exception(self):
        return self._op.error

    def get_future(self):
        return self._op.future

    def result(self):
        return self._op.result


class _Done(dist.Work):
    """A work that completed before it was returned (blocking calls: send, recv)."""

    def __init__(self, result):
        super().__init__()
        self._result = result

    def wait(self, timeout=timedelta(0)):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        future = Future()
        future.set_result(self._result)
        return future

    def result(self):
        return self._result


def _flat(t):
    """A contiguous view or copy of `t`, and how to bring results back into `t`."""
    if t.is_contiguous():
        return t, None
    c = t.contiguous()
    return c, (lambda: t.copy_(c))


def _bytes(t):
    return t.numel() * t.element_size()


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t.numel() else ctypes.c_void_p()


class ProcessGroupBCL(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives are BCL's (see the module comment)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        uid = UniqueId()
        if rank == 0:
            check(lib.bclGetUniqueId(ctypes.byref(uid)))
            store.set("bcl/unique_id", ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)))
        else:
            data = store.get("bcl/unique_id")
            ctypes.memmove(ctypes.addressof(uid), data, min(len(data), ctypes.sizeof(uid)))
        # The group's timeout bounds each collective (and init), as it does Gloo's.
        config = _lib.Config.default()
        if timeout is not None and timeout.total_seconds() > 0:
            config.timeoutSeconds = config.initTimeoutSeconds = timeout.total_seconds()
        self._comm = ctypes.c_void_p()
        check(lib.bclCommInitRankConfig(ctypes.byref(self._comm), size, uid, rank,
                                        ctypes.byref(config)))
        self._stream = ctypes.c_void_p()
        check(lib.bclStreamCreate(ctypes.byref(self._stream)))
        self._pending = queue.Queue()
        self._finisher = threading.Thread(target=self._finish_loop, name="bcl-completion", daemon=True)
        self._finisher.start()

    # --------------------------------------------------------------- plumbing

    def _finish_loop(self):
        while True:
            op = self._pending.get()
            if op is None:
                return
            op.finish()

    def _queue(self, call, keep, after=None, result=None, nbytes=None):
        """Queue `call(stream)` (a ctypes call returning a bclResult_t) and its event. Small
        operations (`nbytes` up to BCL_TORCH_SYNC_BYTES, 64 KiB by default) run at once on
        this thread instead: there is little to overlap, and the hand-over to the progress
        thread would cost more than they do. Order is kept: a blocking call waits for the
        operations queued before it."""
        if nbytes is not None and nbytes <= _SYNC_BYTES:
            check(call(None))
            if after is not None:
                after()
            return _Done(result)
        check(call(self._stream))
        event = ctypes.c_void_p()
        check(lib.bclEventCreate(ctypes.byref(event)))
        check(lib.bclEventRecord(event, self._stream))
        op = _Op(event, keep, after, result)
        self._pending.put(op)
        return _Work(op)

    def getBackendName(self):
        return "bcl"

    # A Python ProcessGroup answers for its own name (the C++ one is not consulted).
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", "")

    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def shutdown(self):
        if self._comm:
            lib.bclStreamSynchronize(self._stream)
            self._pending.put(None)
            lib.bclStreamDestroy(self._stream)
            lib.bclCommDestroy(self._comm)
            self._comm = ctypes.c_void_p()

    def abort(self):
        if self._comm:
            lib.bclCommAbort(self._comm)

    # --------------------------------------------------------------- collectives

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        return self.allreduce_coalesced(tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        _cpu(*tensors)
        work = None
        for t in tensors:
            flat, back = _flat(t)
            dt, op, n = _dtype(t), _op(opts.reduceOp, t), flat.numel()
            work = self._queue(
                lambda s, f=flat: lib.bclAllReduce(_ptr(f), _ptr(f), n, dt, op, self._comm, s),
                (t, flat), back, list(tensors), nbytes=_bytes(flat))
        return work

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        _cpu(*tensors)
        work = None
        for t in tensors:
            flat, back = _flat(t)
            dt, n, root = _dtype(t), flat.numel(), opts.rootRank
            work = self._queue(
                lambda s, f=flat: lib.bclBroadcast(_ptr(f), _ptr(f), n, dt, root, self._comm, s),
                (t, flat), back, list(tensors), nbytes=_bytes(flat))
        return work

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        (t,) = tensors
        _cpu(t)
        flat, back = _flat(t)
        dt, op, n, root = _dtype(t), _op(opts.reduceOp, t), flat.numel(), opts.rootRank
        return self._queue(
            lambda s: lib.bclReduce(_ptr(flat), _ptr(flat), n, dt, op, root, self._comm, s),
            (t, flat), back if self._rank == root else None, [t])

    def all_gather_single(self, output, input, opts=None):
        _cpu(output, input)
        _same(output, input, self._size * input.numel(), "all_gather_into_tensor")
        out, back = _flat(output)
        inp = input.contiguous()
        dt, n = _dtype(input), inp.numel()
        return self._queue(lambda s: lib.bclAllGather(_ptr(inp), _ptr(out), n, dt, self._comm, s),
                           (output, out, inp), back, [output])

    def allgather(self, output_tensors, input_tensors, opts=None):
        (outs,), (input,) = output_tensors, input_tensors
        _cpu(input, *outs)
        inp = input.contiguous()
        n = inp.numel()
        if any(o.numel() != n for o in outs):
            # Uneven: output p holds rank p's input, whatever its size (bclAllGatherv).
            if outs[self._rank].numel() != n:
                raise ValueError(f"bcl: all_gather: output {self._rank} holds "
                                 f"{outs[self._rank].numel()} elements, this rank's input {n}")
            counts = (ctypes.c_size_t * self._size)(*[o.numel() for o in outs])
            staged = torch.empty(sum(o.numel() for o in outs), dtype=input.dtype)
            dt = _dtype(input)

            def back():
                at = 0
                for o in outs:
                    o.copy_(staged[at:at + o.numel()].view_as(o))
                    at += o.numel()

            return self._queue(
                lambda s: lib.bclAllGatherv(_ptr(inp), _ptr(staged), counts, dt, self._comm, s),
                (inp, staged, counts, outs), back, [outs])
        for o in outs:
            _same(o, input, n, "all_gather")
        staged = torch.empty(self._size * n, dtype=input.dtype)
        dt = _dtype(input)

        def back():
            for r, o in enumerate(outs):
                o.copy_(staged[r * n:(r + 1) * n].view_as(o))

        return self._queue(lambda s: lib.bclAllGather(_ptr(inp), _ptr(staged), n, dt, self._comm, s),
                           (inp, staged, outs), back, [outs])

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        work = None
        for outs, t in zip(output_lists, input_tensors):
            work = self.allgather([outs], [t], opts)
        return work

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        _cpu(output, input)
        _same(input, output, self._size * output.numel(), "reduce_scatter_tensor")
        out, back = _flat(output)
        inp = input.contiguous()
        dt, op, n = _dtype(output), _op(opts.reduceOp, output), out.numel()
        return self._queue(
            lambda s: lib.bclReduceScatter(_ptr(inp), _ptr(out), n, dt, op, self._comm, s),
            (output, out, inp), back, [output])

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        (output,), (inputs,) = output_tensors, input_lists
        if any(i.numel() != output.numel() for i in inputs):
            return self._reduce_scatter_uneven(output, inputs, opts or dist.ReduceScatterOptions())
        staged = torch.cat([i.reshape(-1) for i in inputs])
        return self.reduce_scatter_single(output, staged, opts)

    def _reduce_scatter_uneven(self, output, inputs, opts):
        """Input p goes to rank p, whatever its size (bclReduceScatterv)."""
        _cpu(output, *inputs)
        me, n = self._rank, output.numel()
        if inputs[me].numel() != n:
            raise ValueError(f"bcl: reduce_scatter: input {me} holds {inputs[me].numel()} "
                             f"elements, this rank's output {n}")
        counts = (ctypes.c_size_t * self._size)(*[i.numel() for i in inputs])
        staged = torch.cat([i.reshape(-1) for i in inputs])
        out, back = _flat(output)
        dt, op = _dtype(output), _op(opts.reduceOp, output)
        return self._queue(
            lambda s: lib.bclReduceScatterv(_ptr(staged), _ptr(out), counts, dt, op, self._comm, s),
            (staged, out, counts, output), back, [output])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _cpu(output, input)
        if output.dtype != input.dtype:
            raise ValueError(f"bcl: all_to_all_single of {input.dtype} into {output.dtype}")
        uneven = any(
            splits and any(s != splits[0] for s in splits)
            for splits in (output_split_sizes, input_split_sizes))
        if not uneven:
            if input.numel() != output.numel() or input.numel() % max(self._size, 1):
                raise ValueError(f"bcl: all_to_all_single needs input and output of {self._size} "
                                 f"equal blocks; got {input.numel()} and {output.numel()} elements")
            out, back = _flat(output)
            inp = input.contiguous()
            n, dt = input.numel() // self._size, _dtype(input)
            return self._queue(lambda s: lib.bclAllToAll(_ptr(inp), _ptr(out), n, dt, self._comm, s),
                               (output, out, inp), back, [output])
        # Uneven splits (along dim 0, as torch counts them): BCL's all-to-all with per-pair
        # counts, queued like the others.
        row = lambda t: t[0].numel() if t.dim() > 1 and t.shape[0] else 1
        ins = [s * row(input) for s in (input_split_sizes or [input.shape[0] // self._size] * self._size)]
        outs = [s * row(output) for s in (output_split_sizes or [output.shape[0] // self._size] * self._size)]
        if sum(ins) != input.numel() or sum(outs) != output.numel():
            raise ValueError(f"bcl: all_to_all_single split sizes {input_split_sizes} / "
                             f"{output_split_sizes} do not cover the tensors")
        out, back = _flat(output)
        inp = input.contiguous()
        return self._alltoallv(inp, ins, out, outs, (output,), back, [output])

    def _alltoallv(self, inp, in_counts, out, out_counts, keep, back, result):
        """Queue BCL's all-to-all with per-pair counts (element counts, packed blocks)."""
        n = self._size
        sc, rc = (ctypes.c_size_t * n)(*in_counts), (ctypes.c_size_t * n)(*out_counts)
        dt = _dtype(inp)
        return self._queue(
            lambda s: lib.bclAllToAllv(_ptr(inp), sc, _ptr(out), rc, dt, self._comm, s),
            (inp, out, sc, rc) + tuple(keep), back, result)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        _cpu(*output_tensors, *input_tensors)
        inp = torch.cat([t.reshape(-1) for t in input_tensors])
        staged = torch.empty(sum(t.numel() for t in output_tensors), dtype=inp.dtype)
        sizes_in = [t.numel() for t in input_tensors]
        sizes_out = [t.numel() for t in output_tensors]

        def back():
            at = 0
            for o in output_tensors:
                o.copy_(staged[at:at + o.numel()].view_as(o))
                at += o.numel()

        if len(set(sizes_in + sizes_out)) > 1:
            return self._alltoallv(inp, sizes_in, staged, sizes_out, (output_tensors,), back,
                                   list(output_tensors))
        n, dt = sizes_in[0], _dtype(inp)
        return self._queue(lambda s: lib.bclAllToAll(_ptr(inp), _ptr(staged), n, dt, self._comm, s),
                           (inp, staged, output_tensors), back, list(output_tensors))

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        (input,) = input_tensors
        root = opts.rootRank
        inp = input.contiguous()
        n, dt = inp.numel(), _dtype(input)
        if self._rank == root:
            (outs,) = output_tensors
            _cpu(input, *outs)
            staged = torch.empty(self._size * n, dtype=input.dtype)

            def back():
                for r, o in enumerate(outs):
                    o.copy_(staged[r * n:(r + 1) * n].view_as(o))

            return self._queue(
                lambda s: lib.bclGather(_ptr(inp), _ptr(staged), n, dt, root, self._comm, s),
                (inp, staged, outs), back, output_tensors)
        _cpu(input)
        return self._queue(
            lambda s: lib.bclGather(_ptr(inp), ctypes.c_void_p(), n, dt, root, self._comm, s),
            (inp,), None, [])

    def gather_single(self, output, input, opts=None):
        opts = opts or dist.GatherOptions()
        root = opts.rootRank
        inp = input.contiguous()
        n, dt = inp.numel(), _dtype(input)
        if self._rank != root:
            return self._queue(
                lambda s: lib.bclGather(_ptr(inp), ctypes.c_void_p(), n, dt, root, self._comm, s),
                (inp,), None, [])
        _same(output, input, self._size * n, "gather_into_tensor")
        out, back = _flat(output)
        return self._queue(
            lambda s: lib.bclGather(_ptr(inp), _ptr(out), n, dt, root, self._comm, s),
            (inp, out, output), back, [output])

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        (output,) = output_tensors
        root = opts.rootRank
        out, back = _flat(output)
        n, dt = out.numel(), _dtype(output)
        if self._rank == root:
            (ins,) = input_tensors
            _cpu(output, *ins)
            staged = torch.cat([i.reshape(-1) for i in ins])
            return self._queue(
                lambda s: lib.bclScatter(_ptr(staged), _ptr(out), n, dt, root, self._comm, s),
                (staged, out, output), back, [output])
        _cpu(output)
        return self._queue(
            lambda s: lib.bclScatter(ctypes.c_void_p(), _ptr(out), n, dt, root, self._comm, s),
            (out, output), back, [output])

    def barrier(self, opts=None):
        return self._queue(lambda s: lib.bclBarrier(self._comm, s), (), None, [])

    # Sends and receives block (BCL's host streams carry collectives only so far), except
    # between torch's _start_coalescing and _end_coalescing (batch_isend_irecv): there they
    # are a BCL group (bclGroupStart/End), run together at its end, so no order deadlocks.
    supports_coalescing = True

    def _get_backend(self, device):
        return self

    def _start_coalescing(self, device):
        self._sync()
        check(lib.bclGroupStart())
        self._grouped = []

    def _end_coalescing(self, device):
        grouped, self._grouped = self._grouped, None
        check(lib.bclGroupEnd())
        for back in grouped:
            back()
        return _Done([])

    def send(self, tensors, dst, tag=0):
        grouped = getattr(self, "_grouped", None)
        if grouped is None:
            self._sync()
        for t in tensors:
            _cpu(t)
            c = t.contiguous()
            if grouped is not None:
                grouped.append(lambda c=c: c)  # keeps a copy alive until the group's end
            check(lib.bclSend(_ptr(c), c.numel(), _dtype(t), dst, self._comm, None))
        return _Done(list(tensors))

    def recv(self, tensors, src, tag=0):
        grouped = getattr(self, "_grouped", None)
        if grouped is None:
            self._sync()
        for t in tensors:
            _cpu(t)
            c, back = _flat(t)
            check(lib.bclRecv(_ptr(c), c.numel(), _dtype(t), src, self._comm, None))
            if grouped is not None:
                grouped.append(back or (lambda c=c: c))
            elif back:
                back()
        return _Done(list(tensors))

    def _sync(self):
        code = lib.bclStreamSynchronize(self._stream)
        if code != _lib.SUCCESS:
            raise _lib.error(code)


def _same(big, small, elems, what):
    if big.numel() != elems or big.dtype != small.dtype:
        raise ValueError(f"bcl: {what}: expected a tensor of {elems} x {small.dtype}, got "
                         f"{big.numel()} x {big.dtype}")


def _create(opts, _backend_options):
    pg = ProcessGroupBCL(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    # torch keeps a ProcessGroup a backend returns as it is: name it as torch names its own
    # (DeviceMesh and FSDP look groups up by name).
    pg._set_group_name(opts.group_id)
    return pg


dist.Backend.register_backend("bcl", _create, extended_api=True, devices=["cpu"])
