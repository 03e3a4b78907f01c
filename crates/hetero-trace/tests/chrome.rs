//! Parses the Chrome trace of synthetic traces and checks its structure:
//! slices properly nested per track, flows with both ends inside slices,
//! counters in time order, names for every process and track.

use std::collections::{BTreeMap, HashMap};

use hetero_trace::{write_chrome_trace, EngineKind, MemKind, MemRecord, OpKind, OpRecord, Trace};
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
        graphs: BTreeMap::new(),
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

/// Checks every structural property; returns the number of X slices.
fn check_structure(events: &[Value]) -> usize {
    let key = |e: &Value| {
        (
            e["pid"].as_u64().expect("pid"),
            e["tid"].as_u64().expect("tid"),
        )
    };
    let mut slices: HashMap<(u64, u64), Vec<(i64, i64)>> = HashMap::new();
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
                slices.entry(key(e)).or_default().push((ts, ts + dur));
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
    // Properly nested: sorted by (start, longest first), each slice either
    // ends before the next starts or contains it.
    let mut count = 0;
    for (track, list) in &mut slices {
        list.sort_by_key(|&(s, e)| (s, std::cmp::Reverse(e)));
        let mut stack: Vec<(i64, i64)> = Vec::new();
        for &(s, e) in list.iter() {
            while stack.last().is_some_and(|&(_, pe)| pe <= s) {
                stack.pop();
            }
            if let Some(&(ps, pe)) = stack.last() {
                assert!(
                    ps <= s && e <= pe,
                    "track {track:?}: slice {s}..{e} overlaps {ps}..{pe}"
                );
            }
            stack.push((s, e));
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
            .is_some_and(|l| l.iter().any(|&(s, end)| s <= t && t <= end));
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
            0..4u64,
            0..5usize,
            0..3u32,
            0..20u64,
            0..10_000u64,
            prop_oneof![Just(0u64), Just(1u64), 0..3_000u64],
            proptest::option::of((0..5u64, 0..20u64)),
        )
            .prop_map(|(stream, engine, index, seq, start, dur, dep)| {
                let kind = if dep.is_some() {
                    OpKind::Wait
                } else {
                    OpKind::Kernel
                };
                let mut o = op(kind, stream, seq, ENGINES[engine], start, start + dur);
                o.engine_index = index;
                o.dep = dep;
                o
            })
    }

    proptest! {
        /// Whatever the recorder hands over (overlaps, zero-length ops,
        /// waits on unknown values), the export stays well formed.
        #[test]
        fn chrome_trace_structure_of_random_ops(ops in proptest::collection::vec(any_op(), 0..60)) {
            let mut trace = Trace { ops, ..Trace::default() };
            trace.sort();
            let events = export(&trace);
            prop_assert_eq!(check_structure(&events), 2 * trace.ops.len());
        }
    }
}
