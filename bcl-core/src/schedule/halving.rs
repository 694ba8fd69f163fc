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

/// Send `from` to `peer` and receive the same-sized pieces of `into` from it, under tags
/// `tag_base + piece`. `seed`: where `into` is set from before the first reduction.
#[allow(clippy::too_many_arguments)]
fn swap(
    b: &mut PlanBuilder,
    peer: usize,
    tag_base: u32,
    from: Option<Region>,
    into: Option<Region>,
    reduce: bool,
    seed: Option<BufferId>,
    slice: usize,
) {
    for (i, piece) in from.into_iter().flat_map(|r| pieces(r, slice)) {
        b.push(Action::Send {
            peer,
            tag: tag_base + i,
            from: piece,
        });
    }
    for (i, piece) in into.into_iter().flat_map(|r| pieces(r, slice)) {
        b.push(Action::Recv {
            peer,
            tag: tag_base + i,
            into: piece,
            reduce,
            seed: seed.map(|s| Region::new(s, piece.offset, piece.len)),
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
    let whole = |buffer| Region::new(buffer, 0, count);
    // Where this rank's own data is until its first reduction writes the output.
    let mut source = if in_place { Output } else { Input };
    if n == 1 {
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
        return;
    }
    if count == 0 {
        return;
    }
    let pairing = Pairing::new(n);
    let (q, k) = (pairing.q, pairing.q.trailing_zeros() as usize);
    // Tags: phase 0 the pairing, 1..=k halving, k+1..=2k doubling, 2k+1 the result's return;
    // within a phase, one per piece (at most `per_phase`).
    let per_phase = count.div_ceil(slice.max(1)).max(1) as u32;
    let tag = |phase: usize| phase as u32 * per_phase;
    let seed_of = |source: BufferId| (source == Input).then_some(Input);
    // The even rank of a pair hands its data over and gets the result back.
    let Some(me) = pairing.active(rank) else {
        swap(
            b,
            rank + 1,
            tag(0),
            Some(whole(source)),
            None,
            true,
            None,
            slice,
        );
        swap(
            b,
            rank + 1,
            tag(2 * k + 1),
            None,
            Some(whole(Output)),
            false,
            None,
            slice,
        );
        return;
    };
    // The odd rank of a pair takes over its even partner's data.
    if pairing.paired(rank) {
        swap(
            b,
            rank - 1,
            tag(0),
            None,
            Some(whole(Output)),
            true,
            seed_of(source),
            slice,
        );
        source = Output;
    }
    let (mut lo, mut hi) = (0, q);
    for step in 0..k {
        let mask = q >> (step + 1);
        let mid = (lo + hi) / 2;
        let (keep, give) = if me & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let (go, gl) = blocks(count, q, give.0, give.1);
        let (ko, kl) = blocks(count, q, keep.0, keep.1);
        swap(
            b,
            pairing.rank_of(me ^ mask),
            tag(1 + step),
            Some(Region::new(source, go, gl)),
            Some(Region::new(Output, ko, kl)),
            true,
            seed_of(source),
            slice,
        );
        source = Output;
        (lo, hi) = keep;
    }
    if reduction.average {
        let (o, l) = blocks(count, q, lo, hi);
        for (_, region) in pieces(Region::new(Output, o, l), slice) {
            b.push(Action::Divide { region });
        }
    }
    for step in 0..k {
        let mask = 1 << step;
        let width = hi - lo;
        let theirs = if me & mask == 0 {
            (hi, hi + width)
        } else {
            (lo - width, lo)
        };
        let (mo, ml) = blocks(count, q, lo, hi);
        let (to, tl) = blocks(count, q, theirs.0, theirs.1);
        swap(
            b,
            pairing.rank_of(me ^ mask),
            tag(1 + k + step),
            Some(Region::new(Output, mo, ml)),
            Some(Region::new(Output, to, tl)),
            false,
            None,
            slice,
        );
        (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
    }
    if pairing.paired(rank) {
        swap(
            b,
            rank - 1,
            tag(2 * k + 1),
            Some(whole(Output)),
            None,
            false,
            None,
            slice,
        );
    }
}
