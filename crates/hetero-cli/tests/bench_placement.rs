//! `hetero bench placement --quick`: its placement figures are modelled
//! (virtual time on emulated devices), hence deterministic; the targets of
//! issue 25 that hold are asserted on them. No wall-clock time is asserted
//! (the overhead and graph host-time figures are reported only).
#![cfg(feature = "bench")]

use serde_json::Value;
use std::process::Command;

#[test]
fn bench_placement_meets_its_modelled_targets() {
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(["bench", "placement", "--quick", "--json"])
        .output()
        .expect("run hetero");
    assert!(
        out.status.success(),
        "bench placement failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["bench"], "placement");
    let ratio = |k: &str| {
        v["ratios"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} in {v}"))
    };
    let value = |name: &str| -> f64 {
        v["results"]
            .as_array()
            .expect("results")
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {v}"))["median"]
            .as_f64()
            .expect("median")
    };
    assert!(ratio("cholesky/makespan-over-heft-dmda") <= 1.2, "{v}");
    assert!(ratio("cholesky/bytes-over-heft-dmda") <= 1.2, "{v}");
    assert!(ratio("drift/makespan-over-oracle-learned") <= 1.2, "{v}");
    assert!(ratio("drift/learned-over-dmda") <= 0.9, "{v}");
    assert!(value("outliers/work-share-shift") <= 10.0, "{v}");
    assert_eq!(value("models/second-run-calibration-tasks"), 0.0, "{v}");
    // Every policy ran every workload.
    for w in ["cholesky", "gemm", "random"] {
        for p in ["eager", "ws", "dmda", "dmdas", "learned"] {
            assert!(ratio(&format!("{w}/makespan-over-heft-{p}")) > 0.0);
        }
    }
}
