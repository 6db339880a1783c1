//! The one type that computes every offset of the EP buffers and their total size
//! (DeepEP's `LowLatencyLayout`). The CPU path and (later) the GPU kernels address the
//! symmetric allocation only through it.
//!
//! One allocation holds two *buffer sets*; LL call number `seq` (dispatch or combine, in
//! the order every PE calls them) uses set `seq % 2`, so two calls can be in flight.
//! A set holds, each region 64-byte aligned:
//!
//! | region | shape | written by |
//! |---|---|---|
//! | `dispatch_count` | u64 `[L][R]`: `tag << 32 \| count` per (local expert, source PE) | the source PE |
//! | `combine_flag` | u64 `[R]`: `tag << 32 \| rows` per expert-owning PE | the expert owner |
//! | `credit` | u64 `[R]`: `tag` = "PE p finished receiving this set's call" | PE p |
//! | `dispatch_send` | `N` messages | this PE (quantised tokens) |
//! | `dispatch_recv` | `[R][N * min(K, L)]` messages, packed per source by local expert | source PEs |
//! | `combine_send` | bf16 `[L][R*N][H]`: the zero-copy combine buffer | this PE / the caller |
//! | `combine_recv` | bf16 `[N][K][H]`: one row per (token, top-k slot) | expert owners |
//!
//! A message is a 16-byte header (token index i32, top-k slot i32, 8 reserved bytes)
//! followed by the payload: H bf16, or H e4m3 bytes and H/128 f32 scales; rounded up to
//! 16 bytes.
//!
//! Why it is smaller than DeepEP's: a source PE sends at most `N * min(K, L)` messages to
//! one PE (each token once per selected expert, at most min(K, L) of that PE's experts),
//! and packs them itself by local expert, so the receive area is `R * N * min(K, L)`
//! messages instead of `E * N`; and combine results land in one row per (token, slot)
//! (`N * K` rows) instead of `E * N`.
use crate::ep::Config;
use crate::error::{Error, Result};

/// Byte alignment of every region.
pub const REGION_ALIGN: usize = 64;
/// Bytes of a message header.
pub const HEADER_BYTES: usize = 16;

/// A byte range inside one buffer set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub offset: usize,
    pub bytes: usize,
}

/// Offsets and sizes of the EP buffers for one configuration and team size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub num_pes: usize,
    pub num_local_experts: usize,
    pub num_max_tokens: usize,
    pub hidden: usize,
    pub num_topk: usize,
    pub use_fp8: bool,
    /// Bytes of one dispatch message (header + payload [+ scales]).
    pub msg_bytes: usize,
    /// Message slots per source PE in `dispatch_recv`: `N * min(K, L)`.
    pub slots_per_src: usize,
    pub dispatch_count: Region,
    pub combine_flag: Region,
    pub credit: Region,
    pub dispatch_send: Region,
    pub dispatch_recv: Region,
    pub combine_send: Region,
    pub combine_recv: Region,
    /// Bytes of one buffer set.
    pub set_bytes: usize,
    /// Bytes of the whole allocation (two sets).
    pub total_bytes: usize,
}

impl Layout {
    /// The layout for `cfg` on a team of `num_pes` PEs (the config must be valid for it).
    pub fn new(cfg: &Config, num_pes: usize) -> Result<Layout> {
        cfg.validate(num_pes)?;
        let r = num_pes;
        let l = cfg.num_experts / r;
        let n = cfg.num_max_dispatch_tokens_per_rank;
        let h = cfg.hidden;
        let k = cfg.num_topk;
        let slots_per_src = n * k.min(l);
        let overflow = || {
            Error::InvalidArgument(format!(
                "ep::Layout: the buffers for {cfg:?} on {num_pes} PEs overflow the address space"
            ))
        };
        // Checked: `hidden` is bounded only by the address space (a release build would
        // wrap `h * 2` to a tiny layout).
        let row_bf16 = h.checked_mul(2).ok_or_else(overflow)?;
        let payload = if cfg.use_fp8 {
            h.checked_add(h / 128 * 4)
        } else {
            Some(row_bf16)
        };
        let msg_bytes = payload
            .and_then(|p| p.checked_add(HEADER_BYTES + 15))
            .ok_or_else(overflow)?
            / 16
            * 16;
        let mut at = 0usize;
        let mut region = |bytes: Option<usize>| -> Result<Region> {
            let bytes = bytes.ok_or_else(overflow)?;
            let r = Region { offset: at, bytes };
            // Checked twice: a region ending within REGION_ALIGN of the top of the
            // address space passes the add but wraps when rounded up (a release build then
            // gave a layout of 0 bytes whose regions lie past its end).
            at = at
                .checked_add(bytes)
                .and_then(|e| e.checked_next_multiple_of(REGION_ALIGN))
                .ok_or_else(overflow)?;
            Ok(r)
        };
        let dispatch_count = region(l.checked_mul(r).and_then(|x| x.checked_mul(8)))?;
        let combine_flag = region(r.checked_mul(8))?;
        let credit = region(r.checked_mul(8))?;
        let dispatch_send = region(n.checked_mul(msg_bytes))?;
        let dispatch_recv = region(
            r.checked_mul(slots_per_src)
                .and_then(|s| s.checked_mul(msg_bytes)),
        )?;
        let combine_send = region(
            l.checked_mul(r)
                .and_then(|x| x.checked_mul(n))
                .and_then(|x| x.checked_mul(row_bf16)),
        )?;
        let combine_recv = region(n.checked_mul(k).and_then(|x| x.checked_mul(row_bf16)))?;
        let set_bytes = at;
        // Two sets, and room for the pull area after them (alloc_hint's sum, whose parts
        // are smaller than a set each).
        let total_bytes = set_bytes
            .checked_mul(2)
            .filter(|t| t.checked_add(set_bytes.saturating_mul(2)).is_some())
            .ok_or_else(overflow)?;
        Ok(Layout {
            num_pes,
            num_local_experts: l,
            num_max_tokens: n,
            hidden: h,
            num_topk: k,
            use_fp8: cfg.use_fp8,
            msg_bytes,
            slots_per_src,
            dispatch_count,
            combine_flag,
            credit,
            dispatch_send,
            dispatch_recv,
            combine_send,
            combine_recv,
            set_bytes,
            total_bytes,
        })
    }

    /// Bytes of symmetric memory an [`crate::ep::Buffer`] allocates for `cfg` on a team of
    /// `num_pes` PEs.
    pub fn size_hint(cfg: &Config, num_pes: usize) -> Result<usize> {
        Ok(Layout::new(cfg, num_pes)?.total_bytes)
    }

    fn set(&self, set: usize) -> usize {
        debug_assert!(set < 2);
        set * self.set_bytes
    }
    /// Signal word of (local expert `le`, source PE `src`) in `set`.
    pub fn dispatch_count_word(&self, set: usize, le: usize, src: usize) -> usize {
        self.set(set) + self.dispatch_count.offset + (le * self.num_pes + src) * 8
    }
    /// Combine arrival word written by expert-owning PE `src`.
    pub fn combine_flag_word(&self, set: usize, src: usize) -> usize {
        self.set(set) + self.combine_flag.offset + src * 8
    }
    /// Credit word written by PE `pe` when it finished receiving `set`'s call.
    pub fn credit_word(&self, set: usize, pe: usize) -> usize {
        self.set(set) + self.credit.offset + pe * 8
    }
    /// Message of token `t` in the dispatch send area.
    pub fn dispatch_send_msg(&self, set: usize, t: usize) -> usize {
        self.set(set) + self.dispatch_send.offset + t * self.msg_bytes
    }
    /// Message slot `slot` of source PE `src` in the dispatch receive area.
    pub fn dispatch_recv_msg(&self, set: usize, src: usize, slot: usize) -> usize {
        self.set(set)
            + self.dispatch_recv.offset
            + (src * self.slots_per_src + slot) * self.msg_bytes
    }
    /// Row `row` of local expert `le` in the zero-copy combine send buffer.
    pub fn combine_send_row(&self, set: usize, le: usize, row: usize) -> usize {
        let rows = self.num_pes * self.num_max_tokens;
        self.set(set) + self.combine_send.offset + (le * rows + row) * self.hidden * 2
    }
    /// Combine result row of (token `t`, top-k slot `k`).
    pub fn combine_recv_row(&self, set: usize, t: usize, k: usize) -> usize {
        self.set(set) + self.combine_recv.offset + (t * self.num_topk + k) * self.hidden * 2
    }
    /// Byte offset of the payload inside a message.
    pub fn payload_offset(&self) -> usize {
        HEADER_BYTES
    }
    /// Byte offset of the scales inside an FP8 message.
    pub fn scales_offset(&self) -> usize {
        HEADER_BYTES + self.hidden
    }
    /// Bytes of the payload (+ scales) of a message.
    pub fn payload_bytes(&self) -> usize {
        if self.use_fp8 {
            self.hidden + self.hidden / 128 * 4
        } else {
            self.hidden * 2
        }
    }

    // ------------------------------------------------------------ pull area
    //
    // A second, separate symmetric allocation (the "pull area") used by combine's direct
    // (p2p) path; the regions above and their offsets are unchanged by it. Per buffer set:
    // `pull_range` u64 `[R][L]`: `begin << 32 | count` of the block that expert-owning PE
    // `owner` holds for this PE in its local expert `le` (written by the owner before its
    // combine flag), so this PE can read its rows straight from the owner's
    // `combine_send`.

    /// Bytes of one set of the pull area.
    pub fn pull_set_bytes(&self) -> usize {
        (self.num_pes * self.num_local_experts * 8).next_multiple_of(REGION_ALIGN)
    }
    /// Bytes of the pull area (two sets): allocated separately, after the main
    /// allocation of [`Layout::total_bytes`].
    pub fn pull_area_bytes(&self) -> usize {
        2 * self.pull_set_bytes()
    }
    /// Offset in the pull area of the word where PE `owner` publishes its block for this
    /// PE in its local expert `le`.
    pub fn pull_range_word(&self, set: usize, owner: usize, le: usize) -> usize {
        debug_assert!(set < 2);
        set * self.pull_set_bytes() + (owner * self.num_local_experts + le) * 8
    }
    /// Symmetric bytes an [`crate::ep::Buffer`] allocates in all: the main allocation
    /// ([`Layout::size_hint`] = [`Layout::total_bytes`]) plus the pull area. A heap of
    /// this size (plus the allocator's 64-byte alignment of the second block) holds one
    /// buffer.
    pub fn alloc_hint(cfg: &Config, num_pes: usize) -> Result<usize> {
        let l = Layout::new(cfg, num_pes)?;
        Ok(l.total_bytes.next_multiple_of(REGION_ALIGN) + l.pull_area_bytes())
    }

    /// DeepEP V1's LL buffer size for the same shape (`LowLatencyLayout` in
    /// `csrc/config.hpp`): two sets, each of a send area `max(N, E*N)` messages, a receive
    /// area of `E * N` messages (messages sized for bf16, 16 + 2H bytes) and E signal ints.
    pub fn deepep_size_hint(cfg: &Config) -> usize {
        let (h, n, e) = (
            cfg.hidden,
            cfg.num_max_dispatch_tokens_per_rank,
            cfg.num_experts,
        );
        let dispatch_msg = 16 + (h * 2).max(h + h / 128 * 4);
        let combine_msg = h * 2;
        let send = (n * dispatch_msg).max(e * n * combine_msg);
        let recv = (e * n * dispatch_msg).max(e * n * combine_msg);
        2 * (send + recv + e * 4)
    }
}
