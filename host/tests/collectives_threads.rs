//! Team collectives with PEs as threads: exact results on both sides of the small-call
//! limit (collectives.rs, "Small calls": one exchange of the agreement records), on the
//! world team and on a strided team, over p2p and through the proxy; mismatches between a
//! small and a large call, and between small calls, reported on every member without a
//! hang; small and large calls and agreements interleaved for many rounds.
use rshmem::collectives::{ReduceOp, SMALL_CALL_BYTES};
use rshmem::config::TransportMode;
use rshmem::types::SymPtr;
use rshmem::{run_threads, Error, Pe, Settings, Team};

/// Runs `f` on `n` PEs as threads with `settings()`; every PE's value, in rank order (a PE
/// that returned an error fails the test, naming it).
fn on_every_pe<R: Send>(n: usize, f: impl Fn(&Pe) -> rshmem::Result<R> + Sync) -> Vec<R> {
    run_threads(n, settings(), f)
        .expect("job starts")
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.unwrap_or_else(|e| panic!("PE {rank}: {e}")))
        .collect()
}

fn settings() -> Settings {
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.symmetric_size = 16 << 20;
    s.timeout = std::time::Duration::from_secs(20);
    s
}

/// The value world PE `p` contributes at element `i` (distinct per PE and element).
fn v(p: usize, i: usize) -> u64 {
    (p as u64 + 1) * 1_000_003 + i as u64 * 7919
}

/// Symmetric buffers of `check_all`, allocated by every PE of the world (allocation is a
/// world collective), large enough for the world team.
struct Bufs {
    src: SymPtr<u64>,
    dst: SymPtr<u64>,
    a: SymPtr<u8>,
    b: SymPtr<u8>,
}

impl Bufs {
    fn new(pe: &Pe, max_count: usize) -> rshmem::Result<Bufs> {
        let n = pe.n_pes();
        Ok(Bufs {
            src: pe.calloc(n * max_count)?,
            dst: pe.calloc(n * max_count)?,
            a: pe.calloc(SMALL_CALL_BYTES + 1)?,
            b: pe.calloc(SMALL_CALL_BYTES + 1)?,
        })
    }

    fn free(self, pe: &Pe) -> rshmem::Result<()> {
        pe.free(self.b)?;
        pe.free(self.a)?;
        pe.free(self.dst)?;
        pe.free(self.src)
    }
}

/// Every collective on `team` for counts 0..=max_count elements of u64: each member checks
/// its own dest exactly after each call.
fn check_all(pe: &Pe, team: &Team, max_count: usize, bufs: &Bufs) -> rshmem::Result<()> {
    let me = pe.my_pe();
    let (n, idx) = (team.n_pes(), team.my_pe());
    let (src, dst) = (bufs.src, bufs.dst);
    // The first `len` elements of dest; the rest must still hold the sentinel `fill` put
    // there (no member writes past the result).
    let read = |len: usize| -> rshmem::Result<Vec<u64>> {
        let mut all = vec![0u64; dst.len()];
        pe.get(&mut all, dst, me)?;
        assert!(
            all[len..].iter().all(|&x| x == u64::MAX),
            "PE {me}: dest written past its {len} result elements"
        );
        all.truncate(len);
        Ok(all)
    };
    let fill = |len: usize| -> rshmem::Result<()> {
        let mine: Vec<u64> = (0..len).map(|i| v(me, i)).collect();
        pe.put(src.slice(0..len), &mine, me)?;
        // dest starts as a value no result has, so a missed write shows.
        pe.put(dst, &vec![u64::MAX; dst.len()], me)?;
        Ok(())
    };
    for k in 0..=max_count {
        let world_of = |j: usize| team.world_pe(j).expect("member index");
        // broadcast from a root that moves with k.
        let root = k % n;
        fill(n * k.max(1))?;
        pe.broadcast(team, dst, src, k, root)?;
        let want: Vec<u64> = (0..k).map(|i| v(world_of(root), i)).collect();
        assert_eq!(
            read(k)?,
            want,
            "PE {me}: broadcast of {k} from member {root}"
        );
        // fcollect: member j's k elements at block j.
        fill(n * k.max(1))?;
        pe.fcollect(team, dst, src.slice(0..k), k)?;
        let want: Vec<u64> = (0..n)
            .flat_map(|j| (0..k).map(move |i| v(world_of(j), i)))
            .collect();
        assert_eq!(read(n * k)?, want, "PE {me}: fcollect of {k}");
        // alltoall: block j of dest is member j's source block `idx`.
        fill(n * k.max(1))?;
        pe.alltoall(team, dst, src.slice(0..n * k), k)?;
        let want: Vec<u64> = (0..n)
            .flat_map(|j| (0..k).map(move |i| v(world_of(j), idx * k + i)))
            .collect();
        assert_eq!(read(n * k)?, want, "PE {me}: alltoall of {k}");
        // reduce, out of place and in place.
        fill(n * k.max(1))?;
        pe.reduce(team, dst, src, k, ReduceOp::Sum)?;
        let want: Vec<u64> = (0..k)
            .map(|i| (0..n).fold(0u64, |s, j| s.wrapping_add(v(world_of(j), i))))
            .collect();
        assert_eq!(read(k)?, want, "PE {me}: sum reduce of {k}");
        pe.reduce(team, src, src, k, ReduceOp::Xor)?;
        let mut got = vec![0u64; k];
        pe.get(&mut got, src.slice(0..k), me)?;
        let want: Vec<u64> = (0..k)
            .map(|i| (0..n).fold(0u64, |s, j| s ^ v(world_of(j), i)))
            .collect();
        assert_eq!(got, want, "PE {me}: in-place xor reduce of {k}");
    }
    // u8 (alignment 1) around the limit: max reduce of SMALL_CALL_BYTES - 1 ..= + 1 bytes.
    let bytes = SMALL_CALL_BYTES + 1;
    let (a, b) = (bufs.a, bufs.b);
    // Below 0xff, so the sentinel dest value shows a byte that was not written.
    let byte = |p: usize, i: usize| ((v(p, i) >> 3) % 255) as u8;
    let mine: Vec<u8> = (0..bytes).map(|i| byte(me, i)).collect();
    pe.put(a, &mine, me)?;
    for len in [SMALL_CALL_BYTES - 1, SMALL_CALL_BYTES, SMALL_CALL_BYTES + 1] {
        // 0xff: a value no max of these bytes has.
        pe.put(b, &vec![0xffu8; bytes], me)?;
        pe.reduce(team, b, a, len, ReduceOp::Max)?;
        let mut got = vec![0u8; len];
        pe.get(&mut got, b.slice(0..len), me)?;
        let want: Vec<u8> = (0..len)
            .map(|i| {
                (0..n)
                    .map(|j| byte(team.world_pe(j).unwrap(), i))
                    .max()
                    .unwrap()
            })
            .collect();
        assert_eq!(got, want, "PE {me}: u8 max reduce of {len}");
    }
    Ok(())
}

/// An in-place sum over the world of `k` elements of (rank + 1) in `x` (3 PEs): 6 each,
/// the check that calls after a mismatch are in step again.
fn sum_of_ranks_is_exact(pe: &Pe, x: SymPtr<u64>, k: usize) -> rshmem::Result<()> {
    let me = pe.my_pe();
    pe.put(x.slice(0..k), &vec![me as u64 + 1; k], me)?;
    pe.reduce(pe.world(), x, x, k, ReduceOp::Sum)?;
    let mut got = vec![0u64; k];
    pe.get(&mut got, x.slice(0..k), me)?;
    assert_eq!(
        got,
        vec![6u64; k],
        "PE {me}: reduce of {k} after the mismatch"
    );
    Ok(())
}

/// Counts of u64 that cover both sides of the limit for every collective at `n` members
/// (alltoall sends n blocks: its part is n * count elements).
fn max_count(_n: usize) -> usize {
    SMALL_CALL_BYTES / 8 + 2
}

fn run_exact(n: usize, s: Settings) {
    let out = run_threads(n, s, |pe| {
        let bufs = Bufs::new(pe, max_count(n))?;
        check_all(pe, pe.world(), max_count(n), &bufs)?;
        // Teams split from the world (another team slot): without world PE 0 (member
        // index != world PE), and with stride 2 (PEs 0, 2, 4).
        let mut splits = vec![];
        if n >= 3 {
            splits.push((1, 1, n - 1));
        }
        if n >= 5 {
            splits.push((0, 2, n.div_ceil(2)));
        }
        for (start, stride, size) in splits {
            let t = pe.team_split_strided(pe.world(), start, stride, size)?;
            if let Some(t) = t {
                check_all(pe, &t, max_count(size), &bufs)?;
                pe.team_destroy(t)?;
            }
        }
        // Every member's last dest writes are its own: the free's agreement comes after.
        bufs.free(pe)
    })
    .expect("job starts");
    let errors: Vec<String> = out
        .iter()
        .enumerate()
        .filter_map(|(rank, r)| r.as_ref().err().map(|e| format!("PE {rank}: {e}")))
        .collect();
    assert!(errors.is_empty(), "{n} PEs:\n{}", errors.join("\n"));
}

#[test]
fn collectives_are_exact_on_both_sides_of_the_small_call_limit() {
    for n in [1, 2, 3, 5] {
        run_exact(n, settings());
    }
}

#[test]
fn small_collectives_are_exact_through_the_proxy() {
    let mut s = settings();
    s.transport = TransportMode::Proxy;
    run_exact(3, s);
}

/// A member asks for a large reduce where the others ask for a small one: every member
/// gets a `CollectiveMismatch` (not a timeout: no member waits for the others) naming
/// the large call's counts and the small calls' size; the calls after it are in step.
#[test]
fn a_small_call_meeting_a_large_one_is_a_mismatch_on_every_member() {
    let n = 3;
    let big = SMALL_CALL_BYTES / 8 + 5;
    let out = on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let x = pe.calloc::<u64>(big)?;
        pe.put(x, &vec![me as u64 + 1; big], me)?;
        let k = if me == 1 { big } else { 1 };
        let err = match pe.reduce(pe.world(), x, x, k, ReduceOp::Sum) {
            Err(Error::CollectiveMismatch { op, detail }) => (op, detail),
            other => panic!("PE {me}: expected a mismatch, got {other:?}"),
        };
        // In step again: a small and a large reduce, exact.
        for k in [1, big] {
            sum_of_ranks_is_exact(pe, x, k)?;
        }
        Ok(err)
    });
    for (rank, (op, detail)) in out.into_iter().enumerate() {
        assert_eq!(op, "reduce", "PE {rank}");
        assert!(
            detail.contains("PE 1: reduce of type")
                && detail.contains(&format!("counts {big} / {big}"))
                && detail.contains("PE 0: a small reduce (8 bytes per member")
                && detail.contains("PE 2: a small reduce (8 bytes per member"),
            "PE {rank}: {detail}"
        );
    }
}

/// Small calls whose arguments differ (the root) run the full agreement: the error lists
/// each member's arguments, as a large call's does.
#[test]
fn small_calls_that_differ_name_each_members_arguments() {
    let n = 3;
    let out = on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let (src, dst) = (pe.calloc::<u64>(2)?, pe.calloc::<u64>(2)?);
        let root = if me == 2 { 1 } else { 0 };
        match pe.broadcast(pe.world(), dst, src, 2, root) {
            Err(Error::CollectiveMismatch { op, detail }) => Ok((op, detail)),
            other => panic!("PE {me}: expected a mismatch, got {other:?}"),
        }
    });
    for (rank, (op, detail)) in out.into_iter().enumerate() {
        assert_eq!(op, "broadcast");
        for (p, root) in [(0, 0), (1, 0), (2, 1)] {
            assert!(
                detail.contains(&format!("PE {p}: broadcast of type"))
                    && detail.contains(&format!("counts 2 / 2, root {root},")),
                "PE {rank}: {detail}"
            );
        }
    }
}

/// Small calls (one exchange, no barrier), large calls (agreement and completion behind
/// barriers) and other agreements (calloc, free) on the same team, interleaved for many
/// rounds with a root and values that change every round: the two record halves are
/// reused by turns by both kinds of exchange; every result is exact.
#[test]
fn small_and_large_calls_interleave_for_many_rounds() {
    let n = 3;
    let big = SMALL_CALL_BYTES / 8 + 3;
    on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let world = pe.world();
        let (src, dst) = (pe.calloc::<u64>(n * big)?, pe.calloc::<u64>(n * big)?);
        for round in 0..300usize {
            let val = |p: usize, i: usize| v(p, i) ^ ((round as u64) << 40);
            let mine: Vec<u64> = (0..n * big).map(|i| val(me, i)).collect();
            pe.put(src, &mine, me)?;
            let k = if round % 2 == 0 { 1 } else { big };
            let root = round % n;
            pe.broadcast(world, dst, src, k, root)?;
            let mut got = vec![0u64; k];
            pe.get(&mut got, dst.slice(0..k), me)?;
            let want: Vec<u64> = (0..k).map(|i| val(root, i)).collect();
            assert_eq!(got, want, "PE {me}, round {round}: broadcast of {k}");
            let k2 = if round % 3 == 0 { big } else { 2 };
            pe.reduce(world, dst, src, k2, ReduceOp::Sum)?;
            let mut got = vec![0u64; k2];
            pe.get(&mut got, dst.slice(0..k2), me)?;
            let want: Vec<u64> = (0..k2)
                .map(|i| (0..n).fold(0u64, |s, p| s.wrapping_add(val(p, i))))
                .collect();
            assert_eq!(got, want, "PE {me}, round {round}: reduce of {k2}");
            if round % 7 == 0 {
                let t: SymPtr<u64> = pe.calloc(4)?;
                pe.free(t)?;
            }
        }
        Ok(())
    });
}

/// A data collective (large: an agreement behind a barrier; small: one polled exchange) that meets
/// another agreement (an allocation, which waits in a barrier) on the same team: every
/// member gets a `CollectiveMismatch`, the allocating member included, and the calls after
/// it are in step.
#[test]
fn a_collective_meeting_an_allocation_is_a_mismatch_on_every_member() {
    let n = 3;
    let big = SMALL_CALL_BYTES / 8 + 5;
    let out = on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let x = pe.calloc::<u64>(big)?;
        let mut errors = Vec::new();
        for k in [big, 1] {
            let r = if me == 2 {
                pe.calloc::<u64>(4).map(|_| ())
            } else {
                pe.reduce(pe.world(), x, x, k, ReduceOp::Sum)
            };
            match r {
                Err(Error::CollectiveMismatch { op, .. }) => errors.push(op),
                other => panic!("PE {me}, reduce of {k}: expected a mismatch, got {other:?}"),
            }
            sum_of_ranks_is_exact(pe, x, k)?;
        }
        Ok(errors)
    });
    for (rank, ops) in out.into_iter().enumerate() {
        let want = if rank == 2 { "calloc" } else { "reduce" };
        assert_eq!(ops, vec![want, want], "PE {rank}");
    }
}

/// A member whose own part of a small call is wrong: a source too short on the root only,
/// or a dest too short on one member only, is a mismatch on every member naming it (the
/// agreed "long enough" differs); a source too short on every member is refused on every
/// member with the same clear error (before 2026-12-07 the root got that error and the
/// others a mismatch about arguments that did not differ). Then in step again.
#[test]
fn a_small_call_with_one_bad_member_fails_on_every_member() {
    let n = 3;
    let out = on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let (src, dst) = (pe.calloc::<u64>(4)?, pe.calloc::<u64>(4)?);
        let mut seen = Vec::new();
        // The root (member 1) passes a source of 1 element for a broadcast of 2.
        let s = if me == 1 { src.slice(0..1) } else { src };
        seen.push(match pe.broadcast(pe.world(), dst, s, 2, 1) {
            Err(Error::InvalidArgument(m)) => format!("own: {m}"),
            Err(Error::CollectiveMismatch { op, detail }) => format!("{op}: {detail}"),
            other => panic!("PE {me}: expected an error, got {other:?}"),
        });
        // Every member passes a source of 1 element for a broadcast of 2.
        seen.push(match pe.broadcast(pe.world(), dst, src.slice(0..1), 2, 1) {
            Err(Error::InvalidArgument(m)) => format!("own: {m}"),
            other => panic!("PE {me}: expected InvalidArgument, got {other:?}"),
        });
        // Member 2's dest holds 1 element where the call needs 2.
        let d = if me == 2 { dst.slice(0..1) } else { dst };
        seen.push(match pe.fcollect(pe.world(), d, src.slice(0..1), 1) {
            Err(Error::CollectiveMismatch { op, detail }) => format!("{op}: {detail}"),
            other => panic!("PE {me}: expected a mismatch, got {other:?}"),
        });
        pe.put(src, &[me as u64 + 10; 4], me)?;
        pe.broadcast(pe.world(), dst, src, 2, 1)?;
        let mut got = [0u64; 2];
        pe.get(&mut got, dst.slice(0..2), me)?;
        assert_eq!(got, [11, 11], "PE {me}: broadcast after the errors");
        Ok(seen)
    });
    for (rank, seen) in out.into_iter().enumerate() {
        assert!(
            seen[0].starts_with("broadcast: ")
                && seen[0].contains("PE 1: broadcast of type")
                && seen[0].contains("(long enough: false), ready: true"),
            "PE {rank}: {}",
            seen[0]
        );
        assert_eq!(
            seen[1], "own: broadcast: source has 1 elements, the call needs 2",
            "PE {rank}"
        );
        assert!(
            seen[2].starts_with("fcollect: ")
                && seen[2].contains("PE 2: fcollect of type")
                && seen[2].contains("dest at 0x")
                && seen[2].contains("(long enough: false)"),
            "PE {rank}: {}",
            seen[2]
        );
    }
}

/// Small calls whose dest and source are u64 views at odd byte offsets of a byte array
/// (`SymPtr::cast` does not align): exact results, as in the large path.
#[test]
fn small_calls_on_misaligned_buffers_are_exact() {
    let n = 3;
    on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let raw = pe.calloc::<u8>(64 + 8 * 3 * n)?;
        let src = raw.slice(1..1 + 8 * n).cast::<u64>();
        let dst = raw.slice(3 + 8 * n..3 + 8 * n + 8 * n).cast::<u64>();
        pe.put(
            src,
            &(0..n as u64).map(|i| v(me, i as usize)).collect::<Vec<_>>(),
            me,
        )?;
        pe.broadcast(pe.world(), dst, src, 2, 2)?;
        let mut got = vec![0u64; 2];
        pe.get(&mut got, dst.slice(0..2), me)?;
        assert_eq!(got, vec![v(2, 0), v(2, 1)], "PE {me}: broadcast");
        pe.reduce(pe.world(), dst, src, n, ReduceOp::Sum)?;
        let mut got = vec![0u64; n];
        pe.get(&mut got, dst, me)?;
        let want: Vec<u64> = (0..n).map(|i| (0..n).map(|p| v(p, i)).sum()).collect();
        assert_eq!(got, want, "PE {me}: reduce");
        Ok(())
    });
}

/// f64 sums on both sides of the limit (12 and 13 elements) combine in team order from
/// member 0, as the large path's reduce-scatter does: every member gets those bits, which
/// another order would not give (0.1 + 0.2 + 0.3).
#[test]
fn float_sums_have_the_same_bits_on_both_sides_of_the_limit() {
    let n = 3;
    let x = |p: usize, i: usize| [0.1f64, 0.2, 0.3][p] * (i + 1) as f64;
    let out = on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let (src, dst) = (pe.calloc::<f64>(13)?, pe.calloc::<f64>(13)?);
        pe.put(src, &(0..13).map(|i| x(me, i)).collect::<Vec<_>>(), me)?;
        let mut got = Vec::new();
        for k in [SMALL_CALL_BYTES / 8, SMALL_CALL_BYTES / 8 + 1] {
            pe.reduce(pe.world(), dst, src, k, ReduceOp::Sum)?;
            let mut r = vec![0f64; k];
            pe.get(&mut r, dst.slice(0..k), me)?;
            got.push(r);
        }
        Ok(got)
    });
    let team_order = |i: usize| (1..n).fold(x(0, i), |a, p| a + x(p, i));
    let reversed = |i: usize| (0..n - 1).rev().fold(x(n - 1, i), |a, p| a + x(p, i));
    assert!(
        (0..13).any(|i| team_order(i).to_bits() != reversed(i).to_bits()),
        "the values do not tell the orders apart"
    );
    for (rank, r) in out.into_iter().enumerate() {
        for got in r {
            let want: Vec<u64> = (0..got.len()).map(|i| team_order(i).to_bits()).collect();
            let bits: Vec<u64> = got.iter().map(|f| f.to_bits()).collect();
            assert_eq!(bits, want, "PE {rank}: sum of {}", got.len());
        }
    }
}

/// A team destroyed and split again takes the same slot, whose records hold the old
/// team's sequence numbers until the destroy zeroes them: the new team's first small call
/// (sequence 1) must wait for the new records, not take the old ones. Members change from
/// one split to the next.
#[test]
fn a_reused_team_slot_starts_its_small_calls_afresh() {
    let n = 3;
    on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let x = pe.calloc::<u64>(1)?;
        for round in 0..30u64 {
            let start = (round % 2) as usize;
            let t = pe.team_split_strided(pe.world(), start, 1, 2)?;
            if let Some(t) = t {
                // Several calls, so the old team's records reach sequence numbers above
                // the new team's first ones.
                for call in 0..(1 + round % 4) {
                    let mine = 1000 * round + 10 * call + me as u64;
                    pe.put(x, &[mine], me)?;
                    pe.reduce(&t, x, x, 1, ReduceOp::Sum)?;
                    let want: u64 = (start..start + 2)
                        .map(|p| 1000 * round + 10 * call + p as u64)
                        .sum();
                    assert_eq!(pe.g(x, me)?, want, "PE {me}, round {round}, call {call}");
                }
                pe.team_destroy(t)?;
            }
        }
        Ok(())
    });
}

/// In a team of more than 32 members the mismatch message lists the members whose record
/// differs from the most common one. Small calls' records carry each member's own data,
/// so they are compared by their header: 39 small reduces are the common record and the
/// one large reduce is named.
#[test]
fn a_large_team_names_the_one_member_at_fault() {
    let n = 40;
    let big = SMALL_CALL_BYTES / 8 + 1;
    let out = on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let x = pe.calloc::<u64>(big)?;
        pe.put(x, &vec![me as u64; big], me)?;
        let k = if me == n - 1 { big } else { 1 };
        match pe.reduce(pe.world(), x, x, k, ReduceOp::Sum) {
            Err(Error::CollectiveMismatch { detail, .. }) => Ok(detail),
            other => panic!("PE {me}: expected a mismatch, got {other:?}"),
        }
    });
    for (rank, detail) in out.into_iter().enumerate() {
        assert!(
            detail.starts_with(&format!("PE {}: reduce of type", n - 1))
                && detail.contains(&format!(
                    "the other {} PEs: a small reduce (8 bytes per member",
                    n - 1
                )),
            "PE {rank}: {detail}"
        );
    }
}

/// Hand-made pointers whose byte ranges would wrap the address space (an offset near
/// `usize::MAX`): every collective refuses them on every member, in both paths (4 and 64
/// elements), instead of overflowing in its range arithmetic (a panic in debug builds).
#[test]
fn pointers_whose_ranges_wrap_are_refused_not_overflowed() {
    let n = 2;
    let out = on_every_pe(n, |pe| {
        let dst = pe.calloc::<u64>(64)?;
        let far = SymPtr::<u64>::from_raw(usize::MAX - 7, 64);
        let mut refused = 0;
        for k in [4usize, 64] {
            for (what, r) in [
                (
                    "reduce far source",
                    pe.reduce(pe.world(), dst, far, k, ReduceOp::Sum),
                ),
                (
                    "reduce far dest",
                    pe.reduce(pe.world(), far, dst, k, ReduceOp::Sum),
                ),
                ("broadcast", pe.broadcast(pe.world(), dst, far, k, 0)),
                ("fcollect", pe.fcollect(pe.world(), far, dst, k / 2)),
                ("alltoall", pe.alltoall(pe.world(), dst, far, k / 2)),
            ] {
                match r {
                    Err(Error::InvalidArgument(_))
                    | Err(Error::OutOfBounds { .. })
                    | Err(Error::CollectiveMismatch { .. }) => refused += 1,
                    other => panic!("PE {}: {what} of {k}: {other:?}", pe.my_pe()),
                }
            }
        }
        // The team still works.
        pe.put(dst.slice(0..1), &[pe.my_pe() as u64 + 1], pe.my_pe())?;
        let sum = pe.calloc::<u64>(1)?;
        pe.reduce(pe.world(), sum, dst.slice(0..1), 1, ReduceOp::Sum)?;
        let mut got = [0u64];
        pe.get(&mut got, sum, pe.my_pe())?;
        Ok((refused, got[0]))
    });
    assert_eq!(out, vec![(10, 3); n]);
}

/// A strided split on one PE meeting a 2-D split on the others (same parent): every PE
/// reports the mismatch, naming the PE that made the other call. Before the split records
/// carried their kind, the 2-D splitters read the strided PE's start (2) as its xrange and
/// its stride (12: bits 2 and 3) as its free team slots, and went on to make teams.
#[test]
fn a_strided_split_meeting_a_2d_split_is_a_mismatch_on_every_member() {
    let out = on_every_pe(3, |pe| {
        let r = if pe.my_pe() == 2 {
            pe.team_split_strided(pe.world(), 2, 12, 1).map(|_| ())
        } else {
            pe.team_split_2d(pe.world(), 2).map(|_| ())
        };
        Ok(match r {
            Err(Error::CollectiveMismatch { op, detail }) => format!("{op}: {detail}"),
            other => format!("no mismatch: {other:?}"),
        })
    });
    for (rank, seen) in out.iter().enumerate() {
        let (op, other) = if rank == 2 {
            ("team_split_strided", "PE 0: another collective call")
        } else {
            ("team_split_2d", "PE 2: another collective call")
        };
        assert!(
            seen.starts_with(&format!("{op}: ")) && seen.contains(other),
            "PE {rank}: {seen}"
        );
    }
}

/// A barrier that timed out leaves the team's counters out of step between its members,
/// so the team is marked broken on the PE that failed: its later barriers and collectives
/// on it are refused at once, naming the first failure, instead of running on counters
/// that no longer match (docs/runtime.md, "Teams"). The member that was late is not
/// affected; `team_destroy` and splits still work, and a new team works on both.
#[test]
fn a_barrier_that_timed_out_marks_the_team_broken() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};
    for transport in [TransportMode::Auto, TransportMode::Proxy] {
        // Every wait of the job has this bound (start-up, splits, the destroy's barrier):
        // long enough for a loaded machine, while PE 0's first barrier waits it out once.
        let timeout = Duration::from_secs(2);
        let mut s = settings();
        s.timeout = timeout;
        s.transport = transport;
        let failed = AtomicUsize::new(0);
        let out = run_threads(2, s, |pe| {
            let me = pe.my_pe();
            let pair = pe
                .team_split_strided(pe.world(), 0, 1, 2)?
                .expect("both PEs are members");
            let src = pe.calloc::<u64>(1)?;
            let dst = pe.calloc::<u64>(1)?;
            let mut refused = Vec::new();
            if me == 0 {
                // PE 1 stays away until PE 0 has given up.
                let first = pe.team_barrier(&pair);
                assert!(
                    matches!(
                        first,
                        Err(Error::WaitTimeout { .. } | Error::Timeout { .. })
                    ),
                    "{transport:?}: {first:?}"
                );
                let start = Instant::now();
                refused.push(pe.team_barrier(&pair));
                refused.push(pe.broadcast(&pair, dst, src, 1, 0));
                refused.push(pe.sync_team(&pair));
                // Refused at once, not after another wait (each would take the timeout).
                assert!(start.elapsed() < timeout / 4, "{transport:?}");
                failed.store(1, SeqCst);
            } else {
                let end = Instant::now() + Duration::from_secs(30);
                while failed.load(SeqCst) == 0 {
                    assert!(Instant::now() < end, "PE 0 did not fail within 30 s");
                    std::thread::sleep(Duration::from_millis(2));
                }
                // PE 0 signalled before it gave up: this barrier completes.
                pe.team_barrier(&pair)?;
            }
            pe.team_destroy(pair)?;
            let fresh = pe
                .team_split_strided(pe.world(), 0, 1, 2)?
                .expect("both PEs are members");
            pe.team_barrier(&fresh)?;
            pe.team_destroy(fresh)?;
            Ok(refused
                .into_iter()
                .map(|r| r.map_err(|e| e.to_string()))
                .collect::<Vec<_>>())
        })
        .expect("job starts");
        let mut it = out.into_iter();
        let pe0 = it
            .next()
            .unwrap()
            .unwrap_or_else(|e| panic!("{transport:?}, PE 0: {e}"));
        assert_eq!(pe0.len(), 3);
        for (i, r) in pe0.iter().enumerate() {
            let e = r.as_ref().expect_err("refused");
            assert!(
                e.contains("is unusable on this PE")
                    && e.contains("barrier failed here")
                    && e.contains("timed out")
                    && e.contains("destroy it (team_destroy)"),
                "{transport:?}, call {i}: {e}"
            );
        }
        let pe1 = it
            .next()
            .unwrap()
            .unwrap_or_else(|e| panic!("{transport:?}, PE 1: {e}"));
        assert!(pe1.is_empty());
    }
}

/// A PE refused at once on a broken team runs ahead of a member that still waits out its
/// timeout in the call the PE was refused; the destroy that follows waits twice the
/// timeout on a broken team, so it meets that member (before session 41 it timed out: the
/// member reached the destroy about one timeout after the PE did).
#[test]
fn a_destroy_after_a_refused_barrier_waits_for_the_member_still_in_it() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};
    let timeout = Duration::from_secs(2);
    let mut s = settings();
    s.timeout = timeout;
    let failed = AtomicUsize::new(0);
    let out = run_threads(2, s, |pe| {
        let me = pe.my_pe();
        let pair = pe
            .team_split_strided(pe.world(), 0, 1, 2)?
            .expect("both PEs are members");
        let mut errors = Vec::new();
        if me == 0 {
            // PE 1 stays away until PE 0 has given up.
            let first = pe.team_barrier(&pair);
            assert!(
                matches!(
                    first,
                    Err(Error::WaitTimeout { .. } | Error::Timeout { .. })
                ),
                "{first:?}"
            );
            let refused = pe.team_barrier(&pair).expect_err("refused");
            assert!(matches!(refused, Error::TeamBroken { .. }), "{refused}");
            failed.store(1, SeqCst);
        } else {
            let end = Instant::now() + Duration::from_secs(30);
            while failed.load(SeqCst) == 0 {
                assert!(Instant::now() < end, "PE 0 did not fail within 30 s");
                std::thread::sleep(Duration::from_millis(2));
            }
            // PE 0 signalled before it gave up: this barrier completes; the next waits
            // for PE 0's refused one, which never signals, and times out.
            pe.team_barrier(&pair)?;
            let start = Instant::now();
            let second = pe.team_barrier(&pair);
            assert!(
                matches!(
                    second,
                    Err(Error::WaitTimeout { .. } | Error::Timeout { .. })
                ),
                "{second:?}"
            );
            assert!(start.elapsed() >= timeout, "{:?}", start.elapsed());
            errors.push(second.unwrap_err().to_string());
        }
        pe.team_destroy(pair)?;
        let fresh = pe
            .team_split_strided(pe.world(), 0, 1, 2)?
            .expect("both PEs are members");
        pe.team_barrier(&fresh)?;
        pe.team_destroy(fresh)?;
        Ok(errors)
    })
    .expect("job starts");
    for (p, r) in out.into_iter().enumerate() {
        let r = r.unwrap_or_else(|e| panic!("PE {p}: {e}"));
        assert_eq!(r.len(), p, "PE {p}: {r:?}");
    }
}

/// A hand-made source of 2^40 elements (far past the heap) is refused on every member
/// before anything is allocated for it; the team stays usable. Before 2026-12-07 the copy
/// of the source was allocated first (8 TiB), which aborted the process.
#[test]
fn a_source_far_past_the_heap_is_refused_before_any_allocation() {
    let n = 2;
    on_every_pe(n, |pe| {
        let me = pe.my_pe();
        let (src, dst) = (pe.calloc::<u64>(4)?, pe.calloc::<u64>(4 * n)?);
        let huge = SymPtr::<u64>::from_raw(src.offset(), 1 << 40);
        let r = pe.fcollect(pe.world(), dst, huge, 1 << 40);
        assert!(r.is_err(), "PE {me}: {r:?}");
        pe.put(src, &[me as u64 + 1; 4], me)?;
        pe.fcollect(pe.world(), dst, src.slice(0..1), 1)?;
        let mut got = vec![0u64; n];
        pe.get(&mut got, dst.slice(0..n), me)?;
        assert_eq!(got, (1..=n as u64).collect::<Vec<_>>(), "PE {me}");
        Ok(())
    });
}

/// A zero-sized element type is refused by every collective on every member (collect's
/// prefix sum of counts overflowed and panicked on one PE), and the team stays usable.
#[test]
fn zero_sized_elements_are_refused_by_every_collective() {
    let out = run_threads(2, settings(), |pe| {
        let team = pe.world().clone();
        let me = pe.my_pe();
        let block = pe.calloc::<u64>(1)?;
        let a = SymPtr::<[u8; 0]>::from_raw(block.offset(), usize::MAX);
        let n = if me == 0 { usize::MAX } else { 1 };
        let results = [
            ("collect", pe.collect(&team, a, a, n)),
            ("fcollect", pe.fcollect(&team, a, a, n)),
            ("broadcast", pe.broadcast(&team, a, a, n, 0)),
            ("alltoall", pe.alltoall(&team, a, a, n)),
        ];
        for (op, r) in results {
            match r {
                Err(Error::InvalidArgument(m)) if m.contains(op) && m.contains("size 0") => {}
                r => panic!("PE {me}: {op} gave {r:?}"),
            }
        }
        // Still in step: a real collective works.
        let src = pe.calloc::<u64>(1)?;
        let dst = pe.calloc::<u64>(2)?;
        pe.put(src, &[10 + me as u64], me)?;
        pe.barrier_all()?;
        pe.fcollect(&team, dst, src, 1)?;
        let mut got = [0u64; 2];
        pe.get(&mut got, dst, me)?;
        assert_eq!(got, [10, 11]);
        pe.free(dst)?;
        pe.free(src)?;
        pe.free(block)
    })
    .expect("job starts");
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}
