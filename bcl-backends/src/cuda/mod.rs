//! The `cuda` backend (cargo feature `cuda`): NVIDIA GPUs through cudarc, with the driver and
//! NVRTC loaded at run time, so a build needs neither a CUDA toolkit nor a GPU.
//!
//! * Memory: device buffers are cudarc allocations behind [`DeviceBuffer`] handles.
//! * Work runs on a stream of the backend's own (non-blocking, so it never waits on the
//!   legacy default stream); callers may create more, and each operation names its stream.
//! * Host data crosses through **pinned staging**: a ring of page-locked slots (not
//!   write-combined, since the host reads them back), each with a device-side twin and an
//!   event. `copy_to_device` and `reduce_from_host` copy the caller's bytes into a slot and
//!   return at once (the caller may reuse its slice); the upload and the kernel run while the
//!   host fills the next slot. `copy_to_host` is pipelined the other way: the download of
//!   piece k+1 runs while the host copies piece k out, and the call returns with the data.
//! * Reductions are the NVRTC-compiled kernels of `kernels.cu`, bit-identical to the cpu
//!   reference kernels for every dtype and op.
//! * [`Accelerator::hold_stream`] makes a caller's stream wait for a collective with a stream
//!   memory operation (`cuStreamWaitValue32`) on a host-mapped flag: the GPU waits, no host
//!   thread blocks, and the progress thread releases it by storing to the flag.
//!
//! Opening fails with [`DeviceError::Unavailable`], never a panic, where the driver or NVRTC
//! library is missing or the device does not exist.

mod compile;
mod driver;

pub use compile::{
    CompileError, KERNELS_SOURCE, compile_kernels, divide_kernel_name, kernel_names,
    reduce_kernel_name,
};

use crate::accelerator::{
    Accelerator, BufferOwner, DeviceBuffer, DeviceCapabilities, DeviceError, DeviceInfo,
    DeviceSlice, Download, Event, HostStaged, Stream, StreamHold, Vendor, check_lengths,
    new_device_uid,
};
use crate::dtype::{DataType, ReduceOp};
use crate::kernels::KernelError;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DevicePtrMut, DriverError, LaunchConfig, SyncOnDrop, sys,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of one staging slot (a multiple of every element size).
const SLOT_BYTES: usize = 4 << 20;
/// Staging slots per device.
const SLOTS: usize = 4;
/// Stream holds that may be outstanding at once.
const HOLD_FLAGS: usize = 1024;
/// Threads per block of the element-wise kernels.
const BLOCK_THREADS: u32 = 256;

/// Whether this host can run the cuda backend: the driver library loads and has a device.
/// `Err` says what is missing.
pub fn available() -> Result<usize, DeviceError> {
    if !driver::driver_library_present() {
        return Err(DeviceError::Unavailable(
            "the CUDA driver library (libcuda.so) is not installed or not on the loader path"
                .into(),
        ));
    }
    let count = std::panic::catch_unwind(CudaContext::device_count)
        .map_err(|_| DeviceError::Unavailable("the CUDA driver library panicked on load".into()))?
        .map_err(|e| DeviceError::Unavailable(format!("the CUDA driver: {e:?}")))?;
    Ok(count.max(0) as usize)
}

/// One pinned staging slot: host memory, its device twin (reductions read from it) and the
/// event after the last device work that used either.
struct Slot {
    host: driver::Pinned,
    device: CudaSlice<u8>,
    done: CudaEvent,
}

/// A stream and its own staging slots (made when first needed). Slots are per stream so that
/// a copy on one stream never waits for a slot whose last use sits behind another stream's
/// wait (a held caller stream would otherwise stall the progress thread's copies).
struct Lane {
    stream: Arc<CudaStream>,
    staging: Mutex<Staging>,
    mirrors: Mutex<Mirrors>,
}

/// The staging slots of a lane, and the one to use next.
#[derive(Default)]
struct Staging {
    slots: Vec<Slot>,
    next: usize,
}

/// Device memory behind a handle: ours, or a caller's (never freed by us).
enum Memory {
    Owned(CudaSlice<u8>),
    Borrowed(sys::CUdeviceptr),
}

impl Memory {
    /// The base address, for work on `stream` that writes it; owned memory orders the
    /// stream after earlier work on it until the guard drops.
    fn write_address<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, Option<SyncOnDrop<'a>>) {
        match self {
            Memory::Owned(slice) => {
                let (base, guard) = slice.device_ptr_mut(stream);
                (base, Some(guard))
            }
            Memory::Borrowed(base) => (*base, None),
        }
    }

    /// The base address, for work on `stream` that only reads it.
    fn read_address<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, Option<SyncOnDrop<'a>>) {
        match self {
            Memory::Owned(slice) => {
                let (base, guard) = slice.device_ptr(stream);
                (base, Some(guard))
            }
            Memory::Borrowed(base) => (*base, None),
        }
    }
}

/// The device buffers, by handle id.
#[derive(Default)]
struct Buffers {
    map: Mutex<HashMap<u64, Memory>>,
}

impl BufferOwner for Buffers {
    fn release(&self, id: u64) {
        self.map.lock().remove(&id);
    }
}

/// Flag words (pinned, device-mapped, in `CudaDevice::flag_words`) of stream holds and
/// staged collectives: which are free, and which wait for their stream to pass the work that
/// uses them. Only threads that enqueue take this lock; the thread that releases a hold or
/// finishes a staged collective only stores to a flag word.
struct Flags {
    free: Vec<usize>,
    retiring: Vec<Retiring>,
    next_value: u32,
}

/// Flags and mirrors in use until the stream has passed `passed`.
struct Retiring {
    flags: Vec<usize>,
    /// Held only to keep the mirrors allocated (and freed by an enqueuing thread).
    _mirrors: Vec<Arc<driver::Pinned>>,
    passed: CudaEvent,
}

/// The pinned mirrors of a lane's staged collectives, reused from call to call: calls on one
/// stream are staged one after another, so one's use ends before the next one's begins.
#[derive(Default)]
struct Mirrors {
    input: Option<Arc<driver::Pinned>>,
    output: Option<Arc<driver::Pinned>>,
}

/// Pinned buffers for downloads ahead of sends, free for the next one.
type DownloadPool = Arc<Mutex<Vec<Arc<driver::Pinned>>>>;

/// The most free download buffers a device keeps.
const DOWNLOADS_KEPT: usize = 32;

/// A device-to-host copy in flight into a pinned buffer of the device's pool.
struct PinnedDownload {
    device: String,
    buffer: Option<Arc<driver::Pinned>>,
    len: usize,
    landed: CudaEvent,
    pool: DownloadPool,
}

impl std::fmt::Debug for PinnedDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedDownload")
            .field("len", &self.len)
            .finish()
    }
}

impl Download for PinnedDownload {
    fn ready(&self) -> Result<bool, DeviceError> {
        self.landed
            .try_is_complete()
            .map_err(|e| DeviceError::Driver {
                device: self.device.clone(),
                call: "cuEventQuery",
                reason: format!("{e:?}"),
            })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .map_or(&[][..], |b| &b.as_slice()[..self.len])
    }
}

impl Drop for PinnedDownload {
    fn drop(&mut self) {
        // The copy may still be writing the buffer (an operation that failed): wait for it
        // before anyone else may use the buffer.
        if !matches!(self.landed.try_is_complete(), Ok(true)) {
            let _ = self.landed.synchronize();
        }
        if let Some(buffer) = self.buffer.take() {
            let mut pool = self.pool.lock();
            if pool.len() < DOWNLOADS_KEPT {
                pool.push(buffer);
            }
        }
    }
}

/// One collective staged through host memory (see [`Accelerator::stage_through_host`]).
#[derive(Debug)]
struct Staged {
    input: Option<driver::MirrorWindow>,
    output: Option<driver::MirrorWindow>,
    flag_words: Arc<driver::Pinned>,
    ready_flag: usize,
    done_flag: usize,
    value: u32,
}

impl HostStaged for Staged {
    fn ready(&self) -> bool {
        let seen = driver::read_flag(&self.flag_words, self.ready_flag);
        seen.wrapping_sub(self.value) as i32 >= 0
    }

    fn buffers(&mut self) -> (Option<&[u8]>, Option<&mut [u8]>) {
        (
            self.input.as_ref().map(driver::MirrorWindow::bytes),
            self.output.as_mut().map(driver::MirrorWindow::bytes_mut),
        )
    }

    fn finish(self: Box<Self>) {
        drop(self);
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // The windows go first: the retiring list keeps the mirrors until the stream has
        // uploaded, so their memory is never freed by this (progress) thread.
        self.input = None;
        self.output = None;
        driver::set_flag(&self.flag_words, self.done_flag, self.value);
    }
}

/// A CUDA device.
pub struct CudaDevice {
    info: DeviceInfo,
    name: String,
    uid: u64,
    ctx: Arc<CudaContext>,
    own: Arc<CudaStream>,
    streams: Mutex<HashMap<u64, Arc<Lane>>>,
    /// Streams of other libraries, by raw handle, to their ids in `streams`.
    borrowed_streams: Mutex<HashMap<u64, u64>>,
    buffers: Arc<Buffers>,
    events: Mutex<HashMap<u64, CudaEvent>>,
    flag_words: Arc<driver::Pinned>,
    flags: Mutex<Flags>,
    downloads: DownloadPool,
    reduce: HashMap<(DataType, ReduceOp), CudaFunction>,
    divide: HashMap<DataType, CudaFunction>,
    _module: Arc<CudaModule>,
    multiprocessors: u32,
    next_id: AtomicU64,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("device", &self.name)
            .field("model", &self.info.model)
            .field("buffers", &self.buffers.map.lock().len())
            .finish()
    }
}

impl CudaDevice {
    /// Open CUDA device `ordinal`: a context, a stream, pinned staging, and the kernels
    /// compiled for the device's architecture.
    pub fn open(ordinal: u32) -> Result<Self, DeviceError> {
        let name = format!("cuda:{ordinal}");
        let unavailable = |what: String| {
            DeviceError::Unavailable(format!("{name} on {}: {what}", crate::host::hostname()))
        };
        let count = available().map_err(|e| match e {
            DeviceError::Unavailable(reason) => unavailable(reason),
            other => other,
        })?;
        if ordinal as usize >= count {
            return Err(unavailable(format!(
                "this host has {count} CUDA device(s) (cuda:0..cuda:{})",
                count.saturating_sub(1)
            )));
        }
        let driver_error = |call: &'static str| {
            let name = name.clone();
            move |e: DriverError| DeviceError::Driver {
                device: name.clone(),
                call,
                reason: format!("{e:?}"),
            }
        };
        let ctx = CudaContext::new(ordinal as usize).map_err(driver_error("cuCtxCreate"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_error("cuDeviceGetAttribute"))?;
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error("cuDeviceGetAttribute"))?
            .max(1) as u32;
        let model = ctx.name().map_err(driver_error("cuDeviceGetName"))?;
        let ptx = compile_kernels(&format!("compute_{major}{minor}"))
            .map_err(|e| unavailable(e.to_string()))?;
        let module = ctx
            .load_module(ptx)
            .map_err(driver_error("cuModuleLoadData"))?;
        let mut reduce = HashMap::new();
        let mut divide = HashMap::new();
        for dtype in DataType::ALL {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                let f = module
                    .load_function(&reduce_kernel_name(dtype, op))
                    .map_err(driver_error("cuModuleGetFunction"))?;
                reduce.insert((dtype, op), f);
            }
            let f = module
                .load_function(&divide_kernel_name(dtype))
                .map_err(driver_error("cuModuleGetFunction"))?;
            divide.insert(dtype, f);
        }
        let own = ctx.new_stream().map_err(driver_error("cuStreamCreate"))?;
        let flag_words = Arc::new(
            driver::Pinned::new(&ctx, HOLD_FLAGS * 4).map_err(driver_error("cuMemHostAlloc"))?,
        );
        let flags = Flags {
            free: (0..HOLD_FLAGS).rev().collect(),
            retiring: Vec::new(),
            next_value: 1,
        };
        let uid = new_device_uid();
        let mut streams = HashMap::new();
        streams.insert(
            0,
            Arc::new(Lane {
                stream: own.clone(),
                staging: Mutex::new(Staging::default()),
                mirrors: Mutex::new(Mirrors::default()),
            }),
        );
        let (free, total) = ctx.mem_get_info().unwrap_or((0, 0));
        Ok(CudaDevice {
            info: DeviceInfo {
                vendor: Vendor::Nvidia,
                model: format!(
                    "{model} (sm_{major}{minor}, {multiprocessors} SMs, {} of {} GiB free)",
                    free >> 30,
                    total >> 30
                ),
                index: ordinal,
                host_id: crate::host::host_identity(),
                capabilities: DeviceCapabilities {
                    host_addressable: false,
                    external_memory: true,
                    copy_gbps: None,
                    reduce_gbps: None,
                },
            },
            name,
            uid,
            ctx,
            own,
            streams: Mutex::new(streams),
            borrowed_streams: Mutex::new(HashMap::new()),
            buffers: Arc::new(Buffers::default()),
            events: Mutex::new(HashMap::new()),
            flag_words,
            flags: Mutex::new(flags),
            downloads: Arc::new(Mutex::new(Vec::new())),
            reduce,
            divide,
            _module: module,
            multiprocessors,
            next_id: AtomicU64::new(1),
        })
    }

    fn driver_error(&self, call: &'static str) -> impl Fn(DriverError) -> DeviceError + '_ {
        move |e| DeviceError::Driver {
            device: self.name.clone(),
            call,
            reason: format!("{e:?}"),
        }
    }

    fn foreign(&self, what: &'static str) -> DeviceError {
        DeviceError::ForeignHandle {
            device: self.name.clone(),
            what,
        }
    }

    fn kernel_error(&self, source: KernelError) -> DeviceError {
        DeviceError::Kernel {
            device: self.name.clone(),
            source,
        }
    }

    fn lane(&self, stream: &Stream) -> Result<Arc<Lane>, DeviceError> {
        if stream.device_uid != self.uid {
            return Err(self.foreign("stream"));
        }
        self.streams
            .lock()
            .get(&stream.id)
            .cloned()
            .ok_or_else(|| self.foreign("stream"))
    }

    /// The staging slots of `lane`, made on first use.
    fn staging<'l>(
        &self,
        lane: &'l Lane,
    ) -> Result<parking_lot::MutexGuard<'l, Staging>, DeviceError> {
        let mut staging = lane.staging.lock();
        while staging.slots.len() < SLOTS {
            staging.slots.push(Slot {
                host: driver::Pinned::new(&self.ctx, SLOT_BYTES)
                    .map_err(self.driver_error("cuMemHostAlloc"))?,
                device: lane
                    .stream
                    .alloc_zeros::<u8>(SLOT_BYTES)
                    .map_err(self.driver_error("cuMemAlloc"))?,
                done: self
                    .ctx
                    .new_event(None)
                    .map_err(self.driver_error("cuEventCreate"))?,
            });
        }
        Ok(staging)
    }

    /// Check that `s` is a slice of one of this device's buffers and inside it.
    fn check(&self, s: &DeviceSlice<'_>) -> Result<(), DeviceError> {
        s.checked(self.uid, &self.name).map(drop)
    }

    fn same_length(&self, dst: usize, src: usize) -> Result<(), DeviceError> {
        check_lengths(&self.name, dst, src, None)
    }

    fn whole_elements(&self, len: usize, dtype: DataType) -> Result<(), DeviceError> {
        check_lengths(&self.name, len, len, Some(dtype))
    }

    /// Run `f` with the device address of `s` (checked), ordered on `stream` after earlier
    /// work on the buffer. Holds the buffer map while `f` runs: `f` only enqueues.
    fn with_address<R>(
        &self,
        s: DeviceSlice<'_>,
        stream: &CudaStream,
        f: impl FnOnce(sys::CUdeviceptr) -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        self.check(&s)?;
        let mut map = self.buffers.map.lock();
        let buffer = map
            .get_mut(&s.buffer.id())
            .ok_or_else(|| self.foreign("buffer"))?;
        let (base, _ordered) = buffer.write_address(stream);
        f(base + s.offset as u64)
    }

    /// A launch shape for `work` independent items (a grid-stride loop covers the rest).
    fn launch_config(&self, work: usize) -> LaunchConfig {
        let blocks = work
            .div_ceil(BLOCK_THREADS as usize)
            .clamp(1, self.multiprocessors as usize * 8) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The next staging slot, once the device work that last used it is done.
    fn next_slot<'s>(&self, staging: &'s mut Staging) -> Result<&'s mut Slot, DeviceError> {
        let i = staging.next;
        staging.next = (i + 1) % staging.slots.len();
        let slot = &mut staging.slots[i];
        slot.done
            .synchronize()
            .map_err(self.driver_error("cuEventSynchronize"))?;
        Ok(slot)
    }
}

impl Accelerator for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn allocate(&self, len: usize) -> Result<DeviceBuffer, DeviceError> {
        let slice =
            self.own
                .alloc_zeros::<u8>(len.max(1))
                .map_err(|e| DeviceError::OutOfMemory {
                    device: self.name.clone(),
                    bytes: len,
                    reason: format!("{e:?}"),
                })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.buffers.map.lock().insert(id, Memory::Owned(slice));
        let owner: Arc<dyn BufferOwner> = self.buffers.clone();
        Ok(DeviceBuffer::new(id, len, self.uid, owner))
    }

    fn default_stream(&self) -> Stream {
        Stream {
            device_uid: self.uid,
            id: 0,
        }
    }

    fn create_stream(&self) -> Result<Stream, DeviceError> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(self.driver_error("cuStreamCreate"))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().insert(
            id,
            Arc::new(Lane {
                stream,
                staging: Mutex::new(Staging::default()),
                mirrors: Mutex::new(Mirrors::default()),
            }),
        );
        Ok(Stream {
            device_uid: self.uid,
            id,
        })
    }

    fn copy_to_device(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        self.same_length(dst.len, src.len())?;
        self.check(&dst)?;
        let mut staging = self.staging(&lane)?;
        for (k, piece) in src.chunks(SLOT_BYTES).enumerate() {
            // Wait for a free slot before taking the buffer map: the wait may be long (the
            // stream may be held) and others must reach their buffers meanwhile.
            let slot = self.next_slot(&mut staging)?;
            slot.host.as_mut_slice()[..piece.len()].copy_from_slice(piece);
            let at = dst.buffer.slice(dst.offset + k * SLOT_BYTES, piece.len());
            self.with_address(at, s, |at| {
                driver::copy_to_device(s, at, &slot.host, piece.len())
                    .map_err(self.driver_error("cuMemcpyHtoDAsync"))
            })?;
            slot.done
                .record(s)
                .map_err(self.driver_error("cuEventRecord"))?;
        }
        Ok(())
    }

    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        self.same_length(dst.len(), src.len)?;
        self.check(&src)?;
        let mut staging = self.staging(&lane)?;
        let staging = &mut *staging;
        // (slot index, piece index) of downloads in flight, oldest first: the download of
        // piece k+1 runs while the host copies piece k out.
        let mut in_flight: std::collections::VecDeque<(usize, usize)> = Default::default();
        let finish = |slots: &mut Vec<Slot>, dst: &mut [u8], (slot, piece): (usize, usize)| {
            let start = piece * SLOT_BYTES;
            let end = (start + SLOT_BYTES).min(dst.len());
            let slot = &mut slots[slot];
            slot.done
                .synchronize()
                .map_err(self.driver_error("cuEventSynchronize"))?;
            dst[start..end].copy_from_slice(&slot.host.as_slice()[..end - start]);
            Ok::<(), DeviceError>(())
        };
        for piece in 0..dst.len().div_ceil(SLOT_BYTES) {
            let index = staging.next;
            let slot = self.next_slot(staging)?;
            let start = piece * SLOT_BYTES;
            let len = SLOT_BYTES.min(dst.len() - start);
            let at = src.buffer.slice(src.offset + start, len);
            self.with_address(at, s, |at| {
                driver::copy_to_host(s, &mut slot.host, at, len)
                    .map_err(self.driver_error("cuMemcpyDtoHAsync"))
            })?;
            slot.done
                .record(s)
                .map_err(self.driver_error("cuEventRecord"))?;
            in_flight.push_back((index, piece));
            if in_flight.len() >= 2
                && let Some(oldest) = in_flight.pop_front()
            {
                finish(&mut staging.slots, dst, oldest)?;
            }
        }
        while let Some(oldest) = in_flight.pop_front() {
            finish(&mut staging.slots, dst, oldest)?;
        }
        Ok(())
    }

    fn copy_within(
        &self,
        dst: DeviceSlice<'_>,
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        self.check(&dst)?;
        self.check(&src)?;
        self.same_length(dst.len, src.len)?;
        if dst.len == 0 {
            return Ok(());
        }
        let copy = |to: u64, from: u64| {
            driver::copy_on_device(s, to, from, dst.len)
                .map_err(self.driver_error("cuMemcpyDtoDAsync"))
        };
        let mut map = self.buffers.map.lock();
        if dst.buffer.id() == src.buffer.id() {
            let overlap = dst.offset < src.offset + src.len && src.offset < dst.offset + dst.len;
            if overlap {
                return Err(DeviceError::OutOfRange {
                    device: self.name.clone(),
                    offset: dst.offset,
                    end: dst.offset + dst.len,
                    len: dst.buffer.len(),
                });
            }
            let buffer = map
                .get_mut(&dst.buffer.id())
                .ok_or_else(|| self.foreign("buffer"))?;
            let (base, _ordered) = buffer.write_address(s);
            return copy(base + dst.offset as u64, base + src.offset as u64);
        }
        let [to, from] = map.get_disjoint_mut([&dst.buffer.id(), &src.buffer.id()]);
        let (to, from) = (
            to.ok_or_else(|| self.foreign("buffer"))?,
            from.ok_or_else(|| self.foreign("buffer"))?,
        );
        let (to_base, _w) = to.write_address(s);
        let (from_base, _r) = from.read_address(s);
        copy(to_base + dst.offset as u64, from_base + src.offset as u64)
    }

    fn reduce_from_host(
        &self,
        dst: DeviceSlice<'_>,
        src: &[u8],
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        self.same_length(dst.len, src.len())?;
        self.whole_elements(src.len(), dtype)?;
        self.check(&dst)?;
        let kernel = self
            .reduce
            .get(&(dtype, op.accumulate_op()))
            .ok_or_else(|| self.kernel_error(KernelError::LengthMismatch { dst: 0, src: 0 }))?;
        let mut staging = self.staging(&lane)?;
        for (k, piece) in src.chunks(SLOT_BYTES).enumerate() {
            let slot = self.next_slot(&mut staging)?;
            slot.host.as_mut_slice()[..piece.len()].copy_from_slice(piece);
            let (twin, ordered) = slot.device.device_ptr_mut(s);
            driver::copy_to_device(s, twin, &slot.host, piece.len())
                .map_err(self.driver_error("cuMemcpyHtoDAsync"))?;
            let elements = piece.len() / dtype.size();
            let at = dst.buffer.slice(dst.offset + k * SLOT_BYTES, piece.len());
            self.with_address(at, s, |at| {
                driver::launch(
                    s,
                    kernel,
                    self.launch_config(piece.len().div_ceil(16)),
                    &[at, twin, elements as u64],
                )
                .map_err(self.driver_error("cuLaunchKernel"))
            })?;
            drop(ordered);
            slot.done
                .record(s)
                .map_err(self.driver_error("cuEventRecord"))?;
        }
        Ok(())
    }

    fn divide(
        &self,
        dst: DeviceSlice<'_>,
        dtype: DataType,
        divisor: usize,
        stream: &Stream,
    ) -> Result<(), DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        self.whole_elements(dst.len, dtype)?;
        if dst.len == 0 {
            return self.check(&dst);
        }
        let kernel = self
            .divide
            .get(&dtype)
            .ok_or_else(|| self.kernel_error(KernelError::LengthMismatch { dst: 0, src: 0 }))?;
        let elements = dst.len / dtype.size();
        self.with_address(dst, s, |at| {
            driver::launch(
                s,
                kernel,
                self.launch_config(elements),
                &[at, elements as u64, divisor as u64],
            )
            .map_err(self.driver_error("cuLaunchKernel"))
        })
    }

    fn record_event(&self, stream: &Stream) -> Result<Event, DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        let event = self
            .ctx
            .new_event(None)
            .map_err(self.driver_error("cuEventCreate"))?;
        event
            .record(s)
            .map_err(self.driver_error("cuEventRecord"))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.events.lock().insert(id, event);
        Ok(Event {
            device_uid: self.uid,
            id,
        })
    }

    /// Complete events are forgotten once reported: asking again answers `true` still.
    fn event_complete(&self, event: &Event) -> Result<bool, DeviceError> {
        if event.device_uid != self.uid {
            return Err(self.foreign("event"));
        }
        let mut events = self.events.lock();
        let Some(e) = events.get(&event.id) else {
            return Ok(true);
        };
        let complete = e
            .try_is_complete()
            .map_err(self.driver_error("cuEventQuery"))?;
        if complete {
            events.remove(&event.id);
        }
        Ok(complete)
    }

    fn synchronize(&self, stream: &Stream) -> Result<(), DeviceError> {
        self.lane(stream)?
            .stream
            .synchronize()
            .map_err(self.driver_error("cuStreamSynchronize"))
    }

    #[allow(unsafe_code)] // the trait's contract; the checks below are safe calls
    unsafe fn borrow_memory(&self, address: u64, len: usize) -> Result<DeviceBuffer, DeviceError> {
        let not_ours = |reason: String| DeviceError::NotDeviceMemory {
            device: self.name.clone(),
            address,
            len,
            reason,
        };
        if len > 0 {
            let (base, size) = driver::allocation_of(&self.ctx, address).map_err(|e| {
                not_ours(format!(
                    "the driver knows no allocation there ({e:?}): a host pointer?"
                ))
            })?;
            if address + len as u64 > base + size as u64 {
                return Err(not_ours(format!(
                    "the allocation at {base:#x} holds {size} bytes, {} from the address",
                    base + size as u64 - address
                )));
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.buffers
            .map
            .lock()
            .insert(id, Memory::Borrowed(address));
        let owner: Arc<dyn BufferOwner> = self.buffers.clone();
        Ok(DeviceBuffer::new(id, len, self.uid, owner))
    }

    #[allow(unsafe_code)] // forwards the trait's contract to cudarc's wrapper
    unsafe fn borrow_stream(&self, raw: u64) -> Result<Stream, DeviceError> {
        let mut borrowed = self.borrowed_streams.lock();
        if let Some(id) = borrowed.get(&raw) {
            return Ok(Stream {
                device_uid: self.uid,
                id: *id,
            });
        }
        // SAFETY: the caller promises a live stream of this context (the trait's contract).
        let stream = unsafe { driver::borrowed_stream(&self.ctx, raw) };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().insert(
            id,
            Arc::new(Lane {
                stream,
                staging: Mutex::new(Staging::default()),
                mirrors: Mutex::new(Mirrors::default()),
            }),
        );
        borrowed.insert(raw, id);
        Ok(Stream {
            device_uid: self.uid,
            id,
        })
    }

    fn hold_stream(&self, stream: &Stream) -> Result<StreamHold, DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        let mut flags = self.flags.lock();
        let [flag] = self.take_flags(&mut flags)?;
        let value = Self::next_value(&mut flags);
        let address = self.flag_words.word_device_ptr(flag);
        if let Err(e) = driver::wait_for_flag(s, address, value) {
            flags.free.push(flag);
            return Err(self.driver_error("cuStreamWaitValue32")(e));
        }
        self.retire_after(s, &mut flags, vec![flag], Vec::new(), (flag, value), Ok(()))?;
        let words = self.flag_words.clone();
        Ok(StreamHold::new(move || {
            driver::set_flag(&words, flag, value)
        }))
    }

    fn start_download(
        &self,
        src: DeviceSlice<'_>,
        stream: &Stream,
    ) -> Result<Option<Box<dyn Download>>, DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        self.check(&src)?;
        let len = src.len;
        let taken = {
            let mut pool = self.downloads.lock();
            let at = pool.iter().position(|b| b.len() >= len);
            at.map(|i| pool.swap_remove(i))
        };
        let buffer = match taken {
            Some(b) => b,
            None => Arc::new(
                driver::Pinned::new(&self.ctx, len.max(64 << 10).next_power_of_two())
                    .map_err(self.driver_error("cuMemHostAlloc"))?,
            ),
        };
        if len > 0 {
            self.with_address(src, s, |at| {
                driver::download(s, &buffer, 0, at, len)
                    .map_err(self.driver_error("cuMemcpyDtoHAsync"))
            })?;
        }
        let landed = self.passed_event(s)?;
        Ok(Some(Box::new(PinnedDownload {
            device: self.name.clone(),
            buffer: Some(buffer),
            len,
            landed,
            pool: self.downloads.clone(),
        })))
    }

    fn stage_through_host(
        &self,
        input: Option<DeviceSlice<'_>>,
        output: Option<DeviceSlice<'_>>,
        stream: &Stream,
    ) -> Result<Box<dyn HostStaged>, DeviceError> {
        let lane = self.lane(stream)?;
        let s = &lane.stream;
        for slice in input.iter().chain(output.iter()) {
            self.check(slice)?;
        }
        let mut mirrors = lane.mirrors.lock();
        let in_mirror = input
            .map(|i| self.mirror(&mut mirrors.input, i.len))
            .transpose()?;
        let out_mirror = output
            .map(|o| self.mirror(&mut mirrors.output, o.len))
            .transpose()?;
        let mut flags = self.flags.lock();
        let [ready_flag, done_flag] = self.take_flags(&mut flags)?;
        let value = Self::next_value(&mut flags);
        let enqueued = (|| {
            // The data the collective starts from: the input, or the in-place buffer.
            let first = match (&input, &in_mirror, &output, &out_mirror) {
                (Some(i), Some(m), _, _) => Some((*i, m)),
                (None, _, Some(o), Some(m)) => Some((*o, m)),
                _ => None,
            };
            if let Some((from, mirror)) = first {
                self.with_address(from, s, |at| {
                    driver::download(s, mirror, 0, at, from.len)
                        .map_err(self.driver_error("cuMemcpyDtoHAsync"))
                })?;
            }
            driver::write_flag(s, self.flag_words.word_device_ptr(ready_flag), value)
                .map_err(self.driver_error("cuStreamWriteValue32"))?;
            driver::wait_for_flag(s, self.flag_words.word_device_ptr(done_flag), value)
                .map_err(self.driver_error("cuStreamWaitValue32"))?;
            if let (Some(to), Some(mirror)) = (&output, &out_mirror) {
                self.with_address(*to, s, |at| {
                    driver::upload(s, at, mirror, to.len)
                        .map_err(self.driver_error("cuMemcpyHtoDAsync"))
                })?;
            }
            Ok(())
        })();
        self.retire_after(
            s,
            &mut flags,
            vec![ready_flag, done_flag],
            in_mirror.iter().chain(out_mirror.iter()).cloned().collect(),
            (done_flag, value),
            enqueued,
        )?;
        Ok(Box::new(Staged {
            input: in_mirror
                .zip(input)
                .map(|(m, i)| driver::MirrorWindow::new(m, i.len)),
            output: out_mirror
                .zip(output)
                .map(|(m, o)| driver::MirrorWindow::new(m, o.len)),
            flag_words: self.flag_words.clone(),
            ready_flag,
            done_flag,
            value,
        }))
    }
}

impl CudaDevice {
    /// `N` free flags, after taking back those whose stream has passed their work; each
    /// starts below the value its user will wait for.
    fn take_flags<const N: usize>(&self, flags: &mut Flags) -> Result<[usize; N], DeviceError> {
        let mut k = 0;
        while k < flags.retiring.len() {
            let passed = flags.retiring[k]
                .passed
                .try_is_complete()
                .map_err(self.driver_error("cuEventQuery"))?;
            if passed {
                let done = flags.retiring.swap_remove(k);
                flags.free.extend(done.flags);
            } else {
                k += 1;
            }
        }
        if flags.free.len() < N {
            return Err(DeviceError::Driver {
                device: self.name.clone(),
                call: "stream flags",
                reason: format!("all {HOLD_FLAGS} stream flags are in use by pending work"),
            });
        }
        let taken: [usize; N] = std::array::from_fn(|_| flags.free.pop().unwrap_or_default());
        for flag in taken {
            let value = flags.next_value;
            driver::set_flag(&self.flag_words, flag, value.wrapping_sub(1));
        }
        Ok(taken)
    }

    /// After work using `used` flags (and `mirrors`) was enqueued on `stream` (`enqueued`),
    /// record the event after which they retire. On failure store `value` into the flag of
    /// `release`, so that nothing already enqueued waits for ever; the flags then stay out of
    /// use (the stream may still touch them).
    fn retire_after(
        &self,
        stream: &CudaStream,
        flags: &mut Flags,
        used: Vec<usize>,
        mirrors: Vec<Arc<driver::Pinned>>,
        (release, value): (usize, u32),
        enqueued: Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        match enqueued.and_then(|()| self.passed_event(stream)) {
            Ok(passed) => {
                flags.retiring.push(Retiring {
                    flags: used,
                    _mirrors: mirrors,
                    passed,
                });
                Ok(())
            }
            Err(e) => {
                driver::set_flag(&self.flag_words, release, value);
                Err(e)
            }
        }
    }

    /// The value the next hold or staged collective waits for: each its own, so a late store
    /// of an earlier user of a flag can never release a later one.
    fn next_value(flags: &mut Flags) -> u32 {
        let value = flags.next_value;
        flags.next_value = value.wrapping_add(1).max(1);
        value
    }

    /// An event recorded at the current end of `stream`.
    fn passed_event(&self, stream: &CudaStream) -> Result<CudaEvent, DeviceError> {
        let event = self
            .ctx
            .new_event(None)
            .map_err(self.driver_error("cuEventCreate"))?;
        event
            .record(stream)
            .map_err(self.driver_error("cuEventRecord"))?;
        Ok(event)
    }

    /// The lane's mirror in `slot` if it holds `len` bytes, else a new one (the old one lives
    /// on in the retiring entries of calls still using it).
    fn mirror(
        &self,
        slot: &mut Option<Arc<driver::Pinned>>,
        len: usize,
    ) -> Result<Arc<driver::Pinned>, DeviceError> {
        if let Some(m) = slot.as_ref().filter(|m| m.len() >= len) {
            return Ok(m.clone());
        }
        let size = len.max(1 << 20).next_power_of_two();
        let m = Arc::new(
            driver::Pinned::new(&self.ctx, size).map_err(self.driver_error("cuMemHostAlloc"))?,
        );
        *slot = Some(m.clone());
        Ok(m)
    }
}

/// What [`CudaDevice::measure_bandwidth`] measured, in GB/s (10^9 bytes per second).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    /// Device-to-device copy, bytes copied per second (each byte is read once, written once).
    pub device_copy: f64,
    /// The fp32 sum kernel `dst += src`, destination bytes per second (it reads two bytes
    /// and writes one for each).
    pub reduce_f32_sum: f64,
    /// `copy_to_device` of pageable host memory through the pinned staging.
    pub host_to_device: f64,
    /// `copy_to_host` into pageable host memory through the pinned staging.
    pub device_to_host: f64,
}

impl CudaDevice {
    /// Measure the device's copy bandwidth, the reduce kernel's, and the staged host copies,
    /// over buffers of `bytes`, `rounds` times each (device work timed with CUDA events, host
    /// copies with the wall clock).
    pub fn measure_bandwidth(&self, bytes: usize, rounds: usize) -> Result<Bandwidth, DeviceError> {
        let bytes = bytes.next_multiple_of(16).max(16);
        let rounds = rounds.max(1);
        let s = self.default_stream();
        let a = self.allocate(bytes)?;
        let b = self.allocate(bytes)?;
        let timed = |f: &dyn Fn() -> Result<(), DeviceError>| -> Result<f64, DeviceError> {
            let start = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(self.driver_error("cuEventCreate"))?;
            let end = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(self.driver_error("cuEventCreate"))?;
            f()?; // warm-up
            start
                .record(&self.own)
                .map_err(self.driver_error("cuEventRecord"))?;
            for _ in 0..rounds {
                f()?;
            }
            end.record(&self.own)
                .map_err(self.driver_error("cuEventRecord"))?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(self.driver_error("cuEventElapsedTime"))?;
            Ok((bytes * rounds) as f64 / (f64::from(ms) * 1e6))
        };
        let device_copy = timed(&|| self.copy_within(b.full(), a.full(), &s))?;
        let kernel = &self.reduce[&(DataType::Float32, ReduceOp::Sum)];
        let reduce_f32_sum = timed(&|| {
            let mut map = self.buffers.map.lock();
            let [to, from] = map.get_disjoint_mut([&b.id(), &a.id()]);
            let (to, from) = (
                to.ok_or_else(|| self.foreign("buffer"))?,
                from.ok_or_else(|| self.foreign("buffer"))?,
            );
            let (dst, _w) = to.write_address(&self.own);
            let (src, _r) = from.read_address(&self.own);
            driver::launch(
                &self.own,
                kernel,
                self.launch_config(bytes / 16),
                &[dst, src, (bytes / 4) as u64],
            )
            .map_err(self.driver_error("cuLaunchKernel"))
        })?;
        let mut host = vec![1u8; bytes];
        let wall = |f: &mut dyn FnMut() -> Result<(), DeviceError>| -> Result<f64, DeviceError> {
            f()?;
            self.synchronize(&s)?;
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                f()?;
            }
            self.synchronize(&s)?;
            Ok((bytes * rounds) as f64 / (t.elapsed().as_secs_f64() * 1e9))
        };
        let host_to_device = wall(&mut || self.copy_to_device(a.full(), &host, &s))?;
        let device_to_host = wall(&mut || self.copy_to_host(&mut host, a.full(), &s))?;
        Ok(Bandwidth {
            device_copy,
            reduce_f32_sum,
            host_to_device,
            device_to_host,
        })
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Pinned slots and flags must outlive the work that reads them.
        let _ = self.ctx.synchronize();
    }
}
