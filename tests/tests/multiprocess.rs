//! Ranks as real processes on this host, over shared memory (the default, auto) and over TCP on
//! loopback: the suite, mixed devices, and a rank that never arrives (faults are in `faults.rs`). Every wait is bounded; stuck processes are
//! killed and fail the test.

use bcl_core::UniqueId;
use bcl_tests::procs::{self, finish};
use std::process::Child;
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_bcl-rank");

fn spawn(rank: usize, world: usize, id: &UniqueId, scenario: &str, env: &[(&str, &str)]) -> Child {
    procs::spawn(&procs::RankSpec {
        binary: RANK_BIN,
        rank,
        world,
        id: &id.to_string(),
        scenario,
        env,
        wrapper: &[],
    })
}

fn new_id() -> UniqueId {
    UniqueId::new("127.0.0.1".parse().expect("ip")).expect("unique id")
}

#[test]
fn four_processes_run_the_suite_over_shm() {
    four_processes_run_the_suite("auto");
}

#[test]
fn four_processes_run_the_suite_over_tcp() {
    four_processes_run_the_suite("tcp");
}

fn four_processes_run_the_suite(transport: &str) {
    let id = new_id();
    let env = [("BCL_TRANSPORT", transport)];
    let children: Vec<Child> = (0..4).map(|r| spawn(r, 4, &id, "suite", &env)).collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    for (r, c) in children.into_iter().enumerate() {
        let f = finish(c, deadline, &format!("rank {r}"));
        assert_eq!(f.code, Some(0), "rank {r}: {}{}", f.stdout, f.stderr);
        let link = if transport == "tcp" { "tcp" } else { "shm" };
        let links: Vec<String> = (0..4)
            .map(|p| format!("{p}={}", if p == r { "self" } else { link }))
            .collect();
        assert!(
            f.stdout.contains(", 0 failed; ")
                && f.stdout.contains(&format!("links {}", links.join(","))),
            "rank {r}: {}",
            f.stdout
        );
    }
}

#[test]
fn mixed_cpu_and_sim_processes_run_the_suite() {
    let id = new_id();
    let children: Vec<Child> = (0..3)
        .map(|r| {
            spawn(
                r,
                3,
                &id,
                "suite",
                &[(
                    "BCL_DEVICE",
                    if r == 1 {
                        "sim:copy=20:reduce=20"
                    } else {
                        "cpu"
                    },
                )],
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    for (r, c) in children.into_iter().enumerate() {
        let f = finish(c, deadline, &format!("rank {r}"));
        assert_eq!(f.code, Some(0), "rank {r}: {}{}", f.stdout, f.stderr);
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_when_init_times_out() {
    let id = new_id();
    let extra = [("BCL_INIT_TIMEOUT_S", "2")];
    let children: Vec<Child> = (0..2).map(|r| spawn(r, 3, &id, "suite", &extra)).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    for (r, c) in children.into_iter().enumerate() {
        let f = finish(c, deadline, &format!("rank {r}"));
        assert_eq!(f.code, Some(4), "rank {r}: {}", f.stderr);
        assert!(
            f.stderr.contains("missing rank(s) [2]"),
            "rank {r}: {}",
            f.stderr
        );
    }
}
