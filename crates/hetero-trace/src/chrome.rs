//! Chrome Trace Event JSON export (opens in ui.perfetto.dev and
//! chrome://tracing), written by hand so the recorder needs no serde.
//!
//! Layout: process 1 "streams" has one track per stream (tid = stream id,
//! except stream 0, which gets a fresh tid), process 2 "engines" one track
//! per (engine kind, index), process 3 "memory" the reserved/allocated
//! counters and pool instants; `otherData` names the device and the clock
//! the timestamps are on (`"wall"` or `"virtual"`, see `TraceClock`), and
//! counts the records dropped past the recorder's bound (`dropped_records`,
//! 0 for a whole trace). A tid
//! is never reused under another pid (Perfetto treats tids as process-wide
//! and would split such a track). Each op is a
//! complete ("X") slice on its stream track and on its engine track. Wait ops
//! get a flow arrow ("s" → "f") from the op that reached the awaited value.
//!
//! Graph launches: a launch (`OpKind::Graph`) is a slice like any op; the
//! records of its nodes (`OpRecord::node` set, same stream and `seq`) are its
//! children. On the stream side a node of plan lane 0 nests under its launch
//! on the stream track; a node of lane k ≥ 1 goes to the track "stream S graph
//! lane k", sorted right after the stream's own tracks, so parallel chains lie
//! side by side under the launch's span. On the engine side a node sits on the
//! engine that ran it, nested under its launch where the launch is on that
//! engine too. Node slices carry `graph`, `node` and `lane` in their args; a
//! launch carries `graph` and `nodes` (node records found for it).
//!
//! Invariants of the output: on one track two slices either do not overlap or
//! one is a node's slice inside its own launch's slice (Perfetto nests "X"
//! slices by containment); anything else that would overlap (nodes of one
//! lane that ran at once, a node outside its launch's span, ops of other
//! streams on an engine during a launch) goes to an extra "overlap" track
//! beside its track, so any recorder data renders; slices are written in
//! (start, longest first) order, a launch before its nodes, so viewers see
//! the parent first; every flow has both ends, each inside its slice (a flow
//! starts at the launch, never at one of its nodes); counter events are in
//! time order; every pid and tid used has a name.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Write};

use crate::record::{OpKind, OpRecord, Trace};

const PID_STREAMS: u64 = 1;
const PID_ENGINES: u64 = 2;
const PID_MEMORY: u64 = 3;
const PID_TASKS: u64 = 4;

/// A track (pid, tid) and its display name and order.
struct Track {
    pid: u64,
    tid: u64,
    name: String,
    sort: usize,
}

/// Adds the track of `lane` of a stream or engine named `base`: lane 0 carries
/// the name, later lanes (ops that overlap in time) are marked as such.
fn push_lane(tracks: &mut Vec<Track>, pid: u64, tid: u64, base: &str, lane: usize) {
    let name = if lane == 0 {
        base.to_string()
    } else {
        format!("{base} (overlap {lane})")
    };
    let sort = tracks.len();
    tracks.push(Track {
        pid,
        tid,
        name,
        sort,
    });
}

/// The end of an op's slice (its start if the clock readings are out of order).
fn end(op: &OpRecord) -> u64 {
    op.end_ns.max(op.start_ns)
}

/// The order slices are placed and written in: by start, the longest first,
/// a launch before a node of the same span.
fn slice_key(
    ops: &[OpRecord],
    parent: &[Option<usize>],
    i: usize,
) -> (u64, std::cmp::Reverse<u64>, bool, usize) {
    let op = &ops[i];
    (
        op.start_ns,
        std::cmp::Reverse(end(op)),
        parent[i].is_some(),
        i,
    )
}

/// The launch each node record belongs to: the `OpKind::Graph` op with the
/// node's stream and `seq` (None for other ops and for nodes without one).
fn launches_of(ops: &[OpRecord]) -> Vec<Option<usize>> {
    let mut launch: HashMap<(u64, u64), usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        if op.kind == OpKind::Graph && op.node.is_none() {
            launch.entry((op.stream, op.seq)).or_insert(i);
        }
    }
    ops.iter()
        .map(|op| {
            op.node?;
            launch.get(&(op.stream, op.seq)).copied()
        })
        .collect()
}

/// Splits ops (indices into `ops`) into lanes of one track each: returns the
/// lane of each op, in the order given, and the number of lanes. On a lane
/// two slices never overlap, except a node inside its own launch (`parent`).
fn assign_lanes(
    ops: &[OpRecord],
    members: &[usize],
    parent: &[Option<usize>],
) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by_key(|&k| slice_key(ops, parent, members[k]));
    // Per lane, the slices still open at the current start, outermost first.
    let mut open: Vec<Vec<usize>> = Vec::new();
    let mut lane_of = vec![0; members.len()];
    for k in order {
        let i = members[k];
        let (start, stop) = (ops[i].start_ns, end(&ops[i]));
        // Slices are placed by start, so one that ended by `start` is closed
        // for every later slice too: popping it while looking is final.
        let fits = |stack: &mut Vec<usize>| {
            while stack.last().is_some_and(|&j| end(&ops[j]) <= start) {
                stack.pop();
            }
            match stack.last() {
                None => true,
                Some(&j) => parent[i] == Some(j) && stop <= end(&ops[j]),
            }
        };
        let lane = match open.iter_mut().position(fits) {
            Some(lane) => lane,
            None => {
                open.push(Vec::new());
                open.len() - 1
            }
        };
        open[lane].push(i);
        lane_of[k] = lane;
    }
    let lanes = open.len();
    (lane_of, lanes)
}

/// Microseconds with nanosecond precision, exact (no float rounding).
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Where a flow end sits inside its slice: 1 ns before the end when the
/// slice is at least 2 ns long (strictly inside, so it binds to this slice
/// and not to a neighbour that starts at its end), else at its start.
fn anchor(op: &OpRecord) -> u64 {
    if op.duration_ns() >= 2 {
        op.end_ns - 1
    } else {
        op.start_ns
    }
}

/// Hands out tids no other track uses (never 0).
struct Tids {
    used: HashSet<u64>,
    next: u64,
}

impl Tids {
    fn fresh(&mut self) -> u64 {
        loop {
            let tid = self.next;
            self.next = self.next.wrapping_add(1);
            if tid != 0 && self.used.insert(tid) {
                return tid;
            }
        }
    }
}

/// Writes events separated by commas.
struct Events<'w, W: Write> {
    w: &'w mut W,
    first: bool,
}

impl<W: Write> Events<'_, W> {
    fn event(&mut self, body: &str) -> io::Result<()> {
        if !self.first {
            self.w.write_all(b",\n")?;
        }
        self.first = false;
        self.w.write_all(b"{")?;
        self.w.write_all(body.as_bytes())?;
        self.w.write_all(b"}")
    }
}

/// Writes `trace` as Chrome Trace Event JSON (object form, `traceEvents`).
pub fn write_chrome_trace(trace: &Trace, w: &mut impl Write) -> io::Result<()> {
    let ops = &trace.ops;
    let parent = launches_of(ops);
    // Track (pid, tid) of each op on the stream side and the engine side.
    let mut stream_track = vec![(0u64, 0u64); ops.len()];
    let mut engine_track = vec![(0u64, 0u64); ops.len()];
    let mut tracks: Vec<Track> = Vec::new();

    // Streams: the first lane keeps tid = stream id (except 0, which trace
    // viewers reserve for the idle thread); every other track takes a fresh
    // tid, so no tid appears under two pids (Perfetto would split its track).
    // Within a stream, group 0 holds its ops and the nodes of graph lane 0,
    // group k the nodes of graph lane k.
    let mut by_stream: BTreeMap<u64, BTreeMap<u32, Vec<usize>>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        let group = op.node.map_or(0, |n| n.lane);
        by_stream
            .entry(op.stream)
            .or_default()
            .entry(group)
            .or_default()
            .push(i);
    }
    let mut tids = Tids {
        used: by_stream.keys().copied().collect(),
        next: by_stream
            .keys()
            .next_back()
            .map_or(1, |s| s.wrapping_add(1)),
    };
    for (&stream, groups) in &by_stream {
        let label = trace.stream_label(stream);
        for (&group, members) in groups {
            let (lane_of, lanes) = assign_lanes(ops, members, &parent);
            let base = if group == 0 {
                label.clone()
            } else {
                format!("{label} graph lane {group}")
            };
            let mut lane_tid = Vec::with_capacity(lanes);
            for lane in 0..lanes {
                let tid = if group == 0 && lane == 0 && stream != 0 {
                    stream
                } else {
                    tids.fresh()
                };
                lane_tid.push(tid);
                push_lane(&mut tracks, PID_STREAMS, tid, &base, lane);
            }
            for (k, &i) in members.iter().enumerate() {
                stream_track[i] = (PID_STREAMS, lane_tid[lane_of[k]]);
            }
        }
    }

    // Engines: in (kind, index) order, overlap lanes right after their engine.
    let mut by_engine: BTreeMap<(crate::EngineKind, u32), Vec<usize>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        by_engine
            .entry((op.engine, op.engine_index))
            .or_default()
            .push(i);
    }
    for (&(kind, index), members) in &by_engine {
        let (lane_of, lanes) = assign_lanes(ops, members, &parent);
        let lane_tid: Vec<u64> = (0..lanes).map(|_| tids.fresh()).collect();
        let base = format!("{} {}", kind.as_str(), index);
        for (lane, &tid) in lane_tid.iter().enumerate() {
            push_lane(&mut tracks, PID_ENGINES, tid, &base, lane);
        }
        for (k, &i) in members.iter().enumerate() {
            engine_track[i] = (PID_ENGINES, lane_tid[lane_of[k]]);
        }
    }

    // Memory: one track for the pool's counters and instants.
    let mem_tid = (!trace.mem.is_empty()).then(|| tids.fresh());
    if let Some(tid) = mem_tid {
        tracks.push(Track {
            pid: PID_MEMORY,
            tid,
            name: "pool".to_string(),
            sort: tracks.len(),
        });
    }

    // Tasks: per device of the context, the tasks placed there, in lanes
    // where they overlap (one per compute unit they ran on at once).
    let mut task_track = vec![(0u64, 0u64); trace.tasks.len()];
    let mut by_device: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, t) in trace.tasks.iter().enumerate() {
        by_device.entry(t.device).or_default().push(i);
    }
    for (&device, members) in &mut by_device {
        members.sort_by_key(|&i| (trace.tasks[i].start_ns, trace.tasks[i].end_ns));
        // Greedy: each task on the first lane free at its start.
        let mut lane_end: Vec<u64> = Vec::new();
        let mut lane_tid: Vec<u64> = Vec::new();
        let base = format!("tasks on device {device}");
        for &i in members.iter() {
            let t = &trace.tasks[i];
            let lane = match lane_end.iter().position(|&end| end <= t.start_ns) {
                Some(l) => l,
                None => {
                    lane_end.push(0);
                    let tid = tids.fresh();
                    push_lane(&mut tracks, PID_TASKS, tid, &base, lane_tid.len());
                    lane_tid.push(tid);
                    lane_end.len() - 1
                }
            };
            lane_end[lane] = t.end_ns.max(t.start_ns);
            task_track[i] = (PID_TASKS, lane_tid[lane]);
        }
    }

    w.write_all(b"{\"displayTimeUnit\":\"ns\",\"otherData\":{\"device\":")?;
    w.write_all(json_str(&trace.device_name).as_bytes())?;
    w.write_all(b",\"clock\":")?;
    w.write_all(json_str(trace.clock.as_str()).as_bytes())?;
    write!(w, ",\"dropped_records\":{}", trace.dropped)?;
    w.write_all(b"},\"traceEvents\":[\n")?;
    let mut ev = Events { w, first: true };

    // Metadata: process and thread names, and their order. Process-level
    // events borrow a tid of their own process.
    let device = if trace.device_name.is_empty() {
        String::new()
    } else {
        format!(" ({})", trace.device_name)
    };
    for (pid, name) in [
        (PID_STREAMS, "streams"),
        (PID_ENGINES, "engines"),
        (PID_MEMORY, "memory"),
        (PID_TASKS, "tasks"),
    ] {
        let Some(tid) = tracks.iter().find(|t| t.pid == pid).map(|t| t.tid) else {
            continue;
        };
        ev.event(&format!(
            "\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"process_name\",\"args\":{{\"name\":{}}}",
            json_str(&format!("{name}{device}"))
        ))?;
        ev.event(&format!(
            "\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{pid}}}"
        ))?;
    }
    for t in &tracks {
        ev.event(&format!(
            "\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}",
            t.pid,
            t.tid,
            json_str(&t.name)
        ))?;
        ev.event(&format!(
            "\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_sort_index\",\"args\":{{\"sort_index\":{}}}",
            t.pid, t.tid, t.sort
        ))?;
    }

    // Per launch: its graph and how many node records it has.
    let mut launch_nodes: HashMap<usize, (u32, u64)> = HashMap::new();
    for (op, p) in ops.iter().zip(&parent) {
        if let (Some(n), Some(p)) = (op.node, p) {
            launch_nodes.entry(*p).or_insert((n.graph, 0)).1 += 1;
        }
    }

    // Slices: each op on its stream track and its engine track, parents
    // before the slices they contain.
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_by_key(|&i| slice_key(ops, &parent, i));
    for i in order {
        let op = &ops[i];
        let name = if op.name.is_empty() {
            op.kind.as_str()
        } else {
            op.name
        };
        let dep = match op.dep {
            Some((s, v)) => format!(",\"wait_stream\":{s},\"wait_value\":{v}"),
            None => String::new(),
        };
        let graph = match (op.node, launch_nodes.get(&i)) {
            (Some(n), _) => format!(
                ",\"graph\":{},\"node\":{},\"lane\":{}",
                n.graph, n.node, n.lane
            ),
            (None, Some(&(graph, nodes))) => format!(",\"graph\":{graph},\"nodes\":{nodes}"),
            (None, None) => String::new(),
        };
        let args = format!(
            "{{\"stream\":{},\"queue\":{},\"engine\":{},\"seq\":{},\"bytes\":{},\"submit_us\":{},\"queued_us\":{},\"failed\":{}{}{}}}",
            op.stream,
            op.queue,
            json_str(&format!("{} {}", op.engine.as_str(), op.engine_index)),
            op.seq,
            op.bytes,
            us(op.submit_ns),
            us(op.start_ns.saturating_sub(op.submit_ns)),
            op.failed,
            dep,
            graph
        );
        for (pid, tid) in [stream_track[i], engine_track[i]] {
            ev.event(&format!(
                "\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"dur\":{},\"name\":{},\"cat\":\"{}\",\"args\":{}",
                us(op.start_ns),
                us(op.duration_ns()),
                json_str(name),
                op.kind.as_str(),
                args
            ))?;
        }
    }

    // Flows: from the op that reached (stream, value) to the Wait that needed it.
    // The producer is the op with that exact value, else the latest op before it;
    // never a graph node (its launch, with the same value, reached it).
    let mut timeline: BTreeMap<u64, Vec<(u64, usize)>> = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        if op.node.is_none() {
            timeline.entry(op.stream).or_default().push((op.seq, i));
        }
    }
    for seqs in timeline.values_mut() {
        seqs.sort_unstable();
    }
    let mut flow_id = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let Some((dep_stream, dep_value)) = op.dep else {
            continue;
        };
        let Some(seqs) = timeline.get(&dep_stream) else {
            continue;
        };
        let upto = seqs.partition_point(|&(seq, _)| seq <= dep_value);
        let Some(&(_, producer)) = seqs[..upto].iter().rev().find(|&&(_, j)| j != i) else {
            continue;
        };
        flow_id += 1;
        let (spid, stid) = stream_track[producer];
        let (fpid, ftid) = stream_track[i];
        ev.event(&format!(
            "\"ph\":\"s\",\"id\":{flow_id},\"pid\":{spid},\"tid\":{stid},\"ts\":{},\"name\":\"dependency\",\"cat\":\"dep\"",
            us(anchor(&ops[producer]))
        ))?;
        ev.event(&format!(
            "\"ph\":\"f\",\"bp\":\"e\",\"id\":{flow_id},\"pid\":{fpid},\"tid\":{ftid},\"ts\":{},\"name\":\"dependency\",\"cat\":\"dep\"",
            us(anchor(op))
        ))?;
    }

    // Tasks: one slice each, with the model's prediction beside the time.
    for (t, &(pid, tid)) in trace.tasks.iter().zip(&task_track) {
        let predicted = match t.predicted_ns {
            Some(p) => format!(",\"predicted_us\":{}", us(p)),
            None => String::new(),
        };
        ev.event(&format!(
            "\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"dur\":{},\"name\":{},\"cat\":\"task\",\"args\":{{\"device\":{},\"measured_us\":{}{predicted}}}",
            us(t.start_ns),
            us(t.end_ns.saturating_sub(t.start_ns)),
            json_str(t.kernel),
            t.device,
            us(t.measured_ns)
        ))?;
    }

    // Memory: counters (in time order) and one instant per pool event.
    let mut mem: Vec<_> = trace.mem.iter().collect();
    mem.sort_by_key(|m| m.ts_ns);
    let tid = mem_tid.unwrap_or(0);
    for m in mem {
        ev.event(&format!(
            "\"ph\":\"C\",\"pid\":{PID_MEMORY},\"tid\":{tid},\"ts\":{},\"name\":\"reserved\",\"args\":{{\"bytes\":{}}}",
            us(m.ts_ns),
            m.reserved
        ))?;
        ev.event(&format!(
            "\"ph\":\"C\",\"pid\":{PID_MEMORY},\"tid\":{tid},\"ts\":{},\"name\":\"allocated\",\"args\":{{\"bytes\":{}}}",
            us(m.ts_ns),
            m.allocated
        ))?;
        ev.event(&format!(
            "\"ph\":\"i\",\"s\":\"t\",\"pid\":{PID_MEMORY},\"tid\":{tid},\"ts\":{},\"name\":\"{}\",\"args\":{{\"bytes\":{},\"stream\":{}}}",
            us(m.ts_ns),
            m.kind.as_str(),
            m.bytes,
            m.stream
        ))?;
    }

    ev.w.write_all(b"\n]}\n")
}
