//! rshmem: a GPU-initiated networking runtime in the family of NVSHMEM.
//!
//! Every processing element (PE) owns a slice of a *symmetric heap*; PEs read and write
//! each other's slices with one-sided operations (put, get, atomics, signals). This crate
//! is the host side: bootstrap, launcher, symmetric heap, teams, host-initiated RMA over
//! the p2p transport, diagnostics (`doctor`) and benchmarks.
//!
//! The runtime is handle-based: a [`Pe`] is a value, so one process can host one PE or
//! several (one thread each). See the README for what is supported where.

/// `eprintln!` that writes its line with one `write` call. std's writes every formatted
/// piece separately to the unbuffered stderr, so a PE that `rshmem run` stops (SIGTERM,
/// once another PE failed) while it prints its own error left half a line. Defined before
/// the modules, so it replaces std's in this crate (not exported: a user's glob import
/// would make `eprintln!` ambiguous); main.rs has the same three lines. A failed write is
/// ignored (std's would panic on a closed stderr).
macro_rules! eprintln {
    () => {
        $crate::write_stderr_line(::std::string::String::new())
    };
    ($($arg:tt)*) => {
        $crate::write_stderr_line(::std::format!($($arg)*))
    };
}

/// The body of [`eprintln!`]: `line` and a newline in one `write_all`.
#[doc(hidden)]
pub fn write_stderr_line(mut line: String) {
    use std::io::Write;
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

pub mod affinity;
pub mod assist;
pub mod atomic;
pub mod bench;
pub mod bootstrap;
pub mod collectives;
pub mod config;
pub mod copy;
pub mod doctor;
pub mod ep;
pub mod error;
pub mod fabric;
pub mod gpu;
pub mod heap;
pub mod launcher;
pub(crate) mod lock;
pub mod mlx5;
pub mod pe;
mod rma;
pub mod selftest;
pub mod softhca;
mod strided;
pub mod team;
#[cfg(test)]
mod test_child;
pub mod topo;
pub mod types;
pub mod verbs;

pub use assist::{AssistMode, AssistStats};
pub use atomic::{AtomicInt, AtomicWord};
pub use collectives::{ReduceOp, Reducible};
pub use config::Settings;
pub use error::{Error, Result};
pub use pe::{run_threads, Pe, PeConfig};
pub use team::Team;
pub use types::{Cmp, Element, SignalOp, SymPtr};
