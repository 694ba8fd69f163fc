//! The ring order, the hosts, and the per-peer transport choice, from what every rank
//! published.

use crate::config::{TopologySpec, TransportKind};
use crate::peers::RankInfo;

/// The ring: ranks of one host adjacent, and within a host ranks of one vendor adjacent, so
/// that the ring crosses hosts and vendors as few times as possible. Deterministic: every
/// rank computes the same order from the same infos.
/// Hosts come in the order of their lowest rank, so the ring and the hosts read naturally
/// (`[0, 1] [2, 3]`).
pub fn ring_order(infos: &[RankInfo]) -> Vec<usize> {
    let mut first: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for i in infos {
        let f = first.entry(i.host_id.as_str()).or_insert(i.rank);
        *f = (*f).min(i.rank);
    }
    let host_rank = |i: &RankInfo| first.get(i.host_id.as_str()).copied().unwrap_or(i.rank);
    let mut order: Vec<&RankInfo> = infos.iter().collect();
    order.sort_by_key(|i| (host_rank(i), i.device.vendor.to_string(), i.rank));
    order.iter().map(|i| i.rank).collect()
}

/// The ranks of each host, hosts in ring order, and the ring: from the bootstrap (ranks with
/// one host id share a host: boot id and network namespace) or, when set, from `spec`
/// (`BCL_TOPOLOGY`), whose hosts then also order the ring.
pub fn hosts_and_ring(
    infos: &[RankInfo],
    spec: Option<&TopologySpec>,
) -> crate::Result<(Vec<Vec<usize>>, Vec<usize>)> {
    if let Some(spec) = spec {
        let hosts = spec.hosts(infos.len())?;
        let ring = hosts.iter().flatten().copied().collect();
        return Ok((hosts, ring));
    }
    let ring = ring_order(infos);
    let mut hosts: Vec<Vec<usize>> = Vec::new();
    for &r in &ring {
        match hosts.last_mut() {
            Some(h) if infos[h[0]].host_id == infos[r].host_id => h.push(r),
            _ => hosts.push(vec![r]),
        }
    }
    Ok((hosts, ring))
}

/// The hosts as one line: `2 hosts: [0, 1, 2, 3] [4, 5, 6, 7]`.
pub fn describe_hosts(hosts: &[Vec<usize>]) -> String {
    let list: Vec<String> = hosts.iter().map(|h| format!("{h:?}")).collect();
    let noun = if hosts.len() == 1 { "host" } else { "hosts" };
    format!("{} {noun}: {}", hosts.len(), list.join(" "))
}

/// The distinct network interfaces of the ranks in `host` (`None`: one is unknown), sorted.
pub fn host_nics<'a>(host: &[usize], peers: &'a [RankInfo]) -> Vec<Option<&'a str>> {
    let mut names: Vec<Option<&str>> = host
        .iter()
        .map(|&r| peers.get(r).and_then(|p| p.nic.as_deref()))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The transport actually used towards one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkKind {
    Mem,
    Tcp,
    Shm,
    Rdma,
    /// A transport passed in by the caller ([`crate::CommBuilder::transport`]), by the name
    /// its capabilities declare.
    Custom(&'static str),
}

impl LinkKind {
    /// The kind a transport of this name carries ("tcp", "shm", "rdma", "mem").
    pub fn from_name(name: &str) -> Option<LinkKind> {
        [LinkKind::Mem, LinkKind::Tcp, LinkKind::Shm, LinkKind::Rdma]
            .into_iter()
            .find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            LinkKind::Mem => "mem",
            LinkKind::Tcp => "tcp",
            LinkKind::Shm => "shm",
            LinkKind::Rdma => "rdma",
            LinkKind::Custom(name) => name,
        }
    }
}

/// Which transport carries the link between `local` and `peer`; both ranks reach the same
/// answer. `Auto`: shared memory when the two share a host (boot id and network namespace) and
/// the peer offers it; RDMA between hosts when both offer it (an active device on each); TCP
/// otherwise. `Shm` with a peer elsewhere, or `Rdma` with a rank that offers none, is an error
/// naming the rank.
pub fn choose_link(
    requested: &TransportKind,
    local: &RankInfo,
    peer: &RankInfo,
    peer_offers_shm: bool,
    rdma: RdmaOffers,
) -> Result<LinkKind, String> {
    let same_host = local.host_id == peer.host_id;
    match requested {
        TransportKind::Mem(_) => Ok(LinkKind::Mem),
        TransportKind::Tcp => Ok(LinkKind::Tcp),
        TransportKind::Auto if same_host && peer_offers_shm => Ok(LinkKind::Shm),
        TransportKind::Auto if !same_host && rdma.local && rdma.peer => Ok(LinkKind::Rdma),
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
        TransportKind::Rdma if rdma.local && rdma.peer => Ok(LinkKind::Rdma),
        TransportKind::Rdma => Err(format!(
            "transport rdma was requested but {} has no usable RDMA device (use auto or tcp)",
            if rdma.local {
                peer.label()
            } else {
                local.label()
            }
        )),
    }
}

/// Whether each end of a link published an rdma endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaOffers {
    pub local: bool,
    pub peer: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcl_backends::{DeviceCapabilities, DeviceInfo, Vendor};
    use bcl_transport::PeerAddress;

    fn info(rank: usize, host: &str, vendor: Vendor) -> RankInfo {
        RankInfo {
            rank,
            hostname: host.into(),
            host_id: host.into(),
            pid: 1,
            health: None,
            nic: None,
            device: DeviceInfo {
                vendor,
                model: String::new(),
                index: 0,
                host_id: host.into(),
                capabilities: DeviceCapabilities {
                    host_addressable: true,
                    external_memory: false,
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
        assert_eq!(ring_order(&infos), vec![0, 2, 3, 1, 4]);
        assert!(infos[2].label().0.contains("rank 2 (host b"));
    }

    #[test]
    fn hosts_follow_the_host_ids_unless_a_topology_is_set() {
        let infos = vec![
            info(0, "b", Vendor::Cpu),
            info(1, "a", Vendor::Cpu),
            info(2, "b", Vendor::Cpu),
            info(3, "a", Vendor::Cpu),
        ];
        let (hosts, ring) = hosts_and_ring(&infos, None).expect("discovered");
        assert_eq!(hosts, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(ring, vec![0, 2, 1, 3]);
        let spec = TopologySpec::Grid {
            hosts: 2,
            per_host: 2,
        };
        let (hosts, ring) = hosts_and_ring(&infos, Some(&spec)).expect("set");
        assert_eq!(hosts, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(ring, vec![0, 1, 2, 3]);
        assert_eq!(describe_hosts(&hosts), "2 hosts: [0, 1] [2, 3]");
        let three = TopologySpec::Grid {
            hosts: 3,
            per_host: 1,
        };
        let e = hosts_and_ring(&infos, Some(&three)).expect_err("wrong size");
        assert!(e.to_string().contains("the world has 4"), "{e}");
    }

    #[test]
    fn auto_links_same_host_peers_by_shared_memory() {
        let (a0, a1, b) = (
            info(0, "a", Vendor::Cpu),
            info(1, "a", Vendor::Sim),
            info(2, "b", Vendor::Cpu),
        );
        let auto = TransportKind::Auto;
        let none = RdmaOffers::default();
        assert_eq!(choose_link(&auto, &a0, &a1, true, none), Ok(LinkKind::Shm));
        assert_eq!(choose_link(&auto, &a1, &a0, true, none), Ok(LinkKind::Shm));
        assert_eq!(choose_link(&auto, &a0, &a1, false, none), Ok(LinkKind::Tcp));
        assert_eq!(choose_link(&auto, &a0, &b, true, none), Ok(LinkKind::Tcp));
        assert_eq!(
            choose_link(&TransportKind::Tcp, &a0, &a1, true, none),
            Ok(LinkKind::Tcp)
        );
        let e = choose_link(&TransportKind::Shm, &a0, &b, true, none).expect_err("other host");
        assert!(
            e.contains("rank 2 (host b") && e.contains("another host"),
            "{e}"
        );
    }

    #[test]
    fn auto_links_other_hosts_by_rdma_where_both_offer_it() {
        let (a0, a1, b) = (
            info(0, "a", Vendor::Cpu),
            info(1, "a", Vendor::Cpu),
            info(2, "b", Vendor::Sim),
        );
        let auto = TransportKind::Auto;
        let both = RdmaOffers {
            local: true,
            peer: true,
        };
        let peer_lacks = RdmaOffers {
            local: true,
            peer: false,
        };
        assert_eq!(choose_link(&auto, &a0, &b, true, both), Ok(LinkKind::Rdma));
        assert_eq!(choose_link(&auto, &b, &a0, true, both), Ok(LinkKind::Rdma));
        // Same host: shared memory still wins; one end without a device: tcp.
        assert_eq!(choose_link(&auto, &a0, &a1, true, both), Ok(LinkKind::Shm));
        assert_eq!(
            choose_link(&auto, &a0, &b, true, peer_lacks),
            Ok(LinkKind::Tcp)
        );
        let rdma = TransportKind::Rdma;
        assert_eq!(choose_link(&rdma, &a0, &a1, true, both), Ok(LinkKind::Rdma));
        let e = choose_link(&rdma, &a0, &b, true, peer_lacks).expect_err("no device");
        assert!(
            e.contains("rank 2 (host b") && e.contains("no usable RDMA device"),
            "{e}"
        );
        let e = choose_link(&rdma, &a0, &b, true, RdmaOffers::default()).expect_err("none");
        assert!(e.contains("rank 0 (host a"), "{e}");
    }
}
