//! Configuration, and the one place where environment variables are read.

use crate::error::{Error, Result};
use crate::schedule::Algorithm;
use bcl_backends::DeviceSpec;
use bcl_transport::mem::MemFabric;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

/// Which transport a communicator uses between its ranks.
#[derive(Clone, Debug, Default)]
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
    /// How often each rank sends its slow-node measurements to rank 0's detector.
    pub window: Duration,
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
    pub transport: TransportKind,
    /// TCP connections per peer.
    pub sockets_per_peer: usize,
    /// SO_SNDBUF and SO_RCVBUF of each TCP connection (0: the kernel's autotuning).
    pub socket_buffer: usize,
    /// Over how many of a peer's connections an operation spreads its messages, instead of
    /// choosing by size (`schedule::connections_per_peer`); `None`: choose.
    pub sockets_per_op: Option<usize>,
    /// The RDMA device to use ("mlx5_0", "rxe0"); `None`: the first with an active port.
    pub rdma_device: Option<String>,
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
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            device: DeviceSpec::Cpu,
            device_index: 0,
            transport: TransportKind::Auto,
            sockets_per_peer: 2,
            socket_buffer: 4 << 20,
            sockets_per_op: None,
            rdma_device: None,
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            init_timeout: Duration::from_secs(60),
            op_timeout: Duration::from_secs(300),
            slice_bytes: 512 << 10,
            store_prefix: "bcl".into(),
            algorithm: None,
            health: HealthConfig::default(),
            spin: None,
        }
    }
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value.trim().parse().map_err(|_| {
        Error::InvalidArgument(format!(
            "environment variable {name}='{value}' is not a number"
        ))
    })
}

impl CommConfig {
    /// This config with the `BCL_*` overrides found through `get` applied:
    /// `BCL_DEVICE`, `BCL_TRANSPORT`, `BCL_SOCKETS_PER_PEER`, `BCL_SOCKET_BUFFER`,
    /// `BCL_SOCKETS_PER_OP` (auto, or a number), `BCL_RDMA_DEVICE`, `BCL_BIND_IP`,
    /// `BCL_INIT_TIMEOUT_S`, `BCL_TIMEOUT_S`, `BCL_SLICE_BYTES`, `BCL_ALGO` (auto, ring, rd, hd),
    /// `BCL_HEALTH` (on, off), `BCL_HEARTBEAT_MS`, `BCL_HANG_TIMEOUT_MS`, `BCL_DUMP_DIR`,
    /// `BCL_FLIGHT_RECORDER_OPS`, `BCL_SLOW_WINDOW_MS`, `BCL_SPIN_US`.
    pub fn with_env(mut self, get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        if let Some(v) = get("BCL_DEVICE") {
            self.device = v
                .parse()
                .map_err(|e| Error::InvalidArgument(format!("BCL_DEVICE: {e}")))?;
        }
        if let Some(v) = get("BCL_TRANSPORT") {
            self.transport = TransportKind::parse(&v)?;
        }
        if let Some(v) = get("BCL_SOCKETS_PER_PEER") {
            self.sockets_per_peer = number::<usize>("BCL_SOCKETS_PER_PEER", &v)?.clamp(1, 64);
        }
        if let Some(v) = get("BCL_SOCKET_BUFFER") {
            self.socket_buffer = number::<usize>("BCL_SOCKET_BUFFER", &v)?;
        }
        if let Some(v) = get("BCL_SOCKETS_PER_OP") {
            self.sockets_per_op = match v.trim() {
                "auto" => None,
                n => Some(number::<usize>("BCL_SOCKETS_PER_OP", n)?.max(1)),
            };
        }
        if let Some(v) = get("BCL_RDMA_DEVICE") {
            self.rdma_device = Some(v).filter(|v| !v.is_empty());
        }
        if let Some(v) = get("BCL_BIND_IP") {
            self.bind_ip = number("BCL_BIND_IP", &v)?;
        }
        if let Some(v) = get("BCL_INIT_TIMEOUT_S") {
            self.init_timeout = Duration::from_secs_f64(number("BCL_INIT_TIMEOUT_S", &v)?);
        }
        if let Some(v) = get("BCL_TIMEOUT_S") {
            self.op_timeout = Duration::from_secs_f64(number("BCL_TIMEOUT_S", &v)?);
        }
        if let Some(v) = get("BCL_ALGO") {
            self.algorithm = match v.as_str() {
                "auto" => None,
                other => Some(
                    other
                        .parse()
                        .map_err(|e| Error::InvalidArgument(format!("BCL_ALGO: {e}")))?,
                ),
            };
        }
        if let Some(v) = get("BCL_SPIN_US") {
            self.spin = Some(Duration::from_micros(number("BCL_SPIN_US", &v)?));
        }
        if let Some(v) = get("BCL_SLICE_BYTES") {
            self.slice_bytes = number::<usize>("BCL_SLICE_BYTES", &v)?.max(64);
        }
        if let Some(v) = get("BCL_HEALTH") {
            self.health.enabled = match v.as_str() {
                "on" | "1" => true,
                "off" | "0" => false,
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "BCL_HEALTH='{other}' (on, off)"
                    )));
                }
            };
        }
        if let Some(v) = get("BCL_HEARTBEAT_MS") {
            self.health.heartbeat =
                Duration::from_millis(number::<u64>("BCL_HEARTBEAT_MS", &v)?.max(1));
        }
        if let Some(v) = get("BCL_HANG_TIMEOUT_MS") {
            self.health.hang_timeout =
                Duration::from_millis(number::<u64>("BCL_HANG_TIMEOUT_MS", &v)?.max(10));
        }
        if let Some(v) = get("BCL_DUMP_DIR") {
            self.health.dump_dir = Some(v.into());
        }
        if let Some(v) = get("BCL_SLOW_WINDOW_MS") {
            self.health.window =
                Duration::from_millis(number::<u64>("BCL_SLOW_WINDOW_MS", &v)?.max(10));
        }
        if let Some(v) = get("BCL_FLIGHT_RECORDER_OPS") {
            self.health.recorder_ops = number::<usize>("BCL_FLIGHT_RECORDER_OPS", &v)?.max(1);
        }
        Ok(self)
    }
}

/// The process environment, for [`CommConfig::with_env`] and [`crate::launch::Launch::from_env`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// An environment made of `pairs`, for tests of what reads the environment.
#[cfg(test)]
pub(crate) fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_overrides() {
        let c = CommConfig::default()
            .with_env(&env(&[
                ("BCL_DEVICE", "sim:copy=2"),
                ("BCL_TIMEOUT_S", "1.5"),
                ("BCL_HEALTH", "off"),
                ("BCL_HEARTBEAT_MS", "50"),
                ("BCL_HANG_TIMEOUT_MS", "700"),
                ("BCL_DUMP_DIR", "/tmp/bcl-dumps"),
                ("BCL_SOCKET_BUFFER", "0"),
            ]))
            .expect("config");
        assert_eq!(c.socket_buffer, 0);
        assert_eq!(CommConfig::default().socket_buffer, 4 << 20);
        let forced = |v: &str| {
            CommConfig::default()
                .with_env(&env(&[("BCL_SOCKETS_PER_OP", v)]))
                .map(|c| c.sockets_per_op)
        };
        assert_eq!(forced("1").expect("1"), Some(1));
        assert_eq!(forced("auto").expect("auto"), None);
        assert_eq!(forced("0").expect("0"), Some(1));
        let e = forced("all").expect_err("not a number");
        assert!(e.to_string().contains("BCL_SOCKETS_PER_OP='all'"), "{e}");
        let e = CommConfig::default()
            .with_env(&env(&[("BCL_SOCKET_BUFFER", "4M")]))
            .expect_err("not a number");
        assert!(e.to_string().contains("BCL_SOCKET_BUFFER='4M'"), "{e}");
        assert!(!c.health.enabled);
        assert_eq!(c.health.heartbeat, Duration::from_millis(50));
        assert_eq!(c.health.hang_timeout, Duration::from_millis(700));
        assert_eq!(
            c.health.dump_dir.as_deref(),
            Some(std::path::Path::new("/tmp/bcl-dumps"))
        );
        let e = CommConfig::default()
            .with_env(&env(&[("BCL_HEALTH", "maybe")]))
            .expect_err("bad switch");
        assert!(e.to_string().contains("BCL_HEALTH='maybe'"), "{e}");
        assert_eq!(c.device.to_string(), "sim:copy=2");
        assert_eq!(c.op_timeout, Duration::from_millis(1500));
        let e = CommConfig::default()
            .with_env(&env(&[("BCL_DEVICE", "tpu")]))
            .expect_err("bad device");
        assert!(e.to_string().contains("tpu"), "{e}");
    }
}
