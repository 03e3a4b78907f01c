//! Placement of tasks on the devices of a context: the scheduling policies
//! (eager, work stealing, dmda, dmdas, learned), the performance models they
//! read (`model.rs`) and the measured buses of devices without a link model
//! (`bus.rs`), the devices' observed dispatch times (`dispatch.rs`), the
//! learning policy's estimates (`learned.rs`) and the offline HEFT planner
//! (`heft.rs`).
//!
//! Plain data: a policy sees, per device that can run the task, a
//! [`Candidate`] the task layer (`api/task`) filled in (its expected free
//! time, where the task's data is, what moving it costs, the models'
//! predictions) and returns the device. Every policy but work stealing
//! decides when the task is submitted (StarPU's push-time decision, as its
//! dm* policies make); work stealing may hold a task back and hand it to the
//! first device with room later (`api/task`). A run's placements follow from
//! the submission order, the models and the completions the layer sees
//! (deterministic in virtual time).

pub(crate) mod bus;
pub(crate) mod dispatch;
pub(crate) mod heft;
pub(crate) mod learned;
pub(crate) mod model;

/// A scheduling policy of the task layer, chosen per context
/// ([`Context::set_scheduler`](crate::Context::set_scheduler), or
/// `HETERO_SCHED=eager|ws|dmda|dmdas|learned`; default `dmda`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedPolicy {
    /// The device with the fewest unfinished tasks per compute unit (StarPU's
    /// `eager`: the first free worker takes the next task; here decided at
    /// submission from the queues' lengths).
    Eager,
    /// Work stealing: a task goes where most of its data is (the producer's
    /// queue) while that device has fewer than [`WS_WINDOW`] tasks per compute
    /// unit in flight; else it is held back in a queue, and the first device
    /// with room takes it when the layer next runs (a submission,
    /// `wait_tasks`, `Task::wait`, `TaskData::to_vec`): its own device if
    /// room came there first, else another (the steal). Tasks touching the
    /// data of a held task are held behind it, so every datum's tasks still
    /// take effect in submission order.
    WorkStealing,
    /// Deque model, data aware: the device where the task would complete
    /// earliest, counting the device's queue, the task's predicted time
    /// from its performance model and the transfers its data needs (from
    /// the link models). Uncalibrated models first calibrate: the task goes
    /// to a device lacking samples.
    Dmda,
    /// `dmda`, with the task's priority as its stream's priority, and among
    /// devices whose completion is within [`READY_SLACK`] of the best, the
    /// one that needs the fewest bytes moved (ready data first).
    Dmdas,
    /// The learning policy (`exec/sched/learned.rs`): dmda's earliest
    /// completion, with execution times from exponentially weighted
    /// observations (the link models for transfers), and bounded
    /// exploration.
    Learned,
}

/// Tasks in flight per compute unit a device takes under work stealing
/// before further tasks are held back for whichever device frees first.
pub const WS_WINDOW: f64 = 2.0;
/// dmdas's slack: completions within this fraction of the best count as tied.
pub const READY_SLACK: f64 = 0.05;

impl SchedPolicy {
    /// Every policy, in the order figures list them.
    pub const ALL: [SchedPolicy; 5] = [
        SchedPolicy::Eager,
        SchedPolicy::WorkStealing,
        SchedPolicy::Dmda,
        SchedPolicy::Dmdas,
        SchedPolicy::Learned,
    ];

    /// The name `HETERO_SCHED` takes.
    pub fn name(self) -> &'static str {
        match self {
            SchedPolicy::Eager => "eager",
            SchedPolicy::WorkStealing => "ws",
            SchedPolicy::Dmda => "dmda",
            SchedPolicy::Dmdas => "dmdas",
            SchedPolicy::Learned => "learned",
        }
    }

    /// The policy named `name` (as `HETERO_SCHED` spells it).
    pub fn parse(name: &str) -> Option<SchedPolicy> {
        Self::ALL.into_iter().find(|p| p.name() == name.trim())
    }

    /// `HETERO_SCHED`, if set to a policy's name; a wrong name is a warning
    /// and the default.
    pub(crate) fn from_env() -> SchedPolicy {
        match std::env::var("HETERO_SCHED") {
            Ok(v) if !v.is_empty() => Self::parse(&v).unwrap_or_else(|| {
                tracing::warn!(
                    "HETERO_SCHED={v} names no policy (eager, ws, dmda, dmdas, learned); using dmda"
                );
                SchedPolicy::Dmda
            }),
            _ => SchedPolicy::Dmda,
        }
    }
}

/// One device that can run the task, as a policy sees it. Times are ns on
/// the task layer's clock.
#[derive(Clone, Debug, Default)]
pub(crate) struct Candidate {
    /// The device's index in its context.
    pub(crate) index: usize,
    /// Compute units (parallel lanes).
    pub(crate) lanes: usize,
    /// When its earliest lane is expected to be free.
    pub(crate) free_ns: f64,
    /// Tasks placed there and not yet seen complete.
    pub(crate) queued: usize,
    /// When the task's predecessors are expected to end.
    pub(crate) deps_end_ns: f64,
    /// The link models' time for the copies the task's data needs there
    /// (one after another, on the task's stream).
    pub(crate) transfer_ns: f64,
    /// Bytes of the task's data not valid there.
    pub(crate) bytes_to_move: u64,
    /// Bytes of the task's data valid there.
    pub(crate) local_bytes: u64,
    /// The history model's prediction of the execution time.
    pub(crate) predicted_ns: Option<f64>,
    /// Samples the history model has for this footprint there.
    pub(crate) samples: u64,
    /// The learning policy's estimate of the execution time there (asked
    /// only for the policies that read it: `learned` and work stealing).
    pub(crate) learned_ns: Option<f64>,
}

impl Candidate {
    /// When the task's inputs could all be there.
    pub(crate) fn data_ready(&self) -> f64 {
        self.deps_end_ns + self.transfer_ns
    }

    /// Expected completion with the history model (`dmda`).
    pub(crate) fn completion(&self) -> Option<f64> {
        Some(self.free_ns.max(self.data_ready()) + self.predicted_ns?)
    }
}

/// A policy's choice: the candidate's position in the list, and whether it
/// was made to calibrate a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Choice {
    pub(crate) at: usize,
    pub(crate) calibrating: bool,
}

/// Chooses among `c` (not empty) under `policy`.
pub(crate) fn choose(
    policy: SchedPolicy,
    c: &[Candidate],
    learner: &mut learned::Learner,
) -> Choice {
    debug_assert!(!c.is_empty());
    let plain = |at| Choice {
        at,
        calibrating: false,
    };
    let load = |x: &Candidate| x.queued as f64 / x.lanes.max(1) as f64;
    match policy {
        SchedPolicy::Eager => plain(argmin(c, load)),
        SchedPolicy::WorkStealing => {
            let home = argmin(c, |x| -(x.local_bytes as f64));
            if has_room(&c[home]) {
                plain(home)
            } else {
                plain(argmin(c, load))
            }
        }
        SchedPolicy::Dmda | SchedPolicy::Dmdas => {
            // Calibration first (StarPU: a task whose model lacks samples on
            // a device goes there), the fewest samples first.
            if let Some(at) = c
                .iter()
                .enumerate()
                .filter(|(_, x)| x.predicted_ns.is_none())
                .min_by_key(|(_, x)| x.samples)
                .map(|(i, _)| i)
            {
                return Choice {
                    at,
                    calibrating: true,
                };
            }
            let end = |x: &Candidate| x.completion().expect("all calibrated here");
            let best = argmin(c, end);
            if policy == SchedPolicy::Dmda {
                return plain(best);
            }
            let limit = end(&c[best]) + READY_SLACK * (end(&c[best]) - c[best].free_ns).max(0.0);
            let near: Vec<usize> = (0..c.len()).filter(|&i| end(&c[i]) <= limit).collect();
            plain(
                *near
                    .iter()
                    .min_by(|&&a, &&b| {
                        c[a].bytes_to_move
                            .cmp(&c[b].bytes_to_move)
                            .then(end(&c[a]).total_cmp(&end(&c[b])))
                    })
                    .expect("best is near"),
            )
        }
        SchedPolicy::Learned => learner.choose(c),
    }
}

/// Whether a device has fewer than [`WS_WINDOW`] tasks per compute unit in
/// flight.
pub(crate) fn has_room(x: &Candidate) -> bool {
    (x.queued as f64) < WS_WINDOW * x.lanes.max(1) as f64
}

/// The index of the smallest `key` (the first on ties).
pub(crate) fn argmin<T>(v: &[T], key: impl Fn(&T) -> f64) -> usize {
    let mut best = 0;
    for i in 1..v.len() {
        if key(&v[i]) < key(&v[best]) {
            best = i;
        }
    }
    best
}
