//! `bcl-sim`'s command line: `bcl-bench`'s collectives and flags, plus the cluster.

use bcl_bench::args::{CollectiveName, parse_size, sweep_sizes};
use clap::Parser;
use std::path::PathBuf;

/// Run BCL's collective plans on a simulated cluster, with bcl-bench's flags and output.
#[derive(Parser, Debug, Clone)]
#[command(name = "bcl-sim", version)]
pub struct Args {
    /// The collective to simulate.
    #[arg(value_enum)]
    pub collective: CollectiveName,
    /// Smallest message size (bytes; K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest message size.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiply the size by this factor between rows.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub step_factor: usize,
    /// float|half|bfloat16|double|int8|uint8|int32|uint32|int64|uint64
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub datatype: String,
    /// sum|prod|min|max|avg
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Root rank of broadcast, reduce, gather and scatter.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Ranks.
    #[arg(long, default_value_t = 2)]
    pub nranks: usize,
    /// The cluster: a spec (`local`, `cluster`, `cluster,per-host=8,nic=8x50@8,...`) or a file
    /// of its keys (see `docs/simulator.md`). Default: this host (`local`) up to 8 ranks, the
    /// default cluster of 8-rank hosts beyond.
    #[arg(long)]
    pub topology: Option<String>,
    /// auto|ring|rd|hd|tree|hier-ring|hier-rd|hier-hd|hier-tree (auto: BCL's selector).
    #[arg(long, default_value = "auto")]
    pub algo: String,
    /// Bytes per pipelined slice (BCL's default: 512K).
    #[arg(long, value_parser = parse_size, default_value = "512K")]
    pub slice_bytes: usize,
    /// Hosts simulated for all (a symmetric run; 0: every rank). Default: every rank up to
    /// 1024, one leaf's hosts beyond.
    #[arg(long)]
    pub group: Option<usize>,
    /// Ranks of each host simulated for the rest of it (a symmetric run). Default: one beyond
    /// 1024 ranks where a host's ranks share no cores, NICs or uplinks, every rank otherwise.
    #[arg(long)]
    pub locals: Option<usize>,
    /// Steps of all simulated ranks' plans at most per run (up to 100 bytes each in memory);
    /// a row over it is said and left out, and the run fails after the rest. Default: as many
    /// as fit in three quarters of the memory available (`MemAvailable`), or 40 M where that
    /// cannot be read.
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// After each row, a comment line saying how the simulated flows' rate changes were
    /// settled (kept, computed near the change, or over the whole component): what the
    /// simulator's own time follows.
    #[arg(long)]
    pub rate_stats: bool,
    /// Write one JSON object per row and placement to this file (bcl-bench's schema,
    /// `"simulated": true`).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl Args {
    pub fn sizes(&self) -> Vec<usize> {
        sweep_sizes(self.min_bytes, self.max_bytes, self.step_factor)
    }
}
