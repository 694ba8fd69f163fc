//! Expected results of BCL's reductions, computed without BCL's kernels or element types:
//! integers as `i128` with the wrap-around of each width written out, floating-point values as
//! exact `f64` with the rounding to each type (fp16, bf16, fp32) written out bit by bit. The
//! tests that check BCL's collectives (the conformance suite, `bcl-bench`'s `#wrong`, the
//! executor's virtual-time tests, the backends' agreement) take their expected values from
//! here, so a wrong kernel cannot agree with itself.
//!
//! The semantics (those of `bcl-backends`' `dtype` module, restated independently):
//! * integers wrap on overflow (sum, prod); `avg` is the wrapped sum divided by the number of
//!   ranks, truncating toward zero;
//! * every floating-point operation is computed exactly and rounded once to the type, to
//!   nearest with ties to even (for fp16 and bf16 the kernels compute in fp32 and round again;
//!   fp32 has at least 2p+2 bits for both, so that double rounding gives the same result);
//! * `min`/`max` on floats are IEEE minNum/maxNum: a NaN loses against a number;
//! * `avg` is the sum divided once, at the end, by the number of ranks.
//!
//! A whole reduction over ranks ([`reduce`]) is exact only where the order of the ranks does
//! not matter: integers always; floats when the inputs are integers whose sums (or products)
//! stay exactly representable ([`reduce`] refuses the rest).

/// An element type, by its bit layout (BCL's ten).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Type {
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

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

impl Op {
    /// The operation BCL spells `name`: "sum", "prod", "min", "max", "avg".
    pub fn named(name: &str) -> Option<Op> {
        let all = [
            ("sum", Op::Sum),
            ("prod", Op::Prod),
            ("min", Op::Min),
            ("max", Op::Max),
            ("avg", Op::Avg),
        ];
        all.iter().find(|(n, _)| *n == name).map(|(_, op)| *op)
    }
}

/// The exact value of an element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Int(i128),
    /// Every fp16, bf16, fp32 and fp64 value is exactly an `f64`.
    Float(f64),
}

/// A binary floating-point format: significand bits (the implicit one included), the
/// exponent of the smallest normal number, exponent field width.
#[derive(Clone, Copy)]
struct Format {
    precision: i32,
    min_exponent: i32,
    exponent_bits: u32,
}

const F16: Format = Format {
    precision: 11,
    min_exponent: -14,
    exponent_bits: 5,
};
const BF16: Format = Format {
    precision: 8,
    min_exponent: -126,
    exponent_bits: 8,
};
const F32: Format = Format {
    precision: 24,
    min_exponent: -126,
    exponent_bits: 8,
};

impl Type {
    pub const ALL: [Type; 10] = [
        Type::Int8,
        Type::Uint8,
        Type::Int32,
        Type::Uint32,
        Type::Int64,
        Type::Uint64,
        Type::Float16,
        Type::Bfloat16,
        Type::Float32,
        Type::Float64,
    ];

    /// The type BCL (and nccl-tests) spell `name`: "int8", "uint8", "int32", "uint32",
    /// "int64", "uint64", "half", "bfloat16", "float", "double".
    pub fn named(name: &str) -> Option<Type> {
        let names = [
            "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "bfloat16", "float",
            "double",
        ];
        names.iter().position(|n| *n == name).map(|i| Type::ALL[i])
    }

    pub fn size(self) -> usize {
        match self {
            Type::Int8 | Type::Uint8 => 1,
            Type::Float16 | Type::Bfloat16 => 2,
            Type::Int32 | Type::Uint32 | Type::Float32 => 4,
            Type::Int64 | Type::Uint64 | Type::Float64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            Type::Float16 | Type::Bfloat16 | Type::Float32 | Type::Float64
        )
    }

    fn signed(self) -> bool {
        matches!(self, Type::Int8 | Type::Int32 | Type::Int64)
    }

    /// Significand bits, the implicit one included (floats only).
    fn precision(self) -> i32 {
        match self {
            Type::Float16 => F16.precision,
            Type::Bfloat16 => BF16.precision,
            Type::Float32 => F32.precision,
            _ => 53,
        }
    }
}

fn two_to(e: i32) -> f64 {
    // Exact for every exponent the formats here reach (f64 covers 2^-1074..2^1023).
    2f64.powi(e)
}

/// The exponent e with 2^e <= a < 2^(e+1), read from the bits (a finite, positive).
fn exponent_of(a: f64) -> i32 {
    let bits = a.to_bits();
    let field = ((bits >> 52) & 0x7ff) as i32;
    if field == 0 {
        // An f64 subnormal: 2^-1074 times its 52-bit fraction.
        let fraction = bits & ((1 << 52) - 1);
        -1074 + (63 - fraction.leading_zeros() as i32)
    } else {
        field - 1023
    }
}

/// `x` rounded to `format`, to nearest with ties to even: the value, ±inf on overflow.
fn round_to(x: f64, format: Format) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let a = x.abs();
    let e = exponent_of(a).max(format.min_exponent);
    // The spacing of representable numbers around a (subnormals share the smallest one).
    let quantum = two_to(e - (format.precision - 1));
    let rounded = (a / quantum).round_ties_even() * quantum;
    let max_exponent = (1 << (format.exponent_bits - 1)) - 1;
    let overflow = two_to(max_exponent + 1);
    let magnitude = if rounded >= overflow {
        f64::INFINITY
    } else {
        rounded
    };
    magnitude.copysign(x)
}

/// The bits of `v` in `format`, for a value already representable in it (or ±inf, NaN).
fn encode_bits(v: f64, format: Format) -> u64 {
    let mantissa_bits = (format.precision - 1) as u32;
    let total = 1 + format.exponent_bits + mantissa_bits;
    let sign = u64::from(v.is_sign_negative()) << (total - 1);
    let exponent_mask = (1u64 << format.exponent_bits) - 1;
    if v.is_nan() {
        // The canonical quiet NaN.
        return (exponent_mask << mantissa_bits) | (1 << (mantissa_bits - 1));
    }
    let a = v.abs();
    if a.is_infinite() {
        return sign | (exponent_mask << mantissa_bits);
    }
    if a == 0.0 {
        return sign;
    }
    let bias = (1i32 << (format.exponent_bits - 1)) - 1;
    let e = exponent_of(a);
    if e < format.min_exponent {
        let units = a / two_to(format.min_exponent - mantissa_bits as i32);
        return sign | units as u64;
    }
    let field = (e + bias) as u64;
    let fraction = (a / two_to(e - mantissa_bits as i32)) as u64 - (1 << mantissa_bits);
    sign | (field << mantissa_bits) | fraction
}

/// The value of `bits` in `format` (exactly).
fn decode_bits(bits: u64, format: Format) -> f64 {
    let mantissa_bits = (format.precision - 1) as u32;
    let total = 1 + format.exponent_bits + mantissa_bits;
    let negative = (bits >> (total - 1)) & 1 == 1;
    let exponent_mask = (1u64 << format.exponent_bits) - 1;
    let field = (bits >> mantissa_bits) & exponent_mask;
    let fraction = bits & ((1 << mantissa_bits) - 1);
    let bias = (1i32 << (format.exponent_bits - 1)) - 1;
    let magnitude = if field == exponent_mask {
        if fraction == 0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else if field == 0 {
        fraction as f64 * two_to(format.min_exponent - mantissa_bits as i32)
    } else {
        (fraction + (1 << mantissa_bits)) as f64
            * two_to(field as i32 - bias - mantissa_bits as i32)
    };
    if negative { -magnitude } else { magnitude }
}

fn format_of(ty: Type) -> Option<Format> {
    match ty {
        Type::Float16 => Some(F16),
        Type::Bfloat16 => Some(BF16),
        Type::Float32 => Some(F32),
        _ => None,
    }
}

/// The exact value of one element held in `bytes` (little endian, `ty.size()` bytes).
pub fn value(ty: Type, bytes: &[u8]) -> Value {
    let mut raw = [0u8; 8];
    raw[..ty.size()].copy_from_slice(&bytes[..ty.size()]);
    let bits = u64::from_le_bytes(raw);
    let width = 8 * ty.size() as u32;
    match ty {
        Type::Float64 => Value::Float(f64::from_bits(bits)),
        _ if ty.is_float() => Value::Float(decode_bits(bits, format_of(ty).unwrap_or(F32))),
        _ if ty.signed() => Value::Int(((bits << (64 - width)) as i64 >> (64 - width)) as i128),
        _ => Value::Int(bits as i128),
    }
}

/// `v` as an element of `ty`: integers wrapped to the width (two's complement), floats
/// rounded to nearest with ties to even.
pub fn bytes(ty: Type, v: Value) -> Vec<u8> {
    let width = 8 * ty.size() as u32;
    let bits = match (v, ty) {
        (Value::Float(x), Type::Float64) => x.to_bits(),
        (Value::Float(x), _) if ty.is_float() => {
            let format = format_of(ty).unwrap_or(F32);
            encode_bits(round_to(x, format), format)
        }
        (Value::Int(i), _) if !ty.is_float() => {
            let mask = if width == 64 {
                u64::MAX
            } else {
                (1u64 << width) - 1
            };
            (i as u128 as u64) & mask
        }
        (Value::Int(i), _) => return bytes(ty, Value::Float(i as f64)),
        (Value::Float(x), _) => return bytes(ty, Value::Int(x as i128)),
    };
    bits.to_le_bytes()[..ty.size()].to_vec()
}

/// `a (op) b` for one element, as one hop of a reduction computes it (`Avg` adds).
pub fn step(ty: Type, op: Op, a: &[u8], b: &[u8]) -> Vec<u8> {
    bytes(ty, exact_step(op, value(ty, a), value(ty, b)))
}

/// `sum / ranks` for one element: the last step of `avg`.
pub fn average(ty: Type, sum: &[u8], ranks: usize) -> Vec<u8> {
    let n = ranks as i128;
    bytes(
        ty,
        match value(ty, sum) {
            Value::Int(s) => Value::Int(s / n),
            Value::Float(s) => Value::Float(s / n as f64),
        },
    )
}

/// The exact result of one step, before rounding to the type (integers not yet wrapped:
/// products of two 64-bit values fit in i128 modulo 2^128, which wrapping keeps).
fn exact_step(op: Op, a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Value::Int(match op {
            Op::Sum | Op::Avg => x.wrapping_add(y),
            Op::Prod => x.wrapping_mul(y),
            Op::Min => x.min(y),
            Op::Max => x.max(y),
        }),
        (Value::Float(x), Value::Float(y)) => Value::Float(match op {
            Op::Sum | Op::Avg => x + y,
            Op::Prod => x * y,
            Op::Min | Op::Max if x.is_nan() => y,
            Op::Min | Op::Max if y.is_nan() => x,
            Op::Min => {
                if y < x {
                    y
                } else {
                    x
                }
            }
            Op::Max => {
                if y > x {
                    y
                } else {
                    x
                }
            }
        }),
        // Mixed kinds never come from one type; treat as floats.
        (Value::Int(x), y) => exact_step(op, Value::Float(x as f64), y),
        (x, Value::Int(y)) => exact_step(op, x, Value::Float(y as f64)),
    }
}

/// The reduction over ranks of `inputs` (one value per rank), as every correct order of the
/// ranks computes it, encoded as an element of `ty`. Floats: only where that result does not
/// depend on the order, which this checks: integer inputs whose sum of magnitudes (or product
/// of magnitudes) is at most 2^precision, so that every partial result is exact; min and max
/// of any values without a tie between +0 and -0. Otherwise `Err` says why.
pub fn reduce(ty: Type, op: Op, inputs: &[Value]) -> Result<Vec<u8>, String> {
    // Values of the type's own kind: an integer given for a float type is that float.
    let inputs: Vec<Value> = inputs
        .iter()
        .map(|v| match (*v, ty.is_float()) {
            (Value::Int(i), true) => Value::Float(i as f64),
            (Value::Float(x), false) => Value::Int(x as i128),
            (v, _) => v,
        })
        .collect();
    let Some((&first, rest)) = inputs.split_first() else {
        return Err("a reduction needs at least one rank".into());
    };
    if ty.is_float() {
        check_exact_domain(ty, op, &inputs)?;
    }
    // Integer arithmetic here is wrapped at the end: the sum or product modulo 2^width does
    // not depend on where the wrap happens.
    let mut acc = first;
    for &v in rest {
        acc = exact_step(op, acc, v);
    }
    let acc = match (op, acc) {
        (Op::Avg, Value::Int(s)) => Value::Int(wrap(ty, s) / inputs.len() as i128),
        (Op::Avg, Value::Float(s)) => Value::Float(s / inputs.len() as f64),
        (_, other) => other,
    };
    Ok(bytes(ty, acc))
}

/// `i` wrapped to the width of integer type `ty`, as a value of that type.
fn wrap(ty: Type, i: i128) -> i128 {
    match value(ty, &bytes(ty, Value::Int(i))) {
        Value::Int(w) => w,
        Value::Float(_) => i,
    }
}

fn check_exact_domain(ty: Type, op: Op, inputs: &[Value]) -> Result<(), String> {
    let floats: Vec<f64> = inputs
        .iter()
        .map(|v| match *v {
            Value::Float(x) => x,
            Value::Int(i) => i as f64,
        })
        .collect();
    match op {
        Op::Min | Op::Max => {
            let zero_signs: Vec<bool> = floats
                .iter()
                .filter(|x| **x == 0.0)
                .map(|x| x.is_sign_negative())
                .collect();
            if zero_signs.windows(2).any(|w| w[0] != w[1]) {
                return Err("+0 and -0 tie in a min/max (either may win)".into());
            }
            Ok(())
        }
        Op::Sum | Op::Avg | Op::Prod => {
            if floats.iter().any(|x| !x.is_finite() || x.fract() != 0.0) {
                return Err(format!(
                    "{op:?} over {ty:?} is exact only for integer inputs, got {floats:?}"
                ));
            }
            let limit = two_to(ty.precision());
            // Every partial result is exact when its significand fits: for sums, bounded by
            // the sum of magnitudes; for products of integers, by the product of their odd
            // parts (powers of two only move the exponent), as long as nothing overflows.
            let bound = if op == Op::Prod {
                let magnitude: f64 = floats.iter().map(|x| x.abs().max(1.0)).product();
                if magnitude >= overflow(ty) {
                    f64::INFINITY
                } else {
                    floats.iter().map(|x| odd_part(x.abs())).product::<f64>()
                }
            } else {
                floats.iter().map(|x| x.abs()).sum::<f64>()
            };
            if bound > limit {
                return Err(format!(
                    "{op:?} over {ty:?} of {floats:?} may round (bound {bound} > 2^{})",
                    ty.precision()
                ));
            }
            Ok(())
        }
    }
}

/// The odd factor of a non-negative integer (1 for 0).
fn odd_part(mut x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    while x % 2.0 == 0.0 {
        x /= 2.0;
    }
    x
}

/// The smallest magnitude that overflows `ty`.
fn overflow(ty: Type) -> f64 {
    match format_of(ty) {
        Some(f) => two_to((1 << (f.exponent_bits - 1)) - 1 + 1),
        None => f64::INFINITY,
    }
}

/// Whether two elements of `ty` are the same value: bit for bit, except that every NaN
/// equals every NaN (a GPU makes canonical NaNs where the host keeps an operand's payload).
pub fn same(ty: Type, a: &[u8], b: &[u8]) -> bool {
    let n = ty.size();
    if a[..n] == b[..n] {
        return true;
    }
    match (value(ty, a), value(ty, b)) {
        (Value::Float(x), Value::Float(y)) => x.is_nan() && y.is_nan(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bits(x: f64) -> u16 {
        u16::from_le_bytes([
            bytes(Type::Float16, Value::Float(x))[0],
            bytes(Type::Float16, Value::Float(x))[1],
        ])
    }

    #[test]
    fn fp16_rounding_written_out() {
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(-2.0), 0xc000);
        assert_eq!(f16_bits(65504.0), 0x7bff);
        // Halfway between 65504 and 65536 rounds to even: up, and overflows.
        assert_eq!(f16_bits(65520.0), 0x7c00);
        assert_eq!(f16_bits(65519.99), 0x7bff);
        // 2049 is halfway between 2048 and 2050: ties to even (2048).
        assert_eq!(f16_bits(2049.0), 0x6800);
        assert_eq!(f16_bits(2051.0), 0x6802);
        // The smallest subnormal, and half of it (a tie to even: zero).
        assert_eq!(f16_bits(2f64.powi(-24)), 0x0001);
        assert_eq!(f16_bits(2f64.powi(-25)), 0x0000);
        assert_eq!(f16_bits(1.5 * 2f64.powi(-24)), 0x0002);
        assert_eq!(f16_bits(-0.0), 0x8000);
        for bits in [0x0001u16, 0x03ff, 0x0400, 0x3c01, 0x7bff, 0xfbff, 0x8001] {
            let v = value(Type::Float16, &bits.to_le_bytes());
            assert_eq!(
                bytes(Type::Float16, v),
                bits.to_le_bytes().to_vec(),
                "{bits:#x}"
            );
        }
    }

    #[test]
    fn integers_wrap_and_average_truncates() {
        let i8s = |v: &[i128]| v.iter().map(|&x| Value::Int(x)).collect::<Vec<_>>();
        assert_eq!(reduce(Type::Int8, Op::Sum, &i8s(&[127, 1])), Ok(vec![0x80]));
        assert_eq!(reduce(Type::Uint8, Op::Prod, &i8s(&[16, 16])), Ok(vec![0]));
        // avg of int8 (-7, 0): -7 / 2 truncates toward zero.
        assert_eq!(
            reduce(Type::Int8, Op::Avg, &i8s(&[-7, 0])),
            Ok(vec![(-3i8) as u8])
        );
        // The sum wraps before it is divided: (100 + 100) as int8 = -56, / 2 = -28.
        assert_eq!(
            reduce(Type::Int8, Op::Avg, &i8s(&[100, 100])),
            Ok(vec![(-28i8) as u8])
        );
        // 300 ranks of uint8 1: the sum wraps to 44, / 300 is 0.
        assert_eq!(reduce(Type::Uint8, Op::Avg, &i8s(&[1; 300])), Ok(vec![0]));
        let u64s = [Value::Int(u64::MAX as i128), Value::Int(u64::MAX as i128)];
        assert_eq!(
            reduce(Type::Uint64, Op::Prod, &u64s),
            Ok(1u64.to_le_bytes().to_vec())
        );
    }

    #[test]
    fn floats_outside_the_exact_domain_are_refused() {
        let v = [Value::Float(0.5), Value::Float(1.0)];
        assert!(reduce(Type::Float32, Op::Sum, &v).is_err());
        let big = [Value::Float(200.0), Value::Float(100.0)];
        assert!(reduce(Type::Bfloat16, Op::Sum, &big).is_err());
        // Powers of two multiply exactly as far as the exponent goes.
        let twos = vec![Value::Float(2.0); 20];
        assert_eq!(
            reduce(Type::Bfloat16, Op::Prod, &twos),
            Ok(vec![0x80, 0x49])
        );
        assert!(reduce(Type::Float16, Op::Prod, &twos).is_err());
        let threes = vec![Value::Float(3.0); 6];
        assert!(reduce(Type::Bfloat16, Op::Prod, &threes).is_err());
        assert!(reduce(Type::Float32, Op::Sum, &big).is_ok());
        let zeros = [Value::Float(0.0), Value::Float(-0.0)];
        assert!(reduce(Type::Float64, Op::Min, &zeros).is_err());
        // Integers given for a float type are floats: the average of 0 and 1 is 0.5.
        let half = reduce(Type::Float16, Op::Avg, &[Value::Int(0), Value::Int(1)]);
        assert_eq!(half, Ok(vec![0x00, 0x38]));
        let nan = [Value::Float(f64::NAN), Value::Float(3.0)];
        assert_eq!(
            reduce(Type::Float64, Op::Max, &nan),
            Ok(3f64.to_le_bytes().to_vec())
        );
    }
}
