//! Chunks: memory types per use, round trips through the device, fills, OOM,
//! zero sizes, host-memory import.

mod common;

use std::time::Duration;

use hetero_vulkan::{vk, Chunk, Gpu, Lane, MemoryUse, Timeline, VkError};

fn run(gpu: &Gpu, lane: Lane, record: impl FnOnce(&mut hetero_vulkan::Recorder)) {
    let mut r = gpu.recorder(lane).expect("recorder");
    record(&mut r);
    let cmd = r.finish().expect("finish");
    let done = Timeline::new(gpu, 0).expect("timeline");
    gpu.submit(lane, &[&cmd], &[], &[(&done, 1)])
        .expect("submit");
    done.wait(1, Duration::from_secs(60)).expect("wait");
}

#[test]
fn memory_types_fit_their_use() {
    let Some(gpu) = common::gpu() else { return };
    for use_ in [
        MemoryUse::DeviceLocal,
        MemoryUse::Upload,
        MemoryUse::Readback,
    ] {
        let c = Chunk::new(&gpu, 4096, use_).expect("chunk");
        let f = c.memory_flags();
        match use_ {
            MemoryUse::DeviceLocal => {}
            MemoryUse::Upload => {
                assert!(f.contains(
                    vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT
                ));
                assert!(c.mapped().is_some());
            }
            MemoryUse::Readback => {
                assert!(f.contains(vk::MemoryPropertyFlags::HOST_VISIBLE));
                assert!(c.mapped().is_some());
            }
        }
        if gpu.info().features.buffer_device_address {
            assert!(c.device_address().is_some_and(|a| a != 0));
        }
    }
}

#[test]
fn a_64_mib_pattern_round_trips_upload_device_readback() {
    let Some(gpu) = common::gpu() else { return };
    const N: u64 = 64 << 20;
    let up = Chunk::new(&gpu, N, MemoryUse::Upload).expect("upload");
    let dev = Chunk::new(&gpu, N, MemoryUse::DeviceLocal).expect("device");
    let down = Chunk::new(&gpu, N, MemoryUse::Readback).expect("readback");
    let pattern: Vec<u8> = (0..N)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    up.write(0, &pattern).expect("write");
    // Upload on the transfer lane, readback on the compute lane, ordered by a timeline.
    let mut r1 = gpu.recorder(Lane::Transfer).expect("recorder");
    r1.copy(&up, 0, &dev, 0, N).expect("copy up");
    let c1 = r1.finish().expect("finish");
    let mut r2 = gpu.recorder(Lane::Compute).expect("recorder");
    r2.copy(&dev, 0, &down, 0, N).expect("copy down");
    let c2 = r2.finish().expect("finish");
    let t = Timeline::new(&gpu, 0).expect("timeline");
    gpu.submit(Lane::Transfer, &[&c1], &[], &[(&t, 1)])
        .expect("submit");
    gpu.submit(Lane::Compute, &[&c2], &[(&t, 1)], &[(&t, 2)])
        .expect("submit");
    t.wait(2, Duration::from_secs(60)).expect("wait");
    let mut out = vec![0u8; N as usize];
    down.read(0, &mut out).expect("read");
    assert!(out == pattern, "the 64 MiB pattern came back different");
}

#[test]
fn fill_writes_the_word_over_the_range_only() {
    let Some(gpu) = common::gpu() else { return };
    let c = Chunk::new(&gpu, 1024, MemoryUse::Readback).expect("chunk");
    run(&gpu, Lane::Transfer, |r| {
        r.fill(&c, 0, 1024, 0).expect("fill");
        r.fill(&c, 64, 256, 0xdead_beef).expect("fill");
    });
    let mut out = vec![0u8; 1024];
    c.read(0, &mut out).expect("read");
    for (i, w) in out.chunks_exact(4).enumerate() {
        let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        let want = if (16..80).contains(&i) {
            0xdead_beef
        } else {
            0
        };
        assert_eq!(v, want, "word {i}");
    }
    let mut r = gpu.recorder(Lane::Transfer).expect("recorder");
    assert!(matches!(
        r.fill(&c, 2, 8, 1),
        Err(VkError::InvalidArgument(_))
    ));
    assert!(matches!(
        r.fill(&c, 1020, 8, 1),
        Err(VkError::OutOfBounds { .. })
    ));
}

#[test]
fn zero_sizes_are_no_ops_or_typed_errors() {
    let Some(gpu) = common::gpu() else { return };
    // Chunks of 0 bytes do not exist in Vulkan: a typed error.
    assert!(matches!(
        Chunk::new(&gpu, 0, MemoryUse::Upload),
        Err(VkError::InvalidArgument(_))
    ));
    let a = Chunk::new(&gpu, 256, MemoryUse::Readback).expect("chunk");
    a.write(0, &[7u8; 256]).expect("write");
    let b = Chunk::new(&gpu, 256, MemoryUse::Readback).expect("chunk");
    b.write(0, &[9u8; 256]).expect("write");
    // Zero-length copies and fills record nothing, even at the end of a chunk.
    run(&gpu, Lane::Compute, |r| {
        r.copy(&a, 0, &b, 0, 0).expect("zero copy");
        r.copy(&a, 256, &b, 256, 0).expect("zero copy at the end");
        r.fill(&b, 0, 0, 1).expect("zero fill");
    });
    let mut out = [0u8; 256];
    b.read(0, &mut out).expect("read");
    assert_eq!(out, [9u8; 256]);
    // ... but out of bounds stays an error.
    let mut r = gpu.recorder(Lane::Compute).expect("recorder");
    assert!(matches!(
        r.copy(&a, 257, &b, 0, 0),
        Err(VkError::OutOfBounds { .. })
    ));
    assert!(
        matches!(r.copy(&a, 0, &a, 8, 16), Err(VkError::InvalidArgument(_))),
        "overlap"
    );
}

#[test]
fn asking_for_more_than_the_heap_is_a_typed_oom() {
    let Some(gpu) = common::gpu() else { return };
    let largest = gpu
        .info()
        .memory_heaps
        .iter()
        .map(|h| h.size)
        .max()
        .expect("a heap");
    let ask = largest.saturating_mul(2);
    match Chunk::new(&gpu, ask, MemoryUse::DeviceLocal) {
        Err(e @ VkError::OutOfMemory { .. }) => {
            let VkError::OutOfMemory {
                requested,
                heap_size,
                ..
            } = e
            else {
                unreachable!()
            };
            assert_eq!(requested, ask);
            assert!(heap_size > 0 && heap_size < ask);
            let msg = e.to_string();
            assert!(
                msg.contains(&ask.to_string()) && msg.contains(&heap_size.to_string()),
                "{msg}"
            );
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // The device still works afterwards.
    Chunk::new(&gpu, 4096, MemoryUse::Upload).expect("small chunk after OOM");
}

#[test]
fn non_host_visible_access_and_bounds_are_typed_errors() {
    let Some(gpu) = common::gpu() else { return };
    let c = Chunk::new(&gpu, 64, MemoryUse::Upload).expect("chunk");
    assert!(matches!(
        c.write(60, &[0u8; 8]),
        Err(VkError::OutOfBounds { .. })
    ));
    assert!(matches!(
        c.read(u64::MAX, &mut [0u8; 1]),
        Err(VkError::OutOfBounds { .. })
    ));
}

#[test]
fn imported_host_memory_is_read_and_written_in_place() {
    let Some(gpu) = common::gpu() else { return };
    let Some(align) = gpu.info().limits.min_imported_host_pointer_alignment else {
        eprintln!("skipping: no VK_EXT_external_memory_host");
        return;
    };
    let len = (64 * 1024u64).div_ceil(align) * align;
    let layout = std::alloc::Layout::from_size_align(len as usize, align as usize).expect("layout");
    // SAFETY: the layout has a non-zero size.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    let ptr = std::ptr::NonNull::new(raw).expect("allocation");
    {
        // SAFETY: the allocation outlives the chunk and the command buffers (all dropped
        // at the end of this block, after the work completed); the host touches it only
        // through the chunk, while the device is idle.
        let host = unsafe { Chunk::import_host(&gpu, ptr, len) }.expect("import");
        let src = Chunk::new(&gpu, len, MemoryUse::Upload).expect("upload");
        src.write(0, &vec![0x5a; len as usize]).expect("write");
        run(&gpu, Lane::Compute, |r| {
            r.copy(&src, 0, &host, 0, len)
                .expect("copy into host memory");
            r.fill(&host, 0, 16, 0x0101_0101).expect("fill");
        });
        let mut out = vec![0u8; len as usize];
        host.read(0, &mut out).expect("read");
        assert!(out[..16].iter().all(|&b| b == 1) && out[16..].iter().all(|&b| b == 0x5a));
        // Misaligned pointers are refused.
        // SAFETY: refused before any Vulkan call.
        let bad = unsafe { Chunk::import_host(&gpu, ptr.add(1), align) };
        assert!(matches!(bad, Err(VkError::InvalidArgument(_))));
        drop(host);
        gpu.wait_idle().expect("idle");
    }
    // Release what the submission kept (the chunk) before freeing the memory.
    drop(gpu);
    // SAFETY: allocated above with this layout; nothing refers to it any more.
    unsafe { std::alloc::dealloc(raw, layout) };
    // Contents as the device left them were checked above.
}
