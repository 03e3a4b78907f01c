//! Virtual memory through hetero's public API: a device's memory contexts,
//! their quotas and figures, and isolation between them.

mod common;

use hetero::vmm::{Access, Granularity};
use hetero::MemoryError;

#[test]
fn a_device_context_maps_within_its_quota_and_reports_it() {
    let d = common::device();
    let ctx = d.create_memory_context("test", 6 << 20);
    let mut range = ctx.reserve(64 << 20, Granularity::Huge2M).expect("reserve");
    let phys = ctx
        .create_physical(8 << 20, Granularity::Huge2M)
        .expect("physical");
    range
        .map(0, &phys, 0, 4 << 20, Access::ReadWrite)
        .expect("map");
    let e = range
        .map(4 << 20, &phys, 4 << 20, 4 << 20, Access::ReadWrite)
        .unwrap_err();
    assert!(matches!(e, MemoryError::QuotaExceeded { .. }), "{e}");
    let stats = d
        .memory_contexts()
        .into_iter()
        .find(|c| c.id == ctx.id())
        .expect("listed");
    assert_eq!((stats.mapped, stats.denied), (4 << 20, 1));
    assert!(stats.name.contains("test"), "{}", stats.name);
    // Another context reaches this context's memory only once imported.
    let other = d.create_memory_context("other", usize::MAX);
    let mut theirs = other
        .reserve(4 << 20, Granularity::Huge2M)
        .expect("reserve");
    let e = theirs.map(0, &phys, 0, 4 << 20, Access::Read).unwrap_err();
    assert!(matches!(e, MemoryError::ForeignContext { .. }), "{e}");
    // SAFETY: the first 4 MiB of `range` are mapped read-write.
    unsafe { range.ptr().write(42) };
    let imported = other.import(&phys).expect("import");
    theirs
        .map(0, &imported, 0, 4 << 20, Access::Read)
        .expect("map imported");
    // SAFETY: mapped readable just now.
    assert_eq!(unsafe { theirs.ptr().read() }, 42);
    range.unmap(0, 4 << 20).expect("unmap");
    assert_eq!(ctx.stats().mapped, 0);
}
