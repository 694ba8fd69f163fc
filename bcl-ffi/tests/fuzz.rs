//! Drive the C entry points with random programs of calls (the fuzz target's harness,
//! `bcl::fuzzing::c_abi`) for a bounded time, and replay the fuzz target's corpus: every call
//! returns a valid code (never a crash or a panic across the boundary), and valid calls still
//! work.

use bcl::*;
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random programs through the fuzz target's harness for 3 s (no coverage guidance, on
/// stable): every call returns a valid code and the live communicator still works.
#[test]
fn random_arguments_never_crash() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let start = Instant::now();
    let mut programs = 0u64;
    while start.elapsed() < Duration::from_secs(3) {
        let program: Vec<u8> = (0..8 * 16).map(|_| rng.next() as u8).collect();
        bcl::fuzzing::c_abi(&program);
        programs += 1;
    }
    assert!(programs > 10, "only {programs} programs in 3 s");
    let code = bclBarrier(std::ptr::null_mut(), std::ptr::null_mut());
    assert_eq!(code, BCL_INVALID_ARGUMENT);
}

/// The C ABI fuzz targets' committed corpora (`fuzz/corpus/c_abi*/`: seeds, and any input
/// that once failed one) replayed through the same harnesses on stable.
fn replay(target: &str, harness: fn(&[u8])) {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus") {
        let path = entry.expect("an entry").path();
        let data = std::fs::read(&path).expect("a corpus file");
        if std::panic::catch_unwind(|| harness(&data)).is_err() {
            panic!("{} fails the {target} harness", path.display());
        }
        n += 1;
    }
    assert!(n >= 14, "the {target} corpus has {n} inputs");
}

#[test]
fn the_c_abi_fuzz_corpus_replays() {
    replay("c_abi", bcl::fuzzing::c_abi);
}

#[test]
fn the_two_rank_c_abi_fuzz_corpus_replays() {
    replay("c_abi_two_ranks", bcl::fuzzing::c_abi_two_ranks);
}
