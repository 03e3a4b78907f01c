//! `hetero bench managed --quick`: its figures are modelled (virtual time on
//! the emulated device), hence deterministic; the targets of issue 24 are
//! asserted on them. No wall-clock time is asserted (the host-fault figures
//! are checked to be there).
#![cfg(feature = "bench")]

use serde_json::Value;
use std::process::Command;

#[test]
fn bench_managed_meets_its_modelled_targets() {
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(["bench", "managed", "--quick", "--json"])
        .output()
        .expect("run hetero");
    assert!(
        out.status.success(),
        "bench managed failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["bench"], "managed");
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
    assert!(ratio("emu/managed-pipeline-over-explicit") <= 1.05, "{v}");
    // On one stream the migrations still overlap the kernels (they run on
    // the stream's migration streams).
    assert!(ratio("emu/managed-one-stream-over-explicit") <= 1.05, "{v}");
    assert!(
        ratio("emu/oversubscribed-2x-bytes-over-minimum") <= 1.05,
        "{v}"
    );
    assert_eq!(value("emu/oversubscribed-2x-clean-evictions-copied"), 0.0);
    assert!(value("emu/oversubscribed-2x-clean-evictions") > 0.0, "{v}");
    assert!(
        value("emu/thrash-random-throttled-thrash-events") > 0.0,
        "{v}"
    );
    // A faulting device cannot beat declared migration; on one stream its
    // fault service cannot hide behind other streams' copies.
    assert!(ratio("emu/fault-driven-over-declared") >= 1.0, "{v}");
    assert!(
        ratio("emu/fault-driven-one-stream-over-declared") > 1.0,
        "{v}"
    );
    // The host-fault figures are wall time: present, not judged.
    for k in [
        "host/managed-first-touch-over-uffd",
        "host/managed-first-touch-over-mprotect",
        "host/managed-prefetch-to-host-over-fresh-memcpy",
        "host/managed-read-back-tree-over-64k",
    ] {
        assert!(ratio(k) > 0.0, "{k}: {v}");
    }
    assert!(
        v["unavailable"].as_object().is_none_or(|u| u.is_empty()),
        "nothing of bench managed is unavailable any more: {v}"
    );
}
