//! The host device's stream points for its memory pool: the point at the
//! current end of a stream (its last submitted op).
use super::Shared;
use crate::backend::BackendStream;
use std::sync::Arc;

/// The pool's [`hetero_memory::StreamPoints`]: the point at the current end of a
/// stream. Lock order: the pool's lock, then `streams` (nothing holding `streams`
/// calls into the pool).
#[derive(Debug)]
pub(super) struct Points {
    pub(super) shared: std::sync::Weak<Shared>,
}

impl hetero_memory::StreamPoints for Points {
    fn record(&self, stream: u64) -> Arc<dyn hetero_memory::StreamPoint> {
        let found = self.shared.upgrade().and_then(|sh| {
            sh.streams
                .find_map(|s| (s.id == stream).then(|| (s.timeline.clone(), s.submitted())))
        });
        crate::backend::tail_point(stream, found)
    }
}
