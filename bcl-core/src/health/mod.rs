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

mod diagnose;
mod recorder;
mod service;
pub mod slow;
mod verdict;
mod wire;

use recorder::{FlightRecorder, OpRecord};
pub use verdict::{Cause, Verdict};
use wire::RankState;

use crate::config::HealthConfig;
use crate::exec::{Measurements, PeerBytes};
use crate::peers::RankInfo;
use crate::signature::Signature;
use bcl_transport::Secret;
use parking_lot::Mutex;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the data path publishes about its operations.
struct OpLog {
    started: u32,
    completed: u32,
    current: Option<Signature>,
    waiting_on: Vec<u32>,
    recorder: FlightRecorder,
    /// What a stall investigation found about the peers of the current operation.
    notes: Vec<String>,
}

/// State shared by the health thread, its helpers and the communicator.
pub(crate) struct Inner {
    rank: usize,
    secret: Secret,
    config: HealthConfig,
    /// How long one probe (connect, authenticate, answer) may take.
    probe_timeout: Duration,
    peers: OnceLock<Vec<RankInfo>>,
    ring: OnceLock<Vec<usize>>,
    faulted: AtomicBool,
    verdict: Mutex<Option<Verdict>>,
    /// Verdicts the health thread must pass on along the ring (and the rank they came from).
    to_flood: Mutex<Vec<(Verdict, Option<usize>)>>,
    /// Neighbour connections handed to the health thread.
    new_links: Mutex<Vec<(usize, std::net::TcpStream)>>,
    /// Ranks that said goodbye (destroyed their communicator).
    departed: Mutex<Vec<usize>>,
    ops: Mutex<OpLog>,
    stop: AtomicBool,
    helpers: AtomicUsize,
    created: Instant,
    /// Wakes the health thread when another thread hands it work (links, verdicts, stop).
    waker: UnixDatagram,
    /// Slow-node measurements of the current window, the detector (rank 0), and the latest
    /// summary (every rank; from rank 0).
    window: Mutex<slow::Window>,
    detector: Mutex<Option<slow::Detector>>,
    summary: Mutex<slow::Summary>,
}

/// One rank's health layer.
pub(crate) struct Health {
    inner: Arc<Inner>,
    address: Option<SocketAddr>,
    thread: Mutex<Option<JoinHandle<()>>>,
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
            created: Instant::now(),
            config,
        });
        if !inner.config.enabled {
            return Ok(Health {
                inner,
                address: None,
                thread: Mutex::new(None),
            });
        }
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("bcl-health-{rank}"))
            .spawn(move || service::run(worker, listener, woken))?;
        Ok(Health {
            inner,
            address: Some(address),
            thread: Mutex::new(Some(thread)),
        })
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
        service::spawn_helper(&self.inner, "stall", move || {
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
        let now = self.inner.micros();
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
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
        helpers_done();
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

impl Inner {
    /// Close the current slow-node window: rank 0 evaluates it with what the others sent;
    /// the others send theirs to rank 0 (on a helper) and keep the summary it answers.
    fn close_window(self: &Arc<Self>) {
        let window = {
            let mut w = self.window.lock();
            std::mem::replace(&mut *w, slow::Window::new(self.rank as u32))
        };
        if self.rank == 0 {
            let mut detector = self.detector.lock();
            let Some(d) = detector.as_mut() else { return };
            d.add(window);
            for line in d.evaluate() {
                tracing::warn!(rank = self.rank, "{line}");
            }
            *self.summary.lock() = d.summary().clone();
            return;
        }
        let Some(addr) = self.health_address(0) else {
            return;
        };
        let inner = self.clone();
        service::spawn_helper(self, "report", move || {
            let exchange = wire::dial(
                addr,
                &inner.secret,
                inner.rank,
                wire::Purpose::Report,
                inner.probe_timeout,
            )
            .and_then(|mut s| {
                wire::send(&mut s, &wire::Message::Window(window))?;
                wire::receive(&mut s)
            });
            match exchange {
                Ok(wire::Message::Summary(summary)) => *inner.summary.lock() = summary,
                Ok(other) => {
                    tracing::debug!(rank = inner.rank, "rank 0 answered a report with {other:?}")
                }
                Err(e) => tracing::debug!(rank = inner.rank, "cannot report to rank 0: {e}"),
            }
        });
    }

    /// A window from another rank (rank 0 only); returns the current summary.
    fn take_window(&self, window: slow::Window) -> slow::Summary {
        if let Some(d) = self.detector.lock().as_mut() {
            d.add(window);
        }
        self.summary.lock().clone()
    }

    /// Make the health thread look at its queues now.
    fn wake(&self) {
        let _ = self.waker.send(&[1]);
    }

    fn micros(&self) -> u64 {
        self.created.elapsed().as_micros() as u64
    }

    fn peers(&self) -> &[RankInfo] {
        self.peers.get().map_or(&[], Vec::as_slice)
    }

    fn health_address(&self, rank: usize) -> Option<SocketAddr> {
        self.peers().get(rank)?.health.as_deref()?.parse().ok()
    }

    fn current_op_text(&self) -> Option<String> {
        self.ops.lock().current.map(|s| s.to_string())
    }

    fn state(&self) -> RankState {
        let ops = self.ops.lock();
        RankState {
            started: ops.started,
            completed: ops.completed,
            current: ops.current.map(|s| s.to_string()),
            waiting_on: ops.waiting_on.clone(),
        }
    }

    /// Wait up to `limit` for a verdict to be in force.
    fn await_verdict(&self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while !self.faulted.load(Ordering::Acquire) {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    fn is_departed(&self, rank: usize) -> bool {
        self.departed.lock().contains(&rank)
    }

    /// Take `verdict` (from `from`, or found here) unless one is in force; returns the one in
    /// force. A new verdict is logged, flooded, delivered and dumped.
    fn accept(self: &Arc<Self>, verdict: Verdict, from: Option<usize>) -> Verdict {
        {
            let mut current = self.verdict.lock();
            if let Some(v) = current.as_ref() {
                return v.clone();
            }
            *current = Some(verdict.clone());
            self.faulted.store(true, Ordering::Release);
        }
        tracing::error!(rank = self.rank, "{}", verdict.line);
        self.to_flood.lock().push((verdict.clone(), from));
        self.wake();
        if from.is_none() && self.config.enabled {
            let inner = self.clone();
            let v = verdict.clone();
            service::spawn_helper(self, "deliver", move || service::deliver(&inner, &v));
        }
        if let Some(dir) = &self.config.dump_dir {
            let me = self.peers().get(self.rank);
            let name = format!(
                "bcl-flight-rank{}-pid{}.json",
                self.rank,
                std::process::id()
            );
            match recorder::dump(dir, &name, &self.report_json()) {
                Ok(path) => tracing::error!(
                    rank = self.rank,
                    host = me.map(|m| m.hostname.as_str()).unwrap_or(""),
                    "flight recorder written to {}",
                    path.display()
                ),
                Err(e) => tracing::warn!(
                    rank = self.rank,
                    "cannot write the flight recorder to {}: {e}",
                    dir.display()
                ),
            }
        }
        verdict
    }

    fn report_json(&self) -> serde_json::Value {
        let me = self.peers().get(self.rank);
        let ops = self.ops.lock();
        let records: Vec<&OpRecord> = ops.recorder.records().collect();
        serde_json::json!({
            "rank": self.rank,
            "world": self.peers().len(),
            "host": me.map(|m| m.hostname.clone()),
            "pid": std::process::id(),
            "device": me.map(|m| m.device.to_string()),
            "health_channel": self.config.enabled,
            "verdict": self.verdict.lock().as_ref().map(|v| v.line.clone()),
            "last_started": ops.started,
            "last_completed": ops.completed,
            "current": ops.current.map(|s| s.to_string()),
            "operations_total": ops.recorder.total(),
            "flight_recorder": records,
            "slow": self.summary.lock().clone(),
            "ring": self.ring.get(),
        })
    }
}
