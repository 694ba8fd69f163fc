//! The simulator against numbers it does not compute itself: the cost model's closed form
//! for an uncongested ring (one message per step), and symmetric runs against exact ones.

use bcl_core::ReduceOp;
use bcl_core::schedule::{Algorithm, Collective};
use bcl_sim::engine::{Case, Group, simulate, simulate_both, simulate_group, simulate_within};
use bcl_sim::topology::Topology;

fn case(algorithm: Algorithm, count: usize, slice_elems: usize) -> Case {
    Case {
        collective: Collective::AllReduce { op: ReduceOp::Sum },
        sendrecv: false,
        algorithm,
        count,
        elem_bytes: 4,
        in_place: false,
        slice_elems,
    }
}

#[test]
fn an_unsliced_ring_on_devices_takes_the_closed_form() {
    // Devices with their own engines (cores=0): 2(p−1)(α + cβ) + (p−1)cγ.
    for p in [2usize, 3, 4, 6] {
        let t = Topology::parse("cluster,per-host=1,nic=1x10@20,reduce=5", p).expect("spec");
        let count = 1 << 20;
        let out = simulate(&t, &case(Algorithm::Ring, count, count), t.hosts).expect("runs");
        let c = (count / p) as f64 * 4.0;
        let (alpha, beta, gamma) = (20e-6, 1.0 / 10e9, 1.0 / 5e9);
        let pf = (p - 1) as f64;
        let want = 2.0 * pf * (alpha + c * beta) + pf * c * gamma;
        let err = (out.seconds - want).abs() / want;
        assert!(
            err < 0.01,
            "p={p}: simulated {} s, closed form {want} s",
            out.seconds
        );
    }
}

#[test]
fn a_symmetric_run_of_a_ring_equals_the_exact_run() {
    let t = Topology::parse("cluster,per-host=4,nic=4x25@5,leaf=4", 64).expect("spec");
    for algorithm in [Algorithm::Ring, Algorithm::HierRing] {
        let c = case(algorithm, 1 << 22, 1 << 17);
        let exact = simulate(&t, &c, t.hosts).expect("exact");
        let sym = simulate(&t, &c, 4).expect("symmetric");
        assert!(sym.simulated_ranks < exact.simulated_ranks);
        let err = (sym.seconds - exact.seconds).abs() / exact.seconds;
        assert!(
            err < 1e-6,
            "{algorithm:?}: {} vs {}",
            sym.seconds,
            exact.seconds
        );
    }
}

#[test]
fn plans_that_are_not_symmetric_are_refused() {
    // Recursive doubling on 6 hosts: the pairing step breaks the symmetry.
    let t = Topology::parse("cluster,per-host=2,nic=2x25@5,leaf=0", 12).expect("spec");
    let e = simulate(&t, &case(Algorithm::HierDoubling, 1 << 10, 1 << 10), 2).expect_err("refused");
    assert!(e.contains("not symmetric"), "{e}");
    // Halving-doubling on 8 hosts, a power of two, whose sends match by XOR but whose
    // groups do not keep time once sliced.
    let t = Topology::parse("cluster,per-host=4,nic=4x25@5,leaf=4", 32).expect("spec");
    for algorithm in [Algorithm::HierHalving, Algorithm::HalvingDoubling] {
        let c = case(algorithm, 1 << 22, 1 << 17);
        let e = simulate(&t, &c, 2).expect_err("refused");
        assert!(e.contains("not symmetric"), "{e}");
        assert!(simulate(&t, &c, t.hosts).is_ok());
    }
}

#[test]
fn symmetric_runs_of_recursive_doubling_on_a_power_of_two_equal_the_exact_run() {
    let t = Topology::parse("cluster,per-host=4,nic=4x25@5,leaf=4", 64).expect("spec");
    for algorithm in [Algorithm::HierDoubling, Algorithm::RecursiveDoubling] {
        let c = case(algorithm, 1 << 20, 1 << 17);
        let exact = simulate(&t, &c, t.hosts).expect("exact");
        for group in [1, 2, 4] {
            let sym = simulate(&t, &c, group).expect("symmetric");
            let err = (sym.seconds - exact.seconds).abs() / exact.seconds;
            assert!(
                err < 1e-6,
                "{algorithm:?} by {group} hosts: {} vs {}",
                sym.seconds,
                exact.seconds
            );
        }
    }
}

#[test]
fn a_run_too_large_for_memory_is_refused_before_it_starts() {
    let t = Topology::parse("cluster,per-host=4,nic=4x25@5,leaf=4", 64).expect("spec");
    let c = case(Algorithm::Ring, 1 << 22, 1 << 10);
    let e = simulate_within(&t, &c, Group::all(&t), 10_000).expect_err("refused");
    assert!(
        e.contains("too large to simulate") && e.contains("10000"),
        "{e}"
    );
    let all = simulate_within(&t, &c, Group::all(&t), usize::MAX).expect("runs");
    // Far over the limit: refused by the estimate from the first host's plans, before the
    // rest are built; just over it: refused once the plans built reach it.
    let steps = all.steps as usize;
    let early = simulate_within(&t, &c, Group::all(&t), steps / 2).expect_err("refused");
    assert!(
        early.contains("the first host's 4 simulated ranks"),
        "{early}"
    );
    let late = simulate_within(&t, &c, Group::all(&t), steps - 1).expect_err("refused");
    assert!(late.contains("too large to simulate: the first "), "{late}");
    assert!(!late.contains("the first host's"), "{late}");
    assert!(simulate_within(&t, &c, Group::all(&t), steps).is_ok());
}

#[test]
fn one_rank_per_host_standing_for_its_host_equals_the_exact_run() {
    // 16 hosts (a power of two) and 6 (halving-doubling's and doubling's pairing step), an
    // even count and one that leaves parts one element apart (as many slices each). Links
    // inside a host slower than the NICs, so that its phases weigh in the time.
    let spec = "cluster,per-host=4,nic=4x25@5,leaf=4,intra=5@2";
    for (world, count) in [(64, 1 << 22), (24, 3_000_001), (24, 1 << 20)] {
        let t = Topology::parse(spec, world).expect("spec");
        for algorithm in [
            Algorithm::HierRing,
            Algorithm::HierDoubling,
            Algorithm::HierHalving,
        ] {
            let c = case(algorithm, count, 1 << 17);
            let exact = simulate(&t, &c, t.hosts).expect("exact");
            let one = Group {
                hosts: t.hosts,
                locals: 1,
            };
            let sym = simulate_group(&t, &c, one).expect("one rank per host");
            assert_eq!(sym.simulated_ranks, t.hosts);
            let err = (sym.seconds - exact.seconds).abs() / exact.seconds;
            assert!(
                err < 1e-6,
                "{algorithm:?}, {world} ranks, {count}: {} vs {}",
                sym.seconds,
                exact.seconds
            );
        }
    }
    // With groups of hosts as well: 4 of 16 hosts, one rank each, for a ring between hosts.
    let t = Topology::parse(spec, 64).expect("spec");
    let c = case(Algorithm::HierRing, 1 << 22, 1 << 17);
    let exact = simulate(&t, &c, t.hosts).expect("exact");
    let sym = simulate_group(
        &t,
        &c,
        Group {
            hosts: 4,
            locals: 1,
        },
    )
    .expect("4 ranks");
    assert_eq!(sym.simulated_ranks, 4);
    assert!((sym.seconds - exact.seconds).abs() / exact.seconds < 1e-6);
}

#[test]
fn ranks_of_a_host_that_are_not_turned_copies_are_all_simulated() {
    let t = Topology::parse("cluster,per-host=4,nic=4x25@5,leaf=4", 32).expect("spec");
    let one = Group {
        hosts: t.hosts,
        locals: 1,
    };
    // A flat ring: the last rank of a host sends to the next host, the others inside it.
    let e = simulate_group(&t, &case(Algorithm::Ring, 1 << 20, 1 << 17), one).expect_err("ring");
    assert!(e.contains("not symmetric by ranks inside a host"), "{e}");
    // A small allreduce runs on the first rank of each host only.
    let e = simulate_group(&t, &case(Algorithm::HierDoubling, 64, 64), one).expect_err("small");
    assert!(e.contains("not symmetric by ranks inside a host"), "{e}");
    // Parts of 1048577 and 1048576 elements: 9 slices against 8.
    let c = case(Algorithm::HierHalving, (1 << 22) + 3, 1 << 17);
    let e = simulate_group(&t, &c, one).expect_err("unequal slices");
    assert!(e.contains("not symmetric by ranks inside a host"), "{e}");
    // Ranks that share a NIC (2 per host of 4) load it together: one cannot stand for both.
    let shared = Topology::parse("cluster,per-host=4,nic=2x25@5,leaf=4", 32).expect("spec");
    let c = case(Algorithm::HierRing, 1 << 20, 1 << 17);
    let e = simulate_group(&shared, &c, one).expect_err("shared NICs");
    assert!(e.contains("share cores, NICs or uplinks"), "{e}");
}

#[test]
fn an_in_place_run_taken_from_the_out_of_place_one_equals_its_own_run() {
    // Hosts of 4, and hosts of 1, where out of place the hierarchical plans copy first.
    let hosts_of_4 = "cluster,per-host=4,nic=4x25@5,leaf=4,intra=5@2";
    let hosts_of_1 = "cluster,per-host=1,nic=1x25@5,leaf=4";
    let mut reused = 0;
    let mut cases = 0;
    for (spec, algorithm) in [hosts_of_4, hosts_of_1].into_iter().flat_map(|spec| {
        [
            Algorithm::Ring,
            Algorithm::RecursiveDoubling,
            Algorithm::HalvingDoubling,
            Algorithm::HierRing,
            Algorithm::HierDoubling,
            Algorithm::HierHalving,
        ]
        .map(|a| (spec, a))
    }) {
        let t = Topology::parse(spec, 32).expect("spec");
        for count in [1 << 10, 1 << 20, 3_000_001] {
            let oop = case(algorithm, count, 1 << 17);
            let ip = Case {
                in_place: true,
                ..oop.clone()
            };
            for g in [
                Group::all(&t),
                Group {
                    hosts: 8,
                    locals: 1,
                },
            ] {
                if g.hosts > t.hosts || !t.hosts.is_multiple_of(g.hosts) {
                    continue;
                }
                let Ok(both) = simulate_both(&t, &oop, &ip, g) else {
                    continue; // not symmetric by one rank per host: refused, as tested above
                };
                let alone = simulate_group(&t, &ip, g).expect("in place");
                assert_eq!(both.second, alone, "{algorithm:?} {count} {g:?}");
                let first = simulate_group(&t, &oop, g).expect("out of place");
                assert_eq!(both.first, first, "{algorithm:?} {count} {g:?}");
                cases += 1;
                reused += usize::from(!both.second_ran);
            }
        }
    }
    // The shortcut is taken somewhere (the hierarchical plans) and not everywhere.
    assert!(reused > 0 && reused < cases, "{reused} of {cases} reused");
}
