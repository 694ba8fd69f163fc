//! The C types of `bcl.h`, with NCCL's names and numbering under the `bcl` prefix.

use bcl_core::{DataType, Error, ReduceOp};
use std::ffi::c_int;

/// `bclResult_t`: one code per variant of the core's error, plus success.
pub type BclResult = c_int;
pub const BCL_SUCCESS: BclResult = 0;
pub const BCL_INVALID_ARGUMENT: BclResult = 1;
pub const BCL_BOOTSTRAP_TIMEOUT: BclResult = 2;
pub const BCL_BOOTSTRAP_ERROR: BclResult = 3;
pub const BCL_LINK_ERROR: BclResult = 4;
pub const BCL_MISMATCH: BclResult = 5;
pub const BCL_TIMEOUT: BclResult = 6;
pub const BCL_DEVICE_ERROR: BclResult = 7;
pub const BCL_POISONED: BclResult = 8;
pub const BCL_UNAVAILABLE: BclResult = 9;
pub const BCL_INTERNAL_ERROR: BclResult = 10;
pub const BCL_REMOTE_ERROR: BclResult = 11;
pub const BCL_EXCLUDED: BclResult = 12;
/// Not an error: a host stream's or event's operations have not all finished
/// (`bclStreamQuery`, `bclEventQuery`; NCCL's `ncclInProgress`).
pub const BCL_IN_PROGRESS: BclResult = 13;
pub const BCL_NUM_RESULTS: BclResult = 14;

/// The code of a core error (one to one: `Error::code`, whose numbers these constants are).
pub fn code_of(e: &Error) -> BclResult {
    e.code()
}

/// The fixed text of a result code.
pub fn describe(code: BclResult) -> &'static std::ffi::CStr {
    match code {
        BCL_SUCCESS => c"no error",
        BCL_INVALID_ARGUMENT => c"invalid argument (a caller error; nothing was done)",
        BCL_BOOTSTRAP_TIMEOUT => c"bootstrap timed out: some ranks never arrived",
        BCL_BOOTSTRAP_ERROR => c"bootstrap failed (store unreachable or handshake refused)",
        BCL_LINK_ERROR => c"a link to a peer failed (peer died or network error)",
        BCL_MISMATCH => c"ranks disagree on an operation (count or dtype differ)",
        BCL_TIMEOUT => c"an operation timed out waiting for a peer",
        BCL_DEVICE_ERROR => c"the device refused an operation",
        BCL_POISONED => c"the communicator is unusable after an earlier error",
        BCL_UNAVAILABLE => c"a backend or transport is unavailable",
        BCL_INTERNAL_ERROR => c"internal error (a BCL bug)",
        BCL_REMOTE_ERROR => {
            c"another rank died, hung, lost its link or aborted (the verdict names it and why)"
        }
        BCL_EXCLUDED => {
            c"this rank was excluded from the shrunk communicator by the other survivors"
        }
        BCL_IN_PROGRESS => c"operations on the stream are still in progress",
        _ => c"unknown result code",
    }
}

/// `bclDataType_t` values (NCCL's numbering, `DataType::code`).
pub fn data_type(v: c_int) -> Result<DataType, Error> {
    DataType::from_code(v).ok_or_else(|| {
        Error::InvalidArgument(format!("datatype {v} is not a bclDataType_t (0..=9)"))
    })
}

/// `bclRedOp_t` values (NCCL's numbering, `ReduceOp::code`).
pub fn red_op(v: c_int) -> Result<ReduceOp, Error> {
    ReduceOp::from_code(v)
        .ok_or_else(|| Error::InvalidArgument(format!("op {v} is not a bclRedOp_t (0..=4)")))
}

/// `bclUniqueId`: the text form of the core's unique id, NUL-padded to 128 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BclUniqueId {
    pub internal: [u8; 128],
}

/// `bclConfig_t`, version 1.
#[repr(C)]
#[derive(Debug)]
pub struct BclConfig {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub device: *const std::ffi::c_char,
    pub transport: *const std::ffi::c_char,
    pub sockets_per_peer: c_int,
    pub init_timeout_seconds: f64,
    pub timeout_seconds: f64,
}

pub const BCL_CONFIG_MAGIC: u32 = 0xBC1C_0F16;
/// `BCL_VERSION_CODE`: major*10000 + minor*100 + patch.
pub const BCL_VERSION_CODE: c_int = 100;

/// `bclCommSplit`'s color for ranks that take part in no new communicator.
pub const BCL_SPLIT_NOCOLOR: std::ffi::c_int = -1;
/// `bclCommShrink` flags.
pub const BCL_SHRINK_DEFAULT: std::ffi::c_int = 0;
pub const BCL_SHRINK_ABORT: std::ffi::c_int = 1;
pub const BCL_SHRINK_FAILED: std::ffi::c_int = 2;
