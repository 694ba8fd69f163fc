//! Network namespaces as separate "hosts", joined pairwise by veth pairs:
//! * a link that goes down between two live ranks, for real: three ranks, one per namespace.
//!   Taking one veth down cuts ranks 0 and 1 apart while both still reach rank 2; every rank
//!   must report a link failure between 0 and 1 (not a dead or hung rank) within 3 s;
//! * the automatic transport choice: four ranks, two sharing a namespace, run the suite over
//!   shared memory between those two and TCP everywhere else.
//!
//! Needs root (CI runs as root) and iproute2; it fails loudly without them, never skips.

use bcl_core::UniqueId;
use bcl_tests::netns::{Mesh, ip};
use bcl_tests::procs::{RankSpec, finish, spawn, unix_ms, wait_ready};
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_bcl-rank");

#[test]
fn a_veth_taken_down_is_reported_as_a_link_failure_between_those_two_ranks() {
    let mesh = Mesh::create();
    let root: std::net::SocketAddr = format!("{}:29611", Mesh::address(0)).parse().expect("addr");
    let id = UniqueId::at(root).expect("id").to_string();
    let binds: Vec<String> = (0..3).map(Mesh::address).collect();
    let mut children: Vec<_> = (0..3)
        .map(|rank| {
            let env = [
                ("BCL_BIND_IP", binds[rank].as_str()),
                ("BCL_TEST_ITERS", "1000000"),
                ("BCL_TEST_ELEMS", "262144"),
            ];
            spawn(&RankSpec {
                binary: RANK_BIN,
                rank,
                world: 3,
                id: &id,
                scenario: "loop",
                env: &env,
                wrapper: &["ip", "netns", "exec", &mesh.namespaces[rank]],
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
        assert!(
            line.contains("link between")
                && line.contains("is down (both ranks alive)")
                && line.contains("rank 0 (host")
                && line.contains("rank 1 (host"),
            "rank {rank} does not report the 0-1 link: {line}"
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

#[test]
fn auto_links_ranks_sharing_a_namespace_by_shared_memory_and_the_rest_by_tcp() {
    let mesh = Mesh::create();
    let root: std::net::SocketAddr = format!("{}:29612", Mesh::address(0)).parse().expect("addr");
    let id = UniqueId::at(root).expect("id").to_string();
    // Ranks 0 and 1 on "host" 0, rank 2 on host 1, rank 3 on host 2.
    let host_of = [0, 0, 1, 2];
    let children: Vec<_> = (0..4)
        .map(|rank| {
            let bind = Mesh::address(host_of[rank]);
            let env = [("BCL_BIND_IP", bind.as_str()), ("BCL_TRANSPORT", "auto")];
            spawn(&RankSpec {
                binary: RANK_BIN,
                rank,
                world: 4,
                id: &id,
                scenario: "suite",
                env: &env,
                wrapper: &["ip", "netns", "exec", &mesh.namespaces[host_of[rank]]],
            })
        })
        .collect();
    let want = [
        "links 0=self,1=shm,2=tcp,3=tcp",
        "links 0=shm,1=self,2=tcp,3=tcp",
        "links 0=tcp,1=tcp,2=self,3=tcp",
        "links 0=tcp,1=tcp,2=tcp,3=self",
    ];
    let deadline = Instant::now() + Duration::from_secs(120);
    for (rank, child) in children.into_iter().enumerate() {
        let f = finish(child, deadline, &format!("rank {rank}"));
        assert_eq!(f.code, Some(0), "rank {rank}: {}{}", f.stdout, f.stderr);
        assert!(
            f.stdout.contains(", 0 failed; ") && f.stdout.contains(want[rank]),
            "rank {rank}: {}",
            f.stdout
        );
    }
}
