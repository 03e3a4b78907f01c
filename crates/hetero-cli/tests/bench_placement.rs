//! `hetero bench placement --quick`: its placement figures are modelled
//! (virtual time on emulated devices), hence deterministic; the targets of
//! issue 25 that hold are asserted on them. No wall-clock time is asserted
//! (the overhead and graph host-time figures are reported only).
#![cfg(feature = "bench")]

mod common;

#[test]
fn bench_placement_meets_its_modelled_targets() {
    let v = common::quick_json("placement");
    let ratio = |k: &str| common::ratio(&v, k);
    let value = |name: &str| common::median(&v, name);
    assert!(ratio("cholesky/makespan-over-heft-dmda") <= 1.2, "{v}");
    assert!(ratio("cholesky/bytes-over-heft-dmda") <= 1.2, "{v}");
    // Learned after its warm-up run no worse than dmda. Both makespans move
    // by a few percent with any change to what the policies see: a failure
    // here first wants a look at other sizes, not only this one.
    assert!(
        ratio("cholesky/makespan-over-heft-learned") <= ratio("cholesky/makespan-over-heft-dmda"),
        "{v}"
    );
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
