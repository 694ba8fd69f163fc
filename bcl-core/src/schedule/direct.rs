//! Direct exchanges: all-to-all (every pair at once) and point-to-point send/recv.

use super::plan::BufferId::{Input, Output, Scratch};
use super::plan::{Action, PlanBuilder, Region};
use super::ring::part;
use super::{Layout, copy_sliced};

fn each_slice(count: usize, slice: usize, mut f: impl FnMut(u32, usize, usize)) {
    let s_count = count.div_ceil(slice).max(1);
    for s in 0..s_count {
        let (o, l) = part(count, s_count, s);
        if l > 0 {
            f(s as u32, o, l);
        }
    }
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
        each_slice(count, slice, |tag, o, l| {
            b.push(Action::Send {
                peer: to,
                tag,
                from: Region::new(source, to * count + o, l),
            });
        });
        each_slice(count, slice, |tag, o, l| {
            b.push(Action::Recv {
                peer: from,
                tag,
                into: Region::new(Output, from * count + o, l),
                reduce: false,
                seed: None,
            });
        });
    }
}

pub(crate) fn send(b: &mut PlanBuilder, peer: usize, count: usize, slice: usize) {
    each_slice(count, slice, |tag, o, l| {
        b.push(Action::Send {
            peer,
            tag,
            from: Region::new(Input, o, l),
        });
    });
}

pub(crate) fn recv(b: &mut PlanBuilder, peer: usize, count: usize, slice: usize) {
    each_slice(count, slice, |tag, o, l| {
        b.push(Action::Recv {
            peer,
            tag,
            into: Region::new(Output, o, l),
            reduce: false,
            seed: None,
        });
    });
}
