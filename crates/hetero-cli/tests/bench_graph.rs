//! `hetero bench graph --quick --json` on the host and the emulated device:
//! every named result and ratio is there and finite. No figure is asserted
//! against a threshold (timing thresholds live in the benchmarks).
#![cfg(feature = "bench")] // `hetero bench` exists in builds with the feature

use serde_json::Value;
use std::process::Command;

const RESULTS: &[&str] = &[
    "hetero/graph-launch",
    "stream/launch",
    "hetero/graph-replay-per-node",
    "stream/replay-per-node",
    "hetero/graph-replay-host-per-node",
    "stream/replay-host-per-node",
    "hetero/graph-vs-stream",
    "hetero/graph-vs-stream-host",
    "stream/sync-round-trip",
    "hetero/graph-replay-per-node-forkjoin",
    "stream/replay-per-node-forkjoin",
    "hetero/graph-update-per-node",
    "hetero/graph-update-per-node-k1",
    "hetero/graph-update-per-node-k10",
    "hetero/graph-update-per-node-k100",
    "hetero/graph-update-per-node-k1000",
    "hetero/graph-rebind-per-slot-k1",
    "hetero/graph-rebind-per-slot-k10",
    "hetero/graph-rebind-per-slot-k100",
    "hetero/graph-rebind-per-slot-k1000",
    "hetero/graph-instantiate-per-node",
    "hetero/graph-instantiate-per-node-1k",
    "hetero/graph-instantiate-per-node-10k",
    "hetero/graph-instantiate-linearity",
    "hetero/capture-per-op",
    "hetero/capture-per-op-1k",
    "hetero/capture-per-op-10k",
    "hetero/capture-linearity",
    "hetero/graph-cholesky-over-bound",
    "stream/cholesky-over-bound",
    "hetero/graph-cholesky-critical-path",
    "hetero/graph-arena-over-peak",
    "greedy-by-size/graph-arena-over-peak",
    "naive/graph-arena-over-peak",
    "hetero/graph-arena-concurrent-over-sequential",
    "hetero/graph-arena-lanes-over-sequential",
];

const RATIOS: &[&str] = &[
    "graph-launch/graph-over-stream",
    "graph-replay/stream-over-graph",
    "graph-replay-host/stream-over-graph",
    "graph-replay-forkjoin/stream-over-graph",
    "graph-update/instantiate-over-update",
    "graph-instantiate/instantiate-over-launch",
    "capture/capture-over-launch",
    "capture/capture-over-launch-host",
    "graph-cholesky/stream-over-graph",
];

fn bench_graph(backend: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(["bench", "graph", "--quick", "--json"])
        .env("HETERO_BACKEND", backend)
        .output()
        .expect("run hetero");
    assert!(
        out.status.success(),
        "hetero bench graph on {backend} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

fn check(v: &Value) {
    assert_eq!(v["bench"], "graph");
    let results = v["results"].as_array().expect("results");
    for &name in RESULTS {
        let r = results
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing in {v}"));
        for k in ["median", "p99"] {
            let x = r[k].as_f64().unwrap_or(f64::NAN);
            assert!(x.is_finite(), "{name}.{k} is not finite: {r}");
        }
        assert!(
            r["n"].as_u64().is_some_and(|n| n > 0),
            "{name} has no samples: {r}"
        );
    }
    for &key in RATIOS {
        let x = v["ratios"][key].as_f64().unwrap_or(f64::NAN);
        assert!(
            x.is_finite(),
            "ratio {key} missing or not finite: {}",
            v["ratios"]
        );
    }
    // The DAG's shape, not a timing: POTRF, TRSM, SYRK per step, 16 steps.
    let cp = results
        .iter()
        .find(|r| r["name"] == "hetero/graph-cholesky-critical-path")
        .expect("checked above");
    assert_eq!(cp["median"].as_f64(), Some(46.0), "{cp}");
}

#[test]
fn bench_graph_on_the_host_reports_every_figure() {
    check(&bench_graph("host"));
}

#[test]
fn bench_graph_on_the_emulated_device_reports_every_figure() {
    check(&bench_graph("emu"));
}
