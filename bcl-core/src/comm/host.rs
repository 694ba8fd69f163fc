//! The typed host-slice API: blocking calls on the caller's memory, driven on the caller's
//! thread once earlier enqueued device work has drained (call order).

use super::Communicator;
use super::checks::{Fit, check_len};
use super::op::{Call, run};
use crate::error::Result;
use crate::exec::{Bindings, Memory};
use crate::schedule::{AllToAllCounts, Collective};
use bcl_backends::{DataType, Element, ReduceOp};
use std::sync::Arc;

impl Communicator {
    /// `recv[i] = op over ranks of send[i]`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.run_host(
            Collective::AllReduce { op },
            send.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.run_host(
            Collective::AllReduce { op },
            buf.len(),
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` (world × send.len()) gets every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.run_host(
            Collective::AllGather,
            send.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    /// In place: this rank's contribution is already at `buf[rank*count..]`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len())?;
        self.run_host(
            Collective::AllGather,
            count,
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` gets block `rank` of the reduction of every rank's `send` (world × recv.len()).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.run_host(
            Collective::ReduceScatter { op },
            recv.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    /// In place: the result lands in `buf[rank*count..(rank+1)*count]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.per_rank(buf.len())?;
        self.run_host(
            Collective::ReduceScatter { op },
            count,
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` on every rank gets `send` of `root` (`send` is read on the root only).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.run_host(
            Collective::Broadcast { root },
            recv.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.run_host(
            Collective::Broadcast { root },
            buf.len(),
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` on `root` gets the reduction of every rank's `send`; other ranks' `recv` is not
    /// touched (it may be empty).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let output = (self.rank() == root).then(|| bytes_mut(recv));
        self.run_host(
            Collective::Reduce { op, root },
            send.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            output,
        )
    }

    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.run_host(
            Collective::Reduce { op, root },
            buf.len(),
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// Block j of `send` goes to rank j; block j of `recv` comes from rank j.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.per_rank(send.len())?;
        self.run_host(
            Collective::AllToAll,
            count,
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len())?;
        self.run_host(
            Collective::AllToAll,
            count,
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` on `root` (world × send.len()) gets every rank's `send`, in rank order; other
    /// ranks' `recv` is not touched (it may be empty).
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let output = (self.rank() == root).then(|| bytes_mut(recv));
        self.run_host(
            Collective::Gather { root },
            send.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            output,
        )
    }

    /// In place: on `root`, `buf` (world × count) already holds its own block at
    /// `root*count`; on the others `buf` is the count elements they send.
    pub fn gather_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let count = if self.rank() == root {
            self.per_rank(buf.len())?
        } else {
            buf.len()
        };
        self.run_host(
            Collective::Gather { root },
            count,
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` (count elements) on every rank gets block `rank` of `root`'s `send` (world ×
    /// recv.len()); `send` is read on the root only (it may be empty elsewhere).
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let input = (self.rank() == root).then(|| bytes(send));
        self.run_host(
            Collective::Scatter { root },
            recv.len(),
            T::DATA_TYPE,
            input,
            Some(bytes_mut(recv)),
        )
    }

    /// In place: on `root`, `buf` is the whole world × count buffer and keeps its own block
    /// at `root*count`; on the others `buf` receives the count elements.
    pub fn scatter_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let count = if self.rank() == root {
            self.per_rank(buf.len())?
        } else {
            buf.len()
        };
        self.run_host(
            Collective::Scatter { root },
            count,
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// All-to-all with a count per pair: `send` holds the blocks for ranks 0, 1, ... packed
    /// in rank order (`send_counts[j]` elements for rank j), `recv` the blocks from them
    /// (`recv_counts[j]` from rank j). Rank j's `recv_counts[me]` must equal this rank's
    /// `send_counts[j]`; a difference fails on rank j as a size mismatch.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let counts = AllToAllCounts {
            send: send_counts.to_vec(),
            recv: recv_counts.to_vec(),
        };
        self.run_host_v(
            Collective::AllToAllV,
            counts,
            T::DATA_TYPE,
            bytes(send),
            bytes_mut(recv),
        )
    }

    /// All-gather with a count per rank: rank r contributes `counts[r]` elements (this
    /// rank's `send` is `counts[me]` long); `recv` gets them all, packed in rank order.
    pub fn all_gather_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<()> {
        let mine = counts.get(self.rank()).copied().unwrap_or(0);
        let counts = AllToAllCounts {
            send: vec![mine; counts.len()],
            recv: counts.to_vec(),
        };
        self.run_host_v(
            Collective::AllGatherV,
            counts,
            T::DATA_TYPE,
            bytes(send),
            bytes_mut(recv),
        )
    }

    /// Reduce-scatter with a count per rank: `send` holds a block for each rank, packed in
    /// rank order (`counts[r]` elements for rank r); `recv` (`counts[me]` long) gets the
    /// reduction over ranks of this rank's block.
    pub fn reduce_scatter_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        let mine = counts.get(self.rank()).copied().unwrap_or(0);
        let counts = AllToAllCounts {
            send: counts.to_vec(),
            recv: vec![mine; counts.len()],
        };
        self.run_host_v(
            Collective::ReduceScatterV { op },
            counts,
            T::DATA_TYPE,
            bytes(send),
            bytes_mut(recv),
        )
    }

    /// The untyped collectives with per-rank counts ([`Communicator::all_to_all_v`],
    /// [`Communicator::all_gather_v`], [`Communicator::reduce_scatter_v`], and the C ABI's
    /// `bclAllToAllv`, `bclAllGatherv`, `bclReduceScatterv`).
    pub fn run_host_v(
        &self,
        collective: Collective,
        counts: AllToAllCounts,
        dtype: DataType,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<()> {
        let need = self.check_call_v(collective, &counts, dtype)?;
        check_len("send buffer", Some(input.len()), need.0, Fit::Exact)?;
        check_len("receive buffer", Some(output.len()), need.1, Fit::Exact)?;
        self.wait_for_queued_work();
        let bindings = Bindings {
            input: Some(Memory::HostRead(input)),
            output: Some(Memory::HostWrite(output)),
            scratch: None,
        };
        let call = Call {
            collective,
            count: need.0.unwrap_or(0) / dtype.size(),
            dtype,
            on_device: false,
            counts: Some(Arc::new(counts)),
        };
        run(&self.shared, &mut self.shared.engine.lock(), call, bindings)
    }

    /// Send `data` to `peer`, which must call [`Communicator::recv`] with the same count.
    pub fn send<T: Element>(&self, data: &[T], peer: usize) -> Result<()> {
        self.run_host(
            Collective::Send { peer },
            data.len(),
            T::DATA_TYPE,
            Some(bytes(data)),
            None,
        )
    }

    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.run_host(
            Collective::Recv { peer },
            buf.len(),
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.run_host(Collective::Barrier, 0, DataType::Uint8, None, None)
    }

    /// The untyped blocking call behind the typed methods (and the C ABI): `count` as NCCL
    /// counts it for `collective`, `input: None` for in place (the input is in `output`).
    /// Buffer lengths are checked against what the call needs.
    pub fn run_host(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&[u8]>,
        output: Option<&mut [u8]>,
    ) -> Result<()> {
        let need = self.check_call(collective, count, dtype, input.is_none())?;
        check_len("send buffer", input.map(<[u8]>::len), need.0, Fit::Exact)?;
        let out_len = output.as_ref().map(|o| o.len());
        check_len("receive buffer", out_len, need.1, Fit::Exact)?;
        self.wait_for_queued_work();
        let bindings = Bindings {
            input: input.map(Memory::HostRead),
            output: output.map(Memory::HostWrite),
            scratch: None,
        };
        let call = Call {
            collective,
            count,
            dtype,
            on_device: false,
            counts: None,
        };
        run(&self.shared, &mut self.shared.engine.lock(), call, bindings)
    }
}

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}
