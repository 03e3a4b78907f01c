//! Task graphs placed at instantiate time: tasks recorded in submission
//! order (`TaskBuilder::record`), placed all at once with HEFT
//! (`exec/sched/heft.rs`) on the context's performance models and link
//! models, then launched as often as wanted with that placement: a launch
//! makes no scheduling decision (no policy, no model read).
//!
//! Hetero's stream graphs (`api/graph`) are one device's; this is the
//! context-wide counterpart for tasks.

use super::{dependencies_in, lock, Context, Runtime, Spec, Task, TaskBuilder};
use crate::exec::sched::heft::{self, HeftTask};
use crate::exec::sched::model;
use crate::Result;
use std::sync::Arc;

/// Tasks recorded for placement as a whole ([`TaskGraph::instantiate_on`]).
///
/// ```
/// use hetero::{Context, Device, Kernel, TaskGraph};
/// let devices = [Device::host().unwrap(), Device::host().unwrap()];
/// let ctx = Context::new(&devices).unwrap();
/// # ctx.set_perfmodel_dir(None); // the doctest writes no model file
/// let x = ctx.data_from(&[1u32; 4]).unwrap();
/// let inc = Kernel::new("inc", |b| b.write::<u32>(0).iter_mut().for_each(|v| *v += 1));
/// let mut g = TaskGraph::new();
/// ctx.task(&inc).read_write(&x).record(&mut g).unwrap();
/// let placed = g.instantiate_on(&ctx).unwrap();
/// placed.launch().unwrap();
/// placed.launch().unwrap();
/// assert_eq!(x.to_vec().unwrap(), vec![3; 4]);
/// ```
#[derive(Default)]
pub struct TaskGraph {
    pub(crate) specs: Vec<Spec>,
    pub(crate) rt: Option<Arc<Runtime>>,
}

/// A task graph with every task placed (HEFT); [`launch`](Self::launch)
/// submits its tasks where they were placed.
pub struct PlacedTaskGraph {
    specs: Vec<Spec>,
    rt: Arc<Runtime>,
    placement: Vec<usize>,
    makespan_ns: f64,
}

impl TaskGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tasks recorded.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Whether no task was recorded.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Places every task with HEFT (upward rank, earliest finish time with
    /// insertion) on `ctx`'s devices: execution times from the performance
    /// models (a kernel without a trusted model on a device costs its mean
    /// elsewhere, or 1 µs), transfers from the link models, data not written
    /// in the graph where it is now.
    pub fn instantiate_on(&self, ctx: &Context) -> Result<PlacedTaskGraph> {
        let rt = match &self.rt {
            Some(rt) => rt.clone(),
            None => ctx.task_runtime()?,
        };
        let n = rt.devices.len();
        let deps = dependencies_in(&self.specs);
        let mut tasks = Vec::with_capacity(self.specs.len());
        {
            let mut sc = lock(&rt.sched);
            for (i, spec) in self.specs.iter().enumerate() {
                let sizes = spec.access.iter().map(|(d, _)| d.bytes() as u64);
                let footprint = model::footprint(sizes.clone());
                let size: u64 = sizes.sum();
                let name = spec.kernel.name();
                let mut cost: Vec<Option<f64>> = (0..n)
                    .map(|d| {
                        rt.devices[d].check_code(&spec.kernel.inner).ok()?;
                        Some(
                            sc.models()
                                .predict(name, &rt.keys[d], footprint, size)
                                .map_or(f64::NAN, |p| p.0),
                        )
                    })
                    .collect();
                let known: Vec<f64> = cost
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|c| !c.is_nan())
                    .collect();
                let fill = if known.is_empty() {
                    1000.0
                } else {
                    known.iter().sum::<f64>() / known.len() as f64
                };
                for c in cost.iter_mut().flatten() {
                    if c.is_nan() {
                        *c = fill;
                    }
                }
                if cost.iter().all(Option::is_none) {
                    rt.devices[0].check_code(&spec.kernel.inner)?;
                }
                let mut inputs = Vec::new();
                for (data, mode) in &spec.access {
                    let written_before = self.specs[..i].iter().any(|s| {
                        s.access
                            .iter()
                            .any(|(x, m)| x.id() == data.id() && m.writes())
                    });
                    if mode.reads() && !written_before {
                        let st = lock(data.state());
                        let at = (0..n)
                            .find(|&d| st.valid[d].is_some())
                            .unwrap_or(super::HOME);
                        inputs.push((at, data.bytes() as u64));
                    }
                }
                tasks.push(HeftTask {
                    preds: deps[i].clone(),
                    inputs,
                    cost,
                });
            }
        }
        let comm = |a: usize, b: usize, bytes: u64| rt.transfer_ns(a, b, bytes);
        let placed = heft::plan(&tasks, &rt.lanes, &comm);
        Ok(PlacedTaskGraph {
            specs: self.specs.clone(),
            placement: placed.iter().map(|p| p.device).collect(),
            makespan_ns: placed.iter().map(|p| p.end).fold(0.0, f64::max),
            rt,
        })
    }
}

impl PlacedTaskGraph {
    /// The device (index in the context) of each task, in recording order.
    pub fn placement(&self) -> &[usize] {
        &self.placement
    }

    /// HEFT's predicted makespan, ns.
    pub fn predicted_makespan_ns(&self) -> f64 {
        self.makespan_ns
    }

    /// Submits every task on its placed device, in recording order (after
    /// the tasks submitted before, as any task).
    pub fn launch(&self) -> Result<Vec<Task>> {
        self.specs
            .iter()
            .zip(&self.placement)
            .map(|(s, &d)| self.rt.submit(s, Some(d)))
            .collect()
    }
}

impl TaskBuilder<'_> {
    /// Records the task into `graph` instead of submitting it; its index
    /// in the graph.
    pub fn record(self, graph: &mut TaskGraph) -> Result<usize> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let rt = match self.rt {
            Some(rt) => rt,
            None => self.ctx.task_runtime()?,
        };
        match &graph.rt {
            Some(g) if !Arc::ptr_eq(g, &rt) => {
                return Err(crate::Error::DeviceContext {
                    op: "TaskBuilder::record",
                    detail: "the graph holds tasks of another context".into(),
                })
            }
            Some(_) => {}
            None => graph.rt = Some(rt),
        }
        graph.specs.push(self.spec);
        Ok(graph.specs.len() - 1)
    }
}
