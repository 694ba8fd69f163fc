//! BCL's control plane at scale: what rank 0 (and a detecting rank) must do for the rendezvous,
//! the slow-node reports and a verdict's delivery, from request counts of the real code and
//! per-request costs measured here (`bcl-bench rendezvous`).
//!
//! A closed-form model, not the flow engine: each of these is one server (rank 0's store, its
//! health thread, a detector dialling peers one after another) working through a known number
//! of requests and bytes, so its time is `requests × per_request + bytes × per_byte`. The
//! counts come from `bcl_core::bootstrap::requests` (a test holds those to a store that counts
//! what it is asked); the rest of the model is the arithmetic below.

use bcl_core::bootstrap::{Exchange, FANOUT, children, requests};

/// Costs measured on this machine (2-core VM, loopback); `bcl-bench rendezvous` gives them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Constants {
    /// Store: seconds per request answered (its lock, a thread's wake-up, a small reply).
    pub per_request: f64,
    /// Store: seconds per reply byte (copying a value out of the map, encoding, sending).
    pub per_byte: f64,
    /// Bytes of one rank's record ([`bcl_core::RankInfo`], postcard).
    pub record: f64,
    /// Seconds of rank 0's health side per incoming report: accept, authenticate, a helper
    /// thread, the window (one connection per report).
    pub per_connection: f64,
    /// Seconds for a detector to hand a verdict to one rank: dial, authenticate, send, answer.
    pub dial: f64,
    /// Seconds of rank 0's detector per window it takes (decode, add, its share of the
    /// evaluation): `cargo bench -p bcl-core --bench detector`.
    pub per_window: f64,
    /// Seconds between slow-node reports (`BCL_SLOW_WINDOW_MS`).
    pub window: f64,
    /// Seconds per hop of the ring flood (a message on an open health link, and its relay).
    pub hop: f64,
}

impl Default for Constants {
    /// Measured with `bcl-bench rendezvous --nranks 64,256,1024 --rounds 3` on 2026-12-04
    /// (docs/scale.md): the star's and the tree's 1024-rank times (means of 3: 29.3 s for
    /// 1.05 M requests and 197 MB, 1.11 s for 4094 requests and 189 MB) solved together for
    /// the two store costs; a connection's cost from connecting 64 ranks (15-23 ms). A
    /// verdict's dial is taken as one such connection; a ring hop is assumed, not measured.
    /// A window's cost at rank 0 from `cargo bench -p bcl-core --bench detector` on
    /// 2026-12-07: a round of 100k windows in 278 ms (10k: 25.4 ms, 1024: 2.1 ms).
    fn default() -> Self {
        Constants {
            per_request: 26.9e-6,
            per_byte: 5.3e-9,
            record: 177.0,
            per_connection: 250e-6,
            dial: 250e-6,
            per_window: 2.8e-6,
            window: 0.5,
            hop: 100e-6,
        }
    }
}

/// One server's work: requests it answers, bytes it sends, and the seconds they take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    pub requests: f64,
    pub bytes: f64,
    pub seconds: f64,
}

/// Records that travel up the tree: each rank's record is read once per ancestor below the
/// root's level (a subtree key holds its whole subtree), i.e. the sum of the non-root ranks'
/// depths.
pub fn gathered_records(world: usize) -> f64 {
    // depth(r) = depth(parent) + 1, parent = (r - 1) / FANOUT < r.
    let mut depth = vec![0u32; world];
    let mut sum = 0.0;
    for r in 1..world {
        depth[r] = depth[(r - 1) / FANOUT] + 1;
        sum += f64::from(depth[r]);
    }
    sum
}

/// Levels of the gathering tree below rank 0.
pub fn tree_depth(world: usize) -> u32 {
    let (mut depth, mut reach, mut level) = (0, 1usize, 1usize);
    while reach < world {
        level = level.saturating_mul(FANOUT);
        reach = reach.saturating_add(level);
        depth += 1;
    }
    depth
}

/// Rank 0's store during one rendezvous of `world` ranks.
pub fn rendezvous(how: Exchange, world: usize, c: &Constants) -> Load {
    let n = world as f64;
    // A set's reply: a length and one byte; a get's: a length and four bytes of framing
    // (variant, option, a varint length of up to three bytes) around the value.
    let (small, framing) = (5.0, 8.0);
    let (requests, bytes, extra) = match how {
        Exchange::Star => {
            let (sets, gets) = requests(Exchange::Star, world);
            let bytes = sets as f64 * small + gets as f64 * (c.record + framing);
            (sets + gets, bytes, 0.0)
        }
        Exchange::Tree => {
            let (sets, gets) = requests(Exchange::Tree, world);
            let table = (n - 1.0) * n * c.record;
            let up = gathered_records(world) * c.record;
            let bytes = sets as f64 * small + up + table + gets as f64 * framing;
            (sets + gets, bytes, 0.0)
        }
        Exchange::Relay => {
            // The store: own keys, subtree keys and their reads, each rank's read of its
            // parent's key. Rank 0's health port: the table to each of its children. Each
            // rank below passes every part on to its own children as it comes, so the levels
            // overlap: the last level has the table one part's round of its parents after
            // the level above it.
            let (sets, gets) = requests(Exchange::Relay, world);
            let to_children = children(0, world).count() as f64;
            let up = gathered_records(world) * c.record;
            let table = n * c.record;
            let store = sets as f64 * small + up + gets as f64 * (c.record + framing);
            let part = table.min(bcl_core::health::TABLE_PART as f64);
            let below = f64::from(tree_depth(world).saturating_sub(1));
            let down = below * to_children.min(FANOUT as f64) * part * c.per_byte;
            (sets + gets, store + to_children * table, down)
        }
    };
    Load {
        requests: requests as f64,
        bytes,
        seconds: requests as f64 * c.per_request + bytes * c.per_byte + extra,
    }
}

/// Rank 0's health side under the slow-node reports when every rank dials it (the first
/// design): the share of one core it needs (1.0 or more: it cannot keep up, and probes of it
/// go unanswered, as 128 ranks on this 2-core machine showed; docs/scale.md).
pub fn report_load(world: usize, c: &Constants) -> f64 {
    (world.saturating_sub(1)) as f64 / c.window * (c.per_connection + c.per_window)
}

/// The same with the reports climbing a tree of `fanout` (built): rank 0 takes its children's
/// connections and every window.
pub fn report_load_tree(world: usize, fanout: usize, c: &Constants) -> f64 {
    let connections = bcl_core::tree::children(0, world, fanout).count() as f64;
    (connections * c.per_connection + world.saturating_sub(1) as f64 * c.per_window) / c.window
}

/// The most ranks whose reports rank 0 keeps up with on one core, every rank dialling it.
pub fn report_limit(c: &Constants) -> f64 {
    c.window / (c.per_connection + c.per_window) + 1.0
}

/// Seconds until a verdict reaches the last rank: delivered directly by the detector to one
/// rank after another, and flooded both ways round the ring; each rank has it by the earlier.
pub fn verdict_spread(world: usize, c: &Constants) -> (f64, f64, f64) {
    let n = world.saturating_sub(1); // ranks other than the detector
    let direct = n as f64 * c.dial;
    let flood = n.div_ceil(2) as f64 * c.hop;
    // Direct delivery reaches the k-th rank (in rank order from the detector) at k × dial,
    // the flood reaches the rank at ring distance d at d × hop: the last rank to hold it.
    let mut last: f64 = 0.0;
    for k in 1..=n {
        let d = k.min(world - k);
        last = last.max((k as f64 * c.dial).min(d as f64 * c.hop));
    }
    (direct, flood, last)
}
