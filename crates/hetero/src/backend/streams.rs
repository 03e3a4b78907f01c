//! A backend's live streams, shared by every backend: the list (changed only when
//! a stream is created or released) and a generation that moves with every change,
//! so engines keep their own snapshot and copy it only when the set changed; and
//! the memory pool's view of them (`Points`: where a stream stands).
//!
//! Invariant: every change to the list bumps the generation (Release) under the
//! list's lock; a reader that sees a generation (Acquire) sees at least that list.

use super::BackendStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub(crate) struct StreamList<S> {
    list: Mutex<Vec<Arc<S>>>,
    generation: AtomicU64,
}

impl<S> StreamList<S> {
    pub(crate) fn new() -> Self {
        StreamList {
            list: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<S>>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, s: Arc<S>) {
        let mut list = self.lock();
        list.push(s);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Forgets the streams `gone` picks.
    pub(crate) fn remove(&self, mut gone: impl FnMut(&S) -> bool) {
        let mut list = self.lock();
        list.retain(|s| !gone(s));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Brings `mine` up to date if the set changed since generation `seen`.
    #[inline]
    pub(crate) fn refresh(&self, mine: &mut Vec<Arc<S>>, seen: &mut u64) {
        let g = self.generation.load(Ordering::Acquire);
        if g != *seen {
            let list = self.lock();
            mine.clear();
            mine.extend(list.iter().cloned());
            *seen = g;
        }
    }

    /// `f` of every stream, in creation order.
    pub(crate) fn map<R>(&self, f: impl FnMut(&Arc<S>) -> R) -> Vec<R> {
        self.lock().iter().map(f).collect()
    }

    /// `f` of the first stream it accepts.
    pub(crate) fn find_map<R>(&self, f: impl FnMut(&Arc<S>) -> Option<R>) -> Option<R> {
        self.lock().iter().find_map(f)
    }

    /// Whether `f` holds for every stream.
    pub(crate) fn all(&self, f: impl FnMut(&Arc<S>) -> bool) -> bool {
        self.lock().iter().all(f)
    }
}

/// A backend's state as its memory pool sees it: its streams and its clock.
pub(crate) trait HasStreams: Send + Sync + 'static {
    type Stream: BackendStream;
    fn stream_list(&self) -> &StreamList<Self::Stream>;
    /// The device clock, ns (the host's unless the device models its own).
    fn clock_ns(&self) -> u64 {
        crate::exec::clock::now_ns()
    }
}

/// The pool's [`hetero_memory::StreamPoints`] of a backend: the point at the
/// current end of a stream (its last submitted op). It holds the backend's
/// state weakly, so the pool does not keep the engines' state alive. Lock
/// order: the pool's lock, then `streams` (nothing holding `streams` calls
/// into the pool).
pub(crate) struct Points<Sh> {
    shared: Weak<Sh>,
}

impl<Sh: HasStreams> Points<Sh> {
    pub(crate) fn new(shared: &Arc<Sh>) -> Arc<Self> {
        Arc::new(Points {
            shared: Arc::downgrade(shared),
        })
    }
}

impl<Sh> std::fmt::Debug for Points<Sh> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Points").finish_non_exhaustive()
    }
}

impl<Sh: HasStreams> hetero_memory::StreamPoints for Points<Sh> {
    fn record(&self, stream: u64) -> Arc<dyn hetero_memory::StreamPoint> {
        let found = self.shared.upgrade().and_then(|sh| {
            sh.stream_list()
                .find_map(|s| (s.id() == stream).then(|| (s.timeline().clone(), s.submitted())))
        });
        super::tail_point(stream, found)
    }

    fn now_ns(&self) -> u64 {
        self.shared
            .upgrade()
            .map_or_else(crate::exec::clock::now_ns, |sh| sh.clock_ns())
    }
}
