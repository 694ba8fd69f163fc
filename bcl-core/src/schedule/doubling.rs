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

/// Rabenseifner's treatment of a world that is not a power of two: the `q` (largest power of
/// two ≤ n) active ranks, and the `rem = n - q` pairs among ranks 0..2·rem whose even member
/// hands its data to the odd one and sits out.
pub(super) struct Pairing {
    /// Active ranks.
    pub q: usize,
    /// Pairs.
    pub rem: usize,
}

impl Pairing {
    pub fn new(n: usize) -> Self {
        let q = if n.is_power_of_two() {
            n
        } else {
            n.next_power_of_two() / 2
        };
        Pairing { q, rem: n - q }
    }

    /// Whether `rank` is in a pair (hands over or takes over).
    pub fn paired(&self, rank: usize) -> bool {
        rank < 2 * self.rem
    }

    /// The active number (0..q) of `rank`; `None` for a rank that sits out.
    pub fn active(&self, rank: usize) -> Option<usize> {
        if self.paired(rank) {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - self.rem)
        }
    }

    /// The rank of active number `id`.
    pub fn rank_of(&self, id: usize) -> usize {
        if id < self.rem {
            2 * id + 1
        } else {
            id + self.rem
        }
    }
}

pub(crate) fn allreduce(
    b: &mut PlanBuilder,
    layout: &Layout,
    count: usize,
    in_place: bool,
    reduction: Reduction,
) {
    let (n, rank) = (layout.world(), layout.rank());
    let buf = Region::new(Output, 0, count);
    let pairing = Pairing::new(n);
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
    let rounds = pairing.q.trailing_zeros();
    let final_tag = rounds + 1;
    if pairing.paired(rank) {
        if rank % 2 == 0 {
            b.push(Action::Send {
                peer: rank + 1,
                tag: 0,
                from,
                lend: false,
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
    let Some(me) = pairing.active(rank) else {
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
        let partner = pairing.rank_of(me ^ (1 << r));
        b.push(Action::Send {
            peer: partner,
            tag: r + 1,
            from,
            lend: false,
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
    if pairing.paired(rank) {
        b.push(Action::Send {
            peer: rank - 1,
            tag: final_tag,
            from: buf,
            lend: false,
        });
    }
}
