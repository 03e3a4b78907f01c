//! Graphs beside the same work op by op, in the same run, on the device
//! `HETERO_BACKEND` names (host when unset).
//!
//! - `graph_replay`: a 100-node chain of empty kernels (recorded in a command
//!   buffer, instantiated once) launched and synchronized, vs the same 100
//!   launches op by op on a stream and synchronized; end to end.
//! - `capture`: stream capture of 100 empty launches (begin_capture … end_capture;
//!   the graph is dropped outside the clock), vs the same 100 launches submitted
//!   to a stream (submission only: the drain after each batch is not timed).
//!
//! Throughput is in nodes (ops), so criterion prints the time per node of each
//! side; their ratio is the figure. `cargo bench -p hetero --bench graph` takes
//! about half a minute.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hetero::{CommandBuffer, Device, Grid, Kernel};

/// Nodes of the chain, ops of a capture.
const N: u64 = 100;

fn setup() -> (Device, Kernel) {
    let dev = Device::from_env().expect("HETERO_BACKEND names a device");
    (dev, Kernel::new("empty", |_| {}))
}

fn graph_replay(c: &mut Criterion) {
    let (dev, k) = setup();
    let s = dev.create_stream().expect("stream");
    let cb = CommandBuffer::new(&dev).expect("command buffer");
    for _ in 0..N {
        cb.launch(&k, Grid::new(1), &[]).expect("record launch");
    }
    let exec = cb.finish().expect("instantiate");

    let mut g = c.benchmark_group("graph_replay");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(N));
    g.bench_function("hetero/graph-chain-100", |b| {
        b.iter(|| {
            s.launch_graph(&exec).expect("launch_graph");
            s.synchronize().expect("synchronize");
        })
    });
    g.bench_function("stream/ops-100", |b| {
        b.iter(|| {
            for _ in 0..N {
                s.launch(&k, Grid::new(1), &[]).expect("launch");
            }
            s.synchronize().expect("synchronize");
        })
    });
    g.finish();
}

fn capture(c: &mut Criterion) {
    let (dev, k) = setup();
    let s = dev.create_stream().expect("stream");

    let mut g = c.benchmark_group("capture");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(N));
    // Each graph is dropped before the next capture, outside the clock (a batch
    // of live graphs would make the captures pay for them: begin_capture visits
    // every live capture).
    g.bench_function("hetero/capture-100", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                s.begin_capture().expect("begin_capture");
                for _ in 0..N {
                    s.launch(&k, Grid::new(1), &[]).expect("captured launch");
                }
                let graph = s.end_capture().expect("end_capture");
                total += t.elapsed();
                drop(graph);
            }
            total
        })
    });
    g.bench_function("stream/submit-100", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                for _ in 0..N {
                    s.launch(&k, Grid::new(1), &[]).expect("launch");
                }
                total += t.elapsed();
                s.synchronize().expect("synchronize");
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, graph_replay, capture);
criterion_main!(benches);
