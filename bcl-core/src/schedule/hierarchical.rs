//! Hierarchical collectives: the ranks of a host work together over their local links (shared
//! memory), and only a few messages cross between hosts, where the links are slow.
//!
//! Allreduce, in three phases over the buffer cut into `L` parts (`L` the rank count of the
//! largest host), as NCCL's intra-node-first algorithms, HCCL's hierarchical ones and FlagCX's
//! planner for mixed vendors do:
//!
//! ```text
//!   host A: a0 a1 a2 a3        1. inside each host, part j is reduced onto its owner
//!   host B: b0 b1 b2 b3           (local rank j): every rank sends the parts it does not own
//!                                 straight to their owners, one step over shared memory;
//!   rail j: aj ── bj           2. the owners of part j on every host (rail j) allreduce it
//!                                 between hosts: ring, recursive doubling or halving-doubling;
//!                              3. inside each host, each owner sends its reduced part to the
//!                                 others.
//! ```
//!
//! Each rank's network path carries 1/L of the data; a host's boundary carries 2(H−1)/H·n per
//! direction for H hosts, where each edge of the flat ring that crosses it carries
//! 2(p−1)/p·n (2 hosts × 4 ranks: n against 1.75·n).
//!
//! Small messages (a share below [`SMALL_SHARE`] elements or one slice) take one part: one
//! rail, the first rank of each host, as NCCL's tree does (reduce onto it, across, back).
//!
//! Uneven hosts (3 + 1, 2 + 2 + 1): on a host of `l < L` ranks, local rank i owns parts
//! `[i·L/l, (i+1)·L/l)`; each part is reduced by its own rail (a rank of a small host sits on
//! several rails).
//!
//! Ranks of different speeds ([`Layout::weight`]: their devices' reduce throughput), on hosts
//! of equal size: part j is sized in proportion to the slowest of its owners (local rank j of
//! every host), since it reduces (l−1) contributions to it and the others wait for it.
//!
//! Broadcast: a chain between one rank per host (the root on its host, the first rank on
//! the others), then a chain inside each host from that rank. Reduce: the same backwards.
//!
//! Phases and rails are sub-plans of the flat algorithms built on a sub-layout and embedded
//! ([`embed`]): peers mapped to the members' ranks, tags moved to the phase's own range,
//! regions to where the phase works. The builder adds the hazards between phases, so a slice
//! reduced in phase 1 goes on in phase 2 while later slices are still arriving.

use super::plan::BufferId::{Input, Output, Scratch};
use super::plan::{Action, BufferId, Plan, PlanBuilder, Region};
use super::ring::{part, part_of};
use super::{Algorithm, Collective, Layout, Reduction, build_plan};
use bcl_backends::ReduceOp;

/// Rails and the second phase of rooted collectives use tags from `(index + 1) << RAIL_SHIFT`;
/// the in-host phases of allreduce use tags below `RESULT_TAGS` and `2 · RESULT_TAGS`.
const RAIL_SHIFT: u32 = 24;
const RESULT_TAGS: u32 = 1 << 22;
/// Segments (and so rails) of one allreduce at most, so that every rail's tags fit in u32.
const MAX_SEGMENTS: usize = 250;

/// Whether the hierarchical plans fit their tag ranges for this call. Every rank computes the
/// same answer (from the layout's hosts, the count, the slice size and `rails`: the algorithm
/// between hosts of an allreduce, `None` for the other collectives); where it is false the
/// flat ring runs instead.
pub(crate) fn plannable(
    layout: &Layout,
    count: usize,
    slice: usize,
    rails: Option<Algorithm>,
) -> bool {
    let hosts = layout.hosts().len();
    let slices = count.div_ceil(slice.max(1)) + MAX_SEGMENTS;
    // Tags per slice of a flat plan among h ranks: doubling and halving 2·⌈log2 h⌉ + 2 at
    // most; a ring 2(h−1), and fewer than 2(h + 1) for the rest. Bounding every rail by the
    // ring's sent 1 GiB on 12500 hosts (100k ranks) to the flat ring.
    let per_slice = match rails {
        Some(Algorithm::HalvingDoubling | Algorithm::RecursiveDoubling) => {
            2 * hosts.next_power_of_two().trailing_zeros() as usize + 2
        }
        _ => 2usize.saturating_mul(hosts + 1),
    };
    let rail_tags = per_slice.saturating_mul(slices);
    layout.largest_host() <= MAX_SEGMENTS
        && slices < RESULT_TAGS as usize
        && rail_tags < (1 << RAIL_SHIFT)
}

/// A part of the buffer and its owners: one rank of each host.
struct Segment {
    offset: usize,
    len: usize,
    /// Which part it is, of how many: on a host of `l` ranks part j is owned by local rank
    /// j·l/parts ([`Segment::owner`]).
    part: usize,
    parts: usize,
}

impl Segment {
    /// The owner's rank on `host`, found from the host's own ranks only: a plan reads the
    /// hosts of its rails, not every host (a 100k-rank simulation builds 100k plans).
    fn owner(&self, layout: &Layout, host: usize) -> usize {
        let ranks = &layout.hosts()[host];
        ranks[self.part * ranks.len() / self.parts]
    }
}

/// Below this many elements per share (or one slice, if smaller) an allreduce runs one rail
/// (the first rank of each host): a step between hosts costs its α whatever its size, and
/// where a host runs more ranks than cores, the fewer ranks on the network the sooner each
/// gets a core.
const SMALL_SHARE: usize = 1024;

fn segments(layout: &Layout, count: usize, slice: usize) -> Vec<Segment> {
    let largest = layout.largest_host();
    let parts = if count < largest * SMALL_SHARE.min(slice) {
        1
    } else {
        largest
    };
    let bounds = match part_weights(layout, parts) {
        Some(weights) => weighted_parts(count, &weights),
        None => (0..parts).map(|j| part(count, parts, j)).collect(),
    };
    // One segment per part: the largest host gives each part to another of its ranks, so no
    // two parts share every owner.
    (bounds.into_iter().enumerate())
        .map(|(part, (offset, len))| Segment {
            offset,
            len,
            part,
            parts,
        })
        .collect()
}

/// The weight of each part where ranks differ in speed ([`Layout::weight`]) and every host
/// has `parts` ranks: part j is reduced by local rank j of every host and waits for the
/// slowest of them, so it weighs that one's speed. `None`: equal parts.
fn part_weights(layout: &Layout, parts: usize) -> Option<Vec<u64>> {
    let hosts = layout.hosts();
    // No weights: every rank alike, equal parts.
    if parts < 2 || !layout.weighted() || layout.host_sizes() != [parts] {
        return None;
    }
    // Host by host: each host's ranks are read once.
    let mut weights = vec![u64::MAX; parts];
    for h in hosts {
        for (w, &r) in weights.iter_mut().zip(h) {
            *w = (*w).min(u64::from(layout.weight(r)));
        }
    }
    weights.iter().any(|&w| w != weights[0]).then_some(weights)
}

/// `count` elements cut into parts in proportion to `weights` (integer arithmetic, so every
/// rank cuts alike).
fn weighted_parts(count: usize, weights: &[u64]) -> Vec<(usize, usize)> {
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum::<u128>().max(1);
    let mut below = 0u128;
    let bound = |below: u128| (count as u128 * below / total) as usize;
    weights
        .iter()
        .map(|&w| {
            let start = bound(below);
            below += u128::from(w);
            (start, bound(below) - start)
        })
        .collect()
}

/// The (offset, len) slices of `len` elements from `offset`, at most `slice` each.
fn slices(offset: usize, len: usize, slice: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = len.div_ceil(slice.max(1)).max(1);
    (0..n).map(move |s| {
        let (o, l) = part(len, n, s);
        (offset + o, l)
    })
}

/// Where an embedded sub-plan's buffers lie in the outer plan.
#[derive(Clone, Copy)]
struct Place {
    /// The outer buffer and offset of the sub-plan's `Output` (and `Input`, if it uses one).
    output: (BufferId, usize),
    input: (BufferId, usize),
    /// The offset in the outer scratch of the sub-plan's scratch.
    scratch_at: usize,
}

impl Place {
    fn at(buffer: BufferId, offset: usize, scratch_at: usize) -> Self {
        Place {
            output: (buffer, offset),
            input: (Input, offset),
            scratch_at,
        }
    }

    fn map(&self, r: Region) -> Region {
        let (buffer, base) = match r.buffer {
            Output => self.output,
            Input => self.input,
            Scratch => (Scratch, self.scratch_at),
        };
        Region::new(buffer, base + r.offset, r.len)
    }
}

/// Append `sub` (a plan among members, sub-rank i being rank `member(i)`) to `b`: peers
/// mapped, tags moved up by `tag_base`, regions placed by `place`. The sub-plan's own
/// dependencies are kept; the builder adds the hazards with the outer plan's steps.
fn embed(
    b: &mut PlanBuilder,
    sub: &Plan,
    member: impl Fn(usize) -> usize,
    tag_base: u32,
    place: Place,
) {
    let first = b.next_index();
    b.scratch(place.scratch_at + sub.scratch_elems);
    let mut after = Vec::new();
    for step in &sub.steps {
        let action = match &step.action {
            Action::Send {
                peer,
                tag,
                from,
                lend,
            } => Action::Send {
                peer: member(*peer),
                tag: tag_base + tag,
                from: place.map(*from),
                lend: *lend,
            },
            Action::Recv {
                peer,
                tag,
                into,
                reduce,
                seed,
            } => Action::Recv {
                peer: member(*peer),
                tag: tag_base + tag,
                into: place.map(*into),
                reduce: *reduce,
                seed: seed.map(|s| place.map(s)),
            },
            Action::Copy { from, to } => Action::Copy {
                from: place.map(*from),
                to: place.map(*to),
            },
            Action::Divide { region } => Action::Divide {
                region: place.map(*region),
            },
        };
        after.clear();
        after.extend(step.deps.iter().map(|d| first + d));
        b.push_after(action, &after);
    }
}

/// The plan of a flat collective among `members` for the member at `index`.
fn sub_plan(
    collective: Collective,
    algorithm: Algorithm,
    index: usize,
    members: usize,
    count: usize,
    in_place: bool,
    slice: usize,
) -> Plan {
    build_plan(
        collective,
        algorithm,
        &Layout::linear(index, members),
        count,
        in_place,
        slice,
    )
}

pub(crate) fn allreduce(
    b: &mut PlanBuilder,
    layout: &Layout,
    count: usize,
    in_place: bool,
    reduction: Reduction,
    between: Algorithm,
    slice: usize,
) {
    let me = layout.rank();
    let host = layout.host_of(me);
    let local = &layout.hosts()[host];
    let segs = segments(layout, count, slice);
    let source = source(in_place);

    // 1. Each part onto its owner in this host, the owner's own contribution as the seed.
    // The steps go in the order the rails will want them (`phase_one_order`), so the link
    // between hosts has work from the start; each local rank starts with the next rank's
    // part and each owner reduces its senders in the order they send to it, so the owners are
    // not all fed one after another in the same order (a rank's plan is its neighbour's
    // turned by one, which lets the simulator run one rank per host for all).
    let hosts = layout.hosts().len();
    let position = local.iter().position(|&r| r == me).unwrap_or(0);
    for (tag, at, len, seg) in phase_one_order(layout, &segs, host, position, between, slice) {
        let owner = segs[seg].owner(layout, host);
        if len > 0 && me == owner {
            let mut seed = (!in_place).then(|| Region::new(Input, at, len));
            if local.len() == 1 && !in_place {
                b.push(Action::Copy {
                    from: Region::new(Input, at, len),
                    to: Region::new(Output, at, len),
                });
            }
            for peer in turned(local, position) {
                b.push(Action::Recv {
                    peer,
                    tag,
                    into: Region::new(Output, at, len),
                    reduce: true,
                    seed: seed.take(),
                });
            }
        } else if len > 0 {
            // Lent: the owner copies the slice out of this rank's memory as it reduces it,
            // and this rank's core is spared the copy into the ring (measured faster on 2 × 4
            // namespace hosts: docs/hierarchical.md). Phase 3 lends only on one host.
            b.push(Action::Send {
                peer: owner,
                tag,
                from: Region::new(source, at, len),
                lend: true,
            });
        }
    }

    // 2. Each owned segment between hosts, over its rail.
    let mut scratch_at = 0;
    for (index, seg) in segs.iter().enumerate() {
        if seg.owner(layout, host) != me || seg.len == 0 {
            continue;
        }
        if hosts > 1 {
            let sum = Collective::AllReduce { op: ReduceOp::Sum };
            let rail = sub_plan(sum, between, host, hosts, seg.len, true, slice);
            let tag_base = ((index + 1) as u32) << RAIL_SHIFT;
            embed(
                b,
                &rail,
                |h| seg.owner(layout, h),
                tag_base,
                Place::at(Output, seg.offset, scratch_at),
            );
            scratch_at += rail.scratch_elems;
        }
        if reduction.average {
            for (at, len) in slices(seg.offset, seg.len, slice) {
                b.push(Action::Divide {
                    region: Region::new(Output, at, len),
                });
            }
        }
    }

    // 3. Each owner's result to the rest of its host. On one host it is lent: each peer
    // copies it straight out of the owner's output, one copy instead of two through the
    // ring (3-8 ranks over shared memory, 256 KiB-256 MiB: docs/single-copy.md). Between
    // hosts the rails bound the time, and lending phase 3 measured no faster on 2 × 4
    // namespace hosts (docs/hierarchical.md): it stays in the ring there.
    // Segments from this rank's own, each owner sending to the rank before it first: the
    // first segment a rank waits for is the first its owner sends it.
    let tags = owner_tags(layout, &segs, host, slice);
    for k in 0..segs.len() {
        let index = (k + position) % segs.len();
        let seg = &segs[index];
        let owner = seg.owner(layout, host);
        let slices = slices(seg.offset, seg.len, slice);
        for ((at, len), tag) in slices.zip(tags[index]..) {
            let region = Region::new(Output, at, len);
            let tag = RESULT_TAGS + tag;
            if len > 0 && me == owner {
                for peer in turned(local, position) {
                    b.push(Action::Send {
                        peer,
                        tag,
                        from: region,
                        lend: hosts == 1,
                    });
                }
            } else if len > 0 {
                b.push(Action::Recv {
                    peer: owner,
                    tag,
                    into: region,
                    reduce: false,
                    seed: None,
                });
            }
        }
    }
}

/// The ranks of `local` other than the one at `position`, from the one before it backwards.
fn turned(local: &[usize], position: usize) -> impl Iterator<Item = usize> + '_ {
    let m = local.len();
    (1..m).map(move |k| local[(position + m - k) % m])
}

/// The first tag of each segment's slices: slices are numbered per owner on `host`, segment
/// by segment, so a tag names the same slice on every host's ranks that share an owner's
/// place (a plan turned from one local rank to the next keeps its tags).
fn owner_tags(layout: &Layout, segs: &[Segment], host: usize, slice: usize) -> Vec<u32> {
    let mut next: Vec<(usize, u32)> = Vec::new();
    segs.iter()
        .map(|seg| {
            let owner = seg.owner(layout, host);
            let n = slices(seg.offset, seg.len, slice).count() as u32;
            match next.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, t)) => {
                    *t += n;
                    *t - n
                }
                None => {
                    next.push((owner, n));
                    0
                }
            }
        })
        .collect()
}

/// The slices of phase 1 as (tag, offset, len, segment), in the order a host sends them.
/// A ring rail at host position h first sends chunk h−1 of its segment, then h−2, ...: its
/// host reduces the slices of those chunks first (in segment order otherwise the rail at
/// position 0 of 2 would wait for the second half while the link idled), the segments
/// interleaved so that every rail starts early. Doubling rails need the whole segment
/// first and take the plain order.
fn phase_one_order(
    layout: &Layout,
    segs: &[Segment],
    host: usize,
    position: usize,
    between: Algorithm,
    slice: usize,
) -> Vec<(u32, usize, usize, usize)> {
    let hosts = layout.hosts().len();
    let mut out = Vec::new();
    let tags = owner_tags(layout, segs, host, slice);
    for (index, seg) in segs.iter().enumerate() {
        // From this rank's own segment on (position mod the segments, on uneven hosts).
        let turn = (index + segs.len() - position % segs.len()) % segs.len();
        for (i, (at, len)) in slices(seg.offset, seg.len, slice).enumerate() {
            let wanted = match between {
                Algorithm::Ring => {
                    let chunk = part_of(seg.len, hosts, at - seg.offset);
                    (host + 2 * hosts - 1 - chunk) % hosts
                }
                _ => 0,
            };
            out.push(((wanted, i, turn), (tags[index] + i as u32, at, len, index)));
        }
    }
    out.sort_by_key(|(key, _)| *key);
    out.into_iter().map(|(_, slice)| slice).collect()
}

/// Where a rank stands in a rooted hierarchical collective.
struct Rooted<'a> {
    me: usize,
    host: usize,
    /// The ranks of this rank's host, and this rank's index among them.
    local: &'a [usize],
    index: usize,
    /// The rank of each host that talks to the other hosts: `root` on its own, the first
    /// rank of the others; this host's, and its index among `local`.
    leaders: Vec<usize>,
    leader: usize,
    leader_index: usize,
}

fn rooted(layout: &Layout, root: usize) -> Rooted<'_> {
    let me = layout.rank();
    let host = layout.host_of(me);
    let local = layout.hosts()[host].as_slice();
    let root_host = layout.host_of(root);
    let leaders: Vec<usize> = (layout.hosts().iter().enumerate())
        .map(|(h, ranks)| if h == root_host { root } else { ranks[0] })
        .collect();
    let leader = leaders[host];
    let at = |rank| local.iter().position(|&r| r == rank).unwrap_or(0);
    Rooted {
        me,
        host,
        local,
        index: at(me),
        leaders,
        leader,
        leader_index: at(leader),
    }
}

pub(crate) fn broadcast(
    b: &mut PlanBuilder,
    layout: &Layout,
    root: usize,
    count: usize,
    in_place: bool,
    slice: usize,
) {
    let r = rooted(layout, root);
    let chain = |root, index, members, in_place| {
        let collective = Collective::Broadcast { root };
        sub_plan(
            collective,
            Algorithm::Ring,
            index,
            members,
            count,
            in_place,
            slice,
        )
    };
    // Between hosts: a chain of leaders from the root (the root copies its input to its
    // output on the way, out of place).
    if r.me == r.leader {
        let sub = chain(layout.host_of(root), r.host, r.leaders.len(), in_place);
        embed(b, &sub, |i| r.leaders[i], 0, Place::at(Output, 0, 0));
    }
    // Inside the host: a chain from its leader, whose output holds the data by now.
    let sub = chain(r.leader_index, r.index, r.local.len(), true);
    embed(
        b,
        &sub,
        |i| r.local[i],
        1 << RAIL_SHIFT,
        Place::at(Output, 0, 0),
    );
}

pub(crate) fn reduce(
    b: &mut PlanBuilder,
    layout: &Layout,
    root: usize,
    count: usize,
    in_place: bool,
    reduction: Reduction,
    slice: usize,
) {
    let r = rooted(layout, root);
    let chain = |root, index, members, in_place| {
        let collective = Collective::Reduce {
            op: ReduceOp::Sum,
            root,
        };
        sub_plan(
            collective,
            Algorithm::Ring,
            index,
            members,
            count,
            in_place,
            slice,
        )
    };
    // Out of place, only the root has an output: a leader elsewhere gathers its host's sum in
    // scratch (the first `count` elements; the sub-plans' own scratch after it).
    let acc = if r.me == root || in_place {
        Output
    } else {
        b.scratch(count);
        Scratch
    };
    let sub = chain(r.leader_index, r.index, r.local.len(), in_place);
    let place = Place {
        output: (
            if r.me == r.leader {
                acc
            } else {
                source(in_place)
            },
            0,
        ),
        input: (Input, 0),
        scratch_at: count,
    };
    embed(b, &sub, |i| r.local[i], 0, place);
    if r.me == r.leader {
        let sub = chain(layout.host_of(root), r.host, r.leaders.len(), true);
        embed(
            b,
            &sub,
            |i| r.leaders[i],
            1 << RAIL_SHIFT,
            Place::at(acc, 0, 2 * count),
        );
    }
    if r.me == root && reduction.average {
        for (at, len) in slices(0, count, slice) {
            b.push(Action::Divide {
                region: Region::new(Output, at, len),
            });
        }
    }
}

/// Whether the per-block tags of [`reduce_scatter`] and [`all_gather`] fit their range.
pub(crate) fn blocks_plannable(layout: &Layout, count: usize, slice: usize) -> bool {
    let per_block = count.div_ceil(slice.max(1)).max(1);
    layout.world().saturating_mul(per_block) < RESULT_TAGS as usize
}

/// The rank of `host` that gathers block `b` (the block of rank `b`) there: the one with the
/// same local index as `b` on its own host (modulo the host's size), so that on `b`'s host
/// it is `b` itself, and between two hosts of equal size each rank talks to one rank only.
fn block_owner(layout: &Layout, host: usize, b: usize) -> usize {
    let own = &layout.hosts()[layout.host_of(b)];
    let index = own.iter().position(|&r| r == b).unwrap_or(0);
    let ranks = &layout.hosts()[host];
    ranks[index % ranks.len()]
}

/// The (offset, len, tag) of each slice of block `b` of `count` elements.
fn block_slices(b: usize, count: usize, slice: usize) -> impl Iterator<Item = (usize, usize, u32)> {
    let per_block = count.div_ceil(slice.max(1)).max(1);
    slices(b * count, count, slice)
        .enumerate()
        .map(move |(s, (at, len))| (at, len, (b * per_block + s) as u32))
}

/// Hierarchical reduce-scatter: inside each host, block b (rank b's result) is reduced onto
/// its owner there ([`block_owner`]); each owner on another host sends its host's partial
/// of b to rank b, which adds them. A host's boundary carries (H−1)/H of the data per
/// direction where the flat ring's crossing edges carry (p−1)/p.
pub(crate) fn reduce_scatter(
    b: &mut PlanBuilder,
    layout: &Layout,
    count: usize,
    in_place: bool,
    reduction: Reduction,
    slice: usize,
) {
    let me = layout.rank();
    let host = layout.host_of(me);
    let local = &layout.hosts()[host];
    let world = layout.world();
    let source = source(in_place);
    let home = if in_place { me * count } else { 0 };
    let mut scratch_used = false;
    for block in 0..world {
        let owner = block_owner(layout, host, block);
        let others: Vec<usize> = (0..layout.hosts().len())
            .filter(|&h| h != host)
            .map(|h| block_owner(layout, h, block))
            .collect();
        for (at, len, tag) in block_slices(block, count, slice) {
            if len == 0 {
                continue;
            }
            let from = Region::new(source, at, len);
            if me != owner {
                b.push(Action::Send {
                    peer: owner,
                    tag,
                    from,
                    lend: false,
                });
                continue;
            }
            // This rank gathers the block: into its output for its own block, else scratch.
            let acc = if block == me {
                Region::new(Output, home + at - block * count, len)
            } else {
                scratch_used = true;
                Region::new(Scratch, at, len)
            };
            let mut seed = (!in_place || block != me).then_some(from);
            let mut received = false;
            let recv = |b: &mut PlanBuilder, peer, tag, seed: &mut Option<Region>| {
                b.push(Action::Recv {
                    peer,
                    tag,
                    into: acc,
                    reduce: true,
                    seed: seed.take(),
                });
            };
            for &peer in local.iter().filter(|&&r| r != me) {
                recv(b, peer, tag, &mut seed);
                received = true;
            }
            if block == me {
                for &peer in &others {
                    recv(b, peer, tag + (1 << RAIL_SHIFT), &mut seed);
                }
                if let Some(from) = seed {
                    b.push(Action::Copy { from, to: acc });
                }
                if reduction.average {
                    b.push(Action::Divide { region: acc });
                }
            } else if layout.host_of(block) != host {
                let from = if received { acc } else { from };
                b.push(Action::Send {
                    peer: block,
                    tag: tag + (1 << RAIL_SHIFT),
                    from,
                    lend: false,
                });
            }
        }
    }
    if scratch_used {
        b.scratch(world * count);
    }
}

/// Hierarchical allgather, reduce-scatter's mirror: each rank sends its block to its owner
/// on every other host, and each owner passes the blocks it holds (its own among them) to
/// the rest of its host.
pub(crate) fn all_gather(
    b: &mut PlanBuilder,
    layout: &Layout,
    count: usize,
    in_place: bool,
    slice: usize,
) {
    let me = layout.rank();
    let host = layout.host_of(me);
    let local = &layout.hosts()[host];
    if !in_place {
        for (at, len, _) in block_slices(me, count, slice) {
            b.push(Action::Copy {
                from: Region::new(Input, at - me * count, len),
                to: Region::new(Output, at, len),
            });
        }
    }
    for block in 0..layout.world() {
        let owner = block_owner(layout, host, block);
        for (at, len, tag) in block_slices(block, count, slice) {
            if len == 0 {
                continue;
            }
            let region = Region::new(Output, at, len);
            if block == me {
                for h in (0..layout.hosts().len()).filter(|&h| h != host) {
                    let peer = block_owner(layout, h, block);
                    b.push(Action::Send {
                        peer,
                        tag,
                        from: region,
                        lend: false,
                    });
                }
            } else if me == owner {
                b.push(Action::Recv {
                    peer: block,
                    tag,
                    into: region,
                    reduce: false,
                    seed: None,
                });
            }
            if me == owner {
                for &peer in local.iter().filter(|&&r| r != me) {
                    b.push(Action::Send {
                        peer,
                        tag: tag + (1 << RAIL_SHIFT),
                        from: region,
                        lend: false,
                    });
                }
            } else {
                b.push(Action::Recv {
                    peer: owner,
                    tag: tag + (1 << RAIL_SHIFT),
                    into: region,
                    reduce: false,
                    seed: None,
                });
            }
        }
    }
}

/// Where a rank's own contribution is.
fn source(in_place: bool) -> BufferId {
    if in_place { Output } else { Input }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(hosts: usize, per_host: usize) -> Layout {
        let n = hosts * per_host;
        let groups = (0..hosts)
            .map(|h| (h * per_host..(h + 1) * per_host).collect())
            .collect();
        (Layout::new(0, (0..n).collect()).and_then(|l| l.with_hosts(groups))).expect("a layout")
    }

    #[test]
    fn rails_of_halving_and_doubling_fit_where_a_rings_would_not() {
        // 100k ranks on hosts of 8, 1 GiB of f32 in 512 KiB slices: a ring rail would need
        // 2·12499·2048 tags, halving-doubling 2·14 + 2 per slice.
        let big = layout(12500, 8);
        let (count, slice) = (1 << 28, 1 << 17);
        assert!(!plannable(&big, count, slice, Some(Algorithm::Ring)));
        assert!(!plannable(&big, count, slice, None));
        for rails in [Algorithm::HalvingDoubling, Algorithm::RecursiveDoubling] {
            assert!(plannable(&big, count, slice, Some(rails)), "{rails:?}");
        }
        // Every rail's tags stay in its own range: those of rank 0's rail (segment 0).
        let sum = Collective::AllReduce { op: ReduceOp::Sum };
        let plan = build_plan(sum, Algorithm::HierHalving, &big, count, true, slice);
        let rail = (1u32 << RAIL_SHIFT)..(2u32 << RAIL_SHIFT);
        let mut between = 0;
        for step in &plan.steps {
            let (peer, tag) = match step.action {
                Action::Send { peer, tag, .. } | Action::Recv { peer, tag, .. } => (peer, tag),
                _ => continue,
            };
            if big.host_of(peer) != 0 {
                between += 1;
                assert!(rail.contains(&tag), "tag {tag:#x} to rank {peer}");
            }
        }
        assert!(between > 0, "no step between hosts: the flat ring ran");
        // Small enough for a ring rail: unchanged.
        assert!(plannable(
            &layout(4, 8),
            count,
            slice,
            Some(Algorithm::Ring)
        ));
    }

    #[test]
    fn each_part_is_a_segment_owned_as_its_hosts_cut_it() {
        // Uneven hosts (a small host's rank owns several parts) and even ones.
        let shapes: [&[usize]; 6] = [&[3, 1], &[2, 2, 1], &[4, 4], &[3, 5, 2], &[8, 1, 8], &[1]];
        for sizes in shapes {
            let mut next = 0;
            let hosts: Vec<Vec<usize>> = (sizes.iter())
                .map(|&l| {
                    next += l;
                    (next - l..next).collect()
                })
                .collect();
            let layout = (Layout::new(0, (0..next).collect()).and_then(|l| l.with_hosts(hosts)))
                .expect("a layout");
            let largest = *sizes.iter().max().expect("a host");
            let count = largest * SMALL_SHARE * 3 + 1;
            let segs = segments(&layout, count, count);
            assert_eq!(segs.len(), largest, "{sizes:?}");
            // Brute force: the owner of part j on each host, read from the host's ranks.
            let owners = |j: usize| -> Vec<usize> {
                (layout.hosts().iter())
                    .map(|h| h[j * h.len() / largest])
                    .collect()
            };
            for (j, seg) in segs.iter().enumerate() {
                assert_eq!((seg.offset, seg.len), part(count, largest, j), "{sizes:?}");
                let mine: Vec<usize> = (0..sizes.len()).map(|h| seg.owner(&layout, h)).collect();
                assert_eq!(owners(j), mine, "{sizes:?}: part {j}");
                // No two parts share every owner (so none could be one segment).
                if j > 0 {
                    assert_ne!(owners(j - 1), mine, "{sizes:?}: parts {} and {j}", j - 1);
                }
            }
        }
        // Below the small share: one part, the first rank of each host.
        let small = segments(&layout(3, 4), 7, 1 << 20);
        assert_eq!(small.len(), 1);
        assert_eq!(
            (0..3)
                .map(|h| small[0].owner(&layout(3, 4), h))
                .collect::<Vec<_>>(),
            [0, 4, 8]
        );
    }
}
