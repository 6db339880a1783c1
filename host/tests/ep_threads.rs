//! LL dispatch/combine with PEs as threads: EP.md's exact checks (origin-encoded payloads,
//! counts against the all-gathered routing, layout ranges, src_info, combine bit-exact and
//! calc_diff, bit-identical repeats) at 1, 2, 3, 4 and 8 PEs over the listed shapes, and
//! every invalid input failing on every PE.
use rshmem::config::TransportMode;
use rshmem::ep::{bf16, check, Buffer, Config, Dispatch, Layout};
use rshmem::{run_threads, Error, Pe, Settings};
use std::time::Duration;

#[path = "thread-pes-support/mod.rs"]
mod thread_pes;
use thread_pes::arrive_and_wait;

fn settings(timeout_ms: u64) -> Settings {
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.symmetric_size = 48 << 20;
    s.timeout = Duration::from_millis(timeout_ms);
    s
}

#[derive(Clone)]
struct Case {
    pes: usize,
    cfg: Config,
    tokens: usize,
    /// Experts tokens may choose (None = all).
    experts: Option<Vec<usize>>,
    masked_slots: usize,
    /// Token 0 has every slot -1.
    all_masked_token: bool,
    /// Slot 1 of every token repeats slot 0's expert (where slot 0 is not -1).
    repeat_ids: bool,
    hook: bool,
    zero_copy: bool,
    int32: bool,
    repeats: usize,
    /// The buffer's first LL call number (`Buffer::start_at_call_for_tests`).
    first_call: u64,
}

fn cfg(n: usize, h: usize, e: usize, k: usize, fp8: bool) -> Config {
    Config {
        num_max_dispatch_tokens_per_rank: n,
        hidden: h,
        num_experts: e,
        num_topk: k,
        use_fp8: fp8,
        round_scale: false,
    }
}

fn case(pes: usize, c: Config, tokens: usize) -> Case {
    Case {
        pes,
        cfg: c,
        tokens,
        experts: None,
        masked_slots: 3,
        all_masked_token: false,
        repeat_ids: false,
        hook: false,
        zero_copy: false,
        int32: false,
        repeats: 2,
        first_call: 0,
    }
}

/// A non-trivial expert: output = input * (1 + (e % 4) / 4), so a row sent to the wrong
/// expert or slot changes the combined result.
fn scale(e: usize) -> f32 {
    1.0 + (e % 4) as f32 * 0.25
}

fn one_pe(pe: &Pe, c: &Case) -> rshmem::Result<Vec<(u64, u64)>> {
    let team = pe.world().clone();
    let (me, n) = (team.my_pe(), team.n_pes());
    let mut buf = Buffer::new(pe, &team, c.cfg)?;
    assert_eq!(buf.layout().total_bytes, Layout::size_hint(&c.cfg, n)?);
    if c.first_call != 0 {
        buf.start_at_call_for_tests(c.first_call)?;
    }
    let mut r = check::random_routing(
        7,
        me,
        c.tokens,
        &c.cfg,
        c.experts.as_deref(),
        c.masked_slots,
    );
    if c.all_masked_token && c.tokens > 0 {
        r.topk_idx[..c.cfg.num_topk].fill(-1);
    }
    if c.repeat_ids {
        for row in r.topk_idx.chunks_mut(c.cfg.num_topk) {
            if row[0] >= 0 {
                row[1] = row[0];
            }
        }
    }
    let all = check::allgather_routing(pe, &team, &r)?;
    let masked = vec![false; n];
    let x = check::origin_x(me, c.tokens, c.cfg.hidden);
    let idx32: Vec<i32> = r.topk_idx.iter().map(|&v| v as i32).collect();
    let l = c.cfg.num_experts / n;
    let mut expert_out =
        vec![bf16::ZERO; l * n * c.cfg.num_max_dispatch_tokens_per_rank * c.cfg.hidden];
    let mut hashes = Vec::new();
    for _ in 0..c.repeats {
        let d = if c.int32 {
            buf.low_latency_dispatch(&x, &idx32, c.hook)?
        } else {
            buf.low_latency_dispatch(&x, &r.topk_idx, c.hook)?
        };
        assert_eq!(matches!(d, Dispatch::Pending(_)), c.hook);
        let out = d.wait()?;
        check::validate_dispatch(&c.cfg, me, &all, &masked, &out)?;
        let dh = check::dispatch_hash(&c.cfg, n, &out);
        let combined = if c.zero_copy {
            let zc = buf.get_next_low_latency_combine_buffer(&out.handle)?;
            check::expert_forward(&c.cfg, n, me, &out, &scale, zc);
            buf.low_latency_combine(&[], &r.topk_idx, &r.topk_weights, &out.handle, c.hook, true)?
        } else {
            check::expert_forward(&c.cfg, n, me, &out, &scale, &mut expert_out);
            buf.low_latency_combine(
                &expert_out,
                &r.topk_idx,
                &r.topk_weights,
                &out.handle,
                c.hook,
                false,
            )?
        }
        .wait()?;
        check::validate_combine(&c.cfg, n, me, &r, &masked, &scale, &combined)?;
        if c.all_masked_token && c.tokens > 0 {
            assert!(combined[..c.cfg.hidden].iter().all(|v| v.to_bits() == 0));
        }
        hashes.push((dh, check::hash_bf16(&combined)));
        buf.recycle(out);
    }
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "PE {me}: repeats differ: {hashes:?}"
    );
    buf.destroy()?;
    Ok(hashes)
}

fn run(c: Case) {
    let out = run_threads(c.pes, settings(20_000), |pe| one_pe(pe, &c)).expect("job starts");
    let errors: Vec<String> = out
        .iter()
        .enumerate()
        .filter_map(|(r, o)| o.as_ref().err().map(|e| format!("PE {r}: {e}")))
        .collect();
    assert!(
        errors.is_empty(),
        "{} PEs, {:?}:\n{}",
        c.pes,
        c.cfg,
        errors.join("\n")
    );
}

#[test]
fn one_pe_fp8_t_equals_n() {
    run(case(1, cfg(4, 256, 4, 2, true), 4));
}

#[test]
fn two_pes_bf16_hidden_2048_k1() {
    run(case(2, cfg(6, 2048, 8, 1, false), 6));
}

/// A token may name an expert more than once: each slot is sent, counted and combined
/// (DeepEP's semantics), as long as no expert gets more than N rows from one PE.
#[test]
fn three_pes_repeated_expert_ids_within_n() {
    let mut c = case(3, cfg(8, 256, 6, 3, true), 4);
    c.repeat_ids = true;
    c.masked_slots = 1;
    run(c.clone());
    c.zero_copy = true;
    run(c);
}

#[test]
fn two_pes_zero_tokens() {
    let mut c = case(2, cfg(4, 256, 8, 4, true), 0);
    c.hook = true;
    run(c);
}

#[test]
fn three_pes_fp8_hidden_7168_t_equals_n_all_masked_token() {
    let mut c = case(3, cfg(3, 7168, 9, 3, true), 3);
    c.all_masked_token = true;
    run(c);
}

#[test]
fn three_pes_bf16_hidden_2560_int32_ids() {
    let mut c = case(3, cfg(4, 2560, 6, 4, false), 2);
    c.int32 = true;
    run(c);
}

#[test]
fn four_pes_fp8_hidden_4096_experts_that_receive_nothing() {
    let mut c = case(4, cfg(4, 4096, 16, 4, true), 4);
    // Only experts 0..5 and 12 are chosen: PE 2's experts (8..12) receive nothing.
    c.experts = Some(vec![0, 1, 2, 3, 4, 5, 12]);
    run(c);
}

#[test]
fn four_pes_fp8_round_scale_hidden_5120_hook_and_zero_copy() {
    let mut c = case(4, cfg(3, 5120, 8, 8, true), 3);
    c.cfg.round_scale = true;
    c.hook = true;
    c.zero_copy = true;
    run(c);
}

#[test]
fn eight_pes_bf16_hidden_8192_k11() {
    let mut c = case(8, cfg(2, 8192, 16, 11, false), 2);
    c.masked_slots = 5;
    run(c);
}

#[test]
fn eight_pes_fp8_zero_copy_hidden_128() {
    let mut c = case(8, cfg(5, 128, 24, 6, true), 5);
    c.zero_copy = true;
    c.repeats = 3;
    run(c);
}

/// Signal words carry the call's tag in 32 bits: calls go on across the point where it
/// wraps (call 2^32 - 1 is the last before it; the tag cut to 32 bits stopped every wait
/// from matching there), with hooks and zero copy, every call checked.
#[test]
fn three_pes_calls_across_the_tag_wrap() {
    for (hook, zero_copy) in [(false, false), (true, true)] {
        run(Case {
            repeats: 5,
            hook,
            zero_copy,
            first_call: (1 << 32) - 6,
            ..case(3, cfg(8, 256, 6, 3, true), 7)
        });
    }
}

/// A receive hook dropped without `recv` (an early `?`, neglect) still receives and
/// releases its buffer set: the calls after it, on both sets, go on and validate. Before,
/// the set stayed busy for good ("call its receive hook", which no longer existed) and the
/// peers timed out waiting for this PE's credit.
#[test]
fn a_dropped_receive_hook_releases_its_buffer_set() {
    let c = cfg(4, 256, 8, 2, true);
    let out = run_threads(2, settings(20_000), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, c)?;
        let r = check::random_routing(3, me, 4, &c, None, 1);
        let all = check::allgather_routing(pe, &team, &r)?;
        let x = check::origin_x(me, 4, 256);
        let m = vec![false; 2];
        // Call 0 (set 0): dispatch hook dropped. Call 1 (set 1): dispatch, whose combine
        // hook (call 2, set 0 again: only possible if call 0 released it) is dropped too.
        drop(buf.low_latency_dispatch(&x, &r.topk_idx, true)?);
        let o = buf.low_latency_dispatch(&x, &r.topk_idx, true)?.wait()?;
        check::validate_dispatch(&c, me, &all, &m, &o)?;
        let mut e = vec![bf16::ZERO; 4 * 2 * 4 * 256];
        check::expert_forward(&c, 2, me, &o, &scale, &mut e);
        drop(buf.low_latency_combine(&e, &r.topk_idx, &r.topk_weights, &o.handle, true, false)?);
        // Calls 3 to 6 run on both sets after the drops.
        for _ in 0..2 {
            let o = buf.low_latency_dispatch(&x, &r.topk_idx, true)?.wait()?;
            check::validate_dispatch(&c, me, &all, &m, &o)?;
            check::expert_forward(&c, 2, me, &o, &scale, &mut e);
            let y = buf
                .low_latency_combine(&e, &r.topk_idx, &r.topk_weights, &o.handle, true, false)?
                .wait()?;
            check::validate_combine(&c, 2, me, &r, &m, &scale, &y)?;
        }
        buf.destroy()
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}

/// A receive hook that outlives its buffer (destroyed on every PE) is refused, and its
/// drop touches nothing (the memory is freed and may be reused).
#[test]
fn a_hook_that_outlives_its_buffer_is_refused() {
    let c = cfg(4, 256, 8, 2, true);
    let out = run_threads(2, settings(20_000), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, c)?;
        let r = check::random_routing(4, me, 4, &c, None, 1);
        let x = check::origin_x(me, 4, 256);
        let d = buf.low_latency_dispatch(&x, &r.topk_idx, true)?;
        let late = buf.low_latency_dispatch(&x, &r.topk_idx, true)?;
        buf.destroy()?;
        // The freed memory goes to a new allocation, which the dropped hook must not touch.
        let fresh = pe.calloc::<u64>(1 << 16)?;
        let e = d.wait().err().map(|e| e.to_string());
        drop(late);
        pe.barrier_all()?;
        let mut words = vec![1u64; 1 << 16];
        pe.get(&mut words, fresh, me)?;
        pe.free(fresh)?;
        Ok((e, words.iter().all(|&w| w == 0)))
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        let (e, clean) = o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
        let e = e.expect("refused");
        assert!(
            e.contains("the receive hook of LL call #0 outlived its buffer"),
            "PE {r}: {e}"
        );
        assert!(clean, "PE {r}: the dropped hook wrote into freed memory");
    }
}

/// A receive hook running on another thread when its buffer is destroyed: destroy waits
/// for it to finish (bounded by its own wait) before freeing the memory it reads and the
/// peers' words it writes. PE 1 makes no call and destroys late, so PE 0's hook waits out
/// its timeout; before, PE 0's destroy freed at once under the receiving hook and then
/// waited for PE 1's free past its own timeout.
#[test]
fn destroy_waits_for_a_hook_receiving_on_another_thread() {
    let c = cfg(4, 256, 8, 2, true);
    let timeout = Duration::from_millis(1500);
    let out = run_threads(2, settings(timeout.as_millis() as u64), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, c)?;
        if me == 1 {
            // Past PE 0's hook timeout, within its destroy's wait after it.
            std::thread::sleep(timeout + Duration::from_millis(500));
            return buf.destroy().map(|()| None);
        }
        let r = check::random_routing(4, me, 4, &c, None, 1);
        let x = check::origin_x(me, 4, 256);
        let Dispatch::Pending(hook) = buf.low_latency_dispatch(&x, &r.topk_idx, true)? else {
            panic!("a hook was asked for");
        };
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let b = s.spawn(|| {
                let r = hook.recv();
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                r.err().map(|e| e.to_string())
            });
            std::thread::sleep(Duration::from_millis(100));
            let d = buf.destroy();
            let finished_first = done.load(std::sync::atomic::Ordering::SeqCst);
            let e = b.join().unwrap();
            d.map(|()| Some((finished_first, e)))
        })
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        let o = o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
        if r == 0 {
            let (finished_first, e) = o.expect("PE 0 reports");
            assert!(
                finished_first,
                "destroy returned while the hook was receiving"
            );
            let e = e.expect("the hook's wait for PE 1 timed out");
            assert!(e.contains("PE 1"), "{e}");
        }
    }
}

#[test]
fn two_calls_in_flight_with_hooks_and_a_third_refused() {
    let c = cfg(4, 256, 8, 2, true);
    let out = run_threads(2, settings(20_000), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, c)?;
        let ra = check::random_routing(1, me, 4, &c, None, 1);
        let rb = check::random_routing(2, me, 3, &c, None, 0);
        let (alla, allb) = (
            check::allgather_routing(pe, &team, &ra)?,
            check::allgather_routing(pe, &team, &rb)?,
        );
        let (xa, xb) = (check::origin_x(me, 4, 256), check::origin_x(me, 3, 256));
        let ha = buf.low_latency_dispatch(&xa, &ra.topk_idx, true)?;
        let hb = buf.low_latency_dispatch(&xb, &rb.topk_idx, true)?;
        let third = buf.low_latency_dispatch(&xa, &ra.topk_idx, true).err();
        // Receive in reverse order: B, then A.
        let ob = hb.wait()?;
        let oa = ha.wait()?;
        let m = vec![false; 2];
        check::validate_dispatch(&c, me, &alla, &m, &oa)?;
        check::validate_dispatch(&c, me, &allb, &m, &ob)?;
        let mut ea = vec![bf16::ZERO; 4 * 2 * 4 * 256];
        let mut eb = ea.clone();
        check::expert_forward(&c, 2, me, &oa, &scale, &mut ea);
        check::expert_forward(&c, 2, me, &ob, &scale, &mut eb);
        let ca =
            buf.low_latency_combine(&ea, &ra.topk_idx, &ra.topk_weights, &oa.handle, true, false)?;
        let cb =
            buf.low_latency_combine(&eb, &rb.topk_idx, &rb.topk_weights, &ob.handle, true, false)?;
        let (ya, yb) = (ca.wait()?, cb.wait()?);
        check::validate_combine(&c, 2, me, &ra, &m, &scale, &ya)?;
        check::validate_combine(&c, 2, me, &rb, &m, &scale, &yb)?;
        Ok(third.map(|e| e.to_string()))
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        let msg = o
            .unwrap_or_else(|e| panic!("PE {r}: {e}"))
            .expect("third call refused");
        assert!(
            msg.contains("call its receive hook") && msg.contains("#0"),
            "{msg}"
        );
    }
}

/// Two dispatches in flight with hooks, then PE 0 combines with the first one's handle and
/// PE 1 with the second's (each with that dispatch's own routing). The routings send each
/// owner as many rows in both dispatches, so the row counts agree: the handle mark of the
/// combine flag is what tells, on both PEs, over the message path and the direct
/// (zero-copy) path. Before, PE 0 summed rows laid out for the other routing.
#[test]
fn combining_with_handles_of_different_dispatches_fails_on_every_pe() {
    let c = cfg(4, 256, 2, 1, false);
    for zero_copy in [false, true] {
        let errs = errors(2, 20_000, |pe| {
            let team = pe.world().clone();
            let me = team.my_pe();
            let mut buf = Buffer::new(pe, &team, c)?;
            let routing = |ids: [i64; 4]| check::Routing {
                num_tokens: 4,
                topk_idx: ids.to_vec(),
                topk_weights: vec![1.0; 4],
            };
            // Two rows to each expert (one per PE) in both dispatches, on both PEs.
            let (ra, rb) = match me {
                0 => (routing([0, 1, 1, 0]), routing([1, 0, 0, 1])),
                _ => (routing([0, 1, 0, 1]), routing([1, 0, 1, 0])),
            };
            let x = check::origin_x(me, 4, 256);
            let ha = buf.low_latency_dispatch(&x, &ra.topk_idx, true)?;
            let hb = buf.low_latency_dispatch(&x, &rb.topk_idx, true)?;
            let (oa, ob) = (ha.wait()?, hb.wait()?);
            let (r, o) = if me == 0 { (&ra, &oa) } else { (&rb, &ob) };
            let mut e = vec![bf16::ZERO; 2 * 4 * 256];
            if zero_copy {
                let zc = buf.get_next_low_latency_combine_buffer(&o.handle)?;
                check::expert_forward(&c, 2, me, o, &scale, zc);
                e.clear();
            } else {
                check::expert_forward(&c, 2, me, o, &scale, &mut e);
            }
            buf.low_latency_combine(&e, &r.topk_idx, &r.topk_weights, &o.handle, true, zero_copy)?
                .wait()
                .map(drop)
        });
        for (me, e) in errs.iter().enumerate() {
            let other = 1 - me;
            let msg = e.to_string();
            assert!(
                msg.contains(&format!(
                    "PE {other} combined with the handle of another dispatch"
                )) && msg.contains("every PE must pass the handle of the same dispatch"),
                "zero copy {zero_copy}, PE {me}: {msg}"
            );
        }
    }
}

#[test]
fn masked_pe_is_skipped_and_its_experts_contribute_nothing() {
    let c = cfg(4, 256, 6, 3, false);
    let out = run_threads(3, settings(20_000), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, c)?;
        let r = check::random_routing(3, me, 4, &c, None, 0);
        let all = check::allgather_routing(pe, &team, &r)?;
        if me == 2 {
            return Ok(()); // never calls dispatch: masked by the others
        }
        buf.update_mask(2, true)?;
        assert_eq!(buf.query_mask(), vec![false, false, true]);
        let m = buf.query_mask();
        let x = check::origin_x(me, 4, 256);
        for _ in 0..2 {
            let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
            check::validate_dispatch(&c, me, &all, &m, &o)?;
            let mut e = vec![bf16::ZERO; 2 * 3 * 4 * 256];
            check::expert_forward(&c, 3, me, &o, &scale, &mut e);
            let y = buf
                .low_latency_combine(&e, &r.topk_idx, &r.topk_weights, &o.handle, false, false)?
                .wait()?;
            check::validate_combine(&c, 3, me, &r, &m, &scale, &y)?;
        }
        buf.clean_mask();
        assert_eq!(buf.query_mask(), vec![false; 3]);
        Ok(())
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}

/// One LL round trip (dispatch + combine) checked against the routing with `mask`;
/// `mode` 1 uses receive hooks, 2 the zero-copy combine buffer, others neither.
#[allow(clippy::too_many_arguments)]
fn round_trip(
    buf: &mut Buffer,
    c: &Config,
    n: usize,
    me: usize,
    r: &check::Routing,
    all: &[check::Routing],
    mask: &[bool],
    mode: usize,
) -> rshmem::Result<()> {
    let hook = mode == 1;
    let x = check::origin_x(me, r.num_tokens, c.hidden);
    let o = buf.low_latency_dispatch(&x, &r.topk_idx, hook)?.wait()?;
    check::validate_dispatch(c, me, all, mask, &o)?;
    let y = if mode == 2 {
        let zc = buf.get_next_low_latency_combine_buffer(&o.handle)?;
        check::expert_forward(c, n, me, &o, &scale, zc);
        buf.low_latency_combine(&[], &r.topk_idx, &r.topk_weights, &o.handle, hook, true)?
    } else {
        let l = c.num_experts / n;
        let mut e = vec![bf16::ZERO; l * n * c.num_max_dispatch_tokens_per_rank * c.hidden];
        check::expert_forward(c, n, me, &o, &scale, &mut e);
        buf.low_latency_combine(&e, &r.topk_idx, &r.topk_weights, &o.handle, hook, false)?
    }
    .wait()?;
    check::validate_combine(c, n, me, r, mask, &scale, &y).map(|_| ())
}

/// A buffer on `team` (shrink mode as given), this PE's routing of `tokens` tokens, every
/// member's routing, and a first round trip with nothing masked.
fn started_buffer<'p>(
    pe: &'p Pe,
    team: &rshmem::Team,
    c: Config,
    shrink: bool,
    (seed, tokens, masked_slots): (u64, usize, usize),
) -> rshmem::Result<(Buffer<'p>, check::Routing, Vec<check::Routing>)> {
    let (me, n) = (team.my_pe(), team.n_pes());
    let mut buf = Buffer::new(pe, team, c)?;
    buf.set_shrink(shrink);
    let r = check::random_routing(seed, me, tokens, &c, None, masked_slots);
    let all = check::allgather_routing(pe, team, &r)?;
    round_trip(&mut buf, &c, n, me, &r, &all, &vec![false; n], 0)?;
    Ok((buf, r, all))
}

/// EP groups of a split: 5 PEs as two strided teams, {0, 2, 4} and {1, 3} (different
/// sizes, so different layouts), each with its own buffer created at the same time; every
/// round trip exact against its own team's routing, over p2p and the soft HCA.
#[test]
fn buffers_on_two_teams_of_a_split() {
    for transport in [TransportMode::Auto, TransportMode::Proxy] {
        let mut st = settings(20_000);
        st.transport = transport;
        let c = cfg(6, 256, 6, 3, true);
        let out = run_threads(5, st, |pe| {
            let world = pe.world().clone();
            let even = pe.team_split_strided(&world, 0, 2, 3)?;
            let odd = pe.team_split_strided(&world, 1, 2, 2)?;
            let team = even.or(odd).expect("every PE is in one of the two teams");
            let (me, n) = (team.my_pe(), team.n_pes());
            assert_eq!(n, if pe.my_pe() % 2 == 0 { 3 } else { 2 });
            let mut buf = Buffer::new(pe, &team, c)?;
            assert_eq!(buf.layout().total_bytes, Layout::size_hint(&c, n)?);
            let r = check::random_routing(23 + pe.my_pe() as u64 % 2, me, 6, &c, None, 1);
            let all = check::allgather_routing(pe, &team, &r)?;
            for mode in 0..3 {
                round_trip(&mut buf, &c, n, me, &r, &all, &vec![false; n], mode)?;
            }
            buf.destroy()
        })
        .unwrap();
        for (r, o) in out.into_iter().enumerate() {
            o.unwrap_or_else(|e| panic!("{transport:?}, PE {r}: {e}"));
        }
    }
}

/// Shrink mode on EP groups: 4 PEs as {0, 1} and {2, 3}; PE 3 dies. PE 2 masks it and
/// goes on alone. PEs 0 and 1 (the other group) have nothing to mask: the death fails
/// their RMA until they tolerate it (`Pe::tolerate_death`), then their calls go on, exact,
/// with nothing masked.
#[test]
fn shrink_in_one_group_and_a_death_in_another() {
    let c = cfg(4, 128, 4, 2, false);
    let (past, left) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    let out = run_threads(4, settings(20_000), |pe| {
        let world = pe.world().clone();
        let low = pe.team_split_strided(&world, 0, 1, 2)?;
        let high = pe.team_split_strided(&world, 2, 1, 2)?;
        let team = low.or(high).expect("in one group");
        let (me, n) = (team.my_pe(), team.n_pes());
        let (mut buf, r, all) = started_buffer(pe, &team, c, true, (31, 4, 0))?;
        let probe = pe.calloc::<u64>(1)?;
        pe.barrier_all()?;
        arrive_and_wait(&past, 4);
        match pe.my_pe() {
            3 => return Err(Error::Verification("PE 3 leaves".into())),
            2 => {
                let alone = (|| {
                    for mode in 0..3 {
                        round_trip(&mut buf, &c, n, me, &r, &all, &[false, true], mode)?;
                    }
                    Ok(buf.query_mask())
                })();
                arrive_and_wait(&left, 3);
                assert_eq!(alone?, vec![false, true]);
                return Ok(());
            }
            _ => {}
        }
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while pe.dead_pes().is_empty() {
            assert!(
                std::time::Instant::now() < end,
                "PE 3's death was not reported"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let partner = team.world_pe(1 - me).expect("two members");
        match pe.p(probe, 1, partner) {
            Err(Error::PeerDied { pe: 3, .. }) => {}
            other => panic!("PE {}: {other:?}", pe.my_pe()),
        }
        pe.tolerate_death(3)?;
        let went_on = (|| {
            for mode in 0..3 {
                round_trip(&mut buf, &c, n, me, &r, &all, &[false; 2], mode)?;
            }
            Ok(buf.query_mask())
        })();
        arrive_and_wait(&left, 3);
        assert_eq!(went_on?, vec![false; 2]);
        Ok(())
    })
    .unwrap();
    for (r, o) in out.iter().enumerate() {
        match (r, o) {
            (3, Err(Error::Verification(_))) => {}
            (_, Err(Error::PeerDied { pe: 3, .. })) => {} // finalize needs PE 3
            other => panic!("{other:?}"),
        }
    }
}

/// A config that differs inside one team fails on every PE of the job, the other team's
/// included (allocation is world-collective, so no PE may be left waiting).
#[test]
fn a_mismatch_in_one_team_fails_every_pe() {
    let errs = errors(4, 5_000, |pe| {
        let world = pe.world().clone();
        let low = pe.team_split_strided(&world, 0, 1, 2)?;
        let high = pe.team_split_strided(&world, 2, 1, 2)?;
        let team = low.or(high).expect("in one team");
        let hidden = if pe.my_pe() == 3 { 256 } else { 128 };
        Buffer::new(pe, &team, cfg(4, hidden, 4, 2, false)).map(|_| ())
    });
    for (r, e) in errs.iter().enumerate() {
        let msg = e.to_string();
        if r >= 2 {
            assert!(
                matches!(e, Error::CollectiveMismatch { .. }),
                "PE {r}: {msg}"
            );
        } else {
            assert!(
                msg.contains("PE 2 failed to create its buffer"),
                "PE {r}: {msg}"
            );
        }
    }
}

/// Shrink mode with a PE that really dies between two calls (its thread drops its Pe
/// without finalize, so the bootstrap root reports it dead, as for a killed process):
/// every survivor's next calls complete without it, exact against the routing with it
/// masked, the mask shows it, and the runtime lists it dead. Without shrink mode the
/// same death fails the survivors' call naming the PE.
#[test]
fn shrink_masks_a_pe_that_died_and_the_others_go_on() {
    shrink_after_death(TransportMode::Auto, false);
}

/// The same through the soft HCA, executing against node-local memory.
#[test]
fn shrink_masks_a_pe_that_died_over_the_proxy() {
    shrink_after_death(TransportMode::Proxy, false);
}

/// The same through the soft HCA's libfabric backend: the PE threads share one endpoint
/// (and one connection to themselves), which the leaving PE must not break for the others.
#[test]
fn shrink_masks_a_pe_that_died_over_the_fabric_backend() {
    shrink_after_death(TransportMode::Proxy, true);
}

fn shrink_after_death(transport: TransportMode, fabric: bool) {
    let mut st = settings(20_000);
    st.transport = transport;
    st.proxy_fabric = fabric;
    for shrink in [true, false] {
        let c = cfg(8, 256, 8, 3, true);
        let done = std::sync::Mutex::new(Vec::new());
        let (past, left) = (
            std::sync::atomic::AtomicUsize::new(0),
            std::sync::atomic::AtomicUsize::new(0),
        );
        let out = run_threads(4, st.clone(), |pe| {
            let me = pe.my_pe();
            let (mut buf, r, all) = started_buffer(pe, pe.world(), c, shrink, (11, 8, 1))?;
            // Every PE has received the first call (PE 3's last puts included: a PE that
            // dies loses what it had not sent yet) before PE 3 leaves.
            pe.barrier_all()?;
            arrive_and_wait(&past, 4);
            if me == 3 {
                return Err(Error::Verification("PE 3 leaves (dies)".into()));
            }
            let mask = [false, false, false, true];
            // With receive hooks, the zero-copy combine buffer, plain.
            for mode in [1, 2, 0] {
                round_trip(&mut buf, &c, 4, me, &r, &all, &mask, mode)?;
            }
            assert_eq!(buf.query_mask(), mask.to_vec(), "PE {me}");
            assert_eq!(pe.dead_pes(), vec![3], "PE {me}");
            done.lock().unwrap().push(me);
            arrive_and_wait(&left, 3);
            Ok(())
        })
        .unwrap();
        for (r, o) in out.iter().enumerate().take(3) {
            // Survivors: finalize needs every PE, so it reports the death.
            match o {
                Err(Error::PeerDied { pe: 3, .. }) => {}
                other => panic!("{transport:?} fabric {fabric} shrink {shrink}, PE {r}: {other:?}"),
            }
        }
        let mut done = done.into_inner().unwrap();
        done.sort();
        if shrink {
            assert_eq!(done, vec![0, 1, 2], "survivors that finished 3 more calls");
        } else {
            assert!(
                done.is_empty(),
                "without shrink the calls must fail: {done:?}"
            );
        }
    }
}

/// Shrink mode, a PE the caller masked dies between a dispatch and its combine: the
/// combine's only signal is to this PE itself (its own rows, summed in place), which
/// reports the untolerated death; shrink mode tolerates it and the combine completes, as
/// every other step does (a review found the own signal outside that path, 2026-12-07).
#[test]
fn shrink_a_masked_pe_that_dies_before_the_combine() {
    let c = cfg(8, 256, 4, 2, true);
    let (past, died) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    let combined = std::sync::atomic::AtomicBool::new(false);
    let out = run_threads(2, settings(20_000), |pe| {
        let me = pe.my_pe();
        let (mut buf, r, all) = started_buffer(pe, pe.world(), c, true, (13, 8, 0))?;
        pe.barrier_all()?;
        arrive_and_wait(&past, 2);
        if me == 1 {
            // Leaves once PE 0 has dispatched without it.
            arrive_and_wait(&died, 2);
            return Err(Error::Verification("PE 1 leaves (dies)".into()));
        }
        buf.update_mask(1, true)?;
        let mask = [false, true];
        let x = check::origin_x(0, r.num_tokens, c.hidden);
        let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
        check::validate_dispatch(&c, 0, &all, &mask, &o)?;
        arrive_and_wait(&died, 2);
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while pe.dead_pes() != vec![1] {
            assert!(
                std::time::Instant::now() < end,
                "PE 1's death not seen within 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let mut e = vec![bf16::ZERO; 2 * 2 * 8 * 256];
        check::expert_forward(&c, 2, 0, &o, &scale, &mut e);
        let y = buf
            .low_latency_combine(&e, &r.topk_idx, &r.topk_weights, &o.handle, false, false)?
            .wait()?;
        check::validate_combine(&c, 2, 0, &r, &mask, &scale, &y)?;
        combined.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    // PE 0's finalize needs PE 1, so it reports the death; the combine before it passed.
    match &out[0] {
        Err(Error::PeerDied { pe: 1, .. }) => {}
        other => panic!("PE 0: {other:?}"),
    }
    assert!(
        combined.load(std::sync::atomic::Ordering::SeqCst),
        "PE 0's combine failed: {:?}",
        out[0]
    );
}

/// Shrink mode with a PE that is alive but stops calling: the others' waits time out
/// (RSHMEM_TIMEOUT_MS), mask it, and their calls complete without it; clean_mask
/// unmasks it. No death is reported.
#[test]
fn shrink_masks_a_pe_that_stops_answering() {
    let c = cfg(4, 128, 4, 2, false);
    let finished = std::sync::atomic::AtomicUsize::new(0);
    // 2 s (the test waits it out about twice): the working PEs' waits for each other are
    // bounded by it too, and a shorter bound could mask a PE descheduled under load.
    let out = run_threads(4, settings(2_000), |pe| {
        let me = pe.my_pe();
        let (mut buf, r, all) = started_buffer(pe, pe.world(), c, true, (5, 4, 0))?;
        if me == 1 {
            // Hangs (from the others' view) until they are done, then leaves cleanly.
            let end = std::time::Instant::now() + Duration::from_secs(30);
            while finished.load(std::sync::atomic::Ordering::SeqCst) < 3 {
                assert!(std::time::Instant::now() < end, "the others never finished");
                std::thread::sleep(Duration::from_millis(5));
            }
            return Ok(());
        }
        let mask = [false, true, false, false];
        for mode in [2, 0, 1] {
            round_trip(&mut buf, &c, 4, me, &r, &all, &mask, mode)?;
        }
        assert_eq!(buf.query_mask(), mask.to_vec(), "PE {me}");
        assert!(pe.dead_pes().is_empty(), "PE {me}: {:?}", pe.dead_pes());
        buf.clean_mask();
        assert_eq!(buf.query_mask(), vec![false; 4]);
        finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}

/// Two PEs stop answering at once: the first timeout masks both (the other one had the
/// same full timeout to answer), instead of one full timeout each, one after the other.
#[test]
fn shrink_masks_every_silent_pe_after_one_timeout() {
    let c = cfg(4, 128, 4, 2, false);
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let timeout = Duration::from_millis(1500);
    let out = run_threads(4, settings(timeout.as_millis() as u64), |pe| {
        let me = pe.my_pe();
        let (mut buf, r, all) = started_buffer(pe, pe.world(), c, true, (9, 4, 0))?;
        if me == 1 || me == 2 {
            let end = std::time::Instant::now() + Duration::from_secs(30);
            while finished.load(std::sync::atomic::Ordering::SeqCst) < 2 {
                assert!(std::time::Instant::now() < end, "the others never finished");
                std::thread::sleep(Duration::from_millis(5));
            }
            return Ok(());
        }
        let mask = [false, true, true, false];
        let t0 = std::time::Instant::now();
        round_trip(&mut buf, &c, 4, me, &r, &all, &mask, 0)?;
        // One timeout and the round trip's own work; two timeouts before.
        let took = t0.elapsed();
        assert!(took < 2 * timeout, "PE {me}: {took:?}");
        assert_eq!(buf.query_mask(), mask.to_vec(), "PE {me}");
        round_trip(&mut buf, &c, 4, me, &r, &all, &mask, 1)?;
        finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}

/// A PE masked by a timeout (it stalled) that dies afterwards: its death, reported in a
/// later call's wait, is tolerated and the calls go on (it failed the call and broke the
/// buffer before: the PE was already masked, so the death was not "new").
#[test]
fn shrink_a_pe_masked_by_a_timeout_that_dies_later() {
    let c = cfg(4, 128, 6, 2, false);
    let timeout = Duration::from_millis(1000);
    let done = std::sync::Mutex::new(Vec::new());
    // The survivors make the same number of calls: PE 0 sets it once PE 2's death is well
    // past, a few calls ahead of where it is (the other can be at most two calls ahead).
    let stop_at = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let out = run_threads(3, settings(timeout.as_millis() as u64), |pe| {
        let me = pe.my_pe();
        let (mut buf, r, all) = started_buffer(pe, pe.world(), c, true, (21, 4, 0))?;
        if me == 2 {
            // Stalls past the others' timeout, then leaves without finalize (a death).
            std::thread::sleep(timeout + Duration::from_millis(700));
            return Err(Error::Verification("PE 2 leaves (dies)".into()));
        }
        let mask = [false, false, true];
        let t0 = std::time::Instant::now();
        let mut trips = 0;
        // Until well after PE 2's death was reported, so that some wait meets it.
        while trips < stop_at.load(std::sync::atomic::Ordering::SeqCst) {
            if me == 0 && trips >= 5 && t0.elapsed() >= 3 * timeout {
                let _ = stop_at.compare_exchange(
                    usize::MAX,
                    trips + 10,
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                );
            }
            if let Err(e) = round_trip(&mut buf, &c, 3, me, &r, &all, &mask, trips % 3) {
                return Err(Error::Verification(format!(
                    "round trip {trips} (mode {}) at {:?}, mask {:?}, dead {:?}: {e}",
                    trips % 3,
                    t0.elapsed(),
                    buf.query_mask(),
                    pe.dead_pes()
                )));
            }
            trips += 1;
        }
        assert_eq!(buf.query_mask(), mask.to_vec(), "PE {me}");
        assert_eq!(pe.dead_pes(), vec![2], "PE {me}");
        done.lock().unwrap().push(me);
        Ok(())
    })
    .unwrap();
    for (r, o) in out.iter().enumerate().take(2) {
        // Finalize needs every PE, so it reports the death.
        match o {
            Err(Error::PeerDied { pe: 2, .. }) => {}
            other => panic!("PE {r}: {other:?}"),
        }
    }
    let mut done = done.into_inner().unwrap();
    done.sort();
    assert_eq!(done, vec![0, 1], "survivors that went on after the death");
}

/// Runs `f` on `n` PEs and returns each PE's error text (panics if a PE succeeded).
fn errors(n: usize, timeout_ms: u64, f: impl Fn(&Pe) -> rshmem::Result<()> + Sync) -> Vec<Error> {
    run_threads(n, settings(timeout_ms), |pe| match f(pe) {
        Ok(()) => Err(Error::Verification(format!("PE {} succeeded", pe.my_pe()))),
        Err(e) => Ok(e),
    })
    .unwrap()
    .into_iter()
    .enumerate()
    .map(|(r, o)| o.unwrap_or_else(|e| panic!("PE {r}: expected an error, {e}")))
    .collect()
}

#[test]
fn invalid_configs_fail_on_every_pe() {
    for (c, n, msg) in [
        (
            cfg(4, 256, 8, 12, true),
            2,
            "num_topk (12) must be in 1..=11",
        ),
        (
            cfg(4, 256, 8, 2, true),
            3,
            "must be a positive multiple of the team size (3)",
        ),
        (cfg(4, 200, 8, 2, true), 2, "must be a multiple of 128"),
        (cfg(4, 64, 8, 2, true), 2, "must be a multiple of 128"),
        (
            cfg(0, 256, 8, 2, false),
            2,
            "num_max_dispatch_tokens_per_rank must be in",
        ),
    ] {
        for e in errors(n, 20_000, |pe| Buffer::new(pe, pe.world(), c).map(|_| ())) {
            assert!(e.to_string().contains(msg), "{c:?}: {e}");
        }
        assert!(c.validate(n).is_err() && Layout::size_hint(&c, n).is_err());
    }
}

#[test]
fn mismatched_configs_fail_on_every_pe_naming_each_config() {
    for e in errors(3, 20_000, |pe| {
        let h = if pe.my_pe() == 1 { 512 } else { 256 };
        Buffer::new(pe, pe.world(), cfg(4, h, 6, 2, true)).map(|_| ())
    }) {
        let m = e.to_string();
        assert!(matches!(e, Error::CollectiveMismatch { .. }), "{m}");
        assert!(
            m.contains("PE 0: N=4 H=256 E=6 K=2 fp8") && m.contains("PE 1: N=4 H=512"),
            "{m}"
        );
    }
}

/// PE `bad` passes `input`, the others valid input; every PE fails the call, then the
/// buffer still works.
fn bad_dispatch(bad: usize, input: fn(&mut Vec<i64>, &mut Vec<bf16>), own: &str, peer: &str) {
    let c = cfg(4, 128, 6, 2, true);
    let out = run_threads(3, settings(20_000), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, c)?;
        let r = check::random_routing(5, me, 4, &c, None, 0);
        let mut idx = r.topk_idx.clone();
        let mut x = check::origin_x(me, 4, 128);
        if me == bad {
            input(&mut idx, &mut x);
        }
        let e = match buf.low_latency_dispatch(&x, &idx, false) {
            Ok(d) => d.wait().err(),
            Err(e) => Some(e),
        };
        // The buffer is still usable afterwards.
        let all = check::allgather_routing(pe, &team, &r)?;
        let x = check::origin_x(me, 4, 128);
        let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
        check::validate_dispatch(&c, me, &all, &[false; 3], &o)?;
        Ok(e)
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        let e = o
            .unwrap_or_else(|e| panic!("PE {r}: {e}"))
            .expect("the call fails");
        let m = e.to_string();
        if r == bad {
            assert!(
                matches!(e, Error::InvalidArgument(_)) && m.contains(own),
                "PE {r}: {m}"
            );
        } else {
            assert!(
                matches!(e, Error::EpPeerFailed { peer, .. } if peer == bad) && m.contains(peer),
                "PE {r}: {m}"
            );
        }
    }
}

#[test]
fn more_tokens_than_n_fail_on_every_pe() {
    bad_dispatch(
        1,
        |idx, x| {
            idx.extend([0, 1]);
            x.extend(check::origin_x(1, 1, 128));
        },
        "5 tokens exceed num_max_dispatch_tokens_per_rank = 4",
        "it passed 5 tokens, more than num_max_dispatch_tokens_per_rank = 4",
    );
}

#[test]
fn expert_id_too_large_fails_on_every_pe() {
    bad_dispatch(
        0,
        |idx, _| idx[3] = 6,
        "topk_idx[1][1] = 6 is outside [-1, 6)",
        "topk_idx[1][1] is outside [-1, 6)",
    );
}

#[test]
fn expert_id_below_minus_one_fails_on_every_pe() {
    bad_dispatch(
        2,
        |idx, _| idx[4] = -2,
        "topk_idx[2][0] = -2 is outside",
        "topk_idx[2][0] is outside",
    );
}

/// Repeated ids that would send one expert more than N = 4 rows from one PE (they would
/// overrun its rows for that PE): every token names expert 0 twice, and the fifth entry
/// naming it, topk_idx[2][0], is refused on every PE.
#[test]
fn an_expert_named_more_than_n_times_fails_on_every_pe() {
    bad_dispatch(
        1,
        |idx, _| idx.fill(0),
        "topk_idx[2][0] names expert 0 once more than allowed (5 times so far)",
        "its topk_idx[2][0] names an expert 5 times, more rows than \
         num_max_dispatch_tokens_per_rank = 4 allows",
    );
}

#[test]
fn timeout_names_the_pe_and_expert_waited_for() {
    let c = cfg(2, 128, 4, 1, false);
    // 2 s: the bound every wait of the test has, the barrier's and the setup's too, so
    // it must outlast a PE thread descheduled on a loaded machine.
    let arrived = std::sync::atomic::AtomicUsize::new(0);
    let out = run_threads(2, settings(2_000), |pe| {
        let mut buf = Buffer::new(pe, pe.world(), c)?;
        let r = if pe.my_pe() == 0 {
            let x = check::origin_x(0, 1, 128);
            let e = buf
                .low_latency_dispatch(&x, &[0i64], false)
                .and_then(|d| d.wait())
                .err();
            // The failed call broke the buffer: the next one says so (not "call its
            // receive hook", which the failed call's pending set would have said).
            let again = buf.low_latency_dispatch(&x, &[0i64], false).err();
            let msg = again.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                msg.contains("this EP buffer is unusable since LL call #0 failed: ")
                    && msg.contains("timed out"),
                "{msg}"
            );
            arrive_and_wait(&arrived, 2);
            e
        } else {
            // PE 1 never dispatches: it waits, outside rshmem, until PE 0 has timed out.
            arrive_and_wait(&arrived, 2);
            None
        };
        pe.barrier_all()?;
        Ok(r)
    })
    .unwrap();
    let e = out[0].as_ref().unwrap().as_ref().expect("PE 0 times out");
    match e {
        Error::EpTimeout {
            pe: 0,
            peer: 1,
            expert: Some(0),
            op: "low_latency_dispatch",
            ..
        } => {}
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("expert 0"), "{e}");
}

/// PE 0 dispatches where PE 1 combines (LL call #1): each wait runs out, and each error
/// says that the peer made the other kind of call. Both sends go out before either PE
/// waits (hooks, then a barrier), so the words are there when the waits give up.
#[test]
fn a_peer_that_made_the_other_kind_of_call_is_named() {
    let c = cfg(2, 128, 4, 1, false);
    // 2 s, as in the test above: the setup's waits are bounded by it too.
    let out = run_threads(2, settings(2_000), |pe| {
        let me = pe.my_pe();
        let mut buf = Buffer::new(pe, pe.world(), c)?;
        let x = check::origin_x(me, 1, 128);
        let idx = [(2 * me) as i64]; // each PE's token to its own first expert
        let d = buf.low_latency_dispatch(&x, &idx, false)?.wait()?;
        let e = if me == 0 {
            let hook = buf.low_latency_dispatch(&x, &idx, true)?;
            pe.barrier_all()?;
            hook.wait().err()
        } else {
            let zeros = vec![bf16::ZERO; 2 * 2 * 2 * 128];
            let hook = buf.low_latency_combine(&zeros, &idx, &[1.0], &d.handle, true, false)?;
            pe.barrier_all()?;
            hook.wait().err()
        };
        pe.barrier_all()?;
        Ok(e)
    })
    .unwrap();
    let err = |r: usize| {
        out[r]
            .as_ref()
            .unwrap_or_else(|e| panic!("PE {r}: {e}"))
            .as_ref()
            .unwrap_or_else(|| panic!("PE {r}'s call succeeded"))
            .to_string()
    };
    let (e0, e1) = (err(0), err(1));
    assert!(
        e0.contains("low_latency_dispatch (LL call #1)")
            && e0.contains(
                "; PE 1 sent this call's low_latency_combine words instead: it made \
                 low_latency_combine its LL call where this PE made low_latency_dispatch"
            ),
        "{e0}"
    );
    assert!(
        e1.contains("low_latency_combine (LL call #1)")
            && e1.contains(
                "; PE 0 sent this call's low_latency_dispatch words instead: it made \
                 low_latency_dispatch its LL call where this PE made low_latency_combine"
            ),
        "{e1}"
    );
}

#[test]
fn layout_is_exact_and_far_below_deepep_for_the_default_shape() {
    let c = Config::deepep_default();
    let l = Layout::new(&c, 4).unwrap();
    assert_eq!(l.msg_bytes, 16 + 7168 + 56 * 4);
    assert_eq!(l.slots_per_src, 128 * 8);
    assert_eq!(l.dispatch_recv.bytes, 4 * 128 * 8 * l.msg_bytes);
    assert_eq!(l.combine_send.bytes, 72 * 4 * 128 * 7168 * 2);
    assert_eq!(l.combine_recv.bytes, 128 * 8 * 7168 * 2);
    assert_eq!(l.total_bytes, 2 * l.set_bytes);
    let deepep = Layout::deepep_size_hint(&c);
    assert_eq!(
        deepep,
        2 * (288 * 128 * 7168 * 2 + 288 * 128 * 14352 + 288 * 4)
    );
    assert!(
        l.total_bytes < deepep * 55 / 100,
        "{} vs {deepep}",
        l.total_bytes
    );
    // Regions do not overlap and stay inside a set.
    let mut rs = [
        l.dispatch_count,
        l.combine_flag,
        l.credit,
        l.dispatch_send,
        l.dispatch_recv,
        l.combine_send,
        l.combine_recv,
    ];
    rs.sort_by_key(|r| r.offset);
    for w in rs.windows(2) {
        assert!(w[0].offset + w[0].bytes <= w[1].offset);
    }
    assert!(rs[6].offset + rs[6].bytes <= l.set_bytes);
}

#[test]
fn the_checks_catch_tampered_outputs() {
    let c = cfg(4, 256, 4, 2, true);
    let out = run_threads(2, settings(20_000), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, c)?;
        let r = check::random_routing(9, me, 4, &c, None, 0);
        let all = check::allgather_routing(pe, &team, &r)?;
        let x = check::origin_x(me, 4, 256);
        let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
        let m = [false; 2];
        check::validate_dispatch(&c, me, &all, &m, &o)?;
        let mut caught = 0;
        let mut t = o.clone();
        if let rshmem::ep::RecvX::Fp8 { data, .. } = &mut t.recv_x {
            data[3] ^= 1;
        }
        caught += check::validate_dispatch(&c, me, &all, &m, &t).is_err() as usize;
        let mut t = o.clone();
        t.src_info[0] = (t.src_info[0] + 1) % 4;
        caught += check::validate_dispatch(&c, me, &all, &m, &t).is_err() as usize;
        let mut t = o.clone();
        t.recv_count[1] += 1;
        caught += check::validate_dispatch(&c, me, &all, &m, &t).is_err() as usize;
        let mut t = o.clone();
        t.layout_range[0] += 1 << 32;
        caught += check::validate_dispatch(&c, me, &all, &m, &t).is_err() as usize;
        // Ranges and counts outside the expert's rows (R·N = 8), as a faulty kernel's
        // output read back would hold, fail the check instead of indexing out of bounds
        // (they panicked before 2026-12-07); the simulated expert and the hash clamp them.
        for lr in [(8i64 << 32) | 1, (6i64 << 32) | 3, -1, i64::MIN | 2] {
            let mut t = o.clone();
            t.layout_range[2] = lr;
            let e = check::validate_dispatch(&c, me, &all, &m, &t)
                .expect_err("a range outside the rows");
            assert!(
                e.to_string().contains("outside the expert's 8 rows"),
                "PE {me}: {e}"
            );
            check::dispatch_hash(&c, 2, &t);
        }
        for n in [9, -3, i32::MAX] {
            let mut t = o.clone();
            t.recv_count[1] = n;
            assert!(check::validate_dispatch(&c, me, &all, &m, &t).is_err());
            let mut e = vec![bf16::ZERO; 2 * 2 * 4 * 256];
            check::expert_forward(&c, 2, me, &t, &scale, &mut e);
        }
        let mut e = vec![bf16::ZERO; 2 * 2 * 4 * 256];
        check::expert_forward(&c, 2, me, &o, &scale, &mut e);
        let mut y = buf
            .low_latency_combine(&e, &r.topk_idx, &r.topk_weights, &o.handle, false, false)?
            .wait()?;
        check::validate_combine(&c, 2, me, &r, &m, &scale, &y)?;
        y[5] = bf16::from_f32(y[5].to_f32() * 1.01);
        caught += check::validate_combine(&c, 2, me, &r, &m, &scale, &y).is_err() as usize;
        y[5] = bf16::NAN;
        caught += check::validate_combine(&c, 2, me, &r, &m, &scale, &y).is_err() as usize;
        Ok(caught)
    })
    .unwrap();
    for o in out {
        assert_eq!(o.unwrap(), 6);
    }
}

/// Past 256 tokens the token index in the last 128 columns is rounded (bf16), so rows of
/// tokens 256 and 257 used to be equal and two of their rows filed under each other's token
/// passed every check. The rounding residual in the 128 columns before them (H >= 384)
/// tells them apart; both formats. With FP8 the codes and scales are checked themselves:
/// a group of zeros (the residual of tokens below 256) under another scale dequantises
/// to the same zeros.
#[test]
fn rows_filed_under_the_wrong_token_past_256_are_caught() {
    for fp8 in [true, false] {
        let c = cfg(300, 384, 1, 1, fp8);
        let out = run_threads(1, settings(20_000), |pe| {
            let team = pe.world().clone();
            let r = check::random_routing(5, 0, 300, &c, None, 0);
            let all = check::allgather_routing(pe, &team, &r)?;
            let x = check::origin_x(0, 300, 384);
            let mut buf = Buffer::new(pe, &team, c)?;
            let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
            check::validate_dispatch(&c, 0, &all, &[false], &o)?;
            // One expert, one source: row j holds token j.
            assert_eq!(&o.src_info[255..259], &[255, 256, 257, 258]);
            let mut swapped = o.clone();
            swapped.src_info.swap(256, 257);
            let mut errors = vec![check::validate_dispatch(&c, 0, &all, &[false], &swapped)
                .expect_err("rows of tokens 256 and 257 filed under each other's index")
                .to_string()];
            let mut rescaled = o.clone();
            if let rshmem::ep::RecvX::Fp8 { data, scales } = &mut rescaled.recv_x {
                assert!(data[128..256].iter().all(|&q| q == 0));
                scales[1] *= 2.0;
                let e = check::validate_dispatch(&c, 0, &all, &[false], &rescaled)
                    .expect_err("a zero group's scale doubled");
                errors.push(e.to_string());
            }
            Ok(errors)
        })
        .unwrap();
        let e = out.into_iter().next().unwrap().unwrap();
        assert!(
            e[0].contains("row 256 (token 257 of PE 0)"),
            "fp8 {fp8}: {e:?}"
        );
        if fp8 {
            assert!(
                e[1].contains("row 0 (token 0 of PE 0): scale of group 1"),
                "{e:?}"
            );
        }
    }
}

/// Output storage of another buffer (another format, another N) handed to `recycle` is
/// dropped, not reused: the next dispatch still delivers this buffer's shape.
#[test]
fn recycling_another_buffers_output_is_ignored() {
    let fp8 = cfg(4, 128, 4, 2, true);
    let (bf, big) = (cfg(4, 128, 4, 2, false), cfg(8, 128, 4, 2, true));
    let out = run_threads(2, settings(20_000), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut a = Buffer::new(pe, &team, fp8)?;
        let mut others = [Buffer::new(pe, &team, bf)?, Buffer::new(pe, &team, big)?];
        let r = check::random_routing(3, me, 4, &fp8, None, 0);
        let all = check::allgather_routing(pe, &team, &r)?;
        let x = check::origin_x(me, 4, 128);
        for o in &mut others {
            let foreign = o.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
            a.recycle(foreign);
            let d = a.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
            check::validate_dispatch(&fp8, me, &all, &[false; 2], &d)?;
            match &d.recv_x {
                rshmem::ep::RecvX::Fp8 { data, .. } => assert_eq!(data.len(), 2 * 2 * 4 * 128),
                rshmem::ep::RecvX::Bf16(_) => panic!("bf16 output from an FP8 buffer"),
            }
        }
        Ok(())
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}

/// A hidden size whose rows overflow the address space is an error, not a wrapped (tiny)
/// layout in release builds or a panic in debug builds.
#[test]
fn a_hidden_size_past_the_address_space_is_refused() {
    for (h, fp8) in [(1usize << 63, false), (usize::MAX / 128 * 128, true)] {
        let c = cfg(4, h, 4, 2, fp8);
        for e in [Layout::new(&c, 2).err(), Layout::size_hint(&c, 2).err()] {
            let m = e.expect("refused").to_string();
            assert!(m.contains("overflow the address space"), "H={h}: {m}");
        }
    }
    // Regions whose end passes the add but wraps when rounded up to the region alignment
    // (a release build gave a 0-byte layout, and Buffer::new then zeroed the runtime's own
    // words below it).
    for (n_pes, c) in [
        (
            1,
            Config {
                num_max_dispatch_tokens_per_rank: 1,
                hidden: 128,
                num_experts: (1 << 61) - 1,
                num_topk: 1,
                use_fp8: false,
                round_scale: false,
            },
        ),
        (
            2,
            Config {
                num_max_dispatch_tokens_per_rank: 1,
                hidden: 1152921504606846953,
                num_experts: 2,
                num_topk: 3,
                use_fp8: false,
                round_scale: false,
            },
        ),
    ] {
        for e in [
            Layout::new(&c, n_pes).err(),
            Layout::size_hint(&c, n_pes).err(),
            Layout::alloc_hint(&c, n_pes).err(),
        ] {
            let m = e.expect("refused").to_string();
            assert!(m.contains("overflow the address space"), "{c:?}: {m}");
        }
    }
}

/// A heap that holds the buffer's main block but not its pull area as well: Buffer::new
/// fails with HeapExhausted on every PE and leaves the heap as it found it (the main block
/// stayed allocated, unreachable, before).
#[test]
fn a_buffer_that_does_not_fit_leaves_nothing_allocated() {
    let c = cfg(4, 128, 4, 2, false);
    let main = Layout::size_hint(&c, 2).unwrap();
    let out = run_threads(2, settings(20_000), |pe| {
        // Leave a largest free block that fits the main block but not both.
        let (_, largest) = pe.heap_free();
        let filler = pe.malloc(largest - main - 64)?;
        let before = pe.heap_free();
        assert!(before.1 >= main && before.1 < Layout::alloc_hint(&c, 2).unwrap());
        let team = pe.world().clone();
        let e = match Buffer::new(pe, &team, c) {
            Ok(_) => panic!("the buffer fitted"),
            Err(e) => e,
        };
        assert!(matches!(e, Error::HeapExhausted { .. }), "{e}");
        assert_eq!(pe.heap_free(), before, "PE {}", pe.my_pe());
        pe.free(filler)?;
        // The heap still holds a buffer once the filler is gone.
        Buffer::new(pe, &team, c)?.destroy()
    })
    .expect("job starts");
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}

/// Combine with a topk_idx other than the dispatch's (here two slots of a token swapped,
/// which keeps every per-PE count) fails on every PE instead of combining rows under the
/// wrong weights; the buffer stays usable.
#[test]
fn combine_with_another_routing_fails_on_every_pe() {
    let c = cfg(4, 128, 4, 2, true);
    let bad = 1;
    let out = run_threads(2, settings(20_000), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::new(pe, &team, c)?;
        let r = check::random_routing(5, me, 4, &c, None, 0);
        let all = check::allgather_routing(pe, &team, &r)?;
        let x = check::origin_x(me, 4, 128);
        let mut e = vec![bf16::ZERO; 2 * 2 * 4 * 128];
        let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
        check::expert_forward(&c, 2, me, &o, &scale, &mut e);
        let mut idx = r.topk_idx.clone();
        if me == bad {
            idx.swap(0, 1);
        }
        let err = buf
            .low_latency_combine(&e, &idx, &r.topk_weights, &o.handle, false, false)
            .and_then(|y| y.wait())
            .err();
        // Still usable: a full round with the right routing validates.
        let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
        check::validate_dispatch(&c, me, &all, &[false; 2], &o)?;
        check::expert_forward(&c, 2, me, &o, &scale, &mut e);
        let y = buf
            .low_latency_combine(&e, &r.topk_idx, &r.topk_weights, &o.handle, false, false)?
            .wait()?;
        check::validate_combine(&c, 2, me, &r, &[false; 2], &scale, &y)?;
        Ok(err)
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        let e = o
            .unwrap_or_else(|e| panic!("PE {r}: {e}"))
            .expect("the call fails");
        let m = e.to_string();
        if r == bad {
            assert!(
                matches!(e, Error::InvalidArgument(_))
                    && m.contains("topk_idx differs from the one this PE dispatched with"),
                "PE {r}: {m}"
            );
        } else {
            assert!(
                matches!(e, Error::EpPeerFailed { peer, .. } if peer == bad)
                    && m.contains("its combine topk_idx differs from the one it dispatched with"),
                "PE {r}: {m}"
            );
        }
    }
}
