//! Queue memory laid out as an mlx5 NIC lays it out, and the many-producer send queue.
//!
//! [`QueueMemory`] owns one queue pair's memory: SQ ring, QP doorbell record, doorbell
//! word, CQ ring, CQ doorbell record ([`QueueLayout`] computes every offset). The engine
//! ([`super::engine`]) reads the SQ and writes the CQ; [`SendQueue`] is the producer side
//! used by CPU threads (GPU threads will run the same protocol in CUDA).
//!
//! Concurrency contract of the memory (the same one a NIC and a GPU agree on):
//! - SQ slots are written with plain stores by the one producer that reserved them, and
//!   read by the engine only after the doorbell record published them (Release/Acquire).
//!   A slot is reused only after its previous WQE's completion was observed.
//! - The doorbell record, doorbell word and CQ doorbell record are only accessed with
//!   atomic instructions.
//! - A CQE is accessed as eight 64-bit atomic words: the writer stores words 0..6, then
//!   word 7 (bytes 56..63, which hold `wqe_counter` and `op_own`) with Release; a reader
//!   loads word 7 with Acquire and decides ownership from it before reading the rest.

use crate::mlx5::cqe::{self, sw_owns, Cqe64, CqeOpcode, CQE_SIZE};
use crate::mlx5::doorbell::{cq_consumer_index, doorbell_word, send_counter};
use crate::mlx5::ring::slot_offset;
use crate::mlx5::wqe::{
    build_wqe, opcode, BuildError, CtrlSeg, DataSeg, FenceMode, WqeCtrl, WqeOp, MAX_WQEBBS, WQEBB,
};
use crate::mlx5::{Be32, WireStruct};
use std::alloc::Layout;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest SQ ring (WQEBBs): in-flight WQE indices must stay within half the 16-bit space.
pub const MAX_WQE_CNT: u32 = 1 << 14;
/// Largest CQ ring (entries).
pub const MAX_CQE_CNT: u32 = 1 << 16;

/// Offsets and sizes of one queue pair's memory. Every control word sits on its own
/// 64-byte line so producers and the engine do not false-share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLayout {
    pub wqe_cnt: u32,
    pub cqe_cnt: u32,
    /// SQ ring: `wqe_cnt` × 64 B.
    pub sq_offset: usize,
    /// QP doorbell record: 2 × BE32 (`[0]` receive, `[1]` send counter).
    pub qp_dbrec_offset: usize,
    /// Doorbell word (8 B), standing in for the UAR BlueFlame register at 0x800.
    pub doorbell_offset: usize,
    /// CQ ring: `cqe_cnt` × 64 B.
    pub cq_offset: usize,
    /// CQ doorbell record: 2 × BE32 (`[0]` consumer index, `[1]` arm).
    pub cq_dbrec_offset: usize,
    /// The soft HCA's asynchronous events of this QP (u32 of `EVENT_*` bits): where a
    /// verbs program would read `ibv_get_async_event`. Not part of mlx5's layout.
    pub event_offset: usize,
    /// Total bytes, a multiple of the page size.
    pub size: usize,
}

/// A queue of the wrong shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    #[error("wqe_cnt {0} must be a power of two in 1..={MAX_WQE_CNT}")]
    WqeCnt(u32),
    #[error("cqe_cnt {0} must be a power of two in 1..={MAX_CQE_CNT}")]
    CqeCnt(u32),
    #[error("cannot allocate {0} bytes of queue memory")]
    Alloc(usize),
}

impl QueueLayout {
    pub fn new(wqe_cnt: u32, cqe_cnt: u32) -> Result<QueueLayout, QueueError> {
        if !wqe_cnt.is_power_of_two() || wqe_cnt > MAX_WQE_CNT {
            return Err(QueueError::WqeCnt(wqe_cnt));
        }
        if !cqe_cnt.is_power_of_two() || cqe_cnt > MAX_CQE_CNT {
            return Err(QueueError::CqeCnt(cqe_cnt));
        }
        let sq_len = wqe_cnt as usize * WQEBB;
        let qp_dbrec_offset = sq_len;
        let doorbell_offset = qp_dbrec_offset + 64;
        let cq_offset = doorbell_offset + 64;
        let cq_dbrec_offset = cq_offset + cqe_cnt as usize * CQE_SIZE;
        let event_offset = cq_dbrec_offset + 64;
        let size = (event_offset + 64).next_multiple_of(crate::config::page_size());
        Ok(QueueLayout {
            wqe_cnt,
            cqe_cnt,
            sq_offset: 0,
            qp_dbrec_offset,
            doorbell_offset,
            cq_offset,
            cq_dbrec_offset,
            event_offset,
            size,
        })
    }
}

/// Asynchronous event bit: the CQ overran (`IBV_EVENT_CQ_ERR`): a completion was due and
/// every entry was unconsumed. The CQ takes no more completions.
pub const EVENT_CQ_ERR: u32 = 1;
/// Asynchronous event bit: the QP hit an error that prevents completions
/// (`IBV_EVENT_QP_FATAL`): raised with [`EVENT_CQ_ERR`] when the CQ overran, alone when the
/// send doorbell record was out of range. The QP is in the error state.
pub const EVENT_QP_FATAL: u32 = 2;

/// The memory of one queue pair: page-aligned host memory laid out by [`QueueLayout`]
/// ([`QueueMemory::new`]), or the queues of a real NIC QP ([`QueueMemory::from_parts`],
/// pointers from `mlx5dv_init_obj`), which [`SendQueue`] drives the same way.
#[derive(Debug)]
pub struct QueueMemory {
    base: *mut u8,
    layout: QueueLayout,
    parts: QueueParts,
    /// Keeps external queue memory alive (the verbs QP and CQ); None when owned.
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// Where each piece of a queue pair's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueParts {
    /// SQ ring (`wqe_cnt` × 64 B).
    pub sq: *mut u8,
    /// QP doorbell record (`[0]` receive, `[1]` send counter; 8-byte aligned).
    pub qp_dbrec: *mut u8,
    /// The 8-byte doorbell: the UAR BlueFlame register on a NIC, a plain word here.
    pub doorbell: *mut u8,
    /// CQ ring (`cqe_cnt` × 64 B).
    pub cq: *mut u8,
    /// CQ doorbell record (`[0]` consumer index, `[1]` arm).
    pub cq_dbrec: *mut u8,
}

// SAFETY: the memory is owned by this value until drop; concurrent access follows the
// module's contract (slot ownership for the SQ ring, atomics for everything else).
unsafe impl Send for QueueMemory {}
// SAFETY: as above.
unsafe impl Sync for QueueMemory {}

impl QueueMemory {
    /// Zeroed memory with every CQE's `op_own` = 0xF0 (INVALID, owner 0).
    pub fn new(wqe_cnt: u32, cqe_cnt: u32) -> Result<QueueMemory, QueueError> {
        let layout = QueueLayout::new(wqe_cnt, cqe_cnt)?;
        let l = Layout::from_size_align(layout.size, crate::config::page_size())
            .map_err(|_| QueueError::Alloc(layout.size))?;
        // SAFETY: l has a non-zero size (at least one page).
        let base = unsafe { std::alloc::alloc_zeroed(l) };
        if base.is_null() {
            return Err(QueueError::Alloc(layout.size));
        }
        // SAFETY: the CQ ring lies inside the fresh allocation, which nobody else sees yet.
        let cq = unsafe {
            std::slice::from_raw_parts_mut(base.add(layout.cq_offset), cqe_cnt as usize * 64)
        };
        cqe::init_cq(cq);
        // SAFETY: all five offsets were chosen by QueueLayout inside the allocation.
        let parts = unsafe {
            QueueParts {
                sq: base.add(layout.sq_offset),
                qp_dbrec: base.add(layout.qp_dbrec_offset),
                doorbell: base.add(layout.doorbell_offset),
                cq: base.add(layout.cq_offset),
                cq_dbrec: base.add(layout.cq_dbrec_offset),
            }
        };
        Ok(QueueMemory {
            base,
            layout,
            parts,
            owner: None,
        })
    }

    /// Queue memory that lives elsewhere: a NIC QP's SQ, doorbell record, BlueFlame
    /// register and CQ as `mlx5dv_init_obj` reports them. `owner` is kept until drop (the
    /// verbs objects that own the memory). Only `wqe_cnt` and `cqe_cnt` of [`layout`]
    /// are meaningful (its offsets are 0 and `size` 0), and [`base`] is the SQ.
    ///
    /// [`layout`]: QueueMemory::layout
    /// [`base`]: QueueMemory::base
    ///
    /// # Safety
    /// Each pointer must be valid, suitably aligned (8 bytes for the records and the
    /// doorbell, 64 for the rings) and large enough (`wqe_cnt` and `cqe_cnt` 64-byte
    /// entries) for as long as `owner` lives, and be accessed by nobody but the NIC and
    /// the [`SendQueue`] built on this memory. The CQ must have 64-byte CQEs.
    pub unsafe fn from_parts(
        parts: QueueParts,
        wqe_cnt: u32,
        cqe_cnt: u32,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<QueueMemory, QueueError> {
        if !wqe_cnt.is_power_of_two() || wqe_cnt > MAX_WQE_CNT {
            return Err(QueueError::WqeCnt(wqe_cnt));
        }
        if !cqe_cnt.is_power_of_two() || cqe_cnt > MAX_CQE_CNT {
            return Err(QueueError::CqeCnt(cqe_cnt));
        }
        Ok(QueueMemory {
            base: parts.sq,
            layout: QueueLayout {
                wqe_cnt,
                cqe_cnt,
                sq_offset: 0,
                qp_dbrec_offset: 0,
                doorbell_offset: 0,
                cq_offset: 0,
                cq_dbrec_offset: 0,
                event_offset: 0,
                size: 0,
            },
            parts,
            owner: Some(owner),
        })
    }

    /// Where each piece lives.
    pub fn parts(&self) -> QueueParts {
        self.parts
    }

    pub fn layout(&self) -> &QueueLayout {
        &self.layout
    }
    /// Base address (page-aligned).
    pub fn base(&self) -> *mut u8 {
        self.base
    }
    /// Start of the SQ ring.
    pub fn sq(&self) -> *mut u8 {
        self.parts.sq
    }
    fn word32(&self, p: *mut u8) -> &AtomicU32 {
        // SAFETY: p is a 4-aligned word of this queue memory (new(): an offset chosen by
        // QueueLayout; from_parts(): the caller's contract); the word is only ever
        // accessed atomically (module contract) and lives as long as &self.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }
    /// The send counter, `[1]` of the QP doorbell record (`BE32(pi & 0xffff)` as stored).
    pub fn qp_dbrec_send(&self) -> &AtomicU32 {
        // SAFETY: the record is 8 bytes; +4 is its second word.
        self.word32(unsafe { self.parts.qp_dbrec.add(4) })
    }
    /// The doorbell word (the BlueFlame register on a NIC: an 8-byte MMIO store).
    pub fn doorbell(&self) -> &AtomicU64 {
        // SAFETY: an 8-aligned word of this queue memory, accessed only atomically.
        unsafe { AtomicU64::from_ptr(self.parts.doorbell.cast()) }
    }
    /// Whether the doorbell is a device register (a NIC's queues from
    /// [`QueueMemory::from_parts`]) rather than a word of host memory.
    pub fn doorbell_is_device(&self) -> bool {
        self.owner.is_some()
    }
    /// The consumer index, `[0]` of the CQ doorbell record.
    pub fn cq_dbrec_ci(&self) -> &AtomicU32 {
        self.word32(self.parts.cq_dbrec)
    }
    /// The soft HCA's asynchronous event word (`EVENT_*` bits); None for a NIC's queues
    /// ([`QueueMemory::from_parts`]), whose events come through verbs.
    pub fn async_events(&self) -> Option<&AtomicU32> {
        if self.owner.is_some() {
            return None;
        }
        // SAFETY: event_offset + 4 <= size: inside the allocation made by new().
        Some(self.word32(unsafe { self.base.add(self.layout.event_offset) }))
    }
    #[inline]
    fn cqe_word(&self, slot: u32, w: usize) -> &AtomicU64 {
        let off = (slot & (self.layout.cqe_cnt - 1)) as usize * CQE_SIZE + w * 8;
        // SAFETY: inside the CQ ring (slot masked), 8-aligned; CQE words are only
        // accessed atomically (module contract).
        unsafe { AtomicU64::from_ptr(self.parts.cq.add(off).cast()) }
    }

    /// Writes CQE `cqe` into ring slot `slot` (masked): bytes 0..55 first, then bytes
    /// 56..63 (with `op_own`) with Release, so a reader that sees the new owner bit sees
    /// the whole CQE.
    #[inline]
    pub fn write_cqe(&self, slot: u32, cqe: &Cqe64) {
        let b = cqe.as_bytes();
        for w in 0..7 {
            let v = u64::from_ne_bytes(b[w * 8..w * 8 + 8].try_into().expect("8 bytes"));
            self.cqe_word(slot, w).store(v, Ordering::Relaxed);
        }
        let v = u64::from_ne_bytes(b[56..64].try_into().expect("8 bytes"));
        self.cqe_word(slot, 7).store(v, Ordering::Release);
    }

    /// `op_own` of ring slot `slot` (Acquire: pairs with write_cqe's Release).
    pub fn cqe_op_own(&self, slot: u32) -> u8 {
        self.cqe_word(slot, 7).load(Ordering::Acquire).to_ne_bytes()[7]
    }

    /// Reads CQE `slot`: word 7 with Acquire, then the rest. In collapsed mode the engine
    /// may rewrite the entry meanwhile: bytes 56..63 are always one CQE's, the others may
    /// belong to a later one.
    pub fn read_cqe(&self, slot: u32) -> Cqe64 {
        let mut b = [0u8; 64];
        let last = self.cqe_word(slot, 7).load(Ordering::Acquire);
        b[56..64].copy_from_slice(&last.to_ne_bytes());
        for w in 0..7 {
            let v = self.cqe_word(slot, w).load(Ordering::Relaxed);
            b[w * 8..w * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        }
        Cqe64::read_from(&b).expect("64 bytes")
    }
}

impl Drop for QueueMemory {
    fn drop(&mut self) {
        if self.owner.is_some() {
            return; // external memory: `owner` frees it when dropped after this
        }
        let l = Layout::from_size_align(self.layout.size, crate::config::page_size())
            .expect("layout was valid at allocation");
        // SAFETY: base was allocated with exactly this layout in new().
        unsafe { std::alloc::dealloc(self.base, l) }
    }
}

/// How the engine writes CQEs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CqMode {
    /// A ring of `cqe_cnt` entries with owner bits; the consumer advances the CQ doorbell
    /// record and the engine never overwrites an entry not yet consumed.
    #[default]
    Normal,
    /// Always CQE 0 (IBGDA's collapsed CQ): the owner bit alternates per write and
    /// `wqe_counter` tells how far the QP got. Overrun is allowed by definition. A failed
    /// WQE's CQE may be overwritten by the WR_FLUSH CQEs after it before anyone reads it,
    /// so a [`SendQueue`] on a collapsed CQ fails every wait once it saw any error, and
    /// the error it reports may be WR_FLUSH rather than the original syndrome.
    Collapsed,
}

/// A completion as the producer saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqeReport {
    /// CQE opcode (REQ, REQ_ERR, ...).
    pub cqe_opcode: u8,
    /// Opcode of the completed WQE.
    pub wqe_opcode: u8,
    /// 16-bit WQE index of the completed WQE.
    pub wqe_counter: u16,
    /// Unwrapped index of the completed WQE's first WQEBB.
    pub index: u64,
    pub syndrome: u8,
    pub vendor_err_synd: u8,
    pub byte_cnt: u32,
}

impl CqeReport {
    fn from_cqe(c: &Cqe64, index: u64) -> CqeReport {
        let e = c.as_err();
        let err = CqeOpcode::from_u8(c.opcode()).is_some_and(|o| o.is_error());
        CqeReport {
            cqe_opcode: c.opcode(),
            wqe_opcode: c.wqe_opcode(),
            wqe_counter: c.wqe_counter.get(),
            index,
            syndrome: if err { e.syndrome } else { 0 },
            vendor_err_synd: if err { e.vendor_err_synd } else { 0 },
            byte_cnt: c.byte_cnt.get(),
        }
    }
    pub fn is_error(&self) -> bool {
        CqeOpcode::from_u8(self.cqe_opcode).is_some_and(|o| o.is_error())
    }
    /// `REQ_ERR syndrome LOCAL_PROT (0x04), WQE RDMA_WRITE (0x08) #12` or `REQ ...`.
    pub fn describe(&self) -> String {
        let op = CqeOpcode::from_u8(self.cqe_opcode).map_or("?", |o| o.name());
        let wop = opcode::name(self.wqe_opcode).unwrap_or("?");
        if self.is_error() {
            let s = crate::mlx5::Syndrome::from_u8(self.syndrome).map_or("?", |s| s.name());
            format!(
                "{op} syndrome {s} ({:#04x}) vendor {:#04x} for WQE {wop} ({:#04x}) at index {:#06x}",
                self.syndrome, self.vendor_err_synd, self.wqe_opcode, self.wqe_counter
            )
        } else {
            format!(
                "{op} for WQE {wop} ({:#04x}) at index {:#06x}, {} bytes",
                self.wqe_opcode, self.wqe_counter, self.byte_cnt
            )
        }
    }
}

/// Why a send-queue operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SqError {
    /// A bounded wait expired.
    #[error(
        "QP {qpn:#x}: timed out after {waited_ms} ms waiting for {what} (WQE index {index:#x}; \
         reserved {reserved:#x}, ready {ready:#x}, completed {completed:#x}; last CQE: {last})"
    )]
    Timeout {
        qpn: u32,
        what: &'static str,
        index: u64,
        reserved: u64,
        ready: u64,
        completed: u64,
        last: String,
        waited_ms: u64,
    },
    /// The QP went to the error state at or before the WQE waited for (with a collapsed
    /// CQ: at all — any error seen fails every wait, and `first` may be a later WQE's
    /// WR_FLUSH rather than the failed WQE's own CQE).
    #[error("QP {qpn:#x}: {}", first.describe())]
    Completion { qpn: u32, first: CqeReport },
    /// A WQE could not be built (a caller error).
    #[error("QP {qpn:#x}: cannot build the WQE: {source}")]
    Build { qpn: u32, source: BuildError },
    /// An earlier wait failed (timed out with slots reserved but never published, or
    /// found the CQ overrun): the queue cannot make progress any more.
    #[error("QP {qpn:#x} is unusable after an earlier failed wait (timeout or CQ overrun)")]
    Broken { qpn: u32 },
    /// Another producer's wait failed (see [`SqError::Broken`]) while this one was waiting:
    /// what it waited for may never come, so it stopped instead of waiting out its timeout.
    #[error(
        "QP {qpn:#x}: stopped waiting for {what} (WQE index {index:#x}): another producer's \
         wait failed meanwhile (timeout or CQ overrun; its error names the cause) and the \
         queue is unusable"
    )]
    BrokenWhileWaiting {
        qpn: u32,
        what: &'static str,
        index: u64,
    },
    /// The engine raised an asynchronous event: the CQ overran (a normal-mode CQ needs as
    /// many entries as completions can be outstanding: at least the SQ's WQEBBs), which
    /// put the QP in the error state; completions will not come.
    #[error(
        "QP {qpn:#x}: the CQ overran (IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL; events {events:#x}): \
         a completion was due with all {cqe_cnt} entries unconsumed, so the QP is in the error \
         state and posts no more completions; give the CQ at least as many entries as the \
         send queue has WQEBBs ({wqe_cnt}) and poll it"
    )]
    CqOverrun {
        qpn: u32,
        events: u32,
        cqe_cnt: u32,
        wqe_cnt: u32,
    },
    /// The engine raised QP_FATAL without CQ_ERR: the send doorbell record named a
    /// producer index more than a ring away from what the engine had consumed (a producer
    /// wrote the record wrongly), so the QP is in the error state and runs nothing more.
    #[error(
        "QP {qpn:#x}: fatal QP error (IBV_EVENT_QP_FATAL; events {events:#x}): the send \
         doorbell record named a producer index more than the ring's {wqe_cnt} WQEBBs away \
         from what the engine consumed (whoever wrote the record wrote it wrongly), so the QP \
         is in the error state"
    )]
    QpFatal { qpn: u32, events: u32, wqe_cnt: u32 },
    /// The producer's abort check (see [`SendQueue::set_abort`]) said stop waiting: the
    /// job is failing (a peer died).
    #[error("QP {qpn:#x}: wait abandoned, the job is failing")]
    Aborted { qpn: u32 },
}

/// What the CQ poller owns (one poller at a time).
#[derive(Debug, Default)]
struct CqConsumer {
    /// Unwrapped consumer index (normal mode) or CQEs seen (collapsed mode).
    ci: u32,
    last: Option<CqeReport>,
}

/// Spins before a waiting producer yields its core.
const SPIN: u32 = 256;

/// WQEBBs between requested CQEs for a ring of `wqe_cnt` WQEBBs: `wqe_cnt / 4`, at most
/// 32. Why that is safe: a reservation of `n` WQEBBs at `idx` waits for everything before
/// `idx + n - wqe_cnt` to complete; the WQE that crosses the last multiple `b` of the
/// interval `m` at or before `idx` is signalled and ends in `[b, idx]`, with
/// `b > idx - m`; so it suffices that `n <= wqe_cnt - m + 1`, which holds for every
/// `n <= MAX_WQEBBS` when `wqe_cnt >= 4 * MAX_WQEBBS`. Smaller rings signal every WQE.
fn signal_interval(wqe_cnt: u64) -> u64 {
    if wqe_cnt < 4 * MAX_WQEBBS as u64 {
        1
    } else {
        (wqe_cnt / 4).min(32)
    }
}

/// The producer side of a send queue: any number of threads post concurrently.
///
/// Indices are unwrapped 64-bit WQEBB counts; the 16-bit WQE index in a control segment
/// is their low 16 bits. Protocol (docs/soft-hca.md):
/// 1. reserve `n` WQEBBs: `idx = reserved.fetch_add(n)`; wait (bounded) until
///    `idx + n - completed <= wqe_cnt` and no slot of the range is held;
/// 2. write the WQE (built with `build_wqe`) into the slots, wrapping;
/// 3. publish in order: wait until `ready == idx`, then `ready = idx + n` (Release);
/// 4. doorbell (batched): the producer that finds no later reservation rings, and so does
///    every waiter before it waits; ringing stores the doorbell record (Release) and then
///    the doorbell word, under a small lock so the record never moves backwards.
///
/// Selective signalling (as `ib_write_bw --cq-mod` and most verbs producers do): a WQE
/// asks for a CQE only when it ends at or past a multiple of [`SendQueue::signal_every`]
/// WQEBBs, or when it is held (its poster waits for it). A CQE completes every WQE up to
/// the one it names, so slot reuse keeps working; a wait for an index that no signalled
/// WQE covers yet (`quiet`, `wait_posted`) first posts a signalled NOP. Errors still
/// produce CQEs for unsignalled WQEs (the engine, like a ConnectX, always reports them).
#[derive(Debug)]
pub struct SendQueue {
    mem: Arc<QueueMemory>,
    qpn: u32,
    cq_mode: CqMode,
    timeout: Duration,
    mask: u64,
    reserved: AtomicU64,
    ready: AtomicU64,
    /// All WQEBBs before this index have completed (retired from the CQ).
    completed: AtomicU64,
    /// Ringing: the doorbell record has been set to `rung`.
    rung: AtomicU64,
    ring_lock: AtomicBool,
    /// A CQE is requested at least every this many WQEBBs (a power of two).
    signal_every: u64,
    /// End (unwrapped) of the latest published WQE that requested a CQE.
    signaled_end: AtomicU64,
    /// Signalled NOPs posted by waits (diagnostics, tests).
    signal_nops: AtomicU64,
    /// WQEBBs of the WQE starting at each slot (written before publishing; read by the
    /// CQ poller to turn a completed WQE's index into the end of its slots).
    sizes: Box<[AtomicU8]>,
    /// Slots whose staging a producer still reads after completion (see post_held).
    held: Box<[AtomicBool]>,
    /// 1 + the index of the latest FENCEd NOP [`SendQueue::fence`] reserved (0: none).
    last_fence: AtomicU64,
    cq: Mutex<CqConsumer>,
    first_error: Mutex<Option<CqeReport>>,
    has_error: AtomicBool,
    broken: AtomicBool,
    wake: Option<Arc<super::engine::Waker>>,
    abort: Option<Abort>,
}

/// The abort check of a [`SendQueue`] (Debug-printable holder).
struct Abort(AbortCheck);

impl std::fmt::Debug for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Abort(..)")
    }
}

/// Called while a wait yields; `true` abandons the wait with [`SqError::Aborted`].
pub type AbortCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// A [`SendQueue`]'s producer counters (unwrapped WQEBB indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SqCounters {
    /// WQEBBs reserved by producers.
    pub reserved: u64,
    /// WQEBBs published in order (written and visible).
    pub ready: u64,
    /// The doorbell record and doorbell were last written with this index.
    pub rung: u64,
    /// Every WQEBB before this index has completed (its CQE consumed).
    pub completed: u64,
    /// A wait timed out with slots reserved but never published.
    pub broken: bool,
}

/// A posted WQE: its unwrapped index and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a posted WQE completes later; wait for it or quiet the queue"]
pub struct Posted {
    pub index: u64,
    pub wqebbs: u16,
}

impl SendQueue {
    /// A producer for the queue in `mem` with QP number `qpn`; `timeout` bounds every
    /// wait; `wake` (optional) is called after a doorbell, to wake a sleeping engine.
    pub fn new(
        mem: Arc<QueueMemory>,
        qpn: u32,
        cq_mode: CqMode,
        timeout: Duration,
        wake: Option<Arc<super::engine::Waker>>,
    ) -> SendQueue {
        let n = mem.layout().wqe_cnt as usize;
        SendQueue {
            signal_every: signal_interval(n as u64),
            signaled_end: AtomicU64::new(0),
            signal_nops: AtomicU64::new(0),
            mask: n as u64 - 1,
            sizes: (0..n).map(|_| AtomicU8::new(1)).collect(),
            held: (0..n).map(|_| AtomicBool::new(false)).collect(),
            last_fence: AtomicU64::new(0),
            mem,
            qpn,
            cq_mode,
            timeout,
            reserved: AtomicU64::new(0),
            ready: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            rung: AtomicU64::new(0),
            ring_lock: AtomicBool::new(false),
            cq: Mutex::new(CqConsumer::default()),
            first_error: Mutex::new(None),
            has_error: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            wake,
            abort: None,
        }
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    pub fn memory(&self) -> &Arc<QueueMemory> {
        &self.mem
    }
    pub fn wqe_cnt(&self) -> u32 {
        self.mem.layout().wqe_cnt
    }
    /// A CQE is requested at least every this many WQEBBs (see the type's documentation).
    pub fn signal_every(&self) -> u64 {
        self.signal_every
    }
    /// Signalled NOPs that waits posted so that a CQE would cover what they waited for
    /// (included in [`SendQueue::reserved`]).
    pub fn signal_nops(&self) -> u64 {
        self.signal_nops.load(Ordering::Relaxed)
    }
    /// WQEBBs reserved so far (unwrapped).
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }
    /// All WQEBBs before this index have completed.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }
    /// The producer counters, for diagnostics (`rshmem doctor --queues`). Each is read
    /// on its own (Acquire), so they agree with each other only while the queue is idle.
    pub fn counters(&self) -> SqCounters {
        SqCounters {
            reserved: self.reserved.load(Ordering::Acquire),
            ready: self.ready.load(Ordering::Acquire),
            rung: self.rung.load(Ordering::Acquire),
            completed: self.completed.load(Ordering::Acquire),
            broken: self.broken.load(Ordering::Acquire),
        }
    }
    /// The first error CQE seen, if the QP is in the error state (with a collapsed CQ it
    /// may be a WR_FLUSH CQE after the WQE that failed: see [`CqMode::Collapsed`]).
    pub fn error(&self) -> Option<CqeReport> {
        if !self.has_error.load(Ordering::Acquire) {
            return None;
        }
        *self.first_error.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The last CQE this producer consumed.
    pub fn last_cqe(&self) -> Option<CqeReport> {
        self.cq.lock().unwrap_or_else(|e| e.into_inner()).last
    }

    /// OpenSHMEM fence on this QP: posts a NOP with fence mode FENCE. Every WQE reserved
    /// before the call (the caller's earlier ones) completes before the NOP starts, and
    /// every WQE reserved after it (the caller's later ones) starts after it. A WQE, not a
    /// flag for "the next post": with concurrent producers the next reservation may be
    /// another thread's, made before the caller's earlier WQEs, and a FENCE there would
    /// order nothing the caller posted (CUDA twin: queue.cuh `fence`).
    pub fn fence(&self) -> Result<Posted, SqError> {
        let p = self.post_inner(1, false, false, true, |_| WqeOp::Nop)?;
        // Release: whoever acquires this value and then reserves comes after the NOP's
        // reservation in `reserved`'s order.
        self.last_fence.fetch_max(p.index + 1, Ordering::Release);
        Ok(p)
    }

    /// Whether the calling thread's fence needs a NOP here: not when every WQE reserved so
    /// far completed (nothing to order), nor when the latest reservation so far is a
    /// FENCEd NOP (`last_fence >= reserved`: no WQE starts at or after the NOP's end, so
    /// every other one, the caller's earlier ones included — they lie below `reserved` as
    /// read here, its own fetch-adds coming first in that word's order — lies below the
    /// NOP; its later ones will follow the NOP, whose reservation happens before the
    /// release of `last_fence` acquired here). CUDA twin: queue.cuh `fence_needed`.
    pub fn fence_needed(&self) -> bool {
        // Acquire all three: `reserved` covers this thread's reservations; `completed`
        // pairs with poll_cq's release; `last_fence` with fence's release.
        let end = self.reserved.load(Ordering::Acquire);
        if self.completed.load(Ordering::Acquire) >= end {
            return false;
        }
        self.last_fence.load(Ordering::Acquire) < end
    }

    /// Builds and posts `op` (every rshmem WQE requests a CQE).
    pub fn post(&self, op: &WqeOp<'_>) -> Result<Posted, SqError> {
        self.post_op(op, false)
    }

    /// [`SendQueue::post`] with fence mode FENCE on `op` itself: it starts only after every
    /// WQE reserved before it completed (a signal after the data it announces).
    pub fn post_fenced(&self, op: &WqeOp<'_>) -> Result<Posted, SqError> {
        self.post_op(op, true)
    }

    fn post_op(&self, op: &WqeOp<'_>, fenced: bool) -> Result<Posted, SqError> {
        let mut buf = [0u8; MAX_WQEBBS * WQEBB];
        let size =
            build_wqe(&mut buf, &WqeCtrl::default(), op).map_err(|source| SqError::Build {
                qpn: self.qpn,
                source,
            })?;
        self.post_inner(size.wqebbs(), false, false, fenced, |_| *op)
    }

    /// Reserves `wqebbs` WQEBBs and posts the WQE `f(index)` builds there (for WQEs whose
    /// operands depend on the slot, e.g. per-slot staging buffers). With `hold`, the
    /// first slot stays reserved after completion until [`SendQueue::release`] (so its
    /// staging can be read). If `f`'s WQE is not exactly `wqebbs` long, a NOP of that size
    /// is posted instead and the build error returned.
    pub fn post_fn<'a>(
        &self,
        wqebbs: u16,
        hold: bool,
        f: impl FnOnce(u64) -> WqeOp<'a>,
    ) -> Result<Posted, SqError> {
        self.post_inner(wqebbs, hold, false, false, f)
    }

    /// [`SendQueue::post_fn`] with fence mode FENCE on the WQE (see
    /// [`SendQueue::post_fenced`]).
    pub fn post_fn_fenced<'a>(
        &self,
        wqebbs: u16,
        f: impl FnOnce(u64) -> WqeOp<'a>,
    ) -> Result<Posted, SqError> {
        self.post_inner(wqebbs, false, false, true, f)
    }

    fn post_inner<'a>(
        &self,
        wqebbs: u16,
        hold: bool,
        force_signal: bool,
        fenced: bool,
        f: impl FnOnce(u64) -> WqeOp<'a>,
    ) -> Result<Posted, SqError> {
        let n = wqebbs.clamp(1, MAX_WQEBBS as u16) as u64;
        self.can_reserve(n, n as usize * 4)?;
        // 1. Reserve. AcqRel: reservations are totally ordered by this RMW; nothing else
        // is published by it.
        let idx = self.reserved.fetch_add(n, Ordering::AcqRel);
        self.wait_slots_free(idx, n)?;
        self.prefetch_ahead(idx + n);
        if hold {
            // Relaxed: only this producer sets/clears it; reservers that read it do so
            // after observing completion of this WQE, which is published after this store
            // (ready's Release → engine → CQE Release → poller).
            self.held[(idx & self.mask) as usize].store(true, Ordering::Relaxed);
        }
        // 2. Build and write.
        let fence = if fenced {
            FenceMode::Fence
        } else {
            FenceMode::None
        };
        let signaled =
            hold || force_signal || (idx + n) / self.signal_every != idx / self.signal_every;
        let ctrl = WqeCtrl {
            wqe_index: idx as u16,
            qpn: self.qpn,
            fence,
            cq_update: signaled,
            solicited: false,
        };
        let len = n as usize * WQEBB;
        let cnt = self.wqe_cnt();
        let off = slot_offset(idx as u32, cnt);
        let contiguous = off + len <= cnt as usize * WQEBB;
        let mut wrapped;
        let buf: &mut [u8] = if contiguous {
            // SAFETY: off + len is inside the ring; these slots were reserved by this
            // producer and their previous WQE completed (wait_slots_free), so nobody else
            // reads or writes them until we publish: building in place is exclusive.
            unsafe { std::slice::from_raw_parts_mut(self.mem.sq().add(off), len) }
        } else {
            // A WQE that wraps the ring end is built here and copied in two pieces.
            wrapped = [0u8; MAX_WQEBBS * WQEBB];
            &mut wrapped[..len]
        };
        let result = self.build_or_nop(buf, &ctrl, n, &f(idx));
        if !contiguous {
            self.write_slots(idx, buf);
        }
        if hold && result.is_err() {
            // No `Posted` goes back, so nobody would release the slot: a later reservation
            // of it would wait out the timeout. The NOP needs no staging. Release: as in
            // `release`.
            self.held[(idx & self.mask) as usize].store(false, Ordering::Release);
        }
        // Relaxed: published by the Release store of `ready` below.
        self.sizes[(idx & self.mask) as usize].store(n as u8, Ordering::Relaxed);
        // 3. Publish in order.
        self.publish(idx, n)?;
        if signaled {
            // Release: a waiter that reads this end and then waits on the CQ relies on
            // nothing else; the WQE itself is published by `ready`.
            self.signaled_end.fetch_max(idx + n, Ordering::Release);
        }
        // 4. Doorbell, batched: ring if nobody reserved after us (a later reserver rings
        // when it publishes, and any waiter rings before it waits).
        if self.reserved.load(Ordering::Acquire) == idx + n {
            self.ring();
        }
        result.map(|()| Posted {
            index: idx,
            wqebbs: n as u16,
        })
    }

    /// Posts `count` one-WQEBB WQEs in one reservation of `count` consecutive slots, WQE
    /// `i` built by `f(i, index, seg)` (`seg`: room for the one data segment the WQE may
    /// point to; besides it, the WQE may borrow only `'static` data); each asks for a CQE
    /// and is held (as `post_fn`'s `hold`)
    /// until [`SendQueue::release`]. Returns every WQE posted — a WQE whose build failed is
    /// a NOP, still held: release them all — and the first build error.
    ///
    /// Why one reservation: a producer may reserve only while it holds nothing. One that
    /// posted its held WQEs one reservation at a time held the first while reserving the
    /// next; another producer's reservation one ring later than the first waited for that
    /// slot, and this producer's later reservation, behind it, waited to publish: both
    /// waited out the timeout and the queue broke (a batched proxy get beside a large put
    /// from another thread of the PE). No reservation can fall inside a batch, and the
    /// batch's holder reserves nothing more before it releases it.
    pub fn post_held_batch(
        &self,
        count: u16,
        mut f: impl for<'s> FnMut(usize, u64, &'s mut [DataSeg; 1]) -> WqeOp<'s>,
    ) -> Result<(Vec<Posted>, Option<SqError>), SqError> {
        let n = count as u64;
        self.can_reserve(n, 4)?;
        // A batch must leave room for the unsignalled WQEs before it: its holder cannot
        // post the signalled NOP that would complete them, and a NOP another thread posts
        // lands behind the batch. Past `wqe_cnt - signal_every + 1` slots the reservation
        // could wait for them until the queue breaks (`signal_interval`'s bound).
        let most = self.wqe_cnt() as u64 - self.signal_every + 1;
        if n > most {
            return Err(SqError::Build {
                qpn: self.qpn,
                source: BuildError::BufferTooSmall {
                    need: n as usize * WQEBB,
                    have: most as usize * WQEBB,
                    ds: 4,
                },
            });
        }
        if n == 0 {
            return Ok((Vec::new(), None));
        }
        // 1. Reserve, as `post_inner` does, all `count` slots at once.
        let idx = self.reserved.fetch_add(n, Ordering::AcqRel);
        self.wait_slots_free(idx, n)?;
        self.prefetch_ahead(idx + n);
        let cnt = self.wqe_cnt();
        let mut posted = Vec::with_capacity(count as usize);
        let mut first_err = None;
        for i in 0..n {
            let at = idx + i;
            // Relaxed: as in `post_inner` (published by `ready` below).
            self.held[(at & self.mask) as usize].store(true, Ordering::Relaxed);
            let ctrl = WqeCtrl {
                wqe_index: at as u16,
                qpn: self.qpn,
                fence: FenceMode::None,
                cq_update: true,
                solicited: false,
            };
            // SAFETY: one WQEBB at a slot boundary is inside the ring and never wraps; the
            // slot is part of this producer's reservation and its previous WQE completed
            // (wait_slots_free), so nobody else reads or writes it until we publish.
            let buf = unsafe {
                std::slice::from_raw_parts_mut(
                    self.mem.sq().add(slot_offset(at as u32, cnt)),
                    WQEBB,
                )
            };
            let mut seg = [DataSeg::default()];
            if let Err(e) = self.build_or_nop(buf, &ctrl, 1, &f(i as usize, at, &mut seg)) {
                first_err.get_or_insert(e);
            }
            // Relaxed: published by the Release store of `ready` below.
            self.sizes[(at & self.mask) as usize].store(1, Ordering::Relaxed);
            posted.push(Posted {
                index: at,
                wqebbs: 1,
            });
        }
        // 3. Publish in order, 4. doorbell: as in `post_inner`.
        if let Err(e) = self.publish(idx, n) {
            for p in &posted {
                self.release(*p);
            }
            return Err(e);
        }
        // Release: as in `post_inner`.
        self.signaled_end.fetch_max(idx + n, Ordering::Release);
        if self.reserved.load(Ordering::Acquire) == idx + n {
            self.ring();
        }
        Ok((posted, first_err))
    }

    /// Builds `op` into `buf` (the `n` WQEBBs of a reservation, `ctrl` its control fields);
    /// a WQE that fails to build or is not exactly `n` WQEBBs long is replaced by a NOP
    /// spanning them, so the queue stays whole, and the build error returned.
    fn build_or_nop(
        &self,
        buf: &mut [u8],
        ctrl: &WqeCtrl,
        n: u64,
        op: &WqeOp<'_>,
    ) -> Result<(), SqError> {
        let other = match build_wqe(buf, ctrl, op) {
            Ok(s) if s.wqebbs() as u64 == n => return Ok(()),
            other => other,
        };
        let nop = CtrlSeg::new(
            ctrl.wqe_index,
            opcode::NOP,
            0,
            self.qpn,
            ctrl.fm_ce_se(),
            (n * 4) as u8,
            0,
            Be32::new(0),
        );
        buf.fill(0);
        nop.write_to(buf).expect("16 bytes fit");
        Err(SqError::Build {
            qpn: self.qpn,
            source: match other {
                Err(e) => e,
                Ok(s) => BuildError::BufferTooSmall {
                    need: s.bytes(),
                    have: n as usize * WQEBB,
                    ds: s.ds as usize,
                },
            },
        })
    }

    /// Whether a reservation of `n` WQEBBs may be made: the queue is not broken, and `n`
    /// fits the ring (`ds`: the data segments the refused WQE would have had, for the error).
    fn can_reserve(&self, n: u64, ds: usize) -> Result<(), SqError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(SqError::Broken { qpn: self.qpn });
        }
        if n > self.wqe_cnt() as u64 {
            return Err(SqError::Build {
                qpn: self.qpn,
                source: BuildError::BufferTooSmall {
                    need: n as usize * WQEBB,
                    have: self.wqe_cnt() as usize * WQEBB,
                    ds,
                },
            });
        }
        Ok(())
    }

    /// Takes the slot [`PREFETCH_AHEAD`] WQEBBs past `next` into this core's cache for
    /// writing, if that slot is already free (its previous WQE completed), so that a later
    /// post does not wait for it.
    ///
    /// Why: a slot's line was last read by the engine, on another core. A store to it
    /// waits in the store buffer for the line, and the next locked instruction (the next
    /// reservation, the ring lock) waits for the store buffer: one cross-core transfer
    /// per WQE, serialised. Fetched ahead, the transfer overlaps the posts before it. On a
    /// 2-vCPU VM this took 8-byte WRITEs from 3.6–7 to 11–23 M/s when the cores' round
    /// trip was ~600 ns (docs/soft-hca.md, "session 10").
    #[inline]
    fn prefetch_ahead(&self, next: u64) {
        let cnt = self.wqe_cnt() as u64;
        if cnt < 2 * PREFETCH_AHEAD {
            return;
        }
        let ahead = next + PREFETCH_AHEAD;
        // Relaxed: a hint decides nothing; a stale `completed` only skips a prefetch.
        if ahead >= self.completed.load(Ordering::Relaxed) + cnt {
            return; // the engine may still have to read that slot: leave its line alone
        }
        let off = slot_offset(ahead as u32, cnt as u32);
        // SAFETY: off < ring length, so the pointer stays inside the ring's mapping.
        prefetch_for_write(unsafe { self.mem.sq().add(off) });
    }

    /// Lets the slot of a WQE posted with `hold` be reused.
    pub fn release(&self, p: Posted) {
        // Release: our reads of the slot's staging happen before a later producer's
        // writes to it (it acquires this flag in wait_slots_free).
        self.held[(p.index & self.mask) as usize].store(false, Ordering::Release);
    }

    fn write_slots(&self, idx: u64, wqe: &[u8]) {
        let cnt = self.wqe_cnt();
        let ring_len = cnt as usize * WQEBB;
        let off = slot_offset(idx as u32, cnt);
        let first = wqe.len().min(ring_len - off);
        // SAFETY: off + first <= ring_len and wqe.len() - first <= ring_len (wqe is at
        // most the ring: checked in post_fn); these slots were reserved by this producer
        // and their previous WQE completed (wait_slots_free), so no one else accesses them.
        unsafe {
            std::ptr::copy_nonoverlapping(wqe.as_ptr(), self.mem.sq().add(off), first);
            std::ptr::copy_nonoverlapping(
                wqe.as_ptr().add(first),
                self.mem.sq(),
                wqe.len() - first,
            );
        }
    }

    fn timeout_error(&self, what: &'static str, index: u64, waited: Duration) -> SqError {
        SqError::Timeout {
            qpn: self.qpn,
            what,
            index,
            reserved: self.reserved.load(Ordering::Relaxed),
            ready: self.ready.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            last: self
                .last_cqe()
                .map_or_else(|| "none".to_string(), |c| c.describe()),
            waited_ms: waited.as_millis() as u64,
        }
    }

    /// Makes every wait that has started yielding also stop when `abort()` says so (a
    /// PE's liveness check: a dead peer ends the wait at once instead of at the timeout).
    pub fn set_abort(&mut self, abort: AbortCheck) {
        self.abort = Some(Abort(abort));
    }

    /// Bounded wait: `done()` polled with spinning, then yielding.
    fn wait(
        &self,
        what: &'static str,
        index: u64,
        mut done: impl FnMut() -> bool,
    ) -> Result<(), SqError> {
        let mut polls = 0u32;
        let mut start: Option<Instant> = None;
        // Held from the first assisting poll on (progress handover, see `Waker`).
        let mut _drive = None;
        // A completion is needed: a backend that defers confirmations must not now.
        let _cq_wait = self.wake.as_ref().map(|w| w.wait_completion());
        while !done() {
            polls = polls.wrapping_add(1);
            if polls < SPIN {
                std::hint::spin_loop();
                continue;
            }
            if _drive.is_none() {
                _drive = self.wake.as_ref().map(|w| w.drive());
            }
            let t0 = *start.get_or_insert_with(Instant::now);
            if self.abort.as_ref().is_some_and(|a| (a.0)()) {
                return Err(SqError::Aborted { qpn: self.qpn });
            }
            // Acquire: pairs with the engine's Release when it raised the event.
            if let Some(e) = self.mem.async_events().map(|w| w.load(Ordering::Acquire)) {
                if e != 0 {
                    // What we wait for may have completed just before another WQE
                    // overran the CQ: look once more.
                    if done() {
                        return Ok(());
                    }
                    // Reservations after the overrun can never complete.
                    self.broken.store(true, Ordering::Release);
                    // An error CQE at or before what we wait for is the real cause (the
                    // overrun came from the flush after it).
                    if let Some(first) = self.error().filter(|f| f.index <= index) {
                        return Err(self.completion_error(first));
                    }
                    let l = self.mem.layout();
                    if e & EVENT_CQ_ERR == 0 {
                        return Err(SqError::QpFatal {
                            qpn: self.qpn,
                            events: e,
                            wqe_cnt: l.wqe_cnt,
                        });
                    }
                    return Err(SqError::CqOverrun {
                        qpn: self.qpn,
                        events: e,
                        cqe_cnt: l.cqe_cnt,
                        wqe_cnt: l.wqe_cnt,
                    });
                }
            }
            // Another producer's wait failed holding a reservation it will never publish:
            // what we wait for may never come (a later reservation is never published, and
            // nothing past the hole completes), so stop now rather than at our own timeout.
            // As the CUDA producer does (rshmem/ibgda/queue.cuh), every wait stops, even
            // one for a WQE before the hole; the queue takes no more posts anyway.
            // Acquire: pairs with the Release of the waiter that broke the queue.
            if self.broken.load(Ordering::Acquire) {
                return Err(SqError::BrokenWhileWaiting {
                    qpn: self.qpn,
                    what,
                    index,
                });
            }
            if t0.elapsed() >= self.timeout {
                return Err(self.timeout_error(what, index, t0.elapsed()));
            }
            // Run an engine round here if the engine is free (no context switch needed);
            // otherwise give the core away.
            if !self.wake.as_ref().is_some_and(|w| w.assist()) {
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    fn wait_slots_free(&self, idx: u64, n: u64) -> Result<(), SqError> {
        let cnt = self.wqe_cnt() as u64;
        let free = |s: &Self| {
            // Acquire: the engine finished reading these slots before the CQE that
            // advanced `completed` (and holders finished reading staging before release).
            idx + n <= s.completed.load(Ordering::Acquire) + cnt
                && (idx..idx + n).all(|i| !s.held[(i & s.mask) as usize].load(Ordering::Acquire))
        };
        if free(self) {
            return Ok(());
        }
        let r = self.wait("free send-queue slots", idx, || {
            self.ring();
            self.poll_cq();
            free(self)
        });
        if r.is_err() {
            // Our reservation can never be published: later producers would wait forever.
            self.broken.store(true, Ordering::Release);
        }
        r
    }

    fn publish(&self, idx: u64, n: u64) -> Result<(), SqError> {
        // Acquire: not needed for data (each producer publishes its own slots), but keeps
        // the chain of ready heads ordered for whoever reads ours.
        if self.ready.load(Ordering::Acquire) != idx {
            let r = self.wait("earlier producers to publish", idx, || {
                self.ready.load(Ordering::Acquire) == idx
            });
            if r.is_err() {
                self.broken.store(true, Ordering::Release);
                return r;
            }
        }
        // Release: the WQE bytes written above (and everything earlier producers published,
        // which we acquired) are visible to whoever acquires this head.
        self.ready.store(idx + n, Ordering::Release);
        Ok(())
    }

    /// Rings the doorbell for everything published so far (if not rung yet).
    pub fn ring(&self) {
        let mut spins = 0u32;
        loop {
            let ready = self.ready.load(Ordering::Acquire);
            if self.rung.load(Ordering::Acquire) >= ready {
                return;
            }
            // Acquire: enter the ringer's critical section after the previous ringer left.
            if self
                .ring_lock
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                let ready = self.ready.load(Ordering::Acquire);
                if self.rung.load(Ordering::Relaxed) < ready {
                    // Release: the engine that acquires the record sees the WQE bytes
                    // (which happen-before `ready`, acquired above).
                    self.mem.qp_dbrec_send().store(
                        u32::from_ne_bytes(send_counter(ready as u32).to_bytes()),
                        Ordering::Release,
                    );
                    // Then the doorbell word (the UAR write of a real NIC). Release keeps
                    // it after the record in host memory; a NIC register also needs the
                    // record ordered before a device store for the NIC, which observes
                    // from outside the inner-shareable domain (dmb osh on aarch64, as
                    // rdma-core's mmio_wc_start; mfence on x86).
                    if self.mem.doorbell_is_device() {
                        crate::verbs::relay::before_device_store();
                    }
                    self.mem
                        .doorbell()
                        .store(doorbell_word(ready as u16, self.qpn), Ordering::Release);
                    if self.mem.doorbell_is_device() {
                        // A NIC's BlueFlame register is mapped write-combining: the store
                        // may sit in the core's WC buffer until something drains it. Drain
                        // it now (mfence on x86, dsb st on aarch64), as rdma-core's
                        // mmio_flush_writes does after a doorbell; soft queues (plain
                        // memory) skip the barrier.
                        crate::verbs::relay::flush_device_store();
                    }
                    self.rung.store(ready, Ordering::Release);
                }
                self.ring_lock.store(false, Ordering::Release);
                if let Some(w) = &self.wake {
                    w.wake();
                }
                return;
            }
            // The holder rings within nanoseconds unless it lost its core: then spinning
            // only keeps it off (waits call this from inside their bounded loops, whose
            // clock is not read meanwhile), so give the core away after a few tries, as
            // the C++ producer's waits do.
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Consumes new CQEs (one poller at a time; others return at once). Returns the number
    /// consumed.
    pub fn poll_cq(&self) -> usize {
        // Busy: another thread polls. Poisoned (a panic while polling): the CQ state is a
        // consumer index and counters, consistent between CQEs, so polling goes on (it
        // returned 0 for ever, and every wait timed out blaming the engine).
        let mut cq = match self.cq.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return 0,
        };
        let cqe_cnt = self.mem.layout().cqe_cnt;
        let mut n = 0;
        let mut done = self.completed.load(Ordering::Relaxed);
        match self.cq_mode {
            CqMode::Normal => loop {
                let ci = cq.ci;
                if !sw_owns(self.mem.cqe_op_own(ci), ci, cqe_cnt) {
                    break;
                }
                let c = self.mem.read_cqe(ci);
                self.retire(&mut cq, &c, &mut done);
                cq.ci = ci.wrapping_add(1);
                n += 1;
            },
            CqMode::Collapsed => {
                let c = self.mem.read_cqe(0);
                if c.opcode() != CqeOpcode::Invalid as u8 {
                    n = self.retire(&mut cq, &c, &mut done) as usize;
                }
            }
        }
        if n > 0 {
            if self.cq_mode == CqMode::Normal {
                // Release: the engine may overwrite the entries once it sees the new
                // index; our reads of them come first.
                self.mem.cq_dbrec_ci().store(
                    u32::from_ne_bytes(cq_consumer_index(cq.ci).to_bytes()),
                    Ordering::Release,
                );
            }
            // Release: pairs with the Acquire in wait_slots_free / wait_index — the
            // engine's reads of the slots and its writes of results (acquired with the
            // CQEs) happen before a slot reuse or a result read. Only the poller (under
            // the lock) advances it; fetch_max keeps it monotonic regardless.
            self.completed.fetch_max(done, Ordering::AcqRel);
        }
        n
    }

    /// Applies one CQE: advances `completed` past the WQE it names; returns whether it
    /// was new.
    fn retire(&self, cq: &mut CqConsumer, c: &Cqe64, completed: &mut u64) -> bool {
        let done = *completed;
        // The WQE's unwrapped index: in flight WQEs lie within MAX_WQE_CNT (< 2^15) of
        // `done`, so a signed 16-bit distance recovers it; a negative one is an old CQE
        // seen again (collapsed mode).
        let d = c.wqe_counter.get().wrapping_sub(done as u16) as i16;
        if d < 0 {
            return false;
        }
        let index = done + d as u64;
        let size = self.sizes[(index & self.mask) as usize].load(Ordering::Relaxed) as u64;
        let rep = CqeReport::from_cqe(c, index);
        if rep.is_error() {
            let mut fe = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
            if fe.is_none() {
                *fe = Some(rep);
                self.has_error.store(true, Ordering::Release);
            }
        }
        cq.ci = cq.ci.wrapping_add(if self.cq_mode == CqMode::Collapsed {
            1
        } else {
            0
        });
        cq.last = Some(rep);
        *completed = (*completed).max(index + size);
        true
    }

    /// Waits until the WQE `p` completed; fails if the QP entered the error state at or
    /// before it — with a collapsed CQ, if any error CQE was seen (see `wait_index`).
    pub fn wait_posted(&self, p: Posted) -> Result<(), SqError> {
        self.wait_index(
            p.index + p.wqebbs as u64,
            "the completion of a WQE",
            p.index,
        )
    }

    fn wait_index(&self, end: u64, what: &'static str, index: u64) -> Result<(), SqError> {
        let uncovered = || {
            self.completed.load(Ordering::Acquire) < end
                && self.signaled_end.load(Ordering::Acquire) < end
        };
        if uncovered() {
            // No signalled WQE covers `end` yet: one more, so that a CQE will. Room for it
            // first, without reserving: a reservation whose wait for a slot times out can
            // never be published and breaks the queue for good, while this wait timing out
            // leaves it usable, as the CUDA producer's wait_index does (it reserves
            // nothing). Another producer may still take the slot first; then the
            // reservation below waits as any post does.
            let cnt = self.wqe_cnt() as u64;
            if self.reserved.load(Ordering::Acquire) >= self.completed.load(Ordering::Acquire) + cnt
            {
                self.ring();
                self.wait(
                    "a free slot for the signalled NOP that quiet needs",
                    end,
                    || {
                        self.poll_cq();
                        // Acquire: as in wait_slots_free.
                        !uncovered()
                            || self.reserved.load(Ordering::Acquire)
                                < self.completed.load(Ordering::Acquire) + cnt
                    },
                )?;
            }
            if uncovered() {
                let _ = self.post_inner(1, false, true, false, |_| WqeOp::Nop)?;
                // Relaxed: a statistic.
                self.signal_nops.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.completed.load(Ordering::Acquire) < end {
            self.ring();
            self.wait(what, index, || {
                self.poll_cq();
                self.completed.load(Ordering::Acquire) >= end
            })?;
        }
        // A normal CQ has a CQE for every failed WQE, so the first error names the exact
        // WQE. A collapsed CQ does not: the engine rewrites CQE 0 for every flushed WQE,
        // so the poller may see only a later WR_FLUSH CQE, past `end`, while the WQE
        // that failed lies before it. There any error fails every wait, as the CUDA
        // producer's `wait_index` does (rshmem/ibgda/queue.cuh), and the error reported
        // may be that WR_FLUSH rather than the original syndrome.
        match self.error() {
            Some(first) if first.index < end || self.cq_mode == CqMode::Collapsed => {
                Err(self.completion_error(first))
            }
            _ => Ok(()),
        }
    }

    /// The error for a failed completion `first`: a WR_FLUSH caused by QP_FATAL (a
    /// doorbell record out of range) is that fatal error's consequence, so the fatal error
    /// is reported (whichever the waiter saw first, the flush CQE or the event); anything
    /// else as it is.
    fn completion_error(&self, first: CqeReport) -> SqError {
        // Acquire: pairs with the engine's Release when it raised the event.
        let e = self
            .mem
            .async_events()
            .map_or(0, |w| w.load(Ordering::Acquire));
        // In a normal CQ the first error CQE of a genuine failure is the failed WQE's own
        // (never a flush), and an overrun writes no flush CQEs, so a first WR_FLUSH there
        // comes from the fatal error even when the flushes then overran the CQ (CQ_ERR
        // too); a collapsed CQ shows only its latest CQE, so only QP_FATAL alone says it.
        if e & EVENT_QP_FATAL != 0
            && (e & EVENT_CQ_ERR == 0 || self.cq_mode == CqMode::Normal)
            && first.syndrome == crate::mlx5::cqe::Syndrome::WrFlush as u8
        {
            return SqError::QpFatal {
                qpn: self.qpn,
                events: e,
                wqe_cnt: self.mem.layout().wqe_cnt,
            };
        }
        SqError::Completion {
            qpn: self.qpn,
            first,
        }
    }

    /// Waits until everything reserved before the call has completed (`quiet`).
    pub fn quiet(&self) -> Result<(), SqError> {
        let end = self.reserved.load(Ordering::Acquire);
        self.wait_index(end, "quiet (all posted WQEs to complete)", end)
    }
}

/// WQEBBs ahead of its own reservation whose slot a producer prefetches for writing
/// ([`SendQueue::prefetch_ahead`]): 1 KiB, a few posts' worth of lead. Distances of 4 to
/// 64 all helped on the measured VM; 16 was among the best.
pub const PREFETCH_AHEAD: u64 = 16;

/// Asks the calling core to fetch the cache line at `p` in a writable state ahead of a
/// store (x86-64 `prefetchw` where the CPU has PRFCHW; aarch64 `prfm pstl1keep`; nothing
/// elsewhere). A hint: it never faults, changes no memory and orders nothing, so `p` may
/// be any address.
#[inline]
pub fn prefetch_for_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        static PRFCHW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let have = *PRFCHW.get_or_init(|| {
            // CPUID 0x8000_0001 exists on every x86-64 CPU; ECX bit 8 is PRFCHW
            // ("3dnowprefetch" in /proc/cpuinfo).
            #[allow(unused_unsafe)]
            // SAFETY: cpuid has no side effects and the leaf exists on x86-64.
            let c = unsafe { std::arch::x86_64::__cpuid(0x8000_0001) };
            c.ecx & (1 << 8) != 0
        });
        if have {
            // SAFETY: a prefetch reads and writes no memory and cannot fault, whatever the
            // address; the CPU supports the instruction (checked above).
            unsafe {
                std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above; PRFM is part of the base ARMv8 instruction set.
    unsafe {
        std::arch::asm!("prfm pstl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
