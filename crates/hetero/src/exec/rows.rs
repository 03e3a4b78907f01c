//! Row views of pitched memory for kernels: the layout (`height` rows of
//! `width` elements, `pitch` apart) and the views a block reads and writes
//! through, which never reach the padding between rows.

use crate::error::RegionProblem;
use crate::exec::transfer::ByteRegion;
use crate::{Error, Result};
use bytemuck::Pod;

/// A rectangle of a buffer: `height` rows of `width` elements, `pitch` elements
/// apart, the first row at element `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region2D {
    /// The first element of the first row.
    pub offset: usize,
    /// Elements from one row's start to the next.
    pub pitch: usize,
    /// Elements per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
}

impl Region2D {
    /// A rectangle of `height` rows of `width` elements, `pitch` apart, from `offset`.
    pub fn new(offset: usize, pitch: usize, width: usize, height: usize) -> Self {
        Region2D {
            offset,
            pitch,
            width,
            height,
        }
    }

    /// A flat buffer seen as `height` rows of `width` elements, back to back.
    pub fn flat(width: usize, height: usize) -> Self {
        Region2D::new(0, width, width, height)
    }

    /// The sub-rectangle of `width` x `height` at column `x`, row `y` of this one.
    pub fn sub(&self, x: usize, y: usize, width: usize, height: usize) -> Self {
        // Saturating: a corner past the address space is out of any buffer,
        // which the check of the region says (never an overflow here).
        let offset = y.saturating_mul(self.pitch).saturating_add(x);
        Region2D::new(
            self.offset.saturating_add(offset),
            self.pitch,
            width,
            height,
        )
    }

    pub(crate) fn check(&self, op: &'static str, len: usize) -> Result<()> {
        let bad = |problem| Err(Error::Region { op, problem });
        if self.width == 0 || self.height == 0 {
            return bad(RegionProblem::Empty {
                width: self.width,
                height: self.height,
            });
        }
        if self.pitch < self.width {
            return bad(RegionProblem::PitchBelowWidth {
                pitch: self.pitch,
                width: self.width,
            });
        }
        let end = (self.height - 1)
            .checked_mul(self.pitch)
            .and_then(|r| r.checked_add(self.offset))
            .and_then(|r| r.checked_add(self.width));
        match end {
            Some(end) if end <= len => Ok(()),
            end => bad(RegionProblem::OutOfBounds {
                end: end.unwrap_or(usize::MAX),
                len,
            }),
        }
    }

    /// In bytes, of a checked region (its offset and width are inside the
    /// buffer; a one-row region's pitch may be anything, and is never used
    /// to address: saturating).
    pub(crate) fn bytes(&self, size: usize) -> ByteRegion {
        ByteRegion {
            offset: self.offset * size,
            pitch: self.pitch.saturating_mul(size),
            width: self.width * size,
            height: self.height,
        }
    }
}

/// The shape of a pitched buffer, for kernels ([`Block::read_rows`](crate::Block::read_rows)):
/// `height` rows of `width` elements, `pitch` elements apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PitchedLayout {
    pub width: usize,
    pub height: usize,
    pub pitch: usize,
}

/// Whether `layout` fits a buffer of `len` elements.
pub(crate) fn check_layout(l: PitchedLayout, len: usize) -> std::result::Result<(), String> {
    let r = Region2D::new(0, l.pitch, l.width, l.height);
    r.check("rows view", len).map_err(|e| e.to_string())
}

/// The rows of a pitched kernel argument, read ([`Block::read_rows`](crate::Block::read_rows)).
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a, T> {
    data: &'a [T],
    layout: PitchedLayout,
}

impl<'a, T: Pod> Rows<'a, T> {
    pub(crate) fn new(data: &'a [T], layout: PitchedLayout) -> std::result::Result<Self, String> {
        check_layout(layout, data.len())?;
        Ok(Rows { data, layout })
    }

    /// Rows.
    pub fn height(&self) -> usize {
        self.layout.height
    }

    /// Elements per row.
    pub fn width(&self) -> usize {
        self.layout.width
    }

    /// Row `y` (its `width` elements), or `None` past the last row.
    pub fn get(&self, y: usize) -> Option<&'a [T]> {
        (y < self.layout.height).then(|| {
            let at = y * self.layout.pitch;
            &self.data[at..at + self.layout.width]
        })
    }

    /// Row `y`. Panics (failing the stream) past the last row.
    pub fn row(&self, y: usize) -> &'a [T] {
        self.get(y)
            .unwrap_or_else(|| panic!("row {y} of {} rows", self.layout.height))
    }
}

/// A block's rows of a pitched kernel argument, written
/// ([`Block::write_rows`](crate::Block::write_rows)): rows `first_row()..` up to
/// `first_row() + len()`.
#[derive(Debug)]
pub struct RowsMut<'a, T> {
    data: &'a mut [T],
    layout: PitchedLayout,
    first: usize,
}

impl<'a, T: Pod> RowsMut<'a, T> {
    pub(crate) fn new(data: &'a mut [T], layout: PitchedLayout, first: usize) -> Self {
        RowsMut {
            data,
            layout,
            first,
        }
    }

    /// The first row this block owns.
    pub fn first_row(&self) -> usize {
        self.first
    }

    /// The rows this block owns (of the layout's `height`).
    pub fn len(&self) -> usize {
        let owned = self.data.len().div_ceil(self.layout.pitch.max(1));
        owned.min(self.layout.height.saturating_sub(self.first))
    }

    /// Whether this block owns no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements per row.
    pub fn width(&self) -> usize {
        self.layout.width
    }

    /// Row `y` (counted from the buffer's first row), or `None` if this block
    /// does not own it.
    pub fn get_mut(&mut self, y: usize) -> Option<&mut [T]> {
        let k = y.checked_sub(self.first).filter(|&k| k < self.len())?;
        let at = k * self.layout.pitch;
        Some(&mut self.data[at..at + self.layout.width])
    }

    /// Row `y` (counted from the buffer's first row). Panics (failing the
    /// stream) if this block does not own it.
    pub fn row_mut(&mut self, y: usize) -> &mut [T] {
        let (first, n) = (self.first, self.len());
        self.get_mut(y)
            .unwrap_or_else(|| panic!("row {y} is not this block's (rows {first}..{})", first + n))
    }
}
