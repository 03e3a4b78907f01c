//! Empty tasks submitted to a context of the host device and an emulated
//! device in real time, for profiles of the task layer's submission path
//! (`perf record`): `task_overhead [N]`, the policy from `HETERO_SCHED`.
//! Prints host ns per submission and the layer's figures.
use hetero::{Context, Device, DeviceConfig, EmuConfig, Kernel, LinkPreset, TimeMode};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let empty = Kernel::new("empty", |_| {});
    let emu = EmuConfig::new(LinkPreset::pcie4x16()).time(TimeMode::Real);
    let devs = [
        Device::host().expect("host device"),
        Device::new(DeviceConfig::default().emu(emu)).expect("emulated device"),
    ];
    let ctx = Context::new(&devs).expect("context");
    ctx.set_perfmodel_dir(None);
    // Calibration first.
    for _ in 0..200 {
        ctx.task(&empty).submit().expect("task");
    }
    ctx.wait_tasks().expect("tasks");
    ctx.reset_task_stats();
    let t0 = std::time::Instant::now();
    for _ in 0..n {
        ctx.task(&empty).submit().expect("task");
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    ctx.wait_tasks().expect("tasks");
    println!(
        "{}: {ns:.0} ns per task; {:?}",
        ctx.scheduler().name(),
        ctx.task_stats()
    );
}
