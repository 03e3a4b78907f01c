//! Peer copies: a buffer of one device of a context into a buffer of another,
//! in the order of a stream of either. Direct where the context's topology
//! has a path (one op: a DMA over the peer link between emulated devices, a
//! copy between host devices); staged through pinned host memory where not
//! (a copy out of the source's device on a stream there, one into the
//! destination's on a stream there, ordered by events; the stream the user
//! named waits for the last).

use super::{check_range, Stream};
use crate::api::buffer::DeviceBuffer;
use crate::api::context::PeerPath;
use crate::exec::op::{Body, CopyKind, PendingWrite};
use crate::exec::point::TimelinePoint;
use crate::exec::storage::Storage;
use crate::exec::timeline::Timeline;
use crate::{Device, Error, Result};
use bytemuck::Pod;
use std::sync::Arc;

const OP: &str = "copy_peer";

impl Stream {
    /// Copies all of `src` into `dst` (same length), where the two buffers are
    /// of two devices of one [`Context`](crate::Context) and this stream is on
    /// one of them (either). Later work on this stream sees the bytes; the
    /// host and other streams see them after an event recorded here, as for
    /// any copy. Between emulated devices with a peer link the copy is one
    /// DMA over that link on this device's copy engine of its direction; where
    /// the topology has no direct path it is staged through pinned host
    /// memory (see [`PeerPath`]).
    pub fn copy_peer<T: Pod>(&self, src: &DeviceBuffer<T>, dst: &DeviceBuffer<T>) -> Result<()> {
        Self::same_len(OP, src.len(), dst.len())?;
        self.copy_peer_range(src, 0, dst, 0, src.len())
    }

    /// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`
    /// between devices of one context (see [`Stream::copy_peer`]).
    pub fn copy_peer_range<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        self.peer_range((src, src_offset), (dst, dst_offset), count, None)
    }

    /// [`Stream::copy_peer`] once `after` (a point of a stream of this
    /// stream's context) is reached, faulted or not: a memory wait, folded
    /// into the copy's op where the backend takes it
    /// (`BackendStream::copies_wait`). The task layer's copies, after their
    /// source replica's maker.
    pub(crate) fn copy_peer_after<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &DeviceBuffer<T>,
        after: Option<(&Arc<Timeline>, u64)>,
    ) -> Result<()> {
        Self::same_len(OP, src.len(), dst.len())?;
        self.peer_range((src, 0), (dst, 0), src.len(), after)
    }

    fn peer_range<T: Pod>(
        &self,
        (src, src_offset): (&DeviceBuffer<T>, usize),
        (dst, dst_offset): (&DeviceBuffer<T>, usize),
        count: usize,
        after: Option<(&Arc<Timeline>, u64)>,
    ) -> Result<()> {
        if self.is_capturing() {
            return Err(Error::Graph {
                op: OP,
                detail: "a capture records one device's work; make the peer copy outside \
                         the capture"
                    .into(),
            });
        }
        let (s, d) = (&*src.storage, &*dst.storage);
        if s.graph_ref != 0 || d.graph_ref != 0 {
            return Err(Error::stand_in(OP));
        }
        check_range(OP, src.len(), src_offset, count)?;
        check_range(OP, dst.len(), dst_offset, count)?;
        if count == 0 {
            return Err(Error::InvalidArgument(
                "copy_peer: nothing to copy (0 elements); pass a count of at least one".into(),
            ));
        }
        let size = std::mem::size_of::<T>();
        let (src_off, dst_off, bytes) = (src_offset * size, dst_offset * size, count * size);
        let here = self.device().id();
        if s.device == d.device {
            if s.device != here {
                return Err(Error::WrongDevice {
                    op: OP,
                    buffer_device: s.device,
                    stream_device: here,
                });
            }
            self.order_points(after.as_slice())?;
            return self.copy_d2d_range(src, src_offset, dst, dst_offset, count);
        }
        if s.device != here && d.device != here {
            return Err(Error::DeviceContext {
                op: OP,
                detail: format!(
                    "the source is on device {}, the destination on device {}, the stream on \
                     device {here}: issue a peer copy on a stream of the source's or the \
                     destination's device",
                    s.device, d.device
                ),
            });
        }
        let other = if s.device == here { d.device } else { s.device };
        let ctx = match self.device().context_shared() {
            Some(c) if c.contains(other) => c,
            _ => {
                return Err(Error::DeviceContext {
                    op: OP,
                    detail: format!(
                        "devices {here} and {other} are in no context together; join them \
                         with hetero::Context::new(&[...]) first"
                    ),
                })
            }
        };
        let dropped = || Error::DeviceContext {
            op: OP,
            detail: format!("device {other} was dropped; its buffers outlive it only as handles"),
        };
        if !ctx.is_alive(other) {
            return Err(dropped());
        }
        let path = ctx
            .topology()
            .path(here, other)
            .expect("two devices of one context have a path");
        let (src, dst) = (&src.storage, &dst.storage);
        match path {
            PeerPath::Link(_) | PeerPath::SharedMemory => {
                self.peer_direct((src, src_off), (dst, dst_off), bytes, after)
            }
            PeerPath::Staged { .. } => {
                self.order_points(after.as_slice())?;
                let other_dev = ctx.device(other).ok_or_else(dropped)?;
                let (a, b) = if s.device == here {
                    (self.device().clone(), other_dev)
                } else {
                    (other_dev, self.device().clone())
                };
                self.peer_staged((&a, src, src_off), (&b, dst, dst_off), bytes)
            }
        }
    }

    /// One op on this stream: both storages named, the other device's ordered
    /// by its memory wait (if its memory was reused from queued work), and
    /// after `after` (a memory wait, in the copy's op where the backend
    /// takes it).
    pub(crate) fn peer_direct(
        &self,
        (src, src_off): (&Arc<Storage>, usize),
        (dst, dst_off): (&Arc<Storage>, usize),
        bytes: usize,
        after: Option<(&Arc<Timeline>, u64)>,
    ) -> Result<()> {
        let here = self.device().id();
        for s in [src, dst] {
            if s.device == here {
                self.order_use(s)?;
            } else if let Some((timeline, value)) = s.use_off_device() {
                let timeline = timeline.clone();
                self.submit(Body::Wait {
                    timeline: timeline.clone(),
                    value,
                    fault: false,
                })?;
                self.device().watch(&timeline, value);
            }
        }
        let after = after.filter(|(timeline, value)| !timeline.is_reached(*value));
        let folded = match after {
            Some(point) if !self.q().copies_wait() => {
                self.order_points(&[point])?;
                None
            }
            p => p,
        };
        self.submit(Body::Copy {
            kind: CopyKind::D2D,
            src: src.clone(),
            src_off,
            dst: dst.clone(),
            dst_off,
            bytes,
            _pending: None,
            after: folded.map(|(timeline, value)| TimelinePoint {
                timeline: timeline.clone(),
                value,
            }),
        })?;
        // (As `Stream::waits`: this device's engines look at the copy again
        // when the other device reaches the value.)
        if let Some((timeline, value)) = folded.filter(|(t, _)| t.device != here) {
            self.device().watch(timeline, value);
        }
        Ok(())
    }

    /// Out of device `a` into pinned memory on a stream of `a`, into device
    /// `b` on a stream of `b`: this stream is one of the two, the other
    /// device's staging stream the other; events order them after this
    /// stream's earlier work and this stream's later work after them.
    fn peer_staged(
        &self,
        (a, src, src_off): (&Device, &Arc<Storage>, usize),
        (b, dst, dst_off): (&Device, &Arc<Storage>, usize),
        bytes: usize,
    ) -> Result<()> {
        let here = self.device().id();
        // The other end's part on a staging stream lent to this copy alone.
        let lent_a = (a.id() != here).then(|| a.staging_stream()).transpose()?;
        let lent_b = (b.id() != here).then(|| b.staging_stream()).transpose()?;
        let sa: &Stream = lent_a.as_deref().unwrap_or(self);
        let sb: &Stream = lent_b.as_deref().unwrap_or(self);
        let host_a = a.properties().backend == "host";
        let host_b = b.properties().backend == "host";
        // Pinned memory of each non-host end (its IOMMU maps only its own).
        let pa = if host_a {
            None
        } else {
            Some(a.alloc_pinned::<u8>(bytes)?.storage.clone())
        };
        let pb = if host_b {
            None
        } else {
            Some(b.alloc_pinned::<u8>(bytes)?.storage.clone())
        };
        // Earlier work on this stream first.
        let before = self.record_event()?;
        if a.id() != here {
            sa.wait_event(&before)?;
        }
        // 1. Out of `a`: into its pinned buffer (a copy out of the device), or
        //    a host device's copy straight into `b`'s pinned buffer.
        sa.order_use(src)?;
        let (first_dst, first_kind) = match (&pa, &pb) {
            (Some(p), _) => (p.clone(), CopyKind::D2H),
            (None, Some(p)) => (p.clone(), CopyKind::D2D),
            (None, None) => unreachable!("two host devices share memory: no staging"),
        };
        sa.submit(Body::Copy {
            kind: first_kind,
            src: src.clone(),
            src_off,
            dst: first_dst.clone(),
            dst_off: 0,
            bytes,
            _pending: Some(PendingWrite::new(&first_dst)),
            after: None,
        })?;
        // Two devices with pinned pools of their own: one host copy between
        // the two staging buffers, in `a`'s order.
        if let (Some(from), Some(to)) = (&pa, &pb) {
            let (from, to) = (from.clone(), to.clone());
            sa.host_fn(move || {
                // SAFETY: both are pinned (host-visible) buffers of `bytes`
                // made for this copy: `from` was written by the copy before
                // this callback on its stream (completed), `to` is read only
                // by the copy into `b`, which waits for an event recorded
                // after this callback; no other op or handle names either.
                unsafe {
                    crate::exec::effects::copy_bytes(from.host_ptr(), 0, to.host_ptr(), 0, bytes)
                }
            })?;
        }
        let out = sa.record_event()?;
        sb.wait_event(&out)?;
        // 2. Into `b`: from its pinned buffer (a copy into the device), or a
        //    host device's copy straight from `a`'s pinned buffer.
        sb.order_use(dst)?;
        let (second_src, second_kind) = match (&pa, &pb) {
            (_, Some(p)) => (p.clone(), CopyKind::H2D),
            (Some(p), None) => (p.clone(), CopyKind::D2D),
            (None, None) => unreachable!("two host devices share memory: no staging"),
        };
        sb.submit(Body::Copy {
            kind: second_kind,
            src: second_src,
            src_off: 0,
            dst: dst.clone(),
            dst_off,
            bytes,
            _pending: None,
            after: None,
        })?;
        if b.id() != here {
            let done = sb.record_event()?;
            self.wait_event(&done)?;
        }
        Ok(())
    }
}
