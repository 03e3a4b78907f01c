//! Small-transfer batching, as the user sees it: [`CopyBatch`] (many copies of one
//! direction submitted as one op: one ring slot, one descriptor chain on a link)
//! and [`Coalescing`] (a stream option that lets the device merge consecutive
//! small copies it finds queued).
//!
//! Invariants: a batch's segments take effect in the order they were added, so a
//! batch equals the same copies one by one; a batch reads or writes each buffer,
//! never both. Coalescing never reorders anything: it merges only copies that are
//! next to each other in the stream, and every other op (events, waits, kernels)
//! ends a run of them.

use crate::api::buffer::{DeviceBuffer, PinnedBuffer};
use crate::api::stream::check_range;
use crate::config::Coalescing;
use crate::exec::op::{Body, CopyKind};
use crate::exec::storage::Storage;
use crate::exec::transfer::BatchOp;
use crate::MemoryKind;
use crate::{Error, Result, Stream};
use bytemuck::Pod;
use std::sync::Arc;

/// Many copies of one direction, submitted together with [`Stream::copy_batch`]:
/// one op on the stream, and on a device behind a link one descriptor chain
/// (one setup latency, then the bytes). Like `cudaMemcpyBatchAsync`.
///
/// ```
/// use hetero::{CopyBatch, CopyKind, Device};
/// let dev = Device::host().unwrap();
/// let s = dev.create_stream().unwrap();
/// let src = dev.pinned_from_slice(&[1u8, 2, 3, 4]).unwrap();
/// let dst = dev.alloc::<u8>(4).unwrap();
/// let mut batch = CopyBatch::new(CopyKind::H2D);
/// batch.h2d(&src, 0, &dst, 2, 2).unwrap(); // src[0..2] -> dst[2..4]
/// batch.h2d(&src, 2, &dst, 0, 2).unwrap(); // src[2..4] -> dst[0..2]
/// s.copy_batch(batch).unwrap();
/// assert_eq!(s.read_to_vec(&dst).unwrap(), vec![3, 4, 1, 2]);
/// ```
pub struct CopyBatch {
    op: BatchOp,
}

impl std::fmt::Debug for CopyBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyBatch")
            .field("kind", &self.op.kind)
            .field("copies", &self.op.segs.len())
            .field("bytes", &self.op.bytes)
            .finish()
    }
}

impl CopyBatch {
    /// An empty batch of copies in direction `kind`.
    pub fn new(kind: CopyKind) -> Self {
        Self::with_capacity(kind, 0)
    }

    /// An empty batch with room for `copies` copies.
    pub fn with_capacity(kind: CopyKind, copies: usize) -> Self {
        CopyBatch {
            op: BatchOp::new(kind, copies),
        }
    }

    /// The direction of every copy in the batch.
    pub fn kind(&self) -> CopyKind {
        self.op.kind
    }

    /// The number of copies added.
    pub fn len(&self) -> usize {
        self.op.segs.len()
    }

    /// Whether no copy was added.
    pub fn is_empty(&self) -> bool {
        self.op.segs.is_empty()
    }

    /// The bytes all copies move together.
    pub fn bytes(&self) -> u64 {
        self.op.bytes
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn add<T: Pod>(
        &mut self,
        op: &'static str,
        kind: CopyKind,
        src: &Arc<Storage>,
        (src_len, src_offset): (usize, usize),
        dst: &Arc<Storage>,
        (dst_len, dst_offset): (usize, usize),
        count: usize,
    ) -> Result<&mut Self> {
        if kind != self.op.kind {
            return Err(Error::InvalidArgument(format!(
                "{op}: this batch holds {:?} copies, not {kind:?}; a batch has one direction, \
                 so put these copies into a CopyBatch::new(CopyKind::{kind:?})",
                self.op.kind
            )));
        }
        check_range(op, src_len, src_offset, count)?;
        check_range(op, dst_len, dst_offset, count)?;
        if count == 0 {
            return Ok(self);
        }
        let size = std::mem::size_of::<T>();
        if Arc::ptr_eq(src, dst)
            || !self
                .op
                .push(src, src_offset * size, dst, dst_offset * size, count * size)
        {
            return Err(Error::Aliasing { op });
        }
        Ok(self)
    }

    /// Adds a copy of `count` elements from pinned `src[src_offset..]` to
    /// `dst[dst_offset..]` (an H2D batch).
    pub fn h2d<T: Pod>(
        &mut self,
        src: &PinnedBuffer<T>,
        src_offset: usize,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<&mut Self> {
        self.add::<T>(
            "CopyBatch::h2d",
            CopyKind::H2D,
            &src.storage,
            (src.len(), src_offset),
            &dst.storage,
            (dst.len(), dst_offset),
            count,
        )
    }

    /// Adds a copy of `count` elements from `src[src_offset..]` to pinned
    /// `dst[dst_offset..]` (a D2H batch). Host reads of `dst` wait until the batch
    /// completed (or is dropped unsubmitted).
    pub fn d2h<T: Pod>(
        &mut self,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        dst: &mut PinnedBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<&mut Self> {
        let len = dst.len();
        self.add::<T>(
            "CopyBatch::d2h",
            CopyKind::D2H,
            &src.storage,
            (src.len(), src_offset),
            &dst.storage,
            (len, dst_offset),
            count,
        )
    }

    /// Adds a copy of `count` elements from `src[src_offset..]` to
    /// `dst[dst_offset..]` between device buffers (a D2D batch).
    pub fn d2d<T: Pod>(
        &mut self,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<&mut Self> {
        self.add::<T>(
            "CopyBatch::d2d",
            CopyKind::D2D,
            &src.storage,
            (src.len(), src_offset),
            &dst.storage,
            (dst.len(), dst_offset),
            count,
        )
    }
}

impl Stream {
    /// The payload of a tiny H2D copy, read now to go inside the command (as
    /// CPU stores into mapped device memory carry tiny payloads), when that gives
    /// the same result as reading it when the copy runs: `src` is pinned and no
    /// queued op writes it (host writes need `&mut`, which the caller's borrow
    /// excludes). `None` while recording (a replay must read it again) or when
    /// a queued op still writes it.
    pub(crate) fn inline_payload(
        &self,
        src: &Storage,
        off: usize,
        bytes: usize,
    ) -> Option<Box<[u8]>> {
        if self.is_capturing()
            || src.kind != MemoryKind::Pinned
            || src.has_pending_writes()
            || !src.host_visible()
        {
            return None;
        }
        // SAFETY: the range was bounds-checked by the caller; the memory is
        // host-visible pinned memory that no queued op writes and no host code
        // writes while the caller borrows the buffer.
        let bytes = unsafe { std::slice::from_raw_parts(src.host_ptr().add(off), bytes) };
        Some(bytes.into())
    }

    /// Submits `batch` as one op: its copies take effect in the order they were
    /// added, after the stream's earlier work and before its later work. An empty
    /// batch submits nothing. While the stream records a capture, each copy is
    /// recorded as a copy node.
    pub fn copy_batch(&self, batch: CopyBatch) -> Result<()> {
        let op = "copy_batch";
        let b = batch.op;
        if b.segs.is_empty() {
            return Ok(());
        }
        for (s, _) in &b.storages {
            self.check_storage(op, s)?;
        }
        if self.is_capturing() {
            for g in &b.segs {
                self.submit(Body::Copy {
                    kind: b.kind,
                    src: b.storages[g.src as usize].0.clone(),
                    src_off: g.src_off,
                    dst: b.storages[g.dst as usize].0.clone(),
                    dst_off: g.dst_off,
                    bytes: g.len,
                    _pending: None,
                    after: None,
                })?;
            }
            return Ok(());
        }
        for (s, _) in &b.storages {
            self.order_use(s)?;
        }
        self.submit(Body::CopyBatch(Box::new(b)))?;
        Ok(())
    }

    /// Lets the device merge consecutive small copies queued on this stream
    /// (`Some`), or stops it (`None`, the default).
    ///
    /// Semantics: a merged run is copies that are adjacent in the stream, of one
    /// direction, each of at most `max_bytes`; they still take effect in order and
    /// each completes (its point on the stream's timeline) when the run does, so
    /// results never change and nothing is reordered against other ops. Nothing
    /// is held back on the host: the device merges only what is already queued
    /// when it starts the first copy, so an event record, a wait, any non-copy op
    /// or a `synchronize` simply ends the run. On the emulated device a run pays
    /// one setup latency; the host backend copies with the CPU, has no setup to
    /// save, and runs each copy as it is.
    pub fn set_coalescing(&self, coalescing: Option<Coalescing>) -> Result<()> {
        if let Some(c) = coalescing {
            if c.window == 0 || c.max_bytes == 0 {
                return Err(Error::InvalidArgument(format!(
                    "set_coalescing: window {} and max_bytes {} must both be at least 1; \
                     pass None to turn coalescing off",
                    c.window, c.max_bytes
                )));
            }
        }
        self.backend_stream().set_coalescing(coalescing);
        Ok(())
    }
}
