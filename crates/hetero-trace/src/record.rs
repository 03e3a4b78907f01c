//! The record types: what one operation or one memory event looked like.

use std::collections::BTreeMap;

/// What an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// Host to device copy.
    H2D,
    /// Device to host copy.
    D2H,
    /// Device to device copy.
    D2D,
    /// Memory fill (memset).
    Fill,
    /// A kernel on a compute engine.
    Kernel,
    /// A host callback run in stream order.
    HostFn,
    /// A wait on another stream's timeline (see [`OpRecord::dep`]).
    Wait,
    /// An event record or other zero-work marker.
    Record,
    /// A launch of an executable graph; its nodes are records of their own
    /// kinds with [`OpRecord::node`] set (same stream and `seq`).
    Graph,
}

impl OpKind {
    /// Every kind, in display order.
    pub const ALL: [OpKind; 9] = [
        OpKind::H2D,
        OpKind::D2H,
        OpKind::D2D,
        OpKind::Fill,
        OpKind::Kernel,
        OpKind::HostFn,
        OpKind::Wait,
        OpKind::Record,
        OpKind::Graph,
    ];

    /// Short display name ("H2D", "Kernel", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::H2D => "H2D",
            OpKind::D2H => "D2H",
            OpKind::D2D => "D2D",
            OpKind::Fill => "Fill",
            OpKind::Kernel => "Kernel",
            OpKind::HostFn => "HostFn",
            OpKind::Wait => "Wait",
            OpKind::Record => "Record",
            OpKind::Graph => "Graph",
        }
    }
}

/// Which kind of engine executed an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EngineKind {
    /// A compute unit (on the host device: a worker thread).
    Compute,
    /// A host-to-device copy engine.
    CopyH2D,
    /// A device-to-host copy engine.
    CopyD2H,
    /// A device-to-device copy engine.
    CopyD2D,
    /// The host itself: callbacks, markers, waits.
    Host,
}

impl EngineKind {
    /// Short display name ("Compute", "Copy H2D", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Compute => "Compute",
            EngineKind::CopyH2D => "Copy H2D",
            EngineKind::CopyD2H => "Copy D2H",
            EngineKind::CopyD2D => "Copy D2D",
            EngineKind::Host => "Host",
        }
    }

    /// True for the three copy engines.
    pub fn is_copy(self) -> bool {
        matches!(
            self,
            EngineKind::CopyH2D | EngineKind::CopyD2H | EngineKind::CopyD2D
        )
    }
}

/// One executed operation. Timestamps come from [`crate::now_ns`], or from the
/// device's clock where [`Trace::clock`] says so.
#[derive(Clone, Copy, Debug)]
pub struct OpRecord {
    /// What it did.
    pub kind: OpKind,
    /// Kernel or operation name, shown on the slice.
    pub name: &'static str,
    /// The stream it was submitted on.
    pub stream: u64,
    /// The hardware queue the stream was mapped onto.
    pub queue: u32,
    /// The kind of engine that executed it.
    pub engine: EngineKind,
    /// Which engine of that kind (for instance the worker index).
    pub engine_index: u32,
    /// The op's value on its stream's timeline (reached when it completed).
    pub seq: u64,
    /// When it was submitted.
    pub submit_ns: u64,
    /// When the engine started it.
    pub start_ns: u64,
    /// When it completed.
    pub end_ns: u64,
    /// Bytes moved or written (0 for kernels unless known).
    pub bytes: u64,
    /// For [`OpKind::Wait`], and a copy that waits before it starts: the
    /// (stream, timeline value) waited on.
    pub dep: Option<(u64, u64)>,
    /// True if it completed with an error.
    pub failed: bool,
    /// Set on a node of a graph launch: which graph, node and lane. Its
    /// `stream` and `seq` are the launch's, so it nests under it.
    pub node: Option<NodeRef>,
}

/// A graph node's place, on an [`OpRecord`] of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeRef {
    /// The graph (as in [`Trace::graphs`]).
    pub graph: u32,
    /// The node, in recording order.
    pub node: u32,
    /// The lane the plan assigned the node's chain to.
    pub lane: u32,
}

/// What instantiate planned for a graph, for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphPlan {
    /// Nodes.
    pub nodes: u64,
    /// Edges a launch keeps (each lane's chain, the forks and joins between lanes).
    pub edges: u64,
    /// Linear chains.
    pub chains: u64,
    /// Lanes the chains were assigned to.
    pub lanes: u64,
    /// Nodes on the longest dependency path.
    pub critical_path: u64,
    /// Most nodes on one dependency level.
    pub width: u64,
    /// Bytes of the buffers allocated inside the graph, each on its own.
    pub internal_bytes: u64,
    /// The arena the memory plan placed them in.
    pub arena_bytes: u64,
}

impl OpRecord {
    /// `end_ns - start_ns`, zero if the clock readings are out of order.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// What happened in the memory pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemKind {
    /// A buffer was allocated.
    Alloc,
    /// A buffer was freed.
    Free,
    /// A chunk was mapped from the OS.
    ChunkMap,
    /// A chunk was returned to the OS.
    ChunkUnmap,
}

impl MemKind {
    /// Short display name.
    pub fn as_str(self) -> &'static str {
        match self {
            MemKind::Alloc => "alloc",
            MemKind::Free => "free",
            MemKind::ChunkMap => "chunk map",
            MemKind::ChunkUnmap => "chunk unmap",
        }
    }
}

/// One memory pool event, with the pool's totals right after it.
#[derive(Clone, Copy, Debug)]
pub struct MemRecord {
    /// What happened.
    pub kind: MemKind,
    /// When, from [`crate::now_ns`].
    pub ts_ns: u64,
    /// Bytes of this event.
    pub bytes: u64,
    /// The stream the allocation is ordered on (0 if none).
    pub stream: u64,
    /// Bytes reserved from the OS after the event.
    pub reserved: u64,
    /// Bytes handed out to users after the event.
    pub allocated: u64,
}

/// Which clock a trace's timestamps are on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TraceClock {
    /// Real time: the host's monotonic wall clock ([`crate::now_ns`]), or a
    /// device clock that runs with it. The default.
    #[default]
    Wall,
    /// A device's modelled clock (an emulated device in virtual time): it
    /// jumps from one modelled completion to the next, so its durations are
    /// the models' and bear no relation to how long the host took.
    Virtual,
}

impl TraceClock {
    /// Short name, as in JSON: "wall" or "virtual".
    pub fn as_str(self) -> &'static str {
        match self {
            TraceClock::Wall => "wall",
            TraceClock::Virtual => "virtual",
        }
    }
}

/// Everything recorded since the last [`crate::take`].
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Operations, sorted by `start_ns` (then `end_ns`).
    pub ops: Vec<OpRecord>,
    /// Memory events, sorted by `ts_ns`.
    pub mem: Vec<MemRecord>,
    /// The device's name, from [`crate::set_device_name`] (empty if unset).
    pub device_name: String,
    /// The clock the timestamps are on, from [`crate::set_clock`] (the host's
    /// wall clock if unset).
    pub clock: TraceClock,
    /// Stream names from [`crate::set_stream_name`].
    pub stream_names: BTreeMap<u64, String>,
    /// Plans of the graphs launched while recording, from [`crate::set_graph_plan`].
    pub graphs: BTreeMap<u32, GraphPlan>,
    /// I/O TLB lookups per copy engine while recording, from
    /// [`crate::record_iotlb`] (a device behind an IOMMU), by engine.
    pub iotlb: Vec<IotlbRecord>,
    /// Managed-memory migrations while recording, from
    /// [`crate::record_migration`], in the order they were submitted.
    pub migrations: Vec<MigrationRecord>,
    /// Tasks of a context's task layer seen complete while recording, from
    /// [`crate::record_task`], in the order they were seen.
    pub tasks: Vec<TaskRecord>,
    /// Bytes a context's task layer copied between memories for its tasks
    /// while recording, from [`crate::record_link`], in the order placed.
    pub links: Vec<LinkRecord>,
    /// Records dropped because the recorder held its bound
    /// ([`crate::set_max_records`]); zero when the trace is whole.
    pub dropped: u64,
}

/// One task of a context's task layer, seen complete: the device its policy
/// chose, what the performance model predicted and what it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    /// The kernel's name.
    pub kernel: &'static str,
    /// The device's index in its context.
    pub device: u32,
    /// Its start and end, on the device's clock (as its ops' records).
    pub start_ns: u64,
    pub end_ns: u64,
    /// The history model's prediction on that device (`None`: not trusted yet).
    pub predicted_ns: Option<u64>,
    /// The time observed (start to end, less a wait for a compute unit).
    pub measured_ns: u64,
}

/// Bytes the task layer copied over one link for one task (or for one
/// launch of a placed graph): a replica brought to the device the task went
/// to, or a managed buffer's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkRecord {
    /// The task's kernel; a placed graph's launch records its plan's copies
    /// under [`LinkRecord::GRAPH_LAUNCH`].
    pub kernel: &'static str,
    /// From and to which memory, by device index in the context; the
    /// host's copy of a managed buffer, in a context whose devices all have
    /// memory of their own, is one past the last device.
    pub from: u32,
    pub to: u32,
    pub bytes: u64,
}

impl LinkRecord {
    /// The kernel name of a placed graph launch's copies.
    pub const GRAPH_LAUNCH: &'static str = "(placed graph launch)";
}

/// Why managed pages moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MigrationReason {
    /// A kernel or copy declared it reads or writes them (made resident before
    /// it starts).
    Declared,
    /// A host read or write guard needed them on the host.
    HostAccess,
    /// A host touch of a buffer's host view faulted on them.
    HostFault,
    /// An explicit prefetch.
    Prefetch,
    /// Evicted to make room on a device past its capacity (a dirty page is
    /// copied back once; a clean one moves no bytes).
    Eviction,
}

impl MigrationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationReason::Declared => "declared",
            MigrationReason::HostAccess => "host access",
            MigrationReason::HostFault => "host fault",
            MigrationReason::Prefetch => "prefetch",
            MigrationReason::Eviction => "eviction",
        }
    }
}

/// One managed-memory migration: a run of pages of one buffer moved between
/// memories (a clean eviction moves no bytes: `bytes` is 0, `pages` counts it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrationRecord {
    /// When it was submitted, from [`crate::now_ns`].
    pub ts_ns: u64,
    /// The stream its copy is ordered on (0: none, a clean eviction).
    pub stream: u64,
    /// The managed buffer's id.
    pub buffer: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Pages moved (or dropped, for a clean eviction).
    pub pages: u32,
    /// Towards the host (else towards the device).
    pub to_host: bool,
    pub reason: MigrationReason,
}

/// I/O TLB lookups one copy engine made: the pages of host memory its DMAs
/// translated, found in the TLB (`hits`) or walked (`misses`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IotlbRecord {
    pub engine: EngineKind,
    pub engine_index: u32,
    pub hits: u64,
    pub misses: u64,
}

impl Trace {
    /// Sorts ops by start (then end) and mem events by time. [`crate::take`]
    /// returns a sorted trace; call this after building one by hand.
    pub fn sort(&mut self) {
        self.ops.sort_by_key(|op| (op.start_ns, op.end_ns));
        self.mem.sort_by_key(|m| m.ts_ns);
    }

    /// The display name of a stream: its given name or "stream N".
    pub fn stream_label(&self, stream: u64) -> String {
        match self.stream_names.get(&stream) {
            Some(name) => format!("stream {stream} ({name})"),
            None => format!("stream {stream}"),
        }
    }
}
