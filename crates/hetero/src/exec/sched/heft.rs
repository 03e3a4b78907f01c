//! HEFT (Topcuoglu, Hariri, Wu 2002): an offline list schedule of a whole
//! DAG. Tasks are taken by decreasing upward rank (mean execution time plus
//! the longest mean path of communication and execution to an exit task);
//! each goes to the compute unit where it finishes earliest, counting the
//! transfers from its predecessors' devices and filling the earliest idle gap
//! long enough for it (insertion). Transfers are scheduled too: a copy
//! holds the copy engine out of its source device and the one into its
//! destination (as the runtime's peer copies do), in the earliest gap the
//! two share, and one copy of a task's output serves every later reader on
//! a device (its replica stays valid there), so the plan counts the queues
//! its copies make on the links.

/// One task of the DAG, as HEFT sees it.
#[derive(Clone, Debug, Default)]
pub(crate) struct HeftTask {
    /// Predecessors (earlier tasks) and the bytes each hands over (0 for an
    /// order-only edge).
    pub(crate) preds: Vec<(usize, u64)>,
    /// Data no task of the DAG wrote: (the device it is on, bytes).
    pub(crate) inputs: Vec<(usize, u64)>,
    /// Execution time per device; `None` where the task cannot run.
    pub(crate) cost: Vec<Option<f64>>,
}

/// Where and when HEFT placed a task.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Placed {
    pub(crate) device: usize,
    /// The compute unit of the device (its lane).
    pub(crate) lane: usize,
    pub(crate) start: f64,
    pub(crate) end: f64,
}

/// Places every task of `tasks` (in a topological order: predecessors have
/// smaller indices) on devices with `lanes[d]` compute units each; `comm(a,
/// b, bytes)` is the time to move `bytes` from device `a` to `b` (0 when
/// `a == b`). Every task must be able to run somewhere.
pub(crate) fn plan(
    tasks: &[HeftTask],
    lanes: &[usize],
    comm: &dyn Fn(usize, usize, u64) -> f64,
) -> Vec<Placed> {
    let devices = lanes.len();
    let mean_cost: Vec<f64> = tasks
        .iter()
        .map(|t| {
            let c: Vec<f64> = t.cost.iter().flatten().copied().collect();
            c.iter().sum::<f64>() / c.len().max(1) as f64
        })
        .collect();
    let mean_comm = |bytes: u64| {
        if bytes == 0 || devices < 2 {
            return 0.0;
        }
        let mut sum = 0.0;
        for a in 0..devices {
            for b in 0..devices {
                if a != b {
                    sum += comm(a, b, bytes);
                }
            }
        }
        // Over all ordered pairs, the same device (no cost) included.
        sum / (devices * devices) as f64
    };
    let mut succs: Vec<Vec<(usize, u64)>> = vec![Vec::new(); tasks.len()];
    for (i, t) in tasks.iter().enumerate() {
        for &(p, bytes) in &t.preds {
            succs[p].push((i, bytes));
        }
    }
    let mut rank = vec![0.0f64; tasks.len()];
    for i in (0..tasks.len()).rev() {
        let tail = succs[i]
            .iter()
            .map(|&(s, bytes)| mean_comm(bytes) + rank[s])
            .fold(0.0, f64::max);
        rank[i] = mean_cost[i] + tail;
    }
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    // Decreasing rank; a predecessor's rank exceeds its successor's whenever
    // costs are positive; ties keep the submission order, which is
    // topological.
    order.sort_by(|&a, &b| rank[b].total_cmp(&rank[a]).then(a.cmp(&b)));
    // Per (device, lane): what it has placed.
    let mut busy: Vec<Vec<Lane>> = lanes
        .iter()
        .map(|&n| (0..n.max(1)).map(|_| Lane::default()).collect())
        .collect();
    let mut placed: Vec<Option<Placed>> = vec![None; tasks.len()];
    // Copy engines: per device, its engine out and its engine in (a copy
    // holds one at each end, as a peer copy does), with insertion as the
    // compute units; per (task, device), when the task's output is there
    // (one copy serves every later reader on the device).
    let mut outs: Vec<Lane> = (0..devices).map(|_| Lane::default()).collect();
    let mut ins: Vec<Lane> = (0..devices).map(|_| Lane::default()).collect();
    let mut arrived: std::collections::HashMap<(usize, usize), f64> = Default::default();
    // The earliest start at or after `ready` of a `w`-long copy from `a` to `b`.
    let both = |outs: &[Lane], ins: &[Lane], a: usize, b: usize, ready: f64, w: f64| {
        let mut t = ready;
        loop {
            let t1 = outs[a].earliest(t, w);
            let t2 = ins[b].earliest(t1, w);
            if t2 == t1 {
                return t1;
            }
            t = t2;
        }
    };
    // A task whose predecessor is not placed yet (zero-cost ties) waits. (A
    // deque: the task taken is nearly always the first, and a `Vec`'s
    // removal from the front made a 100 000-task chain quadratic.)
    let mut pending: std::collections::VecDeque<usize> = order.into();
    while !pending.is_empty() {
        let pos = pending
            .iter()
            .position(|&i| tasks[i].preds.iter().all(|&(p, _)| placed[p].is_some()))
            .expect("the DAG is topologically ordered");
        let i = pending.remove(pos).expect("found above");
        let t = &tasks[i];
        let mut best: Option<(f64, usize, usize, f64)> = None;
        for (d, cost) in t.cost.iter().enumerate() {
            let Some(w) = *cost else { continue };
            let mut ready = 0.0f64;
            for &(p, bytes) in &t.preds {
                let pp = placed[p].expect("checked above");
                let at = if pp.device == d || bytes == 0 {
                    pp.end
                } else if let Some(&a) = arrived.get(&(p, d)) {
                    a
                } else {
                    let c = comm(pp.device, d, bytes);
                    both(&outs, &ins, pp.device, d, pp.end, c) + c
                };
                ready = ready.max(at);
            }
            let inputs: f64 = t
                .inputs
                .iter()
                .filter(|&&(home, _)| home != d)
                .map(|&(home, bytes)| comm(home, d, bytes))
                .sum();
            ready = ready.max(inputs);
            for (l, lane) in busy[d].iter().enumerate() {
                let start = lane.earliest(ready, w);
                if best.is_none_or(|(e, ..)| start + w < e) {
                    best = Some((start + w, d, l, start));
                }
            }
        }
        let (end, d, l, start) = best.expect("every task runs on some device");
        busy[d][l].insert(start, end);
        for &(p, bytes) in &t.preds {
            let pp = placed[p].expect("placed");
            if pp.device == d || bytes == 0 || arrived.contains_key(&(p, d)) {
                continue;
            }
            let c = comm(pp.device, d, bytes);
            let s0 = both(&outs, &ins, pp.device, d, pp.end, c);
            outs[pp.device].insert(s0, s0 + c);
            ins[d].insert(s0, s0 + c);
            arrived.insert((p, d), s0 + c);
        }
        placed[i] = Some(Placed {
            device: d,
            lane: l,
            start,
            end,
        });
    }
    placed.into_iter().map(|p| p.expect("all placed")).collect()
}

/// A compute unit's schedule: its busy intervals, and the idle gaps between
/// them, so that the earliest fit for a task looks only at gaps long enough
/// for it (a scan of every busy interval per task made a graph of n
/// independent tasks take n²/2 steps: 8.5 s for 100 000).
///
/// Invariants: `slots` sorted by start then end, disjoint but for
/// zero-length slots at boundaries (so their ends are sorted too), starts
/// at least 0; `gaps` the idle intervals of positive length
/// before `tail`, sorted, disjoint; `tail` the end of the last slot (0 with
/// none): everything from it on is idle. A zero-length slot splits a gap
/// too: no task straddles it (as a scan of the slots had it).
#[derive(Default)]
struct Lane {
    slots: Vec<(f64, f64)>,
    gaps: Vec<(f64, f64)>,
    tail: f64,
}

impl Lane {
    /// The earliest start at or after `ready` of a `w`-long interval in the
    /// idle time between the slots.
    fn earliest(&self, ready: f64, w: f64) -> f64 {
        if w <= 0.0 {
            // A zero-length task fits at any boundary: `ready`, unless that
            // falls strictly inside a slot, then that slot's end.
            let first = self.slots.partition_point(|&(_, e)| e <= ready);
            return match self.slots.get(first) {
                Some(&(s, e)) if s < ready => e,
                _ => ready,
            };
        }
        // Gaps that end before `ready + w` cannot hold the task.
        let first = self.gaps.partition_point(|&(_, b)| b < ready + w);
        self.gaps[first..]
            .iter()
            .map(|&(a, b)| (a.max(ready), b))
            .find(|&(t, b)| t + w <= b)
            .map_or(self.tail.max(ready), |(t, _)| t)
    }

    /// Takes `start..end` (idle, from [`Lane::earliest`]).
    fn insert(&mut self, start: f64, end: f64) {
        // By start, then end: a zero-length slot at another's start goes
        // first, so the ends stay sorted (a scan's answers are the same in
        // either order).
        let at = self.slots.partition_point(|s| (s.0, s.1) < (start, end));
        self.slots.insert(at, (start, end));
        if start >= self.tail {
            if start > self.tail {
                self.gaps.push((self.tail, start));
            }
            self.tail = end;
            return;
        }
        // Inside the gap that holds it: one does, but for a zero-length task
        // where two slots touch (no gap there to split).
        let g = self.gaps.partition_point(|&(_, b)| b < end);
        let Some(&(a, b)) = self.gaps.get(g).filter(|&&(a, _)| a <= start) else {
            debug_assert!(start == end, "{start}..{end} placed on busy time");
            return;
        };
        let parts = [(a, start), (end, b)];
        let keep = parts.into_iter().filter(|&(x, y)| y > x);
        self.gaps.splice(g..=g, keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_stays_on_the_fast_device_and_a_fork_spreads() {
        let chain: Vec<HeftTask> = (0..4)
            .map(|i| HeftTask {
                preds: if i == 0 {
                    vec![]
                } else {
                    vec![(i - 1, 1 << 20)]
                },
                inputs: vec![],
                cost: vec![Some(10.0), Some(30.0)],
            })
            .collect();
        let comm = |_: usize, _: usize, b: u64| b as f64 / 1e3;
        let p = plan(&chain, &[1, 1], &comm);
        assert!(p.iter().all(|x| x.device == 0));
        assert_eq!(p[3].end, 40.0);
        let fork: Vec<HeftTask> = (0..4)
            .map(|_| HeftTask {
                preds: vec![],
                inputs: vec![],
                cost: vec![Some(10.0), Some(12.0)],
            })
            .collect();
        let p = plan(&fork, &[1, 1], &comm);
        assert_eq!(p.iter().filter(|x| x.device == 1).count(), 2);
    }

    /// Copies hold a copy engine at each end: two outputs made at once on
    /// one device and read on another cross the link one after the other,
    /// and one copy serves every reader of an output on a device.
    #[test]
    fn copies_take_turns_on_the_engines_and_one_serves_every_reader() {
        let only = |d: usize, w: f64| {
            let mut cost = vec![None, None];
            cost[d] = Some(w);
            cost
        };
        let task = |preds: Vec<(usize, u64)>, cost| HeftTask {
            preds,
            inputs: vec![],
            cost,
        };
        // 0, 1 on device 0 (two units: both end at 10); 2, 3 read them on
        // device 1; 4 reads 0's output on device 1 too.
        let tasks = vec![
            task(vec![], only(0, 10.0)),
            task(vec![], only(0, 10.0)),
            task(vec![(0, 1000)], only(1, 1.0)),
            task(vec![(1, 1000)], only(1, 1.0)),
            task(vec![(0, 1000)], only(1, 1.0)),
        ];
        // 5 per copy.
        let comm = |_: usize, _: usize, b: u64| b as f64 / 200.0;
        let p = plan(&tasks, &[2, 4], &comm);
        let mut reads_copied: Vec<f64> = p[2..4].iter().map(|x| x.start).collect();
        reads_copied.sort_by(f64::total_cmp);
        // One copy from 10 to 15, the other from 15 to 20.
        assert_eq!(reads_copied, vec![15.0, 20.0], "{p:?}");
        // Task 4 reads what task 2's copy brought: no third copy.
        assert_eq!(p[4].start, p[2].start, "{p:?}");
    }

    /// A lane of these slots, placed in order.
    fn lane(slots: &[(f64, f64)]) -> Lane {
        let mut l = Lane::default();
        for &(s, e) in slots {
            l.insert(s, e);
        }
        l
    }

    #[test]
    fn insertion_fills_a_gap() {
        assert_eq!(lane(&[(0.0, 5.0), (20.0, 30.0)]).earliest(0.0, 10.0), 5.0);
        assert_eq!(lane(&[(0.0, 5.0), (12.0, 30.0)]).earliest(0.0, 10.0), 30.0);
    }

    /// The scan of every slot `earliest_gap` replaced.
    fn earliest_gap_by_scan(slots: &[(f64, f64)], ready: f64, w: f64) -> f64 {
        let mut t = ready;
        for &(s, e) in slots {
            if t + w <= s {
                return t;
            }
            t = t.max(e);
        }
        t
    }

    proptest::proptest! {
        /// A lane placing tasks where it finds room (gaps, zero-length tasks,
        /// boundaries) answers as a scan of every slot does, at every step.
        #[test]
        fn the_lane_answers_as_a_scan_of_every_slot(
            tasks in proptest::collection::vec((0u32..200, 0u32..12), 1..60),
        ) {
            let mut l = Lane::default();
            for (ready, w) in tasks {
                let (ready, w) = (f64::from(ready), f64::from(w));
                let want = earliest_gap_by_scan(&l.slots, ready, w);
                proptest::prop_assert_eq!(l.earliest(ready, w), want, "{:?}", &l.slots);
                l.insert(want, want + w);
            }
        }
    }

    /// A long chain is planned in about linear time (a lane's history was
    /// scanned per task, and the queue shifted per task): 200 000 tasks,
    /// which took minutes, finish well inside the test's time.
    #[test]
    fn a_long_chain_is_planned_whole() {
        let n = 200_000;
        let chain: Vec<HeftTask> = (0..n)
            .map(|i| HeftTask {
                preds: if i == 0 { vec![] } else { vec![(i - 1, 64)] },
                inputs: vec![],
                cost: vec![Some(10.0), Some(30.0)],
            })
            .collect();
        let p = plan(&chain, &[2, 1], &|_, _, b| b as f64);
        assert!(p.iter().all(|x| x.device == 0));
        assert_eq!(p[n - 1].end, 10.0 * n as f64);
    }
}
