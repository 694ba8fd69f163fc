//! The one module that names concrete transports: it opens this rank's endpoint for the
//! configured [`TransportKind`] before bootstrap, and afterwards routes every peer to a
//! transport ([`choose_link`]) and connects.

use crate::config::{CommConfig, TransportKind};
use crate::error::{Error, Result};
use crate::peers::RankInfo;
use crate::topology::{LinkKind, RdmaOffers, choose_link};
use bcl_transport::routes::{Routes, part_address};
use bcl_transport::shm::{ShmConfig, ShmTransport};
use bcl_transport::tcp::{TcpConfig, TcpTransport};
use bcl_transport::{PeerAddress, Secret, Transport, TransportError};
use std::time::Instant;

/// The connected transport, and the kind of link to each rank (`None` for this rank).
pub(crate) type Connected = (Box<dyn Transport>, Vec<Option<LinkKind>>);

/// This rank's endpoint, between opening and connecting.
pub(crate) enum Endpoint {
    /// One transport for every peer (tcp, or the in-process fabric).
    Single(Box<dyn Transport>, LinkKind),
    /// A transport per peer (auto: shm and tcp; shm alone).
    Routed(Routes),
}

fn tcp(rank: usize, config: &CommConfig, secret: Secret) -> Result<TcpTransport> {
    let mut tcp = TcpConfig::new(secret);
    tcp.bind_ip = config.bind_ip;
    tcp.sockets_per_peer = config.sockets_per_peer;
    tcp.socket_buffer = config.socket_buffer;
    tcp.congestion = config.tcp_congestion.clone();
    tcp.max_frame = tcp.max_frame.max(config.slice_bytes);
    TcpTransport::bind(tcp).map_err(|e| Error::Bootstrap {
        rank,
        reason: e.to_string(),
    })
}

/// This rank's rdma endpoint. Err: the build has no rdma transport, or this machine cannot run
/// it (no libibverbs, no device, no active port): the reason, for a message or a log line.
#[cfg(feature = "rdma")]
fn rdma(config: &CommConfig, secret: Secret) -> std::result::Result<Box<dyn Transport>, String> {
    use bcl_transport::rdma::{RdmaConfig, RdmaTransport, lanes::RdmaLanes};
    let mut rdma = RdmaConfig::new(secret);
    rdma.bind_ip = config.bind_ip;
    rdma.tcp_failover = config.rdma_tcp_failover;
    rdma.max_message = rdma.max_message.max(config.slice_bytes);
    let devices: Vec<Option<String>> = match &config.rdma_device {
        None => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|d| Some(d.trim().to_string()))
            .collect(),
    };
    let lanes = config.rdma_qps.max(devices.len());
    if lanes == 1 {
        rdma.device = devices.into_iter().next().flatten();
        return RdmaTransport::bind(rdma)
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .map_err(|e| e.to_string());
    }
    RdmaLanes::bind(rdma, &devices, lanes)
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "rdma"))]
fn rdma(_: &CommConfig, _: Secret) -> std::result::Result<Box<dyn Transport>, String> {
    Err("rdma unavailable: this build has no rdma transport (build with --features rdma)".into())
}

/// Open this rank's endpoint: the transport passed in, else the one `config.transport` asks
/// for. Auto without shared memory (no `/dev/shm`, say) falls back to tcp alone, with a
/// warning; auto adds rdma where this rank can open a device, and goes without it (a debug
/// line; a warning where a device exists but failed).
pub(crate) fn open(
    rank: usize,
    config: &CommConfig,
    secret: Secret,
    passed_in: Option<Box<dyn Transport>>,
) -> Result<Endpoint> {
    if let Some(transport) = passed_in {
        let kind = LinkKind::Custom(transport.capabilities().name);
        return Ok(Endpoint::Single(transport, kind));
    }
    let shm = || ShmTransport::bind(ShmConfig::new(secret));
    let routed = |parts: Vec<Box<dyn Transport>>| {
        Routes::new(parts)
            .map(Endpoint::Routed)
            .map_err(|reason| Error::Bootstrap { rank, reason })
    };
    match &config.transport {
        TransportKind::Mem(fabric) => Ok(Endpoint::Single(
            Box::new(fabric.endpoint(rank)),
            LinkKind::Mem,
        )),
        TransportKind::Tcp => Ok(Endpoint::Single(
            Box::new(tcp(rank, config, secret)?),
            LinkKind::Tcp,
        )),
        TransportKind::Shm => routed(vec![Box::new(shm().map_err(|e| Error::Bootstrap {
            rank,
            reason: format!("transport shm was requested but is unavailable: {e}"),
        })?)]),
        TransportKind::Rdma => routed(vec![rdma(config, secret).map_err(|reason| {
            Error::Bootstrap {
                rank,
                reason: format!("transport rdma was requested but is unavailable: {reason}"),
            }
        })?]),
        TransportKind::Auto => {
            let tcp: Box<dyn Transport> = Box::new(tcp(rank, config, secret)?);
            let mut parts = vec![tcp];
            match shm() {
                Ok(shm) => parts.push(Box::new(shm)),
                Err(e) => {
                    tracing::warn!(rank, error = %e, "shared memory unavailable; tcp to every peer");
                }
            }
            match rdma(config, secret) {
                Ok(rdma) => parts.push(rdma),
                Err(reason)
                    if reason.contains("no RDMA devices")
                        || reason.contains("no rdma transport")
                        || reason.contains("libibverbs not available") =>
                {
                    tracing::debug!(rank, %reason, "no rdma; tcp between hosts");
                }
                Err(reason) => {
                    tracing::warn!(rank, %reason, "rdma setup failed; falling back to tcp between hosts");
                }
            }
            routed(parts)
        }
    }
}

/// Whether every rank is on one host and published a shared-memory endpoint, so that every
/// link is shm: a fact every rank derives alike from the same bootstrap data.
pub(crate) fn all_shared_memory(peers: &[RankInfo]) -> bool {
    peers
        .iter()
        .all(|p| p.host_id == peers[0].host_id && part_address(&p.address, "shm").is_some())
}

/// Whether every link between two ranks with one host id is shared memory (both published
/// an shm endpoint and the transport is chosen automatically or is shm): the same on every
/// rank.
pub(crate) fn shm_inside_hosts(peers: &[RankInfo], transport: &TransportKind) -> bool {
    matches!(transport, TransportKind::Auto | TransportKind::Shm)
        && peers.iter().all(|p| {
            part_address(&p.address, "shm").is_some()
                || peers
                    .iter()
                    .all(|q| q.rank == p.rank || q.host_id != p.host_id)
        })
}

impl Endpoint {
    /// The address to publish at bootstrap.
    pub(crate) fn address(&self) -> &PeerAddress {
        match self {
            Endpoint::Single(t, _) => t.address(),
            Endpoint::Routed(r) => r.address(),
        }
    }

    /// Choose each peer's link, connect, and return the transport and the link per rank
    /// (`None` for this rank).
    pub(crate) fn connect(
        self,
        config: &CommConfig,
        me: &RankInfo,
        peers: &[RankInfo],
        started: Instant,
        deadline: Instant,
    ) -> Result<Connected> {
        let rank = me.rank;
        let mut links = vec![None; peers.len()];
        let connect: Vec<(usize, PeerAddress)> = peers
            .iter()
            .filter(|p| p.rank != rank)
            .map(|p| (p.rank, p.address.clone()))
            .collect();
        let connect_with = |t: &mut dyn Transport| {
            t.connect(rank, &connect, deadline).map_err(|e| match e {
                TransportError::ConnectTimeout { missing, .. } => Error::BootstrapTimeout {
                    rank,
                    missing,
                    waited_s: started.elapsed().as_secs_f64(),
                    detail: "connecting the transport".into(),
                },
                other => Error::Bootstrap {
                    rank,
                    reason: other.to_string(),
                },
            })
        };
        let transport: Box<dyn Transport> = match self {
            Endpoint::Single(mut t, kind) => {
                for p in peers.iter().filter(|p| p.rank != rank) {
                    links[p.rank] = Some(kind);
                }
                connect_with(t.as_mut())?;
                t
            }
            Endpoint::Routed(mut routes) => {
                let local_rdma = part_address(&me.address, "rdma").is_some();
                for p in peers.iter().filter(|p| p.rank != rank) {
                    let offers_shm = part_address(&p.address, "shm").is_some();
                    let rdma = RdmaOffers {
                        local: local_rdma,
                        peer: part_address(&p.address, "rdma").is_some(),
                    };
                    let kind = choose_link(&config.transport, me, p, offers_shm, rdma)
                        .map_err(|reason| Error::Bootstrap { rank, reason })?;
                    routes
                        .set_route(p.rank, kind.name())
                        .map_err(|reason| Error::Bootstrap { rank, reason })?;
                }
                connect_with(&mut routes)?;
                // Connecting may move a peer to tcp (its rdma setup failed on either end).
                for p in peers.iter().filter(|p| p.rank != rank) {
                    links[p.rank] = LinkKind::from_name(routes.route_of(p.rank));
                }
                Box::new(routes)
            }
        };
        tracing::debug!(rank, ?links, "links chosen");
        Ok((transport, links))
    }
}
