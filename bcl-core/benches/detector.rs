//! Rank 0's slow-node detector under one round of windows (one from every rank, 500 ms of a
//! busy rank's measurements each): decoding, taking and evaluating them, at 1k, 10k and 100k
//! ranks. What `bcl-sim control` charges per window (docs/scale.md) comes from here.
//!   cargo bench -p bcl-core --bench detector

use bcl_core::health::slow::{ReportRound, frames};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use std::time::Duration;

fn detector(c: &mut Criterion) {
    let mut group = c.benchmark_group("detector_round");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    // 100 collectives a second, one in four sampled: 12 entry times a window.
    let entries = 12;
    for world in [1024usize, 10_000, 100_000] {
        let Ok(mut round) = ReportRound::new(world) else {
            panic!("a detector for {world} ranks");
        };
        // Fill the history first, as a running job has it.
        let mut next = 0u32;
        for _ in 0..48 {
            round.take(&frames(world, entries, next));
            next += 1;
        }
        let (whole, part) = round.summary_bytes();
        eprintln!(
            "{world} ranks: the summary takes {whole} bytes, its parts for rank 0's children {part}"
        );
        group.throughput(Throughput::Elements(world as u64));
        // Only rank 0's part is timed: the senders frame their windows in the setup.
        group.bench_function(format!("{world}_ranks"), |b| {
            b.iter_batched(
                || {
                    next += 1;
                    frames(world, entries, next)
                },
                |f| round.take(&f),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, detector);
criterion_main!(benches);
