//! The soft HCA's fabric backend never blocks the engine on a peer that stops taking
//! operations (docs/soft-hca.md, "A peer that stops answering"): real libfabric
//! (tcp;ofi_rxm on `lo`), three endpoints in one process. B is never progressed (a stalled
//! process, or one behind a link that went down), C is progressed by a thread (a healthy
//! peer), A is the backend under test, driven by hand as the engine drives it.
//! A missing libfabric is a failure, not a skip.

mod fabric_lo;

use rshmem::fabric::{Endpoint, MemoryRegion};
use rshmem::mlx5::Syndrome;
use rshmem::softhca::backend::{Gather, LocalBuf};
use rshmem::softhca::{Backend, FabricBackend, FabricPeer, Op};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_millis(2000);

fn peer(addr: rshmem::fabric::PeerAddr, mr: &Arc<MemoryRegion>, rkey: u32) -> FabricPeer {
    FabricPeer {
        addr,
        region: mr.remote(),
        vbase: 0x10_0000_0000,
        rkey,
        len: MIB as u64,
    }
}

/// One 8-byte READ from B (into the end of a's region `la`) while B is progressed by hand,
/// so that rxm's connection to B is up; B is not progressed afterwards.
fn connect_by_hand(a: &mut FabricBackend, b: &mut Endpoint, la: &MemoryRegion, pb: &FabricPeer) {
    const WARM: u64 = 1 << 41;
    let warm = [LocalBuf {
        // SAFETY: inside a's region.
        ptr: unsafe { la.as_ptr().add(MIB - 16) },
        len: 8,
    }];
    let op = Op::Read {
        raddr: pb.vbase,
        rkey: pb.rkey,
        len: 8,
        dst: &warm,
    };
    assert!(a.execute(pb, &mut (), WARM, &op).is_none());
    let mut warmed = None;
    let (t, mut evs) = (Instant::now(), Vec::new());
    while warmed.is_none() {
        a.poll(&mut |t, s| {
            assert_eq!(t, WARM);
            warmed = Some(s);
        });
        b.poll_into(&mut evs).expect("poll b");
        assert!(t.elapsed() < TIMEOUT, "B never answered while progressed");
    }
    assert_eq!(warmed, Some(Ok(())));
}

#[test]
fn a_stalled_peer_neither_blocks_the_engine_nor_starves_the_others() {
    let (fabric, mut a) = fabric_lo::backend_on_lo(TIMEOUT);
    let la = a.domain().alloc(MIB).expect("register a's buffer");
    a.regions().lock().unwrap().push(la.clone());

    // B: an endpoint nobody progresses.
    let db = fabric.domain().expect("domain b");
    let mut b = Endpoint::new(&db).expect("endpoint b");
    let mb = db.alloc(MIB).expect("register b");
    // C: progressed by a thread.
    let dc = fabric.domain().expect("domain c");
    let mut c = Endpoint::new(&dc).expect("endpoint c");
    let mc = dc.alloc(MIB).expect("register c");
    let to_b = a.insert_peer(b.name()).expect("a knows b");
    let to_c = a.insert_peer(c.name()).expect("a knows c");
    b.insert_peer(&a.name()).expect("b knows a");
    c.insert_peer(&a.name()).expect("c knows a");
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let c_thread = std::thread::spawn(move || {
        let mut out = Vec::new();
        while !st.load(Ordering::Relaxed) {
            out.clear();
            c.poll_into(&mut out).expect("poll c");
        }
    });
    let (pb, pc) = (peer(to_b, &mb, 7), peer(to_c, &mc, 9));
    let mut got: BTreeMap<u64, Result<(), Syndrome>> = BTreeMap::new();

    // 0. B's connection up; from then on B never runs again: posts to it are accepted and
    //    never answered, as with a peer process that stopped (or whose link went down).
    connect_by_hand(&mut a, &mut b, &la, &pb);

    // 1. More 8-byte READs to B than B may hold in flight: every execute returns at once
    //    (asynchronous), the ones past B's share wait in B's queue. The old backend waited
    //    here, in the engine thread, up to the fabric timeout for a free slot.
    let cap = a.peer_cap();
    let n = cap + 40;
    eprintln!("B's share: {cap} posts in flight; posting {n} reads");
    let t0 = Instant::now();
    for k in 0..n {
        let dst = [LocalBuf {
            // SAFETY: inside a's 1 MiB region (8 * n bytes, n <= 1064).
            ptr: unsafe { la.as_ptr().add(8 * k) },
            len: 8,
        }];
        let op = Op::Read {
            raddr: pb.vbase + 8 * k as u64,
            rkey: pb.rkey,
            len: 8,
            dst: &dst,
        };
        assert!(
            a.execute(&pb, &mut (), k as u64, &op).is_none(),
            "read {k} to B completed synchronously"
        );
    }
    let posting = t0.elapsed();
    assert!(
        posting < TIMEOUT,
        "posting {n} reads to a stalled peer took {posting:?}: the backend waited for it"
    );
    assert!(a.waiting() >= 40, "{} posts waiting", a.waiting());

    // 2. C is served meanwhile: an inline WRITE and a READ of it back complete, in order.
    let word = 0x0123_4567_89ab_cdefu64.to_le_bytes();
    let w = Op::Write {
        raddr: pc.vbase + 64,
        rkey: pc.rkey,
        len: 8,
        src: Gather::Inline(&word),
    };
    let back = [LocalBuf {
        // SAFETY: inside a's region, past the reads' words.
        ptr: unsafe { la.as_ptr().add(MIB - 8) },
        len: 8,
    }];
    let r = Op::Read {
        raddr: pc.vbase + 64,
        rkey: pc.rkey,
        len: 8,
        dst: &back,
    };
    const W: u64 = 1 << 40;
    const R: u64 = W + 1;
    assert!(a.execute(&pc, &mut (), W, &w).is_none());
    assert!(a.execute(&pc, &mut (), R, &r).is_none());
    let t1 = Instant::now();
    while !(got.contains_key(&W) && got.contains_key(&R)) {
        a.poll(&mut |t, s| {
            assert!(got.insert(t, s).is_none(), "token {t} reported twice");
        });
        assert!(
            t1.elapsed() < TIMEOUT,
            "C's operations did not complete while B stalled (got {got:?})"
        );
    }
    let served = t1.elapsed();
    assert_eq!(got[&W], Ok(()));
    assert_eq!(got[&R], Ok(()));
    assert_eq!(la.to_vec(MIB - 8, 8).unwrap(), word);
    assert_eq!(mc.to_vec(64, 8).unwrap(), word);
    let still_waiting = a.waiting();
    assert!(
        still_waiting >= 40,
        "B's queue drained ({still_waiting} waiting): B was not stalled, the test shows nothing"
    );

    // 3. B took nothing for the timeout: every queued READ completes with
    //    TRANSPORT_RETRY_EXC, each once and in order; the ones posted stay in flight.
    let t2 = Instant::now();
    while a.waiting() > 0 {
        a.poll(&mut |t, s| {
            assert!(got.insert(t, s).is_none(), "token {t} reported twice");
        });
        assert!(
            t2.elapsed() < TIMEOUT + Duration::from_secs(3),
            "{} posts still waiting past the timeout",
            a.waiting()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let failed: Vec<u64> = got.keys().copied().filter(|&t| t < W).collect();
    assert!(n - still_waiting <= cap, "B held more than its share");
    assert_eq!(failed.len(), still_waiting, "{got:?}");
    let first = n - still_waiting;
    assert_eq!(
        failed,
        (first as u64..n as u64).collect::<Vec<_>>(),
        "the queued reads, in order"
    );
    for t in &failed {
        assert_eq!(got[t], Err(Syndrome::TransportRetryExc), "token {t}");
    }
    assert_eq!(a.in_flight(), first, "the posted reads stay in flight");
    eprintln!(
        "posted {n} reads to B in {posting:?} ({first} in flight, {} queued); C served in \
         {served:?}; the queued reads failed with TRANSPORT_RETRY_EXC {:?} later",
        failed.len(),
        t2.elapsed()
    );
    stop.store(true, Ordering::Relaxed);
    c_thread.join().unwrap();
}

/// Eager confirmation (every write confirmed by a flush READ as soon as it completes
/// locally) with more small inline writes at once than there are bounce slots (256): the
/// writes are posted while the peer is not progressed yet (rxm still connecting), so they
/// all complete locally together. Each is confirmed and lands. Before flush READs had a
/// landing word of their own, the writes held every bounce slot while they waited for
/// their flush, the flush needed a slot, and nothing was ever confirmed.
#[test]
fn more_inline_writes_than_bounce_slots_are_all_confirmed() {
    let (fabric, mut a) = fabric_lo::backend_on_lo(TIMEOUT);
    assert!(
        a.confirms_with_reads(),
        "tcp;ofi_rxm confirms with flush READs"
    );
    let db = fabric.domain().expect("domain b");
    let mut b = Endpoint::new(&db).expect("endpoint b");
    let mb = db.alloc(MIB).expect("register b");
    let to_b = a.insert_peer(b.name()).expect("a knows b");
    b.insert_peer(&a.name()).expect("b knows a");
    let pb = peer(to_b, &mb, 7);
    const N: usize = 300;
    let word = |k: usize| (0x5eed_0000_0000_0000u64 | k as u64).to_le_bytes();
    for k in 0..N {
        let w = word(k);
        let op = Op::Write {
            raddr: pb.vbase + 8 * k as u64,
            rkey: pb.rkey,
            len: 8,
            src: Gather::Inline(&w),
        };
        assert!(
            a.execute(&pb, &mut (), k as u64, &op).is_none(),
            "write {k} to B completed synchronously"
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let b_thread = std::thread::spawn(move || {
        let mut out = Vec::new();
        while !st.load(Ordering::Relaxed) {
            out.clear();
            b.poll_into(&mut out).expect("poll b");
        }
    });
    let mut got: BTreeMap<u64, Result<(), Syndrome>> = BTreeMap::new();
    let t = Instant::now();
    while got.len() < N {
        a.poll(&mut |t, s| assert!(got.insert(t, s).is_none(), "token {t} reported twice"));
        // A deadlock detector only (a write the backend timed out fails the check after
        // the loop): generous, for a loaded machine.
        if t.elapsed() > 5 * TIMEOUT {
            stop.store(true, Ordering::Relaxed);
            panic!(
                "{} of {N} writes confirmed within {:?} ({} in flight, {} waiting)",
                got.len(),
                5 * TIMEOUT,
                a.in_flight(),
                a.waiting()
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    b_thread.join().unwrap();
    assert!(got.values().all(|s| s.is_ok()), "{got:?}");
    for k in 0..N {
        assert_eq!(mb.to_vec(8 * k, 8).unwrap(), word(k), "word {k}");
    }
}

/// A peer that is slow but keeps making progress (it is progressed only in bursts, 0.9 s
/// apart) with four peer-shares of READs queued: the last ones stay queued past the 2 s
/// timeout, yet each completes, because the timeout counts from the peer's last
/// progress. Before, a post failed with TRANSPORT_RETRY_EXC once it had been
/// queued for the timeout, however busy and healthy the peer.
#[test]
fn a_slow_peer_that_progresses_is_not_timed_out() {
    let (fabric, mut a) = fabric_lo::backend_on_lo(TIMEOUT);
    let la = a.domain().alloc(MIB).expect("register a's buffer");
    a.regions().lock().unwrap().push(la.clone());
    let db = fabric.domain().expect("domain b");
    let mut b = Endpoint::new(&db).expect("endpoint b");
    let mb = db.alloc(MIB).expect("register b");
    let words: Vec<u8> = (0..MIB / 8)
        .flat_map(|k| (k as u64 * 3).to_le_bytes())
        .collect();
    mb.write(0, &words).expect("fill b");
    let to_b = a.insert_peer(b.name()).expect("a knows b");
    b.insert_peer(&a.name()).expect("b knows a");
    let pb = peer(to_b, &mb, 7);
    connect_by_hand(&mut a, &mut b, &la, &pb);
    let cap = a.peer_cap();
    // A burst completes about a peer-share and a bit (rxm takes the posts that follow in
    // the same burst): four shares keep posts waiting past the timeout.
    let n = 4 * cap + 40;
    for k in 0..n {
        let dst = [LocalBuf {
            // SAFETY: inside a's 1 MiB region (8 * n bytes, n <= 2088).
            ptr: unsafe { la.as_ptr().add(8 * k) },
            len: 8,
        }];
        let op = Op::Read {
            raddr: pb.vbase + 8 * k as u64,
            rkey: pb.rkey,
            len: 8,
            dst: &dst,
        };
        assert!(a.execute(&pb, &mut (), k as u64, &op).is_none());
    }
    assert!(a.waiting() >= cap, "{} posts waiting", a.waiting());
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let b_thread = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut bursts = 0;
        while !st.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(900));
            let burst = Instant::now();
            while burst.elapsed() < Duration::from_millis(2) {
                out.clear();
                b.poll_into(&mut out).expect("poll b");
            }
            bursts += 1;
        }
        bursts
    });
    let mut got: BTreeMap<u64, Result<(), Syndrome>> = BTreeMap::new();
    let t = Instant::now();
    let mut last_waiting = Duration::ZERO;
    // The cap only ends a failing run: a burst preempted on a loaded machine serves less,
    // so a passing run may need twice its usual 4 bursts or more.
    while got.len() < n && t.elapsed() < 15 * TIMEOUT {
        a.poll(&mut |t, s| assert!(got.insert(t, s).is_none(), "token {t} reported twice"));
        if a.waiting() > 0 {
            last_waiting = t.elapsed();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let bursts = b_thread.join().unwrap();
    let failed: Vec<(&u64, &Result<(), Syndrome>)> =
        got.iter().filter(|(_, s)| s.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} failed, first {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(
        got.len(),
        n,
        "{} of {n} reads completed in {took:?}",
        got.len()
    );
    // The test shows something only if reads were still queued past the timeout.
    assert!(
        last_waiting > TIMEOUT,
        "no read queued past {TIMEOUT:?} (last at {last_waiting:?}; all done in {took:?}, \
         {bursts} bursts)"
    );
    assert_eq!(la.to_vec(0, 8 * n).unwrap(), words[..8 * n]);
}

/// Two busy peers (B and D: progressed in bursts 0.9 s apart, four shares of READs queued
/// each) fill every slot between them; a third, healthy peer C then posts READs with
/// nothing in flight. While posts wait, the slots are shared by the three active peers, so
/// the slots B and D free at their bursts reach C, and C's reads complete. Before, a
/// freed slot went to whichever peer was retried first (hash order, fixed for a run): in
/// about a third of the runs B and D took them all, and C's reads failed with
/// TRANSPORT_RETRY_EXC after the timeout. The share itself is checked exactly.
#[test]
fn busy_peers_share_the_slots_with_a_peer_that_waits() {
    let (fabric, mut a) = fabric_lo::backend_on_lo(TIMEOUT);
    let la = a.domain().alloc(4 * MIB).expect("register a's buffer");
    a.regions().lock().unwrap().push(la.clone());
    let slots = 2 * a.peer_cap();
    let mut ends = Vec::new();
    let mut peers = Vec::new();
    for (i, rkey) in [(0usize, 7u32), (1, 8), (2, 9)] {
        let d = fabric.domain().expect("domain");
        let mut e = Endpoint::new(&d).expect("endpoint");
        let m = d.alloc(MIB).expect("register");
        let to = a.insert_peer(e.name()).expect("a knows it");
        e.insert_peer(&a.name()).expect("it knows a");
        peers.push(peer(to, &m, rkey));
        ends.push((i, e, m));
    }
    let (_, mut c, _mc) = ends.pop().unwrap();
    let (_, mut d, _md) = ends.pop().unwrap();
    let (_, mut b, _mb) = ends.pop().unwrap();
    let (pb, pd, pc) = (peers[0], peers[1], peers[2]);
    connect_by_hand(&mut a, &mut b, &la, &pb);
    connect_by_hand(&mut a, &mut d, &la, &pd);
    let cap = a.peer_cap();
    let read = |a: &mut FabricBackend, p: &FabricPeer, token: u64, slot: usize| {
        let dst = [LocalBuf {
            // SAFETY: inside a's 4 MiB region (8 * slot bytes, slot < 3 * 4 * 1024).
            ptr: unsafe { la.as_ptr().add(8 * slot) },
            len: 8,
        }];
        let op = Op::Read {
            raddr: p.vbase + 8 * (slot as u64 % 1024),
            rkey: p.rkey,
            len: 8,
            dst: &dst,
        };
        assert!(a.execute(p, &mut (), token, &op).is_none());
    };
    let n = 4 * cap;
    for k in 0..n {
        read(&mut a, &pb, k as u64, k);
        read(&mut a, &pd, (n + k) as u64, n + k);
    }
    assert_eq!(
        a.in_flight() - a.waiting(),
        slots,
        "B and D hold every slot (posted, not queued)"
    );
    const C0: u64 = 1 << 40;
    const NC: usize = 40;
    for k in 0..NC {
        read(&mut a, &pc, C0 + k as u64, 2 * n + k);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let c_thread = std::thread::spawn(move || {
        let mut out = Vec::new();
        while !st.load(Ordering::Relaxed) {
            out.clear();
            c.poll_into(&mut out).expect("poll c");
        }
    });
    let st = stop.clone();
    let bursts = std::thread::spawn(move || {
        let mut out = Vec::new();
        while !st.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(900));
            for e in [&mut b, &mut d] {
                let burst = Instant::now();
                while burst.elapsed() < Duration::from_millis(2) {
                    out.clear();
                    e.poll_into(&mut out).expect("poll b/d");
                }
            }
        }
    });
    let mut got: BTreeMap<u64, Result<(), Syndrome>> = BTreeMap::new();
    let t = Instant::now();
    let mut shared = 0;
    let c_done = |g: &BTreeMap<u64, Result<(), Syndrome>>| g.range(C0..).count();
    while c_done(&got) < NC && t.elapsed() < 5 * TIMEOUT {
        a.poll(&mut |t, s| assert!(got.insert(t, s).is_none(), "token {t} reported twice"));
        if a.waiting() > 0 {
            shared = shared.max(usize::from(a.peer_cap() == slots / 3));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    stop.store(true, Ordering::Relaxed);
    c_thread.join().unwrap();
    bursts.join().unwrap();
    assert_eq!(shared, 1, "the share while three peers were active");
    let c_results: Vec<_> = got.range(C0..).map(|(_, s)| *s).collect();
    assert_eq!(
        c_results,
        vec![Ok(()); NC],
        "C's reads after {:?} ({} of B's and D's done)",
        t.elapsed(),
        got.range(..C0).count()
    );
}
