//! The virtual memory API through the public interface: reserve, map physical
//! handles, write through one mapping and read through another, and the
//! isolation of memory contexts under random grow/shrink operations.

use hetero_memory::vmm::{Access, Granularity, MemoryContext, VirtualRange};
use hetero_memory::MemoryError;

const K4: usize = 4 << 10;

#[test]
fn a_segment_grows_and_shrinks_by_whole_granules() {
    let g = Granularity::Huge2M.bytes();
    let ctx = MemoryContext::unlimited("segment");
    let mut seg = ctx.reserve(64 * g, Granularity::Huge2M).expect("reserve");
    let mut granules = Vec::new();
    for i in 0..8 {
        let p = ctx
            .create_physical(g, Granularity::Huge2M)
            .expect("granule");
        seg.map(i * g, &p, 0, g, Access::ReadWrite).expect("grow");
        granules.push(p);
    }
    // SAFETY: [0, 8 granules) is mapped read-write.
    let bytes = unsafe { std::slice::from_raw_parts_mut(seg.ptr(), 8 * g) };
    bytes.iter_mut().step_by(4096).for_each(|b| *b = 1);
    assert_eq!(seg.mapped_bytes(), 8 * g);
    // Shrink by three granules and grow again with the cached handles.
    seg.unmap(5 * g, 3 * g).expect("shrink");
    for (i, p) in granules[5..].iter().enumerate() {
        seg.map((5 + i) * g, p, 0, g, Access::ReadWrite)
            .expect("regrow");
    }
    // SAFETY: mapped again; the cached handles kept their contents.
    assert_eq!(unsafe { seg.ptr().add(7 * g).read() }, 1);
    assert_eq!(ctx.stats().mapped, 8 * g);
}

/// 10^5 random grow/shrink operations over two contexts with small quotas:
/// every refusal is exactly where the quota would be passed, the figures
/// always match a model, and no context ever has a byte over its quota.
#[test]
fn isolation_holds_over_random_grow_and_shrink() {
    struct Side {
        ctx: MemoryContext,
        range: VirtualRange,
        handle: hetero_memory::vmm::PhysicalMemory,
        mapped: Vec<bool>,
        model: usize,
        quota: usize,
    }
    const PAGES: usize = 256;
    let mk = |name: &str, quota_pages: usize| {
        let ctx = MemoryContext::new(name, quota_pages * K4);
        let range = ctx
            .reserve(PAGES * K4, Granularity::Page4K)
            .expect("reserve");
        let handle = ctx
            .create_physical(PAGES * K4, Granularity::Page4K)
            .expect("handle");
        Side {
            ctx,
            range,
            handle,
            mapped: vec![false; PAGES],
            model: 0,
            quota: quota_pages * K4,
        }
    };
    let mut sides = [mk("tenant-a", 100), mk("tenant-b", 37)];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut denied, mut foreign, mut over_quota_bytes) = (0u64, 0u64, 0usize);
    for _ in 0..100_000 {
        let which = (next() % 2) as usize;
        let page = (next() % PAGES as u64) as usize;
        let run = 1 + (next() % 4) as usize;
        let run = run.min(PAGES - page);
        let grow = next() % 2 == 0;
        // Now and then, try the other context's handle: always refused.
        if next() % 64 == 0 {
            let other = sides[1 - which].handle.clone();
            let s = &mut sides[which];
            let e = s.range.map(page * K4, &other, 0, K4, Access::ReadWrite);
            assert!(
                matches!(e, Err(MemoryError::ForeignContext { .. })),
                "{e:?}"
            );
            foreign += 1;
        }
        let s = &mut sides[which];
        let all = |v: bool| s.mapped[page..page + run].iter().all(|m| *m == v);
        if grow && all(false) {
            let r = s
                .range
                .map(page * K4, &s.handle, page * K4, run * K4, Access::ReadWrite);
            if s.model + run * K4 > s.quota {
                assert!(matches!(r, Err(MemoryError::QuotaExceeded { .. })), "{r:?}");
                denied += 1;
            } else {
                r.expect("within quota");
                s.mapped[page..page + run]
                    .iter_mut()
                    .for_each(|m| *m = true);
                s.model += run * K4;
            }
        } else if !grow && all(true) {
            s.range.unmap(page * K4, run * K4).expect("unmap");
            s.mapped[page..page + run]
                .iter_mut()
                .for_each(|m| *m = false);
            s.model -= run * K4;
        } else if grow {
            let e = s
                .range
                .map(page * K4, &s.handle, page * K4, run * K4, Access::ReadWrite);
            assert!(matches!(e, Err(MemoryError::Overlap { .. })), "{e:?}");
        } else {
            let e = s.range.unmap(page * K4, run * K4);
            assert!(matches!(e, Err(MemoryError::NotMapped { .. })), "{e:?}");
        }
        for s in &sides {
            let st = s.ctx.stats();
            assert_eq!(st.mapped, s.model);
            assert_eq!(s.range.mapped_bytes(), s.model);
            over_quota_bytes = over_quota_bytes.max(st.mapped.saturating_sub(st.quota));
        }
    }
    assert_eq!(over_quota_bytes, 0);
    assert!(denied > 100, "the quotas were reached: {denied} refusals");
    assert!(foreign > 100);
    for s in &sides {
        let st = s.ctx.stats();
        assert!(st.peak_mapped <= st.quota);
        assert!(st.denied > 0);
    }
}

/// Zero lengths, on shareable (memfd) and private handles and on ranges with
/// and without mapped pages: a query answers (an empty range has no unmapped
/// page), a call that would change pages is the `InvalidRequest` every call
/// gives for it, never an OS error or a panic.
#[test]
fn zero_lengths_are_answered_or_refused_alike_everywhere() {
    let ctx = MemoryContext::unlimited("zero");
    let shared = ctx
        .create_physical(4 * K4, Granularity::Page4K)
        .expect("shareable");
    let private = ctx
        .create_private(4 * K4, Granularity::Page4K)
        .expect("private");
    for p in [&shared, &private] {
        for (what, r) in [("commit", p.commit(K4, 0)), ("release", p.release(K4, 0))] {
            let e = r.expect_err(what);
            assert!(
                matches!(e, MemoryError::InvalidRequest { .. }),
                "{what}: {e}"
            );
            assert!(
                e.to_string().contains("at least one granule"),
                "{what}: {e}"
            );
        }
        let mut r: VirtualRange = ctx.reserve(8 * K4, Granularity::Page4K).expect("reserve");
        assert!(
            r.is_mapped(0, 0) && r.is_mapped(8 * K4, 0),
            "nothing mapped"
        );
        assert!(!r.is_mapped(8 * K4 + 1, 0), "past the end");
        r.map(2 * K4, p, 0, 4 * K4, Access::ReadWrite).expect("map");
        for off in [0, K4, 2 * K4, 3 * K4, 4 * K4, 8 * K4] {
            assert!(r.is_mapped(off, 0), "empty range at {off:#x}");
        }
        assert!(!r.is_mapped(9 * K4, 0));
        assert!(r.is_mapped(2 * K4, 4 * K4) && !r.is_mapped(K4, 2 * K4));
        let e = r.map(7 * K4, p, 0, 0, Access::ReadWrite).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidRequest { .. }), "{e}");
        let e = r.unmap(2 * K4, 0).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidRequest { .. }), "{e}");
        r.unmap(2 * K4, 4 * K4).expect("unmap");
    }
}
