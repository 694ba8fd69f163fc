//! The `Transport` trait and the small types around it.

use crate::error::TransportError;
use std::fmt;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// A message label chosen by the core; a receive matches the sender's tag exactly.
pub type Tag = u64;

/// Where a transport can be reached, opaque to everyone but the transport: at most 128 bytes.
#[derive(Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PeerAddress(Vec<u8>);

impl PeerAddress {
    pub const MAX_LEN: usize = 128;

    pub fn new(bytes: Vec<u8>) -> Result<Self, String> {
        if bytes.len() > Self::MAX_LEN {
            return Err(format!(
                "address of {} bytes exceeds {} bytes",
                bytes.len(),
                Self::MAX_LEN
            ));
        }
        Ok(PeerAddress(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for PeerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(s) => write!(f, "PeerAddress({s})"),
            Err(_) => write!(f, "PeerAddress({:02x?})", self.0),
        }
    }
}

/// Memory a transport can read from and write into directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryKind {
    Host,
    /// Device memory (GPUDirect-style paths). No transport declares it yet.
    Device,
}

/// What a transport declares about itself, so the core need not guess.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// Short name for logs: "tcp", "mem".
    pub name: &'static str,
    /// The largest message `try_send` accepts.
    pub max_message: usize,
    /// Bytes that may be queued towards one peer before `try_send` answers "not now".
    pub max_queued_per_peer: usize,
    /// Memory kinds `try_send` may read and received messages may be written into.
    pub memory: &'static [MemoryKind],
}

/// A message taken from a transport. Give it back with [`Transport::release`] so its buffer
/// is reused (no allocation per message in steady state).
#[derive(Debug)]
pub struct Received {
    pub peer: usize,
    pub tag: Tag,
    pub data: Vec<u8>,
    /// How long the message took to arrive, from its first byte to its last, where the
    /// transport can tell (TCP); the health layer turns it into per-link bandwidth.
    pub transfer: Option<std::time::Duration>,
}

/// What [`Transport::try_recv_into`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landing {
    /// The message fills the destination, with its transfer time where known (see
    /// [`Received::transfer`]).
    Filled(Option<Duration>),
    /// The message has this many bytes, not the destination's length; it was dropped and the
    /// destination is untouched.
    WrongLength(usize),
    /// Not fully arrived: call again with the same destination.
    Pending,
}

impl Landing {
    /// Copy an arrived message into `dest` where the lengths agree.
    pub fn fill(data: &[u8], dest: &mut [u8], transfer: Option<Duration>) -> Landing {
        if data.len() == dest.len() {
            dest.copy_from_slice(data);
            Landing::Filled(transfer)
        } else {
            Landing::WrongLength(data.len())
        }
    }
}

/// What [`Transport::prepare_wait`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Nothing can move now; the pushed descriptors signal when something may.
    Sleep,
    /// Something can move already: do not sleep.
    Ready,
    /// This transport has no descriptor to sleep on (the in-process transport).
    Unsupported,
}

/// A link that moved to another path mid-run, as [`Transport::path_changes`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathChange {
    pub peer: usize,
    /// The path it left: "rdma rxe0 port 1".
    pub from: String,
    /// The path it is on now: "tcp", or another lane's "rdma rxe1 port 1".
    pub to: String,
    /// What failed, or what the peer said failed on its side.
    pub reason: String,
}

/// A non-blocking, poll-driven way to move tagged messages between ranks.
///
/// The shape fits RDMA verbs: transport-owned slots are registered memory, `try_send` is a
/// post of an RDMA WRITE with immediate data (the tag) into a peer's slot, back-pressure is
/// running out of credits, `try_recv` is a completion-queue poll, and `wait` blocks on the
/// completion channel.
///
/// Data-path calls never block. Completion is found by polling: `try_send` copies the bytes
/// into a slot the transport owns (or answers `Ok(false)` when the peer's queue is full),
/// `progress` moves bytes, `try_recv` hands out a fully arrived message. Messages between
/// one pair of ranks with one tag arrive in send order; different tags may overtake.
pub trait Transport: Send + fmt::Debug {
    fn capabilities(&self) -> &Capabilities;

    /// This endpoint's address, to be published to the other ranks.
    fn address(&self) -> &PeerAddress;

    /// Connect with every listed peer, as rank `local_rank`. Blocks at most until `deadline`;
    /// the error names the peers still missing then.
    fn connect(
        &mut self,
        local_rank: usize,
        peers: &[(usize, PeerAddress)],
        deadline: Instant,
    ) -> Result<(), TransportError>;

    /// Queue `data` to `peer` under `tag`. `Ok(false)`: back-pressure, nothing was queued.
    fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError>;

    /// Queue a message of `len` bytes to `peer` under `tag` whose bytes `fill` writes straight
    /// into memory the transport owns (the shm ring), so that a device copies its data there
    /// with no pass through a host buffer of the caller's. `Ok(None)`: this transport, or this
    /// message, is not filled in place (send it with `try_send`). `Ok(Some(false))`:
    /// back-pressure, or `fill` answered false; nothing was queued either way.
    fn try_send_filled(
        &mut self,
        peer: usize,
        tag: Tag,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Result<Option<bool>, TransportError> {
        let _ = (peer, tag, len, fill);
        Ok(None)
    }

    /// The next message from `peer` under `tag`, if it has fully arrived.
    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError>;

    /// The next message from `peer` under `tag`, handed to `consume` where it lies (the shm
    /// transport: in the ring, with no copy out) and freed when `consume` returns, together with
    /// the transfer time where known (see [`Received::transfer`]). `Ok(false)`: it has not fully
    /// arrived.
    fn try_recv_with(
        &mut self,
        peer: usize,
        tag: Tag,
        consume: &mut dyn FnMut(&[u8], Option<Duration>),
    ) -> Result<bool, TransportError> {
        match self.try_recv(peer, tag)? {
            Some(message) => {
                consume(&message.data, message.transfer);
                self.release(message);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The next message from `peer` under `tag`, written straight into `dest` where the
    /// transport can (tcp: a long frame whose header has been read but not its payload is read
    /// from the socket into `dest`, with no copy through a buffer of its own); otherwise copied
    /// there once it has arrived.
    ///
    /// [`Landing::Pending`] may leave part of the message in `dest` already: call again with
    /// the same `dest` (same memory, same length) until the answer is another, and do not
    /// touch `dest` in between. A caller that gives up on a message halfway makes the
    /// transport report a protocol error naming the peer on a later call.
    fn try_recv_into(
        &mut self,
        peer: usize,
        tag: Tag,
        dest: &mut [u8],
    ) -> Result<Landing, TransportError> {
        let mut landing = Landing::Pending;
        self.try_recv_with(peer, tag, &mut |data, transfer| {
            landing = Landing::fill(data, dest, transfer);
        })?;
        Ok(landing)
    }

    /// Return a message's buffer to the transport.
    fn release(&mut self, message: Received);

    /// Move bytes without blocking. Returns whether anything moved.
    fn progress(&mut self) -> Result<bool, TransportError>;

    /// Sleep until bytes may move, or at most `timeout`.
    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError>;

    /// Get ready to sleep beside other transports in one `poll(2)` (see
    /// [`crate::routes::Routes`]): push the descriptors whose readiness (readable, or also
    /// writable where the flag is set) means bytes may move, and arm whatever wake-up the
    /// transport needs. [`Readiness::Ready`]: something can move already, do not sleep.
    /// Every call that does not answer `Unsupported` is followed by [`Transport::after_wait`].
    fn prepare_wait(&mut self, _fds: &mut Vec<(RawFd, bool)>) -> Readiness {
        Readiness::Unsupported
    }

    /// The sleep that [`Transport::prepare_wait`] prepared is over: disarm wake-ups.
    fn after_wait(&mut self) {}

    /// Peers `connect` agreed with to carry no traffic over this transport (both ends refuse
    /// alike: the RDMA setup of the pair failed), with the reason. Taken once, after `connect`;
    /// [`crate::routes::Routes`] sends them over tcp instead.
    fn take_refused(&mut self) -> Vec<(usize, String)> {
        Vec::new()
    }

    /// Peers whose link moved to another path since `connect` (an RDMA queue pair failed and
    /// the link went on over tcp), oldest first. Not an error: their messages still arrive.
    fn path_changes(&self) -> Vec<PathChange> {
        Vec::new()
    }

    /// How many `path_changes` there are: cheap, for a caller that looks after every
    /// operation and fetches the list only when it grew.
    fn path_change_count(&self) -> usize {
        0
    }

    /// Spread the messages sent from now on to each peer over at most `per_peer` of the
    /// connections this transport keeps to it (`None`: all of them). Only the sender's choice:
    /// a receiver takes a message on whichever connection it comes. Transports with one
    /// channel per peer ignore it.
    fn limit_connections(&mut self, _per_peer: Option<usize>) {}

    /// Whether every queued send has left this process.
    fn flushed(&self) -> bool;

    /// Whether the link to `peer` is gone (closed, reset, or dropped) with nothing it sent
    /// left unread: waiting for it is pointless.
    fn peer_lost(&self, peer: usize) -> bool;

    /// The small-message lines to every peer, where this transport has them (shm).
    fn lines(&mut self) -> Option<&mut dyn Lines> {
        None
    }

    /// Lending large messages for the receiver to copy out of this process's memory itself
    /// (single copy), where this transport can (shm, to peers that may read our memory).
    fn lend(&mut self) -> Option<&mut dyn Lend> {
        None
    }
}

/// A loan's number, from [`Lend::offer`], unique per peer.
pub type LoanId = u64;

/// Single copy: instead of copying a message into its own buffers, the transport tells the
/// peer where the bytes lie in this process, and the peer copies them from there straight into
/// its destination (cross-memory attach; OpenMPI's `sm` CMA path). The sender gets the
/// memory back when the peer says it is done: until [`Lend::returned`] answers true, the bytes
/// must stay where they are, unchanged. The receiving side needs nothing new: a lent message
/// arrives through the `try_recv*` calls like any other.
pub trait Lend {
    /// Whether `peer` can copy from this process's memory (found out when connecting).
    fn reaches(&mut self, peer: usize) -> bool;

    /// Lend `data` to `peer` under `tag`. `Ok(None)`: not now (too many loans out, or no room
    /// for the notice), try again later.
    fn offer(
        &mut self,
        peer: usize,
        tag: Tag,
        data: &[u8],
    ) -> Result<Option<LoanId>, TransportError>;

    /// Whether `peer` has finished copying loan `loan`.
    fn returned(&mut self, peer: usize, loan: LoanId) -> Result<bool, TransportError>;
}

/// What [`Lines::collect`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collected {
    /// The whole payload has arrived and is in `out`.
    Complete,
    /// Not all of it yet.
    Partial,
    /// The peer's post of this number has another check: it runs another operation. The
    /// first line's bytes (at most 56) are at the start of `out`.
    Foreign(u64),
}

/// Small messages that travel with their arrival flag in one cache line (NCCL's LL protocol
/// on host memory), beside a transport's ordinary messages. A post is one payload per peer
/// under a stamp: the post's number in the upper 32 bits (consecutive, the same on every
/// rank), a check of what the operation is in the lower 32 (never 0 as a whole).
///
/// Each peer's lines hold two posts, alternating by the number's parity, with no
/// acknowledgement: a rank may make post `s` only once every peer it posts to has finished
/// collecting `s - 2` from it. Posting only for operations in which every rank posts and
/// collects from every other gives that for free (a rank that has collected everyone's `s - 1`
/// knows that each of them had finished `s - 2`): all-reduce and barrier, not broadcast, and
/// operations of other kinds in between do not count.
pub trait Lines {
    /// The largest payload of one post.
    fn max_payload(&self) -> usize;

    /// Whether `peer` has lines to this rank (the same host).
    fn reaches(&self, peer: usize) -> bool;

    /// Post `payload` to each of `peers` under `stamp`, waking those that sleep.
    fn post(&mut self, peers: &[usize], stamp: u64, payload: &[u8]) -> Result<(), TransportError>;

    /// Copy `peer`'s post `stamp` into `out` (its length is the payload's) once all of it
    /// has arrived.
    fn collect(
        &mut self,
        peer: usize,
        stamp: u64,
        out: &mut [u8],
    ) -> Result<Collected, TransportError>;

    /// Sleep until one of the `awaited` posts (peer, stamp, payload length) may have arrived
    /// or a peer has died, at most `timeout`.
    fn sleep(
        &mut self,
        awaited: &[(usize, u64, usize)],
        timeout: Duration,
    ) -> Result<(), TransportError>;
}

/// One sleep of `t` beside nothing else: what its `prepare_wait` armed, in one `poll(2)` of at
/// most `timeout` (a transport that cannot say sleeps 100 µs at most), then `after_wait`.
/// `fds` is scratch, cleared first.
pub(crate) fn sleep_prepared<T: Transport + ?Sized>(
    t: &mut T,
    fds: &mut Vec<(RawFd, bool)>,
    timeout: Duration,
) -> std::io::Result<()> {
    fds.clear();
    let slept = match t.prepare_wait(fds) {
        Readiness::Sleep => crate::poll::poll_fds(fds, timeout),
        Readiness::Ready => Ok(()),
        Readiness::Unsupported => {
            std::thread::sleep(timeout.min(Duration::from_micros(100)));
            Ok(())
        }
    };
    t.after_wait();
    slept
}
