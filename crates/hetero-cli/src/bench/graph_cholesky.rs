//! The tiled-Cholesky-shaped DAG of `hetero bench graph`: 16×16 tiles, 816
//! tasks (POTRF, TRSM, SYRK, GEMM in right-looking order), each a kernel that
//! busy-spins a fixed time and names the tiles it reads and writes. The graph
//! gets its edges only from those buffer accesses; the op-by-op peer orders the
//! same kernels on several streams with events.
//!
//! Figures are on the device clock (`Device::now_ns`: the wall clock on the
//! host, the model's time on an emulated device, where each task declares a
//! cost of the spin time on one compute unit) and are given against the bound
//! `max(critical path · t, tasks · t / compute units)`.

use super::BenchReport;
use hetero::{Arg, Device, DeviceBuffer, Event, Grid, Kernel, KernelCost, Stream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tiles per side.
const T: usize = 16;
/// Each task's spin.
const SPIN: Duration = Duration::from_micros(20);

#[derive(Clone, Copy)]
enum Kind {
    Potrf,
    Trsm,
    Syrk,
    Gemm,
}

/// One task: its kind, the tiles it reads, the tile it writes.
struct Task {
    kind: Kind,
    reads: Vec<(usize, usize)>,
    write: (usize, usize),
}

/// The tasks in right-looking order over the lower triangle.
fn tasks() -> Vec<Task> {
    let mut v = Vec::new();
    for k in 0..T {
        v.push(Task {
            kind: Kind::Potrf,
            reads: vec![],
            write: (k, k),
        });
        for i in k + 1..T {
            v.push(Task {
                kind: Kind::Trsm,
                reads: vec![(k, k)],
                write: (i, k),
            });
        }
        for i in k + 1..T {
            v.push(Task {
                kind: Kind::Syrk,
                reads: vec![(i, k)],
                write: (i, i),
            });
            for j in k + 1..i {
                v.push(Task {
                    kind: Kind::Gemm,
                    reads: vec![(i, k), (j, k)],
                    write: (i, j),
                });
            }
        }
    }
    v
}

fn tile_index(i: usize, j: usize) -> usize {
    i * (i + 1) / 2 + j
}

/// Spins `t`, adding the time it took (more than `t` when the engine was
/// preempted meanwhile) to `spun`.
fn spin(t: Duration, spun: &AtomicU64) {
    let start = Instant::now();
    while start.elapsed() < t {
        std::hint::spin_loop();
    }
    spun.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

fn kernels(spun: &Arc<AtomicU64>) -> [Kernel; 4] {
    // On the emulated device a task costs SPIN on one compute unit.
    let flops = SPIN.as_secs_f64() * crate::device::EMU_FLOPS_PER_UNIT;
    let make = |name: &'static str| {
        let spun = spun.clone();
        Kernel::with_cost(
            name,
            move |_| KernelCost { flops, bytes: 0.0 },
            move |_| spin(SPIN, &spun),
        )
    };
    [make("potrf"), make("trsm"), make("syrk"), make("gemm")]
}

fn args<'a>(tiles: &'a [DeviceBuffer<f64>], task: &Task) -> Vec<Arg<'a>> {
    let mut a: Vec<Arg<'a>> = task
        .reads
        .iter()
        .map(|&(i, j)| Arg::read(&tiles[tile_index(i, j)]))
        .collect();
    a.push(Arg::write(&tiles[tile_index(task.write.0, task.write.1)]));
    a
}

/// The op-by-op peer: task on the stream of its written tile's row (a 1-D
/// row-cyclic distribution), each task followed by an event that the other
/// streams wait on for the tiles it wrote (at most one wait per pair of
/// streams per producer, and none already covered by a later wait).
struct Streams<'a> {
    streams: &'a [Stream],
    /// Per stream, the events recorded after its tasks, in order.
    events: Vec<Vec<Event>>,
}

impl Streams<'_> {
    fn submit(&mut self, tiles: &[DeviceBuffer<f64>], tasks: &[Task], ks: &[Kernel; 4]) {
        let n = self.streams.len();
        // The producer of each tile: (stream, index of its event).
        let mut writer: Vec<Option<(usize, usize)>> = vec![None; tiles.len()];
        // waited[s][o]: events of stream o that stream s already waits past.
        let mut waited = vec![vec![None::<usize>; n]; n];
        let mut count = vec![0usize; n];
        for task in tasks {
            let s = task.write.0 % n;
            for &(i, j) in task.reads.iter().chain([&task.write]) {
                if let Some((o, e)) = writer[tile_index(i, j)] {
                    if o != s && waited[s][o].is_none_or(|w| w < e) {
                        self.streams[s]
                            .wait_event(&self.events[o][e])
                            .expect("wait_event");
                        waited[s][o] = Some(e);
                    }
                }
            }
            let kernel = &ks[task.kind as usize];
            self.streams[s]
                .launch(kernel, Grid::new(1), &args(tiles, task))
                .expect("launch");
            let e = count[s];
            if e == self.events[s].len() {
                self.events[s].push(Event::new());
            }
            self.streams[s]
                .record(&mut self.events[s][e])
                .expect("record");
            count[s] += 1;
            writer[tile_index(task.write.0, task.write.1)] = Some((s, e));
        }
    }
}

pub fn run(rep: &mut BenchReport, dev: &Device, quick: bool) {
    let tasks = tasks();
    let units = dev.properties().compute_units;
    let tiles: Vec<DeviceBuffer<f64>> = (0..T * (T + 1) / 2)
        .map(|_| dev.alloc(16).expect("tile"))
        .collect();
    let spun = Arc::new(AtomicU64::new(0));
    let ks = kernels(&spun);

    let mut g = hetero::Graph::new(dev).expect("graph");
    for task in &tasks {
        g.kernel(
            &ks[task.kind as usize],
            Grid::new(1),
            &args(&tiles, task),
            &[],
        )
        .expect("task node");
    }
    let exec = g.instantiate().expect("instantiate cholesky");
    let plan = exec.plan().clone();
    let cp = 3 * T - 2;
    let t = SPIN.as_nanos() as f64;
    let bound = (cp as f64 * t).max(tasks.len() as f64 * t / units as f64);

    let s = dev.create_stream().expect("stream");
    let streams: Vec<Stream> = (0..units.max(2))
        .map(|_| dev.create_stream().expect("stream"))
        .collect();
    let mut peer = Streams {
        streams: &streams,
        events: vec![Vec::new(); streams.len()],
    };

    let (warm, reps) = if quick { (2, 10) } else { (5, 60) };
    // The spin each task measured, summed over the timed replays of each side.
    let (mut spun_graph, mut spun_stream) = (0u64, 0u64);
    let load = super::graph::CpuLoad::now();
    let graph_once = || {
        spun.store(0, Ordering::Relaxed);
        let t0 = dev.now_ns();
        s.launch_graph(&exec).expect("launch_graph");
        s.synchronize().expect("synchronize");
        let ns = (dev.now_ns() - t0) as f64;
        spun_graph += spun.load(Ordering::Relaxed);
        ns / bound
    };
    let stream_once = || {
        spun.store(0, Ordering::Relaxed);
        let t0 = dev.now_ns();
        peer.submit(&tiles, &tasks, &ks);
        for st in peer.streams {
            st.synchronize().expect("synchronize");
        }
        let ns = (dev.now_ns() - t0) as f64;
        spun_stream += spun.load(Ordering::Relaxed);
        ns / bound
    };
    let (mut a, mut b) = super::graph::paired(warm, reps, graph_once, stream_once);
    let runs = ((warm + reps) * tasks.len()) as f64 * 1e3;
    rep.notes.push(format!(
        "cholesky: a task's spin took {:.1} us on average in the graph and {:.1} us op by op \
         (t = {} us: more means its engine lost the core meanwhile){}",
        spun_graph as f64 / runs,
        spun_stream as f64 / runs,
        SPIN.as_micros(),
        load.others_note(),
    ));
    rep.push_samples("hetero/graph-cholesky-over-bound", "x", &mut a);
    rep.push_samples("stream/cholesky-over-bound", "x", &mut b);
    rep.push_value(
        "hetero/graph-cholesky-critical-path",
        "nodes",
        plan.critical_path as f64,
        1,
    );
    rep.ratio(
        "graph-cholesky/stream-over-graph",
        "stream/cholesky-over-bound",
        "hetero/graph-cholesky-over-bound",
    );
    rep.notes.push(format!(
        "cholesky: {} tasks over {} tiles, each spinning {} us; bound max({cp}·t, {}·t/{units}) \
         = {:.0} us; plan: critical path {} (expected {cp}), {} chains on {} lanes, {} edges ({} \
         from buffer order); peer: the same kernels op by op on {} streams, a task on the stream \
         of its written tile's row modulo {}, an event after each task, cross-stream waits only \
         where a tile came from another stream; device clock",
        tasks.len(),
        tiles.len(),
        SPIN.as_micros(),
        tasks.len(),
        bound / 1e3,
        plan.critical_path,
        plan.chains,
        plan.lanes,
        plan.edges,
        plan.ordering_edges,
        streams.len(),
        streams.len(),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dag_has_816_tasks() {
        assert_eq!(tasks().len(), 816);
        assert_eq!(tile_index(T - 1, T - 1) + 1, T * (T + 1) / 2);
    }
}
