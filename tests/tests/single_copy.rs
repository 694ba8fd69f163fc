//! Single copy over shared memory (`bcl_transport::Lend`): ring messages lent by their sender
//! and copied by the receiver straight out of the sender's memory (`process_vm_readv`). Every
//! result is checked against the exact answer (integers) and, for floats, against the copying
//! path bit for bit (the same ring adds in the same order either way); in-place calls over
//! and over check that no rank writes a chunk a peer is still copying. Ranks are threads of
//! this process over real shared-memory rings (a process may read its own memory: the probe
//! finds every peer able to).

use bcl_core::{Algorithm, CommConfig, Communicator, ReduceOp, TransportKind};
use bcl_tests::{Setup, each, test_config};

/// `world` shm ranks on the ring; `single_copy_bytes`: the smallest message lent (0: none).
fn shm(world: usize, single_copy_bytes: usize) -> Vec<Communicator> {
    shm_running(world, single_copy_bytes, Some(Algorithm::Ring))
}

/// `world` shm ranks running `algorithm` (`None`: auto).
fn shm_running(
    world: usize,
    single_copy_bytes: usize,
    algorithm: Option<Algorithm>,
) -> Vec<Communicator> {
    Communicator::init_threads_with(world, |rank| CommConfig {
        transport: TransportKind::Shm,
        algorithm,
        // Small slices: many messages, each lent, at sizes a test runs in moments.
        slice_bytes: 16 << 10,
        single_copy_bytes,
        ..test_config(Setup::ShmCpu, rank)
    })
    .unwrap_or_else(|e| panic!("init of {world} shm ranks failed: {e}"))
}

fn ints(rank: usize, count: usize) -> Vec<i64> {
    (0..count)
        .map(|i| ((rank * 7919 + i * 104_729) % 100_003) as i64 - 50_000)
        .collect()
}

/// Floats whose sums depend on the order they are added in.
fn floats(rank: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| {
            let x = ((rank * 7919 + i * 104_729) % 1000) as f32 + 0.1;
            x * 10f32.powi((i % 5) as i32 - 2)
                * if (i + rank).is_multiple_of(3) {
                    -1.0
                } else {
                    1.0
                }
        })
        .collect()
}

#[test]
fn lent_ring_messages_give_the_exact_results_and_the_copying_paths_bits() {
    for world in [2, 3, 4] {
        let lending = shm(world, 1);
        let copying = shm(world, 0);
        for (r, c) in lending.iter().enumerate() {
            let peers = c.single_copy_peers();
            assert_eq!(
                peers.len(),
                world - 1,
                "rank {r} of {world} lends to {peers:?}, not to every peer"
            );
        }
        assert!(copying.iter().all(|c| c.single_copy_peers().is_empty()));
        // Chunks that do not divide evenly, one slice and many.
        for count in [world * 5 + 1, 4093, 70_001] {
            let sums = each(&lending, |r, c| {
                let mut out = vec![0i64; count];
                c.all_reduce(&ints(r, count), &mut out, ReduceOp::Sum)
                    .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                out
            });
            let inputs: Vec<Vec<i64>> = (0..world).map(|r| ints(r, count)).collect();
            let want: Vec<i64> = (0..count)
                .map(|i| inputs.iter().map(|x| x[i]).sum())
                .collect();
            for (r, got) in sums.iter().enumerate() {
                assert!(
                    got == &want,
                    "{world} ranks, {count}: rank {r}'s sum is wrong"
                );
            }
            let gathered = each(&lending, |r, c| {
                let mut out = vec![0i64; count * world];
                c.all_gather(&ints(r, count), &mut out)
                    .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                out
            });
            let want: Vec<i64> = (0..world).flat_map(|r| ints(r, count)).collect();
            assert!(
                gathered.iter().all(|g| g == &want),
                "{world} ranks, {count}: allgather"
            );
            let scattered = each(&lending, |r, c| {
                let mut out = vec![0i64; count];
                c.reduce_scatter(&ints(r, count * world), &mut out, ReduceOp::Max)
                    .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                out
            });
            let inputs: Vec<Vec<i64>> = (0..world).map(|q| ints(q, count * world)).collect();
            for (r, got) in scattered.iter().enumerate() {
                let want: Vec<i64> = (0..count)
                    .map(|i| {
                        inputs
                            .iter()
                            .map(|x| x[r * count + i])
                            .max()
                            .unwrap_or_default()
                    })
                    .collect();
                assert!(
                    got == &want,
                    "{world} ranks, {count}: rank {r}'s reduce-scatter"
                );
            }
            let float_sums = |comms: &[Communicator]| {
                each(comms, |r, c| {
                    let mut out = vec![0f32; count];
                    c.all_reduce(&floats(r, count), &mut out, ReduceOp::Sum)
                        .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    out
                })
            };
            let (lent, copied) = (float_sums(&lending), float_sums(&copying));
            for (r, (a, b)) in lent.iter().zip(&copied).enumerate() {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{world} ranks, {count} floats: rank {r} differs from copying"
                );
            }
        }
    }
}

/// In place, each result is the next call's input: a rank that overwrote a chunk before its
/// peer had copied it out (the allgather receives into chunks the reduce-scatter lent) would
/// show in the very next result.
#[test]
fn in_place_calls_back_to_back_never_overwrite_a_chunk_a_peer_is_still_copying() {
    let start = |r: usize, count: usize| (0..count).map(|i| (i % 7) as i64 + r as i64).collect();
    let (outs, want) = in_place_rounds(&shm(4, 1), 50_003, 12, start);
    for (r, got) in outs.iter().enumerate() {
        assert!(
            got == &want[r],
            "rank {r}: a chunk was overwritten while lent"
        );
    }
}

/// `rounds` in-place sums of `count` elements on every rank of `comms`, each rank's buffer
/// starting as `start(rank, count)` and brought back to small numbers (plus the rank) after
/// each sum, so the next is checkable: what each rank ends with, and the same arithmetic
/// done without any communicator.
fn in_place_rounds(
    comms: &[Communicator],
    count: usize,
    rounds: usize,
    start: impl Fn(usize, usize) -> Vec<i64> + Sync,
) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let shrink = |x: &mut i64, sum: i64, r: usize| *x = (sum % 1_000_003) + r as i64;
    let outs = each(comms, |r, c| {
        let mut buf = start(r, count);
        for round in 0..rounds {
            c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .unwrap_or_else(|e| panic!("rank {r} round {round}: {e}"));
            for x in buf.iter_mut() {
                shrink(x, *x, r);
            }
        }
        buf
    });
    let mut want: Vec<Vec<i64>> = (0..comms.len()).map(|r| start(r, count)).collect();
    for _ in 0..rounds {
        let sum: Vec<i64> = (0..count)
            .map(|i| want.iter().map(|b| b[i]).sum())
            .collect();
        for (r, b) in want.iter_mut().enumerate() {
            for (x, s) in b.iter_mut().zip(&sum) {
                shrink(x, *s, r);
            }
        }
    }
    (outs, want)
}

/// Auto's direct plan on one host (3+ ranks, lent slices: `cost::ONE_HOST_DIRECT_FROM`): each
/// owner lends its reduced slice to every other rank at once, and the next in-place call
/// writes that slice again. Back-to-back in-place sums show a slice overwritten while a peer
/// still copied it, or a loan given back to the wrong lender.
#[test]
fn the_direct_plan_on_one_host_lends_each_result_to_every_peer_and_sums_exactly() {
    // Where the host's ptrace rules refuse reads between sibling processes, auto keeps the
    // ring (ranks that are processes could not lend); these ranks are threads and can, so
    // the plan is then forced to be tested all the same.
    let permitted = bcl_core::transport::shm::sibling_reads_permitted();
    for world in [3, 4] {
        let mut comms = shm_running(world, 16 << 10, None);
        let sum = bcl_core::Collective::AllReduce { op: ReduceOp::Sum };
        let count = (1 << 20) / 8 + 3;
        for c in &comms {
            let direct = c.algorithm_for(sum, count * 8) == Algorithm::HierRing;
            assert_eq!(direct, permitted, "ptrace rules permit: {permitted}");
        }
        // A lending size above the slices (16 KiB here) lends no message: no direct plan.
        let unlent = shm_running(world, 32 << 10, None);
        assert_ne!(unlent[0].algorithm_for(sum, count * 8), Algorithm::HierRing);
        drop(unlent);
        if !permitted {
            drop(comms);
            comms = shm_running(world, 16 << 10, Some(Algorithm::HierRing));
        }
        let (outs, want) = in_place_rounds(&comms, count, 6, ints);
        for (r, got) in outs.iter().enumerate() {
            assert!(got == &want[r], "{world} ranks: rank {r}'s sums are wrong");
        }
    }
}
