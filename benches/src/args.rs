//! Command-line flags, with nccl-tests' names and meanings.

use bcl_core::config::limits;
use bcl_core::{CommConfig, DataType, DeviceSpec, ReduceOp, TransportKind};
use clap::{Parser, ValueEnum};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CollectiveName {
    Allreduce,
    Allgather,
    Reducescatter,
    Broadcast,
    Reduce,
    Alltoall,
    Gather,
    Scatter,
    /// nccl-tests' sendrecv: every rank sends to the next and receives from the previous.
    Sendrecv,
}

impl CollectiveName {
    /// Whether it reduces (its rows name a reduce op).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            CollectiveName::Allreduce | CollectiveName::Reducescatter | CollectiveName::Reduce
        )
    }

    /// Whether it has a root (its rows name it).
    pub fn rooted(self) -> bool {
        matches!(
            self,
            CollectiveName::Broadcast
                | CollectiveName::Reduce
                | CollectiveName::Gather
                | CollectiveName::Scatter
        )
    }
}

/// Benchmark BCL collectives the way nccl-tests benchmarks NCCL.
#[derive(Parser, Debug, Clone)]
#[command(name = "bcl-bench", version)]
pub struct Args {
    /// The collective to measure.
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
    /// Timed iterations per row.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Untimed warm-up iterations per row.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Check every element against the closed-form result (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// float|half|bfloat16|double|int8|uint8|int32|uint32|int64|uint64|all
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub datatype: String,
    /// sum|prod|min|max|avg|all
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// Root rank of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Number of local ranks to start.
    #[arg(long, default_value_t = 2)]
    pub nranks: usize,
    /// Device of each rank, cycled over the ranks: cpu, sim, sim:copy=GBPS:reduce=GBPS.
    #[arg(long, default_value = "cpu")]
    pub devices: String,
    /// auto|tcp|shm|rdma|mem (auto: shared memory to ranks on this host, rdma to ranks on
    /// other hosts where both have an RDMA device, tcp otherwise; rdma needs a build with the
    /// `rdma` feature; mem implies --threads).
    #[arg(long, default_value = "auto")]
    pub transport: String,
    /// Run the ranks as threads of this process instead of separate processes.
    #[arg(long)]
    pub threads: bool,
    /// After the sweep, print the slow-node detector's per-link bandwidth matrix, per-rank
    /// device speed and lateness, and its verdicts.
    #[arg(long)]
    pub health: bool,
    /// Write one JSON object per row and placement to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// TCP connections per peer.
    #[arg(long)]
    pub sockets_per_peer: Option<usize>,
    /// Bytes per pipelined slice.
    #[arg(long, value_parser = parse_size)]
    pub slice_bytes: Option<usize>,
    /// auto|ring|rd|hd|tree|hier-ring|hier-rd|hier-hd|hier-tree: the algorithm (auto: the cost model's
    /// pick: recursive doubling for small messages, halving-doubling or the ring for large
    /// ones; with several ranks on each of several hosts, hierarchical). The hierarchical ones
    /// serve allreduce, broadcast and reduce, the doubling and tree ones allreduce.
    #[arg(long, default_value = "auto")]
    pub algo: String,
    /// Seconds one collective may take before it fails naming the peers it waits for.
    #[arg(long, default_value_t = 120.0)]
    pub timeout: f64,
    /// Kill this rank at the start of the sweep's middle row: the others catch the error,
    /// shrink the communicator to the survivors (`BCL_SHRINK_FAILED`), print how long the
    /// repair took, and finish the sweep on them. Local ranks (--nranks, at least 3), or a
    /// launcher that lets a job go on when one rank dies.
    #[arg(long, value_name = "RANK")]
    pub recover: Option<usize>,
    #[arg(long, hide = true)]
    pub worker_rank: Option<usize>,
    #[arg(long, hide = true)]
    pub unique_id: Option<String>,
}

/// The sizes from `min` to `max`, each `factor` times the last (bcl-bench's and bcl-sim's
/// `-b -e -f`).
pub fn sweep_sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut s = min;
    while s <= max {
        sizes.push(s);
        if factor <= 1 || s == 0 {
            break;
        }
        // A size past usize::MAX ends the sweep (it once wrapped around: -e near the
        // maximum with -f 3 grew the list until memory ran out).
        match s.checked_mul(factor) {
            Some(next) => s = next,
            None => break,
        }
    }
    sizes
}

/// "8", "1K", "64M", "1G" → bytes.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (num, mult) = match t.chars().last() {
        Some('K') | Some('k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') | Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('G') | Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{text}' is not a size (e.g. 8, 1K, 64M)"))
}

/// The most local rank processes `--nranks` starts.
pub const MAX_LOCAL_RANKS: usize = 1024;

impl Args {
    /// Check every numeric flag: a value out of range is an error naming the flag and the
    /// value (never a panic, nor a value quietly raised or lowered).
    pub fn validate(&self) -> Result<(), String> {
        let e = |error: bcl_core::Error| error.to_string();
        limits::TIMEOUT
            .from_f64("--timeout", self.timeout)
            .map_err(e)?;
        if let Some(n) = self.sockets_per_peer {
            limits::SOCKETS.check("--sockets-per-peer", n).map_err(e)?;
        }
        if let Some(n) = self.slice_bytes {
            limits::SLICE_BYTES.check("--slice-bytes", n).map_err(e)?;
        }
        let out_of_range = |flag: &str, v: usize, range: &str| {
            Err(format!("{flag}='{v}' is out of range: it must be {range}"))
        };
        if self.iters == 0 {
            return out_of_range("-n/--iters", 0, "at least 1");
        }
        if self.step_factor == 0 {
            return out_of_range("-f/--stepfactor", 0, "at least 1");
        }
        if self.check > 1 {
            return out_of_range("-c/--check", self.check as usize, "0 or 1");
        }
        if self.nranks == 0 || self.nranks > MAX_LOCAL_RANKS {
            let range = format!("from 1 to {MAX_LOCAL_RANKS}");
            return out_of_range("--nranks", self.nranks, &range);
        }
        // Its rank is checked against the world size once that is known (main).
        if self.recover.is_some() && self.in_threads() {
            return Err(
                "--recover kills a rank's process: it needs ranks as processes, not --threads or --transport mem"
                    .into(),
            );
        }
        if self.min_bytes > self.max_bytes {
            return Err(format!(
                "-b/--minbytes {} is larger than -e/--maxbytes {}: nothing to measure",
                self.min_bytes, self.max_bytes
            ));
        }
        Ok(())
    }

    pub fn dtypes(&self) -> Result<Vec<DataType>, String> {
        if self.datatype == "all" {
            return Ok(DataType::ALL.to_vec());
        }
        Ok(vec![self.datatype.parse()?])
    }

    pub fn ops(&self) -> Result<Vec<ReduceOp>, String> {
        if self.op == "all" {
            return Ok(ReduceOp::ALL.to_vec());
        }
        Ok(vec![self.op.parse()?])
    }

    pub fn device_specs(&self) -> Result<Vec<DeviceSpec>, String> {
        self.devices
            .split(',')
            .map(|s| s.parse::<DeviceSpec>().map_err(|e| e.to_string()))
            .collect()
    }

    pub fn device_of(&self, rank: usize) -> Result<DeviceSpec, String> {
        let specs = self.device_specs()?;
        Ok(specs[rank % specs.len()].clone())
    }

    pub fn in_threads(&self) -> bool {
        self.threads || self.transport == "mem"
    }

    /// The communicator config of `rank`.
    pub fn config(&self, rank: usize) -> Result<CommConfig, String> {
        let op_timeout =
            (limits::TIMEOUT.from_f64("--timeout", self.timeout)).map_err(|e| e.to_string())?;
        let mut c = CommConfig {
            device: self.device_of(rank)?,
            op_timeout,
            ..CommConfig::default()
        };
        // Two ranks of one vendor on one host get distinct device indices.
        let specs = self.device_specs()?;
        c.device_index = (rank / specs.len()) as u32;
        c.transport = match self.transport.as_str() {
            "mem" => TransportKind::Auto,
            other => TransportKind::parse(other).map_err(|e| e.to_string())?,
        };
        if let Some(s) = self.sockets_per_peer {
            c.sockets_per_peer = s;
        }
        if let Some(s) = self.slice_bytes {
            c.slice_bytes = s;
        }
        c.algorithm = match self.algo.as_str() {
            "auto" => None,
            other => Some(other.parse()?),
        };
        c.with_env(&bcl_core::config::process_env)
            .map_err(|e| e.to_string())
    }

    /// Message sizes of the sweep.
    pub fn sizes(&self) -> Vec<usize> {
        sweep_sizes(self.min_bytes, self.max_bytes, self.step_factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_tests_flags_parse() {
        let a = Args::try_parse_from([
            "bcl-bench",
            "allreduce",
            "-b",
            "8",
            "-e",
            "64M",
            "-f",
            "4",
            "-n",
            "3",
            "-w",
            "1",
            "-c",
            "1",
            "-d",
            "all",
            "-o",
            "avg",
            "--nranks",
            "4",
            "--devices",
            "cpu,sim:copy=0.3",
        ])
        .expect("parse");
        assert_eq!(a.sizes().first(), Some(&8));
        assert_eq!(a.sizes().last(), Some(&(32 << 20)));
        assert_eq!(a.dtypes().expect("dtypes").len(), 10);
        assert_eq!(a.device_of(3).expect("spec").to_string(), "sim:copy=0.3");
        assert!(parse_size("12Q").is_err());
        assert!(Args::try_parse_from(["bcl-bench", "allshuffle"]).is_err());
    }
}
