//! Element types and reduce operations, with their semantics written down once.
//!
//! * Integer arithmetic wraps on overflow (sum and prod), as two's complement hardware does.
//! * `fp16` and `bf16`: every binary operation is computed in `f32` and rounded back to the
//!   16-bit type (round to nearest even), as NCCL does. A ring therefore rounds once per hop.
//! * `min`/`max` on floats follow IEEE `minNum`/`maxNum`: a NaN loses against a number.
//! * `avg` is `sum` followed by one division by the number of ranks at the end (integers:
//!   truncating division of the wrapped sum).
//!
//! Tolerance: every backend reproduces the cpu kernels bit for bit (a NaN result is a NaN
//! everywhere, but its payload bits may differ: GPUs make canonical NaNs), so two runs that reduce
//! in the same order agree exactly. Rings of different order (a mixed-vendor ring groups
//! vendors) agree exactly for integer types; for floating types each result is within
//! `(n-1)·u·Σ|x|` of the exact sum (u: unit roundoff, 2^-24 fp32, 2^-53 fp64, 2^-11 fp16,
//! 2^-8 bf16), so two orders differ by at most twice that.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The element type of a collective's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataType {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Float16,
    Bfloat16,
    Float32,
    Float64,
}

impl DataType {
    pub const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float32,
        DataType::Float64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16 | DataType::Bfloat16 | DataType::Float32 | DataType::Float64
        )
    }

    /// The number `bcl.h` (`bclDataType_t`) and `nccl.h` give this type.
    pub const fn code(self) -> i32 {
        match self {
            DataType::Int8 => 0,
            DataType::Uint8 => 1,
            DataType::Int32 => 2,
            DataType::Uint32 => 3,
            DataType::Int64 => 4,
            DataType::Uint64 => 5,
            DataType::Float16 => 6,
            DataType::Float32 => 7,
            DataType::Float64 => 8,
            DataType::Bfloat16 => 9,
        }
    }

    /// The type `bcl.h` numbers `code`.
    pub fn from_code(code: i32) -> Option<DataType> {
        DataType::ALL.into_iter().find(|t| t.code() == code)
    }

    /// The nccl-tests spelling (`float`, `half`, `bfloat16`, `int32`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "int8" | "char" => DataType::Int8,
            "uint8" => DataType::Uint8,
            "int32" | "int" => DataType::Int32,
            "uint32" => DataType::Uint32,
            "int64" => DataType::Int64,
            "uint64" => DataType::Uint64,
            "half" | "float16" | "fp16" => DataType::Float16,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "float" | "float32" | "fp32" => DataType::Float32,
            "double" | "float64" | "fp64" => DataType::Float64,
            other => return Err(format!("unknown data type '{other}'")),
        })
    }
}

/// The reduction applied element-wise across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// The number `bcl.h` (`bclRedOp_t`) and `nccl.h` give this operation.
    pub const fn code(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
        }
    }

    /// The operation `bcl.h` numbers `code`.
    pub fn from_code(code: i32) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|op| op.code() == code)
    }

    /// The binary operation applied hop by hop (`avg` accumulates as `sum`).
    pub const fn accumulate_op(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            other => other,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" => ReduceOp::Avg,
            other => return Err(format!("unknown reduce op '{other}'")),
        })
    }
}

/// A Rust element type that BCL can reduce. Implemented for the ten [`DataType`]s.
pub trait Element: bytemuck::Pod + PartialOrd + Send + Sync + fmt::Debug + 'static {
    const DATA_TYPE: DataType;
    fn add(self, other: Self) -> Self;
    fn mul(self, other: Self) -> Self;
    fn min_of(self, other: Self) -> Self;
    fn max_of(self, other: Self) -> Self;
    /// `self / n`, the last step of `avg`.
    fn divide(self, n: usize) -> Self;
    /// A small integer as this type (for closed-form expected values in tests and benches).
    fn from_i64(v: i64) -> Self;
    /// This value as `f64` (for tolerant comparisons).
    fn to_f64(self) -> f64;
}

macro_rules! int_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DATA_TYPE: DataType = $dt;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn min_of(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline(always)]
            fn max_of(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            #[inline(always)]
            fn divide(self, n: usize) -> Self {
                // The world may be larger than the type holds (an int8 avg over 300 ranks):
                // divide in i128 then, where every quotient fits back.
                match <$t>::try_from(n) {
                    Ok(d) => self / d,
                    Err(_) => (self as i128 / n as i128) as $t,
                }
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
int_element!(i8, DataType::Int8);
int_element!(u8, DataType::Uint8);
int_element!(i32, DataType::Int32);
int_element!(u32, DataType::Uint32);
int_element!(i64, DataType::Int64);
int_element!(u64, DataType::Uint64);

macro_rules! float_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DATA_TYPE: DataType = $dt;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn min_of(self, o: Self) -> Self {
                self.min(o)
            }
            #[inline(always)]
            fn max_of(self, o: Self) -> Self {
                self.max(o)
            }
            #[inline(always)]
            fn divide(self, n: usize) -> Self {
                self / (n as $t)
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
float_element!(f32, DataType::Float32);
float_element!(f64, DataType::Float64);

macro_rules! half_element {
    ($t:ty, $dt:expr) => {
        impl Element for $t {
            const DATA_TYPE: DataType = $dt;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
            #[inline(always)]
            fn min_of(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32().min(o.to_f32()))
            }
            #[inline(always)]
            fn max_of(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32().max(o.to_f32()))
            }
            #[inline(always)]
            fn divide(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f32(v as f32)
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
        }
    };
}
half_element!(f16, DataType::Float16);
half_element!(bf16, DataType::Bfloat16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for dt in DataType::ALL {
            assert_eq!(dt.name().parse::<DataType>(), Ok(dt));
        }
        for op in ReduceOp::ALL {
            assert_eq!(op.name().parse::<ReduceOp>(), Ok(op));
        }
        assert!("float128".parse::<DataType>().is_err());
    }

    #[test]
    fn integer_overflow_wraps_and_half_rounds() {
        assert_eq!(i8::add(127, 1), -128);
        assert_eq!(u8::mul(16, 16), 0);
        // 2048 + 1 is not representable in fp16: rounds to even (2048).
        assert_eq!(
            f16::from_f32(2048.0).add(f16::from_f32(1.0)),
            f16::from_f32(2048.0)
        );
        assert_eq!(7i32.divide(2), 3);
        assert_eq!((-128i8).divide(128), -1);
        assert_eq!(255u8.divide(256), 0);
    }
}
