//! The C ABI of BCL (`include/bcl.h`), shaped like `nccl.h`.
//!
//! ```text
//!  C caller ──► extern "C" bcl*(...)  (api.rs: raw pointers → checked slices)
//!                 │ every call through guard::call: panics caught, errors → bclResult_t
//!                 │ + thread-local last-error text
//!                 ▼
//!              registry: opaque handle → Arc<Communicator>   (never a dereferenced pointer)
//!                 ▼
//!              bcl_core::Communicator
//! ```
//!
//! What lives here is what only C callers need: checking and converting arguments, turning
//! pointers into slices, NCCL's pointer rules (a call is in place when the pointers say so),
//! and `bclGroupStart`/`bclGroupEnd`'s deferral of sends and receives. Which memory a
//! pointer names is the device's declared capability (`external_memory`: device pointers and
//! streams for cuda), never a vendor check. Collectives, errors and their codes
//! (`Error::code`) are the core's. The unsafe code is confined to turning caller pointers
//! into slices (`api.rs`, each block with its `// SAFETY:` contract, which is the one `bcl.h`
//! documents).
#![allow(unsafe_code)]
// The C signatures are NCCL's: their argument counts are not ours to choose.
#![allow(clippy::too_many_arguments)]

pub mod api;
#[doc(hidden)]
pub mod fuzzing;
mod guard;
mod host_stream;
mod registry;
pub mod types;

pub use api::*;
pub use types::*;
