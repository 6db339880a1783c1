//! [`FabricBackend`]: the soft HCA's network backend. The engine parses and checks WQEs as
//! for the [`super::LocalBackend`]; this backend executes them as libfabric operations on
//! one RDM endpoint (`crate::fabric`) and reports their completions through `poll`.
//!
//! - WRITE / WRITE_IMM → `fi_write` (the immediate is dropped, as by the LocalBackend: rshmem
//!   queues have no responder CQ); READ → `fi_read`; a WQE with several data segments
//!   becomes one post per segment, retired as one completion.
//! - Atomics → `fi_fetch_atomic` / `fi_compare_atomic`. libfabric has no masked
//!   compare-and-swap, so the masked forms the proxy uses map to exact equivalents:
//!   compare_mask 0 with swap_mask all ones = swap (`FI_ATOMIC_WRITE` fetch); compare_mask
//!   0 with swap 0 = AND with `!swap_mask` (`FI_BAND`); compare_mask 0 with swap =
//!   swap_mask = OR (`FI_BOR`); both masks all ones = `FI_CSWAP`; masked fetch-add with no
//!   field boundary = `FI_SUM`. Any other masked form completes with REMOTE_OP (0x14).
//!   The fetched value arrives native-endian and is rewritten at completion as a ConnectX
//!   writes it (`backend::fetched_bytes`: 8-byte results as they are, 4-byte ones
//!   big-endian; the producer converts).
//! - Remote checks happen here, before posting, against the peer's heap as exchanged at
//!   init (mlx5 key, virtual base, length): tcp;ofi_rxm answers a bad key or an
//!   out-of-bounds write by dropping the connection (docs/fabric.md), a ConnectX with
//!   REMOTE_ACCESS (0x13), which is what this backend reports. Misaligned atomics:
//!   REMOTE_INVAL_REQ (0x12).
//! - Local buffers must lie in a region registered with the fabric domain (the proxy's
//!   staging memory is allocated through the domain; see [`FabricBackend::regions`]);
//!   inline data is copied to a registered bounce slot freed at completion.
//! - Failures (posting or completion) become error CQEs through
//!   [`crate::fabric::syndrome_for`].
//!
//! - Never blocks the engine (the [`Backend`] contract): the endpoint's busy limit is zero,
//!   so a post that finds no free slot or gets `-FI_EAGAIN` is queued instead, per peer, and
//!   retried at every `poll`; a peer also holds at most half the endpoint's slots. So one
//!   peer that stops taking operations (a link down, a stalled process) neither stalls the
//!   engine thread nor starves the other peers. Posts to one peer keep their order (a
//!   queued post holds back every later one to that peer); a queued post that could not
//!   be posted within the fabric timeout (`RSHMEM_TIMEOUT_MS`) completes, with every post
//!   queued behind it to that peer, with TRANSPORT_RETRY_EXC (0x15), as a ConnectX
//!   reports a peer that stopped answering.
//!
//! Progress: tcp;ofi_rxm moves data (including data *arriving* for this process) only
//! while the endpoint is polled, so the engine keeps polling when idle;
//! [`Backend::idle_wait`] bounds its idle sleep to [`IDLE_WAIT`].

use super::backend::{AtomicOp, Backend, Gather, LocalBuf, Op};
use crate::config::FabricSwitches;
use crate::error::{Error, Result};
use crate::fabric::{
    reads_follow_writes, AtomicType, Completion, Domain, Endpoint, Fabric, FetchOp, Local,
    MemoryRegion, PeerAddr, RemoteRegion, Target,
};
use crate::mlx5::Syndrome;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest sleep of an idle engine that serves a fabric endpoint: remote PEs' operations
/// on this process's memory progress only while it polls.
pub const IDLE_WAIT: Duration = Duration::from_micros(50);

/// Lazy confirmation: writes left unconfirmed before a flush READ is posted anyway.
const LAZY_LIMIT: usize = 64;

/// Bytes of one inline bounce slot (the longest inline WQE payload fits).
const BOUNCE: usize = 1024;
/// Bounce slots; beyond them an inline write gets a freshly registered buffer.
const BOUNCE_SLOTS: usize = 256;

/// A peer reached through the fabric: its endpoint address and its heap as WQEs name it
/// (mlx5 key and virtual base in the peer's process) and as the provider addresses it.
#[derive(Debug, Clone, Copy)]
pub struct FabricPeer {
    pub addr: PeerAddr,
    pub region: RemoteRegion,
    /// The peer's heap base address as WQEs carry it.
    pub vbase: u64,
    /// The peer's heap key as WQEs carry it.
    pub rkey: u32,
    /// The peer's heap length.
    pub len: u64,
}

impl FabricPeer {
    /// The provider target of `[raddr, raddr+len)`, or REMOTE_ACCESS.
    fn target(&self, rkey: u32, raddr: u64, len: u64) -> std::result::Result<Target, Syndrome> {
        let ok = rkey == self.rkey
            && raddr >= self.vbase
            && raddr
                .checked_add(len)
                .is_some_and(|e| e <= self.vbase + self.len);
        if !ok {
            return Err(Syndrome::RemoteAccess);
        }
        Ok(Target {
            peer: self.addr,
            region: self.region,
            offset: raddr - self.vbase,
        })
    }
}

/// Local memory registered with the backend's domain, where WQE buffers must lie.
pub type Regions = Arc<Mutex<Vec<Arc<MemoryRegion>>>>;

enum Bounce {
    None,
    Slot(u32),
}

/// One libfabric post, with what it needs to be retried later.
enum Post {
    Write {
        t: Target,
        region: Arc<MemoryRegion>,
        offset: usize,
        len: usize,
    },
    Read {
        t: Target,
        region: Arc<MemoryRegion>,
        offset: usize,
        len: usize,
    },
    Atomic {
        ty: AtomicType,
        op: FabricAtomic,
        t: Target,
        region: Arc<MemoryRegion>,
        offset: usize,
    },
}

/// A post waiting for its peer (a free slot, the peer's share, or the provider).
struct Deferred {
    /// The operation it is a part of.
    i: u32,
    post: Post,
    /// When it was first tried.
    since: Instant,
}

/// Per peer: posts in flight, and posts waiting their turn (in order).
#[derive(Default)]
struct PeerQueue {
    inflight: usize,
    waiting: VecDeque<Deferred>,
    /// When one of this peer's posts last completed: a waiting post fails only after the
    /// peer made no progress for the whole timeout (not merely after waiting that long
    /// behind a busy, healthy peer's long transfers).
    progressed: Option<Instant>,
}

struct Pending {
    token: u64,
    /// The peer (address) its posts go to.
    peer: u64,
    /// A write waiting for delivery (not delivery-complete endpoints): the peer to flush.
    flush_to: Option<Target>,
    /// This operation is the flush READ to peer `.0` of writes `.1` (reported when it
    /// completes).
    flushes: Option<(u64, Vec<u32>)>,
    /// Posts not completed yet.
    left: u32,
    status: std::result::Result<(), Syndrome>,
    bounce: Bounce,
    /// A 4-byte atomic result to rewrite big-endian at completion, as a ConnectX writes it
    /// (`backend::fetched_bytes`; an 8-byte one is already in host order): (the region
    /// holding it, offset, bytes). The region is held here, not only by the endpoint's
    /// slot, which lets go of it when the completion is read, before the rewrite: a QP
    /// detached with the atomic in flight drops its staging, and the rewrite would touch
    /// freed memory (before 2026-12-07 this held a raw address).
    result_be32: Option<(Arc<MemoryRegion>, usize, usize)>,
}

/// `bufs` cut into pieces of at most `max` bytes (the provider's `max_msg_size`; 0:
/// unreported, no limit), in order: one WQE's data segment may name up to 2 GiB, beyond
/// what one operation of some providers moves (verbs: often 1 GiB). Borrowed, with no
/// allocation, in the usual case where every piece fits (this runs for every WQE).
fn split_bufs(bufs: &[LocalBuf], max: usize) -> std::borrow::Cow<'_, [LocalBuf]> {
    let max = if max == 0 { usize::MAX } else { max };
    if bufs.iter().all(|b| b.len <= max) {
        return std::borrow::Cow::Borrowed(bufs);
    }
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        let mut done = 0;
        loop {
            let len = (b.len - done).min(max);
            out.push(LocalBuf {
                ptr: b.ptr.wrapping_add(done),
                len,
            });
            done += len;
            if done >= b.len {
                break;
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Executes soft-HCA operations over one libfabric endpoint. Asynchronous.
pub struct FabricBackend {
    ep: Endpoint,
    /// Writes complete at the target (FI_DELIVERY_COMPLETE). When false, a write's
    /// completion is held until an 8-byte READ posted after it to the same peer
    /// completes (one ordered connection per peer: the READ is answered after the write
    /// was placed) — see docs/multinode.md.
    dc: bool,
    /// Per peer (by address): writes locally complete, awaiting a flush; and whether a
    /// flush READ is in flight.
    unflushed: std::collections::HashMap<u64, (Target, Vec<u32>, bool)>,
    /// Lazy confirmation (default; `RSHMEM_FABRIC_CONFIRM=eager` turns it off): post flush
    /// READs only when a completion is needed
    /// ([`Backend::set_urgent`]) or [`LAZY_LIMIT`] writes wait, instead of every round.
    lazy: bool,
    /// Some thread waits for a completion, or the engine holds WQEs back.
    urgent: bool,
    /// The completion queue failed (fi_cq_read / fi_cq_readerr returned an error, e.g.
    /// FI_EOVERRUN, which fi_cq(3) calls fatal): every operation then in flight was failed
    /// and its index freed, so the CQ is never read again (a late completion would name an
    /// index a new operation holds) and every later operation fails at once.
    broken: bool,
    /// The engine thread parks while a PE drives (default; `RSHMEM_ENGINE_HANDOVER=0` turns
    /// it off).
    handover: bool,
    /// Writes locally complete and not yet covered by a flush READ posted.
    unflushed_n: usize,
    regions: Regions,
    bounce: Arc<MemoryRegion>,
    bounce_free: Vec<u32>,
    /// Where every flush READ lands: its 8 bytes are thrown away, so concurrent flushes
    /// share them, and a flush never waits for a bounce slot. (Before 2026-12-07 flushes
    /// took bounce slots: under eager confirmation, writes waiting for their flush held
    /// all 256 slots, no flush could be posted, and nothing was confirmed again.)
    flush_sink: Arc<MemoryRegion>,
    ops: Vec<Option<Pending>>,
    ops_free: Vec<u32>,
    comps: Vec<Completion>,
    /// Per peer (by address): posts in flight and posts waiting (see the module doc).
    peers: HashMap<u64, PeerQueue>,
    /// Posts waiting, over all peers.
    waiting_n: usize,
    /// Most posts one peer may have in flight now: half the endpoint's slots, or while
    /// posts wait, the slots shared by the active peers (see `drain`).
    peer_cap: usize,
    /// The address at which this endpoint reaches itself (PEs that are threads of this
    /// process), once inserted.
    self_addr: Option<PeerAddr>,
    /// Keys of heap regions of this process whose PE left ([`FabricBackend::retire`]).
    revoked: Vec<u64>,
    /// Those regions and the memory under them, kept until the endpoint is closed (the last
    /// field: dropped after `ep` and every operation).
    retired: Vec<Retired>,
}

/// A retired heap registration and what keeps its memory mapped; fields drop in order,
/// the registration first.
struct Retired {
    _mr: Arc<MemoryRegion>,
    _memory: Box<dyn Send>,
}

impl std::fmt::Debug for FabricBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricBackend")
            .field("ep", &self.ep)
            .field("in_flight", &(self.ops.len() - self.ops_free.len()))
            .finish()
    }
}

fn syndrome_of(code: u8) -> Syndrome {
    Syndrome::ALL
        .into_iter()
        .find(|s| *s as u8 == code)
        .unwrap_or(Syndrome::RemoteOp)
}

fn post_syndrome(e: &Error) -> Syndrome {
    match e {
        Error::Fabric { code, .. } => syndrome_of(crate::fabric::syndrome_for(*code)),
        Error::Misaligned { .. } => Syndrome::RemoteInvalReq,
        _ => Syndrome::RemoteOp,
    }
}

/// A libfabric fetch or compare operation equal to `op`, or None (REMOTE_OP).
#[derive(Clone, Copy)]
enum FabricAtomic {
    Fetch(FetchOp, u64),
    Cswap { compare: u64, swap: u64 },
}

fn map_atomic(op: &AtomicOp) -> Option<(AtomicType, FabricAtomic)> {
    let size = op.size();
    let ty = if size == 4 {
        AtomicType::U32
    } else {
        AtomicType::U64
    };
    let m = if size == 4 { u32::MAX as u64 } else { u64::MAX };
    Some(match *op {
        AtomicOp::Cs { compare, swap } => (ty, FabricAtomic::Cswap { compare, swap }),
        AtomicOp::Fa { add } => (ty, FabricAtomic::Fetch(FetchOp::Add, add)),
        AtomicOp::MaskedFa { add, boundary, .. } if boundary & m == 0 => {
            (ty, FabricAtomic::Fetch(FetchOp::Add, add & m))
        }
        AtomicOp::MaskedCs {
            swap,
            compare,
            swap_mask,
            compare_mask,
            ..
        } => {
            let (sm, cm) = (swap_mask & m, compare_mask & m);
            if cm == m && sm == m {
                (
                    ty,
                    FabricAtomic::Cswap {
                        compare: compare & m,
                        swap: swap & m,
                    },
                )
            } else if cm != 0 {
                return None;
            } else if sm == m {
                (ty, FabricAtomic::Fetch(FetchOp::Swap, swap & m))
            } else if swap & sm == 0 {
                (ty, FabricAtomic::Fetch(FetchOp::And, !sm & m))
            } else if swap & sm == sm {
                (ty, FabricAtomic::Fetch(FetchOp::Or, sm))
            } else {
                return None;
            }
        }
        AtomicOp::MaskedFa { .. } => return None,
    })
}

impl FabricBackend {
    /// Opens the provider chosen by `RSHMEM_FABRIC_PROVIDER` (or the first that fits),
    /// a domain and one endpoint. Fails with `Error::LibraryMissing` (naming libfabric1)
    /// when libfabric is not installed.
    pub fn open(switches: FabricSwitches, timeout: Duration) -> Result<FabricBackend> {
        let cfg = crate::fabric::FabricConfig::from_env_with(timeout);
        FabricBackend::open_on(&Fabric::open(&cfg)?, switches)
    }

    /// As [`FabricBackend::open`] on an opened fabric (its config chooses the provider and
    /// the timeout).
    pub fn open_on(fabric: &Arc<Fabric>, switches: FabricSwitches) -> Result<FabricBackend> {
        let domain = fabric.domain()?;
        // RSHMEM_FABRIC_DELIVERY=complete asks the provider for delivery-complete writes
        // instead of flushing with READs (slower on tcp;ofi_rxm, see docs/multinode.md).
        // A flush READ confirms earlier writes only where the provider orders RMA reads
        // after writes: elsewhere (efa, or rxm over verbs with atomics) delivery-complete
        // writes are required.
        let info = domain.info();
        // Ordered on this PE's transmit side and on the target's receive side.
        let ordered = reads_follow_writes(info.msg_order) && reads_follow_writes(info.rx_msg_order);
        let mut ep = Endpoint::with_completion(&domain, switches.delivery_complete || !ordered)?;
        if !ep.delivery_complete() && !ordered {
            return Err(Error::Fabric {
                call: "fi_endpoint",
                code: 0,
                detail: format!(
                    "provider {} ({}) can confirm a write neither with a delivery-complete \
                     completion (FI_DELIVERY_COMPLETE refused) nor with a READ after it (its \
                     msg_order, transmit {:#x} and receive {:#x}, lacks FI_ORDER_RMA_RAW and \
                     FI_ORDER_RAW on a side): choose another with RSHMEM_FABRIC_PROVIDER",
                    info.provider, info.domain, info.msg_order, info.rx_msg_order
                ),
            });
        }
        // Never wait inside a post: a busy endpoint queues the post (see the module doc).
        ep.set_busy_limit(Some(Duration::ZERO));
        let peer_cap = (ep.slots() / 2).max(1);
        let bounce = domain.alloc(BOUNCE * BOUNCE_SLOTS)?;
        let flush_sink = domain.alloc(8)?;
        // Lazy confirmation and the handover are the defaults since 2026-12-02: together they
        // halve the 8 B put latency across namespaces (docs/multinode.md, "Defaults").
        Ok(FabricBackend {
            dc: ep.delivery_complete(),
            unflushed: std::collections::HashMap::new(),
            lazy: switches.lazy_confirm,
            urgent: false,
            broken: false,
            handover: switches.handover,
            unflushed_n: 0,
            ep,
            regions: Arc::new(Mutex::new(Vec::new())),
            bounce,
            bounce_free: (0..BOUNCE_SLOTS as u32).rev().collect(),
            flush_sink,
            ops: Vec::new(),
            ops_free: Vec::new(),
            comps: Vec::with_capacity(64),
            peers: HashMap::new(),
            waiting_n: 0,
            peer_cap,
            self_addr: None,
            revoked: Vec::new(),
            retired: Vec::new(),
        })
    }

    /// Whether writes are confirmed with flush READs (the provider orders RMA reads after
    /// writes on both sides) rather than delivery-complete completions.
    pub fn confirms_with_reads(&self) -> bool {
        !self.dc
    }

    /// Posts waiting for their peer (diagnostics and tests).
    pub fn waiting(&self) -> usize {
        self.waiting_n
    }

    /// Most posts one peer may have in flight now (half the endpoint's slots; less while
    /// posts wait and more than two peers are active).
    pub fn peer_cap(&self) -> usize {
        self.peer_cap
    }

    /// This endpoint's address, for peers' [`FabricBackend::insert_peer`].
    pub fn name(&self) -> Vec<u8> {
        self.ep.name().to_vec()
    }

    /// The domain (register memory with it).
    pub fn domain(&self) -> &Arc<Domain> {
        self.ep.domain()
    }

    /// The provider's name.
    pub fn provider(&self) -> String {
        self.ep.info().provider.clone()
    }

    /// The list of registered local regions WQE buffers may use; callers add their
    /// staging memory and remove it when done.
    pub fn regions(&self) -> Regions {
        self.regions.clone()
    }

    /// Adds a peer's endpoint address.
    pub fn insert_peer(&mut self, name: &[u8]) -> Result<PeerAddr> {
        let a = self.ep.insert_peer(name)?;
        if name == self.ep.name() {
            self.self_addr = Some(a);
        }
        Ok(a)
    }

    /// A PE of this process leaves while the endpoint goes on: its heap registration `mr`
    /// and the memory under it (`memory`, e.g. its mapping) stay until the endpoint closes,
    /// and operations this process posts to the region afterwards complete with
    /// REMOTE_ACCESS (0x13), as after a ConnectX's MR was deregistered.
    ///
    /// Why not close it now: tcp;ofi_rxm answers an operation that arrives for an unknown
    /// key by dropping the whole connection (docs/fabric.md), and the PEs that are threads
    /// of one process share one endpoint, so one connection to each other process and one
    /// to itself. A write still in flight to the leaving PE, or sent by a peer that does not
    /// know yet that it left, would break every PE pair on that connection, not just the
    /// ones of the PE that left (docs/ep.md, "A PE thread that leaves").
    /// The region also leaves the list of local buffers WQEs may use.
    pub fn retire(&mut self, mr: Arc<MemoryRegion>, memory: Box<dyn Send>) {
        self.regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|r| !Arc::ptr_eq(r, &mr));
        self.revoked.push(mr.remote().key);
        self.retired.push(Retired {
            _mr: mr,
            _memory: memory,
        });
    }

    /// Regions retired so far (diagnostics and tests).
    pub fn retired(&self) -> usize {
        self.retired.len()
    }

    /// Operations posted and not completed.
    pub fn in_flight(&self) -> usize {
        self.ops.len() - self.ops_free.len()
    }

    fn find(&self, b: &LocalBuf) -> std::result::Result<(Arc<MemoryRegion>, usize), Syndrome> {
        let p = b.ptr as usize;
        let g = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        g.iter()
            .chain(std::iter::once(&self.bounce))
            .find(|r| {
                let s = r.as_ptr() as usize;
                p >= s && p + b.len <= s + r.len()
            })
            .map(|r| (r.clone(), p - r.as_ptr() as usize))
            .ok_or(Syndrome::LocalProt)
    }

    fn new_op(&mut self, token: u64, peer: u64, left: u32, bounce: Bounce) -> u32 {
        let p = Pending {
            token,
            peer,
            flush_to: None,
            flushes: None,
            left,
            status: Ok(()),
            bounce,
            result_be32: None,
        };
        match self.ops_free.pop() {
            Some(i) => {
                self.ops[i as usize] = Some(p);
                i
            }
            None => {
                self.ops.push(Some(p));
                (self.ops.len() - 1) as u32
            }
        }
    }

    /// Without delivery-complete writes, write `i` to `t`'s peer is reported only after a
    /// flush READ.
    fn mark_write(&mut self, i: u32, t: Target) {
        if !self.dc {
            if let Some(p) = self.ops[i as usize].as_mut() {
                p.flush_to = Some(Target { offset: 0, ..t });
            }
        }
    }

    /// Operation `i` has no post left in flight: report it, or (a write that still needs
    /// its delivery confirmed) queue it for its peer's next flush. A flush READ reports
    /// the writes it covered.
    fn settle(&mut self, i: u32, done: &mut dyn FnMut(u64, std::result::Result<(), Syndrome>)) {
        let Some(p) = self.ops[i as usize].as_mut() else {
            return;
        };
        if let (Some(t), Ok(())) = (p.flush_to, p.status) {
            p.flush_to = None;
            // Locally complete: the provider is done with the source, so the bounce slot
            // may go now (it may be long until the flush; lazy or eager alike).
            if let Bounce::Slot(s) = std::mem::replace(&mut p.bounce, Bounce::None) {
                self.bounce_free.push(s);
            }
            self.unflushed_n += 1;
            self.unflushed
                .entry(t.peer.0)
                .or_insert_with(|| (t, Vec::new(), false))
                .1
                .push(i);
            return;
        }
        let covered = p.flushes.take().map(|(_, l)| l);
        let (token, status) = self.finish(i);
        match covered {
            Some(list) => {
                for w in list {
                    if let Some(q) = self.ops[w as usize].as_mut() {
                        if let (Err(s), Ok(())) = (status, q.status) {
                            q.status = Err(s);
                        }
                    }
                    let (t, st) = self.finish(w);
                    done(t, st);
                }
            }
            None => done(token, status),
        }
    }

    /// Posts a flush READ to every peer with unflushed writes and no flush in flight.
    fn post_flushes(&mut self, done: &mut dyn FnMut(u64, std::result::Result<(), Syndrome>)) {
        let peers: Vec<u64> = self
            .unflushed
            .iter()
            .filter(|(_, (_, w, busy))| !*busy && !w.is_empty())
            .map(|(k, _)| *k)
            .collect();
        for k in peers {
            let (t, writes) = {
                let e = self.unflushed.get_mut(&k).expect("listed");
                e.2 = true;
                (e.0, std::mem::take(&mut e.1))
            };
            self.unflushed_n = self.unflushed_n.saturating_sub(writes.len());
            let i = self.new_op(u64::MAX, k, 1, Bounce::None);
            if let Some(p) = self.ops[i as usize].as_mut() {
                p.flushes = Some((k, writes));
            }
            let post = Post::Read {
                t,
                region: self.flush_sink.clone(),
                offset: 0,
                len: 8,
            };
            // Behind every write to this peer still waiting to be posted.
            if let Err(s) = self.submit(i, post) {
                self.fail_part(i, s, done);
            }
        }
    }

    /// Operation `i`'s last post finished: a flush frees its peer for the next one.
    fn flush_done(&mut self, i: u32, done: &mut dyn FnMut(u64, std::result::Result<(), Syndrome>)) {
        let peer = self.ops[i as usize]
            .as_ref()
            .and_then(|p| p.flushes.as_ref().map(|f| f.0));
        if let Some(e) = peer.and_then(|k| self.unflushed.get_mut(&k)) {
            e.2 = false;
        }
        self.settle(i, done);
    }

    /// One of an operation's posts finished (or failed to post); true when it was the last.
    fn part_done(&mut self, i: u32, status: std::result::Result<(), Syndrome>) -> bool {
        let Some(p) = self.ops[i as usize].as_mut() else {
            return false;
        };
        if let (Err(s), Ok(())) = (status, p.status) {
            p.status = Err(s);
        }
        p.left -= 1;
        p.left == 0
    }

    /// Retires operation `i`: frees its bounce slot, fixes an atomic result's byte order.
    fn finish(&mut self, i: u32) -> (u64, std::result::Result<(), Syndrome>) {
        let p = self.ops[i as usize].take().expect("live operation");
        self.ops_free.push(i);
        if let Bounce::Slot(s) = p.bounce {
            self.bounce_free.push(s);
        }
        if let (Ok(()), Some((region, offset, n))) = (p.status, p.result_be32) {
            // SAFETY: [offset, offset + 4) is inside `region` (found by `find` for the
            // whole result), which this operation holds, so the memory is alive; the
            // provider wrote 4 native-endian bytes there and is done with them (the
            // operation completed).
            unsafe {
                let addr = region.as_ptr().add(offset);
                let mut b = [0u8; 4];
                std::ptr::copy_nonoverlapping(addr as *const u8, b.as_mut_ptr(), 4);
                let out = super::backend::fetched_bytes(u32::from_ne_bytes(b) as u64, 4);
                std::ptr::copy_nonoverlapping(out.as_ptr(), addr, n.min(4));
            }
        }
        (p.token, p.status)
    }

    /// Posts one part of operation `i` on `ep`.
    fn try_post(ep: &mut Endpoint, i: u32, post: &Post) -> Result<()> {
        let ctx = i as u64;
        match post {
            Post::Write {
                t,
                region,
                offset,
                len,
            } => ep.write(
                *t,
                Local {
                    region,
                    offset: *offset,
                },
                *len,
                ctx,
            ),
            Post::Read {
                t,
                region,
                offset,
                len,
            } => ep.read(
                Local {
                    region,
                    offset: *offset,
                },
                *t,
                *len,
                ctx,
            ),
            Post::Atomic {
                ty,
                op,
                t,
                region,
                offset,
            } => {
                let local = Local {
                    region,
                    offset: *offset,
                };
                match *op {
                    FabricAtomic::Fetch(f, v) => ep.fetch_atomic(f, *ty, v, *t, local, ctx),
                    FabricAtomic::Cswap { compare, swap } => {
                        ep.compare_swap(*ty, compare, swap, *t, local, ctx)
                    }
                }
            }
        }
    }

    /// Posts `post` (a part of operation `i`) now, or queues it behind its peer's earlier
    /// posts when some wait, the peer holds its share of the slots, or the endpoint is
    /// busy. Err: it failed to post and will never complete.
    fn submit(&mut self, i: u32, post: Post) -> std::result::Result<(), Syndrome> {
        let key = match &post {
            Post::Write { t, .. } | Post::Read { t, .. } | Post::Atomic { t, .. } => t.peer.0,
        };
        let q = self.peers.entry(key).or_default();
        if q.waiting.is_empty() && q.inflight < self.peer_cap {
            match Self::try_post(&mut self.ep, i, &post) {
                Ok(()) => {
                    q.inflight += 1;
                    return Ok(());
                }
                Err(e) if !Endpoint::is_busy(&e) => return Err(post_syndrome(&e)),
                Err(_) => {}
            }
        }
        q.waiting.push_back(Deferred {
            i,
            post,
            since: Instant::now(),
        });
        self.waiting_n += 1;
        Ok(())
    }

    /// A part of operation `i` failed: it counts as done with `s`.
    fn fail_part(
        &mut self,
        i: u32,
        s: Syndrome,
        done: &mut dyn FnMut(u64, std::result::Result<(), Syndrome>),
    ) {
        if self.part_done(i, Err(s)) {
            self.flush_done(i, done);
        }
    }

    /// Retries the waiting posts, per peer in order, until one finds its peer busy. A post
    /// that waited the whole fabric timeout fails with every post behind it to that peer.
    fn drain(&mut self, done: &mut dyn FnMut(u64, std::result::Result<(), Syndrome>)) {
        let slots = self.ep.slots();
        if self.waiting_n == 0 {
            self.peer_cap = (slots / 2).max(1);
            return;
        }
        // While posts wait, the slots are shared by the peers with posts in flight or
        // waiting (at most half each): a peer above its share posts nothing until it is
        // below it, so slots that busy peers free reach a peer that waits with nothing in
        // flight. (Before 2026-12-07 two busy peers could keep all the slots between them,
        // whichever retried first taking each freed one, and a third peer's posts waited
        // out the fabric timeout and failed.)
        let active = self
            .peers
            .values()
            .filter(|q| q.inflight > 0 || !q.waiting.is_empty())
            .count();
        self.peer_cap = (slots / active.max(2)).max(1);
        let timeout = self.ep.domain().fabric().timeout();
        let keys: Vec<u64> = self
            .peers
            .iter()
            .filter(|(_, q)| !q.waiting.is_empty())
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            loop {
                let q = self.peers.get_mut(&key).expect("listed");
                let Some(d) = q.waiting.pop_front() else {
                    break;
                };
                self.waiting_n -= 1;
                let tried = (q.inflight < self.peer_cap)
                    .then(|| Self::try_post(&mut self.ep, d.i, &d.post));
                match tried {
                    Some(Ok(())) => q.inflight += 1,
                    Some(Err(e)) if !Endpoint::is_busy(&e) => {
                        self.fail_part(d.i, post_syndrome(&e), done)
                    }
                    _ if q.progressed.map_or(d.since, |p| p.max(d.since)).elapsed() >= timeout => {
                        // The peer took nothing for the whole timeout (no post of its
                        // completed since this one was queued, or for the timeout since
                        // one did): like a ConnectX whose retries ran out, fail this post
                        // and every one queued behind it.
                        let rest = std::mem::take(&mut q.waiting);
                        self.waiting_n -= rest.len();
                        self.fail_part(d.i, Syndrome::TransportRetryExc, done);
                        for r in rest {
                            self.fail_part(r.i, Syndrome::TransportRetryExc, done);
                        }
                        break;
                    }
                    _ => {
                        q.waiting.push_front(d);
                        self.waiting_n += 1;
                        break;
                    }
                }
            }
        }
    }

    /// Submits the parts of operation `i` (`make` builds part k); a part that fails
    /// counts as done with its syndrome, and so does every later one. Returns the final
    /// status when nothing stays in flight or queued.
    fn post_parts(
        &mut self,
        i: u32,
        parts: usize,
        mut make: impl FnMut(&mut Self, usize) -> std::result::Result<Post, Syndrome>,
    ) -> Option<std::result::Result<(), Syndrome>> {
        for k in 0..parts {
            if let Err(s) = make(self, k).and_then(|p| self.submit(i, p)) {
                // This part and every later one will never complete.
                let mut last = false;
                for _ in k..parts {
                    last = self.part_done(i, Err(s));
                }
                if last {
                    return Some(self.finish(i).1);
                }
                return None;
            }
        }
        None
    }

    fn start(
        &mut self,
        peer: &FabricPeer,
        token: u64,
        op: &Op<'_>,
    ) -> Option<std::result::Result<(), Syndrome>> {
        if self.broken {
            return Some(Err(Syndrome::TransportRetryExc));
        }
        let key = peer.addr.0;
        if Some(peer.addr) == self.self_addr && self.revoked.contains(&peer.region.key) {
            return Some(Err(Syndrome::RemoteAccess));
        }
        match *op {
            Op::Write {
                raddr,
                rkey,
                len,
                src,
            } => {
                if len == 0 {
                    return Some(Ok(()));
                }
                let t = match peer.target(rkey, raddr, len) {
                    Ok(t) => t,
                    Err(s) => return Some(Err(s)),
                };
                match src {
                    Gather::Inline(b) => {
                        let (region, offset, bounce) = match self.bounce_free.pop() {
                            Some(s) if b.len() <= BOUNCE => {
                                (self.bounce.clone(), s as usize * BOUNCE, Bounce::Slot(s))
                            }
                            other => {
                                if let Some(s) = other {
                                    self.bounce_free.push(s);
                                }
                                match self.domain().alloc(b.len().max(1)) {
                                    Ok(r) => (r, 0, Bounce::None),
                                    Err(e) => return Some(Err(post_syndrome(&e))),
                                }
                            }
                        };
                        if let Err(e) = region.write(offset, b) {
                            // The slot goes back (the range is always inside it, so this
                            // does not happen; kept so a failure cannot leak a slot).
                            if let Bounce::Slot(s) = bounce {
                                self.bounce_free.push(s);
                            }
                            return Some(Err(post_syndrome(&e)));
                        }
                        let i = self.new_op(token, key, 1, bounce);
                        self.mark_write(i, t);
                        let mut post = Some(Post::Write {
                            t,
                            region,
                            offset,
                            len: b.len(),
                        });
                        self.post_parts(i, 1, |_, _| Ok(post.take().expect("one part")))
                    }
                    Gather::Bufs(bufs) => {
                        let bufs = &*split_bufs(bufs, self.ep.info().max_msg_size);
                        let i = self.new_op(token, key, bufs.len() as u32, Bounce::None);
                        self.mark_write(i, t);
                        let mut off = 0u64;
                        self.post_parts(i, bufs.len(), |me, k| {
                            let b = bufs[k];
                            let (region, offset) = me.find(&b)?;
                            let mut tk = t;
                            tk.offset += off;
                            off += b.len as u64;
                            Ok(Post::Write {
                                t: tk,
                                region,
                                offset,
                                len: b.len,
                            })
                        })
                    }
                }
            }
            Op::Read {
                raddr,
                rkey,
                len,
                dst,
            } => {
                if len == 0 {
                    return Some(Ok(()));
                }
                let t = match peer.target(rkey, raddr, len) {
                    Ok(t) => t,
                    Err(s) => return Some(Err(s)),
                };
                let dst = &*split_bufs(dst, self.ep.info().max_msg_size);
                let i = self.new_op(token, key, dst.len() as u32, Bounce::None);
                let mut off = 0u64;
                self.post_parts(i, dst.len(), |me, k| {
                    let b = dst[k];
                    let (region, offset) = me.find(&b)?;
                    let mut tk = t;
                    tk.offset += off;
                    off += b.len as u64;
                    Ok(Post::Read {
                        t: tk,
                        region,
                        offset,
                        len: b.len,
                    })
                })
            }
            Op::Atomic {
                raddr,
                rkey,
                op,
                result,
            } => {
                let size = op.size() as u64;
                let t = match peer.target(rkey, raddr, size) {
                    Ok(t) => t,
                    Err(s) => return Some(Err(s)),
                };
                if raddr % size != 0 {
                    return Some(Err(Syndrome::RemoteInvalReq));
                }
                let Some((ty, fop)) = map_atomic(&op) else {
                    return Some(Err(Syndrome::RemoteOp));
                };
                let full = LocalBuf {
                    ptr: result.ptr,
                    len: size as usize,
                };
                let (region, offset) = match self.find(&full) {
                    Ok(x) => x,
                    Err(s) => return Some(Err(s)),
                };
                let i = self.new_op(token, key, 1, Bounce::None);
                if let Some(p) = self.ops[i as usize].as_mut() {
                    if size == 4 {
                        p.result_be32 = Some((region.clone(), offset, result.len));
                    }
                }
                let mut post = Some(Post::Atomic {
                    ty,
                    op: fop,
                    t,
                    region,
                    offset,
                });
                self.post_parts(i, 1, |_, _| Ok(post.take().expect("one part")))
            }
        }
    }
}

impl Backend for FabricBackend {
    type Peer = FabricPeer;
    type Cache = ();

    fn execute(
        &mut self,
        peer: &FabricPeer,
        _cache: &mut (),
        token: u64,
        op: &Op<'_>,
    ) -> Option<std::result::Result<(), Syndrome>> {
        self.start(peer, token, op)
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, std::result::Result<(), Syndrome>)) {
        if self.broken {
            return;
        }
        let mut comps = std::mem::take(&mut self.comps);
        comps.clear();
        if self.ep.poll_into(&mut comps).is_err() {
            // The completion queue itself failed: nothing in flight will complete.
            self.broken = true;
            comps.clear();
            self.unflushed.clear();
            self.unflushed_n = 0;
            self.peers.clear();
            self.waiting_n = 0;
            for i in 0..self.ops.len() as u32 {
                if let Some(p) = self.ops[i as usize].as_mut() {
                    // Failed, so `finish` leaves a 4-byte atomic result alone: the provider
                    // may still write it.
                    p.status = Err(Syndrome::TransportRetryExc);
                    let (t, _) = self.finish(i);
                    done(t, Err(Syndrome::TransportRetryExc));
                }
            }
            self.comps = comps;
            return;
        }
        for c in comps.drain(..) {
            // Remote-data arrivals and errors not tied to an operation (a peer that went
            // away while nothing was in flight to it) need no CQE.
            if let Completion::Local { context, status } = c {
                let i = context as u32;
                // One post of operation i ended: its peer has one more slot to use.
                if let Some(p) = self.ops.get(i as usize).and_then(Option::as_ref) {
                    if let Some(q) = self.peers.get_mut(&p.peer) {
                        q.inflight = q.inflight.saturating_sub(1);
                        if !q.waiting.is_empty() {
                            q.progressed = Some(Instant::now());
                        }
                    }
                }
                let s = status.map_err(|e| syndrome_of(e.syndrome()));
                if (i as usize) < self.ops.len() && self.part_done(i, s) {
                    self.flush_done(i, done);
                }
            }
        }
        self.comps = comps;
        self.drain(done);
        if !self.lazy || self.urgent || self.unflushed_n >= LAZY_LIMIT {
            self.post_flushes(done);
        }
    }

    fn idle_wait(&self) -> Duration {
        IDLE_WAIT
    }

    fn set_urgent(&mut self, urgent: bool) {
        self.urgent = urgent;
    }

    fn handover(&self) -> bool {
        self.handover
    }
}

#[cfg(test)]
mod tests {
    use super::{reads_follow_writes, split_bufs, LocalBuf};

    #[test]
    fn data_segments_are_cut_to_the_providers_message_size() {
        let mut mem = vec![0u8; 64];
        let p = mem.as_mut_ptr();
        let bufs = [
            LocalBuf { ptr: p, len: 10 },
            LocalBuf {
                ptr: p.wrapping_add(32),
                len: 4,
            },
        ];
        let cut: Vec<(usize, usize)> = split_bufs(&bufs, 4)
            .iter()
            .map(|b| (b.ptr as usize - p as usize, b.len))
            .collect();
        assert_eq!(cut, [(0, 4), (4, 4), (8, 2), (32, 4)]);
        // 0 (not reported): no limit.
        assert_eq!(split_bufs(&bufs, 0).len(), 2);
        assert_eq!(split_bufs(&bufs, 1 << 30).len(), 2);
    }
    use crate::fabric::sys::{FI_ORDER_RAW, FI_ORDER_RMA_RAW, FI_ORDER_SAS};

    #[test]
    fn flush_reads_need_rma_read_after_write_ordering() {
        // tcp;ofi_rxm 1.17 with rshmem's hints (FI_ATOMIC): FI_ORDER_RAW cleared,
        // FI_ORDER_RMA_RAW set (probed on this machine's libfabric).
        assert!(reads_follow_writes(0xbb_0000_0124));
        assert_eq!(0xbb_0000_0124 & FI_ORDER_RMA_RAW, FI_ORDER_RMA_RAW);
        assert!(reads_follow_writes(FI_ORDER_RAW as u64));
        // shm: send-after-send only; efa: SAS and atomic orderings, no RMA read-after-write.
        assert!(!reads_follow_writes(FI_ORDER_SAS as u64));
        assert!(!reads_follow_writes(
            FI_ORDER_SAS as u64 | (0b1111 << 36) // FI_ORDER_ATOMIC_{RAR,RAW,WAR,WAW}
        ));
        assert!(!reads_follow_writes(0));
    }
}
