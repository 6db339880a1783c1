//! `rshmem doctor`: what this machine offers rshmem.
//!
//! INTERFACE SKELETON — to be implemented (see the doctor task).

/// Arguments of `rshmem doctor`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run_cli(_args: DoctorArgs) -> i32 {
    unimplemented!()
}
