//! The IPC series of `hetero bench vmm`: importing a 64 MiB export (first
//! time and from the cache) and reading imported memory, beside a local
//! memcpy and POSIX `shm_open` + `mmap` in the same run.
//!
//! The exporter serves from a thread of this process: the import still goes
//! through the Unix socket, `SCM_RIGHTS`, the seal and size checks and a new
//! mapping, as it does between processes (tests/ipc.rs runs it across two).

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
/// copy each).
fn read_bw(srcs: &[*const u8], dst: &mut [u8], reps: usize) -> Vec<Vec<f64>> {
    // SAFETY: callers pass sources valid for dst.len() bytes of reads.
    let srcs: Vec<&[u8]> = srcs
        .iter()
        .map(|&p| unsafe { std::slice::from_raw_parts(p, dst.len()) })
        .collect();
    for s in &srcs {
        dst.copy_from_slice(s);
    }
    let mut out = vec![Vec::with_capacity(reps); srcs.len()];
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
    out
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
    let shm_ptr = {
        use rustix::fs::Mode;
        use rustix::mm::{MapFlags, ProtFlags};
        use rustix::shm;
        let fd = shm::open(
            shm_name.as_str(),
            shm::OFlags::CREATE | shm::OFlags::RDWR | shm::OFlags::EXCL,
            Mode::RUSR | Mode::WUSR,
        )
        .expect("shm_open");
        rustix::fs::ftruncate(&fd, SIZE as u64).expect("ftruncate");
        let mut last = std::ptr::null_mut();
        for i in 0..samples {
            let t = Instant::now();
            let fd2 =
                shm::open(shm_name.as_str(), shm::OFlags::RDWR, Mode::empty()).expect("shm_open");
            // SAFETY: a fresh shared mapping of the shm object.
            let p = unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    SIZE,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED,
                    &fd2,
                    0,
                )
            }
            .expect("mmap");
            shm_open.push(ns(t));
            if i + 1 == samples {
                last = p;
            } else {
                // SAFETY: the mapping made above, unused.
                let _ = unsafe { rustix::mm::munmap(p, SIZE) };
            }
        }
        let _ = shm::unlink(shm_name.as_str());
        // Written once, as the exported memory is: an unwritten shm object
        // reads as the kernel's one shared zero page, which stays in cache
        // and flattered the peer.
        // SAFETY: the last mapping made above, SIZE bytes, read-write, used by
        // nothing else.
        unsafe { std::ptr::write_bytes(last.cast::<u8>(), 1, SIZE) };
        last.cast::<u8>()
    };
    rep.push_samples("shm/open-and-map-64m", "ns", &mut shm_open);
    rep.ratio(
        "ipc-import-first hetero/shm-open-map",
        "hetero/ipc-import-first",
        "shm/open-and-map-64m",
    );

    // Read bandwidth: imported memory, a local buffer, the shm mapping.
    let reps = if quick { 30 } else { 100 };
    let mut dst = vec![0u8; SIZE];
    let mut local = vec![1u8; SIZE];
    local[SIZE - 1] = 2;
    let mut bw = read_bw(
        &[first_contact.ptr(), local.as_ptr(), shm_ptr],
        &mut dst,
        reps,
    );
    // Each rep reads the three in turn: the ratio of each rep's pair, then
    // their median, so that a change in the machine's state moves both sides
    // of a pair (as `bench transfer`'s 2-D copy figures do).
    let mut pairs: Vec<f64> = bw[0].iter().zip(&bw[1]).map(|(a, b)| a / b).collect();
    rep.push_samples("hetero/ipc-read", "GB/s", &mut bw[0]);
    rep.push_samples("local/memcpy-read", "GB/s", &mut bw[1]);
    rep.push_samples("shm/read", "GB/s", &mut bw[2]);
    rep.push_samples("hetero/ipc-read-over-local", "ratio", &mut pairs);
    rep.ratio(
        "ipc-read hetero/local (ratio of medians)",
        "hetero/ipc-read",
        "local/memcpy-read",
    );
    rep.ratio("ipc-read hetero/shm", "hetero/ipc-read", "shm/read");
    // SAFETY: the last shm mapping, no longer used.
    let _ = unsafe { rustix::mm::munmap(shm_ptr.cast(), SIZE) };
    rep.notes.push(
        "ipc: the exporter serves from a thread of this process (same socket, SCM_RIGHTS and \
         checks as between processes); ipc-import-first is over an established connection, \
         ipc-connect-and-import-first includes the first contact"
            .into(),
    );
}
