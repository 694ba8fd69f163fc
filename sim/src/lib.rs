//! `bcl-sim`: BCL's own collective plans (`bcl_core::schedule::build_plan`, the algorithm
//! BCL's selector picks) run on a simulated cluster, so what 10k-100k ranks would do can be
//! read from the same schedules that run for real on a few.
//!
//! ```text
//!  topology ──► network (resources: device, ports, NICs, switch uplinks)
//!                  │
//!  plans ─────► engine (discrete events in virtual time) ──► flows (max-min fair rates)
//!                  │
//!               sweep ──► bcl-bench's table and JSON rows, marked simulated
//! ```
//!
//! `ettr` models effective training time under failures (restart from checkpoint against
//! BCL's in-place recovery), from the detection and recovery figures measured elsewhere;
//! `control`, BCL's control plane at scale (the rendezvous through rank 0's store, the
//! slow-node reports, a verdict's spread) from the real code's request counts.
//!
//! Everything here is sans-IO and deterministic: no clock, thread or socket.

pub mod args;
pub mod channels;
pub mod control;
pub mod control_report;
pub mod deliveries;
pub mod engine;
pub mod ettr;
pub mod ettr_report;
pub mod fast_hash;
pub mod flows;
pub mod network;
pub mod plan_diff;
pub mod steps;
pub mod sweep;
pub mod topology;
#[cfg(test)]
mod xorshift;
