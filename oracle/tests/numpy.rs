//! The oracle's rounding, checked against independent implementations: numpy's float16 and
//! float32 conversions and ml_dtypes' bfloat16 (the type JAX uses). `scripts/test.sh`
//! installs both; without them this test fails and says so.

use bcl_oracle::{Type, Value, bytes, value};
use std::io::Write;
use std::process::{Command, Stdio};

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Values that exercise rounding: random f32 bit patterns of every exponent (f32 values, so
/// that numpy and ml_dtypes round once), the midpoints between neighbouring fp16 and bf16
/// values and their f32 neighbours, subnormals, overflow thresholds, signed zeros.
fn cases() -> Vec<f32> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut out: Vec<f32> = (0..4000)
        .map(|_| f32::from_bits(rng.next() as u32))
        .filter(|x| x.is_finite())
        .collect();
    for _ in 0..2000 {
        // Exactly halfway between two fp16 (13 low bits 0x1000) or bf16 (16 low bits 0x8000)
        // neighbours, and one f32 ulp either side.
        let base = (rng.next() as u32) & 0x7fff_ffff;
        for mid in [(base & !0x1fff) | 0x1000, (base & !0xffff) | 0x8000] {
            for bits in [mid - 1, mid, mid + 1] {
                let x = f32::from_bits(bits);
                if x.is_finite() {
                    out.push(x);
                    out.push(-x);
                }
            }
        }
    }
    out.extend([
        0.0,
        -0.0,
        65504.0,
        65519.99,
        65520.0,
        2049.0,
        5.960_464_5e-8,
        2.980_232_2e-8,
        f32::MIN_POSITIVE,
        f32::MAX,
        3.389_531_4e38,
    ]);
    out
}

#[test]
fn rounding_agrees_with_numpy_and_ml_dtypes() {
    let values = cases();
    let script = r#"
import sys
try:
    import numpy as np, ml_dtypes
except ImportError as e:
    sys.exit(f"numpy and ml_dtypes are needed (scripts/test.sh installs them): {e}")
xs = np.array([float.fromhex(l) for l in sys.stdin.read().split()], dtype=np.float64)
with np.errstate(over="ignore"):
    h = xs.astype(np.float16).view(np.uint16)
    b = xs.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    f = xs.astype(np.float32).view(np.uint32)
for i in range(len(xs)):
    print(f"{h[i]:04x} {b[i]:04x} {f[i]:08x}")
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 is needed (scripts/test.sh installs it)");
    let input: String = values
        .iter()
        .map(|x| format!("{}\n", hex(f64::from(*x))))
        .collect();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write values");
    let out = child.wait_with_output().expect("python3 ran");
    assert!(
        out.status.success(),
        "the numpy script failed: {:?}",
        out.status
    );
    let text = String::from_utf8(out.stdout).expect("utf8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), values.len(), "one line per value");
    let mut checked = 0;
    for (x, line) in values.iter().zip(&lines) {
        let want: Vec<u32> = line
            .split(' ')
            .map(|h| u32::from_str_radix(h, 16).expect("hex"))
            .collect();
        let x = f64::from(*x);
        for (ty, want) in [
            (Type::Float16, want[0]),
            (Type::Bfloat16, want[1]),
            (Type::Float32, want[2]),
        ] {
            let got = bytes(ty, Value::Float(x));
            let mut raw = [0u8; 4];
            raw[..got.len()].copy_from_slice(&got);
            let got = u32::from_le_bytes(raw);
            // NaN never arises from finite inputs; inf does, with the same bits both sides.
            assert_eq!(
                got,
                want,
                "{ty:?} of {x:e} ({}): oracle {got:#x}, numpy {want:#x}",
                hex(x)
            );
            // And the rounded value reads back as what numpy made.
            let back = value(ty, &want.to_le_bytes());
            assert!(matches!(back, Value::Float(_)));
            checked += 1;
        }
    }
    assert!(checked > 20_000, "only {checked} comparisons");
}

/// `x` as Python's `float.fromhex` reads it.
fn hex(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0x0p+0".into()
        } else {
            "0x0p+0".into()
        };
    }
    let bits = x.to_bits();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let exponent = ((bits >> 52) & 0x7ff) as i64;
    let fraction = bits & ((1 << 52) - 1);
    if exponent == 0 {
        format!("{sign}0x0.{fraction:013x}p-1022")
    } else {
        format!("{sign}0x1.{fraction:013x}p{}", exponent - 1023)
    }
}
