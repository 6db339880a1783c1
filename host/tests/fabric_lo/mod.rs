//! The soft HCA's fabric backend on real libfabric (tcp;ofi_rxm over `lo`), as the
//! `fabric_backend_*` tests drive it by hand. A missing libfabric is a failure, not a skip.

use rshmem::config::FabricSwitches;
use rshmem::fabric::{Fabric, FabricConfig, MR_MODE_SUPPORTED};
use rshmem::softhca::FabricBackend;
use std::sync::Arc;
use std::time::Duration;

/// tcp;ofi_rxm on `lo` with `timeout`, and a backend on it with eager confirmation, no
/// handover and no delivery-complete writes (every write confirmed by its flush READ,
/// nothing parked).
pub fn backend_on_lo(timeout: Duration) -> (Arc<Fabric>, FabricBackend) {
    let cfg = FabricConfig {
        provider: Some("tcp;ofi_rxm".into()),
        domain: Some("lo".into()),
        mr_mode: MR_MODE_SUPPORTED,
        timeout,
        ask_rma_order: true,
    };
    let fabric = Fabric::open(&cfg).unwrap_or_else(|e| {
        panic!("cannot open libfabric tcp;ofi_rxm: {e} (apt-get install -y libfabric1)")
    });
    let switches = FabricSwitches {
        handover: false,
        lazy_confirm: false,
        delivery_complete: false,
    };
    let backend = FabricBackend::open_on(&fabric, switches).expect("backend");
    (fabric, backend)
}
