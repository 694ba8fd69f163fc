//! A link that goes down between two live ranks, for real: three ranks, each in its own
//! network namespace (so each is a separate "host"), joined pairwise by veth pairs. Taking one
//! veth down cuts ranks 0 and 1 apart while both still reach rank 2; every rank must report a
//! link failure between 0 and 1 (not a dead or hung rank) within 3 s.
//!
//! Needs root (CI runs as root) and iproute2; it fails loudly without them, never skips.

use bcl_core::UniqueId;
use bcl_tests::procs::{RankSpec, finish, spawn, unix_ms, wait_ready};
use std::process::Command;
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_bcl-rank");

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("cannot run `ip` (install iproute2; this test needs root): {e}")
    });
    assert!(
        out.status.success(),
        "ip {} failed (this test needs root): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Three namespaces in a full mesh of veth pairs; removed on drop.
struct Mesh {
    namespaces: Vec<String>,
}

impl Mesh {
    fn address(i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    fn veth(&self, from: usize, to: usize) -> String {
        format!("b{}_{from}{to}", std::process::id())
    }

    fn new() -> Mesh {
        let pid = std::process::id();
        let mesh = Mesh {
            namespaces: (0..3).map(|i| format!("bcl{pid}n{i}")).collect(),
        };
        for (i, ns) in mesh.namespaces.iter().enumerate() {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/32", Mesh::address(i)),
                "dev",
                "lo",
            ]);
        }
        for (i, j) in [(0, 1), (0, 2), (1, 2)] {
            let (a, b) = (mesh.veth(i, j), mesh.veth(j, i));
            let (na, nb) = (&mesh.namespaces[i], &mesh.namespaces[j]);
            ip(&[
                "link", "add", &a, "netns", na, "type", "veth", "peer", "name", &b, "netns", nb,
            ]);
            for (ns, dev, me, peer) in [(na, &a, i, j), (nb, &b, j, i)] {
                ip(&["-n", ns, "link", "set", dev, "up"]);
                ip(&[
                    "-n",
                    ns,
                    "route",
                    "add",
                    &format!("{}/32", Mesh::address(peer)),
                    "dev",
                    dev,
                    "src",
                    &Mesh::address(me),
                ]);
            }
        }
        mesh
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

#[test]
fn a_veth_taken_down_is_reported_as_a_link_failure_between_those_two_ranks() {
    let mesh = Mesh::new();
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
