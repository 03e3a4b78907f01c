//! WGSL twins of the suite's kernels: what a Vulkan device runs where the
//! host and the emulated device run the closure. Each kernel walks its output
//! with a grid-stride loop over the whole buffer (`global_invocation_id`, then
//! steps of every invocation of the grid), so any grid covers every element,
//! as the closure's blocks together do. Scalars (a graph kernel node's,
//! `Block::scalars`) are push constants: 8-byte slots, `s(i)` is slot `i`'s
//! low 32 bits.
//!
//! On lavapipe an invocation's loops stop after 65 535 iterations counted
//! together (the grid-stride loop's and any loop inside `expr`'s functions),
//! leaving the rest unwritten: with grid 1 an invocation walks `len / 64`
//! elements, so keep `len / 64` × (the steps of `expr` + 1) below that.

/// A kernel that writes `y[i] = EXPR` for every element of its last buffer
/// `y`, after `reads` read-only buffers `x0`, `x1`, … of element type `ty`
/// (`u32` or `f32`). `expr` may use `i`, `x0[i]`…, `y[i]` (the old value) and
/// `s(k)` (scalar slot `k` as a `u32`).
pub fn map(ty: &str, reads: usize, expr: &str) -> String {
    map_with(ty, reads, "", expr)
}

/// As [`map`], with WGSL functions (`prelude`) that `expr` may call.
pub fn map_with(ty: &str, reads: usize, prelude: &str, expr: &str) -> String {
    let mut src = String::from(
        "struct Scalars { v: array<vec2<u32>, 8> }\n\
         var<push_constant> pc: Scalars;\n\
         fn s(k: u32) -> u32 { return pc.v[k].x; }\n",
    );
    src += prelude;
    src += "\n";
    for r in 0..reads {
        src += &format!("@group(0) @binding({r}) var<storage, read> x{r}: array<{ty}>;\n");
    }
    src += &format!(
        "@group(0) @binding({reads}) var<storage, read_write> y: array<{ty}>;\n\
         @compute @workgroup_size(64)\n\
         fn main(@builtin(global_invocation_id) id: vec3<u32>,\n\
                 @builtin(num_workgroups) groups: vec3<u32>) {{\n\
             var i = id.x;\n\
             loop {{\n\
                 if (i >= arrayLength(&y)) {{ break; }}\n\
                 y[i] = {expr};\n\
                 i = i + groups.x * 64u;\n\
             }}\n\
         }}\n"
    );
    src
}

/// A kernel that touches nothing: `buffers` read-write `u32` buffers bound,
/// none written.
pub fn nothing(buffers: usize) -> String {
    let mut src = String::new();
    for b in 0..buffers {
        src += &format!("@group(0) @binding({b}) var<storage, read_write> b{b}: array<u32>;\n");
    }
    src += "@compute @workgroup_size(64)\nfn main() {}\n";
    src
}

/// WGSL that does not compile (an unknown name): a kernel that fails on a
/// device that compiles device code, as a panicking closure fails on one
/// that runs host code. The failing line ends in a comment saying `why`, so
/// the compiler's message (which quotes the line) says it too.
pub fn fails(why: &str) -> String {
    format!(
        "@compute @workgroup_size(64)\n\
         fn main() {{ let x: u32 = this_name_is_not_defined; }} // {why}\n"
    )
}

/// A kernel that checks its first buffer `x` (`u32`) is uniform: it writes
/// `x[0]` and the number of elements that differ from it into its second
/// buffer `r` (two `u32`). One workgroup does it all (launch one block);
/// `passes` > 1 reads the buffer that many times, each invocation its own
/// elements, so the kernel stays running (and looking) for a while: keep
/// `passes * len / 64` under lavapipe's ~64 000 iterations per invocation.
pub fn check_uniform(passes: u32) -> String {
    format!(
        "@group(0) @binding(0) var<storage, read> x: array<u32>;\n\
         @group(0) @binding(1) var<storage, read_write> r: array<u32>;\n\
         var<workgroup> differ: atomic<u32>;\n\
         @compute @workgroup_size(64)\n\
         fn main(@builtin(local_invocation_index) lane: u32) {{\n\
             if (lane == 0u) {{ atomicStore(&differ, 0u); }}\n\
             workgroupBarrier();\n\
             let first = x[0];\n\
             for (var round = 0u; round < {passes}u; round = round + 1u) {{\n\
                 var i = lane;\n\
                 loop {{\n\
                     if (i >= arrayLength(&x)) {{ break; }}\n\
                     if (x[i] != first) {{ atomicAdd(&differ, 1u); }}\n\
                     i = i + 64u;\n\
                 }}\n\
             }}\n\
             workgroupBarrier();\n\
             if (lane == 0u) {{ r[0] = first; r[1] = atomicLoad(&differ); }}\n\
         }}\n"
    )
}
