//! The hierarchical collectives on namespace "hosts" (a bridge as the switch, each host's
//! one veth as its NIC, shaped to 2 Gbit/s with `tc tbf`): ranks of a host talk over shared
//! memory, hosts over TCP. For 2 × 2, 2 × 4, 4 × 2 and 3 + 1, every rank runs the
//! conformance suite (every collective, dtype and op) with a hierarchical algorithm forced,
//! then under auto; each must find the hosts from the bootstrap alone and auto must pick the
//! hierarchy. Then the health layer's verdicts while the hierarchy runs: a killed rank is
//! named dead, and a veth taken down between two hosts is a link failure between them.
//!
//! Needs root, iproute2 and sch_tbf (CI runs as root); fails loudly without them.

use bcl_core::UniqueId;
use bcl_tests::netns::{Cluster, Mesh, ip};
use bcl_tests::procs::{RankSpec, finish, one_at_a_time, signal, spawn, unix_ms, wait_ready};
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_bcl-rank");

/// Run the suite on hosts of `sizes` ranks with `BCL_ALGO=algo` and `extra` settings; every
/// rank must pass every case, see the hosts as the namespaces place them, and run the 4 KiB
/// allreduce with `expect` (the forced algorithm, or auto's pick).
fn suite(sizes: &[usize], algo: &str, expect: &str, extra: &[(&str, &str)], port: u16) {
    let cluster = Cluster::create(sizes.len(), Some("2gbit"));
    suite_on(&cluster, sizes, algo, expect, extra, port);
}

/// [`suite`] on `cluster`: with several NICs per host, rank `l` of a host binds to NIC
/// `l % nics`, so each rail between hosts has a NIC of its own.
fn suite_on(
    cluster: &Cluster,
    sizes: &[usize],
    algo: &str,
    expect: &str,
    extra: &[(&str, &str)],
    port: u16,
) {
    let host_of: Vec<usize> = (sizes.iter().enumerate())
        .flat_map(|(h, &n)| std::iter::repeat_n(h, n))
        .collect();
    let world = host_of.len();
    let root: std::net::SocketAddr = format!("{}:{port}", cluster.address(0))
        .parse()
        .expect("addr");
    let id = UniqueId::at(root).expect("id").to_string();
    let local = |rank: usize| (0..rank).filter(|&r| host_of[r] == host_of[rank]).count();
    let children: Vec<_> = (0..world)
        .map(|rank| {
            let bind = cluster.address_on(host_of[rank], local(rank) % cluster.nics());
            let mut env = vec![
                ("BCL_BIND_IP", bind.as_str()),
                ("BCL_TRANSPORT", "auto"),
                ("BCL_ALGO", algo),
                ("BCL_TIMEOUT_S", "60"),
            ];
            env.extend_from_slice(extra);
            spawn(&RankSpec {
                binary: RANK_BIN,
                rank,
                world,
                id: &id,
                scenario: "suite",
                env: &env,
                wrapper: &["ip", "netns", "exec", &cluster.namespaces[host_of[rank]]],
            })
        })
        .collect();
    let hosts: Vec<String> = (0..sizes.len())
        .map(|h| {
            let ranks: Vec<usize> = (0..world).filter(|&r| host_of[r] == h).collect();
            format!("{ranks:?}")
        })
        .collect();
    let topology = format!("{} hosts: {}", sizes.len(), hosts.join(" "));
    let deadline = Instant::now() + Duration::from_secs(300);
    for (rank, child) in children.into_iter().enumerate() {
        let f = finish(child, deadline, &format!("rank {rank}"));
        let what = format!("{sizes:?} {algo} rank {rank}: {}{}", f.stdout, f.stderr);
        assert_eq!(f.code, Some(0), "{what}");
        assert!(f.stdout.contains(", 0 failed; "), "{what}");
        assert!(f.stdout.contains(&topology), "want '{topology}': {what}");
        // Each host's NICs its ranks use, found from each rank's address in its namespace.
        let nics: Vec<String> = (0..sizes.len())
            .map(|h| {
                let used = sizes[h].min(cluster.nics());
                let names: Vec<String> = (0..used).map(|k| cluster.nic(k)).collect();
                format!("host {h}: {}", names.join(", "))
            })
            .collect();
        let nics = format!("NICs {};", nics.join("; "));
        assert!(f.stdout.contains(&nics), "want '{nics}': {what}");
        assert!(
            f.stdout.contains(&format!("allreduce 4 KiB by {expect}")),
            "want {expect}: {what}"
        );
        // A peer on this rank's host over shared memory, one elsewhere over tcp.
        for (peer, &h) in host_of.iter().enumerate() {
            let kind = if peer == rank {
                "self"
            } else if h == host_of[rank] {
                "shm"
            } else {
                "tcp"
            };
            assert!(f.stdout.contains(&format!("{peer}={kind}")), "{what}");
        }
    }
}

#[test]
fn two_hosts_of_two() {
    let _serial = one_at_a_time();
    suite(&[2, 2], "hier-rd", "hier-rd", &[], 29631);
    suite(&[2, 2], "auto", "hier-", &[], 29632);
}

/// Slices of 256 bytes: many slices per share, so phase 2 of a slice overlaps phase 1 of
/// the next over the real transports; every slice single copy (`BCL_SINGLE_COPY_BYTES=1`):
/// phase 1's sends are lent, so an owner reading a slice its sender has already overwritten
/// would show.
#[test]
fn two_hosts_of_four() {
    let _serial = one_at_a_time();
    let small = [("BCL_SLICE_BYTES", "256"), ("BCL_SINGLE_COPY_BYTES", "1")];
    suite(&[4, 4], "hier-ring", "hier-ring", &small, 29633);
    suite(&[4, 4], "auto", "hier-", &[], 29634);
}

/// 2 hosts × 2 ranks with two NICs per host (one subnet each, both into the switch, each
/// shaped alone): every rank finds its own NIC, the header lists both per host, the suite
/// passes with the hierarchy forced, and both rails' NICs carried the traffic between hosts.
#[test]
fn two_hosts_of_two_with_a_nic_per_rail() {
    let _serial = one_at_a_time();
    let cluster = Cluster::with_nics(2, 2, Some("1gbit"));
    let before: Vec<u64> = (0..2).map(|k| cluster.tx_bytes(0, k)).collect();
    suite_on(&cluster, &[2, 2], "hier-ring", "hier-ring", &[], 29646);
    for (k, before) in before.into_iter().enumerate() {
        let sent = cluster.tx_bytes(0, k) - before;
        // The suite's largest cases move hundreds of KiB between hosts per rail.
        assert!(
            sent > 256 << 10,
            "host 0's {} sent {sent} bytes: its rail did not use it",
            cluster.nic(k)
        );
    }
}

#[test]
fn four_hosts_of_two() {
    let _serial = one_at_a_time();
    suite(&[2, 2, 2, 2], "hier-hd", "hier-hd", &[], 29635);
    suite(&[2, 2, 2, 2], "auto", "hier-rd", &[], 29636);
    // Told links between hosts that cost nothing a step and move 1 MB/s (BCL_LINK_BETWEEN),
    // the selector weighs bytes alone and leaves doubling, which sends a rail's whole share
    // each round: the setting reaches every rank's choice, and the suite passes under it.
    let slow = [("BCL_LINK_BETWEEN", "0,0.001")];
    suite(&[2, 2, 2, 2], "auto", "hier-ring", &slow, 29647);
}

#[test]
fn three_ranks_and_one() {
    let _serial = one_at_a_time();
    suite(&[3, 1], "hier-ring", "hier-ring", &[], 29637);
    suite(&[3, 1], "auto", "hier-", &[], 29638);
}

/// Three hosts (a count the doubling rails pair up for) joined by the double binary tree,
/// slices of 256 bytes so the tree's slices pipeline.
#[test]
fn three_hosts_of_two_joined_by_the_tree() {
    let _serial = one_at_a_time();
    let small = [("BCL_SLICE_BYTES", "256")];
    suite(&[2, 2, 2], "hier-tree", "hier-tree", &small, 29645);
}

/// 2 × 2 hosts, a hierarchical allreduce loop; rank 3 is killed: every survivor names rank 3
/// dead (not a link, not a hang).
#[test]
fn a_killed_rank_is_named_dead_while_the_hierarchy_runs() {
    let _serial = one_at_a_time();
    let cluster = Cluster::create(2, Some("2gbit"));
    let root: std::net::SocketAddr = format!("{}:29639", cluster.address(0))
        .parse()
        .expect("addr");
    let id = UniqueId::at(root).expect("id").to_string();
    let host_of = [0, 0, 1, 1];
    let mut children: Vec<_> = (0..4)
        .map(|rank| {
            let bind = cluster.address(host_of[rank]);
            let env = [
                ("BCL_BIND_IP", bind.as_str()),
                ("BCL_ALGO", "hier-ring"),
                ("BCL_TEST_ITERS", "1000000"),
                ("BCL_TEST_ELEMS", "65536"),
            ];
            spawn(&RankSpec {
                binary: RANK_BIN,
                rank,
                world: 4,
                id: &id,
                scenario: "loop",
                env: &env,
                wrapper: &["ip", "netns", "exec", &cluster.namespaces[host_of[rank]]],
            })
        })
        .collect();
    wait_ready(&mut children);
    signal(&children[3], "KILL");
    let deadline = Instant::now() + Duration::from_secs(30);
    for (rank, child) in children.into_iter().enumerate().take(3) {
        let f = finish(child, deadline, &format!("rank {rank}"));
        let line = f.error_line().unwrap_or_default().to_string();
        assert_eq!(f.code, Some(7), "rank {rank} should fail: {}", f.stderr);
        assert!(
            line.contains("rank 3 (host") && line.contains("died"),
            "rank {rank} does not name rank 3 dead: {line}"
        );
    }
}

/// Three hosts of two ranks in a full mesh of veths, a hierarchical allreduce loop; the veth
/// between hosts 0 and 1 goes down: every rank reports a link failure between a rank of host
/// 0 and a rank of host 1, both alive, within 3 s, and nobody is called dead or hung.
#[test]
fn a_veth_down_between_two_hosts_is_a_link_failure_while_the_hierarchy_runs() {
    let _serial = one_at_a_time();
    let mesh = Mesh::create();
    let root: std::net::SocketAddr = format!("{}:29640", Mesh::address(0)).parse().expect("addr");
    let id = UniqueId::at(root).expect("id").to_string();
    let host_of = [0, 0, 1, 1, 2, 2];
    let mut children: Vec<_> = (0..6)
        .map(|rank| {
            let bind = Mesh::address(host_of[rank]);
            let env = [
                ("BCL_BIND_IP", bind.as_str()),
                ("BCL_ALGO", "hier-ring"),
                ("BCL_TEST_ITERS", "1000000"),
                ("BCL_TEST_ELEMS", "65536"),
            ];
            spawn(&RankSpec {
                binary: RANK_BIN,
                rank,
                world: 6,
                id: &id,
                scenario: "loop",
                env: &env,
                wrapper: &["ip", "netns", "exec", &mesh.namespaces[host_of[rank]]],
            })
        })
        .collect();
    wait_ready(&mut children);
    let cut_at = unix_ms();
    ip(&[
        "-n",
        &mesh.namespaces[0],
        "link",
        "set",
        &mesh.veth(0, 1),
        "down",
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    for (rank, child) in children.into_iter().enumerate() {
        let f = finish(child, deadline, &format!("rank {rank}"));
        assert_eq!(f.code, Some(7), "rank {rank} should fail: {}", f.stderr);
        let line = f.error_line().unwrap_or_default();
        eprintln!("{line}");
        let names = |ranks: [usize; 2]| {
            ranks
                .iter()
                .any(|r| line.contains(&format!("rank {r} (host")))
        };
        assert!(
            line.contains("link between")
                && line.contains("is down (both ranks alive)")
                && names([0, 1])
                && names([2, 3]),
            "rank {rank} does not report a link between hosts 0 and 1: {line}"
        );
        assert!(
            !line.contains(") died") && !line.contains("unresponsive"),
            "rank {rank}: {line}"
        );
        let (_, at) = f.error_times().expect("times");
        assert!(
            at <= cut_at + 3000,
            "rank {rank} reported {} ms after the cut: {line}",
            at.saturating_sub(cut_at)
        );
    }
}
