//! Transport errors. Each names the peer rank and its address where one is involved.

use std::io;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The OS refused a socket operation. Likely cause: the network, or a peer that went away.
    #[error("{op} with rank {peer} ({addr}) failed: {source}")]
    Io {
        op: &'static str,
        peer: usize,
        addr: String,
        #[source]
        source: io::Error,
    },
    /// Setting up a local resource failed (binding a port, creating a socket).
    #[error("{what}: {source}")]
    Setup {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The peer closed its connection: the peer process died or aborted.
    #[error("rank {peer} ({addr}) closed the connection")]
    PeerClosed { peer: usize, addr: String },
    /// The peer sent bytes that are not a valid frame: a bug, memory corruption, or a stranger.
    #[error("rank {peer} ({addr}) sent an invalid frame: {reason}")]
    Protocol {
        peer: usize,
        addr: String,
        reason: String,
    },
    /// A connection could not prove knowledge of the communicator's secret.
    #[error("handshake with {addr} failed: {reason}")]
    Handshake { addr: String, reason: String },
    /// Connection setup did not finish before the deadline.
    #[error("connecting rank {rank} timed out: no connection with rank(s) {missing:?}")]
    ConnectTimeout { rank: usize, missing: Vec<usize> },
    /// The core named a peer this transport was not connected to: a core bug or bad input.
    #[error("rank {peer} is not a connected peer of this transport")]
    UnknownPeer { peer: usize },
    /// A message is larger than the transport accepts.
    #[error("message of {len} bytes to rank {peer} exceeds the transport limit of {max} bytes")]
    TooLarge { peer: usize, len: usize, max: usize },
    /// An address given to the transport is malformed.
    #[error("bad peer address for rank {peer}: {reason}")]
    BadAddress { peer: usize, reason: String },
    /// A transport cannot run on this machine (no library, no device, no active port).
    #[error("{transport} unavailable: {reason}")]
    Unavailable {
        transport: &'static str,
        reason: String,
    },
    /// An RDMA link failed: an error completion (retry exceeded, remote access error) or a
    /// verbs call refused on the queue pair towards the peer.
    #[error("RDMA link rank {local} -> rank {peer} on {device} failed: {what}")]
    LinkFailed {
        local: usize,
        peer: usize,
        device: String,
        what: String,
    },
    /// A transport could not connect with a peer and there is no other way to it.
    #[error("{transport} could not connect with rank {peer}: {reason}")]
    Refused {
        peer: usize,
        transport: &'static str,
        reason: String,
    },
    /// A fault injected by a test through the in-process transport.
    #[error("link rank {from} -> rank {to}: injected fault: {what}")]
    Injected {
        from: usize,
        to: usize,
        what: &'static str,
    },
}

impl TransportError {
    /// The peer this error is about, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            TransportError::Io { peer, .. }
            | TransportError::PeerClosed { peer, .. }
            | TransportError::Protocol { peer, .. }
            | TransportError::UnknownPeer { peer }
            | TransportError::TooLarge { peer, .. }
            | TransportError::BadAddress { peer, .. }
            | TransportError::LinkFailed { peer, .. }
            | TransportError::Refused { peer, .. } => Some(*peer),
            TransportError::Injected { to, .. } => Some(*to),
            _ => None,
        }
    }
}
