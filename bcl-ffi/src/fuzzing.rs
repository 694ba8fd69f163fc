//! The C ABI's fuzz harness (`fuzz/fuzz_targets/c_abi.rs`, and the corpus replay in
//! `cargo test`): the input is a program of calls into `bcl.h`, eight bytes a call, each
//! choosing the entry point and every argument from a set that mixes valid values with the
//! mistakes a C caller makes (NULL, a handle that is not a communicator, counts past the
//! buffers' reach, unknown dtypes and ops, roots outside the world, configs with wild
//! timeouts). They run against a live 1-rank communicator kept across inputs (`c_abi`), and
//! on both ranks of a live 2-rank one at once (`c_abi_two_ranks`). The property: every call
//! returns one of the documented codes with a message (no panic crosses, nothing hangs past
//! the operation timeout), and after the program the communicator still gives the right
//! answer (a 2-rank one that a program poisoned is replaced, as an application would).
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

/// The harness's own buffers: every count a call can be given below `isize::MAX` bytes
/// fits them, per rank of a world of 2 (allgather's output and all-to-all's buffers hold
/// 16 elements of 8 bytes for each rank).
struct Buffers {
    a: Vec<u8>,
    b: Vec<u8>,
}

impl Buffers {
    fn new() -> Self {
        Buffers {
            a: vec![1u8; 2 * 16 * 8],
            b: vec![0u8; 2 * 16 * 8],
        }
    }
}

/// Run `call` on `real` (or NULL, or a handle that is none, as the call chooses) as `rank`
/// of `world`. Point-to-point calls pair up across ranks: with 2 ranks, a "send" is rank 0
/// sending to 1 and rank 1 receiving from 0, a "recv" the other way. Returns the code after
/// checking it is one of `bcl.h`'s with a message.
fn run(call: &Call, real: BclComm, rank: c_int, world: c_int, buf: &mut Buffers) -> BclResult {
    let bogus = 0x5000usize as BclComm;
    let c = call.pick(1, &[real, real, std::ptr::null_mut(), bogus]);
    let send: *const c_void = call.pick(2, &[buf.a.as_ptr().cast(), std::ptr::null()]);
    let recv: *mut c_void = call.pick(
        3,
        &[
            buf.b.as_mut_ptr().cast(),
            std::ptr::null_mut(),
            buf.a.as_mut_ptr().cast(),
        ],
    );
    // Counts beyond the buffers are told apart by C only when their byte size is past
    // isize::MAX (C passes no buffer sizes); any other count fits the buffers.
    let count = call.pick(4, &[0usize, 1, 7, 16, usize::MAX, isize::MAX as usize + 1]);
    let dtype = call.pick(5, &[-1 as c_int, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000]);
    let op = call.pick(6, &[-5 as c_int, 0, 1, 2, 3, 4, 5, 99]);
    let root = call.pick(7, &[-1 as c_int, 0, 0, 1, 99, c_int::MAX]);
    let stream: BclStream = call.pick(7, &[std::ptr::null_mut(), buf.a.as_mut_ptr().cast()]);
    let (to, from) = if world == 2 {
        (1 - rank, 1 - rank)
    } else {
        (root, root)
    };
    // A "send" (first) sends on rank 0 of 2 and on a lone rank; a "recv" receives there.
    let sends = |first: bool| {
        if world < 2 {
            first
        } else {
            (rank == 0) == first
        }
    };
    // SAFETY: every pointer is NULL, one of `buf`'s buffers of 256 bytes (enough for any
    // count the calls can be given below isize::MAX bytes, times a world of 2), or a handle
    // BCL looks up without dereferencing.
    let code = unsafe {
        match call.0[0] % 14 {
            0 => bclAllReduce(send, recv, count, dtype, op, c, stream),
            1 => bclAllGather(send, recv, count, dtype, c, stream),
            2 => bclReduceScatter(send, recv, count, dtype, op, c, stream),
            3 => bclBroadcast(send, recv, count, dtype, root, c, stream),
            4 => bclReduce(send, recv, count, dtype, op, root, c, stream),
            5 => bclAllToAll(send, recv, count, dtype, c, stream),
            k @ (6 | 7) if sends(k == 6) => bclSend(send, count, dtype, to, c, stream),
            6 | 7 => bclRecv(recv, count, dtype, from, c, stream),
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
            _ => init_with_config(call),
        }
    };
    assert!((0..BCL_NUM_RESULTS).contains(&code), "code {code}");
    // SAFETY: any code is accepted; the string is static.
    let text = unsafe { CStr::from_ptr(bclGetErrorString(code)) };
    assert!(!text.to_bytes().is_empty(), "no message for code {code}");
    code
}

/// The calls of a program: eight bytes each, at most 64.
fn calls(data: &[u8]) -> impl Iterator<Item = Call> + '_ {
    data.chunks_exact(8).take(64).map(|chunk| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        Call(bytes)
    })
}

/// An allreduce of 4 floats (each rank's `value`) on `comm`: its code and result.
fn sum_of_four(comm: BclComm, value: f32) -> (BclResult, [f32; 4]) {
    let x = [value; 4];
    let mut y = [0.0f32; 4];
    // SAFETY: 4 floats in and out, a communicator handle, the default stream.
    let code = unsafe {
        bclAllReduce(
            x.as_ptr().cast(),
            y.as_mut_ptr().cast(),
            4,
            7,
            0,
            comm,
            std::ptr::null_mut(),
        )
    };
    (code, y)
}

/// Run the program `data` (see the module comment) on the live 1-rank communicator. Panics
/// when a call returns a code that is not one of `bcl.h`'s, or the communicator is left
/// unable to allreduce.
pub fn c_abi(data: &[u8]) {
    // One program at a time: the communicator is shared.
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(comm) = communicator() else {
        panic!("no 1-rank communicator could be made");
    };
    let real = comm as BclComm;
    let mut buf = Buffers::new();
    for call in calls(data) {
        run(&call, real, 0, 1, &mut buf);
    }
    // The communicator still works: nothing the program did reached its state.
    let (code, y) = sum_of_four(real, 2.0);
    assert_eq!(code, BCL_SUCCESS, "the live communicator stopped working");
    assert_eq!(y, [2.0; 4]);
}

/// A 2-rank communicator in this process (two threads), each rank's operation timeout 1 s.
fn pair() -> Option<[usize; 2]> {
    let mut id = BclUniqueId { internal: [0; 128] };
    // SAFETY: a writable id.
    if unsafe { bclGetUniqueId(&mut id) } != BCL_SUCCESS {
        return None;
    }
    let comms: Vec<Option<usize>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let config = BclConfig {
                        size: std::mem::size_of::<BclConfig>(),
                        magic: BCL_CONFIG_MAGIC,
                        version: 1,
                        device: std::ptr::null(),
                        transport: std::ptr::null(),
                        sockets_per_peer: 1,
                        init_timeout_seconds: 20.0,
                        timeout_seconds: 1.0,
                    };
                    let mut comm: BclComm = std::ptr::null_mut();
                    // SAFETY: a writable handle, a valid config that outlives the call.
                    let code = unsafe { bclCommInitRankConfig(&mut comm, 2, id, rank, &config) };
                    (code == BCL_SUCCESS).then_some(comm as usize)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().ok().flatten()).collect()
    });
    Some([comms[0]?, comms[1]?])
}

/// Run the program `data` on both ranks of a live 2-rank communicator at once, the same calls
/// on each (point-to-point ones paired). Where the ranks part ways (a rooted call that one
/// rank refuses and the other starts), the waiting rank's call ends in the 1 s operation
/// timeout; a communicator left poisoned is replaced for the next program. Panics when a call
/// returns a code that is not `bcl.h`'s, or a healthy pair cannot allreduce afterwards.
pub fn c_abi_two_ranks(data: &[u8]) {
    static PAIR: Mutex<Option<[usize; 2]>> = Mutex::new(None);
    let mut held = PAIR.lock().unwrap_or_else(|e| e.into_inner());
    let comms = match *held {
        Some(c) => c,
        None => pair().unwrap_or_else(|| panic!("no 2-rank communicator could be made")),
    };
    let healthy: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let real = comms[rank] as BclComm;
                    let mut buf = Buffers::new();
                    for call in calls(data) {
                        run(&call, real, rank as c_int, 2, &mut buf);
                    }
                    let mut state: BclResult = BCL_SUCCESS;
                    // SAFETY: a writable code, the rank's own communicator.
                    let code = unsafe { bclCommGetAsyncError(real, &mut state) };
                    code == BCL_SUCCESS && state == BCL_SUCCESS
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(false)).collect()
    });
    let comms = if healthy.iter().all(|&h| h) {
        comms
    } else {
        for c in comms {
            let _ = bclCommDestroy(c as BclComm);
        }
        pair().unwrap_or_else(|| panic!("no 2-rank communicator could be made again"))
    };
    // The pair still works, or reports why not with a code of bcl.h: a program in which one
    // rank refused a rooted call its peer completed (a gather's sender) leaves the ranks one
    // collective apart, which the next call names as a mismatch. Then a fresh pair must work.
    let sums = |comms: [usize; 2]| -> Vec<(BclResult, [f32; 4])> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| s.spawn(move || sum_of_four(comms[r] as BclComm, r as f32 + 1.0)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or((BCL_INTERNAL_ERROR, [0.0; 4])))
                .collect()
        })
    };
    let mut comms = comms;
    let mut results = sums(comms);
    if results.iter().any(|(code, _)| *code != BCL_SUCCESS) {
        for (code, _) in &results {
            assert!(
                (0..BCL_NUM_RESULTS).contains(code) && *code != BCL_INTERNAL_ERROR,
                "code {code}"
            );
        }
        for c in comms {
            let _ = bclCommDestroy(c as BclComm);
        }
        comms = pair().unwrap_or_else(|| panic!("no 2-rank communicator could be made again"));
        results = sums(comms);
    }
    for (r, (code, y)) in results.iter().enumerate() {
        assert_eq!(
            *code, BCL_SUCCESS,
            "rank {r} of a fresh pair cannot allreduce"
        );
        assert_eq!(*y, [3.0; 4], "rank {r}");
    }
    *held = Some(comms);
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
