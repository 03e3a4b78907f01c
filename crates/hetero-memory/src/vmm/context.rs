//! Memory contexts: the owner of ranges and physical handles, with a quota of
//! mapped bytes. A context maps only its own handles, or handles imported into
//! it; the quota is charged when a map is made (a compare-and-swap, so two
//! threads cannot pass it together) and refunded when it is unmapped.

use super::physical::{Granularity, PhysicalMemory};
use super::reserve::VirtualRange;
use crate::error::{Bytes, MemoryError};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);
static REGISTRY: Mutex<Vec<Weak<ContextInner>>> = Mutex::new(Vec::new());

pub(crate) struct ContextInner {
    pub(crate) id: u64,
    pub(crate) name: String,
    quota: usize,
    mapped: AtomicUsize,
    peak: AtomicUsize,
    maps: AtomicU64,
    denied: AtomicU64,
}

impl ContextInner {
    pub(crate) fn label(&self) -> String {
        format!("{:?} (#{})", self.name, self.id)
    }

    /// Charges `len` mapped bytes, or refuses without changing anything.
    pub(crate) fn charge(&self, len: usize) -> Result<(), MemoryError> {
        let mut cur = self.mapped.load(Ordering::Relaxed);
        loop {
            let next = cur.checked_add(len).filter(|n| *n <= self.quota);
            let Some(next) = next else {
                self.denied.fetch_add(1, Ordering::Relaxed);
                return Err(MemoryError::QuotaExceeded {
                    context: self.label(),
                    requested: Bytes(len),
                    mapped: Bytes(cur),
                    would_be: Bytes(cur.saturating_add(len)),
                    quota: Bytes(self.quota),
                });
            };
            match self
                .mapped
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    self.maps.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) => cur = now,
            }
        }
    }

    pub(crate) fn refund(&self, len: usize) {
        self.mapped.fetch_sub(len, Ordering::AcqRel);
    }

    fn stats(&self) -> ContextStats {
        ContextStats {
            id: self.id,
            name: self.name.clone(),
            quota: self.quota,
            mapped: self.mapped.load(Ordering::Acquire),
            peak_mapped: self.peak.load(Ordering::Relaxed),
            maps: self.maps.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
        }
    }
}

/// Figures of one memory context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContextStats {
    pub id: u64,
    pub name: String,
    /// Most bytes it may have mapped at once.
    pub quota: usize,
    /// Bytes mapped now, over all its ranges.
    pub mapped: usize,
    pub peak_mapped: usize,
    /// Maps made.
    pub maps: u64,
    /// Maps refused for the quota.
    pub denied: u64,
}

/// An owner of virtual ranges and physical handles, with a quota of mapped
/// bytes. Cloning shares the context.
///
/// ```
/// use hetero_memory::vmm::{Access, Granularity, MemoryContext};
/// let ctx = MemoryContext::new("model", 8 << 20);
/// let mut range = ctx.reserve(64 << 20, Granularity::Huge2M).unwrap();
/// let phys = ctx.create_physical(4 << 20, Granularity::Huge2M).unwrap();
/// range.map(0, &phys, 0, 4 << 20, Access::ReadWrite).unwrap();
/// // SAFETY: the first 4 MiB are mapped read-write.
/// unsafe { range.ptr().write(7) };
/// range.unmap(0, 4 << 20).unwrap();
/// assert_eq!(ctx.stats().mapped, 0);
/// ```
#[derive(Clone)]
pub struct MemoryContext {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for MemoryContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("MemoryContext")
            .field(&self.inner.stats())
            .finish()
    }
}

impl MemoryContext {
    /// A context that may map at most `quota` bytes at once.
    pub fn new(name: &str, quota: usize) -> Self {
        let inner = Arc::new(ContextInner {
            id: NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            quota,
            mapped: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            maps: AtomicU64::new(0),
            denied: AtomicU64::new(0),
        });
        let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&inner));
        MemoryContext { inner }
    }

    /// A context without a quota.
    pub fn unlimited(name: &str) -> Self {
        Self::new(name, usize::MAX)
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    pub fn stats(&self) -> ContextStats {
        self.inner.stats()
    }

    /// Reserves `size` bytes of address space (rounded up to `granularity`),
    /// aligned to `granularity`, with nothing mapped.
    pub fn reserve(
        &self,
        size: usize,
        granularity: Granularity,
    ) -> Result<VirtualRange, MemoryError> {
        VirtualRange::reserve(self.inner.clone(), size, granularity)
    }

    /// Physical memory of `size` bytes (a multiple of `granularity`) that this
    /// context may map.
    pub fn create_physical(
        &self,
        size: usize,
        granularity: Granularity,
    ) -> Result<PhysicalMemory, MemoryError> {
        PhysicalMemory::create(size, granularity, &self.inner)
    }

    /// Private physical memory of `size` bytes (a multiple of `granularity`):
    /// anonymous memory, advised for transparent huge pages at 2 MiB and
    /// 1 GiB granularity (the handle's notes say when it gets none), that
    /// moves into the range it is mapped in with one `mremap` and back out
    /// when unmapped. Cheaper to make present than a memfd where shared
    /// memory has no huge pages, but it maps at one place at a time, whole,
    /// and cannot be exported or imported ([`MemoryError::Private`]).
    ///
    /// ```
    /// use hetero_memory::vmm::{Access, Granularity, MemoryContext};
    /// let ctx = MemoryContext::unlimited("doc");
    /// let h = ctx.create_private(2 << 20, Granularity::Huge2M)?;
    /// h.commit(0, 2 << 20)?; // pages present
    /// let mut r = ctx.reserve(4 << 20, Granularity::Huge2M)?;
    /// r.map(0, &h, 0, 2 << 20, Access::ReadWrite)?;
    /// assert!(r.map(2 << 20, &h, 0, 2 << 20, Access::ReadWrite).is_err()); // one place
    /// # Ok::<(), hetero_memory::MemoryError>(())
    /// ```
    pub fn create_private(
        &self,
        size: usize,
        granularity: Granularity,
    ) -> Result<PhysicalMemory, MemoryError> {
        PhysicalMemory::create_private(size, granularity, &self.inner)
    }

    /// Lets this context map `handle` (of any context of this process): a new
    /// handle to the same memory, owned by this context. A private handle
    /// cannot be ([`MemoryError::Private`]).
    pub fn import(&self, handle: &PhysicalMemory) -> Result<PhysicalMemory, MemoryError> {
        let fd = handle.inner.shared_fd("import of a handle")?;
        let fd = fd.try_clone_to_owned().map_err(|e| MemoryError::Os {
            what: "dup of a physical handle".into(),
            source: e,
            hint: "the process is out of file descriptors",
        })?;
        Ok(PhysicalMemory::from_shared(
            fd,
            handle.size(),
            handle.granularity(),
            handle.page_kind(),
            self.inner.id,
        ))
    }
}

/// The figures of every live memory context of this process.
pub fn contexts() -> Vec<ContextStats> {
    let reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.iter()
        .filter_map(Weak::upgrade)
        .map(|c| c.stats())
        .collect()
}
