//! Recording: stream capture (the builders in `builder.rs` record through it).
//!
//! Invariants:
//! - a stream records into at most one capture at a time; its `CaptureSlot`
//!   holds that capture while `capturing` is set, and the capture's `lanes`
//!   list every stream recording into it (the origin first);
//! - all of a capture's state is behind its one lock: the draft, each lane's
//!   tail (the nodes the lane's next op depends on), the events recorded in
//!   it (each a set of nodes) and whether it is active; an op records only
//!   into an active capture, checked under that lock;
//! - an event recorded during a capture points at the capture's own timeline
//!   (stream id `CAPTURE_STREAM | session`), which never advances: it can be
//!   waited on only by streams recording into that capture (or joining it);
//! - a user stream's captures reuse one `Capture` (its slot's `home`), one
//!   session after another: each `begin` gives it a new session (id, timeline,
//!   draft), so events of an ended session never name the next one. While the
//!   home is active the stream records into it and into nothing else, so the
//!   stream's ops reach it with one lock (its state's), not two;
//! - lock order: a stream's slot, then a capture's state; nothing takes a
//!   slot's lock while it holds a state's.

use crate::api::event::{Event, EventPoint};
use crate::exec::graph::Draft;
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

mod ops;

pub(crate) use ops::new_slot;
pub(crate) use ops::{alloc, host, kernel, managed, submit};

/// Stream ids of capture timelines and recording streams have this bit.
pub(crate) const CAPTURE_STREAM: u64 = 1 << 62;

static NEXT_GRAPH: AtomicU32 = AtomicU32::new(1);
static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);
static CAPTURES: Mutex<Vec<Weak<Capture>>> = Mutex::new(Vec::new());

/// A stream's view of the capture it records into.
#[derive(Default)]
pub(crate) struct CaptureSlot {
    pub(crate) capturing: AtomicBool,
    pub(super) capture: Mutex<Option<Arc<Capture>>>,
    /// A recording stream's (a command buffer's, a graph's) own capture: set
    /// once when it starts, and the stream never records into another, so
    /// its ops reach the capture without taking `capture`'s lock.
    own: std::sync::OnceLock<Arc<Capture>>,
    /// The capture a user stream records into when it begins one itself,
    /// reused by each of its captures (made at the first).
    home: std::sync::OnceLock<Arc<Capture>>,
}

pub(crate) struct Capture {
    pub(super) state: Mutex<CaptureState>,
    /// The current session's id (for `find`; `CaptureState::session` is the
    /// one to trust, under the lock).
    session: AtomicU64,
}

pub(super) struct CaptureState {
    pub(super) draft: Draft,
    pub(super) lanes: Vec<Lane>,
    /// Events recorded in the capture: the nodes each stands for.
    events: Vec<Vec<u32>>,
    active: bool,
    session: u64,
    /// The session's timeline, which its events point at.
    timeline: Arc<Timeline>,
}

pub(super) struct Lane {
    stream: u64,
    /// Weak: the slot holds the capture, so a strong reference here would be
    /// a cycle that keeps both (and every buffer recorded) alive forever.
    slot: Weak<CaptureSlot>,
    pub(super) tail: Vec<u32>,
    /// Explicit building: the next op depends on exactly these (not the tail).
    pub(super) explicit: Option<Vec<u32>>,
    /// Whether the explicit call added its node.
    pub(super) added: Option<u32>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn capture_error(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Graph {
        op,
        detail: detail.into(),
    }
}

impl Capture {
    /// A new capture, inactive until `CaptureState::open` starts a session.
    fn new(device: u64, host_wait: crate::CompletionMode) -> Arc<Capture> {
        let cap = Arc::new(Capture {
            state: Mutex::new(CaptureState {
                draft: Draft::new(0, device),
                lanes: Vec::new(),
                events: Vec::new(),
                active: false,
                session: 0,
                timeline: Arc::new(Timeline::new(device, CAPTURE_STREAM, host_wait)),
            }),
            session: AtomicU64::new(0),
        });
        let mut all = lock(&CAPTURES);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&cap));
        cap
    }

    /// The capture whose current session is `session` (it may have ended since:
    /// check `CaptureState::session` under its lock).
    fn find(session: u64) -> Option<Arc<Capture>> {
        lock(&CAPTURES)
            .iter()
            .filter_map(Weak::upgrade)
            .find(|c| c.session.load(Ordering::Acquire) == session)
    }
}

impl CaptureState {
    /// Starts a session recording `draft`, with `lane` its origin.
    fn open(&mut self, cap: &Capture, draft: Draft, lane: Lane, host_wait: crate::CompletionMode) {
        // Its own serial, not the graph's id: a graph records again after a
        // capture ends, and that capture's events must not name the new one.
        let session = NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed);
        self.timeline = Arc::new(Timeline::new(
            draft.device,
            CAPTURE_STREAM | session,
            host_wait,
        ));
        self.draft = draft;
        self.lanes.clear();
        self.lanes.push(lane);
        self.events.clear();
        self.session = session;
        self.active = true;
        cap.session.store(session, Ordering::Release);
    }
}

pub(super) fn new_graph_id() -> u32 {
    NEXT_GRAPH.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff
}

/// Whether `timeline` is a capture's (its events exist only while recording).
pub(crate) fn is_capture_timeline(timeline: &Timeline) -> bool {
    timeline.stream & CAPTURE_STREAM != 0
}

/// The capture `slot` records into, locked.
#[inline]
pub(super) fn with_capture<R>(
    slot: &CaptureSlot,
    op: &'static str,
    f: impl FnOnce(&Capture, &mut CaptureState) -> Result<R>,
) -> Result<R> {
    let not_recording = || capture_error(op, "the stream is not recording");
    if let Some(cap) = slot.own.get() {
        let mut st = lock(&cap.state);
        if !st.active {
            return Err(not_recording());
        }
        return f(cap, &mut st);
    }
    // A stream recording the capture it began: its home is active (and it
    // records into nothing else meanwhile).
    if let Some(cap) = slot.home.get() {
        let mut st = lock(&cap.state);
        if st.active {
            return f(cap, &mut st);
        }
    }
    // A stream that joined another's capture. Lock order: the slot, then the
    // capture's state (as in `wait`).
    let guard = lock(&slot.capture);
    let cap = guard.as_ref().ok_or_else(not_recording)?;
    let mut st = lock(&cap.state);
    if !st.active {
        return Err(not_recording());
    }
    f(cap, &mut st)
}

/// Records an event at the capturing stream's current end.
pub(crate) fn record(slot: &CaptureSlot, stream: u64, event: &mut Event) -> Result<()> {
    with_capture(slot, "record", |_, st| {
        let tail = st.lane(stream).tail.clone();
        st.events.push(tail);
        event.point = Some(EventPoint::new(
            st.timeline.clone(),
            st.events.len() as u64,
            crate::api::event::Stamp::Cell(Arc::new(AtomicU64::new(0))),
        ));
        Ok(())
    })
}

/// A stream waits on an event recorded in a capture: it depends on the
/// event's nodes, joining the capture if it was not recording.
pub(crate) fn wait(slot: &Arc<CaptureSlot>, stream: u64, point: &EventPoint) -> Result<()> {
    let id = point.timeline.stream & !CAPTURE_STREAM;
    let ended = || {
        capture_error(
            "wait_event",
            "the event was recorded during a stream capture that has ended; record it again \
             outside the capture",
        )
    };
    let cap = Capture::find(id).ok_or_else(ended)?;
    let mut slot_cap = lock(&slot.capture);
    let mut st = lock(&cap.state);
    if !st.active || st.session != id {
        return Err(ended());
    }
    let Some(nodes) = st.events.get(point.value as usize - 1).cloned() else {
        return Err(ended());
    };
    match &*slot_cap {
        Some(c) if Arc::ptr_eq(c, &cap) => {
            let lane = st.lane(stream);
            let deps = lane.explicit.as_mut().unwrap_or(&mut lane.tail);
            for n in nodes {
                if !deps.contains(&n) {
                    deps.push(n);
                }
            }
        }
        Some(_) => {
            return Err(capture_error(
                "wait_event",
                "the stream records into another capture; an event of one capture cannot \
                 be waited on in another",
            ))
        }
        None => {
            st.lanes.push(Lane {
                stream,
                slot: Arc::downgrade(slot),
                tail: nodes,
                explicit: None,
                added: None,
            });
            *slot_cap = Some(cap.clone());
            slot.capturing.store(true, Ordering::Release);
        }
    }
    Ok(())
}

/// Starts recording on `stream`.
pub(crate) fn begin(
    slot: &Arc<CaptureSlot>,
    stream: u64,
    device: u64,
    host_wait: crate::CompletionMode,
) -> Result<()> {
    begin_with(
        slot,
        stream,
        Draft::new(new_graph_id(), device),
        host_wait,
        None,
        false,
    )
}

pub(super) fn begin_with(
    slot: &Arc<CaptureSlot>,
    stream: u64,
    draft: Draft,
    host_wait: crate::CompletionMode,
    explicit: Option<Vec<u32>>,
    recorder: bool,
) -> Result<()> {
    let mut slot_cap = lock(&slot.capture);
    if slot_cap.is_some() {
        return Err(capture_error(
            "begin_capture",
            "the stream is already recording into a capture; end that capture first",
        ));
    }
    let device = draft.device;
    let cap = if recorder {
        // A fresh recorder's slot: nothing set it before.
        let cap = Capture::new(device, host_wait);
        let _ = slot.own.set(cap.clone());
        cap
    } else {
        slot.home
            .get_or_init(|| Capture::new(device, host_wait))
            .clone()
    };
    let lane = Lane {
        stream,
        slot: Arc::downgrade(slot),
        tail: Vec::new(),
        explicit,
        added: None,
    };
    lock(&cap.state).open(&cap, draft, lane, host_wait);
    *slot_cap = Some(cap);
    slot.capturing.store(true, Ordering::Release);
    Ok(())
}

/// Ends the capture started on `stream`: every stream that joined it must have
/// been joined back (its last node an ancestor of the origin's end).
pub(crate) fn end(slot: &CaptureSlot, stream: u64) -> Result<Draft> {
    let cap = lock(&slot.capture).clone().ok_or_else(|| {
        capture_error(
            "end_capture",
            "the stream is not recording; call begin_capture first",
        )
    })?;
    let mut st = lock(&cap.state);
    if st.lanes[0].stream != stream {
        return Err(capture_error(
            "end_capture",
            format!(
                "stream {stream} joined a capture begun on stream {}; end it there",
                st.lanes[0].stream
            ),
        ));
    }
    let ancestors = if st.lanes.len() > 1 {
        st.draft.ancestors(&st.lanes[0].tail)
    } else {
        Vec::new()
    };
    for lane in &st.lanes[1..] {
        if let Some(&n) = lane.tail.iter().find(|&&n| !ancestors[n as usize]) {
            return Err(capture_error(
                "end_capture",
                format!(
                    "stream {} joined the capture and its work (node {n}) was not joined back: \
                     record an event on it and make stream {stream} wait on that event before \
                     end_capture",
                    lane.stream
                ),
            ));
        }
    }
    // Inactive from here: no op records into it any more, whatever the slots
    // still say, so they can be cleared after the state's lock is let go (a
    // slot's lock is never taken under a state's).
    st.active = false;
    let others: Vec<Arc<CaptureSlot>> = st.lanes.iter().filter_map(|l| l.slot.upgrade()).collect();
    st.lanes.clear();
    st.events.clear();
    let (id, device) = (st.draft.id, st.draft.device);
    let draft = std::mem::replace(&mut st.draft, Draft::new(id, device));
    drop(st);
    for other in &others {
        let mut c = lock(&other.capture);
        // Cleared only if it still names this capture (a stream that was
        // joined may have begun its own since).
        if c.as_ref().is_some_and(|c| Arc::ptr_eq(c, &cap)) {
            other.capturing.store(false, Ordering::Release);
            *c = None;
        }
    }
    Ok(draft)
}

impl Draft {
    /// Which nodes are `tail` or come before one of them.
    pub(crate) fn ancestors(&self, tail: &[u32]) -> Vec<bool> {
        let n = self.nodes.len();
        let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &(a, b) in &self.edges {
            preds[b as usize].push(a);
        }
        let mut seen = vec![false; n];
        let mut stack: Vec<u32> = tail.to_vec();
        while let Some(v) = stack.pop() {
            if std::mem::replace(&mut seen[v as usize], true) {
                continue;
            }
            stack.extend(&preds[v as usize]);
        }
        seen
    }
}
