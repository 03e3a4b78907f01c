//! The distributed stencil (owner-computes, halo exchange), checked bit for bit
//! against a single-thread run. Run it under MPI:
//!
//! ```text
//! cargo build --release -p hetero-mpi --features mpi --example stencil
//! mpirun --allow-run-as-root --oversubscribe -np 2 target/release/examples/stencil [N] [ITERS]
//! ```
//!
//! `HETERO_BACKEND=emu:pcie4x16` runs each rank on an emulated device (virtual
//! time: the device time printed is the model's).

use hetero_mpi::stencil::{self, StencilConfig};
use hetero_mpi::{Cluster, ClusterConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n = args.next().map_or(Ok(1024), |a| a.parse())?;
    let iters = args.next().map_or(Ok(50), |a| a.parse())?;
    let device = hetero::Device::new(hetero_mpi::rank_device_config()?)?;
    let cluster = Cluster::init(&device, ClusterConfig::from_env()?)?;
    let report = stencil::run(
        &cluster,
        &StencilConfig {
            n,
            iters,
            check: true,
        },
    )?;
    if cluster.rank() == 0 {
        println!(
            "stencil {n}x{n}, {iters} iterations on {} ranks ({}): {:.2} ms wall, {:.3} ms device, checksum {:016x}, {}",
            report.ranks,
            device.properties().name,
            report.wall_ms,
            report.device_ms,
            report.checksum,
            match report.matches_reference {
                Some(true) => "matches the single-process run bit for bit",
                Some(false) => "DIFFERS from the single-process run",
                None => "not checked",
            }
        );
    }
    if report.matches_reference == Some(false) {
        return Err("the distributed result differs from the single-process run".into());
    }
    Ok(())
}
