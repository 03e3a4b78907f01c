//! Physical memory handles: sealed memfds of a chosen granularity
//! (shareable), or anonymous memory that can be mapped at one place only
//! (private, `private.rs`).
//!
//! 2 MiB and 1 GiB handles are hugetlb memfds when the machine has enough
//! hugetlb pages reserved (checked by `fallocate`, so a later touch cannot
//! SIGBUS); otherwise normal memfds, advised for transparent huge pages where
//! the kernel allows them for shared memory, the handle's notes saying which.
//! Every handle is sealed against shrinking and growing (and further sealing)
//! once sized: a process it is shared with can rely on its size.

use super::context::ContextInner;
use super::private::Private;
use crate::error::{Bytes, MemoryError};
use crate::os::PageKind;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The page size a handle (and a range) works in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    /// 4 KiB pages.
    Page4K,
    /// 2 MiB pages.
    Huge2M,
    /// 1 GiB pages.
    Huge1G,
}

impl Granularity {
    /// The granularity in bytes.
    pub const fn bytes(self) -> usize {
        match self {
            Granularity::Page4K => 4 << 10,
            Granularity::Huge2M => 2 << 20,
            Granularity::Huge1G => 1 << 30,
        }
    }
}

/// The seals every handle carries.
pub(crate) const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// The seals an importer requires: the size cannot change under it.
pub(crate) const SEALS_REQUIRED: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// What holds a handle's pages.
pub(crate) enum Backing {
    /// A sealed memfd: mappable many times, exportable.
    Shared(OwnedFd),
    /// Anonymous memory at one address at a time.
    Private(Private),
}

pub(crate) struct PhysInner {
    pub(crate) backing: Backing,
    pub(crate) size: usize,
    pub(crate) granularity: Granularity,
    pub(crate) page: PageKind,
    pub(crate) notes: Vec<String>,
    pub(crate) id: u64,
    /// The context that may map it.
    pub(crate) context: u64,
}

/// A handle to physical memory: `size` bytes in pages of one granularity.
/// Cloning shares the memory; it is returned when the last clone and the
/// last mapping of it are gone.
#[derive(Clone)]
pub struct PhysicalMemory {
    pub(crate) inner: Arc<PhysInner>,
}

impl std::fmt::Debug for PhysicalMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhysicalMemory")
            .field("id", &self.inner.id)
            .field("size", &self.inner.size)
            .field("granularity", &self.inner.granularity)
            .field("page", &self.inner.page)
            .field("notes", &self.inner.notes)
            .finish()
    }
}

fn os(what: impl Into<String>, e: rustix::io::Errno, hint: &'static str) -> MemoryError {
    MemoryError::Os {
        what: what.into(),
        source: e.into(),
        hint,
    }
}

/// Why a normal memfd gets no transparent huge pages, when it gets none.
pub(crate) fn shmem_huge_note() -> Option<String> {
    let path = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
    let s = std::fs::read_to_string(path).ok()?;
    let chosen = s
        .split_whitespace()
        .find(|w| w.starts_with('['))?
        .trim_matches(|c| c == '[' || c == ']')
        .to_string();
    match chosen.as_str() {
        "always" | "within_size" | "advise" | "force" => None,
        other => Some(format!(
            "transparent huge pages for shared memory are off ({path} = {other}): 4 KiB pages; \
             set it to advise for MADV_HUGEPAGE to take effect"
        )),
    }
}

fn nr_hugepages(g: Granularity) -> String {
    let kb = g.bytes() >> 10;
    std::fs::read_to_string(format!(
        "/sys/kernel/mm/hugepages/hugepages-{kb}kB/free_hugepages"
    ))
    .map(|s| s.trim().to_string())
    .unwrap_or_else(|_| "unknown".into())
}

/// A handle's size must be a non-zero multiple of its granularity.
fn check_size(size: usize, granularity: Granularity) -> Result<(), MemoryError> {
    let g = granularity.bytes();
    if size == 0 || !size.is_multiple_of(g) {
        return Err(MemoryError::Unaligned {
            what: "physical size",
            value: size,
            granularity: Bytes(g),
        });
    }
    Ok(())
}

impl PhysicalMemory {
    pub(crate) fn create(
        size: usize,
        granularity: Granularity,
        ctx: &ContextInner,
    ) -> Result<Self, MemoryError> {
        check_size(size, granularity)?;
        let mut notes = Vec::new();
        let name = c"hetero-physical";
        let base = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let mut made = None;
        if granularity != Granularity::Page4K {
            let huge = match granularity {
                Granularity::Huge1G => MemfdFlags::HUGE_1GB,
                _ => MemfdFlags::HUGE_2MB,
            };
            match rustix::fs::memfd_create(name, base | MemfdFlags::HUGETLB | huge) {
                Ok(fd) => {
                    // fallocate takes the pages now: a later touch of a page
                    // the pool cannot supply would otherwise be SIGBUS.
                    let r = rustix::fs::ftruncate(&fd, size as u64).and_then(|()| {
                        rustix::fs::fallocate(
                            &fd,
                            rustix::fs::FallocateFlags::empty(),
                            0,
                            size as u64,
                        )
                    });
                    match r {
                        Ok(()) => made = Some((fd, huge_kind(granularity))),
                        Err(e) => notes.push(format!(
                            "hugetlb memfd of {}: {e} (free hugetlb pages of {}: {})",
                            Bytes(size),
                            Bytes(granularity.bytes()),
                            nr_hugepages(granularity)
                        )),
                    }
                }
                Err(e) => notes.push(format!("hugetlb memfd: {e}")),
            }
        }
        let (fd, page) = match made {
            Some(x) => x,
            None => {
                let fd = rustix::fs::memfd_create(name, base).map_err(|e| {
                    os(
                        "memfd_create",
                        e,
                        "the process is out of file descriptors or memory",
                    )
                })?;
                rustix::fs::ftruncate(&fd, size as u64).map_err(|e| {
                    os(
                        format!("ftruncate of a memfd to {}", Bytes(size)),
                        e,
                        "lower the size",
                    )
                })?;
                let page = if granularity == Granularity::Page4K {
                    PageKind::Normal
                } else {
                    match shmem_huge_note() {
                        Some(n) => {
                            notes.push(n);
                            PageKind::Normal
                        }
                        None => PageKind::Transparent,
                    }
                };
                (fd, page)
            }
        };
        rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(|e| {
            os(
                "sealing a memfd",
                e,
                "the kernel lacks memfd seals (Linux 3.17+)",
            )
        })?;
        Ok(Self::new(
            Backing::Shared(fd),
            size,
            granularity,
            page,
            notes,
            ctx.id,
        ))
    }

    /// Private memory: see [`MemoryContext::create_private`](super::MemoryContext::create_private).
    pub(crate) fn create_private(
        size: usize,
        granularity: Granularity,
        ctx: &ContextInner,
    ) -> Result<Self, MemoryError> {
        check_size(size, granularity)?;
        let (private, page, notes) = Private::create(size, granularity)?;
        Ok(Self::new(
            Backing::Private(private),
            size,
            granularity,
            page,
            notes,
            ctx.id,
        ))
    }

    /// A handle over an fd another process (or context) shared, after its
    /// seals and size were checked.
    pub(crate) fn from_shared(
        fd: OwnedFd,
        size: usize,
        granularity: Granularity,
        page: PageKind,
        context: u64,
    ) -> Self {
        Self::new(
            Backing::Shared(fd),
            size,
            granularity,
            page,
            Vec::new(),
            context,
        )
    }

    /// A new handle (with a new id) of `context` over `backing`.
    fn new(
        backing: Backing,
        size: usize,
        granularity: Granularity,
        page: PageKind,
        notes: Vec<String>,
        context: u64,
    ) -> Self {
        PhysicalMemory {
            inner: Arc::new(PhysInner {
                backing,
                size,
                granularity,
                page,
                notes,
                id: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
                context,
            }),
        }
    }

    /// Bytes of memory.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The page size it is mapped in.
    pub fn granularity(&self) -> Granularity {
        self.inner.granularity
    }

    /// What backs it.
    pub fn page_kind(&self) -> PageKind {
        self.inner.page
    }

    /// Why it got less than was asked (no hugetlb pages, THP off for shmem).
    pub fn notes(&self) -> &[String] {
        &self.inner.notes
    }

    /// A number unique in this process.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Whether it was created private (anonymous memory, mapped at one place
    /// at a time, not exportable).
    pub fn is_private(&self) -> bool {
        matches!(self.inner.backing, Backing::Private(_))
    }

    /// The memfd, to share with another process (see `crate::ipc`);
    /// [`MemoryError::Private`] for a private handle, which has none.
    pub fn fd(&self) -> Result<BorrowedFd<'_>, MemoryError> {
        self.inner.shared_fd("fd of a handle")
    }

    fn check_pages(
        &self,
        what: &'static str,
        offset: usize,
        len: usize,
    ) -> Result<(), MemoryError> {
        let g = self.inner.granularity.bytes();
        let (at, length) = match what {
            "commit" => ("commit offset", "commit length"),
            _ => ("release offset", "release length"),
        };
        check_aligned(at, offset, g)?;
        check_aligned(length, len, g)?;
        if len == 0 {
            return Err(MemoryError::InvalidRequest {
                what: format!("{what} of 0 bytes at {offset:#x}"),
                hint: "give a length of at least one granule",
            });
        }
        if offset.checked_add(len).is_none_or(|e| e > self.inner.size) {
            return Err(MemoryError::OutOfRange {
                what,
                offset,
                len,
                size: Bytes(self.inner.size),
            });
        }
        Ok(())
    }

    /// Allocates the pages of `[offset, offset + len)` now (`fallocate`),
    /// keeping what they hold: from then on a mapping of them is backed (its
    /// first touch of a page only fills the page table, it cannot run out of
    /// memory), like `cuMemCreate`'s memory before `cuMemMap`. One call for
    /// the whole range, cheaper than faulting the pages in through a mapping
    /// ([`VirtualRange::populate`](super::VirtualRange::populate)), which
    /// also fills the page tables.
    ///
    /// A private handle's pages are allocated with `MADV_POPULATE_WRITE`
    /// where they are (held, or mapped read-write), page tables included.
    pub fn commit(&self, offset: usize, len: usize) -> Result<(), MemoryError> {
        self.check_pages("commit", offset, len)?;
        let fd = match &self.inner.backing {
            Backing::Shared(fd) => fd,
            Backing::Private(p) => return p.commit(offset, len),
        };
        rustix::fs::fallocate(
            fd,
            rustix::fs::FallocateFlags::empty(),
            offset as u64,
            len as u64,
        )
        .map_err(|e| {
            os(
                format!("fallocate of {} of a memfd", Bytes(len)),
                e,
                "the system is out of memory (or the memfd's tmpfs is full): free memory or commit less",
            )
        })
    }

    /// Gives the pages of `[offset, offset + len)` back to the system
    /// (`fallocate(PUNCH_HOLE)`): they read as zero afterwards, mapped or not.
    /// A private handle's with `MADV_DONTNEED`.
    pub fn release(&self, offset: usize, len: usize) -> Result<(), MemoryError> {
        self.check_pages("release", offset, len)?;
        let fd = match &self.inner.backing {
            Backing::Shared(fd) => fd,
            Backing::Private(p) => return p.release(offset, len),
        };
        rustix::fs::fallocate(
            fd,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            offset as u64,
            len as u64,
        )
        .map_err(|e| {
            os(
                "fallocate(PUNCH_HOLE)",
                e,
                "the kernel cannot punch holes in this memfd",
            )
        })
    }
}

impl PhysInner {
    /// The memfd of a shareable handle; for a private one, an error naming
    /// `what` was asked.
    pub(crate) fn shared_fd(&self, what: &'static str) -> Result<BorrowedFd<'_>, MemoryError> {
        match &self.backing {
            Backing::Shared(fd) => Ok(fd.as_fd()),
            Backing::Private(_) => Err(MemoryError::Private {
                what,
                handle: self.id,
                hint: "it has no memfd: create it shareable (MemoryContext::create_physical) to \
                       export, import or map it twice",
            }),
        }
    }
}

fn huge_kind(g: Granularity) -> PageKind {
    match g {
        Granularity::Huge1G => PageKind::Hugetlb1G,
        _ => PageKind::Hugetlb2M,
    }
}

pub(crate) fn check_aligned(what: &'static str, value: usize, g: usize) -> Result<(), MemoryError> {
    if value.is_multiple_of(g) {
        Ok(())
    } else {
        Err(MemoryError::Unaligned {
            what,
            value,
            granularity: Bytes(g),
        })
    }
}
