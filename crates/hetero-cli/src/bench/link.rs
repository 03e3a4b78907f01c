//! `hetero bench link`: H2D, D2H and both-at-once bandwidth on an emulated
//! device in virtual time (GB/s = bytes / modelled ns, from events), beside the
//! link preset's published figures as the reference.
//!
//! Both at once: an H2D and a D2H of the same size on two streams, both after
//! one start event; each direction's rate comes from its own end event. The
//! figures are modelled, hence deterministic: repetitions only show it.

use super::BenchReport;
use crate::device::DeviceSpec;
use hetero::{
    Context, Device, DeviceBuffer, DeviceConfig, EmuConfig, Event, LinkPreset, PeerLink,
    PinnedBuffer, Result, TimeMode,
};

/// The transfer sizes and their names in results.
pub const SIZES: &[(usize, &str)] = &[
    (4 << 10, "4k"),
    (64 << 10, "64k"),
    (1 << 20, "1m"),
    (64 << 20, "64m"),
    (1 << 30, "1g"),
];

/// The emulated device's memory: two buffers of the largest size, with room.
const CAPACITY: usize = 4 << 30;

/// One size's buffers: `h` → `x` (H2D), `y` → `g` (D2H).
struct Buffers {
    h: PinnedBuffer<u8>,
    g: PinnedBuffer<u8>,
    x: DeviceBuffer<u8>,
    y: DeviceBuffer<u8>,
}

impl Buffers {
    fn new(dev: &Device, n: usize) -> Result<Self> {
        Ok(Buffers {
            h: dev.alloc_pinned(n)?,
            g: dev.alloc_pinned(n)?,
            x: dev.alloc(n)?,
            y: dev.alloc(n)?,
        })
    }
}

fn size_name(n: usize) -> String {
    match SIZES.iter().find(|(s, _)| *s == n) {
        Some((_, name)) => (*name).into(),
        None if n >= 1 << 20 => format!("{}m", n >> 20),
        None => format!("{}k", n >> 10),
    }
}

/// GB/s of `bytes` between two completed events (device time).
fn gbps(bytes: usize, a: &Event, b: &Event) -> Result<f64> {
    Ok(bytes as f64 / (a.elapsed_ms(b)? * 1e6))
}

/// (H2D, D2H, both-at-once H2D, both-at-once D2H) GB/s for one size.
fn measure(dev: &Device, b: &mut Buffers, n: usize) -> Result<[f64; 4]> {
    let (s, t) = (dev.create_stream()?, dev.create_stream()?);
    let start = s.record_event()?;
    s.copy_h2d(&b.h, &b.x)?;
    let end = s.record_event()?;
    s.synchronize()?;
    let h2d = gbps(n, &start, &end)?;

    let start = s.record_event()?;
    s.copy_d2h(&b.y, &mut b.g)?;
    let end = s.record_event()?;
    s.synchronize()?;
    let d2h = gbps(n, &start, &end)?;

    let start = s.record_event()?;
    t.wait_event(&start)?;
    s.copy_h2d(&b.h, &b.x)?;
    let h_end = s.record_event()?;
    t.copy_d2h(&b.y, &mut b.g)?;
    let d_end = t.record_event()?;
    dev.synchronize()?;
    Ok([h2d, d2h, gbps(n, &start, &h_end)?, gbps(n, &start, &d_end)?])
}

/// Buffers of `n` bytes, or of the largest smaller power of two (down to
/// 64 MiB) the machine gives; a smaller size is said in `notes`.
fn buffers_for(dev: &Device, n: usize, notes: &mut Vec<String>) -> Option<(usize, Buffers)> {
    let mut size = n;
    loop {
        match Buffers::new(dev, size) {
            Ok(b) => {
                if size != n {
                    notes.push(format!(
                        "{} transfers measured at {} instead",
                        size_name(n),
                        size_name(size)
                    ));
                }
                return Some((size, b));
            }
            Err(e) if size > 64 << 20 && n > 64 << 20 => {
                notes.push(format!(
                    "could not allocate 2 x {} MiB pinned and 2 x {0} MiB device memory ({e}); \
                     trying half (raise RLIMIT_MEMLOCK or free memory for the full size)",
                    size >> 20
                ));
                size /= 2;
            }
            Err(e) => {
                notes.push(format!("skipped {}: {e}", size_name(n)));
                return None;
            }
        }
    }
}

/// The emulated device `spec` names (default pcie4x16), in virtual time, with
/// room for the largest transfers.
fn device_for(spec: &DeviceSpec) -> std::result::Result<(Device, LinkPreset), String> {
    let emu =
        match spec {
            DeviceSpec::Emu(emu) if emu.time_mode() == TimeMode::Virtual => emu.clone(),
            DeviceSpec::Emu(_) => {
                return Err(
                    "bench link measures modelled time: use --device emu:PRESET (virtual)".into(),
                )
            }
            DeviceSpec::Host | DeviceSpec::Vulkan(_) => return Err(
                "this device has no modelled link; use --device emu:PRESET (presets: pcie3x16, \
                 pcie4x16, pcie5x16)"
                    .into(),
            ),
        };
    let link = emu.link().clone();
    let emu: EmuConfig = emu.capacity(CAPACITY);
    let dev = Device::new(DeviceConfig::default().emu(emu)).map_err(|e| e.to_string())?;
    Ok((dev, link))
}

/// 10 000 H2D copies of `n` bytes on one stream: (modelled ms, wall ms).
fn small_copies(dev: &Device, n: usize) -> Result<(f64, f64)> {
    let s = dev.create_stream()?;
    let h = dev.alloc_pinned::<u8>(n)?;
    let d = dev.alloc::<u8>(n)?;
    let (t0, w0) = (dev.now_ns(), std::time::Instant::now());
    for _ in 0..10_000 {
        s.copy_h2d(&h, &d)?;
    }
    s.synchronize()?;
    let wall = w0.elapsed().as_secs_f64() * 1e3;
    Ok(((dev.now_ns() - t0) as f64 / 1e6, wall))
}

pub fn run(quick: bool, spec: &DeviceSpec) -> std::result::Result<BenchReport, String> {
    let (dev, link) = device_for(spec)?;
    let reps = if quick { 1 } else { 3 };
    let mut rep = BenchReport::new("link");
    let dirs = ["h2d", "d2h", "bidir-h2d", "bidir-d2h"];
    let preset = [
        link.h2d_gbps,
        link.d2h_gbps,
        link.bidir_h2d_gbps,
        link.bidir_d2h_gbps,
    ];
    for (dir, value) in dirs.iter().zip(preset) {
        rep.push_value(&format!("preset/{dir}-gbps"), "GB/s", value, 1);
    }
    let mut notes = vec![format!("emu:{}: {}", link.name, link.source)];
    for &(n, _) in SIZES {
        let Some((size, mut b)) = buffers_for(&dev, n, &mut notes) else {
            continue;
        };
        let mut samples: [Vec<f64>; 4] = Default::default();
        for _ in 0..reps {
            let r = measure(&dev, &mut b, size).map_err(|e| e.to_string())?;
            for (all, v) in samples.iter_mut().zip(r) {
                all.push(v);
            }
        }
        drop(b);
        dev.trim();
        let name = size_name(size);
        for (dir, s) in dirs.iter().zip(&mut samples) {
            let result = format!("emu/{dir}-gbps-{name}");
            rep.push_samples(&result, "GB/s", s);
            let reference = format!("preset/{dir}-gbps");
            rep.ratio(&format!("{result} / {reference}"), &result, &reference);
        }
    }
    // How much faster than the device it models virtual time runs, on a
    // transfer-bound workload: many small copies, their modelled time against
    // the wall time the simulation took. 256 B copies ride inline in the
    // command (1 µs each, no DMA); 4 KiB copies take the DMA path and pay the
    // link's setup latency, as every copy above the inline threshold does.
    for (bytes, name) in [(256, "256b"), (4 << 10, "4k")] {
        let (mut modelled, mut wall) = (Vec::new(), Vec::new());
        for _ in 0..reps.max(3) {
            let (m, w) = small_copies(&dev, bytes).map_err(|e| e.to_string())?;
            modelled.push(m);
            wall.push(w);
        }
        let (m, w) = (
            format!("emu/modelled-ms-10k-copies-{name}"),
            format!("emu/virtual-wall-ms-10k-copies-{name}"),
        );
        rep.push_samples(&m, "ms", &mut modelled);
        rep.push_samples(&w, "ms", &mut wall);
        rep.ratio(&format!("virtual speedup: {m} / {w}"), &m, &w);
    }
    let unpinned = dev.pinned_stats().unpinned_chunks;
    if unpinned > 0 {
        notes.push(format!(
            "{unpinned} pinned chunks are pageable here (RLIMIT_MEMLOCK); modelled figures do \
             not depend on it"
        ));
    }
    rep.notes = notes;
    Ok(rep)
}

/// `bench link --peer`: a copy between two emulated devices of one context
/// over the peer link `peer` (GB/s from events on the issuing device), alone
/// and both ways at once, beside the preset's figures.
pub fn run_peer(
    quick: bool,
    spec: &DeviceSpec,
    peer: &str,
) -> std::result::Result<BenchReport, String> {
    let link = PeerLink::by_name(peer).ok_or_else(|| {
        format!(
            "--peer-link {peer:?} is not a preset; use one of {}",
            PeerLink::names().join(", ")
        )
    })?;
    let (a, host_link) = device_for(spec)?;
    let (b, _) = device_for(spec)?;
    let _ctx = Context::with_peer_link(&[a.clone(), b.clone()], Some(link.clone()))
        .map_err(|e| e.to_string())?;
    let reps = if quick { 1 } else { 3 };
    let mut rep = BenchReport::new("link");
    rep.push_value("preset/peer-gbps", "GB/s", link.gbps, 1);
    rep.push_value("preset/peer-bidir-gbps", "GB/s", link.bidir_gbps, 1);
    let run = || -> Result<[f64; 3]> {
        let n = 64 << 20;
        let (x, y) = (a.alloc::<u8>(n)?, b.alloc::<u8>(n)?);
        let (u, v) = (b.alloc::<u8>(n)?, a.alloc::<u8>(n)?);
        let (s, t) = (a.create_stream()?, b.create_stream()?);
        let start = s.record_event()?;
        s.copy_peer(&x, &y)?;
        let end = s.record_event()?;
        s.synchronize()?;
        let alone = gbps(n, &start, &end)?;
        // Both ways at once: a → b issued on a, b → a issued on b, after one
        // start (each timed by its own device's events).
        let start = s.record_event()?;
        t.wait_event(&start)?;
        let t_start = t.record_event()?;
        s.copy_peer(&x, &y)?;
        let out_end = s.record_event()?;
        t.copy_peer(&u, &v)?;
        let back_end = t.record_event()?;
        s.synchronize()?;
        t.synchronize()?;
        Ok([
            alone,
            gbps(n, &start, &out_end)?,
            gbps(n, &t_start, &back_end)?,
        ])
    };
    let mut samples: [Vec<f64>; 3] = Default::default();
    for _ in 0..reps {
        let r = run().map_err(|e| e.to_string())?;
        for (all, v) in samples.iter_mut().zip(r) {
            all.push(v);
        }
    }
    let names = [
        ("emu/peer-gbps-64m", "preset/peer-gbps"),
        ("emu/peer-bidir-out-gbps-64m", "preset/peer-bidir-gbps"),
        ("emu/peer-bidir-back-gbps-64m", "preset/peer-bidir-gbps"),
    ];
    for ((result, reference), s) in names.iter().zip(&mut samples) {
        rep.push_samples(result, "GB/s", s);
        rep.ratio(&format!("{result} / {reference}"), result, reference);
    }
    rep.notes = vec![
        format!("peer link {}: {}", link.name, link.source),
        format!(
            "two emu:{} devices in virtual time; both ways at once: a → b issued on a, \
             b → a issued on b (each copy takes a copy engine at both ends)",
            host_link.name
        ),
    ];
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_named() {
        assert_eq!(size_name(64 << 20), "64m");
        assert_eq!(size_name(512 << 20), "512m");
        assert_eq!(size_name(4 << 10), "4k");
    }
}
