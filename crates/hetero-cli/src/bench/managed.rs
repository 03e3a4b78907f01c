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
//! - `emu/fault-driven-pipeline-ms`: the managed pipeline again on a device
//!   that migrates as a faulting device does (`Device::set_managed_fault_model`:
//!   pages move on the kernel's own stream after a modelled fault service,
//!   nothing overlaps), interleaved with the declared runs. Ratio
//!   `emu/fault-driven-over-declared` (reported; NVIDIA's figure for fault
//!   driven over prefetched is about 10x). The fault cost is `UVM_FAULT_COST`.
//!
//! Host faults, wall time on this machine (the emulated device's managed
//! buffers, whose host view faults):
//! - `host/managed-first-touch-gbps` beside `uffd/first-touch-gbps` and
//!   `mprotect/first-touch-gbps`: new memory touched once per 4 KiB,
//!   sequentially, resolved in 64 KiB granules, the allocation included on
//!   every side: a managed buffer (`alloc_managed`, then its host view);
//!   a raw userfaultfd loop (anonymous memory registered for missing faults,
//!   `UFFD_FEATURE_SIGBUS`, the SIGBUS handler fills the granule with
//!   `UFFDIO_COPY` and returns); a raw mprotect loop (`PROT_NONE` memory, the
//!   SIGSEGV handler makes the granule read-write). Ratios
//!   `host/managed-first-touch-over-uffd` (target ≥ 0.8) and
//!   `host/managed-first-touch-over-mprotect` (target ≥ 1.3). Beside them
//!   the floor of the managed design: `uffd-shmem/first-touch-gbps`, the
//!   same userfaultfd loop over a memfd mapped shared (a managed host copy
//!   must be shared memory: the runtime's alias and the user's view map the
//!   same pages), with `host/managed-first-touch-over-uffd-shmem` and
//!   `uffd-shmem/first-touch-over-mprotect` (the most the managed ratio
//!   over mprotect can be), reported.
//! - `host/managed-prefetch-to-host-gbps` beside `host/fresh-memcpy-gbps`: an
//!   explicit prefetch to the host of 256 MiB a kernel left dirty on the
//!   device, and a memcpy of as many bytes into freshly allocated memory.
//!   Ratio `host/managed-prefetch-to-host-over-fresh-memcpy` (target ≥ 0.8),
//!   and beside it the floor of the managed design:
//!   `host/fresh-memcpy-shmem-gbps`, the memcpy into a fresh memfd mapped
//!   shared (the host copy's kind of memory), with
//!   `host/managed-prefetch-to-host-over-fresh-memcpy-shmem`, reported.
//! - `host/managed-read-back-tree-gbps` beside `host/managed-read-back-64k-gbps`:
//!   host reads (one per 4 KiB) of pages a kernel left dirty on the device,
//!   with the 2 MiB tree prefetch and with 64 KiB faults only. Ratio
//!   `host/managed-read-back-tree-over-64k` (reported).

use super::BenchReport;
use crate::device::DeviceSpec;
use hetero::{
    Arg, Device, DeviceConfig, DeviceFaultCost, Grid, Kernel, KernelCost, Location, ManagedBuffer,
    Stream, TimeMode,
};
use std::time::Instant;

/// A modelled device page fault, from UVM's fault servicing: the driver takes
/// faults from the GPU's fault buffer in batches of up to 256
/// (`uvm_perf_fault_batch_count`, default 256, NVIDIA open-gpu-kernel-modules
/// kernel-open/nvidia-uvm/uvm_gpu_replayable_faults.c), and servicing a fault
/// costs 20–50 µs before its pages move (Zheng et al., "Towards High
/// Performance Paged Memory for GPUs", HPCA 2016, §2: far-fault latency of
/// 20–50 µs, including the CPU's interrupt handling and page table walks).
/// The low end per batch, so the modelled cost is a lower bound.
const UVM_FAULT_COST: DeviceFaultCost = DeviceFaultCost {
    batch_faults: 256,
    batch_ns: 20_000,
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
    let (mut fd, mut fd1) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        // Interleaved, each on a fresh device (the same model state).
        ex.push(explicit(&device_for(spec, 1 << 30)?, &data, tiles)?);
        ma.push(managed(&device_for(spec, 1 << 30)?, &data, tiles, 3)?);
        one.push(managed(&device_for(spec, 1 << 30)?, &data, tiles, 1)?);
        let faulting = device_for(spec, 1 << 30)?;
        faulting.set_managed_fault_model(Some(UVM_FAULT_COST));
        fd.push(managed(&faulting, &data, tiles, 3)?);
        let faulting = device_for(spec, 1 << 30)?;
        faulting.set_managed_fault_model(Some(UVM_FAULT_COST));
        fd1.push(managed(&faulting, &data, tiles, 1)?);
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
    rep.push_samples("emu/fault-driven-pipeline-ms", "ms", &mut fd);
    rep.ratio(
        "emu/fault-driven-over-declared",
        "emu/fault-driven-pipeline-ms",
        "emu/managed-pipeline-ms",
    );
    rep.push_samples("emu/fault-driven-one-stream-pipeline-ms", "ms", &mut fd1);
    rep.ratio(
        "emu/fault-driven-one-stream-over-declared",
        "emu/fault-driven-one-stream-pipeline-ms",
        "emu/managed-one-stream-pipeline-ms",
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
    host_faults(&mut rep, quick, spec)?;
    Ok(rep)
}

/// The host-fault figures (wall time; see the module doc).
fn host_faults(rep: &mut BenchReport, quick: bool, spec: &DeviceSpec) -> Result<()> {
    let dev = device_for(spec, 1 << 30)?;
    let reps = if quick { 3 } else { 7 };
    let touch_bytes = if quick { 64 << 20 } else { 256 << 20 };
    let (mut uffd, mut mprot, mut managed) = (Vec::new(), Vec::new(), Vec::new());
    let mut shmem = Vec::new();
    let src = vec![1u8; raw::GRANULE];
    for _ in 0..reps {
        uffd.push(raw::uffd_first_touch(touch_bytes, &src, false)?);
        shmem.push(raw::uffd_first_touch(touch_bytes, &src, true)?);
        mprot.push(raw::mprotect_first_touch(touch_bytes)?);
        managed.push(managed_first_touch(&dev, touch_bytes)?);
    }
    rep.push_samples("uffd/first-touch-gbps", "GB/s", &mut uffd);
    rep.push_samples("uffd-shmem/first-touch-gbps", "GB/s", &mut shmem);
    rep.push_samples("mprotect/first-touch-gbps", "GB/s", &mut mprot);
    rep.push_samples("host/managed-first-touch-gbps", "GB/s", &mut managed);
    rep.ratio(
        "host/managed-first-touch-over-uffd-shmem",
        "host/managed-first-touch-gbps",
        "uffd-shmem/first-touch-gbps",
    );
    rep.ratio(
        "uffd-shmem/first-touch-over-mprotect",
        "uffd-shmem/first-touch-gbps",
        "mprotect/first-touch-gbps",
    );
    rep.ratio(
        "host/managed-first-touch-over-uffd",
        "host/managed-first-touch-gbps",
        "uffd/first-touch-gbps",
    );
    rep.ratio(
        "host/managed-first-touch-over-mprotect",
        "host/managed-first-touch-gbps",
        "mprotect/first-touch-gbps",
    );

    let bytes = 256 << 20;
    let s = dev.create_stream().map_err(err)?;
    let (mut pre, mut cpy) = (Vec::new(), Vec::new());
    let data = vec![3u8; bytes];
    let mut cpy_shared = Vec::new();
    for _ in 0..reps {
        pre.push(prefetch_to_host(&dev, &s, bytes)?);
        cpy.push(fresh_memcpy(&data));
        cpy_shared.push(raw::fresh_memcpy_shared(&data)?);
    }
    rep.push_samples("host/managed-prefetch-to-host-gbps", "GB/s", &mut pre);
    rep.push_samples("host/fresh-memcpy-gbps", "GB/s", &mut cpy);
    rep.push_samples("host/fresh-memcpy-shmem-gbps", "GB/s", &mut cpy_shared);
    rep.ratio(
        "host/managed-prefetch-to-host-over-fresh-memcpy-shmem",
        "host/managed-prefetch-to-host-gbps",
        "host/fresh-memcpy-shmem-gbps",
    );
    rep.ratio(
        "host/managed-prefetch-to-host-over-fresh-memcpy",
        "host/managed-prefetch-to-host-gbps",
        "host/fresh-memcpy-gbps",
    );

    let (mut tree, mut k64) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        tree.push(read_back(&dev, &s, touch_bytes, true)?);
        k64.push(read_back(&dev, &s, touch_bytes, false)?);
    }
    rep.push_samples("host/managed-read-back-tree-gbps", "GB/s", &mut tree);
    rep.push_samples("host/managed-read-back-64k-gbps", "GB/s", &mut k64);
    rep.ratio(
        "host/managed-read-back-tree-over-64k",
        "host/managed-read-back-tree-gbps",
        "host/managed-read-back-64k-gbps",
    );
    rep.context.insert(
        "host faults".into(),
        format!("{:?}", hetero::host_fault_mechanism()),
    );
    rep.context.insert(
        "first touch / read back".into(),
        format!(
            "{} MiB, one touch per 4 KiB, 64 KiB granules",
            touch_bytes >> 20
        ),
    );
    rep.notes.push(
        "all first-touch and fresh-memcpy sides count allocation plus touch: the managed host \
         copy is a memfd (shared memory, so the runtime's alias and the user's view share \
         pages), whose page allocation costs more than anonymous memory; the -shmem peers pay \
         the same and bound what the managed design can reach (uffd-shmem/first-touch-over-\
         mprotect is the managed ratio's floor before its 2 MiB tree prefetch)"
            .into(),
    );
    rep.notes.push(
        "the pipeline's link is its bottleneck: with three streams a tile's modelled fault \
         service overlaps the other streams' copies, so fault-driven costs little there; on \
         one stream it cannot hide"
            .into(),
    );
    Ok(())
}

/// `alloc_managed` and a first touch of every 4 KiB page through the view:
/// GB/s.
fn managed_first_touch(dev: &Device, bytes: usize) -> Result<f64> {
    let t0 = Instant::now();
    let buf: ManagedBuffer<u8> = dev.alloc_managed(bytes).map_err(err)?;
    let p = buf.host_ptr();
    for off in (0..bytes).step_by(4096) {
        // SAFETY: inside the buffer, which outlives the loop; nothing else
        // uses it.
        unsafe { p.add(off).write_volatile(1) };
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(buf);
    Ok(bytes as f64 / secs / 1e9)
}

/// A kernel leaves `bytes` dirty on the device.
fn dirty_on_device(dev: &Device, s: &Stream, bytes: usize) -> Result<ManagedBuffer<u32>> {
    let buf: ManagedBuffer<u32> = dev.alloc_managed(bytes / 4).map_err(err)?;
    let fill = Kernel::new("fill", |b| {
        for x in b.write::<u32>(0) {
            *x = 7;
        }
    });
    s.launch(&fill, 4.into(), &[Arg::managed_write(&buf)])
        .map_err(err)?;
    s.synchronize().map_err(err)?;
    Ok(buf)
}

/// An explicit prefetch to the host of `bytes` dirty on the device: GB/s.
fn prefetch_to_host(dev: &Device, s: &Stream, bytes: usize) -> Result<f64> {
    let mut buf = dirty_on_device(dev, s, bytes)?;
    let t0 = Instant::now();
    buf.prefetch(.., Location::Host, s).map_err(err)?;
    s.synchronize().map_err(err)?;
    let secs = t0.elapsed().as_secs_f64();
    if buf.as_slice().map_err(err)?.iter().any(|&x| x != 7) {
        return Err("prefetch to the host: wrong values".into());
    }
    Ok(bytes as f64 / secs / 1e9)
}

/// A memcpy of `data` into freshly allocated memory: GB/s.
fn fresh_memcpy(data: &[u8]) -> f64 {
    let t0 = Instant::now();
    let mut v: Vec<u8> = Vec::with_capacity(data.len());
    v.extend_from_slice(data);
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(&v);
    data.len() as f64 / secs / 1e9
}

/// Host reads (one per 4 KiB) of `bytes` dirty on the device, with or
/// without the tree prefetch: GB/s.
fn read_back(dev: &Device, s: &Stream, bytes: usize, tree: bool) -> Result<f64> {
    let buf = dirty_on_device(dev, s, bytes)?;
    buf.set_host_fault_prefetch(tree);
    let p = buf.host_ptr();
    let t0 = Instant::now();
    let mut sum = 0u64;
    for i in (0..bytes / 4).step_by(1024) {
        // SAFETY: inside the buffer; its kernel completed; nothing else uses it.
        sum += u64::from(unsafe { p.add(i).read_volatile() });
    }
    let secs = t0.elapsed().as_secs_f64();
    if sum != 7 * (bytes / 4096) as u64 {
        return Err(format!("read back: sum {sum}"));
    }
    Ok(bytes as f64 / secs / 1e9)
}

/// The raw peers: a userfaultfd SIGBUS loop and an mprotect SIGSEGV loop,
/// each with its own handler swapped in for the run (and the previous one,
/// hetero's, restored after).
mod raw {
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::Relaxed};
    use std::time::Instant;

    pub const GRANULE: usize = 64 << 10;
    static FD: AtomicI32 = AtomicI32::new(-1);
    static SRC: AtomicUsize = AtomicUsize::new(0);

    #[repr(C)]
    struct UffdioApi {
        api: u64,
        features: u64,
        ioctls: u64,
    }
    #[repr(C)]
    struct UffdioRegister {
        start: u64,
        len: u64,
        mode: u64,
        ioctls: u64,
    }
    #[repr(C)]
    struct UffdioCopy {
        dst: u64,
        src: u64,
        len: u64,
        mode: u64,
        copy: i64,
    }
    const fn iowr(nr: u64, size: usize) -> u64 {
        (3 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
    }
    const UFFDIO_API: u64 = iowr(0x3F, size_of::<UffdioApi>());
    const UFFDIO_REGISTER: u64 = iowr(0x00, size_of::<UffdioRegister>());
    const UFFDIO_COPY: u64 = iowr(0x03, size_of::<UffdioCopy>());
    const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;

    extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut c_void) {
        // SAFETY: the kernel's siginfo for an SA_SIGINFO handler.
        let addr = unsafe { (*info).si_addr() } as usize & !(GRANULE - 1);
        let mut c = UffdioCopy {
            dst: addr as u64,
            src: SRC.load(Relaxed) as u64,
            len: GRANULE as u64,
            mode: 0,
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY with its structure; async-signal-safe.
        unsafe { libc::ioctl(FD.load(Relaxed), UFFDIO_COPY as _, &mut c) };
    }

    extern "C" fn on_sigsegv(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut c_void) {
        // SAFETY: as above.
        let addr = unsafe { (*info).si_addr() } as usize & !(GRANULE - 1);
        // SAFETY: the granule lies in the loop's own mapping.
        unsafe {
            libc::mprotect(
                addr as *mut c_void,
                GRANULE,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
    }

    /// Puts `h` in for `sig`; the previous action.
    fn swap(
        sig: libc::c_int,
        h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void),
    ) -> libc::sigaction {
        // SAFETY: valid sigaction structures; the handlers above only make
        // one syscall.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = h as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &sa, &mut old);
            old
        }
    }

    fn restore(sig: libc::c_int, old: &libc::sigaction) {
        // SAFETY: the action `swap` returned.
        unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
    }

    fn touch(p: *mut u8, bytes: usize) {
        for off in (0..bytes).step_by(4096) {
            // SAFETY: inside the caller's mapping; the handler resolves it.
            unsafe { p.add(off).write_volatile(1) };
        }
    }

    fn map(bytes: usize, prot: libc::c_int) -> Result<*mut u8, String> {
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap of {bytes} bytes failed"));
        }
        Ok(p.cast())
    }

    /// Allocation and first touch through userfaultfd: GB/s. `shared`: the
    /// memory is a memfd mapped shared (shared memory, what a managed host
    /// copy must be to have two mappings), else anonymous.
    pub fn uffd_first_touch(bytes: usize, src: &[u8], shared: bool) -> Result<f64, String> {
        SRC.store(src.as_ptr() as usize, Relaxed);
        let t0 = Instant::now();
        // SAFETY: the userfaultfd syscall makes a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) }
            as i32;
        if fd < 0 {
            return Err("userfaultfd refused".into());
        }
        let mut api = UffdioApi {
            api: 0xAA,
            features: UFFD_FEATURE_SIGBUS,
            ioctls: 0,
        };
        let (p, memfd) = if shared {
            map_shared(bytes)?
        } else {
            (map(bytes, libc::PROT_READ | libc::PROT_WRITE)?, -1)
        };
        let mut reg = UffdioRegister {
            start: p as u64,
            len: bytes as u64,
            mode: 1,
            ioctls: 0,
        };
        // SAFETY: the ioctls with their structures on our descriptor.
        let ok = unsafe {
            libc::ioctl(fd, UFFDIO_API as _, &mut api) == 0
                && libc::ioctl(fd, UFFDIO_REGISTER as _, &mut reg) == 0
        };
        if !ok {
            return Err("UFFDIO_API / UFFDIO_REGISTER refused".into());
        }
        FD.store(fd, Relaxed);
        let old = swap(libc::SIGBUS, on_sigbus);
        touch(p, bytes);
        let secs = t0.elapsed().as_secs_f64();
        restore(libc::SIGBUS, &old);
        // SAFETY: our mapping and descriptors, no longer used.
        unsafe {
            libc::munmap(p.cast(), bytes);
            libc::close(fd);
            if memfd >= 0 {
                libc::close(memfd);
            }
        }
        Ok(bytes as f64 / secs / 1e9)
    }

    /// A memcpy of `data` into a new memfd mapped shared (its pages
    /// allocated by the copy's faults): GB/s.
    pub fn fresh_memcpy_shared(data: &[u8]) -> Result<f64, String> {
        let t0 = Instant::now();
        let (p, fd) = map_shared(data.len())?;
        // SAFETY: `p` maps `data.len()` bytes of our own memfd.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        let secs = t0.elapsed().as_secs_f64();
        // SAFETY: our mapping and descriptor, no longer used.
        unsafe {
            libc::munmap(p.cast(), data.len());
            libc::close(fd);
        }
        Ok(data.len() as f64 / secs / 1e9)
    }

    /// A new memfd of `bytes`, mapped shared: the mapping and the memfd.
    fn map_shared(bytes: usize) -> Result<(*mut u8, i32), String> {
        // SAFETY: memfd_create with a NUL-terminated name; ftruncate and mmap
        // of our own new descriptor.
        unsafe {
            let fd = libc::memfd_create(c"bench-uffd".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 || libc::ftruncate(fd, bytes as libc::off_t) != 0 {
                return Err("memfd_create / ftruncate failed".into());
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if p == libc::MAP_FAILED {
                libc::close(fd);
                return Err(format!("mmap of a {bytes}-byte memfd failed"));
            }
            Ok((p.cast(), fd))
        }
    }

    /// Allocation and first touch through mprotect: GB/s.
    pub fn mprotect_first_touch(bytes: usize) -> Result<f64, String> {
        let t0 = Instant::now();
        let p = map(bytes, libc::PROT_NONE)?;
        let old = swap(libc::SIGSEGV, on_sigsegv);
        touch(p, bytes);
        let secs = t0.elapsed().as_secs_f64();
        restore(libc::SIGSEGV, &old);
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(p.cast(), bytes) };
        Ok(bytes as f64 / secs / 1e9)
    }
}
