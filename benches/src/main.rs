//! `bcl-bench`: measure BCL collectives like nccl-tests measures NCCL.
//!
//! `bcl-bench allreduce --nranks 4 --devices cpu,sim -b 8 -e 64M -f 4` starts 4 local rank
//! processes (rendezvous on loopback), prints nccl-tests' table, and exits non-zero when any
//! `#wrong` is non-zero or a rank fails.

use bcl_bench::args::Args;
use bcl_bench::launch::{self, Outcome, WRONG_EXIT};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("plot") {
        return match bcl_bench::plot::main(&argv[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bcl-bench: {e}");
                ExitCode::from(2)
            }
        };
    }
    if argv.get(1).map(String::as_str) == Some("rendezvous") {
        return match bcl_bench::rendezvous::main(&argv[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bcl-bench: {e}");
                ExitCode::from(2)
            }
        };
    }
    let args = Args::parse();
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BCL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let valid = args.validate().and(args.dtypes().map(drop));
    if let Err(e) = valid
        .and(args.ops().map(drop))
        .and(args.device_specs().map(drop))
    {
        eprintln!("bcl-bench: {e}");
        return ExitCode::from(2);
    }
    // Started by a launcher as one rank of several: that is the job, whatever --nranks says.
    let launched = match (&args.worker_rank, args.in_threads()) {
        (None, false) => bcl_core::launch::Launch::from_env(&bcl_core::config::process_env)
            .ok()
            .filter(|l| l.world > 1),
        _ => None,
    };
    if let Some(l) = &launched
        && args.root >= l.world
    {
        eprintln!(
            "bcl-bench: -r must be below the launcher's world size {}",
            l.world
        );
        return ExitCode::from(2);
    }
    if launched.is_none() && args.root >= args.nranks {
        eprintln!("bcl-bench: -r/--root must be below --nranks");
        return ExitCode::from(2);
    }
    let world = launched.as_ref().map_or(args.nranks, |l| l.world);
    if let Some(victim) = args.recover
        && (victim >= world || world < 3)
    {
        eprintln!(
            "bcl-bench: --recover {victim} needs a rank below the world size ({world}) and at \
             least 3 ranks (2 survivors to shrink to)"
        );
        return ExitCode::from(2);
    }
    let outcome = match (&args.worker_rank, &args.unique_id, &launched) {
        (_, _, Some(l)) => launch::run_launched(&args, l),
        (Some(rank), Some(id), None) => launch::run_worker(&args, *rank, id),
        _ if args.in_threads() => launch::run_threads(&args),
        _ => launch::run_processes(&args),
    };
    match outcome {
        Outcome::Done { wrong: 0 } => ExitCode::SUCCESS,
        Outcome::Done { .. } => {
            if args.worker_rank.is_none() {
                eprintln!("bcl-bench: some results were wrong");
            }
            ExitCode::from(WRONG_EXIT as u8)
        }
        Outcome::Failed(e) => {
            eprintln!("bcl-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
