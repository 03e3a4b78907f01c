//! Private physical memory: anonymous pages that live at one address at a
//! time, for memory that no other process and no second mapping needs (the
//! pool's granules). Anonymous memory gets transparent huge pages where
//! `transparent_hugepage/enabled` is `always` or `madvise`, which shared
//! memory (memfds) gets only where `shmem_enabled` allows it.
//!
//! A handle's pages live in its *holding* mapping while it is not mapped:
//! `size` bytes of anonymous memory, aligned to 2 MiB for huge granularities
//! so that a huge page stays one PMD when it moves (the kernel splits one
//! moved to an unaligned address). `map` moves them into a range and `unmap`
//! back with one `mremap(MAYMOVE | FIXED | DONTUNMAP)` each: the destination
//! (reserved pages of the range, or the empty holding mapping) is replaced in
//! one step and the source stays mapped, empty, so no hole ever opens in the
//! address space for another thread's `mmap` to land in; the range then
//! restores its reservation over the source. Kernels before 5.7 refuse
//! `DONTUNMAP`: the map fails with a typed error saying so.
//!
//! Invariants: the pages are either at the holding address (unmapped) or at
//! one place in one range, as one mapping of `size` bytes once the range has
//! set it back to read-write; while they are mapped the holding mapping is
//! there, empty (nothing touches it). Each handle is two mappings while
//! mapped (`vm.max_map_count` counts them).

use super::physical::Granularity;
use crate::error::{Bytes, MemoryError};
use crate::os::PageKind;
use std::ffi::c_void;
use std::sync::Mutex;

pub(crate) struct Private {
    state: Mutex<State>,
    size: usize,
}

struct State {
    /// The holding mapping.
    holding: usize,
    /// Where the pages are mapped in a range, if they are.
    mapped: Option<usize>,
}

fn os(what: String, e: rustix::io::Errno, hint: &'static str) -> MemoryError {
    MemoryError::Os {
        what,
        source: e.into(),
        hint,
    }
}

/// `len` bytes of fresh anonymous read-write memory aligned to `align`.
fn aligned_anon(len: usize, align: usize) -> Result<usize, MemoryError> {
    use rustix::mm::{MapFlags, ProtFlags};
    // SAFETY: the closure returns a fresh private anonymous mapping of the size
    // asked, at an address of the kernel's choosing: it aliases nothing.
    unsafe {
        super::reserve::map_aligned(len, align, |over| {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                over,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
            .map(|p| p as usize)
            .map_err(|e| {
                os(
                    format!("mmap of {} of anonymous memory", Bytes(over)),
                    e,
                    "the process is out of address space or mappings (vm.max_map_count)",
                )
            })
        })
    }
}

/// Why anonymous memory gets no transparent huge pages, when it gets none:
/// read once per process (a handle is made in a granule's cold path, where a
/// sysfs read would cost a fifth of the time).
fn thp_note() -> Option<&'static str> {
    static NOTE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    NOTE.get_or_init(read_thp_note).as_deref()
}

fn read_thp_note() -> Option<String> {
    let path = "/sys/kernel/mm/transparent_hugepage/enabled";
    let Ok(s) = std::fs::read_to_string(path) else {
        return Some(format!(
            "no transparent huge pages ({path} unreadable: the kernel lacks them): 4 KiB pages"
        ));
    };
    let chosen = s
        .split_whitespace()
        .find(|w| w.starts_with('['))?
        .trim_matches(|c| c == '[' || c == ']');
    match chosen {
        "always" | "madvise" => None,
        other => Some(format!(
            "transparent huge pages are off ({path} = {other}): 4 KiB pages; set it to madvise \
             for MADV_HUGEPAGE to take effect"
        )),
    }
}

impl Private {
    /// Anonymous memory of `size` bytes (checked aligned by the caller), not
    /// yet allocated; its page kind and the notes on why it got less.
    pub(crate) fn create(
        size: usize,
        granularity: Granularity,
    ) -> Result<(Self, PageKind, Vec<String>), MemoryError> {
        let align = granularity.bytes().min(2 << 20);
        let at = aligned_anon(size, align)?;
        let mut notes = Vec::new();
        let mut page = PageKind::Normal;
        if granularity != Granularity::Page4K {
            // SAFETY: advice on the fresh mapping made above; it changes no
            // contents.
            let r = unsafe {
                rustix::mm::madvise(at as *mut c_void, size, rustix::mm::Advice::LinuxHugepage)
            };
            match (r, thp_note()) {
                (Err(e), _) => {
                    notes.push(format!("madvise(MADV_HUGEPAGE) refused ({e}): 4 KiB pages"))
                }
                (Ok(()), Some(n)) => notes.push(n.to_string()),
                (Ok(()), None) => page = PageKind::Transparent,
            }
            if granularity == Granularity::Huge1G {
                notes.push("private memory has transparent 2 MiB pages at most, not 1 GiB".into());
            }
        }
        let state = State {
            holding: at,
            mapped: None,
        };
        Ok((
            Private {
                state: Mutex::new(state),
                size,
            },
            page,
            notes,
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the pages are now.
    fn at(&self) -> usize {
        let st = self.lock();
        st.mapped.unwrap_or(st.holding)
    }

    /// Moves the pages to `to` (reserved pages of a range). Fails, changing
    /// nothing, if the pages are mapped already.
    ///
    /// # Safety
    /// `to` is `size` bytes the caller owns and whose mapping it gives up.
    pub(crate) unsafe fn move_in(&self, to: *mut u8, id: u64) -> Result<(), MemoryError> {
        let mut st = self.lock();
        if st.mapped.is_some() {
            return Err(MemoryError::Private {
                what: "map of a handle mapped already",
                handle: id,
                hint: "unmap it first, or create it shareable (create_physical) to map it twice",
            });
        }
        // SAFETY: the holding mapping holds this handle's pages, `size` bytes;
        // `to` is pages the caller owns and replaces (the caller promised).
        unsafe { self.move_pages(st.holding, to as usize) }.map_err(|e| {
            os(
                format!(
                    "mremap(MREMAP_DONTUNMAP) of {} of private memory into a range",
                    Bytes(self.size)
                ),
                e,
                "the kernel refused to move the pages (MREMAP_DONTUNMAP needs Linux 5.7+; check \
                 vm.max_map_count): create the handle shareable (create_physical) instead",
            )
        })?;
        st.mapped = Some(to as usize);
        Ok(())
    }

    /// Moves `size` bytes of pages from `from` to `to` with one mremap,
    /// leaving `from` mapped and empty.
    ///
    /// # Safety
    /// `from` is one anonymous mapping of `size` bytes holding this handle's
    /// pages; `to` is `size` bytes the caller owns and whose contents it gives
    /// up.
    unsafe fn move_pages(&self, from: usize, to: usize) -> rustix::io::Result<()> {
        use rustix::mm::MremapFlags;
        // SAFETY: as the caller promised.
        unsafe {
            rustix::mm::mremap_fixed(
                from as *mut c_void,
                self.size,
                self.size,
                MremapFlags::MAYMOVE | MremapFlags::DONTUNMAP,
                to as *mut c_void,
            )
        }
        .map(|_| ())
    }

    /// Moves the pages from where they are mapped back to the holding
    /// mapping. The caller has made the mapped pages one read-write mapping,
    /// and restores its reservation over them after.
    pub(crate) fn park(&self) -> Result<(), MemoryError> {
        let mut st = self.lock();
        let Some(from) = st.mapped else {
            return Ok(());
        };
        // SAFETY: `from` is where this handle's pages are mapped (`size`
        // bytes, one mapping); the holding mapping is its own, empty.
        unsafe { self.move_pages(from, st.holding) }.map_err(|e| {
            os(
                format!(
                    "mremap of {} of private memory out of a range",
                    Bytes(self.size)
                ),
                e,
                "the kernel refused to move the pages back",
            )
        })?;
        st.mapped = None;
        Ok(())
    }

    /// The range that mapped the pages is gone and took them with it.
    pub(crate) fn forget_mapping(&self) {
        self.lock().mapped = None;
    }

    /// Allocates the pages of `[offset, offset + len)` now
    /// (`MADV_POPULATE_WRITE` where they are, held or mapped read-write).
    pub(crate) fn commit(&self, offset: usize, len: usize) -> Result<(), MemoryError> {
        let at = self.at() + offset;
        // SAFETY: [at, at + len) lies in this handle's pages (checked by the
        // caller); populating changes no contents.
        unsafe {
            rustix::mm::madvise(
                at as *mut c_void,
                len,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        }
        .map_err(|e| {
            os(
                format!(
                    "madvise(MADV_POPULATE_WRITE) of {} of private memory",
                    Bytes(len)
                ),
                e,
                "the system is out of memory, the kernel lacks MADV_POPULATE_WRITE (Linux 5.14+), \
                 or the handle is mapped without write access",
            )
        })
    }

    /// Gives the pages of `[offset, offset + len)` back (`MADV_DONTNEED`):
    /// they read as zero afterwards.
    pub(crate) fn release(&self, offset: usize, len: usize) -> Result<(), MemoryError> {
        let at = self.at() + offset;
        // SAFETY: [at, at + len) lies in this handle's pages (checked by the
        // caller), whose contents the caller gives up.
        unsafe { rustix::mm::madvise(at as *mut c_void, len, rustix::mm::Advice::LinuxDontNeed) }
            .map_err(|e| {
                os(
                    "madvise(MADV_DONTNEED) of private memory".into(),
                    e,
                    "the kernel refused to drop the pages",
                )
            })
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let st = self.lock();
        // A handle is dropped only when no range maps it (runs hold it).
        // SAFETY: the holding mapping is this handle's own; nothing refers to
        // it past drop.
        let _ = unsafe { rustix::mm::munmap(st.holding as *mut c_void, self.size) };
    }
}
