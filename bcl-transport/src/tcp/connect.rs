//! Connection setup for the TCP transport: every connection proves the communicator's secret
//! and then says which rank and socket index it is. Strangers are refused and logged; setup
//! carries on.

use crate::admission::{self, Admission, Ticket};
use crate::auth::{Secret, exchange};
use crate::error::TransportError;
use crate::transport::PeerAddress;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The handshake context of the TCP transport's data connections; other users of these
/// functions (the rdma transport's setup socket) pass their own, so the two never mix.
pub(crate) const AUTH_CONTEXT: &[u8] = b"bcl-tcp-v1";
/// The longest a single stranger can hold one accept slot.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);
/// Handshakes of strangers (beyond the peers expected) in flight at once on a setup socket.
pub(crate) const STRANGERS_IN_FLIGHT: usize = 32;

/// Listen on `ip`, an ephemeral port, and the address to publish for it. `what` names the
/// listener in errors ("a TCP listener", "the rdma setup listener").
pub(crate) fn listen(ip: IpAddr, what: &str) -> Result<(TcpListener, PeerAddress), TransportError> {
    let listener =
        crate::listener::bind(SocketAddr::new(ip, 0)).map_err(|source| TransportError::Setup {
            what: format!("binding {what} on {ip}"),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| TransportError::Setup {
            what: format!("reading the address of {what}"),
            source,
        })?;
    let address = PeerAddress::new(local.to_string().into_bytes())
        .unwrap_or_else(|_| unreachable!("a socket address fits in 128 bytes"));
    Ok((listener, address))
}

/// A peer's published `ip:port`; `what` names the kind of address in the error.
pub(crate) fn parse_addr(
    peer: usize,
    addr: &PeerAddress,
    what: &str,
) -> Result<SocketAddr, TransportError> {
    std::str::from_utf8(addr.as_bytes())
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| TransportError::BadAddress {
            peer,
            reason: format!("{addr:?} is not {what}"),
        })
}

/// A connection that has proved the secret: (peer rank, socket index, stream).
pub(crate) type Established = (usize, usize, TcpStream);

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Which congestion control a connection runs: the system's, or [`choose_congestion`]'s.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Congestion<'a> {
    /// The rdma transport's setup sockets.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    System,
    /// A pacing default (BBR) replaced on loopback, the system's otherwise.
    Auto,
    /// This one, or an error.
    Named(&'a str),
}

impl std::fmt::Display for Congestion<'_> {
    /// How errors name the setting.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Congestion::System => "the system's",
            Congestion::Auto => "auto",
            Congestion::Named(name) => name,
        };
        write!(
            f,
            "the TCP congestion control '{name}' (BCL_TCP_CONGESTION)"
        )
    }
}

/// Set `sock`'s congestion control as `congestion` says, before it connects or listens (a
/// connection whose algorithm changes after BBR started it keeps BBR's pacing: a 2-rank
/// 1 MiB allreduce then ran at a steady 360 µs against 237 from the start). `loopback`: its
/// peers are on this host's loopback. Accepted connections take their listener's.
pub(crate) fn choose_congestion(
    sock: &socket2::Socket,
    congestion: Congestion<'_>,
    loopback: bool,
) -> std::io::Result<()> {
    match congestion {
        Congestion::System => Ok(()),
        Congestion::Named(name) => sock.set_tcp_congestion(name.as_bytes()),
        Congestion::Auto => {
            let pacing = sock.tcp_congestion().is_ok_and(|raw| {
                // The kernel's name is NUL-padded.
                let name = raw.split(|&b| b == 0).next().unwrap_or(&raw);
                super::PACING.iter().any(|p| name == p.as_bytes())
            });
            if loopback && pacing {
                // Not an error where refused: the connection keeps the system's choice.
                let _ = super::LOOPBACK_CONGESTION
                    .iter()
                    .find(|name| sock.set_tcp_congestion(name.as_bytes()).is_ok());
            }
            Ok(())
        }
    }
}

/// A TCP socket for `addr`, its congestion control chosen, not connected yet.
fn socket_for(
    addr: SocketAddr,
    congestion: Congestion<'_>,
) -> Result<socket2::Socket, TransportError> {
    let setup = |what: &str, source| TransportError::Setup {
        what: format!("{what} for a connection to {addr}"),
        source,
    };
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| setup("a socket", e))?;
    choose_congestion(&sock, congestion, addr.ip().is_loopback())
        .map_err(|e| setup(&congestion.to_string(), e))?;
    Ok(sock)
}

/// Client side of one connection: connect (retrying while the peer is not yet listening),
/// prove the secret, introduce ourselves.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dial(
    addr: SocketAddr,
    secret: &Secret,
    local_rank: usize,
    peer: usize,
    index: usize,
    deadline: Instant,
    context: &[u8],
    congestion: Congestion<'_>,
) -> Result<TcpStream, TransportError> {
    let io = |op, source| TransportError::Io {
        op,
        peer,
        addr: addr.to_string(),
        source,
    };
    let mut attempt = 1;
    let mut stream = loop {
        let sock = socket_for(addr, congestion)?;
        let timeout = remaining(deadline).min(Duration::from_secs(2));
        let mut stream: TcpStream = match sock.connect_timeout(&addr.into(), timeout) {
            Ok(()) => sock.into(),
            Err(e) if Instant::now() >= deadline => return Err(io("connect", e)),
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let limit = Some(remaining(deadline).min(HANDSHAKE_LIMIT));
        stream
            .set_read_timeout(limit)
            .map_err(|e| io("configure", e))?;
        stream
            .set_write_timeout(limit)
            .map_err(|e| io("configure", e))?;
        match exchange::client(&mut stream, secret, context) {
            Ok(()) => break stream,
            // Cut by the peer's bound on handshakes in flight (a flood): again. Only before
            // the peer's acceptance: a proven member is no longer counted there.
            Err(e)
                if admission::was_cut(&e)
                    && attempt < admission::ATTEMPTS
                    && Instant::now() < deadline =>
            {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(TransportError::Handshake {
                    addr: format!("rank {peer} ({addr})"),
                    reason: e.to_string(),
                });
            }
        }
    };
    let mut intro = [0u8; 12];
    intro[..4].copy_from_slice(&(local_rank as u32).to_le_bytes());
    intro[4..8].copy_from_slice(&(peer as u32).to_le_bytes());
    intro[8..].copy_from_slice(&(index as u32).to_le_bytes());
    stream.write_all(&intro).map_err(|e| io("introduce", e))?;
    let mut ok = [0u8; 2];
    stream.read_exact(&mut ok).map_err(|e| io("introduce", e))?;
    if &ok != b"OK" {
        return Err(TransportError::Handshake {
            addr: format!("rank {peer} ({addr})"),
            reason: "peer refused our introduction".into(),
        });
    }
    Ok(stream)
}

/// Server side of one accepted connection.
fn admit(
    mut stream: TcpStream,
    secret: &Secret,
    local_rank: usize,
    expected: &HashSet<(usize, usize)>,
    context: &[u8],
    ticket: Ticket,
) -> Result<Established, String> {
    stream
        .set_read_timeout(Some(HANDSHAKE_LIMIT))
        .and_then(|_| stream.set_write_timeout(Some(HANDSHAKE_LIMIT)))
        .map_err(|e| e.to_string())?;
    // A member once proven: the rest is bounded by the time limit, not by strangers.
    exchange::server_then(&mut stream, secret, context, move || drop(ticket))
        .map_err(|e| e.to_string())?;
    let mut intro = [0u8; 12];
    stream.read_exact(&mut intro).map_err(|e| e.to_string())?;
    let word = |i: usize| {
        u32::from_le_bytes([intro[i], intro[i + 1], intro[i + 2], intro[i + 3]]) as usize
    };
    let (from, to, index) = (word(0), word(4), word(8));
    if to != local_rank || !expected.contains(&(from, index)) {
        let _ = stream.write_all(b"NO");
        return Err(format!(
            "introduced itself as rank {from} socket {index} for rank {to}, which this rank {local_rank} does not expect"
        ));
    }
    stream.write_all(b"OK").map_err(|e| e.to_string())?;
    Ok((from, index, stream))
}

/// Accept until every `expected` (peer, socket index) has connected, or `deadline`.
/// Runs each handshake on its own thread so a silent stranger cannot block the others.
pub(crate) fn accept_all(
    listener: &TcpListener,
    secret: Secret,
    local_rank: usize,
    expected: HashSet<(usize, usize)>,
    deadline: Instant,
    context: &'static [u8],
) -> Result<Vec<Established>, TransportError> {
    let setup = |source| TransportError::Setup {
        what: format!("rank {local_rank} accepting connections"),
        source,
    };
    listener.set_nonblocking(true).map_err(setup)?;
    // Every expected peer may be in its handshake at once; strangers beyond that evict each
    // other (the oldest first), so a flood holds at most this many threads.
    let admission = Admission::new(expected.len() + STRANGERS_IN_FLIGHT);
    let (tx, rx) = mpsc::channel();
    let mut done = Vec::new();
    let mut seen = HashSet::new();
    while seen.len() < expected.len() {
        loop {
            match listener.accept() {
                Ok((stream, from)) => {
                    let tx = tx.clone();
                    let expected = expected.clone();
                    let ticket = admission.enter(&stream);
                    std::thread::spawn(move || {
                        let _ = stream.set_nonblocking(false);
                        let admitted =
                            admit(stream, &secret, local_rank, &expected, context, ticket);
                        let _ = tx.send((from, admitted));
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(setup(e)),
            }
        }
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok((_, Ok((peer, index, stream)))) if seen.insert((peer, index)) => {
                done.push((peer, index, stream));
            }
            Ok((from, Ok((peer, index, _)))) => {
                tracing::warn!(%from, peer, index, "duplicate connection refused");
            }
            Ok((from, Err(reason))) => {
                tracing::warn!(%from, %reason, "refused a connection that failed the BCL handshake");
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            let mut missing: Vec<usize> = expected
                .iter()
                .filter(|k| !seen.contains(k))
                .map(|(p, _)| *p)
                .collect();
            missing.sort_unstable();
            missing.dedup();
            return Err(TransportError::ConnectTimeout {
                rank: local_rank,
                missing,
            });
        }
    }
    Ok(done)
}
