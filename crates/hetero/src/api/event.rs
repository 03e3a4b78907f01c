//! Events: a point (timeline, value) recorded on a stream. Waiting on an event
//! orders everything recorded before it before everything submitted after the wait,
//! on any stream. There is no event pool and no reset: recording again simply
//! points the event at a later value.

use crate::config::CompletionMode;
use crate::exec::point::TimelinePoint;
use crate::exec::timeline::Timeline;
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// An event the host signals: streams wait on it like on any other event
/// ([`Stream::wait_event`](crate::Stream::wait_event)), and it completes when
/// [`HostEvent::signal`] is called — like a host-signalled Vulkan timeline
/// semaphore, or `cuStreamWaitValue32` on host memory. Work waiting on it is
/// held back without occupying any engine, on every backend (in virtual time
/// too). Dropping it unsignalled fails it: the work waiting on it fails with
/// that fault instead of waiting forever.
///
/// ```
/// use hetero::Device;
/// let dev = Device::host().unwrap();
/// let s = dev.create_stream().unwrap();
/// let go = dev.host_event();
/// s.wait_event(go.event()).unwrap();
/// let done = s.record_event().unwrap();
/// assert!(!done.query().unwrap());
/// go.signal();
/// done.synchronize().unwrap();
/// ```
pub struct HostEvent {
    event: Event,
    timeline: Arc<Timeline>,
    device: crate::Device,
}

impl HostEvent {
    pub(crate) fn new(device: crate::Device, timeline: Arc<Timeline>) -> Self {
        let stamp = Arc::new(AtomicU64::new(0));
        let event = Event {
            point: Some(EventPoint::new(timeline.clone(), 1, Stamp::Cell(stamp))),
        };
        HostEvent {
            event,
            timeline,
            device,
        }
    }

    /// The event streams wait on.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Completes the event (once; later calls do nothing): work waiting on it
    /// may run.
    pub fn signal(&self) {
        self.finish(None);
    }

    /// Whether it was signalled (or dropped).
    pub fn is_signalled(&self) -> bool {
        self.timeline.is_reached(1)
    }

    fn finish(&self, fault: Option<&str>) {
        if self.timeline.is_reached(1) {
            return;
        }
        if let Some(Stamp::Cell(s)) = self.event.point.as_ref().and_then(|p| p.stamp.as_ref()) {
            s.store(self.device.now_ns(), Ordering::Release);
        }
        match fault {
            None => self.timeline.complete(1),
            Some(m) => self.timeline.fail(1, Arc::from(m)),
        }
        self.device.kick();
    }
}

impl Drop for HostEvent {
    fn drop(&mut self) {
        self.finish(Some("the host event was dropped before it was signalled"));
    }
}

impl std::fmt::Debug for HostEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostEvent")
            .field("signalled", &self.is_signalled())
            .finish()
    }
}

/// Where the device writes the time an event was reached.
#[derive(Clone)]
pub(crate) enum Stamp {
    /// A record op's own cell (or a host event's).
    Cell(Arc<AtomicU64>),
    /// The end of a stamped launch.
    End(Arc<crate::exec::op::Span>),
}

impl Stamp {
    fn ns(&self) -> u64 {
        match self {
            Stamp::Cell(c) => c.load(Ordering::Acquire),
            Stamp::End(s) => s.end_ns(),
        }
    }
}

/// A recorded event: its point on a timeline, and where the stream stamps the
/// time it was reached (for `Event::elapsed`; none for a point only waited
/// on: [`Event::at`]). Derefs to the point.
#[derive(Clone)]
pub(crate) struct EventPoint {
    pub(crate) point: TimelinePoint,
    pub(crate) stamp: Option<Stamp>,
}

impl EventPoint {
    pub(crate) fn new(timeline: Arc<Timeline>, value: u64, stamp: Stamp) -> Self {
        EventPoint {
            point: TimelinePoint { timeline, value },
            stamp: Some(stamp),
        }
    }

    /// The device time it was reached at, 0 before (or never stamped).
    pub(crate) fn stamp_ns(&self) -> u64 {
        self.stamp.as_ref().map_or(0, Stamp::ns)
    }
}

impl std::ops::Deref for EventPoint {
    type Target = TimelinePoint;
    fn deref(&self) -> &TimelinePoint {
        &self.point
    }
}

/// A point on a stream's timeline. Create with [`Event::new`] and record with
/// [`Stream::record`](crate::Stream::record), or take one from
/// [`Stream::record_event`](crate::Stream::record_event).
#[derive(Clone, Default)]
pub struct Event {
    pub(crate) point: Option<EventPoint>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.point {
            None => f.write_str("Event(unrecorded)"),
            Some(p) => write!(f, "Event(stream {}, value {})", p.timeline.stream, p.value),
        }
    }
}

impl Event {
    /// An event not yet recorded on any stream.
    pub fn new() -> Self {
        Event { point: None }
    }

    /// The event of value `value` on `timeline`, with no timestamp (a
    /// graph's wait node names one so; a placed graph's steps are ordered by
    /// them): for waits, not for [`Event::elapsed_ms`].
    pub(crate) fn at(timeline: Arc<crate::exec::timeline::Timeline>, value: u64) -> Self {
        Event {
            point: Some(EventPoint {
                point: TimelinePoint { timeline, value },
                stamp: None,
            }),
        }
    }

    /// The same point with no timestamp (`Event::at`), or this event if it
    /// names none: what the task data's states keep, which order work and
    /// time nothing, so that a launch's span goes with the task's own
    /// references, not with whichever later task overwrites a state.
    pub(crate) fn unstamped(&self) -> Event {
        match &self.point {
            Some(p) => Event::at(p.timeline.clone(), p.value),
            None => Event::new(),
        }
    }

    /// Makes this event the point `value` on `timeline`, with no timestamp
    /// (as [`Event::at`]): where it names an unstamped point on that
    /// timeline already, only its value changes (no count taken or let go:
    /// a placed graph's launch moves the data's states so, each naming the
    /// same streams launch after launch).
    pub(crate) fn set_at(&mut self, timeline: &Arc<crate::exec::timeline::Timeline>, value: u64) {
        match &mut self.point {
            Some(p) if p.stamp.is_none() && Arc::ptr_eq(&p.point.timeline, timeline) => {
                p.point.value = value;
            }
            _ => *self = Event::at(timeline.clone(), value),
        }
    }

    /// Whether the event was recorded.
    pub fn is_recorded(&self) -> bool {
        self.point.is_some()
    }

    /// The stamped launch's span it holds, if any (given up with the
    /// event).
    pub(crate) fn into_span(mut self) -> Option<Arc<crate::exec::op::Span>> {
        match self.point.take()?.stamp? {
            Stamp::End(s) => Some(s),
            Stamp::Cell(_) => None,
        }
    }

    /// The span of the launch that stamps this event, if a launch does.
    pub(crate) fn span(&self) -> Option<&crate::exec::op::Span> {
        match self.point.as_ref()?.stamp.as_ref()? {
            Stamp::End(s) => Some(s),
            Stamp::Cell(_) => None,
        }
    }

    /// The point, for a wait; it may be a capture's (see `point`).
    pub(crate) fn point_any(&self, op: &'static str) -> Result<&EventPoint> {
        self.point.as_ref().ok_or(Error::EventNotRecorded { op })
    }

    /// The point, for the host: an event recorded during a stream capture has
    /// no point on any timeline the host could wait for.
    pub(crate) fn point(&self, op: &'static str) -> Result<&EventPoint> {
        let p = self.point_any(op)?;
        if crate::api::graph::capture::is_capture_timeline(&p.timeline) {
            return Err(Error::Graph {
                op,
                detail: "the event was recorded during a stream capture: it marks a point of the \
                        graph being recorded, which only streams recording into that capture can \
                        wait on; record an event after launching the graph"
                    .into(),
            });
        }
        Ok(p)
    }

    /// The stream and timeline value this event marks.
    pub fn position(&self) -> Result<(u64, u64)> {
        let p = self.point("Event::position")?;
        Ok((p.timeline.stream, p.value))
    }

    /// Whether it was recorded and completed without a fault: a wait on it
    /// orders nothing. Looks, never polls.
    pub(crate) fn completed_ok(&self) -> bool {
        self.point
            .as_ref()
            .is_some_and(|p| matches!(p.timeline.status(p.value), Some(Ok(()))))
    }

    /// Whether it was recorded and completed with a fault. Looks, never
    /// polls.
    pub(crate) fn failed(&self) -> bool {
        self.point
            .as_ref()
            .is_some_and(|p| matches!(p.timeline.status(p.value), Some(Err(_))))
    }

    /// Whether `later`'s completion (or fault) implies this event's: both
    /// recorded on one stream, this one no later.
    pub(crate) fn implied_by(&self, later: &Event) -> bool {
        match (&self.point, &later.point) {
            (Some(a), Some(b)) => Arc::ptr_eq(&a.timeline, &b.timeline) && a.value <= b.value,
            _ => false,
        }
    }

    /// `Ok(true)` once the work before the event completed, `Ok(false)` while it is
    /// pending, an error if it failed.
    pub fn query(&self) -> Result<bool> {
        let p = self.point("Event::query")?;
        p.timeline.poll_driver();
        match p.timeline.status(p.value) {
            None => Ok(false),
            Some(r) => r.map(|()| true),
        }
    }

    /// Blocks until the work before the event completed, waiting as the device's
    /// host-wait mode says.
    pub fn synchronize(&self) -> Result<()> {
        let p = self.point("Event::synchronize")?;
        p.timeline.wait(p.value, p.timeline.host_wait)
    }

    /// Blocks until complete, waiting as `mode` says.
    pub fn synchronize_with(&self, mode: CompletionMode) -> Result<()> {
        let p = self.point("Event::synchronize_with")?;
        p.timeline.wait(p.value, mode)
    }

    /// Milliseconds from `self` to `end`, both completed.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f64> {
        let a = self.point("Event::elapsed_ms")?;
        let b = end.point("Event::elapsed_ms")?;
        if a.timeline.device != b.timeline.device {
            return Err(Error::EventTiming {
                detail: format!(
                    "the start event is on device {} and the end event on device {}: their \
                     clocks are unrelated; time two events of the same device",
                    a.timeline.device, b.timeline.device
                ),
            });
        }
        for (p, which) in [(a, "start"), (b, "end")] {
            match p.timeline.status(p.value) {
                None => {
                    return Err(Error::EventTiming {
                        detail: format!(
                            "the {which} event has not completed yet; synchronize it first"
                        ),
                    })
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => {}
            }
        }
        if a.stamp.is_none() || b.stamp.is_none() {
            return Err(Error::EventTiming {
                detail: "the runtime made this event to order work and takes no timestamp for \
                         it; time events recorded with Stream::record"
                    .into(),
            });
        }
        let (t0, t1) = (a.stamp_ns(), b.stamp_ns());
        Ok((t1 as f64 - t0 as f64) / 1e6)
    }
}
