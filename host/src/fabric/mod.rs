//! libfabric for the proxy transport (the soft HCA): RDM endpoints with RMA and
//! atomics on any provider (efa, verbs;ofi_rxm, tcp;ofi_rxm, shm).
//!
//! Layers, as for every C library in rshmem:
//! - [`sys`]: bindings generated offline by `scripts/gen-fabric-bindings` (committed;
//!   the build never runs bindgen), with the exported functions as a dynamically
//!   loaded table ([`loader`]; `RSHMEM_FABRIC_LIB` overrides the file).
//! - [`result`]: the headers' `static inline` calls re-implemented over the ops tables,
//!   and `Result` wrappers naming the failing call.
//! - safe RAII types: [`Fabric`] → [`Domain`] → [`MemoryRegion`], [`Endpoint`] (with
//!   its CQ and AV), parents held by `Arc` so teardown order is right.
//!
//! What this module must not do: interpret mlx5 work requests (the soft HCA does), or
//! check remote bounds and keys itself (the target's provider does, and the soft HCA
//! validates its own tables). See docs/fabric.md.

pub mod bench;
mod domain;
mod endpoint;
mod info;
pub mod loader;
pub mod result;
pub mod syndrome;
#[rustfmt::skip]
pub mod sys;

pub use domain::{Domain, Fabric, MemoryRegion, RemoteRegion};
pub use endpoint::{
    AtomicSupport, AtomicType, Completion, CompletionError, Endpoint, FetchOp, Local, PeerAddr,
    Target, MAX_SLOTS,
};
pub(crate) use info::reads_follow_writes;
pub use info::{
    normalize_provider, FabricConfig, FabricInfo, AUTO_ORDER, CAPS, DOMAIN_ENV, MR_MODE_SUPPORTED,
    PROVIDER_ENV,
};
pub use syndrome::syndrome_for;

/// The libfabric version loaded at run time, as `(major, minor)`.
pub fn version() -> crate::Result<(u32, u32)> {
    let v = result::version()?;
    Ok((v >> 16, v & 0xffff))
}
