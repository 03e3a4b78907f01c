//! The task layer, above streams: tasks in sequential-task-flow style over
//! [`TaskData`] on the devices of a [`Context`], placed by a scheduling
//! policy (`exec/sched`) on performance models, and turned into the stream
//! operations of one device (event waits, peer copies, and a launch that
//! stamps its own start and end: one op a task, its end the task's event).
//!
//! - `data.rs`: task data (replicas per device, validity, last writer and
//!   readers: the implicit dependencies).
//! - `graph.rs`: task graphs placed whole with HEFT before their first launch.
//! - `stream_graph.rs`: stream graphs (`Graph`) turned into such task graphs
//!   over their buffers (`Graph::instantiate_on`).
//! - here: the context's task state (policy, models, the learning policy,
//!   figures), the runtime (streams per device, tasks not yet seen complete)
//!   and the submission path every task takes.
//!
//! Work stealing may hold a task back (`Held`) until a device has room and
//! hand it to whichever device that is (`pump`).
//!
//! Invariants: tasks take effect as if run in submission order (each waits
//! for its dependencies through events, so any placement gives the same
//! bytes); a task's stream holds only it and, before it, tasks it depends on,
//! so a fault fails the task and the tasks that depend on it (through their
//! waits) and nothing else; the runtime's lock is taken before the context's
//! scheduling state and a buffer's state, never after.

pub(crate) mod data;
pub(crate) mod graph;
pub(crate) mod stream_graph;

use crate::api::context::{Context, ContextShared, PeerPath};
use crate::exec::kernel::KernelName;
use crate::exec::op::Span;
use crate::exec::sched::dispatch::{self, Dispatch};
use crate::exec::sched::learned::Learner;
use crate::exec::sched::model::{self, Models};
use crate::exec::sched::{self, Candidate, SchedPolicy};
use crate::{Device, Error, Event, Grid, Kernel, LinkPreset, Result, Stream};
use bytemuck::Pod;
use data::{DataAny, TaskRef};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub use data::{DataArg, TaskData};
pub use graph::{PlacedTaskGraph, TaskGraph, TaskGraphLaunch};

/// The device a context's task data starts on (its first).
pub(crate) const HOME: usize = 0;

/// Streams per device a runtime keeps; past them a submission waits for the
/// oldest stream's last task.
pub const MAX_TASK_STREAMS: usize = 64;
use MAX_TASK_STREAMS as MAX_STREAMS;

/// Ops a task stream's ring holds. A task stream holds a task's few ops
/// while it runs, and more only along a chain of dependent tasks; its ring
/// is cycled through, one slot per op, so the smaller it is the likelier a
/// submission finds its slot in cache. With the device default (1 024
/// slots of 144 bytes) a pool of 64 streams cycled through 9 MiB per
/// device, and every submission's slot was cold.
const POOL_RING: usize = 64;
/// Streams per device that copy replicas in for tasks chained behind
/// another (see `Runtime::emit`).
const COPY_STREAMS: usize = 4;

/// What a task layer run has done, as [`Context::task_stats`] reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskStats {
    /// Tasks submitted.
    pub tasks: u64,
    /// Tasks placed to calibrate a model (before every model they needed was
    /// trusted).
    pub calibration_tasks: u64,
    /// Tasks placed on each device, by index in the context.
    pub per_device: Vec<u64>,
    /// Bytes copied between devices for tasks (and a managed buffer's pages
    /// moved to a task's device, as the task was placed).
    pub bytes_moved: u64,
    /// Exploring choices of the learning policy.
    pub explored: u64,
    /// Kernels whose models were found on disk.
    pub models_loaded: u64,
    /// Model files found damaged (each a warning and a fresh calibration;
    /// the bus figures' file included).
    pub models_damaged: u64,
    /// Samples the models rejected as outliers.
    pub outliers_rejected: u64,
    /// Executions observed (fed to the models).
    pub observed: u64,
    /// Host time the policies spent deciding (candidates and choice), ns.
    pub decision_ns: u64,
    /// Submissions that waited for a task to complete because the device's
    /// streams were all busy ([`MAX_TASK_STREAMS`]).
    pub stream_waits: u64,
    /// Host time those submissions waited, ns (in virtual time: running
    /// the devices' model).
    pub stream_wait_ns: u64,
    /// Streams made for tasks.
    pub streams_made: u64,
    /// Tasks work stealing held back that a device other than the one they
    /// were queued for took.
    pub stolen: u64,
    /// Calibration runs of the bus of devices without a link model (neither
    /// emulated nor the host), then saved beside the models: one per kind
    /// of device (a device like one measured takes its figure).
    pub bus_calibrated: u64,
    /// Such devices whose bus figures were found saved.
    pub bus_loaded: u64,
    /// Bytes copied for tasks per link: (from device, to device, bytes), by
    /// index in the context; a managed buffer's pages that come from the
    /// host's copy, in a context whose devices all have memory of their own,
    /// come from index `devices` (one past the last device).
    pub bytes_per_link: Vec<(usize, usize, u64)>,
    /// The history model's prediction against the time observed, per kernel
    /// and device (tasks placed with a trusted prediction and seen complete).
    pub prediction_error: Vec<PredictionError>,
    /// Per device (by index), the dispatch time the policies add to each
    /// task there, ns: the median gap between the device's last task end
    /// and the next task's start, among tasks already on the device then
    /// (real time only; `None` until 8 such gaps, and in virtual
    /// time). Kept across [`Context::reset_task_stats`], as the models are.
    pub dispatch_ns: Vec<Option<f64>>,
}

impl TaskStats {
    /// Counts `bytes` moved from memory `from` to `to` (`bytes_per_link`).
    pub(crate) fn add_link(&mut self, from: usize, to: usize, bytes: u64) {
        match self
            .bytes_per_link
            .iter_mut()
            .find(|l| (l.0, l.1) == (from, to))
        {
            Some(l) => l.2 += bytes,
            None => self.bytes_per_link.push((from, to, bytes)),
        }
    }
}

/// How far a kernel's predictions on one device were from what it took.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictionError {
    /// The kernel's name.
    pub kernel: &'static str,
    /// The device's index in the context.
    pub device: usize,
    /// Tasks compared.
    pub tasks: u64,
    /// Mean of |predicted − observed| / observed.
    pub mean_relative_error: f64,
}

/// The scheduling state of a context: it outlives the runtimes (a runtime
/// lives while task data does), so models and learned estimates carry over.
#[derive(Default)]
pub(crate) struct ContextTasks {
    sched: Arc<Mutex<Sched>>,
    runtime: Mutex<Weak<Runtime>>,
    /// The runtime while tasks are in flight (so tasks whose handles and
    /// data were dropped still complete on live streams); cleared when the
    /// layer sees none in flight (`Context::wait_tasks`, a placed launch's
    /// `TaskGraphLaunch::wait`, or a submission after they completed). Until
    /// then it holds the context's devices.
    keep: Mutex<Option<Arc<Runtime>>>,
}

pub(crate) struct Sched {
    policy: SchedPolicy,
    /// `None` until first used; then loaded lazily per kernel.
    models: Option<Models>,
    /// `Some(dir)` set by the user (`None` inside: in memory only).
    model_dir: Option<Option<PathBuf>>,
    learner: Learner,
    stats: TaskStats,
    /// Per (kernel, device): tasks and the sum of relative errors.
    errors: rustc_hash::FxHashMap<(KernelName, usize), (u64, f64)>,
    /// Per device (by index): its observed dispatch time.
    dispatch: Vec<Dispatch>,
}

impl Default for Sched {
    fn default() -> Self {
        Sched {
            policy: SchedPolicy::from_env(),
            models: None,
            model_dir: None,
            learner: Learner::default(),
            stats: TaskStats::default(),
            errors: Default::default(),
            dispatch: Vec::new(),
        }
    }
}

impl Sched {
    /// Device `d`'s observed dispatch time per task, ns (0 while unknown).
    fn dispatch_ns(&self, d: usize) -> f64 {
        self.dispatch.get(d).and_then(Dispatch::ns).unwrap_or(0.0)
    }

    fn models(&mut self) -> &mut Models {
        // The directory is cloned only to make the models (every candidate
        // and observation asks for them).
        let Sched {
            models, model_dir, ..
        } = self;
        models.get_or_insert_with(|| {
            Models::new(model_dir.clone().unwrap_or_else(model::default_dir))
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`] if nobody holds `m`, else `None`.
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// A task work stealing holds back until a device has room.
struct Held {
    spec: Spec,
    /// The device it was queued for (most of its data there).
    home: usize,
    id: u64,
    /// Completes the handle's event: signalled by a host callback after the
    /// task on its stream; dropped unsignalled (a fault before it, or the
    /// runtime going with it held), it fails the event.
    signal: Arc<crate::HostEvent>,
    slot: Arc<HeldSlot>,
    measured: Arc<std::sync::atomic::AtomicU64>,
}

/// Where a task's observed time goes: its own cell for a held task (its
/// handle exists before its launch), else its launch's span, which its end
/// event names (no allocation of its own).
fn observed<'a>(
    cell: &'a Option<Arc<std::sync::atomic::AtomicU64>>,
    end: &'a Event,
) -> Option<&'a std::sync::atomic::AtomicU64> {
    cell.as_deref().or_else(|| end.span().map(|s| s.observed()))
}

/// What a held task's handle learns when a device takes it.
#[derive(Debug)]
pub(crate) struct HeldSlot {
    /// The device's index, `usize::MAX` until then.
    bound: std::sync::atomic::AtomicUsize,
    /// Recorded after the callback that signals the handle's event (waiting
    /// on it runs a device in virtual time; the host event has no model).
    done: std::sync::OnceLock<Event>,
    devices: Vec<Device>,
    rt: Weak<Runtime>,
}

/// A stream of the runtime's pool and the last task on it.
struct PoolStream {
    stream: Stream,
    /// Its last task and that task's launch: its value on the stream's
    /// timeline (no event kept: the timeline is the stream's own).
    last: Option<(u64, u64)>,
}

impl PoolStream {
    fn timeline(&self) -> &Arc<crate::exec::timeline::Timeline> {
        self.stream.backend_stream().timeline()
    }

    /// Whether its last task completed, or failed (`None`: running).
    fn status(&self) -> Option<Result<()>> {
        self.last
            .map_or(Some(Ok(())), |(_, v)| self.timeline().status(v))
    }

    /// The end of its last task.
    fn last_end(&self) -> Option<Event> {
        let (_, v) = self.last?;
        Some(Event::at(self.timeline().clone(), v))
    }
}

/// A task just emitted, as `Runtime::account` books it.
struct Booked {
    task: Task,
    /// When it was on its device (`Runtime::booked`), or 0.
    queued_at: u64,
    /// What it adds to its compute unit's expected free time (its
    /// expected execution and the device's dispatch time), ns.
    cost_ns: f64,
}

/// A task not yet seen complete: what its observation needs.
struct Pending {
    kernel: KernelName,
    footprint: u64,
    size: u64,
    device: usize,
    /// Its launch's end; the launch's span holds its start too.
    end: Event,
    /// When it was on its device (device clock), for the dispatch
    /// estimate; 0: not sampled.
    queued_at: u64,
    /// What it added to its compute unit's expected free time, ns.
    cost_ns: f64,
    /// The history model's prediction on its device.
    predicted: Option<f64>,
    /// A held task's cell for the observed time (shared with its handle);
    /// `None`: the span `end` names (see `observed`).
    measured: Option<Arc<std::sync::atomic::AtomicU64>>,
}

struct RtState {
    next_task: u64,
    /// Per device, per compute unit: when it is expected to be free.
    free: Vec<Vec<f64>>,
    pending: Vec<Pending>,
    queued: Vec<usize>,
    streams: Vec<Vec<PoolStream>>,
    /// The last events of placed task graphs' launches not yet seen
    /// complete (their streams are the graphs' own, not the pool's).
    /// (With the value from which a fault on the event's timeline is the
    /// launch's: `graph::launch_fault`.)
    graph_tails: Vec<(Event, u64)>,
    /// Tasks `ws` holds back, in submission order.
    held: std::collections::VecDeque<Held>,
    /// Per datum (id): the held tasks that touch it.
    held_data: rustc_hash::FxHashMap<u64, usize>,
    /// Per device: the pool stream to look at next for a task that is not
    /// chained (modulo the pool's length).
    turn: Vec<usize>,
    host_streams: Vec<Option<Stream>>,
    /// Per device: where tasks chained behind another copy their replicas
    /// in (`emit`), [`COPY_STREAMS`] taken in turn, each made at its first
    /// such copy; and the turn.
    copy_streams: Vec<[Option<Stream>; COPY_STREAMS]>,
    copy_turn: usize,
    submitted_since_harvest: u32,
    /// Whether tasks emitted now tell `Runtime::progress` when they complete
    /// (work stealing in real time).
    notify_completions: bool,
    /// Per device: the ends of its last tasks seen complete (`harvest`).
    recent_ends: Vec<Vec<u64>>,
    /// `harvest`'s lists, kept between looks (empty between them): the
    /// tasks seen complete, and their order.
    done: Vec<Pending>,
    done_order: Vec<u128>,
    /// Per device: the costs of its tasks not seen complete (as of the last
    /// look, plus those accounted since), ns.
    unfinished: Vec<f64>,
    stream_waits: u64,
    stream_wait_ns: u64,
    streams_made: u64,
    /// Copies since the last account: (from, to, bytes).
    link_bytes: Vec<(usize, usize, u64)>,
    /// The first fault among tasks and placed launches seen complete
    /// (`harvest`) since the last `wait_all`, which reports it: a faulted
    /// stream may have left the pool, and a launch's tail the list, before
    /// anyone waited.
    unreported: Option<Error>,
    /// The candidates of the task being placed (kept to reuse the list).
    candidates: Vec<Candidate>,
    /// `emit`'s waits for replicas valid on the task's device (kept to
    /// reuse the list; empty between tasks).
    here: Vec<Event>,
    /// Launch spans of tasks seen complete that nothing else held, reset
    /// for the next launches (at most `SPARE_SPANS`): a task's launch
    /// allocates none.
    spans: Vec<Arc<crate::exec::op::Span>>,
}

/// The most spans `RtState::spans` keeps.
const SPARE_SPANS: usize = 256;

/// What `Runtime::decide` decided for a task.
enum Decision {
    /// Held back (work stealing): its handle.
    Held(Task),
    /// Not held, but over data a held task touches: after that task.
    BehindHeld,
    /// To submit as `Go` says, after these tasks.
    Go(Go, Vec<Dep>),
}

impl RtState {
    /// Whether a task held back (work stealing) touches one of the data `ids`.
    fn holds_any(&self, mut ids: impl Iterator<Item = u64>) -> bool {
        !self.held.is_empty() && ids.any(|id| self.held_data.contains_key(&id))
    }
}

/// Whether a task held back (work stealing) touches data of `spec`.
fn spec_behind_held(st: &RtState, spec: &Spec) -> bool {
    st.holds_any(spec.access.iter().map(|(d, _)| d.id()))
}

/// Where a task goes, and what the books keep of the decision.
struct Go {
    device: usize,
    priority: Option<u8>,
    /// Its expected end on the layer's clock.
    end_ns: f64,
    /// The model's prediction there, if trusted.
    predicted: Option<f64>,
    /// What it adds to its device's unfinished work.
    cost_ns: f64,
    footprint: u64,
    size: u64,
    calibrating: bool,
}

/// The devices' side of a context's tasks: streams, replicas' devices, tasks
/// in flight. Alive while task data or task graphs are.
pub(crate) struct Runtime {
    ctx: Arc<ContextShared>,
    sched: Arc<Mutex<Sched>>,
    pub(crate) devices: Vec<Device>,
    /// Model keys: which device (kind, link, rate, units) a sample is of.
    pub(crate) keys: Vec<String>,
    pub(crate) lanes: Vec<usize>,
    /// The link to the host of each emulated device.
    host_link: Vec<Option<LinkPreset>>,
    /// The measured bus of each device without a link model.
    bus: Vec<Option<crate::exec::sched::bus::BusFigure>>,
    virtual_time: bool,
    t0: std::time::Instant,
    state: Mutex<RtState>,
    /// Wakes the thread that hands held tasks to devices (`progress`).
    progress: Arc<Progress>,
}

/// What the progress thread of a runtime waits on.
///
/// Invariant: the thread holds only this and a `Weak` of its runtime while
/// it waits, and takes the runtime's locks only to `pump`, as a submitting
/// thread does; engine threads (the completion callbacks) take only this
/// mutex, which nobody holds across a wait for an engine.
#[derive(Default)]
struct Progress {
    /// (something to look at, the runtime went, the thread started).
    state: Mutex<(bool, bool, bool)>,
    cv: std::sync::Condvar,
    /// Whether tasks are held: set by `hold`, cleared by the thread after a
    /// pump left none (both under the runtime's lock). A completion
    /// wakes the thread only while it is set.
    held: std::sync::atomic::AtomicBool,
}

impl Progress {
    fn notify(&self) {
        lock(&self.state).0 = true;
        self.cv.notify_one();
    }

    /// A task completed: room for a held one, if any.
    fn completed(&self) {
        if self.held.load(Ordering::Acquire) {
            self.notify();
        }
    }
}

/// How long the progress thread sleeps while tasks are held and nothing
/// woke it: a faulted task's completion callback never runs.
const PROGRESS_POLL: std::time::Duration = std::time::Duration::from_millis(10);

impl Drop for Runtime {
    fn drop(&mut self) {
        {
            lock(&self.progress.state).1 = true;
            self.progress.cv.notify_one();
        }
        let mut st = lock(&self.state);
        let mut sc = lock(&self.sched);
        self.harvest(&mut st, &mut sc);
        sc.models().save();
    }
}

/// How a task uses a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
    ReadWrite,
}

impl Mode {
    fn reads(self) -> bool {
        self != Mode::Write
    }
    fn writes(self) -> bool {
        self != Mode::Read
    }
}

/// A task before submission: everything the submission path needs.
#[derive(Clone)]
pub(crate) struct Spec {
    pub(crate) kernel: Kernel,
    pub(crate) access: Vec<(Arc<dyn DataAny>, Mode)>,
    pub(crate) grid: Grid,
    pub(crate) priority: Option<u8>,
    /// The element type of each argument when it is not the data's own
    /// (a stream graph's kernel node names it; empty for tasks).
    pub(crate) elems: Vec<&'static crate::exec::kernel::ElemInfo>,
    /// Events it also waits for ([`TaskBuilder::after`]).
    pub(crate) after: Vec<Event>,
    /// A stream graph's node that is not a kernel (a copy, a fill, a host
    /// callback, a wait), run instead of `kernel` (then a name only).
    pub(crate) op: Option<Arc<stream_graph::NodeOp>>,
    /// The device it runs on whatever the policy, or HEFT
    /// ([`TaskBuilder::on_device`]).
    pub(crate) on: Option<usize>,
}

impl Runtime {
    fn new(ctx: &Context, sched: Arc<Mutex<Sched>>) -> Result<Runtime> {
        let devices = ctx.devices();
        if devices.len() != ctx.topology().devices.len() {
            return Err(Error::DeviceContext {
                op: "Context::task",
                detail: "a device of the context was dropped; tasks need every device of their \
                         context: keep the devices alive"
                    .into(),
            });
        }
        let mut keys = Vec::new();
        let mut lanes = Vec::new();
        let mut host_link = Vec::new();
        for d in &devices {
            let p = d.properties();
            let emu = crate::backend::emu::config_of(d.backend());
            keys.push(match &emu {
                // (A CPU-class device's kernels cost what they declare for
                // that class: a model of its own.)
                Some(e) => format!(
                    "emu:{}:{}u:{:e}flops{}",
                    e.link().name,
                    p.compute_units,
                    e.flops_per_unit,
                    match e.compute_class() {
                        crate::ComputeClass::Accelerator => "",
                        crate::ComputeClass::Cpu => ":cpu",
                    }
                ),
                None => format!("{}:{}:{}u", p.backend, p.name, p.compute_units)
                    .replace(char::is_whitespace, "_"),
            });
            lanes.push(p.compute_units.max(1));
            host_link.push(emu.map(|e| e.link().clone()));
        }
        let n = devices.len();
        let mut bus = vec![None; n];
        let mut measured = Vec::new();
        {
            let mut sc = lock(&sched);
            for d in 0..n {
                if host_link[d].is_some() || devices[d].properties().backend == "host" {
                    continue;
                }
                if let Some(e) = (0..d).find(|&e| keys[e] == keys[d] && bus[e].is_some()) {
                    // A device like one measured or found above.
                    bus[d] = bus[e];
                    sc.stats.bus_loaded += u64::from(!measured.contains(&e));
                    continue;
                }
                let saved = sc.models().buses().figures.get(&keys[d]).copied();
                bus[d] = Some(match saved {
                    Some(f) => {
                        sc.stats.bus_loaded += 1;
                        f
                    }
                    None => {
                        let f = calibrate_bus(&devices[d])?;
                        measured.push(d);
                        sc.models().buses().insert(&keys[d], f);
                        sc.stats.bus_calibrated += 1;
                        f
                    }
                });
            }
            sc.models().save();
        }
        Ok(Runtime {
            bus,
            ctx: ctx.shared().clone(),
            sched,
            virtual_time: devices.iter().all(|d| d.is_virtual_time()),
            state: Mutex::new(RtState {
                next_task: 1,
                free: lanes.iter().map(|&l| vec![0.0; l]).collect(),
                pending: Vec::new(),
                queued: vec![0; n],
                streams: (0..n).map(|_| Vec::new()).collect(),
                turn: vec![0; n],
                held: Default::default(),
                held_data: Default::default(),
                graph_tails: Vec::new(),
                host_streams: vec![None; n],
                copy_streams: vec![Default::default(); n],
                copy_turn: 0,
                submitted_since_harvest: 0,
                notify_completions: false,
                recent_ends: vec![Vec::new(); n],
                done: Vec::new(),
                done_order: Vec::new(),
                unfinished: vec![0.0; n],
                stream_waits: 0,
                stream_wait_ns: 0,
                streams_made: 0,
                link_bytes: Vec::new(),
                unreported: None,
                candidates: Vec::new(),
                here: Vec::new(),
                spans: Vec::new(),
            }),
            devices,
            keys,
            lanes,
            host_link,
            t0: std::time::Instant::now(),
            progress: Arc::default(),
        })
    }

    /// Starts the thread that hands held tasks to devices as tasks complete
    /// (once per runtime; real time only), so that a held task's event
    /// completes without its user calling the task layer again: a stream
    /// waiting for it would otherwise wait forever. In virtual time the
    /// devices' model runs only when the host waits, and held tasks move at
    /// the layer's calls (`Task::wait`, `Context::wait_tasks`, submissions).
    fn start_progress(self: &Arc<Self>) {
        if self.virtual_time {
            return;
        }
        {
            let mut p = lock(&self.progress.state);
            if p.2 {
                drop(p);
                self.progress.notify();
                return;
            }
            p.2 = true;
        }
        let (weak, progress) = (Arc::downgrade(self), self.progress.clone());
        let spawned = std::thread::Builder::new()
            .name("hetero task progress".into())
            .spawn(move || loop {
                let held = {
                    let mut p = lock(&progress.state);
                    while !p.0 && !p.1 {
                        let (g, timeout) = progress
                            .cv
                            .wait_timeout(p, PROGRESS_POLL)
                            .unwrap_or_else(|e| e.into_inner());
                        p = g;
                        if timeout.timed_out() {
                            break;
                        }
                    }
                    if p.1 {
                        return;
                    }
                    p.0 = false;
                    let Some(rt) = weak.upgrade() else { return };
                    drop(p);
                    let mut st = lock(&rt.state);
                    let mut sc = lock(&rt.sched);
                    // An error (a stream not made) stays for the next
                    // caller's `pump_until` to report.
                    let _ = rt.pump(&mut st, &mut sc);
                    let held = !st.held.is_empty();
                    progress.held.store(held, Ordering::Release);
                    held
                };
                if !held {
                    // Nothing held: sleep until a task is.
                    let mut p = lock(&progress.state);
                    while !p.0 && !p.1 {
                        p = progress.cv.wait(p).unwrap_or_else(|e| e.into_inner());
                    }
                }
            });
        if spawned.is_err() {
            // Without the thread, held tasks move at the layer's calls.
            lock(&self.progress.state).2 = false;
        }
    }

    /// Device `d` as the performance models know it.
    pub(crate) fn dev(&self, d: usize) -> model::Dev<'_> {
        model::Dev {
            index: d,
            key: &self.keys[d],
        }
    }

    /// The task layer's clock, ns: the model's in virtual time, else the
    /// wall clock since the runtime started.
    pub(crate) fn now_ns(&self) -> f64 {
        if self.virtual_time {
            self.devices[0].now_ns() as f64
        } else {
            self.t0.elapsed().as_nanos() as u64 as f64
        }
    }

    /// A stream for the host's reads and writes of task data on device `at`.
    pub(crate) fn host_stream(&self, at: usize) -> Result<Stream> {
        self.host_stream_in(&mut lock(&self.state), at)
    }

    /// [`host_stream`](Self::host_stream) where the caller holds the state.
    fn host_stream_in(&self, st: &mut RtState, at: usize) -> Result<Stream> {
        self.side_stream(&mut st.host_streams[at], at, "task data host access")
    }

    /// The stream in `slot` of device `at`, made if there is none; one that
    /// took on a fault (sticky: it would fail all its later work) is
    /// replaced.
    fn side_stream(&self, slot: &mut Option<Stream>, at: usize, name: &str) -> Result<Stream> {
        let faulted = |s: &Stream| s.backend_stream().timeline().fault_at().is_some();
        if let Some(s) = slot.as_ref().filter(|s| !faulted(s)) {
            return Ok(s.clone());
        }
        let s = self.devices[at].create_stream()?;
        s.set_name(name);
        *slot = Some(s.clone());
        Ok(s)
    }

    /// The modelled time to move `bytes` from device `a` to device `b`, ns:
    /// from the peer link between them, else out of `a` and into `b` over
    /// their links to the host (emulated devices; a device whose memory is the
    /// host's costs a memory copy; others 16 GB/s and 10 µs, uncalibrated).
    pub(crate) fn transfer_ns(&self, a: usize, b: usize, bytes: u64) -> f64 {
        if a == b || bytes == 0 {
            return 0.0;
        }
        let (ia, ib) = (self.devices[a].id(), self.devices[b].id());
        let host_copy = bytes as f64 / 10.0;
        match self.ctx.topology().path(ia, ib) {
            Some(PeerPath::Link(l)) => l.transfer_ns(bytes),
            Some(PeerPath::SharedMemory) => host_copy,
            _ => self.host_leg_ns(a, bytes, true) + self.host_leg_ns(b, bytes, false),
        }
    }

    /// The modelled time to move `bytes` between device `i` and the host's
    /// memory (`out`: from the device), ns: over its link to the host
    /// (emulated devices), a memory copy (the host), else its measured bus.
    pub(crate) fn host_leg_ns(&self, i: usize, bytes: u64, out: bool) -> f64 {
        match (&self.host_link[i], self.devices[i].properties().backend) {
            (Some(l), _) => l.transfer_ns(bytes, out),
            (None, "host") => bytes as f64 / 10.0,
            (None, _) => match &self.bus[i] {
                Some(f) => f.transfer_ns(bytes),
                None => 10_000.0 + bytes as f64 / 16.0,
            },
        }
    }

    /// The modelled time of a managed buffer's moves into device `d`
    /// (`Some(from)`: a device; `None`: the host's copy), ns.
    fn managed_in_ns(&self, moves: &[(Option<usize>, u64)], d: usize) -> f64 {
        moves
            .iter()
            .map(|&(from, bytes)| match from {
                Some(from) => self.transfer_ns(from, d, bytes),
                None => self.host_leg_ns(d, bytes, false),
            })
            .sum()
    }

    /// Feeds the models with the tasks seen complete.
    ///
    /// A task's time is from its launch's start to its end: the launch
    /// stamps both where it holds its compute units (the host engine's run,
    /// the emulated device's units taken, Vulkan's timestamp queries around
    /// the dispatch), so no wait for a unit is in it.
    fn harvest(&self, st: &mut RtState, sc: &mut Sched) {
        st.submitted_since_harvest = 0;
        let stamp = |e: &Event| e.point.as_ref().map_or(0, |p| p.stamp_ns());
        let mut done = std::mem::take(&mut st.done);
        let mut order = std::mem::take(&mut st.done_order);
        let mut i = 0;
        while i < st.pending.len() {
            let p = &st.pending[i];
            let status = match p.end.point.as_ref() {
                Some(e) => e.timeline.status(e.value),
                None => Some(Ok(())),
            };
            match status {
                None => i += 1,
                Some(r) => {
                    let p = st.pending.swap_remove(i);
                    st.queued[p.device] -= 1;
                    match r {
                        Ok(()) => done.push(p),
                        Err(e) => {
                            st.unreported.get_or_insert(e);
                        }
                    }
                }
            }
        }
        let unreported = &mut st.unreported;
        st.graph_tails.retain(|(e, from)| {
            let Some(p) = e.point.as_ref() else {
                return false;
            };
            if !p.timeline.is_reached(p.value) {
                return true;
            }
            if let Err(e) = graph::launch_fault(e, *from) {
                unreported.get_or_insert(e);
            }
            false
        });
        // Each device's unfinished work, for its floor (`free_at`); tasks
        // accounted until the next look add to it.
        let tasks = st.pending.iter().map(|p| (p.device, p.cost_ns));
        dispatch::unfinished(&mut st.unfinished, tasks);
        if st.pending.is_empty() && st.graph_tails.is_empty() && st.held.is_empty() {
            // Not the last handle: whoever called holds one (or this is the
            // runtime's drop, and the one kept is another's).
            let mut keep = lock(&self.ctx.tasks.keep);
            if keep.as_ref().is_some_and(|k| std::ptr::eq(&**k, self)) {
                let kept = keep.take();
                drop(keep);
                drop(kept);
            }
        }
        // In order of their ends, then devices, then as found: keys that
        // differ, so an unstable sort gives the stable order (without its
        // scratch buffer). One number per task: the tasks stay where they
        // are (a sort of the tasks themselves moved them about: 320
        // instructions per task under callgrind, against 177).
        order.extend(done.iter().enumerate().map(|(i, p)| {
            let key = u128::from(stamp(&p.end)) << 64;
            key | (p.device as u128) << 32 | i as u128
        }));
        order.sort_unstable();
        if sc.dispatch.len() < self.devices.len() {
            sc.dispatch.resize(self.devices.len(), Dispatch::default());
        }
        for &key in &order {
            let (end, p) = ((key >> 64) as u64, &done[key as u32 as usize]);
            let lanes = self.lanes[p.device];
            let recent = &mut st.recent_ends[p.device];
            let start = p.end.span().map_or_else(|| stamp(&p.end), Span::start_ns);
            if p.queued_at != 0 && recent.len() >= lanes {
                // The device's last end before the task started (some unit
                // freed then; the task's own may have freed earlier, so the
                // gap from it is a lower bound of the delay), else the
                // earliest seen (it ran beside them: no gap).
                let before = recent.iter().rev().copied().find(|&e| e <= start);
                let freed = before.unwrap_or(recent[0]);
                sc.dispatch[p.device].observe(p.queued_at, freed, start);
            }
            recent.push(end);
            if recent.len() > lanes {
                recent.remove(0);
            }
            let ns = end.saturating_sub(start) as f64;
            if let Some(cell) = observed(&p.measured, &p.end) {
                cell.store(ns.to_bits(), Ordering::Relaxed);
            }
            hetero_trace::record_task(hetero_trace::TaskRecord {
                kernel: p.kernel.text,
                device: p.device as u32,
                start_ns: start,
                end_ns: end,
                predicted_ns: p.predicted.map(|v| v as u64),
                measured_ns: ns as u64,
            });
            if let (Some(pred), true) = (p.predicted, ns > 0.0) {
                let e = sc.errors.entry((p.kernel, p.device)).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += (pred - ns).abs() / ns;
            }
            sc.models()
                .observe(p.kernel, self.dev(p.device), p.footprint, p.size, ns);
            sc.learner
                .observe(p.kernel, p.device, p.footprint, p.size, ns);
            sc.stats.observed += 1;
        }
        // Their spans, where nothing else holds them (no handle, no data's
        // state): for the next launches.
        for p in done.drain(..) {
            let Some(mut span) = p.end.into_span() else {
                continue;
            };
            if let (Some(s), true) = (Arc::get_mut(&mut span), st.spans.len() < SPARE_SPANS) {
                s.reset();
                st.spans.push(span);
            }
        }
        order.clear();
        st.done = done;
        st.done_order = order;
    }

    /// Places `spec` (on `forced` if given, else by the context's policy)
    /// and submits it.
    pub(crate) fn submit(self: &Arc<Self>, spec: &Spec, forced: Option<usize>) -> Result<Task> {
        if spec.access.iter().any(|(d, _)| d.is_managed()) {
            // Tasks held back go first: one over a managed buffer is not.
            self.pump_until(|| lock(&self.state).held.is_empty())?;
        }
        let task = self.place_and_emit(spec, forced)?;
        self.keep_alive();
        Ok(task)
    }

    /// Looks at the tasks and graph launches in flight (`harvest`): what
    /// completed feeds the models, and with none left the runtime stops
    /// keeping itself (and the context's devices) alive. Only if nobody is
    /// in the layer: whoever is looks itself, and a caller inside a kernel
    /// or callback never waits here for a submitter that waits for it.
    pub(crate) fn look(&self) {
        if let (Some(mut st), Some(mut sc)) = (try_lock(&self.state), try_lock(&self.sched)) {
            self.harvest(&mut st, &mut sc);
        }
    }

    /// Keeps the runtime alive while tasks are in flight (until the layer
    /// sees none: `harvest`).
    pub(crate) fn keep_alive(self: &Arc<Self>) {
        let mut keep = lock(&self.ctx.tasks.keep);
        if keep.as_ref().is_none_or(|k| !Arc::ptr_eq(k, self)) {
            *keep = Some(self.clone());
        }
    }

    fn place_and_emit(self: &Arc<Self>, spec: &Spec, forced: Option<usize>) -> Result<Task> {
        let mut st = lock(&self.state);
        let mut sc = lock(&self.sched);
        let (go, mut deps) = loop {
            match self.decide(&mut st, &mut sc, spec, forced)? {
                Decision::Held(task) => return Ok(task),
                Decision::Go(go, deps) => break (go, deps),
                Decision::BehindHeld => {
                    // The held tasks over its data go to devices first.
                    drop(sc);
                    drop(st);
                    self.pump_until(|| !spec_behind_held(&lock(&self.state), spec))?;
                    st = lock(&self.state);
                    sc = lock(&self.sched);
                }
            }
        };
        // Where its device's pool of streams is full of work not done, the
        // task waits for the stream next in turn with no lock of the layer
        // held (`emit` hands the wait back): a kernel or callback that
        // submits a task meanwhile would wait for the lock, and the waited
        // stream for it. (A wait refused, where this thread runs the
        // devices' model or the stream's kernel: `emit` drops that stream
        // from the pool and a new one takes its place.)
        let (mut may_wait, mut kept_turn) = (true, None);
        let mut task = loop {
            let next = match self.emit(
                &mut st,
                spec,
                go.device,
                &deps,
                go.priority,
                go.end_ns,
                None,
                may_wait,
            )? {
                Ok(task) => break task,
                Err(next) => next,
            };
            let issued = st.next_task;
            drop(sc);
            drop(st);
            let t0 = std::time::Instant::now();
            may_wait = next.synchronize().is_ok();
            st = lock(&self.state);
            sc = lock(&self.sched);
            st.stream_waits += 1;
            st.stream_wait_ns += t0.elapsed().as_nanos() as u64;
            kept_turn = Some(st.turn[go.device]);
            if st.next_task != issued {
                // Tasks (or placed launches) submitted meanwhile, maybe over
                // its data. (Else its dependencies stand as they were: ended
                // ones cost a wait that is already over.)
                deps = dependencies(spec);
            }
        };
        if let Some(turn) = kept_turn {
            // The turn stays on the stream waited for: the next task looks
            // at it first. (Moving on to the next stream, the placements
            // in virtual time changed: dmda's Cholesky over HEFT's went
            // from 0.931 to 0.960 in `bench placement`, the learning
            // policy's from 0.920 to 0.984.)
            st.turn[go.device] = turn;
        }
        task.predicted = go.predicted;
        let task = self.booked(spec, &deps, task, go.cost_ns);
        Ok(self.account(
            &mut st,
            &mut sc,
            spec,
            task,
            go.footprint,
            go.size,
            go.calibrating,
            go.end_ns,
        ))
    }

    /// Where `spec` goes (on `forced` if given, else by the context's
    /// policy), with its dependencies; or, under work stealing, the task
    /// held back.
    fn decide(
        self: &Arc<Self>,
        st: &mut RtState,
        sc: &mut Sched,
        spec: &Spec,
        forced: Option<usize>,
    ) -> Result<Decision> {
        st.submitted_since_harvest += 1;
        // Every 16 submissions. (Scanning only every quarter of the tasks in
        // flight, fewer observations arrive mid-run, and the learning
        // policy's random-DAG makespan in `bench placement` went from 0.76×
        // to 2.1× HEFT's: it learns from what completes while it submits.)
        if st.submitted_since_harvest >= 16 {
            self.harvest(st, sc);
        }
        let k = &spec.kernel;
        let runs = |d: &usize| self.devices[*d].check_code(&k.inner).is_ok();
        if !(0..self.devices.len()).any(|d| runs(&d)) {
            self.devices[0].check_code(&k.inner)?;
        }
        if let Some(f) = forced {
            self.check_bound(spec, f)?;
        }
        let policy = sc.policy;
        // A task over a managed buffer is never held back: the host reaches
        // the buffer through its guards, which see only submitted work
        // (`submit` handed the held tasks to devices first).
        let managed = spec.access.iter().any(|(d, _)| d.is_managed());
        let ws = policy == SchedPolicy::WorkStealing && forced.is_none() && !managed;
        st.notify_completions = policy == SchedPolicy::WorkStealing && !self.virtual_time;
        if !ws && spec_behind_held(st, spec) {
            // Work stealing would hold it behind them; placed by its user,
            // or after the policy changed, it waits for them instead.
            return Ok(Decision::BehindHeld);
        }
        if ws && !st.held.is_empty() {
            self.pump(st, sc)?;
            // Behind a held task that touches its data: held too (its data's
            // state is the held task's to set first).
            if spec_behind_held(st, spec) {
                let home = self.home_of(spec);
                return Ok(Decision::Held(self.hold(st, spec, home)));
            }
        }
        let deps = dependencies(spec);
        let footprint = model::footprint(spec.access.iter().map(|(d, _)| d.bytes() as u64));
        let size: u64 = spec.access.iter().map(|(d, _)| d.bytes() as u64).sum();
        let deps_end = deps.iter().map(|d| d.end_ns).fold(0.0, f64::max);
        // One clock read: the layer's clock (real time) and the start of
        // the decision's timing.
        let deciding = std::time::Instant::now();
        let now = if self.virtual_time {
            self.devices[0].now_ns() as f64
        } else {
            // Through u64: a u128 to f64 conversion is a library call.
            deciding.duration_since(self.t0).as_nanos() as u64 as f64
        };
        if let Some(f) = forced {
            // Placed by its user (`on_device`): no policy, but its device
            // is busy for the model's prediction where it has a trusted
            // one, so the policies' later choices count it.
            let free = self.free_at(st, sc, f, now).max(deps_end);
            let (predicted, _) = sc
                .models()
                .lookup(k.inner.key(), self.dev(f), footprint, size);
            let predicted = predicted.map(|p| p.0);
            let exec_ns = predicted.unwrap_or(0.0);
            let priority = (policy == SchedPolicy::Dmdas)
                .then_some(spec.priority)
                .flatten();
            let go = Go {
                device: f,
                priority,
                end_ns: free + exec_ns,
                predicted,
                cost_ns: exec_ns + sc.dispatch_ns(f),
                footprint,
                size,
                calibrating: false,
            };
            return Ok(Decision::Go(go, deps));
        }
        let moves = if managed {
            spec.access
                .iter()
                .map(|(d, _)| d.copies_in())
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        // The list of candidates is the runtime's, reused task after task.
        let mut candidates = std::mem::take(&mut st.candidates);
        candidates.clear();
        // The learning policy's estimates are read by it, and by the others
        // only for the chosen device when it has no prediction (work
        // stealing's as of its decision, before a harvest may come).
        let learned = policy == SchedPolicy::Learned || ws;
        candidates.extend((0..self.devices.len()).filter(runs).map(|d| {
            self.candidate(
                st, sc, spec, &moves, d, footprint, size, deps_end, now, learned,
            )
        }));
        sc.learner.prepare(k.inner.key(), footprint);
        let mut choice = sched::choose(policy, &candidates, &mut sc.learner);
        if ws && !sched::has_room(&candidates[choice.at]) {
            // The counts of tasks in flight as of now, then hold it if still
            // no device has room.
            self.harvest(st, sc);
            for c in &mut candidates {
                c.queued = st.queued[c.index];
            }
            choice = sched::choose(policy, &candidates, &mut sc.learner);
            if !sched::has_room(&candidates[choice.at]) {
                sc.stats.decision_ns += deciding.elapsed().as_nanos() as u64;
                let home = sched::argmin(&candidates, |x| -(x.local_bytes as f64));
                let home = candidates[home].index;
                return Ok(Decision::Held(self.hold(st, spec, home)));
            }
        }
        let chosen = &candidates[choice.at];
        let device = chosen.index;
        let exec_ns = match policy {
            SchedPolicy::Learned => chosen.learned_ns.or(chosen.predicted_ns),
            _ if ws => chosen.predicted_ns.or(chosen.learned_ns),
            _ => chosen
                .predicted_ns
                .or_else(|| sc.learner.estimate(k.inner.key(), device, footprint, size)),
        }
        .unwrap_or(0.0);
        let end_ns = chosen.free_ns.max(chosen.data_ready()) + exec_ns;
        let cost_ns = exec_ns + sc.dispatch_ns(device);
        let predicted = chosen.predicted_ns;
        st.candidates = candidates;
        sc.stats.decision_ns += deciding.elapsed().as_nanos() as u64;
        let priority = match policy {
            SchedPolicy::Dmdas => spec.priority,
            _ => None,
        };
        let go = Go {
            device,
            priority,
            end_ns,
            predicted,
            cost_ns,
            footprint,
            size,
            calibrating: choice.calibrating,
        };
        Ok(Decision::Go(go, deps))
    }

    /// A task bound to device `f` (`TaskBuilder::on_device`): a device of
    /// the context with code for its kernel, else the typed error.
    pub(crate) fn check_bound(&self, spec: &Spec, f: usize) -> Result<()> {
        let Some(dev) = self.devices.get(f) else {
            return Err(Error::InvalidArgument(format!(
                "task '{}': device index {f}, the context has {} devices",
                spec.kernel.name(),
                self.devices.len()
            )));
        };
        dev.check_code(&spec.kernel.inner)
    }

    /// The device holding most of `spec`'s data.
    fn home_of(&self, spec: &Spec) -> usize {
        let mut local = vec![0u64; self.devices.len()];
        for (data, _) in &spec.access {
            let ds = data::settled(data.state());
            for (d, v) in ds.valid.iter().enumerate() {
                if v.is_some() {
                    local[d] += data.bytes() as u64;
                }
            }
        }
        sched::argmin(&local, |&b| -(b as f64))
    }

    /// Holds `spec` back for device `home` (work stealing): its handle's
    /// event completes when the task does, wherever it runs.
    fn hold(self: &Arc<Self>, st: &mut RtState, spec: &Spec, home: usize) -> Task {
        let id = st.next_task;
        st.next_task += 1;
        let signal = Arc::new(self.devices[HOME].host_event());
        let slot = Arc::new(HeldSlot {
            bound: std::sync::atomic::AtomicUsize::new(usize::MAX),
            done: std::sync::OnceLock::new(),
            devices: self.devices.clone(),
            rt: Arc::downgrade(self),
        });
        let measured = Arc::new(std::sync::atomic::AtomicU64::new(f64::NAN.to_bits()));
        for (d, _) in &spec.access {
            *st.held_data.entry(d.id()).or_insert(0) += 1;
        }
        let task = Task {
            id,
            device: self.devices[home].clone(),
            index: home,
            held: Some(slot.clone()),
            event: signal.event().clone(),
            moved: 0,
            predicted: None,
            measured: Some(measured.clone()),
        };
        st.held.push_back(Held {
            spec: spec.clone(),
            home,
            id,
            signal,
            slot,
            measured,
        });
        self.progress.held.store(true, Ordering::Release);
        self.start_progress();
        task
    }

    /// Hands held tasks, oldest first, to devices with room: the one each
    /// was queued for if it has room, else the least loaded that has (the
    /// steal); stops at the first no device can take.
    fn pump(&self, st: &mut RtState, sc: &mut Sched) -> Result<()> {
        if st.held.is_empty() {
            return Ok(());
        }
        self.harvest(st, sc);
        while let Some(h) = st.held.front() {
            let room = |d: usize| {
                self.devices[d].check_code(&h.spec.kernel.inner).is_ok()
                    && (st.queued[d] as f64) < sched::WS_WINDOW * self.lanes[d] as f64
            };
            let load = |d: usize| st.queued[d] as f64 / self.lanes[d] as f64;
            let d = if room(h.home) {
                h.home
            } else {
                match (0..self.devices.len())
                    .filter(|&d| room(d))
                    .min_by(|&a, &b| load(a).total_cmp(&load(b)))
                {
                    Some(d) => d,
                    None => break,
                }
            };
            let h = st.held.pop_front().expect("looked at above");
            let deps = dependencies(&h.spec);
            let sizes = h.spec.access.iter().map(|(x, _)| x.bytes() as u64);
            let footprint = model::footprint(sizes.clone());
            let size: u64 = sizes.sum();
            let free = self.free_at(st, sc, d, self.now_ns());
            // A device's full pool of streams is not waited for here: the
            // caller holds the state and the scheduler, and a kernel or
            // callback on one of those streams that submits a task, or asks
            // the layer anything, would wait for it (the pool is full only
            // where a device runs more than `MAX_TASK_STREAMS / WS_WINDOW`
            // tasks at once and streams hold chains). The task stays first
            // in line; the next pump (the progress thread, `pump_until`, the
            // next submission) places it.
            let Ok(mut task) = self.emit(st, &h.spec, d, &deps, None, free, Some(h.id), true)?
            else {
                st.held.push_front(h);
                break;
            };
            for (x, _) in &h.spec.access {
                if let Some(n) = st.held_data.get_mut(&x.id()) {
                    *n -= 1;
                    if *n == 0 {
                        st.held_data.remove(&x.id());
                    }
                }
            }
            let stream = st.streams[d]
                .iter()
                .find(|p| matches!(&p.last, Some((t, _)) if *t == h.id))
                .map(|p| p.stream.clone())
                .expect("emit left the task last on a pool stream");
            let signal = h.signal;
            stream.host_callback(move || signal.signal())?;
            let _ = h.slot.done.set(stream.record_event()?);
            task.measured = Some(h.measured);
            h.slot.bound.store(d, Ordering::Release);
            sc.stats.stolen += u64::from(d != h.home);
            // (Not a dispatch sample: it waited to be placed.)
            let task = Booked {
                task,
                queued_at: 0,
                cost_ns: sc.dispatch_ns(d),
            };
            self.account(st, sc, &h.spec, task, footprint, size, false, free);
        }
        Ok(())
    }

    /// Hands held tasks to devices as room appears until `done`: between
    /// tries it looks at the tasks in flight (in virtual time that runs the
    /// devices' model) and yields.
    pub(crate) fn pump_until(&self, done: impl Fn() -> bool) -> Result<()> {
        loop {
            let in_flight: Vec<Event> = {
                let mut st = lock(&self.state);
                let mut sc = lock(&self.sched);
                self.pump(&mut st, &mut sc)?;
                st.pending.iter().map(|p| p.end.clone()).collect()
            };
            if done() {
                return Ok(());
            }
            if crate::exec::op::running_user_code() {
                // The tasks in flight may be behind this kernel or callback
                // (its stream's later work, tasks over its data): none would
                // make room while it waits here.
                return Err(Error::WouldDeadlock(
                    "work stealing holds tasks back until the devices have room, which work \
                     behind this kernel or host callback may hold; wait for them (Task::wait, \
                     Context::wait_tasks, TaskData::to_vec, a placed launch over their data) \
                     outside the callback"
                        .into(),
                ));
            }
            if in_flight.is_empty() {
                return Err(Error::InvalidArgument(
                    "work stealing holds tasks back while no device has a task in flight; \
                     this is a bug in the task layer"
                        .into(),
                ));
            }
            for e in &in_flight {
                let _ = e.query();
            }
            std::thread::yield_now();
        }
    }

    /// Whether a held task touches datum `id`.
    pub(crate) fn holds(&self, id: u64) -> bool {
        lock(&self.state).holds_any(std::iter::once(id))
    }

    /// A candidate device `d` for `spec`, as the policies see it.
    #[allow(clippy::too_many_arguments)]
    fn candidate(
        &self,
        st: &RtState,
        sc: &mut Sched,
        spec: &Spec,
        moves: &[crate::api::managed::CopiesIn],
        d: usize,
        footprint: u64,
        size: u64,
        deps_end: f64,
        now: f64,
        learned: bool,
    ) -> Candidate {
        let (mut transfer_ns, mut to_move, mut local) = (0.0, 0u64, 0u64);
        for (i, (data, mode)) in spec.access.iter().enumerate() {
            let bytes = data.bytes() as u64;
            if let Some(m) = moves.get(i).and_then(|m| m.get(d)) {
                // A managed buffer: its pages move whatever the mode.
                let n: u64 = m.iter().map(|x| x.1).sum();
                to_move += n;
                local += bytes - n;
                transfer_ns += self.managed_in_ns(m, d);
                continue;
            }
            let ds = data::settled(data.state());
            if ds.valid[d].is_some() {
                local += bytes;
            } else if mode.reads() {
                to_move += bytes;
                transfer_ns += self.cheapest_source(&ds.valid, d, bytes).1;
            }
        }
        let free = self.free_at(st, sc, d, now);
        let name = spec.kernel.inner.key();
        let (predicted, samples) = sc.models().lookup(name, self.dev(d), footprint, size);
        let predicted = predicted.map(|p| p.0);
        Candidate {
            index: d,
            lanes: self.lanes[d],
            free_ns: free,
            queued: st.queued[d],
            deps_end_ns: deps_end.max(now),
            transfer_ns,
            bytes_to_move: to_move,
            local_bytes: local,
            predicted_ns: predicted,
            samples,
            // Left out where the policy does not read it (`place_and_emit`).
            learned_ns: learned
                .then(|| sc.learner.estimate(name, d, footprint, size))
                .flatten(),
        }
    }

    /// When device `d` could start another task, on the layer's clock: its
    /// first compute unit free (not before `now`, nor in real time before
    /// its unfinished work from now), plus its dispatch time.
    fn free_at(&self, st: &RtState, sc: &Sched, d: usize, now: f64) -> f64 {
        let unit = st.free[d].iter().copied().fold(f64::MAX, f64::min);
        // A device behind its expected times: no earlier than its unfinished
        // work from now. (In virtual time the model runs only when the host
        // waits: the expected times are the model's.)
        let start = if self.virtual_time {
            now
        } else {
            dispatch::floor(now, st.unfinished[d], st.free[d].len())
        };
        unit.max(start) + sc.dispatch_ns(d)
    }

    /// `task` (just emitted after `deps`) as `account` books it, adding
    /// `cost_ns` to its unit. For the dispatch estimate
    /// (`exec/sched/dispatch.rs`) it notes when the task was on its device:
    /// in real time, one task in four with nothing to wait for but the
    /// device (no dependency, no copy); else 0.
    fn booked(&self, spec: &Spec, deps: &[Dep], task: Task, cost_ns: f64) -> Booked {
        let sampled = !self.virtual_time
            && task.id.is_multiple_of(4)
            && deps.is_empty()
            && spec.after.is_empty()
            && task.moved == 0;
        Booked {
            queued_at: if sampled {
                self.devices[task.index].now_ns()
            } else {
                0
            },
            task,
            cost_ns,
        }
    }

    /// Books a submitted task: its compute unit's expected free time, the
    /// tasks in flight, the figures.
    #[allow(clippy::too_many_arguments)]
    fn account(
        &self,
        st: &mut RtState,
        sc: &mut Sched,
        spec: &Spec,
        Booked {
            task,
            queued_at,
            cost_ns,
        }: Booked,
        footprint: u64,
        size: u64,
        calibrating: bool,
        end_ns: f64,
    ) -> Task {
        let device = task.index;
        // The compute unit that frees first takes it.
        let lanes = &mut st.free[device];
        let lane = sched::argmin(lanes, |&t| t);
        lanes[lane] = end_ns;
        st.unfinished[device] += cost_ns;
        st.pending.push(Pending {
            kernel: spec.kernel.inner.key(),
            footprint,
            size,
            device,
            end: task.event.clone(),
            queued_at,
            cost_ns,
            predicted: task.predicted,
            measured: task.measured.clone(),
        });
        st.queued[device] += 1;
        let s = &mut sc.stats;
        s.tasks += 1;
        s.calibration_tasks += u64::from(calibrating);
        if s.per_device.len() < self.devices.len() {
            s.per_device.resize(self.devices.len(), 0);
        }
        s.per_device[device] += 1;
        s.bytes_moved += task.moved;
        s.explored = sc.learner.explored;
        s.stream_waits += std::mem::take(&mut st.stream_waits);
        s.stream_wait_ns += std::mem::take(&mut st.stream_wait_ns);
        for (a, b, n) in st.link_bytes.drain(..) {
            s.add_link(a, b, n);
        }
        s.streams_made += std::mem::take(&mut st.streams_made);
        task
    }

    /// The valid replica to copy from into `to` and its transfer time.
    fn cheapest_source(&self, valid: &[Option<Event>], to: usize, bytes: u64) -> (usize, f64) {
        self.cheapest_of((0..valid.len()).filter(|&i| valid[i].is_some()), to, bytes)
    }

    /// Of replicas on `devices` (one at least), the one `bytes` reach
    /// device `to` from soonest, and that time.
    fn cheapest_of(
        &self,
        devices: impl Iterator<Item = usize>,
        to: usize,
        bytes: u64,
    ) -> (usize, f64) {
        devices
            .map(|i| (i, self.transfer_ns(i, to, bytes)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("some replica holds the current version")
    }

    /// Submits `spec` on device `d` after `deps`: a stream for it, the waits,
    /// the copies its data needs, the launch, and the buffers' new state.
    /// Where the device's pool is full of work not done it waits for the
    /// stream next in turn, or with `defer_wait` hands that stream's end
    /// back (`Err`) having changed nothing but dropping failed streams.
    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        st: &mut RtState,
        spec: &Spec,
        d: usize,
        deps: &[Dep],
        priority: Option<u8>,
        end_ns: f64,
        id: Option<u64>,
        defer_wait: bool,
    ) -> Result<std::result::Result<Task, Event>> {
        let pool = &mut st.streams[d];
        // A stream whose last task this one reads the data of (a fault there
        // fails this one anyway; behind a task it only follows, that task's
        // fault, sticky on its stream, would fail it): a scan of task
        // numbers, no shared memory read.
        let chained_at = deps.iter().filter(|x| x.data).find_map(|x| {
            let i = x.stream?;
            (i.0 == d
                && pool
                    .get(i.1)
                    .is_some_and(|p| matches!(&p.last, Some((t, _)) if *t == x.id)))
            .then_some(i.1)
        });
        let (mut waited, mut made, mut wait_ns) = (false, false, 0);
        let reuse = match chained_at {
            Some(i) => Some(i),
            // Else the next stream in turn, if its work completed: taken in
            // turn, the next is the one used longest ago, the likeliest
            // done, and one look at its timeline decides (a scan of every
            // stream's timeline reads lines the engines write). Streams
            // whose last task faulted leave the pool.
            None => loop {
                if pool.is_empty() {
                    break None;
                }
                let i = st.turn[d] % pool.len();
                match pool[i].status() {
                    Some(Ok(())) => {
                        st.turn[d] = i + 1;
                        break Some(i);
                    }
                    Some(Err(_)) => {
                        pool.swap_remove(i);
                    }
                    None if pool.len() >= MAX_STREAMS => {
                        // At the bound: any stream whose work completed,
                        // else wait for the oldest (as StarPU bounds the
                        // tasks in flight); one that faulted is replaced.
                        // (The first from the pool's start: which stream a
                        // task takes decides its device queue, and so the
                        // placements that follow in virtual time.)
                        let done = pool.iter().position(|p| matches!(p.status(), Some(Ok(()))));
                        if done.is_some() {
                            break done;
                        }
                        if let Some(end) = pool[i].last_end().filter(|_| defer_wait) {
                            // The caller waits, with no lock held, and asks again.
                            return Ok(Err(end));
                        }
                        waited = true;
                        let t0 = std::time::Instant::now();
                        let ok = pool[i].last_end().is_none_or(|e| e.synchronize().is_ok());
                        wait_ns += t0.elapsed().as_nanos() as u64;
                        if ok {
                            break Some(i);
                        }
                        pool.swap_remove(i);
                    }
                    None => break None,
                }
            },
        };
        let id = id.unwrap_or_else(|| {
            st.next_task += 1;
            st.next_task - 1
        });
        let pool = &mut st.streams[d];
        let at = match reuse {
            Some(i) => i,
            None => {
                let p = priority.unwrap_or(crate::api::stream::PRIORITY_LOWEST);
                let s = self.devices[d].create_stream_sized(p, Some(POOL_RING))?;
                s.set_name(format!("tasks {}", pool.len()));
                made = true;
                pool.push(PoolStream {
                    stream: s,
                    last: None,
                });
                pool.len() - 1
            }
        };
        let chained = pool[at].last.as_ref().map(|(t, _)| *t);
        st.stream_waits += u64::from(waited);
        st.stream_wait_ns += wait_ns;
        st.streams_made += u64::from(made);
        // Copies run where nothing before them can fail: a fault there,
        // sticky, would leave the copy undone and its replica marked valid
        // with a failed point, failing later readers of data that is whole.
        // So a copy takes on no fault: it follows its source replica's maker
        // with a memory wait (and starts then, as StarPU prefetches a
        // task's data once it is placed), on the task's stream when that
        // was taken in turn (its work all completed without a fault), else
        // (chained behind a task that may still fail) on one of the
        // device's copy streams (taken at the task's first copy); the task
        // then waits for the copies, and for its dependencies with their
        // faults.
        let mut side: Option<Stream> = None;
        let span = st.spans.pop().unwrap_or_default();
        // (Borrowed, not cloned: the fields written below are others.)
        let stream = &st.streams[d][at].stream;
        if let Some(p) = priority {
            if stream.priority() != p {
                stream.set_priority(p)?;
            }
        }
        let mut moved = 0u64;
        let mut copied = Vec::new();
        // Waits for replicas valid here, issued after the copies (they may
        // take on a fault); the list kept between tasks.
        let mut here = std::mem::take(&mut st.here);
        for (i, (data, mode)) in spec.access.iter().enumerate() {
            if data.is_managed() {
                let n = self.devices.len();
                for (from, bytes) in data.copies_in()?.swap_remove(d) {
                    moved += bytes;
                    st.link_bytes.push((from.unwrap_or(n), d, bytes));
                    record_link(spec.kernel.name(), from.unwrap_or(n), d, bytes);
                }
                data.bring(stream)?;
                continue;
            }
            data.replica(d, &self.devices[d])?;
            if !mode.reads() {
                continue;
            }
            let (src, after) = {
                let mut s = data::settled(data.state());
                s.drop_failed_replicas();
                if s.valid[d].is_some() {
                    // (After the copies: it may take on a fault.)
                    if let Some(ev) = s.valid[d].as_ref().filter(|e| e.is_recorded()) {
                        here.push(ev.clone());
                    }
                    continue;
                }
                let bytes = data.bytes() as u64;
                let (src, _) = self.cheapest_source(&s.valid, d, bytes);
                // After the source replica's maker, faulted or not: a fault
                // there is the datum's writer's, which every reader of the
                // datum takes on through its dependency on that writer.
                let after = match s.valid[src].as_ref().filter(|e| e.is_recorded()) {
                    Some(ev) => {
                        let p = ev.point_any("task data copy")?;
                        Some((p.timeline.clone(), p.value))
                    }
                    None => None,
                };
                moved += bytes;
                st.link_bytes.push((src, d, bytes));
                record_link(spec.kernel.name(), src, d, bytes);
                (src, after)
            };
            let copies_on = match (chained_at, &mut side) {
                (None, _) => stream,
                (Some(_), Some(s)) => s,
                (Some(_), side) => {
                    st.copy_turn = st.copy_turn.wrapping_add(1);
                    let slot = &mut st.copy_streams[d][st.copy_turn % COPY_STREAMS];
                    side.insert(self.side_stream(slot, d, "task data copies")?)
                }
            };
            let after = after.as_ref().map(|(timeline, value)| (timeline, *value));
            data.copy(copies_on, src, d, after, &[])?;
            // The copy's own point: the replica is valid once it is reached
            // (failed only where the copy itself failed).
            let q = copies_on.backend_stream();
            copied.push((i, Event::at(q.timeline().clone(), q.submitted())));
        }
        if let (Some(_), Some((_, last))) = (&side, copied.last()) {
            stream.wait_event(last)?;
        }
        for ev in here.drain(..) {
            stream.wait_event(&ev)?;
        }
        st.here = here;
        for dep in deps {
            if Some(dep.id) == chained {
                continue;
            }
            if dep.data {
                stream.wait_event(&dep.end)?;
            } else {
                stream.order_after(&dep.end)?;
            }
        }
        for e in &spec.after {
            stream.wait_event(e)?;
        }
        let args: Vec<crate::Arg<'_>> = spec
            .access
            .iter()
            .map(|(data, mode)| data.arg(d, mode.writes(), &[]))
            .collect();
        // One op: the launch stamps its own start and end.
        let end = stream.launch_marked(&spec.kernel, spec.grid, &args, span)?;
        drop(args);
        if st.notify_completions {
            // Room for a held task: the progress thread looks.
            let p = self.progress.clone();
            stream.host_callback(move || p.completed())?;
        }
        // The data's states keep the points the launch reaches, not its
        // stamped events (`Event::unstamped`).
        let end_at = end.unstamped();
        let me = || TaskRef {
            id,
            end: end_at.clone(),
            end_ns,
            stream: Some((d, at)),
        };
        for (i, (data, mode)) in spec.access.iter().enumerate() {
            let mut s = data::settled(data.state());
            if mode.writes() {
                // (A managed buffer keeps no `valid`: its pages say.)
                s.valid.iter_mut().for_each(|v| *v = None);
                if let Some(v) = s.valid.get_mut(d) {
                    *v = Some(end_at.clone());
                }
                s.writer = Some(me());
                s.readers.clear();
            } else {
                if let Some((_, point)) = copied.iter().find(|c| c.0 == i) {
                    s.valid[d] = Some(point.clone());
                }
                s.add_reader(me());
            }
        }
        let taken = &mut st.streams[d][at];
        taken.last = end.point.as_ref().map(|p| {
            debug_assert!(Arc::ptr_eq(&p.timeline, taken.timeline()), "launched there");
            (id, p.value)
        });
        Ok(Ok(Task {
            id,
            device: self.devices[d].clone(),
            index: d,
            held: None,
            event: end,
            moved,
            predicted: None,
            measured: None,
        }))
    }

    /// Waits for every task submitted so far; the first fault among those
    /// submitted since the last call is the error (the others still complete
    /// or fail on their own). Each fault is reported once: a faulted
    /// stream leaves the pool here, and the faults `harvest` met are taken.
    pub(crate) fn wait_all(&self) -> Result<()> {
        self.pump_until(|| lock(&self.state).held.is_empty())?;
        let events: Vec<(Event, u64)> = {
            let mut st = lock(&self.state);
            let tails = std::mem::take(&mut st.graph_tails);
            st.streams
                .iter()
                .flatten()
                .filter_map(|p| Some((p.last_end()?, u64::MAX)))
                .chain(tails)
                .collect()
        };
        let mut first = Ok(());
        for (e, from) in events {
            if let Err(err) = e.synchronize().and_then(|()| graph::launch_fault(&e, from)) {
                if first.is_ok() {
                    first = Err(err);
                }
            }
        }
        let mut st = lock(&self.state);
        let mut sc = lock(&self.sched);
        self.harvest(&mut st, &mut sc);
        sc.models().save();
        for pool in &mut st.streams {
            pool.retain(|p| !matches!(p.status(), Some(Err(_))));
        }
        let unreported = st.unreported.take();
        first.and(unreported.map_or(Ok(()), Err))
    }
}

/// A short calibration run of `device`'s bus: copies of 4 KiB and 1 MiB
/// from pinned host memory to the device and back, each direction three
/// times, the fastest of each size kept; the figure is the line through the
/// two sizes' mean of both directions (host time of a copy and its
/// completion, as a task's copy costs).
fn calibrate_bus(device: &Device) -> Result<crate::exec::sched::bus::BusFigure> {
    const SMALL: usize = 4 << 10;
    const LARGE: usize = 1 << 20;
    let s = device.create_stream()?;
    s.set_name("bus calibration");
    let time = |bytes: usize| -> Result<f64> {
        let mut host = device.alloc_pinned::<u8>(bytes)?;
        let dev = device.alloc::<u8>(bytes)?;
        let mut best = (f64::MAX, f64::MAX);
        for _ in 0..3 {
            let t0 = std::time::Instant::now();
            s.copy_h2d(&host, &dev)?;
            s.synchronize()?;
            best.0 = best.0.min(t0.elapsed().as_nanos() as f64);
            let t0 = std::time::Instant::now();
            s.copy_d2h(&dev, &mut host)?;
            s.synchronize()?;
            best.1 = best.1.min(t0.elapsed().as_nanos() as f64);
        }
        Ok((best.0 + best.1) / 2.0)
    };
    let (small, large) = (time(SMALL)?, time(LARGE)?);
    Ok(crate::exec::sched::bus::BusFigure::from_two(
        SMALL as u64,
        small,
        LARGE as u64,
        large,
    ))
}

/// The profiler's record of `bytes` copied from memory `from` to `to` for
/// a task of `kernel` (nothing when it is not recording).
pub(crate) fn record_link(kernel: &'static str, from: usize, to: usize, bytes: u64) {
    hetero_trace::record_link(hetero_trace::LinkRecord {
        kernel,
        from: from as u32,
        to: to as u32,
        bytes,
    });
}

/// The tasks `spec` depends on, from the order of accesses to its data
/// (RAW, WAR, WAW), each once.
fn dependencies(spec: &Spec) -> Vec<Dep> {
    let mut deps: Vec<Dep> = Vec::new();
    let mut add = |t: &TaskRef, data: bool| match deps.iter_mut().find(|d| d.id == t.id) {
        Some(d) => d.data |= data,
        None => deps.push(Dep {
            task: t.clone(),
            data,
        }),
    };
    for (data, mode) in &spec.access {
        let st = data::settled(data.state());
        if let Some(w) = &st.writer {
            add(w, mode.reads());
        }
        if mode.writes() {
            st.readers.iter().for_each(|r| add(r, false));
        }
    }
    deps
}

/// A task a new one follows. `data`: it reads what that task wrote (RAW),
/// so that task's fault is its own; else the order only (WAR, and WAW
/// without a read): it waits for that task's end, faulted or not, and a
/// faulted reader (or a faulted writer of data it overwrites) leaves it,
/// and the data it writes, whole.
#[derive(Clone)]
pub(crate) struct Dep {
    task: TaskRef,
    data: bool,
}

impl std::ops::Deref for Dep {
    type Target = TaskRef;
    fn deref(&self) -> &TaskRef {
        &self.task
    }
}

/// A submitted task: its completion event (usable by streams of any device
/// of the context: [`Stream::wait_event`]) and where it runs.
#[derive(Clone, Debug)]
pub struct Task {
    id: u64,
    device: Device,
    index: usize,
    /// Set for a task `ws` held back: the device that took it, once one did.
    held: Option<Arc<HeldSlot>>,
    event: Event,
    moved: u64,
    predicted: Option<f64>,
    /// A held task's cell for its observed time; `None`: its launch's span.
    measured: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl Task {
    /// The history model's prediction of its execution time on its device,
    /// ns (`None`: placed without a trusted model for that device).
    pub fn predicted_ns(&self) -> Option<f64> {
        self.predicted
    }

    /// Its execution time as the task layer observed it, ns, once it saw the
    /// task complete ([`Context::wait_tasks`]); `None` before.
    pub fn measured_ns(&self) -> Option<f64> {
        let v = observed(&self.measured, &self.event)?.load(Ordering::Relaxed);
        let v = f64::from_bits(v);
        (!v.is_nan()).then_some(v)
    }

    /// Completes when the task has (fails if it faulted or a task whose
    /// output it reads did; a task it only follows, one that read what it
    /// writes or whose output it overwrites unread, does not fail it). For
    /// a task work stealing held back, a host-signalled event: it
    /// completes once a device took the task and ran it; in virtual time
    /// waiting on it alone runs no device's model (use [`Task::wait`] or
    /// [`Context::wait_tasks`]).
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The device it runs on (for a task `ws` holds back, the device it
    /// was queued for until a device takes it).
    pub fn device(&self) -> &Device {
        match self.bound() {
            Some(d) => &self.held.as_ref().expect("bound: held").devices[d],
            None => &self.device,
        }
    }

    /// The device's index in the context (see [`Task::device`]).
    pub fn device_index(&self) -> usize {
        self.bound().unwrap_or(self.index)
    }

    /// Whether a device took it: false only while `ws` holds it back
    /// (every device that could run it had its fill of tasks in flight).
    pub fn is_placed(&self) -> bool {
        self.held.is_none() || self.bound().is_some()
    }

    fn bound(&self) -> Option<usize> {
        let d = self.held.as_ref()?.bound.load(Ordering::Acquire);
        (d != usize::MAX).then_some(d)
    }

    /// The task's number in its context's runtime (submission order).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes copied to its device for it.
    pub fn bytes_moved(&self) -> u64 {
        self.moved
    }

    /// Waits for it; its fault, or that of a task it depends on, is the error.
    /// A task `ws` holds back is handed to a device first (as tasks ahead of
    /// it complete).
    pub fn wait(&self) -> Result<()> {
        if let Some(h) = &self.held {
            if let Some(rt) = h.rt.upgrade() {
                rt.pump_until(|| h.bound.load(Ordering::Acquire) != usize::MAX)?;
            }
            if let Some(done) = h.done.get() {
                done.synchronize()?;
            }
        }
        self.event.synchronize()
    }
}

/// A task being described: its kernel, its data in argument order, its grid
/// and priority. From [`Context::task`]; [`TaskBuilder::submit`] places and
/// submits it.
#[must_use = "a task does nothing until submitted"]
pub struct TaskBuilder<'a> {
    ctx: &'a Context,
    spec: Spec,
    rt: Option<Arc<Runtime>>,
    error: Option<Error>,
}

impl<'a> TaskBuilder<'a> {
    fn add(mut self, d: DataArg<'_>, mode: Mode) -> Self {
        let (data, rt) = match d.task_data(self.ctx) {
            Ok(x) => x,
            Err(e) => {
                self.error.get_or_insert(e);
                return self;
            }
        };
        match &self.rt {
            Some(have) if !Arc::ptr_eq(have, &rt) => {
                self.error.get_or_insert(Error::DeviceContext {
                    op: "task",
                    detail: "the task's data belong to different contexts; a task uses data of \
                             its own context"
                        .into(),
                });
            }
            Some(_) => {}
            None => self.rt = Some(rt),
        }
        if self.spec.access.iter().any(|(a, _)| a.id() == data.id()) {
            self.error.get_or_insert(Error::Aliasing { op: "task" });
        }
        self.spec.access.push((data, mode));
        self
    }

    /// The kernel reads `d`: its next read argument ([`Block::read`](crate::Block::read);
    /// read and write arguments are numbered apart, in the order added).
    ///
    /// `d` is a [`TaskData`] or a [`ManagedBuffer`](crate::ManagedBuffer) of
    /// the context ([`DataArg`]): a managed buffer's pages move to the
    /// task's device before it starts (after the tasks it depends on), and
    /// the host reads it through its guards, which wait for the tasks.
    pub fn read<'d>(self, d: impl Into<DataArg<'d>>) -> Self {
        self.add(d.into(), Mode::Read)
    }

    /// The kernel writes all of `d` without reading it: its next write
    /// argument ([`Block::write`](crate::Block::write)), split across blocks
    /// as [`Arg::write`](crate::Arg::write) splits a buffer. Its contents
    /// before the task are not copied to the task's device (a managed
    /// buffer's pages are: its kernels may write part of what they declare).
    pub fn write<'d>(self, d: impl Into<DataArg<'d>>) -> Self {
        self.add(d.into(), Mode::Write)
    }

    /// The kernel reads and writes `d` (a write argument that holds the
    /// current contents).
    pub fn read_write<'d>(self, d: impl Into<DataArg<'d>>) -> Self {
        self.add(d.into(), Mode::ReadWrite)
    }

    /// The grid (default one block).
    pub fn grid(mut self, grid: impl Into<Grid>) -> Self {
        self.spec.grid = grid.into();
        self
    }

    /// The priority ([`PRIORITY_HIGHEST`](crate::PRIORITY_HIGHEST) = 0 ..
    /// [`PRIORITY_LOWEST`](crate::PRIORITY_LOWEST) = 7): under `dmdas`, its
    /// stream's priority (ready tasks of higher priority run first on their
    /// device). Out of range: `submit` and `record` fail.
    pub fn priority(mut self, priority: u8) -> Self {
        if priority > crate::PRIORITY_LOWEST {
            self.error.get_or_insert(Error::InvalidArgument(format!(
                "task '{}': priority {priority} is out of range; use 0 (highest) ..= {} (lowest)",
                self.spec.kernel.name(),
                crate::PRIORITY_LOWEST
            )));
        }
        self.spec.priority = Some(priority);
        self
    }

    /// The task also waits for `event` (recorded on a stream of a device of
    /// the context, or a [`HostEvent`](crate::HostEvent)'s), beside the
    /// dependencies its data gives it (StarPU's explicit dependencies).
    pub fn after(mut self, event: &Event) -> Self {
        self.spec.after.push(event.clone());
        self
    }

    /// Runs it on the context's device `index`, whatever the policy
    /// (StarPU's `execute_on_a_specific_worker`). The device counts as busy
    /// for the kernel's model prediction there (where trusted), so the
    /// policy's later choices see it. Recorded into a
    /// [`TaskGraph`], it binds HEFT's placement there too.
    pub fn on_device(mut self, index: usize) -> Self {
        self.spec.on = Some(index);
        self
    }

    /// Places and submits the task.
    pub fn submit(self) -> Result<Task> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let rt = match self.rt {
            Some(rt) => rt,
            None => self.ctx.task_runtime()?,
        };
        rt.submit(&self.spec, self.spec.on)
    }
}

impl Context {
    pub(crate) fn tasks_state(&self) -> &ContextTasks {
        &self.shared().tasks
    }

    /// The runtime of this context's tasks (made when none is alive).
    pub(crate) fn task_runtime(&self) -> Result<Arc<Runtime>> {
        let t = self.tasks_state();
        let mut w = lock(&t.runtime);
        if let Some(rt) = w.upgrade() {
            return Ok(rt);
        }
        let rt = Arc::new(Runtime::new(self, t.sched.clone())?);
        *w = Arc::downgrade(&rt);
        Ok(rt)
    }

    /// A task running `kernel`; add its data in argument order, then
    /// [`submit`](TaskBuilder::submit). It runs after the tasks submitted
    /// before it that write what it reads (RAW), read or write what it writes
    /// (WAR, WAW), on a device where the kernel has code, chosen by the
    /// context's policy ([`Context::set_scheduler`]).
    pub fn task<'a>(&'a self, kernel: &Kernel) -> TaskBuilder<'a> {
        TaskBuilder {
            ctx: self,
            spec: Spec {
                kernel: kernel.clone(),
                access: Vec::new(),
                grid: Grid::new(1),
                priority: None,
                elems: Vec::new(),
                after: Vec::new(),
                op: None,
                on: None,
            },
            rt: None,
            error: None,
        }
    }

    /// Task data holding `data`, on the context's first device.
    pub fn data_from<T: Pod + Send + Sync>(&self, data: &[T]) -> Result<TaskData<T>> {
        TaskData::new(self.task_runtime()?, data)
    }

    /// Task data of `len` zeroed elements.
    pub fn data<T: Pod + Send + Sync>(&self, len: usize) -> Result<TaskData<T>> {
        TaskData::zeroed(self.task_runtime()?, len)
    }

    /// Sets the scheduling policy for tasks submitted from now on (default:
    /// `HETERO_SCHED`, else dmda).
    pub fn set_scheduler(&self, policy: SchedPolicy) {
        lock(&self.tasks_state().sched).policy = policy;
    }

    /// The scheduling policy.
    pub fn scheduler(&self) -> SchedPolicy {
        lock(&self.tasks_state().sched).policy
    }

    /// Where this context's performance models persist (`None`: in memory
    /// only). Default: `HETERO_PERFMODEL_DIR`, else the user's cache
    /// directory (`$XDG_CACHE_HOME` or `~/.cache`) + `hetero/perfmodels`;
    /// an empty path means that default too, as an empty
    /// `HETERO_PERFMODEL_DIR` does (not the working directory). Models
    /// already loaded are saved first and then forgotten.
    pub fn set_perfmodel_dir(&self, dir: Option<PathBuf>) {
        let mut sc = lock(&self.tasks_state().sched);
        if let Some(m) = &mut sc.models {
            m.save();
        }
        sc.models = None;
        sc.model_dir = match dir {
            Some(d) if d.as_os_str().is_empty() => None,
            d => Some(d),
        };
    }

    /// Waits for every task submitted so far and feeds their times to the
    /// models (and saves them); the first fault among the tasks (and placed
    /// launches) since the last call is the error: each fault is reported
    /// once, by the first call after it. Tasks and launches that running
    /// kernels or callbacks submit while it waits may still be in flight
    /// when it returns; a later call waits for them.
    pub fn wait_tasks(&self) -> Result<()> {
        let rt = lock(&self.tasks_state().runtime).upgrade();
        match rt {
            Some(rt) => rt.wait_all(),
            None => Ok(()),
        }
    }

    /// What the task layer has done in this context.
    pub fn task_stats(&self) -> TaskStats {
        let mut sc = lock(&self.tasks_state().sched);
        let m = sc.models();
        let (loaded, damaged, rejected) = (m.loaded, m.damaged, m.rejected);
        let mut s = sc.stats.clone();
        s.prediction_error = sc
            .errors
            .iter()
            .map(|(&(kernel, device), &(tasks, sum))| PredictionError {
                kernel: kernel.text,
                device,
                tasks,
                mean_relative_error: sum / tasks as f64,
            })
            .collect();
        s.prediction_error
            .sort_unstable_by(|a, b| (a.kernel, a.device).cmp(&(b.kernel, b.device)));
        s.bytes_per_link.sort_unstable();
        s.models_loaded = loaded;
        s.models_damaged = damaged;
        s.outliers_rejected = rejected;
        s.dispatch_ns = sc.dispatch.iter().map(Dispatch::ns).collect();
        s
    }

    /// Forgets the figures of [`Context::task_stats`] (models and learned
    /// estimates stay).
    pub fn reset_task_stats(&self) {
        let mut sc = lock(&self.tasks_state().sched);
        sc.stats = TaskStats::default();
        sc.errors.clear();
    }
}

/// Each task's predecessors among `specs` (in recording order) and the
/// bytes each hands over: RAW edges carry the data, WAR and WAW only order.
pub(crate) fn dependencies_in(specs: &[Spec]) -> Vec<Vec<(usize, u64)>> {
    use std::collections::HashMap;
    // Per data: its last writer and the readers since.
    let mut seen: HashMap<u64, (Option<usize>, Vec<usize>)> = HashMap::new();
    let mut out = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let mut preds: Vec<(usize, u64)> = Vec::new();
        let mut add = |p: usize, bytes: u64| match preds.iter_mut().find(|x| x.0 == p) {
            Some(x) => x.1 = x.1.max(bytes),
            None => preds.push((p, bytes)),
        };
        for (data, mode) in &s.access {
            let (writer, readers) = seen.entry(data.id()).or_default();
            let bytes = data.bytes() as u64;
            if let Some(w) = *writer {
                add(w, if mode.reads() { bytes } else { 0 });
            }
            if mode.writes() {
                readers.iter().for_each(|&r| add(r, 0));
                *writer = Some(i);
                readers.clear();
            } else {
                readers.push(i);
            }
        }
        out.push(preds);
    }
    out
}

impl Device {
    /// Multiplies the modelled time of this emulated device's kernels by
    /// `factor` from the next kernel that starts (1.0: as configured): a
    /// device whose speed drifts while it runs (thermal throttling, a
    /// co-tenant), to check adaptive placement against. An error on other
    /// backends (their kernels take the time they take).
    pub fn set_emu_slowdown(&self, factor: f64) -> Result<()> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "set_emu_slowdown: factor {factor}; give a positive finite factor"
            )));
        }
        if crate::backend::emu::set_slowdown(self.backend(), factor) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "set_emu_slowdown: device {} is a {} device; only an emulated device's speed is \
                 modelled",
                self.id(),
                self.properties().backend
            )))
        }
    }
}
