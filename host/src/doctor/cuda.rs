//! The CUDA section of the doctor: is the driver library there, which driver version,
//! which GPUs. Everything goes through `libcuda.so.1` opened at run time (or the file
//! `RSHMEM_CUDA_LIB` names, as for the runtime).

use super::dl::{self, Opened};
use crate::error::Error;
use serde::Serialize;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::OnceLock;

const SONAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];
const PACKAGE: &str = "the NVIDIA driver";

// Driver API types and signatures, written by hand from cuda.h (CUDA 12.x/13.0):
//   typedef int CUdevice;                        /* CUdevice_v1 */
//   typedef enum cudaError_enum CUresult;        /* int-sized; CUDA_SUCCESS = 0 */
//   CUresult cuInit(unsigned int Flags);
//   CUresult cuDriverGetVersion(int *driverVersion);
//   CUresult cuDeviceGetCount(int *count);
//   CUresult cuDeviceGet(CUdevice *device, int ordinal);
//   CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
//   CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
//   CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
//   CUresult cuGetErrorName(CUresult error, const char **pStr);
//   CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev);
//   CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);
type CuResult = c_int;
type CuDevice = c_int;
const CUDA_SUCCESS: CuResult = 0;
/// CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR in cuda.h.
const ATTR_CC_MAJOR: c_int = 75;
/// CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR in cuda.h.
const ATTR_CC_MINOR: c_int = 76;
/// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (= ..._VIRTUAL_ADDRESS_...).
const ATTR_VMM: c_int = 102;
/// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED.
const ATTR_POSIX_FD: c_int = 103;
/// CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED.
const ATTR_GDR_VMM: c_int = 110;
/// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (CUDA 11.7+).
const ATTR_DMA_BUF: c_int = 124;
/// CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING (CUDA 11.3+).
const ATTR_GDR_WRITES_ORDERING: c_int = 118;

/// `CUGPUDirectRDMAWritesOrdering` by name: `none` (0), `owner` (100: the GPU's own
/// threads see a NIC's writes in order, what `RSHMEM_TRANSPORT=ibgda` needs),
/// `all-devices` (200); another value as its number.
pub(super) fn writes_ordering_name(v: i32) -> String {
    match v {
        0 => "none".into(),
        100 => "owner".into(),
        200 => "all-devices".into(),
        v => v.to_string(),
    }
}

type CuInit = unsafe extern "C" fn(c_uint) -> CuResult;
type CuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> CuResult;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CuResult;
type CuDeviceGet = unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, CuDevice) -> CuResult;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult;
type CuGetErrorName = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;
type CuDeviceGetPciBusId = unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult;
type CuDeviceCanAccessPeer = unsafe extern "C" fn(*mut c_int, CuDevice, CuDevice) -> CuResult;
type CuDeviceGetP2PAttribute =
    unsafe extern "C" fn(*mut c_int, c_int, CuDevice, CuDevice) -> CuResult;
/// CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED.
const P2P_NATIVE_ATOMICS: c_int = 3;

/// The driver entry points the doctor uses, valid for the life of the process.
struct Driver {
    soname: &'static str,
    init: CuInit,
    driver_get_version: CuDriverGetVersion,
    device_get_count: CuDeviceGetCount,
    device_get: CuDeviceGet,
    device_get_name: CuDeviceGetName,
    device_total_mem: CuDeviceTotalMem,
    device_get_attribute: CuDeviceGetAttribute,
    get_error_name: CuGetErrorName,
    /// Optional: the report says so when a driver lacks it.
    can_access_peer: Option<CuDeviceCanAccessPeer>,
    /// Optional, as above.
    p2p_attribute: Option<CuDeviceGetP2PAttribute>,
    /// Optional, as above.
    pci_bus_id: Option<CuDeviceGetPciBusId>,
    /// Keeps the function pointers above valid; never dropped (see `dl`).
    _opened: Opened,
}

fn driver() -> Result<&'static Driver, &'static Error> {
    static DRIVER: OnceLock<Result<Driver, Error>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // The runtime's choice of driver file, with the runtime's checks (gpu::driver),
            // so that the doctor and the runtime agree.
            let opened = match crate::gpu::driver::load_chosen_driver() {
                Err(detail) => {
                    return Err(Error::LibraryMissing {
                        library: "libcuda.so.1".into(),
                        package: crate::gpu::driver::CHOSEN_ADVICE.into(),
                        detail,
                    })
                }
                // Leaked once per process (the doctor's driver lives as long as it).
                Ok(Some(path)) => dl::open(&[&*Box::leak(path.into_boxed_str())], PACKAGE)?,
                Ok(None) => dl::open(SONAMES, PACKAGE)?,
            };
            // SAFETY: each type above is the signature in cuda.h for that symbol, and the
            // pointers live in `Driver` next to the library that keeps them valid.
            unsafe {
                Ok(Driver {
                    soname: opened.soname,
                    init: dl::symbol(&opened, "cuInit", PACKAGE)?,
                    driver_get_version: dl::symbol(&opened, "cuDriverGetVersion", PACKAGE)?,
                    device_get_count: dl::symbol(&opened, "cuDeviceGetCount", PACKAGE)?,
                    device_get: dl::symbol(&opened, "cuDeviceGet", PACKAGE)?,
                    device_get_name: dl::symbol(&opened, "cuDeviceGetName", PACKAGE)?,
                    device_total_mem: dl::symbol(&opened, "cuDeviceTotalMem_v2", PACKAGE)?,
                    device_get_attribute: dl::symbol(&opened, "cuDeviceGetAttribute", PACKAGE)?,
                    get_error_name: dl::symbol(&opened, "cuGetErrorName", PACKAGE)?,
                    can_access_peer: dl::symbol(&opened, "cuDeviceCanAccessPeer", PACKAGE).ok(),
                    p2p_attribute: dl::symbol(&opened, "cuDeviceGetP2PAttribute", PACKAGE).ok(),
                    pci_bus_id: dl::symbol(&opened, "cuDeviceGetPCIBusId", PACKAGE).ok(),
                    _opened: opened,
                })
            }
        })
        .as_ref()
}

/// CUDA driver and GPUs.
#[derive(Debug, Clone, Serialize)]
pub struct CudaReport {
    /// Whether libcuda loaded (with every symbol the doctor needs).
    pub present: bool,
    /// One line: what was found, or why nothing was.
    pub detail: String,
    /// As cuDriverGetVersion returns it: 1000 * major + 10 * minor (13000 = CUDA 13.0).
    pub driver_version: Option<i32>,
    pub devices: Vec<CudaDevice>,
    /// cuDeviceCanAccessPeer for every ordered pair of distinct devices (GPU PEs on
    /// different GPUs map each other's heaps only with P2P access).
    pub p2p: Vec<P2pPair>,
    /// Why `p2p` is empty when there are several devices (e.g. the symbol is missing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p2p_detail: Option<String>,
    /// Hardware work queues per GPU that CUDA gives this process
    /// (`CUDA_DEVICE_MAX_CONNECTIONS`, which the `rshmem` binary sets to 32 when unset;
    /// CUDA's default is 8). GPU PEs of one process wait for each other across their
    /// streams, so they need more queues than PEs. Null when libcuda is absent.
    pub hardware_queues: Option<u32>,
    /// One line on `hardware_queues` (the source, and how many PEs per process fit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hardware_queues_detail: Option<String>,
    /// Whether GPU 0 exported a heap allocation as a POSIX fd when tried ("ok", or why
    /// not): GPU PEs in different processes of a node exchange their heaps this way. Tried
    /// only where the device reports POSIX-fd handles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fd_export: Option<String>,
    /// How each library module loads on the first GPU: a prebuilt cubin from
    /// `RSHMEM_PTX_DIR` (the GPU bundle's), or its PTX, JIT-compiled, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<ModuleSource>,
}

/// One library module and how it loads.
#[derive(Debug, Clone, Serialize)]
pub struct ModuleSource {
    pub module: String,
    pub load: String,
}

/// (queues, line) from `CUDA_DEVICE_MAX_CONNECTIONS` as this process holds it.
fn hardware_queues(var: Option<&str>) -> (u32, String) {
    let (q, usable) = crate::gpu::launch::cuda_connections(var);
    // The bound run_gpu_threads enforces (launch::check_pes_fit_queues).
    let fits = format!(
        "up to {} GPU PEs per GPU per process",
        crate::gpu::launch::max_pes_per_gpu(q)
    );
    let line = match (var, usable) {
        (None, _) => {
            format!("{q} per GPU (CUDA's default; CUDA_DEVICE_MAX_CONNECTIONS unset): {fits}")
        }
        (Some(_), true) => format!("{q} per GPU (CUDA_DEVICE_MAX_CONNECTIONS): {fits}"),
        (Some(v), false) => format!(
            "CUDA_DEVICE_MAX_CONNECTIONS={v:?} is not in 1..=32: CUDA uses its default {q}, {fits}"
        ),
    };
    (q, line)
}

/// Whether device `from` can access device `to`'s memory.
#[derive(Debug, Clone, Serialize)]
pub struct P2pPair {
    pub from: i32,
    pub to: i32,
    /// None when the query failed (see `error`).
    pub access: Option<bool>,
    /// Native atomics over the link (CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED): without
    /// them rshmem runs loads and stores over P2P but refuses read-modify-write atomics and
    /// signal ADDs to PEs on that GPU. None without access, or when the driver could not say.
    pub native_atomics: Option<bool>,
    pub error: Option<String>,
}

/// One GPU as the driver reports it.
#[derive(Debug, Clone, Serialize)]
pub struct CudaDevice {
    pub ordinal: i32,
    pub name: Option<String>,
    pub total_mem_bytes: Option<u64>,
    /// `"9.0"` for an H100/H200.
    pub compute_capability: Option<String>,
    /// `0000:1B:00.0` (cuDeviceGetPCIBusId): where the GPU sits, for the NIC nearest it.
    pub pci_bus_id: Option<String>,
    /// The first failing driver call for this device, by error name.
    pub error: Option<String>,
    /// CUDA virtual memory management (the GPU heap needs it). None: the attribute query
    /// failed (a driver that does not know it).
    pub vmm: Option<bool>,
    /// Memory exportable as POSIX file descriptors (sharing GPU heaps between PEs).
    pub posix_fd_handles: Option<bool>,
    /// GPUDirect RDMA on VMM allocations (NIC access to the GPU heap).
    pub gpudirect_rdma_vmm: Option<bool>,
    /// dma-buf export of device memory.
    pub dma_buf: Option<bool>,
    /// Which consumers see GPUDirect RDMA writes into this GPU in order
    /// (`none`, `owner`, `all-devices`, else the number); `ibgda` needs at least `owner`.
    pub gpudirect_rdma_writes_ordering: Option<String>,
}

/// `"13.0"` for 13000.
pub(super) fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

pub(super) fn probe() -> CudaReport {
    let drv = match driver() {
        Ok(d) => d,
        Err(e) => {
            return CudaReport {
                present: false,
                detail: dl::absent_statement(e),
                driver_version: None,
                devices: Vec::new(),
                p2p: Vec::new(),
                p2p_detail: None,
                hardware_queues: None,
                hardware_queues_detail: None,
                fd_export: None,
                modules: Vec::new(),
            }
        }
    };
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid int to write to; cuDriverGetVersion needs no cuInit.
    let rc = unsafe { (drv.driver_get_version)(&mut version) };
    let driver_version = (rc == CUDA_SUCCESS).then_some(version);
    let version_text = driver_version
        .map(|v| format!("driver API {}", version_string(v)))
        .unwrap_or_else(|| format!("cuDriverGetVersion failed: {}", error_name(drv, rc)));

    // SAFETY: cuInit(0) is the documented first call; flags must be 0.
    let rc = unsafe { (drv.init)(0) };
    if rc != CUDA_SUCCESS {
        return CudaReport {
            present: true,
            detail: format!(
                "{} loaded, {version_text}; cuInit failed: {}",
                drv.soname,
                error_name(drv, rc)
            ),
            driver_version,
            devices: Vec::new(),
            p2p: Vec::new(),
            p2p_detail: None,
            hardware_queues: None,
            hardware_queues_detail: None,
            fd_export: None,
            modules: Vec::new(),
        };
    }
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid int to write to; cuInit succeeded.
    let rc = unsafe { (drv.device_get_count)(&mut count) };
    if rc != CUDA_SUCCESS {
        return CudaReport {
            present: true,
            detail: format!(
                "{} loaded, {version_text}; cuDeviceGetCount failed: {}",
                drv.soname,
                error_name(drv, rc)
            ),
            driver_version,
            devices: Vec::new(),
            p2p: Vec::new(),
            p2p_detail: None,
            hardware_queues: None,
            hardware_queues_detail: None,
            fd_export: None,
            modules: Vec::new(),
        };
    }
    let devices: Vec<CudaDevice> = (0..count).map(|i| device(drv, i)).collect();
    let (p2p, p2p_detail) = p2p_matrix(drv, count);
    let var = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok();
    let (queues, queues_line) = hardware_queues(var.as_deref());
    let modules = devices
        .first()
        .and_then(|d| d.compute_capability.as_deref())
        .and_then(|cc| cc.split_once('.'))
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .map(|cc| {
            crate::gpu::module::module_sources(cc)
                .into_iter()
                .map(|(module, load)| ModuleSource {
                    module: module.to_string(),
                    load,
                })
                .collect()
        })
        .unwrap_or_default();
    let fd_export = devices.first().map(|d| match d.posix_fd_handles {
        Some(true) => match crate::gpu::heap::probe_fd_export(0) {
            Ok(()) => "ok".to_string(),
            // The export's own error names the cure (GPU PEs as threads, or the proxy).
            Err(
                e @ Error::Cuda {
                    call: "cuMemExportToShareableHandle",
                    ..
                },
            ) => format!("refused although the device reports POSIX-fd handles: {e}"),
            // A context or allocation that failed says nothing about the export.
            Err(e) => format!("not tried: {e}"),
        },
        _ => "not tried: the device reports no POSIX-fd handles".to_string(),
    });
    CudaReport {
        present: true,
        detail: format!("{} loaded, {version_text}, {count} device(s)", drv.soname),
        fd_export,
        driver_version,
        devices,
        p2p,
        p2p_detail,
        hardware_queues: Some(queues),
        hardware_queues_detail: Some(queues_line),
        modules,
    }
}

fn device(drv: &Driver, ordinal: c_int) -> CudaDevice {
    let mut out = CudaDevice {
        ordinal,
        name: None,
        total_mem_bytes: None,
        compute_capability: None,
        pci_bus_id: None,
        error: None,
        vmm: None,
        posix_fd_handles: None,
        gpudirect_rdma_vmm: None,
        dma_buf: None,
        gpudirect_rdma_writes_ordering: None,
    };
    let fail = |out: &mut CudaDevice, call: &str, rc: CuResult| {
        out.error
            .get_or_insert_with(|| format!("{call} failed: {}", error_name(drv, rc)));
    };
    let mut dev: CuDevice = 0;
    // SAFETY: `dev` is writable; 0 <= ordinal < cuDeviceGetCount.
    let rc = unsafe { (drv.device_get)(&mut dev, ordinal) };
    if rc != CUDA_SUCCESS {
        fail(&mut out, "cuDeviceGet", rc);
        return out;
    }

    let mut name = [0 as c_char; 256];
    // SAFETY: `name` is writable for the length passed (one less than its size, so the
    // last byte stays NUL even if the driver truncates without terminating).
    let rc = unsafe { (drv.device_get_name)(name.as_mut_ptr(), name.len() as c_int - 1, dev) };
    if rc == CUDA_SUCCESS {
        // SAFETY: `name` is NUL-terminated (its last byte was never written).
        let s = unsafe { CStr::from_ptr(name.as_ptr()) };
        out.name = Some(s.to_string_lossy().into_owned());
    } else {
        fail(&mut out, "cuDeviceGetName", rc);
    }

    let mut bytes: usize = 0;
    // SAFETY: `bytes` is a writable size_t; `dev` came from cuDeviceGet.
    let rc = unsafe { (drv.device_total_mem)(&mut bytes, dev) };
    if rc == CUDA_SUCCESS {
        out.total_mem_bytes = Some(bytes as u64);
    } else {
        fail(&mut out, "cuDeviceTotalMem_v2", rc);
    }

    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both are writable ints; attributes 75/76 are valid CUdevice_attribute values.
    let rc_major = unsafe { (drv.device_get_attribute)(&mut major, ATTR_CC_MAJOR, dev) };
    // SAFETY: as above.
    let rc_minor = unsafe { (drv.device_get_attribute)(&mut minor, ATTR_CC_MINOR, dev) };
    if rc_major == CUDA_SUCCESS && rc_minor == CUDA_SUCCESS {
        out.compute_capability = Some(format!("{major}.{minor}"));
    } else {
        let rc = if rc_major != CUDA_SUCCESS {
            rc_major
        } else {
            rc_minor
        };
        fail(&mut out, "cuDeviceGetAttribute(compute capability)", rc);
    }
    if let Some(f) = drv.pci_bus_id {
        let mut b = [0 as c_char; 64];
        // SAFETY: `b` is writable for the length passed (one less than its size, so the
        // last byte stays NUL).
        let rc = unsafe { f(b.as_mut_ptr(), b.len() as c_int - 1, dev) };
        if rc == CUDA_SUCCESS {
            // SAFETY: NUL-terminated (its last byte was never written).
            let s = unsafe { CStr::from_ptr(b.as_ptr()) };
            out.pci_bus_id = Some(s.to_string_lossy().into_owned());
        } else {
            fail(&mut out, "cuDeviceGetPCIBusId", rc);
        }
    }
    let flag = |a: c_int| {
        let mut v: c_int = 0;
        // SAFETY: writable int; an attribute the driver does not know returns an error.
        let rc = unsafe { (drv.device_get_attribute)(&mut v, a, dev) };
        (rc == CUDA_SUCCESS).then_some(v != 0)
    };
    out.vmm = flag(ATTR_VMM);
    out.posix_fd_handles = flag(ATTR_POSIX_FD);
    out.gpudirect_rdma_vmm = flag(ATTR_GDR_VMM);
    out.dma_buf = flag(ATTR_DMA_BUF);
    let mut v: c_int = 0;
    // SAFETY: writable int; an attribute the driver does not know returns an error.
    let rc = unsafe { (drv.device_get_attribute)(&mut v, ATTR_GDR_WRITES_ORDERING, dev) };
    out.gpudirect_rdma_writes_ordering = (rc == CUDA_SUCCESS).then(|| writes_ordering_name(v));
    out
}

fn p2p_matrix(drv: &Driver, count: c_int) -> (Vec<P2pPair>, Option<String>) {
    if count < 2 {
        return (Vec::new(), None);
    }
    let Some(can) = drv.can_access_peer else {
        return (
            Vec::new(),
            Some(format!(
                "{} does not export cuDeviceCanAccessPeer",
                drv.soname
            )),
        );
    };
    let mut v = Vec::new();
    for from in 0..count {
        for to in (0..count).filter(|&t| t != from) {
            let (mut a, mut b): (CuDevice, CuDevice) = (0, 0);
            // SAFETY: writable ints; ordinals < count.
            let rc = unsafe { (drv.device_get)(&mut a, from) };
            // SAFETY: as above.
            let rc = if rc == CUDA_SUCCESS {
                unsafe { (drv.device_get)(&mut b, to) }
            } else {
                rc
            };
            let mut ok: c_int = 0;
            // SAFETY: writable int; devices from cuDeviceGet.
            let rc = if rc == CUDA_SUCCESS {
                unsafe { can(&mut ok, a, b) }
            } else {
                rc
            };
            let mut atomics: c_int = 0;
            let native_atomics = match drv.p2p_attribute {
                Some(attr) if rc == CUDA_SUCCESS && ok != 0 => {
                    // SAFETY: writable int; attribute and devices from cuDeviceGet.
                    (unsafe { attr(&mut atomics, P2P_NATIVE_ATOMICS, a, b) } == CUDA_SUCCESS)
                        .then_some(atomics != 0)
                }
                _ => None,
            };
            v.push(P2pPair {
                from,
                to,
                access: (rc == CUDA_SUCCESS).then_some(ok != 0),
                native_atomics,
                error: (rc != CUDA_SUCCESS)
                    .then(|| format!("cuDeviceCanAccessPeer failed: {}", error_name(drv, rc))),
            });
        }
    }
    (v, None)
}

/// `CUDA_ERROR_NO_DEVICE (100)`, or `CUresult 100` if the driver does not know the code.
fn error_name(drv: &Driver, rc: CuResult) -> String {
    let mut ptr: *const c_char = std::ptr::null();
    // SAFETY: `ptr` is a writable pointer; cuGetErrorName needs no cuInit.
    let ok = unsafe { (drv.get_error_name)(rc, &mut ptr) } == CUDA_SUCCESS;
    if ok && !ptr.is_null() {
        // SAFETY: on success the driver points `ptr` at a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(ptr) };
        format!("{} ({rc})", name.to_string_lossy())
    } else {
        format!("CUresult {rc}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_ordering_names() {
        assert_eq!(writes_ordering_name(0), "none");
        assert_eq!(writes_ordering_name(100), "owner");
        assert_eq!(writes_ordering_name(200), "all-devices");
        assert_eq!(writes_ordering_name(7), "7");
    }

    #[test]
    fn hardware_queues_follow_cuda_device_max_connections() {
        assert_eq!(
            hardware_queues(None),
            (
                8,
                "8 per GPU (CUDA's default; CUDA_DEVICE_MAX_CONNECTIONS unset): up to 6 GPU PEs per GPU per process"
                    .into()
            )
        );
        assert_eq!(
            hardware_queues(Some("32")),
            (
                32,
                "32 per GPU (CUDA_DEVICE_MAX_CONNECTIONS): up to 30 GPU PEs per GPU per process"
                    .into()
            )
        );
        for bad in ["0", "33", "many"] {
            let (q, line) = hardware_queues(Some(bad));
            assert_eq!(q, 8, "{bad}");
            assert!(line.contains("is not in 1..=32"), "{line}");
        }
    }

    #[test]
    fn driver_versions_print_as_major_minor() {
        assert_eq!(version_string(13000), "13.0");
        assert_eq!(version_string(12040), "12.4");
        assert_eq!(version_string(11080), "11.8");
    }
}
