//! The `Communicator`: a group of ranks that run collectives together.
//!
//! Operations run in call order. Device-buffer operations are enqueued and driven by the
//! communicator's progress thread, returning a [`Work`](crate::Work) handle. Host-slice
//! operations are blocking: the caller waits until earlier enqueued work is done and then
//! drives the executor on its own thread (no hand-off, and the borrowed slices never leave the
//! call).
//!
//! ```text
//!   init.rs    builder and init paths ──► a connected Shared (+ progress thread)
//!   host.rs    typed host-slice calls ──┐
//!   device.rs  device-buffer calls ─────┤ (queued; the progress thread runs them)
//!                                       ▼
//!   op.rs      one operation's life: begin (sequence, signature, plan, scratch)
//!                                    drive (executor polls; wait.rs decides how to wait)
//!                                    end   (measurements, poisoning)
//!   errors.rs  the errors that name ranks, hosts, devices and links
//! ```

mod checks;
mod child;
mod device;
mod errors;
mod group;
mod grow;
mod host;
mod host_async;
mod init;
mod lines;
mod op;
mod shrink;
mod split;
mod wait;

pub use host_async::HostWork;
pub use init::CommBuilder;
pub use shrink::{Exclude, ShrinkMode};

use crate::config::CommConfig;
use crate::exec::WallClock;
use crate::health::{Cause, Health, Verdict};
use crate::peers::RankInfo;
use crate::schedule::{Algorithm, Collective, Fabric, Layout};
use crate::topology::LinkKind;
use bcl_backends::Accelerator;
use bcl_transport::store::TcpStoreServer;
use device::DeviceJob;
use op::Engine;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wait::Polling;

/// What the caller's threads and the progress thread share.
struct Shared {
    rank: usize,
    world: usize,
    config: CommConfig,
    accelerator: Arc<dyn Accelerator>,
    peers: Vec<RankInfo>,
    /// The transport of each link, by peer rank.
    links: Vec<Option<LinkKind>>,
    /// This rank's place in the ring; fixed at init.
    layout: Layout,
    /// What algorithm selection depends on, the same on every rank.
    fabric: Fabric,
    /// The state one operation at a time works on.
    engine: Mutex<Engine>,
    /// Device jobs enqueued and not yet finished.
    queued: Mutex<usize>,
    drained: Condvar,
    poison: Mutex<Option<String>>,
    health: Health,
    /// The per-operation timeout in milliseconds (`CommConfig::op_timeout`, or
    /// [`Communicator::set_timeout`]).
    op_timeout_ms: AtomicU64,
    /// How to poll before sleeping when nothing moves.
    polling: Polling,
    /// The largest all-reduce that takes the lines (`lines.rs`); 0: none does.
    lines_bytes: usize,
    /// The executor's clock (the wall clock; tests of the executor pass a virtual one).
    clock: WallClock,
    /// What communicators split, shrunk or grown from this one derive theirs from.
    lineage: Lineage,
}

/// A communicator's secret (every child's is derived from it and the child's membership, so
/// ranks of different communicators, or of the old one, cannot connect to a new one) and how
/// many children it has had (the same count on every rank: children are made collectively).
struct Lineage {
    secret: bcl_transport::Secret,
    /// The transport was passed in: BCL cannot open another endpoint of it for a child.
    custom_transport: bool,
    children: AtomicU64,
    /// Groups made by `create_group` (members only), by membership: how many of each.
    groups: parking_lot::Mutex<std::collections::BTreeMap<Vec<u32>, u64>>,
}

impl Shared {
    fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms.load(Ordering::Relaxed))
    }

    /// The first fault that poisoned the communicator, or the verdict about one elsewhere.
    fn async_error(&self) -> Option<String> {
        self.poison
            .lock()
            .clone()
            .or_else(|| self.health.verdict().map(|v| v.line))
    }
}

/// A communicator: one rank's handle on a group of ranks.
pub struct Communicator {
    shared: Arc<Shared>,
    jobs: Option<crossbeam::channel::Sender<DeviceJob>>,
    progress: Option<JoinHandle<()>>,
    _store_server: Option<TcpStoreServer>,
    /// A rendezvous directory rank 0 removes when the communicator goes.
    rendezvous_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {}, {})",
            self.shared.rank,
            self.shared.world,
            self.shared.accelerator.info()
        )
    }
}

impl Communicator {
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    pub fn world_size(&self) -> usize {
        self.shared.world
    }

    /// The settings this communicator runs with.
    pub fn config(&self) -> &CommConfig {
        &self.shared.config
    }

    /// This rank's device.
    pub fn accelerator(&self) -> &Arc<dyn Accelerator> {
        &self.shared.accelerator
    }

    /// What every rank published at bootstrap, in rank order.
    pub fn peers(&self) -> &[RankInfo] {
        &self.shared.peers
    }

    /// The transport that carries the link to `peer` (`None` for this rank itself).
    pub fn link(&self, peer: usize) -> Option<LinkKind> {
        self.shared.links.get(peer).copied().flatten()
    }

    /// The ring order (position → rank) the ring algorithms use.
    pub fn ring(&self) -> &[usize] {
        self.shared.layout.ring()
    }

    /// The ranks of each host, as the hierarchical algorithms group them (from the bootstrap,
    /// or `BCL_TOPOLOGY`).
    pub fn hosts(&self) -> &[Vec<usize>] {
        self.shared.layout.hosts()
    }

    /// The hosts as one line for headers and reports (`2 hosts: [0, 1] [2, 3]`).
    pub fn topology(&self) -> String {
        crate::topology::describe_hosts(self.hosts())
    }

    /// The network interface of each rank's address, where known ([`crate::nic`]): what
    /// tells a host's rails apart.
    pub fn nics(&self) -> Vec<Option<String>> {
        self.shared.peers.iter().map(|p| p.nic.clone()).collect()
    }

    /// The interfaces of each host as one line for headers (`host 0: eth0; host 1: eth0, eth1`,
    /// `?` where unknown).
    pub fn describe_nics(&self) -> String {
        let host = |(h, ranks): (usize, &Vec<usize>)| {
            let names = crate::topology::host_nics(ranks, &self.shared.peers);
            let names: Vec<&str> = names.iter().map(|n| n.unwrap_or("?")).collect();
            format!("host {h}: {}", names.join(", "))
        };
        let hosts: Vec<String> = self.hosts().iter().enumerate().map(host).collect();
        hosts.join("; ")
    }

    /// The link constants the algorithm choice uses, as one line for headers
    /// (`inside a host: built-in; between hosts: 8.0 µs, 50.00 GB/s, reduce built-in`).
    pub fn describe_link_constants(&self) -> String {
        let one = |given: Option<crate::schedule::cost::MeasuredLink>, var: &str| match given {
            None => "built-in".to_string(),
            Some(m) => format!(
                "{:.1} µs, {:.2} GB/s, reduce {} ({var})",
                m.alpha_ns as f64 / 1e3,
                m.bytes_per_second as f64 / 1e9,
                m.reduce_bytes_per_second
                    .map_or("built-in".into(), |r| format!("{:.2} GB/s", r as f64 / 1e9))
            ),
        };
        let f = &self.shared.fabric;
        format!(
            "inside a host: {}; between hosts: {}",
            one(f.inside_link, "BCL_LINK_INSIDE"),
            one(f.between_link, "BCL_LINK_BETWEEN")
        )
    }

    /// The algorithm a call of `collective` over `bytes` runs with: the one forced by
    /// [`CommConfig::algorithm`], or the selector's choice ([`crate::schedule::select`]).
    pub fn algorithm_for(&self, collective: Collective, bytes: usize) -> Algorithm {
        (self.shared.config.algorithm)
            .unwrap_or_else(|| crate::schedule::select(collective, bytes, self.shared.fabric))
            .for_collective(collective)
    }

    /// Whether a host call of `collective` over `bytes` travels over shared-memory lines
    /// (an all-reduce or barrier of at most [`CommConfig::lines_bytes`] among ranks of one
    /// host) instead of [`Communicator::algorithm_for`]'s plan.
    ///
    /// [`CommConfig::lines_bytes`]: crate::CommConfig::lines_bytes
    pub fn uses_lines(&self, collective: Collective, bytes: usize) -> bool {
        lines::taken(&self.shared, collective, bytes)
    }

    /// The peers this rank lends its large ring messages to, for them to copy straight out
    /// of its memory (single copy; [`CommConfig::single_copy_bytes`]): the same-host peers that
    /// found at setup that they may read this process's memory. Empty where single copy is off.
    /// A peer still setting up may not have said yet.
    ///
    /// [`CommConfig::single_copy_bytes`]: crate::CommConfig::single_copy_bytes
    pub fn single_copy_peers(&self) -> Vec<usize> {
        if self.shared.config.single_copy_bytes == 0 {
            return Vec::new();
        }
        let mut engine = self.shared.engine.lock();
        let Some(lender) = engine.transport.lend() else {
            return Vec::new();
        };
        (0..self.shared.world)
            .filter(|&peer| peer != self.shared.rank && lender.reaches(peer))
            .collect()
    }

    /// Links of this rank that moved to another path mid-run (an RDMA queue pair failed and
    /// the link went on over tcp), one line each naming both ranks, the peer's host, the
    /// device left and why, oldest first; also under "degraded_links" in the health report.
    pub fn degraded_links(&self) -> Vec<String> {
        self.shared.health.degraded_links()
    }

    /// The first fault that poisoned this communicator, if any: an error of this rank's, or
    /// the verdict about a fault elsewhere (NCCL's `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<String> {
        self.shared.async_error()
    }

    /// Abort: every operation in flight on this communicator, on this rank and every other,
    /// fails promptly with a verdict naming this rank; later calls fail at once. Safe to call
    /// from any thread while another is inside a collective. The communicator must still be
    /// dropped (destroyed) to release its threads and sockets.
    pub fn abort(&self) {
        self.announce(Cause::Aborted, "abort() called");
    }

    /// Revoke (ncclCommRevoke, MPIX_Comm_revoke): every operation in flight on this
    /// communicator, on every rank, fails promptly with an error saying this rank revoked it,
    /// and later operations are refused; [`Communicator::shrink`] and destroying still work.
    /// Not collective: one rank calls it, from any thread, even while another thread of it is
    /// inside a collective. Unlike [`Communicator::abort`] it blames no rank, so a shrink
    /// with [`Exclude::Failed`](super::Exclude::Failed) after it keeps every rank that is alive.
    pub fn revoke(&self) {
        self.announce(Cause::Revoked, "revoke() called");
    }

    /// Make a verdict of `cause` about this rank, on purpose, every rank's.
    fn announce(&self, cause: Cause, what: &str) {
        let shared = &self.shared;
        let verdict = Verdict::new(
            cause,
            vec![shared.rank],
            shared.rank,
            &shared.peers,
            what,
            shared.health.current_op().as_deref(),
        );
        shared.health.report(verdict);
    }

    /// The timeout of each later operation (default `CommConfig::op_timeout`,
    /// `BCL_TIMEOUT_S`). An operation that runs out of time fails naming the peers it
    /// waited for and what the health layer found out about them.
    pub fn set_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.shared
            .op_timeout_ms
            .store(ms.max(1), Ordering::Relaxed);
    }

    /// This rank's health report: its state, the verdict if any, and the flight recorder
    /// (the last operations with their signature, state, times and bytes per peer).
    pub fn health_report(&self) -> serde_json::Value {
        let mut report = self.shared.health.report_json();
        if let Some(map) = report.as_object_mut() {
            map.insert("hosts".into(), serde_json::json!(self.hosts()));
            map.insert("nics".into(), serde_json::json!(self.nics()));
        }
        report
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Finish queued work, stop the progress thread, then let queued sends leave.
        self.jobs.take();
        if let Some(t) = self.progress.take() {
            let _ = t.join();
        }
        let mut engine = self.shared.engine.lock();
        // After a fault nobody waits for what is still queued.
        let end = if self.shared.health.faulted() {
            Instant::now()
        } else {
            Instant::now() + Duration::from_secs(2)
        };
        while !engine.transport.flushed() && Instant::now() < end {
            if engine.transport.progress().is_err() {
                break;
            }
            let _ = engine.transport.wait(Duration::from_millis(1));
        }
        drop(engine);
        self.shared.health.shutdown();
        if let Some(dir) = self.rendezvous_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
