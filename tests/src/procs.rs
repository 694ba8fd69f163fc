//! Ranks as real processes (the `bcl-rank` binary) for the multi-process and fault tests:
//! spawn, wait for `ready`, finish with a deadline (a process that overruns is killed and the
//! test fails), and read the error lines `bcl-rank` prints.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How to start one rank.
#[derive(Debug)]
pub struct RankSpec<'a> {
    /// Path of the `bcl-rank` binary (`env!("CARGO_BIN_EXE_bcl-rank")` in a test).
    pub binary: &'a str,
    pub rank: usize,
    pub world: usize,
    /// The unique id's text.
    pub id: &'a str,
    pub scenario: &'a str,
    pub env: &'a [(&'a str, &'a str)],
    /// A command the rank runs under (e.g. `ip netns exec ns0`).
    pub wrapper: &'a [&'a str],
}

pub fn spawn(spec: &RankSpec<'_>) -> Child {
    let mut cmd = match spec.wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(spec.binary);
            c
        }
        None => Command::new(spec.binary),
    };
    cmd.env("BCL_RANK", spec.rank.to_string())
        .env("BCL_WORLD_SIZE", spec.world.to_string())
        .env("BCL_UNIQUE_ID", spec.id)
        .env("BCL_TEST_SCENARIO", spec.scenario)
        .env("BCL_TIMEOUT_S", "20")
        .env("BCL_INIT_TIMEOUT_S", "30")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in spec.env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn bcl-rank")
}

/// `world` ranks of a new communicator on this host (loopback), each running `scenario` with
/// `env`.
pub fn start_ranks(binary: &str, world: usize, scenario: &str, env: &[(&str, &str)]) -> Vec<Child> {
    let id = bcl_core::UniqueId::new(std::net::Ipv4Addr::LOCALHOST.into())
        .expect("unique id")
        .to_string();
    (0..world)
        .map(|rank| {
            spawn(&RankSpec {
                binary,
                rank,
                world,
                id: &id,
                scenario,
                env,
                wrapper: &[],
            })
        })
        .collect()
}

/// What a finished rank left behind.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The error line `bcl-rank` printed (`rank R error after E ms at T ms: ...`).
    pub fn error_line(&self) -> Option<&str> {
        self.stderr.lines().find(|l| l.contains(" error after "))
    }

    /// (E, T) of the error line: ms since the failed call began, Unix time in ms.
    pub fn error_times(&self) -> Option<(u128, u128)> {
        let line = self.error_line()?;
        let after = line.split(" error after ").nth(1)?;
        let elapsed = after.split(" ms").next()?.parse().ok()?;
        let at = after
            .split(" at ")
            .nth(1)?
            .split(" ms")
            .next()?
            .parse()
            .ok()?;
        Some((elapsed, at))
    }
}

/// Wait for `child` until `deadline`; kill it and fail the test if it overruns.
pub fn finish(child: Child, deadline: Instant, what: &str) -> Finished {
    let (finished, overran) = finish_or_kill(child, deadline);
    assert!(!overran, "{what} did not finish in time (killed)");
    finished
}

/// Wait for `child` until `deadline`, killing it if it overruns: what it left, and whether
/// it had to be killed.
pub fn finish_or_kill(mut child: Child, deadline: Instant) -> (Finished, bool) {
    let mut overran = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() > deadline => {
                overran = true;
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let finished = Finished {
        code: status.and_then(|s| s.code()),
        stdout,
        stderr,
    };
    (finished, overran)
}

/// Wait until every child has printed `ready` (its stdout is consumed up to that line).
pub fn wait_ready(children: &mut [Child]) {
    for (r, c) in children.iter_mut().enumerate() {
        let out = c.stdout.take().expect("stdout");
        let mut reader = BufReader::new(out);
        let mut line = String::new();
        reader.read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "ready", "rank {r} did not start");
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
        });
    }
}

/// The variable `name` parsed, or `default` where it is unset or does not parse (for the
/// rank binaries' test knobs).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Unix time in ms (comparable with the `at` of [`Finished::error_times`]).
pub fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Tests that measure latencies or rates take this first, so that they run one at a time
/// instead of competing for the CPUs (CI has two).
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Send `signal` (e.g. "STOP", "CONT", "KILL") to `child`.
pub fn signal(child: &Child, signal: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{signal} {} failed", child.id());
}
