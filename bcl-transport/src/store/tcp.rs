//! The TCP store: rank 0 serves a key-value map; every rank (rank 0 included) is a client.
//!
//! Wire format: each message is a little-endian u32 length and a postcard-encoded body, at most
//! [`MAX_MESSAGE`] bytes. Every connection first proves the communicator's secret
//! ([`crate::auth`]); a stranger is dropped and the server carries on.

use super::{Store, StoreError};
use crate::admission::{self, Admission, Ticket};
use crate::auth::{Secret, exchange};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) const AUTH_CONTEXT: &[u8] = b"bcl-store-v1";
const MAX_MESSAGE: usize = 16 << 20;
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);
/// Store handshakes in flight at once: every rank of a large job may connect in the same
/// moment, and a member's handshake takes a round trip; strangers beyond it evict each other.
pub const HANDSHAKES_IN_FLIGHT: usize = 256;

#[derive(Serialize, Deserialize)]
enum Request {
    Set { key: String, value: Vec<u8> },
    Get { key: String, wait_ms: u64 },
}

#[derive(Serialize, Deserialize)]
enum Reply {
    Done,
    Value(Option<Vec<u8>>),
}

/// `msg` as it goes on the wire: a length, then the body. Written in one write: a length and
/// a body in two would wait out Nagle and the peer's delayed ack, ~40 ms a reply.
fn frame<T: Serialize>(msg: &T) -> std::io::Result<Vec<u8>> {
    let mut framed = postcard::to_extend(msg, vec![0u8; 4]).map_err(std::io::Error::other)?;
    let len = (framed.len() - 4) as u32;
    framed[..4].copy_from_slice(&len.to_le_bytes());
    Ok(framed)
}

fn write_message<T: Serialize>(s: &mut TcpStream, msg: &T) -> std::io::Result<()> {
    s.write_all(&frame(msg)?)
}

fn read_message<T: for<'de> Deserialize<'de>>(s: &mut TcpStream) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("message of {len} bytes exceeds the store limit of {MAX_MESSAGE}"),
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    postcard::from_bytes(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

#[derive(Default)]
struct Table {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    /// Requests answered and reply bytes sent: the store's load, for the control-plane
    /// figures (`bcl-bench rendezvous`).
    requests: AtomicU64,
    bytes_out: AtomicU64,
}

/// The server side, run by rank 0. Dropping it closes the port and every client connection
/// and returns once its threads have ended, so a destroyed communicator leaves no thread or
/// descriptor of its store behind (the kill → shrink → grow cycle test counts them).
pub struct TcpStoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    table: Arc<Table>,
    open: Connections,
    admission: Arc<Admission>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpStoreServer({})", self.addr)
    }
}

impl TcpStoreServer {
    /// Listen on `bind` (port 0: any free port) and serve until dropped.
    pub fn start(bind: SocketAddr, secret: Secret) -> Result<Self, StoreError> {
        let io = |what: &str, source| StoreError::Io {
            store: format!("tcp ({bind})"),
            what: what.to_string(),
            source,
        };
        let listener = crate::listener::bind(bind).map_err(|e| io("binding", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io("reading address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io("configuring", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let table = Arc::new(Table::default());
        let open: Connections = Arc::default();
        let admission = Admission::new(HANDSHAKES_IN_FLIGHT);
        let (stop2, table2, open2) = (stop.clone(), table.clone(), open.clone());
        let admission2 = admission.clone();
        let accept = std::thread::Builder::new()
            .name("bcl-store".into())
            .spawn(move || serve(listener, secret, table2, stop2, open2, admission2))
            .map_err(|e| io("starting the server thread", e))?;
        Ok(TcpStoreServer {
            addr,
            stop,
            table,
            open,
            admission,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections being served now (strangers still in the handshake included).
    pub fn clients(&self) -> usize {
        self.open.lock().len()
    }

    /// Requests answered so far, and the bytes of their replies (length prefixes included).
    pub fn served(&self) -> (u64, u64) {
        (
            self.table.requests.load(Ordering::Relaxed),
            self.table.bytes_out.load(Ordering::Relaxed),
        )
    }

    /// Handshakes in flight now (at most [`HANDSHAKES_IN_FLIGHT`]), and those cut so far to
    /// make room for newer connections.
    pub fn handshakes(&self) -> (usize, u64) {
        (self.admission.in_flight(), self.admission.evicted())
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake a client waiting for a key; taken under the lock so that a client between its
        // check of `stop` and its wait cannot miss it.
        {
            let _map = self.table.map.lock();
            self.table.changed.notify_all();
        }
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// The open client connections, so that a stopping server can shut them down; each client's
/// thread removes its own entry (closing the copy) as it ends.
type Connections = Arc<Mutex<HashMap<u64, TcpStream>>>;

/// Accept clients until stopped; then shut every connection down (which wakes its thread
/// from any read) and wait for their threads.
fn serve(
    listener: TcpListener,
    secret: Secret,
    table: Arc<Table>,
    stop: Arc<AtomicBool>,
    open: Connections,
    admission: Arc<Admission>,
) {
    let mut threads: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // Strangers come and go: keep the handles of the live threads only.
        threads.retain(|h| !h.is_finished());
        match listener.accept() {
            Ok((stream, from)) => {
                let (table, stop, open2) = (table.clone(), stop.clone(), open.clone());
                let id = next;
                next += 1;
                if let Ok(copy) = stream.try_clone() {
                    open.lock().insert(id, copy);
                }
                let ticket = admission.enter(&stream);
                let spawned = std::thread::Builder::new()
                    .name("bcl-store-client".into())
                    .spawn(move || {
                        if let Err(e) = serve_client(stream, &secret, &table, &stop, ticket)
                            && e.kind() != std::io::ErrorKind::UnexpectedEof
                        {
                            tracing::warn!(%from, error = %e, "store client dropped");
                        }
                        open2.lock().remove(&id);
                    });
                match spawned {
                    Ok(thread) => threads.push(thread),
                    Err(e) => {
                        open.lock().remove(&id);
                        tracing::warn!(%from, error = %e, "no thread for a store client");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                tracing::warn!(error = %e, "store accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    drop(listener);
    for s in open.lock().values() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    for thread in threads {
        let _ = thread.join();
    }
}

fn serve_client(
    mut s: TcpStream,
    secret: &Secret,
    table: &Table,
    stop: &AtomicBool,
    ticket: Ticket,
) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(HANDSHAKE_LIMIT))?;
    s.set_write_timeout(Some(HANDSHAKE_LIMIT))?;
    exchange::server_then(&mut s, secret, AUTH_CONTEXT, move || drop(ticket))?;
    // Clients may be idle for a long time between requests; poll the stop flag meanwhile.
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    loop {
        let mut first = [0u8; 1];
        match s.peek(&mut first) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e),
        }
        s.set_read_timeout(Some(HANDSHAKE_LIMIT))?;
        let request: Request = read_message(&mut s)?;
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        let reply = match request {
            Request::Set { key, value } => {
                table.map.lock().insert(key, value);
                table.changed.notify_all();
                Reply::Done
            }
            Request::Get { key, wait_ms } => {
                let deadline = Instant::now() + Duration::from_millis(wait_ms.min(3_600_000));
                let mut map = table.map.lock();
                loop {
                    let now = Instant::now();
                    if map.contains_key(&key) || stop.load(Ordering::Relaxed) || now >= deadline {
                        break Reply::Value(map.get(&key).cloned());
                    }
                    table
                        .changed
                        .wait_until(&mut map, deadline.min(now + CLIENT_CHECK));
                    // A client that went away stops being waited for (its thread would
                    // otherwise wait out its deadline, up to an hour).
                    if gone(&s) {
                        return Ok(());
                    }
                }
            }
        };
        let framed = frame(&reply)?;
        // Counted before the reply leaves, so that a client holding it is counted.
        table.requests.fetch_add(1, Ordering::Relaxed);
        table
            .bytes_out
            .fetch_add(framed.len() as u64, Ordering::Relaxed);
        s.write_all(&framed)?;
    }
}

/// How often a request waiting for a key looks whether its client is still there.
const CLIENT_CHECK: Duration = Duration::from_millis(200);

/// Whether the peer of `s` closed the connection (without reading any of its bytes).
fn gone(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return true;
    }
    let mut first = [0u8; 1];
    let closed = match s.peek(&mut first) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    closed || s.set_nonblocking(false).is_err()
}

/// A client of a [`TcpStoreServer`].
pub struct TcpStore {
    addr: SocketAddr,
    stream: Mutex<TcpStream>,
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpStore({})", self.addr)
    }
}

impl TcpStore {
    /// Connect to the server at `addr`, retrying until `deadline` while it is not up yet.
    pub fn connect(
        addr: SocketAddr,
        secret: &Secret,
        deadline: Instant,
    ) -> Result<Self, StoreError> {
        let name = format!("tcp ({addr})");
        let io = |what: &str, source| StoreError::Io {
            store: format!("tcp ({addr})"),
            what: what.to_string(),
            source,
        };
        let mut attempt = 1;
        let stream = loop {
            let mut stream = match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(s) => s,
                Err(source) if Instant::now() >= deadline => {
                    return Err(StoreError::Io {
                        store: name,
                        what: "connecting to the store served by rank 0 (is rank 0 running?)"
                            .into(),
                        source,
                    });
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            };
            stream
                .set_read_timeout(Some(HANDSHAKE_LIMIT))
                .map_err(|e| io("configuring", e))?;
            stream.set_nodelay(true).map_err(|e| io("configuring", e))?;
            match exchange::client(&mut stream, secret, AUTH_CONTEXT) {
                Ok(()) => break stream,
                // Cut by the server's bound on handshakes in flight (a flood): again.
                Err(e)
                    if admission::was_cut(&e)
                        && attempt < admission::ATTEMPTS
                        && Instant::now() < deadline =>
                {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(StoreError::Protocol {
                        store: name,
                        reason: format!("handshake failed (wrong unique id?): {e}"),
                    });
                }
            }
        };
        Ok(TcpStore {
            addr,
            stream: Mutex::new(stream),
        })
    }

    fn call(&self, request: &Request, wait: Duration) -> Result<Reply, StoreError> {
        let io = |source| StoreError::Io {
            store: format!("tcp ({})", self.addr),
            what: "request to the store served by rank 0".into(),
            source,
        };
        let mut s = self.stream.lock();
        s.set_read_timeout(Some(wait + HANDSHAKE_LIMIT))
            .map_err(io)?;
        write_message(&mut s, request).map_err(io)?;
        read_message(&mut s).map_err(io)
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let req = Request::Set {
            key: key.to_string(),
            value: value.to_vec(),
        };
        match self.call(&req, Duration::ZERO)? {
            Reply::Done => Ok(()),
            Reply::Value(_) => Err(StoreError::Protocol {
                store: format!("tcp ({})", self.addr),
                reason: "unexpected reply to set".into(),
            }),
        }
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>, StoreError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.try_get_waiting(key, wait)? {
            Some(v) => Ok(v),
            None => Err(StoreError::Timeout {
                store: format!("tcp ({})", self.addr),
                key: key.to_string(),
            }),
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.try_get_waiting(key, Duration::ZERO)
    }
}

impl TcpStore {
    fn try_get_waiting(&self, key: &str, wait: Duration) -> Result<Option<Vec<u8>>, StoreError> {
        let req = Request::Get {
            key: key.to_string(),
            wait_ms: wait.as_millis() as u64,
        };
        match self.call(&req, wait)? {
            Reply::Value(v) => Ok(v),
            Reply::Done => Err(StoreError::Protocol {
                store: format!("tcp ({})", self.addr),
                reason: "unexpected reply to get".into(),
            }),
        }
    }
}
