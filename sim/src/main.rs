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
    let args = Args::parse();
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
