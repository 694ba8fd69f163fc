//! Dissemination barrier: in round r each rank sends an empty message to rank + 2^r and waits
//! for one from rank - 2^r. After ceil(log2 n) rounds every rank has heard, transitively,
//! from every other, so none leaves before all have arrived.

use super::Layout;
use super::plan::BufferId::Output;
use super::plan::{Action, PlanBuilder, Region};

pub(crate) fn dissemination(b: &mut PlanBuilder, layout: &Layout) {
    let (n, rank) = (layout.world(), layout.rank());
    let empty = Region::new(Output, 0, 0);
    let mut previous: Vec<usize> = Vec::new();
    let mut distance = 1;
    let mut round = 0u32;
    while distance < n {
        let send = b.push_after(
            Action::Send {
                peer: (rank + distance) % n,
                tag: round,
                from: empty,
                lend: false,
            },
            &previous,
        );
        let recv = b.push_after(
            Action::Recv {
                peer: (rank + n - distance) % n,
                tag: round,
                into: empty,
                reduce: false,
                seed: None,
            },
            &previous,
        );
        previous = vec![send, recv];
        distance *= 2;
        round += 1;
    }
}
