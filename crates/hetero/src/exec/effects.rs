//! The host implementation of every data effect: copies (flat, batched, 2-D
//! rows), fills, and host reads and writes. Backends call these after their
//! own checks (the emulated device after its IOMMU translation); ops, graph
//! nodes and synchronous host accesses all move bytes through here, in one
//! place.

use crate::exec::op::Body;
use crate::exec::storage::Reach;
use crate::exec::transfer::ByteRegion;

/// Runs a copy or fill for a backend whose engines reach its memory through
/// `reach`. The caller holds the access locks.
pub(crate) fn run(body: &Body, reach: Reach) {
    match body {
        Body::Copy {
            src,
            src_off,
            dst,
            dst_off,
            bytes,
            ..
        } => {
            // SAFETY: ranges were bounds-checked at enqueue; src and dst are different
            // storages (aliasing rejected at enqueue); the access locks (read on src,
            // write on dst) exclude every other writer and reader of dst.
            unsafe {
                copy_bytes(
                    src.engine_ptr(reach),
                    *src_off,
                    dst.engine_ptr(reach),
                    *dst_off,
                    *bytes,
                )
            }
        }
        Body::Fill {
            dst,
            off,
            bytes,
            pattern,
            pattern_len,
            ..
        } => {
            // SAFETY: range bounds-checked at enqueue; the write lock on dst makes this
            // the only access to it.
            unsafe {
                fill_bytes(
                    dst.engine_ptr(reach),
                    *off,
                    *bytes,
                    &pattern[..*pattern_len as usize],
                )
            }
        }
        Body::HostWrite { dst, off, data, .. } => {
            // SAFETY: range checked at enqueue; the write lock (or, on a modelled
            // device, the stream's order) excludes every other access to dst.
            unsafe { write_from(dst.engine_ptr(reach), *off, data) }
        }
        Body::HostRead { src, off, out } => {
            let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: range checked at enqueue; only readers touch src meanwhile.
            unsafe { read_into(src.engine_ptr(reach), *off, &mut out) }
        }
        Body::CopyBatch(b) => b.run(reach),
        Body::Copy2D(c) => c.run(reach),
        _ => {}
    }
}

/// A copy's effect (a copy op's, or a graph's copy node's): `bytes` from
/// `src + src_off` to `dst + dst_off`; nothing when `bytes` is 0.
///
/// # Safety
/// Both ranges lie inside their memory, do not overlap, and nothing else writes
/// either, or reads the destination, meanwhile.
pub(crate) unsafe fn copy_bytes(
    src: *const u8,
    src_off: usize,
    dst: *mut u8,
    dst_off: usize,
    bytes: usize,
) {
    if bytes > 0 {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.add(src_off), dst.add(dst_off), bytes) }
    }
}

/// A fill's effect: `bytes` at `dst + off` set to copies of `pattern`.
///
/// # Safety
/// The range lies inside its memory and nothing else touches it meanwhile.
pub(crate) unsafe fn fill_bytes(dst: *mut u8, off: usize, bytes: usize, pattern: &[u8]) {
    if bytes > 0 {
        // SAFETY: the caller's contract.
        fill_pattern(
            unsafe { std::slice::from_raw_parts_mut(dst.add(off), bytes) },
            pattern,
        )
    }
}

/// Fills `out` with copies of `pattern` (`out.len()` is a multiple of its length).
fn fill_pattern(out: &mut [u8], pattern: &[u8]) {
    let plen = pattern.len();
    if plen == 1 {
        out.fill(pattern[0]);
    } else if plen > 0 && out.len() >= plen {
        // Seed one element, then double the filled prefix with memcpy.
        out[..plen].copy_from_slice(pattern);
        let mut done = plen;
        while done < out.len() {
            let n = done.min(out.len() - done);
            out.copy_within(..n, done);
            done += n;
        }
    }
}

/// A host write's effect: `data` into the memory at `dst` from byte `off`.
///
/// # Safety
/// The range lies inside that memory, which the calling engine can reach, and
/// nothing else touches it meanwhile (the caller holds the write lock, or the
/// stream's order excludes every other access).
pub(crate) unsafe fn write_from(dst: *mut u8, off: usize, data: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst.add(off), data.len()) }
}

/// A host read's effect: `out.len()` bytes of the memory at `src` from byte
/// `off`.
///
/// # Safety
/// The range lies inside that memory, which the calling engine can reach, and
/// nothing writes it meanwhile.
pub(crate) unsafe fn read_into(src: *const u8, off: usize, out: &mut [u8]) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.add(off), out.as_mut_ptr(), out.len()) }
}

/// Copies the rows of `s` (in `src`) to the rows of `d` (in `dst`): one memcpy
/// when both are contiguous; otherwise, for rows below 32 B, two plain loads and
/// stores of the widest word that fits (the row's first and last, overlapping),
/// so a tiny row costs no call; a `copy_nonoverlapping` (memcpy) per row for
/// wider ones, which measured as fast as or faster than a loop of 32-byte words
/// from 33 B rows up (glibc's small-size paths, wide stores).
///
/// A large copy of wide rows (at least `STREAM_MIN_BYTES` in all) stores its
/// destination with streaming stores on x86-64, as glibc's memcpy does for one
/// large range (past its non-temporal threshold): the destination lines are
/// then not read first and do not evict the cache. A memcpy per row takes the
/// cached path at every size, which measured 0.67-0.71 of one 32 MiB memcpy's
/// bandwidth for 256 B rows here.
///
/// # Safety
/// Both regions lie inside their memory, have the same width and height, do not
/// overlap, and nothing else writes either or reads `d` meanwhile.
pub(crate) unsafe fn copy_rows(src: *const u8, s: ByteRegion, dst: *mut u8, d: ByteRegion) {
    // SAFETY: the caller's contract.
    unsafe { copy_rows_with(src, s, dst, d, STREAM_MIN_BYTES) }
}

/// Rows copied with streaming stores: at least this wide (line-aligned rows;
/// twice this for rows that straddle lines)…
const STREAM_MIN_WIDTH: usize = 256;
/// …in a copy of at least this many bytes (larger than this machine's caches
/// give one core; glibc's threshold for one range is of this order).
const STREAM_MIN_BYTES: usize = 4 << 20;

/// [`copy_rows`] with the streaming threshold given (tests lower it).
///
/// # Safety
/// As [`copy_rows`].
unsafe fn copy_rows_with(
    src: *const u8,
    s: ByteRegion,
    dst: *mut u8,
    d: ByteRegion,
    stream_min: usize,
) {
    if s.width == 0 || s.height == 0 {
        return;
    }
    if s.contiguous() && d.contiguous() {
        // SAFETY: the caller's contract; the rows form one range on both sides.
        unsafe {
            crate::exec::effects::copy_bytes(src, s.offset, dst, d.offset, s.width * s.height)
        };
        return;
    }
    let w = s.width;
    // Rows that start on a cache line at a pitch of whole lines (a pitched
    // allocation's) stream from 256 B up; rows that straddle lines only from
    // 512 B up: their partial end lines take plain stores, which then read
    // the line first, and for short rows that costs more than streaming saves
    // (256 B rows at an odd pitch: 0.66 of memcpy streamed, 0.78 plain; 1000 B
    // rows: 0.85-0.90 streamed, 0.70-0.80 plain).
    #[cfg(target_arch = "x86_64")]
    let lines = d.pitch.is_multiple_of(64) && (dst as usize + d.offset).is_multiple_of(64);
    #[cfg(target_arch = "x86_64")]
    if w >= if lines {
        STREAM_MIN_WIDTH
    } else {
        2 * STREAM_MIN_WIDTH
    } && w * s.height >= stream_min
    {
        // SAFETY: the caller's contract; the rows start at the regions' offsets.
        unsafe {
            stream_rows(
                src.add(s.offset),
                s.pitch,
                dst.add(d.offset),
                d.pitch,
                w,
                s.height,
            )
        };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = stream_min;
    // SAFETY (every arm): row `y` lies at `offset + y * pitch .. + width` on each
    // side, inside its memory by the caller's contract; every load and store
    // below stays inside its row (`at + size_of::<word>() <= w`). Overlapping
    // stores within a row write the same source bytes twice.
    unsafe {
        let (mut sp, mut dp) = (src.add(s.offset), dst.add(d.offset));
        macro_rules! rows {
            (|$a:ident, $b:ident| $body:block) => {
                for _ in 0..s.height {
                    let ($a, $b) = (sp, dp);
                    $body
                    sp = sp.add(s.pitch);
                    dp = dp.add(d.pitch);
                }
            };
        }
        #[inline(always)]
        unsafe fn word<T: Copy>(a: *const u8, b: *mut u8, at: usize) {
            // SAFETY: the caller keeps `at .. at + size_of::<T>()` inside the row.
            unsafe {
                b.add(at)
                    .cast::<T>()
                    .write_unaligned(a.add(at).cast::<T>().read_unaligned())
            }
        }
        /// The first and the last `T` of the row (they overlap when `w < 2 T`).
        macro_rules! ends {
            ($t:ty) => {
                rows!(|a, b| {
                    word::<$t>(a, b, 0);
                    word::<$t>(a, b, w - std::mem::size_of::<$t>());
                })
            };
        }
        match w {
            1 => rows!(|a, b| { word::<u8>(a, b, 0) }),
            2..=3 => ends!(u16),
            4..=7 => ends!(u32),
            8..=15 => ends!(u64),
            16..=31 => ends!(u128),
            _ => rows!(|a, b| { std::ptr::copy_nonoverlapping(a, b, w) }),
        }
    }
}

/// `h` rows of `w` bytes from `src` (rows `sp` apart) to `dst` (rows `dp`
/// apart): the whole destination cache lines of each row with streaming
/// stores, the partial lines at its ends with a plain copy; one store fence at the end orders the streaming stores
/// before whatever the caller publishes next (the op's completion).
///
/// # Safety
/// Row `y` lies at `src + y * sp .. + w` and `dst + y * dp .. + w`, inside
/// their memory; source and destination rows do not overlap, and nothing else
/// writes either or reads the destination meanwhile.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_rows(src: *const u8, sp: usize, dst: *mut u8, dp: usize, w: usize, h: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let (mut a, mut b) = (src, dst);
    for _ in 0..h {
        // Only whole destination cache lines are streamed: a streaming store
        // to part of a line costs a read-modify-write of the line in memory
        // (rows at an odd pitch measured 0.12 of memcpy that way).
        let head = b.align_offset(64).min(w);
        // SAFETY (the whole row): every access stays in `[0, w)` of its row
        // (the caller's contract); `b.add(i)` is 64-byte aligned for `i >= head`
        // (`head` aligns it, steps are multiples of 64), as `_mm_stream_si128`
        // requires (16); the loads are unaligned loads.
        unsafe {
            std::ptr::copy_nonoverlapping(a, b, head);
            let mut i = head;
            while i + 64 <= w {
                let v0 = _mm_loadu_si128(a.add(i).cast::<__m128i>());
                let v1 = _mm_loadu_si128(a.add(i + 16).cast::<__m128i>());
                let v2 = _mm_loadu_si128(a.add(i + 32).cast::<__m128i>());
                let v3 = _mm_loadu_si128(a.add(i + 48).cast::<__m128i>());
                _mm_stream_si128(b.add(i).cast::<__m128i>(), v0);
                _mm_stream_si128(b.add(i + 16).cast::<__m128i>(), v1);
                _mm_stream_si128(b.add(i + 32).cast::<__m128i>(), v2);
                _mm_stream_si128(b.add(i + 48).cast::<__m128i>(), v3);
                i += 64;
            }
            std::ptr::copy_nonoverlapping(a.add(i), b.add(i), w - i);
            a = a.add(sp);
            b = b.add(dp);
        }
    }
    // Streaming stores are weakly ordered: fence them before the caller's
    // release of the op (its completion on the timeline).
    // SAFETY: a store fence has no preconditions (SSE, part of x86-64).
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_rows_match_a_reference() {
        // Widths around the streaming minimum and odd ones, pitches that move
        // the destination's alignment from row to row; threshold 0: every
        // copy of rows >= 256 B streams.
        for width in [256usize, 257, 300, 1000, 1024, 4096, 4099] {
            // Line-aligned destination rows (a whole-line pitch from a line),
            // and rows that straddle lines.
            let lines = width.next_multiple_of(64) + 64;
            for (sp, dp, aligned) in [
                (width + 64, lines, true),
                (width + 64, width + 13, false),
                (width + 7, width + 1, false),
            ] {
                let h = 9;
                let s = ByteRegion {
                    offset: 3,
                    pitch: sp,
                    width,
                    height: h,
                };
                let mut d = ByteRegion {
                    offset: 5,
                    pitch: dp,
                    width,
                    height: h,
                };
                let src: Vec<u8> = (0..s.end() + 4).map(|i| (i * 13 + 1) as u8).collect();
                let mut dst = vec![0u8; d.end() + 4 + 64];
                if aligned {
                    d.offset = dst.as_ptr().align_offset(64);
                }
                let mut want = dst.clone();
                for y in 0..h {
                    let (a, b) = (s.offset + y * sp, d.offset + y * dp);
                    want[b..b + width].copy_from_slice(&src[a..a + width]);
                }
                // SAFETY: both regions lie inside their vectors, which do not overlap.
                unsafe { copy_rows_with(src.as_ptr(), s, dst.as_mut_ptr(), d, 0) };
                assert_eq!(dst, want, "width {width}, pitches {sp}/{dp}");
            }
        }
    }

    #[test]
    fn copy_rows_matches_a_reference_at_every_small_width() {
        let widths = (1..=70usize).chain([255, 256, 257, 4095, 4096, 4097, 9000]);
        for width in widths {
            for (sp, dp) in [
                (width, width + 3),
                (width + 5, width),
                (width * 2, width + 1),
            ] {
                let h = 7;
                let s = ByteRegion {
                    offset: 1,
                    pitch: sp,
                    width,
                    height: h,
                };
                let d = ByteRegion {
                    offset: 2,
                    pitch: dp,
                    width,
                    height: h,
                };
                let src: Vec<u8> = (0..s.end() + 4).map(|i| (i * 7 + 3) as u8).collect();
                let mut dst = vec![0u8; d.end() + 4];
                let mut want = dst.clone();
                for y in 0..h {
                    let (a, b) = (s.offset + y * sp, d.offset + y * dp);
                    want[b..b + width].copy_from_slice(&src[a..a + width]);
                }
                // SAFETY: both regions lie inside their vectors, which do not overlap.
                unsafe { copy_rows(src.as_ptr(), s, dst.as_mut_ptr(), d) };
                assert_eq!(dst, want, "width {width}, pitches {sp}/{dp}");
            }
        }
    }
}
