//! Submit-to-completion cost of empty one-block kernels: `cargo run --release
//! --example op_loop -- [streams] [reps] [stream capacity]` prints the median and
//! p99 ns per op over reps of 10 000 ops (for profiling the engine's per-op path;
//! with the default capacity of 1024 the submitter meets backpressure).
use hetero::{Device, DeviceConfig, Grid, Kernel};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let streams: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let capacity: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let mut cfg = DeviceConfig::default().stream_capacity(capacity);
    if let Some(units) = std::env::var("UNITS").ok().and_then(|u| u.parse().ok()) {
        cfg = cfg.compute_units(units);
    }
    if std::env::var_os("NOPIN").is_some() {
        cfg = cfg.pin_engines(false);
    }
    let dev = Device::new(cfg).expect("device");
    let ss: Vec<_> = (0..streams)
        .map(|_| dev.create_stream().expect("stream"))
        .collect();
    let k = Kernel::new("empty", |_| {});
    const OPS: usize = 10_000;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        for i in 0..OPS {
            ss[i % streams]
                .launch(&k, Grid::new(1), &[])
                .expect("launch");
        }
        dev.synchronize().expect("sync");
        v.push(t.elapsed().as_nanos() as f64 / OPS as f64);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{streams} stream(s): median {:.1} ns/op, p99 {:.1}",
        v[v.len() / 2],
        v[v.len() * 99 / 100]
    );
}
