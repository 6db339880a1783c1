//! The correctness checks of DeepEP's LL test (EP.md), shared by `rshmem bench ep` and
//! the tests: inputs that encode their origin, routing all-gathered from every PE, exact
//! checks of every dispatch output, combine checked exactly and with `calc_diff`, and
//! order-independent hashes for bit-identical repeats.
//!
//! Inputs: row t of PE r is `r - 128` in every column except the last 128, which hold t.
use crate::ep::{bf16, fp8, Config, DispatchOutput, RecvX};
use crate::error::{Error, Result};
use crate::pe::Pe;
use crate::team::Team;

/// Routing of one PE's tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub num_tokens: usize,
    /// `[T, K]`, -1 = unused.
    pub topk_idx: Vec<i64>,
    /// `[T, K]`.
    pub topk_weights: Vec<f32>,
}

/// splitmix64: a small deterministic generator (no dependency, same on every PE).
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        crate::pe::mix64(self.0)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The origin-encoded input of PE `rank`: `[T, H]`. As DeepEP's test: every value is
/// `rank - 128`, except the last 128 columns, which hold the token index `t` (as bf16,
/// so rounded past 256). With H >= 384 the 128 columns before them hold what that
/// rounding lost, `t - bf16(t)` (a small integer, exact), so every token's row differs
/// from every other's up to t = 65535 and a row filed under the wrong token is seen
/// (docs/ep.md, "Checks"); at least one group keeps the source's value. Each part is one
/// whole FP8 group, so it survives the cast.
pub fn origin_x(rank: usize, num_tokens: usize, hidden: usize) -> Vec<bf16> {
    (0..num_tokens)
        .flat_map(|t| origin_row(rank, t, hidden))
        .collect()
}

/// Row `t` of [`origin_x`] alone (the checks build one row at a time: building the
/// rows before it too made a check O(T^2 H)).
pub fn origin_row(rank: usize, t: usize, hidden: usize) -> Vec<bf16> {
    let mut row = vec![bf16::from_f32(rank as f32 - 128.0); hidden];
    let (tail, residual) = token_columns(hidden);
    row[tail].fill(bf16::from_f32(t as f32));
    if let Some(cols) = residual {
        row[cols].fill(bf16::from_f32(token_residual(t)));
    }
    row
}

/// The columns of a row that hold the token index (the last 128, as bf16) and, with
/// H >= 384, the 128 before them that hold its rounding residual.
fn token_columns(hidden: usize) -> (std::ops::Range<usize>, Option<std::ops::Range<usize>>) {
    let tail = hidden.min(128);
    let residual = (hidden >= 384).then(|| hidden - 256..hidden - 128);
    (hidden - tail..hidden, residual)
}

/// `t - bf16(t)`: 0 up to 256, then a small integer (|r| <= 128 below 65536).
fn token_residual(t: usize) -> f32 {
    t as f32 - bf16::from_f32(t as f32).to_f32()
}

/// Random routing like DeepEP's test: K distinct experts per token among `experts`
/// (all E when None), weights in [0.1, 1.1), then `masked_slots` random slots set to -1.
pub fn random_routing(
    seed: u64,
    rank: usize,
    num_tokens: usize,
    cfg: &Config,
    experts: Option<&[usize]>,
    masked_slots: usize,
) -> Routing {
    let k = cfg.num_topk;
    let all: Vec<usize> = (0..cfg.num_experts).collect();
    let pool = experts.unwrap_or(&all);
    let mut rng = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(rank as u64));
    let mut idx = vec![-1i64; num_tokens * k];
    let mut w = vec![0f32; num_tokens * k];
    for t in 0..num_tokens {
        let mut chosen: Vec<usize> = Vec::with_capacity(k);
        for kk in 0..k {
            if chosen.len() < pool.len() {
                let e = loop {
                    let e = pool[rng.below(pool.len())];
                    if !chosen.contains(&e) {
                        break e;
                    }
                };
                chosen.push(e);
                idx[t * k + kk] = e as i64;
            }
            w[t * k + kk] = 0.1 + rng.unit();
        }
    }
    if num_tokens * k > 0 {
        for _ in 0..masked_slots {
            let i = rng.below(num_tokens * k);
            idx[i] = -1;
        }
    }
    Routing {
        num_tokens,
        topk_idx: idx,
        topk_weights: w,
    }
}

/// Every team PE's routing (a host all-gather: for checks, not for the data path).
pub fn allgather_routing(pe: &Pe, team: &Team, r: &Routing) -> Result<Vec<Routing>> {
    let mut b = Vec::new();
    b.extend((r.num_tokens as u64).to_le_bytes());
    for (&i, &w) in r.topk_idx.iter().zip(&r.topk_weights) {
        b.extend(i.to_le_bytes());
        b.extend(w.to_le_bytes());
    }
    let all = pe.boot().allgather(&team.group(), &b)?;
    Ok(all
        .iter()
        .map(|b| {
            let t = crate::pe::le_u64(&b[..8]) as usize;
            let (mut idx, mut w) = (Vec::new(), Vec::new());
            for c in b[8..].chunks_exact(12) {
                idx.push(i64::from_le_bytes(c[..8].try_into().unwrap_or([0; 8])));
                w.push(f32::from_le_bytes(c[8..].try_into().unwrap_or([0; 4])));
            }
            Routing {
                num_tokens: t,
                topk_idx: idx,
                topk_weights: w,
            }
        })
        .collect())
}

/// What a receiver must see for token `t` of PE `src` (dequantised with FP8).
pub fn expected_row(cfg: &Config, src: usize, t: usize) -> Vec<f32> {
    let h = cfg.hidden;
    let x = &origin_row(src, t, h);
    if cfg.use_fp8 {
        let mut q = vec![0u8; h];
        let mut s = vec![0f32; h / fp8::GROUP];
        fp8::quantize_row(x, cfg.round_scale, &mut q, &mut s);
        let mut out = vec![0f32; h];
        fp8::dequantize_row(&q, &s, &mut out);
        out
    } else {
        x.iter().map(|v| v.to_f32()).collect()
    }
}

/// The e4m3 codes and per-group scales the reference quantiser makes of token `t` of PE
/// `src` (FP8 only).
fn expected_fp8(cfg: &Config, src: usize, t: usize) -> (Vec<u8>, Vec<f32>) {
    let h = cfg.hidden;
    let x = &origin_row(src, t, h);
    let mut q = vec![0u8; h];
    let mut s = vec![0f32; h / fp8::GROUP];
    fp8::quantize_row(x, cfg.round_scale, &mut q, &mut s);
    (q, s)
}

/// Row `row` of `[L, R*N, H]` received data, as f32 (dequantised).
pub fn recv_row(cfg: &Config, x: &RecvX, row: usize) -> Vec<f32> {
    let h = cfg.hidden;
    match x {
        RecvX::Bf16(v) => v[row * h..(row + 1) * h]
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        RecvX::Fp8 { data, scales } => {
            let g = h / fp8::GROUP;
            let mut out = vec![0f32; h];
            fp8::dequantize_row(
                &data[row * h..(row + 1) * h],
                &scales[row * g..(row + 1) * g],
                &mut out,
            );
            out
        }
    }
}

fn fail(me: usize, m: String) -> Error {
    Error::Verification(format!("ep dispatch check on PE {me}: {m}"))
}

/// Checks one PE's dispatch output exactly against every PE's routing (`all`, by team
/// rank) and `masked` PEs: counts, layout ranges tiling the rows, each block's tokens,
/// every value (origin-encoded, exact), src_info against the last 128 columns.
pub fn validate_dispatch(
    cfg: &Config,
    me: usize,
    all: &[Routing],
    masked: &[bool],
    out: &DispatchOutput,
) -> Result<()> {
    let r = all.len();
    let l = cfg.num_experts / r;
    let (k, h, n) = (
        cfg.num_topk,
        cfg.hidden,
        cfg.num_max_dispatch_tokens_per_rank,
    );
    let rows = r * n;
    let mut cache: Vec<Option<Vec<f32>>> = vec![None; r * n];
    let mut raw_cache: Vec<Option<(Vec<u8>, Vec<f32>)>> = vec![None; r * n];
    for le in 0..l {
        let e = (me * l + le) as i64;
        let mut total = 0usize;
        let mut blocks = Vec::new();
        for (s, ro) in all.iter().enumerate() {
            let mut want: Vec<i32> = Vec::new();
            if !masked[s] {
                for (i, &v) in ro.topk_idx.iter().enumerate() {
                    if v == e {
                        want.push((i / k) as i32);
                    }
                }
            }
            let lr = out.layout_range[le * r + s];
            let (begin, count) = ((lr >> 32) as usize, (lr & 0xffff_ffff) as usize);
            // A kernel's output is read back unchecked: a range outside the expert's rows
            // is a failed check, not an index out of bounds.
            if lr < 0 || begin.checked_add(count).is_none_or(|end| end > rows) {
                return Err(fail(
                    me,
                    format!(
                        "layout_range[{le}][{s}] = {lr:#x} (begin {}, count {count}) is \
                         outside the expert's {rows} rows",
                        lr >> 32
                    ),
                ));
            }
            if count != want.len() {
                return Err(fail(me, format!(
                    "layout_range[{le}][{s}] counts {count} tokens, PE {s}'s routing sends {} to expert {e}",
                    want.len()
                )));
            }
            if count > 0 {
                let mut got = out.src_info[le * rows + begin..le * rows + begin + count].to_vec();
                got.sort_unstable();
                if got != want {
                    return Err(fail(
                        me,
                        format!(
                        "expert {e}: the block from PE {s} holds tokens {got:?}, expected {want:?}"
                    ),
                    ));
                }
                blocks.push((begin, count, s));
            }
            total += count;
        }
        if out.recv_count[le] as usize != total {
            return Err(fail(me, format!(
                "recv_count[{le}] = {}, the all-gathered routing sends {total} tokens to expert {e}",
                out.recv_count[le]
            )));
        }
        blocks.sort_unstable();
        let mut at = 0;
        for &(b, c, s) in &blocks {
            if b != at {
                return Err(fail(me, format!(
                    "expert {e}: the block from PE {s} starts at row {b}, expected {at} (blocks must tile the rows)"
                )));
            }
            at += c;
        }
        for &(b, c, s) in &blocks {
            for j in b..b + c {
                let row = le * rows + j;
                let t = out.src_info[row] as usize;
                let want = cache[s * n + t].get_or_insert_with(|| expected_row(cfg, s, t));
                // FP8: the codes and scale bits themselves, against the reference
                // quantiser (two encodings can dequantise to the same values, e.g. a
                // group of zeros under any scale).
                if let RecvX::Fp8 { data, scales } = &out.recv_x {
                    let g = h / fp8::GROUP;
                    let (q, sc) =
                        raw_cache[s * n + t].get_or_insert_with(|| expected_fp8(cfg, s, t));
                    let got_q = &data[row * h..(row + 1) * h];
                    if let Some(c0) = (0..h).find(|&c| got_q[c] != q[c]) {
                        return Err(fail(
                            me,
                            format!(
                                "expert {e}, row {j} (token {t} of PE {s}): column {c0} holds \
                                 e4m3 code {:#04x}, the reference quantiser makes {:#04x}",
                                got_q[c0], q[c0]
                            ),
                        ));
                    }
                    let got_s = &scales[row * g..(row + 1) * g];
                    if let Some(g0) = (0..g).find(|&i| got_s[i].to_bits() != sc[i].to_bits()) {
                        return Err(fail(
                            me,
                            format!(
                                "expert {e}, row {j} (token {t} of PE {s}): scale of group \
                                 {g0} is {:e}, the reference quantiser makes {:e}",
                                got_s[g0], sc[g0]
                            ),
                        ));
                    }
                }
                let got = recv_row(cfg, &out.recv_x, row);
                if let Some(c0) = (0..h).find(|&c| got[c].to_bits() != want[c].to_bits()) {
                    return Err(fail(
                        me,
                        format!(
                        "expert {e}, row {j} (token {t} of PE {s}): column {c0} is {}, expected {}",
                        got[c0], want[c0]
                    ),
                    ));
                }
                // The origin itself (independent of the quantiser) where it is exact:
                // one value per row (its source's), the last 128 columns = src_info (as
                // bf16) and, with H >= 384, the 128 before them its rounding residual.
                if !cfg.round_scale {
                    let (tail, residual) = token_columns(h);
                    for (c, &v) in got.iter().enumerate() {
                        let expect = if tail.contains(&c) {
                            t as f32
                        } else if residual.as_ref().is_some_and(|r| r.contains(&c)) {
                            token_residual(t)
                        } else {
                            s as f32 - 128.0
                        };
                        if bf16::from_f32(v) != bf16::from_f32(expect) {
                            return Err(fail(
                                me,
                                format!(
                                "expert {e}, row {j}: column {c} is {v}, its origin is {expect}"
                            ),
                            ));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// A simulated expert: `out = bf16(dequant(recv) * scale(global expert))` for every valid
/// row, into `dest [L, R*N, H]`.
pub fn expert_forward(
    cfg: &Config,
    num_pes: usize,
    me: usize,
    out: &DispatchOutput,
    scale: &dyn Fn(usize) -> f32,
    dest: &mut [bf16],
) {
    let l = cfg.num_experts / num_pes;
    let rows = num_pes * cfg.num_max_dispatch_tokens_per_rank;
    let h = cfg.hidden;
    for le in 0..l {
        let f = scale(me * l + le);
        // Clamped: a kernel's count is read back unchecked (validate_dispatch reports a
        // wrong one), and rows past the expert's own belong to the next expert.
        let count = (out.recv_count[le].max(0) as usize).min(rows);
        for j in 0..count {
            let row = le * rows + j;
            let v = recv_row(cfg, &out.recv_x, row);
            for (d, x) in dest[row * h..(row + 1) * h].iter_mut().zip(v) {
                *d = bf16::from_f32(x * f);
            }
        }
    }
}

/// DeepEP's `calc_diff` on a+1, b+1 (0 = identical).
pub fn calc_diff(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut sq) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64 + 1.0, y as f64 + 1.0);
        ab += x * y;
        sq += x * x + y * y;
    }
    if sq == 0.0 {
        0.0
    } else {
        1.0 - 2.0 * ab / sq
    }
}

/// Checks PE `me`'s combined output: bit-exact against the same sum computed here
/// (f32 in k order, one rounding), no NaN, and `calc_diff` against `x * Σ w * scale`
/// below 1e-5 (bf16) or 9e-4 (FP8). Returns the diff.
pub fn validate_combine(
    cfg: &Config,
    num_pes: usize,
    me: usize,
    routing: &Routing,
    masked: &[bool],
    scale: &dyn Fn(usize) -> f32,
    combined: &[bf16],
) -> Result<f64> {
    let (k, h) = (cfg.num_topk, cfg.hidden);
    let l = cfg.num_experts / num_pes;
    let t_count = routing.num_tokens;
    let bad = |m: String| Error::Verification(format!("ep combine check on PE {me}: {m}"));
    if combined.len() != t_count * h {
        return Err(bad(format!(
            "{} values, expected {}",
            combined.len(),
            t_count * h
        )));
    }
    if let Some(i) = combined.iter().position(|v| v.is_nan()) {
        return Err(bad(format!("NaN at token {}, column {}", i / h, i % h)));
    }
    let x = origin_x(me, t_count, h);
    let mut reference = Vec::with_capacity(t_count * h);
    for t in 0..t_count {
        let row = expected_row(cfg, me, t);
        let mut acc = vec![0f32; h];
        let mut wsum = 0f32;
        for kk in 0..k {
            let e = routing.topk_idx[t * k + kk];
            if e < 0 || masked[e as usize / l] {
                continue;
            }
            let (w, f) = (routing.topk_weights[t * k + kk], scale(e as usize));
            wsum += w * f;
            for (a, &v) in acc.iter_mut().zip(&row) {
                *a += w * bf16::from_f32(v * f).to_f32();
            }
        }
        for c in 0..h {
            let want = bf16::from_f32(acc[c]);
            let got = combined[t * h + c];
            if got.to_bits() != want.to_bits() {
                return Err(bad(format!(
                    "token {t}, column {c}: {got}, expected {want}"
                )));
            }
            reference.push(x[t * h + c].to_f32() * wsum);
        }
    }
    let got: Vec<f32> = combined.iter().map(|v| v.to_f32()).collect();
    let diff = calc_diff(&got, &reference);
    let limit = if cfg.use_fp8 { 9e-4 } else { 1e-5 };
    if diff.is_nan() || diff >= limit {
        return Err(bad(format!("calc_diff {diff:e} is not below {limit:e}")));
    }
    Ok(diff)
}

/// Order-independent hash of a dispatch output's valid content (the packing order of
/// blocks is arrival order, so the hash sums per-row hashes).
pub fn dispatch_hash(cfg: &Config, num_pes: usize, out: &DispatchOutput) -> u64 {
    let l = cfg.num_experts / num_pes;
    let rows = num_pes * cfg.num_max_dispatch_tokens_per_rank;
    let h = cfg.hidden;
    let mut sum = 0u64;
    for le in 0..l {
        for s in 0..num_pes {
            let lr = out.layout_range[le * num_pes + s];
            let (b, c) = ((lr >> 32) as usize, (lr & 0xffff_ffff) as usize);
            // Clamped to the expert's rows: a kernel's range is read back unchecked.
            let (b, e) = if lr < 0 {
                (0, 0)
            } else {
                (b.min(rows), b.saturating_add(c).min(rows))
            };
            for j in b..e {
                let row = le * rows + j;
                let mut w = WordHash::new();
                w.word(le as u64);
                w.word(s as u64);
                w.word(out.src_info[row] as u32 as u64);
                match &out.recv_x {
                    RecvX::Bf16(v) => w.bf16s(&v[row * h..(row + 1) * h]),
                    RecvX::Fp8 { data, scales } => {
                        w.bytes(&data[row * h..(row + 1) * h]);
                        let g = h / fp8::GROUP;
                        scales[row * g..(row + 1) * g]
                            .iter()
                            .for_each(|x| w.word(x.to_bits() as u64));
                    }
                }
                sum = sum.wrapping_add(w.finish());
            }
        }
    }
    let mut w = WordHash::new();
    out.recv_count.iter().for_each(|&c| w.word(c as u32 as u64));
    sum ^ w.finish()
}

/// Hash of a bf16 tensor's bits.
pub fn hash_bf16(v: &[bf16]) -> u64 {
    let mut w = WordHash::new();
    w.bf16s(v);
    w.finish()
}

/// An order-dependent 64-bit hash fed 8 bytes at a time (a multiply-xorshift chain,
/// finished with splitmix64's mixer): the bench hashes every iteration's outputs, and
/// FNV-1a over bytes took most of an iteration's untimed time.
struct WordHash {
    h: u64,
    n: u64,
}

impl WordHash {
    fn new() -> WordHash {
        WordHash {
            h: 0x243f_6a88_85a3_08d3,
            n: 0,
        }
    }

    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.h ^= self.h >> 29;
        self.n += 1;
    }

    /// Bytes, 8 at a time (a short tail padded with zeros), then their count (so that a
    /// trailing zero byte is not the padding's).
    fn bytes(&mut self, b: &[u8]) {
        let mut chunks = b.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(last));
        }
        self.word(b.len() as u64);
    }

    /// bf16 values' bits, 4 at a time, then their count (as `bytes`).
    fn bf16s(&mut self, v: &[bf16]) {
        for c in v.chunks(4) {
            let w = c
                .iter()
                .enumerate()
                .fold(0u64, |w, (i, x)| w | (x.to_bits() as u64) << (16 * i));
            self.word(w);
        }
        self.word(v.len() as u64);
    }

    fn finish(&self) -> u64 {
        crate::pe::mix64(self.h ^ self.n.wrapping_mul(0xd6e8_feb8_6659_fd93))
    }
}
