//! Every backend against `bcl-oracle`, which shares no code with any of them: cpu and sim
//! (BCL's Rust kernels), the sample device plugin (kernels written in C), and cuda:0 where
//! `BCL_TEST_CUDA` is set (by `scripts/device-check.sh` on a GPU machine). Reductions of
//! random elements of every dtype and op (NaNs, infinities, subnormals and values that
//! round included), divisions by small and large world sizes, copies, and bad handles.

mod support;

use bcl_backends::{
    Accelerator, DataType, DeviceError, DeviceOptions, DeviceSpec, ReduceOp, open_device,
};
use bcl_oracle::{Op, Type};
use std::sync::Arc;

/// The backends under test, each with the name failures give.
fn devices() -> Vec<(String, Arc<dyn Accelerator>)> {
    let mut specs = vec![
        "cpu",
        "sim",
        "sim:copy=50:reduce=50",
        "plugin:0",
        "plugin:1",
    ];
    if std::env::var_os("BCL_TEST_CUDA").is_some() {
        specs.push("cuda:0");
    }
    let options = DeviceOptions {
        plugin: Some(support::sample_plugin(&[])),
    };
    specs
        .iter()
        .map(|s| {
            let spec = s.parse::<DeviceSpec>().expect("valid spec");
            let dev = open_device(&spec, 0, &options)
                .unwrap_or_else(|e| panic!("{s} does not open: {e}"));
            (s.to_string(), dev)
        })
        .collect()
}

fn oracle_type(dtype: DataType) -> Type {
    Type::named(dtype.name()).expect("the oracle knows every dtype")
}

fn oracle_op(op: ReduceOp) -> Op {
    Op::named(op.name()).expect("the oracle knows every op")
}

/// `len` pseudo-random bytes: every bit pattern, so floats include NaNs, infinities and
/// subnormals.
fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Operands `a`, `b` of `elements` elements; for min/max no +0/-0 pair (IEEE leaves the
/// winner of that tie open).
fn operands(dtype: DataType, op: ReduceOp, elements: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let size = dtype.size();
    let (a, mut b) = (
        random(elements * size, seed),
        random(elements * size, seed ^ 0xabcd),
    );
    if matches!(op, ReduceOp::Min | ReduceOp::Max) && dtype.is_float() {
        let ty = oracle_type(dtype);
        for e in 0..elements {
            let r = e * size..(e + 1) * size;
            let zero = |x: &[u8]| matches!(bcl_oracle::value(ty, x), bcl_oracle::Value::Float(v) if v == 0.0);
            if zero(&a[r.clone()]) && zero(&b[r.clone()]) {
                b[r.clone()].copy_from_slice(&a[r]);
            }
        }
    }
    (a, b)
}

/// The first element of `got` that is not `want`, as a message.
fn first_difference(dtype: DataType, got: &[u8], want: &[u8]) -> Option<String> {
    let (ty, size) = (oracle_type(dtype), dtype.size());
    (0..got.len() / size).find_map(|e| {
        let r = e * size..(e + 1) * size;
        (!bcl_oracle::same(ty, &got[r.clone()], &want[r.clone()])).then(|| {
            format!(
                "element {e}: got {:02x?}, the oracle says {:02x?}",
                &got[r.clone()],
                &want[r]
            )
        })
    })
}

#[test]
fn reductions_match_the_oracle_for_every_dtype_and_op() {
    let elements = 257;
    for (name, dev) in devices() {
        let stream = dev.default_stream();
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL.into_iter().filter(|op| *op != ReduceOp::Avg) {
                let (a, b) = operands(dtype, op, elements, dtype.size() as u64 * 31 + op as u64);
                let size = dtype.size();
                let (ty, oop) = (oracle_type(dtype), oracle_op(op));
                let want: Vec<u8> = (0..elements)
                    .flat_map(|e| {
                        let r = e * size..(e + 1) * size;
                        bcl_oracle::step(ty, oop, &a[r.clone()], &b[r])
                    })
                    .collect();
                // From host memory (a received chunk) ...
                let buf = dev.allocate(a.len()).expect("allocate");
                dev.copy_to_device(buf.full(), &a, &stream).expect("h2d");
                dev.reduce_from_host(buf.full(), &b, dtype, op, &stream)
                    .expect("reduce");
                let ev = dev.record_event(&stream).expect("event");
                dev.synchronize(&stream).expect("sync");
                assert!(dev.event_complete(&ev).expect("query"));
                let mut got = vec![0u8; a.len()];
                dev.copy_to_host(&mut got, buf.full(), &stream)
                    .expect("d2h");
                if let Some(d) = first_difference(dtype, &got, &want) {
                    panic!("{name} {dtype} {op} from host: {d}");
                }
                // ... and from device memory.
                let other = dev.allocate(b.len()).expect("allocate");
                dev.copy_to_device(buf.full(), &a, &stream).expect("h2d");
                dev.copy_to_device(other.full(), &b, &stream).expect("h2d");
                dev.reduce_within(buf.full(), other.full(), dtype, op, &stream)
                    .expect("reduce on the device");
                dev.copy_to_host(&mut got, buf.full(), &stream)
                    .expect("d2h");
                if let Some(d) = first_difference(dtype, &got, &want) {
                    panic!("{name} {dtype} {op} on the device: {d}");
                }
            }
        }
    }
}

#[test]
fn divisions_match_the_oracle_for_small_and_large_worlds() {
    let elements = 129;
    for (name, dev) in devices() {
        let stream = dev.default_stream();
        for dtype in DataType::ALL {
            for ranks in [1usize, 2, 3, 7, 128, 255, 256, 300, 65537] {
                let size = dtype.size();
                let sums = random(elements * size, ranks as u64 + size as u64);
                let ty = oracle_type(dtype);
                let want: Vec<u8> = (0..elements)
                    .flat_map(|e| bcl_oracle::average(ty, &sums[e * size..(e + 1) * size], ranks))
                    .collect();
                let buf = dev.allocate(sums.len()).expect("allocate");
                dev.copy_to_device(buf.full(), &sums, &stream).expect("h2d");
                dev.divide(buf.full(), dtype, ranks, &stream)
                    .expect("divide");
                let mut got = vec![0u8; sums.len()];
                dev.copy_to_host(&mut got, buf.full(), &stream)
                    .expect("d2h");
                if let Some(d) = first_difference(dtype, &got, &want) {
                    panic!("{name} {dtype} / {ranks}: {d}");
                }
            }
        }
    }
}

#[test]
fn copies_between_buffers_and_within_one() {
    for (name, dev) in devices() {
        let s = dev.default_stream();
        let a = dev.allocate(64).expect("allocate");
        let b = dev.allocate(64).expect("allocate");
        dev.copy_to_device(a.full(), &random(64, 1), &s)
            .expect("h2d");
        dev.copy_within(b.slice(0, 32), a.slice(32, 32), &s)
            .expect("d2d");
        dev.copy_within(a.slice(0, 16), a.slice(48, 16), &s)
            .expect("same buffer");
        let mut got = vec![0u8; 32];
        dev.copy_to_host(&mut got, b.slice(0, 32), &s).expect("d2h");
        assert_eq!(got, random(64, 1)[32..], "{name}");
        let mut got = vec![0u8; 16];
        dev.copy_to_host(&mut got, a.slice(0, 16), &s).expect("d2h");
        assert_eq!(got, random(64, 1)[48..], "{name}");
    }
}

#[test]
fn bad_handles_and_ranges_are_errors() {
    let devs = devices();
    for pair in devs.windows(2) {
        let ((xn, x), (yn, y)) = (&pair[0], &pair[1]);
        let buf = x.allocate(16).expect("allocate");
        let err = y
            .copy_to_device(buf.full(), &[0u8; 16], &y.default_stream())
            .expect_err("foreign buffer");
        assert!(
            matches!(err, DeviceError::ForeignHandle { what: "buffer", .. }),
            "{xn} buffer on {yn}: {err}"
        );
        let err = x
            .copy_to_device(buf.slice(8, 16), &[0u8; 16], &x.default_stream())
            .expect_err("out of range");
        assert!(err.to_string().contains("8..24"), "{xn}: {err}");
        let err = x
            .copy_to_device(buf.full(), &[0u8; 16], &y.default_stream())
            .expect_err("foreign stream");
        assert!(
            matches!(err, DeviceError::ForeignHandle { what: "stream", .. }),
            "{xn}: {err}"
        );
        let err = x
            .reduce_from_host(
                buf.full(),
                &[0u8; 15],
                DataType::Float32,
                ReduceOp::Sum,
                &x.default_stream(),
            )
            .expect_err("short source");
        assert!(err.to_string().contains("lengths differ"), "{xn}: {err}");
    }
}

#[test]
fn sim_paces_copies_at_its_configured_bandwidth() {
    // 0.01 GB/s = 10 MB/s: 100 KB takes 10 ms at least.
    let spec = "sim:copy=0.01".parse::<DeviceSpec>().expect("spec");
    let dev = open_device(&spec, 0, &DeviceOptions::default()).expect("sim");
    let buf = dev.allocate(100_000).expect("allocate");
    let start = std::time::Instant::now();
    dev.copy_to_device(buf.full(), &vec![1u8; 100_000], &dev.default_stream())
        .expect("h2d");
    assert!(start.elapsed() >= std::time::Duration::from_millis(10));
    assert!(!dev.info().capabilities.host_addressable);
}
