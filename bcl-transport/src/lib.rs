//! How BCL ranks move bytes and find each other.
//!
//! ```text
//!   bcl-core executor ──try_send(peer, tag, bytes)──► dyn Transport ──► mem | tcp | (shm, rdma)
//!                     ◄─try_recv(peer, tag)────────┘    progress() moves bytes, wait() sleeps
//!
//!   bcl-core bootstrap ──set/get──► dyn Store ──► memory | file | tcp (served by rank 0)
//! ```
//!
//! A [`Transport`] is modelled on NCCL's net plugin: it never blocks on the data path, it
//! answers "not now" under back-pressure, completion is found by polling, it declares its
//! [`Capabilities`], and it knows nothing of collectives: only an opaque [`PeerAddress`] of at
//! most 128 bytes that the core exchanges for it through a [`store::Store`].

pub mod admission;
pub mod auth;
#[cfg(test)]
mod contract;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod keys;
pub mod listener;
pub mod mem;
mod poll;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod routes;
pub mod shm;
pub mod store;
pub mod tcp;
#[cfg(test)]
mod testing;
pub mod transport;

pub use auth::Secret;
pub use error::TransportError;
pub use transport::{
    Capabilities, Collected, Landing, Lend, Lines, LoanId, MemoryKind, PathChange, PeerAddress,
    Received, Tag, Transport,
};
