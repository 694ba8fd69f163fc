//! Host-buffer operations that return at once: queued for the communicator's progress
//! thread behind the jobs already there, so a caller (a framework's backward pass) computes
//! while the collective runs. The caller hands its buffers over ([`HostStaged`]: the C ABI
//! wraps its pointers, Rust callers give owned vectors, [`HostWork`]) and gets them back, or
//! an error, once the [`Work`] is done. A blocking call made meanwhile waits for the queue
//! first, so every operation of a communicator runs in the order it was called.

use super::Communicator;
use super::checks::{Fit, check_len};
use super::op::Call;
use crate::error::{Error, Result};
use crate::schedule::{AllToAllCounts, Collective};
use crate::work::Work;
use bcl_backends::{DataType, Element, HostStaged, ReduceOp};
use parking_lot::Mutex;
use std::sync::Arc;

impl Communicator {
    /// Queue `collective` on host buffers and return at once. `memory.buffers()` gives the
    /// input (`None`: in place, in the output) and the output, sized as the blocking call
    /// would need them; the progress thread starts once `memory.ready()` says so (a C
    /// caller's host stream uses that to order operations across communicators) and calls
    /// `memory.finish()` when the collective is done, before the [`Work`] completes.
    pub fn submit_host(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        mut memory: Box<dyn HostStaged>,
    ) -> Result<Work> {
        let (input, output) = memory.buffers();
        let (input, output) = (input.map(<[u8]>::len), output.map(|o| o.len()));
        let need = self.check_call(collective, count, dtype, input.is_none())?;
        check_len("send buffer", input, need.0, Fit::Exact)?;
        check_len("receive buffer", output, need.1, Fit::Exact)?;
        let call = Call {
            collective,
            count,
            dtype,
            on_device: false,
            counts: None,
        };
        self.queue_host(call, memory)
    }

    /// [`Communicator::submit_host`] for a collective with per-rank counts
    /// ([`Communicator::run_host_v`]): `memory` gives the packed send and receive buffers.
    pub fn submit_host_v(
        &self,
        collective: Collective,
        counts: AllToAllCounts,
        dtype: DataType,
        mut memory: Box<dyn HostStaged>,
    ) -> Result<Work> {
        let (input, output) = memory.buffers();
        let (input, output) = (input.map(<[u8]>::len), output.map(|o| o.len()));
        let need = self.check_call_v(collective, &counts, dtype)?;
        check_len("send buffer", input.or(Some(0)), need.0, Fit::Exact)?;
        check_len("receive buffer", output.or(Some(0)), need.1, Fit::Exact)?;
        let call = Call {
            collective,
            count: need.0.unwrap_or(0) / dtype.size(),
            dtype,
            on_device: false,
            counts: Some(Arc::new(counts)),
        };
        self.queue_host(call, memory)
    }

    /// [`Communicator::submit_host`] on owned vectors: `output` (and `input`, out of place)
    /// are BCL's until the returned [`HostWork`] gives `output` back.
    pub fn submit_host_vec<T: Element>(
        &self,
        collective: Collective,
        count: usize,
        input: Option<Vec<T>>,
        output: Vec<T>,
    ) -> Result<HostWork<T>> {
        let back = Arc::new(Mutex::new(None));
        let owned = Owned {
            input,
            output: Some(output),
            back: back.clone(),
        };
        let work = self.submit_host(collective, count, T::DATA_TYPE, Box::new(owned))?;
        Ok(HostWork { work, back })
    }

    /// `buf = op over ranks of buf`, returning at once (the asynchronous
    /// [`Communicator::all_reduce_in_place`]).
    pub fn all_reduce_async<T: Element>(&self, buf: Vec<T>, op: ReduceOp) -> Result<HostWork<T>> {
        let count = buf.len();
        self.submit_host_vec(Collective::AllReduce { op }, count, None, buf)
    }
}

/// A host operation in flight on buffers BCL holds until it is done.
#[must_use = "the buffer, and the operation's errors, come back through wait()"]
#[derive(Debug)]
pub struct HostWork<T> {
    work: Work,
    back: Arc<Mutex<Option<Vec<T>>>>,
}

impl<T> HostWork<T> {
    /// Whether the operation has finished (successfully or not).
    pub fn test(&self) -> bool {
        self.work.test()
    }

    /// Wait for the operation; its output buffer, or its error.
    pub fn wait(self) -> Result<Vec<T>> {
        self.work.wait()?;
        self.back
            .lock()
            .take()
            .ok_or_else(|| Error::Internal("a finished host operation kept its buffer".into()))
    }
}

/// Owned vectors as the buffers of a queued host operation.
#[derive(Debug)]
struct Owned<T> {
    input: Option<Vec<T>>,
    output: Option<Vec<T>>,
    back: Arc<Mutex<Option<Vec<T>>>>,
}

impl<T: Element> HostStaged for Owned<T> {
    fn ready(&self) -> bool {
        true
    }

    fn buffers(&mut self) -> (Option<&[u8]>, Option<&mut [u8]>) {
        let input = self.input.as_deref().map(bytemuck::cast_slice);
        let output = self.output.as_deref_mut().map(bytemuck::cast_slice_mut);
        (input, output)
    }

    fn finish(mut self: Box<Self>) {
        *self.back.lock() = self.output.take();
    }
}
