//! The launcher of the GPU EP kernels (`device-kernels/src/ep_ll.cu` → `ptx/ep_ll.ptx`):
//! [`GpuBuffer`], DeepEP-style low-latency dispatch and combine on GPU PEs.
//!
//! Owns: the `#[repr(C)]` mirrors of `rshmem/ep/ll.cuh` ([`LlArgs`], [`LlStatus`],
//! [`LlCtl`]; checked against the C++ compiler by host/tests/ep_gpu_abi.rs), the choice of
//! kernel per (hidden size, format), argument packing, the per-buffer device control block
//! and output tensors, the mapping of the kernels' status records to the CPU
//! implementation's errors, and CUDA-graph capture/replay of whole LL calls.
//! Must not: compute buffer offsets itself ([`crate::ep::Layout`] is the one source, and
//! `rshmem/ep/layout.cuh` is tested equal to it), or synchronise with the host inside
//! [`GpuBuffer::low_latency_dispatch`] / [`GpuBuffer::low_latency_combine`] (they only
//! enqueue kernels on the PE's stream; results are read with the `read_*` calls, which
//! wait for the stream).
//!
//! Semantics are the CPU implementation's ([`crate::ep`], the oracle): same layout, same
//! signal words, same numerics. Differences (docs/ep.md "GPU kernels"): `(expert, source)`
//! blocks of `recv_x` are in source order (deterministic; CPU: arrival order), and the
//! outputs live in device memory owned by the buffer, one set per buffer set, so a dispatch
//! handle stays valid until the next dispatch on the same set (call number + 2); a stale
//! handle is refused.
//!
//! Every CUDA path here is unverified until scripts/gpu-check has run on a GPU.

use super::driver::{ck, settle_sync_copies};
use super::module::{Ctx, Module};
use super::pe::{DevBuf, GpuPe};
use crate::ep::{bf16, Config, DispatchOutput, Fault, Handle, Layout, RecvX};
use crate::error::{Error, Result};
use crate::types::SymPtr;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use std::sync::Arc;

/// The library module holding the kernels.
pub const MODULE: &str = "ep_ll";
/// `EP_LL_THREADS`: threads per block of every EP kernel.
pub const THREADS: u32 = 512;
/// `EP_LL_MAX_PES`.
pub const MAX_PES: usize = 1024;
/// `EP_LL_MAX_LOCAL_EXPERTS`.
pub const MAX_LOCAL_EXPERTS: usize = 1024;
/// Hidden sizes with compiled kernels (ep_ll.cu's `EP_LL_INSTANCES`).
pub const HIDDEN_SIZES: [usize; 6] = [2048, 2560, 4096, 5120, 7168, 8192];

/// `EP_LL_IDX_I32`.
pub const FLAG_IDX_I32: u32 = 0x1;
/// `EP_LL_ROUND_SCALE`.
pub const FLAG_ROUND_SCALE: u32 = 0x2;
/// `EP_LL_FP8_BUFFER`.
pub const FLAG_FP8_BUFFER: u32 = 0x4;
/// `EP_LL_SHRINK`: a wait that times out masks its PE instead of trapping.
pub const FLAG_SHRINK: u32 = 0x8;
/// `EP_LL_CREDITS_ONLY`: combine_send waits for its set's credits and returns (the
/// zero-copy guard of [`GpuBuffer::get_next_low_latency_combine_buffer`]).
pub const FLAG_CREDITS_ONLY: u32 = 0x10;
/// `EP_LL_MARK_SHIFT` / `EP_LL_MARK_BITS`: combine's flags carry the handle's dispatch
/// call mod 64 there (the CPU's handle mark).
pub const MARK_SHIFT: u32 = 24;
pub const MARK_BITS: u32 = 0x3f;
/// `EP_SHRUNK`: the low word of a signal word a shrinking receiver settled.
pub const SHRUNK: u64 = 1 << 30;
/// `EP_LL_MASK_SHRUNK(tag)`: the mask entry a kernel writes for a PE it gave up on in the
/// call of `tag` (the host writes 1).
pub fn mask_shrunk(tag: u64) -> i32 {
    (0x4000_0000 | (tag & 0x3fff_ffff)) as i32
}

pub const STATUS_NONE: u32 = 0;
pub const STATUS_DISPATCH_INPUT: u32 = 1;
pub const STATUS_DISPATCH_PEER: u32 = 2;
pub const STATUS_DISPATCH_CORRUPT: u32 = 3;
pub const STATUS_COMBINE_INPUT: u32 = 4;
pub const STATUS_COMBINE_PEER: u32 = 5;
pub const STATUS_COMBINE_ROWS: u32 = 6;
/// A peer combined the handle of another dispatch: value = its mark, expected = ours.
pub const STATUS_COMBINE_HANDLE: u32 = 7;
/// A peer's message header (token, top-k slot) was outside [0, N) x [0, K):
/// value = token << 32 | slot (each as u32).
pub const STATUS_DISPATCH_HEADER: u32 = 8;
/// `EP_LL_DEVICE_ERR_CONFIG`: the device error code of an inconsistent EP launch.
pub const DEVICE_ERR_CONFIG: u32 = 0x4550_0001;

/// `ep_ll_args_t`: the argument block every EP kernel takes by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LlArgs {
    pub buf: u64,
    pub ctl: u64,
    pub mask: u64,
    pub x: u64,
    pub topk_idx: u64,
    pub topk_weights: u64,
    pub out: u64,
    pub recv_scales: u64,
    pub recv_count: u64,
    pub src_info: u64,
    pub recv_topk_slot: u64,
    pub layout_range: u64,
    pub num_tokens: u32,
    pub num_max_tokens: u32,
    pub num_experts: u32,
    pub num_topk: u32,
    pub set: u32,
    pub flags: u32,
    pub fault: u32,
    /// `EP_LL_SHRINK`: a wait's bound before it gives up on its PE, in ms (0 = the device
    /// state's timeout).
    pub shrink_timeout_ms: u32,
}

/// `ep_ll_status_t`: what went wrong in the last call on a set.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LlStatus {
    pub claim: u64,
    pub commit: u64,
    pub kind: u32,
    pub peer: i32,
    pub value: u64,
    pub expected: u64,
    pub reserved: u64,
}

/// `ep_ll_ctl_t`: the per-buffer control block in the PE's device memory.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LlCtl {
    pub set_calls: [u64; 2],
    /// Per set and kind: `[set][0]` dispatch, `[set][1]` combine.
    pub status: [[LlStatus; 2]; 2],
    pub grid_done: [[u32; 4]; 2],
    pub dest_done: [[[u32; MAX_PES]; 2]; 2],
    pub staged: [u64; 2],
    /// Shrink mode: per set and source, the receive kernel's decision (tag << 1 | use).
    pub shrink_decided: [[u64; MAX_PES]; 2],
    /// The buffer's team: 0 = the world; else its size, this PE's rank and the world PE
    /// of each member.
    pub team_size: u32,
    pub team_rank: i32,
    pub team_pe: [i32; MAX_PES],
    /// Shrink mode: per set and destination, the send kernels' decision about its credit
    /// (tag << 1 | came).
    pub credit_decided: [[u64; MAX_PES]; 2],
}

// The static_asserts of ll.cuh, repeated here (the C++ oracle test checks every field).
const _: () = assert!(size_of::<LlArgs>() == 128);
const _: () = assert!(offset_of!(LlArgs, num_tokens) == 96);
const _: () = assert!(offset_of!(LlArgs, fault) == 120);
const _: () = assert!(size_of::<LlStatus>() == 48);
const _: () = assert!(offset_of!(LlCtl, status) == 16);
const _: () = assert!(offset_of!(LlCtl, grid_done) == 208);
const _: () = assert!(offset_of!(LlCtl, dest_done) == 240);
const _: () = assert!(offset_of!(LlCtl, staged) == 240 + 2 * 2 * MAX_PES * 4);
const _: () = assert!(offset_of!(LlCtl, shrink_decided) == 240 + 2 * 2 * MAX_PES * 4 + 16);
const CTL_TEAM: usize = 240 + 2 * 2 * MAX_PES * 4 + 16 + 2 * MAX_PES * 8;
const _: () = assert!(offset_of!(LlCtl, team_size) == CTL_TEAM);
const _: () = assert!(offset_of!(LlCtl, team_pe) == CTL_TEAM + 8);
const _: () = assert!(offset_of!(LlCtl, credit_decided) == CTL_TEAM + 8 + MAX_PES * 4);
const _: () = assert!(size_of::<LlCtl>() == CTL_TEAM + 8 + MAX_PES * 4 + 2 * MAX_PES * 8);

/// (name, value) of every size and offset mirrored here, named as the C++ oracle prints
/// them (`sizeof.T`, `T.field`).
pub fn layout_table() -> Vec<(&'static str, usize)> {
    vec![
        ("sizeof.ep_ll_args_t", size_of::<LlArgs>()),
        ("ep_ll_args_t.buf", offset_of!(LlArgs, buf)),
        ("ep_ll_args_t.ctl", offset_of!(LlArgs, ctl)),
        ("ep_ll_args_t.mask", offset_of!(LlArgs, mask)),
        ("ep_ll_args_t.x", offset_of!(LlArgs, x)),
        ("ep_ll_args_t.topk_idx", offset_of!(LlArgs, topk_idx)),
        (
            "ep_ll_args_t.topk_weights",
            offset_of!(LlArgs, topk_weights),
        ),
        ("ep_ll_args_t.out", offset_of!(LlArgs, out)),
        ("ep_ll_args_t.recv_scales", offset_of!(LlArgs, recv_scales)),
        ("ep_ll_args_t.recv_count", offset_of!(LlArgs, recv_count)),
        ("ep_ll_args_t.src_info", offset_of!(LlArgs, src_info)),
        (
            "ep_ll_args_t.recv_topk_slot",
            offset_of!(LlArgs, recv_topk_slot),
        ),
        (
            "ep_ll_args_t.layout_range",
            offset_of!(LlArgs, layout_range),
        ),
        ("ep_ll_args_t.num_tokens", offset_of!(LlArgs, num_tokens)),
        (
            "ep_ll_args_t.num_max_tokens",
            offset_of!(LlArgs, num_max_tokens),
        ),
        ("ep_ll_args_t.num_experts", offset_of!(LlArgs, num_experts)),
        ("ep_ll_args_t.num_topk", offset_of!(LlArgs, num_topk)),
        ("ep_ll_args_t.set", offset_of!(LlArgs, set)),
        ("ep_ll_args_t.flags", offset_of!(LlArgs, flags)),
        ("ep_ll_args_t.fault", offset_of!(LlArgs, fault)),
        (
            "ep_ll_args_t.shrink_timeout_ms",
            offset_of!(LlArgs, shrink_timeout_ms),
        ),
        ("sizeof.ep_ll_status_t", size_of::<LlStatus>()),
        ("ep_ll_status_t.claim", offset_of!(LlStatus, claim)),
        ("ep_ll_status_t.commit", offset_of!(LlStatus, commit)),
        ("ep_ll_status_t.kind", offset_of!(LlStatus, kind)),
        ("ep_ll_status_t.peer", offset_of!(LlStatus, peer)),
        ("ep_ll_status_t.value", offset_of!(LlStatus, value)),
        ("ep_ll_status_t.expected", offset_of!(LlStatus, expected)),
        ("ep_ll_status_t.reserved", offset_of!(LlStatus, reserved)),
        ("sizeof.ep_ll_ctl_t", size_of::<LlCtl>()),
        ("ep_ll_ctl_t.set_calls", offset_of!(LlCtl, set_calls)),
        ("ep_ll_ctl_t.status", offset_of!(LlCtl, status)),
        ("ep_ll_ctl_t.grid_done", offset_of!(LlCtl, grid_done)),
        ("ep_ll_ctl_t.dest_done", offset_of!(LlCtl, dest_done)),
        ("ep_ll_ctl_t.staged", offset_of!(LlCtl, staged)),
        (
            "ep_ll_ctl_t.shrink_decided",
            offset_of!(LlCtl, shrink_decided),
        ),
        ("ep_ll_ctl_t.team_size", offset_of!(LlCtl, team_size)),
        ("ep_ll_ctl_t.team_rank", offset_of!(LlCtl, team_rank)),
        ("ep_ll_ctl_t.team_pe", offset_of!(LlCtl, team_pe)),
        (
            "ep_ll_ctl_t.credit_decided",
            offset_of!(LlCtl, credit_decided),
        ),
    ]
}

/// (name, value) of the constants of ll.cuh and layout.cuh that the launcher relies on.
pub fn constant_table() -> Vec<(&'static str, u64)> {
    vec![
        ("EP_LL_THREADS", THREADS as u64),
        ("EP_LL_MAX_PES", MAX_PES as u64),
        ("EP_LL_MAX_LOCAL_EXPERTS", MAX_LOCAL_EXPERTS as u64),
        ("EP_LL_IDX_I32", FLAG_IDX_I32 as u64),
        ("EP_LL_ROUND_SCALE", FLAG_ROUND_SCALE as u64),
        ("EP_LL_FP8_BUFFER", FLAG_FP8_BUFFER as u64),
        ("EP_LL_SHRINK", FLAG_SHRINK as u64),
        ("EP_LL_CREDITS_ONLY", FLAG_CREDITS_ONLY as u64),
        ("EP_LL_STATUS_NONE", STATUS_NONE as u64),
        ("EP_LL_STATUS_DISPATCH_INPUT", STATUS_DISPATCH_INPUT as u64),
        ("EP_LL_STATUS_DISPATCH_PEER", STATUS_DISPATCH_PEER as u64),
        (
            "EP_LL_STATUS_DISPATCH_CORRUPT",
            STATUS_DISPATCH_CORRUPT as u64,
        ),
        ("EP_LL_STATUS_COMBINE_INPUT", STATUS_COMBINE_INPUT as u64),
        ("EP_LL_STATUS_COMBINE_PEER", STATUS_COMBINE_PEER as u64),
        ("EP_LL_STATUS_COMBINE_ROWS", STATUS_COMBINE_ROWS as u64),
        ("EP_LL_STATUS_COMBINE_HANDLE", STATUS_COMBINE_HANDLE as u64),
        (
            "EP_LL_STATUS_DISPATCH_HEADER",
            STATUS_DISPATCH_HEADER as u64,
        ),
        ("EP_LL_MARK_SHIFT", MARK_SHIFT as u64),
        ("EP_LL_MARK_BITS", MARK_BITS as u64),
        ("EP_LL_DEVICE_ERR_CONFIG", DEVICE_ERR_CONFIG as u64),
        ("EP_LL_DISPATCH_SEND", Kernel::DispatchSend as u64),
        ("EP_LL_DISPATCH_RECV", Kernel::DispatchRecv as u64),
        ("EP_LL_COMBINE_SEND", Kernel::CombineSend as u64),
        ("EP_LL_COMBINE_RECV", Kernel::CombineRecv as u64),
        ("EP_REGION_ALIGN", crate::ep::layout::REGION_ALIGN as u64),
        ("EP_HEADER_BYTES", crate::ep::layout::HEADER_BYTES as u64),
        ("EP_MAX_TOPK", crate::ep::MAX_TOPK as u64),
        (
            "EP_MAX_TOKENS_PER_RANK",
            crate::ep::MAX_TOKENS_PER_RANK as u64,
        ),
        ("EP_POISON", crate::ep::POISON),
        ("EP_SHRUNK", SHRUNK),
        ("EP_COUNT_MASK", crate::ep::COUNT_MASK),
    ]
}

/// The kernels of an LL call pair (values 0..=3 = ll.cuh's kernel kinds; the stage
/// kernel has no kind: it keeps no completion counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    DispatchSend = 0,
    DispatchRecv = 1,
    CombineSend = 2,
    CombineRecv = 3,
    /// Casts the tokens into the staging area before `DispatchSend`; launched only on a PE
    /// with an IBGDA peer (its WRITEs need a registered source).
    DispatchStage = 4,
}

/// Every kernel, in `Kernel as usize` order.
pub const KERNELS: [Kernel; 5] = [
    Kernel::DispatchSend,
    Kernel::DispatchRecv,
    Kernel::CombineSend,
    Kernel::CombineRecv,
    Kernel::DispatchStage,
];

/// Whether a PE with this peer table needs the stage kernel before each dispatch: some
/// other PE is not reached by stores through a mapping (ep_ll.cu puts to it from the
/// heap's staging area).
pub fn needs_stage(me: usize, peers: &[super::state::DevicePeer]) -> bool {
    needs_stage_in(me, peers, None)
}

/// [`needs_stage`] for a buffer on a team: only the members (world PEs) count.
pub fn needs_stage_in(
    me: usize,
    peers: &[super::state::DevicePeer],
    members: Option<&[usize]>,
) -> bool {
    peers.iter().enumerate().any(|(q, p)| {
        q != me
            && p.transport != super::state::TRANSPORT_P2P
            && members.is_none_or(|m| m.contains(&q))
    })
}

/// Refuses a team with a member this GPU PE has no transport to (`TRANSPORT_NONE`: under
/// `p2p` / `auto`, a PE on another node or a GPU without P2P access): the kernels would
/// trap at the first message to it. `what` (the caller and its group of PEs) starts the
/// message and `cure` ends it: how this caller picks another transport.
pub fn unreachable_members(
    what: &str,
    me: usize,
    peers: &[super::state::DevicePeer],
    members: &[u32],
    cure: &str,
) -> Result<()> {
    let missing: Vec<u32> = members
        .iter()
        .copied()
        .filter(|&q| {
            q as usize != me
                && peers
                    .get(q as usize)
                    .is_none_or(|p| p.transport == super::state::TRANSPORT_NONE)
        })
        .collect();
    match missing.first() {
        None => Ok(()),
        Some(&first) => Err(Error::Unreachable {
            pe: first as usize,
            from: me,
            reason: format!(
                "{what}: GPU PE {me} has no transport to PE(s) {missing:?} (the p2p \
                 transport reaches only GPUs of this node with P2P access): {cure}"
            ),
        }),
    }
}

/// The name of `kind`'s instance for `hidden` and the dispatch format, or a clear error
/// when no instance is compiled for that hidden size.
pub fn kernel_name(kind: Kernel, hidden: usize, fp8: bool) -> Result<String> {
    if !HIDDEN_SIZES.contains(&hidden) {
        return Err(unsupported_hidden(hidden));
    }
    let f = if fp8 { "fp8" } else { "bf16" };
    Ok(match kind {
        Kernel::DispatchSend => format!("ep_ll_dispatch_send_h{hidden}_{f}"),
        Kernel::DispatchStage => format!("ep_ll_dispatch_stage_h{hidden}_{f}"),
        Kernel::DispatchRecv => format!("ep_ll_dispatch_recv_h{hidden}_{f}"),
        Kernel::CombineSend => format!("ep_ll_combine_send_h{hidden}"),
        Kernel::CombineRecv => format!("ep_ll_combine_recv_h{hidden}"),
    })
}

fn unsupported_hidden(hidden: usize) -> Error {
    Error::InvalidArgument(format!(
        "ep on GPU PEs: hidden size {hidden} has no GPU kernel (ptx/ep_ll.ptx is compiled for \
         hidden = {}); use one of these, or CPU PEs (--device cpu), which take any hidden size",
        HIDDEN_SIZES.map(|h| h.to_string()).join(", ")
    ))
}

/// Checks `cfg` for GPU PEs (everything [`Config::validate`] checks, plus the kernels'
/// limits) and returns its layout.
pub fn check_config(cfg: &Config, num_pes: usize) -> Result<Layout> {
    let layout = Layout::new(cfg, num_pes)?;
    if !HIDDEN_SIZES.contains(&cfg.hidden) {
        return Err(unsupported_hidden(cfg.hidden));
    }
    if num_pes > MAX_PES {
        return Err(Error::InvalidArgument(format!(
            "ep on GPU PEs: {num_pes} PEs, the kernels support at most {MAX_PES}"
        )));
    }
    if layout.num_local_experts > MAX_LOCAL_EXPERTS {
        return Err(Error::InvalidArgument(format!(
            "ep on GPU PEs: {} local experts per PE (E = {} / {num_pes} PEs), the kernels \
             support at most {MAX_LOCAL_EXPERTS}",
            layout.num_local_experts, cfg.num_experts
        )));
    }
    if cfg.num_experts > u32::MAX as usize {
        return Err(Error::InvalidArgument(format!(
            "ep on GPU PEs: num_experts {} does not fit the kernels' 32-bit argument",
            cfg.num_experts
        )));
    }
    Ok(layout)
}

/// Element type of a device `topk_idx` tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdxType {
    I64,
    I32,
}

impl IdxType {
    /// The element type's name, for errors.
    pub fn name(self) -> &'static str {
        match self {
            IdxType::I64 => "int64",
            IdxType::I32 => "int32",
        }
    }
    pub fn bytes(self) -> u64 {
        match self {
            IdxType::I64 => 8,
            IdxType::I32 => 4,
        }
    }
}

/// Device addresses of one buffer set's outputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutPtrs {
    pub recv_x: u64,
    pub recv_scales: u64,
    pub recv_count: u64,
    pub src_info: u64,
    pub recv_topk_slot: u64,
    pub layout_range: u64,
    pub combined: u64,
}

/// What every argument block of a buffer shares.
#[derive(Debug, Clone, Copy)]
pub struct ArgBase {
    /// Heap offset of the EP allocation.
    pub buf: u64,
    pub ctl: u64,
    pub mask: u64,
    pub num_max_tokens: u32,
    pub num_experts: u32,
    pub num_topk: u32,
    pub fp8: bool,
    pub round_scale: bool,
    /// Shrink mode ([`GpuBuffer::set_shrink`]): Some(the give-up bound in ms, 0 = the
    /// device state's timeout).
    pub shrink: Option<u32>,
}

impl ArgBase {
    fn common(&self, set: usize, idx_type: IdxType, topk_idx: u64, num_tokens: usize) -> LlArgs {
        let mut flags = 0;
        if idx_type == IdxType::I32 {
            flags |= FLAG_IDX_I32;
        }
        if self.round_scale {
            flags |= FLAG_ROUND_SCALE;
        }
        if self.fp8 {
            flags |= FLAG_FP8_BUFFER;
        }
        if self.shrink.is_some() {
            flags |= FLAG_SHRINK;
        }
        LlArgs {
            buf: self.buf,
            ctl: self.ctl,
            mask: self.mask,
            topk_idx,
            num_tokens: num_tokens.min(u32::MAX as usize) as u32,
            num_max_tokens: self.num_max_tokens,
            num_experts: self.num_experts,
            num_topk: self.num_topk,
            set: set as u32,
            flags,
            shrink_timeout_ms: self.shrink.unwrap_or(0),
            ..LlArgs::default()
        }
    }

    /// The arguments of a dispatch's two kernels. `fault` is a host-detected input fault
    /// (the CPU's `Fault::encode`, low 32 bits), 0 for none.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch(
        &self,
        set: usize,
        out: &OutPtrs,
        x: u64,
        topk_idx: u64,
        idx_type: IdxType,
        num_tokens: usize,
        fault: u64,
    ) -> LlArgs {
        LlArgs {
            x,
            out: out.recv_x,
            recv_scales: if self.fp8 { out.recv_scales } else { 0 },
            recv_count: out.recv_count,
            src_info: out.src_info,
            recv_topk_slot: out.recv_topk_slot,
            layout_range: out.layout_range,
            fault: (fault & 0xffff_ffff) as u32,
            ..self.common(set, idx_type, topk_idx, num_tokens)
        }
    }

    /// The arguments of a combine's two kernels: `expert_out` = `[L, R*N, H]` bf16 (or the
    /// zero-copy region), `handle_out` = the dispatch's outputs (its `src_info`,
    /// `recv_topk_slot`, `layout_range`), `combined` = `[T, H]` bf16.
    #[allow(clippy::too_many_arguments)]
    /// `handle_call`: the LL call of the dispatch whose handle is combined (its mark goes
    /// into the flags).
    pub fn combine(
        &self,
        set: usize,
        handle_out: &OutPtrs,
        handle_call: u64,
        combined: u64,
        expert_out: u64,
        topk_idx: u64,
        idx_type: IdxType,
        topk_weights: u64,
        num_tokens: usize,
        fault: u64,
    ) -> LlArgs {
        let common = self.common(set, idx_type, topk_idx, num_tokens);
        LlArgs {
            x: expert_out,
            topk_weights,
            out: combined,
            src_info: handle_out.src_info,
            recv_topk_slot: handle_out.recv_topk_slot,
            layout_range: handle_out.layout_range,
            fault: (fault & 0xffff_ffff) as u32,
            flags: common.flags | ((handle_call as u32 & MARK_BITS) << MARK_SHIFT),
            ..common
        }
    }
}

/// The error for a status record of call `call` (None when the record does not belong to
/// that call or reports nothing): the CPU implementation's errors for the same faults.
pub fn status_error(st: &LlStatus, cfg: &Config, me: usize, call: u64) -> Option<Error> {
    if st.commit != call + 1 || st.kind == STATUS_NONE {
        return None;
    }
    let op = match st.kind {
        STATUS_DISPATCH_INPUT
        | STATUS_DISPATCH_PEER
        | STATUS_DISPATCH_CORRUPT
        | STATUS_DISPATCH_HEADER => "low_latency_dispatch",
        _ => "low_latency_combine",
    };
    let peer = st.peer.max(0) as usize;
    Some(match st.kind {
        STATUS_DISPATCH_INPUT | STATUS_COMBINE_INPUT => Error::InvalidArgument(format!(
            "{op} (LL call #{call}) on PE {me}: this PE's input is invalid: {}",
            Fault::describe(st.value, cfg)
        )),
        STATUS_DISPATCH_PEER | STATUS_COMBINE_PEER => Error::EpPeerFailed {
            pe: me,
            op,
            call,
            peer,
            reason: Fault::describe(st.value, cfg),
        },
        STATUS_DISPATCH_CORRUPT => Error::Verification(format!(
            "{op} (LL call #{call}) on PE {me}: PE {peer} announced {} tokens, beyond its \
             receive area",
            st.value
        )),
        // The CPU's words for the same fault (host/src/ep/mod.rs, the receive loop).
        STATUS_DISPATCH_HEADER => Error::Verification(format!(
            "{op} (LL call #{call}) on PE {me}: PE {peer} sent token index {}, top-k slot {} \
             (N = {}, K = {})",
            (st.value >> 32) as u32 as i32,
            st.value as u32 as i32,
            cfg.num_max_dispatch_tokens_per_rank,
            cfg.num_topk
        )),
        STATUS_COMBINE_ROWS => Error::Verification(format!(
            "{op} (LL call #{call}) on PE {me}: PE {peer} returned {} rows, this PE's routing \
             sent {} tokens to its experts (do all PEs combine the same dispatch?)",
            st.value, st.expected
        )),
        // The CPU's words for the same fault (host/src/ep/mod.rs).
        STATUS_COMBINE_HANDLE => Error::InvalidArgument(format!(
            "low_latency_combine: PE {peer} combined with the handle of another dispatch (LL \
             call {} mod 64) than PE {me} (call {} mod 64): every PE must pass the handle of \
             the same dispatch",
            st.value, st.expected
        )),
        k => Error::Verification(format!(
            "{op} (LL call #{call}) on PE {me}: unknown status kind {k} from the kernels"
        )),
    })
}

/// Whether the buffer can take another call on `set`: the host's rule of at most one
/// call per set between a send kernel and its receive kernel.
fn check_pending(pending: &[Option<u64>; 2], set: usize, seq: u64, op: &str) -> Result<()> {
    match pending[set] {
        Some(p) => Err(Error::InvalidArgument(format!(
            "{op}: LL call #{p} on buffer set {set} has not been received yet: run its receive \
             hook before starting call #{seq} (at most two calls in flight)"
        ))),
        None => Ok(()),
    }
}

/// Per buffer set: output tensors in device memory, and which calls they hold.
struct SetOut {
    recv_x: DevBuf,
    recv_scales: Option<DevBuf>,
    recv_count: DevBuf,
    src_info: DevBuf,
    recv_topk_slot: DevBuf,
    layout_range: DevBuf,
    combined: DevBuf,
}

impl SetOut {
    fn ptrs(&self) -> OutPtrs {
        OutPtrs {
            recv_x: self.recv_x.ptr(),
            recv_scales: self.recv_scales.as_ref().map_or(0, |b| b.ptr()),
            recv_count: self.recv_count.ptr(),
            src_info: self.src_info.ptr(),
            recv_topk_slot: self.recv_topk_slot.ptr(),
            layout_range: self.layout_range.ptr(),
            combined: self.combined.ptr(),
        }
    }
}

/// A dispatch in flight: what combine needs, and (with a receive hook) the pending half.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHandle {
    /// LL call number of the dispatch.
    pub call: u64,
    /// T of this PE's dispatch.
    pub num_tokens: usize,
    /// Whether its receive kernel still has to be enqueued ([`GpuBuffer::recv_hook`]).
    pub hook_pending: bool,
}

/// A combine in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuCombine {
    pub call: u64,
    pub num_tokens: usize,
    pub hook_pending: bool,
}

/// One call a graph replay made (returned by [`GpuBuffer::replay`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    Dispatch(GpuHandle),
    Combine(GpuCombine),
}

#[derive(Debug, Clone)]
enum Recorded {
    Dispatch {
        offset: u64,
        tokens: usize,
        err: Option<String>,
    },
    Combine {
        offset: u64,
        tokens: usize,
        err: Option<String>,
    },
}

/// A call's record: its number, T, and the host-detected error every PE was told about.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    call: u64,
    tokens: usize,
    err: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Dispatch,
    Combine,
}

/// The host's bookkeeping of a buffer's LL calls (pure; unit-tested): the call counter,
/// the receive hooks pending per set, which call's outputs each set holds, the zero-copy
/// request, and the calls made while a CUDA graph is captured.
#[derive(Debug, Clone, Default)]
struct Book {
    seq: u64,
    /// Per set: (call, receive kernel) whose receive hook has not run.
    pending: [Option<(u64, Kernel)>; 2],
    dispatch: [Option<Rec>; 2],
    combine: [Option<Rec>; 2],
    zero_copy_call: Option<u64>,
    capture: Option<Vec<Recorded>>,
}

impl Book {
    /// Starts call number `seq` on set `seq % 2` (the CPU's rule: at most one call per set
    /// between a send and its receive).
    fn start(&mut self, op: &str) -> Result<(u64, usize)> {
        let seq = self.seq;
        let set = (seq % 2) as usize;
        let pending = self.pending.map(|p| p.map(|(c, _)| c));
        check_pending(&pending, set, seq, op)?;
        self.seq += 1;
        Ok((seq, set))
    }

    fn record(&mut self, op: Op, call: u64, tokens: usize, err: Option<String>, hook: bool) {
        let set = (call % 2) as usize;
        if let Some(c) = &mut self.capture {
            let err = err.clone();
            c.push(match op {
                Op::Dispatch => Recorded::Dispatch {
                    offset: call,
                    tokens,
                    err,
                },
                Op::Combine => Recorded::Combine {
                    offset: call,
                    tokens,
                    err,
                },
            });
        }
        let r = Some(Rec { call, tokens, err });
        match op {
            Op::Dispatch => {
                self.dispatch[set] = r;
                if hook {
                    self.pending[set] = Some((call, Kernel::DispatchRecv));
                }
            }
            Op::Combine => {
                self.combine[set] = r;
                if hook {
                    self.pending[set] = Some((call, Kernel::CombineRecv));
                }
            }
        }
    }

    /// The receive hook of `call` (a `kind` receive): its set, now no longer pending.
    fn hook(&mut self, call: u64, kind: Kernel) -> Result<usize> {
        let set = (call % 2) as usize;
        match self.pending[set] {
            Some((c, k)) if c == call && k == kind => {
                self.pending[set] = None;
                Ok(set)
            }
            Some((c, _)) if c == call => Err(Error::InvalidArgument(format!(
                "receive hook of LL call #{call}: that call is not a {}",
                if kind == Kernel::DispatchRecv {
                    "dispatch"
                } else {
                    "combine"
                }
            ))),
            _ => Err(Error::InvalidArgument(format!(
                "receive hook of LL call #{call}: nothing pending (already received, or the \
                 call was made without return_recv_hook)"
            ))),
        }
    }

    /// The set holding dispatch `call`'s outputs, or why the handle is unusable.
    fn handle_set(&self, call: u64, op: &str) -> Result<usize> {
        let set = (call % 2) as usize;
        match &self.dispatch[set] {
            Some(r) if r.call == call => Ok(set),
            Some(r) if r.call > call => Err(Error::InvalidArgument(format!(
                "{op}: the handle of dispatch #{call} is stale: its outputs were overwritten by \
                 dispatch #{} on the same buffer set (a handle lasts until the dispatch two \
                 LL calls later)",
                r.call
            ))),
            _ => Err(Error::InvalidArgument(format!(
                "{op}: no dispatch #{call} on this buffer (a handle of another buffer?)"
            ))),
        }
    }

    /// Asks for the zero-copy buffer of the next call: its set. Refused while that set's
    /// previous call is not received here (its receive hook pending), as on the CPU: the
    /// device's call counter would not count it yet, so the zero-copy guard would wait for
    /// the wrong call's credits (and the combine would be refused anyway).
    fn next_zero_copy(&mut self) -> Result<usize> {
        let set = (self.seq % 2) as usize;
        let pending = self.pending.map(|p| p.map(|(c, _)| c));
        check_pending(
            &pending,
            set,
            self.seq,
            "get_next_low_latency_combine_buffer",
        )?;
        self.zero_copy_call = Some(self.seq);
        Ok(set)
    }

    /// For combine call `seq` with dispatch handle (`h_call`, `h_tokens`): the set of the
    /// handle's outputs, and the fault every PE must learn about (the CPU's
    /// `Fault::Handle`): a stale handle, a zero-copy combine without
    /// `get_next_low_latency_combine_buffer` for this call, T beyond N.
    fn combine_fault(
        &self,
        seq: u64,
        h_call: u64,
        h_tokens: usize,
        n_max: usize,
        zero_copy: bool,
    ) -> (usize, Option<String>) {
        let op = "low_latency_combine";
        match self.handle_set(h_call, op) {
            Err(e) => ((h_call % 2) as usize, Some(e.to_string())),
            Ok(set) => {
                if zero_copy && self.zero_copy_call != Some(seq) {
                    return (
                        set,
                        Some(format!(
                            "{op}: zero-copy combine #{seq} without \
                             get_next_low_latency_combine_buffer for this call"
                        )),
                    );
                }
                if h_tokens > n_max {
                    return (
                        set,
                        Some(format!(
                            "{op}: the handle's dispatch had {h_tokens} tokens, more than \
                             num_max_dispatch_tokens_per_rank = {n_max}"
                        )),
                    );
                }
                (set, None)
            }
        }
    }

    /// The record of combine `call`, if its output is still there.
    fn combine_rec(&self, call: u64) -> Result<&Rec> {
        match &self.combine[(call % 2) as usize] {
            Some(r) if r.call == call => Ok(r),
            _ => Err(Error::InvalidArgument(format!(
                "read_combined: the output of combine #{call} was overwritten by a later \
                 combine on the same buffer set (or it is not a combine of this buffer)"
            ))),
        }
    }

    fn any_pending(&self) -> bool {
        self.pending.iter().any(|p| p.is_some())
    }

    /// Starts recording calls for a graph; returns the state to restore afterwards.
    fn begin_capture(&mut self) -> Result<Book> {
        if self.any_pending() {
            return Err(Error::InvalidArgument(
                "ep graph capture: a receive hook is pending; run it before capturing".into(),
            ));
        }
        let saved = self.clone();
        self.capture = Some(Vec::new());
        Ok(saved)
    }

    /// Ends the recording: restores the state from before (nothing ran), and returns
    /// (calls per replay, parity of the first call, the calls relative to the first), or
    /// why the captured calls cannot be replayed.
    fn end_capture(&mut self, saved: Book) -> Result<(u64, u64, Vec<Recorded>)> {
        let calls = self.seq - saved.seq;
        let pending = self.any_pending();
        let recorded = self.capture.take().unwrap_or_default();
        let base = saved.seq;
        *self = saved;
        if calls % 2 != 0 || pending {
            return Err(Error::InvalidArgument(format!(
                "ep graph capture: the captured function made {calls} LL call(s){}; it must \
                 make an even number and run every receive hook",
                if pending {
                    " and left a receive hook pending"
                } else {
                    ""
                }
            )));
        }
        let rel = recorded
            .into_iter()
            .map(|r| match r {
                Recorded::Dispatch {
                    offset,
                    tokens,
                    err,
                } => Recorded::Dispatch {
                    offset: offset - base,
                    tokens,
                    err,
                },
                Recorded::Combine {
                    offset,
                    tokens,
                    err,
                } => Recorded::Combine {
                    offset: offset - base,
                    tokens,
                    err,
                },
            })
            .collect();
        Ok((calls, base % 2, rel))
    }

    /// Checks that a graph captured at `parity` can be replayed now.
    fn can_replay(&self, parity: u64) -> Result<()> {
        if self.seq % 2 != parity {
            return Err(Error::InvalidArgument(format!(
                "ep graph replay: the graph was captured at an {} LL call number, this buffer \
                 is at call #{} (make one more LL call, or capture again)",
                if parity == 0 { "even" } else { "odd" },
                self.seq
            )));
        }
        if self.any_pending() {
            return Err(Error::InvalidArgument(
                "ep graph replay: a receive hook is pending; run it first".into(),
            ));
        }
        Ok(())
    }

    /// A replay was launched: its calls become the next calls.
    fn replayed(&mut self, calls: u64, recorded: &[Recorded]) -> Vec<Replayed> {
        let start = self.seq;
        let mut out = Vec::new();
        for r in recorded {
            let (op, offset, tokens, err) = match r {
                Recorded::Dispatch {
                    offset,
                    tokens,
                    err,
                } => (Op::Dispatch, offset, tokens, err),
                Recorded::Combine {
                    offset,
                    tokens,
                    err,
                } => (Op::Combine, offset, tokens, err),
            };
            let call = start + offset;
            let rec = Some(Rec {
                call,
                tokens: *tokens,
                err: err.clone(),
            });
            if op == Op::Dispatch {
                self.dispatch[(call % 2) as usize] = rec;
                out.push(Replayed::Dispatch(GpuHandle {
                    call,
                    num_tokens: *tokens,
                    hook_pending: false,
                }));
            } else {
                self.combine[(call % 2) as usize] = rec;
                out.push(Replayed::Combine(GpuCombine {
                    call,
                    num_tokens: *tokens,
                    hook_pending: false,
                }));
            }
        }
        self.seq += calls;
        out
    }
}

/// A captured CUDA graph of whole LL calls on one PE's stream.
pub struct EpGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<Ctx>,
    buffer_id: u64,
    calls: u64,
    parity: u64,
    recorded: Vec<Recorded>,
}

// SAFETY: graph handles are usable from any thread with the context current (every use
// enters it first).
unsafe impl Send for EpGraph {}

impl Drop for EpGraph {
    fn drop(&mut self) {
        if self.ctx.enter().is_ok() {
            // SAFETY: created by cuGraphInstantiateWithFlags / cuStreamEndCapture in this
            // context, destroyed once.
            unsafe {
                sys::cuGraphExecDestroy(self.exec);
                sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

impl EpGraph {
    /// LL calls per replay.
    pub fn calls(&self) -> u64 {
        self.calls
    }
}

/// Loads and binds this PE's instance of the `ep_ll` module. Without a prebuilt cubin the
/// driver JIT-compiles the PTX; the PEs of a process take turns (`Module::load_library`),
/// so the later ones load from CUDA's compute cache instead of compiling it concurrently.
pub fn load_module(g: &GpuPe) -> Result<Module> {
    // The bundle's cubin of this very PTX when RSHMEM_PTX_DIR has one, else the PTX (PEs
    // of one process take turns to JIT it, Module::load_library).
    let m = g.load_library_module(MODULE, None)?;
    if m.bound_pe() != Some(g.my_pe()) {
        return Err(Error::InvalidArgument(format!(
            "module {MODULE} has no rshmemi_device_state global (built without the EP kernels' \
             p2p header?)"
        )));
    }
    Ok(m)
}

/// The buffer's module: its own, or one shared by several buffers of the PE.
enum ModRef<'g> {
    Owned(Module),
    Shared(&'g Module),
}

impl std::ops::Deref for ModRef<'_> {
    type Target = Module;
    fn deref(&self) -> &Module {
        match self {
            ModRef::Owned(m) => m,
            ModRef::Shared(m) => m,
        }
    }
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// An EP buffer on a GPU PE: the symmetric allocation of [`Layout`] in the GPU heap, the
/// PE's instance of the `ep_ll` module, its control block and outputs.
///
/// Every PE of the job must make the same LL calls in the same order (dispatch and
/// combine both count), as on CPU. Destroy it with [`GpuBuffer::destroy`] (collective).
pub struct GpuBuffer<'g> {
    g: &'g GpuPe,
    id: u64,
    cfg: Config,
    layout: Layout,
    module: ModRef<'g>,
    names: [String; 5],
    /// The kernels of `module` (in `KERNELS` order), looked up once.
    funcs: [sys::CUfunction; 5],
    /// Some peer is reached through a queue (IBGDA / proxy): dispatches run the stage
    /// kernel first.
    stage: bool,
    grid: u32,
    base: SymPtr<u8>,
    ctl: DevBuf,
    mask_dev: DevBuf,
    /// Indexed by team rank, as everything else of the buffer.
    masked: Vec<bool>,
    /// The world PE of each member of the buffer's team, and this PE's rank in it.
    members: Vec<usize>,
    team_rank: usize,
    /// Shrink mode: the kernels mask a PE whose wait timed out (ep_ll.cu "Shrink mode").
    shrink: bool,
    /// Shrink mode: how long a wait lasts before it gives up (None: the PE's timeout).
    shrink_timeout: Option<std::time::Duration>,
    /// The shrink setting a zero-copy guard (get_next_low_latency_combine_buffer) ran with,
    /// and its call: that call's combine keeps it, so the guard's give-ups and the combine
    /// agree even if `set_shrink` changed in between.
    guard_shrink: Option<(u64, bool, Option<std::time::Duration>)>,
    /// The device mask may hold entries the kernels wrote (shrink mode was on since the
    /// last clean_mask), which `masked` may not show yet.
    kernel_marks: bool,
    outs: [SetOut; 2],
    book: Book,
    /// Per set: the arguments of its last call (for its receive hook).
    hook_args: [Option<LlArgs>; 2],
    /// Tensor ranges `[p, end)` found mapped across several chunks (a VMM range, as
    /// PyTorch's expandable segments): later calls on the same tensors skip the walk,
    /// one driver call per chunk ([`GpuBuffer::check_len`]). At most [`RANGES_KEPT`].
    mapped: std::sync::Mutex<Vec<(u64, u64)>>,
}

/// How many multi-chunk tensor ranges a [`GpuBuffer`] remembers as mapped.
const RANGES_KEPT: usize = 16;

/// Waits until the zeroing memsets of `dev` (asynchronous to the host, on the legacy
/// stream) have landed; see [`settle_sync_copies`]. Uploads need no call: `DevBuf::write`
/// and `GpuPe::write_local` settle themselves.
fn settle_memsets(g: &GpuPe, what: &str) -> Result<()> {
    g.enter()?;
    settle_sync_copies(|| format!("PE {}: {what}", g.my_pe()))
}

fn dev(g: &GpuPe, bytes: usize, what: &str) -> Result<DevBuf> {
    let b = DevBuf::new(g.ctx(), bytes, what)?;
    g.enter()?;
    // SAFETY: a fresh allocation of at least max(bytes, 1) bytes in this context.
    ck(
        unsafe { sys::cuMemsetD8_v2(b.ptr(), 0, bytes) },
        "cuMemsetD8",
        || format!("zeroing {what}"),
    )?;
    Ok(b)
}

impl<'g> GpuBuffer<'g> {
    /// Collective over every PE of the job: agrees on `cfg` (a mismatch fails on every
    /// PE, naming each PE's config), checks it for the GPU kernels, loads and binds the
    /// module ([`load_module`]), allocates exactly [`Layout::size_hint`] bytes of GPU heap,
    /// the control block and two sets of outputs, and zeroes the signal words. `grid` 0 =
    /// the co-resident share of the GPU (docs/ep.md "Launch contract").
    pub fn new(g: &'g GpuPe, cfg: Config, grid: u32) -> Result<GpuBuffer<'g>> {
        GpuBuffer::new_on(g, &g.pe().world().clone(), cfg, grid)
    }

    /// [`GpuBuffer::new`] on `team` (an EP group of a split, as
    /// [`crate::ep::Buffer::new`]): every PE of the job calls it at the same time, each with
    /// its own team; groups may differ in size (every PE allocates the largest need). The
    /// mask is indexed by team rank; errors name world PEs (as the CPU buffer's).
    pub fn new_on(
        g: &'g GpuPe,
        team: &crate::team::Team,
        cfg: Config,
        grid: u32,
    ) -> Result<GpuBuffer<'g>> {
        // Both steps are collective; a failure in the first fails every PE there.
        let prep = Self::exchange(g, Self::prepare(g, team, &cfg))?;
        let m = load_module(g)?;
        Self::build(g, team, cfg, grid, prep, ModRef::Owned(m))
    }

    /// [`GpuBuffer::new`] with this PE's already loaded module (from [`load_module`]), so
    /// that several buffers share one module instance (loading the 2 MB PTX is slow).
    pub fn with_module(
        g: &'g GpuPe,
        m: &'g Module,
        cfg: Config,
        grid: u32,
    ) -> Result<GpuBuffer<'g>> {
        GpuBuffer::with_module_on(g, m, &g.pe().world().clone(), cfg, grid)
    }

    /// [`GpuBuffer::with_module`] on `team` (see [`GpuBuffer::new_on`]).
    pub fn with_module_on(
        g: &'g GpuPe,
        m: &'g Module,
        team: &crate::team::Team,
        cfg: Config,
        grid: u32,
    ) -> Result<GpuBuffer<'g>> {
        let prep = Self::prepare(g, team, &cfg).and_then(|p| {
            if m.bound_pe() != Some(g.my_pe()) || m.name() != MODULE {
                return Err(Error::InvalidArgument(format!(
                    "ep::GpuBuffer::with_module: module {} is not the {MODULE} module bound to PE {}",
                    m.name(),
                    g.my_pe()
                )));
            }
            Ok(p)
        });
        let prep = Self::exchange(g, prep)?;
        Self::build(g, team, cfg, grid, prep, ModRef::Shared(m))
    }

    /// This PE's part: membership, the agreement inside its team, the layout and kernels.
    fn prepare(g: &GpuPe, team: &crate::team::Team, cfg: &Config) -> Result<(Layout, [String; 5])> {
        let pe = g.pe();
        if !team.members().contains(&(g.my_pe() as u32)) {
            return Err(Error::InvalidArgument(format!(
                "ep::GpuBuffer::new: PE {} is not a member of the team it passed",
                g.my_pe()
            )));
        }
        pe.agree_in(
            team,
            "ep::GpuBuffer::new",
            &[
                cfg.num_max_dispatch_tokens_per_rank as u64,
                cfg.hidden as u64,
                cfg.num_experts as u64,
                cfg.num_topk as u64,
                cfg.use_fp8 as u64,
                cfg.round_scale as u64,
            ],
            |w| format!("{w:?} (N, H, E, K, fp8, round_scale)"),
        )?;
        let layout = check_config(cfg, team.n_pes())?;
        unreachable_members(
            "ep::GpuBuffer::new, a member of the team",
            g.my_pe(),
            g.peer_table(),
            team.members(),
            "set RSHMEM_TRANSPORT=proxy (the soft HCA, over libfabric to other nodes) or \
             ibgda (a ConnectX NIC) on every PE",
        )?;
        let mut names: [String; 5] = Default::default();
        for (n, k) in names.iter_mut().zip(KERNELS) {
            *n = kernel_name(k, cfg.hidden, cfg.use_fp8)?;
        }
        Ok((layout, names))
    }

    /// World-collective: every PE's outcome of [`GpuBuffer::prepare`] (a failure on one PE
    /// fails every PE), and the largest allocation any team needs.
    fn exchange(
        g: &GpuPe,
        prep: Result<(Layout, [String; 5])>,
    ) -> Result<(Layout, [String; 5], usize)> {
        let pe = g.pe();
        let need = match &prep {
            Ok((l, _)) => [1u64, l.total_bytes as u64],
            Err(_) => [0, 0],
        };
        let bytes: Vec<u8> = need.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = pe.boot().allgather(&pe.world().group(), &bytes)?;
        let word = |b: &[u8], i: usize| crate::pe::le_u64(&b[8 * i..]);
        let (layout, names) = prep?;
        if let Some(bad) = all.iter().position(|b| word(b, 0) == 0) {
            return Err(Error::InvalidArgument(format!(
                "ep::GpuBuffer::new: PE {bad} failed to create its buffer (its own error says \
                 why: a config that differs within its team, or one the kernels cannot run)"
            )));
        }
        let max = all.iter().map(|b| word(b, 1) as usize).max().unwrap_or(0);
        Ok((layout, names, max))
    }

    fn build(
        g: &'g GpuPe,
        team: &crate::team::Team,
        cfg: Config,
        grid: u32,
        (layout, names, alloc_bytes): (Layout, [String; 5], usize),
        module: ModRef<'g>,
    ) -> Result<GpuBuffer<'g>> {
        let pe = g.pe();
        let n = team.n_pes();
        let members: Vec<usize> = team.members().iter().map(|&m| m as usize).collect();
        let world = members.len() == g.n_pes() && members.iter().enumerate().all(|(i, &m)| i == m);
        // Local steps fail on every PE alike (a PE that returned alone would leave the
        // others in the collective allocation or the barrier until the timeout).
        let kernels = (|| -> Result<(u32, [sys::CUfunction; 5])> {
            let mut share = u32::MAX;
            let mut funcs = [std::ptr::null_mut(); 5];
            for (f, k) in funcs.iter_mut().zip(&names) {
                share = share.min(g.collective_grid(&module, k, THREADS, 0, grid)?.0);
                *f = module.function(k)?;
            }
            Ok((share, funcs))
        })();
        let group = pe.world().group();
        crate::pe::exchange_status(pe.boot(), &group, "look up its EP kernels", &kernels)?;
        let (share, funcs) = kernels?;
        let base = g.align(crate::ep::layout::REGION_ALIGN, alloc_bytes)?;
        let local = (|| -> Result<(DevBuf, DevBuf, [SetOut; 2])> {
            // Signal words must start below every tag: zero both sets' signal areas.
            for set in 0..2 {
                g.memset(
                    base.offset() + set * layout.set_bytes,
                    0,
                    layout.dispatch_send.offset,
                )?;
            }
            let ctl = dev(g, size_of::<LlCtl>(), "the EP control block")?;
            let mask_dev = dev(g, n * 4, "the EP mask")?;
            let (l, rows, h) = (
                layout.num_local_experts,
                n * layout.num_max_tokens,
                cfg.hidden,
            );
            let out = |set: usize| -> Result<SetOut> {
                let w = |what: &str| format!("EP {what} (buffer set {set})");
                Ok(SetOut {
                    recv_x: dev(
                        g,
                        l * rows * h * if cfg.use_fp8 { 1 } else { 2 },
                        &w("recv_x"),
                    )?,
                    recv_scales: if cfg.use_fp8 {
                        Some(dev(g, l * rows * (h / 128) * 4, &w("recv_scales"))?)
                    } else {
                        None
                    },
                    recv_count: dev(g, l * 4, &w("recv_count"))?,
                    src_info: dev(g, l * rows * 4, &w("src_info"))?,
                    recv_topk_slot: dev(g, l * rows * 4, &w("recv_topk_slot"))?,
                    layout_range: dev(g, l * n * 8, &w("layout_range"))?,
                    combined: dev(g, layout.num_max_tokens * h * 2, &w("combined_x"))?,
                })
            };
            let outs = [out(0)?, out(1)?];
            // The zeroing memsets above run on the legacy stream, asynchronously to the host:
            // finished before any kernel of the PE's stream reads the control block.
            settle_memsets(g, "zeros into the EP control block and outputs")?;
            if !world {
                // The team fields (the rest of the block stays zero): read by every kernel's
                // setup, written before the first launch.
                let mut b = vec![0u8; size_of::<LlCtl>()];
                b[CTL_TEAM..CTL_TEAM + 4].copy_from_slice(&(n as u32).to_le_bytes());
                b[CTL_TEAM + 4..CTL_TEAM + 8].copy_from_slice(&(team.my_pe() as i32).to_le_bytes());
                for (i, &m) in members.iter().enumerate() {
                    let at = CTL_TEAM + 8 + 4 * i;
                    b[at..at + 4].copy_from_slice(&(m as i32).to_le_bytes());
                }
                ctl.write(&b)?;
            }
            Ok((ctl, mask_dev, outs))
        })();
        // Every PE's outcome; on any failure every PE frees the allocation (collective, as
        // the allocation was).
        let local = crate::pe::exchange_status(pe.boot(), &group, "set up its EP buffer", &local)
            .and(local);
        let (ctl, mask_dev, outs) = match local {
            Ok(x) => x,
            Err(e) => {
                let _ = g.free(base);
                return Err(e);
            }
        };
        pe.barrier_all()?;
        Ok(GpuBuffer {
            g,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            cfg,
            layout,
            module,
            names,
            funcs,
            stage: needs_stage_in(g.my_pe(), g.peer_table(), Some(&members)),
            grid: share,
            base,
            ctl,
            mask_dev,
            masked: vec![false; n],
            members,
            team_rank: team.my_pe(),
            shrink: false,
            shrink_timeout: None,
            guard_shrink: None,
            kernel_marks: false,
            outs,
            book: Book::default(),
            hook_args: [None, None],
            mapped: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Collective: waits for the stream and frees the GPU heap allocation.
    pub fn destroy(self) -> Result<()> {
        let q = self.g.sync("ep::GpuBuffer::destroy");
        let r = self.g.free(self.base);
        q.and(r)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The buffer's offset in the symmetric heap (the layout's offsets are from it).
    pub fn heap_offset(&self) -> usize {
        self.base.offset()
    }
    /// Number of LL calls made so far (the next call's number).
    pub fn calls(&self) -> u64 {
        self.book.seq
    }
    /// Blocks per launch.
    pub fn grid(&self) -> u32 {
        self.grid
    }
    pub fn num_local_experts(&self) -> usize {
        self.layout.num_local_experts
    }
    /// The module instance the kernels come from (kept loaded while the buffer lives).
    pub fn module(&self) -> &Module {
        &self.module
    }

    fn base_args(&self) -> ArgBase {
        self.base_args_with(self.shrink, self.shrink_timeout)
    }

    fn base_args_with(&self, shrink: bool, shrink_timeout: Option<std::time::Duration>) -> ArgBase {
        ArgBase {
            buf: self.base.offset() as u64,
            ctl: self.ctl.ptr(),
            mask: self.mask_dev.ptr(),
            num_max_tokens: self.cfg.num_max_dispatch_tokens_per_rank as u32,
            num_experts: self.cfg.num_experts as u32,
            num_topk: self.cfg.num_topk as u32,
            fp8: self.cfg.use_fp8,
            round_scale: self.cfg.round_scale,
            shrink: shrink.then(|| {
                shrink_timeout.map_or(0, |d| d.as_millis().clamp(1, u32::MAX as u128) as u32)
            }),
        }
    }

    fn launch(&self, kind: Kernel, args: &LlArgs) -> Result<()> {
        self.g.enter()?;
        let mut a = *args;
        let mut params = [(&mut a as *mut LlArgs).cast::<c_void>()];
        // SAFETY: funcs[kind] is a kernel of this buffer's module (loaded in this PE's
        // context, which is current), and every EP kernel takes one ep_ll_args_t by value,
        // which LlArgs mirrors (sizes and offsets checked at compile time and against the
        // C++ compiler); the device addresses in it are this buffer's allocations or the
        // caller's tensors (documented contract); the driver copies the parameters at
        // launch. Block = EP_LL_THREADS, no dynamic shared memory, as ep_ll.cu requires.
        let rc = unsafe {
            sys::cuLaunchKernel(
                self.funcs[kind as usize],
                self.grid,
                1,
                1,
                THREADS,
                1,
                1,
                0,
                self.g.stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        ck(rc, "cuLaunchKernel", || {
            format!(
                "PE {}: launching {} (grid {} block {THREADS})",
                self.g.my_pe(),
                self.names[kind as usize],
                self.grid
            )
        })
    }

    // ------------------------------------------------------------ dead-PE mask

    /// Shrink mode, as [`crate::ep::Buffer::set_shrink`] (DeepEP's `enable_shrink`): a
    /// kernel whose wait for a PE times out masks that PE in the device mask and the call
    /// goes on without it, instead of trapping (which would end the context). Takes effect
    /// from the next call.
    pub fn set_shrink(&mut self, on: bool) {
        self.shrink = on;
        self.kernel_marks |= on;
    }
    pub fn shrink(&self) -> bool {
        self.shrink
    }
    /// In shrink mode, how long a kernel waits for a PE before it gives up on it (None, the
    /// default: the PE's timeout, `RSHMEM_TIMEOUT_MS`).
    pub fn set_shrink_timeout(&mut self, t: Option<std::time::Duration>) {
        self.shrink_timeout = t;
    }

    /// Masks (or unmasks) PE `pe`, as [`crate::ep::Buffer::update_mask`]. Waits for the
    /// stream first (the mask is device memory that in-flight kernels read; in shrink mode
    /// they also write it).
    pub fn update_mask(&mut self, pe: usize, masked: bool) -> Result<()> {
        if pe >= self.masked.len() || pe == self.team_rank {
            return Err(Error::InvalidArgument(format!(
                "ep mask: PE {pe} is not another PE of the {}-PE team",
                self.masked.len()
            )));
        }
        self.read_mask()?;
        self.masked[pe] = masked;
        self.write_mask()
    }
    /// Which PEs are masked: by [`GpuBuffer::update_mask`], or by the kernels in shrink
    /// mode. Waits for the stream (the kernels' entries are read back from the device).
    pub fn query_mask(&mut self) -> Result<Vec<bool>> {
        self.read_mask()?;
        Ok(self.masked.clone())
    }
    pub fn clean_mask(&mut self) -> Result<()> {
        self.masked.iter_mut().for_each(|m| *m = false);
        self.write_mask()?;
        self.kernel_marks = self.shrink;
        Ok(())
    }
    /// Folds the entries the kernels wrote (shrink mode) into `masked`.
    fn read_mask(&mut self) -> Result<()> {
        if !self.kernel_marks {
            return Ok(()); // only the host wrote the mask since it was last cleaned
        }
        self.g.sync("ep mask query")?;
        let mut b = vec![0u8; self.masked.len() * 4];
        self.mask_dev.read(&mut b)?;
        for (m, w) in self.masked.iter_mut().zip(b.chunks_exact(4)) {
            *m |= i32::from_le_bytes([w[0], w[1], w[2], w[3]]) != 0;
        }
        Ok(())
    }
    fn write_mask(&self) -> Result<()> {
        self.g.sync("ep mask update")?;
        let b: Vec<u8> = self
            .masked
            .iter()
            .flat_map(|&m| (m as i32).to_le_bytes())
            .collect();
        self.mask_dev.write(&b)
    }

    // ------------------------------------------------------------ calls

    fn check_ptr(what: &str, p: u64, align: u64, needed: bool) -> Result<()> {
        // (A bad pointer poisons its call on every PE: see low_latency_dispatch.)
        if needed && p == 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} is a null device pointer"
            )));
        }
        if p % align != 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} ({p:#x}) must be {align}-byte aligned"
            )));
        }
        Ok(())
    }

    /// `what` at `p` must hold `len` bytes (`shape`, for the error): a device tensor
    /// shorter than its shape would fault the kernels (a sticky CUDA error that ends the
    /// process's context), so it is refused as a bad pointer is. Memory the driver cannot
    /// describe is not checked ([`super::driver::mapped_through`]).
    ///
    /// A range found across several chunks is remembered (the walk costs one driver call
    /// per chunk, tens for a large expert-output tensor in 20 MiB chunks, on every LL
    /// call), and later only its last byte is looked up; a one-chunk range (an ordinary
    /// allocation) is looked up each time. A hole opened inside a remembered range (one
    /// chunk in the middle unmapped, its ends kept) is not noticed.
    fn check_len(&self, what: &str, p: u64, len: u64, shape: &str) -> Result<()> {
        if p == 0 || len == 0 {
            return Ok(());
        }
        let end = p.saturating_add(len);
        let mut kept = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        self.g.enter()?;
        if let Some(i) = kept.iter().position(|&(a, b)| a <= p && end <= b) {
            // One lookup at the last byte: a tail unmapped since (a VMM range shrunk by an
            // allocator's empty_cache) is walked again.
            if super::driver::mapped_through(end - 1, 1) == Ok(1) {
                return Ok(());
            }
            kept.remove(i);
        }
        match super::driver::mapped_through(p, len) {
            Ok(chunks) => {
                if chunks > 1 {
                    if kept.len() == RANGES_KEPT {
                        kept.remove(0);
                    }
                    kept.push((p, end));
                }
                Ok(())
            }
            Err(at) => Err(Error::InvalidArgument(format!(
                "{what} ({p:#x}) must hold {len} bytes ({shape}), but only {} bytes from \
                 it on are allocated device memory",
                at.saturating_sub(p)
            ))),
        }
    }

    /// LL dispatch of `x` (device `bf16 [T, H]`) routed by `topk_idx` (device `[T, K]`,
    /// int64 or int32; -1 = slot unused), T = `num_tokens`. Enqueues the send kernel and,
    /// without a receive hook, the receive kernel on the PE's stream; nothing waits on the
    /// host. The outputs are this buffer's (set `call % 2`): read them with
    /// [`GpuBuffer::read_dispatch`] or use [`GpuBuffer::dispatch_outputs`] on the device.
    /// T > N and expert ids outside [-1, E) fail the call on every PE (the kernels send
    /// poisoned counts); the error is returned by `read_dispatch`.
    pub fn low_latency_dispatch(
        &mut self,
        x: u64,
        topk_idx: u64,
        idx_type: IdxType,
        num_tokens: usize,
        return_recv_hook: bool,
    ) -> Result<GpuHandle> {
        let op = "low_latency_dispatch";
        // A bad pointer fails the call on every PE, as the CPU's input faults do: the
        // kernels run with the shape fault, no inputs and no tokens (before 2026-12-07 it
        // was refused here alone, and the peers' receive kernels waited for this PE's
        // counts until their timeout trapped).
        let bad_ptr = Self::check_ptr("low_latency_dispatch: x", x, 16, num_tokens > 0)
            .and_then(|()| {
                Self::check_ptr(
                    "low_latency_dispatch: topk_idx",
                    topk_idx,
                    idx_type.bytes(),
                    num_tokens > 0,
                )
            })
            .and_then(|()| {
                let (t, h, k) = (
                    num_tokens as u64,
                    self.cfg.hidden as u64,
                    self.cfg.num_topk as u64,
                );
                self.check_len(
                    "low_latency_dispatch: x",
                    x,
                    t.saturating_mul(h).saturating_mul(2),
                    &format!("[{t}, {h}] bf16"),
                )?;
                self.check_len(
                    "low_latency_dispatch: topk_idx",
                    topk_idx,
                    t.saturating_mul(k).saturating_mul(idx_type.bytes()),
                    &format!("[{t}, {k}] {}", idx_type.name()),
                )
            })
            .err();
        let (seq, set) = self.book.start(op)?;
        let n = self.cfg.num_max_dispatch_tokens_per_rank;
        let (x, topk_idx, t_launch) = match bad_ptr {
            Some(_) => (0, 0, 0),
            None => (x, topk_idx, num_tokens),
        };
        let (fault, err) = if let Some(e) = bad_ptr {
            (Fault::Shape.encode(), Some(invalid_text(e)))
        } else if num_tokens > n {
            (
                Fault::TooManyTokens(num_tokens as u64).encode(),
                Some(format!(
                    "{op}: {num_tokens} tokens exceed num_max_dispatch_tokens_per_rank = {n} \
                     (the limit set in ep::Config; create the buffer with a larger value)"
                )),
            )
        } else {
            (0, None)
        };
        let args = self.base_args().dispatch(
            set,
            &self.outs[set].ptrs(),
            x,
            topk_idx,
            idx_type,
            t_launch,
            fault,
        );
        if self.stage {
            self.launch(Kernel::DispatchStage, &args)?;
        }
        self.launch(Kernel::DispatchSend, &args)?;
        if !return_recv_hook {
            self.launch(Kernel::DispatchRecv, &args)?;
        }
        self.hook_args[set] = Some(args);
        self.book
            .record(Op::Dispatch, seq, num_tokens, err, return_recv_hook);
        Ok(GpuHandle {
            call: seq,
            num_tokens,
            hook_pending: return_recv_hook,
        })
    }

    /// The receive hook of a dispatch made with `return_recv_hook`: enqueues its receive
    /// kernel (no host wait).
    pub fn recv_hook(&mut self, h: &mut GpuHandle) -> Result<()> {
        self.run_hook(h.call, Kernel::DispatchRecv, &mut h.hook_pending)
    }

    /// The receive hook of a combine made with `return_recv_hook`.
    pub fn combine_recv_hook(&mut self, c: &mut GpuCombine) -> Result<()> {
        self.run_hook(c.call, Kernel::CombineRecv, &mut c.hook_pending)
    }

    fn run_hook(&mut self, call: u64, kind: Kernel, flag: &mut bool) -> Result<()> {
        if !*flag {
            return Err(Error::InvalidArgument(format!(
                "receive hook of LL call #{call}: already run (or the call was made without \
                 return_recv_hook)"
            )));
        }
        let set = self.book.hook(call, kind)?;
        let args = self.hook_args[set].ok_or_else(|| {
            Error::InvalidArgument(format!("receive hook of LL call #{call}: no arguments"))
        })?;
        self.launch(kind, &args)?;
        *flag = false;
        Ok(())
    }

    /// Device addresses of the outputs a dispatch wrote (valid until the next dispatch on
    /// the same set): `recv_x [L, R*N, H]` (e4m3 or bf16), `recv_scales`, `recv_count`,
    /// `src_info`, `recv_topk_slot`, `layout_range`.
    pub fn dispatch_outputs(&self, h: &GpuHandle) -> Result<OutPtrs> {
        let set = self.book.handle_set(h.call, "dispatch_outputs")?;
        Ok(self.outs[set].ptrs())
    }

    /// Device address of the zero-copy combine buffer for the next combine (DeepEP's
    /// `get_next_low_latency_combine_buffer`): `bf16 [L, R*N, H]`, rows laid out as the
    /// handle's dispatch delivered them. Write the expert outputs there, then call
    /// [`GpuBuffer::low_latency_combine`] with `expert_out = None`.
    ///
    /// With a peer behind a queue (IBGDA, proxy) it also enqueues a guard on the stream:
    /// the combine send kernel with `EP_LL_CREDITS_ONLY`, which waits (bounded, as every
    /// send kernel does) until every unmasked PE has received the call two before on this
    /// set. That call's rows went out as RDMA WRITEs straight from these rows, and with
    /// receive hooks deferred across calls a NIC may still be reading them when the caller's
    /// expert kernel writes the new ones; work the caller enqueues after this call on the
    /// same stream now waits for those reads. Over p2p the combine kernel stores the rows
    /// itself before it returns, so there is no guard.
    pub fn get_next_low_latency_combine_buffer(&mut self, h: &GpuHandle) -> Result<u64> {
        self.book
            .handle_set(h.call, "get_next_low_latency_combine_buffer")?;
        let set = self.book.next_zero_copy()?;
        if self.stage {
            let mut args = self.base_args().common(set, IdxType::I64, 0, 0);
            args.flags |= FLAG_CREDITS_ONLY;
            self.launch(Kernel::CombineSend, &args)?;
            self.guard_shrink = Some((self.book.seq, self.shrink, self.shrink_timeout));
        }
        Ok(self.g.heap_base() + self.zero_copy_offset(set) as u64)
    }

    /// Heap offset of set `set`'s zero-copy combine buffer.
    pub fn zero_copy_offset(&self, set: usize) -> usize {
        self.base.offset() + self.layout.combine_send_row(set, 0, 0)
    }

    /// LL combine: `expert_out` = device `bf16 [L, R*N, H]` in the layout of `h`'s
    /// dispatch (None: the zero-copy buffer), `topk_idx` and `topk_weights` (device f32
    /// `[T, K]`) of this PE's tokens (T = the handle's). Enqueues the kernels; the result
    /// `[T, H]` bf16 is read with [`GpuBuffer::read_combined`].
    pub fn low_latency_combine(
        &mut self,
        expert_out: Option<u64>,
        topk_idx: u64,
        idx_type: IdxType,
        topk_weights: u64,
        h: &GpuHandle,
        return_recv_hook: bool,
    ) -> Result<GpuCombine> {
        let op = "low_latency_combine";
        let t = h.num_tokens.min(self.cfg.num_max_dispatch_tokens_per_rank);
        // As in dispatch: a bad pointer poisons the call on every PE (checked after the
        // local refusal below, which starts no call and can be retried).
        let bad_ptr = Self::check_ptr(
            "low_latency_combine: topk_idx",
            topk_idx,
            idx_type.bytes(),
            t > 0,
        )
        .and_then(|()| Self::check_ptr("low_latency_combine: topk_weights", topk_weights, 4, t > 0))
        .and_then(|()| match expert_out {
            Some(x) => Self::check_ptr("low_latency_combine: expert outputs", x, 16, true),
            None => Ok(()),
        })
        .and_then(|()| {
            let (t, k) = (t as u64, self.cfg.num_topk as u64);
            self.check_len(
                "low_latency_combine: topk_idx",
                topk_idx,
                t * k * idx_type.bytes(),
                &format!("[{t}, {k}] {}", idx_type.name()),
            )?;
            self.check_len(
                "low_latency_combine: topk_weights",
                topk_weights,
                t * k * 4,
                &format!("[{t}, {k}] f32"),
            )?;
            // DeepEP's expert outputs: [L, R * N, H] bf16, read at any row a dispatch
            // may have filled.
            let (l, rows, h) = (
                self.num_local_experts() as u64,
                (self.layout.num_pes * self.layout.num_max_tokens) as u64,
                self.cfg.hidden as u64,
            );
            match expert_out {
                Some(x) => self.check_len(
                    "low_latency_combine: expert outputs",
                    x,
                    l * rows * h * 2,
                    &format!("[{l}, {rows}, {h}] bf16"),
                ),
                None => Ok(()),
            }
        })
        .err();
        if h.hook_pending {
            return Err(Error::InvalidArgument(format!(
                "{op}: dispatch #{} has not been received yet: run its receive hook first",
                h.call
            )));
        }
        let (seq, set) = self.book.start(op)?;
        let (handle_set, err) = self.book.combine_fault(
            seq,
            h.call,
            h.num_tokens,
            self.cfg.num_max_dispatch_tokens_per_rank,
            expert_out.is_none(),
        );
        let zero_copy = self.g.heap_base() + self.zero_copy_offset(set) as u64;
        // The combine kernels read no input with a fault and no tokens (combine_recv
        // reads topk_idx and the weights even then: t = 0).
        let (x, topk_idx, topk_weights, t) = match (&bad_ptr, expert_out) {
            (Some(_), _) => (zero_copy, 0, 0, 0),
            (None, x) => (x.unwrap_or(zero_copy), topk_idx, topk_weights, t),
        };
        let (fault, err) = match (bad_ptr, err) {
            (Some(e), _) => (Fault::Shape.encode(), Some(invalid_text(e))),
            (None, Some(e)) => (Fault::Handle.encode(), Some(e)),
            (None, None) => (0, None),
        };
        let base = match self.guard_shrink.take() {
            Some((call, shrink, timeout)) if call == seq => self.base_args_with(shrink, timeout),
            _ => self.base_args(),
        };
        let args = base.combine(
            set,
            &self.outs[handle_set].ptrs(),
            h.call,
            self.outs[set].combined.ptr(),
            x,
            topk_idx,
            idx_type,
            topk_weights,
            t,
            fault,
        );
        self.launch(Kernel::CombineSend, &args)?;
        if !return_recv_hook {
            self.launch(Kernel::CombineRecv, &args)?;
        }
        self.hook_args[set] = Some(args);
        self.book.record(Op::Combine, seq, t, err, return_recv_hook);
        Ok(GpuCombine {
            call: seq,
            num_tokens: t,
            hook_pending: return_recv_hook,
        })
    }

    // ------------------------------------------------------------ results (host waits)

    /// Waits for the stream and returns the status of `call` (on its set) as an error, and
    /// checks that the device's call counter agrees with the host's.
    fn finish(&self, call: u64, what: &str) -> Result<()> {
        self.g.sync(what)?;
        let mut b = vec![0u8; offset_of!(LlCtl, grid_done)];
        self.ctl.read(&mut b)?;
        let set = (call % 2) as usize;
        // The record of this call's kind: a combine's failure never hides a dispatch's.
        let kind = usize::from(what.ends_with("combine"));
        let calls = u64::from_le_bytes(b[set * 8..set * 8 + 8].try_into().unwrap_or([0; 8]));
        if calls < call / 2 + 1 {
            return Err(Error::Verification(format!(
                "{what}: LL call #{call} has not been received on the device (buffer set {set} \
                 counted {calls} calls): was its receive hook run?"
            )));
        }
        let at = offset_of!(LlCtl, status) + (set * 2 + kind) * size_of::<LlStatus>();
        let st = parse_status(&b[at..at + size_of::<LlStatus>()]);
        // The kernels record team ranks; errors name world PEs.
        let mut st = st;
        st.peer = self
            .members
            .get(st.peer.max(0) as usize)
            .map_or(st.peer, |&w| w as i32);
        match status_error(&st, &self.cfg, self.g.my_pe(), call) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for the stream and copies the outputs of dispatch `h` to the host, as the CPU
    /// implementation returns them (the handle inside is for checks only). Fails as the
    /// CPU does when the call failed on any PE.
    pub fn read_dispatch(&self, h: &GpuHandle) -> Result<DispatchOutput> {
        let set = self.book.handle_set(h.call, "read_dispatch")?;
        if h.hook_pending {
            return Err(Error::InvalidArgument(format!(
                "read_dispatch: dispatch #{} has not been received yet: run its receive hook",
                h.call
            )));
        }
        let r = self.finish(h.call, "low_latency_dispatch");
        if let Some(Rec { err: Some(e), .. }) = &self.book.dispatch[set] {
            return Err(Error::InvalidArgument(e.clone()));
        }
        r?;
        let o = &self.outs[set];
        let (l, n) = (self.layout.num_local_experts, self.members.len());
        let rows = n * self.layout.num_max_tokens;
        let h_ = self.cfg.hidden;
        let recv_x = if self.cfg.use_fp8 {
            let mut data = vec![0u8; l * rows * h_];
            o.recv_x.read(&mut data)?;
            let mut sb = vec![0u8; l * rows * (h_ / 128) * 4];
            if let Some(s) = &o.recv_scales {
                s.read(&mut sb)?;
            }
            RecvX::Fp8 {
                data,
                scales: sb
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            }
        } else {
            let mut b = vec![0u8; l * rows * h_ * 2];
            o.recv_x.read(&mut b)?;
            RecvX::Bf16(
                b.chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            )
        };
        let i32s = |d: &DevBuf, len: usize| -> Result<Vec<i32>> {
            let mut b = vec![0u8; len * 4];
            d.read(&mut b)?;
            Ok(b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        let recv_count = i32s(&o.recv_count, l)?;
        let src_info = i32s(&o.src_info, l * rows)?;
        let row_k = i32s(&o.recv_topk_slot, l * rows)?;
        let mut b = vec![0u8; l * n * 8];
        o.layout_range.read(&mut b)?;
        let layout_range: Vec<i64> = b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        Ok(DispatchOutput {
            recv_x,
            recv_count: recv_count.clone(),
            src_info: src_info.clone(),
            layout_range: layout_range.clone(),
            handle: Handle::detached(
                h.call,
                h.num_tokens,
                &self.cfg,
                src_info,
                layout_range,
                recv_count,
                row_k,
            ),
        })
    }

    /// Waits for the stream and copies combine `c`'s output `[T, H]` to the host.
    pub fn read_combined(&self, c: &GpuCombine) -> Result<Vec<bf16>> {
        let set = (c.call % 2) as usize;
        self.book.combine_rec(c.call)?;
        if c.hook_pending {
            return Err(Error::InvalidArgument(format!(
                "read_combined: combine #{} has not been received yet: run its receive hook",
                c.call
            )));
        }
        let r = self.finish(c.call, "low_latency_combine");
        if let Some(e) = &self.book.combine_rec(c.call)?.err {
            return Err(Error::InvalidArgument(e.clone()));
        }
        r?;
        let mut b = vec![0u8; c.num_tokens * self.cfg.hidden * 2];
        if !b.is_empty() {
            self.outs[set].combined.read(&mut b)?;
        }
        Ok(b.chunks_exact(2)
            .map(|x| bf16::from_bits(u16::from_le_bytes([x[0], x[1]])))
            .collect())
    }

    /// Device address of combine `c`'s output `[T, H]` bf16 (valid until the next combine
    /// on the same set).
    pub fn combined_ptr(&self, c: &GpuCombine) -> u64 {
        self.outs[(c.call % 2) as usize].combined.ptr()
    }

    // ------------------------------------------------------------ CUDA graphs

    /// Captures the LL calls `f` makes into a CUDA graph (stream capture of the PE's
    /// stream, thread-local mode): nothing runs now, and the buffer's call count is left
    /// as it was. `f` must make an even number of calls (so the buffer sets alternate the
    /// same way on every replay) and run every receive hook it starts. The kernels take
    /// their tags from device memory, so each replay is a fresh set of LL calls; inputs
    /// are read from the same device addresses on every replay.
    pub fn capture<R>(&mut self, f: impl FnOnce(&mut Self) -> Result<R>) -> Result<(EpGraph, R)> {
        let saved = self.book.begin_capture()?;
        let stream = self.g.stream();
        self.g.enter()?;
        // SAFETY: the PE's stream, in the current context; thread-local mode, so other PE
        // threads' synchronous calls are not affected.
        ck(
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    stream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "cuStreamBeginCapture",
            || format!("PE {}: capturing EP calls", self.g.my_pe()),
        )?;
        let r = f(self);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above on the same stream; valid out-pointer.
        let end = ck(
            unsafe { sys::cuStreamEndCapture(stream, &mut graph) },
            "cuStreamEndCapture",
            || format!("PE {}: capturing EP calls", self.g.my_pe()),
        );
        // Restore the host's view (nothing ran) and check what was captured.
        let captured = self.book.end_capture(saved);
        let destroy_graph = |g: sys::CUgraph| {
            if !g.is_null() {
                // SAFETY: a graph returned by cuStreamEndCapture, destroyed once.
                unsafe { sys::cuGraphDestroy(g) };
            }
        };
        let value = match r.and_then(|v| end.map(|()| v)) {
            Ok(v) => v,
            Err(e) => {
                destroy_graph(graph);
                return Err(e);
            }
        };
        let (calls, parity, recorded) = match captured {
            Ok(c) => c,
            Err(e) => {
                destroy_graph(graph);
                return Err(e);
            }
        };
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: a valid captured graph; valid out-pointer.
        if let Err(e) = ck(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) },
            "cuGraphInstantiateWithFlags",
            || format!("PE {}: instantiating the EP graph", self.g.my_pe()),
        ) {
            destroy_graph(graph);
            return Err(e);
        }
        // Uploaded now, on the PE's stream, so the first replay is not also the upload
        // (a timed first replay would otherwise measure it).
        // SAFETY: an instantiated graph of this context; the PE's stream.
        if let Err(e) = ck(
            unsafe { sys::cuGraphUpload(exec, stream) },
            "cuGraphUpload",
            || format!("PE {}: uploading the EP graph", self.g.my_pe()),
        ) {
            // SAFETY: instantiated above, destroyed once.
            unsafe { sys::cuGraphExecDestroy(exec) };
            destroy_graph(graph);
            return Err(e);
        }
        Ok((
            EpGraph {
                graph,
                exec,
                ctx: self.g.ctx().clone(),
                buffer_id: self.id,
                calls,
                parity,
                recorded,
            },
            value,
        ))
    }

    /// Launches a captured graph on the PE's stream (no host wait): its LL calls become
    /// this buffer's next calls. Returns them, for `read_dispatch` / `read_combined`.
    pub fn replay(&mut self, graph: &EpGraph) -> Result<Vec<Replayed>> {
        if graph.buffer_id != self.id {
            return Err(Error::InvalidArgument(
                "ep graph replay: the graph was captured on another buffer".into(),
            ));
        }
        self.book.can_replay(graph.parity)?;
        self.g.enter()?;
        // SAFETY: an instantiated graph of this context, launched on the PE's stream.
        ck(
            unsafe { sys::cuGraphLaunch(graph.exec, self.g.stream()) },
            "cuGraphLaunch",
            || format!("PE {}: replaying the EP graph", self.g.my_pe()),
        )?;
        let out = self.book.replayed(graph.calls, &graph.recorded);
        Ok(out)
    }
}

fn parse_status(b: &[u8]) -> LlStatus {
    let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let w = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
    LlStatus {
        claim: u(offset_of!(LlStatus, claim)),
        commit: u(offset_of!(LlStatus, commit)),
        kind: w(offset_of!(LlStatus, kind)),
        peer: w(offset_of!(LlStatus, peer)) as i32,
        value: u(offset_of!(LlStatus, value)),
        expected: u(offset_of!(LlStatus, expected)),
        reserved: u(offset_of!(LlStatus, reserved)),
    }
}

/// Bytes of an `LlArgs` as the kernel receives them (for tests of the packing).
pub fn args_bytes(a: &LlArgs) -> [u8; 128] {
    let mut b = [0u8; 128];
    let u = [
        a.buf,
        a.ctl,
        a.mask,
        a.x,
        a.topk_idx,
        a.topk_weights,
        a.out,
        a.recv_scales,
        a.recv_count,
        a.src_info,
        a.recv_topk_slot,
        a.layout_range,
    ];
    for (i, v) in u.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    let w = [
        a.num_tokens,
        a.num_max_tokens,
        a.num_experts,
        a.num_topk,
        a.set,
        a.flags,
        a.fault,
        a.shrink_timeout_ms,
    ];
    for (i, v) in w.iter().enumerate() {
        b[96 + i * 4..100 + i * 4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// The text of an input error without its kind's prefix (the status error adds its own).
fn invalid_text(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => m,
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(h: usize, fp8: bool) -> Config {
        Config {
            num_max_dispatch_tokens_per_rank: 128,
            hidden: h,
            num_experts: 288,
            num_topk: 8,
            use_fp8: fp8,
            round_scale: false,
        }
    }

    #[test]
    fn stage_only_when_a_peer_is_not_mapped() {
        use crate::gpu::state::{DevicePeer, TRANSPORT_IBGDA, TRANSPORT_NONE, TRANSPORT_P2P};
        let peer = |transport| DevicePeer {
            transport,
            ..Default::default()
        };
        let p2p = [
            peer(TRANSPORT_P2P),
            peer(TRANSPORT_P2P),
            peer(TRANSPORT_P2P),
        ];
        assert!(!needs_stage(1, &p2p));
        // The PE's own entry never decides: it is never a destination over the network.
        let mut own = p2p;
        own[1] = peer(TRANSPORT_NONE);
        assert!(!needs_stage(1, &own));
        let mut one = p2p;
        one[2] = peer(TRANSPORT_IBGDA);
        assert!(needs_stage(0, &one));
        assert!(needs_stage(1, &one));
        assert!(!needs_stage(2, &one));
        assert!(!needs_stage(0, &[]));
    }

    #[test]
    fn a_member_without_transport_is_refused() {
        use crate::gpu::state::{DevicePeer, TRANSPORT_IBGDA, TRANSPORT_NONE, TRANSPORT_P2P};
        let peer = |transport| DevicePeer {
            transport,
            ..Default::default()
        };
        let peers = [
            peer(TRANSPORT_P2P),
            peer(TRANSPORT_NONE),
            peer(TRANSPORT_IBGDA),
            peer(TRANSPORT_NONE),
        ];
        // The PE's own entry and non-members do not count.
        assert!(unreachable_members("t", 1, &peers, &[0, 1, 2], "c").is_ok());
        assert!(unreachable_members("t", 0, &peers, &[0, 2], "c").is_ok());
        let e = unreachable_members("t", 0, &peers, &[0, 1, 2, 3], "the cure")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t: GPU PE 0 has no transport to PE(s) [1, 3] (the p2p transport")
                && e.ends_with("P2P access): the cure"),
            "{e}"
        );
        // A member past the table (a bad team) is refused too.
        assert!(unreachable_members("t", 0, &peers, &[0, 7], "c").is_err());
    }

    #[test]
    fn kernel_names_follow_ep_ll_cu() {
        assert_eq!(
            kernel_name(Kernel::DispatchSend, 7168, true).unwrap(),
            "ep_ll_dispatch_send_h7168_fp8"
        );
        assert_eq!(
            kernel_name(Kernel::DispatchRecv, 2048, false).unwrap(),
            "ep_ll_dispatch_recv_h2048_bf16"
        );
        assert_eq!(
            kernel_name(Kernel::CombineSend, 2560, true).unwrap(),
            "ep_ll_combine_send_h2560"
        );
        assert_eq!(
            kernel_name(Kernel::CombineRecv, 8192, false).unwrap(),
            "ep_ll_combine_recv_h8192"
        );
        assert_eq!(
            kernel_name(Kernel::DispatchStage, 4096, true).unwrap(),
            "ep_ll_dispatch_stage_h4096_fp8"
        );
        // Every instance exists in the committed PTX.
        let ptx = crate::gpu::module::ptx_source(MODULE, None).unwrap();
        let mut n = 0;
        for h in HIDDEN_SIZES {
            for fp8 in [true, false] {
                for k in KERNELS {
                    let name = kernel_name(k, h, fp8).unwrap();
                    assert!(
                        ptx.contains(&format!(".entry {name}(")),
                        "{name} missing from ptx/ep_ll.ptx"
                    );
                    n += 1;
                }
            }
        }
        assert_eq!(n, 60);
        // Per hidden size: stage, send and receive per format, and the two combine kernels.
        assert_eq!(ptx.matches(".entry ep_ll_").count(), 48);
    }

    #[test]
    fn unsupported_configs_are_refused_clearly() {
        let e = kernel_name(Kernel::DispatchSend, 3072, true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("hidden size 3072 has no GPU kernel")
                && e.contains("2048, 2560, 4096, 5120, 7168, 8192"),
            "{e}"
        );
        let e = check_config(&cfg(1024, true), 8).unwrap_err().to_string();
        assert!(e.contains("hidden size 1024"), "{e}");
        // Config::validate's refusals come first, with its messages.
        let mut c = cfg(7168, true);
        c.num_topk = 12;
        let e = check_config(&c, 8).unwrap_err().to_string();
        assert!(e.contains("num_topk (12) must be in 1..=11"), "{e}");
        let mut c = cfg(7168, true);
        c.num_experts = 100;
        let e = check_config(&c, 8).unwrap_err().to_string();
        assert!(
            e.contains("num_experts (100) must be a positive multiple of the team size (8)"),
            "{e}"
        );
        let mut c = cfg(7168, true);
        c.num_experts = 2048 * 2;
        let e = check_config(&c, 2).unwrap_err().to_string();
        assert!(
            e.contains("2048 local experts") && e.contains("at most 1024"),
            "{e}"
        );
        let mut c = cfg(7168, true);
        c.num_experts = 2048;
        let e = check_config(&c, 2048).unwrap_err().to_string();
        assert!(e.contains("2048 PEs") && e.contains("at most 1024"), "{e}");
        let l = check_config(&cfg(7168, true), 8).unwrap();
        assert_eq!(l, Layout::new(&cfg(7168, true), 8).unwrap());
    }

    #[test]
    fn dispatch_and_combine_arguments_are_packed_as_ll_cuh_says() {
        let base = ArgBase {
            buf: 0x1_0000,
            ctl: 0xc000,
            mask: 0xa000,
            num_max_tokens: 128,
            num_experts: 288,
            num_topk: 8,
            fp8: true,
            round_scale: true,
            shrink: None,
        };
        let out = OutPtrs {
            recv_x: 0x10,
            recv_scales: 0x20,
            recv_count: 0x30,
            src_info: 0x40,
            recv_topk_slot: 0x50,
            layout_range: 0x60,
            combined: 0x70,
        };
        let d = base.dispatch(1, &out, 0x100, 0x200, IdxType::I32, 100, 0);
        let b = args_bytes(&d);
        let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let w = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let off = |f: &str| {
            layout_table()
                .into_iter()
                .find(|(k, _)| *k == format!("ep_ll_args_t.{f}"))
                .unwrap()
                .1
        };
        assert_eq!(u(off("buf")), 0x1_0000);
        assert_eq!(u(off("ctl")), 0xc000);
        assert_eq!(u(off("mask")), 0xa000);
        assert_eq!(u(off("x")), 0x100);
        assert_eq!(u(off("topk_idx")), 0x200);
        assert_eq!(u(off("topk_weights")), 0);
        assert_eq!(u(off("out")), 0x10);
        assert_eq!(u(off("recv_scales")), 0x20);
        assert_eq!(u(off("recv_count")), 0x30);
        assert_eq!(u(off("src_info")), 0x40);
        assert_eq!(u(off("recv_topk_slot")), 0x50);
        assert_eq!(u(off("layout_range")), 0x60);
        assert_eq!(w(off("num_tokens")), 100);
        assert_eq!(w(off("num_max_tokens")), 128);
        assert_eq!(w(off("num_experts")), 288);
        assert_eq!(w(off("num_topk")), 8);
        assert_eq!(w(off("set")), 1);
        assert_eq!(
            w(off("flags")),
            FLAG_IDX_I32 | FLAG_ROUND_SCALE | FLAG_FP8_BUFFER
        );
        assert_eq!(w(off("fault")), 0);
        assert_eq!(w(off("shrink_timeout_ms")), 0);
        // The struct's own bytes are these (repr(C), little-endian).
        // SAFETY: LlArgs is repr(C) plain data of exactly 128 bytes without padding.
        let raw: [u8; 128] = unsafe { std::mem::transmute(d) };
        assert_eq!(raw, b);

        // BF16 buffer, int64 ids, T > N: no scales pointer, the CPU's fault word.
        let bb = ArgBase {
            fp8: false,
            round_scale: false,
            ..base
        };
        let f = Fault::TooManyTokens(200).encode();
        assert_eq!(f, (1 << 31) | (1 << 24) | 200);
        let d = bb.dispatch(0, &out, 0x100, 0x200, IdxType::I64, 200, f);
        assert_eq!(d.recv_scales, 0);
        assert_eq!(d.flags, 0);
        assert_eq!(d.fault, 0x8100_00c8);
        assert_eq!(d.num_tokens, 200);

        // Combine: the handle's outputs, the combined tensor as `out`, weights.
        let c = base.combine(0, &out, 67, 0x900, 0x800, 0x200, IdxType::I64, 0x300, 64, 0);
        assert_eq!(
            (c.x, c.out, c.topk_weights, c.topk_idx),
            (0x800, 0x900, 0x300, 0x200)
        );
        assert_eq!(
            (c.src_info, c.recv_topk_slot, c.layout_range),
            (0x40, 0x50, 0x60)
        );
        assert_eq!((c.recv_count, c.recv_scales), (0, 0));
        // The handle's call (67) mod 64 in bits 24..29.
        assert_eq!(c.flags, FLAG_ROUND_SCALE | FLAG_FP8_BUFFER | 3 << 24);
        assert_eq!((c.num_tokens, c.set), (64, 0));
    }

    #[test]
    fn status_records_become_the_cpu_errors() {
        let c = cfg(7168, true);
        let st = |kind, peer, value, expected, commit| LlStatus {
            claim: commit,
            commit,
            kind,
            peer,
            value,
            expected,
            reserved: 0,
        };
        // Another call's record, or none: no error.
        assert!(status_error(&st(STATUS_DISPATCH_PEER, 1, 0, 0, 5), &c, 0, 3).is_none());
        assert!(status_error(&LlStatus::default(), &c, 0, 0).is_none());
        let bad_id = Fault::BadExpert(3 * 8 + 2).encode();
        let e = status_error(&st(STATUS_DISPATCH_PEER, 2, bad_id, 0, 4), &c, 0, 3).unwrap();
        match &e {
            Error::EpPeerFailed {
                pe,
                op,
                call,
                peer,
                reason,
            } => {
                assert_eq!((*pe, *op, *call, *peer), (0, "low_latency_dispatch", 3, 2));
                assert_eq!(reason, "its topk_idx[3][2] is outside [-1, 288)");
            }
            e => panic!("{e}"),
        }
        let over = Fault::ExpertOverflow(5 * 8 + 1).encode();
        let e = status_error(&st(STATUS_DISPATCH_PEER, 2, over, 0, 4), &c, 0, 3).unwrap();
        assert!(
            e.to_string().contains(
                "its topk_idx[5][1] names an expert 129 times, more rows than \
                 num_max_dispatch_tokens_per_rank = 128 allows"
            ),
            "{e}"
        );
        let t = Fault::TooManyTokens(200).encode();
        let e = status_error(&st(STATUS_DISPATCH_INPUT, 1, t, 0, 1), &c, 1, 0)
            .unwrap()
            .to_string();
        assert!(
            e.contains("low_latency_dispatch (LL call #0) on PE 1: this PE's input is invalid")
                && e.contains(
                    "it passed 200 tokens, more than num_max_dispatch_tokens_per_rank = 128"
                ),
            "{e}"
        );
        let e = status_error(&st(STATUS_COMBINE_ROWS, 3, 7, 9, 2), &c, 0, 1)
            .unwrap()
            .to_string();
        assert!(
            e.contains("low_latency_combine (LL call #1)")
                && e.contains("PE 3 returned 7 rows")
                && e.contains("sent 9 tokens"),
            "{e}"
        );
        let h = Fault::Handle.encode();
        let e = status_error(&st(STATUS_COMBINE_PEER, 1, h, 0, 2), &c, 0, 1)
            .unwrap()
            .to_string();
        assert!(
            e.contains("failed on PE 1") && e.contains("handle of another buffer"),
            "{e}"
        );
        let e = status_error(&st(STATUS_DISPATCH_CORRUPT, 1, 5000, 0, 1), &c, 0, 0)
            .unwrap()
            .to_string();
        assert!(e.contains("announced 5000 tokens"), "{e}");
        let hdr = (128u64 << 32) | u64::from(-1i32 as u32);
        let e = status_error(&st(STATUS_DISPATCH_HEADER, 2, hdr, 0, 3), &c, 1, 2)
            .unwrap()
            .to_string();
        assert_eq!(
            e,
            "data check failed: low_latency_dispatch (LL call #2) on PE 1: PE 2 sent token \
             index 128, top-k slot -1 (N = 128, K = 8)"
        );
        // The record bytes parse at ll.cuh's offsets.
        let mut b = vec![0u8; 48];
        b[8..16].copy_from_slice(&4u64.to_le_bytes());
        b[16..20].copy_from_slice(&STATUS_DISPATCH_PEER.to_le_bytes());
        b[20..24].copy_from_slice(&2i32.to_le_bytes());
        b[24..32].copy_from_slice(&bad_id.to_le_bytes());
        let p = parse_status(&b);
        assert_eq!(
            (p.commit, p.kind, p.peer, p.value),
            (4, STATUS_DISPATCH_PEER, 2, bad_id)
        );
    }

    #[test]
    fn a_third_call_on_a_set_is_refused_before_its_hook() {
        assert!(check_pending(&[None, None], 0, 2, "x").is_ok());
        let e = check_pending(&[Some(0), None], 0, 2, "low_latency_dispatch")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("LL call #0 on buffer set 0 has not been received yet")
                && e.contains("before starting call #2"),
            "{e}"
        );
    }

    /// The host's call bookkeeping, as the GPU buffer uses it: calls alternate sets,
    /// hooks, stale handles, zero-copy requests.
    #[test]
    fn call_book_follows_the_cpu_rules() {
        let mut b = Book::default();
        // dispatch #0 with a hook, dispatch #1 with a hook, a third call is refused.
        assert_eq!(b.start("d").unwrap(), (0, 0));
        b.record(Op::Dispatch, 0, 10, None, true);
        assert_eq!(b.start("d").unwrap(), (1, 1));
        b.record(Op::Dispatch, 1, 12, None, true);
        let e = b.start("low_latency_combine").unwrap_err().to_string();
        assert!(
            e.contains("LL call #0 on buffer set 0 has not been received"),
            "{e}"
        );
        // So is a zero-copy request for that call: its guard would wait for the wrong
        // call's credits.
        let e = b.next_zero_copy().unwrap_err().to_string();
        assert!(
            e.contains("get_next_low_latency_combine_buffer: LL call #0 on buffer set 0"),
            "{e}"
        );
        assert_eq!(b.zero_copy_call, None, "a refused request is not recorded");
        assert_eq!(b.seq, 2, "a refused call does not count");
        // Wrong kind, wrong call, then the right hooks.
        let e = b.hook(0, Kernel::CombineRecv).unwrap_err().to_string();
        assert!(e.contains("that call is not a combine"), "{e}");
        let e = b.hook(2, Kernel::DispatchRecv).unwrap_err().to_string();
        assert!(e.contains("nothing pending"), "{e}");
        assert_eq!(b.hook(0, Kernel::DispatchRecv).unwrap(), 0);
        assert!(b.hook(0, Kernel::DispatchRecv).is_err(), "a hook runs once");
        assert_eq!(b.hook(1, Kernel::DispatchRecv).unwrap(), 1);
        // Combine #2 of dispatch #0 (zero-copy, requested), combine #3 of #1 (not requested).
        assert_eq!(b.handle_set(0, "x").unwrap(), 0);
        assert_eq!(b.next_zero_copy().unwrap(), 0);
        let (seq, set) = b.start("c").unwrap();
        assert_eq!((seq, set), (2, 0));
        assert_eq!(b.combine_fault(seq, 0, 10, 16, true), (0, None));
        b.record(Op::Combine, seq, 10, None, false);
        let (seq, _) = b.start("c").unwrap();
        let (hs, f) = b.combine_fault(seq, 1, 12, 16, true);
        assert_eq!(hs, 1);
        assert!(f
            .unwrap()
            .contains("zero-copy combine #3 without get_next_low_latency_combine_buffer"),);
        let (_, f) = b.combine_fault(seq, 1, 17, 16, false);
        assert!(f
            .unwrap()
            .contains("had 17 tokens, more than num_max_dispatch_tokens_per_rank = 16"));
        b.record(Op::Combine, seq, 12, Some("bad".into()), false);
        assert_eq!(b.combine_rec(2).unwrap().tokens, 10);
        assert_eq!(b.combine_rec(3).unwrap().err.as_deref(), Some("bad"));
        // Dispatch #4 reuses set 0: the handle of #0 is stale, combine #2's output stays.
        let (seq, _) = b.start("d").unwrap();
        b.record(Op::Dispatch, seq, 5, None, false);
        let e = b
            .handle_set(0, "low_latency_combine")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the handle of dispatch #0 is stale") && e.contains("dispatch #4"),
            "{e}"
        );
        let (_, f) = b.combine_fault(5, 0, 10, 16, false);
        assert!(f.unwrap().contains("is stale"));
        assert!(b
            .handle_set(7, "x")
            .unwrap_err()
            .to_string()
            .contains("no dispatch #7"));
        assert_eq!(b.combine_rec(2).unwrap().call, 2);
        b.record(Op::Combine, 6, 5, None, false);
        assert!(b
            .combine_rec(2)
            .unwrap_err()
            .to_string()
            .contains("overwritten"));
    }

    /// Graph capture leaves the host state as it was, and each replay makes the captured
    /// calls the next ones, with fresh call numbers.
    #[test]
    fn call_book_capture_and_replay() {
        let mut b = Book::default();
        // One ordinary pair first: capture starts at call 2.
        b.start("d").unwrap();
        b.record(Op::Dispatch, 0, 8, None, false);
        b.start("c").unwrap();
        b.record(Op::Combine, 1, 8, None, false);
        let saved = b.begin_capture().unwrap();
        b.start("d").unwrap();
        b.record(Op::Dispatch, 2, 8, None, false);
        b.start("c").unwrap();
        b.record(Op::Combine, 3, 8, Some("fault".into()), false);
        let (calls, parity, rec) = b.end_capture(saved).unwrap();
        assert_eq!((calls, parity, rec.len()), (2, 0, 2));
        assert_eq!(b.seq, 2, "nothing ran");
        assert_eq!(b.dispatch[0].as_ref().unwrap().call, 0);
        assert!(b.capture.is_none());
        for rep in 0..3u64 {
            b.can_replay(parity).unwrap();
            let out = b.replayed(calls, &rec);
            let d = 2 + 2 * rep;
            assert_eq!(
                out,
                vec![
                    Replayed::Dispatch(GpuHandle {
                        call: d,
                        num_tokens: 8,
                        hook_pending: false
                    }),
                    Replayed::Combine(GpuCombine {
                        call: d + 1,
                        num_tokens: 8,
                        hook_pending: false
                    }),
                ]
            );
            assert_eq!(b.handle_set(d, "x").unwrap(), 0);
            assert_eq!(b.combine_rec(d + 1).unwrap().err.as_deref(), Some("fault"));
        }
        assert_eq!(b.seq, 8);
        // A call between replays changes the parity: refused until one more call.
        b.start("d").unwrap();
        b.record(Op::Dispatch, 8, 8, None, false);
        let e = b.can_replay(parity).unwrap_err().to_string();
        assert!(
            e.contains("captured at an even LL call number") && e.contains("call #9"),
            "{e}"
        );
        // An odd number of calls, or a hook left pending, cannot be captured.
        let saved = b.begin_capture().unwrap();
        b.start("c").unwrap();
        b.record(Op::Combine, 9, 8, None, false);
        let e = b.end_capture(saved).unwrap_err().to_string();
        assert!(e.contains("made 1 LL call(s)"), "{e}");
        assert_eq!(b.seq, 9, "restored");
        let saved = b.begin_capture().unwrap();
        b.start("c").unwrap();
        b.record(Op::Combine, 9, 8, None, true);
        b.start("d").unwrap();
        b.record(Op::Dispatch, 10, 8, None, false);
        let e = b.end_capture(saved).unwrap_err().to_string();
        assert!(e.contains("left a receive hook pending"), "{e}");
        assert!(!b.any_pending(), "restored");
        // Capture refuses to start with a hook pending.
        b.start("c").unwrap();
        b.record(Op::Combine, 9, 8, None, true);
        assert!(b.begin_capture().is_err());
        assert!(b.can_replay(1).is_err());
    }

    /// Without libcuda, an EP buffer on GPU PEs is an error naming the library.
    #[test]
    fn gpu_ep_without_a_driver_fails_cleanly() {
        if !crate::test_child::run_without_cuda(
            module_path!(),
            "gpu_ep_without_a_driver_fails_cleanly",
        ) {
            return;
        }
        let s = crate::config::Settings::from_lookup(|_| None).unwrap();
        let e = super::super::run_gpu_threads(2, s, |g| {
            GpuBuffer::new(g, cfg(7168, true), 0).map(|_| ())
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("libcuda.so.1"), "{e}");
    }
}
