//! The C ABI's fuzz harness (`fuzz/fuzz_targets/c_abi.rs`, and the corpus replay in
//! `cargo test`): the input is a program of calls into `bcl.h`, eight bytes a call, each
//! choosing the entry point and every argument from a set that mixes valid values with the
//! mistakes a C caller makes (NULL, a handle that is not a communicator, counts past the
//! buffers' reach, unknown dtypes and ops, roots outside the world, configs with wild
//! timeouts). They run against a live 1-rank communicator kept across inputs. The property:
//! every call returns one of the documented codes with a message (no panic crosses, nothing
//! hangs), and after the program the communicator still gives the right answer.
//!
//! Pointers are only ever NULL, a buffer of this harness large enough for every count a call
//! can be given that C could mean (up to 16 elements of 8 bytes), or a handle value that BCL
//! looks up and refuses: a C caller's wild pointer into BCL's buffers would be undefined
//! behaviour in C itself, not something a library can detect.

use crate::api::*;
use crate::types::*;
use std::ffi::{CStr, c_int, c_void};
use std::sync::{Mutex, OnceLock};

/// The live communicator (its handle as an integer, so that it can sit in a static).
fn communicator() -> Option<usize> {
    static COMM: OnceLock<Option<usize>> = OnceLock::new();
    *COMM.get_or_init(|| {
        let mut id = BclUniqueId { internal: [0; 128] };
        let mut comm: BclComm = std::ptr::null_mut();
        // SAFETY: both out-parameters point to writable values of their types.
        let ok = unsafe {
            bclGetUniqueId(&mut id) == BCL_SUCCESS
                && bclCommInitRank(&mut comm, 1, id, 0) == BCL_SUCCESS
        };
        ok.then_some(comm as usize)
    })
}

/// One call's choices, one byte each.
struct Call([u8; 8]);

impl Call {
    fn pick<T: Copy>(&self, i: usize, xs: &[T]) -> T {
        xs[usize::from(self.0[i]) % xs.len()]
    }
}

/// Run the program `data` (see the module comment). Panics when a call returns a code that
/// is not one of `bcl.h`'s, or the communicator is left unable to allreduce.
pub fn c_abi(data: &[u8]) {
    // One program at a time: the communicator is shared.
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(comm) = communicator() else {
        panic!("no 1-rank communicator could be made");
    };
    let real = comm as BclComm;
    let bogus = 0x5000usize as BclComm;
    let mut a = vec![1u8; 16 * 8];
    let mut b = vec![0u8; 16 * 8];
    for chunk in data.chunks_exact(8).take(64) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        let call = Call(bytes);
        let c = call.pick(1, &[real, real, std::ptr::null_mut(), bogus]);
        let send: *const c_void = call.pick(2, &[a.as_ptr().cast(), std::ptr::null()]);
        let recv: *mut c_void = call.pick(
            3,
            &[
                b.as_mut_ptr().cast(),
                std::ptr::null_mut(),
                a.as_mut_ptr().cast(),
            ],
        );
        // Counts beyond the buffers are told apart by C only when their byte size is past
        // isize::MAX (C passes no buffer sizes); any other count fits the buffers.
        let count = call.pick(4, &[0usize, 1, 7, 16, usize::MAX, isize::MAX as usize + 1]);
        let dtype = call.pick(5, &[-1 as c_int, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000]);
        let op = call.pick(6, &[-5 as c_int, 0, 1, 2, 3, 4, 5, 99]);
        let root = call.pick(7, &[-1 as c_int, 0, 0, 1, 99, c_int::MAX]);
        let stream: BclStream = call.pick(7, &[std::ptr::null_mut(), a.as_mut_ptr().cast()]);
        // SAFETY: every pointer is NULL, one of this harness's buffers of 128 bytes (enough
        // for any count the calls can be given below isize::MAX bytes), or a handle BCL looks
        // up without dereferencing.
        let code = unsafe {
            match call.0[0] % 14 {
                0 => bclAllReduce(send, recv, count, dtype, op, c, stream),
                1 => bclAllGather(send, recv, count, dtype, c, stream),
                2 => bclReduceScatter(send, recv, count, dtype, op, c, stream),
                3 => bclBroadcast(send, recv, count, dtype, root, c, stream),
                4 => bclReduce(send, recv, count, dtype, op, root, c, stream),
                5 => bclAllToAll(send, recv, count, dtype, c, stream),
                6 => bclSend(send, count, dtype, root, c, stream),
                7 => bclRecv(recv, count, dtype, root, c, stream),
                8 => bclGather(send, recv, count, dtype, root, c, stream),
                9 => bclScatter(send, recv, count, dtype, root, c, stream),
                10 => bclBarrier(c, stream),
                11 => {
                    let mut n: c_int = -7;
                    bclCommCount(
                        c,
                        call.pick(2, &[&mut n as *mut c_int, std::ptr::null_mut()]),
                    )
                }
                12 => bclCommGetAsyncError(c, std::ptr::null_mut()),
                _ => init_with_config(&call),
            }
        };
        assert!((0..BCL_NUM_RESULTS).contains(&code), "code {code}");
        // SAFETY: any code is accepted; the string is static.
        let text = unsafe { CStr::from_ptr(bclGetErrorString(code)) };
        assert!(!text.to_bytes().is_empty(), "no message for code {code}");
    }
    // The communicator still works: nothing the program did reached its state.
    let x = [2.0f32; 4];
    let mut y = [0.0f32; 4];
    // SAFETY: 4 floats in and out, the live communicator, the default stream.
    let code = unsafe {
        bclAllReduce(
            x.as_ptr().cast(),
            y.as_mut_ptr().cast(),
            4,
            7,
            0,
            real,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(code, BCL_SUCCESS, "the live communicator stopped working");
    assert_eq!(y, [2.0; 4]);
}

/// A 1-rank communicator from a config whose size, magic, timeouts and sockets come from
/// the call's bytes (wild values included: NaN, infinities, 1e300, negatives); destroyed at
/// once when it opens.
///
/// # Safety
/// None beyond the C ABI's: the config is a valid `bclConfig_t` value on the stack.
unsafe fn init_with_config(call: &Call) -> BclResult {
    let seconds = [
        f64::NAN,
        f64::INFINITY,
        -1.0,
        0.0,
        1e-300,
        1e300,
        5.0,
        f64::MIN_POSITIVE,
    ];
    let config = BclConfig {
        size: call.pick(1, &[std::mem::size_of::<BclConfig>(), 0, 8, usize::MAX]),
        magic: call.pick(2, &[BCL_CONFIG_MAGIC, 0, 0xdead_beef]),
        version: call.pick(3, &[1u32, 0, u32::MAX]),
        device: std::ptr::null(),
        transport: std::ptr::null(),
        sockets_per_peer: call.pick(4, &[1 as c_int, 0, -1, 1000, c_int::MAX]),
        init_timeout_seconds: call.pick(5, &seconds),
        timeout_seconds: call.pick(6, &seconds),
    };
    let mut id = BclUniqueId { internal: [0; 128] };
    let mut comm: BclComm = std::ptr::null_mut();
    // SAFETY: out-parameters writable, the config a valid value that outlives the call.
    unsafe {
        if bclGetUniqueId(&mut id) != BCL_SUCCESS {
            return BCL_INTERNAL_ERROR;
        }
        let code = bclCommInitRankConfig(&mut comm, 1, id, 0, &config);
        if code == BCL_SUCCESS {
            let _ = bclCommDestroy(comm);
        }
        code
    }
}
