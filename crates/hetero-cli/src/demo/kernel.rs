//! The demo's kernel and its CPU reference: the work one tile gets (a copy, then
//! `work` eighths of a pass of `step` over it, see [`PASS`]), as hetero's
//! blocks, the demo's peer and the bench's threads all run it, and the
//! element-by-element computation the outputs are checked against.

use hetero::{Block, Kernel, KernelCost};

/// Kernel passes per element on the emulated device (its modelled time comes
/// from the declared cost; the passes are the host work checked against
/// `reference`). Small, so that in real time the driver thread's host work stays
/// below the modelled stage times.
pub const EMU_KERNEL_WORK: u32 = 2 * PASS;

/// Units of kernel work in one pass over a tile: the work is counted in
/// eighths of a pass, so that calibration can size the kernel to a few
/// percent (a whole pass is about a third of a tile's copies on the host).
pub const PASS: u32 = 8;

pub(super) fn scale_kernel(work: u32) -> Kernel {
    Kernel::new("scale", move |b| scale_block(b, work)).wgsl(scale_wgsl(work), "main")
}

/// The kernel as device code (WGSL), for devices that run it: the same steps
/// per element as [`scale_into`] (`work` baked in), each invocation striding
/// over the tile, so any grid covers it.
fn scale_wgsl(work: u32) -> String {
    format!(
        "@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
const WORK: u32 = {work}u;
const PASS: u32 = {PASS}u;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {{
    let n = arrayLength(&y);
    let part = n * (WORK % PASS) / PASS;
    for (var i = gid.x; i < n; i += groups.x * 64u) {{
        var steps = WORK / PASS;
        if (i < part) {{ steps += 1u; }}
        var v = x[i];
        for (var k = 0u; k < steps; k++) {{ v = v * 0.9999 + 0.5; }}
        y[i] = v;
    }}
}}
"
    )
}

/// The same kernel with a declared cost for the emulated device's model.
pub(super) fn scale_kernel_with_cost(work: u32, cost: KernelCost) -> Kernel {
    Kernel::with_cost("scale", move |_| cost, move |b| scale_block(b, work))
}

fn scale_block(b: &mut Block<'_>, work: u32) {
    let x = b.read::<f32>(0);
    let off = b.write_offset(0);
    let y = b.write::<f32>(0);
    scale_into(&x[off..off + y.len()], y, work);
}

/// The demo kernel's work on one tile, as every runner of it does it (hetero's
/// blocks, the demo's peer, the bench's threads): `dst` takes `src`, then
/// [`scale_in_place`].
pub fn scale_into(src: &[f32], dst: &mut [f32], work: u32) {
    dst.copy_from_slice(src);
    scale_in_place(dst, work);
}

/// The kernel's body after its copy: `work` eighths of a pass ([`PASS`]), that
/// is `work / PASS` passes over the whole tile, then one over its first
/// `work % PASS` eighths (the inner loops vectorise); each element sees the
/// same sequence of operations as `reference`. Peers that do the demo's work
/// call it too.
pub fn scale_in_place(y: &mut [f32], work: u32) {
    for _ in 0..work / PASS {
        for v in y.iter_mut() {
            *v = step(*v);
        }
    }
    let part = partial_len(y.len(), work);
    for v in &mut y[..part] {
        *v = step(*v);
    }
}

/// How many leading elements of a tile of `n` get the partial pass.
fn partial_len(n: usize, work: u32) -> usize {
    n * (work % PASS) as usize / PASS as usize
}

#[inline(always)]
fn step(v: f32) -> f32 {
    v * 0.999_9 + 0.5
}

/// The computation for element `i` of a tile of `n`, shared by the kernel and
/// the CPU check.
pub fn reference(x: f32, work: u32, i: usize, n: usize) -> f32 {
    let steps = work / PASS + u32::from(i < partial_len(n, work));
    (0..steps).fold(x, |v, _| step(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work in eighths of a pass: whole passes over the tile, then one over its
    /// first eighths, element by element as `reference` says.
    #[test]
    fn fractional_work_matches_the_reference() {
        let n = 100;
        for work in [0, 3, 8, 13, 16, 23] {
            let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let mut y = x.clone();
            scale_in_place(&mut y, work);
            for (i, (a, b)) in x.iter().zip(&y).enumerate() {
                assert_eq!(
                    reference(*a, work, i, n).to_bits(),
                    b.to_bits(),
                    "work {work}, {i}"
                );
            }
            // 13 = one pass and 5/8: the first 62 elements got two steps.
            if work == 13 {
                assert_eq!(y[61].to_bits(), reference(61.0, 16, 0, n).to_bits());
                assert_eq!(y[62].to_bits(), reference(62.0, 8, 0, n).to_bits());
            }
        }
    }
}
