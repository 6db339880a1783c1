//! The CPU doorbell relay: rings a NIC's doorbell registers for producers that cannot
//! reach them (GPU threads when the driver refuses to map the UAR into the GPU; see
//! docs/ibgda.md, "The doorbell into the GPU, and the fallback").
//!
//! Each relayed queue pair gets a *shadow* doorbell: an 8-byte word in host memory that
//! the producers ring instead of the register, with exactly the store sequence they would
//! use on the register (`doorbell_mode` MEMORY: doorbell record first, then the 8-byte
//! doorbell value with release ordering at system scope). One thread watches every shadow
//! and, when one changes, stores the new value into that queue pair's register.
//!
//! A changed value could look unchanged: the value is `{BE32(pi << 8), BE32(qpn << 8)}`
//! with the 16-bit producer index `pi`, so it repeats after 65 536 WQEBBs. Producers cannot
//! get more than `wqe_cnt` (at most 16 384) WQEBBs past what the NIC completed, so that
//! needs a NIC that went on by itself (ConnectX may read the doorbell record while busy)
//! through 65 536 WQEBBs between two polls of the relay, then stopped. To make even that
//! harmless, when the relay has relayed nothing for [`RERING`] it rings each queue's
//! last value once more (once per value, not periodically: an idle job costs no MMIO
//! writes): a doorbell with the index the NIC already has is a no-op.
//!
//! Ordering: the producer's doorbell-record store happens before its shadow store
//! (release); the relay loads the shadow with acquire, so the record is visible in host
//! memory (which the NIC reads by DMA, coherently) before the relay's register store. The
//! register store is a volatile 8-byte store between two barriers, as rdma-core brackets
//! its doorbell writes: before it, one that orders every earlier access before a device
//! store (`dmb osh` on aarch64; on x86 a full `mfence`, stronger than needed); after it,
//! one that pushes the store out of the write-combining buffer now (the BlueFlame page is
//! mapped write-combining; `mfence` on x86 drains it, `dsb st` on aarch64, as
//! `mmio_flush_writes`).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Where a relayed doorbell value goes.
pub trait DoorbellRegister: Send {
    fn store(&mut self, value: u64);
}

/// A NIC doorbell register (the UAR's BlueFlame register, `bf.reg`).
pub struct MmioRegister {
    addr: *mut u64,
}

// SAFETY: the register is a device address valid for the QP's lifetime (the relay stops
// before the QP is destroyed); only the relay thread stores to it.
unsafe impl Send for MmioRegister {}

impl MmioRegister {
    /// # Safety
    /// `addr` must be an 8-byte aligned doorbell register mapped in this process for as
    /// long as the relay runs, and nothing else may ring that QP's doorbell meanwhile.
    pub unsafe fn new(addr: *mut u64) -> MmioRegister {
        MmioRegister { addr }
    }
}

/// Orders every earlier memory access before a later store to a device mapping. Also
/// used by [`crate::softhca::queue::SendQueue::ring`] on a NIC's own queues.
#[inline(always)]
pub(crate) fn before_device_store() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; no memory is touched.
    unsafe {
        std::arch::asm!("dmb osh", options(nostack, preserves_flags))
    };
    // x86: mfence (SeqCst) orders everything; the compiler fence part keeps the store
    // below in place on every target.
    #[cfg(not(target_arch = "aarch64"))]
    fence(Ordering::SeqCst);
}

/// Completes an earlier store to a (write-combining) device mapping now. Also used by
/// [`crate::softhca::queue::SendQueue::ring`] on a NIC's own queues.
#[inline(always)]
pub(crate) fn flush_device_store() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction; no memory is touched.
    unsafe {
        std::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
    // x86: mfence drains the write-combining buffers.
    #[cfg(not(target_arch = "aarch64"))]
    fence(Ordering::SeqCst);
}

impl DoorbellRegister for MmioRegister {
    fn store(&mut self, value: u64) {
        before_device_store();
        // SAFETY: valid aligned register (MmioRegister::new's contract); volatile because
        // a device register is not memory the compiler may merge or drop stores to.
        unsafe { std::ptr::write_volatile(self.addr, value) };
        flush_device_store();
    }
}

/// One relayed queue pair: its shadow word and its register.
pub struct Relayed {
    shadow: *const AtomicU64,
    register: Box<dyn DoorbellRegister>,
    last: u64,
    /// Whether `last` was rung again since it was relayed.
    rerung: bool,
}

// SAFETY: the shadow is host memory that outlives the relay (DoorbellRelay::new's
// contract) and is only loaded atomically.
unsafe impl Send for Relayed {}

impl Relayed {
    /// # Safety
    /// `shadow` must point at an 8-byte aligned word that stays allocated until the relay
    /// that takes this value has been dropped. The word must start as 0 (no doorbell yet).
    pub unsafe fn new(shadow: *const u64, register: Box<dyn DoorbellRegister>) -> Relayed {
        Relayed {
            shadow: shadow.cast(),
            register,
            last: 0,
            rerung: false,
        }
    }

    /// Once per quiet period: relays the shadow if it changed meanwhile, else rings the
    /// last value again (see the module comment), if there was one.
    fn rering(&mut self) {
        if self.poll() || self.rerung || self.last == 0 {
            return;
        }
        self.register.store(self.last);
        self.rerung = true;
    }

    /// Relays a changed shadow; whether it changed.
    fn poll(&mut self) -> bool {
        // SAFETY: valid aligned word (Relayed::new's contract), accessed atomically here
        // and by producers. Acquire: see the module comment.
        let v = unsafe { &*self.shadow }.load(Ordering::Acquire);
        if v == self.last {
            return false;
        }
        self.register.store(v);
        self.last = v;
        self.rerung = false;
        true
    }
}

/// How long after its last relayed doorbell the relay keeps spinning before it sleeps
/// between rounds: doorbells of a burst (a kernel's posts) get through in well under a
/// microsecond, and an idle relay costs no CPU.
pub const SPIN: Duration = Duration::from_micros(200);
/// Its sleep when idle (a doorbell waits at most about this long, plus timer slack, which
/// the thread sets to 1 µs).
const IDLE_SLEEP: Duration = Duration::from_micros(20);
/// Idle time after which every queue's last doorbell is rung again.
pub const RERING: Duration = Duration::from_millis(1);

/// The relay thread; stopped and joined on drop.
pub struct DoorbellRelay {
    stop: Arc<AtomicBool>,
    relayed: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl DoorbellRelay {
    /// Starts a thread relaying every queue of `queues`.
    pub fn new(queues: Vec<Relayed>, name: &str) -> std::io::Result<DoorbellRelay> {
        let stop = Arc::new(AtomicBool::new(false));
        let relayed = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), relayed.clone());
        let mut queues = queues;
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // SAFETY: prctl on the calling thread with an integer argument. The
                // default 50 µs slack would more than triple the idle sleep.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
                let mut last_change = std::time::Instant::now();
                // Acquire, paired with Drop's release store: the last round below sees
                // every shadow store made before the relay was dropped.
                while !s.load(Ordering::Acquire) {
                    let mut n = 0;
                    for q in queues.iter_mut() {
                        n += q.poll() as u64;
                    }
                    if n > 0 {
                        // Relaxed: a statistic.
                        r.fetch_add(n, Ordering::Relaxed);
                        last_change = std::time::Instant::now();
                        continue;
                    }
                    let quiet = last_change.elapsed();
                    if quiet < SPIN {
                        std::hint::spin_loop();
                    } else {
                        if quiet >= RERING {
                            // Each queue re-rings once per value (Relayed::rering).
                            for q in queues.iter_mut() {
                                q.rering();
                            }
                        }
                        std::thread::sleep(IDLE_SLEEP);
                    }
                }
                // A last round: a doorbell rung just before the stop still gets out.
                for q in queues.iter_mut() {
                    q.poll();
                }
            })?;
        Ok(DoorbellRelay {
            stop,
            relayed,
            thread: Some(thread),
        })
    }

    /// Doorbells relayed so far.
    pub fn relayed(&self) -> u64 {
        self.relayed.load(Ordering::Relaxed)
    }
}

impl Drop for DoorbellRelay {
    fn drop(&mut self) {
        // Release: see the loop's acquire load.
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // The loop checks the flag every round and sleeps 20 µs at most: bounded.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx5::doorbell::{doorbell_word, parse_doorbell};
    use std::sync::Mutex;
    use std::time::Instant;

    /// A register that records every store (a NIC register cannot exist here).
    struct Recorder(Arc<Mutex<Vec<u64>>>);
    impl DoorbellRegister for Recorder {
        fn store(&mut self, value: u64) {
            self.0.lock().unwrap().push(value);
        }
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn relays_each_change_once_to_its_own_register() {
        let shadows: Vec<Box<AtomicU64>> = (0..3).map(|_| Box::new(AtomicU64::new(0))).collect();
        let logs: Vec<Arc<Mutex<Vec<u64>>>> = (0..3).map(|_| Arc::default()).collect();
        let queues = shadows
            .iter()
            .zip(&logs)
            .map(|(s, l)| {
                // SAFETY: the boxes outlive the relay (dropped at the end of the test,
                // after `relay`).
                unsafe {
                    Relayed::new(
                        (&**s as *const AtomicU64).cast(),
                        Box::new(Recorder(l.clone())),
                    )
                }
            })
            .collect();
        let relay = DoorbellRelay::new(queues, "test-relay").unwrap();
        for pi in 1..=5u16 {
            shadows[1].store(doorbell_word(pi, 0x42), Ordering::Release);
            wait_for("the relay to pass a doorbell on", || {
                logs[1].lock().unwrap().last() == Some(&doorbell_word(pi, 0x42))
            });
        }
        shadows[2].store(doorbell_word(7, 0x43), Ordering::Release);
        wait_for("queue 2's doorbell", || !logs[2].lock().unwrap().is_empty());
        drop(relay);
        // Each change once, in order; the same value again only as a re-ring (the relay
        // was idle for RERING), never an older one.
        let mut l1 = logs[1].lock().unwrap().clone();
        l1.dedup();
        assert_eq!(
            l1,
            (1..=5)
                .map(|pi| doorbell_word(pi, 0x42))
                .collect::<Vec<_>>()
        );
        let mut l2 = logs[2].lock().unwrap().clone();
        l2.dedup();
        assert_eq!(l2, vec![doorbell_word(7, 0x43)]);
        assert!(
            logs[0].lock().unwrap().is_empty(),
            "an unrung queue is left alone"
        );
    }

    #[test]
    fn an_idle_relay_rings_the_last_doorbell_again() {
        let shadow = Box::new(AtomicU64::new(0));
        let log: Arc<Mutex<Vec<u64>>> = Arc::default();
        // SAFETY: `shadow` outlives the relay.
        let q = unsafe {
            Relayed::new(
                (&*shadow as *const AtomicU64).cast(),
                Box::new(Recorder(log.clone())),
            )
        };
        let relay = DoorbellRelay::new(vec![q], "test-relay").unwrap();
        std::thread::sleep(RERING * 3);
        assert!(log.lock().unwrap().is_empty(), "nothing to ring again yet");
        shadow.store(doorbell_word(3, 5), Ordering::Release);
        wait_for("the relay and one re-ring", || {
            log.lock().unwrap().len() >= 2
        });
        // Once per quiet period: nothing more however long the queue stays quiet.
        std::thread::sleep(RERING * 5);
        assert_eq!(*log.lock().unwrap(), vec![doorbell_word(3, 5); 2]);
        // A new doorbell starts a new quiet period, with its own single re-ring.
        shadow.store(doorbell_word(4, 5), Ordering::Release);
        wait_for("the next relay and its re-ring", || {
            log.lock().unwrap().len() >= 4
        });
        std::thread::sleep(RERING * 5);
        drop(relay);
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                doorbell_word(3, 5),
                doorbell_word(3, 5),
                doorbell_word(4, 5),
                doorbell_word(4, 5)
            ]
        );
    }

    #[test]
    fn a_doorbell_rung_right_before_the_stop_still_goes_out() {
        let shadow = Box::new(AtomicU64::new(0));
        let log: Arc<Mutex<Vec<u64>>> = Arc::default();
        for round in 1..=20u16 {
            // SAFETY: `shadow` outlives every relay of the loop.
            let q = unsafe {
                Relayed::new(
                    (&*shadow as *const AtomicU64).cast(),
                    Box::new(Recorder(log.clone())),
                )
            };
            let relay = DoorbellRelay::new(vec![q], "test-relay").unwrap();
            shadow.store(doorbell_word(round, 9), Ordering::Release);
            drop(relay);
            assert_eq!(
                log.lock()
                    .unwrap()
                    .last()
                    .map(|&v| parse_doorbell(v.to_ne_bytes())),
                Some((round, 9)),
                "round {round}"
            );
        }
    }
}
