//! `bcl-sim control`: the control plane's tables per scale, from [`crate::control`].

use crate::control::{
    Constants, rendezvous, report_limit, report_load, report_load_tree, tree_depth, verdict_spread,
};
use bcl_core::bootstrap::Exchange;
use clap::Parser;

/// Rank 0's load and the time of the rendezvous, the slow-node reports and a verdict's
/// delivery, per scale.
#[derive(Parser, Debug, Clone)]
#[command(name = "bcl-sim control")]
pub struct ControlArgs {
    /// World sizes in ranks, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "64,1024,10000,100000")]
    pub ranks: Vec<usize>,
    /// Store seconds per request (default: measured here, see docs/scale.md).
    #[arg(long)]
    pub per_request: Option<f64>,
    /// Store seconds per reply byte.
    #[arg(long)]
    pub per_byte: Option<f64>,
    /// Bytes of a rank's record.
    #[arg(long)]
    pub record: Option<f64>,
    /// Seconds of rank 0's health side per report connection.
    #[arg(long)]
    pub per_connection: Option<f64>,
    /// Seconds per direct verdict delivery (dial, handshake, send, answer).
    #[arg(long)]
    pub dial: Option<f64>,
    /// Seconds of rank 0's detector per window taken.
    #[arg(long)]
    pub per_window: Option<f64>,
    /// Seconds between slow-node reports.
    #[arg(long)]
    pub window: Option<f64>,
    /// Seconds per hop of the ring flood.
    #[arg(long)]
    pub hop: Option<f64>,
}

impl ControlArgs {
    /// The constants, defaults overridden by the flags; a non-finite or non-positive one (or
    /// a world below 2) is refused by name.
    pub fn constants(&self) -> Result<Constants, String> {
        let d = Constants::default();
        let pick = |name: &str, v: Option<f64>, default: f64| match v {
            None => Ok(default),
            Some(x) if x.is_finite() && x > 0.0 => Ok(x),
            Some(x) => Err(format!(
                "--{name} must be a positive finite number, not {x}"
            )),
        };
        if let Some(&w) = self.ranks.iter().find(|&&w| !(2..=10_000_000).contains(&w)) {
            return Err(format!("--ranks takes worlds of 2 to 10 M ranks, not {w}"));
        }
        Ok(Constants {
            per_request: pick("per-request", self.per_request, d.per_request)?,
            per_byte: pick("per-byte", self.per_byte, d.per_byte)?,
            record: pick("record", self.record, d.record)?,
            per_connection: pick("per-connection", self.per_connection, d.per_connection)?,
            dial: pick("dial", self.dial, d.dial)?,
            per_window: pick("per-window", self.per_window, d.per_window)?,
            window: pick("window", self.window, d.window)?,
            hop: pick("hop", self.hop, d.hop)?,
        })
    }
}

fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

/// The tables, as text.
pub fn tables(a: &ControlArgs) -> Result<String, String> {
    let c = a.constants()?;
    let mut out = format!(
        "# bcl-sim control: rank 0's store {:.1} us/request, {:.2} ns/byte, records of {} B; \
         reports every {} s at {:.0} us a connection and {:.0} us a window; verdicts {:.0} us \
         per dial, {:.0} us per ring hop\n",
        c.per_request * 1e6,
        c.per_byte * 1e9,
        c.record,
        c.window,
        c.per_connection * 1e6,
        c.per_window * 1e6,
        c.dial * 1e6,
        c.hop * 1e6
    );
    out += "#\n# rendezvous: rank 0's store (and, relayed, its health port handing the table to its children)\n";
    out += &format!(
        "# {:>8} {:>5} | {:>14} {:>11} {:>11} | {:>10} {:>11} {:>9} | {:>10} {:>8}\n",
        "ranks",
        "depth",
        "star requests",
        "star MB",
        "star s",
        "tree req",
        "tree MB",
        "tree s",
        "relay MB",
        "relay s"
    );
    for &n in &a.ranks {
        let star = rendezvous(Exchange::Star, n, &c);
        let tree = rendezvous(Exchange::Tree, n, &c);
        let down = rendezvous(Exchange::Relay, n, &c);
        out += &format!(
            "  {:>8} {:>5} | {:>14.0} {:>11.1} {:>11.1} | {:>10.0} {:>11.1} {:>9.2} | {:>10.1} {:>8.2}\n",
            n,
            tree_depth(n),
            star.requests,
            mb(star.bytes),
            star.seconds,
            tree.requests,
            mb(tree.bytes),
            tree.seconds,
            mb(down.bytes),
            down.seconds
        );
    }
    out += &format!(
        "#\n# slow-node reports at rank 0, its share of a core: every rank dialling it (keeps up to \
         {:.0} ranks), and up a {}-ary tree (built); a verdict's spread\n",
        report_limit(&c),
        bcl_core::tree::FANOUT
    );
    out += &format!(
        "# {:>8} | {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10}\n",
        "ranks", "reports/s", "star", "tree", "direct s", "flood s", "last s"
    );
    for &n in &a.ranks {
        let (direct, flood, last) = verdict_spread(n, &c);
        out += &format!(
            "  {:>8} | {:>10.0} {:>10.2} {:>10.3} | {:>10.3} {:>10.3} {:>10.3}\n",
            n,
            (n - 1) as f64 / c.window,
            report_load(n, &c),
            report_load_tree(n, bcl_core::tree::FANOUT, &c),
            direct,
            flood,
            last
        );
    }
    Ok(out)
}
