//! The small-message path over shared-memory lines (`bcl-core/src/comm/lines.rs`): what it
//! carries, that every rank gets the same bits, that it stays in step with operations of other
//! kinds in between, and that a disagreement or a dead peer is named rather than waited out.
//! Ranks are threads of this process over real shared-memory rings.

use bcl_core::{Cause, Collective, CommConfig, Communicator, Error, ReduceOp, TransportKind};
use bcl_tests::{Setup, each, test_config};
use std::time::{Duration, Instant};

fn shm(world: usize, config: impl Fn(usize) -> CommConfig + Sync) -> Vec<Communicator> {
    Communicator::init_threads_with(world, config)
        .unwrap_or_else(|e| panic!("init of {world} shm ranks failed: {e}"))
}

fn config(rank: usize) -> CommConfig {
    CommConfig {
        transport: TransportKind::Shm,
        ..test_config(Setup::ShmCpu, rank)
    }
}

/// Floats whose sums depend on the order they are added in.
fn inputs(rank: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| {
            let x = ((rank * 7919 + i * 104_729) % 1000) as f32;
            (x + 0.1)
                * 10f32.powi((i % 5) as i32 - 2)
                * if (i + rank).is_multiple_of(3) {
                    -1.0
                } else {
                    1.0
                }
        })
        .collect()
}

#[test]
fn small_allreduces_take_the_lines_and_every_rank_gets_the_rank_order_sum_bit_for_bit() {
    let world = 4;
    let comms = shm(world, config);
    let sum = Collective::AllReduce { op: ReduceOp::Sum };
    // Line boundaries (56 bytes: 14 floats, less the 24-byte signature in the first line),
    // the largest size the lines take (3560 bytes), and one float more.
    for count in [1, 8, 13, 14, 15, 100, 506, 512, 890] {
        assert!(comms[0].uses_lines(sum, count * 4), "{count} floats");
    }
    assert!(!comms[0].uses_lines(sum, 891 * 4), "891 floats");
    assert!(comms[0].uses_lines(Collective::Barrier, 0));
    assert!(
        !comms[0].uses_lines(sum, 0),
        "an empty allreduce stays a no-op"
    );
    assert!(!comms[0].uses_lines(Collective::Broadcast { root: 0 }, 8));
    for count in [0, 1, 7, 8, 13, 14, 15, 100, 506, 512, 890, 891] {
        let outs = each(&comms, |r, c| {
            let mut out = vec![0f32; count];
            c.all_reduce(&inputs(r, count), &mut out, ReduceOp::Sum)
                .unwrap_or_else(|e| panic!("rank {r}, {count} floats: {e}"));
            out
        });
        for (r, out) in outs.iter().enumerate() {
            let same = out
                .iter()
                .zip(&outs[0])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{count} floats: rank {r}'s sum differs from rank 0's in its bits"
            );
        }
        if count <= 890 {
            // The lines add in rank order: ((x0 + x1) + x2) + x3, exactly.
            let want: Vec<f32> = (0..count)
                .map(|i| {
                    (0..world)
                        .map(|r| inputs(r, count)[i])
                        .fold(0.0, |a, x| a + x)
                })
                .collect();
            let exact = outs[0]
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(exact, "{count} floats: not the rank-order sum");
        }
    }
    // In place, and the other ops on an integer type (exact whatever the order).
    let outs = each(&comms, |r, c| {
        let mut buf = vec![r as i64 + 1; 9];
        c.all_reduce_in_place(&mut buf, ReduceOp::Prod)
            .expect("prod");
        let mut avg = vec![(r * 10) as f64; 3];
        c.all_reduce_in_place(&mut avg, ReduceOp::Avg).expect("avg");
        (buf, avg)
    });
    for (buf, avg) in outs {
        assert_eq!(buf, vec![24; 9]);
        assert_eq!(avg, vec![15.0; 3]);
    }
}

/// Broadcasts and all-gathers between small all-reduces let a rank run ahead of the others
/// (a broadcast's root finishes once its data is sent): the lines must still never hand out a
/// post before its time or lose one. Every result is checked.
#[test]
fn lines_stay_in_step_with_other_collectives_in_between() {
    let world = 3;
    let comms = shm(world, config);
    let failures = each(&comms, |r, c| {
        let mut wrong = Vec::new();
        for i in 0..3000usize {
            let mut x = [(r + i) as u32; 5];
            c.all_reduce_in_place(&mut x, ReduceOp::Sum)
                .expect("allreduce");
            let want = (0..world).map(|q| (q + i) as u32).sum::<u32>();
            if x != [want; 5] {
                wrong.push(format!("iteration {i}: allreduce {x:?}, want {want}"));
            }
            let root = i % world;
            let mut b = [if r == root { i as u64 } else { 0 }; 3];
            c.broadcast_in_place(&mut b, root).expect("broadcast");
            if b != [i as u64; 3] {
                wrong.push(format!("iteration {i}: broadcast {b:?}"));
            }
            if i % 7 == 0 {
                c.barrier().expect("barrier");
            }
        }
        wrong
    });
    for (r, wrong) in failures.iter().enumerate() {
        assert!(
            wrong.is_empty(),
            "rank {r}: {:?}",
            &wrong[..wrong.len().min(5)]
        );
    }
}

fn desync_of(e: &Error) -> bool {
    matches!(
        e,
        Error::Fault {
            cause: Cause::Desync,
            ..
        }
    )
}

#[test]
fn ranks_that_call_different_small_allreduces_are_told_it_is_a_desync_naming_both() {
    let comms = shm(2, config);
    let errors = each(&comms, |r, c| {
        let mut out = vec![0f32; 4 + r];
        c.all_reduce(&vec![1.0; 4 + r], &mut out, ReduceOp::Sum)
            .expect_err("the counts differ")
    });
    for (r, e) in errors.iter().enumerate() {
        let text = e.to_string();
        assert!(desync_of(e), "rank {r}: {text}");
        assert!(
            text.contains("rank 0") && text.contains("rank 1"),
            "rank {r}: {text}"
        );
    }
    // Both calls named (4 and 5 floats).
    let text = errors[0].to_string();
    assert!(text.contains("16 B") && text.contains("20 B"), "{text}");
}

#[test]
fn a_rank_on_the_planned_path_beside_one_on_the_lines_is_a_desync_not_a_hang() {
    let comms = shm(2, |r| CommConfig {
        lines_bytes: if r == 0 { 3560 } else { 0 },
        op_timeout: Duration::from_secs(20),
        ..config(r)
    });
    let sum = Collective::AllReduce { op: ReduceOp::Sum };
    assert!(comms[0].uses_lines(sum, 8) && !comms[1].uses_lines(sum, 8));
    let errors = each(&comms, |_, c| {
        let mut out = [0f64; 1];
        let started = Instant::now();
        let e = c
            .all_reduce(&[1.0], &mut out, ReduceOp::Sum)
            .expect_err("one rank on the lines");
        (e, started.elapsed())
    });
    for (r, (e, took)) in errors.iter().enumerate() {
        assert!(desync_of(e), "rank {r}: {e}");
        // Well before the operation's 20 s timeout: the verdict, not the clock, ended it.
        assert!(
            *took < Duration::from_secs(15),
            "rank {r} waited {took:?}: {e}"
        );
    }
}

#[test]
fn a_peer_that_leaves_during_a_small_allreduce_is_named() {
    let mut comms = shm(3, |r| CommConfig {
        op_timeout: Duration::from_secs(20),
        ..config(r)
    });
    let leaver = comms.pop().expect("rank 2");
    let errors = std::thread::scope(|s| {
        let waiting: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut x = [1u32; 2];
                    c.all_reduce_in_place(&mut x, ReduceOp::Sum)
                        .expect_err("rank 2 never joins")
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        drop(leaver);
        waiting
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect::<Vec<_>>()
    });
    for (r, e) in errors.iter().enumerate() {
        let text = e.to_string();
        assert!(
            !matches!(e, Error::Timeout { .. }) && text.contains("rank 2"),
            "rank {r}: {text}"
        );
    }
}

/// On the cpu backend a call through device buffers (a stream) and one through host buffers
/// take the same path, so ranks may mix them, as they could before the lines: odd ranks here
/// submit device buffers (out of place and in place), even ranks call with host slices.
#[test]
fn ranks_calling_through_device_buffers_and_through_host_buffers_meet_on_the_lines() {
    use bcl_core::backends::{Accelerator, bytemuck};
    let world = 4;
    let comms = shm(world, config);
    let outs = each(&comms, |r, c| {
        let mut results = Vec::new();
        for in_place in [false, true] {
            let input: Vec<f64> = (0..11).map(|i| (r * 100 + i) as f64).collect();
            let mut out = vec![0f64; 11];
            if r % 2 == 0 {
                if in_place {
                    out.copy_from_slice(&input);
                    c.all_reduce_in_place(&mut out, ReduceOp::Max)
                        .expect("host");
                } else {
                    c.all_reduce(&input, &mut out, ReduceOp::Max).expect("host");
                }
            } else {
                let acc: &dyn Accelerator = c.accelerator().as_ref();
                let stream = acc.default_stream();
                let bytes = bytemuck::cast_slice::<f64, u8>(&input);
                let dst = acc.allocate(bytes.len()).expect("allocate");
                let src = acc.allocate(bytes.len()).expect("allocate");
                let target = if in_place { &dst } else { &src };
                acc.copy_to_device(target.full(), bytes, &stream)
                    .expect("h2d");
                let sum = Collective::AllReduce { op: ReduceOp::Max };
                let input = (!in_place).then_some(&src);
                c.submit(sum, 11, bcl_core::DataType::Float64, input, Some(&dst))
                    .expect("submit")
                    .wait()
                    .expect("device allreduce");
                acc.copy_to_host(bytemuck::cast_slice_mut(&mut out), dst.full(), &stream)
                    .expect("d2h");
            }
            results.push(out);
        }
        results
    });
    let want: Vec<f64> = (0..11).map(|i| (300 + i) as f64).collect();
    for (r, results) in outs.iter().enumerate() {
        for out in results {
            assert_eq!(out, &want, "rank {r}");
        }
    }
}
