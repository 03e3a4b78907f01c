//! `hetero bench vmm --quick --json` reports every result the issue names,
//! each finite and with its peers, and ratios that are positive (no timing
//! threshold: those live in the benchmark's figures).
#![cfg(feature = "bench")] // `hetero bench` exists in builds with the feature

use serde_json::Value;
use std::process::Command;

const RESULTS: &[&str] = &[
    "hetero/vmm-grow-cached",
    "hetero/vmm-grow-cold",
    "hetero/vmm-grow-cold-shareable",
    "hetero/vmm-grow-cached-private",
    "hetero/segment-grow-cold",
    "hetero/vmm-map-10-granules-over-one-run",
    "hetero/ipc-import-first",
    "hetero/ipc-import-cached",
    "hetero/ipc-read-over-local",
    "hetero/ipc-read-over-exporter-map",
    "hetero/stranded-over-live-churn",
    "hetero/reserved-over-live-churn",
    "chunked/reserved-over-live-churn",
    "mmap/anon-map-2m",
    "mmap/anon-map-touch-2m",
    "shm/open-and-map-64m",
    "shm/read",
    "local/memcpy-read",
];

#[test]
fn bench_vmm_reports_every_figure() {
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(["bench", "vmm", "--quick", "--json"])
        .output()
        .expect("run hetero");
    assert!(
        out.status.success(),
        "hetero bench vmm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(v["bench"], "vmm");
    let results = v["results"].as_array().expect("results");
    for &name in RESULTS {
        let r = results
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing in {v}"));
        let median = r["median"].as_f64().expect("median");
        assert!(median.is_finite() && median > 0.0, "{name}: {r}");
    }
    let notes = v["notes"].as_array().expect("notes");
    assert!(
        results
            .iter()
            .any(|r| r["name"] == "mmap/hugetlb-map-touch-2m")
            || notes
                .iter()
                .any(|n| n.as_str().is_some_and(|s| s.contains("MAP_HUGETLB"))),
        "the MAP_HUGETLB peer ran or a note says why not: {v}"
    );
}
