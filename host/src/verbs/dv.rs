//! mlx5 direct verbs: the queues of a verbs QP as the NIC sees them
//! (`mlx5dv_init_obj`), checked against what rshmem's queue code assumes, and wrapped as
//! [`QueueMemory`] so the same [`SendQueue`] protocol that feeds the soft HCA posts to a
//! ConnectX send queue.
//!
//! [`SendQueue`]: crate::softhca::queue::SendQueue

use super::qp::QueuePair;
use super::result::{check_rc, mlx5_fn};
use super::sys;
use crate::error::{Error, Result};
use crate::mlx5::doorbell::BF_OFFSET;
use crate::softhca::queue::{QueueMemory, QueueParts, MAX_CQE_CNT, MAX_WQE_CNT};

/// What `mlx5dv_init_obj(QP | CQ)` reports for one QP and its send CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicQueues {
    pub qpn: u32,
    pub sq_buf: usize,
    pub sq_wqe_cnt: u32,
    pub sq_stride: u32,
    /// QP doorbell record (`__be32[2]`).
    pub dbrec: usize,
    /// BlueFlame register (already at the 0x800 offset of the UAR page) and its size.
    pub bf_reg: usize,
    pub bf_size: u32,
    pub cq_buf: usize,
    pub cqe_cnt: u32,
    pub cqe_size: u32,
    pub cq_dbrec: usize,
}

/// Why NIC queues do not fit rshmem's queue code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NicQueueError {
    #[error("SQ stride {0} bytes; rshmem writes 64-byte WQEBBs")]
    Stride(u32),
    #[error("SQ of {0} WQEBBs: must be a power of two in 1..={MAX_WQE_CNT}")]
    WqeCnt(u32),
    #[error("CQE size {0} bytes; rshmem reads 64-byte CQEs (unset MLX5_CQE_SIZE=128)")]
    CqeSize(u32),
    #[error("CQ of {0} entries: must be a power of two in 1..={MAX_CQE_CNT}")]
    CqeCnt(u32),
    #[error("no doorbell register (bf.reg is null)")]
    NoDoorbell,
    #[error(
        "CQ of {cqe_cnt} entries for an SQ of {wqe_cnt} WQEBBs: the device-side producer asks \
         a CQE of every WQE, so the CQ must hold a full SQ"
    )]
    CqSmallerThanSq { cqe_cnt: u32, wqe_cnt: u32 },
    #[error("{what} at {addr:#x} is not {align}-byte aligned")]
    Align {
        what: &'static str,
        addr: usize,
        align: usize,
    },
}

impl NicQueues {
    /// Checks the shapes [`SendQueue`](crate::softhca::queue::SendQueue) relies on.
    pub fn validate(&self) -> std::result::Result<(), NicQueueError> {
        if self.sq_stride != 64 {
            return Err(NicQueueError::Stride(self.sq_stride));
        }
        if !self.sq_wqe_cnt.is_power_of_two() || self.sq_wqe_cnt > MAX_WQE_CNT {
            return Err(NicQueueError::WqeCnt(self.sq_wqe_cnt));
        }
        if self.cqe_size != 64 {
            return Err(NicQueueError::CqeSize(self.cqe_size));
        }
        if !self.cqe_cnt.is_power_of_two() || self.cqe_cnt > MAX_CQE_CNT {
            return Err(NicQueueError::CqeCnt(self.cqe_cnt));
        }
        // bf.size is 0 for a QP on the UAR's non-BlueFlame register (bfreg 0): its bf.reg
        // still takes an 8-byte doorbell, all rshmem writes there.
        if self.bf_reg == 0 {
            return Err(NicQueueError::NoDoorbell);
        }
        if self.cqe_cnt < self.sq_wqe_cnt {
            return Err(NicQueueError::CqSmallerThanSq {
                cqe_cnt: self.cqe_cnt,
                wqe_cnt: self.sq_wqe_cnt,
            });
        }
        for (what, addr, align) in [
            ("SQ buffer", self.sq_buf, 64),
            ("CQ buffer", self.cq_buf, 64),
            ("QP doorbell record", self.dbrec, 8),
            ("CQ doorbell record", self.cq_dbrec, 8),
            ("BlueFlame register", self.bf_reg, 8),
        ] {
            if addr % align != 0 {
                return Err(NicQueueError::Align { what, addr, align });
            }
        }
        Ok(())
    }

    /// The [`QueueParts`] of these queues.
    pub fn parts(&self) -> QueueParts {
        QueueParts {
            sq: self.sq_buf as *mut u8,
            qp_dbrec: self.dbrec as *mut u8,
            doorbell: self.bf_reg as *mut u8,
            cq: self.cq_buf as *mut u8,
            cq_dbrec: self.cq_dbrec as *mut u8,
        }
    }

    /// The UAR page holding the BlueFlame register (what `cuMemHostRegister` with
    /// IOMEMORY would map into the GPU): (page address, page size).
    pub fn uar_page(&self, page_size: usize) -> (usize, usize) {
        debug_assert_eq!(BF_OFFSET % 8, 0);
        (self.bf_reg & !(page_size - 1), page_size)
    }
}

/// Whether libmlx5 considers the device of `ctx` an mlx5 device, plus its mlx5dv flags
/// (`mlx5dv_query_device`).
pub fn query_flags(ctx: &super::device::Context) -> Result<u64> {
    let f = mlx5_fn!(mlx5dv_query_device)?;
    // SAFETY: plain data; all-zero is valid.
    let mut attrs: sys::mlx5dv_context = unsafe { std::mem::zeroed() };
    // SAFETY: live context, writable struct of the header's type.
    let rc = unsafe { f(ctx.as_ptr(), &mut attrs) };
    check_rc("mlx5dv_query_device", rc, ctx.name())?;
    Ok(attrs.flags)
}

/// `mlx5dv_init_obj(QP | CQ)` on `qp` and its CQ.
pub fn init_obj(qp: &QueuePair) -> Result<NicQueues> {
    let f = mlx5_fn!(mlx5dv_init_obj)?;
    // SAFETY: plain data; all-zero is valid.
    let mut dqp: sys::mlx5dv_qp = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut dcq: sys::mlx5dv_cq = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut obj: sys::mlx5dv_obj = unsafe { std::mem::zeroed() };
    obj.qp.in_ = qp.as_ptr();
    obj.qp.out = &mut dqp;
    obj.cq.in_ = qp.cq().as_ptr();
    obj.cq.out = &mut dcq;
    // SAFETY: live QP and CQ; the out structs are writable and outlive the call.
    let rc = unsafe { f(&mut obj, (sys::MLX5DV_OBJ_QP | sys::MLX5DV_OBJ_CQ) as u64) };
    check_rc("mlx5dv_init_obj", rc, &format!("QP {:#x}", qp.qpn()))?;
    Ok(NicQueues {
        qpn: qp.qpn(),
        sq_buf: dqp.sq.buf as usize,
        sq_wqe_cnt: dqp.sq.wqe_cnt,
        sq_stride: dqp.sq.stride,
        dbrec: dqp.dbrec as usize,
        bf_reg: dqp.bf.reg as usize,
        bf_size: dqp.bf.size,
        cq_buf: dcq.buf as usize,
        cqe_cnt: dcq.cqe_cnt,
        cqe_size: dcq.cqe_size,
        cq_dbrec: dcq.dbrec as usize,
    })
}

/// The NIC's queues of `qp` as [`QueueMemory`] (which keeps `qp` alive), ready for a
/// [`SendQueue`](crate::softhca::queue::SendQueue) with `CqMode::Normal`.
pub fn queue_memory(qp: QueuePair) -> Result<QueueMemory> {
    let q = init_obj(&qp)?;
    q.validate()
        .map_err(|e| Error::InvalidArgument(format!("QP {:#x}: {e}", q.qpn)))?;
    // SAFETY: the pointers come from mlx5dv_init_obj for this QP and CQ, were checked for
    // shape and alignment above, and stay valid while the QP (and through it the CQ)
    // lives — the QueueMemory owns the QP. Nobody else posts to this QP.
    unsafe { QueueMemory::from_parts(q.parts(), q.sq_wqe_cnt, q.cqe_cnt, Box::new(qp)) }
        .map_err(|e| Error::InvalidArgument(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> NicQueues {
        NicQueues {
            qpn: 0x1234,
            sq_buf: 0x7f00_0000_1000,
            sq_wqe_cnt: 256,
            sq_stride: 64,
            dbrec: 0x7f00_0000_9008,
            bf_reg: 0x7f10_0000_0800,
            bf_size: 256,
            cq_buf: 0x7f00_0002_0000,
            cqe_cnt: 256,
            cqe_size: 64,
            cq_dbrec: 0x7f00_0000_9010,
        }
    }

    #[test]
    fn validation() {
        assert_eq!(good().validate(), Ok(()));
        let v = |f: &dyn Fn(&mut NicQueues)| {
            let mut q = good();
            f(&mut q);
            q.validate()
        };
        assert_eq!(v(&|q| q.sq_stride = 128), Err(NicQueueError::Stride(128)));
        assert_eq!(v(&|q| q.sq_wqe_cnt = 96), Err(NicQueueError::WqeCnt(96)));
        assert_eq!(
            v(&|q| q.sq_wqe_cnt = 1 << 15),
            Err(NicQueueError::WqeCnt(1 << 15))
        );
        assert_eq!(v(&|q| q.cqe_size = 128), Err(NicQueueError::CqeSize(128)));
        assert_eq!(v(&|q| q.cqe_cnt = 0), Err(NicQueueError::CqeCnt(0)));
        assert_eq!(v(&|q| q.bf_reg = 0), Err(NicQueueError::NoDoorbell));
        assert_eq!(
            v(&|q| q.bf_size = 0),
            Ok(()),
            "a doorbell without BlueFlame"
        );
        assert_eq!(
            v(&|q| q.cqe_cnt = q.sq_wqe_cnt / 2),
            Err(NicQueueError::CqSmallerThanSq {
                cqe_cnt: good().sq_wqe_cnt / 2,
                wqe_cnt: good().sq_wqe_cnt
            })
        );
        assert_eq!(
            v(&|q| q.dbrec += 4),
            Err(NicQueueError::Align {
                what: "QP doorbell record",
                addr: 0x7f00_0000_900c,
                align: 8
            })
        );
        assert_eq!(good().uar_page(4096), (0x7f10_0000_0000, 4096));
    }

    /// The same SendQueue protocol drives memory shaped like a NIC's: separate SQ,
    /// records, doorbell and CQ, as mlx5dv reports them (here plain host memory).
    #[test]
    fn send_queue_posts_into_external_parts() {
        use crate::mlx5::doorbell::parse_doorbell;
        use crate::mlx5::wqe::WqeOp;
        use crate::softhca::queue::{CqMode, SendQueue};
        use std::sync::atomic::Ordering;
        use std::sync::Arc;
        #[repr(C, align(4096))]
        struct Pages([u8; 4 * 4096]);
        let mut mem = Box::new(Pages([0; 4 * 4096]));
        let base = mem.0.as_mut_ptr();
        // SQ at page 0 (4 WQEBBs), dbrec page 1, "UAR" page 2 at +0x800, CQ page 3.
        // SAFETY: all offsets inside the 16 KiB box.
        let parts = unsafe {
            QueueParts {
                sq: base,
                qp_dbrec: base.add(4096),
                doorbell: base.add(2 * 4096 + BF_OFFSET),
                cq: base.add(3 * 4096),
                cq_dbrec: base.add(4096 + 64),
            }
        };
        // SAFETY: the CQ ring starts zeroed: owner 0 with opcode 0 would read as "sw owns";
        // initialise like mlx5 (INVALID << 4).
        unsafe { crate::mlx5::cqe::init_cq(std::slice::from_raw_parts_mut(parts.cq, 4 * 64)) };
        let ptr = base as usize;
        // SAFETY: parts point into `mem`, which the QueueMemory owns (moved into owner).
        let qm = unsafe { QueueMemory::from_parts(parts, 4, 4, Box::new(mem)) }.unwrap();
        // A NIC's queues: ring() brackets the doorbell with the device-store barriers.
        assert!(qm.doorbell_is_device());
        let sq = SendQueue::new(
            Arc::new(qm),
            0xabc,
            CqMode::Normal,
            std::time::Duration::from_millis(100),
            None,
        );
        let p = sq.post(&WqeOp::Nop).unwrap();
        assert_eq!(p.index, 0);
        sq.ring();
        // SAFETY: reading the memory owned by `sq` through its base address.
        let (ctrl, dbrec, bell) = unsafe {
            (
                std::slice::from_raw_parts(ptr as *const u8, 8).to_vec(),
                std::slice::from_raw_parts((ptr + 4096) as *const u8, 8).to_vec(),
                *((ptr + 2 * 4096 + BF_OFFSET) as *const [u8; 8]),
            )
        };
        assert_eq!(ctrl, [0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0xbc, 0x01]);
        assert_eq!(dbrec, [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(parse_doorbell(bell), (1, 0xabc));
        assert_eq!(
            sq.memory()
                .qp_dbrec_send()
                .load(Ordering::Acquire)
                .to_ne_bytes(),
            [0, 0, 0, 1]
        );
    }
}
