//! BCL's collectives core.
//!
//! ```text
//!  caller ── Communicator::all_reduce(...) ──► op (seq n) ──► schedule::build_plan (pure)
//!                                                                   │ Plan of steps
//!                                                                   ▼
//!            progress thread / caller thread ──► exec::Executor::poll
//!                                                 │ try_send / try_recv      │ reduce / copy
//!                                                 ▼                          ▼
//!                                          dyn Transport (tcp, mem)   dyn Accelerator (cpu, sim)
//! ```
//!
//! A Rust user depends on this crate alone: it re-exports the device and transport types a
//! caller needs. `bootstrap` and `topology` turn a rendezvous store into connected peers and
//! a ring order; `schedule` holds the algorithms as pure functions, proven by its symbolic
//! checker; `exec` drives a plan through the two traits without blocking.

#![forbid(unsafe_code)]

pub mod bootstrap;
pub mod comm;
pub mod config;
pub mod error;
pub mod exec;
pub mod health;
pub mod launch;
mod links;
pub mod peers;
pub mod schedule;
pub mod signature;
pub mod topology;
pub mod unique_id;
pub mod units;
mod work;

/// The device side: the `Accelerator` trait a vendor implements, and the built-in backends.
pub use bcl_backends as backends;
/// The network side: the `Transport` trait, the built-in transports and rendezvous stores.
pub use bcl_transport as transport;

pub use bcl_backends::{
    Accelerator, DataType, DeviceBuffer, DeviceInfo, DeviceSpec, Element, ReduceOp, Vendor,
};
pub use bcl_transport::mem::{Faults, MemFabric};
pub use comm::{CommBuilder, Communicator};
pub use config::{CommConfig, TransportKind};
pub use error::{Error, Result};
pub use schedule::Collective;
pub use unique_id::UniqueId;
pub use work::Work;
