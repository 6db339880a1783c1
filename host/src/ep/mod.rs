//! Expert-parallel MoE dispatch and combine with DeepEP's low-latency (LL) semantics
//! (design: `shared/design/EP.md`; decisions and numbers: `docs/ep.md`).
//!
//! This module owns the EP buffers ([`Layout`], [`Buffer`]) and the CPU implementation of
//! LL dispatch and combine, which is the oracle the GPU kernels will be checked against.
//! It moves data only with the runtime's one-sided operations (put, signal) into peers'
//! symmetric buffers, and — on the direct path, for node-local (p2p) peers — by reading
//! peers' symmetric buffers through their mapping here ([`Path`]); it must not
//! synchronise PEs with the host bootstrap inside dispatch/combine (only [`Buffer::new`]
//! is a host collective).
//!
//! Protocol of one LL call (number `seq`, buffer set `seq % 2`, tag `seq + 1`):
//! - dispatch: each PE quantises its T tokens once into its send area, puts one message
//!   per (token, selected expert) into the owner's receive area (packed per source PE by
//!   local expert, in token order), then sets one count word per (local expert, source
//!   PE) to `tag << 32 | count` (Release). The receiver waits for every count word of
//!   every unmasked source (Acquire), and copies each (expert, source) block into the
//!   outputs as it arrives: arrival order. Direct path: only the 16-byte headers are
//!   written into the receiver's area and the count word carries `DIRECT`; the
//!   receiver copies each payload from the sender's send area into its output.
//! - combine: each expert owner puts every received row's expert output into the source
//!   PE's row for (token, top-k slot), then sets its combine flag there to
//!   `tag << 32 | rows`. The source waits for every flag, then sums over k in k order in
//!   f32 and rounds once to bf16 (so repeats are bit-identical). Direct path (zero-copy
//!   combines only): the owner leaves the rows in its `combine_send`, writes
//!   `begin << 32 | count` of each of its blocks for that source into the source's pull
//!   area, and sets the flag with `DIRECT`; the source reads the rows from the owner's
//!   memory in the same pass as the sum. Own rows (owner = source) of a combine without
//!   a hook or zero copy are not copied at all: the sum reads them from the caller's
//!   `expert_out`, still borrowed; the own flag still carries the count.
//! - credits: when a PE has received call `seq`, it writes `tag` into its credit word on
//!   every PE. Before call `seq + 2` reuses the set, a PE waits for every credit of
//!   `seq`, so nothing is overwritten before it was read (two calls may be in flight).
//! - faults: a PE whose input is invalid still takes part: it sends counts or flags with
//!   a poison bit and a reason code instead of data, so every PE fails the call with
//!   [`Error::EpPeerFailed`] naming it, and the buffer stays usable.

pub mod bench;
pub mod check;
pub mod fp8;
pub mod layout;
mod reduce;

pub use half::bf16;
pub use layout::{Layout, Region};

use crate::error::{Error, Result};
use crate::pe::Pe;
use crate::team::Team;
use crate::types::{SignalOp, SymPtr};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Largest supported `num_topk`.
pub const MAX_TOPK: usize = 11;
/// Largest supported `num_max_dispatch_tokens_per_rank` (counts travel in 24 bits).
pub const MAX_TOKENS_PER_RANK: usize = 1 << 20;

/// Shape of an EP buffer; every PE of the team must pass the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// N: the most tokens any PE dispatches in one call (T ≤ N).
    pub num_max_dispatch_tokens_per_rank: usize,
    /// H: values per token.
    pub hidden: usize,
    /// E: experts in the team; each PE owns `E / num_pes` of them (expert e on PE e / L).
    pub num_experts: usize,
    /// K: expert slots per token (≤ 11).
    pub num_topk: usize,
    /// Dispatch FP8 e4m3 with one f32 scale per 128 channels instead of bf16.
    pub use_fp8: bool,
    /// Round FP8 scales up to powers of two.
    pub round_scale: bool,
}

impl Config {
    /// DeepEP's LL benchmark shape: N = 128, H = 7168, E = 288, top-8, FP8.
    pub fn deepep_default() -> Config {
        Config {
            num_max_dispatch_tokens_per_rank: 128,
            hidden: 7168,
            num_experts: 288,
            num_topk: 8,
            use_fp8: true,
            round_scale: false,
        }
    }

    /// Checks the config for a team of `num_pes` PEs.
    pub fn validate(&self, num_pes: usize) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("ep::Config ({self}): {m}")));
        let n = self.num_max_dispatch_tokens_per_rank;
        if n == 0 || n > MAX_TOKENS_PER_RANK {
            return bad(format!(
                "num_max_dispatch_tokens_per_rank must be in 1..={MAX_TOKENS_PER_RANK}"
            ));
        }
        if self.hidden == 0 {
            return bad("hidden must be at least 1".into());
        }
        if self.use_fp8 && (self.hidden < fp8::GROUP || self.hidden % fp8::GROUP != 0) {
            return bad(format!(
                "with FP8, hidden ({}) must be a multiple of {} (one scale per {} channels)",
                self.hidden,
                fp8::GROUP,
                fp8::GROUP
            ));
        }
        if self.num_topk == 0 || self.num_topk > MAX_TOPK {
            return bad(format!(
                "num_topk ({}) must be in 1..={MAX_TOPK}",
                self.num_topk
            ));
        }
        if num_pes == 0 || self.num_experts == 0 || self.num_experts % num_pes != 0 {
            return bad(format!(
                "num_experts ({}) must be a positive multiple of the team size ({num_pes})",
                self.num_experts
            ));
        }
        Ok(())
    }

    fn words(&self) -> [u64; 6] {
        [
            self.num_max_dispatch_tokens_per_rank as u64,
            self.hidden as u64,
            self.num_experts as u64,
            self.num_topk as u64,
            self.use_fp8 as u64,
            self.round_scale as u64,
        ]
    }

    fn show_words(w: &[u64]) -> String {
        match w {
            [n, h, e, k, f, r] => format!(
                "N={n} H={h} E={e} K={k} {} round_scale={}",
                if *f != 0 { "fp8" } else { "bf16" },
                *r != 0
            ),
            _ => format!("{w:?}"),
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&Config::show_words(&self.words()))
    }
}

/// How dispatch and combine move data between PEs on the same node (peers reached
/// through the proxy always get messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The direct path for node-local (p2p) peers, where the receiver reads: dispatch
    /// writes only message headers to the receiver, which copies each payload straight
    /// from the sender's `dispatch_send` into its output (one copy instead of two); a
    /// zero-copy combine reads each token's rows straight from the expert owners'
    /// `combine_send` (the zero-copy buffer) and sums them in the same pass (no copy).
    /// A combine without zero copy puts the rows (one copy either way). Other peers get
    /// messages. The default.
    Auto,
    /// Every peer gets messages (payloads put into its `dispatch_recv`, rows into its
    /// `combine_recv`): the path used for proxy peers, forced for all.
    Message,
}

impl Path {
    /// `RSHMEM_EP_PATH`: `auto` (default) or `message`.
    pub fn from_env() -> Result<Path> {
        match std::env::var("RSHMEM_EP_PATH") {
            Err(std::env::VarError::NotPresent) => Ok(Path::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::Env {
                var: "RSHMEM_EP_PATH".into(),
                value: v.to_string_lossy().into_owned(),
                reason: "not valid UTF-8".into(),
            }),
            Ok(v) => match v.trim() {
                "" | "auto" => Ok(Path::Auto),
                "message" => Ok(Path::Message),
                other => Err(Error::InvalidArgument(format!(
                    "RSHMEM_EP_PATH={other}: expected auto or message"
                ))),
            },
        }
    }
}

/// Element types accepted for `topk_idx` (int64 and int32, as DeepEP).
pub trait ExpertId: Copy + Send + Sync {
    fn to_i64(self) -> i64;
}
impl ExpertId for i64 {
    fn to_i64(self) -> i64 {
        self
    }
}
impl ExpertId for i32 {
    fn to_i64(self) -> i64 {
        self as i64
    }
}

/// Received tokens, `[L, R*N, H]`.
#[derive(Debug, Clone, PartialEq)]
pub enum RecvX {
    Bf16(Vec<bf16>),
    /// e4m3 bytes `[L, R*N, H]` and scales `[L, R*N, H/128]` (`x ≈ q * scale`).
    Fp8 {
        data: Vec<u8>,
        scales: Vec<f32>,
    },
}

/// What dispatch delivers to this PE, for its L local experts. Rows at or beyond
/// `recv_count[e]` of an expert are unspecified (zero, or stale when outputs are recycled).
#[derive(Debug, Clone)]
pub struct DispatchOutput {
    pub recv_x: RecvX,
    /// `[L]`: valid rows per local expert.
    pub recv_count: Vec<i32>,
    /// `[L, R*N]`: token index on its source PE of each received row.
    pub src_info: Vec<i32>,
    /// `[L, R]`: `begin << 32 | count` of the block from each source PE.
    pub layout_range: Vec<i64>,
    /// What combine needs.
    pub handle: Handle,
}

/// Dispatch's record of where each received row came from, for combine. Read-only
/// (getters): combine writes through raw pointers at the rows it names, so a handle is
/// only ever what a dispatch made.
#[derive(Debug, Clone)]
pub struct Handle {
    buffer_id: u64,
    /// LL call number of the dispatch.
    call: u64,
    /// T of this PE's dispatch.
    num_tokens: usize,
    num_max_dispatch_tokens_per_rank: usize,
    hidden: usize,
    num_experts: usize,
    src_info: Vec<i32>,
    layout_range: Vec<i64>,
    recv_count: Vec<i32>,
    /// `[L, R*N]`: top-k slot of each received row on its source PE.
    row_k: Vec<i32>,
    /// [`routing_hash`] of the dispatch's `topk_idx` (0 for a detached handle).
    routing: u64,
}

impl Handle {
    /// A handle for dispatch outputs made elsewhere (the GPU launcher,
    /// `crate::gpu::ep`), so they can go through the same checks ([`check`]). A CPU
    /// [`Buffer`] refuses it in combine (no buffer has id 0).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn detached(
        call: u64,
        num_tokens: usize,
        cfg: &Config,
        src_info: Vec<i32>,
        layout_range: Vec<i64>,
        recv_count: Vec<i32>,
        row_k: Vec<i32>,
    ) -> Handle {
        Handle {
            buffer_id: 0,
            call,
            num_tokens,
            num_max_dispatch_tokens_per_rank: cfg.num_max_dispatch_tokens_per_rank,
            hidden: cfg.hidden,
            num_experts: cfg.num_experts,
            src_info,
            layout_range,
            recv_count,
            row_k,
            routing: 0,
        }
    }

    /// `[L, R*N]`: the top-k slot of each received row on its source PE.
    pub fn row_k(&self) -> &[i32] {
        &self.row_k
    }
    /// LL call number of the dispatch.
    pub fn call(&self) -> u64 {
        self.call
    }
    /// T of this PE's dispatch.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }
    pub fn num_max_dispatch_tokens_per_rank(&self) -> usize {
        self.num_max_dispatch_tokens_per_rank
    }
    pub fn hidden(&self) -> usize {
        self.hidden
    }
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }
    /// `[L, R*N]`: the source token index of each received row (as the output's).
    pub fn src_info(&self) -> &[i32] {
        &self.src_info
    }
    /// `[L, R]`: `begin << 32 | count` of each (local expert, source) block.
    pub fn layout_range(&self) -> &[i64] {
        &self.layout_range
    }
    /// `[L]`: rows received per local expert.
    pub fn recv_count(&self) -> &[i32] {
        &self.recv_count
    }
}

/// Immutable state shared by a buffer and its hooks.
struct Shared {
    id: u64,
    cfg: Config,
    layout: Layout,
    /// The symmetric allocation.
    base: SymPtr<u8>,
    /// Its address in this process (this PE's copy).
    local: usize,
    /// World rank of each team member.
    members: Vec<usize>,
    /// This PE's team rank.
    me: usize,
    /// `tag` of a call on each set whose receive hook has not run yet (0 = none).
    pending: [AtomicU64; 2],
    /// Recycled output storage.
    pool: Mutex<Vec<RecvX>>,
    /// The pull area (a separate allocation, see [`Layout::pull_range_word`]).
    pull_base: SymPtr<u8>,
    pull_local: usize,
    /// Per team PE: the address here of its main allocation when combine reads its rows
    /// directly (p2p and [`Path::Auto`]), else None.
    peer_main: Vec<Option<usize>>,
    /// Shrink mode ([`Buffer::set_shrink`]).
    shrink: AtomicBool,
    /// Per team PE: masked by shrink mode (in a call or a hook); folded into the
    /// buffer's and each call's mask.
    shrunk: Vec<AtomicBool>,
    /// Why the buffer is unusable: a call failed part way (a transport error, a dead or
    /// silent peer without shrink mode), so the PEs may no longer agree on the call
    /// sequence. Invalid input does not break it (the call is poisoned and completes).
    broken: Mutex<Option<String>>,
    /// `Buffer::destroy` freed the memory: a hook still alive must not touch it.
    destroyed: AtomicBool,
    /// Held (shared) by each receive hook while it works ([`Shared::enter`]), and
    /// (exclusive) by `Buffer::destroy` while it marks the buffer destroyed and frees it.
    active: std::sync::RwLock<()>,
    /// Per team PE: the address here of its pull area (same condition).
    peer_pull: Vec<Option<usize>>,
}

/// An EP buffer: the symmetric allocation of [`Layout`] plus the call sequence.
///
/// Every PE of the team must make the same LL calls in the same order (dispatch and
/// combine both count). Destroy it with [`Buffer::destroy`] (collective); dropping it
/// leaves its symmetric memory allocated.
pub struct Buffer<'p> {
    pe: &'p Pe,
    sh: Arc<Shared>,
    seq: u64,
    /// The first LL call number (0, but for [`Buffer::start_at_call_for_tests`]): the
    /// calls before `first + 2` wait for no credits.
    first: u64,
    masked: Vec<bool>,
    zero_copy_call: Option<u64>,
}

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) const POISON: u64 = 1 << 31;
pub(crate) const COUNT_MASK: u64 = 0xff_ffff;
/// In a dispatch count word or a combine flag without POISON: the direct path. Dispatch:
/// only the message headers were written; the receiver copies each payload from the
/// sender's `dispatch_send`. Combine: the rows are in the owner's `combine_send`, to be
/// read there, not put into the receiver's `combine_recv`.
const DIRECT: u64 = 1 << 30;
/// In a combine flag without POISON, bits 24..29: the low bits of the LL call number of the
/// dispatch whose handle the sender combined with. Every PE must pass the handle of the
/// same dispatch; one that passed another (two dispatches in flight with hooks, taken in
/// different orders on different PEs) would return rows laid out for another routing,
/// which the row counts alone may not reveal.
const HANDLE_SHIFT: u32 = 24;
const HANDLE_BITS: u64 = 0x3f;

/// The handle mark of a combine flag ([`HANDLE_SHIFT`]) for a dispatch of LL call `call`.
fn handle_mark(call: u64) -> u64 {
    (call & HANDLE_BITS) << HANDLE_SHIFT
}

/// Why a PE's own input made it poison a call; travels as `code << 24 | value`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fault {
    TooManyTokens(u64),
    BadExpert(u64),
    Shape,
    Handle,
    /// The entry of topk_idx that names its expert for the (N+1)-th time (its index).
    ExpertOverflow(u64),
    /// Combine's topk_idx is not the dispatch's.
    Routing,
}

impl Fault {
    pub(crate) fn encode(self) -> u64 {
        let (c, v) = match self {
            Fault::TooManyTokens(t) => (1, t),
            Fault::BadExpert(i) => (2, i),
            Fault::Shape => (3, 0),
            Fault::Handle => (4, 0),
            Fault::ExpertOverflow(i) => (5, i),
            Fault::Routing => (6, 0),
        };
        POISON | c << 24 | v.min(COUNT_MASK)
    }
    pub(crate) fn describe(low: u64, cfg: &Config) -> String {
        let v = low & COUNT_MASK;
        match (low >> 24) & 0x7f {
            1 => format!(
                "it passed {}{v} tokens, more than num_max_dispatch_tokens_per_rank = {}",
                // The word holds 24 bits of the count (N itself is at most 2^20).
                if v == COUNT_MASK { "at least " } else { "" },
                cfg.num_max_dispatch_tokens_per_rank
            ),
            2 => format!(
                "its topk_idx[{}][{}] is outside [-1, {})",
                v / cfg.num_topk as u64,
                v % cfg.num_topk as u64,
                cfg.num_experts
            ),
            3 => "its inputs do not match the config (shapes; on a GPU also a null, \
                  misaligned or too short device tensor)"
                .into(),
            4 => "it passed a handle of another buffer, or a wrong zero-copy buffer".into(),
            5 => format!(
                "its topk_idx[{}][{}] names an expert {} times, more rows than \
                 num_max_dispatch_tokens_per_rank = {} allows",
                v / cfg.num_topk as u64,
                v % cfg.num_topk as u64,
                cfg.num_max_dispatch_tokens_per_rank + 1,
                cfg.num_max_dispatch_tokens_per_rank
            ),
            6 => "its combine topk_idx differs from the one it dispatched with".into(),
            // GPU kernels only (EP_FAULT_DISPATCH_HEADER): the CPU's dispatch returns no
            // handle after a corrupt message.
            7 => "the dispatch of its handle received a corrupt message there (see that \
                  dispatch's error), so it returned no rows"
                .into(),
            c => format!("unknown fault code {c}"),
        }
    }
}

/// FNV-1a of a `topk_idx` (as i64 values): combine checks that it gets the dispatch's.
fn routing_hash<I: ExpertId>(idx: &[I]) -> u64 {
    idx.iter().fold(crate::pe::FNV_OFFSET, |h, v| {
        crate::pe::fnv_from(h, &v.to_i64().to_le_bytes())
    })
}

/// The first entry of `idx` (row-major) outside [-1, e), as [`Fault::BadExpert`].
fn first_bad_id<I: ExpertId>(idx: &[I], e: usize) -> Option<usize> {
    idx.iter().position(|v| {
        let v = v.to_i64();
        v < -1 || v >= e as i64
    })
}

/// With ids repeated within a token (sent once per slot, as DeepEP), the first entry of
/// `idx` (row-major, `k` per token, ids in [-1, e)) that names its expert for the
/// (n+1)-th time: one PE sending more than `n` rows to an expert would overrun the
/// expert's `n` rows per source PE (and the receiver's area for this PE). Without
/// repeats an expert gets at most T <= n rows, so only then are the ids counted. The GPU
/// kernels check the same (`first_overflow` in ep_ll.cu).
fn first_overflow<I: ExpertId>(idx: &[I], k: usize, e: usize, n: usize) -> Option<usize> {
    let repeats = idx.chunks(k).any(|row| {
        row.iter()
            .enumerate()
            .any(|(j, v)| v.to_i64() >= 0 && row[..j].iter().any(|w| w.to_i64() == v.to_i64()))
    });
    if !repeats {
        return None;
    }
    let mut count = vec![0usize; e];
    idx.iter().position(|v| {
        let Ok(v) = usize::try_from(v.to_i64()) else {
            return false;
        };
        count[v] += 1;
        count[v] > n
    })
}

/// A call's tag: its LL call number + 1 (0 is "nothing yet"). Credit words carry it
/// whole (64 bits, compared with `<`).
fn tag(seq: u64) -> u64 {
    seq + 1
}

/// The tag as signal words carry it, in their high 32 bits: 1..=2^32-1, never 0 (a
/// zeroed word), so it wraps after 2^32-1 calls instead of being cut to 32 bits, which
/// would stop every wait from matching after 2^32 calls (about a week of a decoding
/// server's LL calls). At most two calls are in flight, so a word from 2^32-1 calls ago
/// cannot be mistaken for this call's.
fn wire(tag: u64) -> u64 {
    (tag - 1) % 0xffff_ffff + 1
}

impl Shared {
    /// Starts a receive hook's work: refuses a hook whose buffer was destroyed (its memory
    /// is freed), else returns the guard that keeps [`Buffer::destroy`] from freeing the
    /// memory until the hook is done with it (hooks may run on other threads: before
    /// 2026-12-07 a destroy meanwhile freed the memory under a receiving hook, which then
    /// read it and wrote credit words into peers' heaps at offsets their next allocations
    /// could own).
    fn enter(&self, op: &str, seq: u64) -> Result<std::sync::RwLockReadGuard<'_, ()>> {
        let active = self.active.read().unwrap_or_else(|e| e.into_inner());
        if self.destroyed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(format!(
                "{op}: the receive hook of LL call #{seq} outlived its buffer, which was \
                 destroyed"
            )));
        }
        Ok(active)
    }

    /// For a wait on team rank `src` that ran out in `op` (dispatch or combine) of the
    /// call whose wire tag is `want` on `set`: when `src` sent this call's words of the
    /// other kind instead, says so (it made a different LL call at this call number), else
    /// nothing. Read only once the wait failed, so it costs the normal path nothing.
    fn other_kind_hint(&self, op: &str, set: usize, src: usize, want: u64) -> String {
        let dispatch = op == "low_latency_dispatch";
        let sent_other = if dispatch {
            self.load(self.layout.combine_flag_word(set, src)) >> 32 == want
        } else {
            (0..self.l())
                .any(|le| self.load(self.layout.dispatch_count_word(set, le, src)) >> 32 == want)
        };
        if !sent_other {
            return String::new();
        }
        let other = if dispatch {
            "low_latency_combine"
        } else {
            "low_latency_dispatch"
        };
        format!(
            "; PE {} sent this call's {other} words instead: it made {other} its LL call where \
             this PE made {op} (every PE of the buffer must make the same LL calls in the same \
             order)",
            self.members[src]
        )
    }

    fn n(&self) -> usize {
        self.members.len()
    }
    fn l(&self) -> usize {
        self.layout.num_local_experts
    }
    fn sym(&self, offset: usize, len: usize) -> SymPtr<u8> {
        SymPtr::from_raw(self.base.offset() + offset, len)
    }
    fn word(&self, offset: usize) -> SymPtr<u64> {
        SymPtr::from_raw(self.base.offset() + offset, 1)
    }
    /// Acquire load of one of this PE's signal words.
    fn load(&self, offset: usize) -> u64 {
        debug_assert!(offset % 8 == 0 && offset + 8 <= self.layout.total_bytes);
        // SAFETY: `local` is this PE's mapping of the allocation (total_bytes long) and
        // signal words are 8-aligned (regions are 64-aligned); other PEs update them only
        // with atomic RMW/stores. Acquire pairs with the writer's Release signal update,
        // so the data it put before the signal is visible after this load.
        unsafe { AtomicU64::from_ptr((self.local + offset) as *mut u64).load(Ordering::Acquire) }
    }
    /// This PE's bytes `[offset, offset+len)` of the allocation.
    ///
    /// # Safety
    /// No other PE may write the range while the slice lives (it is a receive area whose
    /// signal was observed, or an area only this PE writes).
    unsafe fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        debug_assert!(offset + len <= self.layout.total_bytes);
        // SAFETY: in bounds of our mapping; exclusivity per the contract.
        unsafe { std::slice::from_raw_parts((self.local + offset) as *const u8, len) }
    }
    /// Acquire load of a word of this PE's pull area.
    fn load_pull(&self, offset: usize) -> u64 {
        debug_assert!(offset % 8 == 0 && offset + 8 <= self.layout.pull_area_bytes());
        // SAFETY: `pull_local` maps the pull area (pull_area_bytes long), words are
        // 8-aligned; owners write them only atomically. Acquire (the flag load already
        // ordered them; this keeps the word's own read ordered too).
        unsafe {
            AtomicU64::from_ptr((self.pull_local + offset) as *mut u64).load(Ordering::Acquire)
        }
    }
    fn signal(&self, pe: &Pe, offset: usize, value: u64, dest: usize) -> Result<()> {
        pe.signal_op(self.word(offset), value, SignalOp::Set, self.members[dest])
    }
    /// Records that LL call `seq` failed part way with `e` (later calls refuse to run) and
    /// returns `e`.
    fn broke(&self, seq: u64, e: Error) -> Error {
        let mut b = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        b.get_or_insert_with(|| format!("LL call #{seq} failed: {e}"));
        e
    }
    /// Shrink mode: the team PE that error `e` is about (a death, or a timeout waiting
    /// for it), now masked in `shrunk` and its death tolerated by the runtime. None when
    /// not shrinking or when `e` is about something else (then it is the call's error).
    fn shrink_target(&self, pe: &Pe, e: &Error) -> Option<usize> {
        // Relaxed: a flag this PE's own thread sets between calls (hooks on other threads
        // see it through the Arc's handover, which synchronises).
        if !self.shrink.load(Ordering::Relaxed) {
            return None;
        }
        let (world, died) = match e {
            Error::PeerDied { pe, .. } => (*pe, true),
            Error::EpTimeout { peer, .. } => (*peer, false),
            _ => return None,
        };
        let s = self.members.iter().position(|&m| m == world)?;
        if s == self.me || (died && pe.tolerate_death(world).is_err()) {
            return None;
        }
        // Relaxed: read back only by this PE (its calls and hooks run in program order).
        self.shrunk[s].store(true, Ordering::Relaxed);
        Some(s)
    }
    /// Adds the PEs shrink mode masked to `masked`.
    fn fold_shrunk(&self, masked: &mut [bool]) {
        for (m, s) in masked.iter_mut().zip(&self.shrunk) {
            // Relaxed: see shrink_target.
            *m |= s.load(Ordering::Relaxed);
        }
    }
    /// Runs `wait` with the call's mask; in shrink mode, a failure naming an unmasked team
    /// PE masks it and runs `wait` again without it. After a timeout, the retries share
    /// one grace period of half the timeout (`wait`'s second argument, the deadline: see
    /// [`poll_or_look`]): every PE still silent at its end had the full timeout and more
    /// to answer, and is masked; one that was only late because it too waited for the
    /// silent PE answers within it. Before 2026-12-07 each silent PE cost a full timeout
    /// of its own, one after the other.
    fn wait_shrinking<R>(
        &self,
        pe: &Pe,
        masked: &mut [bool],
        mut wait: impl FnMut(&[bool], Option<Instant>) -> Result<R>,
    ) -> Result<R> {
        let mut grace: Option<Instant> = None;
        // Each retry follows a newly masked PE or a newly tolerated death: at most 2n.
        let mut retries = 0;
        loop {
            self.fold_shrunk(masked);
            match wait(masked, grace) {
                Ok(r) => return Ok(r),
                Err(e) => match self.shrink_target(pe, &e) {
                    Some(s) if !masked[s] => {
                        masked[s] = true;
                        if grace.is_none() && matches!(e, Error::EpTimeout { .. }) {
                            grace = Some(Instant::now() + pe.timeout() / 2);
                        }
                    }
                    // A PE already masked (by an earlier timeout, or update_mask) that died
                    // since: shrink_target has now tolerated the death, so the liveness
                    // check will not report it again; wait on (it failed the call and
                    // broke the buffer before).
                    Some(_) if matches!(e, Error::PeerDied { .. }) && retries < 2 * self.n() => {
                        retries += 1;
                    }
                    _ => return Err(e),
                },
            }
        }
    }
    /// Runs `send`, an operation towards team PE `d`. In shrink mode, a failure because
    /// `d` died masks `d` and skips the operation; a failure naming another team PE
    /// (a death reported meanwhile) masks that PE and runs `send` again.
    fn to_peer(&self, pe: &Pe, d: usize, mut send: impl FnMut() -> Result<()>) -> Result<()> {
        // Each retry follows a newly tolerated death, so there are at most n of them.
        let mut retries = 0;
        loop {
            let Err(e) = send() else { return Ok(()) };
            match self.shrink_target(pe, &e) {
                Some(s) if s == d => return Ok(()),
                Some(_) if retries < self.n() => retries += 1,
                _ => return Err(e),
            }
        }
    }
    /// Waits until every unmasked PE released `set` after call `seq - 2` (none for the
    /// buffer's first two calls, numbered from `first`).
    fn wait_credits(
        &self,
        pe: &Pe,
        seq: u64,
        first: u64,
        masked: &mut [bool],
        op: &'static str,
    ) -> Result<()> {
        if seq < first + 2 {
            return Ok(());
        }
        let set = (seq % 2) as usize;
        let want = tag(seq - 2);
        let start = Instant::now();
        self.wait_shrinking(pe, masked, |masked, grace| {
            poll_or_look(
                pe,
                grace,
                || match (0..self.n())
                    .filter(|&p| !masked[p])
                    .find(|&p| self.load(self.layout.credit_word(set, p)) < want)
                {
                    None => Ok(()),
                    Some(p) => Err(p),
                },
                |&p| Error::EpTimeout {
                    pe: pe.my_pe(),
                    op,
                    call: seq,
                    peer: self.members[p],
                    expert: None,
                    what: format!(
                        "it to finish receiving LL call #{} on buffer set {set} (has it called \
                         the receive hook of that call? credit word holds {})",
                        seq - 2,
                        self.load(self.layout.credit_word(set, p))
                    ),
                    waited_ms: start.elapsed().as_millis() as u64,
                },
            )
        })
    }
    /// Tells every unmasked PE that this PE has read everything of call `seq`.
    fn release(&self, pe: &Pe, seq: u64, masked: &[bool]) -> Result<()> {
        let set = (seq % 2) as usize;
        for p in (0..self.n()).filter(|&p| !masked[p]) {
            self.to_peer(pe, p, || {
                self.signal(pe, self.layout.credit_word(set, self.me), tag(seq), p)
            })?;
        }
        self.pending[set].store(0, Ordering::Release);
        Ok(())
    }
}

/// `pe.poll(step, expired)`, or, with a `grace` deadline (shrink mode's retries after a
/// timeout: [`Shared::wait_shrinking`]), the same poll bounded by what is left until that
/// deadline instead of a full timeout (a few polls when it has passed). Either way the
/// poll checks liveness, so a death reported meanwhile is masked as a death (tolerated),
/// not as a timeout (which would leave it untolerated).
fn poll_or_look<R, S>(
    pe: &Pe,
    grace: Option<Instant>,
    step: impl FnMut() -> std::result::Result<R, S>,
    expired: impl FnOnce(&S) -> Error,
) -> Result<R> {
    match grace {
        None => pe.poll(step, expired),
        Some(deadline) => pe.poll_for(
            deadline.saturating_duration_since(Instant::now()),
            step,
            expired,
        ),
    }
}

impl<'p> Buffer<'p> {
    /// Collective over the whole job, as symmetric allocation is (nvshmem_malloc): every PE
    /// calls it at the same time, each with its own `team` — the world, or its EP group of
    /// a split (groups may differ in size; each PE allocates the largest need). Within
    /// `team` it agrees on `cfg` (a mismatch fails on every member, naming each PE's
    /// config, and the other PEs with an error naming the first PE that failed) and
    /// validates it. The buffer allocates [`Layout::alloc_hint`] bytes for its team size
    /// (two blocks: [`Layout::size_hint`] and the pull area); if the heap cannot hold them,
    /// it fails with nothing left allocated. [`Buffer::destroy`] is world-collective too.
    /// The combine path comes from `RSHMEM_EP_PATH` ([`Path::from_env`]).
    pub fn new(pe: &'p Pe, team: &Team, cfg: Config) -> Result<Buffer<'p>> {
        Buffer::with_path(pe, team, cfg, Path::from_env()?)
    }

    /// [`Buffer::new`] with an explicit combine [`Path`] (every PE must pass the same).
    pub fn with_path(pe: &'p Pe, team: &Team, cfg: Config, path: Path) -> Result<Buffer<'p>> {
        if !team.members().contains(&(pe.my_pe() as u32)) {
            return Err(Error::InvalidArgument(format!(
                "ep::Buffer::new: PE {} is not a member of the team it passed",
                pe.my_pe()
            )));
        }
        let layout = (|| {
            pe.agree_in(team, "ep::Buffer::new", &cfg.words(), Config::show_words)?;
            pe.agree_in(
                team,
                "ep::Buffer::new (combine path)",
                &[path as u64],
                |w| match w {
                    [0] => "path auto".into(),
                    [1] => "path message".into(),
                    _ => format!("{w:?}"),
                },
            )?;
            Layout::new(&cfg, team.n_pes())
        })();
        // Symmetric allocation is world-collective: every PE of the job takes part, each
        // for its own team (EP groups of a split may differ in size), and all allocate the
        // largest need. A PE whose agreement or layout failed makes every PE fail.
        let need = match &layout {
            Ok(l) => [1, l.total_bytes as u64, l.pull_area_bytes() as u64],
            Err(_) => [0, 0, 0],
        };
        let bytes: Vec<u8> = need.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = pe.boot().allgather(&pe.world().group(), &bytes)?;
        let word = |b: &[u8], i: usize| crate::pe::le_u64(&b[8 * i..]);
        let layout = layout?;
        if let Some(bad) = all.iter().position(|b| word(b, 0) == 0) {
            return Err(Error::InvalidArgument(format!(
                "ep::Buffer::new: PE {bad} failed to create its buffer (its own error says why: \
                 a config or path that differs within its team, or an invalid config)"
            )));
        }
        let max = |i: usize| all.iter().map(|b| word(b, i) as usize).max().unwrap_or(0);
        let base = pe.align(layout::REGION_ALIGN, max(1))?;
        // The second block failing (the heap holds the first but not both) frees the first
        // on every PE (the heaps are symmetric, so every PE fails here alike); before, it
        // stayed allocated with no handle to free it.
        let pull_base = match pe.align(layout::REGION_ALIGN, max(2)) {
            Ok(p) => p,
            Err(e) => {
                let _ = pe.free(base);
                return Err(e);
            }
        };
        let pull_local = pe.ptr(pull_base, pe.my_pe()).ok_or_else(|| {
            Error::InvalidArgument("ep::Buffer::new: the pull area is not mapped".into())
        })? as usize;
        // SAFETY: our own mapping of the new pull area, which no PE uses before the
        // barrier below.
        unsafe { std::ptr::write_bytes(pull_local as *mut u8, 0, layout.pull_area_bytes()) };
        let members: Vec<usize> = team.members().iter().map(|&m| m as usize).collect();
        let direct_addr = |sym: SymPtr<u8>, bytes: usize| -> Vec<Option<usize>> {
            members
                .iter()
                .map(|&m| match path {
                    Path::Auto => pe.p2p_addr(m, sym.offset(), bytes).map(|p| p as usize),
                    Path::Message => None,
                })
                .collect()
        };
        let peer_main = direct_addr(base, layout.total_bytes);
        let peer_pull = direct_addr(pull_base, layout.pull_area_bytes());
        let me = team.my_pe();
        let local = pe.ptr(base, pe.my_pe()).ok_or_else(|| {
            Error::InvalidArgument("ep::Buffer::new: the allocation is not mapped".into())
        })? as usize;
        // Signal words must start below every tag: zero both sets' signal areas.
        for set in 0..2 {
            let off = set * layout.set_bytes;
            // SAFETY: [off, off + dispatch_send.offset) is inside our mapping of the new
            // allocation, which no PE uses before the barrier below.
            unsafe {
                std::ptr::write_bytes((local + off) as *mut u8, 0, layout.dispatch_send.offset)
            };
        }
        pe.team_barrier(team)?;
        let n = team.n_pes();
        Ok(Buffer {
            pe,
            sh: Arc::new(Shared {
                id: NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed),
                cfg,
                layout,
                base,
                local,
                members,
                me,
                pending: [AtomicU64::new(0), AtomicU64::new(0)],
                pool: Mutex::new(Vec::new()),
                pull_base,
                pull_local,
                peer_main,
                peer_pull,
                shrink: AtomicBool::new(false),
                shrunk: (0..n).map(|_| AtomicBool::new(false)).collect(),
                broken: Mutex::new(None),
                destroyed: AtomicBool::new(false),
                active: std::sync::RwLock::new(()),
            }),
            seq: 0,
            first: 0,
            masked: vec![false; n],
            zero_copy_call: None,
        })
    }

    /// Tests only: numbers this buffer's LL calls from `seq` instead of 0 (every PE of
    /// the team the same, before its first call), to run calls across the point where
    /// the signal words' 32-bit tags wrap (after 2^32 - 1 calls).
    #[doc(hidden)]
    pub fn start_at_call_for_tests(&mut self, seq: u64) -> Result<()> {
        if self.seq != self.first {
            return Err(Error::InvalidArgument(
                "start_at_call_for_tests: only before the buffer's first LL call".into(),
            ));
        }
        self.seq = seq;
        self.first = seq;
        Ok(())
    }

    /// Collective over the whole job, like [`Buffer::new`]: frees the symmetric memory.
    pub fn destroy(self) -> Result<()> {
        // Waits for hooks receiving on other threads to finish (each wait is bounded by the
        // PE's timeout), and keeps new ones out until the memory is freed.
        let _gone = self.sh.active.write().unwrap_or_else(|e| e.into_inner());
        // Release: a hook that sees the flag (Acquire) does not touch the memory freed
        // below; one still alive is refused from then on (its drop does nothing).
        self.sh.destroyed.store(true, Ordering::Release);
        self.pe.free(self.sh.pull_base)?;
        self.pe.free(self.sh.base)
    }

    /// Whether data from team PE `pe` takes the direct path (this PE reads it from `pe`'s
    /// memory: dispatch payloads, and zero-copy combine rows) rather than being put here.
    pub fn combine_is_direct(&self, pe: usize) -> bool {
        self.sh.peer_main.get(pe).is_some_and(|a| a.is_some())
    }

    pub fn config(&self) -> &Config {
        &self.sh.cfg
    }
    pub fn layout(&self) -> &Layout {
        &self.sh.layout
    }
    /// Number of LL calls made so far (the next call's number).
    pub fn calls(&self) -> u64 {
        self.seq
    }
    pub fn num_local_experts(&self) -> usize {
        self.sh.l()
    }

    // ------------------------------------------------------------ dead-PE mask

    /// Masks (or unmasks) team PE `pe`: a masked PE gets no tokens, is not waited for,
    /// and its experts' contributions are absent from combine (as if its experts returned
    /// nothing; weights are not renormalised). Every live PE should mask the same PEs.
    pub fn update_mask(&mut self, pe: usize, masked: bool) -> Result<()> {
        if pe >= self.masked.len() || pe == self.sh.me {
            return Err(Error::InvalidArgument(format!(
                "ep mask: PE {pe} is not another PE of the {}-PE team",
                self.masked.len()
            )));
        }
        self.masked[pe] = masked;
        if !masked {
            // Relaxed: see Shared::shrink_target.
            self.sh.shrunk[pe].store(false, Ordering::Relaxed);
        }
        Ok(())
    }
    /// The mask, per team PE (true = masked), including the PEs shrink mode masked.
    pub fn query_mask(&self) -> Vec<bool> {
        let mut m = self.masked.clone();
        self.sh.fold_shrunk(&mut m);
        m
    }
    /// Unmasks every PE (also those shrink mode masked).
    pub fn clean_mask(&mut self) {
        self.masked.iter_mut().for_each(|m| *m = false);
        for s in &self.sh.shrunk {
            // Relaxed: see Shared::shrink_target.
            s.store(false, Ordering::Relaxed);
        }
    }
    /// Shrink mode (DeepEP's `enable_shrink`; off by default). When a wait of an LL call
    /// fails because a PE of the team died or did not answer within `RSHMEM_TIMEOUT_MS`,
    /// or an operation towards a PE fails because it died, the call masks that PE (see
    /// [`Buffer::update_mask`]), tolerates its death ([`Pe::tolerate_death`]) and
    /// completes without it instead of failing; [`Buffer::query_mask`] then shows it.
    /// What a PE sent before it died is kept, so PEs may disagree about the call in which
    /// it stopped contributing. Off, such a call fails with the error. A death outside
    /// the buffer's team is not masked: it fails the call as without shrink mode (call
    /// [`Pe::tolerate_death`] for it to go on).
    pub fn set_shrink(&mut self, on: bool) {
        // Relaxed: see Shared::shrink_target.
        self.sh.shrink.store(on, Ordering::Relaxed);
    }

    /// Hands output storage back for reuse by later dispatches (saves page faults on
    /// large shapes; the rows beyond `recv_count` of later outputs are then stale).
    /// Storage of another shape or format (an output of another buffer) is dropped.
    pub fn recycle(&self, out: DispatchOutput) {
        let cfg = &self.sh.cfg;
        let (h, rows) = (
            cfg.hidden,
            self.sh.l() * self.sh.n() * cfg.num_max_dispatch_tokens_per_rank,
        );
        let fits = match &out.recv_x {
            RecvX::Bf16(v) => !cfg.use_fp8 && v.len() == rows * h,
            RecvX::Fp8 { data, scales } => {
                cfg.use_fp8 && data.len() == rows * h && scales.len() == rows * (h / fp8::GROUP)
            }
        };
        let mut p = self.sh.pool.lock().unwrap_or_else(|e| e.into_inner());
        if fits && p.len() < 4 {
            p.push(out.recv_x);
        }
    }

    /// Fails once a call broke the buffer (see `Shared::broken`).
    fn usable(&self, op: &'static str) -> Result<()> {
        match &*self.sh.broken.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(why) => Err(Error::InvalidArgument(format!(
                "{op}: this EP buffer is unusable since {why}; the PEs may no longer agree \
                 on the call sequence: destroy it and create a new one (collective)"
            ))),
            None => Ok(()),
        }
    }

    fn start_call(&mut self, op: &'static str) -> Result<(u64, usize)> {
        self.usable(op)?;
        let seq = self.seq;
        let set = (seq % 2) as usize;
        let pending = self.sh.pending[set].load(Ordering::Acquire);
        if pending != 0 {
            return Err(Error::InvalidArgument(format!(
                "{op}: LL call #{} on buffer set {set} has not been received yet: call its \
                 receive hook before starting call #{seq} (at most two calls in flight)",
                pending - 1
            )));
        }
        self.sh.fold_shrunk(&mut self.masked);
        self.sh
            .wait_credits(self.pe, seq, self.first, &mut self.masked, op)
            .map_err(|e| self.sh.broke(seq, e))?;
        self.sh.pending[set].store(tag(seq), Ordering::Release);
        self.seq += 1;
        Ok((seq, set))
    }

    // ------------------------------------------------------------ dispatch

    /// LL dispatch of `x [T, H]` routed by `topk_idx [T, K]` (-1 = slot unused).
    /// With `return_recv_hook` only the sends are issued; [`Dispatch::wait`] (or the hook's
    /// `recv`) waits for and unpacks the data. Invalid input fails the call on every PE.
    pub fn low_latency_dispatch<I: ExpertId>(
        &mut self,
        x: &[bf16],
        topk_idx: &[I],
        return_recv_hook: bool,
    ) -> Result<Dispatch<'p>> {
        let (seq, set) = self.start_call("low_latency_dispatch")?;
        let cfg = self.sh.cfg;
        let k = cfg.num_topk;
        let t_count = topk_idx.len() / k;
        let fault = self.check_dispatch_input(x, topk_idx);
        let sent = match &fault {
            Some((f, _)) => self.poison_dispatch(seq, set, f.encode()),
            None => self.send_dispatch(seq, set, x, topk_idx),
        };
        // The send's outcome first: a hook is built only for a call whose sends went out
        // (dropping one receives, which a broken call must not wait for).
        sent.map_err(|e| self.sh.broke(seq, e))?;
        let hook = DispatchHook {
            pe: self.pe,
            sh: self.sh.clone(),
            seq,
            masked: self.masked.clone(),
            num_tokens: t_count,
            routing: routing_hash(topk_idx),
            fault: fault.map(|(_, e)| e),
            received: false,
        };
        if return_recv_hook {
            Ok(Dispatch::Pending(hook))
        } else {
            hook.recv().map(Dispatch::Received)
        }
    }

    fn check_dispatch_input<I: ExpertId>(&self, x: &[bf16], idx: &[I]) -> Option<(Fault, Error)> {
        let cfg = &self.sh.cfg;
        let (k, h, n, e) = (
            cfg.num_topk,
            cfg.hidden,
            cfg.num_max_dispatch_tokens_per_rank,
            cfg.num_experts,
        );
        let bad = |f: Fault, m: String| {
            Some((
                f,
                Error::InvalidArgument(format!("low_latency_dispatch: {m}")),
            ))
        };
        if idx.len() % k != 0 {
            return bad(
                Fault::Shape,
                format!(
                    "topk_idx has {} entries, not a multiple of num_topk = {k}",
                    idx.len()
                ),
            );
        }
        let t = idx.len() / k;
        if t > n {
            return bad(
                Fault::TooManyTokens(t as u64),
                format!(
                    "{t} tokens exceed num_max_dispatch_tokens_per_rank = {n} (the limit set in \
                     ep::Config; create the buffer with a larger value)"
                ),
            );
        }
        if x.len() != t * h {
            return bad(
                Fault::Shape,
                format!("x has {} values, expected T*H = {t}*{h}", x.len()),
            );
        }
        if let Some(i) = first_bad_id(idx, e) {
            return bad(
                Fault::BadExpert(i as u64),
                format!(
                    "topk_idx[{}][{}] = {} is outside [-1, {e}) (num_experts = {e})",
                    i / k,
                    i % k,
                    idx[i].to_i64()
                ),
            );
        }
        if let Some(i) = first_overflow(idx, k, e, n) {
            return bad(
                Fault::ExpertOverflow(i as u64),
                format!(
                    "topk_idx[{}][{}] names expert {} once more than allowed ({} times so \
                     far): an expert gets at most num_max_dispatch_tokens_per_rank = {n} \
                     rows from one PE, and a token that names an expert several times sends \
                     it a row each time",
                    i / k,
                    i % k,
                    idx[i].to_i64(),
                    n + 1
                ),
            );
        }
        None
    }

    fn poison_dispatch(&self, seq: u64, set: usize, code: u64) -> Result<()> {
        let sh = &self.sh;
        for d in (0..sh.n()).filter(|&d| !self.masked[d]) {
            sh.to_peer(self.pe, d, || {
                for le in 0..sh.l() {
                    let w = sh.layout.dispatch_count_word(set, le, sh.me);
                    sh.signal(self.pe, w, wire(tag(seq)) << 32 | code, d)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn send_dispatch<I: ExpertId>(
        &self,
        seq: u64,
        set: usize,
        x: &[bf16],
        idx: &[I],
    ) -> Result<()> {
        let sh = &*self.sh;
        let (cfg, lay) = (&sh.cfg, &sh.layout);
        let (k, h, l, r) = (cfg.num_topk, cfg.hidden, sh.l(), sh.n());
        let t_count = idx.len() / k;
        // Quantise each token once into the send area (only this PE writes it).
        for t in 0..t_count {
            let off = lay.dispatch_send_msg(set, t);
            // SAFETY: the message lies inside our mapping; only this PE touches its send
            // area, and no put reads it concurrently (puts below run after this loop).
            let msg = unsafe {
                std::slice::from_raw_parts_mut((sh.local + off) as *mut u8, lay.msg_bytes)
            };
            let row = &x[t * h..(t + 1) * h];
            msg[..4].copy_from_slice(&(t as i32).to_le_bytes());
            let body = &mut msg[layout::HEADER_BYTES..layout::HEADER_BYTES + lay.payload_bytes()];
            if cfg.use_fp8 {
                let (q, s) = body.split_at_mut(h);
                let mut scales = vec![0f32; h / fp8::GROUP];
                fp8::quantize_row(row, cfg.round_scale, q, &mut scales);
                for (d, v) in s.chunks_exact_mut(4).zip(&scales) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
            } else {
                for (d, v) in body.chunks_exact_mut(2).zip(row) {
                    d.copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
        }
        // Count per expert, then give each (dest, local expert) a block of slots in the
        // dest's receive area for this source, blocks in local-expert order.
        let mut cnt = vec![0u32; cfg.num_experts];
        for v in idx {
            let e = v.to_i64();
            if e >= 0 && !self.masked[e as usize / l] {
                cnt[e as usize] += 1;
            }
        }
        let mut next_slot = vec![0u32; cfg.num_experts];
        for d in 0..r {
            let mut at = 0;
            for le in 0..l {
                next_slot[d * l + le] = at;
                at += cnt[d * l + le];
            }
        }
        let mut by_dest: Vec<Vec<(u32, u32, u32)>> = vec![Vec::new(); r];
        for (i, v) in idx.iter().enumerate() {
            let e = v.to_i64();
            if e < 0 || self.masked[e as usize / l] {
                continue;
            }
            let e = e as usize;
            by_dest[e / l].push(((i / k) as u32, (i % k) as u32, next_slot[e]));
            next_slot[e] += 1;
        }
        let body_len = lay.payload_bytes();
        // Start with the next PE so that PEs do not all write to PE 0 first.
        for step in 0..r {
            let d = (sh.me + 1 + step) % r;
            if self.masked[d] {
                continue;
            }
            let dest = sh.members[d];
            // In shrink mode a PE that died is masked here and skipped (to_peer).
            sh.to_peer(self.pe, d, || {
                if let Some(peer) = sh.peer_main[d] {
                    // Direct: only the headers go to the receiver; it copies each payload
                    // straight from our send area into its output (one copy in all).
                    for &(t, kk, slot) in &by_dest[d] {
                        let to = peer + lay.dispatch_recv_msg(set, sh.me, slot as usize);
                        let hdr = (t as u64) | (kk as u64) << 32;
                        // SAFETY: the first 8 bytes of a message slot of ours in PE d's receive
                        // area, mapped here (p2p), 16-aligned; PE d reads it only after the
                        // count word below (Release), and no PE writes it meanwhile.
                        unsafe { (to as *mut u64).write(hdr.to_le()) };
                    }
                    for le in 0..l {
                        let w = lay.dispatch_count_word(set, le, sh.me);
                        let v = wire(tag(seq)) << 32 | DIRECT | cnt[d * l + le] as u64;
                        sh.signal(self.pe, w, v, d)?;
                    }
                    return Ok(());
                }
                for &(t, kk, slot) in &by_dest[d] {
                    let to = lay.dispatch_recv_msg(set, sh.me, slot as usize);
                    let mut hdr = [0u8; layout::HEADER_BYTES];
                    hdr[..4].copy_from_slice(&(t as i32).to_le_bytes());
                    hdr[4..8].copy_from_slice(&(kk as i32).to_le_bytes());
                    self.pe.put(sh.sym(to, hdr.len()), &hdr, dest)?;
                    let from = lay.dispatch_send_msg(set, t as usize) + layout::HEADER_BYTES;
                    // SAFETY: our own send area, written above and not written during the put.
                    let body = unsafe { sh.bytes(from, body_len) };
                    self.pe
                        .put(sh.sym(to + layout::HEADER_BYTES, body_len), body, dest)?;
                }
                // Release (in signal_op): the puts above are visible to whoever sees a count.
                for le in 0..l {
                    let w = lay.dispatch_count_word(set, le, sh.me);
                    sh.signal(self.pe, w, wire(tag(seq)) << 32 | cnt[d * l + le] as u64, d)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    // ------------------------------------------------------------ combine

    /// The zero-copy combine buffer of the next LL call, `[L, R*N, H]` bf16: write the
    /// expert outputs here (rows as dispatch delivered them) and call
    /// [`Buffer::low_latency_combine`] with `zero_copy = true` as the very next call.
    pub fn get_next_low_latency_combine_buffer(&mut self, handle: &Handle) -> Result<&mut [bf16]> {
        if handle.buffer_id != self.sh.id {
            return Err(Error::InvalidArgument(
                "get_next_low_latency_combine_buffer: the handle belongs to another buffer".into(),
            ));
        }
        let set = (self.seq % 2) as usize;
        if self.sh.peer_main.iter().any(|a| a.is_some()) {
            // With the direct path, peers read this set's combine_send while they receive
            // call seq - 2: wait until they all have, before the caller writes it.
            let pending = self.sh.pending[set].load(Ordering::Acquire);
            if pending != 0 {
                return Err(Error::InvalidArgument(format!(
                    "get_next_low_latency_combine_buffer: LL call #{} on buffer set {set} has \
                     not been received yet: call its receive hook first",
                    pending - 1
                )));
            }
            self.usable("get_next_low_latency_combine_buffer")?;
            self.sh.fold_shrunk(&mut self.masked);
            let seq = self.seq;
            self.sh
                .wait_credits(
                    self.pe,
                    seq,
                    self.first,
                    &mut self.masked,
                    "get_next_low_latency_combine_buffer",
                )
                .map_err(|e| self.sh.broke(seq, e))?;
        }
        let lay = &self.sh.layout;
        self.zero_copy_call = Some(self.seq);
        let off = lay.combine_send_row(set, 0, 0);
        let len = lay.combine_send.bytes / 2;
        // SAFETY: the combine send area of a set is written only by this PE (peers never
        // put there), the offset is 64-aligned (bf16 needs 2) and in bounds; the &mut
        // borrow of self keeps any other call from reading it meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut((self.sh.local + off) as *mut bf16, len) })
    }

    /// LL combine: `combined_x [T, H] = Σ_k topk_weights[t,k] * out(topk_idx[t,k], t)` over
    /// unmasked slots, in f32 in k order, rounded once to bf16. `expert_out [L, R*N, H]` is
    /// laid out as dispatch delivered it (ignored with `zero_copy`, when the outputs are in
    /// [`Buffer::get_next_low_latency_combine_buffer`]).
    pub fn low_latency_combine<I: ExpertId>(
        &mut self,
        expert_out: &[bf16],
        topk_idx: &[I],
        topk_weights: &[f32],
        handle: &Handle,
        return_recv_hook: bool,
        zero_copy: bool,
    ) -> Result<Combine<'p>> {
        // The zero-copy permission is used up by a call that starts, not by one that
        // start_call refuses here (a pending receive hook): its retry keeps it (before
        // 2026-12-07 the retry was poisoned as a wrong zero-copy buffer on every PE).
        let zc_ok = self.zero_copy_call == Some(self.seq);
        let (seq, set) = self.start_call("low_latency_combine")?;
        self.zero_copy_call = None;
        let sh = self.sh.clone();
        let (cfg, lay) = (&sh.cfg, &sh.layout);
        let (k, h, l, r) = (cfg.num_topk, cfg.hidden, sh.l(), sh.n());
        let rows = r * cfg.num_max_dispatch_tokens_per_rank;
        let t_count = handle.num_tokens;
        let bad = |f: Fault, m: String| {
            Some((
                f,
                Error::InvalidArgument(format!("low_latency_combine: {m}")),
            ))
        };
        let fault = if handle.buffer_id != sh.id {
            bad(Fault::Handle, "the handle belongs to another buffer".into())
        } else if topk_idx.len() != t_count * k || topk_weights.len() != t_count * k {
            bad(
                Fault::Shape,
                format!(
                    "topk_idx ({}) and topk_weights ({}) must have T*K = {t_count}*{k} entries \
                     (T of the dispatch)",
                    topk_idx.len(),
                    topk_weights.len()
                ),
            )
        } else if zero_copy && !zc_ok {
            bad(
                Fault::Handle,
                "zero_copy: get_next_low_latency_combine_buffer was not called right before \
                 this call"
                    .into(),
            )
        } else if !zero_copy && expert_out.len() != l * rows * h {
            bad(
                Fault::Shape,
                format!(
                    "expert_out has {} values, expected L*R*N*H = {l}*{rows}*{h}",
                    expert_out.len()
                ),
            )
        } else if let Some(i) = first_bad_id(topk_idx, cfg.num_experts) {
            bad(
                Fault::BadExpert(i as u64),
                format!(
                    "topk_idx[{}][{}] is outside [-1, {})",
                    i / k,
                    i % k,
                    cfg.num_experts
                ),
            )
        } else if routing_hash(topk_idx) != handle.routing {
            bad(
                Fault::Routing,
                "topk_idx differs from the one this PE dispatched with (combine needs the \
                 dispatch's topk_idx; -1 entries included)"
                    .into(),
            )
        } else {
            None
        };
        let masked = self.masked.clone();
        // This PE's own rows, without a hook and without zero copy, are summed straight from
        // `expert_out` (borrowed until this call returns, which is after the sum): copying
        // them into our own combine_recv first moved 1/R of the rows twice for nothing.
        let own_in_place = !return_recv_hook && !zero_copy && fault.is_none();
        let sent: Result<()> = (|| {
            for step in 0..r {
                let s = (sh.me + 1 + step) % r;
                if masked[s] {
                    continue;
                }
                if s == sh.me && own_in_place {
                    let mut own_rows = 0u64;
                    for le in 0..l {
                        own_rows += handle.layout_range[le * r + s] as u64 & 0xffff_ffff;
                    }
                    // Our own flag, set as for any owner so that the receive checks the
                    // count and handle mark the same way; no data behind it to publish.
                    // Through to_peer like every other step: a signal (even to this PE)
                    // reports an untolerated death, which shrink mode masks and goes on.
                    sh.to_peer(self.pe, s, || {
                        sh.signal(
                            self.pe,
                            lay.combine_flag_word(set, sh.me),
                            wire(tag(seq)) << 32 | own_rows | handle_mark(handle.call),
                            s,
                        )
                    })?;
                    continue;
                }
                // In shrink mode a PE that died is masked here and skipped (to_peer).
                sh.to_peer(self.pe, s, || {
                    let low = match &fault {
                        Some((f, _)) => f.encode(),
                        // Direct (read by the source) only with zero copy: without it the rows
                        // must be copied once anyway, and streaming them into the source's
                        // combine_recv (below), where its sum reads them sequentially, measured
                        // as fast or faster than copying them into our combine_send for the
                        // source to read (A/B, 2026-12-02 15:53 UTC, docs/ep.md).
                        None if zero_copy && sh.peer_main[s].is_some() => {
                            let Some(pull) = sh.peer_pull[s] else {
                                unreachable!("peer_main and peer_pull are set together")
                            };
                            let mut rows_for_s = 0u64;
                            for le in 0..l {
                                let lr = handle.layout_range[le * r + s];
                                let (begin, count) =
                                    ((lr >> 32) as usize, (lr & 0xffff_ffff) as usize);
                                let word = pull + lay.pull_range_word(set, sh.me, le);
                                // SAFETY: an 8-aligned word of PE s's pull area, mapped here
                                // (p2p); only this PE writes it, and PE s reads it after the
                                // flag. Relaxed: the flag's Release store below orders it.
                                unsafe {
                                    AtomicU64::from_ptr(word as *mut u64).store(
                                        (begin as u64) << 32 | count as u64,
                                        Ordering::Relaxed,
                                    )
                                };
                                rows_for_s += count as u64;
                            }
                            rows_for_s | DIRECT | handle_mark(handle.call)
                        }
                        None => {
                            let mut sent_rows = 0u64;
                            // Node-local peer without zero copy: the rows are copied straight
                            // into its combine_recv with streaming stores (no read of the
                            // destination lines, no eviction of ours): combine 14.5-15.4 ms ->
                            // 10.8-12.7 ms at 4 PEs, H=7168, K=8 (docs/ep.md, 15:53 UTC).
                            let stream_to = sh.peer_main[s].filter(|_| !zero_copy);
                            for le in 0..l {
                                let lr = handle.layout_range[le * r + s];
                                let (begin, count) =
                                    ((lr >> 32) as usize, (lr & 0xffff_ffff) as usize);
                                for j in begin..begin + count {
                                    let row = le * rows + j;
                                    let (t, kk) =
                                        (handle.src_info[row] as usize, handle.row_k[row] as usize);
                                    let recv_row = lay.combine_recv_row(set, t, kk);
                                    if let Some(peer) = stream_to {
                                        let src = bf16_bits(&expert_out[row * h..(row + 1) * h]);
                                        // SAFETY: a row of PE s's combine_recv (this set, token t,
                                        // slot kk: t < N and kk < K were checked when the dispatch
                                        // received the row, and a Handle cannot be changed after,
                                        // so in bounds by the layout), mapped here (p2p);
                                        // PE s reads it only after our flag below, and no longer
                                        // for call seq - 2 (start_call waited for its credit).
                                        unsafe {
                                            reduce::copy_streaming(
                                                (peer + recv_row) as *mut u8,
                                                src.as_ptr().cast(),
                                                h * 2,
                                            )
                                        };
                                    } else if zero_copy {
                                        // SAFETY: our own combine send area; only this PE
                                        // writes it and the caller's borrow has ended.
                                        let src = unsafe {
                                            sh.bytes(lay.combine_send_row(set, le, j), h * 2)
                                        };
                                        self.pe.put(sh.sym(recv_row, h * 2), src, sh.members[s])?;
                                    } else {
                                        let src = &expert_out[row * h..(row + 1) * h];
                                        let to = sh.sym(recv_row, h * 2).cast::<u16>();
                                        self.pe.put(to, bf16_bits(src), sh.members[s])?;
                                    }
                                    sent_rows += 1;
                                }
                            }
                            if stream_to.is_some() {
                                // The streaming stores are weakly ordered: drain them before
                                // the flag's Release store below publishes the rows.
                                reduce::store_fence();
                            }
                            sent_rows | handle_mark(handle.call)
                        }
                    };
                    sh.signal(
                        self.pe,
                        lay.combine_flag_word(set, sh.me),
                        wire(tag(seq)) << 32 | low,
                        s,
                    )
                })?;
            }
            Ok(())
        })();
        sent.map_err(|e| self.sh.broke(seq, e))?;
        let hook = CombineHook {
            pe: self.pe,
            sh: self.sh.clone(),
            seq,
            masked,
            topk_idx: topk_idx.iter().map(|v| v.to_i64()).collect(),
            topk_weights: topk_weights.to_vec(),
            num_tokens: t_count,
            handle_call: handle.call,
            fault: fault.map(|(_, e)| e),
            received: false,
        };
        if return_recv_hook {
            Ok(Combine::Pending(hook))
        } else {
            let mut hook = hook;
            hook.received = true;
            let own = own_in_place.then_some(OwnRows {
                expert_out,
                layout_range: &handle.layout_range,
            });
            hook.receive(own).map(Combine::Received)
        }
    }
}

fn bf16_bits(v: &[bf16]) -> &[u16] {
    // SAFETY: bf16 is a repr(transparent) u16.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u16>(), v.len()) }
}

/// The result of a dispatch: received, or waiting for its receive hook.
pub enum Dispatch<'p> {
    Received(DispatchOutput),
    Pending(DispatchHook<'p>),
}

impl<'p> Dispatch<'p> {
    /// The output, running the receive hook first if there is one.
    pub fn wait(self) -> Result<DispatchOutput> {
        match self {
            Dispatch::Received(o) => Ok(o),
            Dispatch::Pending(h) => h.recv(),
        }
    }
}

/// The receive half of a dispatch issued with `return_recv_hook`.
#[must_use = "the call's buffer set stays busy until the hook has received"]
pub struct DispatchHook<'p> {
    pe: &'p Pe,
    sh: Arc<Shared>,
    seq: u64,
    masked: Vec<bool>,
    num_tokens: usize,
    /// [`routing_hash`] of this PE's `topk_idx`, which combine must pass again.
    routing: u64,
    fault: Option<Error>,
    /// `recv` ran (or the drop did it): nothing is left for the drop to do.
    received: bool,
}

impl DispatchHook<'_> {
    /// LL call number of the dispatch.
    pub fn call(&self) -> u64 {
        self.seq
    }

    /// Waits for every unmasked PE's tokens and unpacks them (blocks in arrival order).
    pub fn recv(mut self) -> Result<DispatchOutput> {
        self.received = true;
        self.receive()
    }

    fn receive(&mut self) -> Result<DispatchOutput> {
        let sh = &*self.sh;
        let _active = sh.enter("low_latency_dispatch", self.seq)?;
        let (cfg, lay) = (&sh.cfg, &sh.layout);
        let (h, l, r) = (cfg.hidden, sh.l(), sh.n());
        let rows = r * cfg.num_max_dispatch_tokens_per_rank;
        let n_max = cfg.num_max_dispatch_tokens_per_rank;
        let set = (self.seq % 2) as usize;
        let want = wire(tag(self.seq));
        let pooled = sh.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut recv_x = match pooled {
            Some(x) => x,
            None if cfg.use_fp8 => RecvX::Fp8 {
                data: vec![0u8; l * rows * h],
                scales: vec![0f32; l * rows * (h / fp8::GROUP)],
            },
            None => RecvX::Bf16(vec![bf16::ZERO; l * rows * h]),
        };
        let mut src_info = vec![0i32; l * rows];
        let mut row_k = vec![0i32; l * rows];
        let mut layout_range = vec![0i64; l * r];
        let mut fill = vec![0usize; l];
        let mut next_le = vec![0usize; r];
        let mut slot = vec![0usize; r];
        let mut peer_fault: Option<(usize, u64)> = None;
        let mut corrupt: Option<String> = None;
        let mut masked = self.masked.clone();
        let start = Instant::now();
        sh.wait_shrinking(self.pe, &mut masked, |masked, grace| {
            for (s, next) in next_le.iter_mut().enumerate() {
                if masked[s] {
                    *next = l;
                }
            }
            poll_or_look(
                self.pe,
                grace,
                || {
                    let mut missing = None;
                    for s in 0..r {
                        while next_le[s] < l {
                            let le = next_le[s];
                            let w = sh.load(lay.dispatch_count_word(set, le, s));
                            if w >> 32 != want {
                                missing.get_or_insert((s, le, w));
                                break;
                            }
                            let low = w & 0xffff_ffff;
                            let mut count = (low & COUNT_MASK) as usize;
                            let mut from_peer = None;
                            if low & POISON != 0 {
                                peer_fault.get_or_insert((s, low));
                                count = 0;
                            } else if low & DIRECT != 0 {
                                from_peer = sh.peer_main[s];
                                if from_peer.is_none() {
                                    corrupt.get_or_insert(format!(
                                        "PE {} left its tokens for PE {} to read, but its memory \
                                     is not mapped here (both must use the same \
                                     RSHMEM_EP_PATH and transport)",
                                        sh.members[s], sh.members[sh.me]
                                    ));
                                    count = 0;
                                }
                            } else if sh.peer_main[s].is_some() {
                                corrupt.get_or_insert(format!(
                                "PE {} put its tokens although PE {} reads them directly (both \
                                 must use the same RSHMEM_EP_PATH and transport)",
                                sh.members[s], sh.members[sh.me]
                            ));
                                count = 0;
                            }
                            if slot[s] + count > lay.slots_per_src || fill[le] + count > rows {
                                corrupt.get_or_insert(format!(
                                    "PE {} announced {count} tokens for local expert {le} beyond \
                                 its receive area",
                                    sh.members[s]
                                ));
                                count = 0;
                            }
                            let begin = fill[le];
                            for i in 0..count {
                                let m = lay.dispatch_recv_msg(set, s, slot[s] + i);
                                // SAFETY: the sender put this message before the count word
                                // observed above (Acquire); nobody writes it again until we
                                // release the set.
                                let msg = unsafe { sh.bytes(m, lay.msg_bytes) };
                                let row = le * rows + begin + i;
                                let tok = i32::from_le_bytes([msg[0], msg[1], msg[2], msg[3]]);
                                let kk = i32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]);
                                src_info[row] = tok;
                                row_k[row] = kk;
                                // Combine writes this row back at (tok, kk) in the source's
                                // receive area: both must be in range, whichever path.
                                if tok < 0
                                    || tok as usize >= n_max
                                    || kk < 0
                                    || kk as usize >= sh.cfg.num_topk
                                {
                                    corrupt.get_or_insert(format!(
                                        "PE {} sent token index {tok}, top-k slot {kk} (N = \
                                         {n_max}, K = {})",
                                        sh.members[s], sh.cfg.num_topk
                                    ));
                                    src_info[row] = 0;
                                    row_k[row] = 0;
                                    continue;
                                }
                                let body = match from_peer {
                                    None => &msg[layout::HEADER_BYTES..],
                                    Some(peer) => {
                                        let at = peer
                                            + lay.dispatch_send_msg(set, tok as usize)
                                            + layout::HEADER_BYTES;
                                        // SAFETY: the payload of token `tok` (< N, checked) in
                                        // PE s's send area of this set, mapped here (p2p). PE s
                                        // wrote it before its count word (observed with
                                        // Acquire) and does not write it again before every
                                        // PE's credit for this call (sent after this loop).
                                        unsafe {
                                            std::slice::from_raw_parts(
                                                at as *const u8,
                                                lay.payload_bytes(),
                                            )
                                        }
                                    }
                                };
                                match &mut recv_x {
                                    RecvX::Fp8 { data, scales } => {
                                        data[row * h..(row + 1) * h].copy_from_slice(&body[..h]);
                                        let g = h / fp8::GROUP;
                                        for (d, c) in scales[row * g..(row + 1) * g]
                                            .iter_mut()
                                            .zip(body[h..h + 4 * g].chunks_exact(4))
                                        {
                                            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                                        }
                                    }
                                    RecvX::Bf16(v) => {
                                        for (d, c) in v[row * h..(row + 1) * h]
                                            .iter_mut()
                                            .zip(body[..2 * h].chunks_exact(2))
                                        {
                                            *d = bf16::from_bits(u16::from_le_bytes([c[0], c[1]]));
                                        }
                                    }
                                }
                            }
                            layout_range[le * r + s] = ((begin as i64) << 32) | count as i64;
                            fill[le] += count;
                            slot[s] += count;
                            next_le[s] += 1;
                        }
                    }
                    match missing {
                        None => Ok(()),
                        Some(m) => Err(m),
                    }
                },
                |&(s, le, w)| Error::EpTimeout {
                    pe: self.pe.my_pe(),
                    op: "low_latency_dispatch",
                    call: self.seq,
                    peer: sh.members[s],
                    expert: Some(sh.me * l + le),
                    what: format!(
                    "its token count for expert {} (local expert {le} of PE {}); the count word \
                     holds {w:#x}, expected tag {want}{}",
                    sh.me * l + le,
                    sh.members[sh.me],
                    sh.other_kind_hint("low_latency_dispatch", set, s, want)
                ),
                    waited_ms: start.elapsed().as_millis() as u64,
                },
            )
        })
        .map_err(|e| sh.broke(self.seq, e))?;
        sh.release(self.pe, self.seq, &masked)
            .map_err(|e| sh.broke(self.seq, e))?;
        if let Some(e) = self.fault.take() {
            return Err(e);
        }
        if let Some((s, low)) = peer_fault {
            return Err(Error::EpPeerFailed {
                pe: self.pe.my_pe(),
                op: "low_latency_dispatch",
                call: self.seq,
                peer: sh.members[s],
                reason: Fault::describe(low, cfg),
            });
        }
        if let Some(c) = corrupt {
            return Err(Error::Verification(format!("low_latency_dispatch: {c}")));
        }
        let recv_count: Vec<i32> = fill.iter().map(|&f| f as i32).collect();
        Ok(DispatchOutput {
            recv_x,
            recv_count: recv_count.clone(),
            src_info: src_info.clone(),
            layout_range: layout_range.clone(),
            handle: Handle {
                buffer_id: sh.id,
                call: self.seq,
                num_tokens: self.num_tokens,
                num_max_dispatch_tokens_per_rank: cfg.num_max_dispatch_tokens_per_rank,
                hidden: h,
                num_experts: cfg.num_experts,
                src_info,
                layout_range,
                recv_count,
                row_k,
                routing: self.routing,
            },
        })
    }
}

/// What dropping a receive hook that never ran does: outside a panic, it receives and
/// discards the data (a wait bounded by the PE's timeout), so the buffer set is released
/// and the peers get this PE's credit, as if `recv` had run; during a panic it marks the
/// buffer broken (its later calls say why) rather than wait.
fn drop_unreceived<T>(sh: &Shared, seq: u64, op: &str, receive: impl FnOnce() -> Result<T>) {
    if sh.destroyed.load(Ordering::Acquire)
        || sh
            .broken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    {
        return; // its memory is gone, or the buffer refuses every later call anyway
    }
    if std::thread::panicking() {
        let _ = sh.broke(
            seq,
            Error::InvalidArgument(format!(
                "the receive hook of {op} (LL call #{seq}) was dropped during a panic \
                 without receiving"
            )),
        );
    } else {
        let _ = receive();
    }
}

impl Drop for DispatchHook<'_> {
    fn drop(&mut self) {
        if !std::mem::replace(&mut self.received, true) {
            let (sh, seq) = (self.sh.clone(), self.seq);
            drop_unreceived(&sh, seq, "low_latency_dispatch", || self.receive());
        }
    }
}

impl Drop for CombineHook<'_> {
    fn drop(&mut self) {
        if !std::mem::replace(&mut self.received, true) {
            let (sh, seq) = (self.sh.clone(), self.seq);
            drop_unreceived(&sh, seq, "low_latency_combine", || self.receive(None));
        }
    }
}

/// The result of a combine: received, or waiting for its receive hook.
pub enum Combine<'p> {
    Received(Vec<bf16>),
    Pending(CombineHook<'p>),
}

impl<'p> Combine<'p> {
    /// `combined_x [T, H]`, running the receive hook first if there is one.
    pub fn wait(self) -> Result<Vec<bf16>> {
        match self {
            Combine::Received(o) => Ok(o),
            Combine::Pending(h) => h.recv(),
        }
    }
}

/// A combine's own rows in the caller's `expert_out` (`[L, R*N, H]`) and the dispatch
/// handle's `layout_range` that says where this PE's block of each local expert starts.
struct OwnRows<'a> {
    expert_out: &'a [bf16],
    layout_range: &'a [i64],
}

/// The receive half of a combine issued with `return_recv_hook`.
#[must_use = "the call's buffer set stays busy until the hook has received"]
pub struct CombineHook<'p> {
    pe: &'p Pe,
    sh: Arc<Shared>,
    seq: u64,
    masked: Vec<bool>,
    topk_idx: Vec<i64>,
    topk_weights: Vec<f32>,
    num_tokens: usize,
    /// LL call number of the dispatch whose handle this PE passed.
    handle_call: u64,
    fault: Option<Error>,
    /// As [`DispatchHook`]'s.
    received: bool,
}

impl CombineHook<'_> {
    /// LL call number of the combine.
    pub fn call(&self) -> u64 {
        self.seq
    }

    /// Waits for every unmasked expert owner's rows, then reduces.
    pub fn recv(mut self) -> Result<Vec<bf16>> {
        self.received = true;
        self.receive(None)
    }

    /// `own`: this PE's rows are read from the caller's `expert_out` (no hook, no zero
    /// copy: the combine did not copy them into our combine_recv).
    fn receive(&mut self, own: Option<OwnRows<'_>>) -> Result<Vec<bf16>> {
        let sh = &*self.sh;
        let _active = sh.enter("low_latency_combine", self.seq)?;
        let (cfg, lay) = (&sh.cfg, &sh.layout);
        let (h, k, l, r) = (cfg.hidden, cfg.num_topk, sh.l(), sh.n());
        let set = (self.seq % 2) as usize;
        let want = wire(tag(self.seq));
        let mut masked = self.masked.clone();
        let start = Instant::now();
        let flags = sh
            .wait_shrinking(self.pe, &mut masked, |masked, grace| {
                poll_or_look(
                    self.pe,
                    grace,
                    || {
                        let mut got = vec![0u64; r];
                        for p in (0..r).filter(|&p| !masked[p]) {
                            let w = sh.load(lay.combine_flag_word(set, p));
                            if w >> 32 != want {
                                return Err((p, w));
                            }
                            got[p] = w & 0xffff_ffff;
                        }
                        Ok(got)
                    },
                    |&(p, w)| Error::EpTimeout {
                        pe: self.pe.my_pe(),
                        op: "low_latency_combine",
                        call: self.seq,
                        peer: sh.members[p],
                        expert: None,
                        what: format!(
                        "the expert outputs of its experts {}..{}; the flag word holds {w:#x}, \
                     expected tag {want}{}",
                        p * l,
                        (p + 1) * l,
                        sh.other_kind_hint("low_latency_combine", set, p, want)
                    ),
                        waited_ms: start.elapsed().as_millis() as u64,
                    },
                )
            })
            .map_err(|e| sh.broke(self.seq, e))?;
        let owner_ok = |e: i64| e >= 0 && (e as usize) < cfg.num_experts && !masked[e as usize / l];
        let mut expected = vec![0u64; r];
        if self.fault.is_none() {
            for &e in &self.topk_idx {
                if owner_ok(e) {
                    expected[e as usize / l] += 1;
                }
            }
        }
        let mut out = vec![bf16::ZERO; self.num_tokens * h];
        let mut problem: Option<Error> = self.fault.take();
        // Direct owners: where this PE's block of each of their experts starts.
        let mut begin = vec![usize::MAX; cfg.num_experts];
        for p in (0..r).filter(|&p| !masked[p]) {
            let low = flags[p];
            if problem.is_some() {
                break;
            }
            if low & POISON != 0 {
                problem = Some(Error::EpPeerFailed {
                    pe: self.pe.my_pe(),
                    op: "low_latency_combine",
                    call: self.seq,
                    peer: sh.members[p],
                    reason: Fault::describe(low, cfg),
                });
            } else if low & (HANDLE_BITS << HANDLE_SHIFT) != handle_mark(self.handle_call) {
                problem = Some(Error::InvalidArgument(format!(
                    "low_latency_combine: PE {} combined with the handle of another dispatch \
                     (LL call {} mod 64) than PE {} (call {}, {} mod 64): every PE must pass \
                     the handle of the same dispatch",
                    sh.members[p],
                    (low >> HANDLE_SHIFT) & HANDLE_BITS,
                    self.pe.my_pe(),
                    self.handle_call,
                    self.handle_call & HANDLE_BITS
                )));
            } else if low & COUNT_MASK != expected[p] {
                problem = Some(Error::InvalidArgument(format!(
                    "low_latency_combine: PE {} returned {} rows to PE {} but its topk_idx \
                     routes {} there: pass the same topk_idx and mask as to the dispatch",
                    sh.members[p],
                    low & COUNT_MASK,
                    self.pe.my_pe(),
                    expected[p]
                )));
            } else if p == sh.me && own.is_some() {
                let Some(own) = &own else { unreachable!() };
                let mut want = vec![0usize; l];
                for &e in &self.topk_idx {
                    if e >= 0 && e as usize / l == p {
                        want[e as usize % l] += 1;
                    }
                }
                for (le, &n_want) in want.iter().enumerate() {
                    let lr = own.layout_range[le * r + p];
                    let (b, c) = ((lr >> 32) as usize, (lr & 0xffff_ffff) as usize);
                    // The handle's routing hash matched topk_idx, so this holds unless the
                    // hash collided; checked because the sum below indexes expert_out by it.
                    if c != n_want || b + c > r * cfg.num_max_dispatch_tokens_per_rank {
                        problem.get_or_insert(Error::InvalidArgument(format!(
                            "low_latency_combine: the handle holds {c} rows of this PE for \
                             expert {} (from row {b}) but topk_idx routes {n_want} there: \
                             pass the dispatch's topk_idx",
                            p * l + le
                        )));
                    }
                    begin[p * l + le] = b;
                }
            } else if low & DIRECT != 0 {
                if sh.peer_main[p].is_none() {
                    problem = Some(Error::Verification(format!(
                        "low_latency_combine: PE {} left its rows for PE {} to read, but its \
                         memory is not mapped here (both must use the same RSHMEM_EP_PATH \
                         and transport)",
                        sh.members[p],
                        self.pe.my_pe()
                    )));
                    continue;
                }
                let mut want = vec![0usize; l];
                for &e in &self.topk_idx {
                    if e >= 0 && e as usize / l == p {
                        want[e as usize % l] += 1;
                    }
                }
                for (le, &n_want) in want.iter().enumerate() {
                    let w = sh.load_pull(lay.pull_range_word(set, p, le));
                    let (b, c) = ((w >> 32) as usize, (w & 0xffff_ffff) as usize);
                    if c != n_want || b + c > r * cfg.num_max_dispatch_tokens_per_rank {
                        problem.get_or_insert(Error::InvalidArgument(format!(
                            "low_latency_combine: PE {} holds {c} rows from PE {} for expert \
                             {} (from row {b}) but this PE's topk_idx routes {n_want} there: \
                             pass the same topk_idx and mask as to the dispatch",
                            sh.members[p],
                            self.pe.my_pe(),
                            p * l + le
                        )));
                    }
                    begin[p * l + le] = b;
                }
            }
        }
        if problem.is_none() {
            let direct = |p: usize| flags[p] & DIRECT != 0;
            let rows_per_expert = r * cfg.num_max_dispatch_tokens_per_rank;
            let mut next = vec![0usize; cfg.num_experts];
            let mut rows: Vec<&[u16]> = Vec::with_capacity(k);
            let mut weights: Vec<f32> = Vec::with_capacity(k);
            for t in 0..self.num_tokens {
                rows.clear();
                weights.clear();
                for kk in 0..k {
                    let e = self.topk_idx[t * k + kk];
                    if !owner_ok(e) {
                        continue;
                    }
                    let e = e as usize;
                    let (p, le) = (e / l, e % l);
                    let w = self.topk_weights[t * k + kk];
                    let addr = if let (true, Some(own)) = (p == sh.me, &own) {
                        // Our own block of expert e in expert_out, in token order as the
                        // dispatch received it (its rows sit at le * R*N + begin ..).
                        let j = begin[e] + next[e];
                        next[e] += 1;
                        own.expert_out[(le * rows_per_expert + j) * h..].as_ptr() as usize
                    } else if direct(p) {
                        // Rows of one (expert, source) block are in this PE's token order,
                        // as dispatch sent them.
                        let j = begin[e] + next[e];
                        next[e] += 1;
                        sh.peer_main[p].unwrap_or(0) + lay.combine_send_row(set, le, j)
                    } else {
                        sh.local + lay.combine_recv_row(set, t, kk)
                    };
                    // SAFETY: a row of H bf16 in a mapped allocation: the owner's
                    // combine_send row of this token (direct; in bounds, checked against
                    // the published range above), our combine_recv row, or a row of the
                    // caller's expert_out (own rows: in bounds by the handle's range checked
                    // above and expert_out's length checked at the call; borrowed for this
                    // whole call). The owner wrote or put a mapped row before its flag
                    // (observed with Acquire above) and does not write it again until we
                    // release the set. Mapped rows are 64-byte aligned (H*2-byte rows from a
                    // 64-aligned region start) and expert_out is a bf16 slice, so u16 is
                    // aligned.
                    let row = unsafe { std::slice::from_raw_parts(addr as *const u16, h) };
                    rows.push(row);
                    weights.push(w);
                }
                // In k order, f32, rounded once: bit-identical to the GPU kernels' sum.
                reduce::weighted_sum_to_bf16(&mut out[t * h..(t + 1) * h], &rows, &weights);
            }
        }
        sh.release(self.pe, self.seq, &masked)
            .map_err(|e| sh.broke(self.seq, e))?;
        match problem {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_words_describe_what_they_carry() {
        let cfg = Config {
            num_max_dispatch_tokens_per_rank: 128,
            hidden: 7168,
            num_experts: 32,
            num_topk: 8,
            use_fp8: true,
            round_scale: false,
        };
        let d = |f: Fault| Fault::describe(f.encode() & 0xffff_ffff, &cfg);
        assert_eq!(
            d(Fault::TooManyTokens(200)),
            "it passed 200 tokens, more than num_max_dispatch_tokens_per_rank = 128"
        );
        // Past 24 bits the count is capped, and says so.
        assert_eq!(
            d(Fault::TooManyTokens(1 << 30)),
            "it passed at least 16777215 tokens, more than num_max_dispatch_tokens_per_rank = 128"
        );
        assert_eq!(
            d(Fault::BadExpert(8 * 3 + 5)),
            "its topk_idx[3][5] is outside [-1, 32)"
        );
        // The GPU kernels' EP_FAULT_DISPATCH_HEADER (no CPU Fault makes it).
        assert!(Fault::describe((POISON | 7 << 24) & 0xffff_ffff, &cfg)
            .starts_with("the dispatch of its handle received a corrupt message there"));
        assert_eq!(wire(1), 1);
        assert_eq!(wire(0xffff_ffff), 0xffff_ffff);
        assert_eq!(wire(1 << 32), 1);
        assert_eq!(wire((1 << 32) + 1), 2);
    }
}
