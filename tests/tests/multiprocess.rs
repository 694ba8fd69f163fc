//! Ranks as real processes over TCP on loopback: the suite, mixed devices, a killed rank, and
//! a rank that never arrives. Every wait is bounded; stuck processes are killed and fail the
//! test.

use bcl_core::UniqueId;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_bcl-rank");

fn spawn(
    rank: usize,
    world: usize,
    id: &UniqueId,
    scenario: &str,
    extra: &[(&str, &str)],
) -> Child {
    let mut cmd = Command::new(RANK_BIN);
    cmd.env("BCL_RANK", rank.to_string())
        .env("BCL_WORLD_SIZE", world.to_string())
        .env("BCL_UNIQUE_ID", id.to_string())
        .env("BCL_TEST_SCENARIO", scenario)
        .env("BCL_TIMEOUT_S", "20")
        .env("BCL_INIT_TIMEOUT_S", "30")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn bcl-rank")
}

struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Wait for `child` until `deadline`; kill it and fail the test if it overruns.
fn finish(mut child: Child, deadline: Instant, what: &str) -> Finished {
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut stdout = String::new();
            let mut stderr = String::new();
            if let Some(mut o) = child.stdout.take() {
                let _ = o.read_to_string(&mut stdout);
            }
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut stderr);
            }
            return Finished {
                code: status.code(),
                stdout,
                stderr,
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish in time (killed)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn new_id() -> UniqueId {
    UniqueId::new("127.0.0.1".parse().expect("ip")).expect("unique id")
}

#[test]
fn four_processes_run_the_suite() {
    let id = new_id();
    let children: Vec<Child> = (0..4).map(|r| spawn(r, 4, &id, "suite", &[])).collect();
    let deadline = Instant::now() + Duration::from_secs(240);
    for (r, c) in children.into_iter().enumerate() {
        let f = finish(c, deadline, &format!("rank {r}"));
        assert_eq!(f.code, Some(0), "rank {r}: {}{}", f.stdout, f.stderr);
        assert!(f.stdout.contains("0 failed"), "rank {r}: {}", f.stdout);
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
fn a_killed_rank_gives_every_survivor_an_error_and_a_neighbour_names_it_not_a_hang() {
    let id = new_id();
    let mut children: Vec<Child> = (0..4)
        .map(|r| spawn(r, 4, &id, "loop", &[("BCL_TEST_ITERS", "100000")]))
        .collect();
    // Wait until every rank has finished one allreduce.
    for (r, c) in children.iter_mut().enumerate() {
        let out = c.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "ready", "rank {r} did not start");
    }
    let mut victim = children.remove(2);
    victim.kill().expect("kill rank 2");
    let _ = victim.wait();
    let deadline = Instant::now() + Duration::from_secs(60);
    let survivors: Vec<Finished> = children
        .into_iter()
        .enumerate()
        .map(|(i, c)| finish(c, deadline, &format!("survivor {i}")))
        .collect();
    for (i, f) in survivors.iter().enumerate() {
        assert_eq!(
            f.code,
            Some(7),
            "survivor {i} should report a failed collective: {}",
            f.stderr
        );
        assert!(f.stderr.contains("allreduce"), "survivor {i}: {}", f.stderr);
        assert!(
            f.stderr.contains("link to rank "),
            "survivor {i} names no peer: {}",
            f.stderr
        );
    }
    // Ring 0-1-2-3: the first of rank 2's neighbours (1, 3) to fail sees rank 2's death and
    // names it. Later failures may be the cascade (a survivor that exited after its own
    // error); naming the root cause on every rank is the health layer's cross-rank verdict.
    assert!(
        [1usize, 2]
            .iter()
            .any(|&i| survivors[i].stderr.contains("link to rank 2 (host")),
        "neither neighbour named rank 2: {} / {}",
        survivors[1].stderr,
        survivors[2].stderr
    );
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
