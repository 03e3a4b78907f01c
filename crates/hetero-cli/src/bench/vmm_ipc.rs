//! The IPC series of `hetero bench vmm`: importing a 64 MiB export (first
//! time and from the cache) and reading imported memory, beside a local
//! memcpy and POSIX `shm_open` + `mmap` in the same run.
//!
//! The exporter serves from a thread of this process: the import still goes
//! through the Unix socket, `SCM_RIGHTS`, the seal and size checks and a new
//! mapping, as it does between processes (tests/ipc.rs runs it across two).
//!
//! The read figures compare sources on equal terms: every source and the
//! destination start on a page boundary, so `(dst - src) mod 4096` is the same
//! for all and glibc's memcpy takes the same path for each (it picks its loop
//! and its non-temporal stores by that offset: a source 16 bytes off the
//! destination's page offset read 3–6 % slower here, which the imported
//! mapping, 2 MiB-aligned against `Vec`s at page + 16, was); every source is
//! written before it is read; and each round reads fresh buffers, because on
//! this VM how fast a 64 MiB buffer reads depends on which physical pages it
//! got (two memfds read 7.4 and 8.0 GB/s through any mapping of theirs, the
//! exporter's own or an import): one set of buffers is one draw, the rounds
//! sample many, made in a turning order (the first made gets the pages the
//! last round freed). `hetero/ipc-read-over-exporter-map` reads the same pages
//! through the exporter's own mapping: what importing costs, placement aside.

use super::BenchReport;
use hetero_memory::ipc::{IpcExporter, IpcImporter};
use hetero_memory::vmm::{Access, Granularity, MemoryContext};
use std::time::Instant;

const SIZE: usize = 64 << 20;

fn ns(t: Instant) -> f64 {
    t.elapsed().as_nanos() as f64
}

/// GB/s of copying each source into `dst`, the sources taking turns so
/// that a change in the machine's load hits them alike (after one warm-up
/// copy each); pushed to `out`, one list per source.
fn read_bw(srcs: &[*const u8], dst: &mut [u8], reps: usize, out: &mut [Vec<f64>]) {
    // SAFETY: callers pass sources valid for dst.len() bytes of reads.
    let srcs: Vec<&[u8]> = srcs
        .iter()
        .map(|&p| unsafe { std::slice::from_raw_parts(p, dst.len()) })
        .collect();
    for s in &srcs {
        dst.copy_from_slice(s);
    }
    for rep in 0..reps {
        // Each rep starts at another source, so that no source always reads
        // right after the same one.
        for k in 0..srcs.len() {
            let i = (rep + k) % srcs.len();
            let s = &srcs[i];
            let t = Instant::now();
            std::hint::black_box(&mut *dst).copy_from_slice(std::hint::black_box(s));
            std::hint::black_box(&*dst);
            out[i].push(dst.len() as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
    }
}

/// `SIZE` bytes of `v` from its first page boundary (`v` holds a page more).
fn page_aligned(v: &mut [u8]) -> &mut [u8] {
    let off = v.as_ptr().align_offset(4096);
    &mut v[off..off + SIZE]
}

/// A new read-write shared mapping of `SIZE` bytes of the shm object `fd`.
fn map_shm(fd: &rustix::fd::OwnedFd) -> *mut std::ffi::c_void {
    use rustix::mm::{MapFlags, ProtFlags};
    // SAFETY: a fresh shared mapping of the shm object, at an address of the
    // kernel's choosing: it aliases nothing of this process.
    unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            SIZE,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
    .expect("mmap")
}

/// A fresh POSIX shared memory object of `SIZE` bytes, mapped read-write and
/// written (an unwritten one reads as the kernel's shared zero page, which
/// stays in cache and would flatter the peer).
fn shm_buffer(name: &str) -> *mut u8 {
    use rustix::fs::Mode;
    use rustix::shm;
    let fd = shm::open(
        name,
        shm::OFlags::CREATE | shm::OFlags::RDWR | shm::OFlags::EXCL,
        Mode::RUSR | Mode::WUSR,
    )
    .expect("shm_open");
    let _ = shm::unlink(name);
    rustix::fs::ftruncate(&fd, SIZE as u64).expect("ftruncate");
    let p = map_shm(&fd).cast::<u8>();
    // SAFETY: the mapping made above, SIZE bytes, read-write, used by nothing
    // else.
    unsafe { std::ptr::write_bytes(p, 1, SIZE) };
    p
}

pub(super) fn ipc(rep: &mut BenchReport, quick: bool) {
    let samples = if quick { 300 } else { 3000 };
    let owner = MemoryContext::unlimited("bench exporter");
    let phys = owner
        .create_physical(SIZE, Granularity::Huge2M)
        .expect("physical");
    let mut range = owner.reserve(SIZE, Granularity::Huge2M).expect("reserve");
    range
        .map(0, &phys, 0, SIZE, Access::ReadWrite)
        .expect("map");
    range.populate(0, SIZE).expect("populate");
    let path = std::env::temp_dir().join(format!("hetero-bench-ipc-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let exporter = IpcExporter::bind(&path).expect("bind the export socket");
    let ctx = MemoryContext::unlimited("bench importer");

    // First contact: connect, peer check, revocation table, then the import.
    let h = exporter.export(&phys).expect("export");
    let mut imp = IpcImporter::new(&ctx);
    let t = Instant::now();
    let first_contact = imp.import(&h).expect("import");
    drop(first_contact);
    let mut contact = vec![ns(t)];
    rep.push_samples("hetero/ipc-connect-and-import-first", "ns", &mut contact);

    // First import of a new export over an established connection.
    let mut first = Vec::with_capacity(samples);
    for _ in 0..samples {
        let h = exporter.export(&phys).expect("export");
        let t = Instant::now();
        let m = imp.import(&h).expect("import");
        first.push(ns(t));
        imp.forget(&h);
        drop(m);
    }
    rep.push_samples("hetero/ipc-import-first", "ns", &mut first);

    let mut cached = Vec::with_capacity(samples * 10);
    for _ in 0..samples * 10 {
        let t = Instant::now();
        let m = imp.import(&h).expect("cached import");
        cached.push(ns(t));
        std::hint::black_box(m);
    }
    rep.push_samples("hetero/ipc-import-cached", "ns", &mut cached);

    // Peer: shm_open + mmap of a POSIX shared memory object of the same size.
    let mut shm_open = Vec::new();
    let shm_name = format!("/hetero-bench-{}", std::process::id());
    {
        use rustix::fs::Mode;
        use rustix::shm;
        let fd = shm::open(
            shm_name.as_str(),
            shm::OFlags::CREATE | shm::OFlags::RDWR | shm::OFlags::EXCL,
            Mode::RUSR | Mode::WUSR,
        )
        .expect("shm_open");
        rustix::fs::ftruncate(&fd, SIZE as u64).expect("ftruncate");
        for _ in 0..samples {
            let t = Instant::now();
            let fd2 =
                shm::open(shm_name.as_str(), shm::OFlags::RDWR, Mode::empty()).expect("shm_open");
            let p = map_shm(&fd2);
            shm_open.push(ns(t));
            // SAFETY: the mapping made above, unused.
            let _ = unsafe { rustix::mm::munmap(p, SIZE) };
        }
        let _ = shm::unlink(shm_name.as_str());
    }
    rep.push_samples("shm/open-and-map-64m", "ns", &mut shm_open);
    rep.ratio(
        "ipc-import-first hetero/shm-open-map",
        "hetero/ipc-import-first",
        "shm/open-and-map-64m",
    );

    // Read bandwidth: imported memory, a local buffer, the shm mapping and
    // the exporter's own mapping of the exported pages, all page-aligned and
    // written, fresh each round (see the module's doc).
    let (rounds, reps) = if quick { (3, 10) } else { (10, 10) };
    let mut bw = vec![Vec::new(); 4];
    for round in 0..rounds {
        let mut dst_buf = vec![0u8; SIZE + 4096];
        // The three buffers are made in a turning order: the one made first
        // gets the pages the previous round freed, and a fixed order gave
        // the export those every time.
        let (mut export, mut local_buf, mut shm_ptr) = (None, None, None);
        for k in 0..3 {
            match (round + k) % 3 {
                0 => {
                    let phys = owner
                        .create_physical(SIZE, Granularity::Huge2M)
                        .expect("physical");
                    let mut own = owner.reserve(SIZE, Granularity::Huge2M).expect("reserve");
                    own.map(0, &phys, 0, SIZE, Access::ReadWrite).expect("map");
                    // SAFETY: mapped read-write just now, SIZE bytes, used by
                    // nothing else.
                    unsafe { std::ptr::write_bytes(own.ptr(), 1, SIZE) };
                    let h = exporter.export(&phys).expect("export");
                    let imported = imp.import(&h).expect("import");
                    export = Some((own, h, imported));
                }
                1 => {
                    let mut v = vec![1u8; SIZE + 4096];
                    page_aligned(&mut v)[SIZE - 1] = 2;
                    local_buf = Some(v);
                }
                _ => shm_ptr = Some(shm_buffer(&format!("{shm_name}-{round}"))),
            }
        }
        let (own, h, imported) = export.expect("made above");
        let mut local_buf = local_buf.expect("made above");
        let shm_ptr = shm_ptr.expect("made above");
        read_bw(
            &[
                imported.ptr(),
                page_aligned(&mut local_buf).as_ptr(),
                shm_ptr,
                own.ptr(),
            ],
            page_aligned(&mut dst_buf),
            reps,
            &mut bw,
        );
        // SAFETY: the shm mapping made above, no longer used.
        let _ = unsafe { rustix::mm::munmap(shm_ptr.cast(), SIZE) };
        imp.forget(&h);
        exporter.revoke(&h).expect("revoke");
    }
    // Each rep reads the sources in turn: the ratio of each rep's pair, then
    // their median, so that a change in the machine's state moves both sides
    // of a pair (as `bench transfer`'s 2-D copy figures do).
    let pair = |a: &[f64], b: &[f64]| -> Vec<f64> { a.iter().zip(b).map(|(a, b)| a / b).collect() };
    let mut over_local = pair(&bw[0], &bw[1]);
    let mut over_own = pair(&bw[0], &bw[3]);
    let mut shm_over_local = pair(&bw[2], &bw[1]);
    rep.push_samples("hetero/ipc-read", "GB/s", &mut bw[0]);
    rep.push_samples("local/memcpy-read", "GB/s", &mut bw[1]);
    rep.push_samples("shm/read", "GB/s", &mut bw[2]);
    rep.push_samples("hetero/ipc-exporter-map-read", "GB/s", &mut bw[3]);
    rep.push_samples("hetero/ipc-read-over-local", "ratio", &mut over_local);
    rep.push_samples("shm/read-over-local", "ratio", &mut shm_over_local);
    rep.push_samples("hetero/ipc-read-over-exporter-map", "ratio", &mut over_own);
    rep.ratio(
        "ipc-read hetero/local (ratio of medians)",
        "hetero/ipc-read",
        "local/memcpy-read",
    );
    rep.ratio("ipc-read hetero/shm", "hetero/ipc-read", "shm/read");
    rep.notes.push(format!(
        "ipc read: {rounds} rounds of fresh 64 MiB buffers (export, local Vec, shm object, \
         destination), all page-aligned and written, {reps} interleaved reads of each per round"
    ));
    rep.notes.push(
        "ipc: the exporter serves from a thread of this process (same socket, SCM_RIGHTS and \
         checks as between processes); ipc-import-first is over an established connection, \
         ipc-connect-and-import-first includes the first contact"
            .into(),
    );
}
