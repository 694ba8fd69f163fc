//! The health channel's messages and their framing: a little-endian `u32` length, then the
//! message in postcard. Connections are authenticated with the communicator's secret before
//! the first message, so a stranger never gets this far.

use super::verdict::Verdict;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The largest health message accepted (a verdict line with a long host name fits easily).
pub const MAX_MESSAGE: usize = 64 << 10;

/// Binds authentication proofs to the health channel (the data path uses another context).
pub const AUTH_CONTEXT: &[u8] = b"bcl-health-v1";

/// What a rank is doing, as its health thread reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankState {
    /// Sequence number of the last collective this rank started, and of the last it finished.
    pub started: u32,
    pub completed: u32,
    /// The operation in progress, as a person reads it ("allreduce #57 (...)").
    pub current: Option<String>,
    /// The peers the current operation has been waiting on, when it stalled.
    pub waiting_on: Vec<u32>,
}

/// Why a connection was opened; the first message after authentication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Purpose {
    /// A ring neighbour: heartbeats both ways for the communicator's lifetime.
    Watch,
    /// One `State` reply, then close.
    Query,
    /// Ask the receiver to query `target` itself and say what it saw (an indirect probe).
    Probe { target: u32 },
    /// A verdict follows; the reply is `Accepted` once it is in force.
    Deliver,
    /// `windows` windows of slow-node measurements follow (to the sender's parent in the
    /// reports' tree: its own and those its children sent up, each a `Window`); the reply is
    /// the receiver's latest summary.
    Report { windows: u32 },
    /// One membership message follows (a shrink proposal or a new communicator's address);
    /// the reply is `Accepted` or `ExcludedYou`.
    Agree,
    /// The rendezvous: a child in the gathering tree asks for the table of every rank's
    /// record, waiting up to `wait_ms` for it; the reply is `TablePart`s, or `Abandoned`.
    Table { wait_ms: u64 },
}

/// What a rank saw when it tried to reach another one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Seen {
    /// It answered, in this state.
    Alive(RankState),
    /// Its host answered for it and said no (connection refused, or reset or closed while
    /// its process was being torn down): the process is gone. A stopped or hung process
    /// holds its sockets open and stays silent instead.
    Gone(String),
    /// No answer in time, or no route (the reason, as text).
    NoAnswer(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    Hello {
        from: u32,
        purpose: Purpose,
    },
    Heartbeat(RankState),
    Verdict(Verdict),
    /// The sender is destroying its communicator: its silence from now on is not a fault.
    Goodbye,
    State(RankState),
    ProbeResult {
        target: u32,
        seen: Seen,
    },
    Window(super::slow::Window),
    Summary(super::slow::Summary),
    Propose(crate::agreement::Proposal),
    /// The sender's record (a `RankInfo`) in the communicator of `members` (old ranks).
    Address {
        members: Vec<u32>,
        info: Vec<u8>,
    },
    /// The reply to a membership message or a delivered verdict: taken.
    Accepted,
    /// The receiver's agreement excludes the sender: these are the excluded ranks.
    ExcludedYou(Vec<u32>),
    /// The receiver's shrink failed (the reason): the sender's will not complete either.
    Abandoned(String),
    /// A piece of the rendezvous table (at most [`TABLE_PART`] bytes); `last` ends it.
    TablePart {
        bytes: Vec<u8>,
        last: bool,
    },
}

/// The bytes of the rendezvous table one message carries, well within a message's limit
/// (`MAX_MESSAGE`).
pub const TABLE_PART: usize = 48 << 10;

/// `message` framed, ready to write.
pub fn encode(message: &Message) -> io::Result<Vec<u8>> {
    let body = postcard::to_stdvec(message).map_err(io::Error::other)?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Reassembles messages from a byte stream that arrives in pieces.
#[derive(Debug, Default)]
pub struct FrameReader {
    buffer: Vec<u8>,
}

impl FrameReader {
    /// Read what `stream` has now (non-blocking streams: until it would block). Returns
    /// `Ok(false)` when the peer closed the connection.
    pub fn fill(&mut self, stream: &mut TcpStream) -> io::Result<bool> {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => self.push(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Bytes that arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes held that are not a whole message yet.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    /// The next complete message, if one has arrived. A malformed or oversized frame is an
    /// error: the connection is not a health connection of this communicator.
    pub fn next_message(&mut self) -> io::Result<Option<Message>> {
        if self.buffer.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([
            self.buffer[0],
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
        ]) as usize;
        if len > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("health message of {len} bytes exceeds {MAX_MESSAGE}"),
            ));
        }
        if self.buffer.len() < 4 + len {
            return Ok(None);
        }
        let message = postcard::from_bytes(&self.buffer[4..4 + len])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        self.buffer.drain(..4 + len);
        Ok(Some(message))
    }
}

/// Write one message on a blocking stream.
pub fn send(stream: &mut TcpStream, message: &Message) -> io::Result<()> {
    stream.write_all(&encode(message)?)
}

/// Read one message from a blocking stream (its read timeout bounds the wait).
pub fn receive(stream: &mut TcpStream) -> io::Result<Message> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("health message of {len} bytes exceeds {MAX_MESSAGE}"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    postcard::from_bytes(&body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// Open an authenticated health connection to `addr` for `purpose`, every step bounded by
/// `timeout`. A handshake cut by the listener's bound on handshakes in flight (a flood of
/// strangers there) is tried again, a few times, within `timeout`.
pub fn dial(
    addr: SocketAddr,
    secret: &bcl_transport::Secret,
    from: usize,
    purpose: Purpose,
    timeout: Duration,
) -> io::Result<TcpStream> {
    use bcl_transport::admission;
    let deadline = std::time::Instant::now() + timeout;
    let mut attempt = 1;
    let mut stream = loop {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        match bcl_transport::auth::exchange::client(&mut stream, secret, AUTH_CONTEXT) {
            Ok(()) => break stream,
            Err(e)
                if admission::was_cut(&e)
                    && attempt < admission::ATTEMPTS
                    && std::time::Instant::now() < deadline =>
            {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    send(
        &mut stream,
        &Message::Hello {
            from: from as u32,
            purpose,
        },
    )?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_arriving_byte_by_byte() {
        let messages = vec![
            Message::Hello {
                from: 3,
                purpose: Purpose::Probe { target: 9 },
            },
            Message::Heartbeat(RankState {
                started: 5,
                completed: 4,
                current: Some("allreduce #5".into()),
                waiting_on: vec![1, 2],
            }),
            Message::Goodbye,
            Message::ProbeResult {
                target: 9,
                seen: Seen::NoAnswer("timed out".into()),
            },
        ];
        let mut bytes = Vec::new();
        for m in &messages {
            bytes.extend(encode(m).expect("encode"));
        }
        let mut reader = FrameReader::default();
        let mut got = Vec::new();
        for b in bytes {
            reader.buffer.push(b);
            if let Some(m) = reader.next_message().expect("valid") {
                got.push(m);
            }
        }
        assert_eq!(got, messages);
    }

    #[test]
    fn oversized_and_garbage_frames_are_errors() {
        let mut reader = FrameReader::default();
        reader.buffer.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(reader.next_message().is_err());
        let mut reader = FrameReader::default();
        reader.buffer.extend_from_slice(&3u32.to_le_bytes());
        reader.buffer.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert!(reader.next_message().is_err());
    }
}
