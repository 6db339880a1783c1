//! The `rshmem` command-line tool.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "rshmem", version, about = "GPU-initiated networking runtime: launcher, diagnostics, benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start N local PEs running PROGRAM, with their output prefixed by PE.
    Run(rshmem::launcher::RunArgs),
    /// Report what this machine offers rshmem (CPU PEs, CUDA, rdma-core, libfabric).
    Doctor(rshmem::doctor::DoctorArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => rshmem::launcher::run_cli(args),
        Command::Doctor(args) => rshmem::doctor::run_cli(args),
    };
    std::process::exit(code);
}
