//! Parses the Chrome trace of synthetic traces and checks its structure:
//! slices per track either apart or a graph node inside its own launch,
//! written parents first; flows with both ends inside slices, counters in
//! time order, names for every process and track; and where a graph
//! launch's nodes go.

use std::collections::{BTreeMap, HashMap};

use hetero_trace::{
    write_chrome_trace, EngineKind, MemKind, MemRecord, NodeRef, OpKind, OpRecord, TaskRecord,
    Trace, TraceClock,
};
use serde_json::Value;

fn op(kind: OpKind, stream: u64, seq: u64, engine: EngineKind, start: u64, end: u64) -> OpRecord {
    OpRecord {
        kind,
        name: kind.as_str(),
        stream,
        queue: stream as u32,
        engine,
        engine_index: 0,
        seq,
        submit_ns: start.saturating_sub(500),
        start_ns: start,
        end_ns: end,
        bytes: if kind == OpKind::Kernel { 0 } else { 1 << 20 },
        dep: None,
        failed: false,
        node: None,
    }
}

/// A 3-stage pipeline on three streams: H2D → kernel → D2H per batch, with
/// waits between the stages, plus pool events.
fn pipeline() -> Trace {
    let mut ops = Vec::new();
    for b in 0..4u64 {
        let t = 1_000 + b * 20_000;
        ops.push(op(OpKind::H2D, 1, b + 1, EngineKind::CopyH2D, t, t + 8_000));
        let mut w = op(
            OpKind::Wait,
            2,
            2 * b + 1,
            EngineKind::Host,
            t + 100,
            t + 8_050,
        );
        w.dep = Some((1, b + 1));
        ops.push(w);
        let mut k = op(
            OpKind::Kernel,
            2,
            2 * b + 2,
            EngineKind::Compute,
            t + 8_100,
            t + 17_000,
        );
        k.engine_index = (b % 2) as u32;
        k.name = "saxpy";
        ops.push(k);
        let mut w = op(
            OpKind::Wait,
            3,
            2 * b + 1,
            EngineKind::Host,
            t + 200,
            t + 17_050,
        );
        w.dep = Some((2, 2 * b + 2));
        ops.push(w);
        ops.push(op(
            OpKind::D2H,
            3,
            2 * b + 2,
            EngineKind::CopyD2H,
            t + 17_100,
            t + 20_000,
        ));
    }
    // A zero-length marker that touches the end of the first H2D.
    ops.push(op(OpKind::Record, 1, 100, EngineKind::Host, 9_000, 9_000));
    let mem = (0..6u64)
        .map(|i| MemRecord {
            kind: if i % 2 == 0 {
                MemKind::Alloc
            } else {
                MemKind::Free
            },
            ts_ns: 5_000 - i * 100, // deliberately unsorted
            bytes: 4096,
            stream: 1,
            reserved: 1 << 21,
            allocated: (i % 2) * 4096,
        })
        .collect();
    let mut trace = Trace {
        ops,
        mem,
        device_name: "host \"test\" device".into(),
        stream_names: BTreeMap::from([(2, "compute".to_string())]),
        ..Trace::default()
    };
    trace.sort();
    trace
}

fn ns(v: &Value) -> i64 {
    (v.as_f64().expect("a number") * 1000.0).round() as i64
}

fn export(trace: &Trace) -> Vec<Value> {
    let mut buf = Vec::new();
    write_chrome_trace(trace, &mut buf).expect("write to a Vec");
    let doc: Value = serde_json::from_slice(&buf).expect("valid JSON");
    doc["traceEvents"]
        .as_array()
        .expect("traceEvents array")
        .clone()
}

/// A slice as the checks see it: start, end, whether it is a graph node, the event.
type Slice<'a> = (i64, i64, bool, &'a Value);

/// Checks every structural property; returns the number of X slices.
fn check_structure(events: &[Value]) -> usize {
    let key = |e: &Value| {
        (
            e["pid"].as_u64().expect("pid"),
            e["tid"].as_u64().expect("tid"),
        )
    };
    // Per track: (start, end, is a node, the slice) in file order.
    let mut slices: HashMap<(u64, u64), Vec<Slice>> = HashMap::new();
    let mut process_names = HashMap::new();
    let mut thread_names = HashMap::new();
    let mut pid_of_tid: HashMap<u64, u64> = HashMap::new();
    for e in events {
        // A tid never appears under two pids (Perfetto would split its track).
        let (pid, tid) = key(e);
        assert_ne!(tid, 0, "tid 0 is the idle thread in trace viewers");
        assert_eq!(
            *pid_of_tid.entry(tid).or_insert(pid),
            pid,
            "tid {tid} under two pids"
        );
        match e["ph"].as_str().expect("ph") {
            "X" => {
                let ts = ns(&e["ts"]);
                let dur = ns(&e["dur"]);
                assert!(dur >= 0);
                assert!(e["name"].is_string());
                let node = e["args"]["node"].is_u64();
                slices
                    .entry(key(e))
                    .or_default()
                    .push((ts, ts + dur, node, e));
            }
            "M" => match e["name"].as_str().expect("name") {
                "process_name" => {
                    process_names.insert(e["pid"].as_u64(), e["args"]["name"].clone());
                }
                "thread_name" => {
                    thread_names.insert(key(e), e["args"]["name"].clone());
                }
                _ => {}
            },
            _ => {}
        }
    }
    // Written by start, the longest first; ties in file order, so a launch
    // must come before a node of the same span for the walk below.
    let rank = |x: &Slice| (x.0, std::cmp::Reverse(x.1));
    for (track, list) in &slices {
        assert!(
            list.windows(2).all(|w| rank(&w[0]) <= rank(&w[1])),
            "track {track:?}: slices not written in (start, longest first) order"
        );
    }
    // Nested only as a node inside its own launch: in file order, each slice
    // either starts once the open one ended or lies inside it, and then it is
    // a node of that launch (same stream and seq).
    let mut count = 0;
    for (track, list) in &slices {
        let mut stack: Vec<Slice> = Vec::new();
        for &(s, e, node, slice) in list.iter() {
            while stack.last().is_some_and(|&(_, pe, _, _)| pe <= s) {
                stack.pop();
            }
            if let Some(&(ps, pe, _, outer)) = stack.last() {
                assert!(
                    ps <= s && e <= pe,
                    "track {track:?}: slice {s}..{e} overlaps {ps}..{pe}"
                );
                assert!(
                    node && outer["cat"] == "Graph"
                        && outer["args"]["stream"] == slice["args"]["stream"]
                        && outer["args"]["seq"] == slice["args"]["seq"],
                    "track {track:?}: {slice} nests in {outer}, which is not its launch"
                );
            }
            stack.push((s, e, node, slice));
            count += 1;
        }
        assert!(
            thread_names.contains_key(track),
            "track {track:?} has no name"
        );
        assert!(
            process_names.contains_key(&Some(track.0)),
            "pid {} has no name",
            track.0
        );
    }
    // Flows: exactly one start and one end per id, each inside a slice of its track.
    let mut flows: HashMap<u64, (usize, usize)> = HashMap::new();
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        if ph != "s" && ph != "f" {
            continue;
        }
        let id = e["id"].as_u64().expect("flow id");
        let t = ns(&e["ts"]);
        let inside = slices
            .get(&key(e))
            .is_some_and(|l| l.iter().any(|&(s, end, _, _)| s <= t && t <= end));
        assert!(inside, "flow {id} {ph} at {t} is not inside a slice");
        let entry = flows.entry(id).or_default();
        if ph == "s" {
            entry.0 += 1;
        } else {
            assert_eq!(e["bp"], "e");
            entry.1 += 1;
        }
    }
    for (id, ends) in &flows {
        assert_eq!(*ends, (1, 1), "flow {id} must have one start and one end");
    }
    // Counters: in time order per name.
    let mut last: HashMap<String, i64> = HashMap::new();
    for e in events.iter().filter(|e| e["ph"] == "C") {
        let name = e["name"].as_str().expect("counter name").to_string();
        let t = ns(&e["ts"]);
        if let Some(&prev) = last.get(&name) {
            assert!(prev <= t, "counter {name} goes back in time");
        }
        last.insert(name, t);
        assert!(e["args"]["bytes"].is_u64());
    }
    count
}

#[test]
fn chrome_trace_structure_of_a_pipeline() {
    let trace = pipeline();
    let events = export(&trace);
    // Each op appears once on its stream track and once on its engine track.
    assert_eq!(check_structure(&events), 2 * trace.ops.len());
    // One flow per wait.
    let waits = trace.ops.iter().filter(|o| o.dep.is_some()).count();
    assert_eq!(events.iter().filter(|e| e["ph"] == "s").count(), waits);
    // Both counters, one per mem record each.
    for name in ["reserved", "allocated"] {
        let n = events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == name)
            .count();
        assert_eq!(n, trace.mem.len());
    }
    // Names: the three processes, streams by id (with given names), engines.
    let names: Vec<String> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .filter_map(|e| e["args"]["name"].as_str().map(str::to_string))
        .collect();
    for want in [
        "streams (host \"test\" device)",
        "engines (host \"test\" device)",
        "memory (host \"test\" device)",
        "stream 1",
        "stream 2 (compute)",
        "stream 3",
        "Copy H2D 0",
        "Compute 0",
        "Compute 1",
        "Copy D2H 0",
        "Host 0",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "missing name {want:?} in {names:?}"
        );
    }
    // In-order streams need no overlap lanes, and stream tracks use tid = stream id.
    // (Waits of two streams do overlap on the Host engine: extra lanes there.)
    assert!(!names
        .iter()
        .any(|n| n.starts_with("stream") && n.contains("overlap")));
    assert!(names.iter().any(|n| n == "Host 0 (overlap 1)"));
    for e in events.iter().filter(|e| e["ph"] == "X" && e["pid"] == 1) {
        assert_eq!(e["tid"], e["args"]["stream"]);
    }
}

#[test]
fn chrome_trace_splits_overlapping_ops_into_lanes() {
    // The recorder's clocks may disagree: ops on one engine that overlap.
    let ops = vec![
        op(OpKind::Kernel, 1, 1, EngineKind::Compute, 0, 1_000),
        op(OpKind::Kernel, 1, 2, EngineKind::Compute, 990, 2_000),
        op(OpKind::Kernel, 1, 3, EngineKind::Compute, 500, 3_000),
        op(OpKind::Kernel, 1, 4, EngineKind::Compute, 2_000, 2_500),
    ];
    let mut trace = Trace {
        ops,
        ..Trace::default()
    };
    trace.sort();
    let events = export(&trace);
    assert_eq!(check_structure(&events), 8);
    let overlap_tracks = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter(|e| {
            e["args"]["name"]
                .as_str()
                .is_some_and(|n| n.contains("overlap"))
        })
        .count();
    assert_eq!(
        overlap_tracks, 4,
        "two extra lanes on the stream and on the engine"
    );
}

#[test]
fn chrome_trace_flow_to_latest_earlier_value_and_none_for_unknown_stream() {
    let mut wait = op(OpKind::Wait, 2, 1, EngineKind::Host, 0, 5_000);
    wait.dep = Some((1, 7)); // no op has value 7: bind to value 5
    let mut orphan = op(OpKind::Wait, 2, 2, EngineKind::Host, 6_000, 6_100);
    orphan.dep = Some((9, 1)); // no such stream: no flow
    let mut trace = Trace {
        ops: vec![
            op(OpKind::H2D, 1, 5, EngineKind::CopyH2D, 100, 4_000),
            op(OpKind::H2D, 1, 8, EngineKind::CopyH2D, 4_000, 9_000),
            wait,
            orphan,
        ],
        ..Trace::default()
    };
    trace.sort();
    let events = export(&trace);
    check_structure(&events);
    let starts: Vec<&Value> = events.iter().filter(|e| e["ph"] == "s").collect();
    assert_eq!(starts.len(), 1);
    assert_eq!(ns(&starts[0]["ts"]), 3_999, "inside the op with value 5");
}

#[test]
fn chrome_trace_stream_zero_gets_a_named_nonzero_tid() {
    let mut trace = Trace {
        ops: vec![
            op(OpKind::Kernel, 0, 1, EngineKind::Compute, 0, 100),
            op(OpKind::H2D, 1, 1, EngineKind::CopyH2D, 0, 100),
        ],
        ..Trace::default()
    };
    trace.sort();
    let events = export(&trace);
    assert_eq!(check_structure(&events), 4);
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(names.contains(&"stream 0") && names.contains(&"stream 1"));
}

#[test]
fn chrome_trace_of_empty_trace_is_valid_json() {
    let events = export(&Trace::default());
    assert!(events.iter().all(|e| e["ph"] == "M"));
}

#[test]
fn chrome_trace_metadata_names_the_device_and_the_clock() {
    let other = |trace: &Trace| {
        let mut buf = Vec::new();
        write_chrome_trace(trace, &mut buf).expect("write to a Vec");
        let doc: Value = serde_json::from_slice(&buf).expect("valid JSON");
        doc["otherData"].clone()
    };
    let wall = other(&pipeline());
    assert_eq!(wall["device"], "host \"test\" device");
    assert_eq!(wall["clock"], "wall", "the host's wall clock by default");
    let virt = other(&Trace {
        clock: TraceClock::Virtual,
        ..pipeline()
    });
    assert_eq!(virt["clock"], "virtual");
    assert_eq!(wall["dropped_records"], 0, "a whole trace");
    let cut = other(&Trace {
        dropped: 12,
        ..pipeline()
    });
    assert_eq!(cut["dropped_records"], 12);
}

#[allow(clippy::too_many_arguments)]
fn node(
    kind: OpKind,
    name: &'static str,
    (stream, seq): (u64, u64),
    (engine, index): (EngineKind, u32),
    start: u64,
    end: u64,
    n: u32,
    lane: u32,
) -> OpRecord {
    let mut o = op(kind, stream, seq, engine, start, end);
    o.name = name;
    o.engine_index = index;
    o.node = Some(NodeRef {
        graph: 7,
        node: n,
        lane,
    });
    o
}

/// A fork/join graph launch on stream 3 (value 2) with nodes on two lanes, an
/// op of another stream on the launch's engine while it runs, and a wait on
/// the launch's value.
fn graph_launch() -> Trace {
    let at = (3, 2);
    let c0 = (EngineKind::Compute, 0);
    let mut wait = op(OpKind::Wait, 4, 1, EngineKind::Host, 9_500, 50_100);
    wait.dep = Some(at);
    let mut other = op(OpKind::Kernel, 5, 1, EngineKind::Compute, 46_000, 48_000);
    other.name = "other stream";
    let mut launch = op(OpKind::Graph, 3, 2, EngineKind::Compute, 10_000, 50_000);
    launch.name = "graph";
    let mut trace = Trace {
        ops: vec![
            op(OpKind::H2D, 3, 1, EngineKind::CopyH2D, 1_000, 9_000),
            launch,
            node(OpKind::Kernel, "fill", at, c0, 11_000, 15_000, 0, 0),
            node(OpKind::Kernel, "left", at, c0, 15_500, 30_000, 1, 0),
            node(
                OpKind::Kernel,
                "right",
                at,
                (EngineKind::Compute, 1),
                16_000,
                28_000,
                2,
                1,
            ),
            node(
                OpKind::H2D,
                "upload",
                at,
                (EngineKind::CopyH2D, 0),
                28_500,
                30_500,
                3,
                1,
            ),
            node(OpKind::Kernel, "join", at, c0, 31_000, 45_000, 4, 0),
            op(OpKind::D2H, 3, 3, EngineKind::CopyD2H, 51_000, 55_000),
            wait,
            other,
        ],
        ..Trace::default()
    };
    trace.sort();
    trace
}

/// Track names by (pid, tid).
fn track_names(events: &[Value]) -> HashMap<(u64, u64), String> {
    events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                (
                    e["pid"].as_u64().expect("pid"),
                    e["tid"].as_u64().expect("tid"),
                ),
                e["args"]["name"].as_str().expect("a name").to_string(),
            )
        })
        .collect()
}

/// The track names of the slices named `name`: (stream side, engine side).
fn tracks_of(events: &[Value], name: &str) -> Vec<String> {
    let names = track_names(events);
    events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == name)
        .map(|e| {
            names[&(
                e["pid"].as_u64().expect("pid"),
                e["tid"].as_u64().expect("tid"),
            )]
                .clone()
        })
        .collect()
}

#[test]
fn chrome_trace_nests_graph_nodes_under_their_launch() {
    let trace = graph_launch();
    let events = export(&trace);
    // Nesting is only ever a node inside its own launch (checked there).
    assert_eq!(check_structure(&events), 2 * trace.ops.len());

    // Stream side: lane 0 nests under the launch on the stream's own track
    // (tid = stream id), lane 1 goes to its graph lane track; no overlap tracks.
    for name in ["graph", "fill", "left", "join"] {
        assert_eq!(tracks_of(&events, name)[0], "stream 3", "{name}");
    }
    for name in ["right", "upload"] {
        assert_eq!(
            tracks_of(&events, name)[0],
            "stream 3 graph lane 1",
            "{name}"
        );
    }
    let names = track_names(&events);
    assert!(!names
        .values()
        .any(|n| n.starts_with("stream") && n.contains("overlap")));
    let lane1 = names
        .iter()
        .find(|(_, n)| *n == "stream 3 graph lane 1")
        .map(|(&(pid, tid), _)| (pid, tid))
        .expect("a graph lane track");
    assert_eq!(lane1.0, 1, "under the streams process");
    assert_ne!(lane1.1, 3, "its own tid");
    let sort_of = |tid: u64| {
        events
            .iter()
            .find(|e| e["name"] == "thread_sort_index" && e["tid"] == tid)
            .and_then(|e| e["args"]["sort_index"].as_u64())
            .expect("a sort index")
    };
    assert_eq!(sort_of(lane1.1), sort_of(3) + 1, "right below its stream");

    // Engine side: each node on the engine that ran it, nested under the
    // launch where the launch ran too; the other stream's kernel, inside the
    // launch's span but none of its nodes, on an overlap track.
    for name in ["graph", "fill", "left", "join"] {
        assert_eq!(tracks_of(&events, name)[1], "Compute 0", "{name}");
    }
    assert_eq!(tracks_of(&events, "right")[1], "Compute 1");
    assert_eq!(tracks_of(&events, "upload")[1], "Copy H2D 0");
    assert_eq!(tracks_of(&events, "H2D")[1], "Copy H2D 0");
    assert_eq!(
        tracks_of(&events, "other stream")[1],
        "Compute 0 (overlap 1)"
    );

    // Args: the node's place, the launch's graph and node count.
    let slice = |name: &str| {
        events
            .iter()
            .find(|e| e["ph"] == "X" && e["name"] == name)
            .expect("the slice")
    };
    let right = &slice("right")["args"];
    assert_eq!(
        (&right["graph"], &right["node"], &right["lane"]),
        (&7.into(), &2.into(), &1.into())
    );
    assert_eq!(right["seq"], 2);
    let launch = &slice("graph");
    assert_eq!(launch["cat"], "Graph");
    assert_eq!(
        (&launch["args"]["graph"], &launch["args"]["nodes"]),
        (&7.into(), &5.into())
    );
    assert!(launch["args"]["node"].is_null());
    assert!(slice("H2D")["args"]["graph"].is_null());

    // The wait's flow starts in the launch (the op that reached value 2),
    // not in the node that happened to start last.
    let starts: Vec<&Value> = events.iter().filter(|e| e["ph"] == "s").collect();
    assert_eq!(starts.len(), 1);
    assert_eq!(ns(&starts[0]["ts"]), 49_999);
    assert_eq!(starts[0]["tid"], 3);
}

#[test]
fn chrome_trace_graph_nodes_that_overlap_in_a_lane_or_leave_their_launch() {
    let at = (1, 1);
    let c0 = (EngineKind::Compute, 0);
    let mut orphan = node(OpKind::Kernel, "orphan", (1, 9), c0, 20_000, 21_000, 3, 0);
    orphan.node = Some(NodeRef {
        graph: 8,
        node: 0,
        lane: 0,
    });
    let mut trace = Trace {
        ops: vec![
            op(OpKind::Graph, 1, 1, EngineKind::Compute, 0, 10_000),
            node(OpKind::Kernel, "a", at, c0, 1_000, 5_000, 0, 0),
            // Same lane, running at once with a (clocks or a dynamic run).
            node(
                OpKind::Kernel,
                "b",
                at,
                (EngineKind::Compute, 1),
                2_000,
                6_000,
                1,
                0,
            ),
            // Ends after its launch.
            node(OpKind::Kernel, "c", at, c0, 9_000, 12_000, 2, 0),
            // A launch with the same span as its only node, recorded after
            // it: written before it all the same.
            node(OpKind::Kernel, "same", (2, 1), c0, 30_000, 31_000, 0, 0),
            op(OpKind::Graph, 2, 1, EngineKind::Compute, 30_000, 31_000),
            // No launch has its stream and value.
            orphan,
        ],
        ..Trace::default()
    };
    trace.sort();
    let events = export(&trace);
    assert_eq!(check_structure(&events), 2 * trace.ops.len());
    assert_eq!(tracks_of(&events, "a")[0], "stream 1");
    assert_eq!(tracks_of(&events, "b")[0], "stream 1 (overlap 1)");
    assert_eq!(tracks_of(&events, "c")[0], "stream 1 (overlap 1)");
    assert_eq!(tracks_of(&events, "orphan")[0], "stream 1");
    assert_eq!(tracks_of(&events, "same"), ["stream 2", "Compute 0"]);
    // On Compute 0, c leaves the launch and overlaps it: an overlap track.
    assert_eq!(tracks_of(&events, "c")[1], "Compute 0 (overlap 1)");
    assert_eq!(tracks_of(&events, "a")[1], "Compute 0");
}

mod random {
    use super::*;
    use proptest::prelude::*;

    const ENGINES: [EngineKind; 5] = [
        EngineKind::Compute,
        EngineKind::CopyH2D,
        EngineKind::CopyD2H,
        EngineKind::CopyD2D,
        EngineKind::Host,
    ];

    fn any_op() -> impl Strategy<Value = OpRecord> {
        (
            (0..4u64, 0..5usize, 0..3u32, 0..20u64),
            0..10_000u64,
            prop_oneof![Just(0u64), Just(1u64), 0..3_000u64],
            proptest::option::of((0..5u64, 0..20u64)),
            // 0: an op, 1: a graph launch, 2..4: a node of graph 0..2, lane 0..3.
            (0..4u8, 0..2u32, 0..3u32),
        )
            .prop_map(
                |((stream, engine, index, seq), start, dur, dep, (what, graph, lane))| {
                    let kind = match (dep, what) {
                        (Some(_), _) => OpKind::Wait,
                        (None, 1) => OpKind::Graph,
                        _ => OpKind::Kernel,
                    };
                    let mut o = op(kind, stream, seq, ENGINES[engine], start, start + dur);
                    o.engine_index = index;
                    o.dep = dep;
                    if dep.is_none() && what >= 2 {
                        o.node = Some(NodeRef {
                            graph,
                            node: 0,
                            lane,
                        });
                    }
                    o
                },
            )
    }

    /// A launch and nodes of it that mostly lie inside it.
    fn any_launch() -> impl Strategy<Value = Vec<OpRecord>> {
        (
            0..3u64,
            0..20_000u64,
            1..5_000u64,
            proptest::collection::vec((0..5_500u64, 0..2_000u64, 0..3u32, 0..5usize), 0..8),
        )
            .prop_map(|(stream, start, dur, nodes)| {
                let mut ops = vec![op(
                    OpKind::Graph,
                    stream,
                    50,
                    EngineKind::Compute,
                    start,
                    start + dur,
                )];
                for (k, (at, len, lane, engine)) in nodes.into_iter().enumerate() {
                    let mut n = op(
                        OpKind::Kernel,
                        stream,
                        50,
                        ENGINES[engine],
                        start + at,
                        start + at + len,
                    );
                    n.engine_index = lane % 2;
                    n.node = Some(NodeRef {
                        graph: 0,
                        node: k as u32,
                        lane,
                    });
                    ops.push(n);
                }
                ops
            })
    }

    proptest! {
        /// Whatever the recorder hands over (overlaps, zero-length ops,
        /// waits on unknown values, nodes in, across and outside their
        /// launches), the export stays well formed.
        #[test]
        fn chrome_trace_structure_of_random_ops(
            ops in proptest::collection::vec(any_op(), 0..60),
            launches in proptest::collection::vec(any_launch(), 0..4),
        ) {
            let mut ops = ops;
            ops.extend(launches.into_iter().flatten());
            let mut trace = Trace { ops, ..Trace::default() };
            trace.sort();
            let events = export(&trace);
            prop_assert_eq!(check_structure(&events), 2 * trace.ops.len());
        }
    }
}

#[test]
fn chrome_trace_draws_tasks_per_device_with_their_predictions() {
    let task = |device, start_ns, end_ns, predicted_ns| TaskRecord {
        kernel: "potrf",
        device,
        start_ns,
        end_ns,
        predicted_ns,
        measured_ns: end_ns - start_ns,
    };
    let trace = Trace {
        tasks: vec![
            task(0, 1_000, 5_000, Some(3_500)),
            // Overlaps the first on device 0: a second lane.
            task(0, 2_000, 4_000, None),
            // After the first lane frees: back on it.
            task(0, 6_000, 7_000, Some(1_000)),
            task(1, 1_500, 2_500, Some(900)),
        ],
        ..Trace::default()
    };
    let events = export(&trace);
    let tasks: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "task")
        .collect();
    assert_eq!(tasks.len(), 4);
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name" && e["pid"] == 4)
        .map(|e| e["args"]["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "tasks on device 0",
            "tasks on device 0 (overlap 1)",
            "tasks on device 1"
        ]
    );
    assert!(events
        .iter()
        .any(|e| e["name"] == "process_name" && e["pid"] == 4 && e["args"]["name"] == "tasks"));
    let first = tasks
        .iter()
        .find(|e| ns(&e["ts"]) == 1_000)
        .expect("the first task");
    assert_eq!(ns(&first["dur"]), 4_000);
    assert_eq!(first["name"], "potrf");
    assert_eq!(ns(&first["args"]["predicted_us"]), 3_500);
    assert_eq!(ns(&first["args"]["measured_us"]), 4_000);
    let unpredicted = tasks
        .iter()
        .find(|e| ns(&e["ts"]) == 2_000)
        .expect("the overlapping task");
    assert!(unpredicted["args"].get("predicted_us").is_none());
    assert_ne!(unpredicted["tid"], first["tid"], "overlap: its own lane");
    let third = tasks
        .iter()
        .find(|e| ns(&e["ts"]) == 6_000)
        .expect("the third task");
    assert_eq!(third["tid"], first["tid"], "the first lane again");
}
