//! `Routes`: one transport per peer, chosen by the core (shm for a peer on the same host, tcp
//! otherwise), behind one `Transport`.
//!
//! The address it publishes lists every part's address, `tcp=10.0.0.1:4000;shm=4711.0a1b…`, so
//! a peer can tell which transports this rank offers. The core sets a route per peer before
//! `connect`; each part then connects only with the peers routed to it. Sleeping: one `poll(2)`
//! over every part's descriptors (see [`Transport::prepare_wait`]).

use crate::error::TransportError;
use crate::transport::{
    Capabilities, Landing, MemoryKind, PeerAddress, Readiness, Received, Tag, Transport,
};
use std::time::{Duration, Instant};

/// Several transports behind one, each peer routed to one of them.
#[derive(Debug)]
pub struct Routes {
    parts: Vec<Box<dyn Transport>>,
    address: PeerAddress,
    capabilities: Capabilities,
    /// Part index per peer rank; peers never routed go to the first part.
    route: Vec<Option<usize>>,
    fds: Vec<(std::os::fd::RawFd, bool)>,
}

/// The address `name` part of a `Routes` address, if it offers one.
pub fn part_address(address: &PeerAddress, name: &str) -> Option<PeerAddress> {
    std::str::from_utf8(address.as_bytes())
        .ok()?
        .split(';')
        .filter_map(|part| part.split_once('='))
        .find(|(n, _)| *n == name)
        .and_then(|(_, a)| PeerAddress::new(a.as_bytes().to_vec()).ok())
}

impl Routes {
    /// Combine `parts` (at least one; distinct names). Fails when their addresses together
    /// exceed [`PeerAddress::MAX_LEN`].
    pub fn new(parts: Vec<Box<dyn Transport>>) -> Result<Self, String> {
        if parts.is_empty() {
            return Err("no transport to route to".into());
        }
        let mut text = String::new();
        for (i, p) in parts.iter().enumerate() {
            let addr = std::str::from_utf8(p.address().as_bytes())
                .map_err(|_| format!("the {} address is not text", p.capabilities().name))?;
            if i > 0 {
                text.push(';');
            }
            text.push_str(&format!("{}={addr}", p.capabilities().name));
        }
        let address = PeerAddress::new(text.into_bytes())?;
        let capabilities = Capabilities {
            name: "auto",
            max_message: parts
                .iter()
                .map(|p| p.capabilities().max_message)
                .min()
                .unwrap_or(0),
            max_queued_per_peer: parts
                .iter()
                .map(|p| p.capabilities().max_queued_per_peer)
                .min()
                .unwrap_or(0),
            memory: &[MemoryKind::Host],
        };
        Ok(Routes {
            parts,
            address,
            capabilities,
            route: Vec::new(),
            fds: Vec::new(),
        })
    }

    /// Send everything for `peer` through the part called `name` ("tcp", "shm").
    pub fn set_route(&mut self, peer: usize, name: &str) -> Result<(), String> {
        let index = self
            .parts
            .iter()
            .position(|p| p.capabilities().name == name)
            .ok_or_else(|| format!("this rank has no {name} transport"))?;
        if self.route.len() <= peer {
            self.route.resize(peer + 1, None);
        }
        self.route[peer] = Some(index);
        Ok(())
    }

    /// The name of the part `peer` is routed to.
    pub fn route_of(&self, peer: usize) -> &'static str {
        self.parts[self.index(peer)].capabilities().name
    }

    fn index(&self, peer: usize) -> usize {
        self.route.get(peer).copied().flatten().unwrap_or(0)
    }

    /// Route the peers a part refused at connect (see [`Transport::take_refused`]) to the tcp
    /// part and connect them there; both ends of each such pair do the same. Without a tcp part
    /// (the rdma transport forced) a refusal is an error naming the peer.
    fn fall_back_to_tcp(
        &mut self,
        local_rank: usize,
        peers: &[(usize, PeerAddress)],
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let tcp = self
            .parts
            .iter()
            .position(|p| p.capabilities().name == "tcp");
        for i in 0..self.parts.len() {
            let refused = self.parts[i].take_refused();
            let name = self.parts[i].capabilities().name;
            let Some((first, reason)) = refused.first() else {
                continue;
            };
            let Some(tcp) = tcp.filter(|&t| t != i) else {
                return Err(TransportError::Refused {
                    peer: *first,
                    transport: name,
                    reason: reason.clone(),
                });
            };
            let mut group = Vec::new();
            for (peer, reason) in refused {
                tracing::warn!(rank = local_rank, peer, %reason, "{name} refused; falling back to tcp for this peer");
                let address = peers
                    .iter()
                    .find(|(p, _)| *p == peer)
                    .and_then(|(_, a)| part_address(a, "tcp"))
                    .ok_or_else(|| TransportError::Refused {
                        peer,
                        transport: name,
                        reason: format!("{reason}, and it offers no tcp endpoint to fall back to"),
                    })?;
                if self.route.len() <= peer {
                    self.route.resize(peer + 1, None);
                }
                self.route[peer] = Some(tcp);
                group.push((peer, address));
            }
            self.parts[tcp].connect(local_rank, &group, deadline)?;
        }
        Ok(())
    }

    fn part(&mut self, peer: usize) -> &mut dyn Transport {
        let i = self.index(peer);
        self.parts[i].as_mut()
    }
}

impl Transport for Routes {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn address(&self) -> &PeerAddress {
        &self.address
    }

    fn connect(
        &mut self,
        local_rank: usize,
        peers: &[(usize, PeerAddress)],
        deadline: Instant,
    ) -> Result<(), TransportError> {
        let mut groups: Vec<Vec<(usize, PeerAddress)>> = vec![Vec::new(); self.parts.len()];
        for (peer, address) in peers {
            let i = self.index(*peer);
            let name = self.parts[i].capabilities().name;
            let part = part_address(address, name).ok_or_else(|| TransportError::BadAddress {
                peer: *peer,
                reason: format!("{address:?} offers no {name} endpoint"),
            })?;
            groups[i].push((*peer, part));
        }
        for (part, group) in self.parts.iter_mut().zip(groups) {
            if !group.is_empty() {
                part.connect(local_rank, &group, deadline)?;
            }
        }
        self.fall_back_to_tcp(local_rank, peers, deadline)
    }

    fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError> {
        self.part(peer).try_send(peer, tag, data)
    }

    fn try_send_filled(
        &mut self,
        peer: usize,
        tag: Tag,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<Option<bool>, TransportError> {
        self.part(peer).try_send_filled(peer, tag, len, fill)
    }

    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
        self.part(peer).try_recv(peer, tag)
    }

    fn try_recv_with(
        &mut self,
        peer: usize,
        tag: Tag,
        consume: &mut dyn FnMut(&[u8], Option<Duration>),
    ) -> Result<bool, TransportError> {
        self.part(peer).try_recv_with(peer, tag, consume)
    }

    fn try_recv_into(
        &mut self,
        peer: usize,
        tag: Tag,
        dest: &mut [u8],
    ) -> Result<Landing, TransportError> {
        self.part(peer).try_recv_into(peer, tag, dest)
    }

    fn release(&mut self, message: Received) {
        self.part(message.peer).release(message)
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        let mut moved = false;
        for p in self.parts.iter_mut() {
            moved |= p.progress()?;
        }
        Ok(moved)
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if self.parts.len() == 1 {
            return self.parts[0].wait(timeout);
        }
        let mut fds = std::mem::take(&mut self.fds);
        let slept = crate::transport::sleep_prepared(self, &mut fds, timeout);
        self.fds = fds;
        slept.map_err(|source| TransportError::Setup {
            what: "poll(2) on the transports' descriptors".into(),
            source,
        })
    }

    fn prepare_wait(&mut self, fds: &mut Vec<(std::os::fd::RawFd, bool)>) -> Readiness {
        let mut all = Readiness::Sleep;
        for p in self.parts.iter_mut() {
            match p.prepare_wait(fds) {
                Readiness::Sleep => {}
                Readiness::Ready => all = Readiness::Ready,
                Readiness::Unsupported if all == Readiness::Sleep => all = Readiness::Unsupported,
                Readiness::Unsupported => {}
            }
        }
        all
    }

    fn after_wait(&mut self) {
        for p in self.parts.iter_mut() {
            p.after_wait();
        }
    }

    fn flushed(&self) -> bool {
        self.parts.iter().all(|p| p.flushed())
    }

    fn limit_connections(&mut self, per_peer: Option<usize>) {
        for p in self.parts.iter_mut() {
            p.limit_connections(per_peer);
        }
    }

    fn peer_lost(&self, peer: usize) -> bool {
        self.parts[self.index(peer)].peer_lost(peer)
    }

    fn path_changes(&self) -> Vec<crate::transport::PathChange> {
        self.parts.iter().flat_map(|p| p.path_changes()).collect()
    }

    fn path_change_count(&self) -> usize {
        self.parts.iter().map(|p| p.path_change_count()).sum()
    }

    /// The lines of the part every routed peer goes to; none when they go to several.
    fn lines(&mut self) -> Option<&mut dyn crate::transport::Lines> {
        let mut routed = self.route.iter().flatten();
        let first = *routed.next()?;
        if routed.any(|&i| i != first) {
            return None;
        }
        self.parts[first].lines()
    }

    /// Lending, through the part each peer is routed to, where any part lends.
    fn lend(&mut self) -> Option<&mut dyn crate::transport::Lend> {
        if self.parts.iter_mut().any(|p| p.lend().is_some()) {
            Some(self)
        } else {
            None
        }
    }
}

impl crate::transport::Lend for Routes {
    fn reaches(&mut self, peer: usize) -> bool {
        self.part(peer).lend().is_some_and(|l| l.reaches(peer))
    }

    fn offer(
        &mut self,
        peer: usize,
        tag: Tag,
        data: &[u8],
    ) -> Result<Option<crate::transport::LoanId>, TransportError> {
        let route = self.route_of(peer);
        match self.part(peer).lend() {
            Some(l) => l.offer(peer, tag, data),
            None => Err(TransportError::Protocol {
                peer,
                addr: format!("route {route}"),
                reason: "a loan to a peer whose transport does not lend (a core bug)".into(),
            }),
        }
    }

    fn returned(
        &mut self,
        peer: usize,
        loan: crate::transport::LoanId,
    ) -> Result<bool, TransportError> {
        match self.part(peer).lend() {
            Some(l) => l.returned(peer, loan),
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemFabric;

    #[test]
    fn the_published_address_lists_every_part_and_routes_pick_by_name() {
        let fabric = MemFabric::new(2);
        let mut routes = Routes::new(vec![Box::new(fabric.endpoint(0))]).expect("routes");
        let text = String::from_utf8(routes.address().as_bytes().to_vec()).expect("text");
        assert!(text.starts_with("mem="), "{text}");
        assert_eq!(
            routes.route_of(1),
            "mem",
            "unrouted peers use the first part"
        );
        let e = routes.set_route(1, "shm").expect_err("no shm part");
        assert!(e.contains("no shm transport"), "{e}");
        let both = PeerAddress::new(b"tcp=10.0.0.1:4000;shm=4711.0123456789abcdef".to_vec())
            .expect("address");
        assert_eq!(
            part_address(&both, "shm").map(|a| a.as_bytes().to_vec()),
            Some(b"4711.0123456789abcdef".to_vec())
        );
        assert_eq!(
            part_address(&both, "tcp").map(|a| a.as_bytes().to_vec()),
            Some(b"10.0.0.1:4000".to_vec())
        );
        assert_eq!(part_address(&both, "rdma"), None);
        let garbage = PeerAddress::new(vec![0xff, b'=', 1]).expect("address");
        assert_eq!(part_address(&garbage, "tcp"), None);
        assert!(Routes::new(Vec::new()).is_err());
    }

    /// A part under another name that delegates to a mem endpoint and, when `refuse` is set,
    /// refuses every peer at connect (as the rdma transport does when a pair's setup fails).
    #[derive(Debug)]
    struct Named {
        inner: crate::mem::MemTransport,
        capabilities: Capabilities,
        refuse: bool,
        refused: Vec<(usize, String)>,
    }

    impl Named {
        fn new(inner: crate::mem::MemTransport, name: &'static str, refuse: bool) -> Box<Self> {
            let capabilities = Capabilities {
                name,
                ..inner.capabilities().clone()
            };
            Box::new(Named {
                inner,
                capabilities,
                refuse,
                refused: Vec::new(),
            })
        }
    }

    impl Transport for Named {
        fn capabilities(&self) -> &Capabilities {
            &self.capabilities
        }
        fn address(&self) -> &PeerAddress {
            self.inner.address()
        }
        fn connect(
            &mut self,
            local_rank: usize,
            peers: &[(usize, PeerAddress)],
            deadline: Instant,
        ) -> Result<(), TransportError> {
            if self.refuse {
                self.refused = peers
                    .iter()
                    .map(|(p, _)| (*p, "no pinned memory".into()))
                    .collect();
                return Ok(());
            }
            self.inner.connect(local_rank, peers, deadline)
        }
        fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError> {
            self.inner.try_send(peer, tag, data)
        }
        fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
            self.inner.try_recv(peer, tag)
        }
        fn release(&mut self, message: Received) {
            self.inner.release(message)
        }
        fn progress(&mut self) -> Result<bool, TransportError> {
            self.inner.progress()
        }
        fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
            self.inner.wait(timeout)
        }
        fn take_refused(&mut self) -> Vec<(usize, String)> {
            std::mem::take(&mut self.refused)
        }
        fn flushed(&self) -> bool {
            self.inner.flushed()
        }
        fn peer_lost(&self, peer: usize) -> bool {
            self.inner.peer_lost(peer)
        }
    }

    #[test]
    fn peers_a_part_refuses_go_over_tcp_and_without_tcp_the_refusal_is_an_error() {
        let (tcp, rdma) = (MemFabric::new(2), MemFabric::new(2));
        let mut ranks: Vec<Routes> = (0..2)
            .map(|r| {
                Routes::new(vec![
                    Named::new(tcp.endpoint(r), "tcp", false),
                    Named::new(rdma.endpoint(r), "rdma", true),
                ])
                .expect("routes")
            })
            .collect();
        let addresses: Vec<PeerAddress> = ranks.iter().map(|r| r.address().clone()).collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        for (rank, routes) in ranks.iter_mut().enumerate() {
            let peer = 1 - rank;
            routes.set_route(peer, "rdma").expect("route");
            routes
                .connect(rank, &[(peer, addresses[peer].clone())], deadline)
                .expect("connect falls back");
            assert_eq!(routes.route_of(peer), "tcp");
        }
        assert!(ranks[0].try_send(1, 7, b"over tcp").expect("send"));
        let until = Instant::now() + Duration::from_secs(5);
        let got = loop {
            ranks[0].progress().expect("progress");
            ranks[1].progress().expect("progress");
            if let Some(m) = ranks[1].try_recv(0, 7).expect("recv") {
                break m.data;
            }
            assert!(Instant::now() < until, "the message did not arrive");
        };
        assert_eq!(got, b"over tcp");

        let fabric = MemFabric::new(2);
        let mut alone =
            Routes::new(vec![Named::new(fabric.endpoint(0), "rdma", true)]).expect("routes");
        let peer_address = Routes::new(vec![Named::new(fabric.endpoint(1), "rdma", true)])
            .expect("routes")
            .address()
            .clone();
        let e = alone
            .connect(0, &[(1, peer_address)], deadline)
            .expect_err("no tcp to fall back to");
        assert!(
            matches!(
                e,
                TransportError::Refused {
                    peer: 1,
                    transport: "rdma",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("rdma could not connect with rank 1: no pinned memory"),
            "{e}"
        );
    }
}
