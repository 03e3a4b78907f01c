//! Submission: timelines across submissions and lanes, reusable command buffers,
//! the submission counter, timestamps and calibration, failure and timeouts.

mod common;

use std::time::Duration;

use hetero_vulkan::{
    compile_wgsl, CalibrationMethod, Chunk, Lane, MemoryUse, Pipeline, QueryPool, Timeline, VkError,
};

const SECOND: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(60);

const INCREMENT: &str = "
@group(0) @binding(0) var<storage, read_write> v: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if id.x < arrayLength(&v) { v[id.x] = v[id.x] + 1u; }
}
";

fn words(c: &Chunk, n: usize) -> Vec<u32> {
    let mut out = vec![0u8; n * 4];
    c.read(0, &mut out).expect("read");
    out.chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

#[test]
fn wait_any_returns_when_either_timeline_is_reached() {
    let Some(gpu) = common::gpu() else { return };
    let a = Timeline::new(&gpu, 0).expect("timeline");
    let b = Timeline::new(&gpu, 0).expect("timeline");
    let short = Duration::from_millis(20);
    assert!(!Timeline::wait_any(&[(&a, 1), (&b, 1)], short).expect("wait"));
    let signaller = {
        let b = b.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            b.signal(1).expect("signal")
        })
    };
    assert!(Timeline::wait_any(&[(&a, 1), (&b, 1)], LONG).expect("wait"));
    assert_eq!((a.value().unwrap(), b.value().unwrap()), (0, 1));
    signaller.join().expect("signaller");
    assert!(Timeline::wait_any(&[], short).is_ok_and(|hit| !hit));
}

#[test]
fn host_signal_and_wait_and_polling() {
    let Some(gpu) = common::gpu() else { return };
    let t = Timeline::new(&gpu, 5).expect("timeline");
    assert_eq!(t.value().expect("value"), 5);
    t.signal(7).expect("signal");
    assert_eq!(t.value().expect("value"), 7);
    t.wait(6, SECOND).expect("already reached");
    assert!(
        matches!(t.signal(7), Err(VkError::InvalidArgument(_))),
        "values only increase"
    );
    match t.wait(8, Duration::from_millis(20)) {
        Err(VkError::Timeout {
            value: 8,
            current: 7,
            ..
        }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[test]
fn a_second_submission_waits_for_the_first_through_a_timeline() {
    let Some(gpu) = common::gpu() else { return };
    let a = Chunk::new(&gpu, 4096, MemoryUse::Upload).expect("a");
    let b = Chunk::new(&gpu, 4096, MemoryUse::Readback).expect("b");
    // First: fill a (transfer lane). Second: copy a to b (compute lane), after the first.
    // The first itself waits for a host signal, so the order is forced, not lucky.
    let gate = Timeline::new(&gpu, 0).expect("gate");
    let t = Timeline::new(&gpu, 0).expect("timeline");
    let mut r = gpu.recorder(Lane::Transfer).expect("recorder");
    r.fill(&a, 0, 4096, 0x1234_5678).expect("fill");
    let first = r.finish().expect("finish");
    let mut r = gpu.recorder(Lane::Compute).expect("recorder");
    r.copy(&a, 0, &b, 0, 4096).expect("copy");
    let second = r.finish().expect("finish");
    gpu.submit(Lane::Transfer, &[&first], &[(&gate, 1)], &[(&t, 1)])
        .expect("submit first");
    gpu.submit(Lane::Compute, &[&second], &[(&t, 1)], &[(&t, 2)])
        .expect("submit second");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        t.value().expect("value"),
        0,
        "nothing runs before the gate opens"
    );
    gate.signal(1).expect("open the gate");
    t.wait(2, LONG).expect("both done");
    assert!(words(&b, 1024).iter().all(|&w| w == 0x1234_5678));
}

#[test]
fn a_command_buffer_recorded_once_runs_100_times() {
    let Some(gpu) = common::gpu() else { return };
    let spirv = compile_wgsl(INCREMENT, "main").expect("compile");
    let pipeline = Pipeline::new(&gpu, &spirv, "main", 1, 0).expect("pipeline");
    let n = 1000usize;
    let v = Chunk::new(&gpu, (n * 4) as u64, MemoryUse::Readback).expect("v");
    v.write(0, &vec![0u8; n * 4]).expect("zero");
    let mut r = gpu.recorder(Lane::Compute).expect("recorder");
    r.dispatch(
        &pipeline,
        &[(&v, 0, (n * 4) as u64)],
        &[],
        [(n as u32).div_ceil(64), 1, 1],
    )
    .expect("dispatch");
    let cmd = r.finish().expect("finish");
    drop(pipeline); // the command buffer keeps it alive
    let t = Timeline::new(&gpu, 0).expect("timeline");
    let before = gpu.submissions();
    for i in 1..=100u64 {
        // Each run waits for the previous one: increments must not race.
        gpu.submit(Lane::Compute, &[&cmd], &[(&t, i - 1)], &[(&t, i)])
            .expect("submit");
    }
    t.wait(100, LONG).expect("all runs");
    assert_eq!(gpu.submissions() - before, 100);
    assert!(gpu.lane_submissions(Lane::Compute) >= 100);
    assert!(
        words(&v, n).iter().all(|&w| w == 100),
        "{:?}",
        &words(&v, n)[..4]
    );
}

#[test]
fn lanes_submit_from_two_threads_at_once() {
    let Some(gpu) = common::gpu() else { return };
    let a = Chunk::new(&gpu, 1 << 16, MemoryUse::Readback).expect("a");
    let b = Chunk::new(&gpu, 1 << 16, MemoryUse::Readback).expect("b");
    let ta = Timeline::new(&gpu, 0).expect("ta");
    let tb = Timeline::new(&gpu, 0).expect("tb");
    std::thread::scope(|s| {
        for (lane, chunk, t, value) in [
            (Lane::Compute, &a, &ta, 1u32),
            (Lane::Transfer, &b, &tb, 2u32),
        ] {
            let gpu = &gpu;
            s.spawn(move || {
                for i in 1..=50u64 {
                    let mut r = gpu.recorder(lane).expect("recorder");
                    r.fill(chunk, 0, 1 << 16, value).expect("fill");
                    let cmd = r.finish().expect("finish");
                    gpu.submit(lane, &[&cmd], &[], &[(t, i)]).expect("submit");
                }
            });
        }
    });
    ta.wait(50, LONG).expect("a");
    tb.wait(50, LONG).expect("b");
    assert!(words(&a, 1 << 14).iter().all(|&w| w == 1));
    assert!(words(&b, 1 << 14).iter().all(|&w| w == 2));
}

#[test]
fn a_failed_value_wakes_waiters_with_an_error() {
    let Some(gpu) = common::gpu() else { return };
    let t = Timeline::new(&gpu, 0).expect("timeline");
    std::thread::scope(|s| {
        let waiter = s.spawn(|| t.wait(3, LONG));
        std::thread::sleep(Duration::from_millis(20));
        t.fail(3).expect("fail");
        match waiter.join().expect("join") {
            Err(VkError::TimelineFailed {
                value: 3,
                failed_at: 3,
            }) => {}
            other => panic!("expected TimelineFailed, got {other:?}"),
        }
    });
    assert_eq!(t.failed_at(), Some(3));
    assert_eq!(t.value().expect("value"), 3);
    // Values before the failure are fine.
    t.wait(2, SECOND).expect("value 2 did not fail");
}

#[test]
fn timestamps_read_back_in_order_and_calibrate_to_the_host_clock() {
    let Some(gpu) = common::gpu() else { return };
    let pool = QueryPool::new(&gpu, 4).expect("pool");
    let spirv = compile_wgsl(INCREMENT, "main").expect("compile");
    let pipeline = Pipeline::new(&gpu, &spirv, "main", 1, 0).expect("pipeline");
    let n = 1 << 20;
    let v = Chunk::new(&gpu, n * 4, MemoryUse::DeviceLocal).expect("v");
    let mut r = gpu.recorder(Lane::Compute).expect("recorder");
    r.timestamp(&pool, 0).expect("ts");
    r.fill(&v, 0, n * 4, 0).expect("fill");
    r.dispatch(
        &pipeline,
        &[(&v, 0, n * 4)],
        &[],
        [(n as u32).div_ceil(64), 1, 1],
    )
    .expect("dispatch");
    r.timestamp(&pool, 1).expect("ts");
    assert!(matches!(
        r.timestamp(&pool, 4),
        Err(VkError::InvalidArgument(_))
    ));
    let cmd = r.finish().expect("finish");
    let t = Timeline::new(&gpu, 0).expect("timeline");
    let host_before = hetero_vulkan::host_now_ns();
    gpu.submit(Lane::Compute, &[&cmd], &[], &[(&t, 1)])
        .expect("submit");
    t.wait(1, LONG).expect("wait");
    let host_after = hetero_vulkan::host_now_ns();
    let ts = pool.read_ns(0, 4).expect("read");
    let (start, end) = (ts[0].expect("written"), ts[1].expect("written"));
    assert!(end > start, "{ts:?}");
    if gpu.info().features.host_query_reset {
        assert_eq!(ts[2], None, "never written");
    }
    for cal in [
        gpu.calibrate().expect("calibrate"),
        gpu.calibrate_by_submission().expect("round trip"),
    ] {
        println!("{cal:?}; dispatch took {} ns", end - start);
        if gpu.info().features.calibrated_timestamps {
            assert!(
                cal.method == CalibrationMethod::CalibratedTimestamps || cal.max_deviation_ns > 0
            );
        }
        // Mapped to the host clock, the work lies within the submit..wait window
        // (give the calibration's own deviation and a millisecond of slack).
        let slack = cal.max_deviation_ns + 1_000_000;
        let s = cal.to_host_ns(start);
        let e = cal.to_host_ns(end);
        assert!(
            s + slack >= host_before && e <= host_after + slack,
            "{host_before} <= {s}..{e} <= {host_after}"
        );
    }
}

/// Records `rounds` increments of one buffer, each into a command buffer
/// taken from a recycling list as an engine keeps one, each submission
/// waited for before the next recording; the list's length at the end.
fn increment_through_spares(gpu: &hetero_vulkan::Gpu, rounds: u64) -> usize {
    let spirv = compile_wgsl(INCREMENT, "main").expect("compile");
    let pipeline = Pipeline::new(gpu, &spirv, "main", 1, 0).expect("pipeline");
    let n = 256usize;
    let v = Chunk::new(gpu, (n * 4) as u64, MemoryUse::Readback).expect("v");
    v.write(0, &vec![0u8; n * 4]).expect("zero");
    let t = Timeline::new(gpu, 0).expect("timeline");
    let mut spares = std::collections::VecDeque::new();
    for i in 1..=rounds {
        let mut r = gpu
            .recorder_reusing(Lane::Compute, &mut spares)
            .expect("recorder");
        r.dispatch(&pipeline, &[(&v, 0, (n * 4) as u64)], &[], [4, 1, 1])
            .expect("dispatch");
        let cmd = r.finish().expect("finish");
        gpu.submit(Lane::Compute, &[&cmd], &[], &[(&t, i)])
            .expect("submit");
        spares.push_back(cmd);
        // The queue holds the submission until a later sweep releases it.
        assert!(!spares.back().expect("pushed").is_idle());
        t.wait(i, LONG).expect("run");
    }
    assert!(
        words(&v, n).iter().all(|&w| w == rounds as u32),
        "{:?}",
        &words(&v, n)[..4]
    );
    spares.len()
}

#[test]
fn command_buffers_are_recorded_again_once_their_submissions_complete() {
    let Some(gpu) = common::gpu() else { return };
    // One new buffer and one spare made with it: every later recording
    // reuses one of the two (without reuse the list would hold 50).
    assert_eq!(increment_through_spares(&gpu, 50), 2);
    // The same with descriptor sets from pools, reset at each reuse.
    let Some(gpu) = common::gpu_with(&hetero_vulkan::OpenOptions {
        disable_push_descriptors: true,
        cache: hetero_vulkan::CacheLocation::Off,
        ..hetero_vulkan::OpenOptions::default()
    }) else {
        return;
    };
    assert!(!gpu.uses_push_descriptors());
    assert_eq!(increment_through_spares(&gpu, 50), 2);
}
