//! Pitched 2-D memory and 2-D copies: [`PitchedBuffer`] (rows padded to the
//! device's pitch alignment, like `cudaMallocPitch`), [`Region2D`] (a rectangle
//! of any buffer: offset, pitch, width, height in elements) and the
//! `Stream::copy_2d_*` copies between any two regions, flat or pitched, whole or
//! sub-rectangles — one op each (one strided descriptor on a device behind a
//! link, never one per row).
//!
//! Invariants: a pitched buffer's pitch is a multiple of the device's
//! `pitch_alignment` and of the element size, and its rows are allocated to a
//! multiple of `height_alignment`; kernels split a pitched buffer between blocks
//! by whole rows (`Storage::row_bytes`). Every region is checked before an op is
//! built (empty, pitch below width, out of bounds, shapes that differ: a typed
//! [`RegionProblem`]).

use crate::api::buffer::{DeviceBuffer, PinnedBuffer};
use crate::error::RegionProblem;
use crate::exec::op::{Body, CopyKind, PendingWrite};
use crate::exec::rows::{PitchedLayout, Region2D};
use crate::exec::storage::Storage;
use crate::exec::transfer::{ByteRegion, Copy2DOp};
use crate::{Device, Error, MemoryKind, Result, Stream};
use bytemuck::Pod;
use std::sync::Arc;

/// A device buffer of `height` rows of `width` elements whose rows start
/// `pitch` elements apart (`pitch_bytes` a multiple of the device's pitch
/// alignment), like `cudaMallocPitch`. It derefs to its [`DeviceBuffer`]
/// (`pitch * rows` elements), so every buffer operation takes it.
///
/// ```
/// use hetero::{Device, Region2D};
/// let dev = Device::host().unwrap();
/// let s = dev.create_stream().unwrap();
/// let img = dev.alloc_pitched::<u8>(3, 2).unwrap(); // 3 x 2, rows 16 bytes apart
/// assert_eq!(img.pitch_bytes(), 16);
/// let src = dev.pinned_from_slice(&[1u8, 2, 3, 4, 5, 6]).unwrap();
/// s.copy_2d_h2d(&src, Region2D::flat(3, 2), &img, img.region()).unwrap();
/// let mut out = dev.alloc_pinned::<u8>(6).unwrap();
/// s.copy_2d_d2h(&img, img.region(), &mut out, Region2D::flat(3, 2)).unwrap();
/// s.synchronize().unwrap();
/// assert_eq!(out.as_slice().unwrap(), &[1, 2, 3, 4, 5, 6]);
/// ```
pub struct PitchedBuffer<T: Pod> {
    buf: DeviceBuffer<T>,
    layout: PitchedLayout,
}

impl<T: Pod> std::ops::Deref for PitchedBuffer<T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        &self.buf
    }
}

impl<T: Pod> std::fmt::Debug for PitchedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PitchedBuffer")
            .field("layout", &self.layout)
            .field("elem", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: Pod> PitchedBuffer<T> {
    /// Elements per row.
    pub fn width(&self) -> usize {
        self.layout.width
    }

    /// Rows asked for.
    pub fn height(&self) -> usize {
        self.layout.height
    }

    /// Elements from one row's start to the next.
    pub fn pitch(&self) -> usize {
        self.layout.pitch
    }

    /// Bytes from one row's start to the next.
    pub fn pitch_bytes(&self) -> usize {
        self.layout.pitch * std::mem::size_of::<T>()
    }

    /// Rows allocated (the height rounded up to the device's height alignment).
    pub fn rows(&self) -> usize {
        self.buf.len() / self.layout.pitch.max(1)
    }

    /// The shape, for kernels.
    pub fn layout(&self) -> PitchedLayout {
        self.layout
    }

    /// The whole `width` x `height` rectangle.
    pub fn region(&self) -> Region2D {
        Region2D::new(0, self.layout.pitch, self.layout.width, self.layout.height)
    }

    /// The sub-rectangle of `width` x `height` at column `x`, row `y`; a typed
    /// error if it is empty or reaches past the image's width or height.
    pub fn rect(&self, x: usize, y: usize, width: usize, height: usize) -> Result<Region2D> {
        let op = "PitchedBuffer::rect";
        if width == 0 || height == 0 {
            return Err(Error::Region {
                op,
                problem: RegionProblem::Empty { width, height },
            });
        }
        let (right, bottom) = (x.saturating_add(width), y.saturating_add(height));
        if right > self.layout.width || bottom > self.layout.height {
            return Err(Error::Region {
                op,
                problem: RegionProblem::OutsideImage {
                    rect: (x, y, width, height),
                    image: (self.layout.width, self.layout.height),
                },
            });
        }
        Ok(self.region().sub(x, y, width, height))
    }

    /// The flat buffer behind it.
    pub fn buffer(&self) -> &DeviceBuffer<T> {
        &self.buf
    }

    /// Gives the flat buffer back.
    pub fn into_buffer(self) -> DeviceBuffer<T> {
        self.buf
    }
}

/// The pitch, in bytes, of rows of `row_bytes` under `alignment`, a multiple of
/// `size` too.
fn pitch_for(row_bytes: usize, alignment: usize, size: usize) -> Option<usize> {
    let mut p = row_bytes.checked_next_multiple_of(alignment)?;
    while !p.is_multiple_of(size) {
        p = p.checked_add(alignment)?;
    }
    Some(p)
}

impl Device {
    /// A pitched buffer of `height` rows of `width` elements: each row padded to
    /// a multiple of the device's pitch alignment
    /// ([`DeviceConfig::pitch_alignment`](crate::DeviceConfig::pitch_alignment),
    /// 16 bytes by default), rows allocated to a multiple of its height alignment
    /// (2 by default). Contents are unspecified.
    pub fn alloc_pitched<T: Pod>(&self, width: usize, height: usize) -> Result<PitchedBuffer<T>> {
        let op = "alloc_pitched";
        if width == 0 || height == 0 {
            return Err(Error::Region {
                op,
                problem: RegionProblem::Empty { width, height },
            });
        }
        let (align, height_align) = self.pitch_rules();
        let size = std::mem::size_of::<T>().max(1);
        let overflow = || {
            Error::InvalidArgument(format!(
                "alloc_pitched: {width} x {height} elements of {} overflow the address space",
                std::any::type_name::<T>()
            ))
        };
        let pitch_bytes = width
            .checked_mul(size)
            .and_then(|w| pitch_for(w, align, size))
            .ok_or_else(overflow)?;
        let rows = height
            .checked_next_multiple_of(height_align)
            .ok_or_else(overflow)?;
        let pitch = pitch_bytes / size;
        let len = pitch.checked_mul(rows).ok_or_else(overflow)?;
        let buf = self.alloc::<T>(len)?;
        self.pitched(buf, width, height, pitch)
    }

    /// `buf` seen as a pitched buffer of `height` rows of `width` elements,
    /// `pitch` elements apart; the pitch must meet the device's alignment.
    pub fn pitched_from<T: Pod>(
        &self,
        buf: DeviceBuffer<T>,
        width: usize,
        height: usize,
        pitch: usize,
    ) -> Result<PitchedBuffer<T>> {
        let op = "pitched_from";
        if buf.device_id() != self.id() {
            return Err(Error::WrongDevice {
                op,
                buffer_device: buf.device_id(),
                stream_device: self.id(),
            });
        }
        Region2D::new(0, pitch, width, height).check(op, buf.len())?;
        let (align, _) = self.pitch_rules();
        // (One row checks no pitch against the buffer.)
        let pitch_bytes = pitch.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "pitched_from: a pitch of {pitch} elements overflows the address space; \
                     give the image's row pitch"
            ))
        })?;
        if !pitch_bytes.is_multiple_of(align) {
            return Err(Error::Region {
                op,
                problem: RegionProblem::Unaligned {
                    pitch_bytes,
                    alignment: align,
                },
            });
        }
        self.pitched(buf, width, height, pitch)
    }

    fn pitched<T: Pod>(
        &self,
        mut buf: DeviceBuffer<T>,
        width: usize,
        height: usize,
        pitch: usize,
    ) -> Result<PitchedBuffer<T>> {
        let row_bytes = pitch * std::mem::size_of::<T>();
        match Arc::get_mut(&mut buf.storage) {
            Some(s) => s.row_bytes = row_bytes,
            None => {
                return Err(Error::BufferBusy {
                    op: "pitched_from",
                    detail: "pending work still uses the buffer",
                })
            }
        }
        Ok(PitchedBuffer {
            buf,
            layout: PitchedLayout {
                width,
                height,
                pitch,
            },
        })
    }
}

/// A 2-D copy's two rectangles have one shape (width, height).
fn same_shape(op: &'static str, src: (usize, usize), dst: (usize, usize)) -> Result<()> {
    if src != dst {
        return Err(Error::Region {
            op,
            problem: RegionProblem::ShapeMismatch { src, dst },
        });
    }
    Ok(())
}

impl Stream {
    #[allow(clippy::too_many_arguments)]
    fn copy_2d<T: Pod>(
        &self,
        op: &'static str,
        kind: CopyKind,
        src: &Arc<Storage>,
        src_len: usize,
        src_r: Region2D,
        dst: &Arc<Storage>,
        dst_len: usize,
        dst_r: Region2D,
    ) -> Result<()> {
        src_r.check(op, src_len)?;
        dst_r.check(op, dst_len)?;
        same_shape(op, (src_r.width, src_r.height), (dst_r.width, dst_r.height))?;
        let size = std::mem::size_of::<T>();
        self.copy_2d_bytes(op, kind, src, src_r.bytes(size), dst, dst_r.bytes(size))
    }

    /// A 2-D copy between byte regions of two storages (a placed graph's
    /// node runs one over the replicas of its device): each region checked
    /// against its storage's bytes.
    pub(crate) fn copy_2d_bytes(
        &self,
        op: &'static str,
        kind: CopyKind,
        src: &Arc<Storage>,
        src_r: ByteRegion,
        dst: &Arc<Storage>,
        dst_r: ByteRegion,
    ) -> Result<()> {
        self.check_storage(op, src)?;
        self.check_storage(op, dst)?;
        for (r, s) in [(src_r, src), (dst_r, dst)] {
            Region2D::new(r.offset, r.pitch, r.width, r.height).check(op, s.bytes())?;
        }
        same_shape(op, (src_r.width, src_r.height), (dst_r.width, dst_r.height))?;
        if Arc::ptr_eq(src, dst) {
            return Err(Error::Aliasing { op });
        }
        self.order_use(src)?;
        self.order_use(dst)?;
        let pending = (dst.kind == MemoryKind::Pinned).then(|| PendingWrite::new(dst));
        self.submit(Body::Copy2D(Box::new(Copy2DOp {
            kind,
            src: src.clone(),
            src_r,
            dst: dst.clone(),
            dst_r,
            _pending: pending,
        })))?;
        Ok(())
    }

    /// Copies rectangle `src_r` of pinned `src` into rectangle `dst_r` of device
    /// buffer `dst` (a [`PitchedBuffer`] derefs to one): one op, like
    /// `cudaMemcpy2DAsync`. Rectangles have one shape; pitches are free.
    pub fn copy_2d_h2d<T: Pod>(
        &self,
        src: &PinnedBuffer<T>,
        src_r: Region2D,
        dst: &DeviceBuffer<T>,
        dst_r: Region2D,
    ) -> Result<()> {
        self.copy_2d::<T>(
            "copy_2d_h2d",
            CopyKind::H2D,
            &src.storage,
            src.len(),
            src_r,
            &dst.storage,
            dst.len(),
            dst_r,
        )
    }

    /// Copies rectangle `src_r` of device buffer `src` into rectangle `dst_r` of
    /// pinned `dst`: one op.
    pub fn copy_2d_d2h<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        src_r: Region2D,
        dst: &mut PinnedBuffer<T>,
        dst_r: Region2D,
    ) -> Result<()> {
        let len = dst.len();
        self.copy_2d::<T>(
            "copy_2d_d2h",
            CopyKind::D2H,
            &src.storage,
            src.len(),
            src_r,
            &dst.storage,
            len,
            dst_r,
        )
    }

    /// Copies rectangle `src_r` of device buffer `src` into rectangle `dst_r` of
    /// device buffer `dst`: one op.
    pub fn copy_2d_d2d<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        src_r: Region2D,
        dst: &DeviceBuffer<T>,
        dst_r: Region2D,
    ) -> Result<()> {
        self.copy_2d::<T>(
            "copy_2d_d2d",
            CopyKind::D2D,
            &src.storage,
            src.len(),
            src_r,
            &dst.storage,
            dst.len(),
            dst_r,
        )
    }
}
