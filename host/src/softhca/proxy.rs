//! The proxy transport: how a CPU PE reaches a peer through the soft HCA.
//!
//! One RC-like queue pair per (local PE, remote PE), this PE included (loopback), created
//! on first use. Every PE of a process shares one engine thread (a process-wide
//! [`SoftHca`] over [`ProxyBackend`], started with the first proxy PE and stopped with the
//! last), so several PEs per process work and an oversubscribed node does not run one
//! spinning engine per PE. [`ProxyBackend`] sends each QP's WQEs to the [`LocalBackend`]
//! (node-local peers, memory mapped here) or to the [`FabricBackend`] (peers on other
//! nodes, through libfabric; installed at init when some peer needs it).
//!
//! Memory: each PE registers its whole heap (one region; its base address and key are
//! allgathered at init) and, per QP, a staging region of [`STAGING_CHUNK`] bytes per SQ
//! slot. A WQE's staging chunk is the one of its first slot, so it is owned exactly as
//! long as the slot: puts copy their source there (or inline it when it fits one WQEBB),
//! gets and fetching atomics read their result from it before releasing the slot.
//!
//! Completion: puts, put_signal and signal_op return when the source may be reused (after
//! the staging copy) and complete at quiet; gets and every AMO (fetching or not, as the
//! p2p transport) return after their CQE. Errors name the peer, the WQE opcode and the
//! syndrome; every wait is bounded by RSHMEM_TIMEOUT_MS and reports QP, WQE index and the
//! last CQE.

use super::backend::{Backend, LocalBackend, LocalPeer, Op};
use super::engine::{QpConfig, QpHandle, SoftHca, Waker};
use super::fabric::{FabricBackend, FabricPeer, Regions};
use super::mr::{Access, MrSnapshot, MrTable};
use super::queue::{CqMode, QueueMemory, SendQueue, SqError};
use crate::bootstrap::Liveness;
use crate::config::FabricSwitches;
use crate::error::{Error, Result};
use crate::fabric::{Domain, MemoryRegion};
use crate::mlx5::wqe::{DataSeg, Payload, RaddrSeg, Sge8, WqeOp};
use crate::mlx5::Syndrome;
use std::alloc::Layout;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// SQ ring of a proxy QP (WQEBBs).
pub const WQE_CNT: u32 = 128;
/// Staging bytes per SQ slot: the largest WRITE/READ a proxy WQE carries.
pub const STAGING_CHUNK: usize = 8 << 10;
/// Longest put sent inline: what fits one WQEBB (ctrl + raddr + 4-B header + 28 B).
pub const MAX_INLINE_PUT: usize = 28;
/// How long a broken connection's error waits for the bootstrap to report a death that
/// explains it (`Proxy::err`). 2 s (500 ms before 2026-12-07): the report's threads (the
/// root's writer, this PE's bootstrap reader) may be descheduled that long on a loaded
/// machine, and an error with no death behind it is only reported that much later.
const DEATH_GRACE: Duration = Duration::from_secs(2);

/// What a PE knows about a peer it reaches by proxy.
pub(crate) struct ProxyPeer {
    /// The peer's heap as WQEs name it: its base address in the peer's process, its key.
    pub base: u64,
    pub rkey: u32,
    /// How the engine reaches it.
    pub via: PeerKind,
}

/// The remote side of a proxy QP: which backend serves it.
pub enum PeerKind {
    /// The peer's registrations reachable from this process (the LocalBackend's view).
    Local(LocalPeer),
    /// Through the fabric endpoint.
    Fabric(FabricPeer),
}

/// The process engine's backend: the LocalBackend for node-local peers, the
/// FabricBackend (once installed) for the others.
#[derive(Debug, Default)]
pub struct ProxyBackend {
    local: LocalBackend,
    pub(crate) fabric: Option<FabricBackend>,
    /// GPU PEs whose queues this engine serves (host/src/gpu/ibgda.rs). Their producers
    /// ring no waker (a GPU cannot unpark a thread), so while any exist the engine sleeps
    /// at most [`GPU_IDLE_WAIT`] when idle instead of the backend's bound.
    pub(crate) gpu_pes: usize,
}

/// The idle sleep bound of the process engine while GPU producers are attached: the
/// latency a GPU-posted WQE may wait for a sleeping engine to notice its doorbell record.
pub const GPU_IDLE_WAIT: Duration = Duration::from_micros(20);

impl Backend for ProxyBackend {
    type Peer = PeerKind;
    type Cache = MrSnapshot;

    fn execute(
        &mut self,
        peer: &PeerKind,
        cache: &mut MrSnapshot,
        token: u64,
        op: &Op<'_>,
    ) -> Option<std::result::Result<(), Syndrome>> {
        match peer {
            PeerKind::Local(p) => self.local.execute(p, cache, token, op),
            PeerKind::Fabric(p) => match self.fabric.as_mut() {
                Some(f) => f.execute(p, &mut (), token, op),
                None => Some(Err(Syndrome::TransportRetryExc)),
            },
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, std::result::Result<(), Syndrome>)) {
        if let Some(f) = self.fabric.as_mut() {
            f.poll(done);
        }
    }

    fn idle_wait(&self) -> Duration {
        let d = match &self.fabric {
            Some(f) => f.idle_wait(),
            None => self.local.idle_wait(),
        };
        if self.gpu_pes > 0 {
            d.min(GPU_IDLE_WAIT)
        } else {
            d
        }
    }

    fn set_urgent(&mut self, urgent: bool) {
        // A GPU producer waits for completions by polling its CQ in memory, which the
        // engine cannot see (no `Waker::wait_completion`): with GPU PEs in the process,
        // every round is urgent, or lazily confirmed writes to fabric peers would never
        // complete for them (their confirmation waits for a CPU waiter or LAZY_LIMIT
        // writes).
        if let Some(f) = self.fabric.as_mut() {
            f.set_urgent(urgent || self.gpu_pes > 0);
        }
    }

    fn handover(&self) -> bool {
        self.fabric.as_ref().is_some_and(|f| f.handover())
    }
}

/// This process's fabric endpoint, as a PE uses it.
#[derive(Clone)]
pub(crate) struct FabricCtx {
    pub domain: Arc<Domain>,
    pub regions: Regions,
    pub name: Vec<u8>,
    pub provider: String,
}

/// Opens the fabric endpoint of this process's engine if it has none yet.
pub(crate) fn install_fabric(
    hca: &SoftHca<ProxyBackend>,
    switches: FabricSwitches,
    timeout: Duration,
) -> Result<FabricCtx> {
    hca.with_backend(|b| {
        if b.fabric.is_none() {
            b.fabric = Some(FabricBackend::open(switches, timeout)?);
        }
        let f = b.fabric.as_ref().expect("installed");
        Ok(FabricCtx {
            domain: f.domain().clone(),
            regions: f.regions(),
            name: f.name(),
            provider: f.provider(),
        })
    })
}

/// A PE of this process leaves: its heap registration `mr` and the memory under it go to
/// the fabric endpoint, which keeps them until it closes ([`FabricBackend::retire`]).
pub(crate) fn retire_heap(
    hca: &SoftHca<ProxyBackend>,
    mr: Arc<MemoryRegion>,
    memory: Box<dyn Send>,
) {
    hca.with_backend(|b| match b.fabric.as_mut() {
        Some(f) => f.retire(mr, memory),
        // No endpoint (cannot happen: the registration was made through it): drop both,
        // the registration first.
        None => drop((mr, memory)),
    })
}

/// Adds a peer's endpoint address to this process's fabric endpoint.
pub(crate) fn insert_fabric_peer(
    hca: &SoftHca<ProxyBackend>,
    name: &[u8],
) -> Result<crate::fabric::PeerAddr> {
    hca.with_backend(|b| match b.fabric.as_mut() {
        Some(f) => f.insert_peer(name),
        None => Err(Error::InvalidArgument(
            "no fabric endpoint installed".into(),
        )),
    })
}

/// Page-aligned zeroed memory for staging (and a GPU PE's result slots); allocated through
/// the fabric domain (so the FabricBackend may use it, and in-flight operations keep it
/// alive) when one exists.
pub(crate) struct Staging {
    base: *mut u8,
    len: usize,
    fabric: Option<(Arc<MemoryRegion>, Regions)>,
}
// SAFETY: plain memory owned by this value; slot ownership (SendQueue) decides who touches
// which chunk.
unsafe impl Send for Staging {}
// SAFETY: as above.
unsafe impl Sync for Staging {}

impl Staging {
    /// Fabric-registered memory when `fabric` is Some, plain memory otherwise.
    pub(crate) fn new_for(len: usize, fabric: Option<&FabricCtx>) -> Result<Staging> {
        match fabric {
            Some(ctx) => Staging::new_fabric(len, ctx),
            None => Staging::new(len),
        }
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn new(len: usize) -> Result<Staging> {
        let l = Layout::from_size_align(len, crate::config::page_size())
            .map_err(|e| Error::InvalidArgument(format!("staging layout: {e}")))?;
        // SAFETY: non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(l) };
        if base.is_null() {
            return Err(Error::InvalidArgument(format!(
                "cannot allocate {len} bytes of proxy staging memory"
            )));
        }
        Ok(Staging {
            base,
            len,
            fabric: None,
        })
    }

    fn new_fabric(len: usize, ctx: &FabricCtx) -> Result<Staging> {
        let mr = ctx.domain.alloc(len)?;
        ctx.regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(mr.clone());
        Ok(Staging {
            base: mr.as_ptr(),
            len,
            fabric: Some((mr, ctx.regions.clone())),
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some((mr, regions)) = self.fabric.take() {
            // The region owns the memory; operations still in flight hold it too.
            regions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|r| !Arc::ptr_eq(r, &mr));
            return;
        }
        let l = Layout::from_size_align(self.len, crate::config::page_size()).expect("valid");
        // SAFETY: allocated with this layout in new().
        unsafe { std::alloc::dealloc(self.base, l) }
    }
}

/// One QP to one peer. Field order is drop order: the engine lets go of the QP first.
struct ProxyQp {
    /// Unpublishes the QP from the queue-status file (RSHMEM_DEBUG_QUEUES) first.
    _status: Option<super::status::Registration>,
    /// Held for its Drop (detach); the QP number is in `sq`.
    _engine: QpHandle<ProxyBackend>,
    sq: Arc<SendQueue>,
    staging_key: u32,
    /// Staging bytes per SQ slot: the largest WRITE/READ one WQE carries.
    chunk_len: usize,
    pd: Arc<MrTable>,
    staging: Staging,
}

impl Drop for ProxyQp {
    fn drop(&mut self) {
        self.pd.deregister(self.staging_key);
    }
}

impl ProxyQp {
    fn chunk(&self, idx: u64) -> *mut u8 {
        let slot = (idx & (WQE_CNT as u64 - 1)) as usize;
        // SAFETY: slot < WQE_CNT, staging holds WQE_CNT chunks.
        unsafe { self.staging.base.add(slot * self.chunk_len) }
    }
}

/// A PE's proxy transport.
pub(crate) struct Proxy {
    rank: usize,
    timeout: Duration,
    pd: Arc<MrTable>,
    peers: Vec<Option<ProxyPeer>>,
    qps: Vec<OnceLock<std::result::Result<ProxyQp, String>>>,
    hca: Arc<SoftHca<ProxyBackend>>,
    waker: Arc<Waker>,
    fabric: Option<FabricCtx>,
    /// The job's liveness: waits end when a peer died (bootstrap).
    live: Arc<Liveness>,
    /// Staging bytes per SQ slot on QPs to fabric peers (RSHMEM_FABRIC_CHUNK).
    fabric_chunk: usize,
    /// This PE's heap registered with the fabric domain (peers write into it); taken by
    /// [`Proxy::take_heap_mr`] when the PE leaves.
    heap_mr: Option<Arc<MemoryRegion>>,
    /// The job id and RSHMEM_DEBUG_QUEUES period: QPs are published for
    /// `rshmem doctor --queues` when the period is set.
    job_id: String,
    debug_queues: Option<Duration>,
    /// Per peer: when the death grace of its QP's error began (`err`). The error is
    /// sticky: every caller waits until the same end, so later calls do not wait again.
    grace_began: Mutex<Vec<Option<std::time::Instant>>>,
}

/// The process-wide engine (started on demand, stopped when the last proxy PE goes).
pub(crate) fn engine() -> Result<Arc<SoftHca<ProxyBackend>>> {
    static ENGINE: Mutex<Weak<SoftHca<ProxyBackend>>> = Mutex::new(Weak::new());
    let mut g = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = g.upgrade() {
        return Ok(e);
    }
    let e = Arc::new(
        SoftHca::start(ProxyBackend::default(), "rshmem-softhca")
            .map_err(|e| Error::io("starting the soft HCA engine thread", e))?,
    );
    *g = Arc::downgrade(&e);
    Ok(e)
}

/// Which rshmem operation a WQE serves (for error messages).
pub(crate) type OpName = &'static str;

/// An AMO as the proxy issues it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Amo {
    Fetch,
    Set(u64),
    Swap(u64),
    Cas(u64, u64),
    Add(u64),
    And(u64),
    Or(u64),
    Xor(u64),
}

/// What a GPU PE over the proxy transport takes from its CPU-side proxy to build its own
/// queues (host/src/gpu/ibgda.rs): the protection domain holding the heap registration,
/// the process engine, and per peer (base address, rkey, how the engine reaches it).
pub(crate) struct GpuProxyView {
    pub pd: Arc<MrTable>,
    pub hca: Arc<SoftHca<ProxyBackend>>,
    pub peers: Vec<Option<(u64, u32, PeerKind)>>,
    /// The process's fabric endpoint when some peer is reached through it: the GPU PE's
    /// local buffers (result slots) must be registered there too.
    pub fabric: Option<FabricCtx>,
}

impl Drop for Proxy {
    /// A heap registration not handed to [`retire_heap`] leaves the local-buffer list
    /// with the Proxy (the heap mapping is dropped after it). `Pe::drop` always takes it
    /// first ([`Proxy::take_heap_mr`]) and retires it; this is for any other drop, which
    /// then closes the registration at once.
    fn drop(&mut self) {
        if let Some(m) = self.heap_mr.take() {
            self.unlist(&m);
        }
    }
}

impl Proxy {
    /// This PE's heap registration with the fabric, and the process engine, for
    /// [`retire_heap`] (None when the PE has no fabric registration).
    /// The region leaves the local-buffer list here, whatever the caller does with it.
    pub(crate) fn take_heap_mr(
        &mut self,
    ) -> Option<(Arc<SoftHca<ProxyBackend>>, Arc<MemoryRegion>)> {
        let m = self.heap_mr.take()?;
        self.unlist(&m);
        Some((self.hca.clone(), m))
    }

    /// Removes `m` from the fabric backend's local-buffer list.
    fn unlist(&self, m: &Arc<MemoryRegion>) {
        if let Some(f) = self.fabric.as_ref() {
            f.regions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|r| !Arc::ptr_eq(r, m));
        }
    }

    /// See [`GpuProxyView`].
    pub(crate) fn gpu_view(&self) -> GpuProxyView {
        GpuProxyView {
            pd: self.pd.clone(),
            hca: self.hca.clone(),
            peers: self
                .peers
                .iter()
                .map(|p| {
                    p.as_ref().map(|p| {
                        let via = match &p.via {
                            PeerKind::Local(l) => PeerKind::Local(l.clone()),
                            PeerKind::Fabric(f) => PeerKind::Fabric(*f),
                        };
                        (p.base, p.rkey, via)
                    })
                })
                .collect(),
            fabric: self.fabric.clone(),
        }
    }

    /// `pd` holds this PE's heap registration; `peers[r]` is Some for every peer reached
    /// by proxy. `hca` is the process engine ([`engine`]); `fabric` its endpoint with this
    /// PE's heap registered, when some peer is reached through it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        rank: usize,
        timeout: Duration,
        pd: Arc<MrTable>,
        peers: Vec<Option<ProxyPeer>>,
        hca: Arc<SoftHca<ProxyBackend>>,
        fabric: Option<(FabricCtx, Arc<MemoryRegion>)>,
        live: Arc<Liveness>,
        fabric_chunk: usize,
        job_id: &str,
        debug_queues: Option<Duration>,
    ) -> Result<Proxy> {
        let n = peers.len();
        let (fabric, heap_mr) = match fabric {
            Some((f, m)) => {
                // The heap may be a WQE's local buffer too (a GPU PE's puts read from it
                // and its gets land in it; the FabricBackend finds local buffers in this
                // list). Removed when the PE leaves (FabricBackend::retire) or in Drop.
                f.regions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(m.clone());
                (Some(f), Some(m))
            }
            None => (None, None),
        };
        Ok(Proxy {
            job_id: job_id.to_string(),
            debug_queues,
            fabric_chunk,
            live,
            fabric,
            heap_mr,
            rank,
            timeout,
            pd,
            peers,
            qps: (0..n).map(|_| OnceLock::new()).collect(),
            grace_began: Mutex::new(vec![None; n]),
            waker: hca.waker(),
            hca,
        })
    }

    fn qp(&self, pe: usize) -> Result<(&ProxyQp, &ProxyPeer)> {
        let peer = self.peers[pe].as_ref().ok_or_else(|| Error::Unreachable {
            pe,
            from: self.rank,
            reason: "no proxy route to it".into(),
        })?;
        let q = self.qps[pe].get_or_init(|| self.make_qp(pe, peer).map_err(|e| e.to_string()));
        match q {
            Ok(q) => Ok((q, peer)),
            Err(e) => Err(Error::Unreachable {
                pe,
                from: self.rank,
                reason: format!("cannot create a soft HCA queue pair: {e}"),
            }),
        }
    }

    fn make_qp(&self, pe: usize, peer: &ProxyPeer) -> Result<ProxyQp> {
        let mem = Arc::new(
            QueueMemory::new(WQE_CNT, WQE_CNT)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?,
        );
        let (staging, chunk_len) = match (&peer.via, &self.fabric) {
            (PeerKind::Fabric(_), Some(ctx)) => (
                Staging::new_fabric(WQE_CNT as usize * self.fabric_chunk, ctx)?,
                self.fabric_chunk,
            ),
            _ => (
                Staging::new(WQE_CNT as usize * STAGING_CHUNK)?,
                STAGING_CHUNK,
            ),
        };
        // SAFETY: staging lives in the ProxyQp, which detaches the QP (its first field)
        // before the staging memory is freed; the region is deregistered in Drop.
        let staging_key = unsafe {
            self.pd.register(
                staging.base,
                staging.base as u64,
                staging.len as u64,
                Access::LOCAL_WRITE,
            )
        };
        let handle = self.hca.attach(QpConfig::new(
            mem.clone(),
            self.pd.clone(),
            match &peer.via {
                PeerKind::Local(p) => PeerKind::Local(p.clone()),
                PeerKind::Fabric(p) => PeerKind::Fabric(*p),
            },
            CqMode::Normal,
        ));
        let mut sq = SendQueue::new(
            mem,
            handle.qpn(),
            CqMode::Normal,
            self.timeout,
            Some(self.hca.waker()),
        );
        let live = self.live.clone();
        sq.set_abort(Arc::new(move || live.check().is_err()));
        let sq = Arc::new(sq);
        let status = self.debug_queues.map(|period| {
            super::status::register(&self.job_id, period, self.rank, pe, &sq, handle.qp())
        });
        Ok(ProxyQp {
            _status: status,
            _engine: handle,
            sq,
            staging_key,
            chunk_len,
            pd: self.pd.clone(),
            staging,
        })
    }

    fn err(&self, pe: usize, op: OpName, e: SqError) -> Error {
        if let SqError::Aborted { .. } = e {
            if let Err(dead) = self.live.check() {
                return dead;
            }
        }
        if let SqError::Completion { first, .. } = &e {
            // A connection to `pe` that broke (or the WQEs flushed after it) is often the
            // echo of a death elsewhere in the job: `pe` exited because the bootstrap told
            // it that some PE died, and our bootstrap connection is about to say so too.
            // Name the death if the bootstrap reports one within DEATH_GRACE.
            let retry_like = [Syndrome::TransportRetryExc as u8, Syndrome::WrFlush as u8]
                .contains(&first.syndrome);
            if retry_like {
                // One grace per peer: the QP's error is sticky, and every later call on
                // it reports it again; each waits until the end of the grace the first
                // began (before 2026-12-07 each waited a grace of its own, so every
                // operation to a peer whose connection broke took 2 s to fail). A second
                // thread at the same moment waits as long as the first, so both name the
                // death if it comes.
                let began = {
                    let mut g = self.grace_began.lock().unwrap_or_else(|e| e.into_inner());
                    match g.get_mut(pe) {
                        Some(b) => *b.get_or_insert_with(std::time::Instant::now),
                        None => std::time::Instant::now(),
                    }
                };
                loop {
                    if let Err(dead) = self.live.check() {
                        return dead;
                    }
                    if began.elapsed() >= DEATH_GRACE {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        match e {
            SqError::Timeout { waited_ms, .. } => Error::Timeout {
                pe: self.rank,
                what: format!("{op} to PE {pe} through the soft HCA: {e}"),
                waited_ms,
            },
            other => Error::Transport {
                pe,
                from: self.rank,
                op,
                detail: other.to_string(),
            },
        }
    }

    fn check_state(&self, q: &ProxyQp, pe: usize, op: OpName) -> Result<()> {
        match q.sq.error() {
            Some(first) => Err(self.err(
                pe,
                op,
                SqError::Completion {
                    qpn: q.sq.qpn(),
                    first,
                },
            )),
            None => Ok(()),
        }
    }

    /// RDMA WRITE of `src` to `offset` of `pe`'s heap; returns once `src` may be reused.
    pub(crate) fn put(&self, pe: usize, offset: usize, src: &[u8], op: OpName) -> Result<()> {
        let (q, peer) = self.qp(pe)?;
        self.check_state(q, pe, op)?;
        let raddr = peer.base + offset as u64;
        if src.len() <= MAX_INLINE_PUT {
            return self.post_inline_write(q, peer, pe, raddr, src, false, op);
        }
        for (i, chunk) in src.chunks(q.chunk_len).enumerate() {
            let at = raddr + (i * q.chunk_len) as u64;
            let mut seg = [DataSeg::default()];
            let seg_ref = &mut seg;
            let _ =
                q.sq.post_fn(1, false, move |idx| {
                    let c = q.chunk(idx);
                    // SAFETY: the chunk of a reserved slot whose previous WQE completed:
                    // only this producer touches it until the WQE completes.
                    unsafe { crate::copy::copy_bytes(chunk.as_ptr(), c, chunk.len()) };
                    seg_ref[0] = DataSeg::new(chunk.len() as u32, q.staging_key, c as u64);
                    let seg: &[DataSeg] = seg_ref;
                    WqeOp::RdmaWrite {
                        remote: RaddrSeg::new(at, peer.rkey),
                        payload: Payload::Sge(seg),
                    }
                })
                .map_err(|e| self.err(pe, op, e))?;
        }
        Ok(())
    }

    /// RDMA READ of `dst.len()` bytes at `offset` of `pe`'s heap; returns with the data.
    pub(crate) fn get(&self, pe: usize, offset: usize, dst: &mut [u8], op: OpName) -> Result<()> {
        let (q, peer) = self.qp(pe)?;
        self.check_state(q, pe, op)?;
        let raddr = peer.base + offset as u64;
        if dst.len() <= q.chunk_len {
            // One READ (g, atomic_fetch, small gets): no allocation.
            let len = dst.len();
            let mut seg = [DataSeg::default()];
            let seg_ref = &mut seg;
            let p =
                q.sq.post_fn(1, true, move |idx| {
                    seg_ref[0] = DataSeg::new(len as u32, q.staging_key, q.chunk(idx) as u64);
                    let seg: &[DataSeg] = seg_ref;
                    WqeOp::RdmaRead {
                        remote: RaddrSeg::new(raddr, peer.rkey),
                        local: seg,
                    }
                })
                .map_err(|e| self.err(pe, op, e))?;
            let r = q.sq.wait_posted(p);
            if r.is_ok() {
                // SAFETY: the READ completed into the chunk of a slot we still hold.
                unsafe { crate::copy::copy_bytes(q.chunk(p.index), dst.as_mut_ptr(), len) };
            }
            q.sq.release(p);
            return r.map_err(|e| self.err(pe, op, e));
        }
        let window = (WQE_CNT / 2) as usize;
        let chunk_len = q.chunk_len;
        let chunks: Vec<&mut [u8]> = dst.chunks_mut(chunk_len).collect();
        let mut i = 0;
        let mut chunks = chunks.into_iter().peekable();
        while chunks.peek().is_some() {
            let batch: Vec<&mut [u8]> = chunks.by_ref().take(window).collect();
            // One reservation for the whole batch (`SendQueue::post_held_batch`: reserving
            // READ by READ while holding the earlier ones could deadlock with another
            // thread's post on this queue pair).
            let first = i;
            i += batch.len();
            let (posted, first_err) =
                q.sq.post_held_batch(batch.len() as u16, |k, idx, seg| {
                    seg[0] =
                        DataSeg::new(batch[k].len() as u32, q.staging_key, q.chunk(idx) as u64);
                    WqeOp::RdmaRead {
                        remote: RaddrSeg::new(raddr + ((first + k) * chunk_len) as u64, peer.rkey),
                        local: &seg[..],
                    }
                })
                .map_err(|e| self.err(pe, op, e))?;
            let mut result = first_err.map_or(Ok(()), Err);
            for (p, c) in posted.iter().zip(batch) {
                if result.is_ok() {
                    result = q.sq.wait_posted(*p);
                    if result.is_ok() {
                        // SAFETY: the READ completed into the chunk of a slot we still hold
                        // (posted with hold), so nobody else writes it.
                        unsafe {
                            crate::copy::copy_bytes(q.chunk(p.index), c.as_mut_ptr(), c.len())
                        };
                    }
                }
                q.sq.release(*p);
            }
            result.map_err(|e| self.err(pe, op, e))?;
        }
        Ok(())
    }

    /// An AMO on the `size`-byte word at `offset` of `pe`'s heap; returns the old value
    /// (0 for Set). Blocks until its CQE.
    pub(crate) fn amo(
        &self,
        pe: usize,
        offset: usize,
        size: usize,
        a: Amo,
        op: OpName,
    ) -> Result<u64> {
        let (q, peer) = self.qp(pe)?;
        self.check_state(q, pe, op)?;
        let raddr = peer.base + offset as u64;
        let ones = if size == 4 { u32::MAX as u64 } else { u64::MAX };
        let remote = RaddrSeg::new(raddr, peer.rkey);
        // Masked compare-and-swap: (swap, compare, swap_mask, compare_mask).
        let masked = |swap: u64, compare: u64, swap_mask: u64, compare_mask: u64, result: Sge8| {
            if size == 4 {
                WqeOp::MaskedCs32 {
                    remote,
                    swap: swap as u32,
                    compare: compare as u32,
                    swap_mask: swap_mask as u32,
                    compare_mask: compare_mask as u32,
                    result,
                }
            } else {
                WqeOp::MaskedCs64 {
                    remote,
                    swap,
                    compare,
                    swap_mask,
                    compare_mask,
                    result,
                }
            }
        };
        let one = |build: &dyn Fn(Sge8) -> WqeOp<'static>, wqebbs: u16| -> Result<u64> {
            let p =
                q.sq.post_fn(wqebbs, true, |idx| {
                    build(Sge8 {
                        addr: q.chunk(idx) as u64,
                        lkey: q.staging_key,
                    })
                })
                .map_err(|e| self.err(pe, op, e))?;
            let r = q.sq.wait_posted(p);
            let mut b = [0u8; 8];
            if r.is_ok() {
                // SAFETY: the result chunk of a slot we hold; the engine wrote it before
                // the CQE we observed (Acquire in the CQ poll).
                unsafe { std::ptr::copy_nonoverlapping(q.chunk(p.index), b.as_mut_ptr(), 8) };
            }
            q.sq.release(p);
            r.map_err(|e| self.err(pe, op, e))?;
            // The engine writes the old value as a ConnectX does (8 bytes in host order,
            // 4 bytes big-endian).
            Ok(super::backend::fetched_value(b, size))
        };
        let mwqebbs = if size == 4 { 1 } else { 2 };
        let cas = |cond: u64, v: u64| -> Result<u64> {
            if size == 4 {
                one(&|r| masked(v, cond, ones, ones, r), 1)
            } else {
                one(
                    &|result| WqeOp::AtomicCs {
                        remote,
                        compare: cond,
                        swap: v,
                        result,
                    },
                    1,
                )
            }
        };
        match a {
            Amo::Fetch => {
                // READ of the word: one atomic load on the target (LocalBackend).
                let mut b = [0u8; 8];
                self.get(pe, offset, &mut b[..size], op)?;
                Ok(if size == 4 {
                    u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as u64
                } else {
                    u64::from_ne_bytes(b)
                })
            }
            Amo::Set(v) | Amo::Swap(v) => one(&|r| masked(v, 0, ones, 0, r), mwqebbs),
            Amo::Cas(cond, v) => cas(cond, v),
            Amo::Add(v) => {
                if size == 4 {
                    one(
                        &|result| WqeOp::MaskedFa32 {
                            remote,
                            add: v as u32,
                            field_boundary: 0,
                            result,
                        },
                        1,
                    )
                } else {
                    one(
                        &|result| WqeOp::AtomicFa {
                            remote,
                            add: v,
                            result,
                        },
                        1,
                    )
                }
            }
            // AND: bits where v is 0 are swapped in as 0; OR: bits where v is 1 become 1.
            Amo::And(v) => one(&|r| masked(0, 0, !v & ones, 0, r), mwqebbs),
            Amo::Or(v) => one(&|r| masked(v, 0, v & ones, 0, r), mwqebbs),
            // XOR has no masked form: a compare-and-swap loop, bounded like every wait
            // (each CAS is; the loop could otherwise lose to other writers forever).
            Amo::Xor(v) => {
                let start = std::time::Instant::now();
                let mut cur = self.amo(pe, offset, size, Amo::Fetch, op)?;
                let mut tries = 0u64;
                loop {
                    let old = cas(cur, (cur ^ v) & ones)?;
                    if old == cur {
                        return Ok(old);
                    }
                    cur = old;
                    tries += 1;
                    if start.elapsed() >= self.timeout {
                        return Err(Error::Timeout {
                            pe: self.rank,
                            what: format!(
                                "{op} on PE {pe} (offset {offset:#x}): the proxy's XOR is a \
                                 compare-and-swap loop, and {tries} compare-and-swaps lost \
                                 to other writers of the word"
                            ),
                            waited_ms: start.elapsed().as_millis() as u64,
                        });
                    }
                }
            }
        }
    }

    /// Posts a fetch-add of `v` on the 8-byte word at `offset` of `pe`'s heap without
    /// waiting (signals, barrier counters). `fenced`: after every earlier WQE of the QP.
    pub(crate) fn post_add(
        &self,
        pe: usize,
        offset: usize,
        v: u64,
        fenced: bool,
        op: OpName,
    ) -> Result<()> {
        let (q, peer) = self.qp(pe)?;
        self.check_state(q, pe, op)?;
        let remote = RaddrSeg::new(peer.base + offset as u64, peer.rkey);
        let build = |idx| WqeOp::AtomicFa {
            remote,
            add: v,
            // The old value lands in the slot's chunk; nobody reads it.
            result: Sge8 {
                addr: q.chunk(idx) as u64,
                lkey: q.staging_key,
            },
        };
        // FENCE on the fetch-add's own WQE: after every WQE reserved before it, whatever
        // other threads post meanwhile.
        let posted = if fenced {
            q.sq.post_fn_fenced(1, build)
        } else {
            q.sq.post_fn(1, false, build)
        };
        let _ = posted.map_err(|e| self.err(pe, op, e))?;
        Ok(())
    }

    /// Posts an 8-byte WRITE of `v` to the word at `offset` of `pe`'s heap, FENCEd after
    /// every earlier WQE of the QP (a signal SET after the data it announces); completes
    /// at quiet, like a put.
    pub(crate) fn post_set(&self, pe: usize, offset: usize, v: u64, op: OpName) -> Result<()> {
        let (q, peer) = self.qp(pe)?;
        self.check_state(q, pe, op)?;
        let raddr = peer.base + offset as u64;
        self.post_inline_write(q, peer, pe, raddr, &v.to_ne_bytes(), true, op)
    }

    /// One inline RDMA WRITE of `data` (at most [`MAX_INLINE_PUT`] bytes) to `raddr` on
    /// `pe`'s QP; `fenced`: with fence mode FENCE on it.
    #[allow(clippy::too_many_arguments)]
    fn post_inline_write(
        &self,
        q: &ProxyQp,
        peer: &ProxyPeer,
        pe: usize,
        raddr: u64,
        data: &[u8],
        fenced: bool,
        op: OpName,
    ) -> Result<()> {
        let w = WqeOp::RdmaWrite {
            remote: RaddrSeg::new(raddr, peer.rkey),
            payload: Payload::Inline(data),
        };
        let post = || {
            if fenced {
                q.sq.post_fenced(&w)
            } else {
                q.sq.post(&w)
            }
        };
        if matches!(peer.via, PeerKind::Fabric(_)) {
            // Hand it to the network now rather than wake the engine thread (a context
            // switch; it may sleep up to IDLE_WAIT): caller-driven progress. As a
            // driver, the doorbell does not unpark the engine; if our round misses it
            // (another thread held the engine), dropping the guard hands over.
            let _drive = self.waker.drive();
            let _ = post().map_err(|e| self.err(pe, op, e))?;
            let _ = self.assist();
        } else {
            let _ = post().map_err(|e| self.err(pe, op, e))?;
        }
        Ok(())
    }

    /// Runs one round of this process's engine on the calling thread, if it is free.
    pub(crate) fn assist(&self) -> bool {
        self.waker.assist()
    }

    /// Registers the calling thread as driving this process's engine (it calls
    /// [`Proxy::assist`] repeatedly until the guard drops): see [`Waker`].
    pub(crate) fn drive(&self) -> super::engine::Drive<'_> {
        self.waker.drive()
    }

    /// `fence`: a FENCEd NOP on every QP that needs one (SendQueue::fence_needed: work
    /// in flight, and no FENCEd NOP reserved after it yet). A NOP that cannot be posted
    /// breaks its queue, which the next operation or quiet on it reports (naming the QP);
    /// `shmem_fence` itself returns nothing.
    pub(crate) fn fence(&self) {
        for q in self.qps.iter().filter_map(|q| q.get()).flatten() {
            if q.sq.fence_needed() {
                let _ = q.sq.fence();
            }
        }
    }

    /// `quiet`: waits until every WQE posted so far on every QP has completed, and reports
    /// the first QP's error after waiting for the others. (Before 2026-12-07 it stopped at
    /// the first failed QP: the QPs to higher PEs were not waited for, a caller that went
    /// on after the kept error could signal before its other puts landed, and a QP whose
    /// error is sticky stopped every later quiet at the same place.)
    ///
    /// A QP that timed out ends the call at once: each QP's wait has its own bound, and
    /// going on would make a stalled engine cost one timeout per QP. Errors that are
    /// already known (an error CQE, a broken queue) do not wait, so the other QPs are
    /// still waited for after them.
    pub(crate) fn quiet(&self) -> Result<()> {
        let mut first = Ok(());
        for (pe, q) in self.qps.iter().enumerate() {
            if let Some(Ok(q)) = q.get() {
                if let Err(e) = q.sq.quiet() {
                    if let SqError::Timeout { .. } = e {
                        let e = self.err(pe, "quiet", e);
                        return first.and(Err(e));
                    }
                    // Only the first error is made into the report: `err` may wait up to
                    // DEATH_GRACE for a death to name, which for every further QP in a
                    // sticky error would cost each quiet that much again for nothing.
                    if first.is_ok() {
                        first = Err(self.err(pe, "quiet", e));
                    }
                }
            }
        }
        first
    }
}
