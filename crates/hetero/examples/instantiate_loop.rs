//! Instantiating a chain of empty kernel launches, for profiling the
//! instantiate path: `cargo run --release --example instantiate_loop -- [nodes]
//! [reps]` prints the median ns per node.
use hetero::{CommandBuffer, Device, Grid, Kernel};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let dev = Device::from_env().expect("device");
    let k = Kernel::new("empty", |_| {});
    let cb = CommandBuffer::new(&dev).expect("command buffer");
    for _ in 0..nodes {
        cb.launch(&k, Grid::new(1), &[]).expect("record");
    }
    let g = cb.into_graph().expect("graph");
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let exec = g.instantiate().expect("instantiate");
        v.push(t.elapsed().as_nanos() as f64 / nodes as f64);
        drop(exec);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    println!(
        "instantiate {nodes} nodes: median {:.1} ns/node",
        v[v.len() / 2]
    );
}
