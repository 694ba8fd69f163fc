//! Every schedule, proven on the abstract network by the symbolic checker: matching sends and
//! receives, no deadlock, exact final contents, for world sizes 1..=16 and awkward counts.

use bcl_core::schedule::Algorithm;
use bcl_core::schedule::checker::{Case, check};
use bcl_core::{Collective, ReduceOp};
use proptest::prelude::*;

fn collectives(world: usize) -> Vec<Collective> {
    let root = world / 2;
    vec![
        Collective::AllReduce { op: ReduceOp::Sum },
        Collective::AllReduce { op: ReduceOp::Avg },
        Collective::AllGather,
        Collective::ReduceScatter { op: ReduceOp::Max },
        Collective::ReduceScatter { op: ReduceOp::Avg },
        Collective::Broadcast { root },
        Collective::Reduce {
            op: ReduceOp::Sum,
            root,
        },
        Collective::Reduce {
            op: ReduceOp::Avg,
            root: world - 1,
        },
        Collective::AllToAll,
        Collective::Send { peer: world - 1 },
        Collective::Barrier,
    ]
}

fn run(
    collective: Collective,
    world: usize,
    count: usize,
    in_place: bool,
    slice: usize,
    ring: Option<Vec<usize>>,
    seed: u64,
) {
    if matches!(collective, Collective::Send { .. } | Collective::Barrier) && in_place {
        return;
    }
    if matches!(collective, Collective::Send { .. }) && world < 2 {
        return;
    }
    for algorithm in [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::HalvingDoubling,
    ] {
        let case = Case {
            collective,
            algorithm,
            world,
            count,
            in_place,
            slice_elems: slice,
            ring: ring.clone(),
            seed,
        };
        if let Err(e) = check(&case) {
            panic!("{case:?}: {e}");
        }
    }
}

#[test]
fn exhaustive_small_worlds_and_counts() {
    for world in 1..=9 {
        for count in [0usize, 1, 2, 3, 5, 7, 13, 17, 31] {
            for in_place in [false, true] {
                for slice in [1usize, 3, 1000] {
                    for c in collectives(world) {
                        run(
                            c,
                            world,
                            count,
                            in_place,
                            slice,
                            None,
                            count as u64 * 31 + world as u64,
                        );
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Any world size to 16, any count (primes and non-multiples included), any slicing, any
    /// ring order, any execution order.
    #[test]
    fn any_world_count_ring_and_order(world in 1usize..=16, count in 0usize..70,
                                      slice in 1usize..40, in_place: bool,
                                      which in 0usize..11, seed: u64,
                                      shuffle in proptest::collection::vec(any::<u32>(), 16)) {
        let mut ring: Vec<usize> = (0..world).collect();
        ring.sort_by_key(|r| shuffle[*r]);
        let c = collectives(world)[which];
        run(c, world, count, in_place, slice, Some(ring), seed);
    }
}

#[test]
fn checker_catches_a_broken_plan() {
    // The checker must be able to fail: a ring that is not a permutation is rejected, and a
    // world where rank 0 sends to itself is caught as a bad peer.
    let bad = Case {
        collective: Collective::AllReduce { op: ReduceOp::Sum },
        algorithm: Algorithm::Ring,
        world: 3,
        count: 5,
        in_place: false,
        slice_elems: 2,
        ring: Some(vec![0, 0, 1]),
        seed: 1,
    };
    assert!(check(&bad).is_err());
}

#[test]
fn schedules_are_sans_io() {
    // No clock, socket, thread or device in the schedule module.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/schedule");
    let forbidden = [
        "std::time",
        "Instant",
        "std::net",
        "std::thread",
        "Accelerator",
        "Transport",
        "std::fs",
        "std::sync",
    ];
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("schedule dir") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        for word in forbidden {
            assert!(!text.contains(word), "{} mentions {word}", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 6, "expected the schedule files, found {checked}");
}
