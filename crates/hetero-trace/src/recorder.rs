//! The process-wide recorder: the on/off switch, the clock, the per-thread
//! writers and the registry [`take`] drains.
//!
//! Hot path: [`record_op`] loads one `Relaxed` flag; when on, it reaches this
//! thread's [`Writer`] through a thread-local and appends (see `log.rs`). The
//! registry mutex is taken once per thread (on its first record) and by
//! [`take`]. Logs of exited threads stay in the registry until drained.
//!
//! The flag, clock and registry are plain `std` statics even under
//! `cfg(loom)`: loom objects cannot live in statics, so loom checks the log
//! itself (`log.rs`), which is where writer and reader race.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::log::{channel, Log, Writer};
use crate::loom::Arc;
use crate::record::{
    EngineKind, GraphPlan, IotlbRecord, LinkRecord, MemRecord, MigrationRecord, OpRecord,
    TaskRecord, Trace, TraceClock,
};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Records the recorder holds at most until a [`take`] (ops, memory events,
/// tasks and migrations together): a long run with profiling on grew its
/// memory without bound until the kernel killed the process, trace and all.
/// Past it records are dropped and counted ([`Trace::dropped`]). About
/// 0.5 GiB of ops at the default; [`set_max_records`] changes it.
pub const DEFAULT_MAX_RECORDS: usize = 4 << 20;

/// Records a thread takes from the bound at a time at most (its budget): one
/// shared atomic per this many records, not per record.
const BUDGET: usize = 256;

static MAX_RECORDS: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_RECORDS);
/// Records held or promised to threads' budgets since the last `take`.
static HELD: AtomicUsize = AtomicUsize::new(0);
/// Records dropped past the bound since the last `take`.
static DROPPED: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();
static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    ops: Vec::new(),
    mem: Vec::new(),
    stream_names: BTreeMap::new(),
    device_name: String::new(),
    clock: TraceClock::Wall,
    graphs: BTreeMap::new(),
    iotlb: BTreeMap::new(),
    migrations: Vec::new(),
    tasks: Vec::new(),
    links: Vec::new(),
});

struct Registry {
    ops: Vec<Arc<Log<OpRecord>>>,
    mem: Vec<Arc<Log<MemRecord>>>,
    stream_names: BTreeMap<u64, String>,
    device_name: String,
    clock: TraceClock,
    graphs: BTreeMap<u32, GraphPlan>,
    /// (engine, index) → (hits, misses), summed until `take`.
    iotlb: BTreeMap<(u8, u32), (EngineKind, u64, u64)>,
    migrations: Vec<MigrationRecord>,
    tasks: Vec<TaskRecord>,
    links: Vec<LinkRecord>,
}

/// Adds one DMA's I/O TLB lookups on copy engine (`engine`, `index`): cheap
/// enough per transfer (one lock), nothing when recording is off.
pub fn record_iotlb(engine: EngineKind, index: u32, hits: u64, misses: u64) {
    if !enabled() || hits + misses == 0 {
        return;
    }
    let mut reg = registry();
    let e = reg
        .iotlb
        .entry((engine as u8, index))
        .or_insert((engine, 0, 0));
    e.1 += hits;
    e.2 += misses;
}

/// Records one managed-memory migration (a run of pages): one lock per
/// migration, nothing when recording is off. Migrations are page runs, far
/// fewer than ops.
pub fn record_migration(r: MigrationRecord) {
    if enabled() && admitted() {
        registry().migrations.push(r);
    }
}

/// Records bytes the task layer copied over a link for a task (one lock
/// per copy, nothing when recording is off).
pub fn record_link(r: LinkRecord) {
    if enabled() && admitted() {
        registry().links.push(r);
    }
}

/// Records one task of a context's task layer seen complete: one lock per
/// task, nothing when recording is off.
pub fn record_task(r: TaskRecord) {
    if enabled() && admitted() {
        registry().tasks.push(r);
    }
}

/// This thread's writers, created on its first record of each type, and
/// the records it may still make under the bound (`MAX_RECORDS`).
struct Local {
    ops: Option<Writer<OpRecord>>,
    mem: Option<Writer<MemRecord>>,
    budget: usize,
}

impl Local {
    /// Whether one more record fits under the bound: from this thread's
    /// budget, refilled from `HELD` (else the record is counted dropped).
    fn admit(&mut self) -> bool {
        if self.budget == 0 {
            let max = MAX_RECORDS.load(Ordering::Relaxed);
            // (A small bound is shared out in small budgets.)
            let grant = BUDGET.min(max / 16).max(1);
            let before = HELD.fetch_add(grant, Ordering::Relaxed);
            if before.saturating_add(grant) > max {
                HELD.fetch_sub(grant, Ordering::Relaxed);
                DROPPED.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            self.budget = grant;
        }
        self.budget -= 1;
        true
    }
}

impl Drop for Local {
    /// A thread that exits gives back the budget it did not use.
    fn drop(&mut self) {
        release(self.budget);
    }
}

/// Takes `n` records off `HELD` (never below zero: a `take` may drain
/// records whose budget a thread took before a bound was set).
fn release(n: usize) {
    let _ = HELD.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
        Some(h.saturating_sub(n))
    });
}

thread_local! {
    static LOCAL: RefCell<Local> =
        const { RefCell::new(Local { ops: None, mem: None, budget: 0 }) };
}

/// [`Local::admit`] on this thread (a record made while this thread's
/// locals are being destroyed, or from inside a record, is dropped).
fn admitted() -> bool {
    LOCAL
        .try_with(|local| local.try_borrow_mut().is_ok_and(|mut l| l.admit()))
        .unwrap_or(false)
}

/// Sets how many records the recorder holds at most until a [`take`]
/// ([`DEFAULT_MAX_RECORDS`] until set); past it records are dropped and
/// counted in [`Trace::dropped`]. Threads hold up to 256 records of the
/// bound each ahead of time, so it is kept to within that per thread.
pub fn set_max_records(max: usize) {
    MAX_RECORDS.store(max, Ordering::Relaxed);
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // Nothing in the registry is left half-updated by a panic (pushes and
    // retains only), so a poisoned lock still guards consistent data.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Nanoseconds since a process-wide epoch (the first call), from a monotonic
/// clock. Use it for every timestamp in a record.
pub fn now_ns() -> u64 {
    let epoch = EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Whether recording is on: one `Relaxed` load, the only cost when off.
#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Turns recording on or off for every thread. Records already made are kept
/// until [`take`].
pub fn set_enabled(on: bool) {
    if on {
        // Fix the epoch before the first record, so timestamps start near 0.
        let _ = now_ns();
    }
    ENABLED.store(on, Ordering::Relaxed);
}

/// Records one operation if recording is on.
#[inline]
pub fn record_op(r: OpRecord) {
    if enabled() {
        push_op(r);
    }
}

/// Records one memory pool event if recording is on.
#[inline]
pub fn record_mem(r: MemRecord) {
    if enabled() {
        push_mem(r);
    }
}

#[inline(never)]
fn push_op(r: OpRecord) {
    // `try_with` fails only while this thread's locals are being destroyed;
    // `try_borrow_mut` only on re-entry. Either way the record is dropped
    // rather than panicking in the caller.
    let _ = LOCAL.try_with(|local| {
        if let Ok(mut local) = local.try_borrow_mut() {
            if local.admit() {
                local
                    .ops
                    .get_or_insert_with(|| register(|reg, log| reg.ops.push(log)))
                    .push(r);
            }
        }
    });
}

#[inline(never)]
fn push_mem(r: MemRecord) {
    let _ = LOCAL.try_with(|local| {
        if let Ok(mut local) = local.try_borrow_mut() {
            if local.admit() {
                local
                    .mem
                    .get_or_insert_with(|| register(|reg, log| reg.mem.push(log)))
                    .push(r);
            }
        }
    });
}

#[cold]
fn register<T: Copy + Send>(add: impl FnOnce(&mut Registry, Arc<Log<T>>)) -> Writer<T> {
    let (writer, log) = channel();
    add(&mut registry(), log);
    writer
}

/// Names a stream for the trace's track names (kept across [`take`]).
pub fn set_stream_name(stream: u64, name: impl Into<String>) {
    registry().stream_names.insert(stream, name.into());
}

/// Describes the plan of graph `graph` for the report (kept across [`take`]).
pub fn set_graph_plan(graph: u32, plan: GraphPlan) {
    registry().graphs.insert(graph, plan);
}

/// Names the device for the trace's metadata (kept across [`take`]).
pub fn set_device_name(name: impl Into<String>) {
    registry().device_name = name.into();
}

/// Says which clock the records' timestamps are on (kept across [`take`];
/// [`TraceClock::Wall`] until set). A device whose records carry its virtual
/// time sets [`TraceClock::Virtual`], so readers of the trace do not take its
/// durations for the host's.
pub fn set_clock(clock: TraceClock) {
    registry().clock = clock;
}

/// Drains every thread's records (threads that exited included) into a
/// [`Trace`], sorted by time. Each record is returned by exactly one call;
/// the records dropped past the bound ([`set_max_records`]) since the last
/// call are counted in [`Trace::dropped`], and the bound starts afresh.
pub fn take() -> Trace {
    let mut trace = Trace::default();
    {
        let mut reg = registry();
        for log in &reg.ops {
            log.drain(&mut trace.ops);
        }
        for log in &reg.mem {
            log.drain(&mut trace.mem);
        }
        // Forget the logs of exited threads once they hold nothing more.
        reg.ops.retain(|log| !log.is_finished());
        reg.mem.retain(|log| !log.is_finished());
        trace.device_name = reg.device_name.clone();
        trace.clock = reg.clock;
        trace.stream_names = reg.stream_names.clone();
        trace.graphs = reg.graphs.clone();
        trace.iotlb = std::mem::take(&mut reg.iotlb)
            .into_iter()
            .map(|((_, engine_index), (engine, hits, misses))| IotlbRecord {
                engine,
                engine_index,
                hits,
                misses,
            })
            .collect();
        trace.migrations = std::mem::take(&mut reg.migrations);
        trace.tasks = std::mem::take(&mut reg.tasks);
        trace.links = std::mem::take(&mut reg.links);
        let drained = trace.ops.len() + trace.mem.len();
        release(drained + trace.migrations.len() + trace.tasks.len() + trace.links.len());
        trace.dropped = DROPPED.swap(0, Ordering::Relaxed);
    }
    trace.sort();
    trace
}
