//! Pipelined chains for rooted collectives: broadcast and reduce.
//!
//! Broadcast follows the ring from the root: the root sends slice s to the next rank, which
//! forwards it as soon as it has it, so with S slices and n ranks the last rank has everything
//! after n-1+S slice times (bandwidth-optimal for large messages, like NCCL's ring broadcast).
//! Reduce runs the same chain towards the root: the rank after the root starts, each rank adds
//! its contribution to slice s and forwards it, and the root adds its own last.

use super::Reduction;
use super::plan::BufferId::{Input, Output, Scratch};
use super::plan::{Action, PlanBuilder, Region};
use super::ring::part;
use super::{Layout, copy_sliced};

fn slices(count: usize, slice: usize) -> usize {
    count.div_ceil(slice).max(1)
}

/// (index along a chain whose first rank is `first`, next rank, previous rank).
fn chain_place(layout: &Layout, first: usize) -> (usize, usize, usize) {
    let n = layout.world();
    let p = layout.position();
    let index = (p + n - layout.position_of(first)) % n;
    (index, layout.at(p + 1), layout.at(p + n - 1))
}

pub(crate) fn broadcast(
    b: &mut PlanBuilder,
    layout: &Layout,
    root: usize,
    count: usize,
    in_place: bool,
    slice: usize,
) {
    let n = layout.world();
    let rank = layout.rank();
    // The chain starts at the root.
    let (index, next, prev) = chain_place(layout, root);
    let s_count = slices(count, slice);
    if rank == root && !in_place {
        copy_sliced(b, Region::new(Input, 0, count), Output, 0, slice);
    }
    for s in 0..s_count {
        let (o, l) = part(count, s_count, s);
        if l == 0 {
            continue;
        }
        let tag = s as u32;
        if index > 0 {
            b.push(Action::Recv {
                peer: prev,
                tag,
                into: Region::new(Output, o, l),
                reduce: false,
                seed: None,
            });
        }
        if index + 1 < n {
            // The root sends from its input directly; the others forward what they received.
            let source = if rank == root && !in_place {
                Input
            } else {
                Output
            };
            b.push(Action::Send {
                peer: next,
                tag,
                from: Region::new(source, o, l),
                lend: false,
            });
        }
    }
}

pub(crate) fn reduce(
    b: &mut PlanBuilder,
    layout: &Layout,
    root: usize,
    count: usize,
    in_place: bool,
    slice: usize,
    reduction: Reduction,
) {
    let rank = layout.rank();
    // The chain starts after the root and ends at it (root = index n-1).
    let (index, next, prev) = chain_place(layout, layout.at(layout.position_of(root) + 1));
    let source = if in_place { Output } else { Input };
    // Where this rank accumulates: the root's output, or scratch on middle ranks.
    let acc = if rank == root {
        if !in_place {
            copy_sliced(b, Region::new(Input, 0, count), Output, 0, slice);
        }
        Output
    } else if index > 0 {
        b.scratch(count);
        copy_sliced(b, Region::new(source, 0, count), Scratch, 0, slice);
        Scratch
    } else {
        source
    };
    let s_count = slices(count, slice);
    for s in 0..s_count {
        let (o, l) = part(count, s_count, s);
        if l == 0 {
            continue;
        }
        let tag = s as u32;
        let region = Region::new(acc, o, l);
        if index > 0 {
            b.push(Action::Recv {
                peer: prev,
                tag,
                into: region,
                reduce: true,
                seed: None,
            });
        }
        if rank != root {
            b.push(Action::Send {
                peer: next,
                tag,
                from: region,
                lend: false,
            });
        } else if reduction.average {
            b.push(Action::Divide { region });
        }
    }
}
