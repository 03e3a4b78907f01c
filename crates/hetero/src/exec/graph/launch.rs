//! What a graph launch op carries (`GraphLaunch`: the plan, its parameters and
//! bindings, and the buffers it locks) and how one node runs: its effect, or a
//! kernel's blocks, with the views the plan made; the hooks a backend gives the
//! runner (`NodeHooks`) and each node's profile record.
use super::plan::{Params, Plan};
use super::{NodeBody, Operand};
use crate::exec::kernel::{Args, Block, KView, MAX_KERNEL_ARGS};
use crate::exec::storage::{GraphHold, Storage};
use std::sync::Arc;

/// What a launch op carries.
pub(crate) struct GraphLaunch {
    pub(crate) exec: Arc<Plan>,
    pub(crate) params: Arc<Params>,
    pub(crate) table: Option<Arc<Vec<Option<GraphHold>>>>,
}

impl GraphLaunch {
    /// Every buffer the launch touches, once, with whether it writes it.
    pub(crate) fn for_each_access(&self, f: &mut impl FnMut(&Storage, bool) -> bool) -> bool {
        let e = &*self.exec;
        if !e.fixed.iter().all(|(s, w)| f(s, *w)) {
            return false;
        }
        if let Some(t) = &self.table {
            for (i, s) in t.iter().enumerate() {
                if let Some(s) = s.as_ref().filter(|_| e.slots.used[i]) {
                    if !f(s, e.slots.write[i]) {
                        return false;
                    }
                }
            }
        }
        e.arena.as_ref().is_none_or(|a| f(a, true))
    }

    /// Pinned buffers the launch writes: host reads wait for it.
    pub(crate) fn for_each_pinned_written(&self, mut f: impl FnMut(&Storage)) {
        self.for_each_access(&mut |s, w| {
            if w && s.kind == crate::MemoryKind::Pinned {
                f(s);
            }
            true
        });
    }

    #[inline]
    fn operand(&self, o: &Operand) -> *mut u8 {
        match o {
            Operand::Fixed(s) => s.engine_ptr(self.exec.reach),
            Operand::Slot(i) => self
                .table
                .as_ref()
                .and_then(|t| t[*i as usize].as_ref())
                .map_or(std::ptr::null_mut(), |s| s.engine_ptr(self.exec.reach)),
            Operand::Internal(i) => match &self.exec.arena {
                // SAFETY: the memory plan placed buffer `i` inside the arena.
                Some(a) => unsafe {
                    a.engine_ptr(self.exec.reach)
                        .add(self.exec.offsets[*i as usize])
                },
                None => std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
            },
        }
    }

    pub(crate) fn nodes(&self) -> usize {
        self.exec.nodes.len()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.exec
            .nodes
            .iter()
            .map(|n| match n {
                NodeBody::Copy { bytes, .. } | NodeBody::Fill { bytes, .. } => *bytes as u64,
                NodeBody::Copy2D(c) => (c.src_r.width * c.src_r.height) as u64,
                _ => 0,
            })
            .sum()
    }
}

impl Drop for GraphLaunch {
    fn drop(&mut self) {
        self.for_each_pinned_written(|s| s.finish_pending_write());
    }
}

/// What a backend does around the nodes it runs.
pub(crate) trait NodeHooks {
    /// Node `v` ran from `start_ns` to now (called only while profiling).
    fn record(&mut self, _l: &GraphLaunch, _v: u32, _start_ns: u64, _failed: bool) {}

    /// Runs node `v` (a backend may spread a kernel's blocks over its engines).
    fn run(&mut self, l: &GraphLaunch, v: u32) -> Result<(), String> {
        run_node(l, v)
    }
}

/// Runs block `b` of kernel node `v`, whose arguments are all known at
/// instantiate (no slot among them): what another engine can run without the
/// node's runner.
pub(crate) fn run_block(l: &GraphLaunch, v: u32, b: u32) -> Result<(), String> {
    let e = &*l.exec;
    let p = &l.params.nodes[v as usize];
    let Some(kernel) = &p.kernel else {
        return Ok(());
    };
    let views = &e.views[p.args.0 as usize..p.args.1 as usize];
    let scalars = l.params.scalars_of(p);
    let (name, f, blocks) = (kernel.name, kernel.host(), p.blocks);
    let mut block = Block::with(b, blocks, Args::Views(views), scalars);
    crate::exec::op::catch_user(|| format!("kernel '{name}' in block {b}"), || f(&mut block))
}

/// The trace kind and engine of a node run on a compute unit.
pub(crate) fn node_kind(body: &NodeBody) -> (hetero_trace::OpKind, u64) {
    use hetero_trace::OpKind as K;
    match body {
        NodeBody::Kernel { .. } => (K::Kernel, 0),
        NodeBody::Copy { kind, bytes, .. } => (kind.trace_kind(), *bytes as u64),
        NodeBody::Fill { bytes, .. } => (K::Fill, *bytes as u64),
        NodeBody::Copy2D(c) => (c.kind.trace_kind(), (c.src_r.width * c.src_r.height) as u64),
        NodeBody::Host(_) => (K::HostFn, 0),
        NodeBody::Wait { .. } | NodeBody::Empty => (K::Record, 0),
    }
}

/// The node's place for the trace.
pub(crate) fn node_ref(e: &Plan, v: u32) -> hetero_trace::NodeRef {
    hetero_trace::NodeRef {
        graph: e.graph,
        node: v,
        lane: e.sched.node_lane[v as usize],
    }
}

/// Runs node `v` of `l`: its data effect, or its user code (a panic is the
/// node's failure).
#[inline]
pub(crate) fn run_node(l: &GraphLaunch, v: u32) -> Result<(), String> {
    let e = &*l.exec;
    let p = &l.params.nodes[v as usize];
    if let Some(kernel) = &p.kernel {
        let range = p.args.0 as usize..p.args.1 as usize;
        let mut resolved = [std::mem::MaybeUninit::<KView>::uninit(); MAX_KERNEL_ARGS];
        let views: &[KView] = if p.slot_args {
            let args = &e.args[range];
            for (view, arg) in resolved.iter_mut().zip(args) {
                view.write(KView {
                    ptr: l.operand(&arg.operand),
                    len: arg.len,
                    unit: arg.unit,
                    elem: arg.elem,
                    write: arg.write,
                });
            }
            // SAFETY: the loop initialised the first `args.len()` entries
            // (a launch has at most MAX_KERNEL_ARGS arguments).
            unsafe { std::slice::from_raw_parts(resolved.as_ptr().cast::<KView>(), args.len()) }
        } else {
            // Fixed buffers and the arena: resolved at instantiate.
            &e.views[range]
        };
        let scalars = l.params.scalars_of(p);
        let (name, f, blocks) = (kernel.name, kernel.host(), p.blocks);
        if blocks == 1 {
            let mut block = Block::with(0, 1, Args::Views(views), scalars);
            return crate::exec::op::catch_user(
                || format!("kernel '{name}' in block 0"),
                || f(&mut block),
            );
        }
        let mut result = Ok(());
        for b in 0..blocks {
            let mut block = Block::with(b, blocks, Args::Views(views), scalars);
            let r = crate::exec::op::catch_user(
                || format!("kernel '{name}' in block {b}"),
                || f(&mut block),
            );
            if result.is_ok() {
                result = r;
            }
        }
        return result;
    }
    match &e.nodes[v as usize] {
        // Kernel nodes always have their kernel in the parameters.
        NodeBody::Kernel { .. } => Ok(()),
        NodeBody::Copy {
            src,
            src_off,
            dst,
            dst_off,
            bytes,
            ..
        } => {
            // SAFETY: ranges were checked when the node was recorded against
            // buffers of the same lengths (slots are bound only to buffers of
            // their length); source and destination are different buffers, and
            // the node's order against every other node that touches them
            // (hazard edges) plus the launch's access locks exclude every other
            // writer.
            unsafe {
                crate::exec::effects::copy_bytes(
                    l.operand(src),
                    *src_off,
                    l.operand(dst),
                    *dst_off,
                    *bytes,
                )
            };
            Ok(())
        }
        NodeBody::Fill {
            dst,
            off,
            bytes,
            pattern,
            pattern_len,
        } => {
            let pattern = &pattern[..*pattern_len as usize];
            // SAFETY: as for copies: checked range, sole writer.
            unsafe { crate::exec::effects::fill_bytes(l.operand(dst), *off, *bytes, pattern) };
            Ok(())
        }
        NodeBody::Copy2D(c) => {
            // SAFETY: as for copies: both regions were checked against buffers
            // of these lengths when recorded, they are different buffers, and
            // the node is the sole writer of dst.
            unsafe {
                crate::exec::effects::copy_rows(
                    l.operand(&c.src),
                    c.src_r,
                    l.operand(&c.dst),
                    c.dst_r,
                )
            };
            Ok(())
        }
        NodeBody::Host(f) => crate::exec::op::catch_user(|| "host callback".into(), || f()),
        // Waited for before the launch started.
        NodeBody::Wait { .. } | NodeBody::Empty => Ok(()),
    }
}
