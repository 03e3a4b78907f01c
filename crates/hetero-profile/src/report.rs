//! The report: what each engine did, how fast the copies went, how long ops
//! waited and ran, and where engines sat idle. Built from a [`Trace`] alone
//! (plus optional allocator stats and link peak), rendered as JSON or Markdown.
//!
//! Definitions (also in the Markdown): the *window* runs from the first op's
//! start to the last op's end; an engine's *busy* time is the union of its
//! ops' [start, end) intervals, so overlapping ops count once and
//! utilization never exceeds 1; *bandwidth* is bytes over busy time (the rate
//! while copying, 1 GB/s = 10^9 bytes/s); *idle gaps* are the holes between an
//! engine's first and last op.
//!
//! Time is the trace's clock (`Trace::clock`): the host's wall time, or a
//! device's virtual time, where the report says "device time" (JSON `clock`:
//! "wall" or "virtual"; `wall_ns` keeps its name either way). An engine's
//! bandwidth is compared with the link's peak only where its copies cross the
//! link (the H2D and D2H engines): on-device copies and fills run on the D2D
//! engine and never touch it.
//!
//! Graph launches (see `graphs.rs`): the op count, streams, latency and the
//! longest ops count a launch as one op and none of its nodes; engines and
//! idle gaps count the nodes an engine ran and not the launch containing
//! them. So no time or byte is counted twice in any total, and the Graphs
//! section shows what happened inside the launches.

use std::collections::BTreeMap;

use hetero_trace::{EngineKind, MemKind, OpKind, OpRecord, Trace, TraceClock};
use serde::{Deserialize, Serialize};

use crate::graphs::{self, GraphUsage, Roles};
use crate::stats::{busy, merge, percentiles, span, Percentiles};

/// What the caller knows beyond the trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportOptions {
    /// How many of the longest ops to list.
    pub top_n: usize,
    /// How many idle gaps to list per engine (the largest).
    pub max_gaps: usize,
    /// The link's peak in GB/s (10^9 bytes/s) where the device has a link
    /// model; the H2D and D2H engines are compared with it.
    pub link_peak_gbps: Option<f64>,
    /// The memory pool's counters, if a pool was used.
    pub allocator: Option<AllocatorStats>,
}

impl Default for ReportOptions {
    fn default() -> Self {
        Self {
            top_n: 10,
            max_gaps: 5,
            link_peak_gbps: None,
            allocator: None,
        }
    }
}

/// The memory pool's counters, passed in by whoever owns the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorStats {
    /// Allocations served from the block cache.
    pub cache_hits: u64,
    /// Allocations that needed a new block or chunk.
    pub cache_misses: u64,
    /// Fragmentation as the pool defines it, in 0..=1 (0: none).
    pub fragmentation: f64,
    /// Bytes reserved from the OS.
    pub reserved_bytes: u64,
    /// Bytes handed out to users.
    pub allocated_bytes: u64,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The device's name from the trace.
    pub device_name: String,
    /// First op start, in trace ns.
    pub window_start_ns: u64,
    /// Last op end, in trace ns.
    pub window_end_ns: u64,
    /// `window_end_ns - window_start_ns`, on the trace's clock (device time
    /// where `clock` is "virtual"; the name stays for existing readers).
    pub wall_ns: u64,
    /// The clock the times are on: "wall" (the host's) or "virtual" (a
    /// device's modelled clock), from the trace. Absent in older reports:
    /// "wall".
    #[serde(default = "wall_clock")]
    pub clock: String,
    /// Number of ops submitted: a graph launch counts once, its nodes not.
    pub ops: u64,
    /// Of those, ops that completed with an error.
    pub failed_ops: u64,
    /// Records the recorder dropped past its bound (`Trace::dropped`): the
    /// report covers the rest. Absent in older reports: 0.
    #[serde(default)]
    pub dropped_records: u64,
    /// Node records of graph launches (not in `ops`).
    pub graph_nodes: u64,
    /// The link peak the H2D and D2H bandwidths are compared with, if given.
    pub link_peak_gbps: Option<f64>,
    /// One entry per engine used, in (kind, index) order: graph nodes
    /// counted, the launches that contain them not.
    pub engines: Vec<EngineUsage>,
    /// One entry per stream used, by id: launches counted, their nodes not.
    pub streams: Vec<StreamUsage>,
    /// Latency per kind of op present, in [`OpKind::ALL`] order: launches
    /// under Graph, their nodes not (the Graphs section has them by kind).
    pub latency: Vec<KindLatency>,
    /// The longest ops (waits and markers excluded), longest first: launches,
    /// not their nodes.
    pub longest_ops: Vec<OpSummary>,
    /// The largest idle gaps of each engine (as `engines` counts its work).
    pub idle_gaps: Vec<EngineGaps>,
    /// Per graph launched, by id: its plan, launches and nodes.
    pub graphs: Vec<GraphUsage>,
    /// Graph launches that recorded no node (in no entry of `graphs`; counted
    /// as work by `engines`).
    pub launches_without_nodes: u64,
    /// Pool events in the trace, if any.
    pub memory: Option<MemorySummary>,
    /// The pool's counters, if given.
    pub allocator: Option<AllocatorReport>,
    /// I/O TLB lookups per copy engine (a device behind an IOMMU).
    #[serde(default)]
    pub iotlb: Vec<IotlbUsage>,
    /// Managed-memory migrations, summed per reason and direction.
    #[serde(default)]
    pub migrations: Vec<MigrationSum>,
    /// Tasks of a context's task layer, summed per kernel and device.
    #[serde(default)]
    pub tasks: Vec<TaskSum>,
    /// Bytes the task layer copied for its tasks, per link.
    #[serde(default)]
    pub links: Vec<LinkSum>,
}

/// What the task layer copied over one link (between two memories of a
/// context, by device index; see [`hetero_trace::LinkRecord`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkSum {
    pub from: u32,
    pub to: u32,
    pub bytes: u64,
}

/// The tasks of one kernel that ran on one device of a context: how many, the
/// time they took, and how far the model's predictions were off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskSum {
    pub kernel: String,
    /// The device's index in its context.
    pub device: u32,
    pub tasks: u64,
    /// Their measured time, summed.
    pub measured_ns: u64,
    /// Tasks that had a prediction (a trusted model).
    pub predicted: u64,
    /// Mean of |predicted - measured| / measured over those.
    pub mean_relative_error: f64,
}

/// The managed-memory migrations of one reason and direction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MigrationSum {
    /// "declared", "host access", "prefetch" or "eviction".
    pub reason: String,
    /// Towards the host (else towards the device).
    pub to_host: bool,
    /// Runs of pages moved (one copy each, or none for clean evictions).
    pub runs: u64,
    pub pages: u64,
    pub bytes: u64,
}

/// One copy engine's I/O TLB lookups: pages of host memory its DMAs translated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IotlbUsage {
    /// Display name, e.g. "Copy H2D 0".
    pub engine: String,
    pub hits: u64,
    pub misses: u64,
    /// Hits over lookups.
    pub hit_rate: f64,
}

/// What one engine did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineUsage {
    /// Display name, e.g. "Copy H2D 0".
    pub engine: String,
    /// Engine kind, e.g. "Copy H2D".
    pub kind: String,
    /// Index among engines of that kind.
    pub index: u32,
    /// Ops it ran (graph nodes, not their launches).
    pub ops: u64,
    /// Union of its ops' intervals.
    pub busy_ns: u64,
    /// `busy_ns / wall_ns` (0 when the window is empty).
    pub utilization: f64,
    /// Bytes its ops moved or wrote.
    pub bytes: u64,
    /// Copy engines: bytes / busy time in GB/s (None if never busy).
    pub bandwidth_gbps: Option<f64>,
    /// `bandwidth_gbps / link_peak_gbps` when both are known and the engine's
    /// copies cross the link (H2D, D2H); None for the D2D engine (on-device
    /// copies and fills).
    pub peak_fraction: Option<f64>,
}

/// What one stream did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamUsage {
    /// Stream id.
    pub stream: u64,
    /// Display name ("stream N" or "stream N (name)").
    pub name: String,
    /// Ops on it (a graph launch once, its nodes not).
    pub ops: u64,
    /// Union of its ops' intervals.
    pub busy_ns: u64,
    /// Bytes its ops moved or wrote.
    pub bytes: u64,
}

/// Latency percentiles of one kind of op.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KindLatency {
    /// The kind, e.g. "H2D".
    pub kind: String,
    /// How many ops.
    pub count: u64,
    /// Submit → start: time spent queued.
    pub queued: Percentiles,
    /// Start → end: time spent executing.
    pub exec: Percentiles,
}

/// One op, for the longest-ops list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpSummary {
    /// Op or kernel name.
    pub name: String,
    /// Kind, e.g. "Kernel".
    pub kind: String,
    /// Stream id.
    pub stream: u64,
    /// Value on the stream's timeline.
    pub seq: u64,
    /// Engine display name.
    pub engine: String,
    /// Start, in trace ns.
    pub start_ns: u64,
    /// End, in trace ns.
    pub end_ns: u64,
    /// `end_ns - start_ns`.
    pub duration_ns: u64,
    /// Bytes moved or written.
    pub bytes: u64,
    /// Completed with an error.
    pub failed: bool,
}

/// Where one engine sat idle between its first and last op.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineGaps {
    /// Engine display name.
    pub engine: String,
    /// Total idle time between its first and last op.
    pub idle_ns: u64,
    /// The largest gaps, largest first.
    pub gaps: Vec<Gap>,
}

/// A time range with no op on an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// Where the engine went idle (end of the op before).
    pub start_ns: u64,
    /// Where it got work again (start of the op after).
    pub end_ns: u64,
    /// `end_ns - start_ns`.
    pub duration_ns: u64,
}

/// The pool events in the trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySummary {
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Chunks mapped from the OS.
    pub chunk_maps: u64,
    /// Chunks returned to the OS.
    pub chunk_unmaps: u64,
    /// Bytes of all allocations.
    pub alloc_bytes: u64,
    /// Highest reserved bytes seen.
    pub peak_reserved: u64,
    /// Highest allocated bytes seen.
    pub peak_allocated: u64,
    /// Reserved bytes after the last event.
    pub final_reserved: u64,
    /// Allocated bytes after the last event.
    pub final_allocated: u64,
}

/// The pool's counters with the derived hit rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocatorReport {
    /// The counters as given.
    pub stats: AllocatorStats,
    /// `hits / (hits + misses)`, None with no allocation.
    pub hit_rate: Option<f64>,
}

fn wall_clock() -> String {
    TraceClock::Wall.as_str().to_string()
}

/// Whether an engine's copies cross the link (so its bandwidth is bounded by
/// the link's peak): H2D and D2H, not on-device copies or fills.
fn crosses_link(kind: EngineKind) -> bool {
    matches!(kind, EngineKind::CopyH2D | EngineKind::CopyD2H)
}

fn engine_label(kind: EngineKind, index: u32) -> String {
    format!("{} {}", kind.as_str(), index)
}

impl Report {
    /// Builds the report from a trace.
    pub fn build(trace: &Trace, options: &ReportOptions) -> Report {
        let ops = &trace.ops;
        let roles = Roles::new(trace);
        let window_start_ns = ops.iter().map(|o| o.start_ns).min().unwrap_or(0);
        let window_end_ns = ops.iter().map(|o| span(o).1).max().unwrap_or(0);
        let wall_ns = window_end_ns - window_start_ns;
        let ratio = |num: u64| {
            if wall_ns == 0 {
                0.0
            } else {
                num as f64 / wall_ns as f64
            }
        };

        let mut by_engine: BTreeMap<(EngineKind, u32), Vec<&OpRecord>> = BTreeMap::new();
        let mut by_stream: BTreeMap<u64, Vec<&OpRecord>> = BTreeMap::new();
        for op in ops {
            if roles.work(op) {
                by_engine
                    .entry((op.engine, op.engine_index))
                    .or_default()
                    .push(op);
            }
            if roles.submitted(op) {
                by_stream.entry(op.stream).or_default().push(op);
            }
        }
        let submitted: Vec<&OpRecord> = ops.iter().filter(|o| roles.submitted(o)).collect();

        let mut engines = Vec::new();
        let mut idle_gaps = Vec::new();
        for (&(kind, index), list) in &by_engine {
            let merged = merge(list.iter().map(|o| span(o)).collect());
            let busy_ns = busy(&merged);
            let bytes: u64 = list.iter().map(|o| o.bytes).sum();
            let bandwidth_gbps =
                (kind.is_copy() && busy_ns > 0).then(|| bytes as f64 / busy_ns as f64);
            let peak_fraction = match (bandwidth_gbps, options.link_peak_gbps) {
                (Some(bw), Some(peak)) if peak > 0.0 && crosses_link(kind) => Some(bw / peak),
                _ => None,
            };
            engines.push(EngineUsage {
                engine: engine_label(kind, index),
                kind: kind.as_str().to_string(),
                index,
                ops: list.len() as u64,
                busy_ns,
                utilization: ratio(busy_ns),
                bytes,
                bandwidth_gbps,
                peak_fraction,
            });

            let mut gaps: Vec<Gap> = merged
                .windows(2)
                .map(|w| Gap {
                    start_ns: w[0].1,
                    end_ns: w[1].0,
                    duration_ns: w[1].0 - w[0].1,
                })
                .collect();
            let idle_ns = gaps.iter().map(|g| g.duration_ns).sum();
            gaps.sort_by_key(|g| (std::cmp::Reverse(g.duration_ns), g.start_ns));
            gaps.truncate(options.max_gaps);
            idle_gaps.push(EngineGaps {
                engine: engine_label(kind, index),
                idle_ns,
                gaps,
            });
        }

        let streams = by_stream
            .iter()
            .map(|(&stream, list)| StreamUsage {
                stream,
                name: trace.stream_label(stream),
                ops: list.len() as u64,
                busy_ns: busy(&merge(list.iter().map(|o| span(o)).collect())),
                bytes: list.iter().map(|o| o.bytes).sum(),
            })
            .collect();

        let latency = OpKind::ALL
            .iter()
            .filter_map(|&kind| {
                let of_kind: Vec<&OpRecord> = submitted
                    .iter()
                    .copied()
                    .filter(|o| o.kind == kind)
                    .collect();
                if of_kind.is_empty() {
                    return None;
                }
                let queued: Vec<u64> = of_kind
                    .iter()
                    .map(|o| o.start_ns.saturating_sub(o.submit_ns))
                    .collect();
                let exec: Vec<u64> = of_kind.iter().map(|o| o.duration_ns()).collect();
                Some(KindLatency {
                    kind: kind.as_str().to_string(),
                    count: of_kind.len() as u64,
                    queued: percentiles(&queued),
                    exec: percentiles(&exec),
                })
            })
            .collect();

        // Waits and markers are stalls, not work: the idle gaps show those.
        let mut longest: Vec<&OpRecord> = submitted
            .iter()
            .copied()
            .filter(|o| !matches!(o.kind, OpKind::Wait | OpKind::Record))
            .collect();
        longest.sort_by_key(|o| (std::cmp::Reverse(o.duration_ns()), o.start_ns));
        let longest_ops = longest
            .into_iter()
            .take(options.top_n)
            .map(|o| OpSummary {
                name: if o.name.is_empty() {
                    o.kind.as_str().to_string()
                } else {
                    o.name.to_string()
                },
                kind: o.kind.as_str().to_string(),
                stream: o.stream,
                seq: o.seq,
                engine: engine_label(o.engine, o.engine_index),
                start_ns: o.start_ns,
                end_ns: o.end_ns,
                duration_ns: o.duration_ns(),
                bytes: o.bytes,
                failed: o.failed,
            })
            .collect();

        let memory = (!trace.mem.is_empty()).then(|| {
            let mut m = MemorySummary::default();
            let mut last_ts = 0;
            for r in &trace.mem {
                match r.kind {
                    MemKind::Alloc => {
                        m.allocs += 1;
                        m.alloc_bytes += r.bytes;
                    }
                    MemKind::Free => m.frees += 1,
                    MemKind::ChunkMap => m.chunk_maps += 1,
                    MemKind::ChunkUnmap => m.chunk_unmaps += 1,
                }
                m.peak_reserved = m.peak_reserved.max(r.reserved);
                m.peak_allocated = m.peak_allocated.max(r.allocated);
                if r.ts_ns >= last_ts {
                    last_ts = r.ts_ns;
                    m.final_reserved = r.reserved;
                    m.final_allocated = r.allocated;
                }
            }
            m
        });

        let allocator = options.allocator.map(|stats| {
            let total = stats.cache_hits + stats.cache_misses;
            AllocatorReport {
                stats,
                hit_rate: (total > 0).then(|| stats.cache_hits as f64 / total as f64),
            }
        });

        let (graphs, launches_without_nodes) = graphs::build(trace);
        let iotlb = trace
            .iotlb
            .iter()
            .map(|r| IotlbUsage {
                engine: engine_label(r.engine, r.engine_index),
                hits: r.hits,
                misses: r.misses,
                hit_rate: r.hits as f64 / (r.hits + r.misses).max(1) as f64,
            })
            .collect();

        let mut sums: std::collections::BTreeMap<
            (hetero_trace::MigrationReason, bool),
            MigrationSum,
        > = std::collections::BTreeMap::new();
        for m in &trace.migrations {
            let e = sums
                .entry((m.reason, m.to_host))
                .or_insert_with(|| MigrationSum {
                    reason: m.reason.as_str().to_string(),
                    to_host: m.to_host,
                    runs: 0,
                    pages: 0,
                    bytes: 0,
                });
            e.runs += 1;
            e.pages += u64::from(m.pages);
            e.bytes += m.bytes;
        }
        let migrations = sums.into_values().collect();

        let mut tasks: std::collections::BTreeMap<(&str, u32), (TaskSum, f64)> =
            std::collections::BTreeMap::new();
        for t in &trace.tasks {
            let (e, errors) = tasks.entry((t.kernel, t.device)).or_insert_with(|| {
                let sum = TaskSum {
                    kernel: t.kernel.to_string(),
                    device: t.device,
                    tasks: 0,
                    measured_ns: 0,
                    predicted: 0,
                    mean_relative_error: 0.0,
                };
                (sum, 0.0)
            });
            e.tasks += 1;
            e.measured_ns += t.measured_ns;
            if let (Some(p), true) = (t.predicted_ns, t.measured_ns > 0) {
                e.predicted += 1;
                *errors += (p as f64 - t.measured_ns as f64).abs() / t.measured_ns as f64;
            }
        }
        let tasks = tasks
            .into_values()
            .map(|(mut sum, errors)| {
                sum.mean_relative_error = errors / sum.predicted.max(1) as f64;
                sum
            })
            .collect();

        let mut links: std::collections::BTreeMap<(u32, u32), LinkSum> =
            std::collections::BTreeMap::new();
        for l in &trace.links {
            let e = links.entry((l.from, l.to)).or_insert(LinkSum {
                from: l.from,
                to: l.to,
                bytes: 0,
            });
            e.bytes += l.bytes;
        }
        let links = links.into_values().collect();

        Report {
            device_name: trace.device_name.clone(),
            window_start_ns,
            window_end_ns,
            wall_ns,
            clock: trace.clock.as_str().to_string(),
            ops: submitted.len() as u64,
            failed_ops: submitted.iter().filter(|o| o.failed).count() as u64,
            dropped_records: trace.dropped,
            graph_nodes: (ops.len() - submitted.len()) as u64,
            link_peak_gbps: options.link_peak_gbps,
            engines,
            streams,
            latency,
            longest_ops,
            idle_gaps,
            graphs,
            launches_without_nodes,
            memory,
            allocator,
            iotlb,
            migrations,
            tasks,
            links,
        }
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }
}
