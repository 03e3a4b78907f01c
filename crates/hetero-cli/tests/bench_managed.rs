//! `hetero bench managed --quick`: its figures are modelled (virtual time on
//! the emulated device), hence deterministic; the targets of issue 24 are
//! asserted on them. No wall-clock time is asserted (the host-fault figures
//! are checked to be there).
#![cfg(feature = "bench")]

mod common;

#[test]
fn bench_managed_meets_its_modelled_targets() {
    let v = common::quick_json("managed");
    let ratio = |k: &str| common::ratio(&v, k);
    let value = |name: &str| common::median(&v, name);
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
