//! Random alloc/free churn on one stream (sizes log-uniform 64 B–1 MiB, about
//! 1000 live), for profiling the block and buffer levels together.
use hetero_memory::{Allocation, DevicePool, PoolConfig};

fn main() {
    let pool = DevicePool::new(PoolConfig::default()).expect("pool");
    let mut x = 0x5EED_CAFEu64;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut live: Vec<Allocation> = Vec::new();
    let n = 5_000_000u32;
    let t = std::time::Instant::now();
    for _ in 0..n {
        if live.len() < 1000 || next() % 2 == 0 {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            let size = (64.0 * (16384.0f64).powf(u)) as usize;
            live.push(pool.alloc(size, 256, 0).expect("alloc"));
        } else {
            let i = (next() % live.len() as u64) as usize;
            pool.free(live.swap_remove(i), 0, Vec::new());
        }
    }
    println!(
        "{:.2} ns per op",
        t.elapsed().as_nanos() as f64 / f64::from(n)
    );
    println!("{:?}", pool.stats());
}
