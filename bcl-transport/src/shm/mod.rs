//! `shm`: ranks on one host exchange messages through single-producer/single-consumer rings in
//! POSIX shared memory, one ring per ordered pair of ranks.
//!
//! Setup (`connect`): each rank creates the rings it will read from (`/bcl.<pid>.<nonce>.<p>to<c>`,
//! mode 0600, with a proof of the communicator secret in the header), opens the rings it will
//! write to once their creators have filled them, and waits until its own rings' producers have
//! attached. Then every name is unlinked: from then on the segments live only as long as the
//! mappings, so a rank killed at any later point leaks nothing. A rank killed during setup leaves
//! names behind; the next endpoint created on the host removes names whose creator process no
//! longer exists ([`reclaim_stale`]).
//!
//! Data path: `try_send` copies a message straight into the peer's ring when it fits (else answers
//! "not now"); a message larger than half the ring is cut into fragments, the part that does not
//! fit yet kept in a pooled buffer until `progress` makes room. Arrived records stay in the ring
//! until the executor asks for them: `try_recv_with` hands a record to it in place (the reduction
//! reads the ring directly), and only records passed over on the way to another tag, or drained
//! because the ring is half full or its producer waits for room, are copied into pooled buffers.
//! Single copy: a message the core lends ([`Lend`]) travels as a loan record (where its bytes
//! lie in the sender's memory); the receiver copies them with `process_vm_readv` straight into
//! its destination and gives the loan back through a word in the ring (see `ring.rs`). Each
//! rank finds out at setup whether it may read each peer's memory and says so in the ring;
//! peers lend only to ranks that can.
//! Wake-ups: a side about to sleep sets its `parked` flag in
//! the ring (see `ring.rs`); the other side then rings its doorbell, a datagram to an abstract
//! unix socket named after the endpoint, which `wait` sleeps on with `poll(2)` beside a pidfd per
//! peer, so a peer's death wakes it too.

mod connect;
mod lines;
mod ptrace_rules;
mod ring;
pub(crate) use ring::fuzz_consumer;
mod sys;

pub use connect::reclaim_stale;
pub use ptrace_rules::sibling_reads_permitted;
/// The largest payload of one post on the lines ([`Lines::max_payload`]).
pub const LINES_MAX_PAYLOAD: usize = lines::MAX_PAYLOAD;

use crate::auth::Secret;
use crate::error::TransportError;
use crate::keys::KeyMap;
use crate::transport::{
    Capabilities, Collected, Landing, Lend, Lines, LoanId, MemoryKind, PeerAddress, Readiness,
    Received, Tag, Transport,
};
use ring::{Consumer, Producer};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

/// Settings of a shared-memory endpoint.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// The communicator's secret: the rings' headers carry proofs of it, so that two
    /// communicators (or a stale segment) are never mixed up.
    pub secret: Secret,
    /// Data bytes of each ring (rounded up to a power of two, at least 64 KiB).
    pub ring_bytes: usize,
    /// The largest message accepted.
    pub max_message: usize,
}

impl ShmConfig {
    pub fn new(secret: Secret) -> Self {
        ShmConfig {
            secret,
            ring_bytes: 4 << 20,
            max_message: 1 << 30,
        }
    }
}

const POOL_LIMIT: usize = 256;

/// The remainder of a message too large for the ring, waiting for room.
#[derive(Debug)]
struct Pending {
    tag: Tag,
    data: Vec<u8>,
    sent: usize,
}

#[derive(Debug)]
struct Peer {
    /// "shm endpoint 4711.0a1b…": how errors name the link.
    label: String,
    pid: u32,
    pidfd: Option<OwnedFd>,
    doorbell: SocketAddr,
    out: Producer,
    inp: Consumer,
    pending: Option<Pending>,
    /// The message being reassembled from fragments.
    partial: Vec<u8>,
    partial_tag: Option<Tag>,
    /// This rank's proof, where the peer reads it to find out whether it can read this
    /// process's memory (kept for as long as the ring).
    _probe: Box<[u8; 32]>,
    /// The number of the next loan to the peer (from 1).
    next_loan: LoanId,
    /// Loans to the peer not yet seen back.
    lent: Vec<LoanId>,
}

/// A message a peer lent: `len` bytes at `addr` in its process.
#[derive(Clone, Copy, Debug)]
struct Loan {
    id: LoanId,
    addr: u64,
    len: usize,
}

/// A message taken off a ring before it was asked for.
#[derive(Debug)]
enum Queued {
    Bytes(Vec<u8>),
    Loan(Loan),
}

/// What looking for a message found.
enum Found {
    Nothing,
    /// Handed to the caller's closure where it lay in the ring.
    Delivered,
    Bytes(Vec<u8>),
    Loan(Loan),
}

impl Peer {
    fn gone(&self) -> bool {
        self.inp.producer_closed() || self.out.consumer_closed() || !self.alive()
    }

    fn alive(&self) -> bool {
        match &self.pidfd {
            Some(fd) => !crate::poll::readable_now(fd.as_raw_fd()),
            None => sys::process_exists(self.pid),
        }
    }
}

/// A shared-memory endpoint of one rank.
#[derive(Debug)]
pub struct ShmTransport {
    config: ShmConfig,
    capabilities: Capabilities,
    address: PeerAddress,
    /// "PID.NONCE": names this endpoint's rings and doorbell.
    id: String,
    doorbell: UnixDatagram,
    /// By rank; `None` for ranks this endpoint is not connected with.
    peers: Vec<Option<Peer>>,
    inbox: KeyMap<(usize, Tag), VecDeque<Queued>>,
    pool: Vec<Vec<u8>>,
    /// Ring names this endpoint created and has not unlinked yet.
    created: Vec<String>,
}

fn doorbell_name(id: &str) -> String {
    format!("bcl-shm.{id}")
}

fn ring_name(consumer_id: &str, producer: usize, consumer: usize) -> String {
    format!("/bcl.{consumer_id}.{producer}to{consumer}")
}

impl ShmTransport {
    /// A fresh endpoint: removes stale rings of dead processes, checks that shared memory can be
    /// made, binds the doorbell.
    pub fn bind(config: ShmConfig) -> Result<Self, TransportError> {
        reclaim_stale();
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| TransportError::Setup {
            what: "drawing a shm endpoint nonce".into(),
            source: io::Error::other(e.to_string()),
        })?;
        let hex: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        let id = format!("{}.{hex}", std::process::id());
        let setup = |what: &str| {
            let what = format!("{what} for shm endpoint {id}");
            move |source| TransportError::Setup { what, source }
        };
        // Can this process make shared memory at all (no /dev/shm, a read-only one)? Asked now,
        // so that `auto` can leave shm out before anything is published.
        let probe = format!("/bcl.{id}.probe");
        sys::Segment::create(&probe, 4096)
            .map(drop)
            .and_then(|_| sys::unlink(&probe))
            .map_err(setup("creating a shared-memory segment in /dev/shm"))?;
        let name = SocketAddr::from_abstract_name(doorbell_name(&id).as_bytes())
            .map_err(setup("naming the doorbell socket"))?;
        let doorbell =
            UnixDatagram::bind_addr(&name).map_err(setup("binding the doorbell socket"))?;
        doorbell
            .set_nonblocking(true)
            .map_err(setup("configuring the doorbell socket"))?;
        let ring_bytes = config.ring_bytes.max(64 << 10).next_power_of_two();
        let capabilities = Capabilities {
            name: "shm",
            max_message: config.max_message,
            max_queued_per_peer: ring_bytes,
            memory: &[MemoryKind::Host],
        };
        let address = PeerAddress::new(id.clone().into_bytes())
            .unwrap_or_else(|_| unreachable!("pid.nonce fits in 128 bytes"));
        Ok(ShmTransport {
            config: ShmConfig {
                ring_bytes,
                ..config
            },
            capabilities,
            address,
            id,
            doorbell,
            peers: Vec::new(),
            inbox: KeyMap::default(),
            pool: Vec::new(),
            created: Vec::new(),
        })
    }

    fn unlink_created(&mut self) {
        for name in self.created.drain(..) {
            let _ = sys::unlink(&name);
        }
    }

    fn ring(&self, peer: &Peer) {
        // A full doorbell queue already wakes the peer; a missing socket means it is gone,
        // which `peer_lost` reports.
        let _ = self.doorbell.send_to_addr(&[1], &peer.doorbell);
    }

    fn closed_error(&self, peer: usize) -> TransportError {
        TransportError::PeerClosed {
            peer,
            addr: self
                .peers
                .get(peer)
                .and_then(Option::as_ref)
                .map_or_else(|| format!("shm peer {peer}"), |p| p.label.clone()),
        }
    }

    /// Push as much of `peer`'s pending remainder as fits. Returns whether bytes moved.
    fn push_pending(&mut self, peer: usize) -> bool {
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return false;
        };
        let Some(pending) = p.pending.as_mut() else {
            return false;
        };
        let mut moved = false;
        while pending.sent < pending.data.len() {
            let left = pending.data.len() - pending.sent;
            let room = p.out.room(left.min(p.out.max_fragment())).min(left);
            if room == 0 || (room < left && room < 4096) {
                break;
            }
            let end = pending.sent + room;
            p.out.push(
                pending.tag,
                &pending.data[pending.sent..end],
                end == pending.data.len(),
            );
            pending.sent = end;
            moved = true;
        }
        if pending.sent == pending.data.len()
            && let Some(done) = p.pending.take()
            && self.pool.len() < POOL_LIMIT
        {
            self.pool.push(done.data);
        }
        if p.out.publish() {
            let _ = self.doorbell.send_to_addr(&[1], &p.doorbell);
        }
        moved
    }

    /// Take records off `peer`'s ring in order. A message under `want` that is one whole
    /// record is handed to `deliver` in place (or returned, if it is a loan), which ends the
    /// walk; every other record is copied into the inbox (or into the message being
    /// reassembled from fragments). `want` `None`: copy everything. Returns whether records
    /// were taken, and what was found under `want` ([`Found::Nothing`] or what ended the walk).
    fn walk(
        &mut self,
        peer: usize,
        want: Option<Tag>,
        deliver: &mut dyn FnMut(&[u8], Option<Duration>),
    ) -> Result<(bool, Found), TransportError> {
        let max = self.config.max_message;
        let ShmTransport {
            peers,
            inbox,
            pool,
            doorbell,
            ..
        } = self;
        let Some(p) = peers.get_mut(peer).and_then(Option::as_mut) else {
            return Err(TransportError::UnknownPeer { peer });
        };
        let protocol = |reason: String| TransportError::Protocol {
            peer,
            addr: p.label.clone(),
            reason,
        };
        let mut taken = false;
        let mut found = Found::Nothing;
        while let Some(record) = p.inp.peek().map_err(protocol)? {
            taken = true;
            if p.partial_tag
                .is_some_and(|t| t != record.tag || record.loan)
            {
                return Err(protocol(format!(
                    "a record of tag {:#x} interrupted a message of tag {:#x}",
                    record.tag,
                    p.partial_tag.unwrap_or_default()
                )));
            }
            if record.loan {
                let (addr, len, id) = p.inp.loan(&record);
                p.inp.consume(&record);
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                if len > max || id == 0 {
                    return Err(protocol(format!(
                        "a loan of {len} bytes numbered {id} (at most {max} bytes, numbers \
                         from 1)"
                    )));
                }
                let loan = Loan { id, addr, len };
                if want == Some(record.tag) {
                    found = Found::Loan(loan);
                    break;
                }
                inbox
                    .entry((peer, record.tag))
                    .or_default()
                    .push_back(Queued::Loan(loan));
                continue;
            }
            if want == Some(record.tag) && record.last && p.partial_tag.is_none() {
                deliver(p.inp.bytes(&record), None);
                p.inp.consume(&record);
                found = Found::Delivered;
                break;
            }
            p.partial.extend_from_slice(p.inp.bytes(&record));
            p.inp.consume(&record);
            if record.last {
                let mut fresh = pool.pop().unwrap_or_default();
                fresh.clear();
                let message = std::mem::replace(&mut p.partial, fresh);
                p.partial_tag = None;
                inbox
                    .entry((peer, record.tag))
                    .or_default()
                    .push_back(Queued::Bytes(message));
            } else {
                p.partial_tag = Some(record.tag);
            }
        }
        if p.inp.release() {
            let _ = doorbell.send_to_addr(&[1], &p.doorbell);
        }
        Ok((taken, found))
    }

    /// The next message from `peer` under `tag`: from the inbox, or off the ring (handed to
    /// `deliver` in place where it lies there whole).
    fn find(
        &mut self,
        peer: usize,
        tag: Tag,
        deliver: &mut dyn FnMut(&[u8], Option<Duration>),
    ) -> Result<Found, TransportError> {
        let queued = match self.queued(peer, tag) {
            Some(q) => Some(q),
            None => {
                if !self.peer(peer)?.inp.has_data() {
                    return Ok(Found::Nothing);
                }
                match self.walk(peer, Some(tag), deliver)?.1 {
                    Found::Nothing => self.queued(peer, tag),
                    found => return Ok(found),
                }
            }
        };
        Ok(match queued {
            Some(Queued::Bytes(b)) => Found::Bytes(b),
            Some(Queued::Loan(l)) => Found::Loan(l),
            None => Found::Nothing,
        })
    }

    /// The checks before a message of `len` bytes to `peer`: an error where the peer closed
    /// or the message is too large; `false` while an earlier message's remainder still waits
    /// for room in the ring (pushed on as far as it fits), since messages leave in order.
    fn may_send(&mut self, peer: usize, len: usize) -> Result<bool, TransportError> {
        let max = self.config.max_message;
        let p = self.peer(peer)?;
        if p.out.consumer_closed() {
            return Err(self.closed_error(peer));
        }
        if len > max {
            return Err(TransportError::TooLarge { peer, len, max });
        }
        if p.pending.is_some() {
            self.push_pending(peer);
            return Ok(false);
        }
        Ok(true)
    }

    /// Copy loan `loan` of `peer` into `dest` (its length) from the peer's memory, and give
    /// it back.
    fn borrow(&mut self, peer: usize, loan: Loan, dest: &mut [u8]) -> Result<(), TransportError> {
        let p = self.peer(peer)?;
        sys::read_process(p.pid, loan.addr, dest).map_err(|source| TransportError::Io {
            op: "copy a lent message out of the peer's memory (process_vm_readv)",
            peer,
            addr: p.label.clone(),
            source,
        })?;
        if p.inp.give_back(loan.id) {
            self.ring(p);
        }
        Ok(())
    }

    /// Copy loan `loan` of `peer` into a pooled buffer.
    fn borrow_pooled(&mut self, peer: usize, loan: Loan) -> Result<Vec<u8>, TransportError> {
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.resize(loan.len, 0);
        let copied = self.borrow(peer, loan, &mut buf);
        copied.map(|()| buf)
    }

    /// The next queued (already taken off the ring) message from `peer` under `tag`.
    fn queued(&mut self, peer: usize, tag: Tag) -> Option<Queued> {
        if self.inbox.is_empty() {
            return None;
        }
        let q = self.inbox.get_mut(&(peer, tag))?;
        let data = q.pop_front();
        if q.is_empty() {
            self.inbox.remove(&(peer, tag));
        }
        data
    }
}

impl Transport for ShmTransport {
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
        let result = self.connect_rings(local_rank, peers, deadline);
        if result.is_err() {
            self.unlink_created();
        }
        result
    }

    fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError> {
        if !self.may_send(peer, data.len())? {
            return Ok(false);
        }
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return Err(TransportError::UnknownPeer { peer });
        };
        if data.len() <= p.out.max_fragment() {
            if p.out.room(data.len()) < data.len() {
                return Ok(false);
            }
            p.out.push(tag, data, true);
            if p.out.publish() {
                let _ = self.doorbell.send_to_addr(&[1], &p.doorbell);
            }
            return Ok(true);
        }
        // Larger than the whole ring: the part that does not fit now waits in a pooled buffer.
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        p.pending = Some(Pending {
            tag,
            data: buf,
            sent: 0,
        });
        self.push_pending(peer);
        Ok(true)
    }

    fn try_send_filled(
        &mut self,
        peer: usize,
        tag: Tag,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<Option<bool>, TransportError> {
        if !self.may_send(peer, len)? {
            return Ok(Some(false));
        }
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return Err(TransportError::UnknownPeer { peer });
        };
        // Larger than one record: it goes through `try_send`'s pooled buffer in fragments.
        if len > p.out.max_fragment() {
            return Ok(None);
        }
        if p.out.room(len) < len || !p.out.push_filled(tag, len, fill) {
            return Ok(Some(false));
        }
        if p.out.publish() {
            let _ = self.doorbell.send_to_addr(&[1], &p.doorbell);
        }
        Ok(Some(true))
    }

    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        let data = match self.find(peer, tag, &mut |bytes, _| buf.extend_from_slice(bytes))? {
            Found::Delivered => Some(std::mem::take(&mut buf)),
            Found::Bytes(b) => Some(b),
            Found::Loan(loan) => Some(self.borrow_pooled(peer, loan)?),
            Found::Nothing => None,
        };
        if buf.capacity() > 0 && self.pool.len() < POOL_LIMIT {
            self.pool.push(buf);
        }
        Ok(data.map(|data| Received {
            peer,
            tag,
            data,
            transfer: None,
        }))
    }

    fn try_recv_with(
        &mut self,
        peer: usize,
        tag: Tag,
        consume: &mut dyn FnMut(&[u8], Option<Duration>),
    ) -> Result<bool, TransportError> {
        let data = match self.find(peer, tag, consume)? {
            Found::Delivered => return Ok(true),
            Found::Nothing => return Ok(false),
            Found::Bytes(b) => b,
            Found::Loan(loan) => self.borrow_pooled(peer, loan)?,
        };
        consume(&data, None);
        if self.pool.len() < POOL_LIMIT {
            self.pool.push(data);
        }
        Ok(true)
    }

    fn try_recv_into(
        &mut self,
        peer: usize,
        tag: Tag,
        dest: &mut [u8],
    ) -> Result<Landing, TransportError> {
        let mut landing = Landing::Pending;
        match self.find(peer, tag, &mut |data, _| {
            landing = Landing::fill(data, dest, None)
        })? {
            Found::Delivered | Found::Nothing => {}
            Found::Bytes(b) => {
                landing = Landing::fill(&b, dest, None);
                if self.pool.len() < POOL_LIMIT {
                    self.pool.push(b);
                }
            }
            // Straight from the peer's memory into the destination: the single copy.
            Found::Loan(loan) if loan.len == dest.len() => {
                self.borrow(peer, loan, dest)?;
                landing = Landing::Filled(None);
            }
            Found::Loan(loan) => {
                let p = self.peer(peer)?;
                if p.inp.give_back(loan.id) {
                    self.ring(p);
                }
                landing = Landing::WrongLength(loan.len);
            }
        }
        Ok(landing)
    }

    fn release(&mut self, message: Received) {
        if self.pool.len() < POOL_LIMIT {
            self.pool.push(message.data);
        }
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        let mut moved = false;
        for peer in 0..self.peers.len() {
            moved |= self.push_pending(peer);
            // Records stay in the ring until asked for (then they are handed out in place),
            // unless the ring fills up or its producer waits for room: then they are copied out,
            // so that a sender never waits on what this rank will ask for later.
            let Some(p) = &self.peers[peer] else {
                continue;
            };
            if p.inp.in_use() > p.inp.capacity() / 2 || p.inp.producer_parked() {
                moved |= self.walk(peer, None, &mut |_, _| {})?.0;
            }
        }
        Ok(moved)
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let mut fds = Vec::new();
        let readiness = self.prepare_wait(&mut fds);
        let slept = if readiness == Readiness::Sleep {
            crate::poll::poll_fds(&fds, timeout).map(|_| ())
        } else {
            Ok(())
        };
        self.after_wait();
        slept.map_err(|source| TransportError::Setup {
            what: "poll(2) on the shm doorbell".into(),
            source,
        })
    }

    fn prepare_wait(&mut self, fds: &mut Vec<(RawFd, bool)>) -> Readiness {
        fds.push((self.doorbell.as_raw_fd(), false));
        let mut ready = false;
        for p in self.peers.iter_mut().flatten() {
            ready |= p.inp.park();
            if let Some(pending) = &p.pending {
                ready |= p.out.park(pending.data.len() - pending.sent);
            }
            if !p.lent.is_empty() {
                // Loans seen back here are forgotten, so that one given back after its
                // operation was abandoned does not keep this rank awake.
                let out = p.lent.len();
                if p.out.park_lender(&p.lent) {
                    let Peer {
                        lent, out: ring, ..
                    } = p;
                    lent.retain(|&id| !ring.returned(id));
                }
                ready |= p.lent.len() < out;
            }
            if let Some(fd) = &p.pidfd {
                fds.push((fd.as_raw_fd(), false));
            }
        }
        if ready {
            Readiness::Ready
        } else {
            Readiness::Sleep
        }
    }

    fn after_wait(&mut self) {
        for p in self.peers.iter().flatten() {
            p.inp.unpark();
            p.out.unpark();
        }
        let mut sink = [0u8; 64];
        while self.doorbell.recv(&mut sink).is_ok() {}
    }

    fn flushed(&self) -> bool {
        self.peers.iter().flatten().all(|p| p.pending.is_none())
    }

    fn peer_lost(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .is_some_and(|p| p.gone() && !p.inp.has_data() && p.partial_tag.is_none())
            && !self.inbox.keys().any(|(from, _)| *from == peer)
    }

    fn lines(&mut self) -> Option<&mut dyn Lines> {
        Some(self)
    }

    fn lend(&mut self) -> Option<&mut dyn Lend> {
        Some(self)
    }
}

impl Lend for ShmTransport {
    fn reaches(&mut self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .is_some_and(|p| p.out.consumer_borrows() == Some(true))
    }

    fn offer(
        &mut self,
        peer: usize,
        tag: Tag,
        data: &[u8],
    ) -> Result<Option<LoanId>, TransportError> {
        if !self.may_send(peer, data.len())? {
            return Ok(None);
        }
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return Err(TransportError::UnknownPeer { peer });
        };
        let id = p.next_loan;
        if id > ring::LOAN_SLOTS && !p.out.returned(id - ring::LOAN_SLOTS) {
            return Ok(None);
        }
        if p.out.room(ring::LOAN_BYTES) < ring::LOAN_BYTES {
            return Ok(None);
        }
        p.out.push_loan(tag, data.as_ptr() as u64, data.len(), id);
        p.next_loan += 1;
        p.lent.push(id);
        if p.out.publish() {
            let _ = self.doorbell.send_to_addr(&[1], &p.doorbell);
        }
        Ok(Some(id))
    }

    fn returned(&mut self, peer: usize, loan: LoanId) -> Result<bool, TransportError> {
        let p = self.peer_mut(peer)?;
        if !p.out.returned(loan) {
            return Ok(false);
        }
        p.lent.retain(|&id| id != loan);
        Ok(true)
    }
}

impl ShmTransport {
    fn peer(&self, peer: usize) -> Result<&Peer, TransportError> {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or(TransportError::UnknownPeer { peer })
    }

    fn peer_mut(&mut self, peer: usize) -> Result<&mut Peer, TransportError> {
        self.peers
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or(TransportError::UnknownPeer { peer })
    }
}

impl Lines for ShmTransport {
    fn max_payload(&self) -> usize {
        lines::MAX_PAYLOAD
    }

    fn reaches(&self, peer: usize) -> bool {
        self.peers.get(peer).is_some_and(Option::is_some)
    }

    fn post(&mut self, peers: &[usize], stamp: u64, payload: &[u8]) -> Result<(), TransportError> {
        for &peer in peers {
            if stamp == 0 || payload.len() > lines::MAX_PAYLOAD {
                return Err(TransportError::TooLarge {
                    peer,
                    len: payload.len(),
                    max: lines::MAX_PAYLOAD,
                });
            }
            let p = self.peer(peer)?;
            if p.out.consumer_closed() {
                return Err(self.closed_error(peer));
            }
            lines::post(p.out.segment(), stamp, payload);
        }
        // One fence for all of them (it waits for the lines to leave this core), then the
        // doorbell of each peer about to sleep.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        for &peer in peers {
            let p = self.peer(peer)?;
            if p.out.consumer_parked_now() {
                let _ = self.doorbell.send_to_addr(&[1], &p.doorbell);
            }
        }
        Ok(())
    }

    fn collect(
        &mut self,
        peer: usize,
        stamp: u64,
        out: &mut [u8],
    ) -> Result<Collected, TransportError> {
        let p = self.peer(peer)?;
        lines::collect(p.inp.segment(), stamp, out).map_err(|reason| TransportError::Protocol {
            peer,
            addr: p.label.clone(),
            reason,
        })
    }

    fn sleep(
        &mut self,
        awaited: &[(usize, u64, usize)],
        timeout: Duration,
    ) -> Result<(), TransportError> {
        let mut fds = Vec::new();
        let mut ready = self.prepare_wait(&mut fds) == Readiness::Ready;
        for &(peer, stamp, len) in awaited {
            if let Some(p) = self.peers.get(peer).and_then(Option::as_ref) {
                ready |= lines::arrived(p.inp.segment(), stamp, len);
            }
        }
        let slept = if ready {
            Ok(())
        } else {
            crate::poll::poll_fds(&fds, timeout).map(|_| ())
        };
        self.after_wait();
        slept.map_err(|source| TransportError::Setup {
            what: "poll(2) on the shm doorbell".into(),
            source,
        })
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        for p in self.peers.iter().flatten() {
            p.out.close();
            p.inp.close();
            self.ring(p);
        }
        self.unlink_created();
    }
}

#[cfg(test)]
mod tests;
