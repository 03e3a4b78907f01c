//! Remote copies, events across ranks and faults, on 2 ranks. Each test
//! launches itself under `mpirun -np 2` (`HETERO_MPIRUN` overrides the
//! launcher) and runs its body on every rank; the device is the one
//! `HETERO_BACKEND` names, so the same tests run on host and emu.
#![cfg(feature = "mpi")]

// hetero's own test helpers: the gate that holds a stream, and `settle`.
#[path = "../../hetero/tests/common/mod.rs"]
mod common;

use hetero::{Device, Grid, Kernel};
use hetero_mpi::{Cluster, ClusterConfig, MpiError};
use std::process::Command;
use std::time::Duration;

/// Runs `body` on each of `n` ranks: outside MPI, launches this test under
/// mpirun and checks that every rank passed.
fn on_ranks(n: usize, name: &str, config: ClusterConfig, body: impl FnOnce(&Cluster)) {
    on_sizes(&[n], name, config, body)
}

/// Runs `body` on every rank, once per size in `sizes` (one mpirun launch each).
fn on_sizes(sizes: &[usize], name: &str, config: ClusterConfig, body: impl FnOnce(&Cluster)) {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_none() && std::env::var_os("PMI_RANK").is_none()
    {
        for &n in sizes {
            launch(n, name);
        }
        return;
    }
    let config_dev = hetero_mpi::rank_device_config().expect("device config");
    let device = Device::new(config_dev).expect("device");
    let cluster = Cluster::init(&device, config).expect("cluster");
    assert!(sizes.contains(&(cluster.size() as usize)));
    let passed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&cluster)));
    if passed.is_err() {
        // The panic is reported above. Its peers would wait for this rank (in
        // the barrier below, or for messages it no longer sends) until mpirun
        // is killed: end every rank now, and `launch` reports the failure.
        use hetero_mpi::mpi::traits::Communicator;
        cluster.world().abort(101);
    }
    cluster.barrier();
}

/// Runs this test binary's test `name` on `n` ranks under mpirun.
fn launch(n: usize, name: &str) {
    let launcher = std::env::var("HETERO_MPIRUN")
        .unwrap_or_else(|_| "mpirun --allow-run-as-root --oversubscribe".into());
    let mut words = launcher.split_whitespace();
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(words.next().expect("a launcher"))
        .args(words)
        .args(["-np", &n.to_string()])
        .arg(exe)
        .args(["--exact", name, "--test-threads=1", "--nocapture"])
        .output()
        .expect("mpirun runs (install openmpi-bin, or set HETERO_MPIRUN)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "ranks failed: {text}");
    assert_eq!(
        text.matches("1 passed").count(),
        n,
        "every rank ran the test"
    );
}

fn fill_kernel(rank: u32) -> Kernel {
    Kernel::new("fill-rank", move |b| {
        let off = b.write_offset(0);
        let out = b.write::<u32>(0);
        for (i, x) in out.iter_mut().enumerate() {
            *x = rank * 1_000_000 + (off + i) as u32;
        }
    })
}

#[test]
fn ranks_know_each_other_and_copy_device_and_pinned_buffers() {
    on_ranks(
        2,
        "ranks_know_each_other_and_copy_device_and_pinned_buffers",
        ClusterConfig::default(),
        |c| {
            let dev = c.device();
            let (me, peer) = (c.rank(), 1 - c.rank());
            assert_eq!(c.ranks().len(), 2);
            assert_eq!(c.ranks()[me as usize].device, dev.properties().name);
            assert_eq!(c.ranks()[peer as usize].backend, dev.properties().backend);
            let s = dev.create_stream().unwrap();
            let n = 100_000;
            // A kernel writes the buffer, the send follows it in stream order.
            let mine = dev.alloc::<u32>(n).unwrap();
            let k = fill_kernel(me as u32);
            s.launch(&k, Grid::new(4), &[hetero::Arg::write(&mine)])
                .unwrap();
            let theirs = dev.alloc::<u32>(n).unwrap();
            // Rank 0 sends first and rank 1 receives first, both on one stream.
            let (t_send, t_recv) = if me == 0 {
                let a = c.send(&s, &mine, peer, 1).unwrap();
                (a, c.recv(&s, &theirs, peer, 2).unwrap())
            } else {
                let b = c.recv(&s, &theirs, peer, 1).unwrap();
                (c.send(&s, &mine, peer, 2).unwrap(), b)
            };
            // Pinned both ways, and a range into the middle of a device buffer.
            let mut pin_in = dev.alloc_pinned::<u32>(64).unwrap();
            let pin_out = dev.pinned_from_slice(&vec![me as u32 + 7; 64]).unwrap();
            let part = dev.alloc::<u32>(300).unwrap();
            s.fill(&part, 0).unwrap();
            c.send_pinned(&s, &pin_out, peer, 3).unwrap();
            c.recv_pinned(&s, &mut pin_in, peer, 3).unwrap();
            c.send_range(&s, &mine, 10, 100, peer, 4).unwrap();
            c.recv_range(&s, &part, 100, 100, peer, 4).unwrap();
            s.synchronize().unwrap();
            assert!(matches!(t_send.result(), Some(Ok(()))));
            assert!(matches!(t_recv.result(), Some(Ok(()))));
            let got = s.read_to_vec(&theirs).unwrap();
            for (i, &x) in got.iter().enumerate() {
                assert_eq!(x, peer as u32 * 1_000_000 + i as u32, "element {i}");
            }
            assert!(pin_in
                .as_slice()
                .unwrap()
                .iter()
                .all(|&x| x == peer as u32 + 7));
            let part = s.read_to_vec(&part).unwrap();
            assert!(part[..100].iter().all(|&x| x == 0));
            for i in 0..100 {
                assert_eq!(part[100 + i], peer as u32 * 1_000_000 + 10 + i as u32);
            }
            assert!(part[200..].iter().all(|&x| x == 0));
        },
    );
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

#[test]
fn a_stream_waits_for_an_event_on_another_rank() {
    on_ranks(
        2,
        "a_stream_waits_for_an_event_on_another_rank",
        ClusterConfig::default(),
        |c| {
            let dev = c.device();
            let s = dev.create_stream().unwrap();
            if c.rank() == 0 {
                // The event is held at a gate until rank 1 has looked (the
                // barrier); its time goes to rank 1 after.
                let mut stamp = dev.alloc_pinned::<u64>(1).unwrap();
                let at = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
                let a = at.clone();
                let gate = common::Gate::hold(&s);
                s.host_fn(move || a.store(now_us(), std::sync::atomic::Ordering::Release))
                    .unwrap();
                let e = s.record_event().unwrap();
                c.send_event(&e, 1, 5).unwrap();
                c.barrier();
                gate.open();
                e.synchronize().unwrap();
                stamp.as_mut_slice().unwrap()[0] = at.load(std::sync::atomic::Ordering::Acquire);
                c.send_pinned(&s, &stamp, 1, 6).unwrap();
                // A failed event fails the waiting stream on the peer.
                let bad = dev.create_stream().unwrap();
                bad.host_fn(|| panic!("rank 0 broke")).unwrap();
                let e = bad.record_event().unwrap();
                c.send_event(&e, 1, 7).unwrap();
                s.synchronize().unwrap();
                let _ = bad.synchronize();
            } else {
                let ran = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
                let r = ran.clone();
                c.wait_event(&s, 0, 5).unwrap();
                s.host_fn(move || r.store(now_us(), std::sync::atomic::Ordering::Release))
                    .unwrap();
                // Rank 0's event is held until both ranks pass the barrier: the
                // device had turns to run what is ready, and this must wait.
                // (Checked after the barrier, so that a failure here never
                // leaves rank 0 waiting in it.)
                common::settle(dev);
                let early = ran.load(std::sync::atomic::Ordering::Acquire);
                c.barrier();
                assert_eq!(early, 0, "ran before the event on rank 0 completed");
                let mut stamp = dev.alloc_pinned::<u64>(1).unwrap();
                c.recv_pinned(&s, &mut stamp, 0, 6).unwrap();
                s.synchronize().unwrap();
                let there = stamp.as_slice().unwrap()[0];
                let here = ran.load(std::sync::atomic::Ordering::Acquire);
                assert!(
                    there > 0 && here >= there,
                    "ran at {here} µs, event at {there} µs"
                );
                let s2 = dev.create_stream().unwrap();
                let t = c.wait_event(&s2, 0, 7).unwrap();
                let err = s2.synchronize().unwrap_err().to_string();
                assert!(
                    err.contains("peer rank 0") && err.contains("rank 0 broke"),
                    "{err}"
                );
                assert!(matches!(
                    t.result(),
                    Some(Err(MpiError::RemoteEventFailed { peer: 0, .. }))
                ));
            }
        },
    );
}

#[test]
fn failed_remote_copies_fault_their_stream_naming_the_peer() {
    let config = ClusterConfig::default().timeout(Duration::from_millis(300));
    on_ranks(
        2,
        "failed_remote_copies_fault_their_stream_naming_the_peer",
        config,
        |c| {
            let dev = c.device();
            // Bad input is refused at once.
            let s = dev.create_stream().unwrap();
            let b = dev.alloc::<u8>(16).unwrap();
            assert!(matches!(
                c.send(&s, &b, 2, 0),
                Err(MpiError::InvalidRank { peer: 2, size: 2 })
            ));
            assert!(matches!(
                c.send(&s, &b, -1, 0),
                Err(MpiError::InvalidRank { peer: -1, .. })
            ));
            assert!(matches!(
                c.send(&s, &b, 0, -3),
                Err(MpiError::InvalidTag { .. })
            ));
            if c.rank() == 0 {
                // 16 bytes into 32, then 64 into 32.
                let small = dev.alloc::<u8>(16).unwrap();
                let big = dev.alloc::<u8>(64).unwrap();
                c.send(&s, &small, 1, 10).unwrap();
                c.send(&s, &big, 1, 11).unwrap();
                s.synchronize().unwrap();
            } else {
                let short = dev.create_stream().unwrap();
                let r = dev.alloc::<u8>(32).unwrap();
                let t = c.recv(&short, &r, 0, 10).unwrap();
                let err = short.synchronize().unwrap_err().to_string();
                assert!(
                    err.contains("peer rank 0") && err.contains("expected 32 bytes"),
                    "{err}"
                );
                assert!(matches!(
                    t.result(),
                    Some(Err(MpiError::SizeMismatch {
                        peer: 0,
                        expected: 32,
                        got: Some(16),
                        ..
                    }))
                ));
                let long = dev.create_stream().unwrap();
                let r2 = dev.alloc::<u8>(32).unwrap();
                let t = c.recv(&long, &r2, 0, 11).unwrap();
                assert!(long.synchronize().is_err());
                assert!(matches!(
                    t.result(),
                    Some(Err(MpiError::SizeMismatch {
                        peer: 0,
                        got: None,
                        ..
                    }))
                ));
                // A peer that never sends: reported after the timeout, and the work
                // after it on the stream does not run.
                let silent = dev.create_stream().unwrap();
                let t = c.recv(&silent, &r2, 0, 12).unwrap();
                let after = c.send(&silent, &r2, 0, 13).unwrap();
                let t0 = std::time::Instant::now();
                let err = silent.synchronize().unwrap_err().to_string();
                assert!(t0.elapsed() >= Duration::from_millis(300));
                assert!(
                    err.contains("peer rank 0") && err.contains("not done after"),
                    "{err}"
                );
                assert!(matches!(
                    t.result(),
                    Some(Err(MpiError::PeerTimeout { peer: 0, .. }))
                ));
                assert!(matches!(
                    after.result(),
                    Some(Err(MpiError::NotRun { peer: 0, .. }))
                ));
            }
        },
    );
}

#[test]
fn the_stencil_matches_the_single_process_run_on_1_2_and_4_ranks() {
    on_sizes(
        &[1, 2, 4],
        "the_stencil_matches_the_single_process_run_on_1_2_and_4_ranks",
        ClusterConfig::default(),
        |c| {
            use hetero_mpi::stencil::{self, StencilConfig};
            let cfg = StencilConfig {
                n: 96,
                iters: 12,
                check: true,
            };
            let rep = stencil::run(c, &cfg).expect("stencil");
            assert_eq!(rep.ranks, c.size());
            assert_eq!(rep.matches_reference, Some(true));
            assert_eq!(rep.checksum, stencil::checksum(&stencil::reference(96, 12)));
        },
    );
}
