//! Bootstrap: TCP rendezvous and small collectives among PEs.
//!
//! INTERFACE SKELETON — to be implemented (see the bootstrap task).
use crate::error::Result;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A set of PEs taking part in a collective: a team's unique id and its members' world ranks
/// in team order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub uid: u64,
    pub members: Vec<u32>,
}

/// Shared, cheaply pollable record of whether any peer died.
#[derive(Debug, Default)]
pub struct Liveness {}

impl Liveness {
    /// `Err(Error::PeerDied { pe, detail })` once any PE of the job died or the root was lost.
    pub fn check(&self) -> Result<()> {
        unimplemented!()
    }
}

/// The bootstrap root (hub): accepts PEs, runs collectives, reports deaths.
pub struct Root {}

impl Root {
    pub fn bind(_addr: &str, _world_size: usize, _token: &str) -> Result<Root> {
        unimplemented!()
    }
    pub fn local_addr(&self) -> SocketAddr {
        unimplemented!()
    }
    pub fn job_id(&self) -> &str {
        unimplemented!()
    }
    pub fn wait_all_left(&self, _timeout: Duration) {
        unimplemented!()
    }
}

/// What a PE needs to join.
#[derive(Debug, Clone)]
pub struct JoinParams {
    pub rank: usize,
    pub world_size: usize,
    pub root_addr: String,
    pub token: String,
    pub node_id: String,
    pub timeout: Duration,
}

/// One PE's connection to the root.
pub struct Bootstrap {}

impl Bootstrap {
    pub fn join(_p: &JoinParams) -> Result<Bootstrap> {
        unimplemented!()
    }
    pub fn rank(&self) -> usize {
        unimplemented!()
    }
    pub fn world_size(&self) -> usize {
        unimplemented!()
    }
    pub fn job_id(&self) -> &str {
        unimplemented!()
    }
    pub fn node_ids(&self) -> &[String] {
        unimplemented!()
    }
    pub fn liveness(&self) -> Arc<Liveness> {
        unimplemented!()
    }
    pub fn allgather(&self, _g: &Group, _data: &[u8]) -> Result<Vec<Vec<u8>>> {
        unimplemented!()
    }
    pub fn barrier(&self, _g: &Group) -> Result<()> {
        unimplemented!()
    }
    pub fn broadcast(&self, _g: &Group, _root_index: usize, _data: &[u8]) -> Result<Vec<u8>> {
        unimplemented!()
    }
    pub fn finalize(self) -> Result<()> {
        unimplemented!()
    }
}
