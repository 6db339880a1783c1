//! mlx5 queue formats: the one wire format of rshmem's network path (ARCHITECTURE.md,
//! decision 3). GPUs and CPU PEs post these WQEs; a ConnectX NIC or the soft HCA executes
//! them and answers with these CQEs.
//!
//! One file per concept: [`wire`] (big-endian integers, the plain-bytes contract),
//! [`wqe`] (segments, opcodes, builders, parser), [`cqe`] (CQEs, syndromes, ownership),
//! [`doorbell`] (doorbell records and word), [`ring`] (slot math, wrap-around copies),
//! [`decode`] (the `rshmem mlx5 decode` listing). Facts: `shared/design/MLX5.md`; the
//! CUDA C++ twin is `device-kernels/include/rshmem/mlx5.cuh`.
//!
//! This module encodes and decodes bytes; it performs no I/O, owns no queue memory, and
//! orders no stores against the NIC.

pub mod cqe;
pub mod decode;
pub mod doorbell;
pub mod ring;
pub mod wire;
pub mod wqe;

pub use cqe::{Cqe64, CqeOpcode, Syndrome};
pub use wire::{Be16, Be32, Be64, WireStruct};
pub use wqe::{parse_wqe, BuildError, FenceMode, ParsedWqe, WqeCtrl, WqeError, WqeOp, WqeSize};
