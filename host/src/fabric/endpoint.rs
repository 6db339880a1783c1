//! [`Endpoint`]: one RDM endpoint with its completion queue and address vector, posting
//! RMA and atomics on behalf of one engine thread.
//!
//! Every posted operation takes an operation slot: an `fi_context2` the provider may use
//! (FI_CONTEXT/FI_CONTEXT2 modes), the atomic operand and compare values (in registered
//! memory, so FI_MR_LOCAL providers accept them), the caller's `u64` context, and `Arc`s
//! of the local regions involved, so memory cannot be freed under an in-flight
//! operation. The slot is released when [`Endpoint::poll`] returns the completion. With
//! every slot in use, or on `-FI_EAGAIN`, posting progresses the completion queue
//! (keeping what it reads for the next `poll`) and retries, up to the fabric's timeout.
//!
//! Completion semantics: the endpoint asks for `FI_DELIVERY_COMPLETE` by default, so a
//! successful write completion means the data is visible at the target (what an RC
//! queue pair's ACK means to the soft HCA). [`Endpoint::delivery_complete`] says whether
//! the provider accepted it.
//!
//! Progress: providers with manual data progress (tcp;ofi_rxm, verbs;ofi_rxm) move data,
//! including data *arriving* for this endpoint, only inside `poll`. A target must keep
//! polling for initiators to complete.

use super::domain::{Domain, MemoryRegion, RemoteRegion};
use super::info::FabricInfo;
use super::result::{self, AtomicKind};
use super::sys::*;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A peer in this endpoint's address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub u64);

/// The remote side of an operation: a peer, one of its regions and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub peer: PeerAddr,
    pub region: RemoteRegion,
    pub offset: u64,
}

impl Target {
    /// The remote address the provider is given: `region.base + offset`.
    pub fn addr(&self) -> u64 {
        self.region.base.wrapping_add(self.offset)
    }
}

/// The local side: a registered region and an offset in it.
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    pub region: &'a Arc<MemoryRegion>,
    pub offset: usize,
}

/// Element type of an atomic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicType {
    U32,
    U64,
}

impl AtomicType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            AtomicType::U32 => 4,
            AtomicType::U64 => 8,
        }
    }
    fn raw(self) -> fi_datatype {
        match self {
            AtomicType::U32 => FI_UINT32,
            AtomicType::U64 => FI_UINT64,
        }
    }
    fn name(self) -> &'static str {
        match self {
            AtomicType::U32 => "FI_UINT32",
            AtomicType::U64 => "FI_UINT64",
        }
    }
    const ALL: [AtomicType; 2] = [AtomicType::U32, AtomicType::U64];
}

/// Fetching atomics (`fi_fetch_atomic`): the old value lands in the result buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FetchOp {
    /// `FI_SUM`: fetch-and-add.
    Add,
    /// `FI_ATOMIC_READ`: fetch only (operand ignored).
    Read,
    /// `FI_ATOMIC_WRITE` through `fi_fetch_atomic`: swap.
    Swap,
    /// `FI_BAND`.
    And,
    /// `FI_BOR`.
    Or,
    /// `FI_BXOR`.
    Xor,
}

impl FetchOp {
    /// Every fetching op, in table order.
    pub const ALL: [FetchOp; 6] = [
        FetchOp::Add,
        FetchOp::Read,
        FetchOp::Swap,
        FetchOp::And,
        FetchOp::Or,
        FetchOp::Xor,
    ];
    fn raw(self) -> fi_op {
        match self {
            FetchOp::Add => FI_SUM,
            FetchOp::Read => FI_ATOMIC_READ,
            FetchOp::Swap => FI_ATOMIC_WRITE,
            FetchOp::And => FI_BAND,
            FetchOp::Or => FI_BOR,
            FetchOp::Xor => FI_BXOR,
        }
    }
    /// The libfabric name.
    pub fn name(self) -> &'static str {
        match self {
            FetchOp::Add => "FI_SUM",
            FetchOp::Read => "FI_ATOMIC_READ",
            FetchOp::Swap => "FI_ATOMIC_WRITE",
            FetchOp::And => "FI_BAND",
            FetchOp::Or => "FI_BOR",
            FetchOp::Xor => "FI_BXOR",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// What the provider answered to the `fi_*atomicvalid` queries at endpoint creation:
/// `Ok(count)` (elements per operation) or the negative code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtomicSupport {
    fetch: [[std::result::Result<usize, i32>; 6]; 2],
    compare: [std::result::Result<usize, i32>; 2],
    write_sum: [std::result::Result<usize, i32>; 2],
}

impl AtomicSupport {
    fn ty(t: AtomicType) -> usize {
        t as usize
    }
    /// `fi_fetch_atomicvalid(op, ty)`.
    pub fn fetch(&self, op: FetchOp, ty: AtomicType) -> std::result::Result<usize, i32> {
        self.fetch[Self::ty(ty)][op.index()]
    }
    /// `fi_compare_atomicvalid(FI_CSWAP, ty)`.
    pub fn compare(&self, ty: AtomicType) -> std::result::Result<usize, i32> {
        self.compare[Self::ty(ty)]
    }
    /// `fi_atomicvalid(FI_SUM, ty)` (non-fetching add; not posted by this API yet).
    pub fn write_sum(&self, ty: AtomicType) -> std::result::Result<usize, i32> {
        self.write_sum[Self::ty(ty)]
    }
}

/// Why an operation failed, from `fi_cq_readerr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionError {
    /// Positive `FI_E*` code (`err`).
    pub code: i32,
    /// The provider's own error number.
    pub prov_errno: i32,
    /// `fi_strerror(code)`.
    pub text: String,
    /// `fi_cq_strerror` (the provider's explanation), when it gives one.
    pub provider_text: Option<String>,
}

impl CompletionError {
    /// The mlx5 CQE syndrome the soft HCA reports for this error.
    pub fn syndrome(&self) -> u8 {
        super::syndrome::syndrome_for(self.code)
    }
}

impl std::fmt::Display for CompletionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (FI_E code {}, prov_errno {}",
            self.text, self.code, self.prov_errno
        )?;
        if let Some(p) = &self.provider_text {
            write!(f, ": {p}")?;
        }
        write!(f, ")")
    }
}

/// One entry of [`Endpoint::poll`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// An operation this endpoint posted finished.
    Local {
        context: u64,
        status: std::result::Result<(), CompletionError>,
    },
    /// A peer's `write_data` landed in this endpoint's memory with this immediate.
    RemoteData { data: u64 },
    /// An error entry that belongs to no operation of ours (op_context NULL).
    Unattributed(CompletionError),
}

/// The registered part of an operation slot. `ctx` is first: the pointer handed to
/// libfabric as `context` points at it.
#[repr(C)]
struct SlotWire {
    ctx: fi_context2,
    operand: [u8; 8],
    compare: [u8; 8],
}

#[derive(Default)]
struct SlotMeta {
    context: u64,
    /// Keeps the local region alive while the provider may touch it.
    hold: Option<Arc<MemoryRegion>>,
}

/// An RDM endpoint with its CQ and AV.
pub struct Endpoint {
    ep: *mut fid_ep,
    av: *mut fid_av,
    cq: *mut fid_cq,
    /// Registered slot memory (array of `SlotWire`), closed after the endpoint.
    slots_mr: Arc<MemoryRegion>,
    meta: Vec<SlotMeta>,
    free: Vec<u32>,
    pending: VecDeque<Completion>,
    cq_buf: Vec<fi_cq_data_entry>,
    name: Vec<u8>,
    atomics: AtomicSupport,
    delivery_complete: bool,
    domain: Arc<Domain>,
    /// How long a post keeps progressing while every slot is in use or the provider
    /// answers `-FI_EAGAIN`; None: the fabric's timeout (see [`Endpoint::set_busy_limit`]).
    busy_limit: Option<Duration>,
    /// The completion queue failed (`fi_cq_read`/`fi_cq_readerr` returned an error): the
    /// call and its code. Every later progress reports it again, so that a failure met
    /// inside a post is not taken for that post's own error and then forgotten (the CQ
    /// would be read again as if nothing happened, and completions it lost would never
    /// come).
    cq_failed: Option<(&'static str, i64)>,
}

// SAFETY: FI_THREAD_SAFE domain; the endpoint is used through &mut self only.
unsafe impl Send for Endpoint {}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("slots", &self.meta.len())
            .field("in_flight", &(self.meta.len() - self.free.len()))
            .finish()
    }
}

/// Most operations in flight per endpoint (further posts wait for completions).
pub const MAX_SLOTS: usize = 1024;
const CQ_BATCH: usize = 64;

/// Closes `*p` on drop unless disarmed (construction error paths).
struct Guard(*mut fid, &'static str);
impl Drop for Guard {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a live object created in Endpoint::new, closed once.
            let _ = unsafe { result::close(self.0, self.1) };
        }
    }
}

impl Endpoint {
    /// Opens an endpoint with its completion queue and address vector, enables it and
    /// queries atomic support. Writes are delivery-complete where the provider allows.
    pub fn new(domain: &Arc<Domain>) -> Result<Endpoint> {
        Self::with_completion(domain, true)
    }

    /// As [`Endpoint::new`]; `delivery_complete` false keeps the provider's default
    /// completion semantics (on tcp;ofi_rxm: a write completes once sent, without waiting
    /// for the target's acknowledgement — the caller must order or flush itself).
    pub fn with_completion(domain: &Arc<Domain>, want_delivery: bool) -> Result<Endpoint> {
        let info = domain.info().clone();
        let fabric = domain.fabric().clone();
        let nslots = info.tx_size.clamp(16, MAX_SLOTS);

        let mut cq_attr: fi_cq_attr = {
            // SAFETY: fi_cq_attr is plain data; all-zero is its "unspecified" value.
            unsafe { std::mem::zeroed() }
        };
        cq_attr.size = nslots * 2;
        cq_attr.format = FI_CQ_FORMAT_DATA;
        cq_attr.wait_obj = FI_WAIT_NONE;
        let mut cq = ptr::null_mut();
        // SAFETY: domain live; attr and out-pointer valid.
        let rc =
            unsafe { result::fi_cq_open(domain.raw(), &mut cq_attr, &mut cq, ptr::null_mut()) };
        if rc != 0 {
            return Err(result::error(
                "fi_cq_open",
                rc.into(),
                "opening the completion queue",
            ));
        }
        // SAFETY: cq just opened.
        let cq_guard = Guard(unsafe { ptr::addr_of_mut!((*cq).fid) }, "completion queue");

        // SAFETY: as for fi_cq_attr.
        let mut av_attr: fi_av_attr = unsafe { std::mem::zeroed() };
        av_attr.type_ = FI_AV_TABLE;
        av_attr.count = 64;
        let mut av = ptr::null_mut();
        // SAFETY: domain live; attr and out-pointer valid.
        let rc =
            unsafe { result::fi_av_open(domain.raw(), &mut av_attr, &mut av, ptr::null_mut()) };
        if rc != 0 {
            return Err(result::error(
                "fi_av_open",
                rc.into(),
                "opening the address vector",
            ));
        }
        // SAFETY: av just opened.
        let av_guard = Guard(unsafe { ptr::addr_of_mut!((*av).fid) }, "address vector");

        // Ask for delivery-complete writes; fall back to the provider default.
        let mut ep = ptr::null_mut();
        let mut delivery_complete = true;
        let mut last_rc = 0;
        for want_dc in [want_delivery, false] {
            // SAFETY: the fabric's info is live; fi_dupinfo copies it so we may edit the
            // copy's tx_attr.
            let copy = super::info::InfoList(unsafe {
                (super::loader::lib()?.fi_dupinfo)(fabric.raw_info())
            });
            if copy.0.is_null() {
                return Err(result::error(
                    "fi_dupinfo",
                    -(FI_ENOMEM as i64),
                    "endpoint info",
                ));
            }
            // SAFETY: `copy.0` is a live fi_info with tx_attr allocated.
            unsafe {
                if want_dc {
                    (*(*copy.0).tx_attr).op_flags |= FI_DELIVERY_COMPLETE as u64;
                }
            }
            // SAFETY: domain and info live; out-pointer valid.
            last_rc =
                unsafe { result::fi_endpoint(domain.raw(), copy.0, &mut ep, ptr::null_mut()) };
            if last_rc == 0 {
                delivery_complete = want_dc;
                break;
            }
        }
        if last_rc != 0 {
            return Err(result::error(
                "fi_endpoint",
                last_rc.into(),
                "opening the endpoint",
            ));
        }
        // SAFETY: ep just opened.
        let ep_guard = Guard(unsafe { ptr::addr_of_mut!((*ep).fid) }, "endpoint");
        // SAFETY: ep, cq, av live.
        unsafe {
            result::ep_bind(
                ep,
                ptr::addr_of_mut!((*cq).fid),
                FI_TRANSMIT as u64 | FI_RECV as u64,
                "binding the completion queue",
            )?;
            result::ep_bind(
                ep,
                ptr::addr_of_mut!((*av).fid),
                0,
                "binding the address vector",
            )?;
            result::enable(ep)?;
        }
        // SAFETY: ep enabled.
        let name = unsafe { result::getname(ep)? };
        // SAFETY: ep enabled.
        let atomics = unsafe { query_atomics(ep) };

        let slots_mr = domain.alloc(nslots * std::mem::size_of::<SlotWire>())?;
        let mut meta = Vec::with_capacity(nslots);
        meta.resize_with(nslots, SlotMeta::default);
        let free = (0..nslots as u32).rev().collect();

        std::mem::forget(ep_guard);
        std::mem::forget(av_guard);
        std::mem::forget(cq_guard);
        Ok(Endpoint {
            ep,
            av,
            cq,
            slots_mr,
            meta,
            free,
            pending: VecDeque::new(),
            cq_failed: None,
            cq_buf: Vec::with_capacity(CQ_BATCH),
            name,
            atomics,
            delivery_complete,
            domain: domain.clone(),
            busy_limit: None,
        })
    }

    /// Bounds how long a post waits for a free slot or past `-FI_EAGAIN` (progressing the
    /// endpoint meanwhile) before it fails with [`Endpoint::is_busy`]: None (the default)
    /// waits up to the fabric's timeout; `Some(Duration::ZERO)` tries, progresses once and
    /// tries again, so a caller that must not block (the soft HCA engine) can queue the
    /// operation and retry later. A busy failure posted nothing: retrying is safe.
    pub fn set_busy_limit(&mut self, limit: Option<Duration>) {
        self.busy_limit = limit;
    }

    /// Whether `e` is a post that found the endpoint busy (no free slot, or `-FI_EAGAIN`
    /// past the busy limit): nothing was posted.
    pub fn is_busy(e: &Error) -> bool {
        matches!(e, Error::Fabric { code, .. } if *code == -(FI_EAGAIN as i32))
    }

    /// Operation slots: the most operations this endpoint has in flight at once.
    pub fn slots(&self) -> usize {
        self.meta.len()
    }

    fn busy_bound(&self) -> Duration {
        self.busy_limit
            .unwrap_or_else(|| self.domain.fabric().timeout())
    }

    /// This endpoint's address, to send to peers (they pass it to
    /// [`Endpoint::insert_peer`]).
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The provider summary.
    pub fn info(&self) -> &FabricInfo {
        self.domain.info()
    }

    /// The domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// Whether writes complete only once delivered at the target.
    pub fn delivery_complete(&self) -> bool {
        self.delivery_complete
    }

    /// The `fi_*atomicvalid` answers.
    pub fn atomic_support(&self) -> &AtomicSupport {
        &self.atomics
    }

    /// Operations posted and not yet returned by [`Endpoint::poll`].
    pub fn in_flight(&self) -> usize {
        self.meta.len() - self.free.len()
    }

    /// Adds a peer's address (from its [`Endpoint::name`]) to the address vector.
    pub fn insert_peer(&mut self, name: &[u8]) -> Result<PeerAddr> {
        let mut addr: fi_addr_t = u64::MAX;
        // SAFETY: av live; `name` is one address of the provider's format (the provider
        // reads `addrlen` bytes of its own format); `addr` writable.
        let rc = unsafe {
            result::fi_av_insert(
                self.av,
                name.as_ptr().cast(),
                1,
                &mut addr,
                0,
                ptr::null_mut(),
            )
        };
        if rc != 1 || addr == u64::MAX {
            let code = if rc < 0 { rc } else { -(FI_EINVAL as c_int) };
            return Err(result::error(
                "fi_av_insert",
                code.into(),
                &format!("inserting a {}-byte peer address", name.len()),
            ));
        }
        Ok(PeerAddr(addr))
    }

    fn slot_wire(&self, i: u32) -> *mut SlotWire {
        // SAFETY: i < nslots; the slot area holds nslots SlotWire.
        unsafe { (self.slots_mr.as_ptr() as *mut SlotWire).add(i as usize) }
    }

    fn slot_of(&self, ctx: *mut c_void) -> Option<u32> {
        let base = self.slots_mr.as_ptr() as usize;
        let p = ctx as usize;
        let size = std::mem::size_of::<SlotWire>();
        if p < base || (p - base) % size != 0 || (p - base) / size >= self.meta.len() {
            return None;
        }
        Some(((p - base) / size) as u32)
    }

    /// Takes a free slot, progressing until one frees up.
    fn take_slot(&mut self, call: &'static str) -> Result<u32> {
        let start = Instant::now();
        let bound = self.busy_bound();
        loop {
            if let Some(i) = self.free.pop() {
                return Ok(i);
            }
            self.progress()?;
            if let Some(i) = self.free.pop() {
                return Ok(i);
            }
            if start.elapsed() >= bound {
                return Err(Error::Fabric {
                    call,
                    code: -(FI_EAGAIN as i32),
                    detail: format!(
                        "all {} operation slots stayed in use for {:?}: the target is not \
                         progressing or completions are not being polled",
                        self.meta.len(),
                        start.elapsed()
                    ),
                });
            }
        }
    }

    /// Posts with `f(slot context)`, retrying `-FI_EAGAIN` after progress.
    fn post(
        &mut self,
        call: &'static str,
        slot: u32,
        context: u64,
        hold: Option<Arc<MemoryRegion>>,
        mut f: impl FnMut(*mut c_void) -> isize,
    ) -> Result<()> {
        self.meta[slot as usize].context = context;
        self.meta[slot as usize].hold = hold;
        let ctx = self.slot_wire(slot) as *mut c_void;
        let start = Instant::now();
        let bound = self.busy_bound();
        let mut tries = 0u32;
        loop {
            let rc = f(ctx);
            if rc == 0 {
                return Ok(());
            }
            if rc != -(FI_EAGAIN as isize) {
                self.release(slot);
                return Err(result::error(call, rc as i64, "posting"));
            }
            // Two tries at least (one progress between them), then up to the bound.
            if tries > 0 && start.elapsed() >= bound {
                self.release(slot);
                return Err(result::error(
                    call,
                    rc as i64,
                    &format!("still -FI_EAGAIN after {:?} of progress", start.elapsed()),
                ));
            }
            if let Err(e) = self.progress() {
                self.release(slot);
                return Err(e);
            }
            tries += 1;
        }
    }

    fn release(&mut self, slot: u32) {
        self.meta[slot as usize].hold = None;
        self.free.push(slot);
    }

    fn local_range(local: &Local<'_>, len: usize, what: &str) -> Result<*mut u8> {
        if local
            .offset
            .checked_add(len)
            .is_none_or(|e| e > local.region.len())
        {
            return Err(Error::InvalidArgument(format!(
                "{what}: local range [{:#x}, {:#x}+{len}) is outside the {}-byte region",
                local.offset,
                local.offset,
                local.region.len()
            )));
        }
        // SAFETY: in bounds.
        Ok(unsafe { local.region.as_ptr().add(local.offset) })
    }

    /// `fi_write`: copies `len` bytes from `src` to `dst`.
    pub fn write(&mut self, dst: Target, src: Local<'_>, len: usize, context: u64) -> Result<()> {
        let buf = Self::local_range(&src, len, "write")?;
        let slot = self.take_slot("fi_write")?;
        let (ep, desc) = (self.ep, src.region.desc());
        self.post("fi_write", slot, context, Some(src.region.clone()), |ctx| {
            // SAFETY: ep live; buf..buf+len registered and held by the slot until the
            // completion; ctx is the slot's fi_context2.
            unsafe {
                result::fi_write(
                    ep,
                    buf.cast(),
                    len,
                    desc,
                    dst.peer.0,
                    dst.addr(),
                    dst.region.key,
                    ctx,
                )
            }
        })
    }

    /// `fi_writedata`: as [`Endpoint::write`], and the target's CQ gets
    /// [`Completion::RemoteData`] with `data` (at most `info().cq_data_size` bytes).
    pub fn write_data(
        &mut self,
        dst: Target,
        src: Local<'_>,
        len: usize,
        data: u64,
        context: u64,
    ) -> Result<()> {
        let bits = self.info().cq_data_size * 8;
        if bits == 0 || (bits < 64 && data >> bits != 0) {
            return Err(Error::InvalidArgument(format!(
                "write_data: immediate {data:#x} does not fit the {bits}-bit remote CQ data of provider {}",
                self.info().provider
            )));
        }
        let buf = Self::local_range(&src, len, "write_data")?;
        let slot = self.take_slot("fi_writedata")?;
        let (ep, desc) = (self.ep, src.region.desc());
        self.post(
            "fi_writedata",
            slot,
            context,
            Some(src.region.clone()),
            |ctx| {
                // SAFETY: as in `write`.
                unsafe {
                    result::fi_writedata(
                        ep,
                        buf.cast(),
                        len,
                        desc,
                        data,
                        dst.peer.0,
                        dst.addr(),
                        dst.region.key,
                        ctx,
                    )
                }
            },
        )
    }

    /// `fi_read`: copies `len` bytes from `src` (remote) into `dst` (local).
    pub fn read(&mut self, dst: Local<'_>, src: Target, len: usize, context: u64) -> Result<()> {
        let buf = Self::local_range(&dst, len, "read")?;
        let slot = self.take_slot("fi_read")?;
        let (ep, desc) = (self.ep, dst.region.desc());
        self.post("fi_read", slot, context, Some(dst.region.clone()), |ctx| {
            // SAFETY: as in `write`; the buffer is written by the provider.
            unsafe {
                result::fi_read(
                    ep,
                    buf.cast(),
                    len,
                    desc,
                    src.peer.0,
                    src.addr(),
                    src.region.key,
                    ctx,
                )
            }
        })
    }

    fn check_atomic(
        &self,
        kind: AtomicKind,
        support: std::result::Result<usize, i32>,
        op: &str,
        ty: AtomicType,
        dst: &Target,
        result: &Local<'_>,
    ) -> Result<*mut u8> {
        match support {
            Ok(n) if n >= 1 => {}
            other => {
                let code = other.err().unwrap_or(-(FI_EOPNOTSUPP as i32));
                return Err(Error::Fabric {
                    call: kind.call(),
                    code,
                    detail: format!(
                        "provider {} does not support {op} on {} ({})",
                        self.info().provider,
                        ty.name(),
                        result::strerror(code)
                    ),
                });
            }
        }
        let size = ty.size();
        if dst.addr() % size as u64 != 0 {
            return Err(Error::Misaligned {
                offset: dst.offset as usize,
                align: size,
                op: "remote atomic",
            });
        }
        if (result.region.as_ptr() as usize + result.offset) % size != 0 {
            return Err(Error::Misaligned {
                offset: result.offset,
                align: size,
                op: "atomic result buffer",
            });
        }
        Self::local_range(result, size, "atomic result")
    }

    /// `fi_fetch_atomic`: applies `op` with `operand` to the element at `dst`; the old
    /// value is written to `result` (4 or 8 bytes, native endian). For
    /// [`FetchOp::Read`] `operand` is ignored.
    pub fn fetch_atomic(
        &mut self,
        op: FetchOp,
        ty: AtomicType,
        operand: u64,
        dst: Target,
        result: Local<'_>,
        context: u64,
    ) -> Result<()> {
        let support = self.atomics.fetch(op, ty);
        let res = self.check_atomic(AtomicKind::Fetch, support, op.name(), ty, &dst, &result)?;
        let slot = self.take_slot("fi_fetch_atomic")?;
        let wire = self.slot_wire(slot);
        // SAFETY: the slot is ours until its completion; write the operand in the
        // element's width so the provider reads exactly `ty.size()` bytes.
        unsafe { write_elem(ptr::addr_of_mut!((*wire).operand), ty, operand) };
        let (ep, rdesc, odesc) = (self.ep, result.region.desc(), self.slots_mr.desc());
        self.post(
            "fi_fetch_atomic",
            slot,
            context,
            Some(result.region.clone()),
            |ctx| {
                // SAFETY: ep live; operand in the registered slot, result buffer registered
                // and held by the slot until the completion.
                unsafe {
                    result::fi_fetch_atomic(
                        ep,
                        ptr::addr_of!((*wire).operand).cast(),
                        1,
                        odesc,
                        res.cast(),
                        rdesc,
                        dst.peer.0,
                        dst.addr(),
                        dst.region.key,
                        ty.raw(),
                        op.raw(),
                        ctx,
                    )
                }
            },
        )
    }

    /// `fi_compare_atomic` with `FI_CSWAP`: if the element at `dst` equals `compare` it
    /// becomes `swap`; the old value is written to `result` either way.
    #[allow(clippy::too_many_arguments)]
    pub fn compare_swap(
        &mut self,
        ty: AtomicType,
        compare: u64,
        swap: u64,
        dst: Target,
        result: Local<'_>,
        context: u64,
    ) -> Result<()> {
        let support = self.atomics.compare(ty);
        let res = self.check_atomic(AtomicKind::Compare, support, "FI_CSWAP", ty, &dst, &result)?;
        let slot = self.take_slot("fi_compare_atomic")?;
        let wire = self.slot_wire(slot);
        // SAFETY: the slot is ours until its completion.
        unsafe {
            write_elem(ptr::addr_of_mut!((*wire).operand), ty, swap);
            write_elem(ptr::addr_of_mut!((*wire).compare), ty, compare);
        }
        let (ep, rdesc, odesc) = (self.ep, result.region.desc(), self.slots_mr.desc());
        self.post(
            "fi_compare_atomic",
            slot,
            context,
            Some(result.region.clone()),
            |ctx| {
                // SAFETY: as in `fetch_atomic`; compare also lives in the registered slot.
                unsafe {
                    result::fi_compare_atomic(
                        ep,
                        ptr::addr_of!((*wire).operand).cast(),
                        1,
                        odesc,
                        ptr::addr_of!((*wire).compare).cast(),
                        odesc,
                        res.cast(),
                        rdesc,
                        dst.peer.0,
                        dst.addr(),
                        dst.region.key,
                        ty.raw(),
                        FI_CSWAP,
                        ctx,
                    )
                }
            },
        )
    }

    /// Reads the CQ once into `pending` (drives the provider's progress).
    fn progress(&mut self) -> Result<()> {
        if let Some((call, rc)) = self.cq_failed {
            return Err(result::error(
                call,
                rc,
                "the completion queue failed earlier; nothing posted since completes",
            ));
        }
        let r = self.read_cq();
        if let Err(Error::Fabric { call, code, .. }) = &r {
            self.cq_failed = Some((call, *code as i64));
        }
        r
    }

    /// Whether the completion queue failed (see [`Endpoint::poll_into`]): every
    /// operation in flight is lost.
    pub fn cq_failed(&self) -> bool {
        self.cq_failed.is_some()
    }

    fn read_cq(&mut self) -> Result<()> {
        self.cq_buf.clear();
        // SAFETY: cq live; cq_buf has CQ_BATCH entries of capacity, FI_CQ_FORMAT_DATA.
        let rc = unsafe { result::fi_cq_read(self.cq, self.cq_buf.as_mut_ptr().cast(), CQ_BATCH) };
        if rc > 0 {
            // SAFETY: the provider wrote `rc` entries.
            unsafe { self.cq_buf.set_len(rc as usize) };
            for k in 0..rc as usize {
                let e = self.cq_buf[k];
                let c = self.completion(e.op_context, e.flags, e.data, Ok(()));
                if let Some(c) = c {
                    self.pending.push_back(c);
                }
            }
            return Ok(());
        }
        if rc == -(FI_EAGAIN as isize) || rc == 0 {
            return Ok(());
        }
        if rc == -(FI_EAVAIL as isize) {
            // SAFETY: fi_cq_err_entry is plain data; zero (err_data_size 0) asks the
            // provider for its own err_data buffer.
            let mut err: fi_cq_err_entry = unsafe { std::mem::zeroed() };
            // SAFETY: cq live; err writable.
            let rc = unsafe { result::fi_cq_readerr(self.cq, &mut err, 0) };
            if rc == 1 {
                // SAFETY: err_data belongs to this entry and is read before the next
                // CQ read.
                let provider_text =
                    unsafe { result::cq_strerror(self.cq, err.prov_errno, err.err_data) };
                let ce = CompletionError {
                    code: err.err.abs(),
                    prov_errno: err.prov_errno,
                    text: result::strerror(err.err),
                    provider_text,
                };
                let c = self.completion(err.op_context, err.flags, err.data, Err(ce.clone()));
                self.pending
                    .push_back(c.unwrap_or(Completion::Unattributed(ce)));
                return Ok(());
            }
            if rc == -(FI_EAGAIN as isize) {
                return Ok(());
            }
            return Err(result::error(
                "fi_cq_readerr",
                rc as i64,
                "reading an error completion",
            ));
        }
        Err(result::error(
            "fi_cq_read",
            rc as i64,
            "polling the completion queue",
        ))
    }

    fn completion(
        &mut self,
        op_context: *mut c_void,
        flags: u64,
        data: u64,
        status: std::result::Result<(), CompletionError>,
    ) -> Option<Completion> {
        if let Some(slot) = self.slot_of(op_context) {
            let context = self.meta[slot as usize].context;
            self.release(slot);
            return Some(Completion::Local { context, status });
        }
        if status.is_ok() && flags & FI_REMOTE_CQ_DATA as u64 != 0 {
            return Some(Completion::RemoteData { data });
        }
        match status {
            Err(e) => Some(Completion::Unattributed(e)),
            Ok(()) => None,
        }
    }

    /// Appends finished operations (and remote-data arrivals) to `out`; returns how
    /// many. Drives the provider's progress; never blocks.
    pub fn poll_into(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        if self.pending.is_empty() {
            self.progress()?;
        }
        let n = self.pending.len();
        out.extend(self.pending.drain(..));
        Ok(n)
    }

    /// [`Endpoint::poll_into`] into a fresh vector.
    pub fn poll(&mut self) -> Result<Vec<Completion>> {
        let mut v = Vec::new();
        self.poll_into(&mut v)?;
        Ok(v)
    }
}

/// Writes `v` as a `ty` element (native endian) at `p`.
///
/// # Safety
/// `p` points to 8 writable bytes.
unsafe fn write_elem(p: *mut [u8; 8], ty: AtomicType, v: u64) {
    let mut b = [0u8; 8];
    match ty {
        AtomicType::U32 => b[..4].copy_from_slice(&(v as u32).to_ne_bytes()),
        AtomicType::U64 => b.copy_from_slice(&v.to_ne_bytes()),
    }
    // SAFETY: forwarded.
    unsafe { p.write(b) }
}

/// # Safety
/// `ep` is a live, enabled endpoint.
unsafe fn query_atomics(ep: *mut fid_ep) -> AtomicSupport {
    let q = |kind, ty: AtomicType, op| {
        // SAFETY: forwarded.
        unsafe { result::atomic_valid(ep, kind, ty.raw(), op) }
    };
    let fetch = AtomicType::ALL.map(|ty| FetchOp::ALL.map(|op| q(AtomicKind::Fetch, ty, op.raw())));
    AtomicSupport {
        fetch,
        compare: AtomicType::ALL.map(|ty| q(AtomicKind::Compare, ty, FI_CSWAP)),
        write_sum: AtomicType::ALL.map(|ty| q(AtomicKind::Write, ty, FI_SUM)),
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: closed once, endpoint first (it is bound to the CQ and AV), then AV
        // and CQ. In-flight operations are flushed by the close; the slot memory and
        // the regions they hold are released after (field drop).
        unsafe {
            let _ = result::close(ptr::addr_of_mut!((*self.ep).fid), "endpoint");
            let _ = result::close(ptr::addr_of_mut!((*self.av).fid), "address vector");
            let _ = result::close(ptr::addr_of_mut!((*self.cq).fid), "completion queue");
        }
    }
}
