//! `hetero`: the command line. It holds no runtime logic: it parses arguments and calls
//! the library, the benchmarks and the profiler.

use clap::{Parser, Subcommand};
use hetero_cli::{bench, demo};

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
struct DemoArgs {
    /// Number of chunks.
    #[arg(long, default_value_t = 64)]
    chunks: usize,
    /// Chunk size in KiB.
    #[arg(long, default_value_t = 256)]
    chunk_kib: usize,
    /// Timed repetitions of each mode (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// The 3-stage pipeline demo: serial vs three streams, verified.
    Demo(DemoArgs),
    /// Benchmarks, each beside a peer in the same run.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
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
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(a) => {
            let cfg = demo::DemoConfig {
                chunks: a.chunks.max(1),
                chunk_bytes: a.chunk_kib.max(1) * 1024,
                reps: a.reps.max(1),
                iters: None,
            };
            let result = hetero::Device::host().and_then(|dev| {
                demo::run(&dev, cfg, |msg| {
                    if !a.json {
                        eprintln!("  .. {msg}");
                    }
                })
            });
            match result {
                Ok(r) if a.json => println!("{}", serde_json::to_string(&r).expect("serialise")),
                Ok(r) => r.print(),
                Err(e) => {
                    eprintln!("hetero demo failed: {e}");
                    std::process::exit(1);
                }
            }
        }
        Command::Bench { which } => {
            let (opts, rep) = match which {
                BenchCommand::Submit(o) => (o, bench::submit::run(o.quick)),
                BenchCommand::Events(o) => (o, bench::events::run(o.quick)),
                BenchCommand::Pipeline(o) => (o, bench::pipeline::run(o.quick)),
            };
            rep.print(opts.json);
        }
    }
}
