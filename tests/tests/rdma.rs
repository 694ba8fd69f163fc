//! The rdma transport through the communicator. Outside the Soft-RoCE VM there is no device:
//! asking for rdma is a clear error naming the rank and the reason. Inside it
//! (`scripts/rdma-vm-test.sh`, `BCL_RDMA_VM=1`) the same test demands rdma links, and the
//! ignored tests check a collective and a failing device choice. Auto's fallback to tcp when a
//! rank's rdma setup fails is checked with separate processes by the VM script (threads of one
//! process use the in-process transport under auto).
#![cfg(feature = "rdma")]

use bcl_core::LinkKind;
use bcl_core::{CommConfig, Communicator, ReduceOp};
use bcl_tests::{Setup, test_config};
use std::time::Duration;

fn in_vm() -> bool {
    std::env::var_os("BCL_RDMA_VM").is_some()
}

fn rdma_config(rank: usize) -> CommConfig {
    test_config(Setup::RdmaCpu, rank)
}

#[test]
fn rdma_links_where_a_device_exists_and_a_clear_error_where_not() {
    let result = Communicator::init_threads_with(2, rdma_config);
    if in_vm() {
        let comms = result.expect("inside the VM, --transport rdma must connect over rxe0");
        for c in &comms {
            let peer = 1 - c.rank();
            assert_eq!(c.link(peer), Some(LinkKind::Rdma), "rank {}", c.rank());
        }
        return;
    }
    let e = result
        .expect_err("no RDMA device on this machine")
        .to_string();
    assert!(
        e.contains("rank ")
            && e.contains("transport rdma was requested but is unavailable")
            && (e.contains("no RDMA devices") || e.contains("libibverbs not available")),
        "{e}"
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
fn rdma_allreduce_of_a_large_buffer_over_two_ranks_is_exact() {
    let comms = Communicator::init_threads_with(2, rdma_config).expect("init over rdma");
    let count = 3 << 18; // 3 MiB of f32: many slices, many chunks, the credits cycle.
    let results: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank() as f32;
                    let send: Vec<f32> = (0..count).map(|i| (i % 1000) as f32 + r).collect();
                    let mut recv = vec![0f32; count];
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum)
                        .expect("allreduce");
                    recv
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    for recv in results {
        for (i, v) in recv.iter().enumerate() {
            assert_eq!(*v, 2.0 * (i % 1000) as f32 + 1.0, "element {i}");
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
fn rdma_with_a_missing_device_named_is_an_error_naming_the_devices_there_are() {
    let e = Communicator::init_threads_with(2, |rank| CommConfig {
        rdma_device: Some("nosuchdev0".into()),
        ..rdma_config(rank)
    })
    .expect_err("no such device")
    .to_string();
    assert!(
        e.contains("RDMA device nosuchdev0 not found") && e.contains("rxe0"),
        "{e}"
    );
    assert!(e.contains("rank "), "{e}");
}

/// `ip link set NETDEV up|down`, failing loudly (the VM runs tests as root).
fn set_link(netdev: &str, state: &str) {
    let out = std::process::Command::new("ip")
        .args(["link", "set", netdev, state])
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip link set {netdev} {state}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Brings the netdev back up however the test ends, for the tests after it.
struct Restore(&'static str);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "set", self.0, "up"])
            .status();
    }
}

/// `world` ranks allreduce 1 MiB of f32 30 times; before iteration `at` of each `(at, netdev)`
/// in `downs`, rank 0 takes `netdev` down (a barrier first, so every rank is between
/// iterations). Every result is checked exactly. Returns the communicators and, per rank, the
/// time of the allreduce begun right after the first netdev went down and the slowest of the
/// others after the first iteration.
fn allreduce_while_netdevs_go_down(
    world: usize,
    config: fn(usize) -> CommConfig,
    downs: &[(usize, &str)],
) -> (Vec<Communicator>, Vec<(Duration, Duration)>) {
    let comms = Communicator::init_threads_with(world, config).expect("init over rdma");
    let count = 1 << 18; // 1 MiB of f32: several chunks per step
    let iterations = 30;
    let first_down = downs.first().map_or(usize::MAX, |d| d.0);
    let barrier = std::sync::Barrier::new(world);
    let times: Vec<(Duration, Duration)> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                let barrier = &barrier;
                s.spawn(move || {
                    let r = c.rank();
                    let (mut at_fault, mut slowest) = (Duration::ZERO, Duration::ZERO);
                    for it in 0..iterations {
                        for (_, netdev) in downs.iter().filter(|d| d.0 == it) {
                            barrier.wait();
                            if r == 0 {
                                set_link(netdev, "down");
                            }
                        }
                        // Integers below 2^24: the sum is exact in f32 in any order.
                        let mut x: Vec<f32> =
                            (0..count).map(|i| ((i + it) % 1000 + r) as f32).collect();
                        let started = std::time::Instant::now();
                        c.all_reduce_in_place(&mut x, ReduceOp::Sum)
                            .unwrap_or_else(|e| panic!("rank {r} iteration {it}: {e}"));
                        let took = started.elapsed();
                        if it == first_down {
                            at_fault = took;
                        } else if it > 0 {
                            slowest = slowest.max(took);
                        }
                        let sum_r = (world * (world - 1) / 2) as f32;
                        for (i, v) in x.iter().enumerate() {
                            let want = world as f32 * ((i + it) % 1000) as f32 + sum_r;
                            assert_eq!(*v, want, "rank {r} iteration {it} element {i}");
                        }
                    }
                    (at_fault, slowest)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    (comms, times)
}

/// Each rank's degraded-link lines: every one names the rank, and matches one of `moves`;
/// the health report lists the same, and no fault was raised.
fn degraded_lines_only(c: &Communicator, moves: &[&str]) -> Vec<String> {
    let lines = c.degraded_links();
    assert!(!lines.is_empty(), "rank {}: no degraded link", c.rank());
    for line in &lines {
        assert!(
            line.starts_with(&format!("degraded link rank {} <-> rank ", c.rank()))
                && moves.iter().any(|m| line.contains(m)),
            "{line}"
        );
    }
    let report = c.health_report();
    assert_eq!(report["degraded_links"], serde_json::json!(lines));
    assert!(report["verdict"].is_null(), "{report}");
    assert!(c.async_error().is_none(), "{:?}", c.async_error());
    lines
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
fn rdma_the_netdev_going_down_mid_loop_moves_the_links_to_tcp_and_every_result_is_exact() {
    // rxe0 sits on dummy0 (scripts/rdma-vm.sh); the setup sockets, which carry a link once it
    // moves, are on loopback.
    const NETDEV: &str = "dummy0";
    let _restore = Restore(NETDEV);
    let (comms, times) = allreduce_while_netdevs_go_down(4, rdma_config, &[(5, NETDEV)]);
    eprintln!(
        "per rank, the allreduce in flight as {NETDEV} went down, and the slowest other after the first: {times:?}"
    );
    eprintln!("rank 0: {:?}", comms[0].degraded_links());
    // Every ring link moved: each rank names at least its ring neighbours' links, with the
    // device it left and tcp.
    for c in &comms {
        degraded_lines_only(c, &["rdma rxe0 port 1 -> tcp after: "]);
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/rdma-vm-test.sh runs it in the Soft-RoCE VM"]
fn rdma_two_lanes_one_netdev_down_moves_to_the_other_lane_and_both_down_to_tcp() {
    // Lane 0 on rxe0 (dummy0), lane 1 on rxe1 (dummy1). dummy1 going down moves every lane-1
    // link to lane 0, still RDMA; dummy0 going down later leaves no RDMA lane: tcp.
    let _restore = [Restore("dummy1"), Restore("dummy0")];
    fn two_lanes(rank: usize) -> CommConfig {
        CommConfig {
            rdma_device: Some("rxe0,rxe1".into()),
            rdma_qps: 2,
            ..rdma_config(rank)
        }
    }
    let to_lane_0 = "rdma rxe1 port 1 -> rdma rxe0 port 1 after: ";
    let to_tcp = "rdma rxe0 port 1 -> tcp after: ";
    let (comms, times) =
        allreduce_while_netdevs_go_down(4, two_lanes, &[(5, "dummy1"), (15, "dummy0")]);
    eprintln!(
        "per rank, the allreduce in flight as dummy1 went down, and the slowest other after the first: {times:?}"
    );
    eprintln!("rank 0: {:?}", comms[0].degraded_links());
    for c in &comms {
        let lines = degraded_lines_only(c, &[to_lane_0, to_tcp]);
        // Per peer, the move to lane 0 comes before the move to tcp, and every rank made both.
        let position = |m: &str| lines.iter().position(|l| l.contains(m));
        let (first, last) = (position(to_lane_0), position(to_tcp));
        assert!(
            first.is_some() && last.is_some() && first < last,
            "rank {}: {lines:?}",
            c.rank()
        );
    }
}
