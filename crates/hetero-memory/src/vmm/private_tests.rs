//! Unit tests of private handles through the public API: pages move with
//! the handle and keep their contents, the range stays reserved around them,
//! and every use that needs a memfd or a second place is a typed error that
//! changes nothing (an export, too: ipc/tests.rs).

use super::tests::{perms_at, release_reads_as_zero};
use super::*;
use crate::MemoryError;

const M2: usize = 2 << 20;
const K4: usize = 4 << 10;

fn ctx() -> MemoryContext {
    MemoryContext::unlimited("private test")
}

fn private_err(r: Result<impl std::fmt::Debug, MemoryError>, what: &str) {
    match r {
        Err(e @ MemoryError::Private { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("created private"), "{msg}");
            assert!(
                msg.contains("shareable"),
                "the message says what to do: {msg}"
            );
        }
        other => panic!("{what}: expected MemoryError::Private, got {other:?}"),
    }
}

#[test]
fn pages_move_with_the_handle_and_keep_their_contents() {
    let c = ctx();
    let p = c
        .create_private(2 * M2, Granularity::Huge2M)
        .expect("private");
    assert!(p.is_private());
    p.commit(0, 2 * M2).expect("commit while held");
    let mut r = c.reserve(8 * M2, Granularity::Huge2M).expect("reserve");
    r.map(2 * M2, &p, 0, 2 * M2, Access::ReadWrite)
        .expect("map");
    assert_eq!(r.mapped_bytes(), 2 * M2);
    assert_eq!(c.stats().mapped, 2 * M2);
    let at = r.ptr() as usize + 2 * M2;
    assert_eq!(perms_at(at), "rw-p", "anonymous memory, private");
    // SAFETY: [2 * M2, 4 * M2) is mapped read-write.
    unsafe {
        r.ptr().add(2 * M2).write(7);
        r.ptr().add(4 * M2 - 1).write(9);
    }
    r.unmap(2 * M2, 2 * M2).expect("unmap");
    assert_eq!(r.mapped_bytes(), 0);
    assert!(!r.is_mapped(2 * M2, M2));
    assert_eq!(perms_at(at), "---p", "the hole is reserved again");
    // Elsewhere in the range: same contents, moved not copied.
    r.map(6 * M2, &p, 0, 2 * M2, Access::Read)
        .expect("map again");
    assert_eq!(perms_at(r.ptr() as usize + 6 * M2), "r--p");
    // SAFETY: [6 * M2, 8 * M2) is mapped readable.
    unsafe {
        assert_eq!(r.ptr().add(6 * M2).read_volatile(), 7);
        assert_eq!(r.ptr().add(8 * M2 - 1).read_volatile(), 9);
    }
    // A shareable handle maps where the private one was.
    let s = c
        .create_physical(2 * M2, Granularity::Huge2M)
        .expect("shareable");
    r.map(2 * M2, &s, 0, 2 * M2, Access::ReadWrite)
        .expect("shareable map over the old place");
    drop(r);
    assert_eq!(
        c.stats().mapped,
        0,
        "dropping the range refunds the context"
    );
}

#[test]
fn a_dropped_range_gives_a_held_handle_its_pages_back() {
    let c = ctx();
    let p = c
        .create_private(2 * M2, Granularity::Huge2M)
        .expect("private");
    let mut r = c.reserve(4 * M2, Granularity::Huge2M).expect("reserve");
    r.map(0, &p, 0, 2 * M2, Access::ReadWrite).expect("map");
    // SAFETY: [0, 2 * M2) is mapped read-write.
    unsafe { r.ptr().add(M2 + 100).write(0x5A) };
    // Two runs of the handle: the drop must rejoin them to move them out.
    r.set_access(0, M2, Access::Read).expect("set access");
    assert_eq!(r.runs().count(), 2);
    drop(r);
    assert_eq!(c.stats().mapped, 0);
    let mut r2 = c.reserve(2 * M2, Granularity::Huge2M).expect("reserve");
    r2.map(0, &p, 0, 2 * M2, Access::Read)
        .expect("map in a new range");
    // SAFETY: mapped readable.
    assert_eq!(unsafe { r2.ptr().add(M2 + 100).read_volatile() }, 0x5A);
    // The handle's last holder gone with the range mapping it: nothing leaks
    // or faults (the pages go with the range).
    drop(p);
    drop(r2);
}

#[test]
fn set_access_splits_and_unmap_moves_the_whole_handle_out() {
    let c = ctx();
    let p = c
        .create_private(4 * K4, Granularity::Page4K)
        .expect("private");
    let mut r = c.reserve(8 * K4, Granularity::Page4K).expect("reserve");
    r.map(0, &p, 0, 4 * K4, Access::ReadWrite).expect("map");
    // SAFETY: four pages mapped read-write.
    unsafe { r.ptr().add(3 * K4).write(4) };
    r.set_access(K4, K4, Access::None).expect("set access");
    assert_eq!(r.runs().count(), 3);
    assert_eq!(perms_at(r.ptr() as usize + K4), "---p");
    r.unmap(0, 4 * K4).expect("unmap");
    r.map(4 * K4, &p, 0, 4 * K4, Access::ReadWrite)
        .expect("map");
    // SAFETY: mapped read-write.
    assert_eq!(unsafe { r.ptr().add(7 * K4).read_volatile() }, 4);
}

#[test]
fn released_and_new_private_pages_read_as_zero() {
    let c = ctx();
    let p = c
        .create_private(2 * K4, Granularity::Page4K)
        .expect("private");
    release_reads_as_zero(&c, &p);
    assert!(matches!(
        p.commit(0, 3 * K4),
        Err(MemoryError::OutOfRange { .. })
    ));
}

#[test]
fn what_needs_a_memfd_or_a_second_place_is_a_typed_error() {
    let c = ctx();
    let p = c
        .create_private(2 * M2, Granularity::Huge2M)
        .expect("private");
    private_err(p.fd(), "fd");
    private_err(ctx().import(&p), "import into another context");
    let mut r = c.reserve(8 * M2, Granularity::Huge2M).expect("reserve");
    private_err(
        r.map(0, &p, 0, M2, Access::ReadWrite),
        "map of the first half",
    );
    private_err(
        r.map(0, &p, M2, M2, Access::ReadWrite),
        "map of the second half",
    );
    assert_eq!(r.mapped_bytes(), 0, "a refused map changes nothing");
    assert_eq!(c.stats().mapped, 0, "nor charges the context");
    r.map(0, &p, 0, 2 * M2, Access::ReadWrite).expect("map");
    private_err(r.map(4 * M2, &p, 0, 2 * M2, Access::ReadWrite), "map twice");
    let mut other = c.reserve(2 * M2, Granularity::Huge2M).expect("reserve");
    private_err(
        other.map(0, &p, 0, 2 * M2, Access::ReadWrite),
        "map in a second range",
    );
    assert_eq!(c.stats().mapped, 2 * M2);
    private_err(r.unmap(0, M2), "unmap of half");
    assert!(r.is_mapped(0, 2 * M2), "a refused unmap changes nothing");
    // SAFETY: still mapped read-write.
    unsafe { r.ptr().add(2 * M2 - 1).write(1) };
    // A shareable handle beside it, unmapped in the same call.
    let s = c
        .create_physical(M2, Granularity::Huge2M)
        .expect("shareable");
    r.map(2 * M2, &s, 0, M2, Access::ReadWrite).expect("map");
    r.unmap(0, 3 * M2).expect("unmap both");
    assert_eq!(r.mapped_bytes(), 0);
    assert_eq!(c.stats().mapped, 0);
}

#[test]
fn private_handles_say_what_backs_them() {
    let c = ctx();
    let p = c.create_private(M2, Granularity::Huge2M).expect("private");
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains("[never]") || thp.is_empty() {
        assert_eq!(p.page_kind(), crate::PageKind::Normal);
        assert!(
            p.notes()
                .iter()
                .any(|n| n.contains("transparent huge pages")),
            "{:?}",
            p.notes()
        );
    } else {
        assert_eq!(
            p.page_kind(),
            crate::PageKind::Transparent,
            "{:?}",
            p.notes()
        );
    }
    let small = c.create_private(K4, Granularity::Page4K).expect("private");
    assert_eq!(small.page_kind(), crate::PageKind::Normal);
    assert!(matches!(
        c.create_private(M2 + K4, Granularity::Huge2M),
        Err(MemoryError::Unaligned { .. })
    ));
    assert!(matches!(
        c.create_private(0, Granularity::Page4K),
        Err(MemoryError::Unaligned { .. })
    ));
}
