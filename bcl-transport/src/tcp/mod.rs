//! `tcp`: several non-blocking sockets per peer, framed by a pure codec.
//!
//! Setup (`connect`): the lower rank of each pair dials `sockets_per_peer` connections to the
//! higher rank's listener; each connection proves the communicator's secret (see
//! [`crate::auth`]) and introduces itself. Data path: `try_send` copies a message into a
//! pooled buffer queued on the socket its tag picks (tag modulo the sockets in use: the
//! consecutive tags of a plan's slices stream over different sockets, and the messages of one
//! tag keep their order) and writes what the socket takes at once; `progress` writes queued
//! frames with `writev` and reads arriving frames: small ones through a 16 KiB stage (a frame's
//! header and payload, or several frames, in one `recv`), long payloads straight into pooled
//! buffers; a read that comes back short ends the socket's turn (no `recv` that would only say
//! "would block"); `wait` sleeps in `poll(2)`. A peer that closes its sockets is reported when
//! a send or receive needs it and nothing it sent is left unread.

pub mod codec;
pub(crate) mod connect;
mod inbox;
#[cfg(test)]
mod tests;

use crate::auth::Secret;
use crate::error::TransportError;
use crate::keys::KeyMap;
use crate::transport::{
    Capabilities, Landing, MemoryKind, PeerAddress, Readiness, Received, Tag, Transport,
};
use codec::{FrameDecoder, HEADER_LEN, encode_header};
use inbox::Inbox;
use std::collections::{HashSet, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Block until one of `sources` is readable or `timeout` passes (poll(2)): lets callers
/// multiplex std sockets without unsafe code of their own.
pub fn wait_readable(sources: &[std::os::fd::BorrowedFd<'_>], timeout: Duration) -> io::Result<()> {
    let fds: Vec<(std::os::fd::RawFd, bool)> =
        sources.iter().map(|s| (s.as_raw_fd(), false)).collect();
    crate::poll::poll_fds(&fds, timeout)
}

/// Settings of a TCP endpoint.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Address to listen on and publish (loopback by default).
    pub bind_ip: IpAddr,
    /// Connections per peer (≥ 1).
    pub sockets_per_peer: usize,
    /// The communicator's secret; connections that cannot prove it are refused.
    pub secret: Secret,
    /// The largest frame payload accepted from a peer.
    pub max_frame: usize,
    /// SO_SNDBUF / SO_RCVBUF per socket (0: the kernel's autotuning). The kernel caps it at
    /// `net.core.wmem_max` / `rmem_max`.
    pub socket_buffer: usize,
    /// Bytes copied into the transport's queue towards one peer before `try_send` answers
    /// "not now". Small, so that a busy socket makes the caller retry (and then write from its
    /// own memory) instead of copying every message. Counted per rank in a 2-rank 256 MiB
    /// allreduce over two connections: 62-89 % of the bytes went through a 16 MiB queue,
    /// 8-15 % through 1 MiB (4-7 % over one connection, as such an allreduce now goes).
    pub max_queued_per_peer: usize,
    /// The congestion control of every connection (`TCP_CONGESTION`, a name the kernel
    /// allows: `net.ipv4.tcp_allowed_congestion_control`). `None`: a connection to a loopback
    /// address that the system gives a pacing algorithm (BBR) gets cubic, or reno where cubic
    /// is refused, and the rest keep the system's ([`LOOPBACK_CONGESTION`]).
    pub congestion: Option<String>,
}

/// What a loopback connection runs where the system's default congestion control paces its
/// sends. BBR paces each connection at the rate it has estimated, and on loopback, where no
/// link needs pacing, that estimate is whatever the connection's first round trips gave: a
/// 2-rank 1 MiB allreduce ran at 239-447 µs from one launch to the next under BBR and at
/// 237-281 (then 260-262, the VM's slower state) under cubic, 6 launches of each alternating
/// with the system default switched (2026-12-05, Intel Xeon VM; OpenMPI, whose sockets take
/// the default, 394 against 279-284). `perf` put the slow launches' extra time in
/// `tcp_write_xmit`'s pacing timer.
pub const LOOPBACK_CONGESTION: [&str; 2] = ["cubic", "reno"];

/// How `config` asks its connections' congestion control to be chosen.
fn congestion_of(config: &TcpConfig) -> connect::Congestion<'_> {
    match &config.congestion {
        Some(name) => connect::Congestion::Named(name),
        None => connect::Congestion::Auto,
    }
}

/// The congestion control algorithms that pace their sends.
pub(crate) const PACING: [&str; 1] = ["bbr"];

impl TcpConfig {
    pub fn new(secret: Secret) -> Self {
        TcpConfig {
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            sockets_per_peer: 2,
            secret,
            max_frame: 64 << 20,
            socket_buffer: 4 << 20,
            max_queued_per_peer: 1 << 20,
            congestion: None,
        }
    }
}

struct OutFrame {
    header: [u8; HEADER_LEN],
    payload: Vec<u8>,
    written: usize,
}

struct Conn {
    stream: TcpStream,
    out: VecDeque<OutFrame>,
    decoder: FrameDecoder,
    /// When the first bytes of the frame being received were read.
    frame_started: Option<Instant>,
    /// Bytes read ahead of the decoder: a small frame's header and payload come in one
    /// `recv`, not one for each (allocated on first use; always wholly fed to the decoder
    /// before the read returns, so no byte waits here unseen by `poll(2)`).
    stage: Vec<u8>,
    /// A long frame whose header has been read and whose payload is left in the socket, for
    /// `try_recv_into` to read straight into its caller's memory (see [`Held`]).
    held: Option<Held>,
    /// Stage bytes not fed anywhere yet: the start of the held frame's payload.
    staged: std::ops::Range<usize>,
    /// The frame being decoded was given up halfway by the caller it was held for: when it
    /// completes, the loss is reported instead of delivering a frame with a hole.
    spoiled: Option<Tag>,
    /// Such a frame completed and was dropped: the next read reports it.
    lost: Option<Tag>,
    closed: bool,
}

/// A long frame waiting in its socket for the caller that wants it (see `Conn::held`).
/// `progress` gives it back to the ordinary path (a pooled buffer) unless
/// `try_recv_into` read it since the previous `progress`: a frame nobody is ready to take
/// must not block the frames behind it on the same socket.
struct Held {
    tag: Tag,
    len: usize,
    /// Payload bytes already in the caller's memory.
    filled: usize,
    claimed: bool,
}

/// Bytes a socket reads ahead of its decoder. A payload part at least this long is read
/// straight into the frame's buffer instead, so large messages are not copied twice.
const STAGE_BYTES: usize = 16 << 10;

/// What one read from a socket did.
enum ReadOutcome {
    /// The socket gave as many bytes as were asked for: there may be more.
    Full,
    /// It gave fewer: it is drained for now, and another read would only say "would block".
    Short,
    /// Nothing to read now.
    Empty,
    /// The peer closed the connection.
    Closed,
    /// A long frame's header came: its payload waits in the socket (see [`Held`]).
    Held,
}

struct Peer {
    addr: String,
    conns: Vec<Conn>,
    queued: usize,
    closed: bool,
}

/// A TCP endpoint of one rank.
pub struct TcpTransport {
    config: TcpConfig,
    capabilities: Capabilities,
    listener: TcpListener,
    address: PeerAddress,
    peers: KeyMap<usize, Peer>,
    inbox: Inbox,
    pool: Vec<Vec<u8>>,
    /// Which sockets have something to read, checked once per progress round.
    readable: crate::poll::ReadableSet,
    /// The descriptors `wait` sleeps on, kept between calls (no allocation per wait).
    wait_fds: Vec<(std::os::fd::RawFd, bool)>,
    /// How many of a peer's connections messages are spread over (`None`: all of them), as
    /// set by [`Transport::limit_connections`].
    connections_in_use: Option<usize>,
    /// The message a caller last asked for and did not find: (peer, tag). A progress round
    /// reads its socket first and skips the poll(2) when that read drains it.
    wanted: Option<(usize, Tag)>,
    /// Progress rounds in a row that skipped the poll(2): bounded, so that the other sockets
    /// are read while one keeps bringing bytes.
    polls_skipped: u32,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TcpTransport({:?}, {} peers)",
            self.address,
            self.peers.len()
        )
    }
}

const POOL_LIMIT: usize = 256;

/// The connection, of a peer's `conns`, that carries `tag` when messages are spread over
/// `in_use` of them (`None`: all): the sender's choice, which the receiver repeats to read the
/// wanted message's socket first. `conns` is at least 1.
fn connection_for(tag: Tag, conns: usize, in_use: Option<usize>) -> usize {
    let width = in_use.map_or(conns, |n| n.clamp(1, conns)).max(1);
    (tag % width as u64) as usize
}

/// Progress rounds in a row that may skip the poll(2) because the wanted socket was drained.
const MAX_POLLS_SKIPPED: u32 = 8;

/// What a progress round's first read, of the wanted message's socket, found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstRead {
    Nothing,
    /// Bytes up to the socket's end: no poll(2) this round.
    Drained,
    /// Other bytes: the round polls and reads on as usual.
    Bytes,
    /// A long frame's header on (peer, connection): its caller takes the payload next round.
    Held((usize, usize)),
}

impl TcpTransport {
    /// One read of the socket the wanted message travels on (the sender's choice for its tag,
    /// if the sender spreads as this rank does), where it has no held frame.
    fn read_wanted(&mut self) -> Result<FirstRead, TransportError> {
        let Some((peer, tag)) = self.wanted else {
            return Ok(FirstRead::Nothing);
        };
        let Some(p) = self.peers.get_mut(&peer) else {
            return Ok(FirstRead::Nothing);
        };
        let c = connection_for(tag, p.conns.len(), self.connections_in_use);
        let Some(conn) = p.conns.get_mut(c) else {
            return Ok(FirstRead::Nothing);
        };
        if conn.closed || conn.held.is_some() {
            return Ok(FirstRead::Nothing);
        }
        let read = conn
            .read_some(&mut self.pool, &mut self.inbox, peer)
            .map_err(|e| e.naming(peer, &p.addr))?;
        Ok(match read {
            // Drained: short frames came whole (often the wanted one, or the next operation's
            // on the same socket while `wanted` still names this one's).
            ReadOutcome::Short => FirstRead::Drained,
            ReadOutcome::Full => FirstRead::Bytes,
            ReadOutcome::Held => FirstRead::Held((peer, c)),
            ReadOutcome::Empty => FirstRead::Nothing,
            ReadOutcome::Closed => {
                conn.closed = true;
                FirstRead::Nothing
            }
        })
    }

    /// Listen on `config.bind_ip`, an ephemeral port.
    pub fn bind(config: TcpConfig) -> Result<Self, TransportError> {
        let (listener, address) = connect::listen(config.bind_ip, "a TCP listener")?;
        // Accepted connections keep their listener's congestion control.
        let congestion = congestion_of(&config);
        connect::choose_congestion(
            &socket2::SockRef::from(&listener),
            congestion,
            config.bind_ip.is_loopback(),
        )
        .map_err(|source| TransportError::Setup {
            what: format!("{congestion} of a TCP listener on {}", config.bind_ip),
            source,
        })?;
        let capabilities = Capabilities {
            name: "tcp",
            max_message: config.max_frame,
            max_queued_per_peer: config.max_queued_per_peer,
            memory: &[MemoryKind::Host],
        };
        Ok(TcpTransport {
            config: TcpConfig {
                sockets_per_peer: config.sockets_per_peer.max(1),
                ..config
            },
            capabilities,
            listener,
            address,
            peers: KeyMap::default(),
            inbox: Inbox::default(),
            pool: Vec::new(),
            connections_in_use: None,
            readable: Default::default(),
            wait_fds: Vec::new(),
            wanted: None,
            polls_skipped: 0,
        })
    }

    fn peer_mut(&mut self, peer: usize) -> Result<&mut Peer, TransportError> {
        self.peers
            .get_mut(&peer)
            .ok_or(TransportError::UnknownPeer { peer })
    }

    fn configure(&self, peer: usize, addr: &str, s: &TcpStream) -> Result<(), TransportError> {
        let sock = socket2::SockRef::from(s);
        let size = self.config.socket_buffer;
        let r = s
            .set_nodelay(true)
            .and_then(|_| s.set_nonblocking(true))
            .and_then(|_| s.set_read_timeout(None))
            .and_then(|_| s.set_write_timeout(None))
            // 0 leaves the kernel's autotuning (which a set size turns off).
            .and_then(|_| match size {
                0 => Ok(()),
                _ => sock
                    .set_send_buffer_size(size)
                    .and_then(|_| sock.set_recv_buffer_size(size)),
            });
        r.map_err(|source| TransportError::Io {
            op: "configure socket",
            peer,
            addr: addr.to_string(),
            source,
        })
    }
}

/// Write `header` and `data` as far as the socket takes them without blocking.
fn write_direct(stream: &mut TcpStream, header: &[u8], data: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    let total = header.len() + data.len();
    while done < total {
        let slices = if done < header.len() {
            [IoSlice::new(&header[done..]), IoSlice::new(data)]
        } else {
            [
                IoSlice::new(&[]),
                IoSlice::new(&data[done - header.len()..]),
            ]
        };
        match stream.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Write as much of `conn.out` as the socket takes. Returns bytes written.
fn flush(conn: &mut Conn, pool: &mut Vec<Vec<u8>>) -> io::Result<usize> {
    let mut total = 0;
    while let Some(front) = conn.out.front_mut() {
        let (h, p) = if front.written < HEADER_LEN {
            (&front.header[front.written..], &front.payload[..])
        } else {
            (&[][..], &front.payload[front.written - HEADER_LEN..])
        };
        let n = match conn
            .stream
            .write_vectored(&[IoSlice::new(h), IoSlice::new(p)])
        {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        total += n;
        front.written += n;
        if front.written == HEADER_LEN + front.payload.len()
            && let Some(done) = conn.out.pop_front()
            && pool.len() < POOL_LIMIT
        {
            pool.push(done.payload);
        }
    }
    Ok(total)
}

impl Transport for TcpTransport {
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
        let n = self.config.sockets_per_peer;
        let mut inbound = HashSet::new();
        let mut outbound = Vec::new();
        for (peer, addr) in peers {
            let sa = connect::parse_addr(*peer, addr, "a TCP socket address")?;
            for i in 0..n {
                if *peer < local_rank {
                    inbound.insert((*peer, i));
                } else if *peer > local_rank {
                    outbound.push((*peer, i, sa));
                }
            }
            self.peers.insert(
                *peer,
                Peer {
                    addr: sa.to_string(),
                    conns: Vec::new(),
                    queued: 0,
                    closed: false,
                },
            );
        }
        let listener = self
            .listener
            .try_clone()
            .map_err(|source| TransportError::Setup {
                what: "cloning the listener".into(),
                source,
            })?;
        let secret = self.config.secret;
        let acceptor = std::thread::spawn(move || {
            connect::accept_all(
                &listener,
                secret,
                local_rank,
                inbound,
                deadline,
                connect::AUTH_CONTEXT,
            )
        });
        let mut established = Vec::new();
        let mut dial_error = None;
        for (peer, index, sa) in outbound {
            match connect::dial(
                sa,
                &self.config.secret,
                local_rank,
                peer,
                index,
                deadline,
                connect::AUTH_CONTEXT,
                congestion_of(&self.config),
            ) {
                Ok(s) => established.push((peer, index, s)),
                Err(e) => {
                    dial_error = Some(e);
                    break;
                }
            }
        }
        let accepted = acceptor.join().map_err(|_| TransportError::Setup {
            what: "the accept thread panicked".into(),
            source: io::Error::other("panic"),
        })?;
        if let Some(e) = dial_error {
            return Err(e);
        }
        established.extend(accepted?);
        established.sort_by_key(|(p, i, _)| (*p, *i));
        for (peer, _, stream) in established {
            let addr = self
                .peers
                .get(&peer)
                .map(|p| p.addr.clone())
                .unwrap_or_default();
            self.configure(peer, &addr, &stream)?;
            let conn = Conn {
                stream,
                out: VecDeque::new(),
                decoder: FrameDecoder::new(self.config.max_frame),
                frame_started: None,
                stage: Vec::new(),
                held: None,
                staged: 0..0,
                spoiled: None,
                lost: None,
                closed: false,
            };
            self.peer_mut(peer)?.conns.push(conn);
        }
        Ok(())
    }

    fn try_send(&mut self, peer: usize, tag: Tag, data: &[u8]) -> Result<bool, TransportError> {
        let max = self.config.max_frame;
        let limit = self.config.max_queued_per_peer;
        let mut buf = self.pool.pop().unwrap_or_default();
        let p = self
            .peers
            .get_mut(&peer)
            .ok_or(TransportError::UnknownPeer { peer })?;
        if p.conns.is_empty() {
            return Err(TransportError::PeerClosed {
                peer,
                addr: p.addr.clone(),
            });
        }
        if data.len() > max {
            return Err(TransportError::TooLarge {
                peer,
                len: data.len(),
                max,
            });
        }
        if p.queued > 0 && p.queued + data.len() > limit {
            self.pool.push(buf);
            return Ok(false);
        }
        // One tag, one socket: its messages arrive in order (the Transport contract).
        let c = connection_for(tag, p.conns.len(), self.connections_in_use);
        let conn = &mut p.conns[c];
        if conn.closed {
            self.pool.push(buf);
            return Err(TransportError::PeerClosed {
                peer,
                addr: p.addr.clone(),
            });
        }
        let header = encode_header(tag, data.len() as u32);
        // An idle socket takes what it can straight from the caller's bytes; only the part it
        // did not take is copied into a transport-owned buffer.
        let mut written = 0;
        if conn.out.is_empty() {
            written = write_direct(&mut conn.stream, &header, data).map_err(|source| {
                TransportError::Io {
                    op: "send",
                    peer,
                    addr: p.addr.clone(),
                    source,
                }
            })?;
        }
        if written == HEADER_LEN + data.len() {
            self.pool.push(buf);
            return Ok(true);
        }
        let skip = written.saturating_sub(HEADER_LEN);
        buf.clear();
        buf.extend_from_slice(&data[skip..]);
        conn.out.push_back(OutFrame {
            header,
            payload: buf,
            // Offsets in `OutFrame` count the header and the (remaining) payload.
            written: written.min(HEADER_LEN),
        });
        p.queued = p.conns.iter().map(queued_bytes).sum();
        Ok(true)
    }

    fn try_recv(&mut self, peer: usize, tag: Tag) -> Result<Option<Received>, TransportError> {
        if let Some((data, transfer)) = self.inbox.pop(peer, tag) {
            return Ok(Some(Received {
                peer,
                tag,
                data,
                transfer: Some(transfer),
            }));
        }
        let p = self.peer_mut(peer)?;
        if p.closed {
            return Err(TransportError::PeerClosed {
                peer,
                addr: p.addr.clone(),
            });
        }
        self.wanted = Some((peer, tag));
        Ok(None)
    }

    fn try_recv_into(
        &mut self,
        peer: usize,
        tag: Tag,
        dest: &mut [u8],
    ) -> Result<Landing, TransportError> {
        if let Some((data, transfer)) = self.inbox.pop(peer, tag) {
            let landing = Landing::fill(&data, dest, Some(transfer));
            if self.pool.len() < POOL_LIMIT {
                self.pool.push(data);
            }
            return Ok(landing);
        }
        let p = self
            .peers
            .get_mut(&peer)
            .ok_or(TransportError::UnknownPeer { peer })?;
        let addr = &p.addr;
        for conn in p.conns.iter_mut() {
            if conn.held.as_ref().is_none_or(|h| h.tag != tag) {
                continue;
            }
            let result = if conn.held.as_ref().is_some_and(|h| h.len != dest.len()) {
                // Not what the caller expects: the ordinary path receives it, and the next
                // call finds it whole and says how long it is.
                conn.release_held(&mut self.pool, &mut self.inbox, peer)
                    .map(|()| Landing::Pending)
            } else {
                conn.read_held(dest, &mut self.pool)
            };
            return result.map_err(|e| e.naming(peer, addr));
        }
        if p.closed {
            return Err(TransportError::PeerClosed {
                peer,
                addr: p.addr.clone(),
            });
        }
        self.wanted = Some((peer, tag));
        Ok(Landing::Pending)
    }

    fn release(&mut self, message: Received) {
        if self.pool.len() < POOL_LIMIT {
            self.pool.push(message.data);
        }
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        let mut moved = false;
        // With several sockets, one zero-timeout poll(2) finds the readable ones: a read
        // attempt on each would cost a system call per socket per round while waiting.
        let open = self.peers.values().flat_map(|p| &p.conns);
        let checked = open.filter(|c| !c.closed).count() > 1;
        // The socket of the message the caller waits for, read before anything else: where
        // that drains it (short frames), this round skips the poll(2) (a system call on every
        // arrival: 2 ranks, 8 B, tcp, one socket per peer took 4.2 µs where two took 5.2). The
        // other sockets are read in a later round, at most `MAX_POLLS_SKIPPED` rounds on. Bytes
        // of a long message do not skip it: a stream spread over several sockets would stall
        // on the ones left unread (1 MiB, 4 ranks: 658 -> 968 µs when they did).
        let mut first = FirstRead::Nothing;
        if checked && self.polls_skipped < MAX_POLLS_SKIPPED {
            first = self.read_wanted()?;
            moved |= first != FirstRead::Nothing;
        }
        let skip_poll = first == FirstRead::Drained;
        if skip_poll {
            self.polls_skipped += 1;
        } else if checked {
            self.polls_skipped = 0;
            self.readable.clear();
            for conn in self.peers.values().flat_map(|p| &p.conns) {
                if !conn.closed {
                    self.readable.push(conn.stream.as_raw_fd());
                }
            }
            self.readable
                .check()
                .map_err(|source| TransportError::Setup {
                    what: "poll(2) on the peer sockets".into(),
                    source,
                })?;
        }
        let mut index = 0;
        for (&peer, p) in self.peers.iter_mut() {
            for (c, conn) in p.conns.iter_mut().enumerate().filter(|(_, c)| !c.closed) {
                let readable = !skip_poll && (!checked || self.readable.readable(index));
                index += 1;
                if !conn.out.is_empty() {
                    let n = flush(conn, &mut self.pool).map_err(|source| TransportError::Io {
                        op: "send",
                        peer,
                        addr: p.addr.clone(),
                        source,
                    })?;
                    moved |= n > 0;
                }
                // A held frame's caller reads it; one that was not taken since the last round
                // goes the ordinary way (one held by this round's first read waits a round).
                if let Some(held) = &mut conn.held {
                    if held.claimed || first == FirstRead::Held((peer, c)) {
                        held.claimed = false;
                        continue;
                    }
                    conn.release_held(&mut self.pool, &mut self.inbox, peer)
                        .map_err(|e| e.naming(peer, &p.addr))?;
                    moved = true;
                }
                // Read what is there, bounded so one busy socket does not starve the others,
                // and only until a read comes back short (the socket is then drained: one more
                // read would be a system call that says "would block").
                for _ in 0..if readable { 64 } else { 0 } {
                    let read = conn
                        .read_some(&mut self.pool, &mut self.inbox, peer)
                        .map_err(|e| e.naming(peer, &p.addr))?;
                    match read {
                        ReadOutcome::Full => moved = true,
                        ReadOutcome::Short | ReadOutcome::Held => {
                            moved = true;
                            break;
                        }
                        ReadOutcome::Empty => break,
                        ReadOutcome::Closed => {
                            conn.closed = true;
                            break;
                        }
                    }
                }
            }
            // Gone only once every socket has ended: each one's bytes come before its own
            // end, but a peer that sent its last messages and left closes them all at once,
            // and one socket's end may be read before another's last frames (a long frame's
            // payload still waiting in its socket, or packets that arrived later).
            p.closed = p.conns.iter().all(|c| c.closed);
            p.queued = p.conns.iter().map(queued_bytes).sum();
        }
        Ok(moved)
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let mut fds = std::mem::take(&mut self.wait_fds);
        fds.clear();
        let slept = match self.prepare_wait(&mut fds) {
            Readiness::Ready => Ok(()),
            _ if fds.is_empty() => {
                std::thread::sleep(timeout);
                Ok(())
            }
            _ => crate::poll::poll_fds(&fds, timeout),
        };
        self.wait_fds = fds;
        slept.map_err(|source| TransportError::Setup {
            what: "poll(2) on the peer sockets".into(),
            source,
        })
    }

    fn prepare_wait(&mut self, fds: &mut Vec<(std::os::fd::RawFd, bool)>) -> Readiness {
        // A held frame nobody took goes the ordinary way in the next round, whose bytes may
        // all be in the stage already, where poll(2) does not see them.
        let unclaimed = self
            .peers
            .values()
            .flat_map(|p| &p.conns)
            .any(|c| c.held.as_ref().is_some_and(|h| !h.claimed));
        if unclaimed {
            return Readiness::Ready;
        }
        fds.extend(
            self.peers
                .values()
                .flat_map(|p| p.conns.iter())
                .filter(|c| !c.closed)
                .map(|c| (c.stream.as_raw_fd(), !c.out.is_empty())),
        );
        Readiness::Sleep
    }

    fn limit_connections(&mut self, per_peer: Option<usize>) {
        self.connections_in_use = per_peer;
    }

    fn peer_lost(&self, peer: usize) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|p| p.closed && p.conns.iter().all(|c| c.held.is_none()))
            && !self.inbox.holds_from(peer)
    }

    fn flushed(&self) -> bool {
        self.peers
            .values()
            .all(|p| p.conns.iter().all(|c| c.closed || c.out.is_empty()))
    }
}

/// How long a closing transport waits, at most, for its peers to end their side.
const LINGER: Duration = Duration::from_secs(1);
/// A connection with nothing to read for this long is closed without waiting for its end.
const QUIET: Duration = Duration::from_millis(20);

impl Drop for TcpTransport {
    /// Close every connection with its end (FIN), never a reset. A socket closed with unread
    /// bytes in it is reset, and the reset throws away what its send queue still holds: the
    /// last message of a rank that finished a collective and left at once, while a frame of
    /// its peer had just come in, never reached the peer (which then named it dead). So each
    /// connection is shut for writing, then read and discarded until the peer ends it, it
    /// stays quiet for `QUIET` (20 ms), or `LINGER` (1 s) has passed.
    fn drop(&mut self) {
        let mut open: Vec<(&mut TcpStream, Instant)> = Vec::new();
        let now = Instant::now();
        for p in self.peers.values_mut() {
            for c in p.conns.iter_mut().filter(|c| !c.closed) {
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                open.push((&mut c.stream, now));
            }
        }
        let end = now + LINGER;
        let mut scratch = [0u8; 16 << 10];
        while !open.is_empty() && Instant::now() < end {
            open.retain_mut(|(stream, heard)| {
                loop {
                    match stream.read(&mut scratch) {
                        Ok(0) => break false,
                        Ok(_) => *heard = Instant::now(),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            break heard.elapsed() < QUIET;
                        }
                        Err(_) => break false,
                    }
                }
            });
            if !open.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Why a socket's bytes could not be taken.
enum ReadError {
    Io(io::Error),
    Decode(codec::DecodeError),
    /// The peer closed the connection in the middle of a frame held for a caller.
    Closed,
    /// A frame held for a caller was given up halfway by it (the operation failed).
    Abandoned(Tag),
}

impl ReadError {
    fn naming(self, peer: usize, addr: &str) -> TransportError {
        let addr = addr.to_string();
        match self {
            ReadError::Io(source) => TransportError::Io {
                op: "receive",
                peer,
                addr,
                source,
            },
            ReadError::Decode(e) => TransportError::Protocol {
                peer,
                addr,
                reason: e.to_string(),
            },
            ReadError::Closed => TransportError::PeerClosed { peer, addr },
            ReadError::Abandoned(tag) => TransportError::Protocol {
                peer,
                addr,
                reason: format!(
                    "the message under tag {tag:#x} was given up halfway by this rank's \
                     receiver (an operation failed while it arrived); it is lost"
                ),
            },
        }
    }
}

impl Conn {
    /// One `recv` from the socket: into the frame's own buffer when the decoder wants a long
    /// payload part, else into the stage, whose bytes are then fed to the decoder; completed
    /// frames go to `inbox`.
    fn read_some(
        &mut self,
        pool: &mut Vec<Vec<u8>>,
        inbox: &mut Inbox,
        peer: usize,
    ) -> Result<ReadOutcome, ReadError> {
        let outcome = self.read_and_feed(pool, inbox, peer)?;
        match self.lost.take() {
            Some(tag) => Err(ReadError::Abandoned(tag)),
            None => Ok(outcome),
        }
    }

    fn read_and_feed(
        &mut self,
        pool: &mut Vec<Vec<u8>>,
        inbox: &mut Inbox,
        peer: usize,
    ) -> Result<ReadOutcome, ReadError> {
        let direct = self.decoder.want().len() >= STAGE_BYTES;
        let result = if direct {
            let want = self.decoder.want();
            let asked = want.len();
            self.stream.read(want).map(|n| (n, asked))
        } else {
            if self.stage.is_empty() {
                self.stage = vec![0; STAGE_BYTES];
            }
            self.stream.read(&mut self.stage).map(|n| (n, STAGE_BYTES))
        };
        let (n, asked) = match result {
            Ok((0, _)) => return Ok(ReadOutcome::Closed),
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(ReadOutcome::Empty),
            // Interrupted: nothing was read; the next progress round reads again.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(ReadOutcome::Empty),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(ReadOutcome::Closed),
            Err(e) => return Err(ReadError::Io(e)),
        };
        let now = Instant::now();
        if direct {
            self.take(n, now, pool, inbox, peer)?;
        } else {
            let mut fed = 0;
            while fed < n {
                let want = self.decoder.want();
                let k = want.len().min(n - fed);
                want[..k].copy_from_slice(&self.stage[fed..fed + k]);
                fed += k;
                self.take(k, now, pool, inbox, peer)?;
                // A long frame's header just completed: leave its payload where it is (the
                // rest of the stage is part of it, as the stage is shorter than the payload).
                if let Some((tag, len, 0)) = self.decoder.payload_progress()
                    && len >= STAGE_BYTES
                    && self.spoiled.is_none()
                {
                    self.held = Some(Held {
                        tag,
                        len,
                        filled: 0,
                        claimed: false,
                    });
                    self.staged = fed..n;
                    return Ok(ReadOutcome::Held);
                }
            }
        }
        Ok(if n < asked {
            ReadOutcome::Short
        } else {
            ReadOutcome::Full
        })
    }

    /// `n` bytes were written where the decoder wanted them, at `now`.
    fn take(
        &mut self,
        n: usize,
        now: Instant,
        pool: &mut Vec<Vec<u8>>,
        inbox: &mut Inbox,
        peer: usize,
    ) -> Result<(), ReadError> {
        let started = *self.frame_started.get_or_insert(now);
        let frame = self
            .decoder
            .advance(n, || pool.pop().unwrap_or_default())
            .map_err(ReadError::Decode)?;
        if let Some(f) = frame {
            self.frame_started = None;
            if let Some(tag) = self.spoiled.take() {
                // Reported once the bytes read with it are fed (they begin the next frames).
                self.lost = Some(tag);
                pool.push(f.payload);
                return Ok(());
            }
            inbox.push(peer, f.tag, (f.payload, now - started));
        }
        Ok(())
    }
}

impl Conn {
    /// Read the held frame's payload into `dest` (its length) as far as it has arrived: the
    /// stage's part first, then straight from the socket until a read comes back short.
    fn read_held(
        &mut self,
        dest: &mut [u8],
        pool: &mut Vec<Vec<u8>>,
    ) -> Result<Landing, ReadError> {
        let Some(held) = self.held.as_mut() else {
            return Ok(Landing::Pending);
        };
        let staged = std::mem::replace(&mut self.staged, 0..0);
        let k = staged.len();
        dest[held.filled..held.filled + k].copy_from_slice(&self.stage[staged]);
        held.filled += k;
        while held.filled < held.len {
            let asked = held.len - held.filled;
            match self.stream.read(&mut dest[held.filled..]) {
                Ok(0) => {
                    self.closed = true;
                    return Err(ReadError::Closed);
                }
                Ok(n) => {
                    held.filled += n;
                    if n < asked {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => break,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    self.closed = true;
                    return Err(ReadError::Closed);
                }
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
        if held.filled < held.len {
            held.claimed = true;
            return Ok(Landing::Pending);
        }
        self.held = None;
        if let Some(buf) = self.decoder.payload_received_elsewhere()
            && pool.len() < POOL_LIMIT
        {
            pool.push(buf);
        }
        let transfer = self.frame_started.take().map(|s| s.elapsed());
        Ok(Landing::Filled(transfer))
    }

    /// Give the held frame back to the ordinary path: the decoder's own buffer receives the
    /// stage's part and the rest. Bytes a caller already took leave a hole, reported when the
    /// frame completes.
    fn release_held(
        &mut self,
        pool: &mut Vec<Vec<u8>>,
        inbox: &mut Inbox,
        peer: usize,
    ) -> Result<(), ReadError> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        let now = Instant::now();
        if held.filled > 0 {
            self.spoiled = Some(held.tag);
            self.take(held.filled, now, pool, inbox, peer)?;
        }
        let staged = std::mem::replace(&mut self.staged, 0..0);
        let mut fed = staged.start;
        while fed < staged.end {
            let want = self.decoder.want();
            let k = want.len().min(staged.end - fed);
            want[..k].copy_from_slice(&self.stage[fed..fed + k]);
            fed += k;
            self.take(k, now, pool, inbox, peer)?;
        }
        match self.lost.take() {
            Some(tag) => Err(ReadError::Abandoned(tag)),
            None => Ok(()),
        }
    }
}

fn queued_bytes(c: &Conn) -> usize {
    c.out
        .iter()
        .map(|f| HEADER_LEN + f.payload.len() - f.written)
        .sum()
}
