//! GPU ranks in the same ring as cpu ranks (needs a CUDA GPU and `--features cuda`; the tests
//! are ignored elsewhere and `scripts/device-check.sh` runs them on a GPU machine).
//!
//! * The whole conformance suite with 1 CUDA rank + 3 cpu ranks, and with 2 CUDA ranks sharing
//!   one GPU + 2 cpu ranks, over shared memory: every collective, dtype and op, compared with
//!   the closed form.
//! * Stream semantics: a collective enqueued on a caller's stream starts after the work
//!   already on that stream, the stream's later work waits for it, and the enqueuing call
//!   returns at once; and the same through host staging (`submit_staged`, what the C ABI
//!   uses), with the caller blocking on the stream right away.
#![cfg(feature = "cuda")]

use bcl_backends::{DataType, ReduceOp};
use bcl_core::{Collective, Communicator};
use bcl_tests::{Setup, conformance, test_config};
use std::time::{Duration, Instant};

#[test]
#[ignore = "needs a CUDA GPU: scripts/device-check.sh runs it"]
fn one_cuda_rank_and_three_cpu_ranks() {
    conformance(Setup::ShmCuda { gpu_ranks: 1 }, 4);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/device-check.sh runs it"]
fn two_cuda_ranks_sharing_a_gpu_and_two_cpu_ranks() {
    conformance(Setup::ShmCuda { gpu_ranks: 2 }, 4);
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/device-check.sh runs it"]
fn a_collective_on_a_stream_is_ordered_with_the_stream() {
    let setup = Setup::ShmCuda { gpu_ranks: 1 };
    let comms = Communicator::init_threads_with(2, |r| test_config(setup, r))
        .unwrap_or_else(|e| panic!("init: {e}"));
    let n = 1 << 20;
    let mine: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let theirs: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let joined = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let (gpu_comm, cpu_comm) = (&comms[0], &comms[1]);
        let (mine, theirs, joined) = (&mine, &theirs, &joined);
        s.spawn(move || {
            // The cpu rank joins 400 ms after the GPU rank enqueued its part.
            joined.wait();
            std::thread::sleep(Duration::from_millis(400));
            let mut out = vec![0f32; n];
            cpu_comm
                .all_reduce(theirs, &mut out, ReduceOp::Sum)
                .unwrap_or_else(|e| panic!("cpu rank: {e}"));
        });
        let acc = gpu_comm.accelerator();
        let stream = acc.create_stream().expect("stream");
        let input = acc.allocate(n * 4).expect("allocate");
        let output = acc.allocate(n * 4).expect("allocate");
        // The caller's earlier work: held back until `gate` is released, so the collective
        // must not read its input before then.
        let gate = acc.hold_stream(&stream).expect("hold");
        acc.copy_to_device(input.full(), bytemuck(mine), &stream)
            .expect("h2d");
        let work = gpu_comm
            .submit_on(
                Collective::AllReduce { op: ReduceOp::Sum },
                n,
                DataType::Float32,
                Some(&input),
                Some(&output),
                &stream,
            )
            .expect("submit_on");
        let after = acc.record_event(&stream).expect("event");
        // Had the collective read its input before the held copy ran, the sum checked at the
        // end would be wrong (the buffer starts zeroed).
        std::thread::sleep(Duration::from_millis(150));
        gate.release();
        joined.wait();
        // The collective now waits for the cpu rank: the stream's later work must wait too.
        std::thread::sleep(Duration::from_millis(150));
        assert!(!work.test(), "the collective finished without its peer");
        assert!(
            !acc.event_complete(&after).expect("query"),
            "the stream ran past a collective that has not finished"
        );
        work.wait().unwrap_or_else(|e| panic!("gpu rank: {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !acc.event_complete(&after).expect("query") {
            assert!(
                Instant::now() < deadline,
                "the stream did not go on after the collective"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut got = vec![0u8; n * 4];
        acc.copy_to_host(&mut got, output.full(), &stream)
            .expect("d2h");
        for (i, chunk) in got.chunks_exact(4).enumerate() {
            let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            assert_eq!(v, mine[i] + theirs[i], "element {i}");
        }
    });
}

fn bytemuck(v: &[f32]) -> &[u8] {
    bcl_backends::bytemuck::cast_slice(v)
}

/// A collective staged through host memory (what the C ABI uses): the call returns at once,
/// the caller may block on the stream right away (the progress thread makes no CUDA calls),
/// and the stream's later work sees the result.
#[test]
#[ignore = "needs a CUDA GPU: scripts/device-check.sh runs it"]
fn a_staged_collective_lets_the_caller_block_on_its_stream() {
    let setup = Setup::ShmCuda { gpu_ranks: 1 };
    let comms = Communicator::init_threads_with(2, |r| test_config(setup, r))
        .unwrap_or_else(|e| panic!("init: {e}"));
    let n = (1 << 20) + 3;
    let mine: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let theirs: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    std::thread::scope(|s| {
        let (gpu_comm, cpu_comm) = (&comms[0], &comms[1]);
        let theirs = &theirs;
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut out = vec![0f32; n];
            cpu_comm
                .all_reduce(theirs, &mut out, ReduceOp::Sum)
                .unwrap_or_else(|e| panic!("cpu rank: {e}"));
            let mut buf = out.clone();
            cpu_comm
                .all_reduce_in_place(&mut buf, ReduceOp::Max)
                .unwrap_or_else(|e| panic!("cpu rank: {e}"));
        });
        let acc = gpu_comm.accelerator();
        let stream = acc.create_stream().expect("stream");
        let input = acc.allocate(n * 4).expect("allocate");
        let output = acc.allocate(n * 4).expect("allocate");
        acc.copy_to_device(input.full(), bytemuck(&mine), &stream)
            .expect("h2d");
        let sum = gpu_comm
            .submit_staged(
                Collective::AllReduce { op: ReduceOp::Sum },
                n,
                DataType::Float32,
                Some(&input),
                Some(&output),
                &stream,
            )
            .expect("submit_staged");
        // In place, on the result: ordered after the first on the stream.
        let max = gpu_comm
            .submit_staged(
                Collective::AllReduce { op: ReduceOp::Max },
                n,
                DataType::Float32,
                None,
                Some(&output),
                &stream,
            )
            .expect("submit_staged in place");
        assert!(!sum.test(), "finished before the peer joined");
        // Block on the stream at once: the collective must still complete.
        acc.synchronize(&stream).expect("synchronize");
        sum.wait().unwrap_or_else(|e| panic!("gpu rank: {e}"));
        max.wait().unwrap_or_else(|e| panic!("gpu rank: {e}"));
        let mut got = vec![0u8; n * 4];
        acc.copy_to_host(&mut got, output.full(), &stream)
            .expect("d2h");
        for (i, chunk) in got.chunks_exact(4).enumerate() {
            let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            assert_eq!(v, mine[i] + theirs[i], "element {i}");
        }
    });
}
