//! Bootstrap collectives with several PEs as threads of this process, against a Root
//! hosted in the same process. Payloads encode their origin and are checked exactly.
use rshmem::bootstrap::{Bootstrap, Group, JoinParams, Root};
use rshmem::Error;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const TOKEN: &str = "test-token";
const TIMEOUT: Duration = Duration::from_secs(5);

fn params(addr: &str, rank: usize, n: usize) -> JoinParams {
    JoinParams {
        rank,
        world_size: n,
        root_addr: addr.to_string(),
        token: TOKEN.to_string(),
        node_id: format!("node{}", rank / 4),
        timeout: TIMEOUT,
    }
}

/// Starts a root for `n` PEs and runs `f(bootstrap)` on one thread per PE.
fn run_job<T, F>(n: usize, f: F) -> (Root, Vec<T>)
where
    T: Send + 'static,
    F: Fn(Bootstrap) -> T + Send + Sync + 'static,
{
    run_job_within(n, TIMEOUT, f)
}

/// [`run_job`] with every PE's bootstrap timeout `timeout`.
fn run_job_within<T, F>(n: usize, timeout: Duration, f: F) -> (Root, Vec<T>)
where
    T: Send + 'static,
    F: Fn(Bootstrap) -> T + Send + Sync + 'static,
{
    let root = Root::bind("127.0.0.1:0", n, TOKEN).expect("bind root");
    let addr = root.local_addr().to_string();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let f = f.clone();
            let mut p = params(&addr, rank, n);
            p.timeout = timeout;
            thread::spawn(move || f(Bootstrap::join(&p).expect("join")))
        })
        .collect();
    let out = handles
        .into_iter()
        .map(|h| h.join().expect("PE thread panicked"))
        .collect();
    (root, out)
}

/// PE `rank`'s allgather payload for round `round`: its length and bytes depend on both.
fn payload(rank: usize, round: usize) -> Vec<u8> {
    let len = (rank * 7 + round) % 23;
    (0..len)
        .map(|i| (rank as u8).wrapping_mul(31) ^ (round as u8) ^ i as u8)
        .collect()
}

fn world_job(n: usize) {
    let (root, results) = run_job(n, move |b| {
        let rank = b.rank();
        assert_eq!(b.world_size(), n);
        let world = Group::world(n);
        let got = b.allgather(&world, &payload(rank, 0)).unwrap();
        let want: Vec<Vec<u8>> = (0..n).map(|r| payload(r, 0)).collect();
        assert_eq!(got, want);
        let bc = b
            .broadcast(&world, n - 1, format!("from {rank}").as_bytes())
            .unwrap();
        assert_eq!(bc, format!("from {}", n - 1).into_bytes());
        b.barrier(&world).unwrap();
        let out = (b.job_id().to_string(), b.node_ids().to_vec());
        b.finalize().unwrap();
        out
    });
    let want_nodes: Vec<String> = (0..n).map(|r| format!("node{}", r / 4)).collect();
    assert_eq!(root.job_id().len(), 16);
    assert!(root.job_id().chars().all(|c| c.is_ascii_hexdigit()));
    for (job_id, nodes) in results {
        assert_eq!(job_id, root.job_id());
        assert_eq!(nodes, want_nodes);
    }
    assert_eq!(root.joined(), n);
}

#[test]
fn world_of_1() {
    world_job(1);
}

#[test]
fn world_of_2() {
    world_job(2);
}

#[test]
fn world_of_3() {
    world_job(3);
}

#[test]
fn world_of_8() {
    world_job(8);
}

#[test]
fn world_of_13() {
    world_job(13);
}

#[test]
fn startup_of_8_pes() {
    let t0 = Instant::now();
    let (_root, times) = run_job(8, move |b| {
        let t = t0.elapsed();
        b.finalize().unwrap();
        t
    });
    let slowest = times.iter().max().copied().unwrap_or_default();
    // Printed, not asserted: machines differ.
    println!("startup of 8 PEs (bind + join + welcome): {slowest:?}");
}

#[test]
fn team_order_and_two_groups_in_flight() {
    let n = 6;
    let (_root, _) = run_job(n, move |b| {
        let rank = b.rank();
        let world = Group::world(n);
        // Members listed in team order, not rank order: results follow that order.
        let evens = Group {
            uid: 1,
            members: vec![4, 0, 2],
        };
        let odds = Group {
            uid: 2,
            members: vec![1, 3, 5],
        };
        let mine = if rank % 2 == 0 { &evens } else { &odds };
        for round in 0..50 {
            let got = b.allgather(mine, &payload(rank, round)).unwrap();
            let want: Vec<Vec<u8>> = mine
                .members
                .iter()
                .map(|&m| payload(m as usize, round))
                .collect();
            assert_eq!(got, want, "rank {rank} round {round}");
            if round % 10 == 0 {
                let got = b.allgather(&world, &[rank as u8, round as u8]).unwrap();
                let want: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8, round as u8]).collect();
                assert_eq!(got, want);
            }
        }
        // Broadcast within a subgroup from its second member.
        let got = b.broadcast(mine, 1, &[rank as u8; 3]).unwrap();
        assert_eq!(got, vec![mine.members[1] as u8; 3]);
        b.finalize().unwrap();
    });
}

#[test]
fn thousand_barriers() {
    let n = 4;
    let t0 = Instant::now();
    let (_root, _) = run_job(n, move |b| {
        let world = Group::world(n);
        for _ in 0..1000 {
            b.barrier(&world).unwrap();
        }
        // The counters stayed in step: a final allgather still matches exactly.
        let got = b.allgather(&world, &[b.rank() as u8]).unwrap();
        assert_eq!(got, (0..n as u8).map(|r| vec![r]).collect::<Vec<_>>());
        b.finalize().unwrap();
    });
    println!("1000 barriers on 4 PEs: {:?}", t0.elapsed());
}

#[test]
fn large_and_empty_payloads() {
    let n = 3;
    let (_root, _) = run_job(n, move |b| {
        let rank = b.rank();
        let world = Group::world(n);
        let big = |r: usize| vec![r as u8 + 1; if r == 1 { 0 } else { 1 << 20 }];
        let got = b.allgather(&world, &big(rank)).unwrap();
        assert_eq!(got, (0..n).map(big).collect::<Vec<_>>());
        b.finalize().unwrap();
    });
}

#[test]
fn mismatched_members_fail_on_every_member() {
    let n = 2;
    let (_root, results) = run_job(n, move |b| {
        let members = if b.rank() == 0 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        let g = Group { uid: 7, members };
        let r = b.allgather(&g, b"x");
        b.finalize().unwrap();
        r
    });
    for r in results {
        match r {
            Err(Error::CollectiveMismatch { op, detail }) => {
                assert_eq!(op, "allgather");
                assert!(
                    detail.contains("[0, 1]") && detail.contains("[1, 0]"),
                    "{detail}"
                );
            }
            other => panic!("expected CollectiveMismatch, got {other:?}"),
        }
    }
}

/// Tagged allgathers pair only with the same tag: a member in one kind of call (a team's
/// barrier) and another in a different one (its destroy) both fail, naming both, instead
/// of passing each other's call; the same tag pairs as usual.
#[test]
fn allgathers_with_different_tags_fail_on_every_member() {
    let n = 2;
    let (_root, results) = run_job(n, move |b| {
        let g = Group::world(n);
        let tag = if b.rank() == 0 {
            *b"barrier\0"
        } else {
            *b"destroy\0"
        };
        let r = b.allgather_tagged(&g, tag, b"x", TIMEOUT);
        let same = b.allgather_tagged(&g, *b"destroy\0", &[b.rank() as u8], TIMEOUT);
        b.finalize().unwrap();
        (r, same)
    });
    for (r, same) in results {
        match r {
            Err(Error::CollectiveMismatch { op, detail }) => {
                assert_eq!(op, "allgather");
                assert!(
                    detail.contains("allgather(\"barrier\")")
                        && detail.contains("allgather(\"destroy\")"),
                    "{detail}"
                );
            }
            other => panic!("expected CollectiveMismatch, got {other:?}"),
        }
        assert_eq!(same.unwrap(), vec![vec![0u8], vec![1u8]]);
    }
}

#[test]
fn mismatched_ops_fail() {
    let n = 2;
    let (_root, results) = run_job(n, move |b| {
        let world = Group::world(n);
        let r = if b.rank() == 0 {
            b.barrier(&world).map(|_| ())
        } else {
            b.broadcast(&world, 0, b"y").map(|_| ())
        };
        b.finalize().unwrap();
        r
    });
    for r in results {
        assert!(
            matches!(r, Err(Error::CollectiveMismatch { .. })),
            "expected CollectiveMismatch, got {r:?}"
        );
    }
}

#[test]
fn invalid_groups_are_rejected_locally() {
    let n = 3;
    let (_root, _) = run_job(n, move |b| {
        let rank = b.rank() as u32;
        let not_me = Group {
            uid: 9,
            members: (0..n as u32).filter(|&m| m != rank).collect(),
        };
        assert!(matches!(
            b.allgather(&not_me, b"z"),
            Err(Error::InvalidArgument(_))
        ));
        let dup = Group {
            uid: 9,
            members: vec![rank, rank],
        };
        assert!(matches!(b.barrier(&dup), Err(Error::InvalidArgument(_))));
        let outside = Group {
            uid: 9,
            members: vec![rank, 99],
        };
        assert!(matches!(
            b.barrier(&outside),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            b.broadcast(&Group::world(n), n, b""),
            Err(Error::InvalidArgument(_))
        ));
        // The rejected calls counted on group 9 (as a member's call elsewhere would), and
        // the group still works.
        let solo = Group {
            uid: 9,
            members: vec![rank],
        };
        assert_eq!(b.allgather(&solo, b"ok").unwrap(), vec![b"ok".to_vec()]);
        b.finalize().unwrap();
    });
}

/// A call refused on one PE only (its payload over the frame limit) still counts there,
/// so the next call of each PE is paired with the other's next: before 2026-12-07 PE 0's
/// next allgather was paired with PE 1's first, and returned its stale data.
#[test]
fn a_call_refused_on_one_pe_only_leaves_the_group_in_step() {
    let n = 2;
    let both = Arc::new(std::sync::Barrier::new(n));
    run_job_within(n, Duration::from_secs(1), move |b| {
        let (rank, world) = (b.rank(), Group::world(n));
        if rank == 0 {
            let big = vec![0u8; 64 << 20];
            let e = b.allgather(&world, &big).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        } else {
            let e = b.allgather(&world, b"stale").unwrap_err();
            assert!(matches!(e, Error::Timeout { .. }), "{e}");
        }
        // PE 1's first call has timed out before either makes the next.
        both.wait();
        let got = b.allgather(&world, format!("fresh{rank}").as_bytes());
        let want = vec![b"fresh0".to_vec(), b"fresh1".to_vec()];
        assert_eq!(got.expect("second allgather"), want, "PE {rank}");
        b.finalize().unwrap();
    });
}

/// The reply to a call that timed out comes later (the other member made the call after
/// all) and is dropped, not held until the PE leaves (before 2026-12-07 each such reply
/// stayed in the PE's inbox, up to a frame's 64 MiB).
#[test]
fn a_late_reply_to_a_call_that_timed_out_is_not_kept() {
    let n = 2;
    let both = Arc::new(std::sync::Barrier::new(n));
    run_job_within(n, Duration::from_secs(1), move |b| {
        let (rank, world) = (b.rank(), Group::world(n));
        if rank == 1 {
            let e = b.allgather(&world, b"early").unwrap_err();
            assert!(matches!(e, Error::Timeout { .. }), "{e}");
        }
        both.wait();
        if rank == 0 {
            // Pairs with PE 1's call #0, which PE 1 gave up on.
            assert_eq!(
                b.allgather(&world, b"late").unwrap(),
                vec![b"late".to_vec(), b"early".to_vec()]
            );
        }
        // The replies come in order: once this one is here, the late one came.
        b.barrier(&world).expect("barrier");
        assert_eq!(b.held_replies(), 0, "PE {rank}");
        b.finalize().unwrap();
    });
}

/// An allgather whose result cannot fit a frame fails on every member as soon as the
/// parts that came say so: PEs 0 and 1 (40 MiB each, more than the 64 MiB limit
/// together) get the error before PE 2 makes the call, and PE 2 gets it on arrival.
/// Before 2026-12-07 the root held every part until the last came, so PEs 0 and 1 waited
/// for PE 2 (here: until their timeout).
#[test]
fn an_allgather_too_large_for_a_frame_fails_before_the_last_part() {
    let n = 3;
    let both = Arc::new(std::sync::Barrier::new(n));
    let (_root, results) = run_job(n, move |b| {
        let world = Group::world(n);
        let rank = b.rank();
        let big = vec![rank as u8; 40 << 20];
        let r = if rank < 2 {
            let r = b.allgather(&world, &big);
            both.wait();
            r
        } else {
            both.wait();
            b.allgather(&world, &big)
        };
        b.finalize().unwrap();
        r.map(|_| ()).map_err(|e| e.to_string())
    });
    for (rank, r) in results.into_iter().enumerate() {
        let e = r.expect_err("too large");
        assert!(
            e.contains("more than the bootstrap's 67108864-byte frame limit"),
            "PE {rank}: {e}"
        );
    }
}

/// A port that is free now and outside the kernel's ephemeral range, so that neither
/// another test's `bind(:0)` nor an outgoing connection's source port takes it between
/// its release and the root's bind (a released ephemeral port did get taken in CI:
/// AddrInUse).
fn free_port_below_ephemeral_range() -> u16 {
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    assert!(low > 11000, "ephemeral range starts at {low}");
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
    (0..1000u32)
        .map(|i| 10000 + (seed.wrapping_add(i.wrapping_mul(7919))) % (low - 10000))
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p as u16)).is_ok())
        .expect("a free port below the ephemeral range") as u16
}

#[test]
fn pes_may_start_before_the_root() {
    // Reserve a free port, release it, and start the PEs before the root binds it.
    let port = free_port_below_ephemeral_range();
    let addr = format!("127.0.0.1:{port}");
    let n = 3;
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let p = params(&addr, rank, n);
            thread::spawn(move || {
                let b = Bootstrap::join(&p)?;
                let got = b.allgather(&Group::world(n), &[rank as u8])?;
                b.finalize()?;
                Ok::<_, Error>(got)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let _root = Root::bind(&addr, n, TOKEN).expect("bind root on the reserved port");
    for h in handles {
        let got = h.join().unwrap().unwrap();
        assert_eq!(got, vec![vec![0], vec![1], vec![2]]);
    }
}

/// A root's wait for the PEs to leave names those still connected when it gives up (rank
/// 0's finalize says so instead of taking a second timeout without a word), and nothing
/// once all left.
#[test]
fn wait_all_left_names_the_pes_still_connected() {
    let (root, mut held) = run_job(3, |b| b);
    // PE 1 finalizes; PEs 0 and 2 stay connected.
    let b1 = held.remove(1);
    b1.finalize().unwrap();
    let t0 = Instant::now();
    assert_eq!(root.wait_all_left(Duration::from_millis(200)), vec![0, 2]);
    assert!(t0.elapsed() >= Duration::from_millis(200));
    for b in held {
        b.finalize().unwrap();
    }
    assert_eq!(
        root.wait_all_left(Duration::from_secs(5)),
        Vec::<usize>::new()
    );
}
