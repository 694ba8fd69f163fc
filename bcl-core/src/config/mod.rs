//! Configuration: the settings of a communicator, where environment variables become
//! settings (`env`, the one place they are read), and the range of every numeric setting
//! (`limits`), checked wherever a value comes from.

mod env;
pub mod limits;
mod topology;

#[cfg(test)]
pub(crate) use env::env;
pub use env::{Env, process_env};
pub use topology::TopologySpec;

use crate::error::{Error, Result};
use crate::schedule::Algorithm;
use crate::schedule::cost::MeasuredLink;
use bcl_backends::{DeviceOptions, DeviceSpec};
use bcl_transport::mem::MemFabric;
use limits::{
    HANG_TIMEOUT, HEARTBEAT, RECORDER_OPS, SLICE_BYTES, SLOW_WINDOW, SOCKET_BUFFER, SOCKETS, SPIN,
    TIMEOUT,
};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

/// Which transport a communicator uses between its ranks.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum TransportKind {
    /// Choose per peer: shared memory for a peer on the same host (same boot id and network
    /// namespace), TCP otherwise.
    #[default]
    Auto,
    Tcp,
    /// Shared memory only: every peer must be on this host.
    Shm,
    /// RDMA verbs to every peer (a build with the `rdma` feature, and an active device on
    /// every rank). `Auto` also uses it between hosts where both ranks offer it.
    Rdma,
    /// In-process, for ranks that are threads of one process joined by this fabric.
    Mem(MemFabric),
}

impl TransportKind {
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "auto" => Ok(TransportKind::Auto),
            "tcp" => Ok(TransportKind::Tcp),
            "shm" => Ok(TransportKind::Shm),
            "rdma" => Ok(TransportKind::Rdma),
            "mem" => Err(Error::InvalidArgument(
                "the mem transport joins threads of one process: use Communicator::init_threads"
                    .into(),
            )),
            other => Err(Error::InvalidArgument(format!(
                "unknown transport '{other}' (auto, tcp, shm, rdma, mem)"
            ))),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Rdma => "rdma",
            TransportKind::Mem(_) => "mem",
        }
    }
}

/// How the hierarchical allreduce sizes each rank's share of the buffer (`BCL_SHARES`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Shares {
    /// Every rank of a host reduces the same share.
    Equal,
    /// Each rank's share in proportion to its device's reduce throughput as the backend
    /// reports it (a device that reports none counts as the host cpu's, the cost model's γ):
    /// 1.37-1.64× faster than equal shares with half the ranks at 1 GB/s
    /// (`cost::MIXED_SPEEDS_DIRECT_FROM`).
    #[default]
    BySpeed,
}

impl Shares {
    pub fn parse(name: &str, text: &str) -> Result<Self> {
        match text {
            "equal" => Ok(Shares::Equal),
            "speed" => Ok(Shares::BySpeed),
            other => Err(Error::InvalidArgument(format!(
                "{name}='{other}' (equal, speed)"
            ))),
        }
    }
}

/// Settings of the health layer (see `CommConfig`).
#[derive(Clone, Debug)]
pub struct HealthConfig {
    /// Run the health channel (heartbeats, diagnosis). Signatures and the flight recorder
    /// are always on.
    pub enabled: bool,
    pub heartbeat: Duration,
    /// Silence (or a stalled operation) longer than this makes a peer a suspect.
    pub hang_timeout: Duration,
    /// Where the flight recorder is written on a fault (none: not written).
    pub dump_dir: Option<PathBuf>,
    /// Operations the flight recorder keeps.
    pub recorder_ops: usize,
    /// How often each rank sends its slow-node measurements towards rank 0's detector.
    pub window: Duration,
    /// Children per rank in the tree the slow-node reports climb to rank 0
    /// (`BCL_REPORT_FANOUT`; [`crate::tree::FANOUT`]): rank 0 hears from this many ranks per
    /// window, not from every rank.
    pub report_fanout: usize,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            heartbeat: Duration::from_millis(200),
            hang_timeout: Duration::from_millis(2000),
            dump_dir: None,
            recorder_ops: 1024,
            window: Duration::from_millis(500),
            report_fanout: crate::tree::FANOUT,
        }
    }
}

/// Everything that shapes a communicator besides its rank, world size and rendezvous.
#[derive(Clone, Debug)]
pub struct CommConfig {
    /// The device this rank computes on.
    pub device: DeviceSpec,
    /// The device's index among its vendor's devices on this host.
    pub device_index: u32,
    /// The vendor library `plugin:N` devices come from (`BCL_DEVICE_PLUGIN`).
    pub device_plugin: Option<PathBuf>,
    pub transport: TransportKind,
    /// TCP connections per peer.
    pub sockets_per_peer: usize,
    /// SO_SNDBUF and SO_RCVBUF of each TCP connection (0: the kernel's autotuning).
    pub socket_buffer: usize,
    /// Over how many of a peer's connections an operation spreads its messages, instead of
    /// choosing by size (`schedule::connections_per_peer`); `None`: choose.
    pub sockets_per_op: Option<usize>,
    /// The TCP congestion control of every connection (`BCL_TCP_CONGESTION`); `None`: loopback
    /// connections that the system would pace (BBR) run cubic, the rest the system's
    /// (`bcl_transport::tcp::LOOPBACK_CONGESTION`).
    pub tcp_congestion: Option<String>,
    /// The RDMA device to use ("mlx5_0", "rxe0"), or several separated by commas ("mlx5_0,mlx5_1":
    /// the queue pairs to each peer spread over them); `None`: the first with an active port.
    pub rdma_device: Option<String>,
    /// RDMA queue pairs per peer (1..=8): at least one per device named in `rdma_device`; each
    /// tag keeps to one, so a collective's slices go out over all of them.
    pub rdma_qps: usize,
    /// Move a peer whose RDMA queue pair fails to tcp mid-run and go on (a degraded link in
    /// the health report), instead of failing the link. On by default.
    pub rdma_tcp_failover: bool,
    /// Address the TCP transport listens on and publishes.
    pub bind_ip: IpAddr,
    /// How long init waits for all ranks to arrive and connect.
    pub init_timeout: Duration,
    /// How long one collective may take before it fails naming the peers it waits for.
    pub op_timeout: Duration,
    /// The largest message of one pipelined slice.
    pub slice_bytes: usize,
    /// Namespace of this communicator's keys in a shared store.
    pub store_prefix: String,
    /// Force one algorithm instead of choosing by size (`schedule::select`). Every rank must
    /// be given the same.
    pub algorithm: Option<Algorithm>,
    /// Heartbeats, hang detection, fault diagnosis and the flight recorder's dump.
    pub health: HealthConfig,
    /// How long a rank waiting inside a collective polls before it sleeps (`None`: 500 µs). It
    /// yields the core between polls when this host runs more ranks than it has cores.
    pub spin: Option<Duration>,
    /// Which ranks share a host, instead of what the bootstrap finds (`BCL_TOPOLOGY`). Every
    /// rank must be given the same.
    pub topology: Option<TopologySpec>,
    /// How the hierarchical allreduce sizes each rank's share. Every rank must be given the
    /// same.
    pub shares: Shares,
    /// The largest all-reduce (bytes; barriers too) that travels over shared-memory lines,
    /// data and flag in one cache line, where every rank is on this host (`BCL_LL_BYTES`; 0:
    /// never; at most 3560, what the lines hold). Every rank must be given the same.
    pub lines_bytes: usize,
    /// The smallest message a rank lends to a same-host peer that overwrites its buffer with
    /// it (a ring allgather's), for the peer to copy straight out of this rank's memory
    /// (`process_vm_readv`, where the ptrace rules allow; `BCL_SINGLE_COPY_BYTES`; 0: never).
    /// Each rank decides for itself.
    pub single_copy_bytes: usize,
    /// The constants of the links inside a host and between hosts as this deployment
    /// measured them (`BCL_LINK_INSIDE`, `BCL_LINK_BETWEEN`: `ALPHA_US,GBPS[,REDUCE_GBPS]`, as
    /// `scripts/measure-cost-model.sh` prints them), for the algorithm choice; `None`: the
    /// built-in ones, this project's test VM's (`schedule::cost::measured`). Every rank must
    /// be given the same.
    pub link_inside: Option<MeasuredLink>,
    pub link_between: Option<MeasuredLink>,
}

/// [`CommConfig::lines_bytes`] unless configured: all the lines hold, since they measured
/// faster than the planned path at every size up to there (docs/small-messages.md).
pub const LINES_BYTES: usize = limits::LINES_BYTES.max;

/// [`CommConfig::single_copy_bytes`] unless configured.
pub const SINGLE_COPY_BYTES: usize = 64 << 10;

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            device: DeviceSpec::Cpu,
            device_index: 0,
            device_plugin: None,
            transport: TransportKind::Auto,
            sockets_per_peer: 2,
            socket_buffer: 4 << 20,
            sockets_per_op: None,
            tcp_congestion: None,
            rdma_device: None,
            rdma_qps: 1,
            rdma_tcp_failover: true,
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            init_timeout: Duration::from_secs(60),
            op_timeout: Duration::from_secs(300),
            slice_bytes: 512 << 10,
            store_prefix: "bcl".into(),
            algorithm: None,
            health: HealthConfig::default(),
            spin: None,
            topology: None,
            shares: Shares::BySpeed,
            lines_bytes: LINES_BYTES,
            single_copy_bytes: SINGLE_COPY_BYTES,
            link_inside: None,
            link_between: None,
        }
    }
}

impl CommConfig {
    /// What opening [`CommConfig::device`] needs besides the spec.
    pub fn device_options(&self) -> DeviceOptions {
        DeviceOptions {
            plugin: self.device_plugin.clone(),
        }
    }

    /// Check every numeric field against its range (as the environment's values are): a
    /// config built in code gets the same clear error as a bad variable, before anything
    /// is opened.
    pub fn validate(&self) -> Result<()> {
        SOCKETS.check("CommConfig::sockets_per_peer", self.sockets_per_peer)?;
        SOCKET_BUFFER.check("CommConfig::socket_buffer", self.socket_buffer)?;
        if let Some(n) = self.sockets_per_op {
            SOCKETS.check("CommConfig::sockets_per_op", n)?;
        }
        if let Some(name) = &self.tcp_congestion {
            check_congestion("CommConfig::tcp_congestion", name)?;
        }
        TIMEOUT.check("CommConfig::init_timeout", self.init_timeout)?;
        TIMEOUT.check("CommConfig::op_timeout", self.op_timeout)?;
        SLICE_BYTES.check("CommConfig::slice_bytes", self.slice_bytes)?;
        limits::LINES_BYTES.check("CommConfig::lines_bytes", self.lines_bytes)?;
        limits::SINGLE_COPY_BYTES.check("CommConfig::single_copy_bytes", self.single_copy_bytes)?;
        for (what, link) in [
            ("CommConfig::link_inside", self.link_inside),
            ("CommConfig::link_between", self.link_between),
        ] {
            link.map(|l| l.check(what))
                .transpose()
                .map_err(Error::InvalidArgument)?;
        }
        if let Some(spin) = self.spin {
            SPIN.check("CommConfig::spin", spin)?;
        }
        let h = &self.health;
        HEARTBEAT.check("HealthConfig::heartbeat", h.heartbeat)?;
        HANG_TIMEOUT.check("HealthConfig::hang_timeout", h.hang_timeout)?;
        SLOW_WINDOW.check("HealthConfig::window", h.window)?;
        RECORDER_OPS.check("HealthConfig::recorder_ops", h.recorder_ops)?;
        limits::REPORT_FANOUT.check("HealthConfig::report_fanout", h.report_fanout)?;
        if self.store_prefix.is_empty() {
            return Err(Error::InvalidArgument(
                "CommConfig::store_prefix is empty".into(),
            ));
        }
        Ok(())
    }
}

/// A TCP congestion control name as the kernel takes it: 1 to 15 ASCII letters, digits, `_`
/// or `-` (`TCP_CA_NAME_MAX` is 16 with the NUL).
pub(crate) fn check_congestion(what: &str, name: &str) -> Result<()> {
    let ok = (1..=15).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what}='{name}' is not a TCP congestion control name (such as cubic, reno, bbr; \
             or auto)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_built_in_code_is_checked_like_the_environment() {
        assert!(CommConfig::default().validate().is_ok());
        type Spoil = fn(&mut CommConfig);
        let cases: [(&str, Spoil); 13] = [
            ("lines_bytes", |c| c.lines_bytes = 3561),
            ("single_copy_bytes", |c| c.single_copy_bytes = 2 << 30),
            ("sockets_per_peer", |c| c.sockets_per_peer = 0),
            ("sockets_per_op", |c| c.sockets_per_op = Some(1000)),
            ("init_timeout", |c| c.init_timeout = Duration::ZERO),
            ("op_timeout", |c| c.op_timeout = Duration::MAX),
            ("slice_bytes", |c| c.slice_bytes = 1),
            ("spin", |c| c.spin = Some(Duration::from_secs(100))),
            ("heartbeat", |c| c.health.heartbeat = Duration::ZERO),
            ("hang_timeout", |c| {
                c.health.hang_timeout = Duration::from_millis(1)
            }),
            ("recorder_ops", |c| c.health.recorder_ops = 0),
            ("link_inside", |c| {
                c.link_inside = Some(MeasuredLink {
                    alpha_ns: 1,
                    bytes_per_second: 0,
                    reduce_bytes_per_second: None,
                })
            }),
            ("link_between", |c| {
                c.link_between = Some(MeasuredLink {
                    alpha_ns: 1,
                    bytes_per_second: 1,
                    reduce_bytes_per_second: Some(0),
                })
            }),
        ];
        for (field, spoil) in cases {
            let mut c = CommConfig::default();
            spoil(&mut c);
            let e = c.validate().expect_err(field);
            assert!(matches!(e, Error::InvalidArgument(_)), "{field}: {e}");
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
    }
}
