//! Task graphs placed at instantiate time: tasks recorded in submission
//! order (`TaskBuilder::record`), placed all at once with HEFT
//! (`exec/sched/heft.rs`) on the context's performance models and link
//! models, then launched as often as wanted with that placement: a launch
//! makes no scheduling decision (no policy, no model read).
//!
//! Hetero's stream graphs (`api/graph`) are one device's; this is the
//! context-wide counterpart for tasks.

use super::data::{Bound, DataAny, TaskRef};
use super::{dependencies_in, lock, Context, Runtime, Spec, TaskBuilder};
use crate::api::graph::exec::table_for;
use crate::exec::graph::plan::SlotSpec;
use crate::exec::sched::heft::{self, HeftTask};
use crate::exec::sched::model;
use crate::exec::timeline::Timeline;
use crate::{Bindings, Event, Result, Stream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Tasks recorded for placement as a whole ([`TaskGraph::instantiate_on`]).
///
/// ```
/// use hetero::{Context, Device, Kernel, TaskGraph};
/// let devices = [Device::host().unwrap(), Device::host().unwrap()];
/// let ctx = Context::new(&devices).unwrap();
/// # ctx.set_perfmodel_dir(None); // the doctest writes no model file
/// let x = ctx.data_from(&[1u32; 4]).unwrap();
/// let inc = Kernel::new("inc", |b| b.write::<u32>(0).iter_mut().for_each(|v| *v += 1));
/// let mut g = TaskGraph::new();
/// ctx.task(&inc).read_write(&x).record(&mut g).unwrap();
/// let placed = g.instantiate_on(&ctx).unwrap();
/// placed.launch().unwrap();
/// placed.launch().unwrap();
/// assert_eq!(x.to_vec().unwrap(), vec![3; 4]);
/// ```
#[derive(Default)]
pub struct TaskGraph {
    pub(crate) specs: Vec<Spec>,
    pub(crate) rt: Option<Arc<Runtime>>,
}

/// A task graph with every task placed (HEFT) and its launch planned: the
/// stream each task goes on (one per compute unit of a device HEFT used),
/// the events it waits for, the copies its data needs, the events recorded.
/// [`launch`](Self::launch) replays that plan: no policy, no model, no
/// dependency analysis, no per-task lock.
pub struct PlacedTaskGraph {
    specs: Vec<Spec>,
    rt: Arc<Runtime>,
    /// A stream graph's slots (none for a task graph).
    pub(crate) slots: Arc<SlotSpec>,
    placement: Arc<[usize]>,
    makespan_ns: f64,
    plan: Plan,
}

/// Ops of one launch a plan puts on one stream at most (an upper count per
/// task: launch, record, waits, copies) before it goes on with the next
/// stream of the same compute unit: a quarter of a placed stream's ring
/// ([`PLACED_RING`]), so that a launch, which starts with its rings at most
/// half full (empty, but for launches sharing a set: `Streams`), never
/// waits for room in one while it submits.
const OPS_PER_STREAM: usize = 256;

/// The ring of a placed graph's stream: four times the ops of one launch
/// the plan counts on it (launches that share a set, `STREAM_SETS`, wait
/// for it to be at most half full).
const PLACED_RING: u64 = 4 * OPS_PER_STREAM as u64;

/// A stream of a placed graph on compute unit `l` of device `d`.
fn placed_stream(rt: &Runtime, (d, l): (usize, usize)) -> Result<crate::Stream> {
    let ring = Some(PLACED_RING as usize);
    let s = rt.devices[d].create_stream_sized(crate::api::stream::PRIORITY_LOWEST, ring)?;
    s.set_name(format!("placed tasks {l}"));
    Ok(s)
}

/// How many steps ahead a replay asks for the ring slots a step will write
/// (a slot was last written a ring's worth of ops ago, and the devices' work
/// since evicted it: prefetched, the misses of a few steps overlap), and for
/// how many (a step's ops: waits, copies, the launch; about three).
const PREFETCH_STEPS: usize = 4;
const PREFETCH_OPS: u64 = 3;

/// How many data ahead the passes over the data before and after a launch
/// ask for a datum's state (its lock, replicas, writer, readers' list).
const PREFETCH_DATA: usize = 4;

/// Copies datum `dp` from replica `from` into its start replica, on a host
/// stream of the start device after `after`, as the copies a launch adds
/// to its plan (`fixes`): the start replica's event. It only follows
/// `after` (a memory wait): the stream is the device's one for every
/// datum's host access, and a fault taken on there would fail them all
/// (the caller passes the fault of `after` to the steps that read the
/// datum, as any fault of its own).
fn bring_back(
    rt: &Runtime,
    books: &mut super::RtState,
    dp: &DataPlan,
    from: usize,
    after: Option<&Event>,
    bound: Bound<'_>,
    fixes: &mut Vec<(usize, usize, u64)>,
) -> Result<Event> {
    let s = rt.host_stream_in(books, dp.start)?;
    if let Some(e) = after {
        s.order_after(e)?;
    }
    dp.data.copy(&s, from, dp.start, None, bound)?;
    fixes.push((from, dp.start, dp.data.bytes() as u64));
    s.record_event()
}

/// Asks the CPU for datum `x`'s cell (where its state is), if there is one.
fn prefetch_datum(data: &[DataPlan], x: usize) {
    if let Some(dp) = data.get(x) {
        let cell: &dyn DataAny = &*dp.data;
        crate::exec::ring::prefetch(std::ptr::from_ref(cell).cast(), std::mem::size_of_val(cell));
    }
}

impl std::fmt::Debug for PlacedTaskGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacedTaskGraph")
            .field("tasks", &self.specs.len())
            .field("placement", &self.placement)
            .field("predicted_makespan_ns", &self.makespan_ns)
            .field("streams", &self.plan.lanes.len())
            .finish()
    }
}

/// Where a replica's current version comes from during a launch.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    /// Valid when the launch starts (its launch-time event).
    Start,
    /// Valid after a step's end event (the step wrote it there).
    Step(usize),
    /// Valid once a copy ([`Plan::copies`]) reached its point on its copy
    /// lane.
    Copy(usize),
}

/// A copy of a replica into a step's device, on a copy lane of that device
/// (a stream of copies only): it follows its source's maker with a memory
/// wait and fails only where it fails itself, so the replica it makes stays
/// usable whatever the steps around it do (a fault there is the datum's
/// writer's, which every reader takes on through its wait for that writer).
#[derive(Clone, Copy, Debug)]
struct CopyPlan {
    /// The datum (index into `Plan::data`).
    data: usize,
    from: usize,
    to: usize,
    /// What made the source replica current.
    src: Source,
    /// Its lane (index into `Plan::lanes`).
    lane: usize,
    /// Whether the two devices have a direct path (a link or shared
    /// memory, not staged through the host): one op, from the storages.
    direct: bool,
}

/// Streams per compute unit a plan keeps where streams have fault scopes:
/// a step goes on the one whose last step it reads, else on the one HEFT
/// frees first. (One per unit runs the unit's steps in HEFT's order, whose
/// times are estimates: on the modelled node GEMM's replay took 18.13 ms
/// against 16.72 with a stream per chain of steps, Cholesky 20.60 against
/// 22.52; two: 16.95 and 21.14; three: 16.72 and 21.86.)
const UNIT_STREAMS: usize = 2;

/// The lane of a copy lane in `Plan::lanes`: (device, this).
const COPY_LANE: usize = usize::MAX;

/// One task of the plan while `make_plan` walks it, in submission order.
struct Draft {
    /// The task's index in recording order.
    task: usize,
    device: usize,
    /// Index into `Plan::streams`.
    stream: usize,
    /// Earlier steps on other streams whose end events it waits for, taking
    /// on their faults (it reads what they wrote).
    waits: Vec<usize>,
    /// Earlier steps on other streams it only follows (it writes what they
    /// read, or overwrites what they wrote unread): memory waits, no fault
    /// taken on.
    orders: Vec<usize>,
    /// Data (index into `Plan::data`) whose launch-time events it waits for
    /// (it touches them before any step of the graph wrote them), as
    /// `2 x + 1` where it reads the datum (the last writer's fault is its
    /// own), else `2 x`.
    first: Vec<usize>,
    /// Its copies: (access index, copy index into `Plan::copies`).
    copies: Vec<(usize, usize)>,
    /// Copies (its own and earlier steps') whose replicas it reads: it
    /// waits for their points, taking on their faults.
    copy_waits: Vec<usize>,
    /// Whether a launch keeps its end event (another stream or the data's
    /// state after the launch needs it): the point its launch reaches, with
    /// no record op.
    record: bool,
    /// Whether it starts a fault scope on its stream (a stream with fault
    /// scopes, unless it reads the step before it there: it then goes on in
    /// that step's scope, whose fault is its own anyway).
    scope: bool,
    /// Whether it is its stream's last: its end is one of the launch's
    /// events, stamped (the caller may time it).
    tail: bool,
    /// HEFT's expected end, ns after the launch starts.
    end_ns: f64,
}

/// One task of the plan as a launch replays it, in submission order: what
/// its ops need is in the step or in the plan's flat lists (`Plan::ids`,
/// `Plan::access`), read in the order the steps are, so that a replay
/// follows no pointer per task into the recorded specs (memory the
/// devices' work has since evicted from the caches).
struct Step {
    /// The task's index in recording order.
    task: usize,
    device: usize,
    /// Index into `Plan::streams`.
    stream: usize,
    kernel: crate::Kernel,
    grid: crate::Grid,
    /// A stream graph's node that is not a kernel (`Spec::op`).
    op: Option<Arc<super::stream_graph::NodeOp>>,
    /// From `ids`: in `Plan::ids`, the steps it waits for (`waits` of them),
    /// the steps it only follows (`orders`), the data whose launch-time
    /// events it waits for (`first`, as `Draft::first`), then its copies as
    /// (access index, copy index) pairs (`copies`), then the copies whose
    /// points it waits for (`copy_waits`).
    ids: usize,
    waits: u32,
    orders: u32,
    first: u32,
    copies: u32,
    copy_waits: u32,
    /// From `access`: its accesses in `Plan::access` (`accesses` of them).
    access: usize,
    accesses: u32,
    /// Whether its spec waits for events too (`Spec::after`).
    after: bool,
    /// As `Draft::record`.
    record: bool,
    /// As `Draft::scope`.
    scope: bool,
    /// As `Draft::tail`.
    tail: bool,
    /// HEFT's expected end, ns after the launch starts.
    end_ns: f64,
}

/// A step's access, as its launch passes it.
struct Access {
    data: Arc<dyn DataAny>,
    writes: bool,
    /// The argument's element type when it is not the data's own.
    elem: Option<&'static crate::exec::kernel::ElemInfo>,
}

/// One datum the graph touches.
struct DataPlan {
    data: Arc<dyn DataAny>,
    /// The device whose replica the plan starts from.
    start: usize,
    /// Whether the graph writes it.
    written: bool,
    /// Its state after the launch: valid replicas, last writer, readers
    /// since (steps).
    valid: Vec<(usize, Source)>,
    writer: Option<usize>,
    readers: Vec<usize>,
    /// A copy back into the start replica after the launch, from the last
    /// writer's device on its stream (`write_back` plans).
    back: bool,
}

/// What launches change, one launch at a time.
struct Live {
    /// The sets of streams launches go on (see [`Streams`]), made as
    /// launches in flight at once need them, up to [`STREAM_SETS`].
    sets: Vec<Streams>,
    /// Launches so far.
    launches: u64,
    /// Buffers launches bound to slots, by address: the ends of the last
    /// tasks over each through a slot (its slot's data's last writer and
    /// readers), kept while one is pending.
    touched: HashMap<usize, Vec<Event>>,
    /// A launch's working lists, kept (empty) for the next: a replay
    /// allocates nothing per launch that it can reuse.
    scratch: Scratch,
    /// The lists a launch fills with what it reaches (the one before's,
    /// once published in `Marks` and swapped back).
    spare: View,
}

/// One stream per lane of the plan (`Plan::lanes`), for one launch at a
/// time: a launch goes on a set whose streams hold no pending work. Where
/// a stream fails every op after a fault (its device has no fault scopes),
/// the plan puts a step on a stream only after steps whose faults are its
/// own anyway; a step of the launch before, still pending, is no such step
/// (a launch depends on the one before only through their data). So a
/// launch while another is in flight goes on another set (up to
/// [`STREAM_SETS`]), and a set whose such stream failed gets a fresh stream
/// there before its next launch. (Where each step starts a fault scope,
/// a stream's fault ends with its step; sets then only spare a launch the
/// wait for room in rings another launch fills.)
struct Streams {
    streams: Vec<Stream>,
    /// Their timelines, where the steps' ends are.
    timelines: Vec<Arc<Timeline>>,
    /// Per stream: the span its last launch's tail stamped, kept to be
    /// reused by the next launch's tail once nothing else holds it (the op
    /// done, the caller's launch handle and the runtime's books let go).
    tail_spans: Vec<Option<Arc<crate::exec::op::Span>>>,
    /// When a launch last went on it (`Live::launches` then): a launch
    /// tries the most recent set first and shares the least recent.
    used: u64,
}

/// Sets of streams a plan makes at most: launches in flight at once whose
/// faults stay in their own launch. A launch while that many are in
/// flight shares the least recent one's streams (behind it: where streams
/// fail for good, a fault there reaches its steps on them too); it waits
/// only for room in their rings.
const STREAM_SETS: usize = 4;

impl Streams {
    /// A stream per lane of `lanes`.
    fn new(rt: &Runtime, lanes: &[(usize, usize)]) -> Result<Streams> {
        let streams = lanes
            .iter()
            .map(|&lane| placed_stream(rt, lane))
            .collect::<Result<Vec<_>>>()?;
        Ok(Streams {
            timelines: streams
                .iter()
                .map(|s| s.backend_stream().timeline().clone())
                .collect(),
            tail_spans: vec![None; streams.len()],
            streams,
            used: 0,
        })
    }

    /// Whether every op submitted to its streams completed (with a fault
    /// or not): only launches of its plan submit to them, holding `live`.
    fn idle(&self) -> bool {
        self.streams.iter().zip(&self.timelines).all(|(s, t)| {
            let submitted = s.backend_stream().submitted();
            submitted == 0 || t.status(submitted).is_some()
        })
    }

    /// Its streams a fault failed, replaced (one would fail every later
    /// launch's steps on it), but for those with fault scopes (`scoped`:
    /// the next launch's first step there starts one). (Its timeline says
    /// so: one line, not the stream's handle first.)
    fn replace_failed(
        &mut self,
        rt: &Runtime,
        lanes: &[(usize, usize)],
        scoped: &[bool],
    ) -> Result<()> {
        for (q, s) in self.streams.iter_mut().enumerate() {
            if self.timelines[q].failing() && !scoped[q] {
                let fresh = placed_stream(rt, lanes[q])?;
                self.timelines[q] = fresh.backend_stream().timeline().clone();
                self.tail_spans[q] = None;
                *s = fresh;
            }
        }
        Ok(())
    }
}

#[derive(Default)]
struct Scratch {
    /// Per stream: its last step's end event, stamped (the caller's).
    tail_events: Vec<Option<Event>>,
    /// What the data wait for before the launch, all data's in one list;
    /// `pre_at[x]` is where datum `x`'s end in it. `true`: what a step that
    /// reads the datum takes faults from (its last writer, its start
    /// replica); `false`: what any step only follows (its readers).
    pre: Vec<(Event, bool)>,
    pre_at: Vec<usize>,
    /// Per datum: the copy back into its start replica.
    backs: Vec<Option<Event>>,
    /// Copies the launch adds to the plan's, as (from, to, bytes): into the
    /// start replicas before it and back into them after it.
    fixes: Vec<(usize, usize, u64)>,
}

impl Scratch {
    /// Empties the lists (their events released), keeping their room.
    fn clear(&mut self) {
        self.tail_events.clear();
        self.pre.clear();
        self.pre_at.clear();
        self.backs.clear();
        self.fixes.clear();
    }
}

/// What one launch reached: the data's states after it follow from this
/// and the plan (`Marks::apply`).
#[derive(Default)]
struct View {
    /// The number of its first task (the runtime's books).
    base: u64,
    /// When it started, ns on the runtime's clock.
    t0: f64,
    /// Its streams' timelines.
    timelines: Vec<Arc<Timeline>>,
    /// Per step: the value its launch reached on its stream's timeline,
    /// where the plan keeps it (no event made per step).
    ends: Vec<Option<u64>>,
    /// Per copy: the value it reached on its lane's timeline.
    copy_ends: Vec<Option<u64>>,
    /// Per datum: its start replica's event.
    start_valid: Vec<Option<Event>>,
}

impl View {
    /// Empty lists the size of `plan`'s, for a launch to fill.
    fn reset(&mut self, plan: &Plan) {
        self.ends.clear();
        self.ends.resize(plan.steps.len(), None);
        self.copy_ends.clear();
        self.copy_ends.resize(plan.copies.len(), None);
        self.start_valid.clear();
    }
}

/// What a datum's state needs of a placed graph to take on its latest
/// launch. A launch of a graph over task data only (no slot of a stream
/// graph, no managed buffer, nothing copied back) publishes what it
/// reached here and leaves on each datum only a [`Mark`]; whoever next
/// locks that datum's state (`data::settled`) applies the latest launch to
/// it. A launch after one that completed without a fault, its data
/// untouched since (all still marked, none settled: not `dirty`), reads
/// and sets no datum's state at all: it brings back the start replicas the
/// plan does not leave valid (the plan is fixed, the replicas it ends on
/// known) and goes. Holds no data (the data's marks hold this).
///
/// Invariant: a datum marked with these `Marks` has as its state the one it
/// holds with the latest published launch applied. A launch publishes
/// before it marks (a datum it marks is never settled with the launch
/// before); one that marks nothing (every datum still marked from the last)
/// sees `dirty` when a datum was settled while it ran (a host read from
/// another thread), and marks again. Lock order: the launch's `live`, the
/// runtime's state, a datum's state, `published`; whoever holds
/// `published` takes no other.
pub(crate) struct Marks {
    data: Vec<SettleDatum>,
    /// Per step: its stream and HEFT's expected end (ns after its launch's
    /// start).
    steps: Vec<(usize, f64)>,
    /// Per copy: its lane.
    copy_lanes: Vec<usize>,
    published: Mutex<Published>,
}

/// A datum's state after a launch, as `DataPlan` says it.
struct SettleDatum {
    valid: Vec<(usize, Source)>,
    writer: Option<usize>,
    readers: Vec<usize>,
    written: bool,
}

#[derive(Default)]
struct Published {
    /// The latest launch's (empty before the first).
    view: View,
    /// Whether a marked datum was settled since the launch published.
    dirty: bool,
}

/// A datum's mark: its state waits for its graph's latest launch (datum
/// `x` of that plan) to be applied.
pub(crate) struct Mark {
    marks: Arc<Marks>,
    x: usize,
}

impl Mark {
    fn is_of(&self, marks: &Arc<Marks>) -> bool {
        Arc::ptr_eq(&self.marks, marks)
    }

    /// Applies the latest launch of the mark's graph to `ds` (the state the
    /// mark was on, locked by the caller).
    pub(crate) fn settle(self, ds: &mut super::data::DataState) {
        let mut p = lock(&self.marks.published);
        p.dirty = true;
        self.marks.apply(&p.view, self.x, ds);
    }
}

impl Marks {
    /// Datum `x`'s state after the launch `view`: its valid replicas, last
    /// writer and readers.
    fn apply(&self, view: &View, x: usize, ds: &mut super::data::DataState) {
        let d = &self.data[x];
        // Step `j` as the state names it: its task's number, and the point
        // its launch reached. A state names the same streams launch after
        // launch: set in place (`TaskRef::set_at`), no count taken or let go.
        let step_end = |j: usize| {
            let value = view.ends[j].expect("recorded: the state names it");
            (&view.timelines[self.steps[j].0], value)
        };
        let end_ns = |j: usize| view.t0 + self.steps[j].1;
        let set = |r: &mut TaskRef, j: usize| {
            let (timeline, value) = step_end(j);
            r.set_at(view.base + j as u64, timeline, value, end_ns(j));
        };
        let task_ref = |j: usize| {
            let (timeline, value) = step_end(j);
            TaskRef::at(view.base + j as u64, timeline, value, end_ns(j))
        };
        let mut valid = d.valid.iter().peekable();
        for (i, v) in ds.valid.iter_mut().enumerate() {
            match valid.next_if(|&&(k, _)| k == i).map(|&(_, src)| src) {
                None => *v = None,
                Some(Source::Start) => *v = view.start_valid[x].clone(),
                Some(Source::Step(j)) => {
                    let (timeline, value) = step_end(j);
                    v.get_or_insert_with(Event::new).set_at(timeline, value);
                }
                Some(Source::Copy(k)) => {
                    let value = view.copy_ends[k].expect("the launch made every copy");
                    let timeline = &view.timelines[self.copy_lanes[k]];
                    v.get_or_insert_with(Event::new).set_at(timeline, value);
                }
            }
        }
        if d.written {
            match (d.writer, &mut ds.writer) {
                (Some(j), Some(w)) => set(w, j),
                (j, w) => *w = j.map(task_ref),
            }
            ds.readers.truncate(d.readers.len());
            for (k, &r) in d.readers.iter().enumerate() {
                match ds.readers.get_mut(k) {
                    Some(t) => set(t, r),
                    None => ds.readers.push(task_ref(r)),
                }
            }
        } else {
            for &r in &d.readers {
                ds.add_reader(task_ref(r));
            }
        }
    }
}

struct Plan {
    live: Mutex<Live>,
    /// Each stream's (device, compute unit).
    lanes: Vec<(usize, usize)>,
    /// Per stream: whether it has fault scopes (`make_plan`'s `scoped`: its
    /// steps start them, `Step::scope`). A copy lane has none.
    scoped: Vec<bool>,
    /// Per stream: its first and last steps (indices into `steps`;
    /// `usize::MAX` on a copy lane).
    first: Vec<usize>,
    last: Vec<usize>,
    steps: Vec<Step>,
    /// The steps' lists (`Step::ids`).
    ids: Vec<usize>,
    /// The steps' accesses (`Step::access`).
    access: Vec<Access>,
    data: Vec<DataPlan>,
    /// Bytes copied per launch, per link: (from, to, bytes), each link once.
    moved: Vec<(usize, usize, u64)>,
    /// The replicas' copies, each on a copy lane.
    copies: Vec<CopyPlan>,
    /// Tasks per device (index in the context).
    per_device: Vec<u64>,
    /// The most accesses a step has, and the most points it waits for in
    /// one call (`waits` with `copy_waits`, or `orders`).
    most_accesses: usize,
    most_points: usize,
    /// What the data's marks need to apply a launch (`Marks`).
    marks: Arc<Marks>,
    /// Whether a launch marks the data (`Marks`) rather than setting their
    /// states: no datum is a slot, a managed buffer or copied back.
    lazy: bool,
}

/// One launch of a [`PlacedTaskGraph`]: the last event of each stream it
/// used.
#[derive(Clone, Debug)]
pub struct TaskGraphLaunch {
    events: Vec<Event>,
    /// Per event: the value of its timeline from which a fault is the
    /// launch's (`launch_fault`).
    from: Vec<u64>,
    /// The plan's placement (shared with it: a launch copies nothing).
    devices: Arc<[usize]>,
    /// The task layer the launch is in flight in (which holds itself alive
    /// while it sees work in flight: told when the launch is waited for).
    rt: std::sync::Weak<Runtime>,
}

/// The first fault on the timeline of `tail`, a launch's last event on a
/// stream, from value `from` to the event's (where its stream has fault
/// scopes, the event's own fault is its step's only; `u64::MAX`: the
/// event's own); call once `tail` is reached.
pub(crate) fn launch_fault(tail: &Event, from: u64) -> Result<()> {
    match tail.point.as_ref() {
        Some(p) => p
            .timeline
            .error_in(from.min(p.value), p.value)
            .map_or(Ok(()), Err),
        None => Ok(()),
    }
}

impl TaskGraphLaunch {
    /// Waits for every task of the launch; the first fault is the error.
    /// The context's task layer then looks at what it has in flight, so a
    /// layer with nothing left stops holding the context's devices.
    pub fn wait(&self) -> Result<()> {
        let mut first = Ok(());
        for (e, &from) in self.events.iter().zip(&self.from) {
            if let Err(err) = e.synchronize().and_then(|()| launch_fault(e, from)) {
                if first.is_ok() {
                    first = Err(err);
                }
            }
        }
        if let Some(rt) = self.rt.upgrade() {
            rt.look();
        }
        first
    }

    /// The last event of each stream the launch used. Work that waits for
    /// one follows that stream's tasks of the launch and takes on the fault
    /// of its last task and what that task read, not every fault of the
    /// launch on the stream (where streams have fault scopes, each task's
    /// fault is its own): [`wait`](Self::wait) reports every fault.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The device (index in the context) each task ran on, in recording
    /// order.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }
}

impl TaskGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tasks recorded.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Whether no task was recorded.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Places every task with HEFT (upward rank, earliest finish time with
    /// insertion) on `ctx`'s devices: execution times from the performance
    /// models (a kernel without a trusted model on a device costs its mean
    /// elsewhere, or 1 µs), transfers from the link models, data not written
    /// in the graph where it is now.
    /// Tasks recorded from another context's builder are an
    /// [`Error::DeviceContext`](crate::Error::DeviceContext).
    pub fn instantiate_on(&self, ctx: &Context) -> Result<PlacedTaskGraph> {
        let rt = match &self.rt {
            Some(rt) if !Arc::ptr_eq(&rt.ctx, ctx.shared()) => {
                return Err(crate::Error::DeviceContext {
                    op: "TaskGraph::instantiate_on",
                    detail: format!(
                        "the graph holds tasks of context {}, not of context {}: instantiate it \
                         on the context its tasks were recorded from",
                        rt.ctx.id(),
                        ctx.id()
                    ),
                })
            }
            Some(rt) => rt.clone(),
            None => ctx.task_runtime()?,
        };
        let deps = dependencies_in(&self.specs);
        place(rt, self.specs.clone(), deps, false)
    }
}

/// Places `specs` (in a topological order; `deps`: each one's predecessors
/// and the bytes they hand over) with HEFT on `rt`'s devices and plans their
/// launch; `write_back`: a launch ends with every written datum's current
/// version also in its start replica (stream graphs: the user's buffers).
pub(crate) fn place(
    rt: Arc<Runtime>,
    specs: Vec<Spec>,
    deps: Vec<Vec<(usize, u64)>>,
    write_back: bool,
) -> Result<PlacedTaskGraph> {
    let n = rt.devices.len();
    let mut tasks = Vec::with_capacity(specs.len());
    // The data tasks before the one at hand write (a scan of every earlier
    // task per access made instantiate quadratic: 40 000 independent tasks
    // took 8.8 s).
    let mut written = rustc_hash::FxHashSet::<u64>::default();
    {
        let mut sc = lock(&rt.sched);
        for (i, spec) in specs.iter().enumerate() {
            let sizes = spec.access.iter().map(|(d, _)| d.bytes() as u64);
            let footprint = model::footprint(sizes.clone());
            let size: u64 = sizes.sum();
            let name = spec.kernel.inner.key();
            let mut cost: Vec<Option<f64>> = (0..n)
                .map(|d| {
                    if let Some(op) = &spec.op {
                        return op.cost_ns(&rt, d);
                    }
                    rt.devices[d].check_code(&spec.kernel.inner).ok()?;
                    Some(
                        sc.models()
                            .predict(name, rt.dev(d), footprint, size)
                            .map_or(f64::NAN, |p| p.0),
                    )
                })
                .collect();
            let known: Vec<f64> = cost
                .iter()
                .flatten()
                .copied()
                .filter(|c| !c.is_nan())
                .collect();
            let fill = if known.is_empty() {
                1000.0
            } else {
                known.iter().sum::<f64>() / known.len() as f64
            };
            for c in cost.iter_mut().flatten() {
                if c.is_nan() {
                    *c = fill;
                }
            }
            if let Some(f) = spec.on {
                // Bound there (`TaskBuilder::on_device`; checked at record).
                cost.iter_mut()
                    .enumerate()
                    .filter(|&(d, _)| d != f)
                    .for_each(|(_, c)| *c = None);
            }
            if cost.iter().all(Option::is_none) {
                rt.devices[0].check_code(&spec.kernel.inner)?;
            }
            let mut inputs = Vec::new();
            for (data, mode) in &spec.access {
                let written_before = written.contains(&data.id());
                if data.is_managed() && !written_before {
                    // Its pages move whatever the mode: HEFT sees it on the
                    // device that needs the fewest moved, the others paying
                    // for the most any of them needs.
                    let moves = data.copies_in()?;
                    let to_move = |d: usize| moves[d].iter().map(|m| m.1).sum::<u64>();
                    let at = (0..n).min_by_key(|&d| to_move(d)).unwrap_or(super::HOME);
                    inputs.push((at, (0..n).map(to_move).max().unwrap_or(0)));
                } else if mode.reads() && !written_before {
                    let st = super::data::settled(data.state());
                    let at = (0..n)
                        .find(|&d| st.valid[d].is_some())
                        .unwrap_or(super::HOME);
                    inputs.push((at, data.bytes() as u64));
                }
            }
            let writes = spec.access.iter().filter(|(_, m)| m.writes());
            written.extend(writes.map(|(x, _)| x.id()));
            tasks.push(HeftTask {
                preds: deps[i].clone(),
                inputs,
                cost,
            });
        }
    }
    let comm = |a: usize, b: usize, bytes: u64| rt.transfer_ns(a, b, bytes);
    let placed = heft::plan(&tasks, &rt.lanes, &comm);
    let plan = make_plan(&rt, &specs, &deps, &placed, write_back)?;
    Ok(PlacedTaskGraph {
        specs,
        slots: Arc::new(SlotSpec::none()),
        placement: placed.iter().map(|p| p.device).collect(),
        makespan_ns: placed.iter().map(|p| p.end).fold(0.0, f64::max),
        rt,
        plan,
    })
}

/// The launch plan of `specs` placed as `placed`: steps in HEFT's start
/// order (topological: a task starts after its predecessors end), one
/// stream per (device, compute unit) used, and a walk of the data's
/// coherence (which replica is valid after which step) from a start where
/// each datum is valid on one device, to know every copy and wait now.
fn make_plan(
    rt: &Runtime,
    specs: &[Spec],
    deps: &[Vec<(usize, u64)>],
    placed: &[heft::Placed],
    write_back: bool,
) -> Result<Plan> {
    let n_dev = rt.devices.len();
    // Devices whose streams have fault scopes (`Backend::fault_scopes`):
    // each step there starts one, so a fault fails its step and what reads
    // its output, not the steps after it on its stream.
    let scoped: Vec<bool> = rt
        .devices
        .iter()
        .map(|d| d.backend().fault_scopes())
        .collect();
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by(|&a, &b| placed[a].start.total_cmp(&placed[b].start).then(a.cmp(&b)));
    let mut step_of = vec![usize::MAX; specs.len()];
    for (s, &t) in order.iter().enumerate() {
        step_of[t] = s;
    }
    // Zero-cost ties could put a task before a predecessor: then the
    // recording order (topological by construction).
    if (0..specs.len()).any(|t| deps[t].iter().any(|&(p, _)| step_of[p] > step_of[t])) {
        order = (0..specs.len()).collect();
        for (s, &t) in order.iter().enumerate() {
            step_of[t] = s;
        }
    }
    let mut lanes: Vec<(usize, usize)> = Vec::new();
    let mut stream_ops: Vec<usize> = Vec::new();
    // Per stream: its steps so far, and HEFT's end of its last one.
    let mut position_count: Vec<u32> = Vec::new();
    let mut last_end_ns: Vec<f64> = Vec::new();
    // Per stream: its last step so far (`usize::MAX`: none).
    let mut last_step: Vec<usize> = Vec::new();
    // Per stream, the vector clock of its next step; per step, its place on
    // its stream and the clock after it.
    let mut clock: Vec<Vec<u32>> = Vec::new();
    let mut position: Vec<u32> = Vec::with_capacity(specs.len());
    let mut after_clock: Vec<Vec<u32>> = Vec::with_capacity(specs.len());
    // The same for faults (see `fault_clock` below).
    let mut fault_clock: Vec<Vec<u32>> = Vec::new();
    let mut after_fault: Vec<Vec<u32>> = Vec::with_capacity(specs.len());
    let mut data: Vec<DataPlan> = Vec::new();
    let mut data_index: std::collections::HashMap<u64, usize> = Default::default();
    // Per datum, per device: the source of its valid replica in the walk.
    let mut valid: Vec<Vec<Option<Source>>> = Vec::new();
    let mut steps: Vec<Draft> = Vec::with_capacity(specs.len());
    let mut moved = Vec::new();
    let mut copies: Vec<CopyPlan> = Vec::new();
    // The copy lanes made so far (indices into `lanes`).
    let mut copy_lanes: Vec<usize> = Vec::new();
    for &t in &order {
        let spec = &specs[t];
        let d = placed[t].device;
        let s = steps.len();
        let mut step = Draft {
            task: t,
            device: d,
            stream: usize::MAX,
            waits: Vec::new(),
            orders: Vec::new(),
            first: Vec::new(),
            copies: Vec::new(),
            copy_waits: Vec::new(),
            record: false,
            scope: false,
            tail: false,
            end_ns: placed[t].end,
        };
        // Steps this one must follow (in `waits` for now; filtered below by
        // what its stream already follows), and of them those whose output
        // it reads (their faults are its own: `reads`).
        step.waits.extend(deps[t].iter().map(|&(p, _)| step_of[p]));
        let mut reads: Vec<usize> = Vec::new();
        for (a, (datum, mode)) in spec.access.iter().enumerate() {
            let x = *data_index.entry(datum.id()).or_insert_with(|| {
                let st = super::data::settled(datum.state());
                // (A managed buffer keeps no `valid`: its start is `HOME`.)
                let start = (0..n_dev)
                    .find(|&i| st.valid.get(i).is_some_and(Option::is_some))
                    .unwrap_or(super::HOME);
                data.push(DataPlan {
                    data: datum.clone(),
                    start,
                    written: false,
                    valid: Vec::new(),
                    writer: None,
                    readers: Vec::new(),
                    back: false,
                });
                let mut v = vec![None; n_dev];
                v[start] = Some(Source::Start);
                valid.push(v);
                data.len() - 1
            });
            datum.replica(d, &rt.devices[d])?;
            if !data[x].written {
                step.first.push(2 * x + usize::from(mode.reads()));
            }
            if mode.reads() {
                reads.extend(data[x].writer);
            }
            // A managed buffer's pages move at its launch (the waits its
            // dependencies give order them): no replica to copy.
            if mode.reads() && !datum.is_managed() {
                match valid[x][d] {
                    // Written here by its writer: a dependency already.
                    Some(Source::Step(_) | Source::Start) => {}
                    Some(Source::Copy(k)) => step.copy_waits.push(k),
                    None => {
                        // From the last writer's device if there is one,
                        // else the cheapest valid replica.
                        let bytes = datum.bytes() as u64;
                        let from = data[x]
                            .writer
                            .map(|w| steps[w].device)
                            .filter(|&w| valid[x][w].is_some())
                            .unwrap_or_else(|| {
                                (0..n_dev)
                                    .filter(|&i| valid[x][i].is_some())
                                    .min_by(|&a, &b| {
                                        rt.transfer_ns(a, d, bytes)
                                            .total_cmp(&rt.transfer_ns(b, d, bytes))
                                    })
                                    .expect("some replica is valid")
                            });
                        datum.replica(from, &rt.devices[from])?;
                        let src = valid[x][from].expect("chosen valid");
                        if let Source::Step(j) = src {
                            steps[j].record = true;
                        }
                        // On the device's copy lane with room for it.
                        let lane = match copy_lanes.iter().rev().find(|&&q| lanes[q].0 == d) {
                            Some(&q) if stream_ops[q] + 3 <= OPS_PER_STREAM => q,
                            _ => {
                                lanes.push((d, COPY_LANE));
                                stream_ops.push(0);
                                position_count.push(0);
                                last_end_ns.push(0.0);
                                last_step.push(usize::MAX);
                                copy_lanes.push(lanes.len() - 1);
                                lanes.len() - 1
                            }
                        };
                        stream_ops[lane] += 3;
                        let k = copies.len();
                        let ids = (rt.devices[from].id(), rt.devices[d].id());
                        let path = rt.ctx.topology().path(ids.0, ids.1);
                        let direct = matches!(
                            path,
                            Some(crate::PeerPath::Link(_) | crate::PeerPath::SharedMemory)
                        );
                        copies.push(CopyPlan {
                            data: x,
                            from,
                            to: d,
                            src,
                            lane,
                            direct,
                        });
                        step.copies.push((a, k));
                        step.copy_waits.push(k);
                        moved.push((from, d, bytes));
                        valid[x][d] = Some(Source::Copy(k));
                    }
                }
            }
            let dp = &mut data[x];
            if mode.writes() {
                dp.written = true;
                dp.writer = Some(s);
                dp.readers.clear();
                valid[x].iter_mut().for_each(|v| *v = None);
                valid[x][d] = Some(Source::Step(s));
            } else {
                dp.readers.push(s);
            }
        }
        // Vector clocks: `clock[q][r]` is how many steps of stream `r` the
        // next step of stream `q` follows; a wait another already implies
        // (through stream order or an earlier wait) is left out.
        // A second clock, `fault_clock`, counts only what a step takes
        // faults from: its stream's earlier steps (a fault is sticky on a
        // stream without fault scopes) and the steps whose output it reads,
        // through their own.
        let mut want = std::mem::take(&mut step.waits);
        want.sort_unstable_by(|a, b| b.cmp(a));
        want.dedup();
        reads.retain(|&j| j < s);
        reads.sort_unstable_by(|a, b| b.cmp(a));
        reads.dedup();
        // The stream, on a device without fault scopes: one of the
        // device's whose every step's fault would be this one's anyway
        // (through the steps whose output it reads), so a
        // stream's order never holds a task behind one whose fault is not
        // its own (nor behind one it does not depend on: HEFT's order on a
        // compute unit comes from estimates; the device runs whichever
        // stream is ready), and with room for its ops in this launch; else
        // a new one; past `MAX_TASK_STREAMS` on the device, the one whose
        // last step HEFT ends first.
        // (Its copies go on copy lanes: on its stream, a wait op per four
        // points and the launch; counted as one op per point.)
        let ops = match scoped[d] {
            true => 3 + want.len() + step.first.len() + step.copy_waits.len(),
            false => 2 + 2 * want.len() + 3 * spec.access.len(),
        };
        let mut join = vec![0u32; lanes.len()];
        for &j in &reads {
            for (m, &c) in join.iter_mut().zip(&after_fault[j]) {
                *m = (*m).max(c);
            }
        }
        let mut mine_on_device = 0;
        // Of the streams it may go on, the one where stream order stands
        // for the most of its waits.
        let mut implied: Option<(usize, usize)> = None;
        let mut earliest: Option<(f64, usize)> = None;
        for q in 0..lanes.len() {
            if lanes[q].0 != d || lanes[q].1 == COPY_LANE {
                continue;
            }
            mine_on_device += 1;
            let last = position_count[q];
            if join.get(q).copied().unwrap_or(0) >= last && stream_ops[q] + ops <= OPS_PER_STREAM {
                let saved = want.iter().filter(|&&j| steps[j].stream == q).count();
                if implied.is_none_or(|(best, _)| saved > best) {
                    implied = Some((saved, q));
                }
                continue;
            }
            let last_end = last_end_ns[q];
            if earliest.is_none_or(|(e, _)| last_end < e) {
                earliest = Some((last_end, q));
            }
        }
        // With fault scopes: one of its compute unit's streams in HEFT's
        // plan (`UNIT_STREAMS`, named `unit × UNIT_STREAMS + k`), the one
        // whose last step it reads, else the one HEFT frees first; while
        // it has room, else a new one in its place.
        // (name, its current stream if made)
        let unit = scoped[d].then(|| {
            let mut best: Option<(bool, f64, usize, Option<usize>)> = None;
            for name in (0..UNIT_STREAMS).map(|k| placed[t].lane * UNIT_STREAMS + k) {
                let q = (0..lanes.len()).rev().find(|&q| lanes[q] == (d, name));
                let (chain, end) = match q {
                    Some(q) => (
                        reads.binary_search_by(|a| last_step[q].cmp(a)).is_ok(),
                        last_end_ns[q],
                    ),
                    None => (false, 0.0),
                };
                if best.is_none_or(|(c, e, ..)| (chain && !c) || (chain == c && end < e)) {
                    best = Some((chain, end, name, q));
                }
            }
            let (.., name, q) = best.expect("a unit has streams");
            (name, q)
        });
        let (unit, unit_stream) = (unit.map(|u| u.0), unit.and_then(|u| u.1));
        // A stream, or the name of a new one.
        let chosen = match (unit, unit_stream, implied, earliest) {
            (Some(_), Some(q), ..) if stream_ops[q] + ops <= OPS_PER_STREAM => Ok(q),
            (Some(_), Some(q), ..) if mine_on_device >= super::MAX_TASK_STREAMS => Ok(q),
            (Some(u), ..) => Err(u),
            (None, _, Some((_, q)), _) => Ok(q),
            (None, _, None, Some((_, q))) if mine_on_device >= super::MAX_TASK_STREAMS => Ok(q),
            _ => Err(mine_on_device),
        };
        let stream = chosen.unwrap_or_else(|name| {
            lanes.push((d, name));
            stream_ops.push(0);
            position_count.push(0);
            last_end_ns.push(0.0);
            last_step.push(usize::MAX);
            lanes.len() - 1
        });
        stream_ops[stream] += ops;
        position_count[stream] += 1;
        last_end_ns[stream] = placed[t].end;
        let before = std::mem::replace(&mut last_step[stream], s);
        step.stream = stream;
        if clock.len() < lanes.len() {
            clock.resize(lanes.len(), Vec::new());
            fault_clock.resize(lanes.len(), Vec::new());
        }
        let mut mine = std::mem::take(&mut clock[stream]);
        let mut faults = std::mem::take(&mut fault_clock[stream]);
        if scoped[d] {
            // Its stream's earlier steps' faults are not its own: it takes
            // only those of what it reads. (A fault clock counts a prefix
            // of each stream; a scoped stream's entries stay 0, so no wait
            // for a scoped step's fault is ever taken as implied.)
            faults.clear();
        }
        mine.resize(lanes.len(), 0);
        faults.resize(lanes.len(), 0);
        let join = |to: &mut Vec<u32>, from: &[u32]| {
            for (m, &c) in to.iter_mut().zip(from) {
                *m = (*m).max(c);
            }
        };
        // A step that reads the step before it on its stream goes on in
        // that step's fault scope; any other starts one.
        let chained = (before != usize::MAX && reads.binary_search_by(|a| before.cmp(a)).is_ok())
            .then_some(before);
        step.scope = scoped[d] && chained.is_none();
        for j in want {
            let r = steps[j].stream;
            if scoped[d] && Some(j) == chained {
                // Its fault is this step's scope's.
                join(&mut faults, &after_fault[j]);
                continue;
            }
            if scoped[d] && reads.binary_search_by(|a| j.cmp(a)).is_ok() {
                // Its fault, on its own stream too: a wait per step read
                // (one op for several: `Stream::wait_points`).
                step.waits.push(j);
                steps[j].record = true;
                join(&mut faults, &after_fault[j]);
                if r != stream {
                    join(&mut mine, &after_clock[j]);
                }
                continue;
            }
            if r == stream {
                continue;
            }
            // A wait for a step whose output it reads is implied only where
            // its fault is too; one it only follows, wherever its end is.
            if reads.binary_search_by(|a| j.cmp(a)).is_ok() {
                if faults[r] > position[j] {
                    continue;
                }
                step.waits.push(j);
                join(&mut faults, &after_fault[j]);
            } else {
                if mine[r] > position[j] {
                    continue;
                }
                step.orders.push(j);
            }
            steps[j].record = true;
            join(&mut mine, &after_clock[j]);
        }
        position.push(mine[stream]);
        mine[stream] += 1;
        if !scoped[d] {
            faults[stream] += 1;
        }
        after_clock.push(mine.clone());
        after_fault.push(faults.clone());
        clock[stream] = mine;
        fault_clock[stream] = faults;
        steps.push(step);
    }
    // The state after a launch needs the end events of the steps it names,
    // and `wait_tasks` the last step of every stream.
    for (x, dp) in data.iter_mut().enumerate() {
        // Of one stream's readers the last stands for all (stream order;
        // `DataState::add_reader`): only its end is recorded.
        let mut seen: Vec<usize> = Vec::new();
        for i in (0..dp.readers.len()).rev() {
            let q = steps[dp.readers[i]].stream;
            if seen.contains(&q) {
                dp.readers.remove(i);
            } else {
                seen.push(q);
            }
        }
        dp.valid = (0..n_dev)
            .filter_map(|i| valid[x][i].map(|v| (i, v)))
            .collect();
        dp.back = write_back
            && valid[x][dp.start].is_none()
            && !dp.data.is_managed()
            && !dp.data.is_scratch();
        for &(_, v) in &dp.valid {
            if let Source::Step(j) = v {
                steps[j].record = true;
            }
        }
        if let Some(w) = dp.writer {
            steps[w].record = true;
        }
        for &r in &dp.readers {
            steps[r].record = true;
        }
    }
    // Each stream's last step (every stream but a copy lane has one: it was
    // made for one).
    let mut last = vec![usize::MAX; lanes.len()];
    let mut first = vec![usize::MAX; lanes.len()];
    for (j, step) in steps.iter().enumerate() {
        last[step.stream] = j;
        if first[step.stream] == usize::MAX {
            first[step.stream] = j;
        }
    }
    let scoped: Vec<bool> = lanes
        .iter()
        .map(|&(d, l)| l != COPY_LANE && scoped[d])
        .collect();
    for &j in last.iter().filter(|&&j| j != usize::MAX) {
        steps[j].record = true;
        steps[j].tail = true;
    }
    // A launch's faults on a stream are those from its first step's end to
    // its last's (`TaskGraphLaunch::wait`).
    for &j in first.iter().filter(|&&j| j != usize::MAX) {
        steps[j].record = true;
    }
    let streams = Streams::new(rt, &lanes)?;
    // A launch's figures, summed here rather than at every launch.
    let mut per_link: Vec<(usize, usize, u64)> = Vec::new();
    for (a, b, n) in moved {
        match per_link.iter_mut().find(|l| (l.0, l.1) == (a, b)) {
            Some(l) => l.2 += n,
            None => per_link.push((a, b, n)),
        }
    }
    let mut per_device = vec![0u64; n_dev];
    for step in &steps {
        per_device[step.device] += 1;
    }
    let len = |n: usize| u32::try_from(n).expect("a task's lists are shorter than 2^32");
    let (mut ids, mut access) = (Vec::new(), Vec::new());
    let steps: Vec<Step> = steps
        .into_iter()
        .map(|d| {
            let spec = &specs[d.task];
            let step = Step {
                task: d.task,
                device: d.device,
                stream: d.stream,
                kernel: spec.kernel.clone(),
                grid: spec.grid,
                op: spec.op.clone(),
                ids: ids.len(),
                waits: len(d.waits.len()),
                orders: len(d.orders.len()),
                first: len(d.first.len()),
                copies: len(d.copies.len()),
                copy_waits: len(d.copy_waits.len()),
                access: access.len(),
                accesses: len(spec.access.len()),
                after: !spec.after.is_empty(),
                record: d.record,
                scope: d.scope,
                tail: d.tail,
                end_ns: d.end_ns,
            };
            ids.extend(d.waits.iter().chain(&d.orders).chain(&d.first));
            ids.extend(d.copies.iter().flat_map(|&(a, k)| [a, k]));
            ids.extend(&d.copy_waits);
            access.extend(
                spec.access
                    .iter()
                    .enumerate()
                    .map(|(i, (data, mode))| Access {
                        data: data.clone(),
                        writes: mode.writes(),
                        elem: spec.elems.get(i).copied(),
                    }),
            );
            step
        })
        .collect();
    let most_accesses = steps.iter().map(|st| st.accesses as usize).max();
    let most_points = steps
        .iter()
        .map(|st| ((st.waits + st.copy_waits) as usize).max(st.orders as usize))
        .max();
    let (most_accesses, most_points) = (most_accesses.unwrap_or(0), most_points.unwrap_or(0));
    let lazy = data
        .iter()
        .all(|dp| dp.data.slot().is_none() && !dp.data.is_managed() && !dp.back);
    let marks = Arc::new(Marks {
        data: data
            .iter()
            .map(|dp| SettleDatum {
                valid: dp.valid.clone(),
                writer: dp.writer,
                readers: dp.readers.clone(),
                written: dp.written,
            })
            .collect(),
        steps: steps.iter().map(|st| (st.stream, st.end_ns)).collect(),
        copy_lanes: copies.iter().map(|c| c.lane).collect(),
        published: Mutex::default(),
    });
    Ok(Plan {
        live: Mutex::new(Live {
            sets: vec![streams],
            launches: 0,
            touched: HashMap::new(),
            scratch: Scratch::default(),
            spare: View::default(),
        }),
        lanes,
        scoped,
        first,
        last,
        steps,
        ids,
        access,
        data,
        moved: per_link,
        copies,
        per_device,
        most_accesses,
        most_points,
        marks,
        lazy,
    })
}

impl Plan {
    /// Step `step`'s accesses.
    fn accesses(&self, step: &Step) -> &[Access] {
        &self.access[step.access..step.access + step.accesses as usize]
    }
}

impl PlacedTaskGraph {
    /// The device (index in the context) of each task, in recording order.
    pub fn placement(&self) -> &[usize] {
        &self.placement
    }

    /// HEFT's predicted makespan, ns.
    pub fn predicted_makespan_ns(&self) -> f64 {
        self.makespan_ns
    }

    /// Submits every task on its placed device and compute unit's stream,
    /// as planned at instantiate (after the tasks submitted before that
    /// touch its data, as any task; tasks submitted after see its writes).
    /// A task that faults fails the tasks that depend on its data and
    /// nothing else. A task's stream is one of its compute unit's in HEFT's
    /// plan, and each task there starts a fault scope (or goes on in the one
    /// of the task before it, whose output it reads): a fault fails its
    /// task, and the tasks that read its output take it on through their
    /// waits. (On a backend without fault scopes a stream fails all its
    /// work after a fault, so the plan puts a task only on a stream whose
    /// every step it depends on, up to
    /// [`MAX_TASK_STREAMS`](crate::MAX_TASK_STREAMS) streams on a device
    /// (past that, a task shares a stream with steps it does not depend on,
    /// and a fault in one of them reaches it too).) A launch while others are
    /// in flight goes on streams of its own, up to four launches in flight
    /// at once; a fifth goes behind the least recent one on its streams
    /// (where streams fail for good, a fault there reaches its tasks on them
    /// too). A launch does not wait for the launches before it, only, while
    /// five are in flight, for room in the streams it shares.
    pub fn launch(&self) -> Result<TaskGraphLaunch> {
        self.launch_after(&[])
    }

    /// [`launch`](Self::launch), every task of it also after `events`: work
    /// the caller queued on streams, such as writes into a stream graph's
    /// buffers (a placed launch has no stream of its own that would order
    /// it after them). An event of a device outside the context is
    /// [`Error::EventWrongDevice`](crate::Error::EventWrongDevice), an
    /// unrecorded one a typed error; a fault before an event fails the
    /// launch's tasks.
    pub fn launch_after(&self, events: &[Event]) -> Result<TaskGraphLaunch> {
        self.run(None, events, "PlacedTaskGraph::launch")
    }

    /// An empty binding table for the slots of the stream graph this was
    /// placed from ([`Graph::instantiate_on`](crate::Graph::instantiate_on));
    /// a task graph has none.
    pub fn bindings(&self) -> Bindings {
        Bindings::new(self.slots.clone())
    }

    /// [`launch_after`](Self::launch_after) with `bindings`' buffers in the
    /// stream graph's slots. Each slot is task data whose replica on the
    /// graph's device is the buffer bound to it (read there, results written
    /// back there) and whose replicas elsewhere are the placed graph's own,
    /// reused by every launch; a buffer an earlier launch bound to another
    /// slot is used after that launch's last tasks over it. An unbound slot
    /// or bindings of another graph are an [`Error::Graph`](crate::Error::Graph).
    ///
    /// ```
    /// use hetero::{Arg, Context, Device, Graph, Grid, Kernel};
    /// let devices = [Device::host().unwrap(), Device::host().unwrap()];
    /// let ctx = Context::new(&devices).unwrap();
    /// # ctx.set_perfmodel_dir(None); // the doctest writes no model file
    /// let inc = Kernel::new("inc", |b| b.write::<u32>(0).iter_mut().for_each(|v| *v += 1));
    /// let mut g = Graph::new(&devices[0]).unwrap();
    /// let slot = g.slot::<u32>(4).unwrap();
    /// g.kernel(&inc, Grid::new(1), &[Arg::write(&slot)], &[]).unwrap();
    /// let placed = g.instantiate_on(&ctx).unwrap();
    /// assert!(placed.launch().is_err(), "the slot is not bound");
    /// let s = devices[0].create_stream().unwrap();
    /// let (a, b) = (devices[0].alloc::<u32>(4).unwrap(), devices[0].alloc::<u32>(4).unwrap());
    /// s.fill(&a, 10u32).unwrap();
    /// s.fill(&b, 20u32).unwrap();
    /// s.synchronize().unwrap();
    /// let mut bindings = placed.bindings();
    /// for buffer in [&a, &b, &a] {
    ///     bindings.bind(&slot, buffer).unwrap();
    ///     placed.launch_with(&bindings, &[]).unwrap().wait().unwrap();
    /// }
    /// assert_eq!(s.read_to_vec(&a).unwrap(), vec![12; 4]);
    /// assert_eq!(s.read_to_vec(&b).unwrap(), vec![21; 4]);
    /// ```
    pub fn launch_with(&self, bindings: &Bindings, after: &[Event]) -> Result<TaskGraphLaunch> {
        self.run(Some(bindings), after, "PlacedTaskGraph::launch_with")
    }

    fn run(
        &self,
        bindings: Option<&Bindings>,
        events: &[Event],
        op: &'static str,
    ) -> Result<TaskGraphLaunch> {
        let rt = &self.rt;
        let plan = &self.plan;
        let table = table_for(bindings, &self.slots, op, ("placed", "launch_with"))?;
        let bound: Bound<'_> = table.map_or(&[], |t| t.as_slice());
        let address = |k: u32| {
            bound
                .get(k as usize)
                .and_then(Option::as_ref)
                .map_or(0, |h| Arc::as_ptr(h) as usize)
        };
        // The launch is one step in the data's order: an online submission
        // holds the runtime's state while it reads and sets its data's
        // states, so it sees them as before the launch or as after it, never
        // in between (where it missed the launch's writers, ran beside them,
        // and the states after the launch then dropped its write). So the
        // launch holds `live` and then the state from its first pass to its
        // last, and waits for nothing while it holds `live`: what it needs
        // first (room in its rings, the held tasks over its data gone to
        // devices) it waits for with no lock held, then looks again. A
        // kernel or callback that launches or submits meanwhile goes ahead
        // (in virtual time it runs on the thread that waits: had that thread
        // held `live`, a launch from the kernel waited for itself).
        let holds_mine =
            |st: &super::RtState| st.holds_any(plan.data.iter().map(|dp| dp.data.id()));
        let (mut guard, mut books, set) = loop {
            let mut guard = lock(&plan.live);
            let live = &mut *guard;
            // A set with no pending work (`Streams`): the last launch's
            // first (its data may need no pass: `again` below), else any,
            // else a new one, else the least recent, shared.
            let last = (0..live.sets.len()).max_by_key(|&k| live.sets[k].used);
            let idle = last
                .into_iter()
                .chain(0..live.sets.len())
                .find(|&k| live.sets[k].idle());
            let set = match idle {
                Some(k) => k,
                None if live.sets.len() < STREAM_SETS => {
                    live.sets.push(Streams::new(rt, &plan.lanes)?);
                    live.sets.len() - 1
                }
                None => {
                    // Every set busy: the least recent, shared (its
                    // launch's fault then reaches this one's steps on its
                    // streams), once its rings have room for this launch
                    // (waited for with no lock held). Launches do not wait
                    // for each other.
                    let k = (0..live.sets.len())
                        .min_by_key(|&k| live.sets[k].used)
                        .expect("a plan has a set");
                    let set = &live.sets[k];
                    let full = set.streams.iter().zip(&set.timelines).find_map(|(s, t)| {
                        let queued = s.backend_stream().submitted();
                        let room = queued.saturating_sub(PLACED_RING / 2);
                        (room > t.completed()).then(|| (t.clone(), room))
                    });
                    match full {
                        None => k,
                        Some((timeline, room)) => {
                            drop(guard);
                            let what = "room in a placed graph's stream";
                            timeline.wait_for(room, timeline.host_wait, what)?;
                            continue;
                        }
                    }
                }
            };
            live.sets[set].replace_failed(rt, &plan.lanes, &plan.scoped)?;
            // Tasks work stealing holds back over the plan's data go to
            // devices first: the launch comes after them in the data's order.
            let books = lock(&rt.state);
            if holds_mine(&books) {
                drop(books);
                drop(guard);
                rt.pump_until(|| !holds_mine(&lock(&rt.state)))?;
                continue;
            }
            break (guard, books, set);
        };
        let live = &mut *guard;
        live.launches += 1;
        let Streams {
            streams,
            timelines,
            tail_spans,
            used,
        } = &mut live.sets[set];
        *used = live.launches;
        let (streams, timelines) = (&*streams, &*timelines);
        // Again after a launch whose every stream completed without a fault
        // and whose data nobody touched since (each still marked, `Marks`):
        // nothing the launch must follow, and nothing to set per datum.
        let again = plan.lazy && {
            let p = lock(&plan.marks.published);
            let v = &p.view;
            !p.dirty
                && v.ends.len() == plan.steps.len()
                && plan.last.iter().enumerate().all(|(q, &j)| {
                    j == usize::MAX
                        || v.ends[j].is_some_and(|value| {
                            let from = v.ends[plan.first[q]].unwrap_or(value);
                            Arc::ptr_eq(&v.timelines[q], &timelines[q])
                                && timelines[q].is_reached(value)
                                && timelines[q].error_in(from, value).is_none()
                        })
                })
        };
        // Where each step starts a fault scope, a fault of `events` must
        // reach every step, not only each stream's first: their points join
        // each such step's waits too.
        let mut after_points: Vec<(Arc<Timeline>, u64)> = Vec::new();
        for e in events.iter().filter(|e| !e.completed_ok()) {
            for s in streams.iter() {
                s.wait_event(e)?;
            }
            let capture = |t: &Arc<Timeline>| crate::api::graph::capture::is_capture_timeline(t);
            if let Some(p) = e.point.as_ref().filter(|p| !capture(&p.timeline)) {
                after_points.push((p.timeline.clone(), p.value));
            }
        }
        // The lists are empty (a launch clears them at its end, or failed
        // before it filled them: cleared here too).
        live.scratch.clear();
        let Scratch {
            tail_events,
            pre,
            pre_at,
            backs,
            fixes,
        } = &mut live.scratch;
        let spare = &mut live.spare;
        spare.reset(plan);
        let View {
            ends,
            copy_ends,
            start_valid,
            ..
        } = spare;
        if again {
            // What the last launch left, complete: in place where it left
            // the start replica valid, else brought back to it first (as
            // below, from the replica the least time away).
            for dp in &plan.data {
                let to = dp.start;
                let ev = if dp.valid.iter().any(|&(k, _)| k == to) {
                    Event::new()
                } else {
                    let ends = dp.valid.iter().map(|&(k, _)| k);
                    let (from, _) = rt.cheapest_of(ends, to, dp.data.bytes() as u64);
                    let ev = bring_back(rt, &mut books, dp, from, None, bound, fixes)?;
                    pre.push((ev.clone(), true));
                    ev
                };
                pre_at.push(pre.len());
                start_valid.push(Some(ev));
            }
        }
        // What each datum waits for, and its start replica's event: the
        // launch orders after the tasks before it through these.
        for (x, dp) in plan.data.iter().enumerate().filter(|_| !again) {
            prefetch_datum(&plan.data, x + PREFETCH_DATA);
            let st = super::data::settled(dp.data.state());
            // An event already complete without a fault orders nothing:
            // looked at once here (before any clone) rather than by every
            // step that waits.
            let pending = |e: &&Event| !e.completed_ok();
            let kind = |data: bool| move |e: &Event| (e.clone(), data);
            let writer = st.writer.iter().map(|w| &w.end).filter(pending);
            pre.extend(writer.map(kind(true)));
            // Its readers, where the launch writes it: also a slot's (the
            // launch's copies of the buffer bound now overwrite the
            // replicas elsewhere that the launches before read).
            if dp.written || dp.data.slot().is_some() {
                let readers = st.readers.iter().map(|r| &r.end).filter(pending);
                pre.extend(readers.map(kind(false)));
            }
            let ev = match st.valid.get(dp.start) {
                // A managed buffer: nothing to bring back.
                None => Event::new(),
                Some(Some(e)) => e.clone(),
                Some(None) => {
                    // Moved since instantiate: bring it back to the start
                    // replica first (rare: a task outside wrote it elsewhere).
                    let bytes = dp.data.bytes() as u64;
                    let (from, _) = rt.cheapest_source(&st.valid, dp.start, bytes);
                    let from_ev = st.valid[from].clone();
                    drop(st);
                    let after = from_ev.filter(|e| e.is_recorded() && !e.completed_ok());
                    // Its fault, if it has one, is the readers' (the copy
                    // only follows it).
                    pre.extend(after.iter().map(kind(true)));
                    bring_back(rt, &mut books, dp, from, after.as_ref(), bound, fixes)?
                }
            };
            if ev.is_recorded() && !ev.completed_ok() {
                pre.push((ev.clone(), true));
            }
            // A slot's buffer that a launch before touched through any slot
            // (its data's state orders only the tasks over this slot): after
            // those tasks too (their faults taken on: they may have written
            // it).
            let touched = dp.data.slot().and_then(|k| live.touched.get(&address(k)));
            pre.extend(
                touched
                    .into_iter()
                    .flatten()
                    .filter(pending)
                    .map(kind(true)),
            );
            pre_at.push(pre.len());
            start_valid.push(Some(ev));
        }
        tail_events.resize(streams.len(), None);
        // (Sized for every step: nothing grows while the launch goes.)
        let mut args: Vec<crate::Arg<'_>> = Vec::with_capacity(plan.most_accesses);
        let mut points = Vec::with_capacity(plan.most_points);
        for (s, step) in plan.steps.iter().enumerate() {
            let stream = &streams[step.stream];
            // Each prefetch reads only lines the one before brought in.
            if let Some(next) = plan.steps.get(s + 3 * PREFETCH_STEPS) {
                streams[next.stream].prefetch_handle();
            }
            if let Some(next) = plan.steps.get(s + 2 * PREFETCH_STEPS) {
                streams[next.stream].prefetch_queue();
            }
            if let Some(next) = plan.steps.get(s + PREFETCH_STEPS) {
                streams[next.stream].prefetch_submit(PREFETCH_OPS);
            }
            let (waits, orders) = (step.waits as usize, step.orders as usize);
            let (first, copies) = (step.first as usize, 2 * step.copies as usize);
            let n = waits + orders + first + copies + step.copy_waits as usize;
            let ids = &plan.ids[step.ids..step.ids + n];
            let (waits, rest) = ids.split_at(waits);
            let (orders, rest) = rest.split_at(orders);
            let (first, rest) = rest.split_at(first);
            let (copies, copy_waits) = rest.split_at(copies);
            let access = plan.accesses(step);
            // (The plan's own streams: `wait_points`' checks hold.)
            let at = |&j: &usize| {
                let value = ends[j].expect("a waited step records its end");
                (&timelines[plan.steps[j].stream], value)
            };
            // Its copies first, each on its lane after its source's maker
            // (memory waits: see `CopyPlan`).
            for c in copies.chunks_exact(2) {
                let (a, k) = (c[0], c[1]);
                let cp = &plan.copies[k];
                let lane = &streams[cp.lane];
                let x = cp.data;
                let after = match cp.src {
                    // The start replica's event (it follows the datum's
                    // last writer), and for a slot's buffer what else
                    // touched it.
                    Source::Start if plan.data[x].data.slot().is_some() => {
                        let from = if x == 0 { 0 } else { pre_at[x - 1] };
                        for (e, _) in &pre[from..pre_at[x]] {
                            lane.order_after(e)?;
                        }
                        None
                    }
                    Source::Start => {
                        if let Some(e) = start_valid[x].as_ref().filter(|e| e.is_recorded()) {
                            lane.order_after(e)?;
                        }
                        None
                    }
                    Source::Step(j) => Some(at(&j)),
                    Source::Copy(k) => {
                        let value = copy_ends[k].expect("an earlier step's copy");
                        Some((&timelines[plan.copies[k].lane], value))
                    }
                };
                // Over a direct path: the plan checked what a peer copy
                // checks (devices of the context, whole replicas, the
                // path), one op from the replicas' storages.
                let data = &access[a].data;
                let ends = (data.storage(cp.from, bound), data.storage(cp.to, bound));
                match ends {
                    (Some(src), Some(dst)) if cp.direct && src.bytes() != 0 => {
                        lane.peer_direct((src, 0), (dst, 0), src.bytes(), after)?;
                    }
                    _ => data.copy(lane, cp.from, cp.to, after, bound)?,
                }
                copy_ends[k] = Some(lane.backend_stream().submitted());
            }
            if step.scope {
                stream.start_fault_scope();
            }
            points.clear();
            points.extend(waits.iter().map(at));
            if step.scope {
                points.extend(after_points.iter().map(|(t, v)| (t, *v)));
            }
            points.extend(copy_waits.iter().map(|&k| {
                let value = copy_ends[k].expect("an earlier or this step's copy");
                (&timelines[plan.copies[k].lane], value)
            }));
            stream.wait_points(&points)?;
            if !orders.is_empty() {
                points.clear();
                points.extend(orders.iter().map(at));
                stream.order_points(&points)?;
            }
            for &v in first {
                let (x, reads) = (v / 2, v % 2 == 1);
                let from = if x == 0 { 0 } else { pre_at[x - 1] };
                for (e, data) in &pre[from..pre_at[x]] {
                    if *data && reads {
                        stream.wait_event(e)?;
                    } else {
                        stream.order_after(e)?;
                    }
                }
            }
            if step.after {
                for e in &self.specs[step.task].after {
                    stream.wait_event(e)?;
                }
            }
            args.clear();
            args.extend(access.iter().map(|a| {
                let mut arg = a.data.arg(step.device, a.writes, bound);
                if let Some(elem) = a.elem {
                    arg.elem = elem;
                }
                arg
            }));
            // A step others wait for or the state names: the point its
            // launch reaches (no record op after it), stamped where the
            // caller gets it.
            let tail = match (&step.op, step.record) {
                (None, false) => {
                    stream.launch(&step.kernel, step.grid, &args)?;
                    None
                }
                (None, true) if !step.tail => {
                    ends[s] = Some(stream.launch_point(&step.kernel, step.grid, &args)?);
                    None
                }
                (None, true) => {
                    let kept = &mut tail_spans[step.stream];
                    let span = match kept.take() {
                        Some(mut span) => match Arc::get_mut(&mut span) {
                            Some(only) => {
                                only.reset();
                                span
                            }
                            None => Arc::default(),
                        },
                        None => Arc::default(),
                    };
                    *kept = Some(span.clone());
                    Some(stream.launch_marked(&step.kernel, step.grid, &args, span)?)
                }
                (Some(op), record) => {
                    op.run(stream, &args)?;
                    record.then(|| stream.record_event()).transpose()?
                }
            };
            if let Some(e) = tail {
                ends[s] = Some(e.point_any("launch")?.value);
                if step.tail {
                    tail_events[step.stream] = Some(e);
                }
            }
        }
        drop(args);
        // Copies back into the start replicas (stream graphs: the user's
        // buffers hold the results).
        backs.resize(plan.data.len(), None);
        for (x, dp) in plan.data.iter().enumerate().filter(|(_, dp)| dp.back) {
            let w = dp.writer.expect("a written datum has a writer");
            let step = &plan.steps[w];
            let stream = &streams[step.stream];
            if plan.scoped[step.stream] {
                // After the stream's last step, in a scope of its own that
                // takes its writer's fault (the last step's is not it).
                stream.start_fault_scope();
                let value = ends[w].expect("a datum's last writer records");
                stream.wait_points(&[(&timelines[step.stream], value)])?;
            }
            dp.data.copy(stream, step.device, dp.start, None, bound)?;
            fixes.push((step.device, dp.start, dp.data.bytes() as u64));
            backs[x] = Some(stream.record_event()?);
        }
        // Per stream with steps: the value from which its faults are the
        // launch's (its first step's end; a tail's own fault is only its
        // step's where the stream has fault scopes).
        let mut from: Vec<u64> = plan
            .first
            .iter()
            .filter(|&&j| j != usize::MAX)
            .map(|&j| ends[j].expect("a stream's first step records"))
            .collect();
        // The data's state after the launch, and the runtime's books.
        let t0 = rt.now_ns();
        let base = books.next_task;
        books.next_task += (plan.steps.len() + plan.data.len()) as u64;
        spare.base = base;
        spare.t0 = t0;
        spare.timelines.clone_from(timelines);
        let mut touched: Vec<(usize, Vec<Event>)> = Vec::new();
        if plan.lazy {
            // Published first: a datum marked is never settled with the
            // launch before this one.
            let settled_meanwhile = {
                let mut p = lock(&plan.marks.published);
                std::mem::swap(&mut p.view, spare);
                std::mem::replace(&mut p.dirty, false)
            };
            // Launched again with every datum still marked: marked again
            // only where one was settled while this launch went.
            let mark_all = !again || settled_meanwhile;
            for (x, dp) in plan.data.iter().enumerate().filter(|_| mark_all) {
                prefetch_datum(&plan.data, x + PREFETCH_DATA);
                let mut ds = lock(dp.data.state());
                if !ds.mark.as_ref().is_some_and(|m| m.is_of(&plan.marks)) {
                    // (Another graph's mark cannot be here: its launch
                    // would have settled this graph's, and this launch
                    // then not been `again`; nor go on while this one holds
                    // the runtime's state.)
                    debug_assert!(ds.mark.is_none(), "another graph's mark");
                    ds.mark = Some(Mark {
                        marks: plan.marks.clone(),
                        x,
                    });
                }
            }
        } else {
            for (x, dp) in plan.data.iter().enumerate() {
                prefetch_datum(&plan.data, x + PREFETCH_DATA);
                let mut ds = super::data::settled(dp.data.state());
                plan.marks.apply(spare, x, &mut ds);
                if let Some(e) = &backs[x] {
                    // The copy back reads the writer's replica: a reader.
                    ds.valid[dp.start] = Some(e.unstamped());
                    ds.readers.push(TaskRef {
                        id: base + (plan.steps.len() + x) as u64,
                        end: e.unstamped(),
                        end_ns: t0 + plan.steps[dp.writer.expect("written")].end_ns,
                        stream: None,
                    });
                }
                if let Some(k) = dp.data.slot() {
                    // (The copy back, which writes the bound buffer, among
                    // them.)
                    let last = ds.writer.iter().chain(&ds.readers);
                    touched.push((address(k), last.map(|t| t.end.clone()).collect()));
                }
            }
        }
        let mut tails = Vec::with_capacity(plan.lanes.len());
        for ((&(d, _), &j), tail) in plan
            .lanes
            .iter()
            .zip(&plan.last)
            .zip(tail_events.iter_mut())
        {
            if j == usize::MAX {
                // A copy lane: each copy is waited for by its step.
                continue;
            }
            tails.push(tail.take().expect("a stream's last step records"));
            // dmda's view of the device: this compute unit is busy until the
            // plan's end of its last task.
            let free = &mut books.free[d];
            let lane = crate::exec::sched::argmin(free, |&t| t);
            free[lane] = free[lane].max(t0 + plan.steps[j].end_ns);
        }
        for e in backs.iter().flatten() {
            tails.push(e.clone());
            from.push(u64::MAX);
        }
        books
            .graph_tails
            .extend(tails.iter().cloned().zip(from.iter().copied()));
        let mut sc = lock(&rt.sched);
        let stats = &mut sc.stats;
        stats.tasks += plan.steps.len() as u64;
        if stats.per_device.len() < rt.devices.len() {
            stats.per_device.resize(rt.devices.len(), 0);
        }
        for (count, &n) in stats.per_device.iter_mut().zip(&plan.per_device) {
            *count += n;
        }
        for &(a, b, n) in plan.moved.iter().chain(fixes.iter()) {
            super::record_link(hetero_trace::LinkRecord::GRAPH_LAUNCH, a, b, n);
            stats.bytes_moved += n;
            stats.add_link(a, b, n);
        }
        drop(sc);
        drop(books);
        live.scratch.clear();
        live.touched
            .retain(|_, evs| evs.iter().any(|e| !e.completed_ok()));
        live.touched.extend(touched);
        drop(guard);
        rt.keep_alive();
        Ok(TaskGraphLaunch {
            rt: Arc::downgrade(rt),
            events: tails,
            from,
            // Each task's step runs on its placed device.
            devices: Arc::clone(&self.placement),
        })
    }
}

impl TaskBuilder<'_> {
    /// Records the task into `graph` instead of submitting it; its index
    /// in the graph.
    pub fn record(self, graph: &mut TaskGraph) -> Result<usize> {
        if let Some(e) = self.error {
            return Err(e);
        }
        // What a launch would refuse, refused here: a launch then never
        // stops part way for it.
        let kernel = self.spec.kernel.inner.name;
        if self.spec.grid.blocks == 0 {
            return Err(crate::Error::EmptyGrid { kernel });
        }
        if self.spec.access.len() > crate::MAX_KERNEL_ARGS {
            return Err(crate::Error::TooManyArgs {
                kernel,
                count: self.spec.access.len(),
                max: crate::MAX_KERNEL_ARGS,
            });
        }
        let rt = match self.rt {
            Some(rt) => rt,
            None => self.ctx.task_runtime()?,
        };
        match &graph.rt {
            Some(g) if !Arc::ptr_eq(g, &rt) => {
                return Err(crate::Error::DeviceContext {
                    op: "TaskBuilder::record",
                    detail: "the graph holds tasks of another context".into(),
                })
            }
            Some(_) => {}
            None => graph.rt = Some(rt.clone()),
        }
        if let Some(f) = self.spec.on {
            rt.check_bound(&self.spec, f)?;
        }
        graph.specs.push(self.spec);
        Ok(graph.specs.len() - 1)
    }
}
