//! Stream capture of empty kernel launches, for profiling the recording path:
//! `cargo run --release --example capture_loop -- [ops] [reps]` prints the
//! median ns per captured op.
use hetero::{Device, Grid, Kernel};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let ops: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let dev = Device::from_env().expect("device");
    let s = dev.create_stream().expect("stream");
    let k = Kernel::new("empty", |_| {});
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        s.begin_capture().expect("begin");
        let t = Instant::now();
        for _ in 0..ops {
            s.launch(&k, Grid::new(1), &[]).expect("record");
        }
        v.push(t.elapsed().as_nanos() as f64 / ops as f64);
        drop(s.end_capture().expect("end"));
    }
    v.sort_by(|a, b| a.total_cmp(b));
    println!("stream capture: median {:.1} ns/op", v[v.len() / 2]);
}
