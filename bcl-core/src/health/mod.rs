//! The health layer: always on, beside the data path, on a thread of its own.
//!
//! Topology: every rank keeps one authenticated TCP connection to each of its two ring
//! neighbours (it dials its successor, its predecessor dials it), with heartbeats both ways
//! every `BCL_HEARTBEAT_MS`. Two connections per rank whatever the world size, so it scales
//! to thousands of ranks; a fault is seen first by the faulty rank's neighbours (or by the
//! data path of a rank that waits on it), diagnosed, and the verdict is delivered directly to
//! every rank and flooded along the ring (which still reaches ranks the detector cannot).
//!
//! Diagnosis of a suspect peer (connection lost, silence longer than `BCL_HANG_TIMEOUT_MS`,
//! a data link that failed, an operation stalled on it):
//! * its health port refuses (or resets) connections: the process is gone (**died**);
//! * it answers: it is **alive** (and says which operation it is in, so a stalled peer reads
//!   "alive, has not called allreduce #57"), and a broken data link to it is a **link**
//!   failure;
//! * no answer: another rank (a witness, the suspect's other neighbour) is asked to try; if
//!   the witness reaches it, the **link** between the two is down; if not, the suspect is
//!   **unresponsive** (stopped or hung: its kernel may still acknowledge TCP, only the
//!   missing heartbeats and answers show it).
//!
//! The verdict poisons the communicator, fails every pending operation at its next poll, is
//! logged in one line, and the flight recorder is dumped to `BCL_DUMP_DIR`.

mod acceptor;
mod diagnose;
mod helpers;
mod membership;
pub(crate) use membership::{Liveness, Sent};
mod recorder;
#[cfg(test)]
mod report_tests;
mod service;
pub mod slow;
mod state;
mod table;
mod verdict;
pub(crate) mod wire;

use recorder::FlightRecorder;
use state::{Inner, OpLog};
pub use verdict::{Cause, Verdict};
pub use wire::TABLE_PART;

use crate::config::HealthConfig;
use crate::exec::{Measurements, PeerBytes};
use crate::peers::RankInfo;
use crate::signature::Signature;
use bcl_transport::Secret;
use parking_lot::Mutex;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One rank's health layer.
pub(crate) struct Health {
    inner: Arc<Inner>,
    address: Option<SocketAddr>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The accept thread, and the socket that wakes it for shutdown.
    acceptor: Mutex<Option<(JoinHandle<()>, UnixDatagram)>>,
    spawner: Mutex<Option<JoinHandle<()>>>,
}

impl Health {
    /// Bind the health listener on `ip` and start the health thread (when enabled).
    pub fn start(
        rank: usize,
        secret: Secret,
        ip: IpAddr,
        config: HealthConfig,
    ) -> std::io::Result<Health> {
        let probe_timeout = (config.hang_timeout / 4).max(Duration::from_millis(100));
        let (waker, woken) = UnixDatagram::pair()?;
        waker.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        let inner = Arc::new(Inner {
            waker,
            window: Mutex::new(slow::Window::new(rank as u32)),
            detector: Mutex::new(None),
            summary: Mutex::new(slow::Summary::default()),
            relayed: Mutex::new(std::collections::VecDeque::new()),
            table: Mutex::new(table::Relayed::Nothing),
            table_ready: parking_lot::Condvar::new(),
            post: Default::default(),
            rank,
            secret,
            probe_timeout,
            peers: OnceLock::new(),
            ring: OnceLock::new(),
            faulted: AtomicBool::new(false),
            verdict: Mutex::new(None),
            to_flood: Mutex::new(Vec::new()),
            new_links: Mutex::new(Vec::new()),
            departed: Mutex::new(Vec::new()),
            ops: Mutex::new(OpLog {
                started: 0,
                completed: 0,
                current: None,
                waiting_on: Vec::new(),
                recorder: FlightRecorder::new(config.recorder_ops),
                notes: Vec::new(),
            }),
            stop: AtomicBool::new(false),
            helpers: AtomicUsize::new(0),
            spawn: Mutex::new(None),
            degraded: Mutex::new(Vec::new()),
            created: Instant::now(),
            config,
        });
        if !inner.config.enabled {
            return Ok(Health {
                inner,
                address: None,
                thread: Mutex::new(None),
                acceptor: Mutex::new(None),
                spawner: Mutex::new(None),
            });
        }
        let listener = bcl_transport::listener::bind(SocketAddr::new(ip, 0))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let (accept_waker, accept_woken) = UnixDatagram::pair()?;
        accept_waker.set_nonblocking(true)?;
        accept_woken.set_nonblocking(true)?;
        let (spawn, spawner) = helpers::spawner(rank)?;
        *inner.spawn.lock() = Some(spawn);
        let health = Health {
            inner: inner.clone(),
            address: Some(address),
            thread: Mutex::new(None),
            acceptor: Mutex::new(None),
            spawner: Mutex::new(Some(spawner)),
        };
        // From here a failure to start a thread stops those already started (`Drop`).
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("bcl-health-{rank}"))
            .spawn(move || service::run(worker, woken))?;
        *health.thread.lock() = Some(thread);
        let acceptor = std::thread::Builder::new()
            .name(format!("bcl-health-accept-{rank}"))
            .spawn(move || acceptor::run(inner, listener, accept_woken))?;
        *health.acceptor.lock() = Some((acceptor, accept_waker));
        Ok(health)
    }

    /// The rank this health layer watches for.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The address published at bootstrap (`None`: the health channel is off).
    pub fn address(&self) -> Option<SocketAddr> {
        self.address
    }

    /// After bootstrap: learn the peers and the ring, and connect to the ring successor.
    pub fn watch(
        &self,
        peers: Vec<RankInfo>,
        ring: Vec<usize>,
        deadline: Instant,
    ) -> Result<(), String> {
        let inner = &self.inner;
        let world = peers.len();
        if inner.rank == 0 {
            *inner.detector.lock() = Some(slow::Detector::new(peers.clone()));
        }
        let _ = inner.peers.set(peers);
        let position = ring.iter().position(|&r| r == inner.rank).unwrap_or(0);
        let successor = ring[(position + 1) % world.max(1)];
        let _ = inner.ring.set(ring);
        if !inner.config.enabled || world < 2 {
            return Ok(());
        }
        let addr = inner
            .health_address(successor)
            .ok_or_else(|| format!("rank {successor} published no health address"))?;
        loop {
            let timeout = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(2))
                .max(Duration::from_millis(10));
            match wire::dial(
                addr,
                &inner.secret,
                inner.rank,
                wire::Purpose::Watch,
                timeout,
            ) {
                Ok(stream) => {
                    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
                    inner.new_links.lock().push((successor, stream));
                    inner.wake();
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!(
                        "cannot open the health connection to rank {successor} at {addr}: {e}"
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Whether a verdict has been reached (cheap: one atomic load).
    #[inline]
    pub fn faulted(&self) -> bool {
        self.inner.faulted.load(Ordering::Acquire)
    }

    /// The verdict in force, if any.
    pub fn verdict(&self) -> Option<Verdict> {
        self.inner.verdict.lock().clone()
    }

    /// Make `verdict` this communicator's (unless one is already in force), tell every rank,
    /// and return the one in force.
    pub fn report(&self, verdict: Verdict) -> Verdict {
        self.inner.accept(verdict, None)
    }

    /// Diagnose `peer` after the data link to it failed with `reason`; returns the verdict in
    /// force afterwards (this diagnosis's or an earlier one).
    pub fn link_failed(&self, peer: usize, reason: &str) -> Verdict {
        if let Some(v) = self.verdict() {
            return v;
        }
        let during = self.inner.current_op_text();
        let verdict = match diagnose::diagnose(
            &self.inner,
            peer,
            diagnose::Symptom::DataLink(reason.into()),
        ) {
            diagnose::Diagnosis::Fault(v) => v,
            diagnose::Diagnosis::Alive(_) => Verdict::new(
                Cause::LinkDown,
                vec![self.inner.rank, peer],
                self.inner.rank,
                self.inner.peers(),
                &format!("the data connection failed: {reason}; the peer still answers"),
                during.as_deref(),
            ),
        };
        self.report(verdict)
    }

    /// The data path has waited on `peers` for a hang timeout: find out, on a helper thread,
    /// whether they are alive and what they are doing (a fault found becomes the verdict;
    /// otherwise a note for the operation's error and a warning in the log).
    pub fn investigate_stall(&self, peers: Vec<usize>, mine: Signature) {
        {
            let mut ops = self.inner.ops.lock();
            ops.waiting_on = peers.iter().map(|&p| p as u32).collect();
        }
        if !self.inner.config.enabled {
            return;
        }
        let inner = self.inner.clone();
        helpers::spawn_helper(&self.inner, "stall", move || {
            for peer in peers {
                if inner.faulted.load(Ordering::Acquire) {
                    return;
                }
                match diagnose::diagnose(&inner, peer, diagnose::Symptom::Stalled) {
                    diagnose::Diagnosis::Fault(v) => {
                        inner.accept(v, None);
                    }
                    diagnose::Diagnosis::Alive(state) => {
                        let note = diagnose::describe_alive(&inner, peer, &state, &mine);
                        tracing::warn!(rank = inner.rank, "{} waits: {note}", mine);
                        let mut ops = inner.ops.lock();
                        if ops.current == Some(mine) {
                            ops.notes.push(note);
                        }
                    }
                }
            }
        });
    }

    /// The operation in progress, as a person reads it.
    pub fn current_op(&self) -> Option<String> {
        self.inner.current_op_text()
    }

    /// What stall investigations found during the current operation.
    pub fn notes(&self) -> Vec<String> {
        self.inner.ops.lock().notes.clone()
    }

    /// The data path starts `op` (run with `algorithm`).
    pub fn op_started(&self, op: Signature, algorithm: &'static str) {
        self.op_started_at(op, algorithm, Instant::now());
    }

    /// [`Health::op_started`], at `at` (a clock read the data path made anyway).
    pub fn op_started_at(&self, op: Signature, algorithm: &'static str, at: Instant) {
        let now = self.inner.micros_at(at);
        if !op.collective.is_point_to_point() && slow::entry_sampled(op.seq) {
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64);
            let mut w = self.inner.window.lock();
            if w.entries.len() < slow::ENTRIES_PER_WINDOW {
                w.entries.push((op.seq, at));
            }
        }
        let mut ops = self.inner.ops.lock();
        if !op.collective.is_point_to_point() {
            ops.started = op.seq;
        }
        ops.current = Some(op);
        ops.waiting_on.clear();
        ops.notes.clear();
        ops.recorder.start(op, algorithm, now);
    }

    /// The data path finished its current operation, having measured `measured`.
    pub fn op_finished(
        &self,
        peers: impl IntoIterator<Item = PeerBytes>,
        error: Option<String>,
        measured: Measurements,
    ) {
        let now = self.inner.micros();
        {
            let mut w = self.inner.window.lock();
            w.ops += 1;
            for (peer, gbps) in measured.link_rates {
                w.add_rate(peer, gbps);
            }
            w.device_bytes += measured.device_bytes;
            w.device_secs += measured.device_secs;
        }
        let mut ops = self.inner.ops.lock();
        if let Some(op) = ops.current.take()
            && !op.collective.is_point_to_point()
            && error.is_none()
        {
            ops.completed = op.seq;
        }
        ops.waiting_on.clear();
        ops.recorder.finish(now, peers, error);
    }

    /// The transport's links that moved to another path (`changes`: its whole list, oldest
    /// first): each new one becomes a "degraded link" line naming both ranks, the peer's host
    /// and the device left, logged and kept for the report. Not a fault: the link still
    /// carries the operation.
    pub fn note_path_changes(&self, changes: &[bcl_transport::PathChange]) {
        let mut known = self.inner.degraded.lock();
        for c in changes.iter().skip(known.len()) {
            let host = (self.inner.peers.get())
                .and_then(|p| p.get(c.peer))
                .map_or("?", |p| p.hostname.as_str());
            let line = format!(
                "degraded link rank {} <-> rank {} ({host}): {} -> {} after: {}",
                self.inner.rank, c.peer, c.from, c.to, c.reason
            );
            tracing::warn!(rank = self.inner.rank, peer = c.peer, "{line}");
            known.push(line);
        }
    }

    /// How many path changes `note_path_changes` has kept.
    pub fn degraded_count(&self) -> usize {
        self.inner.degraded.lock().len()
    }

    /// The lines `note_path_changes` kept, oldest first.
    pub fn degraded_links(&self) -> Vec<String> {
        self.inner.degraded.lock().clone()
    }

    /// A JSON report: this rank's state, the verdict, and the flight recorder.
    pub fn report_json(&self) -> serde_json::Value {
        self.inner.report_json()
    }

    /// Say goodbye to the neighbours and stop every thread of the health layer. Helpers
    /// (verdict deliveries first of all) finish before the listener closes; each is bounded
    /// by the probe timeout, so no thread outlives the communicator.
    pub fn shutdown(&self) {
        let helpers_done = || {
            let end = Instant::now() + self.inner.probe_timeout * 4 + Duration::from_secs(1);
            while self.inner.helpers.load(Ordering::Acquire) > 0 && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        helpers_done();
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake();
        if let Some((t, waker)) = self.acceptor.lock().take() {
            let _ = waker.send(&[1]);
            let _ = t.join();
        }
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
        helpers_done();
        // Helpers asked for from now on start where they are asked for.
        self.inner.spawn.lock().take();
        if let Some(t) = self.spawner.lock().take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Health(rank {}, listening on {:?}, verdict {:?})",
            self.inner.rank,
            self.address,
            self.verdict().map(|v| v.line)
        )
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        self.shutdown();
    }
}
