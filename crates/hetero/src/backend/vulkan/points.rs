//! The Vulkan device's stream points for its memory pool: the point at the
//! current end of a stream (the tail of its ring).

use super::Shared;
use std::sync::{Arc, Weak};

/// The pool's view of where a stream stands (`hetero_memory::StreamPoints`).
#[derive(Debug)]
pub(super) struct Points {
    pub(super) shared: Weak<Shared>,
}

impl hetero_memory::StreamPoints for Points {
    fn record(&self, stream: u64) -> Arc<dyn hetero_memory::StreamPoint> {
        let found = self.shared.upgrade().and_then(|sh| {
            sh.streams
                .find_map(|s| (s.id == stream).then(|| (s.timeline.clone(), s.ring.tail())))
        });
        crate::backend::tail_point(stream, found)
    }

    fn now_ns(&self) -> u64 {
        self.shared.upgrade().map_or(0, |sh| sh.now_ns())
    }
}
