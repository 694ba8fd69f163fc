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

/// Client side of one connection: connect (retrying while the peer is not yet listening),
/// prove the secret, introduce ourselves.
pub(crate) fn dial(
    addr: SocketAddr,
    secret: &Secret,
    local_rank: usize,
    peer: usize,
    index: usize,
    deadline: Instant,
    context: &[u8],
) -> Result<TcpStream, TransportError> {
    let io = |op, source| TransportError::Io {
        op,
        peer,
        addr: addr.to_string(),
        source,
    };
    let mut attempt = 1;
    let mut stream = loop {
        let mut stream = match TcpStream::connect_timeout(
            &addr,
            remaining(deadline).min(Duration::from_secs(2)),
        ) {
            Ok(s) => s,
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
