//! `hetero bench graph`: graphs and command buffers beside the same work
//! submitted op by op, on the device `HETERO_BACKEND` names (host when unset).
//!
//! Every figure is wall time on the thread that submits (launch, then
//! synchronize, unless a name says `host`), except the Cholesky figures, which
//! are on the device clock (`bench/graph_cholesky.rs`). A graph's figure and
//! its op-by-op peer are sampled alternately in one loop, so drift on a noisy
//! machine lands on both; every timed launch reuses one instantiated graph,
//! after untimed warm-up rounds, with the device idle when the clock starts.

use super::graph_cholesky;
use super::BenchReport;
use hetero::{
    Arg, BackendKind, CommandBuffer, Device, DeviceBuffer, DeviceConfig, Graph, GraphExec, Grid,
    Kernel, NodeId, Stream,
};
use std::time::Instant;

/// Nodes of the chain and of the fork/join graph.
const NODES: usize = 1_000;
/// Launches per sample of `graph-launch` and its peer.
const BATCH: usize = 64;
/// Slots of the rebinding graph.
const SLOTS: usize = 1_000;

/// The device the bench runs on: `DeviceConfig::from_env()`, an emulated
/// device given the CLI's compute rate (as `--device emu` gets it).
pub fn device() -> Device {
    let cfg = DeviceConfig::from_env().expect("HETERO_BACKEND names a device");
    let cfg = match cfg.backend_kind().clone() {
        BackendKind::Host | BackendKind::Vulkan { .. } => cfg,
        BackendKind::Emu(emu) => cfg.emu(emu.flops_per_unit(crate::device::EMU_FLOPS_PER_UNIT)),
    };
    Device::new(cfg).expect("device")
}

fn ns_since(t: Instant) -> f64 {
    t.elapsed().as_nanos() as f64
}

/// `warm` untimed rounds of each, then `reps` rounds of `a` and `b` in turn;
/// each call returns its sample.
pub(super) fn paired(
    warm: usize,
    reps: usize,
    mut a: impl FnMut() -> f64,
    mut b: impl FnMut() -> f64,
) -> (Vec<f64>, Vec<f64>) {
    for _ in 0..warm {
        a();
        b();
    }
    let (mut va, mut vb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        va.push(a());
        vb.push(b());
    }
    (va, vb)
}

fn sampled(warm: usize, reps: usize, mut f: impl FnMut() -> f64) -> Vec<f64> {
    for _ in 0..warm {
        f();
    }
    (0..reps).map(|_| f()).collect()
}

fn median(v: &[f64]) -> f64 {
    super::summarize("", "", &mut v.to_vec()).median
}

/// A chain of `n` launches of `k` recorded in a command buffer (each after the
/// one before), with the node of each launch.
fn chain(dev: &Device, k: &Kernel, n: usize) -> (Graph, Vec<NodeId>) {
    let cb = CommandBuffer::new(dev).expect("command buffer");
    let mut nodes = Vec::with_capacity(n);
    for _ in 0..n {
        cb.launch(k, Grid::new(1), &[]).expect("record launch");
        nodes.push(cb.last_node().expect("a launch was just recorded"));
    }
    (cb.into_graph().expect("command buffer to graph"), nodes)
}

/// One source, `n - 2` independent launches after it, one sink after them all.
fn fork_join(dev: &Device, k: &Kernel, n: usize) -> GraphExec {
    let mut g = Graph::new(dev).expect("graph");
    let src = g.kernel(k, Grid::new(1), &[], &[]).expect("source");
    let mid: Vec<NodeId> = (0..n - 2)
        .map(|_| g.kernel(k, Grid::new(1), &[], &[src]).expect("middle"))
        .collect();
    g.kernel(k, Grid::new(1), &[], &mid).expect("sink");
    g.instantiate().expect("instantiate fork/join")
}

/// `K` node indices spread evenly over `0..n`.
fn spread(k: usize, n: usize) -> Vec<usize> {
    (0..k).map(|i| i * n / k).collect()
}

/// CPU time of this process and of the whole machine since a point, to tell
/// the reader how much of the run other processes took (this VM is shared).
pub(super) struct CpuLoad {
    at: Instant,
    start: Option<(f64, f64)>,
}

impl CpuLoad {
    /// Busy CPU seconds of the machine (user, nice, system, irq, softirq) and of
    /// this process, from /proc; `None` where it cannot be read.
    fn read() -> Option<(f64, f64)> {
        let hz = rustix::param::clock_ticks_per_second() as f64;
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let f: Vec<f64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        let machine = [0, 1, 2, 5, 6]
            .iter()
            .map(|&i| f.get(i).copied().unwrap_or(0.0))
            .sum::<f64>();
        let me = std::fs::read_to_string("/proc/self/stat").ok()?;
        let g: Vec<&str> = me.rsplit(')').next()?.split_whitespace().collect();
        let own = g.get(11)?.parse::<f64>().ok()? + g.get(12)?.parse::<f64>().ok()?;
        Some((machine / hz, own / hz))
    }

    pub(super) fn now() -> CpuLoad {
        CpuLoad {
            at: Instant::now(),
            start: Self::read(),
        }
    }

    /// "; other processes used X of the Y CPU-seconds …", or nothing.
    pub(super) fn others_note(&self) -> String {
        let (Some((m0, o0)), Some((m1, o1))) = (self.start, Self::read()) else {
            return String::new();
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let wall = self.at.elapsed().as_secs_f64();
        let others = ((m1 - m0) - (o1 - o0)).max(0.0);
        format!(
            "; meanwhile other processes used {others:.2} CPU-s of the machine's {:.2} \
             ({:.0} %), this one {:.2}",
            wall * cores,
            100.0 * others / (wall * cores),
            o1 - o0
        )
    }
}

/// A copy of result `from` named `to` (a headline that is one of the series).
fn alias(rep: &mut BenchReport, from: &str, to: &str) {
    if let Some(r) = rep.results.iter().find(|r| r.name == from).cloned() {
        rep.results.push(super::BenchResult {
            name: to.into(),
            ..r
        });
    }
}

pub fn run(quick: bool) -> BenchReport {
    let mut rep = BenchReport::new("graph");
    let load = CpuLoad::now();
    let dev = device();
    let props = dev.properties().clone();
    let s = dev.create_stream().expect("stream");
    let k = Kernel::new("empty", |_| {});
    let (warm, reps) = if quick { (20, 200) } else { (200, 2_000) };
    let clock = median(&sampled(100, 10_000, || {
        let t = Instant::now();
        ns_since(t)
    }));
    rep.notes.push(format!(
        "device {} ({} backend, {} cores), default configuration (host waits spin 2 us, \
         yield to 200 us, then park); wall clock (an Instant pair costs {clock:.0} ns here, \
         inside every sample); a figure and its peer are sampled in turn",
        props.name,
        props.backend,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    ));
    if props.backend != "host" {
        rep.notes.push(
            "emulated device: wall-clock figures are the emulator's own work on the host (its \
             model of device time shows only in the Cholesky figures, on the device clock)"
                .into(),
        );
    }

    launch(&mut rep, &dev, &s, &k, warm, reps * 5);
    replay(&mut rep, &dev, &s, &k, warm, reps);
    update(&mut rep, &dev, &s, &k, warm, reps);
    instantiate(&mut rep, &dev, &k, quick);
    capture(&mut rep, &s, &k, quick);
    graph_cholesky::run(&mut rep, &dev, quick);
    super::graph_arena::run(&mut rep, quick);
    super::graph_arena::run_lanes(&mut rep, &dev, quick);
    rep.notes.push(format!(
        "whole run: {:.1} s{}",
        load.at.elapsed().as_secs_f64(),
        load.others_note()
    ));
    rep
}

/// An empty one-node graph launched `BATCH` times then synchronized, beside the
/// same kernel launched `BATCH` times on the stream.
fn launch(rep: &mut BenchReport, dev: &Device, s: &Stream, k: &Kernel, warm: usize, reps: usize) {
    let (g, _) = chain(dev, k, 1);
    let exec = g.instantiate().expect("instantiate");
    s.synchronize().expect("idle");
    let (mut a, mut b) = paired(
        warm,
        reps,
        || {
            let t = Instant::now();
            for _ in 0..BATCH {
                s.launch_graph(&exec).expect("launch_graph");
            }
            s.synchronize().expect("synchronize");
            ns_since(t) / BATCH as f64
        },
        || {
            let t = Instant::now();
            for _ in 0..BATCH {
                s.launch(k, Grid::new(1), &[]).expect("launch");
            }
            s.synchronize().expect("synchronize");
            ns_since(t) / BATCH as f64
        },
    );
    rep.push_samples("hetero/graph-launch", "ns", &mut a);
    rep.push_samples("stream/launch", "ns", &mut b);
    rep.ratio(
        "graph-launch/graph-over-stream",
        "hetero/graph-launch",
        "stream/launch",
    );
}

/// The 1 000-node chain and fork/join graph replayed, beside their launches op
/// by op; end to end per node, and host time of the submission alone.
fn replay(rep: &mut BenchReport, dev: &Device, s: &Stream, k: &Kernel, warm: usize, reps: usize) {
    let (g, _) = chain(dev, k, NODES);
    let exec = g.instantiate().expect("instantiate chain");
    let (mut host_g, mut host_s) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    let mut probe = Vec::with_capacity(reps);
    let (mut a, mut b) = paired(
        warm,
        reps,
        || {
            let t = Instant::now();
            s.launch_graph(&exec).expect("launch_graph");
            host_g.push(ns_since(t));
            s.synchronize().expect("synchronize");
            ns_since(t) / NODES as f64
        },
        || {
            let t = Instant::now();
            for _ in 0..NODES {
                s.launch(k, Grid::new(1), &[]).expect("launch");
            }
            host_s.push(ns_since(t));
            s.synchronize().expect("synchronize");
            let ns = ns_since(t) / NODES as f64;
            let t = Instant::now();
            s.launch(k, Grid::new(1), &[]).expect("launch");
            s.synchronize().expect("synchronize");
            probe.push(ns_since(t));
            ns
        },
    );
    probe.drain(..warm);
    // The host samples of the warm-up rounds go.
    host_g.drain(..warm);
    host_s.drain(..warm);
    let mut e2e: Vec<f64> = b.iter().zip(&a).map(|(st, gr)| st / gr).collect();
    let mut host: Vec<f64> = host_s.iter().zip(&host_g).map(|(st, gr)| st / gr).collect();
    let mut host_g_node: Vec<f64> = host_g.iter().map(|v| v / NODES as f64).collect();
    let mut host_s_node: Vec<f64> = host_s.iter().map(|v| v / NODES as f64).collect();
    rep.push_samples("hetero/graph-replay-per-node", "ns", &mut a);
    rep.push_samples("stream/replay-per-node", "ns", &mut b);
    rep.push_samples("hetero/graph-replay-host-per-node", "ns", &mut host_g_node);
    rep.push_samples("stream/replay-host-per-node", "ns", &mut host_s_node);
    rep.push_samples("hetero/graph-vs-stream", "x", &mut e2e);
    rep.push_samples("hetero/graph-vs-stream-host", "x", &mut host);
    rep.notes.push(
        "hetero/graph-vs-stream and -host: the ratio stream / graph of each pair of samples \
         taken one after the other (the ratios map holds the ratio of the medians)"
            .into(),
    );
    let trip = rep
        .push_samples("stream/sync-round-trip", "ns", &mut probe)
        .median;
    rep.notes.push(format!(
        "stream/sync-round-trip (one empty launch, then synchronize, sampled beside the chain) \
         is {:.1} us: every end-to-end sample holds one synchronize, so up to {:.0} ns of each \
         per-node replay figure and {:.0} ns of each graph-launch figure are that wait",
        trip / 1e3,
        trip / NODES as f64,
        trip / BATCH as f64,
    ));
    rep.ratio(
        "graph-replay/stream-over-graph",
        "stream/replay-per-node",
        "hetero/graph-replay-per-node",
    );
    rep.ratio(
        "graph-replay-host/stream-over-graph",
        "stream/replay-host-per-node",
        "hetero/graph-replay-host-per-node",
    );

    // Fork/join: the op-by-op peer spreads the middle over two streams.
    let exec = fork_join(dev, k, NODES);
    let s2 = dev.create_stream().expect("second stream");
    let (mut fork, mut join) = (hetero::Event::new(), hetero::Event::new());
    let (mut a, mut b) = paired(
        warm,
        reps,
        || {
            let t = Instant::now();
            s.launch_graph(&exec).expect("launch_graph");
            s.synchronize().expect("synchronize");
            ns_since(t) / NODES as f64
        },
        || {
            let t = Instant::now();
            s.launch(k, Grid::new(1), &[]).expect("source");
            s.record(&mut fork).expect("record fork");
            s2.wait_event(&fork).expect("wait fork");
            for i in 0..NODES - 2 {
                let on = if i % 2 == 0 { s } else { &s2 };
                on.launch(k, Grid::new(1), &[]).expect("middle");
            }
            s2.record(&mut join).expect("record join");
            s.wait_event(&join).expect("wait join");
            s.launch(k, Grid::new(1), &[]).expect("sink");
            s.synchronize().expect("synchronize");
            ns_since(t) / NODES as f64
        },
    );
    rep.push_samples("hetero/graph-replay-per-node-forkjoin", "ns", &mut a);
    rep.push_samples("stream/replay-per-node-forkjoin", "ns", &mut b);
    rep.ratio(
        "graph-replay-forkjoin/stream-over-graph",
        "stream/replay-per-node-forkjoin",
        "hetero/graph-replay-per-node-forkjoin",
    );
    rep.notes.push(format!(
        "fork/join peer: the source on stream A, an event, the {} middle kernels alternating \
         between streams A and B (B waits on the source's event), an event recorded on B that A \
         waits on, the sink on A; the graph's plan has {} chains on {} lanes",
        NODES - 2,
        exec.plan().chains,
        exec.plan().lanes,
    ));
}

/// `set_scalars` on K nodes of the chain, and rebinding K slots of a graph of
/// `SLOTS` slots; ns per node or slot. Each sample follows a launch that was
/// synchronized (nothing in flight), as an update between launches does.
fn update(rep: &mut BenchReport, dev: &Device, s: &Stream, k: &Kernel, warm: usize, reps: usize) {
    let (g, nodes) = chain(dev, k, NODES);
    let mut exec = g.instantiate().expect("instantiate chain");
    let mut value = 0u64;
    for kk in [1usize, 10, 100, 1_000] {
        let which: Vec<NodeId> = spread(kk, NODES).into_iter().map(|i| nodes[i]).collect();
        let mut v = sampled(warm, reps, || {
            s.launch_graph(&exec).expect("launch_graph");
            s.synchronize().expect("synchronize");
            value += 1;
            let t = Instant::now();
            for &n in &which {
                exec.set_scalars(n, &[value]).expect("set_scalars");
            }
            ns_since(t) / kk as f64
        });
        rep.push_samples(&format!("hetero/graph-update-per-node-k{kk}"), "ns", &mut v);
    }
    alias(
        rep,
        "hetero/graph-update-per-node-k100",
        "hetero/graph-update-per-node",
    );
    debug_assert_eq!(exec.scalars(nodes[0]).expect("scalars"), vec![value]);

    // Rebinding: each node writes its own slot; two buffers per slot, swapped.
    let cb = CommandBuffer::new(dev).expect("command buffer");
    let slots: Vec<_> = (0..SLOTS)
        .map(|_| cb.slot::<u32>(1).expect("slot"))
        .collect();
    for slot in &slots {
        cb.launch(k, Grid::new(1), &[Arg::write(slot)])
            .expect("record launch");
    }
    let exec = cb.finish().expect("instantiate slots graph");
    let bufs: [Vec<DeviceBuffer<u32>>; 2] =
        std::array::from_fn(|_| (0..SLOTS).map(|_| dev.alloc(1).expect("alloc")).collect());
    let mut table = exec.bindings();
    for (slot, buf) in slots.iter().zip(&bufs[0]) {
        table.bind(slot, buf).expect("bind");
    }
    let mut side = vec![0usize; SLOTS];
    for kk in [1usize, 10, 100, 1_000] {
        let which = spread(kk, SLOTS);
        let mut v = sampled(warm, reps, || {
            s.launch_graph_with(&exec, &table)
                .expect("launch_graph_with");
            s.synchronize().expect("synchronize");
            let t = Instant::now();
            for &i in &which {
                side[i] ^= 1;
                table.bind(&slots[i], &bufs[side[i]][i]).expect("rebind");
            }
            ns_since(t) / kk as f64
        });
        rep.push_samples(&format!("hetero/graph-rebind-per-slot-k{kk}"), "ns", &mut v);
    }
}

/// Instantiating the 1 000- and 10 000-node chains, ns per node; the graph is
/// recorded once, the exec dropped outside the clock.
fn instantiate(rep: &mut BenchReport, dev: &Device, k: &Kernel, quick: bool) {
    let mut total = [0.0f64; 2];
    for (i, (n, label)) in [(NODES, "1k"), (10 * NODES, "10k")].into_iter().enumerate() {
        let (g, _) = chain(dev, k, n);
        let reps = if quick { 40 } else { 400 } / (1 + 4 * i);
        let mut v = sampled(reps / 10 + 1, reps, || {
            let t = Instant::now();
            let exec = g.instantiate().expect("instantiate");
            let ns = ns_since(t);
            drop(exec);
            ns / n as f64
        });
        total[i] = median(&v) * n as f64;
        rep.push_samples(
            &format!("hetero/graph-instantiate-per-node-{label}"),
            "ns",
            &mut v,
        );
    }
    alias(
        rep,
        "hetero/graph-instantiate-per-node-1k",
        "hetero/graph-instantiate-per-node",
    );
    rep.push_value(
        "hetero/graph-instantiate-linearity",
        "x",
        total[1] / total[0],
        2,
    );
    rep.ratio(
        "graph-update/instantiate-over-update",
        "hetero/graph-instantiate-per-node",
        "hetero/graph-update-per-node-k1",
    );
    // The ratio wants the whole instantiate over one node's update.
    if let Some(r) = rep.ratios.get_mut("graph-update/instantiate-over-update") {
        *r *= NODES as f64;
    }
    rep.ratio(
        "graph-instantiate/instantiate-over-launch",
        "hetero/graph-instantiate-per-node",
        "stream/launch",
    );
}

/// Stream capture of 1 000 and 10 000 empty launches (begin_capture, the
/// launches, end_capture), ns per op; the graph dropped outside the clock.
fn capture(rep: &mut BenchReport, s: &Stream, k: &Kernel, quick: bool) {
    let mut total = [0.0f64; 2];
    for (i, (n, label)) in [(NODES, "1k"), (10 * NODES, "10k")].into_iter().enumerate() {
        let reps = if quick { 100 } else { 1_000 } / (1 + 4 * i);
        let mut v = sampled(reps / 10 + 1, reps, || {
            let t = Instant::now();
            s.begin_capture().expect("begin_capture");
            for _ in 0..n {
                s.launch(k, Grid::new(1), &[]).expect("captured launch");
            }
            let g = s.end_capture().expect("end_capture");
            let ns = ns_since(t);
            drop(g);
            ns / n as f64
        });
        total[i] = median(&v) * n as f64;
        rep.push_samples(&format!("hetero/capture-per-op-{label}"), "ns", &mut v);
    }
    alias(rep, "hetero/capture-per-op-1k", "hetero/capture-per-op");
    rep.push_value("hetero/capture-linearity", "x", total[1] / total[0], 2);
    rep.ratio(
        "capture/capture-over-launch",
        "hetero/capture-per-op",
        "stream/launch",
    );
    rep.ratio(
        "capture/capture-over-launch-host",
        "hetero/capture-per-op",
        "stream/replay-host-per-node",
    );
}
