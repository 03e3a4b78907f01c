//! The engine's own per-op rate, without a submitter beside it: `cargo run
//! --release --example drain_probe` queues 10 000 empty one-block kernels behind
//! a host event, then releases them and times the drain (for profiling the
//! engine's per-op path under callgrind; `op_loop` times submission and drain
//! together).
use hetero::{Device, DeviceConfig, Grid, Kernel};
use std::time::Instant;
fn main() {
    let dev = Device::new(DeviceConfig::default().stream_capacity(16384)).expect("device");
    let s = dev.create_stream().expect("stream");
    let k = Kernel::new("empty", |_| {});
    for _ in 0..10 {
        let go = dev.host_event();
        s.wait_event(go.event()).expect("wait");
        let t0 = Instant::now();
        for _ in 0..10_000 {
            s.launch(&k, Grid::new(1), &[]).expect("launch");
        }
        let sub = t0.elapsed();
        let t = Instant::now();
        go.signal();
        s.synchronize().expect("sync");
        println!(
            "submit {:.1} ns/op, drain {:.1} ns/op",
            sub.as_nanos() as f64 / 1e4,
            t.elapsed().as_nanos() as f64 / 1e4
        );
    }
}
