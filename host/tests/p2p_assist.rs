//! Target-assisted large p2p puts (host/src/assist.rs): a waiting target copies part of
//! the large puts made into its heap from a peer's heap; what it copies is accounted on
//! both sides; the switch and its automatic default; private sources are never shared.
//! (The data of assisted puts at every size class is checked by the self-test's
//! "large-puts" case, in threads, processes and over the proxy.)
use rshmem::{run_threads, AssistMode, Cmp, Error, Pe, Settings, SignalOp};
use std::time::{Duration, Instant};

const SIZE: usize = 1 << 20;

fn settings(mode: AssistMode) -> Settings {
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.symmetric_size = 16 << 20;
    s.timeout = Duration::from_secs(30);
    s.p2p_assist = mode;
    s
}

/// Word `i` of put `rep`: every byte differs between consecutive puts (splitmix64), so a
/// byte a helper failed to copy shows.
fn word(i: usize, rep: u64) -> u64 {
    let mut z = (i as u64) << 24 ^ rep;
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ z >> 30).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ z >> 27).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ z >> 31
}

/// PE 0 puts SIZE bytes from `source` (heap or a private Vec) to PE 1 until PE 1 has
/// copied part of one (or `max_puts` were made), while PE 1 waits on a signal; PE 1 then
/// checks the last put's data. Returns (puts made, each PE's stats).
fn stream(pe: &Pe, heap_source: bool, max_puts: u64) -> rshmem::Result<(u64, rshmem::AssistStats)> {
    let me = pe.my_pe();
    let words = SIZE / 8;
    let dst = pe.calloc::<u64>(words)?;
    let src = pe.calloc::<u64>(words)?;
    let sig = pe.calloc::<u64>(1)?;
    let mut private = vec![0u64; words];
    let mut puts = 0u64;
    if me == 0 {
        let own = pe.ptr(src, me).expect("own heap is mapped");
        let deadline = Instant::now() + Duration::from_secs(10);
        while puts < max_puts && pe.assist_stats().bytes_received == 0 && Instant::now() < deadline
        {
            puts += 1;
            if heap_source {
                for i in 0..words {
                    // SAFETY: element i of PE 0's own `src`, not being put right now.
                    unsafe { *own.add(i) = word(i, puts) };
                }
                // SAFETY: the whole allocation, read-only during the put.
                let from = unsafe { std::slice::from_raw_parts(own, words) };
                pe.put(dst, from, 1)?;
            } else {
                for (i, w) in private.iter_mut().enumerate() {
                    *w = word(i, puts);
                }
                pe.put(dst, &private, 1)?;
            }
        }
        pe.signal_op(sig, puts, SignalOp::Set, 1)?;
    } else if me == 1 {
        puts = pe.signal_wait_until(sig, Cmp::Ne, 0)?;
        let mut got = vec![0u64; words];
        pe.get(&mut got, dst, me)?;
        for (i, &g) in got.iter().enumerate() {
            if g != word(i, puts) {
                return Err(Error::Verification(format!(
                    "word {i} of put {puts}: {g:#x}, expected {:#x}",
                    word(i, puts)
                )));
            }
        }
    }
    pe.barrier_all()?;
    let stats = pe.assist_stats();
    pe.free(sig)?;
    pe.free(src)?;
    pe.free(dst)?;
    Ok((puts, stats))
}

fn two_pes(mode: AssistMode, heap_source: bool, max_puts: u64) -> Vec<(u64, rshmem::AssistStats)> {
    run_threads(2, settings(mode), |pe| stream(pe, heap_source, max_puts))
        .expect("job starts")
        .into_iter()
        .map(|r| r.expect("PE succeeds"))
        .collect()
}

#[test]
fn a_waiting_target_copies_part_of_large_puts_and_both_sides_account_it() {
    let r = two_pes(AssistMode::On, true, 100_000);
    let (puts, s0) = r[0];
    let s1 = r[1].1;
    assert_eq!(r[1].0, puts, "PE 1 saw the last put's number");
    assert_eq!(
        s0.puts_offered, puts,
        "every heap-sourced 1 MiB put is offered"
    );
    assert!(
        s0.bytes_received > 0,
        "PE 1 waited through {puts} puts without copying any chunk"
    );
    assert_eq!(
        s0.bytes_received, s1.bytes_given,
        "what PE 1 copied is what PE 0 counts"
    );
    assert!(s0.bytes_received < puts * SIZE as u64);
    assert_eq!(
        (s1.puts_offered, s1.bytes_received, s0.bytes_given),
        (0, 0, 0)
    );
}

/// 50 puts (their data checked by PE 1) of which none was offered or helped.
fn fifty_puts_nothing_offered(mode: AssistMode, heap_source: bool) {
    let r = two_pes(mode, heap_source, 50);
    assert_eq!(r[0].0, 50);
    for (_, s) in &r {
        assert_eq!(*s, rshmem::AssistStats::default());
    }
}

#[test]
fn off_offers_nothing_and_the_data_is_the_same() {
    fifty_puts_nothing_offered(AssistMode::Off, true);
}

#[test]
fn puts_from_private_memory_are_never_offered() {
    fifty_puts_nothing_offered(AssistMode::On, false);
}

/// The node's online CPUs, as the runtime counts them.
fn cores() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize
}

#[test]
fn auto_is_off_when_the_node_has_more_pes_than_cores() {
    let n = cores() + 1;
    let out = run_threads(n, settings(AssistMode::Auto), |pe| {
        let buf = pe.calloc::<u8>(SIZE)?;
        let src = pe.calloc::<u8>(SIZE)?;
        let own = pe.ptr(src, pe.my_pe()).expect("own heap is mapped");
        // SAFETY: this PE's own allocation, read-only during the put.
        let from = unsafe { std::slice::from_raw_parts(own, SIZE) };
        pe.put(buf, from, (pe.my_pe() + 1) % pe.n_pes())?;
        pe.barrier_all()?;
        let s = pe.assist_stats();
        pe.free(src)?;
        pe.free(buf)?;
        Ok(s)
    })
    .expect("job starts");
    for r in out {
        assert_eq!(r.expect("PE succeeds"), rshmem::AssistStats::default());
    }
}

#[test]
fn auto_is_on_with_a_core_per_pe() {
    let cores = cores();
    if cores < 2 {
        panic!("this test needs 2 CPUs (the project's machines have them); found {cores}");
    }
    let r = two_pes(AssistMode::Auto, true, 3);
    assert!(
        r[0].1.puts_offered >= 1,
        "auto with 2 PEs on {cores} CPUs offers puts"
    );
}

#[test]
fn the_switch_is_read_from_the_environment_and_bad_values_are_refused() {
    let get = |v: &'static str| move |k: &str| (k == "RSHMEM_P2P_ASSIST").then(|| v.to_string());
    assert_eq!(
        Settings::from_lookup(get("0")).unwrap().p2p_assist,
        AssistMode::Off
    );
    assert_eq!(
        Settings::from_lookup(get("1")).unwrap().p2p_assist,
        AssistMode::On
    );
    assert_eq!(
        Settings::from_lookup(get("auto")).unwrap().p2p_assist,
        AssistMode::Auto
    );
    assert_eq!(
        Settings::from_lookup(|_| None).unwrap().p2p_assist,
        AssistMode::Auto
    );
    match Settings::from_lookup(get("yes")) {
        Err(Error::Env { var, value, reason }) => {
            assert_eq!((var.as_str(), value.as_str()), ("RSHMEM_P2P_ASSIST", "yes"));
            assert!(reason.contains("auto, 1, 0"), "{reason}");
        }
        other => panic!("expected an Env error, got {other:?}"),
    }
}

/// `rshmem bench put --source`: the JSON names the source and the share of the stream the
/// target copied (0 for a private source, which is never offered); bad values are refused.
#[test]
fn bench_put_reports_its_source_and_the_assisted_share() {
    let bin = env!("CARGO_BIN_EXE_rshmem");
    let run = |source: &str| -> serde_json::Value {
        let out = std::process::Command::new(bin)
            .args([
                "bench",
                "put",
                "--min-size",
                "1M",
                "--max-size",
                "1M",
                "--iters",
                "100",
            ])
            .args(["--warmup", "10", "--source", source, "--json"])
            .env("RSHMEM_P2P_ASSIST", "1")
            .output()
            .expect("rshmem runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    };
    for source in ["heap", "private"] {
        let v = run(source);
        assert_eq!(v["source"], source);
        let row = &v["rows"][0];
        assert_eq!(row["size"].as_u64(), Some(1 << 20));
        let share = row["bw_assisted"].as_f64().expect("bw_assisted");
        if source == "private" {
            assert_eq!(share, 0.0);
        } else {
            assert!((0.0..1.0).contains(&share), "{share}");
        }
    }
    let bad = std::process::Command::new(bin)
        .args(["bench", "put", "--source", "gpu"])
        .output()
        .expect("rshmem runs");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("heap"));
}
