//! The soft HCA: a CPU engine that executes mlx5 send queues (ARCHITECTURE.md, decision
//! 3), and the proxy transport that lets CPU PEs reach peers through it.
//!
//! - [`queue`]: [`QueueMemory`] (one QP's memory, laid out as mlx5 lays it out) and
//!   [`SendQueue`] (the many-producer protocol: reserve, write, publish in order, doorbell).
//! - [`mr`]: memory regions and protection domains ([`MrTable`]).
//! - [`backend`]: how bytes move ([`Backend`], [`LocalBackend`]).
//! - [`engine`]: [`EngineCore`] (parse, check, execute, complete) and [`SoftHca`] (a thread
//!   running one).
//! - [`ibgda_table`]: the IBGDA queue table and descriptor shared with the CUDA producer
//!   (`rshmem/ibgda/queue.cuh`, the device twin of [`SendQueue`]).
//! - [`discard`]: [`DiscardEngine`], completes WQEs without executing them (producer-rate
//!   benchmarks).
//! - [`fabric`]: [`FabricBackend`], the backend over libfabric (peers on other nodes).
//! - [`proxy`]: what a [`crate::Pe`] uses for peers reached through the soft HCA.
//! - [`status`]: the live queue state published for `rshmem doctor --queues`
//!   (RSHMEM_DEBUG_QUEUES).
//!
//! Design and measured numbers: `docs/soft-hca.md`. Formats: `crate::mlx5` (this module
//! encodes nothing by hand).

pub mod backend;
pub mod discard;
pub mod engine;
pub mod fabric;
pub mod ibgda_table;
pub mod mr;
pub(crate) mod proxy;
pub mod queue;
pub mod status;

pub use backend::{AtomicOp, Backend, LocalBackend, LocalPeer, Op};
pub use discard::DiscardEngine;
pub use engine::{
    CqWait, Drive, EngineCore, EngineQp, QpConfig, QpHandle, SoftHca, Waker, WakerStats,
};
pub use fabric::{FabricBackend, FabricPeer};
pub use mr::{Access, MemoryRegion, MrTable};
pub use queue::{CqMode, CqeReport, Posted, QueueLayout, QueueMemory, SendQueue, SqError};
