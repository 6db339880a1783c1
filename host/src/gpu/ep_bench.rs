//! `rshmem bench ep --device gpu`: the EP benchmark on GPU PEs (threads of this process
//! sharing the visible GPUs, or under a launcher one process per GPU: [`run_launched`]),
//! and its correctness suite (`--check`, run by scripts/gpu-check's `ep` step).
//!
//! The suite runs, for each PE count, cases over EP.md's shapes on [`GpuBuffer`] and
//! compares every output with the CPU implementation ([`crate::ep::Buffer`], the oracle,
//! run on CPU PEs in this process) on identical inputs: `recv_count`, every
//! (expert, source) block's rows in order (`src_info`, the top-k slot, the bytes of
//! `recv_x` and `recv_scales`), and `combined_x` bit for bit; plus EP.md's own checks
//! ([`check`]), bit-identical repeats, hooks, zero-copy, int32 ids, faults on one PE seen
//! by all, and a CUDA graph of dispatch + combine replayed with new routing each time.
//!
//! The bench measures, per iteration, every PE's dispatch and combine with CUDA events on
//! its stream; all PEs start each phase together (each stream waits on a host word that
//! PE 0 sets once every PE has enqueued its work, `cuStreamWaitValue32`; under a launcher
//! each process's own word, set after the same host barrier), so host launch skew is not
//! timed. Reported: the slowest PE per iteration, median and p99; and, against
//! the device-to-device copy bandwidth measured in the same run, the bytes every PE reads
//! from send buffers plus writes into receive buffers (dispatch: each selected slot reads
//! its bf16 token row, `2H`, and writes one message into the owner's receive area; combine:
//! each returned row reads `2H` from the expert outputs and writes `2H` into the source's
//! receive rows), summed over PEs, per second, divided by the copy's read + written bytes
//! per second (twice its copied bytes). Unverified on a GPU until gpu-check has run.
//!
//! **No allocation between LL calls.** Every device buffer a case uses is allocated before
//! its first dispatch and freed after its buffer's collective `destroy`. `cuMemFree` may
//! synchronise the device (cuda.h), and `cuMemAlloc` is not promised not to; with the PEs
//! sharing one context, a PE blocked in either while a peer's kernel waits for this PE's
//! next launch would deadlock until the device wait bound traps.

use super::driver::{ck, driver};
use super::ep::{load_module, GpuBuffer, GpuHandle, IdxType, Replayed};
use super::module::{Ctx, Module};
use super::pe::{DevBuf, GpuPe};
use super::run_gpu_threads;
use crate::config::{LaunchInfo, Settings, TransportMode};
use crate::ep::bench::{config_of, EpBenchArgs, EpPoint, EpReport};
use crate::ep::{bf16, check, Buffer, Config, DispatchOutput, Layout, RecvX};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use serde::Serialize;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// GPU-only fields of a bench point (flattened into the JSON object).
#[derive(Debug, Clone, Serialize)]
pub struct GpuEpStats {
    pub gpu: String,
    /// Blocks per kernel launch per PE.
    pub grid: u32,
    /// Device-to-device copy bandwidth, bytes copied per second / 1e9: the better of
    /// cuMemcpyDtoD and the library's rshmem_copy kernel (512 MiB, same GPU).
    pub copy_gbps: f64,
    /// Distinct GPUs the PEs are on (by node and PCI bus id).
    pub gpus: usize,
    pub memcpy_dtod_gbps: f64,
    pub copy_kernel_gbps: f64,
    /// Bytes read from send buffers + written to receive buffers by all PEs in one call.
    pub dispatch_rw_bytes: f64,
    pub combine_rw_bytes: f64,
    /// Those bytes / the median latency (GB/s).
    pub dispatch_rw_gbps: f64,
    pub combine_rw_gbps: f64,
    /// `*_rw_gbps / (2 * copy_gbps * gpus)` (a copy reads and writes each byte; every GPU
    /// copies at once): the target is >= 0.6 each.
    pub dispatch_copy_fraction: f64,
    pub combine_copy_fraction: f64,
}

/// Whether a CUDA device is visible (libcuda loads and reports at least one).
pub fn gpu_present() -> bool {
    super::pe::device_count().is_ok_and(|n| n > 0)
}

/// The bytes of a bf16 tensor as the device stores it (little-endian u16).
fn bf16_bytes(v: &[bf16]) -> &[u8] {
    const _: () = assert!(cfg!(target_endian = "little"));
    // SAFETY: half::bf16 is #[repr(transparent)] over u16 (2 bytes, no padding), so the
    // slice is 2 * len initialised bytes; on a little-endian host they are the
    // device's layout. The returned slice borrows `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn upload(g: &GpuPe, bytes: &[u8], what: &str) -> Result<DevBuf> {
    let b = DevBuf::new(g.ctx(), bytes.len(), what)?;
    if !bytes.is_empty() {
        b.write(bytes)?;
    }
    Ok(b)
}

fn idx_bytes(idx: &[i64], ty: IdxType) -> Vec<u8> {
    match ty {
        IdxType::I64 => idx.iter().flat_map(|v| v.to_le_bytes()).collect(),
        IdxType::I32 => idx.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `s` with a heap large enough for `cfg`'s buffer at `n` PEs.
fn settings_for(mut s: Settings, cfg: &Config, n: usize) -> Result<Settings> {
    let need = crate::heap::RESERVED_BYTES + Layout::size_hint(cfg, n)? + (8 << 20);
    if s.symmetric_size < need {
        s.symmetric_size = need.next_multiple_of(2 << 20);
    }
    Ok(s)
}

// ---------------------------------------------------------------------- the suite

/// One correctness case.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    cfg: Config,
    /// T per PE.
    tokens: Vec<usize>,
    /// Experts tokens may go to (None = all): experts outside receive nothing.
    pool: Option<Vec<usize>>,
    masked_slots: usize,
    /// Token 0 of every PE has every slot masked.
    mask_token0: bool,
    idx: IdxType,
    hook: bool,
    zero_copy: bool,
    seed: u64,
}

fn routing(c: &Case, rank: usize) -> check::Routing {
    let mut r = check::random_routing(
        c.seed,
        rank,
        c.tokens[rank],
        &c.cfg,
        c.pool.as_deref(),
        c.masked_slots,
    );
    if c.mask_token0 && r.num_tokens > 0 {
        r.topk_idx[..c.cfg.num_topk].fill(-1);
    }
    r
}

/// The simulated expert's per-expert factor (not 1, so a row combined from the wrong
/// expert shows).
fn scale(e: usize) -> f32 {
    1.0 + (e % 4) as f32 * 0.25
}

fn cases(n: usize) -> Vec<Case> {
    let cfg = |n_tok, h, e, k, fp8, round| Config {
        num_max_dispatch_tokens_per_rank: n_tok,
        hidden: h,
        num_experts: e,
        num_topk: k,
        use_fp8: fp8,
        round_scale: round,
    };
    let mut v = vec![
        // EP.md's default shape but E = 16 per PE (the bench runs E = 288, validated).
        Case {
            name: "h7168-fp8-T=N".into(),
            cfg: cfg(128, 7168, 16 * n, 8, true, false),
            tokens: vec![128; n],
            pool: None,
            masked_slots: 10,
            mask_token0: false,
            idx: IdxType::I64,
            hook: false,
            zero_copy: false,
            seed: 11,
        },
        // bf16, int32 ids, hooks, zero-copy, experts receiving nothing, a fully masked
        // token, T varying per PE (0 on PE 1).
        Case {
            name: "h2048-bf16-hook-zero-copy".into(),
            cfg: cfg(64, 2048, 6 * n, 3, false, false),
            tokens: (0..n).map(|p| [48, 0, 64][p % 3]).collect(),
            pool: Some((0..6 * n).filter(|e| e % 5 != 1).collect()),
            masked_slots: 7,
            mask_token0: true,
            idx: IdxType::I32,
            hook: true,
            zero_copy: true,
            seed: 12,
        },
        // FP8 with round_scale, K = 1, K > L elsewhere: top-11 over 2 experts per PE.
        Case {
            name: "h4096-fp8-round-K=1".into(),
            cfg: cfg(32, 4096, 4 * n, 1, true, true),
            tokens: vec![32; n],
            pool: None,
            masked_slots: 3,
            mask_token0: false,
            idx: IdxType::I64,
            hook: false,
            zero_copy: false,
            seed: 13,
        },
    ];
    if n <= 3 {
        v.push(Case {
            name: "h5120-fp8-K=11>L".into(),
            cfg: cfg(16, 5120, 2 * n * 3, 11.min(2 * n * 3), true, false),
            tokens: vec![16; n],
            pool: None,
            masked_slots: 5,
            mask_token0: false,
            idx: IdxType::I64,
            hook: true,
            zero_copy: false,
            seed: 14,
        });
    }
    v
}

type Oracle = Vec<(DispatchOutput, Vec<bf16>)>;

/// The CPU implementation on CPU PEs (threads) with the case's inputs.
fn oracle(c: &Case, n: usize) -> Result<Oracle> {
    let cfg = c.cfg;
    let out = crate::pe::run_threads(n, settings_for(Settings::from_env()?, &cfg, n)?, |pe| {
        let team = pe.world().clone();
        let me = pe.my_pe();
        let mut buf = Buffer::new(pe, &team, cfg)?;
        let r = routing(c, me);
        let x = check::origin_x(me, r.num_tokens, cfg.hidden);
        let d = buf.low_latency_dispatch(&x, &r.topk_idx, false)?.wait()?;
        let l = cfg.num_experts / n;
        let mut eo = vec![bf16::ZERO; l * n * cfg.num_max_dispatch_tokens_per_rank * cfg.hidden];
        check::expert_forward(&cfg, n, me, &d, &scale, &mut eo);
        let comb = buf
            .low_latency_combine(&eo, &r.topk_idx, &r.topk_weights, &d.handle, false, false)?
            .wait()?;
        buf.destroy()?;
        Ok((d, comb))
    })?;
    out.into_iter().collect()
}

fn row_bytes(cfg: &Config, x: &RecvX, row: usize) -> Vec<u8> {
    let h = cfg.hidden;
    match x {
        RecvX::Bf16(v) => bf16_bytes(&v[row * h..(row + 1) * h]).to_vec(),
        RecvX::Fp8 { data, scales } => {
            let g = h / crate::ep::fp8::GROUP;
            let mut b = data[row * h..(row + 1) * h].to_vec();
            b.extend(f32_bytes(&scales[row * g..(row + 1) * g]));
            b
        }
    }
}

/// GPU dispatch output against the CPU's: counts, and each (expert, source) block's rows
/// in order (the blocks' places may differ: source order on GPU, arrival order on CPU).
fn compare_dispatch(
    cfg: &Config,
    n: usize,
    me: usize,
    gpu: &DispatchOutput,
    cpu: &DispatchOutput,
) -> Result<()> {
    let l = cfg.num_experts / n;
    let rows = n * cfg.num_max_dispatch_tokens_per_rank;
    let bad = |m: String| Error::Verification(format!("ep GPU vs CPU on PE {me}: {m}"));
    if gpu.recv_count != cpu.recv_count {
        return Err(bad(format!(
            "recv_count {:?}, the CPU's {:?}",
            gpu.recv_count, cpu.recv_count
        )));
    }
    for le in 0..l {
        for s in 0..n {
            let (g, c) = (gpu.layout_range[le * n + s], cpu.layout_range[le * n + s]);
            let (gb, gc) = ((g >> 32) as usize, (g & 0xffff_ffff) as usize);
            let (cb, cc) = ((c >> 32) as usize, (c & 0xffff_ffff) as usize);
            if gc != cc {
                return Err(bad(format!(
                    "local expert {le}, source PE {s}: {gc} rows, the CPU's {cc}"
                )));
            }
            for j in 0..gc {
                let (rg, rc) = (le * rows + gb + j, le * rows + cb + j);
                if gpu.src_info[rg] != cpu.src_info[rc]
                    || gpu.handle.row_k()[rg] != cpu.handle.row_k()[rc]
                {
                    return Err(bad(format!(
                        "local expert {le}, source PE {s}, row {j}: token {} slot {}, the CPU's \
                         token {} slot {}",
                        gpu.src_info[rg],
                        gpu.handle.row_k()[rg],
                        cpu.src_info[rc],
                        cpu.handle.row_k()[rc]
                    )));
                }
                let (a, b) = (
                    row_bytes(cfg, &gpu.recv_x, rg),
                    row_bytes(cfg, &cpu.recv_x, rc),
                );
                if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
                    return Err(bad(format!(
                        "local expert {le}, source PE {s}, row {j} (token {}): byte {i} of the \
                         row (payload, then scales) is {:#04x}, the CPU's {:#04x}",
                        gpu.src_info[rg], a[i], b[i]
                    )));
                }
            }
        }
    }
    Ok(())
}

fn compare_combined(me: usize, h: usize, gpu: &[bf16], cpu: &[bf16]) -> Result<()> {
    if gpu.len() != cpu.len() {
        return Err(Error::Verification(format!(
            "ep GPU vs CPU on PE {me}: combined has {} values, the CPU's {}",
            gpu.len(),
            cpu.len()
        )));
    }
    if let Some(i) = (0..gpu.len()).find(|&i| gpu[i].to_bits() != cpu[i].to_bits()) {
        return Err(Error::Verification(format!(
            "ep GPU vs CPU on PE {me}: combined token {}, column {}: {} ({:#06x}), the CPU's {} \
             ({:#06x})",
            i / h,
            i % h,
            gpu[i],
            gpu[i].to_bits(),
            cpu[i],
            cpu[i].to_bits()
        )));
    }
    Ok(())
}

/// One case on one GPU PE: two repeats (both buffer sets), each compared with the oracle.
/// A failed check is recorded and the calls go on (so the other PEs are not left waiting
/// in their kernels); the first failure is returned at the end.
fn gpu_case(g: &GpuPe, m: &Module, c: &Case, oracle: &Oracle) -> Result<()> {
    let (n, me, cfg) = (g.n_pes(), g.my_pe(), c.cfg);
    let mut buf = GpuBuffer::with_module(g, m, cfg, 0)?;
    let r = routing(c, me);
    // Every device input before the routing's allgather, the last collective step before
    // the first LL call: no PE allocates while a peer's kernel waits for it (module docs:
    // no allocation between LL calls). They are freed after the collective destroy.
    let x = upload(
        g,
        bf16_bytes(&check::origin_x(me, r.num_tokens, cfg.hidden)),
        "x",
    )?;
    let idx = upload(g, &idx_bytes(&r.topk_idx, c.idx), "topk_idx")?;
    let w = upload(g, &f32_bytes(&r.topk_weights), "topk_weights")?;
    let l = cfg.num_experts / n;
    let eo_len = l * n * cfg.num_max_dispatch_tokens_per_rank * cfg.hidden;
    let eo_buf = if c.zero_copy {
        None
    } else {
        Some(DevBuf::new(g.ctx(), eo_len * 2, "expert outputs")?)
    };
    let all = check::allgather_routing(g.pe(), g.pe().world(), &r)?;
    let masked = vec![false; n];
    let mut first: Option<(u64, u64)> = None;
    let mut problem: Option<Error> = None;
    let mut note = |r: Result<()>| {
        if let Err(e) = r {
            problem.get_or_insert(e);
        }
    };
    let body = (|| -> Result<()> {
        for rep in 0..2 {
            let mut h =
                buf.low_latency_dispatch(x.ptr(), idx.ptr(), c.idx, r.num_tokens, c.hook)?;
            if c.hook {
                buf.recv_hook(&mut h)?;
            }
            let d = buf.read_dispatch(&h)?;
            note(check::validate_dispatch(&cfg, me, &all, &masked, &d));
            note(compare_dispatch(&cfg, n, me, &d, &oracle[me].0));
            let mut eo = vec![bf16::ZERO; eo_len];
            check::expert_forward(&cfg, n, me, &d, &scale, &mut eo);
            let eo = bf16_bytes(&eo);
            let src = match &eo_buf {
                None => {
                    buf.get_next_low_latency_combine_buffer(&h)?;
                    let set = (buf.calls() % 2) as usize;
                    g.write_local(buf.zero_copy_offset(set), eo)?;
                    None
                }
                // This PE's previous combine, which read the buffer, finished (read_combined).
                Some(b) => {
                    b.write(eo)?;
                    Some(b.ptr())
                }
            };
            let mut cmb = buf.low_latency_combine(src, idx.ptr(), c.idx, w.ptr(), &h, c.hook)?;
            if c.hook {
                buf.combine_recv_hook(&mut cmb)?;
            }
            let combined = buf.read_combined(&cmb)?;
            note(check::validate_combine(&cfg, n, me, &r, &masked, &scale, &combined).map(|_| ()));
            note(compare_combined(me, cfg.hidden, &combined, &oracle[me].1));
            let hashes = (
                check::dispatch_hash(&cfg, n, &d),
                check::hash_bf16(&combined),
            );
            match first {
                None => first = Some(hashes),
                Some(h0) if h0 != hashes => note(Err(Error::Verification(format!(
                    "ep GPU on PE {me}: repeat {rep} is not bit-identical to repeat 0 \
                 ({hashes:x?} vs {h0:x?})"
                )))),
                Some(_) => {}
            }
        }
        Ok(())
    })();
    // Every PE reaches the collective destroy, even after an error above.
    let d = buf.destroy();
    drop((x, idx, w, eo_buf));
    body.and(problem.map_or(Ok(()), Err)).and(d)
}

/// Faults: an expert id >= E on PE 1, then T > N on PE 0; every PE fails the call naming
/// the PE at fault, and the buffer works again afterwards.
/// The small BF16 shape of the fault cases: H = 2048, two experts per PE.
fn small_bf16(n: usize, tokens: usize, topk: usize) -> Config {
    Config {
        num_max_dispatch_tokens_per_rank: tokens,
        hidden: 2048,
        num_experts: 2 * n,
        num_topk: topk,
        use_fp8: false,
        round_scale: false,
    }
}

/// What a call with an input fault on PE `culprit` must give on PE `me`: the culprit its
/// own InvalidArgument, every other PE EpPeerFailed naming it, both saying `text`.
fn expect_fault<T>(r: Result<T>, me: usize, culprit: usize, text: &str, case: &str) -> Result<()> {
    match r {
        Ok(_) => Err(Error::Verification(format!(
            "ep GPU {case} case on PE {me}: a call with a fault on PE {culprit} succeeded"
        ))),
        Err(Error::EpPeerFailed { peer, reason, .. })
            if me != culprit && peer == culprit && reason.contains(text) =>
        {
            Ok(())
        }
        Err(Error::InvalidArgument(m)) if me == culprit && m.contains(text) => Ok(()),
        Err(e) => Err(Error::Verification(format!(
            "ep GPU {case} case on PE {me}: fault on PE {culprit}: unexpected error: {e}"
        ))),
    }
}

fn fault_case(g: &GpuPe, m: &Module) -> Result<()> {
    let (n, me) = (g.n_pes(), g.my_pe());
    let cfg = small_bf16(n, 16, 2);
    let mut buf = GpuBuffer::with_module(g, m, cfg, 0)?;
    let t_max = 17;
    let x = upload(g, bf16_bytes(&check::origin_x(me, t_max, cfg.hidden)), "x")?;
    let good = check::random_routing(5, me, 16, &cfg, None, 0);
    let mut bad_idx = good.topk_idx.clone();
    bad_idx.resize(t_max * 2, 0);
    if me == 1 % n {
        bad_idx[0] = cfg.num_experts as i64;
    }
    let idx = upload(g, &idx_bytes(&bad_idx, IdxType::I64), "topk_idx")?;
    // Every input of the three calls is uploaded before the first (module docs).
    let idx_ok = upload(g, &idx_bytes(&good.topk_idx, IdxType::I64), "topk_idx")?;
    let mut long_idx = good.topk_idx.clone();
    long_idx.resize(t_max * 2, -1);
    let idx_long = upload(g, &idx_bytes(&long_idx, IdxType::I64), "topk_idx")?;
    // Every slot of 16 tokens names expert 0: its 17th entry (index 16) passes N = 16.
    let idx_over = upload(g, &idx_bytes(&[0i64; 32], IdxType::I64), "topk_idx")?;
    let w = upload(g, &f32_bytes(&good.topk_weights), "topk_weights")?;
    let eo = DevBuf::new(
        g.ctx(),
        buf.num_local_experts() * n * 16 * cfg.hidden * 2,
        "expert outputs",
    )?;
    // One 16-byte vector short of 16 tokens, and of the expert outputs: the end of each is
    // no allocation's (the next one starts at a page or allocation boundary past it).
    let mut short = bf16_bytes(&check::origin_x(me, 16, cfg.hidden)).to_vec();
    short.truncate(short.len() - 16);
    let x_short = upload(g, &short, "x")?;
    let eo_short = DevBuf::new(
        g.ctx(),
        buf.num_local_experts() * n * 16 * cfg.hidden * 2 - 16,
        "expert outputs",
    )?;
    let expect = |r: Result<DispatchOutput>, culprit: usize, text: &str| {
        expect_fault(r, me, culprit, text, "fault")
    };
    // A null device pointer on PE `culprit`: its own error names the pointer, every other
    // PE's the poisoned call (before 2026-12-07 only the culprit failed, at once, and the
    // others' kernels waited for it until their timeout trapped).
    let bad_tensor = |r: std::result::Result<(), Error>, culprit: usize, what: &str| match r {
        Err(Error::InvalidArgument(m)) if me == culprit && m.contains(what) => Ok(()),
        Err(Error::EpPeerFailed { peer, reason, .. })
            if me != culprit
                && peer == culprit
                && reason.contains("a null, misaligned or too short device tensor") =>
        {
            Ok(())
        }
        r => Err(Error::Verification(format!(
            "ep GPU fault case on PE {me}: {what} on PE {culprit}: got {r:?}"
        ))),
    };
    let body = (|| -> Result<()> {
        // 1: a bad expert id on PE 1 (PE 0 when alone).
        // A call that ends other than expected is recorded and the calls go on (the other
        // PEs' kernels and collectives wait for this one).
        let h = buf.low_latency_dispatch(x.ptr(), idx.ptr(), IdxType::I64, 16, false)?;
        let first = expect(buf.read_dispatch(&h), 1 % n, "is outside [-1,");
        // 2: T = N + 1 on PE 0 (others pass valid input).
        let (p, t) = if me == 0 {
            (idx_long.ptr(), t_max)
        } else {
            (idx_ok.ptr(), 16)
        };
        let h = buf.low_latency_dispatch(x.ptr(), p, IdxType::I64, t, false)?;
        let second = expect(buf.read_dispatch(&h), 0, "tokens");
        // 2b: on the last PE, an expert named more than N times (fault code 5).
        let p = if me == n - 1 {
            idx_over.ptr()
        } else {
            idx_ok.ptr()
        };
        let h = buf.low_latency_dispatch(x.ptr(), p, IdxType::I64, 16, false)?;
        let over = expect(
            buf.read_dispatch(&h),
            n - 1,
            "its topk_idx[8][0] names an expert 17 times",
        );
        // 2c: a null x on PE 1 (PE 0 when alone).
        let culprit = 1 % n;
        let p = if me == culprit { 0 } else { x.ptr() };
        let h = buf.low_latency_dispatch(p, idx_ok.ptr(), IdxType::I64, 16, false)?;
        let null_x = bad_tensor(
            buf.read_dispatch(&h).map(|_| ()),
            culprit,
            "low_latency_dispatch: x is a null device pointer",
        );
        // 3: a valid call afterwards works (the credits flowed through the failed calls).
        let all = check::allgather_routing(g.pe(), g.pe().world(), &good)?;
        let h = buf.low_latency_dispatch(x.ptr(), idx_ok.ptr(), IdxType::I64, 16, false)?;
        let third =
            check::validate_dispatch(&cfg, me, &all, &vec![false; n], &buf.read_dispatch(&h)?);
        // 4: its combine with null weights on the last PE fails on every PE, and the
        // next round trip is in step.
        let culprit = n - 1;
        let wp = if me == culprit { 0 } else { w.ptr() };
        let c =
            buf.low_latency_combine(Some(eo.ptr()), idx_ok.ptr(), IdxType::I64, wp, &h, false)?;
        let null_w = bad_tensor(
            buf.read_combined(&c).map(|_| ()),
            culprit,
            "low_latency_combine: topk_weights is a null device pointer",
        );
        let h = buf.low_latency_dispatch(x.ptr(), idx_ok.ptr(), IdxType::I64, 16, false)?;
        let fourth =
            check::validate_dispatch(&cfg, me, &all, &vec![false; n], &buf.read_dispatch(&h)?);
        // 5: expert outputs 16 bytes short of [L, R * N, H] on PE 1 (PE 0 when alone): the
        // kernels would read past the allocation (a fault that ends the CUDA context);
        // the call fails on every PE instead, and the next round trip is in step.
        let culprit = 1 % n;
        let eo_p = if me == culprit {
            eo_short.ptr()
        } else {
            eo.ptr()
        };
        let c =
            buf.low_latency_combine(Some(eo_p), idx_ok.ptr(), IdxType::I64, w.ptr(), &h, false)?;
        let short_eo = bad_tensor(
            buf.read_combined(&c).map(|_| ()),
            culprit,
            "low_latency_combine: expert outputs",
        );
        // 6: x 16 bytes short of [16, H] on the last PE.
        let culprit = n - 1;
        let xp = if me == culprit {
            x_short.ptr()
        } else {
            x.ptr()
        };
        let h = buf.low_latency_dispatch(xp, idx_ok.ptr(), IdxType::I64, 16, false)?;
        let short_x = bad_tensor(
            buf.read_dispatch(&h).map(|_| ()),
            culprit,
            "low_latency_dispatch: x",
        );
        let h = buf.low_latency_dispatch(x.ptr(), idx_ok.ptr(), IdxType::I64, 16, false)?;
        let fifth =
            check::validate_dispatch(&cfg, me, &all, &vec![false; n], &buf.read_dispatch(&h)?);
        first
            .and(second)
            .and(over)
            .and(null_x)
            .and(third)
            .and(null_w)
            .and(fourth)
            .and(short_eo)
            .and(short_x)
            .and(fifth)
    })();
    // Every PE reaches the collective destroy, even after an error above.
    let d = buf.destroy();
    drop((x, idx, idx_ok, idx_long, idx_over, w, eo, x_short, eo_short));
    body.and(d)
}

/// A failed dispatch's error survives a failing combine on its buffer set: dispatch A
/// (call 0, set 0) with a bad expert id on PE 1, dispatch B (call 1, set 1), then a
/// combine of A's handle (call 2, set 0) that fails too (zero copy without its buffer, a
/// fault every PE records); reading A's outputs afterwards still fails naming the bad id.
/// Before 2026-12-07 the kernels kept one status record per set, the combine's replaced
/// the dispatch's, and A's partial outputs were returned as a success.
fn status_case(g: &GpuPe, m: &Module) -> Result<()> {
    let (n, me) = (g.n_pes(), g.my_pe());
    let cfg = small_bf16(n, 16, 2);
    let mut buf = GpuBuffer::with_module(g, m, cfg, 0)?;
    let good = check::random_routing(7, me, 16, &cfg, None, 0);
    let mut bad_idx = good.topk_idx.clone();
    if me == 1 % n {
        bad_idx[0] = cfg.num_experts as i64;
    }
    let x = upload(g, bf16_bytes(&check::origin_x(me, 16, cfg.hidden)), "x")?;
    let idx_bad = upload(g, &idx_bytes(&bad_idx, IdxType::I64), "topk_idx")?;
    let idx_ok = upload(g, &idx_bytes(&good.topk_idx, IdxType::I64), "topk_idx")?;
    let w = upload(g, &f32_bytes(&good.topk_weights), "topk_weights")?;
    let culprit = 1 % n;
    let body = (|| -> Result<()> {
        let mut ha = buf.low_latency_dispatch(x.ptr(), idx_bad.ptr(), IdxType::I64, 16, true)?;
        buf.recv_hook(&mut ha)?;
        let _hb = buf.low_latency_dispatch(x.ptr(), idx_ok.ptr(), IdxType::I64, 16, false)?;
        // Zero copy without get_next_low_latency_combine_buffer: a fault on every PE.
        let c = buf.low_latency_combine(None, idx_ok.ptr(), IdxType::I64, w.ptr(), &ha, false)?;
        if buf.read_combined(&c).is_ok() {
            return Err(Error::Verification(format!(
                "ep GPU status case on PE {me}: the faulty combine succeeded"
            )));
        }
        // Read after a failing combine on its set: still the dispatch's own fault.
        expect_fault(
            buf.read_dispatch(&ha),
            me,
            culprit,
            "is outside [-1,",
            "status",
        )
    })();
    let d = buf.destroy();
    drop((x, idx_bad, idx_ok, w));
    body.and(d)
}

/// A corrupt message (p2p only: the sends must have landed when the host writes): after
/// every PE's dispatch send kernel ended, PE 0 overwrites the header of the first message
/// from PE 1 in its receive area with token N (out of [0, N)), then every PE runs its
/// receive hook. PE 0's dispatch fails with the CPU's words, every other PE's validates
/// against the routing, and the combine of that handle fails on every PE (PE 0 poisons
/// it: EP_FAULT_DISPATCH_HEADER) instead of trapping (as before 2026-12-07) or returning
/// a row to the wrong token. PE 1's token 0 names expert 0 (on PE 0), so the message is
/// there.
fn header_case(g: &GpuPe, m: &Module) -> Result<()> {
    let (n, me) = (g.n_pes(), g.my_pe());
    let tokens = 16;
    let cfg = small_bf16(n, tokens, 2);
    let mut buf = GpuBuffer::with_module(g, m, cfg, 0)?;
    let mut r = check::random_routing(13, me, tokens, &cfg, None, 0);
    if me == 1 {
        r.topk_idx[0] = 0;
    }
    let all = check::allgather_routing(g.pe(), g.pe().world(), &r)?;
    let x = upload(g, bf16_bytes(&check::origin_x(me, tokens, cfg.hidden)), "x")?;
    let idx = upload(g, &idx_bytes(&r.topk_idx, IdxType::I64), "topk_idx")?;
    let w = upload(g, &f32_bytes(&r.topk_weights), "topk_weights")?;
    let rows = n * tokens;
    let eo = DevBuf::new(
        g.ctx(),
        buf.num_local_experts() * rows * cfg.hidden * 2,
        "expert outputs",
    )?;
    let body = (|| -> Result<()> {
        let set = (buf.calls() % 2) as usize;
        let mut h = buf.low_latency_dispatch(x.ptr(), idx.ptr(), IdxType::I64, tokens, true)?;
        // Every PE's sends have landed (p2p stores, their kernels ended) before PE 0
        // writes over one of them.
        g.sync("header case: dispatch send")?;
        g.pe().barrier_all()?;
        if me == 0 {
            let at = buf.heap_offset() + buf.layout().dispatch_recv_msg(set, 1, 0);
            let header: Vec<u8> = [tokens as i32, 0i32]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            g.write_local(at, &header)?;
        }
        g.pe().barrier_all()?;
        buf.recv_hook(&mut h)?;
        let dispatched = buf.read_dispatch(&h);
        let first = match (me, dispatched) {
            (0, Err(Error::Verification(m)))
                if m.contains(&format!("PE 1 sent token index {tokens}, top-k slot 0")) =>
            {
                Ok(())
            }
            (0, other) => Err(Error::Verification(format!(
                "ep GPU header case on PE 0: expected the corrupt header reported, got {:?}",
                other.map(|_| "a validated dispatch")
            ))),
            (_, Ok(o)) => check::validate_dispatch(&cfg, me, &all, &vec![false; n], &o),
            (_, Err(e)) => Err(Error::Verification(format!(
                "ep GPU header case on PE {me}: only PE 0 received a corrupt message: {e}"
            ))),
        };
        let c =
            buf.low_latency_combine(Some(eo.ptr()), idx.ptr(), IdxType::I64, w.ptr(), &h, false)?;
        let second = expect_fault(buf.read_combined(&c), me, 0, "corrupt message", "header");
        first.and(second)
    })();
    let d = buf.destroy();
    drop((x, idx, w, eo));
    body.and(d)
}

/// Two dispatches in flight (receive hooks), then PE 0 combines the first one's handle
/// and the others the second's: every PE fails naming a PE that combined another
/// dispatch (the CPU's check; at 2 PEs both routings return the same number of rows from
/// each PE, so only the handle mark tells; with more, the mark is checked before the
/// counts).
fn handle_case(g: &GpuPe, m: &Module) -> Result<()> {
    let (n, me) = (g.n_pes(), g.my_pe());
    let cfg = small_bf16(n, 4, 1);
    let mut buf = GpuBuffer::with_module(g, m, cfg, 0)?;
    // Token t of PE me goes to expert (2 me + t + shift) % E: at 2 PEs every owner gets
    // the same count from each PE for shift 0 (A) and 1 (B).
    let ids = |shift: usize| -> Vec<i64> {
        (0..4)
            .map(|t| ((2 * me + t + shift) % cfg.num_experts) as i64)
            .collect()
    };
    let x = upload(g, bf16_bytes(&check::origin_x(me, 4, cfg.hidden)), "x")?;
    let ia = upload(g, &idx_bytes(&ids(0), IdxType::I64), "topk_idx")?;
    let ib = upload(g, &idx_bytes(&ids(1), IdxType::I64), "topk_idx")?;
    let w = upload(g, &f32_bytes(&[1.0f32; 4]), "topk_weights")?;
    let l = cfg.num_experts / n;
    let eo = DevBuf::new(g.ctx(), l * n * 4 * cfg.hidden * 2, "expert outputs")?;
    let body = (|| -> Result<()> {
        let mut ha = buf.low_latency_dispatch(x.ptr(), ia.ptr(), IdxType::I64, 4, true)?;
        let mut hb = buf.low_latency_dispatch(x.ptr(), ib.ptr(), IdxType::I64, 4, true)?;
        buf.recv_hook(&mut ha)?;
        buf.recv_hook(&mut hb)?;
        let (h, idx) = if me == 0 { (&ha, &ia) } else { (&hb, &ib) };
        let c =
            buf.low_latency_combine(Some(eo.ptr()), idx.ptr(), IdxType::I64, w.ptr(), h, false)?;
        match buf.read_combined(&c) {
            Err(Error::InvalidArgument(msg))
                if msg.contains("combined with the handle of another dispatch")
                    && msg.contains(if me == 0 { "PE 1 " } else { "PE 0 " }) =>
            {
                Ok(())
            }
            other => Err(Error::Verification(format!(
                "ep GPU handle case on PE {me}: combining with another dispatch's handle \
                 than PE {} gave {:?}",
                if me == 0 { 1 } else { 0 },
                other.map(|v| v.len())
            ))),
        }
    })();
    let d = buf.destroy();
    drop((x, ia, ib, w, eo));
    body.and(d)
}

/// The device inputs of [`checked_round_trips`]: 32 tokens of routing `r` on member `me`
/// of `n`, and room for the expert outputs. Made before the collective step that precedes
/// the first LL call (so no PE allocates while a peer's kernel waits for it), and dropped
/// only after the buffer's collective `destroy` (freeing device memory may wait for the
/// device while another PE's kernel still waits for this one: docs/gpu-design.md).
struct RoundTripInputs {
    x: DevBuf,
    idx: DevBuf,
    w: DevBuf,
    eo: DevBuf,
}

impl RoundTripInputs {
    fn upload(
        g: &GpuPe,
        cfg: &Config,
        (n, me): (usize, usize),
        r: &check::Routing,
    ) -> Result<Self> {
        let l = cfg.num_experts / n;
        Ok(RoundTripInputs {
            x: upload(g, bf16_bytes(&check::origin_x(me, 32, cfg.hidden)), "x")?,
            idx: upload(g, &idx_bytes(&r.topk_idx, IdxType::I64), "topk_idx")?,
            w: upload(g, &f32_bytes(&r.topk_weights), "topk_weights")?,
            eo: DevBuf::new(g.ctx(), l * n * 32 * cfg.hidden * 2, "expert outputs")?,
        })
    }
}

/// `rounds` round trips of 32 tokens on `buf` (this PE is `me` of the buffer's `n` team
/// members; inputs `inp` of routing `r`, every member's `all`), each checked with EP.md's
/// checks with `masked`; the first failed check (with its round when there are several)
/// goes to `problem`.
#[allow(clippy::too_many_arguments)]
fn checked_round_trips(
    buf: &mut GpuBuffer,
    inp: &RoundTripInputs,
    cfg: &Config,
    (n, me): (usize, usize),
    r: &check::Routing,
    all: &[check::Routing],
    masked: &[bool],
    rounds: usize,
    problem: &mut Option<Error>,
) -> Result<()> {
    let l = cfg.num_experts / n;
    let tagged = |round: usize, e: Error| match rounds {
        1 => e,
        _ => Error::Verification(format!("round {round}: {e}")),
    };
    for round in 0..rounds {
        let h = buf.low_latency_dispatch(inp.x.ptr(), inp.idx.ptr(), IdxType::I64, 32, false)?;
        let d = buf.read_dispatch(&h)?;
        if let Err(e) = check::validate_dispatch(cfg, me, all, masked, &d) {
            problem.get_or_insert(tagged(round, e));
        }
        let mut eo = vec![bf16::ZERO; l * n * 32 * cfg.hidden];
        check::expert_forward(cfg, n, me, &d, &scale, &mut eo);
        inp.eo.write(bf16_bytes(&eo))?;
        let c = buf.low_latency_combine(
            Some(inp.eo.ptr()),
            inp.idx.ptr(),
            IdxType::I64,
            inp.w.ptr(),
            &h,
            false,
        )?;
        let comb = buf.read_combined(&c)?;
        if let Err(e) = check::validate_combine(cfg, n, me, r, masked, &scale, &comb) {
            problem.get_or_insert(tagged(round, e));
        }
    }
    Ok(())
}

/// `clean_mask`, then a check that the mask is empty (a failure goes to `problem`).
fn clean_and_check(
    buf: &mut GpuBuffer,
    case: &str,
    me: usize,
    problem: &mut Option<Error>,
) -> Result<()> {
    buf.clean_mask()?;
    let q = buf.query_mask()?;
    if q.iter().any(|&m| m) {
        problem.get_or_insert(Error::Verification(format!(
            "ep GPU {case} on PE {me}: clean_mask left {q:?}"
        )));
    }
    Ok(())
}

/// The end of a case on every PE alike, whatever its body returned: a barrier, then the
/// buffer's collective `destroy` (a PE that left a case early would pair its next
/// collective with the others' destroy, and its allocator would drift from theirs). Then
/// the first of: the body's error, the first failed check, the barrier's, destroy's.
fn end_case(g: &GpuPe, buf: GpuBuffer, body: Result<()>, problem: Option<Error>) -> Result<()> {
    let b = g.pe().barrier_all();
    let d = buf.destroy();
    body.and(problem.map_or(Ok(()), Err)).and(b).and(d)
}

/// A dead PE (the last one) masked by every other PE: it makes no LL calls, the others'
/// dispatch and combine skip it (EP.md's checks with the mask), then the mask is cleared.
fn mask_case(g: &GpuPe, m: &Module) -> Result<()> {
    let (n, me) = (g.n_pes(), g.my_pe());
    let dead = n - 1;
    let cfg = Config {
        num_max_dispatch_tokens_per_rank: 32,
        hidden: 4096,
        num_experts: 4 * n,
        num_topk: 4,
        use_fp8: true,
        round_scale: false,
    };
    let mut buf = GpuBuffer::with_module(g, m, cfg, 0)?;
    let r = check::random_routing(21, me, 32, &cfg, None, 4);
    let inp = RoundTripInputs::upload(g, &cfg, (n, me), &r)?;
    let all = check::allgather_routing(g.pe(), g.pe().world(), &r)?;
    let mut masked = vec![false; n];
    masked[dead] = true;
    let mut problem: Option<Error> = None;
    let body = if me != dead {
        (|| -> Result<()> {
            buf.update_mask(dead, true)?;
            let q = buf.query_mask()?;
            if q != masked {
                problem.get_or_insert(Error::Verification(format!(
                    "ep GPU mask on PE {me}: query_mask {q:?}"
                )));
            }
            let at = (n, me);
            checked_round_trips(&mut buf, &inp, &cfg, at, &r, &all, &masked, 1, &mut problem)?;
            clean_and_check(&mut buf, "mask", me, &mut problem)
        })()
    } else if buf.update_mask(me, true).is_ok() {
        Err(Error::Verification(
            "ep GPU mask: a PE could mask itself".into(),
        ))
    } else {
        Ok(())
    };
    let r = end_case(g, buf, body, problem);
    drop(inp);
    r
}

/// Shrink mode (ep_ll.cu "Shrink mode"): the last PE makes no LL calls (a PE that died);
/// nobody masks it, the others' buffers are in shrink mode with a 2 s bound, so their
/// kernels give up on it instead of trapping. Two round trips, each checked with EP.md's
/// checks with the dead PE masked (the first gives up on it; the second skips it); the
/// mask then holds exactly that PE, and clean_mask clears it.
fn shrink_case(g: &GpuPe, m: &Module) -> Result<()> {
    let (n, me) = (g.n_pes(), g.my_pe());
    let dead = n - 1;
    let cfg = Config {
        num_max_dispatch_tokens_per_rank: 32,
        hidden: 2048,
        num_experts: 2 * n,
        num_topk: 2,
        use_fp8: true,
        round_scale: false,
    };
    let mut buf = GpuBuffer::with_module(g, m, cfg, 0)?;
    buf.set_shrink(true);
    // Long enough for a live PE whose host thread launches late, short for the step.
    buf.set_shrink_timeout(Some(std::time::Duration::from_secs(2)));
    let r = check::random_routing(31, me, 32, &cfg, None, 4);
    let inp = RoundTripInputs::upload(g, &cfg, (n, me), &r)?;
    let all = check::allgather_routing(g.pe(), g.pe().world(), &r)?;
    let mut masked = vec![false; n];
    masked[dead] = true;
    let mut problem: Option<Error> = None;
    let body = if me != dead {
        (|| -> Result<()> {
            let at = (n, me);
            checked_round_trips(&mut buf, &inp, &cfg, at, &r, &all, &masked, 2, &mut problem)?;
            let q = buf.query_mask()?;
            if q != masked {
                problem.get_or_insert(Error::Verification(format!(
                    "ep GPU shrink on PE {me}: query_mask {q:?}, want {masked:?}"
                )));
            }
            clean_and_check(&mut buf, "shrink", me, &mut problem)
        })()
    } else {
        Ok(())
    };
    let r = end_case(g, buf, body, problem);
    drop(inp);
    r
}

/// EP groups of a split of different sizes: PEs [0, a) and [a, n) with a = n/2 - 1 (3 and
/// 5 of 8), each group with its own buffer on its team (`GpuBuffer::with_module_on`), at
/// the same time, in one world allocation of the larger need; one round trip each,
/// validated with EP.md's checks against the group's routing (sources and experts
/// numbered in the group).
fn team_case(g: &GpuPe, m: &Module) -> Result<()> {
    let n = g.n_pes();
    let world = g.pe().world().clone();
    let (na, nb) = (n / 2 - 1, n - (n / 2 - 1));
    let first = g.pe().team_split_strided(&world, 0, 1, na)?;
    let second = g.pe().team_split_strided(&world, na, 1, nb)?;
    let team = first.clone().or(second.clone()).ok_or_else(|| {
        Error::Verification(format!(
            "ep GPU teams: PE {} is in neither group",
            g.my_pe()
        ))
    })?;
    let (tn, me) = (team.n_pes(), team.my_pe());
    let cfg = Config {
        num_max_dispatch_tokens_per_rank: 32,
        hidden: 2560,
        num_experts: na * nb,
        num_topk: 4.min(na * nb),
        use_fp8: true,
        round_scale: false,
    };
    let mut buf = GpuBuffer::with_module_on(g, m, &team, cfg, 0)?;
    let r = check::random_routing(41 + (g.my_pe() >= na) as u64, me, 32, &cfg, None, 4);
    let inp = RoundTripInputs::upload(g, &cfg, (tn, me), &r)?;
    let all = check::allgather_routing(g.pe(), &team, &r)?;
    let none = vec![false; tn];
    let mut problem = None;
    let at = (tn, me);
    let body = checked_round_trips(&mut buf, &inp, &cfg, at, &r, &all, &none, 1, &mut problem);
    // The groups finish at different times: the barrier in end_case comes before any PE
    // frees the inputs or the buffer.
    let checked = end_case(g, buf, body, problem);
    drop(inp);
    for t in [first, second].into_iter().flatten() {
        g.pe().team_destroy(t)?;
    }
    checked
}

/// A CUDA graph of dispatch + combine (bf16; the identity expert reads `recv_x` in place),
/// replayed with new routing and weights written into the same device buffers.
fn graph_case(g: &GpuPe, m: &Module, replays: usize) -> Result<()> {
    let (n, me) = (g.n_pes(), g.my_pe());
    let cfg = Config {
        num_max_dispatch_tokens_per_rank: 32,
        hidden: 2560,
        num_experts: 4 * n,
        num_topk: 4.min(4 * n),
        use_fp8: false,
        round_scale: false,
    };
    let t = 32;
    let mut buf = GpuBuffer::with_module(g, m, cfg, 0)?;
    let x = upload(g, bf16_bytes(&check::origin_x(me, t, cfg.hidden)), "x")?;
    let idx = DevBuf::new(g.ctx(), t * cfg.num_topk * 8, "topk_idx")?;
    let w = DevBuf::new(g.ctx(), t * cfg.num_topk * 4, "topk_weights")?;
    let r0 = check::random_routing(100, me, t, &cfg, None, 4);
    idx.write(&idx_bytes(&r0.topk_idx, IdxType::I64))?;
    w.write(&f32_bytes(&r0.topk_weights))?;
    let (graph, ()) = buf.capture(|b| {
        let h = b.low_latency_dispatch(x.ptr(), idx.ptr(), IdxType::I64, t, false)?;
        let recv_x = b.dispatch_outputs(&h)?.recv_x;
        b.low_latency_combine(Some(recv_x), idx.ptr(), IdxType::I64, w.ptr(), &h, false)?;
        Ok(())
    })?;
    let identity = |_e: usize| 1.0f32;
    let masked = vec![false; n];
    // A failed check is recorded and the replays go on (the other PEs' kernels and
    // barriers wait for this one); an error of a call ends the replays.
    let mut problem: Option<Error> = None;
    let body = (|| -> Result<()> {
        if graph.calls() != 2 || buf.calls() != 0 {
            return Err(Error::Verification(format!(
                "ep graph: captured {} calls, buffer at call {} (expected 2 and 0)",
                graph.calls(),
                buf.calls()
            )));
        }
        for rep in 0..replays {
            let r = check::random_routing(101 + rep as u64, me, t, &cfg, None, 4 + rep);
            idx.write(&idx_bytes(&r.topk_idx, IdxType::I64))?;
            w.write(&f32_bytes(&r.topk_weights))?;
            let all = check::allgather_routing(g.pe(), g.pe().world(), &r)?;
            let calls = buf.replay(&graph)?;
            for call in calls {
                match call {
                    Replayed::Dispatch(h) => {
                        let d = buf.read_dispatch(&h)?;
                        if let Err(e) = check::validate_dispatch(&cfg, me, &all, &masked, &d) {
                            problem.get_or_insert(Error::Verification(format!(
                                "graph replay {rep}: {e}"
                            )));
                        }
                    }
                    Replayed::Combine(c) => {
                        let comb = buf.read_combined(&c)?;
                        let v = check::validate_combine(&cfg, n, me, &r, &masked, &identity, &comb);
                        if let Err(e) = v {
                            problem.get_or_insert(Error::Verification(format!(
                                "graph replay {rep}: {e}"
                            )));
                        }
                    }
                }
            }
            // Every PE read its outputs before anyone writes the next inputs' routing.
            g.pe().barrier_all()?;
        }
        if buf.calls() != 2 * replays as u64 {
            return Err(Error::Verification(format!(
                "ep graph: buffer at call {} after {replays} replays",
                buf.calls()
            )));
        }
        Ok(())
    })();
    // Every PE reaches the collective destroy, even after an error above.
    drop(graph);
    let d = buf.destroy();
    drop((x, idx, w));
    body.and(problem.map_or(Ok(()), Err)).and(d)
}

/// `rshmem bench ep --device gpu --check`: the suite for every `--pes` count.
pub fn check_cli(a: &EpBenchArgs) -> i32 {
    match check_suite(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rshmem bench ep --check: {e}");
            1
        }
    }
}

fn check_suite(a: &EpBenchArgs) -> Result<()> {
    if a.device == "cpu" {
        return Err(Error::InvalidArgument(
            "--check is the GPU correctness suite: use --device gpu (or auto on a GPU machine)"
                .into(),
        ));
    }
    if a.device != "gpu" && a.device != "auto" {
        return Err(Error::InvalidArgument(format!(
            "--device {}: expected cpu, gpu or auto",
            a.device
        )));
    }
    driver()?;
    let mut failures = 0;
    for &n in &a.pes {
        if n == 0 {
            return Err(Error::InvalidArgument("--pes must be at least 1".into()));
        }
        // The oracle of every case first (CPU PEs), then one job of GPU PEs runs them all
        // with one module instance per PE.
        let cs = cases(n);
        let mut oracles = Vec::new();
        for c in &cs {
            oracles.push(oracle(c, n));
        }
        let mut s = crate::ep::bench::settings_of(a)?;
        for c in &cs {
            s = settings_for(s, &c.cfg, n)?;
        }
        // The cases after the shapes: name, the fewest PEs it needs, the case.
        type Case = fn(&GpuPe, &Module) -> Result<()>;
        let extra: Vec<(&str, Case)> = [
            ("faults", 1, fault_case as Case),
            ("graph-replay-x3", 1, |g, m| graph_case(g, m, 3)),
            ("status-per-kind", 1, status_case),
            ("handle-mismatch", 2, handle_case),
            ("corrupt-header", 2, header_case),
            ("masked-PE", 3, mask_case),
            ("shrink-dead-PE", 3, shrink_case),
            ("team-split", 4, team_case),
        ]
        .into_iter()
        // The corrupt header is written by the host once the sends' kernels ended, which
        // means landed only over p2p (the suite's PEs are threads of one process: auto
        // is p2p); over a NIC's queues the write could come before the message.
        .filter(|&(name, fewest, _)| {
            n >= fewest
                && (name != "corrupt-header"
                    || matches!(s.transport, TransportMode::Auto | TransportMode::P2p))
        })
        .map(|(name, _, case)| (name, case))
        .collect();
        let names: Vec<String> = cs
            .iter()
            .map(|c| c.name.clone())
            .chain(extra.iter().map(|(name, _)| name.to_string()))
            .collect();
        let t0 = Instant::now();
        let per_pe = run_gpu_threads(n, s, |g| {
            let m = load_module(g)?;
            let mut out: Vec<(Result<()>, f64)> = Vec::new();
            for (c, o) in cs.iter().zip(&oracles) {
                let t = Instant::now();
                let r = match o {
                    Ok(o) => gpu_case(g, &m, c, o),
                    Err(e) => Err(Error::Verification(format!("the CPU oracle failed: {e}"))),
                };
                out.push((r, t.elapsed().as_secs_f64()));
                g.pe().barrier_all()?;
            }
            // A barrier between cases (the shapes' loop ends with one).
            for (i, (_, case)) in extra.iter().enumerate() {
                if i > 0 {
                    g.pe().barrier_all()?;
                }
                let t = Instant::now();
                out.push((case(g, &m), t.elapsed().as_secs_f64()));
            }
            Ok(out)
        });
        match per_pe {
            Err(e) => {
                failures += report(
                    &format!("{n} PEs"),
                    Err::<(), _>(e),
                    t0.elapsed().as_secs_f64(),
                    a.json,
                )
            }
            Ok(per_pe) => {
                let mut rows: Vec<(Option<String>, f64)> = vec![(None, 0.0); names.len()];
                for (pe, r) in per_pe.into_iter().enumerate() {
                    match r {
                        Err(e) => {
                            for row in rows.iter_mut() {
                                row.0.get_or_insert(format!("PE {pe}: {e}"));
                            }
                        }
                        Ok(v) => {
                            for (i, (r, secs)) in v.into_iter().enumerate() {
                                rows[i].1 = rows[i].1.max(secs);
                                if let Err(e) = r {
                                    rows[i].0.get_or_insert(format!("PE {pe}: {e}"));
                                }
                            }
                        }
                    }
                }
                for (name, (err, secs)) in names.iter().zip(rows) {
                    let r = match err {
                        None => Ok(()),
                        Some(e) => Err(Error::Verification(e)),
                    };
                    failures += report(&format!("{n} PEs {name}"), r, secs, a.json);
                }
            }
        }
    }
    if failures > 0 {
        return Err(Error::Verification(format!("{failures} case(s) failed")));
    }
    Ok(())
}

fn report<T>(name: &str, r: Result<T>, secs: f64, json: bool) -> usize {
    let (ok, err) = match &r {
        Ok(_) => (true, None),
        Err(e) => (false, Some(e.to_string())),
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"bench": "ep-check", "case": name, "ok": ok, "seconds": secs, "error": err})
        );
    } else {
        match &err {
            None => println!("ep check {name}: ok ({secs:.1} s)"),
            Some(e) => println!("ep check {name}: FAIL ({secs:.1} s): {e}"),
        }
    }
    usize::from(!ok)
}

// ---------------------------------------------------------------------- the bench

fn events(g: &GpuPe, n: usize) -> Result<Vec<sys::CUevent>> {
    g.enter()?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid out-pointer; default flags (timing enabled); context current.
        ck(
            unsafe { sys::cuEventCreate(&mut e, 0) },
            "cuEventCreate",
            || "EP bench events".into(),
        )?;
        v.push(e);
    }
    Ok(v)
}

fn destroy_events(g: &GpuPe, v: &[sys::CUevent]) {
    if g.enter().is_ok() {
        for &e in v {
            // SAFETY: created by events(), destroyed once.
            unsafe { sys::cuEventDestroy_v2(e) };
        }
    }
}

fn record(g: &GpuPe, e: sys::CUevent) -> Result<()> {
    // SAFETY: an event and the stream of this PE's context.
    ck(
        unsafe { sys::cuEventRecord(e, g.stream()) },
        "cuEventRecord",
        || "EP bench".into(),
    )
}

fn elapsed_us(a: sys::CUevent, b: sys::CUevent) -> Result<f64> {
    let mut ms = 0f32;
    // SAFETY: both events recorded and complete (waited for by the caller).
    ck(
        unsafe { sys::cuEventElapsedTime_v2(&mut ms, a, b) },
        "cuEventElapsedTime",
        || "EP bench".into(),
    )?;
    Ok(ms as f64 * 1e3)
}

/// Waits (bounded as [`GpuPe::sync`] is: the device waits' own timeout, plus 10 s) until
/// event `e` has completed; a failed stream becomes the PE's device error, and so does
/// the bound running out when the kernels wrote one (a device wait naming the peer and
/// word it waited for says more than the host's own timeout). Before 2026-12-07 the bound
/// was a fixed 30 s, which a RSHMEM_TIMEOUT_MS above it made the first to expire, hiding
/// the device's report.
fn wait_event(g: &GpuPe, e: sys::CUevent, what: &str) -> Result<()> {
    wait_event_within(g, e, what, g.stream_bound())
}

fn wait_event_within(g: &GpuPe, e: sys::CUevent, what: &str, bound: Duration) -> Result<()> {
    let deadline = Instant::now() + bound;
    loop {
        // SAFETY: an event of this context.
        let rc = unsafe { sys::cuEventQuery(e) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        if rc != sys::CUresult::CUDA_ERROR_NOT_READY {
            g.sync(what)?;
            return ck(rc, "cuEventQuery", || what.to_string());
        }
        if Instant::now() > deadline {
            if let Some(fault) = g.device_fault(what) {
                return Err(fault);
            }
            return Err(Error::Timeout {
                pe: g.my_pe(),
                what: format!("{what} (EP bench: the kernels did not complete)"),
                waited_ms: bound.as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// The start gate every PE's stream waits on (`cuStreamWaitValue32`, GEQ): a 32-bit word
/// of host memory that PE 0 allocates (`cuMemHostAlloc`, portable and device-mapped, so
/// streams in every PE's context, on any GPU of the node, can wait on it) and opens with
/// CPU stores. Device memory of PE 0 would not do on a multi-GPU node: other GPUs cannot
/// address a `cuMemAlloc` block without peer access enabled.
///
/// The bench point's caller owns it, so the word and PE 0's context (which the allocation
/// belongs to) outlive every PE thread: a stream on another GPU may still wait on the word
/// after PE 0 returned (an error path), and freeing it then, or tearing down PE 0's
/// context, could leave that wait reading freed memory. Under a launcher every process's
/// PE has a gate of its own ([`run_launched`]); "PE 0" below is then that PE.
#[derive(Default)]
struct HostGate(std::sync::Mutex<Option<(Arc<Ctx>, usize)>>);

impl HostGate {
    /// PE 0: allocates the word (0: closed) in its context; returns its host address.
    fn create(&self, g: &GpuPe) -> Result<*mut u32> {
        g.enter()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; 64 bytes (one line), pinned, mapped for every context.
        ck(
            unsafe {
                sys::cuMemHostAlloc(
                    &mut host,
                    64,
                    sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
                )
            },
            "cuMemHostAlloc",
            || "the EP bench start gate".into(),
        )?;
        let word = host.cast::<u32>();
        // SAFETY: 64 writable bytes just allocated, not yet shared.
        unsafe { word.write(0) };
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((g.ctx().clone(), word as usize));
        Ok(word)
    }

    /// The word's host address (after PE 0 created it and a barrier), null before.
    fn word(&self) -> *mut u32 {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(std::ptr::null_mut(), |(_, w)| *w as *mut u32)
    }
}

impl Drop for HostGate {
    fn drop(&mut self) {
        let taken = self.0.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((ctx, word)) = taken {
            if ctx.enter().is_ok() {
                // SAFETY: allocated by cuMemHostAlloc in this context (kept alive by `ctx`)
                // and freed once; every PE thread has ended.
                unsafe { sys::cuMemFreeHost(word as *mut c_void) };
            }
        }
    }
}

/// Stores `v` into the gate word at `host` (PE 0's HostGate).
fn open_gate(host: *mut u32, v: u32) {
    // SAFETY: `host` is the live, 4-byte-aligned gate word; every access to it from the CPU
    // is atomic (this store), the GPUs only read it. Release: nothing the streams read
    // after the gate depends on CPU stores before it (each PE's inputs were uploaded and
    // synchronised before the barrier), so this is for the reader of the code more than
    // the hardware; it costs nothing on x86.
    unsafe { (*host.cast::<std::sync::atomic::AtomicU32>()).store(v, Ordering::Release) };
}

/// PE 0 opens the gate for good when the bench point ends, error or not: a stream parked
/// on the gate never times out (cuStreamWaitValue32), and a free while one is parked may
/// wait for it.
struct OpenForGood(*mut u32, u32);

impl Drop for OpenForGood {
    fn drop(&mut self) {
        open_gate(self.0, self.1);
    }
}

fn wait_gate(g: &GpuPe, gate: u64, value: u32) -> Result<()> {
    // SAFETY: `gate` is this context's device address of the gate word (alive until the
    // final barrier, or for good on an error path); the PE's stream.
    ck(
        unsafe { sys::cuStreamWaitValue32_v2(g.stream(), gate, value, 0) },
        "cuStreamWaitValue32",
        || "EP bench start gate (stream memory operations)".into(),
    )
}

/// Device-to-device copy bandwidth on this PE's GPU: (cuMemcpyDtoD, rshmem_copy) GB/s of
/// bytes copied, median of 5 timed repetitions of 4 copies of 512 MiB.
fn copy_bandwidth(g: &GpuPe) -> Result<(f64, f64)> {
    let size = 512usize << 20;
    let src = DevBuf::new(g.ctx(), size, "copy bench source")?;
    let dst = DevBuf::new(g.ctx(), size, "copy bench destination")?;
    let k = g.load_library_module("rshmem_kernels", None)?;
    let ev = events(g, 2)?;
    let run = |kernel: bool| -> Result<f64> {
        let mut v = Vec::new();
        for rep in 0..6 {
            record(g, ev[0])?;
            for _ in 0..4 {
                if kernel {
                    let (mut a, mut b, mut c) = (dst.ptr(), src.ptr(), size as u64);
                    let mut p = [
                        (&mut a as *mut u64).cast::<c_void>(),
                        (&mut b as *mut u64).cast(),
                        (&mut c as *mut u64).cast(),
                    ];
                    let grid = g.device().sms * 4;
                    // SAFETY: rshmem_copy(void* dst, const void* src, u64 bytes); two
                    // disjoint allocations of `size` bytes.
                    unsafe { g.launch_raw(&k, "rshmem_copy", grid, 512, 0, &mut p, false)? };
                } else {
                    // SAFETY: two disjoint device allocations of `size` bytes; this PE's
                    // stream.
                    ck(
                        unsafe {
                            sys::cuMemcpyDtoDAsync_v2(dst.ptr(), src.ptr(), size, g.stream())
                        },
                        "cuMemcpyDtoDAsync",
                        || "EP bench copy bandwidth".into(),
                    )?;
                }
            }
            record(g, ev[1])?;
            g.sync("EP bench copy bandwidth")?;
            if rep > 0 {
                v.push(4.0 * size as f64 / (elapsed_us(ev[0], ev[1])? * 1e-6) / 1e9);
            }
        }
        Ok(crate::bench::stats(v).0)
    };
    let r = run(false).and_then(|m| Ok((m, run(true)?)));
    destroy_events(g, &ev);
    r
}

/// `rshmem bench ep --device gpu`: Some(report) where this process reports (not on the
/// PEs other than 0 of a launched job).
pub fn run(a: &EpBenchArgs) -> Result<Option<EpReport>> {
    crate::ep::bench::check_counts(a)?;
    if let Some(info) = LaunchInfo::from_env()? {
        return run_launched(a, &info);
    }
    // Arguments first (a clear error on any machine), then the driver.
    for &n in &a.pes {
        for &t in &a.tokens {
            super::ep::check_config(&config_of(a, t), n)?;
        }
    }
    driver()?;
    let mut points = Vec::new();
    for &n in &a.pes {
        for &t in &a.tokens {
            let cfg = config_of(a, t);
            super::ep::check_config(&cfg, n)?;
            let gate = HostGate::default();
            let out = run_gpu_threads(
                n,
                settings_for(crate::ep::bench::settings_of(a)?, &cfg, n)?,
                |g| point(g, a, t, &gate, g.my_pe() == 0),
            )?;
            let mut first = None;
            // Every PE's error: the one that failed first is often not PE 0, whose own
            // error is then only "PE p died".
            let mut errors = Vec::new();
            for (pe, r) in out.into_iter().enumerate() {
                match r {
                    Ok(Some(p)) => first = Some(p),
                    Ok(None) => {}
                    Err(e) => errors.push(format!("GPU PE {pe}: {e}")),
                }
            }
            if !errors.is_empty() {
                return Err(Error::Verification(errors.join("; ")));
            }
            points.push(first.ok_or_else(|| Error::Verification("PE 0 reported nothing".into()))?);
        }
    }
    let last = points
        .last()
        .cloned()
        .ok_or_else(|| Error::Verification("no points".into()))?;
    Ok(Some(EpReport { last, points }))
}

/// The bench under a launcher (`rshmem run`, torchrun, mpirun, srun, or
/// scripts/netns-hosts across nodes): this process is one GPU PE of the job, on the GPU
/// its local rank picks, reaching its peers over the job's transport. Each process gates
/// its own stream (a host barrier comes before every opening, so the PEs start each phase
/// within the barrier's skew, not the launch skew). PEs whose kernels wait for each other
/// must not time-slice on one GPU: a GPU shared by PEs of several processes is refused.
fn run_launched(a: &EpBenchArgs, info: &LaunchInfo) -> Result<Option<EpReport>> {
    if a.check {
        return Err(Error::InvalidArgument(
            "--check runs its GPU PEs as threads of one process next to the CPU PEs it \
             compares them with: run it without a launcher"
                .into(),
        ));
    }
    if a.pes.len() > 1 {
        return Err(Error::InvalidArgument(
            "--pes sweeps need the bench to start its own PEs (not under a launcher)".into(),
        ));
    }
    let mut settings = Settings::from_env()?;
    if let Some(t) = a.transport {
        t.check_launched(&settings)?;
    }
    let n = info.world_size;
    for &t in &a.tokens {
        let cfg = config_of(a, t);
        super::ep::check_config(&cfg, n)?;
        settings = settings_for(settings, &cfg, n)?;
    }
    // This PE's own gates (each PE opens its own; see the function's comment), declared
    // before the PE so that they outlive it: a stream may still wait on one until the PE
    // is finalized or dropped (HostGate).
    let gates: Vec<HostGate> = a.tokens.iter().map(|_| HostGate::default()).collect();
    let g = GpuPe::init_from_settings(settings)?;
    let r = (|| -> Result<Vec<EpPoint>> {
        g.refuse_gpus_shared_across_processes("rshmem bench ep --device gpu")?;
        let mut points = Vec::new();
        for (&t, gate) in a.tokens.iter().zip(&gates) {
            points.extend(point(&g, a, t, gate, true)?);
        }
        Ok(points)
    })();
    let points = g.finish(r)?;
    drop(gates);
    if points.is_empty() {
        return Ok(None);
    }
    let last = points.last().cloned().expect("not empty");
    Ok(Some(EpReport { last, points }))
}

/// The gate value that satisfies every wait of a run of `total` iterations (waits for
/// 2·it + 1 and 2·it + 2) under CU_STREAM_WAIT_VALUE_GEQ's cyclic compare.
fn gate_open_for_good(total: usize) -> u32 {
    2 * total as u32 + 2
}

/// One bench point on one GPU PE; Some on PE 0. `opener`: this PE creates and opens
/// `gate` (PE 0 of PEs that are threads of one process, which share PE 0's gate; every PE
/// of a launched job, each with its own).
fn point(
    g: &GpuPe,
    a: &EpBenchArgs,
    tokens: usize,
    gate: &HostGate,
    opener: bool,
) -> Result<Option<EpPoint>> {
    let (me, n) = (g.my_pe(), g.n_pes());
    let pe = g.pe();
    let cfg = config_of(a, tokens);
    // The copy bandwidth first, alone on the GPU: PE 0 of PEs that are threads sharing the
    // GPUs; under a launcher every PE on its own GPU at once (so no PE waits out the
    // measurement at the next barrier), and PE 0's is reported.
    let copy = if opener {
        Some(copy_bandwidth(g)?)
    } else {
        None
    };
    pe.barrier_all()?;
    let mut buf = GpuBuffer::new(g, cfg, 0)?;
    // The CPU bench's routings, taken in turn (iteration `it` uses `it % ROUTINGS`): with
    // one routing every call found the previous call's identical bytes in its buffer set,
    // so a receiver that read a slot before this call's data landed (or an old slot) got
    // the right values and the last iteration's hash matched anyway.
    let routings = crate::ep::bench::bench_routings(a, &cfg, me, tokens);
    // Every device input before the routings' allgather, the last collective step before
    // the first LL call: no PE allocates while a peer's kernel waits for it (module docs:
    // no allocation between LL calls).
    let x = upload(g, bf16_bytes(&check::origin_x(me, tokens, cfg.hidden)), "x")?;
    let l = cfg.num_experts / n;
    let eo_bytes = l * n * tokens * cfg.hidden * 2;
    // Per routing: topk_idx, topk_weights, and the simulated expert's outputs in that
    // routing's layout (the GPU's packing is deterministic, so the layout is the same for
    // the same routing); with zero copy they are copied into the zero-copy buffer before
    // each combine (on the stream, outside the timed events).
    let mut inputs = Vec::with_capacity(routings.len());
    for r in &routings {
        inputs.push((
            upload(g, &idx_bytes(&r.topk_idx, IdxType::I64), "topk_idx")?,
            upload(g, &f32_bytes(&r.topk_weights), "topk_weights")?,
            DevBuf::new(g.ctx(), eo_bytes, "expert outputs")?,
        ));
    }
    let alls = routings
        .iter()
        .map(|r| check::allgather_routing(pe, pe.world(), r))
        .collect::<Result<Vec<_>>>()?;
    let masked = vec![false; n];
    let ty = IdxType::I64;
    let expert = crate::ep::bench::bench_expert_scale;
    let mut problem: Option<String> = None;
    let heap_base = g.heap_base();
    // Zero copy: this call's zero-copy buffer gets the routing's expert outputs.
    let fill_zero_copy = |buf: &mut GpuBuffer, h: &GpuHandle, eo: &DevBuf| -> Result<()> {
        let at = buf.get_next_low_latency_combine_buffer(h)?;
        g.put_on_stream((at - heap_base) as usize, eo.ptr(), eo_bytes, me)
    };

    // One validated call pair per routing (untimed): its hashes are what the timed
    // iterations with that routing must repeat.
    let mut h0 = Vec::with_capacity(routings.len());
    let mut diff = 0.0f64;
    for ((r, all), (idx, w, eo_dev)) in routings.iter().zip(&alls).zip(&inputs) {
        let h = buf.low_latency_dispatch(x.ptr(), idx.ptr(), ty, tokens, false)?;
        let d0 = buf.read_dispatch(&h)?;
        if let Err(e) = check::validate_dispatch(&cfg, me, all, &masked, &d0) {
            problem.get_or_insert(e.to_string());
        }
        let mut eo = vec![bf16::ZERO; l * n * tokens * cfg.hidden];
        check::expert_forward(&cfg, n, me, &d0, &expert, &mut eo);
        eo_dev.write(bf16_bytes(&eo))?;
        drop(eo);
        let eo_ptr = if a.zero_copy {
            fill_zero_copy(&mut buf, &h, eo_dev)?;
            None
        } else {
            Some(eo_dev.ptr())
        };
        let c = buf.low_latency_combine(eo_ptr, idx.ptr(), ty, w.ptr(), &h, false)?;
        let comb0 = buf.read_combined(&c)?;
        match check::validate_combine(&cfg, n, me, r, &masked, &expert, &comb0) {
            Ok(v) => diff = diff.max(v),
            Err(e) => {
                problem.get_or_insert(e.to_string());
            }
        }
        h0.push((check::dispatch_hash(&cfg, n, &d0), check::hash_bf16(&comb0)));
    }
    // Bytes per call, averaged over the timed iterations' routings (as the CPU bench).
    let per_timed = |f: &dyn Fn(usize) -> f64| {
        (a.warmup..a.warmup + a.iters)
            .map(|it| f(it % routings.len()))
            .sum::<f64>()
            / a.iters.max(1) as f64
    };
    let sel = per_timed(&|ri| routings[ri].topk_idx.iter().filter(|&&e| e >= 0).count() as f64);
    // Rows this PE receives per call: every member's selections of its experts.
    let returned = per_timed(&|ri| {
        alls[ri]
            .iter()
            .flat_map(|r| &r.topk_idx)
            .filter(|&&e| e >= 0 && e as usize / l == me)
            .count() as f64
    });

    // The start gate: a word of host memory PE 0 allocates and opens (HostGate). From its
    // creation on, PE 0 opens it for good when it leaves, on every path (the barrier below
    // may fail on PE 0 only, after the others passed it and parked their streams). The
    // wait is CU_STREAM_WAIT_VALUE_GEQ, a cyclic compare ((int32_t)(*addr - value) >= 0):
    // the gate opens for every pending wait (values up to 2 * total) with a value at or
    // above them and less than 2^31 past them — not u32::MAX, which reads as "behind"
    // every small value.
    let total = a.warmup + a.iters;
    let open_for_good = if opener {
        Some(OpenForGood(gate.create(g)?, gate_open_for_good(total)))
    } else {
        None
    };
    pe.barrier_all()?;
    let gate_host = gate.word();
    if gate_host.is_null() {
        return Err(Error::InvalidArgument(
            "EP bench: the barrier passed before the start gate was created".into(),
        ));
    }
    g.enter()?;
    let mut gate_dev: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; gate_host is PE 0's portable, device-mapped allocation,
    // alive (see HostGate); flags must be 0.
    ck(
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut gate_dev, gate_host.cast(), 0) },
        "cuMemHostGetDevicePointer",
        || "the EP bench start gate in this PE's context".into(),
    )?;
    // ev[6]: after the zero-copy fill, which the host waits for before it opens the
    // combine's gate (so no PE's fill runs into the timed combines).
    let ev = events(g, 7)?;
    let mut times = vec![[0f64; 6]; a.iters];
    let open = |v: u32| {
        if opener {
            open_gate(gate_host, v);
        }
    };
    let mut last = None;
    let r = (|| -> Result<()> {
        for it in 0..total {
            let v = 2 * it as u32;
            let ri = it % routings.len();
            let (idx, w, eo_dev) = &inputs[ri];
            g.enter()?;
            wait_gate(g, gate_dev, v + 1)?;
            record(g, ev[0])?;
            let mut h = buf.low_latency_dispatch(x.ptr(), idx.ptr(), ty, tokens, true)?;
            record(g, ev[1])?;
            buf.recv_hook(&mut h)?;
            record(g, ev[2])?;
            // Outside the timed combine: every PE's host waits for its fill (ev[6]) before
            // the barrier that opens the combine's gate, so every fill has ended when any
            // combine starts (on a shared GPU too).
            let eo_ptr = if a.zero_copy {
                fill_zero_copy(&mut buf, &h, eo_dev)?;
                record(g, ev[6])?;
                None
            } else {
                Some(eo_dev.ptr())
            };
            wait_gate(g, gate_dev, v + 2)?;
            record(g, ev[3])?;
            let mut c = buf.low_latency_combine(eo_ptr, idx.ptr(), ty, w.ptr(), &h, true)?;
            record(g, ev[4])?;
            buf.combine_recv_hook(&mut c)?;
            record(g, ev[5])?;
            pe.barrier_all()?;
            open(v + 1);
            if a.zero_copy {
                wait_event(g, ev[6], "EP bench dispatch and zero-copy fill")?;
            } else {
                wait_event(g, ev[2], "EP bench dispatch")?;
            }
            pe.barrier_all()?;
            open(v + 2);
            wait_event(g, ev[5], "EP bench combine")?;
            if it >= a.warmup {
                times[it - a.warmup] = [
                    elapsed_us(ev[0], ev[2])?,
                    elapsed_us(ev[3], ev[5])?,
                    elapsed_us(ev[0], ev[1])?,
                    elapsed_us(ev[1], ev[2])?,
                    elapsed_us(ev[3], ev[4])?,
                    elapsed_us(ev[4], ev[5])?,
                ];
            }
            last = Some((h, c, ri));
        }
        Ok(())
    })();
    destroy_events(g, &ev);
    // On an error every PE's stream may be parked on the gate, and a free while a stream is
    // parked can wait for it: returning drops PE 0's OpenForGood before the buffers
    // declared above it are freed (a PE's error reaches PE 0 through the bounded host
    // barriers, so PE 0 returns on every failure).
    r?;
    if let Some((h, c, ri)) = last {
        let d = buf.read_dispatch(&h)?;
        let comb = buf.read_combined(&c)?;
        let hl = (check::dispatch_hash(&cfg, n, &d), check::hash_bf16(&comb));
        if hl != h0[ri] {
            problem.get_or_insert(format!(
                "PE {me}: the last iteration is not bit-identical to the validated one of \
                 its routing ({ri}: {hl:x?} vs {:x?})",
                h0[ri]
            ));
        }
    }
    let grid = buf.grid();
    let layout_bytes = buf.layout().total_bytes;
    let msg = buf.layout().msg_bytes as f64;
    let h2 = (cfg.hidden * 2) as f64;
    // Gather: problem flag, bytes, this PE's GPU (a hash of its node's id and its PCI bus
    // id, as f64 bits: identical nodes reuse bus ids), per-iteration times.
    let node = pe.boot().node_ids()[pe.my_pe()].clone();
    let gpu_id = f64::from_bits(crate::pe::mix64(
        node.bytes()
            .chain([0u8])
            .chain(g.device().pci_bus_id.bytes())
            .fold(0u64, |h, b| crate::pe::mix64(h ^ b as u64)),
    ));
    let mut blob = Vec::new();
    blob.extend((problem.is_some() as u64).to_le_bytes());
    for v in [
        sel * msg,
        sel * h2,
        sel * (h2 + msg),
        returned * 2.0 * h2,
        gpu_id,
    ] {
        blob.extend(v.to_le_bytes());
    }
    for row in &times {
        for v in row {
            blob.extend(v.to_le_bytes());
        }
    }
    blob.extend(problem.clone().unwrap_or_default().into_bytes());
    let blobs = pe.boot().allgather(&pe.world().group(), &blob)?;
    buf.destroy()?;
    pe.barrier_all()?;
    drop(open_for_good);
    drop(inputs);
    if me != 0 {
        return Ok(None);
    }
    let f = |b: &[u8], i: usize| {
        f64::from_le_bytes(b[8 + i * 8..16 + i * 8].try_into().unwrap_or([0; 8]))
    };
    // Values before the times in each blob.
    const VALUES: usize = 5;
    let mut errors = Vec::new();
    let mut per_iter = vec![[0f64; 6]; a.iters];
    let (mut db, mut cb, mut drw, mut crw) = (0.0, 0.0, 0.0, 0.0);
    let mut gpus = std::collections::BTreeSet::new();
    for b in &blobs {
        db += f(b, 0) / n as f64;
        cb += f(b, 1) / n as f64;
        drw += f(b, 2);
        crw += f(b, 3);
        gpus.insert(f(b, 4).to_bits());
        for (i, slot) in per_iter.iter_mut().enumerate() {
            for (j, s) in slot.iter_mut().enumerate() {
                *s = s.max(f(b, VALUES + i * 6 + j));
            }
        }
        if b[..8] != [0u8; 8] {
            errors.push(String::from_utf8_lossy(&b[8 + (VALUES + a.iters * 6) * 8..]).into_owned());
        }
    }
    // The bytes are every PE's, moved by every GPU at once: the copy bandwidth they are
    // held against is one GPU's (PE 0's, measured alone) times the GPUs the PEs are on.
    // (Before 2026-12-07 it was one GPU's whatever the count: 8 GPUs' traffic against one
    // GPU's copy read 8 times too high.)
    let gpus = gpus.len().max(1);
    let col = |j: usize| {
        let (m, p, _) = crate::bench::stats(per_iter.iter().map(|r| r[j]).collect());
        (m, p)
    };
    let (dm, dp) = col(0);
    let (cm, cp) = col(1);
    let (memcpy, kernel) = copy.unwrap_or((0.0, 0.0));
    let copy_gbps = memcpy.max(kernel);
    let gbps = |bytes: f64, us: f64| if us > 0.0 { bytes / us / 1e3 } else { 0.0 };
    let frac = |x: f64| {
        if copy_gbps > 0.0 {
            x / (2.0 * copy_gbps * gpus as f64)
        } else {
            0.0
        }
    };
    Ok(Some(EpPoint {
        bench: "ep",
        validated: errors.is_empty(),
        device: "gpu",
        transport: g.transport().name().into(),
        pes: n,
        tokens,
        hidden: cfg.hidden,
        topk: cfg.num_topk,
        experts: cfg.num_experts,
        fp8: cfg.use_fp8,
        round_scale: cfg.round_scale,
        // The GPU bench always launches the send and receive halves apart (hooks; the
        // kernels are the same either way) and reports the split, whatever --hook says:
        // before 2026-12-07 the JSON said `"hook": false` beside a filled split.
        hook: true,
        zero_copy: a.zero_copy,
        iters: a.iters,
        warmup: a.warmup,
        dispatch_us_median: dm,
        dispatch_us_p99: dp,
        combine_us_median: cm,
        combine_us_p99: cp,
        dispatch_send_us_median: Some(col(2).0),
        dispatch_recv_us_median: Some(col(3).0),
        combine_send_us_median: Some(col(4).0),
        combine_recv_us_median: Some(col(5).0),
        dispatch_bytes_per_pe: db,
        combine_bytes_per_pe: cb,
        dispatch_gbps: gbps(db, dm),
        combine_gbps: gbps(cb, cm),
        combine_calc_diff: diff,
        buffer_bytes: layout_bytes,
        deepep_buffer_bytes: Layout::deepep_size_hint(&cfg),
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        gpu: Some(GpuEpStats {
            gpu: g.device().name.clone(),
            grid,
            copy_gbps,
            gpus,
            memcpy_dtod_gbps: memcpy,
            copy_kernel_gbps: kernel,
            dispatch_rw_bytes: drw,
            combine_rw_bytes: crw,
            dispatch_rw_gbps: gbps(drw, dm),
            combine_rw_gbps: gbps(crw, cm),
            dispatch_copy_fraction: frac(gbps(drw, dm)),
            combine_copy_fraction: frac(gbps(crw, cm)),
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CU_STREAM_WAIT_VALUE_GEQ compares cyclically: (int32_t)(*addr - value) >= 0.
    fn geq(gate: u32, value: u32) -> bool {
        gate.wrapping_sub(value) as i32 >= 0
    }

    #[test]
    fn the_gate_opened_for_good_releases_every_wait() {
        for total in [1usize, 5, 1000, 100_000] {
            let g = gate_open_for_good(total);
            for it in 0..total as u32 {
                assert!(
                    geq(g, 2 * it + 1) && geq(g, 2 * it + 2),
                    "total {total}, it {it}"
                );
            }
        }
        // What the error path used before: behind every small value.
        assert!(!geq(u32::MAX, 1));
    }
}
