//! `hetero`: the command line. It holds no runtime logic: it parses arguments and calls
//! the library, the benchmarks and the profiler.

mod bench;

use clap::{Parser, Subcommand};

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

#[derive(Subcommand)]
enum Command {
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
    /// Allocation latency and fragmentation beside malloc, mimalloc, jemalloc, offset-allocator.
    Alloc(BenchOpts),
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench { which } => match which {
            BenchCommand::Alloc(opts) => bench::alloc::run(opts.quick).print(opts.json),
        },
    }
}
