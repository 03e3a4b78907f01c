//! The kernels and host steps the managed-memory suites share
//! (`managed.rs`, `managed_multi.rs`), each kernel with its WGSL twin.

use hetero::{Kernel, ManagedBuffer};

/// `x = x * a + c` over the elements the kernel writes.
pub fn affine(a: u32, c: u32) -> Kernel {
    Kernel::new("affine", move |b| {
        for x in b.write::<u32>(0) {
            *x = x.wrapping_mul(a).wrapping_add(c);
        }
    })
    .wgsl(
        super::wgsl::map("u32", 0, &format!("y[i] * {a}u + {c}u")),
        "main",
    )
}

/// `dst = src + 1`, element by element (one block).
pub fn plus_one() -> Kernel {
    Kernel::new("plus_one", |b| {
        let src = b.read::<u32>(0);
        let dst = b.write::<u32>(0);
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.wrapping_add(1);
        }
    })
    .wgsl(super::wgsl::map("u32", 1, "x0[i] + 1u"), "main")
}

/// A kernel that reads its one buffer and writes nothing.
pub fn touch() -> Kernel {
    Kernel::new("touch", |b| {
        let _ = b.read::<u32>(0);
    })
    .wgsl(super::wgsl::nothing(1), "main")
}

/// Writes `f(i)` to every element `i` through a host write guard.
pub fn host_fill(buf: &ManagedBuffer<u32>, f: impl Fn(usize) -> u32) {
    let mut g = buf.write(..).expect("write guard");
    for (i, x) in g.iter_mut().enumerate() {
        *x = f(i);
    }
}

/// Where a kernel's range may start: anywhere, or on a Vulkan device at a
/// multiple of 64 `u32` elements (256 bytes: it binds ranges only there).
pub fn kernel_at(start: usize) -> usize {
    if super::backend() == super::Backend::Vulkan {
        start / 64 * 64
    } else {
        start
    }
}
