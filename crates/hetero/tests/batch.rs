//! Copy batches, coalescing and the inline path, on every backend: a batch equals
//! the same copies one by one, bad input is a typed error, and the emulated
//! device's model charges a batch one setup (virtual time, deterministic).

mod common;

use hetero::{Coalescing, CopyBatch, CopyKind, Device, DeviceConfig, EmuConfig, Error, LinkPreset};
use proptest::prelude::*;

/// One copy: (kind, source buffer, source offset, destination buffer, destination
/// offset, length), offsets and lengths in elements.
type Seg = (u8, usize, usize, usize, usize, usize);

const BUF: usize = 512;
const BUFS: usize = 3;

fn seg() -> impl Strategy<Value = Seg> {
    (0u8..3, 0..BUFS, 0..BUF, 0..BUFS, 0..BUF, 0usize..64).prop_map(|(k, a, so, b, d, n)| {
        let n = n.min(BUF - so).min(BUF - d);
        // A D2D copy needs two buffers.
        let b = if k == 2 && a == b { (b + 1) % BUFS } else { b };
        (k, a, so, b, d, n)
    })
}

/// Runs `segs` (grouped into batches of one direction where `batched`) and returns
/// the device buffers and the pinned buffers after.
fn run(dev: &Device, segs: &[Seg], batched: bool) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let s = dev.create_stream().expect("stream");
    let mut pinned: Vec<_> = (0..BUFS)
        .map(|i| {
            let v: Vec<u32> = (0..BUF as u32).map(|x| x * 10 + i as u32).collect();
            dev.pinned_from_slice(&v).expect("pinned")
        })
        .collect();
    let device: Vec<_> = (0..BUFS)
        .map(|i| {
            let d = dev.alloc::<u32>(BUF).expect("alloc");
            s.fill(&d, 7000 + i as u32).expect("fill");
            d
        })
        .collect();
    let mut batch: Option<CopyBatch> = None;
    for &(k, a, so, b, d, n) in segs {
        let kind = [CopyKind::H2D, CopyKind::D2H, CopyKind::D2D][k as usize];
        if !batched {
            match kind {
                CopyKind::H2D => s.copy_h2d_range(&pinned[a], so, &device[b], d, n),
                CopyKind::D2H => s.copy_d2h_range(&device[a], so, &mut pinned[b], d, n),
                CopyKind::D2D => s.copy_d2d_range(&device[a], so, &device[b], d, n),
            }
            .expect("copy");
            continue;
        }
        if batch.as_ref().is_some_and(|bt| bt.kind() != kind) {
            s.copy_batch(batch.take().expect("batch")).expect("submit");
        }
        let bt = batch.get_or_insert_with(|| CopyBatch::new(kind));
        let added = match kind {
            CopyKind::H2D => bt.h2d(&pinned[a], so, &device[b], d, n).map(drop),
            CopyKind::D2H => bt.d2h(&device[a], so, &mut pinned[b], d, n).map(drop),
            CopyKind::D2D => bt.d2d(&device[a], so, &device[b], d, n).map(drop),
        };
        if let Err(Error::Aliasing { .. }) = added {
            // A batch reads or writes a buffer, not both: start a new one.
            s.copy_batch(batch.take().expect("batch")).expect("submit");
            let mut bt = CopyBatch::new(kind);
            match kind {
                CopyKind::H2D => bt.h2d(&pinned[a], so, &device[b], d, n).map(drop),
                CopyKind::D2H => bt.d2h(&device[a], so, &mut pinned[b], d, n).map(drop),
                CopyKind::D2D => bt.d2d(&device[a], so, &device[b], d, n).map(drop),
            }
            .expect("fresh batch");
            batch = Some(bt);
        } else {
            added.expect("add");
        }
    }
    if let Some(bt) = batch {
        s.copy_batch(bt).expect("submit");
    }
    s.synchronize().expect("sync");
    let dv = device
        .iter()
        .map(|d| s.read_to_vec(d).expect("read"))
        .collect();
    let pv = pinned
        .iter()
        .map(|p| p.as_slice().expect("pinned").to_vec())
        .collect();
    (dv, pv)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_batches_equal_the_same_copies_one_by_one(
        segs in proptest::collection::vec(seg(), 1..40),
    ) {
        let dev = common::device();
        let one_by_one = run(&dev, &segs, false);
        let batched = run(&dev, &segs, true);
        prop_assert_eq!(batched, one_by_one);
    }

    #[test]
    fn coalesced_copies_equal_the_same_copies_alone(
        segs in proptest::collection::vec(seg(), 1..40),
    ) {
        let dev = common::device();
        let plain = run(&dev, &segs, false);
        let coalesced = run_coalescing(&dev, &segs);
        prop_assert_eq!(coalesced, plain);
    }
}

/// `run` one by one on a stream that coalesces.
fn run_coalescing(dev: &Device, segs: &[Seg]) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let s = dev.create_stream().expect("stream");
    s.set_coalescing(Some(Coalescing {
        max_bytes: 128,
        window: 5,
    }))
    .expect("on");
    let mut pinned: Vec<_> = (0..BUFS)
        .map(|i| {
            let v: Vec<u32> = (0..BUF as u32).map(|x| x * 10 + i as u32).collect();
            dev.pinned_from_slice(&v).expect("pinned")
        })
        .collect();
    let device: Vec<_> = (0..BUFS)
        .map(|i| {
            let d = dev.alloc::<u32>(BUF).expect("alloc");
            s.fill(&d, 7000 + i as u32).expect("fill");
            d
        })
        .collect();
    for &(k, a, so, b, d, n) in segs {
        match k {
            0 => s.copy_h2d_range(&pinned[a], so, &device[b], d, n),
            1 => s.copy_d2h_range(&device[a], so, &mut pinned[b], d, n),
            _ => s.copy_d2d_range(&device[a], so, &device[b], d, n),
        }
        .expect("copy");
    }
    s.synchronize().expect("sync");
    let dv = device
        .iter()
        .map(|d| s.read_to_vec(d).expect("read"))
        .collect();
    let pv = pinned
        .iter()
        .map(|p| p.as_slice().expect("pinned").to_vec())
        .collect();
    (dv, pv)
}

#[test]
fn bad_batches_are_typed_errors() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let h = dev.alloc_pinned::<u8>(64).expect("pinned");
    let d = dev.alloc::<u8>(64).expect("d");
    let e = dev.alloc::<u8>(64).expect("e");
    let mut b = CopyBatch::new(CopyKind::H2D);
    assert!(matches!(
        b.h2d(&h, 60, &d, 0, 8),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        b.d2d(&d, 0, &e, 0, 8),
        Err(Error::InvalidArgument(_))
    ));
    let mut b = CopyBatch::new(CopyKind::D2D);
    b.d2d(&d, 0, &e, 0, 8).expect("d -> e");
    assert!(
        matches!(b.d2d(&e, 0, &d, 8, 8), Err(Error::Aliasing { .. })),
        "e is written by the batch, so it cannot be read by it"
    );
    assert!(matches!(
        b.d2d(&d, 0, &d, 8, 8),
        Err(Error::Aliasing { .. })
    ));
    let other = Device::host().expect("other device");
    let x = other.alloc::<u8>(64).expect("x");
    let mut b = CopyBatch::new(CopyKind::D2D);
    b.d2d(&x, 0, &d, 0, 8).expect("added");
    assert!(matches!(s.copy_batch(b), Err(Error::WrongDevice { .. })));
    s.copy_batch(CopyBatch::new(CopyKind::H2D))
        .expect("an empty batch submits nothing");
    assert!(matches!(
        s.set_coalescing(Some(Coalescing {
            max_bytes: 0,
            window: 4
        })),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn a_pinned_destination_is_busy_until_the_batch_completes() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let d = dev.alloc::<u8>(64).expect("d");
    s.fill(&d, 5).expect("fill");
    let mut h = dev.alloc_pinned::<u8>(64).expect("pinned");
    let gate = common::Gate::hold(&s);
    let mut b = CopyBatch::new(CopyKind::D2H);
    b.d2h(&d, 0, &mut h, 0, 64).expect("add");
    s.copy_batch(b).expect("submit");
    assert!(matches!(h.as_slice(), Err(Error::BufferBusy { .. })));
    gate.open();
    s.synchronize().expect("sync");
    assert_eq!(h.as_slice().expect("done"), &[5u8; 64][..]);
}

fn emu(cfg: EmuConfig) -> Device {
    Device::new(DeviceConfig::default().emu(cfg.capacity(1 << 30))).expect("emu")
}

#[test]
fn on_emu_a_batch_pays_one_setup_and_coalescing_merges_small_copies() {
    let link = LinkPreset::pcie4x16();
    let dev = emu(EmuConfig::new(link.clone()));
    let n = 64;
    let piece = 8 << 10;
    let h = dev.alloc_pinned::<u8>(n * piece).expect("pinned");
    let d = dev.alloc::<u8>(n * piece).expect("d");
    let batch = common::modelled(&dev, |s| {
        let mut b = CopyBatch::new(CopyKind::H2D);
        for i in 0..n {
            b.h2d(&h, i * piece, &d, (n - 1 - i) * piece, piece)
                .expect("add");
        }
        s.copy_batch(b).expect("batch");
    });
    let per_call = common::modelled(&dev, |s| {
        for i in 0..n {
            s.copy_h2d_range(&h, i * piece, &d, (n - 1 - i) * piece, piece)
                .expect("copy");
        }
    });
    let one = common::modelled(&dev, |s| s.copy_h2d(&h, &d).expect("one copy"));
    assert!(
        per_call as f64 > 1.5 * batch as f64,
        "{n} copies one by one: {per_call} ns, one batch: {batch} ns"
    );
    assert!(
        (batch as f64) < 1.2 * one as f64,
        "batch {batch} ns, one copy of the same bytes {one} ns"
    );
    let coalesced = common::modelled(&dev, |s| {
        s.set_coalescing(Some(Coalescing::default())).expect("on");
        for i in 0..n {
            s.copy_h2d_range(&h, i * piece, &d, (n - 1 - i) * piece, piece)
                .expect("copy");
        }
    });
    assert!(
        (coalesced as f64) < 0.5 * per_call as f64,
        "coalesced {coalesced} ns, one by one {per_call} ns"
    );
    // An event between two copies ends the run: each pays its setup.
    let split = common::modelled(&dev, |s| {
        s.set_coalescing(Some(Coalescing::default())).expect("on");
        s.copy_h2d_range(&h, 0, &d, 0, piece).expect("a");
        s.record_event().expect("event");
        s.copy_h2d_range(&h, piece, &d, piece, piece).expect("b");
    });
    assert!(split >= 2 * link.setup_ns, "{split} ns");
}

#[test]
fn tiny_h2d_copies_go_inline_on_emu_and_read_the_source_at_submit() {
    let link = LinkPreset::pcie4x16();
    let dev = emu(EmuConfig::new(link.clone()));
    let mut h = dev.pinned_from_slice(&[1u8; 1024]).expect("pinned");
    let d = dev.alloc::<u8>(1024).expect("d");
    let s = dev.create_stream().expect("stream");
    s.synchronize().expect("idle");
    let t0 = dev.now_ns();
    s.copy_h2d(&h, &d).expect("inline copy");
    // The command carries the bytes: the source is free again at once.
    h.as_mut_slice().expect("not held by the copy").fill(2);
    s.synchronize().expect("sync");
    assert!(
        dev.now_ns() - t0 < link.setup_ns,
        "no DMA setup on the inline path"
    );
    assert_eq!(s.read_to_vec(&d).expect("read"), vec![1u8; 1024]);
    // A source a queued op still writes is read when the copy runs, not now.
    let src = dev.alloc::<u8>(1024).expect("src");
    s.fill(&src, 9).expect("fill");
    s.copy_d2h(&src, &mut h).expect("d2h into the source");
    s.copy_h2d(&h, &d).expect("not inline");
    s.synchronize().expect("sync");
    assert_eq!(s.read_to_vec(&d).expect("read"), vec![9u8; 1024]);
    // Off, every copy pays its setup.
    let dev = emu(EmuConfig::new(link.clone()).inline_copy_max(0));
    let h = dev.pinned_from_slice(&[1u8; 1024]).expect("pinned");
    let d = dev.alloc::<u8>(1024).expect("d");
    let t = common::modelled(&dev, |s| s.copy_h2d(&h, &d).expect("dma"));
    assert!(t >= link.setup_ns, "{t}");
}
