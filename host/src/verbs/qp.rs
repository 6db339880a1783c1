//! RC queue pairs: the attributes of each state transition (pure, unit-tested), the
//! [`QueuePair`] RAII type, and [`connect_all`], which brings one QP per peer from RESET to
//! RTS with the peers' addresses exchanged over the bootstrap.

use super::addr::{decode_all, AddressRecord, GID_KIND_NONE, GID_KIND_ROCE_V1, GID_KIND_ROCE_V2};
use super::device::{
    CompletionQueue, Gid, GidKind, PortInfo, ProtectionDomain, LINK_LAYER_ETHERNET, LINK_LAYER_IB,
};
use super::result::{check_ptr, check_rc, verbs_fn};
use super::sys;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Tunables of the RC connection (the values NVSHMEM and perftest use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcParams {
    /// Local ACK timeout exponent: 4.096 µs · 2^timeout (19 ≈ 2.1 s: 8 tries, 17 s, end
    /// within rshmem's default 30 s wait, so an unreachable peer is reported by the NIC's
    /// RETRY_EXC; NVSHMEM's IBGDA value 20, 34 s of tries, outlasted it; 14 ≈ 67 ms gave
    /// up after about 0.5 s of congestion with 7 retries).
    pub timeout: u8,
    /// Transport retries (7 = the maximum).
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer (12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READs/atomics as initiator (`max_rd_atomic`; at most the device's
    /// `max_qp_init_rd_atom`). `connect_all` lowers it per peer to what the peer offers
    /// as target.
    pub rd_atomic: u8,
    /// Outstanding RDMA READs/atomics this PE accepts as target (`max_dest_rd_atomic`,
    /// the responder resources; at most the device's `max_qp_rd_atom`), sent to the
    /// peers in the address record.
    pub dest_rd_atomic: u8,
    /// GRH hop limit for RoCE / routed IB.
    pub hop_limit: u8,
    /// Service level / traffic class.
    pub sl: u8,
    pub traffic_class: u8,
    /// The source GID table index to use (RSHMEM_IB_GID_INDEX); None: [`choose_gid`]'s
    /// choice.
    pub gid_index: Option<u16>,
}

impl RcParams {
    /// The defaults with the settings of `RSHMEM_IB_*`.
    pub fn with_settings(ib: &crate::config::IbSettings) -> RcParams {
        RcParams {
            timeout: ib.timeout,
            sl: ib.sl,
            traffic_class: ib.traffic_class,
            gid_index: ib.gid_index,
            ..RcParams::default()
        }
    }
}

impl Default for RcParams {
    fn default() -> Self {
        RcParams {
            timeout: 19,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 16,
            dest_rd_atomic: 16,
            hop_limit: 64,
            sl: 0,
            traffic_class: 0,
            gid_index: None,
        }
    }
}

/// One `ibv_modify_qp` call: attributes and the mask naming which of them are set.
#[derive(Clone, Copy)]
pub struct Transition {
    pub attr: sys::ibv_qp_attr,
    pub mask: u32,
    /// `RESET->INIT`, for error messages.
    pub name: &'static str,
}

impl Transition {
    /// The transition and every attribute its mask sets, for errors: what to compare with
    /// `ibv_devinfo -v` and the peer's side when `ibv_modify_qp` refuses it ("INIT->RTR:
    /// dest QPN 0xabcdef, rq PSN 0x123456, path MTU 1024, LID 0x33, SL 0, port 1, ...").
    pub fn describe(&self) -> String {
        let (a, m) = (&self.attr, self.mask);
        let has = |bit: u32| m & bit != 0;
        let mut parts = Vec::new();
        if has(sys::IBV_QP_PORT) {
            parts.push(format!("port {}", a.port_num));
        }
        if has(sys::IBV_QP_PKEY_INDEX) {
            parts.push(format!("P_Key index {}", a.pkey_index));
        }
        if has(sys::IBV_QP_ACCESS_FLAGS) {
            parts.push(format!("access {:#x}", a.qp_access_flags));
        }
        if has(sys::IBV_QP_DEST_QPN) {
            parts.push(format!("dest QPN {:#x}", a.dest_qp_num));
        }
        if has(sys::IBV_QP_RQ_PSN) {
            parts.push(format!("rq PSN {:#x}", a.rq_psn));
        }
        if has(sys::IBV_QP_PATH_MTU) {
            let bytes = match a.path_mtu {
                v @ 1..=5 => (128u32 << v).to_string(),
                v => format!("code {v} (not an ibv_mtu)"),
            };
            parts.push(format!("path MTU {bytes}"));
        }
        if has(sys::IBV_QP_AV) {
            let av = &a.ah_attr;
            if av.is_global != 0 {
                // SAFETY: ibv_gid is a union of 16 bytes and two u64s; every bit pattern
                // is valid for the byte array.
                let dgid = unsafe { av.grh.dgid.raw };
                parts.push(format!(
                    "GRH to {} from sgid index {}, hop limit {}, traffic class {}",
                    std::net::Ipv6Addr::from(dgid),
                    av.grh.sgid_index,
                    av.grh.hop_limit,
                    av.grh.traffic_class
                ));
            } else {
                parts.push(format!("LID {:#x} (no GRH)", av.dlid));
            }
            parts.push(format!("SL {}, AV port {}", av.sl, av.port_num));
        }
        if has(sys::IBV_QP_MAX_DEST_RD_ATOMIC) {
            parts.push(format!("responder depth {}", a.max_dest_rd_atomic));
        }
        if has(sys::IBV_QP_MIN_RNR_TIMER) {
            parts.push(format!("min RNR timer {}", a.min_rnr_timer));
        }
        if has(sys::IBV_QP_SQ_PSN) {
            parts.push(format!("sq PSN {:#x}", a.sq_psn));
        }
        if has(sys::IBV_QP_TIMEOUT) {
            parts.push(format!("ACK timeout {}", a.timeout));
        }
        if has(sys::IBV_QP_RETRY_CNT) {
            parts.push(format!("retry {}", a.retry_cnt));
        }
        if has(sys::IBV_QP_RNR_RETRY) {
            parts.push(format!("RNR retry {}", a.rnr_retry));
        }
        if has(sys::IBV_QP_MAX_QP_RD_ATOMIC) {
            parts.push(format!("initiator depth {}", a.max_rd_atomic));
        }
        format!("{}: {}", self.name, parts.join(", "))
    }
}

fn zeroed_attr() -> sys::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data (integers, a union of byte arrays); all-zero is
    // a valid value and what rdma-core's examples start from.
    unsafe { std::mem::zeroed() }
}

/// RESET → INIT: port, P_Key index 0, and the remote access rights of the QP.
pub fn to_init(port: u8, access: u32) -> Transition {
    let mut a = zeroed_attr();
    a.qp_state = sys::IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = port;
    a.qp_access_flags = access;
    Transition {
        attr: a,
        mask: sys::IBV_QP_STATE
            | sys::IBV_QP_PKEY_INDEX
            | sys::IBV_QP_PORT
            | sys::IBV_QP_ACCESS_FLAGS,
        name: "RESET->INIT",
    }
}

/// The path MTU of a connection: the smaller of both ports' active MTUs (`ibv_mtu`
/// values, which order like the sizes).
pub fn path_mtu(local: u8, remote: u8) -> u8 {
    local.min(remote)
}

/// The source GID index for a port, or None when the peer is addressed by LID only.
///
/// InfiniBand: LID routing, no GRH (None). Ethernet (RoCE) needs a GRH: prefer a RoCE v2
/// entry holding an IPv4-mapped address (`::ffff:a.b.c.d`, routable over UDP/IP), then any
/// other RoCE v2 entry that is not link-local (`fe80::/10`), then any RoCE v2, then RoCE
/// v1. An Ethernet port without a usable GID is an error.
pub fn choose_gid(port: &PortInfo) -> std::result::Result<Option<Gid>, String> {
    choose_gid_at(port, None)
}

/// As [`choose_gid`], or the entry at table index `want` when given (RSHMEM_IB_GID_INDEX;
/// on InfiniBand it makes the connection use a GRH): refused when the port has no such
/// entry, or (Ethernet) when it is not a RoCE one.
pub fn choose_gid_at(
    port: &PortInfo,
    want: Option<u16>,
) -> std::result::Result<Option<Gid>, String> {
    if let Some(i) = want {
        let listed: Vec<String> = port.gids.iter().map(|g| g.index.to_string()).collect();
        let g = port.gids.iter().find(|g| g.index == i).ok_or_else(|| {
            format!(
                "RSHMEM_IB_GID_INDEX={i}: port {} has no GID at that index (it has {})",
                port.port,
                if listed.is_empty() {
                    "none".to_string()
                } else {
                    listed.join(", ")
                }
            )
        })?;
        if port.link_layer == LINK_LAYER_ETHERNET && g.kind == GidKind::Ib {
            return Err(format!(
                "RSHMEM_IB_GID_INDEX={i}: port {} is Ethernet and GID {i} is not a RoCE one",
                port.port
            ));
        }
        return Ok(Some(*g));
    }
    match port.link_layer {
        LINK_LAYER_IB => Ok(None),
        LINK_LAYER_ETHERNET => {
            let v2 = |g: &&Gid| g.kind == GidKind::RoceV2;
            let ipv4 = |g: &&Gid| g.gid[..10] == [0; 10] && g.gid[10..12] == [0xff, 0xff];
            let link_local = |g: &&Gid| g.gid[0] == 0xfe && g.gid[1] & 0xc0 == 0x80;
            let gs = &port.gids;
            gs.iter()
                .filter(v2)
                .find(ipv4)
                .or_else(|| gs.iter().filter(v2).find(|g| !link_local(g)))
                .or_else(|| gs.iter().find(v2))
                .or_else(|| gs.iter().find(|g| g.kind == GidKind::RoceV1))
                .copied()
                .map(Some)
                .ok_or_else(|| format!("port {} is Ethernet (RoCE) but has no RoCE GID", port.port))
        }
        other => Err(format!(
            "port {} has link layer {other} (neither InfiniBand nor Ethernet)",
            port.port
        )),
    }
}

/// What the local side contributes to RTR: its port, active MTU and source GID index
/// and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPath {
    pub port: u8,
    pub active_mtu: u8,
    pub sgid_index: Option<u16>,
    /// As [`AddressRecord::gid_kind`].
    pub gid_kind: u8,
}

/// [`AddressRecord::gid_kind`] of a chosen GID.
pub fn gid_kind_code(g: Option<&Gid>) -> u8 {
    match g.map(|g| g.kind) {
        Some(GidKind::RoceV1) => GID_KIND_ROCE_V1,
        Some(GidKind::RoceV2) => GID_KIND_ROCE_V2,
        Some(GidKind::Ib) | None => GID_KIND_NONE,
    }
}

/// INIT → RTR: the remote QP number and PSN, the address vector (LID, or GRH with the
/// remote GID when either side needs one), path MTU, responder resources.
pub fn to_rtr(
    local: &LocalPath,
    remote: &AddressRecord,
    remote_qpn: u32,
    remote_psn: u32,
    p: &RcParams,
) -> std::result::Result<Transition, String> {
    let mut a = zeroed_attr();
    a.qp_state = sys::IBV_QPS_RTR;
    a.path_mtu = path_mtu(local.active_mtu, remote.mtu) as u32;
    a.dest_qp_num = remote_qpn & 0xff_ffff;
    a.rq_psn = remote_psn & 0xff_ffff;
    a.max_dest_rd_atomic = p.dest_rd_atomic;
    a.min_rnr_timer = p.min_rnr_timer;
    a.ah_attr.dlid = remote.lid;
    a.ah_attr.sl = p.sl;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = local.port;
    match (local.sgid_index, remote.gid) {
        (Some(_), Some(_))
            if local.gid_kind != GID_KIND_NONE
                && remote.gid_kind != GID_KIND_NONE
                && local.gid_kind != remote.gid_kind =>
        {
            let v = |k: u8| {
                if k == GID_KIND_ROCE_V1 {
                    "RoCE v1"
                } else {
                    "RoCE v2"
                }
            };
            return Err(format!(
                "this port's GID is {}, the peer's {}: both sides must use the same RoCE \
                 version (RSHMEM_IB_GID_INDEX picks the GID)",
                v(local.gid_kind),
                v(remote.gid_kind)
            ));
        }
        (Some(sgid), Some((_, dgid))) => {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = dgid;
            a.ah_attr.grh.sgid_index = u8::try_from(sgid).map_err(|_| {
                format!("source GID index {sgid} does not fit the 8-bit sgid_index")
            })?;
            a.ah_attr.grh.hop_limit = p.hop_limit;
            a.ah_attr.grh.traffic_class = p.traffic_class;
            a.ah_attr.grh.flow_label = 0;
        }
        (None, None) => a.ah_attr.is_global = 0,
        (Some(_), None) => {
            return Err(
                "the peer sent no GID but this port addresses it with a GRH (RoCE, \
                        or RSHMEM_IB_GID_INDEX set here and not there)"
                    .into(),
            )
        }
        (None, Some(_)) => {
            return Err(
                "the peer addresses this PE with a GRH (RoCE, or RSHMEM_IB_GID_INDEX \
                        set there and not here) but this port has no GID chosen"
                    .into(),
            )
        }
    }
    Ok(Transition {
        attr: a,
        mask: sys::IBV_QP_STATE
            | sys::IBV_QP_AV
            | sys::IBV_QP_PATH_MTU
            | sys::IBV_QP_DEST_QPN
            | sys::IBV_QP_RQ_PSN
            | sys::IBV_QP_MAX_DEST_RD_ATOMIC
            | sys::IBV_QP_MIN_RNR_TIMER,
        name: "INIT->RTR",
    })
}

/// The parameters of the QP to a peer that offers `peer_responder` outstanding
/// READs/atomics as target: the initiator depth never exceeds them (a requester that
/// sends more than the responder has resources for gets its QP broken).
pub fn toward(p: &RcParams, peer_responder: u8) -> RcParams {
    RcParams {
        rd_atomic: p.rd_atomic.min(peer_responder),
        ..*p
    }
}

/// RTR → RTS: our first PSN, ACK timeout, retries, initiator depth.
pub fn to_rts(psn: u32, p: &RcParams) -> Transition {
    let mut a = zeroed_attr();
    a.qp_state = sys::IBV_QPS_RTS;
    a.sq_psn = psn & 0xff_ffff;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.max_rd_atomic = p.rd_atomic;
    Transition {
        attr: a,
        mask: sys::IBV_QP_STATE
            | sys::IBV_QP_TIMEOUT
            | sys::IBV_QP_RETRY_CNT
            | sys::IBV_QP_RNR_RETRY
            | sys::IBV_QP_SQ_PSN
            | sys::IBV_QP_MAX_QP_RD_ATOMIC,
        name: "RTR->RTS",
    }
}

/// A 24-bit initial PSN derived from (rank, peer, salt) — distinct per QP so stale
/// packets of an earlier job do not match, reproducible for debugging.
pub fn initial_psn(rank: u32, peer: u32, salt: u64) -> u32 {
    let x = crate::pe::mix64(salt ^ ((rank as u64) << 32) ^ peer as u64);
    (x & 0xff_ffff) as u32
}

/// Capacity of a QP's send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_send_sge: u32,
    pub max_inline_data: u32,
}

/// The most WQEBBs one mlx5 send WQE spans (1 KiB).
pub const MAX_WQEBBS_PER_WQE: u32 = 16;

impl QpCaps {
    /// The `cqe` to create a QP's CQ with: at least as many entries as the SQ libmlx5
    /// builds for these caps can hold WQEBBs (at most `roundup_pow2(max_send_wr × WQE
    /// size) / 64` ≤ `roundup_pow2(max_send_wr) × 16`; libmlx5 rounds `cqe + 1` up to a
    /// power of two). The device-side producer asks a CQE of every WQE and bounds what is
    /// in flight by the SQ alone, so a smaller CQ would overrun.
    pub fn cqe(&self) -> u32 {
        self.max_send_wr
            .max(1)
            .checked_next_power_of_two()
            .map_or(u32::MAX, |n| n.saturating_mul(MAX_WQEBBS_PER_WQE))
            - 1
    }
}

impl QpCaps {
    /// About how much host memory one QP with its own CQ pins (charged to `ulimit -l`):
    /// the CQ's [`QpCaps::cqe`] + 1 64-byte entries, the send queue at up to 512 bytes per
    /// WR (libmlx5 rounds the WQE of a 256-byte inline limit up to 512 and the queue to a
    /// power of two) and a page of doorbell records.
    pub fn pinned_estimate(&self) -> u64 {
        let cq = (self.cqe() as u64 + 1) * 64;
        let sq = (self.max_send_wr.max(1) as u64).next_power_of_two() * 512;
        cq + sq + 4096
    }
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_send_sge: 1,
            max_inline_data: 28,
        }
    }
}

/// An RC queue pair; destroyed on drop (before its CQ and PD, which it holds).
#[derive(Debug)]
pub struct QueuePair {
    ptr: *mut sys::ibv_qp,
    cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: see device::Context.
unsafe impl Send for QueuePair {}
// SAFETY: see device::Context.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// `ibv_create_qp` (RC, send and receive CQ = `cq`, no receive queue use; every WQE
    /// signalled by its own CE bits, so `sq_sig_all` = 0).
    pub fn new_rc(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QueuePair> {
        let f = verbs_fn!(ibv_create_qp)?;
        // SAFETY: plain data; all-zero is valid.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.qp_type = sys::IBV_QPT_RC;
        // Must stay 0: with sq_sig_all the mlx5 kernel driver turns on requester
        // scatter-to-CQE, and READ and atomic results of up to 32 bytes would land in the
        // CQE instead of the result buffers the WQEs name (GPU producers read those).
        init.sq_sig_all = 0;
        init.cap.max_send_wr = caps.max_send_wr;
        init.cap.max_send_sge = caps.max_send_sge;
        init.cap.max_inline_data = caps.max_inline_data;
        init.cap.max_recv_wr = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: live PD and CQ (held below); init is a valid attribute struct.
        let p = unsafe { f(pd.as_ptr(), &mut init) };
        let ptr = check_ptr(
            "ibv_create_qp",
            p,
            &format!("{}: RC, {} send WRs", pd.context().name(), caps.max_send_wr),
        )?;
        Ok(QueuePair {
            ptr,
            cq: cq.clone(),
            pd: pd.clone(),
        })
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP; qp_num is set at creation and never changes.
        unsafe { (*self.ptr).qp_num }
    }
    pub fn cq(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.ptr
    }

    /// `ibv_modify_qp` with `t`; `whom` names the connection in an error ("to PE 3 on
    /// mlx5_0").
    pub fn modify(&self, t: &Transition, whom: &str) -> Result<()> {
        let f = verbs_fn!(ibv_modify_qp)?;
        let mut attr = t.attr;
        // SAFETY: live QP; attr/mask built by the functions above.
        let rc = unsafe { f(self.ptr, &mut attr, t.mask as i32) };
        check_rc(
            "ibv_modify_qp",
            rc,
            &format!("QP {:#x} {whom}, {}", self.qpn(), t.describe()),
        )
    }
}

impl QueuePair {
    /// One signalled RDMA WRITE of `len` bytes at `local` (registered under `lkey`) to
    /// `raddr`/`rkey`, through the standard verbs (`ibv_post_send`, inline in verbs.h:
    /// the provider's `ops.post_send`). For devices that are not mlx5 (soft-RoCE) and for
    /// checking a connection; the IBGDA data path writes mlx5 WQEs instead.
    pub fn post_rdma_write(
        &self,
        wr_id: u64,
        local: *const u8,
        len: u32,
        lkey: u32,
        raddr: u64,
        rkey: u32,
    ) -> Result<()> {
        let mut sge = sys::ibv_sge {
            addr: local as u64,
            length: len,
            lkey,
        };
        // SAFETY: plain data; all-zero is valid.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = sys::IBV_WR_RDMA_WRITE;
        wr.send_flags = sys::IBV_SEND_SIGNALED;
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: raddr,
            rkey,
        };
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; its context pointer and ops table are the provider's, set at
        // open; the WR and SGE live across the call (the provider copies them).
        let rc = unsafe {
            let ctx = (*self.ptr).context;
            match (*ctx).ops.post_send {
                Some(f) => f(self.ptr, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        check_rc(
            "ibv_post_send",
            rc,
            &format!("QP {:#x} RDMA WRITE of {len} bytes", self.qpn()),
        )
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if let Ok(f) = verbs_fn!(ibv_destroy_qp) {
            // SAFETY: created by us, destroyed once; nothing posts to it any more (its
            // owner is being dropped).
            let _ = unsafe { f(self.ptr) };
        }
    }
}

/// The connected QPs of one PE: `qps[j]` reaches PE `j` (this PE included: loopback),
/// with every peer's address record (its heap base, length and rkey).
#[derive(Debug)]
pub struct Connected {
    pub qps: Vec<QueuePair>,
    pub peers: Vec<AddressRecord>,
}

/// This PE's heap as peers address it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapKey {
    pub base: u64,
    pub len: u64,
    pub rkey: u32,
}

/// Creates one RC QP per PE (`n_pes`, this one included), moves each to INIT, exchanges
/// address records with `exchange` (an allgather over the bootstrap: given this PE's
/// bytes, returns every PE's in rank order), then brings QP `j` to RTR against PE `j`'s
/// QP for this rank and to RTS. Any failing verb is an [`Error::Verbs`] naming it.
#[allow(clippy::too_many_arguments)]
pub fn connect_all(
    pd: &Arc<ProtectionDomain>,
    port: &PortInfo,
    rank: usize,
    n_pes: usize,
    heap: HeapKey,
    caps: QpCaps,
    params: &RcParams,
    salt: u64,
    exchange: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>>,
) -> Result<Connected> {
    let ctx = pd.context().clone();
    let access = super::device::HEAP_ACCESS;
    // Everything that can fail before the exchange: a PE that fails here still takes part
    // in it (with an empty record, so the others fail at once naming it, instead of
    // waiting for a record that never comes), then reports its own error.
    let setup = (|| -> Result<_> {
        let gid = choose_gid_at(port, params.gid_index)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", pd.context().name())))?;
        let mut qps = Vec::with_capacity(n_pes);
        let mut entries = Vec::with_capacity(n_pes);
        for j in 0..n_pes {
            let cq = CompletionQueue::new(&ctx, caps.cqe())?;
            let qp = QueuePair::new_rc(pd, &cq, caps)?;
            qp.modify(
                &to_init(port.port, access),
                &format!("to PE {j} on {}", ctx.name()),
            )?;
            entries.push((qp.qpn(), initial_psn(rank as u32, j as u32, salt)));
            qps.push(qp);
        }
        Ok((gid, qps, entries))
    })();
    let (gid, qps, entries) = match setup {
        Ok(s) => s,
        Err(e) => {
            let _ = exchange(&[]);
            return Err(e);
        }
    };
    let mine = AddressRecord {
        lid: port.lid,
        port: port.port,
        mtu: port.active_mtu,
        link_layer: port.link_layer,
        gid: gid.map(|g| (g.index, g.gid)),
        heap_base: heap.base,
        heap_len: heap.len,
        heap_rkey: heap.rkey,
        responder_resources: params.dest_rd_atomic,
        gid_kind: gid_kind_code(gid.as_ref()),
        qps: entries.clone(),
    };
    let all = exchange(&mine.encode())?;
    let peers = check_exchange(&all, n_pes)?;
    let local = LocalPath {
        port: port.port,
        active_mtu: port.active_mtu,
        sgid_index: gid.map(|g| g.index),
        gid_kind: gid_kind_code(gid.as_ref()),
    };
    for (j, qp) in qps.iter().enumerate() {
        let (rqpn, rpsn) = peers[j].qps[rank];
        let rtr = to_rtr(&local, &peers[j], rqpn, rpsn, params)
            .map_err(|e| Error::InvalidArgument(format!("QP to PE {j}: {e}")))?;
        let whom = format!("to PE {j} on {}", ctx.name());
        qp.modify(&rtr, &whom)?;
        qp.modify(
            &to_rts(entries[j].1, &toward(params, peers[j].responder_resources)),
            &whom,
        )?;
    }
    Ok(Connected { qps, peers })
}

/// Every PE's address record from the exchange's bytes; an empty record is a PE that
/// failed to set up its queue pairs.
pub fn check_exchange(all: &[Vec<u8>], n_pes: usize) -> Result<Vec<AddressRecord>> {
    if all.len() != n_pes {
        return Err(Error::InvalidArgument(format!(
            "address exchange returned {} records for {n_pes} PEs",
            all.len()
        )));
    }
    if let Some(pe) = all.iter().position(|r| r.is_empty()) {
        return Err(Error::PeerDied {
            pe,
            detail: format!("PE {pe} could not set up its queue pairs (its own error says why)"),
        });
    }
    decode_all(all).map_err(|e| Error::InvalidArgument(format!("address exchange: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(index: u16, kind: GidKind, b: [u8; 16]) -> Gid {
        Gid {
            index,
            gid: b,
            kind,
        }
    }
    const LINK_LOCAL: [u8; 16] = [
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55,
    ];
    const IPV4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 7];
    const GLOBAL6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

    fn port(link_layer: u8, gids: Vec<Gid>) -> PortInfo {
        PortInfo {
            port: 1,
            state: super::super::device::PORT_ACTIVE,
            link_layer,
            active_mtu: 5,
            lid: 7,
            gids,
        }
    }

    #[test]
    fn the_cq_holds_a_full_send_queue() {
        let c = |wr| QpCaps {
            max_send_wr: wr,
            ..QpCaps::default()
        };
        assert_eq!(c(128).cqe(), 2047);
        assert_eq!(c(129).cqe(), 4095);
        assert_eq!(c(256).cqe(), 4095);
        assert_eq!(c(0).cqe(), 15);
        assert_eq!(c(u32::MAX).cqe(), u32::MAX - 1, "saturates, no wrap");
        // Worst case: every WQE 1 KiB, the ring rounded up to a power of two.
        for wr in [1u32, 3, 100, 129, 500, 512, 1000] {
            let sq_wqebbs = (wr as u64 * 1024).next_power_of_two() / 64;
            let cq = (c(wr).cqe() as u64 + 1).next_power_of_two();
            assert!(cq >= sq_wqebbs, "{wr} WRs: CQ {cq} < SQ {sq_wqebbs}");
        }
    }

    #[test]
    fn the_exchange_names_a_pe_that_failed_before_it() {
        let rec = |heap_base: u64| AddressRecord {
            lid: 1,
            port: 1,
            mtu: 5,
            link_layer: 1,
            gid: None,
            heap_base,
            heap_len: 1 << 20,
            heap_rkey: 7,
            responder_resources: 16,
            gid_kind: GID_KIND_NONE,
            qps: vec![(0x10, 1), (0x11, 2)],
        };
        let ok = vec![rec(0x1000).encode(), rec(0x2000).encode()];
        let peers = check_exchange(&ok, 2).unwrap();
        assert_eq!(peers[1].heap_base, 0x2000);
        let e = check_exchange(&[ok[0].clone(), Vec::new()], 2).unwrap_err();
        assert!(matches!(e, Error::PeerDied { pe: 1, .. }), "{e}");
        assert!(
            e.to_string()
                .contains("PE 1 could not set up its queue pairs"),
            "{e}"
        );
        let e = check_exchange(&ok[..1], 2).unwrap_err().to_string();
        assert!(e.contains("1 records for 2 PEs"), "{e}");
        let e = check_exchange(&[ok[0].clone(), vec![1, 2, 3]], 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("address exchange"), "{e}");
    }

    #[test]
    fn init_mask_and_fields() {
        let t = to_init(2, super::super::device::HEAP_ACCESS);
        assert_eq!(t.mask, 0x1 | 0x10 | 0x20 | 0x8);
        assert_eq!(t.attr.qp_state, sys::IBV_QPS_INIT);
        assert_eq!(t.attr.port_num, 2);
        assert_eq!(t.attr.pkey_index, 0);
        assert_eq!(t.attr.qp_access_flags, 0x1 | 0x2 | 0x4 | 0x8);
        assert_eq!(
            t.describe(),
            "RESET->INIT: port 2, P_Key index 0, access 0xf"
        );
    }

    #[test]
    fn gid_choice() {
        // IB: no GRH.
        assert_eq!(
            choose_gid(&port(LINK_LAYER_IB, vec![gid(0, GidKind::Ib, LINK_LOCAL)])),
            Ok(None)
        );
        // RoCE: the IPv4-mapped v2 entry wins over v1 and link-local v2.
        let p = port(
            LINK_LAYER_ETHERNET,
            vec![
                gid(0, GidKind::RoceV1, LINK_LOCAL),
                gid(1, GidKind::RoceV2, LINK_LOCAL),
                gid(2, GidKind::RoceV1, IPV4),
                gid(3, GidKind::RoceV2, IPV4),
            ],
        );
        assert_eq!(choose_gid(&p).unwrap().unwrap().index, 3);
        // RSHMEM_IB_GID_INDEX takes the entry named, or says which exist.
        assert_eq!(choose_gid_at(&p, Some(2)).unwrap().unwrap().index, 2);
        assert_eq!(
            choose_gid_at(&p, Some(9)),
            Err(
                "RSHMEM_IB_GID_INDEX=9: port 1 has no GID at that index (it has 0, 1, 2, 3)"
                    .to_string()
            )
        );
        let ib_gid = port(LINK_LAYER_ETHERNET, vec![gid(0, GidKind::Ib, LINK_LOCAL)]);
        assert_eq!(
            choose_gid_at(&ib_gid, Some(0)),
            Err("RSHMEM_IB_GID_INDEX=0: port 1 is Ethernet and GID 0 is not a RoCE one".into())
        );
        // On InfiniBand a named index makes the connection use a GRH.
        let ib = port(LINK_LAYER_IB, vec![gid(0, GidKind::Ib, LINK_LOCAL)]);
        assert_eq!(choose_gid_at(&ib, Some(0)).unwrap().unwrap().index, 0);
        // No IPv4: a global v2 beats a link-local v2.
        let p = port(
            LINK_LAYER_ETHERNET,
            vec![
                gid(1, GidKind::RoceV2, LINK_LOCAL),
                gid(5, GidKind::RoceV2, GLOBAL6),
            ],
        );
        assert_eq!(choose_gid(&p).unwrap().unwrap().index, 5);
        // Only link-local v2, then only v1.
        let p = port(
            LINK_LAYER_ETHERNET,
            vec![
                gid(0, GidKind::RoceV1, IPV4),
                gid(1, GidKind::RoceV2, LINK_LOCAL),
            ],
        );
        assert_eq!(choose_gid(&p).unwrap().unwrap().index, 1);
        let p = port(
            LINK_LAYER_ETHERNET,
            vec![gid(4, GidKind::RoceV1, LINK_LOCAL)],
        );
        assert_eq!(choose_gid(&p).unwrap().unwrap().index, 4);
        assert_eq!(
            choose_gid(&port(LINK_LAYER_ETHERNET, vec![])),
            Err("port 1 is Ethernet (RoCE) but has no RoCE GID".to_string())
        );
        assert_eq!(
            choose_gid(&port(0, vec![])),
            Err("port 1 has link layer 0 (neither InfiniBand nor Ethernet)".to_string())
        );
    }

    fn remote(mtu: u8, gid: Option<(u16, [u8; 16])>) -> AddressRecord {
        AddressRecord {
            lid: 0x33,
            port: 1,
            mtu,
            link_layer: if gid.is_some() { 2 } else { 1 },
            gid,
            heap_base: 0,
            heap_len: 0,
            heap_rkey: 0,
            responder_resources: 16,
            gid_kind: if gid.is_some() {
                GID_KIND_ROCE_V2
            } else {
                GID_KIND_NONE
            },
            qps: vec![],
        }
    }

    #[test]
    fn rtr_ib_uses_lid_and_min_mtu() {
        let local = LocalPath {
            port: 1,
            active_mtu: 5,
            sgid_index: None,
            gid_kind: GID_KIND_NONE,
        };
        let t = to_rtr(
            &local,
            &remote(3, None),
            0x01ab_cdef,
            0xff_123456,
            &RcParams::default(),
        )
        .unwrap();
        assert_eq!(
            t.mask,
            0x1 | 0x80 | 0x100 | 0x10_0000 | 0x1000 | 0x2_0000 | 0x8000
        );
        assert_eq!(t.attr.qp_state, sys::IBV_QPS_RTR);
        assert_eq!(t.attr.path_mtu, 3);
        assert_eq!(t.attr.dest_qp_num, 0xab_cdef);
        assert_eq!(t.attr.rq_psn, 0x12_3456);
        assert_eq!(t.attr.max_dest_rd_atomic, 16);
        assert_eq!(t.attr.min_rnr_timer, 12);
        assert_eq!(t.attr.ah_attr.dlid, 0x33);
        assert_eq!(t.attr.ah_attr.is_global, 0);
        assert_eq!(t.attr.ah_attr.port_num, 1);
        assert_eq!(
            t.describe(),
            "INIT->RTR: dest QPN 0xabcdef, rq PSN 0x123456, path MTU 1024, LID 0x33 (no \
             GRH), SL 0, AV port 1, responder depth 16, min RNR timer 12"
        );
    }

    #[test]
    fn rtr_roce_sets_grh() {
        let local = LocalPath {
            port: 1,
            active_mtu: 4,
            sgid_index: Some(3),
            gid_kind: GID_KIND_ROCE_V2,
        };
        let t = to_rtr(
            &local,
            &remote(5, Some((7, IPV4))),
            9,
            10,
            &RcParams::default(),
        )
        .unwrap();
        assert_eq!(t.attr.path_mtu, 4);
        assert_eq!(t.attr.ah_attr.is_global, 1);
        assert_eq!(t.attr.ah_attr.grh.sgid_index, 3);
        assert_eq!(t.attr.ah_attr.grh.hop_limit, 64);
        assert_eq!(
            (t.attr.ah_attr.grh.traffic_class, t.attr.ah_attr.sl),
            (0, 0)
        );
        // RSHMEM_IB_TC / RSHMEM_IB_SL reach the address vector.
        let lossless = RcParams::with_settings(&crate::config::IbSettings {
            traffic_class: 106,
            sl: 3,
            ..Default::default()
        });
        let t = to_rtr(&local, &remote(5, Some((7, IPV4))), 9, 10, &lossless).unwrap();
        assert_eq!(
            (t.attr.ah_attr.grh.traffic_class, t.attr.ah_attr.sl),
            (106, 3)
        );
        assert_eq!(
            t.describe(),
            "INIT->RTR: dest QPN 0x9, rq PSN 0xa, path MTU 2048, GRH to ::ffff:192.168.1.7 \
             from sgid index 3, hop limit 64, traffic class 106, SL 3, AV port 1, responder \
             depth 16, min RNR timer 12"
        );
        // A RoCE v1 peer of a RoCE v2 port: refused, naming both.
        let v1 = AddressRecord {
            gid_kind: GID_KIND_ROCE_V1,
            ..remote(5, Some((7, IPV4)))
        };
        assert_eq!(
            to_rtr(&local, &v1, 9, 10, &RcParams::default())
                .err()
                .unwrap(),
            "this port's GID is RoCE v2, the peer's RoCE v1: both sides must use the same \
             RoCE version (RSHMEM_IB_GID_INDEX picks the GID)"
        );
        // SAFETY: raw covers the union.
        assert_eq!(unsafe { t.attr.ah_attr.grh.dgid.raw }, IPV4);
        assert_eq!(
            to_rtr(&local, &remote(5, None), 9, 10, &RcParams::default())
                .err()
                .unwrap(),
            "the peer sent no GID but this port addresses it with a GRH (RoCE, or \
             RSHMEM_IB_GID_INDEX set here and not there)"
        );
        let ib = LocalPath {
            sgid_index: None,
            ..local
        };
        assert!(to_rtr(
            &ib,
            &remote(5, Some((0, IPV4))),
            9,
            10,
            &RcParams::default()
        )
        .is_err());
        let big = LocalPath {
            sgid_index: Some(300),
            ..local
        };
        assert!(to_rtr(
            &big,
            &remote(5, Some((0, IPV4))),
            9,
            10,
            &RcParams::default()
        )
        .is_err());
    }

    #[test]
    fn rts_mask_and_fields() {
        let t = to_rts(0x1_abcdef, &RcParams::default());
        assert_eq!(t.mask, 0x1 | 0x200 | 0x400 | 0x800 | 0x1_0000 | 0x2000);
        assert_eq!(t.attr.qp_state, sys::IBV_QPS_RTS);
        assert_eq!(t.attr.sq_psn, 0xab_cdef);
        assert_eq!(
            (
                t.attr.timeout,
                t.attr.retry_cnt,
                t.attr.rnr_retry,
                t.attr.max_rd_atomic
            ),
            (19, 7, 7, 16)
        );
        assert_eq!(
            t.describe(),
            "RTR->RTS: sq PSN 0xabcdef, ACK timeout 19, retry 7, RNR retry 7, initiator \
             depth 16"
        );
    }

    #[test]
    fn initiator_depth_stays_within_the_peers_responder_resources() {
        let p = RcParams {
            rd_atomic: 16,
            dest_rd_atomic: 8,
            ..RcParams::default()
        };
        assert_eq!(toward(&p, 4).rd_atomic, 4);
        assert_eq!(toward(&p, 32).rd_atomic, 16);
        assert_eq!(toward(&p, 4).dest_rd_atomic, 8, "what we offer is ours");
        assert_eq!(to_rts(1, &toward(&p, 4)).attr.max_rd_atomic, 4);
        let local = LocalPath {
            port: 1,
            active_mtu: 5,
            sgid_index: None,
            gid_kind: GID_KIND_NONE,
        };
        let t = to_rtr(&local, &remote(5, None), 1, 2, &p).unwrap();
        assert_eq!(t.attr.max_dest_rd_atomic, 8);
    }

    #[test]
    fn psn_is_24_bit_and_distinct() {
        let a = initial_psn(0, 1, 42);
        assert!(a <= 0xff_ffff);
        assert_eq!(a, initial_psn(0, 1, 42));
        assert_ne!(a, initial_psn(1, 0, 42));
        assert_ne!(a, initial_psn(0, 1, 43));
        assert_eq!(path_mtu(5, 3), 3);
    }
}
