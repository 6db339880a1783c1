//! Bootstrap under faults: refused PEs, junk on the root's port, dead PEs, a lost root,
//! join timeouts. Every wait is bounded; the whole file runs in a few seconds.
use rshmem::bootstrap::{Bootstrap, Group, JoinParams, Root};
use rshmem::Error;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const TOKEN: &str = "right-token";

fn params(addr: &str, rank: usize, n: usize, timeout_ms: u64) -> JoinParams {
    JoinParams {
        rank,
        world_size: n,
        root_addr: addr.to_string(),
        token: TOKEN.to_string(),
        node_id: format!("n{rank}"),
        timeout: Duration::from_millis(timeout_ms),
    }
}

/// Reads one frame's type byte and body from a raw connection (test-side decoder).
fn read_raw_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body)?;
    Ok((body[0], body[1..].to_vec()))
}

#[test]
fn wrong_token_is_refused_and_the_job_completes() {
    let n = 2;
    let root = Root::bind("127.0.0.1:0", n, TOKEN).unwrap();
    let addr = root.local_addr().to_string();
    let mut bad = params(&addr, 1, n, 2000);
    bad.token = "wrong-token".into();
    match Bootstrap::join(&bad) {
        Err(Error::Refused { rank, reason }) => {
            assert_eq!(rank, 1);
            assert!(reason.contains("wrong token"), "{reason}");
        }
        Err(e) => panic!("expected Refused, got {e:?}"),
        Ok(_) => panic!("expected Refused, got a bootstrap"),
    }
    // Wrong job size: refused too.
    let bad = params(&addr, 1, 3, 2000);
    assert!(matches!(
        Bootstrap::join(&bad),
        Err(Error::Refused { rank: 1, .. })
    ));

    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let p = params(&addr, rank, n, 5000);
            thread::spawn(move || {
                let b = Bootstrap::join(&p).unwrap();
                let got = b.allgather(&Group::world(n), &[rank as u8 + 10]).unwrap();
                b.finalize().unwrap();
                got
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), vec![vec![10], vec![11]]);
    }
    // The rank is taken now: joining again is refused.
    match Bootstrap::join(&params(&addr, 0, n, 2000)) {
        Err(Error::Refused { rank: 0, reason }) => {
            assert!(reason.contains("already joined"), "{reason}")
        }
        Err(e) => panic!("expected Refused, got {e:?}"),
        Ok(_) => panic!("expected Refused, got a bootstrap"),
    }
}

#[test]
fn junk_on_the_root_port_does_not_disturb_a_job() {
    let n = 3;
    let root = Root::bind("127.0.0.1:0", n, TOKEN).unwrap();
    let addr = root.local_addr();

    // A silent connection, held open while the job runs.
    let mut silent = TcpStream::connect(addr).unwrap();
    // An oversized length prefix, then silence.
    let mut oversized = TcpStream::connect(addr).unwrap();
    oversized.write_all(&u32::MAX.to_le_bytes()).unwrap();
    // A plausible length, then a disconnect in the middle of the frame.
    {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&100u32.to_le_bytes()).unwrap();
        s.write_all(&[1, b'R', b'S']).unwrap();
    }
    // An HTTP request.
    let mut http = TcpStream::connect(addr).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    // A well-formed frame with a bad magic: answered with a refusal frame.
    let mut bad_magic = TcpStream::connect(addr).unwrap();
    let mut body = vec![1u8];
    body.extend_from_slice(b"NOTRSHM\0");
    body.extend_from_slice(&[0u8; 20]);
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    bad_magic.write_all(&frame).unwrap();
    // Random junk, reproducible.
    let mut junk_conns = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..8 {
        let mut s = TcpStream::connect(addr).unwrap();
        let junk: Vec<u8> = (0..200)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let _ = s.write_all(&junk);
        junk_conns.push(s);
    }

    let t0 = Instant::now();
    let a = addr.to_string();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let p = params(&a, rank, n, 5000);
            thread::spawn(move || {
                let b = Bootstrap::join(&p).unwrap();
                for round in 0..200u32 {
                    let got = b
                        .allgather(
                            &Group::world(n),
                            &(rank as u32 * 1000 + round).to_le_bytes(),
                        )
                        .unwrap();
                    let want: Vec<Vec<u8>> = (0..n as u32)
                        .map(|r| (r * 1000 + round).to_le_bytes().to_vec())
                        .collect();
                    assert_eq!(got, want);
                }
                b.finalize().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // The job was not held up by the silent connection's 5 s handshake timeout.
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());

    // The bad magic got a refusal frame (type 2) naming the reason.
    bad_magic
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let (ty, body) = read_raw_frame(&mut bad_magic).unwrap();
    assert_eq!(ty, 2);
    assert!(String::from_utf8_lossy(&body).contains("bad magic"));

    // The root drops the silent and the oversized connections (handshake timeout / limit).
    for s in [&mut silent, &mut oversized] {
        s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        let mut buf = [0u8; 64];
        let start = Instant::now();
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue, // a refusal frame, then the close
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("root did not close a junk connection: {e}"),
            }
        }
        assert!(start.elapsed() < Duration::from_secs(7));
    }
}

/// A connection that trickles its hello a byte at a time is closed once the handshake's
/// time is up (5 s), not when the hello is complete: each read arriving within the read
/// timeout used to keep it open (here 40 bytes at 0.4 s would have taken 16 s; a 64 KiB
/// hello at one byte per 4.9 s, days).
#[test]
fn a_hello_trickled_byte_by_byte_is_cut_at_the_handshake_deadline() {
    let root = Root::bind("127.0.0.1:0", 2, TOKEN).unwrap();
    let mut s = TcpStream::connect(root.local_addr()).unwrap();
    s.write_all(&40u32.to_le_bytes()).unwrap();
    let mut reader = s.try_clone().unwrap();
    let closed = thread::spawn(move || {
        reader
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 64];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return Ok(start.elapsed()),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Ok(start.elapsed())
                }
                Err(e) => return Err(e),
            }
        }
    });
    let mut sent = 0;
    for _ in 0..40 {
        if s.write_all(&[1]).is_err() {
            break;
        }
        sent += 1;
        thread::sleep(Duration::from_millis(400));
        if closed.is_finished() {
            break;
        }
    }
    let after = closed
        .join()
        .unwrap()
        .expect("the root closes the connection");
    assert!(sent < 40, "the whole trickled hello was read ({after:?})");
    assert!(after < Duration::from_secs(12), "closed after {after:?}");
}

#[test]
fn dropped_pe_fails_pending_allgather_with_peer_died() {
    let n = 3;
    let root = Root::bind("127.0.0.1:0", n, TOKEN).unwrap();
    let addr = root.local_addr().to_string();
    let timeout_ms = 5000;
    let joined = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let p = params(&addr, rank, n, timeout_ms);
            let joined = joined.clone();
            thread::spawn(move || {
                let b = Bootstrap::join(&p).unwrap();
                b.barrier(&Group::world(n)).unwrap();
                joined.wait();
                if rank == 2 {
                    thread::sleep(Duration::from_millis(100));
                    drop(b); // no finalize: the root reports PE 2 as dead
                    return None;
                }
                let live = b.liveness();
                let t = Instant::now();
                let r = b.allgather(&Group::world(n), b"never completes");
                let waited = t.elapsed();
                let check = live.check();
                Some((r, check, waited))
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let Some((r, check, waited)) = h.join().unwrap() else {
            continue;
        };
        match r {
            Err(Error::PeerDied { pe, detail }) => {
                assert_eq!(pe, 2, "rank {rank}");
                assert!(detail.contains("without finalize"), "{detail}");
            }
            other => panic!("rank {rank}: expected PeerDied, got {other:?}"),
        }
        assert!(matches!(check, Err(Error::PeerDied { pe: 2, .. })));
        assert!(waited < Duration::from_millis(timeout_ms / 2), "{waited:?}");
    }
}

/// Polls `live` until its dead PEs are `want` (true) or 5 s passed (false).
fn wait_for_dead(live: &rshmem::bootstrap::Liveness, want: &[usize]) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    while live.dead_pes() != want {
        if Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}

#[test]
fn every_death_is_reported_not_only_the_first() {
    // PE 3 dies, the survivors tolerate it, then PE 2 dies: PEs 0 and 1 must hear of both
    // (a PE that tolerates a death goes on, so a later death is news to it).
    let n = 4;
    let root = Root::bind("127.0.0.1:0", n, TOKEN).unwrap();
    let addr = root.local_addr().to_string();
    let first_seen = Arc::new(Barrier::new(3));
    // PEs 0 and 1 leave (their Bootstrap dropped: a death too) only after both looked.
    let both_looked = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let p = params(&addr, rank, n, 5000);
            let first_seen = first_seen.clone();
            let both_looked = both_looked.clone();
            thread::spawn(move || {
                let b = Bootstrap::join(&p).unwrap();
                b.barrier(&Group::world(n)).unwrap();
                if rank == 3 {
                    drop(b); // no finalize: the first death
                    return None;
                }
                let live = b.liveness();
                let saw_first = wait_for_dead(&live, &[3]);
                if rank < 2 {
                    live.tolerate(3).unwrap();
                }
                first_seen.wait();
                if rank == 2 {
                    drop(b); // the second death, after everyone saw the first
                    return Some((saw_first, true, Vec::new(), Ok(())));
                }
                let saw_second = wait_for_dead(&live, &[3, 2]);
                let seen = (saw_first, saw_second, live.dead_pes(), live.check());
                both_looked.wait();
                Some(seen)
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let Some((saw_first, saw_second, dead, check)) = h.join().unwrap() else {
            continue;
        };
        assert!(saw_first, "PE {rank} never heard of PE 3's death");
        if rank == 2 {
            continue;
        }
        assert!(saw_second, "PE {rank}: dead PEs {dead:?}, expected [3, 2]");
        assert_eq!(dead, [3, 2], "PE {rank}");
        // PE 3's death is tolerated, PE 2's is not.
        assert!(
            matches!(check, Err(Error::PeerDied { pe: 2, .. })),
            "PE {rank}: {check:?}"
        );
    }
    assert_eq!(root.first_death().map(|(pe, _)| pe), Some(3));
}

#[test]
fn finalized_pe_is_not_reported_dead() {
    let n = 3;
    let root = Root::bind("127.0.0.1:0", n, TOKEN).unwrap();
    let addr = root.local_addr().to_string();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let p = params(&addr, rank, n, 5000);
            thread::spawn(move || {
                let b = Bootstrap::join(&p).unwrap();
                b.barrier(&Group::world(n)).unwrap();
                if rank == 1 {
                    b.finalize().unwrap();
                    return None;
                }
                // PE 1 has left cleanly; PEs 0 and 2 carry on in their own group.
                let g = Group {
                    uid: 5,
                    members: vec![0, 2],
                };
                thread::sleep(Duration::from_millis(200));
                let mut last = Vec::new();
                for round in 0..20u8 {
                    last = b.allgather(&g, &[rank as u8, round]).unwrap();
                }
                let live = b.liveness().check();
                b.finalize().unwrap();
                Some((last, live))
            })
        })
        .collect();
    for h in handles {
        if let Some((last, live)) = h.join().unwrap() {
            assert_eq!(last, vec![vec![0, 19], vec![2, 19]]);
            assert!(live.is_ok(), "{live:?}");
        }
    }
}

#[test]
fn join_times_out_naming_the_missing_pes() {
    let n = 3;
    let root = Root::bind("127.0.0.1:0", n, TOKEN).unwrap();
    let addr = root.local_addr().to_string();
    // PE 0 waits patiently; PE 1 gives up after 400 ms; PE 2 never comes. (The bounds
    // asserted below leave room for threads descheduled on a loaded machine.)
    let patient = {
        let p = params(&addr, 0, n, 10_000);
        thread::spawn(move || (Instant::now(), Bootstrap::join(&p).map(|_| ())))
    };
    while root.joined() < 1 {
        thread::sleep(Duration::from_millis(5));
    }
    let t0 = Instant::now();
    match Bootstrap::join(&params(&addr, 1, n, 400)) {
        Err(Error::Timeout {
            pe,
            what,
            waited_ms,
        }) => {
            assert_eq!(pe, 1);
            assert!(what.contains("2 of 3 PEs joined"), "{what}");
            assert!(what.contains("missing rank(s) 2"), "{what}");
            assert!((400..5000).contains(&waited_ms), "{waited_ms}");
        }
        Err(e) => panic!("expected Timeout, got {e:?}"),
        Ok(_) => panic!("expected Timeout, got a bootstrap"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5));
    // PE 1 left without finalize: the waiting PE 0 learns it at once, not at its timeout.
    let (t0, r) = patient.join().unwrap();
    match r {
        Err(Error::PeerDied { pe, .. }) => assert_eq!(pe, 1),
        other => panic!("expected PeerDied, got {other:?}"),
    }
    assert!(
        t0.elapsed() < Duration::from_millis(8000),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn join_times_out_when_no_root_listens() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = params(&format!("127.0.0.1:{port}"), 0, 1, 300);
    match Bootstrap::join(&p) {
        Err(Error::Timeout { pe, what, .. }) => {
            assert_eq!(pe, 0);
            assert!(what.contains("accept a connection"), "{what}");
        }
        Err(e) => panic!("expected Timeout, got {e:?}"),
        Ok(_) => panic!("expected Timeout, got a bootstrap"),
    }
}

#[test]
fn collective_times_out_when_a_member_never_calls() {
    let n = 2;
    let root = Root::bind("127.0.0.1:0", n, TOKEN).unwrap();
    let addr = root.local_addr().to_string();
    let done = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            // 2 s: also the join's bound, which a thread descheduled under load must not
            // outlast.
            let p = params(&addr, rank, n, 2000);
            let done = done.clone();
            thread::spawn(move || {
                let b = Bootstrap::join(&p).unwrap();
                let r = if rank == 0 {
                    b.barrier(&Group::world(n)).map(|_| ())
                } else {
                    Ok(())
                };
                done.wait(); // keep PE 1 alive (not dead, just absent) until PE 0 gave up
                r
            })
        })
        .collect();
    let r0 = handles.into_iter().next().unwrap().join().unwrap();
    match r0 {
        Err(Error::Timeout { pe, what, .. }) => {
            assert_eq!(pe, 0);
            assert!(what.contains("barrier on group 0 (call #0"), "{what}");
            assert!(what.contains("[0, 1]"), "{what}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
}

#[test]
fn lost_root_is_reported_as_pe_0() {
    // A fake root that welcomes one PE and then goes away.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let (ty, _) = read_raw_frame(&mut s).unwrap();
        assert_eq!(ty, 1); // hello
        let mut body = vec![3u8]; // welcome
        let job_id = b"0123456789abcdef";
        body.extend_from_slice(&(job_id.len() as u32).to_le_bytes());
        body.extend_from_slice(job_id);
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(b"n0");
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        s.write_all(&frame).unwrap();
        thread::sleep(Duration::from_millis(100));
        // Dropping the stream closes the connection: the root is "lost".
    });
    let b = Bootstrap::join(&params(&addr, 0, 1, 3000)).unwrap();
    assert_eq!(b.job_id(), "0123456789abcdef");
    assert_eq!(b.node_ids(), ["n0".to_string()]);
    let live = b.liveness();
    let r = b.barrier(&Group::world(1));
    fake.join().unwrap();
    match r {
        Err(Error::PeerDied { pe, detail }) => {
            assert_eq!(pe, 0);
            assert!(detail.contains("lost the bootstrap root"), "{detail}");
            assert!(detail.contains(&addr), "{detail}");
        }
        other => panic!("expected PeerDied, got {other:?}"),
    }
    assert!(matches!(live.check(), Err(Error::PeerDied { pe: 0, .. })));
}

/// A root hosted by a PE waits, at that PE's exit, for the PEs still running after a death
/// (they may tolerate it and go on using the root), not only until the first death.
#[test]
fn the_root_waits_for_survivors_after_a_death() {
    let n = 3;
    let root = Root::bind("127.0.0.1:0", n, TOKEN).unwrap();
    let addr = root.local_addr().to_string();
    let died = Arc::new(Barrier::new(3));
    let survivor_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let p = params(&addr, rank, n, 5000);
            let died = died.clone();
            let done = survivor_done.clone();
            thread::spawn(move || {
                let b = Bootstrap::join(&p).unwrap();
                b.barrier(&Group::world(n)).unwrap();
                if rank == 2 {
                    drop(b); // dies without finalize
                    died.wait();
                    return;
                }
                assert!(wait_for_dead(&b.liveness(), &[2]), "PE {rank}");
                died.wait();
                if rank == 1 {
                    // Still working after the death, then leaves.
                    thread::sleep(Duration::from_millis(300));
                    // SeqCst: ordered before the farewell the root waits for.
                    done.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                let _ = b.finalize();
            })
        })
        .collect();
    // Once the root has seen the death (the job is broken for it).
    let end = Instant::now() + Duration::from_secs(5);
    while root.first_death().is_none() {
        assert!(Instant::now() < end, "the root never saw PE 2 die");
        thread::sleep(Duration::from_millis(5));
    }
    root.wait_all_left(Duration::from_secs(20));
    assert!(
        survivor_done.load(std::sync::atomic::Ordering::SeqCst),
        "the root stopped waiting while PE 1 was still running"
    );
    for h in handles {
        h.join().unwrap();
    }
}
