//! Streams: the user's in-order sequences of operations. Every method validates its
//! input (typed errors, never panics) and hands a self-contained `Op` to the backend.

use crate::api::buffer::{Arg, DeviceBuffer, PinnedBuffer};
use crate::api::event::{Event, EventPoint, Stamp};
use crate::api::graph::capture::CaptureSlot;
use crate::api::kernel::Kernel;
use crate::backend::BackendStream;
use crate::exec::kernel::{ArgList, Grid, MAX_KERNEL_ARGS};
use crate::exec::op::{Body, KernelRef, Op, WaitAll, WAIT_ALL};
use crate::exec::storage::Storage;
use crate::exec::timeline::Timeline;
use crate::{Device, Error, Result};
use std::any::TypeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod alloc;
mod copy;
mod host_access;
mod peer;

/// Highest (most urgent) stream priority.
pub const PRIORITY_HIGHEST: u8 = 0;
/// Lowest stream priority.
pub const PRIORITY_LOWEST: u8 = 7;

/// An in-order sequence of operations on a device. Cloning gives another handle to
/// the same stream.
///
/// Dropping the last handle waits for the stream's pending work to complete (work is
/// never discarded); [`Stream::destroy`] refuses further submissions at once.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamHandle>,
}

struct StreamHandle {
    queue: Arc<dyn BackendStream>,
    device: Device,
    /// The capture this stream records into, if any (`graph/capture.rs`).
    capture: Arc<CaptureSlot>,
    /// H2D copies of at most this many bytes take the inline path (0: never).
    inline_max: usize,
    /// A device's staging stream (`Device::staging_stream`): the device
    /// releases it, not the handle.
    internal: bool,
    /// Where managed memory's migrations for this stream's work go (made at
    /// first use, `api/managed.rs`): towards the device (and evictions), and
    /// prefetches to the host, so neither direction queues behind the other.
    migrations: [std::sync::OnceLock<Stream>; 2],
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        if self.internal {
            return;
        }
        // The release waits for the stream's work; on an engine thread (a callback
        // dropping the last handle) that work includes the running op.
        let queue = self.queue.clone();
        crate::exec::thread::off_engine("release a stream", move || queue.release());
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.id())
            .field("priority", &self.priority())
            .field("hardware_queue", &self.hardware_queue())
            .finish()
    }
}

pub(crate) fn check_range(op: &'static str, len: usize, offset: usize, count: usize) -> Result<()> {
    match offset.checked_add(count) {
        Some(end) if end <= len => Ok(()),
        _ => Err(Error::OutOfBounds {
            op,
            offset,
            end: offset.saturating_add(count),
            len,
        }),
    }
}

impl Stream {
    pub(crate) fn new(queue: Arc<dyn BackendStream>, device: Device) -> Self {
        Self::handle(queue, device, false)
    }

    /// A handle to a device's own staging stream (dropping it releases nothing).
    pub(crate) fn internal(queue: Arc<dyn BackendStream>, device: Device) -> Self {
        Self::handle(queue, device, true)
    }

    fn handle(queue: Arc<dyn BackendStream>, device: Device, internal: bool) -> Self {
        let inline_max = device.inline_copy_max();
        Stream {
            inner: Arc::new(StreamHandle {
                queue,
                device,
                capture: Arc::default(),
                inline_max,
                internal,
                migrations: Default::default(),
            }),
        }
    }

    fn q(&self) -> &dyn BackendStream {
        &*self.inner.queue
    }

    /// A hint that `n` ops will be submitted on this stream soon
    /// (`BackendStream::prefetch_submit`).
    #[inline]
    pub(crate) fn prefetch_submit(&self, n: u64) {
        self.q().prefetch_submit(n);
    }

    /// Hints that ops will be submitted on this stream a little later: the
    /// first of the lines a submission reads, the handle's (for
    /// [`Stream::prefetch_queue`] later).
    #[inline]
    pub(crate) fn prefetch_handle(&self) {
        crate::exec::ring::prefetch(Arc::as_ptr(&self.inner).cast(), 64);
    }

    /// Hints that ops will be submitted on this stream soon: the lines a
    /// submission reads after the handle's (the capture flag, the backend
    /// stream's state: `BackendStream::prefetch_stream`).
    #[inline]
    pub(crate) fn prefetch_queue(&self) {
        crate::exec::ring::prefetch(Arc::as_ptr(&self.inner.capture).cast(), 1);
        self.q().prefetch_stream();
    }

    pub(crate) fn backend_stream(&self) -> &dyn BackendStream {
        self.q()
    }

    /// The stream managed memory's migration copies for this stream's work
    /// run on (`api/managed.rs`): the copy engines, overlapping this stream's
    /// other work. One towards the device (with evictions), one for
    /// prefetches to the host, so neither direction queues behind the other.
    pub(crate) fn migration_stream(&self, to_host: bool) -> Result<&Stream> {
        let cell = &self.inner.migrations[usize::from(to_host)];
        if let Some(s) = cell.get() {
            return Ok(s);
        }
        let s = self
            .inner
            .device
            .create_stream_with_priority(self.priority())?;
        let dir = if to_host {
            "to the host"
        } else {
            "to the device"
        };
        s.set_name(format!("managed migrations {dir} for stream {}", self.id()));
        Ok(cell.get_or_init(|| s))
    }

    pub(crate) fn capture_slot(&self) -> &Arc<CaptureSlot> {
        &self.inner.capture
    }

    /// Whether work submitted now is recorded into a capture instead of run.
    #[inline]
    pub fn is_capturing(&self) -> bool {
        self.inner.capture.capturing.load(Ordering::Acquire)
    }

    /// Refuses `op` while the stream records: it would wait for work that does
    /// not run until the graph is launched.
    fn not_capturing(&self, op: &'static str) -> Result<()> {
        if self.is_capturing() {
            return Err(Error::Graph {
                op,
                detail: "the stream is recording a capture: nothing it records runs before the \
                        graph is launched, so this would never complete; end the capture first"
                    .into(),
            });
        }
        Ok(())
    }

    /// Starts recording: work submitted to this stream (and to streams that
    /// wait on events recorded here meanwhile) goes into a graph instead of
    /// running, until [`Stream::end_capture`]. Like CUDA's stream capture;
    /// synchronous calls on a recording stream are refused.
    ///
    /// ```
    /// use hetero::Device;
    /// let dev = Device::host().unwrap();
    /// let s = dev.create_stream().unwrap();
    /// let buf = dev.alloc::<u8>(64).unwrap();
    /// s.begin_capture().unwrap();
    /// s.fill(&buf, 7).unwrap();
    /// let exec = s.end_capture().unwrap().instantiate().unwrap();
    /// s.launch_graph(&exec).unwrap();
    /// assert_eq!(s.read_to_vec(&buf).unwrap(), vec![7; 64]);
    /// ```
    pub fn begin_capture(&self) -> Result<()> {
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        crate::api::graph::capture::begin(
            &self.inner.capture,
            self.id(),
            self.inner.device.id(),
            self.inner.device.host_wait(),
        )
    }

    /// Ends the capture begun on this stream and returns what it recorded.
    /// Every stream that joined it must have been joined back (this stream
    /// waited on an event recorded after its last op), else a typed error.
    pub fn end_capture(&self) -> Result<crate::Graph> {
        let draft = crate::api::graph::capture::end(&self.inner.capture, self.id())?;
        crate::Graph::from_draft(&self.inner.device, draft)
    }

    /// Launches an executable graph: one submission, ordered on this stream
    /// like any op (events recorded after it complete after all its nodes). A
    /// graph with slots needs [`Stream::launch_graph_with`].
    pub fn launch_graph(&self, exec: &crate::GraphExec) -> Result<()> {
        crate::api::graph::exec::launch(self, exec, None)
    }

    /// Records `f`'s operations into a command buffer and launches it once:
    /// one submission for all of them (a one-shot recording; for replays keep
    /// the [`GraphExec`](crate::GraphExec) of [`CommandBuffer::finish`](crate::CommandBuffer::finish)).
    ///
    /// ```
    /// use hetero::Device;
    /// let dev = Device::host().unwrap();
    /// let s = dev.create_stream().unwrap();
    /// let (a, b) = (dev.alloc::<u32>(8).unwrap(), dev.alloc::<u32>(8).unwrap());
    /// s.run_commands(|cb| {
    ///     cb.fill(&a, 3)?;
    ///     cb.copy_d2d(&a, &b)
    /// })
    /// .unwrap();
    /// assert_eq!(s.read_to_vec(&b).unwrap(), vec![3; 8]);
    /// ```
    pub fn run_commands(&self, f: impl FnOnce(&crate::CommandBuffer) -> Result<()>) -> Result<()> {
        let cb = crate::CommandBuffer::new(self.device())?;
        f(&cb)?;
        let exec = cb.finish()?;
        self.launch_graph(&exec)
    }

    /// Launches an executable graph with its slots bound by `bindings`.
    pub fn launch_graph_with(
        &self,
        exec: &crate::GraphExec,
        bindings: &crate::Bindings,
    ) -> Result<()> {
        crate::api::graph::exec::launch(self, exec, Some(bindings))
    }

    /// Runs `f` on the host in stream order, like [`Stream::host_fn`], but `f`
    /// is an `Fn`: recorded into a graph or command buffer, it runs at every
    /// launch.
    pub fn host_callback(&self, f: impl Fn() + Send + Sync + 'static) -> Result<()> {
        if self.is_capturing() {
            return crate::api::graph::capture::host(&self.inner.capture, self.id(), Arc::new(f));
        }
        self.host_fn(f)
    }
    /// The stream's id (unique on its device).
    pub fn id(&self) -> u64 {
        self.q().id()
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Names the stream in profiles and traces.
    pub fn set_name(&self, name: impl Into<String>) {
        hetero_trace::set_stream_name(self.id(), name.into());
    }

    /// The hardware queue the stream is mapped onto.
    pub fn hardware_queue(&self) -> usize {
        self.q().hardware_queue()
    }

    /// The stream's priority (0 highest … 7 lowest).
    pub fn priority(&self) -> u8 {
        self.q().priority()
    }

    /// Changes the priority; takes effect at the next operation boundary.
    pub fn set_priority(&self, priority: u8) -> Result<()> {
        if priority > PRIORITY_LOWEST {
            return Err(Error::InvalidArgument(format!(
                "priority {priority} is out of range; use 0 (highest) ..= 7 (lowest)"
            )));
        }
        self.q().set_priority(priority);
        Ok(())
    }

    pub(crate) fn check_storage(&self, op: &'static str, s: &Storage) -> Result<()> {
        if s.graph_ref != 0 && !self.is_capturing() {
            return Err(Error::stand_in(op));
        }
        let dev = self.inner.device.id();
        if s.device != dev {
            return Err(Error::WrongDevice {
                op,
                buffer_device: s.device,
                stream_device: dev,
            });
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn submit(&self, body: Body) -> Result<u64> {
        if self.is_capturing() {
            return crate::api::graph::capture::submit(&self.inner.capture, self.id(), body);
        }
        self.q().submit(Op::new(body))
    }

    /// Launches `kernel` over `grid`, giving it `args` (see [`Arg`]).
    #[inline]
    pub fn launch(&self, kernel: &Kernel, grid: Grid, args: &[Arg<'_>]) -> Result<()> {
        self.launch_op(kernel, grid, args, None).map(drop)
    }

    /// Launches `kernel` as [`Stream::launch`] does and returns the event of
    /// its end, which the launch stamps itself in `span` (a fresh one, or
    /// one its only holder reused: `Span::reset`): what
    /// [`record_event`](Self::record_event) after it gives, without the
    /// record's op.
    pub(crate) fn launch_marked(
        &self,
        kernel: &Kernel,
        grid: Grid,
        args: &[Arg<'_>],
        span: Arc<crate::exec::op::Span>,
    ) -> Result<Event> {
        match self.launch_op(kernel, grid, args, Some(span.clone()))? {
            Some(value) => Ok(Event {
                point: Some(EventPoint::new(
                    self.q().timeline().clone(),
                    value,
                    Stamp::End(span),
                )),
            }),
            // Captured (a capture's node stamps nothing): a record.
            None => self.record_event(),
        }
    }

    /// Launches `kernel` as [`Stream::launch`] does and returns the value its
    /// launch reaches on the stream's timeline (no event made, no record
    /// op): a point to wait on with [`Stream::wait_points`]. A stream that is
    /// capturing has no such point: an error.
    pub(crate) fn launch_point(
        &self,
        kernel: &Kernel,
        grid: Grid,
        args: &[Arg<'_>],
    ) -> Result<u64> {
        self.launch_op(kernel, grid, args, None)?
            .ok_or_else(|| Error::Graph {
                op: "launch",
                detail: "the stream is capturing: its launches reach no point on its timeline"
                    .into(),
            })
    }

    /// The checks and the op of a launch; its value on the stream's
    /// timeline, `None` when it went into a capture.
    #[inline]
    fn launch_op(
        &self,
        kernel: &Kernel,
        grid: Grid,
        args: &[Arg<'_>],
        span: Option<Arc<crate::exec::op::Span>>,
    ) -> Result<Option<u64>> {
        if args.iter().any(|a| a.managed.is_some()) {
            return crate::api::managed::launch(self, kernel, grid, args, span);
        }
        if grid.blocks == 0 {
            return Err(Error::EmptyGrid {
                kernel: kernel.inner.name,
            });
        }
        self.device().check_code(&kernel.inner)?;
        if args.len() > MAX_KERNEL_ARGS {
            return Err(Error::TooManyArgs {
                kernel: kernel.inner.name,
                count: args.len(),
                max: MAX_KERNEL_ARGS,
            });
        }
        for (i, a) in args.iter().enumerate() {
            self.check_storage("launch", a.storage)?;
            for b in &args[..i] {
                if Arc::ptr_eq(a.storage, b.storage) && (a.write || b.write) {
                    return Err(Error::Aliasing { op: "launch" });
                }
            }
        }
        if self.is_capturing() {
            crate::api::graph::capture::kernel(
                &self.inner.capture,
                self.id(),
                &kernel.inner,
                grid.blocks,
                args,
            )?;
            return Ok(None);
        }
        for a in args {
            self.order_use(a.storage)?;
        }
        let list = ArgList::from_args(args);
        if self.is_capturing() {
            // A capture begun on another thread since the look above.
            self.submit(Body::Kernel {
                kernel: KernelRef::owned(kernel.inner.clone()),
                blocks: grid.blocks,
                args: list,
                span: None,
            })?;
            return Ok(None);
        }
        self.q()
            .submit_launch(&kernel.inner, grid.blocks, list, span)
            .map(Some)
    }

    /// Runs `f` on the host once all earlier work on the stream completed; later
    /// work waits for it. A panic in `f` fails the stream.
    pub fn host_fn(&self, f: impl FnOnce() + Send + 'static) -> Result<()> {
        self.submit(Body::Host(Some(Box::new(f))))?;
        Ok(())
    }

    /// Points `event` at the current end of this stream. Re-recording an event
    /// whose last record has completed (and that has no clones) allocates
    /// nothing: its timestamp cell is reused, like a CUDA event.
    pub fn record(&self, event: &mut Event) -> Result<()> {
        if self.is_capturing() {
            return crate::api::graph::capture::record(&self.inner.capture, self.id(), event);
        }
        // Only this event holds the cell once its record op ran (no clones, and
        // no weak references are ever made), so nothing else can read it.
        let stamp = match event.point.take().and_then(|p| p.stamp) {
            Some(Stamp::Cell(mut st)) => match Arc::get_mut(&mut st) {
                Some(cell) => {
                    *cell.get_mut() = 0;
                    st
                }
                None => Arc::new(AtomicU64::new(0)),
            },
            _ => Arc::new(AtomicU64::new(0)),
        };
        let value = self.submit(Body::Record {
            stamp: stamp.clone(),
        })?;
        event.point = Some(EventPoint::new(
            self.q().timeline().clone(),
            value,
            Stamp::Cell(stamp),
        ));
        Ok(())
    }

    /// Records a new event at the current end of this stream.
    pub fn record_event(&self) -> Result<Event> {
        let mut e = Event::new();
        self.record(&mut e)?;
        Ok(e)
    }

    /// Makes work submitted after this call wait until `event` completed. Does not
    /// block the host, and never stalls other streams.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.wait_on(event, true)
    }

    /// Makes work submitted after this call wait until `event` completed,
    /// faulted or not (a memory wait: its fault is not taken on). The task
    /// layer's order-only dependencies: a task that writes data a faulted
    /// task read, or overwrites data without reading it, waits for that
    /// task and does not fail with it. Checked as [`Stream::wait_event`]; in
    /// a capture, an event wait (a graph's edges carry faults).
    pub(crate) fn order_after(&self, event: &Event) -> Result<()> {
        self.wait_on(event, false)
    }

    /// [`wait_event`](Self::wait_event) (`fault`) or
    /// [`order_after`](Self::order_after).
    fn wait_on(&self, event: &Event, fault: bool) -> Result<()> {
        let p = event.point_any("wait_event")?;
        if crate::api::graph::capture::is_capture_timeline(&p.timeline) {
            return crate::api::graph::capture::wait(&self.inner.capture, self.id(), p);
        }
        if !self.wait_needed(&p.timeline, p.value, fault)? {
            return Ok(());
        }
        self.waits(&[(&p.timeline, p.value)], fault)
    }

    /// Memory waits on `points` (no fault taken on), one op each; the
    /// caller checked them as for [`Stream::wait_points`].
    pub(crate) fn order_points(&self, points: &[(&Arc<Timeline>, u64)]) -> Result<()> {
        self.waits(points, false)
    }

    /// Starts a fault scope at the next op submitted: a fault of an op before
    /// it fails no op from it on (the stream's backend has fault scopes:
    /// `Backend::fault_scopes`; the caller checked).
    pub(crate) fn start_fault_scope(&self) {
        let q = self.backend_stream();
        q.timeline().start_scope(q.submitted() + 1);
    }

    /// Event waits on `points` (streams' timelines, not a capture's), as few
    /// ops as the backend takes: one per [`WAIT_ALL`] points where it waits
    /// on several at once (`BackendStream::waits_all`) and the stream is not
    /// capturing (a capture records one node per wait), else one per point.
    /// The caller checked what [`Stream::wait_event`] checks: the points are
    /// of this stream's context (a placed graph's own streams; a point of
    /// this stream itself, earlier, takes on that op's fault where the
    /// stream has fault scopes). A point already complete costs the engine
    /// a look, not a check here.
    pub(crate) fn wait_points(&self, points: &[(&Arc<Timeline>, u64)]) -> Result<()> {
        self.waits(points, true)
    }

    /// Waits on `points`: event waits (`fault`; several per op where the
    /// backend takes it, see [`Stream::wait_points`]) or memory waits, one
    /// op each.
    fn waits(&self, points: &[(&Arc<Timeline>, u64)], fault: bool) -> Result<()> {
        let many = fault && self.q().waits_all() && !self.is_capturing();
        let per_op = if many { WAIT_ALL } else { 1 };
        for chunk in points.chunks(per_op) {
            self.submit(match *chunk {
                [(timeline, value)] => Body::Wait {
                    timeline: timeline.clone(),
                    value,
                    fault,
                },
                _ => Body::WaitAll(WaitAll::new(chunk)),
            })?;
        }
        // This device's engines look at a wait on another device's timeline
        // again when that device reaches the value (nothing else tells them).
        let dev = &self.inner.device;
        for &(timeline, value) in points {
            if timeline.device != dev.id() {
                dev.watch(timeline, value);
            }
        }
        Ok(())
    }

    /// The checks of a wait on `value` on `timeline`; whether it needs an op
    /// (not on its own stream, nor complete: without a fault where the wait
    /// takes one on, `fault`).
    #[inline]
    fn wait_needed(&self, timeline: &Arc<Timeline>, value: u64, fault: bool) -> Result<bool> {
        let dev = &self.inner.device;
        let foreign = timeline.device != dev.id();
        if foreign && self.is_capturing() {
            return Err(Error::Graph {
                op: "wait_event",
                detail: "a capture records one device's work and the event is of another \
                         device: wait on it before beginning the capture"
                    .into(),
            });
        }
        if foreign && !dev.shares_context(timeline.device) {
            return Err(Error::EventWrongDevice {
                op: "wait_event",
                event_device: timeline.device,
                stream_device: dev.id(),
            });
        }
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        // Own stream: already ordered (and its fault taken on, but past a
        // fault scope's start). Completed without fault: nothing to wait for.
        let own = !foreign && timeline.stream == self.id();
        let done = (own && !(fault && timeline.has_scopes()))
            || match timeline.status(value) {
                Some(Ok(())) => true,
                Some(Err(_)) => !fault,
                None => false,
            };
        Ok(!done)
    }

    /// Blocks until all work submitted so far completed (managed prefetches
    /// for it included); returns the stream's fault
    /// if it failed.
    pub fn synchronize(&self) -> Result<()> {
        self.not_capturing("Stream::synchronize")?;
        self.q()
            .timeline()
            .wait(self.q().submitted(), self.inner.device.host_wait())?;
        // Managed memory's migrations for this stream's work (prefetches to
        // the host run there without the stream waiting for them).
        for m in self.inner.migrations.iter().filter_map(|m| m.get()) {
            m.synchronize()?;
        }
        Ok(())
    }

    /// `Ok(true)` when all submitted work completed, `Ok(false)` while some is
    /// pending, the fault if the stream failed.
    pub fn query(&self) -> Result<bool> {
        self.not_capturing("Stream::query")?;
        self.q().timeline().poll_driver();
        match self.q().timeline().status(self.q().submitted()) {
            None => Ok(false),
            Some(r) => r.map(|()| true),
        }
    }

    /// The stream's fault, if it failed.
    pub fn error(&self) -> Option<Error> {
        self.q().timeline().fault()
    }

    /// Refuses further work on this stream (on every handle). Pending work still
    /// completes.
    pub fn destroy(&self) {
        self.q().close();
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn ok<T: Send + Sync>() {}
    ok::<Stream>();
    ok::<Event>();
    ok::<DeviceBuffer<f32>>();
    ok::<PinnedBuffer<f32>>();
    let _ = TypeId::of::<u8>();
}

#[cfg(test)]
mod tests {
    use crate::{Context, Device, DeviceConfig, EmuConfig, HostEvent, LinkPreset, TimeMode};
    use std::sync::Arc;

    fn emu(time: TimeMode) -> Device {
        let emu = EmuConfig::new(LinkPreset::pcie4x16()).time(time);
        Device::new(DeviceConfig::default().emu(emu)).unwrap()
    }

    /// The host, an emulated device in virtual time and one in real time.
    fn devices() -> Vec<Device> {
        vec![
            Device::host().unwrap(),
            emu(TimeMode::Virtual),
            emu(TimeMode::Real),
        ]
    }

    fn points(gates: &[HostEvent]) -> Vec<(&Arc<super::Timeline>, u64)> {
        gates
            .iter()
            .map(|g| {
                let p = g.event().point.as_ref().unwrap();
                (&p.timeline, p.value)
            })
            .collect()
    }

    /// Five points: one op for four of them and one for the fifth where the
    /// backend waits on several at once, one per point elsewhere; the work
    /// after them waits for every one.
    #[test]
    fn a_wait_on_several_points_waits_for_each() {
        for dev in devices() {
            let s = dev.create_stream().unwrap();
            let gates: Vec<HostEvent> = (0..5).map(|_| dev.host_event()).collect();
            let before = s.q().submitted();
            s.wait_points(&points(&gates)).unwrap();
            let ops = s.q().submitted() - before;
            assert_eq!(ops, if s.q().waits_all() { 2 } else { 5 });
            let done = s.record_event().unwrap();
            // The last point first: each op then has a point reached and
            // others not.
            for i in [4, 0, 1, 2, 3] {
                // (A moment for an engine that would run it too early.)
                std::thread::sleep(std::time::Duration::from_millis(2));
                assert!(!done.query().unwrap(), "ran before point {i}");
                gates[i].signal();
            }
            done.synchronize().unwrap();
        }
    }

    /// A stream that is capturing records a node per point (a capture has
    /// no node for a wait on several).
    #[test]
    fn a_wait_on_several_points_is_captured_point_by_point() {
        for dev in devices() {
            let (s, other) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
            let events: Vec<_> = (0..2).map(|_| other.record_event().unwrap()).collect();
            let points: Vec<_> = events
                .iter()
                .map(|e| {
                    let p = e.point.as_ref().unwrap();
                    (&p.timeline, p.value)
                })
                .collect();
            s.begin_capture().unwrap();
            s.wait_points(&points).unwrap();
            let graph = s.end_capture().unwrap();
            assert_eq!(graph.len(), 2);
        }
    }

    /// A point that failed fails the wait, and the stream, with its fault.
    #[test]
    fn a_wait_on_several_points_takes_on_a_fault() {
        for dev in devices() {
            let s = dev.create_stream().unwrap();
            let gates: Vec<HostEvent> = (0..3).map(|_| dev.host_event()).collect();
            s.wait_points(&points(&gates)).unwrap();
            let done = s.record_event().unwrap();
            let mut gates = gates.into_iter();
            gates.next().unwrap().signal();
            drop(gates);
            let err = done.synchronize().unwrap_err().to_string();
            assert!(err.contains("dropped before it was signalled"), "{err}");
            assert!(s.error().is_some());
        }
    }

    /// Points of another device of the context: the wait ends once they
    /// are reached, in real time too, with no host thread blocked on the
    /// waiting device (a query only looks).
    #[test]
    fn a_wait_on_several_points_of_another_device_wakes() {
        let host = || Device::host().unwrap();
        // (Emulated devices in real time share their engines in a context:
        // the points are a host device's, or the waiting stream is one.)
        let pairs = [
            (emu(TimeMode::Virtual), emu(TimeMode::Virtual)),
            (host(), emu(TimeMode::Real)),
            (emu(TimeMode::Real), host()),
        ];
        for (a, b) in pairs {
            let _ctx = Context::new(&[a.clone(), b.clone()]).unwrap();
            let gates: Vec<HostEvent> = (0..2).map(|_| a.host_event()).collect();
            let s = b.create_stream().unwrap();
            s.wait_points(&points(&gates)).unwrap();
            let done = s.record_event().unwrap();
            assert!(!done.query().unwrap());
            gates.iter().for_each(HostEvent::signal);
            let start = std::time::Instant::now();
            while !done.query().unwrap() {
                assert!(start.elapsed().as_secs() < 20, "no engine looked again");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}
