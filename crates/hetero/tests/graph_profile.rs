//! A graph's launches in the profile, on the backend under test: the trace has
//! one Graph record per launch and a record per node inside its launch's span
//! (same stream and value), the Chrome trace nests them, and the report's
//! Graphs section shows the plan without counting a launch and its nodes twice.
//!
//! One test: the recorder is process-wide, so nothing else in this binary
//! records while it runs.

mod common;

use hetero::{Arg, Graph, Grid, Kernel};
use hetero_profile::{Report, ReportOptions};
use hetero_trace::OpKind;

/// out = in * 2.
fn double() -> Kernel {
    Kernel::new("double", |b| {
        let input = b.read::<u32>(0).to_vec();
        for (o, i) in b.write::<u32>(0).iter_mut().zip(input) {
            *o = i * 2;
        }
    })
    .wgsl(common::wgsl::map("u32", 1, "x0[i] * 2u"), "main")
}

/// out = a + b.
fn add() -> Kernel {
    Kernel::new("add", |b| {
        let (x, y) = (b.read::<u32>(0).to_vec(), b.read::<u32>(1).to_vec());
        for (o, (x, y)) in b.write::<u32>(0).iter_mut().zip(x.into_iter().zip(y)) {
            *o = x + y;
        }
    })
    .wgsl(common::wgsl::map("u32", 2, "x0[i] + x1[i]"), "main")
}

#[test]
fn graph_launches_nest_in_the_trace_and_fill_the_graphs_section() {
    if common::skipped("graph_launches_nest_in_the_trace_and_fill_the_graphs_section") {
        return;
    }
    const N: usize = 256;
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let src = dev.alloc::<u32>(N).unwrap();
    let out = dev.alloc::<u32>(N).unwrap();

    // fill → (double → left, double → right) → add: a fork and a join, its
    // two middle buffers inside the graph.
    let mut g = Graph::new(&dev).unwrap();
    let left = g.alloc::<u32>(N).unwrap();
    let right = g.alloc::<u32>(N).unwrap();
    let fill = g.fill(&src, 3u32, &[]).unwrap();
    let (k2, kadd) = (double(), add());
    let l = g
        .kernel(
            &k2,
            Grid::new(1),
            &[Arg::read(&src), Arg::write(&left)],
            &[fill],
        )
        .unwrap();
    let r = g
        .kernel(
            &k2,
            Grid::new(1),
            &[Arg::read(&src), Arg::write(&right)],
            &[fill],
        )
        .unwrap();
    g.kernel(
        &kadd,
        Grid::new(1),
        &[Arg::read(&left), Arg::read(&right), Arg::write(&out)],
        &[l, r],
    )
    .unwrap();
    let exec = g.instantiate().unwrap();
    let plan = exec.plan().clone();
    assert_eq!((plan.nodes, plan.critical_path, plan.width), (4, 3, 2));

    let _ = hetero_trace::take(); // start from an empty recorder
    hetero_trace::set_enabled(true);
    s.launch_graph(&exec).unwrap();
    s.launch_graph(&exec).unwrap();
    s.synchronize().unwrap();
    hetero_trace::set_enabled(false);
    let trace = hetero_trace::take();
    assert_eq!(s.read_to_vec(&out).unwrap(), vec![12; N]);

    // Two launches on the stream, each with its four nodes inside its span.
    let launches: Vec<_> = trace
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::Graph)
        .collect();
    assert_eq!(launches.len(), 2, "one Graph record per launch");
    let mut graph_id = None;
    for launch in &launches {
        assert_eq!(launch.stream, s.id());
        assert!(launch.node.is_none() && !launch.failed);
        let nodes: Vec<_> = trace
            .ops
            .iter()
            .filter(|o| o.node.is_some() && (o.stream, o.seq) == (launch.stream, launch.seq))
            .collect();
        assert_eq!(nodes.len(), plan.nodes, "a record per node of the launch");
        let mut ids: Vec<u32> = nodes.iter().map(|o| o.node.unwrap().node).collect();
        ids.sort_unstable();
        assert_eq!(ids, [0, 1, 2, 3], "each node once");
        for n in &nodes {
            let at = n.node.unwrap();
            assert_eq!(*graph_id.get_or_insert(at.graph), at.graph, "one graph");
            assert!(
                (at.lane as usize) < plan.lanes,
                "lane {} of {}",
                at.lane,
                plan.lanes
            );
            assert!(
                launch.start_ns <= n.start_ns && n.end_ns <= launch.end_ns,
                "node {} ({}) at {}..{} outside its launch {}..{}",
                at.node,
                n.name,
                n.start_ns,
                n.end_ns,
                launch.start_ns,
                launch.end_ns
            );
            assert!(!n.failed);
            let kind = if at.node == 0 {
                OpKind::Fill
            } else {
                OpKind::Kernel
            };
            assert_eq!(n.kind, kind, "node {}", at.node);
        }
    }
    let node_records = trace.ops.iter().filter(|o| o.node.is_some()).count();
    assert_eq!(
        node_records,
        2 * plan.nodes,
        "no node records besides the launches'"
    );
    let graph_id = graph_id.expect("node records");
    let traced = &trace.graphs[&graph_id];
    assert_eq!(
        (traced.nodes, traced.edges, traced.chains, traced.lanes),
        (4, plan.edges as u64, plan.chains as u64, plan.lanes as u64)
    );
    assert_eq!(
        (traced.critical_path, traced.width),
        (plan.critical_path as u64, plan.width as u64)
    );
    assert_eq!(
        (traced.internal_bytes, traced.arena_bytes),
        (plan.internal_bytes, plan.arena_bytes)
    );

    // The report: the Graphs section has the plan and both launches; the op
    // count holds each launch once, the engines each node once.
    let report = Report::build(&trace, &ReportOptions::default());
    let g = report
        .graphs
        .iter()
        .find(|g| g.graph == graph_id)
        .expect("the graph in the report");
    assert_eq!((g.launches, g.nodes, g.failed_launches), (2, 8, 0));
    assert_eq!((g.unmatched_nodes, g.nodes_outside_launch), (0, 0));
    let p = g.plan.expect("the plan in the trace");
    assert_eq!(
        (p.nodes, p.chains, p.lanes, p.critical_path, p.width),
        (4, plan.chains as u64, plan.lanes as u64, 3, 2)
    );
    assert_eq!(
        (p.internal_bytes, p.arena_bytes),
        (plan.internal_bytes, plan.arena_bytes)
    );
    let kernels = g
        .kinds
        .iter()
        .find(|k| k.kind == "Kernel")
        .expect("kernels");
    assert_eq!(kernels.count, 6);
    assert!(g.busy_fraction > 0.0 && g.busy_fraction <= 1.0);
    assert_eq!(report.ops as usize, trace.ops.len() - node_records);
    assert_eq!(report.graph_nodes as usize, node_records);
    let engine_ops: u64 = report.engines.iter().map(|e| e.ops).sum();
    assert_eq!(engine_ops as usize, trace.ops.len() - launches.len());
    let md = report.to_markdown();
    for want in [
        "## Graphs".to_string(),
        format!("### Graph {graph_id}"),
        format!(
            "Plan: 4 nodes, {} edges, {} chains on {} lanes, critical path 3, width 2;",
            plan.edges, plan.chains, plan.lanes
        ),
        "2 launches (0 failed), 8 node records".to_string(),
    ] {
        assert!(md.contains(&want), "report lacks {want:?}:\n{md}");
    }

    // The Chrome trace: node slices carry their place.
    let mut json = Vec::new();
    hetero_trace::write_chrome_trace(&trace, &mut json).unwrap();
    let json = String::from_utf8(json).unwrap();
    assert_eq!(
        json.matches(&format!("\"graph\":{graph_id},\"node\":"))
            .count(),
        2 * node_records,
        "each node on its stream and its engine"
    );
}
