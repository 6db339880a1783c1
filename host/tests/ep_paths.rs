//! Combine's direct path (node-local PEs read their rows straight from the expert owner's
//! memory) against the message path (rows put into the receiver's buffer): EP.md's checks
//! on both, and bit-identical outputs between them, at 1, 2, 3, 4 and 8 PEs over the
//! listed shapes (T = 0, T = N, K = 1, a token with every slot masked, experts receiving
//! nothing), with hooks and zero copy.
use rshmem::config::TransportMode;
use rshmem::ep::{bf16, check, Buffer, Config, Path};
use rshmem::{run_threads, Pe, Settings};
use std::time::Duration;

fn settings() -> Settings {
    settings_with(TransportMode::Auto)
}

fn settings_with(transport: TransportMode) -> Settings {
    let mut s = Settings::from_lookup(|_| None).expect("default settings");
    s.transport = transport;
    s.symmetric_size = 48 << 20;
    s.timeout = Duration::from_millis(20_000);
    s
}

#[derive(Clone)]
struct Case {
    pes: usize,
    cfg: Config,
    tokens: usize,
    experts: Option<Vec<usize>>,
    masked_slots: usize,
    all_masked_token: bool,
    hook: bool,
    zero_copy: bool,
}

fn case(pes: usize, n: usize, h: usize, e: usize, k: usize, fp8: bool, tokens: usize) -> Case {
    Case {
        pes,
        cfg: Config {
            num_max_dispatch_tokens_per_rank: n,
            hidden: h,
            num_experts: e,
            num_topk: k,
            use_fp8: fp8,
            round_scale: false,
        },
        tokens,
        experts: None,
        masked_slots: 3,
        all_masked_token: false,
        hook: false,
        zero_copy: false,
    }
}

fn scale(e: usize) -> f32 {
    1.0 + (e % 4) as f32 * 0.25
}

/// Three calls of dispatch + combine on `path`; the combined outputs' bits.
fn one_pe(pe: &Pe, c: &Case, path: Path, direct: bool) -> rshmem::Result<Vec<Vec<u16>>> {
    let team = pe.world().clone();
    let (me, n) = (team.my_pe(), team.n_pes());
    let mut buf = Buffer::with_path(pe, &team, c.cfg, path)?;
    for p in 0..n {
        assert_eq!(buf.combine_is_direct(p), direct, "PE {me} -> {p}");
    }
    let mut r = check::random_routing(
        11,
        me,
        c.tokens,
        &c.cfg,
        c.experts.as_deref(),
        c.masked_slots,
    );
    if c.all_masked_token && c.tokens > 0 {
        r.topk_idx[..c.cfg.num_topk].fill(-1);
    }
    let all = check::allgather_routing(pe, &team, &r)?;
    let masked = vec![false; n];
    let x = check::origin_x(me, c.tokens, c.cfg.hidden);
    let l = c.cfg.num_experts / n;
    let mut expert_out =
        vec![bf16::ZERO; l * n * c.cfg.num_max_dispatch_tokens_per_rank * c.cfg.hidden];
    let mut outs = Vec::new();
    for _ in 0..3 {
        let out = buf.low_latency_dispatch(&x, &r.topk_idx, c.hook)?.wait()?;
        check::validate_dispatch(&c.cfg, me, &all, &masked, &out)?;
        let y = if c.zero_copy {
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
        check::validate_combine(&c.cfg, n, me, &r, &masked, &scale, &y)?;
        if c.all_masked_token && c.tokens > 0 {
            assert!(y[..c.cfg.hidden].iter().all(|v| v.to_bits() == 0));
        }
        outs.push(y.iter().map(|v| v.to_bits()).collect());
        buf.recycle(out);
    }
    buf.destroy()?;
    Ok(outs)
}

fn run(c: Case) {
    let mut per_path = Vec::new();
    for path in [Path::Auto, Path::Message] {
        // Threads of one process: every peer is node-local, so Auto reads directly.
        let out = run_threads(c.pes, settings(), |pe| {
            one_pe(pe, &c, path, path == Path::Auto)
        })
        .expect("job starts");
        let mut pes = Vec::new();
        for (r, o) in out.into_iter().enumerate() {
            let o = o.unwrap_or_else(|e| panic!("{path:?}, PE {r} of {}: {e}", c.pes));
            assert!(
                o.iter().all(|y| *y == o[0]),
                "{path:?} PE {r}: repeats differ"
            );
            pes.push(o);
        }
        per_path.push(pes);
    }
    assert!(
        per_path[0] == per_path[1],
        "direct and message paths differ ({} PEs, {:?})",
        c.pes,
        c.cfg
    );
}

/// Peers served by the proxy transport get messages even with `Path::Auto`, with the
/// same results.
#[test]
fn proxy_peers_use_the_message_path() {
    let mut c = case(3, 4, 256, 6, 3, true, 4);
    c.zero_copy = true;
    let get = |transport, path| {
        run_threads(3, settings_with(transport), |pe| {
            one_pe(
                pe,
                &c,
                path,
                transport == TransportMode::Auto && path == Path::Auto,
            )
        })
        .expect("job starts")
        .into_iter()
        .map(|o| o.unwrap_or_else(|e| panic!("{transport:?}: {e}")))
        .collect::<Vec<_>>()
    };
    let proxy = get(TransportMode::Proxy, Path::Auto);
    assert!(
        proxy == get(TransportMode::Auto, Path::Auto),
        "proxy and direct differ"
    );
}

#[test]
fn one_pe_t_equals_n() {
    run(case(1, 4, 256, 4, 2, true, 4));
}

#[test]
fn two_pes_zero_tokens_hook() {
    let mut c = case(2, 4, 256, 8, 4, true, 0);
    c.hook = true;
    run(c);
}

/// BF16 rows of 100 values (200 bytes): combine's streamed rows start at every 8-byte
/// offset modulo 16, so the unaligned head and tail of the row copy are exercised.
#[test]
fn three_pes_bf16_odd_hidden() {
    run(case(3, 5, 100, 6, 3, false, 5));
}

#[test]
fn two_pes_bf16_k1() {
    run(case(2, 6, 2048, 8, 1, false, 6));
}

#[test]
fn three_pes_fp8_7168_t_equals_n_all_masked_token() {
    let mut c = case(3, 3, 7168, 9, 3, true, 3);
    c.all_masked_token = true;
    run(c);
}

#[test]
fn four_pes_experts_that_receive_nothing_zero_copy_hook() {
    let mut c = case(4, 4, 4096, 16, 4, true, 4);
    c.experts = Some(vec![0, 1, 2, 3, 4, 5, 12]);
    c.zero_copy = true;
    c.hook = true;
    run(c);
}

#[test]
fn four_pes_bench_shape_small() {
    // The benchmark's shape (H = 7168, K = 8, E = 32, FP8) with fewer tokens.
    let mut c = case(4, 16, 7168, 32, 8, true, 16);
    c.masked_slots = 10;
    run(c);
}

#[test]
fn eight_pes_bf16_k11_zero_copy() {
    let mut c = case(8, 2, 8192, 16, 11, false, 2);
    c.masked_slots = 5;
    c.zero_copy = true;
    run(c);
}

#[test]
fn eight_pes_fp8_t_below_n() {
    run(case(8, 5, 128, 24, 6, true, 3));
}

/// Zero copy while the previous combine is still in flight: each round's dispatch is
/// issued before the previous combine is received, and the zero-copy buffer of a set is
/// handed out only once every peer has read that set's previous rows.
#[test]
fn zero_copy_with_calls_in_flight() {
    let c = case(3, 4, 256, 6, 3, true, 4).cfg;
    let out = run_threads(3, settings(), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::with_path(pe, &team, c, Path::Auto)?;
        let m = vec![false; 3];
        let mut last = None;
        for round in 0..5u64 {
            let r = check::random_routing(20 + round, me, 4, &c, None, 1);
            let x = check::origin_x(me, 4, 256);
            let d = buf.low_latency_dispatch(&x, &r.topk_idx, true)?;
            if let Some((pr, ph)) = last.take() {
                let y = rshmem::ep::Combine::wait(ph)?;
                check::validate_combine(&c, 3, me, &pr, &m, &scale, &y)?;
            }
            let o = d.wait()?;
            let zc = buf.get_next_low_latency_combine_buffer(&o.handle)?;
            check::expert_forward(&c, 3, me, &o, &scale, zc);
            let h =
                buf.low_latency_combine(&[], &r.topk_idx, &r.topk_weights, &o.handle, true, true)?;
            last = Some((r, h));
        }
        if let Some((pr, ph)) = last.take() {
            let y = rshmem::ep::Combine::wait(ph)?;
            check::validate_combine(&c, 3, me, &pr, &m, &scale, &y)?;
        }
        Ok(())
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
    }
}

/// A zero-copy combine refused on the PE itself (the other set's receive hook not yet
/// called) keeps its permission: after the hook, the retry runs and sums exactly. Before
/// 2026-12-07 the refusal used the permission up and the retry was poisoned as a wrong
/// zero-copy buffer on every PE. The message path: the direct path refuses the buffer
/// request itself while a set is pending.
#[test]
fn a_refused_zero_copy_combine_can_be_retried() {
    let c = case(2, 4, 256, 4, 2, true, 4).cfg;
    let out = run_threads(2, settings(), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::with_path(pe, &team, c, Path::Message)?;
        let m = vec![false; 2];
        let x = check::origin_x(me, 4, 256);
        let r0 = check::random_routing(31, me, 4, &c, None, 0);
        let o0 = buf.low_latency_dispatch(&x, &r0.topk_idx, false)?.wait()?;
        let mut e = vec![bf16::ZERO; 2 * 2 * 4 * 256];
        check::expert_forward(&c, 2, me, &o0, &scale, &mut e);
        // Call 1: a combine whose receive is left for later (set 1 pending).
        let c1 =
            buf.low_latency_combine(&e, &r0.topk_idx, &r0.topk_weights, &o0.handle, true, false)?;
        let r2 = check::random_routing(32, me, 4, &c, None, 0);
        let o2 = buf.low_latency_dispatch(&x, &r2.topk_idx, false)?.wait()?;
        let zc = buf.get_next_low_latency_combine_buffer(&o2.handle)?;
        check::expert_forward(&c, 2, me, &o2, &scale, zc);
        let refused = buf
            .low_latency_combine(&[], &r2.topk_idx, &r2.topk_weights, &o2.handle, false, true)
            .err()
            .map(|e| e.to_string());
        let y1 = rshmem::ep::Combine::wait(c1)?;
        check::validate_combine(&c, 2, me, &r0, &m, &scale, &y1)?;
        let y3 = buf
            .low_latency_combine(&[], &r2.topk_idx, &r2.topk_weights, &o2.handle, false, true)?
            .wait()?;
        check::validate_combine(&c, 2, me, &r2, &m, &scale, &y3)?;
        Ok(refused)
    })
    .unwrap();
    for (r, o) in out.into_iter().enumerate() {
        let refused = o.unwrap_or_else(|e| panic!("PE {r}: {e}"));
        let refused = refused.unwrap_or_else(|| panic!("PE {r}: the first try was not refused"));
        assert!(
            refused.contains("has not been received yet: call its receive hook"),
            "PE {r}: {refused}"
        );
    }
}

/// A zero-copy combine (the direct path) whose topk_idx differs from the dispatch's fails
/// with a clear error instead of reading the wrong rows (since 2026-12-06 the routing
/// check at the start of combine catches it, before the direct path's block sizes).
#[test]
fn combine_with_other_routing_than_dispatch_fails() {
    let c = case(2, 4, 256, 4, 2, true, 4).cfg;
    let out = run_threads(2, settings(), |pe| {
        let team = pe.world().clone();
        let me = team.my_pe();
        let mut buf = Buffer::with_path(pe, &team, c, Path::Auto)?;
        let r = check::random_routing(5, me, 4, &c, None, 0);
        let x = check::origin_x(me, 4, 256);
        let o = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
        let zc = buf.get_next_low_latency_combine_buffer(&o.handle)?;
        check::expert_forward(&c, 2, me, &o, &scale, zc);
        // Swap two slots' experts on PE 0: same count per owner PE, other experts.
        let mut idx = r.topk_idx.clone();
        if me == 0 {
            let owner = |v: i64| v / 2;
            let i = (0..idx.len())
                .find(|&i| {
                    (0..idx.len()).any(|j| owner(idx[j]) == owner(idx[i]) && idx[j] != idx[i])
                })
                .expect("two experts of one owner");
            let j = (0..idx.len())
                .find(|&j| owner(idx[j]) == owner(idx[i]) && idx[j] != idx[i])
                .unwrap();
            // Move slot i to slot j's expert: the counts per expert change, not per owner.
            idx[i] = idx[j];
        }
        let res = buf.low_latency_combine(&[], &idx, &r.topk_weights, &o.handle, false, true);
        Ok(res.and_then(|c| c.wait()).err().map(|e| e.to_string()))
    })
    .unwrap();
    let msg = out[0].as_ref().unwrap().clone().expect("PE 0 fails");
    assert!(
        msg.contains("topk_idx differs from the one this PE dispatched with"),
        "{msg}"
    );
}
