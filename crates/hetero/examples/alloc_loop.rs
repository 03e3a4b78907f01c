//! `Stream::alloc` + drop on an idle stream alone, for instruction counts
//! (`valgrind --tool=callgrind`).
use hetero::{Device, DeviceConfig};
use std::hint::black_box;

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dev = Device::new(DeviceConfig::default()).expect("device");
    let s = dev.create_stream().expect("stream");
    let t = std::time::Instant::now();
    for _ in 0..n {
        let b = s.alloc::<u8>(black_box(4096)).expect("alloc");
        black_box(&b);
    }
    println!(
        "{:.1} ns per Stream::alloc + drop",
        t.elapsed().as_nanos() as f64 / f64::from(n)
    );
}
