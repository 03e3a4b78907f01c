//! What a DMA costs on the emulated device, op by op: the link time of copies,
//! copy batches, 2-D copies and inline writes, the device-side time of on-device
//! copies, and the IOMMU's translations (`iommu.rs`) of the host memory a
//! transfer reaches.
//!
//! - A copy over the link pays the link's setup latency once, then its bytes on
//!   the wire (`link.rs`); a batch is one descriptor chain: one setup, then every
//!   segment's bytes, plus `DESCRIPTOR_BYTES` per segment for the descriptors the
//!   engine fetches. A merged run of coalesced copies is a chain too.
//! - A 2-D copy is one strided descriptor: one setup, then the bytes. Its host
//!   side crosses the link as one run of packets when the rows there are back to
//!   back (a flat buffer), else as a run per row (each row's own packets). Its
//!   device side scatters or gathers rows in device memory in 32-byte sectors at
//!   the memory bandwidth, overlapped with the link: the copy takes the longer
//!   of the two, never a cost per row on the link.
//! - An inline write (a tiny H2D copy whose payload rode in the command) pays
//!   `INLINE_NS` instead of a setup: no descriptor, no DMA engine to program. The
//!   staging buffers of `write_slice` / `read_slice` are the driver's own, always
//!   mapped: they are not translated.
//! - Every host page a transfer touches is looked up in the I/O TLB; each miss
//!   stalls the engine `iotlb_miss_ns`. A transfer that reaches unmapped memory
//!   is refused before any byte moves.

use super::Shared;
use crate::config::link::{Dir, LinkPreset};
use crate::exec::op::{Body, CopyKind, Op};
use crate::exec::storage::Storage;
use crate::exec::transfer::ByteRegion;

/// Fixed cost of an on-device copy or fill, ns.
pub(crate) const D2D_SETUP_NS: u64 = 1_000;
/// An inline write: the doorbell's posted write and the command processor's
/// decode, ns (a DMA copy's setup also programs and completes a descriptor).
pub(crate) const INLINE_NS: u64 = 1_000;
/// The bytes of one DMA descriptor the engine fetches per batch segment.
pub(crate) const DESCRIPTOR_BYTES: u64 = 32;
/// Device memory is written and read in sectors of this many bytes.
const SECTOR: usize = 32;

/// How a started DMA runs: over the link (`dir`) or on the device (`fixed_ns`).
pub(crate) struct DmaPlan {
    pub(crate) dir: Option<Dir>,
    /// Before bytes flow: the setup latency plus translation stalls.
    pub(crate) setup_ns: u64,
    pub(crate) wire_bytes: f64,
    /// The transfer ends no earlier than this long after it starts.
    pub(crate) floor_ns: u64,
    /// For a flat copy over the link, a 2-D copy over the link or a fill of
    /// pinned memory: the host address the IOMMU translated its host side's
    /// first byte to (a 2-D copy's rows follow at its pitch), where the bytes
    /// move (`move_bytes`).
    pub(crate) host: Option<usize>,
    /// For a batch over the link: each segment's translated host address.
    pub(crate) segment_hosts: Vec<usize>,
}

impl DmaPlan {
    fn link(dir: Dir, setup_ns: u64, wire_bytes: f64) -> Self {
        DmaPlan {
            dir: Some(dir),
            setup_ns,
            wire_bytes,
            floor_ns: 0,
            host: None,
            segment_hosts: Vec::new(),
        }
    }

    fn device(ns: u64) -> Self {
        DmaPlan {
            dir: None,
            setup_ns: 0,
            wire_bytes: 0.0,
            floor_ns: ns,
            host: None,
            segment_hosts: Vec::new(),
        }
    }
}

fn dir_of(kind: CopyKind) -> Dir {
    if kind == CopyKind::D2H {
        Dir::D2H
    } else {
        Dir::H2D
    }
}

/// A copy between this device and another of its context (`Body::Copy`
/// whose storages are of two devices): `None` for any other op. Moves the
/// bytes now, from the source device's memory to the destination's (each
/// reached through its own device's `Reach`), and returns the direction on
/// this device's side of the peer link (out: `D2H`, in: `H2D`), the link's
/// lane the copy takes and the bytes on its wire; or the fault when the devices have no direct link.
pub(crate) fn peer_copy(
    sh: &Shared,
    op: &Op,
) -> Option<Result<(Dir, super::group::PeerWire, f64), String>> {
    let Body::Copy {
        src,
        src_off,
        dst,
        dst_off,
        bytes,
        ..
    } = &op.body
    else {
        return None;
    };
    if src.device == dst.device {
        return None;
    }
    let Some(group) = sh.group.get() else {
        return Some(Err(format!(
            "peer copy from device {} to device {}: this device is in no context with the \
             other; this is a bug in hetero (the stream checks it)",
            src.device, dst.device
        )));
    };
    let (Some(wire), Some(from), Some(to)) = (
        group.wire(src.device, dst.device),
        group.reach_of(src.device),
        group.reach_of(dst.device),
    ) else {
        return Some(Err(format!(
            "peer copy from device {} to device {}: no direct link between them; this is a \
             bug in hetero (the stream stages such copies)",
            src.device, dst.device
        )));
    };
    // SAFETY: both ranges were bounds-checked at enqueue and lie in memory of
    // two different devices (two arenas), kept alive by the op's storages.
    // The group's lock is held (whoever runs a model of the context holds it),
    // so no engine of either device touches either range meanwhile, and host
    // code reaches device memory only through ops these models run.
    unsafe {
        crate::exec::effects::copy_bytes(
            src.engine_ptr(from),
            *src_off,
            dst.engine_ptr(to),
            *dst_off,
            *bytes,
        )
    }
    let dir = if src.device == sh.device {
        Dir::D2H
    } else {
        Dir::H2D
    };
    let on_wire = wire.link.wire_bytes(*bytes as u64);
    Some(Ok((dir, wire, on_wire)))
}

/// Device-memory time of `height` rows of `width` bytes, ns.
fn rows_ns(link: &LinkPreset, width: usize, height: usize) -> u64 {
    let sectors = height as f64 * width.div_ceil(SECTOR) as f64 * SECTOR as f64;
    (sectors / link.memory_gbps).ceil() as u64
}

/// Translates `len` bytes at offset `off` of host memory `s` for `engine`:
/// the stall its TLB misses cost, ns, and the host address the I/O virtual
/// address leads to (where the bytes of a flat copy move: `move_bytes`).
fn translate(
    sh: &Shared,
    engine: (u8, u32),
    s: &Storage,
    off: usize,
    len: usize,
) -> Result<(u64, usize), String> {
    if len == 0 {
        return Ok((0, s.host_ptr() as usize + off));
    }
    let (counts, host) = sh
        .iommu
        .translate(engine, s.device_addr() + off as u64, len)?;
    if crate::exec::clock::profiling() {
        let kind = match engine.0 {
            0 => hetero_trace::EngineKind::CopyH2D,
            1 => hetero_trace::EngineKind::CopyD2H,
            _ => hetero_trace::EngineKind::CopyD2D,
        };
        hetero_trace::record_iotlb(kind, engine.1, counts.hits, counts.misses);
    }
    // The page table must lead to the buffer's own bytes: what batches and
    // 2-D copies move through the storage, and what a flat copy's translated
    // address must be (a wrong mapping is a fault, not a stray write).
    if host != s.host_ptr() as usize + off {
        return Err(format!(
            "IOMMU: I/O virtual address {:#x} translates to host {host:#x}, not to the \
             buffer's memory; this is a bug in the emulated device",
            s.device_addr() + off as u64
        ));
    }
    Ok((counts.misses * sh.emu.iotlb_miss_ns, host))
}

/// The data effect of a DMA that `plan` (or `joins_run`) translated: a copy
/// over the link (flat, 2-D, batched) moves between the device side's memory
/// and the host addresses the IOMMU gave (`host`, `segment_hosts`), a fill of
/// pinned memory writes there; an on-device op moves its bytes through
/// `effects::run`.
pub(crate) fn move_bytes(sh: &Shared, op: &Op, host: Option<usize>, segment_hosts: &[usize]) {
    let reach = sh.reach;
    match (&op.body, host) {
        (
            Body::Copy {
                kind,
                src,
                src_off,
                dst,
                dst_off,
                bytes,
                ..
            },
            Some(host),
        ) if *kind != CopyKind::D2D => {
            let (from, to) = if *kind == CopyKind::H2D {
                (
                    host as *const u8,
                    dst.engine_ptr(reach).wrapping_add(*dst_off),
                )
            } else {
                (
                    src.engine_ptr(reach).wrapping_add(*src_off) as *const u8,
                    host as *mut u8,
                )
            };
            // SAFETY: `host` is the IOMMU's translation of the pinned side's
            // range (checked to be that buffer's bytes), the device side is
            // this device's memory; both ranges were bounds-checked at
            // enqueue, the copy's access locks exclude every other access.
            unsafe { crate::exec::effects::copy_bytes(from, 0, to, 0, *bytes) }
        }
        (
            Body::Fill {
                bytes,
                pattern,
                pattern_len,
                ..
            },
            Some(host),
        ) => {
            // SAFETY: as above, for the fill's range of pinned memory under its
            // write lock.
            unsafe {
                crate::exec::effects::fill_bytes(
                    host as *mut u8,
                    0,
                    *bytes,
                    &pattern[..*pattern_len as usize],
                )
            }
        }
        (Body::Copy2D(c), Some(host)) if c.kind != CopyKind::D2D => {
            // The host side's base, from its first row's translation.
            let (src, dst) = if c.kind == CopyKind::H2D {
                (
                    (host as *const u8).wrapping_sub(c.src_r.offset),
                    c.dst.engine_ptr(reach),
                )
            } else {
                (
                    c.src.engine_ptr(reach) as *const u8,
                    (host as *mut u8).wrapping_sub(c.dst_r.offset),
                )
            };
            // SAFETY: every row of the host side was translated to that
            // buffer's bytes (`plan`), the device side is this device's
            // memory; the regions were bounds-checked at enqueue, have equal
            // shapes, and the copy's access locks exclude every other access.
            unsafe { crate::exec::effects::copy_rows(src, c.src_r, dst, c.dst_r) }
        }
        (Body::CopyBatch(b), _)
            if segment_hosts.len() == b.segs.len() && b.kind != CopyKind::D2D =>
        {
            for (g, &host) in b.segs.iter().zip(segment_hosts) {
                let (src, dst) = (&b.storages[g.src as usize].0, &b.storages[g.dst as usize].0);
                let (from, to) = if b.kind == CopyKind::H2D {
                    (
                        host as *const u8,
                        dst.engine_ptr(reach).wrapping_add(g.dst_off),
                    )
                } else {
                    (
                        src.engine_ptr(reach).wrapping_add(g.src_off) as *const u8,
                        host as *mut u8,
                    )
                };
                // SAFETY: as for a flat copy, per segment (each bounds-checked
                // when added; source and destination are different storages).
                unsafe { crate::exec::effects::copy_bytes(from, 0, to, 0, g.len) }
            }
        }
        _ => crate::exec::effects::run(&op.body, reach),
    }
}

/// Plans the DMA of `op` on copy engine `engine` ((direction, index)) and
/// translates what it reaches; `Err` (a DMA fault) before any byte moved.
/// `None` for ops that are not DMAs.
pub(crate) fn plan(sh: &Shared, engine: (u8, u32), op: &Op) -> Option<Result<DmaPlan, String>> {
    let link = &sh.emu.link;
    let d2d_ns = |bytes: f64| D2D_SETUP_NS + (bytes / link.d2d_gbps).ceil() as u64;
    let planned = match &op.body {
        Body::Copy {
            kind: kind @ (CopyKind::H2D | CopyKind::D2H),
            src,
            src_off,
            dst,
            dst_off,
            bytes,
            ..
        } => {
            let (host, off) = if *kind == CopyKind::H2D {
                (src, *src_off)
            } else {
                (dst, *dst_off)
            };
            translate(sh, engine, host, off, *bytes).map(|(stall, addr)| {
                let wire = link.wire_bytes(*bytes as u64);
                DmaPlan {
                    host: Some(addr),
                    ..DmaPlan::link(dir_of(*kind), link.setup_ns + stall, wire)
                }
            })
        }
        // A fill of pinned memory writes host memory: through the IOMMU.
        Body::Fill {
            dst, off, bytes, ..
        } if dst.kind == crate::MemoryKind::Pinned => {
            translate(sh, engine, dst, *off, *bytes).map(|(stall, addr)| DmaPlan {
                host: Some(addr),
                ..DmaPlan::device(d2d_ns(*bytes as f64) + stall)
            })
        }
        Body::Copy { bytes, .. } | Body::Fill { bytes, .. } => {
            Ok(DmaPlan::device(d2d_ns(*bytes as f64)))
        }
        Body::HostWrite { data, inline, .. } => {
            let setup = if *inline { INLINE_NS } else { link.setup_ns };
            Ok(DmaPlan::link(
                Dir::H2D,
                setup,
                link.wire_bytes(data.len() as u64),
            ))
        }
        Body::HostRead { .. } => Ok(DmaPlan::link(
            Dir::D2H,
            link.setup_ns,
            link.wire_bytes(op.bytes()),
        )),
        Body::CopyBatch(b) if b.kind == CopyKind::D2D => {
            Ok(DmaPlan::device(d2d_ns(b.bytes as f64)))
        }
        Body::CopyBatch(b) => {
            let mut stall = 0;
            let mut wire = (b.segs.len() as u64 * DESCRIPTOR_BYTES) as f64;
            let mut fault = None;
            let mut hosts = Vec::with_capacity(b.segs.len());
            for (s, off, len) in b.host_ranges() {
                match translate(sh, engine, s, off, len) {
                    Ok((ns, addr)) => {
                        stall += ns;
                        hosts.push(addr);
                    }
                    Err(e) => {
                        fault = Some(e);
                        break;
                    }
                }
                wire += link.wire_bytes(len as u64);
            }
            match fault {
                Some(e) => Err(e),
                None => Ok(DmaPlan {
                    segment_hosts: hosts,
                    ..DmaPlan::link(dir_of(b.kind), link.setup_ns + stall, wire)
                }),
            }
        }
        Body::Copy2D(c) => {
            let (w, h) = (c.src_r.width, c.src_r.height);
            if c.kind == CopyKind::D2D {
                Ok(copy2d_plan(link, c.kind, c.src_r, c.dst_r, 0))
            } else {
                let host = if c.kind == CopyKind::H2D {
                    &c.src
                } else {
                    &c.dst
                };
                let host_r = if c.kind == CopyKind::H2D {
                    c.src_r
                } else {
                    c.dst_r
                };
                // Each row's translation is checked to lead to the buffer's
                // own bytes, so rows follow the first at the region's pitch.
                let mut stall = Ok((0, None));
                if host_r.contiguous() {
                    stall = translate(sh, engine, host, host_r.offset, w * h)
                        .map(|(ns, addr)| (ns, Some(addr)));
                } else {
                    for y in 0..h {
                        let row = translate(sh, engine, host, host_r.offset + y * host_r.pitch, w);
                        match (row, &mut stall) {
                            (Ok((ns, addr)), Ok((total, first))) => {
                                *total += ns;
                                first.get_or_insert(addr);
                            }
                            (Err(e), _) => {
                                stall = Err(e);
                                break;
                            }
                            _ => {}
                        }
                    }
                }
                stall.map(|(stall, first)| DmaPlan {
                    host: first,
                    ..copy2d_plan(link, c.kind, c.src_r, c.dst_r, stall)
                })
            }
        }
        _ => return None,
    };
    Some(planned)
}

/// The plan of a 2-D copy whose translations stalled it `stall` ns: one
/// strided descriptor (see the module doc).
pub(crate) fn copy2d_plan(
    link: &LinkPreset,
    kind: CopyKind,
    src_r: ByteRegion,
    dst_r: ByteRegion,
    stall: u64,
) -> DmaPlan {
    let (w, h) = (src_r.width, src_r.height);
    if kind == CopyKind::D2D {
        let touched = rows_ns(link, w, h) as f64 * link.memory_gbps;
        return DmaPlan::device(D2D_SETUP_NS + (touched / link.d2d_gbps).ceil() as u64);
    }
    let (host_r, dev_r) = if kind == CopyKind::H2D {
        (src_r, dst_r)
    } else {
        (dst_r, src_r)
    };
    let wire = if host_r.contiguous() {
        link.wire_bytes((w * h) as u64)
    } else {
        h as f64 * link.wire_bytes(w as u64)
    };
    let mut p = DmaPlan::link(dir_of(kind), link.setup_ns + stall, wire);
    if !dev_r.contiguous() {
        p.floor_ns = link.setup_ns + stall + rows_ns(link, w, h);
    }
    p
}

/// The modelled time of a 2-D copy alone on the link (a graph node), ns.
pub(crate) fn copy2d_alone_ns(
    link: &LinkPreset,
    kind: CopyKind,
    s: ByteRegion,
    d: ByteRegion,
) -> u64 {
    let p = copy2d_plan(link, kind, s, d, 0);
    match p.dir {
        Some(dir) => {
            let wire = (p.wire_bytes / link.wire_rate(dir, false)).ceil() as u64;
            (p.setup_ns + wire).max(p.floor_ns)
        }
        None => p.floor_ns,
    }
}

/// The wire bytes a copy adds to a merged run (coalescing), after its
/// translations; `None` if it cannot join the run (not a small copy of `kind`,
/// or its translation faults: it then runs, and faults, on its own).
pub(crate) fn joins_run(
    sh: &Shared,
    engine: (u8, u32),
    op: &Op,
    kind: CopyKind,
    max_bytes: usize,
) -> Option<(f64, u64, usize)> {
    match &op.body {
        Body::Copy {
            kind: k,
            bytes,
            src,
            src_off,
            dst,
            dst_off,
            // (A copy that waits first starts on its own.)
            after: None,
            ..
        } if *k == kind && *bytes <= max_bytes && kind != CopyKind::D2D => {
            let (host, off) = if kind == CopyKind::H2D {
                (src, *src_off)
            } else {
                (dst, *dst_off)
            };
            // Translating here is the lookup the merged descriptor makes.
            let (stall, addr) = translate(sh, engine, host, off, *bytes).ok()?;
            Some((
                sh.emu.link.wire_bytes(*bytes as u64) + DESCRIPTOR_BYTES as f64,
                stall,
                addr,
            ))
        }
        _ => None,
    }
}
