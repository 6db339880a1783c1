//! Devices and the RAII objects hanging off them: [`Context`] (an open device) →
//! [`ProtectionDomain`] → [`MemoryRegion`]; [`CompletionQueue`]. Children hold their parent
//! in an `Arc`, so teardown runs in the order the verbs require (MR → PD → context).
//!
//! Discovery ([`list_devices`]) opens each device just long enough to read its ports and
//! GID tables; it never creates a queue.

use super::result::{check_ptr, check_rc, mlx5_fn, verbs_error, verbs_fn};
use super::sys;
use crate::error::{Error, Result};
use serde::Serialize;
use std::ffi::CStr;
use std::sync::Arc;

/// `IBV_LINK_LAYER_INFINIBAND`.
pub const LINK_LAYER_IB: u8 = sys::IBV_LINK_LAYER_INFINIBAND as u8;
/// `IBV_LINK_LAYER_ETHERNET` (RoCE).
pub const LINK_LAYER_ETHERNET: u8 = sys::IBV_LINK_LAYER_ETHERNET as u8;

/// The kind of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GidKind {
    Ib,
    RoceV1,
    RoceV2,
}

impl GidKind {
    fn from_sys(t: u32) -> Option<GidKind> {
        match t {
            sys::IBV_GID_TYPE_IB => Some(GidKind::Ib),
            sys::IBV_GID_TYPE_ROCE_V1 => Some(GidKind::RoceV1),
            sys::IBV_GID_TYPE_ROCE_V2 => Some(GidKind::RoceV2),
            _ => None,
        }
    }
}

/// One populated GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Gid {
    pub index: u16,
    pub gid: [u8; 16],
    pub kind: GidKind,
}

/// One port of a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortInfo {
    pub port: u8,
    /// `ibv_port_state` (4 = ACTIVE).
    pub state: u32,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// `ibv_mtu` (1 = 256 … 5 = 4096).
    pub active_mtu: u8,
    pub lid: u16,
    pub gids: Vec<Gid>,
}

/// `IBV_PORT_ACTIVE`.
pub const PORT_ACTIVE: u32 = sys::IBV_PORT_ACTIVE;

/// A verbs device as discovery saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    pub name: String,
    /// `mlx5dv_is_supported`: a device the mlx5 provider drives (what IBGDA needs).
    pub mlx5: bool,
    pub fw_ver: String,
    /// Outstanding RDMA READs/atomics a QP accepts as target (responder resources).
    pub max_qp_rd_atom: i32,
    /// Outstanding RDMA READs/atomics a QP may issue as initiator.
    pub max_qp_init_rd_atom: i32,
    /// `ibv_device_attr.atomic_cap` (`IBV_ATOMIC_NONE` 0, `_HCA` 1, `_GLOB` 2). The mlx5
    /// driver reports HCA only when the NIC answers 8-byte atomics in host byte order,
    /// which IBGDA relies on (`gpu::nic::check_atomic_cap`).
    pub atomic_cap: u32,
    pub ports: Vec<PortInfo>,
    /// Why ports could not be read (opening or querying failed), if so.
    pub error: Option<String>,
}

/// The device list of libibverbs; freed on drop.
struct DeviceList {
    list: *mut *mut sys::ibv_device,
    n: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList> {
        let f = verbs_fn!(ibv_get_device_list)?;
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `n` is a writable int; the list is freed in Drop.
        let list = unsafe { f(&mut n) };
        if list.is_null() {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            // ENOSYS: the kernel has no RDMA subsystem: that is "no devices".
            if errno == libc::ENOSYS {
                return Ok(DeviceList {
                    list: std::ptr::null_mut(),
                    n: 0,
                });
            }
            return Err(verbs_error("ibv_get_device_list", errno, ""));
        }
        Ok(DeviceList {
            list,
            n: n.max(0) as usize,
        })
    }

    fn devices(&self) -> impl Iterator<Item = *mut sys::ibv_device> + '_ {
        (0..self.n)
            // SAFETY: the list holds `n` device pointers followed by NULL, alive until drop.
            .map(|i| unsafe { *self.list.add(i) })
            .take_while(|d| !d.is_null())
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if self.list.is_null() {
            return;
        }
        if let Ok(f) = verbs_fn!(ibv_free_device_list) {
            // SAFETY: `list` came from ibv_get_device_list and is freed once; contexts
            // opened from it stay valid (libibverbs refcounts the devices).
            unsafe { f(self.list) }
        }
    }
}

fn device_name(dev: *mut sys::ibv_device) -> Result<String> {
    let f = verbs_fn!(ibv_get_device_name)?;
    // SAFETY: dev is a device of a live list.
    let p = unsafe { f(dev) };
    if p.is_null() {
        return Ok(String::from("?"));
    }
    // SAFETY: a NUL-terminated name owned by the device, copied at once.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn is_mlx5(dev: *mut sys::ibv_device) -> bool {
    match mlx5_fn!(mlx5dv_is_supported) {
        // SAFETY: dev is a device of a live list.
        Ok(f) => unsafe { f(dev) },
        Err(_) => false,
    }
}

/// Every verbs device with its ports and GIDs. No kernel RDMA support (ENOSYS) is an
/// empty list; libibverbs missing is [`Error::LibraryMissing`].
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let list = DeviceList::get()?;
    let mut out = Vec::new();
    for dev in list.devices() {
        let name = device_name(dev)?;
        let mlx5 = is_mlx5(dev);
        let mut info = DeviceInfo {
            name: name.clone(),
            mlx5,
            fw_ver: String::new(),
            max_qp_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            atomic_cap: 0,
            ports: Vec::new(),
            error: None,
        };
        match Context::open_raw(dev, &name).and_then(|c| {
            let attr = c.query_device()?;
            let ports = (1..=attr.phys_port_cnt)
                .map(|p| c.port_info(p))
                .collect::<Result<Vec<_>>>()?;
            Ok((attr, ports))
        }) {
            Ok((attr, ports)) => {
                // SAFETY: fw_ver is a NUL-terminated char array filled by the provider
                // (zeroed before the call, so a NUL is always inside).
                info.fw_ver = unsafe { CStr::from_ptr(attr.fw_ver.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
                info.max_qp_rd_atom = attr.max_qp_rd_atom;
                info.max_qp_init_rd_atom = attr.max_qp_init_rd_atom;
                info.atomic_cap = attr.atomic_cap;
                info.ports = ports;
            }
            Err(e) => info.error = Some(e.to_string()),
        }
        out.push(info);
    }
    Ok(out)
}

/// An open device (`ibv_context`); closed on drop.
#[derive(Debug)]
pub struct Context {
    ptr: *mut sys::ibv_context,
    name: String,
    mlx5: bool,
}

// SAFETY: ibv_context is thread-safe for the verbs used here (rdma-core documents the
// verbs as callable from any thread; the provider locks internally).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device named `name` (`mlx5_0`, ...).
    pub fn open(name: &str) -> Result<Arc<Context>> {
        let list = DeviceList::get()?;
        let mut names = Vec::new();
        for dev in list.devices() {
            let n = device_name(dev)?;
            if n == name {
                return Context::open_raw(dev, name).map(Arc::new);
            }
            names.push(n);
        }
        Err(Error::InvalidArgument(format!(
            "RDMA device {name} not found (devices: {})",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        )))
    }

    fn open_raw(dev: *mut sys::ibv_device, name: &str) -> Result<Context> {
        let f = verbs_fn!(ibv_open_device)?;
        // SAFETY: dev is a device of a live list; the context outlives the list.
        let ptr = check_ptr("ibv_open_device", unsafe { f(dev) }, name)?;
        Ok(Context {
            ptr,
            name: name.to_string(),
            mlx5: is_mlx5(dev),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    /// Whether the mlx5 provider drives this device.
    pub fn is_mlx5(&self) -> bool {
        self.mlx5
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ptr
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<sys::ibv_device_attr> {
        let f = verbs_fn!(ibv_query_device)?;
        // SAFETY: ibv_device_attr is plain data; all-zero is a valid value.
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, writable attr of the header's type.
        check_rc(
            "ibv_query_device",
            unsafe { f(self.ptr, &mut attr) },
            &self.name,
        )?;
        Ok(attr)
    }

    /// `ibv_query_port` (the exported compat entry, which hands the full struct to the
    /// provider; see scripts/gen-verbs-bindings).
    pub fn query_port(&self, port: u8) -> Result<sys::ibv_port_attr> {
        let f = verbs_fn!(ibv_query_port)?;
        // SAFETY: plain data; all-zero is valid.
        let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; the provider writes at most a full ibv_port_attr, and the
        // compat struct is a prefix of it.
        let rc = unsafe {
            f(
                self.ptr,
                port,
                (&mut attr as *mut sys::ibv_port_attr).cast(),
            )
        };
        check_rc("ibv_query_port", rc, &format!("{} port {port}", self.name))?;
        Ok(attr)
    }

    /// GID entry `index` of `port` (`ibv_query_gid_ex`); None for an empty entry.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Option<Gid>> {
        let f = verbs_fn!(_ibv_query_gid_ex)?;
        // SAFETY: plain data; all-zero is valid.
        let mut e: sys::ibv_gid_entry = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `e` is writable and its size passed, as the inline
        // ibv_query_gid_ex in verbs.h does.
        let rc = unsafe {
            f(
                self.ptr,
                port as u32,
                index,
                &mut e,
                0,
                std::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        // ENODATA: an unpopulated entry.
        if rc == libc::ENODATA || rc == -libc::ENODATA {
            return Ok(None);
        }
        check_rc(
            "ibv_query_gid_ex",
            rc,
            &format!("{} port {port} index {index}", self.name),
        )?;
        // SAFETY: `raw` covers the whole union; any bytes are valid.
        let gid = unsafe { e.gid.raw };
        Ok(GidKind::from_sys(e.gid_type).map(|kind| Gid {
            index: index as u16,
            gid,
            kind,
        }))
    }

    /// Port attributes plus the populated GID table. An entry that cannot be read (other
    /// than empty) is skipped, as NCCL does: a RoCE table can hold entries the kernel
    /// refuses to report (a netdev gone, a namespace); the port fails only when every
    /// entry failed.
    pub fn port_info(&self, port: u8) -> Result<PortInfo> {
        let a = self.query_port(port)?;
        let (gids, first_error) =
            collect_gids((0..a.gid_tbl_len.max(0) as u32).map(|i| self.query_gid(port, i)));
        if gids.is_empty() {
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        Ok(PortInfo {
            port,
            state: a.state,
            link_layer: a.link_layer,
            active_mtu: a.active_mtu as u8,
            lid: a.lid,
            gids,
        })
    }
}

/// The populated, non-zero GIDs of a table read entry by entry, and the first entry's
/// error, if any failed.
fn collect_gids(entries: impl Iterator<Item = Result<Option<Gid>>>) -> (Vec<Gid>, Option<Error>) {
    let mut gids = Vec::new();
    let mut first_error = None;
    for e in entries {
        match e {
            Ok(Some(g)) if g.gid != [0; 16] => gids.push(g),
            Ok(_) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    (gids, first_error)
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Ok(f) = verbs_fn!(ibv_close_device) {
            // SAFETY: every child holds an Arc to this context, so none is alive.
            let _ = unsafe { f(self.ptr) };
        }
    }
}

/// A protection domain; deallocated on drop.
#[derive(Debug)]
pub struct ProtectionDomain {
    ptr: *mut sys::ibv_pd,
    ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for ProtectionDomain {}
// SAFETY: see Context.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// `ibv_alloc_pd`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        let f = verbs_fn!(ibv_alloc_pd)?;
        // SAFETY: live context.
        let ptr = check_ptr("ibv_alloc_pd", unsafe { f(ctx.ptr) }, ctx.name())?;
        Ok(Arc::new(ProtectionDomain {
            ptr,
            ctx: ctx.clone(),
        }))
    }
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.ptr
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        if let Ok(f) = verbs_fn!(ibv_dealloc_pd) {
            // SAFETY: MRs and QPs hold an Arc to this PD, so none is alive.
            let _ = unsafe { f(self.ptr) };
        }
    }
}

/// The access rights rshmem registers the symmetric heap with: local write, remote
/// read/write/atomic.
pub const HEAP_ACCESS: u32 = sys::IBV_ACCESS_LOCAL_WRITE
    | sys::IBV_ACCESS_REMOTE_WRITE
    | sys::IBV_ACCESS_REMOTE_READ
    | sys::IBV_ACCESS_REMOTE_ATOMIC;

/// What memory to register.
#[derive(Clone, Copy, Debug)]
pub enum HeapMemory {
    /// Host memory (or GPU memory when nvidia-peermem is loaded): `ibv_reg_mr`.
    Virtual { addr: *mut u8, len: usize },
    /// Host memory that WQEs name by another address (`iova`: e.g. the GPU's address of
    /// host memory registered into CUDA): `ibv_reg_mr_iova2`.
    VirtualAt {
        addr: *mut u8,
        len: usize,
        iova: u64,
    },
    /// GPU memory exported as a dma-buf (`cuMemGetHandleForAddressRange`):
    /// `ibv_reg_dmabuf_mr(pd, offset, len, iova, fd)`; `iova` is the address WQEs name
    /// (the GPU virtual address of the heap).
    DmaBuf {
        fd: i32,
        offset: u64,
        len: usize,
        iova: u64,
    },
}

/// A registered memory region; deregistered on drop.
#[derive(Debug)]
pub struct MemoryRegion {
    ptr: *mut sys::ibv_mr,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: see Context.
unsafe impl Send for MemoryRegion {}
// SAFETY: see Context.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `mem` with `access` (`IBV_ACCESS_*`).
    ///
    /// # Safety
    /// The memory must stay mapped (and, for a dma-buf, the fd's buffer alive) until the
    /// region is dropped: the NIC reads and writes it behind the compiler's back.
    pub unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        mem: HeapMemory,
        access: u32,
    ) -> Result<MemoryRegion> {
        let what = pd.ctx.name().to_string();
        let ptr = match mem {
            HeapMemory::Virtual { addr, len } => {
                let f = verbs_fn!(ibv_reg_mr_iova2)?;
                // SAFETY: live PD; the caller keeps the range mapped; iova = addr, as the
                // ibv_reg_mr macro does.
                let p = unsafe { f(pd.ptr, addr.cast(), len, addr as u64, access) };
                check_ptr("ibv_reg_mr", p, &format!("{what}: {len} bytes at {addr:p}"))?
            }
            HeapMemory::VirtualAt { addr, len, iova } => {
                let f = verbs_fn!(ibv_reg_mr_iova2)?;
                // SAFETY: live PD; the caller keeps the range mapped.
                let p = unsafe { f(pd.ptr, addr.cast(), len, iova, access) };
                check_ptr(
                    "ibv_reg_mr_iova2",
                    p,
                    &format!("{what}: {len} bytes at {addr:p}, iova {iova:#x}"),
                )?
            }
            HeapMemory::DmaBuf {
                fd,
                offset,
                len,
                iova,
            } => {
                let f = verbs_fn!(ibv_reg_dmabuf_mr)?;
                // SAFETY: live PD; the caller keeps the dma-buf alive.
                let p = unsafe { f(pd.ptr, offset, len, iova, fd, access as i32) };
                check_ptr(
                    "ibv_reg_dmabuf_mr",
                    p,
                    &format!("{what}: dma-buf fd {fd}, {len} bytes at iova {iova:#x}"),
                )?
            }
        };
        Ok(MemoryRegion {
            ptr,
            _pd: pd.clone(),
        })
    }
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR; lkey is written once by the provider at registration.
        unsafe { (*self.ptr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { (*self.ptr).rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if let Ok(f) = verbs_fn!(ibv_dereg_mr) {
            // SAFETY: registered by us, deregistered once.
            let _ = unsafe { f(self.ptr) };
        }
    }
}

/// A completion queue; destroyed on drop.
#[derive(Debug)]
pub struct CompletionQueue {
    ptr: *mut sys::ibv_cq,
    ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for CompletionQueue {}
// SAFETY: see Context.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// `ibv_create_cq` with at least `cqe` entries (no channel, vector 0).
    pub fn new(ctx: &Arc<Context>, cqe: u32) -> Result<Arc<CompletionQueue>> {
        let f = verbs_fn!(ibv_create_cq)?;
        let n = i32::try_from(cqe)
            .map_err(|_| Error::InvalidArgument(format!("CQ of {cqe} entries")))?;
        // SAFETY: live context; no completion channel.
        let p = unsafe { f(ctx.ptr, n, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        let ptr = check_ptr(
            "ibv_create_cq",
            p,
            &format!("{}: {cqe} entries", ctx.name()),
        )?;
        Ok(Arc::new(CompletionQueue {
            ptr,
            ctx: ctx.clone(),
        }))
    }
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.ptr
    }
}

/// One work completion of [`CompletionQueue::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// `ibv_wc_status` (0 = success).
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub qp_num: u32,
}

impl CompletionQueue {
    /// Up to `max` completions (`ibv_poll_cq`, inline in verbs.h: the provider's
    /// `ops.poll_cq`). For CQs of QPs posted through the standard verbs only.
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>> {
        // SAFETY: plain data; all-zero is valid.
        let mut wc: Vec<sys::ibv_wc> = vec![unsafe { std::mem::zeroed() }; max];
        // SAFETY: live CQ; its context's ops table is the provider's; `wc` holds `max`
        // entries.
        let n = unsafe {
            let ctx = (*self.ptr).context;
            match (*ctx).ops.poll_cq {
                Some(f) => f(self.ptr, max as i32, wc.as_mut_ptr()),
                None => -libc::ENOSYS,
            }
        };
        if n < 0 {
            return Err(verbs_error("ibv_poll_cq", -n, self.ctx.name()));
        }
        Ok(wc[..n as usize]
            .iter()
            .map(|w| WorkCompletion {
                wr_id: w.wr_id,
                status: w.status,
                opcode: w.opcode,
                vendor_err: w.vendor_err,
                byte_len: w.byte_len,
                qp_num: w.qp_num,
            })
            .collect())
    }
}

/// `ibv_wc_status_str(status)`.
pub fn wc_status_str(status: u32) -> String {
    match verbs_fn!(ibv_wc_status_str) {
        Ok(f) => {
            // SAFETY: ibv_wc_status_str returns a static string for any value.
            let p = unsafe { f(status) };
            if p.is_null() {
                format!("status {status}")
            } else {
                // SAFETY: static NUL-terminated string.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        }
        Err(_) => format!("status {status}"),
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if let Ok(f) = verbs_fn!(ibv_destroy_cq) {
            // SAFETY: QPs using this CQ hold an Arc to it, so none is alive.
            let _ = unsafe { f(self.ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_tables_skip_unreadable_entries_and_fail_only_when_all_do() {
        let gid = |i: u16, b: u8| Gid {
            index: i,
            gid: [b; 16],
            kind: GidKind::RoceV2,
        };
        let err = |i: u32| Error::InvalidArgument(format!("entry {i} unreadable"));
        let (g, e) = collect_gids(
            [
                Ok(Some(gid(0, 0xfe))),
                Err(err(1)),
                Ok(None),
                Ok(Some(gid(3, 0))),
                Err(err(4)),
                Ok(Some(gid(5, 0x0a))),
            ]
            .into_iter(),
        );
        assert_eq!(g, vec![gid(0, 0xfe), gid(5, 0x0a)]);
        assert_eq!(e.map(|e| e.to_string()), Some(err(1).to_string()));
        let (g, e) = collect_gids([Err(err(0)), Ok(None)].into_iter());
        assert!(g.is_empty());
        assert!(e.unwrap().to_string().contains("entry 0 unreadable"));
        let (g, e) = collect_gids(std::iter::empty());
        assert!(g.is_empty() && e.is_none());
    }
}
