//! Fault detection with real processes and real signals, default health settings: a killed
//! rank (over shared memory and over TCP), a stopped rank, a short pause, a rank late in user
//! code, desynchronised calls, a rank killed during rendezvous, and one killed while setting up
//! its shared-memory rings. Each test asserts the verdict (which rank, which cause) and
//! its latency, measured from the injection; every wait is bounded.

use bcl_core::UniqueId;
use bcl_tests::procs::{
    Finished, RankSpec, finish, one_at_a_time, signal, spawn, start_ranks, unix_ms, wait_ready,
};
use std::process::Child;
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_bcl-rank");

fn new_id() -> String {
    UniqueId::new("127.0.0.1".parse().expect("ip"))
        .expect("unique id")
        .to_string()
}

fn start(world: usize, scenario: &str, env: &[(&str, &str)]) -> Vec<Child> {
    start_ranks(RANK_BIN, world, scenario, env)
}

fn finish_all(children: Vec<Child>, within: Duration) -> Vec<Finished> {
    let deadline = Instant::now() + within;
    children
        .into_iter()
        .enumerate()
        .map(|(r, c)| finish(c, deadline, &format!("rank {r}")))
        .collect()
}

/// Every survivor failed with an error containing each of `needles`, at most `bound_ms` after
/// `injected_ms`.
fn assert_verdict(
    survivors: &[(usize, Finished)],
    needles: &[&str],
    injected_ms: u128,
    bound_ms: u128,
) {
    for (rank, f) in survivors {
        assert_eq!(
            f.code,
            Some(7),
            "rank {rank} should fail a collective: {}",
            f.stderr
        );
        let line = f.error_line().unwrap_or_default();
        eprintln!("{line}");
        for needle in needles {
            assert!(
                line.contains(needle),
                "rank {rank}: '{needle}' missing from: {line}"
            );
        }
        let (_, at) = f.error_times().expect("error times");
        assert!(
            at <= injected_ms + bound_ms,
            "rank {rank} reported {} ms after the fault (bound {bound_ms} ms): {line}",
            at.saturating_sub(injected_ms)
        );
    }
}

/// Names in `/dev/shm` of rings created by any of `pids`.
fn shm_names_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| pids.iter().any(|p| n.starts_with(&format!("bcl.{p}."))))
        .collect()
}

#[test]
fn a_killed_rank_is_named_dead_by_every_survivor_within_a_second_and_dumped_over_shm() {
    killed_rank("auto");
}

#[test]
fn a_killed_rank_is_named_dead_by_every_survivor_within_a_second_and_dumped_over_tcp() {
    killed_rank("tcp");
}

/// Four ranks on this host, `transport` between them (auto: shared memory), rank 2 killed
/// mid-allreduce.
fn killed_rank(transport: &str) {
    let _serial = one_at_a_time();
    let dump = std::env::temp_dir().join(format!("bcl-dump-{}-{transport}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dump);
    let dump_dir = dump.to_str().expect("path").to_string();
    let loop_env = [
        ("BCL_TEST_ITERS", "1000000"),
        ("BCL_TEST_ELEMS", "1048576"),
        ("BCL_DUMP_DIR", dump_dir.as_str()),
        ("BCL_TRANSPORT", transport),
    ];
    let mut children = start(4, "loop", &loop_env);
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    wait_ready(&mut children);
    let mut victim = children.remove(2);
    let killed_at = unix_ms();
    signal(&victim, "KILL");
    let _ = victim.wait();
    let finished = finish_all(children, Duration::from_secs(30));
    let survivors: Vec<(usize, Finished)> = [0, 1, 3].into_iter().zip(finished).collect();
    assert_verdict(
        &survivors,
        &[
            "rank 2 (host",
            ") died",
            "allreduce #",
            "ranks 0,1,3 aborted",
        ],
        killed_at,
        1000,
    );
    // Each survivor dumped its flight recorder: the verdict, the failed operation last, the
    // completed ones before it with the bytes they moved per peer.
    for rank in [0, 1, 3] {
        let prefix = format!("bcl-flight-rank{rank}-");
        let file = std::fs::read_dir(&dump)
            .expect("dump dir")
            .filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .unwrap_or_else(|| panic!("rank {rank} wrote no flight recorder"));
        let text = std::fs::read_to_string(file.path()).expect("read dump");
        let report: serde_json::Value = serde_json::from_str(&text).expect("dump is JSON");
        let verdict = report["verdict"].as_str().unwrap_or_default();
        assert!(
            verdict.contains("rank 2 (host") && verdict.contains(") died"),
            "rank {rank}: {verdict}"
        );
        let ops = report["flight_recorder"].as_array().expect("ops");
        let last = ops.last().expect("at least one op");
        // Dumped when the verdict arrived: the operation it interrupted is still running.
        assert!(
            last["state"] == "running" || last["state"] == "failed",
            "rank {rank}: {last}"
        );
        let op = last["op"].as_str().unwrap_or_default();
        assert!(op.starts_with("allreduce #"), "rank {rank}: {last}");
        let first = &ops[0];
        assert_eq!(first["state"], "done", "rank {rank}: {first}");
        let sent: u64 = first["peers"]
            .as_array()
            .expect("peers")
            .iter()
            .map(|p| p["sent"].as_u64().unwrap_or(0))
            .sum();
        // A ring allreduce of 4 MiB over 4 ranks sends 2 x 3/4 x 4 MiB from each rank.
        assert_eq!(sent, 2 * 3 * (4 << 20) / 4, "rank {rank}: {first}");
    }
    let _ = std::fs::remove_dir_all(&dump);
    // Rings are unlinked once connected: neither the victim nor the survivors leave any.
    assert_eq!(shm_names_of(&pids), Vec::<String>::new());
}

/// A process killed while setting up its rings (its peer never came) leaves their names; the
/// next communicator on the host removes them.
#[test]
fn rings_of_a_rank_killed_during_setup_are_reclaimed_by_the_next_init() {
    let _serial = one_at_a_time();
    let mut orphan = spawn(&RankSpec {
        binary: RANK_BIN,
        rank: 0,
        world: 2,
        id: &new_id(),
        scenario: "shm-orphan",
        env: &[],
        wrapper: &[],
    });
    let pid = orphan.id();
    wait_ready(std::slice::from_mut(&mut orphan));
    signal(&orphan, "KILL");
    let _ = orphan.wait();
    assert_eq!(shm_names_of(&[pid]).len(), 1, "the orphan's ring name");
    let config = bcl_core::CommConfig {
        transport: bcl_core::TransportKind::Shm,
        ..bcl_core::CommConfig::default()
    };
    let comms = bcl_core::Communicator::init_threads(2, config).expect("init over shm");
    assert_eq!(
        shm_names_of(&[pid]),
        Vec::<String>::new(),
        "stale ring left"
    );
    assert_eq!(comms[0].link(1), Some(bcl_core::LinkKind::Shm));
}

#[test]
fn a_stopped_rank_is_named_unresponsive_within_three_seconds() {
    let _serial = one_at_a_time();
    let loop_env = [("BCL_TEST_ITERS", "1000000"), ("BCL_TEST_ELEMS", "1048576")];
    let mut children = start(4, "loop", &loop_env);
    wait_ready(&mut children);
    let mut victim = children.remove(2);
    let stopped_at = unix_ms();
    signal(&victim, "STOP");
    let finished = finish_all(children, Duration::from_secs(30));
    signal(&victim, "KILL");
    let _ = victim.wait();
    let survivors: Vec<(usize, Finished)> = [0, 1, 3].into_iter().zip(finished).collect();
    assert_verdict(
        &survivors,
        &["rank 2 (host", "is unresponsive", "stopped or hung"],
        stopped_at,
        3000,
    );
}

#[test]
fn a_pause_shorter_than_the_hang_timeout_raises_nothing() {
    let _serial = one_at_a_time();
    let loop_env = [("BCL_TEST_ITERS", "300"), ("BCL_TEST_ELEMS", "65536")];
    let mut children = start(4, "loop", &loop_env);
    wait_ready(&mut children);
    signal(&children[2], "STOP");
    std::thread::sleep(Duration::from_millis(1000));
    signal(&children[2], "CONT");
    for (rank, f) in finish_all(children, Duration::from_secs(60))
        .iter()
        .enumerate()
    {
        assert_eq!(
            f.code,
            Some(0),
            "rank {rank} failed after a 1 s pause: {}",
            f.stderr
        );
        assert!(
            !f.stderr.contains("WARN") && !f.stderr.contains("ERROR"),
            "rank {rank} raised: {}",
            f.stderr
        );
    }
}

#[test]
fn a_rank_late_in_user_code_is_reported_alive_and_not_yet_called() {
    let _serial = one_at_a_time();
    let env = [("BCL_TEST_SLEEPER", "1"), ("BCL_TEST_SLEEP_MS", "3500")];
    let children = start(4, "sleepy", &env);
    let finished = finish_all(children, Duration::from_secs(60));
    for (rank, f) in finished.iter().enumerate() {
        assert_eq!(
            f.code,
            Some(0),
            "a late rank is not a fault (rank {rank}): {}",
            f.stderr
        );
    }
    // Each rank that exchanges data with rank 1 in allreduce #2 waits on it and says why.
    let reported: Vec<usize> = finished
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            f.stderr.contains("rank 1 (host")
                && f.stderr.contains(
                    "is alive and has not called allreduce #2; its last completed collective is #1",
                )
        })
        .map(|(r, _)| r)
        .collect();
    assert!(!reported.is_empty(), "nobody reported rank 1: {finished:?}");
    assert!(
        !reported.contains(&1),
        "rank 1 reported itself: {finished:?}"
    );
}

#[test]
fn desynchronised_calls_fail_every_rank_within_a_second_naming_both_sides() {
    let _serial = one_at_a_time();
    let variants: [(&str, [&str; 2]); 5] = [
        ("op", ["float max", "float sum"]),
        ("count", ["999 x float", "1000 x float"]),
        ("dtype", ["1000 x double", "1000 x float"]),
        ("root", ["root 1", "root 0"]),
        ("extra", ["barrier #2", "allreduce #2"]),
    ];
    for (variant, sides) in variants {
        let env = [("BCL_TEST_DESYNC", variant)];
        let finished = finish_all(start(4, "desync", &env), Duration::from_secs(30));
        for (rank, f) in finished.iter().enumerate() {
            assert_eq!(
                f.code,
                Some(7),
                "{variant}: rank {rank} should fail: {}",
                f.stderr
            );
            let line = f.error_line().unwrap_or_default();
            assert!(
                line.contains("desync between"),
                "{variant}: rank {rank}: {line}"
            );
            for side in sides {
                assert!(
                    line.contains(side),
                    "{variant}: rank {rank}: '{side}' missing: {line}"
                );
            }
            let (elapsed, _) = f.error_times().expect("times");
            assert!(
                elapsed < 1000,
                "{variant}: rank {rank} took {elapsed} ms: {line}"
            );
        }
    }
}

#[test]
fn a_rank_killed_during_rendezvous_hangs_no_one() {
    let _serial = one_at_a_time();
    let env = [("BCL_INIT_TIMEOUT_S", "3")];
    let mut children = start(4, "suite", &env);
    let mut victim = children.remove(3);
    signal(&victim, "KILL");
    let _ = victim.wait();
    let started = Instant::now();
    let finished = finish_all(children, Duration::from_secs(20));
    for (rank, f) in finished.iter().enumerate() {
        assert_eq!(
            f.code,
            Some(4),
            "rank {rank} should fail init: {}",
            f.stderr
        );
        assert!(
            f.stderr.contains("[3]") || f.stderr.contains("rank 3"),
            "rank {rank} does not name rank 3: {}",
            f.stderr
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "init failures took {:?}",
        started.elapsed()
    );
}
