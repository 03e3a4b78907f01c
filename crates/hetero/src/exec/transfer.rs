//! The payloads of the data-movement ops beyond a single copy: a copy batch (many
//! `(src, dst, len)` segments as one op) and a 2-D copy (rows at a pitch), with
//! their data effects, shared by every backend. The emulated device models their
//! cost (`backend/emu/dma.rs`); the host backend runs these effects on a copy engine.
//!
//! Invariants: a batch names each storage once (`storages`), read or written, never
//! both, so the op's access locks are taken once per storage; segments and regions
//! were bounds-checked when they were added, and segments run in the order they
//! were added (a batch equals the same copies one by one).

use crate::exec::effects::copy_rows;
use crate::exec::op::{CopyKind, PendingWrite};
use crate::exec::storage::{Reach, Storage};
use std::sync::Arc;

/// One segment of a batch: `len` bytes from `storages[src] + src_off` to
/// `storages[dst] + dst_off`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub(crate) src: u32,
    pub(crate) dst: u32,
    pub(crate) src_off: usize,
    pub(crate) dst_off: usize,
    pub(crate) len: usize,
}

/// Many copies of one direction as one op (one ring slot, one descriptor chain).
pub(crate) struct BatchOp {
    pub(crate) kind: CopyKind,
    /// Each storage the batch touches once, with whether it writes it.
    pub(crate) storages: Vec<(Arc<Storage>, bool)>,
    pub(crate) segs: Vec<Segment>,
    pub(crate) bytes: u64,
    /// Pinned destinations: host reads wait for the batch.
    pub(crate) pending: Vec<PendingWrite>,
}

impl BatchOp {
    pub(crate) fn new(kind: CopyKind, capacity: usize) -> Self {
        BatchOp {
            kind,
            storages: Vec::new(),
            segs: Vec::with_capacity(capacity),
            bytes: 0,
            pending: Vec::new(),
        }
    }

    /// The index of `s` in `storages`, added if new; `None` when the batch
    /// already uses it the other way (read and written by one op).
    #[inline]
    fn index_of(&mut self, s: &Arc<Storage>, write: bool) -> Option<u32> {
        // The last storages added are the likeliest: batches usually scatter
        // between a few buffers.
        let found = self
            .storages
            .iter()
            .rposition(|(have, _)| Arc::ptr_eq(have, s));
        match found {
            Some(i) if self.storages[i].1 == write => Some(i as u32),
            Some(_) => None,
            None => {
                if write && s.kind == crate::MemoryKind::Pinned {
                    self.pending.push(PendingWrite::new(s));
                }
                self.storages.push((s.clone(), write));
                Some((self.storages.len() - 1) as u32)
            }
        }
    }

    /// Adds a segment (ranges already checked). `false` if `src` or `dst` is
    /// written and read by the batch.
    #[inline]
    pub(crate) fn push(
        &mut self,
        src: &Arc<Storage>,
        src_off: usize,
        dst: &Arc<Storage>,
        dst_off: usize,
        len: usize,
    ) -> bool {
        let (Some(s), Some(d)) = (self.index_of(src, false), self.index_of(dst, true)) else {
            return false;
        };
        self.segs.push(Segment {
            src: s,
            dst: d,
            src_off,
            dst_off,
            len,
        });
        self.bytes += len as u64;
        true
    }

    /// The batch's effect, segment by segment in order. The caller holds the
    /// access locks (read on sources, write on destinations) or, on a modelled
    /// device, the stream's order; `reach` is its backend's.
    pub(crate) fn run(&self, reach: Reach) {
        for g in &self.segs {
            let src = &self.storages[g.src as usize].0;
            let dst = &self.storages[g.dst as usize].0;
            // SAFETY: each segment was bounds-checked when added; source and
            // destination are different storages (a storage is read or written by
            // the batch, never both); the locks exclude every other access.
            unsafe {
                crate::exec::effects::copy_bytes(
                    src.engine_ptr(reach),
                    g.src_off,
                    dst.engine_ptr(reach),
                    g.dst_off,
                    g.len,
                )
            }
        }
    }

    /// The host-side ranges (storage, offset, length) the link's DMA reaches:
    /// sources of an H2D batch, destinations of a D2H one.
    pub(crate) fn host_ranges(&self) -> impl Iterator<Item = (&Storage, usize, usize)> + '_ {
        let h2d = self.kind == CopyKind::H2D;
        self.segs.iter().map(move |g| {
            if h2d {
                (&*self.storages[g.src as usize].0, g.src_off, g.len)
            } else {
                (&*self.storages[g.dst as usize].0, g.dst_off, g.len)
            }
        })
    }
}

/// A rectangle of bytes in a buffer: `height` rows of `width` bytes, `pitch`
/// bytes apart, the first at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ByteRegion {
    pub(crate) offset: usize,
    pub(crate) pitch: usize,
    pub(crate) width: usize,
    pub(crate) height: usize,
}

impl ByteRegion {
    /// Whether the rows are back to back (one contiguous range).
    pub(crate) fn contiguous(&self) -> bool {
        self.pitch == self.width || self.height <= 1
    }

    /// One past the last byte the region touches.
    #[cfg(test)]
    pub(crate) fn end(&self) -> usize {
        self.offset + (self.height - 1) * self.pitch + self.width
    }
}

/// A 2-D copy: one op, one strided descriptor.
pub(crate) struct Copy2DOp {
    pub(crate) kind: CopyKind,
    pub(crate) src: Arc<Storage>,
    pub(crate) src_r: ByteRegion,
    pub(crate) dst: Arc<Storage>,
    pub(crate) dst_r: ByteRegion,
    pub(crate) _pending: Option<PendingWrite>,
}

impl Copy2DOp {
    pub(crate) fn bytes(&self) -> u64 {
        (self.src_r.width * self.src_r.height) as u64
    }

    /// The copy's effect. The caller holds the access locks (or the stream's
    /// order on a modelled device); `reach` is its backend's.
    pub(crate) fn run(&self, reach: Reach) {
        // SAFETY: both regions were bounds-checked at enqueue (`end() <= bytes`),
        // their widths and heights are equal, src and dst are different storages,
        // and the locks exclude every other access to dst and writer of src.
        unsafe {
            copy_rows(
                self.src.engine_ptr(reach),
                self.src_r,
                self.dst.engine_ptr(reach),
                self.dst_r,
            )
        }
    }
}
