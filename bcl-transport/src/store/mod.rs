//! Rendezvous stores: where ranks publish and find each other's bootstrap information.
//!
//! Every wait is bounded by a deadline; a key that never appears is an error naming the key.

mod file;
mod memory;
mod tcp;

pub use file::FileStore;
pub use memory::MemoryStore;
pub(crate) use tcp::AUTH_CONTEXT;
pub use tcp::{HANDSHAKES_IN_FLIGHT, TcpStore, TcpStoreServer};

use std::time::Instant;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The key did not appear before the deadline: the rank that should set it is missing.
    #[error("key '{key}' did not appear in the {store} store before the deadline")]
    Timeout { store: String, key: String },
    /// The store could not be reached or failed.
    #[error("{store} store: {what}: {source}")]
    Io {
        store: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The store server answered something that is not a valid reply, or refused us.
    #[error("{store} store: {reason}")]
    Protocol { store: String, reason: String },
}

/// A key-value rendezvous shared by the ranks of one communicator.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Publish `value` under `key` (replacing any older value).
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// The value of `key`, waiting for it until `deadline`.
    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>, StoreError>;
    /// The value of `key` if it is there now.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
}
