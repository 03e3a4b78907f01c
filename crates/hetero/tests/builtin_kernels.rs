//! The built-in kernels (`hetero::kernels`) on the device under test, checked
//! against the same computation on the CPU: the host and the emulated device
//! run their closures, a Vulkan device their WGSL.

mod common;

use hetero::{kernels, Arg};

#[test]
fn element_wise_builtins_match_the_cpu() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let n = 3000;
    let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 100.0).collect();
    let x = s.alloc::<f32>(n).unwrap();
    let y = s.alloc::<f32>(n).unwrap();
    s.write_slice(&x, 0, &xs).unwrap();
    let g = kernels::elementwise_groups(n);
    s.launch(&kernels::fill_f32(1.5), g, &[Arg::write(&y)])
        .unwrap();
    s.launch(&kernels::axpy_f32(3.0), g, &[Arg::read(&x), Arg::write(&y)])
        .unwrap();
    s.launch(&kernels::scale_f32(-0.5), g, &[Arg::write(&y)])
        .unwrap();
    let got = s.read_to_vec(&y).unwrap();
    for (i, (x, y)) in xs.iter().zip(&got).enumerate() {
        let ax = 3.0 * x;
        let want = -0.5 * (ax + 1.5);
        assert_eq!(want.to_bits(), y.to_bits(), "element {i}: {want} vs {y}");
    }
}

#[test]
fn tiled_gemm_matches_the_cpu_on_ragged_shapes() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    // Not multiples of the 16 x 16 tile in any dimension.
    let (m, k, n) = (37, 23, 41);
    let av: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let bv: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 * 0.5).collect();
    let a = s.alloc::<f32>(m * k).unwrap();
    let b = s.alloc::<f32>(k * n).unwrap();
    let c = s.alloc::<f32>(m * n).unwrap();
    s.write_slice(&a, 0, &av).unwrap();
    s.write_slice(&b, 0, &bv).unwrap();
    s.launch(
        &kernels::gemm_f32(m, k, n),
        kernels::gemm_groups(m, n),
        &[Arg::read(&a), Arg::read(&b), Arg::write(&c)],
    )
    .unwrap();
    let got = s.read_to_vec(&c).unwrap();
    for row in 0..m {
        for col in 0..n {
            // Small integers and halves: every partial sum is exact in f32.
            let want: f32 = (0..k).map(|j| av[row * k + j] * bv[j * n + col]).sum();
            assert_eq!(got[row * n + col], want, "C[{row}][{col}]");
        }
    }
}
