//! The many-producer send queue against a running engine thread: 16-bit WQE index wrap
//! and CQ owner-bit flips over many passes of small rings (normal and collapsed CQs),
//! and many concurrent producers on one SQ with exact final memory and completion counts.
use rshmem::mlx5::cqe::{owner_bit, sw_owns, CqeOpcode};
use rshmem::mlx5::wqe::{opcode, CtrlSeg, RaddrSeg, Sge8, WqeOp};
use rshmem::mlx5::WireStruct;
use rshmem::softhca::queue::{EVENT_CQ_ERR, EVENT_QP_FATAL};
use rshmem::softhca::{
    Access, CqMode, LocalBackend, LocalPeer, MrTable, QpConfig, QpHandle, QueueMemory, SendQueue,
    SoftHca, SqError,
};
use std::sync::Arc;
use std::time::Duration;

struct Target {
    words: Box<[u64]>,
    results: Box<[u64]>,
    pd: Arc<MrTable>,
    remote: Arc<MrTable>,
    lkey: u32,
    rkey: u32,
}

fn target(words: usize, results: usize) -> Target {
    let mut w = vec![0u64; words].into_boxed_slice();
    let mut res = vec![0u64; results].into_boxed_slice();
    let pd = Arc::new(MrTable::new());
    let remote = Arc::new(MrTable::new());
    let (wp, rp) = (w.as_mut_ptr().cast::<u8>(), res.as_mut_ptr().cast::<u8>());
    // SAFETY: the boxes outlive the engine's use of them (the QP handle is dropped first
    // in every test).
    let (lkey, rkey) = unsafe {
        (
            pd.register(rp, rp as u64, (results * 8) as u64, Access::LOCAL_WRITE),
            remote.register(wp, wp as u64, (words * 8) as u64, Access::ALL),
        )
    };
    Target {
        words: w,
        results: res,
        pd,
        remote,
        lkey,
        rkey,
    }
}

/// An engine thread with one QP over `t`'s memory and its send queue. Fields drop in
/// order: the QP detaches (the engine stops touching `t`) before anything else goes.
struct Rig {
    qp: QpHandle<LocalBackend>,
    sq: SendQueue,
    mem: Arc<QueueMemory>,
    _hca: SoftHca<LocalBackend>,
}

fn rig(t: &Target, wqe_cnt: u32, cqe_cnt: u32, mode: CqMode) -> Rig {
    rig_bounded(t, wqe_cnt, cqe_cnt, mode, Duration::from_secs(20))
}

/// [`rig`] whose send queue waits at most `timeout`.
fn rig_bounded(t: &Target, wqe_cnt: u32, cqe_cnt: u32, mode: CqMode, timeout: Duration) -> Rig {
    let hca = SoftHca::start(LocalBackend, "test-engine").unwrap();
    let mem = Arc::new(QueueMemory::new(wqe_cnt, cqe_cnt).unwrap());
    let qp = hca.attach(QpConfig::new(
        mem.clone(),
        t.pd.clone(),
        LocalPeer::new(t.remote.clone()),
        mode,
    ));
    let sq = SendQueue::new(mem.clone(), qp.qpn(), mode, timeout, Some(hca.waker()));
    Rig {
        qp,
        sq,
        mem,
        _hca: hca,
    }
}

fn wrap_run(mode: CqMode) {
    const CQ: u32 = 8;
    let t = target(4, 4);
    // Every WQE of an 8-WQEBB ring asks for a CQE, so the CQ needs 8 entries: a smaller
    // one overruns (on a ConnectX as on the soft HCA; see cq_overrun_is_reported).
    let rig = rig(&t, 8, CQ, mode);
    let Rig { sq, mem, .. } = &rig;
    let remote = RaddrSeg::new(t.words.as_ptr() as u64, t.rkey);
    let result = Sge8 {
        addr: t.results.as_ptr() as u64,
        lkey: t.lkey,
    };
    // 1-WQEBB fetch-adds and 2-WQEBB masked compare-swaps (which also wrap the ring end).
    const N: u64 = 72_000;
    let mut wqebbs = 0u64;
    let mut last = None;
    for i in 0..N {
        let p = if i % 3 == 0 {
            sq.post(&WqeOp::MaskedCs64 {
                remote: RaddrSeg::new(remote.raddr.get() + 8, t.rkey),
                swap: i,
                compare: 0,
                swap_mask: u64::MAX,
                compare_mask: 0,
                result,
            })
        } else {
            sq.post(&WqeOp::AtomicFa {
                remote,
                add: 1,
                result,
            })
        }
        .unwrap();
        assert_eq!(p.index, wqebbs);
        wqebbs += p.wqebbs as u64;
        last = Some(p);
    }
    assert!(wqebbs > 0x1_0000, "the 16-bit index wrapped");
    sq.quiet().unwrap();
    let last = last.unwrap();
    assert_eq!(sq.completed(), wqebbs);
    assert_eq!(sq.error(), None);
    let fa = N - N.div_ceil(3);
    assert_eq!(t.words[0], fa);
    assert_eq!(t.words[1], (N - 1) / 3 * 3);
    // The last WQE's control segment carries the 16-bit index.
    let off = rshmem::mlx5::ring::slot_offset(last.index as u32, 8);
    // SAFETY: the engine finished with every slot (quiet); reading 16 bytes in the ring.
    let ctrl =
        unsafe { CtrlSeg::read_from(std::slice::from_raw_parts(mem.sq().add(off), 16)) }.unwrap();
    assert_eq!(ctrl.wqe_index(), (last.index & 0xffff) as u16);
    let c = mem.read_cqe(0);
    match mode {
        CqMode::Normal => {
            // N CQEs over a ring of CQ: entry s last held CQE n with n % CQ == s.
            for s in 0..CQ {
                let n = (N as u32 - 1) - ((N as u32 - 1 + CQ - s) % CQ);
                assert!(sw_owns(mem.cqe_op_own(s), n, CQ), "slot {s}");
                assert_eq!(mem.cqe_op_own(s) & 1, owner_bit(n, CQ));
            }
        }
        CqMode::Collapsed => {
            assert_eq!(c.opcode(), CqeOpcode::Req as u8);
            assert_eq!(c.wqe_counter.get(), (last.index & 0xffff) as u16);
            assert_eq!(c.owner(), ((N - 1) & 1) as u8);
            assert_eq!(c.wqe_opcode(), opcode::ATOMIC_FA);
        }
    }
    drop(rig);
}

#[test]
fn wqe_index_wraps_and_owner_bits_flip_normal_cq() {
    wrap_run(CqMode::Normal);
}

#[test]
fn wqe_index_wraps_collapsed_cq() {
    wrap_run(CqMode::Collapsed);
}

#[test]
fn many_producers_on_one_send_queue() {
    const THREADS: usize = 8;
    const PER: u64 = 3000;
    let t = target(1 + THREADS, 1);
    let rig = rig(&t, 64, 64, CqMode::Normal);
    let Rig { qp, sq, .. } = &rig;
    let base = t.words.as_ptr() as u64;
    let result = Sge8 {
        addr: t.results.as_ptr() as u64,
        lkey: t.lkey,
    };
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let sq = &sq;
            s.spawn(move || {
                for i in 0..PER {
                    // A shared counter and this thread's own word (last write wins, in
                    // this thread's posting order).
                    let _ = sq
                        .post(&WqeOp::AtomicFa {
                            remote: RaddrSeg::new(base, t.rkey),
                            add: th as u64 + 1,
                            result,
                        })
                        .unwrap();
                    let v = ((th as u64) << 32) | i;
                    let _ = sq
                        .post(&WqeOp::RdmaWrite {
                            remote: RaddrSeg::new(base + 8 * (1 + th as u64), t.rkey),
                            payload: rshmem::mlx5::wqe::Payload::Inline(&v.to_ne_bytes()),
                        })
                        .unwrap();
                    if i % 500 == 0 {
                        sq.quiet().unwrap();
                    }
                }
            });
        }
    });
    sq.quiet().unwrap();
    // Every WQE posted, plus the signalled NOPs that quiet posted when the last WQE
    // before it had not asked for a CQE (selective signalling).
    let total = THREADS as u64 * PER * 2 + sq.signal_nops();
    assert!(sq.signal_nops() <= THREADS as u64 * (PER / 500 + 1) + 1);
    assert_eq!(sq.reserved(), total);
    assert_eq!(sq.completed(), total);
    assert_eq!(sq.error(), None);
    assert_eq!(
        qp.qp().wqes.load(std::sync::atomic::Ordering::Relaxed),
        total
    );
    let sum: u64 = (1..=THREADS as u64).sum::<u64>() * PER;
    assert_eq!(t.words[0], sum);
    for th in 0..THREADS {
        assert_eq!(
            t.words[1 + th],
            ((th as u64) << 32) | (PER - 1),
            "thread {th}"
        );
    }
    drop(rig);
}

#[test]
fn timeout_reports_qp_index_and_last_cqe() {
    // No engine serves this queue: the wait for free slots must expire and say where.
    let mem = Arc::new(QueueMemory::new(2, 2).unwrap());
    let sq = SendQueue::new(mem, 0x77, CqMode::Normal, Duration::from_millis(200), None);
    let _ = sq.post(&WqeOp::Nop).unwrap();
    let _ = sq.post(&WqeOp::Nop).unwrap();
    let e = sq.post(&WqeOp::Nop).unwrap_err().to_string();
    assert!(e.contains("QP 0x77"), "{e}");
    assert!(e.contains("WQE index 0x2"), "{e}");
    assert!(e.contains("last CQE: none"), "{e}");
    // The queue is unusable afterwards, and says so at once.
    let e = sq.post(&WqeOp::Nop).unwrap_err().to_string();
    assert!(e.contains("unusable"), "{e}");
}

#[test]
fn a_waiter_behind_a_broken_reservation_stops_when_the_queue_breaks() {
    // No engine: a 2-slot ring fills, and two producers wait for free slots (WQE indices 2
    // and 3). The first one's wait times out holding index 2, which is never published,
    // so the second one can never publish either. It must stop when the queue breaks and
    // say why, not wait out its own timeout and blame the engine.
    let mem = Arc::new(QueueMemory::new(2, 2).unwrap());
    let sq = SendQueue::new(mem, 0x78, CqMode::Normal, Duration::from_millis(1500), None);
    let _ = sq.post(&WqeOp::Nop).unwrap();
    let _ = sq.post(&WqeOp::Nop).unwrap();
    let (first, second) = std::thread::scope(|s| {
        let a = s.spawn(|| sq.post(&WqeOp::Nop).unwrap_err());
        let t0 = std::time::Instant::now();
        while sq.reserved() < 3 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no third reservation"
            );
            std::thread::yield_now();
        }
        // The second waiter starts well after the first (its own timeout would come
        // 300 ms after the first one's).
        std::thread::sleep(Duration::from_millis(300));
        let b = s.spawn(|| sq.post(&WqeOp::Nop).unwrap_err());
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(
        matches!(first, SqError::Timeout { index: 2, .. }),
        "{first:?}"
    );
    assert!(
        matches!(
            second,
            SqError::BrokenWhileWaiting {
                qpn: 0x78,
                what: "free send-queue slots",
                index: 3
            }
        ),
        "{second:?}"
    );
    let msg = second.to_string();
    assert!(
        msg.contains("another producer's wait failed") && msg.contains("WQE index 0x3"),
        "{msg}"
    );
    assert_eq!(sq.reserved(), 4);
}

#[test]
fn a_doorbell_record_out_of_range_is_a_fatal_qp_error_not_a_cq_overrun() {
    // The record more than a ring ahead of what the engine consumed: the engine raises
    // QP_FATAL alone (no CQ overran), and the waits say that, not "the CQ overran".
    let t = target(8, 1);
    let rig = rig(&t, 8, 8, CqMode::Normal);
    let Rig { sq, mem, .. } = &rig;
    sq.quiet().unwrap();
    mem.qp_dbrec_send().store(
        u32::from_ne_bytes(1000u32.to_be_bytes()),
        std::sync::atomic::Ordering::Release,
    );
    let events = mem.async_events().unwrap();
    let t0 = std::time::Instant::now();
    while events.load(std::sync::atomic::Ordering::Acquire) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no event raised");
        std::thread::yield_now();
    }
    assert_eq!(
        events.load(std::sync::atomic::Ordering::Acquire),
        EVENT_QP_FATAL
    );
    let _ = sq.post(&WqeOp::Nop);
    let e = sq.quiet().unwrap_err();
    assert!(
        matches!(
            e,
            SqError::QpFatal {
                events: 2,
                wqe_cnt: 8,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("doorbell record") && !msg.contains("overran"),
        "{msg}"
    );
}

#[test]
fn a_quiet_that_times_out_on_a_full_ring_leaves_the_queue_usable() {
    // A 64-WQEBB ring (a CQE every 16) full of published WQEs whose last asked for no CQE,
    // and an engine that stalls: quiet needs a signalled NOP and there is no slot for it.
    // It times out, and the queue stays usable once the engine goes on (it reserved the
    // NOP and broke the queue for good before).
    let mem = Arc::new(QueueMemory::new(64, 64).unwrap());
    let sq = SendQueue::new(
        mem.clone(),
        0x79,
        CqMode::Normal,
        Duration::from_millis(300),
        None,
    );
    assert_eq!(sq.signal_every(), 16);
    let mut engine = rshmem::softhca::DiscardEngine::new(mem.clone(), 0x79, CqMode::Normal);
    let write = |bytes: usize| WqeOp::RdmaWrite {
        remote: RaddrSeg::new(0x1000, 1),
        payload: rshmem::mlx5::wqe::Payload::Inline(&[7; 64][..bytes]),
    };
    for _ in 0..15 {
        let _ = sq.post(&WqeOp::Nop).unwrap();
    }
    // [15, 17): two WQEBBs, across 16, so signalled.
    let p = sq.post(&write(40)).unwrap();
    assert_eq!((p.index, p.wqebbs), (15, 2));
    engine.progress();
    sq.wait_posted(p).unwrap();
    assert_eq!(sq.completed(), 17);
    // [17, 81): the ring is full, and the WQE at 80 asks for no CQE.
    for _ in 0..64 {
        let _ = sq.post(&WqeOp::Nop).unwrap();
    }
    assert_eq!(sq.reserved(), 81);
    let e = sq.quiet().unwrap_err();
    assert!(matches!(e, SqError::Timeout { .. }), "{e:?}");
    assert!(!sq.counters().broken, "{e}");
    assert_eq!(
        sq.reserved(),
        81,
        "nothing reserved by the quiet that timed out"
    );
    // The engine goes on: the queue works.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                engine.progress();
                std::thread::yield_now();
            }
        });
        let r = sq
            .quiet()
            .and_then(|()| sq.post(&WqeOp::Nop).map(|_| ()))
            .and_then(|()| sq.quiet());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        r.unwrap();
    });
    assert_eq!(sq.completed(), sq.reserved());
}

/// Posts eight 8-byte inline WRITEs of `byte` to words 0..8 of `t` (the one at `bad_key`
/// with a wrong rkey) and waits (bounded) until the engine has taken all eight, before
/// anyone polls the CQ (a poll that freed entries first would avoid an overrun).
fn post_eight_writes_unpolled(t: &Target, rig: &Rig, byte: u8, bad_key: Option<u64>) {
    for i in 0..8u64 {
        let rkey = if bad_key == Some(i) {
            t.rkey ^ 0x55
        } else {
            t.rkey
        };
        let _ = rig
            .sq
            .post(&WqeOp::RdmaWrite {
                remote: RaddrSeg::new(t.words.as_ptr() as u64 + 8 * i, rkey),
                payload: rshmem::mlx5::wqe::Payload::Inline(&[byte; 8]),
            })
            .unwrap();
    }
    let t0 = std::time::Instant::now();
    while rig.qp.qp().wqes.load(std::sync::atomic::Ordering::Relaxed) < 8 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the engine did not take 8 WQEs"
        );
        std::thread::yield_now();
    }
}

#[test]
fn cq_overrun_is_reported() {
    // An 8-WQEBB ring asks a CQE of every WQE; a CQ of 2 cannot hold them while the
    // producer posts without polling. The engine overruns the CQ as a ConnectX does (QP
    // to error, CQ_ERR + QP_FATAL) and the producer's wait reports that, not a timeout.
    let t = target(8, 1);
    let rig = rig(&t, 8, 2, CqMode::Normal);
    let Rig { sq, mem, qp, .. } = &rig;
    post_eight_writes_unpolled(&t, &rig, 0x11, None);
    let e = sq.quiet().unwrap_err();
    assert!(
        matches!(
            e,
            SqError::CqOverrun {
                qpn,
                events: 3,
                cqe_cnt: 2,
                wqe_cnt: 8
            } if qpn == qp.qpn()
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("IBV_EVENT_CQ_ERR") && msg.contains("at least as many entries"),
        "{msg}"
    );
    assert!(qp.qp().in_error.load(std::sync::atomic::Ordering::Acquire));
    assert_eq!(
        mem.async_events()
            .unwrap()
            .load(std::sync::atomic::Ordering::Acquire),
        EVENT_CQ_ERR | EVENT_QP_FATAL
    );
    // The CQ holds the two completions it had room for, nothing else.
    for s in 0..2u32 {
        assert!(sw_owns(mem.cqe_op_own(s), s, 2), "slot {s}");
        assert_eq!(mem.read_cqe(s).wqe_counter.get(), s as u16);
    }
    // The queue refuses further posts at once.
    let e = sq.post(&WqeOp::Nop).unwrap_err().to_string();
    assert!(e.contains("unusable"), "{e}");
    // At most the WQEs up to the overrun wrote their words (the third WQE's completion
    // overran: it executed, later ones were flushed).
    let written = t
        .words
        .iter()
        .filter(|&&w| w == u64::from_ne_bytes([0x11; 8]))
        .count();
    assert_eq!(written, 3, "{:x?}", t.words);
}

#[test]
fn an_error_before_the_overrun_is_what_quiet_reports() {
    // A WRITE with a bad rkey, then flushes that overrun a 2-entry CQ: the overrun is a
    // consequence; quiet reports the first error (REMOTE_ACCESS at index 1).
    let t = target(8, 1);
    let rig = rig(&t, 8, 2, CqMode::Normal);
    let Rig { sq, mem, .. } = &rig;
    post_eight_writes_unpolled(&t, &rig, 0x22, Some(1));
    assert_eq!(
        mem.async_events()
            .unwrap()
            .load(std::sync::atomic::Ordering::Acquire),
        EVENT_CQ_ERR | EVENT_QP_FATAL
    );
    let e = sq.quiet().unwrap_err();
    match &e {
        SqError::Completion { first, .. } => {
            assert_eq!((first.index, first.syndrome), (1, 0x13), "{e}");
        }
        other => panic!("expected the REMOTE_ACCESS completion, got {other:?}"),
    }
    // Only the first WRITE reached memory.
    assert_eq!(t.words[0], u64::from_ne_bytes([0x22; 8]));
    assert!(t.words[1..].iter().all(|&w| w == 0), "{:x?}", t.words);
}

#[test]
fn error_cqe_becomes_an_error_naming_opcode_and_syndrome() {
    // 16 WQEBBs: every WQE asks for a CQE; 256: none of these does (selective
    // signalling), and the failing one must still be reported.
    for ring in [16, 256] {
        error_cqe_run(ring);
    }
}

fn error_cqe_run(ring: u32) {
    let t = target(4, 1);
    let rig = rig(&t, ring, 16, CqMode::Normal);
    let Rig { sq, .. } = &rig;
    let good = sq
        .post(&WqeOp::RdmaWrite {
            remote: RaddrSeg::new(t.words.as_ptr() as u64, t.rkey),
            payload: rshmem::mlx5::wqe::Payload::Inline(&[1; 8]),
        })
        .unwrap();
    let bad = sq
        .post(&WqeOp::RdmaWrite {
            remote: RaddrSeg::new(t.words.as_ptr() as u64, t.rkey ^ 0x55),
            payload: rshmem::mlx5::wqe::Payload::Inline(&[2; 8]),
        })
        .unwrap();
    let later = sq.post(&WqeOp::Nop).unwrap();
    sq.wait_posted(good).unwrap();
    let e = sq.wait_posted(bad).unwrap_err().to_string();
    assert!(e.contains("REMOTE_ACCESS (0x13)"), "{e}");
    assert!(e.contains("RDMA_WRITE (0x08)"), "{e}");
    assert!(e.contains("index 0x0001"), "ring {ring}: {e}");
    // Later WQEs were flushed; waiting for them reports the first error.
    let e2 = sq.wait_posted(later).unwrap_err().to_string();
    assert_eq!(e, e2);
    assert_eq!(sq.last_cqe().unwrap().syndrome, 0x05);
    assert_eq!(t.words[0], u64::from_ne_bytes([1; 8]));
    drop(rig);
}

/// Selective signalling: on a 256-WQEBB ring a WQE asks for a CQE when it ends at a
/// multiple of 32 WQEBBs (or is held); `quiet` posts one signalled NOP when the tail
/// asked for none, and none when it did; the CQE of a signalled WQE completes the
/// unsignalled ones before it; 16-bit index wrap with mostly unsignalled WQEs.
#[test]
fn selective_signalling_cqe_every_32_wqebbs_and_quiet_adds_a_nop_only_when_needed() {
    let t = target(4, 4);
    let rig = rig(&t, 256, 64, CqMode::Normal);
    let Rig { sq, mem, .. } = &rig;
    assert_eq!(sq.signal_every(), 32);
    let remote = RaddrSeg::new(t.words.as_ptr() as u64, t.rkey);
    let result = Sge8 {
        addr: t.results.as_ptr() as u64,
        lkey: t.lkey,
    };
    let fa = || WqeOp::AtomicFa {
        remote,
        add: 1,
        result,
    };
    let ce = |index: u64| -> bool {
        let off = rshmem::mlx5::ring::slot_offset(index as u32, 256);
        // SAFETY: 16 bytes of a slot in the ring, read after quiet (the engine is done).
        let c = unsafe { CtrlSeg::read_from(std::slice::from_raw_parts(mem.sq().add(off), 16)) }
            .unwrap();
        c.fm_ce_se & 0x0c == rshmem::mlx5::wqe::CTRL_CQ_UPDATE
    };
    for _ in 0..40 {
        let _ = sq.post(&fa()).unwrap();
    }
    sq.quiet().unwrap();
    // WQEs 0..40 plus the NOP at 40 (WQE 39 ended at 40, not a multiple of 32).
    assert_eq!(
        (sq.signal_nops(), sq.reserved(), sq.completed()),
        (1, 41, 41)
    );
    let signalled: Vec<u64> = (0..41).filter(|&i| ce(i)).collect();
    assert_eq!(signalled, vec![31, 40]);
    for _ in 41..64 {
        let _ = sq.post(&fa()).unwrap();
    }
    sq.quiet().unwrap();
    // WQE 63 ends at 64: signalled, so quiet needed no NOP.
    assert_eq!(
        (sq.signal_nops(), sq.reserved(), sq.completed()),
        (1, 64, 64)
    );
    assert!(ce(63) && !ce(62));
    assert_eq!(t.words[0], 63);
    // A held WQE (its poster waits for it) always asks for a CQE.
    let p = sq.post_fn(1, true, |_| fa()).unwrap();
    assert!(ce(p.index));
    sq.wait_posted(p).unwrap();
    sq.release(p);
    assert_eq!(sq.signal_nops(), 1);
    // Many passes: the 16-bit index wraps while 31 of 32 WQEs ask for no CQE.
    const N: u64 = 70_000;
    for _ in 0..N {
        let _ = sq.post(&fa()).unwrap();
    }
    sq.quiet().unwrap();
    assert!(sq.reserved() > 0x1_0000);
    assert_eq!(sq.completed(), sq.reserved());
    assert_eq!(sq.error(), None);
    assert_eq!(t.words[0], 64 + N);
    drop(rig);
}

#[test]
fn prefetch_for_write_is_only_a_hint() {
    // The producers' prefetch (SendQueue::prefetch_ahead) may name any address: it must
    // never fault and never change memory, mapped or not.
    use rshmem::softhca::queue::prefetch_for_write;
    let buf = vec![0x5au8; 4096];
    for off in (0..buf.len()).step_by(64) {
        prefetch_for_write(buf[off..].as_ptr());
    }
    assert!(buf.iter().all(|&b| b == 0x5a));
    prefetch_for_write(std::ptr::null());
    // An address no process maps on Linux (the top of the lower canonical half).
    prefetch_for_write(0x7fff_ffff_f000usize as *const u8);
    prefetch_for_write(usize::MAX as *const u8);
}

/// A register that records what the CPU doorbell relay stores (no NIC register exists
/// here).
struct Recorder(Arc<std::sync::Mutex<Vec<u64>>>);
impl rshmem::verbs::relay::DoorbellRegister for Recorder {
    fn store(&mut self, value: u64) {
        self.0.lock().unwrap().push(value);
    }
}

#[test]
fn doorbell_relay_follows_many_producers_past_the_index_wrap() {
    // The queue's own doorbell word is the shadow a relay watches (what a GPU producer
    // rings when the UAR cannot be mapped into the GPU); its register records. 2 × 17 000
    // two-WQEBB writes (32 bytes inline) take the 16-bit producer index around once; few
    // posts and two producers keep it short on a loaded 2-core machine.
    use rshmem::mlx5::doorbell::parse_doorbell;
    use rshmem::verbs::relay::{DoorbellRelay, Relayed};
    const THREADS: usize = 2;
    const PER: u64 = 17_000;
    const WORDS: usize = 4; // 32 bytes per write: 2 WQEBBs
    let t = target(THREADS * WORDS, 1);
    let rig = rig(&t, 64, 64, CqMode::Normal);
    let log: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
    // SAFETY: the doorbell word lives in rig.mem, which outlives the relay (dropped first
    // below); it starts at 0.
    let q = unsafe {
        Relayed::new(
            rig.mem.parts().doorbell.cast::<u64>(),
            Box::new(Recorder(log.clone())),
        )
    };
    let relay = DoorbellRelay::new(vec![q], "test-relay").unwrap();
    let base = t.words.as_ptr() as u64;
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let sq = &rig.sq;
            s.spawn(move || {
                for i in 0..PER {
                    let v = ((th as u64) << 32) | i;
                    let mut bytes = [0u8; 8 * WORDS];
                    for w in 0..WORDS {
                        bytes[8 * w..8 * w + 8].copy_from_slice(&(v + w as u64).to_ne_bytes());
                    }
                    let _ = sq
                        .post(&WqeOp::RdmaWrite {
                            remote: RaddrSeg::new(base + (8 * WORDS * th) as u64, t.rkey),
                            payload: rshmem::mlx5::wqe::Payload::Inline(&bytes),
                        })
                        .unwrap();
                }
            });
        }
    });
    rig.sq.quiet().unwrap();
    let total = rig.sq.reserved();
    assert_eq!(total, 2 * THREADS as u64 * PER + rig.sq.signal_nops());
    assert!(total > 0x1_0000, "the index wraps");
    let last = rig
        .mem
        .doorbell()
        .load(std::sync::atomic::Ordering::Acquire);
    assert_eq!(
        parse_doorbell(last.to_ne_bytes()),
        ((total & 0xffff) as u16, rig.qp.qpn())
    );
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while log.lock().unwrap().last() != Some(&last) {
        assert!(
            std::time::Instant::now() < until,
            "the relay never passed the last doorbell on"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(relay);
    let log = log.lock().unwrap();
    // Each store is a doorbell of this QP, later than the one before (modulo 2^16), or
    // the same again (the relay re-rings when idle), never an earlier one.
    let mut prev = 0u16;
    for (i, v) in log.iter().enumerate() {
        let (pi, qpn) = parse_doorbell(v.to_ne_bytes());
        assert_eq!(qpn, rig.qp.qpn(), "store {i}");
        let step = pi.wrapping_sub(prev);
        assert!(step < 0x8000, "store {i}: index {pi:#x} after {prev:#x}");
        prev = pi;
    }
    assert_eq!(log.last(), Some(&last));
    for th in 0..THREADS {
        for w in 0..WORDS {
            assert_eq!(
                t.words[WORDS * th + w],
                ((th as u64) << 32) + PER - 1 + w as u64,
                "thread {th} word {w}"
            );
        }
    }
    drop(log);
    drop(rig);
}

/// A held batch larger than the ring minus the unsignalled WQEs that may precede it (128 -
/// 32 + 1 = 97 slots here) is refused up front, and the queue stays usable: such a batch
/// could wait for WQEs that only a signalled WQE behind it completes, until the queue broke.
#[test]
fn a_held_batch_past_the_signalling_bound_is_refused() {
    let t = target(1, 1);
    let rig = rig_bounded(&t, 128, 128, CqMode::Normal, Duration::from_secs(10));
    let Rig { sq, .. } = &rig;
    assert_eq!(sq.signal_every(), 32);
    let e = sq
        .post_held_batch(98, |_, _, _| WqeOp::Nop)
        .expect_err("98 held slots on 128 with a CQE every 32");
    assert!(matches!(e, SqError::Build { .. }), "{e}");
    let (posted, err) = sq
        .post_held_batch(97, |_, _, _| WqeOp::Nop)
        .expect("97 fit");
    assert!(err.is_none(), "{err:?}");
    for p in posted {
        sq.wait_posted(p).expect("each NOP completes");
        sq.release(p);
    }
    sq.quiet().expect("the queue is usable");
}

/// A batch of held READs is one reservation of consecutive slots, whatever other producers
/// post meanwhile: here another thread posts NOPs around 300 batches of 64 READs on a ring
/// of 128, and every READ's result is exact. (Held READs posted one reservation at a time
/// let another producer's reservation fall between them, which could deadlock: the proxy
/// test `a_large_get_and_a_large_put_share_a_queue_pair_from_two_threads`.)
#[test]
fn a_held_batch_is_one_reservation_beside_another_producer() {
    const BATCH: usize = 64;
    let mut t = target(BATCH, BATCH);
    for (k, w) in t.words.iter_mut().enumerate() {
        *w = 0x5eed_0000 + k as u64 * 977;
    }
    let rig = rig_bounded(&t, 128, 128, CqMode::Normal, Duration::from_secs(10));
    let Rig { sq, .. } = &rig;
    let (words, results) = (t.words.as_ptr() as u64, t.results.as_ptr() as u64);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = sq.post(&WqeOp::Nop).expect("a NOP beside the batches");
            }
        });
        for round in 0..300 {
            let (posted, err) = sq
                .post_held_batch(BATCH as u16, |k, _idx, seg| {
                    seg[0] = rshmem::mlx5::wqe::DataSeg::new(8, t.lkey, results + 8 * k as u64);
                    WqeOp::RdmaRead {
                        remote: RaddrSeg::new(words + 8 * k as u64, t.rkey),
                        local: &seg[..],
                    }
                })
                .expect("batch posted");
            assert!(err.is_none(), "{err:?}");
            assert_eq!(posted.len(), BATCH);
            for (k, p) in posted.iter().enumerate() {
                assert_eq!(p.index, posted[0].index + k as u64, "round {round}");
                sq.wait_posted(*p).expect("READ completes");
            }
            // SAFETY: the READs completed into `results`; the engine writes it no more.
            let got: Vec<u64> = (0..BATCH)
                .map(|k| unsafe { std::ptr::read_volatile(t.results.as_ptr().add(k)) })
                .collect();
            assert_eq!(&got[..], &t.words[..], "round {round}");
            for p in posted {
                sq.release(p);
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    sq.quiet().unwrap();
    assert_eq!(sq.error(), None);
    drop(rig);
}

/// A held post whose WQE does not fit its reservation (a NOP is posted in its place and
/// no `Posted` comes back) leaves no slot held: the ring's later laps do not wait for it.
/// Likewise a batch with one bad WQE: every WQE comes back, the bad one as a NOP, and
/// releasing them all frees the ring.
#[test]
fn a_failed_held_post_leaves_no_slot_held() {
    let t = target(1, 1);
    let rig = rig_bounded(&t, 8, 8, CqMode::Normal, Duration::from_secs(2));
    let Rig { sq, .. } = &rig;
    // A NOP is one WQEBB, not two.
    let e = sq.post_fn(2, true, |_| WqeOp::Nop).unwrap_err();
    assert!(matches!(e, SqError::Build { .. }), "{e}");
    for i in 0..20 {
        let _ = sq
            .post(&WqeOp::Nop)
            .unwrap_or_else(|e| panic!("NOP {i} after the failed held post: {e}"));
    }
    // 'static: a batch's WQEs may borrow only their own segment and 'static data.
    static BIG: [u8; 100] = [7; 100];
    let (posted, err) = sq
        .post_held_batch(3, |k, _idx, _seg| match k {
            1 => WqeOp::RdmaWrite {
                remote: RaddrSeg::new(t.words.as_ptr() as u64, t.rkey),
                payload: rshmem::mlx5::wqe::Payload::Inline(&BIG),
            },
            _ => WqeOp::Nop,
        })
        .expect("batch posted");
    assert_eq!(posted.len(), 3);
    assert!(matches!(err, Some(SqError::Build { .. })), "{err:?}");
    for p in posted {
        sq.wait_posted(p).expect("every WQE of the batch completes");
        sq.release(p);
    }
    for i in 0..20 {
        let _ = sq
            .post(&WqeOp::Nop)
            .unwrap_or_else(|e| panic!("NOP {i} after the batch: {e}"));
    }
    sq.quiet().unwrap();
    assert_eq!(sq.error(), None);
    assert_eq!(t.words[0], 0, "the bad WRITE was not executed");
    drop(rig);
}
