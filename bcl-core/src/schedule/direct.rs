//! Direct exchanges: all-to-all (every pair at once), gather and scatter (the root and each
//! other rank), and point-to-point send/recv.

use super::plan::BufferId::{self, Input, Output, Scratch};
use super::plan::{Action, PlanBuilder, Region};
use super::ring::part;
use super::{AllToAllCounts, Layout, Reduction, copy_sliced};

fn each_slice(count: usize, slice: usize, mut f: impl FnMut(u32, usize, usize)) {
    let s_count = count.div_ceil(slice).max(1);
    for s in 0..s_count {
        let (o, l) = part(count, s_count, s);
        if l > 0 {
            f(s as u32, o, l);
        }
    }
}

/// Send `count` elements of `buffer` from `at` to `peer`, a message per slice.
fn send_block(
    b: &mut PlanBuilder,
    peer: usize,
    buffer: BufferId,
    at: usize,
    count: usize,
    slice: usize,
) {
    each_slice(count, slice, |tag, o, l| {
        b.push(Action::Send {
            peer,
            tag,
            from: Region::new(buffer, at + o, l),
            lend: false,
        });
    });
}

/// Receive `count` elements from `peer` into the output at `at`, a message per slice.
fn recv_block(b: &mut PlanBuilder, peer: usize, at: usize, count: usize, slice: usize) {
    each_slice(count, slice, |tag, o, l| {
        b.push(Action::Recv {
            peer,
            tag,
            into: Region::new(Output, at + o, l),
            reduce: false,
            seed: None,
        });
    });
}

/// Block j of my input goes to rank j, landing in its block `rank`. Peers are visited in
/// the order rank+1, rank+2, ... so that not every rank sends to rank 0 first.
pub(crate) fn all_to_all(
    b: &mut PlanBuilder,
    layout: &Layout,
    count: usize,
    in_place: bool,
    slice: usize,
) {
    let (n, rank) = (layout.world(), layout.rank());
    let source = if in_place {
        b.scratch(count * n);
        copy_sliced(b, Region::new(Output, 0, count * n), Scratch, 0, slice);
        Scratch
    } else {
        copy_sliced(
            b,
            Region::new(Input, rank * count, count),
            Output,
            rank * count,
            slice,
        );
        Input
    };
    for d in 1..n {
        let to = (rank + d) % n;
        let from = (rank + n - d) % n;
        send_block(b, to, source, to * count, count, slice);
        recv_block(b, from, from * count, count, slice);
    }
}

/// Gather: every rank but the root sends its `count` elements straight to the root, which
/// receives block j into `output[j*count..]`. The root's links carry (n-1)·count, the least
/// any schedule can, and nothing is relayed (a tree would relay to cut latency at many ranks;
/// torch and MPI users call gather with few ranks or small blocks). The root takes the blocks
/// in the order root+1, root+2, ... as they come. In place, the root's block is already at
/// `output[root*count..]` and a sender's data is its one buffer.
pub(crate) fn gather(
    b: &mut PlanBuilder,
    layout: &Layout,
    root: usize,
    count: usize,
    in_place: bool,
    slice: usize,
) {
    let (n, rank) = (layout.world(), layout.rank());
    if rank != root {
        let source = if in_place { Output } else { Input };
        send_block(b, root, source, 0, count, slice);
        return;
    }
    if !in_place {
        copy_sliced(b, Region::new(Input, 0, count), Output, root * count, slice);
    }
    for d in 1..n {
        let from = (root + d) % n;
        recv_block(b, from, from * count, count, slice);
    }
}

/// Scatter: the root sends block j of its buffer straight to rank j (gather's mirror, and
/// for the same reasons direct). In place, the root's buffer is its one buffer and its own
/// block stays at `root*count`.
pub(crate) fn scatter(
    b: &mut PlanBuilder,
    layout: &Layout,
    root: usize,
    count: usize,
    in_place: bool,
    slice: usize,
) {
    let (n, rank) = (layout.world(), layout.rank());
    if rank != root {
        recv_block(b, root, 0, count, slice);
        return;
    }
    let source = if in_place { Output } else { Input };
    for d in 1..n {
        let to = (root + d) % n;
        send_block(b, to, source, to * count, count, slice);
    }
    if !in_place {
        copy_sliced(b, Region::new(Input, root * count, count), Output, 0, slice);
    }
}

/// All-to-all with a count per pair: block j of the packed input (`counts.send[j]`
/// elements) goes to rank j, block j of the packed output comes from rank j. Peers in the
/// all-to-all's order (rank+1, rank+2, ...); the own block is a local copy.
pub(crate) fn all_to_all_v(
    b: &mut PlanBuilder,
    layout: &Layout,
    counts: &AllToAllCounts,
    slice: usize,
) {
    let (n, rank) = (layout.world(), layout.rank());
    let (sent_at, received_at) = (
        AllToAllCounts::offsets(&counts.send),
        AllToAllCounts::offsets(&counts.recv),
    );
    let own = counts.send[rank].min(counts.recv[rank]);
    copy_sliced(
        b,
        Region::new(Input, sent_at[rank], own),
        Output,
        received_at[rank],
        slice,
    );
    for d in 1..n {
        let to = (rank + d) % n;
        let from = (rank + n - d) % n;
        send_block(b, to, Input, sent_at[to], counts.send[to], slice);
        recv_block(b, from, received_at[from], counts.recv[from], slice);
    }
}

/// All-gather with a count per rank (`counts[r]` from rank r, packed in rank order in the
/// output): this rank's input goes straight to every peer, each peer's block straight into
/// its place. Direct rather than a ring: blocks of different sizes would leave a ring's
/// steps as slow as the largest block, and torch calls it for small, ragged blocks.
pub(crate) fn all_gather_v(b: &mut PlanBuilder, layout: &Layout, counts: &[usize], slice: usize) {
    let (n, rank) = (layout.world(), layout.rank());
    let at = AllToAllCounts::offsets(counts);
    copy_sliced(
        b,
        Region::new(Input, 0, counts[rank]),
        Output,
        at[rank],
        slice,
    );
    for d in 1..n {
        let to = (rank + d) % n;
        let from = (rank + n - d) % n;
        send_block(b, to, Input, 0, counts[rank], slice);
        recv_block(b, from, at[from], counts[from], slice);
    }
}

/// Reduce-scatter with a count per rank: block p of the packed input (`counts[p]`
/// elements) goes straight to rank p, which seeds its output with its own block and reduces
/// the others' into it as they come (one at a time per slice: the plan orders accesses to a
/// region), then divides once for an average.
pub(crate) fn reduce_scatter_v(
    b: &mut PlanBuilder,
    layout: &Layout,
    counts: &[usize],
    reduction: Reduction,
    slice: usize,
) {
    let (n, rank) = (layout.world(), layout.rank());
    let at = AllToAllCounts::offsets(counts);
    let mine = counts[rank];
    copy_sliced(b, Region::new(Input, at[rank], mine), Output, 0, slice);
    for d in 1..n {
        let to = (rank + d) % n;
        let from = (rank + n - d) % n;
        send_block(b, to, Input, at[to], counts[to], slice);
        each_slice(mine, slice, |tag, o, l| {
            b.push(Action::Recv {
                peer: from,
                tag,
                into: Region::new(Output, o, l),
                reduce: true,
                seed: None,
            });
        });
    }
    if reduction.average {
        each_slice(mine, slice, |_, o, l| {
            b.push(Action::Divide {
                region: Region::new(Output, o, l),
            });
        });
    }
}

pub(crate) fn send(b: &mut PlanBuilder, peer: usize, count: usize, slice: usize) {
    send_block(b, peer, Input, 0, count, slice);
}

pub(crate) fn recv(b: &mut PlanBuilder, peer: usize, count: usize, slice: usize) {
    recv_block(b, peer, 0, count, slice);
}
