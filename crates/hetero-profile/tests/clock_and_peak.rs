//! The report's clock and link-peak comparisons, from synthetic traces: a
//! trace on a device's virtual clock reads "device time", not "wall time";
//! only copies that cross the link (H2D, D2H) are measured against its peak,
//! not on-device copies or fills (the D2D engine).

use hetero_profile::{Report, ReportOptions};
use hetero_trace::{EngineKind, OpKind, OpRecord, Trace, TraceClock};

fn op(kind: OpKind, engine: EngineKind, start: u64, end: u64, bytes: u64) -> OpRecord {
    OpRecord {
        kind,
        name: kind.as_str(),
        stream: 1,
        queue: 0,
        engine,
        engine_index: 0,
        seq: start,
        submit_ns: start,
        start_ns: start,
        end_ns: end,
        bytes,
        dep: None,
        failed: false,
        node: None,
    }
}

/// Window 0..4000 ns. H2D: 10 000 B in 1000 ns (10 GB/s); D2H: 5000 B in
/// 1000 ns (5 GB/s); D2D: a copy of 60 000 B and a fill of 20 000 B in
/// 1000 ns (80 GB/s, far above a 20 GB/s link, as device memory is).
fn copies(clock: TraceClock) -> Trace {
    let mut trace = Trace {
        ops: vec![
            op(OpKind::H2D, EngineKind::CopyH2D, 0, 1000, 10_000),
            op(OpKind::D2D, EngineKind::CopyD2D, 1000, 1500, 60_000),
            op(OpKind::Fill, EngineKind::CopyD2D, 1500, 2000, 20_000),
            op(OpKind::Kernel, EngineKind::Compute, 2000, 3000, 0),
            op(OpKind::D2H, EngineKind::CopyD2H, 3000, 4000, 5_000),
        ],
        device_name: "emu (test)".into(),
        clock,
        ..Trace::default()
    };
    trace.sort();
    trace
}

fn with_peak() -> ReportOptions {
    ReportOptions {
        link_peak_gbps: Some(20.0),
        ..ReportOptions::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn virtual_clock_report_says_device_time_not_wall_time() {
    let r = Report::build(&copies(TraceClock::Virtual), &with_peak());
    assert_eq!(r.clock, "virtual");
    assert_eq!(r.wall_ns, 4000, "the field keeps its name on any clock");
    let md = r.to_markdown();
    assert!(
        md.contains("5 ops (0 failed) over 4.0 µs of device time."),
        "{md}"
    );
    assert!(md.contains("over the device time;"), "{md}");
    assert!(md.contains("virtual clock"), "{md}");
    assert!(!md.contains("wall time"), "{md}");

    let json: serde_json::Value =
        serde_json::from_str(&r.to_json().expect("serializes")).expect("valid JSON");
    assert_eq!(json["clock"], "virtual");
    assert_eq!(json["wall_ns"], 4000);
}

#[test]
fn wall_clock_report_says_wall_time() {
    let r = Report::build(&copies(TraceClock::Wall), &with_peak());
    assert_eq!(r.clock, "wall");
    let md = r.to_markdown();
    assert!(
        md.contains("5 ops (0 failed) over 4.0 µs of wall time."),
        "{md}"
    );
    assert!(!md.contains("device time") && !md.contains("virtual clock"));
    let json: serde_json::Value =
        serde_json::from_str(&r.to_json().expect("serializes")).expect("valid JSON");
    assert_eq!(json["clock"], "wall");
}

#[test]
fn a_report_without_a_clock_reads_as_wall() {
    let r = Report::build(&copies(TraceClock::Wall), &ReportOptions::default());
    let mut json: serde_json::Value =
        serde_json::from_str(&r.to_json().expect("serializes")).expect("valid JSON");
    json.as_object_mut().expect("an object").remove("clock");
    let old: Report = serde_json::from_value(json).expect("an older report still parses");
    assert_eq!(old.clock, "wall");
}

#[test]
fn only_copies_across_the_link_are_measured_against_its_peak() {
    let r = Report::build(&copies(TraceClock::Virtual), &with_peak());
    let by = |name: &str| {
        r.engines
            .iter()
            .find(|e| e.engine == name)
            .unwrap_or_else(|| panic!("{name} in the report"))
    };
    let h2d = by("Copy H2D 0");
    assert!(close(h2d.bandwidth_gbps.expect("a copy engine"), 10.0));
    assert!(close(h2d.peak_fraction.expect("H2D crosses the link"), 0.5));
    let d2h = by("Copy D2H 0");
    assert!(close(
        d2h.peak_fraction.expect("D2H crosses the link"),
        0.25
    ));
    let d2d = by("Copy D2D 0");
    assert!(
        close(d2d.bandwidth_gbps.expect("still a bandwidth"), 80.0),
        "{d2d:?}"
    );
    assert_eq!(d2d.peak_fraction, None, "on-device copies and fills");
    assert_eq!(by("Compute 0").peak_fraction, None);

    let json: serde_json::Value =
        serde_json::from_str(&r.to_json().expect("serializes")).expect("valid JSON");
    let engines = json["engines"].as_array().expect("engines");
    let d2d = engines
        .iter()
        .find(|e| e["engine"] == "Copy D2D 0")
        .expect("D2D in the JSON");
    assert!(d2d["peak_fraction"].is_null(), "{d2d}");
    assert!(d2d["bandwidth_gbps"].as_f64().is_some());

    let md = r.to_markdown();
    assert!(md.contains("| Copy H2D 0 | 1 |"), "{md}");
    assert!(md.contains("| 10.00 GB/s | 50.0 % |"), "{md}");
    assert!(md.contains("| 5.00 GB/s | 25.0 % |"), "{md}");
    assert!(md.contains("| 80.00 GB/s | - |"), "{md}");
    assert!(!md.contains("400.0 %"), "no D2D fraction of the link: {md}");
    assert!(md.contains("Link peak: 20.00 GB/s"), "{md}");
}

/// A trace the recorder cut at its bound says so in the report (markdown and
/// JSON); a whole one says nothing; an older report without the field
/// reads as whole.
#[test]
fn a_report_of_a_cut_trace_counts_the_dropped_records() {
    let whole = Report::build(&copies(TraceClock::Wall), &with_peak());
    assert_eq!(whole.dropped_records, 0);
    assert!(!whole.to_markdown().contains("dropped"));
    let cut = Trace {
        dropped: 1234,
        ..copies(TraceClock::Wall)
    };
    let r = Report::build(&cut, &with_peak());
    assert!(r.to_markdown().contains("**1234 records were dropped**"));
    let mut json: serde_json::Value =
        serde_json::from_str(&r.to_json().expect("serializes")).expect("valid JSON");
    assert_eq!(json["dropped_records"], 1234);
    json.as_object_mut()
        .expect("an object")
        .remove("dropped_records");
    let old: Report = serde_json::from_value(json).expect("an older report still parses");
    assert_eq!(old.dropped_records, 0);
}
