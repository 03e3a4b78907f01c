//! Streams: the user's in-order sequences of operations. Every method validates its
//! input (typed errors, never panics) and hands a self-contained `Op` to the backend.

use crate::api::buffer::{Arg, DeviceBuffer, PinnedBuffer};
use crate::api::event::{Event, EventPoint};
use crate::api::graph::capture::CaptureSlot;
use crate::api::kernel::Kernel;
use crate::backend::BackendStream;
use crate::exec::kernel::{ArgList, Grid, MAX_KERNEL_ARGS};
use crate::exec::op::{Body, CopyKind, KernelRef, Op, PendingWrite};
use crate::exec::storage::Storage;
use crate::{Device, Error, MemoryKind, Result};
use bytemuck::Pod;
use std::any::TypeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
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
        let inline_max = device.inline_copy_max();
        Stream {
            inner: Arc::new(StreamHandle {
                queue,
                device,
                capture: Arc::default(),
                inline_max,
            }),
        }
    }

    fn q(&self) -> &dyn BackendStream {
        &*self.inner.queue
    }

    pub(crate) fn backend_stream(&self) -> &dyn BackendStream {
        self.q()
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
                detail: "the stream is recording a capture: nothing it records runs before                          the graph is launched, so this would never complete; end the capture                          first"
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

    /// A device buffer of `len` elements allocated in stream order (like
    /// `cudaMallocAsync`): the pool serves it from this stream's cache first.
    /// Contents are unspecified.
    ///
    /// Dropping the handle frees it in stream order: if only work on this stream
    /// used it, the memory is back in this stream's cache at once and a later
    /// `alloc` here may return it while that work is still queued (later work on
    /// the stream runs after it). Otherwise it returns when its last use
    /// completes. Using the buffer on another stream is always safe: that stream
    /// first waits, on the device, for this stream to reach the allocation, and
    /// memory taken over from another stream's queued work is ordered after it
    /// the same way.
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        if self.is_capturing() {
            let bytes = crate::Device::bytes_for::<T>(len)?;
            let s = crate::api::graph::capture::alloc(&self.inner.capture, bytes)?;
            return Ok(DeviceBuffer::from_storage(s, len));
        }
        let mut arc = self.inner.device.device_storage::<T>(len, self.id())?;
        if arc.reuse_order {
            arc = self.order_reused(arc)?;
        }
        Ok(DeviceBuffer::from_storage(arc, len))
    }

    /// Orders the first use of memory [`Stream::alloc`] took over after the
    /// work that may still use it: this stream's own queued work (later work
    /// elsewhere then waits for this stream first) and other streams' work
    /// (see [`Stream::wait_for_points`]). On error the memory is freed once
    /// those points are reached.
    #[cold]
    fn order_reused(&self, mut arc: Arc<Storage>) -> Result<Arc<Storage>> {
        let s = Storage::unique(&mut arc).expect("a new storage has no other owner");
        s.reuse_order = false;
        let mut ordered = s.reused_in_stream_order();
        if s.has_reuse_points() {
            let fences = s.take_reuse_points();
            match self.wait_for_points(fences) {
                Ok(o) => ordered |= o,
                Err((e, pending)) => {
                    arc.drop_after(pending);
                    return Err(e);
                }
            }
        }
        if ordered {
            s.set_ready(self.q().timeline().clone(), self.q().submitted());
        }
        Ok(arc)
    }

    /// Orders this stream after other streams' work that may still use memory it
    /// just took over: a device-side wait per point of this device, a host wait
    /// otherwise. Returns whether later uses elsewhere must wait for this stream.
    /// On error, the points not known to be reached come back with it: the memory
    /// may be freed only after them.
    #[cold]
    fn wait_for_points(
        &self,
        fences: Vec<Arc<dyn hetero_memory::StreamPoint>>,
    ) -> std::result::Result<bool, (Error, Vec<Arc<dyn hetero_memory::StreamPoint>>)> {
        let mut ordered = false;
        let mut failed = None;
        let mut pending = Vec::new();
        for f in fences {
            if f.is_complete() {
                continue;
            }
            if failed.is_some() {
                pending.push(f);
                continue;
            }
            let point = f
                .as_any()
                .and_then(|a| a.downcast_ref::<crate::exec::point::TimelinePoint>())
                .filter(|t| t.timeline.device == self.inner.device.id());
            let done = match point {
                Some(t) if t.timeline.stream == self.id() => Ok(()),
                Some(t) => self
                    .submit(Body::Wait {
                        timeline: t.timeline.clone(),
                        value: t.value,
                        fault: false,
                    })
                    .map(drop),
                None => crate::exec::point::wait_fence(&f),
            };
            match done {
                Ok(()) => ordered |= point.is_some(),
                Err(e) => {
                    failed = Some(e);
                    pending.push(f);
                }
            }
        }
        match failed {
            None => Ok(ordered),
            Some(e) => Err((e, pending)),
        }
    }

    /// Orders an op on this stream that touches `s` after the work that used its
    /// memory before it, when that work ran elsewhere (see [`Stream::alloc`]).
    #[inline]
    pub(crate) fn order_use(&self, s: &Storage) -> Result<()> {
        if let Some((timeline, value)) = s.use_on(self.id()) {
            self.submit(Body::Wait {
                timeline: timeline.clone(),
                value,
                fault: false,
            })?;
        }
        Ok(())
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
            return Err(crate::exec::graph::stand_in_error(op));
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

    #[allow(clippy::too_many_arguments)]
    fn copy_op<T: Pod>(
        &self,
        op: &'static str,
        kind: CopyKind,
        src: &Arc<Storage>,
        src_len: usize,
        src_offset: usize,
        dst: &Arc<Storage>,
        dst_len: usize,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        self.check_storage(op, src)?;
        self.check_storage(op, dst)?;
        check_range(op, src_len, src_offset, count)?;
        check_range(op, dst_len, dst_offset, count)?;
        if Arc::ptr_eq(src, dst) {
            return Err(Error::Aliasing { op });
        }
        let size = std::mem::size_of::<T>();
        let bytes = count * size;
        if kind == CopyKind::H2D && bytes > 0 && bytes <= self.inner.inline_max {
            if let Some(data) = self.inline_payload(src, src_offset * size, bytes) {
                self.order_use(dst)?;
                self.submit(Body::HostWrite {
                    dst: dst.clone(),
                    off: dst_offset * size,
                    data,
                    inline: true,
                })?;
                return Ok(());
            }
        }
        self.order_use(src)?;
        self.order_use(dst)?;
        let host_dst = (dst.kind == MemoryKind::Pinned).then(|| PendingWrite::new(dst));
        self.submit(Body::Copy {
            kind,
            src: src.clone(),
            src_off: src_offset * size,
            dst: dst.clone(),
            dst_off: dst_offset * size,
            bytes: count * size,
            _pending: host_dst,
        })?;
        Ok(())
    }

    fn same_len(op: &'static str, a: usize, b: usize) -> Result<()> {
        if a != b {
            return Err(Error::SizeMismatch {
                op,
                detail: format!(
                    "source has {a} elements, destination {b}; use the _range variant to copy part of a buffer"
                ),
            });
        }
        Ok(())
    }

    /// Copies all of pinned `src` into device buffer `dst` (same length).
    pub fn copy_h2d<T: Pod>(&self, src: &PinnedBuffer<T>, dst: &DeviceBuffer<T>) -> Result<()> {
        Self::same_len("copy_h2d", src.len(), dst.len())?;
        self.copy_h2d_range(src, 0, dst, 0, src.len())
    }

    /// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`.
    pub fn copy_h2d_range<T: Pod>(
        &self,
        src: &PinnedBuffer<T>,
        src_offset: usize,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        let op = "copy_h2d";
        self.copy_op::<T>(
            op,
            CopyKind::H2D,
            &src.storage,
            src.len(),
            src_offset,
            &dst.storage,
            dst.len(),
            dst_offset,
            count,
        )
    }

    /// Copies all of device buffer `src` into pinned `dst` (same length).
    pub fn copy_d2h<T: Pod>(&self, src: &DeviceBuffer<T>, dst: &mut PinnedBuffer<T>) -> Result<()> {
        Self::same_len("copy_d2h", src.len(), dst.len())?;
        let n = src.len();
        self.copy_d2h_range(src, 0, dst, 0, n)
    }

    /// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`.
    pub fn copy_d2h_range<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        dst: &mut PinnedBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        self.copy_op::<T>(
            "copy_d2h",
            CopyKind::D2H,
            &src.storage,
            src.len(),
            src_offset,
            &dst.storage,
            dst.len(),
            dst_offset,
            count,
        )
    }

    /// Copies all of device buffer `src` into device buffer `dst` (same length).
    pub fn copy_d2d<T: Pod>(&self, src: &DeviceBuffer<T>, dst: &DeviceBuffer<T>) -> Result<()> {
        Self::same_len("copy_d2d", src.len(), dst.len())?;
        self.copy_d2d_range(src, 0, dst, 0, src.len())
    }

    /// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`.
    pub fn copy_d2d_range<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        dst: &DeviceBuffer<T>,
        dst_offset: usize,
        count: usize,
    ) -> Result<()> {
        self.copy_op::<T>(
            "copy_d2d",
            CopyKind::D2D,
            &src.storage,
            src.len(),
            src_offset,
            &dst.storage,
            dst.len(),
            dst_offset,
            count,
        )
    }

    fn fill_op<T: Pod>(
        &self,
        storage: &Arc<Storage>,
        len: usize,
        offset: usize,
        count: usize,
        value: T,
    ) -> Result<()> {
        let op = "fill";
        self.check_storage(op, storage)?;
        check_range(op, len, offset, count)?;
        let size = std::mem::size_of::<T>();
        if size > 16 || size == 0 {
            return Err(Error::InvalidArgument(format!(
                "fill: element type {} is {size} bytes; fill supports 1..=16-byte elements (use a kernel for larger ones)",
                std::any::type_name::<T>()
            )));
        }
        let mut pattern = [0u8; 16];
        pattern[..size].copy_from_slice(bytemuck::bytes_of(&value));
        self.order_use(storage)?;
        let host_dst = (storage.kind == MemoryKind::Pinned).then(|| PendingWrite::new(storage));
        self.submit(Body::Fill {
            dst: storage.clone(),
            off: offset * size,
            bytes: count * size,
            pattern,
            pattern_len: size as u8,
            _pending: host_dst,
        })?;
        Ok(())
    }

    /// Sets every element of `dst` to `value`.
    pub fn fill<T: Pod>(&self, dst: &DeviceBuffer<T>, value: T) -> Result<()> {
        self.fill_op(&dst.storage, dst.len(), 0, dst.len(), value)
    }

    /// Sets `count` elements of `dst` from `offset` to `value`.
    pub fn fill_range<T: Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        offset: usize,
        count: usize,
        value: T,
    ) -> Result<()> {
        self.fill_op(&dst.storage, dst.len(), offset, count, value)
    }

    /// Sets every element of pinned `dst` to `value`, in stream order.
    pub fn fill_pinned<T: Pod>(&self, dst: &mut PinnedBuffer<T>, value: T) -> Result<()> {
        let n = dst.len();
        self.fill_op(&dst.storage, n, 0, n, value)
    }

    /// Launches `kernel` over `grid`, giving it `args` (see [`Arg`]).
    #[inline]
    pub fn launch(&self, kernel: &Kernel, grid: Grid, args: &[Arg<'_>]) -> Result<()> {
        if grid.blocks == 0 {
            return Err(Error::EmptyGrid {
                kernel: kernel.inner.name,
            });
        }
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
            return crate::api::graph::capture::kernel(
                &self.inner.capture,
                self.id(),
                &kernel.inner,
                grid.blocks,
                args,
            );
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
            })?;
        } else {
            self.q().submit_launch(&kernel.inner, grid.blocks, list)?;
        }
        Ok(())
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
        let stamp = match event.point.take().map(|p| p.stamp) {
            Some(mut st) => match Arc::get_mut(&mut st) {
                Some(cell) => {
                    *cell.get_mut() = 0;
                    st
                }
                None => Arc::new(AtomicU64::new(0)),
            },
            None => Arc::new(AtomicU64::new(0)),
        };
        let value = self.submit(Body::Record {
            stamp: stamp.clone(),
        })?;
        event.point = Some(EventPoint {
            timeline: self.q().timeline().clone(),
            value,
            stamp,
        });
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
        let p = event.point_any("wait_event")?;
        if crate::api::graph::capture::is_capture_timeline(&p.timeline) {
            return crate::api::graph::capture::wait(&self.inner.capture, self.id(), p);
        }
        if p.timeline.device != self.inner.device.id() {
            return Err(Error::EventWrongDevice {
                op: "wait_event",
                event_device: p.timeline.device,
                stream_device: self.inner.device.id(),
            });
        }
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        // Own stream: already ordered. Completed without fault: nothing to wait for.
        if p.timeline.stream == self.id() || matches!(p.timeline.status(p.value), Some(Ok(()))) {
            return Ok(());
        }
        self.submit(Body::Wait {
            timeline: p.timeline.clone(),
            value: p.value,
            fault: true,
        })?;
        Ok(())
    }

    /// Blocks until all work submitted so far completed; returns the stream's fault
    /// if it failed.
    pub fn synchronize(&self) -> Result<()> {
        self.not_capturing("Stream::synchronize")?;
        self.q()
            .timeline()
            .wait(self.q().submitted(), self.inner.device.host_wait())
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

    fn synchronized_access(
        &self,
        op: &'static str,
        storage: &Storage,
        write: bool,
        f: impl FnOnce(),
    ) -> Result<()> {
        self.not_capturing(op)?;
        self.check_storage(op, storage)?;
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        self.synchronize()?;
        storage.wait_ready_for(self.id())?;
        if crate::exec::thread::on_engine_thread() && self.inner.device.held_by_running_op(storage)
        {
            return Err(Error::WouldDeadlock(format!(
                "{op}: the buffer is an argument of the kernel running on this thread, which \
                 holds it until it returns; read or write it through the kernel's views"
            )));
        }
        storage.with_host_access(write, || self.inner.device.kick(), f);
        Ok(())
    }

    /// A synchronous copy between a borrowed host slice and memory the host
    /// cannot reach: staged through a bounce buffer the op owns (as CUDA stages
    /// pageable memory through pinned buffers), in stream order, then waited for.
    #[cold]
    fn staged(
        &self,
        op: &'static str,
        s: &Arc<Storage>,
        off: usize,
        dir: StageDir<'_>,
    ) -> Result<()> {
        self.not_capturing(op)?;
        self.check_storage(op, s)?;
        if self.q().is_closed() {
            return Err(Error::StreamDestroyed { stream: self.id() });
        }
        self.order_use(s)?;
        let mode = self.inner.device.host_wait();
        match dir {
            StageDir::In(data) => {
                let v = self.submit(Body::HostWrite {
                    dst: s.clone(),
                    off,
                    data: data.into(),
                    inline: false,
                })?;
                self.q().timeline().wait(v, mode)
            }
            StageDir::Out(out) => {
                let bounce = Arc::new(std::sync::Mutex::new(vec![0u8; out.len()]));
                let v = self.submit(Body::HostRead {
                    src: s.clone(),
                    off,
                    out: bounce.clone(),
                })?;
                self.q().timeline().wait(v, mode)?;
                out.copy_from_slice(&bounce.lock().unwrap_or_else(|p| p.into_inner()));
                Ok(())
            }
        }
    }

    /// Synchronous copy from a borrowed host slice into `dst[offset..]`, in stream
    /// order: waits for the stream's earlier work, then copies on this thread.
    pub fn write_slice<T: Pod>(
        &self,
        dst: &DeviceBuffer<T>,
        offset: usize,
        data: &[T],
    ) -> Result<()> {
        check_range("write_slice", dst.len(), offset, data.len())?;
        let s = &dst.storage;
        if !s.host_visible() {
            let off = offset * std::mem::size_of::<T>();
            return self.staged(
                "write_slice",
                s,
                off,
                StageDir::In(bytemuck::cast_slice(data)),
            );
        }
        self.synchronized_access("write_slice", s, true, || {
            let bytes: &[u8] = bytemuck::cast_slice(data);
            // SAFETY: range checked above; the write lock excludes every op on `s`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    s.ptr().add(offset * std::mem::size_of::<T>()),
                    bytes.len(),
                )
            }
        })
    }

    /// Synchronous copy of `out.len()` elements from `src[offset..]` into a borrowed
    /// host slice, in stream order.
    pub fn read_slice<T: Pod>(
        &self,
        src: &DeviceBuffer<T>,
        offset: usize,
        out: &mut [T],
    ) -> Result<()> {
        check_range("read_slice", src.len(), offset, out.len())?;
        let s = &src.storage;
        if !s.host_visible() {
            let off = offset * std::mem::size_of::<T>();
            return self.staged(
                "read_slice",
                s,
                off,
                StageDir::Out(bytemuck::cast_slice_mut(out)),
            );
        }
        self.synchronized_access("read_slice", s, false, || {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
            // SAFETY: range checked above; the read lock excludes writers of `s`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    s.ptr().add(offset * std::mem::size_of::<T>()),
                    bytes.as_mut_ptr(),
                    bytes.len(),
                )
            }
        })
    }

    /// Synchronous read of a whole device buffer into a new `Vec`, in stream order.
    pub fn read_to_vec<T: Pod>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); src.len()];
        self.read_slice(src, 0, &mut out)?;
        Ok(out)
    }
}

/// Which way a staged synchronous copy goes.
enum StageDir<'a> {
    In(&'a [u8]),
    Out(&'a mut [u8]),
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
