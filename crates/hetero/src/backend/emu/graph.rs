//! The modelled time of a graph launch on the emulated device: a list schedule of
//! its nodes on the compute units and copy engines the launch holds (one launch
//! overhead, then `GRAPH_NODE_NS` per kernel node), with each node's profile record.

use super::dma::D2D_SETUP_NS;
use super::engine::cost_ns;
use super::Shared;
use crate::config::link::Dir;
use crate::exec::kernel::KernelCost;
use crate::exec::op::CopyKind;

/// Where a launch's node records go: its stream, queue and value, and the
/// device time its first node may start.
pub(super) struct NodeTrace {
    pub(super) at: (u64, u32, u64),
    pub(super) from: u64,
    pub(super) submit_ns: u64,
    /// The first compute unit the launch holds.
    pub(super) first_unit: usize,
}

/// Device-side dispatch of one graph node, ns: a launch pays
/// `KERNEL_LAUNCH_NS` once, then each kernel node only this (the work a
/// command processor does per node, with no host submission in between).
pub(crate) const GRAPH_NODE_NS: u64 = 200;

/// The modelled time of a graph launch on `units` compute units and the
/// device's copy engines: nodes in topological order, each on the resource of
/// its kind that frees first, after its predecessors (a list schedule; the
/// launch has the link to itself). An error names a kernel node whose cost
/// has no modelled time (`cost_ns`).
pub(super) fn model_graph(
    sh: &Shared,
    l: &crate::exec::graph::launch::GraphLaunch,
    units: usize,
    traced: Option<NodeTrace>,
    run: &crate::exec::graph::run::RunState,
) -> Result<u64, String> {
    use crate::exec::graph::NodeBody;
    let e = &*l.exec;
    let link = &sh.emu.link;
    let engines = sh.copy_engines();
    // Free times: compute units, then H2D, D2H and D2D engines.
    let mut free: [Vec<u64>; 4] = [
        vec![0; units.max(1)],
        vec![0; engines[0].max(1)],
        vec![0; engines[1].max(1)],
        vec![0; engines[2].max(1)],
    ];
    let mut preds_end = vec![0u64; e.nodes.len()];
    let mut makespan = 0;
    for &v in &e.sched.order {
        let v = v as usize;
        let (resource, ns) = match &e.nodes[v] {
            NodeBody::Kernel { args: (a, n), .. } => {
                let (kernel, blocks) = l.params.kernel(v);
                let cost = match kernel.and_then(|k| k.cost_for(sh.emu.class)) {
                    Some(cost) => cost(crate::Grid::new(blocks)),
                    None => KernelCost {
                        flops: 0.0,
                        bytes: e.args[*a as usize..(*a + *n) as usize]
                            .iter()
                            .map(|arg| (arg.len * arg.elem.size) as f64)
                            .sum(),
                    },
                };
                let name = kernel.map_or("?", |k| k.name);
                let ns = cost_ns(sh, cost, 1).map_err(|e| format!("kernel '{name}': {e}"))?;
                (Some(0), GRAPH_NODE_NS + ns)
            }
            NodeBody::Copy {
                kind: kind @ (CopyKind::H2D | CopyKind::D2H),
                bytes,
                ..
            } => {
                let dir = if *kind == CopyKind::H2D {
                    Dir::H2D
                } else {
                    Dir::D2H
                };
                let wire = link.wire_bytes(*bytes as u64) / link.wire_rate(dir, false);
                (Some(1 + *kind as usize), link.setup_ns + wire.ceil() as u64)
            }
            NodeBody::Copy { bytes, .. } | NodeBody::Fill { bytes, .. } => {
                let ns = (*bytes as f64 / link.d2d_gbps).ceil() as u64;
                (Some(3), D2D_SETUP_NS + ns)
            }
            NodeBody::Copy2D(c) => (
                Some(1 + c.kind as usize),
                super::dma::copy2d_alone_ns(link, c.kind, c.src_r, c.dst_r),
            ),
            NodeBody::Host(_) | NodeBody::Wait { .. } | NodeBody::Empty => (None, 0),
        };
        let ready = preds_end[v];
        let (start, finish, index) = match resource {
            Some(r) => {
                let (index, slot) = free[r]
                    .iter_mut()
                    .enumerate()
                    .min_by_key(|(_, t)| **t)
                    .expect("every resource has an instance");
                let start = ready.max(*slot);
                // (Saturating: the launch's end is checked against the clock's reach.)
                *slot = start.saturating_add(ns);
                (start, *slot, index)
            }
            None => (ready, ready, 0),
        };
        if let Some(t) = &traced {
            use hetero_trace::EngineKind as E;
            let body = &e.nodes[v];
            let (kind, bytes) = crate::exec::graph::launch::node_kind(body);
            let engine = match resource {
                Some(0) => E::Compute,
                Some(1) => E::CopyH2D,
                Some(2) => E::CopyD2H,
                Some(_) => E::CopyD2D,
                None => E::Host,
            };
            hetero_trace::record_op(hetero_trace::OpRecord {
                kind,
                name: body.name(),
                stream: t.at.0,
                queue: t.at.1,
                engine,
                engine_index: (index + if resource == Some(0) { t.first_unit } else { 0 }) as u32,
                seq: t.at.2,
                submit_ns: t.submit_ns,
                start_ns: t.from + start,
                end_ns: t.from + finish,
                bytes,
                dep: None,
                failed: run.node_failed(v),
                node: Some(crate::exec::graph::launch::node_ref(e, v as u32)),
            });
        }
        makespan = makespan.max(finish);
        for &w in e.sched.successors(v as u32) {
            preds_end[w as usize] = preds_end[w as usize].max(finish);
        }
    }
    Ok(makespan)
}
