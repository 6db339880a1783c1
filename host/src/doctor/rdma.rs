//! The rdma-core section of the doctor: libibverbs and its devices, the mlx5 provider
//! (libmlx5, which also carries mlx5dv), and the two NVIDIA driver settings IBGDA cares
//! about (nvidia-peermem loaded, PeerMappingOverride=1).

use super::dl::{self, Opened};
use crate::error::Error;
use serde::Serialize;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;
use std::sync::OnceLock;

const VERBS_SONAMES: &[&str] = &["libibverbs.so.1"];
const VERBS_PACKAGE: &str = "libibverbs1 (and ibverbs-providers for mlx5)";
const MLX5_SONAMES: &[&str] = &["libmlx5.so.1"];
const MLX5_PACKAGE: &str = "ibverbs-providers";

// From infiniband/verbs.h (rdma-core); `struct ibv_device` stays opaque here:
//   struct ibv_device **ibv_get_device_list(int *num_devices);
//   const char *ibv_get_device_name(struct ibv_device *device);
//   void ibv_free_device_list(struct ibv_device **list);
type IbvGetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type IbvGetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type IbvFreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);

struct Verbs {
    get_device_list: IbvGetDeviceList,
    get_device_name: IbvGetDeviceName,
    free_device_list: IbvFreeDeviceList,
    /// Keeps the function pointers above valid; never dropped (see `dl`).
    _opened: Opened,
}

fn verbs() -> Result<&'static Verbs, &'static Error> {
    static VERBS: OnceLock<Result<Verbs, Error>> = OnceLock::new();
    VERBS
        .get_or_init(|| {
            let opened = dl::open(VERBS_SONAMES, VERBS_PACKAGE)?;
            // SAFETY: the types above are the verbs.h signatures of these symbols, and
            // the pointers live in `Verbs` next to the library that keeps them valid.
            unsafe {
                Ok(Verbs {
                    get_device_list: dl::symbol(&opened, "ibv_get_device_list", VERBS_PACKAGE)?,
                    get_device_name: dl::symbol(&opened, "ibv_get_device_name", VERBS_PACKAGE)?,
                    free_device_list: dl::symbol(&opened, "ibv_free_device_list", VERBS_PACKAGE)?,
                    _opened: opened,
                })
            }
        })
        .as_ref()
}

fn mlx5() -> Result<(), &'static Error> {
    static MLX5: OnceLock<Result<Opened, Error>> = OnceLock::new();
    MLX5.get_or_init(|| dl::open(MLX5_SONAMES, MLX5_PACKAGE))
        .as_ref()
        .map(|_| ())
}

/// rdma-core and the IBGDA prerequisites.
#[derive(Debug, Clone, Serialize)]
pub struct RdmaReport {
    /// Whether libibverbs loaded.
    pub present: bool,
    /// One line: what was found, or why nothing was.
    pub detail: String,
    pub devices: Vec<RdmaDevice>,
    /// Whether libmlx5.so.1 (the mlx5 provider, with mlx5dv) loads.
    pub mlx5: bool,
    pub mlx5_detail: String,
    /// Whether the nvidia-peermem kernel module is loaded (/sys/module/nvidia_peermem).
    pub peermem: bool,
    /// Whether /proc/driver/nvidia/params contains PeerMappingOverride=1; null when that
    /// file is absent (no NVIDIA driver).
    pub peer_mapping_override: Option<bool>,
}

/// One verbs device.
#[derive(Debug, Clone, Serialize)]
pub struct RdmaDevice {
    pub name: String,
    /// Kernel driver bound to the device (`mlx5_core`, `rdma_rxe`, ...), from sysfs.
    pub kernel_driver: Option<String>,
    /// A ConnectX (mlx5) device: the kind IBGDA drives.
    pub mlx5: bool,
}

pub(super) fn probe() -> RdmaReport {
    let (present, detail, devices) = match verbs() {
        Err(e) => (false, dl::absent_statement(e), Vec::new()),
        Ok(v) => match device_names(v) {
            Ok(names) => {
                let detail = if names.is_empty() {
                    "libibverbs.so.1 loaded; no RDMA devices".to_string()
                } else {
                    format!("libibverbs.so.1 loaded; {} device(s)", names.len())
                };
                let devices = names.into_iter().map(describe).collect();
                (true, detail, devices)
            }
            // ENOSYS: the kernel has no RDMA subsystem (no NIC driver, or a container
            // without /sys/class/infiniband) — that is "no devices", not a failure.
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => (
                true,
                "libibverbs.so.1 loaded; no RDMA devices (no kernel RDMA support)".to_string(),
                Vec::new(),
            ),
            Err(e) => (
                true,
                format!("libibverbs.so.1 loaded; ibv_get_device_list failed: {e}"),
                Vec::new(),
            ),
        },
    };
    let (mlx5, mlx5_detail) = match mlx5() {
        Ok(()) => (
            true,
            "libmlx5.so.1 loaded (mlx5 provider, mlx5dv)".to_string(),
        ),
        Err(e) => (false, dl::absent_statement(e)),
    };
    let params = std::fs::read_to_string("/proc/driver/nvidia/params").ok();
    RdmaReport {
        present,
        detail,
        devices,
        mlx5,
        mlx5_detail,
        peermem: Path::new("/sys/module/nvidia_peermem").exists(),
        peer_mapping_override: params.as_deref().map(peer_mapping_override),
    }
}

/// Names of the verbs devices, via ibv_get_device_list.
fn device_names(v: &Verbs) -> std::io::Result<Vec<String>> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a writable int; the returned list is freed below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        // NULL with errno set (e.g. ENOSYS: no kernel support for verbs).
        return Err(std::io::Error::last_os_error());
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` device pointers (followed by NULL).
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a device of the live list.
        let name = unsafe { (v.get_device_name)(dev) };
        if !name.is_null() {
            // SAFETY: ibv_get_device_name returns a NUL-terminated string owned by the
            // device, valid until the list is freed; we copy it first.
            names.push(
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once; no device pointer
    // is used afterwards.
    unsafe { (v.free_device_list)(list) };
    Ok(names)
}

fn describe(name: String) -> RdmaDevice {
    let kernel_driver = std::fs::read_link(format!("/sys/class/infiniband/{name}/device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
    let mlx5 = is_mlx5(&name, kernel_driver.as_deref());
    RdmaDevice {
        name,
        kernel_driver,
        mlx5,
    }
}

/// The sysfs driver decides; the `mlx5_` name prefix is the fallback when sysfs says
/// nothing (devices can be renamed, so the driver is the better witness).
fn is_mlx5(name: &str, kernel_driver: Option<&str>) -> bool {
    match kernel_driver {
        Some(d) => d == "mlx5_core",
        None => name.starts_with("mlx5"),
    }
}

/// The option is set through `NVreg_RegistryDwords="PeerMappingOverride=1;..."`, which the
/// driver echoes on its `RegistryDwords:` line.
fn peer_mapping_override(params: &str) -> bool {
    params.contains("PeerMappingOverride=1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlx5_detection_prefers_kernel_driver() {
        assert!(is_mlx5("mlx5_0", Some("mlx5_core")));
        assert!(is_mlx5("ibp3s0", Some("mlx5_core")));
        assert!(!is_mlx5("rxe0", Some("rdma_rxe")));
        assert!(is_mlx5("mlx5_1", None));
        assert!(!is_mlx5("efa_0", None));
    }

    #[test]
    fn peer_mapping_override_is_read_from_registry_dwords() {
        let on = "ModifyDeviceFiles: 1\nRegistryDwords: \"PeerMappingOverride=1;\"\n";
        let off = "ModifyDeviceFiles: 1\nRegistryDwords: \"\"\n";
        assert!(peer_mapping_override(on));
        assert!(!peer_mapping_override(off));
    }
}
