//! `rshmem bench ep`: LL dispatch + combine latency with DeepEP's test checks on every run.
//!
//! Per iteration every PE: sync, time dispatch (send + receive), sync, simulated expert
//! and checks (a scale per expert, untimed), sync, time combine, sync, checks (untimed). The syncs
//! after the timed phases keep one PE's untimed work out of another's timed phase when PEs
//! outnumber cores. Reported per iteration is the slowest PE's
//! time; median and p99 over the measured iterations. The first and last iterations are
//! checked exactly (check.rs); every iteration's outputs are hashed and must be
//! bit-identical to the first's.
use crate::config::{LaunchInfo, Settings};
use crate::ep::{bf16, check, Buffer, Config, Layout};
use crate::error::{Error, Result};
use crate::pe::{run_threads, Pe};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `rshmem bench ep`.
#[derive(Debug, Clone, clap::Args)]
pub struct EpBenchArgs {
    /// PEs (threads of this process unless launched as a PE; default 4); a comma list
    /// sweeps. Under a launcher the job's size is the PE count: --pes may only repeat it.
    #[arg(long, value_delimiter = ',')]
    pub pes: Vec<usize>,
    /// Tokens per PE (T = N); a comma list sweeps.
    #[arg(long, value_delimiter = ',', default_value = "128")]
    pub tokens: Vec<usize>,
    #[arg(long, default_value_t = 7168)]
    pub hidden: usize,
    #[arg(long, default_value_t = 8)]
    pub topk: usize,
    /// Experts in the job (must divide by the PE count).
    #[arg(long, default_value_t = 288)]
    pub experts: usize,
    /// FP8 dispatch (the default).
    #[arg(long, conflicts_with = "bf16")]
    pub fp8: bool,
    /// bf16 dispatch.
    #[arg(long)]
    pub bf16: bool,
    /// Round FP8 scales up to powers of two.
    #[arg(long)]
    pub round_scale: bool,
    /// Measured iterations (at most 1000000, and what PE 0's 64 MiB gather of 48 bytes
    /// per iteration per PE holds).
    #[arg(long, default_value_t = 100)]
    pub iters: usize,
    /// Unmeasured iterations first.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Use receive hooks and report the send/receive split.
    #[arg(long)]
    pub hook: bool,
    /// Combine from the zero-copy buffer.
    #[arg(long)]
    pub zero_copy: bool,
    /// cpu, gpu (GPU PEs as threads of this process on the visible GPUs; under a
    /// launcher, this process is one GPU PE), or auto (gpu when a CUDA device is visible,
    /// else cpu).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Transport between the PEs: p2p (loads and stores into node-local peers' heaps;
    /// GPU: CUDA VMM mappings), proxy (mlx5 WQEs executed by the soft HCA; GPU: the
    /// device-side IBGDA producer, heaps in host memory) or ibgda (GPU only: the same
    /// producer writing a ConnectX NIC's queues, heaps in GPU memory). Default: RSHMEM_TRANSPORT (auto:
    /// p2p on the node, the soft HCA over libfabric to other nodes). Under a launcher it
    /// must match the PEs' RSHMEM_TRANSPORT.
    #[arg(long, value_enum)]
    pub transport: Option<crate::bench::Transport>,
    /// GPU: instead of timing, run the correctness suite (every output against this CPU
    /// implementation on identical inputs, hooks, zero-copy, faults, CUDA-graph replay)
    /// for each --pes count.
    #[arg(long)]
    pub check: bool,
    /// Seed of the routings (the CPU bench takes three in turn, derived from it).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Draw latency against the swept PE count or token count into this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct EpPoint {
    pub bench: &'static str,
    pub validated: bool,
    pub device: &'static str,
    /// How PE 0 reaches the other PEs: the distinct transports, joined by "+" (e.g. "p2p",
    /// "proxy", "p2p+proxy-fabric"; GPU: "p2p" or "proxy").
    pub transport: String,
    pub pes: usize,
    pub tokens: usize,
    pub hidden: usize,
    pub topk: usize,
    pub experts: usize,
    pub fp8: bool,
    pub round_scale: bool,
    pub hook: bool,
    pub zero_copy: bool,
    pub iters: usize,
    pub warmup: usize,
    pub dispatch_us_median: f64,
    pub dispatch_us_p99: f64,
    pub combine_us_median: f64,
    pub combine_us_p99: f64,
    /// With --hook (always on GPU): the send half and the receive half separately.
    pub dispatch_send_us_median: Option<f64>,
    pub dispatch_recv_us_median: Option<f64>,
    pub combine_send_us_median: Option<f64>,
    pub combine_recv_us_median: Option<f64>,
    /// Bytes each PE sends per call, on average over PEs.
    pub dispatch_bytes_per_pe: f64,
    pub combine_bytes_per_pe: f64,
    pub dispatch_gbps: f64,
    pub combine_gbps: f64,
    pub combine_calc_diff: f64,
    pub buffer_bytes: usize,
    pub deepep_buffer_bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// GPU runs: the device-to-device copy bandwidth and the fractions of it dispatch and
    /// combine reach (`crate::gpu::ep_bench`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<crate::gpu::ep_bench::GpuEpStats>,
}

/// The JSON report: the last point's fields at the top level, all points in `points`.
#[derive(Debug, Clone, Serialize)]
pub struct EpReport {
    #[serde(flatten)]
    pub last: EpPoint,
    pub points: Vec<EpPoint>,
}

/// Entry point of the CLI: the process exit code.
pub fn run_cli(mut a: EpBenchArgs) -> i32 {
    if let Err(e) = crate::bench::launched_pes_match((!a.pes.is_empty()).then_some(&a.pes[..])) {
        eprintln!("rshmem bench ep: {e}");
        return 2;
    }
    if a.pes.is_empty() {
        // Under a launcher the job's size (what the count checks must use: the gather of
        // every PE's times is sized by it); else 4 PEs as threads.
        a.pes = match LaunchInfo::from_env() {
            Ok(Some(l)) => vec![l.world_size],
            Ok(None) => vec![4],
            Err(e) => {
                eprintln!("rshmem bench ep: {e}");
                return 2;
            }
        };
    }
    if a.check {
        return crate::gpu::ep_bench::check_cli(&a);
    }
    // Refused before the run rather than after it, where the plot is drawn: not by the
    // other PEs of a launched job (PE 0 draws it).
    let plots_here = LaunchInfo::from_env()
        .ok()
        .flatten()
        .is_none_or(|l| l.rank == 0);
    if let Some(p) = a.plot.as_ref().filter(|_| plots_here) {
        if let Err(e) = plot_precheck(p) {
            eprintln!("rshmem bench ep: --plot {}: {e}", p.display());
            return 1;
        }
    }
    match run(&a) {
        Ok(None) => 0,
        Ok(Some(rep)) => {
            print(&rep, a.json);
            if let Some(p) = &a.plot {
                if let Err(e) = plot(&rep.points, p) {
                    eprintln!("rshmem bench ep: --plot: {e}");
                    return 1;
                }
            }
            if rep.points.iter().all(|p| p.validated) {
                0
            } else {
                for p in &rep.points {
                    if let Some(e) = &p.error {
                        eprintln!("rshmem bench ep: validation failed: {e}");
                    }
                }
                1
            }
        }
        Err(e) => {
            eprintln!("rshmem bench ep: {e}");
            1
        }
    }
}

pub(crate) fn config_of(a: &EpBenchArgs, tokens: usize) -> Config {
    Config {
        num_max_dispatch_tokens_per_rank: tokens,
        hidden: a.hidden,
        num_experts: a.experts,
        num_topk: a.topk,
        use_fp8: !a.bf16,
        round_scale: a.round_scale,
    }
}

/// The settings of the PEs a bench starts itself: the environment's, with `--transport`.
pub(crate) fn settings_of(a: &EpBenchArgs) -> Result<Settings> {
    let mut s = Settings::from_env()?;
    if let Some(t) = a.transport {
        s.transport = t.mode();
    }
    Ok(s)
}

/// The distinct transports from `pe` to the other PEs (to itself in a job of one).
fn transports(pe: &Pe) -> String {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let mut v: Vec<&str> = (0..n)
        .filter(|&q| q != me || n == 1)
        .filter_map(|q| pe.transport_to(q))
        .collect();
    v.sort_unstable();
    v.dedup();
    v.join("+")
}

/// `--iters`, and every value of `--pes` and `--tokens`, at least 1 (before the device is
/// chosen, so that both devices give the same error).
pub(crate) fn check_counts(a: &EpBenchArgs) -> Result<()> {
    if a.iters == 0 || a.pes.is_empty() || a.tokens.is_empty() {
        return Err(Error::InvalidArgument(
            "--iters, --pes and --tokens must be at least 1".into(),
        ));
    }
    // Every measured iteration keeps its six times (48 bytes) on every PE: a bound keeps a
    // mistyped count from allocating gigabytes per PE before anything runs.
    for (flag, v) in [("--iters", a.iters), ("--warmup", a.warmup)] {
        if v > MAX_ITERS {
            return Err(Error::InvalidArgument(format!(
                "{flag} {v}: at most {MAX_ITERS} (a call takes tens of microseconds or more)"
            )));
        }
    }
    // Every PE's times reach PE 0 in one bootstrap allgather, whose result is one frame:
    // a count that cannot fit fails there, after the whole timed run (4 KiB per PE covers
    // the blob's other values and a failed check's message).
    for &n in &a.pes {
        let frame = crate::bootstrap::wire::MAX_FRAME;
        let per_pe = a.iters.saturating_mul(48).saturating_add(4096);
        if n.saturating_mul(per_pe) > frame {
            return Err(Error::InvalidArgument(format!(
                "--iters {} at {n} PEs: every PE's 48 bytes per iteration are gathered in \
                 one message of at most {} MiB, which holds at most {} iterations at {n} PEs",
                a.iters,
                frame >> 20,
                (frame / n).saturating_sub(4096) / 48
            )));
        }
    }
    for (flag, v) in [("--pes", &a.pes), ("--tokens", &a.tokens)] {
        if v.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "{flag} 0: every value of {flag} must be at least 1"
            )));
        }
    }
    Ok(())
}

/// Runs every point; Some(report) where this process reports.
pub fn run(a: &EpBenchArgs) -> Result<Option<EpReport>> {
    check_counts(a)?;
    let device = match a.device.as_str() {
        "cpu" | "gpu" => a.device.clone(),
        "auto" => {
            if crate::gpu::ep_bench::gpu_present() {
                "gpu".into()
            } else {
                "cpu".into()
            }
        }
        d => {
            return Err(Error::InvalidArgument(format!(
                "--device {d}: expected cpu, gpu or auto"
            )))
        }
    };
    if device == "gpu" {
        return crate::gpu::ep_bench::run(a);
    }
    if a.check {
        return Err(Error::InvalidArgument(
            "--check is the GPU correctness suite (--device gpu); CPU runs always validate".into(),
        ));
    }
    if a.transport == Some(crate::bench::Transport::Ibgda) {
        return Err(Error::InvalidArgument(crate::bench::IBGDA_NEEDS_GPU.into()));
    }
    let launched = LaunchInfo::from_env()?.is_some();
    let mut points = Vec::new();
    let total_points = a.pes.len() * a.tokens.len();
    if launched {
        if a.pes.len() > 1 {
            return Err(Error::InvalidArgument(
                "--pes sweeps need the bench to start its own PEs (not under a launcher)".into(),
            ));
        }
        if let Some(t) = a.transport {
            t.check_launched(&Settings::from_env()?)?;
        }
        let pe = Pe::init()?;
        for &t in &a.tokens {
            let p = point(&pe, a, t)?;
            points.extend(p);
        }
        pe.finalize()?;
        if points.is_empty() {
            return Ok(None);
        }
    } else {
        // Every point's arguments before any point runs.
        for &n in &a.pes {
            for &t in &a.tokens {
                let cfg = config_of(a, t);
                cfg.validate(n)?;
                check_memory(a, &cfg, n, Layout::size_hint(&cfg, n)? + (16 << 20))?;
            }
        }
        for &n in &a.pes {
            for &t in &a.tokens {
                let cfg = config_of(a, t);
                let mut s = settings_of(a)?;
                let need = Layout::size_hint(&cfg, n)? + (16 << 20);
                if s.symmetric_size < need {
                    s.symmetric_size = need.next_multiple_of(1 << 20);
                }
                let out = run_threads(n, s, |pe| point(pe, a, t))?;
                let mut first = None;
                for r in out {
                    match r {
                        Ok(Some(p)) => first = Some(p),
                        Ok(None) => {}
                        Err(e) => return Err(e),
                    }
                }
                points.extend(first);
            }
        }
        if points.len() != total_points {
            return Err(Error::Verification(
                "a benchmark point reported nothing".into(),
            ));
        }
    }
    let last = points
        .last()
        .cloned()
        .ok_or_else(|| Error::Verification("no points".into()))?;
    Ok(Some(EpReport { last, points }))
}

/// Refuses a point whose PEs (threads of this process) would touch more than this node's
/// memory, where the OOM killer would end the run instead of an error. Per PE: the heap
/// regions written (the heap is a sparse file or memfd), the received rows of the dispatch
/// output (at most `R·N·min(K, L)`; the rest is never touched) and the expert outputs:
/// without zero-copy the bench's bf16 `[L, R·N, H]` array, which `point` fills whole; with
/// it, only the received rows of the zero-copy combine region (the rest of that region is
/// never touched either way). Measured against this estimate on the 23.5 GiB VM, 4 PEs,
/// default shape: 1024 tokens peaked at 17.7 GiB (estimate 19.4 GiB), 4096 were OOM-killed.
fn check_memory(a: &EpBenchArgs, cfg: &Config, n: usize, heap: usize) -> Result<()> {
    let Some(mem) = crate::heap::node_memory_bytes() else {
        return Ok(());
    };
    let lay = Layout::new(cfg, n)?;
    let hidden = cfg.hidden as u128;
    let recv_rows = n as u128 * lay.slots_per_src as u128;
    // The two sets' zero-copy regions (inside `heap`, which holds at least both sets).
    let heap = heap as u128 - 2 * lay.combine_send.bytes as u128;
    let elem = if cfg.use_fp8 { 1 } else { 2 };
    let recv_x = recv_rows * hidden * elem;
    let (heap, host) = if a.zero_copy {
        // Expert outputs in the heap: at most the received rows of each set's region.
        (heap + 2 * recv_rows * hidden * 2, recv_x)
    } else {
        let experts_out = cfg.num_experts as u128 * lay.num_max_tokens as u128 * hidden * 2;
        (heap, recv_x + experts_out)
    };
    let all = (heap + host) * n as u128;
    if all <= mem {
        return Ok(());
    }
    let h = crate::doctor::human_bytes_wide;
    Err(Error::InvalidArgument(format!(
        "bench ep: {n} PEs with {} tokens need {} each ({} of symmetric heap, {} of \
         the bench's own arrays), {} in all, more than this node's memory ({} of RAM and swap): \
         lower --tokens or --pes",
        cfg.num_max_dispatch_tokens_per_rank,
        h(heap + host),
        h(heap),
        h(host),
        h(all),
        h(mem)
    )))
}

/// Median and p99, as every rshmem bench computes them (`crate::bench::stats`).
fn stats(v: Vec<f64>) -> (f64, f64) {
    let (med, p99, _) = crate::bench::stats(v);
    (med, p99)
}

/// Most `--iters` and `--warmup` of `bench ep`.
pub const MAX_ITERS: usize = 1_000_000;

/// Routings the bench takes in turn (`point`; the GPU bench's too).
pub(crate) const ROUTINGS: usize = 3;

/// The bench's routings of this PE (`me`): [`ROUTINGS`] of them, from `--seed` and two
/// seeds derived from it, each with 10 masked slots (fewer when there are fewer slots).
pub(crate) fn bench_routings(
    a: &EpBenchArgs,
    cfg: &Config,
    me: usize,
    tokens: usize,
) -> Vec<check::Routing> {
    (0..ROUTINGS as u64)
        .map(|v| {
            let seed = a.seed.wrapping_add(v.wrapping_mul(0x9e37_79b9));
            check::random_routing(seed, me, tokens, cfg, None, 10.min(tokens * a.topk))
        })
        .collect()
}

/// The bench's simulated expert scales expert `e`'s rows by this, as the tests' does: with
/// one factor for every expert, combine could take another expert's row for a token's
/// slot and still validate.
pub(crate) fn bench_expert_scale(e: usize) -> f32 {
    1.0 + (e % 4) as f32 * 0.25
}

/// One point on one PE; Some on the PE that reports (rank 0).
fn point(pe: &Pe, a: &EpBenchArgs, tokens: usize) -> Result<Option<EpPoint>> {
    let team = pe.world().clone();
    let (me, n) = (team.my_pe(), team.n_pes());
    let cfg = config_of(a, tokens);
    let mut buf = Buffer::new(pe, &team, cfg)?;
    // Iteration `it` uses routing `it % ROUTINGS`. With one routing, every call found the
    // previous call's identical bytes in its buffer set, so a receiver that read a slot
    // before this call's data landed (or an old slot) still got the right values and every
    // check passed. Three, so that the turn does not line up with the two buffer sets.
    let routings = bench_routings(a, &cfg, me, tokens);
    let alls = routings
        .iter()
        .map(|r| check::allgather_routing(pe, &team, r))
        .collect::<Result<Vec<_>>>()?;
    let masked = vec![false; n];
    let x = check::origin_x(me, tokens, cfg.hidden);
    let l = cfg.num_experts / n;
    let out_len = l * n * tokens * cfg.hidden;
    let mut expert_out = if a.zero_copy {
        Vec::new()
    } else {
        vec![bf16::ZERO; out_len]
    };
    let total = a.warmup + a.iters;
    let bar = (me == 0 && !a.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(total as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} iterations")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b.set_message(format!("bench ep: {n} PEs, {tokens} tokens"));
        b
    });
    let expert = bench_expert_scale;
    let mut times = vec![[0f64; 6]; a.iters];
    // Per routing: the hashes of its first (validated) iteration, which every later
    // iteration with it must repeat bit for bit.
    let mut hashes: Vec<Option<(u64, u64)>> = vec![None; ROUTINGS];
    let mut problem: Option<String> = None;
    let mut diff = 0.0f64;
    for it in 0..total {
        let (routing, all) = (&routings[it % ROUTINGS], &alls[it % ROUTINGS]);
        let check_now = it < ROUTINGS || it + 1 == total;
        pe.sync_all()?;
        let t0 = Instant::now();
        let d = buf.low_latency_dispatch(&x, &routing.topk_idx, a.hook)?;
        let t_send = t0.elapsed();
        let out = d.wait()?;
        let t_disp = t0.elapsed();
        // Every PE's dispatch ends before any PE's untimed work (checks, the simulated
        // expert) starts: with more PEs than cores that work would otherwise run inside
        // other PEs' timed phases. scripts/ep_mpi_alltoallv.c does the same.
        pe.sync_all()?;
        if check_now && problem.is_none() {
            if let Err(e) = check::validate_dispatch(&cfg, me, all, &masked, &out) {
                problem = Some(e.to_string());
            }
        }
        let dh = check::dispatch_hash(&cfg, n, &out);
        if a.zero_copy {
            let zc = buf.get_next_low_latency_combine_buffer(&out.handle)?;
            check::expert_forward(&cfg, n, me, &out, &expert, zc);
        } else {
            check::expert_forward(&cfg, n, me, &out, &expert, &mut expert_out);
        }
        pe.sync_all()?;
        let t1 = Instant::now();
        let c = buf.low_latency_combine(
            &expert_out,
            &routing.topk_idx,
            &routing.topk_weights,
            &out.handle,
            a.hook,
            a.zero_copy,
        )?;
        let c_send = t1.elapsed();
        let combined = c.wait()?;
        let t_comb = t1.elapsed();
        pe.sync_all()?; // likewise before the untimed checks
        if check_now && problem.is_none() {
            match check::validate_combine(&cfg, n, me, routing, &masked, &expert, &combined) {
                Ok(dv) => diff = diff.max(dv),
                Err(e) => problem = Some(e.to_string()),
            }
        }
        let ch = check::hash_bf16(&combined);
        match hashes[it % ROUTINGS] {
            None => hashes[it % ROUTINGS] = Some((dh, ch)),
            Some((h0, c0)) => {
                if dh != h0 || ch != c0 {
                    problem.get_or_insert(format!(
                        "PE {me}: iteration {it} is not bit-identical to iteration {} (the \
                         same routing; dispatch hash {dh:#x} vs {h0:#x}, combine hash {ch:#x} \
                         vs {c0:#x})",
                        it % ROUTINGS
                    ));
                }
            }
        }
        buf.recycle(out);
        if it >= a.warmup {
            let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
            times[it - a.warmup] = [
                us(t_disp),
                us(t_comb),
                us(t_send),
                us(t_disp - t_send),
                us(c_send),
                us(t_comb - c_send),
            ];
        }
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    // Bytes this PE sends per call: the selected slots, averaged over the timed iterations'
    // routings.
    let sel = (a.warmup..total)
        .map(|it| {
            routings[it % ROUTINGS]
                .topk_idx
                .iter()
                .filter(|&&e| e >= 0)
                .count() as f64
        })
        .sum::<f64>()
        / a.iters.max(1) as f64;
    let mine_bytes = [
        sel * buf.layout().msg_bytes as f64,
        sel * (cfg.hidden * 2) as f64,
    ];
    // Gather times, bytes and check results at every PE (host collective, outside timing).
    let mut blob = Vec::new();
    blob.extend((problem.is_some() as u64).to_le_bytes());
    for v in mine_bytes {
        blob.extend(v.to_le_bytes());
    }
    for row in &times {
        for v in row {
            blob.extend(v.to_le_bytes());
        }
    }
    blob.extend(problem.clone().unwrap_or_default().into_bytes());
    let all_blobs = pe.boot().allgather(&team.group(), &blob)?;
    let f = |b: &[u8], i: usize| {
        f64::from_le_bytes(b[8 + i * 8..16 + i * 8].try_into().unwrap_or([0; 8]))
    };
    let mut errors = Vec::new();
    let mut per_iter = vec![[0f64; 6]; a.iters];
    let (mut db, mut cb) = (0.0, 0.0);
    for b in &all_blobs {
        db += f(b, 0) / n as f64;
        cb += f(b, 1) / n as f64;
        for (i, slot) in per_iter.iter_mut().enumerate() {
            for (j, s) in slot.iter_mut().enumerate() {
                *s = s.max(f(b, 2 + i * 6 + j));
            }
        }
        let text_at = 8 + (2 + a.iters * 6) * 8;
        if b[..8] != [0u8; 8] {
            errors.push(String::from_utf8_lossy(&b[text_at..]).into_owned());
        }
    }
    let layout_bytes = buf.layout().total_bytes;
    buf.destroy()?;
    if me != 0 {
        return Ok(None);
    }
    let col = |j: usize| stats(per_iter.iter().map(|r| r[j]).collect());
    let (dm, dp) = col(0);
    let (cm, cp) = col(1);
    let hook = |j: usize| a.hook.then(|| col(j).0);
    Ok(Some(EpPoint {
        bench: "ep",
        validated: errors.is_empty(),
        device: "cpu",
        transport: transports(pe),
        pes: n,
        tokens,
        hidden: cfg.hidden,
        topk: cfg.num_topk,
        experts: cfg.num_experts,
        fp8: cfg.use_fp8,
        round_scale: cfg.round_scale,
        hook: a.hook,
        zero_copy: a.zero_copy,
        iters: a.iters,
        warmup: a.warmup,
        dispatch_us_median: dm,
        dispatch_us_p99: dp,
        combine_us_median: cm,
        combine_us_p99: cp,
        dispatch_send_us_median: hook(2),
        dispatch_recv_us_median: hook(3),
        combine_send_us_median: hook(4),
        combine_recv_us_median: hook(5),
        dispatch_bytes_per_pe: db,
        combine_bytes_per_pe: cb,
        dispatch_gbps: if dm > 0.0 { db / dm / 1e3 } else { 0.0 },
        combine_gbps: if cm > 0.0 { cb / cm / 1e3 } else { 0.0 },
        combine_calc_diff: diff,
        buffer_bytes: layout_bytes,
        deepep_buffer_bytes: Layout::deepep_size_hint(&cfg),
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        gpu: None,
    }))
}

pub(crate) fn print(r: &EpReport, json: bool) {
    if json {
        match serde_json::to_string(r) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("rshmem bench ep: cannot encode the report: {e}"),
        }
        return;
    }
    let p0 = &r.points[0];
    println!(
        "rshmem bench ep: device {}, transport {}, H={} K={} E={} {}{}{}, {} iterations after \
         {} warm-up; latency = slowest PE per iteration",
        p0.device,
        p0.transport,
        p0.hidden,
        p0.topk,
        p0.experts,
        if p0.fp8 {
            "FP8 dispatch"
        } else {
            "bf16 dispatch"
        },
        if p0.hook { ", hooks" } else { "" },
        if p0.zero_copy {
            ", zero-copy combine"
        } else {
            ""
        },
        p0.iters,
        p0.warmup
    );
    println!(
        "{:>4} {:>6} {:>11} {:>11} {:>9} {:>11} {:>11} {:>9} {:>9}",
        "PEs",
        "tokens",
        "disp med us",
        "disp p99 us",
        "disp GB/s",
        "comb med us",
        "comb p99 us",
        "comb GB/s",
        "validated"
    );
    for p in &r.points {
        println!(
            "{:>4} {:>6} {:>11.1} {:>11.1} {:>9.2} {:>11.1} {:>11.1} {:>9.2} {:>9}",
            p.pes,
            p.tokens,
            p.dispatch_us_median,
            p.dispatch_us_p99,
            p.dispatch_gbps,
            p.combine_us_median,
            p.combine_us_p99,
            p.combine_gbps,
            p.validated
        );
        if p.hook {
            println!(
                "     send/recv split (median us): dispatch {:.1} / {:.1}, combine {:.1} / {:.1}",
                p.dispatch_send_us_median.unwrap_or(0.0),
                p.dispatch_recv_us_median.unwrap_or(0.0),
                p.combine_send_us_median.unwrap_or(0.0),
                p.combine_recv_us_median.unwrap_or(0.0)
            );
        }
    }
    // Per point: buffer and bytes change with the PE count and the tokens of a sweep
    // (before 2026-12-07 the first point's figures stood for every point).
    for p in &r.points {
        let at = if r.points.len() > 1 {
            format!("{} PEs, {} tokens: ", p.pes, p.tokens)
        } else {
            String::new()
        };
        println!(
            "{at}buffer: {:.1} MiB per PE (DeepEP's layout for this shape: {:.1} MiB); bytes \
             sent per PE per call: dispatch {:.0}, combine {:.0}",
            p.buffer_bytes as f64 / (1 << 20) as f64,
            p.deepep_buffer_bytes as f64 / (1 << 20) as f64,
            p.dispatch_bytes_per_pe,
            p.combine_bytes_per_pe
        );
    }
    for p in &r.points {
        if let Some(g) = &p.gpu {
            println!(
                "GPU {} ({} PEs): device-to-device copy {:.1} GB/s (copied; {:.1} GB/s read + \
                 written); dispatch {:.1} GB/s read + written = {:.2} of copy, combine {:.1} GB/s \
                 = {:.2} of copy (target >= 0.60 each)",
                g.gpu,
                p.pes,
                g.copy_gbps,
                2.0 * g.copy_gbps,
                g.dispatch_rw_gbps,
                g.dispatch_copy_fraction,
                g.combine_rw_gbps,
                g.combine_copy_fraction
            );
        }
    }
}

const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// What `plot` needs that can be checked before a run: a `.png` name, an existing folder
/// to write it in, a font.
fn plot_precheck(path: &std::path::Path) -> std::result::Result<(), String> {
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        return Err("the plot is a PNG file: give a name ending in .png".into());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!("{} is not an existing folder", dir.display()));
    }
    if !FONTS.iter().any(|f| std::path::Path::new(f).is_file()) {
        return Err("no TrueType font found (install fonts-dejavu-core)".into());
    }
    Ok(())
}

/// One line of the plot: its name, colour and the value it draws.
type Series = (&'static str, plotters::style::RGBColor, fn(&EpPoint) -> f64);

/// Latency (median, and p99 dashed) of dispatch and combine against PEs or tokens.
fn plot(points: &[EpPoint], path: &std::path::Path) -> std::result::Result<(), String> {
    use plotters::prelude::*;
    let font = FONTS
        .iter()
        .find_map(|f| std::fs::read(f).ok())
        .ok_or("no TrueType font found (install fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| "cannot load the font".to_string())?;
    let by_pes = points.iter().any(|p| p.pes != points[0].pes);
    let xv = |p: &EpPoint| {
        if by_pes {
            p.pes as f64
        } else {
            p.tokens as f64
        }
    };
    let xmax = points.iter().map(xv).fold(1.0, f64::max);
    let xmin = points.iter().map(xv).fold(xmax, f64::min);
    let ymax = points
        .iter()
        .map(|p| p.dispatch_us_p99.max(p.combine_us_p99))
        .fold(1.0, f64::max)
        * 1.1;
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let p0 = &points[0];
    let title = format!(
        "rshmem EP ({} PEs): H={} K={} E={} {}",
        p0.device.to_uppercase(),
        p0.hidden,
        p0.topk,
        p0.experts,
        if p0.fp8 { "FP8" } else { "bf16" }
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (xmin - (xmax - xmin).max(1.0) * 0.05)..(xmax + (xmax - xmin).max(1.0) * 0.05),
            0f64..ymax,
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(if by_pes { "PEs" } else { "tokens per PE" })
        .y_desc("latency (us)")
        .draw()
        .map_err(|e| e.to_string())?;
    let series: [Series; 4] = [
        ("dispatch median", BLUE, |p| p.dispatch_us_median),
        ("dispatch p99", CYAN, |p| p.dispatch_us_p99),
        ("combine median", RED, |p| p.combine_us_median),
        ("combine p99", MAGENTA, |p| p.combine_us_p99),
    ];
    for (name, color, f) in series {
        let pts: Vec<(f64, f64)> = points.iter().map(|p| (xv(p), f(p))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(
                pts.iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
