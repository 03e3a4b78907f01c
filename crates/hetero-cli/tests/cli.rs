//! The `hetero` binary end to end: the demo's JSON, HETERO_PROFILE, info, bench JSON.

use serde_json::Value;
use std::process::Command;

/// A small demo, as JSON.
const SMALL_DEMO: [&str; 8] = [
    "demo",
    "--json",
    "--tiles",
    "8",
    "--tile-kib",
    "32",
    "--reps",
    "1",
];

/// Runs `hetero` with `args` and `env`, whatever it returns.
fn run(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hetero"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run hetero")
}

/// Runs `hetero`, which must succeed and print one JSON object.
fn hetero(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Value {
    let out = run(args, env);
    assert!(
        out.status.success(),
        "hetero {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

#[test]
fn demo_json_is_verified_and_complete() {
    let path = std::env::temp_dir().join(format!("hetero-cli-trace-{}.json", std::process::id()));
    let v = hetero(&SMALL_DEMO, &[("HETERO_PROFILE", path.as_os_str())]);
    assert_eq!(v["verified"], true);
    for key in [
        "serial_ms",
        "pipelined_ms",
        "speedup",
        "bound_speedup",
        "tiles",
        "tile_bytes",
    ] {
        assert!(v[key].is_number(), "missing {key}: {v}");
    }
    assert_eq!(v["tiles"], 8);
    assert_eq!(v["tile_bytes"], 32 * 1024);
    // The host demo's peer ran beside it and produced the reference too.
    assert_eq!(v["spin_pair"]["verified"], true, "{v}");
    for key in ["serial_ms", "pipelined_ms", "speedup"] {
        assert!(
            v["spin_pair"][key].is_number(),
            "missing spin_pair.{key}: {v}"
        );
    }
    // HETERO_PROFILE: the trace was written when the device dropped.
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["cat"] == "Kernel"));
    assert_eq!(trace["otherData"]["dropped_records"], 0, "a whole trace");
    let _ = std::fs::remove_file(&path);
}

/// HETERO_PROFILE_MAX_RECORDS bounds what the recorder holds: a run past it
/// writes the records it kept, counts the rest in the trace, and says so.
#[test]
fn a_profile_past_its_bound_keeps_what_fits_and_says_what_it_dropped() {
    let path = std::env::temp_dir().join(format!("hetero-cli-cut-{}.json", std::process::id()));
    let env = [
        ("HETERO_PROFILE", path.as_os_str()),
        ("HETERO_PROFILE_MAX_RECORDS", "64".as_ref()),
    ];
    let out = run(&SMALL_DEMO, &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("HETERO_PROFILE_MAX_RECORDS"), "{stderr}");
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let dropped = trace["otherData"]["dropped_records"].as_u64().unwrap();
    assert!(dropped > 0, "the demo makes more than 64 records");
    let slices = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == 1)
        .count();
    assert!(
        slices > 0 && slices <= 64,
        "{slices} op slices kept of a bound of 64"
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn info_json_names_the_machine() {
    let v = hetero(&["info", "--json"], &[]);
    assert!(v["cores"].as_u64().unwrap() >= 1);
    assert!(v["mlock_works"].is_boolean());
    assert_eq!(v["backends"][0], "host");
    // The wake-up probe measured something, in order.
    let w = &v["wake_after_idle_us"];
    let q: Vec<f64> = ["p50", "p90", "p99", "max"]
        .iter()
        .map(|k| {
            w[*k]
                .as_f64()
                .unwrap_or_else(|| panic!("missing wake {k}: {v}"))
        })
        .collect();
    assert!(q[0] > 0.0 && q.windows(2).all(|p| p[0] <= p[1]), "{w}");
}

#[test]
#[cfg(feature = "bench")]
fn bench_json_has_the_shared_shape() {
    let v = hetero(&["bench", "submit", "--quick", "--json"], &[]);
    assert_eq!(v["bench"], "submit");
    let results = v["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for name in [
        "hetero/submit",
        "crossbeam-channel/send",
        "hetero/op-end-to-end",
        "hetero/op-end-to-end-8-streams",
        "crossbeam/task-end-to-end",
        "rayon/scope-end-to-end",
    ] {
        assert!(names.contains(&name), "{name} missing in {names:?}");
    }
    for r in results {
        for k in ["unit", "median", "p99", "n"] {
            assert!(!r[k].is_null(), "{k} missing in {r}");
        }
    }
    let ratios = v["ratios"].as_object().unwrap();
    for key in [
        "hetero/submit / crossbeam-channel/send",
        "hetero/op-end-to-end / crossbeam/task-end-to-end",
        "hetero/op-end-to-end-8-streams / rayon/scope-end-to-end",
    ] {
        assert!(ratios[key].is_number(), "ratio {key} missing in {ratios:?}");
    }
}

/// Workload arguments the demo cannot run are refused with a message naming
/// the argument, before any work: zero tiles, tile size or repetitions
/// (once clamped to 1 silently), kernel passes out of range (1e30 ran for
/// ever), and tiles whose pinned memory exceeds half the host's (the run
/// was killed for memory).
#[test]
fn workload_arguments_the_demo_cannot_run_are_refused() {
    for args in [
        &["--tiles", "0"][..],
        &["--tile-kib", "0"],
        &["--reps", "0"],
        &["--kernel-passes=-1"],
        &["--kernel-passes", "1e30"],
        &["--kernel-passes", "NaN"],
        &["--tiles", "100000000", "--tile-kib", "1048576"],
    ] {
        let flag = args[0].split('=').next().unwrap();
        for cmd in [
            &["demo"][..],
            &["profile", "demo", "--out", "/nonexistent/never"],
        ] {
            let out = run(&[cmd, args].concat(), &[]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{cmd:?} {args:?}: {err}");
            assert!(
                err.contains(&format!("hetero {flag} failed")),
                "{args:?}: {err}"
            );
        }
    }
}
