//! What the ranks know about each other after bootstrap, and how messages name a rank.

use bcl_backends::DeviceInfo;
use bcl_transport::PeerAddress;
use serde::{Deserialize, Serialize};

/// What a message says about a peer: its rank, host and device, as a person reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLabel(pub String);

impl std::fmt::Display for PeerLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One rank's self-description, published through the store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: usize,
    pub hostname: String,
    /// Equal for ranks on the same machine and network namespace.
    pub host_id: String,
    pub pid: u32,
    pub device: DeviceInfo,
    /// The transport's address for this rank.
    pub address: PeerAddress,
    /// The health channel's listener ("ip:port"); `None` when the health channel is off.
    pub health: Option<String>,
    /// The network interface of this rank's address ([`crate::nic::interface_of`]), where
    /// known.
    #[serde(default)]
    pub nic: Option<String>,
}

impl RankInfo {
    /// "rank 2 (host h1, pid 4711, sim:0)": how errors name a rank.
    pub fn label(&self) -> PeerLabel {
        PeerLabel(format!(
            "rank {} (host {}, pid {}, {})",
            self.rank, self.hostname, self.pid, self.device
        ))
    }
}

/// The label of `rank` among `peers` ("rank N" where its info is unknown).
pub fn label_of(peers: &[RankInfo], rank: usize) -> PeerLabel {
    peers
        .get(rank)
        .map(RankInfo::label)
        .unwrap_or_else(|| PeerLabel(format!("rank {rank}")))
}

#[cfg(test)]
impl RankInfo {
    /// A cpu rank alone on host "h{rank}" with no transport address, for tests; its health
    /// port at `health`.
    pub(crate) fn for_tests(rank: usize, health: Option<String>) -> RankInfo {
        use bcl_backends::{DeviceCapabilities, Vendor};
        RankInfo {
            rank,
            hostname: format!("h{rank}"),
            host_id: format!("h{rank}"),
            pid: 100 + rank as u32,
            nic: None,
            device: DeviceInfo {
                vendor: Vendor::Cpu,
                model: String::new(),
                index: 0,
                host_id: format!("h{rank}"),
                capabilities: DeviceCapabilities {
                    host_addressable: true,
                    external_memory: false,
                    copy_gbps: None,
                    reduce_gbps: None,
                },
            },
            address: bcl_transport::PeerAddress::new(Vec::new()).expect("an empty address"),
            health,
        }
    }
}
