//! Expandable segments (`expandable_segments:true`): one reserved virtual
//! range per size class ([`Kind`]), handed whole to the kind's TLSF, with
//! physical memory mapped under it 2 MiB granule by granule as blocks are
//! handed out, and unmapped as soon as no block handed out covers a granule.
//!
//! Physical memory comes in granule *slots*: each a private handle of one
//! granule (anonymous memory, a transparent huge page where the machine
//! gives anonymous memory those, moved into place with one `mremap`; the
//! pool never exports its memory, so nothing needs a memfd), or, where the
//! kernel refuses private handles (the first segment tries one), granules of
//! one sealed memfd per pool. A
//! granule no block covers any more stays mapped (*idle*), so a block placed
//! there again costs no system call, up to a budget (1/64 of the mapped
//! bytes, at least 8 MiB); past it the oldest idle granules are unmapped and
//! their slots kept (*cached*). Growing takes a cached slot (one `mmap` of
//! pages that exist), else moves an idle granule's slot (unmap there, map
//! here), and only then a new (*cold*) slot: physical memory held grows only
//! when the buffers handed out need more. Past the release threshold (and on
//! `trim`), cached and idle slots give their pages back to the system
//! (`release`: `MADV_DONTNEED` on a private handle where it is held, which
//! keeps the handle for the slot's next use; `fallocate(PUNCH_HOLE)` on a
//! memfd slot). Reserved bytes are mapped plus cached
//! slots; they never exceed `max_reserved`.
//!
//! Invariants: a granule is mapped iff a block handed out (live, cached in a
//! stream or thread cache, or pending) covers part of it (`refs > 0`) or it is
//! idle; a slot is in exactly one of {mapped under one granule, cached, cold};
//! with a memfd, runs of granules with consecutive slots are mapped with one
//! call; a private slot's handle, once made, lives as long as the pool.

use super::chunks::Kind;
use crate::config::PoolConfig;
use crate::error::MemoryError;
use crate::os::PageKind;
use crate::tlsf::Tlsf;
use crate::vmm::{Access, Granularity, MemoryContext, PhysicalMemory, VirtualRange};
use std::collections::VecDeque;

/// The physical granule of a segment.
pub(super) const GRANULE: usize = 2 << 20;
const NONE: u32 = u32::MAX;
/// Address space per kind when `max_reserved` does not bound it.
const MAX_SEGMENT: usize = 64 << 30;

/// Where the physical memory under a block placed in a segment may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backing {
    /// Granules mapped already (under other blocks, or idle under the block):
    /// no system call, no granule taken from elsewhere.
    Mapped,
    /// Also cached slots and idle granules elsewhere (moved here): reserved
    /// bytes stay as they are.
    Spare,
    /// Also cold slots: reserved bytes grow.
    Cold,
}

pub(super) struct Segment {
    pub(super) range: VirtualRange,
    /// The segment's TLSF region.
    pub(super) head: u32,
    /// Blocks handed out that cover each granule.
    refs: Vec<u32>,
    /// The slot mapped under each granule, or NONE.
    slot: Vec<u32>,
    /// Whether each granule is idle (mapped, no block over it).
    idle: Vec<bool>,
}

/// The segments of a pool and their physical slots.
/// What the slots are.
enum Store {
    /// One private handle per slot, made the first time the slot is used
    /// (a cold slot's handle holds no pages).
    Private(Vec<Option<PhysicalMemory>>),
    /// Granules of one memfd, where private handles were refused.
    Shared(PhysicalMemory),
}

pub(super) struct Segments {
    ctx: MemoryContext,
    store: Option<Store>,
    /// What backs the slots and why, once the store exists.
    backing: (PageKind, Vec<String>),
    seg_size: usize,
    pub(super) segs: [Option<Segment>; 3],
    cached: Vec<u32>,
    cold: Vec<u32>,
    /// Idle granules, oldest first, as (kind, granule); an entry whose
    /// granule is no longer idle is skipped.
    idle: VecDeque<(u8, u32)>,
    idle_count: usize,
    next: u32,
    pub(super) mapped: usize,
    prefault: bool,
    /// Granules mapped from cached slots / from cold ones; granules unmapped;
    /// slots punched.
    pub(super) cached_maps: u64,
    pub(super) cold_maps: u64,
    pub(super) unmaps: u64,
    pub(super) releases: u64,
    /// Makes `make_store` find private memory refused, to test the fallback.
    #[cfg(test)]
    refuse_private: bool,
}

impl Segments {
    pub(super) fn new(config: &PoolConfig) -> Self {
        let bound = config.max_reserved.saturating_mul(2).max(64 << 20);
        Segments {
            ctx: MemoryContext::unlimited("device pool"),
            store: None,
            backing: (PageKind::Normal, Vec::new()),
            seg_size: bound.min(MAX_SEGMENT).next_multiple_of(GRANULE),
            segs: [None, None, None],
            cached: Vec::new(),
            cold: Vec::new(),
            idle: VecDeque::new(),
            idle_count: 0,
            next: 0,
            mapped: 0,
            prefault: config.prefault,
            cached_maps: 0,
            cold_maps: 0,
            unmaps: 0,
            releases: 0,
            #[cfg(test)]
            refuse_private: false,
        }
    }

    /// Mapped bytes plus cached slots: the physical memory the pool holds.
    pub(super) fn reserved(&self) -> usize {
        self.mapped + self.cached.len() * GRANULE
    }

    pub(super) fn cached_bytes(&self) -> usize {
        self.cached.len() * GRANULE
    }

    /// `mmap`/`mprotect` calls the segments' ranges made.
    pub(super) fn os_calls(&self) -> u64 {
        self.segs.iter().flatten().map(|s| s.range.os_calls()).sum()
    }

    /// Bytes mapped with no block over them.
    pub(super) fn idle_bytes(&self) -> usize {
        self.idle_count * GRANULE
    }

    fn idle_budget(&self) -> usize {
        (self.mapped / GRANULE / 64).max(4)
    }

    /// Unmaps the oldest idle granule and returns its slot.
    fn steal_idle(&mut self) -> Option<u32> {
        let mut one = Vec::with_capacity(1);
        self.steal_idle_run(1, &mut one);
        one.pop()
    }

    /// Unmaps the oldest idle granule and up to `max - 1` idle granules
    /// after it in the same segment, in one call; pushes their slots to
    /// `out`, in address order.
    fn steal_idle_run(&mut self, max: usize, out: &mut Vec<u32>) {
        while let Some((k, g)) = self.idle.pop_front() {
            let seg = self.segs[k as usize]
                .as_mut()
                .expect("idle granules are in segments");
            let g = g as usize;
            if !seg.idle[g] {
                continue;
            }
            let mut n = 1;
            while n < max && g + n < seg.idle.len() && seg.idle[g + n] {
                n += 1;
            }
            if let Err(e) = seg.range.unmap(g * GRANULE, n * GRANULE) {
                tracing::error!(error = %e, "unmapping idle granules failed; they stay mapped");
                continue;
            }
            for x in g..g + n {
                seg.idle[x] = false;
                out.push(seg.slot[x]);
                seg.slot[x] = NONE;
            }
            // Their later entries in `idle` are skipped as no longer idle.
            self.idle_count -= n;
            self.unmaps += n as u64;
            self.mapped -= n * GRANULE;
            return;
        }
    }

    /// What backs the slots, and why (empty before the first segment).
    pub(super) fn backing(&self) -> (PageKind, &[String]) {
        (self.backing.0, &self.backing.1)
    }

    /// Picks the store with the first segment's range: private handles if
    /// one maps and unmaps there, else one memfd (the notes say why).
    fn make_store(&mut self, range: &mut VirtualRange) -> Result<(), MemoryError> {
        let probe = self
            .ctx
            .create_private(GRANULE, Granularity::Huge2M)
            .and_then(|h| {
                range.map(0, &h, 0, GRANULE, Access::ReadWrite)?;
                range.unmap(0, GRANULE)?;
                Ok(h)
            });
        #[cfg(test)]
        let probe = if self.refuse_private {
            Err(MemoryError::InvalidRequest {
                what: "private memory (refused by the test)".into(),
                hint: "none",
            })
        } else {
            probe
        };
        let (store, page, mut notes) = match probe {
            Ok(h) => {
                let (page, notes) = (h.page_kind(), h.notes().to_vec());
                (Store::Private(vec![Some(h)]), page, notes)
            }
            Err(e) => {
                let store = self
                    .ctx
                    .create_physical(3 * self.seg_size, Granularity::Page4K)?;
                let mut notes = vec![format!(
                    "granules are slots of one memfd: private memory was refused ({e})"
                )];
                notes.extend(store.notes().iter().cloned());
                (Store::Shared(store.clone()), store.page_kind(), notes)
            }
        };
        if let Store::Private(_) = store {
            notes.insert(
                0,
                "granules are private handles (anonymous memory moved in with mremap)".into(),
            );
        }
        self.store = Some(store);
        self.backing = (page, notes);
        Ok(())
    }

    /// Creates the segment of `kind` (and the slot store) if it is missing.
    pub(super) fn ensure(&mut self, kind: Kind, tlsf: &mut Tlsf) -> Result<(), MemoryError> {
        if self.segs[kind as usize].is_some() {
            return Ok(());
        }
        let mut range = self.ctx.reserve(self.seg_size, Granularity::Huge2M)?;
        if self.store.is_none() {
            self.make_store(&mut range)?;
        }
        let head = tlsf.add_region(range.ptr() as u64, self.seg_size as u64);
        let granules = self.seg_size / GRANULE;
        self.segs[kind as usize] = Some(Segment {
            range,
            head,
            refs: vec![0; granules],
            slot: vec![NONE; granules],
            idle: vec![false; granules],
        });
        Ok(())
    }

    fn span(seg: &Segment, addr: usize, len: usize) -> (usize, usize) {
        let off = addr - seg.range.ptr() as usize;
        (off / GRANULE, (off + len).div_ceil(GRANULE))
    }

    /// Where in the free block `[start, end)` of `kind`'s segment to place
    /// `len` bytes aligned to `align`, and the bytes of granules not mapped
    /// yet that placement covers: at the block's low end or its high end,
    /// whichever covers fewer (the low end on a tie), so that a block is
    /// placed against the granules its neighbours keep mapped.
    pub(super) fn place(
        &self,
        kind: Kind,
        start: u64,
        end: u64,
        len: u64,
        align: u64,
    ) -> (u64, u64) {
        let low = start.next_multiple_of(align);
        let Some(seg) = self.segs[kind as usize].as_ref() else {
            return (0, low);
        };
        let unmapped = |addr: u64| -> u64 {
            let (lo, hi) = Self::span(seg, addr as usize, len as usize);
            (lo..hi.min(seg.slot.len()))
                .filter(|&g| seg.slot[g] == NONE)
                .count() as u64
                * GRANULE as u64
        };
        let high = (end - len) / align * align;
        let (cl, ch) = (unmapped(low), unmapped(high.max(low)));
        if ch < cl {
            (ch, high)
        } else {
            (cl, low)
        }
    }

    /// Backs `[addr, addr + len)` of `kind`'s segment: maps the granules no
    /// block covers yet, from the sources `allow` names (cold slots only
    /// while reserved stays within `limit`). `Ok(false)` (nothing changed)
    /// when that is not enough.
    pub(super) fn back(
        &mut self,
        kind: Kind,
        addr: usize,
        len: usize,
        allow: Backing,
        limit: usize,
    ) -> Result<bool, MemoryError> {
        let Some(seg) = self.segs[kind as usize].as_ref() else {
            return Ok(false);
        };
        let (lo, hi) = Self::span(seg, addr, len);
        let need = (lo..hi).filter(|&g| seg.slot[g] == NONE).count();
        if need > 0 && allow == Backing::Mapped {
            return Ok(false);
        }
        let may_grow = allow == Backing::Cold;
        let idle_inside = (lo..hi).filter(|&g| seg.idle[g]).count();
        let spare = self.cached.len() + self.idle_count - idle_inside;
        let cold = need.saturating_sub(spare);
        // Slots past the store's end would fault when touched: never hand
        // them out (reserved stays below the store's size, so this is a guard).
        let store_slots = match &self.store {
            Some(Store::Shared(p)) => p.size() / GRANULE,
            Some(Store::Private(_)) => usize::MAX,
            None => 0,
        };
        let fresh_slots = cold.saturating_sub(self.cold.len());
        if cold > 0
            && (!may_grow
                || self.reserved() + cold * GRANULE > limit
                || self.next as usize + fresh_slots > store_slots)
        {
            return Ok(false);
        }
        // Idle granules under the block serve as they are.
        let seg = self.segs[kind as usize].as_mut().expect("checked above");
        for g in lo..hi {
            if seg.idle[g] {
                seg.idle[g] = false;
                self.idle_count -= 1;
            }
        }
        // Slots for the rest: cached, then moved from idle granules, then cold.
        let mut supply: Vec<(u32, bool)> = Vec::with_capacity(need);
        while supply.len() < need {
            if let Some(s) = self.cached.pop() {
                self.cached_maps += 1;
                supply.push((s, false));
                continue;
            }
            // A run of idle granules moves here with one unmap call.
            let mut moved = Vec::new();
            if self.idle_count > 0 {
                self.steal_idle_run(need - supply.len(), &mut moved);
            }
            if !moved.is_empty() {
                self.cached_maps += moved.len() as u64;
                supply.extend(moved.into_iter().map(|s| (s, false)));
            } else {
                self.cold_maps += 1;
                let s = self.cold.pop().unwrap_or_else(|| {
                    self.next += 1;
                    self.next - 1
                });
                supply.push((s, true));
            }
        }
        // Consecutive slots for neighbouring granules map in one call.
        supply.sort_unstable_by_key(|&(s, _)| std::cmp::Reverse(s));
        let seg = self.segs[kind as usize].as_mut().expect("checked above");
        let mut fresh: Vec<usize> = Vec::with_capacity(need);
        let mut origin: Vec<bool> = Vec::with_capacity(need);
        for g in lo..hi {
            if seg.slot[g] == NONE {
                let (s, cold) = supply.pop().expect("one slot per granule");
                seg.slot[g] = s;
                fresh.push(g);
                origin.push(cold);
            }
        }
        let store = self.store.as_mut().expect("created with the segment");
        let mut done: Vec<(usize, usize)> = Vec::new();
        let mut failed = None;
        let mut i = 0;
        while i < fresh.len() {
            let start = fresh[i];
            let slot = seg.slot[start] as usize;
            let r = match store {
                Store::Shared(p) => {
                    let mut n = 1;
                    while i + n < fresh.len()
                        && fresh[i + n] == start + n
                        && seg.slot[start + n] as usize == slot + n
                    {
                        n += 1;
                    }
                    seg.range
                        .map(
                            start * GRANULE,
                            p,
                            slot * GRANULE,
                            n * GRANULE,
                            Access::ReadWrite,
                        )
                        .map(|()| n)
                }
                Store::Private(handles) => {
                    if handles.len() <= slot {
                        handles.resize(slot + 1, None);
                    }
                    let h = match &handles[slot] {
                        Some(h) => Ok(h.clone()),
                        None => self.ctx.create_private(GRANULE, Granularity::Huge2M),
                    };
                    h.and_then(|h| {
                        seg.range
                            .map(start * GRANULE, &h, 0, GRANULE, Access::ReadWrite)?;
                        handles[slot] = Some(h);
                        Ok(1)
                    })
                }
            };
            match r {
                Ok(n) => {
                    done.push((start, n));
                    i += n;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            for (start, n) in done {
                let _ = seg.range.unmap(start * GRANULE, n * GRANULE);
            }
            for (g, cold) in fresh.into_iter().zip(origin) {
                if cold {
                    self.cold.push(seg.slot[g]);
                } else {
                    self.cached.push(seg.slot[g]);
                }
                seg.slot[g] = NONE;
            }
            // Idle granules under the block went back to use above: put them
            // back as idle.
            for g in lo..hi {
                if seg.slot[g] != NONE && seg.refs[g] == 0 {
                    seg.idle[g] = true;
                    self.idle_count += 1;
                    self.idle.push_back((kind as u8, g as u32));
                }
            }
            return Err(e);
        }
        for (start, n) in &done {
            self.mapped += n * GRANULE;
            if self.prefault {
                if let Err(e) = seg.range.populate(start * GRANULE, n * GRANULE) {
                    tracing::warn!(error = %e, "pre-faulting granules failed; they fault on first touch");
                }
            }
        }
        for r in &mut seg.refs[lo..hi] {
            *r += 1;
        }
        Ok(true)
    }

    /// A block of `[addr, addr + len)` went back to the TLSF: granules no
    /// block covers any more become idle; idle granules past the budget are
    /// unmapped and their slots cached.
    pub(super) fn unback(&mut self, kind: usize, addr: usize, len: usize) {
        let Some(seg) = self.segs[kind].as_mut() else {
            return;
        };
        let (lo, hi) = Self::span(seg, addr, len);
        for g in lo..hi {
            seg.refs[g] -= 1;
            if seg.refs[g] == 0 {
                seg.idle[g] = true;
                self.idle_count += 1;
                self.idle.push_back((kind as u8, g as u32));
            }
        }
        while self.idle_count > self.idle_budget() {
            let over = self.idle_count - self.idle_budget();
            let before = self.cached.len();
            let mut cached = std::mem::take(&mut self.cached);
            self.steal_idle_run(over, &mut cached);
            self.cached = cached;
            if self.cached.len() == before {
                break;
            }
        }
        if self.idle.len() > 4 * self.idle_count + 64 {
            let segs = &self.segs;
            self.idle.retain(|&(k, g)| {
                segs[k as usize]
                    .as_ref()
                    .is_some_and(|s| s.idle[g as usize])
            });
        }
    }

    /// Punches cached slots, then idle granules, until reserved is at most
    /// `target`; the bytes returned to the system.
    pub(super) fn release(&mut self, target: usize) -> usize {
        if self.store.is_none() {
            return 0;
        }
        let mut released = 0;
        while self.reserved() > target {
            let Some(s) = self.cached.pop().or_else(|| self.steal_idle()) else {
                break;
            };
            let r = match self.store.as_mut().expect("checked above") {
                Store::Shared(p) => p.release(s as usize * GRANULE, GRANULE),
                // The handle stays, without pages (MADV_DONTNEED where it is
                // held): a slot taken cold again costs no new handle.
                Store::Private(handles) => match &handles[s as usize] {
                    Some(h) => h.release(0, GRANULE),
                    None => Ok(()),
                },
            };
            match r {
                Ok(()) => {
                    released += GRANULE;
                    self.releases += 1;
                    self.cold.push(s);
                }
                Err(e) => {
                    tracing::error!(error = %e, "releasing a cached granule failed");
                    self.cached.push(s);
                    break;
                }
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backs, writes, frees and releases four granules of the large kind's
    /// segment; the notes on what backs them.
    fn cycle(refuse_private: bool) -> Vec<String> {
        let mut segs = Segments::new(&PoolConfig::default());
        segs.refuse_private = refuse_private;
        let mut tlsf = Tlsf::new();
        segs.ensure(Kind::Large, &mut tlsf).expect("segment");
        let base = segs.segs[Kind::Large as usize]
            .as_ref()
            .expect("made above")
            .range
            .ptr();
        let len = 4 * GRANULE;
        let backed = segs
            .back(Kind::Large, base as usize, len, Backing::Cold, usize::MAX)
            .expect("back");
        assert!(backed);
        assert_eq!((segs.mapped, segs.cold_maps), (len, 4));
        // SAFETY: the four granules were mapped read-write just now.
        unsafe {
            std::ptr::write_bytes(base, 0x3C, len);
            assert_eq!(base.add(len - 1).read_volatile(), 0x3C);
        }
        segs.unback(Kind::Large as usize, base as usize, len);
        assert_eq!(
            segs.reserved(),
            len,
            "idle and cached granules stay reserved"
        );
        assert_eq!(segs.release(0), len);
        assert_eq!((segs.reserved(), segs.releases), (0, 4));
        segs.backing().1.to_vec()
    }

    #[test]
    fn granules_are_private_handles_where_the_kernel_allows() {
        let notes = cycle(false);
        assert!(notes[0].contains("private handles"), "{notes:?}");
    }

    #[test]
    fn refused_private_memory_falls_back_to_a_memfd_and_says_why() {
        let notes = cycle(true);
        assert!(
            notes[0].contains("one memfd") && notes[0].contains("refused"),
            "{notes:?}"
        );
    }
}
