//! The executor's time, passed in: the wall clock in a communicator, a virtual clock in the
//! executor's own tests (so a run replays exactly from its seed).

use std::fmt;
use std::time::Instant;

/// Where the executor reads the time: when a step last completed (stall detection) and how
/// long a device call took (slow-node detection).
pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> Instant;
}

/// The real time.
#[derive(Clone, Copy, Debug, Default)]
pub struct WallClock;

impl Clock for WallClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }
}
