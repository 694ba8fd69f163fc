//! Recursive-doubling allreduce: the latency-optimal path for small messages.
//!
//! With n = 2^k ranks, in round r each rank swaps its whole buffer with rank XOR 2^r and
//! reduces: after k rounds every rank holds the full reduction (k message latencies instead
//! of the ring's 2(n-1)). Addition, multiplication, min and max are commutative, so both
//! partners compute the same bits and all ranks end identical.
//!
//! Other world sizes (Rabenseifner's treatment): with p the largest power of two ≤ n and
//! rem = n - p, ranks 0..2·rem pair up first; each even one hands its buffer to the odd one
//! above it and sits out. The p remaining ranks run the rounds, then each odd rank returns the
//! result to its even partner. With 6 ranks (p = 4, rem = 2):
//!
//! ```text
//!   pre:    0 → 1, 2 → 3               (1 and 3 hold two terms each)
//!   rounds: active {1, 3, 4, 5}: 1↔3, 4↔5, then 1↔4, 3↔5
//!   post:   1 → 0, 3 → 2               (the sitting-out ranks get the result)
//! ```

use super::plan::BufferId::{Input, Output};
use super::plan::{Action, PlanBuilder, Region};
use super::{Layout, Reduction};

pub(crate) fn allreduce(
    b: &mut PlanBuilder,
    layout: &Layout,
    count: usize,
    in_place: bool,
    reduction: Reduction,
) {
    let (n, rank) = (layout.world(), layout.rank());
    let buf = Region::new(Output, 0, count);
    let p = if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    };
    let rem = n - p;
    // Out of place, the input is never copied up front: a rank's first message goes out from
    // the input, and its first reduction combines the input with what arrived, writing the
    // output in one pass (`seed`). Only a single rank has nothing to combine and copies.
    let input = Region::new(Input, 0, count);
    let (mut from, mut seed) = if in_place {
        (buf, None)
    } else {
        (input, Some(input))
    };
    if n == 1 && !in_place {
        b.push(Action::Copy {
            from: input,
            to: buf,
        });
    }
    if count == 0 {
        return;
    }
    let rounds = p.trailing_zeros();
    let final_tag = rounds + 1;
    // Active ranks are numbered 0..p; `real` maps that number back to a rank.
    let real = |id: usize| if id < rem { 2 * id + 1 } else { id + rem };
    let active = if rank < 2 * rem {
        (rank % 2 == 1).then_some(rank / 2)
    } else {
        Some(rank - rem)
    };
    if rank < 2 * rem {
        if rank % 2 == 0 {
            b.push(Action::Send {
                peer: rank + 1,
                tag: 0,
                from,
            });
        } else {
            b.push(Action::Recv {
                peer: rank - 1,
                tag: 0,
                into: buf,
                reduce: true,
                seed: seed.take(),
            });
            from = buf;
        }
    }
    let Some(me) = active else {
        b.push(Action::Recv {
            peer: rank + 1,
            tag: final_tag,
            into: buf,
            reduce: false,
            seed: None,
        });
        return;
    };
    for r in 0..rounds {
        let partner = real(me ^ (1 << r));
        b.push(Action::Send {
            peer: partner,
            tag: r + 1,
            from,
        });
        b.push(Action::Recv {
            peer: partner,
            tag: r + 1,
            into: buf,
            reduce: true,
            seed: seed.take(),
        });
        from = buf;
    }
    if reduction.average {
        b.push(Action::Divide { region: buf });
    }
    if rank < 2 * rem {
        b.push(Action::Send {
            peer: rank - 1,
            tag: final_tag,
            from: buf,
        });
    }
}
