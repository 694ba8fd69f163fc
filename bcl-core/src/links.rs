//! The one module that names concrete transports: it opens this rank's endpoint for the
//! configured [`TransportKind`] before bootstrap, and afterwards routes every peer to a
//! transport ([`choose_link`]) and connects.

use crate::config::{CommConfig, TransportKind};
use crate::error::{Error, Result};
use crate::topology::{LinkKind, RankInfo, choose_link};
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
    tcp.max_frame = tcp.max_frame.max(config.slice_bytes);
    TcpTransport::bind(tcp).map_err(|e| Error::Bootstrap {
        rank,
        reason: e.to_string(),
    })
}

/// Open the endpoint `config.transport` asks for. Auto without shared memory (no `/dev/shm`,
/// say) falls back to tcp alone, with a warning.
pub(crate) fn open(rank: usize, config: &CommConfig, secret: Secret) -> Result<Endpoint> {
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
        TransportKind::Auto => {
            let tcp: Box<dyn Transport> = Box::new(tcp(rank, config, secret)?);
            match shm() {
                Ok(shm) => routed(vec![tcp, Box::new(shm)]),
                Err(e) => {
                    tracing::warn!(rank, error = %e, "shared memory unavailable; tcp to every peer");
                    routed(vec![tcp])
                }
            }
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
        let mut transport: Box<dyn Transport> = match self {
            Endpoint::Single(t, kind) => {
                for p in peers.iter().filter(|p| p.rank != rank) {
                    links[p.rank] = Some(kind);
                }
                t
            }
            Endpoint::Routed(mut routes) => {
                for p in peers.iter().filter(|p| p.rank != rank) {
                    let offers_shm = part_address(&p.address, "shm").is_some();
                    let kind = choose_link(&config.transport, me, p, offers_shm)
                        .map_err(|reason| Error::Bootstrap { rank, reason })?;
                    routes
                        .set_route(p.rank, kind.name())
                        .map_err(|reason| Error::Bootstrap { rank, reason })?;
                    links[p.rank] = Some(kind);
                }
                Box::new(routes)
            }
        };
        tracing::debug!(rank, ?links, "links chosen");
        transport
            .connect(rank, &connect, deadline)
            .map_err(|e| match e {
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
            })?;
        Ok((transport, links))
    }
}
