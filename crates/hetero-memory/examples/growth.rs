//! The bench's growth trace with per-step figures, for tuning the chunk policy.
use hetero_memory::{DevicePool, PoolConfig};

fn main() {
    let pool = DevicePool::new(PoolConfig::default()).expect("pool");
    let weights: Vec<_> = [
        96usize << 20,
        48 << 20,
        7 << 20,
        7 << 20,
        300 << 10,
        300 << 10,
    ]
    .iter()
    .map(|&s| pool.alloc(s, 256, 0).expect("weights"))
    .collect();
    let base: usize = weights.iter().map(|a| a.size()).sum();
    let mut peak_live = base;
    for n in 1..=32usize {
        let mut acts = Vec::new();
        let mut live = base;
        for layer in 0..12 {
            for (k, per_item) in [(0, 48usize << 10), (1, 192 << 10), (2, 640 << 10)] {
                let s = n * per_item + layer * 4096 + k * 256;
                acts.push(pool.alloc(s, 256, 0).expect("activation"));
                live += s;
            }
            let tmp = pool.alloc(n * (96 << 10), 256, 0).expect("workspace");
            peak_live = peak_live.max(live + tmp.size());
            pool.free(tmp, 0, Vec::new());
        }
        peak_live = peak_live.max(live);
        let snap = pool.snapshot();
        let mut by_kind = std::collections::BTreeMap::new();
        for c in &snap.chunks {
            *by_kind.entry(c.kind).or_insert(0usize) += c.size >> 20;
        }
        println!(
            "n {n:2} live {:4} MiB reserved {:4} MiB peak {:4} MiB {:?}",
            live >> 20,
            snap.stats.reserved >> 20,
            snap.stats.peak_reserved >> 20,
            by_kind
        );
        if n == 32 && std::env::var_os("GROWTH_DUMP").is_some() {
            for c in snap.chunks.iter().filter(|c| c.kind == "large") {
                let b: Vec<String> = c
                    .blocks
                    .iter()
                    .map(|b| format!("{:?}:{:.2}", b.state, b.size as f64 / 1048576.0))
                    .collect();
                println!("  large chunk: {}", b.join(" "));
            }
        }
        for a in acts {
            pool.free(a, 0, Vec::new());
        }
    }
    println!(
        "ratio {:.3}",
        pool.stats().peak_reserved as f64 / peak_live as f64
    );
}
