//! Stream-ordered allocation: `Stream::alloc` and the waits that order a
//! buffer's reuse (memory another stream freed) before its first use here.

use super::Stream;
use crate::api::buffer::DeviceBuffer;
use crate::exec::op::Body;
use crate::exec::storage::Storage;
use crate::{Error, Result};
use bytemuck::Pod;
use std::sync::Arc;

impl Stream {
    /// A device buffer of `len` elements allocated in stream order (like
    /// `cudaMallocAsync`): the pool serves it from this stream's cache first.
    /// Contents are unspecified.
    ///
    /// Dropping the handle frees it in stream order: if only work on this stream
    /// used it, the memory is back in this stream's cache at once and a later
    /// `alloc` here may return it while that work is still queued (later work on
    /// the stream runs after it). Otherwise it returns when its last use
    /// completes. Using the buffer on another stream is always safe: that stream
    /// first waits, on the device, for this stream to reach the allocation, and
    /// memory taken over from another stream's queued work is ordered after it
    /// the same way.
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        if self.is_capturing() {
            let bytes = crate::Device::bytes_for::<T>(len)?;
            let s = crate::api::graph::capture::alloc(&self.inner.capture, bytes)?;
            return Ok(DeviceBuffer::from_storage(s, len));
        }
        let mut arc = self.inner.device.device_storage::<T>(len, self.id())?;
        if arc.reuse_order {
            arc = self.order_reused(arc)?;
        }
        Ok(DeviceBuffer::from_storage(arc, len))
    }

    /// Orders the first use of memory [`Stream::alloc`] took over after the
    /// work that may still use it: this stream's own queued work (later work
    /// elsewhere then waits for this stream first) and other streams' work
    /// (see [`Stream::wait_for_points`]). On error the memory is freed once
    /// those points are reached.
    #[cold]
    fn order_reused(&self, mut arc: Arc<Storage>) -> Result<Arc<Storage>> {
        let s = Storage::unique(&mut arc).expect("a new storage has no other owner");
        s.reuse_order = false;
        let mut ordered = s.reused_in_stream_order();
        if s.has_reuse_points() {
            let fences = s.take_reuse_points();
            match self.wait_for_points(fences) {
                Ok(o) => ordered |= o,
                Err((e, pending)) => {
                    arc.free_after(pending);
                    return Err(e);
                }
            }
        }
        if ordered {
            s.set_ready(self.q().timeline().clone(), self.q().submitted());
        }
        Ok(arc)
    }

    /// Orders this stream after other streams' work that may still use memory it
    /// just took over: a device-side wait per point of this device, a host wait
    /// otherwise. Returns whether later uses elsewhere must wait for this stream.
    /// On error, the points not known to be reached come back with it: the memory
    /// may be freed only after them.
    #[cold]
    fn wait_for_points(
        &self,
        fences: Vec<Arc<dyn hetero_memory::StreamPoint>>,
    ) -> std::result::Result<bool, (Error, Vec<Arc<dyn hetero_memory::StreamPoint>>)> {
        let mut ordered = false;
        let mut failed = None;
        let mut pending = Vec::new();
        for f in fences {
            if f.is_complete() {
                continue;
            }
            if failed.is_some() {
                pending.push(f);
                continue;
            }
            let point = f
                .as_any()
                .and_then(|a| a.downcast_ref::<crate::exec::point::TimelinePoint>())
                .filter(|t| t.timeline.device == self.inner.device.id());
            let done = match point {
                Some(t) if t.timeline.stream == self.id() => Ok(()),
                Some(t) => self
                    .submit(Body::Wait {
                        timeline: t.timeline.clone(),
                        value: t.value,
                        fault: false,
                    })
                    .map(drop),
                None => crate::exec::point::wait_point(&f),
            };
            match done {
                Ok(()) => ordered |= point.is_some(),
                Err(e) => {
                    failed = Some(e);
                    pending.push(f);
                }
            }
        }
        match failed {
            None => Ok(ordered),
            Some(e) => Err((e, pending)),
        }
    }

    /// Orders an op on this stream that touches `s` after the work that used its
    /// memory before it, when that work ran elsewhere (see [`Stream::alloc`]).
    #[inline]
    pub(crate) fn order_use(&self, s: &Storage) -> Result<()> {
        if let Some((timeline, value)) = s.use_on(self.id()) {
            self.submit(Body::Wait {
                timeline: timeline.clone(),
                value,
                fault: false,
            })?;
        }
        Ok(())
    }
}
