//! The state the health thread, its helpers and the communicator share: the peers and the
//! ring, the verdict in force, what the data path publishes about its operations, and the
//! slow-node windows; with the steps that act on it (accepting and spreading a verdict,
//! closing a window, the JSON report).

use super::recorder::{self, FlightRecorder, OpRecord};
use super::service;
use super::slow;
use super::verdict::Verdict;
use super::wire::{self, RankState};
use crate::config::HealthConfig;
use crate::peers::RankInfo;
use crate::signature::Signature;
use bcl_transport::Secret;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Windows a rank may hold or pass on per rank of its subtree.
pub(super) const RELAYED_PER_RANK: usize = 4;

/// What the data path publishes about its operations.
pub(super) struct OpLog {
    pub(super) started: u32,
    pub(super) completed: u32,
    pub(super) current: Option<Signature>,
    pub(super) waiting_on: Vec<u32>,
    pub(super) recorder: FlightRecorder,
    /// What a stall investigation found about the peers of the current operation.
    pub(super) notes: Vec<String>,
}

/// State shared by the health thread, its helpers and the communicator.
pub(crate) struct Inner {
    pub(super) rank: usize,
    pub(super) secret: Secret,
    pub(super) config: HealthConfig,
    /// How long one probe (connect, authenticate, answer) may take.
    pub(super) probe_timeout: Duration,
    pub(super) peers: OnceLock<Vec<RankInfo>>,
    pub(super) ring: OnceLock<Vec<usize>>,
    pub(super) faulted: AtomicBool,
    pub(super) verdict: Mutex<Option<Verdict>>,
    /// Verdicts the health thread must pass on along the ring (and the rank they came from).
    pub(super) to_flood: Mutex<Vec<(Verdict, Option<usize>)>>,
    /// Neighbour connections handed to the health thread.
    pub(super) new_links: Mutex<Vec<(usize, std::net::TcpStream)>>,
    /// Ranks that said goodbye (destroyed their communicator).
    pub(super) departed: Mutex<Vec<usize>>,
    pub(super) ops: Mutex<OpLog>,
    pub(super) stop: AtomicBool,
    pub(super) helpers: AtomicUsize,
    pub(super) created: Instant,
    /// Wakes the health thread when another thread hands it work (links, verdicts, stop).
    pub(super) waker: UnixDatagram,
    /// Slow-node measurements of the current window, the detector (rank 0), and the latest
    /// summary (every rank; from rank 0).
    pub(super) window: Mutex<slow::Window>,
    pub(super) detector: Mutex<Option<slow::Detector>>,
    pub(super) summary: Mutex<slow::Summary>,
    /// Windows this rank's children in the reports' tree sent up, to pass on with its own
    /// (every rank but rank 0; bounded by [`RELAYED_PER_RANK`] per rank below it).
    pub(super) relayed: Mutex<std::collections::VecDeque<slow::Window>>,
    /// The rendezvous table this rank hands to its children in the gathering tree, as much
    /// of it as has come, and the signal that more came.
    pub(super) table: Mutex<super::table::Relayed>,
    pub(super) table_ready: parking_lot::Condvar,
    /// Shrink proposals and addresses from other ranks.
    pub(super) post: super::membership::Post,
    /// The channel to the thread that starts helpers (`None` once shut down, or when off).
    pub(super) spawn: Mutex<Option<super::helpers::Spawn>>,
    /// Links of this rank that moved to another path mid-run, one line each (degraded, not a
    /// fault; see `Health::note_path_changes`).
    pub(super) degraded: Mutex<Vec<String>>,
}

impl Inner {
    /// Close the current slow-node window: rank 0 evaluates it with what the others sent;
    /// the others send theirs, with the windows their children sent up, to their parent in
    /// the reports' tree ([`crate::tree`], `HealthConfig::report_fanout`), and keep the
    /// summary it answers (rank 0's, passed down a level per window). Rank 0 hears from its
    /// children only: with every rank dialling it each window, 128 ranks on this 2-core
    /// machine queued ~950 handshake threads at its health port, which then answered no probe
    /// and was named unresponsive (docs/scale.md). On a helper: the window and the detector
    /// are locked by the data path and by the reports arriving, and a thread that holds one
    /// can be preempted for seconds on a crowded machine.
    pub(super) fn close_window(self: &Arc<Self>) {
        let inner = self.clone();
        super::helpers::spawn_helper(self, "window", move || inner.close_window_now());
    }

    fn close_window_now(&self) {
        let window = {
            let mut w = self.window.lock();
            std::mem::replace(&mut *w, slow::Window::new(self.rank as u32))
        };
        let fanout = self.config.report_fanout;
        let Some(parent) = crate::tree::parent(self.rank, fanout) else {
            let mut detector = self.detector.lock();
            let Some(d) = detector.as_mut() else { return };
            d.add(window);
            for line in d.evaluate() {
                tracing::warn!(rank = self.rank, "{line}");
            }
            *self.summary.lock() = d.summary().clone();
            return;
        };
        let Some(addr) = self.health_address(parent) else {
            return;
        };
        let mut windows: Vec<slow::Window> = self.relayed.lock().drain(..).collect();
        windows.push(window);
        let exchange = wire::dial(
            addr,
            &self.secret,
            self.rank,
            wire::Purpose::Report {
                windows: windows.len() as u32,
            },
            self.probe_timeout,
        )
        .and_then(|mut s| {
            for w in windows {
                wire::send(&mut s, &wire::Message::Window(w))?;
            }
            wire::receive(&mut s)
        });
        match exchange {
            Ok(wire::Message::Summary(summary)) => *self.summary.lock() = summary,
            Ok(other) => {
                tracing::debug!(
                    rank = self.rank,
                    parent,
                    "parent answered a report with {other:?}"
                )
            }
            Err(e) => tracing::debug!(
                rank = self.rank,
                parent,
                "cannot report to rank {parent}: {e}"
            ),
        }
    }

    /// How many windows a report from `child` may carry: a few per rank of its subtree (a
    /// window's worth per level may queue while a parent's own report is in flight).
    pub(super) fn report_limit(&self, child: usize) -> usize {
        let size = crate::tree::subtree_size(child, self.peers().len(), self.config.report_fanout);
        size.saturating_mul(RELAYED_PER_RANK)
    }

    /// A window `child` sent up, from a rank of its subtree: rank 0's detector takes it, any
    /// other rank keeps it for its own next report (the oldest dropped past the bound).
    pub(super) fn take_relayed(&self, window: slow::Window) {
        if self.rank == 0 {
            if let Some(d) = self.detector.lock().as_mut() {
                d.add(window);
            }
            return;
        }
        // Room for this rank's own window too: its report stays within its parent's limit.
        let bound = self.report_limit(self.rank).saturating_sub(1).max(1);
        let mut relayed = self.relayed.lock();
        while relayed.len() >= bound {
            relayed.pop_front();
        }
        relayed.push_back(window);
    }

    /// What `child`'s report is answered with: the part of the latest summary (rank 0's own,
    /// or the one its parent last answered) about its subtree, and every verdict.
    pub(super) fn summary_for(&self, child: usize) -> slow::Summary {
        let fanout = self.config.report_fanout;
        (self.summary.lock()).of_subtree(|r| crate::tree::in_subtree(r, child, fanout))
    }

    /// Make the health thread look at its queues now.
    pub(super) fn wake(&self) {
        let _ = self.waker.send(&[1]);
    }

    pub(super) fn micros(&self) -> u64 {
        self.micros_at(Instant::now())
    }

    /// Microseconds from the health layer's start to `at`.
    pub(super) fn micros_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.created).as_micros() as u64
    }

    pub(super) fn peers(&self) -> &[RankInfo] {
        self.peers.get().map_or(&[], Vec::as_slice)
    }

    pub(super) fn health_address(&self, rank: usize) -> Option<SocketAddr> {
        self.peers().get(rank)?.health.as_deref()?.parse().ok()
    }

    pub(super) fn current_op_text(&self) -> Option<String> {
        self.ops.lock().current.map(|s| s.to_string())
    }

    pub(super) fn state(&self) -> RankState {
        let ops = self.ops.lock();
        RankState {
            started: ops.started,
            completed: ops.completed,
            current: ops.current.map(|s| s.to_string()),
            waiting_on: ops.waiting_on.clone(),
        }
    }

    /// Wait up to `limit` for a verdict to be in force.
    pub(super) fn await_verdict(&self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while !self.faulted.load(Ordering::Acquire) {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    pub(super) fn is_departed(&self, rank: usize) -> bool {
        self.departed.lock().contains(&rank)
    }

    /// Take `verdict` (from `from`, or found here) unless one is in force; returns the one in
    /// force. A new verdict is logged, flooded, delivered and dumped.
    pub(super) fn accept(self: &Arc<Self>, verdict: Verdict, from: Option<usize>) -> Verdict {
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
            super::helpers::spawn_helper(self, "deliver", move || service::deliver(&inner, &v));
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

    pub(super) fn report_json(&self) -> serde_json::Value {
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
            "membership_messages_refused": self.post.mailbox.lock().refused,
            "degraded_links": self.degraded.lock().clone(),
        })
    }
}
