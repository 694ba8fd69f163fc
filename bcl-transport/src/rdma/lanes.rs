//! Several queue pairs per peer, spread over the devices a host has: `n` lanes, each a whole
//! [`RdmaTransport`] (its own device, setup socket, QPs, rings, credits and failover), and
//! every tag bound to one lane (`tag % n`), so the order per tag that the transport contract
//! promises holds lane by lane while a collective's slices, which carry consecutive tags, go
//! out over every lane at once. A lane whose QP fails moves to tcp alone; the others stay on
//! RDMA.
//!
//! The published address lists the lanes' setup addresses, separated by `,`; both ends must
//! run the same number of lanes (an error naming the peer otherwise).

use super::{RdmaConfig, RdmaTransport};
use crate::error::TransportError;
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
        Ok(RdmaLanes { lanes, address })
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
        self.lane(tag).try_send(peer, tag, data)
    }

    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
        self.lane(tag).try_recv(peer, tag)
    }

    fn try_recv_with(
        &mut self,
        peer: usize,
        tag: Tag,
        consume: &mut dyn FnMut(&[u8], Option<Duration>),
    ) -> Result<bool, TransportError> {
        self.lane(tag).try_recv_with(peer, tag, consume)
    }

    fn try_recv_into(
        &mut self,
        peer: usize,
        tag: Tag,
        dest: &mut [u8],
    ) -> Result<Landing, TransportError> {
        self.lane(tag).try_recv_into(peer, tag, dest)
    }

    fn release(&mut self, message: Received) {
        self.lane(message.tag).release(message)
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        let mut moved = false;
        for lane in &mut self.lanes {
            moved |= lane.progress()?;
        }
        Ok(moved)
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
        self.lanes.iter().flat_map(|l| l.path_changes()).collect()
    }

    fn path_change_count(&self) -> usize {
        self.lanes.iter().map(|l| l.path_change_count()).sum()
    }

    fn flushed(&self) -> bool {
        self.lanes.iter().all(|l| l.flushed())
    }

    fn peer_lost(&self, peer: usize) -> bool {
        self.lanes.iter().all(|l| l.peer_lost(peer))
    }
}
