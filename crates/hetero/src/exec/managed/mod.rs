//! Managed memory's page state machine: which memories hold each page of a
//! managed buffer, what queued work touches it, and which pages a device
//! evicts past its capacity. The public handles and the ops that move bytes
//! are `api/managed.rs`; this floor only decides, as plain data.
//!
//! # Page states
//! A managed buffer is cut into pages (64 KiB by default). Memory 0 is the
//! host; memory `m >= 1` is a device's copy (today the buffer's own device,
//! memory 1; a context of several devices gives each its index). Per page:
//! - `valid`: a bit per memory that holds the page's current data. Never
//!   empty. `valid == {host}`: host only; `{host, d}`: both, the device copy
//!   is *clean* (evicting it costs no copy); `{d}`: *dirty* on `d` (evicting
//!   it costs exactly one copy back).
//! - `last_write`: the point of the last queued op that wrote the page's data
//!   in any memory (a kernel's write, a migration copy, a host write guard's
//!   hold), `reads`: the points of queued readers since (kernels' reads, host
//!   read guards' holds).
//!
//! - `touched`: written at least once anywhere. An untouched page is zero in
//!   every memory, so making it resident copies nothing (first touch).
//!
//! Transitions (`d` the acting device; "copy in" only for a touched page):
//! ```text
//!   device read on d:    d ∉ valid → copy in (from the host)   valid ∪= {d}
//!                        without ReadMostly other devices drop theirs
//!   device write on d:   copy in as above, then                 valid  = {d}
//!   host read guard:     host ∉ valid → copy back               valid ∪= {host}
//!   host write guard:    copy back as above, then               valid  = {host}
//!   prefetch to d:       as a device read, no kernel
//!   prefetch to host:    copy back; without ReadMostly          valid  = {host}
//!   eviction from d:     dirty → one copy back, clean → none    valid −= {d}
//! ```
//!
//! # Ordering
//! Every op that touches a page on a stream S first waits (a memory wait, a
//! fault does not propagate) for the page's queued work on other streams: a
//! reader for `last_write`, a writer (and every migration copy, which writes
//! one memory's copy) for `last_write` and `reads`. Host guards wait for the
//! same on the host, and while one lives its hold (a host event signalled when
//! the guard drops) is the page's `last_write` (write guard) or one of its
//! `reads`: ops submitted meanwhile wait for it. So conflicting accesses to a
//! page take effect in the order they were submitted, whatever their streams:
//! a program's result is its sequential one. A copy back for a host read
//! follows only `last_write`, so it leaves `reads` in place (the device
//! copy's readers may still be queued). Accesses to different pages do
//! not wait for each other. Points of completed work are dropped as they are
//! met.
//!
//! # Capacity
//! A device's managed pages count against its budget (its memory capacity
//! less what its pool holds). Past it, the pages to evict are chosen among the
//! device's resident pages the current access does not use: pages with no
//! queued work first, then by advice and thrash rank, then least recently
//! used. An eviction is ordered (on the acting stream's migration stream)
//! after the page's queued work (a stream-ordered eviction, like a
//! stream-ordered free). A page
//! evicted and needed again before a budget's worth of other pages came in
//! thrashes; after 3 such events it is throttled (evicted only after every
//! unthrottled page), after 10 pinned (evicted only when nothing else can
//! go), UVM's thresholds. An access whose own pages exceed the budget is the
//! caller's typed error, before anything is submitted.
//!
//! # Concurrency
//! One `Space` per device, behind one mutex (`api/managed.rs`), holds the
//! tables of every managed buffer of that device: eviction chooses across
//! buffers, so the choice and the state it changes are one critical section.
//! The lock is held to plan, submit the plan's ops and apply it (submission
//! never waits for work to run, only for ring room); never while a host
//! thread waits for work. `plan_*` change nothing; `apply_*` record what was
//! submitted, so an op refused on submission leaves the state as it was.

use crate::exec::storage::{Backing, Reach, Registration, Storage};
use crate::exec::timeline::Timeline;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

pub(crate) mod fault;
pub(crate) mod window;

pub use hetero_trace::MigrationReason;

/// The host's memory index.
pub(crate) const HOST: u8 = 0;
/// Memories a page's state can name (bits of `Page::valid`).
pub(crate) const MAX_MEMORIES: usize = 32;
/// CUDA's big page.
pub const DEFAULT_PAGE_BYTES: usize = 64 << 10;
/// Thrash events after which a page is throttled (UVM's default).
pub const THROTTLE_AFTER: u32 = 3;
/// Thrash events after which a page is pinned where it is (UVM's default).
pub const PIN_AFTER: u32 = 10;

/// A point on a timeline: an op's completion, or a host guard's release.
#[derive(Clone)]
pub(crate) struct Point {
    pub(crate) timeline: Arc<Timeline>,
    pub(crate) value: u64,
}

impl Point {
    pub(crate) fn pending(&self) -> bool {
        !self.timeline.is_reached(self.value)
    }

    fn same(&self, other: &Point) -> bool {
        Arc::ptr_eq(&self.timeline, &other.timeline) && self.value == other.value
    }
}

/// Where pages should live, or who reaches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// The host's memory.
    Host,
    /// A device, by id ([`crate::Device::id`]).
    Device(u64),
}

/// A hint about a range of a managed buffer (CUDA's `cudaMemAdvise`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// Devices that read the pages keep read replicas; a write anywhere
    /// invalidates every other copy. Without it a device read moves a page
    /// from another device (the host's copy, the backing store, stays).
    ReadMostly,
    /// Pages preferring the host are evicted before all others; pages
    /// preferring a device are evicted after all others but pinned ones.
    PreferredLocation(Location),
    /// The device keeps a current copy: a host write guard's drop copies the
    /// pages it wrote back to that device at once, on the buffer's migration
    /// stream, so a later kernel finds them resident.
    AccessedBy(Location),
}

#[derive(Clone, Default)]
pub(crate) struct Page {
    valid: u32,
    last_write: Option<Point>,
    reads: Vec<Point>,
    /// Last use on a device (the space's tick), for LRU.
    tick: u64,
    /// `pages_in` of the device when the page was last evicted from it.
    evicted_at: Option<u64>,
    thrash: u32,
    /// Written at least once (host or device). An untouched page is zero in
    /// every memory, so making it resident copies nothing (first touch).
    touched: bool,
    read_mostly: bool,
    /// Preferred memory index, if advised.
    preferred: Option<u8>,
    /// Memories that keep a current copy (bit per memory index).
    accessed_by: u32,
}

impl Page {
    fn has(&self, mem: u8) -> bool {
        self.valid & (1 << mem) != 0
    }

    /// Pending points of other streams' work a reader (`write` false) or a
    /// writer must follow.
    fn deps(&self, write: bool, stream: u64, out: &mut Vec<Point>) {
        let other = |p: &Point| p.timeline.stream != stream || stream == 0;
        if let Some(w) = &self.last_write {
            if w.pending() && other(w) {
                out.push(w.clone());
            }
        }
        if write {
            out.extend(
                self.reads
                    .iter()
                    .filter(|p| p.pending() && other(p))
                    .cloned(),
            );
        }
    }

    fn busy(&self) -> bool {
        self.last_write.as_ref().is_some_and(Point::pending)
            || self.reads.iter().any(Point::pending)
    }

    fn write(&mut self, p: Point) {
        self.last_write = Some(p);
        self.reads.clear();
    }

    fn read(&mut self, p: Point) {
        self.reads.retain(Point::pending);
        if !self.reads.iter().any(|r| r.same(&p)) {
            self.reads.push(p);
        }
    }
}

/// One managed buffer's pages and the memory behind each of its copies.
pub(crate) struct Table {
    pub(crate) pages: Vec<Page>,
    pub(crate) page_bytes: usize,
    pub(crate) bytes: usize,
    /// The host's copy (pinned memory where the device has its own).
    pub(crate) host: Arc<Storage>,
    /// The device's copy (the same storage as `host` where the device's
    /// memory is the host's: no copies ever).
    pub(crate) dev: Arc<Storage>,
    /// The device's memory index (`HOST` when it is the host's memory).
    pub(crate) dev_mem: u8,
    /// The mapping under `dev`, where the device's memory is modelled in
    /// host memory: idle clean pages it evicts are given back.
    pub(crate) window: Option<Arc<window::Window>>,
}

impl Table {
    pub(crate) fn new(
        bytes: usize,
        page_bytes: usize,
        host: Arc<Storage>,
        dev: Arc<Storage>,
        dev_mem: u8,
        window: Option<Arc<window::Window>>,
    ) -> Table {
        let n = bytes.div_ceil(page_bytes);
        Table {
            pages: vec![
                Page {
                    valid: 1 << HOST,
                    ..Page::default()
                };
                n
            ],
            page_bytes,
            bytes,
            host,
            dev,
            dev_mem,
            window,
        }
    }

    /// The pages a byte range covers.
    pub(crate) fn pages_of(&self, off: usize, len: usize) -> std::ops::Range<usize> {
        if len == 0 {
            return 0..0;
        }
        off / self.page_bytes..(off + len).div_ceil(self.page_bytes)
    }

    fn page_len(&self, p: usize) -> usize {
        self.page_bytes.min(self.bytes - p * self.page_bytes)
    }

    fn run_bytes(&self, r: &std::ops::Range<usize>) -> (usize, usize) {
        let off = r.start * self.page_bytes;
        let end = (r.end * self.page_bytes).min(self.bytes);
        (off, end - off)
    }
}

/// An access of an op to a byte range of a managed buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access {
    pub(crate) buffer: u64,
    pub(crate) off: usize,
    pub(crate) bytes: usize,
    pub(crate) write: bool,
}

/// A run of pages of one buffer to move; `copy` false for a clean eviction.
#[derive(Clone, Debug)]
pub(crate) struct Move {
    pub(crate) buffer: u64,
    pub(crate) pages: std::ops::Range<usize>,
    /// Byte offset and length of the run.
    pub(crate) off: usize,
    pub(crate) bytes: usize,
    pub(crate) copy: bool,
}

/// What an access needs submitted before its op, in this order.
#[derive(Default)]
pub(crate) struct Plan {
    /// Memory waits for other streams' queued work.
    pub(crate) waits: Vec<Point>,
    /// Pages to evict from the device (dirty runs are copied back).
    pub(crate) evictions: Vec<Move>,
    /// Runs to copy towards the target memory.
    pub(crate) moves: Vec<Move>,
}

/// Why an access cannot be made resident: its own pages exceed the budget.
#[derive(Debug)]
pub(crate) struct TooLarge {
    pub(crate) needed: usize,
    pub(crate) budget: usize,
}

/// Totals since the device's first managed buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagedStats {
    /// Bytes copied host → device (declared accesses and prefetches).
    pub bytes_to_device: u64,
    /// Bytes copied device → host (host access, prefetches, dirty evictions).
    pub bytes_to_host: u64,
    /// Pages moved for kernels' and copies' declared accesses.
    pub declared_pages: u64,
    /// Pages moved by prefetches.
    pub prefetch_pages: u64,
    /// Pages copied back for host guards.
    pub host_access_pages: u64,
    /// Pages copied back for host faults on a buffer's host view.
    pub host_fault_pages: u64,
    /// Clean pages evicted (no bytes moved).
    pub clean_evictions: u64,
    /// Dirty pages evicted (each copied back once).
    pub dirty_evictions: u64,
    /// Bytes copied back by dirty evictions.
    pub dirty_eviction_bytes: u64,
    /// Pages evicted and needed again before a budget's worth of others came in.
    pub thrash_events: u64,
    /// Pages that reached the throttling threshold.
    pub throttled_pages: u64,
    /// Pages that reached the pinning threshold.
    pub pinned_pages: u64,
    /// Bytes of managed pages resident on the device now.
    pub resident_bytes: u64,
}

/// A stream timeline, and from which of its values it waits for which live
/// hold: `(value, hold)`.
type Blocked = (Arc<Timeline>, Vec<(u64, usize)>);

/// The managed state of one device: every managed buffer's table, what each
/// memory holds, and the totals.
#[derive(Default)]
pub(crate) struct Space {
    pub(crate) tables: HashMap<u64, Table>,
    resident: [usize; MAX_MEMORIES],
    /// Pages copied into each memory so far (the thrash window's clock).
    pages_in: [u64; MAX_MEMORIES],
    tick: u64,
    pub(crate) stats: ManagedStats,
    /// Host guards' holds that are live (their timelines, as addresses).
    live_holds: std::collections::HashSet<usize>,
    /// Per stream timeline (address): from which of its values on it waits
    /// for which live hold (a memory wait this file planned, on a hold or on
    /// work that itself waits for one). Lets a host thread see that a wait
    /// would end only after a guard it holds drops.
    /// The timeline is kept so its address names it while the entry lives.
    blocked: HashMap<usize, Blocked>,
    /// Thrash throttling and pinning off (`Device::set_managed_thrash_throttling`):
    /// thrash events are still counted, eviction ignores them.
    pub(crate) no_throttle: bool,
    /// Migrate as a faulting device would (`Device::set_managed_fault_model`).
    pub(crate) fault_model: Option<DeviceFaultCost>,
    /// Device time at which the modelled fault servicer is free.
    pub(crate) fault_servicer: Arc<std::sync::atomic::AtomicU64>,
}

/// What a modelled device page fault costs (`Device::set_managed_fault_model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFaultCost {
    /// Faults serviced together (NVIDIA's UVM driver: up to 256 per batch,
    /// `uvm_perf_fault_batch_count`).
    pub batch_faults: usize,
    /// Service time of one batch, ns, before its pages move.
    pub batch_ns: u64,
}

fn key(t: &Arc<Timeline>) -> usize {
    Arc::as_ptr(t) as usize
}

impl Space {
    /// A host guard's hold (on timeline `t`) is live.
    pub(crate) fn add_hold(&mut self, t: &Arc<Timeline>) {
        self.live_holds.insert(key(t));
    }

    /// A hold ended: nothing waits for it any more.
    pub(crate) fn release_hold(&mut self, hold: usize) {
        self.live_holds.remove(&hold);
        self.blocked.retain(|_, (_, v)| {
            v.retain(|&(_, k)| k != hold);
            !v.is_empty()
        });
    }

    /// The live holds whose release `p` waits for (itself, if it is one).
    pub(crate) fn holds_behind(&self, p: &Point) -> Vec<usize> {
        let k = key(&p.timeline);
        let mut out = Vec::new();
        if self.live_holds.contains(&k) {
            out.push(k);
        }
        if let Some((_, v)) = self.blocked.get(&k) {
            out.extend(v.iter().filter(|&&(at, _)| at <= p.value).map(|&(_, h)| h));
        }
        out
    }

    /// Stream `t` waits, from its value `at`, for `p`.
    pub(crate) fn note_wait(&mut self, t: &Arc<Timeline>, at: u64, p: &Point) {
        let holds = self.holds_behind(p);
        if !holds.is_empty() {
            let (_, v) = self
                .blocked
                .entry(key(t))
                .or_insert_with(|| (t.clone(), Vec::new()));
            v.extend(holds.into_iter().map(|h| (at, h)));
        }
    }

    #[cfg(test)]
    fn resident(&self, mem: u8) -> usize {
        self.resident[mem as usize]
    }

    /// The waits and copies that make `accesses` resident in memory `mem`
    /// for an op on `stream` (0: the host), evicting past `budget` bytes.
    /// Changes nothing.
    pub(crate) fn plan_device(
        &self,
        accesses: &[Access],
        mem: u8,
        stream: u64,
        budget: Option<usize>,
    ) -> Result<Plan, TooLarge> {
        let mut plan = Plan::default();
        // The access's own pages, per buffer (a page used by two arguments
        // counts once, as a writer if either writes).
        let mut own: HashMap<(u64, usize), bool> = HashMap::new();
        for a in accesses {
            let Some(t) = self.tables.get(&a.buffer) else {
                continue;
            };
            for p in t.pages_of(a.off, a.bytes) {
                *own.entry((a.buffer, p)).or_default() |= a.write;
            }
        }
        let mut keys: Vec<_> = own.keys().copied().collect();
        keys.sort_unstable();
        let mut needed = 0usize;
        let mut incoming = 0usize;
        for &(b, p) in &keys {
            let t = &self.tables[&b];
            let page = &t.pages[p];
            let len = t.page_len(p);
            needed += len;
            let write = own[&(b, p)];
            let moving = mem != HOST && !page.has(mem);
            // A migration copy writes the target memory's copy: it follows
            // readers too.
            page.deps(write || moving, stream, &mut plan.waits);
            if moving {
                incoming += len;
                push_run(&mut plan.moves, t, b, p, page.touched);
            }
        }
        if mem == HOST {
            return Ok(plan);
        }
        if let Some(budget) = budget {
            if needed > budget {
                return Err(TooLarge { needed, budget });
            }
            let resident = self.resident[mem as usize];
            if resident + incoming > budget {
                let mut want = resident + incoming - budget;
                let mut victims: Vec<(u8, u64, u64, usize, usize)> = Vec::new();
                for (&b, t) in &self.tables {
                    if t.dev_mem != mem {
                        continue;
                    }
                    for (p, page) in t.pages.iter().enumerate() {
                        if page.has(mem) && !own.contains_key(&(b, p)) {
                            let rank = victim_rank(page, mem, !self.no_throttle);
                            victims.push((rank, page.tick, b, p, t.page_len(p)));
                        }
                    }
                }
                victims.sort_unstable();
                let mut chosen: Vec<(u64, usize)> = Vec::new();
                for (_, _, b, p, len) in victims {
                    if want == 0 {
                        break;
                    }
                    chosen.push((b, p));
                    want = want.saturating_sub(len);
                }
                chosen.sort_unstable();
                for (b, p) in chosen {
                    let t = &self.tables[&b];
                    let page = &t.pages[p];
                    let dirty = !page.has(HOST);
                    // After the page's queued work; a copy back writes the
                    // host's copy.
                    page.deps(true, stream, &mut plan.waits);
                    push_run(&mut plan.evictions, t, b, p, dirty);
                }
                // Past evicting everything evictable the access still does not
                // fit: the rest of the budget is the pool's, or pages other
                // accesses are queued on. Pages pinned by thrash count as
                // evictable above, so this is only an access larger than the
                // budget, refused earlier.
            }
        }
        Ok(plan)
    }

    /// The waits before the host reads (`write` false) or writes a range,
    /// and the runs to copy back to the host first.
    pub(crate) fn plan_host(&self, a: &Access) -> Plan {
        let mut plan = Plan::default();
        let Some(t) = self.tables.get(&a.buffer) else {
            return plan;
        };
        for p in t.pages_of(a.off, a.bytes) {
            let page = &t.pages[p];
            page.deps(a.write, 0, &mut plan.waits);
            if !page.has(HOST) {
                push_run(&mut plan.moves, t, a.buffer, p, true);
            }
        }
        plan
    }

    /// The copies back for a prefetch of a range to the host on `stream`.
    pub(crate) fn plan_to_host(&self, a: &Access, stream: u64) -> Plan {
        let mut plan = Plan::default();
        let Some(t) = self.tables.get(&a.buffer) else {
            return plan;
        };
        for p in t.pages_of(a.off, a.bytes) {
            let page = &t.pages[p];
            let moving = !page.has(HOST);
            let dropping = !page.read_mostly && t.dev_mem != HOST && page.has(t.dev_mem);
            if moving || dropping {
                page.deps(true, stream, &mut plan.waits);
            }
            if moving {
                push_run(&mut plan.moves, t, a.buffer, p, true);
            }
        }
        plan
    }

    /// An eviction was submitted (`copy`: its copy back, at `point`).
    pub(crate) fn apply_eviction(&mut self, m: &Move, mem: u8, point: Option<Point>) {
        let Some(t) = self.tables.get_mut(&m.buffer) else {
            return;
        };
        let mut freed = 0;
        let pages_in = self.pages_in[mem as usize];
        for p in m.pages.clone() {
            let len = t.page_len(p);
            let page = &mut t.pages[p];
            if !page.has(mem) {
                continue;
            }
            freed += len;
            page.valid &= !(1 << mem);
            page.evicted_at = Some(pages_in);
            if let Some(pt) = &point {
                page.valid |= 1 << HOST;
                page.write(pt.clone());
                self.stats.dirty_evictions += 1;
                self.stats.dirty_eviction_bytes += len as u64;
                self.stats.bytes_to_host += len as u64;
            } else {
                self.stats.clean_evictions += 1;
                if !page.busy() {
                    if let Some(w) = &t.window {
                        w.release(p * t.page_bytes, len);
                    }
                }
            }
        }
        self.resident[mem as usize] -= freed;
        self.sync_resident(mem);
    }

    /// A copy of a run into memory `to` was submitted, ordered at `point`
    /// (`None` for a first touch, which copies nothing: `m.copy` is false).
    pub(crate) fn apply_move(
        &mut self,
        m: &Move,
        to: u8,
        point: Option<Point>,
        reason: MigrationReason,
        budget: Option<usize>,
    ) {
        let Some(t) = self.tables.get_mut(&m.buffer) else {
            return;
        };
        let window = budget.map(|b| (b / t.page_bytes.max(1)) as u64);
        let mut added = 0;
        for p in m.pages.clone() {
            let len = t.page_len(p);
            let page = &mut t.pages[p];
            if page.has(to) {
                continue;
            }
            if to != HOST {
                let now = self.pages_in[to as usize];
                if let (Some(at), Some(w)) = (page.evicted_at, window) {
                    if now - at < w {
                        page.thrash += 1;
                        self.stats.thrash_events += 1;
                        if page.thrash == THROTTLE_AFTER && !self.no_throttle {
                            self.stats.throttled_pages += 1;
                        }
                        if page.thrash == PIN_AFTER && !self.no_throttle {
                            self.stats.pinned_pages += 1;
                        }
                    }
                }
                page.evicted_at = None;
                self.pages_in[to as usize] += 1;
                added += len;
                if point.is_some() {
                    self.stats.bytes_to_device += len as u64;
                }
                if !page.read_mostly {
                    // One device copy at a time: the host's stays.
                    page.valid &= 1 << HOST;
                }
            } else if point.is_some() {
                self.stats.bytes_to_host += len as u64;
            }
            page.valid |= 1 << to;
            let Some(point) = &point else {
                continue;
            };
            if to == HOST {
                // A copy back for a host read is not ordered after the
                // device copy's queued readers (a read waits for writers
                // only): they stay, so a later write to either copy (a
                // copy in, a host write) still waits for them.
                page.reads.retain(Point::pending);
                page.last_write = Some(point.clone());
            } else {
                page.write(point.clone());
            }
            match reason {
                MigrationReason::Declared => self.stats.declared_pages += 1,
                MigrationReason::Prefetch => self.stats.prefetch_pages += 1,
                MigrationReason::HostAccess => self.stats.host_access_pages += 1,
                MigrationReason::HostFault => self.stats.host_fault_pages += 1,
                MigrationReason::Eviction => {}
            }
        }
        if to != HOST {
            self.resident[to as usize] += added;
            self.sync_resident(to);
        }
    }

    /// An op that reads or writes `a` in memory `mem` was submitted at `point`.
    pub(crate) fn apply_use(&mut self, a: &Access, mem: u8, point: Point) {
        self.tick += 1;
        let tick = self.tick;
        let Some(t) = self.tables.get_mut(&a.buffer) else {
            return;
        };
        let mut dropped = 0;
        for p in t.pages_of(a.off, a.bytes) {
            let len = t.page_len(p);
            let page = &mut t.pages[p];
            page.tick = tick;
            if a.write {
                if mem == HOST && t.dev_mem != HOST && page.has(t.dev_mem) {
                    dropped += len;
                }
                page.valid = 1 << mem;
                page.touched = true;
                page.write(point.clone());
            } else {
                page.read(point.clone());
            }
        }
        let dev = t.dev_mem;
        if dropped > 0 {
            self.resident[dev as usize] -= dropped;
            self.sync_resident(dev);
        }
    }

    /// The host wrote `a` through its view (a fault, after every queued op on
    /// the pages completed and the host's copy is current): the host's copy
    /// is the only one.
    pub(crate) fn apply_host_write(&mut self, a: &Access) {
        let Some(t) = self.tables.get_mut(&a.buffer) else {
            return;
        };
        let dev = t.dev_mem;
        let mut dropped = 0;
        for p in t.pages_of(a.off, a.bytes) {
            let len = t.page_len(p);
            let page = &mut t.pages[p];
            if dev != HOST && page.has(dev) {
                dropped += len;
            }
            page.valid = 1 << HOST;
            page.touched = true;
        }
        if dropped > 0 {
            self.resident[dev as usize] -= dropped;
            self.sync_resident(dev);
        }
    }

    /// Page `p` of `buffer` may hold data other than zero (its host view
    /// may have written it).
    pub(crate) fn mark_touched(&mut self, buffer: u64, p: usize) {
        if let Some(page) = self
            .tables
            .get_mut(&buffer)
            .and_then(|t| t.pages.get_mut(p))
        {
            page.touched = true;
        }
    }

    /// What a buffer's host view may do with page `p` now: write where the
    /// host holds the only copy and nothing is queued on it, read where its
    /// copy is current, nothing otherwise.
    pub(crate) fn host_access(&self, buffer: u64, p: usize) -> u32 {
        let Some(page) = self.tables.get(&buffer).and_then(|t| t.pages.get(p)) else {
            return fault::CLOSED;
        };
        let pending_write = page.last_write.as_ref().is_some_and(Point::pending);
        if !page.has(HOST) || pending_write {
            fault::CLOSED
        } else if page.valid == 1 << HOST && !page.busy() {
            fault::WRITE
        } else {
            fault::READ
        }
    }

    /// A prefetch to the host of `a` was submitted: without ReadMostly the
    /// device's copies go (their copy back, if any, is ordered before).
    pub(crate) fn apply_to_host(&mut self, a: &Access, stream_point: Option<Point>) {
        let Some(t) = self.tables.get_mut(&a.buffer) else {
            return;
        };
        let dev = t.dev_mem;
        if dev == HOST {
            return;
        }
        let mut dropped = 0;
        for p in t.pages_of(a.off, a.bytes) {
            let len = t.page_len(p);
            let page = &mut t.pages[p];
            if !page.read_mostly && page.has(dev) && page.has(HOST) {
                page.valid &= !(1 << dev);
                dropped += len;
                if let Some(pt) = &stream_point {
                    // Later device copies in follow this stream's point.
                    page.write(pt.clone());
                }
            }
        }
        self.resident[dev as usize] -= dropped;
        self.sync_resident(dev);
    }

    /// Sets or clears advice on a range.
    pub(crate) fn advise(
        &mut self,
        buffer: u64,
        off: usize,
        bytes: usize,
        advice: Advice,
        mems: impl Fn(Location) -> Option<u8>,
        on: bool,
    ) {
        let Some(t) = self.tables.get_mut(&buffer) else {
            return;
        };
        for p in t.pages_of(off, bytes) {
            let page = &mut t.pages[p];
            match advice {
                Advice::ReadMostly => page.read_mostly = on,
                Advice::PreferredLocation(l) => page.preferred = if on { mems(l) } else { None },
                Advice::AccessedBy(l) => {
                    if let Some(m) = mems(l) {
                        if on {
                            page.accessed_by |= 1 << m;
                        } else {
                            page.accessed_by &= !(1 << m);
                        }
                    }
                }
            }
        }
    }

    /// The runs of `a`'s pages that memory `mem` keeps current (AccessedBy)
    /// and does not hold.
    pub(crate) fn accessed_by_missing(&self, a: &Access, mem: u8) -> Vec<Access> {
        let mut out: Vec<Access> = Vec::new();
        let Some(t) = self.tables.get(&a.buffer) else {
            return out;
        };
        for p in t.pages_of(a.off, a.bytes) {
            let page = &t.pages[p];
            if page.accessed_by & (1 << mem) != 0 && !page.has(mem) {
                let (off, len) = t.run_bytes(&(p..p + 1));
                match out.last_mut() {
                    Some(last) if last.off + last.bytes == off => last.bytes += len,
                    _ => out.push(Access {
                        buffer: a.buffer,
                        off,
                        bytes: len,
                        write: false,
                    }),
                }
            }
        }
        out
    }

    /// A buffer is gone: its resident pages stop counting.
    pub(crate) fn remove(&mut self, buffer: u64) {
        if let Some(t) = self.tables.remove(&buffer) {
            if t.dev_mem != HOST {
                let held: usize = (0..t.pages.len())
                    .filter(|&p| t.pages[p].has(t.dev_mem))
                    .map(|p| t.page_len(p))
                    .sum();
                self.resident[t.dev_mem as usize] -= held;
                self.sync_resident(t.dev_mem);
            }
        }
    }

    fn sync_resident(&mut self, mem: u8) {
        if mem != HOST {
            self.stats.resident_bytes = self.resident[mem as usize] as u64;
        }
    }

    /// Whether a page is busy with queued work (for tests and figures).
    #[cfg(test)]
    fn page(&self, buffer: u64, p: usize) -> &Page {
        &self.tables[&buffer].pages[p]
    }
}

/// Lower goes first: idle before busy; preferring the host, then no
/// preference, then throttled, then preferring this device, then pinned.
fn victim_rank(page: &Page, mem: u8, throttle: bool) -> u8 {
    let class = if throttle && page.thrash >= PIN_AFTER {
        4
    } else if page.preferred == Some(mem) {
        3
    } else if throttle && page.thrash >= THROTTLE_AFTER {
        2
    } else if page.preferred == Some(HOST) {
        0
    } else {
        1
    };
    class * 2 + u8::from(page.busy())
}

fn push_run(runs: &mut Vec<Move>, t: &Table, buffer: u64, p: usize, copy: bool) {
    if let Some(last) = runs.last_mut() {
        if last.buffer == buffer && last.pages.end == p && last.copy == copy {
            last.pages.end = p + 1;
            let (off, bytes) = t.run_bytes(&last.pages);
            last.off = off;
            last.bytes = bytes;
            return;
        }
    }
    let pages = p..p + 1;
    let (off, bytes) = t.run_bytes(&pages);
    runs.push(Move {
        buffer,
        pages,
        off,
        bytes,
        copy,
    });
}

/// A storage over `bytes` of `base` from `off`: what a migration copy or a
/// kernel's argument names, so that ops on different parts of one managed
/// buffer take different access locks (the page waits above order them).
/// Keeps `base` alive.
pub(crate) fn view(base: &Arc<Storage>, off: usize, bytes: usize, reach: Reach) -> Arc<Storage> {
    debug_assert!(off + bytes <= base.bytes());
    let host_visible = base.host_visible();
    let engine = base.engine_ptr(reach);
    // An empty view keeps the base's (aligned) pointer.
    let at = if bytes == 0 {
        engine
    } else {
        engine.wrapping_add(off)
    };
    let ptr = NonNull::new(at).unwrap_or(NonNull::dangling());
    let mut s = Storage::from_parts(
        base.device,
        base.kind,
        ptr,
        bytes,
        Backing::Registered(Registration {
            _memory: Box::new(base.clone()),
            undo: None,
        }),
    );
    if host_visible {
        if bytes > 0 {
            s.set_device_address(base.device_addr() + off as u64);
        }
    } else {
        s.set_device_memory(base.device_addr() + off as u64);
    }
    Arc::new(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CompletionMode;
    use crate::exec::storage::MemoryKind;

    /// Zeroed memory the storage owns (freed when it drops: the suite runs
    /// under LeakSanitizer).
    fn storage(bytes: usize) -> Arc<Storage> {
        let mut mem = vec![0u8; bytes.max(1)].into_boxed_slice();
        let ptr = NonNull::new(mem.as_mut_ptr()).expect("not null");
        let owner = crate::exec::storage::Registration {
            // Moving the box moves no bytes: `ptr` stays valid while it lives.
            _memory: Box::new(mem),
            undo: None,
        };
        Arc::new(Storage::from_parts(
            1,
            MemoryKind::Device,
            ptr,
            bytes,
            Backing::Registered(owner),
        ))
    }

    fn space(pages: usize, page: usize) -> Space {
        let mut s = Space::default();
        let st = storage(pages * page);
        s.tables
            .insert(7, Table::new(pages * page, page, st.clone(), st, 1, None));
        s
    }

    fn point(stream: u64, value: u64) -> Point {
        Point {
            timeline: Arc::new(Timeline::new(1, stream, CompletionMode::Spin)),
            value,
        }
    }

    fn all(bytes: usize, write: bool) -> Access {
        Access {
            buffer: 7,
            off: 0,
            bytes,
            write,
        }
    }

    #[test]
    fn a_read_copies_in_once_and_a_write_makes_the_page_dirty() {
        let mut s = space(4, 4096);
        let plan = s
            .plan_device(&[all(4096 * 4, false)], 1, 1, Some(1 << 20))
            .expect("fits");
        assert_eq!(plan.moves.len(), 1, "one run");
        assert_eq!(plan.moves[0].bytes, 4 * 4096);
        s.apply_move(
            &plan.moves[0],
            1,
            Some(point(1, 1)),
            MigrationReason::Declared,
            Some(1 << 20),
        );
        assert_eq!(s.resident(1), 4 * 4096);
        let again = s
            .plan_device(&[all(4096 * 4, true)], 1, 1, Some(1 << 20))
            .expect("fits");
        assert!(again.moves.is_empty(), "already resident");
        s.apply_use(&all(4096 * 4, true), 1, point(1, 2));
        assert_eq!(s.page(7, 0).valid, 1 << 1, "dirty on the device only");
        let host = s.plan_host(&all(4096, false));
        assert_eq!(host.moves.len(), 1);
        assert_eq!(host.waits.len(), 1, "waits for the writer");
    }

    #[test]
    fn a_copy_back_keeps_the_device_copys_queued_readers() {
        let mut s = space(1, 4096);
        let a = all(4096, true);
        s.apply_use(&a, 1, point(1, 1));
        assert_eq!(s.page(7, 0).valid, 1 << 1, "dirty on the device");
        // A kernel reading the device copy, still queued (point 2 of
        // stream 2 is not reached).
        let reader = point(2, 2);
        s.apply_use(&all(4096, false), 1, reader.clone());
        let back = s.plan_host(&all(4096, false));
        assert_eq!(back.moves.len(), 1);
        s.apply_move(
            &back.moves[0],
            HOST,
            Some(point(3, 1)),
            MigrationReason::HostAccess,
            None,
        );
        // A host write now must wait for that reader too (a copy in after it
        // would overwrite what it reads).
        let mut waits = Vec::new();
        s.page(7, 0).deps(true, 0, &mut waits);
        assert!(waits.iter().any(|p| p.same(&reader)), "the reader is kept");
    }

    #[test]
    fn past_the_budget_the_least_recently_used_page_goes_clean_before_dirty_counts() {
        let mut s = space(4, 4096);
        let budget = Some(2 * 4096);
        for p in 0..2 {
            let a = Access {
                buffer: 7,
                off: p * 4096,
                bytes: 4096,
                write: p == 1,
            };
            let plan = s.plan_device(&[a], 1, 1, budget).expect("fits");
            s.apply_move(
                &plan.moves[0],
                1,
                Some(point(1, 1)),
                MigrationReason::Declared,
                budget,
            );
            s.apply_use(&a, 1, point(1, 2));
        }
        let a = Access {
            buffer: 7,
            off: 2 * 4096,
            bytes: 4096,
            write: false,
        };
        let plan = s.plan_device(&[a], 1, 1, budget).expect("fits");
        assert_eq!(plan.evictions.len(), 1);
        assert_eq!(plan.evictions[0].pages, 0..1, "least recently used");
        assert!(!plan.evictions[0].copy, "page 0 is clean");
        let a = Access {
            buffer: 7,
            off: 0,
            bytes: 3 * 4096,
            write: false,
        };
        let err = s.plan_device(&[a], 1, 1, budget).err().expect("too large");
        assert_eq!((err.needed, err.budget), (3 * 4096, 2 * 4096));
    }
}
