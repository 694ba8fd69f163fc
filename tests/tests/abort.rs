//! `abort()` from another thread while every rank is inside collectives: every operation in
//! flight fails promptly with the verdict naming the aborting rank, and once the communicators
//! are dropped the process is back to its thread and file-descriptor baseline. (Its own test
//! binary: the counts are per process.)

use bcl_core::Cause;
use bcl_core::{Communicator, Error, ReduceOp};
use bcl_tests::resources::Held;
use bcl_tests::{Setup, test_config};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn abort_under_load_fails_every_rank_within_100_ms_and_leaves_nothing_behind() {
    let baseline = Held::mine();
    {
        let comms: Vec<Arc<Communicator>> =
            Communicator::init_threads_with(4, |r| test_config(Setup::TcpCpu, r))
                .expect("init")
                .into_iter()
                .map(Arc::new)
                .collect();
        let workers: Vec<_> = comms
            .iter()
            .map(|c| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![1.0f32; 1 << 18];
                    let mut done = 0u64;
                    loop {
                        if let Err(e) = c.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
                            return (done, e, Instant::now());
                        }
                        done += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let aborted = Instant::now();
        comms[0].abort();
        for (rank, w) in workers.into_iter().enumerate() {
            let (done, e, failed) = w.join().expect("worker");
            let latency = failed.saturating_duration_since(aborted);
            assert!(done > 0, "rank {rank} never ran before the abort");
            // In flight: the verdict; between two calls: the next call refuses at once.
            assert!(
                matches!(
                    e,
                    Error::Fault {
                        cause: Cause::Aborted,
                        ..
                    } | Error::Poisoned(_)
                ),
                "rank {rank}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains("rank 0 (host") && text.contains("aborted the communicator"),
                "rank {rank}: {e}"
            );
            assert!(
                latency <= Duration::from_millis(100),
                "rank {rank} failed {latency:?} after the abort"
            );
        }
        // Later calls fail at once, naming the verdict.
        let e = comms[2].barrier().expect_err("poisoned");
        assert!(e.to_string().contains("aborted the communicator"), "{e}");
        assert!(comms[3].async_error().is_some());
    }
    let left = Held::left_beyond(&baseline, Duration::from_secs(5));
    assert!(
        left.is_empty(),
        "destroying the communicators left {left:?} beyond what the process held before"
    );
}
