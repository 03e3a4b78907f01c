//! The instantiated graph users hold (`GraphExec`: launch it, change its
//! kernels, grids and scalars in place) and slot bindings (`Bindings`); the
//! plan itself is `exec::graph::plan`.
//!
//! Invariant: a `Bindings` table is shared copy-on-write with the launches in
//! flight; it never binds one buffer to two places of a launch (two slots, or
//! a slot and a buffer the graph names) unless neither is written, so a
//! launch's access set has no writer twice.

use crate::api::buffer::{DeviceBuffer, PinnedBuffer};
use crate::api::stream::Stream;
use crate::exec::graph::launch::GraphLaunch;
use crate::exec::graph::plan::{AddressMap, Params, Plan, PlanReport, SlotSpec, MAX_SCALARS};
use crate::exec::graph::NodeBody;
use crate::exec::loom::Ordering;
use crate::exec::op::Body;
use crate::exec::storage::{GraphHold, MemoryKind, Storage};
use crate::{Error, Result};
use bytemuck::Pod;
use std::sync::Arc;

/// An instantiated graph: launch it on any stream of its device with
/// [`Stream::launch_graph`](crate::Stream::launch_graph); change kernel
/// scalars, kernels and grids in place between launches.
pub struct GraphExec {
    pub(crate) inner: Arc<Plan>,
    pub(crate) params: Arc<Params>,
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec")
            .field("plan", &self.inner.report)
            .finish()
    }
}

fn update_error(detail: String) -> Error {
    Error::Graph {
        op: "GraphExec update",
        detail,
    }
}

impl GraphExec {
    /// The schedule and memory plan.
    pub fn plan(&self) -> &PlanReport {
        &self.inner.report
    }

    /// The parameters, for an update: copied first if a launch still holds
    /// them (copy-on-write), else changed in place.
    #[inline]
    fn params_mut(&mut self) -> &mut Params {
        if Arc::strong_count(&self.params) == 1 {
            // Pairs with the Release decrement of the last other owner's drop.
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            // SAFETY: this is the only strong reference, no `Weak` of the
            // parameters is ever made, and `&mut self` keeps this handle from
            // being cloned (launches clone it through `&self`) while the
            // borrow lives: nothing else can read or write them meanwhile.
            // (`Arc::make_mut` would do the same after an atomic RMW per call.)
            unsafe { &mut *(Arc::as_ptr(&self.params) as *mut Params) }
        } else {
            Arc::make_mut(&mut self.params)
        }
    }

    fn kernel_node(&self, node: crate::NodeId) -> Result<usize> {
        if node.graph != self.inner.graph {
            return Err(update_error(format!(
                "node {} belongs to another graph",
                node.index
            )));
        }
        let v = node.index as usize;
        // Kernel nodes have their kernel in the parameters (the common case,
        // without touching the node list).
        if self.params.nodes.get(v).is_some_and(|p| p.kernel.is_some()) {
            return Ok(v);
        }
        match self.inner.nodes.get(v) {
            Some(NodeBody::Kernel { .. }) => Ok(v),
            Some(other) => Err(update_error(format!(
                "node {v} is a {} node, not a kernel; only kernel nodes take scalars, kernels \
                 and grids (to change anything else, re-instantiate)",
                other.name()
            ))),
            None => Err(update_error(format!("node {v} does not exist"))),
        }
    }

    /// Sets the scalars of kernel node `node` for later launches (launches
    /// already submitted keep what they were given). At most [`MAX_SCALARS`].
    pub fn set_scalars(&mut self, node: crate::NodeId, scalars: &[u64]) -> Result<()> {
        let v = self.kernel_node(node)?;
        if scalars.len() > MAX_SCALARS {
            return Err(update_error(format!(
                "{} scalars given; a node takes at most {MAX_SCALARS}",
                scalars.len()
            )));
        }
        self.params_mut().set_scalars(v, scalars);
        Ok(())
    }

    /// Replaces the kernel and grid of kernel node `node` (its buffers stay: a
    /// different set of buffers is a different graph; re-instantiate for that).
    pub fn set_kernel(
        &mut self,
        node: crate::NodeId,
        kernel: &crate::Kernel,
        grid: crate::Grid,
    ) -> Result<()> {
        let v = self.kernel_node(node)?;
        if grid.blocks == 0 {
            return Err(Error::EmptyGrid {
                kernel: kernel.inner.name,
            });
        }
        // The new kernel has every kind of code the one it replaces has (so
        // it runs on the graph's device).
        if let Some(old) = &self.params.nodes[v].kernel {
            if old.f.is_some() {
                kernel.inner.runs_on(false, "of this graph")?;
            }
            if old.code.is_some() {
                kernel.inner.runs_on(true, "of this graph")?;
            }
        }
        let p = &mut self.params_mut().nodes[v];
        p.kernel = Some(kernel.inner.clone());
        p.blocks = grid.blocks;
        Ok(())
    }

    /// The scalars kernel node `node` runs with.
    pub fn scalars(&self, node: crate::NodeId) -> Result<Vec<u64>> {
        let v = self.kernel_node(node)?;
        Ok(self.params.scalars(v).to_vec())
    }

    /// An empty binding table for this graph's slots.
    pub fn bindings(&self) -> Bindings {
        Bindings::new(self.inner.slots.clone())
    }
}

/// The buffers bound to a graph's slots for its launches
/// ([`Stream::launch_graph_with`](crate::Stream::launch_graph_with)). Binding
/// costs O(1) per slot; a launch takes the table as it is then, so rebinding
/// afterwards never changes a launch already submitted.
#[derive(Clone)]
pub struct Bindings {
    /// The slots of the graph they bind.
    pub(crate) spec: Arc<SlotSpec>,
    pub(crate) table: Arc<Vec<Option<GraphHold>>>,
    /// Bound buffers by address: how many slots hold each, whether one writes.
    bound: AddressMap<(u32, bool)>,
}

impl std::fmt::Debug for Bindings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = self.table.iter().filter(|s| s.is_some()).count();
        f.debug_struct("Bindings")
            .field("slots", &self.table.len())
            .field("bound", &bound)
            .finish()
    }
}

impl Bindings {
    /// An empty table for the slots `spec` describes.
    pub(crate) fn new(spec: Arc<SlotSpec>) -> Bindings {
        Bindings {
            table: Arc::new(vec![None; spec.info.len()]),
            spec,
            bound: AddressMap::default(),
        }
    }

    fn bind_storage(
        &mut self,
        graph: u32,
        index: u32,
        storage: &Arc<Storage>,
        len: usize,
        elem: &'static crate::exec::kernel::ElemInfo,
        kind: MemoryKind,
    ) -> Result<()> {
        let op = "Bindings::bind";
        let e = &self.spec;
        if graph != e.graph || index as usize >= e.info.len() {
            return Err(Error::Graph {
                op,
                detail: "the slot belongs to another graph".into(),
            });
        }
        if storage.graph_ref != 0 {
            return Err(Error::stand_in(op));
        }
        if storage.device != e.device {
            return Err(Error::WrongDevice {
                op,
                buffer_device: storage.device,
                stream_device: e.device,
            });
        }
        let info = e.info[index as usize];
        if info.len != len || !std::ptr::eq(info.elem, elem) && (info.elem.id)() != (elem.id)() {
            return Err(Error::SizeMismatch {
                op,
                detail: format!(
                    "slot {index} holds {} elements of {}, the buffer {len} of {}; bind a \
                     buffer of the slot's length and type",
                    info.len,
                    (info.elem.name)(),
                    (elem.name)()
                ),
            });
        }
        debug_assert_eq!(info.kind, kind);
        let write = e.write[index as usize];
        let key = Arc::as_ptr(storage) as usize;
        let fixed_write = e.fixed.get(&key).copied();
        let again = self.table[index as usize]
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, storage));
        if !again {
            let other = self.bound.get(&key).copied();
            let clash = match (fixed_write, other) {
                (Some(w), _) if w || write => true,
                (_, Some((n, w))) if n > 0 && (w || write) => true,
                _ => false,
            };
            if clash {
                return Err(Error::Aliasing { op });
            }
            self.unbind(index);
            let entry = self.bound.entry(key).or_insert((0, false));
            entry.0 += 1;
            entry.1 |= write;
            // The table may outlive the buffer's handle (see `GraphHold`).
            self.table_mut()[index as usize] = Some(GraphHold::new(storage));
        }
        Ok(())
    }

    /// The table, for a change: copied first if a launch (or a clone of these
    /// bindings) still holds it, else changed in place.
    #[inline]
    fn table_mut(&mut self) -> &mut Vec<Option<GraphHold>> {
        if Arc::strong_count(&self.table) == 1 {
            // Pairs with the Release decrement of the last other owner's drop.
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            // SAFETY: this is the only strong reference, no `Weak` of the table
            // is ever made, and `&mut self` keeps it from being cloned (launches
            // and `clone` take `&self`) while the borrow lives.
            unsafe { &mut *(Arc::as_ptr(&self.table) as *mut Vec<Option<GraphHold>>) }
        } else {
            Arc::make_mut(&mut self.table)
        }
    }

    fn unbind(&mut self, index: u32) {
        let Some(old) = self.table[index as usize].as_ref() else {
            return;
        };
        let key = Arc::as_ptr(old) as usize;
        if let Some(entry) = self.bound.get_mut(&key) {
            entry.0 -= 1;
            if entry.0 == 0 {
                self.bound.remove(&key);
            }
        }
        self.table_mut()[index as usize] = None;
    }

    /// Binds device buffer `buffer` to `slot` (same length and type).
    pub fn bind<T: Pod>(&mut self, slot: &crate::Slot<T>, buffer: &DeviceBuffer<T>) -> Result<()> {
        self.bind_storage(
            slot.graph,
            slot.index,
            &buffer.storage,
            buffer.len(),
            crate::exec::kernel::ElemInfo::of::<T>(),
            MemoryKind::Device,
        )
    }

    /// Binds pinned buffer `buffer` to `slot` (same length and type).
    pub fn bind_pinned<T: Pod>(
        &mut self,
        slot: &crate::PinnedSlot<T>,
        buffer: &PinnedBuffer<T>,
    ) -> Result<()> {
        self.bind_storage(
            slot.graph,
            slot.index,
            &buffer.storage,
            buffer.len(),
            crate::exec::kernel::ElemInfo::of::<T>(),
            MemoryKind::Pinned,
        )
    }
}

/// `bindings`' table for a launch of the graph whose slots `spec` describes
/// (`None`: no bindings); an error if they were made for another graph or
/// leave a slot the graph uses unbound. `(graph, launch)` name the handle
/// and the call the messages point to.
pub(crate) fn table_for<'b>(
    bindings: Option<&'b Bindings>,
    spec: &Arc<SlotSpec>,
    op: &'static str,
    (graph, launch): (&str, &str),
) -> Result<Option<&'b Arc<Vec<Option<GraphHold>>>>> {
    if bindings.is_some_and(|b| !Arc::ptr_eq(&b.spec, spec)) {
        return Err(Error::Graph {
            op,
            detail: format!("the bindings were made for another graph; use {graph}.bindings()"),
        });
    }
    let table = bindings.map(|b| &b.table);
    for (i, &used) in spec.used.iter().enumerate() {
        if used && table.is_none_or(|t| t[i].is_none()) {
            return Err(Error::Graph {
                op,
                detail: format!(
                    "slot {i} is not bound; bind a buffer to it ({graph}.bindings(), \
                     Bindings::bind) and launch with {launch}"
                ),
            });
        }
    }
    Ok(table)
}

/// `Stream::launch_graph[_with]`.
pub(crate) fn launch(
    stream: &Stream,
    exec: &crate::GraphExec,
    bindings: Option<&crate::Bindings>,
) -> Result<()> {
    let op = "launch_graph";
    let e = &exec.inner;
    if stream.is_capturing() {
        return Err(Error::Graph {
            op,
            detail: "launching a graph while recording is not supported; record its work \
                     directly, or launch it after end_capture"
                .into(),
        });
    }
    if e.device != stream.device().id() {
        return Err(Error::WrongDevice {
            op,
            buffer_device: e.device,
            stream_device: stream.device().id(),
        });
    }
    let table = table_for(bindings, &e.slots, op, ("exec", "launch_graph_with"))?.cloned();
    for (timeline, value) in e.waits.iter() {
        if !timeline.is_reached(*value) || timeline.error_for(*value).is_some() {
            stream.submit(Body::Wait {
                timeline: timeline.clone(),
                value: *value,
                fault: true,
            })?;
        }
    }
    let launch = GraphLaunch {
        exec: e.clone(),
        params: exec.params.clone(),
        table,
    };
    // Counted before anything can fail: the launch's drop uncounts them.
    launch.for_each_pinned_written(|s| s.add_pending_write());
    if hetero_trace::enabled() && !e.plan_traced.swap(true, Ordering::Relaxed) {
        e.trace_plan();
    }
    let mut ordered = Ok(());
    launch.for_each_access(&mut |s, _| {
        ordered = stream.order_use(s);
        ordered.is_ok()
    });
    ordered?;
    if e.managed.is_empty() {
        stream.submit(Body::Graph(launch))?;
        return Ok(());
    }
    let mut launch = Some(launch);
    crate::api::managed::launch_graph(stream, &e.managed, &mut |_| match launch.take() {
        Some(l) => stream.submit(Body::Graph(l)),
        None => Err(Error::Graph {
            op,
            detail: "the launch was submitted twice".into(),
        }),
    })
}
