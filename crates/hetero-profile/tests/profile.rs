//! The report's numbers against hand-computed values from synthetic traces
//! (graph launches and their nodes included), the SVG timeline as XML with one
//! label per lane, and write_all's files.

use std::collections::BTreeMap;

use hetero_profile::{AllocatorStats, Report, ReportOptions};
use hetero_trace::{EngineKind, GraphPlan, MemKind, MemRecord, NodeRef, OpKind, OpRecord, Trace};

#[allow(clippy::too_many_arguments)]
fn op(
    kind: OpKind,
    stream: u64,
    engine: EngineKind,
    index: u32,
    submit: u64,
    start: u64,
    end: u64,
    bytes: u64,
) -> OpRecord {
    OpRecord {
        kind,
        name: kind.as_str(),
        stream,
        queue: 0,
        engine,
        engine_index: index,
        seq: start,
        submit_ns: submit,
        start_ns: start,
        end_ns: end,
        bytes,
        dep: None,
        failed: false,
        node: None,
    }
}

/// Window 0..4000 ns. H2D busy 2000 (10000 B → 5 GB/s), Compute 0 busy 2000,
/// Compute 1 busy 800 (two overlapping kernels), D2H busy 1000 (1000 B → 1 GB/s).
fn small() -> Trace {
    let mut k = op(OpKind::Kernel, 2, EngineKind::Compute, 0, 400, 500, 2500, 0);
    k.name = "matmul";
    let mut trace = Trace {
        ops: vec![
            op(OpKind::H2D, 1, EngineKind::CopyH2D, 0, 0, 0, 1000, 4000),
            op(OpKind::H2D, 1, EngineKind::CopyH2D, 0, 0, 2000, 3000, 6000),
            k,
            op(OpKind::Kernel, 3, EngineKind::Compute, 1, 100, 100, 600, 0),
            op(OpKind::Kernel, 3, EngineKind::Compute, 1, 100, 400, 900, 0),
            op(
                OpKind::D2H,
                4,
                EngineKind::CopyD2H,
                0,
                2900,
                3000,
                4000,
                1000,
            ),
        ],
        mem: vec![
            MemRecord {
                kind: MemKind::ChunkMap,
                ts_ns: 10,
                bytes: 1 << 21,
                stream: 0,
                reserved: 1 << 21,
                allocated: 0,
            },
            MemRecord {
                kind: MemKind::Alloc,
                ts_ns: 20,
                bytes: 4096,
                stream: 1,
                reserved: 1 << 21,
                allocated: 4096,
            },
            MemRecord {
                kind: MemKind::Free,
                ts_ns: 30,
                bytes: 4096,
                stream: 1,
                reserved: 1 << 21,
                allocated: 0,
            },
        ],
        device_name: "host (test)".into(),
        stream_names: BTreeMap::from([(4, "<out&back>".to_string())]),
        ..Trace::default()
    };
    trace.sort();
    trace
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn report_utilization_bytes_bandwidth_match_records() {
    let options = ReportOptions {
        link_peak_gbps: Some(10.0),
        ..ReportOptions::default()
    };
    let r = Report::build(&small(), &options);
    assert_eq!(
        (r.window_start_ns, r.window_end_ns, r.wall_ns),
        (0, 4000, 4000)
    );
    assert_eq!(r.ops, 6);
    let names: Vec<&str> = r.engines.iter().map(|e| e.engine.as_str()).collect();
    assert_eq!(
        names,
        ["Compute 0", "Compute 1", "Copy H2D 0", "Copy D2H 0"]
    );
    let by = |name: &str| {
        r.engines
            .iter()
            .find(|e| e.engine == name)
            .expect("engine present")
    };
    let h2d = by("Copy H2D 0");
    assert_eq!((h2d.ops, h2d.busy_ns, h2d.bytes), (2, 2000, 10_000));
    assert!(close(h2d.utilization, 0.5));
    assert!(close(h2d.bandwidth_gbps.expect("copy engine"), 5.0));
    assert!(close(h2d.peak_fraction.expect("peak given"), 0.5));
    let d2h = by("Copy D2H 0");
    assert!(close(d2h.utilization, 0.25));
    assert!(close(d2h.bandwidth_gbps.expect("copy engine"), 1.0));
    assert!(close(by("Compute 0").utilization, 0.5));
    assert_eq!(by("Compute 1").busy_ns, 800, "overlapping ops count once");
    assert_eq!(
        by("Compute 0").bandwidth_gbps,
        None,
        "no bandwidth for compute"
    );

    // Streams: names, busy, bytes.
    let s4 = r.streams.iter().find(|s| s.stream == 4).expect("stream 4");
    assert_eq!(s4.name, "stream 4 (<out&back>)");
    assert_eq!((s4.ops, s4.busy_ns, s4.bytes), (1, 1000, 1000));

    // Idle gaps: H2D idle 1000..2000; others none.
    let gaps = r
        .idle_gaps
        .iter()
        .find(|g| g.engine == "Copy H2D 0")
        .expect("gaps of H2D");
    assert_eq!(gaps.idle_ns, 1000);
    assert_eq!(
        (
            gaps.gaps[0].start_ns,
            gaps.gaps[0].end_ns,
            gaps.gaps[0].duration_ns
        ),
        (1000, 2000, 1000)
    );
    assert!(r
        .idle_gaps
        .iter()
        .filter(|g| g.engine != "Copy H2D 0")
        .all(|g| g.gaps.is_empty()));

    // Longest: the 2000 ns kernel first.
    assert_eq!(r.longest_ops[0].name, "matmul");
    assert_eq!(r.longest_ops[0].duration_ns, 2000);
    assert_eq!(r.longest_ops.len(), 6);

    // Memory events.
    let m = r.memory.as_ref().expect("mem events");
    assert_eq!(
        (m.allocs, m.frees, m.chunk_maps, m.chunk_unmaps),
        (1, 1, 1, 0)
    );
    assert_eq!(
        (m.peak_reserved, m.peak_allocated, m.final_allocated),
        (1 << 21, 4096, 0)
    );
    assert!(r.allocator.is_none());
}

#[test]
fn report_percentiles_match_records() {
    // 100 kernels: exec i µs, queued 10·i ns, for i in 1..=100, in shuffled order.
    let mut ops = Vec::new();
    for j in 0..100u64 {
        let i = (j * 37) % 100 + 1;
        let start = 1_000_000 + j * 200_000;
        ops.push(op(
            OpKind::Kernel,
            1,
            EngineKind::Compute,
            0,
            start - 10 * i,
            start,
            start + i * 1000,
            0,
        ));
    }
    let mut trace = Trace {
        ops,
        ..Trace::default()
    };
    trace.sort();
    let r = Report::build(&trace, &ReportOptions::default());
    assert_eq!(r.latency.len(), 1);
    let l = &r.latency[0];
    assert_eq!((l.kind.as_str(), l.count), ("Kernel", 100));
    let within = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 0.001;
    for (got, want) in [
        (l.exec.p50_ns, 50_000),
        (l.exec.p90_ns, 90_000),
        (l.exec.p99_ns, 99_000),
    ] {
        assert!(within(got, want), "exec percentile {got} vs {want}");
    }
    assert_eq!(l.exec.max_ns, 100_000);
    assert!(close(l.exec.mean_ns, 50_500.0));
    for (got, want) in [
        (l.queued.p50_ns, 500),
        (l.queued.p90_ns, 900),
        (l.queued.p99_ns, 990),
    ] {
        assert!(within(got, want), "queued percentile {got} vs {want}");
    }
    assert_eq!(l.queued.max_ns, 1000);
    assert_eq!(r.longest_ops.len(), 10, "top_n defaults to 10");
    assert_eq!(r.longest_ops[0].duration_ns, 100_000);
    assert!(r
        .longest_ops
        .windows(2)
        .all(|w| w[0].duration_ns >= w[1].duration_ns));
}

#[test]
fn report_allocator_json_and_markdown() {
    let options = ReportOptions {
        allocator: Some(AllocatorStats {
            cache_hits: 90,
            cache_misses: 10,
            fragmentation: 0.25,
            reserved_bytes: 1 << 30,
            allocated_bytes: 1 << 29,
        }),
        top_n: 2,
        ..ReportOptions::default()
    };
    let r = Report::build(&small(), &options);
    let a = r.allocator.as_ref().expect("allocator given");
    assert!(close(a.hit_rate.expect("some allocations"), 0.9));
    assert_eq!(r.longest_ops.len(), 2);

    let json: serde_json::Value =
        serde_json::from_str(&r.to_json().expect("serializes")).expect("valid JSON");
    assert_eq!(json["engines"][2]["engine"], "Copy H2D 0");
    assert_eq!(json["engines"][2]["bytes"], 10_000);
    assert_eq!(json["allocator"]["stats"]["cache_hits"], 90);
    assert_eq!(json["wall_ns"], 4000);

    let md = r.to_markdown();
    for want in [
        "# hetero profile: host (test)",
        "## Engines",
        "| Copy H2D 0 | 2 |",
        "50.0 %",
        "## Latency",
        "## Longest operations",
        "| matmul |",
        "## Idle gaps",
        "## Allocator",
        "cache hit rate: 90.0 %",
        "fragmentation: 25.0 %",
    ] {
        assert!(md.contains(want), "markdown lacks {want:?}:\n{md}");
    }
}

#[test]
fn report_of_empty_trace() {
    let r = Report::build(&Trace::default(), &ReportOptions::default());
    assert_eq!((r.wall_ns, r.ops), (0, 0));
    assert!(r.engines.is_empty() && r.latency.is_empty() && r.memory.is_none());
    assert!(r.to_markdown().contains("0 ops"));
    let svg = hetero_profile::timeline_svg(&Trace::default()).expect("renders");
    roxmltree::Document::parse(&svg).expect("empty timeline is XML");
}

#[test]
fn timeline_svg_parses_with_one_label_per_lane() {
    let trace = small();
    let svg = hetero_profile::timeline_svg(&trace).expect("renders");
    let doc = roxmltree::Document::parse(&svg).expect("timeline.svg is XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect();
    let labels = hetero_profile::lane_labels(&trace);
    // 4 engines + 4 streams used.
    assert_eq!(labels.len(), 8);
    for want in [
        "Compute 0",
        "Compute 1",
        "Copy H2D 0",
        "Copy D2H 0",
        "stream 1",
        "stream 2",
        "stream 3",
        "stream 4 (<out&back>)",
    ] {
        assert!(labels.iter().any(|l| l == want), "no lane {want:?}");
        let n = texts.iter().filter(|t| *t == want).count();
        assert_eq!(n, 1, "lane label {want:?} appears {n} times in {texts:?}");
    }
    // Legend: the kinds present, and the axis title.
    for want in ["H2D", "D2H", "Kernel", "time (ms)"] {
        assert!(texts.iter().any(|t| t == want), "no {want:?} in {texts:?}");
    }
    // Bars: at least one rect per op and lane pair (stream + engine).
    let rects = doc.descendants().filter(|n| n.has_tag_name("rect")).count();
    assert!(rects >= 2 * trace.ops.len());
}

#[test]
fn write_all_writes_four_files() {
    let dir = std::env::temp_dir().join(format!("hetero-profile-test-{}", std::process::id()));
    let paths = hetero_profile::write_all(&small(), &dir).expect("writes");
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&paths.trace_json).expect("trace.json"))
            .expect("trace.json is JSON");
    assert!(trace["traceEvents"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&paths.report_json).expect("report.json"))
            .expect("report.json is JSON");
    assert_eq!(report["ops"], 6);
    let md = std::fs::read_to_string(&paths.report_md).expect("report.md");
    assert!(md.starts_with("# hetero profile"));
    let svg = std::fs::read_to_string(&paths.timeline_svg).expect("timeline.svg");
    roxmltree::Document::parse(&svg).expect("timeline.svg is XML");
    assert_eq!(paths.report_md, dir.join("report.md"));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// Two launches (stream 1, values 5 and 6) of graph 3, a fork/join of four
/// nodes: A (kernel, lane 0) → B (kernel, lane 0) and C (H2D, lane 1) → D
/// (D2H, lane 0). Before them an H2D of 2000 B; after them a launch on stream
/// 2 that recorded no node. Each launch's bytes are its nodes' (1500), as the
/// runtime records them.
///
/// | launch | span | A | B | C | D |
/// | --- | --- | --- | --- | --- | --- |
/// | 1 | 10..20 µs | C0 11..13 | C0 13..17 | H2D 13.5..15.5 | D2H 17.5..19 |
/// | 2 | 30..44 µs | C0 31..33 | C1 33..39 | H2D 33..36 | D2H 40..42 |
fn two_launches() -> Trace {
    let launch = |seq: u64, start: u64, end: u64| {
        let mut l = op(
            OpKind::Graph,
            1,
            EngineKind::Compute,
            0,
            start - 500,
            start,
            end,
            1500,
        );
        l.seq = seq;
        l.name = "graph";
        l
    };
    let node = |seq: u64,
                n: u32,
                lane: u32,
                (kind, engine, index): (OpKind, EngineKind, u32),
                start: u64,
                end: u64| {
        let bytes = match kind {
            OpKind::H2D => 1000,
            OpKind::D2H => 500,
            _ => 0,
        };
        let mut o = op(kind, 1, engine, index, start - 1000, start, end, bytes);
        o.seq = seq;
        o.name = ["A", "B", "C", "D"][n as usize];
        o.node = Some(NodeRef {
            graph: 3,
            node: n,
            lane,
        });
        o
    };
    let k0 = (OpKind::Kernel, EngineKind::Compute, 0);
    let up = (OpKind::H2D, EngineKind::CopyH2D, 0);
    let down = (OpKind::D2H, EngineKind::CopyD2H, 0);
    let mut h2d = op(OpKind::H2D, 1, EngineKind::CopyH2D, 0, 0, 0, 5_000, 2000);
    h2d.seq = 4;
    let mut empty = op(
        OpKind::Graph,
        2,
        EngineKind::Compute,
        0,
        50_000,
        50_000,
        50_100,
        0,
    );
    empty.seq = 1;
    let mut trace = Trace {
        ops: vec![
            h2d,
            launch(5, 10_000, 20_000),
            node(5, 0, 0, k0, 11_000, 13_000),
            node(5, 1, 0, k0, 13_000, 17_000),
            node(5, 2, 1, up, 13_500, 15_500),
            node(5, 3, 0, down, 17_500, 19_000),
            launch(6, 30_000, 44_000),
            node(6, 0, 0, k0, 31_000, 33_000),
            node(
                6,
                1,
                0,
                (OpKind::Kernel, EngineKind::Compute, 1),
                33_000,
                39_000,
            ),
            node(6, 2, 1, up, 33_000, 36_000),
            node(6, 3, 0, down, 40_000, 42_000),
            empty,
        ],
        graphs: BTreeMap::from([(
            3,
            GraphPlan {
                nodes: 4,
                edges: 4,
                chains: 2,
                lanes: 2,
                critical_path: 3,
                width: 2,
                internal_bytes: 8192,
                arena_bytes: 4096,
            },
        )]),
        ..Trace::default()
    };
    trace.sort();
    trace
}

#[test]
fn report_counts_a_launch_or_its_nodes_never_both() {
    let r = Report::build(&two_launches(), &ReportOptions::default());
    // Submitted: the H2D and three launches; the nodes apart.
    assert_eq!((r.ops, r.graph_nodes, r.failed_ops), (4, 8, 0));

    // Engines count the nodes they ran, not the launches that contain them
    // (the launch that recorded no node counts as work on Compute 0).
    let by = |name: &str| {
        r.engines
            .iter()
            .find(|e| e.engine == name)
            .unwrap_or_else(|| panic!("engine {name}"))
    };
    let c0 = by("Compute 0");
    assert_eq!((c0.ops, c0.busy_ns, c0.bytes), (4, 8_100, 0));
    let c1 = by("Compute 1");
    assert_eq!((c1.ops, c1.busy_ns), (1, 6_000));
    let up = by("Copy H2D 0");
    assert_eq!((up.ops, up.busy_ns, up.bytes), (3, 10_000, 4_000));
    let down = by("Copy D2H 0");
    assert_eq!((down.ops, down.busy_ns, down.bytes), (2, 3_500, 1_000));
    let engine_bytes: u64 = r.engines.iter().map(|e| e.bytes).sum();
    assert_eq!(
        engine_bytes,
        2_000 + 2 * 1_500,
        "launch bytes not added to their nodes'"
    );
    let engine_ops: u64 = r.engines.iter().map(|e| e.ops).sum();
    assert_eq!(engine_ops, 1 + 8 + 1);
    let gaps = r
        .idle_gaps
        .iter()
        .find(|g| g.engine == "Compute 0")
        .expect("gaps of Compute 0");
    // Idle between its nodes, 17..31 µs and 33..50 µs, not covered by the launches.
    assert_eq!(gaps.idle_ns, 14_000 + 17_000);

    // Streams and latency count the launch once, its nodes not.
    let s1 = r.streams.iter().find(|s| s.stream == 1).expect("stream 1");
    assert_eq!(
        (s1.ops, s1.busy_ns, s1.bytes),
        (3, 5_000 + 10_000 + 14_000, 5_000)
    );
    let kinds: Vec<(&str, u64)> = r
        .latency
        .iter()
        .map(|l| (l.kind.as_str(), l.count))
        .collect();
    assert_eq!(kinds, [("H2D", 1), ("Graph", 3)]);
    let graph = r.latency.iter().find(|l| l.kind == "Graph").expect("Graph");
    assert_eq!(graph.exec.max_ns, 14_000);
    let longest: Vec<(&str, u64)> = r
        .longest_ops
        .iter()
        .map(|o| (o.name.as_str(), o.duration_ns))
        .collect();
    assert_eq!(
        longest,
        [
            ("graph", 14_000),
            ("graph", 10_000),
            ("H2D", 5_000),
            ("Graph", 100)
        ]
    );
}

#[test]
fn report_graphs_section_of_two_launches() {
    let r = Report::build(&two_launches(), &ReportOptions::default());
    assert_eq!(r.launches_without_nodes, 1);
    assert_eq!(r.graphs.len(), 1);
    let g = &r.graphs[0];
    assert_eq!(g.graph, 3);
    let plan = g.plan.expect("the plan is in the trace");
    assert_eq!(
        (
            plan.nodes,
            plan.chains,
            plan.lanes,
            plan.critical_path,
            plan.width
        ),
        (4, 2, 2, 3, 2)
    );
    assert_eq!((plan.internal_bytes, plan.arena_bytes), (8192, 4096));
    assert_eq!((g.launches, g.failed_launches, g.nodes), (2, 0, 8));
    assert_eq!((g.unmatched_nodes, g.nodes_outside_launch), (0, 0));
    // Launch times 10 and 14 µs.
    assert_eq!(g.launch_ns, 24_000);
    assert_eq!(g.launch_time.max_ns, 14_000);
    let within = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 0.001;
    assert!(
        within(g.launch_time.p50_ns, 10_000),
        "{}",
        g.launch_time.p50_ns
    );
    assert!(
        within(g.launch_time.p99_ns, 14_000),
        "{}",
        g.launch_time.p99_ns
    );
    // Nodes: 9.5 µs in launch 1, 13 µs in launch 2; some node ran 7.5 + 10 µs.
    assert_eq!(g.node_ns, 22_500);
    assert!(close(g.parallelism, 22_500.0 / 24_000.0));
    assert!(close(g.busy_fraction, 17_500.0 / 24_000.0));
    let lanes: Vec<(u32, u64, u64)> = g
        .lanes
        .iter()
        .map(|l| (l.lane, l.nodes, l.busy_ns))
        .collect();
    assert_eq!(lanes, [(0, 6, 17_500), (1, 2, 5_000)]);
    assert!(close(g.lanes[1].busy_fraction, 5_000.0 / 24_000.0));
    let kinds: Vec<(&str, u64, u64, u64)> = g
        .kinds
        .iter()
        .map(|k| (k.kind.as_str(), k.count, k.total_ns, k.bytes))
        .collect();
    assert_eq!(
        kinds,
        [
            ("H2D", 2, 5_000, 2_000),
            ("D2H", 2, 3_500, 1_000),
            ("Kernel", 4, 14_000, 0)
        ]
    );

    let json: serde_json::Value =
        serde_json::from_str(&r.to_json().expect("serializes")).expect("valid JSON");
    assert_eq!(json["graphs"][0]["plan"]["arena_bytes"], 4096);
    assert_eq!(json["graphs"][0]["lanes"][1]["nodes"], 2);
    assert_eq!(json["graph_nodes"], 8);

    let md = r.to_markdown();
    for want in [
        "4 ops (0 failed) over 50.1 µs of wall time. 3 of them graph launches, which ran 8 nodes.",
        "## Graphs",
        "1 launch recorded no node",
        "### Graph 3",
        "Plan: 4 nodes, 4 edges, 2 chains on 2 lanes, critical path 3, width 2; \
         internal buffers 8.0 KiB in an arena of 4.0 KiB.",
        "2 launches (0 failed), 8 node records: launch time median 10.0 µs, p99 14.0 µs; \
         nodes busy 72.9 % of the launch span, parallelism 0.94.",
        "| 0 | 6 | 17.5 µs | 72.9 % |",
        "| 1 | 2 | 5.0 µs | 20.8 % |",
        "| Kernel | 4 | 14.0 µs | 0 B |",
    ] {
        assert!(md.contains(want), "markdown lacks {want:?}:\n{md}");
    }
    assert!(!md.contains("Recorder:"), "no recorder problem here");

    // One launch: a median, no p99.
    let mut one = two_launches();
    one.ops.retain(|o| o.seq != 6);
    let md = Report::build(&one, &ReportOptions::default()).to_markdown();
    assert!(md.contains("launch time median 10.0 µs;"), "{md}");
}

#[test]
fn report_graphs_flags_nodes_the_recorder_misplaced() {
    let mut trace = two_launches();
    // A node with no launch of its value, and one that ends after its launch.
    let mut stray = trace.ops[2];
    stray.seq = 99;
    trace.ops.push(stray);
    let late = trace
        .ops
        .iter_mut()
        .find(|o| o.seq == 5 && o.name == "D")
        .expect("D of launch 1");
    late.end_ns = 21_000;
    trace.sort();
    let r = Report::build(&trace, &ReportOptions::default());
    let g = &r.graphs[0];
    assert_eq!(
        (g.nodes, g.unmatched_nodes, g.nodes_outside_launch),
        (8, 1, 1)
    );
    // Clipped to the launch: lane 0 of launch 1 is busy 11..17 and 17.5..20.
    assert_eq!(g.lanes[0].busy_ns, 6_000 + 2_500 + 10_000);
    assert!(r.to_markdown().contains(
        "Recorder: 1 node record with no launch of their stream and value, 1 outside their launch's span."
    ));
}

#[test]
fn timeline_svg_shows_graph_lanes_and_launches() {
    let trace = two_launches();
    let labels = hetero_profile::lane_labels(&trace);
    assert_eq!(
        labels,
        [
            "Compute 0",
            "Compute 1",
            "Copy H2D 0",
            "Copy D2H 0",
            "stream 1",
            "stream 1 graph lane 1",
            "stream 2",
        ]
    );
    let svg = hetero_profile::timeline_svg(&trace).expect("renders");
    let doc = roxmltree::Document::parse(&svg).expect("timeline.svg is XML");
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect();
    for want in ["Graph", "Kernel", "stream 1 graph lane 1"] {
        assert!(texts.iter().any(|t| t == want), "no {want:?} in {texts:?}");
    }
    // The launch colour is there, as a bar and in the legend.
    let graph_fill = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect"))
        .filter(|n| {
            n.attribute("fill")
                .is_some_and(|f| f.eq_ignore_ascii_case("#DBDB8D"))
        })
        .count();
    assert!(graph_fill >= 4, "legend and three launches: {graph_fill}");
}
