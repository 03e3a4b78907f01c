//! `hetero bench profile`: the submit cost with the recorder off and on, in one run.

use super::{submit::hetero_submit_samples, BenchReport};

pub fn run(quick: bool) -> BenchReport {
    let batches = if quick { 3_000 } else { 30_000 };
    let mut rep = BenchReport::new("profile");
    let was = hetero_trace::enabled();
    // Interleave off and on rounds so drift on a shared machine hits both alike.
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        hetero_trace::set_enabled(false);
        off.extend(hetero_submit_samples(batches / 4));
        hetero_trace::set_enabled(true);
        on.extend(hetero_submit_samples(batches / 4));
        let _ = hetero_trace::take();
    }
    hetero_trace::set_enabled(was);
    rep.push_samples("hetero/submit-profiling-off", "ns", &mut off);
    rep.push_samples("hetero/submit-profiling-on", "ns", &mut on);
    rep.ratio_of("hetero/submit-profiling-on", "hetero/submit-profiling-off");
    rep
}
