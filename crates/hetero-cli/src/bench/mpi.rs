//! `hetero bench mpi` (under `mpirun -np 2`): remote copies through hetero
//! streams beside raw rsmpi ping-pong in the same run, and how much of a 4 MiB
//! transfer hides behind compute with no progress thread.
//!
//! - latency, 8 B: a ping-pong of K round trips; hetero enqueues all K sends
//!   and receives on one stream of each rank behind a host event, releases it
//!   and waits for the end (the engines run the chain: each op starts when the
//!   one before completed); raw MPI runs the same loop with blocking
//!   `send`/`receive` on the main thread. One-way latency = time / 2K.
//! - bandwidth, 4 MiB: the same ping-pong with 4 MiB pinned buffers; bytes
//!   moved / time.
//! - overlap: rank 0 sends 4 MiB to rank 1 on one stream while a kernel of
//!   many blocks computes on another (both ranks have one compute unit: the
//!   engine that computes also progresses the send, between blocks). With
//!   `t_comm` the send alone, `t_comp` the kernel alone (about twice `t_comm`)
//!   and `t_both` both at once, the hidden fraction is
//!   `(t_comm + t_comp - t_both) / t_comm`, clamped to 0..1.
//!
//! Only rank 0 reports.

use super::BenchReport;
use hetero::clock::now_ns;
use hetero::{Arg, CompletionMode, Device, Grid, Kernel, PinnedBuffer, Stream};
use hetero_mpi::mpi::traits::{Communicator, Destination, Source};
use hetero_mpi::{Cluster, ClusterConfig};

fn fail(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One-way µs of a hetero ping-pong of `k` round trips of `bytes`.
fn hetero_pingpong(c: &Cluster, s: &Stream, bytes: usize, k: usize) -> Result<f64, String> {
    let dev = c.device();
    let (me, peer) = (c.rank(), 1 - c.rank());
    let out: PinnedBuffer<u8> = dev
        .pinned_from_slice(&vec![me as u8; bytes])
        .map_err(fail)?;
    let mut back: PinnedBuffer<u8> = dev.alloc_pinned(bytes).map_err(fail)?;
    let go = dev.host_event();
    s.wait_event(go.event()).map_err(fail)?;
    for _ in 0..k {
        if me == 0 {
            c.send_pinned(s, &out, peer, 0).map_err(fail)?;
            c.recv_pinned(s, &mut back, peer, 0).map_err(fail)?;
        } else {
            c.recv_pinned(s, &mut back, peer, 0).map_err(fail)?;
            c.send_pinned(s, &out, peer, 0).map_err(fail)?;
        }
    }
    c.barrier();
    let t0 = now_ns();
    go.signal();
    s.synchronize().map_err(fail)?;
    let ns = now_ns() - t0;
    if back.as_slice().map_err(fail)?.first() != Some(&(peer as u8)) && bytes > 0 {
        return Err("the ping-pong moved the wrong bytes".into());
    }
    Ok(ns as f64 / 1e3 / (2 * k) as f64)
}

/// One-way µs of a raw rsmpi ping-pong, on the same pinned memory as hetero's
/// (so that only the runtime differs).
fn raw_pingpong(c: &Cluster, bytes: usize, k: usize) -> Result<f64, String> {
    let world = c.world();
    let (me, peer) = (c.rank(), 1 - c.rank());
    let other = world.process_at_rank(peer);
    let dev = c.device();
    let out: PinnedBuffer<u8> = dev
        .pinned_from_slice(&vec![me as u8; bytes])
        .map_err(fail)?;
    let mut back: PinnedBuffer<u8> = dev.alloc_pinned(bytes).map_err(fail)?;
    let (out, back) = (
        out.as_slice().map_err(fail)?,
        back.as_mut_slice().map_err(fail)?,
    );
    c.barrier();
    let t0 = now_ns();
    for _ in 0..k {
        if me == 0 {
            other.send(out);
            other.receive_into(&mut back[..]);
        } else {
            other.receive_into(&mut back[..]);
            other.send(out);
        }
    }
    Ok((now_ns() - t0) as f64 / 1e3 / (2 * k) as f64)
}

/// One-way µs of a raw ping-pong with the calls hetero makes: `MPI_Isend` /
/// `MPI_Irecv` polled with `MPI_Test` (what non-blocking MPI itself costs,
/// apart from the runtime).
fn raw_nonblocking_pingpong(c: &Cluster, bytes: usize, k: usize) -> Result<f64, String> {
    use hetero_mpi::mpi::request::{scope, Request};
    let world = c.world();
    let (me, peer) = (c.rank(), 1 - c.rank());
    let other = world.process_at_rank(peer);
    let out = vec![me as u8; bytes];
    let mut back = vec![0u8; bytes];
    fn done<'a, S: hetero_mpi::mpi::request::Scope<'a>>(mut r: Request<'a, [u8], S>) {
        loop {
            match r.test() {
                Ok(_) => return,
                Err(again) => r = again,
            }
        }
    }
    c.barrier();
    let t0 = now_ns();
    for _ in 0..k {
        scope(|sc| {
            if me == 0 {
                done(other.immediate_send(sc, &out[..]));
                done(other.immediate_receive_into(sc, &mut back[..]));
            } else {
                done(other.immediate_receive_into(sc, &mut back[..]));
                done(other.immediate_send(sc, &out[..]));
            }
        });
    }
    Ok((now_ns() - t0) as f64 / 1e3 / (2 * k) as f64)
}

fn spin_kernel(block_ns: u64) -> Kernel {
    Kernel::new("compute", move |_| {
        let t = now_ns();
        while now_ns() - t < block_ns {
            std::hint::spin_loop();
        }
    })
}

/// One overlap round on rank 0 (rank 1 receives): the hidden fraction and
/// `t_comm`, `t_comp`, `t_both` in µs.
fn overlap_round(
    c: &Cluster,
    comp: &Stream,
    comm: &Stream,
    bytes: usize,
) -> Result<(f64, [f64; 3]), String> {
    let dev = c.device();
    let me = c.rank();
    let buf: PinnedBuffer<u8> = dev.pinned_from_slice(&vec![1u8; bytes]).map_err(fail)?;
    let mut into: PinnedBuffer<u8> = dev.alloc_pinned(bytes).map_err(fail)?;
    let scratch = dev.alloc::<u8>(64).map_err(fail)?;
    let mut time = |kernel: Option<&Kernel>, send: bool| -> Result<u64, String> {
        c.barrier();
        if me != 0 {
            if send {
                c.recv_pinned(comm, &mut into, 0, 9).map_err(fail)?;
                comm.synchronize().map_err(fail)?;
            }
            return Ok(0);
        }
        let t0 = now_ns();
        if let Some(k) = kernel {
            comp.launch(k, Grid::new(64), &[Arg::write(&scratch)])
                .map_err(fail)?;
        }
        if send {
            c.send_pinned(comm, &buf, 1, 9).map_err(fail)?;
        }
        comp.synchronize().map_err(fail)?;
        comm.synchronize().map_err(fail)?;
        Ok(now_ns() - t0)
    };
    let t_comm = time(None, true)?;
    // A kernel of about twice the transfer, in 64 blocks.
    let mut block = [t_comm.max(64_000) * 2 / 64];
    c.world().process_at_rank(0).broadcast_into(&mut block[..]);
    let k = spin_kernel(block[0]);
    let t_comp = time(Some(&k), false)?;
    let t_both = time(Some(&k), true)?;
    if me != 0 {
        return Ok((0.0, [0.0; 3]));
    }
    let hidden = (t_comm + t_comp).saturating_sub(t_both) as f64 / t_comm.max(1) as f64;
    let us = |t: u64| t as f64 / 1e3;
    Ok((hidden.clamp(0.0, 1.0), [us(t_comm), us(t_comp), us(t_both)]))
}

use hetero_mpi::mpi::traits::Root;

/// Runs the benchmark on this rank; the report on rank 0, `None` elsewhere.
pub fn run(quick: bool) -> Result<Option<BenchReport>, String> {
    let config = hetero_mpi::rank_device_config()
        .map_err(fail)?
        .host_wait(CompletionMode::Block)
        .stream_capacity(8192);
    let dev = Device::new(config).map_err(fail)?;
    let c = Cluster::init(&dev, ClusterConfig::from_env().map_err(fail)?).map_err(fail)?;
    if c.size() != 2 {
        return Err(format!(
            "hetero bench mpi needs 2 ranks, it runs on {}: mpirun --allow-run-as-root \
             --oversubscribe -np 2 hetero bench mpi",
            c.size()
        ));
    }
    let (rounds, k_small, k_big) = if quick { (7, 500, 10) } else { (21, 2000, 30) };
    let s = dev.create_stream().map_err(fail)?;
    let mut rep = BenchReport::new("mpi");
    let (mut h8, mut m8, mut h4, mut m4) = (vec![], vec![], vec![], vec![]);
    let mut n8 = vec![];
    const BIG: usize = 4 << 20;
    // Warm-up, then interleaved rounds (hetero and raw share the conditions).
    hetero_pingpong(&c, &s, 8, 100)?;
    raw_pingpong(&c, 8, 100)?;
    hetero_pingpong(&c, &s, BIG, 3)?;
    raw_pingpong(&c, BIG, 3)?;
    for _ in 0..rounds {
        h8.push(hetero_pingpong(&c, &s, 8, k_small)?);
        m8.push(raw_pingpong(&c, 8, k_small)?);
        n8.push(raw_nonblocking_pingpong(&c, 8, k_small)?);
        let gbps = |us: f64| BIG as f64 / (us * 1e3);
        h4.push(gbps(hetero_pingpong(&c, &s, BIG, k_big)?));
        m4.push(gbps(raw_pingpong(&c, BIG, k_big)?));
    }
    let (comp, comm) = (
        dev.create_stream().map_err(fail)?,
        dev.create_stream().map_err(fail)?,
    );
    overlap_round(&c, &comp, &comm, BIG)?;
    let (mut ov, mut times) = (Vec::with_capacity(rounds), [vec![], vec![], vec![]]);
    for _ in 0..rounds {
        let (f, t) = overlap_round(&c, &comp, &comm, BIG)?;
        ov.push(f);
        for (v, x) in times.iter_mut().zip(t) {
            v.push(x);
        }
    }
    c.barrier();
    if c.rank() != 0 {
        return Ok(None);
    }
    rep.push_samples("hetero/mpi-latency-8b", "us", &mut h8);
    rep.push_samples("mpi/latency-8b", "us", &mut m8);
    rep.push_samples("mpi/latency-8b-nonblocking", "us", &mut n8);
    rep.push_samples("hetero/mpi-bandwidth-4m", "GB/s", &mut h4);
    rep.push_samples("mpi/bandwidth-4m", "GB/s", &mut m4);
    rep.push_samples("hetero/mpi-overlap", "frac", &mut ov);
    for (name, v) in ["overlap t_comm", "overlap t_comp", "overlap t_both"]
        .iter()
        .zip(times.iter_mut())
    {
        rep.push_samples(&format!("hetero/mpi-{}", name.replace(' ', "-")), "us", v);
    }
    if let (Some(a), Some(b)) = (
        rep.median_of("hetero/mpi-latency-8b"),
        rep.median_of("mpi/latency-8b"),
    ) {
        rep.ratios.insert("added latency 8b (us)".into(), a - b);
        if let Some(n) = rep.median_of("mpi/latency-8b-nonblocking") {
            rep.ratios
                .insert("added latency 8b over non-blocking MPI (us)".into(), a - n);
        }
    }
    rep.ratio_of("hetero/mpi-latency-8b", "mpi/latency-8b");
    rep.ratio_of("hetero/mpi-bandwidth-4m", "mpi/bandwidth-4m");
    let r0 = &c.ranks()[0];
    rep.notes.push(format!(
        "2 ranks on {} ({}); hetero: K chained ops on one stream driven by the engines; \
         raw: blocking rsmpi send/receive on the same pinned memory; overlap: rank 0's kernel of 64 blocks beside a \
         4 MiB send, one compute unit",
        r0.host, r0.device
    ));
    Ok(Some(rep))
}
