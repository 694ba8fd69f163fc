//! The exported `bcl*` functions. Each checks its arguments, converts them, and calls the core
//! through the one guard (`guard::call`). Contracts (which pointer may be NULL where, in-place rules)
//! are the ones written in `include/bcl.h`.

use crate::guard::{call, call_status, last_error};
use crate::host_stream::{self, RawHost};
use crate::registry;
use crate::types::*;
use bcl_core::config::{limits, process_env};
use bcl_core::{
    Collective, CommBuilder, CommConfig, Communicator, DataType, Error, Exclude, ShrinkMode,
    TransportKind, UniqueId,
};
use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::time::Duration;

/// `bclComm_t`: an opaque handle (see the registry).
pub type BclComm = *mut c_void;
/// `bclStream_t`: with host-memory communicators (cpu, sim, plugins) NULL (the call completes
/// before it returns) or a host stream (`bclStreamCreate`: it is queued and returns at once);
/// a `cudaStream_t` (or NULL, the legacy default stream) with the cuda backend.
pub type BclStream = *mut c_void;
/// `bclEvent_t`: a point on a host stream (`bclEventRecord`).
pub type BclEvent = *mut c_void;

fn invalid(text: String) -> Error {
    Error::InvalidArgument(text)
}

fn need<T>(ptr: *mut T, what: &str) -> Result<*mut T, Error> {
    if ptr.is_null() {
        Err(invalid(format!("{what} is NULL")))
    } else {
        Ok(ptr)
    }
}

/// Write `value` through the output parameter `ptr`.
///
/// # Safety
/// `ptr` must be NULL (reported as an error) or valid for a write of `T`.
unsafe fn store<T>(ptr: *mut T, what: &str, value: T) -> Result<(), Error> {
    let out = need(ptr, what)?;
    // SAFETY: non-null, and the caller guarantees it is writable (bcl.h's contract).
    unsafe { out.write(value) };
    Ok(())
}

fn byte_len(count: usize, dtype: DataType) -> Result<usize, Error> {
    count
        .checked_mul(dtype.size())
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or_else(|| {
            invalid(format!(
                "count {count} of {dtype} is too large (negative count passed as size_t?)"
            ))
        })
}

fn rank_arg(v: c_int, what: &str) -> Result<usize, Error> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} {v} is negative")))
}

/// # Safety
/// `ptr` must be NULL or valid for reads of `len` bytes for the duration of the call.
unsafe fn read_slice<'a>(ptr: *const c_void, len: usize, what: &str) -> Result<&'a [u8], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(invalid(format!(
            "{what} is NULL but {len} bytes are needed"
        )));
    }
    // SAFETY: non-null, and the caller guarantees `len` readable bytes (bcl.h's contract);
    // `len <= isize::MAX` was checked by `byte_len`.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// # Safety
/// `ptr` must be NULL or valid for reads and writes of `len` bytes, not aliased by any other
/// slice of this call, for the duration of the call.
unsafe fn write_slice<'a>(ptr: *mut c_void, len: usize, what: &str) -> Result<&'a mut [u8], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(invalid(format!(
            "{what} is NULL but {len} bytes are needed"
        )));
    }
    // SAFETY: non-null, `len` writable bytes by bcl.h's contract, and the callers below only
    // create it after checking it does not overlap the read slice.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) })
}

/// Whether C callers pass this communicator's device memory as pointers (and streams as the
/// device's own): a device that declares external memory (cuda). Every other device takes
/// host memory through the C ABI.
fn takes_device_pointers(comm: &Communicator) -> bool {
    comm.accelerator().info().capabilities.external_memory
}

fn overlaps(a: usize, alen: usize, b: usize, blen: usize) -> bool {
    alen > 0 && blen > 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

/// Run `collective` on caller memory, detecting in-place calls by NCCL's rules.
///
/// # Safety
/// `send`/`recv` as `bcl.h` documents for the collective.
unsafe fn host_call(
    comm: BclComm,
    collective: Collective,
    count: usize,
    datatype: c_int,
    send: *const c_void,
    recv: *mut c_void,
    stream: BclStream,
) -> Result<(), Error> {
    let dtype = data_type(datatype)?;
    let comm = registry::get(comm as usize)?;
    if takes_device_pointers(&comm) {
        // SAFETY: bcl.h's contract for device buffers and streams.
        return unsafe { device_call(&comm, collective, count, dtype, send, recv, stream) };
    }
    let call = CallShape::of(&comm, collective, count, dtype, send, recv)?;
    if !stream.is_null() {
        return queue_on_host_stream(&comm, collective, count, dtype, &call, send, recv, stream);
    }
    if let Some((address, len)) = call.in_place {
        // SAFETY: bcl.h: the in-place buffer is valid for `len` bytes.
        let buf = unsafe { write_slice(address as *mut c_void, len, "recvbuff")? };
        return comm.run_host(collective, count, dtype, None, Some(buf));
    }
    // SAFETY: bcl.h's contract for each buffer; they do not overlap (`CallShape::of`).
    let input = match call.input {
        Some(len) => Some(unsafe { read_slice(send, len, "sendbuff")? }),
        None => None,
    };
    let output = match call.output {
        Some(len) => Some(unsafe { write_slice(recv, len, "recvbuff")? }),
        None => None,
    };
    comm.run_host(collective, count, dtype, input, output)
}

/// Queue a host-memory collective on a host stream: it returns at once; the buffers are the
/// operation's until the stream or an event says it has finished (bcl.h).
fn queue_on_host_stream(
    comm: &Communicator,
    collective: Collective,
    count: usize,
    dtype: DataType,
    call: &CallShape,
    send: *const c_void,
    recv: *mut c_void,
    stream: BclStream,
) -> Result<(), Error> {
    let host = host_stream::stream(stream as usize)?;
    let (input, output) = match call.in_place {
        Some((address, len)) => (None, Some(present(address, len, "recvbuff")?)),
        None => (
            call.input
                .map(|len| present(send as usize, len, "sendbuff"))
                .transpose()?,
            call.output
                .map(|len| present(recv as usize, len, "recvbuff"))
                .transpose()?,
        ),
    };
    queue_memory(comm, &host, collective, count, dtype, input, output)
}

/// Queue caller memory ((address, bytes) of the input and output) on `host`.
fn queue_memory(
    comm: &Communicator,
    host: &host_stream::HostStream,
    collective: Collective,
    count: usize,
    dtype: DataType,
    input: Option<(usize, usize)>,
    output: Option<(usize, usize)>,
) -> Result<(), Error> {
    let (after, done) = host.next_order();
    let memory = RawHost {
        input,
        output,
        after,
        done,
    };
    let work = comm.submit_host(collective, count, dtype, Box::new(memory))?;
    host.push(work);
    Ok(())
}

/// (address, bytes) of caller memory handed to a queued operation; NULL only when empty.
fn present(ptr: usize, len: usize, what: &str) -> Result<(usize, usize), Error> {
    if ptr == 0 && len > 0 {
        return Err(invalid(format!(
            "{what} is NULL but {len} bytes are needed"
        )));
    }
    Ok((ptr, len))
}

/// What one collective call's pointers mean by NCCL's in-place rules.
struct CallShape {
    /// In place: the one buffer (address, bytes), the larger of the two sides.
    in_place: Option<(usize, usize)>,
    /// Out of place: the bytes of the send and receive buffers this rank uses.
    input: Option<usize>,
    output: Option<usize>,
}

impl CallShape {
    fn of(
        comm: &Communicator,
        collective: Collective,
        count: usize,
        dtype: DataType,
        send: *const c_void,
        recv: *mut c_void,
    ) -> Result<Self, Error> {
        let (rank, world) = (comm.rank(), comm.world_size());
        let (inp, out) = collective.buffer_elems(count, world, rank);
        let in_bytes = byte_len(inp.unwrap_or(0), dtype)?;
        let out_bytes = byte_len(out.unwrap_or(0), dtype)?;
        let block = byte_len(count, dtype)?.saturating_mul(rank);
        let (s, r) = (send as usize, recv as usize);
        let in_place = match collective {
            Collective::AllGather => s != 0 && s == r.wrapping_add(block),
            Collective::ReduceScatter { .. } => r != 0 && r == s.wrapping_add(block),
            Collective::Broadcast { root } => s == r || rank != root,
            Collective::Reduce { root, .. } => s == r && rank == root,
            Collective::Gather { root } => rank == root && s != 0 && s == r.wrapping_add(block),
            Collective::Scatter { root } => rank == root && r != 0 && r == s.wrapping_add(block),
            _ => s != 0 && s == r,
        };
        if in_place {
            let buffer = match collective {
                Collective::ReduceScatter { .. } | Collective::Scatter { .. } => (s, in_bytes),
                Collective::AllGather | Collective::Gather { .. } => (r, out_bytes),
                _ => (r, in_bytes.max(out_bytes)),
            };
            return Ok(CallShape {
                in_place: Some(buffer),
                input: None,
                output: None,
            });
        }
        if overlaps(s, in_bytes, r, out_bytes) {
            return Err(invalid(
                "sendbuff and recvbuff overlap without being an in-place call".into(),
            ));
        }
        Ok(CallShape {
            in_place: None,
            input: inp.map(|_| in_bytes),
            output: out.map(|_| out_bytes),
        })
    }
}

/// A collective of a communicator on a CUDA device: `send`/`recv` are device pointers of its
/// GPU and `stream` a `cudaStream_t` (NULL: the legacy default stream). As NCCL's: it starts
/// after the work already on `stream`, the stream's later work waits for it, and the call
/// returns at once (`Communicator::submit_staged`: the stream copies the data through pinned
/// host memory and the progress thread makes no CUDA calls, so the caller may block on the
/// stream right away). Its failure poisons the communicator (`bclCommGetAsyncError`).
///
/// # Safety
/// `send`/`recv` device memory of the communicator's GPU as `bcl.h` documents, allocated
/// until the stream has passed the call; `stream` a live stream of the GPU's context.
unsafe fn device_call(
    comm: &Communicator,
    collective: Collective,
    count: usize,
    dtype: DataType,
    send: *const c_void,
    recv: *mut c_void,
    stream: BclStream,
) -> Result<(), Error> {
    let rank = comm.rank();
    let call = CallShape::of(comm, collective, count, dtype, send, recv)?;
    let (s, r) = (send as usize, recv as usize);
    let acc = comm.accelerator();
    let borrow = |address: usize, len: usize, what: &str| {
        if address == 0 && len > 0 {
            return Err(invalid(format!(
                "{what} is NULL but {len} bytes are needed"
            )));
        }
        // SAFETY: bcl.h: device buffers stay allocated until the stream passes the call, and
        // the caller touches them only in stream order; the backend checks the range lies in
        // one allocation of its GPU.
        unsafe { acc.borrow_memory(address as u64, len) }
            .map_err(|e| invalid(format!("rank {rank}: {what}: {e}")))
    };
    // SAFETY: bcl.h: `stream` is NULL or a live stream of the communicator's GPU.
    let stream = unsafe { acc.borrow_stream(stream as u64) }.map_err(|source| Error::Device {
        rank,
        device: acc.info().to_string(),
        source,
    })?;
    let work = if let Some((address, len)) = call.in_place {
        let buffer = borrow(address, len, "recvbuff")?;
        comm.submit_staged(collective, count, dtype, None, Some(&buffer), &stream)?
    } else {
        let input = call
            .input
            .map(|len| borrow(s, len, "sendbuff"))
            .transpose()?;
        let output = call
            .output
            .map(|len| borrow(r, len, "recvbuff"))
            .transpose()?;
        comm.submit_staged(
            collective,
            count,
            dtype,
            input.as_ref(),
            output.as_ref(),
            &stream,
        )?
    };
    // Completion is the stream's business now; a failure poisons the communicator.
    drop(work);
    Ok(())
}

// ---------------------------------------------------------------- version, ids, errors

/// # Safety
/// `version` must be NULL or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclGetVersion(version: *mut c_int) -> BclResult {
    // SAFETY: bcl.h: `version` is NULL or a writable int.
    call("bclGetVersion", || unsafe {
        store(version, "version", BCL_VERSION_CODE)
    })
}

/// # Safety
/// `unique_id` must be NULL or point to a writable `bclUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclGetUniqueId(unique_id: *mut BclUniqueId) -> BclResult {
    call("bclGetUniqueId", || {
        need(unique_id, "uniqueId")?;
        let ip = match process_env("BCL_BIND_IP") {
            Some(v) => v
                .parse()
                .map_err(|_| invalid(format!("BCL_BIND_IP='{v}' is not an IP address")))?,
            None => std::net::Ipv4Addr::LOCALHOST.into(),
        };
        let text = UniqueId::new(ip)?.to_string();
        let mut id = BclUniqueId { internal: [0; 128] };
        id.internal[..text.len()].copy_from_slice(text.as_bytes());
        // SAFETY: bcl.h: `uniqueId` is a writable bclUniqueId.
        unsafe { store(unique_id, "uniqueId", id) }
    })
}

fn parse_id(id: &BclUniqueId) -> Result<UniqueId, Error> {
    let end = id
        .internal
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(id.internal.len());
    std::str::from_utf8(&id.internal[..end])
        .map_err(|_| invalid("unique id is not text made by bclGetUniqueId".into()))?
        .parse()
}

#[unsafe(no_mangle)]
pub extern "C" fn bclGetErrorString(result: BclResult) -> *const c_char {
    describe(result).as_ptr()
}

/// The calling thread's last error message (empty if none). `comm` may be NULL.
#[unsafe(no_mangle)]
pub extern "C" fn bclGetLastError(_comm: BclComm) -> *const c_char {
    last_error()
}

// ---------------------------------------------------------------- communicators

fn init(out: *mut BclComm, f: impl FnOnce() -> Result<Communicator, Error>) -> Result<(), Error> {
    need(out, "comm")?;
    let id = registry::insert(f()?);
    // SAFETY: bcl.h: `comm` is a writable bclComm_t.
    unsafe { store(out, "comm", id as BclComm) }
}

/// # Safety
/// `comm` must be NULL or point to a writable `bclComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommInitRank(
    comm: *mut BclComm,
    nranks: c_int,
    comm_id: BclUniqueId,
    rank: c_int,
) -> BclResult {
    call("bclCommInitRank", || {
        init(comm, || {
            let config = CommConfig::default().with_env(&process_env)?;
            Communicator::init(
                rank_arg(rank, "rank")?,
                rank_arg(nranks, "nranks")?,
                &parse_id(&comm_id)?,
                config,
            )
        })
    })
}

/// # Safety
/// `comm` as for `bclCommInitRank`; `config` NULL or a `bclConfig_t` made with
/// `BCL_CONFIG_INITIALIZER`, whose strings are NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommInitRankConfig(
    comm: *mut BclComm,
    nranks: c_int,
    comm_id: BclUniqueId,
    rank: c_int,
    config: *const BclConfig,
) -> BclResult {
    call("bclCommInitRankConfig", || {
        let mut c = CommConfig::default().with_env(&process_env)?;
        if !config.is_null() {
            // SAFETY: non-null; bcl.h requires a bclConfig_t, whose first field is its size,
            // checked before any later field is read.
            let size = unsafe { (*config).size };
            if size < std::mem::size_of::<BclConfig>() {
                return Err(invalid(format!(
                    "config.size {size} is smaller than bclConfig_t: use BCL_CONFIG_INITIALIZER"
                )));
            }
            // SAFETY: as above; the whole struct is readable.
            let cfg = unsafe { &*config };
            if cfg.magic != BCL_CONFIG_MAGIC || cfg.version == 0 {
                return Err(invalid(
                    "config was not made with BCL_CONFIG_INITIALIZER (bad magic or version)".into(),
                ));
            }
            let text = |p: *const c_char, what: &str| -> Result<Option<String>, Error> {
                if p.is_null() {
                    return Ok(None);
                }
                // SAFETY: bcl.h: strings in the config are NULL or NUL-terminated.
                let s = unsafe { CStr::from_ptr(p) };
                s.to_str()
                    .map(|s| Some(s.to_string()))
                    .map_err(|_| invalid(format!("config.{what} is not UTF-8")))
            };
            if let Some(d) = text(cfg.device, "device")? {
                c.device = d
                    .parse()
                    .map_err(|e| invalid(format!("config.device: {e}")))?;
            }
            if let Some(t) = text(cfg.transport, "transport")? {
                c.transport = TransportKind::parse(&t)?;
            }
            // Zero keeps the default; anything else is checked against its range.
            if cfg.sockets_per_peer != 0 {
                let n = i64::from(cfg.sockets_per_peer);
                c.sockets_per_peer = limits::SOCKETS.from_i64("config.socketsPerPeer", n)?;
            }
            let seconds = |v: f64, what: &str| -> Result<Option<Duration>, Error> {
                match v {
                    0.0 => Ok(None),
                    v => limits::TIMEOUT.from_f64(what, v).map(Some),
                }
            };
            if let Some(d) = seconds(cfg.init_timeout_seconds, "config.initTimeoutSeconds")? {
                c.init_timeout = d;
            }
            if let Some(d) = seconds(cfg.timeout_seconds, "config.timeoutSeconds")? {
                c.op_timeout = d;
            }
        }
        init(comm, || {
            Communicator::init(
                rank_arg(rank, "rank")?,
                rank_arg(nranks, "nranks")?,
                &parse_id(&comm_id)?,
                c,
            )
        })
    })
}

/// # Safety
/// `comm` must be NULL or point to a writable `bclComm_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommInitFromEnv(comm: *mut BclComm) -> BclResult {
    call("bclCommInitFromEnv", || {
        init(comm, Communicator::init_from_env)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclCommFinalize(comm: BclComm) -> BclResult {
    call("bclCommFinalize", || {
        registry::get(comm as usize).map(|_| ())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclCommDestroy(comm: BclComm) -> BclResult {
    call("bclCommDestroy", || {
        registry::remove(comm as usize).map(drop)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclCommAbort(comm: BclComm) -> BclResult {
    call("bclCommAbort", || {
        let c = registry::remove(comm as usize)?;
        c.abort();
        Ok(())
    })
}

/// The new communicator's settings: bcl.h asks for NULL (the parent's settings are kept).
fn no_config(config: *const BclConfig) -> Result<(), Error> {
    if config.is_null() {
        Ok(())
    } else {
        Err(invalid(
            "config must be NULL: a split, shrunk or grown communicator takes its parent's settings"
                .into(),
        ))
    }
}

/// Store `child` (if any) in `*newcomm`, or NULL.
///
/// # Safety
/// `newcomm` must be NULL (an error) or point to a writable `bclComm_t`.
unsafe fn store_child(newcomm: *mut BclComm, child: Option<Communicator>) -> Result<(), Error> {
    need(newcomm, "newcomm")?;
    let handle = child.map_or(std::ptr::null_mut(), |c| registry::insert(c) as BclComm);
    // SAFETY: bcl.h: `newcomm` is a writable bclComm_t.
    unsafe { store(newcomm, "newcomm", handle) }
}

/// # Safety
/// `newcomm` must be NULL or point to a writable `bclComm_t`; `config` must be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommSplit(
    comm: BclComm,
    color: c_int,
    key: c_int,
    newcomm: *mut BclComm,
    config: *const BclConfig,
) -> BclResult {
    call("bclCommSplit", || {
        need(newcomm, "newcomm")?;
        no_config(config)?;
        let color = match color {
            BCL_SPLIT_NOCOLOR => None,
            c if c < 0 => {
                return Err(invalid(format!(
                    "color {c} is negative (use a color >= 0, or BCL_SPLIT_NOCOLOR)"
                )));
            }
            c => Some(c as u32),
        };
        let parent = registry::get(comm as usize)?;
        let child = parent.split(color, key)?;
        // SAFETY: checked non-NULL above; bcl.h: a writable bclComm_t.
        unsafe { store_child(newcomm, child) }
    })
}

/// `count` ranks from C (each checked as a rank).
///
/// # Safety
/// `list` must be NULL or valid for reads of `count` ints.
unsafe fn read_ranks(list: *const c_int, count: usize, what: &str) -> Result<Vec<usize>, Error> {
    let size = count
        .checked_mul(std::mem::size_of::<c_int>())
        .ok_or_else(|| invalid(format!("{count} ranks in {what} is too many")))?;
    // SAFETY: the caller's promise; read_slice refuses NULL with a non-zero count.
    let bytes = unsafe { read_slice(list.cast(), size, what)? };
    bytes
        .chunks_exact(std::mem::size_of::<c_int>())
        .map(|b| {
            let v = c_int::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            rank_arg(v, &format!("a rank in {what}"))
        })
        .collect()
}

/// # Safety
/// `ranks` must be NULL or valid for reads of `nranks` ints; `newcomm` must be NULL or point
/// to a writable `bclComm_t`; `config` must be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommCreateGroup(
    comm: BclComm,
    ranks: *const c_int,
    nranks: c_int,
    tag: c_int,
    newcomm: *mut BclComm,
    config: *const BclConfig,
) -> BclResult {
    call("bclCommCreateGroup", || {
        need(newcomm, "newcomm")?;
        no_config(config)?;
        let count = rank_arg(nranks, "nranks")?;
        let tag = u32::try_from(tag)
            .map_err(|_| invalid(format!("tag {tag} is negative (use a tag >= 0)")))?;
        // SAFETY: bcl.h: `ranks` holds `nranks` ints.
        let members = unsafe { read_ranks(ranks, count, "ranks")? };
        let child = registry::get(comm as usize)?.create_group(&members, tag)?;
        // SAFETY: checked non-NULL above; bcl.h: a writable bclComm_t.
        unsafe { store_child(newcomm, Some(child)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclCommRevoke(comm: BclComm, flags: c_int) -> BclResult {
    call("bclCommRevoke", || {
        if flags != 0 {
            return Err(invalid(format!(
                "revoke flags {flags}: none are defined, pass 0"
            )));
        }
        registry::get(comm as usize)?.revoke();
        Ok(())
    })
}

/// # Safety
/// `exclude` must be NULL or valid for reads of `exclude_count` ints; `newcomm` must be NULL
/// or point to a writable `bclComm_t`; `config` must be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommShrink(
    comm: BclComm,
    exclude: *const c_int,
    exclude_count: c_int,
    newcomm: *mut BclComm,
    config: *const BclConfig,
    flags: c_int,
) -> BclResult {
    call("bclCommShrink", || {
        need(newcomm, "newcomm")?;
        no_config(config)?;
        if flags & !(BCL_SHRINK_ABORT | BCL_SHRINK_FAILED) != 0 {
            return Err(invalid(format!(
                "shrink flags {flags:#x}: only BCL_SHRINK_ABORT and BCL_SHRINK_FAILED are defined"
            )));
        }
        let count = rank_arg(exclude_count, "excludeRanksCount")?;
        let mode = if flags & BCL_SHRINK_ABORT != 0 {
            ShrinkMode::Abort
        } else {
            ShrinkMode::Default
        };
        let parent = registry::get(comm as usize)?;
        let child = if flags & BCL_SHRINK_FAILED != 0 {
            if !exclude.is_null() || count != 0 {
                return Err(invalid(
                    "BCL_SHRINK_FAILED takes no list: pass NULL and 0 (the survivors agree on the failed ranks)".into(),
                ));
            }
            parent.shrink(Exclude::Failed, mode)?
        } else {
            // SAFETY: bcl.h: `excludeRanksList` holds `excludeRanksCount` ints.
            let ranks = unsafe { read_ranks(exclude, count, "excludeRanksList")? };
            parent.shrink(Exclude::Ranks(&ranks), mode)?
        };
        // SAFETY: checked non-NULL above; bcl.h: a writable bclComm_t.
        unsafe { store_child(newcomm, Some(child)) }
    })
}

/// # Safety
/// `unique_id` must be NULL or point to a writable `bclUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommGetUniqueId(
    comm: BclComm,
    unique_id: *mut BclUniqueId,
) -> BclResult {
    call("bclCommGetUniqueId", || {
        need(unique_id, "uniqueId")?;
        let text = registry::get(comm as usize)?.grow_unique_id()?.to_string();
        let mut id = BclUniqueId { internal: [0; 128] };
        id.internal[..text.len()].copy_from_slice(text.as_bytes());
        // SAFETY: bcl.h: `uniqueId` is a writable bclUniqueId.
        unsafe { store(unique_id, "uniqueId", id) }
    })
}

/// # Safety
/// `unique_id` must be NULL or point to a readable `bclUniqueId`; `newcomm` must be NULL or
/// point to a writable `bclComm_t`; `config` must be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommGrow(
    comm: BclComm,
    nranks: c_int,
    unique_id: *const BclUniqueId,
    rank: c_int,
    newcomm: *mut BclComm,
    config: *const BclConfig,
) -> BclResult {
    call("bclCommGrow", || {
        need(newcomm, "newcomm")?;
        no_config(config)?;
        let n = rank_arg(nranks, "nRanks")?;
        let id = if unique_id.is_null() {
            None
        } else {
            // SAFETY: non-NULL; bcl.h: a readable bclUniqueId.
            Some(parse_id(unsafe { &*unique_id })?)
        };
        let child = if comm.is_null() {
            let id = id.ok_or_else(|| {
                invalid("a new rank (comm NULL) must pass the id its root made".into())
            })?;
            let rank = rank_arg(rank, "rank")?;
            let config = CommConfig::default().with_env(&process_env)?;
            CommBuilder::new(config).join_grown(rank, n, &id)?
        } else {
            if rank != -1 {
                return Err(invalid(format!(
                    "rank {rank}: an existing rank passes its communicator and rank -1 (it keeps its rank)"
                )));
            }
            registry::get(comm as usize)?.grow(n, id.as_ref())?
        };
        // SAFETY: checked non-NULL above; bcl.h: a writable bclComm_t.
        unsafe { store_child(newcomm, Some(child)) }
    })
}

/// # Safety
/// `async_error` must be NULL or point to a writable `bclResult_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommGetAsyncError(
    comm: BclComm,
    async_error: *mut BclResult,
) -> BclResult {
    call("bclCommGetAsyncError", || {
        need(async_error, "asyncError")?;
        let c = registry::get(comm as usize)?;
        let code = if c.async_error().is_some() {
            BCL_POISONED
        } else {
            BCL_SUCCESS
        };
        // SAFETY: bcl.h: `asyncError` is a writable bclResult_t.
        unsafe { store(async_error, "asyncError", code) }
    })
}

/// # Safety
/// `count` must be NULL or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommCount(comm: BclComm, count: *mut c_int) -> BclResult {
    call("bclCommCount", || {
        need(count, "count")?;
        let n = registry::get(comm as usize)?.world_size() as c_int;
        // SAFETY: bcl.h: `count` is a writable int.
        unsafe { store(count, "count", n) }
    })
}

/// # Safety
/// `rank` must be NULL or point to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommUserRank(comm: BclComm, rank: *mut c_int) -> BclResult {
    call("bclCommUserRank", || {
        need(rank, "rank")?;
        let r = registry::get(comm as usize)?.rank() as c_int;
        // SAFETY: bcl.h: `rank` is a writable int.
        unsafe { store(rank, "rank", r) }
    })
}

/// # Safety
/// `buffer` NULL or writable for `size` bytes; `needed` NULL or a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclCommHealthReport(
    comm: BclComm,
    buffer: *mut c_char,
    size: usize,
    needed: *mut usize,
) -> BclResult {
    call("bclCommHealthReport", || {
        let c = registry::get(comm as usize)?;
        let peers: Vec<_> = c
            .peers()
            .iter()
            .map(|p| serde_json::json!({"rank": p.rank, "host": p.hostname, "pid": p.pid, "device": p.device.to_string(), "model": p.device.model}))
            .collect();
        let mut report = c.health_report();
        report["async_error"] = serde_json::json!(c.async_error());
        report["peers"] = serde_json::json!(peers);
        let report = report.to_string();
        let want = report.len() + 1;
        if !needed.is_null() {
            // SAFETY: non-null, writable by bcl.h's contract.
            unsafe { *needed = want };
        }
        if buffer.is_null() || size < want {
            return Err(invalid(format!(
                "buffer of {size} bytes is too small for the report ({want} bytes)"
            )));
        }
        // SAFETY: `buffer` is writable for `size >= want` bytes.
        let out = unsafe { write_slice(buffer.cast(), want, "buffer")? };
        out[..report.len()].copy_from_slice(report.as_bytes());
        out[report.len()] = 0;
        Ok(())
    })
}

// ---------------------------------------------------------------- collectives

/// # Safety
/// See `bclAllReduce` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclAllReduce", || {
        let c = Collective::AllReduce { op: red_op(op)? };
        // SAFETY: bcl.h's contract for bclAllReduce.
        unsafe { host_call(comm, c, count, datatype, sendbuff, recvbuff, stream) }
    })
}

/// # Safety
/// See `bclAllGather` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    // SAFETY: bcl.h's contract for bclAllGather.
    call("bclAllGather", || unsafe {
        host_call(
            comm,
            Collective::AllGather,
            sendcount,
            datatype,
            sendbuff,
            recvbuff,
            stream,
        )
    })
}

/// # Safety
/// See `bclReduceScatter` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclReduceScatter", || {
        let c = Collective::ReduceScatter { op: red_op(op)? };
        // SAFETY: bcl.h's contract for bclReduceScatter.
        unsafe { host_call(comm, c, recvcount, datatype, sendbuff, recvbuff, stream) }
    })
}

/// # Safety
/// See `bclBroadcast` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclBroadcast", || {
        let c = Collective::Broadcast {
            root: rank_arg(root, "root")?,
        };
        // SAFETY: bcl.h's contract for bclBroadcast.
        unsafe { host_call(comm, c, count, datatype, sendbuff, recvbuff, stream) }
    })
}

/// # Safety
/// See `bclReduce` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclReduce", || {
        let c = Collective::Reduce {
            op: red_op(op)?,
            root: rank_arg(root, "root")?,
        };
        // SAFETY: bcl.h's contract for bclReduce.
        unsafe { host_call(comm, c, count, datatype, sendbuff, recvbuff, stream) }
    })
}

/// # Safety
/// See `bclGather` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    root: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclGather", || {
        let c = Collective::Gather {
            root: rank_arg(root, "root")?,
        };
        // SAFETY: bcl.h's contract for bclGather.
        unsafe { host_call(comm, c, sendcount, datatype, sendbuff, recvbuff, stream) }
    })
}

/// # Safety
/// See `bclScatter` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    root: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclScatter", || {
        let c = Collective::Scatter {
            root: rank_arg(root, "root")?,
        };
        // SAFETY: bcl.h's contract for bclScatter.
        unsafe { host_call(comm, c, recvcount, datatype, sendbuff, recvbuff, stream) }
    })
}

/// # Safety
/// See `bclAllToAllv` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclAllToAllv(
    sendbuff: *const c_void,
    sendcounts: *const usize,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    datatype: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclAllToAllv", || {
        let comm = registry::get(comm as usize)?;
        // SAFETY: bcl.h: both count arrays hold nranks entries.
        let counts = bcl_core::AllToAllCounts {
            send: unsafe { count_array(&comm, sendcounts, "sendcounts")? },
            recv: unsafe { count_array(&comm, recvcounts, "recvcounts")? },
        };
        let v = Collective::AllToAllV;
        // SAFETY: bcl.h's contract for bclAllToAllv.
        unsafe { v_call(&comm, v, counts, datatype, sendbuff, recvbuff, stream) }
    })
}

/// # Safety
/// See `bclAllGatherv` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclAllGatherv(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    datatype: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclAllGatherv", || {
        let comm = registry::get(comm as usize)?;
        // SAFETY: bcl.h: the count array holds nranks entries.
        let per_rank = unsafe { count_array(&comm, recvcounts, "recvcounts")? };
        let counts = bcl_core::AllToAllCounts {
            send: vec![per_rank[comm.rank()]; per_rank.len()],
            recv: per_rank,
        };
        let v = Collective::AllGatherV;
        // SAFETY: bcl.h's contract for bclAllGatherv.
        unsafe { v_call(&comm, v, counts, datatype, sendbuff, recvbuff, stream) }
    })
}

/// # Safety
/// See `bclReduceScatterv` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclReduceScatterv(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    datatype: c_int,
    op: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    call("bclReduceScatterv", || {
        let comm = registry::get(comm as usize)?;
        let op = red_op(op)?;
        // SAFETY: bcl.h: the count array holds nranks entries.
        let per_rank = unsafe { count_array(&comm, recvcounts, "recvcounts")? };
        let counts = bcl_core::AllToAllCounts {
            recv: vec![per_rank[comm.rank()]; per_rank.len()],
            send: per_rank,
        };
        let v = Collective::ReduceScatterV { op };
        // SAFETY: bcl.h's contract for bclReduceScatterv.
        unsafe { v_call(&comm, v, counts, datatype, sendbuff, recvbuff, stream) }
    })
}

/// The nranks counts at `ptr` (NULL: an error naming `what`).
///
/// # Safety
/// `ptr` is NULL or valid for reads of nranks `size_t`s.
unsafe fn count_array(
    comm: &Communicator,
    ptr: *const usize,
    what: &str,
) -> Result<Vec<usize>, Error> {
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller's contract (bcl.h: nranks entries).
    Ok(unsafe { std::slice::from_raw_parts(ptr, comm.world_size()) }.to_vec())
}

/// A collective with per-rank counts on caller memory: blocking, or queued on a host stream.
///
/// # Safety
/// `send`/`recv` as bcl.h documents for the collective: valid for the bytes the counts give.
unsafe fn v_call(
    comm: &Communicator,
    collective: Collective,
    counts: bcl_core::AllToAllCounts,
    datatype: c_int,
    send: *const c_void,
    recv: *mut c_void,
    stream: BclStream,
) -> Result<(), Error> {
    let dtype = data_type(datatype)?;
    if takes_device_pointers(comm) {
        return Err(invalid(format!(
            "rank {}: {} of GPU memory is not implemented yet; stage through host memory on a \
             cpu communicator",
            comm.rank(),
            collective.name()
        )));
    }
    let me = comm.rank();
    let total = |c: &[usize], what: &str| -> Result<usize, Error> {
        c.iter()
            .try_fold(0usize, |a, &x| a.checked_add(x))
            .ok_or_else(|| invalid(format!("{what} overflow")))
            .and_then(|e| byte_len(e, dtype))
    };
    let in_bytes = match collective {
        Collective::AllGatherV => total(&counts.send[me..=me], "recvcounts")?,
        _ => total(&counts.send, "sendcounts")?,
    };
    let out_bytes = match collective {
        Collective::ReduceScatterV { .. } => total(&counts.recv[me..=me], "recvcounts")?,
        _ => total(&counts.recv, "recvcounts")?,
    };
    let (s, r) = (send as usize, recv as usize);
    if overlaps(s, in_bytes, r, out_bytes) {
        return Err(invalid(format!(
            "{}: sendbuff and recvbuff overlap (it has no in-place form)",
            collective.name()
        )));
    }
    if !stream.is_null() {
        let host = host_stream::stream(stream as usize)?;
        let (after, done) = host.next_order();
        let memory = RawHost {
            input: Some(present(s, in_bytes, "sendbuff")?),
            output: Some(present(r, out_bytes, "recvbuff")?),
            after,
            done,
        };
        host.push(comm.submit_host_v(collective, counts, dtype, Box::new(memory))?);
        return Ok(());
    }
    // SAFETY: bcl.h's contract for each buffer; they do not overlap (checked above).
    let input = unsafe { read_slice(send, in_bytes, "sendbuff")? };
    // SAFETY: as above.
    let output = unsafe { write_slice(recv, out_bytes, "recvbuff")? };
    comm.run_host_v(collective, counts, dtype, input, output)
}

/// # Safety
/// See `bclAllToAll` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclAllToAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    // SAFETY: bcl.h's contract for bclAllToAll.
    call("bclAllToAll", || unsafe {
        host_call(
            comm,
            Collective::AllToAll,
            count,
            datatype,
            sendbuff,
            recvbuff,
            stream,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclBarrier(comm: BclComm, stream: BclStream) -> BclResult {
    call("bclBarrier", || {
        let comm = registry::get(comm as usize)?;
        if takes_device_pointers(&comm) {
            let acc = comm.accelerator();
            // SAFETY: bcl.h: `stream` is NULL or a live stream of the communicator's GPU.
            let stream =
                unsafe { acc.borrow_stream(stream as u64) }.map_err(|source| Error::Device {
                    rank: comm.rank(),
                    device: acc.info().to_string(),
                    source,
                })?;
            drop(comm.submit_staged(
                Collective::Barrier,
                0,
                DataType::Uint8,
                None,
                None,
                &stream,
            )?);
            return Ok(());
        }
        if !stream.is_null() {
            let host = host_stream::stream(stream as usize)?;
            let barrier = Collective::Barrier;
            return queue_memory(&comm, &host, barrier, 0, DataType::Uint8, None, None);
        }
        comm.barrier()
    })
}

// ---------------------------------------------------------------- point to point, groups

#[derive(Clone, Copy)]
struct PendingP2p {
    comm: usize,
    send: bool,
    buf: usize,
    count: usize,
    datatype: c_int,
    peer: c_int,
    /// A host stream to queue it on, or 0 (NULL): run before the call returns.
    stream: usize,
}

#[derive(Default)]
struct Group {
    depth: usize,
    pending: Vec<PendingP2p>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// # Safety
/// The buffer of `p` is valid for its count (bcl.h: until bclGroupEnd returns, or on a host
/// stream until the stream has passed the call).
unsafe fn p2p(p: PendingP2p) -> Result<(), Error> {
    let dtype = data_type(p.datatype)?;
    let peer = rank_arg(p.peer, "peer")?;
    let comm = registry::get(p.comm)?;
    let len = byte_len(p.count, dtype)?;
    if p.stream != 0 {
        // Queued in call order on the host stream, as its collectives are: a send completes
        // once the transport has the bytes, so sends queued before receives cannot deadlock.
        let host = host_stream::stream(p.stream)?;
        let (collective, input, output) = if p.send {
            let input = present(p.buf, len, "sendbuff")?;
            (Collective::Send { peer }, Some(input), None)
        } else {
            let output = present(p.buf, len, "recvbuff")?;
            (Collective::Recv { peer }, None, Some(output))
        };
        return queue_memory(&comm, &host, collective, p.count, dtype, input, output);
    }
    if p.send {
        // SAFETY: bcl.h's contract for bclSend.
        let data = unsafe { read_slice(p.buf as *const c_void, len, "sendbuff")? };
        comm.run_host(Collective::Send { peer }, p.count, dtype, Some(data), None)
    } else {
        // SAFETY: bcl.h's contract for bclRecv.
        let data = unsafe { write_slice(p.buf as *mut c_void, len, "recvbuff")? };
        comm.run_host(Collective::Recv { peer }, p.count, dtype, None, Some(data))
    }
}

/// # Safety
/// Inside a group, `p`'s buffer must stay valid until bclGroupEnd returns.
unsafe fn p2p_or_defer(p: PendingP2p) -> Result<(), Error> {
    let stream = p.stream as BclStream;
    data_type(p.datatype)?;
    rank_arg(p.peer, "peer")?;
    let comm = registry::get(p.comm)?;
    if takes_device_pointers(&comm) {
        return Err(invalid(format!(
            "rank {}: bclSend/bclRecv of GPU memory are not implemented yet (collectives are); \
             stage through host memory on a cpu communicator",
            comm.rank()
        )));
    }
    if !stream.is_null() {
        // Refused at the call, not at bclGroupEnd: a stream that is none is the caller's bug.
        host_stream::stream(stream as usize)?;
    }
    let deferred = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.pending.push(p);
            true
        } else {
            false
        }
    });
    if deferred {
        return Ok(());
    }
    // SAFETY: forwarded contract.
    unsafe { p2p(p) }
}

/// # Safety
/// See `bclSend` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    let p = PendingP2p {
        comm: comm as usize,
        send: true,
        buf: sendbuff as usize,
        count,
        datatype,
        peer,
        stream: stream as usize,
    };
    // SAFETY: bcl.h's contract for bclSend.
    call("bclSend", || unsafe { p2p_or_defer(p) })
}

/// # Safety
/// See `bclRecv` in bcl.h.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: BclComm,
    stream: BclStream,
) -> BclResult {
    let p = PendingP2p {
        comm: comm as usize,
        send: false,
        buf: recvbuff as usize,
        count,
        datatype,
        peer,
        stream: stream as usize,
    };
    // SAFETY: bcl.h's contract for bclRecv.
    call("bclRecv", || unsafe { p2p_or_defer(p) })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclGroupStart() -> BclResult {
    call("bclGroupStart", || {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    })
}

/// Runs the sends and receives recorded since the outermost bclGroupStart: every send first
/// (sends never wait for the peer's receive), then every receive, so that exchanges in any
/// order complete.
#[unsafe(no_mangle)]
pub extern "C" fn bclGroupEnd() -> BclResult {
    call("bclGroupEnd", || {
        let batch = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth == 0 {
                return Err(invalid("bclGroupEnd without bclGroupStart".into()));
            }
            g.depth -= 1;
            Ok(if g.depth == 0 {
                std::mem::take(&mut g.pending)
            } else {
                Vec::new()
            })
        })?;
        // Those on host streams are queued first (returning at once), then the others run.
        let (queued, now): (Vec<_>, Vec<_>) = batch.into_iter().partition(|p| p.stream != 0);
        for batch in [queued, now] {
            let (sends, recvs): (Vec<_>, Vec<_>) = batch.into_iter().partition(|p| p.send);
            for p in sends.into_iter().chain(recvs) {
                // SAFETY: recorded by bclSend/bclRecv, whose contract keeps the buffer valid
                // until this call returns (on a host stream, until the stream passes it).
                unsafe { p2p(p)? };
            }
        }
        Ok(())
    })
}

// ---------------------------------------------------------------- host streams and events

/// # Safety
/// `stream` must be NULL (an error) or valid for a write of a `bclStream_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclStreamCreate(stream: *mut BclStream) -> BclResult {
    call("bclStreamCreate", || {
        need(stream, "stream")?;
        let id = host_stream::create_stream();
        // SAFETY: bcl.h: `stream` is writable.
        unsafe { store(stream, "stream", id as BclStream) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclStreamQuery(stream: BclStream) -> BclResult {
    call_status("bclStreamQuery", || {
        host_stream::stream_query(stream as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclStreamSynchronize(stream: BclStream) -> BclResult {
    call_status("bclStreamSynchronize", || {
        host_stream::stream_synchronize(stream as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclStreamDestroy(stream: BclStream) -> BclResult {
    call_status("bclStreamDestroy", || {
        host_stream::destroy_stream(stream as usize)
    })
}

/// # Safety
/// `event` must be NULL (an error) or valid for a write of a `bclEvent_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bclEventCreate(event: *mut BclEvent) -> BclResult {
    call("bclEventCreate", || {
        need(event, "event")?;
        let id = host_stream::create_event();
        // SAFETY: bcl.h: `event` is writable.
        unsafe { store(event, "event", id as BclEvent) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclEventRecord(event: BclEvent, stream: BclStream) -> BclResult {
    call("bclEventRecord", || {
        host_stream::record_event(event as usize, stream as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclEventQuery(event: BclEvent) -> BclResult {
    call_status("bclEventQuery", || host_stream::event_query(event as usize))
}

#[unsafe(no_mangle)]
pub extern "C" fn bclEventSynchronize(event: BclEvent) -> BclResult {
    call_status("bclEventSynchronize", || {
        host_stream::event_synchronize(event as usize)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn bclEventDestroy(event: BclEvent) -> BclResult {
    call("bclEventDestroy", || {
        host_stream::destroy_event(event as usize)
    })
}
