//! Built-in kernels, each with host code and WGSL, so they run on every
//! device: the host and the emulated device run the closure, a Vulkan device
//! the WGSL. Their parameters are baked into the code (a kernel per value, so
//! keep the kernel and launch it again rather than making it per launch).
//!
//! Grids: every built-in covers its output with any grid on the host (blocks
//! split the written buffer); on a device it needs at least the workgroups its
//! `*_groups` function gives (an invocation per element or per output tile).

use crate::exec::kernel::Grid;
use crate::Kernel;

/// Invocations per workgroup of the element-wise built-ins.
const WORKGROUP: usize = 64;

/// The workgroups an element-wise built-in needs for `n` elements.
pub fn elementwise_groups(n: usize) -> Grid {
    Grid::new(n.div_ceil(WORKGROUP).max(1) as u32)
}

/// An element-wise kernel's WGSL over `y`, with `param` (its exact bits) as `A`.
fn elementwise_wgsl(param: f32, inputs: &str, body: &str) -> String {
    let bits = param.to_bits();
    format!(
        "{inputs}
@compute @workgroup_size({WORKGROUP})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let A = bitcast<f32>({bits}u);
    let i = gid.x;
    if (i < arrayLength(&y)) {{
        {body}
    }}
}}
"
    )
}

/// `y[i] = value` for every element of `y` (an `f32` buffer, the kernel's only
/// argument, written).
pub fn fill_f32(value: f32) -> Kernel {
    let wgsl = elementwise_wgsl(
        value,
        "@group(0) @binding(0) var<storage, read_write> y: array<f32>;",
        "y[i] = A;",
    );
    Kernel::new("fill_f32", move |b| b.write::<f32>(0).fill(value)).wgsl(wgsl, "main")
}

/// `y[i] = a * y[i]` (an `f32` buffer, the only argument, written).
pub fn scale_f32(a: f32) -> Kernel {
    let wgsl = elementwise_wgsl(
        a,
        "@group(0) @binding(0) var<storage, read_write> y: array<f32>;",
        "y[i] = A * y[i];",
    );
    Kernel::new("scale_f32", move |b| {
        for v in b.write::<f32>(0) {
            *v *= a;
        }
    })
    .wgsl(wgsl, "main")
}

/// `y[i] = a * x[i] + y[i]` (arguments: `x` read, `y` written, both `f32`, `x` at
/// least as long as `y`). The multiply and the add are separate operations in
/// both codes (on lavapipe the results agree bit for bit; a GPU's compiler may
/// fuse them).
pub fn axpy_f32(a: f32) -> Kernel {
    let wgsl = elementwise_wgsl(
        a,
        "@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;",
        "let ax = A * x[i];\n        y[i] = ax + y[i];",
    );
    Kernel::new("axpy_f32", move |b| {
        let x = b.read::<f32>(0);
        let off = b.write_offset(0);
        for (i, v) in b.write::<f32>(0).iter_mut().enumerate() {
            *v += a * x[off + i];
        }
    })
    .wgsl(wgsl, "main")
}

/// Side of the output tile one workgroup of [`gemm_f32`] computes.
const TILE: usize = 16;

/// The workgroups [`gemm_f32`] needs for an `m` × `n` output.
pub fn gemm_groups(m: usize, n: usize) -> Grid {
    Grid::new((m.div_ceil(TILE) * n.div_ceil(TILE)).max(1) as u32)
}

/// `C = A × B` for row-major `f32` matrices: `A` is `m` × `k`, `B` is `k` × `n`,
/// `C` is `m` × `n` (arguments: `A` and `B` read, `C` written). On a device each
/// workgroup computes a 16 × 16 tile of `C` through workgroup memory; on the
/// host each block its part of `C`. Sums run over `k` in order in both codes.
///
/// On lavapipe an invocation's loops stop after 65 535 iterations in all
/// (an invocation here runs `k + k / 16` of them), leaving `C` partly
/// unwritten: keep `k` below about 61 000 there (a real GPU has no such cap).
pub fn gemm_f32(m: usize, k: usize, n: usize) -> Kernel {
    let wgsl = format!(
        "const M: u32 = {m}u;
const K: u32 = {k}u;
const N: u32 = {n}u;
const T: u32 = {TILE}u;
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
var<workgroup> ta: array<array<f32, {TILE}>, {TILE}>;
var<workgroup> tb: array<array<f32, {TILE}>, {TILE}>;
@compute @workgroup_size({TILE}, {TILE})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {{
    let tiles_n = (N + T - 1u) / T;
    let row = (wg.x / tiles_n) * T + l.y;
    let col = (wg.x % tiles_n) * T + l.x;
    var acc = 0.0;
    for (var t = 0u; t < K; t += T) {{
        let ka = t + l.x;
        let kb = t + l.y;
        var va = 0.0;
        if (row < M && ka < K) {{ va = a[row * K + ka]; }}
        var vb = 0.0;
        if (kb < K && col < N) {{ vb = b[kb * N + col]; }}
        ta[l.y][l.x] = va;
        tb[l.y][l.x] = vb;
        workgroupBarrier();
        let steps = min(T, K - t);
        for (var j = 0u; j < steps; j++) {{
            let p = ta[l.y][j] * tb[j][l.x];
            acc = acc + p;
        }}
        workgroupBarrier();
    }}
    if (row < M && col < N) {{
        c[row * N + col] = acc;
    }}
}}
"
    );
    Kernel::new("gemm_f32", move |blk| {
        let a = blk.read::<f32>(0);
        let b = blk.read::<f32>(1);
        let off = blk.write_offset(0);
        for (i, out) in blk.write::<f32>(0).iter_mut().enumerate() {
            let (row, col) = ((off + i) / n, (off + i) % n);
            let mut acc = 0.0f32;
            for j in 0..k {
                let p = a[row * k + j] * b[j * n + col];
                acc += p;
            }
            *out = acc;
        }
    })
    .wgsl(wgsl, "main")
}
