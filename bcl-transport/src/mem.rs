//! `mem`: the in-process transport, for ranks that are threads of one process.
//!
//! A [`MemFabric`] joins N endpoints. Each endpoint has an inbox keyed by (sender, tag);
//! `try_send` copies into a pooled buffer and delivers it at once (or later, for a throttled
//! link). Tests reach the [`Faults`] of the fabric to drop a peer, stall a link or throttle it.

use crate::error::TransportError;
use crate::keys::KeyMap;
use crate::transport::{Capabilities, MemoryKind, PeerAddress, Received, Tag, Transport};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CAPABILITIES: Capabilities = Capabilities {
    name: "mem",
    max_message: 1 << 30,
    max_queued_per_peer: 64 << 20,
    memory: &[MemoryKind::Host],
};

struct Pending {
    deliver_at: Instant,
    data: Vec<u8>,
}

#[derive(Default)]
struct Inbox {
    messages: KeyMap<(usize, Tag), VecDeque<Pending>>,
    /// Bytes waiting here per sender: `try_send` answers "not now" past
    /// `max_queued_per_peer`, as a socket or a ring would.
    queued_from: HashMap<usize, usize>,
}

/// Faults a test injects into the fabric.
#[derive(Default, Debug)]
struct FaultState {
    dropped: HashSet<usize>,
    stalled: HashSet<(usize, usize)>,
    /// (from, to) → bytes per second, and when the link is next free.
    throttled: HashMap<(usize, usize), (f64, Instant)>,
}

struct Shared {
    inboxes: Vec<Mutex<Inbox>>,
    arrivals: Vec<Condvar>,
    faults: Mutex<FaultState>,
    world: usize,
}

/// The medium joining the endpoints of one in-process communicator.
#[derive(Clone)]
pub struct MemFabric {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MemFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemFabric({} ranks)", self.shared.world)
    }
}

impl MemFabric {
    pub fn new(world: usize) -> Self {
        MemFabric {
            shared: Arc::new(Shared {
                inboxes: (0..world).map(|_| Mutex::new(Inbox::default())).collect(),
                arrivals: (0..world).map(|_| Condvar::new()).collect(),
                faults: Mutex::new(FaultState::default()),
                world,
            }),
        }
    }

    /// The endpoint of `rank`.
    pub fn endpoint(&self, rank: usize) -> MemTransport {
        MemTransport {
            shared: self.shared.clone(),
            rank,
            address: PeerAddress::new(format!("mem:{rank}").into_bytes())
                .unwrap_or_else(|_| unreachable!("short address")),
            pool: Vec::new(),
        }
    }

    /// Fault injection handle.
    pub fn faults(&self) -> Faults {
        Faults {
            shared: self.shared.clone(),
        }
    }
}

/// Injects faults into a [`MemFabric`].
#[derive(Clone)]
pub struct Faults {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Faults({:?})", self.shared.faults.lock())
    }
}

impl Faults {
    /// `rank` is gone: everything sent to or expected from it fails with `PeerClosed`.
    pub fn drop_peer(&self, rank: usize) {
        self.shared.faults.lock().dropped.insert(rank);
        self.wake_all();
    }

    /// Messages on `from → to` are held until [`Faults::resume_link`].
    pub fn stall_link(&self, from: usize, to: usize) {
        self.shared.faults.lock().stalled.insert((from, to));
    }

    pub fn resume_link(&self, from: usize, to: usize) {
        self.shared.faults.lock().stalled.remove(&(from, to));
        self.wake_all();
    }

    /// Messages on `from → to` move at `bytes_per_second`.
    pub fn throttle_link(&self, from: usize, to: usize, bytes_per_second: f64) {
        self.shared
            .faults
            .lock()
            .throttled
            .insert((from, to), (bytes_per_second, Instant::now()));
    }

    fn wake_all(&self) {
        for c in &self.shared.arrivals {
            c.notify_all();
        }
    }
}

/// One rank's endpoint of a [`MemFabric`].
pub struct MemTransport {
    shared: Arc<Shared>,
    rank: usize,
    address: PeerAddress,
    pool: Vec<Vec<u8>>,
}

impl std::fmt::Debug for MemTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemTransport(rank {})", self.rank)
    }
}

impl MemTransport {
    fn check_peer(&self, peer: usize) -> Result<(), TransportError> {
        if peer >= self.shared.world {
            return Err(TransportError::UnknownPeer { peer });
        }
        let faults = self.shared.faults.lock();
        for r in [peer, self.rank] {
            if faults.dropped.contains(&r) {
                return Err(closed(r));
            }
        }
        Ok(())
    }
}

fn closed(peer: usize) -> TransportError {
    TransportError::PeerClosed {
        peer,
        addr: format!("mem:{peer}"),
    }
}

impl Transport for MemTransport {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    fn address(&self) -> &PeerAddress {
        &self.address
    }

    fn connect(
        &mut self,
        _local_rank: usize,
        peers: &[(usize, PeerAddress)],
        _deadline: Instant,
    ) -> Result<(), TransportError> {
        for (peer, addr) in peers {
            if addr.as_bytes() != format!("mem:{peer}").as_bytes() {
                return Err(TransportError::BadAddress {
                    peer: *peer,
                    reason: format!("{addr:?} is not a mem address of this fabric"),
                });
            }
            self.check_peer(*peer)?;
        }
        Ok(())
    }

    fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError> {
        self.check_peer(peer)?;
        if data.len() > CAPABILITIES.max_message {
            return Err(TransportError::TooLarge {
                peer,
                len: data.len(),
                max: CAPABILITIES.max_message,
            });
        }
        let mut inbox = self.shared.inboxes[peer].lock();
        let queued = inbox.queued_from.get(&self.rank).copied().unwrap_or(0);
        if queued > 0 && queued + data.len() > CAPABILITIES.max_queued_per_peer {
            return Ok(false);
        }
        *inbox.queued_from.entry(self.rank).or_default() += data.len();
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        let link = (self.rank, peer);
        let deliver_at = {
            let mut faults = self.shared.faults.lock();
            let now = Instant::now();
            // A stalled link holds messages at the receiver (`try_recv` checks the stall).
            if let Some((rate, free)) = faults.throttled.get_mut(&link) {
                let start = (*free).max(now);
                *free = start + Duration::from_secs_f64(data.len() as f64 / *rate);
                *free
            } else {
                now
            }
        };
        inbox
            .messages
            .entry((self.rank, tag))
            .or_default()
            .push_back(Pending {
                deliver_at,
                data: buf,
            });
        self.shared.arrivals[peer].notify_all();
        Ok(true)
    }

    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
        if peer >= self.shared.world {
            return Err(TransportError::UnknownPeer { peer });
        }
        let (stalled, gone) = {
            let faults = self.shared.faults.lock();
            let stalled = faults.stalled.contains(&(peer, self.rank));
            let gone = [peer, self.rank]
                .into_iter()
                .find(|r| faults.dropped.contains(r));
            (stalled, gone)
        };
        let mut inbox = self.shared.inboxes[self.rank].lock();
        // What a lost peer sent before it went is still delivered; then its loss is an error.
        let Some(queue) = inbox.messages.get_mut(&(peer, tag)) else {
            return match gone {
                Some(r) if r == self.rank || !inbox.messages.keys().any(|(p, _)| *p == peer) => {
                    Err(closed(r))
                }
                _ => Ok(None),
            };
        };
        match queue.front() {
            Some(p) if !stalled && p.deliver_at <= Instant::now() => {}
            _ => return Ok(None),
        }
        let Some(p) = queue.pop_front() else {
            return Ok(None);
        };
        if queue.is_empty() {
            inbox.messages.remove(&(peer, tag));
        }
        if let Some(q) = inbox.queued_from.get_mut(&peer) {
            *q -= p.data.len();
        }
        Ok(Some(Received {
            peer,
            tag,
            data: p.data,
            transfer: None,
        }))
    }

    fn release(&mut self, message: Received) {
        if self.pool.len() < 64 {
            self.pool.push(message.data);
        }
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        Ok(false)
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let mut inbox = self.shared.inboxes[self.rank].lock();
        if inbox.messages.is_empty() {
            self.shared.arrivals[self.rank].wait_for(&mut inbox, timeout);
        } else {
            // Something is queued but may not be deliverable yet (throttled): nap briefly.
            drop(inbox);
            std::thread::sleep(timeout.min(Duration::from_micros(200)));
        }
        Ok(())
    }

    fn flushed(&self) -> bool {
        true
    }

    fn peer_lost(&self, peer: usize) -> bool {
        self.shared.faults.lock().dropped.contains(&peer)
            && !(self.shared.inboxes[self.rank].lock().messages.keys()).any(|(p, _)| *p == peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (MemFabric, MemTransport, MemTransport) {
        let f = MemFabric::new(2);
        let (a, b) = (f.endpoint(0), f.endpoint(1));
        (f, a, b)
    }

    #[test]
    fn tags_match_and_order_is_kept_per_tag() {
        let (_f, mut a, mut b) = pair();
        assert!(a.try_send(1, 7, b"first").expect("send"));
        assert!(a.try_send(1, 9, b"other").expect("send"));
        assert!(a.try_send(1, 7, b"second").expect("send"));
        assert!(b.try_recv(0, 8).expect("recv").is_none());
        let m = b.try_recv(0, 9).expect("recv").expect("arrived");
        assert_eq!(m.data, b"other");
        b.release(m);
        assert_eq!(
            b.try_recv(0, 7).expect("recv").expect("arrived").data,
            b"first"
        );
        assert_eq!(
            b.try_recv(0, 7).expect("recv").expect("arrived").data,
            b"second"
        );
    }

    #[test]
    fn dropped_peer_fails_both_directions() {
        let (f, mut a, mut b) = pair();
        f.faults().drop_peer(1);
        let e = a.try_send(1, 0, b"x").expect_err("dropped");
        assert!(
            matches!(e, TransportError::PeerClosed { peer: 1, .. }),
            "{e}"
        );
        assert!(b.try_recv(0, 0).is_err());
    }

    #[test]
    fn stalled_link_holds_messages_until_resumed() {
        let (f, mut a, mut b) = pair();
        f.faults().stall_link(0, 1);
        a.try_send(1, 1, b"held").expect("send");
        assert!(b.try_recv(0, 1).expect("recv").is_none());
        f.faults().resume_link(0, 1);
        assert_eq!(
            b.try_recv(0, 1).expect("recv").expect("arrived").data,
            b"held"
        );
    }

    #[test]
    fn throttled_link_delays_delivery() {
        let (f, mut a, mut b) = pair();
        f.faults().throttle_link(0, 1, 100_000.0); // 10 KB takes 100 ms
        a.try_send(1, 1, &[0u8; 10_000]).expect("send");
        assert!(b.try_recv(0, 1).expect("recv").is_none());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if b.try_recv(0, 1).expect("recv").is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "throttled message never arrived");
            b.wait(Duration::from_millis(5)).expect("wait");
        }
    }
}
