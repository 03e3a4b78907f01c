//! The cache-hit alloc+free loop alone, for profiling (`perf record`).
use hetero_memory::{DevicePool, PoolConfig};
use std::hint::black_box;

fn main() {
    let pool = DevicePool::new(PoolConfig::default()).expect("pool");
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000_000);
    let t = std::time::Instant::now();
    for _ in 0..n {
        let a = pool.alloc(black_box(4096), 256, 0).expect("alloc");
        black_box(a.ptr());
        pool.free(a, 0, Vec::new());
    }
    println!(
        "{:.2} ns per alloc+free",
        t.elapsed().as_nanos() as f64 / f64::from(n)
    );
    println!("{:?}", pool.stats());
}
