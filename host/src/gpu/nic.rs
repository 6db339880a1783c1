//! GPU PEs over a real ConnectX NIC (`RSHMEM_TRANSPORT=ibgda`): the device API's IBGDA
//! path (`rshmem/device/ibgda.cuh`, the same code the proxy transport runs against the
//! soft HCA) writing WQEs into the NIC's own send queues (docs/ibgda.md, step 10).
//!
//! Set-up, per PE:
//! 1. pick the NIC: `RSHMEM_HCA` (`mlx5_0` or `mlx5_0:1`), else the mlx5 device with an
//!    active port nearest the GPU on PCIe ([`choose_port`], [`crate::topo`]);
//! 2. register the GPU heap: `ibv_reg_dmabuf_mr` on a dma-buf of it
//!    (`cuMemGetHandleForAddressRange`), else `ibv_reg_mr` on its address (needs
//!    nvidia-peermem); either way the MR's iova is the heap's GPU address, which is what
//!    the device API names in WQEs;
//! 3. one RC QP per PE (this one included: the loopback queue of its own atomics),
//!    connected over the bootstrap ([`crate::verbs::connect_all`]);
//! 4. `mlx5dv_init_obj` gives each QP's SQ, CQ and doorbell records (host memory libmlx5
//!    allocated) and BlueFlame register (a UAR page); the host memory is registered into
//!    CUDA in page ranges merged where they touch ([`page_ranges`]) and the descriptors
//!    carry its device addresses;
//! 5. the UAR pages are registered with `CU_MEMHOSTREGISTER_IOMEMORY`, one registration
//!    per distinct page ([`uar_pages`]); if the driver
//!    refuses (it needs `NVreg_RegistryDwords="PeerMappingOverride=1"`) or
//!    `RSHMEM_IBGDA_DOORBELL=cpu` asks for it, the GPU rings a shadow word in host memory
//!    instead and a CPU thread ([`crate::verbs::relay`]) stores it into the register.
//!
//! Status: compiled, and unit-tested where pure (HCA choice, page ranges, address
//! translation, descriptors). No NIC exists on the build machine and none on the lent
//! GPU machine, so none of the CUDA or verbs calls here has run: see docs/ibgda.md.

use super::driver::ck;
use super::ibgda::{descriptor_bytes, peer_table, table_bytes, HostBuf, HostRegistration};
use super::module::Ctx;
use super::pe::DevBuf;
use super::state::DevicePeer;
use crate::error::{Error, Result};
use crate::softhca::ibgda_table::{IbgdaQp, IbgdaTable, QueueAddrs};
use crate::softhca::CqMode;
use crate::verbs::device::HEAP_ACCESS;
use crate::verbs::relay::{DoorbellRelay, MmioRegister, Relayed};
use crate::verbs::{
    connect_all, Connected, Context, DeviceInfo, HeapKey, HeapMemory, MemoryRegion, NicQueues,
    ProtectionDomain, QpCaps, RcParams,
};
use cudarc::driver::sys;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// Send WQEs per QP asked of libmlx5. It sizes the ring for the largest WQE the caps
/// allow (512 B with 256 B of inline data on RC), so the ring holds at least this many
/// WQEBBs and usually 8 times as many; the CQ is sized to hold a full ring
/// ([`QpCaps::cqe`]).
pub const SEND_WR: u32 = 256;
/// Result slots of fetching operations (as for the proxy transport).
pub const RESULT_SLOTS: u32 = super::ibgda::RESULT_SLOTS;

/// Where a GPU PE's GPU sits, for choosing the NIC nearest it.
#[derive(Debug, Clone)]
pub struct Near {
    /// The GPU's PCI place; None where sysfs does not give it (the first NIC is taken).
    pub gpu: Option<crate::topo::PciPlace>,
    /// The GPU's CUDA ordinal: GPUs with several equally near NICs spread over them.
    pub ordinal: usize,
    /// The sysfs root the NICs' places are read from (`/sys`).
    pub sysfs: std::path::PathBuf,
}

/// The NIC and port a PE's QPs use, and why that one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicChoice {
    pub name: String,
    pub port: u8,
    /// `RSHMEM_HCA`, `nearest GPU 0000:1b:00.0: shares a PCIe switch (4 hops)`, ...
    pub why: String,
}

/// The (device, port) a PE's QPs use. `want` is `RSHMEM_HCA`: `name` or `name:port`.
/// Without it: the mlx5 device with an active port nearest the GPU (`near`), GPUs with
/// several equally near ones spread over them by ordinal (what NCCL and NVSHMEM do), the
/// first one where the GPU's place is unknown.
pub fn choose_port(
    devices: &[DeviceInfo],
    want: Option<&str>,
    near: Option<&Near>,
) -> Result<NicChoice> {
    use crate::verbs::device::PORT_ACTIVE;
    let listing = || {
        if devices.is_empty() {
            return "no RDMA devices".to_string();
        }
        devices
            .iter()
            .map(|d| {
                let ports = d
                    .ports
                    .iter()
                    .map(|p| {
                        let s = if p.state == PORT_ACTIVE {
                            "active"
                        } else {
                            "down"
                        };
                        format!("{}:{} {s}", d.name, p.port)
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                format!(
                    "{} ({}{})",
                    d.name,
                    if d.mlx5 { "mlx5" } else { "not mlx5" },
                    if ports.is_empty() {
                        d.error.as_ref().map_or(String::new(), |e| format!("; {e}"))
                    } else {
                        format!("; {ports}")
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let Some(want) = want.map(str::trim).filter(|w| !w.is_empty()) else {
        if let Some(c) = nearest_port(devices, near) {
            return Ok(c);
        }
        return Err(Error::InvalidArgument(format!(
            "RSHMEM_TRANSPORT=ibgda needs an mlx5 (ConnectX) device with an active port; \
             found: {}. Use RSHMEM_TRANSPORT=proxy where there is none (`rshmem doctor` \
             lists what it sees)",
            listing()
        )));
    };
    let (name, port) = match want.split_once(':') {
        Some((n, p)) => match p.parse::<u8>() {
            Ok(p) if p >= 1 => (n, Some(p)),
            _ => return Err(Error::Env {
                var: "RSHMEM_HCA".into(),
                value: want.to_string(),
                reason:
                    "expected a device name or name:port with port >= 1 (e.g. mlx5_0 or mlx5_0:1)"
                        .into(),
            }),
        },
        None => (want, None),
    };
    let bad = |reason: String| Error::Env {
        var: "RSHMEM_HCA".into(),
        value: want.to_string(),
        reason: format!("{reason}; found: {}", listing()),
    };
    let d = devices
        .iter()
        .find(|d| d.name == name)
        .ok_or_else(|| bad(format!("no RDMA device {name}")))?;
    if !d.mlx5 {
        return Err(bad(format!(
            "{name} is not an mlx5 device (IBGDA writes ConnectX work queues)"
        )));
    }
    let p = match port {
        Some(p) => d
            .ports
            .iter()
            .find(|x| x.port == p)
            .ok_or_else(|| bad(format!("{name} has no port {p}")))?,
        None => d
            .ports
            .iter()
            .find(|x| x.state == PORT_ACTIVE)
            .ok_or_else(|| bad(format!("{name} has no active port")))?,
    };
    if p.state != PORT_ACTIVE {
        return Err(bad(format!("port {name}:{} is not active", p.port)));
    }
    Ok(NicChoice {
        name: d.name.clone(),
        port: p.port,
        why: "RSHMEM_HCA".into(),
    })
}

/// The choice without `RSHMEM_HCA`: among mlx5 devices with an active port — those with
/// HCA atomics when any has them (another is refused later, [`check_atomic_cap`]), and
/// InfiniBand ones when link layers are mixed (every PE must reach every other PE's NIC,
/// which a separate Ethernet network does not promise) — the one nearest the GPU; GPUs
/// equally near several spread over them by their place among the node's GPUs
/// ([`crate::topo::spread_index`]; by CUDA ordinal where sysfs lists no GPUs). None when
/// no device qualifies.
fn nearest_port(devices: &[DeviceInfo], near: Option<&Near>) -> Option<NicChoice> {
    use crate::verbs::device::PORT_ACTIVE;
    let mut usable: Vec<(&DeviceInfo, &crate::verbs::PortInfo)> = devices
        .iter()
        .filter(|d| d.mlx5)
        .filter_map(|d| Some((d, d.ports.iter().find(|p| p.state == PORT_ACTIVE)?)))
        .collect();
    let hca = crate::verbs::sys::IBV_ATOMIC_HCA;
    if usable.iter().any(|(d, _)| d.atomic_cap == hca) {
        usable.retain(|(d, _)| d.atomic_cap == hca);
    }
    let ib = crate::verbs::device::LINK_LAYER_IB;
    if usable.iter().any(|(_, p)| p.link_layer == ib) {
        usable.retain(|(_, p)| p.link_layer == ib);
    }
    let pick = |(d, p): (&DeviceInfo, &crate::verbs::PortInfo), why: String| NicChoice {
        name: d.name.clone(),
        port: p.port,
        why,
    };
    let first = *usable.first()?;
    let Some((n, gpu)) = near.and_then(|n| Some((n, n.gpu.as_ref()?))) else {
        return Some(pick(
            first,
            "the first mlx5 device with an active port (the GPU's PCI place is unknown)".into(),
        ));
    };
    let places: Vec<_> = usable
        .iter()
        .map(|(d, _)| crate::topo::rdma_place(&n.sysfs, &d.name))
        .collect();
    let (ties, link) = crate::topo::nearest(gpu, &places)?;
    let k = crate::topo::spread_index(gpu, &crate::topo::nvidia_gpus(&n.sysfs), &places, &ties)
        .unwrap_or(n.ordinal % ties.len());
    let of = if ties.len() > 1 {
        format!("; {} as near, this GPU takes number {}", ties.len(), k + 1)
    } else {
        String::new()
    };
    Some(pick(
        usable[ties[k]],
        format!("nearest GPU {}: {}{of}", gpu.bdf, link.describe()),
    ))
}

/// The page-aligned ranges `(start, len)` covering `pieces` (`(addr, len)`), merged where
/// they touch or overlap, in address order: each is registered with CUDA once (libmlx5
/// keeps several queues' doorbell records in one page, and `cuMemHostRegister` refuses a
/// range overlapping one already registered, as each piece rounded to its pages would).
pub fn page_ranges(pieces: &[(u64, u64)], page: u64) -> Vec<(u64, u64)> {
    debug_assert!(page.is_power_of_two());
    let mut r: Vec<(u64, u64)> = pieces
        .iter()
        .filter(|&&(_, len)| len > 0)
        .map(|&(a, len)| {
            let start = a & !(page - 1);
            (start, (a + len).next_multiple_of(page))
        })
        .collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (s, e) in r {
        match out.last_mut() {
            Some((_, end)) if s <= *end => *end = (*end).max(e),
            _ => out.push((s, e)),
        }
    }
    out.into_iter().map(|(s, e)| (s, e - s)).collect()
}

/// The distinct pages `(start, page)` holding the doorbell registers `regs`, in address
/// order, never merged.
pub fn uar_pages(regs: impl Iterator<Item = u64>, page: u64) -> Vec<(u64, u64)> {
    let mut p: Vec<u64> = regs.map(|r| r & !(page - 1)).collect();
    p.sort_unstable();
    p.dedup();
    p.into_iter().map(|s| (s, page)).collect()
}

/// Host ranges registered with CUDA: `(host start, len, device start)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Translation(pub Vec<(u64, u64, u64)>);

impl Translation {
    /// The device address of `[addr, addr + len)`, which must lie inside one range.
    pub fn device(&self, addr: u64, len: u64, what: &str) -> Result<u64> {
        self.0
            .iter()
            .find(|&&(h, l, _)| addr >= h && addr + len <= h + l)
            .map(|&(h, _, d)| d + (addr - h))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{what} ({len} bytes at {addr:#x}) lies outside the memory registered \
                     with the GPU"
                ))
            })
    }
}

/// How the GPU rings one QP's doorbell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doorbell {
    /// The BlueFlame register, mapped into the GPU at this device address.
    Mmio(u64),
    /// A shadow word in host memory at this device address, relayed by a CPU thread.
    Relayed(u64),
}

/// The host memory of NIC queues `q` the GPU must reach, `(what, address, length)`: SQ,
/// QP doorbell record, CQ, CQ doorbell record (the doorbell register is separate).
pub fn host_pieces(q: &NicQueues) -> [(&'static str, u64, u64); 4] {
    [
        ("send queue", q.sq_buf as u64, q.sq_wqe_cnt as u64 * 64),
        ("doorbell record", q.dbrec as u64, 8),
        ("completion queue", q.cq_buf as u64, q.cqe_cnt as u64 * 64),
        ("CQ doorbell record", q.cq_dbrec as u64, 8),
    ]
}

/// The descriptor of NIC queues `q` for a GPU that reaches their host memory through `tr`.
pub fn nic_descriptor(
    q: &NicQueues,
    tr: &Translation,
    doorbell: Doorbell,
    timeout: Duration,
) -> Result<IbgdaQp> {
    let mut dev = [0u64; 4];
    for (d, (what, addr, len)) in dev.iter_mut().zip(host_pieces(q)) {
        *d = tr.device(addr, len, &format!("QP {:#x}'s {what}", q.qpn))?;
    }
    let addrs = QueueAddrs {
        sq: dev[0],
        qp_dbrec: dev[1],
        doorbell: match doorbell {
            Doorbell::Mmio(a) | Doorbell::Relayed(a) => a,
        },
        cq: dev[2],
        cq_dbrec: dev[3],
    };
    let d = IbgdaQp::new(
        addrs,
        q.sq_wqe_cnt,
        q.cqe_cnt,
        q.qpn,
        CqMode::Normal,
        timeout,
    )?;
    Ok(match doorbell {
        Doorbell::Mmio(_) => d.with_mmio_doorbell(),
        Doorbell::Relayed(_) => d,
    })
}

/// A dma-buf of `[va, va + len)` of GPU memory (`cuMemGetHandleForAddressRange`).
fn dmabuf_of(ctx: &Arc<Ctx>, va: u64, len: usize) -> Result<OwnedFd> {
    ctx.enter()?;
    let mut fd: i32 = -1;
    // SAFETY: valid out-pointer (an int for DMA_BUF_FD); the range is a mapped allocation
    // of this context; flags 0.
    ck(
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut i32).cast(),
                va,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        },
        "cuMemGetHandleForAddressRange",
        || format!("a dma-buf of the {len}-byte GPU heap at {va:#x}"),
    )?;
    // SAFETY: a fresh fd the driver returned; owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What a GPU PE over a NIC owns. Field order is drop order: the relay stops before the
/// registers it writes go, the CUDA registrations go before the memory libmlx5 frees with
/// the QPs, and the heap's MR before the heap (which the GpuPe drops after this).
pub(crate) struct NicGpu {
    _relay: Option<DoorbellRelay>,
    table: DevBuf,
    _descs: DevBuf,
    _locks: DevBuf,
    _uar_regs: Vec<HostRegistration>,
    _queue_regs: Vec<HostRegistration>,
    _shadow_reg: Option<HostRegistration>,
    _shadows: Option<HostBuf>,
    _connected: Connected,
    _results_mr: MemoryRegion,
    _results_reg: HostRegistration,
    _results: HostBuf,
    heap_mr: MemoryRegion,
    _dmabuf: Option<OwnedFd>,
    _pd: Arc<ProtectionDomain>,
    /// Given back after everything above is freed.
    _memlock: MemlockClaim,
    heap_va: u64,
    peer_table: Vec<DevicePeer>,
    /// The NIC port and how the heap and the doorbells were set up (for logs and doctor).
    pub(crate) summary: String,
}

// SAFETY: raw pointers inside are host memory owned by this value or libmlx5's for the
// QPs it owns; CUDA handles are used with the context made current.
unsafe impl Send for NicGpu {}
// SAFETY: as above; nothing is mutated through &self.
unsafe impl Sync for NicGpu {}

/// What [`NicGpu::new`] needs of the PE.
pub(crate) struct NicSetup<'a> {
    pub ctx: &'a Arc<Ctx>,
    pub rank: usize,
    pub n_pes: usize,
    pub heap_va: u64,
    pub heap_size: usize,
    pub timeout: Duration,
    /// Distinct per job (initial PSNs).
    pub salt: u64,
    pub hca: Option<String>,
    /// Where the GPU sits (the NIC nearest it is taken unless `hca` names one).
    pub near: Near,
    pub cpu_doorbell: bool,
    /// RSHMEM_IB_* (GID index, traffic class, service level, ACK timeout).
    pub ib: crate::config::IbSettings,
}

/// The NIC opened and the memory registered: what [`NicGpu::new`] does before the
/// connection exchange.
struct Opened {
    name: String,
    port: u8,
    /// Why this NIC ([`NicChoice::why`]).
    why: String,
    port_info: crate::verbs::PortInfo,
    /// The device's (initiator, responder) limits of outstanding READs/atomics per QP.
    rd_atom: (i32, i32),
    pd: Arc<ProtectionDomain>,
    heap_mr: MemoryRegion,
    dmabuf: Option<OwnedFd>,
    heap_how: &'static str,
    results_mr: MemoryRegion,
    results_reg: HostRegistration,
    memlock: MemlockClaim,
    results: HostBuf,
}

/// Refuses a device whose atomics IBGDA cannot use: the device API reads an 8-byte atomic's
/// result in host byte order, as NVSHMEM does, which is how a ConnectX answers when the
/// mlx5 driver put it in host-endianness mode for 8-byte atomic responses; the driver
/// reports `IBV_ATOMIC_HCA` only then (else `IBV_ATOMIC_NONE`).
pub fn check_atomic_cap(name: &str, atomic_cap: u32) -> Result<()> {
    if atomic_cap == crate::verbs::sys::IBV_ATOMIC_HCA {
        return Ok(());
    }
    let what = match atomic_cap {
        crate::verbs::sys::IBV_ATOMIC_NONE => "IBV_ATOMIC_NONE".to_string(),
        crate::verbs::sys::IBV_ATOMIC_GLOB => "IBV_ATOMIC_GLOB".to_string(),
        n => format!("{n}"),
    };
    Err(Error::InvalidArgument(format!(
        "RSHMEM_TRANSPORT=ibgda: device {name} reports atomic_cap {what}, not IBV_ATOMIC_HCA: \
         the mlx5 driver reports HCA atomics only when the NIC answers 8-byte atomics in host \
         byte order, which the device API's atomics read (as NVSHMEM's IBGDA does). Use \
         another device (RSHMEM_HCA) or RSHMEM_TRANSPORT=proxy"
    )))
}

/// The queue pairs [`NicGpu::new`] creates, one per PE.
pub(crate) const QP_CAPS: QpCaps = QpCaps {
    max_send_wr: SEND_WR,
    max_send_sge: 1,
    max_inline_data: 256,
};

/// Host memory the queues of this process's GPU PEs over a NIC pin, by estimate: the
/// locked-memory limit is per process, and GPU PEs may be threads of one process.
static PINNED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// This PE's share of [`PINNED`], given back when the PE's NIC state drops.
#[derive(Debug)]
struct MemlockClaim {
    bytes: u64,
    /// The counter claimed from ([`PINNED`]; a test's own otherwise).
    from: &'static std::sync::atomic::AtomicU64,
}

impl Drop for MemlockClaim {
    fn drop(&mut self) {
        // Relaxed: the counter orders nothing else; it only has to add up.
        self.from
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Claims the host memory one PE's queues to `n_pes` PEs pin, refusing before anything
/// is created when this process's claims would pass the locked-memory limit (`binding`:
/// None when unlimited or lifted by CAP_IPC_LOCK): the kernel would refuse one of the CQs
/// or QPs with ENOMEM part way through.
fn claim_memlock(
    n_pes: usize,
    binding: Option<u64>,
    from: &'static std::sync::atomic::AtomicU64,
) -> Result<MemlockClaim> {
    use std::sync::atomic::Ordering;
    let need = n_pes as u64 * QP_CAPS.pinned_estimate() + (RESULT_SLOTS as u64 + 1) * 8;
    // Relaxed: as in Drop.
    let before = from.fetch_add(need, Ordering::Relaxed);
    let claim = MemlockClaim { bytes: need, from };
    match binding {
        Some(limit) if before + need > limit => {
            let others = if before > 0 {
                format!(
                    " (with the {} this process's other GPU PEs pin)",
                    crate::doctor::human_bytes(before)
                )
            } else {
                String::new()
            };
            Err(Error::InvalidArgument(format!(
                "RSHMEM_TRANSPORT=ibgda: {n_pes} queue pairs (one per PE) and their \
                 completion queues pin about {} of host memory{others}, but {}",
                crate::doctor::human_bytes(need),
                crate::verbs::memlock::cure(limit)
            )))
        }
        _ => Ok(claim),
    }
}

fn open_nic(s: &NicSetup<'_>) -> Result<Opened> {
    let memlock = claim_memlock(s.n_pes, crate::verbs::memlock::binding_limit(), &PINNED)?;
    let devices = crate::verbs::list_devices()?;
    let NicChoice { name, port, why } = choose_port(&devices, s.hca.as_deref(), Some(&s.near))?;
    if let Some(d) = devices.iter().find(|d| d.name == name) {
        check_atomic_cap(&name, d.atomic_cap)?;
    }
    let rd_atom = devices
        .iter()
        .find(|d| d.name == name)
        .map_or((1, 1), |d| (d.max_qp_init_rd_atom, d.max_qp_rd_atom));
    let vctx = Context::open(&name)?;
    let port_info = vctx.port_info(port)?;
    let pd = ProtectionDomain::new(&vctx)?;

    // The heap: dma-buf first, then peer memory.
    let (heap_mr, dmabuf, heap_how) = match dmabuf_of(s.ctx, s.heap_va, s.heap_size) {
        Ok(fd) => {
            use std::os::fd::AsRawFd;
            let mem = HeapMemory::DmaBuf {
                fd: fd.as_raw_fd(),
                offset: 0,
                len: s.heap_size,
                iova: s.heap_va,
            };
            // SAFETY: the heap stays mapped and the fd open until the NicGpu drops
            // (fields: heap_mr before _dmabuf; the GpuPe drops the heap after it).
            match unsafe { MemoryRegion::register(&pd, mem, HEAP_ACCESS) } {
                Ok(mr) => (mr, Some(fd), "dma-buf"),
                Err(e) => (peer_mem(&pd, s, &e.to_string())?, None, "peer memory"),
            }
        }
        Err(e) => (peer_mem(&pd, s, &e.to_string())?, None, "peer memory"),
    };

    // Result slots: host memory the GPU addresses by device address; the MR's iova is
    // that address, because WQEs name local buffers as the GPU does.
    let results = HostBuf::new((RESULT_SLOTS as usize + 1) * 8)?;
    // SAFETY: `results` is kept next to this registration and dropped after it.
    let results_reg = unsafe {
        HostRegistration::new(
            s.ctx,
            results.ptr,
            results.layout.size(),
            "the IBGDA result slots",
        )?
    };
    // SAFETY: as above; the MR drops before `results`.
    let results_mr = unsafe {
        MemoryRegion::register(
            &pd,
            HeapMemory::VirtualAt {
                addr: results.ptr,
                len: results.layout.size(),
                iova: results_reg.dev(),
            },
            crate::verbs::sys::IBV_ACCESS_LOCAL_WRITE,
        )?
    };
    Ok(Opened {
        name,
        port,
        why,
        port_info,
        rd_atom,
        pd,
        heap_mr,
        dmabuf,
        heap_how,
        results_mr,
        results_reg,
        results,
        memlock,
    })
}

impl NicGpu {
    /// Opens the NIC, registers the heap, connects a QP to every PE of `world` over the
    /// bootstrap and builds the device-side table. Collective: every step that can fail
    /// is followed by an exchange of status, so a PE that fails makes the others fail at
    /// once, naming it.
    pub(crate) fn new(
        s: NicSetup<'_>,
        boot: &crate::bootstrap::Bootstrap,
        world: &crate::bootstrap::Group,
    ) -> Result<NicGpu> {
        use crate::pe::exchange_status;
        let opened = open_nic(&s);
        exchange_status(
            boot,
            world,
            "open its NIC and register its GPU heap",
            &opened,
        )?;
        let o = opened?;
        let caps = QP_CAPS;
        let params = RcParams {
            // Initiator depth toward each peer is lowered further to what that peer
            // offers as responder (connect_all, address record).
            rd_atomic: o.rd_atom.0.clamp(1, 16) as u8,
            dest_rd_atomic: o.rd_atom.1.clamp(1, 16) as u8,
            ..RcParams::with_settings(&s.ib)
        };
        if let Some(w) = retry_budget_warning(&params, s.timeout) {
            if s.rank == 0 {
                eprintln!("rshmem: {w}");
            }
        }
        let heap_key = HeapKey {
            base: s.heap_va,
            len: s.heap_size as u64,
            rkey: o.heap_mr.rkey(),
        };
        // connect_all makes exactly one allgather on every path; what fails after it (a
        // QP that will not reach RTR or RTS on one PE) is exchanged here.
        let connected = connect_all(
            &o.pd,
            &o.port_info,
            s.rank,
            s.n_pes,
            heap_key,
            caps,
            &params,
            s.salt,
            |b| boot.allgather(world, b),
        );
        exchange_status(boot, world, "connect its queue pairs", &connected)?;
        let built = Self::finish(&s, o, connected?);
        exchange_status(boot, world, "map its NIC queues into the GPU", &built)?;
        built
    }

    fn finish(s: &NicSetup<'_>, o: Opened, connected: Connected) -> Result<NicGpu> {
        let queues = connected
            .qps
            .iter()
            .map(|qp| {
                let q = crate::verbs::dv::init_obj(qp)?;
                q.validate()
                    .map_err(|e| Error::InvalidArgument(format!("QP {:#x}: {e}", q.qpn)))?;
                Ok(q)
            })
            .collect::<Result<Vec<NicQueues>>>()?;

        // Queue memory into the GPU, page range by page range.
        let page = crate::config::page_size() as u64;
        let pieces: Vec<(u64, u64)> = queues
            .iter()
            .flat_map(host_pieces)
            .map(|(_, addr, len)| (addr, len))
            .collect();
        let mut queue_regs = Vec::new();
        let mut tr = Translation::default();
        for (start, len) in page_ranges(&pieces, page) {
            // SAFETY: libmlx5's queue memory, alive while `connected` (dropped after these
            // registrations, field order) holds the QPs and CQs.
            let r = unsafe {
                HostRegistration::new(s.ctx, start as *mut u8, len as usize, "NIC queue memory")?
            };
            tr.0.push((start, len, r.dev()));
            queue_regs.push(r);
        }

        // Doorbells: the UAR pages into the GPU, or a relay.
        let mut uar_regs = Vec::new();
        let mut uar_tr = Translation::default();
        let mut refused = None;
        if s.cpu_doorbell {
            refused = Some("RSHMEM_IBGDA_DOORBELL=cpu".to_string());
        } else {
            // One registration per distinct UAR page: QPs share pages, but pages that sit
            // next to each other in virtual memory are separate mappings of device memory,
            // not one physically contiguous range as IOMEMORY expects.
            for (start, len) in uar_pages(queues.iter().map(|q| q.bf_reg as u64), page) {
                // SAFETY: the UAR pages libmlx5 mapped for these QPs, unmapped only when
                // the device context closes, after these registrations drop.
                match unsafe {
                    HostRegistration::with_flags(
                        s.ctx,
                        start as *mut u8,
                        len as usize,
                        sys::CU_MEMHOSTREGISTER_PORTABLE
                            | sys::CU_MEMHOSTREGISTER_DEVICEMAP
                            | sys::CU_MEMHOSTREGISTER_IOMEMORY,
                        "the NIC's doorbell (UAR) page",
                    )
                } {
                    Ok(r) => {
                        uar_tr.0.push((start, len, r.dev()));
                        uar_regs.push(r);
                    }
                    Err(e) => {
                        refused = Some(e.to_string());
                        uar_regs.clear();
                        break;
                    }
                }
            }
        }
        let (doorbells, shadows, shadow_reg, relay, bell_how) = match refused {
            None => {
                let d = queues
                    .iter()
                    .map(|q| {
                        uar_tr
                            .device(q.bf_reg as u64, 8, "a doorbell register")
                            .map(Doorbell::Mmio)
                    })
                    .collect::<Result<Vec<_>>>()?;
                (d, None, None, None, "GPU threads ring the NIC".to_string())
            }
            Some(why) => {
                let buf = HostBuf::new(queues.len().max(1) * 8)?;
                // SAFETY: `buf` is kept in the value returned and dropped after this.
                let reg = unsafe {
                    HostRegistration::new(
                        s.ctx,
                        buf.ptr,
                        buf.layout.size(),
                        "the doorbell shadows",
                    )?
                };
                let relayed = queues
                    .iter()
                    .enumerate()
                    .map(|(i, q)| {
                        // SAFETY: the shadow word is in `buf` (zeroed, 8-byte aligned),
                        // which outlives the relay (field order); the register is the
                        // QP's BlueFlame register, mapped while the QP lives, rung only by
                        // the relay (the GPU rings the shadow).
                        unsafe {
                            Relayed::new(
                                buf.ptr.add(i * 8).cast::<u64>(),
                                Box::new(MmioRegister::new(q.bf_reg as *mut u64)),
                            )
                        }
                    })
                    .collect();
                let relay =
                    DoorbellRelay::new(relayed, &format!("rshmem-db-{}", s.rank)).map_err(|e| {
                        Error::InvalidArgument(format!("starting the doorbell relay thread: {e}"))
                    })?;
                let d = (0..queues.len())
                    .map(|i| Doorbell::Relayed(reg.dev() + i as u64 * 8))
                    .collect();
                (
                    d,
                    Some(buf),
                    Some(reg),
                    Some(relay),
                    format!("a CPU thread rings the NIC ({why})"),
                )
            }
        };

        let descs: Vec<IbgdaQp> = queues
            .iter()
            .zip(&doorbells)
            .map(|(q, &d)| nic_descriptor(q, &tr, d, s.timeout))
            .collect::<Result<_>>()?;
        let (peer_table, _) = peer_table(
            &connected
                .peers
                .iter()
                .map(|a| Some((a.heap_base, a.heap_rkey)))
                .collect::<Vec<_>>(),
        );
        let table = DevBuf::new(s.ctx, 64, "the IBGDA table")?;
        let descs_buf = DevBuf::new(
            s.ctx,
            descs.len().max(1) * std::mem::size_of::<IbgdaQp>(),
            "the IBGDA descriptors",
        )?;
        let locks = DevBuf::new(
            s.ctx,
            RESULT_SLOTS as usize * 4,
            "the IBGDA result-slot locks",
        )?;
        descs_buf.write(&descriptor_bytes(&descs))?;
        locks.write(&vec![0u8; RESULT_SLOTS as usize * 4])?;
        let t = IbgdaTable::new(descs_buf.ptr(), descs.len() as u32).with_results(
            o.results_reg.dev(),
            locks.ptr(),
            RESULT_SLOTS,
            o.results_mr.lkey(),
        );
        table.write(&table_bytes(&t))?;
        Ok(NicGpu {
            _relay: relay,
            table,
            _descs: descs_buf,
            _locks: locks,
            _uar_regs: uar_regs,
            _queue_regs: queue_regs,
            _shadow_reg: shadow_reg,
            _shadows: shadows,
            _connected: connected,
            _results_mr: o.results_mr,
            _results_reg: o.results_reg,
            _results: o.results,
            heap_mr: o.heap_mr,
            _dmabuf: o.dmabuf,
            _pd: o.pd,
            _memlock: o.memlock,
            heap_va: s.heap_va,
            peer_table,
            summary: format!(
                "{}:{} ({}), heap by {}, {bell_how}",
                o.name, o.port, o.why, o.heap_how
            ),
        })
    }

    pub(crate) fn heap_dev(&self) -> u64 {
        self.heap_va
    }
    pub(crate) fn lkey(&self) -> u32 {
        self.heap_mr.lkey()
    }
    pub(crate) fn table_dev(&self) -> u64 {
        self.table.ptr()
    }
    pub(crate) fn peer_table(&self) -> &[DevicePeer] {
        &self.peer_table
    }
}

/// The heap through `ibv_reg_mr` at its GPU address (nvidia-peermem resolves it), after
/// the dma-buf registration failed with `dmabuf_err`.
fn peer_mem(
    pd: &Arc<ProtectionDomain>,
    s: &NicSetup<'_>,
    dmabuf_err: &str,
) -> Result<MemoryRegion> {
    // SAFETY: the heap stays mapped until this MR drops (the GpuPe drops it first).
    unsafe {
        MemoryRegion::register(
            pd,
            HeapMemory::Virtual {
                addr: s.heap_va as *mut u8,
                len: s.heap_size,
            },
            HEAP_ACCESS,
        )
    }
    .map_err(|e| {
        Error::InvalidArgument(format!(
            "registering the GPU heap with the NIC failed both ways: dma-buf: {dmabuf_err}; \
             peer memory (needs the nvidia_peermem module): {e}. `rshmem doctor` shows \
             which the machine offers; RSHMEM_TRANSPORT=proxy needs neither"
        ))
    })
}

/// How long a ConnectX retries a send before it reports RETRY_EXC (0x15): retry_cnt + 1
/// tries, each waiting the local ACK timeout 4.096 µs × 2^timeout (IB spec, 9.7.6.1.3).
/// Real NICs often wait longer, never shorter.
pub fn nic_retry_budget(p: &RcParams) -> Duration {
    let ack = Duration::from_nanos(4096).saturating_mul(1u32 << p.timeout.min(31));
    ack.saturating_mul(p.retry_cnt as u32 + 1)
}

/// A warning when the device waits (`device_timeout`, RSHMEM_TIMEOUT_MS) give up before
/// the NIC has reported a peer it cannot reach: the failure would show as a device wait
/// timeout instead of the RETRY_EXC completion that names the cause.
pub fn retry_budget_warning(p: &RcParams, device_timeout: Duration) -> Option<String> {
    let nic = nic_retry_budget(p);
    (device_timeout <= nic).then(|| {
        format!(
            "RSHMEM_TIMEOUT_MS ({} ms) is not longer than the NIC's retry budget ({} ms at \
             RSHMEM_IB_TIMEOUT={} with {} retries): an unreachable peer would show as a device \
             wait timeout rather than the NIC's RETRY_EXC; lower RSHMEM_IB_TIMEOUT (14: about \
             0.5 s) or raise RSHMEM_TIMEOUT_MS",
            device_timeout.as_millis(),
            nic.as_millis(),
            p.timeout,
            p.retry_cnt
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_timeout_is_checked_against_the_nic_retry_budget() {
        // The defaults agree: 8 tries of 4.096 us * 2^19 = 2.147 s each end inside the
        // default 30 s wait (NVSHMEM's 20 did not, and warned on every job).
        let d = RcParams::default();
        assert_eq!(nic_retry_budget(&d).as_millis(), 17_179);
        let default_wait = Duration::from_millis(crate::config::DEFAULT_TIMEOUT_MS);
        assert!(retry_budget_warning(&d, default_wait).is_none());
        let p = RcParams {
            timeout: 20, // retry 7: 8 tries of 4.295 s
            ..RcParams::default()
        };
        assert_eq!(nic_retry_budget(&p).as_millis(), 34_359);
        let w = retry_budget_warning(&p, Duration::from_secs(30)).expect("30 s is shorter");
        assert!(
            w.contains("RSHMEM_TIMEOUT_MS (30000 ms)") && w.contains("34359 ms"),
            "{w}"
        );
        assert!(retry_budget_warning(&p, Duration::from_secs(40)).is_none());
        let short = RcParams {
            timeout: 14,
            ..RcParams::default()
        };
        assert!(retry_budget_warning(&short, Duration::from_secs(30)).is_none());
    }

    #[test]
    fn queues_past_the_locked_memory_limit_are_refused_up_front() {
        // 4096 CQEs (256 KiB) + 256 WRs of 512 B (128 KiB) + a page, per PE.
        assert_eq!(QP_CAPS.pinned_estimate(), 256 * 1024 + 128 * 1024 + 4096);
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let check = |n, limit| claim_memlock(n, limit, &COUNTER);
        let e = check(8, Some(64 << 10)).unwrap_err().to_string();
        assert!(
            e.contains(
                "RSHMEM_TRANSPORT=ibgda: 8 queue pairs (one per PE) and their completion \
                 queues pin about 3.1 MiB of host memory, but the locked-memory limit \
                 (ulimit -l) is 64.0 KiB"
            ),
            "{e}"
        );
        assert_eq!(
            COUNTER.load(Ordering::Relaxed),
            0,
            "a refused claim is given back"
        );
        let one = check(8, Some(8 << 20)).unwrap(); // systemd's default, 8 PEs
        assert!(check(32, Some(8 << 20)).is_err()); // ... but not 32
                                                    // The limit is per process: GPU PEs as threads of one process claim together, so
                                                    // a second 8-PE claim still fits systemd's 8 MiB and a third does not.
        let threads = [one, check(8, Some(8 << 20)).unwrap()];
        let e = check(8, Some(8 << 20)).unwrap_err().to_string();
        assert!(
            e.contains("(with the 6.2 MiB this process's other GPU PEs pin)"),
            "{e}"
        );
        drop(threads);
        assert_eq!(COUNTER.load(Ordering::Relaxed), 0);
        assert!(check(4096, None).is_ok()); // unlimited or CAP_IPC_LOCK
    }
    use crate::verbs::device::PORT_ACTIVE;
    use crate::verbs::PortInfo;

    /// Only HCA atomics (8-byte results in host byte order on mlx5) are taken.
    #[test]
    fn devices_without_host_endian_atomics_are_refused() {
        use crate::verbs::sys::{IBV_ATOMIC_GLOB, IBV_ATOMIC_HCA, IBV_ATOMIC_NONE};
        check_atomic_cap("mlx5_0", IBV_ATOMIC_HCA).unwrap();
        for (cap, says) in [
            (
                IBV_ATOMIC_NONE,
                "atomic_cap IBV_ATOMIC_NONE, not IBV_ATOMIC_HCA",
            ),
            (
                IBV_ATOMIC_GLOB,
                "atomic_cap IBV_ATOMIC_GLOB, not IBV_ATOMIC_HCA",
            ),
            (7, "atomic_cap 7, not IBV_ATOMIC_HCA"),
        ] {
            let e = check_atomic_cap("mlx5_1", cap).unwrap_err().to_string();
            assert!(e.contains(&format!("device mlx5_1 reports {says}")), "{e}");
        }
    }

    fn dev(name: &str, mlx5: bool, ports: &[(u8, bool)]) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            mlx5,
            fw_ver: String::new(),
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            atomic_cap: crate::verbs::sys::IBV_ATOMIC_HCA,
            ports: ports
                .iter()
                .map(|&(port, up)| PortInfo {
                    port,
                    state: if up { PORT_ACTIVE } else { 1 },
                    link_layer: 1,
                    active_mtu: 5,
                    lid: 3,
                    gids: Vec::new(),
                })
                .collect(),
            error: None,
        }
    }

    /// (name, port) of a choice.
    fn np(c: NicChoice) -> (String, u8) {
        (c.name, c.port)
    }

    #[test]
    fn the_hca_is_the_first_active_mlx5_port_or_the_one_named() {
        let devs = [
            dev("rxe0", false, &[(1, true)]),
            dev("mlx5_0", true, &[(1, false)]),
            dev("mlx5_1", true, &[(1, false), (2, true)]),
        ];
        let first = choose_port(&devs, None, None).unwrap();
        assert_eq!(np(first.clone()), ("mlx5_1".into(), 2));
        assert!(first.why.contains("first mlx5 device"), "{}", first.why);
        let named = choose_port(&devs, Some("mlx5_1"), None).unwrap();
        assert_eq!(
            (np(named.clone()), named.why.as_str()),
            (("mlx5_1".into(), 2), "RSHMEM_HCA")
        );
        assert_eq!(
            np(choose_port(&devs, Some(" mlx5_1:2 "), None).unwrap()),
            ("mlx5_1".into(), 2)
        );
        for (want, says) in [
            ("mlx5_9", "no RDMA device mlx5_9"),
            ("rxe0", "rxe0 is not an mlx5 device"),
            ("mlx5_0", "mlx5_0 has no active port"),
            ("mlx5_1:1", "port mlx5_1:1 is not active"),
            ("mlx5_1:3", "mlx5_1 has no port 3"),
            ("mlx5_1:0", "port >= 1"),
            ("mlx5_1:x", "port >= 1"),
        ] {
            let e = choose_port(&devs, Some(want), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("RSHMEM_HCA") && e.contains(says), "{want}: {e}");
        }
        // What was found is listed.
        let e = choose_port(&devs, Some("mlx5_9"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mlx5_1:2 active") && e.contains("rxe0 (not mlx5"),
            "{e}"
        );
        let e = choose_port(&devs[..2], None, None).unwrap_err().to_string();
        assert!(
            e.contains("RSHMEM_TRANSPORT=ibgda") && e.contains("RSHMEM_TRANSPORT=proxy"),
            "{e}"
        );
        let e = choose_port(&[], None, None).unwrap_err().to_string();
        assert!(e.contains("found: no RDMA devices"), "{e}");
    }

    /// A node like a DGX's: a GPU and a NIC behind each PCIe switch, a second socket;
    /// the NIC nearest each GPU is taken, equally near ones spread over the GPUs.
    #[test]
    fn the_hca_is_the_one_nearest_the_gpu() {
        use crate::topo::pci_place;
        use crate::topo::tests::{gpu, nic, tree, Scratch};
        let dir = Scratch::new("nic-choice");
        let root = dir.0.clone();
        let sw0 = "pci0000:00/0000:00:01.0/0000:01:00.0";
        let sw1 = "pci0000:00/0000:00:03.0/0000:11:00.0";
        let far = "pci0000:80/0000:80:01.0/0000:81:00.0";
        let node0b = "pci0000:40/0000:40:01.0";
        let gpu_a = format!("{sw0}/0000:02:00.0/0000:03:00.0");
        let nic_a = format!("{sw0}/0000:02:01.0/0000:04:00.0");
        let gpu_b = format!("{sw1}/0000:12:00.0/0000:13:00.0");
        let nic_b = format!("{sw1}/0000:12:01.0/0000:14:00.0");
        // Placed like a GPU but not listed as an NVIDIA one (vendor/class of a NIC).
        let unlisted = format!("{sw1}/0000:12:02.0/0000:15:00.0");
        let nic_far = format!("{far}/0000:82:00.0");
        let nic_node0 = format!("{node0b}/0000:41:00.0");
        let gpu_c = format!("{far}/0000:83:00.0");
        tree(
            &root,
            &[
                gpu(&gpu_a, 0),
                nic(&nic_a, 0),
                gpu(&gpu_b, 0),
                nic(&nic_b, 0),
                nic(&unlisted, 0),
                nic(&nic_far, 1),
                nic(&nic_node0, 0),
                gpu(&gpu_c, 1),
            ],
            &[
                ("mlx5_far", &nic_far),
                ("mlx5_b", &nic_b),
                ("mlx5_a", &nic_a),
                ("mlx5_n0", &nic_node0),
            ],
        )
        .unwrap();
        let near = |bdf: &str, ordinal| Near {
            gpu: pci_place(&root, bdf),
            ordinal,
            sysfs: root.clone(),
        };
        let devs = [
            dev("mlx5_far", true, &[(1, true)]),
            dev("mlx5_b", true, &[(1, true)]),
            dev("mlx5_a", true, &[(1, true)]),
            dev("mlx5_n0", true, &[(1, true)]),
            dev("mlx5_x", true, &[(1, true)]), // no sysfs entry: ranks last
        ];
        let choose = |devs: &[DeviceInfo], bdf: &str, ordinal| {
            choose_port(devs, None, Some(&near(bdf, ordinal))).unwrap()
        };
        let a = choose(&devs, "0000:03:00.0", 0);
        assert_eq!(np(a.clone()), ("mlx5_a".into(), 1));
        assert_eq!(
            a.why,
            "nearest GPU 0000:03:00.0: shares a PCIe switch (4 hops)"
        );
        assert_eq!(np(choose(&devs, "0000:13:00.0", 0)), ("mlx5_b".into(), 1));
        // GPU C, on the other socket, shares a switch with mlx5_far.
        let c = choose(&devs, "0000:83:00.0", 0);
        assert_eq!(
            (c.name.as_str(), c.why.contains("(2 hops)")),
            ("mlx5_far", true)
        );
        // RSHMEM_HCA wins over nearness.
        assert_eq!(
            np(choose_port(&devs, Some("mlx5_b"), Some(&near("0000:03:00.0", 0))).unwrap()),
            ("mlx5_b".into(), 1)
        );
        // A GPU whose place is unknown takes the first device.
        let unknown = choose(&devs, "0000:99:00.0", 0);
        assert_eq!(unknown.name, "mlx5_far");
        assert!(unknown.why.contains("place is unknown"), "{}", unknown.why);
        // Without switch-mates, the NUMA node decides.
        let node_only = [
            dev("mlx5_far", true, &[(1, true)]),
            dev("mlx5_n0", true, &[(1, true)]),
            dev("mlx5_x", true, &[(1, true)]),
        ];
        let p = choose(&node_only, "0000:03:00.0", 0);
        assert_eq!(p.name, "mlx5_n0");
        assert!(p.why.contains("same NUMA node"), "{}", p.why);
        // Two equally near NICs for GPUs A and B (and not C, nearer to mlx5_far): A, first
        // of them in PCI order, takes the first, B the second, whatever their CUDA
        // ordinals (each process may see its GPU as 0).
        let two = [
            dev("mlx5_x", true, &[(1, true)]),
            dev("mlx5_y", true, &[(1, true)]),
        ];
        for (bdf, want, k) in [("0000:03:00.0", "mlx5_x", 1), ("0000:13:00.0", "mlx5_y", 2)] {
            for ordinal in [0, 1, 5] {
                let p = choose(&two, bdf, ordinal);
                assert_eq!(p.name, want, "{bdf} ordinal {ordinal}");
                assert!(
                    p.why
                        .ends_with(&format!("; 2 as near, this GPU takes number {k}")),
                    "{}",
                    p.why
                );
            }
        }
        // A device sysfs does not list as an NVIDIA GPU spreads by CUDA ordinal.
        assert_eq!(choose(&two, "0000:15:00.0", 0).name, "mlx5_x");
        assert_eq!(choose(&two, "0000:15:00.0", 3).name, "mlx5_y");
        // The nearest device without HCA atomics is passed over for one that has them.
        let mut no_hca = devs.clone();
        no_hca[2].atomic_cap = crate::verbs::sys::IBV_ATOMIC_NONE;
        let p = choose(&no_hca, "0000:03:00.0", 0);
        assert_eq!(p.name, "mlx5_b", "{}", p.why);
        assert!(p.why.contains("shares a PCIe root complex"), "{}", p.why);
        // Mixed link layers: InfiniBand ports only (an Ethernet mlx5 near the GPU is the
        // storage network, not the one every PE reaches); all Ethernet is fine.
        let eth = crate::verbs::device::LINK_LAYER_IB + 1;
        let mut mixed = devs.clone();
        mixed[2].ports[0].link_layer = eth;
        assert_eq!(choose(&mixed, "0000:03:00.0", 0).name, "mlx5_b");
        for d in &mut mixed {
            d.ports[0].link_layer = eth;
        }
        assert_eq!(choose(&mixed, "0000:03:00.0", 0).name, "mlx5_a");
    }

    #[test]
    fn page_ranges_merge_shared_and_touching_pages() {
        let p = 4096;
        assert_eq!(
            page_ranges(
                &[
                    (0x10_0000, 0x4000), // SQ: 4 pages
                    (0x20_0010, 8),      // dbrec of QP 0
                    (0x20_0018, 8),      // CQ dbrec, same page
                    (0x10_4000, 0x2000), // CQ right after the SQ: merges
                    (0x30_0ff8, 16),     // straddles a page boundary
                    (0x40_0000, 0),      // empty: ignored
                ],
                p
            ),
            vec![
                (0x10_0000, 0x6000),
                (0x20_0000, 0x1000),
                (0x30_0000, 0x2000)
            ]
        );
        assert_eq!(page_ranges(&[], p), vec![]);
    }

    #[test]
    fn uar_pages_are_deduplicated_never_merged() {
        assert_eq!(
            uar_pages(
                [0x9000_1800u64, 0x9000_0800, 0x9000_0a00, 0x9000_2800].into_iter(),
                4096
            ),
            vec![
                (0x9000_0000, 4096),
                (0x9000_1000, 4096),
                (0x9000_2000, 4096)
            ]
        );
    }

    #[test]
    fn translation_maps_inside_one_range_only() {
        let t = Translation(vec![
            (0x10_0000, 0x6000, 0x7f00_0000_0000),
            (0x20_0000, 0x1000, 0x100),
        ]);
        assert_eq!(t.device(0x10_0000, 64, "x").unwrap(), 0x7f00_0000_0000);
        assert_eq!(t.device(0x10_5fc0, 64, "x").unwrap(), 0x7f00_0000_5fc0);
        assert_eq!(t.device(0x20_0018, 8, "x").unwrap(), 0x118);
        let e = t
            .device(0x10_5fc8, 64, "QP 0x5's send queue")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("QP 0x5's send queue") && e.contains("0x105fc8"),
            "{e}"
        );
        assert!(t.device(0x1f_fff8, 8, "x").is_err());
    }

    #[test]
    fn nic_descriptors_use_translated_addresses_and_the_doorbell_asked_for() {
        let q = NicQueues {
            qpn: 0x1234,
            sq_buf: 0x10_0000,
            sq_wqe_cnt: 1024,
            sq_stride: 64,
            dbrec: 0x20_0010,
            bf_reg: 0x50_0800,
            bf_size: 256,
            cq_buf: 0x14_0000,
            cqe_cnt: 2048,
            cqe_size: 64,
            cq_dbrec: 0x20_0040,
        };
        let dev = 0x7f00_0000_0000u64;
        let tr = Translation(
            page_ranges(&[(0x10_0000, 0x6_0000), (0x20_0000, 64)], 4096)
                .into_iter()
                .scan(0, |off, (h, l)| {
                    let r = (h, l, dev + *off);
                    *off += l;
                    Some(r)
                })
                .collect(),
        );
        let t = Duration::from_secs(3);
        let d = nic_descriptor(&q, &tr, Doorbell::Mmio(0x9000_0800), t).unwrap();
        assert_eq!(d.sq, dev);
        assert_eq!(d.cq, dev + 0x4_0000);
        assert_eq!(d.qp_dbrec, dev + 0x6_0010);
        assert_eq!(d.cq_dbrec, dev + 0x6_0040);
        assert_eq!(d.doorbell, 0x9000_0800);
        assert_eq!((d.wqe_cnt, d.cqe_cnt, d.qpn), (1024, 2048, 0x1234));
        assert_eq!(
            d.doorbell_mode,
            crate::softhca::ibgda_table::IBGDA_DOORBELL_MMIO
        );
        assert_eq!(d.cq_mode, crate::softhca::ibgda_table::IBGDA_CQ_NORMAL);
        assert_eq!(d.timeout_ns, 3_000_000_000);
        let r = nic_descriptor(&q, &tr, Doorbell::Relayed(0x5000), t).unwrap();
        assert_eq!(r.doorbell, 0x5000);
        assert_eq!(
            r.doorbell_mode,
            crate::softhca::ibgda_table::IBGDA_DOORBELL_MEMORY
        );
        // A piece outside the registered memory is an error naming it, not a bad address.
        let short = Translation(vec![(0x10_0000, 0x1000, dev)]);
        let e = nic_descriptor(&q, &short, Doorbell::Relayed(0x5000), t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("QP 0x1234's send queue"), "{e}");
    }
}
