//! Work handles: the caller's view of an enqueued operation.

use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::Duration;

#[derive(Default)]
pub(crate) struct WorkState {
    result: Mutex<Option<Result<()>>>,
    done: Condvar,
}

impl WorkState {
    pub(crate) fn complete(&self, result: Result<()>) {
        *self.result.lock() = Some(result);
        self.done.notify_all();
    }
}

/// An operation in flight. `wait` returns its result; `test` and `wait_timeout` only ask.
#[must_use = "an enqueued operation's errors are only seen through wait()"]
pub struct Work {
    pub(crate) state: Arc<WorkState>,
    pub(crate) description: String,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Work({}, done: {})", self.description, self.test())
    }
}

impl Work {
    /// Whether the operation has finished (successfully or not).
    pub fn test(&self) -> bool {
        self.state.result.lock().is_some()
    }

    /// Wait up to `timeout`; true when the operation has finished.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let mut r = self.state.result.lock();
        if r.is_none() {
            self.state.done.wait_for(&mut r, timeout);
        }
        r.is_some()
    }

    /// Wait for the operation and return its result. The communicator's operation timeout
    /// bounds the wait.
    pub fn wait(self) -> Result<()> {
        let mut r = self.state.result.lock();
        while r.is_none() {
            self.state.done.wait(&mut r);
        }
        r.take()
            .unwrap_or_else(|| Err(Error::Internal("work result vanished".into())))
    }
}
