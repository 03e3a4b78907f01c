//! The kernel handle users hold: a named closure run once per block of a grid
//! (what engines see of it is `exec::kernel`).

use crate::exec::kernel::{name_id, Block, DeviceCode, Grid, KernelCost, KernelInner};
use std::sync::Arc;

/// A kernel: a named closure run once per block.
///
/// Lifetime: a launch keeps its kernel alive until it has completed, whatever
/// happens to the handles. On the host backend a stream also keeps the kernels
/// of its recent launches, at most one per slot of its submission ring
/// ([`DeviceConfig::stream_capacity`](crate::DeviceConfig::stream_capacity)),
/// until a later launch in that slot replaces it or the stream is dropped:
/// that is what lets a launch change no reference count. What a kernel's
/// closure captures lives that long too.
///
/// ```
/// use hetero::{Arg, Device, Grid, Kernel};
/// let dev = Device::host().unwrap();
/// let s = dev.create_stream().unwrap();
/// let out = dev.alloc::<u32>(8).unwrap();
/// let k = Kernel::new("iota", |b| {
///     let base = b.write_offset(0);
///     for (i, v) in b.write::<u32>(0).iter_mut().enumerate() {
///         *v = (base + i) as u32;
///     }
/// });
/// s.launch(&k, Grid::new(2), &[Arg::write(&out)]).unwrap();
/// assert_eq!(s.read_to_vec(&out).unwrap(), (0..8).collect::<Vec<u32>>());
/// ```
#[derive(Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<KernelInner>,
}

impl Kernel {
    /// Wraps `f` as a kernel named `name` (the name shows in errors and profiles).
    pub fn new(name: &'static str, f: impl Fn(&mut Block<'_>) + Send + Sync + 'static) -> Self {
        Kernel {
            inner: Arc::new(KernelInner {
                name,
                id: name_id(name),
                f: Some(Arc::new(f)),
                cost: None,
                class_costs: Vec::new(),
                code: None,
            }),
        }
    }

    /// A kernel that declares its cost as a function of the grid (used by
    /// devices that model time; the host device ignores it).
    ///
    /// ```
    /// use hetero::{Grid, Kernel, KernelCost};
    /// let k = Kernel::with_cost(
    ///     "axpy",
    ///     |g: Grid| KernelCost { flops: 2.0 * 1024.0 * f64::from(g.blocks()), bytes: 0.0 },
    ///     |_| {},
    /// );
    /// assert_eq!(k.name(), "axpy");
    /// ```
    pub fn with_cost(
        name: &'static str,
        cost: impl Fn(Grid) -> KernelCost + Send + Sync + 'static,
        f: impl Fn(&mut Block<'_>) + Send + Sync + 'static,
    ) -> Self {
        Kernel {
            inner: Arc::new(KernelInner {
                name,
                id: name_id(name),
                f: Some(Arc::new(f)),
                cost: Some(Arc::new(cost)),
                class_costs: Vec::new(),
                code: None,
            }),
        }
    }

    /// A kernel with device code only, in WGSL (see [`Kernel::wgsl`]): it
    /// runs on devices that run device code; a launch elsewhere is
    /// [`Error::NoCodeForDevice`](crate::Error::NoCodeForDevice).
    pub fn from_wgsl(name: &'static str, source: impl Into<String>, entry: &str) -> Self {
        Kernel {
            inner: Arc::new(KernelInner {
                name,
                id: name_id(name),
                f: None,
                cost: None,
                class_costs: Vec::new(),
                code: None,
            }),
        }
        .wgsl(source, entry)
    }

    /// The same kernel with device code in WGSL beside its host closure:
    /// devices that run device code (Vulkan) compile it, at its first launch
    /// there, and run it; the others run the closure. Buffer arguments are
    /// `@group(0) @binding(i)` storage buffers in launch order (read
    /// arguments may be `read`, written ones `read_write`); a graph node's
    /// scalars are push constants, one 8-byte slot each (`@align(8)` fields);
    /// the grid's blocks are workgroups along x, so a block's part of a
    /// buffer is the kernel's own indexing (`global_invocation_id`).
    pub fn wgsl(self, source: impl Into<String>, entry: &str) -> Self {
        self.with_code(DeviceCode::Wgsl {
            source: source.into(),
            entry: entry.to_string(),
        })
    }

    /// The same kernel with device code as SPIR-V words (a compute shader
    /// with entry point `entry`; bindings as for [`Kernel::wgsl`]).
    pub fn spirv(self, words: impl Into<Vec<u32>>, entry: &str) -> Self {
        self.with_code(DeviceCode::Spirv {
            words: words.into(),
            entry: entry.to_string(),
        })
    }

    /// The same kernel with its cost on modelled devices of `class`
    /// ([`EmuConfig::class`](crate::EmuConfig::class)) declared apart: a
    /// launch there costs `cost(grid)`, elsewhere the kernel's one cost
    /// ([`Kernel::with_cost`]; none: as a kernel without a declared cost).
    /// StarPU's codelets have a performance model per architecture; this
    /// is the cost the emulated device times the launch with, which the
    /// task layer's models then learn.
    ///
    /// ```
    /// use hetero::{ComputeClass, Grid, Kernel, KernelCost};
    /// let flops = |f: f64| move |_: Grid| KernelCost { flops: f, bytes: 0.0 };
    /// // A panel factorization: near peak on a CPU's cores, a tenth of it
    /// // on an accelerator's units.
    /// let potrf = Kernel::with_cost("potrf", flops(1e9), |_| {})
    ///     .cost_on(ComputeClass::Accelerator, flops(10e9));
    /// assert_eq!(potrf.name(), "potrf");
    /// ```
    pub fn cost_on(
        mut self,
        class: crate::ComputeClass,
        cost: impl Fn(Grid) -> KernelCost + Send + Sync + 'static,
    ) -> Self {
        let cost: Arc<crate::exec::kernel::CostFn> = Arc::new(cost);
        let k = self.unique();
        k.class_costs.retain(|(c, _)| *c != class);
        k.class_costs.push((class, cost));
        self
    }

    fn with_code(mut self, code: DeviceCode) -> Self {
        self.unique().code = Some(Arc::new(code));
        self
    }

    /// Its description, to change: this handle's own, or (shared already)
    /// a copy for this handle.
    fn unique(&mut self) -> &mut KernelInner {
        Arc::make_mut(&mut self.inner)
    }

    /// Whether the kernel has device code (WGSL or SPIR-V).
    pub fn has_device_code(&self) -> bool {
        self.inner.code.is_some()
    }

    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        self.inner.name
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.inner.name)
            .finish()
    }
}
