//! Task data: one buffer with a replica on each device of a context that used
//! it, and the coherence state StarPU keeps per data handle: which replicas
//! hold the current version (and from which event on), the last writer and
//! the readers since (the source of the implicit dependencies).
//!
//! Invariants: a replica marked valid holds the current version once its
//! event completed; every access is ordered after the last writer (RAW, WAW)
//! and a write after the readers since (WAR); both are updated under the
//! runtime's lock, in submission order.

use super::Runtime;
use crate::api::buffer::{Arg, DeviceBuffer};
use crate::api::managed::CopiesIn;
use crate::exec::storage::Storage;
use crate::exec::timeline::Timeline;
use crate::{Context, Device, Error, Event, Location, ManagedBuffer, Result, Stream};
use bytemuck::Pod;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The most bytes of zeroes `Context::data` writes at a time.
const ZEROS: usize = 1 << 20;

/// A task that touched a buffer, as later tasks need it.
#[derive(Clone)]
pub(crate) struct TaskRef {
    pub(crate) id: u64,
    /// Completes with the task.
    pub(crate) end: Event,
    /// Its expected end, ns on the runtime's clock.
    pub(crate) end_ns: f64,
    /// Its device and place in that device's stream pool (the task is the
    /// last on that stream while the pool entry's last task is its number).
    pub(crate) stream: Option<(usize, usize)>,
}

impl TaskRef {
    /// A task that ends at `value` on `timeline` (a placed graph's step: in
    /// no stream pool).
    pub(crate) fn at(id: u64, timeline: &Arc<Timeline>, value: u64, end_ns: f64) -> Self {
        TaskRef {
            id,
            end: Event::at(timeline.clone(), value),
            end_ns,
            stream: None,
        }
    }

    /// Becomes [`TaskRef::at`] in place: no count taken where its end names
    /// that timeline already ([`Event::set_at`]).
    pub(crate) fn set_at(&mut self, id: u64, timeline: &Arc<Timeline>, value: u64, end_ns: f64) {
        self.id = id;
        self.end.set_at(timeline, value);
        self.end_ns = end_ns;
        self.stream = None;
    }
}

/// The coherence state of one buffer.
#[derive(Default)]
pub(crate) struct DataState {
    /// Per device of the context: `Some(event)` where the replica holds the
    /// current version once `event` completed (an unrecorded event: now).
    pub(crate) valid: Vec<Option<Event>>,
    pub(crate) writer: Option<TaskRef>,
    /// The readers since the last write, at most one per stream (see
    /// [`DataState::add_reader`]).
    pub(crate) readers: Vec<TaskRef>,
    /// A placed graph's launch not yet applied to the fields above (see
    /// `graph::Marks`): applied by [`settled`], which every look at a
    /// state goes through.
    pub(crate) mark: Option<super::graph::Mark>,
}

/// Locks a datum's state, first applying what a placed graph's launch left
/// marked on it (`graph::Marks`): the state as every launch and task
/// before left it. Every look at a datum's state goes through here.
pub(crate) fn settled(state: &Mutex<DataState>) -> MutexGuard<'_, DataState> {
    let mut st = super::lock(state);
    if let Some(mark) = st.mark.take() {
        mark.settle(&mut st);
    }
    st
}

impl DataState {
    /// Forgets the replicas whose copy is known to have failed (a task's
    /// copy made on a stream that failed before it: a wait for another
    /// datum's faulted writer), while another holds the current version:
    /// a reader then copies from that one instead of taking on the fault.
    ///
    /// One look at each replica's event: a copy still running may fail
    /// between two looks, and a second look that saw the only whole replica
    /// fail would leave none (a reader then found no source).
    pub(crate) fn drop_failed_replicas(&mut self) {
        // Bit i: replica i is known to have failed (past 128 devices a
        // replica is kept whatever its copy did).
        let (mut failed, mut whole) = (0u128, false);
        for (i, v) in self.valid.iter().enumerate() {
            match v {
                Some(e) if i < 128 && e.failed() => failed |= 1 << i,
                Some(_) => whole = true,
                None => {}
            }
        }
        if whole && failed != 0 {
            for (i, v) in self.valid.iter_mut().enumerate().take(128) {
                if failed & (1 << i) != 0 {
                    *v = None;
                }
            }
        }
    }

    /// Adds `me` to the readers since the last write. An earlier reader on
    /// the same stream is dropped: stream order puts `me` after it, and a
    /// fault there fails `me` too, so waiting for `me` covers it. A datum
    /// only ever read so keeps one reader per stream that read it, not one
    /// per task (a constant input read by every task of a long run).
    pub(crate) fn add_reader(&mut self, me: TaskRef) {
        self.readers.retain(|r| !r.end.implied_by(&me.end));
        self.readers.push(me);
    }
}

/// Runs `f` on a buffer handle over `storage` that gives it back unreleased.
pub(crate) fn as_buffer<R>(storage: &Arc<Storage>, f: impl FnOnce(&DeviceBuffer<u8>) -> R) -> R {
    let b = DeviceBuffer::<u8>::from_storage(storage.clone(), storage.bytes());
    let r = f(&b);
    drop(b.into_storage());
    r
}

/// The buffers a placed stream graph's launch binds to its slots, by slot.
pub(crate) type Bound<'a> = &'a [Option<crate::exec::storage::GraphHold>];

/// A point a copy follows with a memory wait (its source replica's maker).
pub(crate) type After<'a> = Option<(&'a Arc<Timeline>, u64)>;

/// What every typed buffer offers the task layer.
pub(crate) trait DataAny: Send + Sync {
    fn id(&self) -> u64;
    fn bytes(&self) -> usize;
    fn state(&self) -> &Mutex<DataState>;
    /// Makes sure device `at` has a replica (allocated, contents undefined).
    fn replica(&self, at: usize, device: &Device) -> Result<()>;
    /// The kernel argument of replica `at` (which `replica` made); `bound`:
    /// the buffers a placed graph's launch binds to its slots (empty
    /// elsewhere), where a slot's replica on its graph's device is.
    fn arg<'a>(&'a self, at: usize, write: bool, bound: Bound<'a>) -> Arg<'a>;
    /// The storage of replica `at`, if it was made (`bound`: as for
    /// [`DataAny::arg`]); `None` for a managed buffer, which has no
    /// replicas.
    fn storage<'a>(&'a self, _at: usize, _bound: Bound<'a>) -> Option<&'a Arc<Storage>> {
        None
    }
    /// Copies replica `from` into replica `to` on `stream` (of either end),
    /// once `after` is reached, faulted or not (a memory wait: see
    /// `Stream::copy_peer_after`). Replicas of no bytes are all current:
    /// nothing moves.
    fn copy(
        &self,
        stream: &Stream,
        from: usize,
        to: usize,
        after: After<'_>,
        bound: Bound<'_>,
    ) -> Result<()> {
        let (Some(a), Some(b)) = (self.storage(from, bound), self.storage(to, bound)) else {
            return Err(Error::InvalidArgument(
                "task data: a copy between replicas that do not exist".into(),
            ));
        };
        if a.bytes() == 0 {
            return Ok(());
        }
        as_buffer(a, |a| as_buffer(b, |b| stream.copy_peer_after(a, b, after)))
    }
    /// The stream graph slot it stands for, if any.
    fn slot(&self) -> Option<u32> {
        None
    }
    /// Whether it is a managed buffer: no replicas (`valid` stays empty),
    /// its pages move themselves before the kernel that declares them.
    fn is_managed(&self) -> bool {
        false
    }
    /// Whether nothing outside reads it (a buffer a stream graph allocates):
    /// a placed graph's launch copies it back to nowhere.
    fn is_scratch(&self) -> bool {
        false
    }
    /// A managed buffer's moves: per device of the context, the bytes a task
    /// there copies in first, by the device they come from (`None`: the
    /// host's copy). Empty for other data.
    fn copies_in(&self) -> Result<CopiesIn> {
        Ok(Vec::new())
    }
    /// A managed buffer's pages made current on `stream`'s device before its
    /// later work (a prefetch, so the task's start event follows the moves).
    fn bring(&self, _stream: &Stream) -> Result<()> {
        Ok(())
    }
}

/// A managed buffer's state as task data, kept in the buffer while it lives
/// (so every handle, and every task over it, shares one).
pub(crate) struct ManagedTask {
    id: u64,
    /// Held like [`TaskData`]'s: the buffer's tasks run on its streams.
    rt: Arc<Runtime>,
    state: Mutex<DataState>,
}

/// A managed buffer as the task layer sees it: one handle per task.
struct ManagedCell<T: Pod> {
    task: Arc<ManagedTask>,
    buf: ManagedBuffer<T>,
}

impl<T: Pod + Send + Sync> DataAny for ManagedCell<T> {
    fn id(&self) -> u64 {
        self.task.id
    }
    fn bytes(&self) -> usize {
        self.buf.size_bytes()
    }
    fn state(&self) -> &Mutex<DataState> {
        &self.task.state
    }
    fn replica(&self, _at: usize, _device: &Device) -> Result<()> {
        Ok(())
    }
    fn arg<'a>(&'a self, _at: usize, write: bool, _: Bound<'a>) -> Arg<'a> {
        if write {
            Arg::managed_write(&self.buf)
        } else {
            Arg::managed_read(&self.buf)
        }
    }
    fn copy(&self, _: &Stream, _: usize, _: usize, _: After<'_>, _: Bound<'_>) -> Result<()> {
        Err(Error::InvalidArgument(
            "task data: a managed buffer has no replicas to copy between".into(),
        ))
    }
    fn is_managed(&self) -> bool {
        true
    }
    fn copies_in(&self) -> Result<CopiesIn> {
        self.buf.copies_in("task placement")
    }
    fn bring(&self, stream: &Stream) -> Result<()> {
        self.buf
            .prefetch(.., Location::Device(stream.device().id()), stream)
    }
}

/// What a task takes as data ([`TaskBuilder::read`](super::TaskBuilder::read)
/// and its kin): a [`TaskData`] of the task's context, or a [`ManagedBuffer`]
/// made by its [`Context::alloc_managed`](crate::Context::alloc_managed).
/// Made from a reference to either (`From`).
pub struct DataArg<'d>(&'d dyn AsTaskData);

/// Its data and runtime for a task of context `ctx`.
pub(crate) trait AsTaskData {
    fn task_data(&self, ctx: &Context) -> Result<(Arc<dyn DataAny>, Arc<Runtime>)>;
}

impl DataArg<'_> {
    pub(crate) fn task_data(&self, ctx: &Context) -> Result<(Arc<dyn DataAny>, Arc<Runtime>)> {
        self.0.task_data(ctx)
    }
}

impl<'d, T: Pod + Send + Sync> From<&'d TaskData<T>> for DataArg<'d> {
    fn from(d: &'d TaskData<T>) -> Self {
        DataArg(d)
    }
}

impl<'d, T: Pod + Send + Sync> From<&'d ManagedBuffer<T>> for DataArg<'d> {
    fn from(b: &'d ManagedBuffer<T>) -> Self {
        DataArg(b)
    }
}

impl<T: Pod + Send + Sync> AsTaskData for TaskData<T> {
    fn task_data(&self, ctx: &Context) -> Result<(Arc<dyn DataAny>, Arc<Runtime>)> {
        if !Arc::ptr_eq(&self.rt.ctx, ctx.shared()) {
            return Err(Error::DeviceContext {
                op: "task",
                detail: format!(
                    "task data of context {} given to a task of context {}: a task uses data \
                     of its own context (`Context::data`)",
                    self.rt.ctx.id(),
                    ctx.id()
                ),
            });
        }
        Ok((self.any(), self.rt.clone()))
    }
}

impl<T: Pod + Send + Sync> AsTaskData for ManagedBuffer<T> {
    fn task_data(&self, ctx: &Context) -> Result<(Arc<dyn DataAny>, Arc<Runtime>)> {
        let rt = ctx.task_runtime()?;
        let ids: Vec<u64> = rt.devices.iter().map(Device::id).collect();
        if self.device_ids() != ids {
            return Err(Error::DeviceContext {
                op: "task",
                detail: format!(
                    "managed buffer {} is usable on devices {:?}, the task's context has devices \
                     {ids:?}: give tasks buffers of their context's `Context::alloc_managed`",
                    self.id(),
                    self.device_ids()
                ),
            });
        }
        let task = {
            let mut slot = self.shared.task.lock().unwrap_or_else(|p| p.into_inner());
            match &*slot {
                Some(t) if Arc::ptr_eq(&t.rt, &rt) => t.clone(),
                _ => {
                    let t = Arc::new(ManagedTask {
                        id: next_data_id(),
                        rt: rt.clone(),
                        state: Mutex::new(DataState::default()),
                    });
                    *slot = Some(t.clone());
                    t
                }
            }
        };
        let cell = ManagedCell {
            task,
            buf: self.handle(),
        };
        Ok((Arc::new(cell), rt))
    }
}

pub(crate) struct DataCell<T: Pod> {
    id: u64,
    len: usize,
    replicas: Vec<OnceLock<DeviceBuffer<T>>>,
    state: Mutex<DataState>,
}

impl<T: Pod + Send + Sync> DataAny for DataCell<T> {
    fn id(&self) -> u64 {
        self.id
    }
    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    fn state(&self) -> &Mutex<DataState> {
        &self.state
    }
    fn replica(&self, at: usize, device: &Device) -> Result<()> {
        if self.replicas[at].get().is_none() {
            let b = device.alloc::<T>(self.len)?;
            let _ = self.replicas[at].set(b);
        }
        Ok(())
    }
    fn arg<'a>(&'a self, at: usize, write: bool, _: Bound<'a>) -> Arg<'a> {
        let b = self.replicas[at]
            .get()
            .expect("replica made before its use");
        if write {
            Arg::write(b)
        } else {
            Arg::read(b)
        }
    }
    fn storage<'a>(&'a self, at: usize, _: Bound<'a>) -> Option<&'a Arc<Storage>> {
        self.replicas[at].get().map(|b| &*b.storage)
    }
}

static NEXT_DATA: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A number no other task data has (in this process).
pub(crate) fn next_data_id() -> u64 {
    NEXT_DATA.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A buffer tasks read and write on any device of a [`Context`](crate::Context)
/// (StarPU's data handle): it keeps a replica on each device that used it and
/// copies the current version where a task needs it, over the context's links.
/// It starts on the context's first device (its home: the host's memory in a
/// node whose first device is the CPU). Cloning gives another handle to it.
///
/// ```
/// use hetero::{Context, Device, Kernel};
/// let devices = [Device::host().unwrap(), Device::host().unwrap()];
/// let ctx = Context::new(&devices).unwrap();
/// # ctx.set_perfmodel_dir(None); // the doctest writes no model file
/// let x = ctx.data_from(&[1u32, 2, 3]).unwrap();
/// let double = Kernel::new("double", |b| b.write::<u32>(0).iter_mut().for_each(|v| *v *= 2));
/// ctx.task(&double).read_write(&x).submit().unwrap();
/// assert_eq!(x.to_vec().unwrap(), vec![2, 4, 6]);
/// ```
pub struct TaskData<T: Pod> {
    pub(crate) cell: Arc<DataCell<T>>,
    pub(crate) rt: Arc<Runtime>,
    _t: PhantomData<T>,
}

impl<T: Pod> Clone for TaskData<T> {
    fn clone(&self) -> Self {
        TaskData {
            cell: self.cell.clone(),
            rt: self.rt.clone(),
            _t: PhantomData,
        }
    }
}

impl<T: Pod> std::fmt::Debug for TaskData<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskData")
            .field("id", &self.cell.id)
            .field("len", &self.cell.len)
            .finish()
    }
}

impl<T: Pod + Send + Sync> TaskData<T> {
    /// Task data holding `data`.
    pub(crate) fn new(rt: Arc<Runtime>, data: &[T]) -> Result<Self> {
        Self::written(rt, data.len(), |s, buf| s.write_slice(buf, 0, data))
    }

    /// Task data of `len` zeroed elements, written from a zeroed block of at
    /// most [`ZEROS`] bytes at a time (not from `len` zeroes on the host: a
    /// length the device cannot hold is its allocation's error, not the
    /// host's).
    pub(crate) fn zeroed(rt: Arc<Runtime>, len: usize) -> Result<Self> {
        Self::written(rt, len, |s, buf| {
            let per = (ZEROS / std::mem::size_of::<T>().max(1)).clamp(1, len);
            let zeros = vec![T::zeroed(); per];
            for at in (0..len).step_by(per) {
                s.write_slice(buf, at, &zeros[..per.min(len - at)])?;
            }
            Ok(())
        })
    }

    /// Task data of `len` elements on the context's first device, which
    /// `write` fills (when `len` is not 0) on the host stream there.
    fn written(
        rt: Arc<Runtime>,
        len: usize,
        write: impl FnOnce(&Stream, &DeviceBuffer<T>) -> Result<()>,
    ) -> Result<Self> {
        let n = rt.devices.len();
        let cell = DataCell {
            id: next_data_id(),
            len,
            replicas: (0..n).map(|_| OnceLock::new()).collect(),
            state: Mutex::new(DataState {
                valid: vec![None; n],
                writer: None,
                readers: Vec::new(),
                mark: None,
            }),
        };
        cell.replica(super::HOME, &rt.devices[super::HOME])?;
        if len != 0 {
            let s = rt.host_stream(super::HOME)?;
            write(&s, cell.replicas[super::HOME].get().expect("made above"))?;
        }
        cell.state.lock().unwrap_or_else(|p| p.into_inner()).valid[super::HOME] =
            Some(Event::new());
        Ok(TaskData {
            cell: Arc::new(cell),
            rt,
            _t: PhantomData,
        })
    }

    pub(crate) fn any(&self) -> Arc<dyn DataAny> {
        self.cell.clone()
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.cell.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.cell.len == 0
    }

    /// The current contents, after the tasks submitted before that write it
    /// (waits for them; a fault of the last writer is its error).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        // Tasks work stealing holds back that touch it go to devices first.
        let id = self.cell.id;
        self.rt.pump_until(|| !self.rt.holds(id))?;
        let (replicas, writer) = {
            let st = settled(&self.cell.state);
            let replicas: Vec<(usize, Event)> = (0..st.valid.len())
                .filter_map(|i| Some((i, st.valid[i].clone()?)))
                .collect();
            (replicas, st.writer.clone())
        };
        if let Some(w) = &writer {
            w.end.synchronize()?;
        }
        // The first replica whose copy completed: one a task's copy made on
        // a stream that failed before it (a wait for another datum's
        // faulted writer) holds nothing, and the data's current version is
        // in another.
        let mut last = None;
        for (at, ready) in replicas {
            if ready.is_recorded() {
                if let Err(e) = ready.synchronize() {
                    last = Some(e);
                    continue;
                }
            }
            let s = self.rt.host_stream(at)?;
            let buf = self.cell.replicas[at].get().expect("valid replicas exist");
            return s.read_to_vec(buf);
        }
        Err(last.expect("some replica holds the current version"))
    }

    /// Devices holding the current version, by index in the context.
    pub fn valid_on(&self) -> Vec<usize> {
        let st = settled(&self.cell.state);
        (0..st.valid.len())
            .filter(|&i| st.valid[i].is_some())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::DataAny;
    use crate::api::task::{lock, MAX_TASK_STREAMS};
    use crate::{Context, Device, Kernel};

    /// A datum only ever read (a constant input) keeps one reader per stream
    /// that read it, not one per task; a write after still waits for every
    /// read.
    #[test]
    fn a_datum_only_read_keeps_one_reader_per_stream() {
        let dev = Device::host().unwrap();
        let ctx = Context::new(std::slice::from_ref(&dev)).unwrap();
        ctx.set_perfmodel_dir(None);
        let x = ctx.data_from(&[7u32; 4]).unwrap();
        let ys: Vec<_> = (0..16).map(|_| ctx.data::<u32>(4).unwrap()).collect();
        let copy = Kernel::new("copy", |b| {
            let v = b.read::<u32>(0).to_vec();
            b.write::<u32>(0).copy_from_slice(&v);
        });
        for i in 0..1000 {
            ctx.task(&copy)
                .read(&x)
                .write(&ys[i % ys.len()])
                .submit()
                .unwrap();
        }
        let readers = lock(x.cell.state()).readers.len();
        assert!(
            (1..=MAX_TASK_STREAMS).contains(&readers),
            "{readers} readers kept for 1000 reads"
        );
        let set = Kernel::new("set", |b| b.write::<u32>(0).fill(9));
        ctx.task(&set).write(&x).submit().unwrap();
        ctx.wait_tasks().unwrap();
        for y in &ys {
            assert_eq!(y.to_vec().unwrap(), vec![7; 4]);
        }
        assert_eq!(x.to_vec().unwrap(), vec![9; 4]);
        assert!(lock(x.cell.state()).readers.is_empty());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::DataState;
    use crate::api::event::Event;
    use crate::config::CompletionMode;
    use crate::exec::timeline::Timeline;
    use std::sync::Arc;

    /// A reader's look at a datum whose copy to another device fails
    /// meanwhile still finds a replica to copy from: one replica failed
    /// before the look, the other's copy fails during it.
    #[test]
    fn a_copy_failing_during_the_look_leaves_a_replica() {
        loom::model(|| {
            let before = Arc::new(Timeline::new(0, 1, CompletionMode::Spin));
            before.fail(1, Arc::from("an earlier copy"));
            let copy = Arc::new(Timeline::new(0, 2, CompletionMode::Spin));
            let mut st = DataState {
                valid: vec![Some(Event::at(before, 1)), Some(Event::at(copy.clone(), 1))],
                ..DataState::default()
            };
            let engine = loom::thread::spawn(move || copy.fail(1, Arc::from("this copy")));
            st.drop_failed_replicas();
            assert!(st.valid.iter().any(Option::is_some), "no replica left");
            engine.join().expect("engine");
        });
    }
}
