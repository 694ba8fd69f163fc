//! Drive the C entry points with random arguments for a bounded time: every call returns a
//! valid code (never a crash or a panic across the boundary), and valid calls still work.

#![allow(unsafe_code)]

use bcl::*;
use std::ffi::{CStr, c_int, c_void};
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

#[test]
fn random_arguments_never_crash() {
    let mut id = BclUniqueId { internal: [0; 128] };
    // SAFETY: valid pointers for every output parameter.
    unsafe {
        assert_eq!(bclGetUniqueId(&mut id), BCL_SUCCESS);
        let mut comm: BclComm = std::ptr::null_mut();
        assert_eq!(
            bclCommInitRank(&mut comm, 1, id, 0),
            BCL_SUCCESS,
            "{:?}",
            CStr::from_ptr(bclGetLastError(comm))
        );
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        // Buffers large enough for every count drawn below (16 elements of 8 bytes).
        let mut a = vec![1u8; 16 * 8];
        let mut b = vec![0u8; 16 * 8];
        let bogus = 0x5000usize as BclComm;
        let start = Instant::now();
        let mut calls = 0u64;
        while start.elapsed() < Duration::from_secs(3) {
            let c = rng.pick(&[comm, std::ptr::null_mut(), bogus]);
            let send: *const c_void = rng.pick(&[a.as_ptr().cast(), std::ptr::null()]);
            let recv: *mut c_void = rng.pick(&[
                b.as_mut_ptr().cast(),
                std::ptr::null_mut(),
                a.as_mut_ptr().cast(),
            ]);
            // Counts beyond the buffers are only detectable when their byte size exceeds isize::MAX
            // (C cannot tell BCL its buffer sizes); any other count must fit the buffers.
            let count = rng.pick(&[0usize, 1, 7, 16, usize::MAX, isize::MAX as usize + 1]);
            let count = if count > 16 && rng.next().is_multiple_of(2) {
                count
            } else {
                count.min(16)
            };
            let dtype = rng.pick(&[-1 as c_int, 0, 2, 7, 8, 9, 10, 1000]);
            let op = rng.pick(&[-5 as c_int, 0, 1, 2, 3, 4, 5]);
            let root = rng.pick(&[-1 as c_int, 0, 1, 99]);
            let stream: BclStream = rng.pick(&[std::ptr::null_mut(), a.as_mut_ptr().cast()]);
            let code = match rng.next() % 11 {
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
                _ => bclBarrier(c, stream),
            };
            assert!((0..BCL_NUM_RESULTS).contains(&code), "code {code}");
            assert!(!bclGetErrorString(code).is_null());
            calls += 1;
        }
        assert!(calls > 100, "only {calls} calls in 3 s");
        // The real communicator is still healthy.
        let x = [2.0f32; 4];
        let mut y = [0.0f32; 4];
        assert_eq!(
            bclAllReduce(
                x.as_ptr().cast(),
                y.as_mut_ptr().cast(),
                4,
                7,
                0,
                comm,
                std::ptr::null_mut()
            ),
            BCL_SUCCESS
        );
        assert_eq!(y, [2.0; 4]);
        assert_eq!(bclCommDestroy(comm), BCL_SUCCESS);
    }
}

/// The C ABI fuzz target's committed corpus (`fuzz/corpus/c_abi/`: seeds, and any input that
/// once failed it) replayed through the same harness on stable.
#[test]
fn the_c_abi_fuzz_corpus_replays() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/c_abi");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the c_abi corpus") {
        let path = entry.expect("an entry").path();
        let data = std::fs::read(&path).expect("a corpus file");
        if std::panic::catch_unwind(|| bcl::fuzzing::c_abi(&data)).is_err() {
            panic!("{} fails the C ABI harness", path.display());
        }
        n += 1;
    }
    assert!(n >= 14, "the c_abi corpus has {n} inputs");
}
