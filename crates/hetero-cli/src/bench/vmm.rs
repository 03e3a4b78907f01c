//! `hetero bench vmm`: the virtual memory API and expandable segments beside
//! plain mappings in the same run.
//!
//! - `hetero/vmm-grow-cached`: ns to grow a reserved range by one 2 MiB
//!   granule whose physical pages exist (one `map`); `…-touched` adds the
//!   first touch of its pages. Peer: an anonymous 2 MiB `mmap`.
//!   `…-cached-private`: the same with a private handle whose pages exist
//!   (one `mremap` moves them in), as a pool segment's cached granule;
//!   `hetero/vmm-unmap-private`: moving it back out.
//! - `hetero/vmm-grow-cold`: growing by a granule that is not cached: a new
//!   2 MiB private handle (anonymous memory, `create_private`) moved into the
//!   range (`map`, one `mremap`) and its pages made present there
//!   (`populate`, one `MADV_POPULATE_WRITE`: a transparent huge page where
//!   anonymous memory has them); `…-commit-then-map` allocates the pages
//!   where the handle is held (`commit`) and moves them in.
//!   `…-shareable`: a new sealed memfd, its pages allocated in one call
//!   (`commit`, `fallocate`) and mapped, the page tables filling on first
//!   touch (`…-committed-touched` adds touching every page); `…-populate`:
//!   mapped and faulted in with one `MADV_POPULATE_WRITE`; `…-touched`:
//!   faulted in page by page. Peers: anonymous `mmap` + touch,
//!   `MAP_POPULATE`, anonymous memory with transparent huge pages (what one
//!   2 MiB page costs), `MAP_HUGETLB` + touch (or a note saying why it could
//!   not run).
//! - `hetero/segment-grow-cold`: the same growth through a whole pool: a
//!   2 MiB buffer that takes a cold granule of an expandable segment, its
//!   pages present (`prefault`) when `alloc` returns.
//! - `hetero/vmm-map-10-granules-over-one-run`: ten 2 MiB maps over one 20 MiB
//!   map of the same cached handle, each touched (`…-map-only`: the calls
//!   alone).
//! - `hetero/stranded-over-live-churn`, `hetero/reserved-over-live-churn`: the
//!   churn replay of `hetero bench alloc` on a whole pool with expandable
//!   segments, beside the chunked pool on the same sequence, with where
//!   reserved stands at its peak (a note) and the map/unmap system calls per
//!   alloc or free; the growth trace likewise.
//! - `hetero/ipc-import-first`, `hetero/ipc-import-cached`,
//!   `hetero/ipc-read-over-local`: see `vmm_ipc.rs`.

use super::alloc::{churn_sequence, growth_ratio};
use super::BenchReport;
use hetero_memory::vmm::{Access, Granularity, MemoryContext, PhysicalMemory, VirtualRange};
use hetero_memory::{DevicePool, PoolConfig};
use std::ffi::c_void;
use std::time::Instant;

const G: usize = 2 << 20;
const PAGE: usize = 4096;

/// Writes one byte per page of `[p, p + len)`.
///
/// # Safety
/// The range must be mapped writable and owned by the caller.
unsafe fn touch(p: *mut u8, len: usize) {
    for off in (0..len).step_by(PAGE) {
        // SAFETY: inside the caller's writable range.
        unsafe { p.add(off).write_volatile(1) };
    }
}

fn ns(t: Instant) -> f64 {
    t.elapsed().as_nanos() as f64
}

fn populated(ctx: &MemoryContext, granules: usize) -> PhysicalMemory {
    let h = ctx
        .create_physical(granules * G, Granularity::Huge2M)
        .expect("physical memory");
    let mut r = ctx
        .reserve(granules * G, Granularity::Huge2M)
        .expect("reserve");
    r.map(0, &h, 0, granules * G, Access::ReadWrite)
        .expect("map");
    // SAFETY: just mapped read-write.
    unsafe { touch(r.ptr(), granules * G) };
    h
}

fn grow_cached(rep: &mut BenchReport, samples: usize) {
    let ctx = MemoryContext::unlimited("bench");
    let handle = populated(&ctx, 8);
    const R: usize = 256;
    let mut range = ctx.reserve(R * G, Granularity::Huge2M).expect("reserve");
    let (mut map, mut touched) = (Vec::new(), Vec::new());
    let mut i = 0;
    while map.len() < samples {
        let at = (i % R) * G;
        let t = Instant::now();
        range
            .map(at, &handle, (i % 8) * G, G, Access::ReadWrite)
            .expect("map");
        map.push(ns(t));
        if i % 8 == 0 {
            // Now and then, the first touch of the granule's 512 pages too.
            range.unmap(at, G).expect("unmap");
            let t = Instant::now();
            range
                .map(at, &handle, (i % 8) * G, G, Access::ReadWrite)
                .expect("map");
            // SAFETY: mapped read-write just now.
            unsafe { touch(range.ptr().add(at), G) };
            touched.push(ns(t));
        }
        i += 1;
        if i % R == 0 {
            range.unmap(0, R * G).expect("unmap all");
        }
    }
    rep.push_samples("hetero/vmm-grow-cached", "ns", &mut map);
    rep.push_samples("hetero/vmm-grow-cached-touched", "ns", &mut touched);
    // What a pool segment's cached granule costs: a private handle whose
    // pages exist, moved in (one mremap); its move back out is not timed.
    let private: Vec<_> = (0..8)
        .map(|_| {
            let h = ctx.create_private(G, Granularity::Huge2M).expect("private");
            h.commit(0, G).expect("commit");
            h
        })
        .collect();
    let mut range = ctx.reserve(R * G, Granularity::Huge2M).expect("reserve");
    let (mut moved, mut moved_out) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for i in 0..samples {
        let at = (i % R) * G;
        let t = Instant::now();
        range
            .map(at, &private[i % 8], 0, G, Access::ReadWrite)
            .expect("map");
        moved.push(ns(t));
        let t = Instant::now();
        range.unmap(at, G).expect("unmap");
        moved_out.push(ns(t));
    }
    rep.push_samples("hetero/vmm-grow-cached-private", "ns", &mut moved);
    rep.push_samples("hetero/vmm-unmap-private", "ns", &mut moved_out);
    let mut anon = Vec::new();
    for _ in 0..samples {
        let t = Instant::now();
        let p = anon_map(G, rustix::mm::MapFlags::empty()).expect("anonymous mmap");
        anon.push(ns(t));
        unmap(p, G);
    }
    rep.push_samples("mmap/anon-map-2m", "ns", &mut anon);
    rep.ratio(
        "vmm-grow-cached hetero/mmap",
        "hetero/vmm-grow-cached",
        "mmap/anon-map-2m",
    );
}

fn anon_map(len: usize, extra: rustix::mm::MapFlags) -> std::io::Result<*mut u8> {
    use rustix::mm::{MapFlags, ProtFlags};
    // SAFETY: a fresh private anonymous mapping aliases nothing.
    let p = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | extra,
        )
    }?;
    Ok(p.cast())
}

fn unmap(p: *mut u8, len: usize) {
    // SAFETY: `p` is a mapping of `len` bytes this bench made and no longer uses.
    let _ = unsafe { rustix::mm::munmap(p.cast::<c_void>(), len) };
}

fn grow_cold(rep: &mut BenchReport, samples: usize) {
    let ctx = MemoryContext::unlimited("bench");
    let mut range = ctx.reserve(G, Granularity::Huge2M).expect("reserve");
    let (mut private, mut private_commit_map) = (Vec::new(), Vec::new());
    let (mut committed, mut populated, mut touched, mut committed_touched) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut note, mut private_note) = (None, None);
    let handle = |ctx: &MemoryContext| {
        ctx.create_physical(G, Granularity::Huge2M)
            .expect("physical")
    };
    for _ in 0..samples {
        // The cold growth: a granule that is not cached, mapped and
        // made present. A private handle (what the pool's segments use):
        // moved into the range (one mremap), its pages faulted in there (one
        // MADV_POPULATE_WRITE: a transparent huge page where anonymous
        // memory has them).
        let t = Instant::now();
        let h = ctx.create_private(G, Granularity::Huge2M).expect("private");
        range.map(0, &h, 0, G, Access::ReadWrite).expect("map");
        range.populate(0, G).expect("populate");
        private.push(ns(t));
        range.unmap(0, G).expect("unmap");
        if private_note.is_none() {
            private_note = Some(format!("{:?}: {}", h.page_kind(), h.notes().join("; ")));
        }
        drop(h);
        // The same, its pages allocated where it is held (commit), then
        // moved in.
        let t = Instant::now();
        let h = ctx.create_private(G, Granularity::Huge2M).expect("private");
        h.commit(0, G).expect("commit");
        range.map(0, &h, 0, G, Access::ReadWrite).expect("map");
        private_commit_map.push(ns(t));
        range.unmap(0, G).expect("unmap");
        drop(h);
    }
    // The shareable series in a loop of their own: in one loop with the
    // private ones, whichever came first after the memfd pages of the
    // previous sample were freed read 10-20 µs slower.
    for _ in 0..samples {
        // A shareable handle (a memfd): the pages are allocated in one call
        // and mapped; page tables fill on first touch.
        let t = Instant::now();
        let h = handle(&ctx);
        h.commit(0, G).expect("commit");
        range.map(0, &h, 0, G, Access::ReadWrite).expect("map");
        committed.push(ns(t));
        // SAFETY: mapped read-write just now.
        unsafe { touch(range.ptr(), G) };
        committed_touched.push(ns(t));
        range.unmap(0, G).expect("unmap");
        // Allocating and filling page tables in one call.
        let t = Instant::now();
        let h = handle(&ctx);
        range.map(0, &h, 0, G, Access::ReadWrite).expect("map");
        range.populate(0, G).expect("populate");
        populated.push(ns(t));
        range.unmap(0, G).expect("unmap");
        // Allocating page by page, on first touch.
        let t = Instant::now();
        let h = handle(&ctx);
        range.map(0, &h, 0, G, Access::ReadWrite).expect("map");
        // SAFETY: mapped read-write just now.
        unsafe { touch(range.ptr(), G) };
        touched.push(ns(t));
        range.unmap(0, G).expect("unmap");
        if note.is_none() {
            note = Some(format!("{:?}: {}", h.page_kind(), h.notes().join("; ")));
        }
    }
    rep.push_samples("hetero/vmm-grow-cold", "ns", &mut private);
    rep.push_samples(
        "hetero/vmm-grow-cold-commit-then-map",
        "ns",
        &mut private_commit_map,
    );
    if let Some(n) = private_note {
        rep.notes.push(format!("vmm 2 MiB private handles are {n}"));
    }
    rep.push_samples("hetero/vmm-grow-cold-shareable", "ns", &mut committed);
    rep.push_samples(
        "hetero/vmm-grow-cold-shareable-populate",
        "ns",
        &mut populated,
    );
    rep.push_samples("hetero/vmm-grow-cold-shareable-touched", "ns", &mut touched);
    rep.push_samples(
        "hetero/vmm-grow-cold-shareable-committed-touched",
        "ns",
        &mut committed_touched,
    );
    if let Some(n) = note {
        rep.notes
            .push(format!("vmm 2 MiB shareable handles are {n}"));
    }
    rep.notes.push(
        "hetero/vmm-grow-cold: a new private handle moved into the range (map: one mremap) and \
         its pages made present there (populate: one MADV_POPULATE_WRITE); …-commit-then-map: \
         its pages allocated where it is held (commit), then moved in. …-shareable: a new memfd \
         handle, its pages allocated with one fallocate (commit) and mapped, page tables filling \
         on first touch (…-committed-touched adds touching every page); …-shareable-populate: \
         mapped and faulted in with MADV_POPULATE_WRITE; …-shareable-touched: faulted in page \
         by page"
            .into(),
    );
    let mut anon = Vec::new();
    for _ in 0..samples {
        let t = Instant::now();
        let p = anon_map(G, rustix::mm::MapFlags::empty()).expect("anonymous mmap");
        // SAFETY: fresh writable mapping of G bytes.
        unsafe { touch(p, G) };
        anon.push(ns(t));
        unmap(p, G);
    }
    rep.push_samples("mmap/anon-map-touch-2m", "ns", &mut anon);
    let mut anon_pop = Vec::new();
    for _ in 0..samples {
        let t = Instant::now();
        let p = anon_map(G, rustix::mm::MapFlags::POPULATE).expect("anonymous mmap");
        anon_pop.push(ns(t));
        unmap(p, G);
    }
    rep.push_samples("mmap/anon-map-populate-2m", "ns", &mut anon_pop);
    // What one 2 MiB page costs: anonymous memory with transparent huge
    // pages (shared memory, which handles are, has them only where
    // shmem_enabled allows).
    let mut thp = Vec::new();
    for _ in 0..samples {
        let p = anon_map(2 * G, rustix::mm::MapFlags::NORESERVE).expect("anonymous mmap");
        let at = (p as usize).next_multiple_of(G) as *mut u8;
        let t = Instant::now();
        // SAFETY: [at, at + G) lies inside the fresh 4 MiB mapping.
        let r = unsafe {
            rustix::mm::madvise(at.cast(), G, rustix::mm::Advice::LinuxHugepage).and_then(|()| {
                rustix::mm::madvise(at.cast(), G, rustix::mm::Advice::LinuxPopulateWrite)
            })
        };
        let dt = ns(t);
        unmap(p, 2 * G);
        if r.is_err() {
            break;
        }
        thp.push(dt);
    }
    if !thp.is_empty() {
        rep.push_samples("mmap/anon-thp-populate-2m", "ns", &mut thp);
        rep.ratio(
            "vmm-grow-cold hetero/anon-thp-populate",
            "hetero/vmm-grow-cold",
            "mmap/anon-thp-populate-2m",
        );
        let thp_mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        rep.notes.push(format!(
            "mmap/anon-thp-populate-2m: anonymous memory with MADV_HUGEPAGE (transparent_hugepage/enabled = {})",
            thp_mode.trim()
        ));
    }
    rep.ratio(
        "vmm-grow-cold hetero/anon-mmap-populate",
        "hetero/vmm-grow-cold",
        "mmap/anon-map-populate-2m",
    );
    rep.ratio(
        "vmm-grow-cold hetero/anon-mmap",
        "hetero/vmm-grow-cold",
        "mmap/anon-map-touch-2m",
    );
    use rustix::mm::MapFlags;
    match anon_map(G, MapFlags::HUGETLB | MapFlags::HUGE_2MB) {
        Err(e) => rep.notes.push(format!(
            "MAP_HUGETLB peer not run: mmap(MAP_HUGETLB) failed ({e}); vm.nr_hugepages = {}",
            std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
                .unwrap_or_default()
                .trim()
        )),
        Ok(p) => {
            unmap(p, G);
            let mut huge = Vec::new();
            for _ in 0..samples {
                let t = Instant::now();
                let Ok(p) = anon_map(G, MapFlags::HUGETLB | MapFlags::HUGE_2MB) else {
                    break;
                };
                // SAFETY: fresh writable mapping of G bytes.
                unsafe { touch(p, G) };
                huge.push(ns(t));
                unmap(p, G);
            }
            rep.push_samples("mmap/hugetlb-map-touch-2m", "ns", &mut huge);
        }
    }
}

/// Growing a pool's expandable segment by one cold granule: a 2 MiB buffer
/// (the large kind) from a pool whose segments hold no granule (`trim` gives
/// every one back between samples), with `prefault` so that its pages are
/// present when `alloc` returns, as the cold growth means.
fn segment_grow_cold(rep: &mut BenchReport, samples: usize) {
    let pool = DevicePool::new(
        PoolConfig::default()
            .expandable_segments(true)
            .prefault(true)
            .stream_cache_bytes(0),
    )
    .expect("pool");
    // The first segment's creation (its range, the probe of private memory)
    // is not growth.
    let first = pool.alloc(G, 0, 0).expect("alloc");
    pool.free(first, 0, Vec::new());
    pool.trim();
    let mut grow = Vec::with_capacity(samples);
    for _ in 0..samples {
        let cold = pool.stats().granule_maps_cold;
        let t = Instant::now();
        let a = pool.alloc(G, 0, 0).expect("alloc");
        grow.push(ns(t));
        assert_eq!(
            pool.stats().granule_maps_cold,
            cold + 1,
            "each sample grows by one cold granule"
        );
        pool.free(a, 0, Vec::new());
        pool.trim();
    }
    rep.push_samples("hetero/segment-grow-cold", "ns", &mut grow);
    let backing = pool
        .snapshot()
        .chunks
        .iter()
        .find(|c| c.kind == "large")
        .map(|c| format!("{:?}: {}", c.page, c.notes.join("; ")))
        .unwrap_or_default();
    rep.notes.push(format!(
        "hetero/segment-grow-cold: a pool (expandable segments, prefault) grows its large segment \
         by one cold granule, pages present when alloc returns; its segment is {backing}"
    ));
    rep.ratio(
        "segment-grow-cold hetero/anon-thp-populate",
        "hetero/segment-grow-cold",
        "mmap/anon-thp-populate-2m",
    );
}

fn map_ten(rep: &mut BenchReport, samples: usize) {
    let ctx = MemoryContext::unlimited("bench");
    let handle = populated(&ctx, 10);
    let mut range = ctx.reserve(10 * G, Granularity::Huge2M).expect("reserve");
    let (mut ten, mut one, mut ten_calls, mut one_call) = (vec![], vec![], vec![], vec![]);
    let run = |range: &mut VirtualRange, pieces: usize, touch_it: bool| -> f64 {
        let len = 10 * G / pieces;
        let t = Instant::now();
        for k in 0..pieces {
            range
                .map(k * len, &handle, k * len, len, Access::ReadWrite)
                .expect("map");
        }
        if touch_it {
            // SAFETY: all ten granules were mapped read-write above.
            unsafe { touch(range.ptr(), 10 * G) };
        }
        let dt = ns(t);
        range.unmap(0, 10 * G).expect("unmap");
        dt
    };
    for _ in 0..samples {
        ten.push(run(&mut range, 10, true));
        one.push(run(&mut range, 1, true));
        ten_calls.push(run(&mut range, 10, false));
        one_call.push(run(&mut range, 1, false));
    }
    rep.push_samples("hetero/vmm-map-10-granules", "ns", &mut ten);
    rep.push_samples("hetero/vmm-map-one-20m-run", "ns", &mut one);
    rep.push_samples("hetero/vmm-map-10-granules-map-only", "ns", &mut ten_calls);
    rep.push_samples("hetero/vmm-map-one-20m-run-map-only", "ns", &mut one_call);
    for (name, a, b) in [
        (
            "hetero/vmm-map-10-granules-over-one-run",
            "hetero/vmm-map-10-granules",
            "hetero/vmm-map-one-20m-run",
        ),
        (
            "hetero/vmm-map-10-granules-over-one-run-map-only",
            "hetero/vmm-map-10-granules-map-only",
            "hetero/vmm-map-one-20m-run-map-only",
        ),
    ] {
        if let (Some(x), Some(y)) = (rep.median_of(a), rep.median_of(b)) {
            rep.push_value(name, "ratio", x / y, samples as u64);
        }
    }
}

/// What the churn replay measured on one pool.
struct Churn {
    /// Per step, mapped physical bytes no live buffer covers over live bytes.
    stranded: Vec<f64>,
    /// Peak reserved physical over peak live.
    peak: f64,
    /// Mean ns per alloc or free.
    per_op: f64,
    /// Where reserved stood, part by part, at the step it peaked.
    at_peak: String,
    /// System calls the pool made to map and unmap memory, per alloc or free.
    os_calls_per_op: f64,
}

/// Replays the churn sequence on a whole pool.
fn churn_on_pool(config: PoolConfig, quick: bool) -> Churn {
    let seq = churn_sequence(quick);
    let pool = DevicePool::new(config).expect("pool");
    let mut live: Vec<Option<hetero_memory::Allocation>> = Vec::new();
    let (mut live_bytes, mut peak_live) = (0usize, 0usize);
    let mut stranded = Vec::with_capacity(seq.len());
    let (mut ops, mut op_ns) = (0u64, 0f64);
    let (mut top, mut at_peak) = (0usize, String::new());
    for (step, (victim, add)) in seq.iter().enumerate() {
        let t = Instant::now();
        if *victim != usize::MAX {
            if let Some(a) = live.swap_remove(*victim) {
                live_bytes -= a.size();
                pool.free(a, 0, Vec::new());
            }
            ops += 1;
        }
        for &s in add {
            let a = pool.alloc(s as usize, 256, 0).ok();
            live_bytes += a.as_ref().map_or(0, |a| a.size());
            live.push(a);
            ops += 1;
        }
        op_ns += ns(t);
        peak_live = peak_live.max(live_bytes);
        let st = pool.stats();
        stranded.push(st.mapped.saturating_sub(live_bytes) as f64 / live_bytes as f64);
        if st.reserved > top {
            top = st.reserved;
            let mib = |b: usize| b as f64 / (1 << 20) as f64;
            // Mapped bytes under blocks handed out that are neither live nor
            // cached: the free bytes of granules a block covers in part.
            let partial = st
                .mapped
                .saturating_sub(st.mapped_idle + st.allocated + st.cached);
            at_peak = format!(
                "step {step}: reserved {:.1} MiB = live {:.1} + rounding {:.1} + block caches {:.1} \
                 + idle granules {:.1} + cached granules {:.1} + free in mapped granules {:.1}",
                mib(st.reserved),
                mib(live_bytes),
                mib(st.allocated.saturating_sub(live_bytes)),
                mib(st.cached),
                mib(st.mapped_idle),
                mib(st.physical_cached),
                mib(partial),
            );
        }
    }
    let peak = pool.stats().peak_reserved as f64 / peak_live as f64;
    let st = pool.stats();
    let os_calls = if st.expandable {
        st.granule_os_calls
    } else {
        st.os_calls.mmap + st.os_calls.munmap + st.os_calls.madvise
    };
    at_peak.push_str(&format!(
        "; peak live {:.1} MiB",
        peak_live as f64 / (1 << 20) as f64
    ));
    for a in live.into_iter().flatten() {
        pool.free(a, 0, Vec::new());
    }
    Churn {
        stranded,
        peak,
        per_op: op_ns / ops as f64,
        at_peak,
        os_calls_per_op: os_calls as f64 / ops as f64,
    }
}

fn churn(rep: &mut BenchReport, quick: bool) {
    for (name, config) in [
        ("hetero", PoolConfig::default().expandable_segments(true)),
        ("chunked", PoolConfig::default().expandable_segments(false)),
    ] {
        let Churn {
            mut stranded,
            peak,
            per_op,
            at_peak,
            os_calls_per_op,
        } = churn_on_pool(config.clone(), quick);
        rep.push_samples(
            &format!("{name}/stranded-over-live-churn"),
            "ratio",
            &mut stranded,
        );
        rep.notes
            .push(format!("{name} churn, reserved at its peak: {at_peak}"));
        rep.push_value(
            &format!("{name}/reserved-over-live-churn"),
            "ratio",
            peak,
            1,
        );
        rep.push_value(&format!("{name}/pool-churn-replay-op"), "ns", per_op, 1);
        rep.push_value(
            &format!("{name}/pool-churn-replay-os-calls-per-op"),
            "calls",
            os_calls_per_op,
            1,
        );
        let growth = growth_ratio(config, quick);
        rep.push_value(
            &format!("{name}/reserved-over-live-growth"),
            "ratio",
            growth,
            1,
        );
    }
    // The same replay without the per-stream block caches (which hold up to
    // 64 MiB of freed small blocks, mapped but not live): how much of the
    // figure they are.
    let peak = churn_on_pool(
        PoolConfig::default()
            .expandable_segments(true)
            .stream_cache_bytes(0),
        quick,
    )
    .peak;
    rep.push_value(
        "hetero/reserved-over-live-churn-stream-cache-0",
        "ratio",
        peak,
        1,
    );
    rep.ratio(
        "reserved-over-live-churn hetero/chunked",
        "hetero/reserved-over-live-churn",
        "chunked/reserved-over-live-churn",
    );
    rep.ratio(
        "stranded-over-live-churn hetero/chunked",
        "hetero/stranded-over-live-churn",
        "chunked/stranded-over-live-churn",
    );
    rep.ratio(
        "pool-churn-replay-op hetero/chunked",
        "hetero/pool-churn-replay-op",
        "chunked/pool-churn-replay-op",
    );
    rep.ratio(
        "pool-churn-replay-os-calls-per-op hetero/chunked",
        "hetero/pool-churn-replay-os-calls-per-op",
        "chunked/pool-churn-replay-os-calls-per-op",
    );
    rep.notes.push(
        "hetero/… churn and growth figures are the pool with expandable_segments:true, \
         chunked/… the default chunked pool on the same sequence"
            .into(),
    );
}

/// Runs every series; `quick` finishes in a few seconds.
pub fn run(quick: bool) -> BenchReport {
    let mut rep = BenchReport::new("vmm");
    let samples = if quick { 2000 } else { 20_000 };
    grow_cached(&mut rep, samples);
    grow_cold(&mut rep, if quick { 200 } else { 2000 });
    segment_grow_cold(&mut rep, if quick { 200 } else { 2000 });
    map_ten(&mut rep, if quick { 50 } else { 500 });
    super::vmm_ipc::ipc(&mut rep, quick);
    churn(&mut rep, quick);
    rep
}
