//! BCL's collectives core.
//!
//! ```text
//!  caller ── Communicator::all_reduce(...) ──► op (seq n) ──► schedule::build_plan (pure)
//!                                                                   │ Plan of steps
//!                                                                   ▼
//!            progress thread / caller thread ──► executor (polls, never sleeps)
//!                                                 │ try_send / try_recv      │ reduce / copy
//!                                                 ▼                          ▼
//!                         dyn Transport (tcp, shm, rdma, mem,    dyn Accelerator (cpu, sim,
//!                                       or one passed in)        cuda, plugin, or one passed in)
//! ```
//!
//! A Rust user depends on this crate alone: it re-exports the device and transport crates
//! ([`backends`], [`transport`]) and the types a caller needs. Providers are passed in
//! ([`CommBuilder`]: an `Accelerator` of a vendor's, a `Transport`), or named in the settings
//! ([`CommConfig`]: `cpu`, `sim`, `cuda:N`, `plugin:N`; `auto`, `tcp`, `shm`, `rdma`).
//!
//! The public surface: [`Communicator`] and [`CommBuilder`], their settings ([`config`]),
//! what a launcher hands over ([`launch`]), errors ([`Error`], [`Cause`]), the health report's
//! types ([`health`]), and the schedules ([`schedule`]: pure plans and the symbolic checker,
//! for tools such as a simulator), and the rendezvous ([`bootstrap`], so a benchmark can
//! time it alone). Everything else (topology, the executor, the
//! signature exchange) is private.

#![forbid(unsafe_code)]

pub mod agreement;
pub mod bootstrap;
mod comm;
pub mod config;
mod cpus;
mod error;
mod exec;
#[doc(hidden)]
pub mod fuzzing;
pub mod health;
pub mod launch;
mod links;
pub mod nic;
mod peers;
pub mod schedule;
mod signature;
mod topology;
pub mod tree;
mod unique_id;
mod units;
mod work;

/// The device side: the `Accelerator` trait a vendor implements, and the built-in backends.
pub use bcl_backends as backends;
/// The network side: the `Transport` trait, the built-in transports and rendezvous stores.
pub use bcl_transport as transport;

pub use bcl_backends::{
    Accelerator, DataType, DeviceBuffer, DeviceInfo, DeviceSpec, Element, ReduceOp, Vendor,
};
pub use bcl_transport::mem::{Faults, MemFabric};
pub use comm::{CommBuilder, Communicator, Exclude, HostWork, ShrinkMode};
pub use config::{CommConfig, HealthConfig, Shares, TransportKind};
pub use error::{Cause, Error, Result};
pub use peers::{PeerLabel, RankInfo};
pub use schedule::{Algorithm, AllToAllCounts, Collective};
pub use topology::LinkKind;
pub use unique_id::UniqueId;
pub use units::human_bytes;
pub use work::Work;
