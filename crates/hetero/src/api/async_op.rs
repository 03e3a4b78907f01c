//! The public side of async ops: the buffers an op may use (`AsyncArg`) and
//! `Stream::submit_async` (the op's body and context are `exec::async_op`).

use crate::api::buffer::{DeviceBuffer, PinnedBuffer};
use crate::exec::async_op::{AsyncBody, AsyncOp};
use crate::exec::op::Body;
use crate::exec::storage::Storage;
use crate::{Error, Result, Stream};
use bytemuck::Pod;
use std::sync::Arc;

/// A buffer an async op uses, with whether it writes it.
#[derive(Clone, Copy)]
pub struct AsyncArg<'a> {
    storage: &'a Arc<Storage>,
    write: bool,
}

impl<'a> AsyncArg<'a> {
    /// The op reads this device buffer (its memory must be host memory, see
    /// [`DeviceBuffer::is_host_visible`]).
    pub fn read<T: Pod>(buf: &'a DeviceBuffer<T>) -> Self {
        AsyncArg {
            storage: &buf.storage,
            write: false,
        }
    }

    /// The op writes this device buffer.
    pub fn write<T: Pod>(buf: &'a DeviceBuffer<T>) -> Self {
        AsyncArg {
            storage: &buf.storage,
            write: true,
        }
    }

    /// The op reads this pinned buffer.
    pub fn read_pinned<T: Pod>(buf: &'a PinnedBuffer<T>) -> Self {
        AsyncArg {
            storage: &buf.storage,
            write: false,
        }
    }

    /// The op writes this pinned buffer (host reads of it wait until it completes).
    pub fn write_pinned<T: Pod>(buf: &'a mut PinnedBuffer<T>) -> Self {
        AsyncArg {
            storage: &buf.storage,
            write: true,
        }
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// Whether the host can reach this buffer's memory directly (the host
    /// backend), so that an async op may take it; otherwise stage it through a
    /// pinned buffer.
    pub fn is_host_visible(&self) -> bool {
        self.storage.host_visible()
    }
}

impl Stream {
    /// Enqueues `op` (see [`AsyncOp`]): it starts once everything before it on
    /// the stream completed, and later work waits until it reports done. It may
    /// use `args` (host-visible buffers only) through its [`AsyncContext`](crate::AsyncContext).
    /// Async ops cannot be recorded into a graph.
    pub fn enqueue_async(
        &self,
        name: &'static str,
        args: &[AsyncArg<'_>],
        op: impl AsyncOp,
    ) -> Result<()> {
        if self.is_capturing() {
            return Err(Error::Graph {
                op: "enqueue_async",
                detail: "an async op cannot be recorded: it runs outside the device, once; \
                         enqueue it on a stream that is not capturing"
                    .into(),
            });
        }
        for (i, a) in args.iter().enumerate() {
            self.check_storage("enqueue_async", a.storage)?;
            if !a.storage.host_visible() {
                return Err(Error::InvalidArgument(format!(
                    "enqueue_async '{name}': buffer {i} is device memory the host cannot reach \
                     (device {}); copy it into a pinned buffer and pass that",
                    a.storage.device
                )));
            }
            for b in &args[..i] {
                if Arc::ptr_eq(a.storage, b.storage) && (a.write || b.write) {
                    return Err(Error::Aliasing {
                        op: "enqueue_async",
                    });
                }
            }
        }
        for a in args {
            self.order_use(a.storage)?;
        }
        let body = AsyncBody::new(name, args.iter().map(|a| (a.storage.clone(), a.write)), op);
        self.submit(Body::Async(body))?;
        Ok(())
    }
}
