//! The report's numbers against hand-computed values from synthetic traces,
//! the SVG timeline as XML with one label per lane, and write_all's files.

use std::collections::BTreeMap;

use hetero_profile::{AllocatorStats, Report, ReportOptions};
use hetero_trace::{EngineKind, MemKind, MemRecord, OpKind, OpRecord, Trace};

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
        graphs: BTreeMap::new(),
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
