//! The `Accelerator` trait: everything the collectives core may do to a device.
//!
//! The shape follows CUDA's driver API (as cudarc exposes it) so that a GPU backend fits
//! without a rewrite:
//! * every data operation names a [`Stream`] and is ordered on it; [`Accelerator::record_event`]
//!   and [`Accelerator::event_complete`] let the executor poll for completion instead of
//!   blocking, and [`Accelerator::synchronize`] waits;
//! * device memory is reached only through [`DeviceBuffer`] handles: the executor never
//!   dereferences it;
//! * host slices passed in may be reused as soon as the call returns (a GPU backend stages
//!   them through pinned memory it owns); host slices written by a device-to-host copy hold
//!   their data once the stream reaches the copy (the cpu and sim backends complete every
//!   operation before returning, so their events are complete at once).

use crate::dtype::{DataType, ReduceOp};
use crate::kernels::KernelError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;

/// Who made the device.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Vendor {
    /// The host CPU: the reference backend.
    Cpu,
    /// The simulated second vendor.
    Sim,
    /// NVIDIA, through CUDA.
    Nvidia,
    /// A backend outside BCL's crates, by the name it gives itself: a device plugin
    /// (`include/bcl_device_plugin.h`), or an `Accelerator` passed in from Rust.
    Other(String),
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Vendor::Cpu => "cpu",
            Vendor::Sim => "sim",
            Vendor::Nvidia => "cuda",
            Vendor::Other(name) => name,
        })
    }
}

/// What a device can do, declared rather than guessed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceCapabilities {
    /// Host code may read device memory directly (false for sim and GPUs).
    pub host_addressable: bool,
    /// Callers outside BCL name this device's memory by address (a C caller's device
    /// pointer, through [`Accelerator::borrow_memory`]) and order work by their own streams
    /// ([`Accelerator::borrow_stream`]): true for cuda. Where false, the C ABI passes host
    /// memory for every device.
    #[serde(default)]
    pub external_memory: bool,
    /// Copy bandwidth host↔device in GB/s, when the backend knows it.
    pub copy_gbps: Option<f64>,
    /// Reduce throughput in GB/s of destination bytes, when the backend knows it.
    pub reduce_gbps: Option<f64>,
}

/// A description of one device, exchanged with every other rank at bootstrap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub vendor: Vendor,
    /// Model name, e.g. "host cpu (2 cores)" or "sim copy=8GB/s reduce=4GB/s".
    pub model: String,
    /// Index of the device among its vendor's devices on this host.
    pub index: u32,
    /// [`crate::host::host_identity`] of the host the device is attached to.
    pub host_id: String,
    pub capabilities: DeviceCapabilities,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.vendor, self.index)
    }
}

/// A device operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The caller asked for a range outside a buffer: a caller bug.
    #[error("range {offset}..{end} is outside device buffer of {len} bytes on {device}")]
    OutOfRange {
        device: String,
        offset: usize,
        end: usize,
        len: usize,
    },
    /// A buffer, stream or event of one device was passed to another device.
    #[error("{what} belongs to another device than {device}")]
    ForeignHandle { device: String, what: &'static str },
    /// Host and device lengths or element boundaries disagree.
    #[error("on {device}: {source}")]
    Kernel {
        device: String,
        #[source]
        source: KernelError,
    },
    /// The device could not allocate.
    #[error("{device} cannot allocate {bytes} bytes: {reason}")]
    OutOfMemory {
        device: String,
        bytes: usize,
        reason: String,
    },
    /// The backend is not usable on this machine (e.g. no driver).
    #[error("device backend unavailable: {0}")]
    Unavailable(String),
    /// The device specification text could not be parsed.
    #[error("bad device spec '{spec}': {reason}")]
    BadSpec { spec: String, reason: String },
    /// A caller's pointer does not name memory of this device.
    #[error("{device}: {len} bytes at {address:#x} are not memory of this device: {reason}")]
    NotDeviceMemory {
        device: String,
        address: u64,
        len: usize,
        reason: String,
    },
    /// Device work the caller enqueued did not finish in time.
    #[error("{device}: {what}")]
    Stalled { device: String, what: String },
    /// The vendor's driver refused a call.
    #[error("{device}: {call} failed: {reason}")]
    Driver {
        device: String,
        call: &'static str,
        reason: String,
    },
}

/// One collective staged through host memory by [`Accelerator::stage_through_host`]. Its
/// methods make no device calls: the thread that runs the collective only polls host memory.
pub trait HostStaged: Send + fmt::Debug {
    /// Whether the stream has filled the mirrors (never blocks).
    fn ready(&self) -> bool;
    /// The mirrors, once ready: the input (out of place) and the output (the in-place
    /// buffer), as the collective reads and writes them.
    fn buffers(&mut self) -> (Option<&[u8]>, Option<&mut [u8]>);
    /// Let the stream go on and upload the output mirror (dropping does it too, so an error
    /// never leaves the stream waiting).
    fn finish(self: Box<Self>);
}

/// Device bytes on their way into host memory the backend owns (see
/// [`Accelerator::start_download`]). Dropping it gives the memory back.
pub trait Download: Send + fmt::Debug {
    /// Whether the bytes have landed (never blocks).
    fn ready(&self) -> Result<bool, DeviceError>;
    /// The bytes, once `ready` said so.
    fn bytes(&self) -> &[u8];
}

/// A wait enqueued on a stream by [`Accelerator::hold_stream`]: the stream's later work runs
/// only once the hold is released. Dropping the hold releases it, so an operation that fails
/// or panics never leaves the caller's stream waiting for ever.
pub struct StreamHold {
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl fmt::Debug for StreamHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamHold")
            .field("held", &self.release.is_some())
            .finish()
    }
}

impl StreamHold {
    /// A hold with nothing to release (backends whose streams never run ahead of the host).
    pub fn none() -> Self {
        StreamHold { release: None }
    }

    /// A hold that runs `release` once, when released or dropped.
    pub fn new(release: impl FnOnce() + Send + 'static) -> Self {
        StreamHold {
            release: Some(Box::new(release)),
        }
    }

    /// Let the stream go on.
    pub fn release(mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}

impl Drop for StreamHold {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}

static NEXT_DEVICE_UID: AtomicU64 = AtomicU64::new(1);

/// A process-unique number for a new device: every handle the device hands out (buffers,
/// streams, events) carries it, so that a handle of one device passed to another is caught.
pub fn new_device_uid() -> u64 {
    NEXT_DEVICE_UID.fetch_add(1, Ordering::Relaxed)
}

/// Frees a buffer when its last handle is dropped (implemented by each backend).
pub trait BufferOwner: Send + Sync {
    /// The buffer `id` has no handle left: give its memory back.
    fn release(&self, id: u64);
}

struct BufferInner {
    id: u64,
    len: usize,
    device_uid: u64,
    owner: Arc<dyn BufferOwner>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        self.owner.release(self.id);
    }
}

/// A handle to device memory. Clones share the same memory; it is freed with the last clone.
#[derive(Clone)]
pub struct DeviceBuffer {
    inner: Arc<BufferInner>,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("id", &self.inner.id)
            .field("len", &self.inner.len)
            .field("device_uid", &self.inner.device_uid)
            .finish()
    }
}

impl DeviceBuffer {
    /// A handle to `len` bytes of device `device_uid`'s memory that the backend knows as `id`;
    /// `owner.release(id)` runs when the last clone of the handle is dropped.
    pub fn new(id: u64, len: usize, device_uid: u64, owner: Arc<dyn BufferOwner>) -> Self {
        DeviceBuffer {
            inner: Arc::new(BufferInner {
                id,
                len,
                device_uid,
                owner,
            }),
        }
    }

    pub fn len(&self) -> usize {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// What the backend that made it knows this buffer as.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The device the buffer belongs to.
    pub fn device_uid(&self) -> u64 {
        self.inner.device_uid
    }

    /// The whole buffer as a slice.
    pub fn full(&self) -> DeviceSlice<'_> {
        DeviceSlice {
            buffer: self,
            offset: 0,
            len: self.len(),
        }
    }

    /// Bytes `offset..offset+len` of the buffer (checked when used).
    pub fn slice(&self, offset: usize, len: usize) -> DeviceSlice<'_> {
        DeviceSlice {
            buffer: self,
            offset,
            len,
        }
    }
}

/// A byte range of a [`DeviceBuffer`].
#[derive(Clone, Copy, Debug)]
pub struct DeviceSlice<'a> {
    pub buffer: &'a DeviceBuffer,
    pub offset: usize,
    pub len: usize,
}

impl DeviceSlice<'_> {
    /// This slice's byte range in its buffer, checked: the buffer belongs to device
    /// `device_uid` (named `device` in the error) and the range lies inside it. What every
    /// backend checks before it touches memory. `device` is formatted only for an error.
    pub fn checked(
        &self,
        device_uid: u64,
        device: impl fmt::Display,
    ) -> Result<Range<usize>, DeviceError> {
        if self.buffer.device_uid() != device_uid {
            return Err(DeviceError::ForeignHandle {
                device: device.to_string(),
                what: "buffer",
            });
        }
        let end = self.offset.saturating_add(self.len);
        if end > self.buffer.len() {
            return Err(DeviceError::OutOfRange {
                device: device.to_string(),
                offset: self.offset,
                end,
                len: self.buffer.len(),
            });
        }
        Ok(self.offset..end)
    }
}

/// The two sides of a copy or reduction on `device` have one length, a whole number of
/// `dtype` elements where a type is given. `device` is formatted only for an error.
pub fn check_lengths(
    device: impl fmt::Display,
    dst: usize,
    src: usize,
    dtype: Option<DataType>,
) -> Result<(), DeviceError> {
    let source = if dst != src {
        KernelError::LengthMismatch { dst, src }
    } else if let Some(dtype) = dtype.filter(|t| !dst.is_multiple_of(t.size())) {
        KernelError::PartialElement {
            len: dst,
            dtype,
            size: dtype.size(),
        }
    } else {
        return Ok(());
    };
    Err(DeviceError::Kernel {
        device: device.to_string(),
        source,
    })
}

/// An ordered queue of device work. Operations on one stream run in call order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stream {
    pub(crate) device_uid: u64,
    pub(crate) id: u64,
}

impl Stream {
    /// The stream the backend of device `device_uid` knows as `id`.
    pub fn new(device_uid: u64, id: u64) -> Self {
        Stream { device_uid, id }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn device_uid(&self) -> u64 {
        self.device_uid
    }
}

/// A marker recorded on a stream; complete once the stream has reached it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub(crate) device_uid: u64,
    pub(crate) id: u64,
}

impl Event {
    /// The event the backend of device `device_uid` knows as `id`.
    pub fn new(device_uid: u64, id: u64) -> Self {
        Event { device_uid, id }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn device_uid(&self) -> u64 {
        self.device_uid
    }
}

/// What the collectives core may do to a device. Implementations are shared between the
/// caller's thread and the communicator's progress thread, hence `Send + Sync`.
pub trait Accelerator: Send + Sync + fmt::Debug {
    /// Describe the device.
    fn info(&self) -> &DeviceInfo;

    /// Allocate `len` bytes of device memory (contents unspecified).
    fn allocate(&self, len: usize) -> Result<DeviceBuffer, DeviceError>;

    /// The stream the core uses when the caller gives none.
    fn default_stream(&self) -> Stream;

    /// A new stream, ordered independently of the others.
    fn create_stream(&self) -> Result<Stream, DeviceError>;

    /// Copy host bytes into device memory. `src` may be reused when this returns.
    fn copy_to_device(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        stream: &Stream,
    ) -> Result<(), DeviceError>;

    /// Copy device memory into host bytes; `dst` holds the data once `stream` reaches the copy.
    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError>;

    /// Copy between (possibly the same) device buffers; ranges must not overlap.
    fn copy_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError>;

    /// `dst = dst (op) src` element-wise, where `src` is host memory (a received chunk).
    fn reduce_from_host(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), DeviceError>;

    /// `dst = dst (op) src` element-wise, both in this device's memory (they must not overlap).
    /// The default copies `src` to the host and reduces from there; a backend with a device
    /// kernel for it overrides this.
    fn reduce_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let mut staged = vec![0u8; src.len];
        self.copy_to_host(&mut staged, src, stream)?;
        self.synchronize(stream)?;
        self.reduce_from_host(dst, &staged, dtype, op, stream)
    }

    /// `dst = dst / divisor` element-wise: the final step of `avg`.
    fn divide(
        &self,
        dst: DeviceSlice<'_>,
        dtype: DataType,
        divisor: usize,
        stream: &Stream,
    ) -> Result<(), DeviceError>;

    /// Record an event at the current end of `stream`.
    fn record_event(&self, stream: &Stream) -> Result<Event, DeviceError>;

    /// Whether the stream has reached `event` (never blocks).
    fn event_complete(&self, event: &Event) -> Result<bool, DeviceError>;

    /// Block until all work on `stream` is done.
    fn synchronize(&self, stream: &Stream) -> Result<(), DeviceError>;

    /// Enqueue on `stream` a wait that holds the stream's later work until the returned hold
    /// is released, without blocking the calling thread: how a collective enqueued on a
    /// caller's stream makes that stream wait for its completion. Backends that finish every
    /// operation before returning have nothing to hold.
    fn hold_stream(&self, stream: &Stream) -> Result<StreamHold, DeviceError> {
        self.synchronize(stream)?;
        Ok(StreamHold::none())
    }

    /// Start copying `src` into host memory without waiting for it, so that the executor
    /// can copy slice k+1 while slice k is on the wire; `None` where the backend copies
    /// synchronously anyway (cpu, sim): the executor then uses [`Accelerator::copy_to_host`].
    fn start_download(
        &self,
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<Option<Box<dyn Download>>, DeviceError> {
        let _ = (src, stream);
        Ok(None)
    }

    /// Enqueue on `stream` the host staging of one collective, for callers whose progress
    /// thread must make no device calls: the stream downloads `input` (out of place) or the
    /// in-place buffer `output` into host mirrors, signals the returned [`HostStaged`] that
    /// they are ready, waits until it is finished, then uploads the output mirror into
    /// `output`. Returns at once. The stream's later work thus follows the collective, and
    /// the caller's thread never waits (NCCL's model); the collective itself runs on the host
    /// mirrors. Backends without streams that run ahead of the host answer an error.
    fn stage_through_host(
        &self,
        input: Option<DeviceSlice<'_>>,
        output: Option<DeviceSlice<'_>>,
        stream: &Stream,
    ) -> Result<Box<dyn HostStaged>, DeviceError> {
        let _ = (input, output, stream);
        Err(DeviceError::Unavailable(format!(
            "{}: the {} backend does not stage collectives through host memory",
            self.info(),
            self.info().vendor
        )))
    }

    /// A handle to `len` bytes of this device's memory at `address`, allocated by someone
    /// else (a C caller's device pointer). The handle never frees it. Backends whose memory
    /// has no addresses outside the backend answer an error; the cuda backend checks that the
    /// range lies inside one allocation of its device.
    ///
    /// # Safety
    /// The memory must stay allocated, and the caller must not write it (nor read what an
    /// operation writes) other than in stream order, until the operations given the handle
    /// are complete.
    #[allow(unsafe_code)] // a contract for callers at the C boundary; no unsafe code here
    unsafe fn borrow_memory(&self, address: u64, len: usize) -> Result<DeviceBuffer, DeviceError> {
        let _ = (address, len);
        Err(DeviceError::Unavailable(format!(
            "{}: device memory is not addressable from outside the {} backend",
            self.info(),
            self.info().vendor
        )))
    }

    /// A handle to a stream created by someone else (a C caller's `cudaStream_t`; 0 is the
    /// legacy default stream). The same raw stream gives the same handle.
    ///
    /// # Safety
    /// `raw` must be a live stream of this device's context, and stay alive while operations
    /// enqueued on the handle may run.
    #[allow(unsafe_code)] // a contract for callers at the C boundary; no unsafe code here
    unsafe fn borrow_stream(&self, raw: u64) -> Result<Stream, DeviceError> {
        let _ = raw;
        Err(DeviceError::Unavailable(format!(
            "{}: the {} backend has no streams of other libraries",
            self.info(),
            self.info().vendor
        )))
    }
}
