//! Every schedule, proven on the abstract network by the symbolic checker: matching sends and
//! receives, no deadlock, exact final contents, for world sizes 1..=16 and awkward counts.

use bcl_core::schedule::Algorithm;
use bcl_core::schedule::checker::{Case, check, check_plans, plans};
use bcl_core::schedule::{Action, Plan, Step};
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
        Collective::Gather { root },
        Collective::Gather { root: world - 1 },
        Collective::Scatter { root },
        Collective::Scatter { root: 0 },
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
        Algorithm::Tree,
    ] {
        let case = Case {
            collective,
            algorithm,
            world,
            count,
            in_place,
            slice_elems: slice,
            ring: ring.clone(),
            hosts: None,
            weights: None,
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
                                      which in 0usize..15, seed: u64,
                                      shuffle in proptest::collection::vec(any::<u32>(), 16)) {
        let mut ring: Vec<usize> = (0..world).collect();
        ring.sort_by_key(|r| shuffle[*r]);
        let c = collectives(world)[which];
        run(c, world, count, in_place, slice, Some(ring), seed);
    }
}

/// The case the mutation tests alter: a 4-rank ring allreduce of 16 elements in slices of
/// 2, so every rank's plan has receives that reduce, receives that overwrite, and sends that
/// wait for them.
fn ring_case(seed: u64) -> Case {
    Case {
        collective: Collective::AllReduce { op: ReduceOp::Sum },
        algorithm: Algorithm::Ring,
        world: 4,
        count: 16,
        in_place: false,
        slice_elems: 2,
        ring: None,
        hosts: None,
        weights: None,
        seed,
    }
}

/// The first error the checker finds in `plans` over 300 execution orders (a mutation that
/// only some orders expose, such as a missing dependency, must show in one of them); the
/// unaltered plans pass every one of those orders.
fn caught(mutate: impl Fn(&mut Vec<Plan>)) -> Option<String> {
    let mut mutated = plans(&ring_case(0)).expect("plans");
    mutate(&mut mutated);
    (0..300u64).find_map(|seed| {
        let case = ring_case(seed);
        let original = plans(&case).expect("plans");
        assert_eq!(
            check_plans(&case, &original),
            Ok(()),
            "seed {seed}: the real plans"
        );
        check_plans(&case, &mutated).err()
    })
}

/// Whether step `to` is reachable from step `from` through dependencies.
fn depends(plan: &Plan, from: usize, to: usize) -> bool {
    let mut stack = vec![from];
    let mut seen = vec![false; plan.steps.len()];
    while let Some(s) = stack.pop() {
        if s == to {
            return true;
        }
        if !std::mem::replace(&mut seen[s], true) {
            stack.extend(&plan.steps[s].deps);
        }
    }
    false
}

#[test]
fn checker_catches_a_dropped_dependency() {
    let caught = caught(|plans| {
        let plan = &mut plans[1];
        // A send that waits for a receive, through that dependency alone.
        let (step, dep) = (0..plan.steps.len())
            .find_map(|s| {
                let deps = &plan.steps[s].deps;
                let Action::Send { .. } = plan.steps[s].action else {
                    return None;
                };
                deps.iter()
                    .copied()
                    .find(|&d| {
                        matches!(plan.steps[d].action, Action::Recv { .. })
                            && !deps.iter().any(|&o| o != d && depends(plan, o, d))
                    })
                    .map(|d| (s, d))
            })
            .expect("a send that waits for a receive");
        plan.steps[step].deps.retain(|d| *d != dep);
    });
    let error = caught.expect("the checker missed a dropped dependency");
    assert!(error.contains("rank"), "{error}");
}

#[test]
fn checker_catches_two_swapped_tags() {
    let caught = caught(|plans| {
        let plan = &mut plans[0];
        let sends: Vec<usize> = (0..plan.steps.len())
            .filter(|&s| matches!(plan.steps[s].action, Action::Send { .. }))
            .collect();
        let tag_of = |a: &Action| match a {
            Action::Send { tag, .. } => *tag,
            _ => unreachable!("a send"),
        };
        let (a, b) = (sends[0], sends[1]);
        let (ta, tb) = (tag_of(&plan.steps[a].action), tag_of(&plan.steps[b].action));
        for (s, t) in [(a, tb), (b, ta)] {
            if let Action::Send { tag, .. } = &mut plan.steps[s].action {
                *tag = t;
            }
        }
    });
    assert!(caught.is_some(), "the checker missed two swapped tags");
}

#[test]
fn checker_catches_a_wrong_reduction() {
    let caught = caught(|plans| {
        let plan = &mut plans[2];
        let step = plan
            .steps
            .iter_mut()
            .find(|s| matches!(s.action, Action::Recv { reduce: true, .. }));
        if let Some(Step {
            action: Action::Recv { reduce, .. },
            ..
        }) = step
        {
            *reduce = false; // overwrite where the ring must reduce
        }
    });
    let error = caught.expect("the checker missed a receive that overwrites instead of reducing");
    assert!(error.contains("expected"), "{error}");
}

/// `plan` without step `gone` (the dependencies renumbered; a step that waited for it waits
/// for what it waited for instead, so the order it kept between other steps stays).
fn remove_step(plan: &mut Plan, gone: usize) {
    let inherited = plan.steps.remove(gone).deps;
    for step in &mut plan.steps {
        if step.deps.contains(&gone) {
            step.deps.retain(|d| *d != gone);
            step.deps.extend(&inherited);
            step.deps.sort_unstable();
            step.deps.dedup();
        }
        for d in &mut step.deps {
            if *d > gone {
                *d -= 1;
            }
        }
    }
}

#[test]
fn checker_catches_a_missing_step() {
    let caught = caught(|plans| {
        let gone = plans[3].steps.len() / 2;
        remove_step(&mut plans[3], gone);
    });
    assert!(caught.is_some(), "the checker missed a missing step");
}

#[test]
fn checker_catches_a_missing_division() {
    let case = Case {
        collective: Collective::AllReduce { op: ReduceOp::Avg },
        ..ring_case(3)
    };
    let mut mutated = plans(&case).expect("plans");
    assert_eq!(check_plans(&case, &mutated), Ok(()));
    while let Some(divide) =
        (mutated[1].steps.iter()).position(|s| matches!(s.action, Action::Divide { .. }))
    {
        remove_step(&mut mutated[1], divide);
    }
    let error = check_plans(&case, &mutated).expect_err("a missing division");
    assert!(error.contains("divided 0×, expected"), "{error}");
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

/// All-to-all with per-pair counts, all-gather and reduce-scatter (sum, average) with
/// per-rank counts: every count matrix of small worlds drawn from a seed
/// (empty blocks, uneven sizes), sliced finely and not, in any ring order and execution order.
#[test]
fn collectives_with_per_rank_counts() {
    use bcl_core::schedule::checker::{
        check_all_gather_v, check_all_to_all_v, check_reduce_scatter_v,
    };
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for world in 1..=7 {
        for trial in 0..40 {
            let sends: Vec<Vec<usize>> = (0..world)
                .map(|_| (0..world).map(|_| (next() % 9) as usize).collect())
                .collect();
            let mut ring: Vec<usize> = (0..world).collect();
            ring.sort_by_key(|_| next());
            let per_rank: Vec<usize> = (0..world).map(|_| (next() % 9) as usize).collect();
            for slice in [1usize, 3, 1000] {
                let seed = next();
                if let Err(e) = check_all_to_all_v(&sends, slice, Some(ring.clone()), seed) {
                    panic!("world {world} trial {trial} slice {slice} {sends:?}: {e}");
                }
                if let Err(e) = check_all_gather_v(&per_rank, slice, Some(ring.clone()), seed) {
                    panic!("allgatherv world {world} slice {slice} {per_rank:?}: {e}");
                }
                for average in [false, true] {
                    let r =
                        check_reduce_scatter_v(&per_rank, average, slice, Some(ring.clone()), seed);
                    if let Err(e) = r {
                        panic!(
                            "reducescatterv (avg {average}) world {world} slice {slice} {per_rank:?}: {e}"
                        );
                    }
                }
            }
        }
    }
}
