//! The emulated device's IOMMU: the device reaches host memory only through I/O
//! virtual addresses (IOVAs) mapped in this per-device page table, and an I/O TLB
//! caches the translations.
//!
//! - Pinned pool chunks are mapped once, when the pool pins them (`IommuChunks`
//!   wraps the pinned pool's chunk source), with the chunk's page size: 2 MiB for
//!   hugetlb and transparent-huge-page chunks, 1 GiB for 1 GiB hugetlb, else 4 KiB
//!   (capped by `EmuConfig::iommu_page_max`, like an IOMMU driver without
//!   superpage support). `Device::register_host` maps a user's range with 4 KiB
//!   pages (nothing says what backs it).
//! - A DMA translates every page it touches: a hit costs nothing, a miss costs
//!   `EmuConfig::iotlb_miss_ns` of stall (`dma.rs`). The TLB is set-associative
//!   (4 ways) with LRU in a set; an unmap drops its mapping's entries.
//! - A DMA that reaches an address no mapping covers is refused before any byte
//!   moves: the stream faults with the address in its message.
//!
//! Invariants: mappings never overlap in IOVA space (a bump allocator, aligned to
//! each mapping's page size) nor in host space (each chunk or registration is
//! mapped once); translations are looked up only by the sim's holder.

use hetero_memory::{Chunk, ChunkSource, MemoryError, OsCalls, PageKind};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Where I/O virtual addresses start (never a host pointer, nor a device address).
pub(crate) const IOVA_BASE: u64 = 0x0000_4000_0000_0000;
const WAYS: usize = 4;

#[derive(Debug, Clone, Copy)]
struct Mapping {
    host: usize,
    len: usize,
    page: usize,
    id: u64,
}

/// Translation counts of one engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IotlbCounts {
    /// Pages found in the I/O TLB.
    pub hits: u64,
    /// Pages that needed a page-table walk.
    pub misses: u64,
}

impl IotlbCounts {
    /// Hits over all lookups (1 when there were none).
    pub fn hit_rate(&self) -> f64 {
        let all = self.hits + self.misses;
        if all == 0 {
            1.0
        } else {
            self.hits as f64 / all as f64
        }
    }
}

/// The state of an emulated device's IOMMU ([`Device::iommu_stats`](crate::Device::iommu_stats)).
#[derive(Debug, Clone, Default)]
pub struct IommuStats {
    /// Live mappings (pinned chunks and registered ranges).
    pub mappings: usize,
    /// Bytes they map.
    pub mapped_bytes: usize,
    /// Mappings made so far (each pinned chunk once, each registration once).
    pub maps_total: u64,
    /// Live mappings by page size: (page bytes, mappings).
    pub by_page: Vec<(usize, usize)>,
    /// I/O TLB lookups per copy engine: ("h2d" | "d2h" | "d2d" (fills of pinned
    /// memory), engine index, counts).
    pub per_engine: Vec<(&'static str, u32, IotlbCounts)>,
    /// I/O TLB entries.
    pub tlb_entries: usize,
}

struct Tables {
    by_iova: BTreeMap<u64, Mapping>,
    /// The exact host address each mapping was made for (two registrations may
    /// share a page) → (its key in `by_iova`, the bytes registered).
    by_host: BTreeMap<usize, (u64, usize)>,
    next_iova: u64,
    next_id: u64,
    maps_total: u64,
    /// `sets × WAYS` entries: (tag, last use), tag 0 = empty.
    tlb: Vec<(u64, u64)>,
    sets: usize,
    clock: u64,
    counts: BTreeMap<(u8, u32), IotlbCounts>,
}

/// One device context's page table and I/O TLB.
pub(crate) struct Iommu {
    tables: Mutex<Tables>,
    entries: usize,
    page_max: usize,
}

impl std::fmt::Debug for Iommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iommu")
            .field("entries", &self.entries)
            .finish()
    }
}

/// The IOMMU page size of a chunk the OS layer backed with `kind`.
pub(crate) fn page_of(kind: PageKind) -> usize {
    match kind {
        PageKind::Hugetlb1G => 1 << 30,
        PageKind::Hugetlb2M | PageKind::Transparent => 2 << 20,
        PageKind::Normal | PageKind::Device => 4096,
    }
}

impl Iommu {
    pub(crate) fn new(entries: usize, page_max: usize) -> Self {
        let entries = entries.max(1);
        let sets = entries.div_ceil(WAYS);
        Iommu {
            tables: Mutex::new(Tables {
                by_iova: BTreeMap::new(),
                by_host: BTreeMap::new(),
                next_iova: IOVA_BASE,
                next_id: 1,
                maps_total: 0,
                tlb: vec![(0, 0); sets * WAYS],
                sets,
                clock: 0,
                counts: BTreeMap::new(),
            }),
            entries,
            page_max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps `len` bytes of host memory at `host` with pages of `page` bytes (at
    /// most `page_max`); returns the IOVA of `host`.
    pub(crate) fn map(&self, host: *const u8, len: usize, page: usize) -> u64 {
        let page = page.min(self.page_max).max(4096);
        let host = host as usize;
        let mut t = self.lock();
        // The IOVA keeps the host address's offset within its page.
        let start = host - host % page;
        let span = (host + len).next_multiple_of(page) - start;
        let iova = t.next_iova.next_multiple_of(page as u64);
        t.next_iova = iova + span as u64;
        let id = t.next_id;
        t.next_id += 1;
        t.maps_total += 1;
        t.by_iova.insert(
            iova,
            Mapping {
                host: start,
                len: span,
                page,
                id,
            },
        );
        t.by_host.insert(host, (iova, len));
        iova + (host - start) as u64
    }

    /// Removes the mapping made for `host` (and its TLB entries); whether there
    /// was one.
    pub(crate) fn unmap(&self, host: *const u8) -> bool {
        let mut t = self.lock();
        let Some((iova, _)) = t.by_host.remove(&(host as usize)) else {
            return false;
        };
        let Some(m) = t.by_iova.remove(&iova) else {
            return false;
        };
        for e in t.tlb.iter_mut() {
            if e.0 >> 40 == m.id {
                *e = (0, 0);
            }
        }
        true
    }

    /// The IOVA host address `p` is mapped at, if it is.
    pub(crate) fn iova_of(&self, p: *const u8) -> Option<u64> {
        let t = self.lock();
        let (&host, &(iova, len)) = t.by_host.range(..=p as usize).next_back()?;
        let m = t.by_iova.get(&iova)?;
        ((p as usize) < host + len.max(1)).then(|| iova + (p as usize - m.host) as u64)
    }

    /// Translates `len` bytes at `iova` for the copy engine `engine` ((direction,
    /// index)): its TLB hits and misses and the host address, or, when some
    /// byte is unmapped, the fault.
    pub(crate) fn translate(
        &self,
        engine: (u8, u32),
        iova: u64,
        len: usize,
    ) -> Result<(IotlbCounts, usize), String> {
        let mut t = self.lock();
        let t = &mut *t;
        let found = t.by_iova.range(..=iova).next_back().map(|(&a, &m)| (a, m));
        let Some((base, m)) = found.filter(|(base, m)| iova - base + len as u64 <= m.len as u64)
        else {
            return Err(format!(
                "DMA fault: {len} bytes at I/O virtual address {iova:#x} are not mapped in the \
                 device's IOMMU (the host range was never registered, or was unregistered); \
                 use pinned buffers or Device::register_host"
            ));
        };
        let first = (iova - base) / m.page as u64;
        let last = (iova - base + len as u64 - 1) / m.page as u64;
        let mut counts = IotlbCounts::default();
        for page in first..=last {
            let tag = (m.id << 40) | (page & ((1 << 40) - 1));
            t.clock += 1;
            let set = (tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % t.sets;
            let ways = &mut t.tlb[set * WAYS..(set + 1) * WAYS];
            if let Some(e) = ways.iter_mut().find(|e| e.0 == tag) {
                e.1 = t.clock;
                counts.hits += 1;
            } else {
                let victim = ways.iter_mut().min_by_key(|e| e.1).expect("a set has ways");
                *victim = (tag, t.clock);
                counts.misses += 1;
            }
        }
        let c = t.counts.entry(engine).or_default();
        c.hits += counts.hits;
        c.misses += counts.misses;
        Ok((counts, m.host + (iova - base) as usize))
    }

    pub(crate) fn stats(&self) -> IommuStats {
        let t = self.lock();
        let mut by_page: BTreeMap<usize, usize> = BTreeMap::new();
        for m in t.by_iova.values() {
            *by_page.entry(m.page).or_default() += 1;
        }
        IommuStats {
            mappings: t.by_iova.len(),
            mapped_bytes: t.by_iova.values().map(|m| m.len).sum(),
            maps_total: t.maps_total,
            by_page: by_page.into_iter().collect(),
            per_engine: t
                .counts
                .iter()
                .map(|(&(dir, i), &c)| {
                    let name = match dir {
                        0 => "h2d",
                        1 => "d2h",
                        _ => "d2d",
                    };
                    (name, i, c)
                })
                .collect(),
            tlb_entries: self.entries,
        }
    }
}

/// The pinned pool's chunk source on the emulated device: chunks come from the
/// OS (pinned) and are mapped into the IOMMU once, when they are made.
#[derive(Debug)]
pub(crate) struct IommuChunks {
    pub(crate) os: Arc<dyn ChunkSource>,
    pub(crate) iommu: Arc<Iommu>,
}

impl ChunkSource for IommuChunks {
    fn map(&self, size: usize) -> Result<Chunk, MemoryError> {
        let c = self.os.map(size)?;
        self.iommu.map(c.ptr.as_ptr(), c.size, page_of(c.page));
        Ok(c)
    }

    fn unmap(&self, chunk: Chunk) {
        self.iommu.unmap(chunk.ptr.as_ptr());
        self.os.unmap(chunk);
    }

    fn os_calls(&self) -> OsCalls {
        self.os.os_calls()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translations_hit_after_a_miss_and_unmapped_addresses_fault() {
        let io = Iommu::new(64, 1 << 30);
        let buf = vec![0u8; 64 << 10];
        let iova = io.map(buf.as_ptr(), buf.len(), 4096);
        assert_eq!(io.iova_of(buf.as_ptr()), Some(iova));
        let (c, host) = io.translate((0, 0), iova, buf.len()).expect("mapped");
        assert!(c.misses >= 16, "{c:?}");
        assert_eq!(host, buf.as_ptr() as usize);
        let again = io.translate((0, 0), iova, buf.len()).map(|t| t.0.misses);
        assert_eq!(again, Ok(0), "now cached");
        assert!(io.translate((0, 0), iova + (1 << 20), 8).is_err());
        assert!(io.unmap(buf.as_ptr()));
        assert!(io.translate((0, 0), iova, 8).is_err(), "unmapped");
        assert_eq!(io.iova_of(buf.as_ptr()), None);
    }

    #[test]
    fn registrations_sharing_a_page_are_mapped_and_unmapped_apart() {
        let io = Iommu::new(64, 1 << 30);
        let buf = vec![0u8; 256];
        let (a, b) = (buf.as_ptr(), buf[100..].as_ptr());
        let ia = io.map(a, 100, 4096);
        let ib = io.map(b, 156, 4096);
        assert_eq!(io.iova_of(a), Some(ia));
        assert_eq!(io.iova_of(b), Some(ib));
        assert!(io.unmap(a));
        assert_eq!(io.iova_of(a), None, "the first is gone");
        assert_eq!(io.iova_of(b), Some(ib), "the second stays");
        assert!(io.translate((0, 0), ib, 156).is_ok());
        assert!(io.translate((0, 0), ia, 1).is_err());
        assert!(!io.unmap(a), "unmapped once");
    }

    #[test]
    fn large_pages_need_fewer_walks() {
        let (small, large) = (Iommu::new(64, 1 << 30), Iommu::new(64, 1 << 30));
        let len = 8 << 20;
        let a = small.map(IOVA_BASE as *const u8, len, 4096);
        let b = large.map(IOVA_BASE as *const u8, len, 2 << 20);
        let ms = small.translate((0, 0), a, len).expect("mapped").0.misses;
        let ml = large.translate((0, 0), b, len).expect("mapped").0.misses;
        assert_eq!((ms, ml), (2048, 4));
    }
}
