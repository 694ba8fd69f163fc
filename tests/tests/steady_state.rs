//! Once warm, the data path allocates nothing per call (the issue's "no per-call allocation in
//! steady state"): 8 B allreduces over TCP between two ranks, counted by `allocation_counter`
//! (a global allocator that counts per thread) on the threads that make the calls. Blocking
//! calls are driven by the caller's thread, so the executor, the transport and the health
//! layer's per-operation bookkeeping all run there. Threads the library owns (health,
//! heartbeats) are not counted: they work per interval, not per call.

use bcl_core::{Communicator, ReduceOp};
use bcl_tests::{Setup, test_config};

/// More than the flight recorder keeps (1024 by default), so its ring is full and reused.
const WARM_UP: usize = 1500;

/// Allocations on each rank's calling thread during `calls` allreduces of `count` floats,
/// after `WARM_UP` of them.
fn allocations_per_rank(count: usize, calls: usize) -> Vec<u64> {
    let comms = Communicator::init_threads_with(2, |r| test_config(Setup::TcpCpu, r))
        .expect("2 ranks over tcp");
    std::thread::scope(|s| {
        let workers: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let send: Vec<f32> = (0..count).map(|i| (i % 7) as f32).collect();
                    let mut recv = vec![0.0f32; count];
                    for _ in 0..WARM_UP {
                        comm.all_reduce(&send, &mut recv, ReduceOp::Sum)
                            .expect("allreduce");
                    }
                    let counted = allocation_counter::measure(|| {
                        for _ in 0..calls {
                            comm.all_reduce(&send, &mut recv, ReduceOp::Sum)
                                .expect("allreduce");
                        }
                    });
                    let want: Vec<f32> = send.iter().map(|x| 2.0 * x).collect();
                    assert!(recv == want, "rank {}: wrong sum", comm.rank());
                    counted.count_total
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("rank thread"))
            .collect()
    })
}

/// The health layer may allocate once per link and slow-node window (every 500 ms) for the
/// wire-rate samples of large messages; one allocation per call, or anything near it, fails.
fn assert_rare(counts: &[u64], calls: usize, what: &str) {
    eprintln!("allocations in {calls} allreduces of {what} over tcp, per rank: {counts:?}");
    for (rank, &n) in counts.iter().enumerate() {
        assert!(
            n * 50 < calls as u64,
            "rank {rank} allocated {n} times in {calls} allreduces of {what}"
        );
    }
}

#[test]
fn small_allreduces_over_tcp_allocate_nothing_per_call_once_warm() {
    assert_rare(&allocations_per_rank(2, 2000), 2000, "8 B");
}

/// 256 KiB in 16 KiB slices (the test config's): many messages per call, each through the
/// pooled buffers, and large enough that every one is timed for the link statistics.
#[test]
fn sliced_allreduces_over_tcp_allocate_nothing_per_call_once_warm() {
    assert_rare(&allocations_per_rank(64 << 10, 500), 500, "256 KiB");
}
