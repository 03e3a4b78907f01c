//! `hetero bench managed`: managed buffers on an emulated device, in modelled
//! (virtual) time, beside their peers in the same run:
//! - `emu/managed-pipeline-ms` beside `emu/explicit-pipeline-ms`: the demo's
//!   three stages (H2D → kernel → D2H per tile) written with explicit copies
//!   on three streams joined by events, and written as a CUDA user writes it
//!   with managed memory: no copies, each tile's kernel on one of three
//!   streams (its input pages move by its declared arguments), its result
//!   prefetched to the host on the same stream. Ratio
//!   `emu/managed-pipeline-over-explicit` (target ≤ 1.05). Reps interleave the
//!   sides. `emu/managed-one-stream-pipeline-ms` puts every tile on one
//!   stream: its migrations still overlap its kernels (they run on the
//!   stream's migration stream), its prefetches to the host do not.
//! - `emu/oversubscribed-2x-bytes` beside `emu/oversubscribed-2x-minimum-bytes`:
//!   a kernel streaming (reading and writing in place) over a managed buffer
//!   twice the device's capacity, then a host read of all of it; the minimum
//!   is every page in once and, as all are written, out once. Ratio
//!   `emu/oversubscribed-2x-bytes-over-minimum` (target ≤ 1.05).
//! - `emu/oversubscribed-2x-clean-evictions-copied`: a read-only streaming
//!   pass over the same clean buffer: bytes its evictions copied (target 0),
//!   beside the clean evictions it made.
//! - `emu/thrash-random-…`: a kernel reading random tiles (a fixed seed) of a
//!   managed buffer 1.5 times the device's capacity, with thrash throttling
//!   and pinning on and off: modelled ms and bytes moved each, reported.

use super::BenchReport;
use crate::device::DeviceSpec;
use hetero::{
    Arg, Device, DeviceConfig, Grid, Kernel, KernelCost, Location, ManagedBuffer, Stream, TimeMode,
};

type Result<T> = std::result::Result<T, String>;

fn err(e: hetero::Error) -> String {
    e.to_string()
}

/// A tile: 1 MiB of f32 (16 pages of 64 KiB, so tiles share no page).
const TILE: usize = 1 << 18;
/// Modelled work per element of the stage kernel (flops).
const FLOPS_PER_ELEM: f64 = 16.0;

fn stage_kernel() -> Kernel {
    Kernel::with_cost(
        "stage",
        |_: Grid| KernelCost {
            flops: TILE as f64 * FLOPS_PER_ELEM,
            bytes: 2.0 * (TILE * 4) as f64,
        },
        |b| {
            let src = b.read::<f32>(0);
            let off = b.write_offset(0);
            let dst = b.write::<f32>(0);
            for (i, d) in dst.iter_mut().enumerate() {
                *d = src[off + i] * 2.0 + 1.0;
            }
        },
    )
}

fn device_for(spec: &DeviceSpec, capacity: usize) -> Result<Device> {
    let emu = match spec {
        DeviceSpec::Emu(emu) if emu.time_mode() == TimeMode::Virtual => emu.clone(),
        _ => {
            return Err(
                "bench managed measures modelled time: use --device emu:PRESET (virtual time)"
                    .into(),
            )
        }
    };
    Device::new(DeviceConfig::default().emu(emu.capacity(capacity))).map_err(err)
}

fn sync_all(streams: &[Stream]) -> Result<()> {
    streams
        .iter()
        .try_for_each(|s| s.synchronize().map_err(err))
}

fn input(tiles: usize) -> Vec<f32> {
    (0..tiles * TILE).map(|i| (i % 1000) as f32).collect()
}

fn check(out: &[f32], input: &[f32], what: &str) -> Result<()> {
    match out.iter().zip(input).position(|(o, i)| *o != i * 2.0 + 1.0) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {}, not {}",
            out[i],
            input[i] * 2.0 + 1.0
        )),
    }
}

/// The explicit pipeline: modelled ms.
fn explicit(dev: &Device, data: &[f32], tiles: usize) -> Result<f64> {
    let k = stage_kernel();
    let streams: Vec<Stream> = (0..3)
        .map(|_| dev.create_stream().map_err(err))
        .collect::<Result<_>>()?;
    let (h2d, comp, d2h) = (&streams[0], &streams[1], &streams[2]);
    let pin_in = dev.pinned_from_slice(data).map_err(err)?;
    let mut pin_out = dev.alloc_pinned::<f32>(tiles * TILE).map_err(err)?;
    let ins: Vec<_> = (0..tiles)
        .map(|_| dev.alloc::<f32>(TILE).map_err(err))
        .collect::<Result<_>>()?;
    let outs: Vec<_> = (0..tiles)
        .map(|_| dev.alloc::<f32>(TILE).map_err(err))
        .collect::<Result<_>>()?;
    sync_all(&streams)?;
    let t0 = dev.now_ns();
    for t in 0..tiles {
        h2d.copy_h2d_range(&pin_in, t * TILE, &ins[t], 0, TILE)
            .map_err(err)?;
        let e = h2d.record_event().map_err(err)?;
        comp.wait_event(&e).map_err(err)?;
        comp.launch(&k, 4.into(), &[Arg::read(&ins[t]), Arg::write(&outs[t])])
            .map_err(err)?;
        let e = comp.record_event().map_err(err)?;
        d2h.wait_event(&e).map_err(err)?;
        d2h.copy_d2h_range(&outs[t], 0, &mut pin_out, t * TILE, TILE)
            .map_err(err)?;
    }
    sync_all(&streams)?;
    let ms = (dev.now_ns() - t0) as f64 / 1e6;
    check(pin_out.as_slice().map_err(err)?, data, "explicit pipeline")?;
    Ok(ms)
}

/// The managed pipeline over `nstreams` streams: modelled ms.
fn managed(dev: &Device, data: &[f32], tiles: usize, nstreams: usize) -> Result<f64> {
    let k = stage_kernel();
    let streams: Vec<Stream> = (0..nstreams)
        .map(|_| dev.create_stream().map_err(err))
        .collect::<Result<_>>()?;
    let m_in: ManagedBuffer<f32> = dev.alloc_managed(tiles * TILE).map_err(err)?;
    let m_out: ManagedBuffer<f32> = dev.alloc_managed(tiles * TILE).map_err(err)?;
    m_in.write(..).map_err(err)?.copy_from_slice(data);
    sync_all(&streams)?;
    let t0 = dev.now_ns();
    for t in 0..tiles {
        let s = &streams[t % nstreams];
        let r = t * TILE..(t + 1) * TILE;
        s.launch(
            &k,
            4.into(),
            &[
                Arg::managed_read_range(&m_in, r.clone()),
                Arg::managed_write_range(&m_out, r.clone()),
            ],
        )
        .map_err(err)?;
        m_out.prefetch(r, Location::Host, s).map_err(err)?;
    }
    sync_all(&streams)?;
    let ms = (dev.now_ns() - t0) as f64 / 1e6;
    let before = dev.managed_stats().bytes_to_host;
    check(&m_out.read(..).map_err(err)?, data, "managed pipeline")?;
    if dev.managed_stats().bytes_to_host != before {
        return Err(
            "managed pipeline: the host read copied pages the prefetches should have".into(),
        );
    }
    Ok(ms)
}

/// Streaming passes over twice the capacity: (bytes moved, minimum bytes,
/// bytes the clean pass copied back, clean evictions of that pass).
fn oversubscribed(dev: &Device, capacity: usize) -> Result<(u64, u64, u64, u64)> {
    let s = dev.create_stream().map_err(err)?;
    let elems = 2 * capacity / 4;
    let buf: ManagedBuffer<f32> = dev.alloc_managed(elems).map_err(err)?;
    buf.write(..).map_err(err)?.fill(1.0);
    let inplace = Kernel::new("inplace", |b| {
        for x in b.write::<f32>(0) {
            *x = *x * 2.0 + 1.0;
        }
    });
    let st0 = dev.managed_stats();
    for t in 0..elems / TILE {
        s.launch(
            &inplace,
            4.into(),
            &[Arg::managed_write_range(&buf, t * TILE..(t + 1) * TILE)],
        )
        .map_err(err)?;
    }
    s.synchronize().map_err(err)?;
    if buf.read(..).map_err(err)?.iter().any(|&x| x != 3.0) {
        return Err("oversubscribed pass: wrong values".into());
    }
    let st1 = dev.managed_stats();
    let moved =
        (st1.bytes_to_device - st0.bytes_to_device) + (st1.bytes_to_host - st0.bytes_to_host);
    let minimum = 2 * (elems * 4) as u64;
    // Read-only pass: every eviction is of a clean page.
    let sums = dev.alloc::<f32>(4).map_err(err)?;
    let reader = Kernel::new("reader", |b| {
        let s: f32 = b.read::<f32>(0).iter().sum();
        if let Some(x) = b.write::<f32>(0).first_mut() {
            *x = s;
        }
    });
    for t in 0..elems / TILE {
        s.launch(
            &reader,
            1.into(),
            &[
                Arg::managed_read_range(&buf, t * TILE..(t + 1) * TILE),
                Arg::write(&sums),
            ],
        )
        .map_err(err)?;
    }
    s.synchronize().map_err(err)?;
    let st2 = dev.managed_stats();
    if st2.dirty_evictions != st1.dirty_evictions {
        return Err("read-only pass evicted dirty pages".into());
    }
    Ok((
        moved,
        minimum,
        st2.bytes_to_host - st1.bytes_to_host,
        st2.clean_evictions - st1.clean_evictions,
    ))
}

/// Random tile reads over 1.5x capacity: (modelled ms, bytes moved, thrash events).
fn thrash_random(
    spec: &DeviceSpec,
    capacity: usize,
    launches: usize,
    throttle: bool,
) -> Result<(f64, u64, u64)> {
    let dev = device_for(spec, capacity)?;
    dev.set_managed_thrash_throttling(throttle);
    let s = dev.create_stream().map_err(err)?;
    let tiles = 3 * capacity / 2 / (TILE * 4);
    let buf: ManagedBuffer<f32> = dev.alloc_managed(tiles * TILE).map_err(err)?;
    buf.write(..).map_err(err)?.fill(1.0);
    let sums = dev.alloc::<f32>(4).map_err(err)?;
    let reader = Kernel::new("reader", |b| {
        let s: f32 = b.read::<f32>(0).iter().sum();
        if let Some(x) = b.write::<f32>(0).first_mut() {
            *x = s;
        }
    });
    s.synchronize().map_err(err)?;
    let st0 = dev.managed_stats();
    let t0 = dev.now_ns();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..launches {
        // xorshift64: the same sequence on both sides.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let t = (x % tiles as u64) as usize;
        s.launch(
            &reader,
            1.into(),
            &[
                Arg::managed_read_range(&buf, t * TILE..(t + 1) * TILE),
                Arg::write(&sums),
            ],
        )
        .map_err(err)?;
    }
    s.synchronize().map_err(err)?;
    let ms = (dev.now_ns() - t0) as f64 / 1e6;
    let st1 = dev.managed_stats();
    let moved =
        (st1.bytes_to_device - st0.bytes_to_device) + (st1.bytes_to_host - st0.bytes_to_host);
    Ok((ms, moved, st1.thrash_events - st0.thrash_events))
}

pub fn run(quick: bool, spec: &DeviceSpec) -> Result<BenchReport> {
    let mut rep = BenchReport::new("managed");
    let tiles = if quick { 12 } else { 48 };
    let reps = if quick { 1 } else { 3 };
    let data = input(tiles);
    let (mut ex, mut ma, mut one) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        // Interleaved, each on a fresh device (the same model state).
        ex.push(explicit(&device_for(spec, 1 << 30)?, &data, tiles)?);
        ma.push(managed(&device_for(spec, 1 << 30)?, &data, tiles, 3)?);
        one.push(managed(&device_for(spec, 1 << 30)?, &data, tiles, 1)?);
    }
    rep.push_samples("emu/explicit-pipeline-ms", "ms", &mut ex);
    rep.push_samples("emu/managed-pipeline-ms", "ms", &mut ma);
    rep.push_samples("emu/managed-one-stream-pipeline-ms", "ms", &mut one);
    rep.ratio(
        "emu/managed-pipeline-over-explicit",
        "emu/managed-pipeline-ms",
        "emu/explicit-pipeline-ms",
    );
    rep.ratio(
        "emu/managed-one-stream-over-explicit",
        "emu/managed-one-stream-pipeline-ms",
        "emu/explicit-pipeline-ms",
    );
    let capacity = if quick { 32 << 20 } else { 128 << 20 };
    let dev = device_for(spec, capacity)?;
    let (moved, minimum, clean_copied, clean) = oversubscribed(&dev, capacity)?;
    rep.push_value("emu/oversubscribed-2x-bytes", "B", moved as f64, 1);
    rep.push_value(
        "emu/oversubscribed-2x-minimum-bytes",
        "B",
        minimum as f64,
        1,
    );
    rep.ratio(
        "emu/oversubscribed-2x-bytes-over-minimum",
        "emu/oversubscribed-2x-bytes",
        "emu/oversubscribed-2x-minimum-bytes",
    );
    rep.push_value(
        "emu/oversubscribed-2x-clean-evictions-copied",
        "B",
        clean_copied as f64,
        1,
    );
    rep.push_value(
        "emu/oversubscribed-2x-clean-evictions",
        "pages",
        clean as f64,
        1,
    );
    let launches = if quick { 200 } else { 1000 };
    for (throttle, side) in [(true, "throttled"), (false, "lru-only")] {
        let (ms, moved, thrash) = thrash_random(spec, capacity, launches, throttle)?;
        rep.push_value(&format!("emu/thrash-random-{side}-ms"), "ms", ms, 1);
        rep.push_value(
            &format!("emu/thrash-random-{side}-bytes"),
            "B",
            moved as f64,
            1,
        );
        rep.push_value(
            &format!("emu/thrash-random-{side}-thrash-events"),
            "pages",
            thrash as f64,
            1,
        );
    }
    rep.ratio(
        "emu/thrash-random-throttled-over-lru-only",
        "emu/thrash-random-throttled-ms",
        "emu/thrash-random-lru-only-ms",
    );
    rep.notes.push(
        "thrash-random reads tiles uniformly at random: every page thrashes alike, so \
         throttled and pinned pages rank together and eviction order matches plain LRU; \
         throttling changes the order only where some pages thrash more than others"
            .into(),
    );
    rep.context.insert("device".into(), format!("{spec:?}"));
    rep.context
        .insert("tiles".into(), format!("{tiles} x 1 MiB"));
    rep.context.insert(
        "oversubscribed capacity".into(),
        format!("{} MiB", capacity >> 20),
    );
    rep.unavailable.insert(
        "emu/fault-driven-over-declared".into(),
        "not built: hetero has no fault-driven device migration mode to compare against".into(),
    );
    for name in [
        "host/managed-first-touch-gbps",
        "host/managed-prefetch-to-host-over-fresh-memcpy",
        "host/managed-read-back-tree-over-64k",
    ] {
        rep.unavailable.insert(
            name.into(),
            "not built: host-side faults (userfaultfd, mprotect) are not implemented; the host \
             reaches managed memory through guards only"
                .into(),
        );
    }
    Ok(rep)
}
