//! Putting a communicator together: the builder that takes providers (a device, a transport)
//! or names the built-in ones, the rendezvous paths (rank 0's TCP store, a directory, threads
//! of one process, any store), and the assembly after rendezvous.

use super::checks::check_rank;
use super::device::progress_loop;
use super::lines;
use super::op::Engine;
use super::wait::polling;
use super::{Communicator, Lineage, Shared};
use crate::bootstrap;
use crate::config::{CommConfig, Shares, TransportKind, process_env};
use crate::error::{Error, Result};
use crate::exec::WallClock;
use crate::health::Health;
use crate::launch::{Launch, Rendezvous};
use crate::links;
use crate::peers::RankInfo;
use crate::schedule::{Fabric, Layout, cost};
use crate::topology::{LinkKind, host_nics, hosts_and_ring};
use crate::unique_id::UniqueId;
use bcl_backends::host::{host_identity, hostname};
use bcl_backends::{Accelerator, open_device};
use bcl_transport::mem::MemFabric;
use bcl_transport::store::{FileStore, MemoryStore, Store, TcpStore, TcpStoreServer};
use bcl_transport::{Secret, Transport};
use parking_lot::{Condvar, Mutex};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// How a communicator is put together: its settings, and the providers it uses where the
/// caller passes them in instead of naming built-ins in the settings (as rustls takes its
/// crypto provider). With none passed, [`CommConfig::device`] and [`CommConfig::transport`]
/// choose (the spec strings `cpu`, `sim:...`, `cuda:N`, `plugin:N`; `auto`, `tcp`, `shm`,
/// `rdma`).
///
/// ```
/// use bcl_core::backends::cpu::CpuDevice;
/// use bcl_core::{CommBuilder, CommConfig, Communicator, ReduceOp};
/// use std::sync::Arc;
///
/// // Two ranks as threads of this process, each computing on a device passed in (here the
/// // cpu backend; a vendor passes its own implementation of `Accelerator`).
/// let comms = Communicator::init_threads_built(2, |rank| {
///     CommBuilder::new(CommConfig::default()).accelerator(Arc::new(CpuDevice::new(rank as u32)))
/// })?;
/// std::thread::scope(|s| {
///     for comm in &comms {
///         s.spawn(move || {
///             let mut x = [comm.rank() as f32 + 1.0; 4];
///             comm.all_reduce_in_place(&mut x, ReduceOp::Sum).expect("allreduce");
///             assert_eq!(x, [3.0; 4]);
///         });
///     }
/// });
/// # Ok::<(), bcl_core::Error>(())
/// ```
pub struct CommBuilder {
    config: CommConfig,
    accelerator: Option<Arc<dyn Accelerator>>,
    transport: Option<Box<dyn Transport>>,
}

impl std::fmt::Debug for CommBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommBuilder")
            .field("config", &self.config)
            .field("accelerator", &self.accelerator.as_ref().map(|a| a.info()))
            .field("transport", &self.transport)
            .finish()
    }
}

impl CommBuilder {
    pub fn new(config: CommConfig) -> Self {
        CommBuilder {
            config,
            accelerator: None,
            transport: None,
        }
    }

    /// Compute on `accelerator` instead of opening [`CommConfig::device`]: a device of a
    /// backend outside BCL's crates.
    pub fn accelerator(mut self, accelerator: Arc<dyn Accelerator>) -> Self {
        self.accelerator = Some(accelerator);
        self
    }

    /// Reach every peer through `transport` instead of the transport [`CommConfig::transport`]
    /// names. Every rank must pass a transport of the same kind: each publishes its
    /// [`Transport::address`] at bootstrap and connects to the others' addresses.
    pub fn transport(mut self, transport: Box<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    /// The settings the communicator will run with.
    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    pub(super) fn config_mut(&mut self) -> &mut CommConfig {
        &mut self.config
    }

    /// Join as `rank` of `world`, rendezvousing through the TCP store that rank 0 serves at
    /// `id.addr` (rank 0 starts it).
    pub fn join(self, rank: usize, world: usize, id: &UniqueId) -> Result<Communicator> {
        check_rank(rank, world)?;
        let (server, store) = self.root_store(rank, id, rank == 0, vec![0], "rank 0")?;
        let mut comm = self.join_store(rank, world, Arc::new(store), id.secret)?;
        if let Some(server) = &server {
            // The control plane's load at rank 0 (docs/scale.md): `BCL_LOG=bcl_core=debug`.
            let (requests, reply_bytes) = server.served();
            tracing::debug!(
                rank,
                world,
                requests,
                reply_bytes,
                "rank 0's store after init"
            );
        }
        comm._store_server = server;
        Ok(comm)
    }

    /// The store at `id.addr`, connected within the init timeout, and its server where this
    /// rank serves it (`serve`). `root` names the rank that serves it in errors; `missing`
    /// lists it where a timeout should name it.
    pub(super) fn root_store(
        &self,
        rank: usize,
        id: &UniqueId,
        serve: bool,
        missing: Vec<usize>,
        root: &str,
    ) -> Result<(Option<TcpStoreServer>, TcpStore)> {
        let init_timeout = self.config.init_timeout;
        let deadline = Instant::now() + init_timeout;
        let server = if serve {
            Some(
                TcpStoreServer::start(id.addr, id.secret).map_err(|e| Error::Bootstrap {
                    rank,
                    reason: format!("{root} cannot serve the store at {}: {e}", id.addr),
                })?,
            )
        } else {
            None
        };
        let store = TcpStore::connect(id.addr, &id.secret, deadline).map_err(|e| {
            Error::BootstrapTimeout {
                rank,
                missing,
                waited_s: init_timeout.as_secs_f64(),
                detail: format!("the store {root} serves at {}: {e}", id.addr),
            }
        })?;
        Ok((server, store))
    }

    /// Join as `launch` says: through rank 0's store, or through a directory.
    pub fn join_launched(self, launch: &Launch) -> Result<Communicator> {
        let (rank, world) = (launch.rank, launch.world);
        check_rank(rank, world)?;
        let dir = match &launch.rendezvous {
            Rendezvous::Root(id) => return self.join(rank, world, id),
            Rendezvous::Directory(dir) => dir,
        };
        let (store, secret) = directory_store(rank, dir, &self.config)?;
        let mut comm = self.join_store(rank, world, Arc::new(store), secret)?;
        if rank == 0 {
            comm.rendezvous_dir = Some(dir.clone());
        }
        Ok(comm)
    }

    /// Join through any rendezvous store. `secret` authenticates every connection.
    pub fn join_store(
        self,
        rank: usize,
        world: usize,
        store: Arc<dyn Store>,
        secret: Secret,
    ) -> Result<Communicator> {
        check_rank(rank, world)?;
        self.config.validate()?;
        assemble(rank, world, store.as_ref(), secret, self)
    }
}

impl Communicator {
    /// Join a communicator as `rank` of `world`, rendezvousing through the TCP store that
    /// rank 0 serves at `id.addr` (rank 0 starts it).
    pub fn init(rank: usize, world: usize, id: &UniqueId, config: CommConfig) -> Result<Self> {
        CommBuilder::new(config).join(rank, world, id)
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
        CommBuilder::new(config).join_launched(launch)
    }

    /// Join through any rendezvous store. `secret` authenticates every connection.
    pub fn init_with_store(
        rank: usize,
        world: usize,
        store: Arc<dyn Store>,
        secret: Secret,
        config: CommConfig,
    ) -> Result<Self> {
        CommBuilder::new(config).join_store(rank, world, store, secret)
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
        Self::init_threads_built(world, |rank| CommBuilder::new(config_of(rank)))
    }

    /// As [`Communicator::init_threads`], with a builder per rank (providers passed in).
    /// Ranks whose builder has no transport and whose config says `auto` are joined by the
    /// in-process transport.
    pub fn init_threads_built(
        world: usize,
        builder_of: impl Fn(usize) -> CommBuilder,
    ) -> Result<Vec<Self>> {
        check_rank(0, world)?;
        let store = Arc::new(MemoryStore::new());
        let secret = Secret::random().map_err(|e| Error::Unavailable(e.to_string()))?;
        let fabric = MemFabric::new(world);
        let builders: Vec<CommBuilder> = (0..world)
            .map(|rank| {
                let mut b = builder_of(rank);
                if b.transport.is_none() && matches!(b.config.transport, TransportKind::Auto) {
                    b.config.transport = TransportKind::Mem(fabric.clone());
                }
                b
            })
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = builders
                .into_iter()
                .enumerate()
                .map(|(rank, b)| {
                    let store: Arc<dyn Store> = store.clone();
                    s.spawn(move || b.join_store(rank, world, store, secret))
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
}

/// Make sure the rendezvous directory is this user's alone before the secret goes into it:
/// its default name under the temporary directory is predictable, so another user could
/// have made it first (or a link to elsewhere). A directory of ours with wider modes is
/// narrowed to 0700; one that is not ours, or not a directory, is refused.
fn private_directory(dir: &Path) -> std::result::Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err("it is not a directory (a symbolic link or a file)".into());
    }
    // The owner of /proc/self is this process's effective user.
    let me = std::fs::metadata("/proc/self")
        .map_err(|e| format!("cannot tell this process's user from /proc/self: {e}"))?
        .uid();
    if meta.uid() != me {
        return Err(format!(
            "it belongs to user {}, not to this process's user {me}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make it private (mode 0700): {e}"))?;
    }
    Ok(())
}

/// The file store in rendezvous directory `dir` (made private to this user), and the secret
/// rank 0 writes into it.
fn directory_store(rank: usize, dir: &Path, config: &CommConfig) -> Result<(FileStore, Secret)> {
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
    private_directory(dir).map_err(|why| failed("refused", &why))?;
    let store = FileStore::new(dir).map_err(|e| failed("unusable", &e))?;
    let deadline = Instant::now() + config.init_timeout;
    let key = format!("{}/secret", config.store_prefix);
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
    Ok((store, secret))
}

/// What a rank opens before it meets the others: its device, its transport endpoint (whose
/// address it publishes) and its health channel.
pub(super) struct Opened {
    accelerator: Arc<dyn Accelerator>,
    endpoint: links::Endpoint,
    health: Health,
    /// The interface of the address this rank listens on.
    nic: Option<String>,
}

pub(super) fn open(
    rank: usize,
    secret: Secret,
    builder: CommBuilder,
) -> Result<(CommConfig, Opened)> {
    let CommBuilder {
        config,
        accelerator,
        transport,
    } = builder;
    let accelerator = match accelerator {
        Some(a) => a,
        None => open_device(
            &config.device,
            config.device_index,
            &config.device_options(),
        )
        .map_err(|source| Error::Device {
            rank,
            device: config.device.to_string(),
            source,
        })?,
    };
    let endpoint = links::open(rank, &config, secret, transport)?;
    let health =
        Health::start(rank, secret, config.bind_ip, config.health.clone()).map_err(|e| {
            Error::Bootstrap {
                rank,
                reason: format!("cannot start the health channel on {}: {e}", config.bind_ip),
            }
        })?;
    let opened = Opened {
        accelerator,
        endpoint,
        health,
        nic: crate::nic::interface_of(config.bind_ip),
    };
    Ok((config, opened))
}

/// Open the providers, rendezvous, connect, and start the progress thread.
fn assemble(
    rank: usize,
    world: usize,
    store: &dyn Store,
    secret: Secret,
    builder: CommBuilder,
) -> Result<Communicator> {
    let started = Instant::now();
    let (config, opened) = open(rank, secret, builder)?;
    let deadline = started + config.init_timeout;
    let me = opened.record(rank);
    // The table goes down the gathering tree through the health ports (none when off).
    let relay = opened
        .health
        .address()
        .map(|_| &opened.health as &dyn bootstrap::TableRelay);
    let peers = bootstrap::exchange(
        store,
        relay,
        &config.store_prefix,
        &me,
        world,
        started,
        deadline,
    )?;
    finish(config, opened, secret, peers, started, deadline)
}

impl Opened {
    /// What this rank publishes about itself as `rank`.
    pub(super) fn record(&self, rank: usize) -> RankInfo {
        RankInfo {
            rank,
            hostname: hostname(),
            host_id: host_identity(),
            pid: std::process::id(),
            device: self.accelerator.info().clone(),
            address: self.endpoint.address().clone(),
            health: self.health.address().map(|a| a.to_string()),
            nic: self.nic.clone(),
        }
    }
}

/// With [`Shares::BySpeed`] and some device that reports its reduce throughput, each rank's
/// weight in the hierarchical allreduce: that throughput in MB/s (a device that reports none
/// counts as the host cpu, at the cost model's γ).
fn share_weights(config: &CommConfig, peers: &[RankInfo]) -> Option<Vec<u32>> {
    let speeds: Vec<Option<f64>> = peers
        .iter()
        .map(|p| {
            p.device
                .capabilities
                .reduce_gbps
                .filter(|g| g.is_finite() && *g > 0.0)
        })
        .collect();
    if config.shares != Shares::BySpeed || speeds.iter().all(Option::is_none) {
        return None;
    }
    let cpu = 1.0 / cost::measured::SHM_2.gamma / 1e9;
    let mbps = |g: f64| (g * 1000.0).round().clamp(1.0, f64::from(u32::MAX)) as u32;
    Some(speeds.iter().map(|s| mbps(s.unwrap_or(cpu))).collect())
}

/// The fewest distinct network interfaces among the ranks of a host (unknown ones count as
/// one shared interface).
fn nics_per_host(hosts: &[Vec<usize>], peers: &[RankInfo]) -> usize {
    let nics = |host: &Vec<usize>| host_nics(host, peers).len();
    hosts.iter().map(nics).min().unwrap_or(1).max(1)
}

/// After rendezvous (through a store, or over a parent communicator): connect to `peers`
/// (every rank's record, in rank order, this rank's among them), watch them, and start the
/// progress thread.
pub(super) fn finish(
    config: CommConfig,
    opened: Opened,
    secret: Secret,
    peers: Vec<RankInfo>,
    started: Instant,
    deadline: Instant,
) -> Result<Communicator> {
    let Opened {
        accelerator,
        endpoint,
        health,
        ..
    } = opened;
    let rank = health.rank();
    let world = peers.len();
    let me = peers
        .get(rank)
        .cloned()
        .ok_or_else(|| Error::Internal(format!("rank {rank} is not among {world} records")))?;
    let custom_transport = matches!(endpoint, links::Endpoint::Single(_, LinkKind::Custom(_)));
    let (mut transport, links) = endpoint.connect(&config, &me, &peers, started, deadline)?;
    let (hosts, ring) = hosts_and_ring(&peers, config.topology.as_ref())?;
    let layout = Layout::new(rank, ring)
        .and_then(|l| l.with_hosts(hosts))
        .and_then(|l| match share_weights(&config, &peers) {
            Some(weights) => l.with_weights(weights),
            None => Ok(l),
        })
        .map_err(Error::Internal)?;
    health
        .watch(peers.clone(), layout.ring().to_vec(), deadline)
        .map_err(|reason| Error::Bootstrap { rank, reason })?;
    let local_ranks = peers.iter().filter(|p| p.host_id == me.host_id).count();
    tracing::debug!(rank, world, ring = ?layout.ring(), device = %me.device, "communicator ready");
    let op_timeout_ms = u64::try_from(config.op_timeout.as_millis()).unwrap_or(u64::MAX);
    let shared = Arc::new(Shared {
        rank,
        world,
        accelerator,
        fabric: Fabric {
            world,
            all_shared_memory: links::all_shared_memory(&peers),
            one_host: local_ranks == world,
            hosts: layout.hosts().len(),
            largest_host: layout.largest_host(),
            shm_inside_hosts: links::shm_inside_hosts(&peers, &config.transport),
            mixed_speeds: (0..world).any(|r| layout.weight(r) != layout.weight(0)),
            nics_per_host: nics_per_host(layout.hosts(), &peers),
            // The host's ptrace rules, not the per-link probes: every rank must agree. No
            // message is longer than a slice, so a lending size above it lends nothing.
            single_copy_from: (config.single_copy_bytes > 0
                && config.single_copy_bytes <= config.slice_bytes
                && bcl_transport::shm::sibling_reads_permitted())
            .then_some(config.single_copy_bytes),
            inside_link: config.link_inside,
            between_link: config.link_between,
        },
        polling: polling(config.spin, local_ranks),
        lines_bytes: lines::capacity(transport.as_mut(), &peers, config.lines_bytes),
        config,
        peers,
        links,
        layout,
        engine: Mutex::new(Engine::new(transport, world)),
        queued: Mutex::new(0),
        drained: Condvar::new(),
        poison: Mutex::new(None),
        health,
        op_timeout_ms: AtomicU64::new(op_timeout_ms),
        clock: WallClock,
        lineage: Lineage {
            secret,
            custom_transport,
            children: AtomicU64::new(0),
            groups: Default::default(),
        },
    });
    start_progress(shared)
}

/// The progress thread that runs the communicator's queued device jobs.
fn start_progress(shared: Arc<Shared>) -> Result<Communicator> {
    let (tx, rx) = crossbeam::channel::unbounded();
    let worker = shared.clone();
    let progress = std::thread::Builder::new()
        .name(format!("bcl-progress-{}", shared.rank))
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
