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
//! No logic lives here: arguments are checked and converted, and the core does the work.
//! The unsafe code is confined to turning caller pointers into slices (`api.rs`, each block
//! with its `// SAFETY:` contract, which is the one `bcl.h` documents).
#![allow(unsafe_code)]
// The C signatures are NCCL's: their argument counts are not ours to choose.
#![allow(clippy::too_many_arguments)]

pub mod api;
mod guard;
mod registry;
pub mod types;

pub use api::*;
pub use types::*;
