//! The soft HCA engine: executes the WQEs of the queue pairs it owns and writes their CQEs.
//!
//! [`EngineCore`] is the engine's state machine, driven by [`EngineCore::progress`] (tests
//! drive it by hand); [`SoftHca`] runs one on a thread. Per QP the engine:
//! - reads the send counter of the QP's doorbell record (Acquire; 16-bit, wrap-aware) and
//!   processes the published WQEBBs in order, a bounded batch per QP per round so several
//!   QPs are served round-robin;
//! - parses each WQE straight from the ring with `mlx5::parse_wqe_with` (copying it out
//!   only when it wraps the ring end) — a parse error becomes an error CQE carrying
//!   [`crate::mlx5::WqeError::syndrome`];
//! - checks local buffers against the local protection domain: unknown lkey, range outside
//!   the region, or LOCAL_WRITE missing for a READ/atomic result → LOCAL_PROT (0x04);
//! - hands the operation to its [`Backend`], which checks the remote side (REMOTE_ACCESS
//!   0x13, REMOTE_INVAL_REQ 0x12 for a misaligned atomic);
//! - writes a CQE when the WQE asks for one (CE = 2 or 3, "CQ update" with or without an
//!   event) or failed, in WQE order; the first failure puts the QP in the error state and
//!   every later WQE completes with WR_FLUSH (0x05) without being executed, like a
//!   ConnectX — also when the failure is found while earlier WQEs are still in flight
//!   (asynchronous backends), before its own CQE can be written;
//! - never overwrites an unconsumed CQE: a completion due when a normal-mode CQ is full
//!   is a CQ overrun, which (like a ConnectX) puts the CQ and the QP in the error state
//!   and raises the asynchronous events CQ_ERR and QP_FATAL in the queue memory.
//!
//! Never trusted: anything in the rings. Every read of queue memory is bounded by the ring
//! (a ds that runs past what the doorbell published is a parse error, not a read past it;
//! a doorbell record more than a ring ahead of the engine, or behind it, executes nothing
//! and puts the QP in error with QP_FATAL), and every access to data memory goes through
//! a registered region's bounds.

use super::backend::{AtomicOp, Backend, Gather, LocalBuf, Op};
use super::mr::{Access, MrSnapshot, MrTable};
use super::queue::{CqMode, QueueMemory, EVENT_CQ_ERR, EVENT_QP_FATAL};
use crate::mlx5::cqe::{owner_bit, Cqe64, CqeInfo, CqeOpcode};
use crate::mlx5::ring::slot_offset;
use crate::mlx5::wqe::{
    opcode, parse_wqe_with, CtrlSeg, DataSeg, FenceMode, Payload, WqeOp, CTRL_CQ_UPDATE,
    DEFAULT_MAX_INLINE, DS_BYTES, MAX_WQEBBS, WQEBB,
};
use crate::mlx5::{Syndrome, WireStruct};
use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// WQEBBs processed per QP before the engine moves on to the next QP.
const BATCH: u64 = 64;

/// The longest message a WRITE or READ may move: a ConnectX's `max_msg_sz` (2 GiB). Longer
/// ones complete in error with LOCAL_LENGTH, as there (the CQE's byte count is 32 bits).
pub const MAX_MSG_BYTES: u64 = 1 << 31;

/// Rounds the engine thread runs per take of the core lock while they find work.
const ENGINE_ROUNDS_PER_LOCK: u32 = 64;

/// What the engine needs to serve one queue pair.
pub struct QpConfig<P> {
    pub mem: Arc<QueueMemory>,
    /// The local protection domain (lkeys).
    pub pd: Arc<MrTable>,
    /// The remote side, as the backend understands it.
    pub peer: P,
    pub cq_mode: CqMode,
    /// Longest inline payload accepted (the QP's `max_inline_data`).
    pub max_inline: u32,
}

impl<P> QpConfig<P> {
    pub fn new(mem: Arc<QueueMemory>, pd: Arc<MrTable>, peer: P, cq_mode: CqMode) -> Self {
        QpConfig {
            mem,
            pd,
            peer,
            cq_mode,
            max_inline: DEFAULT_MAX_INLINE,
        }
    }
}

/// A queue pair attached to an engine.
pub struct EngineQp<P> {
    pub qpn: u32,
    pub cfg: QpConfig<P>,
    /// WQEs executed or flushed (diagnostics).
    pub wqes: AtomicU64,
    /// The QP is in the error state.
    pub in_error: AtomicBool,
}

impl<P> EngineQp<P> {
    /// A QP numbered `qpn` (24 bits) served with `cfg`.
    pub fn new(qpn: u32, cfg: QpConfig<P>) -> Arc<EngineQp<P>> {
        Arc::new(EngineQp {
            qpn: qpn & 0xff_ffff,
            cfg,
            wqes: AtomicU64::new(0),
            in_error: AtomicBool::new(false),
        })
    }
}

/// An operation in flight (asynchronous backends), retired in WQE order.
#[derive(Debug)]
struct Pending {
    token: u64,
    index: u16,
    opcode: u8,
    byte_cnt: u32,
    ce: bool,
    status: Option<Result<(), Syndrome>>,
}

struct QpRun<P, C> {
    qp: Arc<EngineQp<P>>,
    cache: C,
    /// Next WQEBB to process (16-bit WQE index = low bits).
    ci: u16,
    /// CQEs written (unwrapped, 32 bits).
    cq_pi: u32,
    /// The consumer index last loaded from the CQ doorbell record. It only grows, so room
    /// computed from it is a lower bound: the record (a line the poller writes) is read
    /// again only when this says the CQ is full, not once per WQE.
    cq_ci_seen: u32,
    error: bool,
    /// A WQE failed while earlier WQEs were still in flight: its error CQE waits in
    /// `inflight` for them, and `error` is set only when it is retired. Until then every
    /// later WQE is queued as WR_FLUSH without being executed, as a ConnectX executes
    /// nothing after a failing WQE.
    error_queued: bool,
    /// The CQ overran: no completion is written any more (see `complete`).
    cq_error: bool,
    lkeys: MrSnapshot,
    inflight: VecDeque<Pending>,
    seq: u32,
}

/// The engine's state: its backend and the QPs it serves. Single-threaded: whoever owns
/// it calls [`EngineCore::progress`].
pub struct EngineCore<B: Backend> {
    backend: B,
    qps: Vec<QpRun<B::Peer, B::Cache>>,
    bufs: Vec<LocalBuf>,
    wrap: Box<[u8; MAX_WQEBBS * WQEBB]>,
    done: Vec<(u64, Result<(), Syndrome>)>,
    /// The last round left published WQEBBs unprocessed (batch budget, or a
    /// FENCE waiting for earlier WQEs).
    backlog: bool,
}

static NEXT_QPN: AtomicU32 = AtomicU32::new(0x10);

/// A fresh QP number (unique in the process, 24 bits).
pub fn next_qpn() -> u32 {
    NEXT_QPN.fetch_add(1, Ordering::Relaxed) & 0xff_ffff
}

impl<B: Backend> EngineCore<B> {
    pub fn new(backend: B) -> Self {
        EngineCore {
            backend,
            qps: Vec::new(),
            bufs: Vec::with_capacity(64),
            wrap: Box::new([0; MAX_WQEBBS * WQEBB]),
            done: Vec::new(),
            backlog: false,
        }
    }

    pub fn backend(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Starts serving `qp` (its queue must be fresh: producer and engine start at 0).
    pub fn attach(&mut self, qp: Arc<EngineQp<B::Peer>>) {
        let lkeys = qp.cfg.pd.snapshot();
        self.qps.push(QpRun {
            qp,
            cache: B::Cache::default(),
            ci: 0,
            cq_pi: 0,
            cq_ci_seen: 0,
            error: false,
            error_queued: false,
            cq_error: false,
            lkeys,
            inflight: VecDeque::new(),
            seq: 0,
        });
    }

    /// Stops serving QP `qpn`; its in-flight operations are abandoned.
    pub fn detach(&mut self, qpn: u32) {
        self.qps.retain(|r| r.qp.qpn != qpn);
    }

    /// QP numbers served.
    pub fn qpns(&self) -> Vec<u32> {
        self.qps.iter().map(|r| r.qp.qpn).collect()
    }

    /// Whether the last [`EngineCore::progress`] processed every WQEBB that the doorbell
    /// records it read had published (nothing left for a later round but completions).
    pub fn drained(&self) -> bool {
        !self.backlog
    }

    /// One round over every QP; returns the WQEBBs and completions processed.
    pub fn progress(&mut self) -> usize {
        let mut work = 0;
        self.backlog = false;
        // Asynchronous completions first.
        self.done.clear();
        let done = &mut self.done;
        self.backend.poll(&mut |t, s| done.push((t, s)));
        for &(token, status) in self.done.iter() {
            let qpn = (token >> 32) as u32;
            if let Some(r) = self.qps.iter_mut().find(|r| r.qp.qpn == qpn) {
                if let Some(p) = r.inflight.iter_mut().find(|p| p.token == token) {
                    p.status = Some(status);
                    work += 1;
                    // A failure stops the QP now, also while an earlier WQE is still in
                    // flight (its CQE waits for theirs): nothing after it may start
                    // meanwhile. Before 2026-12-07 only failures found at once did; one
                    // reported later let the next rounds start WQEs that `retire` then
                    // reported as WR_FLUSH although they had executed.
                    r.error_queued |= status.is_err();
                }
            }
        }
        for i in 0..self.qps.len() {
            work += self.serve(i);
        }
        work
    }

    fn serve(&mut self, i: usize) -> usize {
        let EngineCore {
            backend,
            qps,
            bufs,
            wrap,
            backlog,
            ..
        } = self;
        let r = &mut qps[i];
        let mut work = retire(r);
        // SAFETY: qps[i] holds its Arc<EngineQp> (and so the queue memory) for this whole
        // call; a borrow instead of a clone keeps the Arc's count line, which producers
        // read on every post, out of the engine's cache.
        let mem: &QueueMemory = unsafe { &*Arc::as_ptr(&r.qp.cfg.mem) };
        let cnt = mem.layout().wqe_cnt;
        // Acquire: pairs with the producer's Release store of the record, so the WQE bytes
        // it covers are visible.
        let pi =
            u32::from_be_bytes(mem.qp_dbrec_send().load(Ordering::Acquire).to_ne_bytes()) as u16;
        let mut avail = pi.wrapping_sub(r.ci) as u64;
        if avail > cnt as u64 {
            // A record more than a ring ahead of what was consumed, or behind it (it went
            // backwards): a producer bug. The slots past one ring are the previous lap's
            // WQEs, which the producer may be rewriting; executing them would repeat old
            // WRITEs and atomics. Nothing is processed; the QP goes to the error state with
            // the asynchronous event QP_FATAL, as for a fatal QP error on a ConnectX (which
            // also completes the WQEs still in flight as flushed, as `retire` does here).
            // (Before 2026-12-07 the count was clamped to one ring, and a stale ring ran.)
            if !r.error {
                qp_fatal(r, mem, EVENT_QP_FATAL);
            }
            return work;
        }
        if avail == 0 {
            return work;
        }
        r.lkeys.refresh(&r.qp.cfg.pd);
        let mut budget = BATCH;
        let mut processed = 0u64;
        while avail > 0 && budget > 0 {
            let off = slot_offset(r.ci as u32, cnt);
            // SAFETY: off + 16 <= ring length (slots are 64 B); the slot was published by
            // the doorbell record (acquired above) and is not reused before its CQE.
            let ctrl = unsafe {
                CtrlSeg::read_from(std::slice::from_raw_parts(mem.sq().add(off), 16))
                    .expect("16 bytes")
            };
            let fenced = matches!(
                ctrl.fence(),
                Some(FenceMode::Fence | FenceMode::SmallAndFence | FenceMode::StrongOrdering)
            );
            // A WQE the QP will flush starts nothing, so a FENCE has nothing to order: it is
            // queued behind the in-flight ones (its CQE stays in WQE order).
            let flush = r.error || r.error_queued;
            if fenced && !flush && !r.inflight.is_empty() {
                break; // FENCE: start only after every earlier WQE completed
            }
            // WQEBBs this WQE spans per its ds, limited to what was published (and ≥ 1).
            let want = (ctrl.ds() as usize * DS_BYTES)
                .div_ceil(WQEBB)
                .clamp(1, MAX_WQEBBS) as u64;
            let n = want.min(avail);
            let len = n as usize * WQEBB;
            let ring_len = cnt as usize * WQEBB;
            let bytes: &[u8] = if off + len <= ring_len {
                // SAFETY: in bounds; these published slots are not written until their
                // completion, which this engine writes after it is done with them.
                unsafe { std::slice::from_raw_parts(mem.sq().add(off), len) }
            } else {
                let first = ring_len - off;
                // SAFETY: both pieces lie inside the ring (first < len <= ring_len); same
                // publication argument as above; wrap holds MAX_WQEBBS WQEBBs >= len.
                unsafe {
                    std::ptr::copy_nonoverlapping(mem.sq().add(off), wrap.as_mut_ptr(), first);
                    std::ptr::copy_nonoverlapping(
                        mem.sq(),
                        wrap.as_mut_ptr().add(first),
                        len - first,
                    );
                }
                &wrap[..len]
            };
            let index = r.ci;
            // CE (bits 3:2) = 2 (CQ update) or 3 (CQ update and EQE): a CQE always; 0 and 1
            // ask for one only on error, which `complete` writes regardless.
            let ce = ctrl.fm_ce_se & CTRL_CQ_UPDATE != 0;
            let status: Option<(u8, u32, Result<(), Syndrome>)> = if flush {
                Some((ctrl.opcode(), 0, Err(Syndrome::WrFlush)))
            } else {
                match parse_wqe_with(bytes, r.qp.cfg.max_inline) {
                    Err(e) => Some((ctrl.opcode(), 0, Err(e.syndrome()))),
                    Ok(w) => {
                        let token = ((r.qp.qpn as u64) << 32) | r.seq as u64;
                        match execute(
                            backend,
                            bufs,
                            &r.lkeys,
                            &r.qp.cfg.peer,
                            &mut r.cache,
                            token,
                            &w.op,
                        ) {
                            Exec::Done(bc, s) => Some((ctrl.opcode(), bc, s)),
                            Exec::Started(bc) => {
                                r.seq = r.seq.wrapping_add(1);
                                r.inflight.push_back(Pending {
                                    token,
                                    index,
                                    opcode: ctrl.opcode(),
                                    byte_cnt: bc,
                                    ce,
                                    status: None,
                                });
                                None
                            }
                        }
                    }
                }
            };
            if let Some((op, bc, s)) = status {
                if r.inflight.is_empty() {
                    complete(r, mem, index, op, bc, ce, s);
                } else {
                    // Behind in-flight work: the CQE waits for theirs, but a failure
                    // stops the QP now — nothing after it may execute meanwhile.
                    r.error_queued |= s.is_err();
                    r.inflight.push_back(Pending {
                        token: u64::MAX,
                        index,
                        opcode: op,
                        byte_cnt: bc,
                        ce,
                        status: Some(s),
                    });
                }
            }
            processed += 1;
            r.ci = r.ci.wrapping_add(n as u16);
            avail -= n;
            budget = budget.saturating_sub(n);
            work += n as usize;
        }
        if avail > 0 {
            *backlog = true;
        }
        // Relaxed load + store, not an RMW: a statistic only the engine (under its lock)
        // writes; a locked add would wait for this core's pending stores every batch.
        let q = &r.qp.wqes;
        q.store(q.load(Ordering::Relaxed) + processed, Ordering::Relaxed);
        work += retire(r);
        work
    }
}

/// Writes the CQEs of in-flight operations that finished, in WQE order.
fn retire<P, C>(r: &mut QpRun<P, C>) -> usize {
    let mut n = 0;
    // SAFETY: as in `serve`: `r` holds the Arc for this whole call.
    let mem: &QueueMemory = unsafe { &*Arc::as_ptr(&r.qp.cfg.mem) };
    while let Some(p) = r.inflight.front() {
        let Some(mut s) = p.status else { break };
        let p = r.inflight.pop_front().expect("front exists");
        // Everything after the QP's first failure completes as WR_FLUSH, also a WQE that
        // failed on its own behind it (a ConnectX reports only the first failure).
        if r.error {
            s = Err(Syndrome::WrFlush);
        }
        complete(r, mem, p.index, p.opcode, p.byte_cnt, p.ce, s);
        n += 1;
    }
    n
}

/// Puts the QP in the error state and raises the asynchronous `events` in the queue memory.
fn qp_fatal<P, C>(r: &mut QpRun<P, C>, mem: &QueueMemory, events: u32) {
    r.error = true;
    // Release: whoever sees the QP in error (status, the event below) sees the engine's
    // earlier writes.
    r.qp.in_error.store(true, Ordering::Release);
    if let Some(ev) = mem.async_events() {
        // Release: pairs with the producer's Acquire load in its waits.
        ev.fetch_or(events, Ordering::Release);
    }
}

fn cq_has_room<P, C>(r: &mut QpRun<P, C>, mem: &QueueMemory) -> bool {
    if r.qp.cfg.cq_mode == CqMode::Collapsed {
        return true;
    }
    let cnt = mem.layout().cqe_cnt;
    if (r.cq_pi.wrapping_sub(r.cq_ci_seen) & 0xff_ffff) < cnt {
        return true; // room by the last value seen (entries it released were acquired then)
    }
    // Acquire: the consumer finished reading the entries it released.
    r.cq_ci_seen = u32::from_be_bytes(mem.cq_dbrec_ci().load(Ordering::Acquire).to_ne_bytes());
    (r.cq_pi.wrapping_sub(r.cq_ci_seen) & 0xff_ffff) < cnt
}

fn complete<P, C>(
    r: &mut QpRun<P, C>,
    mem: &QueueMemory,
    index: u16,
    wqe_opcode: u8,
    byte_cnt: u32,
    ce: bool,
    s: Result<(), Syndrome>,
) {
    if s.is_err() && !r.error {
        r.error = true;
        r.qp.in_error.store(true, Ordering::Release);
    }
    if s.is_ok() && !ce {
        return;
    }
    if r.cq_error {
        return; // the CQ overran earlier: it takes no more completions
    }
    if !cq_has_room(r, mem) {
        // CQ overrun, as a ConnectX handles it (IBTA C11-37, C9-218): the CQ goes to the
        // error state and takes no more completions, the QP goes to the error state (its
        // later WQEs are flushed without completions), and the owner gets the
        // asynchronous events CQ_ERR and QP_FATAL.
        r.cq_error = true;
        qp_fatal(r, mem, EVENT_CQ_ERR | EVENT_QP_FATAL);
        return;
    }
    let cqe_cnt = mem.layout().cqe_cnt;
    let (slot, owner) = match r.qp.cfg.cq_mode {
        CqMode::Normal => (r.cq_pi, owner_bit(r.cq_pi, cqe_cnt)),
        CqMode::Collapsed => (0, (r.cq_pi & 1) as u8),
    };
    let info = CqeInfo {
        wqe_opcode,
        qpn: r.qp.qpn,
        wqe_counter: index,
        byte_cnt,
        owner,
    };
    let cqe = match s {
        Ok(()) => Cqe64::success(CqeOpcode::Req, &info),
        Err(syn) => Cqe64::error(syn, 0, &info),
    };
    mem.write_cqe(slot, &cqe);
    r.cq_pi = r.cq_pi.wrapping_add(1);
}

enum Exec {
    Done(u32, Result<(), Syndrome>),
    Started(u32),
}

#[inline]
fn local(
    lkeys: &MrSnapshot,
    bufs: &mut Vec<LocalBuf>,
    d: &DataSeg,
    need: Access,
) -> Result<u64, Syndrome> {
    let len = d.byte_count.get() as u64;
    let host = lkeys
        .find(d.lkey.get())
        .and_then(|r| r.resolve(d.addr.get(), len, need))
        .ok_or(Syndrome::LocalProt)?;
    bufs.push(LocalBuf {
        ptr: host,
        len: len as usize,
    });
    Ok(len)
}

#[inline]
fn execute<B: Backend>(
    backend: &mut B,
    bufs: &mut Vec<LocalBuf>,
    lkeys: &MrSnapshot,
    peer: &B::Peer,
    cache: &mut B::Cache,
    token: u64,
    op: &WqeOp<'_>,
) -> Exec {
    bufs.clear();
    let mut run =
        |backend: &mut B, bc: u32, o: &Op<'_>| match backend.execute(peer, cache, token, o) {
            Some(s) => Exec::Done(if s.is_ok() { bc } else { 0 }, s),
            None => Exec::Started(bc),
        };
    let gather = |bufs: &mut Vec<LocalBuf>, segs: &[DataSeg], need: Access| {
        segs.iter()
            .try_fold(0u64, |acc, d| Ok(acc + local(lkeys, bufs, d, need)?))
    };
    match *op {
        WqeOp::Nop | WqeOp::Dump { .. } => Exec::Done(0, Ok(())),
        // rshmem queues have no receive queue: a SEND can never be received. A ConnectX
        // retries until RNR_RETRY_EXC; the engine reports that at once, after checking the
        // local gather as a ConnectX does before it transmits (a bad lkey is LOCAL_PROT).
        WqeOp::Send { payload } | WqeOp::SendImm { payload, .. } => {
            if let Payload::Sge(segs) = payload {
                if let Err(s) = gather(bufs, segs, Access::NONE) {
                    return Exec::Done(0, Err(s));
                }
            }
            Exec::Done(0, Err(Syndrome::RnrRetryExc))
        }
        WqeOp::RdmaWrite { remote, payload }
        | WqeOp::RdmaWriteImm {
            remote, payload, ..
        } => {
            let (len, src) = match payload {
                Payload::Inline(d) => (d.len() as u64, None),
                Payload::Sge(segs) => match gather(bufs, segs, Access::NONE) {
                    Ok(n) => (n, Some(())),
                    Err(s) => return Exec::Done(0, Err(s)),
                },
            };
            if len > MAX_MSG_BYTES {
                return Exec::Done(0, Err(Syndrome::LocalLength));
            }
            let src = match (src, payload) {
                (None, Payload::Inline(d)) => Gather::Inline(d),
                _ => Gather::Bufs(bufs),
            };
            let o = Op::Write {
                raddr: remote.raddr.get(),
                rkey: remote.rkey.get(),
                len,
                src,
            };
            run(backend, len as u32, &o)
        }
        WqeOp::RdmaRead { remote, local } => match gather(bufs, local, Access::LOCAL_WRITE) {
            Err(s) => Exec::Done(0, Err(s)),
            Ok(len) if len > MAX_MSG_BYTES => Exec::Done(0, Err(Syndrome::LocalLength)),
            Ok(len) => {
                let o = Op::Read {
                    raddr: remote.raddr.get(),
                    rkey: remote.rkey.get(),
                    len,
                    dst: bufs,
                };
                run(backend, len as u32, &o)
            }
        },
        _ => {
            let (remote, aop, result) = match *op {
                WqeOp::AtomicCs {
                    remote,
                    compare,
                    swap,
                    result,
                } => (remote, AtomicOp::Cs { compare, swap }, result),
                WqeOp::AtomicFa {
                    remote,
                    add,
                    result,
                } => (remote, AtomicOp::Fa { add }, result),
                WqeOp::MaskedCs32 {
                    remote,
                    swap,
                    compare,
                    swap_mask,
                    compare_mask,
                    result,
                } => (
                    remote,
                    AtomicOp::MaskedCs {
                        size: 4,
                        swap: swap as u64,
                        compare: compare as u64,
                        swap_mask: swap_mask as u64,
                        compare_mask: compare_mask as u64,
                    },
                    result,
                ),
                WqeOp::MaskedCs64 {
                    remote,
                    swap,
                    compare,
                    swap_mask,
                    compare_mask,
                    result,
                } => (
                    remote,
                    AtomicOp::MaskedCs {
                        size: 8,
                        swap,
                        compare,
                        swap_mask,
                        compare_mask,
                    },
                    result,
                ),
                WqeOp::MaskedFa32 {
                    remote,
                    add,
                    field_boundary,
                    result,
                } => (
                    remote,
                    AtomicOp::MaskedFa {
                        size: 4,
                        add: add as u64,
                        boundary: field_boundary as u64,
                    },
                    result,
                ),
                WqeOp::MaskedFa64 {
                    remote,
                    add,
                    field_boundary,
                    result,
                } => (
                    remote,
                    AtomicOp::MaskedFa {
                        size: 8,
                        add,
                        boundary: field_boundary,
                    },
                    result,
                ),
                _ => return Exec::Done(0, Err(Syndrome::LocalQpOp)),
            };
            let size = aop.size() as u32;
            let d = DataSeg::new(size, result.lkey, result.addr);
            if let Err(s) = local(lkeys, bufs, &d, Access::LOCAL_WRITE) {
                return Exec::Done(0, Err(s));
            }
            let o = Op::Atomic {
                raddr: remote.raddr.get(),
                rkey: remote.rkey.get(),
                op: aop,
                result: bufs[0],
            };
            run(backend, size, &o)
        }
    }
}

/// What a producer holds to get its engine moving: wakes a sleeping engine thread after a
/// doorbell, and lets a waiting producer run a round of the engine itself ("caller-driven
/// progress", as MPI and UCX do), which spares a context switch per completion when the
/// machine has more threads than cores.
///
/// **Progress handover.** A thread that waits and runs engine rounds while it waits holds
/// a [`Drive`] guard ([`Waker::drive`]); it then counts as a *driver*. With a backend whose
/// callers drive ([`Backend::callers_drive`]: the network backends) the engine thread parks
/// while any driver exists, so the process has one busy thread per waiting PE instead of
/// one more for the engine. The protocol never loses a doorbell (docs/soft-hca.md,
/// "Progress handover"):
/// 1. a producer rings (doorbell record, Release), then `wake`: `rings += 1` (SeqCst RMW),
///    then loads `drivers` (SeqCst); only if it is 0 does it unpark a sleeping engine;
/// 2. a round loads `rings` (SeqCst) *before* reading the doorbell records, and, when it
///    left nothing published unprocessed ([`EngineCore::drained`]), raises `served` to
///    that value: every doorbell counted in `served` has been processed;
/// 3. a driver keeps running rounds while it holds the guard; the last driver to leave
///    (`drivers` 1 → 0, SeqCst RMW) loads `served` and `rings` and, if `served < rings`,
///    unparks a sleeping engine;
/// 4. the engine parks for drivers only after storing `sleeping`, a SeqCst fence and
///    seeing `drivers > 0`; a leaving driver fences before loading `sleeping` (Dekker: the
///    engine sees the driver gone, or the driver sees it asleep).
///
/// In the SeqCst order, a producer's `rings` RMW comes before the last driver's
/// decrement (then that driver sees the ring in `rings` and hands over unless a later
/// drained round covered it) or after it (then the producer sees `drivers == 0` and wakes
/// the engine itself). A round that reads a `rings` value includes the doorbell records
/// rung before it (the RMWs form a release sequence the round's load acquires).
/// Parks are bounded by [`Backend::idle_wait`]; a parked engine that finds no round ran
/// during a whole park (a driver descheduled) runs one itself.
#[derive(Default)]
pub struct Waker {
    sleeping: AtomicBool,
    thread: OnceLock<std::thread::Thread>,
    assist: OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
    /// Threads holding a [`Drive`] guard.
    drivers: AtomicUsize,
    /// Doorbells rung (count of `wake` calls).
    rings: AtomicU64,
    /// `rings` as loaded by the latest round that drained every published WQE.
    served: AtomicU64,
    /// Rounds run (by anyone): a parked engine checks that drivers make progress.
    rounds: AtomicU64,
    /// Engine parks because a driver existed (diagnostics, tests).
    driven_parks: AtomicU64,
    /// Unparks done by a leaving driver (diagnostics, tests).
    handovers: AtomicU64,
    /// Threads waiting for a completion ([`Waker::wait_completion`]).
    cq_waiters: AtomicUsize,
    /// The handover is on ([`Backend::handover`]): doorbells rung while a driver exists
    /// leave the engine parked.
    handover: AtomicBool,
}

/// A thread waiting for a completion of this engine's QPs ([`Waker::wait_completion`]).
pub struct CqWait<'a>(&'a Waker);

impl Drop for CqWait<'_> {
    fn drop(&mut self) {
        // Relaxed: a hint for the backend (`Backend::set_urgent`); see wait_completion.
        self.0.cq_waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counters of the progress handover ([`Waker::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WakerStats {
    /// Threads holding a [`Drive`] guard now.
    pub drivers: usize,
    /// Doorbells rung so far.
    pub rings: u64,
    /// Doorbells known processed.
    pub served: u64,
    /// Engine rounds run (by the engine thread or by assisting producers).
    pub rounds: u64,
    /// Times the engine thread parked because some thread was driving.
    pub driven_parks: u64,
    /// Times a leaving driver woke the engine because doorbells were pending.
    pub handovers: u64,
    /// The engine thread is parked (or about to).
    pub sleeping: bool,
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waker")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A thread that waits and runs engine rounds ([`Waker::assist`]) while it waits; see
/// [`Waker`]. Holders must keep assisting until they drop it.
pub struct Drive<'a>(&'a Waker);

impl Drop for Drive<'_> {
    fn drop(&mut self) {
        let w = self.0;
        // SeqCst RMW: totally ordered with producers' `rings` RMWs and the engine's fence
        // (protocol step 3 in `Waker`'s documentation).
        if w.drivers.fetch_sub(1, Ordering::SeqCst) != 1 {
            return; // another driver keeps running rounds
        }
        // SeqCst loads: after the decrement in the total order, so a ring that came before
        // it is counted in `rings`.
        if w.served.load(Ordering::SeqCst) >= w.rings.load(Ordering::SeqCst) {
            return; // every doorbell rung so far has been processed
        }
        // SeqCst fence, then `sleeping`: pairs with the engine's store + fence + `drivers`
        // load before a driven park (Dekker).
        fence(Ordering::SeqCst);
        if w.sleeping.load(Ordering::Relaxed) {
            // Relaxed: a statistic.
            w.handovers.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = w.thread.get() {
                t.unpark();
            }
        }
    }
}

impl Waker {
    /// Runs one engine round on the calling thread if no one else is running one; true
    /// if it did any work.
    pub fn assist(&self) -> bool {
        self.assist.get().is_some_and(|f| f())
    }

    /// Registers the calling thread as a driver until the guard drops: it promises to run
    /// [`Waker::assist`] repeatedly meanwhile (a wait loop). See [`Waker`].
    pub fn drive(&self) -> Drive<'_> {
        // SeqCst RMW: ordered with producers' `drivers` loads (step 1).
        self.drivers.fetch_add(1, Ordering::SeqCst);
        Drive(self)
    }

    /// Registers the calling thread as waiting for a completion until the guard drops:
    /// rounds meanwhile tell the backend it is urgent ([`Backend::set_urgent`]).
    pub fn wait_completion(&self) -> CqWait<'_> {
        // Relaxed: liveness only — the waiter keeps waiting (bounded) while rounds run,
        // and the engine sees the count at a later round at the latest.
        self.cq_waiters.fetch_add(1, Ordering::Relaxed);
        CqWait(self)
    }

    /// The handover counters.
    pub fn stats(&self) -> WakerStats {
        // Relaxed: a snapshot for diagnostics and tests.
        WakerStats {
            drivers: self.drivers.load(Ordering::Relaxed),
            rings: self.rings.load(Ordering::Relaxed),
            served: self.served.load(Ordering::Relaxed),
            rounds: self.rounds.load(Ordering::Relaxed),
            driven_parks: self.driven_parks.load(Ordering::Relaxed),
            handovers: self.handovers.load(Ordering::Relaxed),
            sleeping: self.sleeping.load(Ordering::Relaxed),
        }
    }

    /// Call after ringing a doorbell.
    pub fn wake(&self) {
        // SeqCst RMW: a round that loads this value acquires the doorbell record stored
        // before it; and it is ordered with the drivers' RMWs (see `Waker`).
        self.rings.fetch_add(1, Ordering::SeqCst);
        // Relaxed `handover`: a configuration flag set once the backend is installed.
        if self.handover.load(Ordering::Relaxed) && self.drivers.load(Ordering::SeqCst) > 0 {
            // A driver will run a round after this (or hand over when it leaves).
            return;
        }
        // SeqCst fence + load, against the engine's SeqCst store of `sleeping` + fence +
        // doorbell re-check (Dekker): either the engine sees our doorbell record before it
        // sleeps, or we see it asleep and unpark it.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}

struct Shared<B: Backend> {
    qps: Mutex<Vec<Arc<EngineQp<B::Peer>>>>,
    generation: AtomicU64,
    acked: AtomicU64,
    stop: AtomicBool,
    waker: Arc<Waker>,
    /// The engine and the generation of the QP list it serves. Whoever holds the lock
    /// (the engine thread, or a producer assisting) runs rounds.
    core: Mutex<(EngineCore<B>, u64)>,
    /// The backend's idle sleep bound, in µs (`Backend::idle_wait`).
    idle_us: AtomicU64,
    /// `Backend::callers_drive`: the engine thread parks while a PE drives.
    callers_drive: AtomicBool,
}

impl<B: Backend> Shared<B> {
    /// One round under the core lock: sync the QP list, then progress. None when another
    /// thread holds the engine.
    fn round(&self) -> Option<usize> {
        self.rounds(1)
    }

    /// Up to `max` rounds under one take of the core lock, stopping after a round without
    /// work or when a driver appears. Returns the work of all of them.
    fn rounds(&self, max: u32) -> Option<usize> {
        let mut g = self.core.try_lock().ok()?;
        let mut total = 0;
        for k in 0..max {
            let work = self.round_locked(&mut g);
            total += work;
            // Relaxed: a hint; a driver that registers later runs rounds once we release.
            if work == 0 || k + 1 == max || self.waker.drivers.load(Ordering::Relaxed) > 0 {
                break;
            }
        }
        Some(total)
    }

    fn round_locked(&self, g: &mut (EngineCore<B>, u64)) -> usize {
        let (core, seen) = g;
        let gen = self.generation.load(Ordering::Acquire);
        if gen != *seen {
            let list = self.qps.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let have = core.qpns();
            for q in &have {
                if !list.iter().any(|x| x.qpn == *q) {
                    core.detach(*q);
                }
            }
            for q in list {
                if !have.contains(&q.qpn) {
                    core.attach(q);
                }
            }
            *seen = gen;
            // Release: pairs with wait_ack's Acquire — accesses to detached QPs are done.
            self.acked.store(gen, Ordering::Release);
        }
        let w = &self.waker;
        // SeqCst, before the doorbell records are read: the records of the rings counted
        // here are visible to this round (handover protocol step 2, see `Waker`).
        let rings = w.rings.load(Ordering::SeqCst);
        // Relaxed: a hint (see Waker::wait_completion); `drained` is the last round's.
        let urgent = w.cq_waiters.load(Ordering::Relaxed) > 0 || !core.drained();
        core.backend().set_urgent(urgent);
        let work = core.progress();
        if core.drained() && w.served.load(Ordering::Relaxed) < rings {
            // SeqCst: read by a leaving driver after its decrement (step 3).
            w.served.fetch_max(rings, Ordering::SeqCst);
        }
        // Relaxed load + store: a progress counter written only under the core lock, which
        // the engine thread compares (under no ordering).
        w.rounds
            .store(w.rounds.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        self.note_backend(core.backend());
        work
    }

    /// Caches the backend's idle bound and whether its callers drive (Relaxed: hints the
    /// engine thread reads at its next iteration).
    fn note_backend(&self, b: &B) {
        let us = b.idle_wait().as_micros() as u64;
        if self.idle_us.load(Ordering::Relaxed) != us {
            self.idle_us.store(us, Ordering::Relaxed);
        }
        let cd = b.callers_drive();
        if self.callers_drive.load(Ordering::Relaxed) != cd {
            self.callers_drive.store(cd, Ordering::Relaxed);
        }
        let h = cd && b.handover();
        if self.waker.handover.load(Ordering::Relaxed) != h {
            self.waker.handover.store(h, Ordering::Relaxed);
        }
    }

    /// Runs `f` on the backend under the engine lock (waits for a running round).
    fn with_backend<R>(&self, f: impl FnOnce(&mut B) -> R) -> R {
        let mut g = self.core.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(g.0.backend());
        self.note_backend(g.0.backend());
        r
    }
}

/// An engine thread serving any number of QPs.
pub struct SoftHca<B: Backend> {
    shared: Arc<Shared<B>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A QP attached to a [`SoftHca`]; dropping it detaches the QP and returns once the engine
/// no longer touches its queues or memory regions.
pub struct QpHandle<B: Backend> {
    qp: Arc<EngineQp<B::Peer>>,
    shared: Arc<Shared<B>>,
}

impl<B: Backend> QpHandle<B> {
    pub fn qpn(&self) -> u32 {
        self.qp.qpn
    }
    pub fn qp(&self) -> &Arc<EngineQp<B::Peer>> {
        &self.qp
    }
}

impl<B: Backend> Drop for QpHandle<B> {
    fn drop(&mut self) {
        let qpn = self.qp.qpn;
        let g = {
            let mut v = self.shared.qps.lock().unwrap_or_else(|e| e.into_inner());
            v.retain(|q| q.qpn != qpn);
            // Release (under the lock): the engine that sees the new generation sees the
            // new list.
            self.shared.generation.fetch_add(1, Ordering::Release) + 1
        };
        wait_ack(&self.shared, g);
    }
}

fn wait_ack<B: Backend>(shared: &Shared<B>, g: u64) {
    let t0 = Instant::now();
    // Acquire: once the engine acknowledged generation g, it has finished every access to
    // the QPs removed before g.
    while shared.acked.load(Ordering::Acquire) < g && !shared.stop.load(Ordering::Acquire) {
        if let Some(t) = shared.waker.thread.get() {
            t.unpark();
        }
        let _ = shared.round();
        if t0.elapsed() > Duration::from_secs(60) {
            // An engine stuck for a minute is a bug; leaking is safer than freeing memory
            // it may still touch, so the caller's memory must outlive this (see docs).
            panic!("soft HCA engine did not acknowledge a detach within 60 s");
        }
        std::thread::yield_now();
    }
}

impl<B: Backend> SoftHca<B> {
    /// Starts an engine thread named `name` over `backend`.
    pub fn start(backend: B, name: &str) -> std::io::Result<SoftHca<B>> {
        let handover = backend.callers_drive() && backend.handover();
        let shared = Arc::new(Shared {
            qps: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            waker: Arc::new(Waker::default()),
            idle_us: AtomicU64::new(backend.idle_wait().as_micros() as u64),
            callers_drive: AtomicBool::new(backend.callers_drive()),
            core: Mutex::new((EngineCore::new(backend), 0)),
        });
        // Relaxed: set before the engine thread starts (spawn orders it).
        shared.waker.handover.store(handover, Ordering::Relaxed);
        let weak = Arc::downgrade(&shared);
        let _ = shared.waker.assist.set(Box::new(move || {
            weak.upgrade()
                .and_then(|s| s.round())
                .is_some_and(|n| n > 0)
        }));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(s))?;
        let _ = shared.waker.thread.set(thread.thread().clone());
        Ok(SoftHca {
            shared,
            thread: Some(thread),
        })
    }

    /// Runs `f` on the engine's backend, under the engine lock (installing a network
    /// endpoint, adding peers).
    pub fn with_backend<R>(&self, f: impl FnOnce(&mut B) -> R) -> R {
        self.shared.with_backend(f)
    }

    /// The waker producers call after ringing (see [`super::SendQueue::new`]).
    pub fn waker(&self) -> Arc<Waker> {
        self.shared.waker.clone()
    }

    /// Starts serving a QP; returns once the engine has picked it up.
    pub fn attach(&self, cfg: QpConfig<B::Peer>) -> QpHandle<B> {
        let qp = EngineQp::new(next_qpn(), cfg);
        let g = {
            let mut v = self.shared.qps.lock().unwrap_or_else(|e| e.into_inner());
            v.push(qp.clone());
            self.shared.generation.fetch_add(1, Ordering::Release) + 1
        };
        wait_ack(&self.shared, g);
        QpHandle {
            qp,
            shared: self.shared.clone(),
        }
    }
}

impl<B: Backend> Drop for SoftHca<B> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn run<B: Backend>(shared: Arc<Shared<B>>) {
    let w = &shared.waker;
    let mut idle = 0u32;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        // With a network backend, a PE that waits drives the engine itself (caller-driven
        // progress); the engine thread then parks instead of competing with it for the
        // cores (handover protocol, see `Waker`). SeqCst: step 4.
        let callers_drive = shared.callers_drive.load(Ordering::Relaxed);
        if w.handover.load(Ordering::Relaxed) && w.drivers.load(Ordering::SeqCst) > 0 {
            let rounds = w.rounds.load(Ordering::Relaxed);
            w.sleeping.store(true, Ordering::Relaxed);
            // SeqCst: see `Drive::drop` (Dekker on `sleeping` / `drivers`).
            fence(Ordering::SeqCst);
            if w.drivers.load(Ordering::SeqCst) > 0
                && shared.generation.load(Ordering::Acquire) == shared.acked.load(Ordering::Acquire)
            {
                // Relaxed: a statistic.
                w.driven_parks.fetch_add(1, Ordering::Relaxed);
                let us = shared.idle_us.load(Ordering::Relaxed).max(1);
                std::thread::park_timeout(Duration::from_micros(us));
            }
            w.sleeping.store(false, Ordering::Relaxed);
            // Relaxed: a progress check, not a synchronisation. If nobody ran a round for
            // a whole park (the driver is descheduled), run one here.
            if w.rounds.load(Ordering::Relaxed) != rounds {
                continue;
            }
        }
        // None: a caller is running a round. With the local backend that counts as work
        // (it may find more). With a network backend it counts as idle: the caller drives
        // the endpoint itself, and the engine thread backing off instead of competing for
        // the two cores cut the 8 B put's p99 from ~300 µs to ~55 µs between namespaces
        // (docs/multinode.md).
        let r = shared.rounds(ENGINE_ROUNDS_PER_LOCK);
        if r.is_some_and(|n| n > 0) || (r.is_none() && !callers_drive) {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < 128 {
            std::hint::spin_loop();
        } else if idle < 160 {
            std::thread::yield_now();
        } else {
            w.sleeping.store(true, Ordering::Relaxed);
            // SeqCst: see Waker::wake.
            fence(Ordering::SeqCst);
            // None: another thread holds the engine; its round may have read the doorbell
            // records before a ring that found us awake, so do not park on its behalf
            // (try again after a yield).
            let r = shared.round();
            if r.is_none() {
                w.sleeping.store(false, Ordering::Relaxed);
                std::thread::yield_now();
                continue;
            }
            let work = r.unwrap_or(0);
            let seen = shared.acked.load(Ordering::Acquire);
            if work == 0 && shared.generation.load(Ordering::Acquire) == seen {
                let us = shared.idle_us.load(Ordering::Relaxed).max(1);
                std::thread::park_timeout(Duration::from_micros(us));
            }
            w.sleeping.store(false, Ordering::Relaxed);
            if work > 0 {
                idle = 0;
            }
        }
    }
}

/// `opcode` names for messages.
pub fn opcode_name(op: u8) -> &'static str {
    opcode::name(op).unwrap_or("unknown")
}

/// The machine's cross-core handover latency, as `bench softhca` reports it next to its
/// rates: the mean round trip, in ns, of a value bounced between this thread and a
/// spawned one through two atomics on separate cache lines (each hop a store the other
/// thread spins on), over `rounds` round trips or 200 ms, whichever ends first, after up
/// to `rounds / 4` untimed ones (at most 50 ms); NaN only if the other thread did not
/// answer within 2 s. Every
/// soft-HCA WRITE moves at least one cache line between the producer's and the engine's
/// cores, so this is the cost that bounds it: on the 2-vCPU VMs of this project it takes
/// three values (about 60, 130 and 550 ns) that change within seconds, and the WRITE rate
/// follows it (docs/soft-hca.md, "session 9").
pub fn core_round_trip_ns(rounds: u64) -> f64 {
    #[repr(align(128))]
    struct Line(AtomicU64);
    let ping = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    let stop = Arc::new(AtomicBool::new(false));
    let (p2, s2) = (ping.clone(), stop.clone());
    let echo = std::thread::spawn(move || {
        let mut seen = 0;
        let mut spins = 0u32;
        while !s2.load(Ordering::Relaxed) {
            // Acquire/Release: only the value matters; the orderings keep each hop a
            // plain load and store on x86 (no fence), as the producer/engine handover is.
            let v = p2.0 .0.load(Ordering::Acquire);
            if v != seen {
                seen = v;
                p2.1 .0.store(v, Ordering::Release);
                spins = 0;
            } else {
                spins += 1;
                if spins > 1 << 16 {
                    // Sharing a core with the prober: let it run.
                    std::thread::yield_now();
                    spins = 0;
                }
                std::hint::spin_loop();
            }
        }
    });
    // One round trip: false if the echo did not come back within 2 s (a thread that
    // cannot run; the caller then reports NaN rather than waiting longer).
    let bounce = |i: u64| -> bool {
        ping.0 .0.store(i, Ordering::Release);
        let mut spins = 0u32;
        let mut since: Option<Instant> = None;
        while ping.1 .0.load(Ordering::Acquire) != i {
            spins += 1;
            if spins > 1 << 16 {
                if since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(2) {
                    return false;
                }
                std::thread::yield_now();
                spins = 0;
            }
            std::hint::spin_loop();
        }
        true
    };
    // Untimed first, `rounds / 4` round trips or 50 ms: they wake the other core (an idle
    // vCPU takes microseconds to answer) and bring both lines into play. Then timed, with
    // its own budget, so a loaded machine still times at least one round trip.
    let mut i = 0u64;
    let warm = (rounds / 4).max(1);
    let w0 = Instant::now();
    let mut alive = true;
    while alive && i < warm && w0.elapsed() < Duration::from_millis(50) {
        i += 1;
        alive = bounce(i);
    }
    let t0 = Instant::now();
    let mut done = 0u64;
    while alive && done < rounds.max(1) {
        i += 1;
        alive = bounce(i);
        if alive {
            done += 1;
        }
        // The clock is read every 256 round trips only (it costs a tenth of one).
        if done % 256 == 0 && t0.elapsed() > Duration::from_millis(200) {
            break;
        }
    }
    let dt = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
    if done == 0 {
        return f64::NAN; // the echo thread never answered (JSON null)
    }
    dt.as_nanos() as f64 / done as f64
}

/// One row of the engine microbenchmark.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineBenchRow {
    /// Bytes per WRITE.
    pub size: usize,
    /// "sge" (data segment into a registered buffer) or "inline".
    pub payload: &'static str,
    pub ops: u64,
    pub ops_per_s: f64,
    pub gbps: f64,
}

/// Engine microbenchmark: `ops` RDMA WRITEs of `size` bytes posted by this thread through
/// a [`super::SendQueue`] to a [`SoftHca`] thread over [`super::LocalBackend`] (a CQE
/// every 32 WQEBBs: the SendQueue's selective signalling, as rshmem's proxy posts), timed
/// from the first post to the completion of the last, after an untimed warm-up of the
/// same queue. The destination rotates over 1 MiB
/// (or `size` when larger), touched with a pattern before timing, so that the run
/// measures the engine and not first-touch page faults (a fresh 64 MiB destination made
/// every 1–8 KiB WRITE cost a fault: ~2 GB/s whatever the engine did); like ib_write_bw's
/// one buffer per QP, it stays in the cache. Every slot the timed run wrote is verified.
pub fn bench_writes(size: usize, ops: u64, inline: bool) -> crate::Result<EngineBenchRow> {
    use super::mr::{Access, MrTable};
    use super::queue::{CqMode, QueueMemory, SendQueue};
    use super::{LocalBackend, LocalPeer};
    use crate::mlx5::wqe::{DataSeg, Payload, RaddrSeg, WqeOp};
    let err = |e: String| crate::Error::Verification(format!("softhca bench: {e}"));
    if size == 0 || ops == 0 {
        return Err(err(format!(
            "size ({size}) and ops ({ops}) must be positive"
        )));
    }
    let src: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    let span = size.max(1 << 20).next_multiple_of(size);
    // A pattern src never holds at byte 0 (src[0] = 3), so an unwritten slot shows.
    const FILL: u8 = 0xa5;
    let mut dst = vec![FILL; span];
    // The one pointer the engine writes through and the refill below uses.
    let dptr = dst.as_mut_ptr();
    let pd = Arc::new(MrTable::new());
    let remote = Arc::new(MrTable::new());
    // SAFETY: src and dst outlive the engine's use: the QP handle is dropped (detached)
    // before they are, at the end of this function.
    let (lkey, rkey) = unsafe {
        (
            pd.register(
                src.as_ptr() as *mut u8,
                src.as_ptr() as u64,
                size as u64,
                Access::NONE,
            ),
            remote.register(dptr, dptr as u64, span as u64, Access::ALL),
        )
    };
    let base = dptr as u64;
    let hca = SoftHca::start(LocalBackend, "softhca-bench").map_err(|e| err(e.to_string()))?;
    let mem = Arc::new(QueueMemory::new(1024, 1024).map_err(|e| err(e.to_string()))?);
    let qp = hca.attach(QpConfig::new(
        mem.clone(),
        pd.clone(),
        LocalPeer::new(remote.clone()),
        CqMode::Normal,
    ));
    let sq = SendQueue::new(mem, qp.qpn(), CqMode::Normal, Duration::from_secs(30), None);
    let seg = [DataSeg::new(size as u32, lkey, src.as_ptr() as u64)];
    let slots = (span / size) as u64;
    let wqebbs = if inline {
        ((32 + 4 + size).div_ceil(64)) as u16
    } else {
        1
    };
    let run = |n: u64| -> crate::Result<()> {
        for i in 0..n {
            let remote = RaddrSeg::new(base + (i % slots) * size as u64, rkey);
            let payload = if inline {
                Payload::Inline(&src)
            } else {
                Payload::Sge(&seg)
            };
            let _ = sq
                .post_fn(wqebbs, false, |_| WqeOp::RdmaWrite { remote, payload })
                .map_err(|e| err(e.to_string()))?;
        }
        sq.quiet().map_err(|e| err(e.to_string()))
    };
    // Warm-up: wakes the engine thread, brings queue, CQ and buffers into the cache.
    run(ops.clamp(1, 10_000))?;
    // Back to the pattern (the engine is idle after quiet), so the check below sees only
    // what the timed run wrote.
    // SAFETY: dptr..dptr+span is dst's allocation; no WQE is outstanding (quiet
    // returned), so the engine does not write it concurrently.
    unsafe { std::ptr::write_bytes(dptr, FILL, span) };
    let t0 = Instant::now();
    run(ops)?;
    let dt = t0.elapsed().as_secs_f64();
    drop(qp);
    drop(hca);
    let written = ops.min(slots) as usize;
    if let Some(bad) = (0..written).find(|&k| dst[k * size..(k + 1) * size] != src[..]) {
        return Err(err(format!("destination slot {bad} of {written} differs")));
    }
    if dst[written * size..].iter().any(|&b| b != FILL) {
        return Err(err(format!(
            "bytes past the {written} written slots changed"
        )));
    }
    Ok(EngineBenchRow {
        size,
        payload: if inline { "inline" } else { "sge" },
        ops,
        ops_per_s: ops as f64 / dt,
        gbps: ops as f64 * size as f64 / dt / 1e9,
    })
}
