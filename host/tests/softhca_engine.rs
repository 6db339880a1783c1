//! The soft HCA engine driven by hand (EngineCore::progress): queue layout, every error
//! path with its syndrome and the WR_FLUSH that follows, CQ modes, the CE bits, WRITE_IMM,
//! random WQE streams against a reference model, and asynchronous backends (completing out
//! of order; failing a WQE at once behind in-flight ones).
use proptest::prelude::*;
use rshmem::mlx5::cqe::{CqeOpcode, Syndrome, OP_OWN_INIT};
use rshmem::mlx5::wqe::{
    build_wqe, opcode, CtrlSeg, DataSeg, FenceMode, Payload, RaddrSeg, Sge8, WqeCtrl, WqeOp,
};
use rshmem::mlx5::{Be32, WireStruct};
use rshmem::softhca::backend::{Backend, Op};
use rshmem::softhca::queue::{EVENT_CQ_ERR, EVENT_QP_FATAL};
use rshmem::softhca::{
    Access, CqMode, CqeReport, EngineCore, EngineQp, LocalBackend, LocalPeer, MrTable, QpConfig,
    QueueLayout, QueueMemory, SendQueue, SqError,
};
use std::sync::Arc;
use std::time::Duration;

const QPN: u32 = 0x1234;

/// One QP with a local buffer (lkey) and a remote buffer (rkey), driven by hand.
struct Rig<B: Backend> {
    mem: Arc<QueueMemory>,
    core: EngineCore<B>,
    qp: Arc<EngineQp<B::Peer>>,
    pd: Arc<MrTable>,
    remote: Arc<MrTable>,
    local: Box<[u64]>,
    rbuf: Box<[u64]>,
    lkey: u32,
    rkey: u32,
    pi: u32,
}

const LWORDS: usize = 512;
const RWORDS: usize = 512;

fn rig_with<B: Backend>(
    backend: B,
    peer: impl FnOnce(Arc<MrTable>) -> B::Peer,
    wqe_cnt: u32,
    cqe_cnt: u32,
    mode: CqMode,
) -> Rig<B> {
    let mem = Arc::new(QueueMemory::new(wqe_cnt, cqe_cnt).unwrap());
    let pd = Arc::new(MrTable::new());
    let remote = Arc::new(MrTable::new());
    let mut local = vec![0u64; LWORDS].into_boxed_slice();
    let mut rbuf = vec![0u64; RWORDS].into_boxed_slice();
    let lp = local.as_mut_ptr().cast::<u8>();
    let rp = rbuf.as_mut_ptr().cast::<u8>();
    // SAFETY: the boxes live in the Rig together with the engine that uses them.
    let (lkey, rkey) = unsafe {
        (
            pd.register(lp, lp as u64, (LWORDS * 8) as u64, Access::LOCAL_WRITE),
            remote.register(rp, rp as u64, (RWORDS * 8) as u64, Access::ALL),
        )
    };
    let qp = EngineQp::new(
        QPN,
        QpConfig::new(mem.clone(), pd.clone(), peer(remote.clone()), mode),
    );
    let mut core = EngineCore::new(backend);
    core.attach(qp.clone());
    Rig {
        mem,
        core,
        qp,
        pd,
        remote,
        local,
        rbuf,
        lkey,
        rkey,
        pi: 0,
    }
}

fn rig(wqe_cnt: u32, cqe_cnt: u32, mode: CqMode) -> Rig<LocalBackend> {
    rig_with(LocalBackend, LocalPeer::new, wqe_cnt, cqe_cnt, mode)
}

impl<B: Backend> Rig<B> {
    fn laddr(&self, byte: usize) -> u64 {
        self.local.as_ptr() as u64 + byte as u64
    }
    fn raddr(&self, byte: usize) -> u64 {
        self.rbuf.as_ptr() as u64 + byte as u64
    }
    fn lbytes(&self) -> &[u8] {
        // SAFETY: plain memory of the box, read while the engine is not running.
        unsafe { std::slice::from_raw_parts(self.local.as_ptr().cast(), LWORDS * 8) }
    }
    fn rbytes(&self) -> &[u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.rbuf.as_ptr().cast(), RWORDS * 8) }
    }
    fn lbytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; exclusive through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.local.as_mut_ptr().cast(), LWORDS * 8) }
    }
    /// Zeroes the remote buffer.
    fn rbytes_mut_clear(&mut self) {
        // SAFETY: as above; exclusive through &mut self.
        unsafe { std::ptr::write_bytes(self.rbuf.as_mut_ptr().cast::<u8>(), 0, RWORDS * 8) }
    }
    /// Writes a WQE's raw bytes at the producer index (wrapping) and advances it.
    fn put_raw(&mut self, wqe: &[u8]) -> u16 {
        let cnt = self.mem.layout().wqe_cnt as usize;
        // SAFETY: the engine does not run concurrently (driven by hand), so a mutable view
        // of the ring is exclusive here.
        let ring = unsafe { std::slice::from_raw_parts_mut(self.mem.sq(), cnt * 64) };
        rshmem::mlx5::ring::copy_into_ring(ring, cnt, self.pi, wqe).unwrap();
        let idx = self.pi as u16;
        self.pi += (wqe.len() / 64) as u32;
        idx
    }

    /// Builds `op` at the producer index (CQE requested).
    fn post(&mut self, op: &WqeOp<'_>) -> u16 {
        self.post_fenced(op, FenceMode::None)
    }

    fn post_fenced(&mut self, op: &WqeOp<'_>, fence: FenceMode) -> u16 {
        let mut buf = [0u8; 1024];
        let ctrl = WqeCtrl {
            wqe_index: self.pi as u16,
            qpn: QPN,
            fence,
            cq_update: true,
            solicited: false,
        };
        let size = build_wqe(&mut buf, &ctrl, op).unwrap();
        self.put_raw(&buf[..size.bytes()])
    }

    fn ring(&self) {
        let v = rshmem::mlx5::doorbell::send_counter(self.pi);
        self.mem.qp_dbrec_send().store(
            u32::from_ne_bytes(v.to_bytes()),
            std::sync::atomic::Ordering::Release,
        );
    }

    fn run(&mut self) {
        self.ring();
        for _ in 0..1000 {
            if self.core.progress() == 0 {
                return;
            }
        }
        panic!("engine did not go idle");
    }

    fn write(&self, r: usize, data: &[u8]) -> WqeOp<'static> {
        let v: &'static [u8] = Box::leak(data.to_vec().into_boxed_slice());
        WqeOp::RdmaWrite {
            remote: RaddrSeg::new(self.raddr(r), self.rkey),
            payload: Payload::Inline(v),
        }
    }
}

/// (cqe opcode, syndrome, wqe opcode, wqe_counter, owner) of CQE slot `i`.
fn cqe(mem: &QueueMemory, i: u32) -> (u8, u8, u8, u16, u8) {
    let c = mem.read_cqe(i);
    (
        c.opcode(),
        c.as_err().syndrome,
        c.wqe_opcode(),
        c.wqe_counter.get(),
        c.owner(),
    )
}

const REQ: u8 = CqeOpcode::Req as u8;
const ERR: u8 = CqeOpcode::ReqErr as u8;

#[test]
fn queue_layout_offsets_and_init() {
    let l = QueueLayout::new(64, 128).unwrap();
    assert_eq!(
        (
            l.sq_offset,
            l.qp_dbrec_offset,
            l.doorbell_offset,
            l.cq_offset
        ),
        (0, 4096, 4160, 4224)
    );
    assert_eq!(l.cq_dbrec_offset, 4224 + 128 * 64);
    assert_eq!(l.size % 4096, 0);
    assert!(l.size >= l.cq_dbrec_offset + 8);
    assert!(QueueLayout::new(48, 64).is_err());
    assert!(QueueLayout::new(64, 0).is_err());
    assert!(QueueLayout::new(1 << 15, 64).is_err());
    let m = QueueMemory::new(4, 8).unwrap();
    assert_eq!(m.base() as usize % 4096, 0);
    for i in 0..8 {
        assert_eq!(m.cqe_op_own(i), OP_OWN_INIT);
    }
    assert_eq!(m.layout().wqe_cnt, 4);
}

#[test]
fn normal_and_collapsed_cq() {
    for mode in [CqMode::Normal, CqMode::Collapsed] {
        let mut r = rig(16, 4, mode);
        for _ in 0..5 {
            r.post(&WqeOp::Nop);
        }
        // Normal mode: a CQ of 4 holds 4 CQEs; the fifth completion finds it full and
        // overruns it, as on a ConnectX: no fifth CQE, the QP in error, CQ_ERR + QP_FATAL.
        r.run();
        match mode {
            CqMode::Normal => {
                for i in 0..4u32 {
                    assert_eq!(cqe(&r.mem, i), (REQ, 0, opcode::NOP, i as u16, 0));
                }
                assert_eq!(r.qp.wqes.load(std::sync::atomic::Ordering::Relaxed), 5);
                assert!(r.qp.in_error.load(std::sync::atomic::Ordering::Acquire));
                let events = |m: &QueueMemory| {
                    m.async_events()
                        .unwrap()
                        .load(std::sync::atomic::Ordering::Acquire)
                };
                assert_eq!(events(&r.mem), EVENT_CQ_ERR | EVENT_QP_FATAL);
                // Nothing is left for a later round: an overrun is not a stall.
                assert!(r.core.drained());
                // The CQ takes nothing more even after the consumer frees entries, and the
                // QP executes nothing more: a WRITE after the overrun is flushed, silently.
                r.mem.cq_dbrec_ci().store(
                    u32::from_ne_bytes(rshmem::mlx5::doorbell::cq_consumer_index(4).to_bytes()),
                    std::sync::atomic::Ordering::Release,
                );
                let w = r.write(0, &[0x5a; 8]);
                r.post(&w);
                r.run();
                assert_eq!(&r.rbytes()[..8], &[0u8; 8], "a WRITE after the overrun ran");
                for i in 0..4u32 {
                    assert_eq!(cqe(&r.mem, i), (REQ, 0, opcode::NOP, i as u16, 0));
                }
                assert_eq!(r.qp.wqes.load(std::sync::atomic::Ordering::Relaxed), 6);
                assert_eq!(events(&r.mem), EVENT_CQ_ERR | EVENT_QP_FATAL);
            }
            CqMode::Collapsed => {
                // Always entry 0; owner alternates per write (5th write: index 4 → 0).
                assert_eq!(cqe(&r.mem, 0), (REQ, 0, opcode::NOP, 4, 0));
                for i in 1..4 {
                    assert_eq!(r.mem.cqe_op_own(i), OP_OWN_INIT);
                }
            }
        }
    }
}

/// `drained` (the progress handover's "every published WQE processed"): false after a
/// round that hit the per-QP batch limit, true once the rest is done.
#[test]
fn drained_reports_the_batch_limit() {
    let mut r = rig(128, 128, CqMode::Normal);
    for _ in 0..100 {
        r.post(&WqeOp::Nop);
    }
    r.ring();
    assert_eq!(
        r.core.progress(),
        64,
        "one batch of 64 WQEBBs per QP per round"
    );
    assert!(!r.core.drained());
    assert_eq!(r.core.progress(), 36);
    assert!(r.core.drained());
    assert_eq!(r.core.progress(), 0);
    assert!(r.core.drained());
}

/// One malformed or failing WQE at index 1 between good ones: the error CQE carries the
/// syndrome, later WQEs flush in order, and their writes do not happen.
fn error_case(name: &str, want: Syndrome, bad: impl FnOnce(&mut Rig<LocalBackend>) -> u16) {
    let mut r = rig(16, 16, CqMode::Normal);
    let a = r.write(0, &[1; 8]);
    r.post(&a);
    let bad_idx = bad(&mut r);
    let b = r.write(64, &[2; 8]);
    let c = r.write(128, &[3; 8]);
    let i2 = r.post(&b);
    let i3 = r.post(&c);
    r.run();
    assert_eq!(cqe(&r.mem, 0), (REQ, 0, opcode::RDMA_WRITE, 0, 0), "{name}");
    let (op, syn, _, idx, _) = cqe(&r.mem, 1);
    assert_eq!((op, syn, idx), (ERR, want as u8, bad_idx), "{name}");
    assert_eq!(
        cqe(&r.mem, 2),
        (ERR, 0x05, opcode::RDMA_WRITE, i2, 0),
        "{name}"
    );
    assert_eq!(
        cqe(&r.mem, 3),
        (ERR, 0x05, opcode::RDMA_WRITE, i3, 0),
        "{name}"
    );
    assert_eq!(r.mem.cqe_op_own(4), OP_OWN_INIT, "{name}: no extra CQE");
    assert_eq!(&r.rbytes()[..8], &[1; 8], "{name}");
    assert_eq!(
        &r.rbytes()[64..72],
        &[0; 8],
        "{name}: flushed write happened"
    );
    assert!(r.qp.in_error.load(std::sync::atomic::Ordering::Acquire));
}

#[test]
fn every_error_path_has_its_syndrome_then_flushes() {
    error_case("bad lkey", Syndrome::LocalProt, |r| {
        let seg = [DataSeg::new(8, 0xdead, r.laddr(0))];
        let w = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(r.raddr(0), r.rkey),
            payload: Payload::Sge(&seg),
        };
        r.post(&w)
    });
    error_case("bad rkey", Syndrome::RemoteAccess, |r| {
        let w = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(r.raddr(0), 0xbeef),
            payload: Payload::Inline(&[9; 8]),
        };
        r.post(&w)
    });
    error_case("remote out of bounds", Syndrome::RemoteAccess, |r| {
        let w = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(r.raddr(RWORDS * 8 - 4), r.rkey),
            payload: Payload::Inline(&[9; 8]),
        };
        r.post(&w)
    });
    error_case("local out of bounds", Syndrome::LocalProt, |r| {
        let seg = [DataSeg::new(16, r.lkey, r.laddr(LWORDS * 8 - 8))];
        let w = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(r.raddr(0), r.rkey),
            payload: Payload::Sge(&seg),
        };
        r.post(&w)
    });
    error_case("no remote write right", Syndrome::RemoteAccess, |r| {
        let p = r.rbuf.as_mut_ptr().cast::<u8>();
        // SAFETY: the rig's buffer, which outlives the engine's use.
        let ro = unsafe { r.remote.register(p, p as u64, 64, Access::REMOTE_READ) };
        let w = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(r.raddr(0), ro),
            payload: Payload::Inline(&[9; 8]),
        };
        r.post(&w)
    });
    error_case(
        "no local write right for a READ",
        Syndrome::LocalProt,
        |r| {
            let p = r.local.as_mut_ptr().cast::<u8>();
            // SAFETY: as above.
            let ro = unsafe { r.pd.register(p, p as u64, 64, Access::NONE) };
            let seg = [DataSeg::new(8, ro, r.laddr(0))];
            let w = WqeOp::RdmaRead {
                remote: RaddrSeg::new(r.raddr(0), r.rkey),
                local: &seg,
            };
            r.post(&w)
        },
    );
    error_case("misaligned atomic", Syndrome::RemoteInvalReq, |r| {
        let w = WqeOp::AtomicFa {
            remote: RaddrSeg::new(r.raddr(4), r.rkey),
            add: 1,
            result: Sge8 {
                addr: r.laddr(0),
                lkey: r.lkey,
            },
        };
        r.post(&w)
    });
    error_case("unknown opcode", Syndrome::LocalQpOp, |r| {
        let mut b = [0u8; 64];
        CtrlSeg::new(r.pi as u16, 0x3f, 0, QPN, 0x08, 1, 0, Be32::new(0))
            .write_to(&mut b)
            .unwrap();
        r.put_raw(&b)
    });
    error_case("ds = 0", Syndrome::LocalQpOp, |r| {
        let mut b = [0u8; 64];
        CtrlSeg::new(
            r.pi as u16,
            opcode::RDMA_WRITE,
            0,
            QPN,
            0x08,
            0,
            0,
            Be32::new(0),
        )
        .write_to(&mut b)
        .unwrap();
        r.put_raw(&b)
    });
    error_case("inline too long", Syndrome::LocalLength, |r| {
        let data = vec![7u8; 300]; // DEFAULT_MAX_INLINE is 256
        let w = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(r.raddr(0), r.rkey),
            payload: Payload::Inline(&data),
        };
        r.post(&w)
    });
    // Two SGEs of 1.5 GiB over an address-space reservation (registered, never touched:
    // the length is refused before anything moves), as a WRITE and as a READ.
    for read in [false, true] {
        const HALF: usize = 3 << 29;
        // SAFETY: a private anonymous reservation, unmapped below; nothing reads or writes it.
        let big = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * HALF,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(big, libc::MAP_FAILED);
        let name = if read {
            "READ over 2 GiB"
        } else {
            "WRITE over 2 GiB"
        };
        error_case(name, Syndrome::LocalLength, |r| {
            let p = big.cast::<u8>();
            // SAFETY: the reservation is 3 GiB long and outlives the rig (unmapped after
            // error_case returns); the engine refuses the WQE before touching it.
            let key = unsafe {
                r.pd.register(p, p as u64, (2 * HALF) as u64, Access::LOCAL_WRITE)
            };
            let segs: &'static [DataSeg] = Box::leak(Box::new([
                DataSeg::new(HALF as u32, key, p as u64),
                DataSeg::new(HALF as u32, key, p as u64 + HALF as u64),
            ]));
            let remote = RaddrSeg::new(r.raddr(0), r.rkey);
            if read {
                r.post(&WqeOp::RdmaRead {
                    remote,
                    local: segs,
                })
            } else {
                r.post(&WqeOp::RdmaWrite {
                    remote,
                    payload: Payload::Sge(segs),
                })
            }
        });
        // SAFETY: the reservation made above; the rig (and its engine) is gone.
        unsafe { libc::munmap(big, 2 * HALF) };
    }
    error_case("SEND without a receive queue", Syndrome::RnrRetryExc, |r| {
        r.post(&WqeOp::Send {
            payload: Payload::Inline(&[1; 4]),
        })
    });
    // The local gather is checked first, as a ConnectX does before it transmits.
    error_case("SEND with a bad lkey", Syndrome::LocalProt, |r| {
        let segs: &'static [DataSeg] = Box::leak(Box::new([DataSeg::new(8, 0xbeef, r.laddr(0))]));
        r.post(&WqeOp::SendImm {
            payload: Payload::Sge(segs),
            imm: 7,
        })
    });
}

#[test]
fn ds_past_the_ring_is_local_qp_op() {
    // A ring of 4 WQEBBs; the WQE claims ds = 20 (5 WQEBBs): the engine reads no further
    // than what the doorbell published (at most the ring) and fails the WQE.
    let mut r = rig(4, 8, CqMode::Normal);
    let mut b = [0u8; 256];
    CtrlSeg::new(0, opcode::RDMA_WRITE, 0, QPN, 0x08, 20, 0, Be32::new(0))
        .write_to(&mut b)
        .unwrap();
    r.put_raw(&b);
    r.run();
    let (op, syn, _, idx, _) = cqe(&r.mem, 0);
    assert_eq!((op, syn, idx), (ERR, Syndrome::LocalQpOp as u8, 0));
    // The next WQE (at index 4, the same slots) is flushed.
    r.post(&WqeOp::Nop);
    r.run();
    assert_eq!(cqe(&r.mem, 1), (ERR, 0x05, opcode::NOP, 4, 0));
}

#[test]
fn write_imm_writes_and_drops_the_immediate() {
    let mut r = rig(16, 16, CqMode::Normal);
    r.lbytes_mut()[..16].copy_from_slice(&[5; 16]);
    let seg = [DataSeg::new(16, r.lkey, r.laddr(0))];
    let w = WqeOp::RdmaWriteImm {
        remote: RaddrSeg::new(r.raddr(32), r.rkey),
        payload: Payload::Sge(&seg),
        imm: 0xabcd,
    };
    r.post(&w);
    r.run();
    assert_eq!(cqe(&r.mem, 0), (REQ, 0, opcode::RDMA_WRITE_IMM, 0, 0));
    assert_eq!(r.mem.read_cqe(0).byte_cnt.get(), 16);
    assert_eq!(&r.rbytes()[32..48], &[5; 16]);
}

/// CE (bits 3:2 of fm_ce_se): 2 ("CQ update") and 3 ("CQ update + EQE", rdma-core's
/// MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE) ask for a CQE on success; 0 and 1 do not.
#[test]
fn ce_2_and_3_request_a_cqe_0_and_1_do_not() {
    let mut r = rig(16, 16, CqMode::Normal);
    // NOPs at 0..5 with CE 0, 3, 1, 2, 3.
    for ce in [0u8, 3, 1, 2, 3] {
        let mut b = [0u8; 64];
        CtrlSeg::new(
            r.pi as u16,
            opcode::NOP,
            0,
            QPN,
            ce << 2,
            1,
            0,
            Be32::new(0),
        )
        .write_to(&mut b)
        .unwrap();
        r.put_raw(&b);
    }
    // A WRITE at 5 with CE 3 plus the solicited bit (fm_ce_se 0x0e).
    let mut b = [0u8; 1024];
    let ctrl = WqeCtrl {
        wqe_index: r.pi as u16,
        qpn: QPN,
        fence: FenceMode::None,
        cq_update: false,
        solicited: true,
    };
    let w = r.write(8, &[6; 8]);
    let size = build_wqe(&mut b, &ctrl, &w).unwrap();
    assert_eq!(b[11], 0x02);
    b[11] |= 0x0c;
    r.put_raw(&b[..size.bytes()]);
    r.run();
    assert_eq!(cqe(&r.mem, 0), (REQ, 0, opcode::NOP, 1, 0));
    assert_eq!(cqe(&r.mem, 1), (REQ, 0, opcode::NOP, 3, 0));
    assert_eq!(cqe(&r.mem, 2), (REQ, 0, opcode::NOP, 4, 0));
    assert_eq!(cqe(&r.mem, 3), (REQ, 0, opcode::RDMA_WRITE, 5, 0));
    assert_eq!(r.mem.read_cqe(3).byte_cnt.get(), 8);
    assert_eq!(r.mem.cqe_op_own(4), OP_OWN_INIT, "no extra CQE");
    assert_eq!(&r.rbytes()[8..16], &[6; 8]);
    assert!(!r.qp.in_error.load(std::sync::atomic::Ordering::Acquire));
}

/// A producer on the rig's queue (normal CQ, 5 s bound, no waker).
fn normal_sq(r: &Rig<LocalBackend>) -> SendQueue {
    SendQueue::new(
        r.mem.clone(),
        QPN,
        CqMode::Normal,
        Duration::from_secs(5),
        None,
    )
}

/// fence_needed: a fence has nothing to order on an idle queue, and one FENCEd NOP reserved
/// after every WQE so far serves every later fence until another WQE is reserved.
#[test]
fn fence_needed_skips_idle_queues_and_covered_fences() {
    let mut r = rig(8, 8, CqMode::Normal);
    let sq = normal_sq(&r);
    assert!(!sq.fence_needed(), "idle queue");
    let write = |sq: &SendQueue, r: &Rig<LocalBackend>| {
        sq.post(&WqeOp::RdmaWrite {
            remote: RaddrSeg::new(r.raddr(0), r.rkey),
            payload: Payload::Inline(&[1, 2, 3, 4, 5, 6, 7, 8]),
        })
        .unwrap()
    };
    let w = write(&sq, &r);
    assert!(sq.fence_needed(), "a WRITE in flight");
    let f = sq.fence().unwrap();
    assert_eq!(f.index, w.index + 1);
    assert!(
        !sq.fence_needed(),
        "the NOP follows every WQE reserved so far"
    );
    let _ = write(&sq, &r);
    assert!(sq.fence_needed(), "a WQE after the NOP");
    let _ = sq.fence().unwrap();
    sq.ring();
    for _ in 0..10 {
        r.core.progress();
    }
    sq.quiet().unwrap();
    assert_eq!(sq.completed(), sq.reserved());
    assert!(!sq.fence_needed(), "everything completed");
    // Only the NOPs carry FENCE (0x40 in fm_ce_se, byte 11 of the control segment).
    let fm: Vec<u8> = (0..4)
        .map(|i| {
            // SAFETY: slot i of the 8-WQEBB ring; the engine is done with it (quiet).
            (unsafe { *r.mem.sq().add(64 * i + 11) }) & 0xe0
        })
        .collect();
    assert_eq!(fm, vec![0, 0x40, 0, 0x40]);
}

#[test]
fn send_queue_producer_against_engine_core() {
    // SendQueue (the producer protocol) posting while the engine is driven by hand.
    let mut r = rig(8, 8, CqMode::Normal);
    let sq = normal_sq(&r);
    let mut expect = 0u64;
    let mut next = 0u64;
    for round in 0..40u64 {
        let remote = RaddrSeg::new(r.raddr(0), r.rkey);
        let res = Sge8 {
            addr: r.laddr(8),
            lkey: r.lkey,
        };
        if round % 3 == 2 {
            // fence: a NOP of its own, with fence mode FENCE.
            let f = sq.fence().unwrap();
            assert_eq!(f.index, next);
            next += 1;
        }
        let p = sq
            .post(&WqeOp::AtomicFa {
                remote,
                add: round,
                result: res,
            })
            .unwrap();
        assert_eq!(p.index, next);
        next += 1;
        expect += round;
        for _ in 0..10 {
            r.core.progress();
        }
        sq.wait_posted(p).unwrap();
        // An 8-byte result in host byte order, as a ConnectX writes it.
        assert_eq!(
            u64::from_ne_bytes(r.lbytes()[8..16].try_into().unwrap()),
            expect - round
        );
    }
    assert_eq!(r.local[0], 0);
    assert_eq!(r.rbuf[0], expect);
    assert_eq!(sq.completed(), 40 + 13, "40 fetch-adds and 13 fence NOPs");
}

/// A WRITE (0), a READ with a bad rkey (1) and two WRITEs (2, 3), all posted before anyone
/// polls. A normal CQ names the failed READ, and waits before it succeed. A collapsed CQ
/// keeps only the last CQE, the WR_FLUSH of WQE 3, so the poller never sees the READ's
/// REMOTE_ACCESS and `completed` jumps past it: every wait must fail there (as the CUDA
/// producer's `wait_index` does), reporting that WR_FLUSH.
#[test]
fn collapsed_cq_send_queue_fails_every_wait_after_an_error() {
    for mode in [CqMode::Normal, CqMode::Collapsed] {
        let mut r = rig(16, 16, mode);
        let sq = SendQueue::new(r.mem.clone(), QPN, mode, Duration::from_secs(5), None);
        let write = |r: &Rig<LocalBackend>, at: usize, v: u8| WqeOp::RdmaWrite {
            remote: RaddrSeg::new(r.raddr(at), r.rkey),
            payload: Payload::Inline(Box::leak(Box::new([v; 8]))),
        };
        let good = sq.post(&write(&r, 0, 1)).unwrap();
        let seg = [DataSeg::new(8, r.lkey, r.laddr(0))];
        let bad = sq
            .post(&WqeOp::RdmaRead {
                remote: RaddrSeg::new(r.raddr(0), 0xbeef),
                local: &seg,
            })
            .unwrap();
        let later = [
            sq.post(&write(&r, 16, 2)).unwrap(),
            sq.post(&write(&r, 24, 3)).unwrap(),
        ];
        assert_eq!(
            [good.index, bad.index, later[0].index, later[1].index],
            [0, 1, 2, 3]
        );
        sq.ring();
        for _ in 0..10 {
            r.core.progress();
        }
        let failed = |first: CqeReport| -> Result<(), SqError> {
            Err(SqError::Completion { qpn: QPN, first })
        };
        match mode {
            CqMode::Normal => {
                let first = CqeReport {
                    cqe_opcode: ERR,
                    wqe_opcode: opcode::RDMA_READ,
                    wqe_counter: 1,
                    index: 1,
                    syndrome: Syndrome::RemoteAccess as u8,
                    vendor_err_synd: 0,
                    byte_cnt: 0,
                };
                assert_eq!(sq.wait_posted(good), Ok(()));
                assert_eq!(sq.wait_posted(bad), failed(first));
                assert_eq!(sq.wait_posted(later[1]), failed(first));
                assert_eq!(sq.quiet(), failed(first));
            }
            CqMode::Collapsed => {
                // Four CQEs written to entry 0 (owner bits 0, 1, 0, 1): the last remains.
                assert_eq!(cqe(&r.mem, 0), (ERR, 0x05, opcode::RDMA_WRITE, 3, 1));
                let first = CqeReport {
                    cqe_opcode: ERR,
                    wqe_opcode: opcode::RDMA_WRITE,
                    wqe_counter: 3,
                    index: 3,
                    syndrome: Syndrome::WrFlush as u8,
                    vendor_err_synd: 0,
                    byte_cnt: 0,
                };
                assert_eq!(sq.wait_posted(bad), failed(first));
                assert_eq!(sq.wait_posted(good), failed(first));
                assert_eq!(sq.wait_posted(later[0]), failed(first));
                assert_eq!(sq.quiet(), failed(first));
            }
        }
        assert_eq!(sq.completed(), 4, "{mode:?}");
        assert_eq!(
            sq.error().map(|e| e.index),
            Some(if mode == CqMode::Normal { 1 } else { 3 })
        );
        // Only the first WRITE ran; the READ wrote nothing.
        assert_eq!(&r.rbytes()[..8], &[1; 8], "{mode:?}");
        assert_eq!(&r.rbytes()[8..32], &[0; 24], "{mode:?}");
        assert_eq!(&r.lbytes()[..8], &[0; 8], "{mode:?}");
    }
}

// ------------------------------------------------------------------ reference model

#[derive(Clone, Debug)]
enum Gen {
    InlineWrite {
        r: usize,
        data: Vec<u8>,
    },
    SgeWrite {
        l: usize,
        r: usize,
        len: usize,
    },
    Read {
        l: usize,
        r: usize,
        len: usize,
    },
    Cs {
        r: usize,
        l: usize,
        cmp_hit: bool,
        swap: u64,
    },
    Fa {
        r: usize,
        l: usize,
        add: u64,
    },
    MCs {
        size: u8,
        r: usize,
        l: usize,
        swap: u64,
        cmp: u64,
        sm: u64,
        cm: u64,
    },
    MFa {
        size: u8,
        r: usize,
        l: usize,
        add: u64,
        b: u64,
    },
    Nop,
}

fn gen_op() -> impl Strategy<Value = Gen> {
    let rb = RWORDS * 8;
    let lb = LWORDS * 8;
    prop_oneof![
        (0..rb - 64, prop::collection::vec(any::<u8>(), 0..60))
            .prop_map(|(r, data)| Gen::InlineWrite { r, data }),
        (0..lb - 600, 0..rb - 600, 0usize..600).prop_map(|(l, r, len)| Gen::SgeWrite { l, r, len }),
        (0..lb - 600, 0..rb - 600, 0usize..600).prop_map(|(l, r, len)| Gen::Read { l, r, len }),
        (0..RWORDS, 0..LWORDS, any::<bool>(), any::<u64>()).prop_map(|(r, l, cmp_hit, swap)| {
            Gen::Cs {
                r: r * 8,
                l: l * 8,
                cmp_hit,
                swap,
            }
        }),
        (0..RWORDS, 0..LWORDS, any::<u64>()).prop_map(|(r, l, add)| Gen::Fa {
            r: r * 8,
            l: l * 8,
            add
        }),
        (
            prop::bool::ANY,
            0..RWORDS,
            0..LWORDS,
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(four, r, l, swap, cmp, sm, cm)| {
                let size = if four { 4 } else { 8 };
                Gen::MCs {
                    size,
                    r: r * 8 / size as usize * size as usize,
                    l: l * 8,
                    swap,
                    cmp,
                    sm,
                    cm,
                }
            }),
        (
            prop::bool::ANY,
            0..RWORDS * 2,
            0..LWORDS,
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(four, r, l, add, b)| {
                let size: u8 = if four { 4 } else { 8 };
                let r = if four { r * 4 } else { r / 2 * 8 };
                Gen::MFa {
                    size,
                    r,
                    l: l * 8,
                    add,
                    b,
                }
            }),
        Just(Gen::Nop),
    ]
}

fn rd(b: &[u8], at: usize, size: u8) -> u64 {
    if size == 4 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap()) as u64
    } else {
        u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
    }
}

fn wr(b: &mut [u8], at: usize, size: u8, v: u64) {
    if size == 4 {
        b[at..at + 4].copy_from_slice(&(v as u32).to_ne_bytes());
    } else {
        b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

/// The reference semantics, written independently of the engine: (new value, old).
fn model_atomic(
    rm: &mut [u8],
    lm: &mut [u8],
    r: usize,
    l: usize,
    size: u8,
    f: impl Fn(u64) -> u64,
) {
    let m = if size == 4 { 0xffff_ffffu64 } else { u64::MAX };
    let old = rd(rm, r, size);
    wr(rm, r, size, f(old) & m);
    // The fetched value lands as a ConnectX writes it: 4 bytes big-endian, 8 bytes in
    // host byte order (the driver's host-endianness mode for 8-byte atomic responses).
    if size == 4 {
        lm[l..l + 4].copy_from_slice(&(old as u32).to_be_bytes());
    } else {
        lm[l..l + 8].copy_from_slice(&old.to_ne_bytes());
    }
}

/// Per-field add without carries across boundary bits, bit by bit.
fn field_add(old: u64, add: u64, b: u64, bits: u32) -> u64 {
    let mut out = 0u64;
    let mut carry = 0u64;
    for i in 0..bits {
        let (x, y) = ((old >> i) & 1, (add >> i) & 1);
        let s = x + y + carry;
        out |= (s & 1) << i;
        carry = if (b >> i) & 1 == 1 { 0 } else { s >> 1 };
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_wqe_streams_match_the_reference(
        ops in prop::collection::vec(gen_op(), 1..40),
        seed in any::<u64>(),
        wrap_start in 0u32..64,
    ) {
        let mut r = rig(64, 64, CqMode::Normal);
        // Start the producer index anywhere (so WQEs wrap the ring end) by posting NOPs.
        for _ in 0..wrap_start { r.post(&WqeOp::Nop); }
        r.run();
        r.mem.cq_dbrec_ci().store(
            u32::from_ne_bytes(rshmem::mlx5::doorbell::cq_consumer_index(wrap_start).to_bytes()),
            std::sync::atomic::Ordering::Release,
        );
        let cq0 = wrap_start;
        // Known initial contents.
        let mut x = seed | 1;
        let mut next = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x };
        for w in r.local.iter_mut() { *w = next(); }
        for w in r.rbuf.iter_mut() { *w = next(); }
        let mut lm = r.lbytes().to_vec();
        let mut rm = r.rbytes().to_vec();
        let mut want = Vec::new();
        for g in &ops {
            // Keep every WQE in the ring: drain when it could fill.
            if r.pi - cq0 - want.len() as u32 > 40 || want.len() as u32 + 1 >= 64 {
                break;
            }
            let res = |l: usize| Sge8 { addr: r.laddr(l), lkey: r.lkey };
            let (idx, opc, bc) = match g.clone() {
                Gen::Nop => (r.post(&WqeOp::Nop), opcode::NOP, 0),
                Gen::InlineWrite { r: ro, data } => {
                    rm[ro..ro + data.len()].copy_from_slice(&data);
                    let w = WqeOp::RdmaWrite { remote: RaddrSeg::new(r.raddr(ro), r.rkey), payload: Payload::Inline(&data) };
                    (r.post(&w), opcode::RDMA_WRITE, data.len() as u32)
                }
                Gen::SgeWrite { l, r: ro, len } => {
                    let half = len / 2;
                    // Two data segments, gathered in order.
                    let segs = [DataSeg::new(half as u32, r.lkey, r.laddr(l)), DataSeg::new((len - half) as u32, r.lkey, r.laddr(l + half))];
                    let src = lm[l..l + len].to_vec();
                    rm[ro..ro + len].copy_from_slice(&src);
                    let w = WqeOp::RdmaWrite { remote: RaddrSeg::new(r.raddr(ro), r.rkey), payload: Payload::Sge(&segs) };
                    (r.post(&w), opcode::RDMA_WRITE, len as u32)
                }
                Gen::Read { l, r: ro, len } => {
                    let src = rm[ro..ro + len].to_vec();
                    lm[l..l + len].copy_from_slice(&src);
                    let segs = [DataSeg::new(len as u32, r.lkey, r.laddr(l))];
                    let w = WqeOp::RdmaRead { remote: RaddrSeg::new(r.raddr(ro), r.rkey), local: &segs };
                    (r.post(&w), opcode::RDMA_READ, len as u32)
                }
                Gen::Cs { r: ro, l, cmp_hit, swap } => {
                    let cur = rd(&rm, ro, 8);
                    let compare = if cmp_hit { cur } else { cur ^ 1 };
                    model_atomic(&mut rm, &mut lm, ro, l, 8, |o| if o == compare { swap } else { o });
                    let w = WqeOp::AtomicCs { remote: RaddrSeg::new(r.raddr(ro), r.rkey), compare, swap, result: res(l) };
                    (r.post(&w), opcode::ATOMIC_CS, 8)
                }
                Gen::Fa { r: ro, l, add } => {
                    model_atomic(&mut rm, &mut lm, ro, l, 8, |o| o.wrapping_add(add));
                    let w = WqeOp::AtomicFa { remote: RaddrSeg::new(r.raddr(ro), r.rkey), add, result: res(l) };
                    (r.post(&w), opcode::ATOMIC_FA, 8)
                }
                Gen::MCs { size, r: ro, l, swap, cmp, sm, cm } => {
                    let m = if size == 4 { 0xffff_ffffu64 } else { u64::MAX };
                    let (swap, cmp, sm, cm) = (swap & m, cmp & m, sm & m, cm & m);
                    // Half the time make the compare succeed.
                    let cur = rd(&rm, ro, size);
                    let cmp = if seed & 1 == 0 { (cur & cm) | (cmp & !cm) } else { cmp };
                    model_atomic(&mut rm, &mut lm, ro, l, size, |o| {
                        if o & cm == cmp & cm { (o & !sm) | (swap & sm) } else { o }
                    });
                    let remote = RaddrSeg::new(r.raddr(ro), r.rkey);
                    let w = if size == 4 {
                        WqeOp::MaskedCs32 { remote, swap: swap as u32, compare: cmp as u32, swap_mask: sm as u32, compare_mask: cm as u32, result: res(l) }
                    } else {
                        WqeOp::MaskedCs64 { remote, swap, compare: cmp, swap_mask: sm, compare_mask: cm, result: res(l) }
                    };
                    (r.post(&w), opcode::ATOMIC_MASKED_CS, size as u32)
                }
                Gen::MFa { size, r: ro, l, add, b } => {
                    let bits = size as u32 * 8;
                    let m = if size == 4 { 0xffff_ffffu64 } else { u64::MAX };
                    let (add, b) = (add & m, b & m);
                    model_atomic(&mut rm, &mut lm, ro, l, size, |o| field_add(o, add, b, bits));
                    let remote = RaddrSeg::new(r.raddr(ro), r.rkey);
                    let w = if size == 4 {
                        WqeOp::MaskedFa32 { remote, add: add as u32, field_boundary: b as u32, result: res(l) }
                    } else {
                        WqeOp::MaskedFa64 { remote, add, field_boundary: b, result: res(l) }
                    };
                    (r.post(&w), opcode::ATOMIC_MASKED_FA, size as u32)
                }
            };
            want.push((idx, opc, bc));
        }
        r.run();
        for (k, &(idx, opc, bc)) in want.iter().enumerate() {
            let c = r.mem.read_cqe(cq0 + k as u32);
            prop_assert_eq!((c.opcode(), c.wqe_opcode(), c.wqe_counter.get(), c.byte_cnt.get()), (REQ, opc, idx, bc), "CQE {}", k);
            prop_assert_eq!(c.owner(), rshmem::mlx5::cqe::owner_bit(cq0 + k as u32, 64));
        }
        let end = cq0 + want.len() as u32;
        prop_assert!(!rshmem::mlx5::cqe::sw_owns(r.mem.cqe_op_own(end), end, 64), "no extra CQE");
        prop_assert!(r.rbytes() == &rm[..], "remote memory differs");
        prop_assert!(r.lbytes() == &lm[..], "local memory differs");
    }
}

#[test]
fn field_add_formula_matches_bitwise_model() {
    use rshmem::softhca::AtomicOp;
    let mut x = 0x1234_5678_9abc_def1u64;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (o, a, b) = (x, x.rotate_left(17), x.rotate_left(31) & x.rotate_left(5));
        let op = AtomicOp::MaskedFa {
            size: 8,
            add: a,
            boundary: b,
        };
        assert_eq!(op.apply(o), field_add(o, a, b, 64));
    }
}

// ------------------------------------------------------------------ asynchronous backend

/// Completes operations in reverse order of issue, on `poll`: the engine must still write
/// CQEs in WQE order, and hold a FENCEd WQE until everything earlier completed.
#[derive(Default)]
struct Reverse {
    pending: Vec<u64>,
    executed: Vec<u64>,
}

impl Backend for Reverse {
    type Peer = ();
    type Cache = ();
    fn execute(
        &mut self,
        _: &(),
        _: &mut (),
        token: u64,
        _op: &Op<'_>,
    ) -> Option<Result<(), Syndrome>> {
        self.pending.push(token);
        self.executed.push(token);
        None
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, Result<(), Syndrome>)) {
        while let Some(t) = self.pending.pop() {
            done(t, Ok(()));
        }
    }
}

#[test]
fn async_backend_out_of_order_completions_retire_in_order_and_fence_drains() {
    let mut r = rig_with(Reverse::default(), |_| (), 16, 16, CqMode::Normal);
    let a = r.write(0, &[1; 8]);
    r.post(&a);
    r.post(&a);
    r.post_fenced(&a, FenceMode::Fence);
    r.post(&a);
    r.ring();
    // First round: two WQEs start; the fenced third waits for them.
    r.core.progress();
    assert_eq!(r.core.backend().executed.len(), 2);
    for _ in 0..10 {
        r.core.progress();
    }
    assert_eq!(r.core.backend().executed.len(), 4);
    for i in 0..4u32 {
        assert_eq!(cqe(&r.mem, i), (REQ, 0, opcode::RDMA_WRITE, i as u16, 0));
    }
}

/// Starts every operation asynchronously (it completes on the next `poll`) except a WRITE
/// with rkey [`BAD_RKEY`], which it rejects at once with REMOTE_ACCESS, as the fabric
/// backend rejects an unknown rkey before posting. Records the raddr of every WRITE it
/// started: what reached the network.
#[derive(Default)]
struct RejectBadRkey {
    pending: Vec<u64>,
    started: Vec<u64>,
    /// Operations in flight complete with REMOTE_ACCESS instead (a remote NAK).
    fail_in_flight: bool,
}

const BAD_RKEY: u32 = 0xdead;

impl Backend for RejectBadRkey {
    type Peer = ();
    type Cache = ();
    fn execute(
        &mut self,
        _: &(),
        _: &mut (),
        token: u64,
        op: &Op<'_>,
    ) -> Option<Result<(), Syndrome>> {
        if let Op::Write { rkey, raddr, .. } = *op {
            if rkey == BAD_RKEY {
                return Some(Err(Syndrome::RemoteAccess));
            }
            self.started.push(raddr);
        }
        self.pending.push(token);
        None
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, Result<(), Syndrome>)) {
        let s = match self.fail_in_flight {
            true => Err(Syndrome::RemoteAccess),
            false => Ok(()),
        };
        for t in self.pending.drain(..) {
            done(t, s);
        }
    }
}

/// The in-flight WRITE fails later (a remote NAK) and the WQE behind it had failed at once
/// (a bad lkey): only the first failure keeps its syndrome; the second, like every later
/// WQE, completes as WR_FLUSH, as a ConnectX reports it.
#[test]
fn async_backend_only_the_first_failure_keeps_its_syndrome() {
    let mut r = rig_with(
        RejectBadRkey {
            fail_in_flight: true,
            ..Default::default()
        },
        |_| (),
        16,
        16,
        CqMode::Normal,
    );
    let a = r.write(0, &[1; 8]);
    r.post(&a);
    let seg = [DataSeg::new(8, 0xbeef, r.laddr(0))];
    let b = WqeOp::RdmaWrite {
        remote: RaddrSeg::new(r.raddr(8), r.rkey),
        payload: Payload::Sge(&seg),
    };
    r.post(&b);
    let c = r.write(64, &[3; 8]);
    r.post(&c);
    r.ring();
    r.run();
    assert_eq!(
        cqe(&r.mem, 0),
        (ERR, Syndrome::RemoteAccess as u8, opcode::RDMA_WRITE, 0, 0)
    );
    for i in 1..3u32 {
        assert_eq!(
            cqe(&r.mem, i),
            (
                ERR,
                Syndrome::WrFlush as u8,
                opcode::RDMA_WRITE,
                i as u16,
                0
            ),
            "CQE {i}"
        );
    }
    assert_eq!(r.mem.cqe_op_own(3), OP_OWN_INIT, "no extra CQE");
}

/// A doorbell record more than a ring ahead of the engine, or behind it (gone backwards),
/// is a producer bug: nothing is executed (the slots past one ring hold the previous lap's
/// WQEs), and the QP goes to the error state with QP_FATAL. Before 2026-12-07 the count was
/// clamped to one ring and a whole ring of stale WQEs ran again.
#[test]
fn a_doorbell_record_past_one_ring_or_backwards_is_qp_fatal() {
    for (name, ahead) in [("a ring + 1 ahead", 17u16), ("backwards", 0xfff0)] {
        let mut r = rig(16, 16, CqMode::Normal);
        let w = r.write(0, &[0x5a; 8]);
        r.post(&w);
        r.run();
        assert_eq!(&r.rbytes()[..8], &[0x5a; 8], "{name}");
        r.rbytes_mut_clear();
        let v = rshmem::mlx5::doorbell::send_counter(1u32.wrapping_add(ahead as u32) & 0xffff);
        r.mem.qp_dbrec_send().store(
            u32::from_ne_bytes(v.to_bytes()),
            std::sync::atomic::Ordering::Release,
        );
        for _ in 0..3 {
            r.core.progress();
        }
        assert_eq!(&r.rbytes()[..8], &[0u8; 8], "{name}: a stale WQE ran");
        assert_eq!(
            r.qp.wqes.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "{name}"
        );
        assert!(
            r.qp.in_error.load(std::sync::atomic::Ordering::Acquire),
            "{name}"
        );
        let ev = r
            .mem
            .async_events()
            .unwrap()
            .load(std::sync::atomic::Ordering::Acquire);
        assert_eq!(ev, EVENT_QP_FATAL, "{name}");
        assert_eq!(r.mem.cqe_op_own(1), OP_OWN_INIT, "{name}: no CQE");
    }
}

/// Starts every operation asynchronously; `poll` completes every pending one except the
/// first ever started (held until `release`), the second ever started with REMOTE_ACCESS
/// (a remote NAK that arrives while the first is still in flight), the rest Ok. Records the
/// raddr of every WRITE started.
#[derive(Default)]
struct LateNak {
    pending: Vec<u64>,
    started: Vec<u64>,
    tokens: Vec<u64>,
    release: bool,
}

impl Backend for LateNak {
    type Peer = ();
    type Cache = ();
    fn execute(
        &mut self,
        _: &(),
        _: &mut (),
        token: u64,
        op: &Op<'_>,
    ) -> Option<Result<(), Syndrome>> {
        if let Op::Write { raddr, .. } = *op {
            self.started.push(raddr);
        }
        self.tokens.push(token);
        self.pending.push(token);
        None
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, Result<(), Syndrome>)) {
        let first = self.tokens.first().copied();
        let second = self.tokens.get(1).copied();
        let release = self.release;
        self.pending.retain(|&t| {
            if Some(t) == first && !release {
                return true;
            }
            done(
                t,
                if Some(t) == second {
                    Err(Syndrome::RemoteAccess)
                } else {
                    Ok(())
                },
            );
            false
        });
    }
}

/// A failure reported by the backend while an earlier WQE is still in flight stops the
/// QP at once: WQEs posted after it are flushed without being started (before 2026-12-07
/// they were started, and then reported as WR_FLUSH although they had executed).
#[test]
fn async_backend_failure_reported_behind_inflight_stops_later_wqes() {
    let mut r = rig_with(LateNak::default(), |_| (), 16, 16, CqMode::Normal);
    let ab = vec![r.raddr(0), r.raddr(64)];
    let a = r.write(0, &[1; 8]);
    r.post(&a);
    let b = r.write(64, &[2; 8]);
    r.post(&b);
    r.ring();
    // Round 1 starts A and B; round 2's poll reports B's NAK while A is in flight.
    r.core.progress();
    r.core.progress();
    assert_eq!(r.core.backend().started, ab);
    assert_eq!(r.mem.cqe_op_own(0), OP_OWN_INIT, "A is still in flight");
    let c = r.write(128, &[3; 8]);
    r.post(&c);
    let d = r.write(192, &[4; 8]);
    r.post(&d);
    r.ring();
    for _ in 0..5 {
        r.core.progress();
    }
    assert_eq!(
        r.core.backend().started,
        ab,
        "nothing after the failure started"
    );
    r.core.backend().release = true;
    r.run();
    assert_eq!(cqe(&r.mem, 0), (REQ, 0, opcode::RDMA_WRITE, 0, 0));
    assert_eq!(
        cqe(&r.mem, 1),
        (ERR, Syndrome::RemoteAccess as u8, opcode::RDMA_WRITE, 1, 0)
    );
    for i in 2..4u32 {
        assert_eq!(
            cqe(&r.mem, i),
            (
                ERR,
                Syndrome::WrFlush as u8,
                opcode::RDMA_WRITE,
                i as u16,
                0
            ),
            "CQE {i}"
        );
    }
    assert_eq!(r.mem.cqe_op_own(4), OP_OWN_INIT, "no extra CQE");
}

/// A WQE that fails at once (before reaching the backend, or rejected by it) while an
/// earlier WRITE is still in flight: its error CQE waits for that WRITE's, but nothing after
/// it may execute meanwhile — the later WRITEs, a FENCEd one included, are flushed in
/// order without being started, as on a ConnectX.
#[test]
fn async_backend_wqe_failing_at_once_behind_inflight_flushes_the_rest_unexecuted() {
    type Bad = fn(&mut Rig<RejectBadRkey>) -> (u16, u8);
    let cases: [(&str, Syndrome, Bad); 3] = [
        (
            "bad rkey (rejected by the backend)",
            Syndrome::RemoteAccess,
            |r| {
                let w = WqeOp::RdmaWrite {
                    remote: RaddrSeg::new(r.raddr(8), BAD_RKEY),
                    payload: Payload::Inline(&[2; 8]),
                };
                (r.post(&w), opcode::RDMA_WRITE)
            },
        ),
        ("bad lkey", Syndrome::LocalProt, |r| {
            let seg = [DataSeg::new(8, 0xbeef, r.laddr(0))];
            let w = WqeOp::RdmaWrite {
                remote: RaddrSeg::new(r.raddr(8), r.rkey),
                payload: Payload::Sge(&seg),
            };
            (r.post(&w), opcode::RDMA_WRITE)
        }),
        ("unknown opcode (parse error)", Syndrome::LocalQpOp, |r| {
            let mut b = [0u8; 64];
            CtrlSeg::new(r.pi as u16, 0x3f, 0, QPN, 0x08, 1, 0, Be32::new(0))
                .write_to(&mut b)
                .unwrap();
            (r.put_raw(&b), 0x3f)
        }),
    ];
    for (name, syndrome, bad) in cases {
        let mut r = rig_with(RejectBadRkey::default(), |_| (), 16, 16, CqMode::Normal);
        let a0 = r.raddr(0);
        let a = r.write(0, &[1; 8]);
        let ia = r.post(&a);
        let (ib, bad_op) = bad(&mut r);
        let c = r.write(64, &[3; 8]);
        let ic = r.post(&c);
        let d = r.write(128, &[4; 8]);
        let id = r.post_fenced(&d, FenceMode::Fence);
        let e = r.write(192, &[5; 8]);
        let ie = r.post(&e);
        assert_eq!([ia, ib, ic, id, ie], [0, 1, 2, 3, 4], "{name}");
        r.ring();
        // First round: A starts; B fails while A is in flight; C, D, E must not start.
        r.core.progress();
        assert_eq!(r.core.backend().started, vec![a0], "{name}");
        assert_eq!(
            r.mem.cqe_op_own(0),
            OP_OWN_INIT,
            "{name}: A is still in flight"
        );
        assert_eq!(
            r.qp.wqes.load(std::sync::atomic::Ordering::Relaxed),
            5,
            "{name}"
        );
        r.run();
        assert_eq!(r.core.backend().started, vec![a0], "{name}");
        assert_eq!(cqe(&r.mem, 0), (REQ, 0, opcode::RDMA_WRITE, 0, 0), "{name}");
        assert_eq!(
            cqe(&r.mem, 1),
            (ERR, syndrome as u8, bad_op, 1, 0),
            "{name}"
        );
        for i in 2..5u32 {
            assert_eq!(
                cqe(&r.mem, i),
                (
                    ERR,
                    Syndrome::WrFlush as u8,
                    opcode::RDMA_WRITE,
                    i as u16,
                    0
                ),
                "{name}: CQE {i}"
            );
        }
        assert_eq!(r.mem.cqe_op_own(5), OP_OWN_INIT, "{name}: no extra CQE");
        assert!(
            r.qp.in_error.load(std::sync::atomic::Ordering::Acquire),
            "{name}"
        );
    }
}
