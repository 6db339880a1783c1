//! [`GpuPe`]: a processing element whose symmetric heap lives in GPU memory.
//!
//! A `GpuPe` wraps a CPU-side [`Pe`] for everything that is not GPU memory: bootstrap,
//! rank, teams, host barriers (its CPU heap is only the 1 MiB runtime needs for team
//! barrier counters). On top it holds:
//! - the PE's CUDA device (picked from the node-local rank, `local_rank % device_count`;
//!   `RSHMEM_DEVICE` overrides) and that device's *primary* context, shared by every PE of
//!   the process on that device;
//! - a non-blocking stream of its own (PEs in one process must not serialise on the
//!   legacy default stream);
//! - the GPU symmetric heap (`RSHMEM_SYMMETRIC_SIZE` rounded up to the VMM granularity),
//!   mapped by every PE of the node ([`super::heap`], [`super::fdpass`]);
//! - the peer table (device memory) and the device error record (host-pinned, mapped)
//!   that [`GpuPe::bind_module`] writes into a module's `rshmemi_device_state`.
//!
//! Threads: every method first makes the context current on the calling thread, so a
//! `GpuPe` may be used from any thread; collectives follow the rules of [`Pe`].

use super::driver::{ck, driver, settle_sync_copies};
use super::harness::HarnessArgs;
use super::heap::{VmmMapping, SYNC_BYTES, SYNC_OFFSET};
use super::module::{Ctx, Module, SIGNAL_PTX};
use super::state::{self, DeviceError, DevicePeer, DeviceState, DeviceTeamEntry};
use crate::config::{Settings, TransportMode};
use crate::error::{Error, Result};
use crate::heap::{Allocator, MAX_ALIGN, RESERVED_BYTES};
use crate::pe::{exchange_status, random_token, HeapCall, Pe, PeConfig};
use crate::team::Team;
use crate::types::{SignalOp, SymPtr};
use cudarc::driver::sys;
use std::collections::BTreeSet;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The CPU heap size a GPU PE's inner `Pe` uses (runtime region + a little).
pub const CPU_HEAP_BYTES: usize = 1 << 20;

/// Device facts a GpuPe caches.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: i32,
    pub name: String,
    pub pci_bus_id: String,
    pub cc: (i32, i32),
    pub sms: u32,
    pub cooperative: bool,
}

/// Host-pinned, device-mapped memory (the error record).
struct Pinned {
    host: *mut u8,
    dev: u64,
    ctx: Arc<Ctx>,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.ctx.enter().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc in this context, freed once.
            unsafe { sys::cuMemFreeHost(self.host.cast()) };
        }
    }
}

/// Device memory from cuMemAlloc (peer table, result records).
pub struct DevBuf {
    pub(crate) ptr: u64,
    pub(crate) bytes: usize,
    ctx: Arc<Ctx>,
}

impl DevBuf {
    pub(crate) fn new(ctx: &Arc<Ctx>, bytes: usize, what: &str) -> Result<DevBuf> {
        ctx.enter()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; context current.
        ck(
            unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) },
            "cuMemAlloc",
            || format!("{bytes} bytes for {what}"),
        )?;
        Ok(DevBuf {
            ptr: p,
            bytes,
            ctx: ctx.clone(),
        })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    fn check_len(&self, len: usize, op: &str) -> Result<()> {
        if len > self.bytes {
            return Err(Error::InvalidArgument(format!(
                "device buffer {op} of {len} bytes: the buffer holds {}",
                self.bytes
            )));
        }
        Ok(())
    }

    /// Synchronous host → device copy into the buffer: the bytes are in device memory
    /// when it returns ([`settle_sync_copies`]).
    pub fn write(&self, data: &[u8]) -> Result<()> {
        self.check_len(data.len(), "write")?;
        self.ctx.enter()?;
        // SAFETY: data.len() <= bytes of a live allocation.
        ck(
            unsafe { sys::cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), data.len()) },
            "cuMemcpyHtoD",
            || "writing a device buffer".into(),
        )?;
        settle_sync_copies(|| format!("{} bytes into a device buffer", data.len()))
    }

    /// Synchronous device → host copy.
    pub fn read(&self, out: &mut [u8]) -> Result<()> {
        self.check_len(out.len(), "read")?;
        self.ctx.enter()?;
        // SAFETY: out.len() <= bytes of a live allocation.
        ck(
            unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr, out.len()) },
            "cuMemcpyDtoH",
            || "reading a device buffer".into(),
        )
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ctx.enter().is_ok() {
            // SAFETY: allocated by cuMemAlloc, freed once.
            unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

struct Stream {
    raw: sys::CUstream,
    ctx: Arc<Ctx>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.enter().is_ok() {
            // SAFETY: created in this context, destroyed once.
            unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// The device API's IBGDA queues of a GPU PE: soft-HCA queues (`RSHMEM_TRANSPORT=proxy`)
/// or a NIC's (`RSHMEM_TRANSPORT=ibgda`).
enum Queues {
    Proxy(super::ibgda::ProxyGpu),
    Nic(super::nic::NicGpu),
}

impl Queues {
    fn heap_dev(&self) -> u64 {
        match self {
            Queues::Proxy(q) => q.heap_dev(),
            Queues::Nic(q) => q.heap_dev(),
        }
    }
    fn lkey(&self) -> u32 {
        match self {
            Queues::Proxy(q) => q.lkey(),
            Queues::Nic(q) => q.lkey(),
        }
    }
    fn table_dev(&self) -> u64 {
        match self {
            Queues::Proxy(q) => q.table_dev(),
            Queues::Nic(q) => q.table_dev(),
        }
    }
}

/// The CPU-side PE's settings of a GPU PE: a small host heap unless the proxy transport
/// uses it as the symmetric heap; under ibgda the CPU side only needs the bootstrap
/// (node-local p2p, which maps nothing the GPU uses).
fn cpu_settings(settings: &Settings) -> Settings {
    let mut cpu = settings.clone();
    match settings.transport {
        // The GPU heap is this CPU heap, and its [32 KiB, 64 KiB) is the device sync
        // scratch: the CPU side must not keep its put-assist table there (the device's
        // barrier counters would read as offered puts to every CPU wait's scan).
        TransportMode::Proxy => cpu.p2p_assist = crate::assist::AssistMode::Off,
        TransportMode::Ibgda => {
            cpu.transport = TransportMode::P2p;
            cpu.symmetric_size = CPU_HEAP_BYTES;
        }
        TransportMode::Auto | TransportMode::P2p => cpu.symmetric_size = CPU_HEAP_BYTES,
    }
    cpu
}

/// `rshmem_device_state_t.flags`' device-side checks: on unless `RSHMEM_DEVICE_CHECKS=0`
/// (`Settings::device_checks`).
fn checks_flag(settings: &Settings) -> u32 {
    if settings.device_checks {
        state::STATE_CHECKS
    } else {
        0
    }
}

/// Collective: every PE's GPU heap must have the same size (RSHMEM_SYMMETRIC_SIZE is
/// rounded to each GPU's granularity, which could differ across GPUs).
fn same_heap_size(
    boot: &crate::bootstrap::Bootstrap,
    world: &crate::bootstrap::Group,
    heap_size: usize,
) -> Result<()> {
    let sizes = boot.allgather(world, &(heap_size as u64).to_le_bytes())?;
    if sizes.iter().any(|s| *s != sizes[0]) {
        return Err(Error::CollectiveMismatch {
            op: "GPU heap size (RSHMEM_SYMMETRIC_SIZE rounded to each GPU's granularity)",
            detail: sizes
                .iter()
                .enumerate()
                .map(|(r, s)| format!("PE {r}: {} bytes", crate::pe::le_u64(s)))
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    Ok(())
}

/// A per-job value for the QPs' initial packet sequence numbers (FNV-1a of the job id),
/// so a stale packet of another job is unlikely to fall in a new QP's window.
fn job_salt(job: &str) -> u64 {
    job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Everything CUDA a GpuPe owns, in drop order (fields drop top to bottom; the context
/// goes last, after everything allocated in it).
struct CudaSide {
    /// Proxy and ibgda transports: the queues, table and registrations of the IBGDA path
    /// (dropped first: the engine or the NIC lets go of the queues before anything they
    /// name goes; the heap's NIC registration goes before `heaps`).
    ibgda: Option<Queues>,
    /// The next three are dropped by hand (`Drop for CudaSide`): after `ibgda`, as their
    /// declaration order says, and not at all while a kernel may still use them.
    signal: ManuallyDrop<Module>,
    err: ManuallyDrop<Pinned>,
    peers_table: ManuallyDrop<DevBuf>,
    /// Mapping of every node peer's heap (this PE's own at its rank), by world rank.
    heaps: Vec<Option<VmmMapping>>,
    stream: Stream,
    ctx: Arc<Ctx>,
}

impl Drop for CudaSide {
    /// Makes the context current (the fields' own drops call the driver) and gives
    /// outstanding work on the stream a bounded chance to finish before memory is unmapped.
    fn drop(&mut self) {
        if self.ctx.enter().is_err() {
            // No driver call can be made: the fields dropped by hand are left too.
            return;
        }
        let until = Instant::now() + Duration::from_secs(2);
        let stream = self.stream.raw;
        let busy = || {
            // SAFETY: the stream belongs to this context.
            let rc = unsafe { sys::cuStreamQuery(stream) };
            rc == sys::CUresult::CUDA_ERROR_NOT_READY
        };
        while busy() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        if busy() {
            // A kernel still runs (a wait that has not timed out yet). Unmapping the heaps
            // under it would fault, and the fault is sticky in the context every PE of
            // this process shares: leave the mappings to the process's exit instead. The
            // same for what the kernel reads or writes (the peer table, the error record)
            // and its module: whether cuMemFree and cuModuleUnload wait for a running
            // kernel is not promised. Leaking those also keeps their references to the
            // context, so the primary context is not released under the kernel either.
            // The stream may go: cuStreamDestroy with work pending returns at once and
            // frees the stream when the work is done.
            eprintln!(
                "rshmem: GPU {}: work still running on a PE's stream 2 s after it ended; \
                 its heap mappings, queues, peer table, error record and module are left \
                 in place until the process exits",
                self.ctx.ordinal
            );
            for m in std::mem::take(&mut self.heaps) {
                std::mem::forget(m);
            }
            // Likewise the queues: a NIC's with their registrations and MRs (the kernel
            // may still post, and the NIC then still reads and writes them); the soft
            // HCA's memory, while its engine lets go of them (it must stop before the
            // host heap goes).
            match self.ibgda.take() {
                Some(Queues::Nic(n)) => std::mem::forget(n),
                Some(Queues::Proxy(p)) => p.abandon(),
                None => {}
            }
            return;
        }
        // The queues first (the engine or the NIC lets go of them before anything they
        // name goes), then the three dropped by hand, then the rest in field order.
        drop(self.ibgda.take());
        // SAFETY: each is dropped once, here, and not used after (the struct is being
        // dropped; its remaining fields do not refer to them).
        unsafe {
            ManuallyDrop::drop(&mut self.signal);
            ManuallyDrop::drop(&mut self.err);
            ManuallyDrop::drop(&mut self.peers_table);
        }
    }
}

/// What a host-side access of a PE's GPU heap may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Area {
    /// The user heap, `[RESERVED_BYTES, heap_size)`: every public accessor.
    Heap,
    /// The device sync scratch, `[SYNC_OFFSET, RESERVED_BYTES)`: the runtime's own
    /// accesses (team entries that kernels read by slot).
    SyncScratch,
}

impl Area {
    /// `[lo, hi)` of the area in a heap of `heap_size` bytes.
    fn bounds(self, heap_size: usize) -> (usize, usize) {
        match self {
            Area::Heap => (RESERVED_BYTES, heap_size),
            Area::SyncScratch => (SYNC_OFFSET, RESERVED_BYTES.min(heap_size)),
        }
    }

    /// Whether `[offset, offset + len)` lies inside the area.
    fn holds(self, offset: usize, len: usize, heap_size: usize) -> bool {
        let (lo, hi) = self.bounds(heap_size);
        offset >= lo && offset.checked_add(len).is_some_and(|end| end <= hi)
    }
}

/// One GPU processing element.
pub struct GpuPe {
    cuda: CudaSide,
    info: DeviceInfo,
    heap_size: usize,
    /// Who else has a heap on this PE's GPU.
    sharing: Sharing,
    peer_table: Vec<DevicePeer>,
    flags: u32,
    timeout: Duration,
    alloc: Mutex<Allocator>,
    pe: Pe,
}

// SAFETY: the raw CUDA handles inside are usable from any thread once the context is made
// current (every method does); host-pinned memory is only read with volatile loads.
unsafe impl Send for GpuPe {}
// SAFETY: as above; mutation goes through the Mutex or the driver.
unsafe impl Sync for GpuPe {}

impl std::fmt::Debug for GpuPe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPe")
            .field("rank", &self.pe.my_pe())
            .field("n_pes", &self.pe.n_pes())
            .field("device", &self.info)
            .field("heap_size", &self.heap_size)
            .finish_non_exhaustive()
    }
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute, what: &str) -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer and device.
    ck(
        unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) },
        "cuDeviceGetAttribute",
        || what.to_string(),
    )?;
    Ok(v)
}

fn bus_id(dev: sys::CUdevice) -> Result<String> {
    let mut b = [0 as std::ffi::c_char; 64];
    // SAFETY: buffer of 63 usable bytes + NUL.
    ck(
        unsafe { sys::cuDeviceGetPCIBusId(b.as_mut_ptr(), 63, dev) },
        "cuDeviceGetPCIBusId",
        || "PCI bus id".into(),
    )?;
    // SAFETY: NUL-terminated (last byte never written).
    Ok(unsafe { std::ffi::CStr::from_ptr(b.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// Number of CUDA devices visible to this process.
pub fn device_count() -> Result<usize> {
    driver()?;
    let mut n = 0;
    // SAFETY: valid out-pointer; driver initialised.
    ck(
        unsafe { sys::cuDeviceGetCount(&mut n) },
        "cuDeviceGetCount",
        || "counting GPUs".into(),
    )?;
    Ok(n.max(0) as usize)
}

/// Facts about device `ordinal`.
pub fn device_info(ordinal: i32) -> Result<DeviceInfo> {
    driver()?;
    use sys::CUdevice_attribute as A;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out-pointer.
    ck(
        unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
        "cuDeviceGet",
        || format!("GPU {ordinal}"),
    )?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: 255 usable bytes + NUL.
    ck(
        unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 255, dev) },
        "cuDeviceGetName",
        || format!("GPU {ordinal}"),
    )?;
    // SAFETY: NUL-terminated.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok(DeviceInfo {
        ordinal,
        name,
        pci_bus_id: bus_id(dev)?,
        cc: (
            attr(
                dev,
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                "compute capability",
            )?,
            attr(
                dev,
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                "compute capability",
            )?,
        ),
        sms: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count")?.max(0) as u32,
        cooperative: attr(
            dev,
            A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
            "cooperative launch",
        )? != 0,
    })
}

impl GpuPe {
    /// Starts this process's GPU PE from the environment, like [`Pe::init`].
    pub fn init() -> Result<GpuPe> {
        GpuPe::init_from_settings(Settings::from_env()?)
    }

    /// [`GpuPe::init`] with `settings` instead of the environment's (their
    /// `symmetric_size` is the GPU heap size; every PE must pass the same).
    pub fn init_from_settings(settings: Settings) -> Result<GpuPe> {
        driver()?;
        let pe = Pe::init_unbound(cpu_settings(&settings))?;
        GpuPe::from_pe(pe, settings)
    }

    /// Starts a GPU PE with explicit parameters (`cfg.settings.symmetric_size` is the GPU
    /// heap size).
    pub fn init_with(cfg: PeConfig, root: Option<crate::bootstrap::Root>) -> Result<GpuPe> {
        driver()?;
        let settings = cfg.settings.clone();
        let mut cpu_cfg = cfg;
        cpu_cfg.settings = cpu_settings(&settings);
        let pe = Pe::init_with(cpu_cfg, root)?;
        GpuPe::from_pe(pe, settings)
    }

    fn from_pe(pe: Pe, settings: Settings) -> Result<GpuPe> {
        let g = match settings.transport {
            TransportMode::Proxy => GpuPe::from_pe_proxy(pe, settings),
            TransportMode::Ibgda => GpuPe::from_pe_ibgda(pe, settings),
            TransportMode::Auto | TransportMode::P2p => GpuPe::from_pe_p2p(pe, settings),
        }?;
        // The teams every kernel may name: RSHMEM_TEAM_WORLD (the device needs no entry
        // for it; written so that the scratch describes every team it serves) and
        // RSHMEM_TEAM_SHARED. A local write each; the next host barrier or kernel launch
        // comes after it on this PE.
        g.publish_team(g.pe.world())?;
        g.publish_team(g.pe.node())?;
        Ok(g)
    }

    fn from_pe_p2p(pe: Pe, settings: Settings) -> Result<GpuPe> {
        let world = pe.world().group();
        let boot = pe.boot();
        let rank = pe.my_pe();
        let n = pe.n_pes();
        let node: Vec<usize> = pe.node().members().iter().map(|&r| r as usize).collect();
        let ((ctx, stream, info, rdma), ids, sharing) = open_device(&pe, true)?;
        let ordinal = info.ordinal;

        // A job-wide secret for the fd exchange: PE 0's random token.
        let tok = boot.allgather(&world, random_token()?.as_bytes())?;
        let mut token = [0u8; 16];
        for (i, t) in token.iter_mut().enumerate() {
            *t = tok[0]
                .get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())
                .ok_or_else(|| {
                    Error::InvalidArgument("PE 0 sent a malformed GPU job token".into())
                })?;
        }

        // The heap.
        let heap = super::heap::granularity(ordinal)
            .and_then(|g| super::launch::round_to_granularity(settings.symmetric_size, g))
            .and_then(|size| VmmMapping::create(ordinal, size, rdma, false));
        exchange_status(boot, &world, "create its GPU heap", &heap)?;
        let mine = heap?;
        let heap_size = mine.size();
        same_heap_size(boot, &world, heap_size)?;

        // Where each heap lives (process, address): PEs of this process map a peer's heap
        // through its address (VmmMapping::retain). A process is named by a random nonce,
        // not its pid: processes in different pid namespaces may share a pid (and, alike,
        // the heap's address), and retain would then map this process's own heap.
        let mut place = Vec::with_capacity(16);
        place.extend_from_slice(&process_nonce().to_le_bytes());
        place.extend_from_slice(&mine.va().to_le_bytes());
        let places = boot.allgather(&world, &place)?;
        let place_of = |r: usize| -> Result<(u64, u64)> {
            let p = &places[r];
            if p.len() != 16 {
                return Err(Error::InvalidArgument(format!(
                    "PE {r} sent a malformed heap location ({} bytes)",
                    p.len()
                )));
            }
            Ok((crate::pe::le_u64(&p[..8]), crate::pe::le_u64(&p[8..])))
        };

        // Exchange handles with the node's PEs in other processes: serve ours, barrier,
        // fetch theirs. Node peers in this process are mapped through their address
        // (below) and take no fd, so a job whose GPU PEs are threads of one process
        // exports nothing: it does not depend on POSIX-fd handles (which a sandboxed
        // driver, gVisor's nvproxy, may not forward). Whether r is in another process is
        // symmetric, so a PE serves exactly the peers that fetch from it.
        let others: BTreeSet<usize> = node.iter().copied().filter(|&r| r != rank).collect();
        // A malformed place fails here through the status exchange below (collectively).
        let elsewhere: Result<BTreeSet<usize>> = others
            .iter()
            .filter_map(|&r| match place_of(r) {
                Ok((process, _)) => (process != process_nonce()).then_some(Ok(r)),
                Err(e) => Some(Err(e)),
            })
            .collect();
        let ex = super::fdpass::FdExchange {
            job: pe.job_id().to_string(),
            rank,
            token,
            heap_size: heap_size as u64,
            timeout: settings.timeout,
        };
        // The device count too before the status exchange: a PE that failed it after the
        // barrier left its peers fetching from it, one timeout each (from a review,
        // 2026-12-07).
        let served = elsewhere.and_then(|elsewhere| {
            let count = device_count()?;
            if elsewhere.is_empty() {
                return Ok((count, elsewhere, None));
            }
            let fd = mine.export()?;
            use std::os::fd::AsRawFd;
            let server = ex.serve(fd.as_raw_fd(), elsewhere.clone())?;
            Ok((count, elsewhere, Some(server)))
        });
        exchange_status(boot, &world, "export its GPU heap", &served)?;
        let (my_dev_count, elsewhere, server) = served?;
        boot.barrier(&world)?;
        let mut heaps: Vec<Option<VmmMapping>> = (0..n).map(|_| None).collect();
        // Peers reached over P2P without native atomics (PEER_NO_P2P_ATOMICS).
        let mut no_atomics = vec![false; n];
        // Node peers whose GPU this process does not see (CUDA_VISIBLE_DEVICES).
        let mut unseen: Vec<usize> = Vec::new();
        let mut import_one = |r: usize| -> Result<()> {
            let (process, va) = place_of(r)?;
            let fd = if elsewhere.contains(&r) {
                Some(ex.fetch(r)?)
            } else {
                None
            };
            // The peer's GPU as this process numbers it, and whether we can reach it.
            let peer_bus = String::from_utf8_lossy(&ids[r]).into_owned();
            let mut peer_ord = None;
            for o in 0..my_dev_count as i32 {
                let mut d: sys::CUdevice = 0;
                // SAFETY: valid out-pointer and ordinal < count.
                ck(
                    unsafe { sys::cuDeviceGet(&mut d, o) },
                    "cuDeviceGet",
                    || format!("GPU {o}"),
                )?;
                if bus_id(d)? == peer_bus {
                    peer_ord = Some(d);
                }
            }
            let reachable = match peer_ord {
                Some(d) if d == ctx.dev => true,
                Some(d) => {
                    let mut can = 0;
                    // SAFETY: valid out-pointer and devices.
                    ck(
                        unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.dev, d) },
                        "cuDeviceCanAccessPeer",
                        || format!("GPU {ordinal} -> PE {r}'s GPU"),
                    )?;
                    if can != 0 {
                        let mut atomics = 0;
                        // SAFETY: valid out-pointer, attribute and devices.
                        let rc = unsafe {
                            sys::cuDeviceGetP2PAttribute(
                                &mut atomics,
                                sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                                ctx.dev,
                                d,
                            )
                        };
                        // A driver that cannot say is taken at its word's safe side.
                        let why = match ck(rc, "cuDeviceGetP2PAttribute", || {
                            format!("GPU {ordinal} -> PE {r}'s GPU: native atomics")
                        }) {
                            Ok(()) if atomics != 0 => None,
                            Ok(()) => Some("has no native atomics".to_string()),
                            Err(e) => Some(format!("may lack native atomics ({e})")),
                        };
                        if let Some(why) = why {
                            eprintln!(
                                "rshmem: PE {rank}: the P2P link from GPU {ordinal} to PE {r}'s \
                                 GPU {why}: loads, stores and signal SETs to PE {r} go over P2P, \
                                 read-modify-write atomics and signal ADDs to it are refused \
                                 (use NVLink-connected GPUs or RSHMEM_TRANSPORT=proxy)"
                            );
                            no_atomics[r] = true;
                        }
                    }
                    can != 0
                }
                None => {
                    unseen.push(r);
                    false
                }
            };
            if reachable {
                // A peer in this process (several GPU PEs per process) is mapped through
                // its allocation (cuMemRetainAllocationHandle), as NCCL maps same-process
                // peers: CUDA documents importing a POSIX fd in another process, not in
                // the one that exported it.
                heaps[r] = Some(match fd {
                    Some(fd) => VmmMapping::import(fd, heap_size, ordinal, r)?,
                    None => {
                        debug_assert_eq!(process, process_nonce());
                        VmmMapping::retain(va, heap_size, ordinal, r)?
                    }
                });
            }
            Ok(())
        };
        let mut imported: Result<()> = Ok(());
        for &r in &others {
            if imported.is_ok() {
                imported = import_one(r);
            } else if elsewhere.contains(&r) {
                // After a failure, still take (and close) the fd of every later peer that
                // serves this PE: its server would otherwise wait for this PE until its
                // bound before the failure could be shared.
                drop(ex.fetch(r));
            }
        }
        if !unseen.is_empty() {
            // Not mapped: these peers are reached only through a transport that needs no
            // mapping (proxy, ibgda); over p2p, device calls to them trap with BAD_PE. Said
            // once, because the usual cause is a launcher's per-rank CUDA_VISIBLE_DEVICES.
            let list: Vec<String> = unseen.iter().map(|r| r.to_string()).collect();
            eprintln!(
                "rshmem: PE {rank}: the GPUs of node peer(s) {} are not visible to this \
                 process (CUDA_VISIBLE_DEVICES={}), so their heaps are not mapped: p2p \
                 cannot reach them. Let every PE of the node see every GPU (select the \
                 device with RSHMEM_DEVICE or the local rank instead), or use \
                 RSHMEM_TRANSPORT=proxy",
                list.join(", "),
                std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
            );
        }
        let joined = server.map_or(Ok(()), |s| s.join());
        let imported = imported.and(joined);
        exchange_status(boot, &world, "map its node peers' GPU heaps", &imported)?;
        imported?;
        heaps[rank] = Some(mine);

        // Peer table, error record, the signal kernel.
        let peer_table: Vec<DevicePeer> = heaps
            .iter()
            .zip(&no_atomics)
            .map(|(h, &no_atomics)| match h {
                Some(m) => DevicePeer {
                    heap_base: m.va(),
                    transport: state::TRANSPORT_P2P,
                    flags: if no_atomics {
                        state::PEER_NO_P2P_ATOMICS
                    } else {
                        0
                    },
                    ..Default::default()
                },
                None => DevicePeer::default(),
            })
            .collect();
        let rest = device_parts(&ctx, &peer_table);
        exchange_status(boot, &world, "set up its device state", &rest)?;
        let (peers_table, err, signal) = rest?;
        let flags = checks_flag(&settings);
        boot.barrier(&world)?;
        Ok(GpuPe {
            cuda: CudaSide {
                ibgda: None,
                signal: ManuallyDrop::new(signal),
                err: ManuallyDrop::new(err),
                peers_table: ManuallyDrop::new(peers_table),
                heaps,
                stream,
                ctx,
            },
            info,
            heap_size,
            sharing,
            peer_table,
            flags,
            timeout: settings.timeout,
            alloc: Mutex::new(Allocator::new(RESERVED_BYTES, heap_size)),
            pe,
        })
    }

    /// A GPU PE over the proxy transport (docs/ibgda-device.md, "GPU PEs over the proxy
    /// transport"): the heap is `pe`'s host shared-memory heap registered into CUDA, and
    /// every peer (this PE too) is reached through IBGDA queues drained by the soft HCA.
    fn from_pe_proxy(pe: Pe, settings: Settings) -> Result<GpuPe> {
        let world = pe.world().group();
        let boot = pe.boot();
        let ((ctx, stream, info, _), _, sharing) = open_device(&pe, false)?;
        let heap_size = pe.heap_size();
        let built = (|| -> Result<(super::ibgda::ProxyGpu, DevBuf, Pinned, Module)> {
            let view = pe
                .proxy_opt()
                .ok_or_else(|| {
                    Error::InvalidArgument(
                        "RSHMEM_TRANSPORT=proxy but this PE has no proxy transport".into(),
                    )
                })?
                .gpu_view();
            let ibgda = super::ibgda::ProxyGpu::new(
                &ctx,
                view,
                pe.heap_host_base(),
                heap_size,
                settings.timeout,
            )?;
            let (table, err, signal) = device_parts(&ctx, ibgda.peer_table())?;
            Ok((ibgda, table, err, signal))
        })();
        exchange_status(
            boot,
            &world,
            "set up its IBGDA queues and device state",
            &built,
        )?;
        let (ibgda, peers_table, err, signal) = built?;
        let peer_table = ibgda.peer_table().to_vec();
        let checks = checks_flag(&settings);
        boot.barrier(&world)?;
        Ok(GpuPe {
            cuda: CudaSide {
                ibgda: Some(Queues::Proxy(ibgda)),
                signal: ManuallyDrop::new(signal),
                err: ManuallyDrop::new(err),
                peers_table: ManuallyDrop::new(peers_table),
                heaps: (0..pe.n_pes()).map(|_| None).collect(),
                stream,
                ctx,
            },
            info,
            heap_size,
            sharing,
            peer_table,
            flags: checks | state::STATE_SELF_IBGDA | state::STATE_HOST_HEAP,
            timeout: settings.timeout,
            alloc: Mutex::new(Allocator::new(RESERVED_BYTES, heap_size)),
            pe,
        })
    }

    /// A GPU PE over a ConnectX NIC (`RSHMEM_TRANSPORT=ibgda`, docs/ibgda.md): the heap is
    /// GPU memory registered with the NIC, and every peer (this PE's own atomics too) is
    /// reached through the NIC's queues, which GPU threads write (`gpu::nic`).
    fn from_pe_ibgda(pe: Pe, settings: Settings) -> Result<GpuPe> {
        let world = pe.world().group();
        let boot = pe.boot();
        let ((ctx, stream, info, rdma), _, sharing) = open_device(&pe, true)?;
        let ordinal = info.ordinal;
        use sys::CUdevice_attribute as A;
        let ordering = attr(
            ctx.dev,
            A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
            "GPUDirect RDMA write ordering",
        );
        const OWNER: i32 =
            sys::CUGPUDirectRDMAWritesOrdering::CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER as i32;
        let heap = match ordering {
            Err(e) => Err(e),
            // A get's data lands in GPU memory and its CQE in host memory: unless the GPU
            // sees the NIC's writes in order, a thread could see the CQE and read stale
            // data.
            Ok(o) if o < OWNER => Err(Error::InvalidArgument(format!(
                "GPU {ordinal} ({}) does not order GPUDirect RDMA writes for its own threads \
                 (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING is {o}, below OWNER), \
                 which RSHMEM_TRANSPORT=ibgda relies on to read fetched data after its \
                 completion; use RSHMEM_TRANSPORT=proxy",
                info.name
            ))),
            Ok(_) if !rdma => Err(Error::InvalidArgument(format!(
                "GPU {ordinal} ({}) does not support GPUDirect RDMA on CUDA VMM memory \
                 (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0), which \
                 RSHMEM_TRANSPORT=ibgda needs for its heap; use RSHMEM_TRANSPORT=proxy",
                info.name
            ))),
            Ok(_) => super::heap::granularity(ordinal)
                .and_then(|g| super::launch::round_to_granularity(settings.symmetric_size, g))
                .and_then(|size| VmmMapping::create(ordinal, size, true, true)),
        };
        exchange_status(boot, &world, "create its GPU heap", &heap)?;
        let mine = heap?;
        let heap_size = mine.size();
        same_heap_size(boot, &world, heap_size)?;
        // `heaps` is declared before `nic`, so on every error path below the NIC's
        // registration of the heap goes before the heap is unmapped.
        let heap_va = mine.va();
        let mut heaps: Vec<Option<VmmMapping>> = (0..pe.n_pes()).map(|_| None).collect();
        heaps[pe.my_pe()] = Some(mine);
        let nic = super::nic::NicGpu::new(
            super::nic::NicSetup {
                ctx: &ctx,
                rank: pe.my_pe(),
                n_pes: pe.n_pes(),
                heap_va,
                heap_size,
                timeout: settings.timeout,
                salt: job_salt(pe.job_id()),
                hca: settings.hca.clone(),
                near: super::nic::Near {
                    gpu: crate::topo::pci_place(&crate::topo::sysfs_root(), &info.pci_bus_id),
                    ordinal: ordinal.max(0) as usize,
                    sysfs: crate::topo::sysfs_root(),
                },
                cpu_doorbell: settings.ibgda_cpu_doorbell,
                ib: settings.ib,
            },
            boot,
            &world,
        )?;
        let rest = device_parts(&ctx, nic.peer_table());
        exchange_status(boot, &world, "set up its device state", &rest)?;
        let (peers_table, err, signal) = rest?;
        let peer_table = nic.peer_table().to_vec();
        if pe.my_pe() == 0 {
            eprintln!("rshmem: GPU PEs over ibgda: {}", nic.summary);
        }
        let checks = checks_flag(&settings);
        boot.barrier(&world)?;
        Ok(GpuPe {
            cuda: CudaSide {
                ibgda: Some(Queues::Nic(nic)),
                signal: ManuallyDrop::new(signal),
                err: ManuallyDrop::new(err),
                peers_table: ManuallyDrop::new(peers_table),
                heaps,
                stream,
                ctx,
            },
            info,
            heap_size,
            sharing,
            peer_table,
            flags: checks | state::STATE_SELF_IBGDA,
            timeout: settings.timeout,
            alloc: Mutex::new(Allocator::new(RESERVED_BYTES, heap_size)),
            pe,
        })
    }

    // ------------------------------------------------------------------ accessors

    /// The CPU-side PE (bootstrap, teams, host barriers).
    pub fn pe(&self) -> &Pe {
        &self.pe
    }
    pub fn my_pe(&self) -> usize {
        self.pe.my_pe()
    }
    pub fn n_pes(&self) -> usize {
        self.pe.n_pes()
    }
    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }
    /// Bytes of every PE's GPU heap (granularity-rounded).
    pub fn heap_size(&self) -> usize {
        self.heap_size
    }
    /// PEs of the node whose heaps are on this PE's GPU (this one included).
    pub fn pes_sharing_gpu(&self) -> usize {
        self.sharing.pes
    }
    /// Processes the PEs on this PE's GPU live in (1: all in this one). Kernels of
    /// different processes take turns on a GPU (unless MPS runs), so PEs whose kernels wait
    /// for each other must share a process there.
    pub fn processes_sharing_gpu(&self) -> usize {
        self.sharing.processes
    }

    /// Ends this PE with the outcome `r` of its work: [`GpuPe::finalize`] (collective)
    /// after success; after an error, a drop without it, as a PE thread of
    /// [`run_gpu_threads`] leaves: its peers then see it leave and report it, instead of
    /// pairing their next barrier with its finalize (and waiting for a kernel launch that
    /// never comes).
    pub fn finish<T>(self, r: Result<T>) -> Result<T> {
        match r {
            Ok(v) => self.finalize().map(|()| v),
            Err(e) => {
                drop(self);
                Err(e)
            }
        }
    }

    /// World-collective: refuses, on every PE, a job in which some GPU holds PEs of more
    /// than one process, for `what` (whose kernels wait for each other's).
    pub fn refuse_gpus_shared_across_processes(&self, what: &str) -> Result<()> {
        let shared = self.sharing.processes;
        let mine = if shared > 1 {
            Err(Error::InvalidArgument(format!(
                "{what}: GPU {} ({}) holds GPU PEs of {shared} processes of this job: kernels \
                 of different processes take turns on a GPU, and these kernels wait for each \
                 other's (they would time out). Start one process per GPU, or run without a \
                 launcher (--pes N: PEs as threads of one process)",
                self.info.ordinal, self.info.name
            )))
        } else {
            Ok(())
        };
        let pe = &self.pe;
        let step = format!("start {what}");
        crate::pe::exchange_status(pe.boot(), &pe.world().group(), &step, &mine)?;
        mine
    }
    /// The peer table as written to the device.
    pub fn peer_table(&self) -> &[DevicePeer] {
        &self.peer_table
    }
    /// Device address of this PE's heap.
    pub fn heap_base(&self) -> u64 {
        if let Some(i) = &self.cuda.ibgda {
            return i.heap_dev();
        }
        self.cuda.heaps[self.my_pe()].as_ref().map_or(0, |m| m.va())
    }
    /// How this PE reaches its peers: `p2p`, `proxy` or `ibgda`.
    pub fn transport(&self) -> TransportMode {
        match self.cuda.ibgda {
            None => TransportMode::P2p,
            Some(Queues::Proxy(_)) => TransportMode::Proxy,
            Some(Queues::Nic(_)) => TransportMode::Ibgda,
        }
    }
    /// The raw stream (for user launches; ordered with the `*_on_stream` calls).
    pub fn stream(&self) -> sys::CUstream {
        self.cuda.stream.raw
    }
    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.cuda.ctx
    }
    /// Makes this PE's context current on the calling thread.
    pub fn enter(&self) -> Result<()> {
        self.cuda.ctx.enter()
    }

    /// Device address of PE `pe`'s symmetric `[offset, offset + len)` as mapped in this
    /// context (host-side `rshmem_ptr`): None when unreachable or out of range.
    pub fn ptr(&self, offset: usize, len: usize, pe: usize) -> Option<u64> {
        self.target(pe, offset, len).ok()
    }

    fn target(&self, pe: usize, offset: usize, len: usize) -> Result<u64> {
        self.target_in(Area::Heap, pe, offset, len)
    }

    /// [`GpuPe::target`] in `area`: the user heap, or (the runtime's own accesses) the
    /// device sync scratch below it.
    fn target_in(&self, area: Area, pe: usize, offset: usize, len: usize) -> Result<u64> {
        if pe >= self.n_pes() {
            return Err(Error::InvalidPe {
                pe,
                n_pes: self.n_pes(),
                scope: "world team",
            });
        }
        let base = match (&self.cuda.ibgda, self.cuda.heaps[pe].as_ref()) {
            (Some(i), _) if pe == self.my_pe() => i.heap_dev(),
            (Some(_), _) => {
                return Err(Error::Unreachable {
                    pe,
                    from: self.my_pe(),
                    reason: format!(
                        "the {} transport maps no peer heap here (the device API reaches it through its queues)",
                        self.transport().name()
                    ),
                })
            }
            (None, Some(m)) => m.va(),
            (None, None) => {
                return Err(Error::Unreachable {
                    pe,
                    from: self.my_pe(),
                    reason:
                        "its GPU heap is not mapped here (another node, or no P2P between the GPUs)"
                            .into(),
                })
            }
        };
        let (lo, hi) = area.bounds(self.heap_size);
        if area.holds(offset, len, self.heap_size) {
            Ok(base + offset as u64)
        } else {
            Err(Error::OutOfBounds {
                pe,
                offset,
                len,
                heap_start: lo,
                heap_end: hi,
            })
        }
    }

    // ------------------------------------------------------------------ allocation

    /// Collective: `size` bytes of GPU heap at the same offset on every PE (16-byte
    /// aligned; `align` up to 4096). Agreement as in [`Pe::malloc`].
    pub fn malloc(&self, size: usize) -> Result<SymPtr<u8>> {
        self.align(16, size)
    }

    /// Collective: like [`GpuPe::malloc`] with an alignment.
    pub fn align(&self, align: usize, size: usize) -> Result<SymPtr<u8>> {
        self.alloc_as(HeapCall::GpuAlloc, align, size)
    }

    fn alloc_as(&self, call: HeapCall, align: usize, size: usize) -> Result<SymPtr<u8>> {
        self.pe
            .agree_heap("gpu malloc", call, &[size as u64, align as u64])?;
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(Error::InvalidArgument(format!(
                "gpu malloc: alignment {align} is not a power of two up to {MAX_ALIGN}"
            )));
        }
        if size == 0 {
            return Ok(SymPtr::from_raw(0, 0));
        }
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        let off = a.alloc(size, align).ok_or_else(|| Error::HeapExhausted {
            pe: self.my_pe(),
            requested: size,
            align,
            free: a.free_bytes(),
            largest_free: a.largest_free(),
            heap_size: self.heap_size,
        })?;
        Ok(SymPtr::from_raw(off, size))
    }

    /// Collective: `size` zeroed bytes; returns after every PE zeroed its copy.
    pub fn calloc(&self, size: usize) -> Result<SymPtr<u8>> {
        // Its own kind: a member at a plain malloc of the same size would skip the barrier.
        let p = self.alloc_as(HeapCall::GpuCalloc, 16, size)?;
        if size > 0 {
            self.memset(p.offset(), 0, size)?;
            self.pe.sync_all()?;
        }
        Ok(p)
    }

    /// Collective: releases an allocation on every PE.
    pub fn free<T>(&self, ptr: SymPtr<T>) -> Result<()> {
        self.pe
            .agree_heap("gpu free", HeapCall::GpuFree, &[ptr.offset() as u64])?;
        if ptr.offset() == 0 {
            return Ok(());
        }
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        a.free(ptr.offset()).map_err(|_| {
            Error::InvalidArgument(format!(
                "gpu free: offset {:#x} is not the start of a live GPU allocation",
                ptr.offset()
            ))
        })
    }

    /// Synchronously sets `[offset, offset+len)` of this PE's heap to `byte` (stream
    /// ordered, then waits).
    pub fn memset(&self, offset: usize, byte: u8, len: usize) -> Result<()> {
        self.memset_in(Area::Heap, offset, byte, len)
    }

    fn memset_in(&self, area: Area, offset: usize, byte: u8, len: usize) -> Result<()> {
        let p = self.target_in(area, self.my_pe(), offset, len)?;
        self.enter()?;
        // SAFETY: range validated inside our mapping; stream of this context.
        ck(
            unsafe { sys::cuMemsetD8Async(p, byte, len, self.stream()) },
            "cuMemsetD8Async",
            || format!("PE {}: memset of {len} bytes at {offset:#x}", self.my_pe()),
        )?;
        self.sync("memset")
    }

    /// Copies host bytes into this PE's heap at `offset` (synchronous: after the PE's
    /// earlier stream work, and landed when it returns).
    pub fn write_local(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.write_in(Area::Heap, offset, data)
    }

    fn write_in(&self, area: Area, offset: usize, data: &[u8]) -> Result<()> {
        let p = self.target_in(area, self.my_pe(), offset, data.len())?;
        self.sync("write_local (ordering after earlier stream work)")?;
        let what = || {
            format!(
                "PE {}: writing {} bytes at {offset:#x}",
                self.my_pe(),
                data.len()
            )
        };
        // SAFETY: validated range; host slice readable.
        ck(
            unsafe { sys::cuMemcpyHtoD_v2(p, data.as_ptr().cast(), data.len()) },
            "cuMemcpyHtoD",
            what,
        )?;
        settle_sync_copies(what)
    }

    /// Copies this PE's heap bytes at `offset` to the host (synchronous).
    pub fn read_local(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.read_in(Area::Heap, offset, out)
    }

    fn read_in(&self, area: Area, offset: usize, out: &mut [u8]) -> Result<()> {
        let p = self.target_in(area, self.my_pe(), offset, out.len())?;
        self.sync("read_local (ordering after earlier stream work)")?;
        // SAFETY: validated range; host slice writable.
        ck(
            unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, out.len()) },
            "cuMemcpyDtoH",
            || {
                format!(
                    "PE {}: reading {} bytes at {offset:#x}",
                    self.my_pe(),
                    out.len()
                )
            },
        )
    }

    // ------------------------------------------------------------------ teams

    /// Writes `team`'s device entry into this PE's sync scratch (slot `team.slot()`), so
    /// that kernels can name it by its slot. A team whose members are not strided in world
    /// ranks gets no entry (kernels naming it trap; [`GpuPe::device_team`] says why).
    fn publish_team(&self, team: &Team) -> Result<()> {
        match DeviceTeamEntry::strided(team.members(), team.my_pe()) {
            Some(e) => self.write_in(
                Area::SyncScratch,
                SYNC_OFFSET + state::team_area_offset(team.slot()),
                &e.to_bytes(),
            ),
            None => Ok(()),
        }
    }

    /// The device handle (`rshmem_team_t`) of `team`, to pass to kernels: its slot, the
    /// same number on every member (`RSHMEM_TEAM_WORLD` is 0, `RSHMEM_TEAM_SHARED` 1).
    /// A team made with `pe().team_split_strided` instead of [`GpuPe::team_split_strided`]
    /// gets its device entry here. Errors for a team the device cannot serve: members that
    /// are not `start, start + stride, ...` in world ranks, or more than 4096 of them.
    /// Destroy a team kernels used with [`GpuPe::team_destroy`] (it also clears the
    /// team's device barrier words for the slot's next team).
    pub fn device_team(&self, team: &Team) -> Result<i32> {
        if let Some(e) = DeviceTeamEntry::strided(team.members(), team.my_pe()) {
            let at = SYNC_OFFSET + state::team_area_offset(team.slot());
            let mut have = [0u8; 16];
            self.read_in(Area::SyncScratch, at, &mut have)?;
            if have != e.to_bytes() {
                self.write_in(Area::SyncScratch, at, &e.to_bytes())?;
            }
        } else {
            return Err(Error::InvalidArgument(format!(
                "team {:#x} ({} PEs: {:?}{}) is not a device team: the device API serves teams \
                 whose world ranks are start, start + stride, ... with at most {} members",
                team.uid(),
                team.n_pes(),
                &team.members()[..team.n_pes().min(8)],
                if team.n_pes() > 8 { " ..." } else { "" },
                1u32 << state::TEAM_MAX_ROUNDS
            )));
        }
        Ok(team.slot() as i32)
    }

    /// [`Pe::team_split_strided`], and the new team is made visible to this PE's kernels
    /// (its handle: [`GpuPe::device_team`]). Collective over `parent`.
    pub fn team_split_strided(
        &self,
        parent: &Team,
        start: usize,
        stride: usize,
        size: usize,
    ) -> Result<Option<Team>> {
        let team = self.pe.team_split_strided(parent, start, stride, size)?;
        if let Some(t) = &team {
            self.publish_team(t)?;
        }
        Ok(team)
    }

    /// [`Pe::team_destroy`] for a team made with [`GpuPe::team_split_strided`]: waits for
    /// this PE's stream (its kernels are done with the team), destroys the team on the host
    /// (a barrier of the members), then clears the team's device slot (entry, epoch,
    /// barrier words) for the slot's next team. Collective over `team`.
    pub fn team_destroy(&self, team: Team) -> Result<()> {
        self.sync("team_destroy (kernels that may use the team)")?;
        let slot = team.slot();
        self.pe.team_destroy(team)?;
        self.memset_in(
            Area::SyncScratch,
            SYNC_OFFSET + state::team_area_offset(slot),
            0,
            state::TEAM_AREA_BYTES,
        )
    }

    // ------------------------------------------------------------------ stream API

    /// Enqueues a put of `bytes` from local device address `src` to symmetric `dest_offset`
    /// on PE `pe` (a device-to-device copy between mapped heaps, i.e. p2p). Complete, and
    /// visible to PE `pe`, when the stream reaches the next operation.
    pub fn put_on_stream(
        &self,
        dest_offset: usize,
        src: u64,
        bytes: usize,
        pe: usize,
    ) -> Result<()> {
        let dst = self.target(pe, dest_offset, bytes)?;
        self.enter()?;
        // SAFETY: dst validated inside the peer's mapping; src is the caller's device
        // memory of at least `bytes` (documented contract); stream of this context.
        ck(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream()) },
            "cuMemcpyDtoDAsync",
            || {
                format!(
                    "PE {}: put of {bytes} bytes to PE {pe} at {dest_offset:#x}",
                    self.my_pe()
                )
            },
        )
    }

    /// Enqueues a get of `bytes` from symmetric `src_offset` on PE `pe` into local device
    /// address `dst`.
    pub fn get_on_stream(
        &self,
        dst: u64,
        src_offset: usize,
        bytes: usize,
        pe: usize,
    ) -> Result<()> {
        let src = self.target(pe, src_offset, bytes)?;
        self.enter()?;
        // SAFETY: src validated; dst is the caller's device memory (contract).
        ck(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream()) },
            "cuMemcpyDtoDAsync",
            || {
                format!(
                    "PE {}: get of {bytes} bytes from PE {pe} at {src_offset:#x}",
                    self.my_pe()
                )
            },
        )
    }

    /// Enqueues a signal update of the 8-byte word at `sig_offset` on PE `pe` (SET or ADD)
    /// with release semantics at system scope: stream order puts every earlier operation
    /// of this stream before it, and the release makes them visible to a device-side
    /// `signal_wait_until` that observes the new value.
    pub fn signal_on_stream(
        &self,
        sig_offset: usize,
        value: u64,
        op: SignalOp,
        pe: usize,
    ) -> Result<()> {
        if sig_offset % 8 != 0 {
            return Err(Error::Misaligned {
                offset: sig_offset,
                align: 8,
                op: "signal_on_stream",
            });
        }
        let addr = self.target(pe, sig_offset, 8)?;
        if op == SignalOp::Add
            && pe != self.my_pe()
            && self.peer_table[pe].transport == state::TRANSPORT_P2P
            && self.peer_table[pe].flags & state::PEER_NO_P2P_ATOMICS != 0
        {
            return Err(Error::Unreachable {
                pe,
                from: self.my_pe(),
                reason: "signal_on_stream ADD is an atomic, and the P2P link has no native \
                         atomics (GPUs on PCIe without atomics); use SET, NVLink-connected \
                         GPUs, or RSHMEM_TRANSPORT=proxy and rshmem_signal_op from a kernel"
                    .into(),
            });
        }
        // Over the queue transports (proxy, ibgda) the only heap reachable here is this
        // PE's own, and the peers' atomics on it are the soft HCA's CPU atomics or the
        // NIC's, which a GPU atomic is not atomic against (state.cuh, SELF_IBGDA): a
        // concurrent ADD from a peer could be lost. The device API's signal_op sends such
        // an update through the loopback queue instead.
        if op == SignalOp::Add && self.cuda.ibgda.is_some() {
            return Err(Error::Unreachable {
                pe,
                from: self.my_pe(),
                reason: format!(
                    "signal_on_stream ADD would be a GPU atomic on a heap word that the {} \
                     transport's peers update with {} atomics, and the two are not atomic \
                     against each other; use SET, or rshmem_signal_op from a kernel (it \
                     goes through this PE's loopback queue)",
                    self.transport().name(),
                    match self.cuda.ibgda {
                        Some(Queues::Nic(_)) => "the NIC's",
                        _ => "the soft HCA's CPU",
                    }
                ),
            });
        }
        let f = self.cuda.signal.function("rshmem_host_signal")?;
        let mut a0 = addr;
        let mut a1 = value;
        let mut a2: u32 = match op {
            SignalOp::Set => 0,
            SignalOp::Add => 1,
        };
        let mut params: [*mut c_void; 3] = [
            (&mut a0 as *mut u64).cast(),
            (&mut a1 as *mut u64).cast(),
            (&mut a2 as *mut u32).cast(),
        ];
        // SAFETY: the kernel takes (u64, u64, u32), matching params; the pointers live
        // through the call (the driver copies parameters at launch).
        let rc = unsafe {
            sys::cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                self.stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        ck(rc, "cuLaunchKernel", || {
            format!(
                "PE {}: signal_on_stream to PE {pe} at {sig_offset:#x}",
                self.my_pe()
            )
        })
    }

    /// Stream-ordered quiet. Every `*_on_stream` operation of this PE is complete when the
    /// stream executes the next operation (copies and the signal kernel finish before
    /// later stream work starts), so there is nothing to enqueue: the stream order *is*
    /// the quiet. To wait on the host, use [`GpuPe::quiet`].
    pub fn quiet_on_stream(&self) -> Result<()> {
        Ok(())
    }

    /// Host-side quiet: waits (bounded by RSHMEM_TIMEOUT_MS) until this PE's stream is
    /// idle.
    pub fn quiet(&self) -> Result<()> {
        self.sync("quiet")
    }

    /// Barrier on the stream, implemented on the host: waits for this PE's stream (so its
    /// puts are complete), then a host barrier over all PEs. The calling thread blocks;
    /// later stream work is issued after every PE reached the barrier. A device-side
    /// alternative is `rshmem_barrier_all` in a collective kernel.
    pub fn barrier_on_stream(&self) -> Result<()> {
        self.sync("barrier_on_stream")?;
        self.pe.barrier_all()
    }

    // ------------------------------------------------------------------ modules

    /// Loads PTX (or a cubin) as a module instance of this PE (not yet bound).
    pub fn load_module(&self, name: &str, image: &str) -> Result<Module> {
        Module::load(self.ctx(), name, image)
    }

    /// Loads library module `name` (embedded PTX, or RSHMEM_PTX_DIR; a prebuilt cubin of
    /// that PTX when the directory has one) and binds it.
    pub fn load_library_module(
        &self,
        name: &str,
        ptx_dir: Option<&std::path::Path>,
    ) -> Result<Module> {
        let src = super::module::ptx_source(name, ptx_dir)?;
        let mut m = Module::load_library(self.ctx(), name, &src, ptx_dir, self.info.cc)?;
        if m.global(state::STATE_SYMBOL)?.is_some() {
            self.bind_module(&mut m)?;
        }
        Ok(m)
    }

    /// The state this PE binds into modules.
    pub fn device_state(&self) -> DeviceState {
        DeviceState {
            magic: state::STATE_MAGIC,
            version: state::STATE_VERSION,
            my_pe: self.my_pe() as i32,
            n_pes: self.n_pes() as i32,
            heap_base: self.heap_base(),
            heap_size: self.heap_size as u64,
            peers: self.cuda.peers_table.ptr,
            timeout_ns: self.timeout.as_nanos().min(u64::MAX as u128) as u64,
            sync_offset: SYNC_OFFSET as u64,
            sync_bytes: SYNC_BYTES as u64,
            error: self.cuda.err.dev,
            ibgda: self.cuda.ibgda.as_ref().map_or(0, |i| i.table_dev()),
            flags: self.flags,
            lkey: self.cuda.ibgda.as_ref().map_or(0, |i| i.lkey()),
            reserved: [0; 5],
        }
    }

    /// Writes this PE's state into the module's `rshmemi_device_state` global: from now
    /// on the module's kernels act as this PE. Errors when the module does not include
    /// the device API or was built against another state layout.
    pub fn bind_module(&self, m: &mut Module) -> Result<()> {
        if !Arc::ptr_eq(&m.ctx, self.ctx()) {
            return Err(Error::InvalidArgument(format!(
                "module {} was loaded by another GPU PE (on GPU {}) than PE {} (on GPU {}): \
                 a module belongs to the PE that loaded it (load it once per PE)",
                m.name,
                m.ctx.ordinal,
                self.my_pe(),
                self.ctx().ordinal
            )));
        }
        let (ptr, size) = m.global(state::STATE_SYMBOL)?.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "module {} has no {} global: it does not include rshmem/rshmem.cuh (or uses no device API)",
                m.name,
                state::STATE_SYMBOL
            ))
        })?;
        if size != std::mem::size_of::<DeviceState>() {
            return Err(Error::InvalidArgument(format!(
                "module {}: {} is {size} bytes, this runtime's rshmem_device_state_t is {} (built against another rshmem/state.cuh)",
                m.name,
                state::STATE_SYMBOL,
                std::mem::size_of::<DeviceState>()
            )));
        }
        let s = self.device_state();
        self.enter()?;
        // SAFETY: the global is exactly size_of::<DeviceState>() bytes (checked); DeviceState
        // is repr(C) plain data; synchronous copy.
        ck(
            unsafe { sys::cuMemcpyHtoD_v2(ptr, (&s as *const DeviceState).cast(), size) },
            "cuMemcpyHtoD",
            || format!("binding module {} to PE {}", m.name, self.my_pe()),
        )?;
        // Landed before the caller launches a kernel of the module on its stream.
        settle_sync_copies(|| format!("PE {}'s state into module {}", self.my_pe(), m.name))?;
        m.bound = Some(self.my_pe());
        Ok(())
    }

    /// Compiles user CUDA source with NVRTC for this PE's GPU (the device API headers are
    /// available as `rshmem/rshmem.cuh`), loads it and binds it when it uses the device API.
    pub fn compile_user_source(
        &self,
        src: &str,
        name: &str,
        extra_opts: &[&str],
    ) -> Result<Module> {
        let ptx = super::module::nvrtc_compile(src, name, self.info.cc, extra_opts)?;
        let mut m = self.load_module(name, &ptx)?;
        if m.global(state::STATE_SYMBOL)?.is_some() {
            self.bind_module(&mut m)?;
        }
        Ok(m)
    }

    // ------------------------------------------------------------------ launches

    /// Launches `kernel` of `m` on this PE's stream with raw parameters.
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list (one pointer per parameter, each
    /// to a value of the parameter's type), and the kernel's memory accesses must be valid.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw(
        &self,
        m: &Module,
        kernel: &str,
        grid: u32,
        block: u32,
        smem: u32,
        params: &mut [*mut c_void],
        cooperative: bool,
    ) -> Result<()> {
        let f = m.function(kernel)?;
        // SAFETY: the caller guarantees params; f is from a module of this context.
        let rc = unsafe {
            if cooperative {
                sys::cuLaunchCooperativeKernel(
                    f,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    smem,
                    self.stream(),
                    params.as_mut_ptr(),
                )
            } else {
                sys::cuLaunchKernel(
                    f,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    smem,
                    self.stream(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
        };
        ck(
            rc,
            if cooperative {
                "cuLaunchCooperativeKernel"
            } else {
                "cuLaunchKernel"
            },
            || {
                format!(
                    "PE {}: launching {kernel} ({} grid {grid} block {block})",
                    self.my_pe(),
                    m.name
                )
            },
        )
    }

    /// Launches a harness kernel (`rshmem_harness_args_t` by value).
    pub fn launch_harness(
        &self,
        m: &Module,
        kernel: &str,
        grid: u32,
        block: u32,
        args: &HarnessArgs,
        cooperative: bool,
    ) -> Result<()> {
        if m.bound != Some(self.my_pe()) {
            return Err(Error::InvalidArgument(format!(
                "module {} is not bound to PE {}",
                m.name,
                self.my_pe()
            )));
        }
        let mut a = *args;
        let mut params = [(&mut a as *mut HarnessArgs).cast::<c_void>()];
        // SAFETY: harness kernels take one rshmem_harness_args_t by value (harness.cuh),
        // which HarnessArgs mirrors; the pointers in it are set by the runner.
        unsafe { self.launch_raw(m, kernel, grid, block, 0, &mut params, cooperative) }
    }

    /// How many blocks of `kernel` (at `block` threads and `smem` bytes of dynamic shared
    /// memory, as it will be launched) one SM holds at once (the driver's occupancy
    /// calculator).
    pub fn blocks_per_sm(&self, m: &Module, kernel: &str, block: u32, smem: usize) -> Result<u32> {
        let f = m.function(kernel)?;
        let mut per_sm = 0;
        // SAFETY: valid out-pointer and function.
        ck(
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, f, block as i32, smem)
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            || format!("sizing {kernel}"),
        )?;
        Ok(per_sm.max(0) as u32)
    }

    /// Grid and launch mode for a collective kernel launched with `block` threads and
    /// `smem` bytes of dynamic shared memory (co-resident with the other PEs' grids on this
    /// GPU; see [`super::launch`]). Sizing it for less shared memory than the launch uses
    /// would let several PEs' grids oversubscribe the SMs and wait on each other.
    pub fn collective_grid(
        &self,
        m: &Module,
        kernel: &str,
        block: u32,
        smem: usize,
        requested: u32,
    ) -> Result<(u32, bool)> {
        let per_sm = self.blocks_per_sm(m, kernel, block, smem)?;
        let grid = super::launch::co_resident_grid(
            kernel,
            block,
            per_sm,
            self.info.sms,
            self.sharing.pes as u32,
            requested,
        )?;
        Ok((
            grid,
            super::launch::use_cooperative(self.sharing.pes as u32, self.info.cooperative),
        ))
    }

    /// The device error record as the device left it.
    pub fn device_error(&self) -> DeviceError {
        // SAFETY: 64 bytes of host-pinned memory owned by this PE; the device writes it
        // with a __threadfence_system before `code`; volatile so the compiler rereads it.
        unsafe { std::ptr::read_volatile(self.cuda.err.host.cast::<DeviceError>()) }
    }

    /// What this PE's device error record says, as the error of `what` (None: empty).
    pub fn device_fault(&self, what: &str) -> Option<Error> {
        let e = self.device_error();
        (e.code != state::ERR_NONE).then(|| e.fault(self.my_pe(), what))
    }

    /// How long [`GpuPe::sync`] and the EP bench's event waits wait for the stream: the
    /// PE's timeout, which bounds every device wait, plus 10 s for the kernels to see it
    /// and end.
    pub fn stream_bound(&self) -> Duration {
        self.timeout + Duration::from_secs(10)
    }

    /// Waits until this PE's stream is idle, bounded by RSHMEM_TIMEOUT_MS plus 10 s (the
    /// device's own waits are bounded by the timeout and trap). A failure is turned into
    /// [`Error::DeviceFault`] when the device wrote its error record.
    pub fn sync(&self, what: &str) -> Result<()> {
        self.enter()?;
        let deadline = Instant::now() + self.stream_bound();
        let mut polls = 0u64;
        loop {
            // SAFETY: the stream belongs to the current context.
            let rc = unsafe { sys::cuStreamQuery(self.stream()) };
            if rc == sys::CUresult::CUDA_SUCCESS {
                return Ok(());
            }
            if rc != sys::CUresult::CUDA_ERROR_NOT_READY {
                if let Some(e) = self.device_fault(what) {
                    return Err(e);
                }
                return ck(rc, "cuStreamQuery", || {
                    let shared = if self.sharing.in_process > 1 {
                        // A fault is sticky for the whole context, which the PEs of a
                        // process on one GPU share (PEs of other processes have their
                        // own contexts: a fault there does not end this PE's work).
                        " (this PE's device error record is empty: when PEs of this process \
                         share the GPU, one kernel's fault ends every PE's work; look for \
                         the PE whose error names a device fault)"
                    } else {
                        ""
                    };
                    format!("PE {}: waiting for {what}{shared}", self.my_pe())
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    pe: self.my_pe(),
                    what: format!("its GPU stream to finish {what} (the kernel did not complete)"),
                    waited_ms: crate::pe::ms_since(deadline - self.stream_bound()),
                });
            }
            polls += 1;
            if polls < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Leaves the job: waits for the stream, a barrier with every PE, releases the GPU
    /// resources, then finalizes the CPU-side PE (another barrier).
    pub fn finalize(self) -> Result<()> {
        let q = self.sync("finalize");
        // Every PE's kernels have finished before anyone unmaps or frees: those calls may
        // wait for the shared context's work, and a peer's kernel may still wait for this
        // PE (docs/gpu-design.md). Called whatever `q` says, so every PE makes the same
        // number of collective calls; the barrier is bounded and names a dead peer.
        let b = self.pe.barrier_all();
        let GpuPe { cuda, pe, .. } = self;
        drop(cuda);
        let r = pe.finalize();
        q.and(b).and(r)
    }
}

/// The peer table in device memory, the host-pinned error record and the signal kernel.
fn device_parts(ctx: &Arc<Ctx>, peer_table: &[DevicePeer]) -> Result<(DevBuf, Pinned, Module)> {
    let table = DevBuf::new(ctx, std::mem::size_of_val(peer_table), "the peer table")?;
    table.write(&super::ibgda::peer_bytes(peer_table))?;
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; 64 bytes, mapped into the device address space.
    ck(
        unsafe {
            sys::cuMemHostAlloc(
                &mut host,
                std::mem::size_of::<DeviceError>(),
                sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )
        },
        "cuMemHostAlloc",
        || "the device error record".into(),
    )?;
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: host was returned by cuMemHostAlloc with DEVICEMAP; flags must be 0.
    let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
    let pinned = Pinned {
        host: host.cast(),
        dev,
        ctx: ctx.clone(),
    };
    ck(rc, "cuMemHostGetDevicePointer", || {
        "mapping the device error record".into()
    })?;
    // SAFETY: 64 writable bytes just allocated.
    unsafe { std::ptr::write_bytes(pinned.host, 0, std::mem::size_of::<DeviceError>()) };
    let signal = Module::load(ctx, "rshmem_host_signal", SIGNAL_PTX)?;
    Ok((table, pinned, signal))
}

/// The device, its primary context, a stream and the device facts for a PE on GPU
/// `ordinal`; `vmm`: also require what the VMM heap needs (and report GPUDirect RDMA).
/// What [`device_setup`] returns.
type DeviceSetup = (Arc<Ctx>, Stream, DeviceInfo, bool);

/// The device part shared by both kinds of GPU PE: picks this PE's GPU (its rank among the
/// node's PEs, or `RSHMEM_DEVICE`) and sets it up — each step's failure exchanged, so that
/// every PE fails together naming who failed — then allgathers the PCI bus ids. Returns
/// the setup, the bus ids by rank, and how many PEs of the node use this GPU (this one
/// included; node ids come from the bootstrap).
/// How many PEs of the node have their heap on a PE's GPU (this one included), and in how
/// many processes (1: all in this one).
struct Sharing {
    pes: usize,
    processes: usize,
    /// Of `pes`, those in this process (this one included): they share its context.
    in_process: usize,
}

fn open_device(pe: &Pe, vmm: bool) -> Result<(DeviceSetup, Vec<Vec<u8>>, Sharing)> {
    let world = pe.world().group();
    let boot = pe.boot();
    let rank = pe.my_pe();
    let local_rank = pe
        .node()
        .members()
        .iter()
        .position(|&r| r as usize == rank)
        .unwrap_or(0);
    let picked = device_count().and_then(|count| {
        super::launch::pick_device(
            crate::config::env_text("RSHMEM_DEVICE")?.as_deref(),
            local_rank,
            count,
        )
    });
    exchange_status(boot, &world, "pick its GPU", &picked)?;
    let setup = device_setup(picked?, vmm);
    exchange_status(boot, &world, "set up its GPU", &setup)?;
    let setup = setup?;
    let ids = boot.allgather(&world, setup.2.pci_bus_id.as_bytes())?;
    // The process nonce, not the pid: containers with their own pid namespaces on one
    // node may run PEs under the same pid.
    let procs = boot.allgather(&world, &process_nonce().to_le_bytes())?;
    let node_ids = boot.node_ids();
    let here = sharers(node_ids, &ids, rank);
    if let Some(w) = cross_process_warning(&here, &ids[rank], &procs, rank) {
        eprintln!("{w}");
    }
    let sharing = Sharing {
        pes: here.len(),
        processes: processes_of(&here, &procs),
        in_process: here.iter().filter(|&&r| procs[r] == procs[rank]).count(),
    };
    Ok((setup, ids, sharing))
}

/// A random number naming this process among the job's (drawn once; never 0).
fn process_nonce() -> u64 {
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| {
        // 64 bits of a job-token draw (hex from /dev/urandom).
        let drawn = crate::pe::random_token()
            .ok()
            .and_then(|t| u64::from_str_radix(t.get(..16)?, 16).ok())
            .filter(|&v| v != 0);
        drawn.unwrap_or_else(|| {
            // No urandom: pid and clock, still distinct from another namespace's pid 1
            // started at another instant.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            (std::process::id() as u64) << 32 ^ t | 1
        })
    })
}

/// The ranks whose heap is on the same GPU as `rank`'s: same node, same PCI bus id
/// (`rank` included).
fn sharers<N: PartialEq, B: PartialEq>(node_ids: &[N], bus_ids: &[B], rank: usize) -> Vec<usize> {
    (0..bus_ids.len())
        .filter(|&r| node_ids[r] == node_ids[rank] && bus_ids[r] == bus_ids[rank])
        .collect()
}

/// The warning one PE per process prints when the PEs on its GPU live in more than one
/// process: kernels of different processes (contexts) time-slice instead of running
/// together (unless MPS runs), so device-side waits between them crawl or time out.
/// None when every PE on this GPU is in this process, or another PE of this process on
/// it has the lower rank (it prints).
/// `here`: the [`sharers`] of `rank`'s GPU, whose PCI bus id is `bus_id`.
fn cross_process_warning(
    here: &[usize],
    bus_id: &[u8],
    pids: &[Vec<u8>],
    rank: usize,
) -> Option<String> {
    let procs = processes_of(here, pids);
    let first_here = here.iter().find(|&&r| pids[r] == pids[rank]) == Some(&rank);
    if procs < 2 || !first_here {
        return None;
    }
    Some(format!(
        "rshmem: GPU {}: PEs {here:?} share it from {} processes; kernels of different \
         processes take turns on a GPU rather than run together (unless MPS runs), so \
         device-side waits between them can crawl or time out: run a GPU's PEs in one \
         process (run_gpu_threads) or under MPS",
        String::from_utf8_lossy(bus_id),
        procs
    ))
}

/// The distinct processes among the ranks `here` (`pids`: each rank's process identity).
fn processes_of(here: &[usize], pids: &[Vec<u8>]) -> usize {
    let mut procs: Vec<&[u8]> = here.iter().map(|&r| pids[r].as_slice()).collect();
    procs.sort();
    procs.dedup();
    procs.len()
}

fn device_setup(ordinal: i32, vmm: bool) -> Result<DeviceSetup> {
    let ctx = Ctx::retain(ordinal)?;
    let info = device_info(ordinal)?;
    use sys::CUdevice_attribute as A;
    let mut rdma = false;
    if vmm {
        if attr(
            ctx.dev,
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            "VMM",
        )? == 0
        {
            return Err(Error::InvalidArgument(format!(
                "GPU {ordinal} ({}) does not support CUDA virtual memory management, which the GPU heap needs",
                info.name
            )));
        }
        if attr(
            ctx.dev,
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            "POSIX fd handles",
        )? == 0
        {
            return Err(Error::InvalidArgument(format!(
                "GPU {ordinal} ({}) cannot export memory as POSIX file descriptors, which sharing the GPU heap needs",
                info.name
            )));
        }
        rdma = attr(
            ctx.dev,
            A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
            "GPUDirect RDMA with VMM",
        )? != 0;
    }
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer; context current (retain made it so).
    ck(
        unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
        "cuStreamCreate",
        || "the PE's stream".into(),
    )?;
    Ok((ctx.clone(), Stream { raw: s, ctx }, info, rdma))
}

/// Runs `n` GPU PEs as threads of this process (one stream each, sharing each device's
/// primary context), with a bootstrap root hosted here, like [`crate::run_threads`].
/// `settings.symmetric_size` is the GPU heap size.
pub fn run_gpu_threads<R: Send>(
    n: usize,
    settings: Settings,
    f: impl Fn(&GpuPe) -> Result<R> + Sync,
) -> Result<Vec<Result<R>>> {
    driver()?;
    if n == 0 {
        return Err(Error::InvalidArgument("run_gpu_threads: 0 PEs".into()));
    }
    settings.validate()?;
    // PEs of this process on one GPU: all of them with RSHMEM_DEVICE, else spread by rank.
    let per_gpu = if std::env::var_os("RSHMEM_DEVICE").is_some() {
        n
    } else {
        n.div_ceil(device_count()?.max(1))
    };
    let conns = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok();
    super::launch::check_pes_fit_queues(per_gpu, conns.as_deref())?;
    let token = random_token()?;
    let root = crate::bootstrap::Root::bind("127.0.0.1:0", n, &token)?;
    let addr = root.local_addr().to_string();
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let cfg = PeConfig {
                    rank,
                    world_size: n,
                    root_addr: addr.clone(),
                    token: token.clone(),
                    settings: settings.clone(),
                };
                let f = &f;
                std::thread::Builder::new()
                    .name(format!("gpu-pe{rank}"))
                    .spawn_scoped(s, move || -> Result<R> {
                        let pe = GpuPe::init_with(cfg, None)?;
                        let r = f(&pe)?;
                        pe.finalize()?;
                        Ok(r)
                    })
                    .map_err(|e| Error::io("spawning a GPU PE thread", e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok::<_, Error>(
            hs.into_iter()
                .enumerate()
                .map(|(rank, h)| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Verification(format!("GPU PE {rank} panicked")))
                    })
                })
                .collect(),
        )
    })?;
    root.wait_all_left(Duration::from_secs(1));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The team entries that `GpuPe::init_with` and `device_team` write for every slot
    /// lie in the area the runtime's own accessors serve, and the public ones refuse
    /// them (until 2026-12-05 they went through the public check, which refused every
    /// offset below the user heap: every GPU PE's setup failed).
    /// Under the proxy transport the GPU heap is the CPU heap, whose sync scratch the
    /// device uses: the CPU side keeps no assist table there. Elsewhere the CPU side
    /// has a heap of its own and keeps the setting.
    #[test]
    fn a_proxy_gpu_pes_cpu_side_runs_without_the_assist() {
        use crate::assist::AssistMode;
        let mut s = Settings::from_lookup(|_| None).unwrap();
        s.p2p_assist = AssistMode::On;
        for (t, want) in [
            (TransportMode::Proxy, AssistMode::Off),
            (TransportMode::P2p, AssistMode::On),
            (TransportMode::Ibgda, AssistMode::On),
            (TransportMode::Auto, AssistMode::On),
        ] {
            s.transport = t;
            assert_eq!(cpu_settings(&s).p2p_assist, want, "{t:?}");
        }
    }

    #[test]
    fn team_entries_are_in_the_sync_scratch_area() {
        let heap = 8 << 20;
        for slot in 0..state::TEAM_SLOTS as usize {
            let at = SYNC_OFFSET + state::team_area_offset(slot);
            assert!(
                Area::SyncScratch.holds(at, state::TEAM_AREA_BYTES, heap),
                "slot {slot} at {at:#x}"
            );
            assert!(
                !Area::Heap.holds(at, state::TEAM_AREA_BYTES, heap),
                "slot {slot}"
            );
        }
        assert!(Area::SyncScratch.holds(SYNC_OFFSET, SYNC_BYTES, heap));
        assert!(!Area::SyncScratch.holds(SYNC_OFFSET - 8, 8, heap));
        assert!(!Area::SyncScratch.holds(RESERVED_BYTES - 8, 16, heap));
        assert!(Area::Heap.holds(RESERVED_BYTES, heap - RESERVED_BYTES, heap));
        assert!(!Area::Heap.holds(heap - 8, 16, heap));
        assert!(!Area::Heap.holds(usize::MAX - 4, 8, heap));
        assert_eq!(Area::Heap.bounds(heap), (RESERVED_BYTES, heap));
        assert_eq!(
            Area::SyncScratch.bounds(heap),
            (SYNC_OFFSET, RESERVED_BYTES)
        );
    }

    /// One warning per process when a GPU's PEs span processes; none otherwise.
    #[test]
    fn pes_of_several_processes_on_one_gpu_are_warned_about() {
        let p = |v: u32| v.to_le_bytes().to_vec();
        let node = ["n0"; 4];
        let gpu = ["0000:01:00.0".as_bytes(); 4];
        // Ranks 0, 1 in process 10; ranks 2, 3 in process 20; one GPU.
        let pids = [p(10), p(10), p(20), p(20)];
        let warn = |node: &[&str], gpu: &[&[u8]], pids: &[Vec<u8>], r: usize| {
            cross_process_warning(&sharers(node, gpu, r), gpu[r], pids, r)
        };
        let w: Vec<Option<String>> = (0..4).map(|r| warn(&node, &gpu, &pids, r)).collect();
        assert!(w[1].is_none() && w[3].is_none(), "{w:?}");
        for r in [0, 2] {
            let s = w[r].as_deref().unwrap();
            assert!(
                s.starts_with(
                    "rshmem: GPU 0000:01:00.0: PEs [0, 1, 2, 3] share it from 2 processes"
                ),
                "{s}"
            );
            assert!(s.contains("run a GPU's PEs in one process"), "{s}");
        }
        // One process per GPU (two GPUs), or all in one process, or other nodes: silent.
        let two = [
            "0000:01:00.0".as_bytes(),
            "0000:01:00.0".as_bytes(),
            "0000:02:00.0".as_bytes(),
            "0000:02:00.0".as_bytes(),
        ];
        assert!((0..4).all(|r| warn(&node, &two, &pids, r).is_none()));
        let one = [p(7), p(7), p(7), p(7)];
        assert!((0..4).all(|r| warn(&node, &gpu, &one, r).is_none()));
        let nodes = ["n0", "n0", "n1", "n1"];
        assert!((0..4).all(|r| warn(&nodes, &gpu, &pids, r).is_none()));
    }

    /// Without libcuda, starting GPU PEs is an error that names the library, before any
    /// bootstrap or thread is started.
    #[test]
    fn gpu_pes_without_a_driver_fail_cleanly() {
        if !crate::test_child::run_without_cuda(
            module_path!(),
            "gpu_pes_without_a_driver_fail_cleanly",
        ) {
            return;
        }
        let e = run_gpu_threads(2, Settings::from_lookup(|_| None).unwrap(), |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "libcuda.so.1 not found at RSHMEM_CUDA_LIB=/nonexistent/libcuda.so.1); \
                 install the NVIDIA driver and point RSHMEM_CUDA_LIB at its libcuda.so.1"
            ),
            "{e}"
        );
        let e = GpuPe::init().unwrap_err().to_string();
        assert!(e.contains("libcuda.so.1"), "{e}");
        assert!(device_count().is_err());
    }
}
