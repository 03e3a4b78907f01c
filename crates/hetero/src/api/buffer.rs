//! The buffer handles users hold (device and pinned), and kernel arguments;
//! the storage behind them is `exec::storage`.
//!
//! Invariants (who may touch the bytes from the host): host code reads a
//! pinned buffer only while no enqueued operation writes it (`pending_writes ==
//! 0`; enqueuing a writer needs `&mut`), and writes it only while no operation
//! or graph holds it at all (`Arc::get_mut`).

use crate::exec::storage::Storage;
use crate::{Error, Result};
use bytemuck::Pod;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// A typed buffer in device memory, reached only through stream operations.
///
/// Dropping the handle while work still uses the buffer is fine: the work keeps the
/// memory alive until it completes. For a buffer from [`Stream::alloc`] used only
/// on that stream, the memory returns to the stream's cache at once, and later
/// work on the stream may reuse it (stream-ordered, like `cudaFreeAsync`).
///
/// [`Stream::alloc`]: crate::Stream::alloc
pub struct DeviceBuffer<T: Pod> {
    /// Taken only by `Drop` (which recycles it when it is the last owner).
    pub(crate) storage: ManuallyDrop<Arc<Storage>>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> DeviceBuffer<T> {
    /// The storage, without the buffer's release (a handle made over a
    /// storage someone else owns gives it back this way).
    pub(crate) fn into_storage(self) -> Arc<Storage> {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so its storage is taken only here.
        unsafe { ManuallyDrop::take(&mut me.storage) }
    }
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: `storage` is not touched again: this is the buffer's drop.
        let storage = unsafe { ManuallyDrop::take(&mut self.storage) };
        if Arc::strong_count(&storage) > 1 {
            storage.release_in_stream_order();
        } else {
            Storage::recycle(storage);
        }
    }
}

/// A typed buffer of pinned host memory: the source and destination of async copies.
pub struct PinnedBuffer<T: Pod> {
    pub(crate) storage: Arc<Storage>,
    len: usize,
    _t: PhantomData<T>,
}

macro_rules! buffer_common {
    ($ty:ident, $wrap:path) => {
        impl<T: Pod> $ty<T> {
            pub(crate) fn from_storage(storage: Arc<Storage>, len: usize) -> Self {
                debug_assert_eq!(storage.bytes(), len * std::mem::size_of::<T>());
                $ty {
                    storage: $wrap(storage),
                    len,
                    _t: PhantomData,
                }
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the buffer holds no elements.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Size in bytes.
            pub fn size_bytes(&self) -> usize {
                self.len * std::mem::size_of::<T>()
            }

            /// The address the device knows the buffer by (on a device with its own
            /// memory, not a host pointer).
            pub fn device_address(&self) -> u64 {
                self.storage.device_addr()
            }

            /// The id of the device that owns the buffer.
            pub fn device_id(&self) -> u64 {
                self.storage.device
            }
        }

        impl<T: Pod> std::fmt::Debug for $ty<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("len", &self.len)
                    .field("elem", &std::any::type_name::<T>())
                    .field("device", &self.storage.device)
                    .finish()
            }
        }
    };
}

buffer_common!(DeviceBuffer, ManuallyDrop::new);
buffer_common!(PinnedBuffer, std::convert::identity);

impl<T: Pod> PinnedBuffer<T> {
    fn check_not_stand_in(&self, op: &'static str) -> Result<()> {
        if self.storage.graph_ref != 0 {
            return Err(Error::stand_in(op));
        }
        Ok(())
    }

    /// The contents, for reading on the host. Fails while an enqueued operation still
    /// writes into the buffer (synchronize its stream first).
    pub fn as_slice(&self) -> Result<&[T]> {
        self.check_not_stand_in("PinnedBuffer::as_slice")?;
        if self.storage.has_pending_writes() {
            self.storage.refused();
            return Err(Error::BufferBusy {
                op: "PinnedBuffer::as_slice",
                detail: "a copy or fill into it has not completed",
            });
        }
        // SAFETY: the storage holds at least `len` initialised (zeroed at allocation)
        // `T`s, aligned to 256 B; no writer is pending and none can be enqueued while
        // `&self` is borrowed (writers need `&mut`).
        Ok(unsafe { std::slice::from_raw_parts(self.storage.host_ptr() as *const T, self.len) })
    }

    /// The contents, for writing on the host. Fails while any enqueued operation still
    /// uses the buffer ([`Error::BufferBusy`]), and while a graph that copies
    /// from or into it exists ([`Error::HeldByGraph`]: a `Graph`, its
    /// `GraphExec` and their `Bindings` hold the buffers they name, launched or
    /// not; record such copies on a pinned slot and bind the buffer per launch
    /// to write it between launches).
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.check_not_stand_in("PinnedBuffer::as_mut_slice")?;
        let len = self.len;
        match Arc::get_mut(&mut self.storage) {
            // SAFETY: `get_mut` proved no operation holds the storage, and `&mut self`
            // keeps new ones from being enqueued while the slice lives.
            Some(s) => Ok(unsafe { std::slice::from_raw_parts_mut(s.host_ptr() as *mut T, len) }),
            None => {
                self.storage.refused();
                let op = "PinnedBuffer::as_mut_slice";
                match self.storage.graph_holds() {
                    0 => Err(Error::BufferBusy {
                        op,
                        detail: "an operation that reads or writes it has not completed",
                    }),
                    holds => Err(Error::HeldByGraph { op, holds }),
                }
            }
        }
    }
}

/// A buffer passed to a kernel launch, with how the kernel uses it.
#[derive(Clone, Copy)]
pub struct Arg<'a> {
    pub(crate) storage: &'a Arc<Storage>,
    pub(crate) elem: &'static crate::exec::kernel::ElemInfo,
    pub(crate) write: bool,
    /// Set for a managed buffer (`api/managed.rs`): `storage` is then its
    /// device copy, and the launch passes a view of the declared range.
    pub(crate) managed: Option<crate::api::managed::ManagedArg<'a>>,
}

impl<'a> Arg<'a> {
    /// The kernel reads the whole buffer; every block sees all of it.
    pub fn read<T: Pod>(buf: &'a DeviceBuffer<T>) -> Self {
        Arg {
            storage: &buf.storage,
            elem: crate::exec::kernel::ElemInfo::of::<T>(),
            write: false,
            managed: None,
        }
    }

    /// The kernel writes the buffer, split across blocks: with `n` blocks, block `b`
    /// gets elements `b*ceil(len/n) ..` up to the next block's start.
    pub fn write<T: Pod>(buf: &'a DeviceBuffer<T>) -> Self {
        Arg {
            write: true,
            ..Arg::read(buf)
        }
    }
}
