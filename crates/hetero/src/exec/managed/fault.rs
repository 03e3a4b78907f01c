//! Host faults on managed buffers: the view of a managed buffer the host
//! dereferences directly (`ManagedBuffer::host_ptr`), kept coherent by
//! protecting its pages and resolving the host's faults on them.
//!
//! # Memory
//! A buffer's host copy is a memfd mapped twice: the *alias*, which the
//! runtime's engines and guards use (never protected, so the runtime never
//! faults), and the *view*, the user's (protected per page). Both map the
//! same page cache, so a copy back through the alias is what the view shows
//! once its page is opened.
//!
//! # Page access (one word per page, `pages`)
//! `CLOSED`: the view may not touch the page (its host data is stale, or
//! queued work writes it); `READ`: reads only (a device holds a copy, or
//! queued work reads the host copy); `WRITE`: no restriction. The runtime
//! only ever *lowers* a page's access, under its managed lock, before it
//! submits the work that needs it (`HostView::close`); only the fault path
//! raises it: the fast path (below) for pages whose word already allows the
//! access and only lacks the mapping, the service for everything else, after
//! checking the page state under the managed lock. So the view never shows
//! bytes that queued work may still change.
//!
//! Two mechanisms apply a word to the view. `userfaultfd` (the default): the
//! view is registered for missing, minor and write-protect faults with
//! `UFFD_FEATURE_SIGBUS`, so a fault is a SIGBUS in the faulting thread;
//! closing zaps the view's page table entries (`MADV_DONTNEED`, the page
//! cache keeps the data), `READ` is `UFFDIO_WRITEPROTECT`, opening is
//! `UFFDIO_CONTINUE` (with `MODE_WP` for `READ`). `mprotect` (where
//! userfaultfd is refused, or `HETERO_MANAGED_FAULTS=mprotect`): the view's
//! protection is the word (`PROT_NONE` / `PROT_READ` / read-write) and a
//! fault is a SIGSEGV.
//!
//! # The handler is async-signal-safe
//! - It allocates nothing and takes no lock: it finds the view in `REGISTRY`,
//!   a fixed array of atomics filled in when a view is made (a per-slot user
//!   count keeps a view alive while a handler reads it; dropping a view
//!   empties its slot, then waits for the count to reach zero), and the page
//!   in the view's array of atomic words.
//! - Fast path (the word allows the access, the page is only unmapped, as on
//!   first touch): it sets the word's `BUSY` bit (a compare-and-swap; the
//!   runtime's `close` waits for the bit to clear before it lowers the word,
//!   so a page is never opened past a close), maps the page
//!   (`UFFDIO_CONTINUE`, or `UFFDIO_COPY` of zeros where the memfd has no
//!   page yet), clears the bit and returns: the access is retried. Under
//!   mprotect the protection is the word, so a fault on an open page is a
//!   write to a `READ` page (the slow path) or a race with an opening.
//! - Slow path (the page needs device work: a copy back, or a wait for queued
//!   work): it posts the request in a fixed slot of `REQUESTS`, wakes the
//!   service thread and sleeps on the slot (futex syscalls only). The service
//!   thread, an ordinary thread, takes the managed lock, waits for the page's
//!   queued work, copies it back and opens it, then wakes the faulting thread.
//!
//! # Why the slow path cannot deadlock
//! The faulting thread waits for the service, the service for the managed
//! lock, the buffer's migration stream, and device work. The faulting thread
//! holds none of them: the runtime never touches a view (it uses the alias),
//! so a fault happens in user code, and the migration stream is the
//! runtime's own. Device work never waits for a host fault: engines use the
//! alias too. Two cases remain, and both are refused with a message and an
//! abort instead of hanging: a fault on an engine thread (a kernel or host
//! callback touching a view: the service may wait for that very engine), and
//! a fault whose page waits for a host guard while the faulting thread holds
//! a guard (`thread_holds`; the guard may be the one waited for).
//!
//! The service keeps the buffer alive while it resolves a fault and drops it
//! only after answering (`Resolver`): a last handle dropped meanwhile would
//! otherwise unregister the view on the service thread, waiting for the very
//! thread it has yet to answer.
//!
//! A fault on memory no view covers goes to the handler that was installed
//! before (Rust's stack-overflow check, a sanitizer's); where that is the
//! default action, the default is restored and the handler returns, so the
//! fault happens again and kills the process as it would have.
//!
//! # Tree prefetch
//! After two faults on consecutive pages of one 2 MiB block, a fault brings
//! the rest of the block with it (UVM's prefetch after sequential faults).

use std::cell::Cell;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::OnceLock;

/// The view may not touch the page.
pub(crate) const CLOSED: u32 = 0;
/// The view may read the page.
pub(crate) const READ: u32 = 1;
/// The view may read and write the page.
pub(crate) const WRITE: u32 = 2;
/// A handler is mapping the page (set with the access, cleared after).
const BUSY: u32 = 4;
/// The view may have written the page since the runtime last looked: it
/// was mapped writable. `close` reports it, and the page state counts the
/// page as touched (its data is no longer all zero).
const DIRTY: u32 = 8;
/// The access bits of a word.
const ACCESS: u32 = 3;
/// Hint: the view's page may be write-protected (`READ` was applied since
/// it was last cleared), so opening it to `WRITE` must clear that first.
const WPD: u32 = 16;
/// Hint: the view mapped this page before, so the memfd holds it and
/// `UFFDIO_CONTINUE` maps it (else `UFFDIO_COPY` of zeros is tried first).
const FILLED: u32 = 32;
/// The hints a word keeps across access changes.
const HINTS: u32 = WPD | FILLED;

/// UVM's prefetch block.
pub const TREE_BYTES: usize = 2 << 20;

/// How host faults are taken in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultMechanism {
    /// `userfaultfd` with `UFFD_FEATURE_SIGBUS`: faults are SIGBUS in the
    /// faulting thread.
    Userfaultfd,
    /// `mprotect` and SIGSEGV, for the reason given.
    Mprotect {
        /// Why userfaultfd is not used.
        reason: String,
    },
}

/// What the service answers a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Answer {
    /// The pages are open: retry the access.
    Resolved = 1,
    /// No live managed buffer covers the page: the normal crash.
    NotManaged = 2,
    /// The page waits for a guard while this thread holds one.
    WouldDeadlock = 3,
    /// The device failed the copy back.
    Failed = 4,
}

/// What resolves a slow fault on pages `first..first + n` (`write`: the
/// access writes; `holds`: the faulting thread holds host guards). Called on
/// the service thread. Besides the answer it returns what it kept alive
/// meanwhile (the buffer), dropped only after the faulting thread was
/// answered: dropping the buffer's last handle unregisters its view, which
/// waits for that thread.
pub(crate) type Resolver =
    Box<dyn Fn(&HostView, usize, usize, bool, bool) -> Resolved + Send + Sync>;

/// A resolver's answer and what it kept alive.
pub(crate) type Resolved = (Answer, Option<Box<dyn std::any::Any + Send>>);

// userfaultfd's ABI (linux/userfaultfd.h).
const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_MISSING_SHMEM: u64 = 1 << 5;
const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
const UFFD_FEATURE_MINOR_SHMEM: u64 = 1 << 10;
const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const UFFDIO_CONTINUE_MODE_WP: u64 = 1 << 1;
const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;

/// What a page the memfd never held is filled from (`UFFDIO_ZEROPAGE` is
/// anonymous memory's only).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
#[repr(C)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}
const UFFDIO_API_IOCTL: u64 = iowr(0x3F, size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, size_of::<UffdioRegister>());
const UFFDIO_COPY: u64 = iowr(0x03, size_of::<UffdioCopy>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, size_of::<UffdioWriteprotect>());
const UFFDIO_CONTINUE: u64 = iowr(0x07, size_of::<UffdioContinue>());

/// `ioctl(fd, req, arg)`: 0 or the errno. Async-signal-safe (one syscall;
/// errno is read at once, on this thread).
fn ioctl<T>(fd: i32, req: u64, arg: &mut T) -> i32 {
    // SAFETY: `arg` is the structure `req` names, alive for the call.
    let r = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if r == 0 {
        0
    } else {
        // SAFETY: errno is thread-local and set by the failed call.
        unsafe { *libc::__errno_location() }
    }
}

/// The process's fault setup, made once.
struct Global {
    /// The userfaultfd every view registers with, if any.
    uffd: Option<OwnedFd>,
    reason: Option<String>,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();
/// `GLOBAL`'s userfaultfd for the handler (-1 when none).
static UFFD: AtomicI32 = AtomicI32::new(-1);
/// The handlers in place before ours: SIGBUS, SIGSEGV.
static PREVIOUS: OnceLock<[libc::sigaction; 2]> = OnceLock::new();

fn global() -> &'static Global {
    GLOBAL.get_or_init(|| {
        let (uffd, reason) = match open_uffd() {
            Ok(fd) => (Some(fd), None),
            Err(reason) => {
                tracing::info!(%reason, "managed host faults use mprotect");
                (None, Some(reason))
            }
        };
        if let Some(fd) = &uffd {
            UFFD.store(fd.as_raw_fd(), Release);
        }
        install_handlers();
        std::thread::Builder::new()
            .name("hetero-faults".into())
            .spawn(service)
            .expect("starting the managed fault service thread");
        Global { uffd, reason }
    })
}

/// A userfaultfd with SIGBUS delivery and what shmem views need, or why not.
fn open_uffd() -> Result<OwnedFd, String> {
    if let Ok(v) = std::env::var("HETERO_MANAGED_FAULTS") {
        if v == "mprotect" {
            return Err("HETERO_MANAGED_FAULTS=mprotect".into());
        }
    }
    use rustix::mm::{userfaultfd, UserfaultfdFlags};
    // SAFETY: a new descriptor; nothing is registered with it yet.
    let fd = unsafe { userfaultfd(UserfaultfdFlags::CLOEXEC | UserfaultfdFlags::NONBLOCK) }
        .map_err(|e| format!("userfaultfd(2) refused: {e} (vm.unprivileged_userfaultfd?)"))?;
    let mut api = UffdioApi {
        api: UFFD_API,
        features: UFFD_FEATURE_SIGBUS
            | UFFD_FEATURE_MISSING_SHMEM
            | UFFD_FEATURE_MINOR_SHMEM
            | UFFD_FEATURE_WP_HUGETLBFS_SHMEM
            | UFFD_FEATURE_WP_UNPOPULATED,
        ioctls: 0,
    };
    match ioctl(fd.as_raw_fd(), UFFDIO_API_IOCTL, &mut api) {
        0 => Ok(fd),
        e => Err(format!(
            "UFFDIO_API with SIGBUS, shmem minor and write-protect faults refused (errno {e}): \
             a kernel before 6.4"
        )),
    }
}

/// The mechanism this process uses (set up on first use).
pub fn mechanism() -> FaultMechanism {
    match &global().reason {
        None => FaultMechanism::Userfaultfd,
        Some(r) => FaultMechanism::Mprotect { reason: r.clone() },
    }
}

// ---- The registry of views (read by the handler) ----

struct Slot {
    taken: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    view: AtomicPtr<HostView>,
    users: AtomicU32,
}

const SLOTS: usize = 4096;
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    taken: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    view: AtomicPtr::new(std::ptr::null_mut()),
    users: AtomicU32::new(0),
};
static REGISTRY: [Slot; SLOTS] = [EMPTY_SLOT; SLOTS];
/// One past the highest slot ever taken (the handler scans below it).
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// A view found by the handler, kept alive while this lives.
struct Found {
    slot: &'static Slot,
    view: *const HostView,
}

impl Found {
    fn view(&self) -> &HostView {
        // SAFETY: the slot's user count is held: the view's drop waits for it.
        unsafe { &*self.view }
    }
}

impl Drop for Found {
    fn drop(&mut self) {
        self.slot.users.fetch_sub(1, AcqRel);
    }
}

fn lookup(addr: usize) -> Option<Found> {
    for slot in &REGISTRY[..HIGH.load(Acquire).min(SLOTS)] {
        let v = slot.view.load(Acquire);
        if v.is_null() || addr < slot.start.load(Acquire) || addr >= slot.end.load(Acquire) {
            continue;
        }
        slot.users.fetch_add(1, AcqRel);
        if slot.view.load(Acquire) == v {
            return Some(Found { slot, view: v });
        }
        slot.users.fetch_sub(1, AcqRel);
    }
    None
}

// ---- Views ----

/// A managed buffer's host copy (memfd), its alias and its view.
pub(crate) struct HostView {
    _fd: OwnedFd,
    alias: NonNull<u8>,
    view: NonNull<u8>,
    len: usize,
    page_bytes: usize,
    /// One access word per page (`CLOSED` / `READ` / `WRITE`, `BUSY`).
    pages: Box<[AtomicU32]>,
    /// Registered with the process's userfaultfd (else `mprotect`).
    uffd: bool,
    /// Registry slot (`usize::MAX`: none).
    slot: AtomicUsize,
    resolver: OnceLock<Resolver>,
    /// The page after the last fault's (for the tree prefetch).
    next: AtomicUsize,
    tree: AtomicBool,
    faults: AtomicU64,
}

// SAFETY: the mappings are owned by this value; who touches which bytes
// when is the page words' protocol (module doc) and the page table's.
unsafe impl Send for HostView {}
// SAFETY: as above; every field shared between threads is atomic or set once.
unsafe impl Sync for HostView {}

impl HostView {
    /// A host copy of `pages` pages of `page_bytes`, zero, every page `WRITE`.
    pub(crate) fn new(pages: usize, page_bytes: usize) -> Result<HostView, String> {
        let g = global();
        let len = (pages * page_bytes).max(4096);
        use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
        use rustix::mm::{MapFlags, ProtFlags};
        let fd = memfd_create("hetero-managed", MemfdFlags::CLOEXEC)
            .map_err(|e| format!("memfd_create for a managed buffer's host copy: {e}"))?;
        ftruncate(&fd, len as u64).map_err(|e| format!("sizing the host copy to {len}: {e}"))?;
        let map = || {
            // SAFETY: a new shared mapping of our memfd at an address the
            // kernel chooses aliases nothing of Rust's.
            unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED,
                    &fd,
                    0,
                )
            }
            .map_err(|e| format!("mapping the host copy ({len} bytes): {e}"))
            .and_then(|p| NonNull::new(p.cast::<u8>()).ok_or_else(|| "mmap gave null".into()))
        };
        let alias = map()?;
        let view = map()?;
        let mut uffd = false;
        if let Some(u) = &g.uffd {
            let mut reg = UffdioRegister {
                range: UffdioRange {
                    start: view.as_ptr() as u64,
                    len: len as u64,
                },
                mode: UFFDIO_REGISTER_MODE_MISSING
                    | UFFDIO_REGISTER_MODE_MINOR
                    | UFFDIO_REGISTER_MODE_WP,
                ioctls: 0,
            };
            match ioctl(u.as_raw_fd(), UFFDIO_REGISTER, &mut reg) {
                0 => uffd = true,
                e => tracing::info!(
                    errno = e,
                    "UFFDIO_REGISTER refused: this view uses mprotect"
                ),
            }
        }
        let hv = HostView {
            _fd: fd,
            alias,
            view,
            len,
            page_bytes,
            // Under mprotect the view starts writable: it may write at once.
            pages: (0..pages)
                .map(|_| AtomicU32::new(if uffd { WRITE } else { WRITE | DIRTY }))
                .collect(),
            uffd,
            slot: AtomicUsize::new(usize::MAX),
            resolver: OnceLock::new(),
            next: AtomicUsize::new(usize::MAX),
            tree: AtomicBool::new(true),
            faults: AtomicU64::new(0),
        };
        // A new view maps nothing: with userfaultfd its first touch of each
        // page faults (minor, once the alias's page-locking filled the page
        // cache), which the fast path maps.
        Ok(hv)
    }

    /// Enters the view in the registry with what resolves its slow faults.
    /// Until then a fault on it is the normal crash.
    pub(crate) fn register(&self, resolver: Resolver) -> Result<(), String> {
        let _ = self.resolver.set(resolver);
        for (i, slot) in REGISTRY.iter().enumerate() {
            if slot
                .taken
                .compare_exchange(false, true, AcqRel, Acquire)
                .is_ok()
            {
                slot.start.store(self.view.as_ptr() as usize, Release);
                slot.end
                    .store(self.view.as_ptr() as usize + self.len, Release);
                slot.view
                    .store(self as *const HostView as *mut HostView, Release);
                HIGH.fetch_max(i + 1, AcqRel);
                self.slot.store(i, Release);
                return Ok(());
            }
        }
        Err(format!(
            "{SLOTS} managed buffers with host views are alive: drop some before making more"
        ))
    }

    /// The runtime's mapping (never protected).
    pub(crate) fn alias(&self) -> NonNull<u8> {
        self.alias
    }

    /// The user's mapping.
    pub(crate) fn view(&self) -> NonNull<u8> {
        self.view
    }

    /// Bytes mapped (whole pages, at least 4 KiB).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Allocates the host copy's pages of `off..off + len` (zero where the
    /// memfd had none) ahead of a copy back into them: one call instead of
    /// a page fault per 4 KiB in the copy engine.
    pub(crate) fn populate(&self, off: usize, len: usize) {
        let len = len.min(self.len.saturating_sub(off));
        if len == 0 {
            return;
        }
        let r = rustix::fs::fallocate(
            &self._fd,
            rustix::fs::FallocateFlags::empty(),
            off as u64,
            len as u64,
        );
        if let Err(e) = r {
            // The copy allocates them by faulting instead.
            tracing::debug!(error = %e, "allocating a managed host copy's pages ahead failed");
        }
    }

    /// Signals handled on this view so far.
    pub(crate) fn faults(&self) -> u64 {
        self.faults.load(Relaxed)
    }

    /// Turns the 2 MiB tree prefetch on (the default) or off.
    pub(crate) fn set_tree(&self, on: bool) {
        self.tree.store(on, Relaxed);
    }

    /// Lowers pages `range` to at most `access` (`CLOSED` or `READ`) before
    /// work that needs it is submitted; `dirty` hears of each page the view
    /// may have written since. Call with the managed lock held.
    pub(crate) fn close(
        &self,
        range: std::ops::Range<usize>,
        access: u32,
        mut dirty: impl FnMut(usize),
    ) {
        let mut run: Option<std::ops::Range<usize>> = None;
        for p in range {
            let word = &self.pages[p];
            let lowered = loop {
                let w = word.load(Acquire);
                if w & BUSY != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let lower = w & ACCESS > access;
                if !lower && w & DIRTY == 0 {
                    break false;
                }
                let wp = if access == READ && lower { WPD } else { 0 };
                let new = (w & ACCESS).min(access) | (w & HINTS) | wp;
                if word.compare_exchange(w, new, AcqRel, Acquire).is_ok() {
                    if w & DIRTY != 0 {
                        dirty(p);
                    }
                    break lower;
                }
            };
            match (&mut run, lowered) {
                (Some(r), true) if r.end == p => r.end = p + 1,
                (_, true) => {
                    if let Some(r) = run.take() {
                        self.protect(r, access);
                    }
                    run = Some(p..p + 1);
                }
                _ => {}
            }
        }
        if let Some(r) = run {
            self.protect(r, access);
        }
    }

    /// Applies a lowered access to the view.
    fn protect(&self, pages: std::ops::Range<usize>, access: u32) {
        let (off, len) = self.bytes_of(&pages);
        if self.uffd {
            if access == CLOSED {
                self.zap(off, len);
            } else {
                self.write_protect(off, len, true);
            }
        } else {
            self.mprotect(off, len, access);
        }
    }

    /// Raises pages `range` to `access` and maps them (the service, under
    /// the managed lock, after it made them current).
    pub(crate) fn open(&self, range: std::ops::Range<usize>, access: u32) {
        for p in range {
            let word = &self.pages[p];
            loop {
                let w = word.load(Acquire);
                if w & BUSY != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                if word.compare_exchange(w, w | BUSY, AcqRel, Acquire).is_ok() {
                    break;
                }
            }
            let w = word.load(Relaxed);
            self.map(p, access, w);
            word.store(access | opened_bits(w, access), Release);
        }
    }

    fn bytes_of(&self, pages: &std::ops::Range<usize>) -> (usize, usize) {
        let off = pages.start * self.page_bytes;
        let end = (pages.end * self.page_bytes).min(self.len);
        (off, end - off)
    }

    /// Maps page `p` into the view at `access`: whether anything changed
    /// (false: it was mapped already, so a fault on it was a write to a
    /// `READ` page, or a race with another thread's fault). Async-signal-safe.
    fn map(&self, p: usize, access: u32, hints: u32) -> bool {
        let (off, len) = self.bytes_of(&(p..p + 1));
        if !self.uffd {
            self.mprotect(off, len, access);
            return true;
        }
        let fd = UFFD.load(Acquire);
        if access == WRITE && hints & WPD != 0 {
            self.write_protect(off, len, false);
        }
        // A page the view never mapped is most likely a hole: zeros first.
        let mut zeros_first = hints & FILLED == 0;
        let base = self.view.as_ptr() as u64 + off as u64;
        let mut done = 0u64;
        let mut changed = false;
        while done < len as u64 {
            if zeros_first {
                match self.fill_zeros(fd, base + done, len as u64 - done, access) {
                    Fill::Done(n) => {
                        changed = true;
                        done += n;
                        continue;
                    }
                    Fill::Exists => zeros_first = false,
                    Fill::Again => continue,
                    Fill::Failed => return changed,
                }
            }
            let mut c = UffdioContinue {
                range: UffdioRange {
                    start: base + done,
                    len: len as u64 - done,
                },
                mode: if access == READ {
                    UFFDIO_CONTINUE_MODE_WP
                } else {
                    0
                },
                mapped: 0,
            };
            let e = ioctl(fd, UFFDIO_CONTINUE, &mut c);
            if e == 0 {
                return true;
            }
            if c.mapped > 0 {
                done += c.mapped as u64;
                changed = true;
                continue;
            }
            match e {
                libc::EAGAIN => continue,
                libc::EEXIST => done += 4096,
                // Not in the page cache (the memfd's hole, never written):
                // zeros, allocated into it.
                _ => zeros_first = true,
            }
        }
        changed
    }

    /// `UFFDIO_COPY` of zeros into up to `len` bytes at `at` (one chunk).
    /// Async-signal-safe.
    fn fill_zeros(&self, fd: i32, at: u64, len: u64, access: u32) -> Fill {
        let chunk = len.min(ZEROS.len() as u64);
        let mut z = UffdioCopy {
            dst: at,
            src: ZEROS.as_ptr() as u64,
            len: chunk,
            mode: if access == READ {
                UFFDIO_COPY_MODE_WP
            } else {
                0
            },
            copy: 0,
        };
        match ioctl(fd, UFFDIO_COPY, &mut z) {
            0 => Fill::Done(chunk),
            _ if z.copy > 0 => Fill::Done(z.copy as u64),
            libc::EAGAIN => Fill::Again,
            // The memfd holds the page (or the view maps it): continue it.
            libc::EEXIST => Fill::Exists,
            // Cannot be filled: the access faults again and the service is
            // asked.
            _ => Fill::Failed,
        }
    }

    fn zap(&self, off: usize, len: usize) {
        // SAFETY: inside our view; MADV_DONTNEED on a shared mapping drops
        // its page table entries only (the memfd keeps the data), which is
        // what closing asks.
        let r = unsafe {
            rustix::mm::madvise(
                self.view.as_ptr().add(off).cast(),
                len,
                rustix::mm::Advice::LinuxDontNeed,
            )
        };
        if let Err(e) = r {
            tracing::error!(error = %e, "closing managed host pages failed");
        }
    }

    fn write_protect(&self, off: usize, len: usize, on: bool) {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange {
                start: self.view.as_ptr() as u64 + off as u64,
                len: len as u64,
            },
            mode: if on { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
        };
        let _ = ioctl(UFFD.load(Acquire), UFFDIO_WRITEPROTECT, &mut wp);
    }

    fn mprotect(&self, off: usize, len: usize, access: u32) {
        use rustix::mm::MprotectFlags;
        let flags = match access {
            CLOSED => MprotectFlags::empty(),
            READ => MprotectFlags::READ,
            _ => MprotectFlags::READ | MprotectFlags::WRITE,
        };
        // SAFETY: inside our view; only its protection changes. Called by the
        // runtime and the service thread only, never in the handler.
        let r = unsafe { rustix::mm::mprotect(self.view.as_ptr().add(off).cast(), len, flags) };
        if let Err(e) = r {
            // Each protection run is a mapping of its own: past
            // vm.max_map_count the kernel refuses more.
            tracing::error!(error = %e, "protecting a managed host view failed (vm.max_map_count?)");
        }
    }

    /// The pages a fault on page `p` brings: the rest of its 2 MiB block
    /// after a fault on the page before it, else `p` alone.
    fn tree_range(&self, p: usize) -> std::ops::Range<usize> {
        let prev = self.next.swap(p + 1, AcqRel);
        let per_block = (TREE_BYTES / self.page_bytes).max(1);
        if per_block > 1 && self.tree.load(Relaxed) && prev == p && !p.is_multiple_of(per_block) {
            let end = ((p / per_block + 1) * per_block).min(self.pages.len());
            self.next.store(end, Release);
            p..end
        } else {
            p..p + 1
        }
    }

    /// The fast path for pages `range` (userfaultfd only): maps those whose
    /// word allows an access and lacks only the mapping. `None`: the first
    /// page is done, retry the access; `Some(write)`: it needs the service
    /// (`write`: the access writes a `READ` page). Async-signal-safe.
    fn fast(&self, range: std::ops::Range<usize>) -> Option<bool> {
        let first = range.start;
        let mut need = None;
        for p in range {
            let word = &self.pages[p];
            let w = word.load(Acquire);
            if w & BUSY != 0 {
                // Another thread maps it.
                continue;
            }
            let access = w & ACCESS;
            if access == CLOSED {
                if p == first {
                    need = Some(false);
                }
                continue;
            }
            if !self.uffd {
                // The protection is the word already: a fault on a `READ`
                // page is a write; on a `WRITE` page, a race with an opening.
                if p == first && access == READ {
                    need = Some(true);
                }
                continue;
            }
            if word.compare_exchange(w, w | BUSY, AcqRel, Acquire).is_err() {
                continue;
            }
            let changed = self.map(p, access, w);
            word.store(access | opened_bits(w, access), Release);
            if p == first && !changed && access == READ {
                // Mapped read-only already: the access writes.
                need = Some(true);
            }
        }
        need
    }
}

impl HostView {
    /// Takes the view out of the registry (a fault on it is then the normal
    /// crash); returns once no handler reads it. Call with no lock held.
    pub(crate) fn unregister(&self) {
        let i = self.slot.swap(usize::MAX, AcqRel);
        if i == usize::MAX {
            return;
        }
        let slot = &REGISTRY[i];
        slot.view.store(std::ptr::null_mut(), Release);
        while slot.users.load(Acquire) != 0 {
            std::thread::yield_now();
        }
        slot.start.store(0, Release);
        slot.end.store(0, Release);
        slot.taken.store(false, Release);
    }
}

impl Drop for HostView {
    fn drop(&mut self) {
        self.unregister();
        for p in [self.alias, self.view] {
            // SAFETY: our mappings; nothing reaches them any more (the
            // storages over the alias are gone, the view's user contract
            // ends with the buffer, the registry no longer names it).
            let _ = unsafe { rustix::mm::munmap(p.as_ptr().cast(), self.len) };
        }
    }
}

/// What `HostView::fill_zeros` did.
enum Fill {
    Done(u64),
    Exists,
    Again,
    Failed,
}

/// The bits a word keeps or gains when its page is mapped at `access`: dirty
/// once writable, filled, write-protected if read-only (cleared if opened
/// writable, which clears the protection).
fn opened_bits(w: u32, access: u32) -> u32 {
    let kept = w & (DIRTY | FILLED | WPD);
    match access {
        WRITE => (kept & !WPD) | DIRTY | FILLED,
        READ => kept | WPD | FILLED,
        _ => kept,
    }
}

// ---- Guards held by this thread (read by the handler) ----

thread_local! {
    static HOLDS: Cell<u32> = const { Cell::new(0) };
}

/// A host guard was taken (`+1`) or dropped (`-1`) on this thread.
pub(crate) fn note_hold(delta: i32) {
    let _ = HOLDS.try_with(|h| h.set(h.get().wrapping_add_signed(delta)));
}

fn thread_holds() -> bool {
    HOLDS.try_with(|h| h.get() > 0).unwrap_or(false)
}

// ---- The handler ----

fn install_handlers() {
    let sigs = [libc::SIGBUS, libc::SIGSEGV];
    // SAFETY: sigaction is plain data; zero is a valid value.
    let mut prev: [libc::sigaction; 2] = unsafe { std::mem::zeroed() };
    for (i, sig) in sigs.into_iter().enumerate() {
        // SAFETY: reads the current action into a valid structure.
        unsafe { libc::sigaction(sig, std::ptr::null(), &mut prev[i]) };
    }
    let _ = PREVIOUS.set(prev);
    for sig in sigs {
        // SAFETY: as above.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `sa` is a valid action whose handler only does
        // async-signal-safe things (module doc); the previous actions are
        // saved above, before ours can run.
        unsafe {
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let Some(found) = lookup(addr) else {
        return chain(sig, info, ctx);
    };
    let hv = found.view();
    hv.faults.fetch_add(1, Relaxed);
    let p = (addr - hv.view.as_ptr() as usize) / hv.page_bytes;
    if p >= hv.pages.len() {
        drop(found);
        return chain(sig, info, ctx);
    }
    let range = hv.tree_range(p);
    let Some(write) = hv.fast(range.clone()) else {
        return;
    };
    let now = hv.pages[p].load(Acquire);
    if now & BUSY != 0 || now & ACCESS == WRITE || (now & ACCESS == READ && !write) {
        // Opened meanwhile by another thread: retry the access.
        return;
    }
    if crate::exec::thread::on_engine_thread() {
        die(
            b"hetero: a kernel or host callback touched a managed buffer's host view on a page \
that needs device work; waiting would deadlock its engine. Use guards or declared arguments.\n",
        );
    }
    match post(found.view, p, range.end - p, write) {
        Answer::Resolved => {}
        Answer::NotManaged => {
            drop(found);
            chain(sig, info, ctx)
        }
        Answer::WouldDeadlock => die(
            b"hetero: a host touch of a managed page waits for work that waits for a host guard \
this thread holds; drop the guard first.\n",
        ),
        Answer::Failed => die(
            b"hetero: a managed page could not be brought back to the host: the device failed \
the copy.\n",
        ),
    }
}

/// The previous handler's turn, or the default action.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let i = usize::from(sig != libc::SIGBUS);
    let Some(prev) = PREVIOUS.get().map(|p| p[i]) else {
        return default_action(sig);
    };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return default_action(sig);
    }
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: an SA_SIGINFO handler has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler has this signature.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// Restores the default action: returning re-runs the access, which then
/// kills the process as the fault would have without us.
fn default_action(sig: libc::c_int) {
    // SAFETY: a zeroed sigaction with SIG_DFL is the default action.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

fn die(msg: &[u8]) -> ! {
    // SAFETY: write(2) and abort(3) are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::abort()
    }
}

// ---- Requests to the service thread ----

const FREE: u32 = 0;
const FILLING: u32 = 1;
const POSTED: u32 = 2;
const DONE: u32 = 3;

struct Request {
    state: AtomicU32,
    view: AtomicPtr<HostView>,
    page: AtomicUsize,
    pages: AtomicUsize,
    write: AtomicBool,
    holds: AtomicBool,
    answer: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_REQUEST: Request = Request {
    state: AtomicU32::new(FREE),
    view: AtomicPtr::new(std::ptr::null_mut()),
    page: AtomicUsize::new(0),
    pages: AtomicUsize::new(0),
    write: AtomicBool::new(false),
    holds: AtomicBool::new(false),
    answer: AtomicU32::new(0),
};
static REQUESTS: [Request; 64] = [EMPTY_REQUEST; 64];
static WAKE: AtomicU32 = AtomicU32::new(0);

/// Posts a slow fault and sleeps until the service answers. The caller's
/// `Found` keeps the view alive meanwhile. Async-signal-safe.
fn post(view: *const HostView, page: usize, pages: usize, write: bool) -> Answer {
    use rustix::thread::futex;
    loop {
        for r in &REQUESTS {
            if r.state
                .compare_exchange(FREE, FILLING, AcqRel, Acquire)
                .is_err()
            {
                continue;
            }
            r.view.store(view as *mut HostView, Relaxed);
            r.page.store(page, Relaxed);
            r.pages.store(pages, Relaxed);
            r.write.store(write, Relaxed);
            r.holds.store(thread_holds(), Relaxed);
            r.state.store(POSTED, Release);
            WAKE.fetch_add(1, AcqRel);
            let _ = futex::wake(&WAKE, futex::Flags::PRIVATE, 1);
            while r.state.load(Acquire) != DONE {
                let _ = futex::wait(&r.state, futex::Flags::PRIVATE, POSTED, None);
            }
            let a = match r.answer.load(Acquire) {
                1 => Answer::Resolved,
                2 => Answer::NotManaged,
                3 => Answer::WouldDeadlock,
                _ => Answer::Failed,
            };
            r.state.store(FREE, Release);
            return a;
        }
        // Every slot is taken: 64 threads fault at once.
        rustix::thread::sched_yield();
    }
}

/// The service thread: resolves posted faults, one at a time.
fn service() {
    use rustix::thread::futex;
    loop {
        let seen = WAKE.load(Acquire);
        let mut any = false;
        for r in &REQUESTS {
            if r.state.load(Acquire) != POSTED {
                continue;
            }
            any = true;
            // SAFETY: the posting thread holds the view's slot user count
            // until it sees DONE, so the view is alive.
            let hv = unsafe { &*r.view.load(Acquire) };
            let (page, pages) = (r.page.load(Relaxed), r.pages.load(Relaxed));
            let (write, holds) = (r.write.load(Relaxed), r.holds.load(Relaxed));
            let (answer, kept) = match hv.resolver.get() {
                Some(f) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    f(hv, page, pages, write, holds)
                }))
                .unwrap_or((Answer::Failed, None)),
                None => (Answer::NotManaged, None),
            };
            r.answer.store(answer as u32, Release);
            r.state.store(DONE, Release);
            let _ = futex::wake(&r.state, futex::Flags::PRIVATE, 1);
            drop(kept);
        }
        if !any {
            let _ = futex::wait(&WAKE, futex::Flags::PRIVATE, seen, None);
        }
    }
}
