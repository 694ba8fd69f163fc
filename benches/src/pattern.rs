//! Closed-form inputs and expected outputs for every collective, dtype and op.
//!
//! Inputs are small integers chosen so that every result is exactly representable in every
//! dtype (sums ≤ 4·ranks, products ≤ 2^ranks, fp16/bf16 included), so checks compare exactly.
//! Integer overflow, where it happens (prod on int8 for 8 ranks), wraps on both sides.

use bcl_core::{Collective, Element, ReduceOp};

/// Element `i` of rank `rank`'s input for `collective`.
pub fn input<T: Element>(collective: Collective, rank: usize, i: usize) -> T {
    let (r, i) = (rank as i64, i as i64);
    T::from_i64(match collective.reduce_op() {
        Some(ReduceOp::Sum) | Some(ReduceOp::Avg) => (r + i) % 5,
        Some(ReduceOp::Prod) => 1 + (r + i) % 2,
        Some(ReduceOp::Min) | Some(ReduceOp::Max) => (r * 7 + i * 3) % 11,
        None => (r * 31 + i) % 97,
    })
}

/// The reduction over all ranks of input element `i`.
pub fn reduced<T: Element>(collective: Collective, world: usize, i: usize) -> T {
    let op = collective.reduce_op().unwrap_or(ReduceOp::Sum);
    let mut acc: T = input(collective, 0, i);
    for q in 1..world {
        let v: T = input(collective, q, i);
        acc = match op.accumulate_op() {
            ReduceOp::Prod => acc.mul(v),
            ReduceOp::Min => acc.min_of(v),
            ReduceOp::Max => acc.max_of(v),
            _ => acc.add(v),
        };
    }
    if op == ReduceOp::Avg {
        acc.divide(world)
    } else {
        acc
    }
}

/// The input buffer of `rank` (for in-place calls: the one buffer's initial contents).
pub fn input_buffer<T: Element>(
    collective: Collective,
    count: usize,
    world: usize,
    rank: usize,
    in_place: bool,
) -> Vec<T> {
    let (inp, out) = collective.buffer_elems(count, world, rank);
    let (inp, out) = (inp.unwrap_or(0), out.unwrap_or(0));
    if !in_place {
        return (0..inp).map(|i| input(collective, rank, i)).collect();
    }
    let mut buf: Vec<T> = vec![T::from_i64(0); inp.max(out)];
    // All-gather in place: the contribution sits at this rank's block.
    let at = if matches!(collective, Collective::AllGather) {
        rank * count
    } else {
        0
    };
    for i in 0..inp {
        buf[at + i] = input(collective, rank, i);
    }
    buf
}

/// The expected element `j` of `rank`'s output buffer, `None` where the collective leaves
/// that element unspecified (e.g. in-place reduce-scatter outside this rank's block).
pub fn expected<T: Element>(
    collective: Collective,
    count: usize,
    world: usize,
    rank: usize,
    in_place: bool,
    j: usize,
) -> Option<T> {
    let c = count.max(1);
    match collective {
        Collective::AllReduce { .. } => Some(reduced(collective, world, j)),
        Collective::AllGather => Some(input(collective, j / c, j % c)),
        Collective::ReduceScatter { .. } => {
            let local = if in_place {
                j.checked_sub(rank * count).filter(|k| *k < count)?
            } else {
                j
            };
            Some(reduced(collective, world, rank * count + local))
        }
        Collective::Broadcast { root } => Some(input(collective, root, j)),
        Collective::Reduce { root, .. } => (rank == root).then(|| reduced(collective, world, j)),
        Collective::AllToAll => Some(input(collective, j / c, rank * count + j % c)),
        Collective::Recv { peer } => Some(input(collective, peer, j)),
        Collective::Send { .. } | Collective::Barrier => None,
    }
}

/// Count the elements of `output` that differ from the closed form.
pub fn count_wrong<T: Element>(
    collective: Collective,
    count: usize,
    world: usize,
    rank: usize,
    in_place: bool,
    output: &[T],
) -> usize {
    output
        .iter()
        .enumerate()
        .filter(
            |(j, got)| match expected::<T>(collective, count, world, rank, in_place, *j) {
                Some(want) => differs(**got, want),
                None => false,
            },
        )
        .count()
}

/// Bitwise inequality (so NaN never passes, and -0.0 ≠ 0.0 is noticed).
fn differs<T: Element>(a: T, b: T) -> bool {
    bcl_backends::bytemuck::bytes_of(&a) != bcl_backends::bytemuck::bytes_of(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcl_backends::half::bf16;

    #[test]
    fn a_corrupted_element_is_counted() {
        let c = Collective::AllReduce { op: ReduceOp::Avg };
        let mut out: Vec<bf16> = (0..100).map(|i| reduced(c, 3, i)).collect();
        assert_eq!(count_wrong(c, 100, 3, 0, false, &out), 0);
        out[42] = bf16::from_f32(1000.0);
        out[7] = bf16::NAN;
        assert_eq!(count_wrong(c, 100, 3, 0, false, &out), 2);
    }

    #[test]
    fn closed_forms_are_exact_small_integers() {
        // sum over 8 ranks of (r + i) % 5, and prod of 1 + (r + i) % 2 (2^4 = 16).
        let sum = Collective::AllReduce { op: ReduceOp::Sum };
        assert_eq!(
            reduced::<f32>(sum, 8, 0),
            (0..8).map(|r| (r % 5) as f32).sum::<f32>()
        );
        let prod = Collective::AllReduce { op: ReduceOp::Prod };
        assert_eq!(reduced::<i8>(prod, 8, 0), 16);
        // In-place reduce-scatter: only this rank's block is specified.
        let rs = Collective::ReduceScatter { op: ReduceOp::Max };
        assert!(expected::<u8>(rs, 4, 2, 1, true, 0).is_none());
        assert!(expected::<u8>(rs, 4, 2, 1, true, 5).is_some());
    }
}
