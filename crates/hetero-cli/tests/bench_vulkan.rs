//! `hetero bench vulkan --quick --json`: every named figure is there and
//! positive, or listed under `unavailable` with a reason. Skips (saying why)
//! where no Vulkan device exists. No figure is held to its target here (timing
//! thresholds live in the benchmarks).
#![cfg(feature = "bench")] // `hetero bench` exists in builds with the feature

use serde_json::Value;
use std::process::Command;

const FIGURES: &[&str] = &[
    "vulkan/dispatch-in-graph-ns",
    "ash/dispatch-in-cmdbuf-ns",
    "vulkan/op-end-to-end-ns",
    "ash/submit-wait-ns",
    "ash/submit-wait-reuse-ns",
    "vulkan/copy-64m-gbps",
    "ash/copy-64m-gbps",
    "vulkan/submits-per-op-running-ahead",
    "vulkan/running-ahead-per-op-ns",
    "vulkan/alloc-free-hit-ns",
    "ash/allocate-bind-free-ns",
];

#[test]
fn bench_vulkan_reports_every_figure_or_why_not() {
    match hetero::vulkan::devices() {
        Err(e) => {
            println!("skipped: no Vulkan here ({e})");
            return;
        }
        Ok(d) if d.is_empty() => {
            println!("skipped: the Vulkan loader lists no device");
            return;
        }
        Ok(_) => {}
    }
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(["bench", "vulkan", "--quick", "--json"])
        .env("LP_NUM_THREADS", "0")
        .output()
        .expect("run hetero");
    assert!(
        out.status.success(),
        "hetero bench vulkan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(v["bench"], "vulkan");
    assert_eq!(v["context"]["LP_NUM_THREADS"], "0", "{}", v["context"]);
    assert!(
        v["context"]["device"]
            .as_str()
            .is_some_and(|d| !d.is_empty()),
        "no device name: {}",
        v["context"]
    );
    let results = v["results"].as_array().expect("results");
    for &name in FIGURES {
        let found = results.iter().find(|r| r["name"] == name);
        let why = v["unavailable"][name].as_str();
        match (found, why) {
            (Some(r), None) => {
                for k in ["median", "p99"] {
                    let x = r[k].as_f64().unwrap_or(f64::NAN);
                    assert!(x.is_finite() && x > 0.0, "{name}.{k} is not positive: {r}");
                }
                assert!(r["n"].as_u64().is_some_and(|n| n > 0), "{name}: {r}");
            }
            (None, Some(why)) => assert!(!why.is_empty(), "{name} unavailable without a reason"),
            (Some(_), Some(_)) => panic!("{name} is both measured and unavailable: {v}"),
            (None, None) => panic!("{name} is neither measured nor unavailable: {v}"),
        }
    }
}
