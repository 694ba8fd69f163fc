//! Collective schedules, sans-IO: pure functions from (collective, rank, world, ring order,
//! count, slicing) to the [`Plan`] of steps one rank takes. No clock, socket, thread or
//! device in here (a test keeps it that way); the [`checker`] runs every rank's plan on an
//! abstract network and proves matching, deadlock freedom and final contents.

pub mod barrier;
pub mod chain;
pub mod checker;
pub mod cost;
pub mod direct;
mod doubling;
mod halving;
mod hierarchical;
pub mod plan;
pub mod ring;
pub mod tree;

pub use plan::{Action, BufferId, Plan, PlanBuilder, Region, Step};

use bcl_backends::ReduceOp;
use plan::BufferId::{Input, Output, Scratch};
use ring::{Chunks, allgather_steps, part, phase_tags, reduce_scatter_steps};
use std::fmt;

/// A collective operation and its parameters (counts as NCCL defines them, see
/// [`Collective::buffer_elems`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Collective {
    AllReduce {
        op: ReduceOp,
    },
    AllGather,
    ReduceScatter {
        op: ReduceOp,
    },
    Broadcast {
        root: usize,
    },
    Reduce {
        op: ReduceOp,
        root: usize,
    },
    AllToAll,
    Send {
        peer: usize,
    },
    Recv {
        peer: usize,
    },
    Barrier,
    /// `root` receives every rank's `count` elements, in rank order (ncclGather, MPI_Gather).
    Gather {
        root: usize,
    },
    /// Block j of `root`'s buffer goes to rank j (ncclScatter, MPI_Scatter).
    Scatter {
        root: usize,
    },
    /// All-to-all with a count per pair (MPI_Alltoallv, torch's uneven `all_to_all_single`):
    /// the counts travel beside the collective ([`AllToAllCounts`], [`build_plan_v`]). Planned
    /// without them (`count` per peer), it is the all-to-all.
    AllToAllV,
    /// All-gather with a count per rank (MPI_Allgatherv, torch's uneven `all_gather`): rank r
    /// contributes `recv[r]` elements of the counts beside it, every rank gets them packed.
    AllGatherV,
    /// Reduce-scatter with a count per rank (MPI_Reduce_scatter, torch's uneven
    /// `reduce_scatter`): block r of the packed input, `send[r]` elements, is reduced to rank r.
    ReduceScatterV {
        op: ReduceOp,
    },
}

/// The counts of one rank's [`Collective::AllToAllV`]: elements it sends to each rank and
/// receives from each rank, its blocks packed in rank order in the send and receive buffers.
/// `send[j]` here must equal `recv[me]` on rank j (a difference is a size mismatch there).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AllToAllCounts {
    pub send: Vec<usize>,
    pub recv: Vec<usize>,
}

impl AllToAllCounts {
    /// Where each block starts in a packed buffer.
    pub fn offsets(counts: &[usize]) -> Vec<usize> {
        counts
            .iter()
            .scan(0usize, |at, &c| {
                let here = *at;
                *at = at.saturating_add(c);
                Some(here)
            })
            .collect()
    }
}

/// The plan of one rank's collective with per-rank counts: [`Collective::AllGatherV`] (its
/// blocks `counts.recv`), [`Collective::ReduceScatterV`] (its blocks `counts.send`), and
/// every other collective as [`Collective::AllToAllV`] with `counts`.
pub fn build_plan_v(
    collective: Collective,
    layout: &Layout,
    counts: &AllToAllCounts,
    slice_elems: usize,
) -> Plan {
    let mut b = PlanBuilder::new();
    let slice = slice_elems.max(1);
    match collective {
        Collective::AllGatherV => direct::all_gather_v(&mut b, layout, &counts.recv, slice),
        Collective::ReduceScatterV { op } => {
            direct::reduce_scatter_v(&mut b, layout, &counts.send, reduction(op), slice)
        }
        _ => direct::all_to_all_v(&mut b, layout, counts, slice),
    }
    b.finish()
}

impl Collective {
    pub fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce { .. } => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter { .. } => "reducescatter",
            Collective::Broadcast { .. } => "broadcast",
            Collective::Reduce { .. } => "reduce",
            Collective::AllToAll => "alltoall",
            Collective::Send { .. } => "send",
            Collective::Recv { .. } => "recv",
            Collective::Barrier => "barrier",
            Collective::Gather { .. } => "gather",
            Collective::Scatter { .. } => "scatter",
            Collective::AllToAllV => "alltoallv",
            Collective::AllGatherV => "allgatherv",
            Collective::ReduceScatterV { .. } => "reducescatterv",
        }
    }

    /// Send and receive involve two ranks and count in their own sequence.
    pub fn is_point_to_point(&self) -> bool {
        matches!(self, Collective::Send { .. } | Collective::Recv { .. })
    }

    /// The reduce operation, for collectives that reduce.
    pub fn reduce_op(&self) -> Option<ReduceOp> {
        match self {
            Collective::AllReduce { op }
            | Collective::ReduceScatter { op }
            | Collective::ReduceScatterV { op }
            | Collective::Reduce { op, .. } => Some(*op),
            _ => None,
        }
    }

    /// The root or peer rank, where the collective has one.
    pub fn root(&self) -> Option<usize> {
        match self {
            Collective::Broadcast { root }
            | Collective::Reduce { root, .. }
            | Collective::Gather { root }
            | Collective::Scatter { root } => Some(*root),
            Collective::Send { peer } | Collective::Recv { peer } => Some(*peer),
            _ => None,
        }
    }

    /// Elements of the (input, output) buffers `rank` must pass, for `count` as NCCL counts:
    /// allgather's count is per rank sent, reduce-scatter's per rank received, all-to-all's
    /// per peer, gather's and scatter's per rank. `None`: that buffer is not used on this rank.
    pub fn buffer_elems(
        &self,
        count: usize,
        world: usize,
        rank: usize,
    ) -> (Option<usize>, Option<usize>) {
        let all = count.saturating_mul(world);
        match self {
            Collective::AllReduce { .. } | Collective::Broadcast { .. } => {
                (Some(count), Some(count))
            }
            Collective::AllGather => (Some(count), Some(all)),
            Collective::ReduceScatter { .. } => (Some(all), Some(count)),
            Collective::Reduce { root, .. } => {
                (Some(count), if rank == *root { Some(count) } else { None })
            }
            Collective::AllToAll | Collective::AllToAllV => (Some(all), Some(all)),
            Collective::AllGatherV => (Some(count), Some(all)),
            Collective::ReduceScatterV { .. } => (Some(all), Some(count)),
            Collective::Send { .. } => (Some(count), None),
            Collective::Recv { .. } => (None, Some(count)),
            Collective::Barrier => (None, None),
            Collective::Gather { root } => {
                (Some(count), if rank == *root { Some(all) } else { None })
            }
            Collective::Scatter { root } => {
                (if rank == *root { Some(all) } else { None }, Some(count))
            }
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        if let Some(op) = self.reduce_op() {
            write!(f, "({op})")?;
        }
        if let Some(root) = self.root() {
            write!(f, "[root/peer {root}]")?;
        }
        Ok(())
    }
}

/// How a collective is carried out. Every rank of a call must use the same one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Ring (reduce-scatter + allgather for allreduce), pipelined chains for rooted
    /// collectives: bandwidth-optimal.
    #[default]
    Ring,
    /// Recursive doubling for allreduce: log2(n) exchanges of the whole buffer,
    /// latency-optimal for small messages. Other collectives use their ring/chain plans.
    RecursiveDoubling,
    /// Halving-doubling (Rabenseifner) for allreduce: reduce-scatter by recursive halving,
    /// allgather by recursive doubling; the ring's bandwidth in 2·log2(n) steps.
    HalvingDoubling,
    /// Double binary tree for allreduce ([`tree`]): pipelined reduce up and broadcast down
    /// two trees, each with half the buffer; 2·log2(n) steps and about the ring's bandwidth.
    Tree,
    /// Hierarchical (`schedule/hierarchical.rs`): inside each host over its local links, between hosts
    /// one rank per host and share (a "rail"), the hosts joined by a ring. For allreduce,
    /// broadcast, reduce, reduce-scatter and allgather (the last two exchange directly
    /// between hosts whichever `Hier*` is asked); other collectives use their flat plans.
    HierRing,
    /// Hierarchical, the hosts joined by recursive doubling (latency across many hosts).
    HierDoubling,
    /// Hierarchical, the hosts joined by halving-doubling.
    HierHalving,
    /// Hierarchical, the hosts joined by the double binary tree (mid sizes on many hosts).
    HierTree,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "rd",
            Algorithm::HalvingDoubling => "hd",
            Algorithm::Tree => "tree",
            Algorithm::HierRing => "hier-ring",
            Algorithm::HierDoubling => "hier-rd",
            Algorithm::HierHalving => "hier-hd",
            Algorithm::HierTree => "hier-tree",
        }
    }

    /// For a hierarchical algorithm, the flat algorithm that joins the hosts.
    pub fn between_hosts(self) -> Option<Algorithm> {
        match self {
            Algorithm::HierRing => Some(Algorithm::Ring),
            Algorithm::HierDoubling => Some(Algorithm::RecursiveDoubling),
            Algorithm::HierHalving => Some(Algorithm::HalvingDoubling),
            Algorithm::HierTree => Some(Algorithm::Tree),
            _ => None,
        }
    }

    /// What actually runs when `self` is asked for `collective`: the doubling algorithms
    /// exist for allreduce and the hierarchical ones for allreduce, broadcast and reduce;
    /// every other collective runs its ring (or direct) plan.
    pub fn for_collective(self, collective: Collective) -> Algorithm {
        match (collective, self.between_hosts()) {
            (Collective::AllReduce { .. }, _) => self,
            (
                Collective::Broadcast { .. }
                | Collective::Reduce { .. }
                | Collective::ReduceScatter { .. }
                | Collective::AllGather,
                Some(_),
            ) => Algorithm::HierRing,
            _ => Algorithm::Ring,
        }
    }

    /// Every algorithm, flat ones first.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::HalvingDoubling,
        Algorithm::Tree,
        Algorithm::HierRing,
        Algorithm::HierDoubling,
        Algorithm::HierHalving,
        Algorithm::HierTree,
    ];
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ring" => Ok(Algorithm::Ring),
            "rd" | "recursive-doubling" => Ok(Algorithm::RecursiveDoubling),
            "hd" | "halving-doubling" | "rabenseifner" => Ok(Algorithm::HalvingDoubling),
            "tree" | "double-binary-tree" => Ok(Algorithm::Tree),
            "hier" | "hier-ring" => Ok(Algorithm::HierRing),
            "hier-rd" => Ok(Algorithm::HierDoubling),
            "hier-hd" => Ok(Algorithm::HierHalving),
            "hier-tree" => Ok(Algorithm::HierTree),
            other => Err(format!(
                "unknown algorithm '{other}' (ring, rd, hd, tree, hier-ring, hier-rd, hier-hd, hier-tree)"
            )),
        }
    }
}

/// What the algorithm choice depends on besides the call: the same on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fabric {
    pub world: usize,
    /// Every rank is on one host and every link is shared memory.
    pub all_shared_memory: bool,
    /// Every rank is on one host (over TCP: every link is loopback).
    pub one_host: bool,
    /// How many hosts, and the most ranks on one of them ([`Layout::hosts`]).
    pub hosts: usize,
    pub largest_host: usize,
    /// Every link between two ranks of one host is shared memory.
    pub shm_inside_hosts: bool,
    /// The ranks' devices reduce at different speeds ([`Layout::with_weights`]).
    pub mixed_speeds: bool,
    /// The network interfaces between hosts of the host with the fewest (`nic::interface_of`
    /// of its ranks' addresses; 1 where unknown): the rails of a host share them.
    pub nics_per_host: usize,
    /// The message size from which ranks of one host lend their sends for the receiver to
    /// copy out of the sender's memory (`CommConfig::single_copy_bytes`); `None`: never (off,
    /// or the host's ptrace rules refuse it: `bcl_transport::shm::sibling_reads_permitted`).
    pub single_copy_from: Option<usize>,
    /// A deployment's own constants for the links inside a host and between hosts
    /// (`CommConfig::link_inside`, `link_between`); `None`: the built-in ones.
    pub inside_link: Option<cost::MeasuredLink>,
    pub between_link: Option<cost::MeasuredLink>,
}

impl Fabric {
    /// A fabric without a host structure to exploit: every rank on one host, or (with
    /// `one_host` false) each on its own.
    pub fn flat(world: usize, all_shared_memory: bool, one_host: bool) -> Fabric {
        Fabric {
            world,
            all_shared_memory,
            one_host,
            hosts: if one_host { 1 } else { world },
            largest_host: if one_host { world } else { 1 },
            shm_inside_hosts: all_shared_memory,
            mixed_speeds: false,
            nics_per_host: 1,
            single_copy_from: None,
            inside_link: None,
            between_link: None,
        }
    }
}

/// The algorithm for `collective` over `bytes` (the whole buffer): for allreduce the cheapest
/// of ring, recursive doubling and (where a link is not shared memory) halving-doubling by
/// the measured cost model ([`cost`]), the ring otherwise.
/// Pure, so that every rank picks the same.
///
/// With ranks on several hosts and more than one on some host, the hierarchical algorithms
/// compete too ([`cost::cheapest_on`]), and reduce-scatter and allgather run hierarchically
/// where some link is not shared memory (measured 1.38-1.63x the flat ring on 2 hosts × 4
/// ranks with 2 Gbit/s NICs, `docs/hierarchical.md`). Broadcast and reduce keep the flat
/// chain under auto: it follows the ring, which keeps hosts together, so it crosses each
/// host boundary once with the data as the hierarchical chain does (that one only when
/// forced).
///
/// On one host whose devices reduce at different speeds, an allreduce from
/// [`cost::MIXED_SPEEDS_DIRECT_FROM`] runs hierarchically (inside the host: each rank reduces
/// a share in proportion to its speed, where the ring makes every step wait for the slowest).
/// So does an allreduce from [`cost::ONE_HOST_DIRECT_FROM`] among 3 or more ranks of one host
/// over shared memory whose slices are lent (single copy): every slice goes to its owner and
/// back at once, where the ring passes it on through p−1 steps, each waiting for the last
/// (the same bytes pulled per rank; fewer waits).
pub fn select(collective: Collective, bytes: usize, fabric: Fabric) -> Algorithm {
    let hierarchy = fabric.hosts > 1 && fabric.largest_host > 1 && !fabric.all_shared_memory;
    match collective {
        Collective::AllReduce { .. }
            if fabric.hosts == 1
                && fabric.mixed_speeds
                && fabric.world > 1
                && bytes >= cost::MIXED_SPEEDS_DIRECT_FROM =>
        {
            Algorithm::HierRing
        }
        Collective::AllReduce { .. }
            if fabric.hosts == 1
                && fabric.all_shared_memory
                && fabric.world >= 3
                && bytes >= cost::ONE_HOST_DIRECT_FROM
                && fabric
                    .single_copy_from
                    .is_some_and(|from| bytes / fabric.world >= from) =>
        {
            Algorithm::HierRing
        }
        Collective::AllReduce { .. } if fabric.world > 1 => cost::cheapest_on(bytes, fabric),
        Collective::ReduceScatter { .. } | Collective::AllGather if hierarchy => {
            Algorithm::HierRing
        }
        _ => Algorithm::Ring,
    }
}

/// Over how many of its connections to each peer a transport spreads the messages of
/// `collective` over `bytes` (`None`: all it has): one for a small operation
/// ([`cost::ONE_CONNECTION_UP_TO`]) and for a large allreduce between the two ranks of one
/// host over TCP ([`cost::ONE_CONNECTION_FROM`]), all of them otherwise.
/// Pure, like [`select`]; only the sender acts on it, so ranks need not agree.
pub fn connections_per_peer(collective: Collective, bytes: usize, fabric: Fabric) -> Option<usize> {
    let loopback_pair = fabric.world == 2 && fabric.one_host && !fabric.all_shared_memory;
    if bytes <= cost::ONE_CONNECTION_UP_TO {
        return Some(1);
    }
    match collective {
        Collective::AllReduce { .. } if loopback_pair && bytes >= cost::ONE_CONNECTION_FROM => {
            Some(1)
        }
        _ => None,
    }
}

/// The smallest message a rank lends in an operation (`Action::Send::lend`; the receiver
/// copies it out of the sender's memory): `configured`, except in an allreduce that auto
/// ran on the ring (not `forced`) over less than [`cost::RING_LENDS_FROM`], whose messages
/// go through the shared-memory rings: there the data stay in the caches, where copying
/// them through a ring costs less than a `process_vm_readv` and its give-back. Only the
/// sender acts on it, so ranks need not agree.
pub fn lend_from(
    collective: Collective,
    algorithm: Algorithm,
    bytes: usize,
    forced: bool,
    configured: usize,
) -> usize {
    let cached_ring = !forced
        && algorithm == Algorithm::Ring
        && matches!(collective, Collective::AllReduce { .. })
        && bytes < cost::RING_LENDS_FROM;
    if cached_ring { 0 } else { configured }
}

/// The place of one rank among the others: its rank, the ring order and the hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    rank: usize,
    /// Ring position → rank.
    ring: Vec<usize>,
    /// Rank → ring position.
    position: Vec<usize>,
    /// The ranks of each host, hosts in ring order (one host of every rank unless told).
    hosts: Vec<Vec<usize>>,
    /// Rank → index in `hosts`.
    host_of: Vec<usize>,
    /// The rank counts of the hosts, each once, ascending: the hierarchical plans size their
    /// parts from these without reading every host (a 100k-rank simulation builds a plan per
    /// rank).
    host_sizes: Vec<usize>,
    /// Rank → relative reduce speed ([`Layout::with_weights`]); empty: all alike.
    weights: Vec<u32>,
}

impl Layout {
    /// `ring` must be a permutation of `0..ring.len()` containing `rank`.
    pub fn new(rank: usize, ring: Vec<usize>) -> Result<Self, String> {
        let n = ring.len();
        let mut position = vec![usize::MAX; n];
        for (p, &r) in ring.iter().enumerate() {
            if r >= n || position[r] != usize::MAX {
                return Err(format!(
                    "ring order {ring:?} is not a permutation of 0..{n}"
                ));
            }
            position[r] = p;
        }
        if rank >= n {
            return Err(format!("rank {rank} is outside a world of {n}"));
        }
        Ok(Layout {
            rank,
            hosts: vec![ring.clone()],
            host_of: vec![0; n],
            host_sizes: vec![n],
            ring,
            position,
            weights: Vec::new(),
        })
    }

    /// The same layout seen from `rank` (a simulator builds every rank's plan from one
    /// layout instead of one per rank).
    pub fn set_rank(&mut self, rank: usize) -> Result<(), String> {
        if rank >= self.world() {
            return Err(format!(
                "rank {rank} is outside a world of {}",
                self.world()
            ));
        }
        self.rank = rank;
        Ok(())
    }

    /// The identity ring 0, 1, ..., world-1.
    pub fn linear(rank: usize, world: usize) -> Self {
        Layout {
            rank,
            ring: (0..world).collect(),
            position: (0..world).collect(),
            hosts: vec![(0..world).collect()],
            host_of: vec![0; world],
            host_sizes: vec![world],
            weights: Vec::new(),
        }
    }

    /// This layout with a relative speed per rank (its device's reduce throughput, in any one
    /// unit, each at least 1): the hierarchical allreduce sizes each rank's share of the
    /// buffer by it ([`Layout::weight`]). Every rank must be given the same.
    pub fn with_weights(mut self, weights: Vec<u32>) -> Result<Self, String> {
        if weights.len() != self.world() {
            return Err(format!(
                "{} rank weights for a world of {}",
                weights.len(),
                self.world()
            ));
        }
        if let Some(r) = weights.iter().position(|&w| w == 0) {
            return Err(format!("rank {r} has weight 0 (each must be at least 1)"));
        }
        self.weights = weights;
        Ok(self)
    }

    /// The relative speed of `rank` (1 for every rank unless [`Layout::with_weights`] set one).
    pub fn weight(&self, rank: usize) -> u32 {
        self.weights.get(rank).copied().unwrap_or(1)
    }

    /// Whether [`Layout::with_weights`] gave the ranks speeds (otherwise all weigh 1).
    pub fn weighted(&self) -> bool {
        !self.weights.is_empty()
    }

    /// This layout with its ranks grouped into `hosts` (each rank in exactly one, no host
    /// empty), which the hierarchical algorithms follow. The ring is not changed.
    pub fn with_hosts(mut self, hosts: Vec<Vec<usize>>) -> Result<Self, String> {
        let n = self.world();
        let mut host_of = vec![usize::MAX; n];
        for (h, ranks) in hosts.iter().enumerate() {
            if ranks.is_empty() {
                return Err(format!("host {h} of the topology {hosts:?} has no rank"));
            }
            for &r in ranks {
                if r >= n || host_of[r] != usize::MAX {
                    return Err(format!(
                        "the topology {hosts:?} does not place each rank of 0..{n} on exactly one host"
                    ));
                }
                host_of[r] = h;
            }
        }
        if let Some(r) = host_of.iter().position(|&h| h == usize::MAX) {
            return Err(format!("the topology {hosts:?} places rank {r} on no host"));
        }
        let mut sizes: Vec<usize> = hosts.iter().map(Vec::len).collect();
        sizes.sort_unstable();
        sizes.dedup();
        self.host_sizes = sizes;
        self.hosts = hosts;
        self.host_of = host_of;
        Ok(self)
    }

    /// The ranks of each host.
    pub fn hosts(&self) -> &[Vec<usize>] {
        &self.hosts
    }
    /// The rank counts of the hosts, each once, ascending.
    pub fn host_sizes(&self) -> &[usize] {
        &self.host_sizes
    }
    /// The rank count of the largest host.
    pub fn largest_host(&self) -> usize {
        self.host_sizes.last().copied().unwrap_or(1)
    }
    /// The index in [`Layout::hosts`] of the host of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of[rank]
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world(&self) -> usize {
        self.ring.len()
    }
    pub fn ring(&self) -> &[usize] {
        &self.ring
    }
    pub fn position(&self) -> usize {
        self.position[self.rank]
    }
    pub fn position_of(&self, rank: usize) -> usize {
        self.position[rank]
    }
    pub fn at(&self, position: usize) -> usize {
        self.ring[position % self.world()]
    }
    pub fn next(&self) -> usize {
        self.at(self.position() + 1)
    }
    pub fn prev(&self) -> usize {
        self.at(self.position() + self.world() - 1)
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Reduction {
    pub average: bool,
}

fn reduction(op: ReduceOp) -> Reduction {
    Reduction {
        average: op == ReduceOp::Avg,
    }
}

/// Copy `from` to `to` slice by slice, so later steps on the first slices need not wait for
/// the whole copy.
fn copy_sliced(b: &mut PlanBuilder, from: Region, to: BufferId, to_offset: usize, slice: usize) {
    let slices = from.len.div_ceil(slice.max(1));
    for s in 0..slices {
        let (o, l) = part(from.len, slices, s);
        b.push(Action::Copy {
            from: Region::new(from.buffer, from.offset + o, l),
            to: Region::new(to, to_offset + o, l),
        });
    }
}

/// The plan of `layout.rank()` for `collective` over `count` elements. `slice_elems` bounds
/// the elements of one message. In-place plans use only `Output` (and `Scratch`).
pub fn build_plan(
    collective: Collective,
    algorithm: Algorithm,
    layout: &Layout,
    count: usize,
    in_place: bool,
    slice_elems: usize,
) -> Plan {
    let slice = slice_elems.max(1);
    let (n, rank) = (layout.world(), layout.rank());
    let mut b = PlanBuilder::new();
    let rails = matches!(collective, Collective::AllReduce { .. })
        .then(|| algorithm.between_hosts())
        .flatten();
    if let Some(between) = algorithm.between_hosts()
        && hierarchical::plannable(layout, count, slice, rails)
    {
        match collective {
            Collective::AllReduce { op } => {
                hierarchical::allreduce(
                    &mut b,
                    layout,
                    count,
                    in_place,
                    reduction(op),
                    between,
                    slice,
                );
                return b.finish();
            }
            Collective::Broadcast { root } => {
                hierarchical::broadcast(&mut b, layout, root, count, in_place, slice);
                return b.finish();
            }
            Collective::Reduce { op, root } => {
                hierarchical::reduce(&mut b, layout, root, count, in_place, reduction(op), slice);
                return b.finish();
            }
            Collective::ReduceScatter { op }
                if hierarchical::blocks_plannable(layout, count, slice) =>
            {
                hierarchical::reduce_scatter(&mut b, layout, count, in_place, reduction(op), slice);
                return b.finish();
            }
            Collective::AllGather if hierarchical::blocks_plannable(layout, count, slice) => {
                hierarchical::all_gather(&mut b, layout, count, in_place, slice);
                return b.finish();
            }
            _ => {}
        }
    }
    let algorithm = match algorithm.between_hosts() {
        Some(_) => Algorithm::Ring,
        None => algorithm,
    };
    match collective {
        Collective::AllReduce { op } if algorithm == Algorithm::RecursiveDoubling => {
            doubling::allreduce(&mut b, layout, count, in_place, reduction(op));
        }
        Collective::AllReduce { op } if algorithm == Algorithm::HalvingDoubling => {
            halving::allreduce(&mut b, layout, count, in_place, reduction(op), slice);
        }
        Collective::AllReduce { op } if algorithm == Algorithm::Tree => {
            tree::allreduce(&mut b, layout, count, in_place, reduction(op), slice);
        }
        Collective::AllReduce { op } => {
            let chunks = Chunks::new((0..n).map(|c| part(count, n, c)).collect(), slice);
            let source = (!in_place).then_some(Input);
            reduce_scatter_steps(&mut b, layout, &chunks, Output, 0, reduction(op), source);
            allgather_steps(&mut b, layout, &chunks, Output, phase_tags(layout, &chunks));
        }
        Collective::AllGather => {
            let chunks = Chunks::new(
                (0..n).map(|c| (layout.at(c) * count, count)).collect(),
                slice,
            );
            if !in_place {
                copy_sliced(
                    &mut b,
                    Region::new(Input, 0, count),
                    Output,
                    rank * count,
                    slice,
                );
            }
            allgather_steps(&mut b, layout, &chunks, Output, 0);
        }
        Collective::ReduceScatter { op } => {
            let chunks = Chunks::new(
                (0..n).map(|c| (layout.at(c) * count, count)).collect(),
                slice,
            );
            let all = count * n;
            b.scratch(all);
            let source = if in_place { Output } else { Input };
            copy_sliced(&mut b, Region::new(source, 0, all), Scratch, 0, slice);
            reduce_scatter_steps(&mut b, layout, &chunks, Scratch, 0, reduction(op), None);
            let home = if in_place { rank * count } else { 0 };
            copy_sliced(
                &mut b,
                Region::new(Scratch, rank * count, count),
                Output,
                home,
                slice,
            );
        }
        Collective::Broadcast { root } => {
            chain::broadcast(&mut b, layout, root, count, in_place, slice)
        }
        Collective::Reduce { op, root } => {
            chain::reduce(&mut b, layout, root, count, in_place, slice, reduction(op))
        }
        Collective::AllToAll => direct::all_to_all(&mut b, layout, count, in_place, slice),
        Collective::AllToAllV => {
            let n = layout.world();
            let even = AllToAllCounts {
                send: vec![count; n],
                recv: vec![count; n],
            };
            direct::all_to_all_v(&mut b, layout, &even, slice);
        }
        Collective::AllGatherV => direct::all_gather_v(&mut b, layout, &vec![count; n], slice),
        Collective::ReduceScatterV { op } => {
            direct::reduce_scatter_v(&mut b, layout, &vec![count; n], reduction(op), slice)
        }
        Collective::Send { peer } => direct::send(&mut b, peer, count, slice),
        Collective::Recv { peer } => direct::recv(&mut b, peer, count, slice),
        Collective::Barrier => barrier::dissemination(&mut b, layout),
        Collective::Gather { root } => direct::gather(&mut b, layout, root, count, in_place, slice),
        Collective::Scatter { root } => {
            direct::scatter(&mut b, layout, root, count, in_place, slice)
        }
    }
    b.finish()
}
