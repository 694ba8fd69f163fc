//! Halving-doubling allreduce (Rabenseifner): a reduce-scatter by recursive halving, then an
//! allgather by recursive doubling. Each link carries 2(q-1)/q of the data, as in the ring,
//! but in 2·log2(q) steps instead of 2(n-1): the ring's bandwidth with fewer latencies.
//!
//! With q = 2^k active ranks, the buffer is cut into q blocks. Halving, at mask q/2, q/4, ..,
//! 1: each rank keeps the half of its current segment on its side of the mask bit, sends the
//! other half to rank XOR mask and reduces what comes back into the half it keeps; after k
//! steps active rank i holds block i fully reduced. Doubling then runs the masks upwards,
//! each rank swapping its segment for its partner's, until every rank holds every block.
//! With 4 ranks:
//!
//! ```text
//!   halving, mask 2: 0↔2, 1↔3 swap halves: 0,1 keep blocks 0-1, 2,3 keep blocks 2-3
//!   halving, mask 1: 0↔1, 2↔3 swap quarters: rank i keeps block i (all 4 terms)
//!   doubling, mask 1: 0↔1, 2↔3 swap blocks;  mask 2: 0↔2, 1↔3 swap halves
//! ```
//!
//! Other world sizes pair up first, as for recursive doubling ([`super::doubling`]): ranks
//! 0..2·rem (rem = n - q) hand the even one's buffer to the odd one above it, the q active
//! ranks run the steps, and each odd rank returns the result. Every message is cut into
//! slices of at most `slice` elements, so that large buffers pipeline and no message exceeds
//! what a transport takes.

use super::doubling::Pairing;
use super::plan::BufferId::{Input, Output};
use super::plan::{Action, BufferId, PlanBuilder, Region};
use super::ring::part;
use super::{Layout, Reduction};

/// `region` cut into pieces of at most `slice` elements, numbered, the empty ones left out
/// (both ends of a message compute the same pieces, so the numbers match as tags).
fn pieces(region: Region, slice: usize) -> impl Iterator<Item = (u32, Region)> {
    let n = region.len.div_ceil(slice.max(1)).max(1);
    (0..n).filter_map(move |i| {
        let (o, l) = part(region.len, n, i);
        (l > 0).then(|| (i as u32, Region::new(region.buffer, region.offset + o, l)))
    })
}

/// The element range (offset, len) of blocks `lo..hi` of `count` elements cut into `q`.
fn blocks(count: usize, q: usize, lo: usize, hi: usize) -> (usize, usize) {
    let start = part(count, q, lo).0;
    let end = if hi >= q { count } else { part(count, q, hi).0 };
    (start, end - start)
}

/// One exchange with a peer: `from` is sent, `into` received in the same pieces, under tags
/// `tag + piece`; `seed`: where `into` is set from before the first reduction.
struct Swap {
    peer: usize,
    tag: u32,
    from: Option<Region>,
    into: Option<Region>,
    reduce: bool,
    seed: Option<BufferId>,
}

impl Swap {
    fn push(self, b: &mut PlanBuilder, slice: usize) {
        for (i, piece) in self.from.into_iter().flat_map(|r| pieces(r, slice)) {
            b.push(Action::Send {
                peer: self.peer,
                tag: self.tag + i,
                from: piece,
                lend: false,
            });
        }
        for (i, piece) in self.into.into_iter().flat_map(|r| pieces(r, slice)) {
            b.push(Action::Recv {
                peer: self.peer,
                tag: self.tag + i,
                into: piece,
                reduce: self.reduce,
                seed: self.seed.map(|s| Region::new(s, piece.offset, piece.len)),
            });
        }
    }
}

/// What every phase of one rank's plan shares.
struct Phases {
    pairing: Pairing,
    /// Active ranks (a power of two), and log2 of it.
    q: usize,
    k: usize,
    count: usize,
    slice: usize,
    /// Tags a phase may use: one per piece.
    per_phase: u32,
}

impl Phases {
    /// The first tag of `phase`: 0 the pairing, 1..=k halving, k+1..=2k doubling, 2k+1 the
    /// result's return.
    fn tag(&self, phase: usize) -> u32 {
        phase as u32 * self.per_phase
    }

    fn whole(&self, buffer: BufferId) -> Region {
        Region::new(buffer, 0, self.count)
    }

    fn blocks(&self, range: (usize, usize)) -> (usize, usize) {
        blocks(self.count, self.q, range.0, range.1)
    }

    /// Reduce-scatter by recursive halving: active rank `me` ends holding its block (the
    /// returned block range) fully reduced in `Output`.
    fn halve(&self, b: &mut PlanBuilder, me: usize, mut source: BufferId) -> (usize, usize) {
        let (mut lo, mut hi) = (0, self.q);
        for step in 0..self.k {
            let mask = self.q >> (step + 1);
            let mid = (lo + hi) / 2;
            let (keep, give) = if me & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let ((go, gl), (ko, kl)) = (self.blocks(give), self.blocks(keep));
            Swap {
                peer: self.pairing.rank_of(me ^ mask),
                tag: self.tag(1 + step),
                from: Some(Region::new(source, go, gl)),
                into: Some(Region::new(Output, ko, kl)),
                reduce: true,
                seed: (source == Input).then_some(Input),
            }
            .push(b, self.slice);
            source = Output;
            (lo, hi) = keep;
        }
        (lo, hi)
    }

    /// Allgather by recursive doubling, from block range `lo..hi` held by active rank `me`.
    fn double(&self, b: &mut PlanBuilder, me: usize, (mut lo, mut hi): (usize, usize)) {
        for step in 0..self.k {
            let mask = 1 << step;
            let width = hi - lo;
            let theirs = if me & mask == 0 {
                (hi, hi + width)
            } else {
                (lo - width, lo)
            };
            let ((mo, ml), (to, tl)) = (self.blocks((lo, hi)), self.blocks(theirs));
            Swap {
                peer: self.pairing.rank_of(me ^ mask),
                tag: self.tag(1 + self.k + step),
                from: Some(Region::new(Output, mo, ml)),
                into: Some(Region::new(Output, to, tl)),
                reduce: false,
                seed: None,
            }
            .push(b, self.slice);
            (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
        }
    }
}

/// One rank alone: the output is the input (divided by one, for avg).
fn alone(b: &mut PlanBuilder, count: usize, in_place: bool, reduction: Reduction) {
    let whole = |buffer| Region::new(buffer, 0, count);
    if !in_place {
        b.push(Action::Copy {
            from: whole(Input),
            to: whole(Output),
        });
    }
    if reduction.average {
        b.push(Action::Divide {
            region: whole(Output),
        });
    }
}

pub(crate) fn allreduce(
    b: &mut PlanBuilder,
    layout: &Layout,
    count: usize,
    in_place: bool,
    reduction: Reduction,
    slice: usize,
) {
    let (n, rank) = (layout.world(), layout.rank());
    if n == 1 {
        return alone(b, count, in_place, reduction);
    }
    if count == 0 {
        return;
    }
    let pairing = Pairing::new(n);
    let phases = Phases {
        q: pairing.q,
        k: pairing.q.trailing_zeros() as usize,
        pairing,
        count,
        slice,
        per_phase: count.div_ceil(slice.max(1)).max(1) as u32,
    };
    // Where this rank's own data is until its first reduction writes the output.
    let source = if in_place { Output } else { Input };
    let exchange = |peer, phase, from, into, reduce, seed| Swap {
        peer,
        tag: phases.tag(phase),
        from,
        into,
        reduce,
        seed,
    };
    let result_phase = 2 * phases.k + 1;
    // The even rank of a pair hands its data over and gets the result back.
    let Some(me) = phases.pairing.active(rank) else {
        exchange(rank + 1, 0, Some(phases.whole(source)), None, true, None).push(b, slice);
        exchange(
            rank + 1,
            result_phase,
            None,
            Some(phases.whole(Output)),
            false,
            None,
        )
        .push(b, slice);
        return;
    };
    // The odd rank of a pair takes over its even partner's data.
    let paired = phases.pairing.paired(rank);
    let source = if paired {
        let seed = (source == Input).then_some(Input);
        exchange(rank - 1, 0, None, Some(phases.whole(Output)), true, seed).push(b, slice);
        Output
    } else {
        source
    };
    let mine = phases.halve(b, me, source);
    if reduction.average {
        let (o, l) = phases.blocks(mine);
        for (_, region) in pieces(Region::new(Output, o, l), slice) {
            b.push(Action::Divide { region });
        }
    }
    phases.double(b, me, mine);
    if paired {
        exchange(
            rank - 1,
            result_phase,
            Some(phases.whole(Output)),
            None,
            false,
            None,
        )
        .push(b, slice);
    }
}
