//! Host streams and events (`bclStreamCreate`, `bclEventRecord`, ...): NCCL's stream model
//! carried over to communicators whose buffers are host memory (cpu, sim, device plugins). A
//! collective called with a host stream is queued on its communicator's progress thread and
//! the call returns at once; the stream runs its operations in call order (one waits for the
//! previous one to finish, also across communicators), and events mark a point on it that a
//! caller tests or waits for. Like CUDA streams, handles are opaque numbers looked up here,
//! never pointers BCL follows.

use crate::types::{BCL_IN_PROGRESS, BCL_SUCCESS, BclResult, code_of};
use bcl_core::backends::HostStaged;
use bcl_core::{Error, Work};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The state of one host stream.
#[derive(Default)]
pub(crate) struct HostStream {
    state: Mutex<StreamState>,
    /// Notified whenever an operation is seen finished (a waiter whose operation another
    /// thread took off the queue waits for that).
    progressed: Condvar,
}

#[derive(Default)]
struct StreamState {
    /// Operations not yet seen finished, in call order, with their sequence numbers.
    pending: VecDeque<(u64, Work)>,
    submitted: u64,
    /// Every operation up to this one has finished.
    completed: u64,
    /// The first failure since the last synchronize: (its sequence number, code, text).
    error: Option<(u64, BclResult, String)>,
    /// Set when the last queued operation has finished: the next one starts after it.
    last_done: Option<Arc<AtomicBool>>,
}

/// What a finished operation left: its code and text for the caller.
fn failure(e: &Error) -> (BclResult, String) {
    (code_of(e), e.to_string())
}

impl StreamState {
    /// Take the finished operations off the front.
    fn reap(&mut self) {
        while self.pending.front().is_some_and(|(_, w)| w.test()) {
            if let Some((seq, work)) = self.pending.pop_front() {
                self.finished(seq, work.wait());
            }
        }
    }

    fn finished(&mut self, seq: u64, result: Result<(), Error>) {
        self.completed = self.completed.max(seq);
        if let Err(e) = result
            && self.error.is_none()
        {
            let (code, text) = failure(&e);
            self.error = Some((seq, code, text));
        }
    }
}

impl HostStream {
    /// The ordering flags of the next operation: the previous one's, and its own.
    pub(crate) fn next_order(&self) -> (Option<Arc<AtomicBool>>, Arc<AtomicBool>) {
        let mut s = self.state.lock();
        let mine = Arc::new(AtomicBool::new(false));
        (s.last_done.replace(mine.clone()), mine)
    }

    /// Record a queued operation.
    pub(crate) fn push(&self, work: Work) {
        let mut s = self.state.lock();
        s.submitted += 1;
        let seq = s.submitted;
        s.pending.push_back((seq, work));
    }

    /// The stream's position now (what an event recorded now waits for).
    fn position(&self) -> u64 {
        self.state.lock().submitted
    }

    /// Success once every operation up to `upto` has finished, their first error if one
    /// failed, `BCL_IN_PROGRESS` otherwise; the error text comes back with the code.
    fn query(&self, upto: u64) -> (BclResult, Option<String>) {
        let mut s = self.state.lock();
        s.reap();
        if let Some((seq, code, text)) = &s.error
            && *seq <= upto
        {
            return (*code, Some(text.clone()));
        }
        if s.completed >= upto {
            (BCL_SUCCESS, None)
        } else {
            (BCL_IN_PROGRESS, None)
        }
    }

    /// Wait until every operation up to `upto` has finished (each bounded by its
    /// communicator's operation timeout); then as [`HostStream::query`].
    fn wait(&self, upto: u64) -> (BclResult, Option<String>) {
        loop {
            // Wait outside the lock, so other threads may queue (and wait) meanwhile.
            let next = {
                let mut s = self.state.lock();
                s.reap();
                if s.completed >= upto {
                    break;
                }
                match s.pending.pop_front() {
                    Some(next) => next,
                    None => {
                        // Another thread took the operation and waits for it: so do we.
                        self.progressed.wait(&mut s);
                        continue;
                    }
                }
            };
            let (seq, work) = next;
            let result = work.wait();
            self.state.lock().finished(seq, result);
            self.progressed.notify_all();
        }
        self.query(upto)
    }

    /// Synchronize: wait for everything queued, then report and clear the first error.
    fn synchronize(&self) -> (BclResult, Option<String>) {
        let upto = self.position();
        let outcome = self.wait(upto);
        self.state.lock().error = None;
        outcome
    }
}

/// Caller memory handed to a queued operation.
pub(crate) struct RawHost {
    /// (address, bytes) of the input (out of place) and of the output.
    pub(crate) input: Option<(usize, usize)>,
    pub(crate) output: Option<(usize, usize)>,
    pub(crate) after: Option<Arc<AtomicBool>>,
    pub(crate) done: Arc<AtomicBool>,
}

impl std::fmt::Debug for RawHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawHost(in {:?}, out {:?})", self.input, self.output)
    }
}

impl HostStaged for RawHost {
    fn ready(&self) -> bool {
        self.after
            .as_ref()
            .is_none_or(|a| a.load(Ordering::Acquire))
    }

    fn buffers(&mut self) -> (Option<&[u8]>, Option<&mut [u8]>) {
        // SAFETY: bcl.h's contract for a call on a host stream: the caller keeps `len` bytes
        // at each address valid, and touches none of them, until the operation has finished
        // (a synchronize or an event says so); the input and output do not overlap (checked
        // by the caller of `submit`, `CallShape::of`). Zero-length buffers are not read.
        let input = self.input.map(|(a, len)| match len {
            0 => &[][..],
            _ => unsafe { std::slice::from_raw_parts(a as *const u8, len) },
        });
        // SAFETY: as above, for writes.
        let output = self.output.map(|(a, len)| match len {
            0 => &mut [][..],
            _ => unsafe { std::slice::from_raw_parts_mut(a as *mut u8, len) },
        });
        (input, output)
    }

    fn finish(self: Box<Self>) {
        self.done.store(true, Ordering::Release);
    }
}

impl Drop for RawHost {
    fn drop(&mut self) {
        // A job dropped without running (its communicator gone) must not hold the stream.
        self.done.store(true, Ordering::Release);
    }
}

static NEXT: AtomicUsize = AtomicUsize::new(1);
type Table<T> = Mutex<Option<HashMap<usize, T>>>;
static STREAMS: Table<Arc<HostStream>> = Mutex::new(None);
/// Events: the stream and position recorded (`None`: never recorded, complete).
static EVENTS: Table<Option<(Arc<HostStream>, u64)>> = Mutex::new(None);

fn new_handle() -> usize {
    // Odd multiples of 8: never a registry handle of a communicator (multiples of 16).
    NEXT.fetch_add(1, Ordering::Relaxed) * 16 + 8
}

pub(crate) fn create_stream() -> usize {
    let id = new_handle();
    STREAMS
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(id, Arc::default());
    id
}

pub(crate) fn stream(id: usize) -> Result<Arc<HostStream>, Error> {
    STREAMS
        .lock()
        .as_ref()
        .and_then(|m| m.get(&id).cloned())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "stream {id:#x} is not a host stream of this library (bclStreamCreate), or was \
                 destroyed"
            ))
        })
}

/// Synchronize, then forget the stream.
pub(crate) fn destroy_stream(id: usize) -> Result<(BclResult, Option<String>), Error> {
    let s = stream(id)?;
    let outcome = s.synchronize();
    STREAMS.lock().as_mut().and_then(|m| m.remove(&id));
    Ok(outcome)
}

pub(crate) fn stream_query(id: usize) -> Result<(BclResult, Option<String>), Error> {
    let s = stream(id)?;
    let upto = s.position();
    Ok(s.query(upto))
}

pub(crate) fn stream_synchronize(id: usize) -> Result<(BclResult, Option<String>), Error> {
    Ok(stream(id)?.synchronize())
}

pub(crate) fn create_event() -> usize {
    let id = new_handle();
    EVENTS
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(id, None);
    id
}

fn event(id: usize) -> Result<Option<(Arc<HostStream>, u64)>, Error> {
    EVENTS
        .lock()
        .as_ref()
        .and_then(|m| m.get(&id).cloned())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "event {id:#x} is not an event of this library (bclEventCreate), or was destroyed"
            ))
        })
}

pub(crate) fn record_event(event_id: usize, stream_id: usize) -> Result<(), Error> {
    event(event_id)?;
    let s = stream(stream_id)?;
    let at = s.position();
    if let Some(m) = EVENTS.lock().as_mut() {
        m.insert(event_id, Some((s, at)));
    }
    Ok(())
}

pub(crate) fn event_query(id: usize) -> Result<(BclResult, Option<String>), Error> {
    Ok(match event(id)? {
        Some((s, at)) => s.query(at),
        None => (BCL_SUCCESS, None),
    })
}

pub(crate) fn event_synchronize(id: usize) -> Result<(BclResult, Option<String>), Error> {
    Ok(match event(id)? {
        Some((s, at)) => s.wait(at),
        None => (BCL_SUCCESS, None),
    })
}

pub(crate) fn destroy_event(id: usize) -> Result<(), Error> {
    event(id)?;
    EVENTS.lock().as_mut().and_then(|m| m.remove(&id));
    Ok(())
}
