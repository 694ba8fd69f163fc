//! One rank as a real process, for the multi-process and fault tests. Reads the launcher
//! variables (`BCL_RANK`, `BCL_WORLD_SIZE`, `BCL_UNIQUE_ID`, `BCL_*` settings) and runs the
//! scenario named by `BCL_TEST_SCENARIO`:
//! * `suite`: the conformance cases up to 1000 elements, then a line naming each link's
//!   transport (`links 0=self,1=shm,2=tcp`); exit 0 when all pass, 1 otherwise;
//! * `loop`: fp32 allreduces of `BCL_TEST_ELEMS` (default 4 Mi) until `BCL_TEST_ITERS` are
//!   done, printing `ready` after the first;
//! * `sleepy`: three allreduces; rank `BCL_TEST_SLEEPER` sleeps `BCL_TEST_SLEEP_MS` in "user
//!   code" before the second;
//! * `desync`: one good allreduce, then rank 1 calls something else than the others, as
//!   `BCL_TEST_DESYNC` says: `op`, `count`, `dtype`, `root`, `extra` (an extra barrier first),
//!   then a barrier.
//!
//! * `watch`: fp32 allreduces of `BCL_TEST_ELEMS` for `BCL_TEST_SECONDS`, rank
//!   `BCL_TEST_LATE_RANK` sleeping `BCL_TEST_LATE_MS` before each; every `BCL_TEST_REPORT_MS`
//!   rank 0 prints `health <json>` (the slow-node summary and the ring) on stdout. All ranks
//!   stop after the same number of collectives (rank 0 decides, by broadcast).
//!
//! * `soak`: for `BCL_TEST_SECONDS` (rank 0 decides, by broadcast, so all stop together), a
//!   loop of collectives whose every result is checked against its closed form: an allreduce
//!   of 1, 1000 or 65536 f64 (cycling), an allgather, a broadcast. Prints `ready` after the
//!   first round and `done N` at the end; a wrong result prints `rank R WRONG ...` on stderr
//!   and exits 9. Last, on every path, the communicator destroyed: `left fds=F threads=T
//!   listening=P`, what the process holds beyond what it held before init.
//!
//! * `scale`: many ranks on one machine. Prints `scale init_ms=I rss_kib=R` on stderr (the
//!   time `init_from_env` took, and the resident memory after it), then a barrier and a
//!   1 MiB fp32 allreduce checked element by element (exit 9 on a wrong value), `ready`, and
//!   1 MiB allreduces until `BCL_TEST_SECONDS` (default 120) pass or one fails; after a
//!   failure the communicator is kept `BCL_TEST_LINGER_MS` (default 0) before the exit.
//!
//! * `shm-orphan`: no communicator: a shm endpoint sets up its ring for a peer that never comes,
//!   prints `ready` once the ring exists, and waits (to be killed).
//!
//! Exit 0: done; 4: init failed; 7: a collective failed. Errors go to stderr as
//! `rank R error after E ms at T ms: ...` (E: since the failed call began; T: Unix time).
//! Log output (warnings included) goes to stderr too (`BCL_LOG` filters it).

use bcl_core::{Collective, Communicator, DataType, ReduceOp};
use bcl_tests::procs::{env_or as var, unix_ms};
use bcl_tests::resources::Held;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Run `call`; on error print it with its timing and return exit code 7.
fn checked(rank: usize, call: impl FnOnce() -> bcl_core::Result<()>) -> Result<(), ExitCode> {
    let start = Instant::now();
    call().map_err(|e| {
        eprintln!(
            "rank {rank} error after {} ms at {} ms: {e}",
            start.elapsed().as_millis(),
            unix_ms()
        );
        ExitCode::from(7)
    })
}

fn ready() {
    println!("ready");
    let _ = std::io::stdout().flush();
}

fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BCL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let scenario = std::env::var("BCL_TEST_SCENARIO").unwrap_or_default();
    if scenario == "shm-orphan" {
        return shm_orphan();
    }
    let baseline = Held::mine();
    let init_started = Instant::now();
    let comm = match Communicator::init_from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("init failed: {e}");
            return ExitCode::from(4);
        }
    };
    let outcome = match scenario.as_str() {
        "suite" => return suite(&comm),
        "loop" => run_loop(&comm),
        "sleepy" => sleepy(&comm),
        "desync" => desync(&comm),
        "watch" => watch(&comm),
        "scale" => {
            let outcome = scale(&comm, init_started.elapsed());
            if outcome.is_err() {
                std::thread::sleep(Duration::from_millis(var("BCL_TEST_LINGER_MS", 0)));
            }
            outcome
        }
        "soak" => {
            let outcome = soak(&comm);
            // What the communicator left once destroyed, on every path (fault or not).
            drop(comm);
            println!(
                "{}",
                Held::left_beyond(&baseline, Duration::from_secs(2)).left_line()
            );
            outcome
        }
        other => {
            eprintln!(
                "unknown BCL_TEST_SCENARIO '{other}' (suite, loop, sleepy, desync, watch, soak, scale, shm-orphan)"
            );
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

fn shm_orphan() -> ExitCode {
    use bcl_transport::shm::{ShmConfig, ShmTransport};
    use bcl_transport::{PeerAddress, Secret, Transport};
    let mut shm = match ShmTransport::bind(ShmConfig::new(Secret::derive("orphan"))) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("shm endpoint: {e}");
            return ExitCode::from(4);
        }
    };
    let ghost = PeerAddress::new(b"1.0123456789abcdef".to_vec()).expect("a short address");
    let announce = std::thread::spawn(|| {
        let mine = format!("bcl.{}.", std::process::id());
        while !std::fs::read_dir("/dev/shm").is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&mine))
        }) {
            std::thread::sleep(Duration::from_millis(5));
        }
        ready();
    });
    let result = shm.connect(0, &[(1, ghost)], Instant::now() + Duration::from_secs(60));
    let _ = announce.join();
    eprintln!("the ghost peer never came: {result:?}");
    ExitCode::from(7)
}

fn suite(comm: &Communicator) -> ExitCode {
    let cases: Vec<_> = bcl_tests::cases(comm.world_size())
        .into_iter()
        .filter(|c| c.count <= 1000)
        .collect();
    let failures = bcl_tests::run_cases(std::slice::from_ref(comm), &cases);
    for f in &failures {
        eprintln!("{f}");
    }
    let links: Vec<String> = (0..comm.world_size())
        .map(|p| format!("{p}={}", comm.link(p).map_or("self", |l| l.name())))
        .collect();
    println!(
        "rank {} ran {} cases, {} failed; links {}; {}; NICs {}; allreduce 4 KiB by {}",
        comm.rank(),
        cases.len(),
        failures.len(),
        links.join(","),
        comm.topology(),
        comm.describe_nics(),
        comm.algorithm_for(Collective::AllReduce { op: ReduceOp::Sum }, 4096)
            .name()
    );
    ExitCode::from(u8::from(!failures.is_empty()))
}

fn run_loop(comm: &Communicator) -> Result<(), ExitCode> {
    let iters: usize = var("BCL_TEST_ITERS", 1000);
    let mut buf = vec![1.0f32; var("BCL_TEST_ELEMS", 4 << 20)];
    for i in 0..iters {
        checked(comm.rank(), || {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Max)
        })?;
        if i == 0 {
            ready();
        }
    }
    println!("done {iters}");
    Ok(())
}

fn soak(comm: &Communicator) -> Result<(), ExitCode> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let seconds: f64 = var("BCL_TEST_SECONDS", 3.0);
    let start = Instant::now();
    let wrong = |what: String| {
        eprintln!("rank {rank} WRONG {what}");
        ExitCode::from(9)
    };
    let mut round = 0u64;
    loop {
        let mut go = [u8::from(start.elapsed().as_secs_f64() < seconds)];
        checked(rank, || comm.broadcast_in_place(&mut go, 0))?;
        if go[0] == 0 {
            break;
        }
        let count = [1usize, 1000, 65536][(round % 3) as usize];
        // Element j of rank r is (r + 1) * (round + j % 7): sums are exact in f64.
        let value = |r: usize, j: usize| ((r + 1) as f64) * ((round + (j % 7) as u64) as f64);
        let mut x: Vec<f64> = (0..count).map(|j| value(rank, j)).collect();
        checked(rank, || comm.all_reduce_in_place(&mut x, ReduceOp::Sum))?;
        if let Some(j) = (0..count).find(|&j| x[j] != (0..n).map(|r| value(r, j)).sum::<f64>()) {
            return Err(wrong(format!(
                "round {round}: allreduce element {j} is {}",
                x[j]
            )));
        }
        let mine = [rank as u64, round];
        let mut all = vec![0u64; 2 * n];
        checked(rank, || comm.all_gather(&mine, &mut all))?;
        if (0..n).any(|r| all[2 * r] != r as u64 || all[2 * r + 1] != round) {
            return Err(wrong(format!("round {round}: allgather gave {all:?}")));
        }
        let root = (round as usize) % n;
        let mut b = [if rank == root { round * 31 + 7 } else { 0 }; 9];
        checked(rank, || comm.broadcast_in_place(&mut b, root))?;
        if b.iter().any(|&v| v != round * 31 + 7) {
            return Err(wrong(format!(
                "round {round}: broadcast from {root} gave {b:?}"
            )));
        }
        if round == 0 {
            ready();
        }
        round += 1;
    }
    println!("done {round}");
    Ok(())
}

fn watch(comm: &Communicator) -> Result<(), ExitCode> {
    let rank = comm.rank();
    let seconds: f64 = var("BCL_TEST_SECONDS", 10.0);
    let report = Duration::from_millis(var("BCL_TEST_REPORT_MS", 500));
    let late_rank: usize = var("BCL_TEST_LATE_RANK", usize::MAX);
    let late = Duration::from_millis(var("BCL_TEST_LATE_MS", 0));
    // Device buffers, so that each rank's device does the reductions (a slow `sim` is slow).
    let count: usize = var("BCL_TEST_ELEMS", 1 << 20);
    let buf = comm.accelerator().allocate(count * 4).map_err(|e| {
        eprintln!("rank {rank}: allocate: {e}");
        ExitCode::from(7)
    })?;
    let start = Instant::now();
    let mut last_report = Instant::now();
    let mut go = [1u8];
    while go[0] == 1 {
        if rank == late_rank {
            std::thread::sleep(late);
        }
        checked(rank, || {
            comm.submit(
                Collective::AllReduce { op: ReduceOp::Max },
                count,
                DataType::Float32,
                None,
                Some(&buf),
            )?
            .wait()
        })?;
        if rank == 0 {
            if last_report.elapsed() >= report {
                last_report = Instant::now();
                let h = comm.health_report();
                println!(
                    "health {}",
                    serde_json::json!({"slow": h["slow"], "ring": h["ring"]})
                );
                let _ = std::io::stdout().flush();
            }
            go[0] = u8::from(start.elapsed().as_secs_f64() < seconds);
        }
        checked(rank, || comm.broadcast_in_place(&mut go, 0))?;
    }
    let h = comm.health_report();
    if rank == 0 {
        println!(
            "health {}",
            serde_json::json!({"slow": h["slow"], "ring": h["ring"]})
        );
    }
    Ok(())
}

fn scale(comm: &Communicator, init: Duration) -> Result<(), ExitCode> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let rss_kib = bcl_tests::resources::resident_kib(std::process::id()).unwrap_or(0);
    eprintln!("scale init_ms={} rss_kib={rss_kib}", init.as_millis());
    checked(rank, || comm.barrier())?;
    // Element j of rank r is r + 1 + j % 7: every sum is an integer below 2^24, exact in fp32.
    let mut x: Vec<f32> = (0..(1usize << 18))
        .map(|j| (rank + 1 + j % 7) as f32)
        .collect();
    checked(rank, || comm.all_reduce_in_place(&mut x, ReduceOp::Sum))?;
    let base = (n * (n + 1) / 2) as f32;
    if let Some(j) = (0..x.len()).find(|&j| x[j] != base + (n * (j % 7)) as f32) {
        eprintln!("rank {rank} WRONG 1 MiB allreduce element {j} is {}", x[j]);
        return Err(ExitCode::from(9));
    }
    ready();
    let seconds: f64 = var("BCL_TEST_SECONDS", 120.0);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        checked(rank, || comm.all_reduce_in_place(&mut x, ReduceOp::Max))?;
    }
    println!("done");
    Ok(())
}

fn sleepy(comm: &Communicator) -> Result<(), ExitCode> {
    let sleeper: usize = var("BCL_TEST_SLEEPER", 1);
    let mut buf = vec![1i32; 1000];
    for i in 0..3 {
        if i == 1 && comm.rank() == sleeper {
            std::thread::sleep(Duration::from_millis(var("BCL_TEST_SLEEP_MS", 5000)));
        }
        checked(comm.rank(), || {
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        })?;
    }
    Ok(())
}

fn desync(comm: &Communicator) -> Result<(), ExitCode> {
    let rank = comm.rank();
    let mut buf = vec![1.0f32; 1000];
    checked(rank, || comm.all_reduce_in_place(&mut buf, ReduceOp::Sum))?;
    ready();
    let odd = rank == 1;
    let variant = std::env::var("BCL_TEST_DESYNC").unwrap_or_default();
    checked(rank, || match variant.as_str() {
        "op" => comm.all_reduce_in_place(&mut buf, if odd { ReduceOp::Max } else { ReduceOp::Sum }),
        "count" => {
            comm.all_reduce_in_place(&mut buf[..if odd { 999 } else { 1000 }], ReduceOp::Sum)
        }
        "dtype" if odd => comm.all_reduce_in_place(&mut vec![1.0f64; 1000], ReduceOp::Sum),
        "dtype" => comm.all_reduce_in_place(&mut buf, ReduceOp::Sum),
        "root" => comm.broadcast_in_place(&mut buf, usize::from(odd)),
        "extra" => {
            if odd {
                comm.barrier()?;
            }
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        }
        other => panic!("unknown BCL_TEST_DESYNC '{other}'"),
    })?;
    // A rank whose part of the call only sends (a broadcast's root) can finish it before
    // anyone has compared signatures; its next call fails with the verdict.
    checked(rank, || comm.barrier())
}
