//! Completion queue entries (64-byte CQEs): layout, opcodes, syndromes, the owner-bit rule,
//! and encoders for the success and error CQEs the soft HCA produces.
//!
//! This module owns the CQE byte format only. Publishing a CQE to a concurrent reader is
//! the producer's job: write bytes 0..63 first, then `op_own` (byte 63) with Release
//! ordering, because a poller decides ownership from `op_own` alone.

use super::wire::{wire_struct, Be16, Be32, Be64, WireStruct};

/// Bytes in a CQE.
pub const CQE_SIZE: usize = 64;
/// `op_own` of a CQE no one has written yet: opcode INVALID (15) in bits 7:4, owner 0.
pub const OP_OWN_INIT: u8 = 0xF0;

/// CQE opcodes (bits 7:4 of `op_own`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqeOpcode {
    Req = 0,
    RespWrImm = 1,
    RespSend = 2,
    RespSendImm = 3,
    RespSendInv = 4,
    ReqErr = 13,
    RespErr = 14,
    Invalid = 15,
}

impl CqeOpcode {
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => CqeOpcode::Req,
            1 => CqeOpcode::RespWrImm,
            2 => CqeOpcode::RespSend,
            3 => CqeOpcode::RespSendImm,
            4 => CqeOpcode::RespSendInv,
            13 => CqeOpcode::ReqErr,
            14 => CqeOpcode::RespErr,
            15 => CqeOpcode::Invalid,
            _ => return None,
        })
    }
    /// rdma-core's name without the `MLX5_CQE_` prefix.
    pub const fn name(self) -> &'static str {
        match self {
            CqeOpcode::Req => "REQ",
            CqeOpcode::RespWrImm => "RESP_WR_IMM",
            CqeOpcode::RespSend => "RESP_SEND",
            CqeOpcode::RespSendImm => "RESP_SEND_IMM",
            CqeOpcode::RespSendInv => "RESP_SEND_INV",
            CqeOpcode::ReqErr => "REQ_ERR",
            CqeOpcode::RespErr => "RESP_ERR",
            CqeOpcode::Invalid => "INVALID",
        }
    }
    pub const fn is_error(self) -> bool {
        matches!(self, CqeOpcode::ReqErr | CqeOpcode::RespErr)
    }
}

/// Error CQE syndromes (`MLX5_CQE_SYNDROME_*_ERR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Syndrome {
    LocalLength = 0x01,
    LocalQpOp = 0x02,
    LocalProt = 0x04,
    WrFlush = 0x05,
    MwBind = 0x06,
    BadResp = 0x10,
    LocalAccess = 0x11,
    RemoteInvalReq = 0x12,
    RemoteAccess = 0x13,
    RemoteOp = 0x14,
    TransportRetryExc = 0x15,
    RnrRetryExc = 0x16,
    RemoteAborted = 0x22,
}

impl Syndrome {
    /// Every syndrome, in value order.
    pub const ALL: [Syndrome; 13] = [
        Syndrome::LocalLength,
        Syndrome::LocalQpOp,
        Syndrome::LocalProt,
        Syndrome::WrFlush,
        Syndrome::MwBind,
        Syndrome::BadResp,
        Syndrome::LocalAccess,
        Syndrome::RemoteInvalReq,
        Syndrome::RemoteAccess,
        Syndrome::RemoteOp,
        Syndrome::TransportRetryExc,
        Syndrome::RnrRetryExc,
        Syndrome::RemoteAborted,
    ];
    pub const fn from_u8(v: u8) -> Option<Self> {
        let mut i = 0;
        while i < Self::ALL.len() {
            if Self::ALL[i] as u8 == v {
                return Some(Self::ALL[i]);
            }
            i += 1;
        }
        None
    }
    /// rdma-core's name without `MLX5_CQE_SYNDROME_` and `_ERR`.
    pub const fn name(self) -> &'static str {
        match self {
            Syndrome::LocalLength => "LOCAL_LENGTH",
            Syndrome::LocalQpOp => "LOCAL_QP_OP",
            Syndrome::LocalProt => "LOCAL_PROT",
            Syndrome::WrFlush => "WR_FLUSH",
            Syndrome::MwBind => "MW_BIND",
            Syndrome::BadResp => "BAD_RESP",
            Syndrome::LocalAccess => "LOCAL_ACCESS",
            Syndrome::RemoteInvalReq => "REMOTE_INVAL_REQ",
            Syndrome::RemoteAccess => "REMOTE_ACCESS",
            Syndrome::RemoteOp => "REMOTE_OP",
            Syndrome::TransportRetryExc => "TRANSPORT_RETRY_EXC",
            Syndrome::RnrRetryExc => "RNR_RETRY_EXC",
            Syndrome::RemoteAborted => "REMOTE_ABORTED",
        }
    }
}

/// A 64-byte CQE (`struct mlx5_cqe64`, the fields rshmem uses named; the rest reserved).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe64 {
    pub rsvd0: [u8; 32],
    pub srqn_uidx: Be32,
    pub imm_inval_pkey: Be32,
    pub app: u8,
    pub app_op: u8,
    pub app_info: Be16,
    /// Bytes transferred (@44).
    pub byte_cnt: Be32,
    pub timestamp: Be64,
    /// Bits 31:24 opcode of the completed WQE, 23:0 QP number (@56).
    pub sop_drop_qpn: Be32,
    /// Index of the completed WQE's first WQEBB (@60).
    pub wqe_counter: Be16,
    pub signature: u8,
    /// Bit 0 owner, bits 3:2 format, bits 7:4 CQE opcode (@63).
    pub op_own: u8,
}
wire_struct!(Cqe64, 64);

/// The error view of a CQE (`struct mlx5_err_cqe`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrCqe {
    pub rsvd0: [u8; 32],
    pub srqn: Be32,
    pub rsvd1: [u8; 18],
    /// Vendor-specific detail (@54).
    pub vendor_err_synd: u8,
    /// [`Syndrome`] (@55).
    pub syndrome: u8,
    pub s_wqe_opcode_qpn: Be32,
    pub wqe_counter: Be16,
    pub signature: u8,
    pub op_own: u8,
}
wire_struct!(ErrCqe, 64);

impl Default for Cqe64 {
    /// All zero except `op_own` = [`OP_OWN_INIT`] (an entry hardware has not written).
    fn default() -> Self {
        Cqe64 {
            rsvd0: [0; 32],
            srqn_uidx: Be32::new(0),
            imm_inval_pkey: Be32::new(0),
            app: 0,
            app_op: 0,
            app_info: Be16::new(0),
            byte_cnt: Be32::new(0),
            timestamp: Be64::new(0),
            sop_drop_qpn: Be32::new(0),
            wqe_counter: Be16::new(0),
            signature: 0,
            op_own: OP_OWN_INIT,
        }
    }
}

/// The owner bit a producer writes into the CQE at unmasked index `n` of a ring of
/// `cqe_cnt` entries (power of two): it flips on every pass over the ring.
pub const fn owner_bit(n: u32, cqe_cnt: u32) -> u8 {
    (n & cqe_cnt != 0) as u8
}

/// Whether the CQE with `op_own` at unmasked consumer index `n` of a ring of `cqe_cnt`
/// entries belongs to software: opcode ≠ INVALID and `(op_own & 1) == ((n & N) != 0)`.
pub const fn sw_owns(op_own: u8, n: u32, cqe_cnt: u32) -> bool {
    (op_own >> 4) != CqeOpcode::Invalid as u8 && (op_own & 1) == owner_bit(n, cqe_cnt)
}

/// Collapsed-CQ completion test (IBGDA): WQE index `idx` is complete once the CQE's
/// `wqe_counter` has reached it, comparing in 16-bit wrapping arithmetic.
pub const fn wqe_completed(wqe_counter: u16, idx: u16) -> bool {
    (wqe_counter.wrapping_sub(idx) as i16) >= 0
}

/// Sets every CQE's `op_own` to [`OP_OWN_INIT`] (the rest is left as is). Trailing bytes
/// short of a whole CQE are not touched.
pub fn init_cq(ring: &mut [u8]) {
    for cqe in ring.chunks_exact_mut(CQE_SIZE) {
        cqe[CQE_SIZE - 1] = OP_OWN_INIT;
    }
}

/// What a requester CQE reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CqeInfo {
    /// Opcode of the completed WQE (goes to `sop_drop_qpn` bits 31:24).
    pub wqe_opcode: u8,
    /// QP number (24 bits).
    pub qpn: u32,
    /// WQE index of the completed WQE.
    pub wqe_counter: u16,
    pub byte_cnt: u32,
    /// Owner bit for the slot: [`owner_bit`] of the producer index.
    pub owner: u8,
}

impl Cqe64 {
    /// A success CQE (opcode `opcode`, normally [`CqeOpcode::Req`] on a send CQ).
    #[inline]
    pub fn success(opcode: CqeOpcode, info: &CqeInfo) -> Self {
        Cqe64 {
            byte_cnt: Be32::new(info.byte_cnt),
            sop_drop_qpn: Be32::new(((info.wqe_opcode as u32) << 24) | (info.qpn & 0xff_ffff)),
            wqe_counter: Be16::new(info.wqe_counter),
            op_own: ((opcode as u8) << 4) | (info.owner & 1),
            ..Cqe64 {
                op_own: 0,
                ..Default::default()
            }
        }
    }

    /// A requester error CQE (REQ_ERR) with `syndrome` @55 and `vendor_err_synd` @54.
    pub fn error(syndrome: Syndrome, vendor_err_synd: u8, info: &CqeInfo) -> Self {
        let mut c = Cqe64::success(CqeOpcode::ReqErr, info);
        c.byte_cnt = Be32::new(0);
        // Bytes 54 and 55 lie in the big-endian timestamp field (48..56) of the cqe64 view.
        let mut ts = c.timestamp.to_bytes();
        ts[6] = vendor_err_synd;
        ts[7] = syndrome as u8;
        c.timestamp = Be64::from_bytes(ts);
        c
    }

    pub const fn opcode(&self) -> u8 {
        self.op_own >> 4
    }
    pub const fn owner(&self) -> u8 {
        self.op_own & 1
    }
    pub const fn qpn(&self) -> u32 {
        self.sop_drop_qpn.get() & 0xff_ffff
    }
    pub const fn wqe_opcode(&self) -> u8 {
        (self.sop_drop_qpn.get() >> 24) as u8
    }
    /// The error view of the same 64 bytes.
    pub fn as_err(&self) -> ErrCqe {
        ErrCqe::read_from(self.as_bytes()).expect("Cqe64 and ErrCqe are both 64 bytes")
    }
}

/// Bytes that are not a CQE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CqeError {
    #[error("a CQE is 64 bytes, got {len}")]
    Length { len: usize },
    #[error("CQE opcode {opcode} (op_own bits 7:4) is reserved")]
    ReservedOpcode { opcode: u8 },
}

/// Decodes exactly 64 bytes as a CQE, rejecting reserved CQE opcodes.
pub fn parse_cqe(bytes: &[u8]) -> Result<Cqe64, CqeError> {
    if bytes.len() != CQE_SIZE {
        return Err(CqeError::Length { len: bytes.len() });
    }
    let c = Cqe64::read_from(bytes).ok_or(CqeError::Length { len: bytes.len() })?;
    if CqeOpcode::from_u8(c.opcode()).is_none() {
        return Err(CqeError::ReservedOpcode { opcode: c.opcode() });
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_rule() {
        // First pass (n < N): software owns entries whose owner bit is 0.
        assert!(sw_owns(0x00, 3, 8));
        assert!(!sw_owns(0x01, 3, 8));
        // Second pass: owner bit 1.
        assert!(sw_owns(0x01, 11, 8));
        assert!(!sw_owns(0x00, 11, 8));
        // Never-written entries are hardware's on the first pass.
        assert!(!sw_owns(OP_OWN_INIT, 0, 8));
        assert!(!sw_owns(0xff, 8, 8));
        assert_eq!(owner_bit(8, 8), 1);
    }

    #[test]
    fn completed_with_wrap() {
        assert!(wqe_completed(5, 5));
        assert!(wqe_completed(5, 4));
        assert!(!wqe_completed(5, 6));
        assert!(wqe_completed(2, 0xfffe));
        assert!(!wqe_completed(0xfffe, 2));
    }

    #[test]
    fn error_cqe_bytes() {
        let info = CqeInfo {
            wqe_opcode: 0x08,
            qpn: 0xabcdef,
            wqe_counter: 0x1234,
            byte_cnt: 9,
            owner: 1,
        };
        let c = Cqe64::error(Syndrome::RemoteAccess, 0x88, &info);
        let b = c.as_bytes();
        assert_eq!(b[54], 0x88);
        assert_eq!(b[55], 0x13);
        assert_eq!(&b[56..64], &[0x08, 0xab, 0xcd, 0xef, 0x12, 0x34, 0, 0xd1]);
        assert_eq!(c.as_err().syndrome, 0x13);
        let mut ring = [0u8; 130];
        init_cq(&mut ring);
        assert_eq!((ring[63], ring[127], ring[129]), (0xf0, 0xf0, 0));
    }
}
