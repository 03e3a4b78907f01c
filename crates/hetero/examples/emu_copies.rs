//! Small copies on the emulated device in virtual time: the simulation's cost per
//! op (`valgrind --tool=callgrind` for instruction counts).
use hetero::{Device, DeviceConfig, EmuConfig, LinkPreset};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let cfg = DeviceConfig::default().emu(EmuConfig::new(LinkPreset::pcie4x16()).capacity(1 << 30));
    let dev = Device::new(cfg).expect("emu");
    let s = dev.create_stream().expect("stream");
    let h = dev.alloc_pinned::<u8>(256).expect("pinned");
    let d = dev.alloc::<u8>(256).expect("device");
    let (t0, w0) = (dev.now_ns(), std::time::Instant::now());
    for _ in 0..n {
        s.copy_h2d(&h, &d).expect("copy");
    }
    s.synchronize().expect("sync");
    let wall = w0.elapsed().as_nanos() as f64;
    let modelled = (dev.now_ns() - t0) as f64;
    println!(
        "{:.0} ns wall per copy, {:.0} ns modelled: virtual runs {:.1}x faster",
        wall / n as f64,
        modelled / n as f64,
        modelled / wall
    );
}
