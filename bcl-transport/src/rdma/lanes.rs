//! Several queue pairs per peer, spread over the devices a host has: `n` lanes, each a whole
//! [`RdmaTransport`] (its own device, setup socket, QPs, rings, credits and failover), and
//! every tag bound to one lane (`tag % n`), so the order per tag that the transport contract
//! promises holds lane by lane while a collective's slices, which carry consecutive tags, go
//! out over every lane at once.
//!
//! Failover, lane first: a lane whose QP to a peer fails moves that link to tcp (see the
//! parent module), sends over tcp what it already held, then seals it: a `Moved` frame names
//! the lane that carries this side's later messages of those tags, the next one still on RDMA
//! to that peer (`k+1, k+2, …` round the lanes). A receiver takes a tag's messages from its
//! own lane until that lane has none left and the peer's `Moved` has come, then from the lane
//! it names: so the order per tag holds across the move. With no lane left on RDMA the link
//! stays on tcp. Every move is one path change: "rdma rxe1 port 1 -> rdma rxe0 port 1", or
//! "-> tcp". A move only ever points at a lane still on RDMA and a lane on tcp never returns,
//! so the moves of one peer form chains, never a circle.
//!
//! The published address lists the lanes' setup addresses, separated by `,`; both ends must
//! run the same number of lanes (an error naming the peer otherwise).

use super::{RdmaConfig, RdmaTransport};
use crate::error::TransportError;
use crate::keys::KeyMap;
use crate::transport::{
    Capabilities, Landing, PathChange, PeerAddress, Readiness, Received, Tag, Transport,
};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Lanes a host may run per peer.
pub const MAX_LANES: usize = 8;

/// `n` rdma endpoints of one rank, one lane each.
#[derive(Debug)]
pub struct RdmaLanes {
    pub(super) lanes: Vec<RdmaTransport>,
    address: PeerAddress,
    /// Each lane's path changes acted on so far, and every change as (lane, index) in the
    /// order they happened: the list `path_changes` reports only ever grows at its end.
    seen: Vec<usize>,
    changes: Vec<(usize, usize)>,
    /// (peer, lane) -> the lane that carries this side's later messages of that lane's tags.
    sent_to: KeyMap<(usize, usize), usize>,
}

impl RdmaLanes {
    /// `lanes` endpoints with `config`, lane `k` on `devices[k % devices.len()]` (`None`: the
    /// first device with an active port). Err: as [`RdmaTransport::bind`], or a lane count
    /// outside 1..=[`MAX_LANES`].
    pub fn bind(
        config: RdmaConfig,
        devices: &[Option<String>],
        lanes: usize,
    ) -> Result<Self, TransportError> {
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(TransportError::Unavailable {
                transport: "rdma",
                reason: format!("{lanes} queue pairs per peer (1..={MAX_LANES})"),
            });
        }
        let none = [None];
        let devices = if devices.is_empty() {
            &none[..]
        } else {
            devices
        };
        let lanes = (0..lanes)
            .map(|k| {
                let mut c = config.clone();
                c.device = devices[k % devices.len()].clone();
                RdmaTransport::bind(c)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let joined: Vec<u8> = (lanes.iter().map(|l| l.address().as_bytes()))
            .collect::<Vec<_>>()
            .join(&b',');
        let address = PeerAddress::new(joined).map_err(|reason| TransportError::Unavailable {
            transport: "rdma",
            reason: format!("the lanes' addresses: {reason}"),
        })?;
        let seen = vec![0; lanes.len()];
        Ok(RdmaLanes {
            lanes,
            address,
            seen,
            changes: Vec::new(),
            sent_to: KeyMap::default(),
        })
    }

    /// "rxe0 port 1, rxe1 port 1".
    pub fn device_label(&self) -> String {
        let labels: Vec<String> = self.lanes.iter().map(|l| l.device_label()).collect();
        labels.join(", ")
    }

    pub(super) fn lane(&mut self, tag: Tag) -> &mut RdmaTransport {
        let n = self.lanes.len() as u64;
        &mut self.lanes[(tag % n) as usize]
    }

    /// Act on links that moved to tcp since the last call: seal each towards the next lane
    /// still on RDMA to that peer. Called at the end of every method that can move a link
    /// (`try_send`, `progress`, `after_wait`), so no other method sees one unsealed.
    fn reroute(&mut self) {
        let n = self.lanes.len();
        for k in 0..n {
            let count = self.lanes[k].path_change_count();
            while self.seen[k] < count {
                let index = self.seen[k];
                self.seen[k] += 1;
                self.changes.push((k, index));
                let Some(peer) = self.lanes[k].path_change(index).map(|c| c.peer) else {
                    continue;
                };
                let next = (1..n)
                    .map(|d| (k + d) % n)
                    .find(|&j| self.lanes[j].on_rdma(peer));
                if let Some(j) = next {
                    let to = self.lanes[j].device_label();
                    self.lanes[k].seal(peer, j as u8, &to);
                    self.sent_to.insert((peer, k), j);
                }
            }
        }
    }

    /// The lane this side's next message to `peer` under `tag` goes over: the tag's own, or
    /// where its seals lead (a chain: see the module comment).
    fn send_lane(&self, peer: usize, tag: Tag) -> usize {
        let n = self.lanes.len();
        let mut k = (tag % n as u64) as usize;
        for _ in 0..n {
            match self.sent_to.get(&(peer, k)) {
                Some(&j) => k = j,
                None => break,
            }
        }
        k
    }

    /// The lane the next message from `peer` under `tag` arrives on: the tag's own until it
    /// holds none of them and the peer has moved it, then the one the peer named. Err: the
    /// peer named a lane this host does not run, or its moves go round in a circle.
    fn recv_lane(&self, peer: usize, tag: Tag) -> Result<usize, TransportError> {
        let n = self.lanes.len();
        let mut k = (tag % n as u64) as usize;
        // A peer's `Moved` is read only on a link this side has moved too (a change here).
        if self.changes.is_empty() {
            return Ok(k);
        }
        for _ in 0..n {
            if self.lanes[k].has_arrived(peer, tag) {
                return Ok(k);
            }
            match self.lanes[k].moved_to(peer).map(usize::from) {
                None => return Ok(k),
                Some(j) if j < n && j != k => k = j,
                Some(j) => return Err(self.bad_move(peer, format!("lane {k} to lane {j} of {n}"))),
            }
        }
        Err(self.bad_move(peer, format!("its lanes round in a circle (tag {tag})")))
    }

    fn bad_move(&self, peer: usize, what: String) -> TransportError {
        TransportError::Protocol {
            peer,
            addr: self.device_label(),
            reason: format!("rank {peer} moved {what}"),
        }
    }
}

impl Transport for RdmaLanes {
    fn capabilities(&self) -> &Capabilities {
        self.lanes[0].capabilities()
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
        let n = self.lanes.len();
        let mut per_lane: Vec<Vec<(usize, PeerAddress)>> = vec![Vec::new(); n];
        for (peer, address) in peers {
            let parts: Vec<&[u8]> = address.as_bytes().split(|b| *b == b',').collect();
            if parts.len() != n {
                return Err(TransportError::Protocol {
                    peer: *peer,
                    addr: String::from_utf8_lossy(address.as_bytes()).into_owned(),
                    reason: format!(
                        "rank {peer} runs {} rdma queue pairs per peer, this rank {n} (BCL_RDMA_QPS and BCL_RDMA_DEVICE must agree)",
                        parts.len()
                    ),
                });
            }
            for (k, part) in parts.into_iter().enumerate() {
                let address =
                    PeerAddress::new(part.to_vec()).map_err(|reason| TransportError::Protocol {
                        peer: *peer,
                        addr: String::new(),
                        reason,
                    })?;
                per_lane[k].push((*peer, address));
            }
        }
        for (lane, peers) in self.lanes.iter_mut().zip(&per_lane) {
            lane.connect(local_rank, peers, deadline)?;
        }
        Ok(())
    }

    fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError> {
        let k = self.send_lane(peer, tag);
        let sent = self.lanes[k].try_send(peer, tag, data);
        self.reroute();
        sent
    }

    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
        let k = self.recv_lane(peer, tag)?;
        self.lanes[k].try_recv(peer, tag)
    }

    fn try_recv_with(
        &mut self,
        peer: usize,
        tag: Tag,
        consume: &mut dyn FnMut(&[u8], Option<Duration>),
    ) -> Result<bool, TransportError> {
        let k = self.recv_lane(peer, tag)?;
        self.lanes[k].try_recv_with(peer, tag, consume)
    }

    fn try_recv_into(
        &mut self,
        peer: usize,
        tag: Tag,
        dest: &mut [u8],
    ) -> Result<Landing, TransportError> {
        let k = self.recv_lane(peer, tag)?;
        self.lanes[k].try_recv_into(peer, tag, dest)
    }

    fn release(&mut self, message: Received) {
        self.lane(message.tag).release(message)
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        let mut moved = false;
        let mut result = Ok(());
        for lane in &mut self.lanes {
            match lane.progress() {
                Ok(m) => moved |= m,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.reroute();
        result.map(|()| moved)
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let mut fds = Vec::new();
        crate::transport::sleep_prepared(self, &mut fds, timeout).map_err(|source| {
            TransportError::Setup {
                what: format!(
                    "poll(2) on the completion channels of {}",
                    self.device_label()
                ),
                source,
            }
        })
    }

    /// Every lane prepared (each is followed by its `after_wait`); ready if any is.
    fn prepare_wait(&mut self, fds: &mut Vec<(RawFd, bool)>) -> Readiness {
        let mut all = Readiness::Sleep;
        for lane in &mut self.lanes {
            if let Readiness::Ready = lane.prepare_wait(fds) {
                all = Readiness::Ready;
            }
        }
        all
    }

    fn after_wait(&mut self) {
        for lane in &mut self.lanes {
            lane.after_wait();
        }
        self.reroute();
    }

    /// A peer refused on any lane goes over tcp altogether (both ends refuse a lane alike).
    fn take_refused(&mut self) -> Vec<(usize, String)> {
        let mut refused: Vec<(usize, String)> = Vec::new();
        for lane in &mut self.lanes {
            for (peer, reason) in lane.take_refused() {
                if !refused.iter().any(|(p, _)| *p == peer) {
                    refused.push((peer, reason));
                }
            }
        }
        refused
    }

    fn path_changes(&self) -> Vec<PathChange> {
        (self.changes.iter())
            .filter_map(|&(k, i)| self.lanes[k].path_change(i).cloned())
            .collect()
    }

    fn path_change_count(&self) -> usize {
        self.changes.len()
    }

    fn flushed(&self) -> bool {
        self.lanes.iter().all(|l| l.flushed())
    }

    fn peer_lost(&self, peer: usize) -> bool {
        self.lanes.iter().all(|l| l.peer_lost(peer))
    }
}
