//! The cuda backend. Without a GPU (CI): the backend refuses to open with an error that names
//! what is missing, and the kernel source compiles through NVRTC (CI installs NVRTC from
//! PyPI; where it is absent the test fails, naming it, unless `BCL_NO_NVRTC=1` says the
//! machine has none on purpose). On a GPU machine (`scripts/device-check.sh` runs the ignored
//! tests): every kernel against the cpu reference, staging, streams and holds.
#![cfg(feature = "cuda")]

use bcl_backends::cuda::{self, CudaDevice};
use bcl_backends::kernels::{divide_bytes, reduce_bytes};
use bcl_backends::{Accelerator, DataType, DeviceError, DeviceSpec, ReduceOp, open_device};
use std::time::{Duration, Instant};

/// The GPU of the (ignored unless asked for) GPU tests: asked for, they fail where it does
/// not open.
fn gpu() -> CudaDevice {
    match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => panic!("the GPU tests need cuda:0, which does not open: {e}"),
    }
}

#[test]
fn kernels_compile_through_nvrtc() {
    let names = cuda::kernel_names();
    assert_eq!(names.len(), DataType::ALL.len() * 5);
    match cuda::compile_kernels("compute_90") {
        Ok(ptx) => {
            let text = ptx.to_src();
            for name in &names {
                assert!(
                    text.contains(&format!(".entry {name}(")),
                    "kernel {name} missing from the PTX"
                );
            }
        }
        Err(cuda::CompileError::NvrtcMissing) if std::env::var_os("BCL_NO_NVRTC").is_some() => {
            eprintln!("NOT RUN: NVRTC (libnvrtc.so.13) is absent and BCL_NO_NVRTC is set");
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn a_host_without_the_driver_gets_an_error_naming_it() {
    if cuda::available().is_ok() {
        // A GPU host: an absent device is the error.
        let Err(e) = CudaDevice::open(4096) else {
            panic!("cuda:4096 opened");
        };
        assert!(e.to_string().contains("cuda:4096"), "{e}");
        return;
    }
    let Err(e) = open_device(&DeviceSpec::Cuda(0), 0, &Default::default()) else {
        panic!("cuda:0 opened on a host whose driver is not available");
    };
    let text = e.to_string();
    assert!(matches!(e, DeviceError::Unavailable(_)), "{text}");
    assert!(
        text.contains("cuda:0") && text.contains("libcuda"),
        "{text}"
    );
}

/// Bytes that exercise every element type: small integers, negative values, wrap-around.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
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

/// Values that are finite for the float types (random bytes make NaNs, whose payloads are
/// not part of the contract): small integers as the type's bytes.
fn values(dtype: DataType, n: usize, seed: u64) -> Vec<u8> {
    let raw = pattern(n, seed);
    let mut out = Vec::with_capacity(n * dtype.size());
    for (i, b) in raw.iter().enumerate() {
        let v = (*b as i64 % 19) - 9 + (i % 3) as i64;
        let bytes: Vec<u8> = match dtype {
            DataType::Float16 => half::f16::from_f32(v as f32 * 0.37).to_le_bytes().to_vec(),
            DataType::Bfloat16 => half::bf16::from_f32(v as f32 * 0.37).to_le_bytes().to_vec(),
            DataType::Float32 => (v as f32 * 0.37).to_le_bytes().to_vec(),
            DataType::Float64 => (v as f64 * 0.37).to_le_bytes().to_vec(),
            _ => {
                // Integers: raw bytes (wrap-around included).
                let mut b = pattern(dtype.size(), seed ^ i as u64);
                b.truncate(dtype.size());
                b
            }
        };
        out.extend_from_slice(&bytes);
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/device-check.sh runs it"]
fn every_kernel_matches_the_cpu_reference() {
    let dev = gpu();
    let s = dev.default_stream();
    // Counts around the 16-byte vector width, odd offsets (misaligned slices take the element
    // path), and one count larger than a staging slot.
    for (count, offset_elems) in [(1usize, 0usize), (37, 1), (4099, 3), (3 << 20, 0)] {
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                let len = count * dtype.size();
                let offset = offset_elems * dtype.size();
                let a = values(dtype, count, 3 + count as u64);
                let b = values(dtype, count, 11 + count as u64);
                let mut want = a.clone();
                reduce_bytes(&mut want, &b, dtype, op).expect("reference");
                if op == ReduceOp::Avg {
                    divide_bytes(&mut want, dtype, 3).expect("reference");
                }
                let buf = dev.allocate(offset + len).expect("allocate");
                dev.copy_to_device(buf.slice(offset, len), &a, &s)
                    .expect("h2d");
                dev.reduce_from_host(buf.slice(offset, len), &b, dtype, op, &s)
                    .expect("reduce");
                if op == ReduceOp::Avg {
                    dev.divide(buf.slice(offset, len), dtype, 3, &s)
                        .expect("divide");
                }
                let mut got = vec![0u8; len];
                dev.copy_to_host(&mut got, buf.slice(offset, len), &s)
                    .expect("d2h");
                if got != want {
                    let size = dtype.size();
                    let at = (0..count)
                        .find(|i| got[i * size..(i + 1) * size] != want[i * size..(i + 1) * size])
                        .unwrap_or(0);
                    panic!(
                        "{dtype} {op} count {count} offset {offset}: element {at} is {:?}, the cpu says {:?} (a {:?}, b {:?})",
                        &got[at * size..(at + 1) * size],
                        &want[at * size..(at + 1) * size],
                        &a[at * size..(at + 1) * size],
                        &b[at * size..(at + 1) * size]
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/device-check.sh runs it"]
fn copies_streams_events_and_bad_handles() {
    let dev = gpu();
    let s = dev.default_stream();
    let other = dev.create_stream().expect("stream");
    let n = 9 << 20; // over two staging slots
    let data = pattern(n, 5);
    let a = dev.allocate(n).expect("allocate");
    let b = dev.allocate(n).expect("allocate");
    dev.copy_to_device(a.full(), &data, &s).expect("h2d");
    dev.copy_within(b.full(), a.full(), &s).expect("d2d");
    let done = dev.record_event(&s).expect("event");
    dev.synchronize(&s).expect("sync");
    assert!(dev.event_complete(&done).expect("query"));
    assert!(dev.event_complete(&done).expect("query again"));
    let mut back = vec![0u8; n];
    dev.copy_to_host(&mut back, b.full(), &other).expect("d2h");
    assert!(back == data, "device-to-device copy changed bytes");
    // Within one buffer, disjoint halves.
    dev.copy_within(a.slice(0, n / 2), a.slice(n / 2, n / 2), &s)
        .expect("d2d within");
    dev.copy_to_host(&mut back[..n / 2], a.slice(0, n / 2), &s)
        .expect("d2h");
    assert!(back[..n / 2] == data[n / 2..], "copy within one buffer");
    assert!(
        dev.copy_within(a.slice(0, 64), a.slice(32, 64), &s)
            .is_err(),
        "overlap accepted"
    );
    // Range and handle checks.
    let e = dev
        .copy_to_device(a.slice(n - 4, 8), &[0u8; 8], &s)
        .expect_err("out of range");
    assert!(matches!(e, DeviceError::OutOfRange { .. }), "{e}");
    let cpu = open_device(&DeviceSpec::Cpu, 0, &Default::default()).expect("cpu");
    let foreign = cpu.allocate(8).expect("cpu buffer");
    let e = dev
        .copy_to_device(foreign.full(), &[0u8; 8], &s)
        .expect_err("foreign buffer");
    assert!(matches!(e, DeviceError::ForeignHandle { .. }), "{e}");
    let e = dev
        .synchronize(&cpu.default_stream())
        .expect_err("foreign stream");
    assert!(matches!(e, DeviceError::ForeignHandle { .. }), "{e}");
    let e = dev
        .reduce_from_host(
            a.slice(0, 6),
            &[0u8; 6],
            DataType::Float32,
            ReduceOp::Sum,
            &s,
        )
        .expect_err("partial element");
    assert!(matches!(e, DeviceError::Kernel { .. }), "{e}");
}

/// A hold keeps the stream's later work from running, without blocking the thread that made
/// it; releasing (or dropping) it lets the stream go on.
#[test]
#[ignore = "needs a CUDA GPU: scripts/device-check.sh runs it"]
fn a_held_stream_waits_for_its_release() {
    let dev = gpu();
    let caller = dev.create_stream().expect("stream");
    let buf = dev.allocate(1024).expect("allocate");
    dev.copy_to_device(buf.full(), &[1u8; 1024], &caller)
        .expect("h2d");
    let hold = dev.hold_stream(&caller).expect("hold");
    // Enqueued after the hold: must not run until it is released.
    dev.reduce_from_host(
        buf.full(),
        &[2u8; 1024],
        DataType::Uint8,
        ReduceOp::Sum,
        &caller,
    )
    .expect("reduce");
    let after = dev.record_event(&caller).expect("event");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !dev.event_complete(&after).expect("query"),
        "the stream ran past an unreleased hold"
    );
    hold.release();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dev.event_complete(&after).expect("query") {
        assert!(
            Instant::now() < deadline,
            "the stream did not go on after release"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut back = [0u8; 1024];
    dev.copy_to_host(&mut back, buf.full(), &caller)
        .expect("d2h");
    assert!(
        back.iter().all(|b| *b == 3),
        "work after the hold did not run"
    );
    // Dropping a hold releases it too, and many holds in a row reuse their flags.
    for _ in 0..3000 {
        let h = dev.hold_stream(&caller).expect("hold");
        drop(h);
    }
    dev.synchronize(&caller).expect("sync after dropped holds");
}
