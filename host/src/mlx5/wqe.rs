//! Send-queue work queue entries (WQEs): segments, opcodes, fence modes, typed builders and
//! a validating parser.
//!
//! A WQE is one to 16 WQE basic blocks (WQEBBs) of 64 bytes, made of 16-byte units ("ds"):
//! a control segment first, then the segments its opcode needs. Builders write a complete
//! WQE into a contiguous byte slice (zero-padding the last WQEBB) and return its size; the
//! parser decodes a contiguous WQE and rejects anything a ConnectX would fail, naming the
//! CQE syndrome the soft HCA reports for it. Ring placement (slots, wrap) lives in
//! [`super::ring`]; this module never sees a ring.
//!
//! The same encoders exist in CUDA C++ in `device-kernels/include/rshmem/mlx5.cuh`
//! (namespace `rshmem::mlx5`, snake_case names); `host/tests/mlx5_cpp_parity.rs` checks
//! they produce identical bytes.

use super::cqe::Syndrome;
use super::wire::{wire_struct, Be16, Be32, Be64, WireStruct};

/// Bytes in a WQE basic block.
pub const WQEBB: usize = 64;
/// Bytes in one "ds" unit.
pub const DS_BYTES: usize = 16;
/// Most WQEBBs one WQE may span.
pub const MAX_WQEBBS: usize = 16;
/// Most ds units one WQE may have (16 WQEBBs × 4).
pub const MAX_DS: u8 = (MAX_WQEBBS * WQEBB / DS_BYTES) as u8;
/// Bit 31 of a segment's first word marks an inline-data segment (`MLX5_INLINE_SEG`).
pub const INLINE_SEG: u32 = 0x8000_0000;
/// Inline payload limit the parser applies unless told otherwise (the soft HCA passes its
/// QP's `max_inline_data`).
pub const DEFAULT_MAX_INLINE: u32 = 256;

/// `fm_ce_se` bit 1: solicited event.
pub const CTRL_SOLICITED: u8 = 0x02;
/// `fm_ce_se` CE = 2 (bits 3:2): always generate a CQE ("CQ update").
pub const CTRL_CQ_UPDATE: u8 = 0x08;

/// Opmod of masked (extended) atomics: `0x08 | (log2(size) - 2)`.
pub const OPMOD_MASKED_4B: u8 = 0x08;
/// Opmod of 8-byte masked atomics.
pub const OPMOD_MASKED_8B: u8 = 0x09;

/// Send opcodes (bits 7:0 of `opmod_idx_opcode`).
pub mod opcode {
    pub const NOP: u8 = 0x00;
    pub const SEND_INVAL: u8 = 0x01;
    pub const RDMA_WRITE: u8 = 0x08;
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    pub const SEND: u8 = 0x0a;
    pub const SEND_IMM: u8 = 0x0b;
    pub const TSO: u8 = 0x0e;
    pub const RDMA_READ: u8 = 0x10;
    pub const ATOMIC_CS: u8 = 0x11;
    pub const ATOMIC_FA: u8 = 0x12;
    pub const ATOMIC_MASKED_CS: u8 = 0x14;
    pub const ATOMIC_MASKED_FA: u8 = 0x15;
    pub const FMR: u8 = 0x19;
    pub const LOCAL_INVAL: u8 = 0x1b;
    pub const CONFIG_CMD: u8 = 0x1f;
    pub const SET_PSV: u8 = 0x20;
    /// NVSHMEM's cheap flush: ctrl + one data segment the NIC reads.
    pub const DUMP: u8 = 0x23;
    pub const UMR: u8 = 0x25;
    pub const TAG_MATCHING: u8 = 0x28;
    pub const FLOW_TBL_ACCESS: u8 = 0x2c;
    pub const MMO: u8 = 0x2f;

    /// Name of a known opcode (rdma-core's without the `MLX5_OPCODE_` prefix).
    pub fn name(op: u8) -> Option<&'static str> {
        Some(match op {
            NOP => "NOP",
            SEND_INVAL => "SEND_INVAL",
            RDMA_WRITE => "RDMA_WRITE",
            RDMA_WRITE_IMM => "RDMA_WRITE_IMM",
            SEND => "SEND",
            SEND_IMM => "SEND_IMM",
            TSO => "TSO",
            RDMA_READ => "RDMA_READ",
            ATOMIC_CS => "ATOMIC_CS",
            ATOMIC_FA => "ATOMIC_FA",
            ATOMIC_MASKED_CS => "ATOMIC_MASKED_CS",
            ATOMIC_MASKED_FA => "ATOMIC_MASKED_FA",
            FMR => "FMR",
            LOCAL_INVAL => "LOCAL_INVAL",
            CONFIG_CMD => "CONFIG_CMD",
            SET_PSV => "SET_PSV",
            DUMP => "DUMP",
            UMR => "UMR",
            TAG_MATCHING => "TAG_MATCHING",
            FLOW_TBL_ACCESS => "FLOW_TBL_ACCESS",
            MMO => "MMO",
            _ => return None,
        })
    }
}

/// Fence mode, bits 7:5 of `fm_ce_se`.
///
/// Trap: rdma-core's `MLX5_WQE_CTRL_FENCE` (0x80) is [`FenceMode::SmallAndFence`]; the
/// kernel's `MLX5_FENCE_MODE_FENCE` (0x40) is [`FenceMode::Fence`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum FenceMode {
    #[default]
    None = 0,
    InitiatorSmall = 1,
    Fence = 2,
    StrongOrdering = 3,
    SmallAndFence = 4,
}

impl FenceMode {
    /// The mode's bits in `fm_ce_se`.
    pub const fn bits(self) -> u8 {
        (self as u8) << 5
    }
    /// Decodes bits 7:5 of `fm_ce_se`; `None` for the reserved values 5–7.
    pub const fn from_fm_ce_se(b: u8) -> Option<Self> {
        Some(match b >> 5 {
            0 => FenceMode::None,
            1 => FenceMode::InitiatorSmall,
            2 => FenceMode::Fence,
            3 => FenceMode::StrongOrdering,
            4 => FenceMode::SmallAndFence,
            _ => return None,
        })
    }
}

/// Control segment (`struct mlx5_wqe_ctrl_seg`, 16 B).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CtrlSeg {
    /// Bits 31:24 opmod, 23:8 WQE index, 7:0 opcode.
    pub opmod_idx_opcode: Be32,
    /// Bits 31:8 QP number, 7:0 ds (segment count including this one).
    pub qpn_ds: Be32,
    pub signature: u8,
    pub dci_stream_channel_id: Be16,
    /// Fence mode 7:5, CE 3:2, SE 1.
    pub fm_ce_se: u8,
    /// Immediate, stored as given (pass it big-endian, as `mlx5dv_set_ctrl_seg` expects).
    pub imm: Be32,
}
wire_struct!(CtrlSeg, 16);

impl CtrlSeg {
    /// Same arguments, in the same order, as rdma-core's `mlx5dv_set_ctrl_seg` (opcode
    /// before opmod). `qpn` keeps its low 24 bits.
    #[allow(clippy::too_many_arguments)]
    pub const fn new(
        pi: u16,
        opcode: u8,
        opmod: u8,
        qpn: u32,
        fm_ce_se: u8,
        ds: u8,
        signature: u8,
        imm: Be32,
    ) -> Self {
        CtrlSeg {
            opmod_idx_opcode: Be32::new(
                ((opmod as u32) << 24) | ((pi as u32) << 8) | opcode as u32,
            ),
            qpn_ds: Be32::new(((qpn & 0xff_ffff) << 8) | ds as u32),
            signature,
            dci_stream_channel_id: Be16::new(0),
            fm_ce_se,
            imm,
        }
    }
    pub const fn opcode(&self) -> u8 {
        self.opmod_idx_opcode.get() as u8
    }
    pub const fn opmod(&self) -> u8 {
        (self.opmod_idx_opcode.get() >> 24) as u8
    }
    pub const fn wqe_index(&self) -> u16 {
        (self.opmod_idx_opcode.get() >> 8) as u16
    }
    pub const fn qpn(&self) -> u32 {
        self.qpn_ds.get() >> 8
    }
    pub const fn ds(&self) -> u8 {
        self.qpn_ds.get() as u8
    }
    pub const fn fence(&self) -> Option<FenceMode> {
        FenceMode::from_fm_ce_se(self.fm_ce_se)
    }
}

/// Remote-address segment (`struct mlx5_wqe_raddr_seg`, 16 B).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RaddrSeg {
    pub raddr: Be64,
    pub rkey: Be32,
    pub reserved: Be32,
}
wire_struct!(RaddrSeg, 16);

impl RaddrSeg {
    pub const fn new(raddr: u64, rkey: u32) -> Self {
        RaddrSeg {
            raddr: Be64::new(raddr),
            rkey: Be32::new(rkey),
            reserved: Be32::new(0),
        }
    }
}

/// Data (scatter/gather) segment (`struct mlx5_wqe_data_seg`, 16 B).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DataSeg {
    pub byte_count: Be32,
    pub lkey: Be32,
    pub addr: Be64,
}
wire_struct!(DataSeg, 16);

impl DataSeg {
    /// Same argument order as `mlx5dv_set_data_seg(seg, length, lkey, address)`.
    pub const fn new(byte_count: u32, lkey: u32, addr: u64) -> Self {
        DataSeg {
            byte_count: Be32::new(byte_count),
            lkey: Be32::new(lkey),
            addr: Be64::new(addr),
        }
    }
}

/// Inline-data segment header (`struct mlx5_wqe_inl_data_seg`, 4 B): `BE32(len | INLINE_SEG)`;
/// the data follows and the segment is padded to 16 B.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InlineHdr {
    pub byte_count: Be32,
}
wire_struct!(InlineHdr, 4);

/// Atomic segment (`struct mlx5_wqe_atomic_seg`, 16 B). Fetch-add keeps the addend in
/// `swap_add`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AtomicSeg {
    pub swap_add: Be64,
    pub compare: Be64,
}
wire_struct!(AtomicSeg, 16);

/// 4-byte masked compare-and-swap segment (16 B).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MaskedCs32Seg {
    pub swap: Be32,
    pub compare: Be32,
    pub swap_mask: Be32,
    pub compare_mask: Be32,
}
wire_struct!(MaskedCs32Seg, 16);

/// 4-byte masked fetch-add segment (16 B).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MaskedFa32Seg {
    pub add: Be32,
    pub field_boundary: Be32,
    pub reserved: Be64,
}
wire_struct!(MaskedFa32Seg, 16);

/// 8-byte masked fetch-add segment (16 B).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MaskedFa64Seg {
    pub add: Be64,
    pub field_boundary: Be64,
}
wire_struct!(MaskedFa64Seg, 16);

/// 8-byte masked compare-and-swap: two 16-B segments (hence ds = 5 for the WQE).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MaskedCs64Seg {
    pub swap: Be64,
    pub compare: Be64,
    pub swap_mask: Be64,
    pub compare_mask: Be64,
}
wire_struct!(MaskedCs64Seg, 32);

/// What a builder needs for the control segment besides opcode and ds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WqeCtrl {
    /// The 16-bit WQE index (producer index of the first WQEBB; wraps at 0xffff).
    pub wqe_index: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    pub fence: FenceMode,
    /// Ask for a CQE (CE = 2).
    pub cq_update: bool,
    pub solicited: bool,
}

impl WqeCtrl {
    /// The `fm_ce_se` byte.
    pub const fn fm_ce_se(&self) -> u8 {
        self.fence.bits()
            | if self.cq_update { CTRL_CQ_UPDATE } else { 0 }
            | if self.solicited { CTRL_SOLICITED } else { 0 }
    }
}

/// Payload of a write or send: scatter/gather entries or inline bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Zero or more data segments (zero: a zero-length operation).
    Sge(&'a [DataSeg]),
    /// Bytes copied into the WQE.
    Inline(&'a [u8]),
}

/// One WQE's operation and operands, independent of where it lies. Builders take it;
/// the parser returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqeOp<'a> {
    /// Ctrl only (ds = 1 when built; the parser accepts any ds and ignores the rest).
    Nop,
    /// NVSHMEM's DUMP flush: ctrl + one data segment.
    Dump {
        local: DataSeg,
    },
    RdmaWrite {
        remote: RaddrSeg,
        payload: Payload<'a>,
    },
    /// `imm` in host order; the WQE carries `BE32(imm)`.
    RdmaWriteImm {
        remote: RaddrSeg,
        payload: Payload<'a>,
        imm: u32,
    },
    Send {
        payload: Payload<'a>,
    },
    SendImm {
        payload: Payload<'a>,
        imm: u32,
    },
    RdmaRead {
        remote: RaddrSeg,
        local: &'a [DataSeg],
    },
    /// 8-byte compare-and-swap; the old value lands at `result` (byte_count 8).
    AtomicCs {
        remote: RaddrSeg,
        compare: u64,
        swap: u64,
        result: Sge8,
    },
    /// 8-byte fetch-add.
    AtomicFa {
        remote: RaddrSeg,
        add: u64,
        result: Sge8,
    },
    MaskedCs32 {
        remote: RaddrSeg,
        swap: u32,
        compare: u32,
        swap_mask: u32,
        compare_mask: u32,
        result: Sge8,
    },
    MaskedFa32 {
        remote: RaddrSeg,
        add: u32,
        field_boundary: u32,
        result: Sge8,
    },
    MaskedCs64 {
        remote: RaddrSeg,
        swap: u64,
        compare: u64,
        swap_mask: u64,
        compare_mask: u64,
        result: Sge8,
    },
    MaskedFa64 {
        remote: RaddrSeg,
        add: u64,
        field_boundary: u64,
        result: Sge8,
    },
}

/// Where an atomic's fetched old value lands (its byte count is the operand size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sge8 {
    pub addr: u64,
    pub lkey: u32,
}

impl WqeOp<'_> {
    /// The opcode this operation is sent with.
    pub const fn opcode(&self) -> u8 {
        match self {
            WqeOp::Nop => opcode::NOP,
            WqeOp::Dump { .. } => opcode::DUMP,
            WqeOp::RdmaWrite { .. } => opcode::RDMA_WRITE,
            WqeOp::RdmaWriteImm { .. } => opcode::RDMA_WRITE_IMM,
            WqeOp::Send { .. } => opcode::SEND,
            WqeOp::SendImm { .. } => opcode::SEND_IMM,
            WqeOp::RdmaRead { .. } => opcode::RDMA_READ,
            WqeOp::AtomicCs { .. } => opcode::ATOMIC_CS,
            WqeOp::AtomicFa { .. } => opcode::ATOMIC_FA,
            WqeOp::MaskedCs32 { .. } | WqeOp::MaskedCs64 { .. } => opcode::ATOMIC_MASKED_CS,
            WqeOp::MaskedFa32 { .. } | WqeOp::MaskedFa64 { .. } => opcode::ATOMIC_MASKED_FA,
        }
    }

    /// The opmod this operation is sent with.
    pub const fn opmod(&self) -> u8 {
        match self {
            WqeOp::MaskedCs32 { .. } | WqeOp::MaskedFa32 { .. } => OPMOD_MASKED_4B,
            WqeOp::MaskedCs64 { .. } | WqeOp::MaskedFa64 { .. } => OPMOD_MASKED_8B,
            _ => 0,
        }
    }

    /// The immediate carried in the control segment (host order; 0 if none).
    pub const fn imm(&self) -> u32 {
        match self {
            WqeOp::RdmaWriteImm { imm, .. } | WqeOp::SendImm { imm, .. } => *imm,
            _ => 0,
        }
    }
}

/// Size of a WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WqeSize {
    /// 16-byte units including the control segment (the `ds` field).
    pub ds: u8,
}

impl WqeSize {
    /// WQEBBs the WQE occupies: `ceil(ds * 16 / 64)`; the producer index advances by this.
    pub const fn wqebbs(self) -> u16 {
        (self.ds as u16).div_ceil(4)
    }
    /// Bytes the WQE occupies in the ring (`wqebbs * 64`).
    pub const fn bytes(self) -> usize {
        self.wqebbs() as usize * WQEBB
    }
}

/// ds units an inline segment of `len` payload bytes takes: `align(len + 4, 16) / 16`.
pub const fn inline_ds(len: usize) -> usize {
    (len + 4).div_ceil(DS_BYTES)
}

fn payload_ds(p: &Payload<'_>) -> usize {
    match p {
        Payload::Sge(s) => s.len(),
        Payload::Inline(d) => inline_ds(d.len()),
    }
}

/// Why a builder could not write a WQE (a caller error, not a wire fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    #[error("WQE needs {need} bytes ({ds} ds rounded up to whole WQEBBs); the buffer has {have}")]
    BufferTooSmall { need: usize, have: usize, ds: usize },
    #[error("WQE would need {ds} ds units; at most {MAX_DS} (16 WQEBBs) fit")]
    TooLarge { ds: usize },
    #[error("QP number {qpn:#x} does not fit in 24 bits")]
    QpnTooLarge { qpn: u32 },
}

/// Writes the WQE for `op` at the start of `buf` (which must hold whole WQEBBs) and returns
/// its size. Bytes past the last segment up to the end of the last WQEBB are zeroed.
pub fn build_wqe(buf: &mut [u8], ctrl: &WqeCtrl, op: &WqeOp<'_>) -> Result<WqeSize, BuildError> {
    if ctrl.qpn > 0xff_ffff {
        return Err(BuildError::QpnTooLarge { qpn: ctrl.qpn });
    }
    let ds = 1 + match op {
        WqeOp::Nop => 0,
        WqeOp::Dump { .. } => 1,
        WqeOp::RdmaWrite { payload, .. } | WqeOp::RdmaWriteImm { payload, .. } => {
            1 + payload_ds(payload)
        }
        WqeOp::Send { payload } | WqeOp::SendImm { payload, .. } => payload_ds(payload),
        WqeOp::RdmaRead { local, .. } => 1 + local.len(),
        WqeOp::MaskedCs64 { .. } => 4,
        _ => 3, // raddr + atomic + data
    };
    if ds > MAX_DS as usize {
        return Err(BuildError::TooLarge { ds });
    }
    let size = WqeSize { ds: ds as u8 };
    let need = size.bytes();
    let have = buf.len();
    let wqe = buf
        .get_mut(..need)
        .ok_or(BuildError::BufferTooSmall { need, have, ds })?;
    wqe.fill(0);
    let c = CtrlSeg::new(
        ctrl.wqe_index,
        op.opcode(),
        op.opmod(),
        ctrl.qpn,
        ctrl.fm_ce_se(),
        size.ds,
        0,
        Be32::new(op.imm()),
    );
    let mut w = SegWriter { buf: wqe, off: 0 };
    w.put(&c);
    match *op {
        WqeOp::Nop => {}
        WqeOp::Dump { local } => w.put(&local),
        WqeOp::RdmaWrite { remote, payload }
        | WqeOp::RdmaWriteImm {
            remote, payload, ..
        } => {
            w.put(&remote);
            w.payload(payload);
        }
        WqeOp::Send { payload } | WqeOp::SendImm { payload, .. } => w.payload(payload),
        WqeOp::RdmaRead { remote, local } => {
            w.put(&remote);
            for d in local {
                w.put(d);
            }
        }
        WqeOp::AtomicCs {
            remote,
            compare,
            swap,
            result,
        } => {
            w.put(&remote);
            w.put(&AtomicSeg {
                swap_add: swap.into(),
                compare: compare.into(),
            });
            w.put(&result_seg(result, 8));
        }
        WqeOp::AtomicFa {
            remote,
            add,
            result,
        } => {
            w.put(&remote);
            w.put(&AtomicSeg {
                swap_add: add.into(),
                compare: Be64::new(0),
            });
            w.put(&result_seg(result, 8));
        }
        WqeOp::MaskedCs32 {
            remote,
            swap,
            compare,
            swap_mask,
            compare_mask,
            result,
        } => {
            w.put(&remote);
            w.put(&MaskedCs32Seg {
                swap: swap.into(),
                compare: compare.into(),
                swap_mask: swap_mask.into(),
                compare_mask: compare_mask.into(),
            });
            w.put(&result_seg(result, 4));
        }
        WqeOp::MaskedFa32 {
            remote,
            add,
            field_boundary,
            result,
        } => {
            w.put(&remote);
            w.put(&MaskedFa32Seg {
                add: add.into(),
                field_boundary: field_boundary.into(),
                reserved: Be64::new(0),
            });
            w.put(&result_seg(result, 4));
        }
        WqeOp::MaskedCs64 {
            remote,
            swap,
            compare,
            swap_mask,
            compare_mask,
            result,
        } => {
            w.put(&remote);
            w.put(&MaskedCs64Seg {
                swap: swap.into(),
                compare: compare.into(),
                swap_mask: swap_mask.into(),
                compare_mask: compare_mask.into(),
            });
            w.put(&result_seg(result, 8));
        }
        WqeOp::MaskedFa64 {
            remote,
            add,
            field_boundary,
            result,
        } => {
            w.put(&remote);
            w.put(&MaskedFa64Seg {
                add: add.into(),
                field_boundary: field_boundary.into(),
            });
            w.put(&result_seg(result, 8));
        }
    }
    debug_assert_eq!(w.off, size.ds as usize * DS_BYTES);
    Ok(size)
}

const fn result_seg(r: Sge8, len: u32) -> DataSeg {
    DataSeg::new(len, r.lkey, r.addr)
}

/// Appends segments to a WQE buffer already sized (by `build_wqe`) to hold them all.
struct SegWriter<'b> {
    buf: &'b mut [u8],
    off: usize,
}

impl SegWriter<'_> {
    fn put<T: WireStruct>(&mut self, s: &T) {
        self.buf[self.off..self.off + T::SIZE].copy_from_slice(s.as_bytes());
        self.off += T::SIZE;
    }
    fn payload(&mut self, p: Payload<'_>) {
        match p {
            Payload::Sge(s) => s.iter().for_each(|d| self.put(d)),
            Payload::Inline(d) => {
                let hdr = InlineHdr {
                    byte_count: Be32::new(d.len() as u32 | INLINE_SEG),
                };
                self.buf[self.off..self.off + 4].copy_from_slice(hdr.as_bytes());
                self.buf[self.off + 4..self.off + 4 + d.len()].copy_from_slice(d);
                // The padding up to the next 16-B unit was zeroed with the whole WQE.
                self.off += inline_ds(d.len()) * DS_BYTES;
            }
        }
    }
}

macro_rules! builder {
    ($(#[$m:meta])* $name:ident ( $($arg:ident : $ty:ty),* ) => $op:expr) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name(buf: &mut [u8], ctrl: &WqeCtrl, $($arg: $ty),*) -> Result<WqeSize, BuildError> {
            build_wqe(buf, ctrl, &$op)
        }
    };
}

builder!(
    /// NOP: ctrl only, ds = 1.
    nop() => WqeOp::Nop);
builder!(
    /// RDMA write of one local buffer (ds = 3).
    rdma_write(remote: RaddrSeg, local: DataSeg) =>
    WqeOp::RdmaWrite { remote, payload: Payload::Sge(std::slice::from_ref(&local)) });
builder!(
    /// RDMA write with the payload inline (ds = 2 + align(len+4,16)/16; 3 for ≤ 12 B).
    rdma_write_inline(remote: RaddrSeg, data: &[u8]) =>
    WqeOp::RdmaWrite { remote, payload: Payload::Inline(data) });
builder!(
    /// RDMA write with immediate (host-order `imm`, sent as BE32) of one local buffer.
    rdma_write_imm(remote: RaddrSeg, local: DataSeg, imm: u32) =>
    WqeOp::RdmaWriteImm { remote, payload: Payload::Sge(std::slice::from_ref(&local)), imm });
builder!(
    /// RDMA read into one local buffer (ds = 3).
    rdma_read(remote: RaddrSeg, local: DataSeg) =>
    WqeOp::RdmaRead { remote, local: std::slice::from_ref(&local) });
builder!(
    /// 8-byte compare-and-swap (ds = 4).
    atomic_cs(remote: RaddrSeg, result: Sge8, compare: u64, swap: u64) =>
    WqeOp::AtomicCs { remote, compare, swap, result });
builder!(
    /// 8-byte fetch-add (ds = 4).
    atomic_fa(remote: RaddrSeg, result: Sge8, add: u64) =>
    WqeOp::AtomicFa { remote, add, result });
builder!(
    /// 4-byte masked compare-and-swap (opmod 0x08, ds = 4).
    masked_cs32(remote: RaddrSeg, result: Sge8, swap: u32, compare: u32, swap_mask: u32, compare_mask: u32) =>
    WqeOp::MaskedCs32 { remote, swap, compare, swap_mask, compare_mask, result });
builder!(
    /// 4-byte masked fetch-add (opmod 0x08, ds = 4).
    masked_fa32(remote: RaddrSeg, result: Sge8, add: u32, field_boundary: u32) =>
    WqeOp::MaskedFa32 { remote, add, field_boundary, result });
builder!(
    /// 8-byte masked compare-and-swap (opmod 0x09, ds = 5: two WQEBBs).
    masked_cs64(remote: RaddrSeg, result: Sge8, swap: u64, compare: u64, swap_mask: u64, compare_mask: u64) =>
    WqeOp::MaskedCs64 { remote, swap, compare, swap_mask, compare_mask, result });
builder!(
    /// 8-byte masked fetch-add (opmod 0x09, ds = 4).
    masked_fa64(remote: RaddrSeg, result: Sge8, add: u64, field_boundary: u64) =>
    WqeOp::MaskedFa64 { remote, add, field_boundary, result });

/// A malformed WQE. Each case names the CQE syndrome a ConnectX reports for it
/// ([`WqeError::syndrome`]), which the soft HCA puts into its error CQE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WqeError {
    #[error("WQE truncated: {len} bytes, a control segment needs 16")]
    Truncated { len: usize },
    #[error("unknown opcode {opcode:#04x}")]
    UnknownOpcode { opcode: u8 },
    #[error("opcode {opcode:#04x} ({name}) is not supported by rshmem queues", name = opcode::name(*opcode).unwrap_or("?"))]
    UnsupportedOpcode { opcode: u8 },
    #[error("ds = 0 (a WQE has at least its control segment)")]
    ZeroDs,
    #[error("ds = {ds} exceeds {MAX_DS} (16 WQEBBs)")]
    DsTooLarge { ds: u8 },
    #[error("ds = {ds} ({need} bytes) runs past the {len} bytes provided")]
    DsPastBuffer { ds: u8, need: usize, len: usize },
    #[error("opmod {opmod:#04x} is invalid for masked atomic opcode {opcode:#04x} (0x08: 4 B, 0x09: 8 B)")]
    BadOpmod { opcode: u8, opmod: u8 },
    #[error("opcode {opcode:#04x} needs a {segment} segment at ds {at}, but ds = {ds}")]
    MissingSegment {
        opcode: u8,
        segment: &'static str,
        at: u8,
        ds: u8,
    },
    #[error("opcode {opcode:#04x} uses {used} ds units but ds = {ds}")]
    ExtraSegments { opcode: u8, used: u8, ds: u8 },
    #[error("opcode {opcode:#04x} does not take inline data (at ds {at})")]
    InlineNotAllowed { opcode: u8, at: u8 },
    #[error("inline segment at ds {at} mixed with data segments")]
    InlineMixed { at: u8 },
    #[error("inline length {len} exceeds the limit {max}")]
    InlineTooLong { len: u32, max: u32 },
    #[error("inline length {len} needs {need} ds units at ds {at}; only {left} remain")]
    InlineOverrun {
        len: u32,
        at: u8,
        need: u8,
        left: u8,
    },
    #[error("atomic result segment has byte_count {byte_count}; the operand size is {expected}")]
    AtomicLength { byte_count: u32, expected: u32 },
}

impl WqeError {
    /// The ConnectX CQE syndrome for this fault: lengths → LOCAL_LENGTH (0x01), everything
    /// else (opcode, ds, opmod, segment layout) → LOCAL_QP_OP (0x02).
    pub const fn syndrome(&self) -> Syndrome {
        match self {
            WqeError::InlineTooLong { .. }
            | WqeError::InlineOverrun { .. }
            | WqeError::AtomicLength { .. } => Syndrome::LocalLength,
            _ => Syndrome::LocalQpOp,
        }
    }

    /// The variant's name (used by the malformed-WQE corpus to record expectations).
    pub const fn kind(&self) -> &'static str {
        match self {
            WqeError::Truncated { .. } => "Truncated",
            WqeError::UnknownOpcode { .. } => "UnknownOpcode",
            WqeError::UnsupportedOpcode { .. } => "UnsupportedOpcode",
            WqeError::ZeroDs => "ZeroDs",
            WqeError::DsTooLarge { .. } => "DsTooLarge",
            WqeError::DsPastBuffer { .. } => "DsPastBuffer",
            WqeError::BadOpmod { .. } => "BadOpmod",
            WqeError::MissingSegment { .. } => "MissingSegment",
            WqeError::ExtraSegments { .. } => "ExtraSegments",
            WqeError::InlineNotAllowed { .. } => "InlineNotAllowed",
            WqeError::InlineMixed { .. } => "InlineMixed",
            WqeError::InlineTooLong { .. } => "InlineTooLong",
            WqeError::InlineOverrun { .. } => "InlineOverrun",
            WqeError::AtomicLength { .. } => "AtomicLength",
        }
    }
}

/// A decoded, validated WQE, borrowing its inline data and data segments from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedWqe<'a> {
    pub ctrl: CtrlSeg,
    pub op: WqeOp<'a>,
    pub size: WqeSize,
}

/// One decoded segment, in WQE order (for listings; [`ParsedWqe::op`] is the semantic view).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment<'a> {
    Ctrl(CtrlSeg),
    Raddr(RaddrSeg),
    Data(DataSeg),
    Inline(&'a [u8]),
    Atomic(AtomicSeg),
    MaskedCs32(MaskedCs32Seg),
    MaskedFa32(MaskedFa32Seg),
    MaskedCs64(MaskedCs64Seg),
    MaskedFa64(MaskedFa64Seg),
}

impl<'a> ParsedWqe<'a> {
    /// The WQE's segments in order, starting with the control segment. A NOP lists only
    /// its control segment (whatever follows it within ds is not read).
    pub fn segments(&self) -> Vec<Segment<'a>> {
        let mut v = vec![Segment::Ctrl(self.ctrl)];
        let payload = |v: &mut Vec<Segment<'a>>, p: Payload<'a>| match p {
            Payload::Sge(s) => v.extend(s.iter().map(|d| Segment::Data(*d))),
            Payload::Inline(d) => v.push(Segment::Inline(d)),
        };
        match self.op {
            WqeOp::Nop => {}
            WqeOp::Dump { local } => v.push(Segment::Data(local)),
            WqeOp::RdmaWrite { remote, payload: p }
            | WqeOp::RdmaWriteImm {
                remote, payload: p, ..
            } => {
                v.push(Segment::Raddr(remote));
                payload(&mut v, p);
            }
            WqeOp::Send { payload: p } | WqeOp::SendImm { payload: p, .. } => payload(&mut v, p),
            WqeOp::RdmaRead { remote, local } => {
                v.push(Segment::Raddr(remote));
                v.extend(local.iter().map(|d| Segment::Data(*d)));
            }
            WqeOp::AtomicCs {
                remote,
                compare,
                swap,
                result,
            } => {
                v.push(Segment::Raddr(remote));
                v.push(Segment::Atomic(AtomicSeg {
                    swap_add: swap.into(),
                    compare: compare.into(),
                }));
                v.push(Segment::Data(result_seg(result, 8)));
            }
            WqeOp::AtomicFa {
                remote,
                add,
                result,
            } => {
                v.push(Segment::Raddr(remote));
                v.push(Segment::Atomic(AtomicSeg {
                    swap_add: add.into(),
                    compare: Be64::new(0),
                }));
                v.push(Segment::Data(result_seg(result, 8)));
            }
            WqeOp::MaskedCs32 {
                remote,
                swap,
                compare,
                swap_mask,
                compare_mask,
                result,
            } => {
                v.push(Segment::Raddr(remote));
                v.push(Segment::MaskedCs32(MaskedCs32Seg {
                    swap: swap.into(),
                    compare: compare.into(),
                    swap_mask: swap_mask.into(),
                    compare_mask: compare_mask.into(),
                }));
                v.push(Segment::Data(result_seg(result, 4)));
            }
            WqeOp::MaskedFa32 {
                remote,
                add,
                field_boundary,
                result,
            } => {
                v.push(Segment::Raddr(remote));
                v.push(Segment::MaskedFa32(MaskedFa32Seg {
                    add: add.into(),
                    field_boundary: field_boundary.into(),
                    reserved: Be64::new(0),
                }));
                v.push(Segment::Data(result_seg(result, 4)));
            }
            WqeOp::MaskedCs64 {
                remote,
                swap,
                compare,
                swap_mask,
                compare_mask,
                result,
            } => {
                v.push(Segment::Raddr(remote));
                v.push(Segment::MaskedCs64(MaskedCs64Seg {
                    swap: swap.into(),
                    compare: compare.into(),
                    swap_mask: swap_mask.into(),
                    compare_mask: compare_mask.into(),
                }));
                v.push(Segment::Data(result_seg(result, 8)));
            }
            WqeOp::MaskedFa64 {
                remote,
                add,
                field_boundary,
                result,
            } => {
                v.push(Segment::Raddr(remote));
                v.push(Segment::MaskedFa64(MaskedFa64Seg {
                    add: add.into(),
                    field_boundary: field_boundary.into(),
                }));
                v.push(Segment::Data(result_seg(result, 8)));
            }
        }
        v
    }
}

/// Decodes and validates the WQE at the start of `bytes` (contiguous: unwrap it from the
/// ring first with [`super::ring::copy_from_ring`]), with the inline limit
/// [`DEFAULT_MAX_INLINE`]. Bytes past `ds * 16` are ignored.
pub fn parse_wqe(bytes: &[u8]) -> Result<ParsedWqe<'_>, WqeError> {
    parse_wqe_with(bytes, DEFAULT_MAX_INLINE)
}

/// [`parse_wqe`] with an explicit inline limit (the QP's `max_inline_data`).
#[inline]
pub fn parse_wqe_with(bytes: &[u8], max_inline: u32) -> Result<ParsedWqe<'_>, WqeError> {
    let ctrl = CtrlSeg::read_from(bytes).ok_or(WqeError::Truncated { len: bytes.len() })?;
    let op = ctrl.opcode();
    let opmod = ctrl.opmod();
    let ds = ctrl.ds();
    match op {
        opcode::NOP
        | opcode::DUMP
        | opcode::RDMA_WRITE
        | opcode::RDMA_WRITE_IMM
        | opcode::SEND
        | opcode::SEND_IMM
        | opcode::RDMA_READ
        | opcode::ATOMIC_CS
        | opcode::ATOMIC_FA
        | opcode::ATOMIC_MASKED_CS
        | opcode::ATOMIC_MASKED_FA => {}
        o if opcode::name(o).is_some() => return Err(WqeError::UnsupportedOpcode { opcode: o }),
        o => return Err(WqeError::UnknownOpcode { opcode: o }),
    }
    if ds == 0 {
        return Err(WqeError::ZeroDs);
    }
    if ds > MAX_DS {
        return Err(WqeError::DsTooLarge { ds });
    }
    let need = ds as usize * DS_BYTES;
    if need > bytes.len() {
        return Err(WqeError::DsPastBuffer {
            ds,
            need,
            len: bytes.len(),
        });
    }
    // Opmod selects the operand size of masked atomics; other opcodes give it no meaning
    // and it is reported, not checked (MLX5.md's oracle image sets 0x08 on RDMA_WRITE).
    let masked = matches!(op, opcode::ATOMIC_MASKED_CS | opcode::ATOMIC_MASKED_FA);
    if masked && opmod != OPMOD_MASKED_4B && opmod != OPMOD_MASKED_8B {
        return Err(WqeError::BadOpmod { opcode: op, opmod });
    }
    let size = WqeSize { ds };
    if op == opcode::NOP {
        return Ok(ParsedWqe {
            ctrl,
            op: WqeOp::Nop,
            size,
        });
    }
    let mut r = SegReader {
        wqe: &bytes[..need],
        at: 1,
        ds,
        opcode: op,
        max_inline,
    };
    let imm = ctrl.imm.get();
    let parsed = match op {
        opcode::DUMP => WqeOp::Dump { local: r.data()? },
        opcode::RDMA_WRITE => WqeOp::RdmaWrite {
            remote: r.seg("raddr")?,
            payload: r.payload()?,
        },
        opcode::RDMA_WRITE_IMM => WqeOp::RdmaWriteImm {
            remote: r.seg("raddr")?,
            payload: r.payload()?,
            imm,
        },
        opcode::SEND => WqeOp::Send {
            payload: r.payload()?,
        },
        opcode::SEND_IMM => WqeOp::SendImm {
            payload: r.payload()?,
            imm,
        },
        opcode::RDMA_READ => {
            let remote = r.seg("raddr")?;
            WqeOp::RdmaRead {
                remote,
                local: r.sges()?,
            }
        }
        opcode::ATOMIC_CS | opcode::ATOMIC_FA => {
            let remote = r.seg("raddr")?;
            let a: AtomicSeg = r.seg("atomic")?;
            let result = r.result(8)?;
            if op == opcode::ATOMIC_CS {
                WqeOp::AtomicCs {
                    remote,
                    compare: a.compare.get(),
                    swap: a.swap_add.get(),
                    result,
                }
            } else {
                WqeOp::AtomicFa {
                    remote,
                    add: a.swap_add.get(),
                    result,
                }
            }
        }
        _ => {
            let remote = r.seg("raddr")?;
            match (op, opmod) {
                (opcode::ATOMIC_MASKED_CS, OPMOD_MASKED_4B) => {
                    let s: MaskedCs32Seg = r.seg("masked compare-swap (4 B)")?;
                    WqeOp::MaskedCs32 {
                        remote,
                        swap: s.swap.get(),
                        compare: s.compare.get(),
                        swap_mask: s.swap_mask.get(),
                        compare_mask: s.compare_mask.get(),
                        result: r.result(4)?,
                    }
                }
                (opcode::ATOMIC_MASKED_CS, _) => {
                    let s: MaskedCs64Seg = r.seg("masked compare-swap (8 B)")?;
                    WqeOp::MaskedCs64 {
                        remote,
                        swap: s.swap.get(),
                        compare: s.compare.get(),
                        swap_mask: s.swap_mask.get(),
                        compare_mask: s.compare_mask.get(),
                        result: r.result(8)?,
                    }
                }
                (_, OPMOD_MASKED_4B) => {
                    let s: MaskedFa32Seg = r.seg("masked fetch-add (4 B)")?;
                    WqeOp::MaskedFa32 {
                        remote,
                        add: s.add.get(),
                        field_boundary: s.field_boundary.get(),
                        result: r.result(4)?,
                    }
                }
                _ => {
                    let s: MaskedFa64Seg = r.seg("masked fetch-add (8 B)")?;
                    WqeOp::MaskedFa64 {
                        remote,
                        add: s.add.get(),
                        field_boundary: s.field_boundary.get(),
                        result: r.result(8)?,
                    }
                }
            }
        }
    };
    if r.at != ds {
        return Err(WqeError::ExtraSegments {
            opcode: op,
            used: r.at,
            ds,
        });
    }
    Ok(ParsedWqe {
        ctrl,
        op: parsed,
        size,
    })
}

/// Walks the ds units of one WQE after its control segment.
struct SegReader<'a> {
    /// Exactly ds * 16 bytes.
    wqe: &'a [u8],
    /// Next ds unit.
    at: u8,
    ds: u8,
    opcode: u8,
    max_inline: u32,
}

impl<'a> SegReader<'a> {
    fn off(&self) -> usize {
        self.at as usize * DS_BYTES
    }

    fn first_word(&self) -> Option<u32> {
        let o = self.off();
        let w: [u8; 4] = self.wqe.get(o..o + 4)?.try_into().ok()?;
        Some(u32::from_be_bytes(w))
    }

    #[inline]
    fn seg<T: WireStruct>(&mut self, segment: &'static str) -> Result<T, WqeError> {
        let units = (T::SIZE / DS_BYTES) as u8;
        let missing = WqeError::MissingSegment {
            opcode: self.opcode,
            segment,
            at: self.at,
            ds: self.ds,
        };
        if self.at as usize + units as usize > self.ds as usize {
            return Err(missing);
        }
        let s = T::read_from(&self.wqe[self.off()..]).ok_or(missing)?;
        self.at += units;
        Ok(s)
    }

    fn data(&mut self) -> Result<DataSeg, WqeError> {
        if self.first_word().is_some_and(|w| w & INLINE_SEG != 0) {
            return Err(WqeError::InlineNotAllowed {
                opcode: self.opcode,
                at: self.at,
            });
        }
        self.seg("data")
    }

    fn result(&mut self, size: u32) -> Result<Sge8, WqeError> {
        let d = self.data()?;
        if d.byte_count.get() != size {
            return Err(WqeError::AtomicLength {
                byte_count: d.byte_count.get(),
                expected: size,
            });
        }
        Ok(Sge8 {
            addr: d.addr.get(),
            lkey: d.lkey.get(),
        })
    }

    /// All remaining units as data segments (none is allowed to be inline).
    fn sges(&mut self) -> Result<&'a [DataSeg], WqeError> {
        let start = self.off();
        let n = (self.ds - self.at) as usize;
        for _ in 0..n {
            self.data()?;
        }
        Ok(as_data_segs(&self.wqe[start..start + n * DS_BYTES]))
    }

    /// All remaining units: one inline segment, or data segments (not both).
    #[inline]
    fn payload(&mut self) -> Result<Payload<'a>, WqeError> {
        let Some(w) = self.first_word() else {
            return Ok(Payload::Sge(&[]));
        };
        if w & INLINE_SEG == 0 {
            let start = self.off();
            let n = (self.ds - self.at) as usize;
            for _ in 0..n {
                if self.first_word().is_some_and(|w| w & INLINE_SEG != 0) {
                    return Err(WqeError::InlineMixed { at: self.at });
                }
                self.at += 1;
            }
            return Ok(Payload::Sge(as_data_segs(
                &self.wqe[start..start + n * DS_BYTES],
            )));
        }
        let len = w & !INLINE_SEG;
        if len > self.max_inline {
            return Err(WqeError::InlineTooLong {
                len,
                max: self.max_inline,
            });
        }
        let need = inline_ds(len as usize);
        let left = self.ds - self.at;
        if need > left as usize {
            return Err(WqeError::InlineOverrun {
                len,
                at: self.at,
                need: need.min(255) as u8,
                left,
            });
        }
        let o = self.off() + 4;
        let data = &self.wqe[o..o + len as usize];
        self.at += need as u8;
        if self.at != self.ds {
            // Anything after the inline segment: rshmem (like IBGDA) sends one payload
            // segment kind per WQE and at most one inline segment.
            return Err(WqeError::InlineMixed { at: self.at });
        }
        Ok(Payload::Inline(data))
    }
}

/// Views whole 16-byte units as data segments.
fn as_data_segs(b: &[u8]) -> &[DataSeg] {
    debug_assert_eq!(b.len() % DS_BYTES, 0);
    // SAFETY: DataSeg is a 16-byte WireStruct with alignment 1 and no invalid bit
    // patterns, so any len/16 consecutive 16-byte chunks of initialised bytes are valid
    // DataSegs; the returned slice borrows `b` and covers exactly its bytes.
    unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<DataSeg>(), b.len() / DS_BYTES) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oracle_ctrl_image() {
        let c = CtrlSeg::new(0x1234, 0x08, 0x08, 0xabcdef, 0x08, 3, 0, Be32::new(0));
        assert_eq!(
            c.as_bytes(),
            [0x08, 0x12, 0x34, 0x08, 0xab, 0xcd, 0xef, 0x03, 0, 0, 0, 0x08, 0, 0, 0, 0]
        );
    }

    #[test]
    fn oracle_data_image() {
        let d = DataSeg::new(0x100, 0x1122_3344, 0x0102_0304_0506_0708);
        assert_eq!(
            d.as_bytes(),
            [0, 0, 1, 0, 0x11, 0x22, 0x33, 0x44, 1, 2, 3, 4, 5, 6, 7, 8]
        );
    }

    #[test]
    fn typical_sizes() {
        let mut b = [0u8; 1024];
        let c = WqeCtrl {
            wqe_index: 7,
            qpn: 0x42,
            cq_update: true,
            ..Default::default()
        };
        let r = RaddrSeg::new(0x1000, 5);
        let l = DataSeg::new(64, 6, 0x2000);
        let s = Sge8 {
            addr: 0x3000,
            lkey: 6,
        };
        assert_eq!(nop(&mut b, &c).unwrap().ds, 1);
        assert_eq!(rdma_write(&mut b, &c, r, l).unwrap().ds, 3);
        assert_eq!(rdma_read(&mut b, &c, r, l).unwrap().ds, 3);
        assert_eq!(rdma_write_inline(&mut b, &c, r, &[1; 12]).unwrap().ds, 3);
        assert_eq!(rdma_write_inline(&mut b, &c, r, &[1; 13]).unwrap().ds, 4);
        assert_eq!(atomic_fa(&mut b, &c, r, s, 1).unwrap().ds, 4);
        let sz = masked_cs64(&mut b, &c, r, s, 1, 2, 3, 4).unwrap();
        assert_eq!((sz.ds, sz.wqebbs()), (5, 2));
        assert_eq!(
            rdma_write(&mut b[..63], &c, r, l),
            Err(BuildError::BufferTooSmall {
                need: 64,
                have: 63,
                ds: 3
            })
        );
    }
}
