//! Managed memory's page state machine: which memories hold each page of a
//! managed buffer, what queued work touches it, and which pages a device
//! evicts past its capacity. The public handles and the ops that move bytes
//! are `api/managed.rs`; this floor only decides, as plain data.
//!
//! # Page states
//! A managed buffer is cut into pages (64 KiB by default). Memory 0 is the
//! host; memory `m >= 1` is a device's copy. A buffer of one device has one
//! device memory; a buffer of a context (`Context::alloc_managed`) has one
//! per device of the context, memory `i + 1` for the context's `i`-th device
//! (its topology's order). On the host backend every device's memory is the
//! host's: all its accesses name memory 0 and nothing moves. Per page:
//! - `valid`: a bit per memory that holds the page's current data. Never
//!   empty. `{host}`: host only; `{host, d, ...}`: the device copies are
//!   *clean* (evicting one costs no copy); `{d}`: *dirty* on `d` (evicting it
//!   costs exactly one copy back); `{d, e}` (ReadMostly replicas of a page a
//!   device wrote): neither is the last copy, so evicting either costs none.
//! - `last_write`: the point of the last queued op that wrote the page's data
//!   in any memory (a kernel's write, a migration copy, a host write guard's
//!   hold), `reads`: the points of queued readers since (kernels' reads, host
//!   read guards' holds, the ends of prefetches to the host that dropped
//!   device copies).
//!
//! - `touched`: written at least once anywhere. An untouched page is zero in
//!   every memory, so making it resident copies nothing (first touch).
//!
//! Transitions (`d` the acting device; "copy in" only for a touched page):
//! ```text
//!   device read on d:    d ∉ valid → copy in: from the host if   valid ∪= {d}
//!                        it holds the page, else from a device
//!                        that does (a peer copy, or staged: a
//!                        copy back, then in from the host)
//!                        without ReadMostly other devices drop theirs
//!   device write on d:   copy in as above, then                 valid  = {d}
//!   host read guard:     host ∉ valid → copy back (from a       valid ∪= {host}
//!                        device that holds the page, on a
//!                        stream of that device)
//!   host write guard:    copy back as above, then               valid  = {host}
//!   prefetch to d:       as a device read, no kernel
//!   prefetch to host:    copy back; without ReadMostly          valid  = {host}
//!   eviction from d:     last copy → one copy back, else none   valid −= {d}
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
//! a program's result is its sequential one. Points name a stream by
//! (device, stream), stream ids being per device; a wait for a point of
//! another device's stream is a cross-device memory wait (the waiting device
//! watches that timeline, as for an event). A copy back for a host read
//! follows only `last_write`, so it leaves `reads` in place (the device
//! copy's readers may still be queued). Accesses to different pages do
//! not wait for each other. Points of completed work are dropped as they are
//! met.
//!
//! # Capacity
//! A device's managed pages count against its budget (its memory capacity
//! less what its pool holds), each device's separately. Past it, the pages to
//! evict are chosen among that device's resident pages the current access
//! does not use: pages with no queued work first, then by advice and thrash
//! rank, then least recently used. An eviction is ordered (on the acting
//! stream's migration stream) after the page's queued work (a stream-ordered
//! eviction, like a stream-ordered free). A page evicted from a memory and
//! needed there again before a budget's worth of other pages came in
//! thrashes; after 3 such events it is throttled (evicted only after every
//! unthrottled page), after 10 pinned (evicted only when nothing else can
//! go), UVM's thresholds. An access whose own pages exceed the budget is the
//! caller's typed error, before anything is submitted.
//!
//! # Concurrency
//! One `Space` behind one mutex (`api/managed.rs`) holds the tables of every
//! managed buffer a device can use: a device in no context has a space of its
//! own; the devices of a context share one, so a page's state in every
//! memory, every device's residency and every eviction choice are one
//! critical section (a migration between two devices changes both at once).
//! Who owns what: the space owns the tables and the per-memory figures
//! (resident bytes, pages copied in, `ManagedStats` per memory); a table
//! owns its pages' states and the storages of its copies; the api floor maps
//! devices to memory indices and owns the streams copies run on. The lock is
//! held to plan, submit the plan's ops and apply it (submission never waits
//! for work to run, only for ring room); never while a host thread waits for
//! work. `plan_*` change nothing; `apply_*` record what was submitted, so an
//! op refused on submission leaves the state as it was.

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

/// A stream as page states name it: (device, stream). Stream ids are per
/// device.
pub(crate) type Side = (u64, u64);
/// The host's side: every pending point is another stream's.
pub(crate) const HOST_SIDE: Side = (0, 0);

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
    /// The memory the page was last evicted from, and that memory's
    /// `pages_in` then (a thrash is a copy back into the same memory).
    evicted_at: Option<(u8, u64)>,
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

    /// A device memory that holds the page (the lowest), if any.
    fn holder(&self) -> Option<u8> {
        let devices = self.valid & !(1 << HOST);
        (devices != 0).then(|| devices.trailing_zeros() as u8)
    }

    /// Where a copy into another memory reads the page: the host's copy if
    /// current (or the page is untouched: nothing is read), else a device's.
    fn source(&self) -> u8 {
        if self.has(HOST) || !self.touched {
            HOST
        } else {
            self.holder().unwrap_or(HOST)
        }
    }

    /// Pending points of other streams' work a reader (`write` false) or a
    /// writer must follow.
    fn deps(&self, write: bool, side: Side, out: &mut Vec<Point>) {
        let other = |p: &Point| side == HOST_SIDE || (p.timeline.device, p.timeline.stream) != side;
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

/// One device's copy of a managed buffer, and the host's copy as that
/// device reaches it.
pub(crate) struct DeviceCopy {
    /// The copy's memory index (`HOST` where the device's memory is the
    /// host's: then `dev` is `host` and nothing ever moves).
    pub(crate) mem: u8,
    /// The host's copy, registered with this device (pinned memory or a
    /// mapping of it its engines reach).
    pub(crate) host: Arc<Storage>,
    /// The device's copy.
    pub(crate) dev: Arc<Storage>,
    /// The mapping under `dev`, where the device's memory is modelled in
    /// host memory: idle clean pages it evicts are given back.
    pub(crate) window: Option<Arc<window::Window>>,
}

/// One managed buffer's pages and the memory behind each of its copies.
pub(crate) struct Table {
    pub(crate) pages: Vec<Page>,
    pub(crate) page_bytes: usize,
    pub(crate) bytes: usize,
    /// One per device the buffer is usable on.
    pub(crate) copies: Vec<DeviceCopy>,
}

impl Table {
    pub(crate) fn new(bytes: usize, page_bytes: usize, copies: Vec<DeviceCopy>) -> Table {
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
            copies,
        }
    }

    /// The copy in memory `mem` (a device's), if the buffer has one.
    pub(crate) fn copy_at(&self, mem: u8) -> Option<&DeviceCopy> {
        self.copies.iter().find(|c| c.mem == mem)
    }

    /// Whether memory `mem` is one of the buffer's device memories.
    fn has_mem(&self, mem: u8) -> bool {
        mem != HOST && self.copy_at(mem).is_some()
    }

    /// The pages a byte range covers.
    pub(crate) fn pages_of(&self, off: usize, len: usize) -> std::ops::Range<usize> {
        if len == 0 {
            return 0..0;
        }
        off / self.page_bytes..(off + len).div_ceil(self.page_bytes)
    }

    /// Per memory of `mems`: the bytes a device access of the whole buffer
    /// there copies in, by the memory each page comes from
    /// ([`Page::source`]; an untouched page copies nothing). What the task
    /// layer weighs a placement with.
    pub(crate) fn copies_in(&self, mems: &[u8]) -> Vec<Vec<(u8, u64)>> {
        let mut out: Vec<Vec<(u8, u64)>> = vec![Vec::new(); mems.len()];
        for (p, page) in self.pages.iter().enumerate() {
            if !page.touched {
                continue;
            }
            let len = self.page_len(p) as u64;
            let from = page.source();
            for (i, &mem) in mems.iter().enumerate() {
                if page.has(mem) {
                    continue;
                }
                match out[i].iter_mut().find(|x| x.0 == from) {
                    Some(x) => x.1 += len,
                    None => out[i].push((from, len)),
                }
            }
        }
        out
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

/// A run of pages of one buffer to move; `copy` false for a clean eviction
/// (or a first touch).
#[derive(Clone, Debug)]
pub(crate) struct Move {
    pub(crate) buffer: u64,
    /// The memory the bytes come from (for an eviction, the evicting one).
    pub(crate) from: u8,
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

/// Totals since the device's first managed buffer (per device: each counts
/// the copies into and out of its own memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagedStats {
    /// Bytes copied host → device (declared accesses and prefetches).
    pub bytes_to_device: u64,
    /// Bytes copied device → host (host access, prefetches, dirty evictions).
    pub bytes_to_host: u64,
    /// Bytes copied into this device straight from another device's copy
    /// (a peer copy over a direct path; included in `bytes_to_device`).
    pub bytes_from_peer: u64,
    /// Bytes copied out of this device straight into another device's copy.
    pub bytes_to_peer: u64,
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

/// The managed state of a device, or of the devices of a context: every
/// managed buffer's table, what each memory holds, and the totals per memory.
#[derive(Default)]
pub(crate) struct Space {
    pub(crate) tables: HashMap<u64, Table>,
    resident: [usize; MAX_MEMORIES],
    /// Pages copied into each memory so far (the thrash window's clock).
    pages_in: [u64; MAX_MEMORIES],
    tick: u64,
    /// Per memory index (grown as memories are named).
    pub(crate) stats: Vec<ManagedStats>,
    /// Host guards' holds that are live (their timelines, as addresses).
    live_holds: std::collections::HashSet<usize>,
    /// Per stream timeline (address): from which of its values on it waits
    /// for which live hold (a memory wait this file planned, on a hold or on
    /// work that itself waits for one). Lets a host thread see that a wait
    /// would end only after a guard it holds drops.
    /// The timeline is kept so its address names it while the entry lives.
    blocked: HashMap<usize, Blocked>,
    /// Memories (bits) whose thrash throttling and pinning is off
    /// (`Device::set_managed_thrash_throttling`): thrash events are still
    /// counted, eviction ignores them.
    pub(crate) no_throttle: u32,
    /// Per memory: migrate as a faulting device would
    /// (`Device::set_managed_fault_model`), and the device time at which its
    /// modelled fault servicer is free.
    pub(crate) fault_models: HashMap<u8, (DeviceFaultCost, Arc<std::sync::atomic::AtomicU64>)>,
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
    /// The figures of memory `mem`.
    pub(crate) fn stats_mut(&mut self, mem: u8) -> &mut ManagedStats {
        let i = mem as usize;
        if self.stats.len() <= i {
            self.stats.resize(i + 1, ManagedStats::default());
        }
        &mut self.stats[i]
    }

    /// The figures of memory `mem` (zero if it never moved anything).
    pub(crate) fn stats_of(stats: &[ManagedStats], mem: u8) -> ManagedStats {
        stats.get(mem as usize).copied().unwrap_or_default()
    }

    /// Adds the totals of a device's former space (`old`, its memory's
    /// figures there) to memory `mem`'s; residency is this space's own.
    pub(crate) fn adopt_stats(&mut self, mem: u8, old: ManagedStats) {
        let st = self.stats_mut(mem);
        st.bytes_to_device += old.bytes_to_device;
        st.bytes_to_host += old.bytes_to_host;
        st.bytes_from_peer += old.bytes_from_peer;
        st.bytes_to_peer += old.bytes_to_peer;
        st.declared_pages += old.declared_pages;
        st.prefetch_pages += old.prefetch_pages;
        st.host_access_pages += old.host_access_pages;
        st.host_fault_pages += old.host_fault_pages;
        st.clean_evictions += old.clean_evictions;
        st.dirty_evictions += old.dirty_evictions;
        st.dirty_eviction_bytes += old.dirty_eviction_bytes;
        st.thrash_events += old.thrash_events;
        st.throttled_pages += old.throttled_pages;
        st.pinned_pages += old.pinned_pages;
    }

    fn throttles(&self, mem: u8) -> bool {
        self.no_throttle & (1 << mem) == 0
    }

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
    /// for an op on stream `side` (`HOST_SIDE`: the host), evicting from
    /// `mem` past `budget` bytes. Changes nothing.
    /// The bytes of the pages `accesses` cover, each page once (their page
    /// ranges merged per buffer: no walk of the pages).
    fn covered_bytes(&self, accesses: &[Access]) -> usize {
        let mut ranges: Vec<(u64, std::ops::Range<usize>)> = accesses
            .iter()
            .filter_map(|a| {
                let t = self.tables.get(&a.buffer)?;
                Some((a.buffer, t.pages_of(a.off, a.bytes)))
            })
            .filter(|(_, r)| !r.is_empty())
            .collect();
        ranges.sort_unstable_by_key(|(b, r)| (*b, r.start));
        let bytes = |b: u64, r: &std::ops::Range<usize>| self.tables[&b].run_bytes(r).1;
        let mut needed = 0;
        let mut run: Option<(u64, std::ops::Range<usize>)> = None;
        for (b, r) in ranges {
            match &mut run {
                Some((rb, rr)) if *rb == b && r.start <= rr.end => rr.end = rr.end.max(r.end),
                _ => {
                    if let Some((rb, rr)) = run.replace((b, r)) {
                        needed += bytes(rb, &rr);
                    }
                }
            }
        }
        needed + run.map_or(0, |(b, r)| bytes(b, &r))
    }

    pub(crate) fn plan_device(
        &self,
        accesses: &[Access],
        mem: u8,
        side: Side,
        budget: Option<usize>,
    ) -> Result<Plan, TooLarge> {
        if let (Some(budget), false) = (budget, mem == HOST) {
            // Past the budget whatever is resident: said before any page is
            // walked (a 1 TiB prefetch to a 16 GiB device walked 16 M pages
            // for 17 s to say so). The pages the accesses cover, each once:
            // their page ranges merged per buffer.
            let needed = self.covered_bytes(accesses);
            if needed > budget {
                return Err(TooLarge { needed, budget });
            }
        }
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
        let mut incoming = 0usize;
        for &(b, p) in &keys {
            let t = &self.tables[&b];
            let page = &t.pages[p];
            let len = t.page_len(p);
            let write = own[&(b, p)];
            let moving = mem != HOST && !page.has(mem);
            // A migration copy writes the target memory's copy: it follows
            // readers too.
            page.deps(write || moving, side, &mut plan.waits);
            if moving {
                incoming += len;
                push_run(&mut plan.moves, t, b, p, page.touched, page.source());
            }
        }
        if mem == HOST {
            return Ok(plan);
        }
        if let Some(budget) = budget {
            // (The accesses' own pages fit it: checked first.)
            let resident = self.resident[mem as usize];
            if resident + incoming > budget {
                let mut want = resident + incoming - budget;
                let mut victims: Vec<(u8, u64, u64, usize, usize)> = Vec::new();
                for (&b, t) in &self.tables {
                    if !t.has_mem(mem) {
                        continue;
                    }
                    for (p, page) in t.pages.iter().enumerate() {
                        if page.has(mem) && !own.contains_key(&(b, p)) {
                            let rank = victim_rank(page, mem, self.throttles(mem));
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
                    // The last copy anywhere: it goes back to the host.
                    let dirty = page.valid == 1 << mem;
                    // After the page's queued work; a copy back writes the
                    // host's copy.
                    page.deps(true, side, &mut plan.waits);
                    push_run(&mut plan.evictions, t, b, p, dirty, mem);
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
    /// and the runs to copy back to the host first (each from a device that
    /// holds it).
    pub(crate) fn plan_host(&self, a: &Access) -> Plan {
        let mut plan = Plan::default();
        let Some(t) = self.tables.get(&a.buffer) else {
            return plan;
        };
        for p in t.pages_of(a.off, a.bytes) {
            let page = &t.pages[p];
            page.deps(a.write, HOST_SIDE, &mut plan.waits);
            if !page.has(HOST) {
                push_run(&mut plan.moves, t, a.buffer, p, true, page.source());
            }
        }
        plan
    }

    /// The copies back for a prefetch of a range to the host on stream
    /// `side`.
    pub(crate) fn plan_to_host(&self, a: &Access, side: Side) -> Plan {
        let mut plan = Plan::default();
        let Some(t) = self.tables.get(&a.buffer) else {
            return plan;
        };
        for p in t.pages_of(a.off, a.bytes) {
            let page = &t.pages[p];
            let moving = !page.has(HOST);
            let dropping = !page.read_mostly && page.holder().is_some();
            if moving || dropping {
                page.deps(true, side, &mut plan.waits);
            }
            if moving {
                push_run(&mut plan.moves, t, a.buffer, p, true, page.source());
            }
        }
        plan
    }

    /// Drops page `p`'s copies in the device memories `mems` (bits):
    /// their room is free again. Returns nothing; updates residency.
    fn drop_copies(&mut self, buffer: u64, p: usize, mems: u32) {
        let Some(t) = self.tables.get_mut(&buffer) else {
            return;
        };
        let len = t.page_len(p);
        let page = &mut t.pages[p];
        let gone = page.valid & mems & !(1 << HOST);
        page.valid &= !gone;
        let mut bits = gone;
        while bits != 0 {
            let m = bits.trailing_zeros() as u8;
            bits &= bits - 1;
            self.resident[m as usize] -= len;
            self.sync_resident(m);
        }
    }

    /// An eviction was submitted (`copy`: its copy back, at `point`).
    pub(crate) fn apply_eviction(&mut self, m: &Move, mem: u8, point: Option<Point>) {
        let Some(t) = self.tables.get_mut(&m.buffer) else {
            return;
        };
        let mut freed = 0;
        let pages_in = self.pages_in[mem as usize];
        let (mut dirty, mut dirty_bytes, mut clean) = (0u64, 0u64, 0u64);
        for p in m.pages.clone() {
            let len = t.page_len(p);
            let page = &mut t.pages[p];
            if !page.has(mem) {
                continue;
            }
            freed += len;
            page.valid &= !(1 << mem);
            page.evicted_at = Some((mem, pages_in));
            if let Some(pt) = &point {
                page.valid |= 1 << HOST;
                page.write(pt.clone());
                dirty += 1;
                dirty_bytes += len as u64;
            } else {
                clean += 1;
                if !page.busy() {
                    if let Some(w) = t.copy_at(mem).and_then(|c| c.window.as_ref()) {
                        w.release(p * t.page_bytes, len);
                    }
                }
            }
        }
        self.resident[mem as usize] -= freed;
        let st = self.stats_mut(mem);
        st.dirty_evictions += dirty;
        st.dirty_eviction_bytes += dirty_bytes;
        st.bytes_to_host += dirty_bytes;
        st.clean_evictions += clean;
        self.sync_resident(mem);
    }

    /// A copy of a run into memory `to` (from `m.from`) was submitted,
    /// ordered at `point` (`None` for a first touch, which copies nothing:
    /// `m.copy` is false). `peer`: the bytes went straight from one device's
    /// memory to another's.
    pub(crate) fn apply_move(
        &mut self,
        m: &Move,
        to: u8,
        point: Option<Point>,
        reason: MigrationReason,
        budget: Option<usize>,
    ) {
        let Some(t) = self.tables.get(&m.buffer) else {
            return;
        };
        let window = budget.map(|b| (b / t.page_bytes.max(1)) as u64);
        let throttles = self.throttles(to);
        let from = m.from;
        for p in m.pages.clone() {
            let Some(t) = self.tables.get_mut(&m.buffer) else {
                return;
            };
            let len = t.page_len(p);
            let page = &mut t.pages[p];
            if page.has(to) {
                continue;
            }
            let (mut thrash, mut throttled, mut pinned) = (0, 0, 0);
            let mut others = 0u32;
            if to != HOST {
                let now = self.pages_in[to as usize];
                if let (Some((from_mem, at)), Some(w)) = (page.evicted_at, window) {
                    if from_mem == to && now - at < w {
                        page.thrash += 1;
                        thrash = 1;
                        if page.thrash == THROTTLE_AFTER && throttles {
                            throttled = 1;
                        }
                        if page.thrash == PIN_AFTER && throttles {
                            pinned = 1;
                        }
                    }
                }
                if page.evicted_at.is_some_and(|(m, _)| m == to) {
                    page.evicted_at = None;
                }
                self.pages_in[to as usize] += 1;
                self.resident[to as usize] += len;
                if !page.read_mostly {
                    // One device copy at a time: the host's stays.
                    others = page.valid & !(1 << HOST);
                }
            }
            page.valid |= 1 << to;
            if let Some(point) = &point {
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
            }
            let copied = point.is_some();
            let len = len as u64;
            if to == HOST {
                let st = self.stats_mut(from);
                if copied {
                    st.bytes_to_host += len;
                }
                count_reason(st, reason, copied);
            } else {
                let st = self.stats_mut(to);
                st.thrash_events += thrash;
                st.throttled_pages += throttled;
                st.pinned_pages += pinned;
                if copied {
                    st.bytes_to_device += len;
                    if from != HOST {
                        st.bytes_from_peer += len;
                    }
                }
                count_reason(st, reason, copied);
                if copied && from != HOST {
                    self.stats_mut(from).bytes_to_peer += len;
                }
                self.drop_copies(m.buffer, p, others);
            }
        }
        if to != HOST {
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
        let mut dropped = Vec::new();
        for p in t.pages_of(a.off, a.bytes) {
            let page = &mut t.pages[p];
            page.tick = tick;
            if a.write {
                dropped.push((p, page.valid & !(1 << mem)));
                page.touched = true;
                page.write(point.clone());
            } else {
                page.read(point.clone());
            }
        }
        for (p, others) in dropped {
            self.drop_copies(a.buffer, p, others);
            if let Some(page) = self
                .tables
                .get_mut(&a.buffer)
                .and_then(|t| t.pages.get_mut(p))
            {
                // A write leaves that memory alone in `valid` (the host's
                // copy too: `drop_copies` keeps it).
                page.valid = 1 << mem;
            }
        }
    }

    /// The host wrote `a` through its view (a fault, after every queued op on
    /// the pages completed and the host's copy is current): the host's copy
    /// is the only one.
    pub(crate) fn apply_host_write(&mut self, a: &Access) {
        let Some(t) = self.tables.get_mut(&a.buffer) else {
            return;
        };
        let pages = t.pages_of(a.off, a.bytes);
        for p in pages {
            self.drop_copies(a.buffer, p, u32::MAX);
            if let Some(page) = self
                .tables
                .get_mut(&a.buffer)
                .and_then(|t| t.pages.get_mut(p))
            {
                page.valid = 1 << HOST;
                page.touched = true;
            }
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
    /// devices' copies go, after `stream_point` (the end of the prefetching
    /// stream's waits and copies back): later writes of any copy follow it.
    pub(crate) fn apply_to_host(&mut self, a: &Access, stream_point: Option<Point>) {
        let Some(t) = self.tables.get_mut(&a.buffer) else {
            return;
        };
        let mut dropping = Vec::new();
        for p in t.pages_of(a.off, a.bytes) {
            let page = &mut t.pages[p];
            if !page.read_mostly && page.holder().is_some() && page.has(HOST) {
                if let Some(pt) = &stream_point {
                    // Later copies in (writers) follow this stream's point;
                    // the page's last write (a copy back on another
                    // device's stream, maybe) stays what readers follow.
                    page.read(pt.clone());
                }
                dropping.push(p);
            }
        }
        for p in dropping {
            self.drop_copies(a.buffer, p, u32::MAX);
        }
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
        let Some(t) = self.tables.get(&buffer) else {
            return;
        };
        for p in 0..t.pages.len() {
            self.drop_copies(buffer, p, u32::MAX);
        }
        self.tables.remove(&buffer);
    }

    fn sync_resident(&mut self, mem: u8) {
        if mem != HOST {
            let r = self.resident[mem as usize] as u64;
            self.stats_mut(mem).resident_bytes = r;
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

fn push_run(runs: &mut Vec<Move>, t: &Table, buffer: u64, p: usize, copy: bool, from: u8) {
    if let Some(last) = runs.last_mut() {
        if last.buffer == buffer && last.pages.end == p && last.copy == copy && last.from == from {
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
        from,
        pages,
        off,
        bytes,
        copy,
    });
}

/// Counts a copied page under its reason.
fn count_reason(st: &mut ManagedStats, reason: MigrationReason, copied: bool) {
    if !copied {
        return;
    }
    match reason {
        MigrationReason::Declared => st.declared_pages += 1,
        MigrationReason::Prefetch => st.prefetch_pages += 1,
        MigrationReason::HostAccess => st.host_access_pages += 1,
        MigrationReason::HostFault => st.host_fault_pages += 1,
        MigrationReason::Eviction => {}
    }
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
        let copy = DeviceCopy {
            mem: 1,
            host: st.clone(),
            dev: st,
            window: None,
        };
        s.tables
            .insert(7, Table::new(pages * page, page, vec![copy]));
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
            .plan_device(&[all(4096 * 4, false)], 1, (1, 1), Some(1 << 20))
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
            .plan_device(&[all(4096 * 4, true)], 1, (1, 1), Some(1 << 20))
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
        s.page(7, 0).deps(true, HOST_SIDE, &mut waits);
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
            let plan = s.plan_device(&[a], 1, (1, 1), budget).expect("fits");
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
        let plan = s.plan_device(&[a], 1, (1, 1), budget).expect("fits");
        assert_eq!(plan.evictions.len(), 1);
        assert_eq!(plan.evictions[0].pages, 0..1, "least recently used");
        assert!(!plan.evictions[0].copy, "page 0 is clean");
        let a = Access {
            buffer: 7,
            off: 0,
            bytes: 3 * 4096,
            write: false,
        };
        let err = s
            .plan_device(&[a], 1, (1, 1), budget)
            .err()
            .expect("too large");
        assert_eq!((err.needed, err.budget), (3 * 4096, 2 * 4096));
    }

    proptest::proptest! {
        /// The bytes past which a device access fails are those of the pages
        /// it covers, each once, found without walking the pages: as a walk
        /// counts them.
        #[test]
        fn the_covered_bytes_are_those_a_walk_of_the_pages_counts(
            spans in proptest::collection::vec((0usize..40_000, 0usize..20_000), 0..6),
        ) {
            let s = space(10, 4096);
            let accesses: Vec<Access> = spans
                .iter()
                .map(|&(off, bytes)| Access {
                    buffer: 7,
                    off,
                    bytes: bytes.min(10 * 4096 - off.min(10 * 4096)),
                    write: false,
                })
                .collect();
            let t = &s.tables[&7];
            let mut pages = std::collections::BTreeSet::new();
            for a in &accesses {
                pages.extend(t.pages_of(a.off, a.bytes));
            }
            let walked: usize = pages.iter().map(|&p| t.page_len(p)).sum();
            proptest::prop_assert_eq!(s.covered_bytes(&accesses), walked);
            // And past a budget below it, the plan fails with it.
            if walked > 0 {
                let err = s.plan_device(&accesses, 1, (1, 1), Some(walked - 1)).err();
                proptest::prop_assert_eq!(err.map(|e| e.needed), Some(walked));
            }
        }
    }

    /// A buffer with copies in memories 1 and 2 (two devices of a context).
    fn two_device_space(pages: usize, page: usize) -> Space {
        let mut s = Space::default();
        let st = storage(pages * page);
        let copies = (1..=2)
            .map(|mem| DeviceCopy {
                mem,
                host: st.clone(),
                dev: st.clone(),
                window: None,
            })
            .collect();
        s.tables.insert(7, Table::new(pages * page, page, copies));
        s
    }

    #[test]
    fn a_page_dirty_on_one_device_moves_to_another_from_it_and_read_mostly_keeps_both() {
        let mut s = two_device_space(2, 4096);
        let first = s
            .plan_device(&[all(2 * 4096, true)], 1, (1, 1), None)
            .expect("fits");
        s.apply_move(&first.moves[0], 1, None, MigrationReason::Declared, None);
        let writer = point(1, 1);
        s.apply_use(&all(2 * 4096, true), 1, writer.clone());
        let plan = s
            .plan_device(&[all(2 * 4096, false)], 2, (2, 1), None)
            .expect("fits");
        assert_eq!(plan.moves.len(), 1);
        assert_eq!(plan.moves[0].from, 1, "straight from device 1's copy");
        assert!(
            !plan.waits.is_empty() && plan.waits.iter().all(|w| w.same(&writer)),
            "after device 1's writer"
        );
        s.apply_move(
            &plan.moves[0],
            2,
            Some(point(2, 2)),
            MigrationReason::Declared,
            None,
        );
        assert_eq!(s.page(7, 0).valid, 1 << 2, "moved: one device copy");
        assert_eq!((s.resident(1), s.resident(2)), (0, 2 * 4096));
        assert_eq!(s.stats[2].bytes_from_peer, 2 * 4096);
        assert_eq!(s.stats[1].bytes_to_peer, 2 * 4096);
        // ReadMostly: a read on device 1 keeps device 2's replica.
        s.advise(7, 0, 2 * 4096, Advice::ReadMostly, |_| None, true);
        let plan = s
            .plan_device(&[all(2 * 4096, false)], 1, (1, 3), None)
            .expect("fits");
        s.apply_move(
            &plan.moves[0],
            1,
            Some(point(1, 3)),
            MigrationReason::Declared,
            None,
        );
        assert_eq!(s.page(7, 1).valid, (1 << 1) | (1 << 2), "two replicas");
        // Neither replica is the last copy: evicting one copies nothing.
        let plan = s
            .plan_device(
                &[Access {
                    buffer: 7,
                    off: 0,
                    bytes: 4096,
                    write: false,
                }],
                1,
                (1, 4),
                Some(4096),
            )
            .expect("fits");
        assert_eq!(plan.evictions.len(), 1);
        assert!(!plan.evictions[0].copy, "device 2 still holds page 1");
        // A write on device 2 invalidates device 1's replicas.
        s.apply_use(&all(2 * 4096, true), 2, point(2, 5));
        assert_eq!(s.page(7, 0).valid, 1 << 2);
        assert_eq!((s.resident(1), s.resident(2)), (0, 2 * 4096));
        let back = s.plan_host(&all(2 * 4096, false));
        assert_eq!(
            back.moves[0].from, 2,
            "copied back from the device holding it"
        );
    }
}
