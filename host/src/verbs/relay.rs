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
//! Why a changed value is never missed: the value is `{BE32(pi << 8), BE32(qpn << 8)}`
//! with the 16-bit producer index `pi`; it could only come back to the value last relayed
//! after producers published 65 536 more WQEBBs, but they cannot get more than `wqe_cnt`
//! (at most 32 768) WQEBBs past what the NIC completed, and the NIC completes nothing past
//! the last doorbell it got. So between two relays the index moves by less than 2^16.
//!
//! Ordering: the producer's doorbell-record store happens before its shadow store
//! (release); the relay loads the shadow with acquire, so the record is visible in host
//! memory (which the NIC reads by DMA, coherently) before the relay's register store. The
//! register store itself is a volatile 8-byte store bracketed by full fences: the first
//! keeps it after the acquire load (and everything before it), the second flushes it out
//! of the CPU's write-combining buffer (the BlueFlame page is mapped write-combining on
//! x86; `mfence` drains WC buffers, as rdma-core's `mmio_flush_writes` does with `sfence`).

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

impl DoorbellRegister for MmioRegister {
    fn store(&mut self, value: u64) {
        // SeqCst fence: the store below stays after the shadow load (acquire) and the
        // doorbell record it published.
        fence(Ordering::SeqCst);
        // SAFETY: valid aligned register (MmioRegister::new's contract); volatile because
        // a device register is not memory the compiler may merge or drop stores to.
        unsafe { std::ptr::write_volatile(self.addr, value) };
        // SeqCst fence (mfence on x86): drains the write-combining buffer so the NIC gets
        // the doorbell now, not when the buffer happens to flush.
        fence(Ordering::SeqCst);
    }
}

/// One relayed queue pair: its shadow word and its register.
pub struct Relayed {
    shadow: *const AtomicU64,
    register: Box<dyn DoorbellRegister>,
    last: u64,
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
        }
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
        true
    }
}

/// Idle rounds the relay spins before it starts sleeping between rounds.
const SPIN_ROUNDS: u32 = 2048;
/// Its sleep when idle (a doorbell waits at most about this long, plus timer slack).
const IDLE_SLEEP: Duration = Duration::from_micros(20);

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
                let mut idle = 0u32;
                // Relaxed: the flag only ends the loop; Drop joins the thread, which orders
                // everything after.
                while !s.load(Ordering::Relaxed) {
                    let mut n = 0;
                    for q in queues.iter_mut() {
                        n += q.poll() as u64;
                    }
                    if n > 0 {
                        // Relaxed: a statistic.
                        r.fetch_add(n, Ordering::Relaxed);
                        idle = 0;
                    } else if idle < SPIN_ROUNDS {
                        idle += 1;
                        std::hint::spin_loop();
                    } else {
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
        self.stop.store(true, Ordering::Relaxed);
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
        wait_for("queue 2's doorbell", || logs[2].lock().unwrap().len() == 1);
        drop(relay);
        assert_eq!(
            *logs[1].lock().unwrap(),
            (1..=5)
                .map(|pi| doorbell_word(pi, 0x42))
                .collect::<Vec<_>>()
        );
        assert_eq!(*logs[2].lock().unwrap(), vec![doorbell_word(7, 0x43)]);
        assert!(
            logs[0].lock().unwrap().is_empty(),
            "an unrung queue is left alone"
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
