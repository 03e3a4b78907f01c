//! Managed buffers: one buffer for the host and a device (`Device::alloc_managed`)
//! or every device of a context (`Context::alloc_managed`), coherent per page
//! (64 KiB by default). Kernels and copies declare what they read and write,
//! and the pages they cover are made resident on their device by copies
//! ordered before they start (on their stream's migration stream,
//! overlapping its earlier work); host guards copy pages back and hold them
//! while they live; hints prefetch and advise; past the device's capacity
//! pages are evicted. The page state machine, its ordering rules and
//! its lock are `exec/managed/mod.rs`; this file builds and submits the ops it
//! plans.
//!
//! Who touches what: the host reaches a managed buffer through a guard
//! (`read` / `write` and their `try_` forms), which waits for the queued work
//! on the pages it covers and, while it lives, is itself queued work on them
//! (a host event every later op on those pages waits for), or through its host
//! view (`host_ptr`, `as_slice`, `as_mut_slice`): on the emulated device a view
//! whose pages are closed before work that writes them is submitted and
//! reopened by host faults once current (`exec/managed/fault.rs`); elsewhere
//! the host copy itself, reached safely only through the `&mut self` slices,
//! which wait first. The device reaches it only through ops built here, each
//! on views of the page ranges it declared. So no host slice ever overlaps a
//! device write, on any backend.
//!
//! Several devices: a context's devices share one managed state (one
//! `Space`, one lock: see `exec/managed`), each device's copy its own memory
//! index. A page a kernel of device `e` needs comes from the host's copy, or,
//! where only another device `d` holds it, from `d`: one peer copy over the
//! context's direct path (the emulated peer link), or staged where there is
//! none (copied back to the host on a stream of `d`, then in on `e`'s), each
//! ordered after the page's queued work on either device by cross-device
//! memory waits. Copies back to the host run on a stream of the device that
//! holds the page.
//!
//! Graphs: a managed op recorded into a graph or command buffer is a node over
//! views of the device's copy plus what it declared (`record_op`); each
//! launch of the graph is one managed op touching all of it (`launch_graph`).
//!
//! Backends: on the host device a managed buffer is the host's memory, one
//! copy (nothing moves; the ordering is the same). On the emulated device the
//! host copy is a faulting view and the device copy a window of modelled
//! device memory (`exec/managed/window.rs`), and pages move by copies over the
//! modelled link on the copy engines. On a Vulkan device the device copy is
//! one device-local allocation of the whole buffer (no eviction) and the host
//! copy the same faulting view as on the emulated device, imported with
//! `VK_EXT_external_memory_host`, or pinned memory without host faults where
//! the driver lacks it; pages move by copies on its transfer lane.

use crate::api::buffer::{Arg, DeviceBuffer};
use crate::api::context::{Context, PeerPath};
use crate::exec::managed::fault::{self, Answer, HostView};
use crate::exec::managed::{
    view, window::Window, Access, Advice, DeviceCopy, DeviceFaultCost, Location, ManagedStats,
    MigrationReason, Move, Plan, Point, Space, Table, DEFAULT_PAGE_BYTES, HOST,
};
use crate::exec::op::{Body, CopyKind};
use crate::exec::storage::{Backing, MemoryKind, Registration, Storage};
use crate::exec::timeline::Timeline;
use crate::{Device, Error, Grid, Kernel, Result, Stream};
use bytemuck::Pod;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

/// Per device of a managed buffer (its members' order): the bytes a kernel
/// there using all of it copies in first, by the device they come from
/// (`None`: the host's copy, where no device's memory is the host's).
pub(crate) type CopiesIn = Vec<Vec<(Option<usize>, u64)>>;

/// Where each device's managed state is, by device id, kept while the device
/// exists (so its figures outlive its buffers).
static SPACES: Mutex<Vec<SpaceEntry>> = Mutex::new(Vec::new());

struct SpaceEntry {
    device: u64,
    alive: Weak<dyn std::any::Any + Send + Sync>,
    space: Arc<SpaceLock>,
    /// The device's memory index in `space`.
    mem: u8,
    /// The context whose devices share `space`, if any.
    context: Option<u64>,
}

/// The managed state of a device, or of a context's devices, behind its one
/// lock (see `exec/managed`).
///
/// A thread may hold the lock while its submission waits for ring room,
/// which only the device's engines make: so an engine thread (a host
/// callback) never takes it. Managed operations there are refused with
/// `WouldDeadlock` (`lock_for`), drops hand their part to another thread,
/// and the figures are read from a copy published at each unlock.
pub(crate) struct SpaceLock {
    state: Mutex<Space>,
    /// `Space::stats` (per memory) as of the last unlock.
    published: Mutex<Vec<ManagedStats>>,
}

/// The locked state; publishes its figures when it unlocks.
pub(crate) struct SpaceGuard<'a> {
    guard: MutexGuard<'a, Space>,
    published: &'a Mutex<Vec<ManagedStats>>,
}

impl std::ops::Deref for SpaceGuard<'_> {
    type Target = Space;
    fn deref(&self) -> &Space {
        &self.guard
    }
}

impl std::ops::DerefMut for SpaceGuard<'_> {
    fn deref_mut(&mut self) -> &mut Space {
        &mut self.guard
    }
}

impl Drop for SpaceGuard<'_> {
    fn drop(&mut self) {
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone_from(&self.guard.stats);
    }
}

impl SpaceLock {
    /// The state, off an engine thread (see the type's docs).
    fn lock(&self) -> SpaceGuard<'_> {
        debug_assert!(!crate::exec::thread::on_engine_thread());
        // The state is updated only after each submission succeeded, never
        // left half-changed by a panic between them.
        SpaceGuard {
            guard: self.state.lock().unwrap_or_else(|p| p.into_inner()),
            published: &self.published,
        }
    }

    /// The state for `op`; refused on an engine thread, where waiting for
    /// the lock could wait for this very engine.
    fn lock_for(&self, op: &'static str) -> Result<SpaceGuard<'_>> {
        if crate::exec::thread::on_engine_thread() {
            return Err(Error::WouldDeadlock(format!(
                "{op} from a host callback or kernel: managed memory's state may be held by a \
                 thread waiting for this engine; call it outside the callback"
            )));
        }
        Ok(self.lock())
    }

    /// Runs `f` on the state now, or, on an engine thread, on a thread of
    /// its own (a drop there must not wait for the lock).
    fn later(self: &Arc<Self>, f: impl FnOnce(&mut Space) + Send + 'static) {
        let me = self.clone();
        crate::exec::thread::off_engine("release managed memory", move || f(&mut me.lock()));
    }
}

impl SpaceLock {
    fn new() -> Arc<SpaceLock> {
        Arc::new(SpaceLock {
            state: Mutex::new(Space::default()),
            published: Mutex::new(Vec::new()),
        })
    }
}

/// The managed state `device` uses and its memory index there: its own
/// space, or its context's (shared by the context's devices, memory `i + 1`
/// for the context's `i`-th device; the host's memory on the host backend).
/// A device that had a space before joining a context moves to the
/// context's once that space holds no buffer (its figures come along).
fn space_of(device: &Device) -> Result<(Arc<SpaceLock>, u8)> {
    let mut spaces = SPACES.lock().unwrap_or_else(|p| p.into_inner());
    spaces.retain(|e| e.alive.strong_count() > 0);
    let ctx = device.context_shared();
    let at = spaces.iter().position(|e| e.device == device.id());
    // What the device's own space had (figures, throttling, fault model),
    // when it moves to its context's.
    let mut adopted = None;
    if let Some(i) = at {
        let e = &spaces[i];
        // Only a glance at the old space's state: a thread holding a space's
        // lock may wait for an engine whose callback waits for `SPACES`. A
        // busy or non-empty space keeps its device (an engine thread never
        // takes a space's lock at all).
        adopted = match ctx {
            Some(c) if e.context != Some(c.id()) && !crate::exec::thread::on_engine_thread() => {
                match e.space.state.try_lock() {
                    Ok(st) if st.tables.is_empty() => Some((
                        Space::stats_of(&st.stats, e.mem),
                        st.no_throttle & (1 << e.mem) != 0,
                        st.fault_models.get(&e.mem).cloned(),
                    )),
                    _ => None,
                }
            }
            _ => None,
        };
        if adopted.is_none() {
            return Ok((e.space.clone(), e.mem));
        }
    }
    let on_host = device.properties().backend == "host";
    let (space, mem, context) = match ctx {
        None => (SpaceLock::new(), if on_host { HOST } else { 1 }, None),
        Some(c) => {
            let i = c
                .topology()
                .devices
                .iter()
                .position(|d| d.id == device.id())
                .expect("a device is in its context's topology");
            if i + 1 >= crate::exec::managed::MAX_MEMORIES {
                return Err(Error::Managed {
                    op: "alloc_managed",
                    detail: format!(
                        "device {} is device {i} of its context; managed memory names at most \
                         {} devices of a context: use a context of fewer devices",
                        device.id(),
                        crate::exec::managed::MAX_MEMORIES - 1
                    ),
                });
            }
            let space = spaces
                .iter()
                .find(|e| e.context == Some(c.id()))
                .map(|e| e.space.clone())
                .unwrap_or_else(SpaceLock::new);
            let mem = if on_host { HOST } else { i as u8 + 1 };
            (space, mem, Some(c.id()))
        }
    };
    if let Some(i) = at {
        spaces.remove(i);
    }
    spaces.push(SpaceEntry {
        device: device.id(),
        alive: device.weak(),
        space: space.clone(),
        mem,
        context,
    });
    drop(spaces);
    if let Some((stats, no_throttle, fault_model)) = adopted {
        // The device's own (empty) space's figures and settings, taken into
        // its context's (not under `SPACES`: see above).
        space.later(move |st| {
            st.adopt_stats(mem, stats);
            if no_throttle {
                st.no_throttle |= 1 << mem;
            }
            if let Some(f) = fault_model {
                st.fault_models.insert(mem, f);
            }
        });
    }
    Ok((space, mem))
}

static NEXT_BUFFER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What every handle of one managed buffer shares.
pub(crate) struct Shared {
    id: u64,
    /// The devices the buffer is usable on: the one it was made on, or every
    /// device of its context (in the context's order).
    members: Vec<Member>,
    space: Arc<SpaceLock>,
    bytes: usize,
    page_bytes: usize,
    /// The host view that faults, where the devices have memory of their
    /// own (the emulated device; Vulkan, where the driver imports host
    /// memory); the members' `host` are its alias.
    view: Option<Arc<HostView>>,
    /// Which streams may use it (`Stream::attach`): `GLOBAL`, `HOST_ONLY`
    /// or the one stream's (device id, stream id).
    attached: Mutex<Attached>,
    /// Its state as task data (last writer, readers since), made by the
    /// first task that uses it (`api/task/data.rs`).
    pub(crate) task: Mutex<Option<Arc<crate::api::task::data::ManagedTask>>>,
}

/// `Shared::attached`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Attached {
    /// Every stream of its devices.
    Global,
    /// No stream: the host only.
    HostOnly,
    /// One stream: (device id, stream id).
    Stream(u64, u64),
}

/// Which streams may use a managed buffer ([`Stream::attach`], CUDA's
/// `cudaStreamAttachMemAsync` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// Every stream of its devices (the default).
    Global,
    /// Only the attaching stream: an op on another stream is
    /// `Error::Managed`, so no other stream can race it.
    Single,
    /// The host only: the pages come back to the host (on the attaching
    /// stream's migration stream, after the queued work on them) and, unless
    /// advised `ReadMostly`, the devices' copies go, so the buffer counts
    /// nothing against a device's managed capacity (on Vulkan a device copy
    /// is one allocation, which stays); an op on any stream is
    /// `Error::Managed` until it is attached again.
    Host,
}

/// One device of a managed buffer: its memory index and copies.
pub(crate) struct Member {
    device: Device,
    /// The device's memory index (`HOST` on the host device).
    mem: u8,
    /// The host's copy, as this device reaches it (the only copy on the
    /// host device).
    host: Arc<Storage>,
    /// The device's copy (`host` again on the host device).
    dev: Arc<Storage>,
    /// Where this device's copies back for host guards, host faults,
    /// AccessedBy refreshes, prefetches from other devices and staged
    /// migrations go.
    migration: OnceLock<Stream>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Out of the registry before anything is locked: unregistering waits
        // for handlers still reading the view.
        if let Some(v) = &self.view {
            v.unregister();
        }
        let id = self.id;
        self.space.later(move |st| st.remove(id));
    }
}

impl Shared {
    /// The device the buffer was made on (the context's first device).
    fn home(&self) -> &Member {
        &self.members[0]
    }

    /// The member that is device `id`.
    fn member(&self, id: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.device.id() == id)
    }

    /// The member whose copy is memory `mem` (a device's).
    fn member_at(&self, mem: u8) -> Option<&Member> {
        self.members.iter().find(|m| m.mem == mem)
    }

    fn migration_stream<'a>(&self, m: &'a Member) -> Result<&'a Stream> {
        if let Some(s) = m.migration.get() {
            return Ok(s);
        }
        let s = m.device.create_stream()?;
        s.set_name(format!(
            "managed buffer {} migrations on device {}",
            self.id,
            m.device.id()
        ));
        Ok(m.migration.get_or_init(|| s))
    }

    /// Memory index of a location, if this buffer has it.
    fn mem_of(&self, l: Location) -> Option<u8> {
        match l {
            Location::Host => Some(HOST),
            Location::Device(d) => self.member(d).map(|m| m.mem),
        }
    }

    /// The ids of the buffer's devices.
    fn device_ids(&self) -> Vec<u64> {
        self.members.iter().map(|m| m.device.id()).collect()
    }

    /// Whether any device of the buffer has memory of its own.
    fn moves(&self) -> bool {
        self.members.iter().any(|m| m.mem != HOST)
    }
}

/// A buffer the host and a device (or every device of a context:
/// [`Context::alloc_managed`]) use, moved between their memories by page
/// (64 KiB by default) as work declares it: like CUDA's managed memory,
/// without device-side faults. It starts zeroed.
///
/// - Kernels take it as [`Arg::managed_read`] / [`Arg::managed_write`] (or a
///   sub-range: only its pages move); before the kernel starts, the pages it
///   covers are copied to its device (on the stream's migration stream). A
///   write marks them dirty there and invalidates the host's copy.
/// - The host reads and writes it through guards ([`ManagedBuffer::read`],
///   [`ManagedBuffer::write`]) that wait for queued work on the pages they
///   cover and copy dirty pages back; the `try_` forms return
///   [`Error::BufferBusy`] instead of waiting.
/// - Conflicting accesses to a page take effect in submission order whatever
///   their streams (later work waits for earlier work on the same pages); so
///   no event is needed between streams that share a managed buffer.
/// - Hints: [`ManagedBuffer::prefetch`], [`ManagedBuffer::advise`].
///
/// ```
/// use hetero::{Arg, Device, Kernel};
/// let dev = Device::host().unwrap();
/// let s = dev.create_stream().unwrap();
/// let buf = dev.alloc_managed::<f32>(1024).unwrap();
/// buf.write(..).unwrap().fill(1.0);
/// let double = Kernel::new("double", |b| {
///     for x in b.write::<f32>(0) {
///         *x *= 2.0;
///     }
/// });
/// s.launch(&double, 4.into(), &[Arg::managed_write(&buf)]).unwrap();
/// assert!(buf.read(..).unwrap().iter().all(|&x| x == 2.0));
/// ```
pub struct ManagedBuffer<T: Pod> {
    pub(crate) shared: Arc<Shared>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> std::fmt::Debug for ManagedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedBuffer")
            .field("id", &self.shared.id)
            .field("len", &self.len)
            .field("elem", &std::any::type_name::<T>())
            .field("page_bytes", &self.shared.page_bytes)
            .field("devices", &self.shared.device_ids())
            .finish()
    }
}

/// A managed argument's buffer and element range, checked at launch.
#[derive(Clone, Copy)]
pub(crate) struct ManagedArg<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    pub(crate) len: usize,
    /// The range asked for, checked at launch ([`elem_span`]).
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// `range` of a buffer of `len` elements as (start, end), unchecked.
fn elems(len: usize, range: impl RangeBounds<usize>) -> (usize, usize) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start, end)
}

/// Elements `start..end` of a buffer of `len` as (start, count): an error
/// for a range that ends before it starts (it once read as empty: the op did
/// nothing, silently) or past the buffer.
fn elem_span(op: &'static str, len: usize, (start, end): (usize, usize)) -> Result<(usize, usize)> {
    if end < start {
        return Err(Error::InvalidArgument(format!(
            "{op}: range {start}..{end} (elements) ends before it starts; pass start..end with \
             start <= end"
        )));
    }
    crate::api::stream::check_range(op, len, start, end - start)?;
    Ok((start, end - start))
}

impl<'a> Arg<'a> {
    /// The kernel reads all of managed buffer `buf`; its pages are made
    /// resident on the kernel's device first.
    pub fn managed_read<T: Pod>(buf: &'a ManagedBuffer<T>) -> Self {
        Self::managed_read_range(buf, ..)
    }

    /// The kernel reads elements `range` of `buf` (it sees only them: element 0
    /// of its view is `range.start`); only their pages move.
    pub fn managed_read_range<T: Pod>(
        buf: &'a ManagedBuffer<T>,
        range: impl RangeBounds<usize>,
    ) -> Self {
        let (start, end) = elems(buf.len, range);
        Arg {
            storage: &buf.shared.home().dev,
            elem: crate::exec::kernel::ElemInfo::of::<T>(),
            write: false,
            managed: Some(ManagedArg {
                shared: &buf.shared,
                len: buf.len,
                start,
                end,
            }),
        }
    }

    /// The kernel writes all of `buf`, split across blocks as [`Arg::write`]
    /// splits a device buffer; its pages are made resident first (their
    /// current contents too: a kernel may read what it writes) and are dirty on
    /// the device afterwards.
    pub fn managed_write<T: Pod>(buf: &'a ManagedBuffer<T>) -> Self {
        Self::managed_write_range(buf, ..)
    }

    /// The kernel writes elements `range` of `buf` (its view starts at
    /// `range.start`).
    pub fn managed_write_range<T: Pod>(
        buf: &'a ManagedBuffer<T>,
        range: impl RangeBounds<usize>,
    ) -> Self {
        Arg {
            write: true,
            ..Self::managed_read_range(buf, range)
        }
    }
}

impl Device {
    /// A managed buffer of `len` elements with 64 KiB pages, zeroed, usable
    /// on this device and the host. (For one usable on every device of a
    /// context, see [`Context::alloc_managed`].)
    pub fn alloc_managed<T: Pod>(&self, len: usize) -> Result<ManagedBuffer<T>> {
        self.alloc_managed_with_page::<T>(len, DEFAULT_PAGE_BYTES)
    }

    /// A managed buffer whose coherence unit is `page_bytes` (a power of two
    /// from 4 KiB to 1 GiB).
    pub fn alloc_managed_with_page<T: Pod>(
        &self,
        len: usize,
        page_bytes: usize,
    ) -> Result<ManagedBuffer<T>> {
        let (space, mem) = space_of(self)?;
        alloc_on(&[(self.clone(), mem)], space, len, page_bytes)
    }
}

impl Context {
    /// A managed buffer of `len` elements with 64 KiB pages, zeroed, usable
    /// on the host and on every device of this context: as a kernel argument
    /// or in copies on a stream of any of them, pages move to that device
    /// first (from the host's copy, or from the device holding the only
    /// current one: over the context's peer link where it has one, staged
    /// through the host otherwise).
    ///
    /// The context's devices are of one backend (host, emulated or Vulkan);
    /// each keeps its own capacity and figures ([`Device::managed_stats`]).
    ///
    /// ```
    /// use hetero::{Arg, Context, Device, Kernel};
    /// let (a, b) = (Device::host().unwrap(), Device::host().unwrap());
    /// let ctx = Context::new(&[a.clone(), b.clone()]).unwrap();
    /// let buf = ctx.alloc_managed::<u32>(1024).unwrap();
    /// let inc = Kernel::new("inc", |blk| {
    ///     for x in blk.write::<u32>(0) {
    ///         *x += 1;
    ///     }
    /// });
    /// a.create_stream().unwrap().launch(&inc, 1.into(), &[Arg::managed_write(&buf)]).unwrap();
    /// b.create_stream().unwrap().launch(&inc, 1.into(), &[Arg::managed_write(&buf)]).unwrap();
    /// assert!(buf.read(..).unwrap().iter().all(|&x| x == 2));
    /// ```
    pub fn alloc_managed<T: Pod>(&self, len: usize) -> Result<ManagedBuffer<T>> {
        self.alloc_managed_with_page::<T>(len, DEFAULT_PAGE_BYTES)
    }

    /// [`Context::alloc_managed`] with a coherence unit of `page_bytes` (a
    /// power of two from 4 KiB to 1 GiB).
    pub fn alloc_managed_with_page<T: Pod>(
        &self,
        len: usize,
        page_bytes: usize,
    ) -> Result<ManagedBuffer<T>> {
        const OP: &str = "Context::alloc_managed";
        let ctx = self.shared();
        let mut devices = Vec::new();
        for d in &ctx.topology().devices {
            let Some(dev) = ctx.device(d.id) else {
                return Err(Error::Managed {
                    op: OP,
                    detail: format!(
                        "device {} of context {} was dropped; a context buffer needs every \
                         device of its context: keep them alive",
                        d.id,
                        self.id()
                    ),
                });
            };
            devices.push(dev);
        }
        let backend = devices[0].properties().backend;
        if let Some(other) = devices.iter().find(|d| d.properties().backend != backend) {
            return Err(Error::Managed {
                op: OP,
                detail: format!(
                    "context {} joins devices of backends {backend} and {}; a context's managed \
                     buffer needs devices of one backend (their copies share one host copy): \
                     use Device::alloc_managed on each, or a context of one kind",
                    self.id(),
                    other.properties().backend
                ),
            });
        }
        let mut space: Option<Arc<SpaceLock>> = None;
        let mut members: Vec<(Device, u8)> = Vec::new();
        for d in devices {
            let (s, mem) = space_of(&d)?;
            if let Some(first) = &space {
                if !Arc::ptr_eq(first, &s) {
                    return Err(Error::Managed {
                        op: OP,
                        detail: format!(
                            "devices {} and {} of context {} keep different managed state: \
                             one has managed buffers made before it joined the context; drop \
                             them first (a device's buffers and its context's share one state, \
                             for one capacity)",
                            members[0].0.id(),
                            d.id(),
                            self.id()
                        ),
                    });
                }
            }
            space.get_or_insert(s);
            members.push((d, mem));
        }
        let space = space.expect("a context has at least one device");
        alloc_on(&members, space, len, page_bytes)
    }
}

/// A host copy as each device of a buffer reaches it.
type HostCopies = Vec<Arc<Storage>>;

/// A managed buffer's host copy as a view that faults
/// (`exec/managed/fault.rs`), as each of `devices` reaches it (its alias
/// mapped for the device: `Backend::map_host`); `None` where a device cannot
/// reach such memory.
fn faulting_host(
    devices: &[(Device, u8)],
    bytes: usize,
    page_bytes: usize,
    op: &'static str,
) -> Result<Option<(Arc<HostView>, HostCopies)>> {
    let hv = Arc::new(
        HostView::new(bytes.div_ceil(page_bytes), page_bytes)
            .map_err(|detail| Error::Managed { op, detail })?,
    );
    let mut hosts = Vec::with_capacity(devices.len());
    for (d, _) in devices {
        let Some((addr, undo)) = d.backend().map_host(hv.alias().as_ptr(), hv.len()) else {
            return Ok(None);
        };
        hosts.push(Arc::new(Storage::registered(
            d.id(),
            hv.alias(),
            bytes,
            addr,
            Registration {
                _memory: Box::new(hv.clone()),
                undo: Some(undo),
            },
        )));
    }
    Ok(Some((hv, hosts)))
}

/// A Vulkan host copy without faults, as each of `devices` reaches it:
/// pinned memory of the one device, or, for several, host memory
/// registered with each (imported where the device shares the host's
/// memory).
fn pinned_host(devices: &[(Device, u8)], bytes: usize, op: &'static str) -> Result<HostCopies> {
    if let [(d, _)] = devices {
        let h = d.alloc_pinned::<u8>(bytes)?.storage;
        zero(&h);
        return Ok(vec![h]);
    }
    let w = Arc::new(Window::new(bytes).map_err(|detail| Error::Managed { op, detail })?);
    Ok(devices
        .iter()
        .map(|(d, _)| {
            let (addr, undo) = d.backend().register_host(w.ptr().as_ptr(), bytes);
            Arc::new(Storage::registered(
                d.id(),
                w.ptr(),
                bytes,
                addr,
                Registration {
                    _memory: Box::new(w.clone()),
                    undo: Some(undo),
                },
            ))
        })
        .collect())
}

/// A managed buffer usable on `devices` (each with its memory index in
/// `space`), all of one backend.
fn alloc_on<T: Pod>(
    devices: &[(Device, u8)],
    space: Arc<SpaceLock>,
    len: usize,
    page_bytes: usize,
) -> Result<ManagedBuffer<T>> {
    let op = "alloc_managed";
    if !page_bytes.is_power_of_two() || !(4096..=1 << 30).contains(&page_bytes) {
        return Err(Error::InvalidArgument(format!(
            "{op}: page size {page_bytes} bytes; give a power of two from 4096 to 1 GiB"
        )));
    }
    let bytes = Device::bytes_for::<T>(len)?;
    let first = &devices[0].0;
    let backend = first.properties().backend;
    let mut view = None;
    // Per device: the host copy as it reaches it, its own copy, its window.
    let mut copies: Vec<DeviceCopy> = Vec::new();
    let copy =
        |mem: u8, host: Arc<Storage>, dev: Arc<Storage>, window: Option<Arc<Window>>| DeviceCopy {
            mem,
            host,
            dev,
            window,
        };
    match backend {
        "host" => {
            let b = first.alloc::<T>(len)?;
            let s: Arc<Storage> = (*b.storage).clone();
            drop(b);
            zero(&s);
            for (_, mem) in devices {
                copies.push(copy(*mem, s.clone(), s.clone(), None));
            }
        }
        "emu" | "vulkan" => {
            // The host copy: a memfd the devices reach through its alias,
            // mapped for each (in an emulated device's IOMMU; imported with
            // VK_EXT_external_memory_host into a Vulkan driver) but not
            // page-locked (as CUDA's managed memory is not pinned): its pages
            // are allocated as they are first written; the user's view of it
            // faults (`exec/managed/fault.rs`). A Vulkan driver that cannot
            // import it gets memory it reaches instead, without faults.
            let hosts = match faulting_host(devices, bytes, page_bytes, op)? {
                Some((hv, hosts)) => {
                    view = Some(hv);
                    hosts
                }
                None if backend == "vulkan" => pinned_host(devices, bytes, op)?,
                None => {
                    return Err(Error::Managed {
                        op,
                        detail: "the emulated device refused to map the host copy".into(),
                    })
                }
            };
            for ((d, mem), host) in devices.iter().zip(hosts) {
                if backend == "emu" {
                    let w = Arc::new(
                        Window::new(bytes).map_err(|detail| Error::Managed { op, detail })?,
                    );
                    let mut s = Storage::from_parts(
                        d.id(),
                        MemoryKind::Device,
                        w.ptr(),
                        bytes,
                        Backing::Registered(Registration {
                            _memory: Box::new(w.clone()),
                            undo: None,
                        }),
                    );
                    s.set_device_memory(d.reach().device_addr_of(w.ptr().as_ptr()));
                    copies.push(copy(*mem, host, Arc::new(s), Some(w)));
                } else {
                    // A whole allocation of the device's own (zeroed: an
                    // untouched page is zero everywhere).
                    let dv = d.alloc::<u8>(bytes)?;
                    let s = d.create_stream()?;
                    s.fill(&dv, 0u8)?;
                    s.synchronize()?;
                    copies.push(copy(*mem, host, (*dv.storage).clone(), None));
                }
            }
        }
        other => {
            return Err(Error::Managed {
                op,
                detail: format!(
                    "the {other} backend has no managed memory yet: use DeviceBuffer with \
                     explicit copies there"
                ),
            })
        }
    }
    let id = NEXT_BUFFER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let members = devices
        .iter()
        .zip(&copies)
        .map(|((device, _), c)| Member {
            device: device.clone(),
            mem: c.mem,
            host: c.host.clone(),
            dev: c.dev.clone(),
            migration: OnceLock::new(),
        })
        .collect();
    space
        .lock_for(op)?
        .tables
        .insert(id, Table::new(bytes, page_bytes, copies));
    let shared = Arc::new(Shared {
        id,
        members,
        space,
        bytes,
        page_bytes,
        view,
        attached: Mutex::new(Attached::Global),
        task: Mutex::new(None),
    });
    if let Some(hv) = &shared.view {
        let weak = Arc::downgrade(&shared);
        hv.register(Box::new(move |hv, first, n, write, holds| {
            let Some(sh) = weak.upgrade() else {
                return (Answer::NotManaged, None);
            };
            let answer = resolve_fault(&sh, hv, first, n, write, holds);
            // The service drops it after answering (see `fault::Resolver`).
            (answer, Some(Box::new(sh) as Box<dyn std::any::Any + Send>))
        }))
        .map_err(|detail| Error::Managed { op, detail })?;
    }
    Ok(ManagedBuffer {
        shared,
        len,
        _t: PhantomData,
    })
}

impl Device {
    /// What managed memory on this device did so far: bytes each way, pages
    /// per reason, evictions, thrashing, resident bytes.
    /// Copies into and out of this device's memory count here, whichever
    /// buffer (one of this device, or of its context) they were for.
    pub fn managed_stats(&self) -> ManagedStats {
        let Ok((space, mem)) = space_of(self) else {
            return ManagedStats::default();
        };
        let published = space.published.lock().unwrap_or_else(|p| p.into_inner());
        Space::stats_of(&published, mem)
    }

    /// Turns thrash throttling and pinning on (the default) or off for this
    /// device's managed pages: off, eviction is least-recently-used order
    /// alone (thrash events are still counted in [`ManagedStats`]). For
    /// comparing the two; nothing already evicted changes.
    pub fn set_managed_thrash_throttling(&self, on: bool) {
        if let Ok((space, mem)) = space_of(self) {
            space.later(move |st| {
                if on {
                    st.no_throttle &= !(1 << mem);
                } else {
                    st.no_throttle |= 1 << mem;
                }
            });
        }
    }

    /// Models a device that migrates on its own page faults instead of by
    /// declared accesses, for comparing the two (`hetero bench managed`):
    /// with `Some(cost)`, the pages a kernel or copy needs are still found
    /// from its declared arguments (the model needs no real device faults),
    /// but they move as a faulting device moves them: on the op's own stream,
    /// after the work before it, each run of up to `cost.batch_faults` pages
    /// (one fault per page) first costing `cost.batch_ns` of fault service,
    /// so nothing overlaps. `None` (the default): declared-access migration.
    /// Modelled time is honoured in virtual time; in real time the service
    /// cost is not waited for.
    pub fn set_managed_fault_model(&self, cost: Option<DeviceFaultCost>) {
        if let Ok((space, mem)) = space_of(self) {
            space.later(move |st| match cost {
                Some(c) => {
                    let servicer = st.fault_models.get(&mem).map(|f| f.1.clone());
                    st.fault_models
                        .insert(mem, (c, servicer.unwrap_or_default()));
                }
                None => {
                    st.fault_models.remove(&mem);
                }
            });
        }
    }

    /// (budget, capacity, held by the pool) of a device with its own memory.
    fn managed_budget(&self) -> Option<(usize, usize, usize)> {
        // The host has one memory; a Vulkan device copy is allocated whole.
        if matches!(self.properties().backend, "host" | "vulkan") {
            return None;
        }
        let pool = self.pool();
        let capacity = pool.config().max_reserved;
        let held = pool.stats().reserved;
        Some((capacity.saturating_sub(held), capacity, held))
    }
}

/// Zeroes new managed memory the host can reach.
fn zero(s: &Storage) {
    if s.bytes() == 0 {
        return;
    }
    // SAFETY: a storage just allocated, host-visible, of `bytes()` bytes, that
    // no op has been given yet.
    unsafe { std::ptr::write_bytes(s.host_ptr(), 0, s.bytes()) };
}

impl<T: Pod> ManagedBuffer<T> {
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
        self.shared.bytes
    }

    /// The coherence unit, bytes.
    pub fn page_bytes(&self) -> usize {
        self.shared.page_bytes
    }

    /// The id of the device the buffer was made on (for a context's buffer,
    /// the context's first device).
    pub fn device_id(&self) -> u64 {
        self.shared.home().device.id()
    }

    /// The ids of the devices the buffer is usable on: its device, or every
    /// device of its context.
    pub fn device_ids(&self) -> Vec<u64> {
        self.shared.device_ids()
    }

    /// The buffer's id (what migration records name).
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Another handle to the buffer (the task layer keeps one per task).
    pub(crate) fn handle(&self) -> ManagedBuffer<T> {
        ManagedBuffer {
            shared: self.shared.clone(),
            len: self.len,
            _t: PhantomData,
        }
    }

    /// Per device of the buffer (in its members' order): the bytes a kernel
    /// there using all of it would copy in first, by the device they come
    /// from (`None`: the host's copy, where no device's memory is the host's).
    pub(crate) fn copies_in(&self, op: &'static str) -> Result<CopiesIn> {
        let sh = &self.shared;
        let mems: Vec<u8> = sh.members.iter().map(|m| m.mem).collect();
        let by_mem = {
            let st = sh.space.lock_for(op)?;
            match st.tables.get(&sh.id) {
                Some(t) => t.copies_in(&mems),
                None => vec![Vec::new(); mems.len()],
            }
        };
        Ok(by_mem
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .map(|(from, bytes)| (mems.iter().position(|&m| m == from), bytes))
                    .collect()
            })
            .collect())
    }

    /// The buffer's host view: memory the host dereferences directly, as
    /// CUDA code touches managed memory through a plain pointer.
    ///
    /// On a device with memory of its own (the emulated device; a Vulkan
    /// device whose driver imports host memory) the view's pages are
    /// protected unless current on the host: a touch of a page a
    /// kernel wrote (or is about to write) faults, waits for the queued work
    /// on it, copies it back and retries; a host write to a page a device
    /// holds a copy of faults once and makes the host's copy the only one
    /// (`exec/managed/fault.rs`). So a touch sees every op submitted before
    /// it, on any stream. On the host device the pointer is the buffer's one
    /// memory, and on a Vulkan driver without `VK_EXT_external_memory_host`
    /// its host copy as it stands: nothing faults there,
    /// so reach it through [`ManagedBuffer::as_slice`] /
    /// [`ManagedBuffer::as_mut_slice`], which wait and copy back.
    ///
    /// Dereferencing it is `unsafe`, and sound while: no op or guard submitted
    /// *after* the touch (by another thread, unordered with it) writes the
    /// elements touched, as for any memory shared between threads; no kernel
    /// or host callback dereferences it (a fault there that needs device work
    /// aborts with a message: waiting would deadlock the engine); a thread
    /// holding a host guard does not touch pages whose queued work waits for
    /// that guard (aborts likewise); and the buffer outlives the use (a touch
    /// after the drop is the normal crash).
    pub fn host_ptr(&self) -> *mut T {
        match &self.shared.view {
            Some(v) => v.view().as_ptr().cast(),
            None => self.shared.home().host.host_ptr().cast(),
        }
    }

    /// The buffer on the host as a slice. With host faults (the emulated
    /// device, Vulkan with imported host memory) the view itself: pages come
    /// back as they are touched. Without (the host device) it first waits for queued work that writes
    /// the buffer and copies dirty pages back. `&mut self`: no op can use the
    /// buffer while the slice lives.
    pub fn as_slice(&mut self) -> Result<&[T]> {
        let (ptr, len) = self.host_slice("ManagedBuffer::as_slice", false)?;
        // SAFETY: `len` elements of the host view (or host copy), aligned to a
        // page; while `&mut self` is borrowed no op or guard can be made for
        // the buffer, and work queued before is waited for (here, or by the
        // fault on each page it touches), so the elements do not change.
        Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// The buffer on the host as a mutable slice: as [`ManagedBuffer::as_slice`];
    /// without host faults it waits for every queued op on the buffer and
    /// makes the host's copy the only one.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        let (ptr, len) = self.host_slice("ManagedBuffer::as_mut_slice", true)?;
        // SAFETY: as `as_slice`; `&mut self` makes this the only slice.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    fn host_slice(&mut self, op: &'static str, write: bool) -> Result<(*mut T, usize)> {
        if self.len == 0 || std::mem::size_of::<T>() == 0 {
            return Ok((std::ptr::NonNull::dangling().as_ptr(), self.len));
        }
        if self.shared.view.is_none() {
            let (a, _) = self.access_elems(op, .., write)?;
            drop(host_access(&self.shared, op, a, false)?);
        }
        Ok((self.host_ptr(), self.len))
    }

    /// Signals taken on this buffer's host view so far (each resolved a
    /// fault: a first touch, a copy back, a write to a shared page); 0
    /// without host faults.
    pub fn host_faults(&self) -> u64 {
        self.shared.view.as_ref().map_or(0, |v| v.faults())
    }

    /// Turns the host view's tree prefetch on (the default) or off: after
    /// faults on two consecutive pages of a 2 MiB block, a fault brings the
    /// rest of the block (UVM's prefetch). Off, each fault brings one page.
    pub fn set_host_fault_prefetch(&self, on: bool) {
        if let Some(v) = &self.shared.view {
            v.set_tree(on);
        }
    }

    fn access(
        &self,
        op: &'static str,
        range: impl RangeBounds<usize>,
        write: bool,
    ) -> Result<Access> {
        self.access_elems(op, range, write).map(|(a, _)| a)
    }

    /// The access and its element count (a byte count says nothing for a
    /// zero-sized `T`).
    fn access_elems(
        &self,
        op: &'static str,
        range: impl RangeBounds<usize>,
        write: bool,
    ) -> Result<(Access, usize)> {
        let (start, count) = elem_span(op, self.len, elems(self.len, range))?;
        let size = std::mem::size_of::<T>();
        let a = Access {
            buffer: self.shared.id,
            off: start * size,
            bytes: count * size,
            write,
        };
        Ok((a, count))
    }

    /// Reads elements `range` on the host: waits for queued work that writes
    /// their pages, copies dirty pages back, and holds them: work submitted
    /// while the guard lives that writes them waits for its drop.
    pub fn read(&self, range: impl RangeBounds<usize>) -> Result<ManagedRead<'_, T>> {
        self.read_guard("ManagedBuffer::read", range, false)
    }

    /// [`ManagedBuffer::read`] without waiting: [`Error::BufferBusy`] while
    /// queued work still writes those pages (on a device in virtual time the
    /// refusal lets the model make a step, so polling progresses).
    pub fn try_read(&self, range: impl RangeBounds<usize>) -> Result<ManagedRead<'_, T>> {
        self.read_guard("ManagedBuffer::try_read", range, true)
    }

    /// Writes elements `range` on the host: waits for every queued op on their
    /// pages, copies dirty pages back (the rest of a page keeps its data),
    /// and invalidates the device's copies; work submitted while the guard
    /// lives on those pages waits for its drop. A second guard over the same
    /// pages waits for this one; on the same thread it is
    /// [`Error::WouldDeadlock`].
    pub fn write(&self, range: impl RangeBounds<usize>) -> Result<ManagedWrite<'_, T>> {
        self.write_guard("ManagedBuffer::write", range, false)
    }

    /// [`ManagedBuffer::write`] without waiting: [`Error::BufferBusy`] while
    /// queued work still uses those pages.
    pub fn try_write(&self, range: impl RangeBounds<usize>) -> Result<ManagedWrite<'_, T>> {
        self.write_guard("ManagedBuffer::try_write", range, true)
    }

    /// A read guard over `range` (`try_`: refused instead of waiting).
    fn read_guard(
        &self,
        op: &'static str,
        range: impl RangeBounds<usize>,
        try_: bool,
    ) -> Result<ManagedRead<'_, T>> {
        let (a, count) = self.access_elems(op, range, false)?;
        let hold = host_access(&self.shared, op, a, try_)?;
        Ok(ManagedRead {
            data: self.host_elems(&a, count),
            hold: Some(hold),
            _not_send: PhantomData,
        })
    }

    /// A write guard over `range` (`try_`: refused instead of waiting).
    fn write_guard(
        &self,
        op: &'static str,
        range: impl RangeBounds<usize>,
        try_: bool,
    ) -> Result<ManagedWrite<'_, T>> {
        let (a, count) = self.access_elems(op, range, true)?;
        let hold = host_access(&self.shared, op, a, try_)?;
        Ok(ManagedWrite {
            data: self.host_elems(&a, count),
            shared: &self.shared,
            access: a,
            hold: Some(hold),
            _not_send: PhantomData,
        })
    }

    fn host_elems(&self, a: &Access, count: usize) -> (*mut T, usize) {
        let base = self.shared.home().host.host_ptr();
        let ptr = if a.bytes == 0 {
            base
        } else {
            base.wrapping_add(a.off)
        };
        (ptr.cast::<T>(), count)
    }

    /// Moves elements `range` to `to` for `stream`: to a device, copies of
    /// the pages it lacks, which `stream`'s later work waits for (`to` may
    /// be another device of the buffer's context than `stream`'s: its copies
    /// then run on a stream of `to`, after `stream`'s earlier work); to the
    /// host, copies back of dirty pages after the queued work on them (the
    /// stream's own included), which the stream's later work does not wait
    /// for, and without ReadMostly the device's copies go (their room with
    /// them). The copies run on the stream's migration stream, on the copy
    /// engines, overlapping its other work; [`Stream::synchronize`] covers
    /// them. Nothing on the host device, where there is one memory.
    pub fn prefetch(
        &self,
        range: impl RangeBounds<usize>,
        to: Location,
        stream: &Stream,
    ) -> Result<()> {
        let op = "ManagedBuffer::prefetch";
        let a = self.access(op, range, false)?;
        check_stream(op, stream, &self.shared)?;
        let sh = &self.shared;
        let Some(mem) = sh.mem_of(to) else {
            return Err(not_in_context(op, to, sh));
        };
        let target = match to {
            Location::Device(id) if id != stream.device().id() => sh.member(id),
            _ => None,
        };
        if stream.is_capturing() && (to == Location::Host || target.is_some()) {
            return Err(Error::Managed {
                op,
                detail: "a prefetch to the host or to another device cannot be recorded into a \
                         graph or command buffer: prefetch on a stream that is not capturing \
                         (a launch brings what its nodes declared to its own device)"
                    .into(),
            });
        }
        if mem == HOST && sh.moves() {
            return prefetch_to_host(stream, sh, a);
        }
        let Some(target) = target else {
            return device_op(stream, op, &[(sh, a)], MigrationReason::Prefetch, None);
        };
        // Another device of the context: its copies run there, after this
        // stream's earlier work, and this stream's later work follows them.
        let ts = sh.migration_stream(target)?;
        let before = stream.record_event()?;
        ts.wait_event(&before)?;
        device_op(ts, op, &[(sh, a)], MigrationReason::Prefetch, None)?;
        let after = ts.record_event()?;
        stream.wait_event(&after)
    }

    /// Sets `advice` on the pages elements `range` cover (a page is advised
    /// when the range touches it).
    pub fn advise(&self, range: impl RangeBounds<usize>, advice: Advice) -> Result<()> {
        self.set_advice("ManagedBuffer::advise", range, advice, true)
    }

    /// Clears `advice` on the pages elements `range` cover.
    pub fn unadvise(&self, range: impl RangeBounds<usize>, advice: Advice) -> Result<()> {
        self.set_advice("ManagedBuffer::unadvise", range, advice, false)
    }

    fn set_advice(
        &self,
        op: &'static str,
        range: impl RangeBounds<usize>,
        advice: Advice,
        on: bool,
    ) -> Result<()> {
        let a = self.access(op, range, false)?;
        if let Advice::PreferredLocation(l) | Advice::AccessedBy(l) = advice {
            if self.shared.mem_of(l).is_none() {
                return Err(not_in_context(op, l, &self.shared));
            }
        }
        let sh = &self.shared;
        sh.space
            .lock_for(op)?
            .advise(a.buffer, a.off, a.bytes, advice, |l| sh.mem_of(l), on);
        Ok(())
    }
}

fn not_in_context(op: &'static str, l: Location, sh: &Shared) -> Error {
    Error::Managed {
        op,
        detail: format!(
            "{l:?} is not a memory of this buffer: it is usable on the host and devices {:?}; \
             name one of them",
            sh.device_ids()
        ),
    }
}

/// The buffer's member on `stream`'s device; an error if it has none, or
/// if the buffer is attached elsewhere (`Stream::attach`).
fn check_stream<'a>(op: &'static str, stream: &Stream, sh: &'a Shared) -> Result<&'a Member> {
    let member = member_of(op, stream, sh)?;
    let attached = *sh.attached.lock().unwrap_or_else(|p| p.into_inner());
    match attached {
        Attached::Global => Ok(member),
        Attached::HostOnly => Err(Error::Managed {
            op,
            detail: format!(
                "managed buffer {} is attached to the host (Stream::attach with Attach::Host): \
                 attach it to a stream (Attach::Single or Attach::Global) before using it there",
                sh.id
            ),
        }),
        Attached::Stream(d, s) if (d, s) == (stream.device().id(), stream.id()) => Ok(member),
        Attached::Stream(d, s) => Err(Error::Managed {
            op,
            detail: format!(
                "managed buffer {} is attached to stream {s} of device {d} only \
                 (Attach::Single), not to stream {} of device {}: use it there, or attach it \
                 with Attach::Global",
                sh.id,
                stream.id(),
                stream.device().id()
            ),
        }),
    }
}

/// The buffer's member on `stream`'s device; an error if it has none.
fn member_of<'a>(op: &'static str, stream: &Stream, sh: &'a Shared) -> Result<&'a Member> {
    let Some(member) = sh.member(stream.device().id()) else {
        if sh.members.len() == 1 {
            return Err(Error::WrongDevice {
                op,
                buffer_device: sh.home().device.id(),
                stream_device: stream.device().id(),
            });
        }
        return Err(Error::Managed {
            op,
            detail: format!(
                "a stream of device {}: the buffer is usable on devices {:?} (its context's); \
                 use a stream of one of them",
                stream.device().id(),
                sh.device_ids()
            ),
        });
    };
    Ok(member)
}

impl Stream {
    /// Says which streams may use `buf` from now on (CUDA's
    /// `cudaStreamAttachMemAsync`): every stream of its devices
    /// ([`Attach::Global`], the default), only this one ([`Attach::Single`]:
    /// another stream's op on it is refused, so none can race it), or none
    /// ([`Attach::Host`]: the pages come back to the host after the work
    /// queued on them, in this stream's order, and the devices' copies go;
    /// the host then reads and writes the buffer without waiting for any
    /// device, and the devices' managed capacity is free for other buffers).
    /// Ops already submitted are not affected. Not recordable into a graph.
    pub fn attach<T: Pod>(&self, buf: &ManagedBuffer<T>, how: Attach) -> Result<()> {
        let op = "Stream::attach";
        let sh = &buf.shared;
        if self.is_capturing() {
            return Err(Error::Managed {
                op,
                detail: "attaching cannot be recorded into a graph or command buffer: attach \
                         on a stream that is not capturing"
                    .into(),
            });
        }
        // Any stream of the buffer's devices, whatever it is attached to now.
        member_of(op, self, sh)?;
        if how == Attach::Host && sh.moves() && sh.bytes > 0 {
            let a = buf.access(op, .., false)?;
            prefetch_to_host(self, sh, a)?;
        }
        *sh.attached.lock().unwrap_or_else(|p| p.into_inner()) = match how {
            Attach::Global => Attached::Global,
            Attach::Single => Attached::Stream(self.device().id(), self.id()),
            Attach::Host => Attached::HostOnly,
        };
        Ok(())
    }
}

thread_local! {
    /// The holds (host-event timelines) of the guards this thread has: a wait
    /// for one of them would never end.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A guard's hold: the host event later ops on its pages wait for.
struct Hold {
    event: crate::HostEvent,
    key: usize,
    space: Arc<SpaceLock>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.event.signal();
        let key = self.key;
        self.space.later(move |st| st.release_hold(key));
        let _ = HELD.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().position(|&k| k == key) {
                h.swap_remove(i);
                fault::note_hold(-1);
            }
        });
    }
}

fn point_of(timeline: &Arc<Timeline>, value: u64) -> Point {
    Point {
        timeline: timeline.clone(),
        value,
    }
}

/// Waits (or, `try_`, refuses) until no queued work conflicts with `a`,
/// copies its dirty pages back, and takes the hold.
fn host_access(sh: &Shared, op: &'static str, a: Access, try_: bool) -> Result<Hold> {
    loop {
        let mut st = sh.space.lock_for(op)?;
        let plan = st.plan_host(&a);
        if !plan.waits.is_empty() {
            let own = HELD.with(|h| {
                let h = h.borrow();
                plan.waits
                    .iter()
                    .any(|p| st.holds_behind(p).iter().any(|k| h.contains(k)))
            });
            drop(st);
            if own {
                return Err(Error::WouldDeadlock(format!(
                    "{op}: it would wait for work on these pages that waits for a guard this \
                     thread holds; drop that guard first"
                )));
            }
            if try_ {
                for p in &plan.waits {
                    p.timeline.poll_driver();
                }
                return Err(Error::BufferBusy {
                    op,
                    detail: "queued work on its pages has not completed",
                });
            }
            for p in &plan.waits {
                p.timeline
                    .wait_for(p.value, p.timeline.host_wait, "managed host access")?;
            }
            continue;
        }
        close_views(&mut st, &[(sh, a)]);
        let last = copy_back(sh, &mut st, &plan.moves, MigrationReason::HostAccess)?;
        let event = sh.home().device.host_event();
        let hp = event
            .event()
            .point
            .as_ref()
            .map(|p| point_of(&p.timeline, p.value))
            .expect("a host event is recorded at creation");
        let key = Arc::as_ptr(&hp.timeline) as usize;
        st.add_hold(&hp.timeline);
        st.apply_use(&a, HOST, hp);
        drop(st);
        HELD.with(|h| h.borrow_mut().push(key));
        fault::note_hold(1);
        let hold = Hold {
            event,
            key,
            space: sh.space.clone(),
        };
        for p in last {
            // Only its end matters: a failed copy back fails its stream, which
            // `ManagedStats` and the trace show; the bytes are what they are.
            p.timeline
                .wait_for(p.value, p.timeline.host_wait, "managed copy back")?;
        }
        return Ok(hold);
    }
}

/// The pages of `sh` an access covers.
fn pages_of(sh: &Shared, a: &Access) -> std::ops::Range<usize> {
    if a.bytes == 0 {
        return 0..0;
    }
    a.off / sh.page_bytes..(a.off + a.bytes).div_ceil(sh.page_bytes)
}

/// Lowers the host views' access to what `uses` leave them (a writer's pages
/// closed, a reader's read-only), before the work is submitted.
/// Pages the view may have written count as touched (not all zero), so a
/// copy in moves their bytes.
fn close_views(st: &mut Space, uses: &[(&Shared, Access)]) {
    for (sh, a) in uses {
        if let Some(v) = &sh.view {
            let access = if a.write { fault::CLOSED } else { fault::READ };
            v.close(pages_of(sh, a), access, |p| st.mark_touched(sh.id, p));
        }
    }
}

/// Resolves a host fault on pages `first..first + n` of a buffer's view (the
/// first written if `write`, the rest a tree prefetch, read), on the fault
/// service thread: waits for their queued work, copies them back, and opens
/// each at the access its state allows. `holds`: the faulting thread holds
/// host guards (a wait for one of them is refused).
fn resolve_fault(
    sh: &Arc<Shared>,
    hv: &HostView,
    first: usize,
    n: usize,
    write: bool,
    holds: bool,
) -> Answer {
    let pb = sh.page_bytes;
    let span = |p: usize, k: usize, write: bool| {
        let off = (p * pb).min(sh.bytes);
        Access {
            buffer: sh.id,
            off,
            bytes: ((p + k) * pb).min(sh.bytes) - off,
            write,
        }
    };
    let accesses = [span(first, 1, write), span(first + 1, n - 1, false)];
    loop {
        let mut st = sh.space.lock();
        let mut waits = Vec::new();
        let mut moves = Vec::new();
        for a in &accesses {
            let plan = st.plan_host(a);
            waits.extend(plan.waits);
            moves.extend(plan.moves);
        }
        if !waits.is_empty() {
            if holds && waits.iter().any(|p| !st.holds_behind(p).is_empty()) {
                return Answer::WouldDeadlock;
            }
            drop(st);
            for p in &waits {
                // A failed op fails its stream; the bytes are what they are.
                let _ = p
                    .timeline
                    .wait_for(p.value, p.timeline.host_wait, "managed host fault");
            }
            continue;
        }
        if !moves.is_empty() {
            let Ok(last) = copy_back(sh, &mut st, &moves, MigrationReason::HostFault) else {
                return Answer::Failed;
            };
            drop(st);
            for p in last {
                if p.timeline
                    .wait_for(p.value, p.timeline.host_wait, "managed host fault")
                    .is_err()
                {
                    return Answer::Failed;
                }
            }
            // Plan again: the pages' state may have moved on meanwhile.
            continue;
        }
        if write {
            st.apply_host_write(&accesses[0]);
        }
        for p in first..first + n {
            hv.open(p..p + 1, st.host_access(sh.id, p));
        }
        return Answer::Resolved;
    }
}

/// Submits one migration copy of run `m` of `sh` between the host's copy
/// and `member`'s on `stream` (a stream of `member`'s device); its value.
fn copy_run(
    stream: &Stream,
    sh: &Shared,
    member: &Member,
    m: &Move,
    kind: CopyKind,
    reason: MigrationReason,
) -> Result<u64> {
    if let (Some(v), CopyKind::D2H) = (&sh.view, kind) {
        v.populate(m.off, m.bytes);
    }
    copy_table_run(stream, &member.host, &member.dev, sh.id, m, kind, reason)
}

/// Copies runs `moves` back to the host, each on the buffer's migration
/// stream of the device that holds it, applying each; the copies' points.
fn copy_back(
    sh: &Shared,
    st: &mut Space,
    moves: &[Move],
    reason: MigrationReason,
) -> Result<Vec<Point>> {
    let mut last: Vec<Point> = Vec::new();
    for m in moves {
        let Some(member) = sh.member_at(m.from) else {
            return Err(Error::Managed {
                op: "managed copy back",
                detail: format!(
                    "page run {:?} of buffer {} names memory {} that no device of the buffer \
                     has; this is a bug in hetero",
                    m.pages, sh.id, m.from
                ),
            });
        };
        let s = sh.migration_stream(member)?;
        let v = copy_run(s, sh, member, m, CopyKind::D2H, reason)?;
        let p = point_of(s.backend_stream().timeline(), v);
        st.apply_move(m, HOST, Some(p.clone()), reason, None);
        last.retain(|q| !Arc::ptr_eq(&q.timeline, &p.timeline));
        last.push(p);
    }
    Ok(last)
}

fn copy_table_run(
    stream: &Stream,
    host: &Arc<Storage>,
    dev: &Arc<Storage>,
    buffer: u64,
    m: &Move,
    kind: CopyKind,
    reason: MigrationReason,
) -> Result<u64> {
    let reach = stream.device().reach();
    let h = view(host, m.off, m.bytes, reach);
    let d = view(dev, m.off, m.bytes, reach);
    let (src, dst) = if kind == CopyKind::H2D {
        (h, d)
    } else {
        (d, h)
    };
    let v = stream.submit(Body::Copy {
        kind,
        src,
        src_off: 0,
        dst,
        dst_off: 0,
        bytes: m.bytes,
        _pending: None,
        after: None,
    })?;
    record(stream.id(), buffer, m, kind == CopyKind::D2H, reason, true);
    Ok(v)
}

fn record(
    stream: u64,
    buffer: u64,
    m: &Move,
    to_host: bool,
    reason: MigrationReason,
    copied: bool,
) {
    if hetero_trace::enabled() {
        hetero_trace::record_migration(hetero_trace::MigrationRecord {
            ts_ns: hetero_trace::now_ns(),
            stream,
            buffer,
            bytes: if copied { m.bytes as u64 } else { 0 },
            pages: (m.pages.end - m.pages.start) as u32,
            to_host,
            reason,
        });
    }
}

/// Memory waits for `waits`, one per timeline (its latest value); a wait
/// for another device's timeline is watched, so this device's engines look
/// again when it is reached (as `Stream::wait_event` does).
fn submit_waits(stream: &Stream, st: &mut Space, waits: &[Point]) -> Result<()> {
    let mut last: Vec<(&Arc<Timeline>, u64)> = Vec::new();
    for p in waits {
        match last.iter_mut().find(|(t, _)| Arc::ptr_eq(t, &p.timeline)) {
            Some((_, v)) => *v = (*v).max(p.value),
            None => last.push((&p.timeline, p.value)),
        }
    }
    for (t, v) in last {
        if t.is_reached(v) {
            continue;
        }
        submit_wait(stream, st, &point_of(t, v), false)?;
    }
    Ok(())
}

/// One wait of `stream` for `p` (`fault`: a failure there fails `stream`).
fn submit_wait(stream: &Stream, st: &mut Space, p: &Point, fault: bool) -> Result<()> {
    let at = stream.submit(Body::Wait {
        timeline: p.timeline.clone(),
        value: p.value,
        fault,
    })?;
    if p.timeline.device != stream.device().id() {
        stream.device().watch(&p.timeline, p.value);
    }
    st.note_wait(stream.backend_stream().timeline(), at, p);
    Ok(())
}

/// Submits a device plan's waits, evictions and copies in on `stream` (a
/// stream of the device whose memory is `mem`), applying each to the state
/// as it is submitted. `uses`: the buffers the copies in are for.
fn submit_plan(
    stream: &Stream,
    st: &mut Space,
    plan: &Plan,
    mem: u8,
    reason: MigrationReason,
    budget: Option<usize>,
    uses: &[(&Arc<Shared>, Access)],
) -> Result<()> {
    submit_waits(stream, st, &plan.waits)?;
    let timeline = stream.backend_stream().timeline().clone();
    for e in &plan.evictions {
        let Some(copy) = st.tables.get(&e.buffer).and_then(|t| t.copy_at(mem)) else {
            continue;
        };
        if e.copy {
            let (host, dev) = (copy.host.clone(), copy.dev.clone());
            let v = copy_table_run(
                stream,
                &host,
                &dev,
                e.buffer,
                e,
                CopyKind::D2H,
                MigrationReason::Eviction,
            )?;
            st.apply_eviction(e, mem, Some(point_of(&timeline, v)));
        } else {
            record(
                stream.id(),
                e.buffer,
                e,
                true,
                MigrationReason::Eviction,
                false,
            );
            st.apply_eviction(e, mem, None);
        }
    }
    let bug = |m: &Move, what: &str| Error::Managed {
        op: "managed migration",
        detail: format!(
            "pages {:?} of buffer {} to memory {mem} from memory {}: {what}; this is a bug in \
             hetero",
            m.pages, m.buffer, m.from
        ),
    };
    for m in &plan.moves {
        let Some(copy) = st.tables.get(&m.buffer).and_then(|t| t.copy_at(mem)) else {
            return Err(bug(m, "the buffer has no copy there"));
        };
        let (host, dev) = (copy.host.clone(), copy.dev.clone());
        if !m.copy {
            st.apply_move(m, mem, None, reason, budget);
            continue;
        }
        if m.from == HOST {
            let v = copy_table_run(stream, &host, &dev, m.buffer, m, CopyKind::H2D, reason)?;
            st.apply_move(m, mem, Some(point_of(&timeline, v)), reason, budget);
            continue;
        }
        // Only another device holds the run: from its copy.
        let Some(sh) = uses.iter().map(|(sh, _)| *sh).find(|sh| sh.id == m.buffer) else {
            return Err(bug(m, "a run of a buffer the access does not name"));
        };
        let (Some(src), Some(dst)) = (sh.member_at(m.from), sh.member(stream.device().id())) else {
            return Err(bug(m, "a device the buffer does not have"));
        };
        let direct = stream.device().context_shared().is_some_and(|c| {
            matches!(
                c.topology().path(src.device.id(), dst.device.id()),
                Some(PeerPath::Link(_) | PeerPath::SharedMemory)
            )
        });
        if direct {
            // One copy over the peer link, on this stream: after the run's
            // queued work on either device (the plan's waits).
            let from = view(&src.dev, m.off, m.bytes, src.device.reach());
            let to = view(&dev, m.off, m.bytes, stream.device().reach());
            let v = stream.submit(Body::Copy {
                kind: CopyKind::D2D,
                src: from,
                src_off: 0,
                dst: to,
                dst_off: 0,
                bytes: m.bytes,
                _pending: None,
                after: None,
            })?;
            record(stream.id(), m.buffer, m, false, reason, true);
            st.apply_move(m, mem, Some(point_of(&timeline, v)), reason, budget);
        } else {
            // Staged: back to the host on a stream of the holding device
            // (after the run's queued work), then in from the host here.
            let out = sh.migration_stream(src)?;
            submit_waits(out, st, &plan.waits)?;
            let v = copy_run(out, sh, src, m, CopyKind::D2H, reason)?;
            let back = point_of(out.backend_stream().timeline(), v);
            st.apply_move(m, HOST, Some(back.clone()), reason, None);
            submit_wait(stream, st, &back, true)?;
            let v = copy_table_run(stream, &host, &dev, m.buffer, m, CopyKind::H2D, reason)?;
            let from_host = Move {
                from: HOST,
                ..m.clone()
            };
            st.apply_move(
                &from_host,
                mem,
                Some(point_of(&timeline, v)),
                reason,
                budget,
            );
        }
    }
    Ok(())
}

/// What `device_op` submits over views of the declared ranges: its value.
type SubmitOp<'f> = dyn FnMut(&[Arc<Storage>]) -> Result<u64> + 'f;

/// Makes `uses` resident on `stream`'s device (waits, evictions, copies in),
/// then submits its `op` over views of them (if any) and records its accesses.
fn device_op(
    stream: &Stream,
    op: &str,
    uses: &[(&Arc<Shared>, Access)],
    reason: MigrationReason,
    submit: Option<&mut SubmitOp<'_>>,
) -> Result<()> {
    let Some((first, _)) = uses.first() else {
        return match submit {
            Some(f) => f(&[]).map(|_| ()),
            None => Ok(()),
        };
    };
    let mut members: Vec<&Member> = Vec::with_capacity(uses.len());
    for (sh, _) in uses {
        members.push(check_stream("managed access", stream, sh)?);
        if !Arc::ptr_eq(&sh.space, &first.space) {
            return Err(Error::Managed {
                op: "managed access",
                detail: format!(
                    "managed buffers {} and {} are of different contexts' state (one was made \
                     before its device joined a context); pass buffers made on this device or \
                     its context",
                    first.id, sh.id
                ),
            });
        }
    }
    if stream.is_capturing() {
        return record_op(stream, uses, &members, submit);
    }
    let mem = members[0].mem;
    let side = (stream.device().id(), stream.id());
    let budget = stream.device().managed_budget();
    let accesses: Vec<Access> = uses.iter().map(|(_, a)| *a).collect();
    let views: Vec<(&Shared, Access)> = uses.iter().map(|(sh, a)| (&***sh, *a)).collect();
    let mut st = first.space.lock_for("a managed access")?;
    let plan = st
        .plan_device(&accesses, mem, side, budget.map(|b| b.0))
        .map_err(|e| {
            let (_, capacity, pool) = budget.unwrap_or_default();
            Error::ManagedWorkingSet {
                op: op.to_string(),
                device: stream.device().id(),
                needed: e.needed,
                budget: e.budget,
                capacity,
                pool,
            }
        })?;
    close_views(&mut st, &views);
    let fault_model = st
        .fault_models
        .get(&mem)
        .cloned()
        .filter(|_| !plan.moves.is_empty());
    if let Some((cost, servicer)) = fault_model {
        // A faulting device: the kernel stalls on its faults, which are
        // serviced in batches, then the pages move; all on its stream.
        let faults: usize = plan.moves.iter().map(|m| m.pages.len()).sum();
        let ns = faults.div_ceil(cost.batch_faults.max(1)) as u64 * cost.batch_ns;
        // One fault servicer per device (UVM's, a driver thread per GPU):
        // batches of different streams queue for it.
        stream.enqueue_async(
            "device fault service (model)",
            &[],
            move |cx: &mut crate::AsyncContext<'_>| {
                use std::sync::atomic::Ordering::{AcqRel, Acquire};
                let now = cx.now_ns();
                let mut free = servicer.load(Acquire);
                let end = loop {
                    let end = free.max(now) + ns;
                    match servicer.compare_exchange(free, end, AcqRel, Acquire) {
                        Ok(_) => break end,
                        Err(f) => free = f,
                    }
                };
                cx.complete_at_ns(end);
                std::task::Poll::Ready(Ok(()))
            },
        )?;
        submit_plan(
            stream,
            &mut st,
            &plan,
            mem,
            reason,
            budget.map(|b| b.0),
            uses,
        )?;
    } else if !plan.moves.is_empty() || !plan.evictions.is_empty() {
        // The copies go on the stream's migration stream, after only the
        // pages' own queued work (planned from that stream's side, so this
        // stream's earlier work on the pages counts too), overlapping the
        // rest of this stream's work; this stream waits for them.
        let m = stream.migration_stream(false)?;
        let copies = st
            .plan_device(
                &accesses,
                mem,
                (stream.device().id(), m.id()),
                budget.map(|b| b.0),
            )
            .map_err(|e| Error::Managed {
                op: "managed migration",
                detail: format!("a plan changed under its lock: {e:?}"),
            })?;
        submit_plan(m, &mut st, &copies, mem, reason, budget.map(|b| b.0), uses)?;
        let done = point_of(
            m.backend_stream().timeline(),
            m.backend_stream().submitted(),
        );
        submit_wait(stream, &mut st, &done, true)?;
    }
    submit_waits(stream, &mut st, &plan.waits)?;
    let Some(f) = submit else {
        return Ok(());
    };
    let reach = stream.device().reach();
    let views: Vec<Arc<Storage>> = uses
        .iter()
        .zip(&members)
        .map(|((_, a), member)| view(&member.dev, a.off, a.bytes, reach))
        .collect();
    let v = f(&views)?;
    let p = point_of(stream.backend_stream().timeline(), v);
    for a in &accesses {
        st.apply_use(a, mem, p.clone());
    }
    Ok(())
}

/// A managed access recorded into a graph or command buffer: its pages are
/// made resident at each launch, before the graph starts (`launch_graph`).
struct GraphUse {
    sh: Arc<Shared>,
    access: Access,
}

/// `device_op` on a capturing stream: records `submit` (over views of the
/// device's copy, which the graph's nodes keep) and the pages it declared;
/// nothing moves until a launch.
fn record_op(
    stream: &Stream,
    uses: &[(&Arc<Shared>, Access)],
    members: &[&Member],
    submit: Option<&mut SubmitOp<'_>>,
) -> Result<()> {
    let reach = stream.device().reach();
    if let Some(f) = submit {
        let views: Vec<Arc<Storage>> = uses
            .iter()
            .zip(members)
            .map(|((_, a), member)| view(&member.dev, a.off, a.bytes, reach))
            .collect();
        f(&views)?;
    }
    crate::api::graph::capture::managed(
        stream.capture_slot(),
        uses.iter().map(|(sh, a)| {
            Arc::new(GraphUse {
                sh: (*sh).clone(),
                access: *a,
            }) as Arc<dyn std::any::Any + Send + Sync>
        }),
    )
}

/// Launches a graph whose nodes declared managed pages (`recorded`, from
/// `record_op`): as one op on `stream` that touches every one of them, made
/// resident first (copies in, evictions, waits for their queued work), then
/// `submit` submits the graph and the pages record it as their reader or
/// writer. So a graph's managed working set must fit the device, as one
/// kernel's must.
pub(crate) fn launch_graph(
    stream: &Stream,
    recorded: &[Arc<dyn std::any::Any + Send + Sync>],
    submit: &mut SubmitOp<'_>,
) -> Result<()> {
    let uses: Vec<(&Arc<Shared>, Access)> = recorded
        .iter()
        .filter_map(|r| r.downcast_ref::<GraphUse>())
        .map(|u| (&u.sh, u.access))
        .collect();
    device_op(
        stream,
        "launch_graph",
        &uses,
        MigrationReason::Declared,
        Some(submit),
    )
}

/// Prefetch to the host on `stream`: copies back, then the devices' copies
/// go (without ReadMostly).
fn prefetch_to_host(stream: &Stream, sh: &Shared, a: Access) -> Result<()> {
    // On the stream's migration stream, after the queued work on those pages
    // (this stream's included): the stream's later work does not wait for
    // the copies back (work on those pages waits through the pages, a host
    // guard too), and `Stream::synchronize` covers them. Runs held by
    // another device of the context are copied back on a stream of that
    // device, after the same work.
    let here = member_of("prefetch", stream, sh)?;
    let m = stream.migration_stream(true)?;
    let mut st = sh.space.lock_for("prefetch")?;
    let plan = st.plan_to_host(&a, (stream.device().id(), m.id()));
    submit_waits(m, &mut st, &plan.waits)?;
    let timeline = m.backend_stream().timeline().clone();
    for mv in &plan.moves {
        if mv.from == here.mem {
            let v = copy_run(m, sh, here, mv, CopyKind::D2H, MigrationReason::Prefetch)?;
            st.apply_move(
                mv,
                HOST,
                Some(point_of(&timeline, v)),
                MigrationReason::Prefetch,
                None,
            );
            continue;
        }
        let Some(holder) = sh.member_at(mv.from) else {
            return Err(Error::Managed {
                op: "prefetch",
                detail: format!(
                    "pages {:?} of buffer {} held in memory {}, which no device of the buffer \
                     has; this is a bug in hetero",
                    mv.pages, sh.id, mv.from
                ),
            });
        };
        let out = sh.migration_stream(holder)?;
        submit_waits(out, &mut st, &plan.waits)?;
        let v = copy_run(
            out,
            sh,
            holder,
            mv,
            CopyKind::D2H,
            MigrationReason::Prefetch,
        )?;
        let p = point_of(out.backend_stream().timeline(), v);
        st.apply_move(mv, HOST, Some(p.clone()), MigrationReason::Prefetch, None);
        // `Stream::synchronize` covers it: the migration stream waits.
        submit_wait(m, &mut st, &p, false)?;
    }
    // The dropped device copies are ordered after the migration stream's
    // end: the waits and copies above.
    let v = m.backend_stream().submitted();
    st.apply_to_host(&a, (v > 0).then(|| point_of(&timeline, v)));
    Ok(())
}

/// `Stream::launch` with managed arguments among `args`.
pub(crate) fn launch(
    stream: &Stream,
    kernel: &Kernel,
    grid: Grid,
    args: &[Arg<'_>],
    mut span: Option<Arc<crate::exec::op::Span>>,
) -> Result<Option<u64>> {
    let name = kernel.inner.name;
    if grid.blocks() == 0 {
        return Err(Error::EmptyGrid { kernel: name });
    }
    stream.device().check_code(&kernel.inner)?;
    if args.len() > crate::MAX_KERNEL_ARGS {
        return Err(Error::TooManyArgs {
            kernel: name,
            count: args.len(),
            max: crate::MAX_KERNEL_ARGS,
        });
    }
    let mut uses: Vec<(&Arc<Shared>, Access)> = Vec::new();
    let mut slots: Vec<Option<usize>> = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        match &a.managed {
            Some(m) => {
                check_stream("launch", stream, m.shared)?;
                let (start, count) = elem_span("launch", m.len, (m.start, m.end))?;
                let size = a.elem.size;
                let acc = Access {
                    buffer: m.shared.id,
                    off: start * size,
                    bytes: count * size,
                    write: a.write,
                };
                for (sh, b) in &uses {
                    let overlap = acc.off < b.off + b.bytes && b.off < acc.off + acc.bytes;
                    if sh.id == acc.buffer && overlap && (acc.write || b.write) {
                        return Err(Error::Aliasing { op: "launch" });
                    }
                }
                slots.push(Some(uses.len()));
                uses.push((m.shared, acc));
            }
            None => {
                stream.check_storage("launch", a.storage)?;
                for b in &args[..i] {
                    if b.managed.is_none()
                        && Arc::ptr_eq(a.storage, b.storage)
                        && (a.write || b.write)
                    {
                        return Err(Error::Aliasing { op: "launch" });
                    }
                }
                slots.push(None);
            }
        }
    }
    // A Vulkan device binds a range at a multiple of its storage alignment
    // (which divides `Storage::ALIGN`).
    if stream.device().properties().backend == "vulkan" {
        for a in args {
            let Some(m) = &a.managed else { continue };
            let at = m.start * a.elem.size;
            if at % Storage::ALIGN != 0 {
                return Err(Error::Managed {
                    op: "launch",
                    detail: format!(
                        "a managed range argument from element {} ({at} bytes in) on a Vulkan \
                         device: a kernel's range must start at a multiple of {} bytes; pass a \
                         range that does, or the whole buffer",
                        m.start,
                        Storage::ALIGN
                    ),
                });
            }
        }
    }
    // The launch's value on the stream (none when captured).
    let mut value = None;
    let mut submit = |views: &[Arc<Storage>]| -> Result<u64> {
        let capturing = stream.is_capturing();
        if !capturing {
            for a in args.iter().filter(|a| a.managed.is_none()) {
                stream.order_use(a.storage)?;
            }
        }
        let list: Vec<Arg<'_>> = args
            .iter()
            .zip(&slots)
            .map(|(a, slot)| match slot {
                Some(i) => Arg {
                    storage: &views[*i],
                    managed: None,
                    ..*a
                },
                None => *a,
            })
            .collect();
        if capturing {
            crate::api::graph::capture::kernel(
                stream.capture_slot(),
                stream.id(),
                &kernel.inner,
                grid.blocks(),
                &list,
            )?;
            return Ok(0);
        }
        let v = stream.backend_stream().submit_launch(
            &kernel.inner,
            grid.blocks(),
            crate::exec::kernel::ArgList::from_args(&list),
            span.take(),
        )?;
        value = Some(v);
        Ok(v)
    };
    device_op(
        stream,
        name,
        &uses,
        MigrationReason::Declared,
        Some(&mut submit),
    )?;
    Ok(value)
}

impl Stream {
    /// Copies `count` elements of managed `src` from `src_offset` into device
    /// buffer `dst` at `dst_offset`, after making those pages resident here.
    pub fn copy_from_managed<T: Pod>(
        &self,
        src: &ManagedBuffer<T>,
        src_offset: usize,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        let op = "copy_from_managed";
        let a = src.access(op, src_offset..src_offset.saturating_add(count), false)?;
        self.check_storage(op, &dst.storage)?;
        crate::api::stream::check_range(op, dst.len(), dst_offset, count)?;
        let size = std::mem::size_of::<T>();
        let mut submit = |views: &[Arc<Storage>]| -> Result<u64> {
            self.order_use(&dst.storage)?;
            self.submit(Body::Copy {
                kind: CopyKind::D2D,
                src: views[0].clone(),
                src_off: 0,
                dst: (*dst.storage).clone(),
                dst_off: dst_offset * size,
                bytes: count * size,
                _pending: None,
                after: None,
            })
        };
        device_op(
            self,
            op,
            &[(&src.shared, a)],
            MigrationReason::Declared,
            Some(&mut submit),
        )
    }

    /// Copies `count` elements of device buffer `src` from `src_offset` into
    /// managed `dst` at `dst_offset` (those pages are dirty here afterwards).
    pub fn copy_to_managed<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        dst: &ManagedBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        let op = "copy_to_managed";
        let a = dst.access(op, dst_offset..dst_offset.saturating_add(count), true)?;
        self.check_storage(op, &src.storage)?;
        crate::api::stream::check_range(op, src.len(), src_offset, count)?;
        let size = std::mem::size_of::<T>();
        let mut submit = |views: &[Arc<Storage>]| -> Result<u64> {
            self.order_use(&src.storage)?;
            self.submit(Body::Copy {
                kind: CopyKind::D2D,
                src: (*src.storage).clone(),
                src_off: src_offset * size,
                dst: views[0].clone(),
                dst_off: 0,
                bytes: count * size,
                _pending: None,
                after: None,
            })
        };
        device_op(
            self,
            op,
            &[(&dst.shared, a)],
            MigrationReason::Declared,
            Some(&mut submit),
        )
    }
}

/// A host read of a managed range; derefs to `&[T]`. Not `Send`: its hold is
/// this thread's (a wait for it here would be refused, not deadlock).
pub struct ManagedRead<'a, T: Pod> {
    data: (*mut T, usize),
    hold: Option<Hold>,
    _not_send: PhantomData<(&'a [T], *const ())>,
}

impl<T: Pod> std::ops::Deref for ManagedRead<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the range lies in the host copy (bounds checked), its pages
        // are valid on the host (copied back before the guard was made), and
        // no op or guard writes them while this hold lives (every writer waits
        // for it, module doc); aligned as the buffer is.
        unsafe { std::slice::from_raw_parts(self.data.0, self.data.1) }
    }
}

impl<T: Pod> Drop for ManagedRead<'_, T> {
    fn drop(&mut self) {
        drop(self.hold.take());
    }
}

/// A host write of a managed range; derefs to `&mut [T]`. On drop the hold
/// ends; pages advised `AccessedBy` a device are copied to it at once.
pub struct ManagedWrite<'a, T: Pod> {
    data: (*mut T, usize),
    shared: &'a Arc<Shared>,
    access: Access,
    hold: Option<Hold>,
    _not_send: PhantomData<(&'a mut [T], *const ())>,
}

impl<T: Pod> std::ops::Deref for ManagedWrite<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: as `ManagedRead`, and this guard is the pages' only user.
        unsafe { std::slice::from_raw_parts(self.data.0, self.data.1) }
    }
}

impl<T: Pod> std::ops::DerefMut for ManagedWrite<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: no op or other guard reads or writes these pages while the
        // hold lives (each waits for it), and `&mut self` makes this the only
        // slice of them.
        unsafe { std::slice::from_raw_parts_mut(self.data.0, self.data.1) }
    }
}

impl<T: Pod> Drop for ManagedWrite<'_, T> {
    fn drop(&mut self) {
        drop(self.hold.take());
        let sh = self.shared;
        if !sh.moves() {
            return;
        }
        // An AccessedBy refresh: not from an engine thread (see `SpaceLock`).
        let Ok(st) = sh.space.lock_for("a write guard's AccessedBy refresh") else {
            return;
        };
        let missing: Vec<(&Member, Vec<Access>)> = sh
            .members
            .iter()
            .filter(|m| m.mem != HOST)
            .map(|m| (m, st.accessed_by_missing(&self.access, m.mem)))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        drop(st);
        for (member, runs) in missing {
            let refresh = sh.migration_stream(member).and_then(|s| {
                let uses: Vec<(&Arc<Shared>, Access)> = runs.iter().map(|a| (sh, *a)).collect();
                device_op(
                    s,
                    "AccessedBy refresh",
                    &uses,
                    MigrationReason::Prefetch,
                    None,
                )
            });
            if let Err(e) = refresh {
                // The pages stay where they are; the next kernel copies them in.
                tracing::debug!(error = %e, "refreshing AccessedBy pages failed");
            }
        }
    }
}
