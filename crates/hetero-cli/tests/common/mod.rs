//! Shared by the bench tests: run `hetero bench NAME --quick --json` and read
//! its figures.

use serde_json::Value;
use std::process::Command;

/// The JSON object of `hetero bench <bench> --quick --json` (the run must
/// succeed and name the bench).
pub fn quick_json(bench: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(["bench", bench, "--quick", "--json"])
        .output()
        .expect("run hetero");
    assert!(
        out.status.success(),
        "bench {bench} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["bench"], bench);
    v
}

/// The ratio named `k`.
pub fn ratio(v: &Value, k: &str) -> f64 {
    v["ratios"][k]
        .as_f64()
        .unwrap_or_else(|| panic!("{k} in {v}"))
}

/// The median of the result named `name`.
pub fn median(v: &Value, name: &str) -> f64 {
    v["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {v}"))["median"]
        .as_f64()
        .expect("median")
}
