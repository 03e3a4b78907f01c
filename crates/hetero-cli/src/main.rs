//! `hetero`: the command line. It holds no runtime logic: it parses arguments and calls
//! the library, the benchmarks and the profiler.

use clap::{Parser, Subcommand};
#[cfg(feature = "bench")]
use hetero_cli::bench;
use hetero_cli::device::DeviceSpec;
use hetero_cli::{demo, info, profile};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "hetero",
    version,
    about = "hetero: a runtime for heterogeneous computing"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone, Copy)]
struct WorkloadArgs {
    /// Number of tiles.
    #[arg(long, default_value_t = 64)]
    tiles: usize,
    /// Tile size in KiB [default: 256; 4 on an emulated device in real time].
    #[arg(long)]
    tile_kib: Option<usize>,
    /// Timed repetitions of each mode (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Kernel passes per element, in steps of 1/8 [default: calibrated on the
    /// host (a tile's kernel about 0.75 × its H2D + D2H); 2 on an emulated device].
    #[arg(long)]
    kernel_passes: Option<f64>,
}

/// The most kernel passes per element `--kernel-passes` takes (the default
/// is about 3; past this a run takes hours).
const MAX_KERNEL_PASSES: f64 = 1024.0;

impl WorkloadArgs {
    /// The workload these arguments ask for, or the exit with a message that
    /// names the argument: zero tiles, tile size or repetitions, kernel
    /// passes out of range, or tiles whose pinned input and output would take
    /// more than half the host's available memory (they once ran until the
    /// kernel killed the process).
    fn config(self, spec: &DeviceSpec) -> demo::DemoConfig {
        let at_least_one = |flag: &str, v: usize| match v {
            0 => fail(flag, format!("{flag} is 0; give at least 1")),
            v => v,
        };
        let tiles = at_least_one("--tiles", self.tiles);
        let reps = at_least_one("--reps", self.reps);
        let tile_bytes = match self.tile_kib {
            None => demo::default_tile_bytes(spec),
            Some(k) => at_least_one("--tile-kib", k)
                .checked_mul(1024)
                .unwrap_or_else(|| fail("--tile-kib", format!("--tile-kib {k} is too large"))),
        };
        let work = self.kernel_passes.map(|p| {
            if !(0.0..=MAX_KERNEL_PASSES).contains(&p) {
                fail(
                    "--kernel-passes",
                    format!("--kernel-passes is {p}; give 0 to {MAX_KERNEL_PASSES}"),
                );
            }
            (p * f64::from(demo::PASS)).round() as u32
        });
        // Each tile has a pinned input and output on the host.
        let pinned = tiles.checked_mul(tile_bytes).and_then(|b| b.checked_mul(2));
        let available = hetero::SystemInfo::probe().mem_available_bytes;
        let gib = |b: f64| b / f64::from(1u32 << 30);
        match (pinned, available) {
            (Some(p), Some(a)) if p as u64 <= a / 2 => {}
            (Some(_), None) => {}
            _ => fail(
                "--tiles",
                format!(
                    "{tiles} tiles of {tile_bytes} bytes need {:.1} GiB of pinned host memory \
                     (an input and an output each), more than half of the {:.1} GiB available; \
                     lower --tiles or --tile-kib",
                    gib(tiles as f64 * tile_bytes as f64 * 2.0),
                    gib(available.unwrap_or(0) as f64)
                ),
            ),
        }
        demo::DemoConfig {
            tiles,
            tile_bytes,
            reps,
            work,
        }
    }
}

#[derive(clap::Args, Clone)]
struct DeviceArgs {
    /// The device: host, emu or emu:PRESET (pcie3x16, pcie4x16, pcie5x16),
    /// optionally with ,time=real|virtual and ,capacity=BYTES, or
    /// vulkan[:INDEX] (`hetero info` lists the Vulkan devices).
    #[arg(long, default_value = "host")]
    device: String,
    /// The emulated device's clock: real or virtual (default virtual).
    #[arg(long)]
    time: Option<String>,
}

impl DeviceArgs {
    fn spec(&self) -> DeviceSpec {
        DeviceSpec::parse(&self.device, self.time.as_deref())
            .unwrap_or_else(|e| fail("--device", e))
    }
}

#[derive(Subcommand)]
enum Command {
    /// The 3-stage pipeline demo: serial vs three streams, verified.
    Demo {
        #[command(flatten)]
        workload: WorkloadArgs,
        #[command(flatten)]
        device: DeviceArgs,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// The distributed demo instead (run under `mpirun -np N`; needs a
        /// build with `--features mpi`): a 2-D stencil with halo exchange,
        /// checked bit for bit against a single-process run. The device is
        /// the one HETERO_BACKEND names.
        #[arg(long)]
        distributed: bool,
        /// The distributed stencil's grid side.
        #[arg(long, default_value_t = 1024)]
        grid: usize,
        /// The distributed stencil's iterations.
        #[arg(long, default_value_t = 50)]
        iters: usize,
        /// Split the tiles over this many emulated devices of one context
        /// (the --device preset each) and report the speedup over one of them.
        #[arg(long, default_value_t = 1)]
        devices: usize,
    },
    /// Benchmarks, each beside a peer in the same run.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// What this machine offers: cores, memory, huge pages, memlock, backends.
    Info {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Open these devices in one context and print its topology
        /// (e.g. emu:pcie4x16,emu:pcie4x16; options follow their device:
        /// emu:pcie4x16,time=real,host).
        #[arg(long)]
        devices: Option<String>,
        /// The peer link between emulated devices of that context: a preset
        /// (pcie4-switch, pcie4-host-bridge, nvlink3) or none.
        #[arg(long, default_value = "pcie4-switch")]
        peer_link: String,
    },
    /// Run a built-in workload (demo, pipeline) with the profiler on and write
    /// trace.json, report.md, report.json and timeline.svg.
    Profile {
        /// The workload: demo or pipeline.
        workload: String,
        /// Output directory.
        #[arg(long, default_value = "hetero-profile")]
        out: PathBuf,
        #[command(flatten)]
        args: WorkloadArgs,
        #[command(flatten)]
        device: DeviceArgs,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args, Clone, Copy)]
pub struct BenchOpts {
    /// Finish in under 20 seconds (fewer samples).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// ns to launch an empty kernel, beside channel sends and rayon::spawn.
    Submit(BenchOpts),
    /// Completion-to-waiter latency, spinning and parked, beside an atomic flag and park/unpark.
    Events(BenchOpts),
    /// The demo's pipeline speedup, beside threads joined by channels.
    Pipeline(BenchOpts),
    /// Submit cost with the profiler off and on.
    Profile(BenchOpts),
    /// Graph launch, replay, update, instantiate and capture beside the same work op by op
    /// (on the device HETERO_BACKEND names).
    Graph(BenchOpts),
    /// Tasks placed across a modelled node (a CPU-like device, two accelerators) by every
    /// scheduling policy beside HEFT and a lower bound; drift, outliers, overhead, placed
    /// graphs, persisted models.
    Placement {
        #[command(flatten)]
        opts: BenchOpts,
        /// Run only these parts (comma separated: cholesky, graph, models, gemm,
        /// random, drift, outliers, overhead); default all.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// Allocation latency and fragmentation beside malloc, mimalloc, jemalloc, offset-allocator.
    Alloc(BenchOpts),
    /// Virtual memory: growing by cached and new granules, ten maps against one, churn
    /// with expandable segments, beside plain mmap.
    Vmm(BenchOpts),
    /// Remote copies through streams beside raw MPI ping-pong, and overlap with compute
    /// (run under `mpirun -np 2`; needs a build with `--features mpi`).
    Mpi(BenchOpts),
    /// Modelled H2D, D2H and both-at-once bandwidth of an emulated link beside its preset's figures.
    Link {
        #[command(flatten)]
        opts: BenchOpts,
        /// The emulated device: emu or emu:PRESET (virtual time).
        #[arg(long, default_value = "emu:pcie4x16")]
        device: String,
        /// Instead: a copy between two such devices of one context over a peer
        /// link (`emu/peer-gbps-64m`), beside the peer link preset's figure.
        #[arg(long)]
        peer: bool,
        /// The peer link for --peer: pcie4-switch, pcie4-host-bridge or nvlink3.
        #[arg(long, default_value = "pcie4-switch")]
        peer_link: String,
    },
    /// Managed buffers in modelled time: the demo's pipeline with managed memory beside
    /// explicit copies, and streaming past twice the device's capacity beside the
    /// minimum bytes.
    Managed {
        #[command(flatten)]
        opts: BenchOpts,
        /// The emulated device: emu or emu:PRESET (virtual time).
        #[arg(long, default_value = "emu:pcie4x16")]
        device: String,
    },
    /// Copy batches, 2-D copies and IOMMU page sizes on an emulated link, and the CPU 2-D
    /// copy beside memcpy.
    Transfer {
        #[command(flatten)]
        opts: BenchOpts,
        /// The emulated device: emu or emu:PRESET (virtual time).
        #[arg(long, default_value = "emu:pcie4x16")]
        device: String,
    },
    /// hetero on a Vulkan device beside raw ash on the same device: dispatches in a
    /// recorded graph, one op end to end, a 64 MiB copy, submissions per op running
    /// ahead, allocation (set LP_NUM_THREADS for lavapipe; it is printed).
    Vulkan(BenchOpts),
}

/// A spinner on stderr for anything that may run longer than a second; hidden when
/// the output is JSON or stderr is not a terminal.
fn spinner(hidden: bool, msg: &str) -> ProgressBar {
    let pb = if hidden {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    pb.set_style(ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("template"));
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("hetero {what} failed: {e}");
    std::process::exit(1);
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo {
            distributed: true,
            grid,
            iters,
            json,
            ..
        } => distributed_demo(grid, iters, json),
        Command::Demo {
            workload,
            device,
            json,
            devices,
            ..
        } if devices != 1 => {
            let spec = device.spec();
            let pb = spinner(json, "demo --devices");
            let result = demo::run_multi(&spec, devices, workload.config(&spec), |m| {
                pb.set_message(m.to_string())
            });
            pb.finish_and_clear();
            match result {
                Ok(r) if json => println!("{}", serde_json::to_string(&r).expect("serialise")),
                Ok(r) if !r.verified => fail(
                    "demo --devices",
                    "the output differs from the CPU reference",
                ),
                Ok(r) => r.print(),
                Err(e) => fail("demo --devices", e),
            }
        }
        Command::Demo {
            workload,
            device,
            json,
            ..
        } => {
            let spec = device.spec();
            let pb = spinner(json, "demo");
            let result = spec.open().and_then(|dev| {
                demo::run_on(&dev, &spec, workload.config(&spec), |m| {
                    pb.set_message(m.to_string())
                })
            });
            pb.finish_and_clear();
            match result {
                Ok(r) if json => println!("{}", serde_json::to_string(&r).expect("serialise")),
                Ok(r) => r.print(),
                Err(e) => fail("demo", e),
            }
        }
        Command::Info {
            json,
            devices,
            peer_link,
        } => {
            let ctx = devices.map(|d| {
                info::open_context(&d, &peer_link).unwrap_or_else(|e| fail("info --devices", e))
            });
            info::print(json, ctx.as_ref())
        }
        Command::Profile {
            workload,
            out,
            args,
            device,
            json,
        } => {
            let spec = device.spec();
            let pb = spinner(json, &format!("profiling {workload}"));
            let result = profile::run_on(&workload, &out, &spec, args.config(&spec), |m| {
                pb.set_message(m.to_string())
            });
            pb.finish_and_clear();
            match result {
                Ok(o) if json => println!(
                    "{}",
                    serde_json::json!({
                        "workload": workload,
                        "verified": o.verified,
                        "ops": o.ops,
                        "trace_json": o.paths.trace_json,
                        "report_md": o.paths.report_md,
                        "report_json": o.paths.report_json,
                        "timeline_svg": o.paths.timeline_svg,
                    })
                ),
                Ok(o) => {
                    println!(
                        "hetero profile {workload}: {} ops recorded, output {}",
                        o.ops,
                        if o.verified {
                            "verified"
                        } else {
                            "NOT verified"
                        }
                    );
                    println!(
                        "  trace     {}  (open in ui.perfetto.dev or chrome://tracing)",
                        o.paths.trace_json.display()
                    );
                    println!("  report    {}", o.paths.report_md.display());
                    println!("  report    {}", o.paths.report_json.display());
                    println!("  timeline  {}", o.paths.timeline_svg.display());
                }
                Err(e) => fail("profile", e),
            }
        }
        Command::Bench { which } => run_bench(which),
    }
}

#[cfg(not(feature = "mpi"))]
const NO_MPI: &str = "this hetero was built without MPI: build it with \
    `cargo build --release -p hetero-cli --features mpi` (needs libopenmpi-dev, \
    openmpi-bin, libclang-dev) and run it under mpirun";

#[cfg(feature = "mpi")]
fn distributed_demo(grid: usize, iters: usize, json: bool) {
    use hetero_mpi::stencil::{self, StencilConfig};
    let run = || -> Result<(i32, String, stencil::StencilReport), String> {
        let config = hetero_mpi::rank_device_config().map_err(|e| e.to_string())?;
        let dev = hetero::Device::new(config).map_err(|e| e.to_string())?;
        let cfg = hetero_mpi::ClusterConfig::from_env().map_err(|e| e.to_string())?;
        let cluster = hetero_mpi::Cluster::init(&dev, cfg).map_err(|e| e.to_string())?;
        let cfg = StencilConfig {
            n: grid,
            iters,
            check: true,
        };
        let rep = stencil::run(&cluster, &cfg).map_err(|e| e.to_string())?;
        Ok((cluster.rank(), dev.properties().name.clone(), rep))
    };
    match run() {
        Ok((rank, _, rep)) if rank != 0 => {
            if rep.matches_reference == Some(false) {
                std::process::exit(1);
            }
        }
        Ok((_, _, rep)) if json => {
            println!("{}", serde_json::to_string(&rep).expect("serialise"));
            if rep.matches_reference == Some(false) {
                std::process::exit(1);
            }
        }
        Ok((_, device, rep)) => {
            println!(
                "distributed stencil {g}x{g}, {it} iterations on {} ranks ({device})",
                rep.ranks,
                g = rep.n,
                it = rep.iters
            );
            println!("  wall   {:>10.2} ms (slowest rank)", rep.wall_ms);
            println!(
                "  device {:>10.3} ms (slowest rank; the model's in virtual time)",
                rep.device_ms
            );
            println!("  checksum {:016x}", rep.checksum);
            match rep.matches_reference {
                Some(true) => println!("  result matches the single-process run bit for bit"),
                Some(false) => fail(
                    "demo --distributed",
                    "the result differs from the single-process run",
                ),
                None => println!("  result not checked"),
            }
        }
        Err(e) => fail("demo --distributed", e),
    }
}

#[cfg(not(feature = "mpi"))]
fn distributed_demo(_grid: usize, _iters: usize, _json: bool) {
    fail("demo --distributed", NO_MPI)
}

/// `hetero bench …`: the benchmarks and their peers are built with the `bench`
/// feature only, so that the demo's build does not pay for them.
#[cfg(feature = "bench")]
fn run_bench(which: BenchCommand) {
    match which {
        BenchCommand::Link {
            opts,
            device,
            peer: true,
            peer_link,
        } => {
            let spec = DeviceSpec::parse(&device, None).unwrap_or_else(|e| fail("--device", e));
            let pb = spinner(opts.json, "bench link --peer");
            let rep = bench::link::run_peer(opts.quick, &spec, &peer_link);
            pb.finish_and_clear();
            match rep {
                Ok(rep) => rep.print(opts.json),
                Err(e) => fail("bench link --peer", e),
            }
        }
        BenchCommand::Link { opts, device, .. } => {
            bench_on("link", opts, &device, bench::link::run)
        }
        BenchCommand::Transfer { opts, device } => {
            bench_on("transfer", opts, &device, bench::transfer::run)
        }
        BenchCommand::Managed { opts, device } => {
            bench_on("managed", opts, &device, bench::managed::run)
        }
        BenchCommand::Mpi(opts) => bench_mpi(opts),
        BenchCommand::Placement { opts, only } => {
            let pb = spinner(opts.json, "bench placement");
            let rep = bench::placement::run_parts(opts.quick, &only);
            pb.finish_and_clear();
            match rep {
                Ok(rep) => rep.print(opts.json),
                Err(e) => fail("bench placement", e),
            }
        }
        BenchCommand::Vulkan(opts) => {
            let pb = spinner(opts.json, "bench vulkan");
            let rep = bench::vulkan::run(opts.quick);
            pb.finish_and_clear();
            match rep {
                Ok(rep) => rep.print(opts.json),
                Err(e) => fail("bench vulkan", e),
            }
        }
        which => {
            let (name, opts): (&str, BenchOpts) = match which {
                BenchCommand::Submit(o) => ("submit", o),
                BenchCommand::Events(o) => ("events", o),
                BenchCommand::Pipeline(o) => ("pipeline", o),
                BenchCommand::Profile(o) => ("profile", o),
                BenchCommand::Alloc(o) => ("alloc", o),
                BenchCommand::Vmm(o) => ("vmm", o),
                BenchCommand::Graph(o) => ("graph", o),
                BenchCommand::Link { .. }
                | BenchCommand::Transfer { .. }
                | BenchCommand::Managed { .. }
                | BenchCommand::Mpi(_)
                | BenchCommand::Placement { .. }
                | BenchCommand::Vulkan(_) => {
                    unreachable!("handled above")
                }
            };
            let pb = spinner(opts.json, &format!("bench {name}"));
            let rep = match name {
                "submit" => bench::submit::run(opts.quick),
                "events" => bench::events::run(opts.quick),
                "pipeline" => bench::pipeline::run(opts.quick),
                "alloc" => bench::alloc::run(opts.quick),
                "vmm" => bench::vmm::run(opts.quick),
                "graph" => bench::graph::run(opts.quick),
                _ => bench::profile::run(opts.quick),
            };
            pb.finish_and_clear();
            rep.print(opts.json);
        }
    }
}

/// A benchmark of the emulated device named by `--device`.
#[cfg(feature = "bench")]
fn bench_on(
    name: &str,
    opts: BenchOpts,
    device: &str,
    run: fn(bool, &DeviceSpec) -> Result<bench::BenchReport, String>,
) {
    let spec = DeviceSpec::parse(device, None).unwrap_or_else(|e| fail("--device", e));
    let pb = spinner(opts.json, &format!("bench {name}"));
    let rep = run(opts.quick, &spec);
    pb.finish_and_clear();
    match rep {
        Ok(rep) => rep.print(opts.json),
        Err(e) => fail(&format!("bench {name}"), e),
    }
}

#[cfg(not(feature = "bench"))]
fn run_bench(_which: BenchCommand) {
    fail(
        "bench",
        "this hetero was built without its benchmarks (they compile their peers: \
         mimalloc, jemalloc, rayon, …); run them with \
         `cargo run --release -p hetero-cli --features bench -- bench …`",
    )
}

#[cfg(all(feature = "bench", feature = "mpi"))]
fn bench_mpi(opts: BenchOpts) {
    match bench::mpi::run(opts.quick) {
        Ok(Some(rep)) => rep.print(opts.json),
        Ok(None) => {}
        Err(e) => fail("bench mpi", e),
    }
}

#[cfg(all(feature = "bench", not(feature = "mpi")))]
fn bench_mpi(_opts: BenchOpts) {
    fail("bench mpi", NO_MPI)
}
