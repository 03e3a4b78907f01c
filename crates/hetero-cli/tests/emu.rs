//! The command line on the emulated device: the demo in virtual time and
//! `bench link`. Figures asserted here are modelled (virtual time), hence
//! deterministic; no wall-clock time is asserted.

use serde_json::Value;
use std::process::Command;

fn hetero(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(args)
        .output()
        .expect("run hetero");
    assert!(
        out.status.success(),
        "hetero {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing: {v}"))
}

#[test]
fn emu_demo_in_virtual_time_is_verified_deterministic_and_pipelined() {
    let args = [
        "demo",
        "--device",
        "emu:pcie4x16",
        "--time",
        "virtual",
        "--json",
        "--tiles",
        "24",
        "--tile-kib",
        "16",
        "--reps",
        "1",
    ];
    let (a, b) = (hetero(&args), hetero(&args));
    for v in [&a, &b] {
        assert_eq!(v["verified"], true, "{v}");
        assert_eq!(v["device"], "emu:pcie4x16");
        assert_eq!(v["time"], "virtual");
    }
    assert!(a["trace_hash"].is_string(), "{a}");
    assert_eq!(a["trace_hash"], b["trace_hash"]);
    assert_eq!(a["pipelined_ms"], b["pipelined_ms"]);
    // Balanced by the models: the kernel's modelled time is the H2D's, and the
    // events of the serial run measure what the models say.
    let m = &a["model"];
    assert!(
        (f(m, "kernel_us") / f(m, "h2d_us") - 1.0).abs() < 1e-3,
        "{m}"
    );
    for stage in ["h2d_us", "kernel_us", "d2h_us"] {
        assert!((f(&a, stage) - f(m, stage)).abs() < 0.01, "{stage}: {a}");
    }
    // 24 tiles through 3 balanced engines: 72 stage times serially, at best 26
    // pipelined (2.77x); 16 KiB tiles keep the link's duplex share out of the way
    // (their data phases are short beside the setup latency).
    assert!(f(&a, "bound_speedup") > 2.9, "{a}");
    assert!(f(&a, "speedup") >= 2.5, "{a}");
}

#[test]
fn emu_demo_in_real_time_uses_small_tiles_and_reports_the_modelled_serial_run() {
    let v = hetero(&[
        "demo",
        "--device",
        "emu:pcie4x16,time=real",
        "--json",
        "--tiles",
        "8",
        "--reps",
        "1",
    ]);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["time"], "real");
    assert!(v["trace_hash"].is_null(), "{v}");
    // The default tile in real time is one the host can move as fast as the
    // model says the link does (see `demo::default_tile_bytes`).
    assert_eq!(v["tile_bytes"], 4096, "{v}");
    // The serial run on the models: 8 tiles of three modelled stages.
    let m = &v["model"];
    let stages = f(m, "h2d_us") + f(m, "kernel_us") + f(m, "d2h_us");
    assert!(
        (f(&v, "serial_model_ms") - 8.0 * stages / 1e3).abs() < 1e-9,
        "{v}"
    );
    let over = f(&v, "serial_model_ms") / f(&v, "pipelined_ms");
    assert!(
        (f(&v, "speedup_over_model_serial") - over).abs() < 1e-9,
        "{v}"
    );
}

#[test]
fn the_host_demo_reports_the_wall_clock() {
    let v = hetero(&[
        "demo",
        "--json",
        "--tiles",
        "4",
        "--tile-kib",
        "16",
        "--reps",
        "1",
    ]);
    assert_eq!(v["device"], "host");
    assert_eq!(v["time"], "wall");
    assert!(v["trace_hash"].is_null());
}

#[test]
#[cfg(feature = "bench")]
fn bench_link_reaches_the_presets_figures_for_large_transfers() {
    let v = hetero(&["bench", "link", "--quick", "--json"]);
    assert_eq!(v["bench"], "link");
    let results = v["results"].as_array().expect("results");
    let value = |name: &str| -> f64 {
        results
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing in {v}"))["median"]
            .as_f64()
            .expect("median")
    };
    let dirs = ["h2d", "d2h", "bidir-h2d", "bidir-d2h"];
    // 1 GiB may be measured smaller where memory is short (said in the notes).
    for size in ["4k", "64k", "1m", "64m"] {
        for dir in dirs {
            value(&format!("emu/{dir}-gbps-{size}"));
        }
    }
    let ratios = v["ratios"].as_object().expect("ratios");
    for dir in dirs {
        let preset = value(&format!("preset/{dir}-gbps"));
        let emu = value(&format!("emu/{dir}-gbps-64m"));
        assert!(
            (emu / preset - 1.0).abs() < 0.05,
            "{dir}: {emu} vs {preset}"
        );
        let key = format!("emu/{dir}-gbps-64m / preset/{dir}-gbps");
        assert!(ratios[&key].is_number(), "{key} missing");
    }
    // Small transfers pay the setup latency.
    assert!(value("emu/h2d-gbps-4k") < 0.1 * value("preset/h2d-gbps"));
    // Virtual time's speedup over the modelled time, on inline copies and on
    // DMA copies: 10 000 of 4 KiB take 10 000 setups and their bytes.
    let link = hetero::LinkPreset::pcie4x16();
    let dma = value("emu/modelled-ms-10k-copies-4k");
    let each = link.transfer_ns(4096, false);
    assert!(
        (dma / (1e4 * each / 1e6) - 1.0).abs() < 0.01,
        "{dma} vs {each}"
    );
    assert!(dma > 4.0 * value("emu/modelled-ms-10k-copies-256b"));
    for name in ["256b", "4k"] {
        let key = format!(
            "virtual speedup: emu/modelled-ms-10k-copies-{name} / emu/virtual-wall-ms-10k-copies-{name}"
        );
        assert!(ratios[&key].as_f64().is_some_and(|r| r > 0.0), "{key}");
    }
}

#[test]
fn info_lists_the_emu_backend_and_presets() {
    let v = hetero(&["info", "--json"]);
    assert_eq!(v["backends"], serde_json::json!(["host", "emu", "vulkan"]));
    // Either the Vulkan devices, each with its queue plan, or why there are none.
    match v["vulkan"].as_array() {
        Some(devices) => assert!(devices
            .iter()
            .all(|d| d["name"].is_string() && d["queue_plan"].is_string())),
        None => assert!(v["vulkan"]["error"].is_string(), "{}", v["vulkan"]),
    }
    let presets = v["emu_presets"].as_array().expect("presets");
    let names: Vec<&str> = presets
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["pcie3x16", "pcie4x16", "pcie5x16"]);
    assert!(presets
        .iter()
        .all(|p| p["source"].is_string() && p["h2d_gbps"].is_number()));
}

#[test]
#[cfg(feature = "bench")]
fn bench_transfer_reports_every_named_result_beside_its_peer() {
    let v = hetero(&["bench", "transfer", "--quick", "--json"]);
    assert_eq!(v["bench"], "transfer");
    let results = v["results"].as_array().expect("results");
    let median = |name: &str| {
        results
            .iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["median"].as_f64())
            .unwrap_or_else(|| panic!("no result {name}: {v}"))
    };
    for name in [
        "emu/batch-4096x8k-over-one-32m",
        "emu/per-call-4096x8k-over-batch",
        "hetero/batch-submit-per-descriptor",
        "emu/copy2d-worst-over-flat",
        "host/copy2d-over-memcpy",
        "emu/iotlb-4k-over-2m",
    ] {
        assert!(median(name).is_finite() && median(name) > 0.0, "{name}");
    }
    // Modelled figures are deterministic: one batch costs one setup more than
    // one copy of the same bytes, one op per copy a setup each.
    let ratio = median("emu/batch-4096x8k-ns") / median("emu/one-32m-ns");
    assert!((ratio - median("emu/batch-4096x8k-over-one-32m")).abs() < 1e-9);
    assert!(median("emu/per-call-4096x8k-ns") > median("emu/batch-4096x8k-ns"));
}

#[test]
fn info_prints_a_contexts_topology() {
    let v = hetero(&[
        "info",
        "--json",
        "--devices",
        "emu:pcie4x16,emu:pcie4x16,time=virtual,emu:pcie3x16",
        "--peer-link",
        "nvlink3",
    ]);
    let names: Vec<&str> = v["peer_links"]
        .as_array()
        .expect("peer links")
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["pcie4-switch", "pcie4-host-bridge", "nvlink3"]);
    let ctx = &v["context"];
    assert_eq!(ctx["devices"].as_array().expect("devices").len(), 3);
    let pairs = ctx["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 3, "{ctx}");
    for p in pairs {
        assert_eq!(p["path"], "link:nvlink3", "{p}");
        assert_eq!(p["link"]["gbps"], 270.0, "{p}");
        assert!(p["link"]["source"].is_string());
    }
    // Without a peer link every emulated pair is staged, with the reason.
    let v = hetero(&[
        "info",
        "--json",
        "--devices",
        "emu,emu",
        "--peer-link",
        "none",
    ]);
    let p = &v["context"]["pairs"][0];
    assert_eq!(p["path"], "staged", "{p}");
    assert!(p["reason"].is_string(), "{p}");
    // A host device beside emulated ones in real time: staged.
    let v = hetero(&["info", "--json", "--devices", "host,emu,time=real"]);
    assert_eq!(v["context"]["pairs"][0]["path"], "staged");
}

#[test]
fn info_refuses_a_context_it_cannot_make() {
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(["info", "--devices", "host,emu"])
        .output()
        .expect("run hetero");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("time=real"), "{err}");
}

#[test]
#[cfg(feature = "bench")]
fn bench_link_peer_reaches_the_peer_links_figure() {
    for link in ["pcie4-switch", "nvlink3"] {
        let v = hetero(&[
            "bench",
            "link",
            "--peer",
            "--peer-link",
            link,
            "--quick",
            "--json",
        ]);
        let results = v["results"].as_array().expect("results");
        let value = |name: &str| -> f64 {
            results
                .iter()
                .find(|r| r["name"] == name)
                .unwrap_or_else(|| panic!("{name} missing in {v}"))["median"]
                .as_f64()
                .expect("median")
        };
        let (emu, preset) = (value("emu/peer-gbps-64m"), value("preset/peer-gbps"));
        assert!(
            (emu / preset - 1.0).abs() < 0.05,
            "{link}: {emu} vs {preset}"
        );
        let key = "emu/peer-gbps-64m / preset/peer-gbps";
        assert!(v["ratios"][key].is_number(), "{key} missing: {v}");
        for dir in ["out", "back"] {
            let both = value(&format!("emu/peer-bidir-{dir}-gbps-64m"));
            assert!(
                (both / value("preset/peer-bidir-gbps") - 1.0).abs() < 0.05,
                "{link} {dir}: {both}"
            );
        }
    }
}

#[test]
fn demo_over_two_emulated_devices_is_verified_and_faster() {
    let args = [
        "demo",
        "--device",
        "emu:pcie4x16",
        "--devices",
        "2",
        "--json",
        "--tiles",
        "16",
        "--tile-kib",
        "16",
        "--reps",
        "1",
    ];
    let v = hetero(&args);
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["devices"], 2);
    assert_eq!(v["shares"], serde_json::json!([8, 8]));
    assert_eq!(f(&v, "bound_speedup"), 2.0);
    // Modelled: two devices with links of their own halve the pipeline's time
    // (up to the pipeline's fill and drain at half the tiles).
    let s = f(&v, "speedup");
    assert!(s > 1.6 && s <= 2.0 + 1e-9, "speedup {s}: {v}");
    // Virtual time: the same run gives the same figures and trace hashes.
    let again = hetero(&args);
    assert_eq!(v["trace_hashes"], again["trace_hashes"]);
    assert_eq!(v["devices_ms"], again["devices_ms"]);
    let out = Command::new(env!("CARGO_BIN_EXE_hetero"))
        .args(["demo", "--devices", "2"])
        .output()
        .expect("run hetero");
    assert!(!out.status.success(), "host devices are refused");
}
