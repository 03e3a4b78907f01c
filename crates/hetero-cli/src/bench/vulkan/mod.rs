//! `hetero bench vulkan`: hetero on a Vulkan device beside a runtime written by
//! hand with raw `ash` calls (`ash_peer.rs`) on the same device, in the same
//! process; each figure and its peer are sampled in turn (`paired`), after
//! untimed warm-up rounds, with both sides idle when the clock starts.
//!
//! - `vulkan/dispatch-in-graph-ns`: a command buffer of 1 000 launches of a
//!   one-workgroup kernel (`x[0] += 1`), instantiated once, launched and
//!   synchronized; per dispatch. Peer `ash/dispatch-in-cmdbuf-ns`: one command
//!   buffer of 1 000 barriers and dispatches, recorded once, submitted and waited.
//! - `vulkan/op-end-to-end-ns`: one empty kernel launched, then `synchronize`.
//!   Peer `ash/submit-wait-ns`: the op recorded afresh (pool reset, barrier,
//!   bind, dispatch), `vkQueueSubmit2` signalling a timeline, `vkWaitSemaphores`;
//!   `ash/submit-wait-reuse-ns` resubmits one recorded buffer instead.
//! - `vulkan/copy-64m-gbps`: `copy_d2d` of 64 MiB, then `synchronize`. Peer
//!   `ash/copy-64m-gbps`: a recorded `vkCmdCopyBuffer` between two device-local
//!   buffers, submitted and waited.
//! - `vulkan/submits-per-op-running-ahead`: 10 000 empty launches on one stream,
//!   then one `synchronize`; `vkQueueSubmit2` calls per op (see
//!   [`submission_count`]), beside `vulkan/running-ahead-per-op-ns`.
//! - `vulkan/graph-update-launch-ns`: one node's scalar changed in a graph of
//!   1 000 one-workgroup dispatches, then the graph launched and waited for
//!   (hetero writes the node's parameter slot and records nothing:
//!   `vulkan/graph-update-recordings-per-launch`, the command buffers
//!   recorded per round from `Device::graph_recordings`, is 0). Peer
//!   `ash/rerecord-submit-ns`: the whole command buffer re-recorded with the
//!   new push constant, submitted, waited for.
//! - `vulkan/alloc-free-hit-ns`: `Stream::alloc` of 1 MiB and its drop (a hit in
//!   the stream's cache). Peer `ash/allocate-bind-free-ns`: vkAllocateMemory,
//!   vkCreateBuffer, vkBindBufferMemory, vkDestroyBuffer, vkFreeMemory.
//!
//! A figure that cannot be measured (graph launches on Vulkan before they land)
//! goes to the report's `unavailable` with the error, never as a number.

pub mod ash_peer;

use super::graph::{paired, CpuLoad};
use super::BenchReport;
use ash_peer::Peer;
use hetero::{Arg, CommandBuffer, Device, DeviceConfig, Grid, Kernel, Stream};
use std::time::Instant;

/// One workgroup that touches one word: the smallest dispatch that does work.
const TINY: &str = "@group(0) @binding(0) var<storage, read_write> x: array<u32>;\n\
                    @compute @workgroup_size(1)\n\
                    fn main() { x[0] = x[0] + 1u; }\n";
/// As `TINY`, adding its first scalar (a push constant).
const TINY_SCALAR: &str = "struct Scalars { v: array<vec2<u32>, 8> }\n\
                           var<push_constant> pc: Scalars;\n\
                           @group(0) @binding(0) var<storage, read_write> x: array<u32>;\n\
                           @compute @workgroup_size(1)\n\
                           fn main() { x[0] = x[0] + pc.v[0].x; }\n";
/// One workgroup that does nothing.
const EMPTY: &str = "@compute @workgroup_size(1)\nfn main() {}\n";
const DISPATCHES: usize = 1_000;
const COPY_BYTES: usize = 64 << 20;
const AHEAD_OPS: usize = 10_000;
const ALLOC_BYTES: usize = 1 << 20;
/// Allocations (and frees) per `alloc-free` sample; a sample is their mean.
const ALLOC_BATCH: usize = 64;

/// The Vulkan device both sides open: index 0, in the loader's order.
const INDEX: usize = 0;

type Result<T> = std::result::Result<T, String>;

fn ns_since(t: Instant) -> f64 {
    t.elapsed().as_nanos() as f64
}

fn sampled(warm: usize, reps: usize, mut f: impl FnMut() -> f64) -> Vec<f64> {
    for _ in 0..warm {
        f();
    }
    (0..reps).map(|_| f()).collect()
}

/// Sample counts: (warm-up, timed) rounds of each section.
struct Rounds {
    graph: (usize, usize),
    op: (usize, usize),
    copy: (usize, usize),
    ahead: (usize, usize),
    alloc: (usize, usize),
}

pub fn run(quick: bool) -> Result<BenchReport> {
    let at = Instant::now();
    let load = CpuLoad::now();
    let infos = hetero::vulkan::devices().map_err(|e| e.to_string())?;
    let info = infos
        .get(INDEX)
        .ok_or_else(|| format!("no Vulkan device {INDEX}: {} present", infos.len()))?;
    let dev = Device::new(DeviceConfig::default().vulkan(INDEX)).map_err(|e| e.to_string())?;
    let mut peer = Peer::open(INDEX).map_err(|e| format!("the ash peer: {e}"))?;
    let lp = std::env::var("LP_NUM_THREADS").unwrap_or_else(|_| "unset".into());
    let mut rep = BenchReport::new("vulkan");
    rep.context
        .insert("device".into(), dev.properties().name.clone());
    rep.context.insert("peer device".into(), peer.name.clone());
    rep.context
        .insert("driver".into(), info.driver_name.clone());
    rep.context.insert("LP_NUM_THREADS".into(), lp);
    let r = if quick {
        Rounds {
            graph: (2, 10),
            op: (50, 300),
            copy: (2, 8),
            ahead: (1, 3),
            alloc: (20, 200),
        }
    } else {
        Rounds {
            graph: (5, 200),
            op: (500, 10_000),
            copy: (10, 200),
            ahead: (3, 50),
            alloc: (200, 2_000),
        }
    };
    let s = dev.create_stream().map_err(|e| e.to_string())?;
    let tiny_spirv = hetero_vulkan::compile_wgsl(TINY, "main").map_err(|e| e.to_string())?;
    let empty_spirv = hetero_vulkan::compile_wgsl(EMPTY, "main").map_err(|e| e.to_string())?;

    dispatch_in_graph(&mut rep, &dev, &mut peer, &tiny_spirv, r.graph)?;
    let scalar_spirv =
        hetero_vulkan::compile_wgsl(TINY_SCALAR, "main").map_err(|e| e.to_string())?;
    graph_update(&mut rep, &dev, &mut peer, &scalar_spirv, r.graph)?;
    op_end_to_end(&mut rep, &s, &mut peer, &empty_spirv, r.op)?;
    copy_64m(&mut rep, &dev, &s, &mut peer, r.copy)?;
    running_ahead(&mut rep, &dev, &s, r.ahead)?;
    alloc_free(&mut rep, &s, &peer, r.alloc)?;

    rep.ratio_of("vulkan/dispatch-in-graph-ns", "ash/dispatch-in-cmdbuf-ns");
    rep.ratio_of("vulkan/graph-update-launch-ns", "ash/rerecord-submit-ns");
    rep.ratio_of("vulkan/op-end-to-end-ns", "ash/submit-wait-ns");
    rep.ratio_of("vulkan/op-end-to-end-ns", "ash/submit-wait-reuse-ns");
    rep.ratio_of("vulkan/copy-64m-gbps", "ash/copy-64m-gbps");
    rep.ratio_of("ash/allocate-bind-free-ns", "vulkan/alloc-free-hit-ns");
    targets(&mut rep);
    rep.notes.push(
        "the demo on --device vulkan is not part of this bench (`hetero demo --device vulkan`)"
            .into(),
    );
    rep.notes.push(format!(
        "whole run: {:.1} s{}",
        at.elapsed().as_secs_f64(),
        load.others_note()
    ));
    Ok(rep)
}

/// Each target beside its figure: met, missed, or unavailable.
fn targets(rep: &mut BenchReport) {
    let checks: [(&str, &str, bool, f64); 5] = [
        (
            "vulkan/dispatch-in-graph-ns / ash/dispatch-in-cmdbuf-ns",
            "<=",
            false,
            1.3,
        ),
        (
            "vulkan/op-end-to-end-ns / ash/submit-wait-ns",
            "<=",
            false,
            1.2,
        ),
        ("vulkan/copy-64m-gbps / ash/copy-64m-gbps", ">=", true, 0.9),
        (
            "ash/allocate-bind-free-ns / vulkan/alloc-free-hit-ns",
            ">=",
            true,
            20.0,
        ),
        ("vulkan/submits-per-op-running-ahead", "<=", false, 0.125),
    ];
    let mut line = Vec::new();
    for (key, op, at_least, target) in checks {
        let value = rep.ratios.get(key).copied().or_else(|| rep.median_of(key));
        let verdict = match value {
            Some(v) if (at_least && v >= target) || (!at_least && v <= target) => {
                format!("{v:.3}, met")
            }
            Some(v) => format!("{v:.3}, MISSED"),
            None => "unavailable".into(),
        };
        line.push(format!("{key} {op} {target} ({verdict})"));
    }
    rep.notes.push(format!("targets: {}", line.join("; ")));
}

/// 1 000 one-workgroup dispatches recorded once, replayed: per dispatch.
fn dispatch_in_graph(
    rep: &mut BenchReport,
    dev: &Device,
    peer: &mut Peer,
    spirv: &[u32],
    (warm, reps): (usize, usize),
) -> Result<()> {
    let e = |e: hetero::Error| e.to_string();
    // Its own stream: a graph that faults leaves its stream faulted.
    let s = dev.create_stream().map_err(e)?;
    let k = Kernel::from_wgsl("tiny", TINY, "main");
    let x = dev.alloc::<u32>(64).map_err(e)?;
    s.fill(&x, 0u32).map_err(e)?;
    let exec = (|| {
        let cb = CommandBuffer::new(dev)?;
        for _ in 0..DISPATCHES {
            cb.launch(&k, Grid::new(1), &[Arg::write(&x)])?;
        }
        let exec = cb.finish()?;
        s.launch_graph(&exec)?;
        s.synchronize()?;
        Ok::<_, hetero::Error>(exec)
    })();

    let buf = peer.buffer(256)?;
    let pk = peer.kernel(spirv, Some(&buf))?;
    let cb = peer.record_dispatches(&pk, DISPATCHES)?;
    let mut peer_sample = || {
        let t = Instant::now();
        peer.submit_wait(cb).expect("the ash peer's submission");
        ns_since(t) / DISPATCHES as f64
    };
    match exec {
        Ok(exec) => {
            let mut launches = 1u32;
            let (mut a, mut b) = paired(
                warm,
                reps,
                || {
                    let t = Instant::now();
                    s.launch_graph(&exec).expect("launch_graph");
                    s.synchronize().expect("synchronize");
                    launches += 1;
                    ns_since(t) / DISPATCHES as f64
                },
                &mut peer_sample,
            );
            let got = s.read_to_vec(&x).map_err(e)?[0];
            let want = launches * DISPATCHES as u32;
            if got != want {
                return Err(format!(
                    "the graph's kernels did not all run: x[0] is {got}, {want} expected"
                ));
            }
            rep.push_samples("vulkan/dispatch-in-graph-ns", "ns", &mut a);
            rep.push_samples("ash/dispatch-in-cmdbuf-ns", "ns", &mut b);
        }
        Err(err) => {
            rep.unavailable.insert(
                "vulkan/dispatch-in-graph-ns".into(),
                format!("launching a 1 000-node command buffer failed: {err}"),
            );
            let mut b = sampled(warm, reps, peer_sample);
            rep.push_samples("ash/dispatch-in-cmdbuf-ns", "ns", &mut b);
        }
    }
    Ok(())
}

/// One node's scalar changed in a 1 000-dispatch graph, then the graph
/// launched and waited for: per launch. Peer: a raw Vulkan program changing
/// one push constant re-records the whole command buffer.
fn graph_update(
    rep: &mut BenchReport,
    dev: &Device,
    peer: &mut Peer,
    spirv: &[u32],
    (warm, reps): (usize, usize),
) -> Result<()> {
    let e = |e: hetero::Error| e.to_string();
    let s = dev.create_stream().map_err(e)?;
    let k = Kernel::from_wgsl("tiny_scalar", TINY_SCALAR, "main");
    let x = dev.alloc::<u32>(64).map_err(e)?;
    s.fill(&x, 0u32).map_err(e)?;
    let mut g = hetero::Graph::new(dev).map_err(e)?;
    let mut ids = Vec::with_capacity(DISPATCHES);
    for _ in 0..DISPATCHES {
        let prev: Vec<_> = ids.last().copied().into_iter().collect();
        ids.push(
            g.kernel(&k, Grid::new(1), &[Arg::write(&x)], &prev)
                .map_err(e)?,
        );
    }
    let mut exec = g.instantiate().map_err(e)?;
    for &n in &ids {
        exec.set_scalars(n, &[1]).map_err(e)?;
    }
    s.launch_graph(&exec).map_err(e)?;
    s.synchronize().map_err(e)?;
    let changed = DISPATCHES / 2;
    let buf = peer.buffer(256)?;
    let pk = peer.kernel(spirv, Some(&buf))?;
    let (mut round, mut peer_round) = (0u32, 0u32);
    let mut want = DISPATCHES as u32;
    let recorded = dev.graph_recordings();
    let (mut a, mut b) = paired(
        warm,
        reps,
        || {
            round += 1;
            let t = Instant::now();
            exec.set_scalars(ids[changed], &[u64::from(round % 7)])
                .expect("set_scalars");
            s.launch_graph(&exec).expect("launch_graph");
            s.synchronize().expect("synchronize");
            want += DISPATCHES as u32 - 1 + round % 7;
            ns_since(t)
        },
        || {
            peer_round += 1;
            let t = Instant::now();
            peer.rerecord_and_submit(&pk, DISPATCHES, changed, peer_round % 7)
                .expect("the ash peer's re-recording");
            ns_since(t)
        },
    );
    let got = s.read_to_vec(&x).map_err(e)?[0];
    if got != want {
        return Err(format!(
            "the updated graph computed {got}, {want} expected: an update was lost"
        ));
    }
    rep.push_samples("vulkan/graph-update-launch-ns", "ns", &mut a);
    rep.push_samples("ash/rerecord-submit-ns", "ns", &mut b);
    if let (Some(before), Some(after)) = (recorded, dev.graph_recordings()) {
        rep.push_value(
            "vulkan/graph-update-recordings-per-launch",
            "x",
            (after - before) as f64 / f64::from(round.max(1)),
            u64::from(round),
        );
    }
    Ok(())
}

/// One empty op submitted and waited for, sampled with both peers in turn.
fn op_end_to_end(
    rep: &mut BenchReport,
    s: &Stream,
    peer: &mut Peer,
    spirv: &[u32],
    (warm, reps): (usize, usize),
) -> Result<()> {
    let k = Kernel::from_wgsl("empty", EMPTY, "main");
    let pk = peer.kernel(spirv, None)?;
    let recorded = peer.record_one(&pk)?;
    let mut hetero_op = || {
        let t = Instant::now();
        s.launch(&k, Grid::new(1), &[]).expect("launch");
        s.synchronize().expect("synchronize");
        ns_since(t)
    };
    let mut reuse = Vec::with_capacity(reps);
    let mut round = 0usize;
    let (mut a, mut b) = paired(warm, reps, &mut hetero_op, || {
        let t = Instant::now();
        peer.record_and_submit(&pk).expect("the ash peer's op");
        let ns = ns_since(t);
        let t = Instant::now();
        peer.submit_wait(recorded).expect("the ash peer's op");
        if round >= warm {
            reuse.push(ns_since(t));
        }
        round += 1;
        ns
    });
    rep.push_samples("vulkan/op-end-to-end-ns", "ns", &mut a);
    rep.push_samples("ash/submit-wait-ns", "ns", &mut b);
    rep.push_samples("ash/submit-wait-reuse-ns", "ns", &mut reuse);
    rep.notes.push(
        "ash/submit-wait-ns records each op afresh (vkResetCommandPool, begin, barrier, bind, \
         dispatch, end), as a runtime that does not know its next op must; \
         ash/submit-wait-reuse-ns resubmits one recorded buffer (a lower bound: no recording)"
            .into(),
    );
    Ok(())
}

/// A 64 MiB device-to-device copy, GB/s (10^9 bytes per second).
fn copy_64m(
    rep: &mut BenchReport,
    dev: &Device,
    s: &Stream,
    peer: &mut Peer,
    (warm, reps): (usize, usize),
) -> Result<()> {
    let e = |e: hetero::Error| e.to_string();
    let words = COPY_BYTES / 4;
    let src = dev.alloc::<u32>(words).map_err(e)?;
    let dst = dev.alloc::<u32>(words).map_err(e)?;
    s.fill(&src, 7u32).map_err(e)?;
    s.synchronize().map_err(e)?;
    let psrc = peer.buffer(COPY_BYTES as u64)?;
    let pdst = peer.buffer(COPY_BYTES as u64)?;
    // Both sources hold data (hetero's was filled above).
    let fill = peer.record_fill(&psrc, 7)?;
    peer.submit_wait(fill)?;
    let cb = peer.record_copy(&psrc, &pdst)?;
    let (mut a, mut b) = paired(
        warm,
        reps,
        || {
            let t = Instant::now();
            s.copy_d2d(&src, &dst).expect("copy_d2d");
            s.synchronize().expect("synchronize");
            ns_since(t)
        },
        || {
            let t = Instant::now();
            peer.submit_wait(cb).expect("the ash peer's copy");
            ns_since(t)
        },
    );
    let got = s.read_to_vec(&dst).map_err(e)?;
    if got.iter().any(|&w| w != 7) {
        return Err("the 64 MiB copy did not copy".into());
    }
    for (name, ns) in [
        ("vulkan/copy-64m-gbps", &mut a),
        ("ash/copy-64m-gbps", &mut b),
    ] {
        let t = super::summarize(name, "GB/s", ns);
        rep.results.push(super::BenchResult {
            median: COPY_BYTES as f64 / t.median,
            p99: COPY_BYTES as f64 / t.p99,
            ..t
        });
    }
    rep.notes.push(
        "copy-64m-gbps: bytes over the copy's wall time (submit to wait returned); p99 is the \
         bandwidth of the 99th-percentile (slow) copy"
            .into(),
    );
    Ok(())
}

/// 10 000 empty launches queued on one stream without a wait, then one
/// `synchronize`: ns per op, and `vkQueueSubmit2` calls per op where hetero
/// says how many it made.
#[inline(never)] // a symbol to break on: `running_ahead` (see `submission_count`)
fn running_ahead(
    rep: &mut BenchReport,
    dev: &Device,
    s: &Stream,
    (warm, reps): (usize, usize),
) -> Result<()> {
    let k = Kernel::from_wgsl("empty", EMPTY, "main");
    let before = submission_count(dev);
    let mut v = sampled(warm, reps, || {
        let t = Instant::now();
        for _ in 0..AHEAD_OPS {
            s.launch(&k, Grid::new(1), &[]).expect("launch");
        }
        s.synchronize().expect("synchronize");
        ns_since(t) / AHEAD_OPS as f64
    });
    let ops = ((warm + reps) * AHEAD_OPS) as f64;
    match (before, submission_count(dev)) {
        (Ok(b), Ok(a)) => rep.push_value(
            "vulkan/submits-per-op-running-ahead",
            "x",
            (a - b) as f64 / ops,
            (warm + reps) as u64,
        ),
        (Err(why), _) | (_, Err(why)) => {
            rep.unavailable
                .insert("vulkan/submits-per-op-running-ahead".into(), why);
        }
    }
    rep.push_samples("vulkan/running-ahead-per-op-ns", "ns", &mut v);
    Ok(())
}

/// `vkQueueSubmit2` calls hetero's Vulkan device has made so far.
///
/// hetero does not say: the count is `hetero_vulkan::Gpu::submissions()`,
/// behind the backend, and a trace (`HETERO_PROFILE`) has no record per
/// submission on Vulkan. Wanted: `Device::submissions() -> Option<u64>` (a
/// `Backend` method, `None` by default, the Vulkan backend's `gpu.submissions()`).
/// Until then the figure is unavailable here; it can be counted from outside
/// with a debugger (a breakpoint on `hetero_vulkan::device::Gpu::submit`
/// while `running_ahead` runs).
fn submission_count(dev: &Device) -> Result<u64> {
    dev.driver_submissions()
        .ok_or_else(|| "this device reports no driver submissions".into())
}

/// `Stream::alloc` + drop of 1 MiB (a pool hit), beside raw allocate, create,
/// bind, destroy, free of 1 MiB; ns per pair, means of `ALLOC_BATCH`.
fn alloc_free(
    rep: &mut BenchReport,
    s: &Stream,
    peer: &Peer,
    (warm, reps): (usize, usize),
) -> Result<()> {
    let (mut a, mut b) = paired(
        warm,
        reps,
        || {
            let t = Instant::now();
            for _ in 0..ALLOC_BATCH {
                let buf = s.alloc::<u8>(ALLOC_BYTES).expect("alloc");
                drop(std::hint::black_box(buf));
            }
            ns_since(t) / ALLOC_BATCH as f64
        },
        || {
            let t = Instant::now();
            for _ in 0..ALLOC_BATCH {
                peer.allocate_bind_free(ALLOC_BYTES as u64)
                    .expect("the ash peer's allocation");
            }
            ns_since(t) / ALLOC_BATCH as f64
        },
    );
    rep.push_samples("vulkan/alloc-free-hit-ns", "ns", &mut a);
    rep.push_samples("ash/allocate-bind-free-ns", "ns", &mut b);
    Ok(())
}
