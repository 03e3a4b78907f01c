//! Copies and fills between pinned and device buffers, in stream order.

use super::{check_range, Stream};
use crate::api::buffer::{DeviceBuffer, PinnedBuffer};
use crate::exec::op::{Body, CopyKind, PendingWrite};
use crate::exec::storage::Storage;
use crate::{Error, MemoryKind, Result};
use bytemuck::Pod;
use std::sync::Arc;

impl Stream {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy_op<T: Pod>(
        &self,
        op: &'static str,
        kind: CopyKind,
        src: &Arc<Storage>,
        src_len: usize,
        src_offset: usize,
        dst: &Arc<Storage>,
        dst_len: usize,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        self.check_storage(op, src)?;
        self.check_storage(op, dst)?;
        check_range(op, src_len, src_offset, count)?;
        check_range(op, dst_len, dst_offset, count)?;
        if Arc::ptr_eq(src, dst) {
            return Err(Error::Aliasing { op });
        }
        let size = std::mem::size_of::<T>();
        let bytes = count * size;
        if kind == CopyKind::H2D && bytes > 0 && bytes <= self.inner.inline_max {
            if let Some(data) = self.inline_payload(src, src_offset * size, bytes) {
                self.order_use(dst)?;
                self.submit(Body::HostWrite {
                    dst: dst.clone(),
                    off: dst_offset * size,
                    data,
                    inline: true,
                })?;
                return Ok(());
            }
        }
        self.order_use(src)?;
        self.order_use(dst)?;
        let host_dst = (dst.kind == MemoryKind::Pinned).then(|| PendingWrite::new(dst));
        self.submit(Body::Copy {
            kind,
            src: src.clone(),
            src_off: src_offset * size,
            dst: dst.clone(),
            dst_off: dst_offset * size,
            bytes: count * size,
            _pending: host_dst,
            after: None,
        })?;
        Ok(())
    }

    pub(super) fn same_len(op: &'static str, a: usize, b: usize) -> Result<()> {
        if a != b {
            return Err(Error::SizeMismatch {
                op,
                detail: format!(
                    "source has {a} elements, destination {b}; use the _range variant to copy part of a buffer"
                ),
            });
        }
        Ok(())
    }

    /// Copies all of pinned `src` into device buffer `dst` (same length).
    pub fn copy_h2d<T: Pod>(&self, src: &PinnedBuffer<T>, dst: &DeviceBuffer<T>) -> Result<()> {
        Self::same_len("copy_h2d", src.len(), dst.len())?;
        self.copy_h2d_range(src, 0, dst, 0, src.len())
    }

    /// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`.
    pub fn copy_h2d_range<T: Pod>(
        &self,
        src: &PinnedBuffer<T>,
        src_offset: usize,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        let op = "copy_h2d";
        self.copy_op::<T>(
            op,
            CopyKind::H2D,
            &src.storage,
            src.len(),
            src_offset,
            &dst.storage,
            dst.len(),
            dst_offset,
            count,
        )
    }

    /// Copies all of device buffer `src` into pinned `dst` (same length).
    pub fn copy_d2h<T: Pod>(&self, src: &DeviceBuffer<T>, dst: &mut PinnedBuffer<T>) -> Result<()> {
        Self::same_len("copy_d2h", src.len(), dst.len())?;
        let n = src.len();
        self.copy_d2h_range(src, 0, dst, 0, n)
    }

    /// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`.
    pub fn copy_d2h_range<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        dst: &mut PinnedBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        self.copy_op::<T>(
            "copy_d2h",
            CopyKind::D2H,
            &src.storage,
            src.len(),
            src_offset,
            &dst.storage,
            dst.len(),
            dst_offset,
            count,
        )
    }

    /// Copies all of device buffer `src` into device buffer `dst` (same length).
    pub fn copy_d2d<T: Pod>(&self, src: &DeviceBuffer<T>, dst: &DeviceBuffer<T>) -> Result<()> {
        Self::same_len("copy_d2d", src.len(), dst.len())?;
        self.copy_d2d_range(src, 0, dst, 0, src.len())
    }

    /// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`.
    pub fn copy_d2d_range<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        self.copy_op::<T>(
            "copy_d2d",
            CopyKind::D2D,
            &src.storage,
            src.len(),
            src_offset,
            &dst.storage,
            dst.len(),
            dst_offset,
            count,
        )
    }

    pub(crate) fn fill_op<T: Pod>(
        &self,
        storage: &Arc<Storage>,
        len: usize,
        offset: usize,
        count: usize,
        value: T,
    ) -> Result<()> {
        let op = "fill";
        self.check_storage(op, storage)?;
        check_range(op, len, offset, count)?;
        let size = std::mem::size_of::<T>();
        if size > 16 || size == 0 {
            return Err(Error::InvalidArgument(format!(
                "fill: element type {} is {size} bytes; fill supports 1..=16-byte elements (use a kernel for larger ones)",
                std::any::type_name::<T>()
            )));
        }
        let mut pattern = [0u8; 16];
        pattern[..size].copy_from_slice(bytemuck::bytes_of(&value));
        self.order_use(storage)?;
        let host_dst = (storage.kind == MemoryKind::Pinned).then(|| PendingWrite::new(storage));
        self.submit(Body::Fill {
            dst: storage.clone(),
            off: offset * size,
            bytes: count * size,
            pattern,
            pattern_len: size as u8,
            _pending: host_dst,
        })?;
        Ok(())
    }

    /// Sets every element of `dst` to `value`.
    pub fn fill<T: Pod>(&self, dst: &DeviceBuffer<T>, value: T) -> Result<()> {
        self.fill_op(&dst.storage, dst.len(), 0, dst.len(), value)
    }

    /// Sets `count` elements of `dst` from `offset` to `value`.
    pub fn fill_range<T: Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        offset: usize,
        count: usize,
        value: T,
    ) -> Result<()> {
        self.fill_op(&dst.storage, dst.len(), offset, count, value)
    }

    /// Sets every element of pinned `dst` to `value`, in stream order.
    pub fn fill_pinned<T: Pod>(&self, dst: &mut PinnedBuffer<T>, value: T) -> Result<()> {
        let n = dst.len();
        self.fill_op(&dst.storage, n, 0, n, value)
    }
}
