//! One rank of the recovery tests and of `scripts/recovery-bench.sh`, as a real process.
//! `BCL_RECOVER_MODE`:
//! * `survive` (default): join through the launcher variables, run checked fp32 allreduces of
//!   `BCL_TEST_ELEMS` until one fails (a peer was killed or stopped), then shrink with
//!   `Exclude::Failed`, run a checked allreduce on the survivors, and (with
//!   `BCL_RECOVER_GROW_TO=N`) grow back to N: the new rank 0 writes the id to
//!   `BCL_RECOVER_ID_FILE` for the process the test starts; then `BCL_RECOVER_AFTER` more
//!   checked allreduces and exit 0. `BCL_RECOVER_DIE_IN_SHRINK=1`: abort the process
//!   `BCL_RECOVER_DIE_AFTER_MS` into the shrink (a second death during the agreement).
//! * `join`: a new process: wait for the id file, join the grown communicator as `BCL_RANK`
//!   of `BCL_WORLD_SIZE`, and run the same checked allreduces.
//! * `idle`: join, one checked allreduce, `ready`, then wait (bounded) for the file
//!   `BCL_RECOVER_GO_FILE`, sleep `BCL_RECOVER_DELAY_MS`, and do `BCL_RECOVER_ACTION`:
//!   `destroy` (drop the communicator: `destroyed ms=X`) or `shrink` (`Exclude::Failed`,
//!   `ShrinkMode::Abort`, a checked allreduce on the result: `shrunk ...`, then destroy both).
//!   For the tests that destroy or shrink while a peer is dead, stopped or shrinking.
//! * `split`: 16 ranks as a 4 × 4 grid, `BCL_RECOVER_TRIALS` times: the row and column
//!   communicators made by `split`, and the same made from scratch (a fresh id per row and
//!   column, sent over the parent, and `Communicator::init`), in alternating order; each
//!   timed to its first checked allreduces, the slowest rank's time. Rank 0 prints
//!   `split trial=i split_ms=X scratch_ms=Y` (`scripts/recovery-bench.sh`).
//!
//! stdout lines: `ready`; `shrunk old=R new=r world=w ms=X`; `recovered at=T` (Unix ms of the
//! first correct allreduce after the shrink); `grown at=T world=N`; `done`.
//! Exit 0: done; 3: excluded by the others (the error on stderr); 4: init failed; 7: an
//! operation failed for good.

use bcl_core::{
    CommBuilder, CommConfig, Communicator, Error, Exclude, ReduceOp, ShrinkMode, UniqueId,
};
use bcl_tests::procs::{env_or as var, unix_ms};
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn say(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// One allreduce whose result is checked: every rank contributes `round + 1`.
fn checked_allreduce(comm: &Communicator, buf: &mut [f32], round: usize) -> bcl_core::Result<()> {
    buf.fill(round as f32 + 1.0);
    comm.all_reduce_in_place(buf, ReduceOp::Sum)?;
    let want = (round as f32 + 1.0) * comm.world_size() as f32;
    if let Some(bad) = buf.iter().position(|&v| v != want) {
        return Err(Error::Internal(format!(
            "rank {} of {}: element {bad} is {} where {want} was expected",
            comm.rank(),
            comm.world_size(),
            buf[bad]
        )));
    }
    Ok(())
}

fn fail(comm_rank: usize, e: &Error) -> ExitCode {
    eprintln!("rank {comm_rank} error at {} ms: {e}", unix_ms());
    ExitCode::from(if matches!(e, Error::Excluded { .. }) {
        3
    } else {
        7
    })
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BCL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .try_init();
    let mut buf = vec![0f32; var("BCL_TEST_ELEMS", 16 << 10)];
    let mode = var("BCL_RECOVER_MODE", String::from("survive"));
    if mode == "idle" {
        return idle(&mut buf);
    }
    if mode == "split" {
        return match split_grid(&mut buf) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(var("BCL_RANK", 0), &e),
        };
    }
    let comm = if mode == "join" {
        match join() {
            Ok(c) => c,
            Err(e) => return fail(var("BCL_RANK", 0), &e),
        }
    } else {
        let comm = match Communicator::init_from_env() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("init failed: {e}");
                return ExitCode::from(4);
            }
        };
        match survive(comm, &mut buf) {
            Ok(c) => c,
            Err(code) => return code,
        }
    };
    for round in 0..var("BCL_RECOVER_AFTER", 20) {
        if let Err(e) = checked_allreduce(&comm, &mut buf, round) {
            return fail(comm.rank(), &e);
        }
    }
    // No barrier before leaving: a rank that destroys its communicator right after the
    // last allreduce must not be taken for dead by a peer still finishing it.
    say("done");
    ExitCode::SUCCESS
}

/// The 4 × 4 grid's rows and columns by `split`.
fn grid_by_split(comm: &Communicator) -> bcl_core::Result<(Communicator, Communicator)> {
    let r = comm.rank();
    let missing = || Error::Internal("split gave no communicator to a colored rank".into());
    let row = comm
        .split(Some((r / 4) as u32), r as i32)?
        .ok_or_else(missing)?;
    let col = comm
        .split(Some((r % 4) as u32), r as i32)?
        .ok_or_else(missing)?;
    Ok((row, col))
}

/// The same grid from scratch: the first rank of each row and column makes an id (its store
/// will be served there), the ids go round over the parent, and each rank joins its row,
/// then its column, through those stores.
fn grid_from_scratch(comm: &Communicator) -> bcl_core::Result<(Communicator, Communicator)> {
    const ID: usize = 128;
    let r = comm.rank();
    let ip = "127.0.0.1"
        .parse()
        .map_err(|e| Error::Internal(format!("{e}")))?;
    let mut mine = [0u8; 2 * ID];
    for (slot, first) in [(0, r.is_multiple_of(4)), (1, r / 4 == 0)] {
        if first {
            let text = UniqueId::new(ip)?.to_string();
            mine[slot * ID..slot * ID + text.len()].copy_from_slice(text.as_bytes());
        }
    }
    let mut all = vec![0u8; 2 * ID * comm.world_size()];
    comm.all_gather(&mine, &mut all)?;
    let id_of = |rank: usize, slot: usize| -> bcl_core::Result<UniqueId> {
        let bytes = &all[rank * 2 * ID + slot * ID..rank * 2 * ID + (slot + 1) * ID];
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(ID);
        String::from_utf8_lossy(&bytes[..end]).parse()
    };
    let row = Communicator::init(r % 4, 4, &id_of(r - r % 4, 0)?, comm.config().clone())?;
    let col = Communicator::init(r / 4, 4, &id_of(r % 4, 1)?, comm.config().clone())?;
    Ok((row, col))
}

/// Time `make` on every rank to its first checked allreduce on both communicators (ms, the
/// slowest rank's).
fn timed_grid(
    comm: &Communicator,
    buf: &mut [f32],
    make: fn(&Communicator) -> bcl_core::Result<(Communicator, Communicator)>,
) -> bcl_core::Result<f64> {
    comm.barrier()?;
    let t0 = Instant::now();
    let (row, col) = make(comm)?;
    checked_allreduce(&row, buf, 0)?;
    checked_allreduce(&col, buf, 0)?;
    let mut ms = [t0.elapsed().as_secs_f64() * 1e3];
    comm.all_reduce_in_place(&mut ms, ReduceOp::Max)?;
    Ok(ms[0])
}

/// The `split` mode (see the module comment).
fn split_grid(buf: &mut [f32]) -> bcl_core::Result<()> {
    let comm = Communicator::init_from_env()?;
    if comm.world_size() != 16 {
        return Err(Error::InvalidArgument(format!(
            "the split mode needs 16 ranks, not {}",
            comm.world_size()
        )));
    }
    checked_allreduce(&comm, buf, 0)?;
    for trial in 0..var("BCL_RECOVER_TRIALS", 5usize) {
        let (split_ms, scratch_ms) = if trial.is_multiple_of(2) {
            let s = timed_grid(&comm, buf, grid_by_split)?;
            (s, timed_grid(&comm, buf, grid_from_scratch)?)
        } else {
            let f = timed_grid(&comm, buf, grid_from_scratch)?;
            (timed_grid(&comm, buf, grid_by_split)?, f)
        };
        if comm.rank() == 0 {
            say(&format!(
                "split trial={trial} split_ms={split_ms:.1} scratch_ms={scratch_ms:.1}"
            ));
        }
    }
    say("done");
    Ok(())
}

/// The kinds of link this rank has to its peers, e.g. `shm` or `tcp,shm`.
fn links(comm: &Communicator) -> String {
    let mut kinds: Vec<&str> = (0..comm.world_size())
        .filter_map(|p| comm.link(p).map(|l| l.name()))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds.join(",")
}

/// Wait for the go file, then destroy or shrink (see the module comment).
fn idle(buf: &mut [f32]) -> ExitCode {
    let comm = match Communicator::init_from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("init failed: {e}");
            return ExitCode::from(4);
        }
    };
    let rank = comm.rank();
    if let Err(e) = checked_allreduce(&comm, buf, 0) {
        return fail(rank, &e);
    }
    say("ready");
    let go = var("BCL_RECOVER_GO_FILE", String::new());
    let start = Instant::now();
    while !std::path::Path::new(&go).exists() {
        if start.elapsed() > Duration::from_secs(60) {
            eprintln!("rank {rank}: no go file {go} after 60 s");
            return ExitCode::from(7);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(var("BCL_RECOVER_DELAY_MS", 0)));
    let t0 = Instant::now();
    if var("BCL_RECOVER_ACTION", String::from("destroy")) == "shrink" {
        let shrunk = match comm.shrink(Exclude::Failed, ShrinkMode::Abort) {
            Ok(s) => s,
            Err(e) => return fail(rank, &e),
        };
        if let Err(e) = checked_allreduce(&shrunk, buf, 0) {
            return fail(rank, &e);
        }
        say(&format!(
            "shrunk old={rank} new={} world={} ms={}",
            shrunk.rank(),
            shrunk.world_size(),
            t0.elapsed().as_millis()
        ));
        drop(shrunk);
    }
    let t1 = Instant::now();
    drop(comm);
    say(&format!("destroyed ms={}", t1.elapsed().as_millis()));
    ExitCode::SUCCESS
}

/// A new process joining the grown communicator.
fn join() -> bcl_core::Result<Communicator> {
    let path = var("BCL_RECOVER_ID_FILE", String::new());
    let start = Instant::now();
    let id: UniqueId = loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            break text.parse()?;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(Error::InvalidArgument(format!(
                "no id in {path} after 60 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let config = CommConfig::default().with_env(&|k| std::env::var(k).ok())?;
    let comm =
        CommBuilder::new(config).join_grown(var("BCL_RANK", 0), var("BCL_WORLD_SIZE", 0), &id)?;
    let mut buf = vec![0f32; var("BCL_TEST_ELEMS", 16 << 10)];
    checked_allreduce(&comm, &mut buf, 0)?;
    say(&format!(
        "grown at={} world={}",
        unix_ms(),
        comm.world_size()
    ));
    Ok(comm)
}

/// This process's open file descriptors, threads and resident memory, for the leak check of
/// repeated kill → shrink → grow cycles. A live communicator has short-lived helpers (a
/// health report dialled to rank 0, its accept on rank 0): the smallest of a few samples is
/// the steady state, and a leak raises every sample.
fn counts() -> String {
    let entries = |dir: &str| std::fs::read_dir(dir).map_or(0, Iterator::count);
    let (mut fds, mut threads) = (usize::MAX, usize::MAX);
    for _ in 0..10 {
        fds = fds.min(entries("/proc/self/fd"));
        threads = threads.min(entries("/proc/self/task"));
        std::thread::sleep(Duration::from_millis(2));
    }
    let rss_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    format!("fds={fds} threads={threads} rss_kb={rss_kb}")
}

/// Allreduce until a fault, shrink, check, and grow back if asked; with
/// `BCL_RECOVER_CYCLES=N`, N such cycles (the grow of cycle k reads its id from
/// `BCL_RECOVER_ID_FILE.k`), printing `counts at=k ...` after each grow (`at=start` after
/// the first allreduce).
fn survive(comm: Communicator, buf: &mut [f32]) -> Result<Communicator, ExitCode> {
    let cycles: usize = var("BCL_RECOVER_CYCLES", 1).max(1);
    let grow_to: usize = var("BCL_RECOVER_GROW_TO", 0);
    let id_path = var("BCL_RECOVER_ID_FILE", String::new());
    let mut comm = comm;
    for cycle in 0..cycles {
        let old = comm.rank();
        let mut round = 0;
        let first_error = loop {
            match checked_allreduce(&comm, buf, round) {
                Ok(()) if round == 0 && cycle == 0 => {
                    say("ready");
                    std::thread::sleep(Duration::from_millis(20));
                    say(&format!("counts at=start {}", counts()));
                }
                Ok(()) => {}
                Err(e) => break e,
            }
            round += 1;
        };
        eprintln!("rank {old} caught at {} ms: {first_error}", unix_ms());
        if cycle == 0 && var("BCL_RECOVER_DIE_IN_SHRINK", 0) == 1 {
            let after = Duration::from_millis(var("BCL_RECOVER_DIE_AFTER_MS", 0));
            std::thread::spawn(move || {
                std::thread::sleep(after);
                std::process::abort();
            });
        }
        let t0 = Instant::now();
        let shrunk = comm
            .shrink(Exclude::Failed, ShrinkMode::Abort)
            .map_err(|e| fail(old, &e))?;
        say(&format!(
            "shrunk old={old} new={} world={} ms={} links={} device={}",
            shrunk.rank(),
            shrunk.world_size(),
            t0.elapsed().as_millis(),
            links(&shrunk),
            shrunk.accelerator().info().vendor
        ));
        checked_allreduce(&shrunk, buf, 0).map_err(|e| fail(old, &e))?;
        say(&format!("recovered at={}", unix_ms()));
        // The old communicator goes now, as an application would destroy it.
        drop(comm);
        if grow_to == 0 {
            return Ok(shrunk);
        }
        let path = if cycles > 1 {
            format!("{id_path}.{cycle}")
        } else {
            id_path.clone()
        };
        let id = if shrunk.rank() == 0 {
            let id = shrunk.grow_unique_id().map_err(|e| fail(old, &e))?;
            let tmp = format!("{path}.tmp");
            std::fs::write(&tmp, id.to_string())
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| fail(old, &Error::InvalidArgument(format!("writing {path}: {e}"))))?;
            Some(id)
        } else {
            None
        };
        let grown = shrunk
            .grow(grow_to, id.as_ref())
            .map_err(|e| fail(old, &e))?;
        drop(shrunk);
        checked_allreduce(&grown, buf, 0).map_err(|e| fail(old, &e))?;
        say(&format!(
            "grown at={} world={}",
            unix_ms(),
            grown.world_size()
        ));
        if cycles > 1 {
            // The peers close their init-time store connections as their init returns; give
            // the root's side of them a moment, so the counts are of the steady state.
            std::thread::sleep(Duration::from_millis(20));
            say(&format!("counts at={} {}", cycle + 1, counts()));
        }
        comm = grown;
    }
    Ok(comm)
}
