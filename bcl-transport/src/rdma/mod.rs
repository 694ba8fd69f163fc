//! `rdma`: RDMA verbs over reliable-connected queue pairs, one per peer (feature `rdma`).
//!
//! Setup (`connect`): every pair of ranks opens one authenticated TCP socket (the tcp
//! transport's handshake, under its own context) and swaps a [`wire::ConnectionRecord`]: QP
//! number, PSN, GID, LID, MTU and the address and key of the ring of slots the peer may write.
//! The socket stays open: its closing is how a dead peer is noticed without waiting for a retry
//! timeout.
//!
//! Data path: `try_send` cuts a message into chunks of at most one slot and copies each into a
//! registered send slot; each chunk goes to the peer's ring as an RDMA WRITE with immediate data
//! (the chunk's sequence number), into slot `sequence % slots`. The receiver copies the chunk
//! out, frees the slot and returns the credit with a zero-length WRITE with immediate (the
//! number of slots freed so far). A sender never has more chunks unacknowledged than the ring has
//! slots, so a write never lands on unread bytes. Each QP keeps `2 · slots` receive tokens
//! posted: at most `slots` data writes and `slots` credit returns can be in flight towards it.
//! Waiting: a bounded busy poll of the completion queue, then `poll(2)` on the completion
//! channel and the setup sockets.
//!
//! Failover: an error completion (retry exceeded, a port down, a remote access error) or a
//! post the QP refuses moves that peer to tcp over the setup socket, which is still open
//! (`RdmaConfig::tcp_failover`; off, the error is [`TransportError::LinkFailed`], naming both
//! ranks and the device and port). Each side sends a `Failover` frame saying how many of the
//! peer's chunks it has taken (every completion after it is ignored), then sends its own
//! chunks from the number the peer sent: the chunks not credited back still lie in their send
//! slots (a slot is reused only after its credit), the rest are queued. So nothing is lost or
//! taken twice, and a message half over RDMA, half over tcp is assembled as one. A peer that
//! the socket cannot reach either is a link failure. The link stays on tcp (no move back).
//! With several lanes per peer, what the link held still goes over tcp, then a `Moved`
//! frame, and the later messages take another lane still on RDMA (see [`lanes`]).

mod connect;
pub mod lanes;
pub mod verbs;
pub mod wire;

use crate::auth::Secret;
use crate::error::TransportError;
use crate::keys::KeyMap;
use crate::transport::{
    Capabilities, MemoryKind, PathChange, PeerAddress, Readiness, Received, Tag, Transport,
};
use std::collections::VecDeque;
use std::io;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::{Completion, Device, QueuePair, Region, Verbs};
use wire::{ChunkHeader, ConnectionRecord, Immediate, SLOT_HEADER, SocketFrame};

/// Settings of an rdma endpoint.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Address of the setup socket (loopback by default).
    pub bind_ip: IpAddr,
    /// The communicator's secret; setup connections that cannot prove it are refused.
    pub secret: Secret,
    /// Device name ("mlx5_0", "rxe0"); `None`: the first device whose port is active.
    pub device: Option<String>,
    pub port: u8,
    /// GID table index; `None`: the IPv4-mapped GID where there is one (RoCE v2), else 0.
    pub gid_index: Option<u8>,
    /// Slots in each peer's receive ring (and in this rank's send slots per peer).
    pub slots: u32,
    /// Chunk bytes per slot.
    pub slot_payload: usize,
    /// The largest message accepted.
    pub max_message: usize,
    /// Bytes queued towards one peer before `try_send` answers "not now".
    pub max_queued_per_peer: usize,
    /// How long `wait` polls the completion queue before it sleeps on the channel.
    pub busy_poll: Duration,
    /// Verbs ACK timeout exponent (4.096 µs · 2^n per try) and retries before an error
    /// completion: 14 and 7 make a dead link fail in about half a second.
    pub ack_timeout: u8,
    pub retries: u8,
    /// Move a peer whose QP fails to tcp (the setup socket) instead of failing the link.
    pub tcp_failover: bool,
}

impl RdmaConfig {
    pub fn new(secret: Secret) -> Self {
        RdmaConfig {
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            secret,
            device: None,
            port: 1,
            gid_index: None,
            slots: 16,
            slot_payload: 256 << 10,
            max_message: 64 << 20,
            max_queued_per_peer: 16 << 20,
            busy_poll: Duration::from_micros(20),
            ack_timeout: 14,
            retries: 7,
            tcp_failover: true,
        }
    }

    fn slot_bytes(&self) -> usize {
        SLOT_HEADER + self.slot_payload
    }

    /// (chunk bytes per slot, slots, slot bytes with the header): what `post_chunk` needs.
    fn geometry(&self) -> (usize, u64, usize) {
        (self.slot_payload, u64::from(self.slots), self.slot_bytes())
    }
}

/// What the verbs stack of this machine offers: the devices and their ports, or why none.
pub fn probe() -> Result<Vec<verbs::DeviceSummary>, String> {
    let verbs = Verbs::load().map_err(|e| e.0)?;
    verbs.devices().map_err(|e| e.0)
}

/// A message that has fully arrived.
enum Arrived {
    /// Copied out of the ring (a message of several chunks, or one evicted from the ring), with
    /// how long it took from its first chunk to its last (several chunks only).
    Owned(Vec<u8>, Option<Duration>),
    /// A one-chunk message still in its ring slot (chunk `seq`), handed to `try_recv_with`
    /// where it lies; its slot is freed when it is consumed.
    InRing { seq: u64, len: usize },
}

struct Outgoing {
    tag: Tag,
    data: Vec<u8>,
    /// Bytes already posted.
    sent: usize,
}

struct Assembly {
    tag: Tag,
    data: Vec<u8>,
    len: usize,
    started: Instant,
}

struct Peer {
    // Field order matters: the QP is destroyed before the regions its work requests name (the
    // verbs module's safety contract).
    qp: QueuePair,
    send_slots: Region,
    ring: Region,
    remote: ConnectionRecord,
    socket: TcpStream,
    addr: String,
    outgoing: VecDeque<Outgoing>,
    queued: usize,
    /// Data chunks posted, completed locally, and freed by the peer (credits).
    posted: u64,
    send_done: u64,
    credited: u64,
    credit_writes: u32,
    /// Data chunks received, slots freed (a prefix: the sender reuses slots in order), and the
    /// freed count last reported to the peer.
    received: u64,
    freed: u64,
    reported: u64,
    /// For chunks `freed..received`: whether each is done with (false: a one-chunk message
    /// waiting in its slot to be consumed).
    done: VecDeque<bool>,
    /// How many of those wait in their slots.
    held: usize,
    assembling: Option<Assembly>,
    closed: bool,
    /// Set once the link has moved to tcp.
    fallback: Option<Fallback>,
    /// Tests: data writes from this chunk on carry a wrong remote key (an error completion
    /// at this side, a remote access error).
    bad_rkey_at: Option<u64>,
}

/// A link that moved to tcp: the setup socket carries [`wire::SocketFrame`]s both ways.
struct Fallback {
    /// How many of this side's chunks the peer has taken (its `Failover` frame), and whether
    /// the chunks after them, left in the send slots, have been framed again.
    heard: Option<u64>,
    resent: bool,
    /// Framed bytes not yet written, and from where.
    out: Vec<u8>,
    written: usize,
    /// Bytes read and not yet a whole frame.
    input: Vec<u8>,
    /// The lane this side's later messages to the peer go over (set by `RdmaLanes`), and
    /// whether the `Moved` frame saying so is framed: after every chunk queued before it.
    seal: Option<u8>,
    sealed: bool,
    /// The lane the peer's `Moved` frame named: it sends nothing more here.
    moved_to: Option<u8>,
}

impl Fallback {
    /// Sealed, and the `Moved` frame saying so not yet framed.
    fn seal_unframed(&self) -> bool {
        self.seal.is_some() && !self.sealed
    }
}

/// Framed bytes a fallen-back peer may hold unwritten before `pump` stops framing more.
const FALLBACK_OUT_LIMIT: usize = 4 << 20;

const WR_DATA: u64 = 0;
const WR_CREDIT: u64 = 1;
const WR_RECV: u64 = 2;

fn wr_id(peer: usize, kind: u64) -> u64 {
    ((peer as u64) << 8) | kind
}

/// An rdma endpoint of one rank.
pub struct RdmaTransport {
    config: RdmaConfig,
    capabilities: Capabilities,
    listener: TcpListener,
    address: PeerAddress,
    device: Device,
    local_rank: usize,
    peers: KeyMap<usize, Peer>,
    by_qp: KeyMap<u32, usize>,
    inbox: KeyMap<(usize, Tag), VecDeque<Arrived>>,
    pool: Vec<Vec<u8>>,
    completions: Vec<Completion>,
    last_socket_check: Instant,
    /// Peers whose link both ends refused at connect, with the reason (see `take_refused`).
    refused: Vec<(usize, String)>,
    /// Links moved to tcp so far, oldest first.
    failovers: Vec<PathChange>,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RdmaTransport({:?}, {}, {} peers)",
            self.address,
            self.device.label(),
            self.peers.len()
        )
    }
}

const POOL_LIMIT: usize = 256;
/// How often an idle transport looks at its setup sockets for a peer that went away.
const SOCKET_CHECK: Duration = Duration::from_millis(10);

impl RdmaTransport {
    /// Open the device and listen for setup connections. Err: no libibverbs, no device, no
    /// active port ("rdma unavailable: …").
    pub fn bind(config: RdmaConfig) -> Result<Self, TransportError> {
        let unavailable = |reason: String| TransportError::Unavailable {
            transport: "rdma",
            reason,
        };
        let verbs = Verbs::load().map_err(|e| unavailable(e.0))?;
        let device = open_device(&verbs, &config).map_err(|e| unavailable(e.0))?;
        let (listener, address) =
            crate::tcp::connect::listen(config.bind_ip, "the rdma setup listener")?;
        let capabilities = Capabilities {
            name: "rdma",
            max_message: config.max_message,
            max_queued_per_peer: config.max_queued_per_peer,
            memory: &[MemoryKind::Host],
        };
        Ok(RdmaTransport {
            config,
            capabilities,
            listener,
            address,
            device,
            local_rank: 0,
            peers: KeyMap::default(),
            by_qp: KeyMap::default(),
            inbox: KeyMap::default(),
            pool: Vec::new(),
            completions: Vec::new(),
            last_socket_check: Instant::now(),
            refused: Vec::new(),
            failovers: Vec::new(),
        })
    }

    /// "rxe0 port 1".
    pub fn device_label(&self) -> String {
        self.device.label()
    }

    /// Whether the link to `peer` is connected, open and still on RDMA.
    pub(super) fn on_rdma(&self, peer: usize) -> bool {
        (self.peers.get(&peer)).is_some_and(|p| !p.closed && p.fallback.is_none())
    }

    /// The link to `peer`, moved to tcp, takes no more messages: once what it holds is sent,
    /// it tells the peer that the later ones go over lane `lane` (`to`: that lane's device),
    /// and its path change says so. Ignored for a link that has not moved or is sealed.
    pub(super) fn seal(&mut self, peer: usize, lane: u8, to: &str) {
        let Some(f) = self.peers.get_mut(&peer).and_then(|p| p.fallback.as_mut()) else {
            return;
        };
        if f.seal.is_some() {
            return;
        }
        f.seal = Some(lane);
        if let Some(entry) = self.failovers.iter_mut().rev().find(|e| e.peer == peer) {
            entry.to = format!("rdma {to}");
        }
    }

    /// The lane the peer said its later messages go over (its `Moved` frame), once every
    /// message it sent over this link has arrived.
    pub(super) fn moved_to(&self, peer: usize) -> Option<u8> {
        (self.peers.get(&peer)).and_then(|p| p.fallback.as_ref()?.moved_to)
    }

    /// Whether a message from `peer` under `tag` waits to be taken.
    pub(super) fn has_arrived(&self, peer: usize, tag: Tag) -> bool {
        self.inbox.contains_key(&(peer, tag))
    }

    /// The `index`th path change, oldest first.
    pub(super) fn path_change(&self, index: usize) -> Option<&PathChange> {
        self.failovers.get(index)
    }

    fn link_failed(&self, peer: usize, what: String) -> TransportError {
        TransportError::LinkFailed {
            local: self.local_rank,
            peer,
            device: self.device.label(),
            what,
        }
    }

    /// Take what the completion queue holds into `self.completions`.
    fn drain(&mut self) -> Result<(), TransportError> {
        self.device
            .poll(&mut self.completions, 256)
            .map_err(|e| TransportError::Setup {
                what: e.0,
                source: io::Error::other("completion queue"),
            })?;
        Ok(())
    }

    /// Act on every taken completion. Returns whether any was taken.
    fn handle_completions(&mut self) -> Result<bool, TransportError> {
        if self.completions.is_empty() {
            return Ok(false);
        }
        let mut completions = std::mem::take(&mut self.completions);
        let mut result = Ok(());
        for c in completions.drain(..) {
            if result.is_err() {
                break;
            }
            result = self.handle(c);
        }
        self.completions = completions;
        result.map(|_| true)
    }

    fn handle(&mut self, c: Completion) -> Result<(), TransportError> {
        let peer = (c.wr_id >> 8) as usize;
        let kind = c.wr_id & 0xff;
        if self.peers.get(&peer).is_some_and(|p| p.fallback.is_some()) {
            // Its QP is abandoned: what it still completes, the socket carries again.
            return Ok(());
        }
        if let Some(status) = c.failed {
            let what = match kind {
                WR_RECV => "receive",
                WR_CREDIT => "credit return",
                _ => "write",
            };
            let text = self.device.status_text(status);
            let remote_qp = self.peers.get(&peer).map(|p| p.remote.endpoint.qp_num);
            let what = format!(
                "{what} completed with error: {text} (status {status}, remote QP {remote_qp:?})"
            );
            return self.fail_over(peer, what);
        }
        let slot_bytes = self.config.slot_bytes();
        let max_message = self.config.max_message;
        let Some(p) = self.peers.get_mut(&peer) else {
            return Err(TransportError::UnknownPeer { peer });
        };
        match kind {
            WR_DATA => p.send_done += 1,
            WR_CREDIT => p.credit_writes -= 1,
            _ => {
                if let Err(e) = p.qp.post_recv(wr_id(peer, WR_RECV)) {
                    return self.fail_over(peer, format!("posting a receive failed: {}", e.0));
                }
                match Immediate::decode(c.imm.unwrap_or(0)) {
                    Immediate::Credit(freed) => {
                        p.credited = wire::advance_counter(p.credited, freed);
                        if p.credited > p.posted {
                            let addr = p.addr.clone();
                            return Err(TransportError::Protocol {
                                peer,
                                addr,
                                reason: format!(
                                    "credits for {} chunks when {} were sent",
                                    p.credited, p.posted
                                ),
                            });
                        }
                    }
                    Immediate::Data(seq) => {
                        let r =
                            receive_chunk(p, peer, seq, slot_bytes, max_message, &mut self.pool);
                        // Slots are credited back in order, so one message waiting in its
                        // slot holds back every slot after it. More than a quarter ring
                        // uncredited behind a waiting message: copy the oldest out, so the
                        // sender's credits never wait on messages this rank does not want
                        // yet (see `flushed`), whatever arrives behind it.
                        let slots = (p.ring.len() / slot_bytes) as u64;
                        let evict = p.held > 0 && (p.received - p.freed) * 4 > slots;
                        match r {
                            Ok(Some((tag, arrived))) => {
                                self.inbox
                                    .entry((peer, tag))
                                    .or_default()
                                    .push_back(arrived);
                                if evict {
                                    self.evict_oldest(peer);
                                }
                            }
                            Ok(None) if evict => self.evict_oldest(peer),
                            Ok(None) => {}
                            Err(reason) => {
                                let addr = p.addr.clone();
                                return Err(TransportError::Protocol { peer, addr, reason });
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Post what the peers' credits allow: data chunks, then credit returns.
    fn pump(&mut self) -> Result<bool, TransportError> {
        let geometry = self.config.geometry();
        let (_, slots, _) = geometry;
        let mut moved = false;
        let mut failure = None;
        let mut fallen = Vec::new();
        for (&peer, p) in self.peers.iter_mut() {
            if p.closed {
                continue;
            }
            if p.fallback.is_some() {
                fallen.push(peer);
                continue;
            }
            while has_room(p.posted, p.credited, p.send_done, slots) {
                let Some(mut front) = p.outgoing.pop_front() else {
                    break;
                };
                let chunk = match post_chunk(p, peer, front.tag, &front.data, front.sent, geometry)
                {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        p.outgoing.push_front(front);
                        failure = Some((peer, e));
                        break;
                    }
                };
                moved = true;
                front.sent += chunk;
                p.queued -= chunk;
                if front.sent < front.data.len() {
                    p.outgoing.push_front(front);
                } else if self.pool.len() < POOL_LIMIT {
                    self.pool.push(front.data);
                }
            }
            // Credits go back in batches of a quarter ring: a sender that has run out has at
            // least half a ring of chunks on the way (see `try_send`), so the batch always
            // fills (see `flushed`).
            if failure.is_none()
                && p.freed - p.reported >= credit_batch(slots)
                && u64::from(p.credit_writes) < slots
            {
                match post_credit(p, peer) {
                    Ok(()) => {
                        p.credit_writes += 1;
                        p.reported = p.freed;
                        moved = true;
                    }
                    Err(e) => failure = Some((peer, e)),
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some((peer, e)) = failure {
            self.fail_over(peer, format!("posting to its QP failed: {}", e.0))?;
        }
        for peer in fallen {
            moved |= self.pump_fallback(peer)?;
        }
        Ok(moved)
    }

    /// The link to `peer` failed (`what`): move it to tcp, or fail it where failover is off
    /// or the peer is gone.
    fn fail_over(&mut self, peer: usize, what: String) -> Result<(), TransportError> {
        let open = self.peers.get(&peer).is_some_and(|p| !p.closed);
        if !self.config.tcp_failover || !open {
            if let Some(p) = self.peers.get_mut(&peer) {
                p.closed = true;
            }
            return Err(self.link_failed(peer, what));
        }
        self.begin_fallback(peer, what);
        Ok(())
    }

    /// Stop using `peer`'s QP and tell the peer, over the setup socket, how many of its chunks
    /// this side has taken. Nothing is sent again before its own answer says where to start.
    fn begin_fallback(&mut self, peer: usize, reason: String) {
        let device = self.device.label();
        let rank = self.local_rank;
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.fallback.is_some() || p.closed {
            return;
        }
        tracing::warn!(rank, peer, %device, %reason, "rdma link moved to tcp");
        let mut out = Vec::new();
        SocketFrame::Failover {
            received: p.received,
            reason: reason.clone(),
        }
        .encode_into(&mut out);
        p.fallback = Some(Fallback {
            heard: None,
            resent: false,
            out,
            written: 0,
            input: Vec::new(),
            seal: None,
            sealed: false,
            moved_to: None,
        });
        self.failovers.push(PathChange {
            peer,
            from: format!("rdma {device}"),
            to: "tcp".to_string(),
            reason,
        });
    }

    /// Move a fallen-back peer's bytes: read and act on its frames, frame what may be sent,
    /// write what the socket takes. Err: the peer broke the protocol. A socket that fails
    /// closes the peer (unreachable by every path).
    fn pump_fallback(&mut self, peer: usize) -> Result<bool, TransportError> {
        let (payload, slots, slot_bytes) = self.config.geometry();
        let max_message = self.config.max_message;
        let Some(p) = self.peers.get_mut(&peer) else {
            return Ok(false);
        };
        let Some(mut f) = p.fallback.take() else {
            return Ok(false);
        };
        let result = fallback_round(
            p,
            &mut f,
            peer,
            (payload, slots, slot_bytes),
            max_message,
            &mut self.pool,
            &mut self.inbox,
        );
        p.fallback = Some(f);
        match result {
            Ok((moved, peer_reason)) => {
                if let Some(reason) = peer_reason
                    && let Some(entry) = self.failovers.iter_mut().rev().find(|e| e.peer == peer)
                    && entry.reason.starts_with(PEER_ASKED)
                {
                    entry.reason = format!("{PEER_ASKED}: {reason}");
                }
                Ok(moved)
            }
            Err(reason) => {
                let addr = self
                    .peers
                    .get(&peer)
                    .map(|p| p.addr.clone())
                    .unwrap_or_default();
                Err(TransportError::Protocol { peer, addr, reason })
            }
        }
    }

    /// Copy the oldest message of `peer` still in its slot into a buffer, and free the slot.
    fn evict_oldest(&mut self, peer: usize) {
        let slot_bytes = self.config.slot_bytes();
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(offset) = p.done.iter().position(|done| !done) else {
            return;
        };
        let seq = p.freed + offset as u64;
        for ((from, _), queue) in self.inbox.iter_mut() {
            if *from != peer {
                continue;
            }
            for arrived in queue.iter_mut() {
                if let Arrived::InRing { seq: s, len } = *arrived
                    && s == seq
                {
                    let mut data = self.pool.pop().unwrap_or_default();
                    data.clear();
                    data.extend_from_slice(slot_message(p, seq, len, slot_bytes));
                    *arrived = Arrived::Owned(data, None);
                    release_slot(p, seq);
                    return;
                }
            }
        }
    }

    /// The next message from `peer` under `tag`, if one has arrived.
    fn take_arrived(&mut self, peer: usize, tag: Tag) -> Option<Arrived> {
        let q = self.inbox.get_mut(&(peer, tag))?;
        let arrived = q.pop_front();
        if q.is_empty() {
            self.inbox.remove(&(peer, tag));
        }
        arrived
    }

    fn nothing_arrived(&self, peer: usize) -> Result<(), TransportError> {
        match self.peers.get(&peer) {
            None => Err(TransportError::UnknownPeer { peer }),
            Some(p) if p.closed && p.fallback.is_some() => {
                // Why it moved: its entry in `failovers`, with the peer's reason once known.
                let reason = (self.failovers.iter().rev().find(|c| c.peer == peer))
                    .map_or("", |c| c.reason.as_str());
                Err(self.link_failed(
                    peer,
                    format!("moved to tcp after \"{reason}\", and the tcp path closed too"),
                ))
            }
            Some(p) if p.closed => Err(self.peer_closed(peer)),
            Some(_) => Ok(()),
        }
    }

    /// Notice peers whose setup socket closed (the process died or dropped the transport).
    /// Bytes on a socket before this side has moved that link are the peer's `Failover`
    /// frame: its QP failed, so this side moves too.
    fn check_sockets(&mut self) {
        self.last_socket_check = Instant::now();
        let mut asked = Vec::new();
        for (&peer, p) in self.peers.iter_mut() {
            if p.closed || p.fallback.is_some() {
                continue;
            }
            let mut byte = [0u8; 1];
            match p.socket.peek(&mut byte) {
                Ok(0) => p.closed = true,
                Ok(_) => asked.push(peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => p.closed = true,
            }
        }
        for peer in asked {
            self.begin_fallback(peer, PEER_ASKED.to_string());
        }
    }

    fn peer_closed(&self, peer: usize) -> TransportError {
        TransportError::PeerClosed {
            peer,
            addr: self
                .peers
                .get(&peer)
                .map(|p| format!("{}, {}", p.addr, self.device.label()))
                .unwrap_or_default(),
        }
    }
}

fn open_device(verbs: &Arc<Verbs>, config: &RdmaConfig) -> Result<Device, verbs::VerbsError> {
    // Per peer: `slots` data completions and `slots` credit-return completions on the send
    // side, `2 · slots` receive completions. The CQ is sized for 64 peers and grown never: a
    // larger world shares it, which is safe because completions are drained every progress
    // round and each peer's credits bound its share.
    let cq_entries = (4 * config.slots * 64).min(32767);
    Device::open(
        verbs,
        config.device.as_deref(),
        config.port,
        config.gid_index,
        cq_entries,
    )
}

/// How many freed slots are returned to the sender at once.
fn credit_batch(slots: u64) -> u64 {
    (slots / 4).max(1)
}

/// Whether another chunk may be posted: the peer has a free slot for it (credits) and this
/// side has a send slot whose last write completed.
fn has_room(posted: u64, credited: u64, send_done: u64, slots: u64) -> bool {
    posted - credited < slots && posted - send_done < slots
}

/// Copy the chunk of `message` that starts at `from` (at most one slot's `payload`) into the
/// next send slot and write it to the peer's ring. Returns the chunk's length.
#[allow(unsafe_code)] // posting RDMA writes: the contract is the slot and credit protocol's
fn post_chunk(
    p: &mut Peer,
    peer: usize,
    tag: Tag,
    message: &[u8],
    from: usize,
    geometry: (usize, u64, usize),
) -> Result<usize, verbs::VerbsError> {
    let (payload, slots, slot_bytes) = geometry;
    let bytes = &message[from..from + (message.len() - from).min(payload)];
    let header = ChunkHeader {
        tag,
        message_len: message.len() as u32,
        chunk_len: bytes.len() as u32,
    };
    let slot = (p.posted % slots) as usize;
    let at = slot * slot_bytes;
    let len = SLOT_HEADER + bytes.len();
    // SAFETY: send slot `posted % slots` is free: a sender posts at most `slots` writes
    // beyond those whose completions it has polled (`has_room`), so the previous write from
    // this slot has completed.
    let target = unsafe { p.send_slots.bytes_mut(at..at + len) };
    target[..SLOT_HEADER].copy_from_slice(&header.encode());
    target[SLOT_HEADER..].copy_from_slice(bytes);
    let remote_at = p.remote.ring_addr + (slot * slot_bytes) as u64;
    let imm = Immediate::Data(p.posted as u32).encode();
    let rkey = match p.bad_rkey_at {
        Some(at) if p.posted >= at => !p.remote.ring_rkey,
        _ => p.remote.ring_rkey,
    };
    // SAFETY: the send slots live as long as the QP (both in `Peer`, the QP dropped first); the
    // slot is not written again before this write completes (as above); the remote slot is
    // free by the credits the peer returned (`has_room`: fewer than `slots` writes beyond the
    // last credit).
    unsafe {
        p.qp.post_write_with_imm(
            wr_id(peer, WR_DATA),
            Some((&p.send_slots, at, len)),
            remote_at,
            rkey,
            imm,
        )
    }?;
    p.posted += 1;
    Ok(bytes.len())
}

/// Tell the peer how many of its chunks this side has freed: a zero-length write with the
/// count as its immediate.
#[allow(unsafe_code)] // posting an RDMA write
fn post_credit(p: &Peer, peer: usize) -> Result<(), verbs::VerbsError> {
    let imm = Immediate::Credit(p.freed as u32).encode();
    // SAFETY: a zero-length write names no local memory; the peer's ring address and key are
    // what its setup record gave this side to write, and a zero-length write changes nothing
    // there.
    unsafe {
        p.qp.post_write_with_imm(
            wr_id(peer, WR_CREDIT),
            None,
            p.remote.ring_addr,
            p.remote.ring_rkey,
            imm,
        )
    }
}

/// Chunk `seq` is done with: free its slot, and every slot after it that is done too (slots
/// are freed in order, as the sender reuses them).
fn release_slot(p: &mut Peer, seq: u64) {
    let index = (seq - p.freed) as usize;
    if !p.done[index] {
        p.done[index] = true;
        p.held -= 1;
    }
    while p.done.front() == Some(&true) {
        p.done.pop_front();
        p.freed += 1;
    }
}

/// The bytes of the one-chunk message in chunk `seq`'s slot.
#[allow(unsafe_code)] // reading memory the peer's NIC writes: the credit protocol's contract
fn slot_message(p: &Peer, seq: u64, len: usize, slot_bytes: usize) -> &[u8] {
    let slots = (p.ring.len() / slot_bytes) as u64;
    let at = (seq % slots) as usize * slot_bytes + SLOT_HEADER;
    // SAFETY: chunk `seq` was announced by its completion and its slot is held (not yet
    // credited back), so the peer does not write it while this borrow of `p` lasts.
    unsafe { p.ring.bytes(at..at + len) }
}

/// What one chunk did to the message being assembled.
enum Step {
    /// A whole message in one chunk (the caller keeps or copies it).
    Single,
    /// The last chunk of a message of several: the message, and how long it took.
    Completed(Tag, Vec<u8>, Option<Duration>),
    /// A chunk of a message still incomplete.
    Partial,
}

/// Add one chunk (`header`, its bytes `chunk`) of `peer`'s to the message being assembled.
fn assemble(
    assembling: &mut Option<Assembly>,
    header: ChunkHeader,
    chunk: &[u8],
    peer: usize,
    pool: &mut Vec<Vec<u8>>,
) -> Result<Step, String> {
    if assembling.is_none() && header.chunk_len == header.message_len {
        return Ok(Step::Single);
    }
    let mut assembly = match assembling.take() {
        Some(a) if a.tag == header.tag && a.len == header.message_len as usize => a,
        Some(a) => {
            return Err(format!(
                "a chunk of tag {:#x} ({} bytes) interrupted the message of tag {:#x} ({} of {} bytes arrived)",
                header.tag,
                header.message_len,
                a.tag,
                a.data.len(),
                a.len
            ));
        }
        None => {
            let mut data = pool.pop().unwrap_or_default();
            data.clear();
            data.reserve(header.message_len as usize);
            Assembly {
                tag: header.tag,
                data,
                len: header.message_len as usize,
                started: Instant::now(),
            }
        }
    };
    if assembly.data.len() + chunk.len() > assembly.len || (chunk.is_empty() && assembly.len > 0) {
        return Err(format!(
            "chunk of {} bytes overruns the message of {} bytes (peer rank {peer})",
            chunk.len(),
            assembly.len
        ));
    }
    assembly.data.extend_from_slice(chunk);
    if assembly.data.len() == assembly.len {
        let transfer = (assembly.len > chunk.len()).then(|| assembly.started.elapsed());
        return Ok(Step::Completed(assembly.tag, assembly.data, transfer));
    }
    *assembling = Some(assembly);
    Ok(Step::Partial)
}

/// Take the chunk that landed in the ring's next slot. `Some`: it completed a message.
#[allow(unsafe_code)] // reading memory the peer's NIC writes: the credit protocol's contract
fn receive_chunk(
    p: &mut Peer,
    peer: usize,
    seq: u32,
    slot_bytes: usize,
    max_message: usize,
    pool: &mut Vec<Vec<u8>>,
) -> Result<Option<(Tag, Arrived)>, String> {
    if seq != p.received as u32 & 0x7fff_ffff {
        return Err(format!(
            "chunk {seq} arrived where chunk {} was next",
            p.received & 0x7fff_ffff
        ));
    }
    let slots = p.ring.len() / slot_bytes;
    let at = (p.received % slots as u64) as usize * slot_bytes;
    // SAFETY: the completion for chunk `received` has been polled (the caller's `seq`), and
    // its slot is not credited back before this function has copied or kept the chunk.
    let slot = unsafe { p.ring.bytes(at..at + slot_bytes) };
    let header = ChunkHeader::decode(slot, slot_bytes - SLOT_HEADER, max_message)?;
    let chunk = &slot[SLOT_HEADER..SLOT_HEADER + header.chunk_len as usize];
    let step = assemble(&mut p.assembling, header, chunk, peer, pool)?;
    let seq = p.received;
    p.received += 1;
    p.done.push_back(false);
    p.held += 1;
    match step {
        // A whole message in one slot: it stays there until consumed.
        Step::Single => {
            let len = header.message_len as usize;
            Ok(Some((header.tag, Arrived::InRing { seq, len })))
        }
        Step::Completed(tag, data, transfer) => {
            release_slot(p, seq);
            Ok(Some((tag, Arrived::Owned(data, transfer))))
        }
        Step::Partial => {
            release_slot(p, seq);
            Ok(None)
        }
    }
}

/// Marks a failover this side began because the peer's `Failover` frame came first.
const PEER_ASKED: &str = "the peer moved the link to tcp";

/// One round of a fallen-back link (see `RdmaTransport::pump_fallback`). Returns whether bytes
/// moved, and the peer's reason when its `Failover` frame came in this round.
fn fallback_round(
    p: &mut Peer,
    f: &mut Fallback,
    peer: usize,
    geometry: (usize, u64, usize),
    max_message: usize,
    pool: &mut Vec<Vec<u8>>,
    inbox: &mut KeyMap<(usize, Tag), VecDeque<Arrived>>,
) -> Result<(bool, Option<String>), String> {
    const READ: usize = 64 << 10;
    let (payload, slots, slot_bytes) = geometry;
    let mut moved = false;
    let mut peer_reason = None;
    // Read what the socket has (a few slots' worth per round at most).
    while f.input.len() < 4 * slot_bytes && !p.closed {
        let len = f.input.len();
        f.input.resize(len + READ, 0);
        let got = p.socket.read(&mut f.input[len..]);
        f.input.truncate(len + *got.as_ref().unwrap_or(&0));
        match got {
            Ok(0) => p.closed = true,
            Ok(_) => moved = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => p.closed = true,
        }
    }
    let mut at = 0;
    while let Some((frame, used)) = SocketFrame::decode(&f.input[at..], slot_bytes)? {
        at += used;
        match frame {
            SocketFrame::Failover { received, reason } => {
                if f.heard.is_some() {
                    return Err("a second failover frame".into());
                }
                if received < p.credited || received > p.posted {
                    return Err(format!(
                        "rank {peer} says it took {received} chunks where {} were sent and {} credited",
                        p.posted, p.credited
                    ));
                }
                f.heard = Some(received);
                peer_reason = Some(reason);
            }
            SocketFrame::Moved { lane } => {
                if f.heard.is_none() || f.moved_to.is_some() {
                    return Err(format!(
                        "a moved frame (to lane {lane}) before its failover frame or after another"
                    ));
                }
                f.moved_to = Some(lane);
            }
            SocketFrame::Chunk { seq, slot } => {
                if let Some(lane) = f.moved_to {
                    return Err(format!(
                        "chunk {seq} arrived over tcp after the peer said it moved to lane {lane}"
                    ));
                }
                if f.heard.is_none() || seq != p.received {
                    return Err(format!(
                        "chunk {seq} arrived over tcp where chunk {} was next",
                        p.received
                    ));
                }
                let header = ChunkHeader::decode(&slot, slot_bytes - SLOT_HEADER, max_message)?;
                let chunk = &slot[SLOT_HEADER..];
                if chunk.len() != header.chunk_len as usize {
                    return Err(format!(
                        "a chunk frame of {} bytes says {}",
                        chunk.len(),
                        header.chunk_len
                    ));
                }
                p.received += 1;
                let arrived = match assemble(&mut p.assembling, header, chunk, peer, pool)? {
                    Step::Single => {
                        let mut data = pool.pop().unwrap_or_default();
                        data.clear();
                        data.extend_from_slice(chunk);
                        Some((header.tag, Arrived::Owned(data, None)))
                    }
                    Step::Completed(tag, data, transfer) => {
                        Some((tag, Arrived::Owned(data, transfer)))
                    }
                    Step::Partial => None,
                };
                if let Some((tag, arrived)) = arrived {
                    inbox.entry((peer, tag)).or_default().push_back(arrived);
                }
            }
        }
    }
    f.input.drain(..at);
    // The chunks the peer has not taken, still in their send slots (a slot is reused only
    // after the peer credits it back, and it credits only chunks it has taken).
    if let Some(from) = f.heard
        && !f.resent
    {
        for seq in from..p.posted {
            let at = (seq % slots) as usize * slot_bytes;
            let slot = send_slot(p, at, slot_bytes, payload)?;
            wire::encode_chunk(&mut f.out, seq, &[slot]);
        }
        f.resent = true;
        moved = true;
    }
    // Then what was queued, chunk by chunk.
    while f.resent && f.out.len() - f.written < FALLBACK_OUT_LIMIT {
        let Some(mut front) = p.outgoing.pop_front() else {
            break;
        };
        let bytes =
            &front.data[front.sent..front.sent + (front.data.len() - front.sent).min(payload)];
        let header = ChunkHeader {
            tag: front.tag,
            message_len: front.data.len() as u32,
            chunk_len: bytes.len() as u32,
        };
        wire::encode_chunk(&mut f.out, p.posted, &[&header.encode(), bytes]);
        p.posted += 1;
        let len = bytes.len();
        front.sent += len;
        p.queued -= len;
        moved = true;
        if front.sent < front.data.len() {
            p.outgoing.push_front(front);
        } else if pool.len() < POOL_LIMIT {
            pool.push(front.data);
        }
    }
    // Sealed: once the queue is framed, the peer learns where the later messages go.
    if let Some(lane) = f.seal
        && f.seal_unframed()
        && f.resent
        && p.outgoing.is_empty()
    {
        SocketFrame::Moved { lane }.encode_into(&mut f.out);
        f.sealed = true;
        moved = true;
    }
    while f.written < f.out.len() && !p.closed {
        match p.socket.write(&f.out[f.written..]) {
            Ok(0) => p.closed = true,
            Ok(n) => {
                f.written += n;
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => p.closed = true,
        }
    }
    if f.written == f.out.len() || f.written >= FALLBACK_OUT_LIMIT {
        f.out.drain(..f.written);
        f.written = 0;
    }
    Ok((moved, peer_reason))
}

/// The chunk (header and bytes) this side wrote into the send slot at `at`.
#[allow(unsafe_code)] // reading registered memory the NIC may still read
fn send_slot(p: &Peer, at: usize, slot_bytes: usize, payload: usize) -> Result<&[u8], String> {
    // SAFETY: only this side writes its send slots (the NIC reads them), and it writes a slot
    // only from `post_chunk`, which is not called on a peer that has moved to tcp.
    let slot = unsafe { p.send_slots.bytes(at..at + slot_bytes) };
    let header = ChunkHeader::decode(slot, payload, usize::MAX)?;
    Ok(&slot[..SLOT_HEADER + header.chunk_len as usize])
}

impl Transport for RdmaTransport {
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
        self.local_rank = local_rank;
        let (connected, refused) = connect::connect_all(self, local_rank, peers, deadline)?;
        for (peer, reason) in &refused {
            tracing::warn!(
                rank = local_rank,
                peer,
                device = %self.device.label(),
                %reason,
                "rdma link refused"
            );
        }
        self.refused = refused;
        for (peer, link) in connected {
            self.by_qp.insert(link.qp.num(), peer);
            self.peers.insert(
                peer,
                Peer {
                    qp: link.qp,
                    send_slots: link.send_slots,
                    ring: link.ring,
                    remote: link.remote,
                    socket: link.socket,
                    addr: link.addr,
                    outgoing: VecDeque::new(),
                    queued: 0,
                    posted: 0,
                    send_done: 0,
                    credited: 0,
                    credit_writes: 0,
                    received: 0,
                    freed: 0,
                    reported: 0,
                    done: VecDeque::new(),
                    held: 0,
                    assembling: None,
                    closed: false,
                    fallback: None,
                    bad_rkey_at: None,
                },
            );
        }
        Ok(())
    }

    fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError> {
        let max = self.config.max_message;
        let limit = self.config.max_queued_per_peer;
        let geometry = self.config.geometry();
        let (payload, slots, _) = geometry;
        let (closed, seal) = match self.peers.get(&peer) {
            None => return Err(TransportError::UnknownPeer { peer }),
            Some(p) => (p.closed, p.fallback.as_ref().and_then(|f| f.seal)),
        };
        if closed {
            return Err(self.peer_closed(peer));
        }
        if let Some(lane) = seal {
            return Err(self.link_failed(
                peer,
                format!("this link is sealed: messages to rank {peer} go over lane {lane}"),
            ));
        }
        if data.len() > max {
            return Err(TransportError::TooLarge {
                peer,
                len: data.len(),
                max,
            });
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        let Some(p) = self.peers.get_mut(&peer) else {
            return Err(TransportError::UnknownPeer { peer });
        };
        // With nothing queued and room in the ring, the chunks go straight from the caller's
        // bytes into send slots; otherwise what is left is copied into a queued buffer. A
        // message is at least one chunk (an empty one is a header alone). A message of at most
        // half a ring that does not fit the credits now is refused ("not now") rather than
        // copied: the caller comes back after progress, which returns credits in between, so
        // no rank posts long bursts while its peer's credits wait unread.
        // A peer moved to tcp takes every message through the queue (see `fallback_round`).
        let direct = p.outgoing.is_empty() && p.fallback.is_none();
        let chunks = data.len().div_ceil(payload).max(1) as u64;
        if direct
            && chunks <= slots / 2
            && !has_room(p.posted + chunks - 1, p.credited, p.send_done, slots)
        {
            self.pool.push(buf);
            return Ok(false);
        }
        let mut sent = 0;
        let mut posted_any = false;
        let mut failed = None;
        if direct {
            while (!posted_any || sent < data.len())
                && has_room(p.posted, p.credited, p.send_done, slots)
            {
                match post_chunk(p, peer, tag, data, sent, geometry) {
                    Ok(chunk) => sent += chunk,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
                posted_any = true;
            }
        }
        if failed.is_none() && posted_any && sent == data.len() {
            self.pool.push(buf);
            return Ok(true);
        }
        // Part of a message whose post failed is queued whatever the limit: it is taken.
        if failed.is_none() && p.queued > 0 && p.queued + data.len() - sent > limit {
            self.pool.push(buf);
            return Ok(false);
        }
        buf.clear();
        buf.extend_from_slice(data);
        p.queued += data.len() - sent;
        p.outgoing.push_back(Outgoing {
            tag,
            data: buf,
            sent,
        });
        if let Some(e) = failed {
            self.fail_over(peer, format!("posting to its QP failed: {}", e.0))?;
        }
        Ok(true)
    }

    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
        let slot_bytes = self.config.slot_bytes();
        let (data, transfer) = match self.take_arrived(peer, tag) {
            None => return self.nothing_arrived(peer).map(|()| None),
            Some(Arrived::Owned(data, transfer)) => (data, transfer),
            Some(Arrived::InRing { seq, len }) => {
                let mut data = self.pool.pop().unwrap_or_default();
                data.clear();
                if let Some(p) = self.peers.get_mut(&peer) {
                    data.extend_from_slice(slot_message(p, seq, len, slot_bytes));
                    release_slot(p, seq);
                }
                (data, None)
            }
        };
        Ok(Some(Received {
            peer,
            tag,
            data,
            transfer,
        }))
    }

    /// A one-chunk message is consumed where it landed in the ring: no copy out.
    fn try_recv_with(
        &mut self,
        peer: usize,
        tag: Tag,
        consume: &mut dyn FnMut(&[u8], Option<Duration>),
    ) -> Result<bool, TransportError> {
        let slot_bytes = self.config.slot_bytes();
        match self.take_arrived(peer, tag) {
            None => self.nothing_arrived(peer).map(|()| false),
            Some(Arrived::Owned(data, transfer)) => {
                consume(&data, transfer);
                if self.pool.len() < POOL_LIMIT {
                    self.pool.push(data);
                }
                Ok(true)
            }
            Some(Arrived::InRing { seq, len }) => {
                if let Some(p) = self.peers.get_mut(&peer) {
                    consume(slot_message(p, seq, len, slot_bytes), None);
                    release_slot(p, seq);
                }
                Ok(true)
            }
        }
    }

    fn release(&mut self, message: Received) {
        if self.pool.len() < POOL_LIMIT {
            self.pool.push(message.data);
        }
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        self.drain()?;
        let mut moved = self.handle_completions()?;
        moved |= self.pump()?;
        if !moved && self.last_socket_check.elapsed() >= SOCKET_CHECK {
            self.check_sockets();
        }
        Ok(moved)
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let spin_until = Instant::now() + self.config.busy_poll.min(timeout);
        loop {
            self.drain()?;
            if !self.completions.is_empty() {
                return Ok(());
            }
            if Instant::now() >= spin_until {
                break;
            }
            std::hint::spin_loop();
        }
        let mut fds = Vec::new();
        crate::transport::sleep_prepared(self, &mut fds, timeout).map_err(|source| {
            TransportError::Setup {
                what: format!(
                    "poll(2) on the completion channel of {}",
                    self.device.label()
                ),
                source,
            }
        })
    }

    fn prepare_wait(&mut self, fds: &mut Vec<(std::os::fd::RawFd, bool)>) -> Readiness {
        if self.drain().is_err() || !self.completions.is_empty() {
            return Readiness::Ready;
        }
        if self.device.arm().is_err() {
            return Readiness::Ready;
        }
        // A completion that came between the drain and the arm raised no event: look again.
        if self.drain().is_err() || !self.completions.is_empty() {
            return Readiness::Ready;
        }
        // A fallen-back link with chunks to frame has work without waiting.
        let framing = |p: &Peer| {
            p.fallback.as_ref().is_some_and(|f| {
                (f.heard.is_some() && !f.resent)
                    || (f.resent && !p.outgoing.is_empty() && f.out.len() < FALLBACK_OUT_LIMIT)
                    || (f.resent && p.outgoing.is_empty() && f.seal_unframed())
            })
        };
        if self.peers.values().any(|p| !p.closed && framing(p)) {
            return Readiness::Ready;
        }
        fds.push((self.device.channel_fd(), false));
        fds.extend(self.peers.values().filter(|p| !p.closed).map(|p| {
            let unwritten = p.fallback.as_ref().is_some_and(|f| f.written < f.out.len());
            (p.socket.as_raw_fd(), unwritten)
        }));
        Readiness::Sleep
    }

    fn after_wait(&mut self) {
        self.device.take_events();
        if self.last_socket_check.elapsed() >= SOCKET_CHECK {
            self.check_sockets();
        }
    }

    /// Every chunk is posted: the NIC delivers it without this process's help (dropping the
    /// transport waits for the completions, see `Drop`). Credits not yet returned (less than a
    /// batch) do not count: a sender waits for credits only with at least half a ring of
    /// chunks unacknowledged, all of them bound for a receiver that is still in the operation
    /// that needs them, so its progress fills the batch.
    fn flushed(&self) -> bool {
        self.peers.values().all(|p| {
            p.closed
                || (p.outgoing.is_empty()
                    && p.fallback
                        .as_ref()
                        .is_none_or(|f| f.resent && f.out.is_empty() && !f.seal_unframed()))
        })
    }

    fn take_refused(&mut self) -> Vec<(usize, String)> {
        std::mem::take(&mut self.refused)
    }

    fn path_changes(&self) -> Vec<PathChange> {
        self.failovers.clone()
    }

    fn path_change_count(&self) -> usize {
        self.failovers.len()
    }

    fn peer_lost(&self, peer: usize) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|p| p.closed && p.assembling.is_none())
            && !self.inbox.keys().any(|(from, _)| *from == peer)
    }
}

impl Drop for RdmaTransport {
    /// Destroying a QP aborts its writes in flight: first let posted writes complete (bounded,
    /// and not at all towards a peer that is gone).
    fn drop(&mut self) {
        let end = Instant::now() + Duration::from_secs(2);
        let pending = |t: &RdmaTransport| {
            t.peers.values().any(|p| {
                !p.closed
                    && match &p.fallback {
                        Some(f) => {
                            !p.outgoing.is_empty()
                                || !f.resent
                                || !f.out.is_empty()
                                || f.seal_unframed()
                        }
                        None => {
                            !p.outgoing.is_empty() || p.send_done < p.posted || p.credit_writes > 0
                        }
                    }
            })
        };
        while pending(self) && Instant::now() < end {
            if self.progress().is_err() {
                break;
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests;
