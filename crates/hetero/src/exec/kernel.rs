//! What a kernel is to the engines that run it: its function and cost, the
//! launch's argument list, and the block it runs as, given its block index and
//! typed views of the buffers the launch declared (the handle users hold,
//! `Kernel`, is `api/kernel.rs`).
//!
//! Soundness: a launch's buffers are locked for the whole kernel (readers shared,
//! writers exclusive), a buffer cannot be both read and written by one launch, and
//! each block gets a disjoint part of every written buffer, taken at most once. So
//! the `&[T]` and `&mut [T]` views handed out never alias a concurrent writer.

use crate::exec::storage::{Reach, Storage};
use bytemuck::Pod;
use std::any::TypeId;
use std::sync::{Arc, LazyLock, Mutex};

pub(crate) type KernelFn = dyn Fn(&mut Block<'_>) + Send + Sync;

/// What an op holds of its kernel: one pointer. Aligned to its own cache lines:
/// submitters write the `Arc`'s counts at every launch while engines read the
/// function, and sharing a line with the counts cost a miss per op (≈ 2× on
/// `examples/op_loop.rs`).
#[repr(align(128))]
#[derive(Clone)]
pub(crate) struct KernelInner {
    pub(crate) name: &'static str,
    /// Its name as a number (`KernelName`).
    pub(crate) id: u32,
    /// The host code (run once per block on devices that run host code);
    /// `None` for a kernel with device code only.
    pub(crate) f: Option<Arc<KernelFn>>,
    /// What a launch costs on a modelled device, from its grid.
    pub(crate) cost: Option<Arc<CostFn>>,
    /// What it costs on a modelled device of a class, where declared for
    /// that class (`Kernel::cost_on`): before `cost`.
    pub(crate) class_costs: Vec<(crate::ComputeClass, Arc<CostFn>)>,
    /// The device code (run by devices that run device code: Vulkan).
    pub(crate) code: Option<Arc<DeviceCode>>,
}

/// A kernel's name and its number, the same for every kernel of that name.
/// The task layer's performance models and estimates are per name and look
/// it up by the number: no string hashed or compared per task.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelName {
    pub(crate) id: u32,
    pub(crate) text: &'static str,
}

impl KernelName {
    /// No kernel's.
    pub(crate) const NONE: KernelName = KernelName {
        id: u32::MAX,
        text: "",
    };
}

impl PartialEq for KernelName {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for KernelName {}

impl std::hash::Hash for KernelName {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.id.hash(h);
    }
}

/// The number of kernel name `name` (given once per kernel made).
pub(crate) fn name_id(name: &'static str) -> u32 {
    static NAMES: LazyLock<Mutex<rustc_hash::FxHashMap<&'static str, u32>>> =
        LazyLock::new(Default::default);
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    let next = names.len() as u32;
    *names.entry(name).or_insert(next)
}

impl KernelInner {
    /// What a launch costs on a modelled device of `class`: the cost
    /// declared for the class, else the kernel's one cost.
    pub(crate) fn cost_for(&self, class: crate::ComputeClass) -> Option<&CostFn> {
        self.class_costs
            .iter()
            .find(|(c, _)| *c == class)
            .map(|(_, f)| &**f)
            .or(self.cost.as_deref())
    }

    /// Its name and the name's number.
    pub(crate) fn key(&self) -> KernelName {
        KernelName {
            id: self.id,
            text: self.name,
        }
    }

    /// The host code. A launch checks that there is some (`runs_on`); were
    /// there none, the stand-in panics, which the engine's catch turns into
    /// the op's fault.
    #[inline]
    pub(crate) fn host(&self) -> &KernelFn {
        fn none(_: &mut Block<'_>) {
            panic!("the kernel has no host code (the launch should have refused it)")
        }
        match &self.f {
            Some(f) => &**f,
            None => &none,
        }
    }

    /// Whether the kernel has code a device of this kind runs; the launch's
    /// typed error when it has not.
    pub(crate) fn runs_on(&self, device_code: bool, device: &str) -> crate::Result<()> {
        let has = if device_code {
            self.code.is_some()
        } else {
            self.f.is_some()
        };
        if has {
            return Ok(());
        }
        Err(crate::Error::NoCodeForDevice {
            kernel: self.name,
            device: device.to_string(),
            has: if device_code {
                "a host closure only"
            } else {
                "device code only"
            },
            hint: if device_code {
                "give it device code with Kernel::wgsl or Kernel::spirv"
            } else {
                "give it a host closure with Kernel::new, or launch it on a device that runs device code"
            },
        })
    }
}

/// A kernel's code for devices that run compiled code: WGSL source (compiled
/// when the kernel first runs on such a device) or SPIR-V words. Buffer
/// arguments are storage buffers `@group(0) @binding(i)` in launch order; a
/// graph node's scalars are its push constants (8 bytes per scalar slot); the
/// grid's blocks are workgroups along x.
#[derive(Debug)]
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // read by the Vulkan backend
pub(crate) enum DeviceCode {
    Wgsl { source: String, entry: String },
    Spirv { words: Vec<u32>, entry: String },
}

pub(crate) type CostFn = dyn Fn(Grid) -> KernelCost + Send + Sync;

/// The work of one launch, for devices that model time (the emulated device):
/// it runs for `max(flops / compute rate, bytes / memory bandwidth)` on the
/// compute units it occupies. Kernels without a declared cost cost their
/// buffers' bytes at memory bandwidth in virtual time, and their measured host
/// time in real time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KernelCost {
    /// Floating-point operations of the whole launch.
    pub flops: f64,
    /// Bytes of device memory the launch reads and writes.
    pub bytes: f64,
}

/// The launch shape: a number of blocks, split across compute units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub(crate) blocks: u32,
}

impl Grid {
    /// A grid of `blocks` blocks (0 is rejected at launch).
    pub const fn new(blocks: u32) -> Self {
        Grid { blocks }
    }

    /// The number of blocks.
    pub const fn blocks(&self) -> u32 {
        self.blocks
    }
}

impl From<u32> for Grid {
    fn from(blocks: u32) -> Self {
        Grid::new(blocks)
    }
}

/// At most this many buffers per launch.
pub const MAX_KERNEL_ARGS: usize = 16;

/// Launches with up to this many buffers keep them inline in the op: no allocation.
pub const INLINE_KERNEL_ARGS: usize = 4;

/// The element type of a buffer argument, as one static per type (a pointer wide).
pub(crate) struct ElemInfo {
    pub(crate) id: fn() -> TypeId,
    pub(crate) name: fn() -> &'static str,
    pub(crate) size: usize,
}

impl ElemInfo {
    pub(crate) fn of<T: Pod>() -> &'static ElemInfo {
        const {
            &ElemInfo {
                id: TypeId::of::<T>,
                name: std::any::type_name::<T>,
                size: std::mem::size_of::<T>(),
            }
        }
    }
}

/// A buffer argument; its length is the storage's size over the element size
/// (buffers are created with exactly `len * size_of::<T>()` bytes).
#[derive(Clone)]
pub(crate) struct KArg {
    pub(crate) storage: Arc<Storage>,
    pub(crate) elem: &'static ElemInfo,
    pub(crate) write: bool,
}

impl KArg {
    pub(crate) fn len(&self) -> usize {
        self.storage.bytes() / self.elem.size.max(1)
    }
}

/// A launch's buffers: inline up to `INLINE_KERNEL_ARGS`, on the heap beyond.
pub(crate) enum ArgList {
    /// Filled in order; dropped by hand (`Drop` below) so that an empty launch
    /// does not pay a check per slot.
    Inline(std::mem::ManuallyDrop<[Option<KArg>; INLINE_KERNEL_ARGS]>),
    Heap(Box<[KArg]>),
}

impl Drop for ArgList {
    #[inline]
    fn drop(&mut self) {
        if let ArgList::Inline(a) = self {
            // The slots are filled in order: stop at the first empty one. Taking
            // each leaves `None` behind, so nothing is dropped twice.
            for slot in a.iter_mut() {
                if slot.take().is_none() {
                    break;
                }
            }
        }
    }
}

impl ArgList {
    #[inline]
    pub(crate) fn from_args(args: &[crate::Arg<'_>]) -> Self {
        let karg = |a: &crate::Arg<'_>| KArg {
            storage: a.storage.clone(),
            elem: a.elem,
            write: a.write,
        };
        if args.is_empty() {
            ArgList::Inline(std::mem::ManuallyDrop::new(
                [const { None }; INLINE_KERNEL_ARGS],
            ))
        } else if args.len() <= INLINE_KERNEL_ARGS {
            ArgList::Inline(std::mem::ManuallyDrop::new(std::array::from_fn(|i| {
                args.get(i).map(karg)
            })))
        } else {
            ArgList::Heap(args.iter().map(karg).collect())
        }
    }

    /// Whether the launch has no buffers (`from_args` fills the inline slots in
    /// order, so the first one tells).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, ArgList::Inline(a) if a[0].is_none())
    }

    pub(crate) fn as_slice_iter(&self) -> impl Iterator<Item = &KArg> {
        let (inline, heap): (&[Option<KArg>], &[KArg]) = match self {
            ArgList::Inline(a) => (&a[..], &[]),
            ArgList::Heap(b) => (&[], b),
        };
        inline.iter().flatten().chain(heap.iter())
    }
}

/// A buffer as one block sees it in a graph node: resolved at run time from a
/// fixed buffer, a bound slot or the graph's arena.
#[derive(Clone, Copy)]
pub(crate) struct KView {
    pub(crate) ptr: *mut u8,
    /// Elements.
    pub(crate) len: usize,
    /// Elements per partition unit between blocks (a pitched buffer's row).
    pub(crate) unit: usize,
    pub(crate) elem: &'static ElemInfo,
    pub(crate) write: bool,
}

/// The buffers a block reaches: an op's argument list (with how the running
/// backend's engines reach device memory), or a graph node's views.
#[derive(Clone, Copy)]
pub(crate) enum Args<'a> {
    List(&'a ArgList, Reach),
    Views(&'a [KView]),
}

impl<'a> Args<'a> {
    /// The `n`-th argument with the given direction: its position among all
    /// arguments, base pointer, length, element type and partition unit.
    fn nth(self, n: usize, write: bool) -> Option<Nth> {
        match self {
            Args::List(list, reach) => list
                .as_slice_iter()
                .enumerate()
                .filter(|(_, a)| a.write == write)
                .nth(n)
                .map(|(i, a)| Nth {
                    slot: i,
                    ptr: a.storage.engine_ptr(reach),
                    len: a.len(),
                    elem: a.elem,
                    unit: a.storage.unit_elems(a.elem.size),
                }),
            Args::Views(views) => views
                .iter()
                .enumerate()
                .filter(|(_, a)| a.write == write)
                .nth(n)
                .map(|(i, a)| Nth {
                    slot: i,
                    ptr: a.ptr,
                    len: a.len,
                    elem: a.elem,
                    unit: a.unit.max(1),
                }),
        }
    }
}

/// One argument as a block looks it up.
struct Nth {
    slot: usize,
    ptr: *mut u8,
    len: usize,
    elem: &'static ElemInfo,
    unit: usize,
}

/// What one block of a kernel sees: its index, the launch's buffers and, in a
/// graph node, its scalars.
///
/// Arguments are numbered separately for reads and writes, in launch order:
/// `read::<T>(0)` is the first `Arg::read`, `write::<T>(0)` the first `Arg::write`.
pub struct Block<'a> {
    index: u32,
    blocks: u32,
    args: Args<'a>,
    scalars: &'a [u64],
    taken: u16,
}

impl<'a> Block<'a> {
    pub(crate) fn new(index: u32, blocks: u32, args: &'a ArgList, reach: Reach) -> Self {
        Self::with(index, blocks, Args::List(args, reach), &[])
    }

    pub(crate) fn with(index: u32, blocks: u32, args: Args<'a>, scalars: &'a [u64]) -> Self {
        Block {
            index,
            blocks,
            args,
            scalars,
            taken: 0,
        }
    }

    /// This block's index in `0..grid`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The number of blocks in the grid.
    pub fn grid(&self) -> u32 {
        self.blocks
    }

    /// The scalars of a graph's kernel node (set with
    /// [`GraphExec::set_scalars`](crate::GraphExec::set_scalars), changed in place
    /// between replays); empty for a launch on a stream.
    pub fn scalars(&self) -> &'a [u64] {
        self.scalars
    }

    /// Scalar `n` as a `T` of at most 8 bytes (the low bytes of its word), or a
    /// message saying what is wrong.
    pub fn try_scalar<T: Pod>(&self, n: usize) -> Result<T, String> {
        let size = std::mem::size_of::<T>();
        if size > 8 {
            return Err(format!(
                "kernel asked for scalar::<{}>({n}), which is {size} bytes; scalars are 8-byte words",
                std::any::type_name::<T>()
            ));
        }
        let word = self.scalars.get(n).ok_or_else(|| {
            format!(
                "kernel asked for scalar {n}, but the node has {} scalars",
                self.scalars.len()
            )
        })?;
        let bytes = word.to_ne_bytes();
        Ok(bytemuck::pod_read_unaligned(&bytes[..size]))
    }

    /// Scalar `n`. Panics (failing the stream, not the process) if the node has
    /// no such scalar or `T` is wider than 8 bytes.
    pub fn scalar<T: Pod>(&self, n: usize) -> T {
        self.try_scalar(n).unwrap_or_else(|m| panic!("{m}"))
    }

    fn check<T: Pod>(elem: &ElemInfo, what: &str, n: usize) -> Result<(), String> {
        if (elem.id)() != TypeId::of::<T>() {
            return Err(format!(
                "kernel asked for {what}::<{}>({n}) but the buffer holds {}",
                std::any::type_name::<T>(),
                (elem.name)()
            ));
        }
        Ok(())
    }

    /// The whole of read argument `n`, or a message saying what is wrong.
    pub fn try_read<T: Pod>(&self, n: usize) -> Result<&'a [T], String> {
        let Nth { ptr, len, elem, .. } = self
            .args
            .nth(n, false)
            .ok_or_else(|| format!("kernel asked for read argument {n}, which was not passed"))?;
        Self::check::<T>(elem, "read", n)?;
        // SAFETY: the memory holds `len` initialised `T`s (type checked above, 256 B
        // aligned); the launch holds a read lock on it (or, in a graph, every
        // writer of it is ordered before or after this node), so nobody writes it now.
        Ok(unsafe { std::slice::from_raw_parts(ptr as *const T, len) })
    }

    /// The whole of read argument `n`. Panics (failing the stream, not the process)
    /// if it does not exist or holds another type.
    pub fn read<T: Pod>(&self, n: usize) -> &'a [T] {
        self.try_read(n).unwrap_or_else(|m| panic!("{m}"))
    }

    /// The element range of an argument of `len` elements given to this block:
    /// whole units (a pitched buffer's rows), split evenly between blocks.
    pub(crate) fn part(&self, len: usize, unit: usize) -> (usize, usize) {
        let unit = unit.max(1);
        let per = len.div_ceil(unit).div_ceil(self.blocks as usize) * unit;
        let start = (per * self.index as usize).min(len);
        (start, (start + per).min(len))
    }

    /// The index of the first element of write argument `n` this block owns.
    pub fn write_offset(&self, n: usize) -> usize {
        self.args
            .nth(n, true)
            .map(|a| self.part(a.len, a.unit).0)
            .unwrap_or(0)
    }

    /// This block's part of write argument `n`, or a message saying what is wrong.
    pub fn try_write<T: Pod>(&mut self, n: usize) -> Result<&'a mut [T], String> {
        let Nth {
            slot,
            ptr,
            len,
            elem,
            unit,
        } = self
            .args
            .nth(n, true)
            .ok_or_else(|| format!("kernel asked for write argument {n}, which was not passed"))?;
        Self::check::<T>(elem, "write", n)?;
        let bit = 1u16 << slot;
        if self.taken & bit != 0 {
            return Err(format!("kernel took write argument {n} twice in one block"));
        }
        self.taken |= bit;
        let (start, end) = self.part(len, unit);
        // SAFETY: the launch holds the write lock on this memory (in a graph: every
        // other node touching it is ordered before or after this one); blocks get
        // disjoint `start..end` ranges and each block takes its range once
        // (`taken`), so this is the only reference to these elements while the
        // kernel runs.
        Ok(unsafe { std::slice::from_raw_parts_mut((ptr as *mut T).add(start), end - start) })
    }

    /// This block's part of write argument `n`. Panics (failing the stream) if it does
    /// not exist, holds another type, or was already taken.
    pub fn write<T: Pod>(&mut self, n: usize) -> &'a mut [T] {
        self.try_write(n).unwrap_or_else(|m| panic!("{m}"))
    }
}

impl<'a> Block<'a> {
    /// Read argument `n` as the rows of `layout` (a pitched buffer's
    /// [`layout`](crate::PitchedBuffer::layout)), or a message saying what is wrong.
    pub fn try_read_rows<T: Pod>(
        &self,
        n: usize,
        layout: crate::PitchedLayout,
    ) -> Result<crate::exec::rows::Rows<'a, T>, String> {
        let data = self.try_read::<T>(n)?;
        crate::exec::rows::Rows::new(data, layout)
    }

    /// Read argument `n` as the rows of `layout`. Panics (failing the stream) where
    /// [`Block::try_read_rows`] returns a message.
    pub fn read_rows<T: Pod>(
        &self,
        n: usize,
        layout: crate::PitchedLayout,
    ) -> crate::exec::rows::Rows<'a, T> {
        self.try_read_rows(n, layout)
            .unwrap_or_else(|m| panic!("{m}"))
    }

    /// This block's rows of write argument `n` under `layout`: a pitched buffer is
    /// split between blocks by whole rows. A message if the argument is not split
    /// by rows (a flat buffer written by several blocks), or as for
    /// [`Block::try_write`].
    pub fn try_write_rows<T: Pod>(
        &mut self,
        n: usize,
        layout: crate::PitchedLayout,
    ) -> Result<crate::exec::rows::RowsMut<'a, T>, String> {
        let Nth { len, .. } = self
            .args
            .nth(n, true)
            .ok_or_else(|| format!("kernel asked for write argument {n}, which was not passed"))?;
        crate::exec::rows::check_layout(layout, len)?;
        let start = self.write_offset(n);
        let data = self.try_write::<T>(n)?;
        if !start.is_multiple_of(layout.pitch)
            || (!(start + data.len()).is_multiple_of(layout.pitch) && start + data.len() != len)
        {
            return Err(format!(
                "write argument {n} is not split between blocks by rows of {} elements; \
                 allocate it with Device::alloc_pitched, or launch one block",
                layout.pitch
            ));
        }
        Ok(crate::exec::rows::RowsMut::new(
            data,
            layout,
            start / layout.pitch,
        ))
    }

    /// This block's rows of write argument `n`. Panics (failing the stream) where
    /// [`Block::try_write_rows`] returns a message.
    pub fn write_rows<T: Pod>(
        &mut self,
        n: usize,
        layout: crate::PitchedLayout,
    ) -> crate::exec::rows::RowsMut<'a, T> {
        self.try_write_rows(n, layout)
            .unwrap_or_else(|m| panic!("{m}"))
    }
}
