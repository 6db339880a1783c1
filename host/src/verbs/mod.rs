//! rdma-core for the real-hardware IBGDA path: ConnectX (mlx5) queues that GPU threads
//! (or CPU PEs, through the same [`SendQueue`]) write directly.
//!
//! Layers, as for every C library in rshmem:
//! - [`sys`]: bindings generated offline by `scripts/gen-verbs-bindings` from the rdma-core
//!   44 headers (committed; the build never runs bindgen), as two dynamically loaded
//!   tables: libibverbs.so.1 and libmlx5.so.1 ([`loader`]).
//! - [`result`]: the symbol lookups and `Result` checks; every failing verb becomes
//!   [`Error::Verbs`](crate::Error::Verbs) naming it with errno and strerror.
//! - safe RAII types: [`Context`] → [`ProtectionDomain`] → [`MemoryRegion`],
//!   [`CompletionQueue`], [`QueuePair`] (parents held by `Arc`).
//!
//! [`relay`]: the CPU doorbell relay, for GPU producers whose driver cannot map the UAR.
//!
//! Pure pieces (unit-tested on any machine): QP state-transition attributes ([`qp`]),
//! the address record exchanged over the bootstrap ([`addr`]), the check of the queues
//! mlx5dv reports ([`dv::NicQueues::validate`]), and the path planner ([`plan`]).
//!
//! What this module must not do: call CUDA (mapping the UAR and the queues into the GPU
//! belongs to the GPU layer; [`plan::plan_path`] takes its outcome as a boolean), or run
//! the soft HCA. See docs/ibgda.md for what has run and what has only been compiled.
//!
//! [`SendQueue`]: crate::softhca::queue::SendQueue

pub mod addr;
pub mod device;
pub mod dv;
pub mod loader;
pub mod memlock;
pub mod plan;
pub mod qp;
pub mod relay;
pub(crate) mod result;
#[rustfmt::skip]
pub mod sys;

pub use addr::{AddrError, AddressRecord};
pub use device::{
    list_devices, wc_status_str, CompletionQueue, Context, DeviceInfo, Gid, GidKind, HeapMemory,
    MemoryRegion, PortInfo, ProtectionDomain, WorkCompletion,
};
pub use dv::{NicQueueError, NicQueues};
pub use plan::{plan_path, HeapRegistration, Path, PathCaps, PathPlan};
pub use qp::{connect_all, Connected, HeapKey, QpCaps, QueuePair, RcParams};
