//! The `Communicator`: a group of ranks that run collectives together.
//!
//! Operations run in call order. Device-buffer operations are enqueued and driven by the
//! communicator's progress thread, returning a [`Work`] handle. Host-slice operations are
//! blocking: the caller waits until earlier enqueued work is done and then drives the
//! executor on its own thread (no hand-off, and the borrowed slices never leave the call).

use crate::bootstrap;
use crate::config::{CommConfig, TransportKind, process_env};
use crate::error::{Error, Result};
use crate::exec::Measurements;
use crate::exec::{Bindings, ExecError, ExecScratch, Executor, Memory, OpContext};
use crate::health::{Cause, Health, Verdict};
use crate::launch::{Launch, Rendezvous};
use crate::links;
use crate::peers::{PeerLabel, RankInfo};
use crate::schedule::{
    Algorithm, Collective, Fabric, Layout, Plan, build_plan, connections_per_peer, select,
};
use crate::signature::Signature;
use crate::topology::{LinkKind, ring_order};
use crate::unique_id::UniqueId;
use crate::work::{Work, WorkState};
use bcl_backends::host::{host_identity, hostname};
use bcl_backends::{
    Accelerator, DataType, DeviceBuffer, Element, Event, HostStaged, ReduceOp, Stream, StreamHold,
    open_device,
};
use bcl_transport::mem::MemFabric;
use bcl_transport::store::{FileStore, MemoryStore, Store, TcpStore, TcpStoreServer};
use bcl_transport::{Secret, Transport, TransportError};
use crossbeam::channel::{Receiver, Sender, unbounded};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// An operation on device buffers, queued for the progress thread.
struct DeviceJob {
    collective: Collective,
    count: usize,
    dtype: DataType,
    input: Option<DeviceBuffer>,
    output: Option<DeviceBuffer>,
    work: Arc<WorkState>,
    /// Marks the end of the work the caller enqueued on its stream before this job: the job
    /// starts once the device has reached it.
    after: Option<Event>,
    /// Holds the caller's stream until the job is done (released when dropped).
    hold: Option<StreamHold>,
    /// The job runs on host mirrors of its device buffers that the caller's stream fills
    /// and drains (`Accelerator::stage_through_host`); the progress thread then makes no
    /// device calls for it.
    staged: Option<Box<dyn HostStaged>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    collective: Collective,
    algorithm: Algorithm,
    count: usize,
    in_place: bool,
    slice_elems: usize,
}

/// How many plans a communicator keeps (least recently used dropped first).
const PLANS_KEPT: usize = 64;

/// The state one operation at a time works on: the transport, plans, scratch space.
struct Engine {
    transport: Box<dyn Transport>,
    layout: Layout,
    /// Sequence number of the last collective (every rank takes part).
    seq: u32,
    /// Sequence numbers of the last message sent to / received from each peer: a transfer
    /// from A to B is A's n-th send to B and B's n-th receive from A, whatever else either
    /// rank does in between.
    sent_to: Vec<u32>,
    received_from: Vec<u32>,
    /// Plans by key, most recently used first (a few keys at a time: a linear search beats
    /// hashing the key).
    plans: Vec<(PlanKey, Plan)>,
    host_scratch: Vec<u8>,
    device_scratch: Option<DeviceBuffer>,
    /// The executor's vectors, reused from operation to operation.
    exec_scratch: ExecScratch,
}

struct Shared {
    rank: usize,
    world: usize,
    config: CommConfig,
    accelerator: Arc<dyn Accelerator>,
    peers: Vec<RankInfo>,
    /// The transport of each link, by peer rank.
    links: Vec<Option<LinkKind>>,
    /// What algorithm selection depends on, the same on every rank.
    fabric: Fabric,
    engine: Mutex<Engine>,
    /// Device jobs enqueued and not yet finished.
    queued: Mutex<usize>,
    drained: Condvar,
    poison: Mutex<Option<String>>,
    health: Health,
    /// The per-operation timeout in milliseconds (`CommConfig::op_timeout`, or
    /// [`Communicator::set_timeout`]).
    op_timeout_ms: AtomicU64,
    /// How to poll before sleeping when nothing moves (see [`polling`]).
    spin: Polling,
}

/// A communicator: one rank's handle on a group of ranks.
pub struct Communicator {
    shared: Arc<Shared>,
    jobs: Option<Sender<DeviceJob>>,
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
    /// Join a communicator as `rank` of `world`, rendezvousing through the TCP store that
    /// rank 0 serves at `id.addr` (rank 0 starts it).
    pub fn init(rank: usize, world: usize, id: &UniqueId, config: CommConfig) -> Result<Self> {
        check_rank(rank, world)?;
        let deadline = Instant::now() + config.init_timeout;
        let server = if rank == 0 {
            Some(
                TcpStoreServer::start(id.addr, id.secret).map_err(|e| Error::Bootstrap {
                    rank,
                    reason: format!("rank 0 cannot serve the store at {}: {e}", id.addr),
                })?,
            )
        } else {
            None
        };
        let store = TcpStore::connect(id.addr, &id.secret, deadline).map_err(|e| {
            Error::BootstrapTimeout {
                rank,
                missing: vec![0],
                waited_s: config.init_timeout.as_secs_f64(),
                detail: e.to_string(),
            }
        })?;
        let mut comm = Self::init_with_store(rank, world, Arc::new(store), id.secret, config)?;
        comm._store_server = server;
        Ok(comm)
    }

    /// Join using the launcher's environment (see [`crate::launch`]) and `BCL_*` settings.
    /// Without `BCL_BIND_IP`, ranks listen on the address that reaches the rendezvous root.
    pub fn init_from_env() -> Result<Self> {
        let launch = Launch::from_env(&process_env)?;
        let mut config = CommConfig::default().with_env(&process_env)?;
        if process_env("BCL_BIND_IP").is_none()
            && let Some(ip) = launch.bind_ip()
        {
            config.bind_ip = ip;
        }
        Self::init_launched(&launch, config)
    }

    /// Join as `launch` says: through rank 0's store, or through a directory.
    pub fn init_launched(launch: &Launch, config: CommConfig) -> Result<Self> {
        let (rank, world) = (launch.rank, launch.world);
        check_rank(rank, world)?;
        let dir = match &launch.rendezvous {
            Rendezvous::Root(id) => return Self::init(rank, world, id, config),
            Rendezvous::Directory(dir) => dir,
        };
        let failed = |what: &str, e: &dyn std::fmt::Display| Error::Bootstrap {
            rank,
            reason: format!("rendezvous directory {}: {what}: {e}", dir.display()),
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| failed("cannot create it", &e))?;
        }
        let store = FileStore::new(dir).map_err(|e| failed("unusable", &e))?;
        let deadline = Instant::now() + config.init_timeout;
        let key = format!("{}/secret", config.store_prefix);
        // Rank 0 makes the secret; the directory is private to this user.
        let secret = if rank == 0 {
            let s = Secret::random().map_err(|e| Error::Unavailable(e.to_string()))?;
            store
                .set(&key, s.to_hex().as_bytes())
                .map_err(|e| failed("cannot write the secret", &e))?;
            s
        } else {
            let raw = store
                .get(&key, deadline)
                .map_err(|e| Error::BootstrapTimeout {
                    rank,
                    missing: vec![0],
                    waited_s: config.init_timeout.as_secs_f64(),
                    detail: format!("waiting for rank 0 in {}: {e}", dir.display()),
                })?;
            Secret::from_hex(&String::from_utf8_lossy(&raw))
                .ok_or_else(|| failed("holds no valid secret", &"(corrupt)"))?
        };
        let mut comm = Self::init_with_store(rank, world, Arc::new(store), secret, config)?;
        if rank == 0 {
            comm.rendezvous_dir = Some(dir.clone());
        }
        Ok(comm)
    }

    /// `world` ranks as threads of this process, joined by the in-process transport (unless
    /// `config.transport` says otherwise). Returns the communicators in rank order.
    pub fn init_threads(world: usize, config: CommConfig) -> Result<Vec<Self>> {
        Self::init_threads_with(world, |_| config.clone())
    }

    /// As [`Communicator::init_threads`], with a config per rank (e.g. mixed devices).
    pub fn init_threads_with(
        world: usize,
        config_of: impl Fn(usize) -> CommConfig,
    ) -> Result<Vec<Self>> {
        check_rank(0, world)?;
        let store = Arc::new(MemoryStore::new());
        let secret = Secret::random().map_err(|e| Error::Unavailable(e.to_string()))?;
        let fabric = MemFabric::new(world);
        let configs: Vec<CommConfig> = (0..world)
            .map(|r| {
                let mut c = config_of(r);
                if matches!(c.transport, TransportKind::Auto) {
                    c.transport = TransportKind::Mem(fabric.clone());
                }
                c
            })
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = configs
                .into_iter()
                .enumerate()
                .map(|(rank, c)| {
                    let store: Arc<dyn Store> = store.clone();
                    s.spawn(move || Self::init_with_store(rank, world, store, secret, c))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Internal("init thread panicked".into())))
                })
                .collect()
        })
    }

    /// Join through any rendezvous store. `secret` authenticates every connection.
    pub fn init_with_store(
        rank: usize,
        world: usize,
        store: Arc<dyn Store>,
        secret: Secret,
        config: CommConfig,
    ) -> Result<Self> {
        check_rank(rank, world)?;
        let started = Instant::now();
        let deadline = started + config.init_timeout;
        let accelerator =
            open_device(&config.device, config.device_index).map_err(|source| Error::Device {
                rank,
                device: config.device.to_string(),
                source,
            })?;
        let endpoint = links::open(rank, &config, secret)?;
        let health =
            Health::start(rank, secret, config.bind_ip, config.health.clone()).map_err(|e| {
                Error::Bootstrap {
                    rank,
                    reason: format!("cannot start the health channel on {}: {e}", config.bind_ip),
                }
            })?;
        let me = RankInfo {
            rank,
            hostname: hostname(),
            host_id: host_identity(),
            pid: std::process::id(),
            device: accelerator.info().clone(),
            address: endpoint.address().clone(),
            health: health.address().map(|a| a.to_string()),
        };
        let peers = bootstrap::exchange(
            store.as_ref(),
            &config.store_prefix,
            &me,
            world,
            started,
            deadline,
        )?;
        let (transport, links) = endpoint.connect(&config, &me, &peers, started, deadline)?;
        let layout = Layout::new(rank, ring_order(&peers)).map_err(Error::Internal)?;
        health
            .watch(peers.clone(), layout.ring().to_vec(), deadline)
            .map_err(|reason| Error::Bootstrap { rank, reason })?;
        let local_ranks = peers.iter().filter(|p| p.host_id == me.host_id).count();
        let spin = polling(config.spin, local_ranks);
        tracing::debug!(rank, world, ring = ?layout.ring(), device = %me.device, "communicator ready");
        let config_timeout_ms = config.op_timeout.as_millis() as u64;
        let shared = Arc::new(Shared {
            rank,
            world,
            config,
            accelerator,
            fabric: Fabric {
                world,
                all_shared_memory: links::all_shared_memory(&peers),
                one_host: local_ranks == world,
            },
            peers,
            links,
            engine: Mutex::new(Engine {
                transport,
                layout,
                seq: 0,
                sent_to: vec![0; world],
                received_from: vec![0; world],
                plans: Vec::new(),
                host_scratch: Vec::new(),
                exec_scratch: ExecScratch::default(),
                device_scratch: None,
            }),
            queued: Mutex::new(0),
            drained: Condvar::new(),
            poison: Mutex::new(None),
            health,
            op_timeout_ms: AtomicU64::new(config_timeout_ms),
            spin,
        });
        let (tx, rx) = unbounded();
        let worker = shared.clone();
        let progress = std::thread::Builder::new()
            .name(format!("bcl-progress-{rank}"))
            .spawn(move || progress_loop(worker, rx))
            .map_err(|e| Error::Internal(format!("cannot start the progress thread: {e}")))?;
        Ok(Communicator {
            shared,
            jobs: Some(tx),
            progress: Some(progress),
            _store_server: None,
            rendezvous_dir: None,
        })
    }

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
    pub fn ring(&self) -> Vec<usize> {
        self.shared.engine.lock().layout.ring().to_vec()
    }

    /// The first fault that poisoned this communicator, if any: an error of this rank's, or
    /// the verdict about a fault elsewhere (NCCL's `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<String> {
        self.shared
            .poison
            .lock()
            .clone()
            .or_else(|| self.shared.health.verdict().map(|v| v.line))
    }

    /// Abort: every operation in flight on this communicator, on this rank and every other,
    /// fails promptly with a verdict naming this rank; later calls fail at once. Safe to call
    /// from any thread while another is inside a collective. The communicator must still be
    /// dropped (destroyed) to release its threads and sockets.
    pub fn abort(&self) {
        let shared = &self.shared;
        let verdict = Verdict::new(
            Cause::Aborted,
            vec![shared.rank],
            shared.rank,
            &shared.peers,
            "abort() called",
            shared.health.current_op().as_deref(),
        );
        shared.health.report(verdict);
    }

    /// The timeout of each later operation (default `CommConfig::op_timeout`,
    /// `BCL_TIMEOUT_S`). An operation that runs out of time fails naming the peers it
    /// waited for and what the health layer found out about them.
    pub fn set_timeout(&self, timeout: Duration) {
        self.shared
            .op_timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// This rank's health report: its state, the verdict if any, and the flight recorder
    /// (the last operations with their signature, state, times and bytes per peer).
    pub fn health_report(&self) -> serde_json::Value {
        self.shared.health.report_json()
    }

    // ---- typed host-slice API (blocking) ----

    /// `recv[i] = op over ranks of send[i]`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.run_host(
            Collective::AllReduce { op },
            send.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.run_host(
            Collective::AllReduce { op },
            buf.len(),
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` (world × send.len()) gets every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.run_host(
            Collective::AllGather,
            send.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    /// In place: this rank's contribution is already at `buf[rank*count..]`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len())?;
        self.run_host(
            Collective::AllGather,
            count,
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` gets block `rank` of the reduction of every rank's `send` (world × recv.len()).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.run_host(
            Collective::ReduceScatter { op },
            recv.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    /// In place: the result lands in `buf[rank*count..(rank+1)*count]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.per_rank(buf.len())?;
        self.run_host(
            Collective::ReduceScatter { op },
            count,
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` on every rank gets `send` of `root` (`send` is read on the root only).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.run_host(
            Collective::Broadcast { root },
            recv.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.run_host(
            Collective::Broadcast { root },
            buf.len(),
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// `recv` on `root` gets the reduction of every rank's `send`; other ranks' `recv` is not
    /// touched (it may be empty).
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let output = (self.rank() == root).then(|| bytes_mut(recv));
        self.run_host(
            Collective::Reduce { op, root },
            send.len(),
            T::DATA_TYPE,
            Some(bytes(send)),
            output,
        )
    }

    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.run_host(
            Collective::Reduce { op, root },
            buf.len(),
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// Block j of `send` goes to rank j; block j of `recv` comes from rank j.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.per_rank(send.len())?;
        self.run_host(
            Collective::AllToAll,
            count,
            T::DATA_TYPE,
            Some(bytes(send)),
            Some(bytes_mut(recv)),
        )
    }

    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len())?;
        self.run_host(
            Collective::AllToAll,
            count,
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// Send `data` to `peer`, which must call [`Communicator::recv`] with the same count.
    pub fn send<T: Element>(&self, data: &[T], peer: usize) -> Result<()> {
        self.run_host(
            Collective::Send { peer },
            data.len(),
            T::DATA_TYPE,
            Some(bytes(data)),
            None,
        )
    }

    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.run_host(
            Collective::Recv { peer },
            buf.len(),
            T::DATA_TYPE,
            None,
            Some(bytes_mut(buf)),
        )
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.run_host(Collective::Barrier, 0, DataType::Uint8, None, None)
    }

    // ---- device-buffer API (enqueued) ----

    /// Enqueue `collective` over device buffers of this rank's device; `input: None` means
    /// in place on `output`. Buffers are held until the work completes.
    pub fn submit(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
    ) -> Result<Work> {
        self.enqueue(collective, count, dtype, input, output, None)
    }

    /// Enqueue `collective` on a stream of this rank's device, as NCCL does: it starts after
    /// the work already enqueued on `stream`, and the stream's later work waits for it, while
    /// this call returns at once. The returned [`Work`] says when it is done (and its error).
    /// On the cuda backend the stream waits on the GPU (a stream memory operation on a
    /// host-mapped flag that the progress thread sets); the cpu and sim backends finish their
    /// streams' work as it is enqueued, so nothing waits there.
    ///
    /// While such a collective runs, do not block a host thread in a CUDA call on `stream`
    /// (`cudaStreamSynchronize`, a pageable `cudaMemcpy`): measured on an H200, the progress
    /// thread's own CUDA calls then stall behind it and the collective never finishes. Wait
    /// for the [`Work`] first, or use [`Communicator::submit_staged`].
    pub fn submit_on(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
        stream: &Stream,
    ) -> Result<Work> {
        self.enqueue(collective, count, dtype, input, output, Some(stream))
    }

    /// Enqueue `collective` on a caller's stream through host memory: the stream copies the
    /// device input into pinned host memory and signals the progress thread, which runs the
    /// collective there (host kernels) and signals back; the stream then copies the result
    /// into `output`. Starts after the stream's earlier work, the stream's later work follows
    /// it, the call returns at once, and the progress thread makes no device calls, so the
    /// caller may block on the stream (`cudaStreamSynchronize`) at once. What the C ABI does
    /// for cuda communicators.
    pub fn submit_staged(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
        stream: &Stream,
    ) -> Result<Work> {
        let need = self.check_device_call(collective, count, dtype, input, output)?;
        let staged = self
            .shared
            .accelerator
            .stage_through_host(
                input.zip(need.0).map(|(b, n)| b.slice(0, n)),
                output.zip(need.1).map(|(b, n)| b.slice(0, n)),
                stream,
            )
            .map_err(|e| self.device_error(e))?;
        let work = Arc::new(WorkState::default());
        let job = DeviceJob {
            collective,
            count,
            dtype,
            input: None,
            output: None,
            work: work.clone(),
            after: None,
            hold: None,
            staged: Some(staged),
        };
        self.send_job(job)?;
        Ok(Work {
            state: work,
            description: format!("{collective} of {count} x {dtype}"),
        })
    }

    /// Check a call on device buffers (`input: None`: in place on `output`); returns the
    /// bytes each buffer must hold.
    fn check_device_call(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
    ) -> Result<(Option<usize>, Option<usize>)> {
        self.check_usable()?;
        let need = self.validate(collective, count, dtype, input.is_none())?;
        check_len("input", input.map(DeviceBuffer::len), need.0, Fit::AtLeast)?;
        check_len(
            "output",
            output.map(DeviceBuffer::len),
            need.1,
            Fit::AtLeast,
        )?;
        Ok(need)
    }

    /// The device error of this rank's accelerator.
    fn device_error(&self, source: bcl_backends::DeviceError) -> Error {
        device_error(&self.shared, source)
    }

    fn send_job(&self, job: DeviceJob) -> Result<()> {
        *self.shared.queued.lock() += 1;
        let sent = self.jobs.as_ref().map(|j| j.send(job));
        if !matches!(sent, Some(Ok(()))) {
            *self.shared.queued.lock() -= 1;
            return Err(Error::Internal("the progress thread is gone".into()));
        }
        Ok(())
    }

    fn enqueue(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&DeviceBuffer>,
        output: Option<&DeviceBuffer>,
        stream: Option<&Stream>,
    ) -> Result<Work> {
        self.check_device_call(collective, count, dtype, input, output)?;
        let (after, hold) = match stream {
            None => (None, None),
            Some(stream) => {
                let acc = &self.shared.accelerator;
                let after = acc.record_event(stream).map_err(|e| self.device_error(e))?;
                let hold = acc.hold_stream(stream).map_err(|e| self.device_error(e))?;
                (Some(after), Some(hold))
            }
        };
        let work = Arc::new(WorkState::default());
        let job = DeviceJob {
            collective,
            count,
            dtype,
            input: input.cloned(),
            output: output.cloned(),
            work: work.clone(),
            after,
            hold,
            staged: None,
        };
        self.send_job(job)?;
        Ok(Work {
            state: work,
            description: format!("{collective} of {count} x {dtype}"),
        })
    }

    /// `output = op over ranks of input` on device buffers.
    pub fn all_reduce_device(
        &self,
        input: &DeviceBuffer,
        output: &DeviceBuffer,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Work> {
        self.submit(
            Collective::AllReduce { op },
            count,
            dtype,
            Some(input),
            Some(output),
        )
    }

    // ---- internals ----

    fn per_rank(&self, total: usize) -> Result<usize> {
        let n = self.world_size();
        if !total.is_multiple_of(n) {
            return Err(Error::InvalidArgument(format!(
                "a buffer of {total} elements cannot be split into {n} equal blocks"
            )));
        }
        Ok(total / n)
    }

    fn check_usable(&self) -> Result<()> {
        match self.async_error() {
            Some(first) => Err(Error::Poisoned(first)),
            None => Ok(()),
        }
    }

    /// Check the call's parameters; returns the byte sizes the buffers must have.
    fn validate(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        in_place: bool,
    ) -> Result<(Option<usize>, Option<usize>)> {
        let (rank, world) = (self.rank(), self.world_size());
        if let Some(r) = collective.root() {
            if r >= world {
                return Err(Error::InvalidArgument(format!(
                    "{}: rank {r} does not exist in a communicator of {world}",
                    collective.name()
                )));
            }
            if matches!(
                collective,
                Collective::Send { .. } | Collective::Recv { .. }
            ) && r == rank
            {
                return Err(Error::InvalidArgument(format!(
                    "{}: rank {rank} cannot address itself",
                    collective.name()
                )));
            }
        }
        let esize = dtype.size();
        let (i, o) = collective.buffer_elems(count, world, rank);
        let bytes = |e: Option<usize>| -> Result<Option<usize>> {
            e.map(|e| {
                e.checked_mul(esize).ok_or_else(|| {
                    Error::InvalidArgument(format!("count {count} of {dtype} overflows"))
                })
            })
            .transpose()
        };
        let (i, o) = (bytes(i)?, bytes(o)?);
        if in_place {
            if matches!(
                collective,
                Collective::Send { .. } | Collective::Recv { .. } | Collective::Barrier
            ) {
                return Ok((None, o));
            }
            // One buffer, sized for the larger side.
            return Ok((None, Some(i.unwrap_or(0).max(o.unwrap_or(0)))));
        }
        Ok((i, o))
    }

    /// The untyped blocking call behind the typed methods (and the C ABI): `count` as NCCL
    /// counts it for `collective`, `input: None` for in place (the input is in `output`).
    /// Buffer lengths are checked against what the call needs.
    pub fn run_host(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        input: Option<&[u8]>,
        output: Option<&mut [u8]>,
    ) -> Result<()> {
        self.check_usable()?;
        let in_place = input.is_none();
        let need = self.validate(collective, count, dtype, in_place)?;
        check_len("send buffer", input.map(<[u8]>::len), need.0, Fit::Exact)?;
        check_len(
            "receive buffer",
            output.as_ref().map(|o| o.len()),
            need.1,
            Fit::Exact,
        )?;
        // Keep call order: earlier enqueued device work finishes first.
        {
            let mut q = self.shared.queued.lock();
            while *q > 0 {
                self.shared.drained.wait(&mut q);
            }
        }
        let bindings = Bindings {
            input: input.map(Memory::HostRead),
            output: output.map(Memory::HostWrite),
            scratch: None,
        };
        let mut engine = self.shared.engine.lock();
        run(
            &self.shared,
            &mut engine,
            collective,
            count,
            dtype,
            bindings,
            false,
        )
    }
}

fn check_rank(rank: usize, world: usize) -> Result<()> {
    if world == 0 || rank >= world {
        return Err(Error::InvalidArgument(format!(
            "rank {rank} is not in 0..{world} (world size must be at least 1)"
        )));
    }
    Ok(())
}

/// How a buffer's length must relate to what a call needs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// Host slices: their length is the count the caller meant, so it must match.
    Exact,
    /// Device buffers are allocations that may be larger than one call uses.
    AtLeast,
}

fn check_len(what: &str, got: Option<usize>, want: Option<usize>, fit: Fit) -> Result<()> {
    match (got, want) {
        (Some(g), Some(w)) if g < w || (fit == Fit::Exact && g != w) => {
            Err(Error::InvalidArgument(format!(
                "{what} holds {g} bytes, but this call needs {w} bytes"
            )))
        }
        (None, Some(w)) if w > 0 => Err(Error::InvalidArgument(format!(
            "{what} is missing; this call needs {w} bytes"
        ))),
        _ => Ok(()),
    }
}

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// This rank's device error.
fn device_error(shared: &Shared, source: bcl_backends::DeviceError) -> Error {
    Error::Device {
        rank: shared.rank,
        device: shared.accelerator.info().to_string(),
        source,
    }
}

/// Wait (polling with backoff, bounded by the operation timeout) until the work the caller
/// enqueued on its stream before this job is done, as `reached` tells.
fn wait_for_caller_stream(
    shared: &Shared,
    mut reached: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let timeout = Duration::from_millis(shared.op_timeout_ms.load(Ordering::Relaxed));
    let started = Instant::now();
    let mut pause = Duration::from_micros(1);
    while !reached()? {
        if started.elapsed() > timeout {
            let what = format!(
                "the work enqueued on the caller's stream before this collective did not \
                 finish within {timeout:?}"
            );
            let device = shared.accelerator.info().to_string();
            return Err(device_error(
                shared,
                bcl_backends::DeviceError::Stalled { device, what },
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_micros(100));
    }
    Ok(())
}

/// Run a job whose buffers are device memory, on the device's own stream.
fn run_on_device(shared: &Shared, job: &DeviceJob) -> Result<()> {
    let acc = &shared.accelerator;
    if let Some(event) = &job.after {
        wait_for_caller_stream(shared, || {
            acc.event_complete(event)
                .map_err(|e| device_error(shared, e))
        })?;
    }
    let bindings = Bindings {
        input: job.input.as_ref().map(Memory::Device),
        output: job.output.as_ref().map(Memory::Device),
        scratch: None,
    };
    let mut engine = shared.engine.lock();
    run(
        shared,
        &mut engine,
        job.collective,
        job.count,
        job.dtype,
        bindings,
        true,
    )?;
    // The last steps may still run on the device: done means done there.
    acc.synchronize(&acc.default_stream())
        .map_err(|e| device_error(shared, e))
}

/// Run a job staged through host memory: no device calls on this thread.
fn run_staged(shared: &Shared, job: &DeviceJob, staged: &mut dyn HostStaged) -> Result<()> {
    wait_for_caller_stream(shared, || Ok(staged.ready()))?;
    let (input, output) = staged.buffers();
    let bindings = Bindings {
        input: input.map(Memory::HostRead),
        output: output.map(Memory::HostWrite),
        scratch: None,
    };
    let mut engine = shared.engine.lock();
    run(
        shared,
        &mut engine,
        job.collective,
        job.count,
        job.dtype,
        bindings,
        false,
    )
}

fn progress_loop(shared: Arc<Shared>, jobs: Receiver<DeviceJob>) {
    while let Ok(mut job) = jobs.recv() {
        let poisoned = shared
            .poison
            .lock()
            .clone()
            .or_else(|| shared.health.verdict().map(|v| v.line));
        let mut staged = job.staged.take();
        let result = match (poisoned, staged.as_mut()) {
            (Some(first), _) => Err(Error::Poisoned(first)),
            (None, Some(staged)) => run_staged(&shared, &job, staged.as_mut()),
            (None, None) => run_on_device(&shared, &job),
        };
        // Let the caller's stream go on (also after an error: it must never wait for ever).
        if let Some(staged) = staged {
            staged.finish();
        }
        drop(job.hold);
        job.work.complete(result);
        let mut q = shared.queued.lock();
        *q -= 1;
        if *q == 0 {
            shared.drained.notify_all();
        }
    }
}

/// How long the driver polls without sleeping once nothing moves. A reply that comes within
/// this window is picked up without a wake-up from poll(2), and on this VM a sleeping core takes
/// 0.1-4 ms to wake: with a 50 µs window, a 2-rank 64 B allreduce over shm averaged 3-30 µs from
/// run to run, with 500 µs a steady 3-4 µs (`BCL_SPIN_US`).
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(500);

/// How a waiting rank polls before it sleeps.
#[derive(Clone, Copy, Debug)]
struct Polling {
    /// How long.
    window: Duration,
    /// Yield the core between polls: this host runs more ranks than it has cores, and a busy
    /// poll would steal the core from the very peer it waits for.
    yielding: bool,
}

/// The polling of a rank whose host runs `local_ranks` ranks.
fn polling(configured: Option<Duration>, local_ranks: usize) -> Polling {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Polling {
        window: configured.unwrap_or(SPIN_BEFORE_SLEEP),
        yielding: local_ranks > cores,
    }
}

/// Run one operation to completion (or error) on the calling thread.
fn run<'a>(
    shared: &Shared,
    engine: &'a mut Engine,
    collective: Collective,
    count: usize,
    dtype: DataType,
    mut bindings: Bindings<'a>,
    on_device: bool,
) -> Result<()> {
    let rank = shared.rank;
    let (seq, point_to_point) = match collective {
        Collective::Send { peer } => {
            engine.sent_to[peer] = engine.sent_to[peer].wrapping_add(1);
            (engine.sent_to[peer], true)
        }
        Collective::Recv { peer } => {
            engine.received_from[peer] = engine.received_from[peer].wrapping_add(1);
            (engine.received_from[peer], true)
        }
        _ => {
            engine.seq = engine.seq.wrapping_add(1);
            (engine.seq, false)
        }
    };
    let signature = Signature {
        seq,
        collective,
        count: count as u64,
        dtype,
    };
    let in_place = bindings.input.is_none();
    let slice_elems = (shared.config.slice_bytes / dtype.size()).max(1);
    let algorithm = shared
        .config
        .algorithm
        .unwrap_or_else(|| select(collective, count * dtype.size(), shared.fabric));
    let key = PlanKey {
        collective,
        algorithm,
        count,
        in_place,
        slice_elems,
    };
    let Engine {
        transport,
        layout,
        plans,
        host_scratch,
        device_scratch,
        exec_scratch,
        ..
    } = engine;
    let plan = match plans.iter().position(|(k, _)| *k == key) {
        Some(0) => &plans[0].1,
        Some(at) => {
            let entry = plans.remove(at);
            plans.insert(0, entry);
            &plans[0].1
        }
        None => {
            plans.truncate(PLANS_KEPT - 1);
            let plan = build_plan(collective, algorithm, layout, count, in_place, slice_elems);
            plans.insert(0, (key, plan));
            &plans[0].1
        }
    };
    let scratch_bytes = plan.scratch_elems * dtype.size();
    let device_error = |source| device_error(shared, source);
    if scratch_bytes > 0 {
        if on_device {
            if device_scratch
                .as_ref()
                .is_none_or(|b| b.len() < scratch_bytes)
            {
                *device_scratch = Some(
                    shared
                        .accelerator
                        .allocate(scratch_bytes)
                        .map_err(device_error)?,
                );
            }
            bindings.scratch = device_scratch.as_ref().map(Memory::Device);
        } else {
            if host_scratch.len() < scratch_bytes {
                host_scratch.resize(scratch_bytes, 0);
            }
            bindings.scratch = Some(Memory::HostWrite(&mut host_scratch[..scratch_bytes]));
        }
    }
    let ctx = OpContext {
        tag_base: crate::exec::tag_base(seq, point_to_point),
        dtype,
        op: collective
            .reduce_op()
            .unwrap_or(ReduceOp::Sum)
            .accumulate_op(),
        world: shared.world,
        accelerator: shared.accelerator.as_ref(),
        stream: shared.accelerator.default_stream(),
        rank,
        signature,
    };
    let health = &shared.health;
    health.op_started(signature, algorithm.name());
    let started = Instant::now();
    let timeout = Duration::from_millis(shared.op_timeout_ms.load(Ordering::Relaxed));
    let deadline = started + timeout;
    let hang_timeout = shared.config.health.hang_timeout;
    transport.limit_connections(
        shared
            .config
            .sockets_per_op
            .or_else(|| connections_per_peer(collective, count * dtype.size(), shared.fabric)),
    );
    let mut exec = Executor::reusing(plan, shared.world, std::mem::take(exec_scratch));
    let mut idle = 0u32;
    let mut idle_since = Instant::now();
    // When the current stall was handed to the health layer (once per stall).
    let mut investigated: Option<Instant> = None;
    let outcome: Result<()> = loop {
        if health.faulted() {
            break Err(fault_error(shared, health.verdict(), signature));
        }
        match exec.poll(transport.as_mut(), &mut bindings, &ctx) {
            Err(e) => break Err(exec_error(shared, e, signature)),
            // Done when every step is, and every accepted send has left this process: a
            // transport that still queues bytes (tcp's socket buffers full, rdma out of
            // credits) needs this rank's progress to deliver them, and an idle rank makes none.
            Ok(_) if exec.is_done() && transport.flushed() => break Ok(()),
            Ok(true) => idle = 0,
            Ok(false) => {
                // One clock read per idle round: on a VM it is a large part of a spin.
                let now = Instant::now();
                if idle == 0 {
                    idle_since = now;
                }
                idle += 1;
                if now >= deadline {
                    break Err(timeout_error(shared, &exec, signature, started));
                }
                let stalled = now.saturating_duration_since(exec.last_progress);
                if stalled >= hang_timeout && investigated.is_none_or(|at| at < exec.last_progress)
                {
                    investigated = Some(Instant::now());
                    let mut peers = exec.waiting_on();
                    if peers.is_empty() {
                        peers = exec.blocked_sends();
                    }
                    health.investigate_stall(peers, signature);
                }
                if now - idle_since >= shared.spin.window && idle > 4 {
                    if let Some(peer) = exec.lost_peer(transport.as_ref()) {
                        let lost = TransportError::PeerClosed {
                            peer,
                            addr: String::from_utf8_lossy(shared.peers[peer].address.as_bytes())
                                .into_owned(),
                        };
                        break Err(exec_error(shared, ExecError::Transport(lost), signature));
                    }
                    if let Err(e) = transport.wait(Duration::from_millis(2)) {
                        break Err(exec_error(shared, ExecError::Transport(e), signature));
                    }
                } else if shared.spin.yielding {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    };
    let measured = Measurements {
        link_rates: exec.link_rates.clone(),
        device_bytes: exec.device_bytes,
        device_secs: exec.device_secs,
    };
    health.op_finished(
        exec.peer_bytes().filter(|b| b.sent > 0 || b.received > 0),
        outcome.as_ref().err().map(|e| e.to_string()),
        measured,
    );
    *exec_scratch = exec.into_scratch();
    if let Err(e) = &outcome
        && e.poisons()
    {
        let mut p = shared.poison.lock();
        if p.is_none() {
            *p = Some(e.to_string());
        }
        // A verdict is logged once, by the health layer, when it is reached.
        if !matches!(e, Error::Fault { .. }) {
            tracing::error!(rank, error = %e, "collective failed; communicator poisoned");
        }
    }
    outcome
}

fn label_of(shared: &Shared, r: usize) -> PeerLabel {
    shared
        .peers
        .get(r)
        .map(RankInfo::label)
        .unwrap_or_else(|| PeerLabel(format!("rank {r}")))
}

/// The error of an operation that ran out of time: whom it waited for, and what the health
/// layer found out about them.
fn timeout_error(shared: &Shared, exec: &Executor<'_>, op: Signature, started: Instant) -> Error {
    let label = |rs: &[usize]| {
        rs.iter()
            .map(|r| label_of(shared, *r).0)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut waiting = Vec::new();
    let (receives, sends) = (exec.waiting_on(), exec.blocked_sends());
    if !receives.is_empty() {
        waiting.push(format!("data from {}", label(&receives)));
    }
    if !sends.is_empty() {
        waiting.push(format!("room to send to {}", label(&sends)));
    }
    waiting.extend(shared.health.notes());
    Error::Timeout {
        rank: shared.rank,
        local: label_of(shared, shared.rank),
        op: op.to_string(),
        waited_s: started.elapsed().as_secs_f64(),
        waiting_on: waiting.join("; "),
    }
}

/// The error of an operation failed by a verdict.
fn fault_error(shared: &Shared, verdict: Option<Verdict>, op: Signature) -> Error {
    match verdict {
        Some(v) => Error::Fault {
            rank: shared.rank,
            op: op.to_string(),
            cause: v.cause,
            verdict: v.line,
        },
        None => Error::Internal("a fault was flagged without a verdict".into()),
    }
}

/// Turn an executor error into the operation's error; faults that concern other ranks are
/// diagnosed and become a verdict every rank shares.
fn exec_error(shared: &Shared, e: ExecError, op: Signature) -> Error {
    let rank = shared.rank;
    let health = &shared.health;
    // A desync's description names both operations already.
    let verdict = |cause: Cause, ranks: Vec<usize>, what: String| {
        let during = (cause != Cause::Desync).then(|| op.to_string());
        health.report(Verdict::new(
            cause,
            ranks,
            rank,
            &shared.peers,
            &what,
            during.as_deref(),
        ))
    };
    match e {
        ExecError::Transport(t) => match t.peer() {
            Some(peer) => fault_error(shared, Some(health.link_failed(peer, &t.to_string())), op),
            None => Error::Link {
                rank,
                local: label_of(shared, rank),
                peer: PeerLabel("a peer".into()),
                op: op.to_string(),
                reason: t.to_string(),
            },
        },
        ExecError::Device(source) => {
            let error = device_error(shared, source);
            verdict(Cause::Aborted, vec![rank], error.to_string());
            error
        }
        ExecError::Desync { peer, theirs } => {
            let theirs = theirs.map_or_else(
                || "something that is not a signature".into(),
                |s| s.to_string(),
            );
            let v = verdict(
                Cause::Desync,
                vec![rank, peer],
                format!("rank {rank} called {op}, rank {peer} called {theirs}"),
            );
            fault_error(shared, Some(v), op)
        }
        ExecError::Mismatch {
            peer,
            got,
            expected,
        } => {
            verdict(
                Cause::Desync,
                vec![rank, peer],
                format!(
                    "rank {peer} sent {got} bytes where rank {rank} expected {expected} in {op}"
                ),
            );
            Error::Mismatch {
                rank,
                peer: label_of(shared, peer),
                op: op.to_string(),
                got,
                expected,
            }
        }
        ExecError::Binding(why) => Error::Internal(format!("{op}: {why}")),
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
