//! GPU PEs over the proxy transport (`RSHMEM_TRANSPORT=proxy`): the device API's IBGDA
//! path (`rshmem/device/ibgda.cuh`) against the soft HCA, with no NIC
//! (docs/ibgda-device.md, "GPU PEs over the proxy transport").
//!
//! The symmetric heap is the CPU PE's shared-memory heap, registered into CUDA
//! (`cuMemHostRegister`, PORTABLE | DEVICEMAP) and addressed by the GPU through its device
//! pointer. Each PE gets one queue pair per peer (itself included: the loopback queue its
//! own atomics take) in host memory registered the same way, attached to the process's
//! soft HCA engine, which executes the WQEs with host loads and stores exactly as for CPU
//! PEs. The descriptors (`rshmem_ibgda_qp_t`), the table and the result-slot locks live in
//! device memory; the result slots in registered host memory.
//!
//! Keys: the heap is registered in the PE's protection domain a second time, at its
//! *device* addresses (`state.lkey`), because the GPU names local buffers by device
//! address; remote addresses stay the peers' host addresses under their rkeys (the
//! engine resolves those through the peers' tables, as for CPU PEs).
//!
//! The pure part (peer table, descriptors, table, byte images) is unit-tested on the CPU;
//! the CUDA part is unverified until scripts/gpu-check ran on a GPU.

use super::driver::ck;
use super::module::Ctx;
use super::pe::DevBuf;
use super::state::{DevicePeer, TRANSPORT_IBGDA, TRANSPORT_NONE};
use crate::error::{Error, Result};
use crate::softhca::engine::QpHandle;
use crate::softhca::ibgda_table::{IbgdaQp, IbgdaTable, QueueAddrs};
use crate::softhca::mr::{Access, MrTable};
use crate::softhca::proxy::{GpuProxyView, ProxyBackend, Staging};
use crate::softhca::{CqMode, QpConfig, QueueMemory};
use cudarc::driver::sys;
use std::alloc::Layout;
use std::sync::Arc;
use std::time::Duration;

/// SQ ring of a GPU PE's queue to one peer (WQEBBs).
pub const WQE_CNT: u32 = 1024;
/// Its CQ (normal mode: exact error CQEs; one CQE per WQE).
pub const CQE_CNT: u32 = 1024;
/// Result slots per PE (threads waiting for a fetched value at once; more wait for a slot).
pub const RESULT_SLOTS: u32 = 8192;

/// `host + delta`: a host address as the GPU addresses it (`delta = device - host` of the
/// registration; wrapping, since the device address may be below the host one).
pub fn to_device(host: u64, delta: u64) -> u64 {
    host.wrapping_add(delta)
}

/// The peer table of a GPU PE whose peers are all reached through queues: `peers[r]` =
/// (the peer's heap base as its soft HCA addresses it, its rkey), None = unreachable.
/// Queue indices are assigned in rank order over the reachable peers; returns the table
/// and, per queue index, the peer's rank.
pub fn peer_table(peers: &[Option<(u64, u32)>]) -> (Vec<DevicePeer>, Vec<usize>) {
    let mut ranks = Vec::new();
    let table = peers
        .iter()
        .enumerate()
        .map(|(r, p)| match p {
            Some((raddr, rkey)) => {
                ranks.push(r);
                DevicePeer {
                    heap_base: 0,
                    transport: TRANSPORT_IBGDA,
                    qp: (ranks.len() - 1) as u32,
                    raddr: *raddr,
                    rkey: *rkey,
                    flags: 0,
                }
            }
            None => DevicePeer {
                transport: TRANSPORT_NONE,
                ..Default::default()
            },
        })
        .collect();
    (table, ranks)
}

/// The descriptor of queue `mem` (attached to the engine as `qpn`) for a GPU that sees
/// the queue memory at `host + delta`.
pub fn descriptor(mem: &QueueMemory, delta: u64, qpn: u32, timeout: Duration) -> Result<IbgdaQp> {
    let l = mem.layout();
    IbgdaQp::new(
        QueueAddrs::of(mem, delta),
        l.wqe_cnt,
        l.cqe_cnt,
        qpn,
        CqMode::Normal,
        timeout,
    )
}

/// The bytes of descriptors as the device expects them (320 each, in order).
pub fn descriptor_bytes(qps: &[IbgdaQp]) -> Vec<u8> {
    let n = std::mem::size_of::<IbgdaQp>();
    let mut out = Vec::with_capacity(std::mem::size_of_val(qps));
    for q in qps {
        // SAFETY: IbgdaQp is repr(C), 320 bytes, every field plain data or an atomic of the
        // same size and representation as its integer; nobody else touches `q` (a fresh
        // descriptor, read once here). Padding is explicit fields, so every byte is init.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts((q as *const IbgdaQp).cast::<u8>(), n)
        });
    }
    out
}

/// The bytes of a table (64).
pub fn table_bytes(t: &IbgdaTable) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend(t.magic.to_le_bytes());
    b.extend(t.version.to_le_bytes());
    b.extend(t.n_qps.to_le_bytes());
    b.extend(t.flags.to_le_bytes());
    b.extend(t.qps.to_le_bytes());
    b.extend(t.results.to_le_bytes());
    b.extend(t.result_locks.to_le_bytes());
    b.extend(t.n_results.to_le_bytes());
    b.extend(t.results_lkey.to_le_bytes());
    for r in t.reserved {
        b.extend(r.to_le_bytes());
    }
    b
}

/// The bytes of a peer table.
pub fn peer_bytes(peers: &[DevicePeer]) -> Vec<u8> {
    peers
        .iter()
        .flat_map(|p| {
            let mut b = p.heap_base.to_le_bytes().to_vec();
            b.extend(p.transport.to_le_bytes());
            b.extend(p.qp.to_le_bytes());
            b.extend(p.raddr.to_le_bytes());
            b.extend(p.rkey.to_le_bytes());
            b.extend(p.flags.to_le_bytes());
            b
        })
        .collect()
}

/// Host memory registered into CUDA (PORTABLE | DEVICEMAP) and its device address;
/// unregistered on drop.
pub struct HostRegistration {
    host: *mut u8,
    dev: u64,
    ctx: Arc<Ctx>,
}

// SAFETY: plain addresses; the driver calls are thread-safe (context made current first).
unsafe impl Send for HostRegistration {}
// SAFETY: as above; &self only reads the integers.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `[host, host + len)` (page-aligned memory that outlives the registration).
    ///
    /// # Safety
    /// The memory must stay allocated until the registration drops.
    pub unsafe fn new(ctx: &Arc<Ctx>, host: *mut u8, len: usize, what: &str) -> Result<Self> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe {
            Self::with_flags(
                ctx,
                host,
                len,
                sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP,
                what,
            )
        }
    }

    /// [`HostRegistration::new`] with explicit `CU_MEMHOSTREGISTER_*` flags (DEVICEMAP
    /// among them; IOMEMORY for a device's register page).
    ///
    /// # Safety
    /// As for `new`.
    pub unsafe fn with_flags(
        ctx: &Arc<Ctx>,
        host: *mut u8,
        len: usize,
        flags: u32,
        what: &str,
    ) -> Result<Self> {
        ctx.enter()?;
        // SAFETY: the caller guarantees the range is allocated; flags are valid.
        ck(
            unsafe { sys::cuMemHostRegister_v2(host.cast(), len, flags) },
            "cuMemHostRegister",
            || format!("registering {what} ({len} bytes of host memory) with the GPU"),
        )?;
        // Unregistered by Drop if the next call fails.
        let mut reg = HostRegistration {
            host,
            dev: 0,
            ctx: ctx.clone(),
        };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: host was registered with DEVICEMAP above; flags must be 0.
        ck(
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0) },
            "cuMemHostGetDevicePointer",
            || format!("the device address of {what}"),
        )?;
        reg.dev = dev;
        Ok(reg)
    }

    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// `device - host`, for [`to_device`].
    pub fn delta(&self) -> u64 {
        self.dev.wrapping_sub(self.host as u64)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.ctx.enter().is_ok() {
            // SAFETY: registered in new(), unregistered once.
            unsafe { sys::cuMemHostUnregister(self.host.cast()) };
        }
    }
}

/// Page-aligned zeroed host memory (result slots, benchmark buffers).
pub(crate) struct HostBuf {
    pub(crate) ptr: *mut u8,
    pub(crate) layout: Layout,
}

impl HostBuf {
    pub(crate) fn new(len: usize) -> Result<HostBuf> {
        let layout = Layout::from_size_align(
            len.next_multiple_of(crate::config::page_size()),
            crate::config::page_size(),
        )
        .map_err(|e| Error::InvalidArgument(format!("result slots: {e}")))?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::InvalidArgument(format!(
                "cannot allocate {len} bytes of page-aligned host memory"
            )));
        }
        Ok(HostBuf { ptr, layout })
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in new().
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// One queue of a GPU PE. Field order is drop order: the engine detaches the QP first,
/// then the GPU mapping goes, then the memory (held by the Arc, also by the engine's QP).
struct GpuQp {
    _handle: QpHandle<ProxyBackend>,
    _reg: HostRegistration,
    _mem: Arc<QueueMemory>,
}

/// What a GPU PE over the proxy transport owns for the device API's IBGDA path. Field order
/// is drop order (the context outlives it: CudaSide drops it before its context).
pub(crate) struct ProxyGpu {
    table: DevBuf,
    descs: DevBuf,
    locks: DevBuf,
    qps: Vec<GpuQp>,
    results_reg: HostRegistration,
    _results: Staging,
    heap_reg: HostRegistration,
    pd: Arc<MrTable>,
    heap_lkey: u32,
    results_lkey: u32,
    hca: Arc<crate::softhca::SoftHca<ProxyBackend>>,
    peer_table: Vec<DevicePeer>,
}

// SAFETY: raw pointers inside are host memory owned by this value; CUDA handles are used
// with the context made current.
unsafe impl Send for ProxyGpu {}
// SAFETY: as above; nothing is mutated through &self.
unsafe impl Sync for ProxyGpu {}

impl Drop for ProxyGpu {
    fn drop(&mut self) {
        // The queues are detached by their own drops (fields drop after this body); the
        // keys only matter to WQEs of those queues, so deregister once they are gone.
        for q in self.qps.drain(..) {
            drop(q);
        }
        self.pd.deregister(self.heap_lkey);
        self.pd.deregister(self.results_lkey);
        self.hca
            .with_backend(|b| b.gpu_pes = b.gpu_pes.saturating_sub(1));
    }
}

impl ProxyGpu {
    /// For a PE dropped while its kernel may still use its queues (`CudaSide`'s drop
    /// found its stream busy): the engine lets go of the queues as in a normal drop, so
    /// no WQE naming the host heap executes after the heap goes, but everything the
    /// kernel may still read or write — queues with their CQs and doorbell records,
    /// result slots, table, descriptors, locks — stays allocated and registered with
    /// the GPU until the process exits. Freed, a waiting kernel's next read of its CQ
    /// would be an illegal address, a fault that poisons the context every PE of the
    /// process shares. The heap's registration stays too: its pages stay pinned (the
    /// driver holds them) after the PE unmaps the heap, so late stores land in them.
    pub(crate) fn abandon(mut self) {
        for q in self.qps.drain(..) {
            let GpuQp {
                _handle,
                _reg,
                _mem,
            } = q;
            drop(_handle);
            std::mem::forget(_reg);
            std::mem::forget(_mem);
        }
        self.pd.deregister(self.heap_lkey);
        self.pd.deregister(self.results_lkey);
        self.hca
            .with_backend(|b| b.gpu_pes = b.gpu_pes.saturating_sub(1));
        // SAFETY: `hca` and `pd` are read out once and `self` is then forgotten, so
        // neither is dropped twice; they are dropped here (the engine stops with the
        // last reference, as in a normal drop). The other fields are leaked on purpose.
        let (hca, pd) = unsafe { (std::ptr::read(&self.hca), std::ptr::read(&self.pd)) };
        std::mem::forget(self);
        drop(pd);
        drop(hca);
    }

    /// Registers the heap `[heap_host, heap_host + heap_size)` and builds the queues, the
    /// result slots and the table for a PE whose CPU-side proxy is `view`.
    pub(crate) fn new(
        ctx: &Arc<Ctx>,
        view: GpuProxyView,
        heap_host: *mut u8,
        heap_size: usize,
        timeout: Duration,
    ) -> Result<ProxyGpu> {
        // SAFETY: the heap segment is owned by the inner Pe, which outlives the GpuPe's
        // CUDA side (GpuPe field order: cuda drops before pe).
        let heap_reg =
            unsafe { HostRegistration::new(ctx, heap_host, heap_size, "the symmetric heap")? };
        let pd = view.pd.clone();
        // SAFETY: as above; deregistered in Drop before the heap goes.
        let heap_lkey =
            unsafe { pd.register(heap_host, heap_reg.dev(), heap_size as u64, Access::ALL) };
        // Fetched values and read results land here: with a fabric endpoint, in memory
        // registered with it (its backend refuses local buffers outside its regions).
        let results = Staging::new_for(
            ((RESULT_SLOTS as usize + 1) * 8).next_multiple_of(crate::config::page_size()),
            view.fabric.as_ref(),
        )?;
        // SAFETY: `results` is a field of the value returned (dropped after this registration).
        let results_reg = unsafe {
            HostRegistration::new(ctx, results.base(), results.len(), "the IBGDA result slots")?
        };
        // SAFETY: as above; deregistered in Drop.
        let results_lkey = unsafe {
            pd.register(
                results.base(),
                results_reg.dev(),
                results.len() as u64,
                Access::LOCAL_WRITE,
            )
        };
        let (peer_table, ranks) = peer_table(
            &view
                .peers
                .iter()
                .map(|p| p.as_ref().map(|(base, rkey, _)| (*base, *rkey)))
                .collect::<Vec<_>>(),
        );
        let mut me = ProxyGpu {
            table: DevBuf::new(ctx, 64, "the IBGDA table")?,
            descs: DevBuf::new(
                ctx,
                ranks.len().max(1) * std::mem::size_of::<IbgdaQp>(),
                "the IBGDA descriptors",
            )?,
            locks: DevBuf::new(
                ctx,
                RESULT_SLOTS as usize * 4,
                "the IBGDA result-slot locks",
            )?,
            qps: Vec::new(),
            results_reg,
            _results: results,
            heap_reg,
            pd,
            heap_lkey,
            results_lkey,
            hca: view.hca.clone(),
            peer_table,
        };
        // Undone by Drop from here on.
        me.hca.with_backend(|b| b.gpu_pes += 1);
        let mut descs = Vec::with_capacity(ranks.len());
        let mut peers = view.peers;
        for &r in &ranks {
            let (_, _, via) = peers[r].take().expect("a rank with a queue has a peer");
            let mem = Arc::new(
                QueueMemory::new(WQE_CNT, CQE_CNT)
                    .map_err(|e| Error::InvalidArgument(e.to_string()))?,
            );
            // SAFETY: the memory is held by the GpuQp (and the engine) past the registration.
            let reg = unsafe {
                HostRegistration::new(
                    ctx,
                    mem.base(),
                    mem.layout().size,
                    &format!("the queue to PE {r}"),
                )?
            };
            let handle = me.hca.attach(QpConfig::new(
                mem.clone(),
                me.pd.clone(),
                via,
                CqMode::Normal,
            ));
            descs.push(descriptor(&mem, reg.delta(), handle.qpn(), timeout)?);
            me.qps.push(GpuQp {
                _handle: handle,
                _reg: reg,
                _mem: mem,
            });
        }
        me.descs.write(&descriptor_bytes(&descs))?;
        me.locks.write(&vec![0u8; RESULT_SLOTS as usize * 4])?;
        let t = IbgdaTable::new(me.descs.ptr(), ranks.len() as u32).with_results(
            me.results_reg.dev(),
            me.locks.ptr(),
            RESULT_SLOTS,
            me.results_lkey,
        );
        me.table.write(&table_bytes(&t))?;
        Ok(me)
    }

    /// Device address of the heap.
    pub(crate) fn heap_dev(&self) -> u64 {
        self.heap_reg.dev()
    }
    /// `state.lkey`: the heap at its device addresses.
    pub(crate) fn lkey(&self) -> u32 {
        self.heap_lkey
    }
    /// `state.ibgda`.
    pub(crate) fn table_dev(&self) -> u64 {
        self.table.ptr()
    }
    pub(crate) fn peer_table(&self) -> &[DevicePeer] {
        &self.peer_table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::softhca::ibgda_table::{IBGDA_TABLE_MAGIC, IBGDA_VERSION};

    #[test]
    fn peer_table_numbers_queues_over_reachable_peers() {
        let (t, ranks) = peer_table(&[Some((0x7000_0000, 11)), None, Some((0x7100_0000, 13))]);
        assert_eq!(ranks, vec![0, 2]);
        assert_eq!(
            t,
            vec![
                DevicePeer {
                    heap_base: 0,
                    transport: TRANSPORT_IBGDA,
                    qp: 0,
                    raddr: 0x7000_0000,
                    rkey: 11,
                    flags: 0
                },
                DevicePeer {
                    heap_base: 0,
                    transport: TRANSPORT_NONE,
                    qp: 0,
                    raddr: 0,
                    rkey: 0,
                    flags: 0
                },
                DevicePeer {
                    heap_base: 0,
                    transport: TRANSPORT_IBGDA,
                    qp: 1,
                    raddr: 0x7100_0000,
                    rkey: 13,
                    flags: 0
                },
            ]
        );
        assert_eq!(peer_bytes(&t).len(), 3 * 32);
        assert_eq!(&peer_bytes(&t)[8..12], &TRANSPORT_IBGDA.to_le_bytes());
        assert_eq!(&peer_bytes(&t)[64 + 12..64 + 16], &1u32.to_le_bytes());
    }

    #[test]
    fn descriptors_carry_device_addresses() {
        let delta = 0x0000_1000_0000_0000u64.wrapping_sub(0x10); // any delta, even unaligned
        let mems: Vec<QueueMemory> = (0..2)
            .map(|_| QueueMemory::new(WQE_CNT, CQE_CNT).unwrap())
            .collect();
        let descs: Vec<IbgdaQp> = mems
            .iter()
            .enumerate()
            .map(|(i, m)| {
                descriptor(m, delta, 0x100 + i as u32, Duration::from_millis(1500)).unwrap()
            })
            .collect();
        for (m, d) in mems.iter().zip(&descs) {
            let p = m.parts();
            assert_eq!(d.sq, (p.sq as u64).wrapping_add(delta));
            assert_eq!(d.qp_dbrec, (p.qp_dbrec as u64).wrapping_add(delta));
            assert_eq!(d.doorbell, (p.doorbell as u64).wrapping_add(delta));
            assert_eq!(d.cq, (p.cq as u64).wrapping_add(delta));
            assert_eq!(d.cq_dbrec, (p.cq_dbrec as u64).wrapping_add(delta));
            assert_eq!((d.wqe_cnt, d.cqe_cnt), (WQE_CNT, CQE_CNT));
            assert_eq!(d.timeout_ns, 1_500_000_000);
            assert_eq!(d.cq_mode, crate::softhca::ibgda_table::IBGDA_CQ_NORMAL);
            assert_eq!(d.reserved(), 0);
            assert_eq!(d.completed(), 0);
        }
        assert_eq!(descs[1].qpn, 0x101);
        let b = descriptor_bytes(&descs);
        assert_eq!(b.len(), 640);
        // Field by field at the offsets of layout.cuh.
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(u64_at(0), descs[0].sq);
        assert_eq!(u64_at(320 + 24), descs[1].cq);
        assert_eq!(u64_at(320 + 40), 1_500_000_000);
        assert_eq!(u32_at(320 + 48), WQE_CNT);
        assert_eq!(u32_at(320 + 56), 0x101);
        assert!(b[64..320].iter().all(|&x| x == 0), "counters start at 0");
        // A NIC's doorbell register: doorbell_mode (line 1, offset 72) says MMIO, nothing
        // else changes.
        let nic = descriptor(&mems[0], delta, 0x100, Duration::from_millis(1500)).unwrap();
        let m = descriptor_bytes(&[nic.with_mmio_doorbell()]);
        assert_eq!(
            u32::from_le_bytes(m[72..76].try_into().unwrap()),
            crate::softhca::ibgda_table::IBGDA_DOORBELL_MMIO
        );
        assert_eq!(&m[..72], &b[..72]);
        assert_eq!(&m[76..320], &b[76..320]);
        assert_eq!(
            to_device(0x7f00_0000_1000, 0u64.wrapping_sub(0x1000)),
            0x7f00_0000_0000
        );
    }

    #[test]
    fn table_bytes_follow_the_header_layout() {
        let t = IbgdaTable::new(0x7000_0000_0040, 3).with_results(
            0x7000_0010_0000,
            0x7000_0020_0000,
            RESULT_SLOTS,
            77,
        );
        let b = table_bytes(&t);
        assert_eq!(b.len(), 64);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(u32_at(0), IBGDA_TABLE_MAGIC);
        assert_eq!(u32_at(4), IBGDA_VERSION);
        assert_eq!(u32_at(8), 3);
        assert_eq!(u64_at(16), 0x7000_0000_0040);
        assert_eq!(u64_at(24), 0x7000_0010_0000);
        assert_eq!(u64_at(32), 0x7000_0020_0000);
        assert_eq!(u32_at(40), RESULT_SLOTS);
        assert_eq!(u32_at(44), 77);
        assert_eq!(u64_at(48), 0);
        assert_eq!(u64_at(56), 0);
        // The same bytes as the struct's own memory image.
        // SAFETY: IbgdaTable is repr(C) plain data, 64 bytes, no padding.
        let raw = unsafe { std::slice::from_raw_parts((&t as *const IbgdaTable).cast::<u8>(), 64) };
        assert_eq!(raw, &b[..]);
    }
}
