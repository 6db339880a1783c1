//! Every self-test case with PEs as threads of this process, at several PE counts
//! (non-powers of two and more PEs than cores included).
use rshmem::{run_threads, Settings};

#[path = "thread-pes-support/mod.rs"]
mod thread_pes;
use thread_pes::arrive_and_wait;

fn settings() -> Settings {
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.symmetric_size = 16 << 20;
    s.timeout = std::time::Duration::from_secs(20);
    s
}

fn selftest(n: usize) {
    let out = run_threads(n, settings(), |pe| rshmem::selftest::run(pe, &[], |_| {}))
        .expect("job starts");
    let errors: Vec<String> = out
        .iter()
        .enumerate()
        .filter_map(|(rank, r)| match r {
            Ok(cases) if *cases == rshmem::selftest::CASES.len() => None,
            Ok(cases) => Some(format!("PE {rank}: ran {cases} cases")),
            Err(e) => Some(format!("PE {rank}: {e}")),
        })
        .collect();
    assert!(errors.is_empty(), "{n} PEs:\n{}", errors.join("\n"));
}

#[test]
fn selftest_1_pe() {
    selftest(1);
}
#[test]
fn selftest_2_pes() {
    selftest(2);
}
#[test]
fn selftest_3_pes() {
    selftest(3);
}
#[test]
fn selftest_4_pes() {
    selftest(4);
}
#[test]
fn selftest_7_pes_more_than_cores() {
    selftest(7);
}

#[test]
fn wait_timeout_reports_pe_address_comparison_and_last_value() {
    let mut s = settings();
    s.timeout = std::time::Duration::from_millis(300);
    // One PE, so nobody else's waits are bounded by the short timeout too.
    let out = run_threads(1, s, |pe| {
        let flag = pe.calloc::<u64>(2)?;
        pe.atomic_set(flag.at(1), 7u64, pe.my_pe())?;
        let t0 = std::time::Instant::now();
        let e = pe
            .wait_until(flag.at(1), rshmem::Cmp::Eq, 1u64)
            .unwrap_err();
        Ok((Some((e, t0.elapsed())), flag.at(1).offset()))
    })
    .unwrap();
    let (r, offset) = out.into_iter().next().unwrap().unwrap();
    let (e, waited) = r.unwrap();
    match &e {
        rshmem::Error::WaitTimeout {
            pe,
            op,
            offset: o,
            cmp,
            expected,
            last,
            ..
        } => {
            assert_eq!(
                (*pe, *op, *o, *cmp, expected.as_str(), last.as_str()),
                (0, "wait_until", offset, "==", "1", "7")
            );
        }
        other => panic!("wrong error: {other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("PE 0") && msg.contains("last value seen 7"),
        "{msg}"
    );
    assert!(
        waited >= std::time::Duration::from_millis(300),
        "waited {waited:?}"
    );
}

#[test]
fn array_waits_name_the_element_and_refuse_an_empty_set() {
    let mut s = settings();
    s.timeout = std::time::Duration::from_millis(200);
    let out = run_threads(1, s, |pe| {
        let iv = pe.calloc::<u32>(4)?;
        let me = pe.my_pe();
        pe.atomic_set(iv.at(0), 3u32, me)?;
        pe.atomic_set(iv.at(2), 3u32, me)?;
        let eq = rshmem::Cmp::Eq;
        let some = pe.wait_until_some(iv, None, eq, 3)?;
        let any = pe.wait_until_any(iv, Some(&[1, 0, 0, 0]), eq, 3)?;
        let all_out = [1, 1, 1, 1];
        let errs = [
            pe.wait_until_any(iv, Some(&all_out), eq, 3).unwrap_err(),
            pe.wait_until_some(iv, Some(&all_out), eq, 3).unwrap_err(),
            pe.wait_until_all(iv, Some(&[0, 0]), eq, 3).unwrap_err(),
            // [1] is never set: the timeout names it.
            pe.wait_until_all(iv, Some(&[0, 0, 0, 1]), eq, 3)
                .unwrap_err(),
            // [3] holds 0, not its operand 1.
            pe.wait_until_all_vector(iv, None, eq, &[3, 0, 3, 1])
                .unwrap_err(),
        ];
        let empty_all = pe.wait_until_all(iv, Some(&all_out), eq, 3).is_ok();
        Ok((some, any, errs.map(|e| e.to_string()), empty_all))
    })
    .unwrap();
    let (some, any, errs, empty_all) = out.into_iter().next().unwrap().unwrap();
    assert_eq!((some, any, empty_all), (vec![0, 2], 2, true));
    assert!(
        errs[0].contains("wait_until_any: the wait set is empty"),
        "{}",
        errs[0]
    );
    assert!(
        errs[1].contains("wait_until_some: the wait set is empty"),
        "{}",
        errs[1]
    );
    assert!(
        errs[2].contains("wait_until_all: status has 2 entries for 4 variables"),
        "{}",
        errs[2]
    );
    assert!(
        errs[3].contains("wait_until_all") && errs[3].contains("element 1 of 4"),
        "{}",
        errs[3]
    );
    assert!(
        errs[4].contains("wait_until_all_vector")
            && errs[4].contains("element 3 of 4")
            && errs[4].contains("== 1"),
        "{}",
        errs[4]
    );
}

#[test]
fn a_pe_that_leaves_without_finalize_fails_the_others_barrier() {
    let t0 = std::time::Instant::now();
    let out = run_threads(3, settings(), |pe| {
        if pe.my_pe() == 1 {
            // Leave abruptly: the Pe is dropped without finalize.
            return Err(rshmem::Error::Verification("PE 1 leaves on purpose".into()));
        }
        pe.barrier_all()
    })
    .unwrap();
    for r in [0, 2] {
        match &out[r] {
            Err(rshmem::Error::PeerDied { pe: 1, .. }) => {}
            other => panic!("PE {r}: {other:?}"),
        }
    }
    // Pushed by the bootstrap, far inside the 20 s timeout.
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
}

#[test]
fn heap_exhaustion_reports_requested_and_free_bytes() {
    let out = run_threads(2, settings(), |pe| {
        let (free, _) = pe.heap_free();
        let e = pe.malloc(free + 1).unwrap_err();
        let a = pe.malloc(free)?; // exactly the rest still fits
        pe.free(a)?;
        Ok((e, free, pe.heap_size()))
    })
    .unwrap();
    for r in out {
        let (e, free, heap) = r.unwrap();
        // One byte short: the cure names a heap one MiB larger (whole MiB, rounded up).
        let cure = format!(
            "raise RSHMEM_SYMMETRIC_SIZE (now {heap} bytes; with this PE's other allocations \
             this one needs about {}M or more)",
            heap / (1 << 20) + 1
        );
        assert!(e.to_string().ends_with(&cure), "{e}");
        match e {
            rshmem::Error::HeapExhausted {
                requested, free: f, ..
            } => assert_eq!((requested, f), (free + 1, free)),
            other => panic!("{other}"),
        }
    }
}

#[test]
fn freeing_what_is_not_an_allocation_is_refused_and_changes_nothing() {
    let out = run_threads(2, settings(), |pe| {
        let before = pe.heap_free();
        let a = pe.malloc(4096)?;
        let inside = rshmem::SymPtr::<u8>::from_raw(a.offset() + 64, 1);
        let e1 = pe.free(inside).unwrap_err();
        pe.free(a)?;
        let e2 = pe.free(a).unwrap_err(); // twice
        Ok((
            e1.to_string(),
            e2.to_string(),
            a.offset(),
            before,
            pe.heap_free(),
        ))
    })
    .unwrap();
    for r in out {
        let (e1, e2, off, before, after) = r.unwrap();
        assert_eq!(
            e1,
            format!(
                "invalid argument: free: offset {:#x} is not the start of a live symmetric allocation",
                off + 64
            )
        );
        assert_eq!(
            e2,
            format!(
                "invalid argument: free: offset {off:#x} is not the start of a live symmetric allocation"
            )
        );
        // The refused frees lost nothing: the heap is whole again.
        assert_eq!(after, before);
    }
}

/// Collectives on teams whose heaps are all mapped agree through the heap (two record
/// halves used by turns, a sequence number per call): many calls in a row, a mismatch in
/// the middle reported on every member with each member's arguments, and the calls after
/// it in step again — on the world team and on a split team with another slot.
#[test]
fn heap_agreement_stays_in_step_across_calls_and_mismatches() {
    let n = 3;
    let out = run_threads(n, settings(), |pe| {
        let me = pe.my_pe();
        let src = pe.calloc::<u64>(8)?;
        let dst = pe.calloc::<u64>(8 * n)?;
        pe.put(src, &[me as u64 + 1; 8], me)?;
        let odd = pe.team_split_strided(pe.world(), 1, 1, n - 1)?;
        let mut teams = vec![pe.world().clone()];
        teams.extend(odd);
        let mut mismatches = Vec::new();
        for team in &teams {
            let tn = team.n_pes();
            for round in 0..40u64 {
                if round == 17 {
                    // Member 0 of the team asks for one element more than the others.
                    let k = if team.my_pe() == 0 { 3 } else { 2 };
                    match pe.fcollect(team, dst, src, k) {
                        Err(rshmem::Error::CollectiveMismatch { op, detail }) => {
                            mismatches.push((op, detail, tn))
                        }
                        other => panic!("PE {me}: expected a mismatch, got {other:?}"),
                    }
                    continue;
                }
                let root = (round as usize) % tn;
                pe.broadcast(team, dst, src, 4, root)?;
                let mut got = [0u64; 4];
                pe.get(&mut got, dst.slice(0..4), me)?;
                let want = team.world_pe(root).unwrap() as u64 + 1;
                assert_eq!(got, [want; 4], "PE {me} round {round}");
            }
        }
        Ok(mismatches)
    })
    .expect("job starts");
    for (rank, r) in out.into_iter().enumerate() {
        let m = r.unwrap_or_else(|e| panic!("PE {rank}: {e}"));
        assert_eq!(m.len(), if rank == 0 { 1 } else { 2 }, "PE {rank}: {m:?}");
        for (op, detail, tn) in m {
            assert_eq!(op, "fcollect");
            // dest / source counts of member 0 (3 per member) and of the others (2).
            let (a, b) = (
                format!("counts {} / 3", 3 * tn),
                format!("counts {} / 2", 2 * tn),
            );
            assert!(
                detail.contains(&a) && detail.contains(&b),
                "PE {rank}: {detail}"
            );
        }
    }
}

/// A signal word inside put_signal's destination is refused (OpenSHMEM: they must not
/// overlap), whatever part of it overlaps; next to it is fine, and nothing was written.
#[test]
fn put_signal_refuses_a_signal_inside_its_destination() {
    let out = run_threads(2, settings(), |pe| {
        let buf = pe.calloc::<u64>(6)?;
        let peer = 1 - pe.my_pe();
        let mut refused = Vec::new();
        // (first element, elements, signal element): the signal is the last word, the
        // first word, and the last word of a shorter put.
        for (at, n, sig) in [(0, 4, 3), (1, 3, 1), (0, 2, 1)] {
            let dest = buf.slice(at..at + n);
            let r = pe.put_signal(
                dest,
                &[7u64; 4][..n],
                buf.at(sig),
                1,
                rshmem::SignalOp::Set,
                peer,
            );
            match r {
                Err(rshmem::Error::InvalidArgument(m)) => refused.push(m),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        // A u32 view whose last element ends at the signal's first byte: apart.
        let words = buf.cast::<u32>();
        pe.put_signal(
            words.slice(0..8),
            &[9u32; 8],
            buf.at(4),
            5,
            rshmem::SignalOp::Set,
            peer,
        )?;
        pe.barrier_all()?;
        let mut got = [0u64; 6];
        pe.get(&mut got, buf, pe.my_pe())?;
        Ok((refused, got))
    })
    .expect("job starts");
    for (rank, r) in out.into_iter().enumerate() {
        let (refused, got) = r.unwrap_or_else(|e| panic!("PE {rank}: {e}"));
        let nine = 9u64 | 9 << 32;
        assert_eq!(got, [nine, nine, nine, nine, 5, 0], "PE {rank}");
        assert_eq!(refused.len(), 3);
        assert!(
            refused[0].contains("the signal word at ")
                && refused[0].contains("lies inside the destination"),
            "PE {rank}: {refused:?}"
        );
    }
}

/// Two different heap calls whose arguments are equal are a mismatch on every PE, and the
/// heaps stay symmetric: a `free` of the block at 0x10000 on PE 0 met an `align(1, 0x10000)`
/// on PE 1 (both agreed on the words `[0x10000, 1]`), and a `malloc(64)` met a
/// `calloc::<u8>(64)` (both `[64, 16]`, but calloc's barrier put PE 1 one barrier ahead).
/// Before 2026-12-07 both passed and the next allocation came at different offsets.
#[test]
fn different_heap_calls_with_equal_arguments_are_a_mismatch() {
    let out = run_threads(2, settings(), |pe| {
        let me = pe.my_pe();
        let p = pe.malloc(0x1000)?;
        let mut seen = Vec::new();
        let r = if me == 0 {
            pe.free(p).map(|_| ())
        } else {
            pe.align(1, p.offset()).map(|_| ())
        };
        match r {
            Err(rshmem::Error::CollectiveMismatch { op, detail }) => seen.push((op, detail)),
            other => panic!("PE {me}: expected a mismatch, got {other:?}"),
        }
        let r = if me == 0 {
            pe.malloc(64).map(|_| ())
        } else {
            pe.calloc::<u8>(64).map(|_| ())
        };
        match r {
            Err(rshmem::Error::CollectiveMismatch { op, detail }) => seen.push((op, detail)),
            other => panic!("PE {me}: expected a mismatch, got {other:?}"),
        }
        // In step and symmetric: the same offset everywhere, and a barrier pairs.
        let q = pe.malloc(16)?;
        pe.barrier_all()?;
        pe.free(q)?;
        pe.free(p)?;
        Ok((seen, q.offset()))
    })
    .expect("job starts");
    let offsets: Vec<usize> = out
        .iter()
        .map(|r| *r.as_ref().map(|(_, o)| o).unwrap_or(&0))
        .collect();
    for (rank, r) in out.into_iter().enumerate() {
        let (seen, offset) = r.unwrap_or_else(|e| panic!("PE {rank}: {e}"));
        assert_eq!(
            offset, offsets[0],
            "PE {rank}: the next allocation's offsets {offsets:?}"
        );
        let ops: Vec<&str> = seen.iter().map(|(op, _)| *op).collect();
        let want = if rank == 0 {
            ["free", "malloc"]
        } else {
            ["align", "calloc"]
        };
        assert_eq!(ops, want, "PE {rank}");
        assert!(
            seen[0].1.contains("free offset 0x10000 ready true")
                && seen[0].1.contains("malloc size 65536 align 1"),
            "PE {rank}: {}",
            seen[0].1
        );
        assert!(
            seen[1].1.contains("malloc size 64 align 16")
                && seen[1].1.contains("calloc size 64 align 16"),
            "PE {rank}: {}",
            seen[1].1
        );
    }
}

/// An element count whose bytes overflow on one PE only is a mismatch on every PE (it was
/// refused on that PE before the agreement, and the other waited out its timeout); on
/// every PE, the same clear error everywhere. Then in step.
#[test]
fn an_overflowing_count_on_one_pe_fails_the_call_on_every_pe() {
    let mut s = settings();
    s.timeout = std::time::Duration::from_secs(5);
    let out = run_threads(2, s, |pe| {
        let me = pe.my_pe();
        let mut seen = Vec::new();
        let count = if me == 0 { usize::MAX / 4 } else { 4 };
        seen.push(match pe.alloc::<u64>(count) {
            Err(rshmem::Error::CollectiveMismatch { op, detail }) => format!("{op}: {detail}"),
            other => panic!("PE {me}: expected a mismatch, got {other:?}"),
        });
        let keep = pe.calloc::<u64>(4)?;
        let count = if me == 0 { usize::MAX / 2 } else { 4 };
        seen.push(match pe.realloc(keep, count) {
            Err(rshmem::Error::CollectiveMismatch { op, detail }) => format!("{op}: {detail}"),
            other => panic!("PE {me}: expected a mismatch, got {other:?}"),
        });
        seen.push(match pe.calloc::<u32>(usize::MAX / 3) {
            Err(rshmem::Error::InvalidArgument(m)) => m,
            other => panic!("PE {me}: expected an invalid argument, got {other:?}"),
        });
        pe.barrier_all()?;
        pe.free(keep)?;
        Ok(seen)
    })
    .expect("job starts");
    for (rank, r) in out.into_iter().enumerate() {
        let seen = r.unwrap_or_else(|e| panic!("PE {rank}: {e}"));
        assert!(
            seen[0].starts_with("alloc: ")
                && seen[0].contains("malloc size overflowing align 16")
                && seen[0].contains("malloc size 32 align 16"),
            "PE {rank}: {}",
            seen[0]
        );
        assert!(
            seen[1].starts_with("realloc: ")
                && seen[1].contains("bytes overflowing")
                && seen[1].contains("bytes 32"),
            "PE {rank}: {}",
            seen[1]
        );
        assert!(seen[2].contains("overflow"), "PE {rank}: {}", seen[2]);
    }
}

/// A source that overlaps dest is copied before any member writes (fcollect, alltoall and
/// broadcast with source inside dest); a source apart from dest is sent from the heap.
/// Both give exact results.
#[test]
fn collectives_with_source_inside_dest() {
    let n = 3;
    let k = 4;
    let out = run_threads(n, settings(), |pe| {
        let me = pe.my_pe();
        let v = |p: usize, i: usize| (p * 100 + i) as u64 + 1;
        let buf = pe.calloc::<u64>(n * k)?;
        let read = |len: usize| -> rshmem::Result<Vec<u64>> {
            let mut o = vec![0u64; len];
            pe.get(&mut o, buf.slice(0..len), me)?;
            Ok(o)
        };
        // fcollect: the source is dest's first block (written by member 0's block).
        let mine: Vec<u64> = (0..k).map(|i| v(me, i)).collect();
        pe.put(buf.slice(0..k), &mine, me)?;
        pe.fcollect(pe.world(), buf, buf.slice(0..k), k)?;
        let want: Vec<u64> = (0..n).flat_map(|p| (0..k).map(move |i| v(p, i))).collect();
        assert_eq!(read(n * k)?, want, "PE {me}: fcollect in place");
        // alltoall: source == dest.
        let mine: Vec<u64> = (0..n * k).map(|i| v(me, i)).collect();
        pe.put(buf, &mine, me)?;
        pe.alltoall(pe.world(), buf, buf, k)?;
        let want: Vec<u64> = (0..n)
            .flat_map(|p| (0..k).map(move |i| v(p, me * k + i)))
            .collect();
        assert_eq!(read(n * k)?, want, "PE {me}: alltoall in place");
        // broadcast: source == dest on the root.
        let mine: Vec<u64> = (0..k).map(|i| v(me, i)).collect();
        pe.put(buf.slice(0..k), &mine, me)?;
        pe.broadcast(pe.world(), buf.slice(0..k), buf.slice(0..k), k, 2)?;
        assert_eq!(read(k)?, (0..k).map(|i| v(2, i)).collect::<Vec<_>>());
        Ok(())
    })
    .expect("job starts");
    for (rank, r) in out.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("PE {rank}: {e}"));
    }
}

/// A tolerated death (`Pe::tolerate_death`): PE 2 leaves without finalize; PEs 0 and 1
/// tolerate it, then their RMA to each other and a barrier of their own team go on, while
/// RMA to PE 2, a world barrier (which includes it) and the world's bootstrap collectives
/// fail at once naming it (not at the 20 s timeout: the error is `PeerDied`, not
/// `Timeout`). Untolerated, the same death fails everything.
#[test]
fn a_tolerated_death_fails_only_what_involves_the_dead_pe() {
    // Over p2p, the soft HCA's local backend, and its libfabric backend (where the PE
    // threads share one connection, which PE 2 leaving must not break: docs/ep.md "A PE
    // thread that leaves").
    for (transport, fabric) in [
        (rshmem::config::TransportMode::Auto, false),
        (rshmem::config::TransportMode::Proxy, false),
        (rshmem::config::TransportMode::Proxy, true),
    ] {
        let mut s = settings();
        s.transport = transport;
        s.proxy_fabric = fabric;
        tolerated_death(s);
    }
}

fn tolerated_death(s: Settings) {
    use rshmem::Error;
    use std::time::{Duration, Instant};
    let what = format!("{:?}, fabric {}", s.transport, s.proxy_fabric);
    let start = Instant::now();
    // When PE 2 left its closure (ms since start; 0: not yet), for the message of a
    // survivor that waits in vain: it tells a PE 2 stuck before leaving (in the barrier)
    // from a leave that the root did not notice (its Pe's drop, the root's reader). This
    // wait failed once in CI (docs/runtime.md, "Failures").
    let left = std::sync::atomic::AtomicU64::new(0);
    let (past, done) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    let out = run_threads(3, s, |pe| {
        let me = pe.my_pe();
        let pair = pe.team_split_strided(pe.world(), 0, 1, 2)?;
        let x = pe.calloc::<u64>(1)?;
        pe.barrier_all()?;
        // PE 2 leaves only once PEs 0 and 1 are out of the barrier: a survivor still in
        // it when the death arrives fails there (an untolerated death fails its waits), as
        // it should, and its leave then shows the other survivor two deaths. Under load
        // that happened in CI twice (2026-12-07), seen as "PE 2's death was not reported".
        arrive_and_wait(&past, 3);
        if me == 2 {
            // Leaves without finalize: the others see it die.
            let ms = start.elapsed().as_millis() as u64;
            left.store(ms.max(1), std::sync::atomic::Ordering::Relaxed);
            return Err(Error::Verification("PE 2 leaves".into()));
        }
        let end = Instant::now() + Duration::from_secs(10);
        while pe.dead_pes() != vec![2] {
            assert!(
                Instant::now() < end,
                "PE {me}: PE 2's death was not reported within 10 s ({what}): dead PEs {:?}; \
                 PE 2 {}, {} ms after the job started",
                pe.dead_pes(),
                match left.load(std::sync::atomic::Ordering::Relaxed) {
                    0 => "had not left its closure".to_string(),
                    ms => format!("left its closure at {ms} ms"),
                },
                start.elapsed().as_millis()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Untolerated: RMA between the survivors fails too.
        assert!(
            matches!(pe.p(x, 1, 1 - me), Err(Error::PeerDied { pe: 2, .. })),
            "PE {me}"
        );
        pe.tolerate_death(2)?;
        let pair = pair.expect("PEs 0 and 1 are in the pair team");
        for i in 0..50u64 {
            pe.p(x, 100 * i + me as u64, 1 - me)?;
            pe.team_barrier(&pair)?;
            assert_eq!(
                pe.g(x, me)?,
                100 * i + (1 - me) as u64,
                "PE {me}, round {i}"
            );
            pe.team_barrier(&pair)?;
        }
        let died = |r: rshmem::Result<()>, what: &str| match r {
            Err(Error::PeerDied { pe: 2, .. }) => {}
            other => panic!("PE {me}, {what}: {other:?}"),
        };
        died(pe.p(x, 7, 2), "put to PE 2");
        died(pe.barrier_all(), "barrier_all");
        died(
            pe.team_split_strided(pe.world(), 0, 1, 2).map(|_| ()),
            "team split",
        );
        assert!(pe.tolerate_death(me).is_err(), "PE {me} tolerates itself");
        // The survivors leave together: one that left first (its finalize fails) would
        // show the other a second death during its checks.
        arrive_and_wait(&done, 2);
        Ok(())
    })
    .unwrap();
    assert!(
        matches!(&out[2], Err(rshmem::Error::Verification(m)) if m == "PE 2 leaves"),
        "{what}, PE 2: {:?}",
        out[2]
    );
    for (r, o) in out.iter().enumerate().take(2) {
        // The survivors' finalize needs PE 2 too.
        assert!(
            matches!(o, Err(rshmem::Error::PeerDied { pe: 2, .. })),
            "{what}, PE {r}: {o:?}"
        );
    }
}

/// Two threads sharing one PE: the second `set_lock` while the first holds the lock is an
/// error (OpenSHMEM locks exclude PEs, not threads of one PE) that takes no ticket, so the
/// lock stays usable; once released, either thread can take it.
#[test]
fn a_lock_held_by_one_thread_of_a_pe_is_refused_to_another() {
    let out = run_threads(1, settings(), |pe| {
        let lock = pe.calloc::<u64>(1)?;
        pe.set_lock(lock)?;
        let refused = std::thread::scope(|s| {
            s.spawn(|| pe.set_lock(lock).map_err(|e| e.to_string()))
                .join()
                .expect("thread")
        });
        let word_while_held = pe.atomic_fetch(lock, 0)?;
        pe.clear_lock(lock)?;
        std::thread::scope(|s| {
            s.spawn(|| pe.set_lock(lock).and_then(|()| pe.clear_lock(lock)))
                .join()
                .expect("thread")
        })?;
        Ok((refused, word_while_held, pe.atomic_fetch(lock, 0)?))
    })
    .expect("job starts");
    let (refused, held, end) = out.into_iter().next().unwrap().expect("PE 0");
    let e = refused.expect_err("the second set_lock is refused");
    assert!(
        e.contains("already holds or waits for the lock at offset"),
        "{e}"
    );
    // One ticket taken and served while held (no ticket for the refused call), two at the end.
    assert_eq!((held >> 32, held & 0xffff_ffff), (1, 0));
    assert_eq!((end >> 32, end & 0xffff_ffff), (2, 2));
}

/// A `set_lock` that times out keeps its ticket queued, and the lock goes on working.
/// PE 0 holds the lock three times while PE 1 times out behind it; each time PE 1 comes
/// back another way: (A) `test_lock`, true once its kept ticket is served; (B) `set_lock`
/// again (a second timeout first), which waits for the same ticket rather than taking a
/// new one; (C) `clear_lock`, which gives up its served ticket so PE 0 gets the lock next.
/// Before its turn, `clear_lock` of a kept ticket is an error naming both tickets.
#[test]
fn a_timed_out_set_lock_resumes_its_ticket() {
    let mut s = settings();
    // 3 s: the test waits out four timeouts, but a shorter bound also ends the waiting
    // thread's set_lock below before the main thread (descheduled) could clear the lock.
    s.timeout = std::time::Duration::from_millis(3000);
    // Outside the PE's bounded waits (its timeout would end them): poll a local flag.
    fn await_flag(pe: &rshmem::Pe, flags: rshmem::SymPtr<u64>, i: usize) -> rshmem::Result<()> {
        let t0 = std::time::Instant::now();
        while pe.atomic_fetch(flags.at(i), pe.my_pe())? == 0 {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "flag {i} never set"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }
    let out = run_threads(2, s, |pe| {
        let lock = pe.calloc::<u64>(1)?;
        let flags = pe.calloc::<u64>(16)?;
        let other = 1 - pe.my_pe();
        let raise = |i: usize| pe.atomic_set(flags.at(i), 1u64, other);
        let word = || -> rshmem::Result<String> {
            let w = pe.atomic_fetch(lock, 0)?;
            Ok(format!("{} {}", w >> 32, w & 0xffff_ffff))
        };
        let mut seen = Vec::new();
        if pe.my_pe() == 0 {
            for round in 0..3 {
                let f = 4 * round;
                pe.set_lock(lock)?;
                raise(f)?; // PE 1: PE 0 holds it
                await_flag(pe, flags, f + 1)?; // PE 1 timed out behind it
                pe.clear_lock(lock)?; // serves PE 1's kept ticket
                raise(f + 2)?;
                await_flag(pe, flags, f + 3)?; // PE 1 took it and let go
            }
            // After round C's give-up, the lock comes straight to PE 0.
            pe.set_lock(lock)?;
            pe.clear_lock(lock)?;
            seen.push(word()?);
            raise(12)?;
        } else {
            let err = |r: rshmem::Result<()>| format!("{}", r.unwrap_err());
            // (A) test_lock.
            await_flag(pe, flags, 0)?;
            // Another thread of PE 1 cannot clear the lock while this one waits for it.
            let (waited, cleared) = std::thread::scope(|sc| {
                let w = sc.spawn(|| err(pe.set_lock(lock)));
                // Once its ticket is taken (next ticket 2), the thread waits for the lock.
                let t0 = std::time::Instant::now();
                while pe.atomic_fetch(lock, 0).map(|w| w >> 32).ok() != Some(2) {
                    assert!(
                        t0.elapsed() < std::time::Duration::from_secs(60),
                        "no ticket"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                let c = err(pe.clear_lock(lock));
                (w.join().expect("thread"), c)
            });
            seen.push(waited);
            seen.push(err(pe.clear_lock(lock)));
            seen.push(format!("{}", pe.test_lock(lock)?));
            raise(1)?;
            await_flag(pe, flags, 2)?;
            seen.push(word()?);
            seen.push(format!("{}", pe.test_lock(lock)?));
            pe.clear_lock(lock)?;
            raise(3)?;
            // (B) set_lock again.
            await_flag(pe, flags, 4)?;
            seen.push(err(pe.set_lock(lock)));
            seen.push(err(pe.set_lock(lock))); // resumed, and times out again
            raise(5)?;
            await_flag(pe, flags, 6)?;
            pe.set_lock(lock)?; // the same ticket: no new one taken
            seen.push(word()?);
            pe.clear_lock(lock)?;
            raise(7)?;
            // (C) clear_lock gives the served ticket up.
            await_flag(pe, flags, 8)?;
            seen.push(err(pe.set_lock(lock)));
            raise(9)?;
            await_flag(pe, flags, 10)?;
            pe.clear_lock(lock)?;
            seen.push(word()?);
            seen.push(err(pe.clear_lock(lock))); // nothing kept any more
            raise(11)?;
            await_flag(pe, flags, 12)?;
            seen.push(cleared);
        }
        Ok(seen)
    })
    .expect("job starts");
    let mut out = out.into_iter();
    assert_eq!(out.next().unwrap().expect("PE 0"), ["7 7"]);
    let seen = out.next().unwrap().expect("PE 1");
    let timed_out = |i: usize, ticket: u32, kept: bool| {
        let e = &seen[i];
        let holds = format!(
            "it serves ticket {}, this PE holds ticket {ticket}",
            ticket - 1
        );
        assert!(
            e.contains(&holds)
                && e.contains("(kept from a failed set_lock)") == kept
                && e.contains("clear_lock gives it up once it is served"),
            "{i}: {e}"
        );
    };
    timed_out(0, 1, false);
    assert!(
        seen[1]
            .contains("its ticket 1, left queued by a set_lock that failed, waits behind ticket 0"),
        "{}",
        seen[1]
    );
    assert_eq!(&seen[2..5], ["false", "2 1", "true"]);
    timed_out(5, 3, false);
    timed_out(6, 3, true);
    assert_eq!(seen[7], "4 3", "resumed, not a new ticket");
    timed_out(8, 5, false);
    assert_eq!(seen[9], "6 6", "the served ticket given up");
    assert!(seen[10].contains("does not hold the lock"), "{}", seen[10]);
    assert!(
        seen[11].contains("does not hold the lock at offset")
            && seen[11].ends_with("(another thread of it waits for it)"),
        "{}",
        seen[11]
    );
    assert_eq!(seen.len(), 12);
}

/// With PEs as threads, a team handle that reaches another PE is refused there: its calls
/// would count as the owner's on the team's shared counters (a barrier of the owner's
/// team would then pass without it).
#[test]
fn a_team_handle_of_another_pe_is_refused() {
    let handles: std::sync::Mutex<Vec<Option<rshmem::Team>>> = std::sync::Mutex::new(vec![None; 3]);
    let out = run_threads(3, settings(), |pe| {
        let world = pe.world().clone();
        let pair = pe.team_split_strided(&world, 0, 1, 2)?;
        if let Some(t) = &pair {
            handles.lock().unwrap()[pe.my_pe()] = Some(t.clone());
        }
        pe.barrier_all()?;
        let theirs = handles.lock().unwrap()[0].clone().expect("PE 0's handle");
        let refused = if pe.my_pe() == 0 {
            None
        } else {
            Some(pe.sync_team(&theirs).unwrap_err().to_string())
        };
        // The pair's own barrier still works for its members.
        if let Some(t) = &pair {
            pe.sync_team(t)?;
        }
        pe.barrier_all()?;
        if let Some(t) = pair {
            pe.team_destroy(t)?;
        }
        Ok(refused)
    })
    .expect("job starts");
    for (r, o) in out.into_iter().enumerate() {
        let o = o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
        if r == 0 {
            assert!(o.is_none());
            continue;
        }
        let e = o.expect("refused");
        assert!(
            e.contains(&format!("PE {r} passed a handle of team"))
                && e.contains("that belongs to another PE (world PE 0)"),
            "PE {r}: {e}"
        );
    }
}

/// Zero-length operations on the empty allocation (`malloc(0)`) succeed and move nothing,
/// as OpenSHMEM's do with nelems 0; a zero-length put_signal still signals. Over p2p and
/// through the proxy. (They were out-of-bounds errors, and the signal never came.)
#[test]
fn zero_length_operations_on_the_empty_allocation() {
    for proxy in [false, true] {
        let mut s = settings();
        if proxy {
            s.transport = rshmem::config::TransportMode::Proxy;
        }
        let out = run_threads(2, s, |pe| {
            let e = pe.malloc(0)?;
            let sig = pe.calloc::<u64>(1)?;
            let peer = 1 - pe.my_pe();
            pe.put(e, &[], peer)?;
            pe.put_nbi(e, &[], peer)?;
            pe.get(&mut [], e, peer)?;
            pe.put_signal(e, &[], sig, 40 + peer as u64, rshmem::SignalOp::Set, peer)?;
            pe.barrier_all()?;
            let got = pe.atomic_fetch(sig, pe.my_pe())?;
            // An empty range elsewhere than offset 0 is still checked against the heap.
            let bad = rshmem::SymPtr::<u8>::from_raw(8, 0);
            let refused = pe.put(bad, &[], peer).is_err();
            pe.barrier_all()?;
            pe.free(sig)?;
            pe.free(e)?;
            Ok((got, refused))
        })
        .expect("job starts");
        for (r, o) in out.into_iter().enumerate() {
            let o = o.unwrap_or_else(|e| panic!("proxy {proxy}, PE {r}: {e}"));
            assert_eq!(o, (40 + r as u64, true), "proxy {proxy}, PE {r}");
        }
    }
}

/// Settings built in code get the environment's checks: a heap smaller than the runtime
/// region (or not whole pages) is refused before any PE starts, not mapped and then read
/// past its end by the first wait (SIGSEGV before 2026-12-07); a PE started on its own
/// (`Pe::init_with`) refuses it too (settings_built_in_code_are_checked covers the rest).
#[test]
fn a_heap_too_small_for_the_runtime_region_is_refused() {
    for size in [16 << 10, (1 << 20) + 1] {
        let mut s = settings();
        s.symmetric_size = size;
        let check = |e: &str| {
            assert!(
                e.contains(&format!("symmetric heap size {size} bytes"))
                    && e.contains("at least 1048576 bytes"),
                "{e}"
            )
        };
        match run_threads(2, s.clone(), |pe| pe.barrier_all()) {
            Err(rshmem::Error::InvalidArgument(m)) => check(&m),
            r => panic!("size {size}: run_threads gave {r:?}"),
        }
        let cfg = rshmem::PeConfig {
            rank: 0,
            world_size: 1,
            root_addr: "127.0.0.1:1".into(),
            token: "t".into(),
            settings: s,
        };
        match rshmem::Pe::init_with(cfg, None) {
            Err(e) => check(&e.to_string()),
            Ok(_) => panic!("size {size}: Pe::init_with accepted it"),
        }
    }
}

/// A `clear_lock` whose release landed on the lock's home PE but whose reply was lost
/// (simulated: the word is advanced by hand, then the holder clears): the retry finds its
/// ticket passed on and leaves the lock alone. Before 2026-12-07 it served the next ticket
/// a second time, letting a third PE in while the second held the lock.
#[test]
fn a_retried_release_does_not_pass_the_lock_on_twice() {
    let out = run_threads(2, settings(), |pe| {
        let lock = pe.calloc::<u64>(1)?;
        let mut words = Vec::new();
        if pe.my_pe() == 1 {
            pe.set_lock(lock)?; // ticket 0
            pe.atomic_add(lock, 1, 0)?; // the release landed: serving 1
            words.push(pe.atomic_fetch(lock, 0)?);
            pe.clear_lock(lock)?; // the retry
            words.push(pe.atomic_fetch(lock, 0)?);
            // The lock still works: ticket 1 is served at once.
            pe.set_lock(lock)?;
            pe.clear_lock(lock)?;
            words.push(pe.atomic_fetch(lock, 0)?);
        }
        pe.barrier_all()?;
        Ok(words)
    })
    .expect("job starts");
    let words = out.into_iter().nth(1).unwrap().expect("PE 1");
    assert_eq!(words, vec![(1 << 32) | 1, (1 << 32) | 1, (2 << 32) | 2]);
}

/// realloc keeps the whole old block, also when called through a typed view that covers
/// fewer bytes (a 100-byte block seen as 12 u64s): before 2026-12-07 it copied only the
/// view's 96 bytes.
#[test]
fn realloc_keeps_the_block_not_the_view() {
    let out = run_threads(2, settings(), |pe| {
        let me = pe.my_pe();
        let p = pe.malloc(100)?;
        let bytes: Vec<u8> = (0..100).map(|i| (i * 7 + me) as u8).collect();
        pe.put(p, &bytes, me)?;
        let q = pe.realloc(p.cast::<u64>(), 50)?;
        let mut got = vec![0u8; 100];
        pe.get(&mut got, q.cast::<u8>().slice(0..100), me)?;
        Ok(got == bytes)
    })
    .expect("job starts");
    for (rank, r) in out.into_iter().enumerate() {
        assert!(
            r.expect("PE ran"),
            "PE {rank}: the block's last bytes were lost"
        );
    }
}

/// Settings built in code get the environment's checks: each bad value is refused with
/// InvalidArgument naming it, before any PE starts (a Duration::MAX timeout panicked on the
/// first deadline, a fabric chunk of 0 in the first put, a zero queue-state period spun).
#[test]
fn settings_built_in_code_are_checked() {
    type Change = fn(&mut Settings);
    let cases: [(&str, Change); 6] = [
        ("timeout", |s| s.timeout = std::time::Duration::MAX),
        ("timeout", |s| s.timeout = std::time::Duration::ZERO),
        ("fabric chunk", |s| s.fabric_chunk = 0),
        ("fabric chunk", |s| s.fabric_chunk = 3 << 20),
        ("queue-state period", |s| {
            s.debug_queues = Some(std::time::Duration::ZERO)
        }),
        ("symmetric heap size", |s| s.symmetric_size = 4096),
    ];
    for (what, change) in cases {
        let mut s = settings();
        change(&mut s);
        let e = match s.validate() {
            Err(e) => e,
            Ok(()) => panic!("{what}: accepted"),
        };
        assert!(
            matches!(&e, rshmem::Error::InvalidArgument(m) if m.contains(what)),
            "{what}: {e}"
        );
        match run_threads(1, s, |_| Ok(())) {
            Err(rshmem::Error::InvalidArgument(m)) => assert!(m.contains(what), "{m}"),
            r => panic!("{what}: run_threads gave {r:?}"),
        }
    }
    assert!(settings().validate().is_ok());
}

/// A wait set whose length runs past the heap is refused before any per-element work: no
/// word list is built for it (16 bytes an element: 1 GiB for this 256 MiB heap of u32s,
/// and an abort on a large heap, before the first element outside the heap was met).
#[test]
fn a_wait_set_past_the_heap_is_refused_before_building_its_words() {
    fn peak_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let l = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        l.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
    let mut s = settings();
    s.symmetric_size = 256 << 20;
    let out = run_threads(1, s, |pe| {
        let word = pe.calloc::<u32>(1)?;
        let set = rshmem::SymPtr::<u32>::from_raw(word.offset(), usize::MAX / 4);
        let before = peak_kib();
        let e = pe
            .wait_until_all(set, None, rshmem::Cmp::Eq, 0)
            .unwrap_err();
        let t = pe.test_all(set, None, rshmem::Cmp::Eq, 0).unwrap_err();
        let grew = peak_kib() - before;
        for e in [&e, &t] {
            assert!(matches!(e, rshmem::Error::OutOfBounds { .. }), "{e}");
        }
        assert!(grew < 128 << 10, "the peak grew by {grew} KiB");
        pe.free(word)
    })
    .expect("job starts");
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}
