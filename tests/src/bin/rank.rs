//! One rank as a real process, for the multi-process tests. Reads the launcher variables
//! (`BCL_RANK`, `BCL_WORLD_SIZE`, `BCL_UNIQUE_ID`, `BCL_*` settings) and runs the scenario
//! named by `BCL_TEST_SCENARIO`:
//! * `suite`: the conformance cases up to 1000 elements; exit 0 when all pass, 1 otherwise;
//! * `loop`: 16 MiB fp32 allreduces until `BCL_TEST_ITERS` are done, printing `ready` after
//!   the first; exit 0, or 7 with the error on stderr when a collective fails.
//!
//! Exit 4: init failed (the error is on stderr).

use bcl_core::{Communicator, ReduceOp};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let comm = match Communicator::init_from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("init failed: {e}");
            return ExitCode::from(4);
        }
    };
    let scenario = std::env::var("BCL_TEST_SCENARIO").unwrap_or_default();
    match scenario.as_str() {
        "suite" => {
            let cases: Vec<_> = bcl_tests::cases(comm.world_size())
                .into_iter()
                .filter(|c| c.count <= 1000)
                .collect();
            let failures = bcl_tests::run_cases(std::slice::from_ref(&comm), &cases);
            for f in &failures {
                eprintln!("{f}");
            }
            println!(
                "rank {} ran {} cases, {} failed",
                comm.rank(),
                cases.len(),
                failures.len()
            );
            ExitCode::from(u8::from(!failures.is_empty()))
        }
        "loop" => {
            let iters: usize = std::env::var("BCL_TEST_ITERS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1000);
            let mut buf = vec![1.0f32; 4 << 20];
            for i in 0..iters {
                if let Err(e) = comm.all_reduce_in_place(&mut buf, ReduceOp::Max) {
                    eprintln!("rank {} error: {e}", comm.rank());
                    return ExitCode::from(7);
                }
                if i == 0 {
                    println!("ready");
                    let _ = std::io::stdout().flush();
                }
            }
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("unknown BCL_TEST_SCENARIO '{other}' (suite, loop)");
            ExitCode::from(2)
        }
    }
}
