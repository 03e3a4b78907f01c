//! The recorder's hot path side by side: an empty loop body (baseline),
//! `record_op` with recording off, and with recording on (drained outside the
//! timed region every 4096 records, so memory stays bounded; chunk
//! allocations are included, amortized).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use hetero_trace::{EngineKind, OpKind, OpRecord};

fn sample() -> OpRecord {
    OpRecord {
        kind: OpKind::Kernel,
        name: "bench",
        stream: 1,
        queue: 0,
        engine: EngineKind::Compute,
        engine_index: 0,
        seq: 1,
        submit_ns: 10,
        start_ns: 20,
        end_ns: 30,
        bytes: 4096,
        dep: None,
        failed: false,
        node: None,
    }
}

fn record(c: &mut Criterion) {
    let rec = sample();
    let mut g = c.benchmark_group("record_op");
    g.bench_function("baseline-empty", |b| {
        // The same input copy as the others, and nothing else.
        b.iter(|| {
            black_box(rec);
        })
    });
    hetero_trace::set_enabled(false);
    g.bench_function("disabled", |b| {
        b.iter(|| hetero_trace::record_op(black_box(rec)))
    });
    hetero_trace::set_enabled(true);
    g.bench_function("enabled", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(4096);
                let t = Instant::now();
                for _ in 0..n {
                    hetero_trace::record_op(black_box(rec));
                }
                total += t.elapsed();
                left -= n;
                black_box(hetero_trace::take());
            }
            total
        })
    });
    hetero_trace::set_enabled(false);
    g.finish();
}

criterion_group!(benches, record);
criterion_main!(benches);
