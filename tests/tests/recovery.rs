//! Repairing a communicator in place, with real processes and real signals: SIGKILL one of
//! 8 ranks (rank 0 among them), two at once, a second during the shrink, SIGSTOP one (and
//! SIGCONT it later: it is told it was excluded, the survivors are undisturbed), and growing
//! back to 8 with a freshly started process. Every survivor checks each allreduce's result
//! itself (`bcl-recover`); every wait is bounded. The timings are printed, not asserted:
//! `scripts/recovery-bench.sh` measures them over many trials.

use bcl_core::UniqueId;
use bcl_tests::procs::{Finished, RankSpec, finish, one_at_a_time, signal, spawn, unix_ms};
use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const RECOVER_BIN: &str = env!("CARGO_BIN_EXE_bcl-recover");

fn start(
    world: usize,
    env: &[(&str, &str)],
    per_rank: impl Fn(usize) -> Vec<(String, String)>,
) -> Vec<Child> {
    let id = UniqueId::new("127.0.0.1".parse().expect("ip"))
        .expect("id")
        .to_string();
    (0..world)
        .map(|rank| {
            let extra = per_rank(rank);
            let mut all: Vec<(&str, &str)> = env.to_vec();
            all.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            spawn(&RankSpec {
                binary: RECOVER_BIN,
                rank,
                world,
                id: &id,
                scenario: "recover",
                env: &all,
                wrapper: &[],
            })
        })
        .collect()
}

/// The rest of each child's stdout, read on a thread of its own that ends at the child's exit.
type Outs = Vec<Option<JoinHandle<String>>>;

/// Wait until every child printed `ready`; keep reading the rest of their stdout.
fn wait_ready(children: &mut [Child]) -> Outs {
    children
        .iter_mut()
        .enumerate()
        .map(|(r, c)| {
            let mut reader = BufReader::new(c.stdout.take().expect("stdout"));
            let mut line = String::new();
            reader.read_line(&mut line).expect("read");
            assert_eq!(line.trim(), "ready", "rank {r} did not start");
            Some(std::thread::spawn(move || {
                let mut rest = String::new();
                let _ = reader.read_to_string(&mut rest);
                rest
            }))
        })
        .collect()
}

/// `f` with the stdout its reader thread collected (the child has exited: the pipe is at end).
fn with_out(mut f: Finished, out: &mut Option<JoinHandle<String>>) -> Finished {
    f.stdout = out
        .take()
        .map(|h| h.join().expect("stdout reader"))
        .unwrap_or_default();
    f
}

/// The value of `key=` on the stdout line starting with `line`.
fn field(f: &Finished, line: &str, key: &str) -> Option<u128> {
    let l = f.stdout.lines().find(|l| l.starts_with(line))?;
    l.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
}

/// Every survivor shrank to `world`, recovered and finished; returns the worst time from the
/// injection to a survivor's first correct allreduce on the shrunk communicator.
fn assert_recovered(survivors: &[(usize, Finished)], world: u128, injected: u128) -> u128 {
    let mut new_ranks = Vec::new();
    let mut worst = 0;
    for (rank, f) in survivors {
        assert_eq!(
            f.code,
            Some(0),
            "rank {rank} did not recover: {}\n{}",
            f.stdout,
            f.stderr
        );
        assert_eq!(
            field(f, "shrunk", "world"),
            Some(world),
            "rank {rank}: {}",
            f.stdout
        );
        new_ranks.push(field(f, "shrunk", "new").expect("new rank"));
        let at = field(f, "recovered", "at").expect("recovered line");
        worst = worst.max(at.saturating_sub(injected));
        assert!(f.stdout.contains("done"), "rank {rank}: {}", f.stdout);
    }
    new_ranks.sort_unstable();
    assert_eq!(
        new_ranks,
        (0..world).collect::<Vec<_>>(),
        "survivors are renumbered densely"
    );
    worst
}

fn finish_all(
    children: Vec<Child>,
    outs: &mut Outs,
    within: Duration,
    skip: &[usize],
) -> Vec<(usize, Finished)> {
    let deadline = Instant::now() + within;
    children
        .into_iter()
        .enumerate()
        .filter_map(|(r, mut c)| {
            if skip.contains(&r) {
                let _ = c.kill();
                let _ = c.wait();
                None
            } else {
                Some((
                    r,
                    with_out(finish(c, deadline, &format!("rank {r}")), &mut outs[r]),
                ))
            }
        })
        .collect()
}

const LOOP: &[(&str, &str)] = &[("BCL_TEST_ELEMS", "16384"), ("BCL_INIT_TIMEOUT_S", "30")];

fn kill_and_shrink(victims: &[usize]) -> u128 {
    let _serial = one_at_a_time();
    let mut children = start(8, LOOP, |_| vec![]);
    let mut outs = wait_ready(&mut children);
    std::thread::sleep(Duration::from_millis(200));
    let injected = unix_ms();
    for &v in victims {
        signal(&children[v], "KILL");
    }
    let survivors = finish_all(children, &mut outs, Duration::from_secs(60), victims);
    let worst = assert_recovered(&survivors, 8 - victims.len() as u128, injected);
    eprintln!("killed {victims:?}: every survivor's first correct allreduce within {worst} ms");
    worst
}

#[test]
fn kill_one_of_8_then_the_survivors_shrink_and_the_next_allreduce_is_correct() {
    kill_and_shrink(&[5]);
}

#[test]
fn kill_rank_0_the_root_of_the_old_communicator() {
    kill_and_shrink(&[0]);
}

#[test]
fn kill_two_ranks_at_once() {
    kill_and_shrink(&[2, 6]);
}

#[test]
fn a_second_rank_dies_during_the_shrink() {
    let _serial = one_at_a_time();
    for after_ms in ["0", "3"] {
        let mut children = start(8, LOOP, |r| {
            if r == 4 {
                vec![
                    ("BCL_RECOVER_DIE_IN_SHRINK".into(), "1".into()),
                    ("BCL_RECOVER_DIE_AFTER_MS".into(), after_ms.into()),
                ]
            } else {
                vec![]
            }
        });
        let mut outs = wait_ready(&mut children);
        let injected = unix_ms();
        signal(&children[1], "KILL");
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut all: Vec<(usize, Finished)> = Vec::new();
        for (r, c) in children.into_iter().enumerate() {
            if r == 1 {
                let mut c = c;
                let _ = c.kill();
                let _ = c.wait();
                continue;
            }
            all.push((
                r,
                with_out(finish(c, deadline, &format!("rank {r}")), &mut outs[r]),
            ));
        }
        let (dying, survivors): (Vec<_>, Vec<_>) = all.into_iter().partition(|(r, _)| *r == 4);
        assert_ne!(
            dying[0].1.code,
            Some(0),
            "rank 4 should have died in its shrink"
        );
        let worst = assert_recovered(&survivors, 6, injected);
        eprintln!(
            "rank 1 killed, rank 4 died {after_ms} ms into its shrink: recovered within {worst} ms"
        );
    }
}

#[test]
fn a_stopped_rank_is_excluded_and_told_so_when_it_continues() {
    let _serial = one_at_a_time();
    let mut children = start(8, LOOP, |_| vec![]);
    let mut outs = wait_ready(&mut children);
    let injected = unix_ms();
    signal(&children[3], "STOP");
    let stopped = children.remove(3);
    outs.remove(3);
    let survivors = finish_all(children, &mut outs, Duration::from_secs(60), &[]);
    let survivors: Vec<(usize, Finished)> = survivors
        .into_iter()
        .map(|(r, f)| (if r >= 3 { r + 1 } else { r }, f))
        .collect();
    let worst = assert_recovered(&survivors, 7, injected);
    eprintln!("rank 3 stopped: the survivors' first correct allreduce within {worst} ms");
    signal(&stopped, "CONT");
    let zombie = finish(
        stopped,
        Instant::now() + Duration::from_secs(60),
        "the stopped rank",
    );
    assert_eq!(
        zombie.code,
        Some(3),
        "the stopped rank should be told it was excluded: {}",
        zombie.stderr
    );
    assert!(zombie.stderr.contains("excluded"), "{}", zombie.stderr);
}

#[test]
fn grow_back_to_8_with_a_fresh_process_after_a_kill() {
    let _serial = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("bcl-grow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let id_file = dir.join("id").to_string_lossy().to_string();
    let _ = std::fs::remove_file(&id_file);
    let env: Vec<(&str, &str)> = LOOP
        .iter()
        .copied()
        .chain([
            ("BCL_RECOVER_GROW_TO", "8"),
            ("BCL_RECOVER_ID_FILE", id_file.as_str()),
        ])
        .collect();
    let mut children = start(8, &env, |_| vec![]);
    let mut outs = wait_ready(&mut children);
    let injected = unix_ms();
    signal(&children[6], "KILL");
    let spawned_at = unix_ms();
    let newcomer = spawn(&RankSpec {
        binary: RECOVER_BIN,
        rank: 7,
        world: 8,
        id: "unused",
        scenario: "recover",
        env: &[
            ("BCL_RECOVER_MODE", "join"),
            ("BCL_RECOVER_ID_FILE", id_file.as_str()),
            ("BCL_TEST_ELEMS", "16384"),
        ],
        wrapper: &[],
    });
    let survivors = finish_all(children, &mut outs, Duration::from_secs(60), &[6]);
    assert_recovered(&survivors, 7, injected);
    let joined = finish(
        newcomer,
        Instant::now() + Duration::from_secs(30),
        "the new rank",
    );
    assert_eq!(
        joined.code,
        Some(0),
        "the new rank: {}\n{}",
        joined.stdout,
        joined.stderr
    );
    assert_eq!(field(&joined, "grown", "world"), Some(8));
    for (r, f) in &survivors {
        assert_eq!(
            field(f, "grown", "world"),
            Some(8),
            "rank {r}: {}",
            f.stdout
        );
    }
    let grown_at = field(&joined, "grown", "at").expect("grown");
    eprintln!(
        "grown back to 8: {} ms after the new process was started",
        grown_at.saturating_sub(spawned_at)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
