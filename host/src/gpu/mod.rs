//! GPU PEs: the host side of rshmem on NVIDIA GPUs (docs/gpu-design.md).
//!
//! - [`driver`]: loading libcuda / NVRTC through cudarc, gated so that an absent library is
//!   an error naming it, never a panic.
//! - [`GpuPe`] ([`pe`]): a CPU-side [`crate::Pe`] (bootstrap, rank, teams) plus the PE's
//!   CUDA device (primary context), stream and GPU symmetric heap ([`heap`], CUDA VMM,
//!   shared with the node's PEs by passing POSIX-fd handles, [`fdpass`]).
//! - [`state`], [`harness`]: `#[repr(C)]` mirrors of the device headers' structs.
//! - [`module`]: embedded PTX, module loading and binding, NVRTC for user kernels.
//! - [`manifest`], [`runner`]: the GPU self-test and benchmark runners behind
//!   `rshmem selftest --device gpu` and `rshmem bench ... --device gpu`.
//! - [`launch`]: grid sizing for collective (co-resident) launches.
//! - [`ibgda`]: GPU PEs over the proxy transport (host heap registered into CUDA, IBGDA
//!   queues drained by the soft HCA); [`ibgda_rate`]: `rshmem bench ibgda-rate`.
//!
//! Nothing here needs CUDA to build; everything that touches a GPU first calls
//! [`driver::driver`]. All CUDA paths are unverified until `scripts/gpu-check` has run on a
//! GPU (docs/gpu-results.md).

pub mod driver;
pub mod ep;
pub mod ep_bench;
pub mod fdpass;
pub mod harness;
pub mod heap;
pub mod ibgda;
pub mod ibgda_rate;
pub mod launch;
pub mod manifest;
pub mod module;
pub mod nic;
pub mod pe;
pub mod runner;
pub mod state;
pub mod traps;

pub use pe::{run_gpu_threads, GpuPe};

/// `rshmem_pattern_u64` of `rshmem/pattern.cuh` (SplitMix64's output step): the test data
/// the kernels write and check.
pub fn pattern_u64(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn pattern_matches_the_header_static_asserts() {
        assert_eq!(super::pattern_u64(0, 0), 0xe220a8397b1dcdaf);
        assert_eq!(super::pattern_u64(0, 1), 0x6e789e6aa1b965f4);
        assert_eq!(super::pattern_u64(1234, 5), 0xb0bfb29e8c72a511);
    }
}
