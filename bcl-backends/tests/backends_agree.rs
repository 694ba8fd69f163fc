//! Every backend reproduces the cpu reference kernels bit for bit, and rejects bad handles.

use bcl_backends::kernels::{divide_bytes, reduce_bytes};
use bcl_backends::{Accelerator, DataType, DeviceError, DeviceSpec, ReduceOp, open_device};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The backends under test: cpu, sim, and cuda:0 where `BCL_TEST_CUDA` is set (by
/// `scripts/device-check.sh` on a GPU machine; it must open there).
fn devices() -> Vec<std::sync::Arc<dyn Accelerator>> {
    let mut specs = vec!["cpu", "sim", "sim:copy=50:reduce=50"];
    if std::env::var_os("BCL_TEST_CUDA").is_some() {
        specs.push("cuda:0");
    }
    specs
        .iter()
        .map(|s| {
            open_device(
                &s.parse::<DeviceSpec>().expect("valid spec"),
                0,
                &Default::default(),
            )
            .unwrap_or_else(|e| panic!("{s} does not open: {e}"))
        })
        .collect()
}

/// Bit for bit, except that any NaN equals any NaN: a GPU makes canonical NaNs where the
/// host keeps the payload of an operand (random bytes contain NaNs).
fn same_values(got: &[u8], want: &[u8], dtype: DataType) -> bool {
    let nan = |b: &[u8]| match dtype {
        DataType::Float16 => bcl_backends::half::f16::from_le_bytes([b[0], b[1]]).is_nan(),
        DataType::Bfloat16 => bcl_backends::half::bf16::from_le_bytes([b[0], b[1]]).is_nan(),
        DataType::Float32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_nan(),
        DataType::Float64 => {
            f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]).is_nan()
        }
        _ => false,
    };
    got.len() == want.len()
        && got
            .chunks_exact(dtype.size())
            .zip(want.chunks_exact(dtype.size()))
            .all(|(g, w)| g == w || (nan(g) && nan(w)))
}

#[test]
fn reduce_matches_reference_for_every_dtype_and_op() {
    for dev in devices() {
        let stream = dev.default_stream();
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                let len = 40 * dtype.size();
                let (a, b) = (pattern(len, 3), pattern(len, 11));
                let mut want = a.clone();
                reduce_bytes(&mut want, &b, dtype, op).expect("reference");
                if op == ReduceOp::Avg {
                    divide_bytes(&mut want, dtype, 2).expect("reference");
                }
                let buf = dev.allocate(len).expect("allocate");
                dev.copy_to_device(buf.full(), &a, &stream).expect("h2d");
                dev.reduce_from_host(buf.full(), &b, dtype, op, &stream)
                    .expect("reduce");
                if op == ReduceOp::Avg {
                    dev.divide(buf.full(), dtype, 2, &stream).expect("divide");
                }
                let ev = dev.record_event(&stream).expect("event");
                dev.synchronize(&stream).expect("sync");
                assert!(dev.event_complete(&ev).expect("query"));
                let mut got = vec![0u8; len];
                dev.copy_to_host(&mut got, buf.full(), &stream)
                    .expect("d2h");
                assert!(
                    same_values(&got, &want, dtype),
                    "{} {dtype} {op}: {got:?} != {want:?}",
                    dev.info().model
                );
            }
        }
    }
}

#[test]
fn copies_between_buffers_and_within_one() {
    for dev in devices() {
        let s = dev.default_stream();
        let a = dev.allocate(64).expect("allocate");
        let b = dev.allocate(64).expect("allocate");
        dev.copy_to_device(a.full(), &pattern(64, 1), &s)
            .expect("h2d");
        dev.copy_within(b.slice(0, 32), a.slice(32, 32), &s)
            .expect("d2d");
        dev.copy_within(a.slice(0, 16), a.slice(48, 16), &s)
            .expect("same buffer");
        let mut got = vec![0u8; 32];
        dev.copy_to_host(&mut got, b.slice(0, 32), &s).expect("d2h");
        assert_eq!(got, pattern(64, 1)[32..]);
        let mut got = vec![0u8; 16];
        dev.copy_to_host(&mut got, a.slice(0, 16), &s).expect("d2h");
        assert_eq!(got, pattern(64, 1)[48..]);
    }
}

#[test]
fn bad_handles_and_ranges_are_errors() {
    let devs = devices();
    let (x, y) = (&devs[0], &devs[1]);
    let buf = x.allocate(16).expect("allocate");
    let err = y
        .copy_to_device(buf.full(), &[0u8; 16], &y.default_stream())
        .expect_err("foreign buffer");
    assert!(
        matches!(err, DeviceError::ForeignHandle { what: "buffer", .. }),
        "{err}"
    );
    let err = x
        .copy_to_device(buf.slice(8, 16), &[0u8; 16], &x.default_stream())
        .expect_err("out of range");
    assert!(err.to_string().contains("8..24"), "{err}");
    let err = x
        .copy_to_device(buf.full(), &[0u8; 16], &y.default_stream())
        .expect_err("foreign stream");
    assert!(matches!(
        err,
        DeviceError::ForeignHandle { what: "stream", .. }
    ));
    let err = x
        .reduce_from_host(
            buf.full(),
            &[0u8; 15],
            DataType::Float32,
            ReduceOp::Sum,
            &x.default_stream(),
        )
        .expect_err("short source");
    assert!(err.to_string().contains("lengths differ"), "{err}");
}

#[test]
fn sim_paces_copies_at_its_configured_bandwidth() {
    // 0.01 GB/s = 10 MB/s: 100 KB takes 10 ms at least.
    let dev = open_device(
        &"sim:copy=0.01".parse::<DeviceSpec>().expect("spec"),
        0,
        &Default::default(),
    )
    .expect("sim");
    let buf = dev.allocate(100_000).expect("allocate");
    let start = std::time::Instant::now();
    dev.copy_to_device(buf.full(), &vec![1u8; 100_000], &dev.default_stream())
        .expect("h2d");
    assert!(start.elapsed() >= std::time::Duration::from_millis(10));
    assert!(!dev.info().capabilities.host_addressable);
}
