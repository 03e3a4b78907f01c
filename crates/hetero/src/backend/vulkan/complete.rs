//! Completing a flight's ops: their after-work (read-backs, event stamps),
//! their profiler records on the device's clock, then their streams' timelines.

use super::engine::{After, Taken, Times};
use super::{Shared, VulkanStream};
use crate::exec::op::{Body, Op};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Completes a taken op: its after-work, then its stream's timeline.
pub(super) fn complete(sh: &Shared, t: Taken, lost: Option<String>, stamps: &Stamps) {
    let Taken {
        stream,
        value,
        op,
        mut result,
        after,
        times,
        ..
    } = t;
    if let (Some(m), Ok(())) = (lost, &result) {
        result = Err(m);
    }
    if crate::exec::clock::profiling() {
        trace(sh, &stream, value, &op, &times, result.is_err(), stamps);
    }
    if result.is_ok() {
        match after {
            After::ReadBack { staging, out } => {
                let mut out = out.lock().unwrap_or_else(|p| p.into_inner());
                let n = out.len();
                // SAFETY: the staging buffer holds `n` bytes the device wrote
                // (its flight completed: the writes are visible to the host).
                unsafe {
                    std::ptr::copy_nonoverlapping(staging.ptr().as_ptr(), out.as_mut_ptr(), n)
                };
            }
            After::Stamp => {
                if let Body::Record { stamp } = &op.body {
                    let at = times.stamp.and_then(|q| stamps.get(q));
                    stamp.store(at.unwrap_or_else(|| sh.now_ns()), Ordering::Release);
                }
            }
            After::Keep(_) | After::KeepShared(_) | After::Nothing => {}
        }
        if let Some(span) = op.span() {
            // The device's timestamps around the dispatch, where it took
            // them (else the completion, as a record without them).
            let (start, end) = times
                .span
                .and_then(|q| span_ns(stamps, q))
                .unwrap_or_else(|| {
                    let now = sh.now_ns();
                    (now, now)
                });
            span.stamp(start, end);
        }
    }
    drop(op);
    stream.in_flight.fetch_sub(1, Ordering::Relaxed);
    // Where a fault scope starts here, the failing one ends before it
    // (`VulkanStream::faulted` ended it when recording), whatever this op's
    // result.
    if stream.timeline.failing() {
        stream.timeline.recover_at(value);
    }
    match result {
        Ok(()) => stream.timeline.complete(value),
        Err(m) => {
            // (A failure only the device's run showed fails the stream's
            // later ops from here, where it has no fault scopes.)
            if !stream.timeline.has_scopes() {
                stream.faulted_at.fetch_min(value, Ordering::Relaxed);
            }
            stream.timeline.fail(value, Arc::from(m))
        }
    }
}

/// The device's times at a start and an end query, where it wrote both.
fn span_ns(stamps: &Stamps, (a, b): (u32, u32)) -> Option<(u64, u64)> {
    Some((stamps.get(a)?, stamps.get(b)?))
}

/// The profiler's records of a completed op (and of a graph launch's nodes),
/// on the device's clock where it wrote timestamps, else at completion.
fn trace(
    sh: &Shared,
    stream: &VulkanStream,
    value: u64,
    op: &Op,
    times: &Times,
    failed: bool,
    stamps: &Stamps,
) {
    use crate::exec::op::CopyKind;
    use hetero_trace::EngineKind as E;
    let now = sh.now_ns();
    let span = |q| span_ns(stamps, q);
    let (start_ns, end_ns) = times.span.and_then(span).unwrap_or((now, now));
    let engine = match &op.body {
        Body::Kernel { .. } | Body::Graph(_) => E::Compute,
        Body::Copy { kind, .. } => match kind {
            CopyKind::H2D => E::CopyH2D,
            CopyKind::D2H => E::CopyD2H,
            CopyKind::D2D => E::CopyD2D,
        },
        Body::HostWrite { .. } => E::CopyH2D,
        Body::HostRead { .. } => E::CopyD2H,
        Body::CopyBatch(_) | Body::Copy2D(_) | Body::Fill { .. } => E::CopyD2D,
        _ => E::Host,
    };
    let (kind, dep) = op.trace_kind();
    hetero_trace::record_op(hetero_trace::OpRecord {
        kind,
        name: op.name(),
        stream: stream.id,
        queue: 0,
        engine,
        engine_index: 0,
        seq: value,
        submit_ns: op.submit_ns,
        start_ns,
        end_ns,
        bytes: op.bytes(),
        dep,
        failed,
        node: None,
    });
    if let Body::Graph(l) = &op.body {
        for &(v, a, b) in &times.nodes {
            let Some((start_ns, end_ns)) = span((a, b)) else {
                continue;
            };
            let body = &l.exec.nodes[v as usize];
            let (kind, bytes) = crate::exec::graph::launch::node_kind(body);
            hetero_trace::record_op(hetero_trace::OpRecord {
                kind,
                name: body.name(),
                stream: stream.id,
                queue: 0,
                engine: E::Compute,
                engine_index: 0,
                seq: value,
                submit_ns: op.submit_ns,
                start_ns,
                end_ns,
                bytes,
                dep: None,
                failed: false,
                node: Some(crate::exec::graph::launch::node_ref(&l.exec, v)),
            });
        }
    }
}

/// A flight's timestamps on the profiler's clock, by query index.
#[derive(Default)]
pub(super) struct Stamps {
    first: u32,
    ns: Vec<Option<u64>>,
    pool: u32,
}

impl Stamps {
    /// The `held` queries from the `freed`-th taken (a ring over the pool).
    pub(super) fn read(sh: &Shared, freed: u64, held: u64) -> Stamps {
        let Some(pool) = sh.queries.as_ref().filter(|_| held > 0) else {
            return Stamps::default();
        };
        let count = pool.count();
        let first = (freed % u64::from(count)) as u32;
        let held = held.min(u64::from(count)) as u32;
        // At most two runs: up to the pool's end, then from its start.
        let head = held.min(count - first);
        let mut device = pool.read_ns(first, head).unwrap_or_default();
        if held > head {
            device.extend(pool.read_ns(0, held - head).unwrap_or_default());
        }
        Stamps {
            first,
            ns: sh.to_host_ns(&device),
            pool: count,
        }
    }

    fn get(&self, q: u32) -> Option<u64> {
        let i = (q + self.pool - self.first) % self.pool.max(1);
        self.ns.get(i as usize).copied().flatten()
    }
}
