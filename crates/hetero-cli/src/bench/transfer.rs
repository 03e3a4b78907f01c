//! `hetero bench transfer`: how bytes reach the device — copy batches against one
//! large copy and against one call per copy, the real cost of submitting a
//! batch's descriptors, 2-D copies against flat copies of the same bytes (on the
//! emulated link and on the CPU), and 4 KiB against 2 MiB IOMMU pages.
//!
//! Emulated figures are modelled (virtual time, from the device clock), hence
//! deterministic; `hetero/…` and `host/…` figures are wall-clock time on this
//! machine. Each target result has its peer in the same run:
//! - `emu/batch-4096x8k-over-one-32m`: 4096 scattered 8 KiB H2D copies in one
//!   batch over one 32 MiB copy (target ≤ 1.2);
//! - `emu/per-call-4096x8k-over-batch`: the same copies one op each over the
//!   batch (target ≥ 20), and the same two figures for the 32 MiB as 8192
//!   copies of 4 KiB (`emu/…-8192x4k-…`);
//! - `hetero/batch-submit-per-descriptor`: ns to add a descriptor and submit
//!   (target ≤ 50), beside `hetero/per-call-submit` (one op per copy);
//! - `emu/copy2d-worst-over-flat`: the worst 2-D copy over a flat copy of the
//!   same bytes, over widths from 1 byte and pitches incl. odd ones (≤ 1.5);
//! - `host/copy2d-over-memcpy`: the CPU 2-D copy's bandwidth over memcpy's,
//!   worst over rows ≥ 256 B (≥ 0.7);
//! - `emu/iotlb-4k-over-2m`: a 64 MiB H2D with 4 KiB IOMMU pages over 2 MiB
//!   pages, default I/O TLB (> 1).

use super::BenchReport;
use crate::device::DeviceSpec;
use hetero::{
    CopyBatch, CopyKind, Device, DeviceBuffer, DeviceConfig, EmuConfig, PinnedBuffer, Region2D,
    Result, Stream, TimeMode,
};
use std::time::Instant;

const PIECE: usize = 8 << 10;
const PIECES: usize = 4096;

fn emu_config(spec: &DeviceSpec) -> std::result::Result<EmuConfig, String> {
    match spec {
        DeviceSpec::Emu(emu) if emu.time_mode() == TimeMode::Virtual => Ok(emu.clone()),
        DeviceSpec::Emu(_) => {
            Err("bench transfer measures modelled time: use --device emu:PRESET (virtual)".into())
        }
        DeviceSpec::Host | DeviceSpec::Vulkan(_) => Err(
            "this device has no modelled link; use --device emu:PRESET (presets: pcie3x16, \
             pcie4x16, pcie5x16)"
                .into(),
        ),
    }
}

fn emu(cfg: EmuConfig) -> Result<Device> {
    Device::new(
        DeviceConfig::default()
            .stream_capacity(8192)
            .emu(cfg.capacity(2 << 30)),
    )
}

/// A fixed permutation of `0..n` (an LCG shuffle): scattered, reproducible.
fn scatter(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..n).rev() {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        v.swap(i, (x >> 33) as usize % (i + 1));
    }
    v
}

/// Modelled ns of `f`'s work on a fresh stream of `dev`.
fn modelled(dev: &Device, f: impl FnOnce(&hetero::Stream) -> Result<()>) -> Result<f64> {
    let s = dev.create_stream()?;
    s.synchronize()?;
    let t0 = dev.now_ns();
    f(&s)?;
    s.synchronize()?;
    Ok((dev.now_ns() - t0) as f64)
}

/// `n` scattered copies of `piece` bytes between two buffers of `n * piece`
/// bytes (pieces in one order on the host, reversed on the device).
struct Pieces {
    piece: usize,
    src: Vec<usize>,
    dst: Vec<usize>,
}

impl Pieces {
    fn new(piece: usize, n: usize) -> Self {
        let src = scatter(n);
        let dst = src.iter().rev().copied().collect();
        Pieces { piece, src, dst }
    }

    /// The copies as one batch.
    fn batch(&self, h: &PinnedBuffer<u8>, d: &DeviceBuffer<u8>) -> Result<CopyBatch> {
        let mut b = CopyBatch::with_capacity(CopyKind::H2D, self.src.len());
        for (a, z) in self.src.iter().zip(&self.dst) {
            b.h2d(h, a * self.piece, d, z * self.piece, self.piece)?;
        }
        Ok(b)
    }

    /// The copies one op each on `s`.
    fn per_call(&self, s: &Stream, h: &PinnedBuffer<u8>, d: &DeviceBuffer<u8>) -> Result<()> {
        for (a, z) in self.src.iter().zip(&self.dst) {
            s.copy_h2d_range(h, a * self.piece, d, z * self.piece, self.piece)?;
        }
        Ok(())
    }
}

/// Modelled ns of `p` as one batch and one op per copy, pushed as
/// `emu/{batch,per-call}-{tag}-ns` with their ratios over one copy of all the
/// bytes (`emu/one-32m-ns`, pushed before) and over each other.
fn piece_figures(
    rep: &mut BenchReport,
    dev: &Device,
    (h, d): (&PinnedBuffer<u8>, &DeviceBuffer<u8>),
    p: &Pieces,
    tag: &str,
) -> Result<()> {
    let batch = modelled(dev, |s| s.copy_batch(p.batch(h, d)?))?;
    let per_call = modelled(dev, |s| p.per_call(s, h, d))?;
    let (b, c) = (
        format!("emu/batch-{tag}-ns"),
        format!("emu/per-call-{tag}-ns"),
    );
    rep.push_value(&b, "ns", batch, 1);
    rep.push_value(&c, "ns", per_call, 1);
    let (b_one, c_b) = (
        format!("emu/batch-{tag}-over-one-32m"),
        format!("emu/per-call-{tag}-over-batch"),
    );
    let one = rep.median_of("emu/one-32m-ns").unwrap_or(f64::NAN);
    rep.push_value(&b_one, "x", batch / one, 1);
    rep.push_value(&c_b, "x", per_call / batch, 1);
    rep.ratio(&b_one, &b, "emu/one-32m-ns");
    rep.ratio(&c_b, &c, &b);
    Ok(())
}

/// Batch against one copy and against one call per copy (modelled), for
/// 4096 × 8 KiB and the same 32 MiB as 8192 × 4 KiB (pages, the size of many
/// small images: the ratio grows as the per-copy setup weighs more against
/// the bytes), and the real submission cost per descriptor beside one op per
/// copy.
fn batches(rep: &mut BenchReport, cfg: &EmuConfig, reps: usize) -> Result<()> {
    let dev = emu(cfg.clone())?;
    let n = PIECE * PIECES;
    let h = dev.alloc_pinned::<u8>(n)?;
    let d = dev.alloc::<u8>(n)?;
    let one = modelled(&dev, |s| s.copy_h2d(&h, &d))?;
    rep.push_value("emu/one-32m-ns", "ns", one, 1);
    let pieces = Pieces::new(PIECE, PIECES);
    piece_figures(rep, &dev, (&h, &d), &pieces, "4096x8k")?;
    let coalesced = modelled(&dev, |s| {
        s.set_coalescing(Some(hetero::Coalescing::default()))?;
        pieces.per_call(s, &h, &d)
    })?;
    rep.push_value("emu/per-call-coalesced-4096x8k-ns", "ns", coalesced, 1);
    rep.ratio(
        "emu/per-call-coalesced-4096x8k-over-batch",
        "emu/per-call-coalesced-4096x8k-ns",
        "emu/batch-4096x8k-ns",
    );
    const SMALL: usize = 4 << 10;
    piece_figures(
        rep,
        &dev,
        (&h, &d),
        &Pieces::new(SMALL, n / SMALL),
        "8192x4k",
    )?;
    rep.notes.push(format!(
        "emu/per-call-4096x8k-over-batch: one op per copy pays the preset's setup latency \
         ({} ns) each time; the ratio is about 1 + setup x bandwidth / 8 KiB",
        cfg.link().setup_ns
    ));

    // Real time to submit, per descriptor (building the batch included) and per
    // op; the model runs only at the synchronize after the timed part.
    let s = dev.create_stream()?;
    let (mut per_desc, mut per_op) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        s.copy_batch(pieces.batch(&h, &d)?)?;
        per_desc.push(t.elapsed().as_nanos() as f64 / PIECES as f64);
        s.synchronize()?;
        let t = Instant::now();
        pieces.per_call(&s, &h, &d)?;
        per_op.push(t.elapsed().as_nanos() as f64 / PIECES as f64);
        s.synchronize()?;
    }
    rep.push_samples("hetero/batch-submit-per-descriptor", "ns", &mut per_desc);
    rep.push_samples("hetero/per-call-submit", "ns", &mut per_op);
    rep.ratio_of(
        "hetero/per-call-submit",
        "hetero/batch-submit-per-descriptor",
    );
    Ok(())
}

/// 2-D over flat on the emulated link: every width and pitch of the sweep, both
/// directions, pitched on the device and flat on the host.
fn copy2d_emu(rep: &mut BenchReport, cfg: &EmuConfig, quick: bool) -> Result<()> {
    let dev = emu(cfg.clone())?;
    let widths: &[usize] = if quick {
        &[1, 3, 64, 255, 4096]
    } else {
        &[1, 2, 3, 7, 16, 33, 64, 255, 256, 1000, 4096, 65536]
    };
    let mut cases: Vec<(f64, String)> = Vec::new();
    for &w in widths {
        let rows = ((1usize << 20) / w).max(1);
        let bytes = w * rows;
        let host = dev.alloc_pinned::<u8>(bytes)?;
        let mut back = dev.alloc_pinned::<u8>(bytes)?;
        let flat_dev = dev.alloc::<u8>(bytes)?;
        let flat_h2d = modelled(&dev, |s| s.copy_h2d(&host, &flat_dev))?;
        let flat_d2h = modelled(&dev, |s| s.copy_d2h(&flat_dev, &mut back))?;
        let aligned = w.next_multiple_of(16);
        for pitch in [w, aligned, w + 1, 2 * w + 1, aligned + 16 * 3 + 5] {
            let buf = dev.alloc::<u8>(pitch * rows)?;
            let r = Region2D::new(0, pitch, w, rows);
            let flat = Region2D::flat(w, rows);
            let h2d = modelled(&dev, |s| s.copy_2d_h2d(&host, flat, &buf, r))?;
            let d2h = modelled(&dev, |s| s.copy_2d_d2h(&buf, r, &mut back, flat))?;
            for (dir, t, f) in [("h2d", h2d, flat_h2d), ("d2h", d2h, flat_d2h)] {
                let case = format!("{dir} {w} B x {rows} rows at pitch {pitch}");
                cases.push((t / f, case));
            }
        }
    }
    cases.sort_by(|a, b| b.0.total_cmp(&a.0));
    let worst = cases.first().map_or(f64::NAN, |c| c.0);
    rep.push_value("emu/copy2d-worst-over-flat", "x", worst, cases.len() as u64);
    let top: Vec<String> = cases
        .iter()
        .take(3)
        .map(|(r, c)| format!("{c}: {r:.3}"))
        .collect();
    let best = cases.last().map_or(f64::NAN, |c| c.0);
    rep.notes.push(format!(
        "emu/copy2d-worst-over-flat over {} cases (best {best:.3}); worst: {}",
        cases.len(),
        top.join("; ")
    ));
    Ok(())
}

/// Wall ns of one call of `f`.
fn timed(f: &mut impl FnMut() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_nanos() as f64)
}

/// The CPU 2-D copy (host device, device to device) against memcpy of the same
/// bytes, rows of at least 256 B, at a cache-line-aligned pitch (`w + 64`, as a
/// pitched buffer pads rows: the target figure) and at an odd one (`w + 13`:
/// rows straddle one more cache line each, reported beside it). The 2-D copy is
/// timed by events around it on the stream, memcpy by the wall clock around the
/// call; the two are timed in turn, pair by pair, so a change in the machine's
/// load moves both; each figure is the median of the pairs' ratios.
fn copy2d_host(rep: &mut BenchReport, quick: bool) -> Result<()> {
    // One engine, free to run on any core like the thread that runs memcpy,
    // and a host that parks while it copies (a copy takes milliseconds): on a
    // small, shared machine a pinned engine or a polling host thread would
    // measure the scheduler, not the copy.
    let dev = Device::new(
        DeviceConfig::default()
            .compute_units(1)
            .pin_engines(false)
            .host_wait(hetero::CompletionMode::Block),
    )?;
    let s = dev.create_stream()?;
    let bytes = if quick { 8 << 20 } else { 32 << 20 };
    let reps = if quick { 7 } else { 31 };
    let src_v = vec![7u8; bytes];
    let mut dst_v = vec![0u8; bytes];
    let (mut worst, mut worst_odd) = (f64::INFINITY, f64::INFINITY);
    let mut memcpy_gbps = Vec::new();
    for w in [256usize, 1000, 4096, 65536] {
        for (pad, label) in [(64usize, ""), (13, "-odd-pitch")] {
            let rows = bytes / w;
            let pitch = w + pad;
            let src = dev.alloc::<u8>(pitch * rows)?;
            let dst = dev.alloc::<u8>(pitch * rows)?;
            s.fill(&src, 3u8)?;
            s.fill(&dst, 0u8)?;
            let r = Region2D::new(0, pitch, w, rows);
            let n = w * rows;
            let mut memcpy = || {
                dst_v[..n].copy_from_slice(&src_v[..n]);
                std::hint::black_box(&mut dst_v);
                Ok(())
            };
            // The copy's own time, from events around it (as bandwidthTest times
            // a GPU copy): the engine's wake-up before it is not the copy's.
            let two_d = || -> Result<f64> {
                let start = s.record_event()?;
                s.copy_2d_d2d(&src, r, &dst, r)?;
                let end = s.record_event()?;
                end.synchronize()?;
                Ok(start.elapsed_ms(&end)? * 1e6)
            };
            timed(&mut memcpy)?;
            two_d()?;
            let (mut ratios, mut gbps) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                let m = timed(&mut memcpy)?;
                let t = two_d()?;
                ratios.push(m / t);
                gbps.push(n as f64 / t);
                memcpy_gbps.push(n as f64 / m);
            }
            rep.push_samples(
                &format!("host/copy2d-gbps-{w}b-rows{label}"),
                "GB/s",
                &mut gbps,
            );
            let name = format!("host/copy2d-over-memcpy-{w}b-rows{label}");
            let med = rep.push_samples(&name, "x", &mut ratios).median;
            if pad == 64 {
                worst = worst.min(med);
            } else {
                worst_odd = worst_odd.min(med);
            }
        }
    }
    rep.push_samples("host/memcpy-gbps", "GB/s", &mut memcpy_gbps);
    rep.push_value("host/copy2d-over-memcpy", "x", worst, 1);
    rep.push_value("host/copy2d-over-memcpy-odd-pitch", "x", worst_odd, 1);
    Ok(())
}

/// A 64 MiB H2D with 4 KiB IOMMU pages over the same with 2 MiB pages.
fn iotlb(rep: &mut BenchReport, cfg: &EmuConfig) -> Result<()> {
    let n = 64 << 20;
    let time = |page: usize| -> Result<(f64, String)> {
        let dev = emu(cfg.clone().iommu_page_max(page))?;
        let h = dev.alloc_pinned::<u8>(n)?;
        let d = dev.alloc::<u8>(n)?;
        let t = modelled(&dev, |s| s.copy_h2d(&h, &d))?;
        let st = dev.iommu_stats().expect("an emulated device has an IOMMU");
        let c = st.per_engine.first().map(|e| e.2).unwrap_or_default();
        Ok((
            t,
            format!(
                "pages mapped {:?}, {} misses / {} lookups",
                st.by_page,
                c.misses,
                c.hits + c.misses
            ),
        ))
    };
    let (small, small_note) = time(4096)?;
    let (large, large_note) = time(2 << 20)?;
    rep.push_value("emu/h2d-64m-4k-pages-ns", "ns", small, 1);
    rep.push_value("emu/h2d-64m-2m-pages-ns", "ns", large, 1);
    rep.push_value("emu/iotlb-4k-over-2m", "x", small / large, 1);
    rep.ratio(
        "emu/iotlb-4k-over-2m",
        "emu/h2d-64m-4k-pages-ns",
        "emu/h2d-64m-2m-pages-ns",
    );
    rep.notes.push(format!(
        "emu/iotlb-4k-over-2m: 4 KiB: {small_note}; 2 MiB: {large_note}; each miss stalls \
         {} ns (EmuConfig::iotlb_miss_ns), {} TLB entries",
        hetero::DEFAULT_IOTLB_MISS_NS,
        hetero::DEFAULT_IOTLB_ENTRIES
    ));
    Ok(())
}

pub fn run(quick: bool, spec: &DeviceSpec) -> std::result::Result<BenchReport, String> {
    let cfg = emu_config(spec)?;
    let mut rep = BenchReport::new("transfer");
    let reps = if quick { 10 } else { 50 };
    let err = |e: hetero::Error| e.to_string();
    batches(&mut rep, &cfg, reps).map_err(err)?;
    copy2d_emu(&mut rep, &cfg, quick).map_err(err)?;
    copy2d_host(&mut rep, quick).map_err(err)?;
    iotlb(&mut rep, &cfg).map_err(err)?;
    rep.notes
        .insert(0, format!("emu:{} in virtual time", cfg.link().name));
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_is_a_permutation() {
        let mut v = scatter(100);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
    }
}
