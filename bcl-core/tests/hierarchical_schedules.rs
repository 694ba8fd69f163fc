//! The hierarchical schedules (allreduce, broadcast, reduce, reduce-scatter, allgather),
//! proven by the symbolic checker on host × rank grids: 1..=8
//! hosts of 1..=4 ranks, and uneven hosts (3 + 1, 2 + 2 + 1, 1 + 4, 1 + 1 + 2), hosts that
//! are not runs of consecutive ranks, every inter-host algorithm, in and out of place, counts
//! that do not divide, slices that cut the parts unevenly.

use bcl_core::schedule::checker::{Case, check, plans};
use bcl_core::schedule::{Action, Algorithm};
use bcl_core::{Collective, ReduceOp};
use proptest::prelude::*;

const HIERARCHICAL: [Algorithm; 4] = [
    Algorithm::HierRing,
    Algorithm::HierDoubling,
    Algorithm::HierHalving,
    Algorithm::HierTree,
];

fn grid(hosts: usize, per_host: usize) -> Vec<Vec<usize>> {
    (0..hosts)
        .map(|h| (h * per_host..(h + 1) * per_host).collect())
        .collect()
}

/// Hosts of the given sizes, ranks dealt out round-robin (so no host is a run of ranks).
fn dealt(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut hosts = vec![Vec::new(); sizes.len()];
    let mut next = 0;
    while hosts.iter().zip(sizes).any(|(h, &s)| h.len() < s) {
        for (h, &s) in hosts.iter_mut().zip(sizes) {
            if h.len() < s {
                h.push(next);
                next += 1;
            }
        }
    }
    hosts
}

fn collectives(world: usize) -> Vec<Collective> {
    vec![
        Collective::AllReduce { op: ReduceOp::Sum },
        Collective::AllReduce { op: ReduceOp::Avg },
        Collective::Broadcast { root: 0 },
        Collective::Broadcast { root: world - 1 },
        Collective::Reduce {
            op: ReduceOp::Sum,
            root: world / 2,
        },
        Collective::Reduce {
            op: ReduceOp::Avg,
            root: world - 1,
        },
        Collective::ReduceScatter { op: ReduceOp::Sum },
        Collective::ReduceScatter { op: ReduceOp::Avg },
        Collective::AllGather,
    ]
}

fn prove(hosts: &[Vec<usize>], count: usize, in_place: bool, slice: usize, seed: u64) {
    prove_weighted(hosts, None, count, in_place, slice, seed);
}

fn prove_weighted(
    hosts: &[Vec<usize>],
    weights: Option<&[u32]>,
    count: usize,
    in_place: bool,
    slice: usize,
    seed: u64,
) {
    let world: usize = hosts.iter().map(Vec::len).sum();
    for collective in collectives(world) {
        // Reduce-scatter and allgather count per rank: their buffers (count · world) up to 128
        // elements keep the checker quick and still cut blocks into several slices.
        let per_rank = matches!(
            collective,
            Collective::ReduceScatter { .. } | Collective::AllGather
        );
        if per_rank && count * world > 128 {
            continue;
        }
        // Reduce-scatter and allgather exchange directly between hosts whichever is asked.
        let algorithms = if per_rank {
            &HIERARCHICAL[..1]
        } else {
            &HIERARCHICAL[..]
        };
        for &algorithm in algorithms {
            let case = Case {
                collective,
                algorithm,
                world,
                count,
                in_place,
                slice_elems: slice,
                ring: None,
                hosts: Some(hosts.to_vec()),
                weights: weights.map(<[u32]>::to_vec),
                seed,
            };
            if let Err(e) = check(&case) {
                panic!("{case:?}: {e}");
            }
        }
    }
}

#[test]
fn every_grid_of_up_to_8_hosts_of_up_to_4_ranks() {
    for hosts in 1..=8 {
        for per_host in 1..=4 {
            for count in [0usize, 1, 5, 13, 24] {
                for in_place in [false, true] {
                    for slice in [1usize, 4, 1000] {
                        let seed = (hosts * 131 + per_host * 17 + count) as u64;
                        prove(&grid(hosts, per_host), count, in_place, slice, seed);
                    }
                }
            }
        }
    }
}

#[test]
fn uneven_hosts_and_hosts_that_are_not_runs_of_ranks() {
    for sizes in [
        &[3, 1][..],
        &[1, 3],
        &[2, 2, 1],
        &[1, 4],
        &[1, 1, 2],
        &[4, 1, 2, 3],
        &[3, 3, 3, 3, 3, 3, 3, 1],
    ] {
        for count in [0usize, 1, 7, 12, 30] {
            for in_place in [false, true] {
                for slice in [1usize, 5, 1000] {
                    let seed = count as u64 * 7 + sizes.len() as u64;
                    prove(&dealt(sizes), count, in_place, slice, seed);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]

    /// Any host sizes (1..=8 hosts of 1..=4), any count, slicing and execution order.
    #[test]
    fn any_hosts_count_and_order(sizes in proptest::collection::vec(1usize..=4, 1..=8),
                                 count in 0usize..60, slice in 1usize..20,
                                 in_place: bool, seed: u64) {
        prove(&dealt(&sizes), count, in_place, slice, seed);
    }
}

/// The claim the hierarchy exists for, counted in the plans: on 2 hosts × 4 ranks the
/// hierarchical allreduce sends n elements across the host boundary per direction, where the
/// flat ring sends 2(p−1)/p·n = 1.75·n; and every message between two ranks of one host
/// stays inside it.
#[test]
fn the_boundary_carries_n_per_direction_instead_of_the_rings_one_and_three_quarters() {
    let hosts = grid(2, 4);
    let count = 8 * 1024;
    let crossing = |algorithm| {
        let case = Case {
            collective: Collective::AllReduce { op: ReduceOp::Sum },
            algorithm,
            world: 8,
            count,
            in_place: true,
            slice_elems: 256,
            ring: None,
            hosts: Some(hosts.clone()),
            weights: None,
            seed: 1,
        };
        let plans = plans(&case).expect("plans");
        let mut a_to_b = 0;
        for (rank, plan) in plans.iter().enumerate() {
            for step in &plan.steps {
                if let Action::Send { peer, from, .. } = &step.action
                    && rank < 4
                    && *peer >= 4
                {
                    a_to_b += from.len;
                }
            }
        }
        a_to_b
    };
    assert_eq!(crossing(Algorithm::HierRing), count);
    assert_eq!(crossing(Algorithm::Ring), count * 7 / 4);
}

/// Ranks of different speeds: every grid of up to 4 hosts of 2 to 4 ranks with drawn weights
/// is proven, and the shares follow the weights: one host of 4 ranks weighing 1, 1, 2 and 4
/// reduce 1000, 1000, 2000 and 4000 of 8000 elements; on 2 hosts a part weighs the slower of
/// its two owners.
#[test]
fn shares_in_proportion_to_speed() {
    let mut draw = 0x9e37_79b9u32;
    for hosts in 1..=4 {
        for per_host in 2..=4 {
            let weights: Vec<u32> = (0..hosts * per_host)
                .map(|_| {
                    draw ^= draw << 13;
                    draw ^= draw >> 17;
                    draw ^= draw << 5;
                    1 + draw % 5
                })
                .collect();
            for (count, slice) in [(4096, 512), (5000, 700), (61, 7)] {
                let g = grid(hosts, per_host);
                prove_weighted(&g, Some(&weights), count, false, slice, u64::from(draw));
            }
        }
    }
    // Each rank's share: what it receives, reducing, from one other rank of its host.
    let shares = |hosts: Vec<Vec<usize>>, weights: Vec<u32>| {
        let world = weights.len();
        let case = Case {
            collective: Collective::AllReduce { op: ReduceOp::Sum },
            algorithm: Algorithm::HierRing,
            world,
            count: 8000,
            in_place: true,
            slice_elems: 100_000,
            ring: None,
            hosts: Some(hosts.clone()),
            weights: Some(weights),
            seed: 1,
        };
        let plans = plans(&case).expect("plans");
        (0..world)
            .map(|rank| {
                let local = hosts.iter().find(|h| h.contains(&rank)).expect("a host");
                let other = *local.iter().find(|&&r| r != rank).expect("a neighbour");
                (plans[rank].steps.iter())
                    .filter_map(|s| match &s.action {
                        Action::Recv {
                            peer, into, reduce, ..
                        } if *reduce && *peer == other => Some(into.len),
                        _ => None,
                    })
                    .sum::<usize>()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        shares(grid(1, 4), vec![1, 1, 2, 4]),
        [1000, 1000, 2000, 4000]
    );
    // Parts weigh min(1, 3) = 1 and min(3, 1) = 1: equal; min(1, 1), min(3, 1): equal;
    // min(1, 2) = 1 and min(3, 6) = 3: a quarter and three quarters.
    assert_eq!(
        shares(grid(2, 2), vec![1, 3, 3, 1]),
        [4000, 4000, 4000, 4000]
    );
    assert_eq!(
        shares(grid(2, 2), vec![1, 3, 1, 1]),
        [4000, 4000, 4000, 4000]
    );
    assert_eq!(
        shares(grid(2, 2), vec![1, 3, 2, 6]),
        [2000, 6000, 2000, 6000]
    );
}

/// Over a layout of one host, a forced hierarchical algorithm is the in-host reduce-scatter
/// and allgather alone (no rail), and over hosts of one rank it is the flat algorithm.
#[test]
fn degenerate_hierarchies_are_proven_too() {
    prove(&grid(1, 5), 11, false, 3, 9);
    prove(&grid(5, 1), 11, true, 3, 9);
}
