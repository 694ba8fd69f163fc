//! The device-buffer API: operations enqueued for the communicator's progress thread, which
//! runs them in call order and completes their [`Work`] handles.

use super::checks::{Fit, check_len};
use super::errors::device_error;
use super::op::{Call, run};
use super::{Communicator, Shared};
use crate::error::{Error, Result};
use crate::exec::{Bindings, Memory};
use crate::schedule::Collective;
use crate::work::{Work, WorkState};
use bcl_backends::{
    DataType, DeviceBuffer, DeviceError, Event, HostStaged, ReduceOp, Stream, StreamHold,
};
use crossbeam::channel::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An operation queued for the progress thread.
pub(super) struct DeviceJob {
    call: Call,
    memory: JobMemory,
    work: Arc<WorkState>,
}

/// Where a queued job's data lives.
enum JobMemory {
    /// Device buffers, reached through the accelerator on its own stream.
    Device {
        input: Option<DeviceBuffer>,
        output: Option<DeviceBuffer>,
        /// The end of the work the caller enqueued on its stream before this job: the job
        /// starts once the device has reached it.
        after: Option<Event>,
        /// Holds the caller's stream until the job is done (released when dropped).
        hold: Option<StreamHold>,
    },
    /// Host mirrors of the device buffers that the caller's stream fills and drains
    /// (`Accelerator::stage_through_host`): the progress thread makes no device calls.
    Staged(Box<dyn HostStaged>),
}

/// How a device-buffer call is queued.
#[derive(Clone, Copy)]
enum Queue<'a> {
    /// On the device's own stream, now.
    Now,
    /// After the work already on the caller's stream, which waits for it.
    OnStream(&'a Stream),
    /// As `OnStream`, through host mirrors.
    Staged(&'a Stream),
}

impl Communicator {
    /// Enqueue `collective` over device buffers of this rank's device; `input: None` means
    /// in place on `output`. Buffers are held until the work completes.
    pub fn submit(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
    ) -> Result<Work> {
        self.enqueue(collective, count, dtype, input, output, Queue::Now)
    }

    /// Enqueue `collective` on a stream of this rank's device, as NCCL does: it starts after
    /// the work already enqueued on `stream`, and the stream's later work waits for it, while
    /// this call returns at once. The returned [`Work`] says when it is done (and its error).
    /// On the cuda backend the stream waits on the GPU (a stream memory operation on a
    /// host-mapped flag that the progress thread sets); the cpu and sim backends finish their
    /// streams' work as it is enqueued, so nothing waits there.
    ///
    /// While such a collective runs, do not block a host thread in a CUDA call on `stream`
    /// (`cudaStreamSynchronize`, a pageable `cudaMemcpy`): measured on an H200, the progress
    /// thread's own CUDA calls then stall behind it and the collective never finishes. Wait
    /// for the [`Work`] first, or use [`Communicator::submit_staged`].
    pub fn submit_on(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
        stream: &Stream,
    ) -> Result<Work> {
        self.enqueue(
            collective,
            count,
            dtype,
            input,
            output,
            Queue::OnStream(stream),
        )
    }

    /// Enqueue `collective` on a caller's stream through host memory: the stream copies the
    /// device input into pinned host memory and signals the progress thread, which runs the
    /// collective there (host kernels) and signals back; the stream then copies the result
    /// into `output`. Starts after the stream's earlier work, the stream's later work follows
    /// it, the call returns at once, and the progress thread makes no device calls, so the
    /// caller may block on the stream (`cudaStreamSynchronize`) at once. What the C ABI does
    /// for cuda communicators.
    pub fn submit_staged(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
        stream: &Stream,
    ) -> Result<Work> {
        self.enqueue(
            collective,
            count,
            dtype,
            input,
            output,
            Queue::Staged(stream),
        )
    }

    /// `output = op over ranks of input` on device buffers.
    pub fn all_reduce_device(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Work> {
        self.submit(
            Collective::AllReduce { op },
            count,
            dtype,
            Some(input),
            Some(output),
        )
    }

    /// Check a device-buffer call, build its job and queue it for the progress thread.
    fn enqueue(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
        queue: Queue<'_>,
    ) -> Result<Work> {
        let need = self.check_call(collective, count, dtype, input.is_none())?;
        check_len("input", input.map(DeviceBuffer::len), need.0, Fit::AtLeast)?;
        check_len(
            "output",
            output.map(DeviceBuffer::len),
            need.1,
            Fit::AtLeast,
        )?;
        let acc = &self.shared.accelerator;
        let failed = |e| device_error(&self.shared, e);
        let (after, hold) = match queue {
            Queue::OnStream(stream) => (
                Some(acc.record_event(stream).map_err(failed)?),
                Some(acc.hold_stream(stream).map_err(failed)?),
            ),
            Queue::Now | Queue::Staged(_) => (None, None),
        };
        let memory = match queue {
            Queue::Staged(stream) => JobMemory::Staged(
                acc.stage_through_host(
                    input.zip(need.0).map(|(b, n)| b.slice(0, n)),
                    output.zip(need.1).map(|(b, n)| b.slice(0, n)),
                    stream,
                )
                .map_err(failed)?,
            ),
            Queue::Now | Queue::OnStream(_) => JobMemory::Device {
                input: input.cloned(),
                output: output.cloned(),
                after,
                hold,
            },
        };
        let call = Call {
            collective,
            count,
            dtype,
            on_device: true,
            counts: None,
        };
        self.queue_job(call, memory)
    }

    /// Queue host buffers for the progress thread (the host-buffer operations that return
    /// at once, `host_async.rs`): they run after the jobs already queued.
    pub(super) fn queue_host(&self, call: Call, memory: Box<dyn HostStaged>) -> Result<Work> {
        self.queue_job(call, JobMemory::Staged(memory))
    }

    fn queue_job(&self, call: Call, memory: JobMemory) -> Result<Work> {
        let Call {
            collective,
            count,
            dtype,
            ..
        } = call;
        let work = Arc::new(WorkState::default());
        let job = DeviceJob {
            call,
            memory,
            work: work.clone(),
        };
        *self.shared.queued.lock() += 1;
        let sent = self.jobs.as_ref().map(|j| j.send(job));
        if !matches!(sent, Some(Ok(()))) {
            *self.shared.queued.lock() -= 1;
            return Err(Error::Internal("the progress thread is gone".into()));
        }
        Ok(Work {
            state: work,
            description: format!("{collective} of {count} x {dtype}"),
        })
    }

    /// Block until the device jobs enqueued before this call are done (call order).
    pub(super) fn wait_for_queued_work(&self) {
        let mut q = self.shared.queued.lock();
        while *q > 0 {
            self.shared.drained.wait(&mut q);
        }
    }
}

/// The progress thread: run queued jobs in order until the communicator goes.
pub(super) fn progress_loop(shared: Arc<Shared>, jobs: Receiver<DeviceJob>) {
    while let Ok(job) = jobs.recv() {
        let DeviceJob { call, memory, work } = job;
        let poisoned = shared.async_error().map(Error::Poisoned);
        let result = match memory {
            JobMemory::Staged(mut staged) => {
                let result = match poisoned {
                    Some(e) => Err(e),
                    None => run_staged(&shared, call, staged.as_mut()),
                };
                // Let the caller's stream go on (also after an error: never wait for ever).
                staged.finish();
                result
            }
            device => {
                let result = match poisoned {
                    Some(e) => Err(e),
                    None => run_on_device(&shared, call, &device),
                };
                // Let the caller's stream go on (dropping the hold would too).
                if let JobMemory::Device {
                    hold: Some(hold), ..
                } = device
                {
                    hold.release();
                }
                result
            }
        };
        work.complete(result);
        let mut q = shared.queued.lock();
        *q -= 1;
        if *q == 0 {
            shared.drained.notify_all();
        }
    }
}

/// Run a job whose buffers are device memory, on the device's own stream.
fn run_on_device(shared: &Shared, call: Call, memory: &JobMemory) -> Result<()> {
    let JobMemory::Device {
        input,
        output,
        after,
        ..
    } = memory
    else {
        return Err(Error::Internal(
            "a staged job reached the device path".into(),
        ));
    };
    let acc = &shared.accelerator;
    if let Some(event) = after {
        wait_for_caller_stream(shared, || {
            acc.event_complete(event)
                .map_err(|e| device_error(shared, e))
        })?;
    }
    let bindings = Bindings {
        input: input.as_ref().map(Memory::Device),
        output: output.as_ref().map(Memory::Device),
        scratch: None,
    };
    run(shared, &mut shared.engine.lock(), call, bindings)?;
    // The last steps may still run on the device: done means done there.
    acc.synchronize(&acc.default_stream())
        .map_err(|e| device_error(shared, e))
}

/// Run a job staged through host memory: no device calls on this thread.
fn run_staged(shared: &Shared, call: Call, staged: &mut dyn HostStaged) -> Result<()> {
    wait_for_caller_stream(shared, || Ok(staged.ready()))?;
    let (input, output) = staged.buffers();
    let bindings = Bindings {
        input: input.map(Memory::HostRead),
        output: output.map(Memory::HostWrite),
        scratch: None,
    };
    let call = Call {
        on_device: false,
        ..call
    };
    run(shared, &mut shared.engine.lock(), call, bindings)
}

/// Wait (polling with backoff, bounded by the operation timeout) until the work the caller
/// enqueued on its stream before this job is done, as `reached` tells.
fn wait_for_caller_stream(
    shared: &Shared,
    mut reached: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let timeout = shared.op_timeout();
    let started = Instant::now();
    let mut pause = Duration::from_micros(1);
    while !reached()? {
        if started.elapsed() > timeout {
            let what = format!(
                "the work enqueued on the caller's stream before this collective did not \
                 finish within {timeout:?}"
            );
            let device = shared.accelerator.info().to_string();
            return Err(device_error(shared, DeviceError::Stalled { device, what }));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_micros(100));
    }
    Ok(())
}
