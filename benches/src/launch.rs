//! Starting the ranks: as local processes (the default), or as threads of this process.

use crate::args::Args;
use crate::sweep;
use crate::table::Measurement;
use bcl_core::health::slow::{Summary, render};
use bcl_core::launch::Launch;
use bcl_core::{Communicator, UniqueId};
use std::io::Write;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a run ended with.
#[derive(Debug)]
pub enum Outcome {
    /// Every rank finished; this many elements were wrong in total.
    Done { wrong: u64 },
    /// A rank failed; the message says which and why.
    Failed(String),
}

/// The banner nccl-tests prints before its table: the parameters and every rank's device.
fn banner(comm: &Communicator, args: &Args) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "# bcl-bench {}: nranks {} minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} validation: {} transport: {}",
        format!("{:?}", args.collective).to_lowercase(),
        comm.world_size(),
        args.min_bytes,
        args.max_bytes,
        args.step_factor,
        args.warmup,
        args.iters,
        args.check,
        args.transport,
    );
    let _ = writeln!(out, "#\n# Using devices");
    for p in comm.peers() {
        let _ = writeln!(
            out,
            "#  Rank {:2} Pid {:7} on {:>12} device {} [{}]",
            p.rank, p.pid, p.hostname, p.device, p.device.model
        );
    }
    let _ = writeln!(out, "#  Ring order: {:?}", comm.ring());
    let _ = writeln!(out, "#  Topology: {}", comm.topology());
    let _ = writeln!(out, "#  NICs: {}", comm.describe_nics());
    let _ = writeln!(out, "#  Link constants: {}", comm.describe_link_constants());
    let links: Vec<String> = (0..comm.world_size())
        .filter_map(|p| comm.link(p).map(|l| format!("{p}={}", l.name())))
        .collect();
    let _ = writeln!(
        out,
        "#  Links of rank {}: {}\n#",
        comm.rank(),
        if links.is_empty() {
            "none".to_string()
        } else {
            links.join(" ")
        }
    );
}

/// Let every rank's last measurement window reach rank 0's detector, then print its summary.
fn print_health(comm: &Communicator, print: bool) {
    let window = comm.config().health.window;
    std::thread::sleep(window * 3);
    if print {
        let report = comm.health_report();
        match serde_json::from_value::<Summary>(report["slow"].clone()) {
            Ok(summary) => print!("{}", render(&summary, comm.world_size())),
            Err(e) => println!("# no slow-node summary: {e}"),
        }
    }
}

/// Links that moved path during the sweep (an RDMA queue pair failed, tcp carried on): rank
/// 0 always says how many of its own, every other rank only when it has some.
fn print_failovers(comm: &Communicator, print: bool) {
    let lines = comm.degraded_links();
    if !print && lines.is_empty() {
        return;
    }
    let mut out = format!(
        "#  Failovers of rank {}: {}
",
        comm.rank(),
        lines.len()
    );
    for line in lines {
        out += &format!(
            "#   {line}
"
        );
    }
    print!("{out}");
}

/// Run the sweep on an initialised rank; rank 0 prints and writes the JSON file.
pub fn run_rank(comm: &Communicator, args: &Args) -> Outcome {
    let print = comm.rank() == 0;
    if print {
        banner(comm, args);
    }
    match sweep::run(comm, args, print) {
        Ok(rows) => {
            print_failovers(comm, print);
            if args.health {
                print_health(comm, print);
            }
            if print
                && let Some(path) = &args.json
                && let Err(e) = write_json(path, &rows)
            {
                return Outcome::Failed(format!("cannot write {}: {e}", path.display()));
            }
            Outcome::Done {
                wrong: rows.iter().map(|r| r.wrong).sum(),
            }
        }
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

fn write_json(path: &std::path::Path, rows: &[Measurement]) -> std::io::Result<()> {
    let mut text = String::new();
    for r in rows {
        text += &serde_json::to_string(r).map_err(std::io::Error::other)?;
        text.push('\n');
    }
    std::fs::write(path, text)
}

/// Ranks as threads of this process.
pub fn run_threads(args: &Args) -> Outcome {
    let configs: Result<Vec<_>, String> = (0..args.nranks).map(|r| args.config(r)).collect();
    let configs = match configs {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(e),
    };
    let comms = match Communicator::init_threads_with(args.nranks, |r| configs[r].clone()) {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(|| run_rank(c, args)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Outcome::Failed("a rank thread panicked".into()))
            })
            .collect()
    });
    combine(outcomes)
}

fn combine(outcomes: Vec<Outcome>) -> Outcome {
    let mut wrong = 0;
    for (rank, o) in outcomes.into_iter().enumerate() {
        match o {
            Outcome::Done { wrong: w } => wrong = wrong.max(w),
            Outcome::Failed(e) => return Outcome::Failed(format!("rank {rank}: {e}")),
        }
    }
    Outcome::Done { wrong }
}

/// One process of a multi-process run.
pub fn run_worker(args: &Args, rank: usize, id: &str) -> Outcome {
    let id: UniqueId = match id.parse() {
        Ok(id) => id,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let config = match args.config(rank) {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(e),
    };
    match Communicator::init(rank, args.nranks, &id, config) {
        Ok(comm) => run_rank(&comm, args),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// One rank started by a launcher (mpirun, srun, torchrun): rank, world size and rendezvous
/// from its environment (see `bcl_core::launch`).
pub fn run_launched(args: &Args, launch: &Launch) -> Outcome {
    let mut args = args.clone();
    args.nranks = launch.world;
    let mut config = match args.config(launch.rank) {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(e),
    };
    if bcl_core::config::process_env("BCL_BIND_IP").is_none()
        && let Some(ip) = launch.bind_ip()
    {
        config.bind_ip = ip;
    }
    match Communicator::init_launched(launch, config) {
        Ok(comm) => run_rank(&comm, &args),
        Err(e) => Outcome::Failed(format!("{} rank {}: {e}", launch.launcher, launch.rank)),
    }
}

/// Start `args.nranks` local processes of this binary and wait for them. Rank 0's output is
/// the table; when one rank fails the others are stopped.
pub fn run_processes(args: &Args) -> Outcome {
    let id = match UniqueId::new(
        "127.0.0.1"
            .parse()
            .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
    ) {
        Ok(id) => id,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(format!("cannot find this executable: {e}")),
    };
    let passthrough: Vec<String> = std::env::args().skip(1).collect();
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..args.nranks {
        let spawned = Command::new(&exe)
            .args(&passthrough)
            .arg("--worker-rank")
            .arg(rank.to_string())
            .arg("--unique-id")
            .arg(id.to_string())
            .stdin(Stdio::null())
            // After a --recover the table comes from the survivors' new rank 0, which may
            // be any process; the others print nothing.
            .stdout(if rank == 0 || args.recover.is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::inherit())
            .spawn();
        match spawned {
            Ok(c) => children.push(c),
            Err(e) => {
                stop(&mut children);
                return Outcome::Failed(format!("cannot start rank {rank}: {e}"));
            }
        }
    }
    let mut status: Vec<Option<ExitStatus>> = vec![None; children.len()];
    loop {
        for (rank, c) in children.iter_mut().enumerate() {
            if status[rank].is_none() {
                status[rank] = c.try_wait().ok().flatten();
            }
        }
        // The rank --recover kills is expected to die; the others carry on without it.
        if let Some((rank, s)) = status.iter().enumerate().find_map(|(r, s)| {
            s.filter(|s| !s.success() && s.code() != Some(WRONG_EXIT) && args.recover != Some(r))
                .map(|s| (r, s))
        }) {
            // The other ranks learn the verdict from the health layer and print it as they
            // fail; give them that long before stopping them.
            let grace = Instant::now() + FAILURE_GRACE;
            while Instant::now() < grace
                && children
                    .iter_mut()
                    .any(|c| matches!(c.try_wait(), Ok(None)))
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            stop(&mut children);
            return Outcome::Failed(format!("rank {rank} exited with {s}"));
        }
        if status.iter().all(Option::is_some) {
            let wrong = status
                .iter()
                .any(|s| s.and_then(|s| s.code()) == Some(WRONG_EXIT));
            return Outcome::Done {
                wrong: u64::from(wrong),
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long the other ranks may take to report a failure (the health layer's hang timeout
/// and diagnosis fit in it) before they are stopped.
const FAILURE_GRACE: Duration = Duration::from_secs(5);

/// Exit code of a rank whose results were wrong.
pub const WRONG_EXIT: i32 = 3;

fn stop(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}
