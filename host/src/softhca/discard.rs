//! An engine that completes WQEs without executing them: the other half of the
//! producer-rate benchmark ("WQEs/s the GPU posts, producer alone, engine discarding").
//!
//! [`DiscardEngine::progress`] reads the QP doorbell record like the real engine, walks
//! the published WQEs by their control segments' ds (only the 16-byte control segment of
//! each WQE is read; nothing is parsed or checked), and writes success CQEs: one per WQE
//! in a normal CQ (stalling when the consumer is behind: a benchmark tool, unlike the
//! engine, which overruns as a ConnectX would), or one
//! collapsed CQE for the last WQE of the round. Memory regions are never touched, so any
//! keys and addresses do. Single-threaded: whoever owns it calls `progress` (a host
//! thread next to a GPU kernel, or a test).

use super::queue::{CqMode, QueueMemory};
use crate::mlx5::cqe::{owner_bit, Cqe64, CqeInfo, CqeOpcode};
use crate::mlx5::ring::slot_offset;
use crate::mlx5::wqe::{CtrlSeg, DS_BYTES, MAX_WQEBBS, WQEBB};
use crate::mlx5::WireStruct;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Completes the WQEs of one QP without executing them.
#[derive(Debug)]
pub struct DiscardEngine {
    mem: Arc<QueueMemory>,
    qpn: u32,
    mode: CqMode,
    /// Next WQEBB to complete (16-bit WQE index = low bits).
    ci: u16,
    /// CQEs written (unwrapped).
    cq_pi: u32,
    /// WQEs completed in total.
    wqes: u64,
}

impl DiscardEngine {
    /// An engine for the fresh queue in `mem` (producer and engine start at 0).
    pub fn new(mem: Arc<QueueMemory>, qpn: u32, mode: CqMode) -> DiscardEngine {
        DiscardEngine {
            mem,
            qpn: qpn & 0xff_ffff,
            mode,
            ci: 0,
            cq_pi: 0,
            wqes: 0,
        }
    }

    /// WQEs completed so far.
    pub fn wqes(&self) -> u64 {
        self.wqes
    }

    /// Completes every WQE published so far (as far as the CQ has room); returns how many.
    pub fn progress(&mut self) -> usize {
        let mem = &self.mem;
        let cnt = mem.layout().wqe_cnt;
        let cqe_cnt = mem.layout().cqe_cnt;
        // Acquire: pairs with the producer's Release of the record — the control segments
        // it covers are visible.
        let pi =
            u32::from_be_bytes(mem.qp_dbrec_send().load(Ordering::Acquire).to_ne_bytes()) as u16;
        let mut avail = (pi.wrapping_sub(self.ci) as u32).min(cnt);
        let mut done = 0;
        let mut last: Option<(u16, u8)> = None;
        while avail > 0 {
            if self.mode == CqMode::Normal {
                // Acquire: the consumer finished reading the entries it released.
                let ci =
                    u32::from_be_bytes(mem.cq_dbrec_ci().load(Ordering::Acquire).to_ne_bytes());
                if (self.cq_pi.wrapping_sub(ci) & 0xff_ffff) >= cqe_cnt {
                    break; // never overrun the consumer
                }
            }
            let off = slot_offset(self.ci as u32, cnt);
            // SAFETY: off + 16 lies inside the ring (64-byte slots); the slot was published
            // by the record acquired above and is not reused before its CQE, which we write
            // after this read.
            let ctrl = unsafe {
                CtrlSeg::read_from(std::slice::from_raw_parts(mem.sq().add(off), 16))
                    .expect("16 bytes")
            };
            let n = (ctrl.ds() as usize * DS_BYTES)
                .div_ceil(WQEBB)
                .clamp(1, MAX_WQEBBS) as u32;
            let n = n.min(avail);
            if self.mode == CqMode::Normal {
                self.write(
                    self.cq_pi,
                    owner_bit(self.cq_pi, cqe_cnt),
                    self.ci,
                    ctrl.opcode(),
                );
            } else {
                last = Some((self.ci, ctrl.opcode()));
            }
            self.cq_pi = self.cq_pi.wrapping_add(1);
            self.ci = self.ci.wrapping_add(n as u16);
            avail -= n;
            done += 1;
        }
        if let Some((index, op)) = last {
            // Collapsed: one CQE for the round's last WQE; the owner bit alternates per
            // write, as the real engine writes it.
            self.write(0, (self.cq_pi.wrapping_sub(1) & 1) as u8, index, op);
        }
        self.wqes += done as u64;
        done
    }

    fn write(&self, slot: u32, owner: u8, index: u16, wqe_opcode: u8) {
        let info = CqeInfo {
            wqe_opcode,
            qpn: self.qpn,
            wqe_counter: index,
            byte_cnt: 0,
            owner,
        };
        // write_cqe stores bytes 56..63 (owner) last with Release: a consumer that sees the
        // new owner bit sees the whole CQE, and our read of the slot came before.
        self.mem
            .write_cqe(slot, &Cqe64::success(CqeOpcode::Req, &info));
    }
}
