//! `bcl-sim ettr`: the effective-training-time table, per scale and way of recovering, from
//! [`crate::ettr`]'s closed form and its Monte Carlo run side by side.

use crate::ettr::{Recovery, Scenario, closed_form, monte_carlo};
use clap::Parser;

/// Effective training time under failures, per scale, for a restart from checkpoint with a
/// peer's detection and with BCL's, and for BCL's in-place recovery.
#[derive(Parser, Debug, Clone)]
#[command(name = "bcl-sim ettr")]
pub struct EttrArgs {
    /// Job sizes in chips, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub chips: Vec<f64>,
    /// Hours between failures of one chip (40000: 10k chips fail every 4 h, 100k every 24 min).
    #[arg(long, default_value_t = 40_000.0)]
    pub chip_mtbf_h: f64,
    /// Seconds per training step (in place, a failure redoes the step it cut).
    #[arg(long, default_value_t = 10.0)]
    pub step: f64,
    /// Seconds a checkpoint stalls training.
    #[arg(long, default_value_t = 10.0)]
    pub checkpoint: f64,
    /// Seconds of work between checkpoints (default: the Young/Daly optimum per row).
    #[arg(long)]
    pub interval: Option<f64>,
    /// Seconds to relaunch: scheduling, communicator init, loading the checkpoint.
    #[arg(long, default_value_t = 600.0)]
    pub restart: f64,
    /// Seconds for the survivors to agree and go on in place (shrink).
    #[arg(long, default_value_t = 5.0)]
    pub shrink: f64,
    /// Share of failures in-place recovery cannot take (they restart from the checkpoint).
    #[arg(long, default_value_t = 0.1)]
    pub fallback: f64,
    /// Share of failures that hang a rank rather than kill it.
    #[arg(long, default_value_t = 0.25)]
    pub hung_share: f64,
    /// BCL's detection of a dead and of a hung peer, seconds (measured: ~20 ms, ~2.5 s).
    #[arg(long, default_value_t = 0.02)]
    pub bcl_dead: f64,
    #[arg(long, default_value_t = 2.5)]
    pub bcl_hung: f64,
    /// A peer's: dead peers through the network's errors or a RAS sweep, hung ones at
    /// torch's 10-minute collective timeout.
    #[arg(long, default_value_t = 30.0)]
    pub peer_dead: f64,
    #[arg(long, default_value_t = 600.0)]
    pub peer_hung: f64,
    /// Days of wall time per Monte Carlo run, and runs per row.
    #[arg(long, default_value_t = 365.0)]
    pub days: f64,
    #[arg(long, default_value_t = 4)]
    pub trials: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub chips: f64,
    pub mode: &'static str,
    pub scenario: Scenario,
    pub closed: f64,
    /// Monte Carlo: mean, lowest and highest of the runs.
    pub mc: (f64, f64, f64),
}

/// The three ways of recovering for one size.
pub fn scenarios(a: &EttrArgs, chips: f64) -> Vec<(&'static str, Scenario)> {
    let base = Scenario {
        chips,
        chip_mtbf: a.chip_mtbf_h * 3600.0,
        step: a.step,
        detect_dead: a.peer_dead,
        detect_hung: a.peer_hung,
        hung_share: a.hung_share,
        recovery: Recovery::Restart { restart: a.restart },
        checkpoint: a.checkpoint,
        interval: a.interval,
    };
    let bcl = Scenario {
        detect_dead: a.bcl_dead,
        detect_hung: a.bcl_hung,
        ..base.clone()
    };
    let in_place = Scenario {
        recovery: Recovery::InPlace {
            shrink: a.shrink,
            fallback: a.fallback,
            restart: a.restart,
        },
        ..bcl.clone()
    };
    vec![
        ("restart, peer detection", base),
        ("restart, BCL detection", bcl),
        ("in place (BCL shrink)", in_place),
    ]
}

/// Every row, each setting checked first.
pub fn rows(a: &EttrArgs) -> Result<Vec<Row>, String> {
    if !(a.days.is_finite() && a.days > 0.0) {
        return Err(format!("days = {}: must be positive and finite", a.days));
    }
    if a.trials == 0 {
        return Err("trials = 0: at least one run".into());
    }
    let horizon = a.days * 86_400.0;
    let mut out = Vec::new();
    for &chips in &a.chips {
        for (mode, s) in scenarios(a, chips) {
            s.check()?;
            let runs: Vec<f64> = (0..a.trials)
                .map(|t| monte_carlo(&s, horizon, a.seed.wrapping_add(t)))
                .collect();
            let mean = runs.iter().sum::<f64>() / runs.len() as f64;
            let lo = runs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = runs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.push(Row {
                chips,
                mode,
                closed: closed_form(&s),
                scenario: s,
                mc: (mean, lo, hi),
            });
        }
    }
    Ok(out)
}

/// The rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| chips | job MTBF | recovery | mean detection | checkpoint every | ETTR (closed form) | ETTR (Monte Carlo: mean, range) |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let s = &r.scenario;
        let tau = s.interval();
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.2}% | {:.2}% ({:.2}-{:.2}) |\n",
            r.chips,
            duration(1.0 / s.rate()),
            r.mode,
            duration(s.detect()),
            if tau.is_finite() {
                duration(tau)
            } else {
                "never".into()
            },
            100.0 * r.closed,
            100.0 * r.mc.0,
            100.0 * r.mc.1,
            100.0 * r.mc.2,
        ));
    }
    t
}

fn duration(s: f64) -> String {
    if s >= 3600.0 {
        format!("{:.1} h", s / 3600.0)
    } else if s >= 60.0 {
        format!("{:.1} min", s / 60.0)
    } else if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} ms", s * 1e3)
    }
}
