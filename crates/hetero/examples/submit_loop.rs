//! Queued launches alone, for instruction counts (`valgrind --tool=callgrind`):
//! the stream is held by a host callback, so no engine consumes while we submit.
use hetero::{Device, DeviceConfig, Grid, Kernel};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let dev = Device::new(DeviceConfig::default().stream_capacity(1 << 16)).expect("device");
    let s = dev.create_stream().expect("stream");
    let k = Kernel::new("empty", |_| {});
    let mut total = std::time::Duration::ZERO;
    for _ in 0..n {
        let gate = Arc::new(AtomicBool::new(false));
        let g = gate.clone();
        s.host_fn(move || {
            while !g.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        })
        .expect("host_fn");
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            s.launch(&k, Grid::new(1), &[]).expect("launch");
        }
        total += t.elapsed();
        gate.store(true, Ordering::Release);
        s.synchronize().expect("synchronize");
    }
    println!(
        "{:.1} ns per queued launch",
        total.as_nanos() as f64 / (n * 1000) as f64
    );
}
