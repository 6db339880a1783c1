//! `rshmem run`: start N local PEs and supervise them.
//!
//! INTERFACE SKELETON — to be implemented (see the launcher task).

/// Arguments of `rshmem run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Number of PEs to start.
    #[arg(short = 'n', long = "npes")]
    pub npes: usize,
    /// Program and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub program: Vec<String>,
}

pub fn run_cli(_args: RunArgs) -> i32 {
    unimplemented!()
}
