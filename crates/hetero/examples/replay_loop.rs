//! A tiled Cholesky (`replay_loop [T] [ROUNDS]`, T×T tiles) on a modelled
//! node in virtual time (three emulated devices), submitted online with
//! dmda and launched as a HEFT-placed task graph, the two in turns: prints
//! host ns per task of each, for profiles of the replay path.
use hetero::{
    Context, Device, DeviceConfig, EmuConfig, Grid, Kernel, KernelCost, LinkPreset, SchedPolicy,
    TaskData, TaskGraph, TimeMode,
};
use std::time::Instant;

const NB: usize = 64;

fn kernel(name: &'static str, flops: f64) -> Kernel {
    Kernel::with_cost(
        name,
        move |_: Grid| KernelCost { flops, bytes: 0.0 },
        |b| {
            if let Some(x) = b.write::<f64>(0).first_mut() {
                *x += 1.0;
            }
        },
    )
}

fn main() {
    let mut a = std::env::args().skip(1).map(|a| a.parse::<usize>().ok());
    let t = a.next().flatten().unwrap_or(16);
    let rounds = a.next().flatten().unwrap_or(5);
    let devs: Vec<Device> = [(4, 25e9), (2, 400e9), (2, 150e9)]
        .iter()
        .map(|&(units, flops)| {
            let emu = EmuConfig::new(LinkPreset::pcie4x16())
                .time(TimeMode::Virtual)
                .flops_per_unit(flops);
            Device::new(DeviceConfig::default().compute_units(units).emu(emu)).expect("device")
        })
        .collect();
    let ctx = Context::new(&devs).expect("context");
    ctx.set_perfmodel_dir(None);
    ctx.set_scheduler(SchedPolicy::Dmda);
    let n3 = (NB * NB * NB) as f64 * 64.0;
    let (potrf, trsm, syrk, gemm) = (
        kernel("potrf", n3 / 3.0),
        kernel("trsm", n3),
        kernel("syrk", n3),
        kernel("gemm", 2.0 * n3),
    );
    let tile = |i: usize, j: usize| i * (i + 1) / 2 + j;
    let data: Vec<TaskData<f64>> = (0..t * (t + 1) / 2)
        .map(|_| ctx.data::<f64>(NB * NB).expect("tile"))
        .collect();
    // (kernel, reads, write)
    let mut tasks: Vec<(&Kernel, Vec<usize>, usize)> = Vec::new();
    for k in 0..t {
        tasks.push((&potrf, vec![], tile(k, k)));
        for i in k + 1..t {
            tasks.push((&trsm, vec![tile(k, k)], tile(i, k)));
        }
        for i in k + 1..t {
            tasks.push((&syrk, vec![tile(i, k)], tile(i, i)));
            for j in k + 1..i {
                tasks.push((&gemm, vec![tile(i, k), tile(j, k)], tile(i, j)));
            }
        }
    }
    let build = |(k, reads, w): &(&Kernel, Vec<usize>, usize)| {
        let mut b = ctx.task(k);
        for &r in reads {
            b = b.read(&data[r]);
        }
        b.read_write(&data[*w])
    };
    // Host time submitting, less what submissions waited for busy streams.
    let online = || {
        let before = ctx.task_stats().stream_wait_ns;
        let t0 = Instant::now();
        for s in &tasks {
            build(s).submit().expect("task");
        }
        let ns = t0.elapsed().as_nanos() as f64;
        let waited = ctx.task_stats().stream_wait_ns - before;
        ctx.wait_tasks().expect("tasks");
        ns - waited as f64
    };
    for _ in 0..6 {
        online();
    }
    let mut g = TaskGraph::new();
    for s in &tasks {
        build(s).record(&mut g).expect("record");
    }
    let placed = g.instantiate_on(&ctx).expect("instantiate");
    placed.launch().expect("launch");
    ctx.wait_tasks().expect("tasks");
    let n = tasks.len() as f64;
    for _ in 0..rounds {
        let on = online();
        let t0 = Instant::now();
        placed.launch().expect("launch");
        let re = t0.elapsed().as_nanos() as f64;
        ctx.wait_tasks().expect("tasks");
        println!(
            "{} tasks: online {:.0} ns/task, replay {:.0} ns/task, ratio {:.3}",
            tasks.len(),
            on / n,
            re / n,
            re / on
        );
    }
}
