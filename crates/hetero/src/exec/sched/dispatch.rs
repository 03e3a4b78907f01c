//! A device's dispatch time: what it spends per task outside the kernel's
//! own span (an engine's hand-off of the op, a command buffer's submission
//! and the queue's start). A task's measured time is its launch's span, so
//! the models leave this out; the policies add it to a device's expected
//! free time, as a launch latency.
//!
//! Observed, not configured: the gap between the device's last task end
//! before a task started and that start, for tasks that were on the device
//! before that end and had nothing else to wait for (no dependency, no
//! copy): a unit was free and the device had the task and did not run it,
//! so the gap is its own (a lower bound: the task's unit may have freed
//! earlier). A task that started beside the last ones (before any of them
//! ended) counts as no gap. A task that reached the device after that end
//! says nothing (the gap would be the host's pace), so a device used now
//! and then keeps its estimate. The estimate is the median of the last
//! [`WINDOW`] such gaps once [`MIN_SAMPLES`] were seen; none before (the
//! policies then add nothing).
//!
//! Real time only: an emulated device in virtual time starts a kernel the
//! moment a unit frees (its launch latency is inside the kernel's span), so
//! a gap there is a wait for data or for the host, not dispatch.
//!
//! Beside it, [`floor`]: a device whose tasks run later than their
//! expected times (its dispatch time or a model short of the truth) stops
//! looking free.
//!
//! Plain data: no clocks, no devices.

/// Gaps kept per device.
pub(crate) const WINDOW: usize = 32;
/// Gaps before the estimate is used.
pub(crate) const MIN_SAMPLES: usize = 8;

/// One device's recent dispatch gaps and their median.
#[derive(Clone, Debug, Default)]
pub(crate) struct Dispatch {
    gaps: Vec<u64>,
    /// Where the next gap goes once the window is full.
    at: usize,
    seen: u64,
    median_ns: Option<f64>,
}

impl Dispatch {
    /// A task that was on the device at `queued` (device clock) started at
    /// `start`, after a unit freed at `unit_free`: a gap if it was there
    /// first (none if it started before: it ran beside).
    pub(crate) fn observe(&mut self, queued: u64, unit_free: u64, start: u64) {
        if queued == 0 || unit_free == 0 || queued > unit_free {
            return;
        }
        let gap = start.saturating_sub(unit_free);
        if self.gaps.len() < WINDOW {
            self.gaps.push(gap);
        } else {
            self.gaps[self.at] = gap;
            self.at = (self.at + 1) % WINDOW;
        }
        self.seen += 1;
        // The median again every few gaps (a selection among at most 32 on
        // the stack: cheap, and not per task).
        let n = self.gaps.len();
        if n >= MIN_SAMPLES && self.seen.is_multiple_of(4) {
            let mut s = [0u64; WINDOW];
            s[..n].copy_from_slice(&self.gaps);
            let (_, median, _) = s[..n].select_nth_unstable(n / 2);
            self.median_ns = Some(*median as f64);
        }
    }

    /// The expected dispatch time per task, ns (none until enough gaps).
    pub(crate) fn ns(&self) -> Option<f64> {
        self.median_ns
    }
}

/// Late devices: the work each device has not finished, the costs of its
/// tasks not seen complete (`(device, cost)`), summed into `work` (one
/// entry per device).
pub(crate) fn unfinished(work: &mut [f64], tasks: impl Iterator<Item = (usize, f64)>) {
    work.iter_mut().for_each(|w| *w = 0.0);
    for (d, cost) in tasks {
        work[d] += cost;
    }
}

/// The earliest a device with `work` unfinished (ns) on `units` compute
/// units can start another task, from `now`: that work shared among its
/// units. A device whose tasks run later than their models said then stops
/// looking free, for as long as they stay unfinished (StarPU's dmda moves a
/// worker's expected end as its tasks start); one on time is not moved
/// (its expected free times are later already).
pub(crate) fn floor(now: f64, work: f64, units: usize) -> f64 {
    now + work / units.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_device_stops_looking_free() {
        // Device 0 (two units) has three tasks of 400 unfinished: at 1,000
        // its units are free no earlier than 1,600, and later as time goes
        // by while they stay unfinished. Device 1 (one unit) has one of
        // 300; device 2 none: not before now. The sums start from zero.
        let mut work = vec![7.0; 3];
        let tasks = [(0, 400.0), (1, 300.0), (0, 400.0), (0, 400.0)];
        unfinished(&mut work, tasks.into_iter());
        assert_eq!(work, vec![1_200.0, 300.0, 0.0]);
        let at = |now| [(0, 2), (1, 1), (2, 4)].map(|(d, units)| floor(now, work[d], units));
        assert_eq!(at(1_000.0), [1_600.0, 1_300.0, 1_000.0]);
        assert_eq!(at(5_000.0), [5_600.0, 5_300.0, 5_000.0]);
    }

    #[test]
    fn only_tasks_already_on_the_device_count() {
        let mut d = Dispatch::default();
        // Arrived after their unit freed: the host's pace, not dispatch.
        for i in 0..64u64 {
            d.observe(1_000 * i + 500, 1_000 * i + 100, 1_000 * i + 50_000);
        }
        assert_eq!(d.ns(), None);
        // There before the unit freed: gaps of 300 ns, one of 90 µs (a
        // preemption) that the median ignores.
        for i in 0..16u64 {
            let free = 1_000_000 + 10_000 * i;
            let gap = if i == 5 { 90_000 } else { 300 };
            d.observe(free - 700, free, free + gap);
        }
        assert_eq!(d.ns(), Some(300.0));
        // Unknown times (0) are no sample.
        d.observe(0, 5, 10);
        d.observe(5, 0, 10);
        assert_eq!(d.ns(), Some(300.0));
    }

    #[test]
    fn the_estimate_follows_the_last_window() {
        let mut d = Dispatch::default();
        for i in 0..(WINDOW as u64) {
            d.observe(10, 100 + i, 100 + i + 200);
        }
        assert_eq!(d.ns(), Some(200.0));
        for i in 0..(WINDOW as u64) {
            d.observe(10, 100 + i, 100 + i + 2_000);
        }
        assert_eq!(d.ns(), Some(2_000.0));
    }

    #[test]
    fn too_few_gaps_give_no_estimate() {
        let mut d = Dispatch::default();
        for _ in 0..MIN_SAMPLES - 1 {
            d.observe(1, 2, 1_000);
        }
        assert_eq!(d.ns(), None);
    }
}
