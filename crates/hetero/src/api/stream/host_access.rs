//! Synchronous host reads and writes of device buffers (`read_slice`,
//! `write_slice`): in stream order, directly where the host can reach the
//! memory (under the buffer's access lock), else staged through a bounce
//! buffer the op owns.

use super::{check_range, Stream};
use crate::api::buffer::DeviceBuffer;
use crate::exec::op::Body;
use crate::exec::storage::Storage;
use crate::{Error, Result};
use bytemuck::Pod;
use std::sync::Arc;

impl Stream {
    fn synchronized_access(
        &self,
        op: &'static str,
        storage: &Storage,
        write: bool,
        f: impl FnOnce(),
    ) -> Result<()> {
        self.not_capturing(op)?;
        self.check_storage(op, storage)?;
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        self.synchronize()?;
        storage.wait_ready_for(self.id())?;
        if crate::exec::thread::on_engine_thread() && self.inner.device.held_by_running_op(storage)
        {
            return Err(Error::WouldDeadlock(format!(
                "{op}: the buffer is an argument of the kernel running on this thread, which \
                 holds it until it returns; read or write it through the kernel's views"
            )));
        }
        storage.with_host_access(write, || self.inner.device.kick(), f);
        Ok(())
    }

    /// A synchronous copy between a borrowed host slice and memory the host
    /// cannot reach: staged through a bounce buffer the op owns (as CUDA stages
    /// pageable memory through pinned buffers), in stream order, then waited for.
    #[cold]
    fn staged(
        &self,
        op: &'static str,
        s: &Arc<Storage>,
        off: usize,
        dir: StageDir<'_>,
    ) -> Result<()> {
        self.not_capturing(op)?;
        self.check_storage(op, s)?;
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        self.order_use(s)?;
        let mode = self.inner.device.host_wait();
        match dir {
            StageDir::In(data) => {
                let v = self.submit(Body::HostWrite {
                    dst: s.clone(),
                    off,
                    data: data.into(),
                    inline: false,
                })?;
                self.q().timeline().wait(v, mode)
            }
            StageDir::Out(out) => {
                let bounce = Arc::new(std::sync::Mutex::new(vec![0u8; out.len()]));
                let v = self.submit(Body::HostRead {
                    src: s.clone(),
                    off,
                    out: bounce.clone(),
                })?;
                self.q().timeline().wait(v, mode)?;
                out.copy_from_slice(&bounce.lock().unwrap_or_else(|p| p.into_inner()));
                Ok(())
            }
        }
    }

    /// Synchronous copy from a borrowed host slice into `dst[offset..]`, in stream
    /// order: waits for the stream's earlier work, then copies on this thread.
    pub fn write_slice<T: Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        offset: usize,
        data: &[T],
    ) -> Result<()> {
        check_range("write_slice", dst.len(), offset, data.len())?;
        let s = &dst.storage;
        if !s.host_visible() {
            let off = offset * std::mem::size_of::<T>();
            return self.staged(
                "write_slice",
                s,
                off,
                StageDir::In(bytemuck::cast_slice(data)),
            );
        }
        self.synchronized_access("write_slice", s, true, || {
            let off = offset * std::mem::size_of::<T>();
            // SAFETY: range checked above; the memory is host-visible; the write
            // lock excludes every op on `s`.
            unsafe {
                crate::exec::effects::write_from(s.host_ptr(), off, bytemuck::cast_slice(data))
            }
        })
    }

    /// Synchronous copy of `out.len()` elements from `src[offset..]` into a borrowed
    /// host slice, in stream order.
    pub fn read_slice<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        offset: usize,
        out: &mut [T],
    ) -> Result<()> {
        check_range("read_slice", src.len(), offset, out.len())?;
        let s = &src.storage;
        if !s.host_visible() {
            let off = offset * std::mem::size_of::<T>();
            return self.staged(
                "read_slice",
                s,
                off,
                StageDir::Out(bytemuck::cast_slice_mut(out)),
            );
        }
        self.synchronized_access("read_slice", s, false, || {
            let off = offset * std::mem::size_of::<T>();
            // SAFETY: range checked above; the memory is host-visible; the read
            // lock excludes writers of `s`.
            unsafe {
                crate::exec::effects::read_into(s.host_ptr(), off, bytemuck::cast_slice_mut(out))
            }
        })
    }

    /// Synchronous read of a whole device buffer into a new `Vec`, in stream order.
    pub fn read_to_vec<T: Pod>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); src.len()];
        self.read_slice(src, 0, &mut out)?;
        Ok(out)
    }
}

/// Which way a staged synchronous copy goes.
enum StageDir<'a> {
    In(&'a [u8]),
    Out(&'a mut [u8]),
}
