//! `hetero bench placement`: the task layer's schedulers on a modelled node,
//! in virtual time — a CPU-like device (4 compute units of 25 GFLOP/s, of
//! class `ComputeClass::Cpu`) and two accelerators (2 units of 400 and 2 of
//! 150 GFLOP/s), every pair over the `pcie4-switch` peer link, each
//! device's kernels timed from the cost they declare for its class at its
//! rate (an accelerator reaches a kernel's share of its rate,
//! [`ACCEL_EFFICIENCY`]: a panel factorization a twentieth, a product all
//! of it; a CPU's cores all of theirs) — beside the offline HEFT plan on
//! the same models and beside the lower bound max(critical path, work /
//! speed):
//! - `cholesky/…`: tiled Cholesky (16×16 tiles of 256×256 f64; `--quick`: 8×8):
//!   makespan and bytes moved per policy, `makespan-over-heft-<sched>`,
//!   `makespan-over-bound-<sched>`, `bytes-over-heft-dmda`;
//! - `gemm/…`, `random/…`: tiled GEMM (8×8×8 tiles) and random layered DAGs:
//!   `makespan-over-heft-<sched>`;
//! - `drift/makespan-over-oracle-<sched>`: waves of independent tasks; halfway
//!   the fast accelerator slows 4×; the oracle is dmda told the new speed at
//!   that moment (a model calibrated at that speed); `drift/tasks-to-recover-learned`;
//! - `outliers/work-share-shift`: dmda's share of work per device after 1 %
//!   of the fast accelerator's calibration samples were inflated ≥ 300×,
//!   against a clean calibration (points, the largest over devices);
//! - `overhead/per-task-ns-<sched>`: host time to submit an empty task (real
//!   time, a host device and an emulated one in real time), in batches the
//!   policies take in turns; beside it the host time of one stream op on
//!   each device (`overhead/stream-op-ns-…`) and the ratio over the one
//!   stream op a task is at least, its launch (`overhead/per-task-over-stream-ops-…`);
//! - `graph/placed-replay-over-online`: host time per task launching a
//!   HEFT-placed task graph over submitting the same tasks online with dmda,
//!   each on tiles of its own (and `…-shared-tiles`: on one set);
//! - `managed/cholesky-…-over-task-data-dmda`: the Cholesky under dmda with
//!   managed buffers of the context as its tiles (pages moved by managed
//!   memory, placement weighing its page table) beside task data (replicas);
//! - `models/second-run-calibration-tasks`: tasks placed to calibrate in a
//!   second process that finds the models this one saved.
//!
//! Warm-up, the same for every policy: each workload calibrates its own
//! models with dmda (runs until none calibrates); then each policy gets a
//! fresh node on its own copy of those models and runs the workload twice in
//! one context, the second run measured (the first warms the context's
//! state: the learning policy's estimates, the models' further samples). No
//! policy's runs move the models another policy starts from.

use super::BenchReport;
use hetero::{
    Advice, ComputeClass, Context, DataArg, Device, DeviceConfig, EmuConfig, Grid, Kernel,
    KernelCost, LinkPreset, Location, ManagedBuffer, SchedPolicy, TaskBuilder, TaskData, TaskGraph,
    TimeMode,
};
use std::path::{Path, PathBuf};
use std::time::Instant;

type Result<T> = std::result::Result<T, String>;

fn err(e: hetero::Error) -> String {
    e.to_string()
}

/// Tile side (f64): 512 KiB tiles.
const NB: usize = 256;
const NB3: f64 = (NB * NB * NB) as f64;
/// The node's devices: (compute units, flops per unit, class).
const NODE: [(usize, f64, ComputeClass); 3] = [
    (4, 25e9, ComputeClass::Cpu),
    (2, 400e9, ComputeClass::Accelerator),
    (2, 150e9, ComputeClass::Accelerator),
];

/// The share of an accelerator unit's rate each kernel reaches (others: all
/// of it); a CPU's cores run every kernel at their rate. As on GPUs with
/// 256-wide tiles: a panel factorization is sequential and latency-bound, a
/// triangular solve half parallel, the products dense. With these, potrf
/// runs fastest on the CPU-like device (25 against 20 and 7.5 GFLOP/s per
/// unit) and everything else on the fast accelerator.
const ACCEL_EFFICIENCY: [(&str, f64); 5] = [
    ("potrf", 0.05),
    ("trsm", 0.4),
    ("syrk", 0.8),
    ("rand-small", 0.3),
    ("rand-big", 1.0),
];

fn accel_efficiency(name: &str) -> f64 {
    ACCEL_EFFICIENCY
        .iter()
        .find(|e| e.0 == name)
        .map_or(1.0, |e| e.1)
}

/// A kernel's time on one unit of `node`'s device, ns.
fn unit_ns(name: &str, flops: f64, (_, rate, class): (usize, f64, ComputeClass)) -> f64 {
    let eff = match class {
        ComputeClass::Cpu => 1.0,
        ComputeClass::Accelerator => accel_efficiency(name),
    };
    flops / (rate * eff) * 1e9
}
/// The fast accelerator (the one that drifts).
const FAST: usize = 1;
/// Set in the child process of `models/second-run-calibration-tasks`: the
/// model directory it reads.
const CHILD_ENV: &str = "HETERO_BENCH_PLACEMENT_CHILD";

fn node() -> Result<(Context, Vec<Device>)> {
    let devs = NODE
        .iter()
        .map(|&(units, flops, class)| {
            let emu = EmuConfig::new(LinkPreset::pcie4x16())
                .time(TimeMode::Virtual)
                .flops_per_unit(flops)
                .class(class);
            Device::new(DeviceConfig::default().compute_units(units).emu(emu)).map_err(err)
        })
        .collect::<Result<Vec<_>>>()?;
    let ctx = Context::new(&devs).map_err(err)?;
    Ok((ctx, devs))
}

/// A kernel of `flops` (×600 on a grid of two blocks: the outlier injection)
/// whose host code touches its written tile; on an accelerator it costs as
/// many flops over its efficiency there ([`ACCEL_EFFICIENCY`]).
fn kernel(name: &'static str, flops: f64) -> Kernel {
    let cost = move |flops: f64| {
        move |g: Grid| KernelCost {
            flops: if g.blocks() > 1 { flops * 600.0 } else { flops },
            bytes: 0.0,
        }
    };
    Kernel::with_cost(name, cost(flops), |b| {
        if let Some(x) = b.write::<f64>(0).first_mut() {
            *x += 1.0;
        }
    })
    .cost_on(
        ComputeClass::Accelerator,
        cost(flops / accel_efficiency(name)),
    )
}

struct Kernels {
    potrf: Kernel,
    trsm: Kernel,
    syrk: Kernel,
    gemm: Kernel,
    small: Kernel,
    big: Kernel,
}

fn kernels() -> Kernels {
    Kernels {
        potrf: kernel("potrf", NB3 / 3.0),
        trsm: kernel("trsm", NB3),
        syrk: kernel("syrk", NB3),
        gemm: kernel("gemm", 2.0 * NB3),
        small: kernel("rand-small", NB3),
        big: kernel("rand-big", 4.0 * NB3),
    }
}

/// One task of a workload: kernel, tiles read, tile read and written, priority.
struct Spec<'k> {
    kernel: &'k Kernel,
    reads: Vec<usize>,
    write: usize,
    priority: u8,
    flops: f64,
}

/// A workload: its tiles and tasks.
struct Workload<'k> {
    tiles: usize,
    tasks: Vec<Spec<'k>>,
}

fn cholesky(k: &Kernels, t: usize) -> Workload<'_> {
    let tile = |i: usize, j: usize| i * (i + 1) / 2 + j;
    let mut tasks = Vec::new();
    for kk in 0..t {
        tasks.push(Spec {
            kernel: &k.potrf,
            reads: vec![],
            write: tile(kk, kk),
            priority: 0,
            flops: NB3 / 3.0,
        });
        for i in kk + 1..t {
            tasks.push(Spec {
                kernel: &k.trsm,
                reads: vec![tile(kk, kk)],
                write: tile(i, kk),
                priority: 1,
                flops: NB3,
            });
        }
        for i in kk + 1..t {
            tasks.push(Spec {
                kernel: &k.syrk,
                reads: vec![tile(i, kk)],
                write: tile(i, i),
                priority: 2,
                flops: NB3,
            });
            for j in kk + 1..i {
                tasks.push(Spec {
                    kernel: &k.gemm,
                    reads: vec![tile(i, kk), tile(j, kk)],
                    write: tile(i, j),
                    priority: 3,
                    flops: 2.0 * NB3,
                });
            }
        }
    }
    Workload {
        tiles: t * (t + 1) / 2,
        tasks,
    }
}

fn gemm(k: &Kernels, t: usize) -> Workload<'_> {
    // Tiles: A (t·t), B (t·t), C (t·t).
    let (a, b, c) = (0, t * t, 2 * t * t);
    let mut tasks = Vec::new();
    for kk in 0..t {
        for i in 0..t {
            for j in 0..t {
                tasks.push(Spec {
                    kernel: &k.gemm,
                    reads: vec![a + i * t + kk, b + kk * t + j],
                    write: c + i * t + j,
                    priority: 3,
                    flops: 2.0 * NB3,
                });
            }
        }
    }
    Workload {
        tiles: 3 * t * t,
        tasks,
    }
}

/// Layers of `width` tasks, each reading 1-3 outputs of the layer before
/// (a fixed seed), writing its own.
fn random(k: &Kernels, layers: usize, width: usize) -> Workload<'_> {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut tasks = Vec::new();
    for l in 0..layers {
        for w in 0..width {
            let mut reads = Vec::new();
            if l > 0 {
                for _ in 0..1 + next(3) {
                    let r = (l - 1) * width + next(width);
                    if !reads.contains(&r) {
                        reads.push(r);
                    }
                }
            }
            let big = next(4) == 0;
            tasks.push(Spec {
                kernel: if big { &k.big } else { &k.small },
                reads,
                write: l * width + w,
                priority: 3,
                flops: if big { 4.0 * NB3 } else { NB3 },
            });
        }
    }
    Workload {
        tiles: layers * width,
        tasks,
    }
}

/// max(critical path, each task on its fastest unit; total work over
/// total speed), ns. (A device's units are busy at most the makespan, and
/// a task costs a device at least its flops at the device's full rate: a
/// CPU's cores run every kernel at theirs.)
fn lower_bound(w: &Workload<'_>) -> f64 {
    let speed: f64 = NODE.iter().map(|n| n.0 as f64 * n.1).sum();
    let mut ready = vec![0.0f64; w.tiles];
    let mut path = 0.0f64;
    for t in &w.tasks {
        let start = t
            .reads
            .iter()
            .chain([&t.write])
            .map(|&r| ready[r])
            .fold(0.0, f64::max);
        let name = t.kernel.name();
        let fastest = NODE
            .iter()
            .map(|&n| unit_ns(name, t.flops, n))
            .fold(f64::INFINITY, f64::min);
        let end = start + fastest;
        ready[t.write] = end;
        path = path.max(end);
    }
    let work: f64 = w.tasks.iter().map(|t| t.flops).sum::<f64>() / speed * 1e9;
    path.max(work)
}

/// A run's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    makespan_ns: f64,
    bytes: u64,
    calibration: u64,
}

fn tiles(ctx: &Context, n: usize) -> Result<Vec<TaskData<f64>>> {
    (0..n)
        .map(|_| ctx.data::<f64>(NB * NB).map_err(err))
        .collect()
}

fn builder<'c, D>(ctx: &'c Context, s: &Spec<'_>, data: &[D]) -> TaskBuilder<'c>
where
    for<'a> &'a D: Into<DataArg<'a>>,
{
    let mut b = ctx.task(s.kernel).priority(s.priority);
    for &r in &s.reads {
        b = b.read(&data[r]);
    }
    b.read_write(&data[s.write])
}

/// Submits `w` online on fresh tiles and waits.
fn online(ctx: &Context, devs: &[Device], w: &Workload<'_>) -> Result<Run> {
    online_on(ctx, devs, w, &tiles(ctx, w.tiles)?)
}

/// Submits `w` online on tiles `data` and waits.
fn online_on<D>(ctx: &Context, devs: &[Device], w: &Workload<'_>, data: &[D]) -> Result<Run>
where
    for<'a> &'a D: Into<DataArg<'a>>,
{
    ctx.reset_task_stats();
    let t0 = devs[0].now_ns();
    for s in &w.tasks {
        builder(ctx, s, data).submit().map_err(err)?;
    }
    ctx.wait_tasks().map_err(err)?;
    let st = ctx.task_stats();
    Ok(Run {
        makespan_ns: (devs[0].now_ns() - t0) as f64,
        bytes: st.bytes_moved,
        calibration: st.calibration_tasks,
    })
}

/// `managed/…`: `w` under dmda over managed buffers of the context (each
/// tile filled by the host, then prefetched to the first device, where task
/// data starts) beside the same over task data, each the second run in a
/// fresh node with the models of `dir`: makespan and bytes moved.
fn managed_figures(rep: &mut BenchReport, dir: &Path, w: &Workload<'_>) -> Result<()> {
    let (data, data_stats) = measured(dir, SchedPolicy::Dmda, w)?;
    let (ctx, devs) = node()?;
    ctx.set_perfmodel_dir(Some(dir.to_path_buf()));
    ctx.set_scheduler(SchedPolicy::Dmda);
    let first = devs[0].create_stream().map_err(err)?;
    let managed_tiles = |read_mostly: bool| -> Result<Vec<ManagedBuffer<f64>>> {
        let tiles = (0..w.tiles)
            .map(|_| {
                let m = ctx.alloc_managed::<f64>(NB * NB).map_err(err)?;
                if read_mostly {
                    m.advise(.., Advice::ReadMostly).map_err(err)?;
                }
                m.write(..).map_err(err)?.fill(0.0);
                m.prefetch(.., Location::Device(devs[0].id()), &first)
                    .map_err(err)?;
                Ok(m)
            })
            .collect::<Result<Vec<_>>>()?;
        first.synchronize().map_err(err)?;
        Ok(tiles)
    };
    online_on(&ctx, &devs, w, &managed_tiles(false)?)?;
    let managed = online_on(&ctx, &devs, w, &managed_tiles(false)?)?;
    let stats = ctx.task_stats();
    let replicas = online_on(&ctx, &devs, w, &managed_tiles(true)?)?;
    for (name, r) in [
        ("task-data", data),
        ("managed", managed),
        ("managed-read-mostly", replicas),
    ] {
        rep.push_value(
            &format!("managed/cholesky-makespan-ms-{name}-dmda"),
            "ms",
            r.makespan_ns / 1e6,
            1,
        );
        rep.push_value(
            &format!("managed/cholesky-bytes-{name}-dmda"),
            "MiB",
            r.bytes as f64 / 1048576.0,
            1,
        );
    }
    rep.ratios.insert(
        "managed/cholesky-makespan-over-task-data-dmda".into(),
        managed.makespan_ns / data.makespan_ns,
    );
    rep.ratios.insert(
        "managed/cholesky-bytes-over-task-data-dmda".into(),
        managed.bytes as f64 / data.bytes.max(1) as f64,
    );
    rep.ratios.insert(
        "managed/cholesky-read-mostly-makespan-over-task-data-dmda".into(),
        replicas.makespan_ns / data.makespan_ns,
    );
    rep.ratios.insert(
        "managed/cholesky-read-mostly-bytes-over-task-data-dmda".into(),
        replicas.bytes as f64 / data.bytes.max(1) as f64,
    );
    rep.notes.push(format!(
        "managed: dmda's tasks per device over managed tiles {:?}, over task data {:?}; without \
         ReadMostly a device's read moves a page from the device that holds it (managed memory's \
         rule, as CUDA's), so tiles many tasks read move more than task data's replicas; advised \
         ReadMostly, reads keep replicas as task data does",
        stats.per_device, data_stats.per_device
    ));
    Ok(())
}

/// Records `w` on fresh tiles, places it with HEFT, launches it and waits.
fn heft(ctx: &Context, devs: &[Device], w: &Workload<'_>) -> Result<Run> {
    let data = tiles(ctx, w.tiles)?;
    let mut g = TaskGraph::new();
    for s in &w.tasks {
        builder(ctx, s, data.as_slice())
            .record(&mut g)
            .map_err(err)?;
    }
    let placed = g.instantiate_on(ctx).map_err(err)?;
    ctx.reset_task_stats();
    let t0 = devs[0].now_ns();
    placed.launch().map_err(err)?;
    ctx.wait_tasks().map_err(err)?;
    let st = ctx.task_stats();
    Ok(Run {
        makespan_ns: (devs[0].now_ns() - t0) as f64,
        bytes: st.bytes_moved,
        calibration: 0,
    })
}

/// `graph/…`: on one node with calibrated models, the host time per task of
/// submitting `w` online with dmda and of launching it as a HEFT-placed
/// task graph, the two taking turns (after one of each untimed), each
/// followed by an untimed wait; median and p99 over rounds. Each side on
/// tiles of its own: a side's time is its own work, in the steady state a
/// program that does only that one reaches (a graph launched again over
/// data nothing else touched sets no datum's state: `Marks` in
/// `api/task/graph.rs`). Then the same over one set of tiles
/// (`…-shared-tiles`), where each side first takes on the other's last
/// writes: the launches' data states, set lazily, are then applied by the
/// online submissions.
fn replay_figures(rep: &mut BenchReport, dir: &Path, w: &Workload<'_>, quick: bool) -> Result<()> {
    let (ctx, _devs) = node()?;
    ctx.set_perfmodel_dir(Some(dir.to_path_buf()));
    ctx.set_scheduler(SchedPolicy::Dmda);
    let online_data = tiles(&ctx, w.tiles)?;
    let graph_data = tiles(&ctx, w.tiles)?;
    let online_once = || -> Result<(f64, u64)> {
        let before = ctx.task_stats();
        let t0 = Instant::now();
        for s in &w.tasks {
            builder(&ctx, s, &online_data).submit().map_err(err)?;
        }
        let ns = t0.elapsed().as_nanos() as f64;
        let after = ctx.task_stats();
        ctx.wait_tasks().map_err(err)?;
        let waited = after.stream_wait_ns - before.stream_wait_ns;
        Ok((ns - waited as f64, after.stream_waits - before.stream_waits))
    };
    // The first run loads the models from disk.
    online_once()?;
    let n = w.tasks.len() as f64;
    let mut waits = 0;
    for (data, suffix) in [(&graph_data, ""), (&online_data, "-shared-tiles")] {
        let mut g = TaskGraph::new();
        for s in &w.tasks {
            builder(&ctx, s, data).record(&mut g).map_err(err)?;
        }
        let placed = g.instantiate_on(&ctx).map_err(err)?;
        placed.launch().map_err(err)?;
        ctx.wait_tasks().map_err(err)?;
        let (mut on, mut re) = (Vec::new(), Vec::new());
        for _ in 0..if quick { 5 } else { 15 } {
            let (ns, k) = online_once()?;
            on.push(ns / n);
            waits += k;
            let t0 = Instant::now();
            placed.launch().map_err(err)?;
            re.push(t0.elapsed().as_nanos() as f64 / n);
            ctx.wait_tasks().map_err(err)?;
        }
        let on = rep
            .push_samples(
                &format!("graph/online-dmda-host-ns-per-task{suffix}"),
                "ns",
                &mut on,
            )
            .median;
        let re = rep
            .push_samples(
                &format!("graph/placed-replay-host-ns-per-task{suffix}"),
                "ns",
                &mut re,
            )
            .median;
        rep.ratios
            .insert(format!("graph/placed-replay-over-online{suffix}"), re / on);
    }
    rep.notes.push(format!(
        "graph: host time submitting, online less the time a submission waited for a device's \
         busy streams ({waits} such waits in all rounds); the replay makes no decision and \
         takes no lock per task; each side on tiles of its own, and on shared tiles \
         (-shared-tiles: each side takes on the other's writes, the online side applying the \
         launches' data states)"
    ));
    Ok(())
}

/// Runs `w` with dmda until no task calibrates (at most 8 runs), saving the
/// models under `dir`.
fn calibrate(dir: &Path, w: &Workload<'_>) -> Result<u64> {
    let (ctx, devs) = node()?;
    ctx.set_perfmodel_dir(Some(dir.to_path_buf()));
    ctx.set_scheduler(SchedPolicy::Dmda);
    let mut total = 0;
    for _ in 0..8 {
        let r = online(&ctx, &devs, w)?;
        total += r.calibration;
        if r.calibration == 0 {
            break;
        }
    }
    Ok(total)
}

/// A policy's second run of `w` in a fresh node, on its own copy of the
/// models calibrated in `dir` (so no policy's runs move the models another
/// starts from), and the layer's figures of that run. The first run warms
/// the context's state (the learning policy's estimates, the models' later
/// samples) the same way for every policy.
fn measured(dir: &Path, p: SchedPolicy, w: &Workload<'_>) -> Result<(Run, hetero::TaskStats)> {
    let own = dir.join(format!("measured-{}", p.name()));
    let _ = std::fs::remove_dir_all(&own);
    copy_models(dir, &own)?;
    let (ctx, devs) = node()?;
    ctx.set_perfmodel_dir(Some(own));
    ctx.set_scheduler(p);
    online(&ctx, &devs, w)?;
    let r = online(&ctx, &devs, w)?;
    Ok((r, ctx.task_stats()))
}

fn heft_run(dir: &Path, w: &Workload<'_>) -> Result<Run> {
    let (ctx, devs) = node()?;
    ctx.set_perfmodel_dir(Some(dir.to_path_buf()));
    heft(&ctx, &devs, w)
}

/// Every policy and HEFT on `w`: makespans, bytes, ratios.
fn compare(rep: &mut BenchReport, dir: &Path, name: &str, w: &Workload<'_>) -> Result<()> {
    calibrate(dir, w)?;
    let h = heft_run(dir, w)?;
    let bound = lower_bound(w);
    rep.push_value(
        &format!("{name}/makespan-ms-heft"),
        "ms",
        h.makespan_ns / 1e6,
        1,
    );
    rep.push_value(
        &format!("{name}/bytes-heft"),
        "MiB",
        h.bytes as f64 / 1048576.0,
        1,
    );
    rep.push_value(&format!("{name}/lower-bound-ms"), "ms", bound / 1e6, 1);
    rep.ratios
        .insert(format!("{name}/heft-over-bound"), h.makespan_ns / bound);
    let mut shares = Vec::new();
    for p in SchedPolicy::ALL {
        let (r, stats) = measured(dir, p, w)?;
        shares.push(format!(
            "{} {:?} (calibrating {}; exploring {} over both runs)",
            p.name(),
            stats.per_device,
            r.calibration,
            stats.explored
        ));
        if p == SchedPolicy::Dmda {
            let err: Vec<String> = stats
                .prediction_error
                .iter()
                .map(|e| {
                    format!(
                        "{}@{}: {:.1} % over {}",
                        e.kernel,
                        e.device,
                        100.0 * e.mean_relative_error,
                        e.tasks
                    )
                })
                .collect();
            rep.notes.push(format!(
                "{name} dmda: prediction error per kernel@device {}; MiB per link (from, to) {}",
                err.join(", "),
                stats
                    .bytes_per_link
                    .iter()
                    .map(|l| format!("{}->{}: {:.1}", l.0, l.1, l.2 as f64 / 1048576.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let s = p.name();
        rep.push_value(
            &format!("{name}/makespan-ms-{s}"),
            "ms",
            r.makespan_ns / 1e6,
            1,
        );
        rep.push_value(
            &format!("{name}/bytes-{s}"),
            "MiB",
            r.bytes as f64 / 1048576.0,
            1,
        );
        rep.ratios.insert(
            format!("{name}/makespan-over-heft-{s}"),
            r.makespan_ns / h.makespan_ns,
        );
        rep.ratios.insert(
            format!("{name}/makespan-over-bound-{s}"),
            r.makespan_ns / bound,
        );
        if p == SchedPolicy::Dmda && h.bytes > 0 {
            rep.ratios.insert(
                format!("{name}/bytes-over-heft-dmda"),
                r.bytes as f64 / h.bytes as f64,
            );
        }
    }
    rep.notes
        .push(format!("{name}: tasks per device, {}", shares.join(", ")));
    Ok(())
}

/// Copies the model files of `from` into `to`.
fn copy_models(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| e.to_string())?;
    for e in std::fs::read_dir(from).map_err(|e| e.to_string())? {
        let e = e.map_err(|e| e.to_string())?;
        if e.path().extension().is_some_and(|x| x == "model") {
            std::fs::copy(e.path(), to.join(e.file_name())).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Waves of independent tasks (each slot's tile read and written by one
/// task per wave); from wave `waves / 2` on, the fast accelerator is 4×
/// slower. `slow_kernel`: the kernel used from then on (the oracle's, whose
/// model was calibrated at the slow speed). Per-wave makespans, ns.
fn waves(
    ctx: &Context,
    devs: &[Device],
    k: &Kernel,
    slow_kernel: Option<&Kernel>,
    waves: usize,
    slots: usize,
    drift: bool,
) -> Result<Vec<f64>> {
    let data = tiles(ctx, slots)?;
    let mut out = Vec::new();
    for w in 0..waves {
        let late = drift && w >= waves / 2;
        if drift && w == waves / 2 {
            devs[FAST].set_emu_slowdown(4.0).map_err(err)?;
        }
        let kernel = match (late, slow_kernel) {
            (true, Some(s)) => s,
            _ => k,
        };
        let t0 = devs[0].now_ns();
        for d in &data {
            ctx.task(kernel).read_write(d).submit().map_err(err)?;
        }
        ctx.wait_tasks().map_err(err)?;
        out.push((devs[0].now_ns() - t0) as f64);
    }
    devs[FAST].set_emu_slowdown(1.0).map_err(err)?;
    Ok(out)
}

fn drift(rep: &mut BenchReport, dir: &Path, quick: bool) -> Result<()> {
    let (n_waves, slots) = if quick { (16, 24) } else { (40, 24) };
    let k = kernel("drift", 2.0 * NB3);
    let k_slow = kernel("drift-slow", 2.0 * NB3);
    // Calibrate both: `drift` as the node is, `drift-slow` with the fast
    // accelerator 4× slower.
    {
        let (ctx, devs) = node()?;
        ctx.set_perfmodel_dir(Some(dir.to_path_buf()));
        ctx.set_scheduler(SchedPolicy::Dmda);
        waves(&ctx, &devs, &k, None, 8, slots, false)?;
        devs[FAST].set_emu_slowdown(4.0).map_err(err)?;
        waves(&ctx, &devs, &k_slow, None, 8, slots, false)?;
        devs[FAST].set_emu_slowdown(1.0).map_err(err)?;
    }
    let run = |p: SchedPolicy, oracle: bool| -> Result<Vec<f64>> {
        // Each run on its own copy of the calibrated models.
        let own = dir.join(format!("drift-{}-{oracle}", p.name()));
        copy_models(dir, &own)?;
        let (ctx, devs) = node()?;
        ctx.set_perfmodel_dir(Some(own));
        ctx.set_scheduler(p);
        // Warm-up at the usual speed (the learning policy learns it).
        waves(&ctx, &devs, &k, None, 4, slots, false)?;
        let slow = oracle.then_some(&k_slow);
        waves(&ctx, &devs, &k, slow, n_waves, slots, true)
    };
    let oracle = run(SchedPolicy::Dmda, true)?;
    let total = |v: &[f64]| v.iter().sum::<f64>();
    rep.push_value("drift/makespan-ms-oracle", "ms", total(&oracle) / 1e6, 1);
    let mut dmda_total = None;
    for p in SchedPolicy::ALL {
        let r = run(p, false)?;
        rep.push_value(
            &format!("drift/makespan-ms-{}", p.name()),
            "ms",
            total(&r) / 1e6,
            1,
        );
        rep.ratios.insert(
            format!("drift/makespan-over-oracle-{}", p.name()),
            total(&r) / total(&oracle),
        );
        match p {
            SchedPolicy::Dmda => dmda_total = Some(total(&r)),
            SchedPolicy::Learned => {
                if let Some(d) = dmda_total {
                    rep.ratios
                        .insert("drift/learned-over-dmda".into(), total(&r) / d);
                }
                // Waves after the change until one is within 10 % of the
                // oracle's, in tasks.
                let half = n_waves / 2;
                let back = (half..n_waves)
                    .find(|&w| r[w] <= 1.1 * oracle[w])
                    .map_or(n_waves - half, |w| w - half);
                rep.push_value(
                    "drift/tasks-to-recover-learned",
                    "tasks",
                    (back * slots) as f64,
                    1,
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// dmda's share of work per device after a calibration with (or without)
/// 1 % of the fast accelerator's samples inflated.
fn shares(inflate: bool, quick: bool) -> Result<Vec<f64>> {
    let (ctx, devs) = node()?;
    ctx.set_perfmodel_dir(None);
    ctx.set_scheduler(SchedPolicy::Dmda);
    let k = kernel("outlier", 2.0 * NB3);
    let per_device = if quick { 200 } else { 400 };
    let slots = tiles(&ctx, 24)?;
    // Calibration: tasks forced on each device in turn, in waves.
    let mut on_fast = 0;
    for wave in 0..per_device * 3 / 24 {
        for (i, d) in slots.iter().enumerate() {
            let dev = (wave * 24 + i) % 3;
            let mut t = ctx.task(&k).read_write(d).on_device(dev);
            if dev == FAST {
                on_fast += 1;
                if inflate && on_fast % 100 == 50 {
                    t = t.grid(2);
                }
            }
            t.submit().map_err(err)?;
        }
        ctx.wait_tasks().map_err(err)?;
    }
    ctx.reset_task_stats();
    waves(
        &ctx,
        &devs,
        &k,
        None,
        if quick { 10 } else { 20 },
        24,
        false,
    )?;
    let st = ctx.task_stats();
    let total: u64 = st.per_device.iter().sum();
    Ok(st
        .per_device
        .iter()
        .map(|&n| 100.0 * n as f64 / total.max(1) as f64)
        .collect())
}

/// Tasks per timed batch of the overhead figures.
const BATCH: usize = 250;

/// Host ns per op of `n` events recorded on a fresh stream of `dev` (the
/// cheapest stream op; a task is at least one, its launch, which stamps its
/// own start and end).
fn stream_op_ns(dev: &Device, n: usize) -> Result<f64> {
    let s = dev.create_stream().map_err(err)?;
    let t0 = Instant::now();
    for _ in 0..n {
        s.record_event().map_err(err)?;
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    s.synchronize().map_err(err)?;
    Ok(ns)
}

/// `overhead/…`: host ns per empty task submitted, per policy, each on its
/// own context of a host device and an emulated one in real time; batches
/// of [`BATCH`] tasks, the policies and the stream-op reference taking
/// turns batch by batch (so a noisy moment of the machine falls on all of
/// them); median and p99 over batches, less the time submissions waited
/// for a device whose streams were all busy (as the graph figures).
fn overhead(rep: &mut BenchReport, quick: bool) -> Result<()> {
    let rounds = if quick { 20 } else { 80 };
    let empty = Kernel::new("empty", |_| {});
    let mut sides = Vec::new();
    for p in SchedPolicy::ALL {
        let host = Device::host().map_err(err)?;
        let emu = Device::new(
            DeviceConfig::default()
                .emu(EmuConfig::new(LinkPreset::pcie4x16()).time(TimeMode::Real)),
        )
        .map_err(err)?;
        let devs = vec![host, emu];
        let ctx = Context::new(&devs).map_err(err)?;
        ctx.set_perfmodel_dir(None);
        ctx.set_scheduler(p);
        // Task data keeps the context's task runtime (its streams) between
        // batches, as a program's data does.
        let keep = ctx.data::<u8>(1).map_err(err)?;
        for _ in 0..200 {
            ctx.task(&empty).submit().map_err(err)?;
        }
        ctx.wait_tasks().map_err(err)?;
        ctx.reset_task_stats();
        sides.push((p, ctx, devs, keep, Vec::new()));
    }
    let (mut op_host, mut op_emu) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (_, ctx, _, _, per_task) in &mut sides {
            let waited = ctx.task_stats().stream_wait_ns;
            let t0 = Instant::now();
            for _ in 0..BATCH {
                ctx.task(&empty).submit().map_err(err)?;
            }
            let ns = t0.elapsed().as_nanos() as f64;
            // Less the time submissions waited for a device whose streams
            // were all busy (the device's pace, not the host's work).
            let waited = (ctx.task_stats().stream_wait_ns - waited) as f64;
            per_task.push((ns - waited) / BATCH as f64);
            ctx.wait_tasks().map_err(err)?;
        }
        let devs = &sides[0].2;
        op_host.push(stream_op_ns(&devs[0], BATCH)?);
        op_emu.push(stream_op_ns(&devs[1], BATCH)?);
    }
    let host_op = rep
        .push_samples("overhead/stream-op-ns-host", "ns", &mut op_host)
        .median;
    let emu_op = rep
        .push_samples("overhead/stream-op-ns-emu", "ns", &mut op_emu)
        .median;
    for (p, ctx, _, _, mut per_task) in sides {
        let n = (rounds * BATCH) as u64;
        let st = ctx.task_stats();
        let name = p.name();
        let med = rep
            .push_samples(&format!("overhead/per-task-ns-{name}"), "ns", &mut per_task)
            .median;
        // The floor: one stream op on the device the task went to.
        let ops: f64 = st
            .per_device
            .iter()
            .zip([host_op, emu_op])
            .map(|(&k, op)| k as f64 * op)
            .sum::<f64>()
            / st.per_device.iter().sum::<u64>().max(1) as f64;
        rep.ratios.insert(
            format!("overhead/per-task-over-stream-ops-{name}"),
            med / ops,
        );
        rep.push_value(
            &format!("overhead/decision-ns-{name}"),
            "ns",
            st.decision_ns as f64 / n as f64,
            n,
        );
        rep.notes.push(format!(
            "overhead {name}: tasks per device {:?}, {} of {n} submissions waited for a busy \
             device's streams, {} streams made, dispatch per device (ns) {:?}",
            st.per_device,
            st.stream_waits,
            st.streams_made,
            st.dispatch_ns
                .iter()
                .map(|d| d.map(|ns| ns.round()))
                .collect::<Vec<_>>()
        ));
    }
    Ok(())
}

/// The calibration tasks of a dmda Cholesky run in a child process reading
/// the models under `dir`.
fn second_process(dir: &Path) -> Result<u64> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::process::Command::new(exe)
        .args(["bench", "placement", "--quick"])
        .env(CHILD_ENV, dir)
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("calibration-tasks "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("the child process printed no figure: {text}"))
}

/// In the child: one dmda Cholesky run on the models of `dir`.
fn child(dir: &Path, quick_tiles: usize) -> Result<()> {
    let k = kernels();
    let w = cholesky(&k, quick_tiles);
    let (ctx, devs) = node()?;
    ctx.set_perfmodel_dir(Some(dir.to_path_buf()));
    ctx.set_scheduler(SchedPolicy::Dmda);
    let r = online(&ctx, &devs, &w)?;
    println!("calibration-tasks {}", r.calibration);
    Ok(())
}

pub fn run(quick: bool) -> Result<BenchReport> {
    run_parts(quick, &[])
}

/// The parts `hetero bench placement --only` names.
pub const PARTS: [&str; 9] = [
    "cholesky", "graph", "models", "managed", "gemm", "random", "drift", "outliers", "overhead",
];

/// The bench with only the parts named in `only` (all when empty); an unknown
/// name is an error.
pub fn run_parts(quick: bool, only: &[String]) -> Result<BenchReport> {
    if let Some(bad) = only.iter().find(|o| !PARTS.contains(&o.as_str())) {
        return Err(format!(
            "--only {bad}: no such part; parts are {}",
            PARTS.join(", ")
        ));
    }
    let on = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    let t = if quick { 8 } else { 16 };
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        child(Path::new(&dir), 8)?;
        std::process::exit(0);
    }
    let mut rep = BenchReport::new("placement");
    let dir: PathBuf =
        std::env::temp_dir().join(format!("hetero-bench-placement-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    rep.context.insert("node".into(), format!(
        "emu in virtual time: cpu-like {}x{:.0} GFLOP/s, accelerators {}x{:.0} and {}x{:.0} GFLOP/s \
         (efficiency there {}), pcie4-switch peer links",
        NODE[0].0, NODE[0].1 / 1e9, NODE[1].0, NODE[1].1 / 1e9, NODE[2].0, NODE[2].1 / 1e9,
        ACCEL_EFFICIENCY.iter().map(|(k, e)| format!("{k} {e}")).collect::<Vec<_>>().join(", ")
    ));
    rep.context.insert("tile".into(), format!("{NB}x{NB} f64"));
    let k = kernels();
    let chol = cholesky(&k, t);
    rep.context.insert(
        "cholesky".into(),
        format!("{t}x{t} tiles, {} tasks", chol.tasks.len()),
    );
    if on("cholesky") {
        compare(&mut rep, &dir, "cholesky", &chol)?;
    } else if on("graph") || on("models") || on("managed") {
        calibrate(&dir, &chol)?;
    }
    if on("managed") {
        managed_figures(&mut rep, &dir, &chol)?;
    }
    // The graph figure: host time per task, placed replay over online dmda.
    if on("graph") {
        replay_figures(&mut rep, &dir, &chol, quick)?;
    }
    // Models in a second process (the child runs the 8x8 Cholesky: its
    // tasks' footprints, every tile being one size, are those calibrated
    // here).
    if on("models") {
        match second_process(&dir) {
            Ok(n) => rep.push_value("models/second-run-calibration-tasks", "tasks", n as f64, 1),
            Err(e) => {
                rep.unavailable
                    .insert("models/second-run-calibration-tasks".into(), e);
            }
        }
    }
    // Each workload calibrates its own models (gemm's kernel is also
    // Cholesky's: its figures do not depend on whether Cholesky ran first).
    if on("gemm") {
        let g = if quick { 6 } else { 8 };
        compare(&mut rep, &dir.join("gemm"), "gemm", &gemm(&k, g))?;
    }
    if on("random") {
        let (layers, width) = if quick { (8, 12) } else { (16, 16) };
        compare(
            &mut rep,
            &dir.join("random"),
            "random",
            &random(&k, layers, width),
        )?;
    }
    if on("drift") {
        drift(&mut rep, &dir, quick)?;
    }
    if on("outliers") {
        let clean = shares(false, quick)?;
        let dirty = shares(true, quick)?;
        let shift = clean
            .iter()
            .zip(&dirty)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        rep.push_value("outliers/work-share-shift", "points", shift, 1);
        rep.notes.push(format!(
            "outliers: dmda's work share per device (%), clean calibration {clean:.1?}, with 1 % \
             of the fast accelerator's samples inflated {dirty:.1?}"
        ));
    }
    if on("overhead") {
        overhead(&mut rep, quick)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rep)
}
