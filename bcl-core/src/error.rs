//! The one error type of the core. Its variants map one to one onto the C result codes of
//! `bcl.h` (`bcl-ffi`'s `code_of`).
//!
//! Policy: bad input from the caller is an [`Error::InvalidArgument`] and changes nothing;
//! a broken internal invariant is a debug assertion; I/O, remote and timeout errors poison
//! the communicator, and every later call fails fast with [`Error::Poisoned`] naming the
//! first fault.

use crate::peers::PeerLabel;
use bcl_backends::DeviceError;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of fault a verdict names (see the health layer). Part of the error vocabulary:
/// [`Error::Fault`] carries it, and the C ABI maps it to a result code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Cause {
    /// The process is gone: its connections closed and its port refuses connections.
    Died,
    /// The process holds its connections but answers nothing (stopped, or its host hangs).
    Unresponsive,
    /// Two live ranks cannot reach each other.
    LinkDown,
    /// A rank reached no other rank that could check on the peer.
    Unreachable,
    /// Ranks called different operations.
    Desync,
    /// A rank aborted the communicator on purpose.
    Aborted,
    /// A rank revoked the communicator (to shrink or destroy it); no rank is at fault.
    Revoked,
}

impl Cause {
    /// Whether the ranks named are the ones at fault (the rest abort because of them).
    pub(crate) fn names_the_culprits(self) -> bool {
        matches!(self, Cause::Died | Cause::Unresponsive | Cause::Aborted)
    }
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something wrong (a count, a buffer length, a rank, a dtype).
    /// Nothing was sent or changed. The caller is at fault.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// Rendezvous did not complete: some ranks never published themselves before the init
    /// timeout. Likely cause: those ranks were not started, crashed, or use another unique id.
    #[error(
        "rank {rank}: bootstrap timed out after {waited_s:.1} s; missing rank(s) {missing:?} ({detail})"
    )]
    BootstrapTimeout {
        rank: usize,
        missing: Vec<usize>,
        waited_s: f64,
        detail: String,
    },

    /// The rendezvous store or connection setup failed (unreachable store, handshake refused).
    #[error("rank {rank}: bootstrap failed: {reason}")]
    Bootstrap { rank: usize, reason: String },

    /// Moving bytes to or from a peer failed. Names both ends of the link.
    #[error("{local}: link to {peer} failed during {op}: {reason}")]
    Link {
        rank: usize,
        local: PeerLabel,
        peer: PeerLabel,
        op: String,
        reason: String,
    },

    /// A peer sent data that contradicts this rank's operation: a different size for the same
    /// message (mismatched counts or dtypes between ranks).
    #[error(
        "rank {rank}: {op}: {peer} sent {got} bytes where {expected} were expected (do all ranks pass the same count and dtype?)"
    )]
    Mismatch {
        rank: usize,
        peer: PeerLabel,
        op: String,
        got: usize,
        expected: usize,
    },

    /// A fault diagnosed by the health layer (a rank died, hung or aborted, a link went down,
    /// ranks called different operations): the verdict, the same on every rank, names the
    /// culprit and the cause.
    #[error("rank {rank}: {op} failed: {verdict}")]
    Fault {
        rank: usize,
        op: String,
        cause: Cause,
        verdict: String,
    },

    /// An operation did not finish in time. Names the peers this rank was still waiting for.
    #[error("{local}: {op} timed out after {waited_s:.1} s waiting for {waiting_on}")]
    Timeout {
        rank: usize,
        local: PeerLabel,
        op: String,
        waited_s: f64,
        waiting_on: String,
    },

    /// The device refused an operation.
    #[error("rank {rank} device {device}: {source}")]
    Device {
        rank: usize,
        device: String,
        #[source]
        source: DeviceError,
    },

    /// An earlier fault poisoned this communicator; it must be destroyed (or, later, shrunk).
    #[error("communicator is unusable after an earlier error: {0}")]
    Poisoned(String),

    /// The other survivors of a shrink left this rank out (they found it dead or
    /// unresponsive, or their list excludes it): it belongs to no new communicator. `by` is
    /// this rank itself when no other rank took part (all gone, or they left without it).
    #[error(
        "rank {rank} was excluded from the shrunk communicator by rank {by} (excluded: {excluded:?})"
    )]
    Excluded {
        rank: usize,
        by: usize,
        excluded: Vec<usize>,
    },

    /// A backend or transport is not available in this build or on this machine.
    #[error("unavailable: {0}")]
    Unavailable(String),

    /// An internal failure (a thread that died, a broken channel). A BCL bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The `bclResult_t` of `bcl.h` this error is (one per variant, and a desync verdict is a
    /// mismatch like a wrong size): the C ABI returns it.
    pub fn code(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => 1,
            Error::BootstrapTimeout { .. } => 2,
            Error::Bootstrap { .. } => 3,
            Error::Link { .. } => 4,
            Error::Mismatch { .. } => 5,
            Error::Fault {
                cause: Cause::Desync,
                ..
            } => 5,
            Error::Timeout { .. } => 6,
            Error::Device { .. } => 7,
            Error::Poisoned(_) => 8,
            Error::Unavailable(_) => 9,
            Error::Internal(_) => 10,
            Error::Fault { .. } => 11,
            Error::Excluded { .. } => 12,
        }
    }

    /// Whether this error poisons the communicator it came from.
    pub fn poisons(&self) -> bool {
        matches!(
            self,
            Error::Link { .. }
                | Error::Timeout { .. }
                | Error::Mismatch { .. }
                | Error::Fault { .. }
                | Error::Device { .. }
                | Error::Internal(_)
        )
    }
}
