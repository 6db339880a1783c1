//! The RAII objects above the endpoint: [`Fabric`] (the opened fabric and the `fi_info`
//! it was chosen by), [`Domain`], and [`MemoryRegion`] with the [`RemoteRegion`] a peer
//! needs to address it.
//!
//! Teardown order is carried by `Arc`s: a memory region holds its domain, a domain holds
//! its fabric, so `fi_close` runs MR → domain → fabric whatever order the owner drops
//! them in.
//!
//! Threading: the domain is opened with `FI_THREAD_SAFE`, so these types are `Send` and
//! `Sync`; an [`Endpoint`](super::Endpoint) is driven through `&mut self` by one thread
//! at a time (the provider's locks stay uncontended).

use super::info::{self, FabricConfig, FabricInfo, InfoList};
use super::result;
use super::sys::*;
use crate::error::{Error, Result};
use std::alloc::Layout;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An opened libfabric fabric for RDM endpoints with RMA and atomics.
pub struct Fabric {
    fabric: *mut fid_fabric,
    info: InfoList,
    summary: FabricInfo,
    timeout: Duration,
}

// SAFETY: the fabric is opened FI_THREAD_SAFE; `info` is only read after construction.
unsafe impl Send for Fabric {}
// SAFETY: as above.
unsafe impl Sync for Fabric {}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("info", &self.summary)
            .finish()
    }
}

impl Fabric {
    /// Chooses a provider per `cfg` (see [`FabricConfig`]) and opens its fabric.
    pub fn open(cfg: &FabricConfig) -> Result<Arc<Fabric>> {
        let info = info::choose(cfg)?;
        // SAFETY: `info.0` is a live single fi_info with attributes.
        let summary = unsafe { info::summarize(info.0) };
        // SAFETY: fabric_attr of a live getinfo answer.
        let fabric = unsafe { result::fabric((*info.0).fabric_attr)? };
        Ok(Arc::new(Fabric {
            fabric,
            info,
            summary,
            timeout: cfg.timeout,
        }))
    }

    /// [`FabricConfig::from_env`] then [`Fabric::open`].
    pub fn open_from_env() -> Result<Arc<Fabric>> {
        Fabric::open(&FabricConfig::from_env()?)
    }

    /// What was chosen.
    pub fn info(&self) -> &FabricInfo {
        &self.summary
    }

    /// The busy-wait bound from the config.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn raw_info(&self) -> *mut fi_info {
        self.info.0
    }

    /// Opens a domain (one per NIC / interface; MRs and endpoints live in it).
    pub fn domain(self: &Arc<Self>) -> Result<Arc<Domain>> {
        let mut d = ptr::null_mut();
        // SAFETY: fabric and info are live (held by self); `d` writable.
        let rc = unsafe { result::fi_domain(self.fabric, self.info.0, &mut d, ptr::null_mut()) };
        if rc != 0 {
            return Err(result::error(
                "fi_domain",
                rc.into(),
                &format!("opening domain {}", self.summary.domain),
            ));
        }
        Ok(Arc::new(Domain {
            domain: d,
            fabric: self.clone(),
            next_key: AtomicU64::new(1),
        }))
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: every domain holds an Arc of this fabric, so none is left; closed
        // once. The fi_info is freed after (field drop).
        let _ = unsafe { result::close(ptr::addr_of_mut!((*self.fabric).fid), "fabric") };
    }
}

/// An opened domain.
pub struct Domain {
    domain: *mut fid_domain,
    fabric: Arc<Fabric>,
    /// Keys rshmem chooses when the provider does not (no FI_MR_PROV_KEY); unique
    /// within the domain, which is all libfabric requires.
    next_key: AtomicU64,
}

// SAFETY: FI_THREAD_SAFE domain.
unsafe impl Send for Domain {}
// SAFETY: FI_THREAD_SAFE domain.
unsafe impl Sync for Domain {}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("domain", &self.fabric.summary.domain)
            .finish()
    }
}

/// Access rights of every registration: local source/target and remote read/write
/// (atomics need both remote rights).
const ACCESS: u64 =
    FI_READ as u64 | FI_WRITE as u64 | FI_REMOTE_READ as u64 | FI_REMOTE_WRITE as u64;

impl Domain {
    /// The fabric this domain belongs to.
    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    /// What was chosen.
    pub fn info(&self) -> &FabricInfo {
        &self.fabric.summary
    }

    pub(crate) fn raw(&self) -> *mut fid_domain {
        self.domain
    }

    /// Allocates `len` zeroed, page-aligned bytes owned by the region and registers
    /// them. Read and write them with [`MemoryRegion::read`] / [`MemoryRegion::write`].
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<Arc<MemoryRegion>> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a memory region needs at least one byte".into(),
            ));
        }
        let layout = Layout::from_size_align(len, crate::config::page_size().max(64))
            .map_err(|e| Error::InvalidArgument(format!("region of {len} bytes: {e}")))?;
        // SAFETY: non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(Error::InvalidArgument(format!(
                "cannot allocate a {len}-byte region"
            )));
        }
        let owned = Owned { base, layout };
        // SAFETY: `base..base+len` is allocated and owned by the region being built,
        // freed only after the MR is closed (field order in MemoryRegion).
        unsafe { self.register_inner(base, len, Some(owned)) }
    }

    /// Registers memory rshmem does not own (the symmetric heap, a host-pinned buffer).
    ///
    /// # Safety
    /// `base..base+len` stays allocated until the returned region (and every clone of
    /// the `Arc`, including those held by in-flight operations) is dropped. Peers may
    /// read and write it at any time while registered: Rust code must not hold `&`/`&mut`
    /// references into it across operations that could touch it.
    pub unsafe fn register(
        self: &Arc<Self>,
        base: *mut u8,
        len: usize,
    ) -> Result<Arc<MemoryRegion>> {
        if base.is_null() || len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register a null or empty region".into(),
            ));
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.register_inner(base, len, None) }
    }

    /// # Safety
    /// As [`Domain::register`].
    unsafe fn register_inner(
        self: &Arc<Self>,
        base: *mut u8,
        len: usize,
        owned: Option<Owned>,
    ) -> Result<Arc<MemoryRegion>> {
        let info = &self.fabric.summary;
        let requested_key = if info.prov_key {
            0
        } else {
            self.next_key.fetch_add(1, Ordering::Relaxed)
        };
        let mut mr = ptr::null_mut();
        // SAFETY: domain live; the memory outlives the MR (caller); offset 0 makes
        // offset-based remote addresses start at 0 at `base`.
        let rc = unsafe {
            result::fi_mr_reg(
                self.domain,
                base as *const c_void,
                len,
                ACCESS,
                0,
                requested_key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        if rc != 0 {
            let hint = (i64::from(rc) == -(FI_ENOMEM as i64))
                .then(crate::verbs::memlock::enomem_hint)
                .flatten();
            return Err(result::error(
                "fi_mr_reg",
                rc.into(),
                &registering(len, base, hint),
            ));
        }
        // SAFETY: `mr` was just returned by fi_mr_reg.
        let (key, desc) = unsafe { (result::fi_mr_key(mr), result::fi_mr_desc(mr)) };
        let region = MemoryRegion {
            mr,
            base,
            len,
            key,
            desc,
            remote_base: if info.virt_addr { base as u64 } else { 0 },
            domain: self.clone(),
            _owned: owned,
        };
        if key == u64::MAX {
            // FI_KEY_NOTAVAIL: the key needs fi_mr_raw_attr (FI_MR_RAW), not offered.
            return Err(Error::Fabric {
                call: "fi_mr_key",
                code: 0,
                detail: format!(
                    "provider {} returned FI_KEY_NOTAVAIL (a raw key); rshmem needs 64-bit keys",
                    info.provider
                ),
            });
        }
        Ok(Arc::new(region))
    }
}

/// What `fi_mr_reg` was doing, for its error; `memlock` is the cure of a binding
/// locked-memory limit, added to an ENOMEM (providers that pin memory, verbs and efa,
/// charge registrations against `ulimit -l`, which containers often set to 64 KiB).
fn registering(len: usize, base: *const u8, memlock: Option<String>) -> String {
    match memlock {
        Some(cure) => format!("registering {len} bytes at {base:p}; {cure}"),
        None => format!("registering {len} bytes at {base:p}"),
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: MRs and endpoints hold an Arc of this domain, so none is left.
        let _ = unsafe { result::close(ptr::addr_of_mut!((*self.domain).fid), "domain") };
    }
}

struct Owned {
    base: *mut u8,
    layout: Layout,
}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: allocated in Domain::alloc with this layout, freed once.
        unsafe { std::alloc::dealloc(self.base, self.layout) }
    }
}

/// Registered memory.
pub struct MemoryRegion {
    mr: *mut fid_mr,
    base: *mut u8,
    len: usize,
    key: u64,
    desc: *mut c_void,
    remote_base: u64,
    domain: Arc<Domain>,
    // Dropped after `Drop::drop` closed the MR.
    _owned: Option<Owned>,
}

// SAFETY: FI_THREAD_SAFE domain; the memory is accessed only through raw-pointer copies.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("key", &self.key)
            .field("remote_base", &self.remote_base)
            .finish()
    }
}

impl MemoryRegion {
    /// Start of the registered memory in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (empty regions are refused); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The remote key.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The local descriptor (`fi_mr_desc`) passed with local buffers.
    pub fn desc(&self) -> *mut c_void {
        self.desc
    }

    /// The domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// What a peer needs to address this region: send it the
    /// [`RemoteRegion::to_bytes`].
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            base: self.remote_base,
            key: self.key,
            len: self.len as u64,
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::InvalidArgument(format!(
                "range [{offset:#x}, {offset:#x}+{len}) is outside the {}-byte memory region",
                self.len
            )));
        }
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: in bounds (checked); the region memory is only ever accessed through
        // raw pointers, so no Rust reference aliases it.
        unsafe { ptr::copy_nonoverlapping(self.base.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// `len` bytes at `offset` as a vector.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: in bounds; raw-pointer access only (see `read`).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset), data.len()) };
        Ok(())
    }

    /// The native-endian u64 at `offset`.
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// The native-endian u32 at `offset`.
    pub fn read_u32(&self, offset: usize) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(offset, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: in-flight operations hold an Arc of this region, so none uses it now;
        // closed once; owned memory is freed after (field drop).
        let _ = unsafe { result::close(ptr::addr_of_mut!((*self.mr).fid), "memory region") };
    }
}

/// How a peer addresses a registered region: `base + offset` with `key`.
/// `base` is the owner's virtual address under FI_MR_VIRT_ADDR and 0 otherwise, so
/// callers never need to know which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Address of byte 0 of the region in the provider's remote addressing.
    pub base: u64,
    /// Remote key.
    pub key: u64,
    /// Registered length (informational: the provider at the target enforces it).
    pub len: u64,
}

impl RemoteRegion {
    /// Size of [`RemoteRegion::to_bytes`].
    pub const WIRE_SIZE: usize = 24;

    /// Little-endian `base, key, len`, for the bootstrap exchange.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_SIZE] {
        let mut b = [0u8; Self::WIRE_SIZE];
        b[0..8].copy_from_slice(&self.base.to_le_bytes());
        b[8..16].copy_from_slice(&self.key.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Inverse of [`RemoteRegion::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<RemoteRegion> {
        if b.len() != Self::WIRE_SIZE {
            return Err(Error::InvalidArgument(format!(
                "a remote region description is {} bytes, got {}",
                Self::WIRE_SIZE,
                b.len()
            )));
        }
        let u = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[r]);
            u64::from_le_bytes(a)
        };
        Ok(RemoteRegion {
            base: u(0..8),
            key: u(8..16),
            len: u(16..24),
        })
    }
}

#[cfg(test)]
mod tests {
    /// An ENOMEM from fi_mr_reg under a binding locked-memory limit carries the cure.
    #[test]
    fn an_enomem_registration_names_the_locked_memory_limit() {
        let base = 0x1000 as *const u8;
        assert_eq!(
            super::registering(4096, base, None),
            "registering 4096 bytes at 0x1000"
        );
        let cure = crate::verbs::memlock::cure(64 << 10);
        let s = super::registering(4096, base, Some(cure.clone()));
        assert_eq!(s, format!("registering 4096 bytes at 0x1000; {cure}"));
        assert!(s.contains("ulimit -l") && s.contains("64.0 KiB"), "{s}");
    }
}
