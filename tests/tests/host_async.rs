//! Host operations that return at once (`Communicator::all_reduce_async`, `submit_host_vec`):
//! the call returns before its peers have joined, operations run in call order, a blocking
//! call waits for the queued ones, and a failure comes back through `wait` naming the peer.

use bcl_core::{Collective, CommConfig, Communicator, ReduceOp};
use std::time::Duration;

#[test]
fn an_async_allreduce_returns_before_its_peers_join_and_is_right_after_wait() {
    let comms = Communicator::init_threads(3, CommConfig::default()).expect("init");
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                if c.rank() == 0 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                let work = c
                    .all_reduce_async(vec![c.rank() as f32 + 1.0; 1 << 16], ReduceOp::Sum)
                    .expect("submit");
                if c.rank() != 0 {
                    // Rank 0 is still asleep: the call returned, the allreduce cannot be done.
                    assert!(!work.test(), "rank {} finished without rank 0", c.rank());
                }
                let out = work.wait().expect("allreduce");
                assert!(
                    out.iter().all(|&v| v == 6.0),
                    "rank {}: {}",
                    c.rank(),
                    out[0]
                );
            });
        }
    });
}

#[test]
fn queued_operations_run_in_call_order_and_a_blocking_call_waits_for_them() {
    let comms = Communicator::init_threads(4, CommConfig::default()).expect("init");
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let first = c
                    .all_reduce_async(vec![1i64; 1000], ReduceOp::Sum)
                    .expect("1st");
                let gathered = c
                    .submit_host_vec(
                        Collective::AllGather,
                        1,
                        Some(vec![c.rank() as i32]),
                        vec![0i32; 4],
                    )
                    .expect("allgather");
                // The blocking call runs after both queued operations.
                let mut x = [2.0f64; 8];
                c.all_reduce_in_place(&mut x, ReduceOp::Max)
                    .expect("blocking");
                assert!(first.test() && gathered.test(), "rank {}", c.rank());
                let first = first.wait().expect("1st");
                assert!(
                    first.iter().all(|&v| v == 4),
                    "rank {}: {first:?}",
                    c.rank()
                );
                // The output of one queued operation is the input of the next.
                let second = c.all_reduce_async(first, ReduceOp::Sum).expect("2nd");
                assert_eq!(second.wait().expect("2nd")[999], 16);
                assert_eq!(gathered.wait().expect("allgather"), [0, 1, 2, 3]);
            });
        }
    });
}

#[test]
fn bad_arguments_are_refused_at_the_call_and_a_mismatch_comes_back_through_wait() {
    let comms = Communicator::init_threads(2, CommConfig::default()).expect("init");
    // Wrong buffer size for an allgather of 4 per rank: refused before anything is queued.
    let e = comms[0]
        .submit_host_vec(Collective::AllGather, 4, Some(vec![0u8; 4]), vec![0u8; 7])
        .expect_err("a 7-byte receive buffer for 2 x 4");
    assert!(
        e.to_string().contains("receive buffer holds 7 bytes"),
        "{e}"
    );
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                // The ranks pass different counts: a desync, named, through wait().
                let n = 100 + c.rank();
                let e = c
                    .all_reduce_async(vec![1f32; n], ReduceOp::Sum)
                    .expect("queued")
                    .wait()
                    .expect_err("counts differ");
                let text = e.to_string();
                assert!(text.contains("rank"), "rank {}: {text}", c.rank());
            });
        }
    });
}
