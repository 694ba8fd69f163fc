use bcl_sim::args::Args;
use bcl_sim::control_report::ControlArgs;
use bcl_sim::ettr_report::EttrArgs;
use clap::Parser;
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("ettr") {
        let args = EttrArgs::parse_from(&argv[1..]);
        return match bcl_sim::ettr_report::rows(&args) {
            Ok(rows) => {
                print!("{}", bcl_sim::ettr_report::table(&rows));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("bcl-sim ettr: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if argv.get(1).map(String::as_str) == Some("control") {
        let args = ControlArgs::parse_from(&argv[1..]);
        return match bcl_sim::control_report::tables(&args) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("bcl-sim control: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut args = Args::parse();
    if args.max_steps.is_none() {
        args.max_steps = fitting_steps();
    }
    let run = || -> Result<(), String> {
        let topo = bcl_sim::sweep::topology(&args)?;
        let sweep = bcl_sim::sweep::run(&args, &topo, |line| println!("{line}"))?;
        if let Some(path) = &args.json {
            let mut f =
                std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            for r in &sweep.rows {
                let line = serde_json::to_string(r).map_err(|e| e.to_string())?;
                writeln!(f, "{line}").map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        // The rows that ran are printed (and written); a row left out still fails the run.
        if !sweep.skipped.is_empty() {
            let sizes: Vec<String> = sweep.skipped.iter().map(|s| format!("{s} B")).collect();
            return Err(format!(
                "rows too large to simulate, left out (see the lines starting '# <size> B: not \
                 simulated'): {}",
                sizes.join(", ")
            ));
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bcl-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The steps that fit in three quarters of the memory this machine has available
/// (`MemAvailable` in `/proc/meminfo`), at [`bcl_sim::engine::STEP_BYTES`] each; `None` where
/// that cannot be read (the library's limit then holds).
fn fitting_steps() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024) / 4 * 3 / bcl_sim::engine::STEP_BYTES)
}
