//! The IBGDA queue table and queue-pair descriptor: the Rust side of
//! `device-kernels/include/rshmem/ibgda/layout.cuh` (same fields, same offsets).
//!
//! [`IbgdaQp`] tells a device-side producer (`rshmem/ibgda/queue.cuh`, the CUDA twin of
//! [`super::SendQueue`]) where one send queue lives — SQ ring, QP doorbell record, doorbell,
//! CQ ring, CQ doorbell record — and holds the producers' counters (reservation head, ready
//! head, completion counter, first error). [`IbgdaTable`] is what
//! `rshmem_device_state_t.ibgda` points at: the descriptor of the queue to PE `p` is
//! `qps[peers[p].qp]`.
//!
//! This module owns the layout only: it allocates nothing on a device and maps nothing
//! (the GPU host layer places the descriptors in device memory and the queues in
//! host-pinned memory mapped into the GPU; docs/ibgda-device.md says how). The host writes
//! line 0 of a descriptor before producers start and reads the counters only through
//! atomics while they run.

use super::queue::{CqMode, QueueMemory};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// `RSHMEM_IBGDA_TABLE_MAGIC` ("ibgq" little-endian).
pub const IBGDA_TABLE_MAGIC: u32 = 0x7167_6269;
/// `RSHMEM_IBGDA_VERSION`.
pub const IBGDA_VERSION: u32 = 2;
/// `RSHMEM_IBGDA_CQ_NORMAL` / `RSHMEM_IBGDA_CQ_COLLAPSED`.
pub const IBGDA_CQ_NORMAL: u32 = 0;
pub const IBGDA_CQ_COLLAPSED: u32 = 1;
/// `RSHMEM_IBGDA_DOORBELL_MEMORY` / `RSHMEM_IBGDA_DOORBELL_MMIO`: the doorbell is a word in
/// memory (the soft HCA's), or a NIC register mapped into the GPU, which producers ring
/// with a fence and an MMIO store.
pub const IBGDA_DOORBELL_MEMORY: u32 = 0;
pub const IBGDA_DOORBELL_MMIO: u32 = 1;

/// Status codes the device producer returns (`RSHMEM_IBGDA_*`).
pub mod status {
    pub const OK: i32 = 0;
    pub const TIMEOUT: i32 = 1;
    pub const CQE: i32 = 2;
    pub const BROKEN: i32 = 3;
    pub const TOO_BIG: i32 = 4;
    /// The name queue.cuh's `status_name` gives it.
    pub fn name(s: i32) -> &'static str {
        match s {
            OK => "ok",
            TIMEOUT => "timed out",
            CQE => "error completion",
            BROKEN => "queue broken by an earlier timeout",
            TOO_BIG => "WQE too big for the queue",
            _ => "unknown status",
        }
    }
}

/// Where one queue pair's memory is, as the producer addresses it (device virtual
/// addresses on a GPU; host addresses when the producer is host C++).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueAddrs {
    pub sq: u64,
    pub qp_dbrec: u64,
    pub doorbell: u64,
    pub cq: u64,
    pub cq_dbrec: u64,
}

impl QueueAddrs {
    /// The addresses of `mem`'s pieces in this process, each shifted by `delta` (a GPU
    /// mapping of the same memory at another address: `device_base - host_base`; 0 for
    /// host producers). One delta fits memory from [`QueueMemory::new`] (one allocation,
    /// registered with the GPU at once); a NIC's queues ([`QueueMemory::from_parts`]: SQ,
    /// records, UAR mapped separately) need their fields set one by one.
    pub fn of(mem: &QueueMemory, delta: u64) -> QueueAddrs {
        let p = mem.parts();
        let at = |ptr: *mut u8| (ptr as u64).wrapping_add(delta);
        QueueAddrs {
            sq: at(p.sq),
            qp_dbrec: at(p.qp_dbrec),
            doorbell: at(p.doorbell),
            cq: at(p.cq),
            cq_dbrec: at(p.cq_dbrec),
        }
    }
}

/// `rshmem_ibgda_qp_t`: 320 bytes, 64-byte aligned; line 0 configuration, lines 1-4 the
/// producers' counters (atomics here, as on the device).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct IbgdaQp {
    pub sq: u64,
    pub qp_dbrec: u64,
    pub doorbell: u64,
    pub cq: u64,
    pub cq_dbrec: u64,
    pub timeout_ns: u64,
    pub wqe_cnt: u32,
    pub cqe_cnt: u32,
    pub qpn: u32,
    pub cq_mode: u32,
    // Line 1 (`doorbell_mode` is configuration, read-only for producers).
    pub reserved: AtomicU64,
    pub doorbell_mode: u32,
    pad1a: u32,
    pad1: [u64; 6],
    // Line 2.
    pub ready: AtomicU64,
    pub rung: AtomicU64,
    pub ring_lock: AtomicU32,
    pad2a: u32,
    pub last_fence: AtomicU64,
    pad2: [u64; 4],
    // Line 3.
    pub completed: AtomicU64,
    pub cq_ci: AtomicU32,
    pub cq_lock: AtomicU32,
    pub broken: AtomicU32,
    /// The wait that timed out first (`RSHMEM_IBGDA_WAIT_*`; 0: none) and the index it
    /// waited for: written by the device producer for its error report.
    pub timeout_what: AtomicU32,
    pub timeout_index: AtomicU64,
    pad3: [u64; 4],
    // Line 4.
    pub first_error: AtomicU32,
    pub first_error_syndrome: u8,
    pub first_error_vendor: u8,
    pub first_error_wqe_opcode: u8,
    pub first_error_cqe_opcode: u8,
    pub first_error_index: u64,
    pub cqes: AtomicU64,
    pad4: [u64; 5],
}

const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<IbgdaQp>() == 320);
    assert!(align_of::<IbgdaQp>() == 64);
    assert!(offset_of!(IbgdaQp, timeout_ns) == 40);
    assert!(offset_of!(IbgdaQp, cq_mode) == 60);
    assert!(offset_of!(IbgdaQp, reserved) == 64);
    assert!(offset_of!(IbgdaQp, doorbell_mode) == 72);
    assert!(offset_of!(IbgdaQp, ready) == 128);
    assert!(offset_of!(IbgdaQp, ring_lock) == 144);
    assert!(offset_of!(IbgdaQp, last_fence) == 152);
    assert!(offset_of!(IbgdaQp, completed) == 192);
    assert!(offset_of!(IbgdaQp, broken) == 208);
    assert!(offset_of!(IbgdaQp, timeout_what) == 212);
    assert!(offset_of!(IbgdaQp, timeout_index) == 216);
    assert!(offset_of!(IbgdaQp, first_error) == 256);
    assert!(offset_of!(IbgdaQp, first_error_index) == 264);
    assert!(offset_of!(IbgdaQp, cqes) == 272);
    assert!(size_of::<IbgdaTable>() == 64);
    assert!(offset_of!(IbgdaTable, qps) == 16);
    assert!(offset_of!(IbgdaTable, results) == 24);
    assert!(offset_of!(IbgdaTable, n_results) == 40);
};

/// The first error CQE a device producer recorded (the QP's error state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbgdaError {
    pub syndrome: u8,
    pub vendor_err_synd: u8,
    pub wqe_opcode: u8,
    pub cqe_opcode: u8,
    /// Unwrapped index of the failed WQE's first WQEBB.
    pub index: u64,
}

impl IbgdaQp {
    /// A fresh descriptor (counters zero) for a queue whose memory is at `addrs`, with
    /// `wqe_cnt` WQEBBs, `cqe_cnt` CQEs, QP number `qpn`; `timeout` bounds every wait.
    /// Both counts must be powers of two; a normal-mode CQ needs at least `wqe_cnt`
    /// entries, because the CUDA producer asks a CQE of every WQE: a smaller one overruns
    /// (on a ConnectX as on the soft HCA), and the producer, which cannot see the
    /// asynchronous event, would only time out.
    pub fn new(
        addrs: QueueAddrs,
        wqe_cnt: u32,
        cqe_cnt: u32,
        qpn: u32,
        cq_mode: CqMode,
        timeout: Duration,
    ) -> crate::error::Result<IbgdaQp> {
        let bad = |why: String| {
            Err(crate::error::Error::InvalidArgument(format!(
                "IBGDA queue of QP {qpn:#x} ({wqe_cnt} WQEBBs, {cqe_cnt} CQEs, {cq_mode:?} CQ): \
                 {why}"
            )))
        };
        if !wqe_cnt.is_power_of_two() || !cqe_cnt.is_power_of_two() {
            return bad("both counts must be powers of two".into());
        }
        if cq_mode == CqMode::Normal && cqe_cnt < wqe_cnt {
            return bad(format!(
                "a normal CQ needs at least {wqe_cnt} entries (a CQE for every WQE, as the \
                 CUDA producer asks); use a larger CQ or a collapsed one"
            ));
        }
        Ok(IbgdaQp {
            sq: addrs.sq,
            qp_dbrec: addrs.qp_dbrec,
            doorbell: addrs.doorbell,
            cq: addrs.cq,
            cq_dbrec: addrs.cq_dbrec,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX).max(1),
            wqe_cnt,
            cqe_cnt,
            qpn: qpn & 0xff_ffff,
            cq_mode: match cq_mode {
                CqMode::Normal => IBGDA_CQ_NORMAL,
                CqMode::Collapsed => IBGDA_CQ_COLLAPSED,
            },
            reserved: AtomicU64::new(0),
            doorbell_mode: IBGDA_DOORBELL_MEMORY,
            pad1a: 0,
            pad1: [0; 6],
            ready: AtomicU64::new(0),
            rung: AtomicU64::new(0),
            ring_lock: AtomicU32::new(0),
            pad2a: 0,
            last_fence: AtomicU64::new(0),
            pad2: [0; 4],
            completed: AtomicU64::new(0),
            cq_ci: AtomicU32::new(0),
            cq_lock: AtomicU32::new(0),
            broken: AtomicU32::new(0),
            timeout_what: AtomicU32::new(0),
            timeout_index: AtomicU64::new(0),
            pad3: [0; 4],
            first_error: AtomicU32::new(0),
            first_error_syndrome: 0,
            first_error_vendor: 0,
            first_error_wqe_opcode: 0,
            first_error_cqe_opcode: 0,
            first_error_index: 0,
            cqes: AtomicU64::new(0),
            pad4: [0; 5],
        })
    }

    /// The same descriptor for a doorbell that is a NIC register (the UAR's BlueFlame
    /// mapped into the GPU): producers ring it with a fence and an MMIO store.
    pub fn with_mmio_doorbell(mut self) -> IbgdaQp {
        self.doorbell_mode = IBGDA_DOORBELL_MMIO;
        self
    }

    /// A descriptor of `mem` for producers in this process (host addresses).
    pub fn for_host(
        mem: &QueueMemory,
        qpn: u32,
        cq_mode: CqMode,
        timeout: Duration,
    ) -> crate::error::Result<IbgdaQp> {
        let l = mem.layout();
        IbgdaQp::new(
            QueueAddrs::of(mem, 0),
            l.wqe_cnt,
            l.cqe_cnt,
            qpn,
            cq_mode,
            timeout,
        )
    }

    /// WQEBBs reserved so far.
    pub fn reserved(&self) -> u64 {
        // Acquire (here and in the getters below): diagnostics read while or after
        // producers run; for the counters producers store with release (ready, completed,
        // broken, first_error) what they published before is then visible too.
        self.reserved.load(Ordering::Acquire)
    }
    /// WQEBBs published in order.
    pub fn ready(&self) -> u64 {
        self.ready.load(Ordering::Acquire)
    }
    /// Every WQEBB before this index has completed.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }
    /// CQEs the producers consumed.
    pub fn cqes(&self) -> u64 {
        self.cqes.load(Ordering::Acquire)
    }
    /// The wait that timed out first (`RSHMEM_IBGDA_WAIT_*`: 1 free slots, 2 in-order
    /// publication, 3 completion, 4 the doorbell lock) and the index it waited for.
    pub fn timed_out_waiting(&self) -> Option<(u32, u64)> {
        // Acquire: pairs with the producer's release of `what` after the index (a claim
        // in progress reads as u32::MAX, "being written").
        match self.timeout_what.load(Ordering::Acquire) {
            0 => None,
            w => Some((w, self.timeout_index.load(Ordering::Relaxed))),
        }
    }

    /// The queue is broken: a wait timed out holding a reservation it will never publish,
    /// or the doorbell lock was never released; every later post fails at once.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire) != 0
    }
    /// The first error CQE, once recorded.
    pub fn first_error(&self) -> Option<IbgdaError> {
        // Acquire: pairs with the producer's release of the flag, stored after the fields.
        if self.first_error.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(IbgdaError {
            syndrome: self.first_error_syndrome,
            vendor_err_synd: self.first_error_vendor,
            wqe_opcode: self.first_error_wqe_opcode,
            cqe_opcode: self.first_error_cqe_opcode,
            index: self.first_error_index,
        })
    }
}

/// `rshmem_ibgda_table_t`: 64 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbgdaTable {
    pub magic: u32,
    pub version: u32,
    pub n_qps: u32,
    pub flags: u32,
    /// Address of `IbgdaQp[n_qps]` as the producer sees it.
    pub qps: u64,
    /// `u64[n_results + 1]` result slots of the device API's fetching operations, in
    /// memory the engine writes (registered under `results_lkey`), as the producer
    /// addresses it; the last slot is a shared discard slot. 0 when none.
    pub results: u64,
    /// `u32[n_results]` slot locks in device memory (0 = free).
    pub result_locks: u64,
    pub n_results: u32,
    pub results_lkey: u32,
    pub reserved: [u64; 2],
}

impl IbgdaTable {
    pub fn new(qps: u64, n_qps: u32) -> IbgdaTable {
        IbgdaTable {
            magic: IBGDA_TABLE_MAGIC,
            version: IBGDA_VERSION,
            n_qps,
            flags: 0,
            qps,
            results: 0,
            result_locks: 0,
            n_results: 0,
            results_lkey: 0,
            reserved: [0; 2],
        }
    }

    /// The table with result slots for the device API's fetching operations: `n` slots
    /// (plus the discard slot) at `results` (producer's addresses, registered under
    /// `lkey`) and their locks at `locks` (device memory, zeroed).
    pub fn with_results(self, results: u64, locks: u64, n: u32, lkey: u32) -> IbgdaTable {
        IbgdaTable {
            results,
            result_locks: locks,
            n_results: n,
            results_lkey: lkey,
            ..self
        }
    }
}

/// Offsets in the order host/tests/ibgda-producer/producer.cpp's `ibgda_layout` prints
/// them (checked against g++ by host/tests/ibgda_cpp_producer.rs).
pub fn layout_facts() -> Vec<u64> {
    use std::mem::{align_of, offset_of, size_of};
    macro_rules! o {
        ($t:ty, $f:ident) => {
            offset_of!($t, $f) as u64
        };
    }
    vec![
        size_of::<IbgdaQp>() as u64,
        align_of::<IbgdaQp>() as u64,
        o!(IbgdaQp, sq),
        o!(IbgdaQp, qp_dbrec),
        o!(IbgdaQp, doorbell),
        o!(IbgdaQp, cq),
        o!(IbgdaQp, cq_dbrec),
        o!(IbgdaQp, timeout_ns),
        o!(IbgdaQp, wqe_cnt),
        o!(IbgdaQp, cqe_cnt),
        o!(IbgdaQp, qpn),
        o!(IbgdaQp, cq_mode),
        o!(IbgdaQp, reserved),
        o!(IbgdaQp, doorbell_mode),
        o!(IbgdaQp, ready),
        o!(IbgdaQp, rung),
        o!(IbgdaQp, ring_lock),
        o!(IbgdaQp, last_fence),
        o!(IbgdaQp, completed),
        o!(IbgdaQp, cq_ci),
        o!(IbgdaQp, cq_lock),
        o!(IbgdaQp, broken),
        o!(IbgdaQp, timeout_what),
        o!(IbgdaQp, timeout_index),
        o!(IbgdaQp, first_error),
        o!(IbgdaQp, first_error_syndrome),
        o!(IbgdaQp, first_error_vendor),
        o!(IbgdaQp, first_error_wqe_opcode),
        o!(IbgdaQp, first_error_cqe_opcode),
        o!(IbgdaQp, first_error_index),
        o!(IbgdaQp, cqes),
        size_of::<IbgdaTable>() as u64,
        o!(IbgdaTable, magic),
        o!(IbgdaTable, version),
        o!(IbgdaTable, n_qps),
        o!(IbgdaTable, flags),
        o!(IbgdaTable, qps),
        o!(IbgdaTable, results),
        o!(IbgdaTable, result_locks),
        o!(IbgdaTable, n_results),
        o!(IbgdaTable, results_lkey),
        IBGDA_TABLE_MAGIC as u64,
        IBGDA_VERSION as u64,
        IBGDA_CQ_NORMAL as u64,
        IBGDA_CQ_COLLAPSED as u64,
        IBGDA_DOORBELL_MEMORY as u64,
        IBGDA_DOORBELL_MMIO as u64,
        status::OK as u64,
        status::TIMEOUT as u64,
        status::CQE as u64,
        status::BROKEN as u64,
        status::TOO_BIG as u64,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_normal_cq_smaller_than_the_ring_is_refused() {
        let t = Duration::from_secs(1);
        let small = QueueMemory::new(64, 16).unwrap();
        let e = IbgdaQp::for_host(&small, 7, CqMode::Normal, t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 64 entries"), "{e}");
        // A collapsed CQ needs one entry; an equal normal one is enough.
        assert!(IbgdaQp::for_host(&small, 7, CqMode::Collapsed, t).is_ok());
        let equal = QueueMemory::new(64, 64).unwrap();
        assert!(IbgdaQp::for_host(&equal, 7, CqMode::Normal, t).is_ok());
        let addrs = QueueAddrs::of(&equal, 0);
        let e = IbgdaQp::new(addrs, 48, 64, 7, CqMode::Normal, t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("powers of two"), "{e}");
    }
}
