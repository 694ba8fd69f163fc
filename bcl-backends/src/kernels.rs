//! Host reduction kernels: the reference semantics of every (dtype, op) pair.
//!
//! Each kernel is a plain element-wise loop with the operation chosen outside the loop, so
//! the compiler vectorises it (the `kernels` criterion bench compares the fp32 sum kernel's
//! bandwidth with `memcpy`'s). Byte buffers that happen to be misaligned for their element
//! type take a slower unaligned path with the same results.

use crate::dtype::{DataType, Element, ReduceOp};
use half::{bf16, f16};
use thiserror::Error;

/// A kernel was called with buffers that do not describe whole, equal-length element runs.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelError {
    #[error("buffer lengths differ: destination {dst} bytes, source {src} bytes")]
    LengthMismatch { dst: usize, src: usize },
    #[error("{len} bytes is not a whole number of {dtype} elements ({size} bytes each)")]
    PartialElement {
        len: usize,
        dtype: DataType,
        size: usize,
    },
}

/// `dst[i] = dst[i] (op) src[i]` over typed slices. `avg` accumulates as `sum`.
pub fn reduce_slice<T: Element>(dst: &mut [T], src: &[T], op: ReduceOp) {
    match op.accumulate_op() {
        ReduceOp::Sum => apply(dst, src, T::add),
        ReduceOp::Prod => apply(dst, src, T::mul),
        ReduceOp::Min => apply(dst, src, T::min_of),
        ReduceOp::Max => apply(dst, src, T::max_of),
        ReduceOp::Avg => unreachable!("accumulate_op never returns Avg"),
    }
}

#[inline(always)]
fn apply<T: Element>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

/// `dst[i] = a[i] (op) b[i]` over typed slices: a copy and a reduction in one pass (an
/// out-of-place reduction reads its input once instead of copying it first).
pub fn combine_slice<T: Element>(dst: &mut [T], a: &[T], b: &[T], op: ReduceOp) {
    match op.accumulate_op() {
        ReduceOp::Sum => apply3(dst, a, b, T::add),
        ReduceOp::Prod => apply3(dst, a, b, T::mul),
        ReduceOp::Min => apply3(dst, a, b, T::min_of),
        ReduceOp::Max => apply3(dst, a, b, T::max_of),
        ReduceOp::Avg => unreachable!("accumulate_op never returns Avg"),
    }
}

#[inline(always)]
fn apply3<T: Element>(dst: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(*x, *y);
    }
}

/// `dst[i] = dst[i] / n` over a typed slice: the last step of `avg`.
pub fn divide_slice<T: Element>(dst: &mut [T], n: usize) {
    for d in dst.iter_mut() {
        *d = d.divide(n);
    }
}

fn check(dst: usize, src: usize, dtype: DataType) -> Result<(), KernelError> {
    if dst != src {
        return Err(KernelError::LengthMismatch { dst, src });
    }
    if !dst.is_multiple_of(dtype.size()) {
        return Err(KernelError::PartialElement {
            len: dst,
            dtype,
            size: dtype.size(),
        });
    }
    Ok(())
}

fn reduce_bytes_typed<T: Element>(dst: &mut [u8], src: &[u8], op: ReduceOp) {
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        (Ok(d), Ok(s)) => reduce_slice(d, s, op),
        _ => {
            let size = std::mem::size_of::<T>();
            for (d, s) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
                let mut a: [T; 1] = [bytemuck::pod_read_unaligned(d)];
                let b: [T; 1] = [bytemuck::pod_read_unaligned(s)];
                reduce_slice(&mut a, &b, op);
                d.copy_from_slice(bytemuck::bytes_of(&a[0]));
            }
        }
    }
}

fn combine_bytes_typed<T: Element>(dst: &mut [u8], a: &[u8], b: &[u8], op: ReduceOp) {
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(a),
        bytemuck::try_cast_slice::<u8, T>(b),
    ) {
        (Ok(d), Ok(x), Ok(y)) => combine_slice(d, x, y, op),
        _ => {
            dst.copy_from_slice(a);
            reduce_bytes_typed::<T>(dst, b, op);
        }
    }
}

fn divide_bytes_typed<T: Element>(dst: &mut [u8], n: usize) {
    match bytemuck::try_cast_slice_mut::<u8, T>(dst) {
        Ok(d) => divide_slice(d, n),
        Err(_) => {
            for d in dst.chunks_exact_mut(std::mem::size_of::<T>()) {
                let a: T = bytemuck::pod_read_unaligned(d);
                d.copy_from_slice(bytemuck::bytes_of(&a.divide(n)));
            }
        }
    }
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DataType::Int8 => $f::<i8>($($arg),*),
            DataType::Uint8 => $f::<u8>($($arg),*),
            DataType::Int32 => $f::<i32>($($arg),*),
            DataType::Uint32 => $f::<u32>($($arg),*),
            DataType::Int64 => $f::<i64>($($arg),*),
            DataType::Uint64 => $f::<u64>($($arg),*),
            DataType::Float16 => $f::<f16>($($arg),*),
            DataType::Bfloat16 => $f::<bf16>($($arg),*),
            DataType::Float32 => $f::<f32>($($arg),*),
            DataType::Float64 => $f::<f64>($($arg),*),
        }
    };
}

/// `dst = dst (op) src` over raw bytes holding `dtype` elements (native byte order).
pub fn reduce_bytes(
    dst: &mut [u8],
    src: &[u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), KernelError> {
    check(dst.len(), src.len(), dtype)?;
    dispatch!(dtype, reduce_bytes_typed, dst, src, op);
    Ok(())
}

/// `dst = a (op) b` over raw bytes holding `dtype` elements (native byte order).
pub fn combine_bytes(
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), KernelError> {
    check(dst.len(), a.len(), dtype)?;
    check(dst.len(), b.len(), dtype)?;
    dispatch!(dtype, combine_bytes_typed, dst, a, b, op);
    Ok(())
}

/// `dst = dst / n` over raw bytes holding `dtype` elements: the final step of `avg`.
pub fn divide_bytes(dst: &mut [u8], dtype: DataType, n: usize) -> Result<(), KernelError> {
    check(dst.len(), dst.len(), dtype)?;
    dispatch!(dtype, divide_bytes_typed, dst, n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn combine_is_copy_then_reduce_for_every_dtype_and_op() {
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                let n = 37 * dtype.size();
                let a: Vec<u8> = (0..n).map(|i| (i * 7 % 13) as u8 + 1).collect();
                let b: Vec<u8> = (0..n).map(|i| (i * 5 % 11) as u8 + 1).collect();
                let mut want = a.clone();
                reduce_bytes(&mut want, &b, dtype, op).expect("reduce");
                let mut got = vec![0u8; n];
                combine_bytes(&mut got, &a, &b, dtype, op).expect("combine");
                assert_eq!(got, want, "{dtype} {op:?}");
                // Misaligned views take the fallback path with the same result.
                let mut odd = vec![0u8; n + 1];
                let (mut a1, mut b1) = (vec![0u8; n + 1], vec![0u8; n + 1]);
                a1[1..].copy_from_slice(&a);
                b1[1..].copy_from_slice(&b);
                combine_bytes(&mut odd[1..], &a1[1..], &b1[1..], dtype, op).expect("combine");
                assert_eq!(odd[1..], want[..], "{dtype} {op:?} misaligned");
            }
        }
        assert_eq!(
            combine_bytes(
                &mut [0u8; 8],
                &[0u8; 4],
                &[0u8; 8],
                DataType::Float32,
                ReduceOp::Sum
            ),
            Err(KernelError::LengthMismatch { dst: 8, src: 4 })
        );
    }

    #[test]
    fn every_op_on_i32() {
        let src = [5i32, -2, 7, 0];
        for (op, want) in [
            (ReduceOp::Sum, [6, 0, 10, 4]),
            (ReduceOp::Prod, [5, -4, 21, 0]),
            (ReduceOp::Min, [1, -2, 3, 0]),
            (ReduceOp::Max, [5, 2, 7, 4]),
            (ReduceOp::Avg, [6, 0, 10, 4]),
        ] {
            let mut dst = [1i32, 2, 3, 4];
            reduce_slice(&mut dst, &src, op);
            assert_eq!(dst, want, "{op}");
        }
    }

    #[test]
    fn bad_lengths_are_errors() {
        let mut d = [0u8; 8];
        assert_eq!(
            reduce_bytes(&mut d, &[0u8; 4], DataType::Float32, ReduceOp::Sum),
            Err(KernelError::LengthMismatch { dst: 8, src: 4 })
        );
        let mut d = [0u8; 6];
        assert!(matches!(
            reduce_bytes(&mut d, &[0u8; 6], DataType::Float32, ReduceOp::Sum),
            Err(KernelError::PartialElement { len: 6, .. })
        ));
    }

    proptest! {
        /// The unaligned byte path and the aligned typed path agree exactly.
        #[test]
        fn unaligned_matches_aligned(a in proptest::collection::vec(any::<i64>(), 0..64),
                                     shift in 1usize..8) {
            let b: Vec<i64> = a.iter().map(|x| x.rotate_left(7)).collect();
            let mut want = a.clone();
            reduce_slice(&mut want, &b, ReduceOp::Sum);
            let bytes_a: Vec<u8> = bytemuck::cast_slice(&a).to_vec();
            let bytes_b: Vec<u8> = bytemuck::cast_slice(&b).to_vec();
            let mut storage = vec![0u8; bytes_a.len() + shift];
            storage[shift..].copy_from_slice(&bytes_a);
            reduce_bytes(&mut storage[shift..], &bytes_b, DataType::Int64, ReduceOp::Sum).expect("equal lengths");
            prop_assert_eq!(&storage[shift..], bytemuck::cast_slice::<i64, u8>(&want));
        }
    }
}
