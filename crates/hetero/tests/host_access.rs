//! Host access (synchronous reads and writes, pinned buffers' slices) beside
//! work the engines run: the hand-off of a buffer between the host and a
//! kernel that found it taken, and what a refused access says and does.

mod common;

use common::within;
use hetero::{Arg, Error, Graph, Grid, Kernel};

/// A kernel on `s1` writes `y`; with no event between them, `s2` writes `y`
/// from the host at once, while the kernel may not have started. Whichever
/// takes `y` first, the other must get it when it is given back: the kernel
/// waiting for the host's write lock must be woken when the host lets go
/// (a lost wake-up here left `s1.synchronize()` parked for ever).
#[test]
fn a_kernel_that_found_its_buffer_held_by_the_host_runs_when_the_host_lets_go() {
    const N: usize = 1 << 20;
    const ROUNDS: usize = 2000;
    within(120, "host write beside a kernel on the same buffer", || {
        let dev = common::device_with(|c| c.compute_units(2));
        let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
        let y = dev.alloc::<u32>(N).unwrap();
        let fill = Kernel::new("fill_y", |b| {
            let off = b.write_offset(0);
            for (i, v) in b.write::<u32>(0).iter_mut().enumerate() {
                *v = (off + i) as u32;
            }
        })
        .wgsl(common::wgsl::map("u32", 0, "i"), "main");
        let ones = vec![9u32; N];
        let mut out = vec![0u32; N];
        for round in 0..ROUNDS {
            s1.launch(&fill, Grid::new(2), &[Arg::write(&y)]).unwrap();
            s2.write_slice(&y, 0, &ones).unwrap();
            s1.synchronize().unwrap();
            // Either order is consistent: all the kernel's values or all nines.
            s1.read_slice(&y, 0, &mut out).unwrap();
            let kernel_last = out[1] == 1;
            for (i, &v) in out.iter().enumerate().step_by(4099) {
                let want = if kernel_last { i as u32 } else { 9 };
                assert_eq!(v, want, "round {round}, element {i}");
            }
        }
    });
}

/// A pinned buffer that a graph copies from is held by the graph while it
/// exists: a host write says so (not "synchronize first", which cannot help),
/// and works once the graph and its plan are gone. Copies recorded on a pinned
/// slot hold only the slot: the bound buffer is free once the launch completed
/// and the bindings are dropped.
#[test]
fn a_pinned_buffer_held_by_a_graph_says_so_and_is_free_without_it() {
    let dev = common::device();
    let s = dev.create_stream().unwrap();
    let mut src = dev.pinned_from_slice(&[1u32; 256]).unwrap();
    let dst = dev.alloc::<u32>(256).unwrap();
    let mut g = Graph::new(&dev).unwrap();
    g.copy_h2d(&src, &dst, &[]).unwrap();
    let held = |src: &mut hetero::PinnedBuffer<u32>| match src.as_mut_slice() {
        Err(e @ Error::HeldByGraph { .. }) => {
            let m = e.to_string();
            assert!(m.contains("bind_pinned"), "{m}");
        }
        other => panic!("expected HeldByGraph, got {:?}", other.map(|_| ())),
    };
    held(&mut src); // before any launch
    let exec = g.instantiate().unwrap();
    s.launch_graph(&exec).unwrap();
    s.synchronize().unwrap();
    held(&mut src); // between launches
    drop(g);
    held(&mut src); // the plan still holds it
    drop(exec);
    src.as_mut_slice().unwrap()[0] = 5;

    // The same copy on a pinned slot, bound per launch.
    let mut g = Graph::new(&dev).unwrap();
    let slot = g.pinned_slot::<u32>(256).unwrap();
    g.copy_h2d(&slot, &dst, &[]).unwrap();
    let exec = g.instantiate().unwrap();
    let mut b = exec.bindings();
    b.bind_pinned(&slot, &src).unwrap();
    s.launch_graph_with(&exec, &b).unwrap();
    s.synchronize().unwrap();
    held(&mut src); // the bindings hold it
    drop(b);
    src.as_mut_slice().unwrap()[1] = 6;
    assert_eq!(s.read_to_vec(&dst).unwrap()[..2], [5, 1]);
}

/// A host polling a pinned buffer that a fill writes sees it become readable,
/// on every backend: on a device in virtual time the refused reads step the
/// model (it runs only when the host waits or polls).
#[test]
fn polling_a_pinned_buffer_until_its_fill_completes_terminates() {
    within(60, "polling a pinned buffer", || {
        let dev = common::device();
        let s = dev.create_stream().unwrap();
        let mut p = dev.alloc_pinned::<u32>(1 << 16).unwrap();
        s.fill_pinned(&mut p, 7).unwrap();
        let mut refused = 0u64;
        loop {
            match p.as_slice() {
                Ok(v) => {
                    assert!(v.iter().all(|&x| x == 7));
                    break;
                }
                Err(Error::BufferBusy { .. }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        eprintln!("{refused} refused reads before the fill completed");
    });
}
