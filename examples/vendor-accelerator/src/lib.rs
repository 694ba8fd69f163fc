//! A vendor's accelerator, implemented outside BCL's crates against `bcl-core`'s public API
//! and passed in with [`bcl_core::CommBuilder::accelerator`]: nothing of BCL is edited.
//!
//! The device is unlike BCL's own backends in the two ways that matter to the core:
//! * its memory is **paged**: a buffer is a list of 4 KiB pages behind a handle, so a range
//!   is never one host slice (BCL must go through the trait for every byte);
//! * its streams **run ahead of the host**: copies in, reductions and divisions are queued to
//!   a worker thread and the calls return at once; events complete when the worker has reached
//!   them, and only `synchronize` (or a copy out, which waits for its turn) blocks.
//!
//! ```text
//!   bcl-core executor ──► PagedDevice (Accelerator) ──enqueue──► worker thread ──► pages
//!                              │ copy_to_host / synchronize wait for the queue to drain
//! ```

use bcl_core::backends::kernels;
use bcl_core::backends::{
    Accelerator, BufferOwner, DataType, DeviceBuffer, DeviceCapabilities, DeviceError, DeviceInfo,
    DeviceSlice, Event, ReduceOp, Stream, Vendor, check_lengths, new_device_uid,
};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Bytes per page of device memory.
pub const PAGE: usize = 4096;

/// The device's memory: pages by buffer handle.
#[derive(Default)]
struct Pages {
    buffers: Mutex<HashMap<u64, Vec<Box<[u8]>>>>,
}

impl Pages {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Vec<Box<[u8]>>>> {
        self.buffers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes `offset..offset + out.len()` of buffer `id`, gathered from its pages.
    fn read(&self, id: u64, offset: usize, out: &mut [u8]) {
        let buffers = self.lock();
        let Some(pages) = buffers.get(&id) else {
            return;
        };
        for (i, byte) in out.iter_mut().enumerate() {
            let at = offset + i;
            *byte = pages[at / PAGE][at % PAGE];
        }
    }

    /// Scatter `data` into buffer `id` at `offset`.
    fn write(&self, id: u64, offset: usize, data: &[u8]) {
        let mut buffers = self.lock();
        let Some(pages) = buffers.get_mut(&id) else {
            return;
        };
        for (i, byte) in data.iter().enumerate() {
            let at = offset + i;
            pages[at / PAGE][at % PAGE] = *byte;
        }
    }
}

impl BufferOwner for Pages {
    fn release(&self, id: u64) {
        self.lock().remove(&id);
    }
}

/// One queued operation. Ranges were checked when it was queued, so it cannot fail.
enum Job {
    Write {
        id: u64,
        offset: usize,
        data: Vec<u8>,
    },
    Copy {
        dst: (u64, usize),
        src: (u64, usize),
        len: usize,
    },
    Reduce {
        id: u64,
        offset: usize,
        data: Vec<u8>,
        dtype: DataType,
        op: ReduceOp,
    },
    Divide {
        id: u64,
        offset: usize,
        len: usize,
        dtype: DataType,
        divisor: usize,
    },
}

/// The work queue of all streams (one worker: stronger ordering than streams need, which
/// the trait allows).
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// Jobs queued so far, and jobs done so far: an event is the count queued before it.
    queued: u64,
    done: u64,
    stop: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, job: Job) {
        let mut s = self.lock();
        s.jobs.push_back(job);
        s.queued += 1;
        self.changed.notify_all();
    }

    /// Block until every job queued so far is done.
    fn drain(&self) {
        let mut s = self.lock();
        let target = s.queued;
        while s.done < target {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The worker: runs queued jobs in order until told to stop.
fn work(queue: Arc<Queue>, pages: Arc<Pages>) {
    loop {
        let job = {
            let mut s = queue.lock();
            loop {
                if let Some(job) = s.jobs.pop_front() {
                    break job;
                }
                if s.stop {
                    return;
                }
                s = queue.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        match job {
            Job::Write { id, offset, data } => pages.write(id, offset, &data),
            Job::Copy { dst, src, len } => {
                let mut staged = vec![0u8; len];
                pages.read(src.0, src.1, &mut staged);
                pages.write(dst.0, dst.1, &staged);
            }
            Job::Reduce {
                id,
                offset,
                data,
                dtype,
                op,
            } => {
                let mut current = vec![0u8; data.len()];
                pages.read(id, offset, &mut current);
                // Lengths and element counts were checked when the job was queued.
                if kernels::reduce_bytes(&mut current, &data, dtype, op).is_ok() {
                    pages.write(id, offset, &current);
                }
            }
            Job::Divide {
                id,
                offset,
                len,
                dtype,
                divisor,
            } => {
                let mut current = vec![0u8; len];
                pages.read(id, offset, &mut current);
                if kernels::divide_bytes(&mut current, dtype, divisor).is_ok() {
                    pages.write(id, offset, &current);
                }
            }
        }
        let mut s = queue.lock();
        s.done += 1;
        queue.changed.notify_all();
    }
}

/// A paged device whose streams run ahead of the host.
pub struct PagedDevice {
    info: DeviceInfo,
    uid: u64,
    pages: Arc<Pages>,
    queue: Arc<Queue>,
    next_id: AtomicU64,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for PagedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PagedDevice({})", self.info)
    }
}

impl PagedDevice {
    pub fn new(index: u32) -> Result<Self, DeviceError> {
        let (pages, queue) = (Arc::new(Pages::default()), Arc::new(Queue::default()));
        let worker = {
            let (pages, queue) = (pages.clone(), queue.clone());
            std::thread::Builder::new()
                .name(format!("paged-{index}"))
                .spawn(move || work(queue, pages))
                .map_err(|e| DeviceError::Unavailable(format!("no worker thread: {e}")))?
        };
        Ok(PagedDevice {
            info: DeviceInfo {
                vendor: Vendor::Other("paged".into()),
                model: format!("paged device {index} ({PAGE} B pages, asynchronous streams)"),
                index,
                host_id: bcl_core::backends::host::host_identity(),
                capabilities: DeviceCapabilities::default(),
            },
            uid: new_device_uid(),
            pages,
            queue,
            next_id: AtomicU64::new(1),
            worker: Some(worker),
        })
    }

    fn name(&self) -> String {
        self.info.to_string()
    }

    /// The (handle, offset) of `s`, checked against its buffer.
    fn range(&self, s: &DeviceSlice<'_>) -> Result<(u64, usize), DeviceError> {
        let range = s.checked(self.uid, &self.info)?;
        Ok((s.buffer.id(), range.start))
    }

    fn check_stream(&self, stream: &Stream) -> Result<(), DeviceError> {
        if stream.device_uid() == self.uid {
            return Ok(());
        }
        Err(DeviceError::ForeignHandle {
            device: self.name(),
            what: "stream",
        })
    }

    fn check_lengths(
        &self,
        dst: usize,
        src: usize,
        dtype: Option<DataType>,
    ) -> Result<(), DeviceError> {
        check_lengths(&self.info, dst, src, dtype)
    }
}

impl Drop for PagedDevice {
    fn drop(&mut self) {
        self.queue.lock().stop = true;
        self.queue.changed.notify_all();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Accelerator for PagedDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn allocate(&self, len: usize) -> Result<DeviceBuffer, DeviceError> {
        let pages = len.div_ceil(PAGE);
        let mut memory = Vec::new();
        memory
            .try_reserve_exact(pages)
            .map_err(|e| DeviceError::OutOfMemory {
                device: self.name(),
                bytes: len,
                reason: e.to_string(),
            })?;
        memory.extend((0..pages).map(|_| vec![0u8; PAGE].into_boxed_slice()));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pages.lock().insert(id, memory);
        let owner: Arc<dyn BufferOwner> = self.pages.clone();
        Ok(DeviceBuffer::new(id, len, self.uid, owner))
    }

    fn default_stream(&self) -> Stream {
        Stream::new(self.uid, 0)
    }

    fn create_stream(&self) -> Result<Stream, DeviceError> {
        Ok(Stream::new(
            self.uid,
            self.next_id.fetch_add(1, Ordering::Relaxed),
        ))
    }

    fn copy_to_device(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (id, offset) = self.range(&dst)?;
        self.check_stream(stream)?;
        self.check_lengths(dst.len, src.len(), None)?;
        // `src` may be reused once this returns: the queued job owns a copy.
        self.queue.push(Job::Write {
            id,
            offset,
            data: src.to_vec(),
        });
        Ok(())
    }

    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (id, offset) = self.range(&src)?;
        self.check_stream(stream)?;
        self.check_lengths(dst.len(), src.len, None)?;
        // The copy's turn on the stream comes once what is queued before it is done.
        self.queue.drain();
        self.pages.read(id, offset, dst);
        Ok(())
    }

    fn copy_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (d, s) = (self.range(&dst)?, self.range(&src)?);
        self.check_stream(stream)?;
        self.check_lengths(dst.len, src.len, None)?;
        self.queue.push(Job::Copy {
            dst: d,
            src: s,
            len: dst.len,
        });
        Ok(())
    }

    fn reduce_from_host(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (id, offset) = self.range(&dst)?;
        self.check_stream(stream)?;
        self.check_lengths(dst.len, src.len(), Some(dtype))?;
        self.queue.push(Job::Reduce {
            id,
            offset,
            data: src.to_vec(),
            dtype,
            op,
        });
        Ok(())
    }

    fn divide(
        &self,
        dst: DeviceSlice<'_>,
        dtype: DataType,
        divisor: usize,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let (id, offset) = self.range(&dst)?;
        self.check_stream(stream)?;
        self.check_lengths(dst.len, dst.len, Some(dtype))?;
        self.queue.push(Job::Divide {
            id,
            offset,
            len: dst.len,
            dtype,
            divisor,
        });
        Ok(())
    }

    fn record_event(&self, stream: &Stream) -> Result<Event, DeviceError> {
        self.check_stream(stream)?;
        Ok(Event::new(self.uid, self.queue.lock().queued))
    }

    fn event_complete(&self, event: &Event) -> Result<bool, DeviceError> {
        if event.device_uid() != self.uid {
            return Err(DeviceError::ForeignHandle {
                device: self.name(),
                what: "event",
            });
        }
        Ok(self.queue.lock().done >= event.id())
    }

    fn synchronize(&self, stream: &Stream) -> Result<(), DeviceError> {
        self.check_stream(stream)?;
        self.queue.drain();
        Ok(())
    }
}
