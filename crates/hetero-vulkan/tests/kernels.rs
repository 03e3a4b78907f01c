//! Kernels: WGSL through naga, dispatch with push constants and storage buffers
//! (push descriptors and the pool fallback), typed errors for bad sources and
//! SPIR-V, the disk pipeline cache.

mod common;

use std::time::{Duration, Instant};

use hetero_vulkan::{
    compile_wgsl, CacheLocation, Chunk, Gpu, Lane, MemoryUse, OpenOptions, Pipeline, Timeline,
    VkError,
};

const SAXPY: &str = "
var<push_constant> a: f32;
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if id.x < arrayLength(&y) {
        y[id.x] = a * x[id.x] + y[id.x];
    }
}
";

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

/// y = a*x + y over n floats; returns y as computed.
fn saxpy(gpu: &Gpu, n: usize, a: f32) -> Vec<f32> {
    let words = compile_wgsl(SAXPY, "main").expect("compile");
    let pipeline = Pipeline::new(gpu, &words, "main", 2, 4).expect("pipeline");
    let size = (n * 4) as u64;
    let x = Chunk::new(gpu, size, MemoryUse::Upload).expect("x");
    let y = Chunk::new(gpu, size, MemoryUse::Readback).expect("y");
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let ys: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32 * 0.5).collect();
    x.write(0, &bytes(&xs)).expect("write x");
    y.write(0, &bytes(&ys)).expect("write y");
    let mut r = gpu.recorder(Lane::Compute).expect("recorder");
    let groups = (n as u32).div_ceil(64);
    r.dispatch(
        &pipeline,
        &[(&x, 0, size), (&y, 0, size)],
        &a.to_le_bytes(),
        [groups, 1, 1],
    )
    .expect("dispatch");
    let cmd = r.finish().expect("finish");
    let done = Timeline::new(gpu, 0).expect("timeline");
    gpu.submit(Lane::Compute, &[&cmd], &[], &[(&done, 1)])
        .expect("submit");
    done.wait(1, Duration::from_secs(60)).expect("wait");
    let mut out = vec![0u8; size as usize];
    y.read(0, &mut out).expect("read");
    let got = f32s(&out);
    for i in 0..n {
        assert_eq!(got[i], a * xs[i] + ys[i], "element {i}");
    }
    got
}

#[test]
fn saxpy_with_push_descriptors() {
    let Some(gpu) = common::gpu() else { return };
    saxpy(&gpu, 10_000, 2.5);
}

#[test]
fn saxpy_with_descriptor_sets_from_a_pool() {
    let Some(gpu) = common::gpu_with(&OpenOptions {
        disable_push_descriptors: true,
        cache: CacheLocation::Off,
        ..OpenOptions::default()
    }) else {
        return;
    };
    assert!(!gpu.uses_push_descriptors());
    saxpy(&gpu, 4097, -3.0);
}

#[test]
fn many_dispatches_in_one_buffer_outgrow_one_descriptor_pool() {
    let Some(gpu) = common::gpu_with(&OpenOptions {
        disable_push_descriptors: true,
        cache: CacheLocation::Off,
        ..OpenOptions::default()
    }) else {
        return;
    };
    let words = compile_wgsl(SAXPY, "main").expect("compile");
    let pipeline = Pipeline::new(&gpu, &words, "main", 2, 4).expect("pipeline");
    let x = Chunk::new(&gpu, 256, MemoryUse::Upload).expect("x");
    let y = Chunk::new(&gpu, 256, MemoryUse::Readback).expect("y");
    x.write(0, &bytes(&[1.0; 64])).expect("write");
    y.write(0, &bytes(&[0.0; 64])).expect("write");
    let mut r = gpu.recorder(Lane::Compute).expect("recorder");
    for _ in 0..200 {
        // Each dispatch reads y after the previous wrote it: barriers between them.
        r.dispatch(
            &pipeline,
            &[(&x, 0, 256), (&y, 0, 256)],
            &1.0f32.to_le_bytes(),
            [1, 1, 1],
        )
        .expect("dispatch");
    }
    let cmd = r.finish().expect("finish");
    let t = Timeline::new(&gpu, 0).expect("timeline");
    gpu.submit(Lane::Compute, &[&cmd], &[], &[(&t, 1)])
        .expect("submit");
    t.wait(1, Duration::from_secs(60)).expect("wait");
    let mut out = vec![0u8; 256];
    y.read(0, &mut out).expect("read");
    assert!(
        f32s(&out).iter().all(|&v| v == 200.0),
        "{:?}",
        &f32s(&out)[..4]
    );
}

#[test]
fn dispatch_arguments_are_checked_and_zero_groups_record_nothing() {
    let Some(gpu) = common::gpu() else { return };
    let words = compile_wgsl(SAXPY, "main").expect("compile");
    let pipeline = Pipeline::new(&gpu, &words, "main", 2, 4).expect("pipeline");
    let x = Chunk::new(&gpu, 256, MemoryUse::Upload).expect("x");
    let y = Chunk::new(&gpu, 256, MemoryUse::Readback).expect("y");
    y.write(0, &bytes(&[5.0; 64])).expect("write");
    let a = 1.0f32.to_le_bytes();
    let mut r = gpu.recorder(Lane::Compute).expect("recorder");
    let bad = |e: Result<(), VkError>| matches!(e, Err(VkError::InvalidArgument(_)));
    assert!(
        bad(r.dispatch(&pipeline, &[(&x, 0, 256)], &a, [1, 1, 1])),
        "one buffer for two bindings"
    );
    assert!(
        bad(r.dispatch(
            &pipeline,
            &[(&x, 0, 256), (&y, 0, 256)],
            &[0u8; 8],
            [1, 1, 1]
        )),
        "push size"
    );
    assert!(
        bad(r.dispatch(&pipeline, &[(&x, 1, 128), (&y, 0, 256)], &a, [1, 1, 1])),
        "misaligned offset"
    );
    assert!(
        bad(r.dispatch(&pipeline, &[(&x, 0, 0), (&y, 0, 256)], &a, [1, 1, 1])),
        "empty binding"
    );
    assert!(
        bad(r.dispatch(
            &pipeline,
            &[(&x, 0, 256), (&y, 0, 256)],
            &a,
            [u32::MAX, 1, 1]
        )),
        "groups"
    );
    assert!(matches!(
        r.dispatch(&pipeline, &[(&x, 0, 512), (&y, 0, 256)], &a, [1, 1, 1]),
        Err(VkError::OutOfBounds { .. })
    ));
    // Zero groups: nothing runs, y keeps its values.
    r.dispatch(&pipeline, &[(&x, 0, 256), (&y, 0, 256)], &a, [0, 1, 1])
        .expect("zero groups");
    let cmd = r.finish().expect("finish");
    let t = Timeline::new(&gpu, 0).expect("timeline");
    gpu.submit(Lane::Compute, &[&cmd], &[], &[(&t, 1)])
        .expect("submit");
    t.wait(1, Duration::from_secs(10)).expect("wait");
    let mut out = vec![0u8; 256];
    y.read(0, &mut out).expect("read");
    assert!(f32s(&out).iter().all(|&v| v == 5.0));
}

#[test]
fn wgsl_syntax_errors_name_their_line() {
    let src =
        "@compute @workgroup_size(1)\nfn main() {\n    let x: u32 = 1u\n    let y = x +;\n}\n";
    match compile_wgsl(src, "main") {
        Err(e @ VkError::Wgsl { .. }) => {
            let VkError::Wgsl {
                line,
                column,
                ref message,
            } = e
            else {
                unreachable!()
            };
            assert!(line == 3 || line == 4, "line {line}: {message}");
            assert!(column > 0);
            assert!(e.to_string().contains(&format!("line {line}")), "{e}");
        }
        other => panic!("expected a WGSL error, got {other:?}"),
    }
    // Type errors (validation, not parsing) carry a line too.
    let src = "@group(0) @binding(0) var<storage, read_write> v: array<u32>;\n@compute @workgroup_size(1)\nfn main() {\n    v[0] = 1.5;\n}\n";
    assert!(matches!(
        compile_wgsl(src, "main"),
        Err(VkError::Wgsl { line: 4, .. })
    ));
    assert!(matches!(
        compile_wgsl(SAXPY, "nope"),
        Err(VkError::NoEntryPoint { .. })
    ));
}

#[test]
fn garbage_spirv_is_a_typed_error() {
    let Some(gpu) = common::gpu() else { return };
    let garbage: Vec<u32> = (0..256u32)
        .map(|i| i.wrapping_mul(0x9e37_79b9) ^ 0x5bd1_e995)
        .collect();
    assert!(matches!(
        Pipeline::new(&gpu, &garbage, "main", 1, 0),
        Err(VkError::InvalidSpirv(_))
    ));
    assert!(matches!(
        Pipeline::new(&gpu, &[], "main", 1, 0),
        Err(VkError::InvalidSpirv(_))
    ));
    // A valid header followed by garbage.
    let mut words = compile_wgsl(SAXPY, "main").expect("compile");
    let cut = words.len() / 2;
    for w in &mut words[cut..] {
        *w = 0xffff_ffff;
    }
    assert!(matches!(
        Pipeline::new(&gpu, &words, "main", 2, 4),
        Err(VkError::InvalidSpirv(_))
    ));
    let words = compile_wgsl(SAXPY, "main").expect("compile");
    assert!(matches!(
        Pipeline::new(&gpu, &words, "other", 2, 4),
        Err(VkError::NoEntryPoint { .. })
    ));
    assert!(matches!(
        Pipeline::new(&gpu, &words, "main", 2, 6),
        Err(VkError::InvalidArgument(_))
    ));
    // The device still builds pipelines afterwards.
    Pipeline::new(&gpu, &words, "main", 2, 4).expect("pipeline after errors");
}

#[test]
fn the_pipeline_cache_is_written_and_loaded_by_the_next_device() {
    let dir = common::temp_dir("cache");
    let options = OpenOptions {
        cache: CacheLocation::Dir(dir.clone()),
        ..OpenOptions::default()
    };
    let words = compile_wgsl(SAXPY, "main").expect("compile");
    let first = {
        let Some(gpu) = common::gpu_with(&options) else {
            return;
        };
        let status = gpu.pipeline_cache_status();
        assert_eq!(status.loaded_bytes, 0, "{status:?}");
        let t = Instant::now();
        Pipeline::new(&gpu, &words, "main", 2, 4).expect("pipeline");
        let cold = t.elapsed();
        let path = gpu
            .save_pipeline_cache()
            .expect("save")
            .expect("a cache file");
        assert!(path.starts_with(&dir));
        let len = std::fs::metadata(&path)
            .expect("the cache file exists")
            .len();
        // At least the header; lavapipe (Mesa 22) keeps no pipelines in it, so a
        // header may be all there is.
        assert!(
            len >= 32,
            "the cache file holds {len} bytes, less than a header"
        );
        println!("pipeline cache file: {len} bytes");
        (path, len, cold)
    };
    // A second instance and device (as a second process would) loads it.
    let Some(gpu) = common::gpu_with(&options) else {
        return;
    };
    let status = gpu.pipeline_cache_status();
    assert_eq!(status.path.as_deref(), Some(first.0.as_path()));
    assert!(status.warning.is_none(), "{status:?}");
    assert_eq!(
        status.loaded_bytes as u64, first.1,
        "the whole file was handed to the driver"
    );
    let t = Instant::now();
    Pipeline::new(&gpu, &words, "main", 2, 4).expect("pipeline");
    println!(
        "pipeline build: cold {:?}, from the cache {:?}",
        first.2,
        t.elapsed()
    );
    drop(gpu);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_cache_file_is_ignored_with_a_warning() {
    let dir = common::temp_dir("damaged");
    let options = OpenOptions {
        cache: CacheLocation::Dir(dir.clone()),
        ..OpenOptions::default()
    };
    // Learn the file name, then damage it three ways.
    let path = {
        let Some(gpu) = common::gpu_with(&options) else {
            return;
        };
        gpu.save_pipeline_cache()
            .expect("save")
            .expect("a cache file")
    };
    let good = std::fs::read(&path).expect("read the cache");
    let mut wrong_uuid = good.clone();
    wrong_uuid[20] ^= 0xff;
    let mut random_tail = good.clone();
    random_tail.extend((0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 7) as u8));
    for (what, data) in [
        ("short", vec![1u8, 2, 3]),
        ("wrong uuid", wrong_uuid),
        ("random tail", random_tail),
    ] {
        std::fs::write(&path, &data).expect("write");
        let Some(gpu) = common::gpu_with(&options) else {
            return;
        };
        let status = gpu.pipeline_cache_status();
        if what != "random tail" {
            assert!(
                status.warning.is_some() && status.loaded_bytes == 0,
                "{what}: {status:?}"
            );
        }
        // Whatever the driver made of it, pipelines still build.
        let words = compile_wgsl(SAXPY, "main").expect("compile");
        Pipeline::new(&gpu, &words, "main", 2, 4).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A graph variant dispatch recorded once reads new parameters after
/// `ParamBlock::write` and, where set 0 is update-after-bind, new buffers
/// after `GraphSets::write`, with no second recording.
#[test]
fn graph_variant_reads_parameters_and_buffers_changed_after_recording() {
    let Some(gpu) = common::gpu() else { return };
    graph_variant(&gpu);
    // Set 0 from the recorder's pools rather than pushed (a device without
    // VK_KHR_push_descriptor or update-after-bind).
    let Some(gpu) = common::gpu_with(&OpenOptions {
        disable_push_descriptors: true,
        cache: CacheLocation::Off,
        ..OpenOptions::default()
    }) else {
        return;
    };
    graph_variant(&gpu);
}

fn graph_variant(gpu: &Gpu) {
    let n = 256usize;
    let size = (n * 4) as u64;
    let words = compile_wgsl(SAXPY, "main").expect("compile");
    let pipeline = Pipeline::graph_variant(gpu, &words, "main", 2, 64).expect("pipeline");
    assert!(pipeline.is_graph_variant());
    assert_eq!(
        pipeline.rebinds_after_recording(),
        gpu.supports_update_after_bind()
    );
    let x = Chunk::new(gpu, size, MemoryUse::Upload).expect("x");
    let y = [
        Chunk::new(gpu, size, MemoryUse::Readback).expect("y0"),
        Chunk::new(gpu, size, MemoryUse::Readback).expect("y1"),
    ];
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    x.write(0, &bytes(&xs)).expect("write x");
    for c in &y {
        c.write(0, &bytes(&vec![1.0; n])).expect("write y");
    }
    let sets = hetero_vulkan::GraphSets::new(gpu);
    let params = hetero_vulkan::ParamBlock::new(gpu, 2, 64).expect("params");
    params.write(1, &2.0f32.to_le_bytes()).expect("a = 2");
    let mut r = gpu.recorder(Lane::Compute).expect("recorder");
    let set = r
        .dispatch_bound(
            &pipeline,
            Some(&sets),
            &[(&x, 0, size), (&y[0], 0, size)],
            &params,
            1,
            [(n as u32).div_ceil(64), 1, 1],
        )
        .expect("dispatch");
    assert_eq!(set.is_some(), pipeline.rebinds_after_recording());
    let cmd = r.finish().expect("finish");
    let done = Timeline::new(gpu, 0).expect("timeline");
    let run = |value: u64| {
        gpu.submit(Lane::Compute, &[&cmd], &[], &[(&done, value)])
            .expect("submit");
        done.wait(value, Duration::from_secs(60)).expect("wait");
    };
    let read = |c: &Chunk| {
        let mut out = vec![0u8; size as usize];
        c.read(0, &mut out).expect("read");
        f32s(&out)
    };
    run(1);
    assert_eq!(read(&y[0])[10], 21.0);
    // New parameters: the same command buffer.
    params.write(1, &3.0f32.to_le_bytes()).expect("a = 3");
    run(2);
    assert_eq!(read(&y[0])[10], 51.0);
    let Some(set) = set else {
        eprintln!("rebinding skipped: the device has no storage-buffer update-after-bind");
        return;
    };
    sets.write(set, &pipeline, &[(&x, 0, size), (&y[1], 0, size)])
        .expect("rebind y");
    run(3);
    assert_eq!(read(&y[1])[10], 31.0);
    assert_eq!(read(&y[0])[10], 51.0, "the old destination is left alone");
    assert_eq!(sets.len(), 1);
}
