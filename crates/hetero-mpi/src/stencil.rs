//! The distributed demo workload: a 2-D Jacobi stencil, owner-computes, with
//! halo exchange between ranks (`examples/stencil.rs`, `hetero demo
//! --distributed`).
//!
//! The `n × n` grid is split into bands of rows, one per rank; each rank's band
//! is computed in tiles (kernel blocks of about [`TILE_ROWS`] rows) on its
//! device. Per iteration a rank first computes the new band's first and last
//! rows into row buffers of their own (one small kernel), then four streams
//! exchange them with its neighbours (send up, receive from up, send down,
//! receive from down: on separate streams so that no transfer waits behind
//! another) while the band kernel computes the whole new band; the halos are
//! double-buffered, so the receives never touch what that kernel reads. The
//! next iteration waits on the four transfers. The result is gathered on
//! rank 0 and compared bit for bit with a single-thread run of the same
//! arithmetic ([`reference`]).

use crate::{Cluster, MpiError, Result};
use hetero::{Arg, DeviceBuffer, Event, Grid, Kernel, KernelCost, Stream};
use mpi::collective::SystemOperation;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};
use std::time::Instant;

/// Rows per tile (kernel block), about.
pub const TILE_ROWS: usize = 8;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct StencilConfig {
    /// The grid's side.
    pub n: usize,
    /// Jacobi iterations.
    pub iters: usize,
    /// Compare with the single-thread reference on rank 0.
    pub check: bool,
}

/// What a run gave (the same on every rank).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StencilReport {
    /// Ranks.
    pub ranks: i32,
    /// Grid side.
    pub n: usize,
    /// Iterations.
    pub iters: usize,
    /// Wall time of the iterations, the slowest rank's, ms.
    pub wall_ms: f64,
    /// Device time of the iterations (modelled in virtual time), the slowest
    /// rank's, ms.
    pub device_ms: f64,
    /// An FNV-1a hash of the result's bits.
    pub checksum: u64,
    /// Whether the result equals the reference bit for bit (`None`: not checked).
    pub matches_reference: Option<bool>,
}

/// The initial grid: a hot left edge and top edge on a cool, patterned interior.
pub fn initial(n: usize) -> Vec<f32> {
    let mut g = vec![0f32; n * n];
    for i in 0..n {
        for j in 0..n {
            g[i * n + j] = if i == 0 || j == 0 {
                100.0
            } else {
                ((i * 31 + j * 17) % 13) as f32 * 0.5
            };
        }
    }
    g
}

/// Columns `c0..c1` of one new row from the rows above, at and below it; the
/// first and last columns are fixed (boundary). The one place the arithmetic is.
#[inline]
fn row_cols(up: &[f32], mid: &[f32], down: &[f32], out: &mut [f32], c0: usize, c1: usize) {
    let n = mid.len();
    for (k, j) in (c0..c1).enumerate() {
        out[k] = if j == 0 || j == n - 1 {
            mid[j]
        } else {
            0.25 * ((up[j] + down[j]) + (mid[j - 1] + mid[j + 1]))
        };
    }
}

/// `iters` iterations of the whole grid on one thread: what every run must give.
pub fn reference(n: usize, iters: usize) -> Vec<f32> {
    let mut cur = initial(n);
    let mut next = cur.clone();
    for _ in 0..iters {
        for i in 1..n - 1 {
            let (up, mid, down) = (
                &cur[(i - 1) * n..i * n],
                &cur[i * n..(i + 1) * n],
                &cur[(i + 1) * n..(i + 2) * n],
            );
            row_cols(up, mid, down, &mut next[i * n..(i + 1) * n], 0, n);
        }
        std::mem::swap(&mut cur, &mut next);
    }
    cur
}

/// FNV-1a over the bits of `v`.
pub fn checksum(v: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in v {
        h ^= u64::from(x.to_bits());
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The rows rank `r` of `p` owns.
fn band(n: usize, p: usize, r: usize) -> (usize, usize) {
    (r * n / p, (r + 1) * n / p)
}

/// Columns `c0..c1` of local row `r` of the new band into `dst`, from the
/// band `cur` (`rows` rows from global row `first`) and its halos.
#[allow(clippy::too_many_arguments)]
fn new_row(
    n: usize,
    first: usize,
    rows: usize,
    r: usize,
    (cur, top, bot): (&[f32], &[f32], &[f32]),
    dst: &mut [f32],
    c0: usize,
    c1: usize,
) {
    let g = first + r;
    let mid = &cur[r * n..(r + 1) * n];
    if g == 0 || g == n - 1 {
        dst.copy_from_slice(&mid[c0..c1]);
        return;
    }
    let up = if r == 0 {
        top
    } else {
        &cur[(r - 1) * n..r * n]
    };
    let down = if r + 1 == rows {
        bot
    } else {
        &cur[(r + 1) * n..(r + 2) * n]
    };
    row_cols(up, mid, down, dst, c0, c1);
}

fn cost(cells: f64) -> impl Fn(Grid) -> KernelCost + Send + Sync + 'static {
    move |_| KernelCost {
        flops: 4.0 * cells,
        bytes: 8.0 * cells,
    }
}

/// The band kernel: reads the band (`cur`) and its halos, writes the new band;
/// each block writes its share of elements, row segment by row segment.
fn band_kernel(n: usize, first: usize, rows: usize) -> Kernel {
    Kernel::with_cost("stencil-band", cost((rows * n) as f64), move |b| {
        let args = (b.read::<f32>(0), b.read::<f32>(1), b.read::<f32>(2));
        let off = b.write_offset(0);
        let out = b.write::<f32>(0);
        let (mut e, end) = (off, off + out.len());
        while e < end {
            let (r, c0) = (e / n, e % n);
            let c1 = n.min(c0 + (end - e));
            let dst = &mut out[e - off..e - off + (c1 - c0)];
            new_row(n, first, rows, r, args, dst, c0, c1);
            e += c1 - c0;
        }
    })
}

/// The edge kernel (one block): the new band's first and last rows into two
/// row buffers of their own, which the sends read while the band kernel
/// computes the whole band (those rows again) beside them.
fn edge_kernel(n: usize, first: usize, rows: usize) -> Kernel {
    Kernel::with_cost("stencil-edges", cost((2 * n) as f64), move |b| {
        let args = (b.read::<f32>(0), b.read::<f32>(1), b.read::<f32>(2));
        new_row(n, first, rows, 0, args, b.write::<f32>(0), 0, n);
        new_row(n, first, rows, rows - 1, args, b.write::<f32>(1), 0, n);
    })
}

/// Message tags: a row going to the rank above, going to the rank below, and
/// a band gathered on rank 0.
const UP: i32 = 1;
const DOWN: i32 = 2;
const GATHER: i32 = 3;

/// Runs the stencil on every rank of `cluster` (collective).
pub fn run(cluster: &Cluster, cfg: &StencilConfig) -> Result<StencilReport> {
    let (n, p, r) = (cfg.n, cluster.size() as usize, cluster.rank() as usize);
    if n < 3 || n < 2 * p {
        return Err(MpiError::Device(hetero::Error::InvalidArgument(format!(
            "a stencil of side {n} on {p} ranks: use a side of at least 3 and 2 rows per rank"
        ))));
    }
    let dev = cluster.device();
    let (first, last) = band(n, p, r);
    let rows = last - first;
    let init = initial(n);
    let compute = dev.create_stream()?;
    let mut a = dev.alloc::<f32>(rows * n)?;
    let mut b = dev.alloc::<f32>(rows * n)?;
    compute.write_slice(&a, 0, &init[first * n..last * n])?;
    // Halos, double-buffered: iteration t reads pair t % 2 while the
    // receives for t + 1 fill the other.
    let top = [dev.alloc::<f32>(n)?, dev.alloc::<f32>(n)?];
    let bot = [dev.alloc::<f32>(n)?, dev.alloc::<f32>(n)?];
    let (send_top, send_bot) = (dev.alloc::<f32>(n)?, dev.alloc::<f32>(n)?);
    // The halos start as the neighbours' first rows.
    if r > 0 {
        compute.write_slice(&top[0], 0, &init[(first - 1) * n..first * n])?;
    } else {
        compute.fill(&top[0], 0.0)?;
    }
    if r + 1 < p {
        compute.write_slice(&bot[0], 0, &init[last * n..(last + 1) * n])?;
    } else {
        compute.fill(&bot[0], 0.0)?;
    }
    for buf in [&top[1], &bot[1], &send_top, &send_bot] {
        compute.fill(buf, 0.0)?;
    }
    compute.synchronize()?;
    let kernel = band_kernel(n, first, rows);
    let edges = edge_kernel(n, first, rows);
    let blocks = rows.div_ceil(TILE_ROWS) as u32;
    let (up, down) = (r.checked_sub(1), (r + 1 < p).then_some(r + 1));
    let lanes: Vec<Stream> = (0..4)
        .map(|_| dev.create_stream())
        .collect::<hetero::Result<_>>()?;
    cluster.barrier();
    let t0 = Instant::now();
    let start = compute.record_event()?;
    for it in 0..cfg.iters {
        let (h, next) = (it % 2, (it + 1) % 2);
        let exchange = it + 1 < cfg.iters && (up.is_some() || down.is_some());
        let mut done: Vec<Event> = Vec::with_capacity(4);
        if exchange {
            // The rows the neighbours need first, then their transfers beside
            // the band kernel (which never touches what they read or write).
            compute.launch(
                &edges,
                Grid::new(1),
                &[
                    Arg::read(&a),
                    Arg::read(&top[h]),
                    Arg::read(&bot[h]),
                    Arg::write(&send_top),
                    Arg::write(&send_bot),
                ],
            )?;
            let e = compute.record_event()?;
            let mut lane = |i: usize, f: &dyn Fn(&Stream) -> Result<()>| -> Result<()> {
                let s = &lanes[i];
                s.wait_event(&e)?;
                f(s)?;
                done.push(s.record_event()?);
                Ok(())
            };
            if let Some(u) = up {
                let u = u as i32;
                lane(0, &|s| cluster.send(s, &send_top, u, UP).map(drop))?;
                lane(1, &|s| cluster.recv(s, &top[next], u, DOWN).map(drop))?;
            }
            if let Some(d) = down {
                let d = d as i32;
                lane(2, &|s| cluster.send(s, &send_bot, d, DOWN).map(drop))?;
                lane(3, &|s| cluster.recv(s, &bot[next], d, UP).map(drop))?;
            }
        }
        compute.launch(
            &kernel,
            Grid::new(blocks),
            &[
                Arg::read(&a),
                Arg::read(&top[h]),
                Arg::read(&bot[h]),
                Arg::write(&b),
            ],
        )?;
        // The next edges read the new halos and rewrite the rows just sent.
        for e in &done {
            compute.wait_event(e)?;
        }
        std::mem::swap(&mut a, &mut b);
    }
    let end = compute.record_event()?;
    end.synchronize()?;
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let device_ms = start.elapsed_ms(&end)?;
    for s in &lanes {
        s.synchronize()?;
    }
    let world = cluster.world();
    let (mut wall_max, mut device_max) = (0f64, 0f64);
    world.all_reduce_into(&wall_ms, &mut wall_max, SystemOperation::max());
    world.all_reduce_into(&device_ms, &mut device_max, SystemOperation::max());
    // Gather the bands on rank 0, then tell every rank the checksum.
    let mut sum = [0u64; 2];
    if r == 0 {
        let whole: DeviceBuffer<f32> = dev.alloc(n * n)?;
        compute.copy_d2d_range(&a, 0, &whole, 0, rows * n)?;
        for q in 1..p {
            let (f, l) = band(n, p, q);
            cluster.recv_range(&compute, &whole, f * n, (l - f) * n, q as i32, GATHER)?;
        }
        let got = compute.read_to_vec(&whole)?;
        sum[0] = checksum(&got);
        if cfg.check {
            let want = reference(n, cfg.iters);
            let same = want
                .iter()
                .map(|x| x.to_bits())
                .eq(got.iter().map(|x| x.to_bits()));
            sum[1] = 1 + u64::from(same);
        }
    } else {
        cluster.send(&compute, &a, 0, GATHER)?;
        compute.synchronize()?;
    }
    world.process_at_rank(0).broadcast_into(&mut sum[..]);
    Ok(StencilReport {
        ranks: p as i32,
        n,
        iters: cfg.iters,
        wall_ms: wall_max,
        device_ms: device_max,
        checksum: sum[0],
        matches_reference: match sum[1] {
            0 => None,
            v => Some(v == 2),
        },
    })
}
