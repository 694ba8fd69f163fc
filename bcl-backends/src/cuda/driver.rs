//! The one unsafe edge of the cuda backend: the cudarc calls that take raw device pointers
//! (asynchronous copies, kernel launches, stream memory operations) and page-locked host
//! memory. Every pointer handed in here was range-checked by the caller (`super`) against the
//! buffer it came from; every length is checked again here against the host memory it names.
#![allow(unsafe_code)]

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg, result, sys,
};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether the CUDA driver library can be loaded (cudarc panics on first use where it cannot).
pub(super) fn driver_library_present() -> bool {
    // SAFETY: loading libcuda runs only the driver's own initialisers; cudarc's probe loads
    // and unloads it without calling into it.
    unsafe { sys::is_culib_present() }
}

/// Whether the NVRTC library can be loaded.
pub(super) fn nvrtc_library_present() -> bool {
    // SAFETY: as for the driver: loading libnvrtc runs only its initialisers.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Page-locked host memory, mapped into the device's address space, freed on drop. Not
/// write-combined: the host reads it back (device-to-host staging, stream flags).
#[derive(Debug)]
pub(super) struct Pinned {
    ptr: NonNull<u8>,
    len: usize,
    device_ptr: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is plain host memory owned by this value; access goes through
// `&self`/`&mut self` (or atomics for the flags), so moving or sharing it between threads is
// as safe as for a `Vec<u8>`.
unsafe impl Send for Pinned {}
// SAFETY: see `Send`: shared access is read-only or atomic.
unsafe impl Sync for Pinned {}

impl Pinned {
    pub(super) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: cuMemHostAlloc with a positive size; the result is checked for null below
        // and freed exactly once in Drop.
        let raw = unsafe { result::malloc_host(len.max(1), flags) }?;
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY))?;
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: `raw` was just allocated by cuMemHostAlloc with DEVICEMAP in this context.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, raw, 0) }.result()?;
        let pinned = Pinned {
            ptr,
            len,
            device_ptr,
            ctx: ctx.clone(),
        };
        Ok(pinned)
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` bytes owned by self; callers order host access after
        // the device work that used the bytes (the staging slot's event).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` makes the access exclusive on the host.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The 32-bit word at `index` as an atomic (the stream flags).
    pub(super) fn word(&self, index: usize) -> &AtomicU32 {
        assert!(
            (index + 1) * 4 <= self.len,
            "flag {index} outside pinned memory"
        );
        // SAFETY: in bounds (checked above), 4-byte aligned (page-aligned base, index * 4),
        // and only ever accessed atomically by the host (and by the device's stream waits).
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(index * 4).cast::<u32>()) }
    }

    /// The device address of the word at `index`.
    pub(super) fn word_device_ptr(&self, index: usize) -> sys::CUdeviceptr {
        self.device_ptr + (index * 4) as u64
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once; the owner synchronized
        // the streams that used it before dropping it.
        let _ = unsafe { result::free_host(self.ptr.as_ptr().cast()) };
    }
}

/// Copy `len` bytes from `src` (pinned) to device address `dst` on `stream`.
pub(super) fn copy_to_device(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    src: &Pinned,
    len: usize,
) -> Result<(), DriverError> {
    let src = &src.as_slice()[..len];
    stream.context().bind_to_thread()?;
    // SAFETY: `dst..dst+len` lies in a live device allocation (checked by the caller); `src`
    // is pinned memory that outlives the copy (the staging slot's event is waited on before
    // the slot is written again).
    unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }
}

/// Copy `len` bytes from device address `src` into `dst` (pinned) on `stream`.
pub(super) fn copy_to_host(
    stream: &CudaStream,
    dst: &mut Pinned,
    src: sys::CUdeviceptr,
    len: usize,
) -> Result<(), DriverError> {
    let dst = &mut dst.as_mut_slice()[..len];
    stream.context().bind_to_thread()?;
    // SAFETY: as for `copy_to_device`, the other way round; the host reads `dst` only after
    // the slot's event completes.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }
}

/// Copy `len` bytes between device addresses on `stream`.
pub(super) fn copy_on_device(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    len: usize,
) -> Result<(), DriverError> {
    stream.context().bind_to_thread()?;
    // SAFETY: both ranges lie in live device allocations and do not overlap (checked by the
    // caller).
    unsafe { result::memcpy_dtod_async(dst, src, len, stream.cu_stream()) }
}

/// Launch one of the kernels of `kernels.cu` with its device-pointer and count arguments.
pub(super) fn launch(
    stream: &CudaStream,
    function: &CudaFunction,
    config: LaunchConfig,
    args: &[u64],
) -> Result<(), DriverError> {
    let mut builder = stream.launch_builder(function);
    for arg in args {
        builder.arg(arg);
    }
    // SAFETY: every kernel of kernels.cu takes exactly these 64-bit arguments (pointers and
    // counts: `reduce(dst, src, n)`, `divide(dst, n, divisor)`), and the caller checked that
    // the `n` elements behind each pointer lie in live device memory.
    unsafe { builder.launch(config) }.map(|_| ())
}

/// Enqueue on `stream` a wait until the 32-bit word at device address `flag` is at least
/// `value` (a stream memory operation: the GPU front end polls the word; no host thread
/// blocks).
pub(super) fn wait_for_flag(
    stream: &CudaStream,
    flag: sys::CUdeviceptr,
    value: u32,
) -> Result<(), DriverError> {
    stream.context().bind_to_thread()?;
    let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: `flag` is the device address of a word of live, device-mapped pinned memory
    // that the owner keeps until the stream has passed this wait.
    unsafe { sys::cuStreamWaitValue32_v2(stream.cu_stream(), flag, value, geq) }.result()
}

/// Enqueue on `stream` a store of `value` into the 32-bit word at device address `flag`,
/// after the stream's earlier work (and its memory writes) completed.
pub(super) fn write_flag(
    stream: &CudaStream,
    flag: sys::CUdeviceptr,
    value: u32,
) -> Result<(), DriverError> {
    stream.context().bind_to_thread()?;
    // SAFETY: `flag` is the device address of a word of live, device-mapped pinned memory
    // that the owner keeps until the stream has passed this write (its retire event).
    unsafe { sys::cuStreamWriteValue32_v2(stream.cu_stream(), flag, value, 0) }.result()
}

/// The value of a stream flag, as the device last stored it.
pub(super) fn read_flag(flags: &Pinned, index: usize) -> u32 {
    flags.word(index).load(Ordering::Acquire)
}

/// Copy `len` bytes from device address `src` into `dst` (pinned, at `offset`) on `stream`.
pub(super) fn download(
    stream: &CudaStream,
    dst: &Pinned,
    offset: usize,
    src: sys::CUdeviceptr,
    len: usize,
) -> Result<(), DriverError> {
    assert!(offset + len <= dst.len, "download outside the mirror");
    stream.context().bind_to_thread()?;
    // SAFETY: `dst[offset..offset+len]` is pinned memory owned by the mirror, which outlives
    // the copy (kept until the stream's retire event); the host touches it only after the
    // ready flag that the stream writes after this copy. `src..src+len` lies in a device
    // allocation (checked by the caller).
    unsafe {
        sys::cuMemcpyDtoHAsync_v2(
            dst.ptr.as_ptr().add(offset).cast(),
            src,
            len,
            stream.cu_stream(),
        )
    }
    .result()
}

/// Copy `len` bytes from `src` (pinned) into device address `dst` on `stream`.
pub(super) fn upload(
    stream: &CudaStream,
    dst: sys::CUdeviceptr,
    src: &Pinned,
    len: usize,
) -> Result<(), DriverError> {
    assert!(len <= src.len, "upload outside the mirror");
    stream.context().bind_to_thread()?;
    // SAFETY: as for `download`, the other way round; the stream runs this copy only after
    // the host finished writing the mirror (the done flag it waits for).
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.ptr.as_ptr().cast(), len, stream.cu_stream()) }
        .result()
}

/// The first `len` bytes of a pinned mirror, lent to the host for one staged collective:
/// between the ready flag (the stream's download finished) and the done flag (the stream may
/// upload) the device neither reads nor writes them, and calls on one stream are staged one
/// after another, so the window that `HostStaged` holds is the only user of the bytes.
#[derive(Debug)]
pub(super) struct MirrorWindow {
    mirror: Arc<Pinned>,
    len: usize,
}

impl MirrorWindow {
    pub(super) fn new(mirror: Arc<Pinned>, len: usize) -> Self {
        assert!(len <= mirror.len, "mirror too small");
        MirrorWindow { mirror, len }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: in bounds (checked in `new`); see the type's comment for exclusivity.
        unsafe { std::slice::from_raw_parts(self.mirror.ptr.as_ptr(), self.len) }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: in bounds (checked in `new`); `&mut self` and the staging protocol (the
        // type's comment) make this the only access to the bytes while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.mirror.ptr.as_ptr(), self.len) }
    }
}

/// Store `value` into a stream flag, visible to the device's stream waits.
pub(super) fn set_flag(flags: &Pinned, index: usize, value: u32) {
    flags.word(index).store(value, Ordering::SeqCst);
}

/// The base and size of the allocation of this context that holds `address`, or an error
/// where `address` is not device memory (a host pointer, say).
pub(super) fn allocation_of(
    ctx: &CudaContext,
    address: sys::CUdeviceptr,
) -> Result<(sys::CUdeviceptr, usize), DriverError> {
    ctx.bind_to_thread()?;
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: cuMemGetAddressRange only reads the driver's allocation table and writes the
    // two outputs, which are valid locals.
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, address) }.result()?;
    Ok((base, size))
}

/// Wrap a stream that another library created (`0`: the legacy default stream).
///
/// # Safety
/// `raw` must be a live stream of `ctx` that outlives the wrapper's use.
pub(super) unsafe fn borrowed_stream(ctx: &Arc<CudaContext>, raw: u64) -> Arc<CudaStream> {
    // SAFETY: forwarded to the caller; the wrapper does not destroy the stream on drop.
    unsafe { ctx.wrap_borrowed_stream(raw as sys::CUstream) }
}
