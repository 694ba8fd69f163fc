//! fp32 sum kernel bandwidth next to memcpy's on this machine (bytes of destination per second).

use bcl_backends::ReduceOp;
use bcl_backends::kernels::reduce_slice;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("host_kernels");
    for elems in [1usize << 14, 1 << 22] {
        let bytes = (elems * 4) as u64;
        let src = vec![1.5f32; elems];
        let mut dst = vec![0.25f32; elems];
        // memcpy moves `bytes` read + `bytes` written; reduce reads 2×bytes and writes bytes.
        group.throughput(Throughput::Bytes(bytes));
        group.bench_function(format!("memcpy/{}KiB", bytes / 1024), |b| {
            b.iter(|| dst.copy_from_slice(black_box(&src)))
        });
        group.bench_function(format!("fp32_sum/{}KiB", bytes / 1024), |b| {
            b.iter(|| reduce_slice(black_box(&mut dst), black_box(&src), ReduceOp::Sum))
        });
    }
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
