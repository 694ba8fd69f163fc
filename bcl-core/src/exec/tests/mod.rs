//! The executor on its own: every collective and algorithm run by N executors over a virtual
//! network (delays, reordering across tags, back-pressure, loss, a stalled or lost peer) in
//! one thread, from a seed. Many seeds per run; a failure prints its seed, and
//! `BCL_EXEC_SEED=S` replays exactly that one (`BCL_EXEC_SEEDS=N` runs N seeds, the long mode).

mod fabric;
mod world;

use crate::exec::ExecError;
use crate::schedule::{Algorithm, Collective};
use bcl_backends::{DataType, ReduceOp};
use bcl_transport::TransportError;
use fabric::{Faults, Rng};
use world::{Case, Outcome, inputs, run, verify};

/// The seeds of this run: `BCL_EXEC_SEED` alone, or the first `BCL_EXEC_SEEDS` (default 40).
fn seeds() -> Vec<u64> {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if let Some(seed) = var("BCL_EXEC_SEED") {
        return vec![seed];
    }
    (1..=var("BCL_EXEC_SEEDS").unwrap_or(40)).collect()
}

/// Every kind of call the executor runs.
fn kinds() -> Vec<(Collective, Algorithm)> {
    let mut out = Vec::new();
    for op in ReduceOp::ALL {
        for algorithm in Algorithm::ALL {
            out.push((Collective::AllReduce { op }, algorithm));
        }
        out.push((Collective::ReduceScatter { op }, Algorithm::Ring));
        out.push((Collective::ReduceScatter { op }, Algorithm::HierRing));
        out.push((Collective::Reduce { op, root: 0 }, Algorithm::Ring));
        out.push((Collective::Reduce { op, root: 0 }, Algorithm::HierRing));
    }
    for c in [
        Collective::AllGather,
        Collective::Broadcast { root: 0 },
        Collective::AllToAll,
        Collective::Send { peer: 0 },
        Collective::Barrier,
        Collective::Gather { root: 0 },
        Collective::Scatter { root: 0 },
    ] {
        out.push((c, Algorithm::Ring));
    }
    out.push((Collective::Broadcast { root: 0 }, Algorithm::HierRing));
    out.push((Collective::AllGather, Algorithm::HierRing));
    out
}

/// The ring cut into hosts of random sizes (1 to 4 ranks).
fn draw_hosts(rng: &mut Rng, ring: &[usize]) -> Vec<Vec<usize>> {
    let mut hosts = Vec::new();
    let mut rest = ring;
    while !rest.is_empty() {
        let take = (1 + rng.below(4)).min(rest.len());
        hosts.push(rest[..take].to_vec());
        rest = &rest[take..];
    }
    hosts
}

/// A case of `collective` drawn from `rng`: world size, count, dtype, in place or not, slice
/// size, ring order, roots, and which ranks keep their buffers on a device.
fn draw_case(rng: &mut Rng, collective: Collective, algorithm: Algorithm) -> Case {
    let world = [1, 2, 3, 4, 5, 7, 8][rng.below(7)];
    let count = [0, 1, 7, 100, 257 + rng.below(700)][rng.below(5)];
    let collective = match collective {
        Collective::Reduce { op, .. } => Collective::Reduce {
            op,
            root: rng.below(world),
        },
        Collective::Broadcast { .. } => Collective::Broadcast {
            root: rng.below(world),
        },
        Collective::Gather { .. } => Collective::Gather {
            root: rng.below(world),
        },
        Collective::Scatter { .. } => Collective::Scatter {
            root: rng.below(world),
        },
        c => c,
    };
    let no_in_place = collective.is_point_to_point() || collective == Collective::Barrier;
    let mut ring: Vec<usize> = (0..world).collect();
    rng.shuffle(&mut ring);
    let hosts = draw_hosts(rng, &ring);
    let mixed = rng.below(2) == 1;
    Case {
        collective,
        algorithm,
        world,
        count,
        dtype: DataType::ALL[rng.below(DataType::ALL.len())],
        in_place: !no_in_place && rng.below(2) == 1,
        // At most a few hundred messages a chunk, so the virtual network stays fast.
        slice_elems: [1, 3, 16, 64, 1000][rng.below(5)].max(count / 64),
        ring,
        hosts,
        // Speeds that differ in half the cases (weighted shares where hosts are alike).
        weights: (0..world)
            .map(|_| if mixed { 1 + rng.below(4) as u32 } else { 1 })
            .collect(),
        on_device: (0..world).map(|_| rng.below(3) == 0).collect(),
    }
}

fn describe(outcome: &Outcome) -> String {
    let failed: Vec<String> = (outcome.errors.iter().enumerate())
        .filter_map(|(r, e)| e.as_ref().map(|e| format!("rank {r}: {e:?}")))
        .collect();
    format!(
        "done {:?}; errors [{}]; waiting on {:?}; blocked sends {:?}",
        outcome.done,
        failed.join(", "),
        outcome.waiting_on,
        outcome.blocked_sends
    )
}

#[test]
fn every_collective_and_algorithm_over_many_seeds() {
    let (mut runs, mut filled) = (0, 0);
    for seed in seeds() {
        let mut rng = Rng::new(seed);
        for (collective, algorithm) in kinds() {
            let case = draw_case(&mut rng, collective, algorithm);
            let outcome = run(&case, seed, Faults::default(), None);
            let replay = format!(
                "seed {seed}, {case:?}\nreplay: BCL_EXEC_SEED={seed} cargo test -p bcl-core --lib exec::tests"
            );
            assert!(
                outcome.done.iter().all(|d| *d),
                "not every rank finished: {}\n{replay}",
                describe(&outcome)
            );
            if let Err(wrong) = verify(&case, &inputs(&case, seed), &outcome.outputs) {
                panic!("{wrong}\n{replay}");
            }
            runs += 1;
            filled += outcome.filled;
        }
    }
    assert!(runs >= kinds().len(), "ran {runs} cases");
    assert!(
        filled > 0,
        "no send from device memory was filled in place in {runs} cases"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let mut rng = Rng::new(7);
    let case = draw_case(
        &mut rng,
        Collective::AllReduce { op: ReduceOp::Sum },
        Algorithm::Ring,
    );
    let (a, b) = (
        run(&case, 7, Faults::default(), None),
        run(&case, 7, Faults::default(), None),
    );
    assert_eq!(a.outputs, b.outputs);
    assert_eq!(a.done, b.done);
}

/// A ring allreduce of 4 ranks, 4 chunks of 8 slices, on the cpu: the shape the fault tests
/// share (with ring order 0 1 2 3, rank r receives from r-1).
fn ring_case(world: usize) -> Case {
    Case {
        collective: Collective::AllReduce { op: ReduceOp::Sum },
        algorithm: Algorithm::Ring,
        world,
        count: 256,
        dtype: DataType::Int32,
        in_place: false,
        slice_elems: 8,
        ring: (0..world).collect(),
        hosts: vec![(0..world).collect()],
        weights: vec![1; world],
        on_device: vec![false; world],
    }
}

#[test]
fn a_lost_message_leaves_its_receiver_waiting_on_the_sender() {
    for seed in seeds().into_iter().take(10) {
        let case = ring_case(4);
        // The 5th message from rank 1 to rank 2 never arrives.
        let outcome = run(
            &case,
            seed,
            Faults {
                lose: Some((1, 2, 5)),
                ..Faults::default()
            },
            None,
        );
        let why = format!("seed {seed}: {}", describe(&outcome));
        assert!(!outcome.done[2], "rank 2 finished without a message: {why}");
        assert!(outcome.errors.iter().all(Option::is_none), "{why}");
        assert_eq!(
            outcome.waiting_on[2],
            vec![1],
            "rank 2 must name rank 1: {why}"
        );
        // Nobody else names rank 2's predecessor: the others wait on their own neighbours.
        for r in [0, 1, 3] {
            assert!(!outcome.waiting_on[r].contains(&1), "rank {r}: {why}");
        }
    }
}

#[test]
fn a_stalled_peer_is_named_by_those_that_wait_for_it() {
    for seed in seeds().into_iter().take(10) {
        for (stalled, case) in [(2, ring_case(4)), (0, ring_case(3))] {
            let outcome = run(&case, seed, Faults::default(), Some(stalled));
            let why = format!(
                "seed {seed}, rank {stalled} stalled: {}",
                describe(&outcome)
            );
            let n = case.world;
            let successor = (stalled + 1) % n;
            assert!(!outcome.done[successor], "{why}");
            assert_eq!(outcome.waiting_on[successor], vec![stalled], "{why}");
            // Everyone a rank waits for is the stalled rank or itself unfinished: the wait
            // leads back to the culprit.
            for r in (0..n).filter(|r| *r != stalled) {
                for &p in &outcome.waiting_on[r] {
                    assert!(p == stalled || !outcome.done[p], "{why}");
                }
            }
        }
    }
}

#[test]
fn a_lost_peer_fails_those_that_need_it_naming_it() {
    for seed in seeds().into_iter().take(10) {
        let case = ring_case(4);
        let outcome = run(
            &case,
            seed,
            Faults {
                drop_rank: Some((3, 4)),
                ..Faults::default()
            },
            None,
        );
        let why = format!("seed {seed}: {}", describe(&outcome));
        let named: Vec<usize> = (outcome.errors.iter())
            .filter_map(|e| match e {
                Some(ExecError::Transport(TransportError::PeerClosed { peer, .. })) => Some(*peer),
                _ => None,
            })
            .collect();
        assert!(!named.is_empty(), "no rank failed: {why}");
        assert!(
            named.iter().all(|p| *p == 3),
            "every failure names rank 3: {why}"
        );
        // Rank 3's ring neighbours need it directly.
        for r in [0, 2] {
            assert!(outcome.errors[r].is_some() || !outcome.done[r], "{why}");
        }
    }
}

#[test]
fn different_signatures_are_a_desync_naming_the_peer() {
    // Rank 1 runs an allreduce of another count than the others.
    let case = ring_case(3);
    let mut other = case.clone();
    other.count = 255;
    let outcome = world::run_mixed(&[&case, &other, &case], 11);
    let desyncs: Vec<(usize, usize)> = (outcome.errors.iter().enumerate())
        .filter_map(|(r, e)| match e {
            Some(ExecError::Desync { peer, .. }) => Some((r, *peer)),
            _ => None,
        })
        .collect();
    assert!(!desyncs.is_empty(), "{}", describe(&outcome));
    assert!(
        desyncs.iter().all(|&(r, p)| r == 1 || p == 1),
        "each desync involves rank 1: {desyncs:?}"
    );
}
