//! The progress handover between waiting threads ("drivers", `Waker::drive`) and the soft
//! HCA's engine thread (softhca::Waker): with a backend whose callers drive, the engine
//! thread parks while a driver exists, and no doorbell may be lost when drivers come and
//! go. The backend here sleeps 30 s when idle, so a lost wakeup shows as a stall, and every
//! wait below is bounded well under that and never runs an engine round itself.
use rshmem::mlx5::wqe::{Payload, RaddrSeg, WqeOp};
use rshmem::mlx5::Syndrome;
use rshmem::softhca::backend::{Backend, Op};
use rshmem::softhca::{
    Access, CqMode, LocalBackend, LocalPeer, MrTable, QpConfig, QpHandle, QueueMemory, SendQueue,
    SoftHca, Waker,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The LocalBackend, but its callers drive and its idle engine sleeps 30 s.
struct Lazy(LocalBackend);

impl Backend for Lazy {
    type Peer = LocalPeer;
    type Cache = <LocalBackend as Backend>::Cache;

    fn execute(
        &mut self,
        peer: &LocalPeer,
        cache: &mut Self::Cache,
        token: u64,
        op: &Op<'_>,
    ) -> Option<Result<(), Syndrome>> {
        self.0.execute(peer, cache, token, op)
    }

    fn idle_wait(&self) -> Duration {
        Duration::from_secs(30)
    }

    fn callers_drive(&self) -> bool {
        true
    }

    fn handover(&self) -> bool {
        true
    }
}

/// Longest a WRITE may take to land without the waiter's help (vs the 30 s idle sleep).
const BOUND: Duration = Duration::from_secs(3);

/// One QP writing into its own 8-word target.
struct Lane {
    // Field order is drop order: the QP detaches before the memory it writes goes.
    _qp: QpHandle<Lazy>,
    sq: SendQueue,
    words: Box<[AtomicU64]>,
    rkey: u32,
    _pd: Arc<MrTable>,
    _remote: Arc<MrTable>,
}

fn lane(hca: &SoftHca<Lazy>) -> Lane {
    let words: Box<[AtomicU64]> = (0..8).map(|_| AtomicU64::new(0)).collect();
    let pd = Arc::new(MrTable::new());
    let remote = Arc::new(MrTable::new());
    let p = words.as_ptr() as *mut u8;
    // SAFETY: the box lives in the Lane, whose QP handle (dropped before it) detaches the
    // QP from the engine.
    let rkey = unsafe { remote.register(p, p as u64, 64, Access::ALL) };
    let mem = Arc::new(QueueMemory::new(16, 16).unwrap());
    let qp = hca.attach(QpConfig::new(
        mem.clone(),
        pd.clone(),
        LocalPeer::new(remote.clone()),
        CqMode::Normal,
    ));
    let sq = SendQueue::new(
        mem,
        qp.qpn(),
        CqMode::Normal,
        Duration::from_secs(10),
        Some(hca.waker()),
    );
    Lane {
        words,
        rkey,
        sq,
        _qp: qp,
        _pd: pd,
        _remote: remote,
    }
}

impl Lane {
    /// Posts an inline WRITE of `v` to word `w` (rings the doorbell, calls `wake`).
    fn post(&self, w: usize, v: u64) {
        let b = v.to_ne_bytes();
        let op = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(self.words[w].as_ptr() as u64, self.rkey),
            payload: Payload::Inline(&b),
        };
        let _ = self.sq.post(&op).unwrap();
    }

    /// Waits, without running engine rounds, until word `w` holds `v`; consumes CQEs so
    /// the engine never stalls on a full CQ.
    fn land(&self, w: usize, v: u64, waker: &Waker, what: &str) {
        let t0 = Instant::now();
        // Acquire: the engine's write of the word (plain copy under the engine's release
        // of the CQE; the value itself is what we test).
        while self.words[w].load(Ordering::Acquire) != v {
            self.sq.poll_cq();
            assert!(
                t0.elapsed() < BOUND,
                "{what}: word {w} still {:#x}, expected {v:#x}, after {:?} (lost wakeup?) {:?}",
                self.words[w].load(Ordering::Relaxed),
                t0.elapsed(),
                waker.stats()
            );
            std::thread::yield_now();
        }
        self.sq.poll_cq();
    }
}

/// Waits until the engine thread is parked (for the driver, or in its 30 s idle sleep:
/// either way a doorbell rung while a driver exists does not wake it).
fn engine_parked(w: &Waker) {
    let t0 = Instant::now();
    while !w.stats().sleeping {
        assert!(t0.elapsed() < BOUND, "engine never parked: {:?}", w.stats());
        std::thread::yield_now();
    }
}

#[test]
fn driver_that_leaves_with_a_pending_doorbell_hands_over() {
    let hca = SoftHca::start(Lazy(LocalBackend), "handover").unwrap();
    let w = hca.waker();
    let l = lane(&hca);
    for i in 1..=20u64 {
        let g = w.drive();
        engine_parked(&w);
        let before = w.stats();
        // The doorbell finds a driver: it must not wake the engine.
        l.post(0, i);
        let after = w.stats();
        assert_eq!(after.rings, before.rings + 1);
        assert_eq!(after.drivers, 1);
        // Stop driving without ever running a round: the engine must take over.
        drop(g);
        l.land(0, i, &w, "after a driver left");
    }
    let s = w.stats();
    assert_eq!(s.drivers, 0);
    assert!(s.handovers >= 1, "no handover recorded: {s:?}");
    assert!(
        s.driven_parks >= 1,
        "the engine never parked for a driver: {s:?}"
    );
}

#[test]
fn driver_that_ran_the_round_needs_no_handover() {
    let hca = SoftHca::start(Lazy(LocalBackend), "handover").unwrap();
    let w = hca.waker();
    let l = lane(&hca);
    for i in 1..=20u64 {
        let g = w.drive();
        engine_parked(&w);
        l.post(1, i);
        // The engine is parked, so the core is free (a spurious wake-up could hold it for
        // a round: retry, bounded).
        let t0 = Instant::now();
        while l.words[1].load(Ordering::Acquire) != i || w.stats().served < w.stats().rings {
            w.assist();
            assert!(
                t0.elapsed() < BOUND,
                "assist did not drain the WRITE: {:?}",
                w.stats()
            );
        }
        let h = w.stats().handovers;
        drop(g);
        assert_eq!(w.stats().handovers, h, "nothing was pending: no unpark");
        l.sq.poll_cq();
    }
}

#[test]
fn doorbell_without_drivers_wakes_the_engine() {
    let hca = SoftHca::start(Lazy(LocalBackend), "handover").unwrap();
    let w = hca.waker();
    let l = lane(&hca);
    for i in 1..=50u64 {
        // Let the engine reach its 30 s idle sleep sometimes, catch it awake other times.
        if i % 2 == 0 {
            let t0 = Instant::now();
            while !w.stats().sleeping && t0.elapsed() < Duration::from_millis(200) {
                std::thread::yield_now();
            }
        }
        l.post(2, i);
        l.land(2, i, &w, "doorbell with no driver");
    }
}

/// Many threads of one process: each posts on its own QP and waits without helping, while
/// others start and stop driving (some posting as drivers and leaving at once, as a put
/// does when its own round misses the engine). Every WRITE must land within BOUND.
#[test]
fn many_threads_driving_and_leaving_lose_no_doorbell() {
    let hca = Arc::new(SoftHca::start(Lazy(LocalBackend), "handover").unwrap());
    let w = hca.waker();
    const THREADS: usize = 6;
    const ITERS: u64 = 3000;
    let lanes: Vec<Arc<Lane>> = (0..THREADS).map(|_| Arc::new(lane(&hca))).collect();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for (k, l) in lanes.iter().enumerate() {
            let w = w.clone();
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (k as u64 * 0x1234_5678);
                for i in 1..=ITERS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let v = (k as u64) << 32 | i;
                    match x % 4 {
                        // Drive for a few rounds and leave (no post).
                        0 => {
                            {
                                let _g = w.drive();
                                for _ in 0..(x >> 8) % 8 {
                                    w.assist();
                                }
                            }
                            l.post(3, v);
                            l.land(3, v, &w, "plain post after driving");
                        }
                        // Post as a driver and leave without running a round.
                        1 => {
                            {
                                let _g = w.drive();
                                l.post(3, v);
                            }
                            l.land(3, v, &w, "post by a driver that left at once");
                        }
                        // Post as a driver, run one round, leave (the put path).
                        2 => {
                            {
                                let _g = w.drive();
                                l.post(3, v);
                                w.assist();
                            }
                            l.land(3, v, &w, "put path");
                        }
                        // Plain post, no driver of our own.
                        _ => {
                            l.post(3, v);
                            l.land(3, v, &w, "plain post");
                        }
                    }
                }
            });
        }
    });
    let st = w.stats();
    assert_eq!(st.drivers, 0, "{st:?}");
    for (k, l) in lanes.iter().enumerate() {
        assert_eq!(
            l.words[3].load(Ordering::Acquire),
            (k as u64) << 32 | ITERS,
            "lane {k}"
        );
        l.sq.quiet().unwrap();
        assert_eq!(l.sq.completed(), ITERS, "lane {k}: every WQE completed");
    }
    eprintln!(
        "{THREADS} threads x {ITERS} posts in {:?}: {st:?}",
        t0.elapsed()
    );
}
