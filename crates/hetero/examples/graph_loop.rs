//! Graph costs at a glance (for profiling the graph paths; `hetero bench graph`
//! is the benchmark): `cargo run --release --example graph_loop -- [nodes] [reps]`
//! prints median ns per node of a chain of empty kernels replayed end to end,
//! the same kernels launched op by op, a fork/join replay, and capture,
//! instantiate, update and launch costs.
use hetero::{CommandBuffer, Device, Graph, Grid, Kernel, NodeId};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let mut cfg = hetero::DeviceConfig::from_env().expect("HETERO_BACKEND");
    match std::env::var("WAIT").as_deref() {
        Ok("block") => cfg = cfg.host_wait(hetero::CompletionMode::Block),
        Ok("spin") => cfg = cfg.host_wait(hetero::CompletionMode::Spin),
        Ok("yield") => cfg = cfg.host_wait(hetero::CompletionMode::Yield),
        _ => {}
    }
    if let Some(units) = std::env::var("UNITS").ok().and_then(|u| u.parse().ok()) {
        cfg = cfg.compute_units(units);
    }
    let dev = Device::new(cfg).expect("device");
    let s = dev.create_stream().expect("stream");
    let k = Kernel::new("empty", |_| {});
    let per = |t: Instant, n: usize| t.elapsed().as_nanos() as f64 / n as f64;

    let mut capture = Vec::new();
    let mut instantiate = Vec::new();
    let mut exec = None;
    for _ in 0..reps.min(50) {
        let t = Instant::now();
        let cb = CommandBuffer::new(&dev).expect("command buffer");
        for _ in 0..nodes {
            cb.launch(&k, Grid::new(1), &[]).expect("record");
        }
        let g = cb.into_graph().expect("graph");
        capture.push(per(t, nodes));
        let t = Instant::now();
        exec = Some(g.instantiate().expect("instantiate"));
        instantiate.push(per(t, nodes));
    }
    let mut exec = exec.expect("at least one rep");
    let mut stream_capture = Vec::new();
    for _ in 0..reps.min(50) {
        let t = Instant::now();
        s.begin_capture().expect("begin");
        for _ in 0..nodes {
            s.launch(&k, Grid::new(1), &[]).expect("record");
        }
        let g = s.end_capture().expect("end");
        stream_capture.push(per(t, nodes));
        drop(g);
    }
    let mut chain = Vec::new();
    let mut ops = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        s.launch_graph(&exec).expect("launch");
        s.synchronize().expect("sync");
        chain.push(per(t, nodes));
        let t = Instant::now();
        for _ in 0..nodes {
            s.launch(&k, Grid::new(1), &[]).expect("launch");
        }
        s.synchronize().expect("sync");
        ops.push(per(t, nodes));
    }
    let mut g = Graph::new(&dev).expect("graph");
    let src = g.empty(&[]).expect("node");
    let mids: Vec<NodeId> = (0..nodes.saturating_sub(2))
        .map(|_| g.kernel(&k, Grid::new(1), &[], &[src]).expect("node"))
        .collect();
    g.empty(&mids).expect("node");
    let fj = g.instantiate().expect("instantiate");
    let mut forkjoin = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        s.launch_graph(&fj).expect("launch");
        s.synchronize().expect("sync");
        forkjoin.push(per(t, nodes));
    }
    let ids: Vec<NodeId> = CommandBuffer::new(&dev)
        .map(|cb| {
            for _ in 0..nodes {
                cb.launch(&k, Grid::new(1), &[]).expect("record");
            }
            cb.into_graph().expect("graph")
        })
        .expect("graph")
        .nodes();
    let _ = ids;
    let node_ids: Vec<NodeId> = {
        // The nodes of `exec`'s graph: ids are (graph, index); rebuild from plan order.
        let g = CommandBuffer::new(&dev).expect("cb");
        for _ in 0..nodes {
            g.launch(&k, Grid::new(1), &[]).expect("record");
        }
        let g = g.into_graph().expect("graph");
        exec = g.instantiate().expect("instantiate");
        g.nodes()
    };
    let mut update = Vec::new();
    for r in 0..reps {
        let t = Instant::now();
        for &n in &node_ids {
            exec.set_scalars(n, &[r as u64]).expect("update");
        }
        update.push(per(t, nodes));
    }
    let one = {
        let cb = CommandBuffer::new(&dev).expect("cb");
        cb.launch(&k, Grid::new(1), &[]).expect("record");
        cb.finish().expect("exec")
    };
    let mut launch = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..100 {
            s.launch_graph(&one).expect("launch");
        }
        s.synchronize().expect("sync");
        launch.push(per(t, 100));
    }
    println!(
        "{nodes} nodes: replay chain {:.1} ns/node, op by op {:.1} ns/op, fork/join {:.1} ns/node, \
         capture {:.1} ns/op (stream {:.1}), instantiate {:.1} ns/node, update {:.1} ns/node, launch {:.1} ns",
        median(chain),
        median(ops),
        median(forkjoin),
        median(capture),
        median(stream_capture),
        median(instantiate),
        median(update),
        median(launch)
    );
}
