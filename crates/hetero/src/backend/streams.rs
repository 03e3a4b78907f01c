//! A backend's live streams, shared by both backends: the list (changed only when
//! a stream is created or released) and a generation that moves with every change,
//! so engines keep their own snapshot and copy it only when the set changed.
//!
//! Invariant: every change to the list bumps the generation (Release) under the
//! list's lock; a reader that sees a generation (Acquire) sees at least that list.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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
