//! Closed-form inputs and expected outputs for every collective, dtype and op.
//!
//! Inputs are small integers chosen so that every result is exactly representable in every
//! dtype (sums ≤ 4·ranks, products ≤ 2^ranks, fp16/bf16 included), so checks compare exactly.
//! Integer overflow, where it happens (prod on int8 for 8 ranks), wraps on both sides.
//! Expected values come from `bcl-oracle`, which computes them without BCL's kernels or
//! element types, so a wrong kernel cannot pass its own check.
//!
//! The oracle is asked once per distinct value, not once per element (`Closed`): an input
//! element is one of at most `VALUES` small integers, and a reduction's inputs repeat every
//! `period` elements. Asked per element, a 4-rank 2^20-element check took seconds, most of the
//! conformance suite's time.

use bcl_core::{Collective, DataType, Element, ReduceOp};
use bcl_oracle::{Op, Type, Value};

/// The closed-form value of element `i` of rank `rank`'s input for `collective`.
fn value(collective: Collective, rank: usize, i: usize) -> i128 {
    let (r, i) = (rank as i128, i as i128);
    match collective.reduce_op() {
        Some(ReduceOp::Sum) | Some(ReduceOp::Avg) => (r + i) % 5,
        Some(ReduceOp::Prod) => 1 + (r + i) % 2,
        Some(ReduceOp::Min) | Some(ReduceOp::Max) => (r * 7 + i * 3) % 11,
        None => (r * 31 + i) % 97,
    }
}

/// Input values lie in `0..VALUES`.
const VALUES: usize = 97;

/// The period in `i` of `value(collective, rank, i)` for every rank: a reduction over the
/// ranks of element `i` equals that of element `i % period`.
fn period(collective: Collective) -> usize {
    match collective.reduce_op() {
        Some(ReduceOp::Sum) | Some(ReduceOp::Avg) => 5,
        Some(ReduceOp::Prod) => 2,
        Some(ReduceOp::Min) | Some(ReduceOp::Max) => 11,
        None => VALUES,
    }
}

/// The closed forms of one collective on `world` ranks, each asked of the oracle once, when
/// first needed.
struct Closed<T> {
    collective: Collective,
    world: usize,
    /// By input value.
    inputs: Vec<Option<T>>,
    /// By element index modulo [`period`].
    reductions: Vec<Option<Result<T, String>>>,
}

impl<T: Element> Closed<T> {
    fn new(collective: Collective, world: usize) -> Self {
        Closed {
            collective,
            world,
            inputs: vec![None; VALUES],
            reductions: vec![None; period(collective)],
        }
    }

    /// [`input`], memoised.
    fn input(&mut self, rank: usize, i: usize) -> T {
        let v = value(self.collective, rank, i);
        *self.inputs[v as usize].get_or_insert_with(|| of_value(v))
    }

    /// [`reduced`], memoised.
    fn reduced(&mut self, i: usize) -> Result<T, String> {
        let k = i % self.reductions.len();
        let (c, world) = (self.collective, self.world);
        self.reductions[k]
            .get_or_insert_with(|| reduced(c, world, k))
            .clone()
    }
}

/// The oracle's name for a data type (the oracle spells types as BCL does).
pub fn oracle_type(dtype: DataType) -> Type {
    Type::named(dtype.name()).unwrap_or_else(|| unreachable!("the oracle knows {dtype}"))
}

/// The oracle's name for a reduce operation.
pub fn oracle_op(op: ReduceOp) -> Op {
    Op::named(op.name()).unwrap_or_else(|| unreachable!("the oracle knows {op}"))
}

fn from_bytes<T: Element>(bytes: &[u8]) -> T {
    bcl_backends::bytemuck::pod_read_unaligned(bytes)
}

/// Element `i` of rank `rank`'s input for `collective`.
pub fn input<T: Element>(collective: Collective, rank: usize, i: usize) -> T {
    of_value(value(collective, rank, i))
}

/// The input value `v` as a `T`, as the oracle writes it.
fn of_value<T: Element>(v: i128) -> T {
    from_bytes(&bcl_oracle::bytes(oracle_type(T::DATA_TYPE), Value::Int(v)))
}

/// The reduction over all ranks of input element `i`, as the oracle computes it. `Err` where
/// floating-point results would depend on the order of the ranks (bf16 sums over more than
/// 64 ranks, say), so that no exact check is possible.
pub fn reduced<T: Element>(collective: Collective, world: usize, i: usize) -> Result<T, String> {
    let op = oracle_op(collective.reduce_op().unwrap_or(ReduceOp::Sum));
    let values: Vec<Value> = (0..world)
        .map(|q| Value::Int(value(collective, q, i)))
        .collect();
    bcl_oracle::reduce(oracle_type(T::DATA_TYPE), op, &values).map(|b| from_bytes(&b))
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
    let mut closed = Closed::<T>::new(collective, world);
    if !in_place {
        return (0..inp).map(|i| closed.input(rank, i)).collect();
    }
    let mut buf: Vec<T> = vec![T::from_i64(0); inp.max(out)];
    // All-gather in place, and gather on its root: the contribution sits at this rank's
    // block.
    let at = match collective {
        Collective::AllGather => rank * count,
        Collective::Gather { root } if rank == root => rank * count,
        _ => 0,
    };
    for i in 0..inp {
        buf[at + i] = closed.input(rank, i);
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
) -> Result<Option<T>, String> {
    let mut closed = Closed::new(collective, world);
    expected_in(&mut closed, count, rank, in_place, j)
}

/// [`expected`], from `closed`'s memo.
fn expected_in<T: Element>(
    closed: &mut Closed<T>,
    count: usize,
    rank: usize,
    in_place: bool,
    j: usize,
) -> Result<Option<T>, String> {
    let c = count.max(1);
    Ok(match closed.collective {
        Collective::AllReduce { .. } => Some(closed.reduced(j)?),
        Collective::AllGather => Some(closed.input(j / c, j % c)),
        Collective::ReduceScatter { .. } => {
            let local = if in_place {
                j.checked_sub(rank * count).filter(|k| *k < count)
            } else {
                Some(j)
            };
            match local {
                Some(local) => Some(closed.reduced(rank * count + local)?),
                None => None,
            }
        }
        Collective::Broadcast { root } => Some(closed.input(root, j)),
        Collective::Reduce { root, .. } if rank == root => Some(closed.reduced(j)?),
        Collective::AllToAll => Some(closed.input(j / c, rank * count + j % c)),
        Collective::Recv { peer } => Some(closed.input(peer, j)),
        Collective::Gather { root } if rank == root => Some(closed.input(j / c, j % c)),
        Collective::Gather { .. } => None,
        // In place the root's whole buffer is left as it was.
        Collective::Scatter { root } if in_place && rank == root => Some(closed.input(root, j)),
        Collective::Scatter { root } => Some(closed.input(root, rank * count + j)),
        Collective::Reduce { .. } | Collective::Send { .. } | Collective::Barrier => None,
        other => return Err(format!("no closed form for {other}")),
    })
}

/// Count the elements of `output` that differ from the closed form (`Err`: the results of
/// this shape cannot be checked exactly, see [`reduced`]).
pub fn count_wrong<T: Element>(
    collective: Collective,
    count: usize,
    world: usize,
    rank: usize,
    in_place: bool,
    output: &[T],
) -> Result<usize, String> {
    let mut wrong = 0;
    let mut closed = Closed::new(collective, world);
    for (j, got) in output.iter().enumerate() {
        if let Some(want) = expected_in::<T>(&mut closed, count, rank, in_place, j)? {
            wrong += usize::from(differs(*got, want));
        }
    }
    Ok(wrong)
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
        let mut out: Vec<bf16> = (0..100).map(|i| reduced(c, 3, i).expect("exact")).collect();
        assert_eq!(count_wrong(c, 100, 3, 0, false, &out), Ok(0));
        out[42] = bf16::from_f32(1000.0);
        out[7] = bf16::NAN;
        assert_eq!(count_wrong(c, 100, 3, 0, false, &out), Ok(2));
        // bf16 sums over 200 ranks may round: no exact check, and it says why.
        assert!(count_wrong(c, 100, 200, 0, false, &out).is_err());
    }

    #[test]
    fn inputs_repeat_with_their_period_and_stay_below_values() {
        let ops = ReduceOp::ALL.iter().map(|&op| Collective::AllReduce { op });
        for c in ops.chain([Collective::AllGather]) {
            let p = period(c);
            for rank in 0..9 {
                for i in 0..3 * VALUES {
                    let v = value(c, rank, i);
                    assert!(
                        (0..VALUES as i128).contains(&v),
                        "{c} rank {rank} element {i}: {v}"
                    );
                    assert_eq!(v, value(c, rank, i % p), "{c} rank {rank} element {i}");
                }
            }
        }
    }

    #[test]
    fn memoised_closed_forms_equal_the_oracles_per_element() {
        let c = Collective::ReduceScatter { op: ReduceOp::Max };
        let mut closed = Closed::<f32>::new(c, 5);
        for i in 0..300 {
            assert_eq!(closed.reduced(i), reduced::<f32>(c, 5, i), "element {i}");
            assert_eq!(closed.input(3, i), input::<f32>(c, 3, i), "element {i}");
        }
    }

    #[test]
    fn closed_forms_are_exact_small_integers() {
        // sum over 8 ranks of (r + 0) % 5 (0+1+2+3+4+0+1+2), and prod of 1 + r % 2 (2^4 = 16).
        let sum = Collective::AllReduce { op: ReduceOp::Sum };
        assert_eq!(reduced::<f32>(sum, 8, 0), Ok(13.0));
        let prod = Collective::AllReduce { op: ReduceOp::Prod };
        assert_eq!(reduced::<i8>(prod, 8, 0), Ok(16));
        // 32 ranks: 2^16 overflows nothing in int32, and wraps int8 to 0.
        assert_eq!(reduced::<i32>(prod, 32, 0), Ok(65536));
        assert_eq!(reduced::<i8>(prod, 32, 0), Ok(0));
        // In-place reduce-scatter: only this rank's block is specified.
        let rs = Collective::ReduceScatter { op: ReduceOp::Max };
        assert_eq!(expected::<u8>(rs, 4, 2, 1, true, 0), Ok(None));
        assert!(matches!(expected::<u8>(rs, 4, 2, 1, true, 5), Ok(Some(_))));
    }
}
