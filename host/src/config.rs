//! Everything rshmem reads from the environment, parsed in one place.
//!
//! INTERFACE SKELETON — to be implemented (see the bootstrap/config task).
use crate::error::Result;
use std::time::Duration;

/// Which launcher's variables supplied rank and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchSource {
    Rshmem,
    Torchrun,
    OpenMpi,
    Slurm,
    Pmi,
}

/// Rank, size and root address of this PE, from the first launcher variable set present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    pub source: LaunchSource,
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: Option<usize>,
    pub local_size: Option<usize>,
    /// Host of the bootstrap root (RSHMEM_MASTER_ADDR, else MASTER_ADDR).
    pub master_addr: Option<String>,
    /// Port of the bootstrap root (RSHMEM_MASTER_PORT, else MASTER_PORT).
    pub master_port: Option<u16>,
}

impl LaunchInfo {
    /// Reads the process environment. `Ok(None)`: no launcher variables at all.
    pub fn from_env() -> Result<Option<LaunchInfo>> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }
    /// Same, with an injectable lookup (for tests).
    pub fn from_lookup(_get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
        unimplemented!()
    }
}

/// Runtime settings (RSHMEM_SYMMETRIC_SIZE, RSHMEM_TIMEOUT_MS, RSHMEM_TOKEN, RSHMEM_NODE_ID,
/// RSHMEM_ROOT).
#[derive(Debug, Clone)]
pub struct Settings {
    pub symmetric_size: usize,
    pub timeout: Duration,
    pub token: Option<String>,
    pub node_id: String,
    /// RSHMEM_ROOT=external: the bootstrap root already runs (hosted by the launcher);
    /// rank 0 must not host it.
    pub root_external: bool,
}

pub const DEFAULT_SYMMETRIC_SIZE: usize = 256 << 20;
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

impl Settings {
    pub fn from_env() -> Result<Settings> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }
    pub fn from_lookup(_get: impl Fn(&str) -> Option<String>) -> Result<Settings> {
        unimplemented!()
    }
}

/// Parses sizes like `512M`, `2G`, `64k`, `1GiB`, `4096`.
pub fn parse_size(_s: &str) -> std::result::Result<usize, String> {
    unimplemented!()
}
