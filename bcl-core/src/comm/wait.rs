//! How a rank waits inside an operation when nothing moves: it polls for a short window
//! (yielding the core where the host runs more ranks than cores), then sleeps (in the
//! transport's `wait`, or on its lines); meanwhile it hands a stall longer than the hang
//! timeout to the health layer once, gives up on a peer whose link is gone, and ends the
//! operation at its deadline.

use super::Shared;
use super::errors::{exec_error, timeout_error};
use crate::error::Result;
use crate::exec::{ExecError, Executor};
use crate::signature::Signature;
use bcl_transport::{Transport, TransportError};
use std::time::{Duration, Instant};

/// How long the driver polls without sleeping once nothing moves. A reply that comes within
/// this window is picked up without a wake-up from poll(2), and on this VM a sleeping core takes
/// 0.1-4 ms to wake: with a 50 µs window, a 2-rank 64 B allreduce over shm averaged 3-30 µs from
/// run to run, with 500 µs a steady 3-4 µs (`BCL_SPIN_US`).
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(500);

/// The longest single sleep: a bound on how late a fault flagged by another thread is seen.
pub(super) const SLEEP: Duration = Duration::from_millis(2);

/// What a waiting operation tells the waiter: when it last moved, whom it waits for, and
/// whether one of them is gone.
pub(super) trait Awaiting {
    /// When it last moved; `None`: as the waiter saw it (its first idle round since the last
    /// [`Waiter::moved`]), which spares a clock read per move.
    fn last_progress(&self) -> Option<Instant>;
    /// The peers whose data this rank waits for.
    fn waiting_on(&self) -> Vec<usize>;
    /// The peers this rank cannot send to yet.
    fn blocked_sends(&self) -> Vec<usize>;
    /// A peer this operation still needs whose link is gone.
    fn lost_peer(&mut self, transport: &dyn Transport) -> Option<usize>;
}

impl Awaiting for Executor<'_> {
    fn last_progress(&self) -> Option<Instant> {
        Some(self.last_progress)
    }

    fn waiting_on(&self) -> Vec<usize> {
        Executor::waiting_on(self)
    }

    fn blocked_sends(&self) -> Vec<usize> {
        Executor::blocked_sends(self)
    }

    fn lost_peer(&mut self, transport: &dyn Transport) -> Option<usize> {
        Executor::lost_peer(self, transport)
    }
}

/// How a waiting rank polls before it sleeps.
#[derive(Clone, Copy, Debug)]
pub(super) struct Polling {
    /// How long.
    window: Duration,
    /// Yield the core between polls: this host runs more ranks than it has cores, and a busy
    /// poll would steal the core from the very peer it waits for.
    yielding: bool,
}

/// The polling of a rank whose host runs `local_ranks` ranks.
pub(super) fn polling(configured: Option<Duration>, local_ranks: usize) -> Polling {
    let cores = crate::cpus::for_ranks();
    Polling {
        window: configured.unwrap_or(SPIN_BEFORE_SLEEP),
        yielding: local_ranks > cores,
    }
}

/// The waiting of one operation.
pub(super) struct Waiter {
    polling: Polling,
    started: Instant,
    deadline: Instant,
    hang_timeout: Duration,
    /// Idle rounds in a row, and when the first of them began.
    idle: u32,
    idle_since: Instant,
    /// When the current stall was handed to the health layer (once per stall).
    investigated: Option<Instant>,
}

impl Waiter {
    pub(super) fn new(shared: &Shared) -> Self {
        Self::starting_at(shared, Instant::now())
    }

    /// The waiting of an operation that started at `started` (a clock read the caller made
    /// anyway: on this VM one costs a tenth of a small call over shared memory).
    pub(super) fn starting_at(shared: &Shared, started: Instant) -> Self {
        Waiter {
            polling: shared.polling,
            started,
            deadline: started + shared.op_timeout(),
            hang_timeout: shared.config.health.hang_timeout,
            idle: 0,
            idle_since: started,
            investigated: None,
        }
    }

    /// Something moved: the next idle round starts a new spin window.
    pub(super) fn moved(&mut self) {
        self.idle = 0;
    }

    /// Nothing moved in the last poll: poll again as the policy says, or answer `true`: sleep
    /// now (at most [`SLEEP`]). An error ends the operation (its deadline passed, or a peer it
    /// needs is gone).
    pub(super) fn idle(
        &mut self,
        shared: &Shared,
        exec: &mut dyn Awaiting,
        transport: &dyn Transport,
        signature: Signature,
    ) -> Result<bool> {
        // One clock read per idle round: on a VM it is a large part of a spin.
        let now = Instant::now();
        if self.idle == 0 {
            self.idle_since = now;
        }
        self.idle += 1;
        if now >= self.deadline {
            let waited = (exec.waiting_on(), exec.blocked_sends());
            return Err(timeout_error(shared, waited, signature, self.started));
        }
        let last_progress = exec.last_progress().unwrap_or(self.idle_since);
        let stalled = now.saturating_duration_since(last_progress);
        if stalled >= self.hang_timeout && self.investigated.is_none_or(|at| at < last_progress) {
            self.investigated = Some(now);
            let mut peers = exec.waiting_on();
            if peers.is_empty() {
                peers = exec.blocked_sends();
            }
            shared.health.investigate_stall(peers, signature);
        }
        if now - self.idle_since < self.polling.window || self.idle <= 4 {
            if self.polling.yielding {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            return Ok(false);
        }
        if let Some(peer) = exec.lost_peer(transport) {
            let addr = String::from_utf8_lossy(shared.peers[peer].address.as_bytes()).into_owned();
            let lost = TransportError::PeerClosed { peer, addr };
            return Err(exec_error(shared, ExecError::Transport(lost), signature));
        }
        Ok(true)
    }
}
