//! Pitched 2-D memory and 2-D copies, on every backend: random layouts and
//! rectangles checked byte for byte against a reference, bad input as typed
//! errors, kernels reading and writing by rows; on the emulated device a 2-D copy
//! is one transfer (virtual time, deterministic).

mod common;

use hetero::{
    Arg, Device, DeviceConfig, EmuConfig, Error, Grid, Kernel, LinkPreset, Region2D, RegionProblem,
};
use proptest::prelude::*;

/// A reference 2-D copy of bytes.
fn reference(src: &[u8], s: Region2D, dst: &mut [u8], d: Region2D) {
    for y in 0..s.height {
        let (a, b) = (s.offset + y * s.pitch, d.offset + y * d.pitch);
        dst[b..b + s.width].copy_from_slice(&src[a..a + s.width]);
    }
}

#[derive(Debug, Clone)]
struct Case {
    align_log: u32,
    width: usize,
    height: usize,
    /// Sub-rectangle: x, y, w, h (clamped into the image).
    sub: (usize, usize, usize, usize),
    /// Host-side pitch slack (0: flat rows).
    host_slack: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0u32..9,
        1usize..70,
        1usize..24,
        (0usize..70, 0usize..24, 1usize..70, 1usize..24),
        prop_oneof![Just(0usize), 1usize..9],
    )
        .prop_map(|(align_log, width, height, (x, y, w, h), host_slack)| {
            let x = x % width;
            let y = y % height;
            let w = w.min(width - x).max(1);
            let h = h.min(height - y).max(1);
            Case {
                align_log,
                width,
                height,
                sub: (x, y, w, h),
                host_slack,
            }
        })
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let dev = common::device_with(|cfg| cfg.pitch_alignment(1 << c.align_log));
    let s = dev.create_stream().expect("stream");
    let img = dev.alloc_pitched::<u8>(c.width, c.height).expect("pitched");
    prop_assert_eq!(img.pitch_bytes() % (1 << c.align_log), 0);
    prop_assert!(img.pitch() >= c.width && img.rows() % 2 == 0 && img.rows() >= c.height);
    let other = dev
        .alloc_pitched::<u8>(c.width + 3, c.height)
        .expect("second");
    s.fill(&img, 0xAA).expect("fill");
    s.fill(&other, 0xBB).expect("fill");
    // The host image: rows of `width + slack` bytes.
    let hp = c.width + c.host_slack;
    let host_r = Region2D::new(0, hp, c.width, c.height);
    let bytes: Vec<u8> = (0..hp * c.height).map(|i| (i * 31 + 7) as u8).collect();
    let src = dev.pinned_from_slice(&bytes).expect("pinned");
    // Reference device images.
    let mut ref_img = vec![0xAAu8; img.len()];
    let mut ref_other = vec![0xBBu8; other.len()];
    // 1. The whole host image into the pitched image.
    s.copy_2d_h2d(&src, host_r, &img, img.region())
        .expect("h2d");
    reference(&bytes, host_r, &mut ref_img, img.region());
    // 2. A sub-rectangle of it into the other pitched image, one column right.
    let (x, y, w, h) = c.sub;
    let from = img.rect(x, y, w, h).expect("inside");
    let to = other.rect(x + 1, y, w, h).expect("inside");
    s.copy_2d_d2d(&img, from, &other, to).expect("d2d");
    let snapshot = ref_img.clone();
    reference(&snapshot, from, &mut ref_other, to);
    // 3. That rectangle out to a flat host buffer, and the other image whole.
    let mut flat = dev.pinned_from_slice(&vec![0u8; w * h]).expect("flat");
    s.copy_2d_d2h(&other, to, &mut flat, Region2D::flat(w, h))
        .expect("d2h flat");
    let mut whole = dev.alloc_pinned::<u8>(other.len()).expect("whole");
    s.copy_d2h(&other, &mut whole).expect("d2h whole");
    s.synchronize().expect("sync");
    let mut ref_flat = vec![0u8; w * h];
    reference(&ref_other, to, &mut ref_flat, Region2D::flat(w, h));
    prop_assert_eq!(flat.as_slice().expect("flat"), &ref_flat[..]);
    prop_assert_eq!(whole.as_slice().expect("whole"), &ref_other[..]);
    prop_assert_eq!(s.read_to_vec(&img).expect("img"), ref_img);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_pitched_layouts_and_rectangles_match_a_reference(c in case()) {
        run_case(&c)?;
    }
}

fn problem(r: hetero::Result<()>) -> RegionProblem {
    match r {
        Err(Error::Region { problem, .. }) => problem,
        other => panic!("expected a region error, got {other:?}"),
    }
}

#[test]
fn bad_regions_are_typed_errors() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let img = dev.alloc_pitched::<u32>(10, 5).expect("pitched");
    assert_eq!(img.pitch_bytes(), 48, "40 bytes rounded to 16");
    assert_eq!(img.rows(), 6, "5 rows rounded to 2");
    let h = dev.alloc_pinned::<u32>(50).expect("pinned");
    let flat = Region2D::flat(10, 5);
    assert!(matches!(
        problem(s.copy_2d_h2d(&h, Region2D::flat(0, 5), &img, img.region().sub(0, 0, 0, 5))),
        RegionProblem::Empty { .. }
    ));
    assert!(matches!(
        problem(img.rect(0, 0, 0, 5).map(drop)),
        RegionProblem::Empty { .. }
    ));
    assert!(matches!(
        problem(img.rect(5, 0, 10, 5).map(drop)),
        RegionProblem::OutsideImage { .. }
    ));
    assert!(matches!(
        problem(s.copy_2d_h2d(&h, Region2D::new(0, 9, 10, 5), &img, img.region())),
        RegionProblem::PitchBelowWidth {
            pitch: 9,
            width: 10
        }
    ));
    assert!(matches!(
        problem(s.copy_2d_h2d(&h, flat, &img, img.region().sub(5, 2, 10, 5))),
        RegionProblem::OutOfBounds { .. }
    ));
    assert!(matches!(
        problem(s.copy_2d_h2d(
            &h,
            Region2D::flat(10, 6),
            &img,
            img.region().sub(0, 1, 10, 6)
        )),
        RegionProblem::OutOfBounds { .. }
    ));
    assert!(matches!(
        problem(s.copy_2d_h2d(&h, Region2D::flat(5, 5), &img, img.region())),
        RegionProblem::ShapeMismatch { .. }
    ));
    assert!(matches!(
        problem(dev.alloc_pitched::<u8>(0, 4).map(drop)),
        RegionProblem::Empty { .. }
    ));
    let buf = dev.alloc::<u8>(100 * 4).expect("buf");
    assert!(matches!(
        problem(dev.pitched_from(buf, 90, 4, 100).map(drop)),
        RegionProblem::Unaligned {
            pitch_bytes: 100,
            alignment: 16
        }
    ));
    let buf = dev.alloc::<u8>(112 * 4).expect("buf");
    let view = dev.pitched_from(buf, 100, 4, 112).expect("aligned pitch");
    assert_eq!(view.pitch(), 112);
    let other = Device::host().expect("other");
    let foreign = other.alloc::<u8>(64).expect("foreign");
    assert!(matches!(
        dev.pitched_from(foreign, 8, 4, 16),
        Err(Error::WrongDevice { .. })
    ));
    // Pitch alignments must be powers of two.
    assert!(Device::new(common::config().pitch_alignment(48)).is_err());
    assert!(Device::new(common::config().height_alignment(0)).is_err());
}

#[test]
fn kernels_read_and_write_pitched_buffers_by_rows() {
    if common::skipped("kernels_read_and_write_pitched_buffers_by_rows") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let (w, h) = (13usize, 11usize);
    let a = dev.alloc_pitched::<f32>(w, h).expect("a");
    let b = dev.alloc_pitched::<f32>(w, h).expect("b");
    let (la, lb) = (a.layout(), b.layout());
    let fill = Kernel::new("rows", move |blk| {
        let mut rows = blk.write_rows::<f32>(0, la);
        for y in rows.first_row()..rows.first_row() + rows.len() {
            for (x, v) in rows.row_mut(y).iter_mut().enumerate() {
                *v = (y * 100 + x) as f32;
            }
        }
    });
    // The WGSL twins index rows by the pitch themselves (the layout's, made
    // constants of the source): device code has no row views, so what they
    // check is that a pitched buffer binds with its padding and that the 2D
    // copy reads the rows where a kernel wrote them.
    let fill = fill.wgsl(
        format!(
            "@group(0) @binding(0) var<storage, read_write> a: array<f32>;\n{}\
             a[(i / {w}u) * {pa}u + i % {w}u] = f32((i / {w}u) * 100u + i % {w}u);\n}}}}\n",
            by_element(w * h),
            pa = la.pitch
        ),
        "main",
    );
    s.launch(&fill, Grid::new(4), &[Arg::write(&a)])
        .expect("fill rows");
    let double = Kernel::new("double", move |blk| {
        let src = blk.read_rows::<f32>(0, la);
        let mut out = blk.write_rows::<f32>(0, lb);
        for y in out.first_row()..out.first_row() + out.len() {
            for (o, i) in out.row_mut(y).iter_mut().zip(src.row(y)) {
                *o = 2.0 * i;
            }
        }
    });
    let double = double.wgsl(
        format!(
            "@group(0) @binding(0) var<storage, read> a: array<f32>;\n\
             @group(0) @binding(1) var<storage, read_write> b: array<f32>;\n{}\
             b[(i / {w}u) * {pb}u + i % {w}u] = 2.0 * a[(i / {w}u) * {pa}u + i % {w}u];\n}}}}\n",
            by_element(w * h),
            pa = la.pitch,
            pb = lb.pitch
        ),
        "main",
    );
    s.launch(&double, Grid::new(3), &[Arg::read(&a), Arg::write(&b)])
        .expect("double");
    let mut out = dev.alloc_pinned::<f32>(w * h).expect("out");
    s.copy_2d_d2h(&b, b.region(), &mut out, Region2D::flat(w, h))
        .expect("d2h");
    s.synchronize().expect("sync");
    let got = out.as_slice().expect("read");
    for y in 0..h {
        for x in 0..w {
            assert_eq!(got[y * w + x], 2.0 * (y * 100 + x) as f32, "({x}, {y})");
        }
    }
}

/// The opening of a WGSL kernel that takes `i` over `0..n` (a grid-stride
/// loop of workgroups of 64); the caller writes the loop's body and closes it
/// with `}}`.
fn by_element(n: usize) -> String {
    format!(
        "@compute @workgroup_size(64)\n\
         fn main(@builtin(global_invocation_id) id: vec3<u32>,\n\
                 @builtin(num_workgroups) groups: vec3<u32>) {{\n\
         for (var i = id.x; i < {n}u; i = i + groups.x * 64u) {{\n"
    )
}

#[test]
fn a_flat_buffer_written_by_rows_by_several_blocks_fails_the_stream() {
    if common::skipped("a_flat_buffer_written_by_rows_by_several_blocks_fails_the_stream") {
        return;
    }
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let (w, h) = (13usize, 11usize);
    let la = dev.alloc_pitched::<f32>(w, h).expect("a").layout();
    // A flat buffer written by several blocks is not split by rows.
    let flat = dev.alloc::<f32>(w * h).expect("flat");
    let bad = Kernel::new("bad", move |blk| {
        blk.write_rows::<f32>(0, la);
    });
    s.launch(&bad, Grid::new(3), &[Arg::write(&flat)])
        .expect("queued");
    let err = s.synchronize().expect_err("not split by rows");
    assert!(err.to_string().contains("rows"), "{err}");
}

#[test]
fn on_emu_a_two_d_copy_is_one_transfer_even_for_one_byte_rows() {
    let cfg = EmuConfig::new(LinkPreset::pcie4x16()).capacity(1 << 30);
    let dev = Device::new(DeviceConfig::default().pitch_alignment(1).emu(cfg)).expect("emu");
    let rows = 1 << 20;
    let img = dev.alloc_pitched::<u8>(1, rows).expect("1-byte rows");
    let odd = dev
        .pitched_from(dev.alloc::<u8>(3 * rows).expect("odd"), 1, rows, 3)
        .expect("pitch 3 with alignment 1");
    let host: Vec<u8> = (0..rows).map(|i| i as u8).collect();
    let src = dev.pinned_from_slice(&host).expect("pinned");
    let flat_dst = dev.alloc::<u8>(rows).expect("flat");
    let flat = common::modelled(&dev, |s| s.copy_h2d(&src, &flat_dst).expect("flat"));
    for dst in [&img, &odd] {
        let two_d = common::modelled(&dev, |s| {
            s.copy_2d_h2d(&src, Region2D::flat(1, rows), dst, dst.region())
                .expect("2-D")
        });
        assert!(
            (two_d as f64) <= 1.5 * flat as f64,
            "1 B x 1 M rows at pitch {}: {two_d} ns, flat {flat} ns",
            dst.pitch()
        );
    }
    let mut back = dev.alloc_pinned::<u8>(rows).expect("back");
    let s = dev.create_stream().expect("stream");
    s.copy_2d_d2h(&odd, odd.region(), &mut back, Region2D::flat(1, rows))
        .expect("d2h");
    s.synchronize().expect("sync");
    assert_eq!(back.as_slice().expect("read"), &host[..]);
}

#[test]
fn two_d_copies_record_into_graphs_and_replay() {
    let dev = common::device();
    let s = dev.create_stream().expect("stream");
    let (w, h) = (5usize, 6usize);
    let img = dev.alloc_pitched::<u16>(w, h).expect("pitched");
    let data: Vec<u16> = (0..(w * h) as u16).collect();
    let src = dev.pinned_from_slice(&data).expect("src");
    let mut out = dev.alloc_pinned::<u16>(2 * 3).expect("out");
    let cb = hetero::CommandBuffer::new(&dev).expect("command buffer");
    cb.copy_2d_h2d(&src, Region2D::flat(w, h), &img, img.region())
        .expect("record h2d");
    let rect = img.rect(1, 2, 2, 3).expect("inside");
    cb.copy_2d_d2h(&img, rect, &mut out, Region2D::flat(2, 3))
        .expect("record d2h");
    let exec = cb.finish().expect("instantiate");
    let want: Vec<u16> = (2..5)
        .flat_map(|y| (1..3).map(move |x| (y * w + x) as u16))
        .collect();
    for round in 0..2 {
        // The replay copies in and out again: clear both first.
        s.fill(&img, 0u16).expect("clear");
        s.fill_pinned(&mut out, 0u16).expect("clear out");
        s.launch_graph(&exec).expect("launch");
        s.synchronize().expect("sync");
        assert_eq!(out.as_slice().expect("out"), &want[..], "round {round}");
    }
}

/// A region of one row may give any pitch (it addresses no second row): its
/// copies run, `pitched_from` refuses a pitch whose bytes overflow, and a
/// sub-rectangle whose corner passes the address space is out of bounds. (A
/// debug build panicked on the overflowing multiplications.)
#[test]
fn a_one_row_region_with_a_huge_pitch_copies_or_is_refused_without_overflow() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let a = dev.alloc::<u32>(16).unwrap();
    let b = dev.alloc::<u32>(16).unwrap();
    s.fill(&a, 5u32).unwrap();
    s.fill(&b, 0u32).unwrap();
    let row = Region2D::new(0, usize::MAX, 4, 1);
    s.copy_2d_d2d(&a, row, &b, row).unwrap();
    let mut h = dev.alloc_pinned::<u32>(16).unwrap();
    s.copy_2d_d2h(&b, row, &mut h, row).unwrap();
    s.synchronize().unwrap();
    assert_eq!(&h.as_slice().unwrap()[..5], &[5, 5, 5, 5, 0]);
    let huge = dev.pitched_from(dev.alloc::<u32>(16).unwrap(), 4, 1, usize::MAX);
    assert!(matches!(huge, Err(Error::InvalidArgument(_))), "{huge:?}");
    let past = Region2D::new(0, 4, 4, 4).sub(usize::MAX, 3, 1, 1);
    assert!(matches!(
        s.copy_2d_d2d(&a, past, &b, past),
        Err(Error::Region { .. })
    ));
}
