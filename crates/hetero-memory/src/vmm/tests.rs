//! Unit tests of the virtual memory API: each check is a typed error, maps
//! really back the pages, unmaps really return them to the reservation.

use super::*;
use crate::MemoryError;

const M2: usize = 2 << 20;
const K4: usize = 4 << 10;

fn ctx() -> MemoryContext {
    MemoryContext::unlimited("test")
}

#[test]
fn reserve_is_aligned_and_maps_nothing() {
    let c = ctx();
    let r = c
        .reserve(10 * M2 + 1, Granularity::Huge2M)
        .expect("reserve");
    assert_eq!(r.size(), 11 * M2);
    assert_eq!(r.ptr() as usize % M2, 0);
    assert_eq!(r.mapped_bytes(), 0);
    assert!(!r.is_mapped(0, M2));
}

#[test]
fn map_write_unmap_remap_keeps_contents_in_the_handle() {
    let c = ctx();
    let mut r = c.reserve(8 * M2, Granularity::Huge2M).expect("reserve");
    let p = c
        .create_physical(2 * M2, Granularity::Huge2M)
        .expect("physical");
    r.map(2 * M2, &p, 0, 2 * M2, Access::ReadWrite)
        .expect("map");
    // SAFETY: [2 MiB, 6 MiB) is mapped read-write.
    unsafe { r.ptr().add(3 * M2).write(42) };
    r.unmap(2 * M2, 2 * M2).expect("unmap");
    assert_eq!(r.mapped_bytes(), 0);
    // The same physical page at another address: same contents.
    r.map(6 * M2, &p, 0, 2 * M2, Access::Read)
        .expect("map again");
    // SAFETY: [6 MiB, 10 MiB) is mapped read-only now.
    assert_eq!(unsafe { r.ptr().add(7 * M2).read() }, 42);
    assert_eq!(c.stats().mapped, 2 * M2);
    drop(r);
    assert_eq!(
        c.stats().mapped,
        0,
        "dropping the range refunds the context"
    );
}

#[test]
fn contiguous_maps_of_one_handle_coalesce_into_one_run() {
    let c = ctx();
    let mut r = c.reserve(16 * M2, Granularity::Huge2M).expect("reserve");
    let p = c
        .create_physical(10 * M2, Granularity::Huge2M)
        .expect("physical");
    // One call over 10 granules: one mmap, one run.
    r.map(0, &p, 0, 10 * M2, Access::ReadWrite).expect("map");
    assert_eq!(r.os_calls(), 1);
    assert_eq!(r.runs().count(), 1);
    r.unmap(0, 10 * M2).expect("unmap");
    // Granule by granule in order: the table joins them into one run.
    for i in 0..10 {
        r.map(i * M2, &p, i * M2, M2, Access::ReadWrite)
            .expect("map");
    }
    let runs: Vec<_> = r.runs().map(|(o, run)| (o, run.len())).collect();
    assert_eq!(runs, vec![(0, 10 * M2)]);
    // A hole in the handle offsets keeps runs apart.
    r.unmap(4 * M2, M2).expect("unmap one");
    r.map(4 * M2, &p, 9 * M2, M2, Access::ReadWrite)
        .expect("map another page there");
    let runs: Vec<_> = r.runs().map(|(o, run)| (o, run.len())).collect();
    assert_eq!(runs, vec![(0, 4 * M2), (4 * M2, M2), (5 * M2, 5 * M2)]);
}

#[test]
fn a_handle_page_may_back_two_addresses() {
    let c = ctx();
    let mut r = c.reserve(4 * M2, Granularity::Huge2M).expect("reserve");
    let p = c
        .create_physical(M2, Granularity::Huge2M)
        .expect("physical");
    r.map(0, &p, 0, M2, Access::ReadWrite).expect("map");
    r.map(2 * M2, &p, 0, M2, Access::Read).expect("alias");
    // SAFETY: both granules are mapped, the first read-write.
    unsafe {
        r.ptr().add(5).write(9);
        assert_eq!(r.ptr().add(2 * M2 + 5).read(), 9);
    }
    assert_eq!(r.runs().count(), 2);
}

#[test]
fn every_bad_call_is_a_typed_error() {
    let c = ctx();
    let mut r = c.reserve(8 * M2, Granularity::Huge2M).expect("reserve");
    let p = c
        .create_physical(4 * M2, Granularity::Huge2M)
        .expect("physical");
    let e = r.map(K4, &p, 0, M2, Access::ReadWrite).unwrap_err();
    assert!(
        matches!(
            e,
            MemoryError::Unaligned {
                what: "map offset",
                ..
            }
        ),
        "{e}"
    );
    let e = r.map(0, &p, 0, M2 + K4, Access::ReadWrite).unwrap_err();
    assert!(
        matches!(e, MemoryError::Unaligned { what: "length", .. }),
        "{e}"
    );
    let e = r.map(0, &p, K4, M2, Access::ReadWrite).unwrap_err();
    assert!(
        matches!(
            e,
            MemoryError::Unaligned {
                what: "handle offset",
                ..
            }
        ),
        "{e}"
    );
    let e = r.map(7 * M2, &p, 0, 2 * M2, Access::ReadWrite).unwrap_err();
    assert!(matches!(e, MemoryError::OutOfRange { .. }), "{e}");
    let e = r.map(0, &p, 2 * M2, 4 * M2, Access::ReadWrite).unwrap_err();
    assert!(matches!(e, MemoryError::OutOfRange { .. }), "{e}");
    r.map(2 * M2, &p, 0, 2 * M2, Access::ReadWrite)
        .expect("map");
    let e = r
        .map(M2 * 3, &p, 2 * M2, M2, Access::ReadWrite)
        .unwrap_err();
    assert!(
        matches!(e, MemoryError::Overlap { existing, .. } if existing == 2 * M2),
        "{e}"
    );
    let e = r.map(0, &p, 2 * M2, 4 * M2, Access::ReadWrite).unwrap_err();
    assert!(
        matches!(
            e,
            MemoryError::OutOfRange { .. } | MemoryError::Overlap { .. }
        ),
        "{e}"
    );
    let e = r.unmap(0, 2 * M2).unwrap_err();
    assert!(
        matches!(
            e,
            MemoryError::NotMapped {
                what: "unmap",
                first_unmapped: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = r.unmap(2 * M2, 4 * M2).unwrap_err();
    assert!(
        matches!(e, MemoryError::NotMapped { first_unmapped, .. } if first_unmapped == 4 * M2),
        "{e}"
    );
    let e = r.set_access(4 * M2, M2, Access::Read).unwrap_err();
    assert!(
        matches!(
            e,
            MemoryError::NotMapped {
                what: "set_access",
                ..
            }
        ),
        "{e}"
    );
    let e = r.unmap(2 * M2, 0).unwrap_err();
    assert!(matches!(e, MemoryError::InvalidRequest { .. }), "{e}");
    // A failed call changed nothing.
    assert_eq!(r.mapped_bytes(), 2 * M2);
    assert!(r.is_mapped(2 * M2, 2 * M2));
    assert!(e.to_string().contains("at least one granule"));
    let e = c.create_physical(M2 + K4, Granularity::Huge2M).unwrap_err();
    assert!(
        matches!(
            e,
            MemoryError::Unaligned {
                what: "physical size",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn coarse_handle_in_a_fine_range_is_refused() {
    let c = ctx();
    let mut r = c.reserve(4 * M2, Granularity::Page4K).expect("reserve");
    let p = c
        .create_physical(M2, Granularity::Huge2M)
        .expect("physical");
    let e = r.map(0, &p, 0, M2, Access::ReadWrite).unwrap_err();
    assert!(matches!(e, MemoryError::GranularityMismatch { .. }), "{e}");
    // A fine handle in a coarse range is fine.
    let mut r2 = c.reserve(4 * M2, Granularity::Huge2M).expect("reserve");
    let q = c
        .create_physical(M2, Granularity::Page4K)
        .expect("physical");
    r2.map(0, &q, 0, M2, Access::ReadWrite)
        .expect("4 KiB handle, 2 MiB range");
}

#[test]
fn set_access_splits_and_rejoins_runs() {
    let c = ctx();
    let mut r = c.reserve(16 * K4, Granularity::Page4K).expect("reserve");
    let p = c
        .create_physical(8 * K4, Granularity::Page4K)
        .expect("physical");
    r.map(0, &p, 0, 8 * K4, Access::ReadWrite).expect("map");
    r.set_access(2 * K4, 2 * K4, Access::Read)
        .expect("read-only");
    let runs: Vec<_> = r
        .runs()
        .map(|(o, run)| (o, run.len(), run.access()))
        .collect();
    assert_eq!(
        runs,
        vec![
            (0, 2 * K4, Access::ReadWrite),
            (2 * K4, 2 * K4, Access::Read),
            (4 * K4, 4 * K4, Access::ReadWrite)
        ]
    );
    r.set_access(2 * K4, 2 * K4, Access::ReadWrite)
        .expect("back");
    assert_eq!(r.runs().count(), 1);
    // Unmapping the middle splits the run; its tail keeps its handle offset.
    r.unmap(3 * K4, K4).expect("unmap a page");
    let runs: Vec<_> = r
        .runs()
        .map(|(o, run)| (o, run.len(), run.handle_offset()))
        .collect();
    assert_eq!(runs, vec![(0, 3 * K4, 0), (4 * K4, 4 * K4, 4 * K4)]);
}

/// The permissions /proc/self/maps lists for the mapping holding `addr`.
pub(super) fn perms_at(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(span), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        let Some((lo, hi)) = span.split_once('-') else {
            continue;
        };
        let lo = usize::from_str_radix(lo, 16).expect("hex");
        let hi = usize::from_str_radix(hi, 16).expect("hex");
        if (lo..hi).contains(&addr) {
            return perms.to_string();
        }
    }
    panic!("{addr:#x} is in no mapping");
}

#[test]
fn access_changes_reach_the_page_tables() {
    let c = ctx();
    let mut r = c.reserve(4 * K4, Granularity::Page4K).expect("reserve");
    let p = c
        .create_physical(K4, Granularity::Page4K)
        .expect("physical");
    let at = r.ptr() as usize;
    assert_eq!(perms_at(at), "---p", "reserved: no access, private");
    r.map(0, &p, 0, K4, Access::Read).expect("map");
    assert_eq!(perms_at(at), "r--s", "mapped shared, read-only");
    // SAFETY: the page is mapped readable; memfd pages start zeroed.
    assert_eq!(unsafe { r.ptr().read_volatile() }, 0);
    r.set_access(0, K4, Access::None).expect("none");
    assert_eq!(perms_at(at), "---s");
    r.set_access(0, K4, Access::ReadWrite).expect("rw");
    assert_eq!(perms_at(at), "rw-s");
    // SAFETY: now writable.
    unsafe { r.ptr().write_volatile(3) };
    r.unmap(0, K4).expect("unmap");
    assert_eq!(perms_at(at), "---p", "back to the reservation");
}

#[test]
fn released_pages_read_as_zero() {
    let c = ctx();
    let p = c
        .create_physical(2 * K4, Granularity::Page4K)
        .expect("physical");
    release_reads_as_zero(&c, &p);
}

/// `p` (two fresh 4 KiB pages of `c`) mapped read-write: new pages read as
/// zero, a released page reads as zero again while mapped and its neighbour
/// keeps its bytes, and an unaligned release is a typed error.
pub(super) fn release_reads_as_zero(c: &MemoryContext, p: &PhysicalMemory) {
    let mut r = c.reserve(2 * K4, Granularity::Page4K).expect("reserve");
    r.map(0, p, 0, 2 * K4, Access::ReadWrite).expect("map");
    // SAFETY: both pages are mapped read-write.
    unsafe {
        assert_eq!(r.ptr().read_volatile(), 0);
        r.ptr().write(1);
        r.ptr().add(K4).write(2);
    }
    p.release(0, K4).expect("release while mapped");
    // SAFETY: still mapped; the released page reads as zero.
    unsafe {
        assert_eq!(r.ptr().read_volatile(), 0);
        assert_eq!(r.ptr().add(K4).read_volatile(), 2);
    }
    assert!(matches!(
        p.release(1, K4),
        Err(MemoryError::Unaligned { .. })
    ));
}

#[test]
fn committed_pages_are_allocated_and_keep_their_contents() {
    let c = ctx();
    let p = c
        .create_physical(4 * K4, Granularity::Page4K)
        .expect("physical");
    let allocated = |p: &crate::vmm::PhysicalMemory| {
        rustix::fs::fstat(p.fd().expect("shareable"))
            .expect("fstat")
            .st_blocks as usize
            * 512
    };
    assert_eq!(allocated(&p), 0, "a new handle holds no pages");
    let mut r = c.reserve(4 * K4, Granularity::Page4K).expect("reserve");
    r.map(0, &p, 0, 4 * K4, Access::ReadWrite).expect("map");
    // SAFETY: mapped read-write.
    unsafe { r.ptr().write(7) };
    p.commit(0, 2 * K4).expect("commit");
    assert_eq!(allocated(&p), 2 * K4, "the touched page and the next one");
    // SAFETY: still mapped read-write.
    unsafe {
        assert_eq!(r.ptr().read_volatile(), 7, "commit keeps the contents");
        assert_eq!(r.ptr().add(K4).read_volatile(), 0);
    }
    assert!(matches!(
        p.commit(K4, 1),
        Err(MemoryError::Unaligned {
            what: "commit length",
            ..
        })
    ));
    assert!(matches!(
        p.commit(2 * K4, 4 * K4),
        Err(MemoryError::OutOfRange { what: "commit", .. })
    ));
}

#[test]
fn huge_handles_say_what_backs_them() {
    let c = ctx();
    let p = c
        .create_physical(M2, Granularity::Huge2M)
        .expect("physical");
    let free = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .unwrap_or_default();
    if free.trim() == "0" {
        assert_ne!(p.page_kind(), crate::PageKind::Hugetlb2M);
        assert!(
            p.notes().iter().any(|n| n.contains("hugetlb")),
            "{:?}",
            p.notes()
        );
    }
    let seals = rustix::fs::fcntl_get_seals(p.fd().expect("shareable")).expect("seals");
    assert!(seals.contains(physical::SEALS));
    // The seals hold: the handle cannot shrink.
    assert!(rustix::fs::ftruncate(p.fd().expect("shareable"), 0).is_err());
}

#[test]
fn a_context_maps_only_its_own_or_imported_handles() {
    let a = MemoryContext::unlimited("a");
    let b = MemoryContext::unlimited("b");
    let pa = a
        .create_physical(M2, Granularity::Huge2M)
        .expect("physical");
    let mut rb = b.reserve(4 * M2, Granularity::Huge2M).expect("reserve");
    let e = rb.map(0, &pa, 0, M2, Access::ReadWrite).unwrap_err();
    assert!(matches!(e, MemoryError::ForeignContext { .. }), "{e}");
    let imported = b.import(&pa).expect("import");
    rb.map(0, &imported, 0, M2, Access::ReadWrite)
        .expect("imported");
    assert_eq!(b.stats().mapped, M2);
    assert_eq!(a.stats().mapped, 0);
}

#[test]
fn quota_is_checked_at_map_time() {
    let c = MemoryContext::new("small", 3 * M2);
    let mut r = c.reserve(8 * M2, Granularity::Huge2M).expect("reserve");
    let p = c
        .create_physical(4 * M2, Granularity::Huge2M)
        .expect("physical");
    r.map(0, &p, 0, 2 * M2, Access::ReadWrite)
        .expect("within quota");
    let e = r
        .map(2 * M2, &p, 2 * M2, 2 * M2, Access::ReadWrite)
        .unwrap_err();
    assert!(matches!(e, MemoryError::QuotaExceeded { .. }), "{e}");
    assert!(e.to_string().contains("raise its quota"), "{e}");
    assert!(!r.is_mapped(2 * M2, M2), "a refused map maps nothing");
    r.map(2 * M2, &p, 2 * M2, M2, Access::ReadWrite)
        .expect("exactly at quota");
    let s = c.stats();
    assert_eq!((s.mapped, s.denied, s.peak_mapped), (3 * M2, 1, 3 * M2));
    assert!(contexts()
        .iter()
        .any(|x| x.id == c.id() && x.mapped == 3 * M2));
}

#[test]
fn populate_faults_pages_in_and_checks_its_input() {
    let c = ctx();
    let mut r = c.reserve(8 * K4, Granularity::Page4K).expect("reserve");
    let p = c
        .create_physical(4 * K4, Granularity::Page4K)
        .expect("physical");
    r.map(0, &p, 0, 4 * K4, Access::ReadWrite).expect("map");
    let resident = |r: &VirtualRange| {
        let mut v = [0u8; 4];
        // SAFETY: the first four pages of the range are mapped; `v` has one
        // byte per page.
        let rc = unsafe { libc::mincore(r.ptr().cast(), 4 * K4, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        v.iter().filter(|b| **b & 1 != 0).count()
    };
    assert_eq!(resident(&r), 0, "nothing touched yet");
    r.populate(0, 4 * K4).expect("populate");
    assert_eq!(resident(&r), 4);
    let e = r.populate(0, 8 * K4).unwrap_err();
    assert!(
        matches!(
            e,
            MemoryError::NotMapped {
                what: "populate",
                ..
            }
        ),
        "{e}"
    );
    r.set_access(0, K4, Access::Read).expect("read-only");
    let e = r.populate(0, 2 * K4).unwrap_err();
    assert!(matches!(e, MemoryError::InvalidRequest { .. }), "{e}");
}
