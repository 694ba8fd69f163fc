use bcl_sim::args::Args;
use clap::Parser;
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Args::parse();
    let run = || -> Result<(), String> {
        let topo = bcl_sim::sweep::topology(&args)?;
        let rows = bcl_sim::sweep::run(&args, &topo, |line| println!("{line}"))?;
        if let Some(path) = &args.json {
            let mut f =
                std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            for r in &rows {
                let line = serde_json::to_string(r).map_err(|e| e.to_string())?;
                writeln!(f, "{line}").map_err(|e| format!("{}: {e}", path.display()))?;
            }
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
