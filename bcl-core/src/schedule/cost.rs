//! The cost model behind the allreduce algorithm choice: Hockney's α-β model plus a reduction
//! term, with constants measured per link class on this project's test machine (the numbers
//! and the command that measures them are below). Pure arithmetic, so every rank that knows
//! the same fabric picks the same algorithm.
//!
//! For `n` bytes on `p` ranks (`q` the largest power of two ≤ `p`, `c = n / p`):
//!
//! ```text
//! ring:               2(p-1)·α + 2(p-1)·c·β + (p-1)·c·γ
//! recursive doubling: log2(q)·(α + n·β + n·γ)  [+ 2·α + 2·n·β + n·γ when p is not a power of two]
//! halving-doubling:   2·log2(q)·α + 2(q-1)/q·n·β + (q-1)/q·n·γ  [+ the same pairing term]
//! double binary tree: 2·⌈log2(p)⌉·α + 2·n·β + n·γ
//! ```
//!
//! The tree's slices pipeline, so its depth costs α per level, not a whole buffer: each rank
//! sends and receives n in the reduce (two half-slices in, one out, in the tree where it is
//! interior; one out where it is a leaf) and n in the broadcast.
//!
//! α: the time of one step of a collective whatever its size (a message's latency, the
//! executor's and the peer's turn-around); β: seconds per byte on the link; γ: seconds per
//! byte reduced into the destination.

use super::{Algorithm, Fabric};

/// The constants of one link class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Seconds per step.
    pub alpha: f64,
    /// Seconds per byte sent.
    pub beta: f64,
    /// Seconds per byte reduced.
    pub gamma: f64,
}

/// Constants measured on this project's test VM (2 vCPUs) on 2026-11-29 with
/// `scripts/measure-cost-model.sh tcp|shm 3`: medians of 3 interleaved runs, 8 B .. 2 MiB,
/// ring and doubling forced. γ comes from the 2-rank fit; α and β are fitted per world size
/// with γ fixed, because the per-step cost grows with the ranks per core on a small machine
/// (2 ranks: one per core; 4 ranks: two per core). Worlds of 3 or more use the 4-rank
/// constants.
pub mod measured {
    use super::LinkCost;

    /// TCP on loopback (2 sockets per peer), 2 ranks.
    pub const TCP_2: LinkCost = LinkCost {
        alpha: 16.9e-6,
        beta: 1.0 / 3.41e9,
        gamma: 1.0 / 4.97e9,
    };
    /// TCP on loopback, 4 ranks.
    pub const TCP_4: LinkCost = LinkCost {
        alpha: 40.9e-6,
        beta: 1.0 / 0.79e9,
        gamma: 1.0 / 4.97e9,
    };
    /// Shared-memory rings, 2 ranks.
    pub const SHM_2: LinkCost = LinkCost {
        alpha: 2.0e-6,
        beta: 1.0 / 6.74e9,
        gamma: 1.0 / 6.24e9,
    };
    /// Shared-memory rings, 4 ranks.
    pub const SHM_4: LinkCost = LinkCost {
        alpha: 5.4e-6,
        beta: 1.0 / 2.45e9,
        gamma: 1.0 / 6.24e9,
    };
    /// Between hosts, 2 ranks: each on a namespace host whose NIC is shaped to 2 Gbit/s,
    /// `scripts/measure-cost-model.sh hosts 3` on 2026-12-02 (γ the host's, TCP_2's; α from
    /// 8 B-2 KiB, β from 128 KiB up: tbf passes its 256 KiB burst faster than its rate).
    pub const HOSTS_2: LinkCost = LinkCost {
        alpha: 5.6e-6,
        beta: 1.0 / 0.25e9,
        gamma: 1.0 / 4.97e9,
    };
    /// Between hosts, 4 ranks (one per host, two per core), the same run.
    pub const HOSTS_4: LinkCost = LinkCost {
        alpha: 316.2e-6,
        beta: 1.0 / 0.27e9,
        gamma: 1.0 / 4.97e9,
    };
}

/// A link class's constants as a deployment measured them on its own machines
/// (`scripts/measure-cost-model.sh` prints them as `BCL_LINK_INSIDE` / `BCL_LINK_BETWEEN`):
/// they take the place of the built-in ones ([`measured`], this project's test VM), since the
/// selector's choices follow its constants and a cluster's NICs are not the VM's shaped veths.
/// (On the default cluster of `bcl-sim`, 10k ranks, 1 GiB: the built-in constants pick the
/// hierarchical ring, simulated at 25.5 ms, where hierarchical halving-doubling takes 12.5 ms;
/// the cluster's own pick it.) Integers, so that a [`Fabric`] holding them is compared whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeasuredLink {
    /// Seconds per step, in nanoseconds.
    pub alpha_ns: u64,
    /// Bytes per second over the link.
    pub bytes_per_second: u64,
    /// Bytes per second a rank reduces into its destination; `None`: the built-in γ.
    pub reduce_bytes_per_second: Option<u64>,
}

impl MeasuredLink {
    /// From `ALPHA_US,GBPS[,REDUCE_GBPS]` (microseconds per step; 10^9 bytes per second):
    /// `8,50` is 8 µs and 50 GB/s. Anything else, a negative, zero (a bandwidth), non-finite or
    /// absurd value (α over 10 s, a bandwidth over 10^6 GB/s) is an error naming `name`.
    pub fn parse(name: &str, text: &str) -> Result<MeasuredLink, String> {
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(format!(
                "{name}='{text}': expected ALPHA_US,GBPS or ALPHA_US,GBPS,REDUCE_GBPS (e.g. 8,50)"
            ));
        }
        // α may be 0 (a link with no per-step cost); a bandwidth may not.
        let number = |what: &str, v: &str, zero: bool, most: f64| -> Result<f64, String> {
            let x: f64 = v
                .parse()
                .map_err(|_| format!("{name}='{text}': {what} '{v}' is not a number"))?;
            let low = if zero { x >= 0.0 } else { x > 0.0 };
            if !(x.is_finite() && low && x <= most) {
                let from = if zero { "at least 0" } else { "above 0" };
                return Err(format!(
                    "{name}='{text}': {what} {v} must be {from} and at most {most}"
                ));
            }
            Ok(x)
        };
        let alpha = number("alpha (µs)", parts[0], true, 10e6)?;
        let gbps = number("bandwidth (GB/s)", parts[1], false, 1e6)?;
        let reduce = (parts.get(2))
            .map(|v| number("reduce bandwidth (GB/s)", v, false, 1e6))
            .transpose()?;
        let bytes = |gbps: f64| ((gbps * 1e9).round() as u64).max(1);
        Ok(MeasuredLink {
            alpha_ns: (alpha * 1e3).round() as u64,
            bytes_per_second: bytes(gbps),
            reduce_bytes_per_second: reduce.map(bytes),
        })
    }

    /// The model's constants: these, with `builtin`'s γ where no reduce speed was given.
    pub fn cost(self, builtin: LinkCost) -> LinkCost {
        LinkCost {
            alpha: self.alpha_ns as f64 / 1e9,
            beta: 1.0 / self.bytes_per_second.max(1) as f64,
            gamma: self
                .reduce_bytes_per_second
                .map_or(builtin.gamma, |r| 1.0 / r.max(1) as f64),
        }
    }

    /// Zero bandwidths (possible only in code): the error names `what`.
    pub fn check(self, what: &str) -> Result<(), String> {
        if self.bytes_per_second == 0 || self.reduce_bytes_per_second == Some(0) {
            return Err(format!("{what}: a bandwidth of 0 bytes per second"));
        }
        Ok(())
    }
}

/// The allreduce size from which two ranks on one host send over one TCP connection per peer
/// instead of spreading their messages over all of them (`schedule::connections_per_peer`).
/// Measured on this project's test VM (2 vCPUs, one rank per core) on 2026-12-01 with
/// `scripts/alternate-bench.sh 2 6 "8M 16M 32M 64M 128M 256M" "two:BCL_SOCKETS_PER_OP=2"
/// "one:BCL_SOCKETS_PER_OP=1"`, busbw medians in GB/s, two vs one connection: 8 MiB 2.61 / 1.70,
/// 16 MiB 1.70 / 1.38 (two won 4 and 5 of 6), 32 MiB 1.21 / 1.33, 64 MiB 1.09 / 1.45, 128 MiB
/// 1.25 / 1.49, 256 MiB 1.36 / 1.56 (one won 4, 5, 6 and 5 of 6). While a step's data fits in
/// the socket buffers, two connections let both cores work on it; beyond, each byte costs more
/// kernel time over two (with the earlier 16 MiB send queue, system time of eight 256 MiB
/// allreduces: 6.8-7.2 s against 5.4-5.6 s). With 4 ranks on the 2 cores two connections were as
/// fast or faster at every size (4 MiB-256 MiB, 5 alternations), so larger worlds keep them all.
pub const ONE_CONNECTION_FROM: usize = 32 << 20;

/// The operation size up to which every message of an operation goes over one connection
/// per peer (`schedule::connections_per_peer`), whatever the collective: spread over two, the
/// messages of consecutive small operations alternate sockets, and the receiver pays a poll(2)
/// to find the readable one on every arrival. Measured on this project's test VM (Intel Xeon,
/// 2 vCPUs) on 2026-12-05, the baselines' harness (barrier, then one timed allreduce), tcp,
/// `BCL_SOCKETS_PER_PEER=1` against 2, medians of 5 interleaved rounds, µs: 2 ranks 8 B 4.21 /
/// 5.20, 1 KiB 4.68 / 5.68, 16 KiB 9.09 / 9.79, 64 KiB 23.19 / 24.16, 256 KiB 62.46 / 64.27,
/// 1 MiB 239.31 / 239.12; 4 ranks (2 per core) 16 KiB 48.56 / 57.04, 64 KiB 76.67 / 81.46,
/// 256 KiB 185.93 / 189.86, 1 MiB 1172.81 / 680.04 (bimodal for both; one connection was slow
/// in 4 of 5 rounds there), 8 B and 1 KiB within the rounds' noise.
pub const ONE_CONNECTION_UP_TO: usize = 256 << 10;

/// The allreduce size from which ranks of one host whose devices reduce at different speeds
/// run the hierarchical plan (a direct reduce-scatter in shares proportional to speed, then a
/// direct allgather) instead of the flat choice. Measured on this project's test VM on
/// 2026-12-02, 4 ranks over shared memory, devices `cpu,sim:reduce=1` (two at the host's
/// speed, two at 1 GB/s), medians of 5 interleaved rounds, µs:
/// `TRANSPORT=shm scripts/alternate-bench.sh 4 5 "1M 16M 64M" ...` (`docs/hierarchical.md`):
/// 1 MiB: ring 2064, equal shares 1707, proportional 1044; 16 MiB: 32263, 33330, 23954;
/// 64 MiB: 121925, 121245, 88300 (proportional faster than equal 5 of 5 at each). Below
/// 1 MiB it was not measured, and the flat choice stays.
pub const MIXED_SPEEDS_DIRECT_FROM: usize = 1 << 20;

/// The allreduce size from which 3 or more ranks of one host over shared memory, with slices
/// large enough to be lent, run the direct plan (`Algorithm::HierRing` on one host: a direct
/// reduce-scatter, then a direct allgather, both lent) instead of the ring. Each rank pulls
/// as many bytes either way, but the ring's steps each wait for the one before, on a peer
/// that may not be running; the direct plan's pulls are all ready at once. Measured on this
/// project's test VM (Intel Xeon, 2 vCPUs) on 2026-12-05, with
/// `TRANSPORT=shm scripts/alternate-bench.sh N 3 "256K 1M 4M 16M 64M" "ring:BCL_ALGO=ring"
/// "direct:BCL_ALGO=hier-ring"` (the ring then lent at every size), busbw GB/s ring /
/// direct: 3 ranks 256 KiB 3.21 / 3.77, 1 MiB 2.74 / 3.45, 64 MiB 1.73 / 1.96; 4 ranks
/// 256 KiB 2.70 / 2.85, 1 MiB 2.33 / 2.83, 64 MiB 1.65 / 1.89; 8 ranks 1 MiB 1.15 / 1.42,
/// 64 MiB 0.93 / 1.03, but 256 KiB 0.83 / 0.66, where 32 KiB slices are below the lending
/// size and go through the rings; with lending off (`BCL_SINGLE_COPY_BYTES=0`) the direct
/// plan lost at 4 ranks (1 MiB 2.70 / 1.83, 64 MiB 1.54 / 1.25), hence the condition on
/// lent slices in `schedule::select`. Below 256 KiB it was not measured.
pub const ONE_HOST_DIRECT_FROM: usize = 256 << 10;

/// The allreduce size from which a ring that auto picked lends its messages
/// (`schedule::lend_from`); below it they go through the shared-memory rings. Measured on this
/// project's test VM (Intel Xeon, 2 vCPUs, L2 2 MiB per core) on 2026-12-06, 2 ranks, the
/// baselines' harness (barrier, then one timed allreduce), `BCL_ALGO=ring` with
/// `BCL_SINGLE_COPY_BYTES=65536` (lent) and `=0` (copied), interleaved, µs: in the VM's fast
/// state lent / copied 128 KiB 29 / 10.5, 256 KiB 51 / 20.6, 1 MiB 151 / 75, 2 MiB 225 / 180
/// (OpenMPI 30, 55, 136, 235); in its slow state 256 KiB 114 / 120, 1 MiB 467 / 490, 2 MiB
/// 700 / 940 (OpenMPI 160, 580, 1160). A loan costs a system call, the pages' walk and a
/// give-back; while the data fit the caches a copy through a ring costs less, and past them
/// the ring's extra copy costs memory bandwidth, where lending saves it.
pub const RING_LENDS_FROM: usize = 2 << 20;

/// The allreduce size from which ranks over TCP, 4 or more and a power of two, run
/// halving-doubling where the model would still double. The model puts that crossover at
/// 92 KiB on 4 ranks (doubling's two whole-buffer exchanges against halving-doubling's four
/// half-size steps), but at 32 and 64 KiB halving-doubling measured faster on both VMs this
/// project has run on: 2026-11-30 (AMD EPYC, `scripts/measure-cost-model.sh tcp 3`, back to
/// back) 32 KiB 167.6 against doubling's 176.8 µs; 2026-12-05 (Intel Xeon, the same script)
/// 81.3 against 86.2 µs, and in the baselines' harness (barrier, then one timed allreduce; 6
/// interleaved rounds, `mpirun -np 4 --oversubscribe --bind-to none -x BCL_ALGO=rd|hd`)
/// 32 KiB 55.6-61.8 against 66.7-85.8 µs (6 of 6), 64 KiB 76.8-120.4 against 91.7-148.9
/// (5 of 6), 16 KiB a draw (medians 57.8 against 53.7). Per step the model charges the
/// same α whatever the message size, and a step of a whole 32 KiB buffer costs more on
/// loopback TCP than two of 16 KiB; with one α that cannot be fitted, hence this measured
/// threshold. Only power-of-two worlds: elsewhere halving-doubling's pairing round moves
/// the whole buffer twice, and that was not measured.
pub const HALVING_OVER_DOUBLING_FROM: usize = 32 << 10;

/// The constants for a fabric: shared memory when every link is, TCP otherwise (a mixed
/// fabric is as slow as its slowest link).
pub fn link_cost(fabric: Fabric) -> LinkCost {
    let builtin = match (fabric.all_shared_memory, fabric.world <= 2) {
        (true, true) => measured::SHM_2,
        (true, false) => measured::SHM_4,
        (false, true) => measured::TCP_2,
        (false, false) => measured::TCP_4,
    };
    // A deployment's own constants: those inside a host on one host, else those between
    // hosts (ranks each on its own host).
    let given = match fabric.one_host {
        true => fabric.inside_link,
        false => fabric.between_link,
    };
    given.map_or(builtin, |m| m.cost(builtin))
}

/// The constants of the links between hosts: those measured between namespace hosts with
/// 2 Gbit/s NICs (the fabric this project tests on; on a real cluster, measure its own with
/// `RATE=... scripts/measure-cost-model.sh hosts`). With more than 2 ranks the per-step cost
/// is the 4-rank one.
pub fn between_hosts_cost(fabric: Fabric) -> LinkCost {
    let builtin = if fabric.world <= 2 {
        measured::HOSTS_2
    } else {
        measured::HOSTS_4
    };
    fabric.between_link.map_or(builtin, |m| m.cost(builtin))
}

/// The constants of the links inside a host: shared memory's where every such link is.
pub fn inside_host_cost(fabric: Fabric) -> LinkCost {
    let builtin = match (fabric.shm_inside_hosts, fabric.largest_host <= 2) {
        (true, true) => measured::SHM_2,
        (true, false) => measured::SHM_4,
        (false, true) => measured::TCP_2,
        (false, false) => measured::TCP_4,
    };
    fabric.inside_link.map_or(builtin, |m| m.cost(builtin))
}

/// The model's time of a hierarchical allreduce (`schedule::hierarchical`) of `bytes` on
/// `hosts` hosts of `per_host` ranks: the direct reduce-scatter and allgather inside a host
/// (one step each, (l−1)/l of the buffer through each rank), and between them the rails'
/// allreduce of n/l each by `between`, the l rails of a host sharing its `links` NICs
/// (β·⌈l / links⌉).
/// Rails that send slices (ring, halving-doubling, tree) start on the first slices the host
/// has reduced, so the phases overlap and the slower one counts; a doubling rail sends its
/// share in one message, after the whole first phase (2 hosts × 4 ranks, 2 Gbit/s, medians of
/// 3 rounds: hier-ring 22.1 ms against hier-rd 24.9 ms at 4 MiB, 83 against 105 at 16 MiB,
/// 5.5 against 5.3 at 1 MiB).
pub fn hierarchical_seconds(
    between: Algorithm,
    bytes: usize,
    hosts: usize,
    per_host: usize,
    links: usize,
    inside: LinkCost,
    across: LinkCost,
) -> f64 {
    let (n, l) = (bytes as f64, per_host.max(1) as f64);
    let sharing = per_host.max(1).div_ceil(links.max(1)) as f64;
    let local = if per_host > 1 {
        let share = (l - 1.0) / l * n;
        2.0 * inside.alpha + 2.0 * share * inside.beta + share * inside.gamma
    } else {
        0.0
    };
    let shared_link = LinkCost {
        beta: across.beta * sharing,
        ..across
    };
    let rails = allreduce_seconds(between, (n / l) as usize, hosts, shared_link);
    if between == Algorithm::RecursiveDoubling {
        local + rails
    } else {
        local.max(rails) + 2.0 * inside.alpha
    }
}

/// The model's time in seconds of an allreduce of `bytes` on `world` ranks (a hierarchical
/// algorithm: all on one host, `cost` its links).
pub fn allreduce_seconds(algorithm: Algorithm, bytes: usize, world: usize, cost: LinkCost) -> f64 {
    let (n, p) = (bytes as f64, world as f64);
    if world <= 1 {
        return 0.0;
    }
    if let Some(between) = algorithm.between_hosts() {
        return hierarchical_seconds(between, bytes, 1, world, 1, cost, cost);
    }
    match algorithm {
        Algorithm::Ring => {
            let c = n / p;
            2.0 * (p - 1.0) * (cost.alpha + c * cost.beta) + (p - 1.0) * c * cost.gamma
        }
        Algorithm::RecursiveDoubling => {
            let q = 1usize << (usize::BITS - 1 - world.leading_zeros());
            let rounds = f64::from(q.trailing_zeros());
            let mut t = rounds * (cost.alpha + n * cost.beta + n * cost.gamma);
            if q != world {
                t += 2.0 * cost.alpha + 2.0 * n * cost.beta + n * cost.gamma;
            }
            t
        }
        Algorithm::HalvingDoubling => {
            let q = 1usize << (usize::BITS - 1 - world.leading_zeros());
            let (rounds, share) = (f64::from(q.trailing_zeros()), (q as f64 - 1.0) / q as f64);
            let mut t =
                2.0 * rounds * cost.alpha + 2.0 * share * n * cost.beta + share * n * cost.gamma;
            if q != world {
                t += 2.0 * cost.alpha + 2.0 * n * cost.beta + n * cost.gamma;
            }
            t
        }
        Algorithm::Tree => {
            let depth = f64::from(world.next_power_of_two().trailing_zeros());
            2.0 * depth * cost.alpha + 2.0 * n * cost.beta + n * cost.gamma
        }
        _ => f64::INFINITY,
    }
}

/// The cheapest allreduce on `fabric` by the model: [`cheaper_allreduce`] among the flat
/// algorithms (their steps cost the slowest link's α and β), and where ranks sit on several
/// hosts with more than one on some, the hierarchical ones, when strictly cheaper. There the
/// slowest link is the one between hosts ([`between_hosts_cost`]), and the flat doubling and
/// halving rounds that cross hosts move every rank of a host over its one link at once, so
/// they are charged its β times the ranks of the largest host (the flat ring, ordered by
/// host, crosses each boundary on one edge: on 2 hosts × 4 ranks with 2 Gbit/s NICs flat
/// halving-doubling ran at 0.10 GB/s where the ring got 0.24).
///
/// The double binary tree is not a candidate: on 6 hosts × 2 ranks (2 Gbit/s, 2026-12-02,
/// `docs/hierarchical.md`) it lost to hierarchical doubling from 16 KiB to 256 KiB, where the
/// model puts it ahead, and tied the ring and halving-doubling rails at 1 MiB.
pub fn cheapest_on(bytes: usize, fabric: Fabric) -> Algorithm {
    if fabric.hosts < 2 || fabric.largest_host < 2 {
        return cheaper_allreduce(
            bytes,
            fabric.world,
            link_cost(fabric),
            !fabric.all_shared_memory,
        );
    }
    let (inside, across) = (inside_host_cost(fabric), between_hosts_cost(fabric));
    let shared = LinkCost {
        beta: across.beta * fabric.largest_host.div_ceil(fabric.nics_per_host.max(1)) as f64,
        ..across
    };
    let time = |algorithm: Algorithm| match algorithm.between_hosts() {
        Some(between) => hierarchical_seconds(
            between,
            bytes,
            fabric.hosts,
            fabric.largest_host,
            fabric.nics_per_host,
            inside,
            across,
        ),
        None if algorithm == Algorithm::Ring => {
            allreduce_seconds(algorithm, bytes, fabric.world, across)
        }
        None => allreduce_seconds(algorithm, bytes, fabric.world, shared),
    };
    // The first of the cheapest wins: doubling, the ring, halving-doubling, then the
    // hierarchical ones in the same order.
    let halving = (!fabric.all_shared_memory).then_some(Algorithm::HalvingDoubling);
    [Algorithm::RecursiveDoubling, Algorithm::Ring]
        .into_iter()
        .chain(halving)
        .chain([
            Algorithm::HierDoubling,
            Algorithm::HierRing,
            Algorithm::HierHalving,
        ])
        .map(|a| (a, time(a)))
        .fold((Algorithm::Ring, f64::INFINITY), |best, (a, t)| {
            if t < best.1 * (1.0 - 1e-9) {
                (a, t)
            } else {
                best
            }
        })
        .0
}

/// The cheapest allreduce algorithm by the model: recursive doubling or the ring, and
/// halving-doubling too where `with_halving`. Ties go to doubling, then the ring:
/// halving-doubling is picked only where it is strictly cheaper (with 2 ranks it is the ring,
/// step for step), or where the model would double from [`HALVING_OVER_DOUBLING_FROM`].
///
/// The selector offers halving-doubling where a link is not shared memory. Over TCP it was
/// measured fastest from 32 KiB to 2 MiB on 4 ranks (1.12-1.59x the ring from 128 KiB; the
/// tables in the tests); over shared memory it was within noise of the ring up to 2 MiB, and the shm
/// constants put its crossover with doubling at 32 KiB where doubling measured 1.56x faster.
pub fn cheaper_allreduce(
    bytes: usize,
    world: usize,
    cost: LinkCost,
    with_halving: bool,
) -> Algorithm {
    let ring = allreduce_seconds(Algorithm::Ring, bytes, world, cost);
    let doubling = allreduce_seconds(Algorithm::RecursiveDoubling, bytes, world, cost);
    let halving = if with_halving {
        allreduce_seconds(Algorithm::HalvingDoubling, bytes, world, cost)
    } else {
        f64::INFINITY
    };
    let halving_measured_faster = with_halving
        && world >= 4
        && world.is_power_of_two()
        && bytes >= HALVING_OVER_DOUBLING_FROM;
    if doubling <= ring && doubling <= halving && !halving_measured_faster {
        Algorithm::RecursiveDoubling
    } else if halving < ring * (1.0 - 1e-9) || (halving_measured_faster && doubling <= ring) {
        Algorithm::HalvingDoubling
    } else {
        Algorithm::Ring
    }
}

/// The largest size (bytes, to a power-of-two grid) at which the model still picks doubling:
/// the crossover the documentation quotes.
pub fn doubling_crossover(world: usize, cost: LinkCost, with_halving: bool) -> usize {
    let mut last = 0;
    for shift in 0..40 {
        let bytes = 1usize << shift;
        if cheaper_allreduce(bytes, world, cost, with_halving) == Algorithm::RecursiveDoubling {
            last = bytes;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Medians measured with `scripts/measure-cost-model.sh` (the run the constants come
    /// from): (bytes, ring µs, doubling µs).
    const TCP_2_RUN: [(usize, f64, f64); 10] = [
        (8, 28.4, 18.4),
        (32, 29.4, 22.3),
        (128, 29.8, 20.6),
        (512, 34.4, 17.7),
        (2048, 36.7, 17.9),
        (8192, 40.7, 19.8),
        (32768, 43.5, 44.1),
        (131072, 89.2, 131.8),
        (524288, 220.0, 201.4),
        (2097152, 943.6, 1537.9),
    ];
    const TCP_4_RUN: [(usize, f64, f64); 10] = [
        (8, 149.8, 79.3),
        (32, 300.9, 73.3),
        (128, 319.0, 84.9),
        (512, 332.1, 93.4),
        (2048, 317.7, 92.2),
        (8192, 350.2, 117.8),
        (32768, 363.7, 205.8),
        (131072, 512.5, 384.9),
        (524288, 1480.8, 1451.8),
        (2097152, 4530.4, 7007.4),
    ];
    const SHM_2_RUN: [(usize, f64, f64); 10] = [
        (8, 5.3, 2.6),
        (32, 3.6, 2.3),
        (128, 3.1, 2.5),
        (512, 3.1, 2.9),
        (2048, 4.4, 3.8),
        (8192, 6.7, 5.9),
        (32768, 14.4, 10.6),
        (131072, 35.2, 39.0),
        (524288, 107.6, 174.1),
        (2097152, 495.3, 659.0),
    ];
    const SHM_4_RUN: [(usize, f64, f64); 10] = [
        (8, 19.5, 15.7),
        (32, 30.0, 15.0),
        (128, 30.5, 15.6),
        (512, 37.7, 16.4),
        (2048, 33.4, 18.3),
        (8192, 41.5, 27.4),
        (32768, 72.0, 45.8),
        (131072, 170.6, 125.7),
        (524288, 370.5, 475.9),
        (2097152, 2168.9, 4165.6),
    ];

    /// Between namespace hosts with 2 Gbit/s NICs, one rank per host
    /// (`scripts/measure-cost-model.sh hosts 3`, 2026-12-02).
    const HOSTS_2_RUN: [(usize, f64, f64); 10] = [
        (8, 10.0, 5.8),
        (32, 10.5, 5.9),
        (128, 10.4, 7.3),
        (512, 14.9, 6.7),
        (2048, 11.7, 8.5),
        (8192, 16.9, 16.6),
        (32768, 138.2, 137.6),
        (131072, 549.1, 548.7),
        (524288, 2236.0, 2194.6),
        (2097152, 8794.1, 9094.4),
    ];
    const HOSTS_4_RUN: [(usize, f64, f64); 10] = [
        (8, 1360.6, 666.1),
        (32, 2098.1, 709.0),
        (128, 2077.1, 843.5),
        (512, 2132.7, 709.5),
        (2048, 2067.5, 839.6),
        (8192, 2083.2, 691.9),
        (32768, 2166.8, 761.2),
        (131072, 2118.3, 1326.1),
        (524288, 4398.9, 5571.8),
        (2097152, 15708.3, 25573.1),
    ];

    /// Wherever one algorithm was clearly faster (by 1.5× or more), the model picks it; and
    /// where it picks the slower one, it costs at most 1.5×.
    #[test]
    fn the_model_agrees_with_the_measurements_it_was_fitted_to() {
        for (name, world, cost, run) in [
            ("tcp", 2, measured::TCP_2, TCP_2_RUN),
            ("tcp", 4, measured::TCP_4, TCP_4_RUN),
            ("shm", 2, measured::SHM_2, SHM_2_RUN),
            ("shm", 4, measured::SHM_4, SHM_4_RUN),
            ("hosts", 2, measured::HOSTS_2, HOSTS_2_RUN),
            ("hosts", 4, measured::HOSTS_4, HOSTS_4_RUN),
        ] {
            for (bytes, ring, rd) in run {
                let faster = if rd < ring {
                    Algorithm::RecursiveDoubling
                } else {
                    Algorithm::Ring
                };
                let gap = ring.max(rd) / ring.min(rd);
                let picked = cheaper_allreduce(bytes, world, cost, false);
                assert!(
                    picked == faster || gap < 1.5,
                    "{name} {world} ranks {bytes} B: measured {faster:?} faster by {gap:.2}x, \
                     the model picks {picked:?}"
                );
            }
        }
    }

    #[test]
    fn tiny_messages_double_and_large_ones_ring_at_every_world_size() {
        for shm in [false, true] {
            for world in 2..=64 {
                let cost = link_cost(Fabric::flat(world, shm, true));
                assert_eq!(
                    cheaper_allreduce(8, world, cost, !shm),
                    Algorithm::RecursiveDoubling,
                    "{world} ranks, shm {shm}"
                );
                let large = cheaper_allreduce(256 << 20, world, cost, !shm);
                // Halving-doubling moves the ring's bytes in fewer steps: the model prefers it
                // for large messages exactly where it is offered and the world is a power of
                // two (elsewhere its pairing round moves the whole buffer twice).
                let want = if !shm && world > 2 && world.is_power_of_two() {
                    Algorithm::HalvingDoubling
                } else {
                    Algorithm::Ring
                };
                assert_eq!(large, want, "{world} ranks, shm {shm}");
            }
        }
    }

    /// The crossovers the documentation quotes: the largest power of two at which the
    /// model still picks doubling (KiB).
    #[test]
    fn crossovers() {
        let at = |world, cost, halving| doubling_crossover(world, cost, halving) >> 10;
        assert_eq!(at(2, measured::TCP_2, true), 128);
        assert_eq!(at(4, measured::TCP_4, true), 16);
        assert_eq!(at(8, measured::TCP_4, true), 16);
        // Not a power of two: the model's own crossover.
        assert_eq!(at(6, measured::TCP_4, true), 64);
        assert_eq!(at(4, measured::TCP_4, false), 128);
        assert_eq!(at(2, measured::SHM_2, false), 16);
        assert_eq!(at(4, measured::SHM_4, false), 32);
    }

    /// Medians of 3 interleaved runs with all three algorithms forced, 2026-11-30
    /// (`scripts/measure-cost-model.sh tcp 3`): (bytes, ring µs, doubling µs, halving-doubling µs).
    const TCP_2_THREE: [(usize, f64, f64, f64); 10] = [
        (8, 25.9, 17.2, 33.5),
        (32, 26.2, 17.1, 25.5),
        (128, 25.2, 16.5, 23.8),
        (512, 27.7, 17.0, 31.2),
        (2048, 29.4, 21.3, 22.4),
        (8192, 29.6, 18.9, 22.8),
        (32768, 43.5, 33.3, 45.0),
        (131072, 97.1, 92.0, 83.3),
        (524288, 239.5, 231.9, 218.8),
        (2097152, 843.8, 1188.4, 942.8),
    ];
    const TCP_4_THREE: [(usize, f64, f64, f64); 10] = [
        (8, 130.1, 83.8, 71.9),
        (32, 213.4, 68.1, 152.0),
        (128, 230.0, 69.1, 101.6),
        (512, 257.3, 68.0, 113.8),
        (2048, 244.6, 69.3, 150.9),
        (8192, 348.2, 81.6, 129.3),
        (32768, 381.8, 176.8, 167.6),
        (131072, 552.1, 408.0, 346.9),
        (524288, 1289.2, 943.4, 873.8),
        (2097152, 4119.1, 5800.4, 3692.7),
    ];

    /// Over TCP, with halving-doubling offered, the model's pick measured within 1.2x of the
    /// fastest of the three at every size of a run it was not fitted to (and halving-doubling,
    /// fastest there from 128 KiB, is what it picks for 4 ranks from 128 KiB to 2 MiB).
    #[test]
    fn over_tcp_the_pick_of_three_is_within_a_fifth_of_the_fastest() {
        for (world, run) in [(2, TCP_2_THREE), (4, TCP_4_THREE)] {
            let cost = link_cost(Fabric::flat(world, false, true));
            for (bytes, ring, rd, hd) in run {
                let picked = cheaper_allreduce(bytes, world, cost, true);
                let time = match picked {
                    Algorithm::Ring => ring,
                    Algorithm::RecursiveDoubling => rd,
                    Algorithm::HalvingDoubling => hd,
                    other => panic!("a flat fabric picked {other:?}"),
                };
                let fastest = ring.min(rd).min(hd);
                assert!(
                    time <= 1.2 * fastest,
                    "tcp {world} ranks {bytes} B: the model picks {picked:?} ({time} µs), the \
                     fastest took {fastest} µs"
                );
                if world == 4 && bytes >= 131072 {
                    assert_eq!(picked, Algorithm::HalvingDoubling, "{bytes} B");
                }
            }
        }
    }

    /// The baselines' harness (barrier, then one timed allreduce, the slowest rank), 4 ranks
    /// over TCP on 2 cores, doubling and halving-doubling forced in turn, 6 interleaved rounds
    /// (2026-12-05, Intel Xeon VM; `HALVING_OVER_DOUBLING_FROM`'s command): (bytes, doubling's
    /// rounds µs, halving-doubling's rounds µs).
    const TCP_4_COLD: [(usize, [f64; 6], [f64; 6]); 4] = [
        (
            16384,
            [74.89, 47.41, 55.02, 54.44, 52.70, 52.94],
            [67.09, 49.87, 65.52, 79.00, 49.76, 50.05],
        ),
        (
            32768,
            [70.75, 66.74, 79.38, 77.86, 85.84, 72.49],
            [56.49, 61.80, 56.69, 59.34, 55.60, 59.59],
        ),
        (
            65536,
            [98.01, 119.85, 109.68, 113.52, 148.89, 91.67],
            [78.97, 79.22, 120.41, 82.12, 77.95, 76.81],
        ),
        (
            131072,
            [138.22, 139.14, 188.86, 153.32, 139.01, 139.58],
            [116.85, 114.30, 115.47, 178.82, 115.96, 111.19],
        ),
    ];

    /// Wherever one of the two won at least 5 of the 6 rounds of a cold call, the selector
    /// picks it for 4 ranks over TCP; a draw may go either way.
    #[test]
    fn over_tcp_4_ranks_the_pick_follows_the_cold_call_rounds() {
        let cost = link_cost(Fabric::flat(4, false, true));
        for (bytes, rd, hd) in TCP_4_COLD {
            let hd_won = rd.iter().zip(&hd).filter(|(d, h)| h < d).count();
            let picked = cheaper_allreduce(bytes, 4, cost, true);
            if hd_won >= 5 {
                assert_eq!(
                    picked,
                    Algorithm::HalvingDoubling,
                    "{bytes} B: hd won {hd_won} of 6"
                );
            } else if hd_won <= 1 {
                assert_eq!(
                    picked,
                    Algorithm::RecursiveDoubling,
                    "{bytes} B: hd won {hd_won} of 6"
                );
            }
        }
        // The model alone doubles up to 64 KiB: the threshold is what moves 32 and 64 KiB.
        let model = |a| allreduce_seconds(a, 64 << 10, 4, cost);
        assert!(model(Algorithm::RecursiveDoubling) < model(Algorithm::HalvingDoubling));
        // Shared memory does not offer halving-doubling; 2 ranks keep the ring.
        assert_ne!(
            cheaper_allreduce(64 << 10, 4, link_cost(Fabric::flat(4, true, true)), false),
            Algorithm::HalvingDoubling
        );
        assert_ne!(
            cheaper_allreduce(64 << 10, 2, link_cost(Fabric::flat(2, false, true)), true),
            Algorithm::HalvingDoubling
        );
    }

    fn hosts(hosts: usize, per_host: usize) -> Fabric {
        Fabric {
            world: hosts * per_host,
            all_shared_memory: false,
            one_host: hosts == 1,
            hosts,
            largest_host: per_host,
            shm_inside_hosts: true,
            mixed_speeds: false,
            nics_per_host: 1,
            single_copy_from: None,
            inside_link: None,
            between_link: None,
        }
    }

    /// A deployment's own constants replace the built-in ones where given, and only there:
    /// on 1250 hosts of 8 ranks with 8 NICs of 50 GB/s at 8 µs and devices reducing at
    /// 1000 GB/s (the default cluster of `bcl-sim`), a 1 GiB allreduce goes to halving-doubling rails, which the simulator
    /// times at 12.5 ms where the hierarchical ring that the built-in constants (2 Gbit/s
    /// veths, α 316 µs) pick takes 25.5 ms (`docs/simulator.md`).
    #[test]
    fn a_deployments_own_links_replace_the_builtin_constants() {
        let link = |text: &str| MeasuredLink::parse("BCL_LINK_BETWEEN", text).expect(text);
        let between = link("8,50,1000");
        assert_eq!(between.cost(measured::HOSTS_4).alpha, 8e-6);
        let no_reduce = link("8,50").cost(measured::HOSTS_4);
        assert_eq!(no_reduce.gamma, measured::HOSTS_4.gamma);
        let with_reduce = link("0,0.5,1000").cost(measured::HOSTS_4);
        assert_eq!((with_reduce.alpha, with_reduce.beta), (0.0, 2e-9));
        assert!((with_reduce.gamma - 1e-12).abs() < 1e-24);
        let builtin = Fabric {
            nics_per_host: 8,
            ..hosts(1250, 8)
        };
        let own = Fabric {
            inside_link: Some(link("3,370,1000")),
            between_link: Some(between),
            ..builtin
        };
        assert_eq!(between_hosts_cost(builtin), measured::HOSTS_4);
        assert_eq!(between_hosts_cost(own).alpha, 8e-6);
        assert_eq!(inside_host_cost(own).alpha, 3e-6);
        assert_eq!(cheapest_on(1 << 30, builtin), Algorithm::HierRing);
        assert_eq!(cheapest_on(1 << 30, own), Algorithm::HierHalving);
        // Ranks each on a host of their own: the flat algorithms, at the links between hosts.
        let flat = Fabric::flat(16, false, false);
        let flat_own = Fabric {
            between_link: Some(between),
            ..flat
        };
        assert_eq!(link_cost(flat), measured::TCP_4);
        assert_eq!(link_cost(flat_own).alpha, 8e-6);
        // One host: its own links, not those between hosts.
        let one = Fabric {
            between_link: Some(between),
            ..Fabric::flat(4, true, true)
        };
        assert_eq!(link_cost(one), measured::SHM_4);
        for bad in [
            "", "8", "8,50,1,2", "8;50", "x,50", "8,0", "8,-1", "-1,50", "inf,50", "8,nan",
            "8,50,0", "2e7,50", "8,2e6",
        ] {
            let e = MeasuredLink::parse("BCL_LINK_BETWEEN", bad).expect_err(bad);
            assert!(e.starts_with(&format!("BCL_LINK_BETWEEN='{bad}'")), "{e}");
        }
    }

    /// Several hosts with several ranks each: the hierarchy wins at every size by the model
    /// (few slow steps for small messages, 1/l of the data per rank across for large ones);
    /// one host, or one rank per host, leaves nothing for it to save.
    #[test]
    fn the_hierarchy_is_picked_only_where_ranks_share_hosts() {
        for bytes in [8usize, 64 << 10, 16 << 20, 256 << 20] {
            for (h, l) in [(2, 4), (4, 2), (8, 2), (2, 2), (4, 4), (6, 4)] {
                let picked = cheapest_on(bytes, hosts(h, l));
                assert!(
                    picked.between_hosts().is_some(),
                    "{h}x{l} {bytes} B: {picked:?}"
                );
            }
            for fabric in [hosts(1, 8), hosts(8, 1), Fabric::flat(8, true, true)] {
                let picked = cheapest_on(bytes, fabric);
                assert!(
                    picked.between_hosts().is_none(),
                    "{fabric:?} {bytes} B: {picked:?}"
                );
            }
        }
        // Reduce-scatter and allgather follow the hosts alike, never on one host.
        use crate::schedule::{Collective, select};
        for c in [
            Collective::AllGather,
            Collective::ReduceScatter {
                op: bcl_backends::ReduceOp::Sum,
            },
        ] {
            assert_eq!(select(c, 1 << 20, hosts(2, 4)), Algorithm::HierRing);
            assert_eq!(select(c, 1 << 20, hosts(1, 8)), Algorithm::Ring);
            assert_eq!(select(c, 1 << 20, hosts(8, 1)), Algorithm::Ring);
        }
        // Between many hosts, small messages take doubling, large ones the ring or halving.
        assert_eq!(cheapest_on(8, hosts(8, 2)), Algorithm::HierDoubling);
        assert_ne!(cheapest_on(256 << 20, hosts(8, 2)), Algorithm::HierDoubling);
    }

    /// On one host over shared memory, the direct plan takes over from the ring only where
    /// its slices are lent (each at least the lending size) and the world has 3 ranks or
    /// more (with 2 the ring is the direct plan); without lending it measured slower.
    #[test]
    fn one_host_runs_direct_only_where_its_slices_are_lent() {
        use crate::schedule::{Collective, select};
        let sum = Collective::AllReduce {
            op: bcl_backends::ReduceOp::Sum,
        };
        let lent = |world| Fabric {
            single_copy_from: Some(64 << 10),
            ..Fabric::flat(world, true, true)
        };
        for world in [3, 4, 8] {
            for bytes in [1 << 20, 64 << 20] {
                assert_eq!(
                    select(sum, bytes, lent(world)),
                    Algorithm::HierRing,
                    "{world} ranks {bytes} B"
                );
                let copied = Fabric::flat(world, true, true);
                assert_ne!(
                    select(sum, bytes, copied),
                    Algorithm::HierRing,
                    "{world} ranks {bytes} B unlent"
                );
                let tcp = Fabric {
                    single_copy_from: Some(64 << 10),
                    ..Fabric::flat(world, false, true)
                };
                assert_ne!(
                    select(sum, bytes, tcp),
                    Algorithm::HierRing,
                    "{world} ranks {bytes} B tcp"
                );
            }
            assert_ne!(
                select(sum, ONE_HOST_DIRECT_FROM / 2, lent(world)),
                Algorithm::HierRing
            );
        }
        // 256 KiB: 64 KiB slices on 4 ranks are lent, 32 KiB ones on 8 are not.
        assert_eq!(select(sum, 256 << 10, lent(4)), Algorithm::HierRing);
        assert_ne!(select(sum, 256 << 10, lent(8)), Algorithm::HierRing);
        assert_ne!(select(sum, 64 << 20, lent(2)), Algorithm::HierRing);
        // Other collectives keep the ring.
        assert_eq!(
            select(Collective::AllGather, 64 << 20, lent(4)),
            Algorithm::Ring
        );
    }

    /// A ring allreduce that auto picked lends from `RING_LENDS_FROM`; forced, or any other
    /// plan or collective, it lends from the configured size.
    #[test]
    fn auto_rings_below_the_cached_size_copy_through_the_rings() {
        use crate::schedule::{Collective, lend_from};
        let sum = Collective::AllReduce {
            op: bcl_backends::ReduceOp::Sum,
        };
        let below = RING_LENDS_FROM - 1;
        assert_eq!(lend_from(sum, Algorithm::Ring, below, false, 64 << 10), 0);
        assert_eq!(
            lend_from(sum, Algorithm::Ring, RING_LENDS_FROM, false, 64 << 10),
            64 << 10
        );
        assert_eq!(
            lend_from(sum, Algorithm::Ring, below, true, 64 << 10),
            64 << 10
        );
        assert_eq!(lend_from(sum, Algorithm::HierRing, below, false, 1), 1);
        assert_eq!(
            lend_from(Collective::AllGather, Algorithm::Ring, below, false, 1),
            1
        );
        assert_eq!(lend_from(sum, Algorithm::Ring, 1 << 30, false, 0), 0);
    }

    /// Rails on NICs of their own do not share a link: on 2 hosts × 4 ranks at 256 MiB the
    /// rails take about a quarter of the time they take sharing one NIC.
    #[test]
    fn rails_on_their_own_nics_do_not_share_a_link() {
        let (inside, across) = (measured::SHM_4, measured::HOSTS_4);
        let bytes = 256 << 20;
        let rails =
            |links| hierarchical_seconds(Algorithm::Ring, bytes, 2, 4, links, inside, across);
        let ratio = rails(1) / rails(4);
        assert!(
            (3.5..=4.0).contains(&ratio),
            "one NIC / four NICs = {ratio:.2}"
        );
        assert!(rails(2) < rails(1) && rails(4) < rails(2));
    }

    /// The tree's term puts it ahead of the other rails on 6 hosts × 2 ranks at 256 KiB (its
    /// window there is 128-512 KiB), where it measured 1.37× slower than hierarchical doubling
    /// (`docs/hierarchical.md`): `cheapest_on` leaves it out.
    #[test]
    fn the_tree_leads_the_model_on_6x2_at_256_kib_but_auto_leaves_it_out() {
        let fabric = hosts(6, 2);
        let (inside, across) = (inside_host_cost(fabric), between_hosts_cost(fabric));
        let rail = |between| hierarchical_seconds(between, 256 << 10, 6, 2, 1, inside, across);
        for other in [
            Algorithm::Ring,
            Algorithm::RecursiveDoubling,
            Algorithm::HalvingDoubling,
        ] {
            assert!(rail(Algorithm::Tree) < rail(other), "{other:?}");
        }
        assert_ne!(cheapest_on(256 << 10, fabric), Algorithm::HierTree);
    }

    /// The bound the hierarchy is built for, in the model: 2 hosts × 4 ranks, 256 MiB, the
    /// link between the hosts 30× slower than shared memory: the hierarchy takes about
    /// 1/1.75 of the flat ring's time (the boundary carries n instead of 1.75·n; a little
    /// more, as the flat ring's steps also reduce 7/8 of the buffer on every rank, where the
    /// rails' overlap the in-host phases and reduce 1/8).
    #[test]
    fn over_a_slow_link_the_model_approaches_the_boundary_bound() {
        let inside = measured::SHM_4;
        let across = LinkCost {
            alpha: 100e-6,
            beta: 1.0 / 0.08e9,
            gamma: inside.gamma,
        };
        let bytes = 256 << 20;
        let flat = allreduce_seconds(Algorithm::Ring, bytes, 8, across);
        let hier = hierarchical_seconds(Algorithm::Ring, bytes, 2, 4, 1, inside, across);
        let ratio = flat / hier;
        assert!(
            (1.6..1.77).contains(&ratio),
            "flat / hierarchical = {ratio:.3}"
        );
    }

    #[test]
    fn non_powers_of_two_pay_the_extra_exchanges() {
        let cost = measured::TCP_4;
        let five = allreduce_seconds(Algorithm::RecursiveDoubling, 1 << 20, 5, cost);
        let four = allreduce_seconds(Algorithm::RecursiveDoubling, 1 << 20, 4, cost);
        assert!(five > four);
        assert_eq!(allreduce_seconds(Algorithm::Ring, 1 << 20, 1, cost), 0.0);
    }

    /// Large allreduces of the two ranks of one host over TCP go over one connection per
    /// peer, and so does every small operation; everything else (mid sizes, other
    /// collectives, more ranks, other hosts, shared memory) keeps all of them.
    #[test]
    fn one_connection_for_small_operations_and_a_large_allreduce_between_two_ranks_of_one_host() {
        use crate::schedule::{Collective, connections_per_peer};
        use bcl_backends::ReduceOp;
        let allreduce = Collective::AllReduce { op: ReduceOp::Sum };
        let fabric = Fabric::flat;
        let pair = fabric(2, false, true);
        assert_eq!(
            connections_per_peer(allreduce, ONE_CONNECTION_FROM, pair),
            Some(1)
        );
        assert_eq!(connections_per_peer(allreduce, 256 << 20, pair), Some(1));
        assert_eq!(
            connections_per_peer(allreduce, ONE_CONNECTION_FROM - 1, pair),
            None
        );
        assert_eq!(connections_per_peer(allreduce, 16 << 20, pair), None);
        // Small operations: one connection, whatever the collective and the fabric.
        for small in [0, 8, ONE_CONNECTION_UP_TO] {
            for f in [pair, fabric(4, false, true), fabric(8, false, false)] {
                assert_eq!(
                    connections_per_peer(allreduce, small, f),
                    Some(1),
                    "{small} B"
                );
                assert_eq!(connections_per_peer(Collective::Barrier, small, f), Some(1));
            }
        }
        assert_eq!(
            connections_per_peer(allreduce, ONE_CONNECTION_UP_TO + 1, fabric(4, false, true)),
            None
        );
        for other in [
            fabric(4, false, true),
            fabric(2, false, false),
            fabric(2, true, true),
        ] {
            assert_eq!(
                connections_per_peer(allreduce, 256 << 20, other),
                None,
                "{other:?}"
            );
        }
        assert_eq!(
            connections_per_peer(Collective::AllGather, 256 << 20, pair),
            None
        );
    }
}
