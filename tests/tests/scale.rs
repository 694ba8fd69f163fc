//! Many ranks on one machine: 64 `bcl-rank` processes (`BCL_SCALE_RANKS` for more) on this
//! 2-core host, over shared memory and over tcp. Each must start (init within its timeout),
//! meet in a barrier, compute a 1 MiB allreduce exactly, and, once one rank is SIGKILLed,
//! every survivor must name that rank dead (and no other fault). What a crowd of ranks breaks
//! first is the control plane (rank 0's store, the slow-node reports climbing to rank 0): a
//! false verdict shows up here as a survivor naming the wrong rank or cause. The figures
//! (init time, resident memory, verdict latency) are printed for the record, not asserted.
//!
//! Each survivor keeps its communicator 3 s after its error, as a job's teardown would. Without
//! that, a known gap shows (about one shm run in two here): a survivor that has the verdict
//! and leaves at once is named dead by a rank the verdict has not reached yet, whose data
//! link to it closed first (found by this test; the fix, a departing rank's reason carried to
//! the peers that see it go, is not written yet).

use bcl_tests::procs::{Finished, finish_or_kill, one_at_a_time, signal, start_ranks, unix_ms};
use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::time::{Duration, Instant};

const RANK_BIN: &str = env!("CARGO_BIN_EXE_bcl-rank");
const VICTIM: usize = 37;

/// 64 ranks in CI; `BCL_SCALE_RANKS=128` for the long figures (docs/scale.md). A value that is
/// not a count of 38 to 1024 ranks fails the test rather than run something else.
fn world() -> usize {
    match std::env::var("BCL_SCALE_RANKS") {
        Err(_) => 64,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if (VICTIM + 1..=1024).contains(&n) => n,
            _ => panic!(
                "BCL_SCALE_RANKS={v}: give a rank count from {} to 1024",
                VICTIM + 1
            ),
        },
    }
}

#[test]
fn sixty_four_ranks_over_shared_memory() {
    sixty_four_ranks("shm");
}

#[test]
fn sixty_four_ranks_over_tcp() {
    sixty_four_ranks("tcp");
}

fn sixty_four_ranks(transport: &str) {
    let _serial = one_at_a_time();
    let world = world();
    let env = [
        ("BCL_TRANSPORT", transport),
        // 64 processes on 2 cores: bounded, with room for a slow CI machine.
        ("BCL_INIT_TIMEOUT_S", "150"),
        ("BCL_TEST_SECONDS", "150"),
        ("BCL_TEST_LINGER_MS", "3000"),
    ];
    let started = Instant::now();
    let mut children = start_ranks(RANK_BIN, world, "scale", &env);
    // Every rank prints `ready` once its barrier and checked allreduce are done; a rank that
    // fails first ends its stdout instead. Bounded: the reader threads give up at the deadline.
    let deadline = Instant::now() + Duration::from_secs(240);
    let (tx, rx) = std::sync::mpsc::channel();
    for (rank, c) in children.iter_mut().enumerate() {
        let out = c.stdout.take().expect("stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(out);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send((rank, line.trim() == "ready"));
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
        });
    }
    drop(tx);
    let (mut ready, mut not_ready) = (0, Vec::new());
    for _ in 0..world {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((_, true)) => ready += 1,
            Ok((rank, false)) => not_ready.push(rank),
            Err(_) => break,
        }
    }
    if ready < world {
        let finished = kill_all(children);
        let first = finished
            .iter()
            .enumerate()
            .find_map(|(r, f)| f.error_line().map(|l| format!("rank {r}: {l}")))
            .unwrap_or_else(|| {
                finished[0]
                    .stderr
                    .lines()
                    .take(5)
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        panic!(
            "{transport}: {} of {world} ranks did not get through init, the barrier and the \
             checked 1 MiB allreduce within 240 s (ranks {not_ready:?} ended first); first \
             error: {first}",
            world - ready
        );
    }
    let all_ready = started.elapsed();
    // Under load for a while first (1 MiB allreduces; every rank's slow-node reports reach
    // rank 0 each window): a false verdict meanwhile fails the test below.
    std::thread::sleep(Duration::from_secs(6));
    let mut victim = children.remove(VICTIM);
    let killed_at = unix_ms();
    signal(&victim, "KILL");
    let _ = victim.wait();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut survivors = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        let rank = if i >= VICTIM { i + 1 } else { i };
        let (f, overran) = finish_or_kill(c, deadline);
        assert!(
            !overran,
            "{transport}: rank {rank} did not end after rank {VICTIM} was killed"
        );
        survivors.push((rank, f));
    }
    let mut latencies = Vec::new();
    let (mut inits, mut rss) = (Vec::new(), Vec::new());
    for (rank, f) in &survivors {
        let line = f.error_line().unwrap_or_default();
        assert_eq!(
            f.code,
            Some(7),
            "{transport}: rank {rank} should fail a collective naming rank {VICTIM}: {}",
            tail(&f.stderr)
        );
        assert!(
            line.contains(&format!("rank {VICTIM} (host")) && line.contains(") died"),
            "{transport}: rank {rank} did not name rank {VICTIM} dead: {line}"
        );
        let (_, at) = f.error_times().expect("error times");
        latencies.push(at.saturating_sub(killed_at));
        if let Some((i, r)) = figures(&f.stderr) {
            inits.push(i);
            rss.push(r);
        }
    }
    assert_eq!(
        inits.len(),
        world - 1,
        "{transport}: a survivor printed no 'scale' line"
    );
    inits.sort_unstable();
    rss.sort_unstable();
    latencies.sort_unstable();
    eprintln!(
        "{transport}, {world} ranks: all ready in {:.1} s; init median {} ms, max {} ms; \
         resident memory after init median {} MiB, max {} MiB; rank {VICTIM} SIGKILLed: named \
         dead by all {} survivors, p50 {} ms, max {} ms",
        all_ready.as_secs_f64(),
        inits[inits.len() / 2],
        inits[inits.len() - 1],
        rss[rss.len() / 2] / 1024,
        rss[rss.len() - 1] / 1024,
        survivors.len(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
    );
}

/// (init ms, resident KiB) of a rank's `scale` line.
fn figures(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr.lines().find(|l| l.starts_with("scale "))?;
    let value = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
    };
    Some((value("init_ms=")?, value("rss_kib=")?))
}

fn kill_all(children: Vec<Child>) -> Vec<Finished> {
    children
        .into_iter()
        .map(|c| finish_or_kill(c, Instant::now()).0)
        .collect()
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}
