//! What each rank knows about the others after bootstrap, the ring order, and the per-peer
//! transport choice.

use crate::config::TransportKind;
use crate::error::PeerLabel;
use bcl_backends::DeviceInfo;
use bcl_transport::PeerAddress;
use serde::{Deserialize, Serialize};

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

/// The ring: ranks of one host adjacent, and within a host ranks of one vendor adjacent, so
/// that the ring crosses hosts and vendors as few times as possible. Deterministic: every
/// rank computes the same order from the same infos.
pub fn ring_order(infos: &[RankInfo]) -> Vec<usize> {
    let mut order: Vec<&RankInfo> = infos.iter().collect();
    order.sort_by(|a, b| {
        (&a.host_id, a.device.vendor.to_string(), a.rank).cmp(&(
            &b.host_id,
            b.device.vendor.to_string(),
            b.rank,
        ))
    });
    order.iter().map(|i| i.rank).collect()
}

/// The transport actually used towards one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Mem,
    Tcp,
    Shm,
}

impl LinkKind {
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Mem => "mem",
            LinkKind::Tcp => "tcp",
            LinkKind::Shm => "shm",
        }
    }
}

/// Which transport carries the link between `local` and `peer`; both ranks reach the same
/// answer. `Auto`: shared memory when the two share a host (boot id and network namespace) and
/// the peer offers it, TCP otherwise. `Shm` with a peer elsewhere is an error naming it.
pub fn choose_link(
    requested: &TransportKind,
    local: &RankInfo,
    peer: &RankInfo,
    peer_offers_shm: bool,
) -> Result<LinkKind, String> {
    let same_host = local.host_id == peer.host_id;
    match requested {
        TransportKind::Mem(_) => Ok(LinkKind::Mem),
        TransportKind::Tcp => Ok(LinkKind::Tcp),
        TransportKind::Auto if same_host && peer_offers_shm => Ok(LinkKind::Shm),
        TransportKind::Auto => Ok(LinkKind::Tcp),
        TransportKind::Shm if same_host && peer_offers_shm => Ok(LinkKind::Shm),
        TransportKind::Shm if same_host => Err(format!(
            "transport shm was requested but {} offers no shared memory",
            peer.label()
        )),
        TransportKind::Shm => Err(format!(
            "transport shm was requested but {} is on another host than {} (use auto or tcp)",
            peer.label(),
            local.label()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcl_backends::{DeviceCapabilities, Vendor};

    fn info(rank: usize, host: &str, vendor: Vendor) -> RankInfo {
        RankInfo {
            rank,
            hostname: host.into(),
            host_id: host.into(),
            pid: 1,
            health: None,
            device: DeviceInfo {
                vendor,
                model: String::new(),
                index: 0,
                host_id: host.into(),
                capabilities: DeviceCapabilities {
                    host_addressable: true,
                    copy_gbps: None,
                    reduce_gbps: None,
                },
            },
            address: PeerAddress::new(vec![]).expect("empty address"),
        }
    }

    #[test]
    fn ring_keeps_hosts_and_vendors_together() {
        let infos = vec![
            info(0, "b", Vendor::Cpu),
            info(1, "a", Vendor::Sim),
            info(2, "b", Vendor::Sim),
            info(3, "a", Vendor::Cpu),
            info(4, "a", Vendor::Sim),
        ];
        assert_eq!(ring_order(&infos), vec![3, 1, 4, 0, 2]);
        assert!(infos[2].label().0.contains("rank 2 (host b"));
    }

    #[test]
    fn auto_links_same_host_peers_by_shared_memory() {
        let (a0, a1, b) = (
            info(0, "a", Vendor::Cpu),
            info(1, "a", Vendor::Sim),
            info(2, "b", Vendor::Cpu),
        );
        let auto = TransportKind::Auto;
        assert_eq!(choose_link(&auto, &a0, &a1, true), Ok(LinkKind::Shm));
        assert_eq!(choose_link(&auto, &a1, &a0, true), Ok(LinkKind::Shm));
        assert_eq!(choose_link(&auto, &a0, &a1, false), Ok(LinkKind::Tcp));
        assert_eq!(choose_link(&auto, &a0, &b, true), Ok(LinkKind::Tcp));
        assert_eq!(
            choose_link(&TransportKind::Tcp, &a0, &a1, true),
            Ok(LinkKind::Tcp)
        );
        let e = choose_link(&TransportKind::Shm, &a0, &b, true).expect_err("other host");
        assert!(
            e.contains("rank 2 (host b") && e.contains("another host"),
            "{e}"
        );
    }
}
