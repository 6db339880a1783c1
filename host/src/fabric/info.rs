//! Provider choice: the hints rshmem gives `fi_getinfo`, `RSHMEM_FABRIC_PROVIDER` /
//! `RSHMEM_FABRIC_DOMAIN`, the automatic order (efa, verbs;ofi_rxm, tcp;ofi_rxm, shm),
//! and the summary of what was chosen ([`FabricInfo`]).

use super::result;
use super::sys::*;
use crate::error::{Error, Result};
use std::ffi::{CStr, CString};
use std::time::Duration;

/// Environment variable naming the provider (`tcp`, `tcp;ofi_rxm`, `verbs;ofi_rxm`,
/// `efa`, `shm`). A bare `tcp` or `verbs` means the RDM stack over it (`;ofi_rxm`).
pub const PROVIDER_ENV: &str = "RSHMEM_FABRIC_PROVIDER";
/// Environment variable naming the libfabric domain (for tcp: the interface, e.g. `lo`).
pub const DOMAIN_ENV: &str = "RSHMEM_FABRIC_DOMAIN";
/// Providers tried, in order, when [`PROVIDER_ENV`] is not set.
pub const AUTO_ORDER: &[&str] = &["efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "shm"];

/// Capabilities asked for: initiate and accept RMA and atomics.
pub const CAPS: u64 = FI_RMA as u64
    | FI_ATOMIC as u64
    | FI_READ as u64
    | FI_WRITE as u64
    | FI_REMOTE_READ as u64
    | FI_REMOTE_WRITE as u64;

/// The memory-registration modes rshmem can live with: local descriptors are always
/// passed, remote addresses follow the provider (virtual or offset), keys may be the
/// provider's, memory is always allocated before registration. Not offered:
/// FI_MR_ENDPOINT (would need MRs bound to each endpoint), FI_MR_RAW (keys > 64 bits),
/// FI_MR_HMEM (GPU memory; later), FI_MR_RMA_EVENT, FI_MR_MMU_NOTIFY.
pub const MR_MODE_SUPPORTED: u64 =
    FI_MR_LOCAL as u64 | FI_MR_VIRT_ADDR as u64 | FI_MR_ALLOCATED as u64 | FI_MR_PROV_KEY as u64;

/// What to open.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    /// Provider name as libfabric spells it (`tcp;ofi_rxm`); `None`: [`AUTO_ORDER`].
    pub provider: Option<String>,
    /// Domain name (`lo`, `eth0`, `mlx5_0`, `rdmap0s6-rdm`); `None`: the first offered.
    pub domain: Option<String>,
    /// mr_mode bits offered to the provider; [`MR_MODE_SUPPORTED`] or a subset (0 asks
    /// for offset addressing with rshmem-chosen keys where the provider allows it).
    pub mr_mode: u64,
    /// Bound on every busy wait (queue full, `-FI_EAGAIN`).
    pub timeout: Duration,
    /// Ask the chosen provider and domain again for RMA reads ordered after writes
    /// (default true): a provider that orders them only when asked (shm) then lets the
    /// soft HCA confirm writes with flush READs. shm's ordered entry has another mr_mode
    /// (0: offsets, rshmem's keys; unordered: FI_MR_VIRT_ADDR), so tests of virtual
    /// addressing there turn this off.
    pub ask_rma_order: bool,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            provider: None,
            domain: None,
            mr_mode: MR_MODE_SUPPORTED,
            timeout: Duration::from_millis(crate::config::DEFAULT_TIMEOUT_MS),
            ask_rma_order: true,
        }
    }
}

impl FabricConfig {
    /// [`PROVIDER_ENV`], [`DOMAIN_ENV`] and `RSHMEM_TIMEOUT_MS`.
    pub fn from_env() -> Result<Self> {
        Ok(Self::from_env_with(
            crate::config::Settings::from_env()?.timeout,
        ))
    }

    /// [`PROVIDER_ENV`] and [`DOMAIN_ENV`], with the PE's own `timeout` (a PE started with
    /// settings of its own keeps their timeout; before 2026-12-07 its fabric read
    /// `RSHMEM_TIMEOUT_MS` again, and failed on a bad value in any other variable).
    pub fn from_env_with(timeout: std::time::Duration) -> Self {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        FabricConfig {
            provider: get(PROVIDER_ENV),
            domain: get(DOMAIN_ENV),
            timeout,
            ..FabricConfig::default()
        }
    }
}

/// `tcp` → `tcp;ofi_rxm`, `verbs` → `verbs;ofi_rxm`: the core providers offer only MSG
/// (or DGRAM) endpoints; RDM comes from the rxm utility layer over them.
pub fn normalize_provider(name: &str) -> String {
    match name {
        "tcp" | "verbs" => format!("{name};ofi_rxm"),
        other => other.to_string(),
    }
}

/// What was chosen, read from the `fi_info` the fabric was opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricInfo {
    /// `tcp;ofi_rxm`, `efa`, ...
    pub provider: String,
    /// Fabric name (for tcp: the subnet, `127.0.0.1/32`).
    pub fabric: String,
    /// Domain name (for tcp: the interface, `lo`).
    pub domain: String,
    /// mr_mode the provider requires (subset of [`MR_MODE_SUPPORTED`]).
    pub mr_mode: u64,
    /// Remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`); else offsets.
    pub virt_addr: bool,
    /// Keys come from the provider (`FI_MR_PROV_KEY`); else rshmem picks them.
    pub prov_key: bool,
    /// Local buffers must be registered (`FI_MR_LOCAL`).
    pub mr_local: bool,
    /// Bytes of remote CQ data (immediate) `fi_writedata` carries; 0: none.
    pub cq_data_size: usize,
    /// Largest message (bytes) one operation may move.
    pub max_msg_size: usize,
    /// Transmit queue depth.
    pub tx_size: usize,
    /// Bytes that may be injected (copied at post time).
    pub inject_size: usize,
    /// `FI_ORDER_*` bits the provider keeps between transmit operations.
    pub msg_order: u64,
    /// `FI_ORDER_*` bits it keeps between operations a target receives (every PE opens
    /// the same provider, so a peer's are these).
    pub rx_msg_order: u64,
    /// Mode bits the provider requires of the caller.
    pub mode: u64,
}

/// An `fi_info` list owned by Rust, freed with `fi_freeinfo`.
pub(crate) struct InfoList(pub(crate) *mut fi_info);

impl Drop for InfoList {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo / fi_dupinfo and is freed only here.
        unsafe { result::freeinfo(self.0) }
    }
}

impl InfoList {
    pub(crate) fn iter(&self) -> impl Iterator<Item = *mut fi_info> + '_ {
        let mut cur = self.0;
        std::iter::from_fn(move || {
            if cur.is_null() {
                return None;
            }
            let item = cur;
            // SAFETY: `cur` is an element of the live list.
            cur = unsafe { (*cur).next };
            Some(item)
        })
    }
}

/// Copies a C string field, `""` for NULL.
///
/// # Safety
/// `p` is NULL or NUL-terminated.
pub(crate) unsafe fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: forwarded.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Provider name of an `fi_info`.
///
/// # Safety
/// `info` is live.
pub(crate) unsafe fn prov_name(info: *const fi_info) -> String {
    // SAFETY: fabric_attr, when non-null, is owned by `info`.
    unsafe {
        let fa = (*info).fabric_attr;
        if fa.is_null() {
            String::new()
        } else {
            cstr((*fa).prov_name)
        }
    }
}

/// A `strdup`ed copy for fields fi_freeinfo will free.
fn c_strdup(s: &str, what: &str) -> Result<*mut std::ffi::c_char> {
    let c = CString::new(s)
        .map_err(|_| Error::InvalidArgument(format!("{what} {s:?} contains a NUL byte")))?;
    // SAFETY: `c` is a valid C string; strdup copies it with malloc, which fi_freeinfo
    // frees with free.
    let p = unsafe { libc::strdup(c.as_ptr()) };
    if p.is_null() {
        return Err(Error::InvalidArgument(format!("strdup of {what} failed")));
    }
    Ok(p)
}

/// Runs fi_getinfo for RDM endpoints with `caps` (and, when `full`, rshmem's mode,
/// mr_mode and threading, and `order` as the transmit and receive `msg_order` asked for),
/// restricted to `provider` / `domain` when given.
pub(crate) fn query(
    caps: u64,
    full: Option<&FabricConfig>,
    provider: Option<&str>,
    domain: Option<&str>,
    order: u64,
) -> Result<InfoList> {
    let hints = InfoList(result::allocinfo()?);
    let h = hints.0;
    // SAFETY: `h` is a fresh fi_info from fi_dupinfo(NULL) with every attribute struct
    // allocated; strings stored in it are malloc'd and freed by fi_freeinfo.
    unsafe {
        (*h).caps = caps;
        (*(*h).ep_attr).type_ = FI_EP_RDM;
        if let Some(cfg) = full {
            // Every operation carries an fi_context2 the provider may use.
            (*h).mode = FI_CONTEXT | FI_CONTEXT2;
            let d = (*h).domain_attr;
            (*d).mr_mode = cfg.mr_mode as i32;
            (*d).threading = FI_THREAD_SAFE;
            (*d).av_type = FI_AV_TABLE;
            (*(*h).tx_attr).msg_order = order;
            (*(*h).rx_attr).msg_order = order;
        }
        if let Some(p) = provider {
            (*(*h).fabric_attr).prov_name = c_strdup(p, "provider")?;
        }
        if let Some(d) = domain {
            (*(*h).domain_attr).name = c_strdup(d, "domain")?;
        }
        Ok(InfoList(result::getinfo(h)?))
    }
}

/// Chooses the `fi_info` to open: the configured provider, or the first of
/// [`AUTO_ORDER`] that offers everything. Returns a single-entry list.
pub(crate) fn choose(cfg: &FabricConfig) -> Result<InfoList> {
    let provider = cfg.provider.as_deref().map(normalize_provider);
    let list = query(
        CAPS,
        Some(cfg),
        provider.as_deref(),
        cfg.domain.as_deref(),
        0,
    )?;
    // Some layered providers (tcp;ofi_rxm in 1.17) ignore the domain-name hint, so the
    // domain is matched here too.
    let usable = |i: *mut fi_info| {
        // SAFETY: `i` is an element of `list`, domain_attr allocated.
        let dom = unsafe { cstr((*(*i).domain_attr).name) };
        cfg.domain.as_deref().is_none_or(|d| d == dom)
    };
    let chosen = match &provider {
        Some(p) => list.iter().find(|&i| {
            // SAFETY: `i` is an element of `list`.
            let n = unsafe { prov_name(i) };
            n == *p && usable(i)
        }),
        None => AUTO_ORDER.iter().find_map(|want| {
            list.iter().find(|&i| {
                // SAFETY: `i` is an element of `list`.
                let n = unsafe { prov_name(i) };
                n == *want && usable(i)
            })
        }),
    };
    let Some(chosen) = chosen else {
        return Err(nothing_found(cfg, provider.as_deref(), &list));
    };
    // The same provider and domain again, asking for RMA reads ordered after writes on
    // both sides: a provider that orders them only when asked (shm) then answers with that
    // ordering, and the soft HCA can confirm writes with a flush READ instead of slower
    // delivery-complete writes (softhca/fabric.rs). No answer, or one without the
    // ordering: the entry found above, unordered.
    // SAFETY: `chosen` is an element of `list`, alive until `list` drops at return.
    let (name, dom) = unsafe { (prov_name(chosen), cstr((*(*chosen).domain_attr).name)) };
    let ordered_list = if cfg.ask_rma_order {
        query(CAPS, Some(cfg), Some(&name), Some(&dom), FI_ORDER_RMA_RAW).ok()
    } else {
        None
    };
    let ordered = ordered_list.as_ref().and_then(|l| {
        l.iter().find(|&i| {
            // SAFETY: `i` is an element of `l`, its attribute structs allocated.
            let (n, d, tx, rx) = unsafe {
                (
                    prov_name(i),
                    cstr((*(*i).domain_attr).name),
                    (*(*i).tx_attr).msg_order,
                    (*(*i).rx_attr).msg_order,
                )
            };
            n == name && d == dom && reads_follow_writes(tx) && reads_follow_writes(rx)
        })
    });
    let chosen = ordered.unwrap_or(chosen);
    // SAFETY: `chosen` is live (an element of `list` or `ordered_list`, both alive here);
    // fi_dupinfo copies that one entry (next = NULL).
    let one = unsafe { (result_lib()?.fi_dupinfo)(chosen) };
    if one.is_null() {
        return Err(result::error(
            "fi_dupinfo",
            -(FI_ENOMEM as i64),
            "copying the chosen provider",
        ));
    }
    Ok(InfoList(one))
}

/// Whether `msg_order` orders an RMA READ after the writes posted before it to the same
/// peer (`FI_ORDER_RMA_RAW`, or the older `FI_ORDER_RAW` that covers RMA and atomics):
/// what a flush READ relies on, on the initiator's transmit side and the target's receive
/// side.
pub(crate) fn reads_follow_writes(msg_order: u64) -> bool {
    msg_order & (FI_ORDER_RMA_RAW | FI_ORDER_RAW as u64) != 0
}

fn result_lib() -> Result<&'static FabricLib> {
    super::loader::lib()
}

/// The error for "no usable provider": what the full query returned, and what each
/// provider offers for plain RDM endpoints.
fn nothing_found(cfg: &FabricConfig, provider: Option<&str>, full: &InfoList) -> Error {
    let mut offered: Vec<String> = Vec::new();
    for i in full.iter() {
        // SAFETY: `i` is an element of `full`.
        let n = unsafe { prov_name(i) };
        if !offered.contains(&n) {
            offered.push(n);
        }
    }
    let mut rdm: Vec<String> = Vec::new();
    if let Ok(list) = query(0, None, None, None, 0) {
        for i in list.iter() {
            // SAFETY: `i` is an element of `list`.
            let (n, caps) = unsafe { (prov_name(i), (*i).caps) };
            let mut lacks = Vec::new();
            if caps & FI_RMA as u64 == 0 {
                lacks.push("FI_RMA");
            }
            if caps & FI_ATOMIC as u64 == 0 {
                lacks.push("FI_ATOMIC");
            }
            let entry = if lacks.is_empty() {
                n
            } else {
                format!("{n} (no {})", lacks.join(", no "))
            };
            if !rdm.contains(&entry) {
                rdm.push(entry);
            }
        }
    }
    let wanted = match provider {
        Some(p) => format!("{PROVIDER_ENV}={p}"),
        None => format!("any of {}", AUTO_ORDER.join(", ")),
    };
    let domain = cfg
        .domain
        .as_deref()
        .map(|d| format!(" in domain {d:?}"))
        .unwrap_or_default();
    Error::Fabric {
        call: "fi_getinfo",
        code: -(FI_ENODATA as i32),
        detail: format!(
            "no provider for {wanted}{domain} offers RDM endpoints with FI_RMA|FI_ATOMIC, \
             FI_THREAD_SAFE and mr_mode within {:#x}; offering all of that: [{}]; \
             RDM providers found: [{}]",
            cfg.mr_mode,
            offered.join(", "),
            rdm.join(", ")
        ),
    }
}

/// Summarises a chosen `fi_info`.
///
/// # Safety
/// `info` is live with its attribute structs allocated.
pub(crate) unsafe fn summarize(info: *const fi_info) -> FabricInfo {
    // SAFETY: forwarded; attribute pointers of a getinfo answer are non-null.
    unsafe {
        let d = &*(*info).domain_attr;
        let f = &*(*info).fabric_attr;
        let t = &*(*info).tx_attr;
        let r = &*(*info).rx_attr;
        let e = &*(*info).ep_attr;
        let mr_mode = d.mr_mode as u32 as u64;
        FabricInfo {
            provider: cstr(f.prov_name),
            fabric: cstr(f.name),
            domain: cstr(d.name),
            mr_mode,
            virt_addr: mr_mode & FI_MR_VIRT_ADDR as u64 != 0,
            prov_key: mr_mode & FI_MR_PROV_KEY as u64 != 0,
            mr_local: mr_mode & FI_MR_LOCAL as u64 != 0,
            cq_data_size: d.cq_data_size,
            max_msg_size: e.max_msg_size,
            tx_size: t.size,
            inject_size: t.inject_size,
            msg_order: t.msg_order,
            rx_msg_order: r.msg_order,
            mode: (*info).mode,
        }
    }
}
