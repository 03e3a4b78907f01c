//! OS memory: anonymous mappings with huge pages (hugetlb 2 MiB, or 1 GiB when
//! asked; then transparent huge pages via madvise; then 4 KiB pages), mlock
//! with a recorded fallback, and optional pre-faulting.
//!
//! Invariants: every mapping this module makes is unmapped exactly once, by
//! [`ChunkSource::unmap`]; every syscall made is counted in [`OsCalls`], so a
//! test can check that the hot path makes none. When the kernel refuses
//! something, the chunk records what it got instead and why.

use crate::config::HugePagePolicy;
use crate::error::{Bytes, MemoryError};
use serde::Serialize;
use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// 2 MiB, the huge page size and the granularity of large chunks.
pub const HUGE_2M: usize = 2 << 20;
const HUGE_1G: usize = 1 << 30;
const PAGE: usize = 4096;

/// What backs a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageKind {
    /// Reserved hugetlb pages of 2 MiB.
    Hugetlb2M,
    /// Reserved hugetlb pages of 1 GiB.
    Hugetlb1G,
    /// 4 KiB pages with `MADV_HUGEPAGE`: the kernel may back them with 2 MiB pages.
    Transparent,
    /// 4 KiB pages.
    Normal,
    /// Memory of another backend (not from this OS layer).
    Device,
}

/// Counts of the syscalls an OS layer made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OsCalls {
    pub mmap: u64,
    pub munmap: u64,
    pub mlock: u64,
    pub munlock: u64,
    pub madvise: u64,
    /// mlock calls the kernel (or an injected fault) refused.
    pub mlock_refused: u64,
}

impl OsCalls {
    /// All syscalls together.
    pub fn total(&self) -> u64 {
        self.mmap + self.munmap + self.mlock + self.munlock + self.madvise
    }
}

#[derive(Debug, Default)]
struct Counters {
    mmap: AtomicU64,
    munmap: AtomicU64,
    mlock: AtomicU64,
    munlock: AtomicU64,
    madvise: AtomicU64,
    mlock_refused: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A region of memory a pool sub-allocates: for the host backend, one mapping.
pub struct Chunk {
    pub ptr: NonNull<u8>,
    pub size: usize,
    pub page: PageKind,
    pub pinned: bool,
    /// Why the chunk got less than was asked (no hugetlb pages, mlock refused, …).
    pub notes: Vec<String>,
}

// SAFETY: a chunk is an owned description of a memory region; the region is not
// tied to a thread, and the pool that holds the chunk synchronises all access.
unsafe impl Send for Chunk {}
// SAFETY: `&Chunk` only reads the description fields.
unsafe impl Sync for Chunk {}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("page", &self.page)
            .field("pinned", &self.pinned)
            .field("notes", &self.notes)
            .finish()
    }
}

/// Where a pool's chunks come from: the OS for the host backend, device memory
/// for others, or a test double that injects faults.
pub trait ChunkSource: Send + Sync + fmt::Debug {
    /// A new chunk of exactly `size` bytes (a multiple of 4 KiB).
    fn map(&self, size: usize) -> Result<Chunk, MemoryError>;
    /// Returns a chunk this source mapped.
    fn unmap(&self, chunk: Chunk);
    /// Syscalls made so far.
    fn os_calls(&self) -> OsCalls {
        OsCalls::default()
    }
}

/// Options of the host chunk source.
#[derive(Debug, Clone)]
pub struct HostOptions {
    pub huge_pages: HugePagePolicy,
    /// Ask for 1 GiB hugetlb pages when a chunk is a multiple of 1 GiB.
    pub huge_1g: bool,
    /// mlock each chunk once (pinned memory).
    pub pin: bool,
    /// Touch every page when the chunk is mapped.
    pub prefault: bool,
    /// Fault injection: behave as if the kernel refused every mlock.
    pub refuse_mlock: bool,
    /// Fault injection: behave as if no hugetlb pages were reserved.
    pub refuse_hugetlb: bool,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            huge_pages: HugePagePolicy::HugeFirst,
            huge_1g: false,
            pin: false,
            prefault: false,
            refuse_mlock: false,
            refuse_hugetlb: false,
        }
    }
}

/// Chunks from anonymous mappings of this process.
#[derive(Debug, Default)]
pub struct HostChunkSource {
    opts: HostOptions,
    counters: Counters,
}

static MLOCK_WARNED: AtomicBool = AtomicBool::new(false);

fn nr_hugepages() -> String {
    std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

impl HostChunkSource {
    pub fn new(opts: HostOptions) -> Self {
        HostChunkSource {
            opts,
            counters: Counters::default(),
        }
    }

    fn mmap(&self, len: usize, flags: rustix::mm::MapFlags) -> std::io::Result<*mut c_void> {
        use rustix::mm::{MapFlags, ProtFlags};
        bump(&self.counters.mmap);
        // SAFETY: a fresh anonymous private mapping at an address of the kernel's
        // choosing aliases no existing memory.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | flags,
            )
        };
        p.map_err(std::io::Error::from)
    }

    fn munmap(&self, p: *mut c_void, len: usize) {
        bump(&self.counters.munmap);
        // SAFETY: callers pass a range this source mapped and no longer hand out.
        if let Err(e) = unsafe { rustix::mm::munmap(p, len) } {
            tracing::error!(len, error = %e, "munmap failed; the range leaks");
        }
    }

    fn try_hugetlb(&self, size: usize, notes: &mut Vec<String>) -> Option<(*mut c_void, PageKind)> {
        use rustix::mm::MapFlags;
        if self.opts.refuse_hugetlb {
            notes.push("hugetlb: refused (injected fault)".into());
            return None;
        }
        if self.opts.huge_1g && size.is_multiple_of(HUGE_1G) {
            match self.mmap(size, MapFlags::HUGETLB | MapFlags::HUGE_1GB) {
                Ok(p) => return Some((p, PageKind::Hugetlb1G)),
                Err(e) => notes.push(format!("hugetlb 1 GiB: {e}")),
            }
        }
        if !size.is_multiple_of(HUGE_2M) {
            notes.push("hugetlb 2 MiB: size is not a multiple of 2 MiB".into());
            return None;
        }
        match self.mmap(size, MapFlags::HUGETLB | MapFlags::HUGE_2MB) {
            Ok(p) => Some((p, PageKind::Hugetlb2M)),
            Err(e) => {
                notes.push(format!(
                    "hugetlb 2 MiB: {e} (vm.nr_hugepages = {})",
                    nr_hugepages()
                ));
                None
            }
        }
    }

    /// A 2 MiB-aligned normal mapping advised for transparent huge pages.
    fn map_transparent(
        &self,
        size: usize,
        notes: &mut Vec<String>,
    ) -> Result<*mut c_void, MemoryError> {
        let over = size + HUGE_2M;
        let raw = self
            .mmap(over, rustix::mm::MapFlags::empty())
            .map_err(|e| map_err(over, e))?;
        let start = raw as usize;
        let aligned = (start + HUGE_2M - 1) & !(HUGE_2M - 1);
        let head = aligned - start;
        let tail = over - head - size;
        if head > 0 {
            self.munmap(raw, head);
        }
        if tail > 0 {
            self.munmap((aligned + size) as *mut c_void, tail);
        }
        let p = aligned as *mut c_void;
        bump(&self.counters.madvise);
        // SAFETY: [p, p + size) is the mapping made above, still owned here.
        if let Err(e) = unsafe { rustix::mm::madvise(p, size, rustix::mm::Advice::LinuxHugepage) } {
            notes.push(format!("madvise(MADV_HUGEPAGE): {e}; 4 KiB pages"));
        }
        Ok(p)
    }

    fn prefault(ptr: *mut u8, size: usize) {
        let touch = |start: usize, end: usize| {
            let mut off = start;
            while off < end {
                // SAFETY: off < size, inside the fresh mapping the caller owns; the
                // write of zero keeps the (zeroed) contents unchanged.
                unsafe { std::ptr::write_volatile(ptr.add(off), 0u8) };
                off += PAGE;
            }
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if size < (64 << 20) || threads < 2 {
            touch(0, size);
            return;
        }
        let piece = (size / threads + PAGE - 1) & !(PAGE - 1);
        let base = ptr as usize;
        std::thread::scope(|s| {
            for i in 0..threads {
                let (start, end) = (i * piece, ((i + 1) * piece).min(size));
                s.spawn(move || {
                    let p = base as *mut u8;
                    let mut off = start;
                    while off < end {
                        // SAFETY: disjoint page ranges of the caller's fresh mapping.
                        unsafe { std::ptr::write_volatile(p.add(off), 0u8) };
                        off += PAGE;
                    }
                });
            }
        });
    }
}

fn map_err(len: usize, source: std::io::Error) -> MemoryError {
    MemoryError::Map {
        len: Bytes(len),
        source,
        hint: "the process is out of address space or memory; lower max_reserved_mb or free memory",
    }
}

impl ChunkSource for HostChunkSource {
    fn map(&self, size: usize) -> Result<Chunk, MemoryError> {
        let size = (size.max(1) + PAGE - 1) & !(PAGE - 1);
        let mut notes = Vec::new();
        let huge = match self.opts.huge_pages {
            HugePagePolicy::NormalOnly => None,
            HugePagePolicy::HugeFirst | HugePagePolicy::HugeOnly => {
                self.try_hugetlb(size, &mut notes)
            }
        };
        let (p, page) = match huge {
            Some(x) => x,
            None if self.opts.huge_pages == HugePagePolicy::HugeOnly => {
                return Err(MemoryError::HugePagesUnavailable {
                    len: Bytes(size),
                    reason: notes.join("; "),
                })
            }
            None if self.opts.huge_pages == HugePagePolicy::HugeFirst && size >= HUGE_2M => {
                let p = self.map_transparent(size, &mut notes)?;
                (p, PageKind::Transparent)
            }
            None => {
                if self.opts.huge_pages == HugePagePolicy::HugeFirst {
                    notes.push("below 2 MiB: 4 KiB pages".into());
                }
                let p = self
                    .mmap(size, rustix::mm::MapFlags::empty())
                    .map_err(|e| map_err(size, e))?;
                (p, PageKind::Normal)
            }
        };
        let mut pinned = false;
        if self.opts.pin {
            bump(&self.counters.mlock);
            let r = if self.opts.refuse_mlock {
                Err(std::io::Error::from_raw_os_error(1))
            } else {
                // SAFETY: [p, p + size) is the mapping made above.
                unsafe { rustix::mm::mlock(p, size) }.map_err(std::io::Error::from)
            };
            match r {
                Ok(()) => pinned = true,
                Err(e) => {
                    bump(&self.counters.mlock_refused);
                    let why = format!(
                        "mlock refused ({e}): memory stays pageable; raise RLIMIT_MEMLOCK (ulimit -l) or grant CAP_IPC_LOCK"
                    );
                    if !MLOCK_WARNED.swap(true, Ordering::Relaxed) {
                        tracing::warn!("{why}");
                    }
                    notes.push(why);
                }
            }
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| map_err(size, std::io::Error::other("mmap returned null")))?;
        if self.opts.prefault && !pinned {
            // mlock already faulted every page in.
            Self::prefault(ptr.as_ptr(), size);
        }
        Ok(Chunk {
            ptr,
            size,
            page,
            pinned,
            notes,
        })
    }

    fn unmap(&self, chunk: Chunk) {
        let p = chunk.ptr.as_ptr().cast::<c_void>();
        if chunk.pinned {
            bump(&self.counters.munlock);
            // SAFETY: the chunk was mapped and locked by this source.
            if let Err(e) = unsafe { rustix::mm::munlock(p, chunk.size) } {
                tracing::warn!(error = %e, "munlock failed");
            }
        }
        self.munmap(p, chunk.size);
    }

    fn os_calls(&self) -> OsCalls {
        let c = &self.counters;
        OsCalls {
            mmap: c.mmap.load(Ordering::Relaxed),
            munmap: c.munmap.load(Ordering::Relaxed),
            mlock: c.mlock.load(Ordering::Relaxed),
            munlock: c.munlock.load(Ordering::Relaxed),
            madvise: c.madvise.load(Ordering::Relaxed),
            mlock_refused: c.mlock_refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_hugetlb_reserved() -> bool {
        nr_hugepages() == "0"
    }

    #[test]
    fn huge_first_falls_back_and_says_why() {
        let src = HostChunkSource::new(HostOptions::default());
        let c = src.map(HUGE_2M).expect("map");
        if no_hugetlb_reserved() {
            assert_eq!(c.page, PageKind::Transparent);
            assert!(
                c.notes.iter().any(|n| n.contains("hugetlb")),
                "{:?}",
                c.notes
            );
        }
        assert_eq!(
            c.ptr.as_ptr() as usize % HUGE_2M,
            0,
            "THP chunks are 2 MiB aligned"
        );
        // SAFETY: the chunk is a fresh writable mapping of HUGE_2M bytes.
        unsafe { c.ptr.as_ptr().add(HUGE_2M - 1).write(7) };
        src.unmap(c);
        let calls = src.os_calls();
        assert!(calls.mmap >= 1 && calls.munmap >= 1);
    }

    #[test]
    fn injected_hugetlb_refusal_falls_back() {
        let src = HostChunkSource::new(HostOptions {
            refuse_hugetlb: true,
            ..HostOptions::default()
        });
        let c = src.map(4 * HUGE_2M).expect("map");
        assert_eq!(c.page, PageKind::Transparent);
        assert!(c.notes[0].contains("injected"));
        src.unmap(c);
    }

    #[test]
    fn huge_only_without_reserved_pages_is_an_actionable_error() {
        let src = HostChunkSource::new(HostOptions {
            huge_pages: HugePagePolicy::HugeOnly,
            refuse_hugetlb: true,
            ..HostOptions::default()
        });
        let e = src.map(HUGE_2M).unwrap_err();
        assert!(e.to_string().contains("nr_hugepages"), "{e}");
    }

    #[test]
    fn refused_mlock_is_recorded_not_fatal() {
        let src = HostChunkSource::new(HostOptions {
            pin: true,
            refuse_mlock: true,
            ..HostOptions::default()
        });
        let c = src.map(64 << 10).expect("map");
        assert!(!c.pinned);
        assert!(c.notes.iter().any(|n| n.contains("mlock refused")));
        src.unmap(c);
        assert_eq!(src.os_calls().mlock_refused, 1);
        assert_eq!(src.os_calls().munlock, 0);
    }

    #[test]
    fn pinned_and_prefaulted_chunk() {
        let src = HostChunkSource::new(HostOptions {
            pin: true,
            prefault: true,
            huge_pages: HugePagePolicy::NormalOnly,
            ..HostOptions::default()
        });
        let c = src.map(1 << 20).expect("map");
        assert_eq!(c.page, PageKind::Normal);
        let pinned = c.pinned;
        src.unmap(c);
        let calls = src.os_calls();
        assert_eq!(calls.mlock, 1);
        assert_eq!(calls.munlock, u64::from(pinned));
    }

    /// Pages of `chunk` that are resident, from mincore(2).
    fn resident_pages(chunk: &Chunk) -> usize {
        let mut vec = vec![0u8; chunk.size.div_ceil(PAGE)];
        // SAFETY: the chunk is a live mapping of `size` bytes starting at a page
        // boundary, and `vec` has one byte per page of it.
        let rc = unsafe {
            libc::mincore(
                chunk.ptr.as_ptr().cast::<libc::c_void>(),
                chunk.size,
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| **b & 1 != 0).count()
    }

    #[test]
    fn parallel_prefault_of_a_large_chunk() {
        let opts = HostOptions {
            prefault: true,
            huge_pages: HugePagePolicy::NormalOnly,
            ..HostOptions::default()
        };
        let size = 64 << 20;
        let pages = size / PAGE;
        // Without pre-faulting, a fresh mapping has (almost) nothing resident:
        // the check below can tell the difference.
        let cold_src = HostChunkSource::new(HostOptions {
            prefault: false,
            ..opts.clone()
        });
        let cold = cold_src.map(size).expect("map");
        assert!(
            resident_pages(&cold) < pages / 2,
            "a fresh mapping is not resident"
        );
        cold_src.unmap(cold);
        // 64 MiB is the size at which the touch is split across threads (when
        // there are several): every page, in every thread's range, is resident.
        let src = HostChunkSource::new(opts);
        let c = src.map(size).expect("map");
        assert_eq!(
            resident_pages(&c),
            pages,
            "pre-faulting left pages untouched"
        );
        // SAFETY: the chunk is a fresh writable mapping of `size` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(c.ptr.as_ptr(), size) };
        assert!(
            bytes.iter().step_by(PAGE).all(|b| *b == 0),
            "pre-faulting changed the contents"
        );
        src.unmap(c);
    }
}
